"""Rules where the model meets the hardware: batch, mesh, fp8, checkpoints vs the time limit."""

from __future__ import annotations

import re
from collections.abc import Iterator

from mxc.compiler.check.estimate import MICROSCALING_QUANTIZATION, step_lower_bound, uses_fp8
from mxc.compiler.check.hardware import CPU_NODE, accelerator
from mxc.compiler.check.subject import Issue, Subject
from mxc.compiler.loader import Path

ICI_AXES = ("data", "fsdp", "fsdp_transpose", "sequence", "context", "context_usp_ulysses", "context_autoregressive",
            "tensor", "tensor_sequence", "autoregressive", "pipeline", "expert", "diloco")
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def _override_path(s: Subject, *keys: str) -> Path:
    """The line of the first of ``keys`` the spec overrides, else the overrides block, else the model."""
    for key in keys:
        if key in s.overrides:
            return ("model", "overrides", key)
    return ("model", "overrides") if s.overrides else ("model",)


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def batch_divisible(s: Subject) -> Iterator[Issue]:
    """per_device_batch_size x devices is a whole number >= 1: MaxText truncates the global
    batch to an integer silently (1.5 x 3 devices trains on 4 sequences, 0.1 x 8 on none)."""
    pdbs = _as_float(s.mt("per_device_batch_size"))
    if pdbs is None or pdbs <= 0:
        return
    accum = _as_float(s.mt("gradient_accumulation_steps")) or 1.0
    batch = pdbs * s.devices
    if abs(batch - round(batch)) > 1e-9 or batch < 1:
        yield Issue(_override_path(s, "per_device_batch_size"),
                    f"per_device_batch_size {pdbs:g} x {s.devices} devices = {batch:g} sequences, not a whole number: "
                    f"MaxText trains on {int(batch) * int(accum)} per step",
                    f"use a per_device_batch_size that makes {s.devices} x it a whole number >= 1")


_AXIS_KEYS = {prefix: tuple((axis, f"{prefix}_{axis}_parallelism") for axis in ICI_AXES) for prefix in ("ici", "dcn")}


def _axes(s: Subject, prefix: str) -> dict[str, int]:
    out = {}
    for axis, key in _AXIS_KEYS[prefix]:
        value = s.mt(key)
        if type(value) is int:
            out[axis] = value
        else:
            number = _as_float(value)
            if number is not None and number.is_integer():
                out[axis] = int(number)
    return out


def mesh_devices(s: Subject) -> Iterator[Issue]:
    """ici_* parallelism multiplies to the devices of one node and dcn_* to the number of nodes
    (at most one -1 per group, which MaxText fills in). A mismatch fails at mesh creation,
    after the job waited in the queue."""
    groups = (("ici", s.devices_per_node, "devices per node"), ("dcn", s.spec.resources.nodes, "nodes"))
    for prefix, target, what in groups:
        axes = _axes(s, prefix)
        keys = [key for axis, key in _AXIS_KEYS[prefix] if axis in axes]
        path = _override_path(s, *keys)
        fill = [a for a, v in axes.items() if v == -1]
        bad = [a for a, v in axes.items() if v == 0 or v < -1]
        product = 1
        for v in axes.values():
            if v > 0:
                product *= v
        shown = " x ".join(f"{prefix}_{a}={v}" for a, v in axes.items() if v != 1) or f"all {prefix}_* = 1"
        if bad:
            yield Issue(path, f"{', '.join(f'{prefix}_{a}_parallelism' for a in bad)} must be >= 1 or -1")
        elif len(fill) > 1:
            yield Issue(path, f"{len(fill)} {prefix}_* axes are -1 ({', '.join(fill)}); MaxText can fill in only one",
                        f"set all but one of them to a number that divides the {target} {what}")
        elif fill and target % product:
            yield Issue(path, f"{shown}: the fixed axes multiply to {product}, which does not divide the {target} {what}",
                        f"make the product of the fixed {prefix}_* axes divide {target}")
        elif not fill and product != target:
            yield Issue(path, f"{shown} multiplies to {product}, but the job has {target} {what} "
                        f"(resources: {s.spec.resources.nodes} node(s) x {s.devices_per_node} device(s))",
                        f"make the {prefix}_* axes multiply to {target}, or set one of them to -1")


def fp8_hardware(s: Subject) -> Iterator[Issue]:
    """fp8 (quantization: fp8*, te_fp8_*, dtype float8_*) only on GPUs with fp8 units (H100/H200,
    B200, MI300X/MI325X, ...); AMD's nanoo_fp8 format only on AMD; MXFP8/NVFP4 only on Blackwell
    or MI350. The GPU model is read from resources.constraint or partition."""
    if not uses_fp8(s):
        return
    q = str(s.mt("quantization") or s.mt("dtype"))
    path = _override_path(s, "quantization", "dtype")
    acc = accelerator(s.spec)
    vendor = s.spec.resources.gpu_vendor
    if acc is CPU_NODE:
        yield Issue(path, f"{q} needs GPUs with fp8 units; this spec runs on CPU (resources.gpu_vendor: none)",
                    "remove the quantization, or ask for fp8-capable GPUs")
        return
    if "nanoo" in q and vendor == "nvidia":
        yield Issue(path, f"{q} is AMD's fp8 format (fnuz, MI300); this spec runs on NVIDIA GPUs", "use quantization: fp8")
    if acc is None:
        yield Issue(("resources",), f"{q} needs fp8 hardware, but the GPU model is unknown "
                    "(resources.constraint / partition name none of the known models)",
                    "name the GPU in resources.constraint, e.g. h100 or mi300x", severity="note")
        return
    if not acc.fp8:
        yield Issue(path, f"{q} needs fp8 units, which {acc.name.upper()} does not have", "use bf16, or fp8-capable GPUs")
    elif q in MICROSCALING_QUANTIZATION and not acc.microscaling:
        yield Issue(path, f"{q} needs block-scaled fp8/fp4 (Blackwell, MI350), which {acc.name.upper()} does not have",
                    "use te_fp8_delayedscaling or fp8")


def slurm_seconds(text: str) -> int | None:
    """Slurm's time syntax: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    m = _SLURM_TIME.match(text.strip())
    if not m:
        return None
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return int(a) * 3600 + int(b) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # MM


def _hms(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def checkpoint_time(s: Subject) -> Iterator[Issue]:
    """checkpoint.period steps fit in the time limit even at the GPUs' peak speed; otherwise the
    job is killed before its first checkpoint and every restart starts from step 0. The step
    time is a lower bound (6 x active parameters x tokens / peak FLOP/s), so this only fires
    when the period cannot possibly fit."""
    period = s.spec.checkpoint.period
    limits = []
    if s.spec.resources.time:
        limits.append(("resources.time", slurm_seconds(s.spec.resources.time)))
    if s.spec.runtime.timeouts.train:
        limits.append(("runtime.timeouts.train", s.spec.runtime.timeouts.train))
    known = [(name, sec) for name, sec in limits if sec]
    if not period or not known:
        return
    name, limit = min(known, key=lambda x: x[1] or 0)
    assert limit is not None
    bound = step_lower_bound(s)
    if bound is None:
        return
    needed = period * bound.seconds
    if needed > limit:
        fits = max(int(limit / bound.seconds), 1)
        yield Issue(("checkpoint", "period"),
                    f"{period} steps take at least {_hms(needed)} (>= {bound.seconds:.2f} s a step: "
                    f"{bound.active_params / 1e9:.1f}B active parameters x {bound.tokens:,.0f} tokens on "
                    f"{bound.devices} x {bound.device} at peak), longer than {name} {_hms(limit)}: "
                    "the job ends before its first checkpoint",
                    f"checkpoint at most every {fits} steps")


def restart_checkpoint(s: Subject) -> Iterator[Issue]:
    """restart.max > 0 with checkpointing off: every automatic restart trains from step 0 again."""
    if s.spec.restart.max > 0 and s.spec.checkpoint.period == 0:
        yield Issue(("restart", "max"), f"{s.spec.restart.max} restarts allowed, but checkpoint.period is 0: "
                    "each restart starts over from step 0", "set checkpoint.period")


def sbatch_extra_noted(s: Subject) -> Iterator[Issue]:
    """An sbatch option in resources.sbatch_extra that runs the job, but not quite as the spec reads:
    --hold (it waits until released), --get-user-env (the login environment, not the bundle's), a GPU
    or memory option beside resources.gpus_per_node or resources.mem. Options that break the run
    (--array, --export, --no-requeue, ...) are schema errors (mxc/compiler/sbatch_extra.py)."""
    from mxc.compiler import sbatch_extra

    for i, option in enumerate(s.spec.resources.sbatch_extra):
        why = sbatch_extra.noted(option)
        if why:
            yield Issue(("resources", "sbatch_extra", i), f"{option}: {why}",
                        "keep it only if the site needs it; accept it with check.accept (rule sbatch-extra)")
