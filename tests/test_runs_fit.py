"""Calibration from runs: the runtime terms fitted on a user's runs (logs, OOM messages,
fitcheck's GPU records) through one fitting code, written in the calibration schema, with the
planner's error on held-out runs before and after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line_error, run

from planner.calibration import is_stale, load_calibration
from planner.hardware import load_gpu
from planner.runs import fit as F
from planner.runs.manifest import read_manifest
from planner.runs.read import read_run

ROOT = Path(__file__).parent.parent
RUNS = ROOT / "benchmarks" / "gpu_runs" / "2026-11-26-h200"
PUBLIC_RUNS = ROOT / "tests" / "data" / "runs" / "public_runs.json"
MiB, GiB = 2**20, 2**30


@pytest.fixture(scope="module")
def h200_cases():
    gpu = load_gpu("h200")
    cases = []
    for i in (1, 2, 3, 4):
        _run, recs = read_run([str(RUNS / f"run{i}-records.jsonl")])
        cases += [F.case_from_recorded(r, gpu) for r in recs]
    return cases


def test_the_h200_records_give_the_context_the_gpu_run_measured(h200_cases):
    fitted = F.fit(h200_cases)
    ctx = fitted.values["cuda_context_bytes"]
    # docs/calibration.md §6 (benchmarks/gpu_calibration.py, measured on the same H200):
    # context + kernels + cuBLAS handles after the steps 837 MiB, + the 615 MiB the driver
    # keeps = 1452 MiB in the planner's frame
    assert abs(ctx["value"] - 1452 * MiB) < 0.02 * 1452 * MiB
    assert ctx["n"] >= 10
    # one H200: a one-rank NCCL communicator is measured but not fitted as the multi-GPU term
    assert fitted.values["nccl_bytes_per_communicator"] is None
    assert any("one-rank communicator" in n for n in fitted.notes)
    assert 0 < fitted.values["allocator_fragmentation"]["value"] < 0.3
    judged = F.judge_terms(h200_cases, fitted)
    j = judged["cuda_context_bytes"]
    # with the allocator's per-stream caches in reserved (docs/model.md §7.4) the defaults
    # predict these records' device used within 3.6 % (median |error|, 42 records; 12.6 % with
    # the earlier cached-leftover rule); the fitted context does not improve on that (4.5 %),
    # so the judge leaves it out
    assert j["median_abs_error_before"] < 0.05
    assert j["keep"] is (j["median_abs_error_after"] < j["median_abs_error_before"])


def test_public_runs_fit_on_half_score_the_other(tmp_path):
    cases, _v = read_manifest(str(PUBLIC_RUNS))
    v100 = [c for c in cases if c.cluster.gpu.id == "v100-16"]
    assert len(v100) == 9
    h = F.halves(v100)
    s = F.summary(h["rows"])["device_used"]
    assert s["n"] == 9
    # the figures docs/explain.md reports
    doc = (ROOT / "docs" / "explain.md").read_text()
    before, after = s["median_abs_error_before"], s["median_abs_error_after"]
    assert f"{before:.1%} -> {after:.1%}" in doc, (before, after)
    assert after < before


def test_calibrate_command_writes_a_file_plan_reads(tmp_path, monkeypatch):
    out = tmp_path / "cal.json"
    r = run("calibrate", "--from-log", str(RUNS / "run1-records.jsonl"), "--from-log",
            str(RUNS / "run2-records.jsonl"), "--gpu", "h200", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "held out" in r.stdout and "cuda_context_bytes" in r.stdout
    cal = load_calibration(str(out))
    assert cal.gpu_profile == "h200" and cal.torch == "2.11.0+cu130" and cal.nccl == "2.28.9"
    assert cal.value("cuda_context_bytes") is not None
    assert is_stale(cal, "2.12.0") is not None and is_stale(cal, "2.11.0+cu128") is None
    # plan applies it (--calibration FILE) and, from the search path, auto
    r = run("--model", "llama3-8b", "--gpu", "h200", "--n", "8", "--calibration", str(out),
            "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["calibration"]["id"] == cal.id
    monkeypatch.setenv("FITCHECK_CALIBRATION_PATH", str(tmp_path))
    r = run("--model", "llama3-8b", "--gpu", "h200", "--n", "8", "--json")
    assert json.loads(r.stdout)["calibration"]["id"] == cal.id
    assert not list(tmp_path.glob(".*.tmp"))


def test_calibrate_a_users_log_with_the_job_flags(tmp_path):
    log = ROOT / "tests" / "data" / "runs" / "public" / "torchtitan-pr996-ce-fp32.log"
    out = tmp_path / "cal.json"
    r = run("calibrate", "--from-log", str(log), "--model", "llama3-8b", "--gpu", "h100-nvl",
            "--n", "8", "--gpus-per-node", "8", "--strategy", "full_shard", "--checkpointing",
            "selective",
            "--seq", "8192", "--optimizer-impl", "fused", "--allocator", "expandable",
            "--torch-version", "2.6.0", "--out", str(out), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    cal = doc["calibration"]
    # 8192 tokens per step per GPU at 5,959 tokens/s: one step 1.375 s
    assert cal["values"]["compute_efficiency"]["value"] > 0
    assert cal["versions"]["torch"] == "2.6.0"
    # expandable segments measure another allocator term: not fitted from this run
    assert cal["values"]["allocator_fragmentation"] is None
    assert doc["held_out"] == []


def test_calibrate_runs_manifest_holds_each_out():
    r = run("calibrate", "--runs", str(PUBLIC_RUNS), "--json")
    # two GPU types in one manifest: a calibration is for one
    one_line_error(r, 4, "different GPU profiles")


def test_calibrate_errors(tmp_path):
    one_line_error(run("calibrate", "--gpu", "h200"), 2, "--from-log")
    log = tmp_path / "x.log"
    log.write_text("nothing here\n")
    one_line_error(run("calibrate", "--from-log", str(log), "--model", "llama3-8b",
                       "--gpu", "h100-80"), 4, "no memory figure")
    bad = tmp_path / "runs.json"
    bad.write_text(json.dumps({"runs": [{"id": "a", "files": ["x.log"], "job": {
        "training.seq": -3}}]}))
    one_line_error(run("calibrate", "--runs", str(bad)), 4, "a.job", "training.seq")


def test_probe_records_go_through_the_same_fitting(tmp_path):
    """A `fitcheck probe` step record (schema fitcheck-probe/1, docs/calibration.md §1) reads
    as a case with its own job, as the GPU-run records do."""
    rec = next(json.loads(line) for line in (RUNS / "run1-records.jsonl").read_text()
               .splitlines() if '"w1-1b-fsdp-none"' in line)
    probe = {"schema": "fitcheck-probe/1", "record": "step", "run_id": "x",
             "env": {"gpu_name": "NVIDIA H200", "gpu_profile": "h200", "torch": "2.11.0",
                     "cuda": "13.0", "driver": "580.159.04", "nccl": "2.28.9",
                     "memory_total_bytes": 150109880320, "device": "cuda"},
             "world_size": 1, "gpus_per_node": 1, "model": rec["model"],
             "training": rec["training"], "candidate": rec["candidate"], "ok": True,
             "oom": False, "max_allocated_bytes": rec["max_allocated_bytes"],
             "max_reserved_bytes": rec["max_reserved_bytes"],
             "device_used_bytes": rec["device_used_bytes"], "step_time_s": rec["step_time_s"]}
    p = tmp_path / "probe.jsonl"
    p.write_text(json.dumps(probe) + "\n")
    run_, cases = read_run([str(p)])
    assert run_.versions["torch"] == "2.11.0" and len(cases) == 1
    case = F.case_from_recorded(cases[0], load_gpu("h200"))
    obs = F.observe(case)
    assert obs.measured["peak_allocated"] == rec["max_allocated_bytes"]
    assert obs.measured["step_time"] == rec["step_time_s"]
    assert obs.time and obs.frag
