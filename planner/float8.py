"""torchao float8 training (``--float8``): what it changes in memory and in step time.

Read from torchao 0.18 (``torchao/float8/``) and torchtitan's float8 converter; measured with
the fake-tensor referee (probes/trace.py, ``float8`` in the trace) where torch runs it, derived
by hand where it cannot (the step time). docs/model.md "Float8 training" has the derivation.

* Which linears: torchtitan's converter swaps every ``nn.Linear`` for ``Float8Linear`` except
  the output head (``filter_fqns = ["output"]``) and a linear whose dims are not divisible by
  16 (``torchtitan/components/quantization/utils.py`` ``module_filter_fn``): the blocks' q, k,
  v, o and MLP projections (``linears``). ``round_scales_to_power_of_2`` (rowwise) changes
  the scales' values only.
* What is saved for backward: ``matmul_with_hp_or_float8_args.forward`` (float8_linear.py)
  saves ``input_hp`` and ``weight_hp_t`` -- the high-precision input and weight, for every
  recipe; the float8 copies are made again in backward. So eager float8 saves exactly what a
  bf16 linear saves (traced: forward's activations equal to the byte).
* Transients: each cast (``_ToFloat8ConstrFunc.forward``, float8_training_tensor.py) computes
  ``tensor.to(float32) * scale``, then clamps, then casts to 1 byte: two fp32 copies of the
  tensor alive at once, 8 B per element. The largest tensor cast in a block's backward is a
  token x ffn one (the down projection's input for its weight gradient, the up / gate
  projections' output gradients).
* FSDP float8 all-gather (``enable_fsdp_float8_all_gather``, tensorwise only:
  ``Float8LinearConfig.__post_init__``): ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``
  casts the local shard and all-gathers 1-byte data, the fp32 scale as metadata; the unsharded
  weight is a ``Float8TrainingTensor`` of 1 B per element.
* ``force_recompute_fp8_weight_in_bwd`` does nothing since pytorch/ao#2356 (2025-06; config.py
  warns it is deprecated, pytorch/ao#2251): PyTorch core now frees the float8 weight cast
  (pytorch/pytorch#148922). Older torchao saved that cast for backward unless it was set
  (pytorch/ao#562); the planner counts the current behaviour.
"""

from __future__ import annotations

from typing import Any

from planner.spec import Candidate, CompileMode, Float8Recipe, ModelSpec, TrainingSpec

FP32 = 4
CAST_BYTES_PER_ELEM = 2 * FP32
"""Peak of one eager float8 cast per element of the cast tensor: its fp32 copy and the
scaled fp32 copy (``tensor.to(torch.float32) * scale``)."""
SCALE_BYTES = FP32
"""One tensorwise scale (a float32 scalar) per gathered float8 weight."""


def enabled(training: TrainingSpec) -> bool:
    return training.float8 is not Float8Recipe.NONE


def unsupported(model: ModelSpec) -> str | None:
    """Why float8 is not modelled for this model (None: it is)."""
    if model.is_moe or model.mla or model.shared_ffn or model.n_dense_layers:
        return ("float8 is modelled for dense attention + MLP blocks only (torchtitan converts "
                "nn.Linear modules; MoE experts are grouped GEMMs, a different converter)")
    return None


def linears(model: ModelSpec) -> list[tuple[int, int]]:
    """(in, out) features of the block's linears torchtitan converts: q, k, v, o and the MLP's
    2 or 3 projections, each only when both dims are divisible by 16 (``module_filter_fn``:
    ``torch._scaled_mm`` needs it); the others stay bf16."""
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    mlp = [(h, f), (h, f), (f, h)] if model.mlp.gated else [(h, f), (f, h)]
    every = [(h, q), (h, kv), (h, kv), (q, h), *mlp]
    return [(k, n) for k, n in every if k % 16 == 0 and n % 16 == 0]


def linears_per_block(model: ModelSpec) -> int:
    return len(linears(model))


def weights_per_block(model: ModelSpec) -> int:
    """Elements of the float8 linears' weights in one block (biases stay high precision); all
    of planner.throughput.matmul_params' dense block when every dim divides by 16."""
    return sum(k * n for k, n in linears(model))


def gather_saving(model: ModelSpec, training: TrainingSpec, compute_bytes: int) -> int:
    """Bytes one block's FSDP all-gather output is smaller by with ``--float8-all-gather``:
    its float8 weights at 1 B (plus a float32 scale each) instead of the compute dtype."""
    if not (enabled(training) and training.float8_all_gather):
        return 0
    w8 = weights_per_block(model)
    return w8 * (compute_bytes - 1) - SCALE_BYTES * linears_per_block(model)


def backward_transient(model: ModelSpec, training: TrainingSpec, tokens: int, tp: int = 1
                       ) -> int:
    """Bytes a block's backward holds beyond a bf16 linear's: the eager cast of one
    tokens x ffn tensor (8 B per element). Under torch.compile the casts are fused kernels;
    this eager count is kept (the compiled one is not traced)."""
    if not enabled(training) or not linears(model):
        return 0
    widest = max(max(k, n) for k, n in linears(model))
    return -(-CAST_BYTES_PER_ELEM * tokens * widest // tp)


# ---------------------------------------------------------------------------------------------
# Step time

CAST_TRAFFIC_EAGER = 33
"""HBM bytes per element of one eager bf16 -> float8 cast (torchao ``tensor_to_amax`` then
``_ToFloat8ConstrFunc``): abs (read 2, write 2), max (read 2), to fp32 (read 2, write 4),
x scale (read 4, write 4), clamp (read 4, write 4), to float8 (read 4, write 1)."""
CAST_TRAFFIC_COMPILED = 5
"""The same under torch.compile, as fused kernels at best: the amax reduction reads the bf16
tensor (2), the scale-and-cast kernel reads it again and writes 1 byte (3)."""


def cast_elements(model: ModelSpec, training: TrainingSpec) -> tuple[int, int, int, int]:
    """Elements cast over all blocks: (forward per token, forward per micro-batch, backward per
    token, backward per micro-batch).

    Per linear of in-features K and out-features N (float8_linear.py
    ``matmul_with_hp_or_float8_args``): forward casts the input (K per token) and the weight
    (K x N); backward casts the output gradient for the input gradient (N per token) and,
    separately, for the weight gradient (N), the weight again (K x N) and the input again
    (K per token). A float8-gathered weight arrives cast (``tensor_already_casted_to_fp8``):
    its casts happen on the 1/n shard before the all-gather, counted as none.
    ``rowwise_with_gw_hp`` casts neither operand of the weight gradient."""
    ins = sum(k for k, _ in linears(model))
    outs = sum(n for _, n in linears(model))
    gw = 0 if training.float8 is Float8Recipe.ROWWISE_WITH_GW_HP else 1
    weights = 0 if training.float8_all_gather else weights_per_block(model)
    L = model.n_layers
    return L * ins, L * weights, L * (outs + gw * (outs + ins)), L * weights


def step_terms(model: ModelSpec, training: TrainingSpec, candidate: Candidate, *, tokens: Any,
               n: Any, peak: Any, peak_fp8: Any, hbm: Any) -> dict[str, Any]:
    """StepInputs fields (planner.throughput): the float8 matmuls' saving at the fp8 peak and
    the casts' time; ``f8_gather_saving``: the bytes float8 all-gather saves per full-model
    gather (step_inputs_at lowers the gathered bytes per parameter by it). No measured float8
    efficiency is used: the achieved fraction of peak is the profile's, as for bf16 (docs/model.md "Float8 training" compares this with torchao's
    published torchtitan runs)."""
    fwd_tok, fwd_micro, bwd_tok, bwd_micro = cast_elements(model, training)
    traffic = CAST_TRAFFIC_EAGER if training.compile is CompileMode.NONE \
        else CAST_TRAFFIC_COMPILED
    scale = traffic / candidate.tp / hbm
    fd = training.fsdp_dtypes
    return {"f8_gather_saving": model.n_layers * gather_saving(model, training, fd.param),
            "f8_discount": 1.0 - peak / peak_fp8,
            "f8_p_block": float(weights_per_block(model)),
            "f8_gw": 0.0 if training.float8 is Float8Recipe.ROWWISE_WITH_GW_HP else 1.0,
            "f8_cast_fwd_s": (fwd_tok * tokens + fwd_micro) * scale,
            "f8_cast_bwd_s": (bwd_tok * tokens + bwd_micro) * scale}
