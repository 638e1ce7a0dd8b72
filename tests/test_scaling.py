"""The --params scaling rule: a plausible Llama-style shape whose count is within 2 %."""

from __future__ import annotations

import math
import time

import pytest

from planner.params import total_params
from planner.scaling import ffn_for_hidden, shape_from_params
from planner.spec import MlpKind, NormKind, PositionKind

TOLERANCE = 0.02


def _log_grid(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


@pytest.mark.parametrize("n", _log_grid(1e8, 1e12, 161))
def test_within_two_percent(n):
    spec = shape_from_params(n)
    assert abs(total_params(spec) - n) / n <= TOLERANCE


@pytest.mark.parametrize("n", _log_grid(1e9, 1e12, 61))
def test_aspect_ratio_plausible_from_1e9(n):
    # Kaplan et al. 2020: loss flat over d_model / n_layer of roughly 50..200.
    spec = shape_from_params(n)
    assert 50 <= spec.hidden / spec.n_layers <= 200


def test_llama2_7b_shape():
    exact = shape_from_params(6_738_415_616)
    assert (exact.n_layers, exact.hidden, exact.n_heads, exact.ffn_hidden) == (32, 4096, 32, 11008)
    assert total_params(exact) == 6_738_415_616  # the Llama-2-7B count, to the element
    near = shape_from_params(7e9)
    assert near.hidden == 4096 and abs(near.n_layers - 32) <= 1 and near.ffn_hidden == 11008


def test_llama2_13b_shape():
    spec = shape_from_params(13e9)
    assert (spec.n_layers, spec.hidden, spec.n_heads, spec.ffn_hidden) == (40, 5120, 40, 13824)
    assert spec.n_kv_heads == 40


def test_llama_style():
    spec = shape_from_params(1e9)
    assert spec.shape_assumed
    assert spec.mlp is MlpKind.SWIGLU and spec.norm is NormKind.RMSNORM
    assert spec.position is PositionKind.ROPE
    assert spec.vocab == 32000 and not spec.tied_embeddings and not spec.bias


@pytest.mark.parametrize("n", [1e8, 5e8, 2e9, 7e9, 13e9, 29e9, 31e9, 70e9, 405e9, 1e12, 1e13])
def test_grid_and_head_rules(n):
    spec = shape_from_params(n)
    assert spec.ffn_hidden == ffn_for_hidden(spec.hidden)
    assert spec.ffn_hidden % 256 == 0
    assert spec.d_head == (128 if spec.hidden >= 2048 else 64)
    assert spec.n_heads * spec.d_head == spec.hidden
    if n >= 30e9:
        assert spec.n_kv_heads == 8 and spec.hidden % 1024 == 0
    else:
        assert spec.n_kv_heads == spec.n_heads


def test_ffn_rule_matches_llama():
    assert ffn_for_hidden(4096) == 11008
    assert ffn_for_hidden(5120) == 13824
    assert ffn_for_hidden(8192) == 22016  # Llama-1 65B; Llama-2-70B widened it (28672)


def test_up_to_the_maximum():
    for n in (1e7, 3e7, 2e12, 1e13):
        spec = shape_from_params(n)
        assert abs(total_params(spec) - n) / n <= TOLERANCE


def test_integer_input():
    assert shape_from_params(7_000_000_000) == shape_from_params(7e9)


def test_monotone_in_size():
    sizes = [total_params(shape_from_params(n)) for n in _log_grid(1e8, 1e12, 40)]
    assert sizes == sorted(sizes)


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (0, "0"),
        (-5e9, "-5"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (5e6, "5e+06"),
        (2e13, "2e+13"),
        ("7e9", "'7e9'"),
        (True, "True"),
    ],
)
def test_rejects(bad, fragment):
    with pytest.raises(ValueError) as info:
        shape_from_params(bad)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_fast():
    sizes = _log_grid(1e7, 1e13, 200)
    start = time.perf_counter()
    for n in sizes:
        shape_from_params(n)
    per_call = (time.perf_counter() - start) / len(sizes)
    assert per_call < 5e-3
