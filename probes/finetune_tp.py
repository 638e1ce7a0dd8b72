"""Fine-tuning and tensor parallel on the reference transformer, for the trace (issue 15).

``apply_finetune(net, spec, ft, precision)`` (on the meta-device module, before sharding):

* LoRA (``ft.lora_rank`` > 0): every target linear of every block (``ft.lora_targets`` by
  the planner's names q, k, v, o, gate, up, down) becomes a ``LoraLinear``: the frozen base
  layer plus ``lora_A`` (r x in) and ``lora_B`` (out x r), computed as peft's
  ``lora.Linear.forward`` does (peft/tuners/lora/layer.py): ``result = base(x)``, the input
  cast to the adapter's dtype (``_cast_input_dtype``), ``result + lora_B(lora_A(dropout(x)))
  * scaling``, then cast back to the base result's dtype. ``ft.lora_dropout``: an
  dropout of p = 0.05 as ``aten.native_dropout`` (CUDA's path, a bool mask saved;
  peft's ``nn.Identity`` at p = 0). Everything else in the model is
  frozen (``requires_grad=False``), as peft's ``get_peft_model`` leaves it.
  ``ft.lora_fp32``: the adapters stay fp32 under pure bf16 (peft's
  ``autocast_adapter_dtype=True``); the parameters are marked ``_fitcheck_fp32`` so the
  trace's bf16 cast skips them.
* A quantized base (``ft.quantize_base`` nf4 / int8, QLoRA): bitsandbytes' kernels cannot run
  on fake tensors, so every block linear (transformers' ``replace_with_bnb_linear`` quantizes
  all ``nn.Linear`` but the output head) becomes a ``QuantLinear`` stand-in with the same
  memory: the packed codes as a frozen parameter in bf16 storage (``bnb_4bit_quant_storage=
  bfloat16``, which FSDP needs to shard them, Answer.AI's FSDP+QLoRA), 0.5 B per element for
  nf4 and 1 B for int8, sharded by FSDP; the quantization constants as buffers (bnb keeps
  them in ``QuantState``, not a parameter, so FSDP does not shard them): nf4 an fp32 absmax
  per 64 elements, or double quantized a uint8 absmax per 64 plus an fp32 one per 256 of
  those; int8 an fp32 scale per output row (``SCB``). Forward
  and backward each dequantize the weight to a bf16 (out, in) temporary, use it and free it
  (bitsandbytes/autograd/_functions.py ``MatMul4Bit``: forward computes
  ``linear(A, dequantize_4bit(B, quant_state).to(A.dtype).t())`` and saves only the
  quantized ``B``; backward dequantizes again for ``grad_A``).
* Frozen parameters without LoRA: ``ft.freeze_embeddings`` (the embedding table; a tied head
  with it), ``ft.freeze_layers`` (the first N blocks), ``ft.train_last_layers``.

``tp_parallelize(net, spec, candidate, precision)`` returns the function that puts the model
on a 2-D fake mesh (dp x tp): tensor parallel with sequence parallel as torchtitan's
``parallelize_llama`` ``apply_tp`` does (torchtitan/models/llama3/infra/parallelize.py):
embedding ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))``; norms
``SequenceParallel()``; the attention/MLP input redistributed once from Shard(1) to
Replicate (torchtitan's ``PrepareModuleInput`` on ``attention`` / ``feed_forward``: here on
the norm's output, because the reference block calls its projections directly); q/k/v and
gate/up ``ColwiseParallel``; o and down ``RowwiseParallel(output_layouts=Shard(1))``; the
output head ``ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
use_local_output=False)`` with the loss under ``loss_parallel()``. Then FSDP2
``fully_shard`` per block and on the root over the mesh's "dp" dimension.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from planner.spec import Candidate, FineTune, ModelSpec, Precision, Quantize, Strategy

__all__ = ["LoraLinear", "QuantLinear", "apply_finetune", "apply_tp_plan", "tp_parallelize"]

_TARGETS = {"q": ("attn", "q"), "k": ("attn", "k"), "v": ("attn", "v"), "o": ("attn", "o"),
            "gate": ("mlp", "gate"), "up": ("mlp", "up"), "down": ("mlp", "down")}
LORA_DROPOUT = 0.05
"""The dropout probability when ``lora_dropout`` is on (peft's examples; any p > 0 keeps the
same memory)."""


class _Dequant4bitMatmul(torch.autograd.Function):
    """bitsandbytes ``MatMul4Bit`` memory: a bf16 dequantized weight per use, only the
    quantized storage saved."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, packed: torch.Tensor, consts: torch.Tensor,
                out_features: int, in_features: int, double_quant: bool) -> torch.Tensor:
        w = _dequantize(packed, consts, out_features, in_features, x.dtype, double_quant)
        y = x @ w.t()
        del w
        ctx.save_for_backward(packed, consts)
        ctx.shape = (out_features, in_features, double_quant)
        return y

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        packed, consts = ctx.saved_tensors
        o, i, dq = ctx.shape
        w = _dequantize(packed, consts, o, i, grad.dtype, dq)
        return grad @ w, None, None, None, None, None


def _dequantize(packed: torch.Tensor, consts: torch.Tensor, o: int, i: int,
                dtype: torch.dtype, double_quant: bool) -> torch.Tensor:
    """The (o, i) dequantized weight (bitsandbytes ``dequantize_4bit``: with double
    quantization the absmax is first dequantized to an fp32 temporary)."""
    if double_quant:
        absmax = consts.float()  # noqa: F841 - the fp32 absmax bnb's dequantize allocates
    return torch.empty((o, i), dtype=dtype, device=packed.device)


class QuantLinear(nn.Module):
    """A frozen bitsandbytes ``Linear4bit`` / ``Linear8bitLt`` stand-in (module doc)."""

    def __init__(self, base: nn.Linear, quant: Quantize, double_quant: bool) -> None:
        super().__init__()
        o, i = base.out_features, base.in_features
        n = o * i
        self.out_features, self.in_features = o, i
        self.double_quant = quant is Quantize.NF4 and double_quant
        per_elem_bytes = 1 if quant is Quantize.INT8 else 0.5
        # packed codes in bf16 storage (2 B per stored element), first dim = out rows so FSDP
        # shards it like a weight
        storage = int(n * per_elem_bytes) // 2
        self.weight = nn.Parameter(torch.empty(storage, 1, dtype=torch.bfloat16,
                                               device=base.weight.device), requires_grad=False)
        if quant is Quantize.INT8:
            consts = torch.empty(o, dtype=torch.float32, device=base.weight.device)  # SCB
        elif self.double_quant:
            # uint8 absmax per 64 and an fp32 absmax per 256 of those blocks (the 256-entry
            # dynamic code is one cached tensor per device in bnb, not per layer)
            blocks = n // 64
            consts = torch.empty(blocks + 4 * (-(-blocks // 256)),
                                 dtype=torch.uint8, device=base.weight.device)
        else:
            consts = torch.empty(n // 64, dtype=torch.float32, device=base.weight.device)
        self.register_buffer("quant_consts", consts, persistent=False)
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach(),
                                                                requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Dequant4bitMatmul.apply(x, self.weight, self.quant_consts, self.out_features,
                                     self.in_features, self.double_quant)
        return y if self.bias is None else y + self.bias


class LoraLinear(nn.Module):
    """peft's ``lora.Linear`` around a frozen base layer (module doc)."""

    def __init__(self, base: nn.Module, in_features: int, out_features: int, rank: int,
                 dropout: bool, fp32: bool) -> None:
        super().__init__()
        self.base_layer = base
        dev = next(base.parameters()).device
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=dev)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=dev)
        self.p = LORA_DROPOUT if dropout else 0.0
        self.scaling = 2.0
        for p in (self.lora_A.weight, self.lora_B.weight):
            p._fitcheck_fp32 = fp32  # type: ignore[attr-defined]

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        # aten.native_dropout, CUDA's path: a bool mask saved (probes.models.dropout)
        from probes.models import dropout

        return dropout(x, self.p) if self.p and self.training else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        dtype = result.dtype
        x = x.to(self.lora_A.weight.dtype)  # peft _cast_input_dtype (a no-op when equal)
        result = result + self.lora_B(self.lora_A(self._dropout(x))) * self.scaling
        return result.to(dtype)


def _freeze(module: nn.Module) -> None:
    for p in module.parameters():
        p.requires_grad_(False)


def apply_finetune(net: nn.Module, spec: ModelSpec, ft: FineTune, precision: Precision) -> None:
    """Make ``net`` (probes.models.Transformer, on the meta device) the fine-tune ``ft``
    describes (module doc)."""
    if ft.full:
        return
    if ft.lora:
        _freeze(net)
        quant = ft.quantize_base
        for blk in net.blocks:
            for key, (parent_name, attr) in _TARGETS.items():
                parent = getattr(blk, parent_name)
                base = getattr(parent, attr, None)
                if not isinstance(base, nn.Linear):
                    continue  # no gate in an ungated MLP; MoE experts are not nn.Linear
                layer: nn.Module = base
                if quant is not Quantize.NONE:
                    layer = QuantLinear(base, quant, ft.double_quant)
                if key in ft.lora_targets:
                    layer = LoraLinear(layer, base.in_features, base.out_features,
                                       ft.lora_rank, ft.lora_dropout, ft.lora_fp32)
                setattr(parent, attr, layer)
        if precision.amp:
            # peft's recipes load the base in the compute dtype (``torch_dtype=bfloat16``)
            # and autocast over it; the adapters stay fp32 unless ``lora_fp32`` is off
            # (planner: ``train_dtypes``)
            low = torch.bfloat16 if precision is Precision.BF16_AMP else torch.float16
            for mod in net.modules():
                for name, p in mod._parameters.items():
                    if p is not None and p.is_floating_point() and (
                            not p.requires_grad or not ft.lora_fp32):
                        mod._parameters[name] = nn.Parameter(p.to(low), requires_grad=p.requires_grad)
        return
    if ft.embeddings_frozen:
        net.embed.requires_grad_(False)
    for blk in list(net.blocks)[:ft.frozen_blocks(spec.n_layers)]:
        _freeze(blk)
    if ft.head_frozen(spec.tied_embeddings) and hasattr(net, "lm_head"):
        net.lm_head.requires_grad_(False)


def apply_tp_plan(net: nn.Module, tp_mesh: Any, ep_moe: bool = False) -> None:
    """Tensor parallel with sequence parallel over ``tp_mesh`` on the reference transformer
    (module doc): the root's embedding / final norm / head and every block. Used by
    ``tp_parallelize`` and by the pipeline trace (probes/pipeline_trace.py), which applies it
    to the whole meta model before keeping a stage's modules.

    ``ep_moe``: the blocks' MLPs are expert parallel's MoE (probes/ep_trace.py ``EPMoE``),
    laid out as torchtitan does under EP x TP (b5bcd76, models/common/moe_sharding.py
    ``_moe_sharding_config`` / ``_router_sharding_config`` / ``_routed_experts_sharding_
    configs``: the sequence-parallel layout kept around the MoE): the MoE gets this rank's
    sequence shard as a local tensor (no all-gather) and returns its output as that shard of
    the residual stream (no reduce-scatter); its router and experts are not TP-sharded. Its
    shared experts are (``_shared_experts_sharding_configs``, lines 167-198: the parent
    FeedForward's input redistributed from the sequence shard to Replicate, w1 / w3
    colwise, w2 rowwise reduced to the sequence shard, where the routed output is added).
    A block whose MLP is dense (DeepSeek's dense first blocks: ``set_dense_ffn_sharding``,
    models/common/decoder_sharding.py lines 305-338) is laid out as without EP."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = tp_mesh.size()
    gather = PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Replicate(),
                                 use_local_output=True)
    parallelize_module(net, tp_mesh, {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "final_norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1),
                                   use_local_output=False),
    })
    def dense_plan(prefix: str, mlp: nn.Module) -> dict:
        gated = {f"{prefix}.gate": ColwiseParallel()} if hasattr(mlp, "gate") else {}
        return {**gated, f"{prefix}.up": ColwiseParallel(),
                f"{prefix}.down": RowwiseParallel(output_layouts=Shard(1))}

    # the residual stream between modules is the local sequence shard (the embedding's and
    # the row-parallel outputs' ``use_local_output``): the MoE takes and returns that
    local = PrepareModuleOutput(output_layouts=Shard(1), desired_output_layouts=Shard(1),
                                use_local_output=True)
    for blk in net.blocks:
        moe = ep_moe and hasattr(blk.mlp, "experts")
        mlp_plan = {} if moe else dense_plan("mlp", blk.mlp)
        if moe and blk.mlp.shared is not None:
            # the shared experts' parent: one all-gather of the MoE's sequence-shard input
            mlp_plan = {"mlp.shared": PrepareModuleInput(input_layouts=(Shard(1),),
                                                         desired_input_layouts=(Replicate(),),
                                                         use_local_output=True),
                        **dense_plan("mlp.shared", blk.mlp.shared)}
        parallelize_module(blk, tp_mesh, {
            "norm1": SequenceParallel(), "norm2": SequenceParallel(),
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=Shard(1)),
            **mlp_plan,
        })
        # torchtitan's PrepareModuleInput(Shard(1) -> Replicate) on attention and
        # feed_forward: one all-gather of the normed input, shared by the projections; under
        # EP the MoE keeps the sequence shard instead
        parallelize_module(blk, tp_mesh, {"norm1": gather, "norm2": local if moe else gather})
        attn = blk.attn
        attn.n_heads //= tp
        attn.n_kv //= tp
        attn.q_dim //= tp


def tp_parallelize(net: nn.Module, spec: ModelSpec, candidate: Candidate,
                   precision: Precision) -> Any:
    """(world_size, gpus_per_node) -> mesh shape: applies TP + FSDP2 (module doc)."""
    tp = candidate.tp
    if candidate.strategy not in (Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP):
        from probes.trace_types import UnsupportedConfig

        raise UnsupportedConfig(f"tensor parallel with {candidate.strategy.value}: traced "
                                "with full_shard / shard_grad_op over the dp dimension only")
    if spec.n_heads % tp or spec.n_kv_heads % tp or spec.ffn_hidden % tp or spec.vocab % tp:
        from probes.trace_types import UnsupportedConfig

        raise UnsupportedConfig(f"tp {tp} must divide heads ({spec.n_heads}), kv heads "
                                f"({spec.n_kv_heads}), ffn ({spec.ffn_hidden}) and vocab "
                                f"({spec.vocab})")
    if spec.tied_embeddings or spec.is_moe or spec.encoder_head or spec.parallel_block \
            or spec.mlp.value != "swiglu" or spec.norm.value != "rmsnorm":
        from probes.trace_types import UnsupportedConfig

        raise UnsupportedConfig("tensor parallel is traced on the Llama-style reference "
                                "model only (untied, dense SwiGLU, RMSNorm, sequential block)")

    def apply(world_size: int, gpus_per_node: int) -> tuple[int, ...]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if world_size % tp:
            from probes.trace_types import UnsupportedConfig

            raise UnsupportedConfig(f"world size {world_size} is not a multiple of tp {tp}")
        dp = world_size // tp
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        apply_tp_plan(net, mesh["tp"])
        low = {Precision.BF16_AMP: torch.bfloat16, Precision.FP16_AMP: torch.float16}.get(
            precision)
        mp = (MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
              if low is not None else MixedPrecisionPolicy())
        reshard = candidate.strategy is Strategy.FULL_SHARD
        for blk in net.blocks:
            fully_shard(blk, mesh=mesh["dp"], reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(net, mesh=mesh["dp"], reshard_after_forward=reshard, mp_policy=mp)
        return (dp, tp)

    return apply
