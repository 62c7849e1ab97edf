"""A Slurm job reports for itself: its alerts and its end, from the batch side.

No mxc process follows a Slurm job, so the batch side (batch.py) is the one place that sees every
start, requeue, hang and end as it happens, at 3 a.m. as at noon. Through this module it

* posts the spec's chat alerts (notify.py, the same sender and once-only keys as mxc's:
  ``start``, ``restart:N``, ``hang:N``, ``end``), each with the run id, spec name, bundle prefix,
  Slurm job, cause, rank and node, step, and the line ``mxc triage`` starts with;
* writes the job's end into the run directory: ``end.json`` (what it decided) and the end fields
  of ``record.json`` (status, ended, exit code, message, steps), under the lock mxc takes on the
  run (``.slurm.lock``). ``final`` stays for mxc (``mxc watch``, ``mxc cancel``, or the first look
  after) to set once it has folded every attempt and Slurm's accounting into the record.

The webhook secret is read once, at the start, from where the spec names it (a variable exported
into the job, or a file of the user's on the shared file system, mode 600); the batch side keeps
it out of the ranks' environment, and nothing here writes it anywhere (alert texts and
``notify.log`` lines are redacted). A failed alert or write never fails the job: every entry
point here returns normally.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

from . import atomicfile, events, layout, notify
from .contract import RunContract
from .secretscan import redact_secrets

END = "end.json"  # the job's own end: status, exit code, cause, where, step (layout of the run directory)
RECORD = "record.json"
LOCK = ".slurm.lock"  # mxc's lock on a Slurm run (mxc/runtime/slurm/backend.py)
LOCK_WAIT_S = 60.0


def iso(epoch: float) -> str:
    """The record's time format: UTC, milliseconds, ``Z`` (mxc/runtime/record.py iso_time)."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def config_of(contract: RunContract) -> notify.NotifyConfig | None:
    n = contract.notify
    if n is None:
        return None
    return notify.NotifyConfig(format=n.format, secret_env=n.secret_env, secret_file=n.secret_file, chat_id=n.chat_id,
                               api_url=n.api_url, events=tuple(n.events), timeout=n.timeout_s)


def last_metrics(run: Path, attempt: int) -> tuple[int | None, float | None]:
    """(steps done, last loss) from rank 0's metrics file of ``attempt`` (MaxText's metrics_file lines)."""
    try:
        lines = layout.metrics_file(run, attempt, 0).read_text("utf-8", errors="replace").splitlines()
    except OSError:
        return None, None
    for raw in reversed(lines):
        try:
            data = json.loads(raw)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("step"), (int, float)):
            loss = data.get("learning/loss")
            return int(data["step"]) + 1, float(loss) if isinstance(loss, (int, float)) else None
    return None, None


class JobReport:
    """What the batch side of one start of a job reports: alerts, and the end of the run."""

    def __init__(self, run: Path, bundle: Path, contract: RunContract | None, env: Mapping[str, str],
                 job_id: str, restarts: int) -> None:
        self.run = run
        self.bundle = bundle
        self.run_id = env.get("MXC_RUN_ID") or run.name
        self.name = contract.name if contract else "?"
        self.restart_max = contract.restart.max if contract else 0
        self.job_id = job_id
        self.restarts = restarts
        self.env = dict(env)
        self.config = config_of(contract) if contract else None
        self.secret: str | None = None
        if self.config is not None:
            try:
                self.secret = notify.read_secret(self.config, env)
            except notify.SecretMissing:
                self.secret = None  # each alert says why in notify.log (send reads it again and fails)
            except Exception:
                self.secret = None

    def scrub(self, text: str) -> str:
        """``text`` with anything secret-shaped, and this job's webhook secret in every form, replaced by ***."""
        text = redact_secrets(text)
        if self.secret and self.config is not None:
            text = notify.redact(text, self.secret, self.config.format)
        return text

    def rank_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The ranks' environment: the batch side's, less the webhook secret's variable (training never needs it)."""
        out = dict(env)
        if self.config is not None and self.config.secret_env:
            out.pop(self.config.secret_env, None)
        return out

    # ---- alerts

    def _head(self) -> str:
        return (f"run {self.run_id} (spec {self.name}), bundle {self.bundle.name[:12]}, "
                f"Slurm job {self.job_id or '?'}")

    def alert(self, event: str, text: str, key: str | None = None) -> None:
        """Post ``text`` for ``event`` once (``key``); never raises."""
        if self.config is None:
            return
        try:
            notify.deliver(self.config, event, self.run, self.scrub(text), key, self.env, self.secret)
        except Exception as exc:  # an alert must never fail the job
            with contextlib.suppress(Exception):
                notify.log(self.run, f"{event}: not sent ({type(exc).__name__})")

    def started(self, nodes: str) -> None:
        """``start`` on the first start of the job; ``restart`` (key restart:N) on every later one."""
        if self.restarts == 0:
            self.alert("start", f"mxc: {self._head()} started on {nodes or '?'}")
            return
        before = self._previous_decision()
        why = f" after {before.cause}" if before is not None else " after a requeue by Slurm (node failure or preemption)"
        resume = ""
        if before is not None:
            resume = (f", resuming from checkpoint {before.checkpoint}" if before.checkpoint is not None
                      else ", from the start (no checkpoint)")
        self.alert("restart", f"mxc: {self._head()} restarting (restart {self.restarts} of at most "
                              f"{self.restart_max}){why}{resume}, on {nodes or '?'}", key=f"restart:{self.restarts}")

    def _previous_decision(self) -> Any:
        found, _ = events.read(layout.batch_events(self.run), events.BATCH_EVENTS)
        decisions = [e for e in found if isinstance(e, events.Decision) and e.attempt < self.restarts]
        return decisions[-1] if decisions else None

    def _where(self, cause: str, rank: int | None, node: str | None, step: int | None, detail: str | None) -> str:
        where = f" on rank {rank}" if rank is not None else ""
        where += f" (node {node})" if node else ""
        text = f"\ncause: {cause}{where}" + (f", step {step}" if step is not None else ", before the first step")
        if detail:
            text += f"\nfirst error: {' '.join(detail.split())[:300]}"
        return text + f"\nmore: mxc triage {self.run_id}"

    def hung(self, rank: int | None, node: str | None, step: int | None, detail: str | None, action: str,
             reason: str) -> None:
        """``hang`` (key hang:N) when the hang watch stopped this attempt, whatever the policy does next."""
        head = f"run {self.run_id}: hung, attempt {self.restarts + 1}"
        self.alert("hang", f"mxc: {head}\n{self._head()}: {action}: {reason}"
                           + self._where("hang", rank, node, step, detail), key=f"hang:{self.restarts}")

    # ---- the end

    def ended(self, status: str, rc: int, message: str, cause: str | None = None, rank: int | None = None,
              node: str | None = None, detail: str | None = None, step: int | None = None) -> None:
        """The job's end: ``end.json``, record.json's end fields, then the ``finish``/``failure`` alert (key end)."""
        steps, loss = last_metrics(self.run, self.restarts)
        step = step if step is not None else (steps - 1 if steps else None)
        now = time.time()
        message, detail = self.scrub(message), self.scrub(detail) if detail else None
        with contextlib.suppress(Exception):
            atomicfile.write_text(self.run / END, json.dumps({
                "job_id": self.job_id, "attempt": self.restarts, "status": status, "exit_code": rc, "ended": iso(now),
                "message": message, "cause": cause, "rank": rank, "node": node, "step": step,
                "detail": detail, "steps": steps, "last_loss": loss,
            }, indent=2) + "\n")
        with contextlib.suppress(Exception):
            self._record_end(status, rc, iso(now), message, steps, loss)
        code = f", exit {rc}" if rc else ""
        attempts = f", attempt {self.restarts + 1} of {self.restarts + 1}" if self.restarts else ""
        head = f"run {self.run_id}: {status}{code}{attempts}"  # the line `mxc triage` starts with
        if status == "succeeded":
            done = f", {steps} steps" if steps else ""
            done += f", last loss {loss:.4f}" if loss is not None else ""
            self.alert("finish", f"mxc: {head}{done}\n{self._head()}", key="end")
        else:
            self.alert("failure", f"mxc: {head}\n{self._head()}: {message}"
                                  + self._where(cause or status, rank, node, step, detail), key="end")

    def _record_end(self, status: str, rc: int, ended: str, message: str, steps: int | None,
                    loss: float | None) -> None:
        """record.json's end fields, rewritten atomically under mxc's lock; a final record is left alone."""
        path = self.run / RECORD
        with _locked(self.run / LOCK):
            data = json.loads(path.read_text("utf-8"))
            if not isinstance(data, dict) or data.get("final") or data.get("backend") != "slurm":
                return
            data.update(status=status, ended=ended, exit_code=rc, message=message or None)
            if steps is not None:
                data.update(steps=steps, last_loss=loss)
            atomicfile.write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """mxc's flock on the run; after LOCK_WAIT_S the write goes ahead without it (the job must end)."""
    with open(str(path), "a") as fh:
        deadline = time.monotonic() + LOCK_WAIT_S
        held = False
        while not held:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        try:
            yield
        finally:
            if held:
                fcntl.flock(fh, fcntl.LOCK_UN)
