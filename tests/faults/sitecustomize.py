"""Test-only fault injection for real MaxText trainings: pause at a known step.

Tests that break a training mid-run (kill it, stop it, signal it, requeue its Slurm job) must act
while the training is at a known point, not race a training that may finish first on a fast or
loaded machine. With this directory on PYTHONPATH and ``MXCTEST_PAUSE=DIR:STEP@ATTEMPT[,STEP@ATTEMPT...]``
in the environment, a MaxText trainer that logs ``completed step: STEP`` in attempt ATTEMPT
(``MXC_ATTEMPT``, default 0) writes ``DIR/paused.attempt-A.rank-R`` (its pid) and waits until
``DIR/release.attempt-A`` exists. The wait is in the main thread, in Python: a signal sent to the
process meanwhile lands where a test expects it (faulthandler prints this frame; signal handlers
run). It waits in ``handle``, not ``emit``: ``Handler.handle`` holds the handler's lock around
``emit``, and every other thread that logs (orbax's asynchronous checkpoint commit) would block on
it, so a checkpoint could never finish while the trainer waits. Inert otherwise, and in every
process but MaxText's (it reacts only to MaxText's step line). tests/gates.py is the test side.
"""

from __future__ import annotations

import logging
import os
import re
import time

_STEP = re.compile(r"completed step: (\d+),")


class _PauseAtStep(logging.Handler):
    def __init__(self, directory: str, steps: dict[int, int]) -> None:
        super().__init__(logging.INFO)
        self.directory, self.steps = directory, steps
        self.attempt = int(os.environ.get("MXC_ATTEMPT", "0"))
        self.done = False

    def emit(self, record: logging.LogRecord) -> None:
        """Unused: ``handle`` below decides without the handler's lock."""

    def handle(self, record: logging.LogRecord) -> bool:
        step = self.steps.get(self.attempt)
        if self.done or step is None:
            return True
        try:
            match = _STEP.search(record.getMessage())
        except Exception:
            return True
        if not match or int(match[1]) != step:
            return True
        self.done = True
        rank = os.environ.get("SLURM_PROCID", "0")
        marker = os.path.join(self.directory, f"paused.attempt-{self.attempt}.rank-{rank}")
        with open(marker + ".tmp", "w") as fh:
            fh.write(f"{os.getpid()}\n")
        os.replace(marker + ".tmp", marker)
        release = os.path.join(self.directory, f"release.attempt-{self.attempt}")
        while not os.path.exists(release):
            time.sleep(0.05)
        return True


def _install() -> None:
    setting = os.environ.get("MXCTEST_PAUSE")
    if not setting:
        return
    directory, _, points = setting.rpartition(":")
    steps = {}
    for point in points.split(","):
        step, _, attempt = point.partition("@")
        steps[int(attempt or 0)] = int(step)
    logging.getLogger().addHandler(_PauseAtStep(directory, steps))


_install()
