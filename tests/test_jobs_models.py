"""The models a job names: MoE never shrinks silently under --approximate, hybrid layers are
refused (exit 4 for the analytic plan, exit 5 for --from-trace, naming the module and op), and
a hub id fitcheck does not know is refused with the next step, never a guessed preset.

The configs in tests/data/jobs/models/ are the config classes of transformers 5.24 at the
published models' sizes (tests/data/jobs/SOURCES.md); the parameter counts below are
transformers' own, counted on the meta device (sum of p.numel() over
AutoModelForCausalLM.from_config), not fitcheck's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line_error, run

from planner.hf_config import ConfigError, config_params, spec_from_hf_config
from planner.params import total_params

MODELS = Path(__file__).parent / "data" / "jobs" / "models"
TRANSFORMERS_PARAMS = {  # transformers 5.24, meta device
    "gpt-oss-120b": 116_829_156_672,
    "llama4-scout-text": 107_769_861_120,
    "glm-4.5-air": 106_852_245_504,
    "kimi-k2": 1_026_408_209_408,
}


def config(name: str) -> dict:
    return json.loads((MODELS / f"{name}.json").read_text())


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_PARAMS))
def test_approximate_moe_counts_the_experts(name):
    notes: list = []
    spec = spec_from_hf_config(config(name), name, notes=notes, approximate=True)
    want = TRANSFORMERS_PARAMS[name]
    assert abs(total_params(spec) - want) / want < 0.01, (total_params(spec), want)
    assert spec.n_experts > 1
    assert any("approximate reading" in str(n) for n in notes)  # still says it is approximate


def test_kimi_k2_reads_as_deepseek_v3_not_its_dense_trunk():
    notes: list = []
    spec = spec_from_hf_config(config("kimi-k2"), "kimi", notes=notes, approximate=True)
    assert spec.n_experts == 384 and spec.kv_lora_rank == 512  # 1.03T, not 33.7B
    assert any("read as DeepSeek-V3" in str(n) for n in notes)


@pytest.mark.parametrize("name, needles", [
    ("qwen3-next-80b-a3b", ["model_type 'qwen3_next'", "linear_num_value_heads",
                            "linear_attention"]),
    ("jamba-v0.1", ["model_type 'jamba'", "attn_layer_period", "mamba_d_state"]),
])
def test_hybrid_layers_are_refused_even_approximately(name, needles):
    with pytest.raises(ConfigError) as err:
        spec_from_hf_config(config(name), name, approximate=True)
    message = str(err.value)
    assert "not attention + MLP blocks only" in message and "--from-trace" in message
    for needle in needles:
        assert needle in message


def test_hybrid_refusal_at_the_cli_is_exit_4():
    r = run("--config", str(MODELS / "jamba-v0.1.json"), "--approximate", "--gpu", "h100-80",
            "--n", "8")
    one_line_error(r, 4, "jamba-v0.1.json", "not attention + MLP blocks only", "mamba_d_state")


def test_an_approximate_reading_prints_the_configs_own_arithmetic_when_they_differ():
    # a Mixtral-style config whose experts the class would ignore: the count is named beside
    cfg = {"model_type": "mystery", "hidden_size": 4096, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
           "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2}
    notes: list = []
    spec = spec_from_hf_config(cfg, "m", notes=notes, approximate=True)
    # Mixtral-8x7B's published size: 46.7B parameters
    assert abs(total_params(spec) - 46.7e9) / 46.7e9 < 0.01
    own = config_params(cfg)
    assert abs(own - 46.7e9) / 46.7e9 < 0.01
    assert not any("own arithmetic" in str(n) for n in notes)  # they agree: nothing to say
    # and a reading that disagrees by more than 5% says so, with both numbers: here the
    # dense trunk alone (7.2B) against the config's 46.7B
    from planner import hf_config
    from planner.spec import ModelSpec

    dense = ModelSpec(name="m", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
                      ffn_hidden=14336, vocab=32000)
    found: list[str] = []
    hf_config._cross_check(cfg, dense, "m", found)
    assert len(found) == 1 and "the config's own arithmetic" in found[0]
    assert "7.24B" in found[0] and "46.70B" in found[0]


# ---------------------------------------------------------------------------------------------
# Hub ids


@pytest.mark.parametrize("ident", ["mistralai/Mistral-7B-Instruct-v0.3",
                                   "Qwen/Qwen3-4B-Instruct-2507"])
def test_a_refused_hub_id_suggests_its_config_and_no_lookalike_preset(ident):
    r = run("--model", ident, "--gpu", "h100-80")
    one_line_error(r, 2, ident, "--config path/to/config.json")
    # Mistral-7B-v0.3's vocabulary is 32768: mistral-7b and mistral-7b-v0.2 (32000) differ
    assert "mistral-7b" not in r.stderr.split(";", 1)[1] and "did you mean" not in r.stderr


def test_a_misspelt_preset_still_gets_close_matches():
    r = run("--model", "lama3-8b", "--gpu", "h100-80")
    one_line_error(r, 2, "did you mean", "llama3-8b")


# ---------------------------------------------------------------------------------------------
# --from-trace: refused at once, naming the module and the op


@pytest.mark.trace
@pytest.mark.parametrize("name, module, op", [
    ("qwen3-next-80b-a3b", "Qwen3NextGatedDeltaNet", "gated delta rule"),
    ("jamba-v0.1", "JambaMambaMixer", "selective scan"),
])
def test_untraceable_layers_are_refused_by_the_trace(name, module, op):
    from probes.hf import inspect
    from probes.trace_types import UnsupportedConfig

    with pytest.raises(UnsupportedConfig) as err:
        inspect({"config": config(name)})
    assert module in str(err.value) and op in str(err.value)


@pytest.mark.trace
def test_llama4_composite_config_traces_its_language_model():
    transformers = pytest.importorskip("transformers")
    from probes.hf import inspect

    facts = inspect({"config": transformers.Llama4Config().to_dict()})
    assert facts["class"] == "Llama4ForCausalLM" and facts["n_layers"] == 48
