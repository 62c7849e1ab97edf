"""Everyday use, round 2 (issue 29): the smaller things a new user tripped over, each through the CLI.

`mxc --help` listed every command twice; `mxc run --help` listed `--set` only to refuse it;
`mxc show @` printed ~40 node-program hashes before the spec; `mxc watch @ --once` on a local run
printed nothing. (`mxc build missing.yaml`: tests/test_spec_errors.py; `mxc compare`'s exit status:
tests/test_compare.py; MaxText's [NO-OP] lines: tests/test_logs.py; `mxc flags`:
tests/test_flag_successors.py.)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from mxc.runtime.record import RunRecord
from tests.conftest import REPO, Mxc

TINY = REPO / "specs" / "tiny.yaml"


def test_top_help_lists_each_command_once(mxc: Mxc) -> None:
    from mxc.cli.main import HIDDEN_COMMANDS, build_parser

    out = mxc("--help")
    assert out.returncode == 0
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in commands.keys() - HIDDEN_COMMANDS:
        listed = re.findall(rf"^  mxc {re.escape(name)}\b", out.stdout, re.MULTILINE)
        assert listed, f"mxc {name} is not in mxc --help"
        mentions = re.findall(rf"^\s+{re.escape(name)}\s{{2,}}\S", out.stdout, re.MULTILINE)
        assert mentions == [], f"mxc {name} is listed a second time: {mentions}"


def test_run_help_does_not_offer_set_but_still_explains_the_refusal(mxc: Mxc) -> None:
    assert "--set" not in mxc("run", "--help").stdout
    out = mxc("run", "--set", "restart.max=1")
    assert out.returncode == 2 and "a bundle is immutable" in out.stderr and "mxc build SPEC --set" in out.stderr


def test_show_prints_the_spec_first_and_the_node_program_as_one_line(mxc: Mxc) -> None:
    assert mxc("build", str(TINY), "-q").returncode == 0
    out = mxc("show", "@")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.index("\nspec\n") < text.index("\nfiles\n")
    node_lines = [line for line in text.splitlines() if "mxc_node/" in line]
    assert len(node_lines) == 1 and re.search(r"\d+ files +mxc_node/ \(the node program; --files", node_lines[0])
    every = mxc("show", "@", "--files").stdout
    listed = [line for line in every.splitlines() if re.match(r"^  [0-9a-f]{12}  mxc_node/\w+\.py$", line)]
    assert len(listed) == int(node_lines[0].split()[0]) >= 30


def _local_run(home: Path, mxc: Mxc, status: str, final: bool) -> str:
    digest = mxc("build", str(TINY), "-q").stdout.strip()
    run_id = f"20260101-000000-{'ab12' if final else 'cd34'}-{digest[:8]}"
    run = home / "runs" / run_id
    run.mkdir(parents=True)
    RunRecord(run_id=run_id, bundle=digest, spec_name="tiny", backend="local", status=status,
              final=final, started="2026-01-01T00:00:00Z").save(run / "record.json")
    return run_id


def test_watch_on_a_local_run_says_it_needs_no_watch(mxc: Mxc, mxc_home: Path) -> None:
    """`mxc watch @ --once` on a local run printed nothing and exited 0."""
    run_id = _local_run(mxc_home, mxc, "succeeded", final=True)
    out = mxc("watch", "@", "--once")
    assert out.returncode == 0
    assert out.stderr == (f"mxc: run {run_id} is a local run (succeeded), final; only Slurm runs need `mxc watch` "
                          "(local runs record themselves)\n")
