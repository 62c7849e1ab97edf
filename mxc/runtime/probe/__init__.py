"""--probe, the I/O half: run mxc/runtime/probe/worker.py once with the training interpreter.

The worker is a plain script (no mxc import), so ``--probe-python`` may point at any venv
that has the jaxlib and maxtext a spec pins; by default it is the interpreter running mxc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from mxc.errors import UserError

WORKER = Path(__file__).with_name("worker.py")


def default_workers() -> int:
    """Parallel MaxText validations: the CPUs this process may use (pyconfig is CPU-bound)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_probe(request: dict[str, Any], python: str | None = None, workers: int | None = None,
              timeout: float = 900) -> dict[str, Any]:
    """Ask jaxlib and MaxText; returns the worker's answer plus ``wall_seconds``."""
    interpreter = python or sys.executable
    if not (shutil.which(interpreter) or Path(interpreter).is_file()):
        raise UserError(f"--probe-python {interpreter}: no such interpreter")
    outdir = tempfile.mkdtemp(prefix="mxc-probe-")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    payload = json.dumps({**request, "outdir": outdir, "workers": workers or default_workers()})
    t0 = time.monotonic()
    try:
        proc = subprocess.run([interpreter, str(WORKER)], input=payload, capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"--probe took longer than {timeout:.0f} s") from None
    finally:
        shutil.rmtree(outdir, ignore_errors=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = proc.stderr.strip().splitlines()[-5:]
        raise UserError(f"--probe failed with {interpreter} (exit {proc.returncode}): {' | '.join(tail)}",
                        "the probe needs jax and maxtext installed for that interpreter (pip install -e .[train])")
    answer: dict[str, Any] = json.loads(proc.stdout)
    answer["wall_seconds"] = round(time.monotonic() - t0, 3)
    return answer
