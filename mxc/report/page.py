"""The HTML page of ``mxc report``: one file, no network, readable before any script runs.

Everything that is text (the runs' figures, triage verdicts, stages, spec diff, environment
drift) is rendered here, escaped, so the page says what happened even with scripts off. The
plots are data (plots.py) in a ``<script type="application/json">`` block that report.js draws
with the inlined uPlot. A Content-Security-Policy allows exactly the page's own scripts and
style (by sha256) and no fetch of any kind: the page cannot reach the network, and a log line
that happened to contain markup can neither run nor load anything.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from mxc.report import Report
from mxc.report.data import RunData
from mxc.report.outcome import Outcome, Stage
from mxc.report.plots import Panel, step_panels, time_panels
from mxc.report.vendor import ASSETS, Library, uplot
from mxc.runtime.record import epoch_seconds
from mxc.runtime.triage.compare import Comparison

COLORS = ("#2563eb", "#dc2626", "#059669", "#7c3aed", "#ea580c", "#0891b2", "#a16207", "#db2777")
CLIP = 600  # characters of an error line shown before "more"
MAX_TEXT = 20_000  # characters of any one text kept in the page
ROWS_SHOWN = 15  # diff/drift rows before the rest fold away
MAX_ROWS = 500

# Runs first (window errors, CSP violations) so that a failure of anything after it is on the page.
ERRORS_JS = """(function () {
  var seen = [];
  function show(text) {
    seen.push(String(text));
    var box = document.getElementById('mxc-js-errors');
    if (box) { box.hidden = false; box.textContent = 'This page hit a problem while drawing: ' + seen.join(' | '); }
    document.documentElement.setAttribute('data-mxc-errors', String(seen.length));
  }
  window.addEventListener('error', function (e) {
    show((e.message || 'error') + (e.lineno ? ' (line ' + e.lineno + ')' : ''));
  });
  window.addEventListener('unhandledrejection', function (e) { show('unhandled: ' + e.reason); });
  document.addEventListener('securitypolicyviolation', function (e) {
    show('blocked by the page policy: ' + e.violatedDirective + ' ' + e.blockedURI);
  });
  window.mxcError = show;
})();
"""


def esc(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    if len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + f" ... ({len(text) - MAX_TEXT:,} more characters)"
    return html.escape(text, quote=True)


def embed_json(data: Any) -> str:
    """JSON that cannot end its <script> block or open a comment: every <, > and & is escaped."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"),
                         ("\u2029", "\\u2029")):
        text = text.replace(raw, escaped)
    return text


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _num(value: float | None, digits: int = 4, unit: str = "") -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) >= 10_000:
        return f"{value:,.0f}{unit}"
    return f"{value:.{digits}g}{unit}"


def _duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def _when(iso: str | None) -> str:
    seconds = epoch_seconds(iso)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if seconds is not None else "-"


# ---- the runs


STATUS_CLASS = {"succeeded": "ok", "failed": "bad", "hung": "bad", "cancelled": "muted", "running": "live",
                "starting": "live", "submitted": "live", "queued": "live"}


def _facts(run: RunData) -> list[tuple[str, str]]:
    s, record = run.summary(), run.record
    facts = [("spec", record.spec_name), ("bundle", s["bundle"]), ("backend", record.backend)]
    if record.slurm and record.slurm.job_id:
        facts.append(("Slurm job", record.slurm.job_id))
    facts += [("host", str(record.host.get("hostname") or "-")), ("started", _when(record.started)),
              ("duration", _duration(s["duration_seconds"])), ("steps", f"{s['steps']:,}")]
    if s["steps"]:
        facts += [("final loss", _num(s["final_loss"], 6)),
                  ("median step", _num((s["median_step_seconds"] or math.nan) * 1000, 4, " ms")),
                  ("steps/s", _num(s["steps_per_second"], 4)),
                  ("tokens/s/device", _num(s["median_tokens_per_second_per_device"], 4)),
                  ("first step (compile)", _num(s["first_step_seconds"], 3, " s"))]
    if s["loss_nonfinite_from_step"] is not None:
        facts.append(("loss not finite from", f"step {s['loss_nonfinite_from_step']}"))
    facts.append(("restarts", str(s["restarts"])))
    if record.time_to_first_step_s is not None:  # measured by the local supervisor (mxc/runtime/local/startup.py)
        facts.append(("time to first step", _num(record.time_to_first_step_s, 3, " s")))
    if record.compile_s is not None:
        facts.append(("compile", _num(record.compile_s, 3, " s")))
    return facts


def _stage_chips(stages: Sequence[Stage]) -> str:
    chips = []
    for stage in stages:
        kind = "ok" if stage.passed else "bad"
        chips.append(f'<span class="chip {kind}">{esc(stage.describe())}</span>')
    return '<span class="arrow">\u2192</span>'.join(chips)


def _stages(out: Outcome) -> str:
    """The stages of the failing rank (else rank 0) in the last attempt, and how many ranks failed."""
    rank, attempt = out.failing_rank(), out.last_attempt()
    mine = out.stages_of(rank, attempt) or out.stages_of(0, attempt)
    if not mine:
        if out.exit_stage:
            return f'<p class="stages">Stopped in stage <b>{esc(out.exit_stage)}</b> (its exit event; no stage ended).</p>'
        return ""
    ranks = {s.rank for s in out.stages if s.attempt == attempt}
    failed = sorted({s.rank for s in out.stages if s.attempt == attempt and not s.passed})
    whose = f" of rank {mine[0].rank}" if len(ranks) > 1 else ""
    extra = f' <span class="muted">({len(failed)} of {len(ranks)} ranks had a failed stage)</span>' if len(ranks) > 1 \
        and failed else ""
    attempt_text = f", attempt {attempt}" if attempt else ""
    return (f'<div class="stages"><span class="label">stages{esc(whose)}{esc(attempt_text)}</span> '
            f"{_stage_chips(mine)}{extra}</div>")


def _hit(hit: dict[str, Any] | None) -> str:
    if not hit:
        return ""
    text = str(hit.get("text", ""))
    where = str(hit.get("source") or "")
    if hit.get("line"):
        where += f":{hit['line']}"
    if hit.get("rank") is not None:
        where += f" [rank {hit['rank']}]"
    body = f"<pre>{esc(text[:CLIP])}{'...' if len(text) > CLIP else ''}</pre>"
    if len(text) > CLIP:
        body = f"<details><summary><pre>{esc(text[:CLIP])}...</pre></summary><pre>{esc(text)}</pre></details>"
    return f'<div class="first-error"><div class="label">first error <span class="where">{esc(where)}</span></div>{body}</div>'


def _verdict(run: RunData) -> str:
    out = run.outcome
    if out is None:
        return ""
    v = out.verdict
    kind = "bad" if out.failed else ("ok" if run.record.status == "succeeded" else "live")
    meta = []
    if out.failed:
        meta.append(f"cause {v.get('cause')}")
        if v.get("blame") and v.get("blame") != "unknown":
            meta.append(f"blame: {v['blame']}")
        if v.get("rank") is not None or v.get("node"):
            meta.append(f"rank {v.get('rank') if v.get('rank') is not None else '?'} on {v.get('node') or '?'}")
        if v.get("exit_code") not in (None, 0):
            meta.append(f"exit {v['exit_code']}")
    if (v.get("attempts") or 0) > 1:
        meta.append(f"attempt {v.get('attempt')} of {v.get('attempts')}")
    parts = [f'<div class="verdict {kind}"><div class="headline">{esc(out.headline())}</div>']
    if meta:
        parts.append(f'<div class="meta">{esc(" · ".join(meta))}</div>')
    parts.append(_stages(out))
    parts.append(_hit(v.get("first_error")))
    if v.get("try"):
        parts.append('<div class="label">what to try</div><ul class="try">'
                     + "".join(f"<li>{esc(_clip(t, 400))}</li>" for t in v["try"][:6]) + "</ul>")
    earlier = v.get("earlier_attempts") or []
    if earlier:
        items = "".join(f"<li>attempt {esc(e.get('attempt'))}: {esc(e.get('title'))}: "
                        f"<code>{esc(str((e.get('first_error') or {}).get('text', ''))[:200])}</code></li>"
                        for e in earlier[:10])
        parts.append(f'<div class="label">earlier attempts</div><ul class="earlier">{items}</ul>')
    notes = [*(v.get("notes") or []), *([out.message] if out.message else [])]
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{esc(_clip(n, 400))}</li>" for n in notes[:8]) + "</ul>")
    parts.append("</div>")
    return "".join(parts)


def _run_card(i: int, run: RunData) -> str:
    status = run.record.status
    facts = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in _facts(run))
    notes = f'<p class="muted small">{esc(run.tsdb_note)}</p>' if run.tsdb_note else ""
    return (f'<article class="card run run-{i}" id="run-{i + 1}"><header><span class="swatch"></span>'
            f'<span class="run-number">run {i + 1}</span> <code class="run-id">{esc(run.run.run_id)}</code>'
            f'<span class="pill {STATUS_CLASS.get(status, "muted")}">{esc(status)}</span></header>'
            f'<div class="run-body">{_verdict(run)}<div><dl class="facts">{facts}</dl>{notes}</div></div></article>')


# ---- the plots


def _panel(panel: Panel) -> str:
    note = f'<p class="note">{esc(panel.note)}</p>' if panel.note else ""
    checked = " checked" if panel.log else ""
    return (f'<figure class="panel" id="panel-{esc(panel.id)}" data-panel="{esc(panel.id)}" data-state="pending">'
            f'<figcaption><span class="title">{esc(panel.title)}</span><span class="unit">{esc(panel.unit)}</span>'
            f'<label class="log"><input type="checkbox" class="log-toggle"{checked}> log</label></figcaption>'
            f'{note}<div class="chart"></div><div class="tooltip" hidden></div></figure>')


def _plots(panels: Sequence[Panel], runs: Sequence[RunData]) -> str:
    if not panels:
        return ('<section class="plots"><p class="empty">Nothing to plot: no run recorded a step, and there are no '
                "host series. What happened is above.</p></section>")
    steps = [p for p in panels if p.x == "step"]
    times = [p for p in panels if p.x == "time"]
    out = ['<section class="plots" id="plots">']
    if steps:
        out.append('<h2>Per step <span class="muted small">from each run\'s metrics.jsonl, every step exact</span></h2>')
        out.append('<div class="grid">' + "".join(_panel(p) for p in steps) + "</div>")
    elif any(r.outcome and r.outcome.before_first_step for r in runs):
        out.append('<p class="empty">No run recorded a step: there are no per-step curves. What happened is above.</p>')
    if times:
        out.append('<h2>Over time <span class="muted small">seconds since each run started, from its Prometheus TSDB'
                   "</span></h2>")
        out.append('<div class="grid">' + "".join(_panel(p) for p in times) + "</div>")
    out.append("</section>")
    return "".join(out)


def _controls() -> str:
    return ('<nav class="controls" id="controls" hidden>'
            '<label>smoothing <input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0">'
            '<output id="smoothing-value">off</output></label>'
            '<button type="button" id="reset-zoom">reset zoom</button>'
            '<span class="hint">drag across a plot to zoom (plots of one kind zoom together), double-click to zoom out, '
            "hover for values; the view is kept in the address (#...) to share it</span></nav>")


# ---- comparisons


def _value(value: Any) -> str:
    if isinstance(value, str) and value.strip() == value and value:
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _rows(rows: Sequence[str], total: int) -> tuple[str, str]:
    """The first rows, and the rest folded away (at most MAX_ROWS in the page)."""
    shown, rest = rows[:ROWS_SHOWN], rows[ROWS_SHOWN:MAX_ROWS]
    body = "".join(shown)
    more = ""
    if rest:
        hidden = f"{len(rest)} more" + (f" (of {total - ROWS_SHOWN}; --json has all)" if total > MAX_ROWS else "")
        more = f'<details><summary>{esc(hidden)}</summary><table class="diff">{"".join(rest)}</table></details>'
    return body, more


def _diff_table(head: tuple[str, str, str], rows: list[tuple[str, str, str, str]], total: int) -> str:
    cells = [f'<tr class="{kind}"><td><code>{esc(a)}</code></td><td><code>{esc(b)}</code></td>'
             f"<td><code>{esc(c)}</code></td></tr>" for a, b, c, kind in rows]
    body, more = _rows(cells, total)
    header = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f'<table class="diff"><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>{more}'


def _losses(c: Comparison, k: int) -> list[str]:
    ld = c.losses
    if not ld.common_steps:
        return ["losses: no common steps"]
    lines = [f"{ld.common_steps:,} common steps ({ld.first_step}..{ld.last_step})"]
    if ld.first_diverging_exact is None:
        lines.append("losses bit-identical at every common step")
    else:
        tol = ld.first_diverging_tolerance
        lines.append(f"losses differ from step {ld.first_diverging_exact}; beyond rtol {ld.rtol:g} from "
                     + (f"step {tol}" if tol is not None else "no step (within tolerance everywhere)"))
        if ld.max_abs_diff is not None:
            lines.append(f"largest difference {ld.max_abs_diff:.6g} at step {ld.max_abs_diff_step}")
    if ld.only_a or ld.only_b:
        lines.append(f"steps only in run 1: {len(ld.only_a):,}, only in run {k + 1}: {len(ld.only_b):,}")
    ratio = c.step_time_ratio
    if ratio is not None:
        lines.append(f"median step time run {k + 1} / run 1: {ratio:.3f} "
                     f"({_num((c.step_time_b or 0) * 1000, 4, ' ms')} vs {_num((c.step_time_a or 0) * 1000, 4, ' ms')})")
    return lines


def _comparison(k: int, c: Comparison) -> str:
    out = [f'<article class="card compare run-{k}"><h3><span class="swatch"></span>run {k + 1} '
           f'<code>{esc(c.b)}</code> <span class="muted">against run 1</span> <code>{esc(c.a)}</code></h3>']
    out.append('<ul class="facts-list">' + "".join(f"<li>{esc(line)}</li>" for line in _losses(c, k)) + "</ul>")
    not_compared = any("spec fields not compared" in n for n in c.notes)
    if c.spec_changes:
        rows = [(ch.key, _value(ch.old) if ch.kind != "added" else "(not set)",
                 _value(ch.new) if ch.kind != "removed" else "(not set)", ch.kind) for ch in c.spec_changes[:MAX_ROWS]]
        out.append(f"<h4>Spec: {len(c.spec_changes)} field(s) differ</h4>")
        out.append(_diff_table(("field", "run 1", f"run {k + 1}"), rows, len(c.spec_changes)))
    else:
        out.append("<h4>Spec: " + ("not compared (a bundle is not in the store)" if not_compared else "identical") + "</h4>")
    if c.drift:
        significant = sum(1 for d in c.drift if d.significant)
        rows = [(d.what, _value(d.recorded), _value(d.now), "significant" if d.significant else "note")
                for d in c.drift[:MAX_ROWS]]
        out.append(f"<h4>Environment: {significant} significant difference(s)"
                   f'{f", {len(c.drift) - significant} note(s)" if len(c.drift) > significant else ""}</h4>')
        out.append(_diff_table(("what", "run 1", f"run {k + 1}"), rows, len(c.drift)))
    else:
        out.append("<h4>Environment: identical</h4>")
    if c.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in c.notes) + "</ul>")
    out.append("</article>")
    return "".join(out)


def _comparisons(comparisons: Sequence[Comparison]) -> str:
    if not comparisons:
        return ""
    return ('<section class="comparisons"><h2>Side by side <span class="muted small">spec diff, environment drift and '
            "losses of each run against run 1 (as mxc compare)</span></h2>"
            + "".join(_comparison(k, c) for k, c in enumerate(comparisons, start=1)) + "</section>")


# ---- the page


def _style(library: Library) -> str:
    own = (ASSETS / "report.css").read_text("utf-8")
    runs = "".join(f".run-{i}{{--run:{color}}}" for i, color in enumerate(COLORS))
    return library.style + "\n" + own + "\n" + runs + "\n"


def _title(runs: Sequence[RunData]) -> str:
    names = sorted({r.record.spec_name for r in runs})
    return f"mxc report: {', '.join(names)} ({len(runs)} run{'s' if len(runs) > 1 else ''})"


def _legend(runs: Sequence[RunData]) -> str:
    items = "".join(f'<a class="key run-{i}" href="#run-{i + 1}"><span class="swatch"></span>run {i + 1} '
                    f"<code>{esc(r.run.run_id)}</code></a>" for i, r in enumerate(runs))
    return f'<div class="legend">{items}</div>'


def render(report: Report) -> str:
    library = uplot()
    panels = step_panels(report.runs, report.comparisons) + time_panels(report.runs)
    data = {"runs": [{"id": r.run.run_id, "color": COLORS[i % len(COLORS)]} for i, r in enumerate(report.runs)],
            "panels": [p.payload() for p in panels]}
    licence = f"/*! {library.name} {library.version} ({library.homepage}), {library.license} licence:\n" \
              + library.license_text.replace("*/", "* /") + "*/\n"
    scripts = [ERRORS_JS, licence + library.script, (ASSETS / "report.js").read_text("utf-8")]
    style = _style(library)
    policy = ("default-src 'none'; script-src " + " ".join(_sha(s) for s in scripts) + f"; style-src {_sha(style)}; "
              "img-src data:; base-uri 'none'; form-action 'none'")
    title = _title(report.runs)
    body = "".join([
        f'<header class="top"><h1>{esc(title)}</h1><p class="muted">generated {esc(_when(report.generated))} '
        f"by mxc report</p>{_legend(report.runs)}</header>",
        '<p id="mxc-js-errors" class="js-errors" hidden></p>',
        '<section class="runs">' + "".join(_run_card(i, r) for i, r in enumerate(report.runs)) + "</section>",
        _controls() if panels else "",
        _plots(panels, report.runs),
        _comparisons(report.comparisons),
        f'<footer class="muted small">Plots drawn by {esc(library.name)} {esc(library.version)} ({esc(library.license)} '
        "licence, inlined: this file needs no network). Verdicts as <code>mxc triage</code>, comparisons as "
        "<code>mxc compare</code>.</footer>",
    ])
    script_tags = "".join(f"<script>{s}</script>" for s in scripts)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{style}</style></head>"
            f'<body>{body}<script type="application/json" id="mxc-data">{embed_json(data)}</script>'
            f"{script_tags}</body></html>\n")
