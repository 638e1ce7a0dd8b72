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


def test_compiled_loss_saves_the_bf16_logits_not_the_fp32_log_softmax():
    """The min-cut partitioner on cross_entropy(logits.float(), labels) with inductor's
    decompositions keeps the bf16 logits and per-token fp32 statistics only, which is what
    planner.activations.loss_terms(compiled=True) counts."""
    import torch
    import torch.nn.functional as F
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    from planner.activations import loss_terms
    from planner.spec import LossKind

    t, v = 64, 1000
    saved: list = []

    def fw(gm, _):
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        saved.extend(a.meta["val"] for a in out[1:] if "val" in getattr(a, "meta", {}))
        return gm

    f = aot_function(lambda x, y: F.cross_entropy(x.float(), y), fw_compiler=fw,
                     bw_compiler=lambda gm, _: gm,
                     partition_fn=min_cut_rematerialization_partition,
                     decompositions=select_decomp_table())
    x = torch.randn(t, v, dtype=torch.bfloat16, requires_grad=True)
    f(x, torch.randint(0, v, (t,))).backward()
    floats = [s for s in saved if s.is_floating_point()]
    nbytes = sum(s.numel() * s.element_size() for s in floats if s.dim() > 0)
    assert nbytes == 2 * t * v + 2 * 4 * t  # bf16 logits + amax, log(sum exp) per token
    from planner.spec import ModelSpec

    model = ModelSpec(name="x", n_layers=1, hidden=64, n_heads=1, n_kv_heads=1, ffn_hidden=64,
                      vocab=v)
    assert loss_terms(model, t, 2, 2, LossKind.FP32, 8, compiled=True).saved.nbytes == nbytes
