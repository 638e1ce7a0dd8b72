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

from planner.spec import ModelSpec, NormKind, PositionKind

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
