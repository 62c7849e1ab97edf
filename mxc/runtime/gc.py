"""What ``mxc gc`` and ``mxc rm`` may remove, and removing it so that nothing is left half-gone.

The store, runs, code exports and image cache grow without bound; this module decides what can
go under a policy (age, run status, keep the last N) and removes it. What it never removes:

- a live run: a record that is not final, unless its local supervisor is verifiably gone (the
  same identity check ``mxc runs`` uses to show ``lost``) and no process of the run is left;
  a Slurm run that is not final counts as live (``mxc watch`` or ``mxc cancel`` closes it first);
- a bundle a live run uses, judged from every run directory's name as well as its record, so a
  run whose record cannot be read (or is being written) still protects its bundle;
- a bundle, code export or image a kept run or bundle uses, unless asked (``used_bundles``);
- anything of a run another user owns (its directory or record: ``runs.other_owner``), nor any path
  but those the one owner of run paths derives (mxc/runtime/runpaths.py): the run directory in the
  runs root, its output tree right under the ``checkpoint.dir`` of its bundle's contract, entries
  of the store and the image cache. Nothing in a record is taken as a path.

A run removed keeps nothing alive: the bundle it ran is also in its directory (``kept_bundle``), so
removing a bundle from the store never orphans a kept run (``rerun`` puts it back from the run's copy).

Removal first renames the item into a temporary directory beside it (``mxc.tempdirs``), so a
reader sees the whole item or nothing, then deletes the tree, restoring write permission on the
read-only directories of bundles and code exports first (a plain ``rm -rf`` by their owner fails
on them). A removal cut short leaves a temporary directory that the next ``gc`` (or build) sweeps.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mxc import tempdirs
from mxc.runtime import runpaths
from mxc.runtime import runs as runs_mod
from mxc.runtime.processes.procfs import processes_with_env
from mxc.runtime.record import FINISHED, epoch_seconds
from mxc.runtime.rundir import RunDir
from mxc.runtime.runpaths import Roots

RUN_STATUSES = (*sorted(FINISHED), "lost", "unreadable")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` in seconds; ValueError otherwise."""
    match = _DURATION.match(text.strip().lower())
    if not match:
        raise ValueError(f"'{text}' is not an age (a number and a unit: 30d, 12h, 90m, 2w, 45s)")
    return float(match[1]) * _UNIT_SECONDS[match[2]]


@dataclass(frozen=True)
class Policy:
    """What ``mxc gc`` is asked to remove. Runs are chosen by every given filter together;
    bundles, code exports and images only when an age or ``keep_last`` is given."""

    older_than_s: float | None = None
    statuses: frozenset[str] | None = None  # None: every finished status (and lost)
    keep_last: int | None = None
    used_bundles: bool = False  # also bundles (and their code, images) that kept runs used

    @property
    def touches_artifacts(self) -> bool:
        return self.older_than_s is not None or self.keep_last is not None


@dataclass
class RunState:
    """One run directory as gc sees it."""

    run: RunDir
    status: str  # the record's status, "lost", or "unreadable"
    live: bool
    when: float  # end (else start, else the directory's mtime), epoch seconds
    bundle: str | None
    commit: str | None
    outside: list[Path] = field(default_factory=list)  # its output tree under checkpoint.dir (runpaths.RunPaths)
    owner: int | None = None  # another user who owns it (its directory or record): never acted on

    @property
    def paths(self) -> tuple[Path, ...]:
        """Everything removing the run removes."""
        return (self.run.path, *self.outside)


@dataclass(frozen=True)
class Item:
    kind: str  # run | bundle | code | image
    name: str
    paths: tuple[Path, ...]
    when: float
    why: str
    size: int

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "paths": [str(p) for p in self.paths],
                "last_used": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.when)), "why": self.why,
                "bytes": self.size}


def mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def run_state(run: RunDir, roots: Roots) -> RunState:
    """A run's status, liveness and trees from its record and its bundle's contract, without asking
    a scheduler (a read)."""
    when = mtime(run.path)
    owner = runs_mod.other_owner(run)
    try:
        record = runs_mod.read_record(run)
    except (OSError, ValueError):
        return RunState(run, "unreadable", False, when, None, None, owner=owner)
    when = epoch_seconds(record.ended) or epoch_seconds(record.started) or when
    commit = record.code.get("commit") if isinstance(record.code, dict) else None
    state = RunState(run, record.status, False, when, record.bundle, commit if isinstance(commit, str) else None,
                     owner=owner)
    state.outside = runpaths.of_run(run, record, roots.store()).outside()
    if record.final:
        return state
    if record.backend == "local" and runs_mod.supervisor_alive(record) is False:
        state.status = "lost"
        state.live = bool(processes_with_env("MXC_RUN_DIR", str(run.path)))  # leftovers: `mxc cancel` first
    else:
        state.live = True
    return state


def protected_bundle(bundle: str, states: Iterable[RunState]) -> RunState | None:
    """A live (or unreadable) run that uses ``bundle``: by its record, or by its id's bundle suffix."""
    for s in states:
        if (s.live or s.status == "unreadable") and (s.bundle == bundle or s.run.run_id.endswith("-" + bundle[:8])):
            return s
    return None


def size_of(paths: Iterable[Path]) -> int:
    """Bytes that removing ``paths`` frees: a file's size counts once, and only when every hard link
    to it is among them (a checkpoint seeded into another run by ``--resume-from`` shares its files)."""
    seen: dict[tuple[int, int], int] = {}
    sizes: dict[tuple[int, int], tuple[int, int]] = {}
    for top in paths:
        for entry in _walk(top):
            key = (entry.st_dev, entry.st_ino)
            seen[key] = seen.get(key, 0) + 1
            sizes[key] = (entry.st_size, entry.st_nlink)
    return sum(size for key, (size, links) in sizes.items() if seen[key] >= links)


def _walk(top: Path) -> Iterable[os.stat_result]:
    try:
        info = os.lstat(top)
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode):
        if stat.S_ISREG(info.st_mode):
            yield info
        return
    for dirpath, dirnames, filenames in os.walk(top):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            with contextlib.suppress(OSError):
                entry = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(entry.st_mode):
                    yield entry


@dataclass
class Inventory:
    """Everything in ``$MXC_HOME`` (and the runs root) that gc knows how to judge."""

    roots: Roots
    runs: list[RunState]
    bundles: dict[str, float]  # hash -> last use (built or last run started)
    bundle_pins: dict[str, tuple[str | None, str | None]]  # hash -> (code commit, image digest or .sif name)
    code: dict[str, float]  # commit -> export time
    images: dict[str, float]  # file name in the image cache -> mtime

    @classmethod
    def scan(cls, roots: Roots) -> Inventory:
        states = [run_state(r, roots) for r in runs_mod.all_runs(roots.home)]
        store = roots.store()
        bundles = {h: mtime(store.bundles / h) for h in store.hashes()}
        for s in states:
            if s.bundle in bundles:
                bundles[s.bundle] = max(bundles[s.bundle], s.when)
        pins = {h: _pins(store.bundles / h) for h in bundles}
        code = {p.name: mtime(p) for p in _entries(roots.code) if _COMMIT.match(p.name) and p.is_dir()}
        images = {p.name: mtime(p) for p in _entries(roots.images)
                  if p.name.endswith(".sif") and not p.name.startswith(".") and p.is_file()}
        return cls(roots, states, bundles, pins, code, images)

    @property
    def others(self) -> list[RunState]:
        """Runs another user owns: listed by ``mxc runs``, never removed."""
        return [s for s in self.runs if s.owner is not None]


def _entries(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError:
        return []


def _pins(bundle_dir: Path) -> tuple[str | None, str | None]:
    """The code commit and container image a bundle names (from its run.json; a damaged bundle names none)."""
    from mxc.node import contract, integrity

    try:
        c = contract.load(bundle_dir) if not integrity.check(bundle_dir, bundle_dir.name) else None
    except Exception:  # a damaged or foreign bundle: gc judges it by age alone
        c = None
    if c is None:
        return None, None
    digest = (c.container.image_digest or "").split(":", 1)[-1]  # the cache names a pulled image <digest>.sif
    image = digest or (Path(c.container.image_ref).name if c.container.image_ref else None)
    return (c.code.commit if c.code.repo else None), image


def plan(inv: Inventory, policy: Policy, now: float) -> list[Item]:
    """What ``policy`` removes from ``inv``: runs first, then what no kept run or bundle uses."""
    cutoff = now - policy.older_than_s if policy.older_than_s is not None else None
    wanted = policy.statuses if policy.statuses is not None else frozenset(RUN_STATUSES) - {"unreadable"}
    matching = [s for s in inv.runs if s.status in wanted and not s.live and s.owner is None]
    keep = {s.run.run_id for s in sorted(matching, key=lambda s: s.run.run_id)[-policy.keep_last:]} \
        if policy.keep_last else set()
    items: list[Item] = []
    gone: set[str] = set()
    for s in matching:
        if s.run.run_id in keep or (cutoff is not None and s.when >= cutoff):
            continue
        gone.add(s.run.run_id)
        why = s.status + (f", ended {_ago(now - s.when)} ago" if cutoff is not None else "")
        items.append(Item("run", s.run.run_id, s.paths, s.when, why, size_of(s.paths)))
    if not policy.touches_artifacts:
        return items
    kept_runs = [s for s in inv.runs if s.run.run_id not in gone]
    used = {s.bundle for s in kept_runs if s.bundle} if not policy.used_bundles else set()
    newest = set(sorted(inv.bundles, key=lambda h: inv.bundles[h])[-policy.keep_last:]) if policy.keep_last else set()
    removed_bundles: set[str] = set()
    for digest, when in sorted(inv.bundles.items()):
        if digest in used or digest in newest or protected_bundle(digest, kept_runs) is not None:
            continue
        if cutoff is not None and when >= cutoff:
            continue
        removed_bundles.add(digest)
        path = inv.roots.bundles / digest
        why = "no kept run uses it" if not policy.used_bundles else "unused by live runs"
        items.append(Item("bundle", digest, (path,), when, f"{why}, last used {_ago(now - when)} ago",
                          size_of([path])))
    kept_pins = [pin for h, pin in inv.bundle_pins.items() if h not in removed_bundles]
    kept_commits = {c for c, _ in kept_pins if c} | {s.commit for s in kept_runs if s.commit and not policy.used_bundles}
    kept_commits |= {s.commit for s in inv.runs if s.live and s.commit}
    for commit, when in sorted(inv.code.items()):
        if commit in kept_commits or (cutoff is not None and when >= cutoff):
            continue
        path = inv.roots.code / commit
        items.append(Item("code", commit, (path,), when, f"no kept bundle pins it, exported {_ago(now - when)} ago",
                          size_of([path])))
    kept_images = {img for _, img in kept_pins if img}
    for name, when in sorted(inv.images.items()):
        if any(img in name for img in kept_images) or (cutoff is not None and when >= cutoff):
            continue
        path = inv.roots.images / name
        items.append(Item("image", name, (path,), when, f"no kept bundle uses it, fetched {_ago(now - when)} ago",
                          size_of([path])))
    return items


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def still_removable(item: Item, roots: Roots) -> str | None:
    """Checked again just before removing (a run may have started since the plan, a path may have
    been swapped for a link): why not, or None. Every path must be one the roots and the run's own
    paths give now; anything else is refused."""
    if item.kind == "run":
        run = RunDir(roots.runs / item.name)
        if not runpaths.real_run_dir(run.path):
            return f"run {item.name}: not a run directory in {roots.runs}"
        state = run_state(run, roots)
        if state.owner is not None:
            return f"run {item.name} belongs to {runs_mod.user_name(state.owner)}"
        if state.live:
            return f"run {item.name} is live now"
        expected: tuple[Path, ...] = state.paths
    elif item.kind == "bundle":
        live = protected_bundle(item.name, [run_state(r, roots) for r in runs_mod.all_runs(roots.home)])
        if live:
            return f"bundle {item.name[:12]} is in use by live run {live.run.run_id}"
        expected = (roots.bundles / item.name,)
    else:
        expected = ((roots.code if item.kind == "code" else roots.images) / item.name,)
    if item.paths != expected:
        listed = ", ".join(str(p) for p in item.paths if p not in expected)
        return f"{item.kind} {item.name}: not removing {listed or 'its paths'}: not where mxc puts it now"
    return None


def remove(item: Item) -> None:
    """Remove an item's paths (each one ``still_removable`` allowed): renamed aside first (gone as
    a whole), then deleted."""
    for path in item.paths:
        if item.kind == "image":
            _remove_image(path)
        elif os.path.lexists(path):
            tempdirs.discard(path)


def _remove_image(path: Path) -> None:
    """An image file, unless a node is fetching it right now (its ``.lock`` is held)."""
    lock = path.with_name(path.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        path.unlink(missing_ok=True)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(f"{path.name} is being fetched (its lock is held); try again later") from None
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def sweep_leftovers(roots: Roots) -> None:
    """Temporary directories that an interrupted removal (or build, or export) left behind."""
    for parent in (roots.runs, roots.bundles, roots.code):
        tempdirs.sweep(parent)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
