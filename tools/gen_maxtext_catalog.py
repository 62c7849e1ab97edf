"""Regenerate mxc/compiler/data/maxtext/maxtext-<version>.json from the installed maxtext package.

``mxc check`` judges ``model.overrides`` without importing MaxText (which takes seconds and
pulls in jax): it needs the config keys MaxText accepts, their types and allowed values
(from MaxText's own pydantic ``MaxTextConfig``), the defaults of ``configs/base.yml``, and
the keys each ``configs/models/<name>.yml`` sets (MaxText refuses an override of those
unless ``override_model_config=true``, and the model sizes feed the step-time estimate).
``--probe`` remains the final word: it runs MaxText's validation itself.

Run with the training venv:
    /tmp/setup/venv/bin/python tools/gen_maxtext_catalog.py
"""

from __future__ import annotations

import enum
import json
import pathlib
import types as pytypes
import typing
from typing import Any

import yaml
from maxtext.configs import types  # type: ignore[import-not-found]
from maxtext.version import __version__  # type: ignore[import-not-found]

OUT = pathlib.Path(__file__).resolve().parents[1] / "compiler" / "data" / "maxtext"


def describe(annotation: Any) -> dict[str, Any]:
    """A pydantic annotation -> {"type": ..., "optional": bool, "choices": [...]}."""
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
            kinds = {describe(a)["type"] for a in args}
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


def scalars(data: dict[str, Any]) -> dict[str, Any]:
    """Scalar values and lists of scalars (``mlp_activations``); nested rules are left out."""

    def plain(v: Any) -> bool:
        return isinstance(v, (bool, int, float, str)) or v is None

    return {k: v for k, v in data.items() if plain(v) or (isinstance(v, list) and all(plain(x) for x in v))}


def main() -> None:
    configs = pathlib.Path(types.__file__).resolve().parent
    base = yaml.safe_load((configs / "base.yml").read_text())
    keys: dict[str, Any] = {}
    for name, field in sorted(types.MaxTextConfig.model_fields.items()):
        entry = describe(field.annotation)
        if name in base and name in scalars(base):
            entry["default"] = base[name]
        keys[name] = entry
    models = {}
    for name in sorted(typing.get_args(types.ModelName)):
        path = configs / "models" / f"{name}.yml"
        if path.is_file():
            model = yaml.safe_load(path.read_text()) or {}
            models[name] = {"keys": sorted(model), **scalars(model)}
    catalog = {
        "maxtext_version": __version__,
        "generated_by": "tools/gen_maxtext_catalog.py",
        "keys": keys,
        "models": models,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"maxtext-{__version__}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(catalog, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(out)
    print(f"{len(keys)} config keys, {len(models)} model configs of maxtext {__version__} -> {out}")


if __name__ == "__main__":
    main()
