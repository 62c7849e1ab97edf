"""All ranks meet before training: through files in the shared run directory.

Each rank that is ready creates ``<dir>/<rank>`` (atomically: a temporary name, then rename) and
waits until ``nprocs`` such files exist, or its deadline passes. Why files and not the JAX
coordinator: every rank already shares the run directory (events, checkpoints), the barrier
comes before any process listens on the coordinator port, and a file left behind says which
rank arrived when. On NFS a directory listing can lag a few seconds behind other clients'
creates (attribute caching): that delays the barrier, it cannot break it. A rank that fails
before the barrier ends the job by itself (``srun --kill-on-bad-exit``); one that is only slow
makes the others wait until the image stage's timeout, which then names it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Outcome:
    passed: bool
    waited_s: float
    missing: list[int]  # ranks that had not arrived (empty when passed)


def arrive(directory: Path, rank: int, node: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{rank}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"rank": rank, "node": node, "time": time.time()}) + "\n")
    os.replace(tmp, directory / str(rank))


def arrived(directory: Path) -> set[int]:
    try:
        return {int(name) for name in os.listdir(directory) if name.isdigit()}
    except OSError:
        return set()


def wait(directory: Path, rank: int, node: str, nprocs: int, deadline: float, poll_s: float = 0.2,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Arrive, then wait for every rank 0..nprocs-1, until the monotonic ``deadline``."""
    started = clock()
    arrive(directory, rank, node)
    while True:
        here = arrived(directory)
        missing = [r for r in range(nprocs) if r not in here]
        if not missing:
            return Outcome(True, clock() - started, [])
        if clock() >= deadline:
            return Outcome(False, clock() - started, missing)
        sleep(poll_s)
