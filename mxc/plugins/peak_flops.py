"""Dense BF16 peak TFLOP/s per GPU model: the denominator of MFU (model FLOPs utilisation).

MFU = the model TFLOP/s per device MaxText logs (``perf/per_device_tflops_per_sec``, the model's
own FLOPs, not the hardware's) / the device's dense BF16 peak. Dense, not the "with sparsity"
figures datasheets print first (twice as large). Sources, and how each figure follows from
compute units x FLOPs per clock x peak clock, are in docs/metrics.md ("MFU").

Models are recognised in the name the driver reports (``nvidia-smi`` name, amdgpu
``product_name``, rocm-smi card series); the first matching row wins, so the PCIe and NVL
variants come before the SXM parts that share their name.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    model: str
    bf16_dense_tflops: float


_TABLE = (
    (r"H100.*PCIE", "H100 PCIe", 756.5),
    (r"H100.*NVL", "H100 NVL", 835.5),
    (r"H100", "H100 SXM", 989.4),
    (r"H200.*NVL", "H200 NVL", 835.5),
    (r"H200", "H200 SXM", 989.4),
    (r"B200", "B200", 2250.0),
    (r"MI355X", "MI355X", 2516.6),
    (r"MI325X", "MI325X", 1307.4),
    (r"MI300X", "MI300X", 1307.4),
)
PEAKS = tuple((re.compile(pattern, re.IGNORECASE), Peak(model, tflops)) for pattern, model, tflops in _TABLE)


def peak_for(name: str) -> Peak | None:
    for pattern, peak in PEAKS:
        if pattern.search(name):
            return peak
    return None


def node_peak(names: Iterable[str]) -> Peak | None:
    """The peak of this node's GPUs: the most common recognised model (a node has one model)."""
    found = Counter(p for p in (peak_for(n) for n in names) if p is not None)
    return found.most_common(1)[0][0] if found else None
