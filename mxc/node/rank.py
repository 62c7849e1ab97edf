"""The rank side: what runs once per node (srun starts it on every node; ``mxc run`` once locally).

Stages, each under its limit from run.json, each logged as ``stage NAME: start`` and recorded as
events (``ranks/<rank>/events.jsonl``):

1. ``preflight``: the node checks (preflight.py, in a child process so a hung file system cannot
   hang the rank), results in ``ranks/<rank>/preflight.json``;
2. ``image``: the training environment (container.py; the image cache for Apptainer);
3. ``barrier``: with several ranks, every rank waits until all have passed 1 and 2 (barrier.py),
   within the image stage's limit: a node still pulling a 30 GB image no longer makes the others
   run into jax.distributed's initialisation timeout;
4. ``train``: the trainer (trainer.py), its output passed on and watched for hangs and
   infrastructure failures, post-mortem evidence kept when it dies (postmortem.py).

The exit event names the stage, the exit code and the cause (policy.CAUSES), which the batch
side (or mxc's local supervisor) turns into a decision. Before anything, the bundle is verified
(integrity.py): a changed file stops the rank, naming it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from . import (
    atomicfile,
    barrier,
    checkpoints,
    container,
    detect,
    envboundary,
    envmerge,
    events,
    eventscrub,
    integrity,
    layout,
    livestacks,
    netif,
    placeholders,
    policy,
    postmortem,
    procs,
    stacks,
)
from .contract import ContractError, RunContract, Stage
from .contract import load as load_contract
from .imagecache import ImageError
from .trainer import EndOfTraining, Result, StopRequest, Trainer

KILLED_SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
OBSERVER_STOP_S = 30.0
HANG_STACKS_WAIT_S = 150.0  # py-spy may take 2 x 60 s on a process that does not answer (stacks.PYSPY_TIMEOUT)


class Stopped(Exception):
    """A stop request (SIGTERM, SIGINT, USR2) arrived before training started."""


class StageFailed(Exception):
    def __init__(self, rc: int, detail: str, timed_out: bool = False) -> None:
        super().__init__(detail)
        self.rc, self.detail, self.timed_out = rc, detail, timed_out


class Rank:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.bundle = Path(env.get("MXC_BUNDLE_DIR") or Path(__file__).resolve().parent.parent)
        self.run = Path(env["MXC_RUN_DIR"])
        self.rank = int(env.get("SLURM_PROCID") or 0)
        self.nprocs = int(env.get("SLURM_NTASKS") or 1)
        self.node = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.attempt = int(env.get("MXC_ATTEMPT") or env.get("SLURM_RESTART_COUNT") or 0)
        self.job_id = env.get("SLURM_JOB_ID", "")
        self.coordinator = env.get("MXC_COORDINATOR", "")
        self.spec_env: list[tuple[str, str]] = []
        self.stop = StopRequest()
        self.interruptible = True  # before training: a stop request ends the current stage at once
        self.stage_name = "setup"
        self.events = layout.rank_events(self.run, self.rank)
        self.detected: list[str] = []  # variables env.detect set for training (detect.py)
        self.detected_modes: dict[str, str] = {}  # how each joins a container image's value (envmerge)

    # ---- output

    def log(self, text: str) -> None:
        print(f"[mxc {self.node} rank {self.rank}] {text}", file=sys.stderr, flush=True)

    def event(self, kind: Callable[..., Any], **fields: Any) -> None:
        try:
            events.append(self.events, kind(time=time.time(), job_id=self.job_id, attempt=self.attempt, rank=self.rank,
                                            node=self.node, **fields))
        except OSError as exc:
            self.log(f"cannot write {self.events}: {exc}")

    def exit(self, stage: str, rc: int, cause: str, detail: str | None = None, timed_out: bool = False,
             last_step: int | None = None) -> int:
        self.event(events.RankExit, stage=stage, rc=rc, timed_out=timed_out, cause=cause, detail=detail,
                   last_step=last_step)
        return rc

    # ---- signals

    def _on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGUSR2:
            self.log("USR2: asking training to checkpoint and stop")
        self.stop.request(name)
        if self.interruptible:
            raise Stopped(name)

    def _handle_signals(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(signum, self._on_signal)

    # ---- main

    def main(self) -> int:
        self.log(f"bundle {self.bundle} attempt {self.attempt} ({self.nprocs} process(es))")
        self._handle_signals()
        try:
            return self._main()
        except Stopped as stop:
            self.log(f"{stop}: stopping before training")
            return self.exit(self.stage_name, 128 + int(signal.Signals[str(stop)]), policy.CANCELLED, f"stopped by {stop}")

    def _main(self) -> int:
        changed = integrity.check(self.bundle, self.bundle.name)
        if changed:
            self.log(f"bundle {self.bundle.name[:12]} differs from what was built: {changed[0]}; refusing to start")
            return self.exit("verify", 2, policy.STAGE_FAILED, "bundle changed: " + "; ".join(changed[:3]))
        try:
            contract = load_contract(self.bundle)
        except ContractError as exc:
            self.log(str(exc))
            return self.exit("verify", 2, policy.STAGE_FAILED, str(exc))
        output_dir = layout.output(self.run, contract.checkpoint.dir)
        note = postmortem.limit_core_size(contract.cores.max_mb)
        if note:
            self.log(note)
        env = self._environment(contract, output_dir)
        # In a container, training starts from the image's environment, not this node's: detectors
        # judge against the spec's values only, and what they find reaches the container so that the
        # image's own value wins (envmerge "default"), except a guard's "0" (detect.GUARDED).
        judged = env if contract.container.kind == "native" else envmerge.compose({}, self.spec_env,
                                                                                  dict(contract.env_merge))
        env.update(self._detect(contract.detect, judged))
        choice = netif.choose_interface(Path("/sys/class/net"), configured=contract.network.interface,
                                        nccl_spec=env.get("NCCL_SOCKET_IFNAME"), coordinator=self.coordinator or None,
                                        route_to=netif.route_via_ip)
        network = netif.network_env(choice, env)
        env.update(network)
        if choice.warning and (self.nprocs > 1 or not choice.name):
            self.log(f"network: {choice.warning}")
        self.log(f"network: NCCL_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']}, interface {choice.name or 'none'} "
                 f"({choice.reason})")
        if self.nprocs > 1:
            self.log(f"JAX process {self.rank} of {self.nprocs}, coordinator {self.coordinator}")
        self.event(events.RankStart, nprocs=self.nprocs, coordinator=self.coordinator, pid=os.getpid(),
                   interface=choice.name, interface_reason=choice.reason)

        # The checks run in this node's environment (plus the chosen network), never the training's:
        # a variable of the spec (LD_PRELOAD, opted in) is for the trainer, not for mxc's own processes.
        node_env = dict(self.env, MXC_ATTEMPT=str(self.attempt), MXC_BUNDLE_DIR=str(self.bundle), **network)
        failed = self._stage(contract.stage("preflight"), lambda deadline: self._preflight(node_env, deadline))
        if failed is not None:
            return failed
        python = self.env.get("MXC_PYTHON") or contract.container.python
        cache = Path(self.env.get("MXC_IMAGE_CACHE") or layout.image_cache(self.run))
        image: list[container.Image] = []
        started = time.monotonic()
        failed = self._stage(contract.stage("image"),
                             lambda deadline: image.append(container.prepare(contract.container, python, cache, deadline)))
        if failed is not None:
            return failed
        self.event(events.ImageReady, image=image[0].ref, action=image[0].action,
                   seconds=round(time.monotonic() - started, 3))
        if self.nprocs > 1:
            failed = self._stage(contract.stage("barrier"), self._barrier, limit_name="image")
            if failed is not None:
                return failed
        return self._train(contract, env, node_env, python, image[0], output_dir)

    # ---- stages

    def _stage(self, stage: Stage, body: Callable[[float], Any], limit_name: str | None = None) -> int | None:
        """Run ``body(deadline)``; None when it passed, else the rank's exit code (the exit event written)."""
        self.stage_name = stage.name
        limit = f" (limit {stage.timeout_s}s)" if stage.timeout_s else ""
        self.log(f"stage {stage.name}: start{limit}")
        self.event(events.StageStart, stage=stage.name, timeout_s=stage.timeout_s)
        started = time.monotonic()
        deadline = started + stage.timeout_s if stage.timeout_s else float("inf")
        rc, detail, timed_out = 0, None, False
        try:
            body(deadline)
        except StageFailed as exc:
            rc, detail, timed_out = exc.rc, exc.detail, exc.timed_out
        except ImageError as exc:
            timed_out = time.monotonic() >= deadline
            rc, detail = (124 if timed_out else 1), str(exc)
        seconds = round(time.monotonic() - started, 3)
        self.event(events.StageEnd, stage=stage.name, rc=rc, seconds=seconds, timed_out=timed_out, detail=detail)
        if rc == 0:
            return None
        if timed_out:
            self.log(f"stage {stage.name} timed out after {stage.timeout_s}s (runtime.timeouts.{limit_name or stage.name})"
                     + (f": {detail}" if detail else ""))
        else:
            if detail:
                self.log(detail)
            self.log(f"stage {stage.name} failed (exit {rc})")
        return self.exit(stage.name, rc, policy.STAGE_FAILED, detail, timed_out)

    def _preflight(self, env: dict[str, str], deadline: float) -> None:
        argv = [sys.executable, "-E", "-s", "-B", str(Path(__file__).with_name("__main__.py")), "preflight",
                str(layout.preflight_result(self.run, self.rank))]
        rc, timed_out = run_limited(argv, env, deadline, grace_s=10)
        if timed_out:
            raise StageFailed(124, "preflight checks did not finish", timed_out=True)
        if rc != 0:
            raise StageFailed(rc, "")  # the checks printed "preflight failed: ..." themselves

    def _barrier(self, deadline: float) -> None:
        outcome = barrier.wait(layout.barrier(self.run, self.attempt, "ready"), self.rank, self.node, self.nprocs,
                               deadline)
        if not outcome.passed:
            late = ", ".join(f"rank {r} ({self._node_of(r)})" for r in outcome.missing)
            raise StageFailed(124, f"waited {outcome.waited_s:.0f}s for {late} to finish preflight and image",
                              timed_out=True)
        self.event(events.BarrierPassed, name="ready", ranks=self.nprocs, waited_s=round(outcome.waited_s, 3))

    def _node_of(self, rank: int) -> str:
        found, _ = events.read(layout.rank_events(self.run, rank), events.RANK_EVENTS)
        starts = [e for e in found if isinstance(e, events.RankStart) and e.attempt == self.attempt]
        return starts[-1].node if starts else "node unknown: it never started"

    # ---- training

    def _environment(self, contract: RunContract, output_dir: Path) -> dict[str, str]:
        known = self._placeholder_values()
        # env.sh (and env.ranks), run-time placeholders filled in; each replaces the inherited value or
        # joins it (run.json's env_merge); in a container, envmerge.py joins them with the image's instead
        self.spec_env = [(name, placeholders.fill(value, known)) for name, value in contract.env_of(self.rank)]
        # the node's environment (the caller's shell, sbatch's --export=ALL) crosses only as envboundary.py says
        base = envboundary.training_base(self.env, contract.env_pass or [])
        env = envmerge.compose(base, self.spec_env, dict(contract.env_merge))
        env.update(postmortem.faulthandler_env(env))
        env.update(MXC_RUN_DIR=str(self.run), MXC_BUNDLE_DIR=str(self.bundle), MXC_ATTEMPT=str(self.attempt),
                   MXC_CHECKPOINT_DIR=str(output_dir))
        if self.coordinator or self.nprocs > 1:
            host, _, port = self.coordinator.rpartition(":")
            env.update(JAX_COORDINATOR_ADDRESS=self.coordinator, JAX_COORDINATOR_IP=host, JAX_COORDINATOR_PORT=port,
                       NNODES=str(self.nprocs), NODE_RANK=str(self.rank), JAX_NUM_PROCESSES=str(self.nprocs),
                       JAX_PROCESS_ID=str(self.rank))
        code = self.env.get("MXC_CODE_DIR")
        if code:
            inherited = env.get("PYTHONPATH")
            env["PYTHONPATH"] = f"{code}/{contract.train.pythonpath}" + (f":{inherited}" if inherited else "")
        return env

    def _detect(self, names: list[str], env: dict[str, str]) -> dict[str, str]:
        """env.detect: node-computed settings (detect.py), each detector's inputs and result recorded in
        ranks/<rank>/detected.json. MXC_DETECT_ROOT replaces / for what they read (tests, a chroot)."""
        if not names:
            return {}
        node = detect.Node(Path(self.env.get("MXC_DETECT_ROOT") or "/"))
        updates, report = detect.run_detectors(names, env, node)
        for entry in report:
            self.log(detect.summary(entry))
        try:
            detect.write_report(layout.detected(self.run, self.rank), rank=self.rank, node=self.node,
                                attempt=self.attempt, entries=report)
        except OSError as exc:
            self.log(f"cannot write {layout.detected(self.run, self.rank)}: {exc}")
        self.detected = sorted(updates)
        self.detected_modes = detect.container_modes(updates)
        return updates

    def _place_config(self, name: str) -> Path:
        """model.config_file: the bundle's copy (verified with the bundle) into the run directory, which
        every container binds; each rank writes the same bytes atomically, so ranks sharing it agree."""
        target = self.run / name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomicfile.write_text(target, (self.bundle / name).read_text("utf-8"))
        return target

    def _placeholder_values(self) -> dict[str, str]:
        """What {run_dir}, {rank}... stand for on this node, in this attempt (mxc/node/placeholders.py)."""
        return {"run_dir": str(self.run), "run_id": self.run.name, "rank": str(self.rank), "node": self.node,
                "job_id": self.env.get("SLURM_JOB_ID") or "local", "attempt": str(self.attempt)}

    def _train(self, contract: RunContract, env: dict[str, str], node_env: dict[str, str], python: str,
               image: container.Image, output_dir: Path) -> int:
        ckpt_dir = checkpoints.checkpoints_dir(output_dir, self.run.name)
        final = contract.restart.final_step
        if contract.checkpoint.period and final is not None and checkpoints.latest_checkpoint(ckpt_dir) == final:
            self.log(f"training already complete (checkpoint of the final step {final} exists)")
            return self.exit("train", 0, policy.COMPLETED, "the final step's checkpoint exists", last_step=final)
        if self.nprocs > 1 and not self.coordinator:
            self.log("multi-node runs need MXC_COORDINATOR=host:port (the batch side sets it)")
            return self.exit("train", 2, policy.STAGE_FAILED, "no MXC_COORDINATOR")
        code_dir = self.env.get("MXC_CODE_DIR")
        metrics = layout.metrics_file(self.run, self.attempt, self.rank)
        metrics.parent.mkdir(parents=True, exist_ok=True)
        output_dir.mkdir(parents=True, exist_ok=True)
        values = {"run_name": self.run.name, "output_dir": str(output_dir), "metrics_file": str(metrics),
                  "jax_cache": self.env.get("MXC_JAX_CACHE") or str(layout.jax_cache(self.run))}
        known = self._placeholder_values()
        args = [placeholders.fill(arg, known) for arg in contract.train.args]
        if contract.train.config_file:
            args.insert(0, str(self._place_config(contract.train.config_file)))
        args += [f"{a.key}={values[a.value]}" for a in contract.train.runtime_args]
        args += contract.train.distributed_args if (self.coordinator or self.nprocs > 1) else contract.train.single_args
        train_env = dict(env, MXC_RANK=str(self.rank))
        # what the container's envmerge.py joins: the spec's values, then what env.detect found on this node
        wanted = [*self.spec_env, *((name, env[name]) for name in self.detected if name in env)]
        launch = container.launcher(contract.container, python, image, train_env, self.run, output_dir, code_dir,
                                    wanted, {**dict(contract.env_merge), **self.detected_modes},
                                    f"{code_dir}/{contract.train.pythonpath}" if code_dir else None,
                                    Path(__file__).resolve().parent, layout.env_request(self.run, self.rank, self.attempt),
                                    workdir=contract.train.workdir, passed=contract.env_pass or [])
        launcher = launch.prefix
        exe = shutil.which(launcher[0]) if len(launcher) == 1 else None
        for mount in launch.skipped_mounts:
            self.log(f"mount {mount} skipped: its host path does not exist here (runtime.optional_mounts)")
        try:
            container.write_launch(self.run, self.rank, self.attempt, contract, launch, train_env,
                                   envboundary.crossed(self.env, contract.env_pass or []))
        except OSError as exc:
            self.log(f"cannot write the launch files: {exc}")
            return self.exit("train", 1, policy.STAGE_FAILED, f"cannot write the launch files: {exc}")
        observer = self._start_observer(contract, node_env)
        if observer is not None and contract.observability.ray:
            launcher = [node_env["MXC_AGENT_PYTHON"], "-m", "mxc.runtime.observe.ray_node_launch", "--run-dir", str(self.run),
                        "--node", self.node, "--rank", str(self.rank), "--attempt", str(self.attempt), "--", *launcher]
        target = [contract.train.script] if contract.train.script else ["-m", contract.train.module]
        argv = [*launcher, *target, *args]
        self.log(f"train: {' '.join(argv)}")
        stage = contract.stage("train")
        self.stage_name = "train"
        self.event(events.StageStart, stage="train", timeout_s=stage.timeout_s)
        self.log("stage train: start" + (f" (limit {stage.timeout_s}s)" if stage.timeout_s else ""))
        evidence = postmortem.Postmortem(run_dir=self.run, rank_dir=layout.rank_dir(self.run, self.rank), rank=self.rank,
                                         attempt=self.attempt, node=self.node, max_mb=contract.cores.max_mb,
                                         keep=contract.cores.keep, backtrace=contract.cores.backtrace,
                                         cwd=Path(code_dir) if code_dir else Path.cwd())
        evidence.begin()
        markers = procs.run_markers(self.run, self.rank, self.attempt)
        py_spy = shutil.which("py-spy") or _beside(exe, "py-spy")
        # a secret the spec passes (env.pass: [HF_TOKEN]) is masked in MaxText's event files and the log
        secrets = eventscrub.passed_secrets(train_env, contract.env_pass or [])
        scrubber = eventscrub.EventScrubber(output_dir / self.run.name / "tensorboard", secrets) if secrets else None
        trainer = Trainer(argv, train_env, code_dir, hang=contract.hang, infrastructure=contract.infrastructure,
                          metrics=metrics, hang_marker=layout.hang_marker(self.run, self.attempt), rank=self.rank,
                          timeout_s=stage.timeout_s, grace_s=stage.grace_s, stop=self.stop, markers=markers,
                          dump_stacks=lambda pids: self._dump_stacks(pids, py_spy), log=self.log,
                          started=lambda pid: livestacks.record_trainer(self.run, self.rank, self.node, self.attempt,
                                                                        pid, markers, py_spy),
                          end=self._end_of_training(contract, ckpt_dir),
                          redact=eventscrub.line_redactor(secrets), tick=scrubber.scan if scrubber else None)
        started = time.monotonic()
        self.interruptible = False
        if self.stop.requested:  # a request that came between the stages and now
            return self.exit("train", 128 + int(signal.Signals[self.stop.signal_name]), policy.CANCELLED,
                             f"stopped by {self.stop.signal_name}")
        try:
            result = trainer.run()
        finally:
            trainer.kill_all(None)  # whatever of it is left (helpers, a Ray actor's child)
            if scrubber is not None:
                scrubber.scan()  # what the writer flushed as the trainer ended
            self._stop_observer(observer)
        self.event(events.StageEnd, stage="train", rc=124 if result.timed_out else result.rc,
                   seconds=round(time.monotonic() - started, 3),
                   timed_out=result.timed_out, detail=None)
        # Always: it removes its marker; a kill for a hang or after the training was over is ours, not evidence.
        evidence.collect(0 if result.hang is not None or result.ended_after_s is not None else result.rc, exe)
        cause, detail = classify(result)
        if result.hang is not None:
            h = result.hang
            self.event(events.HangDetected, phase=h.phase, idle_seconds=round(h.idle_seconds, 1), limit_s=h.limit_s,
                       detected_by=h.detected_by, pid=result.pid, stacks=h.stacks)
            if self.nprocs > 1:  # the first rank to exit ends the step everywhere: let every rank dump its stacks first
                barrier.wait(layout.barrier(self.run, self.attempt, "hang-stacks"), self.rank, self.node, self.nprocs,
                             time.monotonic() + HANG_STACKS_WAIT_S)
        if result.rc == 0 and not result.stopped:
            self.log("training finished")
        elif cause == policy.COMPLETED:
            self.log(str(detail))  # the training is over, however the trainer went: not a failure (exit 0)
        elif result.stopped:
            self.log("training stopped on request")
        elif cause != policy.HANG and not result.timed_out:
            self.log(f"stage train failed (exit {result.rc})")
        rc = 0 if cause == policy.COMPLETED else 124 if result.timed_out else result.rc  # 124: as timeout(1) says
        return self.exit("train", rc, cause, detail, result.timed_out, result.last_step)

    def _end_of_training(self, contract: RunContract, ckpt_dir: Path) -> EndOfTraining | None:
        """When the training is over (policy.training_over on every rank), for the hang watch's exit phase."""
        final = contract.restart.final_step
        if final is None:
            return None
        return EndOfTraining(
            final_step=final, exit_grace_s=contract.hang.exit_grace_s,
            over=lambda last: policy.training_over(last, final, contract.restart.checkpointing,
                                                   lambda: checkpoints.latest_checkpoint(ckpt_dir)),
            directory=layout.barrier(self.run, self.attempt, "trained"), rank=self.rank, node=self.node,
            nprocs=self.nprocs)

    def _dump_stacks(self, pids: list[int], py_spy: str | None) -> list[tuple[str, str]]:
        dumps = stacks.dump_stacks(stacks.pythons(pids), layout.stacks(self.run), f"hang.rank-{self.rank}.attempt-{self.attempt}",
                                   tool=py_spy or stacks.AUTO)
        # faulthandler's stacks come through the trainer's output once it has died: Trainer fills those
        # files then (_fill_faulthandler), so they count as holding stacks
        kept = [d for d in dumps if d.ok or d.method == stacks.FAULTHANDLER]
        for dump in dumps:
            if dump not in kept:  # the file says why; the record lists only files that hold stacks
                self.log(f"no stacks of process {dump.pid} ({dump.method}): see {dump.path}")
        return [(str(d.path), d.method) for d in kept]

    def _start_observer(self, contract: RunContract, env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        """mxc's node observer (exporter, Ray node; Prometheus on rank 0) where the batch side asks for it."""
        agent = env.get("MXC_AGENT_PYTHON")
        if not (contract.observability.enabled and env.get("MXC_OBSERVE_NODES") == "1" and agent):
            return None
        argv = [agent, "-m", "mxc.runtime.observe.node_observer", "--run-dir", str(self.run), "--bundle-dir",
                str(self.bundle), "--node", self.node, "--rank", str(self.rank), "--attempt", str(self.attempt)]
        if self.rank == 0:
            argv.append("--head")
        if shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]  # dies with this rank
        log_path = layout.observability(self.run) / f"node-{self.node}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.log(f"observability: node observer pid {proc.pid} (log: observability/node-{self.node}.log)")
        return proc

    def _stop_observer(self, proc: subprocess.Popen[bytes] | None) -> None:
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(OBSERVER_STOP_S)  # rank 0: bounded wait for Prometheus' last scrape
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def classify(result: Result) -> tuple[str, str | None]:
    """The rank-level cause of a train stage's end (policy.CAUSES) and what shows it."""
    if result.finished_step is not None:  # the training was over on every rank before the trainer ended
        return policy.after_training(result.rc, result.ended_after_s, result.finished_step)
    if result.hang is not None:
        return policy.HANG, f"{result.hang.phase}: no progress for {result.hang.idle_seconds:.0f}s"
    if result.stopped:
        return policy.CANCELLED, "stopped on request"
    if result.timed_out:
        return policy.TRAIN_TIMEOUT, "runtime.timeouts.train"
    if result.rc == 0:
        return policy.COMPLETED, None
    if result.infra is not None:
        return policy.INFRASTRUCTURE, f"{result.infra.cause}: {result.infra.text}"
    if result.rc > 128 and result.rc - 128 in [s.value for s in KILLED_SIGNALS]:
        return policy.KILLED, signal.Signals(result.rc - 128).name
    why = f"exit {result.rc}" + (f" ({signal.Signals(result.rc - 128).name})" if _is_signal(result.rc) else "")
    return (policy.APPLICATION_ERROR if result.first_step_seen else policy.CONFIG_ERROR), why


def _is_signal(rc: int) -> bool:
    try:
        signal.Signals(rc - 128)
    except ValueError:
        return False
    return rc > 128


def _beside(exe: str | None, tool: str) -> str | None:
    if not exe:
        return None
    candidate = Path(exe).with_name(tool)
    return str(candidate) if candidate.exists() else None


def run_limited(argv: list[str], env: Mapping[str, str], deadline: float, grace_s: float) -> tuple[int, bool]:
    """Run a stage's child process until it ends or the monotonic deadline passes (then SIGTERM,
    SIGKILL after the grace); (exit code as a shell reports it, timed out). A Stopped raised by a
    signal handler while waiting stops the child the same way, then propagates."""
    proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL)
    try:
        # Waits on the child itself, not on a polling tick: a 50 ms preflight must not cost 100 ms
        # of every attempt's time to first step.
        remaining = deadline - time.monotonic()
        try:
            code = proc.wait(None if remaining == float("inf") else max(remaining, 0.0))
        except subprocess.TimeoutExpired:
            _end(proc, grace_s)
            return 124, True
        return (128 - code if code < 0 else code), False
    except BaseException:
        _end(proc, grace_s)
        raise


def _end(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(env: Mapping[str, str] | None = None) -> int:
    return Rank(os.environ if env is None else env).main()
