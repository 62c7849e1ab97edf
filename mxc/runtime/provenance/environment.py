"""Which environment variables a run record keeps: an allow-list of exact names, values scrubbed.

record.json is world-readable (0644) and travels with bug reports, so the recorded environment
is chosen by exact name, never by prefix (``TF_*`` once recorded ``TF_TOKEN_app_terraform_io``,
``TF_VAR_db_password``): mxc's own variables, the variables of the curated catalog ``mxc check``
knows (mxc/compiler/data/env_vars.json: NCCL, RCCL, CUDA, HSA, XLA, ... tuning), a short list of
names that shape what training does, and the names the spec itself sets in ``env.vars`` or passes
in ``env.pass`` (what came from the caller's shell, the base included, is kept apart by
``recorded_caller``, for ``mxc rerun``). Even
then, a name that says it holds a secret (``*_TOKEN``, ``*_PASSWORD``, ``*_API_KEY``...) or is
the spec's ``notify.secret_env`` is not recorded, and a value shaped like a secret has that part
replaced by *** (mxc/node/secretscan.py). The rest of the environment is passed through to
training but not written down.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from mxc.node import envboundary
from mxc.node.secretscan import redact_secrets, secret_named

# Variables mxc itself sets or reads for a run (plans, sbatch exports, the bundle's scripts).
MXC_NAMES = frozenset({
    "MXC_HOME", "MXC_RUN_DIR", "MXC_RUN_ID", "MXC_BUNDLE_DIR", "MXC_ATTEMPT", "MXC_RESUBMITS", "MXC_JOB_NAME",
    "MXC_JAX_CACHE", "MXC_PYTHON", "MXC_AGENT_PYTHON", "MXC_IMAGE_PYTHON", "MXC_CODE_DIR", "MXC_CHECKPOINT_DIR",
    "MXC_COORDINATOR", "MXC_NET_IFACE", "MXC_OBSERVE_NODES", "MXC_IMAGE_CACHE", "MXC_WHEEL_CACHE",
})
# Variables outside the catalog that change what the training process does.
TRAINING_NAMES = frozenset({
    "PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "OMP_NUM_THREADS",
    "JAX_ENABLE_X64", "JAX_DEFAULT_MATMUL_PRECISION", "JAX_TRACEBACK_FILTERING", "JAX_COMPILATION_CACHE_DIR",
    "JAX_ENABLE_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "JAX_DEBUG_NANS", "JAX_DISABLE_JIT", "JAX_LOG_COMPILES",
    "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "LIBTPU_INIT_ARGS",
    "TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TF_GPU_ALLOCATOR",
    "NVIDIA_VISIBLE_DEVICES", "NVIDIA_TF32_OVERRIDE",
})


@cache
def catalog_names() -> frozenset[str]:
    """The exact variable names of the env-var catalog (mxc/compiler/data/env_vars.json)."""
    raw = json.loads(resources.files("mxc.compiler").joinpath("data", "env_vars.json").read_text("utf-8"))
    return frozenset(raw["variables"])


# The base that crosses from the caller's shell into every training (mxc/node/envboundary.py), by
# exact name (LC_* as POSIX and glibc name them): record.training.caller keeps it, so that `mxc rerun`
# can compare it (recorded_caller).
BASE_NAMES = frozenset(envboundary.CALLER_NAMES) | frozenset({
    "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_TIME", "LC_COLLATE", "LC_MONETARY", "LC_MESSAGES", "LC_PAPER",
    "LC_NAME", "LC_ADDRESS", "LC_TELEPHONE", "LC_MEASUREMENT", "LC_IDENTIFICATION",
})


def passed_names(spec: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(name) for name in (spec.get("env") or {}).get("pass") or [])


def recorded_names(spec: Mapping[str, Any]) -> frozenset[str]:
    """Every name a record of a run of ``spec`` may keep: the lists above, and what the spec sets
    (``env.vars``) or passes (``env.pass``; a secret-named one is still left out)."""
    spec_names = frozenset(str(name) for name in (spec.get("env") or {}).get("vars") or {})
    return MXC_NAMES | TRAINING_NAMES | catalog_names() | spec_names | passed_names(spec)


def recorded_environment(env: Mapping[str, str], spec: Mapping[str, Any]) -> dict[str, str]:
    """The part of ``env`` a run record keeps: allowed names, no secret-named variable, no secret-shaped value."""
    allowed = recorded_names(spec)
    secret_env = (spec.get("notify") or {}).get("secret_env")
    return {name: redact_secrets(value) for name, value in sorted(env.items())
            if name in allowed and name != secret_env and not secret_named(name)}


def recorded_caller(env: Mapping[str, str], spec: Mapping[str, Any]) -> dict[str, str]:
    """What of the caller's shell reached the training (``envboundary.from_caller``), as the record
    keeps it: the base and the passed names, no secret-named variable, secret-shaped parts redacted."""
    allowed = BASE_NAMES | passed_names(spec)
    secret_env = (spec.get("notify") or {}).get("secret_env")
    return {name: redact_secrets(value) for name, value in sorted(env.items())
            if name in allowed and name != secret_env and not secret_named(name)}


def scrubbed(values: Mapping[str, str]) -> dict[str, str]:
    """``values`` (variables mxc composed itself, e.g. the Slurm job's exports) with secret-shaped parts redacted."""
    return {name: redact_secrets(value) for name, value in values.items()}
