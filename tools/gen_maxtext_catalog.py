"""Write a MaxText key catalog (mxc/compiler/data/maxtext/<name>.json) for ``mxc check``.

``mxc check`` judges ``model.overrides`` without importing MaxText (which takes seconds and
pulls in jax): it needs the config keys MaxText accepts, their types and allowed values, the
defaults of ``base.yml``, and the keys each ``models/<name>.yml`` sets (MaxText refuses an
override of those unless ``override_model_config=true``; the model sizes feed the step-time
estimate). ``--probe`` remains the final word: it runs MaxText's validation itself.

Three sources (docs/check.md, "MaxText key catalogs"):

    # the maxtext package installed in a venv (imports it: MaxText's own pydantic fields)
    /tmp/setup/venv/bin/python tools/gen_maxtext_catalog.py
    # a MaxText repository (upstream or a fork) at a pinned commit, read from git objects
    python tools/gen_maxtext_catalog.py --git /path/to/maxtext.git --commit <sha> \
        --repo-url https://github.com/ROCm/maxtext [--name rocm-maxtext-<sha12>]
    # the MaxText inside a container image, copied out (or a path in an unpacked rootfs)
    cid=$(podman create docker.io/rocm/jax-training:maxtext-v26.2)
    podman cp "$cid":/workspace/maxtext /tmp/image-maxtext && podman rm "$cid"
    python tools/gen_maxtext_catalog.py --dir /tmp/image-maxtext --name rocm-jax-training-v26.2 \
        --image docker.io/rocm/jax-training:maxtext-v26.2@sha256:<digest>

The last two read the files without importing them (tools/maxtext_pydantic_ast.py), so they
need neither jax nor the image's Python. A tree without ``configs/types.py`` (the older
``MaxText/`` layout, whose pyconfig accepts exactly the keys of base.yml) gets its keys and
types from base.yml's values.
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import re
import sys
from typing import Any

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from maxtext_dispatch import apply as apply_dispatch
from maxtext_dispatch import dispatch_choices
from maxtext_pydantic_ast import Extractor, Module
from maxtext_source import DirTree, Layout, SourceError, Tree, find_layout, git_tree

DISPATCH_METHOD = "; str keys the code dispatches on in a closed if/elif chain are enums (tools/maxtext_dispatch.py)"
OUT = pathlib.Path(__file__).resolve().parents[1] / "mxc" / "compiler" / "data" / "maxtext"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def scalars(data: dict[str, Any]) -> dict[str, Any]:
    """Scalar values and lists of scalars (``mlp_activations``); nested rules are left out."""

    def plain(v: Any) -> bool:
        return isinstance(v, (bool, int, float, str)) or v is None

    return {k: v for k, v in data.items() if plain(v) or (isinstance(v, list) and all(plain(x) for x in v))}


def base_defaults(base: dict[str, Any], keys: dict[str, dict[str, Any]]) -> None:
    plain = scalars(base)
    for name, entry in keys.items():
        if name in plain:
            entry["default"] = plain[name]


def models_of(read: Any, listdir: Any, models_dir: str, names: list[str] | None) -> dict[str, Any]:
    """Each model config's keys (and scalar values): ``models/<name>.yml`` for every model name."""
    if names is None:
        names = [n[:-4] for n in listdir(models_dir) if n.endswith(".yml")]
    out = {}
    for name in sorted(names):
        text = read(f"{models_dir}/{name}.yml")
        if text is not None:
            model = yaml.safe_load(text) or {}
            out[name] = {"keys": sorted(model), **scalars(model)}
    return out


# ---------------------------------------------------------------- the installed package (import)

def describe_annotation(annotation: Any) -> dict[str, Any]:
    """A pydantic annotation -> {"type": ..., "optional": bool, "choices": [...]}."""
    import enum
    import types as pytypes
    import typing

    optional = False
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
            continue
        if origin in (typing.Union, pytypes.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(annotation))
            if len(args) == 1:
                annotation = args[0]
                continue
            kinds = {describe_annotation(a)["type"] for a in args}
            kind = "number" if kinds <= {"int", "float"} else "any"
            return {"type": kind, "optional": optional}
        break
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return {"type": "enum", "optional": optional, "choices": [str(a) for a in typing.get_args(annotation)]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"type": "enum", "optional": optional, "choices": [str(m.value) for m in annotation]}
    if annotation in (bool, int, float, str):
        return {"type": annotation.__name__, "optional": optional}
    if annotation is list or origin is list:
        return {"type": "list", "optional": optional}
    if annotation is dict or origin is dict:
        return {"type": "dict", "optional": optional}
    return {"type": "any", "optional": optional}


def from_installed() -> dict[str, Any]:
    import typing

    from maxtext.configs import types  # type: ignore[import-untyped,import-not-found,unused-ignore]
    from maxtext.version import __version__  # type: ignore[import-untyped,import-not-found,unused-ignore]

    configs = pathlib.Path(types.__file__).resolve().parent
    keys = {name: describe_annotation(f.annotation) for name, f in sorted(types.MaxTextConfig.model_fields.items())}
    base_defaults(yaml.safe_load((configs / "base.yml").read_text()), keys)
    apply_dispatch(keys, dispatch_choices(DirTree(configs.parent), Layout("configs")))
    tree = DirTree(configs)
    models = models_of(tree.read, tree.listdir, "models", list(typing.get_args(types.ModelName)))
    return {
        "name": f"maxtext-{__version__}",
        "maxtext_version": __version__,
        "source": {"kind": "package", "package": f"maxtext=={__version__}", "layout": "src/maxtext/configs"},
        "method": "MaxTextConfig.model_fields of the imported package" + DISPATCH_METHOD,
        "keys": keys,
        "models": models,
    }


# ---------------------------------------------------------------- a tree read without importing it

def read_module_of(tree: Tree, layout: Layout) -> Any:
    """dotted module -> its parsed source, looked up in the tree (``MaxText.common_types``)."""

    def read(dotted: str) -> ast.Module | None:
        parts = dotted.split(".")
        roots = [layout.package_root] if layout.configs != "configs" else []
        candidates = [f"{r}/{'/'.join(parts)}.py".lstrip("/") for r in roots]
        if layout.configs == "configs":  # the tree is the package directory itself
            candidates.append("/".join(parts[1:]) + ".py")
        for path in candidates:
            text = tree.read(path)
            if text is not None:
                return ast.parse(text)
        return None

    return read


def from_tree(tree: Tree) -> dict[str, Any]:
    layout = find_layout(tree)
    base = yaml.safe_load(tree.read(layout.path("base.yml")) or "") or {}
    types_src = tree.read(layout.path("types.py"))
    model_names: list[str] | None = None
    if types_src is not None:
        module = Module.parse(ast.parse(types_src))
        extractor = Extractor(module, read_module_of(tree, layout))
        keys = dict(sorted(extractor.fields("MaxTextConfig").items()))
        model_names = extractor.model_names()
        method = f"fields of MaxTextConfig in {layout.path('types.py')}, read with ast (not imported)"
    else:
        keys = {name: _typed_by_value(value) for name, value in sorted(base.items())}
        method = f"keys of {layout.path('base.yml')} (this layout's pyconfig accepts exactly those), typed by their values"
    base_defaults(base, keys)
    apply_dispatch(keys, dispatch_choices(tree, layout))
    models = models_of(tree.read, tree.listdir, layout.path("models"), model_names)
    return {"source": {**tree.describe(), "layout": layout.name}, "method": method + DISPATCH_METHOD, "keys": keys,
            "models": models}


def _typed_by_value(value: Any) -> dict[str, Any]:
    """Old pyconfig: a key's type is its base.yml value's (None: any; a float accepts ints)."""
    kind = {bool: "bool", int: "int", float: "number", str: "str", list: "list", dict: "dict"}.get(type(value), "any")
    return {"type": kind, "optional": value is None or value == "None"}


# ---------------------------------------------------------------- main

def write(catalog: dict[str, Any], out_dir: pathlib.Path) -> pathlib.Path:
    catalog = {"generated_by": "tools/gen_maxtext_catalog.py", **catalog}
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{catalog['name']}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(catalog, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--git", type=pathlib.Path, help="a MaxText git repository (clone, worktree or bare mirror)")
    where.add_argument("--dir", type=pathlib.Path, help="a MaxText directory, e.g. copied out of an image")
    parser.add_argument("--commit", help="with --git: the commit (or branch, tag, ref) to read")
    parser.add_argument("--repo-url", default="", help="with --git: the repository's public URL, recorded in the catalog")
    parser.add_argument("--image", default="", help="with --dir: the image it came from (ref@digest), recorded")
    parser.add_argument("--name", help="catalog name (the file name and code.maxtext_catalog); default from the source")
    parser.add_argument("--label", help="how findings name this MaxText (default: the name)")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="output directory")
    args = parser.parse_args(argv)
    try:
        if args.git is not None:
            if not args.commit:
                parser.error("--git needs --commit (a catalog is for one pinned commit)")
            tree: Tree = git_tree(args.git, args.commit, args.repo_url)
            catalog = from_tree(tree)
            slug = "-".join(args.repo_url.rstrip("/").removesuffix(".git").split("/")[-2:]).lower() or "maxtext"
            default_name = f"{slug}-{catalog['source']['commit'][:12]}"
        elif args.dir is not None:
            catalog = from_tree(DirTree(args.dir.resolve()))
            if args.image:
                catalog["source"]["image"] = args.image
            default_name = args.dir.resolve().name
        else:
            catalog = from_installed()
            default_name = catalog["name"]
    except SourceError as exc:
        print(f"gen_maxtext_catalog: {exc}", file=sys.stderr)
        return 2
    name = args.name or default_name
    if not NAME.fullmatch(name):
        parser.error(f"--name {name!r}: letters, digits, '.', '_' and '-' only")
    catalog["name"] = name
    catalog["label"] = args.label or catalog.get("maxtext_version") or name
    out = write(catalog, args.out)
    layout = catalog["source"].get("layout", "package")
    print(f"{len(catalog['keys'])} config keys, {len(catalog['models'])} model configs ({layout}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
