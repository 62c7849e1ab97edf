"""A local run's processes die with its supervisor, even when the supervisor is SIGKILLed.

SIGKILL gives ``mxc run`` no chance to stop the training it started (a process group in its
own session) or anything else, so one small process watches it from outside: the
supervisor starts ``python -m mxc.runtime.local.deathwatch RUN_DIR`` with a pipe on its
stdin and keeps the only write end. The kernel closes that pipe whichever way the
supervisor ends; at a normal end the supervisor first writes ``done``. End of file without
``done`` means the supervisor died: the watch ends every process of the run
(``leftovers.end_run``: found by ``MXC_RUN_DIR`` in their environment, signalled by verified
identity), removes the run's scratch directories and says so in the run's log. The record
stays as the supervisor left it; ``mxc runs`` shows the run as ``lost`` and ``mxc cancel``
closes it.

No race: the pipe exists before the watch starts, so a supervisor dying at any moment
(even before the watch has read a byte) is seen. The watch runs in its own session, so a
Ctrl-C or a SIGKILL to the terminal's process group does not take it down with the rest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

DONE = b"done\n"


class DeathWatch:
    """The supervisor's end of the watch."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

    @classmethod
    def start(cls, run_dir: Path) -> DeathWatch:
        # Without MXC_RUN_DIR: the watch must not count itself among the run's processes.
        env = {k: v for k, v in os.environ.items() if k != "MXC_RUN_DIR"}
        process = subprocess.Popen([sys.executable, "-m", "mxc.runtime.local.deathwatch", str(run_dir)],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
        return cls(process)

    def release(self) -> None:
        """The run ended normally: the watch exits without touching anything."""
        stdin = self._process.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.write(DONE)
            with contextlib.suppress(OSError):
                stdin.close()
        try:
            self._process.wait(30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _log_line(run_dir: Path, text: str) -> None:
    with contextlib.suppress(OSError), open(run_dir / "train.log", "a", encoding="utf-8") as fh:
        fh.write(text + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m mxc.runtime.local.deathwatch RUN_DIR (stdin: a pipe from the supervisor)",
              file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe decides
    received = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(0, 64):
            received += chunk
    if received.startswith(DONE):
        return 0
    from mxc.runtime.processes.leftovers import end_run  # only now: a normal run never pays for the import

    cleanup = end_run(run_dir)
    _log_line(run_dir, f"[mxc] the supervisor (mxc run) died without ending the run: {cleanup.describe()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
