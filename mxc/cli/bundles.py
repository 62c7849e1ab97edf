"""Bundle commands: build, ls, show, diff, verify, schema."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, store, table


def register(sub: Any) -> None:
    p = add_command(sub, "build", "compile a spec into a hash-addressed bundle in the store",
                    "mxc build specs/70b.yaml --set model.overrides.steps=20", _build)
    p.add_argument("spec", help="spec file (YAML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a spec field (repeatable; part of the hash)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the hash")
    p.add_argument("--label", dest="labels", action="append", default=[], metavar="NAME",
                   help="label the bundle in this store (repeatable; not part of the bundle or its hash); "
                        "name it later as label:NAME")
    p.add_argument("--locked", action="store_true",
                   help="take the pins from lockfiles/<spec name>.lock.json (mxc lock) and refuse anything "
                        "unpinned or disagreeing; the lock joins the bundle")
    add_json(p)

    p = add_command(sub, "ls", "list the bundles in the store, least recently built first: the last is @, what "
                    "`mxc run` runs", "mxc ls\nmxc ls --json\nmxc show @      # the last built; @~1 the one built "
                    "before it; label:NAME", _ls)
    p.add_argument("--ids", action="store_true", help=argparse.SUPPRESS)  # hash prefixes, one a line (completion)
    add_json(p)

    p = add_command(sub, "show", "show a stored bundle (by any unique hash prefix)",
                    "mxc show 3f9a\nmxc show 3f9a --file job.sbatch", _show)
    p.add_argument("bundle", help="bundle hash or unique prefix, @ (the last built: what `mxc run` runs), @~N, label:NAME")
    p.add_argument("--file", help="print this bundle file instead of the summary")
    p.add_argument("--files", action="store_true",
                   help="list every file with its sha256 (the node program's mxc_node/*.py too: one line by default)")
    add_json(p)

    p = add_command(sub, "diff", "show what differs between two specs or bundles, field by field",
                    "mxc diff specs/70b.yaml specs/70b-fp8.yaml\nmxc diff 3f9a 7c1e", _diff)
    p.add_argument("old", help="spec file or bundle hash prefix")
    p.add_argument("new", help="spec file or bundle hash prefix")
    add_json(p)

    p = add_command(sub, "verify", "recompute every hash of a stored bundle; exit 1 naming what changed",
                    "mxc verify 3f9a\nmxc verify --all", _verify)
    p.add_argument("bundle", nargs="?", help="bundle hash or unique prefix")
    p.add_argument("--all", action="store_true", help="verify every bundle in the store")
    add_json(p)

    p = add_command(sub, "schema", "print the spec's JSON Schema (for editors and docs), or the run record's",
                    "mxc schema > mxc-spec.schema.json\n"
                    "mxc schema --record > mxc-run.schema.json   # record.json of a run (mxc-run/v2)", _schema)
    p.add_argument("--record", action="store_true",
                   help="the run record's JSON Schema (record.json, docs/runs.md) instead of the spec's")


def _build(args: argparse.Namespace) -> int:
    from mxc import refs
    from mxc.build import compile_file

    labels = [refs.check_label(name) for name in args.labels]  # before anything is compiled or written

    if getattr(args, "locked", False):
        from mxc.lock.check import compile_locked

        bundle = compile_locked(args.spec, tuple(args.overrides))
    else:
        bundle = compile_file(args.spec, tuple(args.overrides))
    if bundle.spec.env.allow_dangerous:
        from mxc.compiler.env_policy import opt_in_notice

        print(f"mxc: warning: {opt_in_notice(bundle.spec.env.allow_dangerous)}", file=sys.stderr)
    for warning in bundle.warnings:  # what `mxc check` warns about (a privileged container, ...): built anyway
        print(warning, file=sys.stderr)
    if bundle.spec.runtime.allow_dangerous:  # a note of check's (container-dangerous), said at every build
        from mxc.compiler import container_policy

        print(f"mxc: warning: {container_policy.opt_in_notice(bundle.spec.runtime.allow_dangerous)}",
              file=sys.stderr)
    st = store()
    stored, outcome = st.put(bundle.files, bundle.hash)
    st.add_labels(bundle.hash, labels)
    if not outcome.newest:
        print(f"mxc: warning: bundle {bundle.short} is in the store already and not yours: it stays where it was in "
              f"`mxc ls`; `mxc run` runs @ ({st.current().hash[:12]}): name this one (mxc run {bundle.short})",
              file=sys.stderr)
    if args.json:
        print_json({"hash": bundle.hash, "path": str(stored.path), "created": outcome.created, "labels": labels,
                    "repaired": outcome.problems, "name": bundle.spec.name, "files": sorted(bundle.files)})
    else:
        if not args.quiet:
            state = {"built": "built", "unchanged": "unchanged, already in the store",
                     "repaired": "repaired: the stored copy was damaged ("
                                 + "; ".join(outcome.problems[:3]) + "), replaced by this build"}[outcome.state]
            print(f"{bundle.spec.name}: {state}: {stored.path}", file=sys.stderr)
        print(bundle.hash)
    return 0


def _ls(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime.record import iso_time

    st = store()
    ordered = st.by_age()
    if args.ids:
        print("\n".join(digest[:12] for digest in ordered))
        return 0
    labels = st.labels()
    rows: list[dict[str, Any]] = []
    for digest in ordered:
        common = {"hash": digest, "built": iso_time(st.built(digest)),
                  "labels": sorted(labels.get(digest, {}), key=lambda name: labels[digest][name])}
        try:
            spec = st.get(digest).spec()
        except UserError as exc:  # one damaged bundle must not hide the others
            rows.append({**common, "damaged": str(exc)})
            continue
        rows.append({**common, "name": _field(spec, "name"), "model": _field(spec, "model", "model_name"),
                     "backend": _field(spec, "runtime", "backend"), "container": _field(spec, "runtime", "container"),
                     "nodes": _field(spec, "resources", "nodes")})
    if args.json:
        print_json(rows)
    elif rows:
        print(table([_ls_row(r) for r in rows],
                    ["HASH", "BUILT", "NAME", "MODEL", "BACKEND", "CONTAINER", "NODES", "LABELS"]))
    else:
        print("no bundles yet: mxc build specs/tiny.yaml", file=sys.stderr)
    return 0


def _ls_row(r: dict[str, Any]) -> list[str]:
    built = _local_time(r["built"])
    labels = ",".join(r["labels"]) or "-"
    if "damaged" in r:
        return [r["hash"][:12], built, "(damaged: mxc verify " + r["hash"][:12] + ")", "-", "-", "-", "-", labels]
    return [r["hash"][:12], built, r["name"], r["model"], r["backend"], r["container"], r["nodes"], labels]


def _local_time(iso: str | None) -> str:
    """A record-style UTC time as this machine's local time, to the minute, for a table."""
    from mxc.runtime.record import parse_time

    when = parse_time(iso)
    return when.astimezone().strftime("%Y-%m-%d %H:%M") if when else "-"


def _field(spec: dict[str, Any], *path: str) -> str:
    """A spec field as text for a listing, '?' where a (hand-made) bundle's spec lacks it."""
    value: Any = spec
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return "?" if value is None or isinstance(value, (dict, list)) else str(value)


def _show(args: argparse.Namespace) -> int:
    bundle = store().get(args.bundle)
    files = bundle.files()
    if args.file:
        sys.stdout.write(bundle.read(args.file))  # only a listed file whose bytes match the verified manifest
        return 0
    spec = bundle.spec()
    if args.json:
        print_json({"hash": bundle.hash, "path": str(bundle.path), "files": files, "spec": spec})
        return 0
    print(f"bundle  {bundle.hash}\npath    {bundle.path}\nname    {_field(spec, 'name')}\nspec")
    print("  " + json.dumps(spec, indent=2, sort_keys=True).replace("\n", "\n  "))
    print("files")
    for line in _file_lines(files, args.files):
        print(line)
    env = spec.get("env")
    opt_in = env.get("allow_dangerous") if isinstance(env, dict) else None
    if opt_in and isinstance(opt_in, list):
        from mxc.compiler.env_policy import opt_in_notice

        print(f"warning: {opt_in_notice([str(n) for n in opt_in])}")
    runtime = spec.get("runtime")
    options = runtime.get("container_options") if isinstance(runtime, dict) else None
    if isinstance(options, dict) and options.get("privileged") is True:
        from mxc.compiler.container_options import privileged_notice

        print(f"warning: {privileged_notice(str(runtime.get('container')))}")
    container_opt_in = runtime.get("allow_dangerous") if isinstance(runtime, dict) else None
    if container_opt_in and isinstance(container_opt_in, list):
        from mxc.compiler import container_policy

        print(f"warning: {container_policy.opt_in_notice([str(e) for e in container_opt_in])}")
    return 0


def _file_lines(files: dict[str, str], every: bool) -> list[str]:
    """The bundle's files after its spec: each with its hash, the node program's as one line
    (the same ~40 stdlib modules in every bundle) unless ``every``."""
    node = sorted(name for name in files if name.startswith("mxc_node/"))
    lines = [f"  {digest[:12]}  {name}" for name, digest in sorted(files.items()) if every or name not in node]
    if node and not every:
        lines.append(f"  {len(node)} files   mxc_node/ (the node program; --files lists each with its hash)")
    return lines


def _load_side(ref: str) -> tuple[dict[str, Any], dict[str, str], str]:
    """A diff side: (resolved spec, manifest files, label) from a spec path or a bundle prefix."""
    from mxc.compiler.manifest import MANIFEST, manifest_files

    if Path(ref).is_file() or ref.endswith((".yaml", ".yml")):
        from mxc.build import compile_file

        bundle = compile_file(ref)
        spec = _with_config_file(json.loads(bundle.files["spec.json"]), bundle.files.get)
        return spec, manifest_files(bundle.files[MANIFEST]), ref
    stored = store().get(ref)
    return _with_config_file(stored.spec(), stored.read), stored.files(), stored.hash[:12]


def _with_config_file(spec: dict[str, Any], read: Callable[[str], str | None]) -> dict[str, Any]:
    """model.config_file as {path, content: its keys}, so a diff names the keys changed inside the file."""
    from mxc.compiler.config_file import bundle_name, config_keys

    model = spec.get("model")
    path = model.get("config_file") if isinstance(model, dict) else None
    if not isinstance(model, dict) or not isinstance(path, str):
        return spec
    text = read(bundle_name(path))
    content = config_keys(text, path) if text is not None else {}
    return {**spec, "model": {**model, "config_file": {"path": path, "content": content}}}


def _diff(args: argparse.Namespace) -> int:
    from mxc.compiler.diff import diff_files, diff_specs

    old_spec, old_files, old_label = _load_side(args.old)
    new_spec, new_files, new_label = _load_side(args.new)
    changes = diff_specs(old_spec, new_spec)
    files = diff_files(old_files, new_files)
    if args.json:
        print_json({"old": old_label, "new": new_label, "changes": [c.as_dict() for c in changes],
                    "files": files})
    elif not changes and not files:
        print(f"no differences between {old_label} and {new_label}")
    else:
        print(f"--- {old_label}\n+++ {new_label}")
        for change in changes:
            print(change)
        if files:
            print("bundle files that differ: " + ", ".join(files))
    return 1 if changes or files else 0


def _verify(args: argparse.Namespace) -> int:
    from mxc.errors import UserError

    st = store()
    if args.all:
        targets = [st.get(h) for h in st.hashes()]
    elif args.bundle:
        targets = [st.get(args.bundle)]
    else:
        raise UserError("name a bundle or pass --all", "mxc verify 3f9a")
    report = {b.hash: st.verify(b) for b in targets}
    if args.json:
        print_json({h: {"ok": not p, "problems": p} for h, p in report.items()})
    else:
        for digest, problems in report.items():
            if problems:
                for problem in problems:
                    print(f"{digest[:12]}: {problem}")
            else:
                print(f"{digest[:12]}: ok")
    return 1 if any(report.values()) else 0


def _schema(args: argparse.Namespace) -> int:
    if args.record:
        from mxc.runtime.record import json_schema

        print(json.dumps(json_schema(), indent=2, sort_keys=True))
        return 0
    from mxc.compiler.schema import JobSpec

    print(json.dumps(JobSpec.model_json_schema(by_alias=True), indent=2, sort_keys=True))
    return 0
