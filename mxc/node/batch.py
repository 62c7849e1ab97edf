"""The batch side of a Slurm job: runs on the first node of the allocation, once per start.

1. verify the bundle and bound the restarts (``SLURM_RESTART_COUNT`` + mxc's resubmissions against
   ``restart.max``: Slurm requeues a ``--requeue`` job by itself after a node failure or a
   preemption, so every start checks, before it takes the nodes for another run);
2. pick the JAX coordinator: this node's Slurm address (NodeAddr) on a free port in 20000-52767;
3. start one rank per node (``srun --kill-on-bad-exit=1 --label``: one dead rank ends the step
   everywhere, so no GPU stays held by a half-dead job);
4. on USR2 (``--signal=B:USR2@N`` before the time limit, or a preemption notice), tell the two
   apart by the time left (stopcause.py) and ask training to checkpoint and stop: SIGTERM to every
   process of the steps (``scancel --signal=TERM``, which spares this process), or, where the node
   has no scancel, USR2 through srun, which each rank turns into SIGTERM;
5. when the step ends, find why (outcome.py), ask the restart policy (policy.py) and carry out its
   decision: ``scontrol requeue``, or ``resubmit.request`` for mxc where nodes have no scontrol;
6. report for itself (jobreport.py): the spec's chat alerts (start, restart, hang, failure, finish)
   and, when the run ends here, its end in ``end.json`` and record.json, with no mxc process around.

Everything it decides is an event in ``batch.jsonl``; its log lines start ``[mxc batch JOB]``.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from . import checkpoints, envboundary, events, integrity, jobreport, layout, outcome, policy, stopcause
from .contract import ContractError, RunContract
from .contract import load as load_contract

PORTS = (20000, 52767)
REQUEUE_WAIT_S = 60.0  # after `scontrol requeue`: Slurm ends this process meanwhile
EX_TEMPFAIL = 75  # the job asked mxc to resubmit it: not a success


class Batch:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.bundle = Path(env["MXC_BUNDLE_DIR"])
        self.run = Path(env["MXC_RUN_DIR"])
        self.job_id = env.get("SLURM_JOB_ID", "")
        self.slurm_restarts = int(env.get("SLURM_RESTART_COUNT") or 0)
        self.resubmits = int(env.get("MXC_RESUBMITS") or 0)
        self.restarts = self.slurm_restarts + self.resubmits
        self.started = time.monotonic()
        self.pending: list[int] = []  # signals received, handled by the main loop
        self.requeued = False
        self.step: subprocess.Popen[bytes] | None = None
        self.report: jobreport.JobReport | None = None

    def module_vars(self, contract: RunContract, env: dict[str, str]) -> dict[str, str]:
        """``MXC_MODULE_VARS`` for the ranks: what the spec's ``module load``s set, which reaches the
        training with the base (envboundary.py). job.sbatch wrote the environment before them to a
        temporary file (``env -0``); a value inherited from the submitting shell is never trusted."""
        before_file = env.pop(envboundary.BEFORE_MODULES, None)
        env.pop(envboundary.MODULE_VARS, None)
        if not (contract.slurm.modules and before_file):
            return {}
        try:
            with open(before_file, "rb") as fh:
                before = envboundary.parse_env0(fh.read(1 << 24))
            os.unlink(before_file)  # it holds the submitting shell's variables: gone once read
        except OSError as exc:
            self.log(f"cannot read the environment before the module loads ({exc.strerror or exc}): "
                     "what they set does not reach the training")
            return {}
        after = {name: value for name, value in self.env.items() if name != envboundary.BEFORE_MODULES}
        names = envboundary.module_vars(before, after)
        return {envboundary.MODULE_VARS: " ".join(names)} if names else {}

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.pending.append(signum)  # handled by the main loop, never inside the handler

    # ---- output

    def log(self, text: str) -> None:
        print(f"[mxc batch {self.job_id or '?'}] {text}", file=sys.stderr, flush=True)

    def event(self, kind: Callable[..., Any], **fields: Any) -> None:
        events.append(layout.batch_events(self.run), kind(time=time.time(), job_id=self.job_id, attempt=self.restarts,
                                                          **fields))

    # ---- main

    def main(self) -> int:
        self.run.mkdir(parents=True, exist_ok=True)
        changed = integrity.check(self.bundle, self.bundle.name)
        if changed:
            return self.refuse(f"bundle {self.bundle.name[:12]} differs from what was built: " + "; ".join(changed[:3]))
        try:
            contract = load_contract(self.bundle)
        except ContractError as exc:
            return self.refuse(str(exc))
        self.report = jobreport.JobReport(self.run, self.bundle, contract, self.env, self.job_id, self.restarts)
        refusal = policy.start_refusal(self.restarts, contract.restart.max)
        if refusal:
            return self.refuse(refusal)
        for handled in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(handled, self._on_signal)
        coordinator = f"{coordinator_host(self.env)}:{free_port(coordinator_host(self.env))}"
        nodes = int(self.env.get("SLURM_JOB_NUM_NODES") or contract.nodes)
        self.log(f"nodes {self.env.get('SLURM_JOB_NODELIST', '?')}, coordinator {coordinator}, "
                 f"restart {self.restarts} of at most {contract.restart.max}")
        self.event(events.BatchStart, slurm_restart_count=self.slurm_restarts, resubmits=self.resubmits,
                   restart_max=contract.restart.max, nodes=self.env.get("SLURM_JOB_NODELIST", ""), num_nodes=nodes,
                   partition=self.env.get("SLURM_JOB_PARTITION", ""), batch_host=socket.gethostname(),
                   coordinator=coordinator)
        self.report.started(self.env.get("SLURM_JOB_NODELIST", ""))
        env = dict(self.report.rank_env(self.env), MXC_ATTEMPT=str(self.restarts), MXC_COORDINATOR=coordinator)
        env.update(self.module_vars(contract, env))
        if contract.observability.enabled:
            env["MXC_OBSERVE_NODES"] = "1"  # each rank starts mxc's node observer (mxc/runtime/observe/node_observer.py)
        try:
            self.step = subprocess.Popen(
                ["srun", "--kill-on-bad-exit=1", "--label", f"--nodes={nodes}", "--ntasks-per-node=1", "--export=ALL",
                 "bash", str(self.bundle / "entrypoint.sh")], env=env, stdin=subprocess.DEVNULL)
        except OSError as exc:
            self.log(f"cannot start srun: {exc.strerror or exc}")
            self.event(events.End, rc=127)
            self.report.ended("failed", 127, f"cannot start srun on {socket.gethostname()}: {exc.strerror or exc}")
            return 127
        stop_cause = None
        while True:
            code = self.step.poll()
            while self.pending:
                signum = self.pending.pop(0)
                if signum == signal.SIGTERM:
                    return self.terminated()
                if stop_cause is None:
                    stop_cause = self.on_usr2(contract)
            if code is not None:
                break
            time.sleep(0.2)
        rc = code if code >= 0 else 128 - code
        self.log(f"step finished with exit {rc}")
        return self.decide(contract, rc, stop_cause, nodes)

    def refuse(self, why: str) -> int:
        self.log(f"not starting: {why}")
        self.event(events.Refused, slurm_restart_count=self.slurm_restarts, resubmits=self.resubmits, why=why)
        report = self.report or jobreport.JobReport(self.run, self.bundle, None, self.env, self.job_id, self.restarts)
        report.ended("failed", 1, why, cause="refused")
        return 1

    def terminated(self) -> int:
        """SIGTERM: scancel, the time limit, or a preemption without a user signal. Slurm ends the steps itself."""
        if self.requeued:
            return 0
        self.event(events.Terminated, signal="SIGTERM")
        if self.step is not None and self.step.poll() is None:
            self.step.terminate()
        if self.report is not None and (self.run / layout.CANCEL_REQUEST).exists():
            # mxc cancel: the run ends here. Any other SIGTERM (the time limit, a preemption that
            # Slurm may requeue) is left for mxc to tell from Slurm's accounting.
            self.report.ended("cancelled", 143, "cancelled with mxc cancel", cause=policy.CANCELLED)
        return 143

    def on_usr2(self, contract: RunContract) -> str:
        left = None
        if shutil.which("squeue") and self.job_id:
            done = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%L"], capture_output=True, text=True,
                                  check=False, timeout=30)
            left = stopcause.parse_time_left(done.stdout.strip().splitlines()[0] if done.stdout.strip() else "")
        if left is None:
            left = stopcause.fallback_time_left(contract.slurm.time_limit_s, time.monotonic() - self.started)
        cause = stopcause.cause_of_usr2(left, contract.slurm.signal_seconds)
        shown = f"{left:.0f}s" if left is not None else "unlimited"
        self.log(f"USR2: {cause} (time left: {shown}); asking training to checkpoint and stop")
        self.event(events.SignalReceived, signal="USR2", cause=cause, time_left=left)
        asked = False
        if shutil.which("scancel") and self.job_id:
            asked = subprocess.run(["scancel", "--signal=TERM", self.job_id], capture_output=True,
                                   check=False, timeout=60).returncode == 0
        if not asked and self.step is not None:
            self.step.send_signal(signal.SIGUSR2)  # srun passes it on; each rank turns it into SIGTERM
        return cause

    # ---- the end of the step

    def decide(self, contract: RunContract, rc: int, stop_cause: str | None, nodes: int) -> int:
        ended = outcome.of_attempt(self.run, self.restarts, nodes)
        # Every rank's training completed (a USR2 came too late to matter): that, not the signal, is what happened.
        cause = ended.cause if ended.cause == policy.COMPLETED else stop_cause or ended.cause
        if stop_cause is None and rc == 0 and ended.cause == policy.CANCELLED:
            cause = policy.COMPLETED  # stopped by nobody we know of, and successfully: srun says it completed
        latest = checkpoints.latest_checkpoint(checkpoints.checkpoints_dir(
            layout.output(self.run, contract.checkpoint.dir), self.run.name))
        decision = policy.decide(policy.Situation(
            cause=cause, restarts=self.restarts, restart_max=contract.restart.max, checkpoint=latest,
            final_step=contract.restart.final_step, checkpointing=contract.restart.checkpointing))
        failed_rank = stop_cause is None and cause not in (policy.COMPLETED, policy.CANCELLED)
        note = ended.detail if cause == policy.COMPLETED else None  # how the trainers went after the training was over
        self.event(events.Decision, cause=cause, action=decision.action, reason=decision.reason, checkpoint=latest,
                   rank=ended.rank if failed_rank else None, node=ended.node if failed_rank else None,
                   detail=ended.detail if failed_rank else note)
        where = f" (rank {ended.rank} on {ended.node})" if failed_rank and ended.rank is not None else ""
        self.log(f"{cause}{where}: {decision.action}: {decision.reason}; latest checkpoint: "
                 f"{latest if latest is not None else 'none'}")
        step = ended.last_step
        if self.report is not None and cause == policy.HANG:
            self.report.hung(ended.rank, ended.node, step, ended.detail, decision.action, decision.reason)
        if decision.action == policy.REQUEUE:
            return self.requeue(cause, latest)
        final = 0 if decision.action == policy.DONE else (rc or 1)
        self.event(events.End, rc=final)
        if self.report is not None:
            if decision.action == policy.DONE:
                self.report.ended("succeeded", 0, note or "", cause=cause)
            else:
                what = f"{cause}{where}: {ended.detail}" if failed_rank and ended.detail else f"{cause}{where}"
                self.report.ended("failed", final, f"{what}; not requeued: {decision.reason}", cause=cause,
                                  rank=ended.rank if failed_rank else None, node=ended.node if failed_rank else None,
                                  detail=ended.detail if failed_rank else None, step=step)
        return final

    def requeue(self, cause: str, latest: int | None) -> int:
        why = ""
        if shutil.which("scontrol") and self.job_id:
            # Written first: Slurm ends this process (SIGTERM) while scontrol requeue still runs.
            self.requeued = True
            self.event(events.Requeue, action="requeued", why=cause, checkpoint=latest)
            self.log(f"requeueing ({cause}); the next start resumes from checkpoint "
                     f"{latest if latest is not None else 'none'}")
            done = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True, text=True, check=False,
                                  timeout=120)
            if done.returncode == 0:
                deadline = time.monotonic() + REQUEUE_WAIT_S
                while time.monotonic() < deadline and not self.pending:
                    time.sleep(0.2)
                return 0
            self.requeued = False
            why = f"scontrol requeue failed on {socket.gethostname()}: {' '.join((done.stderr or done.stdout).split())}"
            self.event(events.Requeue, action="requeue_failed", why=why, checkpoint=latest)
        else:
            why = f"scontrol is not available on {socket.gethostname()}"
        self.log(f"{why}: asking mxc to resubmit")
        request = {"job_id": self.job_id, "cause": cause, "restart": self.restarts, "why": why, "checkpoint": latest}
        path = self.run / layout.RESUBMIT_REQUEST
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(request) + "\n")
        os.replace(tmp, path)
        self.event(events.Requeue, action="resubmit_requested", why=why, checkpoint=latest)
        return EX_TEMPFAIL


def coordinator_host(env: Mapping[str, str]) -> str:
    """This node's Slurm address (``NodeAddr``), else its host name."""
    name = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if shutil.which("scontrol"):
        done = subprocess.run(["scontrol", "show", "node", name, "-o"], capture_output=True, text=True, check=False,
                              timeout=30)
        match = re.search(r"\bNodeAddr=(\S+)", done.stdout)
        if done.returncode == 0 and match:
            return match.group(1)
    return socket.gethostname()


def port_in_use(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def free_port(host: str, tries: int = 50, rng: random.Random | None = None) -> int:
    """A random port in 20000-52767 that nothing listens on (two jobs sharing a node do not collide)."""
    pick = rng or random.SystemRandom()
    port = pick.randint(*PORTS)
    for _ in range(tries):
        if not port_in_use(host, port):
            break
        port = pick.randint(*PORTS)
    return port


def main(env: Mapping[str, str] | None = None) -> int:
    return Batch(os.environ if env is None else env).main()
