"""Prometheus targets left by an earlier start of a requeued Slurm job, removed before the new head's
Prometheus reads ``<run>/prometheus/targets/``.

Each node writes its own file_sd targets (``exporter-<node>.json``, ``ray-<node>.json``,
``site-<node>-<name>.json``; the head its ``alert-receiver-<node>.json``) into the run directory, which
outlives the job's starts. A requeued job may start on other nodes: the files of nodes it no longer
has would make the new Prometheus send the run's scrape token to addresses someone else may now
hold, and post its alerts to a loopback port of the new head that some other process may own. So
node rank 0, before it starts Prometheus, removes every target file of a node outside this start's
node list, and every alert receiver's but its own (a receiver is the head's alone, on loopback).
The node list is Slurm's (``SLURM_JOB_NODELIST``), expanded by ``scontrol show hostnames``, or here
where the nodes have no scontrol; with no list, only other heads' receivers are removed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

# The kinds of file_sd target files a node writes, by file name prefix; site-<node>-<name>.json
# carries a suffix after the node's name.
_PER_NODE = ("exporter-", "ray-", "alert-receiver-")
_SITE = "site-"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """``node[01-03,07],gpu5`` -> ``node01 node02 node03 node07 gpu5`` (Slurm's hostlist syntax,
    brackets anywhere in a name, several per name). ValueError for anything else."""
    names: list[str] = []
    for item in _split_top_level(text.strip()):
        names += _expand_one(item)
    return names


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "[") - (ch == "]")
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in {text!r}")
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced brackets in {text!r}")
    items.append(text[start:])
    return [item for item in items if item]


def _expand_one(item: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        if "]" in item:
            raise ValueError(f"unbalanced brackets in {item!r}")
        return [item]
    close_at = item.index("]", open_at)
    head, body, rest = item[:open_at], item[open_at + 1:close_at], item[close_at + 1:]
    values: list[str] = []
    for part in body.split(","):
        match = _RANGE.match(part)
        if not match:
            raise ValueError(f"not a range: {part!r} in {item!r}")
        first, last = match[1], match[2] or match[1]
        width = len(first) if first.startswith("0") else 0
        if int(last) < int(first) or int(last) - int(first) > 100_000:
            raise ValueError(f"not a range: {part!r} in {item!r}")
        values += [str(n).zfill(width) for n in range(int(first), int(last) + 1)]
    tails = _expand_one(rest) if rest else [""]
    return [f"{head}{value}{tail}" for value in values for tail in tails]


def job_nodes(env: Mapping[str, str]) -> set[str] | None:
    """This start's node names (as ``SLURMD_NODENAME`` names them), or None when Slurm gave no list."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        return None
    scontrol = shutil.which("scontrol", path=env.get("PATH"))
    if scontrol:
        try:
            done = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                                  timeout=30, check=False)
            if done.returncode == 0 and done.stdout.split():
                return set(done.stdout.split())
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        return set(expand_hostlist(nodelist))
    except ValueError:
        return None


def _owner(stem: str, nodes: set[str]) -> str | None:
    """The node of the job a target file belongs to, or None."""
    for prefix in _PER_NODE:
        if stem.startswith(prefix) and stem[len(prefix):] in nodes:
            return stem[len(prefix):]
    if stem.startswith(_SITE):
        return next((node for node in nodes if stem.startswith(f"{_SITE}{node}-")), None)
    return None


def stale_targets(targets_dir: Path, head: str, nodes: set[str] | None) -> list[Path]:
    """The target files of ``targets_dir`` the head's Prometheus must not read (see the module's doc)."""
    stale = []
    for path in sorted(targets_dir.glob("*.json")):
        stem = path.name[:-len(".json")]
        if stem.startswith("alert-receiver-"):
            if stem != f"alert-receiver-{head}":
                stale.append(path)
        elif nodes is not None and stem.startswith((*_PER_NODE, _SITE)) and _owner(stem, nodes) is None:
            stale.append(path)
    return stale


def remove_stale_targets(targets_dir: Path, head: str, env: Mapping[str, str]) -> list[str]:
    """Remove what ``stale_targets`` finds; the names removed (for the node's status file)."""
    if not targets_dir.is_dir():
        return []
    removed = []
    for path in stale_targets(targets_dir, head, job_nodes(env)):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path.name)
    return removed
