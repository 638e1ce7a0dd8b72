"""The architectures read from config.json (planner/hf_config.py): each real config
(tests/data/configs/archs, fields copied from the published config.json named in its "_source")
must give the parameter count of the transformers class and the published one.

Expected counts: the transformers 5.23 class built from the same config on the meta device
(``sum(p.numel() for p in model.parameters())``, a measurement; tests/test_hf_trace.py repeats
it for the small shapes) and the model card's rounded figure (the fixture's "_published").
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.hf_config import (
    ConfigError,
    NotModelledError,
    load_hf_config,
    spec_from_hf_config,
)
from planner.params import active_params, total_params
from planner.spec import NormKind, QkNorm

ARCHS = Path(__file__).parent / "data" / "configs" / "archs"

# file -> (class count measured, published total, published active or None)
COUNTS = {
    "deepseek-v2-lite": (15_706_484_224, 15.7e9, 2.4e9),
    "deepseek-v3": (671_026_404_352, 671e9, 37e9),
    "qwen1.5-moe-a2.7b": (14_315_784_192, 14.3e9, 2.7e9),
    "qwen3-8b": (8_190_735_360, 8.2e9, None),
    "qwen3-30b-a3b": (30_532_122_624, 30.5e9, 3.3e9),
    "gemma3-1b": (999_885_952, 1.0e9, None),
    "olmo2-7b": (7_298_617_344, 7.3e9, None),
    "olmo-1b": (1_176_764_416, 1.18e9, None),
    "phi-2": (2_779_683_840, 2.7e9, None),
    "phi-4": (14_659_507_200, 14.7e9, None),
}


def test_fixtures_name_their_source():
    for path in ARCHS.glob("*.json"):
        cfg = json.loads(path.read_text())
        assert cfg["_source"].startswith("https://huggingface.co/"), path


@pytest.mark.parametrize("stem", sorted(COUNTS))
def test_parameter_count_equals_the_class_and_the_published(stem):
    exact, published, active = COUNTS[stem]
    notes: list[str] = []
    spec = load_hf_config(ARCHS / f"{stem}.json", notes=notes)
    assert total_params(spec) == exact
    assert abs(total_params(spec) - published) <= 0.05 * published  # card rounding (1B, 2.7B)
    if active is not None:
        # the cards round the activated count (DeepSeek-V2-Lite's 2.4B leaves out the
        # embeddings; fitcheck counts them: 2.66B)
        assert abs(active_params(spec) - active) <= 0.12 * active, active_params(spec)
    assert all("approximate" not in n for n in notes)


@pytest.mark.parametrize("stem", sorted(COUNTS))
def test_config_reads_as_its_preset(stem):
    import dataclasses

    from planner.presets import get_preset

    spec = load_hf_config(ARCHS / f"{stem}.json")
    assert dataclasses.replace(spec, name="x") == dataclasses.replace(get_preset(stem), name="x")


@pytest.mark.parametrize(("hub_id", "preset"), [
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"), ("Qwen/Qwen3-8B", "qwen3-8b"),
    ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"), ("google/gemma-3-1b-it", "gemma3-1b"),
    ("allenai/OLMo-2-1124-7B-Instruct", "olmo2-7b"), ("microsoft/phi-2", "phi-2"),
    ("microsoft/phi-4", "phi-4"), ("Qwen/Qwen1.5-MoE-A2.7B-Chat", "qwen1.5-moe-a2.7b"),
])
def test_hub_ids_resolve(hub_id, preset):
    from planner.presets import get_preset

    assert get_preset(hub_id).name == preset


def test_deepseek_v2_lite_by_hand():
    """27 layers, hidden 2048, 16 heads, MLA without q compression (q_lora_rank null):
    q 2048 -> 16*(128+64); kv_a 2048 -> 512+64; kv_a_norm 512; kv_b 512 -> 16*(128+128);
    o 16*128 -> 2048. Layer 0 dense (first_k_dense_replace 1): SwiGLU 10944. Layers 1-26:
    router 64x2048, 64 experts of SwiGLU 1408, 2 shared experts (SwiGLU 2816). Vocabulary
    102400, untied; norms of 2048."""
    h, V = 2048, 102400
    attn = h * 16 * 192 + h * 576 + 512 + 512 * 16 * 256 + 16 * 128 * h
    dense = attn + 3 * h * 10944 + 2 * h
    moe = attn + 64 * h + 64 * 3 * h * 1408 + 3 * h * 2816 + 2 * h
    spec = load_hf_config(ARCHS / "deepseek-v2-lite.json")
    assert spec.mla and spec.n_dense_layers == 1 and spec.n_experts == 64
    assert total_params(spec) == dense + 26 * moe + 2 * V * h + h == 15_706_484_224


def test_deepseek_v3_mtp_left_out_with_a_note():
    notes: list[str] = []
    spec = load_hf_config(ARCHS / "deepseek-v3.json", notes=notes)
    assert spec.q_lora_rank == 1536 and spec.n_dense_layers == 3
    assert any("num_nextn_predict_layers" in n for n in notes)


def test_family_features():
    read = {stem: load_hf_config(ARCHS / f"{stem}.json") for stem in COUNTS}
    assert read["qwen3-8b"].qk_norm is QkNorm.HEAD and read["gemma3-1b"].qk_norm is QkNorm.HEAD
    assert read["olmo2-7b"].qk_norm is QkNorm.FULL and read["olmo2-7b"].post_norms
    assert read["olmo-1b"].norm is NormKind.LAYERNORM_PLAIN and read["olmo-1b"].tied_embeddings
    q = read["qwen1.5-moe-a2.7b"]
    assert (q.shared_ffn, q.shared_expert_gate, q.qkv_bias) == (5632, True, True)
    p = read["phi-2"]
    assert p.parallel_block and p.norms_per_layer == 1 and p.head_bias and p.python_gelu
    assert read["phi-4"].fused_gate_up and read["gemma3-1b"].norms_per_layer == 4


def test_qwen_moe_dense_layers_from_sparse_step_and_mlp_only_layers():
    cfg = json.loads((ARCHS / "qwen1.5-moe-a2.7b.json").read_text())
    spec = spec_from_hf_config({**cfg, "mlp_only_layers": [0, 5]}, "c")
    assert spec.n_dense_layers == 2 and spec.dense_ffn_hidden == 5632
    spec = spec_from_hf_config({**cfg, "decoder_sparse_step": 2}, "c")
    assert spec.n_dense_layers == 12  # layers 0, 2, 4, ... ((i + 1) % 2 != 0)
    # every layer dense: a dense model
    assert spec_from_hf_config({**cfg, "mlp_only_layers": list(range(24))}, "c").n_experts == 1


def test_vision_language_config_is_an_error_naming_the_tower_and_next_step():
    path = ARCHS / "qwen2.5-vl-7b.json"
    with pytest.raises(NotModelledError) as info:
        load_hf_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: fitcheck does not model the vision encoder")
    assert "model_type 'qwen2_5_vl'" in message and "--from-trace" in message
    assert "\n" not in message and isinstance(info.value, ConfigError)
    notes: list[str] = []
    spec = load_hf_config(path, notes=notes, approximate=True)
    assert spec.hidden == 3584 and len(notes) == 2  # the tower, the model_type


@pytest.mark.parametrize(("changes", "what"), [
    ({"model_type": "llama", "mlp_bias": True}, "mlp_bias without attention_bias"),
    ({"model_type": "llama", "hidden_act": "relu"}, "gated MLP activation 'relu'"),
    ({"model_type": "mistral", "num_local_experts": 8}, "experts in a mistral config"),
])
def test_fields_not_modelled_are_errors(changes, what):
    cfg = json.loads((ARCHS.parent / "llama2-7b.json").read_text())
    with pytest.raises(NotModelledError, match=f"^c: fitcheck does not model {what}"):
        spec_from_hf_config({**cfg, **changes}, "c")
    notes: list[str] = []
    spec_from_hf_config({**cfg, **changes}, "c", notes=notes, approximate=True)
    assert notes == [f"c: approximate reading: {n.split('approximate reading: ')[1]}"
                     for n in notes] and what in notes[0]


def test_llama_attention_bias_biases_o_too():
    cfg = json.loads((ARCHS.parent / "llama2-7b.json").read_text())
    spec = spec_from_hf_config({**cfg, "attention_bias": True}, "c")
    assert spec.qkv_bias and spec.attn_out_bias and not spec.bias
    # LlamaAttention: q, k, v and o each get a bias of their output width (4096, MHA)
    assert total_params(spec) == 6_738_415_616 + 32 * 4 * 4096


def test_bert_pooler_follows_the_class():
    cfg = json.loads((ARCHS.parent / "bert-base.json").read_text())
    assert spec_from_hf_config(cfg, "c").pooler is False  # BertForMaskedLM
    with pytest.raises(NotModelledError, match="next-sentence head"):
        spec_from_hf_config({**cfg, "architectures": ["BertForPreTraining"]}, "c")
    assert spec_from_hf_config({**cfg, "architectures": ["BertModel"]}, "c").pooler


# --- the approximation reaches the output: exit 4 without it; text, JSON, gate with it -----


def test_cli_refuses_then_warns_with_approximate():
    from click.testing import CliRunner

    from planner.cli import cli

    path = str(ARCHS / "qwen2.5-vl-7b.json")
    base = ["--config", path, "--gpu", "h100-80", "--n", "8"]
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 4 and "does not model the vision encoder" in r.output
    r = CliRunner().invoke(cli, [*base, "--approximate"])
    assert r.exit_code in (0, 3) and "warning:" in r.output and "vision encoder" in r.output
    r = CliRunner().invoke(cli, [*base, "--approximate", "--json"])
    doc = json.loads(r.stdout)  # stderr may hold a stale-calibration warning
    assert any("approximate reading: the vision encoder" in w for w in doc["warnings"])


def test_gate_inline_config_approximation_is_a_verdict_warning():
    from planner.errors import FitcheckError
    from planner.gate import request_from_spec

    cfg = json.loads((ARCHS / "qwen2.5-vl-7b.json").read_text())
    spec = {"model": {"config": cfg}, "hardware": {"gpu": "h100-80", "n": 8}}
    with pytest.raises(FitcheckError, match="does not model the vision encoder"):
        request_from_spec(spec, allow_files=False)
    spec["model"]["approximate"] = True
    request = request_from_spec(spec, allow_files=False)
    assert any("vision encoder" in w for w in request.warnings)


def test_fsdp2_expert_padding_by_hand():
    """Mixtral-8x7B at 16 ranks: each of the 3 stacked expert weights per layer (8, 14336,
    4096) gives every rank ceil(8 / 16) = 1 expert's 14336 x 4096 elements where an even
    split gives it 8 / 16 = half of one: half an expert of padding per tensor, 32 layers x 3
    tensors."""
    from planner.memory.states import expert_padding
    from planner.params import tensor_groups
    from planner.presets import get_preset

    groups = tensor_groups(get_preset("mixtral-8x7b"))
    assert expert_padding(groups, 16) == 32 * 3 * 14336 * 4096 // 2
    assert expert_padding(groups, 8) == 0  # one expert per rank: no padding
    assert expert_padding(groups, 4) == 0
