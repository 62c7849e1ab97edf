"""Relative references to bundles and runs: ``@`` (the newest), ``@~N`` (N before it) and
``label:NAME`` (the newest with that label), accepted wherever a hash prefix or run id is.

Hash prefixes and run ids are exact but long; these name what a person means after a build or a
run ("the one I just built", "the baseline"). Which list is meant and what "newest" orders by is
the caller's (bundles: mxc/store.py, by when each was last built, so ``@`` is what ``mxc run`` with
no bundle runs; runs: their start); this module only parses the syntax and picks from an ordered
list, with one-line errors (exit 2) that say what exists.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from mxc.errors import UserError

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_NEWEST = re.compile(r"^@(?:~(\d{1,6}))?$")


@dataclass(frozen=True)
class Relative:
    text: str
    back: int = 0  # @~N: N before the newest
    label: str | None = None  # label:NAME


def check_label(name: str) -> str:
    """A label as given to --label: letters, digits, '.', '_', '-' (no ':' or '@': they mean references)."""
    if not LABEL.match(name):
        raise UserError(f"--label: '{name[:80]}' is not a label",
                        "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64")
    return name


def parse(text: str) -> Relative | None:
    """The relative reference ``text`` is, or None when it is a plain hash prefix or run id."""
    text = text.strip()
    if text.startswith("label:"):
        return Relative(text, label=check_label(text[len("label:"):]))
    if not text.startswith("@"):
        return None
    m = _NEWEST.match(text)
    if not m:
        raise UserError(f"'{text[:80]}' is not a reference", "@ is the newest, @~1 the one before, label:NAME")
    return Relative(text, back=int(m[1] or 0))


def pick[T](ref: Relative, items: Sequence[T], what: str, labels_of: Callable[[T], Iterable[str]],
         listing: str) -> T:
    """The item ``ref`` names in ``items`` (oldest first). ``what``: "bundle"/"run" for messages;
    ``listing``: the command that lists them."""
    from mxc.compiler.errors import did_you_mean

    if ref.label is not None:
        labelled = [item for item in items if ref.label in labels_of(item)]
        if labelled:
            return labelled[-1]
        known = {label for item in items for label in labels_of(item)}
        hint = did_you_mean(ref.label, known) or (f"labels: {', '.join(sorted(known)[:10])}" if known
                                                  else f"no {what} has a label yet (--label NAME)")
        raise UserError(f"no {what} has the label '{ref.label}'", hint)
    if ref.back >= len(items):
        have = f"only {len(items)} {what}{'s' if len(items) != 1 else ''}" if items else f"no {what}s yet"
        raise UserError(f"'{ref.text}' names nothing: {have}", f"list them with: {listing}")
    return items[-1 - ref.back]
