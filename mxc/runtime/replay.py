"""Proving a replay (``mxc rerun``): the environment a rerun is about to start with against the one
the original run's training recorded, and the rerun's per-step losses against the original's.

* :func:`environment_drift`: what of the caller's shell reaches a training is the base and the
  spec's ``env.pass`` (mxc/node/envboundary.py); the node program records what came from there
  (``record.training.caller``, values through the record's allow-list and redaction; ``passed``,
  names only). A rerun from this shell would start from ``envboundary.from_caller(os.environ)``:
  each name whose value differs (or that is set on one side only) is a difference that reaches the
  training. A secret-named passed variable is compared by presence only (its value is never
  recorded); what the spec's module loads set on the node is the bundle's, not the shell's.
* :class:`LossFollower` and :func:`verify`: ``mxc rerun --verify`` follows the rerun's metrics
  files (MaxText's ``metrics_file``, rank 0, every attempt) while it runs and compares each step's
  loss with the original's, bit for bit; the first difference cancels the rerun (through the
  backend's cancel, as ``mxc cancel`` does) and is reported with both values at full precision.
"""

from __future__ import annotations

import math
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mxc.fsutil import loads, open_regular
from mxc.node import envboundary
from mxc.node.envmerge import may_be_secret
from mxc.runtime.logs.metrics_merge import LOSS_KEY, PART, merge
from mxc.runtime.provenance.environment import recorded_caller
from mxc.runtime.provenance.hostfacts import Drift
from mxc.runtime.record import RunRecord

# ---- the environment


def environment_drift(training: Mapping[str, Any] | None, env: Mapping[str, str], passed: Sequence[str],
                      spec: Mapping[str, Any]) -> list[Drift] | None:
    """Each variable of the caller's shell ``env`` that would reach the rerun's training with
    another value than it reached the original's (``training``: the original record's
    ``training``). None when the original recorded nothing to compare with (an older mxc, or it
    never started training)."""
    if not training or not isinstance(training.get("caller"), dict):
        return None
    old: dict[str, str] = {str(k): str(v) for k, v in training["caller"].items()}
    old_passed = {str(n) for n in training.get("passed") or []}
    from_modules = {str(n) for n in training.get("modules") or []}
    new = recorded_caller(envboundary.from_caller(env, passed), spec)
    out = []
    for name in sorted((set(old) | set(new)) - from_modules):
        if old.get(name) != new.get(name):
            out.append(Drift(f"training env {name}", old.get(name, "unset"), new.get(name, "unset")))
    for name in passed:  # the ones never recorded by value: was it set, is it set
        if name in old or name in new or name in from_modules:
            continue
        was, now = name in old_passed, name in env
        if was != now:
            hidden = "(a value, not recorded)" if may_be_secret(name) else "(set)"
            out.append(Drift(f"training env {name}", hidden if was else "unset", hidden if now else "unset"))
    return out


# ---- the losses


def same(a: float, b: float) -> bool:
    """Bit-identical (a NaN equals the same NaN; 0.0 is not -0.0)."""
    return struct.pack("<d", a) == struct.pack("<d", b)


def shown(value: float) -> str:
    """Full precision: the shortest text that reads back as exactly this float."""
    return repr(value) if not math.isnan(value) else "nan"


def recorded_losses(metrics_parts: Path, rank: int = 0) -> dict[int, float]:
    """The original run's loss per step, across its attempts (a resumed attempt's steps replace the
    earlier attempt's, as metrics.jsonl has them): a read, nothing is written."""
    lines, _ = merge(metrics_parts, rank)
    out = {}
    for raw in lines:
        entry = _loss(raw.encode("utf-8"))
        if entry is not None:
            out[entry[0]] = entry[1]
    return out


def _loss(raw: bytes) -> tuple[int, float] | None:
    try:
        data = loads(raw)
        return int(data["step"]), float(data[LOSS_KEY])
    except (ValueError, KeyError, TypeError, OverflowError):
        return None


@dataclass
class LossFollower:
    """The (step, loss) lines appended to a run's metrics files since the last look: every attempt's
    file of one rank, each read from where the last look stopped; a line still being written waits."""

    parts: Path
    rank: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    pending: dict[str, bytes] = field(default_factory=dict)

    def new(self) -> list[tuple[int, float]]:
        out = []
        for path in self._files():
            out += self._read(path)
        return out

    def _files(self) -> list[Path]:
        if not self.parts.is_dir():
            return []
        found = []
        for path in self.parts.iterdir():
            match = PART.match(path.name)
            if match and int(match["rank"]) == self.rank:
                found.append((int(match["attempt"]), path))
        return [path for _, path in sorted(found)]

    def _read(self, path: Path) -> list[tuple[int, float]]:
        try:
            with open_regular(path) as fh:
                fh.seek(self.offsets.get(path.name, 0))
                data = fh.read(1 << 24)
        except OSError:
            return []
        self.offsets[path.name] = self.offsets.get(path.name, 0) + len(data)
        *lines, rest = (self.pending.pop(path.name, b"") + data).split(b"\n")
        if rest:
            self.pending[path.name] = rest
        return [entry for line in lines if (entry := _loss(line)) is not None]


@dataclass(frozen=True)
class Divergence:
    step: int
    original: float
    rerun: float


@dataclass(frozen=True)
class Verdict:
    """How a verified rerun ended: at its first divergence (then cancelled), or at its own end."""

    record: RunRecord | None  # the rerun's record at the end (None when it was stopped at a divergence)
    divergence: Divergence | None
    compared: int  # steps compared, all equal up to the divergence
    missing: list[int]  # the original's steps the rerun never logged


def first_divergence(expected: Mapping[int, float], seen: Iterable[tuple[int, float]]) -> tuple[Divergence | None, int]:
    """The first (step, loss) of ``seen`` whose loss differs from ``expected``'s at that step, and how
    many were equal before it (steps the original has no loss for are not compared)."""
    equal = 0
    for step, loss in seen:
        want = expected.get(step)
        if want is None:
            continue
        if not same(want, loss):
            return Divergence(step, want, loss), equal
        equal += 1
    return None, equal


def verify(follower: LossFollower, expected: Mapping[int, float], ended: Callable[[], RunRecord | None],
           cancel: Callable[[], object], interval: float = 0.5,
           sleep: Callable[[float], None] = time.sleep) -> Verdict:
    """Compare the rerun's losses with ``expected`` as they arrive, until its first divergence (then
    ``cancel`` it) or its end (``ended`` returns its final record). The end is looked at before the
    files, so the lines written just before it are compared too."""
    compared, logged = 0, set[int]()
    while True:
        record = ended()
        seen = follower.new()
        logged.update(step for step, _ in seen)
        divergence, equal = first_divergence(expected, seen)
        compared += equal
        if divergence is not None:
            cancel()
            return Verdict(None, divergence, compared, [])
        if record is not None:
            return Verdict(record, None, compared, sorted(set(expected) - logged))
        sleep(interval)
