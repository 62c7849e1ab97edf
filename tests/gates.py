"""Deterministic mid-training faults: pause a real MaxText trainer at a step, act, release.

The trainer side is tests/faults/sitecustomize.py (on PYTHONPATH through ``PauseGate.env``, in a
bundle that passes ``PASSED``: build it with ``PASS_SET``). A test
waits for the pause (an event: the marker file), does what it tests - SIGKILL, SIGSTOP, a signal to
the main thread, a Slurm requeue - and releases the trainer if it should go on. No test races a
training that might finish first.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

FAULTS = Path(__file__).resolve().parent / "faults"
# The gate reaches the trainer through these variables, which a bundle must pass (env.pass: only the
# base of the caller's environment reaches a training otherwise, mxc/node/envboundary.py).
PASSED = ("PYTHONPATH", "MXCTEST_PAUSE")
PASS_VALUE = f"[{', '.join(PASSED)}]"
PASS_SET = f"env.pass={PASS_VALUE}"  # for `mxc build --set`
_SYS_TGKILL = 234  # x86-64; the tests run on x86-64 Linux


@dataclass(frozen=True)
class PauseGate:
    """Pause the trainer at ``steps[attempt]`` (completed step) in each listed attempt."""

    directory: Path
    steps: Mapping[int, int] = field(default_factory=dict)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Variables to add to the environment `mxc run` (and so the trainer) gets."""
        base = os.environ if base is None else base
        points = ",".join(f"{step}@{attempt}" for attempt, step in sorted(self.steps.items()))
        path = os.pathsep.join(p for p in (str(FAULTS), base.get("PYTHONPATH", "")) if p)
        return {"MXCTEST_PAUSE": f"{self.directory}:{points}", "PYTHONPATH": path}

    def paused(self, attempt: int = 0, ranks: int = 1) -> dict[int, int] | None:
        """{rank: trainer pid} once every rank of ``attempt`` is paused, else None."""
        found = {}
        for rank in range(ranks):
            marker = self.directory / f"paused.attempt-{attempt}.rank-{rank}"
            if not marker.exists():
                return None
            found[rank] = int(marker.read_text())
        return found

    def wait_paused(self, attempt: int = 0, ranks: int = 1, timeout: float = 600,
                    alive: Callable[[], bool] | None = None) -> dict[int, int]:
        """Block until every rank of ``attempt`` is paused; the timeout is a failure, never a verdict."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pids = self.paused(attempt, ranks)
            if pids is not None:
                return pids
            if alive is not None and not alive():
                raise AssertionError(f"the run ended before attempt {attempt} reached step {self.steps.get(attempt)}")
            time.sleep(0.05)
        raise AssertionError(f"timed out after {timeout}s waiting for attempt {attempt} to pause at step "
                             f"{self.steps.get(attempt)}")

    def release(self, attempt: int = 0) -> None:
        (self.directory / f"release.attempt-{attempt}").touch()

    def release_all(self) -> None:
        for attempt in self.steps:
            if self.directory.is_dir():
                self.release(attempt)

    def __post_init__(self) -> None:
        _MADE.append(self)


_MADE: list[PauseGate] = []


def release_every_gate() -> None:
    """Let every trainer a test paused go on (conftest calls it after each test): a test that fails
    while its trainer waits must not leave a job holding the test cluster's nodes for ever."""
    while _MADE:
        _MADE.pop().release_all()


def signal_main_thread(pid: int, signum: int) -> None:
    """Deliver ``signum`` to the main thread of ``pid`` (tgkill), not to whichever thread the kernel picks.

    A process-directed signal (kill) may land on a native thread without Python state; a test
    that expects faulthandler's Python stack must target the main thread, whose tid is the pid.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_TGKILL, pid, pid, int(signum)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))



