"""torchao float8 training (``--float8``): what it changes in memory and in step time.

Read from torchao 0.18 (``torchao/float8/``) and torchtitan's float8 converter; measured with
the fake-tensor referee (probes/trace.py, ``float8`` in the trace) where torch runs it; the step
time counted from torchao's source at rates one H100 measured (the float8 / bf16 matmul ratio,
the cast's bytes per element). docs/model.md "Float8 training" has the derivation and checks.

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
#
# Cast costs are kernel measurements on one H100 80GB HBM3 (torch 2.11, torchao 0.18;
# benchmarks/gpu_runs/2026-11-26-h100-b/run3-records.jsonl, ``record: float8_layer``,
# probes/gpu_cases.py ``float8_layer_times``), written as HBM-byte equivalents per element:
# measured seconds x the profile's datasheet HBM bandwidth (3.35e12 B/s) / elements. Another
# GPU's cast then takes these bytes over its own bandwidth -- carried, not measured there.

CAST_COUNTED_EAGER = 33
"""HBM bytes per element one eager bf16 -> float8 cast moves by count (torchao
``tensor_to_amax`` then ``_ToFloat8ConstrFunc.forward``): abs (read 2, write 2), max (read 2),
to fp32 (read 2, write 4), x scale (read 4, write 4), clamp (read 4, write 4), to float8
(read 4, write 1)."""
CAST_EQUIV_EAGER = 44.5
"""Measured: torchao's ``hp_tensor_to_float8_dynamic`` alone, eager, on the two largest
activations (67,108,864 elements: 0.899 ms; 117,440,512: 1.550 ms): 2.449 ms x 3.35e12 B/s /
184,549,376 elements = 44.5 B per element (the 33 counted bytes at 74 % of the datasheet
bandwidth). The smaller casts (16.8 M, 33.6 M elements) took 59-115 B per element; the
large ones are the bandwidth-bound rate (docs/model.md "Float8 training")."""
CAST_EQUIV_COMPILED = 18.8
"""Measured: the same cast under ``torch.compile`` (0.378 ms for 67,108,864 elements,
0.660 ms for 117,440,512: 1.038 ms x 3.35e12 / 184,549,376 = 18.8 B per element), against
5 B by count (the amax reads the bf16 tensor, the fused scale-and-cast reads it again and
writes 1 B)."""
EAGER_EFFICIENCY = CAST_COUNTED_EAGER / CAST_EQUIV_EAGER
"""Achieved fraction of the datasheet bandwidth of torchao's eager elementwise kernels (0.74),
measured on the cast; the layout copies and rowwise's rescale below are counted bytes at it."""
COPY_COUNTED = 2
"""Bytes per element of a float8 operand's layout copy (read 1, write 1): ``torch._scaled_mm``
takes its first operand row-major and its second column-major, and torchao's
``preprocess_addmm`` (float8_ops.py) copies an operand that is not (``.contiguous()``,
``.t().contiguous().t()``): the input gradient's weight (K x N), the weight gradient's
output gradient (tokens x N) and input (tokens x K)."""
RESCALE_COUNTED = 12
"""Bytes per output element of an eager rowwise input- or weight-gradient matmul: torchao runs
them without fast accumulation, through the tensorwise kernel, then rescales
(``addmm_float8_unwrapped``, float8_ops.py): the outer product of the two scale vectors
(fp32, write 4) and ``output *= post_inverse_scale`` (read 2 + 4, write 2)."""


def cast_elements(model: ModelSpec, training: TrainingSpec) -> tuple[int, int, int, int]:
    """Elements cast over all blocks: (forward per token, forward per micro-batch, backward per
    token, backward per micro-batch).

    Per linear of in-features K and out-features N (float8_linear.py
    ``matmul_with_hp_or_float8_args``): forward casts the input (K per token) and the weight
    (K x N); backward casts the output gradient for the input gradient (N per token) and,
    separately, for the weight gradient (N), the weight again (K x N) and the input again
    (K per token). A float8-gathered weight arrives cast (``tensor_already_casted_to_fp8``):
    its casts happen on the shard before each all-gather (``shard_cast_elements``).
    ``rowwise_with_gw_hp`` casts neither operand of the weight gradient."""
    ins = sum(k for k, _ in linears(model))
    outs = sum(n for _, n in linears(model))
    gw = _gw(training)
    weights = 0 if training.float8_all_gather else weights_per_block(model)
    L = model.n_layers
    return L * ins, L * weights, L * (outs + gw * (outs + ins)), L * weights


def shard_cast_elements(model: ModelSpec, training: TrainingSpec, shards: Any) -> Any:
    """Elements a GPU casts per micro-batch for float8 all-gather: its 1/shards of the
    linears' weights before each of the block's two all-gathers (forward, and backward under
    FSDP2's reshard_after_forward): ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``
    (torchao fsdp_utils.py) casts the local shard (with torchtitan's precomputed scale or its
    own amax). 0 without float8 all-gather (the whole weight is cast instead:
    ``cast_elements``)."""
    if not training.float8_all_gather:
        return 0
    return 2 * model.n_layers * weights_per_block(model) / shards


def _gw(training: TrainingSpec) -> int:
    """1: the weight gradient's matmul runs in float8; 0: in bf16 (rowwise_with_gw_hp)."""
    return 0 if training.float8 is Float8Recipe.ROWWISE_WITH_GW_HP else 1


def layout_elements(model: ModelSpec, training: TrainingSpec) -> tuple[int, int]:
    """Elements of the backward's float8 layout copies (``COPY_COUNTED``) over all blocks:
    (per token, per micro-batch). Per linear: the input gradient's weight (K x N, cast or
    gathered alike) and, when the weight gradient runs in float8, its output gradient (N per
    token) and input (K per token)."""
    ins = sum(k for k, _ in linears(model))
    outs = sum(n for _, n in linears(model))
    L = model.n_layers
    return L * _gw(training) * (ins + outs), L * weights_per_block(model)


def rescale_elements(model: ModelSpec, training: TrainingSpec) -> tuple[int, int]:
    """Output elements the rowwise recipes rescale after the tensorwise kernel
    (``RESCALE_COUNTED``), over all blocks: (per token, per micro-batch): the input gradient
    (K per token) and, when in float8, the weight gradient (K x N). Tensorwise: none (its
    scales go to ``torch._scaled_mm``)."""
    if training.float8 is Float8Recipe.TENSORWISE:
        return 0, 0
    ins = sum(k for k, _ in linears(model))
    L = model.n_layers
    return L * ins, L * _gw(training) * weights_per_block(model)


def matmul_speedups(training: TrainingSpec, tensorwise: Any, rowwise: Any) -> tuple[Any, Any]:
    """(forward, backward) float8 matmul rate over the bf16 one: tensorwise runs all three
    GEMMs in cuBLAS's tensorwise kernel; the rowwise recipes run the forward in the rowwise
    kernel (fast accumulation, ``gemm_config_output``) and the gradients through the tensorwise
    kernel (no fast accumulation: ``addmm_float8_unwrapped``'s fallback, float8_ops.py)."""
    if training.float8 is Float8Recipe.TENSORWISE:
        return tensorwise, tensorwise
    return rowwise, tensorwise


def step_terms(model: ModelSpec, training: TrainingSpec, candidate: Candidate, *, tokens: Any,
               n: Any, peak: Any, peak_bf16: Any, speedup: Any, speedup_rowwise: Any,
               hbm: Any) -> dict[str, Any]:
    """StepInputs fields (planner.throughput): the float8 matmuls' saving and the casts' time;
    ``f8_gather_saving``: the bytes float8 all-gather saves per full-model gather
    (step_inputs_at lowers the gathered bytes per parameter by it).

    ``speedup`` / ``speedup_rowwise``: the float8 (tensorwise / rowwise kernel) matmul rate
    over the bf16 one on this GPU (GpuProfile ``fp8_matmul_speedup``: measured; the datasheet
    peaks' ratio where not). A float8 FLOP costs bf16's / speedup; ``peak`` is the rate the
    rest of the step computes at, so its FLOP costs ``peak_bf16 / peak`` bf16 ones."""
    fwd_tok, fwd_micro, bwd_tok, bwd_micro = cast_elements(model, training)
    eager = training.compile is CompileMode.NONE
    per_s = 1.0 / candidate.tp / hbm
    cast = (CAST_EQUIV_EAGER if eager else CAST_EQUIV_COMPILED) * per_s
    fd = training.fsdp_dtypes
    sp_fwd, sp_bwd = matmul_speedups(training, speedup, speedup_rowwise)
    # the shard casts of both all-gathers are put in the backward's time (a recomputed
    # forward finds its weights gathered: it casts none of them again); shards: the GPUs
    # over the TP degree (the data-parallel group; a node's for hybrid sharding is not
    # distinguished: 1/shards of the weights is small either way)
    shard = shard_cast_elements(model, training, n / candidate.tp) * candidate.tp
    bwd_s = (bwd_tok * tokens + bwd_micro + shard) * cast
    if eager:  # under torch.compile inductor fuses the copies and the rescale (not counted)
        unit = per_s / EAGER_EFFICIENCY
        copy_tok, copy_micro = layout_elements(model, training)
        rs_tok, rs_micro = rescale_elements(model, training)
        bwd_s = bwd_s + (copy_tok * tokens + copy_micro) * COPY_COUNTED * unit \
            + (rs_tok * tokens + rs_micro) * RESCALE_COUNTED * unit
    return {"f8_gather_saving": model.n_layers * gather_saving(model, training, fd.param),
            "f8_discount": 1.0 - peak / (peak_bf16 * sp_fwd),
            "f8_discount_bwd": 1.0 - peak / (peak_bf16 * sp_bwd),
            "f8_p_block": float(weights_per_block(model)),
            "f8_gw": float(_gw(training)),
            "f8_cast_fwd_s": (fwd_tok * tokens + fwd_micro) * cast,
            "f8_cast_bwd_s": bwd_s}
