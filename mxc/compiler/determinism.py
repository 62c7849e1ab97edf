"""``reproducibility.deterministic``: the settings that make a GPU training repeat its numbers bit for
bit, per vendor and per the pinned jaxlib, decided here and rendered into the bundle's environment
(run.json ``env``, env.sh) like any variable the spec sets. Each setting names its documentation.

* XLA (CUDA and ROCm alike, XLA:GPU's DebugOptions): ``--xla_gpu_deterministic_ops=true`` switches
  scatter, select-and-scatter, GEMMs, convolutions and attention to deterministic implementations
  and is a superset of ``--xla_gpu_exclude_nondeterministic_ops`` (openxla/xla#12520); set only when
  the flag catalog of the spec's jaxlib has it (mxc/compiler/data/xla_flags/), so no flag is invented;
* collectives: ``NCCL_ALGO=Ring`` (read by NCCL and by RCCL): a ring's reduction order is fixed by
  the topology, so all-reduces repeat bit for bit (Megatron Core's deterministic mode sets the same);
* Transformer Engine: ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0`` (its fused attention's deterministic
  kernels), harmless where the training does not use it.

A CPU training needs none of them: XLA:CPU repeats its numbers from run to run (the tiny model's
losses are bit-identical, tests/test_rerun_verify.py), so nothing is set there. A spec that sets
one of these names to another value, or the XLA flag to false, contradicts the switch and is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mxc.compiler.schema import JobSpec

XLA_DOC = "https://openxla.org/xla/determinism"


@dataclass(frozen=True)
class Setting:
    name: str  # an XLA flag (without --) or an environment variable
    value: str
    xla_flag: bool
    source: str  # where its effect is documented


XLA_FLAGS = (
    Setting("xla_gpu_deterministic_ops", "true", True, XLA_DOC),
)
GPU_VARIABLES = (
    Setting("NCCL_ALGO", "Ring", False,
            "https://docs.nvidia.com/megatron-core/developer-guide/nightly/user-guide/deterministic-training.html; "
            "RCCL: https://rocm.docs.amd.com/projects/rccl/en/latest/api-reference/env-variables.html"),
    Setting("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0", False,
            "https://docs.nvidia.com/deeplearning/transformer-engine/user-guide/envvars.html"),
)


def settings(spec: JobSpec) -> list[Setting]:
    """What ``reproducibility.deterministic`` sets for this spec (nothing when it is off or on CPU)."""
    if not spec.reproducibility.deterministic or spec.resources.gpu_vendor == "none":
        return []
    known = _known_flags(spec)
    return [s for s in XLA_FLAGS if s.name in known] + list(GPU_VARIABLES)


def _known_flags(spec: JobSpec) -> frozenset[str]:
    """The flags of the spec's jaxlib (code.jaxlib_version, its image's, its maxtext pin's: the
    checker's choice, mxc/compiler/check/subject.py); none when mxc has no catalog of it."""
    from mxc.compiler.check.catalogs import xla_catalog
    from mxc.compiler.check.subject import choose_jaxlib

    pin = choose_jaxlib(spec, None)
    return frozenset(xla_catalog(pin.version).flags) if pin.version else frozenset()


def problem(spec: JobSpec) -> str | None:
    """A spec value that contradicts ``reproducibility.deterministic`` (key path: why), or None."""
    chosen = settings(spec)
    if chosen and not any(s.xla_flag for s in chosen):
        return ("reproducibility.deterministic: mxc has no XLA flag catalog of this spec's jaxlib, so it cannot tell "
                "which determinism flags it has; pin code.jaxlib_version to one it has (mxc flags lists them)")
    for setting in chosen:
        for where, values in [("", spec.env), *((f"ranks.{r}.", e) for r, e in spec.env.ranks.items())]:
            if setting.xla_flag:
                value = values.xla_flags.get(setting.name)
                if value is not None and str(value).lower() != setting.value:
                    return (f"env.{where}xla_flags.{setting.name}: reproducibility.deterministic sets it to "
                            f"{setting.value}; remove it, or the switch")
            else:
                value = values.vars.get(setting.name)
                if value is not None and str(value) != setting.value:
                    return (f"env.{where}vars.{setting.name}: reproducibility.deterministic sets it to "
                            f"{setting.value} ({setting.source}); remove it, or the switch")
    return None
