"""Fit the planner's runtime memory terms on the public measurements, with held-out errors.

    python benchmarks/public_memory_calibration.py [--csv PATH] [--md docs/calibration.md]
                                                   [--write-calibrations DIR]

Rows of ``benchmarks/memory_measurements.csv`` with a measured value and no OOM are mapped to
planner calls exactly as ``benchmarks/memory_accuracy.py`` does (default overheads). Per GPU
profile, three models of the measured quantity are compared:

  M0  the defaults (allocator_fragmentation 0.08, activation scale 1)
  M1  allocator_fragmentation fitted:       y = (1 + f) * P
  M2  fragmentation + activation scale:     y = a * (P - act) + b * act,  f = a - 1, s = b / a

where ``y`` is the measurement minus the terms the source itself states (the CUDA context it
measured, for ``nvidia_smi`` rows) minus the planner's structural step-leftover term, ``P`` the
planner's peak allocated and ``act`` its activation term at the peak. Every fit is numpy least
squares; its error is reported in-sample and leave-one-out (each row predicted by a fit on the
others). A calibration file is written for a GPU only when, on at least 5 rows, a fitted
model's held-out median error beats the defaults' by a percentage point without a worse
held-out worst case; otherwise the defaults stay and the report says why. A row whose
``unmodelled`` column is set (a feature fitcheck does not model, or models untraced: "held
out: ...") enters no fit, as it enters no error band (memory_accuracy.modelled).
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from memory_accuracy import PREDICTED, predict  # noqa: E402

from planner.calibration import SCHEMA_VERSION, architecture_family, parse_calibration  # noqa: E402
from planner.memory import Overheads  # noqa: E402
from planner.presets import get_preset  # noqa: E402
from probes.calibrate import leftover_bytes, lstsq  # noqa: E402

GIB = 2**30
MIN_ROWS_TO_SHIP = 5
MIN_GAIN = 0.01
"""A fitted model ships only if its held-out median |error| beats the defaults' by this much
(absolute) and its held-out worst |error| is not worse."""
BEGIN, END = "<!-- public-fit:begin -->", "<!-- public-fit:end -->"


def observations(rows: list[dict[str, str]]) -> list[dict]:
    ov = Overheads()
    out = []
    for row in rows:
        if row["oom"].strip().lower() == "true" or not row["value_bytes"].strip():
            continue
        if row.get("unmodelled", "").strip():
            # a run using what fitcheck does not model (or models untraced: "held out: ...")
            # is kept out of every fit, as out of the error bands (memory_accuracy.modelled)
            continue
        est = predict(row)
        metric = row["metric"].strip()
        measured = float(row["value_bytes"])
        stated = 0.0
        if metric == "nvidia_smi":
            # device used = reserved + context (+ NCCL, 0 on one GPU): the context is the
            # source's own measurement when given, else the profile's assumption
            stated = float(est.cuda_context_bytes + est.nccl_bytes)
        if metric == "max_allocated":
            continue  # only OOM lower bounds in the data; nothing to fit
        act = float(est.breakdown.activations)
        out.append(dict(
            id=row["id"], gpu=row["gpu"], metric=metric, measured=measured, stated=stated,
            leftover=float(leftover_bytes(est, ov)), P=float(est.peak_allocated_bytes), act=act,
            default=float(PREDICTED[metric](est)),
            model=row["model"],
            family=architecture_family(get_preset(row["model"])), ctx=est.cuda_context_bytes,
            context_given=bool(row.get("context_bytes", "").strip())))
    return out


def _design(obs: list[dict], model: str) -> np.ndarray:
    P = np.array([o["P"] for o in obs])
    act = np.array([o["act"] for o in obs])
    return P[:, None] if model == "M1" else np.column_stack([P - act, act])


def _predict(obs: list[dict], model: str, coef: np.ndarray | None) -> np.ndarray:
    if model == "M0":
        return np.array([o["default"] for o in obs])
    X = _design(obs, model)
    base = np.array([o["stated"] + o["leftover"] for o in obs])
    return base + X @ coef


def fit_group(obs: list[dict]) -> dict:
    y = np.array([o["measured"] - o["stated"] - o["leftover"] for o in obs])
    meas = np.array([o["measured"] for o in obs])
    res: dict = {"n": len(obs), "models": {}, "trained": sorted({o["model"] for o in obs})}
    for model in ("M0", "M1", "M2"):
        if model == "M2" and (len(obs) < 3 or all(o["act"] == 0 for o in obs)):
            continue
        coef = None if model == "M0" else lstsq(_design(obs, model), y)[0]
        pred = _predict(obs, model, coef)
        err_in = (pred - meas) / meas
        held = []
        if model == "M0":
            held = list(err_in)
        elif len(obs) >= 2:
            for i in range(len(obs)):
                m = np.ones(len(obs), dtype=bool)
                m[i] = False
                c = lstsq(_design(obs, model)[m], y[m])[0]
                held.append(float((_predict([obs[i]], model, c)[0] - meas[i]) / meas[i]))
        params = {}
        if model == "M1":
            params = {"allocator_fragmentation": float(coef[0]) - 1.0}
        elif model == "M2":
            a, b = float(coef[0]), float(coef[1])
            params = {"allocator_fragmentation": a - 1.0, "activation_scale": b / a}
        res["models"][model] = {
            "params": params, "in_sample": [float(e) for e in err_in], "held_out": held,
            "in_sample_median_abs": float(statistics.median(abs(e) for e in err_in)),
            "held_out_median_abs": float(statistics.median(abs(e) for e in held)) if held else None,
            "held_out_max_abs": float(max(abs(e) for e in held)) if held else None,
        }
    return res


def choose(res: dict) -> tuple[str, str]:
    """(model to ship or 'M0', why)."""
    base = res["models"]["M0"]["held_out_median_abs"]
    fitted = [(m, r) for m, r in res["models"].items() if m != "M0" and r["held_out_median_abs"]
              is not None]
    if not fitted:
        return "M0", "too few rows to fit"
    best, r = min(fitted, key=lambda mr: mr[1]["held_out_median_abs"])
    if res["n"] < MIN_ROWS_TO_SHIP:
        return "M0", (f"only {res['n']} rows (< {MIN_ROWS_TO_SHIP}): reported, not shipped")
    if len(res["trained"]) < 2:
        # every row trains one model: a leave-one-out error over them says nothing of the
        # other models the GPU's plans would apply the fit to (fit no constant to one model)
        return "M0", (f"every row is {res['trained'][0]}: a fit to one model's rows is "
                      "reported, not shipped")
    base_max = res["models"]["M0"]["held_out_max_abs"]
    if r["held_out_median_abs"] > base - MIN_GAIN:
        return "M0", (f"{best} held-out median |error| {r['held_out_median_abs']:.1%} is not "
                      f"{MIN_GAIN:.0%} points better than the defaults' {base:.1%}")
    if r["held_out_max_abs"] > base_max:
        return "M0", (f"{best} held-out worst |error| {r['held_out_max_abs']:.1%} is worse than "
                      f"the defaults' {base_max:.1%}")
    frag = r["params"]["allocator_fragmentation"]
    if not 0.0 <= frag <= 2.0:
        return "M0", f"{best} fits an implausible fragmentation {frag:.3f}"
    return best, (f"{best} held-out median |error| {r['held_out_median_abs']:.1%} vs the "
                  f"defaults' {base:.1%}")


def calibration_doc(gpu_id: str, obs: list[dict], res: dict, model: str, csv_rel: str) -> dict:
    from planner.hardware import load_gpu as load_profile

    prof = load_profile(gpu_id)
    r = res["models"][model]
    n = res["n"]
    held = r["held_out_median_abs"]
    stats = {"n": n, "relative_error": r["in_sample_median_abs"], "held_out_error": held,
             "rms_residual": None, "max_abs_residual": None}
    values: dict = {
        "allocator_fragmentation": {
            "value": round(max(0.0, r["params"]["allocator_fragmentation"]), 4), **stats,
            "method": f"{model} least squares on {n} public rows ({obs[0]['metric']})"},
        "activation_scale": {},
    }
    if "activation_scale" in r["params"]:
        fams = sorted({o["family"] for o in obs})
        for fam in fams:
            values["activation_scale"][fam] = {
                "value": round(r["params"]["activation_scale"], 4), **stats,
                "method": f"{model} least squares on {n} public rows"}
    doc = {
        "schema_version": SCHEMA_VERSION,
        "id": f"{gpu_id}-public-{len(obs)}rows",
        "source": f"public measurements: {csv_rel} rows " + ", ".join(o["id"] for o in obs)
                  + " (benchmarks/public_memory_calibration.py)",
        "gpu": {"profile": gpu_id, "name": prof.name, "memory_bytes": prof.memory_bytes},
        "versions": {"driver": None, "cuda": None, "torch": None, "nccl": None},
        "date": _dt.date.today().isoformat(),
        "values": values,
        "notes": [
            "Fitted on published numbers, not on probe runs: the software versions of the "
            "sources are not stated, so staleness is not checked. Replace with a probe "
            "calibration (docs/calibration.md) when a GPU is available.",
            "The CUDA context the V100 rows state (1343 MiB, a 2022 stack without lazy "
            "loading) is not copied: it describes that stack, not the profile's.",
            "The fitted terms absorb every difference between the sources' runs and the "
            "preset models (e.g. classification vs masked-LM heads), not only the allocator.",
        ],
        "records": [{"id": o["id"], "metric": o["metric"], "measured_bytes": int(o["measured"])}
                    for o in obs],
    }
    parse_calibration(json.loads(json.dumps(doc)), "<public fit>")
    return doc


def markdown(groups: dict, choices: dict, csv_rel: str) -> str:
    md = [BEGIN, "", "## Fit on the public measurements", "",
          f"Generated by `python benchmarks/public_memory_calibration.py` from `{csv_rel}`; do not "
          "edit by hand. Relative error = (predicted − measured) / measured; *held out* = "
          "leave-one-out (each row predicted by a fit on the other rows of its GPU). "
          "M0 = defaults, M1 = fragmentation fitted, M2 = fragmentation + activation scale.", ""]
    md += ["| GPU | metric | rows | model | fitted values | in-sample median abs err | "
           "held-out median abs err | held-out max abs err | shipped |",
           "|---|---|---:|---|---|---:|---:|---:|:-:|"]
    for gpu, (obs, res) in groups.items():
        ship, why = choices[gpu]
        for m, r in res["models"].items():
            params = ", ".join(f"{k} {v:.3f}" for k, v in r["params"].items()) or "defaults"
            held = "-" if r["held_out_median_abs"] is None else f"{r['held_out_median_abs']:.1%}"
            hmax = "-" if r["held_out_max_abs"] is None else f"{r['held_out_max_abs']:.1%}"
            md.append(f"| {gpu} | {obs[0]['metric']} | {res['n']} | {m} | {params} | "
                      f"{r['in_sample_median_abs']:.1%} | {held} | {hmax} | "
                      f"{'yes' if (m == ship and m != 'M0') else ''} |")
    md += ["", "Decisions:", ""]
    for gpu, (ship, why) in choices.items():
        verdict = f"shipped `hardware_profiles/calibrations/{gpu}-public.json` ({ship})" if ship != "M0" \
            else "no file shipped, defaults kept"
        md.append(f"- **{gpu}**: {verdict}: {why}.")
    md += ["- **context, NCCL, compute and link efficiency**: not fittable from these rows (the "
           "V100 rows state their 2022 stack's context, an input here, not a fitted value; every row with a "
           "measured value is single-node and none isolates NCCL buffers or step time).", "",
           "Per-row errors, defaults vs the best fitted model held out (GPUs with >= 3 rows):",
           "", "| id | model | measured GiB | default pred. GiB | default err | held-out err |",
           "|---|---|---:|---:|---:|---:|"]
    for gpu, (obs, res) in groups.items():
        fitted = {m: r for m, r in res["models"].items() if m != "M0" and r["held_out"]}
        if len(obs) < 3 or not fitted:
            continue
        best = min(fitted, key=lambda m: fitted[m]["held_out_median_abs"])
        for o, e0, eh in zip(obs, res["models"]["M0"]["in_sample"], fitted[best]["held_out"]):
            md.append(f"| {o['id']} | {best} | {o['measured'] / GIB:.2f} | "
                      f"{o['default'] / GIB:.2f} | {e0:+.1%} | {eh:+.1%} |")
    md += ["", END]
    return "\n".join(md)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "memory_measurements.csv"))
    ap.add_argument("--md", default=str(ROOT / "docs" / "calibration.md"),
                    help="Markdown file whose public-fit section is replaced ('' = none)")
    ap.add_argument("--write-calibrations", default=str(ROOT / "hardware_profiles" / "calibrations"),
                    help="directory for the shipped files ('' = none)")
    args = ap.parse_args(argv)
    with open(args.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    csv_path = Path(args.csv).resolve()
    csv_rel = str(csv_path.relative_to(ROOT)) if csv_path.is_relative_to(ROOT) else str(csv_path)
    obs = observations(rows)
    groups: dict[str, tuple[list[dict], dict]] = {}
    for gpu in sorted({o["gpu"] for o in obs}):
        g = [o for o in obs if o["gpu"] == gpu]
        groups[gpu] = (g, fit_group(g))
    choices = {gpu: choose(res) for gpu, (_, res) in groups.items()}
    for gpu, (g, res) in groups.items():
        print(f"{gpu}: {res['n']} rows ({g[0]['metric']})")
        for m, r in res["models"].items():
            params = ", ".join(f"{k}={v:.4f}" for k, v in r["params"].items()) or "defaults"
            held, hmax = r["held_out_median_abs"], r["held_out_max_abs"]
            held_s = "-" if held is None else f"{held:6.1%}"
            hmax_s = "-" if hmax is None else f"{hmax:.1%}"
            print(f"  {m}: {params:55s} in-sample median |err| {r['in_sample_median_abs']:6.1%}"
                  f"   held-out median |err| {held_s}   max {hmax_s}")
        print(f"  -> {choices[gpu][0]}: {choices[gpu][1]}")
    if args.write_calibrations:
        out_dir = Path(args.write_calibrations)
        out_dir.mkdir(parents=True, exist_ok=True)
        for gpu, (ship, _) in choices.items():
            path = out_dir / f"{gpu}-public.json"
            if ship == "M0":
                if path.exists():
                    path.unlink()
                continue
            doc = calibration_doc(gpu, groups[gpu][0], groups[gpu][1], ship, csv_rel)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(doc, indent=1) + "\n")
            tmp.replace(path)
            print(f"wrote {path}")
    if args.md:
        md_path = Path(args.md)
        section = markdown(groups, choices, csv_rel)
        text = md_path.read_text() if md_path.exists() else ""
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + section + rest.split(END, 1)[1]
        else:
            text = text.rstrip() + "\n\n" + section + "\n"
        md_path.write_text(text)
        print(f"wrote the public-fit section of {md_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
