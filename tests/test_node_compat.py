"""The node program (mxc/node/) runs on compute nodes' own python3, as old as 3.8, with nothing
installed: every file must parse as Python 3.8, import only the standard library (or its siblings,
relatively), and avoid the standard library's newer API; and it must run outside the venv."""

from __future__ import annotations

import ast
import io
import os
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from tests.conftest import REPO

NODE = REPO / "mxc" / "node"
FILES = sorted(NODE.glob("*.py"))
SYSTEM_PYTHON = "/usr/bin/python3"
# In the standard library of the Python running the tests, but not in 3.8's.
NEWER_MODULES = {"zoneinfo": "3.9", "graphlib": "3.9", "tomllib": "3.11", "wsgiref.types": "3.11"}
# Methods and functions newer than 3.8, by name (``os.readlink`` is fine; ``Path.readlink`` is 3.9).
NEWER_ATTRIBUTES = {"removeprefix": "3.9", "removesuffix": "3.9", "is_relative_to": "3.9", "with_stem": "3.9",
                    "waitstatus_to_exitcode": "3.9", "to_thread": "3.9", "randbytes": "3.9", "unparse": "3.9",
                    "bit_count": "3.10", "hardlink_to": "3.10", "pairwise": "3.10", "batched": "3.12",
                    "UTC": "3.11", "readlink": "3.9 (use os.readlink)", "cache": "3.9 (use lru_cache(maxsize=None))"}
ALLOWED_ON = {"readlink": {"os"}}  # module.attr spellings that are old enough
NEWER_KEYWORDS = {("zip", "strict"): "3.10", ("dataclass", "slots"): "3.10", ("dataclass", "kw_only"): "3.10",
                  ("write_text", "newline"): "3.10", ("exists", "follow_symlinks"): "3.12"}
BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
# The entry point checks the interpreter's version before the package is imported: it must itself
# parse on an older python3 (RHEL 8's is 3.6), so it is the one file without the __future__ import.
ENTRY = "__main__.py"


def annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (never evaluated, thanks to ``from __future__ import annotations``)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def problems(path: Path) -> list[str]:
    """What in one file would not run on Python 3.8 with nothing installed."""
    source = path.read_text("utf-8")
    try:
        tree = ast.parse(source, filename=str(path), feature_version=(3, 8))
    except SyntaxError as exc:
        return [f"{path.name}:{exc.lineno}: not Python 3.8 syntax: {exc.msg}"]
    out = []
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    first = body[0] if body else None
    if path.name == ENTRY:
        try:
            ast.parse(source, feature_version=(3, 6))
        except SyntaxError as exc:
            out.append(f"{path.name}:{exc.lineno}: the entry point must parse on python3.6: {exc.msg}")
        if "from __future__" in source:
            out.append(f"{path.name}: the entry point must parse on any python3 (no __future__ import)")
    elif first is not None and not (isinstance(first, ast.ImportFrom) and first.module == "__future__"
            and [a.name for a in first.names] == ["annotations"]):
        out.append(f"{path.name}: code must start with `from __future__ import annotations` (after the docstring)")
    in_annotation = annotation_nodes(tree)
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                continue
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names:
                    out.append(f"{where}: imports {module}: not in the standard library (siblings: `from . import x`)")
                elif module in NEWER_MODULES or top in NEWER_MODULES:
                    out.append(f"{where}: imports {module}: Python {NEWER_MODULES.get(module) or NEWER_MODULES[top]}")
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if alias.name in NEWER_ATTRIBUTES and (node.module or "") not in ALLOWED_ON.get(alias.name, set()):
                        out.append(f"{where}: from {node.module} import {alias.name}: {NEWER_ATTRIBUTES[alias.name]}")
        elif isinstance(node, ast.Attribute) and node.attr in NEWER_ATTRIBUTES:
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner not in ALLOWED_ON.get(node.attr, set()):
                out.append(f"{where}: .{node.attr}: Python {NEWER_ATTRIBUTES[node.attr]}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            for keyword in node.keywords:
                since = NEWER_KEYWORDS.get((name, keyword.arg or ""))
                if since:
                    out.append(f"{where}: {name}({keyword.arg}=...): Python {since}")
        elif id(node) in in_annotation:
            continue
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in BUILTIN_GENERICS:
            out.append(f"{where}: {node.value.id}[...] evaluated at run time: Python 3.9 (typing.List, or a string)")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            sides = (node.left, node.right)
            if any(isinstance(s, ast.Dict) or (isinstance(s, ast.Constant) and s.value is None) for s in sides):
                out.append(f"{where}: `|` of dicts or with None at run time: Python 3.9/3.10")
    out += fstring_equals(path, source)
    return out


def fstring_equals(path: Path, source: str) -> list[str]:
    """f"{x=}" (the self-documenting ``=``), spotted in the token stream of Python >= 3.12."""
    out = []
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    depth = 0
    inside = 0
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.FSTRING_START:
            inside += 1
        elif tok.type == tokenize.FSTRING_END:
            inside -= 1
        elif inside and tok.type == tokenize.OP and tok.string == "{":
            depth += 1
        elif inside and tok.type == tokenize.OP and tok.string == "}":
            depth -= 1
        elif inside and depth and tok.type == tokenize.OP and tok.string == "=":
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if following is not None and following.string in ("}", "!", ":"):
                out.append(f"{path.name}:{tok.start[0]}: f-string `=` specifier")
    return out


def test_the_package_has_the_leaf_modules() -> None:
    assert {p.stem for p in FILES} >= {"__init__", "netif", "checkpoints", "preflight", "postmortem", "stacks",
                                       "selftest", "sysread", "atomicfile"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_python38_stdlib_only(path: Path) -> None:
    assert problems(path) == []


def test_the_checker_catches_what_it_should(tmp_path: Path) -> None:
    """The rules above find each kind of violation (so an empty list above means something)."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""doc"""\n'
        "import json\n"
        "import yaml\n"
        "import zoneinfo\n"
        "from mxc.node import netif\n"
        "from functools import cache\n"
        "x = 'a'.removeprefix('b')\n"
        "y = {} | {}\n"
        "z = list[int]\n"
        "w = f'{x=}'\n"
        "ok = f'{x}={y}' + f'{dict(a=1)}'\n"
        "v = zip([], [], strict=True)\n"
        "def f(a: list[int] | None) -> dict[str, int]:\n"
        "    return os.readlink('x')\n")
    found = "\n".join(problems(bad))
    for expected in ("code must start with `from __future__", "imports yaml", "imports zoneinfo: Python 3.9",
                     "imports mxc.node", "import cache", ".removeprefix", "`|` of dicts", "list[...] evaluated",
                     "bad.py:10: f-string `=`", "zip(strict=...)"):
        assert expected in found, found
    assert "bad.py:11:" not in found and "readlink" not in found and "bad.py:13:" not in found
    old = tmp_path / "old.py"
    old.write_text("from __future__ import annotations\nmatch 1:\n    case 1:\n        pass\n")
    assert "not Python 3.8 syntax" in problems(old)[0]


def test_selftest_runs_under_the_system_python_outside_the_venv(tmp_path: Path) -> None:
    """Copied under another package name (as into a bundle) and run by /usr/bin/python3 with
    PYTHONPATH and user site ignored: no import can reach mxc or the venv."""
    copy = tmp_path / "nodeprog"
    shutil.copytree(NODE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([SYSTEM_PYTHON, "-E", "-s", "-m", "nodeprog.selftest"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("selftest: Python 3.") and f"at {SYSTEM_PYTHON} " in lines[0]
    assert f"prefix {sys.prefix})" not in lines[0]  # not the venv the tests run in
    assert [line.split(":")[1].strip() for line in lines[1:-1]] == ["netif", "checkpoints", "preflight", "postmortem",
                                                                    "stacks", "eventscrub"]
    assert lines[-1] == "selftest: ok"
