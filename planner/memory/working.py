"""Working copies and communication buffers: what a strategy allocates beyond model states.

One function per family of strategies, each returning the same ``Working`` record:

- ``autocast_working``: DDP and single-GPU training under torch.autocast (fp32 params, bf16
  casts cached for the autocast region; DDP's gradient buckets).
- ``fsdp_working``: FSDP2 units (one per block plus the root) all-gathered to ``param_dtype``,
  and their reduce-scatter buffers.
- ``zero_working``: DeepSpeed ZeRO-1/2/3 (ZeRO-3's gathered submodules and prefetch bucket,
  the reduce and all-gather buckets, the step's upcast gradient partition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.memory.breakdown import Overheads
from planner.memory.states import FP32, Dtypes
from planner.vec import ceil_div
from planner.params import ParamCounts, numel, tensor_groups
from planner.spec import Candidate, Checkpointing, ModelSpec, NormKind, Offload, Precision, Strategy


@dataclass(frozen=True, slots=True, kw_only=True)
class Working:
    """Bytes of working copies and buffers at each moment (one GPU)."""

    gathered_fwd: Any = 0
    """At the end of forward: cached casts / unsharded units."""
    gathered_loss: Any = 0
    """During the loss's backward."""
    gathered_bwd: Any = 0
    """During the last block's backward (recompute casts included)."""
    gathered_bwd_first: Any = 0
    """During the first block's backward (the last one differentiated)."""
    freed_per_block: Any = 0
    """Working copy freed when a block's backward ends (SHARD_GRAD_OP's unit, an autocast
    cast without checkpointing)."""
    lingering_first: Any = 0
    """FULL_SHARD: the first block's all-gather output still allocated at its post-backward
    (nothing is prefetched after it to replace it; traced)."""
    gathered_end: Any = 0
    """At the end of backward: the root unit (FSDP)."""
    unsharded_block_grads: Any = 0
    """FSDP post-backward: a block's unsharded gradients (param dtype)."""
    rs_unit: Any = 0
    """FSDP: one block's reduce-scatter input (reduce dtype)."""
    rs_root: Any = 0
    """FSDP: the root's reduce-scatter input."""
    root_grad_bwd: Any = 0
    """The output head's weight gradient, alive from the loss's backward on."""
    buckets: Any = 0
    """Gradient buckets alive through the step (DDP, ZeRO-2/3 reduce bucket)."""
    step_extra: Any = 0
    """Extra temporaries of the optimizer step (ZeRO's upcast gradient partition and
    all-gather bucket)."""


def matmul_weight_elems(model: ModelSpec) -> int:
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


def norm_elems(model: ModelSpec) -> int:
    """Norm weights (and biases) in one block: not matmul weights, never autocast."""
    per_norm = model.hidden * (2 if model.norm is NormKind.LAYERNORM else 1)
    return model.norms_per_layer * per_norm


def autocast_working(model: ModelSpec, counts: ParamCounts, candidate: Candidate,
                     precision: Precision, d: Dtypes, ov: Overheads) -> Working:
    """torch.autocast over fp32 params (DDP, one GPU).

    autocast caches the bf16 cast of every matmul weight for the autocast region (forward +
    loss; ``aten/src/ATen/autocast_mode.h`` ``cached_cast``); the graph keeps them for
    backward. Under checkpointing the blocks' casts are not saved (recompute casts again, one
    block at a time), so after the region exits only the head's cast is still held.
    DDP (``torch/csrc/distributed/c10d/reducer.cpp``) allocates flat bucket buffers covering
    every gradient; unless ``gradient_as_bucket_view=True`` they are a second gradient copy.
    """
    c = d.compute
    cache = matmul_weight_elems(model) * c if precision.amp else 0
    block_cast = (counts.per_block - norm_elems(model)) * c
    checkpointed = candidate.checkpointing is not Checkpointing.NONE
    if cache and checkpointed:
        cache_bwd = cache - model.n_layers * block_cast
        recompute = block_cast
        first = cache_bwd + recompute
        freed = 0
    else:
        cache_bwd, recompute = cache, 0
        # without checkpointing each block's casts are freed once its backward ends
        first = cache - (model.n_layers - 1) * block_cast if cache else 0
        freed = block_cast if cache else 0
    P = counts.per_block * model.n_layers + counts.root
    ddp_buckets = 0 if ov.ddp_bucket_view else P * d.grad
    return Working(
        gathered_fwd=cache, gathered_loss=cache_bwd, gathered_bwd=cache_bwd + recompute,
        gathered_bwd_first=first, freed_per_block=freed,
        root_grad_bwd=model.vocab * model.hidden * d.grad,
        buckets=ddp_buckets if candidate.strategy is Strategy.DDP else 0)


def fsdp_working(model: ModelSpec, counts: ParamCounts, candidate: Candidate,
                 precision: Precision, d: Dtypes, degree: Any, version: int = 2) -> Working:
    """FSDP2 (``torch/distributed/fsdp/_fully_shard``): each unit is all-gathered to
    ``param_dtype`` before use; the root is not resharded after forward (``_fsdp_state.py``:
    ``post_forward_mesh_info = None`` for the root); in post-backward the unsharded grads are
    copied into a ``reduce_dtype`` reduce-scatter input whose output is the new sharded
    gradient. A shard group of 1 (NO_SHARD) still copies into the reduce buffer (traced).

    FSDP1 (``FullyShardedDataParallel``) frees its all-gather outputs and reduce-scatter
    buffers with ``record_stream`` (``_runtime_utils.py``): the caching allocator cannot reuse
    a block until the communication stream has caught up, so one more unit's gathered
    parameters and one more reduce-scatter input are held than FSDP2's explicit frees
    (torchtitan docs/fsdp.md: FSDP2 peaks 7 % lower on Llama-7B, 8 x H100)."""
    c, Pb, Pr = d.compute, counts.per_block, counts.root
    unit = Pb * c
    if candidate.strategy in (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD):
        # Resharded after forward, but at the loss one block is already gathered again for
        # backward; in backward the current block + the one prefetched (traced).
        fwd = loss = unit
        bwd = 2 * unit
        freed, lingering = 0, unit
    else:  # SHARD_GRAD_OP, NO_SHARD: kept unsharded from forward until post-backward
        fwd = loss = bwd = model.n_layers * unit
        # the last block's all-gather output lingers until backward (traced)
        fwd = fwd + unit * (degree > 1)
        freed, lingering = unit, 0
    root = Pr * c
    rs_b = FP32 if precision.amp else precision.param_bytes
    delayed = version == 1  # record_stream: one more unit and reduce input held
    return Working(
        gathered_fwd=root + fwd + delayed * unit, gathered_loss=root + loss + delayed * unit,
        gathered_bwd=root + bwd + delayed * unit, gathered_bwd_first=root + unit + delayed * unit,
        freed_per_block=freed, lingering_first=lingering, gathered_end=root,
        unsharded_block_grads=unit, rs_unit=(1 + delayed) * Pb * rs_b, rs_root=Pr * rs_b,
        root_grad_bwd=model.vocab * model.hidden * c)


def zero_working(model: ModelSpec, counts: ParamCounts, candidate: Candidate,
                 precision: Precision, d: Dtypes, opt_shard: Any, ov: Overheads) -> Working:
    """DeepSpeed ZeRO (``deepspeed/runtime/zero``).

    ZeRO-3 gathers each submodule's params just before use and prefetches up to
    ``stage3_prefetch_bucket_size`` elements ahead (``partitioned_param_coordinator.py``): the
    working set is the largest submodule (a linear or the vocabulary table) plus the prefetch
    bucket. Params under ``param_persistence_threshold`` (1e5: norms) stay gathered; they are
    negligible. ZeRO-2/3 reduce through a ``reduce_bucket_size`` bucket; ZeRO-1/2 all-gather
    the updated params through an ``allgather_bucket_size`` bucket after the step; under mixed
    precision the step upcasts the bf16 gradient partition to fp32.
    """
    s = candidate.strategy
    P = counts.per_block * model.n_layers + counts.root
    gathered = 0
    if s is Strategy.ZERO3:
        gathered = (counts.largest_tensor + ov.zero3_prefetch_bucket_elems) * d.compute
    step_extra = 0
    if precision.amp and candidate.offload is Offload.NONE:
        step_extra = ceil_div(P, opt_shard) * FP32
    if s is not Strategy.ZERO3:
        step_extra = step_extra + min(ov.zero_allgather_bucket_elems, P) * d.param
    return Working(
        gathered_fwd=gathered, gathered_loss=gathered, gathered_bwd=gathered,
        gathered_bwd_first=gathered,
        root_grad_bwd=model.vocab * model.hidden * d.grad if s is Strategy.ZERO1 else 0,
        buckets=min(ov.zero_reduce_bucket_elems, P) * d.grad
        if s in (Strategy.ZERO2, Strategy.ZERO3) else 0,
        step_extra=step_extra)

