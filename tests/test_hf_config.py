"""config.json parsing: the example configs (real values, tests/data/configs) and each error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from planner.hf_config import ConfigError, load_hf_config, spec_from_hf_config
from planner.params import total_params
from planner.presets import get_preset
from planner.spec import MlpKind, NormKind, PositionKind

CONFIGS = Path(__file__).parent / "data" / "configs"
EXAMPLES = sorted(p.stem for p in CONFIGS.glob("*.json") if not p.name.startswith("err-"))


def _shape(spec):
    """A spec's fields without its name."""
    return dataclasses.replace(spec, name="x")


def test_examples_present():
    assert len(EXAMPLES) >= 12


@pytest.mark.parametrize("stem", EXAMPLES)
def test_example_config_matches_preset(stem):
    """Each example file is the model's real config.json; it must read as the preset's shape."""
    spec = load_hf_config(CONFIGS / f"{stem}.json")
    assert spec.name == str(CONFIGS / f"{stem}.json")
    preset = get_preset(stem)
    if stem == "bert-base":
        # the file names BertForMaskedLM (no pooler); the preset is BertForPreTraining's
        assert spec.pooler is False and preset.pooler is True
        preset = dataclasses.replace(preset, pooler=False)
    assert _shape(spec) == _shape(preset)


def test_directory_means_its_config_json(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "mistral-7b.json").read_text())
    assert _shape(load_hf_config(tmp_path)) == _shape(get_preset("mistral-7b"))


def _llama_cfg(**changes):
    cfg = json.loads((CONFIGS / "llama2-7b.json").read_text())
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not ...}


def test_llama_defaults():
    cfg = _llama_cfg(num_key_value_heads=..., tie_word_embeddings=...)
    spec = spec_from_hf_config(cfg, "c")  # Llama-1 style: no num_key_value_heads
    assert spec.n_kv_heads == spec.n_heads == 32
    assert not spec.tied_embeddings  # LlamaConfig default
    assert spec.mlp is MlpKind.SWIGLU and spec.norm is NormKind.RMSNORM
    assert spec.position is PositionKind.ROPE


def test_null_optional_keys_take_defaults():
    spec = spec_from_hf_config(_llama_cfg(num_key_value_heads=None, head_dim=None), "c")
    assert spec.n_kv_heads == 32 and spec.head_dim == 0


def test_llama_attention_bias():
    assert spec_from_hf_config(_llama_cfg(attention_bias=True), "c").qkv_bias
    both = spec_from_hf_config(_llama_cfg(attention_bias=True, mlp_bias=True), "c")
    assert both.bias


def test_head_dim_kept_only_when_not_implied():
    assert spec_from_hf_config(_llama_cfg(head_dim=128), "c").head_dim == 0
    assert spec_from_hf_config(_llama_cfg(head_dim=96), "c").q_dim == 32 * 96


def test_gemma2_defaults_tied_and_sandwich_norms():
    spec = load_hf_config(CONFIGS / "gemma2-9b.json")  # the file has no tie_word_embeddings
    assert spec.tied_embeddings and spec.norms_per_layer == 4 and spec.mlp is MlpKind.GEGLU
    assert spec.d_head == 256


def test_gemma1_is_geglu_with_two_norms():
    # google/gemma-7b config.json
    cfg = {
        "model_type": "gemma", "hidden_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
        "intermediate_size": 24576, "vocab_size": 256000, "hidden_act": "gelu",
    }  # fmt: skip
    spec = spec_from_hf_config(cfg, "gemma-7b")
    assert spec.mlp is MlpKind.GEGLU and spec.norms_per_layer == 2 and spec.tied_embeddings
    assert abs(total_params(spec) - 8.54e9) / 8.54e9 < 0.005  # Hub: 8.54B


def test_mixtral_defaults_when_expert_keys_absent():
    cfg = json.loads((CONFIGS / "mixtral-8x7b.json").read_text())
    del cfg["num_local_experts"], cfg["num_experts_per_tok"]
    spec = spec_from_hf_config(cfg, "c")
    assert (spec.n_experts, spec.experts_per_token) == (8, 2)  # MixtralConfig defaults


def test_dense_config_with_top_k_key_stays_dense():
    spec = spec_from_hf_config(_llama_cfg(num_experts_per_tok=2), "c")
    assert spec.n_experts == 1 and spec.experts_per_token == 1


def test_gpt2_variants():
    base = json.loads((CONFIGS / "gpt2.json").read_text())
    spec = spec_from_hf_config({**base, "n_inner": 1000, "n_positions": 2048}, "c")
    assert spec.ffn_hidden == 1000 and spec.max_positions == 2048
    no_type = {k: v for k, v in base.items() if k != "model_type"}
    assert _shape(spec_from_hf_config(no_type, "c")) == _shape(get_preset("gpt2"))


def test_bloom_7b1_keys():
    # bigscience/bloom-7b1 config.json
    cfg = {"model_type": "bloom", "n_layer": 30, "n_head": 32, "hidden_size": 4096,
           "vocab_size": 250880}  # fmt: skip
    assert _shape(spec_from_hf_config(cfg, "c")) == _shape(get_preset("bloom-7b1"))
    # bigscience/bloom spells the width n_embed
    big = {"model_type": "bloom", "n_layer": 70, "num_attention_heads": 112, "n_embed": 14336,
           "vocab_size": 250880}  # fmt: skip
    assert abs(total_params(spec_from_hf_config(big, "c")) - 176.2e9) / 176.2e9 < 0.005


def test_falcon_num_kv_heads_ignored_without_new_architecture():
    # Some falcon-7b dumps carry num_kv_heads = 71 next to multi_query = true.
    cfg = json.loads((CONFIGS / "falcon-7b.json").read_text())
    assert spec_from_hf_config({**cfg, "num_kv_heads": 71}, "c").n_kv_heads == 1


def test_falcon_legacy_refinedweb_keys():
    # tiiuae/falcon-40b before the transformers port (model_type RefinedWeb).
    cfg = {"model_type": "RefinedWeb", "hidden_size": 8192, "n_layer": 60, "n_head": 128,
           "n_head_kv": 8, "vocab_size": 65024, "parallel_attn": True, "bias": False}  # fmt: skip
    assert _shape(spec_from_hf_config(cfg, "c")) == _shape(get_preset("falcon-40b"))
    # tiiuae/falcon-7b before the port (model_type RefinedWebModel).
    cfg7 = {"model_type": "RefinedWebModel", "hidden_size": 4544, "n_layer": 32, "n_head": 71,
            "multi_query": True, "vocab_size": 65024, "parallel_attn": True}  # fmt: skip
    assert _shape(spec_from_hf_config(cfg7, "c")) == _shape(get_preset("falcon-7b"))


def test_falcon_rw_sequential_alibi():
    # tiiuae/falcon-rw-1b: sequential block, ALiBi, biases, multi-head.
    cfg = {"model_type": "falcon", "hidden_size": 2048, "num_hidden_layers": 24,
           "num_attention_heads": 32, "vocab_size": 50304, "alibi": True, "bias": True,
           "multi_query": False, "parallel_attn": False,
           "new_decoder_architecture": False}  # fmt: skip
    spec = spec_from_hf_config(cfg, "c")
    assert spec.position is PositionKind.ALIBI and spec.bias and not spec.parallel_block
    assert spec.norms_per_layer == 2 and spec.n_kv_heads == 32
    assert abs(total_params(spec) - 1.31e9) / 1.31e9 < 0.005  # Hub: 1.31B


def test_unknown_model_type_is_an_error_unless_approximate():
    cfg = _llama_cfg(model_type="internlm2")
    with pytest.raises(ConfigError) as info:
        spec_from_hf_config(cfg, "x.json")
    message = str(info.value)
    assert message.startswith("x.json: fitcheck does not model model_type 'internlm2' (read as")
    assert "--from-trace" in message and "--approximate" in message and "--layers" in message
    notes: list[str] = []
    spec = spec_from_hf_config(cfg, "x.json", notes=notes, approximate=True)
    assert spec.mlp is MlpKind.SWIGLU and spec.hidden == 4096
    assert notes == ["x.json: approximate reading: model_type 'internlm2' (read as a Llama-style "
                     "decoder: swiglu, rmsnorm, rope)"]


def test_text_config_wrapper_is_an_error_unless_approximate():
    inner = json.loads((CONFIGS / "mistral-7b.json").read_text())
    cfg = {"model_type": "llava", "text_config": inner, "vision_config": {"hidden_size": 1024}}
    with pytest.raises(ConfigError, match=r"^c: fitcheck does not model the vision encoder of "
                       r"model_type 'llava' \(only its language model is read\)"):
        spec_from_hf_config(cfg, "c")
    notes: list[str] = []
    spec = spec_from_hf_config(cfg, "c", notes=notes, approximate=True)
    assert _shape(spec) == _shape(get_preset("mistral-7b"))
    assert len(notes) == 1 and "vision encoder" in notes[0]


# --- errors: ConfigError (a ValueError), one line, naming the file and the problem ---------


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_hf_config(path)
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, ValueError)
    return message


def test_error_invalid_json():
    path = CONFIGS / "err-invalid.json"
    message = _error(path)
    assert message.startswith(f"{path}: not valid JSON: ")
    assert "line" in message  # json's own location text


def test_error_invalid_json_label_is_the_path_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("config.json").write_text("{not json")
    assert _error(Path("config.json")).startswith("config.json: not valid JSON: ")


def test_error_not_an_object():
    path = CONFIGS / "err-not-object.json"
    assert _error(path) == f"{path}: expected a JSON object, got list"


def test_error_missing_keys_names_all_of_them():
    path = CONFIGS / "err-missing-keys.json"
    assert _error(path) == f"{path} is missing required keys: hidden_size, num_hidden_layers"


def test_error_missing_keys_gpt2_uses_its_names():
    with pytest.raises(ConfigError, match=r"^c is missing required keys: n_embd, n_head$"):
        spec_from_hf_config({"model_type": "gpt2", "n_layer": 12, "vocab_size": 50257}, "c")


def test_error_missing_keys_with_alias():
    cfg = {"model_type": "falcon", "hidden_size": 4544, "vocab_size": 65024, "n_head": 71}
    expected = r"missing required keys: num_hidden_layers \(or n_layer\)$"
    with pytest.raises(ConfigError, match=expected):
        spec_from_hf_config(cfg, "c")


def test_error_wrong_type():
    path = CONFIGS / "err-bad-type.json"
    assert _error(path) == f'{path}: hidden_size must be a positive integer, got "4096"'


def test_error_non_positive():
    path = CONFIGS / "err-non-positive.json"
    assert _error(path) == f"{path}: num_hidden_layers must be a positive integer, got 0"


@pytest.mark.parametrize(
    "key, value, shown",
    [
        ("hidden_size", None, "null"),
        ("hidden_size", True, "true"),
        ("hidden_size", 4096.5, "4096.5"),
        ("vocab_size", -1, "-1"),
        ("num_key_value_heads", 0, "0"),
    ],
)
def test_error_bad_values_name_key_and_value(key, value, shown):
    with pytest.raises(ConfigError) as info:
        spec_from_hf_config(_llama_cfg(**{key: value}), "c")
    assert str(info.value) == f"c: {key} must be a positive integer, got {shown}"


def test_integral_float_accepted():
    assert spec_from_hf_config(_llama_cfg(hidden_size=4096.0), "c").hidden == 4096


def test_error_bad_bool():
    expected = r'^c: tie_word_embeddings must be true or false, got "no"$'
    with pytest.raises(ConfigError, match=expected):
        spec_from_hf_config(_llama_cfg(tie_word_embeddings="no"), "c")


def test_error_bad_model_type():
    with pytest.raises(ConfigError, match=r"^c: model_type must be a string, got 7$"):
        spec_from_hf_config(_llama_cfg(model_type=7), "c")


def test_error_inconsistent_heads():
    path = CONFIGS / "err-heads.json"
    message = _error(path)
    assert message.startswith(f"{path}: n_heads (32) must be a multiple of n_kv_heads (6)")


def test_error_unsupported_model_type():
    path = CONFIGS / "err-unsupported.json"
    message = _error(path)
    assert message.startswith(f"{path}: model_type 'mamba' is not supported")
    assert "hidden_size" in message and "llama" in message


def test_error_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    assert _error(path) == f"{path}: no such file"


def test_error_not_utf8(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe{}")
    assert _error(path).startswith(f"{path}: not valid JSON: ")
