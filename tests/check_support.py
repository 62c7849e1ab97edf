"""Helpers for the mxc check tests: specs as dicts, checked through the real loader and rules."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from mxc.compiler.check.findings import Finding
from mxc.compiler.check.runner import Lock, check_document
from mxc.compiler.loader import load_yaml

GPU_SPEC: dict[str, Any] = {
    "schema": "mxc/v1",
    "name": "llama-7b-h100",
    "image": {"ref": "ghcr.io/nvidia/jax:maxtext", "digest": "sha256:" + "a" * 64},
    "code": {"repo": "https://github.com/AI-Hypercomputer/maxtext.git", "commit": "b" * 40, "jaxlib_version": "0.12.0.1"},
    "model": {
        "model_name": "llama2-7b",
        "overrides": {
            "steps": 1000, "per_device_batch_size": 2, "max_target_length": 4096, "dataset_type": "synthetic",
            "ici_fsdp_parallelism": 8, "dcn_fsdp_parallelism": 2,
        },
    },
    "env": {
        "xla_flags": {"xla_gpu_enable_latency_hiding_scheduler": True, "xla_gpu_all_gather_combine_threshold_bytes": 1073741824},
        "vars": {"NCCL_DEBUG": "WARN", "CUDA_DEVICE_MAX_CONNECTIONS": 1, "JAX_PLATFORMS": "cuda"},
    },
    "resources": {"nodes": 2, "gpus_per_node": 8, "gpu_vendor": "nvidia", "constraint": "h100", "time": "06:00:00"},
    "runtime": {"backend": "slurm", "container": "apptainer"},
    "checkpoint": {"period": 100},
    "restart": {"max": 2},
}

CPU_SPEC: dict[str, Any] = {
    "schema": "mxc/v1",
    "name": "tiny",
    "code": {"maxtext_version": "0.2.5"},
    "model": {"model_name": "default", "overrides": {"per_device_batch_size": 1, "steps": 10, "base_emb_dim": 64}},
    "env": {"vars": {"JAX_PLATFORMS": "cpu"}},
    "runtime": {"backend": "local", "container": "native"},
}


# An unknown XLA flag that reaches a run past `mxc check` and `mxc build`, as one does for real: the spec
# pins jaxlib 0.11.0, which has the flag, while the run's jaxlib (0.12.0.1, this venv's) aborts on it
# ("Unknown flag in XLA_FLAGS"). Tests that need a run failing that way use it (a made-up flag is refused
# at build).
STALE_JAXLIB_FLAG: dict[str, Any] = {"code": {"jaxlib_version": "0.11.0"},
                                     "env": {"xla_flags": {"xla_cpu_use_fusion_emitters": True}}}
STALE_FLAG_TOKEN = "--xla_cpu_use_fusion_emitters=true"


def spec(base: dict[str, Any], *, drop: tuple[str, ...] = (), **changes: Any) -> dict[str, Any]:
    """A copy of ``base`` with dotted-key changes (``model__overrides__steps=5``) and drops."""
    out = copy.deepcopy(base)
    for dotted, value in changes.items():
        parts = dotted.split("__")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    for dotted in drop:
        parts = dotted.split("__")
        node = out
        for part in parts[:-1]:
            node = node[part]
        del node[parts[-1]]
    return out


def check(data: dict[str, Any], lock: Lock | None = None) -> tuple[list[Finding], str]:
    text = yaml.safe_dump(data, sort_keys=False)
    doc = load_yaml("spec.yaml", text)
    return check_document(doc, "spec.yaml", lock or Lock()).findings, text


def of_rule(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line of ``text`` containing ``needle``."""
    for i, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in the spec text")
