"""Shared argument helpers for command modules."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_command(sub: Any, name: str, help: str, example: str, handler: Any) -> argparse.ArgumentParser:
    """A subcommand whose --help ends with a worked example."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=help[:1].upper() + help[1:] + ".",
        epilog="example:\n  " + example.replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler)
    return parser


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def shown(text: object) -> str:
    """Text from a run, a record or a bundle as it may reach a terminal: every control character
    (escape sequences, newlines, bidi overrides) written visibly (``\\x1b``), since a record in a
    shared runs root may have been written by anyone (docs/security.md#a-shared-runs-root)."""
    from mxc.compiler.errors import printable

    return printable(str(text))


def table(rows: list[list[str]], header: list[str]) -> str:
    """Aligned columns; every cell ``shown`` (one line, no terminal escapes)."""
    cells = [[shown(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def store() -> Any:
    from mxc.fsutil import mxc_home
    from mxc.store import Store

    return Store(mxc_home())
