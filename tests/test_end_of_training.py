"""The end of training is not a hang (runtime.exit_grace), in a local run through the real supervisor
and the bundle's node program, with the stand-in trainer (tests/standins/trainer.py) and a spec of
three steps: a trainer that stalls after its last step, or exits 1 there, ends a succeeded run with
a note, in one attempt; the same exit before the last step is the application error it always was.
The same on the test Slurm: tests/test_slurm_node.py."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_observe_hang import supervise

THREE_STEPS = ("runtime.preflight.stale_processes=false", "checkpoint.period=0", "model.overrides.steps=3",
               "runtime.exit_grace=1", "runtime.hang.step_timeout=600",
               "env.pass=[MXCTEST_TRAINER]")  # the stand-in trainer's behaviour (tests/standins/trainer.py)


def exits(run: Path) -> list[dict[str, object]]:
    lines = (run / "ranks" / "0" / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "exit"]


def test_a_trainer_that_stalls_after_its_last_step_ends_a_succeeded_run(tmp_path: Path) -> None:
    run, record = supervise(tmp_path, restarts=2, sets=THREE_STEPS, trainer="*=stall")
    note = "training completed; the trainer had not exited 1s after the final step 2 (runtime.exit_grace): mxc ended it"
    assert (record.status, record.restarts, record.exit_code, record.message) == ("succeeded", 0, 0, note)
    [attempt] = record.attempts
    assert attempt.cause == "completed" and attempt.reason == note and not attempt.hung
    assert [(e["cause"], e["rc"], e["detail"]) for e in exits(run.path)] == [("completed", 0, note)]
    assert not (run.path / "hang").exists() and not run.stacks.exists(), "no hang, no stack dump"
    log = run.log.read_text()
    assert "training over on every rank (final step 2): the trainer has 1s to exit (runtime.exit_grace)" in log
    assert f"[mxc] run succeeded: {note}" in log


def test_exit_1_after_the_last_step_succeeds_and_before_it_fails_as_before(tmp_path: Path) -> None:
    _, after = supervise(tmp_path / "after", restarts=2, sets=THREE_STEPS, trainer="*=exit1")
    note = "training completed; the trainer exited 1 after the final step 2"
    assert (after.status, after.restarts, after.exit_code, after.message) == ("succeeded", 0, 0, note)
    # 30 steps: the same exit after step 2 is an application error, not restarted (docs/restarts.md)
    thirty = tuple(s for s in THREE_STEPS if not s.startswith("model.overrides.steps"))
    run, before = supervise(tmp_path / "before", restarts=2, sets=thirty, trainer="*=exit1")
    assert (before.status, before.restarts, before.exit_code) == ("failed", 0, 1)
    assert before.attempts[0].cause == "application_error"
    assert [(e["cause"], e["rc"]) for e in exits(run.path)] == [("application_error", 1)]
