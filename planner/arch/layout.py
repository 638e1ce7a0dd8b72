"""Where a block's norms sit (the layout): pre-norm, Gemma-2's sandwich, OLMo-2's post-norm,
Falcon's parallel block with one shared norm. The layout orders the block's parts; the norm,
attention and MLP variants say what each part holds. Orders are the reference module's
(probes/models.py): its parameter registration order and its forward's."""

from __future__ import annotations

from collections.abc import Iterator

from planner.arch.base import Ctx, Saved, Shape


def _dropout(branch: str, m, x: Ctx) -> list[Saved]:
    """Dropout on a branch output before the residual add: native_dropout keeps a bool mask
    (aten/src/ATen/native/Dropout.cpp)."""
    return [Saved(f"{branch}.dropout_mask", x.t * m.hidden)] if m.dropout else []


class PreNorm:
    """x + attn(norm1(x)), then x + mlp(norm2(x)) (GPT-2, BERT as modelled, Llama; Falcon-40B's
    parallel block with two norms keeps the same tensors)."""

    __slots__ = ()

    def params(self, a, m, p: str, mlp) -> Iterator[tuple[str, Shape]]:
        yield from a.norm.params(m, f"{p}norm1")
        yield from a.attention.params(m, p)
        yield from a.norm.params(m, f"{p}norm2")
        yield from mlp.params(m, f"{p}mlp")

    def saved(self, a, m, x: Ctx) -> list[Saved]:
        out = a.norm.saved(m, x, "norm1", x.r)
        normed = a.norm.out_bytes(x)  # what q, k, v (and the MLP) read
        out += a.attention.saved(m, x, normed) + _dropout("attn", m, x)
        out += a.norm.saved(m, x, "norm2", x.r)
        return out + a.mlp.saved(m, x, normed) + _dropout("mlp", m, x)


class Sandwich(PreNorm):
    """Gemma-2 / Gemma-3: pre-norms, plus a norm on each branch output (norm3 after attention,
    norm4 after the MLP; transformers' Gemma2DecoderLayer post_attention_layernorm,
    post_feedforward_layernorm)."""

    __slots__ = ()

    def params(self, a, m, p: str, mlp) -> Iterator[tuple[str, Shape]]:
        yield from a.norm.params(m, f"{p}norm1")
        yield from a.attention.params(m, p)
        for i in (2, 3, 4):
            yield from a.norm.params(m, f"{p}norm{i}")
        yield from mlp.params(m, f"{p}mlp")

    def saved(self, a, m, x: Ctx) -> list[Saved]:
        out = a.norm.saved(m, x, "norm1", x.r)
        normed = a.norm.out_bytes(x)
        out += a.attention.saved(m, x, normed) + a.norm.saved(m, x, "norm3", x.c)
        out += _dropout("attn", m, x) + a.norm.saved(m, x, "norm2", x.r)
        out += a.mlp.saved(m, x, normed) + a.norm.saved(m, x, "norm4", x.c)
        return out + _dropout("mlp", m, x)


class PostNorm:
    """OLMo-2: the two norms sit on the branch outputs, x + norm1(attn(x)), then
    x + norm2(mlp(x)) (transformers' Olmo2DecoderLayer); q, k, v read the residual stream."""

    __slots__ = ()

    def params(self, a, m, p: str, mlp) -> Iterator[tuple[str, Shape]]:
        yield from a.attention.params(m, p)
        yield from a.norm.params(m, f"{p}norm1")
        yield from a.norm.params(m, f"{p}norm2")
        yield from mlp.params(m, f"{p}mlp")

    def saved(self, a, m, x: Ctx) -> list[Saved]:
        out = a.attention.saved(m, x, x.r) + a.norm.saved(m, x, "norm1", x.c)
        out += _dropout("attn", m, x)
        out += a.mlp.saved(m, x, x.r) + a.norm.saved(m, x, "norm2", x.c)
        return out + _dropout("mlp", m, x)


class Parallel:
    """Falcon-7B, phi-2: x + attn(a) + mlp(a) with a = norm1(x), one norm for both branches
    (transformers' FalconDecoderLayer with num_ln_in_parallel_attn 1, PhiDecoderLayer)."""

    __slots__ = ()

    def params(self, a, m, p: str, mlp) -> Iterator[tuple[str, Shape]]:
        yield from a.norm.params(m, f"{p}norm1")
        yield from a.attention.params(m, p)
        yield from mlp.params(m, f"{p}mlp")

    def saved(self, a, m, x: Ctx) -> list[Saved]:
        out = a.norm.saved(m, x, "norm1", x.r)
        normed = a.norm.out_bytes(x)
        out += a.attention.saved(m, x, normed) + _dropout("attn", m, x)
        # the MLP reads norm1's output, saved above: only autocast's own casts are new
        return out + a.mlp.saved(m, x, normed, own_input=False) + _dropout("mlp", m, x)
