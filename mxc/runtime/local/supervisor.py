"""The restart loop around one run's training process.

Starts the bundle's ``entrypoint.sh`` through a ``Launcher`` (attempt 0), follows its log
for progress, and when training dies (non-zero exit or a signal) starts it again, up to
``restart.max`` times. MaxText resumes by itself from the newest finished checkpoint in
the run's output directory (same ``run_name`` and ``base_output_directory``), so a restart
is simply the same command with ``MXC_ATTEMPT`` incremented; the per-attempt metrics files
are merged afterwards (``metrics_merge``).

Whether an attempt is restarted is the restart policy's decision (mxc/node/policy.py, the same
function the batch side of a Slurm job uses; docs/restarts.md), taken on the cause the rank
wrote into its exit event (``ranks/0/events.jsonl``): a hang, an infrastructure failure or a kill
from outside restart; an application or configuration error, a failed stage or a train-stage
timeout do not. Ctrl-C, SIGTERM or SIGHUP stop the run: SIGTERM to the attempt's process
group, SIGKILL after a grace period (or at once on a second Ctrl-C); the record says
``cancelled``. Every state change rewrites ``record.json`` atomically; the last write
sets ``final``.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from mxc.node import events, layout, outcome, policy
from mxc.node.checkpoints import latest_checkpoint  # the one checkpoint scan (also the batch side's)
from mxc.node.contract import Restart
from mxc.runtime import detections
from mxc.runtime.hooks import Launcher, RunObserver, TrainingProcess
from mxc.runtime.local.progress import ProgressBar
from mxc.runtime.local.startup import StartupTimes
from mxc.runtime.logs.metrics_merge import write_merged
from mxc.runtime.logs.trainlog import LogFollower, StepEvent
from mxc.runtime.record import Attempt, RunRecord, now_iso
from mxc.runtime.rundir import RunDir

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
FATAL_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT,
                           signal.SIGILL, signal.SIGFPE, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                           signal.SIGUSR2, signal.SIGQUIT, signal.SIGPIPE})


def signal_of(exit_code: int) -> str | None:
    """The signal that ended a process: negative codes (killed directly) or 128+N from a shell."""
    number = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    if number and number in {s.value for s in FATAL_SIGNALS}:
        return signal.Signals(number).name
    return None


@dataclass
class SupervisorConfig:
    argv: list[str]
    env: dict[str, str]  # complete environment of the training process, MXC_ATTEMPT excepted
    cwd: Path
    restart: Restart  # the bundle's restart numbers (run.json)
    total_steps: int | None
    checkpoints: Path  # <base_output_directory>/<run_name>/checkpoints
    grace_seconds: float = 30.0
    poll_seconds: float = 0.1
    before_save: Callable[[RunRecord], None] | None = None  # may add facts to the record before each write
    on_steps: Callable[[list[StepEvent]], None] | None = None  # new completed steps, as they are logged
    before_attempt: Callable[[], str | None] | None = None  # why the next attempt must not start (a changed bundle)


@dataclass
class Supervisor:
    run: RunDir
    record: RunRecord
    config: SupervisorConfig
    launcher: Launcher
    observers: Sequence[RunObserver] = ()
    progress: ProgressBar | None = None
    _stop_signal: int | None = field(default=None, init=False)
    _stop_count: int = field(default=0, init=False)
    _process: TrainingProcess | None = field(default=None, init=False)
    _startup: StartupTimes = field(default_factory=StartupTimes, init=False)

    # ---- public

    def run_to_end(self) -> RunRecord:
        """Run attempts until success, failure past restart.max, or cancellation; returns the final record."""
        follower = LogFollower(self.run.log)
        with self._stop_handlers():
            try:
                self._set(status="running")
                self._notify("on_start")
                attempt = 0
                while True:
                    if self._stop_signal is not None:
                        self._finish("cancelled", None, f"cancelled by {signal.Signals(self._stop_signal).name}")
                        break
                    refusal = self.config.before_attempt() if self.config.before_attempt else None
                    if refusal:
                        self._refuse(attempt, refusal)
                        break
                    code = self._attempt(attempt, follower)
                    if self._stop_signal is not None:
                        self._finish("cancelled", code, f"cancelled by {signal.Signals(self._stop_signal).name}")
                        break
                    if code == 0:  # with the rank's note when its trainer went badly after the training was over
                        self._finish("succeeded", 0, self.record.attempts[-1].reason)
                        break
                    decision = self._decide(attempt, code, follower)
                    if decision.action == policy.DONE:
                        self._finish("succeeded" if code == 0 else "failed", code, None if code == 0 else decision.reason)
                        break
                    if decision.action == policy.STOP:
                        self._finish("failed", code, decision.reason)
                        break
                    attempt += 1
                    self.record.restarts = attempt
                    self._save()
            except BaseException as exc:
                self._kill_now()
                if not self.record.final:
                    status = "cancelled" if isinstance(exc, KeyboardInterrupt) else "failed"
                    with contextlib.suppress(OSError):  # a full disk: the error to report is the one raised
                        self._finish(status, self.record.exit_code, f"mxc supervisor: {type(exc).__name__}: {exc}")
                raise
            finally:
                self.launcher.close()
                if self.progress:
                    self.progress.close()
        return self.record

    # ---- one attempt

    def _attempt(self, number: int, follower: LogFollower) -> int:
        resume = latest_checkpoint(self.config.checkpoints)
        attempt = Attempt(number=number, started=now_iso(), resumed_from_step=resume)
        self.record.attempts.append(attempt)
        self._save()
        how = f"resuming from checkpoint {resume}" if resume is not None else "fresh start"
        self._log_line(f"[mxc] attempt {number}: start ({how}) at {attempt.started}")
        if self.progress:
            self.progress.set_status("starting" if number == 0 else f"restarting from checkpoint {resume}", number)
        follower.start_at_end()
        follower.reset_attempt()
        self._startup.attempt_started()
        env = {**self.config.env, "MXC_ATTEMPT": str(number)}
        process = self.launcher.start(self.config.argv, env, self.config.cwd, self.run.log)
        self._process = process
        self._notify("on_attempt", process)
        code = self._watch(process, follower)
        self._process = None
        attempt.ended = now_iso()
        attempt.exit_code = code
        attempt.signal = signal_of(code)
        attempt.last_step = follower.last_step.step if follower.last_step and follower.steps_seen else None
        if follower.restored_step is not None:
            attempt.resumed_from_step = follower.restored_step
        attempt.reason = None if code == 0 else f"exit {code}" + (f" ({attempt.signal})" if attempt.signal else "")
        self._record_cause(number, code, attempt)
        self._merge_metrics()
        self._log_line(f"[mxc] attempt {number}: exit {code}" + (f" ({attempt.signal})" if attempt.signal else ""))
        self._save()
        self._notify("on_attempt_end", code)
        return code

    def _record_cause(self, number: int, code: int, attempt: Attempt) -> None:
        """Why the attempt ended, as its rank wrote it (before observers hear of the end: a hang is an alert)."""
        ended = outcome.of_attempt(self.run.path, number, 1)
        cause = policy.COMPLETED if code == 0 and ended.cause in (policy.COMPLETED, policy.STAGE_FAILED) else ended.cause
        attempt.cause = cause
        if cause == policy.COMPLETED and ended.detail:
            attempt.reason = ended.detail  # policy.after_training's note: completed, however the trainer went
        if cause == policy.HANG:
            self._mark_hung(number, attempt)

    def _refuse(self, number: int, reason: str) -> None:
        """An attempt that must not start: recorded with its reason, and the run fails (no restart
        could succeed: whatever made it unsafe stays until someone looks)."""
        when = now_iso()
        self.record.attempts.append(Attempt(number=number, started=when, ended=when, reason=f"not started: {reason}"))
        self._log_line(f"[mxc] attempt {number}: not started: {reason}")
        self._finish("failed", None, f"attempt {number} not started: {reason}")

    def _watch(self, process: TrainingProcess, follower: LogFollower) -> int:
        term_sent_at: float | None = None
        killed = False
        while True:
            code = process.poll()
            events = follower.poll()
            if code is not None:
                events += follower.poll()
            for phase in follower.take_phases():
                self._startup.phase(phase, self.record)
                if self.progress:
                    self.progress.set_status(phase)
            if events:
                if self._startup.first_step(self.record):
                    self._save()  # time to first step (and compile time) in the record while the run goes on
                if self.progress:
                    self.progress.update(events)
                if self.config.on_steps:
                    self.config.on_steps(events)
            elif self.progress:
                self.progress.tick()  # the elapsed time keeps counting while nothing is logged
            if code is not None:
                return code
            if self._stop_signal is not None:
                now = time.monotonic()
                if term_sent_at is None:
                    process.send_signal(signal.SIGTERM)
                    term_sent_at = now
                    if self.progress:
                        self.progress.set_status("stopping")
                elif not killed and (self._stop_count > 1 or now - term_sent_at > self.config.grace_seconds):
                    process.send_signal(signal.SIGKILL)
                    killed = True
            time.sleep(self.config.poll_seconds)

    def _decide(self, number: int, code: int, follower: LogFollower) -> policy.Decision:
        """The restart policy's decision on this attempt, from the cause its rank recorded. The
        returned reason of a stop says what happened and why it is not restarted."""
        ended = outcome.of_attempt(self.run.path, number, 1)
        cause = self.record.attempts[-1].cause or ended.cause
        restart = self.config.restart
        decision = policy.decide(policy.Situation(
            cause=cause, restarts=number, restart_max=restart.max, checkpoint=latest_checkpoint(self.config.checkpoints),
            final_step=restart.final_step, checkpointing=restart.checkpointing))
        if decision.action != policy.STOP:
            return decision
        sig = signal_of(code)
        what = f"training exited with {code}" + (f" ({sig})" if sig else "")
        why = None if sig else follower.failure_reason()
        detail = f": {why}" if why else (f": {ended.detail}" if ended.detail else "")
        return policy.Decision(decision.action, f"{what}: {self._named_cause(cause, detail)}; not restarted: {decision.reason}")

    def _named_cause(self, cause: str, detail: str) -> str:
        """What failed, in the words of `mxc triage` (the same verdict, so the run's summary and triage
        never name two causes: the restart policy's cause only says what a restart can do); the
        policy's cause when triage cannot run; the last error line when it found nothing it knows."""
        try:
            from mxc.runtime.triage import classify

            verdict = classify(self.run.path, self.record.model_copy(update={"status": "failed"}))
        except Exception as exc:  # the record must be written whatever triage makes of the run
            print(f"mxc: warning: triage failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            verdict = None
        if verdict is None or verdict.cause == "none":
            return f"{cause.replace('_', ' ')}{detail}"
        return verdict.summary() if verdict.first_error is not None else verdict.cause_line() + detail

    def _mark_hung(self, number: int, attempt: Attempt) -> None:
        found, _ = events.read(layout.rank_events(self.run.path, 0), events.RANK_EVENTS)
        hangs = [e for e in found if isinstance(e, events.HangDetected) and e.attempt == number]
        if not hangs:
            return
        hang = hangs[-1]
        what = "no training output" if hang.phase == "init" else "no training step"
        limit = "runtime.hang.init_timeout" if hang.phase == "init" else "runtime.hang.step_timeout"
        attempt.hung = True
        attempt.idle_seconds = hang.idle_seconds
        attempt.stacks = list(hang.stacks)
        attempt.reason = f"hung: {what} for {hang.idle_seconds:.0f}s ({limit} {hang.limit_s}s); killed; stacks in " \
                         f"{layout.stacks(self.run.path)}"

    # ---- record, log, observers

    def _finish(self, status: str, code: int | None, message: str | None) -> None:
        self._merge_metrics()
        self.record.detected = detections.collect(self.run.path) or self.record.detected
        last = self.record.attempts[-1] if self.record.attempts else None
        if status == "failed" and last is not None and last.hung:
            status = "hung"  # the node program's hang watch stopped the last attempt
            why = (last.reason or "").removeprefix("hung: ")
            message = f"{why}; {message}" if message else why
        if status == "cancelled" and self._stop_signal is not None:
            self.record.cancelled_by = signal.Signals(self._stop_signal).name
            if (self.run.path / layout.CANCEL_REQUEST).exists():  # mxc cancel says so before its SIGTERM
                self.record.cancelled_by, message = "mxc cancel", "cancelled with mxc cancel"
        self.record.status = status  # type: ignore[assignment]
        self.record.exit_code = code
        self.record.message = message
        self.record.ended = now_iso()
        self.record.final = True
        self._log_line(f"[mxc] run {status}" + (f": {message}" if message else ""))
        self._save()
        self._notify("on_end")

    def _set(self, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(self.record, key, value)
        self._save()

    def _save(self) -> None:
        if self.config.before_save:
            self.config.before_save(self.record)
        self.record.save(self.run.record)

    def _merge_metrics(self) -> None:
        result = write_merged(self.run.metrics_parts, self.run.metrics)
        if result.steps:
            self.record.steps = result.steps
            self.record.last_loss = result.last_loss

    def _log_line(self, text: str) -> None:
        with open(self.run.log, "a", encoding="utf-8") as fh:
            fh.write(text + "\n")

    def _notify(self, hook: str, *extra: Any) -> None:
        for observer in self.observers:
            try:
                if hook == "on_attempt_end":
                    observer.on_attempt_end(self.run, self.record, extra[0])
                else:
                    getattr(observer, hook)(self.run, self.record, *extra)
            except Exception as exc:  # observers must never fail the run
                print(f"mxc: warning: {type(observer).__name__}.{hook} failed: {exc}", file=sys.stderr)

    # ---- signals

    @contextlib.contextmanager
    def _stop_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

        def handler(signum: int, frame: FrameType | None) -> None:
            self._stop_count += 1
            if self._stop_signal is None:
                self._stop_signal = signum
            if self._stop_count > 1 and self._process is not None:
                self._process.send_signal(signal.SIGKILL)

        for sig in STOP_SIGNALS:
            signal.signal(sig, handler)
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    def _kill_now(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                self._process.wait(timeout=10)

