"""DeepSpeed ZeRO as the engine runs it: the buffers, gradient copies and step temporaries of
stages 1-3 beyond the model states, and what offload keeps in host RAM (docs/model.md
"DeepSpeed ZeRO").

Source: DeepSpeed v0.19.6 (commit edaa7221), ``deepspeed/runtime/zero/stage_1_and_2.py``
(``DeepSpeedZeroOptimizer``), ``stage3.py`` (``DeepSpeedZeroOptimizer_Stage3``),
``partitioned_param_coordinator.py``, ``config.py``; cross-checked against pip deepspeed
0.19.8 on the CPU accelerator (gloo, two ranks, every persistent buffer matched to the byte;
docs/accuracy.md). Notation: T trainable elements, N the ZeRO degree, Tn = ceil(T / N), b the
16-bit weight bytes (DeepSpeed's ``self.dtype``), B ``reduce_bucket_size``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from planner import vec
from planner.params import Trainable, numel, tensor_groups
from planner.spec import (
    DeepSpeedConfig,
    ModelSpec,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    Strategy,
    TrainingSpec,
)
from planner.vec import ceil_div

FP32 = 4
BF16 = 2


def master_bytes(ds: DeepSpeedConfig, master: int, state: int) -> tuple[int, int]:
    """The ZeRO optimizer's master partition and optimizer-state bytes per element, from the
    strategy's (``master``, ``state``: fp32 under mixed precision).

    ``bf16_master_weights_and_grads`` (``base_optimizer.py`` ``_configure_master_weights``)
    makes the master partition bf16 (``stage_1_and_2.py``: ``single_partition_of_fp32_groups``
    cloned ``.to(master_weights_and_grads_dtype)``; ``stage3.py``:
    ``fp32_partitioned_groups_flat``), and with it the gradient partition the optimizer steps
    (``zero_buffers``, the host's under offload); the optimizer's moments are
    ``zeros_like(param)`` of those bf16 partitions with ``bf16_optimizer_states`` (FusedAdam,
    torch AdamW; DeepSpeedCPUAdam with ``fp32_optimizer_states=False``, engine.py
    ``_configure_basic_optimizer``), else fp32 (DeepSpeedCPUAdam's default; DeepSpeed
    refuses the combination without ZeRO-Offload). Measured: tests/data/deepspeed_cpu.json
    ``z2-bf16-master``, ``z3-bf16-master``. A partition kept in fp32 (a LoRA adapter in
    fp32, ``master`` 0) is left alone."""
    if not ds.bf16_master_weights_and_grads or master == 0:
        return master, state
    return BF16, BF16 if ds.bf16_optimizer_states else state


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroStates:
    """ZeRO's model states on one GPU and in host RAM, beyond what ``states.resident`` counts
    for every strategy."""

    gradients: Any
    persistent_params: Any
    """ZeRO-3: small parameters kept whole on every rank, beyond their 1/N share, and ZeRO++
    hpZ's secondary partition (``hpz_secondary_bytes``)."""
    optimizer_temporaries: Any
    host_per_rank: Any
    acc_buffer: Any = 0
    """``BF16_Optimizer``'s fp32 gradient accumulation buffer (``bf16_states``)."""


def persistent_elems(model: ModelSpec, threshold: int) -> int:
    """ZeRO-3 parameters with fewer than ``stage3_param_persistence_threshold`` elements are
    never partitioned (``partition_parameters.py``: ``ds_persist`` when ``ds_numel <
    param_persistence_threshold``): the norms and biases of a Llama at the 1e5 default
    (0.5 MB of a 7B model), every block matrix at a large "auto" 10 h on a small model."""
    return sum(k * numel(s) for _, s, k in tensor_groups(model) if numel(s) < threshold)


Runs = tuple[tuple[tuple[int, ...], int], ...]
"""Parameter sizes in module order as runs: (the sizes of one stretch, how many times it
repeats in a row), e.g. the embeddings once, a block's tensors n_layers times, the rest once."""


def step_elems(strategy: Strategy, ds: DeepSpeedConfig, local: Any, largest: Any,
               sizes: Runs = (), degree: Any = 1) -> Any:
    """Elements the optimizer steps at once: ZeRO-1/2 one flat fp32 partition per param group
    (``single_partition_of_fp32_groups``); ZeRO-3 its largest sub-group
    (``_create_fp16_sub_groups``: the partitions ``ceil(numel / N)`` of the parameters, in
    module order, are added to a sub-group until it reaches ``sub_group_size``; 0 makes every
    parameter its own sub-group; the 1e9 default is usually the whole partition ``local``).
    With the parameters' sizes in order (``sizes``, as runs) and one degree the grouping is
    replayed (``largest_sub_group``); otherwise the bound sub_group_size - 1 + the largest
    partition ``largest``."""
    if strategy is not Strategy.ZERO3:
        return local
    sub = ds.sub_group_size
    if sizes and isinstance(degree, int):
        if sub >= sum(sum(ceil_div(n, degree) for n in run) * k for run, k in sizes):
            return local
        return largest_sub_group(sizes, degree, sub)
    return vec.minimum(local, max(sub, 1) - 1 + largest)


def largest_sub_group(runs: Runs, degree: int, sub: int) -> int:
    """DeepSpeed's sub-groups replayed over parameter partitions given as runs, in work that
    does not grow with the repeats: whole repeats that close no sub-group are skipped at once,
    and once a repeat starts from a partial sub-group seen before (a cycle: each repeat that
    closes one leaves one of at most len(run) + 1 partial sums) the cycles left are skipped,
    as they close the same sub-groups again. The last parameter closes the last sub-group."""
    nonempty = [i for i, (run, k) in enumerate(runs) if run and k > 0]
    best = acc = 0
    for i in nonempty:
        run, k = runs[i]
        parts = [ceil_div(n, degree) for n in run]
        total = sum(parts)
        final = i == nonempty[-1]
        left = k
        seen: dict[int, int] = {}
        while left:
            keep = 1 if final else 0  # the very last repeat is replayed: it closes the last group
            if acc + total < sub and left > keep:
                skip = min((sub - 1 - acc) // total if total else left, left - keep)
                if skip > 0:  # repeats that close no sub-group
                    acc += skip * total
                    left -= skip
                    continue
            if acc in seen:  # the same start as `period` repeats ago: the same groups again
                period = seen[acc] - left
                left -= (left - keep - 1) // period * period if left - keep > period else 0
                seen = {}
            seen[acc] = left
            for j, n in enumerate(parts):
                acc += n
                if acc >= sub or (final and left == 1 and j == len(parts) - 1):
                    best, acc = max(best, acc), 0
            left -= 1
    return best


@functools.lru_cache(maxsize=256)
def ordered_sizes(model: ModelSpec, T: Trainable) -> Runs:
    """Every trainable parameter's element count in module order, as runs (the order of
    ``planner.params.param_tensors``, as the reference module registers them: the embeddings,
    the dense blocks of an MoE, the blocks, the rest), when every parameter trains; ()
    otherwise. Its size does not grow with the layers."""
    from planner.params import block_tensors, root_tensors

    roots = list(root_tensors(model))
    first = tuple(numel(s) for n, s in roots if n.startswith(("embed", "pos_", "type_")))
    rest = tuple(numel(s) for n, s in roots if not n.startswith(("embed", "pos_", "type_")))
    nd = model.n_dense_layers
    runs = ((first, 1),
            (tuple(numel(s) for _, s in block_tensors(model, dense=True)) if nd else (), nd),
            (tuple(numel(s) for _, s in block_tensors(model)), model.n_layers - nd),
            (rest, 1))
    runs = tuple((r, k) for r, k in runs if r and k > 0)
    if sum(sum(r) * k for r, k in runs) != T.train:
        return ()
    return runs


def zero_states(model: ModelSpec, training: TrainingSpec, strategy: Strategy, offload: Offload,
                T: Trainable, *, grad_b: int, param_b: int, states: Any, degree: Any,
                temps: Any, master_b: int = FP32) -> ZeroStates:
    """Gradients, persistent parameters, the step's temporaries and host RAM of one rank.

    Gradients (16-bit, DeepSpeed's ``self.dtype``):
    - ZeRO-1 keeps every ``param.grad`` (T b) until the step, with or without
      ``overlap_comm`` (``reduce_ipg_grads``: stage 1 copies the grads of its own partition
      into ``grads_in_partition``, Tn b with ``contiguous_gradients``, and clears no other
      grad; measured: every grad alive when backward ends, overlap_comm or not).
    - ZeRO-2 keeps its partition in ``grads_in_partition`` (Tn b); under accumulation each
      backward copies the accumulated grads into a new buffer (the old one is released at
      the end of backward): that second Tn b is a backward buffer (``zero_buffers``).
    - ZeRO-3 allocates ``grad_partitions_flat_buffer`` (Tn b) at init.
    - Optimizer offload: ZeRO-2/3 copy each reduced partition straight to the host's fp32
      buffer (``async_inplace_copy_grad_to_fp32_buffer_from_gpu``; ZeRO-3's flat buffer is on
      the host); ZeRO-1 still holds its unpartitioned grads.

    Host RAM per rank under offload (``offload_optimizer``; DeepSpeedCPUAdam steps there):
    the fp32 master and optimizer states, an fp32 gradient partition (4 Tn), a 16-bit staging
    partition (b Tn), and for ZeRO-1/2 a 4 L buffer for the largest parameter L
    (``temp_grad_buffer_for_cpu_offload``) and one more b Tn under accumulation; ZeRO-3 with
    ``offload_param`` adds the 16-bit parameter partitions: 18 Tn, 20 Ψ/N for full training
    under bf16 Adam. With ``bf16_master_weights_and_grads`` the host's gradient partition is
    in the master dtype (``master_b``: ``single_partition_of_fp32_groups[i].grad``).

    ``BF16_Optimizer`` (``DeepSpeedConfig.bf16_optimizer``): ``bf16_states``.
    """
    ds = training.deepspeed
    Tn = ceil_div(T.train, degree)
    accumulating = training.grad_accum > 1
    persist = 0
    secondary = 0
    if strategy is Strategy.ZERO3:
        p = persistent_elems(model, int(ds.stage3_param_persistence_threshold))
        persist = (p - ceil_div(p, degree)) * param_b
        secondary = hpz_secondary_bytes(model, ds, degree, param_b)
    if offload is Offload.PARAMS_AND_OPTIMIZER:
        secondary_host, secondary = secondary, 0  # on offload_param's device (remote_device)
    else:
        secondary_host = 0
    persist = persist + secondary
    if offload is not Offload.NONE:
        largest = max((numel(s) for _, s, _ in T.groups), default=0)
        host = states + Tn * (master_b + grad_b)
        if strategy is not Strategy.ZERO3:
            host = host + FP32 * largest + (Tn * grad_b if accumulating and
                                             strategy is Strategy.ZERO2 else 0)
        if offload is Offload.PARAMS_AND_OPTIMIZER:
            host = host + ceil_div(T.train + T.frozen(model.n_layers),
                                   degree) * param_b
        if strategy is Strategy.ZERO3 and ds.offload_device == "nvme":
            # ZeRO-Infinity: states (and offloaded parameters) live on NVMe; host RAM holds the
            # swappers' pinned buffers, allocated up front: the optimizer swapper's
            # buffer_count (4) x the largest sub-group in fp32
            # (swap_tensor/partitioned_optimizer_swapper.py), the parameter swapper's
            # buffer_count (5) x buffer_size (1e8) elements in the 16-bit dtype
            # (swap_tensor/partitioned_param_swapper.py)
            host = 4 * min(int(ds.sub_group_size), Tn) * FP32 + (
                5 * 100_000_000 * param_b if offload is Offload.PARAMS_AND_OPTIMIZER else 0)
        grads = T.train * grad_b if strategy is Strategy.ZERO1 else 0
        return ZeroStates(gradients=grads, persistent_params=persist, optimizer_temporaries=0,
                          host_per_rank=host + secondary_host)
    if ds.bf16_optimizer(strategy, offload, training.precision):
        return bf16_states(T.train, grad_b, temps, ds.fused_adam)
    if keeps_every_grad(strategy, ds, training.grad_accum):
        grads = T.train * grad_b + (Tn * grad_b if ds.contiguous_gradients else 0)
    else:
        grads = Tn * grad_b
    return ZeroStates(gradients=grads, persistent_params=persist,
                      optimizer_temporaries=0 if ds.fused_adam else temps, host_per_rank=0)


# ---- ZeRO++ (Wang et al. 2023, "ZeRO++", arXiv 2306.10209; DeepSpeed v0.19.6) -------------

QWZ_GROUP = 4096
"""qwZ's quantization group (elements per fp32 scale): ``CUDAQuantizer.quantize``
(``partition_parameters.py``) takes ceil(numel / 8000) groups (``target_group_size``) and adds
groups until 8 x groups divides numel, so a group holds at most 8000 elements. Llama's
matrices land on 4096 to 7168 (4096 x 4096: numel / 8 = 2^21, so 2098 groups become 4096 of
4096 elements; 14336 x 4096: 7 x 2^20 / 8192 groups, 7168 elements); 4096 is taken, the
larger share of scales: 4 / 4096 B per element, 0.1 %."""


def hpz_group(ds: DeepSpeedConfig, n: Any) -> Any:
    """hpZ's group: ``zero_hpz_partition_size`` ranks, at most the world
    (``utils/groups.py`` ``_create_zero_param_parallel_group``: ``min(group_size,
    world_size)``); 1 when off."""
    return vec.minimum(max(int(ds.zero_hpz_partition_size), 1), n)


def hpz_secondary_bytes(model: ModelSpec, ds: DeepSpeedConfig, degree: Any, b: int) -> Any:
    """hpZ's secondary partition on one rank (``partition_parameters.py``
    ``_partition_param_sec``, called by ``_partition`` before each parameter is partitioned):
    for every parameter a 16-bit tensor (the parameter's dtype) of ``aligned_size // h``
    elements, aligned_size the parameter padded to a multiple of the ZeRO degree N
    (``_aligned_size``) and h the hpZ group. Built as each module is released in the
    forward, dropped after the step (``stage3.py`` ``_post_step`` ->
    ``invalidate_secondary_tensor``; frozen parameters keep theirs): whole from the loss to
    the step, counted at every moment (the forward's first blocks hold less). Measured on
    DeepSpeed's CPU accelerator (probes/deepspeed_cpu.py case z3-hpz, two ranks, h = 2):
    115,008 B at the second step's optimizer = the whole 115,008-element model / 2 x 2 B, the
    persistent norms included."""
    if ds.zero_hpz_partition_size <= 1:
        return 0
    h = hpz_group(ds, degree)
    elems = sum(k * (ceil_div(numel(s), degree) * degree // h)
                for _, s, k in tensor_groups(model))
    return elems * b


def qwz_gather_bytes(in_flight: Any, module: Any, *, param_fp16: bool) -> Any:
    """qwZ's quantized all-gather beyond the gathered 16-bit parameters
    (``partition_parameters.py``: ``_all_gather_coalesced`` with ``quantize``, then
    ``AllGatherCoalescedHandle.wait``): every gather in flight receives into an int8 buffer of
    its module's elements plus an fp32 scale per ``QWZ_GROUP`` (``flat_tensor``,
    ``quant_scale_buffer``); the one waited on is dequantized into a whole fp16 copy of the
    module (the quantizer kernel writes fp16), whose slices are concatenated per parameter;
    a parameter that is not fp16 (bf16, fp32) is that fp16 concatenation converted: the
    fp16 concatenation of the largest parameter beside it for a moment. The unquantized path
    gathers into the parameters' own buffer, so all of this is extra. ``in_flight``:
    elements being gathered (the module in use and the prefetch); ``module``: the one being
    waited on (bounded, as ZeRO-3's gathering above, by the largest parameter)."""
    int8 = in_flight + ceil_div(in_flight, QWZ_GROUP) * FP32
    return int8 + 2 * module + (0 if param_fp16 else 2 * module)


def qgz_temp_bytes(n: int, local: Any) -> Any:
    """qgZ's temporaries while one gradient matrix of n elements is reduced
    (``comm/coalesced_collectives.py`` ``all_to_all_quant_reduce``, L = ``local`` GPUs per
    node): the int4 codes and the buffer the intra-node all-to-all receives them in (n / 2
    each), the reduced n / L re-quantized and received across nodes (n / 2L each), the fp16
    dequantized n / L: n (1 + 3 / L) bytes. The fp32 scales (max(rows, cols) per buffer: 0.5 MB
    for a 128256 x 4096 embedding) are left out. It replaces the flattened bucket copy of the
    reduce-scatter path; the matrices of a bucket are reduced one after another."""
    local = vec.maximum(local, 1)
    return 2 * ceil_div(n, 2) + 2 * ceil_div(n, 2 * local) + 2 * ceil_div(n, local)


def zeropp_problem(ds: DeepSpeedConfig, strategies: tuple[Strategy, ...], n: int,
                   gpus_per_node: int) -> tuple[str, str] | None:
    """(the field, why) a ZeRO++ setting cannot run here, or None.

    - ZeRO++ is ZeRO-3's: ``stage_1_and_2.py`` reads none of the three keys (the engine
      passes them to ``DeepSpeedZeroOptimizer_Stage3`` and ``zero.Init`` only).
    - hpZ: DeepSpeed asserts the world size divides by the group
      (``_create_zero_param_parallel_group``: ``_ensure_divisibility``); groups are
      consecutive ranks, so the group is one node's GPUs (or part of them) only when it
      divides the GPUs per node; fitcheck also takes whole nodes (a multiple of them), and
      refuses a group that would straddle nodes.
    """
    given = [p for p, on in (("deepspeed.zero_quantized_weights", ds.zero_quantized_weights),
                             ("deepspeed.zero_hpz_partition_size",
                              ds.zero_hpz_partition_size > 1),
                             ("deepspeed.zero_quantized_gradients",
                              ds.zero_quantized_gradients)) if on]
    if given and Strategy.ZERO3 not in strategies:
        return given[0], ("ZeRO++ works in ZeRO-3 only (DeepSpeed's ZeRO-1/2 never read it); "
                          f"the strategies asked for are {', '.join(strategies)}")
    h = int(hpz_group(ds, n))
    if h <= 1:
        return None
    if n % h:
        return ("deepspeed.zero_hpz_partition_size",
                f"the {n} GPUs are not a multiple of {ds.zero_hpz_partition_size} "
                "(DeepSpeed's _create_zero_param_parallel_group asserts they are)")
    if gpus_per_node % h and h % gpus_per_node:
        return ("deepspeed.zero_hpz_partition_size",
                f"{ds.zero_hpz_partition_size} does not divide the {gpus_per_node} GPUs per "
                "node: its groups of consecutive ranks would straddle nodes (ZeRO++ sets it to "
                "the GPUs per node)")
    return None


def bf16_states(train: int, grad_b: int, temps: Any, fused_adam: bool) -> ZeroStates:
    """``BF16_Optimizer`` (``deepspeed/runtime/bf16_optimizer.py``), which the engine picks over
    ZeRO-1 for a bf16 model with fp32 gradient accumulation. ``_setup_for_real_optimizer``
    flattens the bf16 module (as ZeRO-1), keeps an fp32 master partition (4 Tn, with the
    optimizer state, counted by ``states.resident``) and allocates
    ``fp32_groups_gradients_flat``: a zeroed buffer of the *whole* flat module in
    ``grad_acc_dtype`` (4 T), alive from init to the end. Every ``param.grad`` stays bf16
    (b T): ``backward_epilogue`` adds them into the buffer (``_update_hp_grad``),
    ``clear_lp_grads`` zeroes them in place before the next backward, and
    ``zero_grad(set_to_none=True)`` after the step frees them. No reduce buckets, no
    partition copy: the step hands the optimizer a view of the buffer.

    The buffer (``acc_buffer``) is counted with the optimizer states (the wrapper's,
    allocated with the master copy and alive at every moment), the bf16 grads as gradients.
    Measured on the CPU referee (tests/data/deepspeed_cpu.json ``z1-bf16-optimizer``)."""
    return ZeroStates(gradients=train * grad_b, persistent_params=0,
                      optimizer_temporaries=0 if fused_adam else temps,
                      host_per_rank=0, acc_buffer=train * FP32)


def keeps_every_grad(strategy: Strategy, ds: DeepSpeedConfig, grad_accum: int) -> bool:
    """ZeRO-1 holds every parameter's gradient until the step (it partitions only the
    optimizer state); ZeRO-2/3 hold their partition."""
    return strategy is Strategy.ZERO1


@dataclass(frozen=True, slots=True, kw_only=True)
class ZeroBuffers:
    """ZeRO's communication buffers and the step's gradient copies on one GPU."""

    buckets: Any
    """Alive at every moment of the step (ZeRO-3's reduce bucket, allocated at init)."""
    bwd_buffers: Any
    """Alive during backward only (ZeRO-1/2's buckets, the copies being reduced)."""
    gathered: Any
    """ZeRO-3: the module in use plus the prefetched parameters."""
    step_extra: Any
    """Beyond the optimizer's own temporaries at the step: the flat 16-bit copy and the fp32
    copy of the gradient partition (or sub-group)."""
    step_grads_freed: Any
    """Gradients freed before the step's copies (ZeRO-1's grads outside its partition)."""
    init_extra: Any
    """While the engine is built: ZeRO-1/2 flatten the 16-bit module into one buffer (a
    second copy for a moment); ZeRO-3 under zero.Init, one module at full size."""


def zero_buffers(strategy: Strategy, offload: Offload, ds: DeepSpeedConfig, *, train: int,
                 largest_tensor: int, largest_train: int, degree: Any, b: int, temps: Any,
                 sizes: tuple[int, ...] = (), grad_accum: int = 1,
                 check_overflow: bool = False, master_b: int = FP32,
                 bf16_optimizer: bool = False, param_fp16: bool = False,
                 qgz_local: Any = 0) -> ZeroBuffers:
    """Buckets (``reduce_bucket_size`` elements of the 16-bit dtype, allocated at full size
    whatever the model's size):

    - ZeRO-1/2 (``setup_buckets``): with ``contiguous_gradients`` one bucket at the first
      gradient hook of each backward, a second with ``overlap_comm`` ("double buffers"); freed
      when backward ends (``ipg_buffer`` cleared), so not counted at the step. Each bucket is
      flattened into a copy of up to B elements as it is reduced. (The "4.5 x" of the HF docs
      is DeepSpeed <= 0.3.16's ``reduce_bucket_size * 4.5`` buffer, removed in v0.4.0.)
    - ZeRO-3 (``DeepSpeedZeroOptimizer_Stage3.__init__``): one bucket at init, alive for the
      whole run; each reduction concatenates the bucket's grads into a copy of up to B
      elements, up to three in flight with ``overlap_comm`` (as many as the backward fills).

    ZeRO-3 gathering (``partitioned_param_coordinator.py``): the submodule in use is gathered
    whole (the largest parameter bounds it) and up to ``stage3_prefetch_bucket_size``
    elements ahead, capped by ``stage3_max_live_parameters``.

    The step (``stage_1_and_2.py`` ``step``, ``stage3.py`` ``_prepare_fp32_grad_for_sub_group``):
    the partition's gradients are flattened (b per element) and converted to fp32 (4 per
    element); the 16-bit copy is freed before the optimizer runs, the fp32 one after. ZeRO-3
    does this per sub-group (``sub_group_size``), not for the whole partition. Under optimizer
    offload the step runs on the host. Before the copies the gradients are checked for
    overflow (``check_overflow``: fp16, and bf16 whose ``check_grad_overflow`` defaults to
    true, ``runtime/precision_config.py``): the step moment is the larger of the two. With bf16
    master weights (``master_b`` = b) the conversion ``flat.to(master dtype)`` returns the flat
    copy itself: b S, no second copy (measured: ``z2-bf16-master``).

    ``BF16_Optimizer`` (``bf16_optimizer``): ``bf16_buffers``.
    """
    if bf16_optimizer:
        return bf16_buffers(train=train, b=b, temps=0 if ds.fused_adam else temps)
    overlap = ds.overlap(strategy is Strategy.ZERO3)
    B = int(ds.reduce_bucket_size)
    Tn = ceil_div(train, degree)
    # a bucket's worth of gradients being reduced; a parameter larger than the bucket skips
    # it and is reduced from its own full gradient (``extra_large_param_to_reduce``; stage 3
    # likewise): the largest such one alive beside the copies (HF's "auto" h^2 bucket is
    # smaller than most weight matrices)
    filled = min(B, train) if B else train
    big = largest_train if largest_train > filled else 0
    if strategy is Strategy.ZERO3:
        rounds = ceil_div(train, B) if B else 1
        in_flight = vec.minimum(rounds, 3) if overlap else 1
        buckets = B * b if ds.contiguous_gradients else 0
        bwd = in_flight * filled * b + big * b
        if ds.zero_quantized_gradients:  # ZeRO++ qgZ across nodes: per matrix, no bucket copy
            bwd = vec.where(qgz_local > 0, in_flight * qgz_temp_bytes(largest_train, qgz_local)
                            + big * b, bwd)
        prefetch = min(int(ds.stage3_prefetch_bucket_size), ds.stage3_max_live_parameters)
        gathered = (largest_tensor + prefetch) * b
        if ds.zero_quantized_weights:  # ZeRO++ qwZ: the int8 and fp16 copies (above)
            gathered = gathered + qwz_gather_bytes(largest_tensor + prefetch, largest_tensor,
                                                   param_fp16=param_fp16)
        init = largest_tensor * b if ds.zero_init else 0
    else:
        buckets = 0
        bwd = (B * b * (2 if overlap else 1) if ds.contiguous_gradients else 0) \
            + filled * b + big * b
        if strategy is Strategy.ZERO2 and grad_accum > 1 and ds.contiguous_gradients:
            bwd = bwd + Tn * b  # the next grads_in_partition beside the accumulated one
        gathered = 0
        init = train * b
    if offload is not Offload.NONE:
        step, freed = 0, 0
    else:
        S = step_elems(strategy, ds, Tn, ceil_div(largest_train, degree), sizes, degree)
        opt = 0 if ds.fused_adam else temps
        # 4 S fp32 copy with the b S flat copy, or later with the optimizer's temporaries;
        # a bf16 master takes the flat copy itself (``.to`` its own dtype copies nothing)
        copies = b * S if master_b == b else master_b * S + vec.maximum(b * S - opt, 0)
        freed = train * b if keeps_every_grad(strategy, ds, grad_accum) else 0
        # before them, the overflow check (fp16, and bf16's check_grad_overflow default):
        # ZeRO-1/2 _has_inf_or_nan per partition gradient: x.float() (4n), isnan, isinf,
        # their or (n each), .float() (4n): 11 n for the largest; ZeRO-3 isinf / isnan of the
        # flat buffer: a bool per element. Every gradient is still alive then.
        check = 0
        if check_overflow:
            check = Tn if strategy is Strategy.ZERO3 else \
                11 * vec.minimum(largest_train, Tn)
        # the check moment (every grad, the check) against the copies' (ZeRO-1's other grads
        # freed, the copies, the optimizer's temporaries ``opt`` counted by ZeroStates)
        first = check + freed > copies + opt
        step = vec.where(first, check - opt, copies)
        freed = vec.where(first, 0, freed)
    return ZeroBuffers(buckets=buckets, bwd_buffers=bwd, gathered=gathered, step_extra=step,
                       step_grads_freed=freed, init_extra=init)


def bf16_buffers(*, train: int, b: int, temps: Any) -> ZeroBuffers:
    """``BF16_Optimizer``'s transient buffers. Backward allocates nothing of its own (no
    buckets: the ZeRO optimizer's hooks are not installed). At the accumulation boundary the
    engine all-reduces the fp32 buffer (``engine.py`` ``allreduce_gradients`` ->
    ``buffered_allreduce_fallback`` -> ``allreduce_bucket``): the flat buffer is one bucket,
    cast to ``communication_data_type`` (bf16 for a bf16 engine), a b T copy beside every
    gradient, freed before the step (measured: the all-reduced tensor of ``z1-bf16-optimizer``
    is 2 T bytes). The step has no overflow check (the wrapper has none), no flat or fp32
    copy (``param_partition.grad`` is a view of the buffer) and frees no gradient. The
    all-reduce moment holds what the step holds but the optimizer's temporaries (``temps``),
    so it is the step moment's extra: the larger of the two. Initialization flattens the bf16
    module (a second copy for a moment), as ZeRO-1/2 do."""
    return ZeroBuffers(buckets=0, bwd_buffers=0, gathered=0,
                       step_extra=vec.maximum(train * b - temps, 0), step_grads_freed=0,
                       init_extra=train * b)


def optimizer_temp_bytes(largest_tensor: int, local_elems: Any, training: TrainingSpec,
                         state_bytes: int, zero: bool, shard: Any = 1) -> Any:
    """Transient device memory of optimizer.step() (every strategy: here because the ZeRO
    step below uses it too, and planner/memory/states.py imports this module)."""
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
    return 2 * ceil_div(largest_tensor, shard) * state_bytes


def zero_step_temps(strategy: Strategy, training: TrainingSpec, local: Any, largest: int,
                    degree: Any, state_b: int, sizes: tuple[int, ...] = ()) -> Any:
    """A client torch optimizer's temporaries over the elements stepped at once (one flat
    tensor: the foreach path's sqrt copy, or the for-loop's two); DeepSpeed's FusedAdam has
    none (``ZeroStates`` drops them when ``fused_adam``)."""
    S = step_elems(strategy, training.deepspeed, local, ceil_div(largest, degree), sizes,
                   degree)
    return optimizer_temp_bytes(S, S, training, state_b, False)
