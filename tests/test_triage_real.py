"""Real failures provoked on this CPU machine through `mxc run`, then `mxc triage`.

Each test trains the tiny model (sequentially; a few seconds to a minute each) and breaks it
the way clusters break: a bad XLA flag, a memory limit (`ulimit -v`), a killed process, a
segfault (core + native backtrace collected), a hang. The bounded core collection is also
checked with a stand-in trainer that crashes at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.check_support import STALE_FLAG_TOKEN, STALE_JAXLIB_FLAG
from tests.conftest import REPO, Mxc
from tests.gates import PASSED, PauseGate, signal_main_thread

pytestmark = pytest.mark.training
TINY = REPO / "specs" / "tiny.yaml"
# Other engineers' trainings run on this machine: the stale-process preflight check would refuse.
# The pause gate (tests/gates.py) reaches the trainer through variables the bundle passes.
BASE: dict[str, Any] = {"runtime": {"preflight": {"stale_processes": False}}, "restart": {"max": 0},
                        "env": {"pass": list(PASSED)}}


@pytest.fixture(autouse=True)
def _jax_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MXC_JAX_CACHE", str(tmp_path_factory.getbasetemp() / "jax-cache"))


def build(mxc: Mxc, tmp_path: Path, extra: dict[str, Any]) -> str:
    spec = tmp_path / "spec.yaml"
    (tmp_path / "tiny.yaml").write_text(TINY.read_text())  # extends reaches only the spec's own directory
    merged = {"extends": "tiny.yaml", **BASE, **extra}
    for section in ("runtime", "env"):
        if section in extra:
            merged[section] = {**BASE[section], **extra[section]}
    spec.write_text(yaml.safe_dump(merged))
    out = mxc("build", "-q", str(spec))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def run(home: Path, bundle: str, signum: int | None = None, wrap: list[str] | None = None,
        timeout: float = 400) -> tuple[int, Path]:
    """`mxc run` the bundle; with ``signum``, the trainer pauses after step 3 (tests/gates.py) and gets
    that signal there, on its main thread. Returns (rc, run dir)."""
    env = {**os.environ, "MXC_HOME": str(home)}
    gate = PauseGate(Path(tempfile.mkdtemp(prefix="gate-", dir=home.parent)), {0: 3})
    if signum is not None:
        env.update(gate.env(env))
    argv = [sys.executable, "-m", "mxc", "run", "-q", bundle]
    proc = subprocess.Popen((wrap or []) + argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def act() -> None:
        assert signum is not None
        pid = gate.wait_paused(0, alive=lambda: proc.poll() is None)[0]
        signal_main_thread(pid, signum)

    watcher = threading.Thread(target=act, daemon=True)
    if signum is not None:
        watcher.start()
    try:
        out, _err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_id = out.strip().splitlines()[-1]
    return proc.returncode, home / "runs" / run_id


def triage(mxc: Mxc, run_dir: Path) -> dict[str, Any]:
    out = mxc("triage", run_dir.name, "--json")
    assert out.returncode == 0, out.stderr
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def test_bad_xla_flag(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    bundle = build(mxc, tmp_path, STALE_JAXLIB_FLAG)
    rc, run_dir = run(mxc_home, bundle)
    assert rc == 1
    verdict = triage(mxc, run_dir)
    assert verdict["cause"] == "unknown_xla_flag" and verdict["rank"] == 0
    assert f"Unknown flag in XLA_FLAGS: {STALE_FLAG_TOKEN}" in verdict["first_error"]["text"]
    assert any(f"{STALE_FLAG_TOKEN} in env.xla_flags" in t for t in verdict["try"])


def test_memory_limit(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """The whole run under `ulimit -v 1500000` (1.5 GB of address space): jaxlib cannot allocate."""
    bundle = build(mxc, tmp_path, {"checkpoint": {"period": 0}, "model": {"overrides": {"steps": 10}}})
    rc, run_dir = run(mxc_home, bundle, wrap=["bash", "-c", 'ulimit -v 1500000; exec "$@"', "limit"])
    assert rc != 0
    verdict = triage(mxc, run_dir)
    assert verdict["cause"] == "host_oom", verdict["title"]
    assert verdict["node"] == os.uname().nodename
    # Where the allocation fails depends on timing: jaxlib reports it, a thread cannot start, glibc
    # aborts a thread without room for its TLS (exit 127), or inside MLIR it dies by SIGSEGV (the
    # crash note records the limit): each must read as host OOM.
    assert any(w in verdict["first_error"]["text"] for w in ("bad_alloc", "can't start new thread", "MemoryError",
                                                              "Cannot allocate memory", "address-space limit",
                                                              "cannot allocate memory for thread-local data"))


def test_killed_process(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    bundle = build(mxc, tmp_path, {})
    rc, run_dir = run(mxc_home, bundle, signum=signal.SIGKILL)
    assert rc == 137
    verdict = triage(mxc, run_dir)
    assert verdict["cause"] == "killed" and verdict["rank"] == 0
    assert "SIGKILL" in verdict["first_error"]["text"]  # the rank's stage_end event: exit 137 (SIGKILL)
    assert not (run_dir / "cores").exists()  # SIGKILL leaves no core


def test_segfault_keeps_a_core_and_its_native_backtrace(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    bundle = build(mxc, tmp_path, {})
    rc, run_dir = run(mxc_home, bundle, signum=signal.SIGSEGV)
    assert rc == 139
    verdict = triage(mxc, run_dir)
    assert verdict["cause"] == "native_crash" and verdict["first_error"]["text"] == "Fatal Python error: Segmentation fault"
    crash = verdict["crash"]
    assert crash["signal"] == "SIGSEGV" and crash["core"] == "cores/core.rank-0.attempt-0"
    core = run_dir / crash["core"]
    assert 0 < core.stat().st_size <= 1024 << 20  # runtime.cores.max_mb (default 1024)
    assert crash["native_frames"][0] == "Program terminated with signal SIGSEGV, Segmentation fault."
    # the signal went to the main thread (tgkill), paused in Python: faulthandler shows its Python stack
    assert verdict["python_stack"][0].startswith("Current thread 0x"), verdict["python_stack"]
    assert any(line.startswith("File ") for line in verdict["python_stack"][1:])
    human = mxc("triage", run_dir.name).stdout
    assert "core dump: cores/core.rank-0.attempt-0" in human and "native backtrace: stacks/native.rank-0.attempt-0.txt" in human


def test_hang(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """The trainer is stopped (SIGSTOP) at step 3: nothing moves until the train stage's timeout.
    Triage calls a stage timeout a hang when no step came for 20 s before it (HANG_MIN_SECONDS); the
    limit counts from the stage's start, which MaxText's start takes 25 s of quietly and up to 60 s
    on a loaded 2-core machine (45 s failed there: 38 s to step 3, 7 s quiet). 90 s leaves 30 s."""
    bundle = build(mxc, tmp_path, {"runtime": {"timeouts": {"train": 90}, "signal_seconds": 10}})
    rc, run_dir = run(mxc_home, bundle, signum=signal.SIGSTOP)
    assert rc == 124
    verdict = triage(mxc, run_dir)
    assert verdict["cause"] == "hang", verdict["title"]
    assert verdict["first_error"]["text"].startswith("no step for ")
    assert any(a["cause"] == "stage_timeout" for a in verdict["also_seen"])


# ---- bounded core collection, with a stand-in trainer that crashes at once


@pytest.fixture
def crashing_python(tmp_path: Path) -> Iterator[Path]:
    """A 'python' for native runs: real Python for the image check; as the trainer, it fills 40 MB
    and segfaults itself (faulthandler on, as the entrypoint sets it)."""
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/bash\n"
        'if [ "$1" = -m ]; then\n'
        f"  exec {sys.executable} -c 'import os, signal; b = bytearray(40 << 20); b[::4096] = b\"x\" * len(b[::4096]); "
        "os.kill(os.getpid(), signal.SIGSEGV)'\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    yield fake


def test_core_size_and_count_are_bounded(mxc: Mxc, mxc_home: Path, tmp_path: Path, crashing_python: Path) -> None:
    bundle = build(mxc, tmp_path, {"runtime": {"cores": {"max_mb": 8, "keep": 1, "backtrace": False}},
                                   "restart": {"max": 1}})
    bundle_dir = mxc_home / "bundles" / bundle
    run_dir = tmp_path / "runs" / "20260101-000000-0000-00000000"
    run_dir.mkdir(parents=True)
    for attempt in (0, 1):  # two crashes, as two attempts of one run
        proc = subprocess.run(["bash", str(bundle_dir / "entrypoint.sh")], cwd=run_dir, capture_output=True, text=True,
                              env={**os.environ, "MXC_RUN_DIR": str(run_dir), "MXC_PYTHON": str(crashing_python),
                                   "MXC_ATTEMPT": str(attempt)}, timeout=120)
        (run_dir / "train.log").open("a").write(proc.stdout + proc.stderr)
        assert proc.returncode == 139, proc.stderr[-2000:]
    kept = sorted((run_dir / "cores").iterdir())
    assert [p.name for p in kept] == ["core.rank-0.attempt-0"]  # runtime.cores.keep: 1
    # runtime.cores.max_mb: 8 while the process held 40 MB (the kernel adds a few KB of ELF notes)
    # st_blocks, not st_size: the kernel may leave a sparse hole past the limit (file size > bytes written)
    assert 0 < kept[0].stat().st_blocks * 512 <= (8 << 20) + (64 << 10)
    second = (run_dir / "stacks" / "crash.rank-0.attempt-1.txt").read_text()
    assert "core: left at" in second and "runtime.cores.keep is 1" in second
    first = (run_dir / "stacks" / "crash.rank-0.attempt-0.txt").read_text()
    assert first.startswith("signal: 11 (SEGV)\n") and "limit 8192 KB" in first
    from mxc.runtime.triage import classify

    verdict = classify(run_dir)
    assert verdict.cause == "native_crash" and verdict.attempt == 1
    assert verdict.earlier[0]["cause"] == "native_crash"


def test_no_core_when_disabled(mxc: Mxc, mxc_home: Path, tmp_path: Path, crashing_python: Path) -> None:
    bundle = build(mxc, tmp_path, {"runtime": {"cores": {"max_mb": 0}}})
    run_dir = tmp_path / "runs" / "20260101-000000-0000-00000001"
    run_dir.mkdir(parents=True)
    proc = subprocess.run(["bash", str(mxc_home / "bundles" / bundle / "entrypoint.sh")], cwd=run_dir,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MXC_RUN_DIR": str(run_dir), "MXC_PYTHON": str(crashing_python)})
    assert proc.returncode == 139
    # faulthandler still on; the trainer's output comes through the node program's stdout
    assert "Fatal Python error: Segmentation fault" in proc.stdout
    assert not (run_dir / "cores").exists() and not list(run_dir.glob("core*"))
    assert "core: none (runtime.cores.max_mb is 0)" in (run_dir / "stacks" / "crash.rank-0.attempt-0.txt").read_text()



def summary_of(run_dir: Path) -> str:
    """What `mxc triage` says of the run, in the words the run's own record must use."""
    from mxc.runtime.triage import classify

    return classify(run_dir).summary()


def test_cpu_out_of_memory_is_the_models_and_the_summary_says_so(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """A batch of 10^6 sequences on CPU: XLA's CPU client cannot allocate the step's 327 GB. The
    model does not fit the device (the host, on CPU): device_oom, blame config, not a Python
    exception in jax; and the run's summary names that same cause, not the policy's 'config error'."""
    bundle = build(mxc, tmp_path, {"checkpoint": {"period": 0},
                                   "model": {"overrides": {"per_device_batch_size": 1000000}}})
    rc, run_dir = run(mxc_home, bundle)
    assert rc == 1
    verdict = triage(mxc, run_dir)
    assert (verdict["cause"], verdict["blame"]) == ("device_oom", "config"), verdict["title"]
    assert "RESOURCE_EXHAUSTED: Out of memory allocating" in verdict["first_error"]["text"]
    message = json.loads((run_dir / "record.json").read_text())["message"]
    assert message.startswith(f"training exited with 1: {summary_of(run_dir)}; not restarted: "), message
    assert "[device_oom; blame: config]" in message and "config error" not in message


def test_jax_platforms_naming_an_absent_gpu_blames_the_environment(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """An NVIDIA spec (JAX_PLATFORMS=cuda) trained on this machine, which has no NVIDIA GPU: jax skips
    cuda and asserts, inside MaxText's config validation. Only the environment is wrong: triage
    blames JAX_PLATFORMS, not the spec's model.overrides, and the run's summary says the same."""
    bundle = build(mxc, tmp_path, {"env": {"vars": {"JAX_PLATFORMS": "cuda"}},
                                   "resources": {"gpu_vendor": "nvidia", "gpus_per_node": 1},
                                   "runtime": {"preflight": {"gpus": False}}})
    rc, run_dir = run(mxc_home, bundle)
    assert rc == 1
    verdict = triage(mxc, run_dir)
    assert (verdict["cause"], verdict["blame"]) == ("jax_platform", "environment"), verdict["title"]
    assert verdict["title"].endswith("(JAX_PLATFORMS=cuda)")
    assert not any("model.overrides" in t for t in verdict["try"]) and any("JAX_PLATFORMS" in t for t in verdict["try"])
    message = json.loads((run_dir / "record.json").read_text())["message"]
    assert message.startswith(f"training exited with 1: {summary_of(run_dir)}; not restarted: "), message


def test_a_run_ended_by_mxc_cancel_is_cancelled_by_the_user(mxc: Mxc, mxc_home: Path, tmp_path: Path) -> None:
    """`mxc cancel` while the trainer waits at step 3 (tests/gates.py): the record says who stopped
    it, and triage says so instead of explaining a SIGTERM or a SIGKILL as an operator or an OOM kill."""
    bundle = build(mxc, tmp_path, {"checkpoint": {"period": 0},
                                   "model": {"overrides": {"steps": 2000, "learning_rate_schedule_steps": 2000}}})
    gate = PauseGate(Path(tempfile.mkdtemp(prefix="gate-", dir=mxc_home.parent)), {0: 3})
    env = {**os.environ, "MXC_HOME": str(mxc_home), **gate.env()}
    proc = subprocess.Popen([sys.executable, "-m", "mxc", "run", "-q", bundle], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        gate.wait_paused(0, alive=lambda: proc.poll() is None)
        [run_dir] = (mxc_home / "runs").iterdir()
        cancel = subprocess.Popen([sys.executable, "-m", "mxc", "cancel", run_dir.name], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        gate.release(0)  # the stop request reaches a trainer that runs on: it stops at its next step
        assert cancel.wait(timeout=120) == 0, cancel.communicate()
        assert proc.wait(timeout=120) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
    record = json.loads((run_dir / "record.json").read_text())
    assert (record["status"], record["cancelled_by"]) == ("cancelled", "mxc cancel")
    verdict = triage(mxc, run_dir)
    assert (verdict["cause"], verdict["blame"], verdict["title"]) == ("cancelled", "user",
                                                                      "cancelled by the user (mxc cancel)")
    assert not any("kill -9" in t or "OOM" in t for t in verdict["try"])
