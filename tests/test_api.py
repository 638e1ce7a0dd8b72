"""probes.api.plan_module: a plan from a module you have (not a transformer from a config)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trace

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from planner.plan import Answer  # noqa: E402
from planner.render import answer_json, table  # noqa: E402
from probes.api import plan_module, plan_module_traced  # noqa: E402
from probes.trace_plan import TraceRefused, traced_json, traced_table  # noqa: E402

V, D, L = 512, 128, 3  # every dim 0 a multiple of 4: FSDP at 4 ranks pads nothing


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class ResMLP(nn.Module):
    """A residual MLP language model: no attention, nothing from transformers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.layers = nn.ModuleList(Block() for _ in range(L))
        self.head = nn.Linear(D, V, bias=False)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)  # logits: the default loss is fp32 cross-entropy on them


# by hand: LayerNorm 2D, up 4D^2 + 4D, down 4D^2 + D per block; embedding and head V x D
BLOCK = 2 * D + 4 * D * D + 4 * D + 4 * D * D + D
P = L * BLOCK + 2 * V * D


def meta_model() -> ResMLP:
    with torch.device("meta"):
        return ResMLP()


def test_plan_module_is_the_plan_answer() -> None:
    ta = plan_module_traced(meta_model(), n_gpus=4, gpus_per_node=4, seq=128, micro_batch=2,
                            precision="fp32", strategies=["ddp", "full_shard"],
                            checkpointing="none")
    answer = ta.answer
    assert isinstance(answer, Answer)
    assert ta.facts.params == P and ta.facts.n_layers == L
    assert ta.facts.matmul_per_block == (8 * D * D,) * L and ta.facts.matmul_head == V * D
    ddp, fsdp = answer.estimates
    opt = "optimizer"
    # fp32 AdamW: params, gradients, two moments, 4 bytes each; FULL_SHARD holds a quarter
    assert ddp.phases[opt].params == 4 * P and ddp.phases[opt].gradients == 4 * P
    assert ddp.phases[opt].optimizer_states == 8 * P
    assert fsdp.phases[opt].params == P and fsdp.phases[opt].optimizer_states == 2 * P
    assert ddp.phases[opt].comm_buffers == 4 * P  # DDP's gradient buckets, added
    assert all(e.notes and "trace of ResMLP" in e.notes[0] for e in answer.estimates)
    assert answer.recommendation is not None
    # the plan's own renderers take it; the traced ones say where it came from
    assert "recommendation:" in table(answer)
    doc = answer_json(answer)
    assert [c["strategy"] for c in doc["candidates"]] == ["ddp", "full_shard"]
    # the request's model is the traced module itself: its own count, no invented shape
    assert answer.request.model_source == "trace" and answer.request.traced == ta.facts
    assert doc["inputs"]["model"]["params"] == P and doc["inputs"]["model"]["layers"] == L
    assert doc["inputs"]["model"]["class"] == "ResMLP"
    assert "ResMLP" in traced_table(ta) and traced_json(ta)["source"] == "trace"


def test_a_traced_request_takes_no_model_fields() -> None:
    from planner.errors import UsageError
    from planner.fields import FLAGS
    from planner.request import build_request

    facts = plan_module_traced(meta_model(), n_gpus=1, seq=64, strategies=["ddp"],
                               checkpointing="none", precision="fp32").facts
    with pytest.raises(UsageError, match="--hidden: a traced module is described by its own"):
        build_request({"hardware.gpu": "h100-80", "hardware.n": 1, "model.hidden": 64},
                      FLAGS, traced=facts)


def test_factory_checkpointing_and_custom_batch() -> None:
    calls = []

    def batch(b: int, t: int) -> tuple:
        calls.append((b, t))
        ids = torch.randint(0, V, (b, t))
        return ids, ids

    answer = plan_module(ResMLP, n_gpus=2, gpus_per_node=2, seq=64, strategies=["ddp"],
                         checkpointing="full", make_batch=batch)
    (e,) = answer.estimates
    assert str(e.candidate.checkpointing) == "full" and calls and calls[0] == (1, 64)


def test_a_failing_op_is_refused_with_its_name() -> None:
    class DataDependent(ResMLP):
        def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            logits = super().forward(ids, targets)
            keep = (ids > 3).nonzero()  # a data-dependent shape: fake tensors cannot say
            return logits[keep[:, 0]].float().mean()

    with pytest.raises(TraceRefused, match=r"aten\.nonzero"):
        plan_module(DataDependent, n_gpus=2, gpus_per_node=2, seq=32, strategies=["ddp"],
                    checkpointing="none")


def test_a_module_with_weights_is_refused() -> None:
    with pytest.raises(ValueError, match="meta device"):
        plan_module(ResMLP(), n_gpus=2)
