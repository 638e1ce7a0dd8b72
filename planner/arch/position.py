"""Positional variants: rotary (RoPE), a learned table, ALiBi. None is a matmul (no model
FLOPs); only the learned table has parameters."""

from __future__ import annotations

from collections.abc import Iterator

from planner.arch.base import Ctx, Saved, Shape


class Rope:
    """Rotary embeddings (Su et al. 2021): no parameters."""

    __slots__ = ()
    rotary = True

    def params(self, m) -> Iterator[tuple[str, Shape]]:
        return iter(())

    def saved(self, m, x: Ctx) -> list[Saved]:
        """cos and sin (T, head_dim), computed once per forward in the residual dtype and
        saved by every block's RoPE multiply (shared storage): the root's."""
        return [Saved("rope.cos_sin", 2 * x.r * x.seq * m.d_head)]

    def cast_suffix(self, x: Ctx) -> str:
        """q and k come out of the linears in c. RoPE multiplies by cos/sin of the residual
        dtype: under autocast the product is promoted to fp32 and sdpa/matmul casts it back to
        c (a new tensor, saved); in module regime RoPE's output is c and saved directly."""
        return ".rope_cast" if x.autocast else ""

    def matmul_weights(self, m) -> int:
        return 0


class Learned(Rope):
    """An absolute position table of max_positions x hidden (GPT-2, BERT): an embedding
    lookup, which saves only its indices."""

    __slots__ = ()
    rotary = False

    def params(self, m) -> Iterator[tuple[str, Shape]]:
        yield "pos_embed.weight", (m.max_positions, m.hidden)

    def saved(self, m, x: Ctx) -> list[Saved]:
        return []

    def cast_suffix(self, x: Ctx) -> str:
        return ""


class Alibi(Learned):
    """ALiBi's linear biases (Press et al. 2021; BLOOM): no parameters."""

    __slots__ = ()

    def params(self, m) -> Iterator[tuple[str, Shape]]:
        return iter(())
