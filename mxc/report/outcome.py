"""What happened to a run, in words: its triage verdict and the stages each rank went through.

A report must say something useful about every run, above all about one that never reached a
step (no curves to draw): which stage it was in when it stopped (the ``stage_end`` and ``exit``
events the node program wrote into ``ranks/<rank>/events.jsonl``, read against their schema,
mxc/node/events.py), the error triage found, and what to try. The verdict is ``mxc triage``'s, unchanged (mxc/runtime/triage).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mxc.fsutil import read_text
from mxc.node import events
from mxc.runtime.record import FINISHED, RunRecord
from mxc.runtime.rundir import RunDir

MAX_STAGE_ROWS = 200  # a requeued multi-node job repeats its stages; the report needs the gist


@dataclass(frozen=True)
class Stage:
    """A stage of a rank that ended (rc 0: it passed): its ``stage_end`` event."""

    rank: int
    attempt: int
    name: str
    rc: int
    seconds: int | None

    @property
    def passed(self) -> bool:
        return self.rc == 0

    def describe(self) -> str:
        took = f" after {self.seconds} s" if self.seconds is not None else ""
        if self.passed:
            return f"{self.name} ok{took}"
        if self.rc == 124:
            return f"{self.name} timed out{took}"
        return f"{self.name} exit {self.rc}{took}"


@dataclass
class Outcome:
    """The run's story: the verdict (``Verdict.as_dict()``), its stages and where it stopped."""

    verdict: dict[str, Any]
    stages: list[Stage] = field(default_factory=list)
    exit_stage: str | None = None  # the stage the failing rank was in when it exited
    before_first_step: bool = False
    message: str | None = None

    @property
    def failed(self) -> bool:
        return self.verdict.get("cause") not in (None, "none")

    def stages_of(self, rank: int, attempt: int) -> list[Stage]:
        return [s for s in self.stages if s.rank == rank and s.attempt == attempt]

    def failing_rank(self) -> int:
        rank = self.verdict.get("rank")
        return rank if isinstance(rank, int) else 0

    def last_attempt(self) -> int:
        attempts = [s.attempt for s in self.stages]
        attempt = self.verdict.get("attempt")
        return attempt if isinstance(attempt, int) else max(attempts, default=0)

    def stopped_in(self) -> str | None:
        """The stage the run stopped in: the failing rank's first failed stage of the last attempt,
        else the stage its exit event names."""
        failed = [s for s in self.stages_of(self.failing_rank(), self.last_attempt()) if not s.passed]
        if failed:
            return failed[0].name
        return self.exit_stage

    def headline(self) -> str:
        """One sentence: what happened."""
        title = str(self.verdict.get("title") or self.verdict.get("status") or "unknown")
        if not self.before_first_step:
            return title
        where = self.stopped_in()
        stage = f" in stage {where}" if where and where != "finished" else ""
        ended = self.verdict.get("status") if self.verdict.get("status") in ("cancelled", "hung") else "failed"
        return f"{ended} before its first step{stage}: {title}"

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.verdict.get("cause"), "title": self.verdict.get("title"), "headline": self.headline(),
                "before_first_step": self.before_first_step, "stopped_in": self.stopped_in(),
                "stages": [s.__dict__ for s in self.stages]}


def read_stages(run: RunDir) -> tuple[list[Stage], dict[tuple[int, int], str]]:
    """Every rank's stages (in rank, then file order) and the stage of each (attempt, rank) exit event.
    Lines that are not events of the node program are left out (triage reports them)."""
    stages: list[Stage] = []
    exits: dict[tuple[int, int], str] = {}
    base = run.path / "ranks"
    if not base.is_dir():
        return stages, exits
    for rank_dir in sorted((d for d in base.iterdir() if d.name.isdigit() and d.is_dir()), key=lambda d: int(d.name)):
        rank = int(rank_dir.name)
        try:
            text = read_text(rank_dir / "events.jsonl")  # bounded, regular files only
        except (OSError, ValueError):
            text = ""
        found, _problems = events.parse(text, events.RANK_EVENTS)
        for event in found:
            if isinstance(event, events.RankExit):
                exits[(event.attempt, rank)] = event.stage
            elif isinstance(event, events.StageEnd) and len(stages) < MAX_STAGE_ROWS:
                stages.append(Stage(rank, event.attempt, event.stage, event.rc, round(event.seconds)))
    return stages, exits


def outcome(run: RunDir, record: RunRecord, steps: int) -> Outcome:
    """The verdict and stages of ``run``; ``steps`` is how many steps its metrics hold."""
    from mxc.runtime.triage import classify

    verdict = classify(run.path, record).as_dict()
    stages, exits = read_stages(run)
    result = Outcome(verdict, stages, message=record.message)
    result.exit_stage = exits.get((result.last_attempt(), result.failing_rank()))
    reached = steps > 0 or any(a.last_step is not None for a in record.attempts)
    result.before_first_step = not reached and (record.status in FINISHED and record.status != "succeeded")
    return result
