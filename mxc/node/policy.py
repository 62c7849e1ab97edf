"""The one restart policy: why an attempt ended -> requeue, stop or done, with the reason.

A pure function, used by the batch side of a Slurm job (batch.py) and by mxc's local supervisor
(mxc/runtime/local/supervisor.py) alike; docs/restarts.md shows the same table. Requeue means
"start again from the latest checkpoint": ``scontrol requeue`` (or a resubmission by mxc) on Slurm,
a new attempt locally. Every requeue is bounded by ``restart.max``.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Callable

# Why an attempt ended (the vocabulary of Decision.cause and RankExit.cause).
COMPLETED = "completed"  # training ran to its end
CANCELLED = "cancelled"  # a person stopped it (mxc cancel, Ctrl-C, scancel)
NODE_FAILURE = "node_failure"  # Slurm saw a node fail (it requeues the job itself)
PREEMPTION = "preemption"  # USR2 with time to spare, or Slurm's own preemption requeue
TIME_LIMIT = "time_limit"  # USR2 shortly before the job's time limit
HANG = "hang"  # the hang watch saw no progress for runtime.hang.* seconds
INFRASTRUCTURE = "infrastructure"  # the trainer's output named a node/network/scheduler failure (run.json)
KILLED = "killed"  # the trainer was killed from outside (SIGKILL, SIGTERM...) without a request
APPLICATION_ERROR = "application_error"  # the trainer failed by itself after its first step (exit, crash)
CONFIG_ERROR = "config_error"  # the trainer failed by itself before its first step
STAGE_FAILED = "stage_failed"  # preflight, image or barrier failed or timed out
TRAIN_TIMEOUT = "train_timeout"  # the train stage ran past runtime.timeouts.train

CAUSES = (COMPLETED, CANCELLED, NODE_FAILURE, PREEMPTION, TIME_LIMIT, HANG, INFRASTRUCTURE, KILLED,
          APPLICATION_ERROR, CONFIG_ERROR, STAGE_FAILED, TRAIN_TIMEOUT)

REQUEUE, STOP, DONE = "requeue", "stop", "done"

# Causes that a restart cannot fix: the same spec on the same code fails the same way again.
_FINAL = {
    CANCELLED: "cancelled",
    APPLICATION_ERROR: "an application error fails the same way again (see `mxc triage RUN`)",
    CONFIG_ERROR: "it failed before its first step; a restart would fail the same way",
    STAGE_FAILED: "a node failed a stage before training (see the rank's message); fix or exclude the node",
    TRAIN_TIMEOUT: "the train stage ran past runtime.timeouts.train; a restart would meet the same limit",
}


# Causes a requeue can fix (the infrastructure failed, or the job was stopped before its end).
REQUEUE_CAUSES = (NODE_FAILURE, PREEMPTION, TIME_LIMIT, HANG, INFRASTRUCTURE, KILLED)


@dataclass(frozen=True)
class Situation:
    """Everything the decision depends on."""

    cause: str  # one of CAUSES
    restarts: int  # restarts so far (0 in the first attempt)
    restart_max: int
    checkpoint: int | None  # the latest finished checkpoint step
    final_step: int | None  # the last step's number when the spec fixes steps
    checkpointing: bool = True  # checkpoint.period > 0 (for the message only)


@dataclass(frozen=True)
class Decision:
    action: str  # requeue | stop | done
    reason: str


def decide(s: Situation) -> Decision:
    if s.cause not in CAUSES:
        raise ValueError(f"unknown cause {s.cause!r}")
    if s.cause == COMPLETED:
        return Decision(DONE, "training completed")
    if s.final_step is not None and s.checkpoint == s.final_step:
        return Decision(DONE, f"training completed (the final step's checkpoint {s.checkpoint} exists)")
    if s.cause in _FINAL:
        return Decision(STOP, _FINAL[s.cause])
    if s.restarts >= s.restart_max:
        return Decision(STOP, f"restart.max ({s.restart_max}) reached")
    if s.cause == TIME_LIMIT and s.checkpoint is None:
        checkpointing = "on" if s.checkpointing else "off"
        return Decision(STOP, f"time limit reached without a checkpoint (checkpointing: {checkpointing}); "
                              "a requeue would start over and meet the same limit")
    resume = f"from checkpoint {s.checkpoint}" if s.checkpoint is not None else "from the start (no checkpoint yet)"
    return Decision(REQUEUE, f"{s.cause.replace('_', ' ')}: restart {s.restarts + 1} of at most {s.restart_max}, {resume}")


def training_over(last_step: int | None, final_step: int | None, checkpointing: bool,
                  checkpoint: Callable[[], int | None]) -> bool:
    """Whether a rank's training reached its end: it logged the final step (the spec fixes ``steps``)
    and, with checkpointing, the final step's checkpoint is finished (``checkpoint``: the latest
    finished one, asked only then: it scans a directory). Nothing the trainer does after that (a
    shut-down that takes minutes, an exit code from JAX's teardown) can lose work, so none of it is
    a reason to restart: a restart without a checkpoint would train again from step 0."""
    if final_step is None or last_step is None or last_step < final_step:
        return False
    if not checkpointing:
        return True
    latest = checkpoint()
    return latest is not None and latest >= final_step


def after_training(rc: int, ended_after_s: int | None, final_step: int) -> tuple[str, str | None]:
    """The cause of a trainer that ended once the training was over on every rank (``training_over``),
    and the note the record keeps when it did not simply exit 0: it is ``completed`` either way.
    ``ended_after_s``: mxc ended it that long after the training was over (runtime.exit_grace)."""
    if ended_after_s is not None:
        return COMPLETED, (f"training completed; the trainer had not exited {ended_after_s}s after the final step "
                           f"{final_step} (runtime.exit_grace): mxc ended it")
    if rc != 0:
        try:
            how = f" ({signal.Signals(rc - 128).name})" if rc > 128 else ""
        except ValueError:
            how = ""
        return COMPLETED, f"training completed; the trainer exited {rc}{how} after the final step {final_step}"
    return COMPLETED, None


def start_refusal(restarts: int, restart_max: int) -> str | None:
    """Why a start must not happen, or None. Slurm requeues a --requeue job by itself (node failure,
    preemption); this bounds those restarts too, before the job takes its nodes for another start."""
    if restarts > restart_max:
        return f"restart {restarts} is past restart.max ({restart_max})"
    return None
