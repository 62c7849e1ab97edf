"""The shipped catalogs against the real thing: the installed jaxlib's flag parser and MaxText."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from importlib import resources

import pytest

from mxc.compiler.check.catalogs import (
    all_flag_versions,
    env_catalog,
    maxtext_catalog,
    xla_catalog,
    xla_catalog_versions,
    xla_index,
)
from mxc.compiler.check.xla_tokens import split_flags, value_problem

TYPES = {"bool", "int32", "int64", "float", "string"}


def installed_jaxlib() -> str:
    out = subprocess.run([sys.executable, "-c", "import jaxlib; print(jaxlib.__version__)"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def start_jax(xla_flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update({"XLA_FLAGS": xla_flags, "JAX_PLATFORMS": "cpu"})
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                          text=True, timeout=300)


def test_catalog_files_are_consistent() -> None:
    versions = xla_catalog_versions()
    assert {"0.6.2", "0.12.0", "0.12.0.1"} <= set(versions)
    assert xla_index()["default"] in versions
    for version in versions:
        cat = xla_catalog(version)
        assert cat.jaxlib_version == version and len(cat.flags) > 200
        assert {f.type for f in cat.flags.values()} <= TYPES
    assert xla_index()["maxtext"]["0.2.5"] in versions


def test_installed_jaxlib_has_a_catalog_and_a_sample_of_it_starts_jax() -> None:
    version = installed_jaxlib()
    cat = xla_catalog(version)
    rng = random.Random(8)
    sample = rng.sample(sorted(n for n, f in cat.flags.items() if f.type in ("bool", "int32", "int64")), 60)
    tokens = []
    for name in sample:
        flag = cat.flags[name]
        value = ("true" if flag.default else "false") if flag.type == "bool" else str(flag.default)
        assert value_problem(flag.type, value) == ""
        tokens.append(f"--{name}={value}")
    proc = start_jax(" ".join(tokens))
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_flags_of_other_versions_are_rejected_by_this_jaxlib() -> None:
    version = installed_jaxlib()
    cat = xla_catalog(version)
    gone = sorted(n for n, versions in all_flag_versions().items() if version not in versions and n.startswith("xla_"))
    assert len(gone) >= 10  # 0.6.2 had flags 0.12 removed
    proc = start_jax(" ".join(f"--{n}=1" for n in gone[:15]))
    assert proc.returncode != 0
    unknown = re.search(r"Unknown flags? in XLA_FLAGS: (.*)", proc.stderr)
    assert unknown, proc.stderr[-2000:]
    assert {t.split("=")[0].lstrip("-") for t in unknown.group(1).split()} == set(gone[:15])
    assert not set(gone) & set(cat.flags)


@pytest.mark.parametrize(("flag", "value"), [
    ("xla_gpu_enable_latency_hiding_scheduler", "TRUE"), ("xla_gpu_enable_latency_hiding_scheduler", "yes"),
    ("xla_gpu_enable_latency_hiding_scheduler", "01"), ("xla_gpu_autotune_level", "+3"),
    ("xla_gpu_autotune_level", "0x10"), ("xla_gpu_autotune_level", "99999999999"), ("xla_gpu_autotune_gemm_rtol", ".5"),
    ("xla_gpu_autotune_gemm_rtol", "abc"), ("xla_gpu_autotune_level", None),
])
def test_value_rules_agree_with_jaxlib(flag: str, value: str | None) -> None:
    kind = xla_catalog(installed_jaxlib()).flags[flag].type
    token = f"--{flag}" if value is None else f"--{flag}={value}"
    accepted = start_jax(token).returncode == 0
    assert accepted == (value_problem(kind, value) == ""), (token, value_problem(kind, value))


def test_token_split_agrees_with_jaxlib_on_quotes_and_dropped_tail() -> None:
    # XLA drops everything after a token without '-': an unknown flag there goes unnoticed.
    raw = "--xla_gpu_autotune_level=2 oops --xla_no_such_flag=1"
    tokens = split_flags(raw)
    assert [t.name for t in tokens if not t.problem] == ["xla_gpu_autotune_level"] and tokens[-1].problem
    assert start_jax(raw).returncode == 0  # jaxlib really ignores the unknown flag after 'oops'
    quoted = split_flags('--xla_dump_to="/tmp/a b" --xla_gpu_autotune_level=2')
    assert [(t.name, t.value) for t in quoted] == [("xla_dump_to", "/tmp/a b"), ("xla_gpu_autotune_level", "2")]
    assert start_jax('--xla_dump_to="/tmp/a b" --xla_gpu_autotune_level=2').returncode == 0


def test_env_catalog_entries_cite_sources_and_have_valid_constraints() -> None:
    cat = env_catalog()
    assert len(cat.variables) > 80
    for var in cat.variables.values():
        assert var.source.startswith("https://"), var.name
        assert var.vendor in ("nvidia", "amd", "any") and var.doc
        assert var.kind in ("enum", "bool01", "int", "float", "string", "tokens", "pattern")
        if var.kind == "enum":
            assert var.values
        if var.kind == "tokens":
            assert var.items
        if var.kind == "pattern":
            re.compile(var.pattern)
        if var.minimum is not None and var.maximum is not None:
            assert var.minimum <= var.maximum, var.name
        # A vendor-specific variable says why it is harmless (warning) or a conflict (error) on the
        # other vendor's GPUs; a variable both read says neither.
        decisions = [d for d in (var.harmless_on_other_vendor, var.conflict_on_other_vendor) if d]
        assert len(decisions) == (1 if var.vendor in ("nvidia", "amd") else 0), var.name
    # Variables outside the governed prefixes are catalogued so their values are checked; the
    # prefixes still decide what an unknown name is.
    governed = {n for n in cat.variables if cat.governed(n)}
    assert {"NCCL_IB_TIMEOUT", "RCCL_MSCCL_ENABLE", "HSA_XNACK", "NVTE_FUSED_ATTN"} <= governed


def test_maxtext_catalog_matches_the_installed_maxtext() -> None:
    code = ("import json; from maxtext.configs import types; from maxtext.version import __version__ as v; "
            "print(json.dumps({'v': v, 'keys': sorted(types.MaxTextConfig.model_fields)}))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout.splitlines()[-1])
    cat = maxtext_catalog(out["v"])
    assert sorted(cat.keys) == out["keys"]
    assert cat.keys["dataset_type"].choices and "synthetic" in cat.keys["dataset_type"].choices
    assert cat.models["llama2-70b"]["base_emb_dim"] == 8192


def test_catalog_data_is_package_data() -> None:
    data = resources.files("mxc.compiler").joinpath("data")
    assert data.joinpath("env_vars.json").is_file()
    assert data.joinpath("xla_flags", "index.json").is_file()
