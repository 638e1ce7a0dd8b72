"""FSDP's mixed-precision policy as inputs (issue 24, item 2): ``--param-dtype``,
``--reduce-dtype``, ``--output-dtype`` and ``--storage-dtype`` (``TrainingSpec.mixed_precision``,
``planner.spec.FsdpDtypes``); ``--precision`` stays the shorthand.

The mechanism that made the policy an input: with bf16 parameters and an fp32 ``reduce_dtype``,
FSDP2 keeps a micro-batch's unsharded gradients in the reduce dtype until the synced one
(``FSDPParam.to_accumulated_grad_if_needed``: ``unsharded_grad.to(self.reduce_dtype)``), 4
bytes a parameter where the parameters take 2. Expected bytes below are derived by hand from
the shape; the trace (probes/trace.py, the same policy applied to the reference module) is the
referee."""

from __future__ import annotations

import json

import pytest

from conftest import run
from planner.hardware import load_gpu
from planner.memory import Phase, estimate
from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    Dtype,
    FsdpDtypes,
    GradSync,
    MixedPrecision,
    ModelSpec,
    Precision,
    Strategy,
    TrainingSpec,
)

# 4 blocks of hidden 512, 8 heads, ffn 1024 (SwiGLU), vocabulary 4096, untied:
#   block = 2 norms 2x512 + q,k,v,o 4x512x512 + gate,up,down 3x512x1024 = 2,622,464
#   root  = embed 4096x512 + final norm 512 + head 4096x512 = 4,194,816
#   P     = 4 x 2,622,464 + 4,194,816 = 14,684,672
MODEL = ModelSpec(name="small", n_layers=4, hidden=512, n_heads=8, n_kv_heads=8,
                  ffn_hidden=1024, vocab=4096)
P = 14_684_672
FULL = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)


def cluster(n: int) -> Cluster:
    gpu = load_gpu("h100-80")
    return Cluster(gpu=gpu, n_gpus=n, gpus_per_node=8, host_ram_bytes_per_node=2**40)


def training(precision: Precision, **mp: str) -> TrainingSpec:
    return TrainingSpec(seq=512, precision=precision, grad_accum=2, grad_sync=GradSync.LAST,
                        **{k: Dtype(v) for k, v in mp.items()})


@pytest.mark.parametrize("precision, mp, expected", [
    # --precision alone: torchtitan's policy for -amp, none otherwise
    (Precision.FP32, {}, (4, 4, 4)),
    (Precision.BF16_AMP, {}, (4, 2, 4)),
    (Precision.FP16_AMP, {}, (4, 2, 4)),
    (Precision.BF16, {}, (2, 2, 2)),
    # bf16 parameters, fp32 reduce (the case)
    (Precision.BF16, {"reduce_dtype": "fp32"}, (2, 2, 4)),
    # each flag replaces one value of the shorthand: -amp's fp32 reduce stays
    (Precision.BF16_AMP, {"param_dtype": "bf16"}, (4, 2, 4)),
    (Precision.BF16_AMP, {"param_dtype": "fp16"}, (4, 2, 4)),
    # fp32 has no policy: without a reduce_dtype FSDP reduces in the gradients' dtype
    # (param_dtype; foreach_reduce: ``reduce_dtype or grad_dtype``)
    (Precision.FP32, {"param_dtype": "bf16"}, (4, 2, 2)),
    # a reduce_dtype below the parameters': accumulated (and reduced) in bf16
    (Precision.FP32, {"reduce_dtype": "bf16"}, (4, 4, 2)),
    # bf16 storage under -amp: param_dtype equals it (FSDP2 drops the cast), reduce stays fp32
    (Precision.BF16_AMP, {"storage_dtype": "bf16"}, (2, 2, 4)),
    (Precision.BF16_AMP, {"storage_dtype": "bf16", "reduce_dtype": "bf16"}, (2, 2, 2)),
    # pure bf16 with fp32 storage asked for: no policy, computed in fp32
    (Precision.BF16, {"storage_dtype": "fp32"}, (4, 4, 4)),
])
def test_the_policy_resolves_from_the_shorthand(precision, mp, expected):
    d = FsdpDtypes.of(precision, MixedPrecision(**{k: Dtype(v) for k, v in mp.items()}))
    assert (d.storage, d.param, d.reduce) == expected


def test_fp32_reduce_keeps_the_unsynced_gradients_in_fp32():
    """Under set_requires_gradient_sync(False) every GPU holds the whole model's unsharded
    gradients from the second micro-batch on: P x 2 bytes in bf16, P x 4 with an fp32
    reduce_dtype (+2 B/param)."""
    def held(**mp: str) -> int:
        e = estimate(MODEL, training(Precision.BF16, **mp), cluster(4), FULL, margin=0.0)
        return e.phases[Phase.FORWARD].gradients

    assert held() == P * 2
    assert held(reduce_dtype="fp32") == P * 4


def test_storage_dtype_sets_the_states():
    """bf16 storage: parameters, gradients and AdamW's two states 2 bytes each, sharded 4
    ways: P / 4 x (2 + 2 + 2 x 2) = P x 2."""
    e = estimate(MODEL, TrainingSpec(seq=512, storage_dtype=Dtype.BF16,
                                     param_dtype=Dtype.BF16), cluster(4), FULL, margin=0.0)
    b = e.phases[Phase.OPTIMIZER]
    assert b.params == P * 2 // 4 and b.gradients == P * 2 // 4
    assert b.optimizer_states == P * 2 * 2 // 4


def test_flags_parse_and_are_named_in_errors():
    base = ("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--strategy", "full_shard",
            "--checkpointing", "full", "--calibration", "none", "--json")
    r = run(*base, "--precision", "bf16", "--grad-accum", "4", "--grad-sync", "last")
    r32 = run(*base, "--precision", "bf16", "--grad-accum", "4", "--grad-sync", "last",
              "--reduce-dtype", "fp32")
    assert r.exit_code == 0 and r32.exit_code == 0, r32.output
    need = [json.loads(x.stdout)["candidates"][0]["peak_allocated_bytes"] for x in (r, r32)]
    # Llama-3-8B: 8,030,261,248 parameters, 2 more bytes each while unsynced
    assert need[1] - need[0] == 2 * 8_030_261_248
    bad = run(*base, "--reduce-dtype", "fp8")
    assert bad.exit_code == 2 and "--reduce-dtype" in bad.output


@pytest.mark.trace
@pytest.mark.parametrize("precision, mp, ck", [
    (Precision.BF16, {"reduce_dtype": "fp32"}, Checkpointing.NONE),
    (Precision.BF16, {}, Checkpointing.NONE),
    (Precision.BF16_AMP, {"reduce_dtype": "bf16"}, Checkpointing.NONE),
    (Precision.BF16_AMP, {"storage_dtype": "bf16"}, Checkpointing.FULL),
    (Precision.FP32, {"reduce_dtype": "bf16"}, Checkpointing.NONE),
    (Precision.FP32, {"param_dtype": "bf16"}, Checkpointing.FULL),
    (Precision.BF16_AMP, {"output_dtype": "fp32"}, Checkpointing.NONE),
])
def test_the_trace_agrees(precision, mp, ck):
    """The same policy on the reference module under FSDP2 (probes/trace.py fsdp_policies):
    peak within 2 %, model states exact, and the accumulated unsynced gradients are the
    hand-derived P x (reduce bytes)."""
    pytest.importorskip("torch")
    from probes.compare import compare
    from probes.trace import trace_step

    t = training(precision, **mp)
    cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck)
    r = trace_step(MODEL, t, cand, 4, 8)
    c = compare(MODEL, t, cluster(4), cand, r)
    assert c.ok, c.reason
    assert abs(c.peak.rel_error) <= 0.02, c.peak
    for name in ("params", "gradients", "optimizer"):
        assert abs(c.categories[name].rel_error) <= 1e-3, (name, c.categories[name])
    reduce = FsdpDtypes.of(precision, t.mixed_precision).reduce
    assert r["moments"]["forward"]["at_peak"]["unsharded_grads"] == P * reduce


# ---- torchtitan's [training] mixed_precision_reduce (planner/jobs/readers/torchtitan.py) ----

TT = "torchtitan_llama3_8b.v0.2.0.toml"


def _tt(tmp_path, extra: str):
    from pathlib import Path

    from planner.jobs import read_job

    data = Path(__file__).resolve().parent / "data" / "jobs"
    text = (data / TT).read_text()
    assert "[training]\n" in text
    out = tmp_path / TT
    out.write_text(text.replace("[training]\n", "[training]\n" + extra, 1))
    return read_job(str(out))


def test_torchtitan_reduce_dtype_is_read(tmp_path):
    # the file as published: no key, bf16-amp, the reduce dtype left to --precision's fp32
    j = _tt(tmp_path, "")
    assert j.values["training.precision"] == "bf16-amp"
    assert "training.reduce_dtype" not in j.values and not j.unmodelled
    j = _tt(tmp_path, 'mixed_precision_reduce = "bfloat16"\n')
    assert j.values["training.reduce_dtype"] == "bf16" and not j.unmodelled
    # a bf16 model: apply_fsdp still passes mixed_precision_reduce (default float32) to the
    # policy, so the reduce-scatter and the unsynced accumulation run in fp32
    j = _tt(tmp_path, 'dtype = "bfloat16"\n')
    assert j.values["training.precision"] == "bf16"
    assert j.values["training.reduce_dtype"] == "fp32"
    assert "mixed_precision_reduce (default float32)" in j.where("training.reduce_dtype")
    j = _tt(tmp_path, 'dtype = "bfloat16"\nmixed_precision_reduce = "bfloat16"\n')
    assert j.values["training.reduce_dtype"] == "bf16"


def test_torchtitan_unknown_reduce_dtype_is_one_line(tmp_path):
    path = tmp_path / TT
    from pathlib import Path
    data = Path(__file__).resolve().parent / "data" / "jobs"
    path.write_text((data / TT).read_text().replace(
        "[training]\n", '[training]\nmixed_precision_reduce = "float8"\n', 1))
    r = run("--job", str(path), "--gpu", "h100-80", "--model", "llama3-8b")
    assert r.exit_code == 4 and "mixed_precision_reduce" in r.stderr and "float8" in r.stderr


# ---- accelerate's FSDP plugin (planner/jobs/readers/accelerate.py fsdp) ---------------------
# accelerate 1.15 utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision:
# without a policy of its own, MixedPrecision(Policy)(param_dtype=dtype, reduce_dtype=dtype)

ACC = "accelerate_template_fsdp.yaml"


def _acc(tmp_path, old: str = "", new: str = ""):
    from pathlib import Path

    from planner.jobs import read_job

    text = (Path(__file__).resolve().parent / "data" / "jobs" / ACC).read_text()
    assert old in text
    out = tmp_path / ACC
    out.write_text(text.replace(old, new, 1) if old else text)
    return read_job(str(out))


def test_accelerate_fsdp_reduces_in_the_mixed_precision_dtype(tmp_path):
    j = _acc(tmp_path)  # mixed_precision: 'bf16', no policy
    assert j.values["training.precision"] == "bf16-amp"
    assert j.values["training.reduce_dtype"] == "bf16"
    assert any("param_dtype = reduce_dtype" in str(w) for w in j.warnings)
    j = _acc(tmp_path, "mixed_precision: 'bf16'", "mixed_precision: 'fp16'")
    assert j.values["training.reduce_dtype"] == "fp16"
    # no mixed precision: accelerate sets no policy, FSDP reduces in the fp32 gradients' dtype
    j = _acc(tmp_path, "mixed_precision: 'bf16'", "mixed_precision: 'no'")
    assert "training.reduce_dtype" not in j.values
    assert not any("param_dtype = reduce_dtype" in str(w) for w in j.warnings)
    # a policy of its own: not modelled, named; no derived default
    j = _acc(tmp_path, "fsdp_config:\n", "fsdp_config:\n  fsdp_mixed_precision_policy: fp32\n")
    assert "training.reduce_dtype" not in j.values
    assert any("mixed_precision_policy" in line for line in j.unmodelled)


def test_accelerate_fsdp_reduce_dtype_halves_the_reduce_scatter_input(tmp_path):
    """The plan from the job: one Llama-3-8B block's reduce-scatter input (218,112,000
    parameters, FULL_SHARD) is 2 bytes each under accelerate's policy, 4 under --precision's
    fp32 reduce: the block backward differs by 218,112,000 x 2 bytes (2 ranks: the block's
    4,096^2 x 2 + 4,096 x 1,024 x 2 + 3 x 4,096 x 14,336 + 2 x 4,096 parameters)."""
    path = tmp_path / ACC
    from pathlib import Path
    path.write_text((Path(__file__).resolve().parent / "data" / "jobs" / ACC).read_text())
    args = ("--job", str(path), "--model", "llama3-8b", "--gpu", "h100-80", "--checkpointing",
            "full", "--calibration", "none", "--json", "--fsdp", "2")
    docs = [json.loads(run(*args, *extra).stdout) for extra in ((), ("--reduce-dtype", "fp32"))]
    assert docs[0]["inputs"]["training"]["reduce_dtype"] == "bf16"
    assert docs[1]["inputs"]["training"]["reduce_dtype"] == "fp32"
    bb = [d["candidates"][0]["phase_allocated_bytes"]["block_bwd"] for d in docs]
    assert bb[1] - bb[0] == 218_112_000 * 2, bb


def test_step_time_computes_in_param_dtype():
    """FSDP's matmuls run in param_dtype: fp32 storage with --param-dtype bf16 runs on the
    bf16 tensor cores, so the compute part of the step shrinks by the profile's datasheet
    ratio of dense peaks (H100 SXM: 989 / 67 TFLOPS); DDP ignores the policy."""
    base = ("--model", "llama3.2-1b", "--gpu", "h100-80", "--n", "8", "--checkpointing",
            "full", "--calibration", "none", "--json", "--precision", "fp32")

    def compute_s(strategy: str, *extra: str) -> float:
        r = run(*base, "--strategy", strategy, *extra)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["candidates"][0]["compute_s"]

    gpu = load_gpu("h100-80")
    fp32, bf16 = compute_s("full_shard"), compute_s("full_shard", "--param-dtype", "bf16")
    assert fp32 / bf16 == pytest.approx(gpu.bf16_tflops / gpu.fp32_tflops, rel=1e-9)
    assert compute_s("ddp") == compute_s("ddp", "--param-dtype", "bf16")
