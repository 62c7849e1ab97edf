"""Which accelerator a spec asks for, and what it can do (fp8, peak throughput).

A spec names its GPU model only indirectly: ``resources.constraint`` (node features such as
``mi300x``) and ``resources.partition`` (often named after the GPU). Unknown models are
reported as notes, never guessed into errors. Peak numbers are the vendors' dense bf16
figures per device; the step-time estimate uses them as an upper bound of speed, so a rule
built on it only fires when a spec is wrong even at 100 % utilisation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mxc.compiler.schema import JobSpec


@dataclass(frozen=True)
class Accelerator:
    name: str
    vendor: str  # nvidia | amd | cpu
    fp8: bool  # hardware fp8 matmuls
    microscaling: bool  # MXFP8/NVFP4 block-scaled formats (Blackwell, MI350)
    bf16_tflops: float


# Longest names first, so "gh200" wins over "h200" and "mi300x" over "mi300".
_KNOWN = [
    Accelerator("gb200", "nvidia", True, True, 2500),
    Accelerator("b200", "nvidia", True, True, 2250),
    Accelerator("b100", "nvidia", True, True, 1750),
    Accelerator("gh200", "nvidia", True, False, 989),
    Accelerator("h200", "nvidia", True, False, 989),
    Accelerator("h100", "nvidia", True, False, 989),
    Accelerator("h800", "nvidia", True, False, 989),
    Accelerator("l40s", "nvidia", True, False, 362),
    Accelerator("l4", "nvidia", True, False, 121),
    Accelerator("a100", "nvidia", False, False, 312),
    Accelerator("a800", "nvidia", False, False, 312),
    Accelerator("a10", "nvidia", False, False, 125),
    Accelerator("v100", "nvidia", False, False, 125),
    Accelerator("t4", "nvidia", False, False, 65),
    Accelerator("mi355x", "amd", True, True, 2500),
    Accelerator("mi350x", "amd", True, True, 2300),
    Accelerator("mi325x", "amd", True, False, 1307),
    Accelerator("mi300x", "amd", True, False, 1307),
    Accelerator("mi300a", "amd", True, False, 981),
    Accelerator("mi250x", "amd", False, False, 383),
    Accelerator("mi250", "amd", False, False, 362),
    Accelerator("mi210", "amd", False, False, 181),
    Accelerator("mi100", "amd", False, False, 184),
]
_PATTERNS = [(re.compile(rf"(?<![a-z0-9]){re.escape(a.name)}(?![0-9a-z])"), a) for a in _KNOWN]
# A generous CPU node: the estimate must never make a CPU look slower than it can be.
CPU_NODE = Accelerator("cpu", "cpu", False, False, 20)
# Fastest known device per vendor: the bound used when the model is unknown.
FASTEST = {v: max((a for a in _KNOWN if a.vendor == v), key=lambda a: a.bf16_tflops) for v in ("nvidia", "amd")}


def accelerator(spec: JobSpec) -> Accelerator | None:
    """The device the spec asks for; CPU_NODE for CPU specs; None when the GPU model is unknown."""
    res = spec.resources
    if res.gpu_vendor == "none":
        return CPU_NODE
    text = " ".join(x for x in (res.constraint, res.partition) if x).lower()
    for pattern, acc in _PATTERNS:
        if acc.vendor == res.gpu_vendor and pattern.search(text):
            return acc
    return None


def fastest(spec: JobSpec) -> Accelerator:
    """The named device, else the vendor's fastest (an upper bound of speed)."""
    known = accelerator(spec)
    if known is not None:
        return known
    return FASTEST.get(spec.resources.gpu_vendor, CPU_NODE)


def known_models() -> list[str]:
    return [a.name for a in _KNOWN]
