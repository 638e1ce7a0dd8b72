"""Parameter tensors of a ModelSpec, named and shaped as the reference module in probes/models.py.

The reference module is a plain pre-norm transformer: ``embed`` (+ ``pos_embed``,
``type_embed``, ``embed_norm``), ``blocks.{i}`` and the root's ``final_norm`` / ``lm_head``
(or BERT's masked-LM head and pooler). FSDP wraps each block as one unit and the root as
another, so the grouping below is also the all-gather unit structure the memory model uses.
Shapes are (out_features, in_features) as nn.Linear stores them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from planner.arch import variants_of
from planner.arch.base import Shape
from planner.arch.base import linear as _linear
from planner.spec import (
    LINEAR_MODULES,
    FineTune,
    ModelSpec,
    Quantize,
)


def block_tensors(model: ModelSpec, prefix: str = "", *,
                  dense: bool = False) -> Iterator[tuple[str, Shape]]:
    """One transformer block's parameters: the typical block (with experts for MoE), or with
    ``dense`` one of an MoE model's dense-MLP blocks (n_dense_layers of them). Each variant
    lists its own (planner/arch/)."""
    return variants_of(model).block_params(model, prefix, dense)


def root_tensors(model: ModelSpec) -> Iterator[tuple[str, Shape]]:
    """Parameters outside the blocks: embeddings, final norm, output head."""
    h = model.hidden
    arch = variants_of(model)
    yield "embed.weight", (model.vocab, h)
    yield from arch.position.params(model)
    if model.type_vocab:
        yield "type_embed.weight", (model.type_vocab, h)
    if model.embedding_norm:
        yield from arch.norm.params(model, "embed_norm")
    if model.encoder_head:
        # BERT: pooler (BertForPreTraining; not BertForMaskedLM), then the MLM transform
        # (dense + norm) and a decoder bias; the decoder weight is the (tied) embedding.
        # BERT is post-norm, so it has no final norm.
        if model.pooler:
            yield from _linear("pooler", h, h, True)
        yield from _linear("head.dense", h, h, True)
        yield from arch.norm.params(model, "head.norm")
        if not model.tied_embeddings:
            yield "lm_head.weight", (model.vocab, h)
        yield "lm_head.bias", (model.vocab,)
        return
    yield from arch.norm.params(model, "final_norm")
    if not model.tied_embeddings:
        yield "lm_head.weight", (model.vocab, h)
    if model.head_bias:
        yield "lm_head.bias", (model.vocab,)


def param_tensors(model: ModelSpec) -> list[tuple[str, Shape]]:
    """Every parameter tensor, in module registration order of the reference module (an MoE
    model's dense blocks first, as DeepSeek's first_k_dense_replace)."""
    out = [t for t in root_tensors(model) if t[0].startswith(("embed", "pos_", "type_"))]
    for i in range(model.n_layers):
        out.extend(block_tensors(model, f"blocks.{i}.", dense=i < model.n_dense_layers))
    out.extend(t for t in root_tensors(model) if not t[0].startswith(("embed", "pos_", "type_")))
    return out


@functools.lru_cache(maxsize=1024)
def tensor_groups(model: ModelSpec) -> tuple[tuple[str, Shape, int], ...]:
    """(name, shape, how many) with every block's tensors listed once: the fast path for
    sums over all parameters (param_tensors lists n_layers copies)."""
    nd = model.n_dense_layers
    out = [(n, s, model.n_layers - nd) for n, s in block_tensors(model)]
    if nd:
        out += [(n, s, nd) for n, s in block_tensors(model, dense=True)]
    out += [(n, s, 1) for n, s in root_tensors(model)]
    return tuple(out)


def numel(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Element counts, grouped as FSDP units: one per block plus the root."""

    per_block: int
    """One typical block (with its experts for MoE): the largest all-gather unit."""
    root: int
    largest_tensor: int
    """Elements of the largest single parameter tensor (single-tensor optimizer temporaries)."""
    largest_block_tensor: int
    """Elements of the largest tensor inside a block (the typical per-parameter gradient)."""
    per_block_active: int
    """Per-block parameters a token actually multiplies (MoE: router + experts_per_token)."""
    blocks_total: int = 0
    """All blocks together (differs from per_block x n_layers when an MoE model has dense
    blocks)."""
    blocks_active: int = 0


def _active(model: ModelSpec, tensors: list[tuple[str, Shape]]) -> int:
    """A block's parameters a token multiplies: routed experts weighted by top-k / experts
    (shared experts always run)."""
    total = sum(numel(s) for _, s in tensors)
    if not model.is_moe:
        return total
    e, k = model.n_experts, model.experts_per_token
    expert = sum(numel(s) for n, s in tensors if n.startswith("mlp.w_"))
    return total - expert + expert * k // e


@functools.lru_cache(maxsize=1024)
def count(model: ModelSpec) -> ParamCounts:
    tensors = list(block_tensors(model))
    dense = list(block_tensors(model, dense=True)) if model.n_dense_layers else []
    block = [numel(s) for _, s in tensors]
    root = [numel(s) for _, s in root_tensors(model)]
    nd = model.n_dense_layers
    per_block = sum(block)
    dense_total = sum(numel(s) for _, s in dense)
    return ParamCounts(
        per_block=per_block,
        root=sum(root),
        largest_tensor=max(block + root),
        largest_block_tensor=max(block + [numel(s) for _, s in dense]),
        per_block_active=_active(model, tensors),
        blocks_total=per_block * (model.n_layers - nd) + dense_total * nd,
        blocks_active=_active(model, tensors) * (model.n_layers - nd) + dense_total * nd,
    )


def total_params(model: ModelSpec) -> int:
    c = count(model)
    return c.blocks_total + c.root


def active_params(model: ModelSpec) -> int:
    """Parameters used per token (differs from total for MoE)."""
    c = count(model)
    return c.blocks_active + c.root


# ---------------------------------------------------------------------------------------------
# What trains (planner.spec.FineTune)


def linear_dims(model: ModelSpec) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each block linear a LoRA adapter may target."""
    h, f, q, kv = model.hidden, model.ffn_hidden, model.q_dim, model.kv_dim
    dims = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "up": (h, f), "down": (f, h)}
    if model.mlp.gated:
        dims["gate"] = (h, f)
    return dims


def _is_linear_weight(name: str) -> bool:
    """A block linear's weight (what bitsandbytes quantizes): attention and MLP matrices."""
    return name.endswith(".weight") and name.split(".")[0] in ("attn", "mlp") \
        and "router" not in name


@dataclass(frozen=True, slots=True)
class Trainable:
    """Element counts by role, for a model under a fine-tuning setup."""

    groups: tuple[tuple[str, Shape, int], ...]
    """Trainable tensors: (name, shape, how many), as tensor_groups."""
    train_per_block: int
    """Trainable elements of one trainable block (adapters under LoRA)."""
    train_blocks: int
    """Blocks whose parameters (or adapters) train."""
    train_root: int
    frozen_per_block: int
    """Frozen elements of a block kept in the base dtype (not quantized)."""
    quant_per_block: int
    """Frozen block-linear elements stored quantized (QLoRA)."""
    quant_rows_per_block: int
    """Output rows of those linears (LLM.int8 keeps one fp32 scale per row)."""
    frozen_root: int
    largest_linear: int
    """Elements of the largest block linear (its dequantized copy is a transient)."""

    train_dense_delta: int = 0
    """An MoE model's trainable dense blocks: their elements minus as many typical blocks
    (planner.params.count)."""
    frozen_whole_blocks: int = 0
    """Blocks frozen whole (--freeze N-layers): every element stored in the base dtype."""
    block_elems: int = 0
    """Elements of one block."""
    frozen_dense_delta: int = 0
    """Frozen dense blocks of an MoE model (DeepSeek's first layers): their elements minus as
    many typical blocks."""

    @property
    def train(self) -> int:
        return self.train_per_block * self.train_blocks + self.train_root + self.train_dense_delta

    def frozen(self, n_layers: int) -> int:
        """Frozen elements kept in the base dtype (not quantized): the frozen part of every
        block, whole frozen blocks and the frozen root tensors."""
        return (self.frozen_per_block * n_layers + self.frozen_whole_blocks * self.block_elems
                + self.frozen_root + self.frozen_dense_delta)


@functools.lru_cache(maxsize=1024)
def trainable(model: ModelSpec, ft: FineTune) -> Trainable:
    """What trains and what is frozen (and quantized) under ``ft``.

    LoRA (peft ``LoraLayer``): every base parameter is frozen; each targeted linear (in -> out)
    gets A (r x in) and B (out x r), r·(in + out) trainable elements. A quantized base keeps
    its block linears' weights in 4 or 8 bits. Frozen embeddings (a tied head with them) and
    first blocks keep their parameters and get no gradient or optimizer state.
    """
    block = list(block_tensors(model))
    root = list(root_tensors(model))
    per_block = sum(numel(s) for _, s in block)
    lin = [(n, s) for n, s in block if _is_linear_weight(n)]
    lin_elems = sum(numel(s) for _, s in lin)
    quant = ft.quantize_base is not Quantize.NONE
    largest_linear = max((numel(s) for _, s in lin), default=0)
    if ft.lora:
        if model.is_moe and {"gate", "up", "down"} & set(ft.lora_targets):
            raise ValueError("LoRA on MoE experts is not modelled; target attention (q,k,v,o)")
        dims = linear_dims(model)
        # "all-linear" (every name) adapts the linears the model has: no gate without SwiGLU
        every = set(ft.lora_targets) == set(LINEAR_MODULES)
        missing = [m for m in ft.lora_targets if m not in dims and not every]
        if missing:
            raise ValueError(f"this model has no {', '.join(missing)} projection "
                             f"(it has {', '.join(dims)})")
        r = ft.lora_rank
        groups = []
        for m in (t for t in ft.lora_targets if t in dims):
            i, o = dims[m]
            groups += [(f"lora.{m}.A", (r, i), model.n_layers), (f"lora.{m}.B", (o, r),
                                                                  model.n_layers)]
        return Trainable(
            groups=tuple(groups), train_per_block=sum(numel(s) for _, s, _ in groups),
            train_blocks=model.n_layers, train_root=0,
            frozen_per_block=per_block - (lin_elems if quant else 0),
            quant_per_block=lin_elems if quant else 0,
            quant_rows_per_block=sum(s[0] for _, s in lin) if quant else 0,
            frozen_root=sum(numel(s) for _, s in root), largest_linear=largest_linear,
            frozen_dense_delta=_dense_delta(model, model.n_dense_layers, per_block))
    n_frozen = ft.frozen_blocks(model.n_layers)
    frozen_root_names = set()
    if ft.train_last_layers:
        # only the last blocks train (LLaMA-Factory freeze tuning): embeddings, final norm
        # and head are frozen too
        frozen_root_names = {n for n, _ in root}
    elif ft.freeze_embeddings:
        frozen_root_names = {n for n, _ in root if n.split(".")[0] in ("embed", "pos_embed",
                                                                       "type_embed")}
        if model.tied_embeddings:
            frozen_root_names.add("lm_head.weight")  # the tied head is the embedding
    groups = [(n, s, model.n_layers - n_frozen) for n, s in block if n_frozen < model.n_layers]
    dense_delta = 0
    nd = max(0, model.n_dense_layers - n_frozen)  # an MoE model's dense blocks come first
    if nd:
        groups = [(n, s, k - nd) for n, s, k in groups if k > nd]
        groups += [(n, s, nd) for n, s in block_tensors(model, dense=True)]
        dense_delta = nd * (sum(numel(s) for _, s in block_tensors(model, dense=True))
                            - per_block)
    groups += [(n, s, 1) for n, s in root if n not in frozen_root_names]
    frozen_root = sum(numel(s) for n, s in root if n in frozen_root_names)
    return Trainable(
        groups=tuple(groups), train_per_block=per_block, train_blocks=model.n_layers - n_frozen,
        train_root=sum(numel(s) for _, s in root) - frozen_root,
        frozen_per_block=0, quant_per_block=0, quant_rows_per_block=0,
        frozen_root=frozen_root, largest_linear=largest_linear, train_dense_delta=dense_delta,
        frozen_whole_blocks=n_frozen, block_elems=per_block,
        frozen_dense_delta=_dense_delta(model, min(n_frozen, model.n_dense_layers), per_block))


def _dense_delta(model: ModelSpec, n: int, per_block: int) -> int:
    """n dense blocks of an MoE model minus as many typical (MoE) blocks, in elements."""
    if n <= 0:
        return 0
    return n * (sum(numel(s) for _, s in block_tensors(model, dense=True)) - per_block)
