"""`fitcheck report`: the CSV is the planner's numbers, the outputs are complete and atomic,
bad inputs are one-line errors (docs/reports.md)."""

from __future__ import annotations

import io
import os
import re
import sys

import pytest
from click.testing import CliRunner

pd = pytest.importorskip("pandas")

from planner import report as R  # noqa: E402
from planner.cli import cli  # noqa: E402
from planner.inputs import resolve_cluster, resolve_gpu  # noqa: E402
from planner.memory import estimate  # noqa: E402
from planner.plan import Question, min_gpus, plan  # noqa: E402
from planner.presets import get_preset  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate, Checkpointing, Offload, Precision, Strategy, TrainingSpec,
)
from planner.throughput import estimate_step  # noqa: E402

MODELS = "llama3-8b,llama3-70b"
GPUS = "h100-80,mi300x"
NS = "1,8,16,64"


def run(*args: str):
    return CliRunner().invoke(cli, ["report", *args])


def one_line_error(result, *needles: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """One CSV + Markdown report, shared by the table tests."""
    out = tmp_path_factory.mktemp("report")
    r = run("--models", MODELS, "--gpus", GPUS, "--n", NS, "--seq", "2048,4096",
            "--price-per-gpu-hour", "h100-80=2.5,mi300x=2", "--tokens", "2T", "--out", str(out),
            "--format", "csv,md")
    assert r.exit_code == 0, r.output
    return out, pd.read_csv(out / "report.csv")


def _cluster(gpu: str, n: int):
    return resolve_cluster(resolve_gpu(gpu), n, None, None)


def test_csv_has_every_column_and_configuration(tables):
    _, df = tables
    assert list(df.columns) == list(R.COLUMNS)
    # 2 models x 2 GPUs x 4 counts x 2 seqs; at n=1 only ddp and zero1/2/3 exist
    assert set(df.n) == {1, 8, 16, 64} and set(df.seq) == {2048, 4096}
    assert set(df.checkpointing) == {"none", "selective", "full"}
    no_off = df[df.offload == "none"]
    assert len(no_off) == 2 * 2 * 2 * (3 * 8 * 3 + 4 * 3)
    assert not df.duplicated(["model", "gpu", "n", "seq", "micro_batch", "strategy",
                              "checkpointing", "offload"]).any()


def test_csv_numbers_are_the_planners(tables):
    _, df = tables
    sample = df.iloc[:: max(1, len(df) // 25)]
    assert len(sample) >= 20
    for r in sample.itertuples(index=False):
        model = get_preset(r.model)
        training = TrainingSpec(seq=int(r.seq), micro_batch=int(r.micro_batch),
                                precision=Precision(r.precision))
        cluster = _cluster(r.gpu, int(r.n))
        cand = Candidate(strategy=Strategy(r.strategy), offload=Offload(r.offload),
                         checkpointing=Checkpointing(r.checkpointing))
        e = estimate(model, training, cluster, cand, margin=0.05)
        assert r.device_used_bytes == e.device_used_bytes
        assert r.peak_allocated_bytes == e.peak_allocated_bytes
        assert r.capacity_bytes == e.capacity_bytes
        assert bool(r.fits) == e.fits
        st = estimate_step(model, training, cluster, cand)
        assert r.step_time_s == pytest.approx(st.step_time_s, rel=1e-12)
        assert r.tokens_per_s_per_gpu == pytest.approx(st.tokens_per_s_per_gpu, rel=1e-12)
        assert r.mfu == pytest.approx(st.mfu, rel=1e-12)
        hours = 2e12 / (st.tokens_per_s_per_gpu * r.n) / 3600
        price = 2.5 if r.gpu == "h100-80" else 2.0
        assert r.cost_usd == pytest.approx(hours * r.n * price, rel=1e-9)


def test_best_flag_is_the_planners_recommendation(tables):
    _, df = tables
    for (m, g, n, seq), grp in df.groupby(["model", "gpu", "n", "seq"]):
        answer = plan(Question(model=get_preset(m), training=TrainingSpec(seq=int(seq)),
                               cluster=_cluster(g, int(n))))
        best = grp[grp.best]
        if answer.recommendation is None:
            assert best.empty, (m, g, n, seq)
            continue
        assert len(best) == 1, (m, g, n, seq)
        c = answer.recommendation.candidate
        row = best.iloc[0]
        assert (row.strategy, row.checkpointing, row.offload) == (
            str(c.strategy), str(c.checkpointing), str(c.offload)), (m, g, n, seq)


def test_min_gpus_match_the_planner():
    req = R.build_request(models="llama3-8b,llama3-70b,llama3.1-405b", gpus="h100-80,a100-40",
                          ns="8")
    rep = R.run_sweep(req)
    mins = rep.min_gpus
    assert len(mins) == 6
    for r in mins.itertuples(index=False):
        model, training = get_preset(r.model), TrainingSpec()
        q = Question(model=model, training=training, cluster=_cluster(r.gpu, 8))
        # with offload: exactly `fitcheck --find min-gpus`
        assert r.min_gpus_offload == min_gpus(q)
        # without offload: something fits at the count, nothing at the count below
        n = int(r.min_gpus)
        gpn = resolve_gpu(r.gpu).gpus_per_node
        below = n - 1 if n <= gpn else n - gpn

        def fits(k: int) -> bool:
            cl = _cluster(r.gpu, k)
            return any(estimate(model, training, cl, Candidate(strategy=s, checkpointing=ck)).fits
                       for s in Strategy for ck in (Checkpointing.NONE, Checkpointing.SELECTIVE,
                                                    Checkpointing.FULL)
                       if k > 1 or s is Strategy.DDP or s.is_zero)

        assert fits(n), (r.model, r.gpu, n)
        if below >= 1:
            assert not fits(below), (r.model, r.gpu, below)


def test_markdown_has_min_gpu_and_throughput_tables(tables):
    out, _ = tables
    md = (out / "report.md").read_text()
    assert "## Minimum GPUs per model and GPU type" in md
    header = next(line for line in md.splitlines() if line.startswith("| model"))
    assert "h100-80" in header and "mi300x" in header
    rows = [line for line in md.splitlines() if line.startswith("| llama3-70b ")]
    assert rows and re.search(r"\| \d+: \w+", rows[0]), rows
    assert "### llama3-8b" in md and "tokens/s/GPU" in md and "cost $" in md
    assert "days for 2T tokens" in md


def test_no_temp_files_left(tables):
    out, _ = tables
    assert sorted(os.listdir(out)) == ["report.csv", "report.md"]


def test_write_atomic_keeps_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "report.csv"
    R.write_atomic(str(target), "old")
    assert target.read_text() == "old"

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(R.os, "replace", boom)
    with pytest.raises(OSError):
        R.write_atomic(str(target), "new")
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["report.csv"]


def test_html_is_self_contained_with_one_plot_per_kind(tmp_path):
    pytest.importorskip("matplotlib")
    r = run("--models", "llama3-8b,llama3-70b", "--gpus", "h100-80,a100-80", "--n", "8,16,32",
            "--strategy", "ddp,full_shard,zero3", "--price-per-gpu-hour", "2.5,1.8",
            "--out", str(tmp_path), "--format", "html,png,svg")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "report.html").read_text()
    assert page.count('<img src="data:image/png;base64,') == len(R.PLOT_KINDS)
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", page), "external asset"
    assert "<script" not in page and "<link" not in page
    assert "Minimum GPUs" in page and "<table" in page
    for kind in R.PLOT_KINDS:
        assert (tmp_path / f"{kind}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "<svg" in (tmp_path / f"{kind}.svg").read_text()
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_unknown_model_and_gpu_are_one_line_errors(tmp_path):
    one_line_error(run("--models", "llama3-8b,llama9-1b", "--gpus", "h100-80", "--out",
                       str(tmp_path), "--format", "csv"), "--models", "llama9-1b")
    one_line_error(run("--models", "llama3-8b", "--gpus", "h100-8", "--out", str(tmp_path),
                       "--format", "csv"), "--gpus", "h100-8")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag,value,needle", [
    ("--n", "8,x", "--n"), ("--n", "0", "--n"), ("--seq", "-1", "--seq"),
    ("--format", "csv,pdf", "--format"), ("--strategy", "zero4", "--strategy"),
    ("--checkpointing", "auto", "--checkpointing"), ("--tokens", "lots", "--tokens"),
    ("--price-per-gpu-hour", "1,2,3", "--price-per-gpu-hour"),
    ("--price-per-gpu-hour", "b200=3", "--price-per-gpu-hour"),
])
def test_bad_values_are_one_line_errors(tmp_path, flag, value, needle):
    args = {"--models": "llama3-8b", "--gpus": "h100-80", "--out": str(tmp_path),
            "--format": "csv"}
    args[flag] = value
    one_line_error(run(*[x for kv in args.items() for x in kv]), needle)


def test_missing_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    err = one_line_error(run("--models", "llama3-8b", "--gpus", "h100-80", "--n", "8",
                             "--out", str(tmp_path), "--format", "csv,md,png"))
    assert "plots need matplotlib: pip install 'fitcheck[plots]'" in err
    assert os.listdir(tmp_path) == []
    r = run("--models", "llama3-8b", "--gpus", "h100-80", "--n", "8", "--out", str(tmp_path),
            "--format", "csv,md")
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path)) == ["report.csv", "report.md"]


def test_missing_pandas(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    err = one_line_error(run("--models", "llama3-8b", "--gpus", "h100-80", "--out",
                             str(tmp_path), "--format", "csv"))
    assert "pip install 'fitcheck[reports]'" in err


def test_progress_bar_only_when_asked(tmp_path):
    buf = io.StringIO()
    bar = R.Progress(3, "x", enabled=True, stream=buf)
    for _ in range(3):
        bar.update()
    bar.close()
    assert "100%" in buf.getvalue() and "3/3" in buf.getvalue()
    quiet = io.StringIO()
    R.Progress(3, "x", enabled=False, stream=quiet).update()
    assert quiet.getvalue() == ""
    assert R.progress_wanted(None, io.StringIO()) is False  # not a terminal
    base = ["--models", "llama3-8b", "--gpus", "h100-80", "--n", "8", "--format", "csv"]
    r = run(*base, "--out", str(tmp_path / "a"))
    assert r.exit_code == 0 and "[" not in r.stderr
    r = run(*base, "--out", str(tmp_path / "b"), "--progress")
    assert r.exit_code == 0 and "100%" in r.stderr


def test_gpu_counts_that_are_not_whole_nodes_are_skipped_with_a_note(tmp_path):
    r = run("--models", "llama3-8b", "--gpus", "h100-80", "--n", "4,12,16", "--out",
            str(tmp_path), "--format", "csv")
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "report.csv")
    assert set(df.n) == {4, 16}
    assert "n = 12" in r.stderr


def test_prices():
    assert R.parse_prices("2", ["a", "b"]) == {"a": 2.0, "b": 2.0}
    assert R.parse_prices("2,3", ["a", "b"]) == {"a": 2.0, "b": 3.0}
    assert R.parse_prices("b=3", ["a", "b"]) == {"b": 3.0}
    assert R.parse_prices(None, ["a"]) is None
