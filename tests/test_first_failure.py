"""One answer to "which rank failed first": the record says what the job decided.

Two ranks that fail their preflight within milliseconds are ordered by srun (its first
"task N: ..." line) and by their own exit events, and the two orders can differ. The job's
batch side decides on the exit events (mxc/node/outcome.py) and alerts about that rank; the
record's ``slurm.first_failure`` used to prefer srun's line and could name the other rank. Here
both readers run over the same files the node program writes.
"""

from __future__ import annotations

from pathlib import Path

from mxc.node import events, layout, outcome, policy
from mxc.runtime.rundir import RunDir
from mxc.runtime.slurm.events import JobFiles, LogFacts, first_failure


def _write(path: Path, *written: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        for event in written:
            fh.write(events.line(event))


def _two_ranks_fail_preflight(run: Path) -> None:
    for rank, node, failed_at in ((0, "node-a", 100.020), (1, "node-b", 100.010)):
        _write(layout.rank_events(run, rank),
               events.RankStart(time=99.0, job_id="7", attempt=0, rank=rank, node=node, nprocs=2,
                                coordinator="node-a:29500", pid=10 + rank, interface="eth0", interface_reason="test"),
               events.RankExit(time=failed_at, job_id="7", attempt=0, rank=rank, node=node, stage="preflight", rc=3,
                               timed_out=False, cause=policy.STAGE_FAILED, detail="preflight failed: disk", last_step=None))


def _srun_saw(rank: int, node: str) -> LogFacts:
    return LogFacts(srun_first_error={0: {"rank": rank, "node": node, "what": "Exited with exit code 3"}})


def _decide(run: Path) -> events.Decision:
    """What the batch side writes after srun returns (mxc/node/batch.py Batch.decide)."""
    ended = outcome.of_attempt(run, 0, 2)
    decision = events.Decision(time=101.0, job_id="7", attempt=0, cause=ended.cause, action=policy.STOP,
                               reason="no restart for a failed preflight", checkpoint=None, rank=ended.rank,
                               node=ended.node, detail=ended.detail)
    _write(layout.batch_events(run), decision)
    return decision


def test_the_record_names_the_rank_the_job_decided_on(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _two_ranks_fail_preflight(run)
    srun = _srun_saw(0, "node-a")  # srun reported rank 0 first; rank 1's exit event is earlier

    before = first_failure(JobFiles.read(RunDir(run)), srun, 0)
    assert before is not None and before.rank == 0 and before.srun == "Exited with exit code 3"

    decision = _decide(run)
    assert decision.rank == 1 and decision.node == "node-b"
    after = first_failure(JobFiles.read(RunDir(run)), srun, 0)
    assert after is not None
    assert (after.rank, after.node, after.stage, after.why) == (1, "node-b", "preflight", "preflight failed")
    assert after.srun is None  # srun's words were about rank 0, not this one


def test_srun_words_stay_when_they_are_about_the_decided_rank(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _two_ranks_fail_preflight(run)
    _decide(run)
    found = first_failure(JobFiles.read(RunDir(run)), _srun_saw(1, "node-b"), 0)
    assert found is not None and found.rank == 1 and found.srun == "Exited with exit code 3"


def test_a_decided_rank_without_an_exit_was_killed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _write(layout.rank_events(run, 0),
           events.RankStart(time=99.0, job_id="7", attempt=0, rank=0, node="node-a", nprocs=1, coordinator="",
                            pid=10, interface="eth0", interface_reason="test"))
    decision = _decide(run)
    assert decision.cause == policy.KILLED
    found = first_failure(JobFiles.read(RunDir(run)), LogFacts(), 0)
    assert found is not None and (found.rank, found.node, found.cause) == (0, "node-a", policy.KILLED)
    assert found.why.startswith("no exit recorded")
