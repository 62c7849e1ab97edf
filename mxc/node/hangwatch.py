"""When is a training hung? A clock-driven state machine of phases, fed by what the trainer prints.

Each phase has its limit (run.json ``hang``, spec ``runtime.hang`` and ``runtime.exit_grace``) and
its idea of progress:

* ``init``, before the first step: ``init_timeout_s`` without *any* output line. Start-up,
  jax.distributed and NCCL/RCCL initialisation, compilation and checkpoint restore may be long and
  quiet, but an initialisation that hangs (the most common hang in the field) prints nothing at all;
* ``step``, from the first step on: ``step_timeout_s`` without a *new step* (a completed-step line,
  or the metrics file growing): warnings printed in a loop by a stuck collective are not progress;
* ``exit``, once the training is over (every rank logged the final step and, with checkpointing, its
  checkpoint is finished; the trainer tells the watch with ``finished``): ``exit_grace_s`` from that
  moment, whatever the trainer prints. JAX/PjRt may take minutes to shut down after the last step;
  running out of this limit is not a hang (``Hung.is_hang`` is False): the trainer is ended and the
  attempt completed.

A later phase never returns to an earlier one. Pure: the caller passes the time; the training
runner (trainer.py) feeds it and asks ``check``.
"""

from __future__ import annotations

from dataclasses import dataclass

INIT, STEP, EXIT = "init", "step", "exit"
# The spec key that sets each phase's limit (in messages: what to raise).
SETTING = {INIT: "runtime.hang.init_timeout", STEP: "runtime.hang.step_timeout", EXIT: "runtime.exit_grace"}


@dataclass(frozen=True)
class Hung:
    """A phase ran past its limit."""

    phase: str  # init | step | exit
    idle_seconds: float
    limit_s: int

    @property
    def is_hang(self) -> bool:
        """False in ``exit``: the training is over, the trainer is only slow to go (no failure, no restart)."""
        return self.phase != EXIT


class HangWatch:
    def __init__(self, init_timeout_s: int, step_timeout_s: int, now: float, exit_grace_s: int = 0) -> None:
        self.limits = {INIT: init_timeout_s, STEP: step_timeout_s, EXIT: exit_grace_s}
        self.phase = INIT
        self.last_progress = now

    @property
    def first_step_seen(self) -> bool:
        return self.phase != INIT

    def output(self, now: float) -> None:
        """The trainer printed a line (any line): progress only before the first step."""
        if self.phase == INIT:
            self.last_progress = now

    def step(self, now: float) -> None:
        """The trainer completed a step (its step line, or a new metrics line)."""
        if self.phase != EXIT:
            self.phase = STEP
            self.last_progress = now

    def finished(self, now: float) -> None:
        """The training is over on every rank: from now on the trainer has ``exit_grace_s`` to exit."""
        if self.phase != EXIT:
            self.phase = EXIT
            self.last_progress = now

    def check(self, now: float) -> Hung | None:
        limit = self.limits[self.phase]
        idle = now - self.last_progress
        if limit > 0 and idle >= limit:
            return Hung(self.phase, idle, limit)
        return None
