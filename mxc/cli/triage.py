"""When runs fail: triage, compare, notify."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mxc.cli.common import add_command, add_json, print_json, shown, store


def register(sub: Any) -> None:
    p = add_command(sub, "triage", "say why a run failed: the cause, the first failing rank and node, the first "
                    "error line, the evidence and what to try",
                    "mxc triage 20260101-120000\nmxc triage --json | jq .cause", _triage)
    p.add_argument("ref", nargs="?", help="run id or unique prefix (default: the latest run)")
    p.add_argument("-v", "--verbose", action="store_true", help="more evidence, the whole Python stack, the other ranks")
    add_json(p)

    p = add_command(sub, "compare", "compare two runs: spec fields, environment drift, the first step where "
                    "losses diverge, the step-time ratio; exit 1 when they differ (as mxc diff)",
                    "mxc compare 20260101-1200 20260102-0900   # exit 0: same spec, environment and losses\n"
                    "mxc compare A B --json -o compare.png", _compare)
    p.add_argument("a", help="run id (or unique prefix): the reference")
    p.add_argument("b", help="run id (or unique prefix): the run compared with it")
    p.add_argument("-o", "--output", metavar="PNG", help="also draw loss, loss difference and step time to this file")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance for 'diverged' (default 1e-5)")
    p.add_argument("--atol", type=float, default=1e-8, help="absolute tolerance for 'diverged' (default 1e-8)")
    add_json(p)

    p = add_command(sub, "notify", "chat alerts (the spec's notify section): send a test alert",
                    "mxc notify test --spec specs/tiny.yaml\nmxc notify test 20260101-1200", _notify_help)
    nsub = p.add_subparsers(dest="notify_command", metavar="ACTION")
    t = add_command(nsub, "test", "send a test alert with the notify settings of a spec, a run, or the last built bundle",
                    "mxc notify test --spec specs/tiny.yaml\nmxc notify test 20260101-1200", _notify_test)
    t.add_argument("ref", nargs="?", help="run id or prefix, or bundle hash prefix (default: the last built bundle)")
    t.add_argument("--spec", help="a spec file (compiled in memory; nothing is stored)")
    add_json(t)


# ---- triage


def _find_run(ref: str | None) -> Any:
    from mxc.errors import UserError
    from mxc.runtime import runs

    home = store().home
    if ref:
        return runs.find_run(home, ref)
    every = runs.all_runs(home)
    if not every:
        from mxc.runtime.runpaths import runs_root

        raise UserError(f"no runs in {runs_root(home)}", "start one with: mxc run")
    return every[-1]


def _load(run: Any) -> Any:
    from mxc.runtime import runs

    return runs.load(run)


def _triage(args: argparse.Namespace) -> int:
    from mxc.runtime.triage import classify

    run = _find_run(args.ref)
    record = _load(run) if run.record.is_file() else None
    verdict = classify(run.path, record)
    if args.json:
        print_json(verdict.as_dict())
        return 0
    print(render(verdict, verbose=args.verbose))
    return 0


def _clip(text: str, detail: str | None, width: int) -> str:
    """A long line cut to ``width``, around the matched detail when there is one."""
    if len(text) <= width:
        return text
    at = text.find(detail) if detail else -1
    if at > width // 3:
        start = at - width // 4
        return "..." + text[start: start + width - 6] + "..."
    return text[: width - 3] + "..."


def _hit_line(hit: Any, width: int = 220) -> str:
    text = _clip(hit.text, hit.detail, width)
    where = hit.where()
    rank = f" [rank {hit.rank}]" if hit.rank is not None else ""
    return f"  {where}{rank}: {text}"


def render(verdict: Any, verbose: bool = False) -> str:
    """The verdict for a person: cause first, then where, the first error, evidence, what to try."""
    lines = []
    code = f", exit {verdict.exit_code}" if verdict.exit_code not in (None, 0) else ""
    attempts = f", attempt {verdict.attempt} of {verdict.attempts}" if verdict.attempts > 1 else ""
    lines.append(f"run {verdict.run_id}: {verdict.status}{code}{attempts}")
    lines.append(f"cause: {verdict.cause_line()}")
    if verdict.rank is not None or verdict.node:
        ranks = len(verdict.ranks)
        first = " (first failing rank of " + str(ranks) + ")" if ranks > 1 else ""
        lines.append(f"where: rank {verdict.rank if verdict.rank is not None else '?'} on node {verdict.node or '?'}{first}")
    if verdict.first_error is not None:
        lines.append("first error:")
        lines.append(_hit_line(verdict.first_error, 400))
    rest = [h for h in verdict.evidence if h is not verdict.first_error]
    if rest:
        lines.append("evidence:")
        lines += [_hit_line(h) for h in rest[: (8 if verbose else 4)]]
    if verdict.first_error is not None and verdict.first_error.extra.get("frames"):
        lines.append("innermost frames:")
        lines += [f"  {f}" for f in verdict.first_error.extra["frames"]]
    crash = verdict.crash
    if crash:
        lines.append(f"crash: {crash.get('signal') or 'fatal signal'} on rank {crash['rank']}")
        if crash.get("core"):
            lines.append(f"  core dump: {crash['core']}")
        for note in crash.get("note", []):
            if not note.startswith(("core: cores/", "backtrace: stacks/")):
                lines.append(f"  {note}")
        if crash.get("backtrace"):
            lines.append(f"  native backtrace: {crash['backtrace']}")
        lines += [f"    {f}" for f in crash.get("native_frames", [])[: (12 if verbose else 6)]]
    if verdict.python_stack:
        which = "the crashing thread" if verdict.python_stack[0].startswith("Current thread") else \
            "the last thread listed (the signal hit a thread without Python frames)"
        lines.append(f"Python stack of {which} (faulthandler):")
        lines += [f"  {f}" for f in verdict.python_stack[: (16 if verbose else 6)]]
    if verdict.stacks:
        lines.append("stack dumps: " + ", ".join(verdict.stacks[:6]))
    if verdict.try_:
        lines.append("try:")
        lines += [f"  - {t}" for t in verdict.try_]
    if verdict.earlier:
        lines.append("earlier attempts:")
        for e in verdict.earlier:
            where = f" (rank {e['rank']})" if e.get("rank") is not None else ""
            first = e["first_error"]
            lines.append(f"  attempt {e['attempt']}: {e['title']}{where}: {_clip(first['text'], first.get('detail'), 160)}")
    if verbose:
        if len(verdict.ranks) > 1:
            lines.append("ranks:")
            lines += [f"  rank {r['rank']} ({r.get('node') or '?'}): {r['cause']}: {r['first'][:150]}" for r in verdict.ranks]
        if verdict.also:
            lines.append("also seen:")
            lines += [f"  {a['title']} (rank {a['rank']}, {a['role']}) at {a['where']}: {a['first'][:140]}"
                      for a in verdict.also]
    lines += [f"note: {n}" for n in verdict.notes]
    return "\n".join(shown(line) for line in lines)  # log lines and record fields: no terminal escapes


# ---- compare


def _compare(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime.triage.compare import compare_runs

    run_a, run_b = _find_run(args.a), _find_run(args.b)
    if run_a.path == run_b.path:
        raise UserError(f"'{args.a}' and '{args.b}' name the same run {run_a.run_id}")
    if args.rtol < 0 or args.atol < 0:
        raise UserError("--rtol and --atol must not be negative")
    rec_a, rec_b = _load(run_a), _load(run_b)
    result = compare_runs(store(), (run_a, rec_a), (run_b, rec_b), rtol=args.rtol, atol=args.atol)
    picture = None
    if args.output:
        out = Path(args.output)
        if out.suffix.lower() != ".png":
            raise UserError(f"{out}: the plot is a PNG file; name it *.png")
        from mxc.compare_plot import write_png
        from mxc.report.data import gather

        picture = write_png(gather(run_a, rec_a, with_tsdb=False), gather(run_b, rec_b, with_tsdb=False), result, out)
    code = 1 if result.differs else 0  # as `mxc diff`: 1 when something differs
    if args.json:
        data = result.as_dict()
        data["plot"] = str(picture) if picture else None
        print_json(data)
        return code
    print(render_comparison(result))
    if picture:
        print(f"plot: {picture}")
    return code


def render_comparison(result: Any) -> str:
    lines = [f"a: {result.a}", f"b: {result.b}"]
    if result.spec_changes:
        lines.append(f"spec: {len(result.spec_changes)} field(s) differ")
        lines += [f"  {c}" for c in result.spec_changes]
    else:
        lines.append("spec: identical" if not any("spec fields" in n for n in result.notes) else "spec: not compared")
    significant = [d for d in result.drift if d.significant]
    if result.drift:
        lines.append(f"environment: {len(significant)} significant difference(s)")
        lines += [f"  {'' if d.significant else '(note) '}{d.what}: {d.recorded} -> {d.now}" for d in result.drift[:30]]
        if len(result.drift) > 30:
            lines.append(f"  ... {len(result.drift) - 30} more (--json lists all)")
    else:
        lines.append("environment: identical")
    ld = result.losses
    if ld.common_steps:
        lines.append(f"losses: {ld.common_steps} common steps ({ld.first_step}..{ld.last_step})")
        if ld.first_diverging_exact is None:
            lines.append("  bit-identical at every common step")
        else:
            lines.append(f"  first step where losses differ (exact): {ld.first_diverging_exact}")
            tol = ld.first_diverging_tolerance
            lines.append(f"  first step beyond rtol={ld.rtol:g} atol={ld.atol:g}: "
                         + (str(tol) if tol is not None else "none (within tolerance everywhere)"))
            if ld.max_abs_diff is not None:
                lines.append(f"  largest difference: {ld.max_abs_diff:.6g} at step {ld.max_abs_diff_step}")
        if ld.only_a or ld.only_b:
            lines.append(f"  steps only in a: {len(ld.only_a)}, only in b: {len(ld.only_b)}")
    else:
        lines.append("losses: no common steps")
    ratio = result.step_time_ratio
    if ratio is not None:
        lines.append(f"step time (median, after {2} warm-up steps): a {result.step_time_a:.4f}s, "
                     f"b {result.step_time_b:.4f}s, b/a = {ratio:.3f}")
    else:
        lines.append("step time: not available for both runs")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(shown(line) for line in lines)


# ---- notify


def _notify_help(args: argparse.Namespace) -> int:
    from mxc.errors import UserError

    raise UserError("say what to do: mxc notify test [--spec SPEC | RUN]")


def _notify_spec(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(spec as in spec.json, where it came from)."""
    import json

    from mxc.errors import UserError

    if args.spec and args.ref:
        raise UserError("give either --spec SPEC or a run/bundle, not both")
    if args.spec:
        from mxc.build import compile_file

        bundle = compile_file(args.spec, ())
        return json.loads(bundle.files["spec.json"]), args.spec
    st = store()
    if args.ref:
        from mxc.runtime import runs

        ref = runs.resolve(st.home, args.ref, st.hashes())
        bundle = st.get(ref.bundle)
        return bundle.spec(), f"run {ref.run.run_id}" if ref.run else f"bundle {bundle.hash[:12]}"
    bundle = st.current()
    return bundle.spec(), f"the last built bundle {bundle.hash[:12]}"


def _notify_test(args: argparse.Namespace) -> int:
    from mxc.errors import UserError
    from mxc.runtime.notify import NotifyConfig, probe_message, send

    spec, origin = _notify_spec(args)
    config = NotifyConfig.from_spec(spec)
    if config is None:
        raise UserError(f"{origin} has no notify section", "add notify: {format: slack, secret_env: NAME} to the spec "
                        "(docs/alerts.md)")
    result = send(config, probe_message(spec, config))
    if args.json:
        print_json({"ok": result.ok, "status": result.status, "error": result.error, "format": config.format,
                    "secret_from": config.where(), "spec": origin})
    elif result.ok:
        print(f"mxc: test alert {result} to the {config.format} webhook from {config.where()}", file=sys.stderr)
    else:
        print(f"mxc: test alert {result} ({config.format}, secret from {config.where()})", file=sys.stderr)
    return 0 if result.ok else 1
