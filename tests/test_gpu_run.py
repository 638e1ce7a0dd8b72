"""The prepared GPU session (issue 28): benchmarks/gpu_run.py and probes/gpu_cases.py run end
to end on the CPU with tiny shapes, a part that hangs is killed at its cap while the run goes
on, the least-memory bisection, and what the H200 and H100 runs shipped (the calibrations, the
records the planner is held to, the artefacts for reading failed runs)."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h200"
H100_RUNS = ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h100"
MiB, GiB = 2**20, 2**30


def _records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


def _driver(out: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "benchmarks/gpu_run.py", "--out", str(out), "--device", "cpu",
         "--tiny", *args], cwd=ROOT, env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --------------------------------------------------------------------------- the script


@pytest.mark.integration
def test_cpu_run_end_to_end(tmp_path):
    ids = "w1-1b-ddp-none,w1-1b-fsdp-none-ga2-last,w64-mixtral4L-fsdp-full,least-1b-fsdp-full"
    p = _driver(tmp_path, "--parts", "runtime,matrix,fake64,least", "--only", ids)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    recs = _records(tmp_path)
    kinds = [r["record"] for r in recs]
    assert kinds[0] == "env" and kinds[-1] == "end"
    import torch

    assert recs[0]["torch"] == torch.__version__ and recs[0]["device"] == "cpu"
    rt = next(r for r in recs if r["record"] == "runtime_terms")
    assert [pt["point"].split(" ")[0] for pt in rt["points"]][:3] == [
        "context", "one_element_tensor", "bf16_operands"]
    assert "runtime_nccl" in kinds  # the 1-rank group (gloo on the CPU) came up
    parts = {r["part"]: r for r in recs if r["record"] == "part"}
    assert list(parts) == ["runtime", "matrix", "fake64", "least"]
    assert all(r["rc"] == 0 and not r["timed_out"] for r in parts.values())
    cases = {r["id"]: r for r in recs if r["record"] == "case"}
    assert set(cases) == {"w1-1b-ddp-none", "w1-1b-fsdp-none-ga2-last",
                          "w64-mixtral4L-fsdp-full"}
    assert all(c["ok"] and c["error"] is None for c in cases.values())
    ddp = cases["w1-1b-ddp-none"]
    assert (ddp["world_size"], ddp["fake_group"], ddp["wrapper"]) == (
        1, False, "none (world size 1)")
    assert ddp["max_allocated_bytes"] is None and len(ddp["step_times_s"]) == 1  # CPU, tiny
    # the SDPA backend torch picks for the case's shapes: CPU's flash kernel here
    assert ddp["sdpa_backend"] == "FLASH_ATTENTION" and "sac_save_ops" not in ddp
    ga = cases["w1-1b-fsdp-none-ga2-last"]
    assert (ga["training"]["grad_accum"], ga["training"]["grad_sync"]) == (2, "last")
    assert ga["wrapper"] == "fully_shard" and ga["mesh_shape"] == [1]
    moe = cases["w64-mixtral4L-fsdp-full"]
    assert (moe["world_size"], moe["fake_group"], moe["mesh_shape"]) == (64, True, [64])
    assert moe["model"]["n_experts"] == 8 and moe["candidate"]["checkpointing"] == "full"
    groups = [r["backend"] for r in recs if r["record"] == "group"]
    assert groups == ["gloo", "fake", "gloo"]
    least = next(r for r in recs if r["record"] == "least_memory")
    assert least["id"] == "least-1b-fsdp-full" and least["ok"]
    assert "least_limit_ok_bytes" not in least  # no allocator limit to bisect on the CPU


@pytest.mark.integration
def test_a_hung_part_is_killed_at_its_cap_and_the_run_goes_on(tmp_path):
    # the part after the hang is least (cap 170 s x 0.15 = 25.5 s; its case takes about 3 s
    # on 2 idle CPU cores and timed out under 13.6 s on a loaded machine): fake64's 3.6 s cap
    # was under what its case takes there (about 5 s)
    ids = "w1-1b-ddp-none,w1-1b-fsdp-none,least-1b-fsdp-full"
    t0 = time.monotonic()
    p = _driver(tmp_path, "--parts", "matrix,least", "--only", ids, "--cap-scale", "0.15",
                env={"FITCHECK_GPU_CASES_FAULT": "hang:w1-1b-fsdp-none"})
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    assert time.monotonic() - t0 < 200
    recs = _records(tmp_path)
    parts = {r["part"]: r for r in recs if r["record"] == "part"}
    assert parts["matrix"]["timed_out"] is True and parts["matrix"]["cap_s"] == 30.0
    assert parts["least"]["timed_out"] is False and parts["least"]["rc"] == 0
    cases = [r["id"] for r in recs if r["record"] == "case"]
    # the case before the hang was kept; the hung one wrote nothing; the next part ran
    assert cases == ["w1-1b-ddp-none"]
    least = [r for r in recs if r["record"] == "least_memory"]
    assert [r["id"] for r in least] == ["least-1b-fsdp-full"] and least[0]["ok"]
    marker = f"fitcheck-gpu-run-{p.pid}-"
    alive = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmd:
                alive.append(pid)
    assert alive == []  # the hung worker was killed with its process group


def test_bisect_least_finds_the_threshold_within_the_tolerance():
    from probes.gpu_cases import bisect_least

    threshold = 637

    def trial(limit):
        return limit >= threshold, None if limit >= threshold else "out of memory"

    ok_at, failed_at, trials = bisect_least(100, 1000, 10, trial, lambda: False)
    assert failed_at < threshold <= ok_at and ok_at - failed_at <= 10
    assert trials[0]["limit_bytes"] == 100 and trials[0]["ok"] is False
    # lo first, then halving 900 down to <= 10: ceil(log2(90)) = 7 more
    assert len(trials) == 1 + math.ceil(math.log2(900 / 10))
    assert bisect_least(700, 1000, 10, trial, lambda: False)[:2] == (700, None)
    # out of time after the first halving: the answer is still a limit that ran (or hi)
    ok_at, failed_at, trials = bisect_least(100, 1000, 10, trial, iter([False, True]).__next__)
    assert (ok_at, failed_at) == (1000, 550) and len(trials) == 2


# --------------------------------------------------------------------------- what was shipped


def test_the_h200_calibration_ships_the_measured_context():
    from planner.calibration import find_calibration

    cal = find_calibration("h200", "2.11.0+cu130")
    assert cal is not None and cal.id == "h200-torch2.11.0-2026-11-26"
    assert (cal.torch, cal.cuda, cal.nccl, cal.driver) == ("2.11.0+cu130", "13.0", "2.28.9",
                                                           "580.159.04")
    # by hand from the records: device used - reserved after the steps of every fake-group
    # case = 877,461,504 B = 836.8125 MiB (run1), plus what the driver keeps: nvidia-smi's
    # 143,771 MiB (the profile) - mem_get_info's 150,109,880,320 B = 615.0625 MiB
    assert cal.value("cuda_context_bytes") == 877461504 + (150754820096 - 150109880320)
    # the fragmentation and activation fits did not beat the defaults held out; the eager
    # efficiency (0.420 fitted on all 30 steps) did not beat the borrowed 0.395 but beats the
    # profile's roofline-derived 0.483 (13.1 % vs 22.4 % held out: docs/calibration.md §6)
    assert set(cal.values) == {"cuda_context_bytes", "compute_efficiency"}
    assert round(cal.value("compute_efficiency"), 3) == 0.420
    assert cal.activation_scale == {}


def test_the_h100_calibration_ships_the_measured_context_and_efficiency():
    from planner.calibration import find_calibration

    cal = find_calibration("h100-80", "2.11.0+cu130")
    assert cal is not None and cal.id == "h100-80-torch2.11.0-2026-11-26"
    assert (cal.torch, cal.cuda, cal.nccl, cal.driver) == ("2.11.0+cu130", "13.0", "2.28.9",
                                                           "580.159.04")
    assert cal.gpu_name == "NVIDIA H100 80GB HBM3" and cal.memory_bytes == 85017493504
    # by hand from the records: device used - reserved after the steps of every fake-group
    # case = 877,461,504 B = 836.8125 MiB (run1; the same bytes as on the H200), plus what the
    # driver keeps: nvidia-smi's 81,559 MiB (the profile) - mem_get_info's 85,017,493,504 B
    # = 480 MiB (the H200's driver kept 615.0625 MiB)
    assert cal.value("cuda_context_bytes") == 877461504 + (85520809984 - 85017493504)
    # the eager efficiency beat the assumed 0.395 held out (docs/calibration.md §6); it lies
    # inside the efficiencies the eager world-size-1 steps measured (achieved TFLOP/s / 989)
    assert set(cal.values) == {"cuda_context_bytes", "compute_efficiency"}
    eager1 = [r for r in _gpu_cases(H100_RUNS) if r["world_size"] == 1 and not
              r["fake_group"] and r["training"]["compile"] == "none"]
    measured = [r["achieved_tflops"] / 989.0 for r in eager1]
    assert len(eager1) == 26 and min(measured) < cal.value("compute_efficiency") < 0.395
    assert cal.value("compute_efficiency") < max(measured)
    assert cal.activation_scale == {}


@pytest.mark.parametrize("gpu, cal_id, added_mib", [
    # by hand, from the tests above: 836.8125 MiB of context and kernels + what the driver
    # keeps (H200 615.0625, H100 480 MiB) - 512 (the profile's assumed context)
    ("h200", "h200-torch2.11.0-2026-11-26", 939.875),
    ("h100-80", "h100-80-torch2.11.0-2026-11-26", 804.8125),
])
def test_calibration_auto_applies_the_measured_context(gpu, cal_id, added_mib):
    def required(cal: str) -> tuple[int, dict | None]:
        r = run("--model", "llama3.2-1b", "--gpu", gpu, "--n", "1", "--strategy", "ddp",
                "--checkpointing", "none", "--calibration", cal, "--json")
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        return doc["candidates"][0]["required_bytes"], doc["calibration"]

    base, none = required("none")
    cal, used = required("auto")
    assert none is None and used["id"] == cal_id
    assert cal - base == int(added_mib * MiB)


def _gpu_cases(folder: Path = RUNS) -> list[dict]:
    out = []
    for path in sorted(folder.glob("run*-records.jsonl")):
        out += [r for r in map(json.loads, path.read_text().splitlines())
                if r["record"] == "case" and r["ok"]]
    return out


def _planner_allocated(rec: dict, profile: str = "h200") -> tuple[int, dict]:
    from planner.hardware import load_gpu
    from planner.memory import Phase
    from probes.gpu_records import row_of

    e = row_of(rec, load_gpu(profile)).est()
    moments = {"forward": e.phases[Phase.FORWARD].total,
               "backward": max(e.phases[p].total for p in (Phase.LOSS_BWD, Phase.BLOCK_BWD,
                                                           Phase.BWD_END)),
               "optimizer": e.phases[Phase.OPTIMIZER].total}
    return e.peak_allocated_bytes, moments


DENSE = [r for r in _gpu_cases() if not r["model"]["n_experts"] > 1]


def _env(folder: Path) -> dict:
    """The env record of the folder's first run (torch, cuDNN, the GPU's name)."""
    path = sorted(folder.glob("run*-records.jsonl"))[0]
    return next(r for r in map(json.loads, path.read_text().splitlines())
                if r["record"] == "env")


def _attention_not_kept(rec: dict, env: dict) -> int:
    """Bytes per block the planner keeps under selective checkpointing that the run's policy
    recomputed: the SDPA kernel's output (bf16: 2 * B * T * q_dim) and fp32 logsumexp
    (4 * B * heads * T), where torch ran cuDNN's kernel (SM 9.x with cuDNN > 9.15:
    sdp_utils.cpp ``check_prefer_cudnn_attention``; H100 / H200, cuDNN 9.19 here) and the
    probe's save list lacked its op (records without ``sac_save_ops``: the probe before
    torchtitan #2095's list was taken over). 0 otherwise."""
    if rec["candidate"]["checkpointing"] != "selective" or rec["training"]["attention"] != "sdpa":
        return 0
    cudnn_op = "aten._scaled_dot_product_cudnn_attention.default"
    if cudnn_op in rec.get("sac_save_ops", ()):
        return 0
    sm9 = any(g in env["nvidia_smi"]["gpus"][0]["name"] for g in ("H100", "H200"))
    if not (sm9 and env["cudnn"] > 91500):
        return 0
    m, t = rec["model"], rec["training"]
    q_dim = m["n_heads"] * (m["head_dim"] or m["hidden"] // m["n_heads"])
    b, seq = t["micro_batch"], t["seq"]
    return 2 * b * seq * q_dim + 4 * b * m["n_heads"] * seq


def _planner_for_the_run(rec: dict, profile: str, env: dict) -> tuple[int, dict]:
    """The planner's peak and moments, less what the run's policy did not keep (above): every
    block's at forward and loss_bwd, every block but the one in backward (whose recompute
    makes them) at block_bwd, none after the blocks' backward."""
    from planner.hardware import load_gpu
    from planner.memory import Phase as P
    from probes.gpu_records import row_of

    e = row_of(rec, load_gpu(profile)).est()
    a, n = _attention_not_kept(rec, env), rec["model"]["n_layers"]
    ph = {p: e.phases[p].total for p in e.phases}
    moments = {"forward": ph[P.FORWARD] - n * a,
               "backward": max(ph[P.LOSS_BWD] - n * a, ph[P.BLOCK_BWD] - (n - 1) * a,
                               ph[P.BWD_END]),
               "optimizer": ph[P.OPTIMIZER]}
    peak = e.peak_allocated_bytes if a == 0 else max(moments.values())
    return peak, moments


def _allocated_within_tolerance(rec: dict, profile: str, folder: Path = RUNS) -> None:
    """Within 1.4 %, compiled blocks within 2 %; op-level selective checkpointing against
    what the run's policy kept (``_planner_for_the_run``), peak and moments within 0.5 %."""
    env = _env(folder)
    pred, moments = _planner_for_the_run(rec, profile, env)
    err = (pred - rec["max_allocated_bytes"]) / rec["max_allocated_bytes"]
    if rec["candidate"]["checkpointing"] == "selective":
        assert abs(err) < 0.005, err
        for m in ("forward", "backward"):
            meas = rec["moments"][m]["allocated"]
            assert abs(moments[m] - meas) / meas < 0.005, (m, moments[m] / GiB, meas / GiB)
    elif rec["training"]["compile"] != "none":
        assert abs(err) < 0.02, err
    else:
        assert abs(err) < 0.014, err


@pytest.mark.parametrize("rec", DENSE, ids=[r["id"] for r in DENSE])
def test_planner_allocated_peak_against_the_h200(rec):
    """The measured max_memory_allocated of every dense case that ran on the H200."""
    _allocated_within_tolerance(rec, "h200")


def _h100_dense() -> list[tuple[str, dict]]:
    """(pytest id, record) of every dense case that ran on the H100; a case measured in two
    runs (cmp-1b-fsdp-none: the full run's compile part, then the compile part alone) once
    per run."""
    out = []
    for path in sorted(H100_RUNS.glob("run*-records.jsonl")):
        run_name = path.name.split("-", 1)[0]
        out += [(f"{run_name}-{r['id']}", r) for r in map(json.loads,
                                                          path.read_text().splitlines())
                if r["record"] == "case" and r["ok"] and not r["model"]["n_experts"] > 1]
    return out


DENSE_H100 = _h100_dense()


@pytest.mark.parametrize("rec", [r for _, r in DENSE_H100], ids=[i for i, _ in DENSE_H100])
def test_planner_allocated_peak_against_the_h100(rec):
    """The measured max_memory_allocated of every dense case that ran on the H100, with the
    h100-80 profile, within the H200's tolerances."""
    _allocated_within_tolerance(rec, "h100-80", H100_RUNS)


H100_B_RUNS = ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h100-b"


def test_the_selective_gap_is_the_attention_the_runs_recomputed():
    """Before the run's policy is accounted for, the planner is above every selective record
    by 1.6-6.8 % (docs/accuracy.md); the records carry no save list (taken before this fix),
    their GPUs are SM 9.0 with cuDNN 9.19, so each block's SDPA output and logsumexp count."""
    recs = [(r, folder) for folder in (RUNS, H100_RUNS, H100_B_RUNS) for r in _gpu_cases(folder)
            if r["candidate"]["checkpointing"] == "selective"]
    assert len(recs) == 15
    for rec, folder in recs:
        assert "sac_save_ops" not in rec
        assert _attention_not_kept(rec, _env(folder)) > 0, rec["id"]
        pred, _ = _planner_allocated(rec, "h200" if folder == RUNS else "h100-80")
        err = (pred - rec["max_allocated_bytes"]) / rec["max_allocated_bytes"]
        # the 8B step at seq 4096 peaks in the optimizer step, after the blocks' backward
        assert (-0.002 < err < 0.0) if rec["id"] == "w1-8b-ddp-sel-bf16" else (0.015 < err < 0.07)


@pytest.mark.parametrize("path", [
    H100_RUNS / "memory_snapshot.pickle",
    ROOT / "tests" / "data" / "gpu" / "memory_snapshot-h200-small-step.pickle"],
    ids=["h100", "h200"])
def test_the_snapshots_show_cudnn_attention(path):
    """Each run's memory snapshot (probes/gpu_cases.py ``snapshot``: the tiny Llama, h 512,
    8 heads of 64, 2 kv heads, 2 x 512 tokens, autocast bf16) has, in each SDPA call, two
    8-byte device allocations: cuDNN's philox seed and offset (``at::zeros({1}, kLong)`` on the
    query's device, attention.cu ``_scaled_dot_product_cudnn_attention_cuda``); flash without
    dropout makes them host tensors. Beside them the output 2 * 2 * 512 * 512 = 1,048,576 and
    the fp32 logsumexp 4 * 2 * 8 * 512 = 32,768 bytes. So this torch (2.11, cuDNN 9.19) ran
    SDPA as cuDNN's op on SM 9.0, the op the probe's old save list lacked."""
    snap = pickle.loads(path.read_bytes())
    calls: dict[int, list[int]] = {}
    call = -1
    last_core = False
    for ev in snap["device_traces"][0]:
        in_core = bool(ev.get("frames")) and ev["frames"][0]["name"] == "core"
        if in_core and not last_core:
            call += 1
        last_core = in_core
        if in_core and ev["action"] == "alloc":
            calls.setdefault(call, []).append(ev["size"])
    assert calls
    for sizes in calls.values():
        assert sizes.count(8) == 2, sizes
        assert 1_048_576 in sizes and 32_768 in sizes, sizes


def test_the_two_gpus_allocate_the_same_bytes():
    """Every case that ran on both GPUs peaked at the same allocated bytes (same torch, shapes
    and kernels: the caching allocator gets the same requests), so the planner's allocated
    terms carry from one GPU to the other; what ran only on the H200 did not fit in 80 GB."""
    h200 = {r["id"]: r for r in _gpu_cases()}
    h100 = {r["id"]: r for r in _gpu_cases(H100_RUNS)}
    common = set(h200) & set(h100)
    assert len(common) == 36
    assert all(h200[i]["max_allocated_bytes"] == h100[i]["max_allocated_bytes"]
               for i in common)
    # what ran on the H200 and not on the H100 (80 GB): 3B DDP, 3B FSDP2 without
    # checkpointing, 8B FSDP2 at 8 ranks without checkpointing, Mixtral at 48 ranks
    assert {i for i in h200 if i not in h100} >= {
        "w1-3b-ddp-none", "w1-3b-fsdp-none-fused", "w8-8b-fsdp-none",
        "w48-mixtral4L-fsdp-full"}


MOE = [r for r in _gpu_cases() if r["model"]["n_experts"] > 1]


@pytest.mark.parametrize("rec", MOE, ids=[r["id"] for r in MOE])
def test_planner_moments_for_mixtral_past_its_experts(rec):
    _, moments = _planner_allocated(rec)
    for m, pred in moments.items():
        meas = rec["moments"][m]["allocated"]
        assert abs(pred - meas) / meas < 0.05, (m, pred / GiB, meas / GiB)


def test_the_oom_artefacts_are_whole():
    data = ROOT / "tests" / "data" / "gpu"
    oom = (data / "oom-h200-llama3.1-8b-ddp-bf16amp-optimizer.txt").read_text()
    assert oom.startswith("Traceback (most recent call last):")
    assert oom.rstrip().endswith("optimizing-memory-usage-with-pytorch-cuda-alloc-conf)")
    assert "_multi_tensor_adam" in oom and "Tried to allocate 224.00 MiB" in oom
    snap = pickle.loads((data / "memory_snapshot-h200-small-step.pickle").read_bytes())
    assert {"segments", "device_traces"} <= set(snap) and len(snap["segments"]) > 0


@pytest.mark.integration
def test_cpu_run_frontier_parts(tmp_path):
    """The parts added for float8, activation offloading and the float8 GEMMs run on the CPU:
    torchao's Float8Linear replaces the blocks' 7 linears per layer (2 tiny layers; the output
    head stays bf16), the reference has none, the tensorwise + float8 all-gather case runs
    torchtitan's scale precompute; every GEMM shape gets three timings; offloading, which needs
    CUDA streams and pinned memory, is refused per case with that reason (the run goes on)."""
    ids = "f8-1b-fsdp-none-ref,f8-1b-fsdp-none-twag,f8-1b-fsdp-none-rw,off-1b-ddp-none"
    p = _driver(tmp_path, "--parts", "gemm,float8,offload", "--only", ids)
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    recs = _records(tmp_path)
    cases = {r["id"]: r for r in recs if r["record"] == "case"}
    assert cases["f8-1b-fsdp-none-ref"]["ok"] and cases["f8-1b-fsdp-none-ref"]["float8_linears"] == 0
    assert cases["f8-1b-fsdp-none-twag"]["float8_linears"] == 2 * 7
    assert cases["f8-1b-fsdp-none-rw"]["float8_linears"] == 2 * 7
    assert cases["f8-1b-fsdp-none-twag"]["float8_precompute_scale"] is True
    assert cases["f8-1b-fsdp-none-rw"]["float8_precompute_scale"] is False
    assert cases["f8-1b-fsdp-none-twag"]["ok"] and cases["f8-1b-fsdp-none-rw"]["ok"]
    off = cases["off-1b-ddp-none"]
    assert not off["ok"] and "needs CUDA" in off["error"]
    gemms = [r for r in recs if r["record"] == "gemm"]
    from probes.gpu_cases import gemm_shapes

    assert [g["shape"] for g in gemms] == [s[0] for s in gemm_shapes()]
    assert all(g.get("error") is None and g["bf16_s"] > 0 and g["fp8_tensorwise_s"] > 0
               and g["fp8_rowwise_s"] > 0 for g in gemms)


FRONTIER_GAPS = {
    # case id -> why the planner's allocated peak is off by more than the tolerance (measured,
    # not yet modelled; docs/accuracy.md §6.1)
    "cf8-1b-fsdp-none-twag": "float8 under compiled blocks saves less than eager (+8.3 %)",
    "cf8-1b-fsdp-none-rw": "float8 under compiled blocks saves less than eager (+11.0 %)",
    "cm-1b-ddp-none": "the whole model compiled: inductor's backward peak (+5.3 %)",
    "cm-1b-ddp-none-ga2": "the whole model compiled: inductor's backward peak (+4.6 %)",
}


def _h100_b_cases() -> list:
    """Each case of the second H100 lease once (its latest run: run3 re-measured some)."""
    latest: dict[str, dict] = {}
    for path in sorted(H100_B_RUNS.glob("run*-records.jsonl")):
        for r in map(json.loads, path.read_text().splitlines()):
            if r["record"] == "case" and r["ok"]:
                latest[r["id"]] = r
    return [pytest.param(r, id=cid, marks=[pytest.mark.xfail(strict=True,
                                                             reason=FRONTIER_GAPS[cid])]
                         if cid in FRONTIER_GAPS else [])
            for cid, r in sorted(latest.items())]


@pytest.mark.parametrize("rec", _h100_b_cases())
def test_planner_allocated_peak_against_the_second_h100_lease(rec):
    """float8 (eager: torchao saves the bf16 input and weight, as bf16 does), activation
    offloading with full checkpointing, accumulation and the bf16 references: the measured
    max_memory_allocated within the first leases' tolerances; the gaps the lease found are
    strict xfails with their reason; the selective cases against what their policy kept
    (``_planner_for_the_run``: the runs' probe recomputed cuDNN's attention)."""
    _allocated_within_tolerance(rec, "h100-80", H100_B_RUNS)


def _expandable_records() -> list:
    out = []
    for folder, profile in ((RUNS, "h200"), (ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h100",
                                             "h100-80")):
        out += [pytest.param(r, profile, id=f"{profile}-{r['id']}") for r in _gpu_cases(folder)
                if r["training"].get("allocator") == "expandable"]
    return out


@pytest.mark.parametrize("rec, profile", _expandable_records())
def test_planner_reserved_under_expandable_segments(rec, profile):
    """Expandable segments: max_memory_reserved = allocated + the other streams' caches
    (FSDP2's previous sharded gradients, its all-gather buffers) + the loss gap
    (docs/model.md §7.4), nothing fitted: within 1 % of every record (measured -0.4..-0.6 %
    on 2026-11-26; the planner's reserved before was -2.8..-18.5 %)."""
    from planner.hardware import load_gpu
    from probes.gpu_records import row_of

    e = row_of(rec, load_gpu(profile)).est()
    err = (e.peak_reserved_bytes - rec["max_reserved_bytes"]) / rec["max_reserved_bytes"]
    assert abs(err) < 0.01, err
