"""Shared bases (issue 29): `extends: base:NAME` reads a team's base from the directories of
MXC_SPEC_PATH (set outside any spec), so one `cuda.yaml` serves specs in every repository. The base
is confined like a repository base (regular files under a search directory, no symlink out, bounded),
and what it holds is part of the bundle and its hash, where it was found is not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, Mxc, store_snapshot

SECRET = "s3cr3t-from-outside"


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """A team's directory of bases (outside the spec's repository): tiny.yaml and a base extending it."""
    team = tmp_path / "team"
    (team / "cpu").mkdir(parents=True)
    (team / "tiny.yaml").write_text((REPO / "specs" / "tiny.yaml").read_text())
    (team / "cpu" / "short.yaml").write_text("extends: ../tiny.yaml\nmodel:\n  overrides:\n    steps: 5\n"
                                             "    learning_rate_schedule_steps: 5\n")
    return team


def _repo(tmp_path: Path, text: str, name: str = "repo") -> Path:
    repo = tmp_path / name
    (repo / "specs").mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "specs" / "mine.yaml").write_text(text)
    return repo / "specs" / "mine.yaml"


def test_a_base_on_the_search_path_builds_from_another_repository(mxc: Mxc, tmp_path: Path, team: Path) -> None:
    spec = _repo(tmp_path, "extends: base:cpu/short.yaml\nname: mine\nrestart:\n  max: 1\n")
    env = {"MXC_SPEC_PATH": f"{tmp_path / 'empty'}{os.pathsep}{team}"}  # searched in order; a missing dir is skipped
    out = mxc("build", str(spec), "--json", env=env)
    assert out.returncode == 0, out.stderr
    built = json.loads(out.stdout)
    resolved = json.loads((Path(built["path"]) / "spec.json").read_text())
    assert resolved["name"] == "mine" and resolved["model"]["overrides"]["steps"] == 5  # the base's base merged too
    assert resolved["model"]["overrides"]["base_emb_dim"] == 64 and resolved["restart"]["max"] == 1
    assert str(team) not in json.dumps(resolved)  # where the base was found is no part of the bundle
    checked = mxc("check", str(spec), env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_bases_content_is_part_of_the_hash_and_its_place_is_not(mxc: Mxc, tmp_path: Path, team: Path) -> None:
    spec = _repo(tmp_path, "extends: base:cpu/short.yaml\nname: mine\n")

    def built(path: Path) -> str:
        out = mxc("build", str(spec), "-q", env={"MXC_SPEC_PATH": str(path)})
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    first = built(team)
    moved = tmp_path / "elsewhere" / "team"
    moved.parent.mkdir()
    team.rename(moved)
    assert built(moved) == first  # the same content found in another directory: the same bundle
    short = moved / "cpu" / "short.yaml"
    short.write_text(short.read_text().replace("steps: 5", "steps: 6"))
    assert built(moved) != first  # the base changed: another bundle


def test_without_the_search_path_or_the_base_the_error_says_what_to_set(mxc: Mxc, mxc_home: Path, tmp_path: Path,
                                                                        team: Path) -> None:
    spec = _repo(tmp_path, "name: mine\nextends: base:cuda.yaml\n")
    unset = {k: v for k, v in os.environ.items() if k != "MXC_SPEC_PATH"}
    out = mxc("build", str(spec), env={**unset, "MXC_SPEC_PATH": ""})
    assert out.returncode == 2
    assert out.stderr.splitlines()[0] == (
        f"{spec}:2: extends: 'base:cuda.yaml': MXC_SPEC_PATH is not set (export MXC_SPEC_PATH=/path/to/shared/specs "
        "(directories, ':' between them; docs/spec-reference.md#shared-bases))")
    out = mxc("build", str(spec), env={"MXC_SPEC_PATH": str(team)})
    assert out.returncode == 2 and f"'base:cuda.yaml' is in no directory of MXC_SPEC_PATH ({team})" in out.stderr
    assert store_snapshot(mxc_home) == []


@pytest.mark.parametrize("name, why", [
    ("../outside.yaml", "is not a base name"),
    ("/etc/passwd", "is not a base name"),
    ("link.yaml", "outside the spec's repository"),
    ("cpu/escape.yaml", "outside the spec's repository"),
    ("fifo.yaml", "not a regular file"),
])
def test_a_base_is_confined_to_its_search_directory(mxc: Mxc, mxc_home: Path, tmp_path: Path, team: Path,
                                                   name: str, why: str) -> None:
    outside = tmp_path / "outside.yaml"
    outside.write_text(f"name: {SECRET}\n")
    (team / "link.yaml").symlink_to(outside)  # a symlink out of the search directory
    (team / "cpu" / "escape.yaml").write_text("extends: ../../outside.yaml\n")  # a base's own relative extends
    os.mkfifo(team / "fifo.yaml")  # reading it would hang the build
    spec = _repo(tmp_path, f"extends: base:{name}\n")
    out = mxc("build", str(spec), env={"MXC_SPEC_PATH": str(team)}, timeout=120)
    assert out.returncode == 2 and why in out.stderr, out.stderr
    assert SECRET not in out.stdout + out.stderr and "Traceback" not in out.stderr
    assert store_snapshot(mxc_home) == []
