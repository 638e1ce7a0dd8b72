"""A plausible Llama-style shape for a bare parameter count (``--params 7e9``).

The rule (also in docs/models.md):

* Architecture: Llama-2 style decoder — SwiGLU MLP, RMSNorm, RoPE, no biases, untied
  embeddings, vocabulary 32000 (the Llama-2 tokenizer).
* Heads: head_dim 128 from hidden 2048 up (Llama-2/3), 64 below (GPT-2, Llama-3.2-1B); so
  ``hidden`` is a multiple of 128 (64 below 2048) and ``n_heads = hidden / head_dim``.
* MLP width: Llama's rule ``ffn = 256 * ceil(int(8 * hidden / 3) / 256)`` (4096 -> 11008,
  5120 -> 13824).
* Attention: multi-head below 30e9 parameters; grouped-query with 8 KV heads from 30e9 up,
  as Llama-2 did for its 34B and 70B models. GQA shapes keep ``hidden`` a multiple of 1024 so
  that n_heads is a multiple of 8 (Llama-2 34B/70B: 8192, Llama-3.1 405B: 16384).
* Depth: aspect ratio ``hidden / n_layers`` near 128. Kaplan et al. 2020 ("Scaling Laws for
  Neural Language Models", fig. 5) find the loss within a few percent over d_model/n_layer of
  roughly 50 to 200; Llama-2 7B (4096/32) and 13B (5120/40) and GPT-3 6.7B/13B/175B sit at 128.

Search: for every ``hidden`` on the grid (64 below 2048, 128 above, 1024 with GQA) within a
factor of two of the continuous solution of ``params(hidden, hidden / 128) = n``, take the two
layer counts whose totals bracket ``n``. Among all those pairs within 2 % of ``n``, return the
one with the lowest score

    score = |ln((hidden / n_layers) / 128)|  +  25 * |total - n| / n

(so 1 % of count error weighs as much as a 28 % aspect-ratio miss); if none is within 2 %, the
one with the smallest error. Totals use the same formula as ``planner.params.total_params``
(checked by the tests):

    per_block = 2 h  +  2 h q  +  2 h kv  +  3 h f          (norms, q/o, k/v, gate/up/down)
    total     = L per_block  +  2 V h  +  h                  (blocks, embed + lm_head, norm)

with q = n_heads * head_dim = h and kv = n_kv_heads * head_dim.

Below about 1e9 parameters the two 32000-row embedding tables are a large share and one layer
is several percent of the total, so staying within 2 % can push the aspect ratio out to
~25-300 there; from 1e9 up it stays within ~80-200.
"""

from __future__ import annotations

import math

from planner.spec import MlpKind, ModelSpec, NormKind, PositionKind

__all__ = [
    "ASPECT_RATIO",
    "ERROR_WEIGHT",
    "GQA_FROM_PARAMS",
    "MAX_PARAMS",
    "MIN_PARAMS",
    "VOCAB",
    "ffn_for_hidden",
    "shape_from_params",
]

VOCAB = 32000
HEAD_DIM = 128
SMALL_HEAD_DIM = 64
SMALL_HIDDEN = 2048
ASPECT_RATIO = 128.0
GQA_FROM_PARAMS = 30e9
GQA_KV_HEADS = 8
GQA_HIDDEN_MULTIPLE = HEAD_DIM * GQA_KV_HEADS
FFN_MULTIPLE = 256
MATCH_TOLERANCE = 0.02
ERROR_WEIGHT = 25.0
MIN_PARAMS = 1e7
"""Below this the two 32000-row embedding tables (4.1e6 even at hidden 64) dominate."""
MAX_PARAMS = 1e13


def ffn_for_hidden(hidden: int) -> int:
    """Llama's MLP width: 2/3 of 4h, rounded up to a multiple of 256."""
    return FFN_MULTIPLE * -(-int(8 * hidden / 3) // FFN_MULTIPLE)


def _kv_heads(n_heads: int, gqa: bool) -> int:
    return GQA_KV_HEADS if gqa else n_heads


def _head_dim(hidden: int) -> int:
    return SMALL_HEAD_DIM if hidden < SMALL_HIDDEN else HEAD_DIM


def _hidden_grid(lo: float, hi: float, gqa: bool) -> list[int]:
    """Candidate widths in [lo, hi] (at least one)."""
    if gqa:
        step = GQA_HIDDEN_MULTIPLE
        ks = range(max(1, math.floor(lo / step)), max(1, math.ceil(hi / step)) + 1)
        return [k * step for k in ks]
    small = range(max(1, math.floor(lo / SMALL_HEAD_DIM)), math.ceil(hi / SMALL_HEAD_DIM) + 1)
    big = range(max(1, math.floor(lo / HEAD_DIM)), math.ceil(hi / HEAD_DIM) + 1)
    grid = [k * SMALL_HEAD_DIM for k in small if k * SMALL_HEAD_DIM < SMALL_HIDDEN]
    grid += [k * HEAD_DIM for k in big if k * HEAD_DIM >= SMALL_HIDDEN]
    return grid or [SMALL_HEAD_DIM * max(1, round(lo / SMALL_HEAD_DIM))]


def _per_block(hidden: int, gqa: bool) -> int:
    d = _head_dim(hidden)
    kv = _kv_heads(hidden // d, gqa) * d
    return 2 * hidden + 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn_for_hidden(hidden)


def _root(hidden: int) -> int:
    return 2 * VOCAB * hidden + hidden


def _short(n: float) -> str:
    """13e9 -> '13B', 1.5e12 -> '1.5T', 7e7 -> '70M'."""
    for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"


def shape_from_params(n_params: float) -> ModelSpec:
    """The Llama-style shape (``shape_assumed=True``) whose parameter count is closest to
    ``n_params`` under the rule in this module's docstring."""
    if isinstance(n_params, bool) or not isinstance(n_params, (int, float)):
        raise ValueError(f"--params must be a number, got {n_params!r}")
    if not math.isfinite(n_params) or n_params <= 0:
        raise ValueError(f"--params must be a positive finite number, got {n_params!r}")
    if n_params < MIN_PARAMS:
        raise ValueError(
            f"--params {n_params:g} is too small for the scaling rule (minimum {MIN_PARAMS:g}:"
            " its 32000-token embedding tables dominate below that); describe the model with a"
            " config"
        )
    if n_params > MAX_PARAMS:
        raise ValueError(f"--params {n_params:g} is too large (maximum {MAX_PARAMS:g})")

    gqa = n_params >= GQA_FROM_PARAMS
    # Continuous solution with L = h / A and per_block ~ c h^2 (c from the MLP/attention mix).
    c = 2 + 2 * (GQA_KV_HEADS * HEAD_DIM / 8192 if gqa else 1) + 8  # ~12 (MHA) / ~10.25 (GQA)
    lo_h, hi_h = float(SMALL_HEAD_DIM), 8.0 * HEAD_DIM
    while c * hi_h**3 / ASPECT_RATIO + 2 * VOCAB * hi_h < n_params:
        hi_h *= 2
    for _ in range(60):  # bisection on the monotone continuous count
        mid = (lo_h + hi_h) / 2
        if c * mid**3 / ASPECT_RATIO + 2 * VOCAB * mid < n_params:
            lo_h = mid
        else:
            hi_h = mid
    h0 = lo_h

    best_key: tuple[float, ...] | None = None
    best: tuple[int, int] = (SMALL_HEAD_DIM, 1)
    for h in _hidden_grid(h0 / 2, h0 * 2, gqa):
        pb, root = _per_block(h, gqa), _root(h)
        exact = (n_params - root) / pb
        for layers in {max(1, math.floor(exact)), max(1, math.ceil(exact))}:
            err = abs(layers * pb + root - n_params) / n_params
            aspect_miss = abs(math.log(h / layers / ASPECT_RATIO))
            # Within tolerance: rank by score. Outside: rank after all of those, by error.
            if err <= MATCH_TOLERANCE:
                key = (0.0, aspect_miss + ERROR_WEIGHT * err, err, h)
            else:
                key = (1.0, err, aspect_miss, h)
            if best_key is None or key < best_key:
                best_key, best = key, (h, layers)

    hidden, n_layers = best
    n_heads = hidden // _head_dim(hidden)
    return ModelSpec(
        name=f"assumed-{_short(n_params)}",
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=_kv_heads(n_heads, gqa),
        ffn_hidden=ffn_for_hidden(hidden),
        vocab=VOCAB,
        tied_embeddings=False,
        mlp=MlpKind.SWIGLU,
        norm=NormKind.RMSNORM,
        position=PositionKind.ROPE,
        shape_assumed=True,
    )
