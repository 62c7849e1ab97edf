"""Where everything of a run is: the one owner of run paths.

Every path mxc reads, writes, serves or removes for a run comes from here, derived from two things
mxc can trust: where the run directory is (``Roots``: the runs root of this mxc's home, a directory
named like a run id) and its bundle's contract (``run.json``, read through the bundle's hash). The
local and Slurm backends record what they start from it, and ``mxc watch``, ``gc``/``rm``,
``--resume-from``, ``dashboard``, the TensorBoard plugin, ``report`` and ``compare`` read from it.

Nothing in ``record.json`` is a path to mxc: the record is a file in a directory that a shared runs
root lets others write (docs/security.md#a-shared-runs-root). Its ``tensorboard`` field says where
the events are for people and other tools; mxc itself derives the place again.

The trees of a run: its run directory ``<runs root>/<run-id>``, and MaxText's output directory
``<base_output_directory>/<run-id>`` (checkpoints, TensorBoard), which is inside the run directory
unless the spec sets ``checkpoint.dir``; then it is ``<checkpoint.dir>/<run-id>``, removed with the
run only while it really is that directory (not a link out of it).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mxc.node import layout
from mxc.node.contract import RunContract
from mxc.runtime.rundir import RunDir, is_run_id

if TYPE_CHECKING:
    from mxc.runtime.record import RunRecord
    from mxc.store import Store

RUNS_DIR_VARIABLE = "MXC_RUNS_DIR"
IMAGE_CACHE_VARIABLE = "MXC_IMAGE_CACHE"


def runs_root(home: Path) -> Path:
    """Where run directories (and, by default, their checkpoints) live: ``$MXC_RUNS_DIR``, else
    ``$MXC_HOME/runs``. A cluster's home is small and slow; ``MXC_RUNS_DIR=$SCRATCH/mxc-runs`` moves
    every run (logs, metrics, checkpoints) there while bundles and records of builds stay in the home.
    Made absolute here: the path is handed to the node program, which runs from another directory."""
    configured = os.environ.get(RUNS_DIR_VARIABLE)
    if configured:
        return Path(os.path.abspath(os.path.expanduser(configured)))
    return home / "runs"


@dataclass(frozen=True)
class Roots:
    """The places of one mxc home: the store (bundles, code exports), the runs root, the image cache.
    Derived from the environment of the mxc command that acts (``MXC_HOME``, ``MXC_RUNS_DIR``,
    ``MXC_IMAGE_CACHE``), never from a run's directory or record."""

    home: Path
    runs: Path
    images: Path

    @classmethod
    def of(cls, home: Path) -> Roots:
        configured = os.environ.get(IMAGE_CACHE_VARIABLE)
        return cls(home, runs_root(home), Path(configured) if configured else home / "images")

    @classmethod
    def current(cls) -> Roots:
        from mxc.fsutil import mxc_home

        return cls.of(mxc_home())

    @property
    def bundles(self) -> Path:
        return self.home / "bundles"

    @property
    def code(self) -> Path:
        return self.home / "code"

    @property
    def jax_cache(self) -> Path:
        """JAX's compilation cache shared by runs: ``$MXC_JAX_CACHE``, else ``$MXC_HOME/cache/jax``."""
        return Path(os.environ.get("MXC_JAX_CACHE") or self.home / "cache" / "jax")

    def store(self) -> Store:
        from mxc.store import Store

        return Store(self.home)

    def run(self, run_id: str) -> RunDir:
        """The run directory of ``run_id`` (a run id, checked: never a path out of the runs root)."""
        if not is_run_id(run_id):
            raise ValueError(f"{run_id[:80]!r} is not a run id")
        return RunDir(self.runs / run_id)

    def image_cache_env(self) -> dict[str, str]:
        """``MXC_IMAGE_CACHE`` for the node program when runs live outside ``$MXC_HOME``
        (``MXC_RUNS_DIR``): it otherwise finds the cache beside the runs directory
        (``mxc/node/layout.py``), which is ``$MXC_HOME/images`` only when runs are in ``$MXC_HOME/runs``."""
        if os.environ.get(IMAGE_CACHE_VARIABLE) or self.runs == self.home / "runs":
            return {}
        return {IMAGE_CACHE_VARIABLE: str(self.images)}


@dataclass(frozen=True)
class RunPaths:
    """One run's trees: its directory and MaxText's output (checkpoints, TensorBoard) under
    ``checkpoint.dir`` when its contract sets one (``configured``), else inside the run directory."""

    run: RunDir
    configured: Path | None = None  # the contract's checkpoint.dir

    @property
    def output(self) -> Path:
        """MaxText's ``base_output_directory``."""
        return layout.output(self.run.path, str(self.configured) if self.configured else None)

    @property
    def tree(self) -> Path:
        """What MaxText writes for this run: ``<output>/<run-id>`` (``run_name`` is the run id)."""
        return self.output / self.run.run_id

    @property
    def checkpoints(self) -> Path:
        return layout.checkpoints(self.run.path, str(self.configured) if self.configured else None)

    @property
    def tensorboard(self) -> Path:
        """MaxText's event files: ``<tree>/tensorboard/<run_name>``."""
        return self.tree / "tensorboard" / self.run.run_id

    def holds(self, path: Path) -> bool:
        """Whether ``path``, links resolved, stays in the run's own trees: its run directory, or its
        output tree right under ``checkpoint.dir`` (what mxc may read checkpoints from or serve)."""
        if inside(path, self.run.path):
            return True
        return self.configured is not None and confined(self.tree, self.configured) and inside(path, self.tree)

    def outside(self) -> list[Path]:
        """The run's trees outside its run directory that removing the run removes too: its output
        tree under ``checkpoint.dir``, when it is a real directory (not a link) right there."""
        if self.configured is None or inside(self.tree, self.run.path):
            return []
        return [self.tree] if confined(self.tree, self.configured) else []


def for_contract(run: RunDir, contract: RunContract | None) -> RunPaths:
    """The paths of a run of this contract (None: a run whose bundle is gone, the default layout)."""
    configured = contract.checkpoint.dir if contract is not None else None
    return RunPaths(run, Path(configured) if configured else None)


def of_run(run: RunDir, record: RunRecord, store: Store) -> RunPaths:
    """A recorded run's paths, from the contract of the bundle it ran (its own copy, else the
    store's; each read through the record's bundle hash)."""
    from mxc.runtime import kept_bundle

    return for_contract(run, kept_bundle.contract_of(run, record, store))


def inside(path: Path, parent: Path) -> bool:
    """Whether ``path`` resolves to ``parent`` or below it (links followed)."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(parent))
    except ValueError:
        return False
    return True


def confined(path: Path, parent: Path) -> bool:
    """Whether ``path`` is a real directory (not a link) whose place, links resolved, is exactly
    ``parent``/its name: what mxc may remove as a run's tree under a directory the contract names."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    return Path(os.path.realpath(path)) == Path(os.path.realpath(parent)) / path.name


def real_run_dir(path: Path) -> bool:
    """A run directory: named like a run id, a directory itself (never a link to one elsewhere)."""
    if not is_run_id(path.name):
        return False
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
