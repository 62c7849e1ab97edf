"""Stacks of a stopped trainer, and stacks of a live run (issue 25).

On c388a5b a trainer stopped by SIGSTOP was caught as a hang, but its stack file held only a header:
py-spy cannot read a stopped process (py-spy 0.4.3 here: "Failed to find python version from target
process" / "Failed to get stack traces", with --nonblocking too), and the faulthandler fallback's
SIGABRT stays pending while the process is stopped. The record still listed the file as saved stacks.
Now the hang watch resumes (SIGCONT) a stopped process it is about to kill and reads it, saying so in
the file, and the record lists only files that hold stacks; `mxc stacks` (on demand) never resumes
one and says it is stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxc.node import stacks
from mxc.runtime.processes.procfs import pid_alive
from tests.test_node_stacks import STUCK
from tests.test_observe_hang import standin_pid, supervise


def state(pid: int) -> str:
    """The process's state letter in /proc/<pid>/stat (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def stopped(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A Python process stuck in ``stuck_in_collective``, then stopped by SIGSTOP (waited for as an event)."""
    log = tmp_path / "train.log"
    with open(log, "w") as err:
        child = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=err, text=True,
                                 start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    os.kill(child.pid, signal.SIGSTOP)
    _, status = os.waitpid(child.pid, os.WUNTRACED)  # returns once the child has stopped
    assert os.WIFSTOPPED(status)
    try:
        yield child
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            os.kill(child.pid, signal.SIGCONT)
        child.wait()


def test_the_hang_watch_reads_a_stopped_process_and_says_it_resumed_it(stopped: subprocess.Popen[str],
                                                                        tmp_path: Path) -> None:
    assert state(stopped.pid) == "T"
    [dump] = stacks.dump_stacks([stopped.pid], tmp_path / "stacks", "hang.rank-0.attempt-0",
                                log=tmp_path / "train.log")
    text = dump.path.read_text()
    assert dump.ok, text
    assert text.startswith(f"# process {stopped.pid} was stopped (state T): sent SIGCONT to read its stacks")
    assert "stuck_in_collective" in text


def test_mxc_stacks_never_resumes_a_stopped_process(stopped: subprocess.Popen[str], tmp_path: Path) -> None:
    [dump] = stacks.dump_stacks([stopped.pid], tmp_path / "stacks", "rank-0", last_resort=False)
    assert not dump.ok and "it is stopped (SIGSTOP or a debugger)" in dump.path.read_text()
    assert state(stopped.pid) == "T" and stopped.poll() is None  # still stopped, still there


def test_a_stopped_trainer_is_caught_as_a_hang_and_its_stacks_are_saved(tmp_path: Path) -> None:
    """Through the real supervisor and node program: a trainer that stops itself after three steps."""
    run, record = supervise(tmp_path, restarts=0, trainer="*=stop")
    assert record.status == "hung"
    [attempt] = record.attempts
    [dump] = attempt.model_dump(mode="json", exclude_none=True)["stacks"]
    text = Path(dump).read_text()
    assert "sent SIGCONT to read its stacks" in text and "stopped_in_collective" in text, text
    assert not pid_alive(standin_pid(run, 0))


# ---- mxc stacks on a live run: ranks/<r>/trainer.json is written in the run directory, which
# others may write (a shared runs root). On c388a5b `mxc stacks` ran the py-spy path the file named
# (any program, as the user who asked for stacks), matched processes by the markers the file named
# (HOME=... is every process of the user) and read any live pid the file named.


def plant(run: Path, rank: int, pid: int, **fields: object) -> None:
    from mxc.node import livestacks

    livestacks.record_trainer(run, rank, "node1", 0, pid, [], None)
    path = run / "ranks" / str(rank) / "trainer.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_planted_trainer_record_runs_nothing_and_reads_no_other_process(tmp_path: Path) -> None:
    from mxc.node import livestacks
    from tests.test_node_stacks import end, start_stuck

    run, out = tmp_path / "run", tmp_path / "run" / "stacks" / "now"
    evil = tmp_path / "py-spy"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'pwned'}\n")
    evil.chmod(0o755)
    # the victim's own Python process, not of this run: its identity (pid, start time, boot id) is public
    victim = start_stuck(tmp_path / "victim.log")
    # and the run's real trainer of rank 1 (its environment names the run)
    trainer = start_stuck(tmp_path / "train.log", {"MXC_RUN_DIR": str(run), "MXC_RANK": "1", "MXC_ATTEMPT": "0"})
    try:
        plant(run, 0, victim.pid, py_spy=str(evil), markers=[f"PATH={os.environ['PATH']}"])
        plant(run, 1, trainer.pid, py_spy=str(evil), markers=[f"HOME={os.environ.get('HOME', '/')}"])
        entries = livestacks.dump_node(run, out)
        assert not (tmp_path / "pwned").exists(), "the recorded py-spy path was run"
        assert {e["pid"] for e in entries} == {trainer.pid}, entries  # only the run's own trainer
        [entry] = entries
        assert entry["ok"] and "stuck_in_collective" in (out / entry["file"]).read_text()
    finally:
        end(victim)
        end(trainer)
