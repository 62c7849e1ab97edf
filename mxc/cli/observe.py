"""Observability commands: metrics, report, dashboard (a run's TSDB, live or post-mortem)."""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, store, table

# Labels every series of one run shares; shown only where they tell series apart (several nodes).
CONTEXT_LABELS = ("instance", "job", "run", "node")
MAX_REPORT_RUNS = 8  # mxc.report.MAX_RUNS (not imported: --help stays light)


def register(sub: Any) -> None:
    p = add_command(sub, "metrics", "a run's metrics from its Prometheus TSDB: series and last values, or a PromQL query",
                    "mxc metrics 20260101-120000\nmxc metrics 2026 --query 'rate(mxc_train_step_total[1m])' --json",
                    _metrics)
    p.add_argument("ref", nargs="?", help="run id or unique prefix (default: the latest run)")
    p.add_argument("--query", metavar="PROMQL", help="evaluate over the run's time span (query_range)")
    p.add_argument("--step", type=float, help="seconds between points for --query (default: about 600 points)")
    p.add_argument("--all", action="store_true", help="every series (Ray's too), not only mxc_*")
    add_json(p)

    p = add_command(sub, "report", "one HTML file about one run or several side by side: loss, step time, throughput, "
                    "host/GPU with zoom, hover, smoothing and log scale; triage verdicts, spec diff, environment drift",
                    "mxc report 20260101-120000 -o report.html\nmxc report RUN_A RUN_B RUN_C -o sweep.html\n"
                    "mxc report RUN -o report.png   # the static picture, to paste", _report)
    p.add_argument("refs", nargs="*", metavar="RUN",
                   help=f"run ids or prefixes, at most {MAX_REPORT_RUNS}; the first is the reference (default: the latest run)")
    p.add_argument("-o", "--output", type=Path, help="report.html (self-contained, no network needed) or a .png "
                   "(default: report-<run>.html)")
    p.add_argument("--no-tsdb", action="store_true", help="only the per-step curves from metrics.jsonl")
    add_json(p)

    p = add_command(sub, "dashboard", "serve Prometheus and TensorBoard on a run's data (loopback) until Ctrl-C",
                    "mxc dashboard 20260101-120000", _dashboard)
    p.add_argument("ref", nargs="?", help="run id or unique prefix (default: the latest run)")
    p.add_argument("--bind", default="127.0.0.1", help="address to serve on (default: 127.0.0.1)")
    p.add_argument("--no-tensorboard", action="store_true", help="only Prometheus")
    add_json(p)


def _find(ref: str | None) -> tuple[Any, Any]:
    from mxc.errors import UserError
    from mxc.runtime import runs

    home = store().home
    if ref:
        run = runs.find_run(home, ref)
    else:
        every = runs.all_runs(home)
        if not every:
            raise UserError("no runs yet", "mxc build specs/tiny.yaml --set observability.enabled=true && mxc run")
        run = every[-1]
    return run, runs.load(run)


def _short_names(metrics: list[dict[str, str]]) -> list[str]:
    hidden = {k for k in CONTEXT_LABELS if len({m.get(k) for m in metrics}) <= 1}
    hidden.add("instance")  # host:port of an exporter: the node label names it better
    names = []
    for metric in metrics:
        name = metric.get("__name__", "")
        labels = ",".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__" and k not in hidden)
        names.append(f"{name}{{{labels}}}" if labels else name)
    return names


def _num(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.6g}"


def _when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


# ---- metrics


def _metrics(args: argparse.Namespace) -> int:
    from mxc.runtime.observe.tsdb import last_values, open_tsdb, range_series

    run, record = _find(args.ref)
    with open_tsdb(run, record) as tsdb:
        w = tsdb.window
        head = {"run": run.run_id, "status": record.status, "tsdb": str(run.tsdb / "data"), "live": tsdb.live,
                "start": w.start, "end": w.end}
        if args.query:
            result = range_series(tsdb, args.query, args.step)
            if args.json:
                print_json({**head, "query": args.query, "result": result})
                return 0
            _print_head(head)
            print(f"query: {args.query}")
            rows = []
            for r, name in zip(result, _short_names([r["metric"] for r in result]), strict=True):
                values = [v for _, v in r["values"]]
                if not values:
                    continue
                rows.append([name or "{}", str(len(values)), _num(values[0]), _num(values[-1]),
                             _num(min(values)), _num(max(values))])
            print(table(rows, ["series", "points", "first", "last", "min", "max"]) if rows else "(no data)")
            return 0
        selector = '{__name__=~".+"}' if args.all else '{__name__=~"mxc_.+"}'
        series = last_values(tsdb, selector)
        if args.json:
            print_json({**head, "series": series})
            return 0
        _print_head(head)
        names = _short_names([s["metric"] for s in series])
        rows = [[name, _num(s["last"]), str(s["samples"])] for s, name in zip(series, names, strict=True)]
        print(table(rows, ["series", "last", "samples"]) if rows else "(no series)")
    return 0


def _print_head(head: dict[str, Any]) -> None:
    how = "live" if head["live"] else "reopened read-only"
    print(f"run {head['run']} ({head['status']}), TSDB {head['tsdb']} ({how})")
    print(f"window {_when(head['start'])} .. {_when(head['end'])} UTC ({head['end'] - head['start']:.0f}s)")


# ---- report


def _report(args: argparse.Namespace) -> int:
    from mxc.errors import UserError

    refs = args.refs or [None]
    if len(refs) > MAX_REPORT_RUNS:
        raise UserError(f"mxc report shows at most {MAX_REPORT_RUNS} runs, not {len(refs)}", "mxc report RUN_A RUN_B ...")
    found = [_find(ref) for ref in refs]
    paths = [run.path for run, _ in found]
    if len(set(paths)) < len(paths):
        raise UserError("a run is named twice: " + ", ".join(sorted({p.name for p in paths if paths.count(p) > 1})))
    output = args.output or Path(f"report-{found[0][0].run_id}.html")
    if output.suffix.lower() not in (".html", ".htm", ".png"):
        raise UserError(f"{output}: the report is .html or .png")
    from mxc.report import collect, write_report

    report = collect(found, store(), with_tsdb=not args.no_tsdb)
    if output.suffix.lower() == ".png" and not any(d.steps for d in report.runs):
        raise UserError("no per-step metrics in " + ", ".join(d.run.run_id for d in report.runs) + " to draw",
                        f"the HTML report says what happened: mxc report {found[0][0].run_id} -o report.html")
    write_report(report, output)
    if args.json:
        print_json(report.as_dict(output))
    else:
        print(f"mxc: report written: {output}")
    return 0


# ---- dashboard


def _dashboard(args: argparse.Namespace) -> int:
    import subprocess
    import tempfile

    from mxc.runtime.observe.prometheus import free_ports
    from mxc.runtime.observe.tsdb import open_tsdb

    run, record = _find(args.ref)
    stop = {"now": False}

    def handler(signum: int, frame: Any) -> None:
        stop["now"] = True

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    tensorboard: subprocess.Popen[bytes] | None = None
    try:
        with open_tsdb(run, record, bind=args.bind) as tsdb, tempfile.TemporaryDirectory(prefix="mxc-dashboard-") as tmp:
            urls = {"prometheus": _graph_url(tsdb.url, tsdb.window.start, tsdb.window.end)}
            if not args.no_tensorboard:
                logdir = _tensorboard_dir(run, record)
                port = free_ports(args.bind, _tensorboard_port(run, record), 1)[0]
                log = open(Path(tmp) / "tensorboard.log", "wb")  # noqa: SIM115  # kept open while it runs
                tensorboard = subprocess.Popen(
                    [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", args.bind,
                     "--port", str(port)], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
                urls["tensorboard"] = f"http://{args.bind}:{port}/"
                _wait_http(urls["tensorboard"], tensorboard, lambda: stop["now"])
            if args.json:
                print_json({"run": run.run_id, "live": tsdb.live, **urls})
            else:
                how = "the run's live Prometheus" if tsdb.live else f"the run's TSDB, reopened read-only from {run.tsdb / 'data'}"
                print(f"Prometheus   {urls['prometheus']}\n             ({how})")
                if "tensorboard" in urls:
                    print(f"TensorBoard  {urls['tensorboard']}")
                print("Ctrl-C stops them.")
            sys.stdout.flush()
            while not stop["now"]:
                if tensorboard is not None and tensorboard.poll() is not None:
                    print(f"mxc: tensorboard exited ({tensorboard.returncode})", file=sys.stderr)
                    break
                time.sleep(0.2)
    finally:
        if tensorboard is not None and tensorboard.poll() is None:
            tensorboard.terminate()
            try:
                tensorboard.wait(10)
            except subprocess.TimeoutExpired:
                tensorboard.kill()
                tensorboard.wait()
        for sig, old in previous.items():
            signal.signal(sig, old)
    return 0


def _tensorboard_dir(run: Any, record: Any) -> Path:
    """The run's TensorBoard events, where its bundle's contract puts them (mxc/runtime/runpaths.py;
    never a path from record.json), and only inside the run's own trees."""
    import os

    from mxc.errors import UserError
    from mxc.runtime import runpaths

    paths = runpaths.of_run(run, record, store())
    if os.path.lexists(paths.tensorboard) and not paths.holds(paths.tensorboard):
        raise UserError(f"run {run.run_id}: its TensorBoard directory {paths.tensorboard} leads outside the run's trees",
                        "not serving it; mxc dashboard --no-tensorboard serves Prometheus only")
    return paths.tensorboard


def _tensorboard_port(run: Any, record: Any) -> int:
    from mxc.runtime import kept_bundle

    contract = kept_bundle.contract_of(run, record, store())
    return contract.observability.tensorboard_port if contract is not None else 6006


def _graph_url(base: str, start: float, end: float) -> str:
    from urllib.parse import urlencode

    span = max(60, int(end - start))
    params = {"g0.expr": "mxc_train_loss", "g0.tab": "0", "g0.range_input": f"{span}s",
              "g0.end_input": _when(end), "g0.moment_input": _when(end)}
    return f"{base}/graph?{urlencode(params)}"


def _wait_http(url: str, process: Any, stopped: Any, timeout: float = 120.0) -> None:
    import urllib.request

    from mxc.errors import UserError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stopped():
        if process.poll() is not None:
            raise UserError(f"tensorboard exited ({process.returncode}) before serving {url}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.2)
    if not stopped():
        raise UserError(f"tensorboard did not answer at {url} within {timeout:.0f}s")
