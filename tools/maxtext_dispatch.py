"""The values MaxText accepts for config keys its pydantic types leave free-form, read from the code.

``remat_policy`` and ``attention`` are plain ``str`` in MaxText's config types, so pydantic (and
``mxc check --probe``) accept ``remat_policy: fulll``; the training then dies a minute in, at the
``assert remat_policy == "full"`` ending ``get_remat_policy``'s chain of comparisons (or
``Unexpected attention kernel`` in ``apply_attention``). Such a chain is a *closed dispatch*: a
function compares the value with string constants and its final ``else`` raises or asserts, so
exactly the compared strings work. This module reads those chains from the source with ``ast``
(no import), so the catalog records them as enum choices and the static check, and the build,
refuse the typo before the queue.

Each ``Dispatch`` names the config key, the function that branches on it and the name it is
compared under (a local variable, ``cfg.<key>`` or ``self.<attribute>``). The reader refuses a
function that is not closed (no final ``else`` that raises or asserts on the name): then any
value would run, and the key stays a free-form string.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from maxtext_source import Layout, Tree

# Where MaxText's layers live, relative to its package directory (the parent of configs/).
LAYER_DIRS = ("layers",)


@dataclass(frozen=True)
class Dispatch:
    key: str  # the config key
    function: str  # the function whose if/elif chain decides what the value does
    compared: str  # how the value is named there (a variable or an attribute's last part)


DISPATCHES = (
    # maxtext 0.2.5: layers/nnx_decoders.py; 2025 trees: layers/decoders.py; older: layers/models.py
    Dispatch("remat_policy", "get_remat_policy", "remat_policy"),
    # every layout: layers/attention_op.py (older: layers/attentions.py); the decoder passes
    # attention_kernel=cfg.attention
    Dispatch("attention", "apply_attention", "attention_kernel"),
)


def _named(node: ast.expr, name: str) -> bool:
    return (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name)


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.expr) and _named(n, name) for n in ast.walk(node))


def _closed(function: ast.FunctionDef, name: str) -> bool:
    """Some if/elif chain on ``name`` ends in an ``else`` that first raises or asserts."""
    for node in ast.walk(function):
        if isinstance(node, ast.If) and _mentions(node.test, name):
            tail = node
            while len(tail.orelse) == 1 and isinstance(tail.orelse[0], ast.If):
                tail = tail.orelse[0]
            if tail.orelse and isinstance(tail.orelse[0], (ast.Raise, ast.Assert)):
                return True
    return False


def _truth_test(node: ast.BoolOp | ast.If, name: str) -> bool:
    """``if x:`` or ``x and ...``: the bare value decides a branch (an empty one takes the falsy one)."""
    if isinstance(node, ast.BoolOp):
        return any(_named(v, name) for v in node.values)
    return _named(node.test, name)


def choices_in(function: ast.FunctionDef, name: str) -> list[str]:
    """Every string ``name`` is compared with (==, !=, in, not in), in source order, once each; ``""``
    too where the function tests the bare value for truth (an empty value takes the falsy branch)."""
    found: list[tuple[int, int, list[str]]] = []
    for node in ast.walk(function):
        if isinstance(node, ast.Compare) and _named(node.left, name):
            for op, right in zip(node.ops, node.comparators, strict=True):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    found.append((right.lineno, right.col_offset, _strings(right)))
        elif isinstance(node, (ast.BoolOp, ast.If)) and _truth_test(node, name):
            found.append((node.lineno, node.col_offset, [""]))
    return list(dict.fromkeys(s for _, _, strings in sorted(found) for s in strings))


def _functions(tree: Tree, layout: Layout) -> dict[str, tuple[str, ast.FunctionDef]]:
    """function name -> (file, its definition), over the package's layer modules (first definition wins)."""
    package = PurePosixPath(layout.configs).parent
    found: dict[str, tuple[str, ast.FunctionDef]] = {}
    wanted = {d.function for d in DISPATCHES}
    for sub in LAYER_DIRS:
        directory = str(package / sub) if str(package) != "." else sub
        for name in tree.listdir(directory):
            if not name.endswith(".py"):
                continue
            path = f"{directory}/{name}"
            text = tree.read(path)
            if text is None:
                continue
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef) and node.name in wanted and node.name not in found:
                    found[node.name] = (path, node)
    return found


def dispatch_choices(tree: Tree, layout: Layout) -> dict[str, dict[str, Any]]:
    """config key -> {"choices": [...], "choices_from": "file:function"} for each closed dispatch found."""
    functions = _functions(tree, layout)
    out: dict[str, dict[str, Any]] = {}
    for dispatch in DISPATCHES:
        hit = functions.get(dispatch.function)
        if hit is None:
            continue
        path, function = hit
        choices = choices_in(function, dispatch.compared)
        if choices and _closed(function, dispatch.compared):
            relative = str(PurePosixPath(path).relative_to(PurePosixPath(layout.configs).parent))
            out[dispatch.key] = {"choices": choices, "choices_from": f"{relative}:{dispatch.function}"}
    return out


def apply(keys: dict[str, dict[str, Any]], found: dict[str, dict[str, Any]]) -> None:
    """Free-form string keys with a closed dispatch become enums of what the dispatch accepts."""
    for key, extra in found.items():
        entry = keys.get(key)
        if entry is not None and entry.get("type") == "str":
            entry.update({"type": "enum", **extra})
