"""The train stage: start the trainer, pass its output on, watch it, stop it.

The trainer's stdout and stderr come through a pipe into this program, which writes every line
to its own stdout unchanged (srun labels it with the rank; locally it lands in train.log) and
reads it on the way:

* the hang watch (hangwatch.py) is fed every line, every completed-step line and every growth of
  the attempt's metrics file; a hang here, or another rank's hang marker (layout.hang_marker),
  makes this rank dump its trainer's stacks, kill it and report ``hang``;
* the first line matching one of run.json's infrastructure patterns (from the triage catalog) is
  kept: a failure after it is the infrastructure's, which the restart policy requeues;
* the last completed step is kept for the exit event;
* once the training is over on every rank (``EndOfTraining``: the final step logged and, with
  checkpointing, its checkpoint finished, on each rank), the hang watch gives the trainer
  ``runtime.exit_grace`` to exit and then ends it; a trainer that exits non-zero after its final
  step waits (as long) for the other ranks to get there too. Either way the training completed
  (policy.after_training): a slow or failed shut-down is never a hang, a requeue or a retrain.

A stop request (SIGTERM, SIGINT, USR2 to the node program) becomes SIGTERM for the trainer, which
MaxText answers with a checkpoint; SIGKILL follows after the stage's grace. The trainer starts
with USR2 ignored: srun may deliver USR2 to every process of the task, and Python would die of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable

from . import barrier, procs
from .contract import Hang, InfraPattern
from .hangwatch import EXIT, SETTING, HangWatch, Hung
from .stacks import FAULTHANDLER

POLL_S = 0.2
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


@dataclass
class StopRequest:
    """Set from signal handlers (main thread); read by the stage loops."""

    requested: bool = False
    signal_name: str = ""

    def request(self, name: str) -> None:
        if not self.requested:
            self.requested, self.signal_name = True, name


@dataclass(frozen=True)
class InfraLine:
    cause: str
    text: str


@dataclass(frozen=True)
class HangInfo:
    phase: str
    idle_seconds: float
    limit_s: int
    detected_by: int
    stacks: list[str]


@dataclass
class Result:
    rc: int  # as a shell reports it: 128+N for a signal
    timed_out: bool = False
    stopped: bool = False  # a stop was requested while it ran
    hang: HangInfo | None = None
    infra: InfraLine | None = None
    first_step_seen: bool = False
    last_step: int | None = None
    pid: int | None = None
    finished_step: int | None = None  # the final step, when the training was over on every rank before the trainer ended
    ended_after_s: int | None = None  # mxc ended the trainer this long after that (runtime.exit_grace)


@dataclass
class EndOfTraining:
    """Whether the training is over on every rank. Each rank decides for itself (``over``:
    policy.training_over on its last step) and says so with a file in ``directory`` (one per rank,
    as the barrier's, in the shared run directory); the training is over when every rank's is there."""

    final_step: int
    exit_grace_s: int
    over: Callable[[int | None], bool]
    directory: Path
    rank: int
    node: str
    nprocs: int
    here: bool = False  # this rank's training is over (its file is written)

    def everywhere(self, last_step: int | None) -> bool:
        if not self.here:
            if not self.over(last_step):
                return False
            try:
                barrier.arrive(self.directory, self.rank, self.node)
            except OSError:
                return False  # the shared directory cannot be written: the limits of a training in progress hold
            self.here = True
        return barrier.arrived(self.directory).issuperset(range(self.nprocs))


class InfraMatcher:
    """The first infrastructure pattern a line matches (one prefilter search per line)."""

    def __init__(self, patterns: list[InfraPattern]) -> None:
        self.patterns = [(p.cause, re.compile(p.regex)) for p in patterns]
        joined = "|".join(f"(?:{_NAMED_GROUP.sub('(?:', p.regex)})" for p in patterns)
        self.prefilter = re.compile(joined) if patterns else None

    def match(self, text: str) -> InfraLine | None:
        if self.prefilter is None or not self.prefilter.search(text):
            return None
        for cause, regex in self.patterns:
            if regex.search(text):
                return InfraLine(cause, text.strip()[:1000])
        return None


@dataclass
class _Seen:
    """What the output thread learnt (read by the main loop under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    last_output: float | None = None
    last_step_at: float | None = None
    last_step: int | None = None
    infra: InfraLine | None = None
    capture: list[str] | None = None  # lines kept while stacks are being dumped (faulthandler)


def _pump(pipe: IO[bytes], out: IO[bytes], seen: _Seen, step_line: re.Pattern[str], infra: InfraMatcher,
          clock: Callable[[], float], redact: Callable[[bytes], bytes] | None = None) -> None:
    for raw in iter(lambda: pipe.readline(1 << 16), b""):
        if redact is not None:  # a secret the spec passes never reaches the log (eventscrub.py)
            raw = redact(raw)
        try:
            out.write(raw)
            out.flush()
        except (OSError, ValueError):
            pass  # our own output is gone (the log's reader died): keep draining the trainer
        text = raw.decode("utf-8", "replace")
        now = clock()
        step = step_line.search(text)
        hit = None if step else infra.match(text)
        with seen.lock:
            seen.last_output = now
            if step:
                seen.last_step_at = now
                groups = step.groupdict()
                seen.last_step = int(groups.get("step") or step.group(1))
            if hit is not None and seen.infra is None:
                seen.infra = hit
            if seen.capture is not None and len(seen.capture) < 20000:
                seen.capture.append(text)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _rc(code: int) -> int:
    return 128 - code if code < 0 else code


class Trainer:
    """Runs one trainer to its end (``run``); see the module docstring."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str | None, *, hang: Hang,
                 infrastructure: list[InfraPattern], metrics: Path, hang_marker: Path, rank: int, timeout_s: int,
                 grace_s: int, stop: StopRequest, markers: list[str],
                 dump_stacks: Callable[[list[int]], list[tuple[str, str]]],
                 log: Callable[[str], None], output: IO[bytes] | None = None,
                 clock: Callable[[], float] = time.monotonic, started: Callable[[int], None] | None = None,
                 end: EndOfTraining | None = None, redact: Callable[[bytes], bytes] | None = None,
                 tick: Callable[[], object] | None = None) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.hang, self.metrics, self.hang_marker, self.rank = hang, metrics, hang_marker, rank
        self.timeout_s, self.grace_s, self.stop, self.markers = timeout_s, grace_s, stop, markers
        self.infra = InfraMatcher(infrastructure)
        self.dump_stacks, self.log = dump_stacks, log
        self.output = output if output is not None else sys.stdout.buffer
        self.clock = clock
        self.started = started  # told the trainer's pid once it runs (the record `mxc stacks` finds it by)
        self.end = end  # None: the spec does not fix the number of steps, so no end is known
        self._faulthandler_files: list[str] = []  # stack files to fill from the trainer's own output
        self.redact = redact  # applied to each output line before it is passed on
        self.tick = tick  # called at each look while the trainer runs (eventscrub.py)

    def run(self) -> Result:
        previous = signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # inherited through exec
        try:
            proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        finally:
            signal.signal(signal.SIGUSR2, previous)
        assert proc.stdout is not None
        if self.started is not None:
            try:
                self.started(proc.pid)
            except OSError as exc:  # a record for on-demand stacks is no reason to stop a training
                self.log(f"cannot record the trainer's pid: {exc}")
        seen = _Seen()
        pump = threading.Thread(target=_pump, name="mxc-trainer-output", daemon=True,
                                args=(proc.stdout, self.output, seen, re.compile(self.hang.step_pattern), self.infra,
                                      self.clock, self.redact))
        pump.start()
        result = self._watch(proc, seen)
        pump.join(timeout=30)
        with seen.lock:
            result.infra = seen.infra
            result.last_step = seen.last_step
            result.first_step_seen = seen.last_step is not None or result.first_step_seen
            captured = "".join(seen.capture or [])
        result.pid = proc.pid
        self._fill_faulthandler(captured)
        if result.rc != 0 and result.finished_step is None and self._failure_after_the_end(result):
            assert self.end is not None
            result.finished_step = self.end.final_step
        return result

    def _failure_after_the_end(self, result: Result) -> bool:
        """A trainer that failed by itself after this rank's training was over: whether the training
        is over on every rank, waiting for the others at most runtime.exit_grace (they may be a
        moment behind; a hang or a stop on the way is an answer too: no)."""
        if self.end is None or result.stopped or result.timed_out or result.hang is not None:
            return False
        deadline = self.clock() + self.end.exit_grace_s
        while not self.end.everywhere(result.last_step):
            if not self.end.here or self.stop.requested or self._marker() is not None or self.clock() >= deadline:
                return False
            time.sleep(POLL_S)
        return True

    def _fill_faulthandler(self, captured: str) -> None:
        """Without py-spy, SIGABRT made faulthandler print the stacks into the trainer's output,
        which came through this program: keep them in the stack files."""
        begin = captured.find("Fatal Python error")
        for path in self._faulthandler_files:
            with contextlib.suppress(OSError):
                Path(path).write_text("# faulthandler (SIGABRT); the trainer's output from its first fatal line\n"
                                      + (captured[begin:] if begin >= 0 else captured), encoding="utf-8")

    def _watch(self, proc: subprocess.Popen[bytes], seen: _Seen) -> Result:
        started = self.clock()
        watch = HangWatch(self.hang.init_timeout_s, self.hang.step_timeout_s, started, self.hang.exit_grace_s)
        metrics_size = _size(self.metrics)
        term_at: float | None = None
        killed = False
        result = Result(rc=0)
        while True:
            code = proc.poll()
            if code is not None:
                result.rc = _rc(code)
                result.first_step_seen = watch.first_step_seen
                return result
            now = self.clock()
            with seen.lock:
                if seen.last_output is not None:
                    watch.output(seen.last_output)
                if seen.last_step_at is not None:
                    watch.step(seen.last_step_at)
                last_step = seen.last_step
            if self.end is not None and watch.phase != EXIT and self.end.everywhere(last_step):
                watch.finished(now)
                result.finished_step = self.end.final_step
                self.log(f"training over on every rank (final step {self.end.final_step}): the trainer has "
                         f"{self.end.exit_grace_s}s to exit ({SETTING[EXIT]})")
            size = _size(self.metrics)
            if size > metrics_size:
                metrics_size = size
                watch.step(now)
            if self.stop.requested and term_at is None:
                result.stopped = True
                self._signal(proc, signal.SIGTERM)
                term_at = now
            elif self.timeout_s and term_at is None and now - started >= self.timeout_s:
                result.timed_out = True
                self.log(f"stage train timed out after {self.timeout_s}s (runtime.timeouts.train)")
                self._signal(proc, signal.SIGTERM)
                term_at = now
            elif term_at is not None and not killed and now - term_at >= self.grace_s:
                self.kill_all(proc.pid)
                killed = True
            if result.hang is None and term_at is None:
                hung = watch.check(now)
                other = None if watch.phase == EXIT else self._marker()  # the others' training is over too
                if hung is not None and not hung.is_hang:
                    result.ended_after_s = hung.limit_s
                    self.log(f"the trainer has not exited {hung.limit_s}s after the training was over "
                             f"({SETTING[EXIT]}): ending it; the training completed")
                    self.kill_all(proc.pid)
                    killed = True
                    term_at = now
                elif hung is not None or other is not None:
                    result.hang = self._hung(proc, seen, hung, other, watch)
                    killed = True
                    term_at = now
            if self.tick is not None:
                self.tick()
            time.sleep(POLL_S)

    def _signal(self, proc: subprocess.Popen[bytes], signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    def kill_all(self, pid: int | None) -> None:
        """SIGKILL to the trainer and everything of it (its descendants, its marked processes)."""
        procs.kill_all(procs.trainer_processes(pid, self.markers))

    def _marker(self) -> dict[str, object] | None:
        try:
            data = json.loads(self.hang_marker.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _hung(self, proc: subprocess.Popen[bytes], seen: _Seen, hung: Hung | None, other: dict[str, object] | None,
              watch: HangWatch) -> HangInfo:
        if other is None and hung is not None:
            other = {"rank": self.rank, "phase": hung.phase, "idle_seconds": round(hung.idle_seconds, 1),
                     "limit_s": hung.limit_s}
            self._write_marker(other)
            limit = SETTING[hung.phase]
            what = "no training output" if hung.phase == "init" else "no training step"
            when = " before the first step" if hung.phase == "init" else ""
            self.log(f"{what} for {hung.idle_seconds:.0f}s{when} ({limit} {hung.limit_s}s): hung; "
                     "dumping stacks, killing it")
        else:
            assert other is not None
            self.log(f"rank {other.get('rank')} found the training hung: dumping stacks, killing it")
        with seen.lock:
            seen.capture = []
        stacks: list[str] = []
        try:
            for path, method in self.dump_stacks(procs.trainer_processes(proc.pid, self.markers)):
                stacks.append(path)
                if method == FAULTHANDLER:
                    self._faulthandler_files.append(path)
        except Exception as exc:  # evidence is best effort; the kill is not
            self.log(f"stack dump failed: {exc}")
        self.kill_all(proc.pid)
        phase = hung.phase if hung is not None else watch.phase
        idle = hung.idle_seconds if hung is not None else float(str(other.get("idle_seconds", 0)))
        limit_s = hung.limit_s if hung is not None else int(str(other.get("limit_s", 0)))
        return HangInfo(phase, idle, limit_s, int(str(other.get("rank", self.rank))), stacks)

    def _write_marker(self, data: dict[str, object]) -> None:
        self.hang_marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.hang_marker.with_name(f".{self.hang_marker.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data) + "\n")
        try:
            os.link(str(tmp), str(self.hang_marker))  # the first rank's marker wins; never overwritten
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
