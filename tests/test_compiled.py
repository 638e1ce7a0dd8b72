"""The compiled-block table is what the min-cut partitioner saves today (probes/compiled.py
rerun for a few families and compared with planner/data/compiled_blocks.json)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.trace
pytest.importorskip("torch")

from planner.compiled import DATA_PATH, family_key  # noqa: E402
from planner.presets import get_preset  # noqa: E402
from planner.spec import Attention  # noqa: E402
from probes.compiled import saved_block  # noqa: E402


@pytest.mark.parametrize("preset, autocast, attention", [
    ("llama3-8b", False, Attention.SDPA),
    ("gpt2", True, Attention.EAGER),
    ("falcon-7b", False, Attention.SDPA),
])
def test_table_matches_the_partitioner(preset, autocast, attention):
    with open(DATA_PATH, encoding="utf-8") as f:
        table = json.load(f)["families"]
    m = get_preset(preset)
    assert saved_block(m, autocast=autocast, attention=attention) == \
        table[family_key(m, autocast, attention)], "rerun: python -m probes.compiled --write"


def test_compiled_block_saves_less_than_eager():
    """The partitioner recomputes cheap elementwise ops (norm statistics, activations,
    casts) instead of saving them: a Llama block saves about 0.7x of the eager set."""
    from planner.activations import plan_activations
    from planner.compiled import saved_bytes
    from planner.spec import Checkpointing, Precision

    m = get_preset("llama3-8b")
    eager = plan_activations(m, batch=1, seq=2048, precision=Precision.BF16,
                             attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                             uses_autocast=False).block_kept
    comp = saved_bytes(m, batch=1, seq=2048, autocast=False, attention=Attention.SDPA)
    assert 0.5 < comp / eager < 0.85
