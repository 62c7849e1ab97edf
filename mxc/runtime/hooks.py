"""Extension points of a run, so observability (issue 4/7) and alerts plug in without the
supervisor knowing about them.

* ``Launcher`` starts the training process. The default runs it as a local subprocess; the
  Ray launcher runs it as a subprocess of a Ray actor. Either way the supervisor sees a
  ``TrainingProcess`` it can wait on and signal.
* ``RunObserver`` is told about the run's life: start, each attempt, each exit, the end.
  Observers must never fail the run: the supervisor logs and ignores their exceptions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir


class TrainingProcess(Protocol):
    pid: int | None

    def poll(self) -> int | None:
        """The exit code (negative: killed by that signal) or None while running."""

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, signum: int) -> None:
        """Deliver to the training process and everything it started."""


class Launcher(Protocol):
    def start(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
    ) -> TrainingProcess: ...

    def close(self) -> None: ...


class RunObserver(Protocol):
    def on_start(self, run: RunDir, record: RunRecord) -> None: ...

    def on_attempt(self, run: RunDir, record: RunRecord, process: TrainingProcess) -> None: ...

    def on_attempt_end(self, run: RunDir, record: RunRecord, exit_code: int) -> None: ...

    def on_end(self, run: RunDir, record: RunRecord) -> None: ...
