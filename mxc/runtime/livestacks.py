"""``mxc stacks``: one dump of every rank's stacks of a live run, into ``<run>/stacks/<UTC time>/``.

The reading itself is the node program's (mxc/node/livestacks.py): py-spy only, so the training
goes on undisturbed. This side decides whether the run is live and where its trainers are:

* local: the supervisor that writes the record still runs (its recorded identity, as ``mxc cancel``
  and ``mxc logs -f`` check it); the node program's code then runs here, in this process;
* Slurm: the job runs; ``srun --jobid=JOB --overlap`` starts the bundle's node program once per
  node (``mxc_node stacks``), each writes its node's files into the shared run directory.

The files go into a hidden directory first and appear under their time stamp complete, with
``index.json`` listing every file, rank, node, pid and how it was read.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mxc import fsutil
from mxc.errors import UserError
from mxc.node import livestacks as node_stacks
from mxc.node.stacks import PY_SPY_ENV, find_py_spy
from mxc.runtime import runs
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir

INDEX = "index.json"
SRUN_TIMEOUT_S = 600.0  # py-spy may take 2 x 60 s per process that does not answer (node/stacks.PYSPY_TIMEOUT)


@dataclass(frozen=True)
class Dump:
    run_id: str
    directory: Path
    entries: list[dict[str, Any]]  # rank, node, attempt, pid, file (in directory), method, ok
    problems: list[str]  # what is missing: nodes that did not answer

    @property
    def ok(self) -> bool:
        return not self.problems and all(e.get("ok") for e in self.entries)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "directory": str(self.directory), "index": str(self.directory / INDEX),
                "dumps": [{**e, "file": str(self.directory / e["file"])} for e in self.entries],
                "problems": self.problems}


def saved_hang_stacks(run: RunDir) -> list[Path]:
    """Stacks a hang (or a fatal signal) already saved, for the message about a run that is not live."""
    if not run.stacks.is_dir():
        return []
    return sorted(p for p in run.stacks.iterdir() if p.is_file() and p.name.startswith(("hang.", "crash.", "native.")))


def not_live(run: RunDir, status: str) -> UserError:
    saved = saved_hang_stacks(run)
    hint = (f"stacks saved when it hung or crashed: {run.stacks}/ ({len(saved)} file(s), e.g. {saved[0].name})"
            if saved else "stacks are read from a running training only")
    return UserError(f"run {run.run_id} is not live ({status}): there is no training to read stacks from", hint)


def take(run: RunDir, bundle_dir: Path | None, nodes: int) -> Dump:
    """Dump the live run's stacks (see the module docstring); UserError (exit 2) when it is not live."""
    record = runs.current(run)
    if record.backend == "local":
        _require_live_local(run, record)
    elif record.backend == "slurm":
        job_id = _require_live_job(run, record)
        if bundle_dir is None:
            raise UserError(f"run {run.run_id}: its bundle {record.bundle[:12]} is not in the store",
                            "the node program that reads the stacks ships in the bundle")
    else:
        raise UserError(f"run {run.run_id}: `mxc stacks` knows local and Slurm runs, not {record.backend}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"
    final = run.stacks / stamp
    tmp = run.stacks / f".{stamp}.{os.getpid()}.tmp"
    tmp.mkdir(parents=True)
    problems: list[str] = []
    try:
        if record.backend == "local":
            entries = node_stacks.dump_node(run.path, tmp)
        else:
            assert bundle_dir is not None
            entries = _dump_job(run, tmp, job_id, bundle_dir, nodes, problems)
        if not entries:
            raise UserError(f"run {run.run_id} is live but no trainer process runs now (it is starting, or between "
                            "attempts)", "try again in a moment", code=1)
        index: dict[str, Any] = {"run_id": run.run_id, "time": stamp, "backend": record.backend, "dumps": entries,
                                 "problems": problems}
        if record.backend == "slurm":
            index["job_id"] = job_id
        (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        if final.exists():  # another dump in the same millisecond
            final = final.with_name(f"{stamp}-{os.getpid()}")
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Dump(run.run_id, final, entries, problems)


def _require_live_local(run: RunDir, record: RunRecord) -> None:
    if record.final:
        raise not_live(run, record.status)
    alive = runs.supervisor_alive(record)
    if alive is False:
        raise not_live(run, "lost: its supervisor is gone")
    if alive is None:
        host = (record.supervisor or {}).get("host", "another machine")
        raise UserError(f"run {run.run_id} runs on {host}, or its record names no process to check",
                        f"run `mxc stacks {run.run_id}` on {host}")


def _require_live_job(run: RunDir, record: RunRecord) -> str:
    job_id = (record.slurm.job_id if record.slurm else None) or ""
    if record.final or record.status != "running" or not job_id:
        raise not_live(run, record.status)
    return job_id


def _dump_job(run: RunDir, out_dir: Path, job_id: str, bundle_dir: Path, nodes: int,
              problems: list[str]) -> list[dict[str, Any]]:
    """Every node of the job dumps its trainers into ``out_dir`` (shared file system); their lists, merged.
    Nodes that did not answer are added to ``problems`` (what the others wrote is kept)."""
    if shutil.which("srun") is None:
        raise UserError("srun is not on PATH", "run `mxc stacks` where Slurm's commands are (the login node)", code=1)
    python = os.environ.get("MXC_NODE_PYTHON") or "python3"  # as job.sbatch and entrypoint.sh run the node program
    argv = ["srun", f"--jobid={job_id}", "--overlap", "--ntasks-per-node=1", f"--nodes={nodes}", f"--ntasks={nodes}",
            "--export=ALL", python, "-E", "-s", "-B", str(bundle_dir / "mxc_node" / "__main__.py"), "stacks",
            str(run.path), str(out_dir)]
    # this command's own py-spy, for nodes where neither the node program's interpreter nor PATH has one
    py_spy = find_py_spy()
    env = {**os.environ, **({PY_SPY_ENV: py_spy} if py_spy else {})}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=SRUN_TIMEOUT_S,
                              check=False, env=env)
    except subprocess.TimeoutExpired:
        raise UserError(f"srun on job {job_id}'s nodes did not finish within {SRUN_TIMEOUT_S:.0f}s", code=1) from None
    lists = sorted(out_dir.glob("node-*.json"))
    said = " ".join(done.stderr.split())[-400:] or f"exit {done.returncode}"
    if done.returncode != 0 and not lists:
        raise UserError(f"srun --jobid={job_id} --overlap could not run on the job's nodes: {said}", code=1)
    if done.returncode != 0 or len(lists) < nodes:
        problems.append(f"{len(lists)} of {nodes} node(s) answered (srun: {said})")
    entries: list[dict[str, Any]] = []
    for path in lists:
        try:
            data = fsutil.loads(fsutil.read_bounded(path))
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: unreadable ({exc})")
            data = []
        shaped = [e for e in data if _well_shaped(e)] if isinstance(data, list) else []
        if isinstance(data, list) and len(shaped) < len(data):
            problems.append(f"{path.name}: {len(data) - len(shaped)} entr(ies) not of the node program's shape, skipped")
        entries.extend(shaped)
        path.unlink()
    return sorted(entries, key=lambda e: (e["rank"], e["pid"]))


def _well_shaped(entry: Any) -> bool:
    """An entry as the node program writes it: integer rank and pid, a plain file name in the dump
    directory (a node file is written by another machine: never trusted to name a path)."""
    return (isinstance(entry, dict) and type(entry.get("rank")) is int and type(entry.get("pid")) is int
            and isinstance(entry.get("file"), str) and entry["file"] == os.path.basename(entry["file"])
            and entry["file"] not in ("", ".", ".."))
