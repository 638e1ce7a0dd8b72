"""Fit the planner's free terms on probe records (numpy least squares) and write a calibration.

    python -m probes.calibrate RECORDS.jsonl [MORE.jsonl ...] --gpu PROFILE --out CAL.json

Every successful ``step`` record (probes/cuda_probe.py) measured on a GPU is paired with the
planner's estimate for the same model (the proxy actually built), training, candidate and world
size, computed with the *default* overheads. Each term is then fitted on the quantity it
predicts, with the terms before it taken from the measurement, not the model:

=================================  ===========================================================
term                               fitted as (least squares over records i)
=================================  ===========================================================
cuda_context_bytes,                ``y_i = ctx + c_i * nccl`` where ``y_i`` = device used -
nccl_bytes_per_communicator        reserved (minus the probe's own 1-rank NCCL buffers at world
                                   size 1) and ``c_i`` the planner's communicator count; when
                                   every ``c_i`` is equal, nccl is the median measured growth
                                   across the first collective (world size > 1 only)
allocator_fragmentation            ``R_i - L_i = (1 + f) * A_i`` (measured reserved R and
                                   allocated A; L the planner's step-leftover term)
activation_scale[family]           ``A_i - (P_i - act_i) = s * act_i`` (P predicted allocated,
                                   act its activation term at the peak)
compute_efficiency                 ``t_i - o_i = x_i / e`` (t measured step time, o the planner's
                                   exposed communication + offload time, x = FLOPs / peak)
intra_node_comm_efficiency         median over ops of the largest size's bus bandwidth / the
                                   profile's intra-node link bandwidth (world size > 1)
=================================  ===========================================================

Each fitted value carries its number of records, residuals (RMS and max, in the term's
unit), the median relative error of the quantity it predicts, and a leave-one-out held-out
error when there are at least 3 records. A term with no usable record stays ``null`` (the
planner keeps its default). The document is written atomically.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from planner.calibration import SCHEMA_VERSION, architecture_family, parse_calibration
from planner.errors import InputDataError
from planner.memory import Estimate, Overheads, estimate, shard_degree
from planner.spec import (
    Candidate,
    Cluster,
    GpuProfile,
    ModelSpec,
    Offload,
    Strategy,
    TrainingSpec,
)

__all__ = ["fit_records", "leftover_bytes", "lstsq", "loo_relative_errors", "n_communicators",
           "write_calibration", "Paired", "pair_records"]


# --------------------------------------------------------------------------- helpers


def lstsq(X: Sequence[Sequence[float]] | np.ndarray, y: Sequence[float] | np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """(coefficients, residuals y - X @ coef) of an ordinary least-squares fit."""
    Xa = np.asarray(X, dtype=float)
    ya = np.asarray(y, dtype=float)
    if Xa.ndim == 1:
        Xa = Xa[:, None]
    coef, *_ = np.linalg.lstsq(Xa, ya, rcond=None)
    return coef, ya - Xa @ coef


def loo_relative_errors(n: int, fit: Callable[[np.ndarray], Any],
                        predict: Callable[[Any, int], float], measured: Sequence[float]
                        ) -> list[float]:
    """Leave-one-out: for each i, fit on the others (``fit(mask)``) and return
    |predict(i) - measured_i| / measured_i."""
    out = []
    for i in range(n):
        mask = np.ones(n, dtype=bool)
        mask[i] = False
        params = fit(mask)
        out.append(abs(predict(params, i) - measured[i]) / measured[i])
    return out


def n_communicators(candidate: Candidate, cluster: Cluster) -> int:
    """NCCL communicators the planner counts (planner/memory.py): 0 on one GPU, 2 for
    hybrid_shard across nodes, else 1."""
    if cluster.n_gpus == 1:
        return 0
    s = shard_degree(candidate.strategy, cluster)
    return 2 if candidate.strategy is Strategy.HYBRID_SHARD and s < cluster.n_gpus else 1


def leftover_bytes(est: Estimate, overheads: Overheads) -> int:
    """The structural part of the planner's reserved-over-allocated term (cached segments of
    the previous step): the allocator overhead minus its fragmentation fraction."""
    return (est.peak_reserved_bytes - est.breakdown.total
            - int(est.breakdown.total * overheads.allocator_fragmentation))


def _stats(residuals: np.ndarray, rel: Sequence[float], held: Sequence[float] | None,
           n: int, method: str) -> dict[str, Any]:
    res = np.asarray(residuals, dtype=float)
    return {
        "n": int(n),
        "rms_residual": float(np.sqrt(np.mean(res**2))) if res.size else None,
        "max_abs_residual": float(np.max(np.abs(res))) if res.size else None,
        "relative_error": float(statistics.median(rel)) if rel else None,
        "held_out_error": float(statistics.median(held)) if held else None,
        "method": method,
    }


# --------------------------------------------------------------------------- pairing


@dataclasses.dataclass
class Paired:
    record: dict[str, Any]
    model: ModelSpec
    training: TrainingSpec
    candidate: Candidate
    cluster: Cluster
    est: Estimate


def pair_records(records: Sequence[dict[str, Any]], gpu: GpuProfile,
                 overheads: Overheads | None = None) -> list[Paired]:
    """The successful GPU step records, each with the planner's default estimate."""
    from probes.runner import spec_from_dict

    ov = overheads or Overheads()
    out = []
    for r in records:
        if r.get("record") != "step" or not r.get("ok") or r.get("oom"):
            continue
        if r.get("max_allocated_bytes") is None:
            continue  # a CPU run: no device memory
        try:
            model = spec_from_dict(ModelSpec, r["model"])
            training = spec_from_dict(TrainingSpec, r["training"])
            cand = spec_from_dict(Candidate, r["candidate"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputDataError(f"probe record: bad spec: {exc}") from None
        world = int(r.get("world_size", 1))
        gpn = int(r.get("gpus_per_node") or world)
        cluster = Cluster(gpu=gpu, n_gpus=world, gpus_per_node=max(1, min(gpn, world)),
                          host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)
        est = estimate(model, training, cluster, cand, overheads=ov)
        out.append(Paired(r, model, training, cand, cluster, est))
    return out


# --------------------------------------------------------------------------- the fits


def fit_runtime(pairs: list[Paired]) -> tuple[dict | None, dict | None, list[str]]:
    notes: list[str] = []
    rows = [p for p in pairs if p.record.get("runtime_overhead_bytes") is not None]
    if not rows:
        return None, None, ["runtime overhead: no record with device used"]
    y, c = [], []
    for p in rows:
        k = float(p.record["runtime_overhead_bytes"])
        if p.cluster.n_gpus == 1:
            k -= float(p.record.get("nccl_buffer_bytes") or 0)  # the probe's own 1-rank comm
        y.append(k)
        c.append(n_communicators(p.candidate, p.cluster))
    y_a, c_a = np.asarray(y), np.asarray(c, dtype=float)
    nccl_meas = [float(p.record["nccl_buffer_bytes"]) for p in rows
                 if p.cluster.n_gpus > 1 and p.record.get("nccl_buffer_bytes") is not None]
    if len(set(c)) > 1:
        X = np.column_stack([np.ones_like(c_a), c_a])
        coef, res = lstsq(X, y_a)
        ctx, nccl = float(coef[0]), float(coef[1])
        method = "least squares of device used - reserved on [1, communicators]"

        def fit(mask: np.ndarray) -> np.ndarray:
            return lstsq(X[mask], y_a[mask])[0]

        def pred(params: np.ndarray, i: int) -> float:
            return float(X[i] @ params)
    else:
        nccl = float(np.median(nccl_meas)) if nccl_meas else float("nan")
        known = 0.0 if np.isnan(nccl) else nccl
        coef, res = lstsq(np.ones((len(y), 1)), y_a - c_a * known)
        ctx = float(coef[0])
        method = ("mean of device used - reserved - communicators x measured NCCL growth"
                  if c[0] else "mean of device used - reserved (one GPU: no NCCL term)")

        def fit(mask: np.ndarray) -> float:
            return float(np.mean((y_a - c_a * known)[mask]))

        def pred(params: float, i: int) -> float:
            return params + c_a[i] * known
        if np.isnan(nccl):
            notes.append("nccl_bytes_per_communicator: not fitted (world size 1 only; NCCL "
                         "buffers need >= 2 GPUs)")
    held = loo_relative_errors(len(y), fit, pred, y) if len(y) >= 3 else None
    # relative error of the device-used prediction implied by the fitted overhead
    used = [float(p.record["device_used_bytes"]) for p in rows]
    rel = [abs(r) / u for r, u in zip(res, used)]
    ctx_v = {"value": int(round(max(ctx, 0.0))), **_stats(res, rel, None, len(y), method)}
    ctx_v["held_out_error"] = (float(statistics.median(
        abs(h * yy) / u for h, yy, u in zip(held, y, used))) if held else None)
    nccl_v = None
    if not np.isnan(nccl):
        nccl_v = {"value": int(round(max(nccl, 0.0))), "n": len(nccl_meas) or len(y),
                  "method": "median growth of device used - reserved across the first "
                            "collective" if len(set(c)) <= 1 else method}
    return ctx_v, nccl_v, notes


def fit_fragmentation(pairs: list[Paired], ov: Overheads) -> dict | None:
    rows = [p for p in pairs if p.record.get("max_reserved_bytes")]
    if not rows:
        return None
    A = np.array([float(p.record["max_allocated_bytes"]) for p in rows])
    R = np.array([float(p.record["max_reserved_bytes"]) for p in rows])
    L = np.array([float(leftover_bytes(p.est, ov)) for p in rows])
    coef, res = lstsq(A, R - L)
    f = float(coef[0]) - 1.0
    rel = list(np.abs(res) / R)
    held = loo_relative_errors(
        len(rows), lambda m: lstsq(A[m], (R - L)[m])[0][0],
        lambda a, i: float(a * A[i] + L[i]), list(R)) if len(rows) >= 3 else None
    return {"value": min(max(f, 0.0), 2.0),
            **_stats(res, rel, held, len(rows), "least squares of reserved - leftover on "
                     "measured allocated (value = slope - 1)")}


def fit_activation_scale(pairs: list[Paired]) -> dict[str, dict]:
    by_fam: dict[str, list[Paired]] = {}
    for p in pairs:
        if p.est.breakdown.activations > 0:
            by_fam.setdefault(architecture_family(p.model), []).append(p)
    out = {}
    for fam, rows in sorted(by_fam.items()):
        act = np.array([float(p.est.breakdown.activations) for p in rows])
        rest = np.array([float(p.est.peak_allocated_bytes - p.est.breakdown.activations)
                         for p in rows])
        A = np.array([float(p.record["max_allocated_bytes"]) for p in rows])
        coef, res = lstsq(act, A - rest)
        s = float(coef[0])
        rel = list(np.abs(res) / A)
        held = loo_relative_errors(
            len(rows), lambda m: lstsq(act[m], (A - rest)[m])[0][0],
            lambda k, i: float(rest[i] + k * act[i]), list(A)) if len(rows) >= 3 else None
        out[fam] = {"value": min(max(s, 0.1), 10.0),
                    **_stats(res, rel, held, len(rows), "least squares of measured allocated "
                             "- predicted non-activation terms on the activation term")}
    return out


def fit_compute_efficiency(pairs: list[Paired]) -> dict | None:
    from planner.throughput import estimate_step, peak_flops

    rows = [p for p in pairs if p.record.get("step_time_s") and p.candidate.offload is Offload.NONE]
    if not rows:
        return None
    x, y, t = [], [], []
    for p in rows:
        st = estimate_step(p.model, p.training, p.cluster, p.candidate)
        peak = peak_flops(p.cluster.gpu, p.training.precision)
        flops = float(p.record["flops_per_step_per_rank"])
        ts = float(p.record["step_time_s"])
        x.append(flops / peak)
        y.append(ts - (st.step_time_s - st.compute_s))
        t.append(ts)
    xa, ya, ta = np.asarray(x), np.asarray(y), np.asarray(t)
    coef, res = lstsq(xa, ya)
    inv = float(coef[0])
    if inv <= 0:
        return None
    other = ta - ya
    rel = list(np.abs(res) / ta)
    held = loo_relative_errors(
        len(rows), lambda m: lstsq(xa[m], ya[m])[0][0],
        lambda k, i: float(k * xa[i] + other[i]), list(ta)) if len(rows) >= 3 else None
    return {"value": min(1.0, 1.0 / inv),
            **_stats(res, rel, held, len(rows), "least squares of step time - predicted "
                     "exposed communication on FLOPs / peak (value = 1 / slope)")}


def fit_link(records: Sequence[dict[str, Any]], gpu: GpuProfile) -> dict | None:
    effs = []
    for r in records:
        if r.get("record") != "collectives" or (r.get("env") or {}).get("device") != "cuda":
            continue
        world = int(r.get("world_size", 1))
        gpn = int(r.get("gpus_per_node") or world)
        if world < 2 or world > gpn:
            continue
        sweep = r.get("bandwidth") or []
        if not sweep:
            continue
        top = max(s["bytes"] for s in sweep)
        for s in sweep:
            if s["bytes"] == top and s.get("busbw_bytes_per_s"):
                effs.append(s["busbw_bytes_per_s"] / gpu.intra_node_bandwidth_bytes_per_s)
    if not effs:
        return None
    v = float(np.median(effs))
    return {"value": min(max(v, 1e-3), 1.0), "n": len(effs),
            "rms_residual": float(np.std(effs)), "max_abs_residual":
            float(np.max(np.abs(np.asarray(effs) - v))), "relative_error": None,
            "held_out_error": None,
            "method": "median of bus bandwidth / link bandwidth at the largest size"}


# --------------------------------------------------------------------------- the document


def fit_records(records: Sequence[dict[str, Any]], gpu: GpuProfile,
                overheads: Overheads | None = None, *, keep_records: bool = True
                ) -> dict[str, Any]:
    """The calibration document for ``gpu`` from probe records (raises InputDataError when
    no record was measured on a GPU)."""
    ov = overheads or Overheads()
    pairs = pair_records(records, gpu, ov)
    link = fit_link(records, gpu)
    if not pairs and link is None:
        raise InputDataError("calibration: no successful GPU step record to fit (CPU runs and "
                             "OOM records carry no device memory)")
    env = next((r.get("env") for r in records if r.get("env")), {}) or {}
    notes: list[str] = []
    ctx, nccl, n1 = fit_runtime(pairs) if pairs else (None, None, [])
    notes += n1
    frag = fit_fragmentation(pairs, ov) if pairs else None
    acts = fit_activation_scale(pairs) if pairs else {}
    eff = fit_compute_efficiency(pairs) if pairs else None
    if link is None:
        notes.append("intra_node_comm_efficiency: not fitted (needs a collectives record with "
                     ">= 2 GPUs on one node)")
    notes.append("inter_node_comm_efficiency: not fitted (single-node probes)")
    if any(p.record.get("proxy") for p in pairs):
        notes.append("some records ran a depth-reduced proxy (n_layers_used); the planner was "
                     "evaluated on the proxy")
    date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    torch_v = env.get("torch")
    doc = {
        "schema_version": SCHEMA_VERSION,
        "id": f"{gpu.id}-torch{(torch_v or 'unknown').split('+')[0]}-{date}",
        "source": "probe: fitcheck probe records (probes/cuda_probe.py)",
        "gpu": {"profile": gpu.id, "name": env.get("gpu_name") or gpu.name,
                "memory_bytes": int(env.get("memory_total_bytes") or gpu.memory_bytes)},
        "versions": {k: env.get(k) for k in ("driver", "cuda", "torch", "nccl")},
        "date": date,
        "values": {
            "cuda_context_bytes": ctx,
            "nccl_bytes_per_communicator": nccl,
            "allocator_fragmentation": frag,
            "activation_scale": acts,
            "compute_efficiency": eff,
            "intra_node_comm_efficiency": link,
            "inter_node_comm_efficiency": None,
        },
        "notes": notes,
        "records": list(records) if keep_records else [],
    }
    parse_calibration(json.loads(json.dumps(doc)), "<fitted>")  # the planner must read it
    return doc


def write_calibration(doc: dict[str, Any], path: str | os.PathLike[str]) -> None:
    p = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    tmp = os.path.join(os.path.dirname(p), f".{os.path.basename(p)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def main(argv: list[str] | None = None) -> int:
    from probes.records import read_records

    ap = argparse.ArgumentParser(description="Fit a calibration file on probe records.")
    ap.add_argument("records", nargs="+", help="JSONL files written by fitcheck probe")
    ap.add_argument("--gpu", required=True, help="hardware profile id the records were run on")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from planner.hardware import load_gpu

    try:
        gpu = load_gpu(args.gpu)
        records = [r for path in args.records for r in read_records(path)]
        doc = fit_records(records, gpu)
    except InputDataError as exc:
        print(f"fitcheck: error: {exc}", file=sys.stderr)
        return 4
    write_calibration(doc, args.out)
    for k, v in doc["values"].items():
        if k == "activation_scale":
            for fam, fv in v.items():
                print(f"activation_scale[{fam}] = {fv['value']:.4g} (n={fv['n']})")
        elif v is not None:
            print(f"{k} = {v['value']:.6g} (n={v['n']})")
        else:
            print(f"{k}: not fitted")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
