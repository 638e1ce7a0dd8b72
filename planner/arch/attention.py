"""Attention variants: multi-head (MHA / GQA / MQA: n_kv_heads of n_heads) and DeepSeek's
multi-head latent attention. Each saves its own input (per its readers), its qk-norm and its
core; ``matmul_weights`` is the weights of its projections, ``attn_width`` the width of the
QK^T and AV products (the 12 · L · seq · width term of planner/throughput.py)."""

from __future__ import annotations

from collections.abc import Iterator

from planner.arch.base import (
    FP32,
    Ctx,
    LinearOut,
    Nothing,
    Saved,
    Shape,
    inputs_saved,
    linear,
    linear_out,
    rms_inner,
    rms_weight,
)
from planner.spec import Attention


class FullAttention(Nothing):
    """Every layer attends to every earlier token through the kernel's own causal mask: no
    parameters, nothing kept, no matmul (also: no soft-capping)."""

    __slots__ = ()


class SlidingWindow(FullAttention):
    """sliding_layers of the blocks attend to the last sliding_window tokens (Mistral-7B-v0.1,
    Phi-3-mini, Gemma-2/3's local layers)."""

    __slots__ = ()

    def saved(self, m, x: Ctx) -> list[Saved]:
        """Under SDPA past the window a sliding layer gets transformers' boolean (B, 1, T, T)
        mask, which SDPA turns into an additive mask of q's dtype on each call and the kernel
        keeps for backward (sdp::convert_boolean_attn_mask); averaged over the blocks (traced:
        Phi-3-mini, window 2047, seq 2048: 8 MiB per layer). Eager attention's mask: not
        counted apart."""
        if x.seq <= m.sliding_window:
            return []
        return [Saved("sdpa.window_mask",
                      x.c * x.batch * x.seq * x.seq * m.sliding_layers // m.n_layers)]


class TanhSoftcap(FullAttention):
    """Gemma-2's soft-capped attention logits (eager_attention_forward in transformers'
    modeling_gemma2.py): s = tanh(s / cap) * cap; tanh saves its output, (B, heads, T, T) in
    c. Flash SDPA kernels take no soft-cap: under SDPA nothing is kept apart."""

    __slots__ = ()

    def saved(self, m, x: Ctx) -> list[Saved]:
        return [Saved("attn.softcap_tanh", x.c * x.batch * m.n_heads * x.seq * x.seq)]


class Mha:
    """q, k, v, o projections (GQA/MQA: k and v of n_kv_heads), an optional qk-norm, RoPE or
    ALiBi or none, then SDPA or eager attention; ``window``: full or sliding-window layers
    (SDPA's mask), ``softcap``: none or Gemma-2's (eager's scores). Phi-3's fused qkv_proj
    (``fused_qkv``): one linear whose output q, k, v are views of."""

    __slots__ = ("qk", "position", "window", "softcap")

    def __init__(self, qk, position, window=FullAttention(), softcap=FullAttention()) -> None:
        self.qk, self.position, self.window, self.softcap = qk, position, window, softcap

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        h, qkv_bias = m.hidden, m.bias or m.qkv_bias
        yield from linear(f"{prefix}attn.q", m.q_dim, h, qkv_bias)
        yield from linear(f"{prefix}attn.k", m.kv_dim, h, qkv_bias)
        yield from linear(f"{prefix}attn.v", m.kv_dim, h, qkv_bias)
        yield from linear(f"{prefix}attn.o", h, m.q_dim, m.bias or m.attn_out_bias)
        yield from self.qk.params(m, prefix)
        yield from self.window.params(m, prefix)
        yield from self.softcap.params(m, prefix)

    def readers(self, m) -> tuple[str, ...]:
        """The linears that read the block's normed input."""
        return ("qkv",) if m.fused_qkv else ("q", "k", "v")

    def saved(self, m, x: Ctx, in_bytes: int) -> list[Saved]:
        out = inputs_saved("attn", self.readers(m), in_bytes, x, m.hidden, "attn.qkv.input")
        out += self.qk.saved(m, x)
        core = self._sdpa if x.attention is Attention.SDPA else self._eager
        return out + core(m, x, self.position.cast_suffix(x))

    def _sdpa(self, m, x: Ctx, rope: str) -> list[Saved]:
        """Flash-style SDPA saves q, k, v (GQA: k/v not expanded), out and the fp32 logsumexp
        (B, heads, T): aten/src/ATen/native/transformers/attention.cpp."""
        t, c, qd, kvd = x.t, x.c, m.q_dim, m.kv_dim
        # Phi-3's fused qkv_proj: v is a view of the (tokens, q + 2 kv) output, and what SDPA
        # saves keeps that whole storage alive.
        v_width = qd + 2 * kvd if m.fused_qkv else kvd
        out = [Saved(f"sdpa.q{rope}", c * t * qd), Saved(f"sdpa.k{rope}", c * t * kvd),
               Saved("sdpa.v", c * t * v_width), Saved("sdpa.out", c * t * qd),
               Saved("sdpa.logsumexp", FP32 * x.batch * m.n_heads * x.seq)]
        # out is (B, T, heads, d) in memory, so transpose(1, 2).reshape is a view that attn.o
        # saves without a copy. Not after a fused qkv (RoPE on a slice of the qkv output, not
        # dense) or a partial RoPE (the rotated and passed parts concatenated): q comes out
        # (B, heads, T, d)-contiguous, SDPA's output follows q's layout, and the reshape for
        # attn.o copies it (traced: Phi3Attention, PhiAttention).
        if m.fused_qkv or m.partial_rotary:
            out.append(Saved("attn.o.input_copy", c * t * qd))
        return out + self.window.saved(m, x)

    def _eager(self, m, x: Ctx, rope: str) -> list[Saved]:
        """k, v repeated to n_heads for GQA (repeat_interleave copies), scores
        s = q @ k^T * scale (not saved), causal masked_fill (bool mask shared across layers),
        softmax in fp32 (output saved), cast to c (saved by p @ v), o = p @ v, then
        transpose+reshape copies o for attn.o."""
        t, c, qd, kvd = x.t, x.c, m.q_dim, m.kv_dim
        scores = x.batch * m.n_heads * x.seq * x.seq
        out = [Saved(f"attn.q{rope}", c * t * qd),
               Saved("attn.k_expanded" if kvd != qd else f"attn.k{rope}", c * t * qd),
               Saved("attn.v_expanded" if kvd != qd else "attn.v", c * t * qd)]
        out += self.softcap.saved(m, x)
        out.append(Saved("attn.probs_fp32", FP32 * scores))
        if m.dropout:
            # dropout(probs): p @ v saves the dropped copy; native_dropout keeps a bool mask
            # (aten/src/ATen/native/Dropout.cpp). Flash SDPA kernels keep only RNG state.
            out.append(Saved("attn.probs", c * scores))
            out.append(Saved("attn.probs_dropout_mask", scores))
        elif c != FP32:
            out.append(Saved("attn.probs", c * scores))  # the cast p @ v saves (none in fp32)
        out.append(Saved("attn.o.input", c * t * qd))
        return out

    def linear_outputs(self, m, t: int, c: int) -> list[LinearOut]:
        """The projections' outputs in execution order, biased or not (planner.activations
        .linear_outputs)."""
        biased, h = m.bias or m.qkv_bias, m.hidden
        if m.fused_qkv:
            out = linear_out("qkv.out", m.q_dim + 2 * m.kv_dim, t, c, biased, h)
        else:
            out = (linear_out("q.out", m.q_dim, t, c, biased, h)
                   + linear_out("k.out", m.kv_dim, t, c, biased, h)
                   + linear_out("v.out", m.kv_dim, t, c, biased, h))
        return out + linear_out("o.out", h, t, c, m.bias or m.attn_out_bias, m.q_dim)

    def matmul_weights(self, m) -> int:
        """Matmul weights a token multiplies: q (q_dim x h), k and v (kv_dim x h), o."""
        return m.hidden * (2 * m.q_dim + 2 * m.kv_dim) + self.qk.matmul_weights(m) \
            + self.window.matmul_weights(m) + self.softcap.matmul_weights(m)

    def attn_width(self, m) -> int:
        return m.q_dim


class Mla:
    """Multi-head latent attention (DeepSeek-V2, Liu et al. 2024 sec. 2.1; transformers'
    DeepseekV2Attention / DeepseekV3Attention): q = q_b(norm(q_a(x))) or q_proj(x);
    [c_kv, k_pe] = kv_a(x); k_nope, v = kv_b(norm(c_kv)); o(attn). head_dim is the query/key
    head (qk_nope + qk_rope), v_head_dim the value head."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        h, nh, qk, rope = m.hidden, m.n_heads, m.d_head, m.qk_rope_dim
        v = m.v_head_dim or qk
        if m.q_lora_rank:
            yield from linear(f"{prefix}attn.q_a", m.q_lora_rank, h, False)
            yield from rms_weight(f"{prefix}attn.q_a_norm", m.q_lora_rank)
            yield from linear(f"{prefix}attn.q_b", nh * qk, m.q_lora_rank, False)
        else:
            yield from linear(f"{prefix}attn.q", nh * qk, h, False)
        yield from linear(f"{prefix}attn.kv_a", m.kv_lora_rank + rope, h, False)
        yield from rms_weight(f"{prefix}attn.kv_a_norm", m.kv_lora_rank)
        yield from linear(f"{prefix}attn.kv_b", nh * (qk - rope + v), m.kv_lora_rank, False)
        yield from linear(f"{prefix}attn.o", h, m.o_in_dim, False)

    def readers(self, m) -> tuple[str, ...]:
        return ("q_a" if m.q_lora_rank else "q", "kv_a")

    def saved(self, m, x: Ctx, in_bytes: int) -> list[Saved]:
        """After the input: the latent RMSNorms (their outputs saved by q_b / kv_b), the query
        and key SDPA reads (new tensors: cat of the no-RoPE and RoPE parts), the value (a view
        of kv_b's output, whose whole storage it keeps: keys' no-RoPE part too), SDPA's output
        and logsumexp (the same set under eager attention: not modelled apart)."""
        t, c, nh, qk, rope = x.t, x.c, m.n_heads, m.d_head, m.qk_rope_dim
        v = m.v_head_dim or qk
        out = inputs_saved("attn", self.readers(m), in_bytes, x, m.hidden, "attn.qkv.input")
        if m.q_lora_rank:
            out += rms_inner("attn.q_a_norm", t, m.q_lora_rank, 1, c)
            out.append(Saved("attn.q_b.input", c * t * m.q_lora_rank))
        out += rms_inner("attn.kv_a_norm", t, m.kv_lora_rank, 1, c)
        out.append(Saved("attn.kv_b.input", c * t * m.kv_lora_rank))
        return out + [Saved("sdpa.q", c * t * nh * qk), Saved("sdpa.k", c * t * nh * qk),
                      Saved("sdpa.v.kv_b_out", c * t * nh * (qk - rope + v)),
                      Saved("sdpa.out", c * t * nh * v),
                      Saved("sdpa.logsumexp", FP32 * x.batch * nh * x.seq)]

    def linear_outputs(self, m, t: int, c: int) -> list[LinearOut]:
        nh, qk, rope, h = m.n_heads, m.d_head, m.qk_rope_dim, m.hidden
        if m.q_lora_rank:
            out = (linear_out("q_a.out", m.q_lora_rank, t, c, fan_in=h)
                   + linear_out("q_b.out", nh * qk, t, c, fan_in=m.q_lora_rank))
        else:
            out = linear_out("q.out", nh * qk, t, c, fan_in=h)
        out += linear_out("kv_a.out", m.kv_lora_rank + rope, t, c, fan_in=h)
        out += linear_out("kv_b.out", nh * (qk - rope + (m.v_head_dim or qk)), t, c,
                          fan_in=m.kv_lora_rank)
        return out + linear_out("o.out", h, t, c, m.bias or m.attn_out_bias,
                                nh * (m.v_head_dim or qk))

    def matmul_weights(self, m) -> int:
        """Matmul weights a token multiplies: every projection above (the latent norms are
        not matmuls)."""
        return sum(s[0] * s[1] for _, s in self.params(m, "") if len(s) == 2)

    def attn_width(self, m) -> int:
        """n_heads · head_dim, as for MHA (the value head's narrower AV product is not
        counted apart)."""
        return m.q_dim
