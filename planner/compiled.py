"""What a ``torch.compile``-d transformer block saves for backward, from measured data.

The saved set is decided by AOTAutograd's min-cut partitioner; ``probes/compiled.py`` runs it
on fake tensors of the reference block for every block family the presets use and writes,
per family, the bytes saved per product of the block's dimensions (``TERMS``) to
``planner/data/compiled_blocks.json``. This module reads that table (no torch) and scales it to
a model's dimensions. A family the table does not have returns None: the caller keeps the
eager count and says so.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from planner.spec import Attention, ModelSpec

DATA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                         "compiled_blocks.json")

TERMS: dict[str, Callable[[ModelSpec, int, int], int]] = {
    "t": lambda m, t, seq: t,
    "t*h": lambda m, t, seq: t * m.hidden,
    "t*q": lambda m, t, seq: t * m.q_dim,
    "t*kv": lambda m, t, seq: t * m.kv_dim,
    "t*f": lambda m, t, seq: t * m.ffn_hidden,
    "t*heads": lambda m, t, seq: t * m.n_heads,
    "t*heads*seq": lambda m, t, seq: t * m.n_heads * seq,
}
"""Products of the dimensions a block's saved tensors have (t = micro-batch x seq)."""


def family_of(model: ModelSpec) -> ModelSpec:
    """The model itself: its block family is what ``family_key`` reads."""
    return model


def family_key(model: ModelSpec, autocast: bool, attention: Attention) -> str:
    """Everything about a block that changes what it saves, as a string."""
    kv = ("mha" if model.n_kv_heads == model.n_heads
          else "mqa" if model.n_kv_heads == 1 else "gqa")
    parts = [str(model.mlp), str(model.norm), str(model.position), f"norms{model.norms_per_layer}",
             kv, "parallel" if model.parallel_block else "serial",
             "bias" if model.bias else ("qkvbias" if model.qkv_bias else "nobias"),
             "dropout" if model.dropout else "nodropout",
             "encoder" if model.encoder_head else "causal",
             "autocast" if autocast else "module", str(attention)]
    # blocks the reference module cannot build (issue 13): never measured, so "not measured"
    # rather than read as the plain family's. How a Hugging Face class computes the same
    # block (fused projections, op-by-op gelu_new, softcapping, fp32 norm products) is left
    # out: the table is the reference module's partitioner result for the family.
    parts += [f for f in ("attn_out_bias", "post_norms", "mla", "head_bias")
              if getattr(model, f)]
    if model.qk_norm != "none":
        parts.append(f"qknorm-{model.qk_norm}")
    return "/".join(parts)


def measurable(model: ModelSpec) -> bool:
    """Whether probes/compiled.py can measure the block: the reference module builds it
    (probes.models.reference_spec) and it is not MoE."""
    return not (model.is_moe or model.mla or model.qk_norm != "none" or model.post_norms
                or model.attn_out_bias or model.head_bias or str(model.norm) == "layernorm-plain"
                or (model.encoder_head and not model.pooler))


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, Any]:
    try:
        with open(DATA_PATH, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"families": {}}


def saved_bytes(model: ModelSpec, *, batch: int, seq: int, autocast: bool,
                attention: Attention) -> int | None:
    """Bytes one compiled block saves for backward, or None for a family not measured (MoE)."""
    if model.is_moe:
        return None
    row = _table()["families"].get(family_key(model, autocast, attention))
    if row is None:
        return None
    t = batch * seq
    return sum(nbytes * TERMS[term](model, t, seq) for term, nbytes in row.items())


def torch_version() -> str | None:
    """The torch version the table was measured with."""
    return _table().get("torch")
