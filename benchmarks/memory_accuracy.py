"""Score the memory planner on published peak-memory measurements of real training runs.

    python benchmarks/memory_accuracy.py [--csv PATH] [--md docs/memory_accuracy.md]
                                         [--bands planner/data/error_bands.json]

Every row of ``memory_measurements.csv`` is one run a public source reports (quote and URL in
the row). For each, the planner's estimate (the one ``planner.plan`` makes, default overheads, no
calibration) is compared with the figure the source actually measured:

    metric max_allocated  <->  Estimate.peak_allocated_bytes   (torch.cuda.max_memory_allocated)
    metric max_reserved   <->  Estimate.peak_reserved_bytes    (torch.cuda.max_memory_reserved)
    metric nvidia_smi     <->  Estimate.device_used_bytes      (whole device: + context + NCCL)

Rows with ``oom=true`` are runs the source reports as out of memory: the planner must not say
they fit (their value, when given, is the allocation at the failure: a lower bound of the need).
Rows with no value are fit/OOM checks only. ``capacity_bytes`` / ``context_bytes``, when given,
replace the profile's device capacity / CUDA context with what the source itself reports for its
card (an OOM message's "total capacity", a measured context). Any other input is a spec field in
the ``extra`` column (benchmarks/rowspec.py). No per-row tuning: the only per-row inputs are the
facts the source states. The printed table and the Markdown file carry the same numbers.

The errors are summarized per kind of job (``planner.error_bands.family``: DDP / FSDP / ZeRO,
eager or compiled) into the ``memory`` section of ``planner/data/error_bands.json``, with the
default margin they imply (``planner.error_bands.margin_from``); the fit verdicts here use that
margin, so the file and the table agree in one run.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.rowspec import request_for, update_bands  # noqa: E402
from planner.error_bands import DATA_PATH, MIN_ROWS, family, margin_from, summarize  # noqa: E402
from planner.memory import DEFAULT_MARGIN, Estimate  # noqa: E402
from planner.plan import _estimate as plan_estimate  # noqa: E402  (the estimate plan() makes)
from planner.request import Request  # noqa: E402
from planner.spec import Candidate  # noqa: E402

GIB = 2**30
MARGIN = DEFAULT_MARGIN  # the CLI's default --margin (recomputed from the errors in main)
PREDICTED = {
    "max_allocated": lambda e: e.peak_allocated_bytes,
    "max_reserved": lambda e: e.peak_reserved_bytes,
    "nvidia_smi": lambda e: e.device_used_bytes,
}


def columns(row: dict[str, str], margin: float = MARGIN) -> dict[str, object]:
    """The row's columns as spec fields ({path: raw}); ``extra`` adds any other field. An
    empty ``model`` means the shape is stated in ``extra`` (model.layers, model.hidden, ...)."""
    return {
        **({"model.preset": row["model"]} if row["model"].strip() else {}),
        "hardware.gpu": row["gpu"],
        "hardware.n": row["n_gpus"], "hardware.gpus_per_node": row["gpus_per_node"],
        "strategy": row["strategy"], "offload": row["offload"],
        "checkpointing": row["checkpointing"], "margin": margin,
        "training.seq": row["seq"], "training.micro_batch": row["micro_batch"],
        "training.grad_accum": row["grad_accum"] or 1, "training.precision": row["precision"],
        "training.optimizer": row["optimizer"],
        "training.optimizer_impl": row["optimizer_impl"] or "foreach",
        "training.attention": row["attention"] or "sdpa",
    }


def predict(row: dict[str, str], margin: float = MARGIN) -> Estimate:
    return predict_request(row, margin)[1]


def predict_request(row: dict[str, str], margin: float = MARGIN) -> tuple[Request, Estimate]:
    """The row's request (capacity and context as the source states them) and its estimate."""
    req = request_for(row, columns(row, margin))
    gpu = req.cluster.gpu
    if row.get("capacity_bytes"):
        # The source states the device's total capacity (e.g. in its OOM message) and no profile
        # matches the card exactly: use the stated capacity for the fit verdict.
        gpu = dataclasses.replace(gpu, memory_bytes=int(row["capacity_bytes"]))
    if row.get("context_bytes"):
        # The source measured the CUDA context on its own machine (e.g. nvidia-smi after a 1x1
        # tensor): use it instead of the profile's lazy-loading assumption.
        gpu = dataclasses.replace(gpu, cuda_context_bytes=int(row["context_bytes"]))
    req = dataclasses.replace(req, cluster=dataclasses.replace(req.cluster, gpu=gpu))
    cand = Candidate(strategy=req.options.strategies[0], offload=req.options.offloads[0],
                     checkpointing=req.options.checkpointing, tp=req.options.tp or 1)
    return req, plan_estimate(req, cand)


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f}"


def evaluate(rows: list[dict[str, str]], margin: float = MARGIN) -> list[dict]:
    out = []
    for row in rows:
        req, est = predict_request(row, margin)
        oom = row["oom"].strip().lower() == "true"
        metric = row["metric"].strip()
        measured = int(row["value_bytes"]) if row["value_bytes"].strip() else None
        predicted = PREDICTED[metric](est) if metric else None
        err = None
        if measured is not None and predicted is not None and not oom:
            err = (predicted - measured) / measured
        out.append(dict(row=row, est=est, oom=oom, metric=metric, measured=measured,
                        predicted=predicted, err=err,
                        family=family(est.candidate.strategy, req.training.compile),
                        unmodelled=(row.get("unmodelled") or "").strip()))
    return out


def modelled(results: list[dict]) -> list[dict]:
    """The rows whose every input fitcheck models: the bands and the margin are fitted on these.
    A row whose run used something fitcheck does not model (the CSV's ``unmodelled`` column
    names it: Float8, activation offloading, an old bitsandbytes) is scored and shown, but an
    error it causes is the missing feature's, not the model's; a job that uses it is warned
    about (NOT MODELLED) instead."""
    return [r for r in results if not r["unmodelled"]]


def bands(results: list[dict], margin: float) -> dict:
    """The memory section of error_bands.json: all modelled rows, each family, the margin."""
    results = modelled(results)
    errs = [r["err"] for r in results if r["err"] is not None]
    fams: dict[str, dict] = {}
    for name in sorted({r["family"] for r in results}):
        mine = [r for r in results if r["family"] == name]
        es = [r["err"] for r in mine if r["err"] is not None]
        fams[name] = {**(summarize(es) if es else {"n": 0}),
                      "oom_rows": sum(r["oom"] for r in mine),
                      "oom_predicted_fit": sum(r["oom"] and r["est"].fits_gpu for r in mine)}
    return {
        "source": "benchmarks/memory_measurements.csv",
        "metric": "relative error of the peak the source measured (max allocated, max reserved "
                  "or nvidia-smi used): (predicted - measured) / measured",
        "all": {**summarize(errs), "oom_rows": sum(r["oom"] for r in results),
                "oom_predicted_fit": sum(r["oom"] and r["est"].fits_gpu for r in results)},
        "families": fams,
        "margin": {"value": margin, "rule": "nearest-rank p90 of the under-predictions "
                   "max(0, -error) over all measured rows whose inputs are modelled, rounded up to a "
                   "whole percent "
                   "(planner.error_bands.margin_from)"},
    }


def config_label(row: dict[str, str]) -> str:
    parts = [f"{row['n_gpus']}x{row['gpu']}", row["strategy"]]
    if row["offload"] != "none":
        parts.append(f"offload={row['offload']}")
    parts.append(f"ac={row['checkpointing']}")
    parts.append(row["precision"])
    parts.append(row["optimizer"])
    parts.append(f"s{row['seq']}xb{row['micro_batch']}")
    return " ".join(parts)


def report(results: list[dict], csv_path: str, margin: float = MARGIN) -> tuple[str, str]:
    """(plain text, markdown)."""
    txt: list[str] = []
    md: list[str] = []
    head = (f"{'id':44} {'metric':13} {'meas GiB':>9} {'pred GiB':>9} {'err':>8} "
            f"{'pred used':>9} {'usable':>7} {'fits':>5} {'oom':>4} {'peak at':>9}")
    txt += [head, "-" * len(head)]
    md += ["| id | model | config | metric | measured GiB | predicted GiB | rel. error | "
           "predicted device used GiB | usable GiB | planner: fits | source: OOM | peak phase |",
           "|---|---|---|---|---:|---:|---:|---:|---:|:-:|:-:|---|"]
    for r in results:
        row, est = r["row"], r["est"]
        err = "-" if r["err"] is None else f"{r['err']:+.1%}" + ("†" if r["unmodelled"] else "")
        meas = _gib(r["measured"]) + ("*" if r["oom"] and r["measured"] is not None else "")
        fits = "yes" if est.fits_gpu else "no"
        txt.append(f"{row['id']:44} {r['metric'] or '-':13} {meas:>9} {_gib(r['predicted']):>9} "
                   f"{err:>8} {_gib(est.device_used_bytes):>9} {_gib(est.usable_bytes):>7} "
                   f"{fits:>5} {'yes' if r['oom'] else 'no':>4} {est.peak_phase:>9}")
        md.append(f"| {row['id']} | {row['model']} | {config_label(row)} | {r['metric'] or '-'} | "
                  f"{meas} | {_gib(r['predicted'])} | {err} | {_gib(est.device_used_bytes)} | "
                  f"{_gib(est.usable_bytes)} | {fits} | {'yes' if r['oom'] else 'no'} | "
                  f"{est.peak_phase} |")

    every = results
    results = modelled(results)
    errs = [r["err"] for r in results if r["err"] is not None]
    med = statistics.median(abs(e) for e in errs) if errs else float("nan")
    signed = statistics.median(errs) if errs else float("nan")
    band = summarize(errs) if errs else None
    by_metric: dict[str, list[float]] = {}
    for r in results:
        if r["err"] is not None:
            by_metric.setdefault(r["metric"], []).append(r["err"])
    oom_fits = [r for r in every if r["oom"] and r["est"].fits_gpu]  # every row: never
    oom_below = [r for r in results if r["oom"] and r["measured"] is not None
                 and r["predicted"] is not None and r["predicted"] < r["measured"]]
    ok_nofit = [r for r in results if not r["oom"] and not r["est"].fits_gpu]

    summary = [
        f"rows: {len(results)} ({len(errs)} with a measured value, "
        f"{sum(r['oom'] for r in results)} reported OOM, "
        f"{sum(1 for r in results if not r['oom'] and r['measured'] is None)} fit-only)",
        f"median absolute relative error: {med:.1%} (median signed error {signed:+.1%}; "
        "positive = planner predicts more than measured)",
        f"p90 absolute relative error: {band['p90_abs']:.1%}; p90 under-prediction "
        f"{band['p90_under']:.1%} (largest {band['max_under']:.1%}) -> default margin "
        f"{margin:.2f}" if band else "no measured rows",
        f"OOM rows predicted to fit: {len(oom_fits)} of {sum(r['oom'] for r in results)}",
    ]
    for m, es in sorted(by_metric.items()):
        summary.append(f"  {m}: n={len(es)}, median |err| {statistics.median(abs(e) for e in es):.1%}, "
                       f"range {min(es):+.1%} .. {max(es):+.1%}")
    summary.append(f"OOM rows the planner says fit (must be none): "
                   f"{', '.join(r['row']['id'] for r in oom_fits) or 'none'}")
    summary.append(f"OOM rows whose predicted need is below the allocation at failure: "
                   f"{', '.join(r['row']['id'] for r in oom_below) or 'none'}")
    summary.append(f"non-OOM rows the planner says do not fit: "
                   f"{', '.join(r['row']['id'] for r in ok_nofit) or 'none'}")
    left = [r for r in every if r["unmodelled"]]
    summary.append("rows using what fitcheck does not model (†; scored, not in the figures above, "
                   "the bands or the margin): " + ("; ".join(
                       f"{r['row']['id']} {'-' if r['err'] is None else format(r['err'], '+.1%')} "
                       f"({r['unmodelled']})" for r in left) or "none"))
    txt += [""] + summary
    fam_rows = bands(results, margin)["families"]
    fam_md = ["| kind of job | measured rows | median abs. error | p90 abs. error | "
              "median signed | p90 under-prediction | OOM rows | OOM rows predicted to fit |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    txt += ["", "per kind of job (planner.error_bands.family):"]
    for name, b in fam_rows.items():
        if b["n"]:
            cells = (f"{b['median_abs']:.1%}", f"{b['p90_abs']:.1%}", f"{b['median_signed']:+.1%}",
                     f"{b['p90_under']:.1%}")
        else:
            cells = ("-", "-", "-", "-")
        fam_md.append(f"| {name} | {b['n']} | " + " | ".join(cells)
                      + f" | {b['oom_rows']} | {b['oom_predicted_fit']} |")
        txt.append(f"  {name:15} n={b['n']:3}  median |err| {cells[0]:>6}  p90 {cells[1]:>6}  "
                   f"signed {cells[2]:>7}  p90 under {cells[3]:>6}  OOM {b['oom_rows']} "
                   f"(predicted fit {b['oom_predicted_fit']})")

    doc = [
        "# Memory planner vs published measurements",
        "",
        "Generated by `python benchmarks/memory_accuracy.py` from "
        f"`{Path(csv_path).relative_to(ROOT) if Path(csv_path).is_relative_to(ROOT) else csv_path}`;"
        " do not edit by hand.",
        "",
        "Each row is a real training run whose peak memory a public source reports (URL and the",
        "exact quote are in the CSV). The planner's figure compared is the one matching what the",
        "source measured: `max_allocated` ↔ `peak_allocated_bytes`, `max_reserved` ↔",
        "`peak_reserved_bytes`, `nvidia_smi` ↔ `device_used_bytes` (adds CUDA context and NCCL).",
        f"The fit verdict uses the default margin ({margin:.2f}, derived from these errors: the",
        "nearest-rank p90 of the under-predictions, rounded up to a whole percent; docs/accuracy.md).",
        "Relative error = (predicted − measured) / measured. `*`: an OOM row's value is the",
        "allocation at the failure, a lower bound. Inputs beyond the columns are in the CSV's",
        "`extra` column (spec fields).",
        "",
        "## Summary",
        "",
        *[f"- {s.strip()}" for s in summary],
        "",
        "## Per kind of job",
        "",
        "What `fitcheck` prints as the error band of a verdict (`planner/data/error_bands.json`);",
        f"a kind with fewer than {MIN_ROWS} measured rows is given the all-rows band.",
        "",
        *fam_md,
        "",
        "## Rows",
        "",
        *md,
        "",
        "## Notes on the rows",
        "",
    ]
    for r in every:
        doc.append(f"- **{r['row']['id']}**: {r['row']['notes']} Source: {r['row']['source']}"
                   + (f" NOT MODELLED: {r['unmodelled']}." if r["unmodelled"] else ""))
    # The checkpointing term is the largest modelling choice: show where each 'selective' row's
    # measurement falls between the planner's none / selective / full predictions.
    sel = [r for r in results if r["row"]["checkpointing"] == "selective" and r["err"] is not None]
    if sel:
        doc += ["", "## Selective rows: predictions under each checkpointing mode", "",
                "The source's 'selective' may not be the planner's (attention core + MLP activation",
                "recomputed); this shows which planner mode the measurement is closest to.", "",
                "| id | measured GiB | pred. none | pred. selective | pred. full |",
                "|---|---:|---:|---:|---:|"]
        for r in sel:
            preds = []
            for ck in ("none", "selective", "full"):
                e = predict({**r["row"], "checkpointing": ck})
                preds.append(_gib(PREDICTED[r["metric"]](e)))
            doc.append(f"| {r['row']['id']} | {_gib(r['measured'])} | " + " | ".join(preds) + " |")
    doc.append("")
    return "\n".join(txt), "\n".join(doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "memory_measurements.csv"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "memory_accuracy.md"))
    ap.add_argument("--bands", default=DATA_PATH,
                    help="error_bands.json to update (its memory section); '' to skip")
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    # The errors do not depend on the margin (checkpointing is fixed per row); the fit
    # verdicts do: score once, derive the margin, then judge the fits with it.
    errs = [r["err"] for r in modelled(evaluate(rows)) if r["err"] is not None]
    margin = margin_from(errs)
    results = evaluate(rows, margin)
    text, doc = report(results, args.csv, margin)
    print(text)
    if args.md:
        Path(args.md).write_text(doc)
        print(f"\nwrote {args.md}")
    if args.bands:
        update_bands(args.bands, "memory", bands(results, margin))
        print(f"wrote {args.bands} (memory)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
