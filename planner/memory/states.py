"""Model states per GPU: parameters, gradients, optimizer state, the step's temporaries, and
what offload moves to the host.

Sources: ZeRO (Rajbhandari et al. 2020, sec. 5: 2Ψ + 2Ψ + KΨ, K = 12 for mixed-precision Adam;
stage 1 shards K, stage 2 also the gradients, stage 3 also the parameters); FSDP2
(``torch/distributed/fsdp/_fully_shard``: params, grads and optimizer state sharded over the
shard group, dim-0 shards padded to a multiple of the group); torch.optim's per-parameter
state (``torch/optim/adam.py``: ``exp_avg``, ``exp_avg_sq`` = ``zeros_like(param)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.vec import ceil_div
from planner.params import ParamCounts, Trainable, count, numel, tensor_groups, trainable
from planner.memory.zero import (
    master_bytes,
    optimizer_temp_bytes,
    ordered_sizes,
    zero_states,
    zero_step_temps,
)
from planner.spec import (
    Candidate,
    FineTune,
    FlatParams,
    FsdpDtypes,
    ModelSpec,
    Offload,
    OptimizerKind,
    Precision,
    Quantize,
    Strategy,
    TrainingSpec,
)

FP32 = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Dtypes:
    """Bytes per element of each copy of the model a strategy keeps."""

    param: int
    """The resident parameters (the module's own dtype)."""
    grad: int
    master: int
    """A separate fp32 master copy (DeepSpeed under mixed precision), else 0."""
    state: int
    """Optimizer state elements."""
    compute: int
    """Working copies and activations in matmuls."""


def dtypes(strategy: Strategy, precision: Precision, fsdp: FsdpDtypes | None = None) -> Dtypes:
    """DeepSpeed keeps the module and its gradients in the compute dtype with an fp32 master
    copy beside the optimizer state; torch AMP (DDP, FSDP2's MixedPrecisionPolicy) keeps fp32
    params, grads and state and casts for compute; pure bf16 keeps everything in bf16.

    FSDP (``fsdp``: the policy's dtypes, ``TrainingSpec.fsdp_dtypes``): the sharded
    parameters, their gradients (the reduce-scatter output is cast back to the parameters'
    dtype, ``_fsdp_collectives.py`` ``foreach_reduce``) and the optimizer state
    (``zeros_like(param)``) in the storage dtype; working copies in ``param_dtype``."""
    c = precision.compute_bytes
    if strategy.is_zero:
        return Dtypes(param=c, grad=c, master=FP32 if precision.amp else 0,
                      state=FP32 if precision.amp else precision.param_bytes, compute=c)
    if strategy.is_fsdp and fsdp is not None:
        return Dtypes(param=fsdp.storage, grad=fsdp.storage, master=0, state=fsdp.storage,
                      compute=fsdp.param)
    pb = precision.param_bytes
    return Dtypes(param=pb, grad=pb, master=0, state=pb, compute=c)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shards:
    """Ways each model state is sharded (1: replicated on every rank)."""

    params: Any
    grads: Any
    optimizer: Any


def shards(strategy: Strategy, degree: Any, tp: int = 1) -> Shards:
    """ZeRO stage 1 shards the optimizer state, 2 also the gradients, 3 also the parameters;
    FSDP shards all three over its shard group (degree 1 for DDP / NO_SHARD). Tensor parallel
    splits every block matrix, the embedding and the head tp ways first (torchtitan: the
    norms stay replicated, under 0.01 % of a Llama's parameters, counted as split)."""
    if strategy is Strategy.ZERO1:
        return Shards(params=1, grads=1, optimizer=degree)
    if strategy is Strategy.ZERO2:
        return Shards(params=1, grads=degree, optimizer=degree)
    return Shards(params=degree * tp, grads=degree * tp, optimizer=degree * tp)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainDtypes:
    """Bytes per element of the trainable and frozen parameters' copies."""

    param: int
    grad: int
    state: int
    master: int
    frozen: int
    """A frozen parameter as stored (not quantized)."""


def train_dtypes(ft: FineTune, d: Dtypes, zero: bool, amp: bool) -> TrainDtypes:
    """Full training keeps the strategy's dtypes. Under LoRA (peft) the base is loaded in the
    low precision and frozen; the adapters are fp32 (``autocast_adapter_dtype=True``) or the
    base's dtype, and torch.optim keeps state (and the gradient) in the parameter's dtype;
    DeepSpeed adds an fp32 master only for low-precision adapters."""
    if not ft.lora:
        return TrainDtypes(param=d.param, grad=d.grad, state=d.state, master=d.master,
                           frozen=d.param)
    p = FP32 if ft.lora_fp32 else d.compute
    return TrainDtypes(param=p, grad=p, state=p, frozen=d.compute,
                       master=FP32 if zero and amp and not ft.lora_fp32 else 0)


def grad_counts(model: ModelSpec, training: TrainingSpec, strategy: Strategy) -> Trainable:
    """The elements that get a gradient, as a ``Trainable`` (its trainable counts replaced):
    the trainable ones, except under FSDP1 with ``--flat-params mixed``, where a unit with
    any trainable tensor has a gradient over its whole flat parameter, frozen elements
    included (torch 2.13 ``_flat_param.py:806-832``: with use_orig_params the FlatParameter's
    requires_grad is the OR over its tensors, and the original parameters are views of it,
    so autograd accumulates one full-size gradient into it; ``_runtime_utils.py:743-746``
    keeps that unsharded gradient under no_sync, else casts it to reduce_dtype and
    reduce-scatters all of it, ``_reduce_grad``). The optimizer state stays the trainable
    parameters' (the optimizer holds the original parameters)."""
    T = trainable(model, training.finetune)
    if not (strategy.is_fsdp and training.fsdp_version == 1
            and training.flat_params is FlatParams.MIXED):
        return T
    block = T.frozen_per_block + T.quant_per_block + T.train_per_block
    root = max(count(model).root, T.train_root)
    return dataclasses.replace(T, train_per_block=block if T.train_per_block else 0,
                               train_root=root if T.train_root else 0)


def expert_padding(groups: Any, shard: Any) -> Any:
    """Elements one rank holds beyond an even split, from FSDP2's dim-0 sharding of the
    stacked MoE expert weights (E, ., .): ``torch.chunk`` along dim 0 gives each rank
    ceil(E / n) experts' rows, padded up to that on the ranks with fewer
    (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``: ``_init_sharded_param`` pads the
    local shard to the chunk size). Past n > E each rank holds a whole expert where an even
    split would give it E / n of one."""
    extra = 0
    for name, shape, k in groups:
        if name.startswith("mlp.w_") and len(shape) == 3:
            rest = shape[1] * shape[2]
            extra = extra + k * (ceil_div(shape[0], shard) * rest - ceil_div(shape[0] * rest,
                                                                            shard))
    return extra


PER_ELEM = {OptimizerKind.ADAM: 2, OptimizerKind.ADAMW: 2, OptimizerKind.ONEBIT_ADAM: 2,
            OptimizerKind.ZERO_ONE_ADAM: 3, OptimizerKind.ONEBIT_LAMB: 3}
"""State tensors of the parameter's size per element: Adam's exp_avg and exp_avg_sq; 0/1
Adam adds ``momentum_accumulator`` (``zoadam.py`` l. 196), 1-bit LAMB ``exp_avg_sq_fresh``
(``lamb.py`` l. 217); one for the rest (SGD momentum, Lion)."""


def optimizer_state_bytes(model: ModelSpec, optimizer: OptimizerKind, state_bytes: int,
                          shard: Any, groups: Any = None) -> Any:
    """Optimizer state held for 1/shard of every trainable tensor (dim-0 shards); ``groups``
    defaults to every parameter of the model."""
    groups = tensor_groups(model) if groups is None else groups
    if optimizer is OptimizerKind.SGD:
        return 0
    if optimizer is OptimizerKind.ADAFACTOR:
        # torch.optim.Adafactor factors the second moment of >= 2-D params: row and column
        # statistics of the local (dim-0) shard; 1-D params keep a full second moment.
        total = 0
        for _, shape, k in groups:
            if len(shape) >= 2:
                total += k * (ceil_div(shape[0], shard) * numel(shape[1:-1]) + shape[-1])
            else:
                total += k * ceil_div(shape[0], shard)
        return total * state_bytes
    elems = sum(k * ceil_div(numel(s), shard) for _, s, k in groups)
    if optimizer is OptimizerKind.ADAMW_8BIT:
        # bitsandbytes 8-bit blockwise: two uint8 states + one fp32 absmax per 2048 values
        # per state (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
        return 2 * elems + 2 * FP32 * ceil_div(elems, 2048)
    per_elem = PER_ELEM.get(optimizer, 1)
    # Adam(W): exp_avg, exp_avg_sq; SGD momentum: momentum_buffer; Lion: exp_avg; DeepSpeed's
    # 1-bit optimizers: planner/onebit.py adds their error buffers
    return per_elem * elems * state_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Resident:
    """Model states on one GPU between steps, and what offload keeps on the host."""

    params: Any
    gradients: Any
    """Every gradient after backward (0 when offload streams them to the host)."""
    optimizer_states: Any
    """Optimizer state plus DeepSpeed's fp32 master copy (and BF16_Optimizer's fp32 gradient
    accumulation buffer, planner/memory/zero.py ``bf16_states``)."""
    optimizer_temporaries: Any
    host_per_rank: Any
    """Bytes one rank keeps in host RAM (offload)."""


def quantized_bytes(elems: Any, rows: Any, ft: FineTune, shard: Any) -> Any:
    """A quantized base's block linears on one GPU.

    NF4 (bitsandbytes ``quantize_4bit``, blocksize 64): 4-bit codes (0.5 B per element,
    sharded with the weights) and an fp32 absmax per 64 elements, or, double quantized
    (QLoRA's recipe), an 8-bit absmax per 64 plus an fp32 one per 256 of those blocks. The
    constants are ``QuantState`` metadata, not parameters, so FSDP does not shard them
    (Answer.AI's FSDP+QLoRA shards the packed bf16 storage only). LLM.int8: 1 B per element
    and an fp32 scale per output row (``SCB``).
    """
    if ft.quantize_base is Quantize.INT8:
        return ceil_div(elems, shard) + rows * FP32
    consts = elems // 64 + FP32 * ceil_div(elems // 64, 256) if ft.double_quant \
        else FP32 * (elems // 64)
    return ceil_div(elems, 2 * shard) + consts


def resident(model: ModelSpec, training: TrainingSpec, counts: ParamCounts,
             candidate: Candidate, d: Dtypes, sh: Shards) -> Resident:
    ft = training.finetune
    T = trainable(model, ft)
    zero = candidate.strategy.is_zero
    td = train_dtypes(ft, d, zero, training.precision.amp)
    train_param_b, grad_b, state_b, master_b = td.param, td.grad, td.state, td.master
    if zero:  # bf16_master_weights_and_grads / bf16_optimizer_states (planner/memory/zero.py)
        master_b, state_b = master_bytes(training.deepspeed, master_b, state_b)
    frozen_b = td.frozen
    frozen = T.frozen(model.n_layers)
    quant = T.quant_per_block * model.n_layers
    params = (ceil_div(frozen, sh.params) * frozen_b + ceil_div(T.train, sh.params) * train_param_b
              + (quantized_bytes(quant, T.quant_rows_per_block * model.n_layers, ft, sh.params)
                 if quant else 0))
    grads = ceil_div(grad_counts(model, training, candidate.strategy).train, sh.grads) * grad_b
    local_opt = ceil_div(T.train, sh.optimizer)
    if model.is_moe and candidate.strategy.is_fsdp and training.fsdp_version == 2:
        pad = expert_padding(T.groups, sh.params)  # params, grads and state alike
        if training.ep > 1:  # torchtitan's EP places the experts its own way
            from planner.expert_parallel import ep_expert_padding

            pad = ep_expert_padding(T.groups, training.ep, sh.params)
        params, grads, local_opt = (params + pad * train_param_b, grads + pad * grad_b,
                                    local_opt + pad)
        pad_state = optimizer_state_bytes(model, training.optimizer, state_b, 1,
                                          (("pad", (1,), pad),))
    else:
        pad_state = 0
    states = (pad_state
              + optimizer_state_bytes(model, training.optimizer, state_b, sh.optimizer, T.groups)
              + local_opt * master_b)
    largest = max((numel(s) for _, s, _ in T.groups), default=0)
    temps = optimizer_temp_bytes(largest, local_opt, training, state_b, zero, sh.optimizer)
    if zero:
        # DeepSpeed's engine: planner/memory/zero.py (docs/model.md "DeepSpeed ZeRO")
        zs = zero_states(model, training, candidate.strategy, candidate.offload, T,
                         grad_b=grad_b, param_b=d.param, states=states, degree=sh.optimizer,
                         temps=zero_step_temps(candidate.strategy, training, local_opt,
                                               largest, sh.optimizer, state_b,
                                               ordered_sizes(model, T)), master_b=master_b)
        on_host = candidate.offload is not Offload.NONE
        return Resident(params=(0 if candidate.offload is Offload.PARAMS_AND_OPTIMIZER
                                else params) + zs.persistent_params,
                        gradients=zs.gradients,
                        optimizer_states=(0 if on_host else states) + zs.acc_buffer,
                        optimizer_temporaries=zs.optimizer_temporaries,
                        host_per_rank=zs.host_per_rank)
    # (optimizer-only offload exists for ZeRO alone: planner/memory/zero.py above)
    if candidate.offload is Offload.PARAMS_AND_OPTIMIZER:
        # FSDP2 CPUOffloadPolicy: sharded params, grads and optimizer
        # state in pinned host memory; only unsharded working copies live on the GPU.
        return Resident(params=0, gradients=0, optimizer_states=0, optimizer_temporaries=0,
                        host_per_rank=params + grads + states)
    return Resident(params=params, gradients=grads, optimizer_states=states,
                    optimizer_temporaries=temps, host_per_rank=0)
