"""DeepSpeed's 1-bit Adam, 0/1 Adam and 1-bit LAMB (issue 26 item 6): their error buffers,
step temporaries and compressed all-reduce. Expected numbers are derived by hand from
DeepSpeed v0.19.6 (commit edaa7221: runtime/fp16/onebit/adam.py, zoadam.py, lamb.py,
runtime/comm/nccl.py, runtime/engine.py). Not measured: DeepSpeed 0.19.7 and later removed
the optimizers (PR #8490) and v0.19.6's compressed backends need cupy + CUDA (nccl), MPI or
the XPU packbits op, none of which DeepSpeed's CPU accelerator has (docs/model.md).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner import onebit
from planner.memory.estimator import estimate
from planner.params import trainable
from planner.presets import get_preset
from planner.spec import (
    Candidate,
    Checkpointing,
    DeepSpeedConfig,
    ModelSpec,
    OptimizerKind,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.throughput import step_core, step_inputs
from tests.conftest import cluster, one_line_error, run

# probes/deepspeed_cpu.py's model: per block q, k, v, o 64·64 = 4096 each, gate, up, down
# 64·128 = 8192 each, two norms of 64 (41,088); root: embedding and head 256·64 = 16,384
# each and the final norm 64 (32,832); 2 blocks: 115,008
TINY = ModelSpec(name="ds-tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4,
                 ffn_hidden=128, vocab=256)
PSI = 115_008
ADAM, ZOADAM, LAMB = (OptimizerKind.ONEBIT_ADAM, OptimizerKind.ZERO_ONE_ADAM,
                      OptimizerKind.ONEBIT_LAMB)


def groups():
    return trainable(TINY, TrainingSpec().finetune).groups


def t(opt, precision=Precision.FP16_AMP, **ds):
    return TrainingSpec(optimizer=opt, precision=precision,
                        deepspeed=DeepSpeedConfig(**ds))


def test_tiny_model_is_the_referee_model():
    assert sum(k * n for k, n in ((k, __import__("math").prod(s)) for _, s, k in groups())) \
        == PSI


def test_padding_unit_is_world_times_lcm_with_8():
    # adam.py: divider = size * 8 / gcd(size, 8); the tensor is padded to size * divider
    # N = 1: 1·8; 2: 2·8 = 16; 3: 3·24 = 72; 8: 8·8 = 64; 12: 12·24 = 288; 16: 16·16 = 256
    assert [onebit.unit(n) for n in (1, 2, 3, 8, 12, 16)] == [8, 16, 72, 64, 288, 256]


@pytest.mark.parametrize("opt", [ADAM, ZOADAM])
def test_error_buffers_of_the_flat_master_by_hand(opt):
    # fp16 at stage 0: FP16_Optimizer's one flat fp32 master. N = 2: 115,008 = 7,188 x 16, no
    # padding: worker_error 115,008 x 4 = 460,032, server_error 57,504 x 4 = 230,016
    assert onebit.state_bytes(groups(), t(opt), 2) == 460_032 + 230_016
    # N = 3: ceil(115,008 / 72) = 1,598 x 72 = 115,056; server 38,352: 4 x 153,408
    assert onebit.state_bytes(groups(), t(opt), 3) == 613_632


def test_fp32_pads_every_tensor():
    # fp32: no wrapper, every parameter compressed apart. N = 3 (unit 72): the five norms of 64
    # -> 72 (+40), the eight 4096 attention matrices -> 4,104 (+64), the six 8192 MLP
    # matrices -> 8,208 (+96), embedding and head 16,384 -> 16,416 (+64): 115,272 elements;
    # each a multiple of 72, so the server chunks sum to 115,272 / 3 = 38,424
    tr = t(ADAM, Precision.FP32)
    assert onebit.compressed_elems(groups(), tr, 3) == 115_272
    assert onebit.compressed_calls(groups(), tr) == 21  # 5 norms, 8 + 6 matrices, 2 tables
    assert onebit.state_bytes(groups(), tr, 3) == 4 * (115_272 + 38_424)


def test_lamb_momentum_is_the_padded_flat():
    # lamb.py: exp_avg_flat holds every momentum plus a dummy of the padding, whatever the
    # precision: N = 3 adds 48 elements (192 B) to the errors' 613,632
    assert onebit.state_bytes(groups(), t(LAMB, Precision.FP32), 3) == 613_632 + 192


def test_step_temporaries_by_hand():
    # two fp32 tensors of the padded flat (the scaled signs and the new error): N = 2,
    # 8 x 115,008 = 920,064; N = 3 the flat is first concatenated with its padding: 12 x 115,056
    assert onebit.temp_bytes(groups(), t(ADAM), 2) == 920_064
    assert onebit.temp_bytes(groups(), t(ADAM), 3) == 1_380_672
    # 1-bit LAMB: already padded (no cat), and exp_avg_last_step clones 4 x 115,008
    assert onebit.temp_bytes(groups(), t(LAMB), 3) == 8 * 115_056 + 4 * PSI
    # fp32 per tensor: the largest, 16,384 -> 16,416 at N = 3, padded: 12 x 16,416
    assert onebit.temp_bytes(groups(), t(ADAM, Precision.FP32), 3) == 12 * 16_416


def _states(opt, n):
    c = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.NONE)
    return estimate(TINY, TrainingSpec(optimizer=opt, precision=Precision.FP16_AMP, seq=16),
                    cluster(n), c).phases["optimizer"]


@pytest.mark.parametrize("opt,moments", [(ADAM, 2), (ZOADAM, 3), (LAMB, 3)])
def test_estimate_holds_the_moments_and_the_errors(opt, moments):
    # Adam's exp_avg, exp_avg_sq (+ 0/1 Adam's momentum_accumulator, 1-bit LAMB's
    # exp_avg_sq_fresh), fp32 of the master's size, then the errors: N = 2, no padding
    got = _states(opt, 2).optimizer_states
    assert got == moments * 4 * PSI + 690_048
    base = _states(OptimizerKind.ADAMW, 2).optimizer_states
    assert base == 8 * PSI


def _network_only(opt, n=16, **ds):
    llama = get_preset("llama3-8b")
    tr = TrainingSpec(optimizer=opt, precision=Precision.FP16_AMP,
                      deepspeed=DeepSpeedConfig(**ds))
    c = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.FULL)
    x = step_inputs(llama, tr, cluster(n), c)
    x = dataclasses.replace(x, bw_intra=1e30, lat_intra=0.0, lat_inter=0.0)
    return step_core(x), float(x.bw_inter), x


LLAMA_P = 8_030_261_248  # tests/test_zeropp.py: its matrices and norms


def test_compressed_volume_by_hand():
    # 16 GPUs, 8 per node: network-bound, each GPU's NIC carries 1/8 of its ring traffic.
    # DDP (autocast, fp32 grads): 2 x 15/16 x 4P. 1-bit Adam: the flat padded to 256
    # (8,030,261,248 = 31,368,208 x 256, none); phase 1's all-to-all sends P/8 bytes in 16
    # chunks, the 8 for the other node over the GPU's own NIC: 8/16 x P/8 (its NVLink part
    # free here); phase 2's ring all-gather 15/16 x P/8 and the 2 x 15 fp32 scales over the
    # ring's 8 NICs
    base, bw, _ = _network_only(OptimizerKind.ADAMW)
    assert float(base.comm_s) == pytest.approx(2 * 15 / 16 * 4 * LLAMA_P / 8 / bw, rel=1e-12)
    ob, _, x = _network_only(ADAM)
    assert x.ob_elems == LLAMA_P and x.ob_calls == 1 and x.ob_every == 1
    assert float(ob.comm_s) == pytest.approx(
        8 / 16 * LLAMA_P / 8 / bw + (15 / 16 * LLAMA_P / 8 + 120) / 8 / bw, rel=1e-12)
    # inside one node: 2 x 7/8 x P/8 + 2 x 7 x 4 B over NVLink, none over the network
    one, _, _ = _network_only(ADAM, n=8)
    assert float(one.comm_s) < 1e-18  # bw_intra is 1e30 in _network_only
    llama = get_preset("llama3-8b")
    c = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.FULL)
    x8 = step_inputs(llama, t(ADAM), cluster(8), c)
    x8 = dataclasses.replace(x8, lat_intra=0.0, lat_inter=0.0)
    assert float(step_core(x8).comm_s) == pytest.approx(
        (2 * 7 / 8 * LLAMA_P / 8 + 56) / x8.bw_intra, rel=1e-12)
    # not overlapped: all of it exposed
    assert float(ob.exposed_comm_s) == pytest.approx(float(ob.comm_s), rel=1e-12)
    # 0/1 Adam: one compressed all-reduce every local_step_clipper steps (default 16)
    zo, _, _ = _network_only(ZOADAM)
    assert float(zo.comm_s) == pytest.approx(float(ob.comm_s) / 16, rel=1e-12)
    zo4, _, _ = _network_only(ZOADAM, local_step_clipper=4)
    assert float(zo4.comm_s) == pytest.approx(float(ob.comm_s) / 4, rel=1e-12)


def test_one_gpu_moves_nothing_but_keeps_the_errors():
    # size 1: compressed_allreduce is skipped (if self.size > 1) but the errors are made:
    # unit 8, 115,008 = 14,376 x 8: worker 115,008 + server 115,008, fp32
    assert onebit.state_bytes(groups(), t(ADAM), 1) == 8 * PSI
    ob, _, _ = _network_only(ADAM, n=1)
    assert float(ob.comm_s) == 0.0


# ---- refusals and the CLI -------------------------------------------------------------------

@pytest.mark.parametrize("args,needles", [
    (("--optimizer", "onebit-adam", "--strategy", "zero2"),
     ("--strategy", "zero2", "1bit-Adam is not compatible with ZeRO")),
    (("--optimizer", "zero-one-adam", "--strategy", "zero1"),
     ("--strategy", "0/1 Adam is not compatible with ZeRO")),
    (("--optimizer", "onebit-lamb", "--strategy", "full_shard"),
     ("--strategy", "full_shard", "stage-0 engine")),
    (("--optimizer", "onebit-adam", "--offload", "optimizer"),
     ("--offload", "ZeRO")),
    (("--optimizer", "onebit-adam", "--tp", "2"), ("--tp", "NOT MODELLED")),
    (("--optimizer", "zero-one-adam", "--ds-local-step-clipper", "0"),
     ("--ds-local-step-clipper",)),
])
def test_refusals_name_the_flag(args, needles):
    one_line_error(run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", *args), 2,
                   *needles)


def test_plan_is_ddp_with_the_assumption_line():
    r = run("--model", "gpt2-xl", "--gpu", "h100-80", "--n", "8", "--optimizer",
            "onebit-adam", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert {c["strategy"] for c in out["candidates"]} == {"ddp"}
    assert any("onebit-adam" in w and "*assumed*" in w and "#8490" in w
               for w in out["warnings"]), out["warnings"]


# ---- the DeepSpeed reader -------------------------------------------------------------------

def _read(tmp_path, kind, params=None, stage=None):
    from planner.jobs import read_job

    doc = {"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": True}, "steps_per_print": 10,
           "optimizer": {"type": kind, "params": params or {}}}
    if stage is not None:
        doc["zero_optimization"] = {"stage": stage}
    src = tmp_path / "ds.json"
    src.write_text(json.dumps(doc))
    return read_job(str(src))


@pytest.mark.parametrize("kind,value", [("OneBitAdam", "onebit-adam"),
                                        ("ZeroOneAdam", "zero-one-adam"),
                                        ("OneBitLamb", "onebit-lamb")])
def test_reader_maps_the_types(tmp_path, kind, value):
    j = _read(tmp_path, kind, {"lr": 1e-3, "freeze_step": 400, "var_freeze_step": 400,
                               "cuda_aware": False, "comm_backend_name": "nccl"})
    assert j.values["training.optimizer"] == value
    assert j.values["strategy"] == "ddp"
    assert j.unmodelled == []
    assert any("0.19.7 removed it" in w and "the first 400 steps" in w for w in j.warnings), \
        j.warnings


def test_reader_reads_local_step_clipper(tmp_path):
    j = _read(tmp_path, "ZeroOneAdam", {"var_freeze_step": 1000, "local_step_scaler": 1000,
                                        "local_step_clipper": 8, "var_update_scaler": 16})
    assert j.values["deepspeed.local_step_clipper"] == 8
    assert j.unmodelled == []


@pytest.mark.parametrize("params,name", [({"comm_backend_name": "mpi"}, "comm_backend_name"),
                                         ({"cuda_aware": True}, "cuda_aware")])
def test_reader_names_the_other_backends_not_modelled(tmp_path, params, name):
    j = _read(tmp_path, "OneBitAdam", params)
    assert any(name in str(u) for u in j.unmodelled), j.unmodelled


@pytest.mark.parametrize("kind,who", [("OneBitAdam", "1bit-Adam"), ("ZeroOneAdam", "0/1 Adam"),
                                      ("OneBitLamb", "1bit-Lamb")])
def test_reader_refuses_zero_by_name(tmp_path, kind, who):
    from planner.errors import FitcheckError

    with pytest.raises(FitcheckError) as e:
        _read(tmp_path, kind, stage=2)
    assert "optimizer.type" in str(e.value) and f"{who} is not compatible with ZeRO" in \
        str(e.value)


def test_zero_one_adam_holds_its_update_through_the_all_reduce():
    # zoadam.py: update (fp32, the flat's 115,008) is alive through the compressed all-reduce
    # of the momentum: 12 x 115,056 + 4 x 115,008 = 1,380,672 + 460,032 at N = 3
    assert onebit.temp_bytes(groups(), t(ZOADAM), 3) == 1_840_704


# ---- the CPU referee: DeepSpeed v0.19.6's own optimizers (probes/onebit_cpu.py) --------------

REFEREE = __import__("pathlib").Path(__file__).parent / "data" / "onebit_cpu.json"
RECORDS = json.loads(REFEREE.read_text())
KINDS = {"OneBitAdam": ADAM, "ZeroOneAdam": ZOADAM, "OneBitLamb": LAMB}


def _case(name):
    rec = RECORDS[name]
    tr = t(KINDS[rec["config"]["optimizer"]["type"]],
           Precision.BF16_AMP if "bf16" in rec["config"] else Precision.FP32)
    return rec, tr, rec["world"]


def _steady(rec, skip_first=False):
    """The steps from the first compressed one after the warm-up (freeze_step /
    var_freeze_step 2; in fp32 the engine's first step is the optimizer's initialization
    step, which compresses too), and the allocations in them; ``skip_first``: after it (the
    first compressed step makes again the errors the initialization step dropped)."""
    first = next(i for i, s in enumerate(rec["steps"]) if i and "all_to_all_single" in s)
    first += 1 if skip_first else 0
    return rec["steps"][first:], rec["step_allocations"][first:]


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_state_is_the_referees_to_the_byte(name):
    rec, tr, n = _case(name)
    st = rec["state"]
    if tr.optimizer is LAMB:
        # exp_avg is a view into the padded exp_avg_flat: count the flat, not the views
        held = (rec["exp_avg_flat"] + st["exp_avg_sq"] + st["exp_avg_sq_fresh"]
                + rec["worker_errors"] + rec["server_errors"])
    else:
        held = sum(v for k, v in st.items() if not k.endswith("_dtype"))
        assert {v for k, v in st.items() if k.endswith("_dtype")} == {"torch.float32"}
    moments = {ADAM: 2, ZOADAM: 3, LAMB: 3}[tr.optimizer]
    assert held == moments * 4 * PSI + onebit.state_bytes(groups(), tr, n), name


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_wrapper_and_tensors_compressed(name):
    rec, tr, _ = _case(name)
    # bf16 at stage 0: FP16_Optimizer's one flat master for 1-bit Adam and 0/1 Adam,
    # FP16_UnfusedOptimizer for 1-bit LAMB; fp32: the optimizer on the parameters
    assert rec["wrapper"] == ("FP16_UnfusedOptimizer" if tr.optimizer is LAMB else
                              "FP16_Optimizer" if tr.precision is Precision.BF16_AMP
                              else "OnebitAdam")
    calls = onebit.compressed_calls(groups(), tr)
    for s in _steady(rec)[0]:
        if "all_to_all_single" in s:
            assert s["all_to_all_single_calls"] == calls


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_compressed_bytes_are_the_referees(name):
    rec, tr, n = _case(name)
    m = onebit.compressed_elems(groups(), tr, n)
    calls = onebit.compressed_calls(groups(), tr)
    steps, _ = _steady(rec)
    talking = [s for s in steps if "all_to_all_single" in s]
    # phase 1: the packed signs, M/8 B handed to the all-to-all; the scale and phase 2's
    # server chunk of signs (M/8N) and scale to the all-gathers: (M/8N + 8) per call
    for s in talking:
        assert s["all_to_all_single"] == m // 8
        assert s["all_gather"] == m // (8 * n) + 8 * calls
        # no gradient all-reduce after the warm-up: the 1-byte (bf16) or 4-byte (fp32)
        # overflow / grad-norm flag only
        assert s["all_reduce"] <= 4
    # the warm-up's first step all-reduces the bf16 (2 B) or fp32 (4 B) gradients
    assert rec["steps"][0]["all_reduce"] >= (2 if "bf16" in rec["config"] else 4) * PSI
    # the fraction of steady steps that communicate: 1, or 1 / local_step_clipper
    clip = rec["config"]["optimizer"]["params"].get("local_step_clipper")
    tr = dataclasses.replace(tr, deepspeed=DeepSpeedConfig(local_step_clipper=clip or 16))
    assert len(talking) / len(steps) == onebit.step_fraction(tr)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_step_temporaries_are_the_referees(name):
    rec, tr, n = _case(name)
    steps, allocs = _steady(rec, skip_first=True)
    # the most alive above the step's entry at a communicating step; what is left over is
    # scalars (the norms, the scales): within 400 B
    peak = max(a["peak"] for s, a in zip(steps, allocs) if "all_to_all_single" in s)
    assert 0 <= peak - onebit.temp_bytes(groups(), tr, n) <= 400, (peak, name)
    assert all(a["net"] == 0 for a in allocs)  # nothing made in a steady step stays


@pytest.mark.integration
def test_referee_live_one_case():
    ds = pytest.importorskip("deepspeed")
    if ds.__version__ != "0.19.6":
        pytest.skip(f"needs deepspeed 0.19.6 (0.19.7 removed the 1-bit optimizers), got "
                    f"{ds.__version__}")
    from probes.onebit_cpu import run_case

    rec = run_case("adam-w3")
    assert rec["state"] == RECORDS["adam-w3"]["state"]
    assert rec["steps"] == RECORDS["adam-w3"]["steps"]


@pytest.mark.parametrize("opt,precision", [(ADAM, Precision.BF16_AMP), (ZOADAM, Precision.FP32),
                                           (LAMB, Precision.BF16_AMP)])
def test_numpy_gpu_counts_equal_the_scalar_ones(opt, precision):
    # the report's sweep evaluates the same functions over arrays of GPU counts
    np = pytest.importorskip("numpy")
    ns = [1, 2, 3, 7, 8, 12, 16, 48, 1000]
    arr = np.array(ns)
    tr = t(opt, precision)
    for f in (onebit.state_bytes, onebit.temp_bytes, onebit.compressed_elems):
        got = f(groups(), tr, arr)
        assert list(np.broadcast_to(got, arr.shape)) == [f(groups(), tr, n) for n in ns], f
