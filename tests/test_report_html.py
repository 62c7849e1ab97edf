"""`mxc report` as one self-contained HTML file: plots drawn by the inlined uPlot in headless
Chromium, triage verdicts, stages of a run that failed before its first step, the spec diff and
environment drift between runs, a page no log line can break out of, and the vendored library
checked against the hash recorded when it was taken from npm.

The runs are real runs kept as triage fixtures (tests/report_runs.py); the real end-to-end report
of a fresh observed training, host series included, is in tests/test_observe_run.py.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from mxc.errors import UserError
from mxc.report import collect, vendor
from mxc.report.outcome import outcome
from mxc.report.page import embed_json, render
from mxc.report.plots import MAX_POINTS, align, step_panels, thin, time_panels
from mxc.runtime import runs
from mxc.runtime.triage import classify
from mxc.store import Store
from tests import report_runs
from tests.browser import open_page, screenshot
from tests.conftest import Mxc, store_snapshot

STEP_PANELS = ["loss", "loss_difference", "step_time", "throughput", "learning_rate"]


def _found(home: Path, *ids: str) -> list[tuple[Any, Any]]:
    return [(r := runs.find_run(home, i), runs.load(r)) for i in ids]


@pytest.fixture
def three(mxc_home: Path) -> Path:
    """Run 1 and 2 succeeded (another learning rate and jax, diverging from step 12); run 3 failed
    before its first step."""
    report_runs.base_run(mxc_home)
    report_runs.other_run(mxc_home)
    report_runs.failed_run(mxc_home)
    return mxc_home


# ---- the vendored plotting library


def test_vendored_uplot_is_the_npm_file_with_the_recorded_sha256() -> None:
    info = vendor.manifest()
    assert info["package"] == "uplot" and info["license"] == "MIT"
    files = info["files"]
    assert isinstance(files, dict) and set(files) == {"script", "style", "license"}
    for entry in files.values():
        data = (vendor.ASSETS / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["file"]
    script = (vendor.ASSETS / files["script"]["file"]).read_text()
    assert script.startswith(f"/*! https://github.com/leeoniya/uPlot (v{info['version']}) */")
    licence = (vendor.ASSETS / files["license"]["file"]).read_text()
    assert licence.startswith("The MIT License") and "Leon Sorokin" in licence
    assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", str(info["tarball_integrity"]))
    library = vendor.uplot()
    assert library.version == info["version"] and library.script == script


def test_a_changed_vendored_file_never_reaches_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assets = tmp_path / "assets"
    shutil.copytree(vendor.ASSETS, assets)
    script = assets / "uPlot.iife.min.js"
    script.write_text(script.read_text().replace("uPlot", "uPl0t", 1))
    monkeypatch.setattr(vendor, "ASSETS", assets)
    with pytest.raises(UserError) as caught:
        vendor.uplot()
    assert caught.value.code == 1 and "uPlot.iife.min.js: sha256" in str(caught.value)


# ---- plot data


def test_align_unions_the_x_values_and_leaves_gaps_for_missing_and_nan() -> None:
    xs, ys = align([[(0, 1.0), (2, math.nan), (3, 3.0)], [(1, 5.0), (3, math.inf)]])
    assert xs == [0, 1, 2, 3]
    assert ys == [[1.0, None, None, 3.0], [None, 5.0, None, None]]
    json.dumps(ys, allow_nan=False)  # what the page embeds must be strict JSON


def test_a_long_run_is_thinned_to_bucket_means() -> None:
    points = [(float(s), float(s % 10)) for s in range(10 * MAX_POINTS + 7)]
    kept, size = thin(points)
    assert size == 11 and len(kept) <= MAX_POINTS
    assert kept[0] == (0.0, sum(s % 10 for s in range(11)) / 11) and kept[1][0] == 11.0
    assert thin(points[:100]) == (points[:100], 1)
    nan_bucket = thin([(0.0, math.nan)] * (MAX_POINTS + 1))[0][0]
    assert math.isnan(nan_bucket[1])


def test_step_panels_mark_restarts_divergence_and_keep_compile_steps_off_the_axis(three: Path) -> None:
    report = collect(_found(three, report_runs.BASE, report_runs.OTHER), Store(three), with_tsdb=False)
    panels = {p.id: p for p in step_panels(report.runs, report.comparisons)}
    assert list(panels) == STEP_PANELS
    loss = panels["loss"]
    restarts = sorted((m["x"], m["run"]) for m in loss.markers if m["kind"] == "restart")
    assert restarts == [(11, 0), (11, 1)]  # resumed from the step-10 checkpoint: step 11 is the first redone
    diverge = [m for m in loss.markers if m["kind"] == "diverge"]
    assert [(m["x"], m["run"]) for m in diverge] == [(report_runs.DIVERGES_AT, 1)]
    difference = panels["loss_difference"]
    assert difference.log and difference.payload()["data"][1][: report_runs.DIVERGES_AT] == [None] * 12  # 0: a gap
    time = panels["step_time"]
    steady = [y for x, y in time.series[0].points if x >= 2]
    assert time.clip_top is not None and max(steady) < time.clip_top < 412.0  # step 1 took 412 ms
    assert "Steps 0-1 compile (run 1: 0.10 s, 0.41 s" in time.note


def test_time_panels_have_host_and_per_gpu_series_with_training_shaded(three: Path) -> None:
    [data] = collect(_found(three, report_runs.BASE), Store(three), with_tsdb=False).runs
    data.host = {"cpu": [(0.0, 50.0), (10.0, 99.5)], "memory": [(0.0, 1.5), (10.0, 2.0)]}
    data.gpu = {"GPU utilization (%)": {"0": [(0.0, 90.0)], "1": [(0.0, 80.0)]}}
    data.training_spans, data.restarts_at_time = [(2.0, 8.0)], [5.0]
    panels = {p.id: p for p in time_panels([data])}
    assert list(panels) == ["host_cpu", "host_memory", "gpu_utilization"]  # no GPU memory series: no panel
    gpu = panels["gpu_utilization"]
    assert [(s.label, s.dash) for s in gpu.series] == [("run 1 gpu 0", False), ("run 1 gpu 1", True)]
    assert gpu.y_span == (0.0, 100.0) and panels["host_memory"].y_span == (0.0, None)  # 99.5% is not "100% x 0.5"
    assert panels["host_cpu"].bands == [{"from": 2.0, "to": 8.0, "run": 0}] and "Shaded" in panels["host_cpu"].note
    assert [m["x"] for m in panels["host_cpu"].markers] == [5.0]


def test_a_million_steps_reach_the_page_as_a_few_thousand_points(three: Path) -> None:
    [data] = collect(_found(three, report_runs.BASE), Store(three), with_tsdb=False).runs
    data.steps = list(range(1_000_000))
    data.values = {key: [6.0 - s * 1e-6 for s in data.steps] for key in data.values}
    loss = step_panels([data], [])[0]
    payload = loss.payload()
    assert len(payload["data"][0]) == MAX_POINTS and "1,000,000 steps, thinned (run 1: means of 250 steps)" in loss.note
    assert len(json.dumps(payload)) < 200_000


def test_embedded_json_cannot_close_its_script_block() -> None:
    text = embed_json({"x": "</script><script>alert(1)</script><!-- \u2028 & >"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"x": "</script><script>alert(1)</script><!-- \u2028 & >"}


# ---- the page


def _policy_hashes(page: str) -> set[str]:
    policy = html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)[1])  # type: ignore[index]
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy and "connect-src" not in policy
    return set(re.findall(r"'sha256-([^']+)'", policy))


def _sha(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def test_the_page_needs_no_network_and_runs_only_its_own_scripts(three: Path) -> None:
    report = collect(_found(three, report_runs.BASE, report_runs.OTHER, report_runs.FAILED), Store(three))
    page = render(report)
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(scripts) == 3 and len(styles) == 1
    assert _policy_hashes(page) == {_sha(s) for s in [*scripts, *styles]}  # exactly these run, nothing else
    assert not re.search(r"\s(src|href)=\"(?!#)", page), "nothing is loaded from anywhere"
    assert "@import" not in styles[0] and "url(" not in styles[0]
    assert "Leon Sorokin" in scripts[1]  # the MIT licence travels with the inlined library


def test_a_failed_run_says_what_happened_before_its_first_step(three: Path, mxc: Mxc, tmp_path: Path) -> None:
    out = tmp_path / "failed.html"
    result = mxc("report", report_runs.FAILED[:15], "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    [run] = data["runs"]
    assert run["steps"] == 0 and run["status"] == "failed"
    outcome = run["outcome"]
    assert outcome["before_first_step"] and outcome["stopped_in"] == "train" and outcome["cause"] == "config_error"
    page = out.read_text()
    text = html.unescape(re.sub(r"<[^>]+>", " ", page))
    assert "failed before its first step in stage train: MaxText rejected the configuration" in text
    assert "preflight ok after 0 s" in text and "image ok after 0 s" in text and "train exit 1 after 9 s" in text
    assert "MAXTEXT CONFIG ERROR: 'foo_bar' not in" in text and "train.log:" in text
    assert "Fix the spec's model.overrides" in text  # what to try
    assert "No run recorded a step" in text or "Nothing to plot" in text
    png = mxc("report", report_runs.FAILED, "-o", str(tmp_path / "failed.png"))
    assert png.returncode == 2 and "report.html" in png.stderr and not (tmp_path / "failed.png").exists()


def test_the_headline_says_how_a_run_ended_before_its_first_step(three: Path) -> None:
    run = runs.find_run(three, report_runs.FAILED)
    record = runs.load(run)
    assert outcome(run, record, steps=0).headline() == \
        "failed before its first step in stage train: MaxText rejected the configuration"
    cancelled = outcome(run, record.model_copy(update={"status": "cancelled"}), steps=0)
    assert cancelled.headline().startswith("cancelled before its first step in stage train: ")
    reached = outcome(run, record, steps=3)
    assert not reached.before_first_step and reached.headline() == "MaxText rejected the configuration"
    live = outcome(run, record.model_copy(update={"status": "running"}), steps=0)
    assert not live.before_first_step  # still starting: nothing to say yet


def test_log_lines_and_spec_values_stay_text(three: Path, tmp_path: Path) -> None:
    evil = "</script><script>document.title='owned'</script><img src=x onerror=alert(1)><!--"
    shutil.rmtree(report_runs.run_path(three, report_runs.OTHER))
    report_runs.other_run(three, spec_note=evil)
    failed = report_runs.run_path(three, report_runs.FAILED)
    log = failed / "train.log"
    log.write_text(log.read_text().replace("MAXTEXT CONFIG ERROR: 'foo_bar'", f"MAXTEXT CONFIG ERROR: '{evil}'"))
    assert classify(failed).cause == "config_error"
    report = collect(_found(three, report_runs.BASE, report_runs.OTHER, report_runs.FAILED), Store(three))
    page = render(report)
    assert "<img src=x" not in page and "document.title='owned'</script>" not in page
    assert page.count("<script") == 4 and page.count("</script>") == 4
    assert html.escape(evil) in page  # shown, as text
    out = tmp_path / "evil.html"
    out.write_text(page)
    opened = open_page(out)
    assert opened.console == [] and opened.attribute("data-mxc-errors") is None
    assert "<title>mxc report" in opened.dom and "owned" not in opened.dom.split("</title>")[0]


def test_a_mangled_run_directory_still_gets_a_report(three: Path, mxc: Mxc, tmp_path: Path) -> None:
    failed = report_runs.run_path(three, report_runs.FAILED)
    with (failed / "ranks" / "0" / "events.jsonl").open("a") as fh:  # lines the node program never writes
        fh.write('{"event": "stage_end", "stage": "x", "rc": "--5"}\n{"event": "stage_end"}\nnot json\n'
                 '{"event": "stage_end", "time": 1, "job_id": "", "attempt": 0, "rank": 0, "node": "vm", "stage": "'
                 + "y" * 100_000 + '", "rc": "\u00b2", "seconds": 1, "timed_out": false, "detail": null}\n')
    (failed / "metrics.jsonl").write_bytes(b'\x00\xff{"step": 1e999}\n{"step": NaN}\n[1]\n"x"\n{"step": 3, '
                                          b'"learning/loss": 1' + b"0" * 400 + b"}\n" + b"\xfe" * 10_000)
    out = tmp_path / "mangled.html"
    result = mxc("report", report_runs.FAILED, report_runs.BASE, "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    run, _ = json.loads(result.stdout)["runs"]
    assert run["steps"] == 1 and run["final_loss"] is None  # step 3's loss does not fit a float
    assert [s["name"] for s in run["outcome"]["stages"]] == ["preflight", "image", "train"]  # the real rows only
    assert open_page(out).attribute("data-mxc-errors") is None


def test_bad_requests_are_one_line_and_write_nothing(three: Path, mxc: Mxc, tmp_path: Path) -> None:
    before, outputs = store_snapshot(three), tmp_path / "out"
    outputs.mkdir()
    cases = [
        ([report_runs.BASE, report_runs.BASE, "-o", str(outputs / "a.html")], "named twice"),
        ([report_runs.BASE, "-o", str(outputs / "a.pdf")], ".html or .png"),
        ([*[report_runs.BASE] * 9, "-o", str(outputs / "a.html")], "at most 8 runs"),
        (["2099", "-o", str(outputs / "a.html")], "no run matches '2099'"),
    ]
    for args, message in cases:
        out = mxc("report", *args)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1
    assert list(outputs.iterdir()) == [] and store_snapshot(three) == before


# ---- in a browser


def test_the_report_renders_in_headless_chromium(three: Path, mxc: Mxc, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    made = mxc("report", report_runs.BASE, report_runs.OTHER, report_runs.FAILED, "-o", str(out))
    assert made.returncode == 0, made.stderr
    page = open_page(out)
    assert page.console == [], page.console  # no script error, no blocked load, nothing logged
    assert page.attribute("data-mxc-errors") is None
    assert page.attribute("data-mxc-rendered") == str(len(STEP_PANELS))
    figures = re.findall(r'<figure class="panel" id="panel-(\w+)"([^>]*)>', page.dom)
    assert [name for name, _ in figures] == STEP_PANELS
    assert all('data-state="drawn"' in attrs for _, attrs in figures)
    assert page.dom.count("<canvas") == len(STEP_PANELS)  # uPlot drew each plot on its canvas
    assert '<nav class="controls" id="controls">' in page.dom  # shown once the scripts run
    text = html.unescape(re.sub(r"<[^>]+>", " ", page.dom))
    assert "model.overrides.learning_rate" in text and "0.0001" in text and "0.0002" in text  # spec diff
    assert "jax" in text and "0.12.0.1" in text and "0.12.1" in text  # environment drift
    assert f"losses differ from step {report_runs.DIVERGES_AT}" in text
    assert "run succeeded after 1 failed attempt(s)" in text and "MaxText rejected the configuration" in text

    # the view in the address: smoothing, log scale and zoom, as a reader would share it
    view = open_page(out, "#smooth=0.6&log=loss&step=3..20")
    assert view.console == [] and view.attribute("data-mxc-smoothing") == "0.6"
    scales = dict(re.findall(r'id="panel-(\w+)"[^>]*data-y-scale="(\w+)"', view.dom))
    assert scales == {"loss": "log", "loss_difference": "linear", "step_time": "linear", "throughput": "linear",
                      "learning_rate": "linear"}
    ranges = dict(re.findall(r'id="panel-(\w+)"[^>]*data-x-range="([^"]+)"', view.dom))
    assert set(ranges.values()) == {"3..20"} and len(ranges) == len(STEP_PANELS)  # the step plots zoom together
    if os.environ.get("MXC_REPORT_COPY"):  # to look at it: MXC_REPORT_COPY=/some/dir
        keep = Path(os.environ["MXC_REPORT_COPY"])
        shutil.copy(out, keep / "report.html")
        screenshot(out, keep / "report.png", size=(1400, 3400))
