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
    return "/".join(parts)


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
