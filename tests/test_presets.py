"""Presets: every shape reproduces its model's published parameter count.

Tolerance: 0.5 % (relative) against the published figure. Where the publisher gives an exact
count (the Hugging Face Hub's safetensors total, or the model card) the layout matches it to
the element; rounded figures ("7.61B") are matched within their rounding.
"""

from __future__ import annotations

import dataclasses

import pytest

from planner.params import active_params, total_params
from planner.presets import PRESETS, UnknownModelError, _key, get_preset, list_presets

TOLERANCE = 0.005

# id -> (published total parameter count, where it is published / what it includes)
PUBLISHED: dict[str, tuple[float, str]] = {
    # GPT-2: transformers GPT2LMHeadModel.num_parameters() (lm_head tied to wte, 1024-row wpe).
    # Model cards say 124M / 355M / 774M / 1.5B. The Hub's safetensors totals are larger
    # because the checkpoints also store the attn.bias causal-mask buffers.
    "gpt2": (124_439_808, "HF GPT2LMHeadModel, card 124M"),
    "gpt2-medium": (354_823_168, "HF GPT2LMHeadModel, card 355M"),
    "gpt2-large": (774_030_080, "HF GPT2LMHeadModel, card 774M"),
    "gpt2-xl": (1_557_611_200, "HF GPT2LMHeadModel, card 1.5B"),
    # BERT: the bert-*-uncased checkpoints are BertForPreTraining: BertModel with pooler
    # (109,482,240 / 335,141,888) + MLM head (dense, LayerNorm, decoder bias; decoder tied)
    # + NSP head (2 x hidden + 2). The reference layout has everything but the NSP head
    # (1,538 / 2,050 elements). Devlin et al. 2019 round these to 110M / 340M; 340M is 1.1 %
    # above the exact count, so the exact count is the reference.
    "bert-base": (110_106_428, "HF BertForPreTraining (bert-base-uncased); paper 110M"),
    "bert-large": (336_226_108, "HF BertForPreTraining (bert-large-uncased); paper 340M"),
    # Llama: Hugging Face Hub safetensors totals (Meta's model cards say 7B/13B/70B, 8B/70B, 405B).
    "llama2-7b": (6_738_415_616, "HF Hub meta-llama/Llama-2-7b-hf"),
    "llama2-13b": (13_015_864_320, "HF Hub meta-llama/Llama-2-13b-hf"),
    "llama2-70b": (68_976_648_192, "HF Hub meta-llama/Llama-2-70b-hf"),
    "llama3-8b": (8_030_261_248, "HF Hub meta-llama/Meta-Llama-3-8B"),
    "llama3-70b": (70_553_706_496, "HF Hub meta-llama/Meta-Llama-3-70B"),
    "llama3.1-8b": (8_030_261_248, "HF Hub meta-llama/Llama-3.1-8B"),
    "llama3.1-70b": (70_553_706_496, "HF Hub meta-llama/Llama-3.1-70B"),
    "llama3.1-405b": (405_853_388_800, "HF Hub meta-llama/Llama-3.1-405B (405.85B)"),
    "llama3.2-1b": (1_235_814_400, "HF Hub meta-llama/Llama-3.2-1B; card 1.23B (tied)"),
    "llama3.2-3b": (3_212_749_824, "HF Hub meta-llama/Llama-3.2-3B; card 3.21B (tied)"),
    "mistral-7b": (7_241_732_096, "HF Hub mistralai/Mistral-7B-v0.1 (7.24B)"),
    # Mixtral: Hub total; Mistral's announcement: "46.7B total parameters ... 12.9B per token".
    "mixtral-8x7b": (46_702_792_704, "HF Hub mistralai/Mixtral-8x7B-v0.1; blog 46.7B"),
    # Qwen2.5 model cards: "Number of Parameters: 7.61B" / "72.7B".
    "qwen2.5-7b": (7.61e9, "Qwen/Qwen2.5-7B model card"),
    "qwen2.5-72b": (72.7e9, "Qwen/Qwen2.5-72B model card"),
    # Gemma-2: Hub safetensors totals (9.24B / 27.2B).
    "gemma2-9b": (9_241_705_984, "HF Hub google/gemma-2-9b"),
    "gemma2-27b": (27_227_128_320, "HF Hub google/gemma-2-27b"),
    # Falcon: see test_falcon_hub_counts_store_the_tied_head_twice; the trained model ties
    # lm_head to word_embeddings, so its count is the Hub total less one vocab x hidden table.
    "falcon-7b": (7.22e9 - 65024 * 4544, "HF Hub tiiuae/falcon-7b 7.22B less stored lm_head"),
    "falcon-40b": (41.8e9 - 65024 * 8192, "HF Hub tiiuae/falcon-40b 41.8B less stored lm_head"),
    # BLOOM model cards list exact counts.
    "bloom-560m": (559_214_592, "bigscience/bloom-560m model card"),
    "bloom-7b1": (7_069_016_064, "bigscience/bloom-7b1 model card"),
    # Phi-3-mini: card "3.8B parameters"; Hub safetensors 3.82B.
    "phi3-mini": (3.82e9, "HF Hub microsoft/Phi-3-mini-4k-instruct"),
    "phi3-mini-128k": (3.82e9, "HF Hub microsoft/Phi-3-mini-128k-instruct"),
    "mistral-7b-v0.2": (7_241_732_096, "HF Hub mistralai/Mistral-7B-Instruct-v0.2 (7.24B)"),
    # issue 13 (model cards; tests/test_hf_config_archs.py has the exact class counts)
    "qwen1.5-moe-a2.7b": (14.3e9, "Qwen/Qwen1.5-MoE-A2.7B card: 14.3B total, 2.7B active"),
    "qwen3-8b": (8.2e9, "Qwen/Qwen3-8B card: 8.2B"),
    "qwen3-14b": (14.8e9, "Qwen/Qwen3-14B card: 14.8B"),
    "qwen3-32b": (32.8e9, "Qwen/Qwen3-32B card: 32.8B"),
    "qwen3-30b-a3b": (30.5e9, "Qwen/Qwen3-30B-A3B card: 30.5B total, 3.3B active"),
    "gemma3-1b": (1.0e9, "google/gemma-3-1b-pt card: 1B"),
    "olmo-1b": (1.18e9, "allenai/OLMo-1B-hf card: 1.18B"),
    "olmo2-7b": (7.3e9, "allenai/OLMo-2-1124-7B card: 7.3B"),
    "phi-2": (2.78e9, "HF Hub microsoft/phi-2 safetensors 2.78B (card: 2.7B)"),
    "phi-4": (14.7e9, "HF Hub microsoft/phi-4 safetensors 14.7B (card: 14B)"),
    "deepseek-v2-lite": (15.7e9, "deepseek-ai/DeepSeek-V2-Lite card: 15.7B total, 2.4B active"),
    "deepseek-v3": (671e9, "deepseek-ai/DeepSeek-V3 README: 671B main model (+14B MTP "
                           "module, which transformers does not build)"),
}

REQUIRED_IDS = [
    "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large", "llama2-7b",
    "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-8b", "llama3.1-70b",
    "llama3.1-405b", "llama3.2-1b", "llama3.2-3b", "mistral-7b", "mixtral-8x7b", "qwen2.5-7b",
    "qwen2.5-72b", "gemma2-9b", "gemma2-27b", "falcon-7b", "falcon-40b", "bloom-560m",
    "bloom-7b1", "phi3-mini",
]  # fmt: skip


def test_required_presets_exist():
    assert set(REQUIRED_IDS) <= set(list_presets())


def test_every_preset_has_a_published_count():
    assert set(PRESETS) == set(PUBLISHED)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_total_params_match_published(name):
    published, source = PUBLISHED[name]
    got = total_params(get_preset(name))
    assert abs(got - published) / published <= TOLERANCE, (name, got, published, source)


@pytest.mark.parametrize(
    "name, exact",
    [
        ("gpt2", 124_439_808),
        ("llama2-7b", 6_738_415_616),
        ("llama3-8b", 8_030_261_248),
        ("llama3.1-405b", 405_853_388_800),
        ("mixtral-8x7b", 46_702_792_704),
        ("gemma2-9b", 9_241_705_984),
        ("bloom-560m", 559_214_592),
        ("bloom-7b1", 7_069_016_064),
    ],
)
def test_exact_counts(name, exact):
    assert total_params(get_preset(name)) == exact


def test_bert_counts_by_component():
    # BertModel (embeddings + encoder + pooler) is 109,482,240; the MLM head adds
    # dense (768*768 + 768) + LayerNorm (2*768) + decoder bias (30522).
    assert total_params(get_preset("bert-base")) == 109_482_240 + 590_592 + 1_536 + 30_522


def test_mixtral_active_params():
    # Mistral AI, "Mixtral of experts" (2023-12-11): 12.9B parameters used per token.
    active = active_params(get_preset("mixtral-8x7b"))
    assert abs(active - 12.9e9) / 12.9e9 <= TOLERANCE
    assert active == 12_879_925_248  # 2 of 8 experts + attention, router, norms, embeddings


def test_dense_active_equals_total():
    for spec in PRESETS.values():
        if not spec.is_moe:
            assert active_params(spec) == total_params(spec)


def test_falcon_hub_counts_store_the_tied_head_twice():
    # transformers PR #35715: Falcon ties lm_head to word_embeddings, yet the checkpoints store
    # lm_head.weight; the Hub's file-based totals (7.22B, 41.8B) therefore count it twice.
    for name, hub in (("falcon-7b", 7.22e9), ("falcon-40b", 41.8e9)):
        spec = get_preset(name)
        assert spec.tied_embeddings
        untied = total_params(dataclasses.replace(spec, tied_embeddings=False))
        assert abs(untied - hub) / hub <= TOLERANCE


def test_shape_details():
    assert get_preset("llama3.2-1b").tied_embeddings
    assert get_preset("llama3.2-3b").tied_embeddings
    assert not get_preset("llama3-8b").tied_embeddings
    assert get_preset("llama3.2-1b").d_head == 64
    assert get_preset("gemma2-9b").d_head == 256 and get_preset("gemma2-9b").q_dim == 4096
    assert get_preset("gemma2-27b").d_head == 128
    assert get_preset("qwen2.5-7b").qkv_bias
    assert get_preset("falcon-7b").n_kv_heads == 1
    assert get_preset("falcon-7b").norms_per_layer == 1
    assert get_preset("falcon-40b").norms_per_layer == 2
    assert get_preset("falcon-40b").d_head == 64
    assert get_preset("mixtral-8x7b").n_experts == 8
    assert get_preset("mixtral-8x7b").experts_per_token == 2
    assert get_preset("bloom-7b1").position == "alibi"
    for spec in PRESETS.values():
        assert not spec.shape_assumed


def test_preset_names_match_keys():
    for name, spec in PRESETS.items():
        assert spec.name == name


@pytest.mark.parametrize(
    "spelling, expected",
    [
        ("Llama2-7B", "llama2-7b"),
        ("llama-2-7b", "llama2-7b"),
        (" llama2_7b ", "llama2-7b"),
        ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
        ("meta-llama/Llama-3.1-405B", "llama3.1-405b"),
        ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
        ("Qwen2.5-72B", "qwen2.5-72b"),
        ("bert-base-uncased", "bert-base"),
        ("openai-community/gpt2", "gpt2"),
    ],
)
def test_spellings_and_hub_ids(spelling, expected):
    assert get_preset(spelling).name == expected


def test_loose_keys_do_not_collide():
    keys = [_key(name) for name in PRESETS]
    assert len(keys) == len(set(keys))


def test_unknown_model_suggests_close_matches():
    with pytest.raises(UnknownModelError) as info:
        get_preset("llama2-8b")
    message = str(info.value)
    assert "unknown model 'llama2-8b'" in message
    assert "llama2-7b" in message and "llama3-8b" in message
    assert "\n" not in message
    assert info.value.suggestions


def test_unknown_model_is_value_and_key_error():
    with pytest.raises(ValueError):
        get_preset("gtp2")
    with pytest.raises(KeyError):
        get_preset("gtp2")
    try:
        get_preset("gtp2")
    except UnknownModelError as exc:
        assert exc.suggestions[0] == "gpt2"
        assert str(exc).startswith("unknown model")  # not KeyError's quoted repr


def test_unknown_model_without_matches_lists_presets():
    with pytest.raises(UnknownModelError, match="known models: gpt2, "):
        get_preset("zzzzzzzz")
