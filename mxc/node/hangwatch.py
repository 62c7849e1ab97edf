"""When is a training hung? A clock-driven state machine, fed by what the trainer prints.

Two limits (run.json ``hang``, spec ``runtime.hang``):

* before the first step, ``init_timeout_s`` without *any* output line: start-up, jax.distributed
  and NCCL/RCCL initialisation, compilation and checkpoint restore may be long and quiet, but an
  initialisation that hangs (the most common hang in the field) prints nothing at all;
* from the first step on, ``step_timeout_s`` without a *new step* (a completed-step line, or the
  metrics file growing): warnings printed in a loop by a stuck collective are not progress.

Pure: the caller passes the time; the training runner (trainer.py) feeds it and asks ``check``.
"""

from __future__ import annotations

from dataclasses import dataclass

INIT, STEP = "init", "step"


@dataclass(frozen=True)
class Hung:
    phase: str  # init | step
    idle_seconds: float
    limit_s: int


class HangWatch:
    def __init__(self, init_timeout_s: int, step_timeout_s: int, now: float) -> None:
        self.init_timeout_s = init_timeout_s
        self.step_timeout_s = step_timeout_s
        self.first_step_seen = False
        self.last_progress = now

    def output(self, now: float) -> None:
        """The trainer printed a line (any line)."""
        if not self.first_step_seen:
            self.last_progress = now

    def step(self, now: float) -> None:
        """The trainer completed a step (its step line, or a new metrics line)."""
        self.first_step_seen = True
        self.last_progress = now

    @property
    def phase(self) -> str:
        return STEP if self.first_step_seen else INIT

    def check(self, now: float) -> Hung | None:
        limit = self.step_timeout_s if self.first_step_seen else self.init_timeout_s
        idle = now - self.last_progress
        if limit > 0 and idle >= limit:
            return Hung(self.phase, idle, limit)
        return None
