"""How an attempt ended, from its ranks' exit events: the cause the restart policy decides on.

The batch side of a Slurm job asks this after ``srun`` returns; mxc's local supervisor after its
one rank exits. With ``srun --kill-on-bad-exit``, the first rank to fail brings the others down,
so the cause is that of the earliest failing exit; a rank that started and never wrote its exit
was killed outright (SIGKILL, the OOM killer, its node failing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import events, layout, policy

# Exits that are not failures of their own: they follow another rank's failure or a request.
_FOLLOWERS = (policy.COMPLETED, policy.CANCELLED)


@dataclass(frozen=True)
class Outcome:
    cause: str  # policy.CAUSES
    rank: int | None  # the rank that failed first
    node: str | None
    stage: str | None
    rc: int | None
    detail: str | None
    last_step: int | None


def rank_events(run: Path, nprocs: int) -> tuple[dict[int, list[object]], list[str]]:
    found: dict[int, list[object]] = {}
    problems: list[str] = []
    for rank in range(nprocs):
        evs, bad = events.read(layout.rank_events(run, rank), events.RANK_EVENTS)
        found[rank] = evs
        problems += bad
    return found, problems


def of_attempt(run: Path, attempt: int, nprocs: int) -> Outcome:
    """The cause of ``attempt``: completed when every rank completed; else the earliest failing exit's."""
    by_rank, _problems = rank_events(run, nprocs)
    exits: dict[int, events.RankExit] = {}
    starts: dict[int, events.RankStart] = {}
    for rank, evs in by_rank.items():
        for e in evs:
            if getattr(e, "attempt", None) != attempt:
                continue
            if isinstance(e, events.RankExit):
                exits[rank] = e
            elif isinstance(e, events.RankStart):
                starts[rank] = e
    failed = sorted((e for e in exits.values() if e.cause not in _FOLLOWERS), key=lambda e: (e.time, e.rank))
    if failed:
        first = failed[0]
        return Outcome(first.cause, first.rank, first.node, first.stage, first.rc, first.detail, first.last_step)
    vanished = sorted(r for r in starts if r not in exits)
    if vanished:
        start = starts[vanished[0]]
        return Outcome(policy.KILLED, start.rank, start.node, None, None,
                       "no exit recorded: killed outright (SIGKILL, the OOM killer, or its node failed)", None)
    if len(exits) == nprocs and all(e.cause == policy.COMPLETED for e in exits.values()):
        steps = [e.last_step for e in exits.values() if e.last_step is not None]
        return Outcome(policy.COMPLETED, None, None, None, 0, completion_note(exits, nprocs),
                       max(steps) if steps else None)
    if exits:  # every exit was a stop on request
        first = min(exits.values(), key=lambda e: (e.time, e.rank))
        return Outcome(policy.CANCELLED, first.rank, first.node, first.stage, first.rc, first.detail, first.last_step)
    # Not one rank got as far as its start event: the node program could not run (no python3?).
    return Outcome(policy.STAGE_FAILED, None, None, "start", None, "no rank recorded a start", None)


def completion_note(exits: dict[int, events.RankExit], nprocs: int) -> str | None:
    """What the ranks noted about a completed attempt (policy.after_training: a trainer that had to
    be ended, or exited non-zero, after the training was over), the same note of several ranks once."""
    ranks: dict[str, list[int]] = {}
    for rank in sorted(exits):
        detail = exits[rank].detail
        if detail:
            ranks.setdefault(detail, []).append(rank)
    if nprocs == 1:
        return "; ".join(ranks) or None
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {note}"
                     for note, r in ranks.items()) or None
