"""A lower bound of a training step's duration, for rules about time limits.

The bound is deliberately optimistic about speed: training FLOPs are counted as
6 x (active matmul parameters) x tokens, ignoring attention scores, shared experts,
rematerialisation and communication, and divided by the device's *peak* dense throughput
(doubled for fp8). A rule built on it fires only when a spec cannot fit even at 100 %
utilisation, so it never blocks a spec that might work.
"""

from __future__ import annotations

from dataclasses import dataclass

from mxc.compiler.check.hardware import fastest
from mxc.compiler.check.subject import Subject

FP8_QUANTIZATION = frozenset({
    "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_full", "fp8_gpu", "nanoo_fp8", "fp8_nanoo",
    "te_fp8_delayedscaling", "te_fp8_currentscaling", "serve_fp8_weight",
})
MICROSCALING_QUANTIZATION = frozenset({"te_mxfp8", "te_nvfp4", "te_nvfp4_no_rht"})
FP8_DTYPES = frozenset({"float8_e4m3fn", "float8_e5m2"})


@dataclass(frozen=True)
class StepBound:
    seconds: float
    active_params: float
    tokens: float
    device: str
    devices: int


def _num(value: object, default: float = 0.0) -> float:
    if isinstance(value, bool):
        return default
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return default
    return default


def active_params(s: Subject) -> float | None:
    """Matmul parameters touched per token (embedding lookups excluded, the output layer included)."""
    d, layers = _num(s.mt("base_emb_dim")), _num(s.mt("base_num_decoder_layers"))
    heads, kv, head_dim = _num(s.mt("base_num_query_heads")), _num(s.mt("base_num_kv_heads")), _num(s.mt("head_dim"))
    mlp, vocab = _num(s.mt("base_mlp_dim")), _num(s.mt("vocab_size"))
    if min(d, layers, heads, head_dim, mlp, vocab) <= 0:
        return None
    kv = kv if kv > 0 else heads
    acts = s.mt("mlp_activations")
    gated = 3.0 if isinstance(acts, list) and len(acts) >= 2 else 2.0
    attention = d * heads * head_dim * 2 + d * kv * head_dim * 2
    experts, per_token = _num(s.mt("num_experts"), 1.0), _num(s.mt("num_experts_per_tok"), 1.0)
    moe_dim = _num(s.mt("base_moe_mlp_dim"), -1.0)
    # Mixture of experts: only the experts a token is routed to do work.
    ffn = gated * d * ((moe_dim if moe_dim > 0 else mlp) * max(per_token, 1.0) if experts > 1 else mlp)
    return layers * (attention + ffn) + vocab * d


def uses_fp8(s: Subject) -> bool:
    q = str(s.mt("quantization") or "")
    return q in FP8_QUANTIZATION or q in MICROSCALING_QUANTIZATION or str(s.mt("dtype")) in FP8_DTYPES


def step_lower_bound(s: Subject) -> StepBound | None:
    params = active_params(s)
    if params is None:
        return None
    pdbs = _num(s.mt("per_device_batch_size"))
    seq = _num(s.mt("max_target_length"))
    accum = max(_num(s.mt("gradient_accumulation_steps"), 1.0), 1.0)
    if pdbs <= 0 or seq <= 0:
        return None
    devices = s.devices
    tokens = pdbs * devices * seq * accum
    acc = fastest(s.spec)
    peak = acc.bf16_tflops * 1e12 * (2.0 if uses_fp8(s) else 1.0)
    node_count = s.spec.resources.nodes
    total_peak = peak * (devices if acc.vendor != "cpu" else node_count)
    return StepBound(6.0 * params * tokens / total_peak, params, tokens, acc.name, devices)
