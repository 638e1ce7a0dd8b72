"""The probe launcher and worker on CPU (gloo): records, OOM as a result, timeouts, the CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trace, pytest.mark.integration]

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from planner.cli import cli  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate,
    Checkpointing,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
)
from probes.cuda_launch import expand_candidates, launch, run_processes  # noqa: E402
from probes.runner import spec_to_dict  # noqa: E402

TINY = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4, ffn_hidden=128,
                 vocab=256)
TRAIN = TrainingSpec(seq=32, micro_batch=2, precision=Precision.BF16_AMP)
ENV_KEYS = {"gpu_name", "memory_total_bytes", "driver", "cuda", "torch", "nccl", "hostname",
            "date", "device", "backend"}


def _config(cands: list[Candidate], **over) -> dict:
    cfg = {"model": spec_to_dict(TINY), "training": spec_to_dict(TRAIN),
           "candidates": [spec_to_dict(c) for c in cands], "device": "cpu", "steps": 2,
           "warmup": 1, "gpus_per_node": 2, "bandwidth": True}
    cfg.update(over)
    return cfg


def test_gloo_run_records_and_oom_is_a_result(tmp_path):
    cands = [Candidate(strategy=Strategy.DDP),
             Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL),
             Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.PARAMS_AND_OPTIMIZER)]
    out = tmp_path / "rec.jsonl"
    t0 = time.monotonic()
    run = launch(_config(cands), nproc=2, out=str(out), timeout_s=90,
                 env={"FITCHECK_CUDA_PROBE_FAULT": "oom:0"}, echo=False)
    assert run.ok, (run.reason, run.stderr_tail)
    assert time.monotonic() - t0 < 60
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs == run.records
    steps = [r for r in recs if r["record"] == "step"]
    assert [r["candidate"]["strategy"] for r in steps] == ["ddp", "full_shard", "full_shard"]
    oom, ok, off = steps
    # the injected OOM is recorded, and the next candidates still ran
    assert oom["oom"] is True and oom["ok"] is False and "OutOfMemoryError" in oom["error"]
    assert oom["step_time_s"] is None
    for r in (ok, off):
        assert r["ok"] is True and r["oom"] is False and r["error"] is None
        assert r["step_time_s"] > 0 and len(r["step_times_s"]) == 2
        assert r["achieved_tflops"] > 0
        assert r["wrapper"] == "fully_shard" and r["mesh_shape"] == [2]
        # CPU: device memory fields null, host RSS measured
        assert r["max_allocated_bytes"] is None and r["device_used_bytes"] is None
        assert r["host_max_rss_bytes"] > 0
        assert len(r["per_rank"]) == 2
    assert off["candidate"]["offload"] == "params_and_optimizer"
    for r in recs:
        assert ENV_KEYS <= r["env"].keys()
        assert r["env"]["backend"] == "gloo" and r["world_size"] == 2
        assert r["requested_model"]["hidden"] == 64 and r["run_id"] == run.run_id
    assert ok["n_layers_used"] == 2 and ok["proxy"] is False
    assert ok["model"]["n_layers"] == 2 and ok["training"]["seq"] == 32
    bw = [r for r in recs if r["record"] == "collectives"]
    assert len(bw) == 1
    ops = {s["op"] for s in bw[0]["bandwidth"]}
    assert ops == {"all_reduce", "all_gather", "reduce_scatter"}
    for s in bw[0]["bandwidth"]:
        factor = 1.0 if s["op"] == "all_reduce" else 0.5  # 2(n-1)/n, (n-1)/n at n = 2
        assert s["busbw_bytes_per_s"] == pytest.approx(s["algbw_bytes_per_s"] * factor)
    assert not run_processes(run.run_id)


def test_proxy_layers_are_recorded(tmp_path):
    out = tmp_path / "rec.jsonl"
    run = launch(_config([Candidate(strategy=Strategy.SHARD_GRAD_OP)], proxy_layers=1,
                         bandwidth=False), nproc=1, out=str(out), timeout_s=60, echo=False)
    assert run.ok, run.reason
    (rec,) = run.records
    assert rec["n_layers_used"] == 1 and rec["proxy"] is True
    assert rec["model"]["n_layers"] == 1 and rec["requested_model"]["n_layers"] == 2
    assert rec["world_size"] == 1


def test_timeout_kills_every_process(tmp_path):
    out = tmp_path / "rec.jsonl"
    t0 = time.monotonic()
    run = launch(_config([Candidate(strategy=Strategy.DDP)]), nproc=2, out=str(out),
                 timeout_s=8, env={"FITCHECK_CUDA_PROBE_FAULT": "hang"}, echo=False)
    wall = time.monotonic() - t0
    assert not run.ok and "timeout after 8 s" in run.reason
    assert wall < 8 + 12
    assert run_processes(run.run_id) == []
    assert run.records[-1]["record"] == "failure" and "timeout" in run.records[-1]["reason"]


def test_cli_crash_is_exit_1_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("FITCHECK_CUDA_PROBE_FAULT", "crash")
    out = tmp_path / "rec.jsonl"
    r = CliRunner().invoke(cli, ["probe", "--layers", "2", "--hidden", "64", "--heads", "4",
                                 "--vocab", "256", "--seq", "32", "--nproc", "2", "--device",
                                 "cpu", "--strategy", "ddp", "--checkpointing", "none",
                                 "--out", str(out), "--timeout", "60", "--steps", "1"])
    assert r.exit_code == 1, r.output
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("fitcheck: error: probe failed: torchrun exited with status")
    assert "injected crash" in last
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs[-1]["record"] == "failure"


@pytest.mark.parametrize(("args", "needle"), [
    (["--strategy", "zero3"], "--strategy: zero3 not probed"),
    (["--calibrate", "x.json"], "--calibrate: needs --gpu"),
    (["--optimizer", "lion"], "--optimizer: lion"),
    (["--strategy", "bogus"], "--strategy: unknown value 'bogus'"),
])
def test_cli_usage_errors(args, needle, tmp_path):
    r = CliRunner().invoke(cli, ["probe", "--model", "gpt2", "--out", str(tmp_path / "o"),
                                 *args])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_cli_print_srun(tmp_path):
    out = tmp_path / "rec.jsonl"
    r = CliRunner().invoke(cli, ["probe", "--model", "llama3.2-1b", "--gpu", "h100-80",
                                 "--nproc", "8", "--out", str(out), "--print-srun"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("srun ") and "--nproc-per-node 8" in r.stdout
    assert "probes.cuda_probe" in r.stdout
    cfg = json.loads((tmp_path / "rec.jsonl.config.json").read_text())
    assert cfg["gpu_profile"] == "h100-80" and len(cfg["candidates"]) == 10


def test_expand_candidates_defaults():
    cands, skipped = expand_candidates((), "auto", "auto", 8)
    assert len(cands) == 10 and not skipped  # 5 strategies x (none, full)
    assert {c.checkpointing for c in cands} == {Checkpointing.NONE, Checkpointing.FULL}
    cands, skipped = expand_candidates(("ddp,full_shard",), "params_and_optimizer", "none", 8)
    assert [c.strategy for c in cands] == [Strategy.FULL_SHARD] and len(skipped) == 1


def test_cli_reads_the_job_as_a_plan_does(tmp_path):
    """The probe builds what it trains with the plan's own reader (planner.request.job_from):
    a config.json that needs --approximate is refused without it, with the plan's message,
    and with it the probe states the approximation (it used to drop it without a word)."""
    path = str(Path(__file__).parent / "data" / "configs" / "archs" / "qwen2.5-vl-7b.json")
    base = ["probe", "--config", path, "--out", str(tmp_path / "rec.jsonl"), "--print-srun"]
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 4, r.output
    assert "does not model the vision encoder" in r.stderr
    r = CliRunner().invoke(cli, [*base, "--approximate"])
    assert r.exit_code == 0, r.output
    assert "fitcheck probe: warning: " in r.stderr
    assert "approximate reading: the vision encoder" in r.stderr
    assert r.stdout.startswith("srun ")
