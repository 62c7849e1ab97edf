"""Why USR2 came: the job's time limit is near, or the job is being preempted.

Slurm sends the batch shell USR2 ``runtime.signal_seconds`` before the time limit
(``--signal=B:USR2@N``) and, on sites with ``PreemptParameters=send_user_signal``, on preemption.
Both look the same; the time left tells them apart. Slurm may send the signal up to a minute
early, so more time left than ``signal_seconds + 90`` is a preemption.
"""

from __future__ import annotations

import re

from .policy import PREEMPTION, TIME_LIMIT

EARLY_SLACK_S = 90
_DURATION = re.compile(r"^(?:(\d+)-)?(\d+(?::\d+){0,2})$")


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` (``[D-]HH:MM:SS``, ``MM:SS``, ``SS``); None for UNLIMITED, NOT_SET, ''."""
    match = _DURATION.match(text.strip())
    if not match:
        return None
    days = int(match.group(1) or 0)
    parts = [int(p) for p in match.group(2).split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def cause_of_usr2(time_left: float | None, signal_seconds: int) -> str:
    """time_limit when the limit is within reach of this signal, else preemption (also when no
    limit is known: a job without one cannot be near it)."""
    if time_left is not None and time_left <= signal_seconds + EARLY_SLACK_S:
        return TIME_LIMIT
    return PREEMPTION


def fallback_time_left(time_limit_s: int, elapsed_s: float) -> float | None:
    """Without squeue: the spec's limit minus the time this batch shell has run (None without a limit)."""
    if time_limit_s <= 0:
        return None
    return time_limit_s - elapsed_s
