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

from planner.spec import FineTune, ModelSpec, NormKind, PositionKind, Quantize

Shape = tuple[int, ...]


def _norm(prefix: str, model: ModelSpec) -> Iterator[tuple[str, Shape]]:
    yield f"{prefix}.weight", (model.hidden,)
    if model.norm is NormKind.LAYERNORM:
        yield f"{prefix}.bias", (model.hidden,)


def _linear(prefix: str, out_f: int, in_f: int, bias: bool) -> Iterator[tuple[str, Shape]]:
    yield f"{prefix}.weight", (out_f, in_f)
    if bias:
        yield f"{prefix}.bias", (out_f,)


def block_tensors(model: ModelSpec, prefix: str = "") -> Iterator[tuple[str, Shape]]:
    """One transformer block's parameters (all blocks are identical)."""
    h, f = model.hidden, model.ffn_hidden
    yield from _norm(f"{prefix}norm1", model)
    qkv_bias = model.bias or model.qkv_bias
    yield from _linear(f"{prefix}attn.q", model.q_dim, h, qkv_bias)
    yield from _linear(f"{prefix}attn.k", model.kv_dim, h, qkv_bias)
    yield from _linear(f"{prefix}attn.v", model.kv_dim, h, qkv_bias)
    yield from _linear(f"{prefix}attn.o", h, model.q_dim, model.bias)
    if model.norms_per_layer >= 2:
        yield from _norm(f"{prefix}norm2", model)
    if model.norms_per_layer >= 4:  # Gemma-2 sandwich: post-attention and post-MLP norms
        yield from _norm(f"{prefix}norm3", model)
        yield from _norm(f"{prefix}norm4", model)
    if model.is_moe:
        e = model.n_experts
        yield f"{prefix}mlp.router.weight", (e, h)
        if model.mlp.gated:
            yield f"{prefix}mlp.w_gate", (e, f, h)
        yield f"{prefix}mlp.w_up", (e, f, h)
        yield f"{prefix}mlp.w_down", (e, h, f)
        return
    if model.mlp.gated:
        yield from _linear(f"{prefix}mlp.gate", f, h, model.bias)
    yield from _linear(f"{prefix}mlp.up", f, h, model.bias)
    yield from _linear(f"{prefix}mlp.down", h, f, model.bias)


def root_tensors(model: ModelSpec) -> Iterator[tuple[str, Shape]]:
    """Parameters outside the blocks: embeddings, final norm, output head."""
    h = model.hidden
    yield "embed.weight", (model.vocab, h)
    if model.position is PositionKind.LEARNED:
        yield "pos_embed.weight", (model.max_positions, h)
    if model.type_vocab:
        yield "type_embed.weight", (model.type_vocab, h)
    if model.embedding_norm:
        yield from _norm("embed_norm", model)
    if model.encoder_head:
        # BERT: pooler, then the MLM transform (dense + norm) and a decoder bias; the decoder
        # weight is the (tied) embedding. BERT is post-norm, so it has no final norm.
        yield from _linear("pooler", h, h, True)
        yield from _linear("head.dense", h, h, True)
        yield from _norm("head.norm", model)
        if not model.tied_embeddings:
            yield "lm_head.weight", (model.vocab, h)
        yield "lm_head.bias", (model.vocab,)
        return
    yield from _norm("final_norm", model)
    if not model.tied_embeddings:
        yield "lm_head.weight", (model.vocab, h)


def param_tensors(model: ModelSpec) -> list[tuple[str, Shape]]:
    """Every parameter tensor, in module registration order of the reference module."""
    out = [t for t in root_tensors(model) if t[0].startswith(("embed", "pos_", "type_"))]
    for i in range(model.n_layers):
        out.extend(block_tensors(model, f"blocks.{i}."))
    out.extend(t for t in root_tensors(model) if not t[0].startswith(("embed", "pos_", "type_")))
    return out


@functools.lru_cache(maxsize=1024)
def tensor_groups(model: ModelSpec) -> tuple[tuple[str, Shape, int], ...]:
    """(name, shape, how many) with every block's tensors listed once: the fast path for
    sums over all parameters (param_tensors lists n_layers copies)."""
    out = [(n, s, model.n_layers) for n, s in block_tensors(model)]
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
    root: int
    largest_tensor: int
    """Elements of the largest single parameter tensor (single-tensor optimizer temporaries)."""
    largest_block_tensor: int
    """Elements of the largest tensor inside a block (the typical per-parameter gradient)."""
    per_block_active: int
    """Per-block parameters a token actually multiplies (MoE: router + experts_per_token)."""


@functools.lru_cache(maxsize=1024)
def count(model: ModelSpec) -> ParamCounts:
    block = [numel(s) for _, s in block_tensors(model)]
    root = [numel(s) for _, s in root_tensors(model)]
    per_block = sum(block)
    if model.is_moe:
        e, k = model.n_experts, model.experts_per_token
        expert = sum(numel(s) for n, s in block_tensors(model) if n.startswith("mlp.w_"))
        per_block_active = per_block - expert + expert * k // e
    else:
        per_block_active = per_block
    return ParamCounts(
        per_block=per_block,
        root=sum(root),
        largest_tensor=max(block + root),
        largest_block_tensor=max(block),
        per_block_active=per_block_active,
    )


def total_params(model: ModelSpec) -> int:
    c = count(model)
    return c.per_block * model.n_layers + c.root


def active_params(model: ModelSpec) -> int:
    """Parameters used per token (differs from total for MoE)."""
    c = count(model)
    return c.per_block_active * model.n_layers + c.root


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

    @property
    def train(self) -> int:
        return self.train_per_block * self.train_blocks + self.train_root


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
        missing = [m for m in ft.lora_targets if m not in dims]
        if missing:
            raise ValueError(f"this model has no {', '.join(missing)} projection "
                             f"(it has {', '.join(dims)})")
        r = ft.lora_rank
        groups = []
        for m in ft.lora_targets:
            i, o = dims[m]
            groups += [(f"lora.{m}.A", (r, i), model.n_layers), (f"lora.{m}.B", (o, r),
                                                                  model.n_layers)]
        return Trainable(
            groups=tuple(groups), train_per_block=sum(numel(s) for _, s, _ in groups),
            train_blocks=model.n_layers, train_root=0,
            frozen_per_block=per_block - (lin_elems if quant else 0),
            quant_per_block=lin_elems if quant else 0,
            quant_rows_per_block=sum(s[0] for _, s in lin) if quant else 0,
            frozen_root=sum(numel(s) for _, s in root), largest_linear=largest_linear)
    n_frozen = min(ft.freeze_layers, model.n_layers)
    frozen_root_names = set()
    if ft.freeze_embeddings:
        frozen_root_names = {n for n, _ in root if n.split(".")[0] in ("embed", "pos_embed",
                                                                       "type_embed")}
        if model.tied_embeddings:
            frozen_root_names.add("lm_head.weight")  # the tied head is the embedding
    groups = [(n, s, model.n_layers - n_frozen) for n, s in block if n_frozen < model.n_layers]
    groups += [(n, s, 1) for n, s in root if n not in frozen_root_names]
    frozen_root = sum(numel(s) for n, s in root if n in frozen_root_names)
    return Trainable(
        groups=tuple(groups), train_per_block=per_block, train_blocks=model.n_layers - n_frozen,
        train_root=sum(numel(s) for _, s in root) - frozen_root,
        frozen_per_block=0, quant_per_block=0, quant_rows_per_block=0,
        frozen_root=frozen_root, largest_linear=largest_linear)
