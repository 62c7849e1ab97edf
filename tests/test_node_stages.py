"""The node program's stage machinery, in-process: the barrier (threads), the image cache (two
processes on one cache file), the hang watch (a fake clock), the train-stage runner (real child
processes: output passed through, steps and infrastructure lines read, stop, timeout, hang) and
the bundle check that refuses a changed file."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from mxc.compiler import compile_spec
from mxc.node import barrier, imagecache, integrity, policy, rank
from mxc.node.contract import Hang, InfraPattern
from mxc.node.hangwatch import HangWatch, Hung
from mxc.node.imagecache import ImageError
from mxc.node.trainer import EndOfTraining, StopRequest, Trainer
from mxc.runtime.logs.trainlog import STEP_PREFIX
from mxc.store import Store
from tests.conftest import REPO

# ---- barrier


def test_barrier_waits_for_every_rank(tmp_path: Path) -> None:
    """Rank 0 arrives first and waits; it passes only once rank 1 (a thread that first waits for
    rank 0's file, so the order is fixed) has arrived."""
    where = tmp_path / "barrier"
    outcomes: dict[int, barrier.Outcome] = {}

    def late_rank() -> None:
        while 0 not in barrier.arrived(where):
            time.sleep(0.01)
        outcomes[1] = barrier.wait(where, 1, "node2", 2, time.monotonic() + 60, poll_s=0.01)

    thread = threading.Thread(target=late_rank)
    thread.start()
    outcomes[0] = barrier.wait(where, 0, "node1", 2, time.monotonic() + 60, poll_s=0.01)
    thread.join()
    assert outcomes[0].passed and outcomes[1].passed and outcomes[0].missing == []
    assert json.loads((where / "1").read_text())["node"] == "node2"
    assert sorted(os.listdir(where)) == ["0", "1"]  # no temporary file left


def test_barrier_names_who_did_not_arrive(tmp_path: Path) -> None:
    now = [0.0]
    outcome = barrier.wait(tmp_path, 2, "node3", 4, deadline=5.0, clock=lambda: now[0],
                           sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert not outcome.passed and outcome.missing == [0, 1, 3] and outcome.waited_s >= 5.0


# ---- image cache: two processes, one cache file, never a temporary one left or used


def _fetch_into_cache(cache: str, log: str, go: object, contended: object) -> None:
    go.wait()  # type: ignore[attr-defined]

    def fetch(tmp: Path, _left: float) -> None:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {tmp.name}\n")
        tmp.write_bytes(b"partial")
        contended.wait(60)  # type: ignore[attr-defined]  # the other process has found the lock held
        tmp.write_bytes(b"the whole image")

    calls = [0]

    def clock() -> float:
        # ensure() reads the clock once on entry and once after each failed try of the lock
        calls[0] += 1
        if calls[0] == 2:
            contended.set()  # type: ignore[attr-defined]
        return time.monotonic()

    ready = imagecache.ensure(Path(cache), "abc.sif", fetch, lambda tmp: None, time.monotonic() + 60,
                              clock=clock, poll_s=0.05)
    with open(log, "a") as fh:
        fh.write(f"{os.getpid()} {ready.action} {Path(ready.path).read_bytes().decode()}\n")


def test_two_processes_fetch_one_image_once(tmp_path: Path) -> None:
    log = tmp_path / "log"
    go = multiprocessing.get_context("fork").Event()
    contended = multiprocessing.get_context("fork").Event()
    procs = [multiprocessing.get_context("fork").Process(target=_fetch_into_cache,
                                                         args=(str(tmp_path / "c"), str(log), go, contended))
             for _ in range(2)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = log.read_text().splitlines()
    fetches = [line for line in lines if line.endswith(".tmp")]
    assert len(fetches) == 1 and ".abc.sif." in fetches[0]  # a temporary name of its own (host, pid)
    assert sorted(line.split(" ", 1)[1] for line in lines if not line.endswith(".tmp")) == [
        "cached the whole image", "fetched the whole image"]
    assert sorted(os.listdir(tmp_path / "c")) == ["abc.sif", "abc.sif.lock"]


def test_a_failed_fetch_leaves_nothing_to_use(tmp_path: Path) -> None:
    def broken(tmp: Path, _left: float) -> None:
        tmp.write_bytes(b"half")
        raise ImageError("the registry went away")

    with pytest.raises(ImageError, match="registry went away"):
        imagecache.ensure(tmp_path, "x.sif", broken, lambda tmp: None, time.monotonic() + 10)
    def fetch_bad(tmp: Path, _left: float) -> None:
        tmp.write_bytes(b"bad")

    def bad_digest(tmp: Path) -> None:
        raise ImageError("digest does not match")

    with pytest.raises(ImageError, match="does not match"):
        imagecache.ensure(tmp_path, "x.sif", fetch_bad, bad_digest, time.monotonic() + 10)
    assert sorted(os.listdir(tmp_path)) == ["x.sif.lock"]


def test_waiting_on_another_fetch_ends_at_the_deadline(tmp_path: Path) -> None:
    import fcntl

    with open(tmp_path / "x.sif.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(ImageError, match="another node has held"):
            imagecache.ensure(tmp_path, "x.sif", lambda tmp, _l: None, lambda tmp: None, time.monotonic() + 0.3,
                              poll_s=0.05)


# ---- the hang watch


def test_hang_watch_init_then_step_limits() -> None:
    watch = HangWatch(init_timeout_s=30, step_timeout_s=10, now=0.0)
    watch.output(20.0)  # compilation logs something: still initialising
    assert watch.check(49.0) is None
    assert watch.check(50.0) == Hung("init", 30.0, 30)
    watch.step(51.0)
    assert watch.phase == "step" and watch.check(60.0) is None
    watch.output(65.0)  # a warning printed in a loop is not progress once steps have begun
    assert watch.check(61.0 + 10) == Hung("step", 20.0, 10)
    assert HangWatch(0, 0, now=0.0).check(1e9) is None  # 0: no limit


def test_hang_watch_once_the_training_is_over_the_exit_grace_holds_and_is_no_hang() -> None:
    """From ``finished`` on, only runtime.exit_grace counts, from that moment: output and late
    step lines neither extend it nor bring the step limit back, and running out of it is no hang."""
    watch = HangWatch(init_timeout_s=30, step_timeout_s=10, now=0.0, exit_grace_s=100)
    watch.step(5.0)
    watch.finished(8.0)
    watch.output(50.0)
    watch.step(60.0)
    assert watch.phase == "exit" and watch.check(107.0) is None  # past the step limit: not a hang now
    expired = watch.check(108.0)
    assert expired == Hung("exit", 100.0, 100) and not expired.is_hang
    assert Hung("step", 11.0, 10).is_hang and Hung("init", 31.0, 30).is_hang


# ---- the train-stage runner, with real child processes

HANG = Hang(init_timeout_s=60, step_timeout_s=60, step_pattern=STEP_PREFIX.pattern)
NCCL = InfraPattern(cause="nccl_error", blame="network", regex=r"NCCL operation (?P<detail>\w+)\(.*\) failed")


def trainer(tmp_path: Path, script: str, hang: Hang = HANG, timeout_s: int = 0, stop: StopRequest | None = None,
            grace_s: int = 5, end: EndOfTraining | None = None) -> tuple[Trainer, io.BytesIO, list[str]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "t.py").write_text(script)
    out, said = io.BytesIO(), list[str]()
    runner = Trainer([sys.executable, str(tmp_path / "t.py")], dict(os.environ), str(tmp_path), hang=hang,
                     infrastructure=[NCCL], metrics=tmp_path / "metrics.jsonl", hang_marker=tmp_path / "hang.json",
                     rank=0, timeout_s=timeout_s, grace_s=grace_s, stop=stop or StopRequest(),
                     markers=[f"MXCTEST_MARK={tmp_path}"], dump_stacks=lambda pids: [("stack.txt", "py-spy")],
                     log=said.append, output=out, end=end)
    return runner, out, said


def end_at(tmp_path: Path, final_step: int, nprocs: int = 1, checkpoint: int | None = None) -> EndOfTraining:
    """The end of a training of ``final_step + 1`` steps for rank 0 of ``nprocs``, checkpointing when
    ``checkpoint`` is given (the latest finished one), as rank.py builds it."""
    return EndOfTraining(
        final_step=final_step, exit_grace_s=1, directory=tmp_path / "trained", rank=0, node="node1", nprocs=nprocs,
        over=lambda last: policy.training_over(last, final_step, checkpoint is not None, lambda: checkpoint))


STEPS_THEN = "import sys, time\nfor n in range(3): print(f'completed step: {n}, seconds: 0.1', flush=True)\n"
STALL = "while True: time.sleep(0.1)  # JAX draining its events after the last step\n"
GRACE_HANG = Hang(init_timeout_s=60, step_timeout_s=60, step_pattern=STEP_PREFIX.pattern, exit_grace_s=1)


def test_a_trainer_that_stalls_after_the_final_step_is_ended_as_completed_not_hung(tmp_path: Path) -> None:
    runner, _, said = trainer(tmp_path, STEPS_THEN + STALL, hang=GRACE_HANG, end=end_at(tmp_path, final_step=2))
    result = runner.run()
    assert result.hang is None and result.rc == 137 and (result.finished_step, result.ended_after_s) == (2, 1)
    assert rank.classify(result) == ("completed", "training completed; the trainer had not exited 1s after the final "
                                                  "step 2 (runtime.exit_grace): mxc ended it")
    assert said == ["training over on every rank (final step 2): the trainer has 1s to exit (runtime.exit_grace)",
                    "the trainer has not exited 1s after the training was over (runtime.exit_grace): ending it; "
                    "the training completed"]
    assert not (tmp_path / "hang.json").exists(), "no other rank is told of a hang"


def test_exit_1_after_the_final_step_is_completed_and_before_it_an_application_error(tmp_path: Path) -> None:
    after, _, _ = trainer(tmp_path, STEPS_THEN + "sys.exit(1)\n", end=end_at(tmp_path, final_step=2))
    result = after.run()
    assert (result.rc, result.finished_step) == (1, 2)
    assert rank.classify(result) == ("completed", "training completed; the trainer exited 1 after the final step 2")
    before, _, _ = trainer(tmp_path / "b", STEPS_THEN + "sys.exit(1)\n", end=end_at(tmp_path / "b", final_step=29))
    result = before.run()
    assert result.finished_step is None and rank.classify(result) == ("application_error", "exit 1")


def test_without_the_final_checkpoint_the_training_is_not_over(tmp_path: Path) -> None:
    """Checkpointing, and the newest finished checkpoint is not the final step's: the save is not
    done, so the step limit still holds and an exit 1 is the failure it always was."""
    runner, _, _ = trainer(tmp_path, STEPS_THEN + "sys.exit(1)\n", end=end_at(tmp_path, final_step=2, checkpoint=1))
    result = runner.run()
    assert result.finished_step is None and rank.classify(result)[0] == "application_error"
    done, _, _ = trainer(tmp_path / "c", STEPS_THEN + "sys.exit(1)\n",
                         end=end_at(tmp_path / "c", final_step=2, checkpoint=2))
    assert done.run().finished_step == 2


def test_exit_1_after_the_final_step_waits_for_the_other_ranks(tmp_path: Path) -> None:
    """Rank 0 of 2 exits 1 after its final step: completed once rank 1 says its training is over
    too (its file arrives while rank 0 waits); alone, after runtime.exit_grace, the failure stands."""
    end = end_at(tmp_path, final_step=2, nprocs=2)
    runner, _, _ = trainer(tmp_path, STEPS_THEN + "sys.exit(1)\n", end=end)

    def rank_1_later() -> None:
        while 0 not in barrier.arrived(end.directory):  # rank 0 waits for it now
            time.sleep(0.01)
        barrier.arrive(end.directory, 1, "node2")

    threading.Thread(target=rank_1_later).start()
    assert runner.run().finished_step == 2
    alone, _, _ = trainer(tmp_path / "a", STEPS_THEN + "sys.exit(1)\n", end=end_at(tmp_path / "a", 2, nprocs=2))
    result = alone.run()
    assert result.finished_step is None and rank.classify(result)[0] == "application_error"


def test_output_passes_through_and_is_read(tmp_path: Path) -> None:
    runner, out, _ = trainer(tmp_path, (
        "import sys\n"
        "print('completed step: 0, seconds: 0.1', flush=True)\n"
        "print('completed step: 1, seconds: 0.1', flush=True)\n"
        "print('W NCCL operation ncclAllReduce(x) failed: unhandled system error', file=sys.stderr, flush=True)\n"
        "sys.exit(7)\n"))
    result = runner.run()
    assert result.rc == 7 and result.last_step == 1 and result.first_step_seen and result.hang is None
    assert result.infra is not None and result.infra.cause == "nccl_error" and "ncclAllReduce" in result.infra.text
    assert out.getvalue().decode().splitlines()[:2] == ["completed step: 0, seconds: 0.1", "completed step: 1, seconds: 0.1"]


def test_a_stop_request_becomes_sigterm_then_sigkill_after_the_grace(tmp_path: Path) -> None:
    stop = StopRequest()
    runner, out, _ = trainer(tmp_path, (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a trainer that does not stop\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"), stop=stop, grace_s=1)
    def request_when_ready() -> None:
        while b"ready" not in out.getvalue():
            time.sleep(0.01)
        stop.request("SIGUSR2")

    threading.Thread(target=request_when_ready).start()
    result = runner.run()
    assert result.stopped and result.rc == 137  # SIGKILL after the grace


def test_train_timeout(tmp_path: Path) -> None:
    runner, _, said = trainer(tmp_path, "import time\nwhile True: time.sleep(0.1)\n", timeout_s=1, grace_s=1)
    result = runner.run()
    assert result.timed_out and result.rc == 143 and said == ["stage train timed out after 1s (runtime.timeouts.train)"]


def test_a_quiet_trainer_is_hung_before_its_first_step(tmp_path: Path) -> None:
    runner, _, said = trainer(tmp_path, "import time\nwhile True: time.sleep(0.1)\n",
                              hang=Hang(init_timeout_s=1, step_timeout_s=60, step_pattern=STEP_PREFIX.pattern))
    result = runner.run()
    assert result.hang is not None and result.hang.phase == "init" and result.hang.detected_by == 0
    assert result.hang.stacks == ["stack.txt"] and result.rc == 137 and not result.first_step_seen
    assert json.loads((tmp_path / "hang.json").read_text())["rank"] == 0  # the other ranks' signal
    assert said[0].startswith("no training output for 1s before the first step (runtime.hang.init_timeout 1s): hung")


def test_another_ranks_hang_marker_stops_this_trainer(tmp_path: Path) -> None:
    (tmp_path / "hang.json").write_text(json.dumps({"rank": 3, "phase": "step", "idle_seconds": 901.0, "limit_s": 900}))
    runner, _, said = trainer(tmp_path, "print('completed step: 0, seconds: 1', flush=True)\nimport time\ntime.sleep(60)\n")
    result = runner.run()
    assert result.hang is not None and (result.hang.detected_by, result.hang.limit_s) == (3, 900)
    assert said == ["rank 3 found the training hung: dumping stacks, killing it"]


# ---- the bundle check before every start


def test_a_changed_bundle_file_is_named_and_the_rank_refuses(tmp_path: Path) -> None:
    import subprocess

    bundle = compile_spec(str(REPO / "specs" / "tiny.yaml"), lambda p: Path(p).read_bytes(), mxc_version="test")
    stored, _ = Store(tmp_path / "home").put(bundle.files, bundle.hash)
    assert integrity.check(stored.path, stored.hash) == []
    target = stored.path / "mxc_node" / "policy.py"
    target.parent.chmod(0o755)
    target.chmod(0o644)
    target.write_text(target.read_text() + "\n# changed on the node\n")
    assert integrity.check(stored.path, stored.hash) == ["mxc_node/policy.py: changed (sha256 differs from the manifest)"]
    run = tmp_path / "home" / "runs" / "20260101-000000-0000-00000000"
    done = subprocess.run(["bash", str(stored.path / "entrypoint.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MXC_RUN_DIR": str(run)})
    assert done.returncode == 2
    assert "differs from what was built: mxc_node/policy.py: changed" in done.stderr and "refusing to start" in done.stderr
    [exit_event] = [json.loads(line) for line in (run / "ranks/0/events.jsonl").read_text().splitlines()]
    assert (exit_event["event"], exit_event["stage"], exit_event["cause"]) == ("exit", "verify", "stage_failed")
    (stored.path / "manifest.json").chmod(0o644)
    (stored.path / "manifest.json").write_text("{}")
    assert integrity.check(stored.path, stored.hash)[0].startswith("manifest.json: changed")


# ---- the coordinator's port


def test_the_coordinator_port_is_one_nothing_listens_on() -> None:
    import random
    import socket

    from mxc.node import batch

    for seed in range(50):  # a seed whose first pick this test can occupy
        first = random.Random(seed).randint(*batch.PORTS)
        with socket.socket() as taken:
            try:
                taken.bind(("127.0.0.1", first))
            except OSError:
                continue
            taken.listen()
            port = batch.free_port("127.0.0.1", rng=random.Random(seed))
        assert port != first and batch.PORTS[0] <= port <= batch.PORTS[1]
        return
    raise AssertionError("no seed gave a port this test could listen on")
