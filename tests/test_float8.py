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


def test_eager_float8_is_slower_and_compiled_faster_as_measured():
    """llama3-8b on 8 GPUs, float8 all-gather: eager float8 is slower than bf16, compiled
    faster, as one H100 measured (benchmarks/gpu_runs/2026-11-26-h100-b, 8 fake ranks:
    f8w8-8b-fsdp-sel 1.113 s bf16 vs 1.845 s twag eager; cf8w8-8b-fsdp-full 0.991 s vs
    0.810 s compiled): the eager casts cost more than the float8 matmuls save."""
    tw = {"training.float8": "tensorwise", "training.float8_all_gather": True}
    for ckpt, compiled in ((Checkpointing.SELECTIVE, {}),
                           (Checkpointing.FULL, {"training.compile": "blocks"})):
        c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ckpt)
        base, f8 = _req(**compiled), _req(**compiled, **tw)
        t0 = estimate_step(base.model, base.training, base.cluster, c).step_time_s
        t1 = estimate_step(f8.model, f8.training, f8.cluster, c).step_time_s
        assert (t1 > t0) if not compiled else (t1 < t0), (ckpt, t0, t1)


# The hand-derived cast times below: llama3-8b (32 blocks), 8192 tokens per micro-batch, one
# GPU's share at tp 1, h100-80 (3.35e12 B/s). Elements (test_cast_elements_by_hand):
# forward 32 x 38,912 x 8192 = 10,200,547,328 (inputs) + 32 x 218,103,808 = 6,979,321,856
# (weights) = 17,179,869,184; backward 32 x 124,928 x 8192 = 32,749,125,632 + 6,979,321,856
# = 39,728,447,488. Layout copies (torchao preprocess_addmm): per token the weight gradient's
# output gradient and input, 32 x (43,008 + 38,912) = 2,621,440, x 8192 = 21,474,836,480,
# + the input gradient's weights 6,979,321,856 = 28,454,158,336, at 2 counted bytes, each
# counted byte at the eager cast's measured 44.5 / 33 B-equivalent.
HBM_H100 = 3.35e12
F8_FWD, F8_BWD, F8_COPY = 17_179_869_184, 39_728_447_488, 28_454_158_336


def _f8_inputs(**extra):
    from planner.throughput import step_inputs

    r = _req(**extra)
    return step_inputs(r.model, r.training, r.cluster, Candidate(strategy=Strategy.FULL_SHARD))


def test_eager_cast_and_copy_time_by_hand():
    x = _f8_inputs(**{"training.float8": "tensorwise"})
    assert x.f8_cast_fwd_s == pytest.approx(F8_FWD * 44.5 / HBM_H100)  # 0.2282 s
    assert x.f8_cast_bwd_s == pytest.approx(
        (F8_BWD * 44.5 + F8_COPY * 2 * 44.5 / 33) / HBM_H100)  # 0.5277 + 0.0229 s


def test_rowwise_rescales_its_gradients_by_hand():
    """Rowwise runs both gradient matmuls through the tensorwise kernel and rescales the
    output (float8_ops.py addmm_float8_unwrapped): 12 counted bytes per element of the input
    gradient (32 x 38,912 x 8192 = 10,200,547,328) and the weight gradient (6,979,321,856):
    17,179,869,184 elements; its casts and copies are tensorwise's."""
    x = _f8_inputs(**{"training.float8": "rowwise"})
    assert x.f8_cast_bwd_s == pytest.approx(
        (F8_BWD * 44.5 + F8_COPY * 2 * 44.5 / 33 + 17_179_869_184 * 12 * 44.5 / 33)
        / HBM_H100)


def test_compiled_casts_at_the_compiled_rate_without_copies():
    # the same elements at the compiled cast's measured 18.8 B-equivalent; inductor fuses the
    # layout copies and the rescale (not counted)
    for recipe in ("tensorwise", "rowwise"):
        x = _f8_inputs(**{"training.float8": recipe, "training.compile": "blocks"})
        assert x.f8_cast_fwd_s == pytest.approx(F8_FWD * 18.8 / HBM_H100)
        assert x.f8_cast_bwd_s == pytest.approx(F8_BWD * 18.8 / HBM_H100)


def test_float8_all_gather_casts_the_shard_before_each_gather():
    """Gathered in float8 the weights are not cast whole (forward: the 10,200,547,328 token
    elements only); each of the two all-gathers casts the GPU's 1/8 shard:
    2 x 6,979,321,856 / 8 = 1,744,830,464 elements, in the backward's time."""
    x = _f8_inputs(**{"training.float8": "tensorwise", "training.float8_all_gather": True})
    assert x.f8_cast_fwd_s == pytest.approx(10_200_547_328 * 44.5 / HBM_H100)
    assert x.f8_cast_bwd_s == pytest.approx(
        ((32_749_125_632 + 1_744_830_464) * 44.5 + F8_COPY * 2 * 44.5 / 33) / HBM_H100)


def test_matmul_rates_measured_on_h100_assumed_elsewhere():
    """h100-80: bf16 / float8 matmul time over the 30 Llama 8B/70B linear shapes of
    benchmarks/gpu_runs/2026-11-26-h100-b (record gemm): 1.81 tensorwise, 1.63 rowwise. A
    float8 FLOP saves 1 - 1/1.81 = 0.4475 of a bf16 one's time; rowwise's forward
    1 - 1/1.63 = 0.3865 and its gradients (tensorwise kernel) 0.4475. h200 is not measured:
    its datasheet ratio 1979 / 989 (f8_discount 1 - 989/1979 = 0.5003, as before)."""
    x = _f8_inputs(**{"training.float8": "tensorwise"})
    assert x.f8_discount == pytest.approx(1 - 1 / 1.81)
    assert x.f8_discount_bwd == pytest.approx(1 - 1 / 1.81)
    x = _f8_inputs(**{"training.float8": "rowwise"})
    assert x.f8_discount == pytest.approx(1 - 1 / 1.63)
    assert x.f8_discount_bwd == pytest.approx(1 - 1 / 1.81)
    x = _f8_inputs(**{"training.float8": "tensorwise", "hardware.gpu": "h200"})
    assert x.f8_discount == pytest.approx(1 - 989 / 1979)
    assert x.f8_discount_bwd == pytest.approx(1 - 989 / 1979)


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


# ---------------------------------------------------------------------------------------------
# The float8 / bf16 step-time ratio against one H100's records


H100_B = "benchmarks/gpu_runs/2026-11-26-h100-b"


def _f8_pairs():
    """(float8 record, its bf16 reference) of every float8 case with a ``-ref`` twin in the
    H100 run: the same model, loop and candidate in bf16."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / H100_B
    recs = {}
    for path in sorted(root.glob("run*-records.jsonl")):
        for r in map(json.loads, path.read_text().splitlines()):
            if r["record"] == "case" and r["ok"] and r["training"]["float8"] != "none":
                recs[r["id"]] = r
            elif r["record"] == "case" and r["ok"] and r["id"].endswith("-ref"):
                recs[r["id"]] = r
    return [(recs[i], recs[i.rsplit("-", 1)[0] + "-ref"]) for i in sorted(recs)
            if not i.endswith("-ref") and i.rsplit("-", 1)[0] + "-ref" in recs]


F8_PAIRS = _f8_pairs()


@pytest.mark.parametrize("rec, ref", F8_PAIRS, ids=[r["id"] for r, _ in F8_PAIRS])
def test_float8_over_bf16_step_time_against_the_h100(rec, ref):
    """The planner's float8 / bf16 step-time ratio within 35 % of the measured one (11 pairs:
    1B / 3B on one real rank, 8B on 8 fake ranks whose steps have no communication, so the
    planner's compute time is compared there), and on the measured side of 1: eager float8
    slower than bf16 in every pair, compiled 8B faster.

    35 %: the per-linear check of the same model (docs/model.md "Float8 training", layer
    check) leaves an eager Float8Linear's forward + backward 20-35 % under the H100's
    (record float8_layer, 8B shapes): what the cast measurement and torchao's counted work do
    not explain; a step's ratio carries at most that linear error. The model before the
    measured rates (datasheet fp8 peak, 33 / 5 B per cast element) fails 7 of these pairs:
    6 by more (-37 % to -47 %), cf8-1b-fsdp-none-rw on the wrong side of 1."""
    from planner.hardware import load_gpu
    from probes.gpu_records import row_of

    gpu = load_gpu("h100-80")

    def planned(r):
        row = row_of(r, gpu)
        st = estimate_step(row.model, row.training, row.cluster, row.cand)
        return st.compute_s if r.get("fake_group") else st.step_time_s

    measured = rec["step_time_s"] / ref["step_time_s"]
    ratio = planned(rec) / planned(ref)
    assert abs(ratio / measured - 1) <= 0.35, (measured, ratio)
    assert (ratio > 1) == (measured > 1), (measured, ratio)
