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
    assert eb.default_margin() == 0.0  # the risk replaced the single margin
    doc = eb.bands_json(Strategy.ZERO2)
    assert doc["kind"] == "zero-eager" and doc["memory"]["family"] == "all"
    assert doc["step_time"] is None


def test_without_the_file_there_is_no_band_and_no_risk(monkeypatch):
    monkeypatch.setattr(eb, "_table", dict)
    assert eb.default_margin() == 0.0
    assert eb.band("memory", Strategy.DDP) is None
    assert eb.bands_line(Strategy.DDP) is None
    assert eb.risk_band(Strategy.DDP) is None
    # without a band the verdict is the point one: needed <= usable
    assert eb.outcome(100, 100, None) == (eb.FITS, None)
    assert eb.outcome(101, 100, None) == (eb.DOES_NOT_FIT, None)


# ---- the risk: Student-t interval of log(measured / predicted) --------------------------------


@pytest.mark.parametrize("p, df, table", [
    # two-sided 90 % / 95 % critical values from any t table
    (0.95, 1, 6.314), (0.95, 2, 2.920), (0.95, 9, 1.833), (0.95, 10, 1.812),
    (0.95, 29, 1.699), (0.975, 5, 2.571), (0.975, 30, 2.042)])
def test_t_quantiles_match_the_tables(p, df, table):
    assert eb.t_ppf(p, df) == pytest.approx(table, abs=6e-4)
    assert eb.t_ppf(1 - p, df) == pytest.approx(-table, abs=6e-4)


def test_t_cdf_by_hand():
    assert eb.t_cdf(0.0, 7) == 0.5
    # df 2 has the closed form 1/2 + t / (2 sqrt(2 + t^2)): t = 1 -> 1/2 + 1/(2 sqrt 3)
    assert eb.t_cdf(1.0, 2) == pytest.approx(0.5 + 1 / (2 * 3 ** 0.5), abs=1e-12)
    # df 1 is Cauchy: 1/2 + atan(t) / pi; t = 1 -> 3/4
    assert eb.t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)
    assert eb.t_cdf(-1.0, 1) == pytest.approx(0.25, abs=1e-12)
    with pytest.raises(ValueError):
        eb.t_cdf(1.0, 0)


def band10() -> eb.RiskBand:
    """n 10, mean 0.1, sd 0.1: scale 0.1 x sqrt(1.1) = 0.104881, t(9, 0.95) = 1.833."""
    return eb.RiskBand(kind="fsdp-eager-full", measured_kind="fsdp-eager", n=10,
                       mean_log=0.1, sd_log=0.1)


def test_risk_band_interval_by_hand():
    b = band10()
    half = 1.833 * 0.1 * 1.1 ** 0.5  # 0.19225
    assert b.high == pytest.approx(2.718281828 ** (0.1 + half), rel=1e-3)  # 1.3394
    assert b.low == pytest.approx(2.718281828 ** (0.1 - half), rel=1e-3)  # 0.9119
    assert b.fallback and "fewer than 10 fsdp-eager-full runs" in b.text()
    assert "from 10 public runs of fsdp-eager jobs" in b.text()


def test_p_oom_by_hand():
    b = band10()
    # the need's median is predicted x e^0.1: a device of exactly that size is a coin toss
    assert b.p_oom(1000, int(1000 * 2.718281828 ** 0.1)) == pytest.approx(0.5, abs=1e-3)
    # at the interval's high end 5 % is left above it, at the low end 95 %
    assert b.p_oom(10**9, int(10**9 * b.high)) == pytest.approx(0.05, abs=1e-6)
    assert b.p_oom(10**9, int(10**9 * b.low)) == pytest.approx(0.95, abs=1e-6)
    # usable = predicted: z = -0.1 / 0.104881 = -0.953; t(9) tables put 0.883 at 0.80 and
    # 1.100 at 0.85, so P(OOM) = T9(0.953) lies between
    assert 0.80 < b.p_oom(100, 100) < 0.85
    assert b.p_oom(100, 0) == 1.0 and b.p_oom(0, 100) == 0.0


def test_outcome_three_ways():
    b = band10()
    req = 10**10
    high, low = req * b.high, req * b.low
    assert eb.outcome(req, int(high) + 1, b)[0] == eb.FITS
    assert eb.outcome(req, int(high) - 1, b)[0] == eb.AT_RISK
    assert eb.outcome(req, int(low) + 1, b)[0] == eb.AT_RISK
    assert eb.outcome(req, int(low) - 1, b)[0] == eb.DOES_NOT_FIT
    verdict, p = eb.outcome(req, req, b)
    assert verdict == eb.AT_RISK and 0.80 < p < 0.85


def test_risk_band_falls_back_to_a_coarser_kind(monkeypatch):
    kinds = {"fsdp-eager-finetune": {"n": 9, "mean_log": 0.5, "sd_log": 0.5},
             "fsdp-eager": {"n": 12, "mean_log": 0.05, "sd_log": 0.1},
             "all": {"n": 30, "mean_log": 0.0, "sd_log": 0.2},
             "ddp": {"n": 10, "mean_log": -0.01, "sd_log": 0.05}}
    table = {"schema_version": eb.SCHEMA_VERSION,
             "memory": {"risk": {"coverage": 0.9, "kinds": kinds}}}
    monkeypatch.setattr(eb, "_table", lambda: table)
    b = eb.risk_band(Strategy.FULL_SHARD, CompileMode.NONE, finetune=True)
    assert (b.kind, b.measured_kind, b.n) == ("fsdp-eager-finetune", "fsdp-eager", 12)
    b = eb.risk_band(Strategy.DDP, CompileMode.BLOCKS)  # ddp-compiled-full, ddp-compiled: none
    assert (b.kind, b.measured_kind, b.n) == ("ddp-compiled-full", "ddp", 10)
    b = eb.risk_band(Strategy.ZERO3)
    assert (b.measured_kind, b.n) == ("all", 30)
    assert eb.risk_kinds(Strategy.ZERO2, CompileMode.MODEL, True) == (
        "zero-compiled-finetune", "zero-compiled", "zero", "all")


def test_estimate_verdict_with_a_band():
    """An estimate's fits / at risk / does not fit and its probability, from its band."""
    import dataclasses

    from planner.hardware import load_gpu
    from planner.memory import estimate
    from planner.presets import get_preset
    from planner.spec import Candidate, Checkpointing, Cluster, Offload, TrainingSpec

    e = estimate(get_preset("llama3-8b"), TrainingSpec(), Cluster(gpu=load_gpu("h100-80"),
                 n_gpus=8, gpus_per_node=8, host_ram_bytes_per_node=2**40),
                 Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                           checkpointing=Checkpointing.FULL), margin=0.0)
    b = band10()
    req = e.required_bytes
    at = lambda usable: dataclasses.replace(e, risk=b, usable_bytes=usable)  # noqa: E731
    assert at(int(req * b.high) + 1).outcome == eb.FITS
    x = at(req)
    assert x.outcome == eb.AT_RISK and not x.fits_gpu and x.may_fit_gpu
    assert 0.80 < x.oom_probability < 0.85
    assert x.required_high_bytes == -(-req * b.high // 1)
    assert at(int(req * b.low) - 1).outcome == eb.DOES_NOT_FIT
    no_band = dataclasses.replace(e, risk=None, usable_bytes=req)
    assert no_band.fits_gpu and no_band.oom_probability is None


# ---- the shipped file ------------------------------------------------------------------------


def shipped() -> dict:
    return json.loads(Path(eb.DATA_PATH).read_text())


def test_the_default_margin_is_none_and_the_risk_is_shipped():
    from planner.fields import BY_PATH
    from planner.memory import DEFAULT_MARGIN
    from planner.request import Options

    assert DEFAULT_MARGIN == 0.0 == eb.default_margin() == BY_PATH["margin"].default
    assert Options().margin == 0.0 and Options().at_risk == "warn" == BY_PATH["at_risk"].default
    risk = shipped()["memory"]["risk"]
    assert risk["coverage"] == eb.RISK_COVERAGE and risk["min_rows"] == eb.RISK_MIN_ROWS
    # every kind the planner can ask for resolves to a fitted band of at least 10 runs
    for s in Strategy:
        for c in CompileMode:
            for ft in (False, True):
                b = eb.risk_band(s, c, ft)
                assert b is not None and b.n >= eb.RISK_MIN_ROWS and b.low < 1 < b.high


def test_shipped_risk_meets_the_acceptance_on_the_held_out_half():
    """Issue 24's acceptance on the rows not fitted on: no out-of-memory run called "fits",
    at most 5 % of completed runs called "does not fit", and the interval does not under-cover
    (90 % coverage minus 5 points). Over-coverage is reported in docs/accuracy.md §5."""
    held = shipped()["memory"]["risk"]["held_out"]
    assert held["oom"] >= 1 and held["oom_fits"] == 0
    assert held["completed"] >= 20
    assert held["completed_does_not_fit"] <= 0.05 * held["completed"]
    assert held["measured"] >= 20 and held["coverage"] >= eb.RISK_COVERAGE - 0.05


def test_binomial_range_by_hand():
    """Binomial(10, 1/2): P(X <= 1) = 11/1024 = 1.1 % <= 2.5 % < P(X <= 2) = 56/1024 = 5.5 %,
    so 2 .. 8 by symmetry. Binomial(25, 0.9): P(X = 25) = 0.9^25 = 7.2 % > 2.5 %, so the top
    is 25; P(X <= 18) = 1.0 % <= 2.5 % < P(X <= 19) = 3.4 %, so the bottom is 19."""
    from benchmarks.memory_accuracy import binomial_range

    assert binomial_range(10, 0.5) == (2, 8)
    assert binomial_range(25, 0.9) == (19, 25)


def test_two_fold_coverage_meets_the_target():
    """Issue 24: the interval's stated coverage holds within +-5 points, read on two-fold
    cross-validation (each half checked by the other half's fit, every measured row once),
    and the count is inside what a calibrated interval gives 19 times in 20."""
    both = shipped()["memory"]["risk"]["two_fold"]
    assert both["measured"] >= 50
    assert abs(both["coverage"] - eb.RISK_COVERAGE) <= 0.05
    lo, hi = both["expected"]
    assert lo <= both["inside"] <= hi


def test_the_split_alternates_within_each_kind():
    from benchmarks.memory_accuracy import split

    def row(i, kind, oom=False, err=None):
        return {"row": {"id": i}, "kinds": (kind,), "oom": oom, "err": err, "unmodelled": ""}

    rows = [row("b", "k1", err=0.1), row("a", "k1", err=0.2), row("c", "k1", err=0.0),
            row("z", "k2", err=0.1), row("o1", "k1", oom=True), row("o2", "k1", oom=True),
            {**row("u", "k1", err=0.3), "unmodelled": "Float8"}]
    split(rows)
    halves = {r["row"]["id"]: r.get("half") for r in rows}
    # k1 measured in id order a, b, c -> fit, check, fit; k2's only row fit; OOM rows alike;
    # a row using what fitcheck does not model is in neither half
    assert halves == {"a": "fit", "b": "check", "c": "fit", "z": "fit", "o1": "fit",
                      "o2": "check", "u": None}


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
        extra = ["--accuracy-md", ""] if script.endswith("memory_accuracy.py") else []
        p = subprocess.run([sys.executable, script, "--md", str(tmp_path / "x.md"),
                            "--bands", str(out), *extra], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, check=False)
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
            if (row.get("unmodelled") or "").startswith(memory_accuracy.REFUSED):
                continue  # refused by name: test_refused_rows_stay_refused
            predict(row)


def test_refused_rows_stay_refused():
    """A row marked 'refused: ' is refused by the planner with NOT MODELLED; once its feature
    is modelled the benchmark must stop and say so, and a row refused without the mark stops
    it too (never silently dropped). torchtitan's 405B FSDP x CP x TP x PP rows were such rows
    until PP x CP was modelled: they are scored now, and the mark is checked on one of them
    made unmodelled again (the ZBV schedule, without TP: ZBV with context parallel stays NOT
    MODELLED)."""
    import csv

    from benchmarks.memory_accuracy import REFUSED, refused_rows
    from benchmarks.rowspec import RowError

    with open(ROOT / "benchmarks/memory_measurements.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    marked = [r for r in rows if r["unmodelled"].startswith(REFUSED)]
    keep, refused = refused_rows(rows)
    assert len(refused) == len(marked) and len(keep) == len(rows) - len(marked)
    assert all("NOT MODELLED" in r["reason"] for r in refused), refused
    row4d = next(r for r in rows if r["id"].startswith("tt-h100-llama3.1-405b-fsdp4-cp2"))
    assert not row4d["unmodelled"].startswith(REFUSED)  # planned and scored
    extra = json.loads(row4d["extra"])
    # without TP, and without the run's torch's kept stage outputs (refused under ZBV first)
    no_tp = {k: v for k, v in extra.items()
             if k not in ("parallel.tp", "parallel.pp_kept_outputs")}
    zbv = {**row4d, "unmodelled": REFUSED + "zbv",
           "extra": json.dumps({**no_tp, "parallel.pp_schedule": "zbv",
                                "parallel.pp_microbatches": 16})}
    keep, refused = refused_rows([zbv])
    assert keep == [] and len(refused) == 1
    assert "zbv with context parallel is NOT MODELLED" in refused[0]["reason"], refused
    # the same row as it is (PP x CP planned) with the mark: the mark must fail
    with pytest.raises(RowError, match="planner plans it"):
        refused_rows([{**row4d, "unmodelled": REFUSED + "pp x cp"}])
    # refused for a bad input (a schedule without PP), not NOT MODELLED: stops too
    bad = {k: v for k, v in no_tp.items() if k != "parallel.pp"}
    with pytest.raises(RowError, match="needs parallel.pp"):
        refused_rows([{**zbv, "extra": json.dumps(bad)}])
    # a refused row without the mark is an error, not a skip
    from benchmarks.memory_accuracy import evaluate

    unmarked = {**zbv, "unmodelled": "zbv"}
    keep, refused = refused_rows([unmarked])
    assert keep == [unmarked] and refused == []
    with pytest.raises(RowError, match="NOT MODELLED"):
        evaluate(keep)


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
    gpu = r.cluster.gpu
    assert doc["recommendation"]["error_band"] == eb.bands_json(rec.strategy, CompileMode.BLOCKS,
                                                                gpu)
    for c in doc["candidates"]:
        assert c["error_band"]["kind"] == eb.family(Strategy(c["strategy"]), CompileMode.BLOCKS)
    assert eb.bands_line(rec.strategy, CompileMode.BLOCKS, gpu) in table(answer, wide=True)


def test_gate_verdict_carries_the_band():
    from planner.gate import gate

    from planner.hardware import load_gpu

    v = gate({"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8}})
    # the H100's efficiency is measured (fitted on H100 rows, or the calibration): not widened
    assert v["error_band"] == eb.bands_json(Strategy(v["predicted"]["strategy"]),
                                            gpu=load_gpu("h100-80"))
    assert v["error_band"]["step_time"]["widened_by"] == 0
    v = gate({"model": {"preset": "llama3-8b"}, "hardware": {"gpu": "h100-80", "n": 8},
              "strategy": "ddp"})
    assert v["error_band"]["kind"] == "ddp-eager"


def _gpu_run_outcomes() -> tuple[list[str], list[str]]:
    """(outcome of every case that ran out of memory, of every case that completed) in
    benchmarks/gpu_runs/ (H200 and H100), with the shipped risk and the GPU's profile."""
    from planner.hardware import load_gpu
    from probes.gpu_records import read_runs, rows_of

    oom, done = [], []
    for folder, profile in (("2026-11-26-h200", "h200"), ("2026-11-26-h100", "h100-80")):
        records = read_runs(ROOT / "benchmarks" / "gpu_runs" / folder)
        for r in rows_of(records, "case", load_gpu(profile)):
            (done if r.rec["ok"] else oom).append(r.est().outcome)
    return oom, done


def test_the_gpu_runs_out_of_sample_with_the_shipped_risk():
    """benchmarks/gpu_runs/ is not in the CSV the risk is fitted on: of the cases that ran out
    of memory on the H200 and the H100 (9 when written; two are near misses: the planner needs
    81.6 and 83.5 GiB of the H100's 79.6) none is called "fits", and of the cases that
    completed (79 when written) none is called "does not fit" (docs/accuracy.md §5;
    `python benchmarks/memory_accuracy.py --gpu-runs` prints each)."""
    oom, done = _gpu_run_outcomes()
    assert len(oom) >= 9 and len(done) >= 79
    assert eb.FITS not in oom
    assert eb.DOES_NOT_FIT not in done


def test_an_moe_model_without_ep_under_the_default_allocator_has_its_interval_raised():
    """benchmarks/gpu_runs: HF-Mixtral-shaped runs without expert parallel reserved up to
    1.605 x what they allocated (w48 on the H200: 124.4 of 77.5 GiB) and w64 ran out of memory
    where 107 of 140 GiB was predicted; the interval's high end is raised to 1.61 for such
    plans (the need itself unchanged), not for dense models, EP or expandable segments."""
    import json as _json

    from tests.conftest import run

    def risk(*extra):
        out = run("--model", "mixtral-8x7b", "--gpu", "h200", "--n", "8", "--strategy",
                  "full_shard", "--checkpointing", "full", "--json", *extra)
        return _json.loads(out.stdout)["candidates"][0]["risk"]["band"]

    plain = risk()
    assert plain["high_factor"] == 1.61 and plain["high_floor"] == 1.61
    assert "without expert parallel" in plain["high_floor_reason"]
    # the fitted band alone is narrower (this kind's high end is under 1.3 as shipped)
    expandable = risk("--allocator", "expandable")
    assert "high_floor" not in expandable and expandable["high_factor"] < 1.3
    assert "high_floor" not in risk("--ep", "2")
    dense = _json.loads(run("--model", "llama3-8b", "--gpu", "h200", "--n", "8", "--strategy",
                            "full_shard", "--json").stdout)["candidates"][0]["risk"]["band"]
    assert "high_floor" not in dense


def test_the_plans_band_has_the_floor_for_moe_without_ep_on_the_default_allocator():
    """plan_risk_band, which the analytic, pipeline and trace-backed estimates all call (the
    trace-backed one once took risk_band alone, so a traced MoE plan missed the floor)."""
    from planner.spec import Allocator, TrainingSpec

    t = TrainingSpec()
    assert eb.plan_risk_band(t, Strategy.FULL_SHARD, True).high_floor == 1.61
    assert eb.plan_risk_band(t, Strategy.FULL_SHARD, False).high_floor == 1.0
    expandable = TrainingSpec(allocator=Allocator.EXPANDABLE)
    assert eb.plan_risk_band(expandable, Strategy.FULL_SHARD, True).high_floor == 1.0
