"""Flag suggestions that help (issue 29): did-you-mean never points at a flag the pinned jaxlib's
catalog marks deprecated when a current one fits, and a renamed or removed flag gets its successor
from the catalogs' own history (tools/gen_xla_flag_catalog.py generated every catalog from a real
jaxlib; mxc/compiler/check/xla_successors.py reads their documentation). Driven through the CLI:
`mxc check`, `mxc build` and `mxc flags NAME`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import Mxc, copy_specs


def _spec(tmp_path: Path, flags: str) -> Path:
    copy_specs(tmp_path)
    spec = tmp_path / "flags.yaml"
    spec.write_text("extends: specs/tiny.yaml\nenv:\n  xla_flags:\n" + flags)
    return spec


def _findings(mxc: Mxc, spec: Path) -> dict[str, dict[str, str]]:
    out = mxc("check", str(spec), "--format", "json")
    assert out.returncode == 1, out.stderr
    return {f["key"].rsplit(".", 1)[-1]: f for f in json.loads(out.stdout)["findings"]}


def test_a_misspelt_flag_is_never_pointed_at_a_deprecated_one(mxc: Mxc, tmp_path: Path) -> None:
    """`xla_gpu_enable_async_all_gather` was closest to `xla_gpu_enable_pipelined_all_gather`, which
    jaxlib 0.12.0.1's own catalog documents as "[Deprecated] True maps to --xla_gpu_pipeline_all_gather=on"."""
    found = _findings(mxc, _spec(tmp_path, "    xla_gpu_enable_async_all_gather: true\n"))
    hint = found["xla_gpu_enable_async_all_gather"]["suggestion"]
    assert hint.startswith("did you mean 'xla_gpu_pipeline_all_gather'?"), hint
    flags = json.loads(mxc("flags", "--json").stdout)["flags"]
    deprecated = {f["name"] for f in flags if f["deprecated"]}
    assert "xla_gpu_enable_pipelined_all_gather" in deprecated and "xla_gpu_pipeline_all_gather" not in deprecated
    suggested = hint.split("'")[1]
    assert suggested not in deprecated


def test_a_removed_flag_gets_its_documented_successor(mxc: Mxc, tmp_path: Path) -> None:
    """`xla_gpu_graph_level` (jaxlib 0.6.2: "Use xla_gpu_enable_command_buffer in new use cases") was
    answered with `xla_gpu_autotune_level`, an unrelated flag."""
    spec = _spec(tmp_path, "    xla_gpu_graph_level: 1\n    xla_gpu_enable_pipelined_all_gather: true\n")
    found = _findings(mxc, spec)
    removed = found["xla_gpu_graph_level"]
    assert removed["rule"] == "xla-flag-version"
    assert removed["suggestion"].startswith("use --xla_gpu_enable_command_buffer instead; jaxlib 0.6.2 documents")
    assert "autotune" not in removed["suggestion"]
    deprecated = found["xla_gpu_enable_pipelined_all_gather"]
    assert deprecated["rule"] == "xla-flag-deprecated" and deprecated["suggestion"] == "use --xla_gpu_pipeline_all_gather=on"
    built = mxc("build", str(spec))  # the build gate says the same
    assert built.returncode == 2
    assert "(use --xla_gpu_enable_command_buffer instead;" in built.stderr, built.stderr


def test_flags_shows_one_flag_in_full_and_what_became_of_an_old_one(mxc: Mxc) -> None:
    out = mxc("flags", "xla_gpu_enable_pipelined_all_gather")
    assert out.returncode == 0, out.stderr
    assert "type bool, default false; deprecated" in out.stdout
    assert "successor: --xla_gpu_pipeline_all_gather=on" in out.stdout
    out = mxc("flags", "--", "--xla_gpu_graph_level=1")  # as written in XLA_FLAGS
    assert out.returncode == 1
    assert "not a flag of jaxlib 0.12.0.1; jaxlib 0.6.2 had it" in out.stdout
    assert "use --xla_gpu_enable_command_buffer instead" in out.stdout
    out = mxc("flags", "xla_gpu_grph_level")
    assert out.returncode == 2 and "did you mean 'xla_gpu_enable_command_buffer'?" in out.stderr
    data = json.loads(mxc("flags", "xla_gpu_graph_level", "--json", "--jaxlib", "0.8.2").stdout)
    assert data["successor"] == {"name": "xla_gpu_enable_command_buffer", "value": None, "documented_in": "0.6.2"}


def test_flags_piped_keeps_every_word_of_the_documentation(mxc: Mxc) -> None:
    """Piped (not a terminal), no row is cut: the documentation was cut at 70 characters whatever the output."""
    out = mxc("flags", "--search", "xla_gpu_pipeline_all_gather")
    assert out.returncode == 0
    doc = json.loads(mxc("flags", "xla_gpu_enable_pipelined_all_gather", "--json").stdout)["doc"]
    row = next(line for line in out.stdout.splitlines() if line.startswith("xla_gpu_enable_pipelined_all_gather "))
    assert row.endswith(doc) and "…" not in out.stdout
    grep = subprocess.run(["grep", "-c", "default."], input=out.stdout, capture_output=True, text=True)
    assert int(grep.stdout) >= 1
