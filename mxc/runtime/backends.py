"""Where a bundle runs: a tiny interface, one module per backend, loaded lazily.

A backend turns a ``RunRequest`` (a stored bundle, plus what the user asked) into a
``Plan`` (the exact command and environment; printing it is ``--dry-run``, and making it
has no side effects) and then submits that plan, returning the run's ``RunRecord``; later it
answers for runs it started: their status (a pure read), cancelling them, and where their logs
are. The contract follows TorchX's scheduler API (dryrun/schedule/describe/cancel/log_iter).
``mxc run`` picks the backend from the spec's ``runtime.backend`` (``--local`` forces
local); ``mxc cancel`` and the readers pick it from the record's ``backend``. A new backend is
one module with a class satisfying ``Backend``, listed in ``BACKENDS``; what every backend does
before it starts is shared here (``allocate_run_dir``, ``pinned_code``, ``first_record``,
``create_run_dir``, ``seed_checkpoint``), and every path comes from mxc/runtime/runpaths.py.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from mxc import tempdirs
from mxc.errors import UserError, cannot_write
from mxc.node import envboundary
from mxc.node.contract import RunContract
from mxc.runtime import runpaths
from mxc.runtime.contract import load as load_contract
from mxc.runtime.hooks import Launcher, RunObserver
from mxc.runtime.provenance import environment
from mxc.runtime.record import RunRecord, Status, now_iso
from mxc.runtime.resume import ResumePoint
from mxc.runtime.rundir import RunDir, is_run_id, new_run_id
from mxc.runtime.runpaths import Roots
from mxc.store import StoredBundle

if TYPE_CHECKING:
    from mxc.runtime.provenance.codepin import PinnedCode

# name -> "module:class"; imported only when chosen.
BACKENDS: dict[str, str] = {
    "local": "mxc.runtime.local.backend:LocalBackend",
    "slurm": "mxc.runtime.slurm.backend:SlurmBackend",
}

DEFAULT_PYTHON = "python3"  # the spec schema's default for runtime.python


@dataclass(frozen=True)
class RunRequest:
    """A stored bundle to run and the options the user gave. What the runtime needs to know about
    the bundle is its typed contract (run.json); ``spec`` (spec.json) is only read by alerts."""

    home: Path
    bundle: StoredBundle
    spec: Mapping[str, Any]
    rerun_of: str | None = None
    quiet: bool = False
    labels: tuple[str, ...] = ()  # mxc run --label, recorded in the run's record
    observers: Sequence[RunObserver] = ()
    launcher: Launcher | None = None
    run_id: str | None = None  # chosen by the caller (a detached run's parent); else a fresh one
    resume_from: ResumePoint | None = None  # mxc run --resume-from: seeded into the new run's checkpoints

    @property
    def contract(self) -> RunContract:
        return load_contract(self.bundle)

    @property
    def spec_name(self) -> str:
        return self.contract.name

    @property
    def total_steps(self) -> int | None:
        return self.contract.train.steps

    @property
    def code_commit(self) -> str | None:
        code = self.contract.code
        return code.commit if code.repo and code.commit else None


@dataclass
class Plan:
    """What would run: the value ``--dry-run`` prints. ``env`` holds only what mxc adds."""

    backend: str
    run_dir: RunDir
    command: list[str]
    env: dict[str, str]
    cwd: Path
    unset: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def render(self) -> str:
        lines = [f"# backend {self.backend}, run directory {self.run_dir.path}"]
        lines += [f"# {note}" for note in self.notes]
        parts = ["cd", shlex.quote(str(self.cwd)), "&&", "env"]
        parts += [f"-u {shlex.quote(name)}" for name in self.unset]
        parts += [shlex.quote(f"{k}={v}") for k, v in sorted(self.env.items())]
        parts += [shlex.quote(arg) for arg in self.command]
        return "\n".join(lines) + "\n" + " ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "run_dir": str(self.run_dir.path), "run_id": self.run_dir.run_id,
                "command": self.command, "env": self.env, "unset": self.unset, "cwd": str(self.cwd),
                "notes": self.notes}


@runtime_checkable
class Backend(Protocol):
    """What ``mxc`` asks of a backend (TorchX's scheduler API: dryrun -> plan, schedule -> submit,
    describe -> status, cancel, log_iter -> logs)."""

    name: str

    def plan(self, request: RunRequest) -> Plan:
        """The exact command and environment, with no side effects (this is ``--dry-run``)."""

    def submit(self, request: RunRequest, plan: Plan) -> RunRecord:
        """Start the plan; the returned record is final for backends that wait for the end (local)."""

    def status(self, run: RunDir) -> RunRecord:
        """The run as its backend sees it now. A pure read: it writes, submits, cancels and sends nothing.
        (Listing many runs, a backend module's ``view_all`` answers them with one poll: ``runs.current_all``.)"""

    def cancel(self, run: RunDir) -> RunRecord:
        """Stop a live run and return its record (final once the stop is seen)."""

    def logs(self, run: RunDir) -> list[Path]:
        """The run's log files, oldest first, that ``mxc logs`` reads (they may not exist yet)."""


def get_backend(name: str) -> Backend:
    target = BACKENDS.get(name)
    if target is None:
        raise UserError(f"unknown backend '{name}'", "known: " + ", ".join(sorted(BACKENDS)))
    module_name, _, attr = target.partition(":")
    if importlib.util.find_spec(module_name) is None:
        raise UserError(f"the {name} backend is not available in this mxc", "run it here with: mxc run --local")
    backend: Backend = getattr(importlib.import_module(module_name), attr)()
    return backend


def allocate_run_dir(request: RunRequest) -> RunDir:
    """A fresh, unused run directory path (not created: planning writes nothing)."""
    roots = Roots.of(request.home)
    if request.run_id is not None:
        if not is_run_id(request.run_id) or not request.run_id.endswith(request.bundle.hash[:8]):
            raise UserError(f"'{request.run_id[:80]}' is not a run id of bundle {request.bundle.hash[:12]}")
        if os.path.lexists(roots.run(request.run_id).path):
            raise UserError(f"run {request.run_id} exists already")
        return roots.run(request.run_id)
    while True:
        run = roots.run(new_run_id(request.bundle.hash))
        if not os.path.lexists(run.path):
            return run


def pinned_code(request: RunRequest) -> PinnedCode | None:
    """The bundle's pinned code commit exported into the code store (``codepin.PinnedCode``), or None
    when the bundle pins none: done before a run starts, by every backend."""
    contract = request.contract
    if not (request.code_commit and contract.code.repo):
        return None
    from mxc.runtime.provenance import codepin

    return codepin.materialise(request.home, contract.code.repo, request.code_commit)


def first_record(request: RunRequest, plan: Plan, status: Status, **fields: Any) -> RunRecord:
    """A run's first record: what every backend records the same way (ids, spec, labels, what it
    reruns or resumes), plus the backend's own ``fields``."""
    run = plan.run_dir
    return RunRecord(
        run_id=run.run_id, bundle=request.bundle.hash, spec_name=request.spec_name, backend=plan.backend,
        status=status, started=now_iso(), rerun_of=request.rerun_of, labels=list(request.labels),
        resumed_from=request.resume_from.as_record() if request.resume_from else None, **fields,
    )


def job_variables(request: RunRequest, run: RunDir) -> dict[str, str]:
    """What every backend tells the node program about where things are: the bundle, the run
    directory, JAX's cache and (with ``MXC_RUNS_DIR``) the image cache (``runpaths.Roots``)."""
    roots = Roots.of(request.home)
    return {"MXC_BUNDLE_DIR": str(request.bundle.path), "MXC_RUN_DIR": str(run.path),
            "MXC_JAX_CACHE": str(roots.jax_cache), **roots.image_cache_env()}


def tensorboard_of(request: RunRequest, run: RunDir) -> str:
    """Where the run's TensorBoard events go, for its record (people and other tools read it; mxc
    derives it again from the contract: mxc/runtime/runpaths.py)."""
    return str(runpaths.for_contract(run, request.contract).tensorboard)


def create_run_dir(run: RunDir, record: RunRecord, bundle: StoredBundle) -> None:
    """The run directory with its own copy of the bundle and its first record, or nothing: a run
    directory without them (a full disk, no inodes left) is removed again, and the failure is one
    line (exit 1). The copy comes first: a run with a record always keeps what it ran."""
    from mxc.runtime import kept_bundle

    try:
        run.path.mkdir(parents=True)
    except OSError as exc:
        raise cannot_write(f"run directory {run.path}", exc) from None
    try:
        kept_bundle.keep(bundle, run)
        record.save(run.record)
    except (OSError, UserError) as exc:
        with contextlib.suppress(OSError):
            tempdirs.remove(run.path)
        if isinstance(exc, UserError):
            raise
        raise cannot_write(f"the record of run {run.run_id} in {run.path.parent}", exc) from None


def seed_checkpoint(request: RunRequest, run: RunDir) -> None:
    """Before the first attempt of a ``--resume-from`` run: the source checkpoint in its own
    checkpoint directory, where MaxText restores from (``mxc.runtime.resume``)."""
    if request.resume_from is None:
        return
    from mxc.runtime.resume import seed

    target = runpaths.for_contract(run, request.contract).checkpoints
    how = seed(request.resume_from, target)
    if not request.quiet:
        point = request.resume_from
        print(f"mxc: resuming from run {point.run} at step {point.step}: checkpoint {how} into {target}",
              file=sys.stderr)


def training_python(contract: RunContract) -> str:
    """The interpreter a native run uses, as an absolute path when it can be found.

    Order: ``$MXC_PYTHON``; the spec's ``runtime.python`` when it is not the default;
    else the interpreter running mxc when it has maxtext installed (``mxc[train]``), so
    an un-activated virtual environment still trains; else ``python3`` on PATH.
    """
    if os.environ.get("MXC_PYTHON"):
        return os.environ["MXC_PYTHON"]
    configured = contract.container.python
    if configured == DEFAULT_PYTHON and importlib.util.find_spec("maxtext") is not None:
        return sys.executable
    return shutil.which(configured) or configured


def recorded_environment(env: Mapping[str, str], spec: Mapping[str, Any]) -> dict[str, str]:
    """The variables a run record keeps of the environment a run was started from: mxc's own (for the
    node program) and what of it reaches the training (mxc/node/envboundary.py; a variable left in the
    caller's shell does not, so it is not recorded as if it did); exact names only, secrets left out
    (mxc/runtime/provenance/environment.py)."""
    passed = [str(name) for name in (spec.get("env") or {}).get("pass") or []]
    crossing = {name: value for name, value in env.items()
                if name.startswith(envboundary.OWN_PREFIX) or envboundary.crosses(name, passed)}
    return environment.recorded_environment(crossing, spec)


def extensions(request: RunRequest) -> tuple[Launcher | None, list[RunObserver]]:
    """What plugs into a supervised run: observability (Ray launcher, exporter, Prometheus) when the
    bundle enables it, and alerts when its spec has a ``notify`` section."""
    from mxc.runtime import notify

    launcher: Launcher | None = None
    observers: list[RunObserver] = []
    contract = request.contract
    if contract.observability.enabled:
        from mxc.runtime.observe import observer as observe

        launcher, found = observe.extensions(contract)
        observers += found
    return launcher, [*observers, *notify.observers(request.spec)]


# How a cancelled run exits, by who cancelled it (record.cancelled_by): the signal a local
# supervisor got, or `mxc cancel` (a SIGTERM to the supervisor, or scancel's SIGTERM to the job).
CANCEL_EXIT = {"SIGINT": 130, "SIGTERM": 143, "SIGHUP": 129, "mxc cancel": 143}


def exit_code(record: RunRecord) -> int:
    """What ``mxc run`` (and ``mxc wait``) exits with: 0, the training's own exit code, or 128+signal
    when cancelled: by whom it names, else the 128+signal exit code the run recorded (a Slurm job
    scancelled from outside: 143), else 130 (Ctrl-C)."""
    if record.status in ("succeeded", "submitted", "queued", "running", "starting"):
        return 0
    code = record.exit_code
    if record.status == "cancelled":
        if record.cancelled_by in CANCEL_EXIT:
            return CANCEL_EXIT[record.cancelled_by]
        return min(code, 255) if code is not None and code > 128 else 130
    if code is None or code == 0:
        return 1
    if code < 0:
        return 128 + (-code)
    return min(code, 255)
