"""Bundle commands: build, ls, show, diff, verify, schema."""

from __future__ import annotations

import argparse
import json
import sys
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
    p.add_argument("--locked", action="store_true",
                   help="take the pins from lockfiles/<spec name>.lock.json (mxc lock) and refuse anything "
                        "unpinned or disagreeing; the lock joins the bundle")
    add_json(p)

    p = add_command(sub, "ls", "list the bundles in the store", "mxc ls --json", _ls)
    add_json(p)

    p = add_command(sub, "show", "show a stored bundle (by any unique hash prefix)",
                    "mxc show 3f9a\nmxc show 3f9a --file job.sbatch", _show)
    p.add_argument("bundle", help="bundle hash or unique prefix")
    p.add_argument("--file", help="print this bundle file instead of the summary")
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

    p = add_command(sub, "schema", "print the spec's JSON Schema (for editors and docs)",
                    "mxc schema > mxc-spec.schema.json", _schema)


def _build(args: argparse.Namespace) -> int:
    from mxc.build import compile_file

    if getattr(args, "locked", False):
        from mxc.lock.check import compile_locked

        bundle = compile_locked(args.spec, tuple(args.overrides))
    else:
        bundle = compile_file(args.spec, tuple(args.overrides))
    if bundle.spec.env.allow_dangerous:
        from mxc.compiler.env_policy import opt_in_notice

        print(f"mxc: warning: {opt_in_notice(bundle.spec.env.allow_dangerous)}", file=sys.stderr)
    st = store()
    stored, outcome = st.put(bundle.files, bundle.hash)
    st.set_last(bundle.hash)
    if args.json:
        print_json({"hash": bundle.hash, "path": str(stored.path), "created": outcome.created,
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

    st = store()
    rows: list[dict[str, Any]] = []
    for digest in st.hashes():
        try:
            spec = st.get(digest).spec()
        except UserError as exc:  # one damaged bundle must not hide the others
            rows.append({"hash": digest, "damaged": str(exc)})
            continue
        rows.append({"hash": digest, "name": _field(spec, "name"), "model": _field(spec, "model", "model_name"),
                     "backend": _field(spec, "runtime", "backend"), "container": _field(spec, "runtime", "container"),
                     "nodes": _field(spec, "resources", "nodes")})
    if args.json:
        print_json(rows)
    elif rows:
        print(table([[r["hash"][:12], "(damaged: mxc verify " + r["hash"][:12] + ")", "-", "-", "-", "-"] if "damaged" in r
                     else [r["hash"][:12], r["name"], r["model"], r["backend"], r["container"], r["nodes"]]
                     for r in rows], ["HASH", "NAME", "MODEL", "BACKEND", "CONTAINER", "NODES"]))
    else:
        print("no bundles yet: mxc build specs/tiny.yaml", file=sys.stderr)
    return 0


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
    print(f"bundle  {bundle.hash}\npath    {bundle.path}\nname    {_field(spec, 'name')}\nfiles")
    for name, digest in sorted(files.items()):
        print(f"  {digest[:12]}  {name}")
    print("spec")
    print("  " + json.dumps(spec, indent=2, sort_keys=True).replace("\n", "\n  "))
    env = spec.get("env")
    opt_in = env.get("allow_dangerous") if isinstance(env, dict) else None
    if opt_in and isinstance(opt_in, list):
        from mxc.compiler.env_policy import opt_in_notice

        print(f"warning: {opt_in_notice([str(n) for n in opt_in])}")
    return 0


def _load_side(ref: str) -> tuple[dict[str, Any], dict[str, str], str]:
    """A diff side: (resolved spec, manifest files, label) from a spec path or a bundle prefix."""
    from mxc.compiler.manifest import MANIFEST, manifest_files

    if Path(ref).is_file() or ref.endswith((".yaml", ".yml")):
        from mxc.build import compile_file

        bundle = compile_file(ref)
        return json.loads(bundle.files["spec.json"]), manifest_files(bundle.files[MANIFEST]), ref
    stored = store().get(ref)
    return stored.spec(), stored.files(), stored.hash[:12]


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
    from mxc.compiler.schema import JobSpec

    print(json.dumps(JobSpec.model_json_schema(by_alias=True), indent=2, sort_keys=True))
    return 0
