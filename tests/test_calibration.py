"""Calibration: the numpy fit recovers known terms, files round-trip and validate, staleness."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from planner.hardware import load_gpu
from planner.calibration import (
    Calibration,
    CalibrationError,
    apply,
    apply_throughput,
    architecture_family,
    find_calibration,
    installed_torch_version,
    is_stale,
    load_calibration,
    parse_calibration,
)
from planner.memory import Overheads, estimate
from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    MlpKind,
    ModelSpec,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.throughput import ThroughputAssumptions

np = pytest.importorskip("numpy")

from probes.calibrate import (  # noqa: E402
    fit_records,
    leftover_bytes,
    n_communicators,
    write_calibration,
)
from probes.runner import spec_to_dict  # noqa: E402

MiB = 2**20
H100 = load_gpu("h100-80")

# The "true" runtime terms the synthetic records are generated from.
TRUE = dict(frag=0.12, scale_swiglu=1.30, scale_gelu=0.85, ctx=600 * MiB, nccl=300 * MiB,
            eff=0.55, busbw=360e9)


def _models() -> list[ModelSpec]:
    llama = ModelSpec(name="l", n_layers=8, hidden=2048, n_heads=16, n_kv_heads=16,
                      ffn_hidden=5632, vocab=32000)
    gpt = ModelSpec(name="g", n_layers=12, hidden=1536, n_heads=12, n_kv_heads=12,
                    ffn_hidden=6144, vocab=50257, mlp=MlpKind.GELU)
    return [llama, gpt]


def synthetic_records(noise: float = 0.005, seed: int = 0) -> list[dict]:
    """Probe-like records whose measurements follow the planner's structure with TRUE terms,
    plus multiplicative noise."""
    from planner.throughput import estimate_step, peak_flops, training_flops_per_token

    rng = np.random.default_rng(seed)
    ov = Overheads()
    recs = []
    for model in _models():
        scale = TRUE["scale_swiglu"] if model.mlp is MlpKind.SWIGLU else TRUE["scale_gelu"]
        for world in (1, 2, 8, 16):
            for seq, mb in ((1024, 1), (2048, 2), (4096, 1)):
                for strat in (Strategy.DDP, Strategy.FULL_SHARD, Strategy.HYBRID_SHARD):
                    for ck in (Checkpointing.NONE, Checkpointing.FULL):
                        training = TrainingSpec(seq=seq, micro_batch=mb,
                                                precision=Precision.BF16_AMP)
                        cand = Candidate(strategy=strat, checkpointing=ck)
                        cluster = Cluster(gpu=H100, n_gpus=world, gpus_per_node=8,
                                          host_ram_bytes_per_node=H100.host_ram_bytes_per_node)
                        est = estimate(model, training, cluster, cand, overheads=ov)
                        act = est.breakdown.activations
                        e = lambda: 1.0 + noise * rng.standard_normal()  # noqa: E731
                        A = int((est.peak_allocated_bytes - act + scale * act) * e())
                        R = int((1 + TRUE["frag"]) * A * e() + leftover_bytes(est, ov))
                        growth = 40 * MiB if world == 1 else TRUE["nccl"]
                        K = TRUE["ctx"] * e() + n_communicators(cand, cluster) * TRUE["nccl"]
                        if world == 1:
                            K += growth
                        st = estimate_step(model, training, cluster, cand)
                        flops = (training.micro_batch * training.seq
                                 * training_flops_per_token(model, training.seq, ck))
                        t = (flops / (peak_flops(H100, training.precision) * TRUE["eff"])
                             + (st.step_time_s - st.compute_s)) * e()
                        recs.append({
                            "schema": "fitcheck-probe/1", "record": "step", "ok": True,
                            "oom": False, "world_size": world, "gpus_per_node": 8,
                            "model": spec_to_dict(model), "training": spec_to_dict(training),
                            "candidate": spec_to_dict(cand), "max_allocated_bytes": A,
                            "max_reserved_bytes": R, "device_used_bytes": int(R + K),
                            "runtime_overhead_bytes": int(K), "nccl_buffer_bytes": growth,
                            "step_time_s": t, "flops_per_step_per_rank": flops,
                            "env": {"gpu_name": "NVIDIA H100 80GB HBM3", "device": "cuda",
                                    "torch": "2.5.1+cu124", "cuda": "12.4", "nccl": "2.21.5",
                                    "driver": "550.54.15", "memory_total_bytes": H100.memory_bytes},
                        })
    recs.append({"record": "collectives", "world_size": 8, "gpus_per_node": 8,
                 "env": {"device": "cuda"},
                 "bandwidth": [{"op": op, "bytes": b, "busbw_bytes_per_s": TRUE["busbw"] * (
                     1.0 if b == 512 * MiB else 0.5)} for op in ("all_reduce", "all_gather")
                     for b in (MiB, 512 * MiB)]})
    # an OOM record and a CPU record are ignored by the fit
    recs.append({**recs[0], "oom": True, "ok": False})
    recs.append({**recs[0], "max_allocated_bytes": None})
    return recs


@pytest.fixture(scope="module")
def fitted() -> dict:
    return fit_records(synthetic_records(), H100)


def test_fit_recovers_known_terms(fitted):
    v = fitted["values"]
    assert v["allocator_fragmentation"]["value"] == pytest.approx(TRUE["frag"], abs=0.01)
    assert v["cuda_context_bytes"]["value"] == pytest.approx(TRUE["ctx"], rel=0.02)
    assert v["nccl_bytes_per_communicator"]["value"] == pytest.approx(TRUE["nccl"], rel=0.05)
    fam = v["activation_scale"]
    assert fam["decoder-swiglu"]["value"] == pytest.approx(TRUE["scale_swiglu"], rel=0.02)
    assert fam["decoder-gelu"]["value"] == pytest.approx(TRUE["scale_gelu"], rel=0.02)
    assert v["compute_efficiency"]["value"] == pytest.approx(TRUE["eff"], rel=0.02)
    assert v["intra_node_comm_efficiency"]["value"] == pytest.approx(
        TRUE["busbw"] / H100.intra_node_bandwidth_bytes_per_s, rel=1e-6)
    # residual statistics: small relative and held-out errors at 0.5 % noise
    for key in ("allocator_fragmentation", "compute_efficiency"):
        assert v[key]["relative_error"] < 0.02
        assert v[key]["held_out_error"] < 0.02
        assert v[key]["n"] > 50
    assert fitted["versions"] == {"driver": "550.54.15", "cuda": "12.4", "torch": "2.5.1+cu124",
                                  "nccl": "2.21.5"}


def test_fit_on_one_gpu_leaves_nccl_unfitted():
    recs = [r for r in synthetic_records() if r.get("world_size") == 1]
    doc = fit_records(recs, H100)
    assert doc["values"]["nccl_bytes_per_communicator"] is None
    assert doc["values"]["intra_node_comm_efficiency"] is None
    # the probe's own 1-rank NCCL buffers are not counted as context
    assert doc["values"]["cuda_context_bytes"]["value"] == pytest.approx(TRUE["ctx"], rel=0.02)
    assert any("world size 1" in n for n in doc["notes"])


def test_fit_without_gpu_records_is_bad_data():
    from planner.errors import InputDataError

    cpu = [{**r, "max_allocated_bytes": None} for r in synthetic_records()
           if r.get("record") == "step"]
    with pytest.raises(InputDataError, match="no successful GPU step record"):
        fit_records(cpu, H100)


def test_round_trip_and_apply(fitted, tmp_path):
    path = tmp_path / "cal.json"
    write_calibration(fitted, path)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    cal = load_calibration(path)
    assert isinstance(cal, Calibration)
    assert cal.gpu_profile == "h100-80" and cal.torch == "2.5.1+cu124"
    assert cal.value("allocator_fragmentation") == fitted["values"]["allocator_fragmentation"]["value"]
    assert len(cal.records) == len(fitted["records"])
    ov, gpu = apply(cal, Overheads(), H100, model=_models()[0])
    assert gpu.cuda_context_bytes == fitted["values"]["cuda_context_bytes"]["value"]
    assert gpu.compute_efficiency == fitted["values"]["compute_efficiency"]["value"]
    assert gpu.sources["cuda_context_bytes"].startswith("calibration ")
    assert ov.nccl_bytes_per_communicator == fitted["values"]["nccl_bytes_per_communicator"]["value"]
    assert ov.allocator_fragmentation == fitted["values"]["allocator_fragmentation"]["value"]
    a = apply_throughput(cal, ThroughputAssumptions())
    assert a.intra_node_comm_efficiency == cal.value("intra_node_comm_efficiency")
    assert a.inter_node_comm_efficiency == ThroughputAssumptions().inter_node_comm_efficiency
    # a calibration of another GPU is refused
    with pytest.raises(CalibrationError, match="does not match"):
        apply(cal, Overheads(), load_gpu("a100-80"))


def test_apply_sets_activation_scale_when_overheads_has_the_field():
    @dataclasses.dataclass(frozen=True)
    class Ov:
        allocator_fragmentation: float = 0.08
        nccl_bytes_per_communicator: int = 1
        activation_scale: float = 1.0

    doc = _minimal(values={"activation_scale": {"decoder-swiglu": {"value": 1.25, "n": 3}}})
    cal = parse_calibration(doc)
    ov, _ = apply(cal, Ov(), H100, model=_models()[0])
    assert ov.activation_scale == 1.25
    ov, _ = apply(cal, Ov(), H100, model=_models()[1])  # another family: untouched
    assert ov.activation_scale == 1.0


def _minimal(**over) -> dict:
    doc = {"schema_version": 1, "id": "t", "gpu": {"profile": "h100-80", "name": "H100",
                                                   "memory_bytes": H100.memory_bytes},
           "versions": {"torch": "2.5.1+cu124", "cuda": "12.4", "driver": "550.54.15",
                        "nccl": "2.21.5"},
           "date": "2025-01-02", "values": {"allocator_fragmentation": {"value": 0.1}}}
    doc.update(over)
    return doc


def test_stale_detection():
    cal = parse_calibration(_minimal())
    assert is_stale(cal, "2.5.1") is None  # local build tag ignored
    assert is_stale(cal, "2.5.1+cu121", cuda="12.4") is None
    assert is_stale(cal, None) is None  # unknown: not compared
    reason = is_stale(cal, "2.6.0+cu124")
    assert reason is not None and "torch 2.5.1 (calibrated) != 2.6.0 (installed)" in reason
    reason = is_stale(cal, "2.5.1", cuda="12.6", driver="560.35.03", nccl="2.21.5")
    assert "CUDA 12.4" in reason and "driver 550.54.15" in reason and "NCCL" not in reason
    assert is_stale(cal, "2.5.1", driver="550.90.07") is None  # same driver branch


@pytest.mark.parametrize(("change", "needle"), [
    ({"schema_version": 2}, "schema_version = 2"),
    ({"id": ""}, "id = ''"),
    ({"date": "yesterday"}, "date = 'yesterday'"),
    ({"gpu": {"name": "H100", "memory_bytes": -1}}, "gpu.memory_bytes = -1"),
    ({"values": {"allocator_fragmentation": {"value": 3.0}}}, "allocator_fragmentation.value = 3.0"),
    ({"values": {"compute_efficiency": {"value": 0}}}, "compute_efficiency.value = 0"),
    ({"values": {"cuda_context_bytes": {"value": 1.5}}}, "cuda_context_bytes.value = 1.5"),
    ({"values": {"cuda_context_bytes": {"value": 10**15}}}, "cuda_context_bytes.value"),
    ({"values": {"activation_scale": {"decoder-swiglu": {"value": 50}}}},
     "activation_scale.decoder-swiglu.value = 50"),
    ({"values": {"bogus": 1}}, "values.bogus = 1: unknown value"),
    ({"values": {"allocator_fragmentation": {"value": 0.1, "n": -2}}}, "allocator_fragmentation.n = -2"),
    ({"extra": True}, "extra = True: unknown key"),
])
def test_validation_errors_are_one_line(change, needle, tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_minimal(**change)))
    with pytest.raises(CalibrationError) as info:
        load_calibration(path)
    msg = str(info.value)
    assert "\n" not in msg and needle in msg and str(path) in msg, msg


def test_unreadable_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    with pytest.raises(CalibrationError, match="not valid JSON"):
        load_calibration(bad)
    with pytest.raises(CalibrationError, match="no such file"):
        load_calibration(tmp_path / "missing.json")
    from planner.errors import EXIT_BAD_DATA

    assert CalibrationError("x").exit_code == EXIT_BAD_DATA


def test_find_calibration_prefers_same_torch(tmp_path, monkeypatch):
    # the directories are read in planner.calibration_paths (the shipped h100-80 file must
    # not be found)
    monkeypatch.setattr("planner.calibration_paths.CALIBRATION_DIRS", ())
    monkeypatch.setenv("FITCHECK_CALIBRATION_PATH", str(tmp_path))
    assert find_calibration("h100-80", "2.5.1") is None
    (tmp_path / "a.json").write_text(json.dumps(_minimal(id="old-same", date="2024-01-01")))
    (tmp_path / "b.json").write_text(json.dumps(_minimal(
        id="new-other", date="2025-06-01", versions={"torch": "2.7.0"})))
    (tmp_path / "c.json").write_text(json.dumps(_minimal(
        id="other-gpu", gpu={"profile": "a100-80", "name": "A100", "memory_bytes": 1 << 36})))
    assert find_calibration("h100-80", "2.5.1+cu124").id == "old-same"
    assert find_calibration("h100-80", "2.9.0").id == "new-other"  # newest otherwise
    assert find_calibration("a100-80").id == "other-gpu"
    assert find_calibration("v100-16") is None


def test_shipped_calibrations_are_valid():
    from planner.calibration import CALIBRATION_DIRS

    import os

    for d in CALIBRATION_DIRS:
        for name in os.listdir(d) if os.path.isdir(d) else []:
            if name.endswith(".json"):
                cal = load_calibration(os.path.join(d, name))
                assert cal.source, name
                assert cal.gpu_profile is not None
                load_gpu(cal.gpu_profile)


def test_installed_torch_version_is_cheap_and_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, time; from planner.calibration import installed_torch_version as f; "
            "f(); t = time.perf_counter(); v = f(); dt = time.perf_counter() - t; "
            "print(v, dt, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    torch_spec = __import__("importlib.util").util.find_spec("torch")
    if torch_spec is None:
        assert out[0] == "None"
    else:
        import torch

        assert out[0] == torch.__version__
    assert float(out[1]) < 1e-3
    assert out[2] == "False"
    t = time.perf_counter()
    installed_torch_version()
    assert time.perf_counter() - t < 0.05


def test_architecture_family():
    llama, gpt = _models()
    assert architecture_family(llama) == "decoder-swiglu"
    assert architecture_family(gpt) == "decoder-gelu"
    assert architecture_family(dataclasses.replace(llama, n_kv_heads=4)) == "decoder-swiglu-gqa"


def test_public_fit_script_runs_and_reports_held_out_errors(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location(
        "public_memory_calibration", root / "benchmarks" / "public_memory_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    md = tmp_path / "cal.md"
    md.write_text("# head\n\n" + mod.BEGIN + "\nold\n" + mod.END + "\n\ntail\n")
    assert mod.main(["--md", str(md), "--write-calibrations", str(tmp_path / "cals")]) == 0
    text = md.read_text()
    assert text.startswith("# head") and text.rstrip().endswith("tail") and "old" not in text
    assert "held-out median abs err" in text and "v100-16" in text
    out = capsys.readouterr().out
    assert "held-out median |err|" in out
    for f in (tmp_path / "cals").glob("*.json"):  # whatever is shipped must load
        assert load_calibration(f).source.startswith("public measurements")


def test_a_fit_to_one_models_rows_is_not_shipped():
    """The public fit ships nothing for a GPU whose rows all train one model (the V100 rows
    are all BERT-large): their leave-one-out error says nothing of other models."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "public_memory_calibration.py"
    spec = importlib.util.spec_from_file_location("public_memory_calibration", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fitted = {"params": {"allocator_fragmentation": 0.05}, "held_out_median_abs": 0.02,
              "held_out_max_abs": 0.05}
    res = {"n": 9, "trained": ["bert-large"],
           "models": {"M0": {"held_out_median_abs": 0.08, "held_out_max_abs": 0.13},
                      "M1": fitted}}
    model, why = mod.choose(res)
    assert model == "M0" and "bert-large" in why
    res["trained"] = ["bert-large", "gpt2-xl"]
    assert mod.choose(res)[0] == "M1"
