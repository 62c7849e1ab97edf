#!/usr/bin/env python3
"""What bit-exact replay costs: repeated runs of one MaxText config, with and without XLA's determinism flags.

Builds the tiny spec (plus ``--set`` overrides: a bigger model on a GPU), then runs MaxText's own command
``--repeats`` times as it is and ``--repeats`` times with ``XLA_FLAGS`` holding the determinism flags of
``reproducibility.deterministic`` (docs/runs.md#proven-replay), all on one warm compilation cache. For each
group it prints whether every run's per-step losses (MaxText's full-precision ``metrics_file``) are
bit-identical to the group's first run, the first differing step if not, and the steps/s of each group
(from MaxText's own step timestamps, compilation excluded).

On CPU both groups are bit-identical (XLA's CPU kernels do not race); on a GPU the default group may
differ from run to run, and the deterministic one costs some speed. Figures: docs/performance.md.

  python benchmarks/determinism_cost.py [--platform cuda] [--steps 200] [--repeats 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_overhead  # noqa: E402  (the bare-MaxText measuring helpers)

# XLA's documented switches for run-to-run determinism on GPU (the XLA flag catalog of the pinned jaxlib
# has both; docs/runs.md#proven-replay cites their sources). They are no-ops on CPU.
DETERMINISM_XLA_FLAGS = ("--xla_gpu_deterministic_ops=true", "--xla_gpu_exclude_nondeterministic_ops=true")


def losses(metrics: Path) -> list[tuple[int, float]]:
    """(step, loss) of every line of a MaxText ``metrics_file``, in order."""
    out: list[tuple[int, float]] = []
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        out.append((int(row["step"]), float(row["learning/loss"])))
    return out


def first_difference(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> str | None:
    """The first step whose loss differs (bitwise, via repr), or None when the two runs agree."""
    for (sa, la), (sb, lb) in zip(a, b, strict=False):
        if sa != sb or repr(la) != repr(lb):
            return f"step {sa}: {la!r} != {lb!r}"
    if len(a) != len(b):
        return f"{len(a)} steps != {len(b)} steps"
    return None


def run_group(work: Path, spec: dict[str, object], cache: Path, env: dict[str, str], name: str,
              repeats: int) -> tuple[list[str | None], float]:
    """``repeats`` bare runs; per run after the first its difference from the first, and the median steps/s."""
    runs: list[list[tuple[int, float]]] = []
    rates: list[float] = []
    for n in range(repeats):
        run_dir = work / f"{name}-{n}"
        run_dir.mkdir()
        log = run_dir / "train.log"
        with open(log, "wb") as fh:
            proc = subprocess.Popen(run_overhead.bare_command(spec, run_dir, cache), env=env, stdout=fh,
                                    stderr=subprocess.STDOUT)
            run_overhead.wait_first_step(proc, functools.partial(Path, log), time.monotonic())
            if proc.wait() != 0:
                raise RuntimeError(f"{name} run {n} failed; see {log}")
        runs.append(losses(run_dir / "metrics.jsonl"))
        rates.append(run_overhead.steps_per_second(log))
        print(f"  {name} run {n}: {rates[-1]:.1f} steps/s, final loss {runs[-1][-1][1]!r}", file=sys.stderr)
    return [first_difference(runs[0], r) for r in runs[1:]], statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--platform", default="cpu", help="JAX_PLATFORMS (cuda, rocm on a GPU node)")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="extra spec override (a bigger model on a GPU), repeatable")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    opts = parser.parse_args()
    if opts.repeats < 2:
        parser.error("--repeats must be at least 2 (determinism is a comparison of runs)")

    with run_overhead.scratch("mxc-determinism-", opts.keep) as work:
        home = work / "home"
        cache = home / "cache" / "jax"
        env = {**os.environ, "MXC_HOME": str(home), "JAX_PLATFORMS": opts.platform}
        env.pop("XLA_FLAGS", None)
        _, spec = run_overhead.build(home, opts.steps, [f"env.vars.JAX_PLATFORMS={opts.platform}", *opts.sets])
        print(f"{opts.platform}, {opts.steps} steps, {opts.repeats} runs per group", file=sys.stderr)
        warm = work / "warm"
        warm.mkdir()
        for flags in ("", " ".join(DETERMINISM_XLA_FLAGS)):  # one compilation of each variant, not timed
            proc = subprocess.run(run_overhead.bare_command(spec, warm / f"w{len(flags)}", cache),
                                  env={**env, "XLA_FLAGS": flags}, capture_output=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout.decode(errors="replace")[-3000:])
                raise RuntimeError(f"warm-up run with XLA_FLAGS={flags!r} failed")
        default_diffs, default_rate = run_group(work, spec, cache, env, "default", opts.repeats)
        det_env = {**env, "XLA_FLAGS": " ".join(DETERMINISM_XLA_FLAGS)}
        det_diffs, det_rate = run_group(work, spec, cache, det_env, "deterministic", opts.repeats)
        result = {"platform": opts.platform, "steps": opts.steps, "repeats": opts.repeats, "sets": opts.sets,
                  "default_identical": all(d is None for d in default_diffs),
                  "default_first_difference": next((d for d in default_diffs if d), None),
                  "deterministic_identical": all(d is None for d in det_diffs),
                  "deterministic_first_difference": next((d for d in det_diffs if d), None),
                  "steps_per_s_default": round(default_rate, 2), "steps_per_s_deterministic": round(det_rate, 2),
                  "deterministic_speed_ratio": round(det_rate / default_rate, 4)}
        print(f"default:       bit-identical across runs: {result['default_identical']}"
              f"{'' if result['default_identical'] else ' (' + str(result['default_first_difference']) + ')'}")
        print(f"deterministic: bit-identical across runs: {result['deterministic_identical']}   (target: True)")
        print(f"speed with determinism: {det_rate / default_rate:.3f} x default   (reference: about 0.94 on GPU)")
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
