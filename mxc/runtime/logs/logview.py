"""What ``mxc logs`` shows of a run's ``train.log``: one rank, matching lines, lines since a time,
and MaxText's configuration dump folded away.

A training log is mostly noise to a reader: MaxText logs every one of its ~430 settings at start-up
(``Config param NAME: VALUE``), once per rank and again on every restart. ``LogView`` is fed the log
line by line (the whole file, or the lines ``-f`` reads as they come) and returns what to print:
each rank's run of config lines becomes one line saying how many were folded (``--config`` keeps
them). Folding is per rank because in a Slurm job's log (every line labelled ``R: `` by
``srun --label``) the ranks' dumps interleave; ``srun`` also cuts lines longer than 1024 bytes,
so the pieces of a long value (``logical_axis_rules``) are folded with the line they continue.
MaxText's notices about optional modules it replaced by stubs (``[NO-OP] mldiagnostics: dependency
missing; using stub. (ModuleNotFoundError)``, six per rank at every start) are folded the same way
into one line: they say nothing about the run and matched ``--grep Error``. ``--all`` keeps both.

Times: a line carries one only when its writer logged it (absl ``I1124 01:47:28.578``, TSL
``2026-11-24 01:47:28.5:``, mxc's ``... at 2026-11-24T01:47:14.749Z``); a line without one takes
the last time seen on its rank, then on any rank, then the run's start. absl and TSL times have no
zone: they are read in this machine's local time zone (the nodes' and this machine's agree on a
cluster) and absl's, which has no year, in the year the run started.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from mxc.errors import UserError

SRUN_LABEL = re.compile(r"^\s*(\d+): ")
CONFIG_LINE = re.compile(r"(?:^|\] )Config param [^:\s]+: ")
# MaxText 0.2.5 (maxtext/utils/gcs_utils.py and friends) at import time, for each optional module it stubs
NOTICE_LINE = re.compile(r"^\[NO-OP\] [\w.-]+: dependency missing; using stub\.")
SRUN_LINE_LIMIT = 1024  # srun --label splits longer lines; the rest follows as new labelled lines
MXC_TIME = re.compile(r"\bat (\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z)")
DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def fold_line(count: int) -> str:
    return f"[... {count} config line{'s' if count != 1 else ''} folded; --config to show]"


def notice_fold_line(count: int) -> str:
    return (f"[... {count} MaxText notice{'s' if count != 1 else ''} of optional modules replaced by stubs "
            "('[NO-OP] ... dependency missing; using stub') folded; --all to show]")


def parse_since(text: str, now: datetime) -> float:
    """``--since``: a duration back from ``now`` (``90s``, ``10m``, ``2h``, ``1d``, ``1h30m``) or an
    ISO time (``2026-11-24T01:47``, ``2026-11-24 01:47:30``, with ``Z``/an offset, else local time)."""
    value = text.strip()
    m = DURATION.match(value)
    if value and m and any(m.groups()):
        days, hours, minutes, seconds = (int(g or 0) for g in m.groups())
        return (now - timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)).timestamp()
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"--since: '{text[:80]}' is neither a duration nor an ISO time",
                        "e.g. --since 10m, --since 2h, --since 2026-11-24T01:47") from None
    return (when.astimezone() if when.tzinfo is None else when).timestamp()


def compile_grep(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise UserError(f"--grep: '{pattern[:80]}' is not a regular expression ({exc})",
                        "Python syntax; (?i) at the start ignores case") from None


@dataclass(frozen=True)
class Filter:
    """What the user asked to see (None/False: no restriction)."""

    rank: int | None = None
    grep: re.Pattern[str] | None = None
    since: float | None = None  # epoch seconds
    config: bool = False  # keep MaxText's config dump
    notices: bool = False  # keep MaxText's [NO-OP] notices of stubbed optional modules
    attempts: bool = False  # only mxc's own lines


@dataclass
class _Rank:
    """One rank's place in the log."""

    time: float | None = None
    folded: int = 0  # config lines held back since the last line shown
    notices: int = 0  # [NO-OP] notices held back since the last line shown
    continues: bool = False  # the last line was a config line srun cut: the next one is its rest


@dataclass
class LogView:
    """Feed lines of a run's log in order; get back the lines to print."""

    want: Filter
    labelled: bool  # lines start with srun's "R: " (a Slurm job); unlabelled ones are the batch side's
    start: float | None  # the run's start (epoch), the time of lines before any timed one
    line_time: Callable[[str], float | None]  # a line's own time (absl, TSL), None when it has none
    _ranks: dict[int | None, _Rank] = field(default_factory=dict, init=False)
    _last_time: float | None = field(default=None, init=False)

    def feed(self, raw: str) -> list[str]:
        rank: int | None = 0
        text = raw
        if self.labelled:
            m = SRUN_LABEL.match(raw)
            rank, text = (int(m[1]), raw[m.end():]) if m else (None, raw)
        state = self._ranks.setdefault(rank, _Rank())
        when = self._time(text)
        if when is not None:
            state.time = self._last_time = when
        if self.want.rank is not None and rank != self.want.rank:
            return []
        is_config = state.continues or bool(CONFIG_LINE.search(text))
        state.continues = is_config and len(text) >= SRUN_LINE_LIMIT and self.labelled
        if not self._wanted(text, state):
            return []
        if is_config and not self.want.config:
            state.folded += 1
            return []
        if not self.want.notices and NOTICE_LINE.match(text):
            state.notices += 1
            return []
        return [*self._release(rank, state), raw]

    def flush(self) -> list[str]:
        """The folded counts still held back (the log ended inside a config dump)."""
        out: list[str] = []
        for rank, state in self._ranks.items():
            out += self._release(rank, state)
        return out

    def _time(self, text: str) -> float | None:
        if m := MXC_TIME.search(text):
            return datetime.fromisoformat(m[1].replace("Z", "+00:00")).astimezone(UTC).timestamp()
        return self.line_time(text)

    def _wanted(self, text: str, state: _Rank) -> bool:
        if self.want.attempts and not text.startswith("[mxc"):
            return False
        if self.want.since is not None:
            when = state.time if state.time is not None else self._last_time
            if (when if when is not None else self.start or 0.0) < self.want.since:
                return False
        return self.want.grep is None or bool(self.want.grep.search(text))

    def _release(self, rank: int | None, state: _Rank) -> list[str]:
        label = f"{rank}: " if self.labelled and rank is not None else ""
        out = []
        if state.folded:
            out.append(label + fold_line(state.folded))
        if state.notices:
            out.append(label + notice_fold_line(state.notices))
        state.folded = state.notices = 0
        return out
