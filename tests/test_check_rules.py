"""Every mxc check rule, one failing and one passing case each, through the real loader and catalogs."""

from __future__ import annotations

from typing import Any

import pytest

from mxc.compiler.check.findings import Finding
from mxc.compiler.check.registry import RULES
from mxc.compiler.check.runner import Lock, check_document
from mxc.compiler.loader import load_yaml
from tests.check_support import CPU_SPEC, GPU_SPEC, check, line_of, of_rule, spec


def failing(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.fails]


def test_the_base_specs_are_clean() -> None:
    for base in (GPU_SPEC, CPU_SPEC):
        findings, _ = check(base)
        assert failing(findings) == [], findings


def test_every_rule_has_a_name_severity_and_docstring() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    for rule in RULES:
        assert rule.severity in ("error", "warning", "note")
        assert len(rule.summary) > 30, rule.name


# --- jaxlib-catalog ------------------------------------------------------------------------

def test_jaxlib_catalog_missing_version_is_an_error() -> None:
    findings, text = check(spec(GPU_SPEC, code__jaxlib_version="9.9.9"))
    (f,) = of_rule(findings, "jaxlib-catalog")
    assert f.severity == "error" and "no XLA flag catalog for jaxlib 9.9.9" in f.message and "0.12.0.1" in f.message
    assert f.line == line_of(text, "jaxlib_version") and f.key == "code.jaxlib_version"
    # Nothing else could be judged without a catalog: no flag findings.
    assert not of_rule(findings, "xla-flag-unknown")


def test_jaxlib_catalog_pinned_version_passes_and_unpinned_is_a_note() -> None:
    assert not of_rule(check(GPU_SPEC)[0], "jaxlib-catalog")
    (note,) = of_rule(check(spec(GPU_SPEC, drop=("code__jaxlib_version",)))[0], "jaxlib-catalog")
    assert note.severity == "note" and not note.fails


def test_jaxlib_from_the_lockfile_and_from_maxtext() -> None:
    unpinned = spec(GPU_SPEC, drop=("code__jaxlib_version",), env__xla_flags__xla_gpu_enable_triton_hopper=True)
    findings, _ = check(unpinned, Lock("lockfiles/x.lock.json", "0.6.2"))
    assert not of_rule(findings, "xla-flag-version")  # 0.6.2 has it: the lock decided
    findings, _ = check(unpinned, Lock("lockfiles/x.lock.json", "0.12.0.1"))
    assert "jaxlib in lockfiles/x.lock.json" in of_rule(findings, "xla-flag-version")[0].message
    # A native spec: maxtext 0.2.5 runs with jaxlib 0.12.0.1 in this project.
    (f,) = of_rule(check(spec(CPU_SPEC, env__xla_flags={"xla_gpu_enable_triton_hopper": True}))[0], "xla-flag-version")
    assert "maxtext 0.2.5's jaxlib" in f.message


# --- xla-flag-syntax -----------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "words"), [
    ("--xla_gpu_enable_latency_hiding_scheduler=true foo --xla_gpu_autotune_level=2", "silently ignores the rest"),
    ("xla_gpu_autotune_level=2", "file name"),
    ("-xla_gpu_autotune_level=2", "must start with '--'"),
    ("--xla_gpu.autotune=2", "is not --name or --name=value"),
])
def test_xla_flag_syntax_malformed_raw_tokens(raw: str, words: str) -> None:
    findings, text = check(spec(GPU_SPEC, env__vars__XLA_FLAGS=raw))
    (f,) = of_rule(findings, "xla-flag-syntax")
    assert words in f.message and f.line == line_of(text, "XLA_FLAGS") and f.severity == "error"


def test_xla_flag_syntax_value_with_whitespace_from_env_xla_flags() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__xla_flags__xla_dump_to="/tmp/a b"))[0], "xla-flag-syntax")
    assert "whitespace" in f.message and f.key == "env.xla_flags.xla_dump_to"


def test_xla_flag_syntax_accepts_quoted_values_and_bare_bools() -> None:
    raw = '--xla_dump_to="/tmp/a b" --xla_gpu_enable_triton_gemm --xla_gpu_autotune_level=2'
    assert failing(check(spec(GPU_SPEC, env__vars__XLA_FLAGS=raw))[0]) == []


# --- xla-flag-unknown / xla-flag-version ---------------------------------------------------

def test_xla_flag_unknown_with_did_you_mean() -> None:
    findings, text = check(spec(GPU_SPEC, env__xla_flags={"xla_gpu_enable_latency_hidding_scheduler": True}))
    (f,) = of_rule(findings, "xla-flag-unknown")
    assert f.suggestion == "did you mean 'xla_gpu_enable_latency_hiding_scheduler'?"
    assert f.line == line_of(text, "latency_hidding") and "jaxlib 0.12.0.1" in f.message


def test_xla_flag_unknown_in_raw_xla_flags() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__vars__XLA_FLAGS="--xla_gpu_autotune_levle=2"))[0], "xla-flag-unknown")
    assert "'--xla_gpu_autotune_levle=2' in XLA_FLAGS" in f.message and "xla_gpu_autotune_level" in f.suggestion


def test_xla_flag_version_names_both_versions() -> None:
    old = spec(GPU_SPEC, code__jaxlib_version="0.6.2", env__xla_flags={"xla_gpu_pipeline_all_gather": "on"})
    (f,) = of_rule(check(old)[0], "xla-flag-version")
    assert "not a flag of jaxlib 0.6.2" in f.message and "0.12.0.1" in f.message and f.severity == "error"
    assert not of_rule(check(old)[0], "xla-flag-unknown")
    new = spec(old, code__jaxlib_version="0.12.0.1")
    assert not of_rule(check(new)[0], "xla-flag-version")


# --- xla-flag-value ------------------------------------------------------------------------

@pytest.mark.parametrize(("flag", "value", "words"), [
    ("xla_gpu_autotune_level", "abc", "decimal int32"),
    ("xla_gpu_autotune_level", 99999999999, "does not fit in int32"),
    ("xla_gpu_enable_latency_hiding_scheduler", "yes", "true, false, 1 or 0"),
    ("xla_gpu_pipeline_all_gather", True, "YAML read the value as a boolean"),
])
def test_xla_flag_value_rejected(flag: str, value: object, words: str) -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__xla_flags={flag: value}))[0], "xla-flag-value")
    assert words in f.message


@pytest.mark.parametrize(("flag", "value"), [
    ("xla_gpu_autotune_level", 3), ("xla_gpu_autotune_level", "-1"), ("xla_gpu_enable_latency_hiding_scheduler", "TRUE"),
    ("xla_gpu_autotune_gemm_rtol", 0.05), ("xla_gpu_pipeline_all_gather", "on"),
])
def test_xla_flag_value_accepted(flag: str, value: object) -> None:
    assert not of_rule(check(spec(GPU_SPEC, env__xla_flags={flag: value}))[0], "xla-flag-value")


def test_xla_flag_value_bare_int_flag_in_raw_string() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__vars__XLA_FLAGS="--xla_gpu_autotune_level"))[0], "xla-flag-value")
    assert "needs a value" in f.message


# --- xla-flag-deprecated -------------------------------------------------------------------

def test_xla_flag_deprecated_is_a_warning() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__xla_flags={"xla_gpu_enable_pipelined_all_gather": True}))[0],
                   "xla-flag-deprecated")
    assert f.severity == "warning" and f.fails and "xla_gpu_pipeline_all_gather" in f.message
    assert not of_rule(check(spec(GPU_SPEC, env__xla_flags={"xla_gpu_pipeline_all_gather": "on"}))[0], "xla-flag-deprecated")


# --- xla-flag-conflict ---------------------------------------------------------------------

def test_xla_flag_conflict_between_env_xla_flags_and_raw_string() -> None:
    data = spec(GPU_SPEC, env__vars__XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=false")
    findings, text = check(data)
    (f,) = of_rule(findings, "xla-flag-conflict")
    assert f.severity == "error" and "different values" in f.message and "'false'" in f.message
    assert f.line == line_of(text, "XLA_FLAGS")


def test_xla_flag_conflict_same_value_twice_is_a_warning_and_distinct_flags_pass() -> None:
    same = spec(GPU_SPEC, env__vars__XLA_FLAGS="--xla_gpu_enable_latency_hiding_scheduler=true")
    (f,) = of_rule(check(same)[0], "xla-flag-conflict")
    assert f.severity == "warning"
    other = spec(GPU_SPEC, env__vars__XLA_FLAGS="--xla_gpu_autotune_level=2")
    assert not of_rule(check(other)[0], "xla-flag-conflict")


# --- env-var-vendor / env-var-value / env-var-unknown / jax-platforms ----------------------

def test_env_var_vendor_rocm_variable_in_cuda_spec_is_a_warning_with_its_reason() -> None:
    findings, text = check(spec(GPU_SPEC, env__vars__HSA_FORCE_FINE_GRAIN_PCIE=1))
    (f,) = of_rule(findings, "env-var-vendor")
    assert f.severity == "warning" and f.fails
    assert "AMD (ROCm)-only" in f.message and "NVIDIA" in f.message and "harmless" in f.message
    assert "no NVIDIA library reads it" in f.message and f.line == line_of(text, "HSA_FORCE")


def test_env_var_vendor_real_conflicts_stay_errors() -> None:
    # A GPU selection CUDA ignores: the job would silently use every GPU.
    findings, text = check(spec(GPU_SPEC, env__vars__HIP_VISIBLE_DEVICES="0,1"))
    (f,) = of_rule(findings, "env-var-vendor")
    assert f.severity == "error" and "selection silently does not happen" in f.message
    assert f.line == line_of(text, "HIP_VISIBLE_DEVICES")
    amd = spec(GPU_SPEC, resources__gpu_vendor="amd", resources__constraint="mi300x",
               env__vars={"NVTE_FUSED_ATTN_BACKEND": 1, "JAX_PLATFORMS": "rocm"})
    (g,) = of_rule(check(amd)[0], "env-var-vendor")
    assert g.severity == "error" and "NVTE_FUSED_ATTN_BACKEND is NVIDIA (CUDA)-only" in g.message
    assert "CK or AOTriton" in g.message


def test_env_var_vendor_cuda_variable_in_rocm_spec_and_cpu_spec() -> None:
    # AMD's own MaxText-Slurm sets CUDA_DEVICE_MAX_CONNECTIONS on ROCm: HIP never reads it.
    amd = spec(GPU_SPEC, resources__gpu_vendor="amd", resources__constraint="mi300x",
               env__vars={"NCCL_NVLS_ENABLE": 1, "CUDA_DEVICE_MAX_CONNECTIONS": 1, "JAX_PLATFORMS": "rocm"})
    found = {f.key: f for f in of_rule(check(amd)[0], "env-var-vendor")}
    assert {f.severity for f in found.values()} == {"warning"}
    assert "GPU_MAX_HW_QUEUES" in found["env.vars.CUDA_DEVICE_MAX_CONNECTIONS"].message
    assert "NCCL_NVLS_ENABLE is NVIDIA (CUDA)-only" in found["env.vars.NCCL_NVLS_ENABLE"].message
    (w,) = of_rule(check(spec(CPU_SPEC, env__vars__CUDA_DEVICE_MAX_CONNECTIONS=1))[0], "env-var-vendor")
    assert w.severity == "warning"


def test_env_var_vendor_ignores_variables_both_vendors_read() -> None:
    # HIP honours CUDA_VISIBLE_DEVICES and RCCL reads CUDA_LAUNCH_BLOCKING.
    amd = spec(GPU_SPEC, resources__gpu_vendor="amd", resources__constraint="mi300x",
               env__vars={"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_LAUNCH_BLOCKING": 0, "JAX_PLATFORMS": "rocm"})
    assert not of_rule(check(amd)[0], "env-var-vendor")


def test_env_var_vendor_passes_for_matching_vendor() -> None:
    amd = spec(GPU_SPEC, resources__gpu_vendor="amd", resources__constraint="mi300x",
               env__vars={"HSA_FORCE_FINE_GRAIN_PCIE": 1, "RCCL_MSCCL_ENABLE": 0, "NCCL_DEBUG": "WARN", "JAX_PLATFORMS": "rocm"})
    assert failing(check(amd)[0]) == []


@pytest.mark.parametrize(("var", "value", "words"), [
    ("NCCL_DEBUG", "LOUD", "expected one of NONE, ERROR, VERSION, WARN, INFO, ABORT, TRACE"),
    ("NCCL_IB_TIMEOUT", 40, "outside 1..31"),
    ("NCCL_ALGO", "Rings", "'Rings'"),
    ("NCCL_P2P_DISABLE", "yes", "expected 0 or 1"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", 1.5, "outside 0..1"),
])
def test_env_var_value_rejected(var: str, value: object, words: str) -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__vars={var: value}))[0], "env-var-value")
    assert words in f.message and f.suggestion.startswith("see https://")


@pytest.mark.parametrize(("var", "value"), [
    ("NCCL_DEBUG", "info"), ("NCCL_IB_TIMEOUT", 22), ("NCCL_ALGO", "^Tree"), ("NCCL_ALGO", "allreduce:tree,ring"),
    ("NCCL_SOCKET_IFNAME", "^lo,docker,virbr"), ("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.90"),
])
def test_env_var_value_accepted(var: str, value: object) -> None:
    assert not of_rule(check(spec(GPU_SPEC, env__vars={var: value}))[0], "env-var-value")


def test_env_var_unknown_with_did_you_mean_and_ungoverned_names_pass() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__vars={"NCCL_IB_TIMEOUTS": 22}))[0], "env-var-unknown")
    assert f.severity == "warning" and f.suggestion == "did you mean 'NCCL_IB_TIMEOUT'?"
    assert not of_rule(check(spec(GPU_SPEC, env__vars={"MY_APP_SETTING": "x"}))[0], "env-var-unknown")


def test_env_var_deprecated_is_a_note_that_does_not_fail() -> None:
    findings, text = check(spec(GPU_SPEC, env__vars__NCCL_CHECKS_DISABLE=1))
    (f,) = of_rule(findings, "env-var-deprecated")
    assert f.severity == "note" and not f.fails and "does nothing" in f.message and "NCCL_CHECK_POINTERS" in f.message
    assert f.line == line_of(text, "NCCL_CHECKS_DISABLE") and not of_rule(findings, "env-var-unknown")
    assert not of_rule(check(spec(GPU_SPEC, env__vars__NCCL_CHECK_POINTERS=1))[0], "env-var-deprecated")


def test_jax_platforms_wrong_vendor_and_cpu_first() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, env__vars={"JAX_PLATFORMS": "rocm"}))[0], "jax-platforms")
    assert "use cuda" in f.suggestion
    (g,) = of_rule(check(spec(GPU_SPEC, env__vars={"JAX_PLATFORMS": "cpu,cuda"}))[0], "jax-platforms")
    assert "train on the CPU" in g.message
    assert not of_rule(check(spec(GPU_SPEC, env__vars={"JAX_PLATFORMS": "cuda,cpu"}))[0], "jax-platforms")


def test_env_dangerous_reports_the_opt_in_and_nothing_without_it() -> None:
    opted = spec(GPU_SPEC, env__vars={**GPU_SPEC["env"]["vars"], "LD_PRELOAD": "/usr/lib/libtcmalloc.so.4"},
                 env__allow_dangerous=["LD_PRELOAD"])
    (f,) = of_rule(check(opted)[0], "env-dangerous")
    assert f.severity == "note" and f.key == "env.vars.LD_PRELOAD" and "LD_PRELOAD='/usr/lib/libtcmalloc.so.4'" in f.message
    assert not of_rule(check(GPU_SPEC)[0], "env-dangerous")


# --- MaxText overrides ---------------------------------------------------------------------

def test_maxtext_catalog_named_but_not_shipped() -> None:
    findings, text = check(spec(GPU_SPEC, code__maxtext_catalog="maxtext-pr2879-f37ef2b8547c"))
    (f,) = of_rule(findings, "maxtext-catalog")
    assert f.severity == "error" and "no MaxText key catalog named 'maxtext-pr2879-f37ef2b8547c'" in f.message
    assert f.suggestion == "did you mean 'maxtext-pr2879-f37ef2b8547b'?" and f.line == line_of(text, "maxtext_catalog")
    assert not of_rule(findings, "maxtext-override-unknown")  # nothing judged without a catalog


def test_maxtext_catalog_named_judges_the_overrides() -> None:
    # expert_balance is a key of AMD's MaxText (ROCm images), not of PyPI maxtext 0.2.5.
    fork = spec(GPU_SPEC, code__maxtext_catalog="maxtext-pr2879-f37ef2b8547b", model__overrides__expert_balance=True)
    findings, _ = check(fork)
    assert not of_rule(findings, "maxtext-catalog") and not of_rule(findings, "maxtext-override-unknown")
    (f,) = of_rule(check(spec(GPU_SPEC, model__overrides__expert_balance=True))[0], "maxtext-override-unknown")
    assert "'expert_balance' is not a MaxText 0.2.5 config key" in f.message
    assert "maxtext-pr2879-f37ef2b8547b" in f.suggestion and "code.maxtext_catalog" in f.suggestion


def test_maxtext_override_unknown_key() -> None:
    findings, text = check(spec(CPU_SPEC, model__overrides__stepz=5))
    (f,) = of_rule(findings, "maxtext-override-unknown")
    assert f.suggestion == "did you mean 'steps'?" and f.line == line_of(text, "stepz") and "0.2.5" in f.message
    assert not of_rule(check(spec(CPU_SPEC, model__overrides__steps=5))[0], "maxtext-override-unknown")


@pytest.mark.parametrize(("key", "value", "words"), [
    ("dataset_type", "Synthetic", "expected one of"), ("steps", "abc", "expected an integer"),
    ("remat_policy", "fulll", "nnx_decoders.py:get_remat_policy fails on any other"),
    ("attention", "flsh", "attention_op.py:apply_attention fails on any other"),
    ("steps", 2.5, "expected an integer"), ("enable_dropout", "maybe", "expected true or false"),
    ("learning_rate", "fast", "expected a number"),
])
def test_maxtext_override_value_rejected(key: str, value: object, words: str) -> None:
    (f,) = of_rule(check(spec(CPU_SPEC, model__overrides={key: value}))[0], "maxtext-override-value")
    assert words in f.message


def test_a_free_form_string_maxtext_dispatches_on_suggests_the_close_value() -> None:
    """remat_policy is a plain str in MaxText's types (pydantic and --probe accept 'fulll'); the catalog
    knows the values get_remat_policy accepts (tools/maxtext_dispatch.py)."""
    (f,) = of_rule(check(spec(CPU_SPEC, model__overrides__remat_policy="fulll"))[0], "maxtext-override-value")
    assert f.suggestion == "did you mean 'full'?" and "'minimal_with_context'" in f.message


@pytest.mark.parametrize(("key", "value"), [
    ("dataset_type", "synthetic"), ("steps", 5), ("steps", 5.0), ("enable_dropout", "yes"), ("enable_dropout", 0),
    ("learning_rate", 3), ("quantization", "fp8"), ("remat_policy", "minimal_with_context"), ("remat_policy", "none"),
    ("attention", "cudnn_flash_te"),
])
def test_maxtext_override_value_accepted(key: str, value: object) -> None:
    assert not of_rule(check(spec(CPU_SPEC, model__overrides={key: value}))[0], "maxtext-override-value")


def test_maxtext_model_key_override() -> None:
    findings, _ = check(spec(GPU_SPEC, model__overrides__base_emb_dim=64))
    (f,) = of_rule(findings, "maxtext-model-key")
    assert "(4096)" in f.message and "override_model_config" in f.suggestion
    allowed = spec(GPU_SPEC, model__overrides__base_emb_dim=64, model__overrides__override_model_config=True)
    assert not of_rule(check(allowed)[0], "maxtext-model-key")
    assert not of_rule(check(spec(GPU_SPEC, model__overrides__base_emb_dim=4096))[0], "maxtext-model-key")


# --- batch-divisible / mesh-devices --------------------------------------------------------

def test_batch_divisible() -> None:
    findings, text = check(spec(CPU_SPEC, model__overrides__per_device_batch_size=0.5))
    (f,) = of_rule(findings, "batch-divisible")
    assert "0.5 x 1 devices" in f.message and f.line == line_of(text, "per_device_batch_size")
    gpu = spec(GPU_SPEC, model__overrides__per_device_batch_size=1.3)
    assert "20.8" in of_rule(check(gpu)[0], "batch-divisible")[0].message
    assert not of_rule(check(spec(GPU_SPEC, model__overrides__per_device_batch_size=1.5))[0], "batch-divisible")
    # Fake host devices count on CPU: 4 x 0.5 = 2 sequences.
    cpu4 = spec(CPU_SPEC, model__overrides__per_device_batch_size=0.5,
                env__xla_flags={"xla_force_host_platform_device_count": 4})
    assert not of_rule(check(cpu4)[0], "batch-divisible")


def test_mesh_devices_product_mismatch() -> None:
    findings, text = check(spec(GPU_SPEC, model__overrides__ici_fsdp_parallelism=4))
    (f,) = of_rule(findings, "mesh-devices")
    assert "multiplies to 4" in f.message and "8 devices per node" in f.message
    assert f.line == line_of(text, "ici_fsdp_parallelism")
    (g,) = of_rule(check(spec(GPU_SPEC, model__overrides__dcn_fsdp_parallelism=4))[0], "mesh-devices")
    assert "2 nodes" in g.message


def test_mesh_devices_two_fills_and_non_divisor() -> None:
    two = spec(GPU_SPEC, model__overrides__ici_fsdp_parallelism=-1, model__overrides__ici_tensor_parallelism=-1)
    assert "can fill in only one" in of_rule(check(two)[0], "mesh-devices")[0].message
    odd = spec(GPU_SPEC, model__overrides__ici_fsdp_parallelism=-1, model__overrides__ici_tensor_parallelism=3)
    assert "does not divide the 8" in of_rule(check(odd)[0], "mesh-devices")[0].message


def test_mesh_devices_passes_with_fill() -> None:
    ok = spec(GPU_SPEC, model__overrides__ici_fsdp_parallelism=-1, model__overrides__ici_tensor_parallelism=2)
    assert not of_rule(check(ok)[0], "mesh-devices")


# --- fp8-hardware --------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "words"), [
    ({"resources__constraint": "a100", "model__overrides__quantization": "fp8"}, "A100 does not have"),
    ({"model__overrides__quantization": "nanoo_fp8"}, "AMD's fp8 format"),
    ({"model__overrides__quantization": "te_mxfp8"}, "Blackwell"),
    ({"model__overrides__dtype": "float8_e4m3fn", "resources__constraint": "v100"}, "V100"),
])
def test_fp8_hardware_rejected(changes: dict[str, Any], words: str) -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, **changes))[0], "fp8-hardware")
    assert words in f.message and f.severity == "error"


def test_fp8_on_cpu_and_unknown_gpu() -> None:
    (f,) = of_rule(check(spec(CPU_SPEC, model__overrides__quantization="fp8"))[0], "fp8-hardware")
    assert "runs on CPU" in f.message
    (n,) = of_rule(check(spec(GPU_SPEC, resources__constraint="gpu-xl", model__overrides__quantization="fp8"))[0],
                   "fp8-hardware")
    assert n.severity == "note"


def test_fp8_hardware_passes_on_h100_and_mi300x() -> None:
    assert not of_rule(check(spec(GPU_SPEC, model__overrides__quantization="fp8"))[0], "fp8-hardware")
    amd = spec(GPU_SPEC, resources__gpu_vendor="amd", resources__constraint=None, resources__partition="mi300x",
               env__vars={"JAX_PLATFORMS": "rocm"}, model__overrides__quantization="nanoo_fp8")
    assert not of_rule(check(amd)[0], "fp8-hardware")


# --- checkpoint-time / restart-checkpoint --------------------------------------------------

def test_checkpoint_period_longer_than_the_time_limit() -> None:
    data = spec(GPU_SPEC, model__model_name="llama2-70b", checkpoint__period=20000, resources__time="02:00:00",
                model__overrides__max_target_length=8192)
    findings, text = check(data)
    (f,) = of_rule(findings, "checkpoint-time")
    assert "longer than resources.time 2:00:00" in f.message and "68.7B active parameters" in f.message
    assert f.line == line_of(text, "period") and f.suggestion.startswith("checkpoint at most every ")
    every = int(f.suggestion.split()[-2])
    assert not of_rule(check(spec(data, checkpoint__period=every))[0], "checkpoint-time")


def test_checkpoint_time_uses_the_train_timeout_and_ignores_untimed_specs() -> None:
    data = spec(GPU_SPEC, model__model_name="llama2-70b", checkpoint__period=20000, drop=("resources__time",))
    assert not of_rule(check(data)[0], "checkpoint-time")
    timed = spec(data, runtime__timeouts={"train": 600})
    assert "runtime.timeouts.train" in of_rule(check(timed)[0], "checkpoint-time")[0].message


def test_restart_without_checkpoints() -> None:
    (f,) = of_rule(check(spec(GPU_SPEC, checkpoint__period=0))[0], "restart-checkpoint")
    assert f.severity == "warning" and f.key == "restart.max"
    assert not of_rule(check(GPU_SPEC)[0], "restart-checkpoint")


# --- notify-destination (the attacks: tests/test_attacks_secrets.py) ---------------------------

def test_notify_api_url_must_be_an_allowed_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MXC_NOTIFY_ALLOWED_URLS", raising=False)
    telegram = {"format": "telegram", "secret_env": "CHAT_BOT", "chat_id": "-100"}
    assert not of_rule(check(spec(CPU_SPEC, notify=telegram))[0], "notify-destination")
    findings, text = check(spec(CPU_SPEC, notify={**telegram, "api_url": "https://bots.example.com"}))
    (f,) = of_rule(findings, "notify-destination")
    assert f.severity == "error" and f.line == line_of(text, "api_url") and "MXC_NOTIFY_ALLOWED_URLS" in f.suggestion
    (w,) = of_rule(check(spec(CPU_SPEC, notify={"format": "slack", "secret_env": "CHAT_HOOK",
                                                "api_url": "https://bots.example.com"}))[0], "notify-destination")
    assert w.severity == "warning" and "telegram format only" in w.message


# --- schema --------------------------------------------------------------------------------

def test_invalid_spec_gives_schema_findings_and_the_rules_that_can_still_run() -> None:
    """resources.nodez is set aside: the rules reading resources do not run (and say so), the MaxText
    rules run on the rest and find stepz in the same check."""
    data = spec(GPU_SPEC, resources__nodez=2, model__overrides__stepz=1)
    findings, text = check(data)
    assert {f.rule for f in findings} == {"schema", "maxtext-override-unknown"}
    (f,) = of_rule(findings, "schema")
    assert f.suggestion == "did you mean 'nodes'?" and f.line == line_of(text, "nodez")
    checked = check_document(load_yaml("spec.yaml", text), "spec.yaml")
    assert checked.spec is None and not checked.valid
    assert set(checked.not_run) == {r.name for r in RULES if "resources" in r.sections}
    assert checked.not_run["mesh-devices"] == "resources.nodez has an error above"


# --- container-privileged ----------------------------------------------------------------------

def test_container_privileged_is_reported_and_nothing_without_it() -> None:
    podman = spec(GPU_SPEC, runtime__container="podman", runtime__container_options={"privileged": True})
    (f,) = of_rule(check(podman)[0], "container-privileged")
    assert f.severity == "warning" and f.key == "runtime.container_options.privileged" and "--privileged" in f.message
    assert not of_rule(check(spec(GPU_SPEC, runtime__container="podman"))[0], "container-privileged")


# --- container-dangerous -----------------------------------------------------------------------

def test_container_dangerous_reports_each_opt_in_and_nothing_without_it() -> None:
    opted = spec(GPU_SPEC, runtime__container="podman", runtime__container_options={"cap_add": ["SYS_ADMIN"]},
                 runtime__allow_dangerous=["cap_add:SYS_ADMIN"])
    (f,) = of_rule(check(opted)[0], "container-dangerous")
    assert f.severity == "note" and f.key == "runtime.allow_dangerous.0" and "cap_add:SYS_ADMIN" in f.message
    assert not of_rule(check(spec(GPU_SPEC, runtime__container="podman"))[0], "container-dangerous")
