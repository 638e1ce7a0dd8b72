"""Per-GPU memory of one training step for one candidate (strategy x offload x checkpointing).

The step is walked through five moments, and the peak is the largest of them:

  forward   at the loss, end of forward: every saved activation, the logits being reduced
  loss_bwd  the loss's backward: the fp32 vocabulary gradients on top of all activations
  block_bwd the last block's backward: its gradient temporaries, recompute (checkpointing),
            FSDP's unsharded grads and reduce-scatter buffers, the lm_head's gradient
  bwd_end   the end of backward: every gradient, the embedding's gradient reduction
  optimizer the optimizer step: states, gradients and the step's temporaries

Each moment is a ``Breakdown`` of named integer byte terms whose sum is the PyTorch
allocator's allocated bytes. Reserved and device-used add the terms outside it. Every term's
formula and source is in docs/model.md; the sources that set the sharding are:

- DDP: ``torch/nn/parallel/distributed.py`` + ``torch/csrc/distributed/c10d/reducer.cpp``: the
  reducer allocates flat bucket buffers covering every gradient; unless
  ``gradient_as_bucket_view=True`` the ``.grad`` tensors are separate, a second gradient copy.
- FSDP2 (``torch/distributed/fsdp/_fully_shard``): params, grads and optimizer state sharded
  over the shard group; each unit (here: every block, plus the root holding embeddings, final
  norm and head) is all-gathered to ``param_dtype`` before use; the root is not resharded
  after forward (``_fsdp_state.py``: ``post_forward_mesh_info = None`` for the root); gradients
  are copied into a ``reduce_dtype`` reduce-scatter buffer in post-backward.
- ZeRO (Rajbhandari et al. 2020, "ZeRO", sec. 5: 2Ψ + 2Ψ + KΨ with K = 12 for mixed-precision
  Adam): stage 1 shards K, stage 2 also the fp16/bf16 gradients, stage 3 also the parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from planner.activations import ActivationPlan, plan_activations
from planner.params import ParamCounts, count, numel, tensor_groups
from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    ModelSpec,
    NormKind,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    Strategy,
    TrainingSpec,
)

MiB = 2**20
GiB = 2**30
FP32 = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Runtime terms no parameter count predicts. Defaults and sources in docs/model.md."""

    cublas_workspace_bytes: int = 32 * MiB
    """cuBLAS + cuBLASLt workspaces through the caching allocator (CublasHandlePool.cpp:
    4096 KiB x 8 on Hopper and newer; set per profile family)."""
    nccl_bytes_per_communicator: int = 512 * MiB
    """NCCL's device buffers per communicator (channels x peers x protocol buffers)."""
    allocator_fragmentation: float = 0.08
    """Caching allocator: peak reserved / peak allocated - 1."""
    host_bytes_per_process: int = 4 * GiB
    """Host RAM of one training process (Python, torch, CUDA libraries) before offload."""
    ddp_bucket_view: bool = False
    """DDP(gradient_as_bucket_view=...); PyTorch's default is False."""
    zero_reduce_bucket_elems: int = 500_000_000
    """DeepSpeed reduce_bucket_size default (zero/config.py)."""
    zero_allgather_bucket_elems: int = 500_000_000
    """DeepSpeed allgather_bucket_size default (stages 1 and 2)."""
    zero3_prefetch_bucket_elems: int = 50_000_000
    """DeepSpeed stage3_prefetch_bucket_size default."""
    activation_scale: float = 1.0
    """Calibrated correction of the activation terms per architecture family (1.0: the
    tensor-by-tensor count as is; planner/calibration.py sets it from GPU measurements)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Allocated bytes on one GPU at one moment, by what holds them."""

    params: int = 0
    """Resident parameter storage (sharded or not): fp32 master under torch AMP."""
    gradients: int = 0
    optimizer_states: int = 0
    """Optimizer state, plus the fp32 master copy under ZeRO mixed precision."""
    gathered_params: int = 0
    """Working copies: FSDP/ZeRO-3 unsharded units, or autocast's cached bf16 weights."""
    activations: int = 0
    """Tensors saved for backward."""
    transients: int = 0
    """Loss and backward temporaries, checkpoint recompute."""
    comm_buffers: int = 0
    """DDP gradient buckets, FSDP reduce-scatter / all-gather buffers, ZeRO buckets."""
    optimizer_temporaries: int = 0
    cublas_workspace: int = 0

    @property
    def total(self) -> int:
        return (self.params + self.gradients + self.optimizer_states + self.gathered_params
                + self.activations + self.transients + self.comm_buffers
                + self.optimizer_temporaries + self.cublas_workspace)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    candidate: Candidate
    shard_degree: int
    peak_phase: str
    breakdown: Breakdown
    """At the peak: breakdown.total == peak_allocated_bytes."""
    phases: dict[str, int]
    """Allocated bytes at each moment of the step."""
    phase_breakdowns: dict[str, Breakdown] = field(default_factory=dict)
    """The same moments term by term (what the trace comparison reads)."""
    allocator_overhead_bytes: int
    cuda_context_bytes: int
    nccl_bytes: int
    capacity_bytes: int
    usable_bytes: int
    """capacity x (1 - margin)."""
    host_bytes_per_node: int
    host_capacity_bytes: int
    notes: tuple[str, ...] = field(default=())

    @property
    def peak_allocated_bytes(self) -> int:
        return self.breakdown.total

    @property
    def peak_reserved_bytes(self) -> int:
        return self.peak_allocated_bytes + self.allocator_overhead_bytes

    @property
    def device_used_bytes(self) -> int:
        return self.peak_reserved_bytes + self.cuda_context_bytes + self.nccl_bytes

    @property
    def headroom_bytes(self) -> int:
        return self.usable_bytes - self.device_used_bytes

    @property
    def fits_gpu(self) -> bool:
        return self.device_used_bytes <= self.usable_bytes

    @property
    def fits_host(self) -> bool:
        return self.host_bytes_per_node <= self.host_capacity_bytes

    @property
    def fits(self) -> bool:
        return self.fits_gpu and self.fits_host


class UnsupportedCandidate(ValueError):
    """The combination does not exist in PyTorch/DeepSpeed (e.g. DDP with CPU offload)."""


def shard_degree(strategy: Strategy, cluster: Cluster) -> int:
    if strategy in (Strategy.DDP, Strategy.NO_SHARD):
        return 1
    if strategy is Strategy.HYBRID_SHARD:
        return cluster.gpus_on_busiest_node
    return cluster.n_gpus


def check_supported(candidate: Candidate) -> None:
    s, o = candidate.strategy, candidate.offload
    if o is Offload.OPTIMIZER and not s.is_zero:
        raise UnsupportedCandidate(
            f"offload 'optimizer' is ZeRO-Offload (zero1/zero2/zero3), not available with {s}"
        )
    if o is Offload.PARAMS_AND_OPTIMIZER and s not in (
        Strategy.FULL_SHARD, Strategy.HYBRID_SHARD, Strategy.SHARD_GRAD_OP, Strategy.ZERO3
    ):
        raise UnsupportedCandidate(
            f"offload 'params_and_optimizer' needs sharded parameters "
            f"(full_shard, hybrid_shard, shard_grad_op, zero3), not {s}"
        )
    if candidate.checkpointing is Checkpointing.AUTO:
        raise UnsupportedCandidate("checkpointing 'auto' must be expanded before estimation")


def _div(x: int, s: int) -> int:
    """Per-rank share of x elements sharded s ways (ceil: FSDP pads dim 0)."""
    return -(-x // s)


def optimizer_state_bytes(model: ModelSpec, optimizer: OptimizerKind, state_bytes: int,
                          shard: int) -> int:
    """Optimizer state held for 1/shard of every parameter tensor (dim-0 shards)."""
    if optimizer in (OptimizerKind.ADAM, OptimizerKind.ADAMW):
        per_elem = 2  # exp_avg, exp_avg_sq (torch/optim/adam.py, zeros_like(param))
    elif optimizer in (OptimizerKind.SGD_MOMENTUM, OptimizerKind.LION):
        per_elem = 1  # momentum_buffer / exp_avg
    elif optimizer is OptimizerKind.SGD:
        return 0
    elif optimizer is OptimizerKind.ADAMW_8BIT:
        # bitsandbytes 8-bit blockwise: two uint8 states + one fp32 absmax per 2048 values
        # per state (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
        elems = sum(k * _div(numel(s), shard) for _, s, k in tensor_groups(model))
        return 2 * elems + 2 * FP32 * -(-elems // 2048)
    else:  # ADAFACTOR: torch.optim.Adafactor factors the second moment of >=2-D params
        total = 0
        for _, shape, k in tensor_groups(model):
            if len(shape) >= 2:  # row and column statistics of the local (dim-0) shard
                rows = _div(shape[0], shard) * numel(shape[1:-1])
                total += k * (rows + shape[-1])
            else:
                total += k * _div(shape[0], shard)
        return total * state_bytes
    elems = sum(k * _div(numel(s), shard) for _, s, k in tensor_groups(model))
    return per_elem * elems * state_bytes


def optimizer_temp_bytes(counts: ParamCounts, local_elems: int, training: TrainingSpec,
                         state_bytes: int, zero: bool, shard: int = 1) -> int:
    """Transient device memory of optimizer.step()."""
    opt, impl = training.optimizer, training.optimizer_impl
    if zero or opt in (OptimizerKind.SGD, OptimizerKind.SGD_MOMENTUM, OptimizerKind.ADAMW_8BIT):
        # DeepSpeed steps with its fused multi-tensor Adam; SGD's foreach path is in place
        # (weight_decay=0); bitsandbytes runs one fused kernel per tensor.
        return 0
    if impl is OptimizerImpl.FUSED:
        return 0  # torch._fused_adamw_: one kernel, no intermediates
    if impl is OptimizerImpl.FOREACH and opt in (OptimizerKind.ADAM, OptimizerKind.ADAMW):
        # _multi_tensor_adam: exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs) allocates one
        # state-sized copy of every parameter in the group (torch/optim/adam.py).
        return local_elems * state_bytes
    # Single-tensor loops (and Lion / Adafactor updates): sqrt(v) then its quotient, two
    # temporaries the size of the largest tensor (torch/optim/adam.py _single_tensor_adam).
    return 2 * _div(counts.largest_tensor, shard) * state_bytes


def _matmul_weight_elems(model: ModelSpec) -> int:
    """Parameters that go through F.linear / matmul / bmm, hence autocast's cached casts.

    Norm weights and embedding lookups are not autocast ops; a tied head's F.linear casts
    the embedding table.
    """
    total = 0
    for name, shape, k in tensor_groups(model):
        module = name.rsplit(".", 1)[0].rsplit(".", 1)[-1]
        if "norm" in module or module in ("embed", "pos_embed", "type_embed"):
            continue
        total += k * numel(shape)
    if model.tied_embeddings:
        total += model.vocab * model.hidden
    return total


def _norm_elems(model: ModelSpec) -> int:
    """Norm weights (and biases) in one block: not matmul weights, never autocast."""
    per_norm = model.hidden * (2 if model.norm is NormKind.LAYERNORM else 1)
    return model.norms_per_layer * per_norm


def estimate(model: ModelSpec, training: TrainingSpec, cluster: Cluster, candidate: Candidate,
             *, margin: float = 0.05, overheads: Overheads | None = None) -> Estimate:
    ov = overheads or Overheads()
    check_supported(candidate)
    strat = candidate.strategy
    prec = training.precision
    n = cluster.n_gpus
    single = n == 1
    S = shard_degree(strat, cluster)
    counts = count(model)
    P = counts.per_block * model.n_layers + counts.root
    Pb, Pr = counts.per_block, counts.root
    c = prec.compute_bytes
    pb = prec.param_bytes
    notes: list[str] = []

    zero = strat.is_zero
    fsdp = strat.is_fsdp
    uses_autocast = uses_autocast_amp(strat)
    acts = plan_activations(model, batch=training.micro_batch, seq=training.seq,
                            precision=prec, attention=training.attention,
                            checkpointing=candidate.checkpointing, uses_autocast=uses_autocast)
    if ov.activation_scale != 1.0:
        acts = acts.scaled(ov.activation_scale)
    offload = candidate.offload

    # ---- resident states -------------------------------------------------------------
    if zero:
        # DeepSpeed: module in compute dtype, grads in compute dtype, fp32 master + states.
        param_b, grad_b = c, c
        master_b = FP32 if prec.amp else 0
        state_b = FP32 if prec.amp else pb
        p_shard = S if strat is Strategy.ZERO3 else 1
        g_shard = S if strat in (Strategy.ZERO2, Strategy.ZERO3) else 1
        o_shard = S
    else:
        param_b, grad_b, master_b, state_b = pb, pb, 0, pb
        p_shard = g_shard = o_shard = S
    local_p = _div(P, p_shard)
    params_res = local_p * param_b
    grads_full = _div(P, g_shard) * grad_b
    opt_states = optimizer_state_bytes(model, training.optimizer, state_b, o_shard) \
        + _div(P, o_shard) * master_b
    opt_temp = optimizer_temp_bytes(counts, _div(P, o_shard), training, state_b, zero, o_shard)

    host_per_rank = 0
    if offload is Offload.OPTIMIZER:
        # ZeRO-Offload (Ren et al. 2021): fp32 master, states and fp32 grad partition on the
        # host; the step runs on the CPU.
        host_per_rank = opt_states + _div(P, o_shard) * FP32
        opt_states, opt_temp = 0, 0
    elif offload is Offload.PARAMS_AND_OPTIMIZER:
        # FSDP2 CPUOffloadPolicy / ZeRO-3 offload_param: sharded params, grads and optimizer
        # state in pinned host memory; only unsharded working copies live on the GPU.
        host_per_rank = params_res + grads_full + opt_states
        params_res, grads_full, opt_states, opt_temp = 0, 0, 0, 0

    # ---- working copies and communication buffers -------------------------------------
    # The head's weight gradient exists from the loss's backward on (tied or not: a tied
    # table gets its first gradient from the head, the embedding's is accumulated into it).
    lm_head_elems = model.vocab * model.hidden
    buckets = 0
    zero_step_extra = 0
    if uses_autocast:
        # autocast caches the bf16 cast of every matmul weight for the autocast region
        # (forward + loss); the graph keeps them for backward. Under checkpointing the
        # blocks' casts are not saved (recompute casts again, one block at a time), so after
        # the region exits only the head's cast (outside the blocks) is still held.
        cache = _matmul_weight_elems(model) * c if prec.amp else 0
        if cache and candidate.checkpointing is not Checkpointing.NONE:
            block_cast = (counts.per_block - _norm_elems(model)) * c
            cache_bwd = cache - model.n_layers * block_cast
            cache_recompute = block_cast
        else:
            cache_bwd, cache_recompute = cache, 0
        if strat is Strategy.DDP and not single and not ov.ddp_bucket_view:
            buckets = P * grad_b
        elif strat is Strategy.DDP and not single:
            notes.append("gradient_as_bucket_view=True: grads are views into the buckets")
        root_w = blocks_fwd = blocks_loss = blocks_bwd = 0
        rs_unit = 0
        rs_root = 0
        root_grad_bwd = lm_head_elems * grad_b
    elif fsdp:
        cache = cache_bwd = cache_recompute = 0
        root_w = Pr * c
        if strat is Strategy.FULL_SHARD or strat is Strategy.HYBRID_SHARD:
            # Resharded after forward, but at the loss one block is already gathered again
            # for backward; in backward the current block + the one prefetched (traced).
            blocks_fwd = blocks_loss = Pb * c
            blocks_bwd = 2 * Pb * c
        else:  # SHARD_GRAD_OP, NO_SHARD: kept unsharded from forward until post-backward
            blocks_fwd = blocks_loss = blocks_bwd = model.n_layers * Pb * c
            if S > 1:  # the last block's all-gather output lingers until backward (traced)
                blocks_fwd += Pb * c
        # post-backward: the unsharded grads (the unsharded params' dtype) are copied into
        # the reduce-scatter input, in reduce_dtype: fp32 under the mixed-precision policy
        # (reduce_dtype=float32), else the params' own dtype. Its output is the new sharded
        # gradient (counted as gradients). A shard group of 1 (NO_SHARD) still copies into
        # the reduce buffer (traced).
        rs_b = FP32 if prec.amp else pb
        rs_unit = Pb * rs_b
        rs_root = Pr * rs_b
        root_grad_bwd = lm_head_elems * c
        if offload is Offload.PARAMS_AND_OPTIMIZER:
            notes.append("CPU offload: sharded params/grads/optimizer state in pinned host RAM")
    else:  # ZeRO
        cache = cache_bwd = cache_recompute = 0
        if strat is Strategy.ZERO3:
            # DeepSpeed gathers each submodule's params just before use and prefetches up to
            # stage3_prefetch_bucket_size elements ahead (zero/partitioned_param_coordinator.py):
            # the working set is the largest submodule (a linear or the vocabulary table) plus
            # the prefetch bucket. Params under param_persistence_threshold (1e5: norms) stay
            # gathered; they are negligible.
            root_w = 0
            working = (counts.largest_tensor + ov.zero3_prefetch_bucket_elems) * c
            blocks_fwd = blocks_loss = blocks_bwd = working
        else:
            root_w = blocks_fwd = blocks_loss = blocks_bwd = 0
        rs_unit = rs_root = 0
        root_grad_bwd = lm_head_elems * grad_b if strat is Strategy.ZERO1 else 0
        if strat in (Strategy.ZERO2, Strategy.ZERO3):
            buckets = min(ov.zero_reduce_bucket_elems, P) * grad_b
        if prec.amp and offload is Offload.NONE:
            zero_step_extra = _div(P, o_shard) * FP32  # bf16 grad partition upcast for the step
        if strat is not Strategy.ZERO3:
            zero_step_extra += min(ov.zero_allgather_bucket_elems, P) * param_b

    cublas = ov.cublas_workspace_bytes
    if single:
        buckets = 0

    # ---- the five moments ----------------------------------------------------------------
    act_all = acts.saved_total
    act_blocks = acts.block_kept * model.n_layers
    root_acts = acts.root_bytes
    grads_bwd_end = grads_full if offload is not Offload.PARAMS_AND_OPTIMIZER else 0
    if offload is Offload.OPTIMIZER:
        # ZeRO-Offload moves each reduced gradient partition to the host as it is produced.
        grads_bwd_end = 0 if strat is not Strategy.ZERO1 else grads_full
    base = dict(params=params_res, optimizer_states=opt_states, cublas_workspace=cublas)
    # With gradient accumulation the second and later micro-batches run forward and backward
    # on top of the gradients accumulated so far (every GPU's own copy, or its shard).
    accum = grads_bwd_end if training.grad_accum > 1 else 0
    phases: dict[str, Breakdown] = {}
    phases["forward"] = Breakdown(
        **base, gathered_params=cache + root_w + blocks_fwd, activations=act_all,
        gradients=accum, transients=acts.loss_forward_transient, comm_buffers=buckets)
    phases["loss_bwd"] = Breakdown(
        **base, gathered_params=cache_bwd + root_w + blocks_loss, activations=act_all,
        gradients=accum, transients=acts.loss_backward_transient, comm_buffers=buckets)
    # Last block's backward: the loss's tensors are gone (log_softmax output freed), the
    # lm_head gradient exists, one block is being differentiated (and recomputed). Full-size
    # accumulated grads already hold the lm_head's; FSDP's unsharded root grad is separate.
    if fsdp or g_shard > 1:
        grads_so_far = accum + root_grad_bwd
    else:
        grads_so_far = max(accum, root_grad_bwd)
    last = Breakdown(
        **base, gathered_params=cache_bwd + cache_recompute + root_w + blocks_bwd,
        activations=act_blocks + root_acts - acts.root_saved[-1].nbytes,
        gradients=grads_so_far,
        transients=acts.block_backward_transient + acts.recompute,
        comm_buffers=buckets)
    # The block before it: one block's activations are gone, its gradient exists (sharded
    # under FSDP, whose reduce-scatter input stays alive until the next reduce-scatter), and
    # its gathered copy is freed (SHARD_GRAD_OP / autocast cache). The peak is the larger.
    block_grad = 0 if accum else _div(Pb, g_shard) * grad_b
    if offload is not Offload.NONE:
        block_grad = 0
    prev = dataclasses.replace(
        last,
        activations=last.activations - acts.block_kept,
        gradients=last.gradients + block_grad,
        gathered_params=last.gathered_params - (Pb * c if ((cache_bwd and not cache_recompute)
                                                            or blocks_bwd > 2 * Pb * c) else 0),
        comm_buffers=last.comm_buffers + rs_unit)
    # The first block (the last one differentiated): every other block's gradient exists
    # and its activations are gone. The peak is here when a block's gradient (shard)
    # outweighs what it kept, e.g. full checkpointing on few ranks (traced: Llama-2-7B, 8
    # ranks, seq 8192). Only this block and the root are still gathered.
    if cache and not cache_recompute:
        first_cache = cache - (model.n_layers - 1) * (counts.per_block - _norm_elems(model)) * c
    else:
        first_cache = cache_bwd + cache_recompute
    first = dataclasses.replace(
        last,
        activations=root_acts - acts.root_saved[-1].nbytes + acts.block_kept,
        gradients=last.gradients + (model.n_layers - 1) * block_grad,
        gathered_params=first_cache + root_w + (Pb * c if fsdp else blocks_bwd),
        comm_buffers=last.comm_buffers + rs_unit)
    subs = [last, prev, first] if model.n_layers > 1 else [last]
    if fsdp:
        # A block's post-backward: its unsharded gradients (param dtype) are alive while its
        # reduce-scatter input is allocated and filled; its activations are gone. For large
        # blocks (a 70B block is 1.6 GiB of bf16 gradients + 3.2 GiB of fp32 reduce input)
        # this beats the moments inside the block's compute (traced).
        # At the first block's post-backward its all-gather output is still allocated too
        # (FULL_SHARD / HYBRID_SHARD: nothing is prefetched after it to replace it; traced).
        unsharded_grads = Pb * c
        lingering = Pb * c if blocks_bwd == 2 * Pb * c else 0
        subs += [dataclasses.replace(b, activations=b.activations - acts.block_kept,
                                     transients=0, gradients=b.gradients + unsharded_grads,
                                     gathered_params=b.gathered_params + extra,
                                     comm_buffers=buckets + rs_unit)
                 for b, extra in ((last, 0), (first, lingering))]
    phases["block_bwd"] = max(subs, key=lambda b: b.total)
    # End of backward. The embeddings' backward (their input gradient arriving) and, under
    # FSDP, the root's reduce-scatter after it: the root's unsharded gradients (lm_head's and
    # the embedding's) are alive through both; during the embeddings' backward the last block's
    # reduce-scatter input still is, at the root's reduce-scatter its own input replaces it.
    grad_in = acts.residual_bytes * training.tokens_per_micro_batch * model.hidden
    if model.tied_embeddings:
        # the embedding's backward makes a new table-sized gradient, then accumulates it into
        # the head's out of place (torch/csrc/autograd/functions/accumulate_grad.h): the new
        # gradient and the sum are alive together with the head's (traced)
        grad_in += 2 * model.vocab * model.hidden * (c if fsdp else grad_b)
    if fsdp:
        block_grads = 0 if offload is Offload.PARAMS_AND_OPTIMIZER else \
            model.n_layers * _div(Pb, S) * grad_b
        root_grads = _div(Pr, S) * grad_b if accum else 0  # the root's accumulated shard
        emb = Breakdown(**base, gathered_params=root_w,
                        gradients=block_grads + root_grads + Pr * c, transients=grad_in,
                        comm_buffers=rs_unit)
        # FSDP2's post-backward reshards the unit before reducing its gradients
        # (_fsdp_param_group.py post_backward): the root's gathered params are gone by then.
        root_rs = dataclasses.replace(emb, transients=0, comm_buffers=rs_root,
                                      gathered_params=0)
        phases["bwd_end"] = max(emb, root_rs, key=lambda b: b.total)
    else:
        phases["bwd_end"] = Breakdown(**base, gathered_params=root_w, gradients=grads_bwd_end,
                                      transients=grad_in, comm_buffers=buckets)
    phases["optimizer"] = Breakdown(
        **base, gradients=grads_bwd_end, comm_buffers=buckets,
        optimizer_temporaries=opt_temp + zero_step_extra)

    peak_phase = max(phases, key=lambda k: phases[k].total)
    peak = phases[peak_phase]
    allocated = peak.total
    # Reserved over allocated (the caching allocator, c10/cuda/CUDACachingAllocator.cpp):
    # (1) a fraction lost to block rounding and splitting; (2) when the peak comes before the
    # step, the segments the previous step's gradients and optimizer temporaries were freed
    # from stay cached. The allocator splits a cached block to serve a smaller request but
    # never merges blocks across segments, so they are reused only if the activations' blocks
    # are not larger than them; otherwise the activations take new segments on top.
    # FSDP2's sharded grads are views of one reduce-scatter output per unit; elsewhere each
    # parameter has its own gradient (a block's largest tensor is the typical block).
    freed_block = (_div(Pb, S) if fsdp else counts.largest_block_tensor) * grad_b
    act_block = c * training.micro_batch * training.seq * max(model.ffn_hidden, model.hidden)
    step_leftover = 0
    if peak_phase not in ("optimizer", "bwd_end") and act_block > freed_block:
        step_leftover = grads_bwd_end + opt_temp + zero_step_extra
    frag = int(allocated * ov.allocator_fragmentation) + step_leftover
    n_comms = 0 if single else (2 if strat is Strategy.HYBRID_SHARD and S < n else 1)
    nccl = n_comms * ov.nccl_bytes_per_communicator
    capacity = cluster.gpu.memory_bytes
    ranks_on_node = cluster.gpus_on_busiest_node
    host_node = ranks_on_node * (host_per_rank + ov.host_bytes_per_process)
    return Estimate(
        candidate=candidate,
        shard_degree=S,
        peak_phase=peak_phase,
        breakdown=peak,
        phases={k: v.total for k, v in phases.items()},
        phase_breakdowns=phases,
        allocator_overhead_bytes=frag,
        cuda_context_bytes=cluster.gpu.cuda_context_bytes,
        nccl_bytes=nccl,
        capacity_bytes=capacity,
        usable_bytes=int(capacity * (1.0 - margin)),
        host_bytes_per_node=host_node,
        host_capacity_bytes=cluster.host_ram_bytes_per_node,
        notes=tuple(notes),
    )


def uses_autocast_amp(strategy: Strategy) -> bool:
    """DDP and single-GPU scripts run -amp precisions as torch.autocast over fp32 params; FSDP
    (MixedPrecisionPolicy) and DeepSpeed (a bf16 module) compute in the low dtype itself."""
    return not strategy.is_fsdp and not strategy.is_zero


def activation_plan(model: ModelSpec, training: TrainingSpec,
                    candidate: Candidate) -> ActivationPlan:
    """The activation count estimate() uses for this candidate (for reports and tests)."""
    return plan_activations(model, batch=training.micro_batch, seq=training.seq,
                            precision=training.precision, attention=training.attention,
                            checkpointing=candidate.checkpointing,
                            uses_autocast=uses_autocast_amp(candidate.strategy))


__all__ = ["Breakdown", "Estimate", "Overheads", "UnsupportedCandidate", "estimate",
           "shard_degree", "optimizer_state_bytes"]
