"""Predict every public measurement in throughput_measurements.csv and report the error.

    python benchmarks/throughput_accuracy.py [--csv PATH] [--md docs/throughput_accuracy.md]
                                             [--bands planner/data/error_bands.json]

Prints predicted vs measured tokens/s/GPU, the relative error per row and the median absolute
relative error, and writes the same table as Markdown. No per-row tuning: every row uses the
global defaults of ``planner.throughput`` (the calibrated ones are the per-GPU-family compute
efficiencies, eager and compiled: each profile's ``compute_efficiency`` and
``compiled_compute_efficiency``, fitted here on half the rows and scored on the other half); the
errors per kind of job go to the throughput section of planner/data/error_bands.json. The only
per-row inputs are the facts the
source states (model, GPUs, strategy, precision, seq, batch, checkpointing, network speed).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.rowspec import request_for, update_bands  # noqa: E402
from planner.error_bands import DATA_PATH, family, summarize  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate,
    CompileMode,
    GpuProfile,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
)
from planner.hardware import load_gpu as load_profile  # noqa: E402
from planner.throughput import (  # noqa: E402
    DEFAULT_ASSUMPTIONS,
    ThroughputAssumptions,
    default_compute_efficiency,
    estimate_step,
)

GIB = 2**30

# The embedded profiles (datasheet numbers, dense). Inter-node bandwidth is replaced per row by
# what the source states (column inter_node_gbit_per_gpu).
GPU_IDS = {"a100-sxm-80gb": "a100-80", "h100-sxm-80gb": "h100-80", "h200-sxm-141gb": "h200"}
GPUS: dict[str, GpuProfile] = {k: load_profile(v) for k, v in GPU_IDS.items()}


def _mpt(name: str, n_layers: int, d_model: int, n_heads: int, max_seq: int) -> ModelSpec:
    # llm-foundry MPT (scripts/train/yamls/pretrain/mpt-*.yaml): GELU MLP with expansion 4,
    # vocab 50368, tied embeddings, LayerNorm, no biases; the benchmark's NumParams grows with
    # seq by seq x d_model, i.e. learned positions of max_seq_len rows.
    return ModelSpec(
        name=name, n_layers=n_layers, hidden=d_model, n_heads=n_heads, n_kv_heads=n_heads,
        ffn_hidden=4 * d_model, vocab=50368, tied_embeddings=True, mlp=MlpKind.GELU,
        norm=NormKind.LAYERNORM, position=PositionKind.LEARNED, max_positions=max_seq,
    )  # fmt: skip


_MPT_SHAPES = {
    "mpt-760m": (24, 1536, 12),
    "mpt-1b": (24, 2048, 16),
    "mpt-3b": (32, 2560, 20),
    "mpt-7b": (32, 4096, 32),
    "mpt-13b": (40, 5120, 40),
    "mpt-30b": (48, 7168, 56),
    "mpt-70b": (80, 8192, 64),
}


def model_for(name: str, seq: int) -> ModelSpec:
    if name in _MPT_SHAPES:
        return _mpt(name, *_MPT_SHAPES[name], max_seq=seq)
    if name == "llama2-34b":
        # fms-fsdp fms_fsdp/utils/config_utils.py "llama2_34b": 48 x 8192, 64 heads, 8 kv heads,
        # ffn 22016, Llama-2 vocab 32000.
        return ModelSpec(
            name=name, n_layers=48, hidden=8192, n_heads=64, n_kv_heads=8, ffn_hidden=22016,
            vocab=32000,
        )
    try:
        from planner.presets import get_preset
    except ImportError:  # pragma: no cover - presets module not there yet
        raise SystemExit(f"no shape for {name}: planner.presets is missing") from None
    return get_preset(name)


def columns(row: dict[str, str], model: ModelSpec) -> dict[str, object]:
    """The row's columns as spec fields ({path: raw}); ``extra`` adds any other field. The
    model's shape is given explicitly (and replaced by ``model_for``'s exact spec below); an MoE
    model by its preset, so the request knows its experts (expert parallel needs them)."""
    shape = {"model.preset": model.name} if model.n_experts > 1 else {
        "model.layers": model.n_layers, "model.hidden": model.hidden,
        "model.heads": model.n_heads, "model.kv_heads": model.n_kv_heads,
        "model.ffn": model.ffn_hidden, "model.vocab": model.vocab, "model.mlp": str(model.mlp)}
    return {
        **shape,
        "hardware.gpu": GPU_IDS[row["gpu"]], "hardware.n": row["n_gpus"],
        "hardware.gpus_per_node": row["gpus_per_node"], "strategy": row["strategy"],
        "offload": "none", "checkpointing": row["checkpointing"],
        "training.seq": row["seq"], "training.micro_batch": row["micro_batch"],
        "training.grad_accum": row["grad_accum"], "training.precision": row["precision"],
    }


def predict(row: dict[str, str], assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS):
    return predict_request(row, assumptions)[1]


def predict_request(row: dict[str, str],
                    assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS):
    """The row's request and its step estimate (network speed as the source states it)."""
    from dataclasses import replace

    seq = int(row["seq"])
    model = model_for(row["model"], seq)
    req = request_for(row, columns(row, model))
    gbit = float(row["inter_node_gbit_per_gpu"])
    gpu = replace(GPUS[row["gpu"]], inter_node_bandwidth_bytes_per_s=gbit * 1e9 / 8)
    cluster = replace(req.cluster, gpu=gpu)
    cand = Candidate(strategy=req.options.strategies[0], offload=req.options.offloads[0],
                     checkpointing=req.options.checkpointing, tp=req.options.tp or 1)
    return req, estimate_step(model, req.training, cluster, cand, assumptions)


FAMILY = {"a100-sxm-80gb": "A100", "h100-sxm-80gb": "H100"}
"""GPU family of each row's GPU: the profiles' compute efficiencies are fitted per family."""
EFF_GRID = [round(0.20 + 0.005 * i, 3) for i in range(141)]  # 0.200 .. 0.900


def mode_of(row: dict[str, str]) -> str:
    return "compiled" if predict_request(row)[0].training.compile != "none" else "eager"


def fits_efficiency(row: dict[str, str]) -> bool:
    """Rows the compute efficiency is fitted on: full training without tensor parallelism or full
    activation checkpointing, whose step time is the model's FLOPs at the achieved rate
    (fine-tuning changes the FLOPs counted, TP adds its own collectives, PP/CP/EP their
    bubble, ring or all-to-alls: all modelled separately and only scored)."""
    req = predict_request(row)[0]
    # float8 rows are scored, never fitted: their speed-up is the fp8 peak at the bf16
    # efficiency (planner/float8.py), and this comparison is its check
    # pipeline, context and expert parallel rows are scored, never fitted either: their step
    # adds the bubble, the ring's or the all-to-alls' time, each modelled on its own
    # full activation checkpointing rows are scored, never fitted: what the recompute costs is
    # an open question (docs/throughput.md "Known biases": those rows run 10-20 % faster than
    # the FLOPs the model counts, at the same rate), and a rate fitted on them would carry that
    # gap into every plan without checkpointing (on the 73 rows of 2026-11-26 the A100 eager
    # rows alone want 0.605 without full checkpointing and 0.68 with it)
    t = req.training
    return t.finetune.full and (req.options.tp or 1) == 1 and t.float8.value == "none" \
        and not t.pipeline.enabled and t.cp == 1 and t.ep == 1 \
        and req.options.checkpointing.value != "full"


def halves(rows: list[dict[str, str]]) -> tuple[list[dict], list[dict]]:
    """Split each (GPU family, eager/compiled) group of the rows the efficiency is fitted on,
    sorted by id, alternately into a fit half and a score half (the first row of each group goes
    to the fit half)."""
    fit, score = [], []
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in sorted((r for r in rows if fits_efficiency(r)), key=lambda r: r["id"]):
        groups.setdefault((FAMILY[row["gpu"]], mode_of(row)), []).append(row)
    for group in groups.values():
        fit += group[0::2]
        score += group[1::2]
    return fit, score


def rel_errors(rows: list[dict[str, str]], eff: float | None = None) -> list[float]:
    a = DEFAULT_ASSUMPTIONS if eff is None else ThroughputAssumptions(compute_efficiency=eff)
    out = []
    for row in rows:
        measured = float(row["measured_tokens_per_s_per_gpu"])
        out.append((predict(row, a).tokens_per_s_per_gpu - measured) / measured)
    return out


def fit_efficiency(rows: list[dict[str, str]]) -> float:
    """The grid value whose median signed error of tokens/s over ``rows`` is closest to 0 (the
    smallest such value on a tie): unbiased on the fit rows, robust to a few outliers."""
    return min(EFF_GRID, key=lambda e: (abs(statistics.median(rel_errors(rows, e))), e))


def med(rows: list[dict[str, str]], eff: float | None) -> float | None:
    """Median |error| of ``rows`` at efficiency ``eff`` (None: no rows)."""
    return statistics.median(abs(x) for x in rel_errors(rows, eff)) if rows else None


def fit_report(rows: list[dict[str, str]]) -> list[dict]:
    """Per (family, mode): the efficiency fitted on the fit half, and the median |error| it gives
    on the fit half (in sample) and on the score half (held out); and the reverse split."""
    fit, score = halves(rows)
    out = []
    for fam in sorted(set(FAMILY.values())):
        for mode in ("eager", "compiled"):
            a = [r for r in fit if FAMILY[r["gpu"]] == fam and mode_of(r) == mode]
            b = [r for r in score if FAMILY[r["gpu"]] == fam and mode_of(r) == mode]
            if not a:
                continue
            e_a = fit_efficiency(a)
            e_b = fit_efficiency(b) if b else None
            out.append(dict(family=fam, mode=mode, n_fit=len(a), n_score=len(b), eff=e_a,
                            fit_err=med(a, e_a), score_err=med(b, e_a),
                            eff_reverse=e_b, reverse_score_err=med(a, e_b) if e_b else None,
                            fit_ids=[r["id"] for r in a], score_ids=[r["id"] for r in b]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "throughput_measurements.csv"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "throughput_accuracy.md"))
    ap.add_argument("--bands", default=DATA_PATH,
                    help="error_bands.json to update (its throughput section); '' to skip")
    args = ap.parse_args(argv)

    rows = list(csv.DictReader(open(args.csv, newline="")))
    results = []
    for row in rows:
        req, est = predict_request(row)
        measured = float(row["measured_tokens_per_s_per_gpu"])
        err = (est.tokens_per_s_per_gpu - measured) / measured
        fam = family(req.options.strategies[0], req.training.compile)
        if req.training.float8.value != "none":  # a band of its own: the plan never reads it
            fam += "-float8"                      # for a bf16 job (docs/model.md "Float8")
        if req.training.ep > 1:  # likewise expert parallel: its own band, never read for a
            fam += "-ep"         # job without --ep (docs/model.md §8.8)
        results.append((row, est, measured, err, fam))

    head = (f"{'id':28} {'gpu':14} {'n':>4} {'strategy':13} {'ckpt':9} {'kind':13} {'meas tok/s':>10}"
            f" {'pred tok/s':>10} {'err':>7} {'meas MFU':>8} {'pred MFU':>8} {'exp.comm':>8}")  # fmt: skip
    print(head)
    print("-" * len(head))
    for row, est, measured, err, fam in results:
        mfu = row["reported_mfu"]
        mfu_s = f"{float(mfu):8.1%}" if mfu else f"{'-':>8}"
        print(f"{row['id']:28} {row['gpu']:14} {row['n_gpus']:>4} {row['strategy']:13}"
              f" {row['checkpointing']:9} {fam:13} {measured:10.0f} {est.tokens_per_s_per_gpu:10.0f}"
              f" {err:+7.1%} {mfu_s} {est.mfu:8.1%}"
              f" {est.exposed_comm_s / est.step_time_s:8.1%}")  # fmt: skip
    errs = [r[3] for r in results]
    abs_errs = [abs(e) for e in errs]
    median = statistics.median(abs_errs)
    signed = statistics.median(errs)
    p90 = summarize(errs)["p90_abs"]
    print(f"\nrows: {len(results)}  median |error|: {median:.1%}  p90 |error|: {p90:.1%}  "
          f"median signed error: {signed:+.1%}  max |error|: {max(abs_errs):.1%}")  # fmt: skip
    effs = {g: (default_compute_efficiency(p), default_compute_efficiency(p, CompileMode.BLOCKS))
            for g, p in GPUS.items()}
    print("compute efficiency defaults used (eager, compiled): "
          + ", ".join(f"{g} {e:.3f}, {c:.3f}" for g, (e, c) in effs.items()))
    fams = {name: summarize([r[3] for r in results if r[4] == name])
            for name in sorted({r[4] for r in results})}
    for name, b in fams.items():
        print(f"  {name:15} n={b['n']:3}  median |err| {b['median_abs']:6.1%}  p90 {b['p90_abs']:6.1%}"
              f"  signed {b['median_signed']:+7.1%}")
    fits = fit_report(rows)
    print("efficiency fit (fit half -> score half; reverse split):")
    for f in fits:
        print(f"  {f['family']} {f['mode']:8} fit n={f['n_fit']} eff {f['eff']:.3f}: median |err| "
              f"fit {f['fit_err']:.1%}, score n={f['n_score']} "
              + (f"{f['score_err']:.1%}" if f["score_err"] is not None else "-")
              + (f"; reverse eff {f['eff_reverse']:.3f} scores {f['reverse_score_err']:.1%}"
                 if f["eff_reverse"] is not None else ""))

    lines = [
        "# Throughput model accuracy",
        "",
        "Generated by `python benchmarks/throughput_accuracy.py` from",
        "`benchmarks/throughput_measurements.csv` (public measurements; sources and quotes are in",
        "the CSV). Prediction: `planner.throughput.estimate_step` with global defaults only.",
        "Error = (predicted - measured) / measured tokens/s/GPU. Inputs beyond the columns",
        "(torch.compile, the loss, FSDP1/2) are spec fields in the CSV's `extra` column.",
        "",
        f"**{len(results)} rows, median |error| {median:.1%}, p90 |error| {p90:.1%}, median signed"
        f" error {signed:+.1%}, max |error| {max(abs_errs):.1%}.**",
        "",
        "| id | model | GPU | GPUs | strategy | precision | seq | mb x ga | ckpt | kind"
        " | measured tok/s/GPU | predicted | error | reported MFU | predicted MFU |",
        "|---|---|---|---:|---|---|---:|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row, est, measured, err, fam in results:
        mfu = f"{float(row['reported_mfu']):.1%}" if row["reported_mfu"] else "-"
        lines.append(
            f"| {row['id']} | {row['model']} | {row['gpu']} | {row['n_gpus']} | {row['strategy']}"
            f" | {row['precision']} | {row['seq']} | {row['micro_batch']} x {row['grad_accum']}"
            f" | {row['checkpointing']} | {fam} | {measured:.0f} | {est.tokens_per_s_per_gpu:.0f}"
            f" | {err:+.1%} | {mfu} | {est.mfu:.1%} |"
        )
    lines += [
        "",
        "## Per kind of job",
        "",
        "What `fitcheck` prints as the step-time band of a verdict (`planner/data/error_bands.json`).",
        "",
        "| kind of job | rows | median abs. error | p90 abs. error | median signed |",
        "|---|---:|---:|---:|---:|",
        *[f"| {name} | {b['n']} | {b['median_abs']:.1%} | {b['p90_abs']:.1%} | "
          f"{b['median_signed']:+.1%} |" for name, b in fams.items()],
        "",
        "## Compute efficiency: eager and compiled, fitted on half the rows",
        "",
        "The only calibrated constants are each GPU family's compute efficiencies (achieved /",
        "dense peak), eager and under torch.compile (`compute_efficiency` and",
        "`compiled_compute_efficiency` in hardware_profiles/*.toml). Each (family, eager/compiled)",
        "group of full-training rows without tensor parallelism (fine-tuning changes the FLOPs",
        "counted and TP adds collectives; those rows are scored, not fitted on) is sorted by id",
        "and split alternately into a fit half and a score half; the value",
        "is the one (grid step 0.005) whose median signed error on the fit half is closest to 0",
        "(the smallest on a tie), and it is scored on the other half. The reverse split (fit on the",
        "score half, score on the fit half) shows how much the value depends on the split. The",
        "profiles carry the fit-half values; the table above is scored with them.",
        "",
        "| GPU family | mode | fit rows | efficiency | median abs. error, fit half | score rows |"
        " median abs. error, score half | reverse: efficiency | reverse: median abs. error |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *[f"| {f['family']} | {f['mode']} | {f['n_fit']} | {f['eff']:.3f} | {f['fit_err']:.1%} | "
          f"{f['n_score']} | " + (f"{f['score_err']:.1%}" if f["score_err"] is not None else "-")
          + " | " + (f"{f['eff_reverse']:.3f} | {f['reverse_score_err']:.1%}"
                     if f["eff_reverse"] is not None else "- | -") + " |" for f in fits],
        "",
        "Fit half: " + "; ".join(f"{f['family']} {f['mode']}: {', '.join(f['fit_ids'])}"
                                 for f in fits) + ".",
        "",
        "Compute-efficiency defaults scored (eager, compiled): "
        + ", ".join(f"{g}: {e:.3f}, {c:.3f}" for g, (e, c) in effs.items())
        + ". All other constants are the documented defaults of `ThroughputAssumptions`.",
        "",
    ]
    md = Path(args.md)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text("\n".join(lines))
    print(f"wrote {md}")
    if args.bands:
        update_bands(args.bands, "throughput", {
            "source": "benchmarks/throughput_measurements.csv",
            "metric": "relative error of tokens/s per GPU: (predicted - measured) / measured",
            "all": summarize(errs),
            "families": fams,
            "compute_efficiency_fit": [{k: (round(v, 4) if isinstance(v, float) else v)
                                        for k, v in f.items() if not k.endswith("_ids")}
                                       for f in fits],
        })
        print(f"wrote {args.bands} (throughput)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
