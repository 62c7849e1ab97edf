"""Check commands: check (specs, sweeps, --probe) and flags (the XLA flag catalog)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, table

FORMATS = ("text", "github", "junit", "json")


def register(sub: Any) -> None:
    p = add_command(
        sub, "check",
        "check specs (and sweeps of flag combinations) against XLA/NCCL catalogs and rules; exit 1 on problems",
        "mxc check specs/\n"
        "mxc check specs/70b.yaml --matrix specs/matrix/70b-sweep.yaml --probe\n"
        "mxc check specs/ --format junit -o check.xml", _check)
    p.add_argument("paths", nargs="*", metavar="PATH", help="spec files or directories (every spec under them)")
    p.add_argument("--matrix", metavar="FILE", help="sweep file: check every combination of its axes (docs/check.md)")
    p.add_argument("--format", choices=FORMATS, default="text", help="output: text, github (annotations), junit, json")
    p.add_argument("--probe", action="store_true",
                   help="also run the flags through jaxlib and the overrides through MaxText's pyconfig (a few seconds)")
    p.add_argument("--probe-python", metavar="PY", help="interpreter with the jaxlib/maxtext to probe (default: this one)")
    p.add_argument("--probe-workers", type=int, metavar="N", help="parallel MaxText validations (default: CPUs)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a spec field before checking (repeatable)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    add_json(p)

    p = add_command(sub, "flags", "list the XLA flags of a jaxlib version (type, default, documentation), or show one",
                    "mxc flags --search latency\nmxc flags xla_gpu_enable_command_buffer   # one flag, in full\n"
                    "mxc flags --jaxlib 0.6.2 --json", _flags)
    p.add_argument("name", nargs="?", metavar="FLAG",
                   help="show this flag in full: documentation, jaxlibs that have it, its successor if renamed")
    p.add_argument("--search", metavar="WORD", help="only flags whose name or documentation contains WORD")
    p.add_argument("--jaxlib", metavar="VERSION", help="catalog to show (default: the default catalog)")
    p.add_argument("--versions", action="store_true", help="list the jaxlib versions with a catalog")
    add_json(p)


def _check(args: argparse.Namespace) -> int:
    from mxc.checking import Options, check_paths
    from mxc.compiler.check.report import render, text
    from mxc.errors import UserError

    fmt = "json" if args.json else args.format
    if args.probe_workers is not None and args.probe_workers < 1:
        raise UserError("--probe-workers must be >= 1")
    run = check_paths(Options(args.paths, args.matrix, tuple(args.overrides), args.probe, args.probe_python,
                              args.probe_workers))
    report = run.report
    out = render(report, fmt)
    if args.output:
        from pathlib import Path

        from mxc.fsutil import write_atomic

        write_atomic(Path(args.output), out)
        print(text(report) if fmt == "text" else report.summary(), end="" if fmt == "text" else "\n", file=sys.stderr)
    else:
        sys.stdout.write(out)
        if fmt != "text":
            print(report.summary(), file=sys.stderr)
    return 1 if report.failed else 0


def _flags(args: argparse.Namespace) -> int:
    from mxc.compiler.check.catalogs import xla_catalog, xla_catalog_versions, xla_index
    from mxc.errors import UserError

    versions = xla_catalog_versions()
    if args.versions:
        if args.json:
            print_json({"versions": list(versions), "default": xla_index().get("default"),
                        "maxtext": xla_index().get("maxtext", {})})
        else:
            for v in versions:
                print(v + ("  (default)" if v == xla_index().get("default") else ""))
        return 0
    version = args.jaxlib or xla_index().get("default") or (versions[-1] if versions else "")
    if version not in versions:
        raise UserError(f"no XLA flag catalog for jaxlib {version}", f"shipped: {', '.join(versions)}")
    catalog = xla_catalog(version)
    if args.name:
        return _one_flag(args.name.removeprefix("--").split("=", 1)[0], version, args.json)
    word = (args.search or "").lower()
    flags = [f for f in catalog.flags.values() if not word or word in f.name.lower() or word in f.doc.lower()]
    if args.json:
        print_json({"jaxlib_version": version, "flags": [
            {"name": f.name, "type": f.type, "default": f.default, "doc": f.doc, "deprecated": f.deprecated,
             "proto_enum": list(f.proto_enum), "list": f.is_list} for f in flags]})
        return 0
    terminal = sys.stdout.isatty()
    rows = [[f.name, f.type, _default(f, 30 if terminal else 0), " ".join(f.doc.split())] for f in flags]
    if rows:
        print(_fitted(table(rows, ["FLAG", "TYPE", "DEFAULT", "DOC"])))
    print(f"{len(flags)} of {len(catalog.flags)} flags of jaxlib {version}"
          + ("; mxc flags FLAG shows one in full" if terminal else ""), file=sys.stderr)
    return 0 if flags else 1


def _default(flag: Any, width: int = 0) -> str:
    text = repr(flag.default) if flag.type == "string" else str(flag.default).lower()
    return text[: width - 1] + "…" if width and len(text) > width else text


def _fitted(text: str) -> str:
    """On a terminal each row is cut at its width (the documentation is the last column); piped or
    redirected, every line is whole, for grep and for people reading a file."""
    if not sys.stdout.isatty():
        return text
    import shutil

    width = shutil.get_terminal_size().columns
    return "\n".join(line if len(line) <= width else line[: width - 1] + "…" for line in text.splitlines())


def _one_flag(name: str, version: str, as_json: bool) -> int:
    """``mxc flags NAME``: one flag of jaxlib ``version`` in full, or what became of it."""
    from mxc.compiler.check.catalogs import all_flag_versions, xla_catalog
    from mxc.compiler.check.xla_successors import successors, suggest
    from mxc.errors import UserError

    flag = xla_catalog(version).flags.get(name)
    successor = successors(version).get(name)
    known = all_flag_versions().get(name, ())
    if flag is None and not known:
        raise UserError(f"{name}: not an XLA flag of jaxlib {version} nor of any shipped catalog",
                        suggest(name, version) or "search with: mxc flags --search WORD")
    if as_json:
        print_json({"jaxlib_version": version, "name": name, "in_this_jaxlib": flag is not None, "jaxlibs": list(known),
                    "successor": None if successor is None else {"name": successor.name, "value": successor.value,
                                                                 "documented_in": successor.said_by},
                    **({} if flag is None else {"type": flag.type, "default": flag.default, "doc": flag.doc,
                                                "deprecated": flag.deprecated, "proto_enum": list(flag.proto_enum),
                                                "list": flag.is_list})})
        return 0 if flag is not None else 1
    lines = [f"{name}  (jaxlib {version})"]
    if flag is None:
        lines.append(f"  not a flag of jaxlib {version}; jaxlib {', '.join(known)} had it")
    else:
        lines.append(f"  type {flag.type}{' (a list)' if flag.is_list else ''}, default {_default(flag)}"
                     + ("; deprecated" if flag.deprecated else ""))
        if flag.proto_enum:
            lines.append("  values: " + ", ".join(flag.proto_enum))
        lines.append(f"  in jaxlib {', '.join(known)}")
        lines += ["", *textwrap.wrap(" ".join(flag.doc.split()), 100, initial_indent="  ", subsequent_indent="  ")]
    if successor is not None and flag is not None:
        lines += ["", f"  successor: {successor.setting} (from jaxlib {successor.said_by}'s documentation above)"]
    elif successor is not None:
        lines += ["", "  " + successor.hint(name)]
    print("\n".join(shown(line) for line in lines))
    return 0 if flag is not None else 1
