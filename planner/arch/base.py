"""What every architecture variant shares: the saved-tensor record, the step's context and
the small shape helpers (planner/arch/__init__.py says how the variants compose)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from planner.lazy_dataclass import dataclass

FP32 = 4
# LayerNorm / RMSNorm per-row statistics (mean, rstd): fp32 on CUDA (acc type).
STAT = 4

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Saved:
    """One tensor autograd keeps for backward."""

    name: str
    nbytes: int


class Ctx:
    """One micro-batch as the block sees it: t = batch · seq tokens, the attention kernel
    (planner.spec.Attention), whether torch.autocast casts the matmul inputs, c = compute-dtype
    bytes, r = residual-stream bytes (planner.activations.regime_for)."""

    __slots__ = ("t", "batch", "seq", "attention", "autocast", "c", "r")

    def __init__(self, t: int, batch: int, seq: int, attention, autocast: bool, c: int,
                 r: int) -> None:
        self.t, self.batch, self.seq, self.attention = t, batch, seq, attention
        self.autocast, self.c, self.r = autocast, c, r


class Nothing:
    """A part that adds nothing: no parameters, nothing saved, no matmul (the base of the
    variants that are the absence of one: full attention's mask, no qk-norm)."""

    __slots__ = ()

    def params(self, m, prefix: str) -> Iterator[tuple[str, Shape]]:
        return iter(())

    def saved(self, m, x: Ctx) -> list[Saved]:
        return []

    def matmul_weights(self, m) -> int:
        return 0


def linear(prefix: str, out_f: int, in_f: int, bias: bool) -> Iterator[tuple[str, Shape]]:
    """An nn.Linear's parameters, (out_features, in_features) as it stores them."""
    yield f"{prefix}.weight", (out_f, in_f)
    if bias:
        yield f"{prefix}.bias", (out_f,)


def rms_weight(prefix: str, width: int) -> Iterator[tuple[str, Shape]]:
    """An RMSNorm inside attention (qk-norm, MLA's latent norms): weight only."""
    yield f"{prefix}.weight", (width,)


def rms_inner(prefix: str, t: int, width: int, rows: int, c: int,
              weight_fp32: bool = False) -> list[Saved]:
    """An RMSNorm inside attention over a c-dtype input of ``width`` per token (``rows``
    statistics per token): the fp32 copy, rstd and what the weight multiply saves (the cast,
    or the fp32 product: ModelSpec.norm_weight_fp32); its output (c) is saved by whatever
    reads it, counted there."""
    return [Saved(f"{prefix}.input_fp32", FP32 * t * width), Saved(f"{prefix}.rstd",
                                                                    FP32 * t * rows),
            Saved(f"{prefix}.normed", (FP32 if weight_fp32 else c) * t * width)]


def inputs_saved(prefix: str, readers: tuple[str, ...], in_bytes: int, x: Ctx, width: int,
                 shared: str, own: bool = True) -> list[Saved]:
    """The input of the linears ``readers`` (``width`` per token, ``in_bytes`` per element):
    under autocast each linear casts it to c and saves its own cast when its dtype is not c
    (autocast caches casts of leaf weights only: ``aten/src/ATen/autocast_mode.h``,
    ``cached_cast``); otherwise one storage read by all, saved once as ``shared`` (``own``
    False: already saved by an earlier reader)."""
    if x.autocast and in_bytes != x.c:
        return [Saved(f"{prefix}.{proj}.input_cast", x.c * x.t * width) for proj in readers]
    return [Saved(shared, in_bytes * x.t * width)] if own else []


class LinearOut(NamedTuple):
    """One linear's output (selective checkpointing): ``biased`` linears run as ``aten.addmm``
    (``at::linear`` in aten/src/ATen/native/Linear.cpp: addmm for a 2-D input with a bias, and
    ``_flatten_nd_linear`` -> addmm for a contiguous 3-D one), the others as ``aten.mm``.
    ``weight``: the mm's right operand, ``weight.t()``, as (in_features, out_features): the
    shape torchtitan's ``force_recompute_mm_shapes_by_fqns`` matches (planner/sac.py)."""

    saved: Saved
    biased: bool
    weight: tuple[int, int] = (0, 0)


def linear_out(name: str, width: int, t: int, nbytes: int, biased: bool = False,
               fan_in: int = 0) -> list[LinearOut]:
    """``width`` out_features, ``fan_in`` in_features."""
    return [LinearOut(Saved(name, nbytes * t * width), biased, (fan_in, width))]


def scaled(saved: list[Saved], k: int, n: int) -> list[Saved]:
    """Entries of k out of n blocks, spread over all n (an average block)."""
    return [Saved(x.name, x.nbytes * k // n) for x in saved]
