"""Working copies and communication buffers: what a strategy allocates beyond model states.

One function per family of strategies, each returning the same ``Working`` record:

- ``autocast_working``: DDP and single-GPU training under torch.autocast (fp32 params, bf16
  casts cached for the autocast region; DDP's gradient buckets).
- ``fsdp_working``: FSDP2 units (one per block plus the root) all-gathered to ``param_dtype``,
  and their reduce-scatter buffers.
- ``zero_working``: DeepSpeed ZeRO-1/2/3 (ZeRO-3's gathered modules and prefetch, the reduce
  buckets and the copies being reduced, the step's gradient copies and overflow check;
  planner/memory/zero.py).
"""

from __future__ import annotations

from typing import Any

from planner.lazy_dataclass import dataclass
from planner.memory.breakdown import Overheads
from planner.memory.states import FP32, Dtypes, train_dtypes
from planner.memory.zero import (
    keeps_every_grad,
    master_bytes,
    ordered_sizes,
    zero_buffers,
    zero_step_temps,
)
from planner import vec
from planner.vec import ceil_div
from planner.params import ParamCounts, block_tensors, numel, tensor_groups, trainable
from planner.spec import (
    Candidate,
    Checkpointing,
    FineTune,
    ModelSpec,
    NormKind,
    Precision,
    Quantize,
    Strategy,
    TrainingSpec,
)


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
    """FSDP1 FULL_SHARD: the first block's all-gather output still allocated at its
    post-backward (nothing is prefetched after it to replace it)."""
    gathered_in_block: Any = 0
    """Inside the last block's forward: its unit unsharded (FSDP2) and its all-gather output
    kept until the next copy-out; without FSDP2, as ``gathered_fwd``."""
    fwd_prefetched: Any = 0
    """FSDP2 under EP: the next block's all-gather output, alive in every block's forward
    but the last's (torchtitan's explicit forward prefetch); 0 otherwise."""
    fwd_gather: Any = 0
    """FSDP2: gathered at the last block's forward all-gather (0: no such moment). The
    previous unit's all-gather output is kept until this copy-out has run
    (``_fsdp_param_group.py``: ``comm_ctx.all_gather_state``), so two all-gather outputs
    and the unit's unsharded parameters being filled are alive at once (traced; measured on
    an H200)."""
    post_freed: Any = 0
    """FSDP2: the block's unsharded parameters, freed at its post-backward before its
    gradients are reduced (``post_backward``: ``reshard()`` before ``foreach_reduce``)."""
    grad_layout_copy: Any = 0
    """A stacked expert weight's gradient copied into the parameter's layout (the reference
    MoE's ``bmm(x, w.transpose(1, 2))`` gives it transposed; ``AccumulateGrad`` clones a
    gradient whose strides differ from the parameter's, ``accumulate_grad.h``
    ``obeys_layout_contract``): one expert stack's gradient twice for a moment."""
    gathered_end: Any = 0
    """At the end of backward: the root unit (FSDP)."""
    unsharded_block_grads: Any = 0
    """FSDP: a block's unsharded gradients (param dtype), alive late in its backward and at
    its post-backward. FSDP2's are the parameters' real size (the unsharded parameter is a
    view of the padded all-gather output narrowed to its shape, ``init_unsharded_param``)."""
    rs_unit: Any = 0
    """FSDP: one block's reduce-scatter input (reduce dtype)."""
    rs_root: Any = 0
    """FSDP: the root's reduce-scatter input."""
    rs_first: Any = None
    """FSDP: the first block's reduce-scatter input, alive through the embeddings' backward
    (``rs_unit`` unless the first block differs: an MoE model's dense first block)."""
    first_less: Any = (0, 0)
    """FSDP2 full training of an MoE model with dense first blocks: the bytes one such
    block's unit (its all-gather output, its unsharded parameters) and its unsharded
    gradients are smaller than a typical (MoE) block's, (unit, gradients); (0, 0)
    otherwise."""
    root_grad_bwd: Any = 0
    """The output head's weight gradient, alive from the loss's backward on."""
    buckets: Any = 0
    """Gradient buckets alive through the step (DDP, ZeRO-2/3 reduce bucket)."""
    step_extra: Any = 0
    """Extra temporaries of the optimizer step (ZeRO's flat and fp32 copies of the gradient
    partition)."""
    bwd_buffers: Any = 0
    """Buffers alive during backward only (ZeRO's reduce buckets and the copies reduced)."""
    step_grads_freed: Any = 0
    """Gradients freed before the step's temporaries (ZeRO-1's outside its partition)."""
    init_extra: Any = 0
    """Transient while the weights are placed (ZeRO-1/2's flattening copy, ZeRO-3's module
    under zero.Init)."""


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
    per_norm = model.hidden * {NormKind.LAYERNORM: 2, NormKind.RMSNORM: 1}.get(model.norm, 0)
    return model.norms_per_layer * per_norm


def head_trains(model: ModelSpec, ft: FineTune) -> bool:
    """The output head has a gradient: not under LoRA, not when it is the frozen embedding."""
    return not ft.head_frozen(model.tied_embeddings)


def dequantized_linear(model: ModelSpec, ft: FineTune, c: int) -> int:
    """A quantized base's largest linear dequantized to the compute dtype: bitsandbytes'
    ``MatMul4Bit`` / ``MatMul8bitLt`` dequantize the weight in forward and again in backward
    for the input gradient (only the quantized state is saved), one linear at a time."""
    if ft.quantize_base is Quantize.NONE:
        return 0
    return trainable(model, ft).largest_linear * c


def autocast_working(model: ModelSpec, counts: ParamCounts, candidate: Candidate,
                     precision: Precision, d: Dtypes, ov: Overheads,
                     ft: FineTune = FineTune(), float8_weights: int = 0,
                     offloaded_acts: bool = False) -> Working:
    """torch.autocast over fp32 params (DDP, one GPU).

    autocast caches the bf16 cast of every matmul weight for the autocast region (forward +
    loss; ``aten/src/ATen/autocast_mode.h`` ``cached_cast``); the graph keeps them for
    backward. Under checkpointing the blocks' casts are not saved (recompute casts again, one
    block at a time), so after the region exits only the head's cast is still held.
    DDP (``torch/csrc/distributed/c10d/reducer.cpp``) allocates flat bucket buffers covering
    every gradient; unless ``gradient_as_bucket_view=True`` they are a second gradient copy.
    Under LoRA the frozen base is already in the low precision (no cast) and the adapters'
    casts are negligible; only trainable parameters have gradients and buckets.
    ``float8_weights``: a block's weights in torchao ``Float8Linear`` modules, which never call
    an autocast op on their weight (``matmul_with_hp_or_float8_args`` casts the fp32 weight
    straight to float8 and saves the parameter itself): no cached copy (derived from the
    source; the CPU autocast emulation of the trace does not reach them).
    ``offloaded_acts`` (activation offloading without checkpointing): the blocks' matmuls
    hand their cached casts to the offload hooks, which copy them to the host and keep no
    reference (``OffloadActivations.pack_tensor``), so once the region exits only the head's
    cast (saved under ``NoOpManager``) is still held; each block's casts come back with its
    other saved tensors in backward (ActivationPlan.offload_back), not here.
    """
    c = d.compute
    T = trainable(model, ft)
    cache = (matmul_weight_elems(model) - model.n_layers * float8_weights) * c \
        if precision.amp and not ft.lora else 0
    block_cast = (counts.per_block - norm_elems(model) - float8_weights) * c
    checkpointed = candidate.checkpointing is not Checkpointing.NONE
    if cache and checkpointed:
        cache_bwd = cache - model.n_layers * block_cast
        recompute = block_cast
        first = cache_bwd + recompute
        freed = 0
    elif cache and offloaded_acts:
        cache_bwd, recompute, freed = cache - model.n_layers * block_cast, 0, 0
        first = cache_bwd
    else:
        cache_bwd, recompute = cache, 0
        # without checkpointing each block's casts are freed once its backward ends
        first = cache - (model.n_layers - 1) * block_cast if cache else 0
        freed = block_cast if cache else 0
    td = train_dtypes(ft, d, False, precision.amp)
    ddp_buckets = 0 if ov.ddp_bucket_view else T.train * td.grad
    dq = dequantized_linear(model, ft, c)
    return Working(
        gathered_fwd=cache, gathered_loss=cache_bwd, gathered_bwd=cache_bwd + recompute + dq,
        gathered_bwd_first=first + dq, freed_per_block=freed,
        root_grad_bwd=model.vocab * model.hidden * td.grad if head_trains(model, ft) else 0,
        buckets=ddp_buckets if candidate.strategy is Strategy.DDP else 0)


def fsdp_working(model: ModelSpec, counts: ParamCounts, candidate: Candidate,
                 precision: Precision, d: Dtypes, degree: Any, version: int = 2,
                 ft: FineTune = FineTune(), reduce_bytes: int | None = None,
                 grads: Any = None, float8_saving: int = 0, ep: int = 1) -> Working:
    """FSDP2 (``torch/distributed/fsdp/_fully_shard``): each unit is all-gathered to
    ``param_dtype`` before use; the root is not resharded after forward (``_fsdp_state.py``:
    ``post_forward_mesh_info = None`` for the root); in post-backward the unsharded grads are
    copied into a ``reduce_dtype`` reduce-scatter input whose output is the new sharded
    gradient. A shard group of 1 (NO_SHARD) still copies into the reduce buffer (traced).

    FSDP1 (``FullyShardedDataParallel``) frees its all-gather outputs and reduce-scatter
    buffers with ``record_stream`` (``_runtime_utils.py``): the caching allocator cannot reuse
    a block until the communication stream has caught up, so one more unit's gathered
    parameters and one more reduce-scatter input are held than FSDP2's explicit frees
    (torchtitan docs/fsdp.md: FSDP2 peaks 7 % lower on Llama-7B, 8 x H100).

    Only trainable parameters have unsharded gradients and reduce-scatter inputs (LoRA: the
    adapters). A quantized base (Answer.AI's FSDP + QLoRA) all-gathers the packed 4/8-bit
    storage, and each linear is dequantized when used. Tensor parallel: a unit is 1/tp of the
    block (torchtitan applies TP, then ``fully_shard`` over the data-parallel mesh).
    ``grads``: the elements with gradients (``states.grad_counts``; default: the trainable
    ones). ``float8_saving``: bytes a unit's all-gather output is smaller by when float8
    weights are gathered in float8 (planner.float8.gather_saving). ``ep``: expert parallel,
    a block's unit holds its rank's n_experts / ep routed experts only
    (planner/expert_parallel.py ``gathered_experts``)."""
    c, tp = d.compute, candidate.tp
    T = trainable(model, ft)
    G = grads or T
    Pb, Pr = counts.per_block, counts.root
    if model.is_moe and version == 2:
        # FSDP2 all-gathers each rank's dim-0 shard padded to ceil(E / n) experts: the
        # gathered stacked-expert weights are n x that (states.expert_padding)
        from planner.memory.states import expert_padding

        gather_pad = expert_padding(tuple((n, s, 1) for n, s in block_tensors(model)),
                                    degree) * degree
        if ep > 1:
            # the local experts' padded shards from the efsdp ranks replace all E experts
            from planner.expert_parallel import gathered_experts

            # over every rank: efsdp x ep = the world, dp x tp under TP (``degree`` is dp)
            whole, gathered = gathered_experts(list(block_tensors(model)), ep, degree * tp)
            gather_pad = gathered - whole
    else:
        gather_pad = 0
    Pb = Pb + gather_pad
    # the packed codes only: the quantization constants are not sharded (states.quantized_bytes)
    packed = ceil_div(T.quant_per_block, 2 if ft.quantize_base is Quantize.NF4 else 1)
    # EP beside TP (docs/model.md §8.8): the routed experts are not TP-sharded, so the unit's
    # E / ep gathered experts stay out of the tp division (their gradients alike)
    ex = gathered if ep > 1 and tp > 1 else 0
    ex_real = whole // ep if ex else 0
    unit = ceil_div((Pb - ex - T.quant_per_block) * c + packed - float8_saving, tp) + ex * c
    # the reduce-scatter input is padded alike (experts train unless under LoRA)
    Tb = ceil_div(G.train_per_block + (0 if ft.lora else gather_pad) - ex, tp) + ex
    Tb_real = ceil_div(G.train_per_block - (whole - whole // ep if ep > 1 else 0) - ex_real,
                       tp) + ex_real
    Tr = ceil_div(G.train_root, tp)
    root = ceil_div(Pr * c, tp)
    L = model.n_layers
    # FSDP2's forward all-gather of the last block: its output and the previous unit's
    # (the root's when there is one block) alive while the unsharded parameters are filled
    prev_out = unit if L > 1 else root
    # the all-gather output FSDP2 keeps after a unit's forward copy-out until the next one
    # (``wait_for_unshard``: ``comm_ctx.all_gather_state``, set only where the group's world
    # size is above 1): the whole unit's; under EP the unit has two parameter groups (the
    # dense ones on n ranks, the experts on efsdp = n / ep, torchtitan's per-parameter
    # mesh), the experts' copied out last, which frees the dense group's kept output and
    # keeps its own, or nothing where efsdp is 1 (traced: probes/ep_trace.py)
    kept_out = prefetched = unit
    # a dense first block's unit is smaller than a typical (MoE) one (FSDP2, full training)
    dense_full = model.n_dense_layers and ft.full and version == 2
    dense_less = unit - ceil_div(dense_block_elems(model) * c, tp) if dense_full else 0
    if ep > 1:
        experts_out = gathered * c if ex else ceil_div(gathered * c, tp)
        efsdp = degree * tp // ep
        kept_out = experts_out * (efsdp > 1)
        # a unit prefetched in backward: a group of one rank gathers nothing until its own
        # wait (``unshard`` records an event; ``wait_for_unshard`` copies the shard in)
        prefetched = unit - experts_out * (efsdp == 1)
    if candidate.strategy in (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD):
        # Resharded after forward, but the last all-gather output is kept until the next
        # all-gather (at the loss: one block); in backward the current block + the one
        # prefetched (traced).
        fwd = loss = kept_out
        bwd = unit + prefetched
        # inside a block's forward: its unit and its kept all-gather output; under EP, but
        # for the last block, the next unit prefetched (torchtitan's
        # set_modules_to_forward_prefetch; a group of one rank gathers nothing before its
        # own wait)
        in_block = unit + kept_out
        fwd_prefetched = prefetched if ep > 1 else 0
        freed, lingering = 0, unit
        gather_fwd = root + 2 * unit + prev_out
        if ep > 1:
            # a group of one rank all-gathers nothing (``foreach_all_gather`` is skipped:
            # the shard is copied in) and keeps no output: under EP x TP with dp = n / tp 1
            # (TP 8 on 8 GPUs) the dense group is one rank, the experts' too where ep = n
            # (traced, TP 8 x EP 8: the forward's all-gather moment holds the unit alone)
            dense_out = unit - experts_out
            gather_fwd = vec.where(degree == 1, root + unit + experts_out * (efsdp > 1)
                                   + kept_out * (L > 1), gather_fwd)
            prefetched = prefetched - dense_out * (degree == 1)
            fwd_prefetched = prefetched
            bwd = unit + prefetched
    else:  # SHARD_GRAD_OP, NO_SHARD: kept unsharded from forward until post-backward
        # (an MoE model's dense first blocks: their own, smaller units)
        fwd = loss = bwd = L * unit - model.n_dense_layers * dense_less
        # the last block's all-gather output lingers until backward (traced)
        fwd = fwd + kept_out * (degree > 1)
        freed, lingering = unit, 0
        gather_fwd = root + (L - 1) * unit - model.n_dense_layers * dense_less + unit \
            + (unit + prev_out) * (degree > 1)
        in_block, fwd_prefetched = fwd, 0
    fsdp2 = version == 2
    # the reduce-scatter input in reduce_dtype (MixedPrecisionPolicy; --precision's default)
    rs_b = reduce_bytes if reduce_bytes is not None else (
        FP32 if precision.amp else precision.param_bytes)
    if ft.lora:
        rs_b = FP32 if ft.lora_fp32 else c
    delayed = version == 1  # record_stream: one more unit and reduce input held
    dq = ceil_div(dequantized_linear(model, ft, c), tp)
    grads_unit = (Tb_real if fsdp2 else Tb) * c
    layout = 0
    if model.is_moe and fsdp2 and not ft.lora:
        layout = max(numel(s) for n, s in block_tensors(model)
                     if n.startswith("mlp.w_")) * c // ep
    if version == 1 and candidate.strategy is Strategy.NO_SHARD \
            and (d.param == c or ft.lora):
        # FSDP1 NO_SHARD without a param-dtype cast computes on the flat parameter itself
        # (``_flat_param.py`` ``needs_unshard`` is False: ``unshard`` does nothing) and
        # all-reduces the gradient in place: no gathered copy, no separate reduce buffer.
        # Under LoRA the frozen base is stored in the compute dtype (the adapters' cast is
        # negligible).
        unit = fwd = loss = bwd = root = freed = lingering = grads_unit = rs_b = 0
        delayed = False
    return Working(
        gathered_fwd=root + fwd + delayed * unit, gathered_loss=root + loss + delayed * unit,
        gathered_bwd=root + bwd + delayed * unit + dq,
        gathered_bwd_first=root + unit + delayed * unit + dq,
        freed_per_block=freed, lingering_first=0 if fsdp2 else lingering, gathered_end=root,
        fwd_gather=gather_fwd if fsdp2 else 0, post_freed=unit if fsdp2 else 0,
        gathered_in_block=root + in_block if fsdp2 else 0,
        fwd_prefetched=fwd_prefetched if fsdp2 else 0,
        grad_layout_copy=layout,
        unsharded_block_grads=grads_unit, rs_unit=(1 + delayed) * Tb * rs_b, rs_root=Tr * rs_b,
        rs_first=(1 + delayed) * ceil_div(dense_block_elems(model), tp) * rs_b
        if model.n_dense_layers and ft.full else None,
        first_less=(dense_less, grads_unit - ceil_div(dense_block_elems(model), tp) * c)
        if dense_full else (0, 0),
        root_grad_bwd=ceil_div(model.vocab * model.hidden * c, tp)
        if head_trains(model, ft) else 0)


def dense_block_elems(model: ModelSpec) -> int:
    """Elements of one of an MoE model's dense first blocks (DeepSeek's first_k_dense)."""
    return sum(numel(s) for _, s in block_tensors(model, dense=True))


def qgz_local(training: TrainingSpec, s: Strategy, n: Any, gpus_per_node: Any) -> Any:
    """GPUs per node where ZeRO++ qgZ reduces the gradients (ZeRO-3 on more than one node:
    ``stage3.py`` ``__avg_scatter_grads``), else 0."""
    if not (training.deepspeed.zero_quantized_gradients and s is Strategy.ZERO3
            and gpus_per_node is not None):
        return 0
    return vec.where(n > gpus_per_node, gpus_per_node, 0)


def zero_working(model: ModelSpec, counts: ParamCounts, candidate: Candidate,
                 training: TrainingSpec, d: Dtypes, opt_shard: Any,
                 gpus_per_node: Any = None) -> Working:
    """DeepSpeed ZeRO (``deepspeed/runtime/zero``): the buckets, ZeRO-3's gathered modules
    and prefetch, the step's gradient copies (planner/memory/zero.py)."""
    s = candidate.strategy
    T = trainable(model, training.finetune)
    td = train_dtypes(training.finetune, d, True, training.precision.amp)
    master_b, state_b = master_bytes(training.deepspeed, td.master, td.state)
    bf16_opt = training.deepspeed.bf16_optimizer(s, candidate.offload, training.precision)
    local = ceil_div(T.train, opt_shard)
    largest = max((numel(sh) for _, sh, _ in T.groups), default=0)
    z = zero_buffers(s, candidate.offload, training.deepspeed, train=T.train,
                     largest_tensor=counts.largest_tensor, largest_train=largest,
                     degree=opt_shard, b=d.param, sizes=ordered_sizes(model, T),
                     grad_accum=training.grad_accum,
                     check_overflow=training.precision.amp and d.param < FP32,
                     param_fp16=training.precision is Precision.FP16_AMP,
                     qgz_local=qgz_local(training, s, opt_shard, gpus_per_node),
                     temps=zero_step_temps(s, training, local, largest, opt_shard, state_b,
                                           ordered_sizes(model, T)),
                     master_b=master_b or FP32, bf16_optimizer=bf16_opt)
    return Working(
        gathered_fwd=z.gathered, gathered_loss=z.gathered, gathered_bwd=z.gathered,
        gathered_bwd_first=z.gathered,
        root_grad_bwd=model.vocab * model.hidden * td.grad
        if keeps_every_grad(s, training.deepspeed, training.grad_accum)
        and head_trains(model, training.finetune) else 0,
        buckets=z.buckets, bwd_buffers=z.bwd_buffers, step_extra=z.step_extra,
        step_grads_freed=z.step_grads_freed, init_extra=z.init_extra)
