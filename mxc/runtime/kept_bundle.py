"""Runs keep what they ran: a copy of their bundle in ``<run>/bundle/``.

A run is replayable only while its bundle exists; the store's copy can go (``mxc rm BUNDLE``,
``mxc gc --include-used-bundles``, a new ``$MXC_HOME``). So every run directory gets the bundle
when it is created, before anything runs: each file hard-linked from the store (same file system:
no extra space, and the store's files are read-only, so the link cannot drift from what was run)
or copied (another file system, ``MXC_RUNS_DIR`` on scratch), then verified as a whole with the
bundle's own check (mxc/node/integrity.py) against the hash the run records.

``mxc rerun`` puts a bundle that left the store back from the run's copy (verified: the store only
ever holds a directory that hashes to its name); ``compare``, ``report``, ``mxc watch`` (alerts,
resubmission) and the run's paths (mxc/runtime/runpaths.py) read whichever copy is intact.
"""

from __future__ import annotations

import os
import shutil
import sys

from mxc import tempdirs
from mxc.errors import UserError, cannot_write
from mxc.node import integrity
from mxc.node.contract import RunContract
from mxc.runtime.record import RunRecord
from mxc.runtime.rundir import RunDir
from mxc.store import Store, StoredBundle


def keep(bundle: StoredBundle, run: RunDir) -> str:
    """Put ``bundle`` into the new run's directory, verified; says how (``linked`` or ``copied``).
    Filled in a temporary directory and renamed into place: a reader sees all of it or none."""
    copied: list[bool] = []

    def link_or_copy(src: str, dst: str) -> None:
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:
            shutil.copy2(src, dst, follow_symlinks=False)
            copied.append(True)

    try:
        staging = tempdirs.make(run.path)
        try:
            shutil.copytree(bundle.path, staging / "bundle", symlinks=True, copy_function=link_or_copy)
            for directory, _, _ in os.walk(staging / "bundle"):  # read-only files, removable directories:
                os.chmod(directory, 0o755)  # `rm -rf RUN` works for its owner (the store's are read-only)
            problems = integrity.check(staging / "bundle", bundle.hash)
            if problems:
                raise UserError(f"bundle {bundle.hash[:12]} changed while it was copied into run {run.run_id}: "
                                f"{problems[0]}", f"check it with: mxc verify {bundle.hash[:12]}")
            os.rename(staging / "bundle", run.bundle)
        finally:
            tempdirs.remove(staging)
    except OSError as exc:
        raise cannot_write(f"bundle {bundle.hash[:12]} into run {run.run_id}", exc) from None
    return "copied" if copied else "linked"


def _copies(run: RunDir, record: RunRecord, store: Store) -> list[StoredBundle]:
    """Where the bundle the run ran may be: its own copy first, then the store's (none when the
    record names a bundle its run id does not: such a record is not the run's)."""
    digest = record.bundle
    if not integrity.valid_hash(digest) or not run.run_id.endswith("-" + digest[:8]):
        return []
    return [StoredBundle(digest, path) for path in (run.bundle, store.bundles / digest) if os.path.lexists(path)]


def bundle_of(run: RunDir, record: RunRecord, store: Store) -> StoredBundle | None:
    """The bundle the run ran, whole and intact (every file checked: what is about to be run or
    served): the run's own copy, else the store's; None when neither is (a run from before runs
    kept their bundle, whose bundle left the store)."""
    return next((b for b in _copies(run, record, store) if not integrity.check(b.path, b.hash)), None)


def contract_of(run: RunDir, record: RunRecord, store: Store) -> RunContract | None:
    """The contract of the bundle the run ran, read through its hash (the manifest and run.json
    checked, not every file: readers of many runs, ``gc``, stay fast); None when no copy has it."""
    from mxc.runtime.contract import load

    for bundle in _copies(run, record, store):
        try:
            return load(bundle)
        except UserError:
            continue
    return None


def spec_of(run: RunDir, record: RunRecord, store: Store) -> dict[str, object] | None:
    """The spec (spec.json) of the bundle the run ran, read through its hash; None when no copy has it."""
    for bundle in _copies(run, record, store):
        try:
            return bundle.spec()
        except UserError:
            continue
    return None


def in_store(run: RunDir, record: RunRecord, store: Store, quiet: bool = False) -> StoredBundle:
    """The run's bundle in the store, intact: put back there from the run's own copy when it left
    (or repaired when the store's copy is damaged); a UserError when neither copy is whole."""
    digest = record.bundle
    if not integrity.valid_hash(digest) or not run.run_id.endswith("-" + digest[:8]):
        raise UserError(f"record.json names bundle {digest[:16]!r}, not the one run {run.run_id} ran",
                        "the record was changed: its id names the bundle")
    stored = store.bundles / digest
    problems = integrity.check(stored, digest) if os.path.lexists(stored) else None
    if problems == []:
        return StoredBundle(digest, stored)
    kept = StoredBundle(digest, run.bundle)
    if not os.path.lexists(run.bundle) or integrity.check(run.bundle, digest):
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StoredBundle(digest, stored).damaged(problems[0] + more)
        raise UserError(f"bundle {digest[:12]} of run {run.run_id} is not in the store, and the run keeps no intact "
                        "copy of it", f"rebuild it from its spec; {store.bundles} no longer has it")
    files = {name: kept.read(name) for name in (integrity.MANIFEST, *kept.files())}
    restored, _ = store.put(files, digest)
    store.require_intact(restored)
    if not quiet:
        how = "repaired" if problems else "was not in the store: put back"
        print(f"mxc: bundle {digest[:12]} {how} from run {run.run_id}'s copy", file=sys.stderr)
    return restored
