"""The default attention follows the model's family as transformers picks it (issue 24 item 6):
planner/attention.py's table, the config.json's own attn_implementation, the assumption line,
and the table against the installed transformers' classes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from planner.attention import FAMILIES, default_attention
from planner.cli import cli
from planner.hf_config import ConfigError, spec_from_hf_config
from planner.presets import get_preset
from planner.spec import Attention, ModelSpec

LLAMA_CFG = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000}


def _spec(family: str, attn: str = "") -> ModelSpec:
    return dataclasses.replace(get_preset("llama2-7b"), family=family, attn_implementation=attn)


@pytest.mark.parametrize("family,expected", [
    # 5.24.0: BloomPreTrainedModel sets no _supports_sdpa; Gemma2PreTrainedModel sets it False
    ("bloom", Attention.EAGER), ("gemma2", Attention.EAGER),
    # _supports_sdpa = True: Llama since 4.36.0, GPT-2 since 4.42.0, Gemma-3 in 5.24.0
    ("llama", Attention.SDPA), ("gpt2", Attention.SDPA), ("gemma3_text", Attention.SDPA),
    # RefinedWeb configs build FalconForCausalLM (4.36.0: _supports_sdpa = True)
    ("RefinedWebModel", Attention.SDPA),
])
def test_family_default(family, expected):
    attn, line = default_attention(_spec(family))
    assert attn is expected
    assert line.startswith(f"attention: {expected}")
    assert "_supports_sdpa" in line and "modeling_" in line


@pytest.mark.parametrize("family,version,expected,says", [
    # MistralPreTrainedModel: no _supports_sdpa in 4.36.0, True in 4.40.0 (the releases read)
    ("mistral", "4.36", Attention.EAGER, "4.36.0 has no sdpa for it"),
    ("mistral", "4.38", Attention.EAGER, "ASSUMED eager"),  # between the two: the larger need
    ("mistral", "4.40", Attention.SDPA, "since 4.40.0"),
    # GPT-2: eager through 4.40.0, sdpa from 4.42.0
    ("gpt2", "4.40.1", Attention.EAGER, "4.40.0 has no sdpa for it"),
    ("gpt2", "4.42", Attention.SDPA, "since 4.42.0"),
    # Qwen3 first appears in a release after 4.48.0: nothing read says it ran eager before,
    # so an older version does not turn it eager
    ("qwen3", "4.45", Attention.SDPA, "since 5.24.0"),
])
def test_family_default_follows_the_transformers_version(family, version, expected, says):
    attn, line = default_attention(_spec(family), version)
    assert attn is expected
    assert says in line and line.startswith(f"attention: {expected}")


def test_the_cli_passes_the_transformers_version_to_the_attention_default():
    lines = _attention_lines(_json("--model", "mistral-7b", "--transformers-version", "4.36"))
    assert len(lines) == 1 and lines[0].startswith("attention: eager, T x T scores kept "
                                                   "(transformers 4.36:")
    assert _attention_lines(_json("--model", "mistral-7b"))[0].startswith("attention: sdpa")


def test_unknown_family_is_sdpa_and_says_it_is_assumed():
    attn, line = default_attention(_spec("mamba2"))
    assert attn is Attention.SDPA
    assert "ASSUMED for model_type 'mamba2'" in line


@pytest.mark.parametrize("named,expected", [
    ("eager", Attention.EAGER), ("paged|eager", Attention.EAGER),
    ("flash_attention_2", Attention.SDPA), ("sdpa", Attention.SDPA),
    ("flex_attention", Attention.SDPA),
])
def test_config_named_attention_wins_over_the_family(named, expected):
    # gemma2's default is eager; llama's sdpa: the config's own choice is followed for both
    for family in ("gemma2", "llama"):
        attn, line = default_attention(_spec(family, named))
        assert attn is expected
        assert line == f"attention: {expected} (config.json attn_implementation {named!r})"


def test_unrecognised_config_attention_falls_back_to_the_family_and_says_so():
    attn, line = default_attention(_spec("bloom", "my_kernel"))
    assert attn is Attention.EAGER
    assert "attn_implementation 'my_kernel' not recognised" in line


def test_config_reading_keeps_family_and_named_attention():
    spec = spec_from_hf_config({**LLAMA_CFG, "_attn_implementation": "eager"}, "c")
    assert (spec.family, spec.attn_implementation) == ("llama", "eager")
    spec = spec_from_hf_config({**LLAMA_CFG, "attn_implementation": "flash_attention_2"}, "c")
    assert spec.attn_implementation == "flash_attention_2"
    # a wrapper's language model: the family is text_config's
    wrapped = {"model_type": "llava", "text_config": {**LLAMA_CFG, "model_type": "mistral"}}
    assert spec_from_hf_config(wrapped, "c", approximate=True).family == "mistral"
    with pytest.raises(ConfigError, match="c: attn_implementation must be a string"):
        spec_from_hf_config({**LLAMA_CFG, "attn_implementation": 3}, "c")


def test_presets_carry_the_family_of_the_config_they_cite():
    assert get_preset("bloom-7b1").family == "bloom"
    assert get_preset("gemma2-9b").family == "gemma2"
    assert get_preset("phi-4").family == "phi3"  # microsoft/phi-4 config.json: model_type phi3
    assert get_preset("qwen3-30b-a3b").family == "qwen3-moe"


def _json(*args):
    r = CliRunner().invoke(cli, [*args, "--gpu", "h100-80", "--n", "8", "--json"])
    assert r.exit_code in (0, 3), r.output
    return json.loads(r.output)


def _attention_lines(doc):
    return [a for a in doc["assumptions"] if a.startswith("attention:")]


def test_plan_uses_eager_for_bloom_and_states_it():
    doc = _json("--model", "bloom-7b1")
    assert [a.split(" (")[0] for a in _attention_lines(doc)] == ["attention: eager, T x T scores kept"]
    given = _json("--model", "bloom-7b1", "--attention", "sdpa")
    assert _attention_lines(given) == ["attention: sdpa (given)"]
    # eager keeps B x n_h x T^2 probabilities per block: without checkpointing the loss-time
    # moment (every block's activations) is larger than under sdpa; full checkpointing keeps
    # the blocks' inputs only, the same for both
    fwd = {name: {(c["strategy"], c["offload"], c["checkpointing"], c["tp"]):
                  c["phase_allocated_bytes"]["forward"] for c in d["candidates"]}
           for name, d in (("eager", doc), ("sdpa", given))}
    common = fwd["eager"].keys() & fwd["sdpa"].keys()
    assert common and all(fwd["eager"][k] >= fwd["sdpa"][k] for k in common)
    assert all(fwd["eager"][k] > fwd["sdpa"][k] for k in common if k[2] == "none")
    assert any(k[2] == "none" for k in common)


def test_llama_states_sdpa_and_params_only_says_nothing():
    lines = _attention_lines(_json("--model", "llama3-8b"))
    assert len(lines) == 1 and lines[0].startswith("attention: sdpa (transformers default for "
                                                   "llama")
    assert _attention_lines(_json("--params", "7e9")) == []


def test_table_matches_the_installed_transformers():
    # each family's class attribute, read from the transformers installed here (the table
    # was read from 5.24.0's files); another version is not what the table describes
    transformers = pytest.importorskip("transformers")
    if transformers.__version__ != "5.24.0":
        pytest.skip(f"table read from transformers 5.24.0, {transformers.__version__} installed")
    import importlib

    for family, fam in FAMILIES.items():
        mod_name = {"gemma3-text": "gemma3"}.get(family, family).replace("-", "_")
        mod = importlib.import_module(f"transformers.models.{mod_name}.modeling_{mod_name}")
        cls = getattr(mod, fam.cls)
        assert bool(getattr(cls, "_supports_sdpa", False)) is fam.sdpa, family
