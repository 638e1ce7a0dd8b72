"""torchao float8 training (--float8, --float8-all-gather): planner/float8.py.

Expected numbers are derived by hand from torchao's source (planner/float8.py docstring) or
measured by the fake-tensor referee (probes/trace.py with torchao's Float8Linear).
"""

from __future__ import annotations

import pytest

from planner.float8 import cast_elements, gather_saving
from planner.presets import PRESETS
from planner.request import build_request
from planner.spec import (Candidate, Checkpointing, Cluster, Float8Recipe, ModelSpec, Precision,
                          Strategy, TrainingSpec)
from planner.throughput import estimate_step


def _req(**extra):
    v = {"model.preset": "llama3-8b", "hardware.gpu": "h100-80", "hardware.n": 8,
         "training.seq": 8192, "calibration": "none", **extra}
    return build_request(v)


def test_gather_saving_by_hand():
    # llama3-8b block linears: q 4096x4096, k and v 1024x4096, o 4096x4096, gate/up/down
    # 3 x 14336x4096 = 16,777,216 x 2 + 4,194,304 x 2 + 176,160,768 = 218,103,808 weights;
    # bf16 -> float8 saves 1 B each, less 7 float32 scales (28 B)
    tr = TrainingSpec(float8=Float8Recipe.TENSORWISE, float8_all_gather=True)
    assert gather_saving(PRESETS["llama3-8b"], tr, 2) == 218_103_808 - 28
    assert gather_saving(PRESETS["llama3-8b"], TrainingSpec(float8=Float8Recipe.TENSORWISE),
                         2) == 0


def test_linears_not_divisible_by_16_stay_bf16():
    # ffn 1000 = 16 x 62.5: torchtitan's module_filter_fn keeps the MLP in bf16; q 256 x 256,
    # k and v 128 x 256, o 256 x 256 convert: 65,536 x 2 + 32,768 x 2 = 196,608 weights, 4 scales
    from planner.float8 import linears, weights_per_block

    m = ModelSpec(name="odd", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn_hidden=1000,
                  vocab=1024)
    assert len(linears(m)) == 4
    assert weights_per_block(m) == 196_608
    tr = TrainingSpec(float8=Float8Recipe.TENSORWISE, float8_all_gather=True)
    assert gather_saving(m, tr, 2) == 196_608 - 16


def test_cast_elements_by_hand():
    # llama3-8b, per token per block: inputs q,k,v 3x4096 + o 4096 + gate,up 2x4096 + down
    # 14336 = 38,912; outputs 4096 + 2x1024 + 4096 + 2x14336 + 4096 = 43,008. Forward casts the
    # input (38,912); backward the output gradient twice and the input again
    # (2 x 43,008 + 38,912 = 124,928); each weight once in forward and once in backward
    m = PRESETS["llama3-8b"]
    fwd_tok, fwd_micro, bwd_tok, bwd_micro = cast_elements(
        m, TrainingSpec(float8=Float8Recipe.TENSORWISE))
    assert (fwd_tok, bwd_tok) == (32 * 38_912, 32 * 124_928)
    assert fwd_micro == bwd_micro == 32 * 218_103_808
    # gathered in float8: cast on the shard before the all-gather
    assert cast_elements(m, TrainingSpec(float8=Float8Recipe.TENSORWISE,
                                         float8_all_gather=True))[1] == 0
    # rowwise_with_gw_hp: the weight gradient's operands stay bf16 (43,008 per token)
    assert cast_elements(m, TrainingSpec(float8=Float8Recipe.ROWWISE_WITH_GW_HP))[2] == \
        32 * 43_008


def test_float8_lowers_step_time_and_fsdp_buffers():
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.SELECTIVE)
    base, f8 = _req(), _req(**{"training.float8": "tensorwise",
                               "training.float8_all_gather": True})
    t0 = estimate_step(base.model, base.training, base.cluster, c).step_time_s
    t1 = estimate_step(f8.model, f8.training, f8.cluster, c).step_time_s
    assert t1 < t0


def test_cast_time_counts_a_gpus_own_tokens_under_context_parallel():
    """Under --cp 2 a GPU casts the inputs and output gradients of its 8192 / 2 = 4096 tokens
    only; the weights (per micro-batch) are cast whole on every GPU. llama3-8b tensorwise,
    eager: forward per token 32 x 38,912 = 1,245,184 elements (test_cast_elements_by_hand), so
    the token part of the forward cast time is 33 B x 1,245,184 x tokens / HBM: halving the
    tokens halves it, the weight part (32 x 218,103,808 elements) stays."""
    from planner.float8 import CAST_TRAFFIC_EAGER
    from planner.throughput import step_inputs

    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.SELECTIVE)
    one = _req(**{"training.float8": "tensorwise"})
    two = _req(**{"training.float8": "tensorwise", "parallel.cp": 2})
    hbm = one.cluster.gpu.hbm_bandwidth_bytes_per_s
    per_elem = CAST_TRAFFIC_EAGER / hbm
    weights = 32 * 218_103_808 * per_elem
    x1 = step_inputs(one.model, one.training, one.cluster, c)
    x2 = step_inputs(two.model, two.training, two.cluster, c)
    assert x1.f8_cast_fwd_s == pytest.approx(32 * 38_912 * 8192 * per_elem + weights)
    assert x2.f8_cast_fwd_s == pytest.approx(32 * 38_912 * 4096 * per_elem + weights)


@pytest.mark.parametrize("extra, field", [
    ({"hardware.gpu": "a100-80", "training.float8": "tensorwise"}, "--float8"),
    ({"training.float8": "rowwise", "training.float8_all_gather": True}, "--float8-all-gather"),
    ({"model.preset": "mixtral-8x7b", "training.float8": "tensorwise"}, "--float8"),
])
def test_refusals_name_the_field(extra, field):
    with pytest.raises(Exception) as exc:
        _req(**extra)
    assert field in str(exc.value)


@pytest.mark.trace
@pytest.mark.parametrize("recipe, ag, strategy, n", [
    ("tensorwise", False, "full_shard", 4), ("tensorwise", True, "full_shard", 4),
    ("rowwise", False, "full_shard", 4),
    # one GPU under autocast: no cached bf16 copy of a float8 linear's weight
    ("tensorwise", False, "ddp", 1)])
def test_planner_matches_float8_trace(recipe, ag, strategy, n):
    pytest.importorskip("torchao.float8")
    from probes.compare import compare
    from probes.trace import trace_step
    from planner.hardware import load_gpu

    spec = ModelSpec(name="tiny", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2,
                     ffn_hidden=1024, vocab=1024)
    tr = TrainingSpec(seq=1024, precision=Precision.BF16_AMP, float8=Float8Recipe(recipe),
                      float8_all_gather=ag)
    cand = Candidate(strategy=Strategy(strategy))
    gpu = load_gpu("h100-80")
    cl = Cluster(gpu=gpu, n_gpus=n, gpus_per_node=8,
                 host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
    c = compare(spec, tr, cl, cand, trace_step(spec, tr, cand, world_size=n))
    assert abs(c.peak.rel_error) <= 0.02, c.peak
    # saved activations: torchao saves the bf16 input, as a bf16 linear does (to the byte
    # up to the 8-byte scalars); under autocast no weight cache for the float8 linears
    assert abs(c.categories["activations"].rel_error) < 1e-6
    if n > 1:  # the float8 all-gather output: 1 B per linear weight + scales (measured)
        assert abs(c.categories["fsdp_buffers"].rel_error) < 1e-4


# ---------------------------------------------------------------------------------------------
# Job readers: the float8 keys of each framework


def _read(tmp_path, name, text):
    from planner.jobs import read_job

    p = tmp_path / name
    p.write_text(text)
    return read_job(str(p))


def test_torchtitan_float8_section(tmp_path):
    j = _read(tmp_path, "train.toml", '[model]\nname = "llama3"\nflavor = "8B"\n'
              'converters = ["float8"]\n[float8]\nrecipe_name = "rowwise"\n')
    assert j.values["training.float8"] == "rowwise"
    j = _read(tmp_path, "train.toml", '[model]\nname = "llama3"\nflavor = "8B"\n'
              'converters = ["float8"]\n[float8]\nenable_fsdp_float8_all_gather = true\n'
              'filter_fqns = ["output", "layers.0.attention.wq"]\n')
    assert j.values["training.float8"] == "tensorwise"  # no recipe_name: torchao's default
    assert j.values["training.float8_all_gather"] is True
    assert any("filter_fqns" in u for u in j.unmodelled)


def test_accelerate_fp8_backends(tmp_path):
    base = "distributed_type: FSDP\nnum_processes: 8\nmixed_precision: fp8\n"
    j = _read(tmp_path, "acc.yaml", base + "fp8_config:\n  backend: AO\n")
    assert j.values["training.float8"] == "tensorwise"
    j = _read(tmp_path, "acc.yaml", base + "fp8_config:\n  backend: TE\n")
    assert "training.float8" not in j.values
    assert any("TransformerEngine" in u for u in j.unmodelled)


@pytest.mark.trace
def test_float8_under_compile_is_refused_by_the_referee():
    from probes.trace import UnsupportedConfig, check_supported
    from planner.spec import CompileMode

    with pytest.raises(UnsupportedConfig, match="float8 tensorwise with compile blocks"):
        check_supported(TrainingSpec(float8=Float8Recipe.TENSORWISE, compile=CompileMode.BLOCKS),
                        Candidate(strategy=Strategy.FULL_SHARD))
