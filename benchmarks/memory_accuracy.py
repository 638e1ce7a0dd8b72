"""Score the memory planner on published peak-memory measurements of real training runs.

    python benchmarks/memory_accuracy.py [--csv PATH] [--md docs/memory_accuracy.md]
                                         [--bands planner/data/error_bands.json]
                                         [--accuracy-md docs/accuracy.md] [--gpu-runs]

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
risk (issue 24): the rows are split in two halves (``split``), each kind's interval of
log(measured / predicted) is fitted on the first (``fit_risk``), and the verdicts (fits / at
risk / does not fit, ``judge``) and the interval's coverage are checked on the second
(``acceptance``), also with the halves swapped. The fit verdicts here use that fit, so the file
and the table agree in one run; the single margin the risk replaced
(``planner.error_bands.margin_from``) is computed for comparison only. ``--accuracy-md`` writes
the acceptance into docs/accuracy.md §5; ``--gpu-runs`` adds the H200 out-of-memory runs of
benchmarks/gpu_runs/ (imports torch).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.rowspec import RowError, request_for, update_bands  # noqa: E402
from planner.error_bands import (  # noqa: E402
    AT_RISK,
    DATA_PATH,
    DOES_NOT_FIT,
    FITS,
    MIN_ROWS,
    RISK_COVERAGE,
    RISK_MIN_ROWS,
    RiskBand,
    family,
    fit_log_ratios,
    is_finetune,
    margin_from,
    outcome,
    risk_kinds,
    summarize,
)
from planner.memory import Estimate  # noqa: E402
from planner.plan import _estimate as plan_estimate  # noqa: E402  (the estimate plan() makes)
from planner.request import Request  # noqa: E402
from planner.spec import Candidate  # noqa: E402

GIB = 2**30
MARGIN = 0.0  # the CLI's default --margin: none, the risk of each kind of job decides
ACC_BEGIN, ACC_END = "<!-- risk-acceptance:begin -->", "<!-- risk-acceptance:end -->"
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
                        kinds=risk_kinds(est.candidate.strategy, req.training.compile,
                                         is_finetune(req.training)),
                        unmodelled=(row.get("unmodelled") or "").strip()))
    return out


# ---------------------------------------------------------------------------------------------
# Risk: fitted on one half of the rows, checked on the other


SPLIT_RULE = ("the modelled rows, grouped by their finest kind (strategy family, eager or "
              "compiled, full training or fine-tuning) and by what they report (a measured "
              "peak, OOM, or 'it ran'), each group in id order, alternate: the 1st, 3rd, ... "
              "row of a group is fitted on, the 2nd, 4th, ... is held out")


def split(results: list[dict]) -> None:
    """Mark each modelled row's half (r['half'] = 'fit' or 'check'); SPLIT_RULE says how."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in modelled(results):
        what = "oom" if r["oom"] else "measured" if r["err"] is not None else "ran"
        groups.setdefault((r["kinds"][0], what), []).append(r)
    for rows in groups.values():
        for i, r in enumerate(sorted(rows, key=lambda r: r["row"]["id"])):
            r["half"] = "fit" if i % 2 == 0 else "check"


def log_ratio(r: dict) -> float:
    """log(measured / predicted) of a measured row: the error the interval is about."""
    return math.log(r["measured"] / r["predicted"])


def fit_risk(results: list[dict]) -> dict[str, dict]:
    """{kind: {n, mean_log, sd_log}} over the fit half's measured rows, for every kind (and
    coarser kind) a row belongs to."""
    xs: dict[str, list[float]] = {}
    for r in modelled(results):
        if r.get("half") == "fit" and r["err"] is not None:
            for k in r["kinds"]:
                xs.setdefault(k, []).append(log_ratio(r))
    return {k: fit_log_ratios(v) for k, v in sorted(xs.items())}


def band_for(kinds: tuple[str, ...], fitted: dict[str, dict]) -> RiskBand | None:
    """As planner.error_bands.risk_band, on the fit just made (not the shipped file)."""
    for name in kinds:
        e = fitted.get(name)
        if e and e["n"] >= RISK_MIN_ROWS and "sd_log" in e:
            return RiskBand(kind=kinds[0], measured_kind=name, n=e["n"], mean_log=e["mean_log"],
                            sd_log=e["sd_log"], coverage=RISK_COVERAGE)
    return None


def judge(results: list[dict], fitted: dict[str, dict], margin: float) -> None:
    """Each row's verdict with the risk (r['outcome'], r['p_oom'], r['band']) and with the
    single margin it replaces (r['fits_at_margin'])."""
    for r in results:
        e = r["est"]
        band = band_for(r["kinds"], fitted)
        r["band"] = band
        r["outcome"], r["p_oom"] = outcome(int(e.required_bytes), int(e.usable_bytes), band)
        r["fits_at_margin"] = (e.required_bytes <= int(e.capacity_bytes * (1 - margin))
                               and bool(e.fits_host))
        if not e.fits_host:
            r["outcome"] = DOES_NOT_FIT


def acceptance(rows: list[dict]) -> dict:
    """The figures the risk is accepted on, over ``rows``."""
    measured = [r for r in rows if r["err"] is not None and r["band"] is not None]
    inside = [r for r in measured
              if math.log(r["band"].low) <= log_ratio(r) <= math.log(r["band"].high)]
    above = [r for r in measured if log_ratio(r) > math.log(r["band"].high)]
    done = [r for r in rows if not r["oom"]]
    oom = [r for r in rows if r["oom"]]
    count = lambda rs, o: sum(r["outcome"] == o for r in rs)  # noqa: E731
    return {
        "measured": len(measured), "inside": len(inside), "above": len(above),
        "coverage": round(len(inside) / len(measured), 4) if measured else None,
        "completed": len(done), "completed_fits": count(done, FITS),
        "completed_at_risk": count(done, AT_RISK),
        "completed_does_not_fit": count(done, DOES_NOT_FIT),
        "completed_not_fit_at_margin": sum(not r["fits_at_margin"] for r in done),
        "oom": len(oom), "oom_fits": count(oom, FITS), "oom_at_risk": count(oom, AT_RISK),
        "oom_does_not_fit": count(oom, DOES_NOT_FIT),
        "oom_fit_at_margin": sum(r["fits_at_margin"] for r in oom),
    }


def risk_section(results: list[dict], fitted: dict[str, dict], margin: float) -> dict:
    """The memory.risk section of error_bands.json."""
    return {
        "coverage": RISK_COVERAGE,
        "model": "x = log(measured / predicted) per public run; a kind's interval is its "
                 "fitted runs' mean of x +- t(n-1, (1 + coverage) / 2) x sd x sqrt(1 + 1/n) "
                 "(planner.error_bands.RiskBand)",
        "split": SPLIT_RULE,
        "min_rows": RISK_MIN_ROWS,
        "kinds": fitted,
        "held_out": acceptance([r for r in results if r.get("half") == "check"]),
        "two_fold": two_fold(results, margin),
        "replaced_margin": margin,
    }


def swapped_acceptance(results: list[dict], margin: float) -> dict:
    """``acceptance`` with the halves swapped: fitted on the held-out half, checked on the
    fitted one (the rows are copied; ``results`` is left as it is)."""
    swapped = [{**r, "half": {"fit": "check", "check": "fit"}[r["half"]]} if r.get("half")
               else dict(r) for r in results]
    judge(swapped, fit_risk(swapped), margin)
    return acceptance([r for r in swapped if r.get("half") == "check"])


def two_fold(results: list[dict], margin: float) -> dict:
    """Two-fold cross-validation of the interval: every measured row checked exactly once, by
    the fit of the half it is not in. ``expected``: how many of them a calibrated interval
    puts inside, 19 times in 20 (``binomial_range``)."""
    held = acceptance([r for r in results if r.get("half") == "check"])
    rev = swapped_acceptance(results, margin)
    n = held["measured"] + rev["measured"]
    inside = held["inside"] + rev["inside"]
    return {"measured": n, "inside": inside, "above": held["above"] + rev["above"],
            "coverage": round(inside / n, 4) if n else None,
            "expected": list(binomial_range(n, RISK_COVERAGE)) if n else None}


HELD_OUT = "held out: "
"""An ``unmodelled`` entry starting so: the row's feature is modelled now, but the row is kept
out of the fitted bands (the reason follows)."""


REFUSED = "refused: "
"""An ``unmodelled`` entry starting so: the planner refuses the row's configuration by name (NOT
MODELLED, e.g. pipeline parallel with tensor parallel), so there is no prediction to score. The
row is listed with its measurement and the planner's refusal; the benchmark stops if such a row
is planned after all (then its feature is modelled: drop the prefix and score it)."""


def refused_rows(rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict]]:
    """(the rows to score, [{row, reason}] of the rows marked REFUSED). A marked row the planner
    plans, or refuses for anything but NOT MODELLED, stops the benchmark (RowError names the
    row); an unmarked row it refuses stops evaluate()."""
    keep: list[dict[str, str]] = []
    out: list[dict] = []
    for row in rows:
        if not (row.get("unmodelled") or "").strip().startswith(REFUSED):
            keep.append(row)
            continue
        try:
            predict_request(row)
        except RowError as exc:
            if "NOT MODELLED" not in str(exc):
                raise  # a bad input, not a feature the planner names as not modelled
            out.append({"row": row, "reason": str(exc).split(": ", 1)[-1]})
            continue
        raise RowError(f"{row['id']}: marked '{REFUSED.strip()}' but the planner plans it: "
                       "its feature is modelled now, score the row (drop the prefix)")
    return keep, out


def refused_lines(refused: list[dict]) -> list[str]:
    """One line per refused row: id, what it measured, the planner's refusal."""
    return [f"{r['row']['id']} ({r['row']['metric']} {r['row']['source_unit']}; "
            f"{r['row']['unmodelled'][len(REFUSED):]}; the planner: {r['reason']})"
            for r in refused]


def modelled(results: list[dict]) -> list[dict]:
    """The rows whose every input fitcheck models: the bands and the margin are fitted on these.
    A row whose run used something fitcheck does not model (the CSV's ``unmodelled`` column
    names it: Float8, activation offloading, an old bitsandbytes) is scored and shown, but an
    error it causes is the missing feature's, not the model's; a job that uses it is warned
    about (NOT MODELLED) instead."""
    return [r for r in results if not r["unmodelled"]]


def bands(results: list[dict], fitted: dict[str, dict], margin: float) -> dict:
    """The memory section of error_bands.json: all modelled rows, each family, the risk fit
    and its held-out check (``margin``: the single margin the risk replaced, for comparison)."""
    every, results = results, modelled(results)
    errs = [r["err"] for r in results if r["err"] is not None]
    fams: dict[str, dict] = {}
    for name in sorted({r["family"] for r in results}):
        mine = [r for r in results if r["family"] == name]
        es = [r["err"] for r in mine if r["err"] is not None]
        fams[name] = {**(summarize(es) if es else {"n": 0}),
                      "oom_rows": sum(r["oom"] for r in mine),
                      "oom_predicted_fit": sum(r["oom"] and r["outcome"] == FITS for r in mine)}
    return {
        "source": "benchmarks/memory_measurements.csv",
        "metric": "relative error of the peak the source measured (max allocated, max reserved "
                  "or nvidia-smi used): (predicted - measured) / measured",
        "all": {**summarize(errs), "oom_rows": sum(r["oom"] for r in results),
                "oom_predicted_fit": sum(r["oom"] and r["outcome"] == FITS for r in results)},
        "families": fams,
        "risk": risk_section(every, fitted, margin),
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


VERDICT = {FITS: "fits", AT_RISK: "at risk", DOES_NOT_FIT: "does not fit"}


def _verdict(r: dict) -> str:
    p = "" if r["p_oom"] is None or r["outcome"] == DOES_NOT_FIT and r["p_oom"] > 0.995 \
        else f" ({r['p_oom']:.0%})"
    return VERDICT[r["outcome"]] + (p if r["outcome"] == AT_RISK else "")


def _pct(k: int, n: int) -> str:
    return f"{k} of {n}" + (f" ({k / n:.0%})" if n else "")


def binomial_range(n: int, p: float, mass: float = 0.95) -> tuple[int, int]:
    """The central ``mass`` of Binomial(n, p): the smallest k_lo and largest k_hi with
    P(X < k_lo) <= (1 - mass) / 2 and P(X > k_hi) <= (1 - mass) / 2. How many of n runs a
    calibrated interval of coverage p puts inside it, 19 times in 20."""
    tail = (1.0 - mass) / 2.0
    pmf = [math.comb(n, k) * p ** k * (1.0 - p) ** (n - k) for k in range(n + 1)]
    lo, below = 0, 0.0
    while below + pmf[lo] <= tail:
        below += pmf[lo]
        lo += 1
    hi, over = n, 0.0
    while over + pmf[hi] <= tail:
        over += pmf[hi]
        hi -= 1
    return lo, hi


def acceptance_lines(results: list[dict], fitted: dict[str, dict], margin: float,
                     n_refused: int = 0) -> list[str]:
    """The risk's acceptance, as Markdown (the section of docs/accuracy.md and of
    memory_accuracy.md); ``n_refused``: the rows the planner refuses (not in ``results``)."""
    held = acceptance([r for r in results if r.get("half") == "check"])
    fit_half = acceptance([r for r in results if r.get("half") == "fit"])
    never = acceptance([r for r in results if r.get("half") and r["err"] is None])
    rev = swapped_acceptance(results, margin)
    cov = RISK_COVERAGE
    both = two_fold(results, margin)
    both_in, both_n = both["inside"], both["measured"]
    lo, hi = both["expected"]
    lines = [
        f"Made by `python benchmarks/memory_accuracy.py` from benchmarks/memory_measurements.csv "
        f"({len(modelled(results))} modelled rows; the {len(results) - len(modelled(results))} "
        "rows using what fitcheck does not model"
        + (f" and the {n_refused} it refuses by name" if n_refused else "")
        + " are left out). Do not edit by hand.",
        "",
        f"Split: {SPLIT_RULE}. Fitted on {sum(1 for r in results if r.get('half') == 'fit')} "
        f"rows ({sum(1 for r in results if r.get('half') == 'fit' and r['err'] is not None)} "
        "with a measured peak: only these enter the fit), held out "
        f"{sum(1 for r in results if r.get('half') == 'check')}.",
        "",
        "Intervals fitted (x = log(measured / predicted); a kind with fewer than "
        f"{RISK_MIN_ROWS} fitted runs uses the next coarser kind):",
        "",
        f"| kind | fitted runs | mean x | sd x | {cov:.0%} interval of the need (x predicted) | "
        "the CSV's rows it is used for (their finest kind) |",
        "|---|---:|---:|---:|---|---|",
    ]
    users: dict[str, set[str]] = {}
    for r in modelled(results):
        if r["band"] is not None:
            users.setdefault(r["band"].measured_kind, set()).add(r["kinds"][0])
    for name, e in fitted.items():
        if e["n"] >= RISK_MIN_ROWS and "sd_log" in e:
            b = band_for((name,), fitted)
            lines.append(f"| {name} | {e['n']} | {e['mean_log']:+.3f} | {e['sd_log']:.3f} | "
                         f"{b.low:.2f} .. {b.high:.2f} | "
                         f"{', '.join(sorted(users.get(name, ()))) or '-'} |")
        else:
            lines.append(f"| {name} | {e['n']} | - | - | too few: a coarser kind | - |")
    lines += [
        "",
        "| held-out rows | result | target |",
        "|---|---|---|",
        f"| out-of-memory runs called \"fits\" | {_pct(held['oom_fits'], held['oom'])} "
        f"(at risk {held['oom_at_risk']}, does not fit {held['oom_does_not_fit']}) | 0 |",
        f"| completed runs called \"does not fit\" | "
        f"{_pct(held['completed_does_not_fit'], held['completed'])} (fits "
        f"{held['completed_fits']}, at risk {held['completed_at_risk']}) | <= 5 % |",
        f"| measured peaks inside the {cov:.0%} interval | "
        f"{_pct(held['inside'], held['measured'])}; above it {held['above']} | "
        f"{cov:.0%} +- 5 points |",
        f"| both halves, each checked by the other half's fit (two-fold): measured peaks "
        f"inside the {cov:.0%} interval | {_pct(both_in, both_n)}; above it "
        f"{both['above']} | {cov:.0%} +- 5 points (a calibrated interval puts "
        f"{lo} to {hi} of {both_n} inside, 19 times in 20) |",
        f"| the single margin it replaces ({margin:.2f}): completed runs called \"does not "
        f"fit\" / OOM runs called \"fits\" | "
        f"{_pct(held['completed_not_fit_at_margin'], held['completed'])} / "
        f"{held['oom_fit_at_margin']} of {held['oom']} | |",
        "",
        f"For comparison, the fitted half (in-sample): {_pct(fit_half['inside'], fit_half['measured'])} "
        f"measured peaks inside the interval; out-of-memory runs called \"fits\" "
        f"{fit_half['oom_fits']} of {fit_half['oom']}, completed runs called \"does not fit\" "
        f"{_pct(fit_half['completed_does_not_fit'], fit_half['completed'])}. Rows without a "
        "measured peak (OOM and 'it ran') never enter a fit; over all of them: OOM called "
        f"\"fits\" {never['oom_fits']} of {never['oom']}, completed called \"does not fit\" "
        f"{_pct(never['completed_does_not_fit'], never['completed'])}. With the halves swapped "
        "(fitted on the held-out half, checked on the fitted one): "
        f"{_pct(rev['inside'], rev['measured'])} measured peaks inside the interval (above it "
        f"{rev['above']}); OOM runs called \"fits\" {rev['oom_fits']} of {rev['oom']}; "
        f"completed runs called \"does not fit\" "
        f"{_pct(rev['completed_does_not_fit'], rev['completed'])}.",
    ]
    return lines


def report(results: list[dict], csv_path: str, fitted: dict[str, dict],
           margin: float, refused: list[dict] | None = None) -> tuple[str, str]:
    """(plain text, markdown). ``margin``: the single margin the risk replaced (compared);
    ``refused``: the rows the planner refuses (refused_rows), listed, not scored."""
    refused = refused or []
    txt: list[str] = []
    md: list[str] = []
    head = (f"{'id':44} {'metric':13} {'meas GiB':>9} {'pred GiB':>9} {'err':>8} "
            f"{'need GiB':>9} {'cap GiB':>7} {'half':>5} {'verdict':>18} {'oom':>4} {'peak at':>9}")
    txt += [head, "-" * len(head)]
    md += ["| id | model | config | metric | measured GiB | predicted GiB | rel. error | "
           f"predicted need GiB ({RISK_COVERAGE:.0%} interval) | capacity GiB | half | "
           "planner: verdict (P(OOM)) | source: OOM | peak phase |",
           "|---|---|---|---|---:|---:|---:|---:|---:|:-:|---|:-:|---|"]
    for r in results:
        row, est = r["row"], r["est"]
        err = "-" if r["err"] is None else f"{r['err']:+.1%}" + ("†" if r["unmodelled"] else "")
        meas = _gib(r["measured"]) + ("*" if r["oom"] and r["measured"] is not None else "")
        need = _gib(est.required_bytes)
        if r["band"] is not None:
            need += (f" ({_gib(est.required_bytes * r['band'].low)}-"
                     f"{_gib(est.required_bytes * r['band'].high)})")
        half = r.get("half") or "-"
        txt.append(f"{row['id']:44} {r['metric'] or '-':13} {meas:>9} {_gib(r['predicted']):>9} "
                   f"{err:>8} {_gib(est.required_bytes):>9} {_gib(est.usable_bytes):>7} "
                   f"{half:>5} {_verdict(r):>18} {'yes' if r['oom'] else 'no':>4} "
                   f"{est.peak_phase:>9}")
        md.append(f"| {row['id']} | {row['model']} | {config_label(row)} | {r['metric'] or '-'} | "
                  f"{meas} | {_gib(r['predicted'])} | {err} | {need} | "
                  f"{_gib(est.usable_bytes)} | {half} | {_verdict(r)} | "
                  f"{'yes' if r['oom'] else 'no'} | {est.peak_phase} |")

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
    oom_fits = [r for r in every if r["oom"] and r["outcome"] == FITS]  # every row: never
    oom_below = [r for r in results if r["oom"] and r["measured"] is not None
                 and r["predicted"] is not None and r["predicted"] < r["measured"]]
    ok_nofit = [r for r in results if not r["oom"] and r["outcome"] == DOES_NOT_FIT]
    ok_risk = [r for r in results if not r["oom"] and r["outcome"] == AT_RISK]

    summary = [
        f"rows: {len(results)} ({len(errs)} with a measured value, "
        f"{sum(r['oom'] for r in results)} reported OOM, "
        f"{sum(1 for r in results if not r['oom'] and r['measured'] is None)} fit-only)",
        f"median absolute relative error: {med:.1%} (median signed error {signed:+.1%}; "
        "positive = planner predicts more than measured)",
        f"p90 absolute relative error: {band['p90_abs']:.1%}; p90 under-prediction "
        f"{band['p90_under']:.1%} (largest {band['max_under']:.1%}): the single margin the "
        f"risk replaced would be {margin:.2f}" if band else "no measured rows",
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
    summary.append("non-OOM rows the planner calls at risk: "
                   + (", ".join(f"{r['row']['id']} ({r['p_oom']:.0%})" for r in ok_risk)
                      or "none"))
    held = [r for r in every if r["unmodelled"].startswith(HELD_OUT)]
    left = [r for r in every if r["unmodelled"] and r not in held]
    if held:
        summary.append("rows modelled but held out of the bands (†; scored, not in the figures "
                       "above, the bands or the risk): " + "; ".join(
                           f"{r['row']['id']} "
                           f"{'-' if r['err'] is None else format(r['err'], '+.1%')} "
                           f"({r['unmodelled'][len(HELD_OUT):]})" for r in held))
    summary.append("rows using what fitcheck does not model (†; scored, not in the figures above, "
                   "the bands or the risk): " + ("; ".join(
                       f"{r['row']['id']} {'-' if r['err'] is None else format(r['err'], '+.1%')} "
                       f"({r['unmodelled']})" for r in left) or "none"))
    summary.append("rows the planner refuses by name (NOT MODELLED; listed with their "
                   "measurement, no prediction to score): "
                   + ("; ".join(refused_lines(refused)) or "none"))
    txt += [""] + summary
    fam_rows = bands(every, fitted, margin)["families"]
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
    risk_md = acceptance_lines(every, fitted, margin, len(refused))
    txt += ["", "risk (fits / at risk / does not fit):"] + [f"  {x}" for x in risk_md if x]

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
        "The verdict is the planner's with the risk (docs/accuracy.md §5): the predicted need",
        f"(what must fit on the device at the peak) with the {RISK_COVERAGE:.0%} interval of its "
        "kind of job,",
        "fitted on the rows marked `fit` below; *fits* when the whole interval is within the",
        "capacity, *does not fit* when all of it is above, else *at risk* with the probability",
        "of running out of memory. No margin is kept (the default). Relative error = (predicted",
        "− measured) / measured. `*`: an OOM row's value is the allocation at the failure, a",
        "lower bound. Inputs beyond the columns are in the CSV's `extra` column (spec fields).",
        "",
        "## Summary",
        "",
        *[f"- {s.strip()}" for s in summary],
        "",
        "## Risk: fitted on half the rows, checked on the other half",
        "",
        *risk_md,
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
                   + ("" if not r["unmodelled"] else
                      f" HELD OUT OF THE BANDS: {r['unmodelled'][len(HELD_OUT):]}."
                      if r["unmodelled"].startswith(HELD_OUT) else
                      f" NOT MODELLED: {r['unmodelled']}."))
    for r in refused:
        doc.append(f"- **{r['row']['id']}**: {r['row']['notes']} Source: {r['row']['source']}"
                   f" REFUSED BY THE PLANNER ({r['row']['unmodelled'][len(REFUSED):]}): "
                   f"{r['reason']}.")
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


def gpu_run_ooms(fitted: dict[str, dict]) -> list[str]:
    """The verdicts with the risk just fitted on the runs of benchmarks/gpu_runs/ (every GPU of
    benchmarks/gpu_calibration.py) that ran out of memory: not in the CSV, so out-of-sample;
    needs torch for the reference module's spec."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_calibration as g

    from planner.hardware import load_gpu

    out = []
    for gr in g.GPUS:
        out += [f"[{gr.label}] {line}" for line in _gpu_ooms(g, gr, fitted, load_gpu)]
    return out


def _gpu_ooms(g: Any, gr: Any, fitted: dict[str, dict], load_gpu: Any) -> list[str]:
    out = []
    done: dict[str, int] = {FITS: 0, AT_RISK: 0, DOES_NOT_FIT: 0}
    inside = above = 0
    for r in g.rows_of(g.read_runs(gr.runs), "case", load_gpu(gr.profile)):
        e = r.est(g.Overheads())
        band = band_for(risk_kinds(r.cand.strategy, r.training.compile,
                                   is_finetune(r.training)), fitted)
        if e.risk is not None and e.risk.high_floor > 1:  # what the plan's own band carries
            band = dataclasses.replace(band, high_floor=e.risk.high_floor,
                                       floor_reason=e.risk.floor_reason)
        verdict, p = outcome(int(e.required_bytes), int(e.usable_bytes), band)
        if r.rec["ok"]:
            done[verdict] += 1
            # the device memory the process held after its steps (the caching allocator's
            # reserved bytes, the CUDA context, NCCL, cuBLAS) against the interval of the need
            used = r.rec["device_used_bytes"] / e.required_bytes
            inside += band.low <= used <= band.high
            above += used > band.high
            continue
        out.append(f"{r.id}: ran out of memory ({r.rec['oom_moment']}); planner needs "
                   f"{e.required_bytes / GIB:.1f} GiB of {e.usable_bytes / GIB:.1f} GiB "
                   f"({band.measured_kind} interval x {band.low:.2f} .. {band.high:.2f}): "
                   f"{VERDICT[verdict]}" + ("" if p is None else f", P(OOM) {p:.0%}"))
    n = sum(done.values())
    out.append(f"the {n} cases that completed: fits {done[FITS]}, at risk "
               f"{done[AT_RISK]}, does not fit {done[DOES_NOT_FIT]}; their device memory used "
               f"inside the {RISK_COVERAGE:.0%} interval: {_pct(inside, n)}, above it {above}")
    return out


def write_section(path: str, body: str) -> None:
    """Replace the risk-acceptance section of ``path`` (markers appended if absent),
    atomically."""
    try:
        old = Path(path).read_text()
    except FileNotFoundError:
        old = ""
    block = f"{ACC_BEGIN}\n{body}\n{ACC_END}"
    if ACC_BEGIN in old and ACC_END in old:
        head, rest = old.split(ACC_BEGIN, 1)
        text = head + block + rest.split(ACC_END, 1)[1]
    else:
        text = old + ("\n" if old and not old.endswith("\n") else "") + block + "\n"
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "memory_measurements.csv"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "memory_accuracy.md"))
    ap.add_argument("--accuracy-md", default=str(ROOT / "docs" / "accuracy.md"),
                    help="docs/accuracy.md, whose risk-acceptance section is rewritten; '' to skip")
    ap.add_argument("--gpu-runs", action="store_true",
                    help="also print the risk verdicts of the out-of-memory runs in "
                    "benchmarks/gpu_runs/ (imports torch)")
    ap.add_argument("--bands", default=DATA_PATH,
                    help="error_bands.json to update (its memory section); '' to skip")
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    rows, refused = refused_rows(rows)
    # The errors do not depend on the margin (checkpointing is fixed per row) and the plan is
    # made without one (the default); the verdicts use the risk fitted on the fit half.
    results = evaluate(rows)
    errs = [r["err"] for r in modelled(results) if r["err"] is not None]
    margin = margin_from(errs)  # the single margin the risk replaced, for comparison
    split(results)
    fitted = fit_risk(results)
    judge(results, fitted, margin)
    text, doc = report(results, args.csv, fitted, margin, refused)
    print(text)
    if args.md:
        Path(args.md).write_text(doc)
        print(f"\nwrote {args.md}")
    if args.bands:
        update_bands(args.bands, "memory", bands(results, fitted, margin))
        print(f"wrote {args.bands} (memory)")
    if args.gpu_runs:
        print("\nthe GPU runs of benchmarks/gpu_runs/ (not fitted on):")
        for line in gpu_run_ooms(fitted):
            print(f"  {line}")
    if args.accuracy_md:
        write_section(args.accuracy_md, "\n".join(acceptance_lines(results, fitted, margin,
                                                                     len(refused))))
        print(f"wrote {args.accuracy_md} (risk-acceptance)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
