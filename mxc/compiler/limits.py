"""How big a spec may be: bounds that keep hostile input from exhausting memory, time or the stack.

A reviewed spec is a few kilobytes, four levels deep, with integers that fit in 64 bits. These
limits are far above that and far below what hurts: without them a 50 MB spec took 34 s to
build, 5,000 nested brackets overflowed the parser's recursion, a 5,000-digit integer broke
Python's int conversion, and an ``extends`` list naming one file a thousand times (each naming
another a thousand times) read a million files. docs/spec-reference.md states them (generated
from this module by tools/gen_spec_reference.py).
"""

from __future__ import annotations

MAX_FILE_BYTES = 1_048_576
"""Bytes in one spec, base spec or sweep file."""

MAX_DEPTH = 20
"""Nesting of mappings and lists (the top-level mapping is level 1; specs use 4)."""

MAX_VALUES = 10_000
"""Keys, list items and scalars in one file (or one ``--set`` value)."""

MAX_STRING_CHARS = 65_536
"""Characters in one string value."""

MAX_KEY_CHARS = 256
"""Characters in one mapping key (keys are names: of fields, variables, flags)."""

MAX_INT_DIGITS = 20
"""Digits of one integer (an unsigned 64-bit integer has 20)."""

MAX_EXTENDS_FILES = 64
"""Files read to resolve one spec: the spec and everything its ``extends`` chain names, counted per read."""


def described() -> list[tuple[str, str]]:
    """(limit, value) for the reference doc, in the order above."""
    return [
        ("bytes per file", f"{MAX_FILE_BYTES:,} (1 MiB)"),
        ("nesting depth", str(MAX_DEPTH)),
        ("keys, items and scalars per file", f"{MAX_VALUES:,}"),
        ("characters per string", f"{MAX_STRING_CHARS:,}"),
        ("characters per key", str(MAX_KEY_CHARS)),
        ("digits per integer", str(MAX_INT_DIGITS)),
        ("files read through `extends`", str(MAX_EXTENDS_FILES)),
    ]
