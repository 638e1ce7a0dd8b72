"""A model's architecture as composed variants: the block is a layout (where the norms sit)
over a norm, an attention (with its qk-norm and positional encoding) and an MLP; the root
reads the same norm and positional variants.

Each variant is a small class in this package with the same three functions:

* ``params(m, prefix)``: its parameter tensors, (name, shape), named and shaped as the
  reference module in probes/models.py (planner/params.py lists them);
* ``saved(m, x, ...)``: what it keeps for backward, one ``Saved`` per tensor
  (planner/activations.py ``block_saved``);
* ``matmul_weights(m)``: the weights of the matmuls a token goes through, the FLOP count's
  input (2 forward and 4 backward FLOPs per weight per token, Kaplan et al. 2020:
  planner/throughput.py ``matmul_params``; norms and positions: 0).

``m`` is the ModelSpec: variants read their own fields of it (its flags stay the one
description of a model: presets, config readers, the CLI and JSON are unchanged);
``variants_of`` picks the variants from those flags, once per model. A new architecture adds
a variant (docs/tour.md, "A new architecture adds a variant").
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from planner.arch.attention import FullAttention, Mha, Mla, SlidingWindow, TanhSoftcap
from planner.arch.base import Ctx, LinearOut, Saved, Shape
from planner.arch.layout import Parallel, PostNorm, PreNorm, Sandwich
from planner.arch.mlp import Gated, Gelu, Moe
from planner.arch.norm import (
    FullQkNorm,
    HeadQkNorm,
    LayerNorm,
    NoQkNorm,
    PlainLayerNorm,
    RMSNorm,
)
from planner.arch.position import Alibi, Learned, Rope


class Arch:
    """One model's variants: ``layout``, ``norm``, ``position``, ``attention``, ``mlp`` (the
    typical block's) and ``dense_mlp`` (an MoE model's dense first blocks; None without)."""

    __slots__ = ("layout", "norm", "position", "attention", "mlp", "dense_mlp")

    def __init__(self, layout, norm, position, attention, mlp, dense_mlp) -> None:
        self.layout, self.norm, self.position = layout, norm, position
        self.attention, self.mlp, self.dense_mlp = attention, mlp, dense_mlp

    def block_params(self, m, prefix: str = "", dense: bool = False
                     ) -> Iterator[tuple[str, Shape]]:
        """One block's tensors: the typical block, or with ``dense`` a dense first block."""
        return self.layout.params(self, m, prefix, self.dense_mlp if dense else self.mlp)

    def block_saved(self, m, x: Ctx) -> list[Saved]:
        """What one (average) block saves for backward."""
        return self.layout.saved(self, m, x)

    def block_linear_outputs(self, m, t: int, c: int, dense: bool = False) -> list[LinearOut]:
        """A block's linear outputs in execution order, each marked biased (``addmm``) or not
        (``aten.mm``): what selective checkpointing's policy sees."""
        mlp = self.dense_mlp if dense else self.mlp
        return self.attention.linear_outputs(m, t, c) + mlp.linear_outputs(m, t, c)

    def block_matmul_weights(self, m) -> int:
        """Matmul weights a token multiplies in the average block (dense first blocks
        weighted by their count, floor division)."""
        attention = self.attention.matmul_weights(m)
        typical = attention + self.mlp.matmul_weights(m)
        if self.dense_mlp is None:
            return typical
        L, nd = m.n_layers, m.n_dense_layers
        dense = attention + self.dense_mlp.matmul_weights(m)
        return (typical * (L - nd) + dense * nd) // L

    def block_unrecomputed_weights(self, m) -> int:
        """Matmul weights per block a full-checkpoint recompute does not re-run: the block's
        last matmul (the MLP's down projection) when no later op of the block saves its output.

        PyTorch's non-reentrant checkpoint stops recomputing once every tensor backward needs is
        back (torch/utils/checkpoint.py: ``checkpoint(..., early_stop=True)`` by default,
        ``set_checkpoint_early_stop``; the recompute pack hook ``_recomputation_hook`` raises
        ``_StopRecomputationError`` at the last one). An op's saved inputs are
        registered before its kernel runs (autograd's generated VariableType code builds the
        node and its SavedVariables, then redispatches), so the last saver, down's ``mm``
        saving its input, stops the recompute before down's kernel. Down's output is only added
        to the residual (the add saves nothing) in a pre-norm or parallel block; a post-norm
        (OLMo-2) or sandwich (Gemma-2/3) block's norm saves it, a residual dropout's mask comes
        after it, and an MoE's combine saves the experts' outputs: then the recompute runs to
        the end (0). Measured on torch 2.13 CPU (tests/test_throughput_recompute.py): a
        checkpointed Llama block re-runs every matmul but down. A reentrant checkpoint
        (``use_reentrant=True``: DeepSpeed's, transformers' default) re-runs all: NOT MODELLED
        (fitcheck assumes non-reentrant, as planner/activations.py does)."""
        if (m.is_moe or m.dropout > 0.0 or self.dense_mlp is not None
                or isinstance(self.layout, (PostNorm, Sandwich))):
            return 0
        return m.hidden * self.mlp.width


_NORMS = {"layernorm": LayerNorm(), "rmsnorm": RMSNorm(), "layernorm-plain": PlainLayerNorm()}
_QK = {"none": NoQkNorm(), "head": HeadQkNorm(), "full": FullQkNorm()}
_POSITIONS = {"rope": Rope(), "learned": Learned(), "alibi": Alibi()}
_FULL = FullAttention()


def _layout(m):
    """From post_norms, norms_per_layer and parallel_block, as the config readers set them
    (planner/hf_config.py: OLMo-2 post_norms with 2 norms, Gemma-2/3 4 norms, Falcon and phi
    a parallel block of 1 or 2 norms, everything else 2 pre-norms)."""
    if m.post_norms:
        return PostNorm()
    if m.norms_per_layer >= 4:
        return Sandwich()
    if m.parallel_block and m.norms_per_layer == 1:
        return Parallel()
    return PreNorm()


@functools.lru_cache(maxsize=256)
def variants_of(m) -> Arch:
    """The variants a ModelSpec's flags describe."""
    kind = Gated if m.mlp.gated else Gelu
    position = _POSITIONS[m.position]
    if m.mla:
        attention = Mla()
    else:
        attention = Mha(_QK[m.qk_norm], position,
                        SlidingWindow() if m.sliding_layers else _FULL,
                        TanhSoftcap() if m.attn_softcap else _FULL)
    dense = kind(m.dense_ffn_hidden) if m.n_dense_layers else None
    if m.is_moe:
        mlp = Moe(kind(m.ffn_hidden), kind(m.shared_ffn) if m.shared_ffn else None, dense)
    else:
        mlp = kind(m.ffn_hidden)
    return Arch(_layout(m), _NORMS[m.norm], position, attention, mlp, dense)


__all__ = ["Arch", "Ctx", "Saved", "variants_of"]
