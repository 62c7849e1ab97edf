"""``reproducibility.deterministic`` (issue 23, proven replay): what it sets per vendor and jaxlib,
decided by the compiler (mxc/compiler/determinism.py) and recorded in the bundle; every setting is a
flag of the pinned jaxlib's catalog or a variable of the env catalog, and its source is in the docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mxc.compiler import determinism
from mxc.compiler.check.catalogs import xla_catalog, xla_catalog_versions
from mxc.compiler.errors import SpecErrors
from mxc.compiler.pipeline import compile_spec
from tests.conftest import REPO, SPECS

ON = "reproducibility.deterministic=true"


def _run_json(spec: str, *sets: str) -> dict[str, object]:
    bundle = compile_spec(str(SPECS / spec), lambda p: Path(p).read_bytes(), sets, mxc_version="test")
    data: dict[str, object] = json.loads(bundle.files["run.json"])
    return data


def _env(spec: str, *sets: str) -> dict[str, str]:
    pairs = _run_json(spec, *sets)["env"]
    assert isinstance(pairs, list)
    return {str(name): str(value) for name, value in pairs}


@pytest.mark.parametrize("spec", ["llama3-8b.yaml", "70b.yaml", "mixtral-8x7b.yaml"])
def test_a_gpu_spec_gets_deterministic_ops_ring_collectives_and_te_determinism(spec: str) -> None:
    plain, pinned = _env(spec), _env(spec, ON)
    assert pinned["NCCL_ALGO"] == "Ring" and pinned["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] == "0"
    assert "--xla_gpu_deterministic_ops=true" in pinned["XLA_FLAGS"].split()
    assert pinned["XLA_FLAGS"].split() == sorted([*plain["XLA_FLAGS"].split(), "--xla_gpu_deterministic_ops=true"])
    assert {k: v for k, v in pinned.items() if k not in ("NCCL_ALGO", "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "XLA_FLAGS")} \
        == {k: v for k, v in plain.items() if k != "XLA_FLAGS"}  # nothing else changes


def test_a_cpu_spec_needs_no_setting_but_the_bundle_records_the_switch() -> None:
    assert _env("tiny.yaml", ON) == _env("tiny.yaml")
    bundle = compile_spec(str(SPECS / "tiny.yaml"), lambda p: Path(p).read_bytes(), (ON,), mxc_version="test")
    assert json.loads(bundle.files["spec.json"])["reproducibility"] == {"deterministic": True}
    plain = compile_spec(str(SPECS / "tiny.yaml"), lambda p: Path(p).read_bytes(), (), mxc_version="test")
    assert "reproducibility" not in json.loads(plain.files["spec.json"])  # and no bundle hash moved


def test_every_setting_is_known_to_its_catalog_and_cited_in_the_docs() -> None:
    variables = json.loads((REPO / "mxc/compiler/data/env_vars.json").read_text())["variables"]
    for setting in determinism.GPU_VARIABLES:
        assert setting.name in variables, setting.name
    for setting in determinism.XLA_FLAGS:  # every shipped jaxlib catalog has it, as a bool
        assert all(xla_catalog(v).flags[setting.name].type == "bool" for v in xla_catalog_versions()), setting.name
    docs = (REPO / "docs" / "runs.md").read_text()
    for setting in (*determinism.XLA_FLAGS, *determinism.GPU_VARIABLES):
        assert setting.name in docs and all(url.split(": ")[-1] in docs for url in setting.source.split("; "))


@pytest.mark.parametrize("sets, message", [
    (("env.vars.NCCL_ALGO=Tree",), "env.vars.NCCL_ALGO: reproducibility.deterministic sets it to Ring"),
    (("env.xla_flags.xla_gpu_deterministic_ops=false",),
     "env.xla_flags.xla_gpu_deterministic_ops: reproducibility.deterministic sets it to true"),
    (("env.ranks.0.vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO=1",),
     "env.ranks.0.vars.NVTE_ALLOW_NONDETERMINISTIC_ALGO: reproducibility.deterministic sets it to 0"),
    (("code.jaxlib_version=0.4.1",), "mxc has no XLA flag catalog of this spec's jaxlib"),
])
def test_a_spec_that_contradicts_the_switch_is_refused(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(SpecErrors) as err:
        _run_json("llama3-8b.yaml", ON, *sets)
    assert message in str(err.value), str(err.value)
    assert _run_json("llama3-8b.yaml", ON, "env.vars.NCCL_ALGO=Ring")  # the same value is no contradiction
