"""Slurm's time syntax, read by the compiler (the contract's ``slurm.time_limit_s``)."""

from __future__ import annotations

import re

_TIME = re.compile(r"^(?:(?P<days>\d+)-)?(?P<rest>\d+(?::\d+){0,2})$")


def time_seconds(text: str | None) -> int:
    """Seconds in a Slurm time limit; 0 for none.

    Slurm's forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``. With a day
    part, the first field is hours; without one, a lone field is minutes.
    """
    if not text:
        return 0
    match = _TIME.match(text.strip())
    if not match:
        raise ValueError(f"not a Slurm time: {text!r}")
    fields = [int(f) for f in match["rest"].split(":")]
    if match["days"] is not None:
        hours, minutes, seconds = [*fields, 0, 0][:3]
        return ((int(match["days"]) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(fields) == 1:
        return fields[0] * 60
    if len(fields) == 2:
        return fields[0] * 60 + fields[1]
    return (fields[0] * 60 + fields[1]) * 60 + fields[2]
