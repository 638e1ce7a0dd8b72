"""Step-time (throughput) model of one candidate: compute + exposed communication + offload.

Pure functions of the spec objects; no torch, numpy or pandas (the planner path imports this).
The numeric core :func:`step_core` is written once over ``planner.vec``'s arithmetic, so the
report's vectorized sweep (``planner/report/sweep.py``) evaluates *the same expression* on numpy
arrays and gets bit-identical results. The model and its sources are described in ``docs/throughput.md``.

Conventions
-----------
* A *step* is one optimizer step: ``grad_accum`` micro-batches of ``micro_batch x seq`` tokens
  on every GPU (data parallel: every GPU processes its own micro-batches).
* Model FLOPs per token (no recompute) = ``6 * N_mm + 12 * L * seq * q_dim``
  (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1: C ~ 6N per token;
  PaLM, Chowdhery et al. 2022, appendix B: ``6N + 12 L H Q T``). ``N_mm`` counts the weights of
  every matmul a token goes through: per block q, k, v, o, the MLP matrices (the active experts
  and the router for MoE), plus the output head (``vocab x hidden``, counted even when tied to
  the embedding because the matmul still runs). The input embedding lookup, norms and biases are
  excluded. The attention term is *not* halved for causal masking: this is the convention of
  PaLM, torchtitan (``get_num_flop_per_token``) and llm-foundry's MFU, so our MFU is comparable
  with theirs; it also stands in for the flash-attention kernel's lower efficiency.
* Recompute (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", sec. 4 / 5): FULL checkpointing re-runs each block's forward but its last matmul
  (``2 * (N_blocks - L * N_down) + 4 * L * seq * q_dim`` per token; the head is outside the
  checkpointed blocks; ``N_down``: the MLP's down projection, which PyTorch's non-reentrant
  checkpoint does not re-run, planner/arch ``block_unrecomputed_weights``; a reentrant
  checkpoint, ``--checkpoint-impl reentrant``, re-runs it: ``2 * N_blocks``); SELECTIVE is
  PyTorch's op-level selective checkpointing as torchtitan configures it (every other matmul
  output saved, the SDPA output saved): about half the block matmuls re-run, no attention.
* MFU is measured against model FLOPs *without* recompute (PaLM appendix B definition), so
  checkpointing lowers MFU.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.lazy_dataclass import dataclass
from planner import vec
from planner.arch import variants_of
from planner.spec import (
    Checkpointing,
    CheckpointImpl,
    Candidate,
    Cluster,
    CompileMode,
    Dtype,
    GpuProfile,
    GradSync,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
    efficiency_provenance,
)

__all__ = [
    "COLLECTIVES",
    "OFFLOAD_TRAFFIC",
    "RECOMPUTE",
    "Rates",
    "StepEstimate",
    "StepInputs",
    "ThroughputAssumptions",
    "collectives",
    "all_gather_bytes",
    "all_reduce_bytes",
    "default_compute_efficiency",
    "efficiency_provenance",
    "estimate_step",
    "matmul_params",
    "model_flops_per_token",
    "peak_flops",
    "recompute_flops_per_token",
    "reduce_scatter_bytes",
    "step_core",
    "step_inputs",
    "step_inputs_at",
    "training_flops_per_token",
]

# --------------------------------------------------------------------------------------------
# Assumptions (global defaults; the only knobs calibrated against benchmarks/)
# --------------------------------------------------------------------------------------------

# Achievable fraction of the dense peak for a whole training step's model FLOPs (compute part
# only; communication and offload are modelled separately) is data: each profile's
# ``compute_efficiency`` in hardware_profiles/*.toml. It was fitted *per GPU family* on the
# public measurements in benchmarks/throughput_measurements.csv, never per row:
#   A100: torchtitan FSDP2 on 64 A100 reports 50.5-61.1 % MFU (docs/performance.md), llm-foundry
#         MPT 1B-30B on 8 A100-80GB 54-64 % MFU without checkpointing (benchmarking/README.md),
#         IBM fms-fsdp Llama-2 7B 57 % MFU ("Maximizing training throughput using PyTorch FSDP").
#   H100: torchtitan reports 33-39 % MFU for Llama-3.1 8B with FSDP on 8/128 H100 (500 W parts,
#         benchmarks/llama3_h100_202412_torchtitan.md); llm-foundry MPT on H100-80GB 40-46 %.
# H100's 989 TFLOP/s bf16 peak is quoted at boost clock; sustained GEMM clocks under load are
# lower, so the achievable fraction is well below A100's. H200 and MI300X: derived from the H100
# by the roofline (their [sources]; docs/throughput.md section 2). Other GPUs: 0.50 (assumed).
# ``efficiency_provenance`` says which.


@dataclass(frozen=True, slots=True, kw_only=True)
class ThroughputAssumptions:
    """Global assumptions of the step-time model. Defaults are documented in docs/throughput.md."""

    compute_efficiency: float | None = None
    """Fraction of peak FLOP/s reached on the step's FLOPs; None: by GPU family (table above)."""
    intra_node_comm_efficiency: float = 0.75
    """NCCL ring bus bandwidth / link peak inside a node. nccl-tests on DGX A100 (NVLink3,
    300 GB/s per direction) report all_reduce busbw ~230 GB/s (0.77); DGX H100 (450 GB/s)
    ~360 GB/s for ring all-gather / reduce-scatter (0.8)."""
    inter_node_comm_efficiency: float = 0.80
    """NCCL busbw / NIC line rate across nodes: ~40-46 GB/s on 400 Gb/s InfiniBand (0.8-0.9)."""
    intra_node_hop_latency_s: float = 2e-6
    """Per ring step latency inside a node (NCCL LL/LL128 base latency, order of 1-3 us)."""
    inter_node_hop_latency_s: float = 5e-6
    """Per ring step latency across the network (InfiniBand / RoCE, order of 5 us)."""
    overlap_fraction: float = 1.0
    """Fraction of the overlappable compute that can hide communication (1 = perfect)."""
    ddp_bucket_bytes: float = 25 * 2**20
    """DDP bucket_cap_mb default (25 MiB); also used as the bucket of ZeRO-1/2 reductions."""
    pcie_efficiency: float = 0.8
    """Achieved fraction of the profile's host<->device bandwidth for pinned copies."""
    cpu_adam_params_per_s: float = 1.0e9
    """CPU optimizer step throughput per GPU process, parameters/s. DeepSpeed's CPUAdam (ZeRO-
    Offload, Ren et al. 2021, sec. 5.1) is a few times faster than torch's CPU Adam; ~1e9
    params/s per process is an assumed order of magnitude (a few GB/s of fp32 state)."""


DEFAULT_ASSUMPTIONS = ThroughputAssumptions()


# --------------------------------------------------------------------------------------------
# FLOPs
# --------------------------------------------------------------------------------------------


def matmul_params(model: ModelSpec) -> tuple[int, int]:
    """(matmul weights per block that a token multiplies, output-head weights).

    Per block, each variant's own count (planner/arch/, ``flops``): q (q_dim x h), k and v
    (kv_dim x h), o (h x q_dim) or multi-head latent attention's projections; the MLP
    matrices (3 for gated MLPs, 2 otherwise; ``experts_per_token`` of them for MoE, plus the
    router, shared experts and gate); an MoE model with dense blocks: the average block.
    Biases and norms are excluded (they are not matmuls). Head: vocab x hidden.
    """
    return variants_of(model).block_matmul_weights(model), model.vocab * model.hidden


def attn_width(model: ModelSpec) -> int:
    """Width of the QK^T and AV products per layer (the attention variant's: n_heads ·
    head_dim)."""
    return variants_of(model).attention.attn_width(model)


def model_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Forward + backward model FLOPs per token, no recompute (PaLM appendix B).

    ``6 * N_mm`` (2 forward + 4 backward FLOPs per weight per token; Kaplan et al. 2020)
    ``+ 12 * L * seq * q_dim`` (QK^T and AV: 2 * 2 * seq * q_dim forward per layer, x3 for
    forward + backward; not halved for causal masking, as PaLM / torchtitan / llm-foundry).
    """
    block, head = matmul_params(model)
    return 6.0 * (model.n_layers * block + head) + 12.0 * model.n_layers * seq * attn_width(model)


def recompute_flops_per_token(model: ModelSpec, seq: int, checkpointing: Checkpointing,
                              impl: CheckpointImpl = CheckpointImpl.NON_REENTRANT) -> float:
    """Extra forward FLOPs per token re-run in backward (Korthikanti et al. 2022), less the
    last matmul a full non-reentrant recompute stops before (``unrecomputed_weights``)."""
    rc = _with_impl(RECOMPUTE[_ckpt(checkpointing)], checkpointing, impl)
    block, _ = matmul_params(model)
    skipped = rc.early_stop * unrecomputed_weights(model)
    return (2.0 * model.n_layers * (rc.matmul * block - skipped)
            + rc.attention * 4.0 * model.n_layers * seq * attn_width(model))


def unrecomputed_weights(model: ModelSpec, finetune: Any = None) -> int:
    """Matmul weights per block whose forward a FULL recompute skips (the MLP's down
    projection when nothing after it saves its output; planner/arch
    ``block_unrecomputed_weights``: PyTorch's non-reentrant checkpoint stops early; a
    reentrant one does not, ``_with_impl``).

    ``finetune`` (a FineTune; None: full training): a LoRA adapter on down runs its
    ``lora_b`` matmul after the base one (torchtune LoRALinear / peft lora.Linear:
    ``out = base(x); out + scale * lora_b(lora_a(x))``), so lora_b's saved input is the last
    and the base matmul is re-run; a quantized base's down is an autograd Function that saves
    after its forward ran (torchao ``linear_nf4``, bitsandbytes ``MatMul4Bit``): 0 for both."""
    if finetune is not None and ((finetune.lora and "down" in finetune.lora_targets)
                                 or finetune.quantize_base.value != "none"):
        return 0
    return variants_of(model).block_unrecomputed_weights(model)


def training_flops_per_token(model: ModelSpec, seq: int, checkpointing: Checkpointing,
                             impl: CheckpointImpl = CheckpointImpl.NON_REENTRANT) -> float:
    """FLOPs the hardware executes per token: model FLOPs + recompute."""
    return model_flops_per_token(model, seq) + recompute_flops_per_token(model, seq,
                                                                         checkpointing, impl)


@dataclass(frozen=True, slots=True)
class Recompute:
    """Fractions of the forward re-run in backward under a checkpointing mode."""

    matmul: Any
    """Of the block matmuls."""
    attention: Any
    """Of the attention core."""
    early_stop: Any = 0.0
    """1: the recompute stops before the block's last matmul (``p_unrecomputed`` of its
    weights and, under TP, the reduce-scatter after it are not re-run)."""


RECOMPUTE: dict[Checkpointing, Recompute] = {
    Checkpointing.NONE: Recompute(0.0, 0.0),
    # op-level SAC (torchtitan's policy, planner/activations.py op_sac_kept): every other
    # matmul is recomputed (about half the block's matmul FLOPs), the SDPA output is saved.
    Checkpointing.SELECTIVE: Recompute(0.5, 0.0),
    # the whole block but its last matmul (non-reentrant early stop: unrecomputed_weights;
    # a reentrant checkpoint re-runs it too: _with_impl)
    Checkpointing.FULL: Recompute(1.0, 1.0, 1.0),
}


def _with_impl(rc: Recompute, checkpointing: Checkpointing, impl: CheckpointImpl) -> Recompute:
    """A reentrant full checkpoint has no early stop: torch/utils/checkpoint.py
    ``CheckpointFunction.backward`` re-runs ``ctx.run_function`` to its end before calling
    ``torch.autograd.backward`` on its outputs (``early_stop`` / ``_StopRecomputationError``
    belong to the non-reentrant ``_checkpoint_hook`` only), so the block's last matmul (and
    under TP the reduce-scatter after it) is re-run as well; so does a non-reentrant one
    given ``early_stop=False`` (torchtitan's full AC since 25413d224)."""
    if impl is not CheckpointImpl.NON_REENTRANT and checkpointing is Checkpointing.FULL:
        return dataclasses.replace(rc, early_stop=0.0)
    return rc


def recompute_of(model: ModelSpec, training: TrainingSpec,
                 checkpointing: Checkpointing) -> Recompute:
    """RECOMPUTE's share, and under selective checkpointing the linears torchtitan's
    ``force_recompute_mm_shapes_by_fqns`` moves between kept and recomputed on top of it
    (activations.sac_forced_share: exact in the weights moved; the alternation's own share
    stays RECOMPUTE's half)."""
    rc = _with_impl(RECOMPUTE[_ckpt(checkpointing)], checkpointing, training.checkpoint_impl)
    if checkpointing is not Checkpointing.SELECTIVE or not training.sac_force_recompute:
        return rc
    from planner.activations import sac_forced_share

    share = sac_forced_share(model, training.sac_list, training.sac_force_recompute)
    return dataclasses.replace(rc, matmul=rc.matmul + share) if share else rc


def _ckpt(checkpointing: Checkpointing) -> Checkpointing:
    if checkpointing is Checkpointing.AUTO:
        raise ValueError("Checkpointing.AUTO must be expanded before estimating throughput")
    return checkpointing


# --------------------------------------------------------------------------------------------
# Collectives: ring-algorithm bytes per GPU (NCCL docs, "Performance reported by NCCL tests":
# busbw = algbw * 2(n-1)/n for all-reduce, * (n-1)/n for all-gather / reduce-scatter)
# --------------------------------------------------------------------------------------------


def all_reduce_bytes(n: int, buffer_bytes: float) -> float:
    """Bytes each GPU sends (= receives) in a ring all-reduce of a ``buffer_bytes`` buffer."""
    return 2.0 * (n - 1) / n * buffer_bytes


def all_gather_bytes(n: int, buffer_bytes: float) -> float:
    """Ring all-gather producing a ``buffer_bytes`` full buffer: (n-1)/n of it per GPU."""
    return (n - 1) / n * buffer_bytes


def reduce_scatter_bytes(n: int, buffer_bytes: float) -> float:
    """Ring reduce-scatter of a ``buffer_bytes`` full buffer: (n-1)/n of it per GPU."""
    return (n - 1) / n * buffer_bytes


@dataclass(frozen=True, slots=True)
class Collectives:
    """How many collectives of which kind a strategy runs (full-model buffers).

    Sources: PyTorch FSDP paper (Zhao et al. 2023, sec. 3.2-3.3: FULL_SHARD all-gathers in
    forward and again in backward, reduce-scatters grads; SHARD_GRAD_OP keeps params gathered
    from forward to backward; HYBRID_SHARD shards inside a group and all-reduces across
    replicas); DDP (Li et al. 2020, VLDB: bucketed all-reduce overlapped with backward, no_sync
    during gradient accumulation); ZeRO (Rajbhandari et al. 2020, sec. 7: stage 1/2 = reduce-
    scatter + all-gather of updated params = all-reduce volume; stage 3 = 1.5x all-reduce).
    Fields may be numpy arrays (one strategy per element) in the report's sweep.
    """

    ag_fwd: Any
    """Parameter all-gathers per micro-batch in forward (shard group)."""
    ag_bwd: Any
    """... and in backward."""
    rs_micro: Any
    """Gradient reduce-scatters per micro-batch (shard group)."""
    ar_step: Any
    """Gradient all-reduces per optimizer step, overlapped with the last backward."""
    rs_step: Any
    """Gradient reduce-scatters per optimizer step, overlapped with the last backward."""
    ag_step: Any
    """Parameter all-gathers after the optimizer step (exposed)."""
    hybrid: Any
    """1: shard inside a node, all-reduce the gradient shard across nodes with every
    reduce-scatter."""
    per_unit: Any
    """1: one collective per FSDP unit (L blocks + root); 0: DDP-style buckets."""
    sharded_opt: Any
    """1: optimizer state sharded over the (shard) group."""
    ar_micro: Any = 0.0
    """Gradient all-reduces per micro-batch (DDP / NO_SHARD syncing every micro-batch)."""


COLLECTIVES: dict[Strategy, Collectives] = {
    #                          ag_fwd ag_bwd rs_mb ar_st rs_st ag_st hybrid unit  shard_opt
    Strategy.DDP:           Collectives(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0),
    Strategy.NO_SHARD:      Collectives(0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0),
    Strategy.SHARD_GRAD_OP: Collectives(1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0),
    Strategy.FULL_SHARD:    Collectives(1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0),
    Strategy.HYBRID_SHARD:  Collectives(1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0),
    Strategy.ZERO1:         Collectives(0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0),
    Strategy.ZERO2:         Collectives(0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0),
    Strategy.ZERO3:         Collectives(1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0),
}  # fmt: skip


def collectives(strategy: Strategy, grad_sync: GradSync) -> Collectives:
    """The strategy's collectives under the loop's gradient sync. ``COLLECTIVES`` lists them
    for a loop that syncs where the framework reduces by default; plain DDP and NO_SHARD
    loops without ``no_sync`` all-reduce after every micro-batch's backward, and DDP / FSDP
    loops with it reduce only after the last (DeepSpeed ZeRO-2/3 reduce every micro-batch
    either way; ZeRO-1 once per step)."""
    c = COLLECTIVES[strategy]
    if grad_sync is GradSync.EVERY and c.ar_step:
        return dataclasses.replace(c, ar_step=0.0, ar_micro=1.0)
    if grad_sync is GradSync.LAST and strategy.is_fsdp and c.rs_micro:
        return dataclasses.replace(c, rs_micro=0.0, rs_step=1.0)
    return c


@dataclass(frozen=True, slots=True)
class OffloadTraffic:
    """PCIe traffic and CPU work per offload mode.

    OPTIMIZER (ZeRO-Offload, Ren et al. 2021): grads go to host once per step, the CPU runs the
    optimizer, updated compute-dtype params come back. PARAMS_AND_OPTIMIZER (FSDP CPUOffload /
    ZeRO-Infinity): sharded params live in host RAM and are copied up before the forward and
    again before the backward all-gather of every micro-batch; reduced grad shards go down
    every backward.
    """

    grads_down_micro: Any
    grads_down_step: Any
    params_up_step: Any
    params_up_micro: Any
    """Copies per micro-batch."""
    cpu_step: Any


OFFLOAD_TRAFFIC: dict[Offload, OffloadTraffic] = {
    Offload.NONE: OffloadTraffic(0.0, 0.0, 0.0, 0.0, 0.0),
    Offload.OPTIMIZER: OffloadTraffic(0.0, 1.0, 1.0, 0.0, 1.0),
    Offload.PARAMS_AND_OPTIMIZER: OffloadTraffic(1.0, 0.0, 0.0, 2.0, 1.0),
}


def grad_reduce_bytes(precision: Precision, strategy: Strategy) -> int:
    """Element size of the reduced gradients.

    fp32 training: 4. Pure bf16: 2. AMP: PyTorch DDP reduces the fp32 .grad of fp32 params (4);
    FSDP reduces in ``reduce_dtype`` which torchtitan sets to float32 by default
    (``mixed_precision_reduce = "float32"``) (4); DeepSpeed keeps the model in the compute dtype
    and reduces half-precision gradients (2).
    """
    if precision is Precision.FP32:
        return 4
    if precision is Precision.BF16:
        return 2
    return 2 if strategy.is_zero else 4


def gather_bytes(precision: Precision) -> int:
    """Element size of all-gathered parameters: the compute dtype (FSDP ``param_dtype``)."""
    return precision.compute_bytes


def peak_flops(gpu: GpuProfile, precision: Precision, tf32: bool = False) -> float:
    """Dense peak FLOP/s of the precision's matmuls.

    bf16 / fp16 tensor cores for the half precisions; plain fp32 for FP32 (PyTorch's default
    ``torch.backends.cuda.matmul.allow_tf32 = False`` since 1.12), TF32 tensor cores with
    ``tf32`` (``--tf32``: allow_tf32 on; the profile's tf32_tflops, the fp32 rate on a GPU
    without TF32).
    """
    if precision is Precision.FP16_AMP:
        return gpu.fp16_tflops * 1e12
    if precision is Precision.FP32:
        return (gpu.tf32_tflops if tf32 else gpu.fp32_tflops) * 1e12
    return gpu.bf16_tflops * 1e12


def fsdp_compute_precision(training: TrainingSpec) -> Precision:
    """The precision FSDP's matmuls run in: the policy's param_dtype (``--param-dtype``, else
    what ``--precision`` implies; planner.spec.FsdpDtypes)."""
    mp = training.mixed_precision
    if not mp.given:
        return training.precision
    if training.fsdp_dtypes.param == 4:
        return Precision.FP32
    fp16 = mp.param_dtype is Dtype.FP16 or (mp.param_dtype is None
                                            and training.precision is Precision.FP16_AMP)
    return Precision.FP16_AMP if fp16 else Precision.BF16


def default_compute_efficiency(gpu: GpuProfile, compile: CompileMode = CompileMode.NONE) -> float:
    """The profile's achieved fraction of peak (data in hardware_profiles/*.toml): eager, or
    compiled when the blocks or the model are torch.compile-d (fitted separately on the public
    runs: benchmarks/throughput_accuracy.py, docs/throughput.md)."""
    if compile is not CompileMode.NONE and gpu.compiled_compute_efficiency is not None:
        return gpu.compiled_compute_efficiency
    return gpu.compute_efficiency


EFFICIENCY_PROVENANCES = ("measured", "derived", "assumed")
"""Where a profile's compute efficiency comes from: fitted on runs of that GPU family (or a
calibration measured on it), derived from a measured sibling by the roofline (docs/throughput.md
section 2), or assumed."""


# --------------------------------------------------------------------------------------------
# The numeric core (shared with the report's vectorized sweep)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInputs:
    """The numbers the step-time formulas read, per GPU. Each may be a numpy array (one
    configuration per element) in the report's sweep."""

    n_layers: Any
    q_dim: Any
    seq: Any
    mb: Any
    """Micro-batch (sequences)."""
    ga: Any
    """Micro-batches per optimizer step."""
    n: Any
    """GPUs."""
    gpn: Any
    """GPUs per node."""
    p_total: Any
    """All parameters."""
    p_block: Any
    """Matmul weights per block a token multiplies."""
    p_head: Any
    peak: Any
    """Dense peak FLOP/s of the precision."""
    eff: Any
    """Achieved fraction of peak."""
    bw_intra: Any
    """Bytes/s per GPU inside a node, efficiency applied."""
    bw_inter: Any
    lat_intra: Any
    """Seconds per ring hop."""
    lat_inter: Any
    pcie: Any
    """Host <-> device bytes/s, efficiency applied."""
    cpu_rate: Any
    """CPU optimizer parameters/s."""
    bucket: Any
    """DDP / ZeRO bucket bytes."""
    overlap: Any
    gather_b: Any
    grad_b: Any
    master_b: Any
    """Element sizes: gathered params, reduced grads, the host master copy."""
    comm: Collectives
    recompute: Recompute
    offload: OffloadTraffic
    # ---- fine-tuning and tensor parallel (defaults: full training, no TP) -----------------
    p_grad: Any = None
    """Parameters with gradients (reduced, offloaded); None: all (p_total)."""
    p_unrecomputed: Any = 0.0
    """Matmul weights per block a FULL recompute does not re-run (``unrecomputed_weights``)."""
    f8_p_unrecomputed: Any = 0.0
    """Of p_unrecomputed, a float8 linear's weights (planner/float8.py ``linears``)."""
    mm_w: Any = None
    """Matmul weights per token whose weight gradient is computed; None: all (L·p_block +
    p_head). LoRA: the adapters; frozen layers: the rest."""
    mm_x: Any = None
    """Matmul weights per token through which an input gradient flows; None: all."""
    attn_bwd_layers: Any = None
    """Layers whose attention backward runs (frozen leading blocks with frozen embeddings have
    none); None: all."""
    dequant_s: Any = 0.0
    """Dequantizing a quantized base, per micro-batch (forward and backward)."""
    tp: Any = 1.0
    """Tensor-parallel degree (sequence parallel)."""
    tp_bytes: Any = 0.0
    """Bytes of one sequence-parallel all-gather / reduce-scatter: micro-batch x seq x hidden
    x compute bytes."""
    act_offload_bytes: Any = 0.0
    """Activation offloading: bytes one micro-batch copies to the host in forward (and back
    in backward)."""
    # ---- context parallel (default: none; planner/context_parallel.py) --------------------
    cp: Any = 1.0
    """Context-parallel degree: a CP group shares each micro-batch (seq / cp tokens each)."""
    cp_fwd_bytes: Any = 0.0
    """Bytes one GPU receives per layer and micro-batch rotating keys and values, forward."""
    cp_bwd_bytes: Any = 0.0
    """The same in backward (keys and values again, the fp32 key/value gradients)."""
    cp_calls: Any = 0.0
    """Collectives per layer and micro-batch, forward and backward (their latency)."""
    cp_inter: Any = 0.0
    """1 where the CP group spans nodes (cp x tp > GPUs per node)."""
    # ---- expert parallel (default: none; planner/expert_parallel.py) -----------------------
    ep: Any = 1.0
    """Expert-parallel degree."""
    ep_bytes: Any = 0.0
    """Bytes one GPU receives in one token all-to-all, per MoE layer and micro-batch."""
    ep_layers: Any = 0.0
    """MoE layers (each runs the dispatch and combine all-to-alls)."""
    ep_inter: Any = 0.0
    """1 where the EP group spans nodes (ep > GPUs per node)."""
    ep_idle_mm: Any = 0.0
    """Routed-expert matmul weights per token, all MoE layers, that the busiest GPU runs
    beyond the balanced share: (imbalance - 1) x the top-k experts' (its step waits on it)."""
    ep_comm_less: Any = 0.0
    """Parameters FSDP's all-gathers and reduce-scatters no longer move per GPU: each GPU's
    experts are gathered over GPUs / ep ranks, E / ep of them (planner/expert_parallel.py)."""
    tp_moe_layers: Any = 0.0
    """Blocks whose MLP runs no sequence-parallel collective: expert parallel's MoE beside TP
    (each TP rank routes its own sequence shard; docs/model.md §8.8)."""
    # ---- DeepSpeed ZeRO++ (ZeRO-3; defaults: off; ``zeropp_times``) -------------------------
    ag_b: Any = None
    """Bytes per parameter element a ZeRO-3 all-gather moves: qwZ's int8 and its scales;
    None: gather_b."""
    hpz: Any = 1.0
    """hpZ's group (ranks; 1: off): every gather but the first forward's runs inside it."""
    qgz: Any = 0.0
    """1: qgZ's all-to-all gradient reduction (applies on more than one node)."""
    qgz_b: Any = 0.0
    """Bytes per gradient-matrix element qgZ moves: int4 and an fp32 scale per group."""
    qgz_mat_elems: Any = 0.0
    qgz_mats: Any = 0.0
    """Elements and count of the gradient matrices qgZ reduces (four all-to-alls each)."""
    qgz_vec_elems: Any = 0.0
    qgz_vecs: Any = 0.0
    """... of the 1-D gradients (norms, biases) it leaves to a reduce-scatter each."""
    # ---- DeepSpeed's 1-bit optimizers (planner/onebit.py; defaults: none) -------------------
    ob_elems: Any = 0.0
    """Padded elements the compressed all-reduces move per communicating step (0: none, the
    gradient all-reduce runs as the strategy says)."""
    ob_calls: Any = 0.0
    """``compressed_allreduce`` calls per communicating step."""
    ob_every: Any = 0.0
    """Fraction of steps that communicate (0/1 Adam: 1 / local_step_clipper)."""
    # ---- float8 (planner/float8.py; defaults: none) ----------------------------------------
    f8_discount: Any = 0.0
    """Of each FLOP of a float8 forward matmul, the part of its time saved: 1 - 1 / (the
    float8 matmul rate over the one ``peak`` stands for) (planner/float8.py ``step_terms``)."""
    f8_discount_bwd: Any = None
    """The same for the input- and weight-gradient matmuls; None: f8_discount."""
    f8_p_block: Any = 0.0
    """Of p_block, the float8 linears' weights (planner/float8.py ``linears``)."""
    f8_gw: Any = 1.0
    """1: the weight-gradient matmul runs in float8 too; 0: in bf16 (rowwise_with_gw_hp)."""
    f8_cast_fwd_s: Any = 0.0
    """Seconds of a forward's float8 casts per micro-batch (memory-bound, at HBM bandwidth);
    a recomputed forward casts again."""
    f8_cast_bwd_s: Any = 0.0
    """The same for a backward's casts."""


@dataclass(frozen=True, slots=True)
class StepEstimate:
    """One optimizer step on one GPU (all GPUs are symmetric under data parallelism). Fields
    are numpy arrays when evaluated by the report's sweep."""

    step_time_s: Any
    compute_s: Any
    """Forward + backward (+ recompute) of all grad_accum micro-batches at the assumed rate."""
    comm_s: Any
    """All collective time of the step, overlapped or not."""
    exposed_comm_s: Any
    """The part of comm_s not hidden behind compute."""
    offload_s: Any
    """PCIe traffic and the CPU optimizer step (offload only; not overlapped)."""
    tokens_per_s_per_gpu: Any
    mfu: Any
    """Model FLOPs (no recompute) per second / peak (PaLM's MFU)."""
    flops_per_step: Any
    """FLOPs executed per GPU per step, recompute included."""

    def slowdown_vs(self, reference: StepEstimate) -> Any:
        """Step-time ratio to ``reference`` for the same tokens per step (>1: slower)."""
        return self.step_time_s / reference.step_time_s


def step_core(x: StepInputs) -> StepEstimate:
    """The step-time formulas (docs/throughput.md), on plain numbers or numpy arrays."""
    L, q, seq, mb, ga, n, gpn = x.n_layers, x.q_dim, x.seq, x.mb, x.ga, x.n, x.gpn
    cm, rc, off = x.comm, x.recompute, x.offload

    # ---- compute (PaLM appendix B; Korthikanti et al. 2022 for recompute) -------------------
    mm = L * x.p_block + x.p_head
    attn_fwd = 4.0 * L * seq * q
    fwd_tok = 2.0 * mm + attn_fwd
    # backward: an input-gradient and a weight-gradient matmul per weight (2 + 2 FLOPs per
    # weight per token); a frozen weight skips the second, a block no gradient reaches both
    mm_w = mm if x.mm_w is None else x.mm_w
    mm_x = mm if x.mm_x is None else x.mm_x
    attn_bwd = attn_fwd if x.attn_bwd_layers is None else 4.0 * x.attn_bwd_layers * seq * q
    bwd_tok = 2.0 * mm_x + 2.0 * mm_w + 2.0 * attn_bwd
    model_tok = fwd_tok + bwd_tok
    # a full recompute stops before the block's last matmul (PyTorch non-reentrant
    # checkpoint's early stop; planner/arch ``block_unrecomputed_weights``)
    recompute_tok = (2.0 * L * (rc.matmul * x.p_block - rc.early_stop * x.p_unrecomputed)
                     + rc.attention * attn_fwd)
    tokens_micro = mb * seq
    tp = x.tp
    # a TP group shares each micro-batch's matmuls; a CP group its tokens (load-balanced
    # causal chunks: each rank an equal share of the attention too)
    rate = x.peak * x.eff * tp * x.cp
    # float8 (torchao Float8Linear on the blocks' linears): their forward, input-gradient and
    # weight-gradient matmuls (and the recomputed forward ones) at the measured float8 / bf16
    # matmul rate (the datasheet peaks' ratio where not measured); the casts at HBM bandwidth
    # (a recomputed forward casts again)
    f8 = 2.0 * L * x.f8_p_block * x.f8_discount
    f8_bwd = f8 if x.f8_discount_bwd is None else 2.0 * L * x.f8_p_block * x.f8_discount_bwd
    # expert parallel's busiest GPU: its experts' surplus rows, forward (2), backward (4)
    # and a recomputed forward (2 x the matmul fraction) FLOPs per weight; time, not useful
    # FLOPs (MFU and FLOPs per step stay the balanced ones)
    ep_fwd = 2.0 * x.ep_idle_mm
    ep_bwd = (4.0 + 2.0 * rc.matmul) * x.ep_idle_mm
    fwd_s = tokens_micro * (fwd_tok + ep_fwd - f8) / rate + 0.5 * x.dequant_s + x.f8_cast_fwd_s
    # (a recomputed forward dequantizes again)
    f8_rc = f8 * rc.matmul - rc.early_stop * 2.0 * L * x.f8_p_unrecomputed * x.f8_discount
    bwd_s = (tokens_micro * (bwd_tok + recompute_tok + ep_bwd
                             - f8_bwd * (1.0 + x.f8_gw) - f8_rc) / rate
             + 0.5 * x.dequant_s * (1.0 + rc.matmul)
             + x.f8_cast_bwd_s + rc.matmul * x.f8_cast_fwd_s)
    compute_s = ga * (fwd_s + bwd_s)

    # ---- communication ----------------------------------------------------------------------
    # shard / reduction group: a node for HYBRID_SHARD, all GPUs otherwise (over the
    # data-parallel dimension of a TP mesh: n / tp)
    m = vec.where(cm.hybrid > 0, vec.minimum(n, gpn), n) / tp
    # A ring over a group that spans nodes is bottlenecked by the network, but NCCL runs one
    # ring per NIC (channel) and each ring leaves a node once: the network carries 1/local of
    # a GPU's ring traffic, where local = group members per node. Bus bandwidth is therefore
    # min(intra, local * per-GPU NIC bandwidth) (NVIDIA: DGX-A100, 8 x 200 Gb/s IB, measures
    # 192 GB/s all-reduce busbw, NVIDIA/nccl#1576); inside one node it is the NVLink bandwidth.
    spans = m > gpn
    local = vec.minimum(m, gpn)
    bw = vec.where(spans, vec.minimum(x.bw_intra, local * x.bw_inter), x.bw_intra)
    hop = vec.where(spans, x.lat_inter, x.lat_intra)
    k = vec.ceil(n / gpn)  # replicas across nodes (HYBRID_SHARD)
    ring = (m - 1.0) / m
    p_grad = x.p_total if x.p_grad is None else x.p_grad
    # expert parallel: the experts' collectives run over GPUs / ep ranks (ep_comm_less)
    param_buf = (x.p_total - x.ep_comm_less) * x.gather_b / tp
    grad_buf = vec.maximum((p_grad - x.ep_comm_less) * x.grad_b / tp, 1.0)
    units = L + 1.0
    # collectives per full-model pass: one per FSDP unit, or one per DDP bucket
    calls_grad = vec.where(cm.per_unit > 0, units,
                           vec.maximum(1.0, vec.ceil(grad_buf / x.bucket)))
    calls_param = vec.where(cm.per_unit > 0, units,
                            vec.maximum(1.0, vec.ceil(param_buf / x.bucket)))
    t_ag = ring * param_buf / bw + calls_param * (m - 1.0) * hop
    t_rs = ring * grad_buf / bw + calls_grad * (m - 1.0) * hop
    t_ar = 2.0 * ring * grad_buf / bw + calls_grad * 2.0 * (m - 1.0) * hop
    # HYBRID_SHARD: all-reduce of the gradient shard (1/m of it) across the k node replicas,
    # with every reduce-scatter
    t_xar = vec.where(k > 1.0, 2.0 * (k - 1.0) / k * (grad_buf / m) / x.bw_inter
                      + calls_grad * 2.0 * (k - 1.0) * x.lat_inter, 0.0) * cm.hybrid

    # DeepSpeed ZeRO++ (ZeRO-3): qwZ's int8 gathers, hpZ's gathers inside its group after
    # the first forward, qgZ's all-to-all reduction; the plain collectives when off
    t_ag, t_ag2, t_rs = zeropp_times(x, m, bw, hop, calls_param, t_ag, t_rs)
    # hidden behind forward compute (prefetch); per micro-batch on average: hpZ's secondary
    # copy is made in the first forward and kept until the step
    f_micro = cm.ag_fwd * (t_ag + (ga - 1.0) / ga * (t_ag2 - t_ag))
    # DeepSpeed's 1-bit optimizers after their warm-up: no gradient all-reduce in backward
    # (``enable_backward_allreduce = False``), the compressed one in the step instead
    keep_ar = vec.where(x.ob_elems > 0, 0.0, 1.0)
    # hidden behind backward
    b_micro = cm.ag_bwd * t_ag2 + cm.rs_micro * (t_rs + t_xar) + cm.ar_micro * t_ar * keep_ar
    b_step = cm.ar_step * t_ar * keep_ar + cm.rs_step * (t_rs + t_xar)  # last backward only
    e_step = cm.ag_step * t_ag + onebit_s(x, m, bw, hop)  # after backward: exposed
    comm_s = ga * (f_micro + b_micro) + b_step + e_step

    # what cannot be hidden: the first unit's gather / last unit's reduce (1/units of the
    # traffic) or DDP's last bucket, at least; beyond that what exceeds the compute
    tail_f = 1.0 / units
    tail_b = vec.where(cm.per_unit > 0, 1.0 / units, vec.minimum(1.0, x.bucket / grad_buf))
    ov = x.overlap
    exp_f = vec.maximum(f_micro * tail_f, f_micro - ov * fwd_s)
    exp_b = vec.maximum(b_micro * tail_b, b_micro - ov * bwd_s)
    last_b = b_micro + b_step
    exp_last = vec.maximum(last_b * tail_b, last_b - ov * bwd_s)
    exposed_s = ga * exp_f + (ga - 1.0) * exp_b + exp_last + e_step
    tp_s = tp_collectives_s(x, L, ga)
    comm_s = comm_s + tp_s
    exposed_s = exposed_s + tp_s
    cp_s = cp_rotation_s(x, rc.attention)
    comm_s = comm_s + cp_s
    exposed_s = exposed_s + cp_s
    # torchtitan's selective policy saves the all-to-alls' outputs (as it saves SDPA's):
    # only full checkpointing sends them again (rc.attention: 0, 0, 1)
    ep_s = ep_all_to_all_s(x, rc.attention)
    comm_s = comm_s + ep_s
    exposed_s = exposed_s + ep_s

    # ---- offload over PCIe + CPU optimizer (not overlapped: an upper bound) ------------------
    p_local = p_grad / vec.where(cm.sharded_opt > 0, m, 1.0)
    pcie_bytes = p_local * (off.grads_down_micro * ga * x.grad_b
                            + off.grads_down_step * x.grad_b
                            + off.params_up_step * x.gather_b
                            + off.params_up_micro * ga * x.master_b)
    # activation offloading: every offloaded save goes down in forward and up in backward,
    # each micro-batch (OffloadActivations, torchtune/training/_activation_offloading.py).
    # Down: copies on a side stream, the compute stream waiting only on the copy of a save
    # max_fwd_stash_size saves back (pack_tensor's s0.wait_event): hidden behind the
    # forward's compute, what exceeds it exposed. Up: each unpack issues its copy and makes
    # the compute stream wait for it at once (unpack_tensor_with_streams: s0.wait_stream(s1),
    # no prefetch): exposed. GPU run 2026-11-26-h100-b, Llama-3.2-1B x 8192 tokens, no
    # checkpointing: 0.93 s a step with 21.8 / 20.7 GB offloaded, 0.19-0.23 s without
    down_s = x.act_offload_bytes / x.pcie
    act_s = ga * (vec.maximum(0.0, down_s - fwd_s) + down_s)
    offload_s = pcie_bytes / x.pcie + off.cpu_step * p_local / x.cpu_rate + act_s

    step_s = compute_s + exposed_s + offload_s
    # per GPU: a TP group shares its micro-batches, a CP group its sequences
    tokens_step = ga * tokens_micro / (tp * x.cp)
    return StepEstimate(
        step_time_s=step_s, compute_s=compute_s, comm_s=comm_s, exposed_comm_s=exposed_s,
        offload_s=offload_s, tokens_per_s_per_gpu=tokens_step / step_s,
        mfu=tokens_step * model_tok / (step_s * x.peak),
        flops_per_step=tokens_step * (model_tok + recompute_tok))


def onebit_s(x: StepInputs, m: Any, bw: Any, hop: Any) -> Any:
    """The compressed all-reduce of DeepSpeed's 1-bit optimizers per step, averaged over the
    steps (``NcclBackend.compressed_allreduce``, deepspeed/runtime/comm/nccl.py, v0.19.6;
    the bytes per call measured by probes/onebit_cpu.py), for M padded elements over m ranks:

    - phase 1 all-to-alls the packed signs, M/8 bytes, a chunk of M/8m to each rank. An
      all-to-all is not a ring: across nodes each GPU's own NIC carries the chunks for the
      ranks of other nodes, (m - L)/m of M/8 (L the ranks per node), while the (L - 1)/m
      for its node go over NVLink, at once (the slower of the two, *assumed*); inside a
      node (m-1)/m of M/8 over NVLink. One hop of latency (*assumed*: NCCL sends to every
      peer at once).
    - an all-gather of one fp32 scale per rank, phase 2's all-gather of each rank's server
      chunk of signs (M/8m bytes: (m-1)/m of M/8 arrive) and of its scale: rings, as
      ``step_core``'s (2 (m-1) scales of 4 B), m-1 hops each.

    Inside a node that is 2 (m-1)/m M/8 + 8 (m-1) bytes per rank, a sixteenth of a 16-bit ring
    all-reduce's 2 (m-1)/m 2M. It runs inside the optimizer step, after backward: not
    overlapped."""
    ring = (m - 1.0) / m
    signs = x.ob_elems / 8.0
    local = vec.minimum(m, x.gpn)
    t_a2a = vec.where(m > x.gpn,
                      vec.maximum(signs * (m - local) / m / x.bw_inter,
                                  signs * (local - 1.0) / m / x.bw_intra),
                      ring * signs / x.bw_intra)
    t_ag = (ring * signs + x.ob_calls * 8.0 * (m - 1.0)) / bw
    t = t_a2a + t_ag + x.ob_calls * (1.0 + 3.0 * (m - 1.0)) * hop
    return vec.where(x.ob_elems > 0, x.ob_every * t, 0.0)


def tp_collectives_s(x: StepInputs, n_layers: Any, micro_batches: Any) -> Any:
    """Sequence-parallel collectives inside each layer (Korthikanti et al. 2022, sec. 4.2.2):
    forward all-gathers before attention and MLP and reduce-scatters after them, backward
    the same, a recomputed forward again; on the critical path (torchtitan without async
    TP), inside a node; ``n_layers`` blocks, ``micro_batches`` micro-batches."""
    tp = x.tp
    # per block: attention's and the MLP's all-gather and reduce-scatter, forward, backward
    # and a recomputed forward (which stops before the MLP's down projection, and so before
    # the reduce-scatter after it, where p_unrecomputed > 0); an EP MoE beside TP has none
    # around its MLP (§8.8)
    rc = x.recompute
    skipped = rc.early_stop * vec.where(x.p_unrecomputed > 0, 1.0, 0.0)
    calls = n_layers * (8.0 + 4.0 * rc.matmul - skipped) \
        - x.tp_moe_layers * (4.0 + 2.0 * rc.matmul)
    return vec.where(tp > 1.0, micro_batches * calls * ((tp - 1.0) / tp * x.tp_bytes
                                                        / x.bw_intra + (tp - 1.0) * x.lat_intra),
                     0.0)


def cp_rotation_s(x: StepInputs, attn_recompute: Any) -> Any:
    """Context parallel's key/value rotation per step (planner/context_parallel.py
    ``rotation_bytes``): every layer of every micro-batch, forward, backward and a
    recomputed forward (full checkpointing reruns the ring). Counted on the critical path,
    as the sequence-parallel collectives are: torch issues each rotation before the step's
    attention and waits at the next step, so part of it hides behind compute (*assumed* not
    hidden: an upper bound). Inside a node at the NVLink rate, else at the NIC's."""
    bw = vec.where(x.cp_inter > 0, vec.minimum(x.bw_intra, x.bw_inter), x.bw_intra)
    lat = vec.where(x.cp_inter > 0, x.lat_inter, x.lat_intra)
    per_layer = ((1.0 + attn_recompute) * x.cp_fwd_bytes + x.cp_bwd_bytes) / bw \
        + x.cp_calls * lat
    return vec.where(x.cp > 1.0, x.ga * x.n_layers * per_layer, 0.0)


def ep_all_to_all_s(x: StepInputs, recompute: Any) -> Any:
    """Expert parallel's token all-to-alls per step (planner/expert_parallel.py): in every
    MoE layer of every micro-batch the dispatch and the combine in forward (each after a
    small count exchange: its latency), their reverses in backward, and the forward's again
    where checkpointing re-sends them (``recompute``: 1 under full checkpointing; 0 under
    torchtitan's selective policy, which saves the all-to-alls' outputs:
    torchtitan/distributed/activation_checkpoint.py, the op save list's
    ``_c10d_functional.all_to_all_single``). torchtitan's dispatch waits for its all-to-all
    before the grouped GEMM: on the critical path (*assumed* not overlapped). Inside a node
    at the NVLink rate, else at the NIC's."""
    bw = vec.where(x.ep_inter > 0, vec.minimum(x.bw_intra, x.bw_inter), x.bw_intra)
    lat = vec.where(x.ep_inter > 0, x.lat_inter, x.lat_intra)
    calls = (2.0 + 2.0 + 2.0 * recompute)
    per_layer = calls * x.ep_bytes / bw + (calls + 1.0 + recompute) * lat
    return vec.where(x.ep > 1.0, x.ga * x.ep_layers * per_layer, 0.0)


def ring_link(x: StepInputs, group: Any) -> tuple[Any, Any]:
    """(bus bandwidth, seconds per hop) of a ring over ``group`` consecutive ranks: NVLink
    inside a node; across nodes min(intra, local x NIC), as ``step_core`` explains."""
    spans = group > x.gpn
    bw = vec.where(spans, vec.minimum(x.bw_intra, vec.minimum(group, x.gpn) * x.bw_inter),
                   x.bw_intra)
    return bw, vec.where(spans, x.lat_inter, x.lat_intra)


def zeropp_times(x: StepInputs, m: Any, bw: Any, hop: Any, calls_param: Any, t_ag: Any,
                 t_rs: Any) -> tuple[Any, Any, Any]:
    """ZeRO-3's (first all-gather, later all-gathers, gradient reduction) seconds per pass
    under DeepSpeed's ZeRO++ (Wang et al. 2023, arXiv 2306.10209, sec. 3; DeepSpeed v0.19.6),
    the plain ``t_ag, t_ag, t_rs`` when it is off. Per GPU, P parameters, N GPUs, L per node:

    - qwZ (``partition_parameters.py`` ``_all_gather_coalesced``, ``quantize``): every
      gather moves int8 and an fp32 scale per group, ``ag_b`` = 1 + 4/4096 B per element
      instead of 2: (N-1)/N P ag_b over the ring.
    - hpZ (``_partition_param_sec``; ``partitioned_param_coordinator.py`` gathers from
      ``ds_secondary_tensor`` over ``zero_param_process_group`` while it exists): the first
      forward gathers the trainable parameters over all N (``_post_step`` dropped their
      secondary copies; frozen ones keep theirs); every later gather (the backward,
      recompute, later micro-batches' forwards) runs over the h ranks of the group, inside a
      node: (h-1)/h P ag_b on NVLink.
    - qgZ (``comm/coalesced_collectives.py`` ``all_to_all_quant_reduce``, used by
      ``stage3.py`` ``__avg_scatter_grads`` when world // local > 1): each gradient matrix is
      quantized to int4 (``qgz_b`` = 0.5 B and an fp32 scale per group of min(rows, cols)
      elements), all-to-all inside the node ((L-1)/L of it leaves each GPU on NVLink), reduced
      to P/L, re-quantized, all-to-all across the k = N/L nodes ((k-1)/k of P/L qgz_b over
      each GPU's NIC), dequantized and summed. Each all-to-all (data, then scales: four per
      matrix) costs one hop of latency (*assumed*: NCCL sends to every peer at once); 1-D
      gradients go through a reduce-scatter each.

    The paper's cross-node volume per step (sec. 3.4) is 3M for ZeRO-3 (forward gather,
    backward gather, reduce-scatter, M the 16-bit model bytes) and 0.75M with all three
    (0.5M + 0 + 0.25M); the source agrees, up to the scales (tests/test_zeropp.py).
    """
    ag_b = x.gather_b if x.ag_b is None else x.ag_b
    p = x.p_total / x.tp
    ring = (m - 1.0) / m
    t_first = vec.where(ag_b != x.gather_b,
                        t_ag + ring * p * (ag_b - x.gather_b) / bw, t_ag)
    h = x.hpz
    bw_h, hop_h = ring_link(x, h)
    t_later = vec.where(h > 1.0, (h - 1.0) / h * p * ag_b / bw_h + calls_param * (h - 1.0)
                        * hop_h, t_first)
    # frozen parameters (LoRA, frozen layers) keep their secondary copy across steps
    frozen = 1.0 - (x.p_total if x.p_grad is None else x.p_grad) / x.p_total
    t_first = vec.where(h > 1.0, t_first + frozen * (t_later - t_first), t_first)
    local = x.gpn  # DeepSpeed: local_world_size = device_count(), nodes = world // local
    k = vec.maximum(vec.floor_int(x.n / x.gpn) * 1.0, 1.0)
    mats = x.qgz_mat_elems * x.qgz_b
    intra = (local - 1.0) / local * mats / x.bw_intra + 2.0 * x.qgz_mats * x.lat_intra
    inter = (k - 1.0) / k * mats / local / x.bw_inter + 2.0 * x.qgz_mats * x.lat_inter
    vecs = ring * x.qgz_vec_elems * x.grad_b / bw + x.qgz_vecs * (m - 1.0) * hop
    t_red = vec.where((x.qgz > 0) * (k > 1.0), intra + inter + vecs, t_rs)
    return t_first, t_later, t_red


def zeropp_inputs(model: ModelSpec, training: TrainingSpec, candidate: Candidate, n: Any
                  ) -> dict[str, Any]:
    """The StepInputs fields of DeepSpeed's ZeRO++ (empty unless a ZeRO-3 candidate has it
    on): ``zeropp_times`` reads them."""
    ds = training.deepspeed
    if candidate.strategy is not Strategy.ZERO3 or not ds.zeropp:
        return {}
    from planner.memory.zero import QWZ_GROUP, hpz_group
    from planner.params import numel, trainable

    out: dict[str, Any] = {"hpz": hpz_group(ds, n) * 1.0}
    if ds.zero_quantized_weights:
        out["ag_b"] = 1.0 + 4.0 / QWZ_GROUP
    if ds.zero_quantized_gradients:
        # int4 codes and an fp32 scale per group; max(rows, cols, world) groups a matrix
        # (``intra_quant_group``): 0.5 numel + 4 max(rows, cols) bytes (world < both here)
        groups = trainable(model, training.finetune).groups
        mats = [(s, k) for _, s, k in groups if len(s) >= 2]
        vecs = [(s, k) for _, s, k in groups if len(s) < 2]
        elems = sum(numel(s) * k for s, k in mats)
        wire = sum((numel(s) / 2 + 4.0 * max(s)) * k for s, k in mats)
        out.update(qgz=1.0, qgz_b=wire / elems if elems else 0.5, qgz_mat_elems=float(elems),
                   qgz_mats=float(sum(k for _, k in mats)),
                   qgz_vec_elems=float(sum(numel(s) * k for s, k in vecs)),
                   qgz_vecs=float(sum(k for _, k in vecs)))
    return out


# --------------------------------------------------------------------------------------------
# Public scalar API
# --------------------------------------------------------------------------------------------


def finetune_inputs(model: ModelSpec, training: TrainingSpec, hbm_bytes_per_s: Any
                    ) -> dict[str, Any]:
    """StepInputs fields of a fine-tune (empty for full training): what has gradients, which
    backward matmuls run, and the quantized base's dequantization (at the GPU's HBM bandwidth,
    a number or a numpy array of them).

    bitsandbytes dequantizes each 4-bit linear to the compute dtype in forward and again in
    backward (``MatMul4Bit``): memory-bound, reading the packed codes (0.5 B) and writing the
    bf16 copy (2 B) per element at HBM bandwidth.
    """
    from planner.params import trainable

    ft = training.finetune
    if ft.full:
        return {}
    T = trainable(model, ft)
    p_block, p_head = matmul_params(model)
    L = model.n_layers
    frozen = ft.frozen_blocks(L)
    head_w = 0 if ft.head_frozen(model.tied_embeddings) else p_head
    if ft.lora:
        w = float(T.train)  # the adapters' own matmuls are counted as weight gradients
        x_elems = float(L * p_block + p_head)
        attn_layers = float(L)
    else:
        w = float((L - frozen) * p_block + head_w)
        reach = 0 if ft.embeddings_frozen else frozen  # frozen blocks a gradient crosses
        x_elems = float((L - frozen + reach) * p_block + p_head)
        attn_layers = float(L - frozen + reach)
    out: dict[str, Any] = {"p_grad": float(T.train), "mm_w": w, "mm_x": x_elems,
                           "attn_bwd_layers": attn_layers}
    if T.quant_per_block:
        packed = 0.5 if str(ft.quantize_base) == "nf4" else 1.0
        per_pass = L * T.quant_per_block * (packed + training.precision.compute_bytes)
        # once per forward and once per backward of each micro-batch, whatever its size
        out["dequant_s"] = 2.0 * per_pass / hbm_bytes_per_s
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Rates:
    """What a step reads of the GPU and its links, the assumptions applied. Each may be a
    numpy array (one GPU type per element) in the report's sweep."""

    peak: Any
    """Dense peak FLOP/s of the precision."""
    peak_fsdp: Any
    """The same for the FSDP candidates, which compute in the policy's param_dtype
    (``fsdp_compute_precision``; = peak without a policy)."""
    eff: Any
    """Achieved fraction of peak."""
    bw_intra: Any
    bw_inter: Any
    """Bytes/s per GPU inside a node and across nodes."""
    pcie: Any
    """Host <-> device bytes/s."""
    hbm: Any
    """Device memory bytes/s (dequantizing a quantized base)."""
    peak_bf16: Any = 0.0
    """Dense bf16 peak FLOP/s (float8's matmul rates are given over bf16's)."""
    fp8_speedup: Any = 1.0
    fp8_speedup_rowwise: Any = 1.0
    """Float8 matmul rate over the bf16 one, tensorwise / rowwise kernel: the profile's
    measured ``fp8_matmul_speedup`` / ``fp8_rowwise_matmul_speedup``, else its datasheet
    ``fp8_tflops / bf16_tflops`` (*assumed*; 1 where the GPU has no fp8 peak: float8 is
    refused there before any step time is asked)."""

    @classmethod
    def of(cls, gpu: GpuProfile, training: TrainingSpec,
           assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS) -> Rates:
        a = assumptions
        eff = a.compute_efficiency if a.compute_efficiency is not None else \
            default_compute_efficiency(gpu, training.compile)
        return cls(peak=peak_flops(gpu, training.precision, training.tf32),
                   peak_fsdp=peak_flops(gpu, fsdp_compute_precision(training), training.tf32),
                   eff=float(eff),
                   bw_intra=gpu.intra_node_bandwidth_bytes_per_s * a.intra_node_comm_efficiency,
                   bw_inter=gpu.inter_node_bandwidth_bytes_per_s * a.inter_node_comm_efficiency,
                   pcie=gpu.pcie_bandwidth_bytes_per_s * a.pcie_efficiency,
                   hbm=gpu.hbm_bandwidth_bytes_per_s, peak_bf16=gpu.bf16_tflops * 1e12,
                   **fp8_speedups(gpu))


def fp8_speedups(gpu: GpuProfile) -> dict[str, float]:
    """Rates' float8 matmul rates over bf16: measured where the profile has them (h100-80:
    benchmarks/gpu_runs/2026-11-26-h100-b ``record: gemm``), the datasheet ratio otherwise."""
    datasheet = (gpu.fp8_tflops or gpu.bf16_tflops) / gpu.bf16_tflops
    return {"fp8_speedup": gpu.fp8_matmul_speedup or datasheet,
            "fp8_speedup_rowwise": gpu.fp8_rowwise_matmul_speedup or datasheet}


def step_inputs_at(model: ModelSpec, training: TrainingSpec, candidate: Candidate,
                   assumptions: ThroughputAssumptions, *, seq: Any, mb: Any, n: Any, gpn: Any,
                   rates: Rates) -> StepInputs:
    """The StepInputs of a candidate at these numbers: sequence length, micro-batch, GPUs,
    GPUs per node and the GPU's ``Rates``, each a number or a numpy array (one configuration
    per element, the report's sweep); the rest of ``training`` is read as given."""
    from planner.params import total_params

    a = assumptions
    precision = training.precision
    fsdp = candidate.strategy.is_fsdp
    # FSDP moves and computes in its policy's dtypes (planner.spec.FsdpDtypes: --precision's
    # own without a policy, the same numbers as the precision-based ones below)
    fd = training.fsdp_dtypes
    p_block, p_head = matmul_params(model)
    # a GPU casts its own tokens: under context parallel seq / cp of each sequence
    f8 = float8_inputs(model, training, candidate, rates, mb * seq / training.cp, n,
                       peak=rates.peak_fsdp if fsdp else rates.peak)
    gather_b = float(fd.param if fsdp else gather_bytes(precision))
    if fsdp and "f8_gather_saving" in f8:  # float8 all-gather: fewer bytes per parameter
        gather_b = gather_b - f8["f8_gather_saving"] / float(total_params(model))
    f8.pop("f8_gather_saving", None)
    return StepInputs(
        n_layers=float(model.n_layers), q_dim=float(attn_width(model)), seq=seq * 1.0,
        mb=mb * 1.0, ga=float(training.grad_accum), n=n * 1.0, gpn=gpn * 1.0,
        p_total=float(total_params(model)), p_block=float(p_block), p_head=float(p_head),
        peak=rates.peak_fsdp if fsdp else rates.peak, eff=rates.eff, bw_intra=rates.bw_intra,
        bw_inter=rates.bw_inter,
        lat_intra=a.intra_node_hop_latency_s, lat_inter=a.inter_node_hop_latency_s,
        pcie=rates.pcie, cpu_rate=a.cpu_adam_params_per_s, bucket=float(a.ddp_bucket_bytes),
        overlap=a.overlap_fraction,
        gather_b=gather_b,
        grad_b=float(fd.reduce if fsdp else grad_reduce_bytes(precision, candidate.strategy)),
        master_b=float(fd.storage if fsdp else precision.param_bytes),
        comm=collectives(candidate.strategy, training.grad_sync),
        recompute=recompute_of(model, training, candidate.checkpointing),
        p_unrecomputed=float(unrecomputed_weights(model, training.finetune)),
        f8_p_unrecomputed=float(_f8_unrecomputed(model, training)),
        offload=OFFLOAD_TRAFFIC[candidate.offload],
        tp=float(candidate.tp),
        act_offload_bytes=_act_offload_bytes(model, training, candidate) * mb * seq * 1.0,
        tp_bytes=mb * seq * model.hidden * (fd.param if fsdp else precision.compute_bytes) * 1.0,
        **finetune_inputs(model, training, rates.hbm),
        **zeropp_inputs(model, training, candidate, n),
        **onebit_inputs(model, training, n),
        **cp_inputs(model, training, candidate, mb=mb, seq=seq, gpn=gpn,
                    c=fd.param if fsdp else precision.compute_bytes),
        **ep_step_inputs(model, training, candidate, mb=mb, seq=seq, gpn=gpn, n=n,
                         c=fd.param if fsdp else precision.compute_bytes), **f8)


def _f8_unrecomputed(model: ModelSpec, training: TrainingSpec) -> int:
    """The skipped down projection's weights when it is a float8 linear (0 otherwise)."""
    skipped = unrecomputed_weights(model, training.finetune)
    if not skipped or training.float8.value == "none":
        return 0
    from planner import float8

    return skipped if (model.ffn_hidden, model.hidden) in float8.linears(model) else 0


def onebit_inputs(model: ModelSpec, training: TrainingSpec, n: Any) -> dict[str, Any]:
    """StepInputs fields of DeepSpeed's 1-bit optimizers (empty without one):
    planner/onebit.py ``step_inputs``, over the trainable tensors and the GPUs."""
    if not training.optimizer.onebit:
        return {}
    from planner import onebit
    from planner.params import trainable

    return onebit.step_inputs(trainable(model, training.finetune).groups, training, n)


def ep_step_inputs(model: ModelSpec, training: TrainingSpec, candidate: Candidate, *,
                   mb: Any, seq: Any, gpn: Any, n: Any, c: int) -> dict[str, Any]:
    """StepInputs fields of expert parallel (empty without it): planner/expert_parallel.py
    ``ep_inputs``."""
    if training.ep <= 1:
        return {}
    from planner.expert_parallel import ep_inputs

    return ep_inputs(model, training, candidate, mb=mb, seq=seq, gpn=gpn, c=c, n=n)


def float8_inputs(model: ModelSpec, training: TrainingSpec, candidate: Candidate, rates: Rates,
                  tokens: Any, n: Any, *, peak: Any) -> dict[str, Any]:
    """StepInputs fields of ``--float8`` (empty without it): planner/float8.py ``step_terms``."""
    from planner import float8

    if not float8.enabled(training):
        return {}
    return float8.step_terms(model, training, candidate, tokens=tokens, n=n, peak=peak,
                             peak_bf16=rates.peak_bf16, speedup=rates.fp8_speedup,
                             speedup_rowwise=rates.fp8_speedup_rowwise, hbm=rates.hbm)


def cp_inputs(model: ModelSpec, training: TrainingSpec, candidate: Candidate, *, mb: Any,
              seq: Any, gpn: Any, c: int) -> dict[str, Any]:
    """StepInputs fields of context parallel (empty without it): the rotation's bytes per
    layer (keys and values with every query head, or the model's key/value heads under
    ``CpKv.GROUPED``, over the TP group's heads: heads / tp),
    its collectives (all-gather: one in forward, one in backward; all-to-all: cp - 1 each;
    the backward's fp32 key/value gradients: cp all-to-alls) and whether the group spans
    nodes (torchtitan's mesh puts cp beside tp, innermost)."""
    cp = training.cp
    if cp <= 1:
        return {}
    from planner.context_parallel import rotation_bytes
    from planner.spec import CpKv, CpRotate

    # every term rotated is a key, a value or their gradient: the heads SDPA is given
    heads = model.n_heads // candidate.tp if training.cp_kv is CpKv.REPEATED else \
        -(-model.n_kv_heads // candidate.tp)
    fwd, bwd = rotation_bytes(batch=1, seq=cp, n_heads=heads,
                              d_head=model.d_head, c=c, cp=cp)
    per_token = mb * seq / cp  # rotation_bytes at one token per rank, times the local tokens
    kv_calls = 1.0 if training.cp_rotate is CpRotate.ALLGATHER else cp - 1.0
    return {"cp": float(cp), "cp_fwd_bytes": fwd * per_token, "cp_bwd_bytes": bwd * per_token,
            "cp_calls": 2.0 * kv_calls + cp,
            "cp_inter": vec.where(cp * candidate.tp > gpn, 1.0, 0.0)}


def _act_offload_bytes(model: ModelSpec, training: TrainingSpec, candidate: Candidate) -> float:
    """Offloaded bytes per token of a micro-batch (0 without --activation-offload), from the
    activation count at the request's own sequence length and micro-batch; the sweep scales it
    by its tokens (exact where the saved tensors grow linearly with the tokens, as with
    flash-style attention)."""
    if not training.activation_offload:
        return 0.0
    from planner.memory.estimator import activation_plan

    plan = activation_plan(model, training, candidate)
    return plan.host_bytes / training.tokens_per_micro_batch


def step_inputs(model: ModelSpec, training: TrainingSpec, cluster: Cluster, candidate: Candidate,
                assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS) -> StepInputs:
    """The StepInputs of one configuration."""
    return step_inputs_at(model, training, candidate, assumptions, seq=training.seq,
                          mb=training.micro_batch, n=cluster.n_gpus, gpn=cluster.gpus_per_node,
                          rates=Rates.of(cluster.gpu, training, assumptions))


def _ring_s(nbytes: float, m: float, calls: float, bw: float, hop: float) -> float:
    """A ring all-gather or reduce-scatter of ``nbytes`` (the full buffer) over ``m`` ranks in
    ``calls`` collectives."""
    return 0.0 if m <= 1 else (m - 1.0) / m * nbytes / bw + calls * (m - 1.0) * hop


def pipeline_step(model: ModelSpec, training: TrainingSpec, cluster: Cluster,
                  candidate: Candidate, assumptions: ThroughputAssumptions) -> StepEstimate:
    """One step under ``--pp`` (docs/throughput.md "Pipeline parallel").

    Compute: each rank's own blocks (and the head on the last stage) for every micro-batch,
    the slowest rank setting the pace, stretched by the schedule's bubble
    (``planner.pipeline.bubble_ratio``). FSDP2 inside a stage (torchtitan: not resharded
    under PP, each stage's gradients reduced once, after its last backward: REDUCE_GRAD): one all-gather of the
    rank's parameters, hidden behind the first micro-batch's forward but for its first unit,
    and one reduce-scatter after the last backward, exposed. Point-to-point: every
    micro-batch crosses each stage boundary forward (activations) and backward (their
    gradients); ``torch.distributed.pipelining`` waits on each batch of sends and receives
    (``_wait_batch_p2p``), so they are counted on the critical path. The pipeline is the
    outer mesh dimension (torchtitan ``ParallelDims``: pp, dp, ...): neighbours are n / pp
    ranks apart, inside a node only when n / pp < GPUs per node.

    With tensor parallel in each stage (torchtitan's FSDP x TP x PP; mesh pp, dp, tp): a TP
    group shares each micro-batch's matmuls (the rank's compute at tp x the rate) and runs the
    sequence-parallel collectives of its blocks (``tp_collectives_s``) on its critical path,
    so they are stretched by the bubble too; FSDP runs over n / (pp x tp) ranks on 1/tp of the
    stage's parameters (spanning nodes when dp x tp exceeds a node); a stage boundary carries
    seq / tp positions per rank (sequence parallel) between ranks n / pp apart; each GPU is
    credited 1 / (pp x tp) of the pipeline's tokens.

    With context parallel beside them (torchtitan's 4D mesh pp, dp_shard, cp, tp): each GPU
    computes seq / cp of each micro-batch (``step_core``'s rate over tp x cp), runs the ring's
    key/value rotation for every block of every micro-batch on its critical path
    (``cp_rotation_s``, *assumed* not hidden, as without the pipeline; stretched by the bubble
    like the TP collectives), sends seq / (cp x tp) positions across each stage boundary, and
    is credited 1 / (pp x tp x cp) of the pipeline's tokens; FSDP runs over n / (pp x tp)
    ranks (dp_shard x cp).

    With expert parallel in each stage (torchtitan's PP x EP, docs/model.md §8.8 "Beside
    pipeline parallel"): each rank's MoE blocks run their token all-to-alls for every
    micro-batch (``ep_all_to_all_s`` over the rank's blocks, on its critical path as without
    the pipeline, stretched by the bubble) and the busiest GPU's surplus expert rows; FSDP
    gathers and reduces a block's E / ep local experts over efsdp = dp / ep ranks, the rest
    over dp."""
    from planner import pipeline
    from planner.params import block_tensors, numel, root_tensors

    p = training.pipeline
    n, gpn = cluster.n_gpus, cluster.gpus_per_node
    tp = candidate.tp
    dp = n // (p.degree * tp)
    x = step_inputs(model, training, cluster, candidate, assumptions)
    solo = dataclasses.replace(x, n=1.0, ga=1.0, comm=collectives(candidate.strategy,
                                                                  GradSync.EVERY))
    # the whole model on one GPU, one micro-batch: the FLOP count (no TP: the rank cores
    # below read only their compute, at tp x the rate)
    whole = step_core(dataclasses.replace(solo, tp=1.0))
    layers = pipeline.stage_layers(model.n_layers, p.n_stages)
    block = sum(numel(s) for _, s in block_tensors(model))
    roots = {nm: numel(s) for nm, s in root_tensors(model)}
    embed = sum(v for k, v in roots.items() if k.startswith(("embed.", "pos_embed.",
                                                               "type_embed.", "embed_norm")))
    busy, slowest, params, blocks_max, tp_s = 0.0, None, 0, 0, 0.0
    cores: dict[tuple[int, bool], tuple[Any, Any]] = {}
    for rank in range(p.degree):
        stages = pipeline.rank_stages(p, rank)
        first, last = 0 in stages, p.n_stages - 1 in stages
        blocks = sum(layers[s] for s in stages)
        params = max(params, blocks * block + (embed if first else 0)
                     + (sum(roots.values()) - embed if last else 0))
        blocks_max = max(blocks_max, blocks)
        if blocks == 0 and not last:
            # the embedding alone (a stage per layer: torchtitan gives the first stage the
            # embedding's weight of one layer): a lookup, no matmul FLOPs, busy ~ 0; its step
            # core would divide by a zero step time
            continue
        if (blocks, last) not in cores:  # ranks alike in blocks and head time alike
            # expert parallel: the busiest GPU's surplus expert rows and the token
            # all-to-alls of the rank's own MoE blocks (every block: PP x EP is modelled
            # with routed experts in each, request.pipeline_from)
            share_l = blocks / model.n_layers
            rank_x = dataclasses.replace(solo, n_layers=float(blocks),
                                         p_head=x.p_head if last else 0.0,
                                         ga=float(p.microbatches),
                                         ep_idle_mm=x.ep_idle_mm * share_l,
                                         ep_layers=x.ep_layers * share_l)
            core = step_core(rank_x)
            sp = tp_collectives_s(x, float(blocks), float(p.microbatches))
            sp = sp + ep_all_to_all_s(rank_x, x.recompute.attention)
            # context parallel: the key/value rotation of the rank's blocks for every
            # micro-batch, on the critical path as without the pipeline (*assumed* not hidden;
            # cp_rotation_s reads no head term)
            sp = sp + cp_rotation_s(rank_x, x.recompute.attention)
            cores[blocks, last] = core, sp
        core, sp = cores[blocks, last]
        if slowest is None or core.compute_s + sp > busy + tp_s:
            busy, slowest, tp_s = core.compute_s, core, sp
    units = blocks_max + 1.0
    stretch = 1.0 + pipeline.bubble_ratio(p)
    compute_s = busy * stretch
    tp_s = tp_s * stretch
    spans = dp * tp > gpn  # the dp group: every tp-th GPU
    bw_dp = min(x.bw_intra, max(1, gpn // tp) * x.bw_inter) if spans else x.bw_intra
    hop_dp = x.lat_inter if spans else x.lat_intra
    t_ag = _ring_s(params / tp * x.gather_b, dp, units, bw_dp, hop_dp)
    t_rs = _ring_s(params / tp * x.grad_b, dp, units, bw_dp, hop_dp)
    if training.ep > 1:
        # a block's routed experts are the stage's E / ep local ones, gathered and reduced
        # over efsdp = dp / ep ranks (their own param group: a collective of their own per
        # block), the rest over dp (expert_parallel.ep_group_elements)
        from planner.expert_parallel import expert_params

        ep, efsdp = training.ep, dp // training.ep
        x_rank = expert_params(model) * blocks_max / model.n_layers
        dense = params - x_rank
        t_ag = (_ring_s(dense * x.gather_b, dp, units, bw_dp, hop_dp)
                + _ring_s(x_rank / ep * x.gather_b, efsdp, blocks_max, bw_dp, hop_dp))
        t_rs = (_ring_s(dense * x.grad_b, dp, units, bw_dp, hop_dp)
                + _ring_s(x_rank / ep * x.grad_b, efsdp, blocks_max, bw_dp, hop_dp))
    one_fwd = slowest.compute_s / p.microbatches / 3.0  # forward ~ 1/3 of forward + backward
    exposed_ag = max(t_ag / units, t_ag - x.overlap * one_fwd)
    inside = dp * tp < gpn  # neighbouring stages are n / pp GPUs apart
    bw_pp = x.bw_intra if inside else x.bw_inter
    hop_pp = x.lat_intra if inside else x.lat_inter
    boundary = x.mb * x.seq / x.cp * model.hidden * x.gather_b / tp
    p2p_s = 2.0 * p.microbatches * p.virtual * (boundary / bw_pp + hop_pp)
    comm_s = t_ag + t_rs + p2p_s + tp_s
    exposed = exposed_ag + t_rs + p2p_s + tp_s
    step_s = compute_s + exposed
    # of the pipeline's micro-batches, per GPU (a CP group shares each sequence)
    share = p.microbatches / (p.degree * tp * x.cp)
    tokens = share * x.mb * x.seq  # per GPU per step
    return StepEstimate(
        step_time_s=step_s, compute_s=compute_s, comm_s=comm_s, exposed_comm_s=exposed,
        offload_s=0.0, tokens_per_s_per_gpu=tokens / step_s,
        mfu=whole.mfu * whole.step_time_s * share / step_s,
        flops_per_step=whole.flops_per_step * share)


def estimate_step(model: ModelSpec, training: TrainingSpec, cluster: Cluster,
                  candidate: Candidate,
                  assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS) -> StepEstimate:
    """Time of one optimizer step of ``candidate`` (see the module docstring for conventions)."""
    if training.pipeline.enabled:
        return pipeline_step(model, training, cluster, candidate, assumptions)
    out = step_core(step_inputs(model, training, cluster, candidate, assumptions))
    return StepEstimate(*(float(getattr(out, f)) for f in StepEstimate.__slots__))
