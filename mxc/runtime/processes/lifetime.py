"""Helpers that die with mxc: no exporter, Prometheus or Ray head outlives a killed supervisor.

``tied_to_caller(argv)`` prefixes a command with util-linux ``setpriv --pdeathsig TERM``: the
kernel sends the child SIGTERM when the *thread* that started it exits (``PR_SET_PDEATHSIG``),
which for mxc is the supervisor's (or the CLI's) main thread, alive for the whole run. Where
setpriv is missing the command runs unchanged and the normal stop path is the only one.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence


def tied_to_caller(argv: Sequence[str]) -> list[str]:
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else list(argv)
