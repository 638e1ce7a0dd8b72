"""Norm variants: LayerNorm, OLMo-1's weightless LayerNorm, RMSNorm; and the qk-norms inside
attention (Qwen3 / Gemma-3 per head, OLMo-2 over all heads).

A norm is not a matmul: it adds no model FLOPs (PaLM appendix B counts matmul weights only).
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.arch.base import FP32, STAT, Ctx, Nothing, Saved, Shape, rms_inner, rms_weight


class LayerNorm:
    """nn.LayerNorm, weight and bias (GPT-2, BERT, BLOOM, Falcon, phi-2)."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        yield f"{prefix}.weight", (m.hidden,)
        yield f"{prefix}.bias", (m.hidden,)

    def saved(self, m, x: Ctx, prefix: str, in_bytes: int) -> list[Saved]:
        """Over an input of ``in_bytes`` per element (residual stream r or branch output c).
        nn.LayerNorm saves its input and per-row mean/rstd; under CUDA autocast layer_norm is
        an fp32 op: a bf16 input (a branch output) is cast up first and the fp32 copy saved."""
        return [Saved(f"{prefix}.input", (FP32 if x.autocast else in_bytes) * x.t * m.hidden),
                Saved(f"{prefix}.mean_rstd", 2 * STAT * x.t)]

    def out_bytes(self, x: Ctx) -> int:
        """Bytes per element of the output on the residual stream: fp32 under autocast (an
        fp32 op), else r."""
        return FP32 if x.autocast else x.r

    def matmul_weights(self, m) -> int:
        return 0


class PlainLayerNorm(LayerNorm):
    """OLMo-1's non-parametric norm: ``F.layer_norm(x.float())`` with no weight or bias, cast
    back to x's dtype (transformers' OlmoLayerNorm)."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        return iter(())

    def saved(self, m, x: Ctx, prefix: str, in_bytes: int) -> list[Saved]:
        return [Saved(f"{prefix}.input", FP32 * x.t * m.hidden),
                Saved(f"{prefix}.mean_rstd", 2 * STAT * x.t)]

    def out_bytes(self, x: Ctx) -> int:
        return x.r


class RMSNorm:
    """RMSNorm, weight only (Llama and most decoders since)."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        yield f"{prefix}.weight", (m.hidden,)

    def saved(self, m, x: Ctx, prefix: str, in_bytes: int) -> list[Saved]:
        """HF LlamaRMSNorm: h32 = x.to(fp32) [saved by pow and mul; the input itself when
        r == 4], n = h32 * rsqrt(var + eps) [rsqrt saved], then weight * n.to(x.dtype) saves
        the cast. Gemma's RMSNorm multiplies in fp32, n * (1 + weight.float()), and saves that
        fp32 product before casting back (transformers' Gemma2RMSNorm / Gemma3RMSNorm)."""
        t, h = x.t, m.hidden
        return [Saved(f"{prefix}.input_fp32", FP32 * t * h), Saved(f"{prefix}.rstd", FP32 * t),
                Saved(f"{prefix}.normed", (FP32 if m.norm_weight_fp32 else in_bytes) * t * h)]

    def out_bytes(self, x: Ctx) -> int:
        """weight (fp32 under autocast) * cast: the residual dtype r."""
        return x.r

    def matmul_weights(self, m) -> int:
        return 0


class NoQkNorm(Nothing):
    """Queries and keys go to RoPE as the projections leave them."""

    __slots__ = ()


class HeadQkNorm(NoQkNorm):
    """RMSNorm over each head's head_dim (transformers' Qwen3Attention / Gemma3Attention
    q_norm, k_norm): a weight of head_dim, one statistic per head."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        yield from rms_weight(f"{prefix}attn.q_norm", m.d_head)
        yield from rms_weight(f"{prefix}attn.k_norm", m.d_head)

    def rows(self, m) -> tuple[int, int]:
        """Statistics per token of q and k."""
        return m.n_heads, m.n_kv_heads

    def saved(self, m, x: Ctx) -> list[Saved]:
        """On the projections' c-dtype outputs; their outputs go on to RoPE (not saved
        here)."""
        rows_q, rows_k = self.rows(m)
        return (rms_inner("attn.q_norm", x.t, m.q_dim, rows_q, x.c, m.norm_weight_fp32)
                + rms_inner("attn.k_norm", x.t, m.kv_dim, rows_k, x.c, m.norm_weight_fp32))


class FullQkNorm(HeadQkNorm):
    """RMSNorm over all heads at once (transformers' Olmo2Attention: q_norm of
    n_heads · head_dim, k_norm of kv_dim)."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        yield from rms_weight(f"{prefix}attn.q_norm", m.q_dim)
        yield from rms_weight(f"{prefix}attn.k_norm", m.kv_dim)

    def rows(self, m) -> tuple[int, int]:
        return 1, 1
