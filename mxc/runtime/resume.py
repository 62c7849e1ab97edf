"""``mxc run --resume-from RUN[@STEP]``: a new run that starts from another run's checkpoint.

MaxText restores the newest checkpoint it finds in ``<base_output_directory>/<run_name>/checkpoints``
(the whole training state: parameters, optimizer, step), and every run has its own ``run_name``
(its run id). So the new run gets the chosen checkpoint *seeded* into its own checkpoint directory
before its first attempt: MaxText then continues at ``step + 1`` exactly as it does after an
automatic restart, with no change to the bundle or the node program, and the new run's own
checkpoints and restarts work as usual. Seeding hard-links the files (instant, no extra space;
orbax never rewrites a finished checkpoint) and copies where a link is impossible (another file
system); it fills a temporary directory that is renamed into place, so MaxText never finds half a
checkpoint. The source run is never written to, and removing it later (``mxc gc``) leaves the new
run's linked files in place.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mxc import tempdirs
from mxc.errors import UserError, cannot_write
from mxc.node import checkpoints
from mxc.node.contract import RunContract
from mxc.runtime import runpaths, runs
from mxc.runtime.rundir import RunDir
from mxc.runtime.runpaths import Roots


@dataclass(frozen=True)
class ResumePoint:
    """A finished checkpoint of an earlier run, what ``resumed_from`` records."""

    run: str
    step: int
    path: Path  # <checkpoints>/<step> of the source run

    def as_record(self) -> dict[str, Any]:
        return {"run": self.run, "step": self.step, "path": str(self.path)}


def parse(text: str) -> tuple[str, int | None]:
    """``RUN`` or ``RUN@STEP``."""
    ref, at, step = text.strip().rpartition("@") if "@" in text else (text.strip(), "", "")
    if not at:
        return ref, None
    if not ref or not step.isascii() or not step.isdigit():
        raise UserError(f"--resume-from '{text}': expected RUN or RUN@STEP (a step number)",
                        "mxc run --resume-from 20260101-120000-ab12-3f9a0c1d@20")
    return ref, int(step)


def find(home: Path, text: str) -> ResumePoint:
    """The checkpoint ``RUN[@STEP]`` names: the run's newest finished one when no step is given."""
    ref, step = parse(text)
    run = runs.find_run(home, ref)
    directory = _checkpoints_of(home, run)
    steps = checkpoints.finished_steps(directory)
    if not steps:
        raise UserError(f"run {run.run_id} has no finished checkpoint to resume from (in {directory})",
                        "a run checkpoints every checkpoint.period steps; that run's bundle may have it off")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise UserError(f"run {run.run_id} has no checkpoint at step {step}",
                        "its checkpoints: " + ", ".join(str(s) for s in steps))
    return ResumePoint(run.run_id, step, directory / str(step))


def _checkpoints_of(home: Path, run: RunDir) -> Path:
    """Where a run's checkpoints are, from its own location and its bundle's contract
    (``checkpoint.dir``), never from a path in its record (mxc/runtime/runpaths.py)."""
    paths = runpaths.of_run(run, runs.load(run), Roots.of(home).store())
    if os.path.lexists(paths.checkpoints) and not paths.holds(paths.checkpoints):
        raise UserError(f"run {run.run_id}: its checkpoint directory {paths.checkpoints} leads outside the run's trees",
                        "not reading checkpoints from there (docs/security.md#a-shared-runs-root)")
    return paths.checkpoints


def recorded(home: Path, run_id: str, resumed_from: dict[str, Any]) -> ResumePoint:
    """The checkpoint a resumed run started from (its record's ``resumed_from``), for ``mxc rerun``:
    the source run and step from the record, the place derived again from that run (the record's
    ``path`` is for people: a path in a record is not trusted); refused when it is no longer there,
    since the rerun would then start at step 0."""
    source, step, path = resumed_from.get("run"), resumed_from.get("step"), resumed_from.get("path")
    if not (isinstance(source, str) and type(step) is int and isinstance(path, str)):
        raise UserError(f"run {run_id}: its record's resumed_from is not {{run, step, path}}: {resumed_from!r:.200}")
    gone = UserError(f"run {run_id} started from run {source}'s checkpoint at step {step}, which is gone ({path})",
                     "a rerun cannot start where it did; start a new run: mxc run --resume-from RUN[@STEP]")
    try:
        directory = _checkpoints_of(home, runs.find_run(home, source)) / str(step)
    except UserError:
        raise gone from None
    if not checkpoints.is_finished(directory):
        raise gone
    return ResumePoint(source, step, directory)


def check_bundle(point: ResumePoint, contract: RunContract, bundle: str) -> None:
    """A bundle with checkpointing off would ignore the seeded checkpoint and start at step 0."""
    if not contract.checkpoint.period:
        raise UserError(f"bundle {bundle[:12]} has checkpointing off (checkpoint.period: 0): MaxText would not "
                        f"load run {point.run}'s checkpoint and would start at step 0",
                        "build it with checkpointing on: mxc build SPEC --set checkpoint.period=N")


def seed(point: ResumePoint, target: Path) -> str:
    """Put the checkpoint into ``target`` (the new run's checkpoint directory) as ``<step>``; says how
    (``linked`` or ``copied``)."""
    copied: list[bool] = []

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
            copied.append(True)

    try:
        target.mkdir(parents=True, exist_ok=True)
        staging = tempdirs.make(target.parent)
        try:
            shutil.copytree(point.path, staging / "step", symlinks=True, copy_function=link_or_copy)
            os.rename(staging / "step", target / str(point.step))
        finally:
            tempdirs.remove(staging)
    except OSError as exc:
        raise cannot_write(f"checkpoint {point.step} of run {point.run} into {target}", exc) from None
    return "copied" if copied else "linked"
