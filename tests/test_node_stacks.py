"""mxc/node/stacks.py: finding a training's Python processes in /proc, and their stacks with
py-spy or, without it, faulthandler, from real processes stuck in a known function."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mxc.node import livestacks, stacks

STUCK = '''
import sys, threading, time

def stuck_in_collective():
    print("ready", flush=True)
    while True:
        time.sleep(0.5)

threading.Thread(target=lambda: time.sleep(3600), name="data-loader", daemon=True).start()
stuck_in_collective()
'''


def fake_process(proc: Path, pid: int, pgrp: int, exe: str, state: str = "S") -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (pt_main_thread (x)) {state} 1 {pgrp} {pgrp} 0 -1 4194560\n")
    (d / "exe").symlink_to(exe)


def test_python_pids_of_a_process_group(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_process(proc, 100, 100, "/usr/bin/python3.11")  # the trainer, group leader
    fake_process(proc, 101, 100, "/opt/venv/bin/python")  # a data-loader worker
    fake_process(proc, 102, 100, "/usr/bin/bash")  # not Python
    fake_process(proc, 103, 100, "/usr/bin/python3", state="Z")  # exited
    fake_process(proc, 104, 200, "/usr/bin/python3")  # another group
    (proc / "105").mkdir()  # vanished while read
    (proc / "self").mkdir()
    assert stacks.python_pids(100, proc) == [100, 101]
    assert stacks.python_pids(300, proc) == []


def start_stuck(log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A Python process in its own process group, stuck in ``stuck_in_collective``; stderr to ``log``."""
    with open(log, "w") as err:
        child = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=err, text=True,
                                 start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1", **(env or {})})
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def end(child: subprocess.Popen[str]) -> None:
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


@pytest.fixture
def stuck(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    log = tmp_path / "train.log"
    child = start_stuck(log)
    try:
        yield child, log
    finally:
        end(child)


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[tuple[Path, list[subprocess.Popen[str]], Path]]:
    """A run directory and two stuck trainers of it (ranks 0 and 1, attempt 0: the markers the node
    program gives a rank's training in their environment)."""
    run = tmp_path / "run"
    children = [start_stuck(tmp_path / f"train.{rank}.log", {"MXC_RUN_DIR": str(run), "MXC_RANK": str(rank),
                                                              "MXC_ATTEMPT": "0"}) for rank in (0, 1)]
    try:
        yield run, children, tmp_path / "train.1.log"
    finally:
        for child in children:
            end(child)


def test_python_pids_of_a_real_group(stuck: tuple[subprocess.Popen[str], Path]) -> None:
    child, _ = stuck
    assert stacks.python_pids(child.pid) == [child.pid]


def test_py_spy_dump(stuck: tuple[subprocess.Popen[str], Path], tmp_path: Path) -> None:
    child, _ = stuck
    tool = stacks.find_py_spy()
    assert tool is not None, "py-spy is a dependency of mxc (beside the venv's python)"
    [dump] = stacks.dump_stacks([child.pid], tmp_path / "stacks", "attempt-0", tool=tool)
    assert dump.ok and dump.method.startswith("py-spy") and dump.path == tmp_path / "stacks" / f"attempt-0-pid{child.pid}.txt"
    text = dump.path.read_text()
    assert text.startswith(f"# {tool} dump --pid {child.pid}")
    assert "stuck_in_collective" in text and "data-loader" in text
    assert child.poll() is None  # py-spy only reads: the process lives on


def test_faulthandler_without_py_spy(stuck: tuple[subprocess.Popen[str], Path], tmp_path: Path) -> None:
    child, log = stuck
    [dump] = stacks.dump_stacks([child.pid], tmp_path / "stacks", "hang", log=log, tool=None)
    assert dump.ok and dump.method == "faulthandler"
    text = dump.path.read_text()
    assert text.startswith(f"# faulthandler (SIGABRT to {child.pid}); from the training log\nFatal Python error: Aborted")
    assert "stuck_in_collective" in text and text.count("Thread 0x") + text.count("Current thread 0x") >= 2
    assert child.wait() == -signal.SIGABRT


def test_py_spy_that_cannot_read_falls_back_to_faulthandler(stuck: tuple[subprocess.Popen[str], Path],
                                                             tmp_path: Path) -> None:
    child, log = stuck
    failing = tmp_path / "py-spy"
    failing.write_text("#!/bin/sh\necho 'Permission denied (os error 13)' >&2\nexit 1\n")
    failing.chmod(0o755)
    [dump] = stacks.dump_stacks([child.pid], tmp_path / "stacks", "hang", log=log, tool=str(failing))
    assert dump.method == "faulthandler" and dump.ok and "stuck_in_collective" in dump.path.read_text()
    single = stacks.dump_with_pyspy(4242, tmp_path / "x.txt", str(failing))
    assert not single.ok and single.path.read_text() == "# py-spy could not read process 4242: Permission denied (os error 13)\n"


def test_a_process_that_has_exited(tmp_path: Path) -> None:
    """Exited but not yet reaped (a zombie, so its pid cannot go to another process meanwhile)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    try:
        [dump] = stacks.dump_stacks([child.pid], tmp_path, "gone", log=None, tool=None)
    finally:
        child.wait()
    assert not dump.ok and dump.method == "faulthandler"
    assert dump.path.read_text() == f"# faulthandler (SIGABRT to {child.pid}); from the training log\n"


# ---- on demand (mxc stacks): py-spy or nothing, never SIGABRT


def test_on_demand_without_py_spy_never_signals(stuck: tuple[subprocess.Popen[str], Path], tmp_path: Path) -> None:
    child, log = stuck
    missing = tmp_path / "no-py-spy"
    [dump] = stacks.dump_stacks([child.pid], tmp_path / "stacks", "rank-0", log=log, tool=str(missing),
                                last_resort=False)
    assert not dump.ok and dump.method == "py-spy" and "could not read" in dump.path.read_text()
    [dump] = stacks.dump_stacks([child.pid], tmp_path / "stacks", "rank-0", log=log, tool=None, last_resort=False)
    assert not dump.ok and dump.method == "none" and "py-spy is not installed" in dump.path.read_text()
    assert child.poll() is None and "Fatal Python error" not in log.read_text()  # alive, never aborted


def _record(run: Path, rank: int, node: str, pid: int, **changes: object) -> None:
    livestacks.record_trainer(run, rank, node, 0, pid, [], stacks.find_py_spy())
    if changes:
        path = run / "ranks" / str(rank) / "trainer.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_live_trainers_by_identity_and_node(trainers: tuple[Path, list[subprocess.Popen[str]], Path]) -> None:
    run, (zero, one), _ = trainers
    _record(run, 0, "node1", zero.pid)
    _record(run, 1, "node2", one.pid)
    _record(run, 2, "node1", zero.pid, start_ticks=1)  # the pid now names another process: not the trainer
    _record(run, 3, "node1", zero.pid, boot_id="an-earlier-boot")
    (run / "ranks" / "4").mkdir()  # a rank that never started its trainer
    (run / "ranks" / "5").mkdir()
    (run / "ranks" / "5" / "trainer.json").write_text("{not json")
    assert [t["rank"] for t in livestacks.live_trainers(run)] == [0, 1]
    assert [t["rank"] for t in livestacks.live_trainers(run, "node2")] == [1]
    assert livestacks.live_trainers(run, "node3") == []


def test_node_program_dumps_its_nodes_trainers(trainers: tuple[Path, list[subprocess.Popen[str]], Path]) -> None:
    """``mxc_node stacks RUN OUT`` as srun starts it on each node: this node's ranks only, read by py-spy."""
    run, (zero, child), log = trainers
    out = run / "stacks" / "now"
    _record(run, 0, "node1", zero.pid)
    _record(run, 1, "node2", child.pid)
    node_main = Path(stacks.__file__).with_name("__main__.py")
    done = subprocess.run([sys.executable, "-E", "-s", "-B", str(node_main), "stacks", str(run), str(out)],
                          env={**os.environ, "SLURMD_NODENAME": "node2"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "mxc_node stacks: node node2: 1 process(es) of 1 rank(s)\n" and done.stderr == ""
    [entry] = json.loads((out / "node-node2.json").read_text())
    assert entry == {"rank": 1, "node": "node2", "attempt": 0, "pid": child.pid, "file": f"rank-1-pid{child.pid}.txt",
                     "method": entry["method"], "ok": True}
    assert entry["method"] in ("py-spy --native", "py-spy")
    assert "stuck_in_collective" in (out / entry["file"]).read_text()
    assert sorted(p.name for p in out.iterdir()) == ["node-node2.json", entry["file"]]
    assert child.poll() is None and "Fatal Python error" not in log.read_text()
