"""The agent skills in docs/skills/ stay true: every command they give is run against recorded runs
(the triage fixtures, and a two-node run recorded on the test Slurm cluster with observability
on, tests/fixtures/runs/two-node/), the JSON fields they tell an agent to read exist in what the
commands print, the series they name are documented, and the triage skill covers every cause.

The post-mortem query of the issue's "done when" (step time vs GPU temperature/power vs TCP
retransmits, same timeline, node labels) is one of the tsdb-diagnosis commands; its result is
also checked value by value against the recorded run's own files."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mxc.runtime.triage import catalog
from tests.test_metrics_doc import documented_names

REPO = Path(__file__).resolve().parents[1]
SKILLS = REPO / "docs/skills"
TWO_NODE = REPO / "tests/fixtures/runs/two-node"
TRIAGE = REPO / "tests/fixtures/triage"
TRIAGE_CASES = ("hang", "node_failure_xid79", "host_oom_cgroup", "slurm_segv_rank1", "nccl_error", "succeeded_after_kill")
EXPECT_EMPTY = re.compile(r"#\s*expect:\s*empty\s*\((?P<why>[^)]+)\)\s*$")
FIELD = re.compile(r"`(\.[a-z_]+(?:\[\])?(?:\.[a-z_]+(?:\[\])?)*)`")


@dataclass(frozen=True)
class Skill:
    path: Path
    front: dict[str, Any]
    body: str

    @property
    def commands(self) -> list[tuple[str, str | None]]:
        """(command line, why it may return nothing) for every `mxc ...` line of the sh blocks."""
        out = []
        for block in re.findall(r"^```sh\n(.*?)^```", self.body, re.M | re.S):
            for line in block.splitlines():
                if line.startswith("mxc "):
                    empty = EXPECT_EMPTY.search(line)
                    out.append((line, empty["why"] if empty else None))
        return out

    @property
    def fields(self) -> set[str]:
        return set(FIELD.findall(self.body))


def skills() -> dict[str, Skill]:
    found = {}
    for path in sorted(SKILLS.glob("*.md")):
        if path.name == "README.md":
            continue
        text = path.read_text()
        match = re.match(r"^---\n(.*?)\n---\n(.*)$", text, re.S)
        assert match, f"{path.name}: front matter (--- name, description ---) first"
        found[path.stem] = Skill(path, yaml.safe_load(match[1]), match[2])
    return found


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MXC_HOME holding the recorded two-node run and some triage fixtures, as mxc left them."""
    root = tmp_path_factory.mktemp("skills") / "mxc-home"
    (root / "runs").mkdir(parents=True)
    for run in TWO_NODE.iterdir():
        shutil.copytree(run, root / "runs" / run.name)
    for case in TRIAGE_CASES:
        run_id = json.loads((TRIAGE / case / "record.json").read_text())["run_id"]
        shutil.copytree(TRIAGE / case, root / "runs" / run_id)
    return root


def two_node_run() -> str:
    [run] = [p.name for p in TWO_NODE.iterdir()]
    return run


def run_command(home: Path, line: str, run_id: str) -> subprocess.CompletedProcess[str]:
    argv = ["RUN" if a == "RUN" else a for a in shlex.split(line, comments=True)]
    assert argv[0] == "mxc" and argv[1] in ("triage", "metrics"), f"a skill uses only mxc triage and mxc metrics: {line}"
    assert "--json" in argv, f"a skill reads JSON: {line}"
    argv = [run_id if a == "RUN" else a for a in argv[1:]]
    return subprocess.run([sys.executable, "-m", "mxc", *argv], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "MXC_HOME": str(home), "PYTHONPATH": str(REPO)}, check=False)


def lookup(data: Any, path: str) -> list[Any]:
    """Values at a jq-like path (`.a.b[]` -> each element's b... ); [] where absent."""
    values = [data]
    for part in path.strip(".").split("."):
        name, each = part.removesuffix("[]"), part.endswith("[]")
        values = [v[name] for v in values if isinstance(v, dict) and name in v]
        if each:
            values = [item for v in values if isinstance(v, list) for item in v]
    return values


def test_skills_exist_with_front_matter() -> None:
    found = skills()
    assert {"job-triage", "tsdb-diagnosis"} <= set(found)
    for name, skill in found.items():
        assert skill.front.get("name") == name and len(str(skill.front.get("description", ""))) > 80
        assert skill.commands, f"{name}: no commands"


def test_triage_skill_commands_on_recorded_failures(home: Path) -> None:
    skill = skills()["job-triage"]
    outputs: list[Any] = []
    runs = [json.loads((TRIAGE / c / "record.json").read_text())["run_id"] for c in TRIAGE_CASES]
    for line, _ in skill.commands:
        if " triage " in f" {line} ":
            for run_id in runs:
                done = run_command(home, line, run_id)
                assert done.returncode == 0, (line, run_id, done.stderr)
                outputs.append(json.loads(done.stdout))
    assert {o["cause"] for o in outputs} >= {"hang", "node_failure", "host_oom", "native_crash", "nccl_error", "none"}
    triage_fields = {f for f in skill.fields if not f.startswith((".series", ".result", ".start", ".end", ".live"))}
    for field in sorted(triage_fields):  # every field the skill reads is printed for some failure
        assert any(lookup(o, field) for o in outputs) or any(_present(o, field) for o in outputs), field


def _present(data: Any, path: str) -> bool:
    """The last key exists (its value may be null or empty) under an existing parent."""
    parent, _, last = path.rpartition(".")
    holders = lookup(data, parent) if parent else [data]
    return any(isinstance(h, dict) and last.removesuffix("[]") in h for h in holders)


def test_triage_skill_covers_every_cause() -> None:
    table = skills()["job-triage"].body
    causes = {f"`{c}`" for c in catalog.load().causes} | {"`none`", "`unknown`"}
    missing = sorted(c for c in causes if f"| {c} |" not in table)
    assert not missing, f"job-triage.md's table lacks {missing}"


@pytest.mark.parametrize("name", ["job-triage", "tsdb-diagnosis"])
def test_metrics_commands_on_the_recorded_two_node_run(home: Path, name: str) -> None:
    skill = skills()[name]
    run_id = two_node_run()
    outputs = []
    for line, why_empty in skill.commands:
        if " metrics " not in f" {line} ":
            continue
        done = run_command(home, line, run_id)
        assert done.returncode == 0, (line, done.stderr)
        out = json.loads(done.stdout)
        outputs.append(out)
        if "--query" not in line:
            assert out["series"], line
            continue
        if why_empty:
            assert out["result"] == [], f"expected nothing here ({why_empty}): {line}"
        else:
            assert out["result"] and all(r["values"] for r in out["result"]), f"no series: {line}"
            if "by (node" in line:
                assert {r["metric"].get("node") for r in out["result"]} == {"node1", "node2"}, line
    for field in sorted(f for f in skill.fields if f.startswith((".series", ".result", ".start", ".end", ".live"))):
        assert any(_present(o, field) for o in outputs), field


def test_every_series_a_skill_names_is_documented() -> None:
    documented = documented_names()
    for name, skill in skills().items():
        used = {n for n in re.findall(r"\b(mxc_[a-z_]+)\b", skill.body) if not n.endswith("_")}  # not prefixes: mxc_gpu_*
        assert used, name
        assert used <= documented, f"{name} names series metrics.md does not list: {sorted(used - documented)}"


def test_post_mortem_query_lines_up_step_time_gpu_and_network_per_node(home: Path) -> None:
    """The "done when" query on the recorded two-node run: four signals per node on one timeline;
    the slow step (both ranks held 12 s after step 10) is in it on both nodes at the time the
    metrics files say; the GPU values are the replayed H100 capture's."""
    [line] = [c for c, _ in skills()["tsdb-diagnosis"].commands if "label_replace" in c]
    out = json.loads(run_command(home, line, two_node_run()).stdout)
    series = {(r["metric"]["node"], r["metric"]["signal"]): r["values"] for r in out["result"]}
    signals = {"step_time_seconds", "gpu_temperature_celsius", "gpu_power_watts", "tcp_retransmits_per_second"}
    assert set(series) == {(node, s) for node in ("node1", "node2") for s in signals}
    grid = {t for values in series.values() for t, _ in values}
    assert all(t - min(grid) == int(t - min(grid)) for t in grid)  # one timeline: the same 1 s steps for all
    assert {v for _, v in series[("node1", "gpu_temperature_celsius")]} == {59.0}  # H100 under load, recorded
    assert {v for _, v in series[("node2", "gpu_power_watts")]} == {631.95}
    run = TWO_NODE / two_node_run()
    for rank, node in ((0, "node1"), (1, "node2")):
        lines = [json.loads(x) for x in (run / f"metrics/attempt-0.rank-{rank}.jsonl").read_text().splitlines()]
        slow = max(lines, key=lambda x: x["perf/step_time_seconds"])
        assert slow["perf/step_time_seconds"] > 10 and slow["step"] > 10
        peak = max(v for _, v in series[(node, "step_time_seconds")])
        assert peak == slow["perf/step_time_seconds"]  # the exact float, not lost between two scrapes
