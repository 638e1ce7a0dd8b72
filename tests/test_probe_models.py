"""The reference module in probes/models.py matches planner.params exactly and trains."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.trace

torch = pytest.importorskip("torch")

from planner.params import param_tensors  # noqa: E402
from planner.spec import (  # noqa: E402
    Checkpointing,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
)
from probes.models import build_model  # noqa: E402

SPECS = {
    "gpt2": ModelSpec(
        name="gpt2-like", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256,
        vocab=256, tied_embeddings=True, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        position=PositionKind.LEARNED, max_positions=128, bias=True,
    ),
    "llama_gqa": ModelSpec(
        name="llama-like", n_layers=2, hidden=64, n_heads=8, n_kv_heads=2, ffn_hidden=176,
        vocab=256,
    ),
    "llama_tied": ModelSpec(
        name="llama-tied", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=176,
        vocab=256, tied_embeddings=True,
    ),
    "qwen_qkv_bias": ModelSpec(
        name="qwen-like", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128,
        vocab=256, qkv_bias=True,
    ),
    "gemma": ModelSpec(
        name="gemma-like", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, head_dim=32,
        ffn_hidden=192, vocab=256, tied_embeddings=True, mlp=MlpKind.GEGLU, norms_per_layer=4,
    ),
    "falcon": ModelSpec(
        name="falcon-like", n_layers=2, hidden=64, n_heads=8, n_kv_heads=1, ffn_hidden=256,
        vocab=256, tied_embeddings=True, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        norms_per_layer=1, parallel_block=True,
    ),
    "falcon40": ModelSpec(
        name="falcon40-like", n_layers=2, hidden=64, n_heads=8, n_kv_heads=2, ffn_hidden=256,
        vocab=256, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM, norms_per_layer=2,
        parallel_block=True,
    ),
    "bert": ModelSpec(
        name="bert-like", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256,
        vocab=256, tied_embeddings=True, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        position=PositionKind.LEARNED, max_positions=64, bias=True, type_vocab=2,
        embedding_norm=True, encoder_head=True,
    ),
    "bert_untied": ModelSpec(
        name="bert-untied", n_layers=1, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256,
        vocab=256, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM, position=PositionKind.LEARNED,
        max_positions=64, bias=True, type_vocab=2, embedding_norm=True, encoder_head=True,
    ),
    "bloom": ModelSpec(
        name="bloom-like", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=256,
        vocab=256, tied_embeddings=True, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
        position=PositionKind.ALIBI, bias=True, embedding_norm=True,
    ),
    "moe": ModelSpec(
        name="mixtral-like", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128,
        vocab=256, n_experts=4, experts_per_token=2,
    ),
    "moe_gelu": ModelSpec(
        name="moe-gelu", n_layers=1, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
        vocab=256, n_experts=4, experts_per_token=1, mlp=MlpKind.GELU,
    ),
}


@pytest.mark.parametrize("key", sorted(SPECS))
def test_named_parameters_match_planner(key: str) -> None:
    spec = SPECS[key]
    model = build_model(spec, device="meta")
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert got == param_tensors(spec)
    assert all(p.is_meta for p in model.parameters())


def test_named_parameters_match_planner_real_sizes() -> None:
    llama7b = ModelSpec(
        name="llama-2-7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=32,
        ffn_hidden=11008, vocab=32000,
    )
    model = build_model(llama7b)  # meta: no memory
    got = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert got == param_tensors(llama7b)
    assert sum(p.numel() for p in model.parameters()) == 6_738_415_616


def test_moe_parameter_order_survives_remove_duplicate_false() -> None:
    spec = SPECS["moe"]
    model = build_model(spec)
    got = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    assert got == [n for n, _ in param_tensors(spec)]


@pytest.mark.parametrize(
    ("key", "checkpointing", "attention"),
    [
        ("llama_gqa", "none", "sdpa"),
        ("llama_gqa", "selective", "eager"),
        ("gemma", "full", "sdpa"),
        ("gpt2", "none", "eager"),
        ("falcon", "selective", "sdpa"),
        ("bert", "none", "eager"),
        ("bloom", "none", "sdpa"),
        ("bloom", "none", "eager"),
        ("moe", "selective", "sdpa"),
        ("moe_gelu", "full", "eager"),
    ],
)
def test_real_forward_backward(key: str, checkpointing: str, attention: str) -> None:
    spec = SPECS[key]
    torch.manual_seed(0)
    model = build_model(
        spec, device="cpu", checkpointing=Checkpointing(checkpointing), attention=attention
    )
    b, t = 2, 16
    ids = torch.randint(0, spec.vocab, (b, t))
    targets = torch.randint(0, spec.vocab, (b, t))
    loss = model(ids, targets)
    assert loss.dim() == 0 and math.isfinite(loss.item())
    # A near-uniform initial prediction: loss close to log(vocab).
    assert abs(loss.item() - math.log(spec.vocab)) < 1.0
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name


def test_checkpointing_does_not_change_gradients() -> None:
    spec = SPECS["llama_gqa"]
    ids = torch.randint(0, spec.vocab, (2, 16))
    grads = {}
    for mode in ("none", "selective", "full"):
        torch.manual_seed(0)
        model = build_model(spec, device="cpu", checkpointing=Checkpointing(mode))
        model(ids, ids).backward()
        grads[mode] = {n: p.grad for n, p in model.named_parameters()}
    for mode in ("selective", "full"):
        for n, g in grads["none"].items():
            torch.testing.assert_close(grads[mode][n], g, msg=f"{mode}: {n}")


def test_eager_and_sdpa_agree() -> None:
    for key in ("llama_gqa", "bloom", "bert"):
        spec = SPECS[key]
        ids = torch.randint(0, spec.vocab, (2, 16))
        losses = []
        for attn in ("sdpa", "eager"):
            torch.manual_seed(0)
            model = build_model(spec, device="cpu", attention=attn)
            losses.append(model(ids, ids).item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5), key


def test_op_level_selective_checkpointing_keeps_gradients() -> None:
    spec = SPECS["llama_gqa"]
    ids = torch.randint(0, spec.vocab, (2, 16))
    grads = []
    for mode, policy in (("none", "regions"), ("selective", "op")):
        torch.manual_seed(0)
        model = build_model(
            spec, device="cpu", checkpointing=Checkpointing(mode), selective_policy=policy
        )
        model(ids, ids).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, msg=n)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_dropout_forward_backward(attention: str) -> None:
    import dataclasses

    spec = dataclasses.replace(SPECS["gpt2"], dropout=0.1)
    torch.manual_seed(0)
    model = build_model(spec, device="cpu", attention=attention, checkpointing="full")
    ids = torch.randint(0, spec.vocab, (2, 16))
    loss = model(ids, ids)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    a, b = model(ids, ids).item(), model(ids, ids).item()
    assert a == b  # no dropout in eval mode
