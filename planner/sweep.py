"""Vectorized step-time evaluation over arrays of configurations (numpy).

Evaluates :func:`planner.throughput.step_core` -- the very expression the scalar
``estimate_step`` uses -- on numpy arrays, so results are identical to the scalar path (tests
compare them on random samples). numpy is imported here only; the scalar planner path never
imports this module.

The model family is Llama-style (RMSNorm, no biases, RoPE, dense MLP; ``gated`` selects
SwiGLU vs. a 2-matrix GELU MLP, ``tied`` ties the output head); its parameter count matches
``planner.params.total_params`` for such a ``ModelSpec``.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from planner.spec import GpuProfile, Offload, Precision, Strategy
from planner.throughput import (
    _CKPT_COEF,
    _OFFLOAD_COEF,
    _STRATEGY_COEF,
    CHECKPOINTING_ORDER,
    DEFAULT_ASSUMPTIONS,
    OFFLOAD_ORDER,
    PRECISION_ORDER,
    STRATEGY_ORDER,
    ThroughputAssumptions,
    _gather_bytes,
    _grad_reduce_bytes,
    default_compute_efficiency,
    peak_flops,
    step_core,
)

__all__ = ["NUMPY_OPS", "code_of", "step_times"]

NUMPY_OPS = SimpleNamespace(
    maximum=np.maximum, minimum=np.minimum, ceil=np.ceil, where=np.where
)

_STRAT_KEYS = ("ag_fwd", "ag_bwd", "rs_micro", "ar_step", "rs_step", "ag_step", "hybrid",
               "per_unit", "sharded_opt", "zero")  # fmt: skip
_OFF_KEYS = ("o_gd_micro", "o_gd_step", "o_pu_step", "o_pu_micro", "o_cpu")


def code_of(value: Any) -> int:
    """Integer code of a Strategy / Checkpointing / Offload / Precision for the arrays below."""
    for order in (STRATEGY_ORDER, CHECKPOINTING_ORDER, OFFLOAD_ORDER, PRECISION_ORDER):
        if value in order and type(value) is type(order[0]):
            return order.index(value)
    raise ValueError(f"no sweep code for {value!r}")


def _f(a: Any) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def step_times(
    *,
    n_layers: Any,
    hidden: Any,
    n_heads: Any,
    n_kv_heads: Any,
    ffn_hidden: Any,
    vocab: Any,
    seq: Any,
    micro_batch: Any,
    n_gpus: Any,
    strategy: Any,
    grad_accum: Any = 1,
    checkpointing: Any = 0,
    offload: Any = 0,
    precision: Any = code_of(Precision.BF16_AMP),
    gpu: GpuProfile,
    gpus_per_node: Any | None = None,
    gated: bool = True,
    tied: bool = False,
    assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS,
) -> dict[str, np.ndarray]:
    """Step-time fields (as ``StepEstimate``) for every configuration; inputs broadcast.

    ``strategy``, ``checkpointing``, ``offload`` and ``precision`` are integer codes
    (:func:`code_of`; index into ``STRATEGY_ORDER`` etc.).
    """
    a = assumptions
    L, h = _f(n_layers), _f(hidden)
    heads, kv_heads, f, v = _f(n_heads), _f(n_kv_heads), _f(ffn_hidden), _f(vocab)
    d_head = np.floor_divide(h, heads)
    q, kv = heads * d_head, kv_heads * d_head
    n_mlp = 3.0 if gated else 2.0
    p_block = h * (2.0 * q + 2.0 * kv) + n_mlp * h * f
    p_head = v * h
    # planner.params layout: 2 RMSNorm weights per block, embedding, final norm, untied head
    p_total = L * (p_block + 2.0 * h) + v * h + h + (0.0 if tied else v * h)

    s_code = np.asarray(strategy, dtype=np.intp)
    c_code = np.asarray(checkpointing, dtype=np.intp)
    o_code = np.asarray(offload, dtype=np.intp)
    p_code = np.asarray(precision, dtype=np.intp)

    strat_tab = np.array([_STRATEGY_COEF[s] for s in STRATEGY_ORDER], dtype=np.float64)
    ckpt_tab = np.array([_CKPT_COEF[c] for c in CHECKPOINTING_ORDER], dtype=np.float64)
    off_tab = np.array([_OFFLOAD_COEF[o] for o in OFFLOAD_ORDER], dtype=np.float64)
    grad_tab = np.array(
        [[_grad_reduce_bytes(p, s) for p in PRECISION_ORDER] for s in STRATEGY_ORDER],
        dtype=np.float64,
    )
    gather_tab = np.array([_gather_bytes(p) for p in PRECISION_ORDER], dtype=np.float64)
    master_tab = np.array([p.param_bytes for p in PRECISION_ORDER], dtype=np.float64)
    peak_tab = np.array([peak_flops(gpu, p) for p in PRECISION_ORDER], dtype=np.float64)

    eff = a.compute_efficiency if a.compute_efficiency is not None else default_compute_efficiency(gpu)
    gpn = gpu.gpus_per_node if gpus_per_node is None else gpus_per_node
    x: dict[str, Any] = {
        "n_layers": L, "q_dim": q, "seq": _f(seq), "mb": _f(micro_batch), "ga": _f(grad_accum),
        "n": _f(n_gpus), "gpn": _f(gpn),
        "p_total": p_total, "p_block": p_block, "p_head": p_head,
        "peak": peak_tab[p_code], "eff": float(eff),
        "bw_intra": gpu.intra_node_bandwidth_bytes_per_s * a.intra_node_comm_efficiency,
        "bw_inter": gpu.inter_node_bandwidth_bytes_per_s * a.inter_node_comm_efficiency,
        "lat_intra": a.intra_node_hop_latency_s, "lat_inter": a.inter_node_hop_latency_s,
        "pcie": gpu.pcie_bandwidth_bytes_per_s * a.pcie_efficiency,
        "cpu_rate": a.cpu_adam_params_per_s, "bucket": float(a.ddp_bucket_bytes),
        "ov": a.overlap_fraction,
        "gather_b": gather_tab[p_code], "grad_b": grad_tab[s_code, p_code],
        "master_b": master_tab[p_code],
        "c_mm": ckpt_tab[c_code, 0], "c_attn": ckpt_tab[c_code, 1],
    }  # fmt: skip
    for i, key in enumerate(_STRAT_KEYS):
        x[key] = strat_tab[s_code, i]
    for i, key in enumerate(_OFF_KEYS):
        x[key] = off_tab[o_code, i]
    out = step_core(NUMPY_OPS, **x)
    shape = np.broadcast_shapes(*(np.shape(v) for v in x.values()))
    return {k: np.broadcast_to(np.asarray(val, dtype=np.float64), shape) for k, val in out.items()}


# keep the enum imports referenced for type checkers / readers of the codes
_ = (Strategy, Offload)
