"""The local backend: run a bundle's entrypoint on this machine under the supervisor.

Planning only computes paths and variables. Running materialises pinned code, creates the
run directory with a first record, gathers host facts (in a thread, so they cost no time
before the first step) and hands over to the supervisor, which returns the final record.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

from mxc.node import envboundary
from mxc.runtime import runpaths
from mxc.runtime.backends import (
    Plan,
    RunRequest,
    allocate_run_dir,
    create_run_dir,
    extensions,
    first_record,
    job_variables,
    pinned_code,
    recorded_environment,
    seed_checkpoint,
    tensorboard_of,
    training_python,
)
from mxc.runtime.local.deathwatch import DeathWatch
from mxc.runtime.local.launcher import LocalLauncher
from mxc.runtime.local.progress import ProgressBar
from mxc.runtime.local.supervisor import Supervisor, SupervisorConfig
from mxc.runtime.processes import scratch
from mxc.runtime.processes.procfs import ProcessId
from mxc.runtime.provenance import codepin, hostfacts, training
from mxc.runtime.record import RunRecord, now_iso
from mxc.runtime.rundir import RunDir

# A local run is one process on this machine, even inside a Slurm allocation: the
# entrypoint would otherwise read the allocation's task count and rank.
UNSET_PREFIXES = ("SLURM_", "SBATCH_")


class LocalBackend:
    name = "local"

    def plan(self, request: RunRequest) -> Plan:
        contract = request.contract
        nodes = contract.nodes
        if nodes > 1:
            from mxc.errors import UserError

            raise UserError(f"bundle {request.bundle.hash[:12]} asks for {nodes} nodes; the local backend runs one",
                            "run it on Slurm: mxc run without --local")
        run = allocate_run_dir(request)
        env = {
            **job_variables(request, run),
            "MXC_ATTEMPT": "0",
            # The node program runs under mxc's own interpreter (>= 3.11, already warm in the page
            # cache), not whatever `python3` PATH finds first: a version-manager shim there costs
            # a chain of shell processes before every attempt (0.45 s measured with pyenv's).
            "MXC_NODE_PYTHON": os.environ.get("MXC_NODE_PYTHON") or sys.executable,
        }
        notes = []
        if contract.container.kind == "native":
            env["MXC_PYTHON"] = training_python(contract)
        if request.code_commit:
            code_dir = codepin.store_dir(request.home, request.code_commit)
            env["MXC_CODE_DIR"] = str(code_dir)
            if not code_dir.exists():
                notes.append(f"code commit {request.code_commit[:12]} will be exported to {code_dir} first")
        notes.append("MXC_ATTEMPT counts up on each automatic restart "
                     f"(restart.max {contract.restart.max})")
        secret = _alert_secret_env(request)
        # and the module variables a Slurm batch side computes: never taken from a caller's shell
        unset = sorted(k for k in os.environ if k.startswith(UNSET_PREFIXES) or k == secret
                       or k in (envboundary.MODULE_VARS, envboundary.BEFORE_MODULES))
        return Plan("local", run, ["bash", str(request.bundle.path / "entrypoint.sh")], env, run.path,
                    unset=unset, notes=notes)

    def submit(self, request: RunRequest, plan: Plan) -> RunRecord:
        """Run the plan to its end under the supervisor (the returned record is final)."""
        contract = request.contract
        # From the start of `mxc run`: its elapsed time includes the code export (phase "code").
        progress = None if request.quiet else ProgressBar(request.total_steps, sys.stderr)
        code = None
        if request.code_commit and contract.code.repo:
            if progress:
                progress.set_status("code")
            try:
                pinned = pinned_code(request)
                code = pinned.as_record() if pinned else None
            except BaseException:
                if progress:
                    progress.close()  # the error goes on a line of its own
                raise
        run = plan.run_dir
        env = {k: v for k, v in os.environ.items() if k not in plan.unset}
        env.update(plan.env)
        record = first_record(
            request, plan, "starting", command=plan.command, environment=recorded_environment(env, request.spec),
            code=hostfacts.code_facts(contract, {}, code),
            image=hostfacts.image_facts(contract, {}, hostfacts.lockfile_digest(request.bundle.path)),
        )
        # Who writes this record, as an identity (pid + start time + boot id), not a bare pid:
        # tells a live run from a lost one, and `mxc cancel` signals only this very process.
        record.supervisor = {"host": os.uname().nodename, **ProcessId.this_process().as_record()}
        record.tensorboard = tensorboard_of(request, run)
        scratch.sweep()  # what earlier runs killed without a chance to clean up left in /tmp/mxc-<uid>
        registration = _register(run)  # before the record names this process: `mxc cancel` never finds it unregistered
        try:
            create_run_dir(run, record, request.bundle)
        except BaseException:
            if registration is not None:
                scratch.remove(registration)
            raise

        watch = DeathWatch.start(run.path)  # if this process is SIGKILLed, the run's processes go too
        try:
            seed_checkpoint(request, run)
            return self._supervise(request, plan, record, env, code, progress)
        except BaseException as exc:  # the supervisor closes its own record; this covers the set-up before it
            if not record.final:
                record.status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
                record.final, record.ended = True, now_iso()
                record.message = f"could not set up the run: {type(exc).__name__}: {exc}"
                with contextlib.suppress(OSError):  # a full disk: the error that matters is the one raised
                    record.save(run.record)
            raise
        finally:
            watch.release()
            if registration is not None:
                scratch.remove(registration)

    def status(self, run: RunDir) -> RunRecord:
        """The record as the supervisor last wrote it (it keeps it current itself while it lives;
        ``mxc runs`` shows a live record whose supervisor is gone as ``lost``)."""
        from mxc.runtime import runs

        return runs.load(run)

    def cancel(self, run: RunDir) -> RunRecord:
        """SIGTERM to the run's supervisor, or end what a lost run left (mxc/runtime/local/cancel.py)."""
        from mxc.runtime import runs
        from mxc.runtime.local import cancel

        return cancel.cancel(run, runs.load(run))

    def logs(self, run: RunDir) -> list[Path]:
        """One log: the supervisor appends every attempt's output to train.log."""
        return [run.log]

    def _supervise(self, request: RunRequest, plan: Plan, record: RunRecord, env: dict[str, str],
                   code: dict[str, Any] | None, progress: ProgressBar | None) -> RunRecord:
        contract, run, python = request.contract, plan.run_dir, plan.env.get("MXC_PYTHON")
        # Host facts cost a Python start and a package scan: gather them once training has
        # taken its first step, so they never compete with its start-up (time to first step).
        facts: dict[str, Any] = {}
        gather = threading.Thread(target=lambda: facts.update(hostfacts.collect(python)), daemon=True)

        def start_gathering(_events: object = None) -> None:
            if not gather.is_alive() and not facts and gather.ident is None:
                gather.start()

        def with_facts(rec: RunRecord) -> None:
            """Put host facts into the record on the first write after they are known (at the latest, the final one)."""
            if rec.final:
                start_gathering()
                gather.join(timeout=60)
            started = training.rank0(run.path, request.spec)
            if started is not None:
                rec.training = started
            if facts and not rec.host:
                rec.host = dict(facts)
                rec.image = hostfacts.image_facts(contract, facts, rec.image.get("lockfile"))
                rec.code = hostfacts.code_facts(contract, facts, code)

        launcher, observers = extensions(request)
        config = SupervisorConfig(
            argv=plan.command, env=env, cwd=plan.cwd,
            restart=contract.restart, total_steps=request.total_steps,
            checkpoints=runpaths.for_contract(run, contract).checkpoints,
            before_save=with_facts, on_steps=start_gathering, before_attempt=lambda: _bundle_problem(request),
        )
        supervisor = Supervisor(run, record, config, launcher or LocalLauncher(), [*request.observers, *observers],
                                progress)
        return supervisor.run_to_end()


def _register(run: RunDir) -> Path | None:
    """This process is the run's supervisor, said where only this user writes (/tmp/mxc-<uid>):
    ``mxc cancel`` signals the supervisor a record names only with this (``scratch.vouches``)."""
    try:
        return scratch.create(run.path)
    except (OSError, RuntimeError) as exc:
        print(f"mxc: warning: run {run.run_id}: cannot register its supervisor ({exc}); `mxc cancel` will not signal "
              "it (Ctrl-C stops it)", file=sys.stderr)
        return None


def _alert_secret_env(request: RunRequest) -> str | None:
    """The variable holding the webhook secret (``notify.secret_env``): the supervisor sends the
    alerts from its own environment, so the training never needs it, and it must never reach it
    (the node program writes the training's environment to ranks/N/environment.json; the Slurm
    side strips it the same way: mxc/node/jobreport.py)."""
    from mxc.runtime import notify

    config = notify.NotifyConfig.from_spec(request.spec)
    return config.secret_env if config else None


def _bundle_problem(request: RunRequest) -> str | None:
    """Checked before every attempt: a restart must run the bundle that was reviewed, not one edited since."""
    from mxc.node import integrity

    problems = integrity.check(request.bundle.path, request.bundle.hash)
    if not problems:
        return None
    return f"bundle {request.bundle.hash[:12]} is damaged: {problems[0]} (check it with: mxc verify {request.bundle.hash[:12]})"
