"""Run-time placeholders in spec values: ``{run_dir}``, ``{rank}``... filled in by the node program.

Some values can only be known on the node: a dump directory inside the run directory, a file per
rank, the Slurm job id. A spec writes them as ``{name}`` in ``env.vars``, ``env.xla_flags``,
``env.ranks`` and ``model.overrides`` values; ``{{`` and ``}}`` are a literal brace. The compiler
checks every such value with :func:`names` (an unknown name or a lone brace is a spec error, with
its line), so every value of the contract's environment and trainer arguments is a valid template,
and the node program fills them all in with :func:`fill`. No shell is involved: the filled-in value
goes into the trainer's environment or argv as one string, whatever it holds. Stdlib only: this
module ships in every bundle with the node program.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# name -> what it is (docs/spec-reference.md lists these)
PLACEHOLDERS = {
    "run_dir": "the run directory (the same path inside a container)",
    "run_id": "the run id (the run directory's name)",
    "rank": "this rank's number: 0 .. resources.nodes - 1 (one rank per node)",
    "node": "this node's name (Slurm's, else the host name)",
    "job_id": "the Slurm job id; `local` for a local run",
    "attempt": "the restart count: 0, then 1 after the first restart...",
}
_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


class PlaceholderError(ValueError):
    """A value that is not a valid template: the message says what and where."""


def has_braces(text: str) -> bool:
    return "{" in text or "}" in text


def names(text: str) -> list[str]:
    """The placeholders ``text`` uses, in order; PlaceholderError for an unknown one or a lone brace."""
    used = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token in ("{{", "}}"):
            continue
        name = match.group(1)
        if name is None:
            raise PlaceholderError(f"a lone '{token}' at character {match.start() + 1}: write '{token}{token}' "
                                   "for a literal brace")
        if name not in PLACEHOLDERS:
            known = ", ".join("{" + n + "}" for n in PLACEHOLDERS)
            raise PlaceholderError(f"'{{{name}}}' is not a run-time placeholder (known: {known}; "
                                   "'{{' and '}}' are literal braces)")
        used.append(name)
    return used


def fill(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every placeholder replaced by ``values[name]`` and ``{{``/``}}`` made single."""

    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        if name is None or name not in values:
            raise PlaceholderError(f"cannot fill {token!r}")
        return values[name]

    return _TOKEN.sub(one, text)
