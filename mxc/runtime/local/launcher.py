"""Start the training as a local subprocess in its own process group.

Why a process group: the entrypoint is a bash script that starts Python (and Python may
start helpers). Signalling only the bash pid would leave the trainer running; signalling
the group reaches every process the attempt started. When the group leader exits, the
leader is kept as a zombie (``waitid(..., WNOWAIT)``) until the group has been killed, so
its pid (which is also the group id) cannot be reused by an unrelated process meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path


class LocalProcess:
    """One attempt: the entrypoint and everything it started (a ``TrainingProcess``)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen
        self.pid: int | None = popen.pid
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        try:
            info = os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # already reaped elsewhere: the group can no longer be named safely
            self._code = self._popen.poll()
            return self._code
        if info is None:
            return None
        self._finish()
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        if self._code is not None:
            return self._code
        if timeout is None:
            os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOWAIT)
            self._finish()
        else:
            deadline = time.monotonic() + timeout
            while self.poll() is None:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(self._popen.args, timeout)
                time.sleep(0.05)
        assert self._code is not None
        return self._code

    def send_signal(self, signum: int) -> None:
        """Signal the whole process group (the entrypoint, Python, its helpers)."""
        if self._code is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, signum)

    def _finish(self) -> None:
        """The leader exited (still a zombie): kill stragglers in its group, then reap it."""
        self._kill_group()
        self._code = self._popen.wait()

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, signal.SIGKILL)


class LocalLauncher:
    """The default ``Launcher``: a subprocess of mxc, output appended to the run's log."""

    def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> LocalProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        return LocalProcess(popen)

    def close(self) -> None:
        """Nothing to release: each process is reaped by its own ``poll``/``wait``."""
