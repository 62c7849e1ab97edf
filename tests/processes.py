"""Finding a run's processes in /proc: every process mxc starts for a run inherits MXC_RUN_DIR."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mxc.runtime.processes.procfs import ProcessId

TRAINER = "maxtext.trainers.pre_train.train"


def _live_with(marker: bytes) -> list[tuple[int, str, list[bytes]]]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker in environ and state != "Z":
            out.append((int(entry.name), cmdline, environ))
    return out


def run_processes(run_dir: Path) -> list[tuple[int, str]]:
    """(pid, command line) of every live process started for the run in ``run_dir``."""
    return [(pid, cmdline) for pid, cmdline, _ in _live_with(f"MXC_RUN_DIR={run_dir}".encode())]


def trainer_pids(run_dir: Path, rank: int | None = None) -> list[int]:
    """MaxText's own Python processes of the run (of one Slurm rank if ``rank`` is given): ``python -m
    maxtext...``, not the stages (timeout, bash) or the Ray wrapper that carry it in their arguments."""
    return [pid for pid, cmdline, environ in _live_with(f"MXC_RUN_DIR={run_dir}".encode())
            if cmdline.split()[1:3] == ["-m", TRAINER] and (rank is None or f"SLURM_PROCID={rank}".encode() in environ)]


def dead_identity() -> ProcessId:
    """The identity of a process that ran and is gone (a supervisor that died, for records)."""
    proc = subprocess.Popen(["sleep", "60"])
    identity = ProcessId.capture(proc.pid)
    proc.kill()
    proc.wait()
    assert identity is not None and not identity.is_alive()
    return identity


def stand_ins(directory: Path, scripts: dict[str, str]) -> Path:
    """``directory/bin`` holding executable stand-ins (name -> script text) for a PATH of their own."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir
