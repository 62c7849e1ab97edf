"""The restart policy (mxc/node/policy.py), row by row as docs/restarts.md shows it, and the two
facts it is fed: why USR2 came (stopcause.py) and how an attempt ended (outcome.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mxc.node import events, layout, outcome, policy, stopcause
from mxc.node.policy import Situation, decide

REQUEUE, STOP, DONE = policy.REQUEUE, policy.STOP, policy.DONE


def situation(cause: str, restarts: int = 0, restart_max: int = 3, checkpoint: int | None = 10,
              final_step: int | None = 29, checkpointing: bool = True) -> Situation:
    return Situation(cause, restarts, restart_max, checkpoint, final_step, checkpointing)


# The table of docs/restarts.md: cause -> decision below restart.max (with a checkpoint, before the end).
TABLE = [
    (policy.COMPLETED, DONE),
    (policy.NODE_FAILURE, REQUEUE),
    (policy.PREEMPTION, REQUEUE),
    (policy.TIME_LIMIT, REQUEUE),
    (policy.HANG, REQUEUE),
    (policy.INFRASTRUCTURE, REQUEUE),
    (policy.KILLED, REQUEUE),
    (policy.APPLICATION_ERROR, STOP),
    (policy.CONFIG_ERROR, STOP),
    (policy.STAGE_FAILED, STOP),
    (policy.TRAIN_TIMEOUT, STOP),
    (policy.CANCELLED, STOP),
]


def test_the_table_covers_every_cause() -> None:
    assert sorted(cause for cause, _ in TABLE) == sorted(policy.CAUSES)


@pytest.mark.parametrize(("cause", "action"), TABLE, ids=[c for c, _ in TABLE])
def test_each_cause_below_restart_max(cause: str, action: str) -> None:
    decision = decide(situation(cause))
    assert decision.action == action, decision
    if action == REQUEUE:
        assert decision.reason == f"{cause.replace('_', ' ')}: restart 1 of at most 3, from checkpoint 10"


@pytest.mark.parametrize("cause", [c for c, a in TABLE if a == REQUEUE])
def test_requeues_are_bounded_by_restart_max(cause: str) -> None:
    assert decide(situation(cause, restarts=2)).action == REQUEUE
    decision = decide(situation(cause, restarts=3))
    assert (decision.action, decision.reason) == (STOP, "restart.max (3) reached")
    assert decide(situation(cause, restarts=0, restart_max=0)).action == STOP


def test_time_limit_without_a_checkpoint_is_not_requeued() -> None:
    decision = decide(situation(policy.TIME_LIMIT, checkpoint=None, checkpointing=False))
    assert decision.action == STOP
    assert decision.reason.startswith("time limit reached without a checkpoint (checkpointing: off); a requeue would start over")
    # Other requeue causes restart from the start when there is no checkpoint yet.
    no_checkpoint = decide(situation(policy.HANG, checkpoint=None))
    assert no_checkpoint.reason == "hang: restart 1 of at most 3, from the start (no checkpoint yet)"


def test_the_final_checkpoint_means_done_whatever_the_cause() -> None:
    for cause in (policy.TIME_LIMIT, policy.HANG, policy.APPLICATION_ERROR, policy.PREEMPTION):
        decision = decide(situation(cause, checkpoint=29, final_step=29, restarts=5))
        assert decision == policy.Decision(DONE, "training completed (the final step's checkpoint 29 exists)")
    assert decide(situation(policy.HANG, checkpoint=29, final_step=None)).action == REQUEUE  # steps not fixed


def test_the_training_is_over_at_the_final_step_and_with_checkpointing_its_checkpoint() -> None:
    asked: list[str] = []

    def latest(step: int | None) -> Callable[[], int | None]:
        def scan() -> int | None:
            asked.append("scan")
            return step
        return scan

    assert policy.training_over(29, 29, False, latest(None)) and asked == []  # no checkpointing: no scan
    assert not policy.training_over(28, 29, True, latest(29)) and asked == []  # before the end: no scan either
    assert not policy.training_over(None, 29, False, latest(None))
    assert not policy.training_over(29, None, False, latest(None))  # steps not fixed: no end known
    assert not policy.training_over(29, 29, True, latest(20))  # the final save is not finished
    assert not policy.training_over(29, 29, True, latest(None))
    assert policy.training_over(29, 29, True, latest(29)) and asked == ["scan"] * 3


def test_after_the_training_a_stall_or_failed_exit_is_completed_with_a_note() -> None:
    assert policy.after_training(0, None, 29) == (policy.COMPLETED, None)
    assert policy.after_training(1, None, 29) == (
        policy.COMPLETED, "training completed; the trainer exited 1 after the final step 29")
    assert policy.after_training(139, None, 29)[1] == (
        "training completed; the trainer exited 139 (SIGSEGV) after the final step 29")
    assert policy.after_training(137, 120, 29) == (
        policy.COMPLETED, "training completed; the trainer had not exited 120s after the final step 29 "
                          "(runtime.exit_grace): mxc ended it")


def test_application_errors_are_not_requeued_and_say_why() -> None:
    assert "fails the same way again" in decide(situation(policy.APPLICATION_ERROR)).reason
    assert "before its first step" in decide(situation(policy.CONFIG_ERROR)).reason
    with pytest.raises(ValueError, match="unknown cause"):
        decide(situation("weather"))


def test_start_refusal_bounds_slurms_own_requeues() -> None:
    assert policy.start_refusal(3, 3) is None
    assert policy.start_refusal(4, 3) == "restart 4 is past restart.max (3)"


# ---- why USR2 came


@pytest.mark.parametrize(("text", "seconds"), [
    ("1-02:03:04", 93784.0), ("02:03:04", 7384.0), ("03:04", 184.0), ("59", 59.0), ("UNLIMITED", None),
    ("NOT_SET", None), ("", None), ("INVALID", None),
])
def test_squeue_time_left(text: str, seconds: float | None) -> None:
    assert stopcause.parse_time_left(text) == seconds


def test_usr2_near_the_limit_is_the_time_limit_else_preemption() -> None:
    assert stopcause.cause_of_usr2(300, 300) == policy.TIME_LIMIT
    assert stopcause.cause_of_usr2(390, 300) == policy.TIME_LIMIT  # Slurm may signal up to 90 s early
    assert stopcause.cause_of_usr2(391, 300) == policy.PREEMPTION
    assert stopcause.cause_of_usr2(None, 300) == policy.PREEMPTION  # no limit: nothing to be near
    assert stopcause.fallback_time_left(0, 10) is None
    assert stopcause.fallback_time_left(3600, 3400.5) == 199.5


# ---- how an attempt ended, from the ranks' exit events


def exit_event(rank: int, cause: str, at: float, attempt: int = 0, rc: int = 1, stage: str = "train") -> events.RankExit:
    return events.RankExit(time=at, job_id="7", attempt=attempt, rank=rank, node=f"node{rank + 1}", stage=stage, rc=rc,
                           timed_out=False, cause=cause, detail=f"{cause} on {rank}", last_step=4)


def start_event(rank: int, attempt: int = 0) -> events.RankStart:
    return events.RankStart(time=time.time(), job_id="7", attempt=attempt, rank=rank, node=f"node{rank + 1}", nprocs=2,
                            coordinator="n:1", pid=1, interface="lo", interface_reason="test")


def write(run: Path, *evs: object) -> None:
    for e in evs:
        events.append(layout.rank_events(run, e.rank), e)  # type: ignore[attr-defined]


def test_the_earliest_failing_rank_names_the_cause(tmp_path: Path) -> None:
    write(tmp_path, start_event(0), start_event(1), exit_event(1, policy.INFRASTRUCTURE, 100.0),
          exit_event(0, policy.KILLED, 101.0, rc=143), exit_event(0, policy.APPLICATION_ERROR, 50.0, attempt=1))
    found = outcome.of_attempt(tmp_path, 0, 2)
    assert (found.cause, found.rank, found.node, found.detail) == (policy.INFRASTRUCTURE, 1, "node2", "infrastructure on 1")


def test_completed_only_when_every_rank_completed(tmp_path: Path) -> None:
    write(tmp_path, start_event(0), start_event(1), exit_event(0, policy.COMPLETED, 1.0, rc=0))
    vanished = outcome.of_attempt(tmp_path, 0, 2)
    assert (vanished.cause, vanished.rank) == (policy.KILLED, 1)  # started, never exited: killed outright
    write(tmp_path, exit_event(1, policy.COMPLETED, 2.0, rc=0))
    assert outcome.of_attempt(tmp_path, 0, 2).cause == policy.COMPLETED
    assert outcome.of_attempt(tmp_path, 3, 2).cause == policy.STAGE_FAILED  # no rank ever started attempt 3


def test_a_stop_on_request_is_cancelled(tmp_path: Path) -> None:
    write(tmp_path, start_event(0), exit_event(0, policy.CANCELLED, 1.0, rc=143))
    assert outcome.of_attempt(tmp_path, 0, 1).cause == policy.CANCELLED


def test_a_completed_attempt_keeps_the_ranks_notes_once(tmp_path: Path) -> None:
    """What the ranks noted after the training was over reaches the record: one note per text."""
    stalled = "training completed; the trainer had not exited 2s after the final step 2 (runtime.exit_grace): mxc ended it"
    done = [events.RankExit(time=float(r), job_id="7", attempt=0, rank=r, node=f"node{r + 1}", stage="train", rc=0,
                            timed_out=False, cause=policy.COMPLETED, detail=stalled if r < 2 else None, last_step=2)
            for r in range(3)]
    write(tmp_path, *done)
    assert outcome.of_attempt(tmp_path, 0, 3).detail == f"ranks 0, 1: {stalled}"
    write(tmp_path / "one", dataclasses.replace(done[0]))
    assert outcome.of_attempt(tmp_path / "one", 0, 1).detail == stalled
