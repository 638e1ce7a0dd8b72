"""The model's own loss dtype where no autocast runs, per transformers release (issue 24 item
5). Facts read in the released wheels (planner/loss_dtype.py): LlamaForCausalLM upcasts from
4.31.0 (not 4.30.2); GPT-2, Falcon and BLOOM call ``self.loss_function`` (ForCausalLMLoss,
``logits.float()``) from 4.49.0, and took CrossEntropyLoss on the low-precision logits through
4.48.0. Expected bytes are derived by hand from docs/model.md §7.2's table."""

from __future__ import annotations

import json

import pytest

from planner.fields import parse_transformers_version
from planner.memory.estimator import estimate
from planner.presets import get_preset
from planner.spec import Candidate, Checkpointing, Precision, Strategy, TrainingSpec
from tests.conftest import cluster, one_line_error
from tests.conftest import run as cli

T, V = 1024, 50257  # gpt2-xl: one 1024-token micro-batch, GPT-2's vocabulary


def _total(phase: str, precision: Precision, version: str | None,
           strategy: Strategy = Strategy.DDP, n: int = 1) -> int:
    e = estimate(get_preset("gpt2-xl"),
                 TrainingSpec(seq=T, precision=precision, transformers_version=version),
                 cluster(n, "h100-80"), Candidate(strategy=strategy,
                                                  checkpointing=Checkpointing.FULL))
    return e.phases[phase].total


@pytest.mark.parametrize("phase", ["forward", "loss_bwd"])
def test_gpt2_loss_upcasts_only_from_4_49_without_autocast(phase):
    # pure bf16 (no autocast): upcast = fp32 log_softmax saved 4tV + at the loss the bf16
    # logits and their fp32 copy 2tV + 4tV (backward: 2 x 4tV); not upcast = 2tV saved, 2tV at
    # the loss (backward 2 x 2tV). Either moment differs by 2tV + 4tV = 6tV = 308,779,008
    diff = _total(phase, Precision.BF16, "4.49") - _total(phase, Precision.BF16, "4.48")
    assert diff == 6 * T * V == 308_779_008
    # no version: a recent release (upcasts)
    assert _total(phase, Precision.BF16, None) == _total(phase, Precision.BF16, "4.49")
    # under autocast log_softmax is fp32 either way: no difference
    assert _total(phase, Precision.BF16_AMP, "4.48") == _total(phase, Precision.BF16_AMP,
                                                               "4.49")


def test_deepspeed_bf16_engine_runs_no_autocast():
    # ZeRO's bf16 module: the same 6tV at the loss for an old release
    diff = (_total("forward", Precision.BF16_AMP, "4.49", Strategy.ZERO2, 2)
            - _total("forward", Precision.BF16_AMP, "4.48", Strategy.ZERO2, 2))
    assert diff == 6 * T * V


def test_llama_upcasts_from_4_31():
    m = get_preset("llama2-7b")
    c = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.FULL)

    def total(v):
        return estimate(m, TrainingSpec(seq=1024, precision=Precision.BF16,
                                        transformers_version=v),
                        cluster(1, "h100-80"), c).phases["forward"].total

    # 6 x 1024 x 32000 = 196,608,000
    assert total("4.31") - total("4.30") == 196_608_000
    assert total("4.31") == total("4.49") == total(None)


def test_the_assumption_says_which():
    args = ("--model", "gpt2-xl", "--gpu", "h100-80", "--json")
    doc = json.loads(cli(*args).stdout)
    line = [a for a in doc["assumptions"] if a.startswith("loss:")]
    assert len(line) == 1 and "from transformers 4.49" in line[0] and "assumed" in line[0], line
    doc = json.loads(cli(*args, "--transformers-version", "4.48.1").stdout)
    line = [a for a in doc["assumptions"] if a.startswith("loss:")]
    assert "4.48 < 4.49" in line[0] and "as they are" in line[0], line
    assert doc["inputs"]["training"]["transformers_version"] == "4.48"


@pytest.mark.parametrize("raw,want", [("4.45.2", "4.45"), ("v4.46", "4.46"), ("5.0", "5.0")])
def test_version_parses(raw, want):
    assert parse_transformers_version(raw) == want


@pytest.mark.parametrize("raw", ["4", "four", "3.9", "4.x", 4.5, True])
def test_bad_version_is_one_error(raw):
    with pytest.raises(ValueError):
        parse_transformers_version(raw)


def test_bad_version_flag_is_one_usage_error():
    one_line_error(cli("--params", "7e9", "--gpu", "h100-80", "--transformers-version", "4"),
                   2, "--transformers-version", "transformers release")
