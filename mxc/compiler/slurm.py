"""Facts the Slurm batch script needs that are easier to compute here than in bash."""

from __future__ import annotations

import re

from mxc.compiler.schema import JobSpec

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


def slurm_context(spec: JobSpec) -> dict[str, object]:
    """``slurm.*`` in templates: the time limit in seconds (0: none), the last step's
    number when ``steps`` is known ("" otherwise), and whether checkpoints are written."""
    steps = spec.model.overrides.get("steps")
    final_step = steps - 1 if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else ""
    return {
        "time_limit_seconds": time_seconds(spec.resources.time),
        "final_step": final_step,
        "checkpointing": "on" if spec.checkpoint.period else "off",
    }
