"""The measured error bands (planner/error_bands.py, planner/data/error_bands.json), the default
margin derived from them, the benchmark rows' ``extra`` column, and the file's staleness."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from planner import error_bands as eb
from planner.spec import CompileMode, Strategy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# ---- the statistics, by hand ------------------------------------------------------------------


def test_nearest_rank_by_hand():
    values = [0.05, 0.01, 0.10, 0.02, 0.03, 0.04, 0.06, 0.07, 0.08, 0.09]  # 0.01 .. 0.10
    # ceil(0.9 * 10) = 9th smallest = 0.09; ceil(0.5 * 10) = 5th = 0.05
    assert eb.nearest_rank(values, 0.9) == 0.09
    assert eb.nearest_rank(values, 0.5) == 0.05
    # 11 values: ceil(9.9) = 10th smallest
    assert eb.nearest_rank(values + [0.5], 0.9) == 0.10
    with pytest.raises(ValueError):
        eb.nearest_rank([], 0.9)


def test_summarize_by_hand():
    errs = [-0.20, -0.10, 0.0, 0.05, 0.30]
    b = eb.summarize(errs)
    assert b["n"] == 5
    assert b["median_abs"] == 0.10  # |errs| sorted 0, .05, .10, .20, .30
    assert b["p90_abs"] == 0.30  # ceil(4.5) = 5th
    assert b["median_signed"] == 0.0
    assert b["p90_under"] == 0.20  # under = 0.2, 0.1, 0, 0, 0 -> 5th smallest
    assert b["max_under"] == 0.20 and b["max_over"] == 0.30


def test_margin_is_the_p90_under_prediction_rounded_up():
    # ten rows, three under-predicted by 3 %, 12.3 % and 20 %: the 9th smallest of
    # (0 x 7, 0.03, 0.123, 0.2) is 0.123 -> 0.13
    errs = [0.01, 0.02, 0.0, 0.05, 0.1, 0.03, 0.04, -0.03, -0.123, -0.2]
    assert eb.margin_from(errs) == 0.13
    # exactly a whole percent stays
    assert eb.margin_from([-0.07] * 10) == 0.07
    # no under-prediction at all: no margin is needed to cover the measured error
    assert eb.margin_from([0.1] * 10) == 0.0


def test_family():
    assert eb.family(Strategy.DDP) == "ddp-eager"
    assert eb.family(Strategy.FULL_SHARD, CompileMode.BLOCKS) == "fsdp-compiled"
    assert eb.family(Strategy.NO_SHARD) == "fsdp-eager"
    assert eb.family(Strategy.ZERO3, CompileMode.MODEL) == "zero-compiled"


def test_band_falls_back_to_all_rows_when_a_family_has_few(monkeypatch):
    one = {"n": 1, "median_abs": 0.5, "p90_abs": 0.5, "median_signed": 0.5, "p90_under": 0.0}
    many = {"n": 20, "median_abs": 0.04, "p90_abs": 0.12, "median_signed": 0.01,
            "p90_under": 0.08}
    table = {"schema_version": eb.SCHEMA_VERSION,
             "memory": {"all": many, "families": {"zero-eager": one, "fsdp-eager": many},
                        "margin": {"value": 0.08}}}
    monkeypatch.setattr(eb, "_table", lambda: table)
    b = eb.band("memory", Strategy.ZERO2)
    assert b.measured_family == "all" and b.n == 20
    assert "of all kinds" in b.text()
    b = eb.band("memory", Strategy.FULL_SHARD)
    assert b.measured_family == "fsdp-eager" and b.p90_abs == 0.12
    assert eb.band("step_time", Strategy.DDP) is None  # no throughput section
    assert eb.default_margin() == 0.08
    doc = eb.bands_json(Strategy.ZERO2)
    assert doc["kind"] == "zero-eager" and doc["memory"]["family"] == "all"
    assert doc["step_time"] is None


def test_default_margin_without_the_file(monkeypatch):
    monkeypatch.setattr(eb, "_table", dict)
    assert eb.default_margin() == eb.FALLBACK_MARGIN
    assert eb.band("memory", Strategy.DDP) is None
    assert eb.bands_line(Strategy.DDP) is None


# ---- the shipped file ------------------------------------------------------------------------


def shipped() -> dict:
    return json.loads(Path(eb.DATA_PATH).read_text())


def test_the_default_margin_is_the_measured_one():
    from planner.fields import BY_PATH
    from planner.memory import DEFAULT_MARGIN
    from planner.request import Options

    value = shipped()["memory"]["margin"]["value"]
    assert 0 < value < 1
    assert DEFAULT_MARGIN == value == eb.default_margin()
    assert BY_PATH["margin"].default == value
    assert Options().margin == value


def test_profiles_carry_the_fitted_efficiencies():
    from planner.hardware import load_gpu

    fits = {(f["family"], f["mode"]): f["eff"]
            for f in shipped()["throughput"]["compute_efficiency_fit"]}
    for gpu_id, fam in (("a100-80", "A100"), ("h100-80", "H100")):
        gpu = load_gpu(gpu_id)
        assert gpu.compute_efficiency == fits[(fam, "eager")], gpu_id
        assert gpu.compiled_compute_efficiency == fits[(fam, "compiled")], gpu_id


@pytest.mark.integration
def test_error_bands_file_is_current(tmp_path):
    """Rerun both generators into a copy of the file; it must not change."""
    out = tmp_path / "error_bands.json"
    shutil.copy(eb.DATA_PATH, out)
    for script in ("benchmarks/memory_accuracy.py", "benchmarks/throughput_accuracy.py"):
        p = subprocess.run([sys.executable, script, "--md", str(tmp_path / "x.md"),
                            "--bands", str(out)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, check=False)
        assert p.returncode == 0, p.stderr[-2000:]
    assert out.read_text() == Path(eb.DATA_PATH).read_text(), (
        "planner/data/error_bands.json is stale: run `python benchmarks/memory_accuracy.py` and "
        "`python benchmarks/throughput_accuracy.py` and commit")


# ---- the benchmark rows' extra column -------------------------------------------------------


def test_extra_is_parsed_as_spec_fields():
    from benchmarks.rowspec import request_for

    base = {"model.preset": "llama2-7b", "hardware.gpu": "h100-80", "hardware.n": 8,
            "strategy": "full_shard", "offload": "none", "checkpointing": "full"}
    row = {"id": "r1", "extra": json.dumps({"training.grad_sync": "last",
                                            "training.loss": "chunked:4",
                                            "training.compile": "blocks",
                                            "training.fsdp_version": 1})}
    t = request_for(row, base).training
    assert (str(t.grad_sync), str(t.loss), t.loss_chunks, str(t.compile), t.fsdp_version) == (
        "last", "chunked", 4, "blocks", 1)
    assert request_for({"id": "r2", "extra": ""}, base).training.fsdp_version == 2


@pytest.mark.parametrize("extra, message", [
    ("{not json", "r9: extra: not JSON"),
    ("[1, 2]", "r9: extra: must be a JSON object"),
    ('{"training.nope": 1}', "r9: extra: unknown spec field(s) 'training.nope'"),
    ('{"strategy": "ddp"}', "r9: extra repeats a column: strategy"),
    ('{"training.loss": "chunked:x"}', "r9: training.loss:"),
])
def test_bad_extra_names_the_row_and_the_field(extra, message):
    from benchmarks.rowspec import RowError, request_for

    base = {"model.preset": "llama2-7b", "hardware.gpu": "h100-80", "hardware.n": 8,
            "strategy": "full_shard"}
    with pytest.raises(RowError) as exc:
        request_for({"id": "r9", "extra": extra}, base)
    assert str(exc.value).startswith(message), str(exc.value)


def test_every_benchmark_row_parses():
    import csv

    from benchmarks import memory_accuracy, throughput_accuracy

    for path, predict in (("benchmarks/memory_measurements.csv", memory_accuracy.predict),
                          ("benchmarks/throughput_measurements.csv",
                           throughput_accuracy.predict)):
        with open(ROOT / path, newline="") as f:
            rows = list(csv.DictReader(f))
        assert all(None not in r and "extra" in r for r in rows), path  # no ragged rows
        for row in rows:
            predict(row)


# ---- the verdicts carry the band ------------------------------------------------------------


def test_plan_json_and_text_carry_the_band():
    from planner.fields import FLAGS
    from planner.plan import plan
    from planner.render import answer_json, table
    from planner.request import build_request

    r = build_request({"model.preset": "llama3-8b", "hardware.gpu": "h100-80", "hardware.n": 8,
                       "training.compile": "blocks", "calibration": "none"}, FLAGS)
    answer = plan(r)
    doc = answer_json(answer)
    rec = answer.recommendation.candidate
    assert doc["recommendation"]["error_band"] == eb.bands_json(rec.strategy, CompileMode.BLOCKS)
    for c in doc["candidates"]:
        assert c["error_band"]["kind"] == eb.family(Strategy(c["strategy"]), CompileMode.BLOCKS)
    assert eb.bands_line(rec.strategy, CompileMode.BLOCKS) in table(answer, wide=True)


def test_gate_verdict_carries_the_band():
    from planner.gate import gate

    v = gate({"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8}})
    assert v["error_band"] == eb.bands_json(Strategy(v["predicted"]["strategy"]))
    v = gate({"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8},
              "strategy": "ddp"})
    assert v["error_band"]["kind"] == "ddp-eager"
