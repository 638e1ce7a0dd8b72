"""The GPU calibrations: the planner against the runs of benchmarks/gpu_run.py on one H200
and one H100 (2026-11-26), and each GPU's fitted terms scored on the other.

    python benchmarks/gpu_calibration.py [--runs PROFILE=FOLDER ...] [--write]

For each GPU (``GPUS``: the fitcheck profile, its run folder, its calibration id) reads the
raw records of every ``run*-records.jsonl`` in its folder (probes/gpu_cases.py) and prints,
as Markdown:

1. the runtime terms, assumed vs measured (CUDA context, what the driver keeps, cuBLAS
   workspace, a 1-rank NCCL communicator);
2. per case, the planner's allocated bytes per moment (forward, backward, optimizer step) and
   at the peak against the measured peaks, the reserved peak, the step time;
3. the *least memory* each step needs (the smallest allocator limit under which it ran,
   found by bisection: probes.gpu_cases.least_memory) against the planner's "needed" (peak
   allocated + allocator fragmentation), the term the fit verdict compares with the device;
4. the calibration: each term fitted on one half of the records (sorted by id, even
   positions) and scored on the other half, then the other way round; the planner's error
   before (defaults) and after (fitted) on the held-out half. A term is shipped when its
   held-out median |error| improves by at least 1 %-point over the defaults (the rule of
   benchmarks/public_memory_calibration.py); the shipped value is fitted on all records.
   A case measured in two runs (the same id) falls in one half, never in both.

Then, across the two GPUs: each term measured or fitted on one GPU scored on the other's
records (context, fragmentation, least / allocated, reserved / allocated, the allocated peaks,
the MoE moments, compute efficiency and MFU against the profile's assumed efficiency, the
fit verdicts at the capacity).

The planner is evaluated on the reference module's spec (``probes.models.reference_spec``:
the module the runs built) with the GPU's profile. ``--write`` writes the calibration files
(hardware_profiles/calibrations/<id>.json), the marked sections of docs/calibration.md and
docs/accuracy.md, and tests/data/gpu/torchtitan-style-h200.log (from the H200 records).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from planner.calibration import SCHEMA_VERSION, architecture_family, parse_calibration  # noqa: E402
from planner.hardware import load_gpu  # noqa: E402
from planner.memory import Estimate, Overheads, Phase  # noqa: E402
from planner.spec import Allocator, CompileMode, GpuProfile  # noqa: E402
from planner.throughput import estimate_step, peak_flops  # noqa: E402
from probes import gpu_records  # noqa: E402
from probes.gpu_records import Row, rows_of  # noqa: E402

GiB, MiB = 2**30, 2**20
CAL_DIR = REPO / "hardware_profiles" / "calibrations"


@dataclasses.dataclass(frozen=True)
class GpuRun:
    profile: str
    """The fitcheck hardware profile id (``--gpu``)."""
    label: str
    """The GPU in prose."""
    runs: Path
    """The folder of ``run*-records.jsonl``."""
    cal_id: str
    """The calibration file's id (and name, + .json)."""


GPUS: tuple[GpuRun, ...] = (
    GpuRun("h200", "H200", REPO / "benchmarks" / "gpu_runs" / "2026-11-26-h200",
           "h200-torch2.11.0-2026-11-26"),
    GpuRun("h100-80", "H100", REPO / "benchmarks" / "gpu_runs" / "2026-11-26-h100",
           "h100-80-torch2.11.0-2026-11-26"),
)
BEGIN, END = "<!-- gpu-run:begin -->", "<!-- gpu-run:end -->"
ACC_BEGIN, ACC_END = "<!-- gpu-run-accuracy:begin -->", "<!-- gpu-run-accuracy:end -->"
SHIP_GAIN = 0.01
"""Ship a fitted term only if its held-out median |error| is this much better (rule of
benchmarks/public_memory_calibration.py)."""


# --------------------------------------------------------------------------- reading


def read_runs(folder: Path) -> list[dict[str, Any]]:
    out = gpu_records.read_runs(folder)
    if not out:
        raise SystemExit(f"gpu_calibration: no run*-records.jsonl in {folder}")
    return out


def needed(e: Estimate) -> int:
    """The planner's bytes needed at the peak moment inside the allocator: allocated +
    what the allocator cannot give back (what the fit verdict adds context and NCCL to)."""
    return int(e.breakdown.total + e.allocator_overhead_bytes)


def backward_peak(e: Estimate) -> int:
    return max(e.phases[p].total for p in (Phase.LOSS_BWD, Phase.BLOCK_BWD, Phase.BWD_END))


def pct(pred: float, meas: float) -> str:
    return f"{(pred - meas) / meas * 100:+.1f}%"


def median_abs(errs: list[float]) -> float:
    return statistics.median(abs(e) for e in errs) if errs else float("nan")


def p90_abs(errs: list[float]) -> float:
    if not errs:
        return float("nan")
    s = sorted(abs(e) for e in errs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def halves(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    """The rows whose ids are at even / odd positions among the sorted distinct ids (a case
    measured in two runs falls in one half)."""
    ids = sorted({r.id for r in rows})
    first = set(ids[0::2])
    s = sorted(rows, key=lambda r: (r.id, r.rec["_run"]))
    return [r for r in s if r.id in first], [r for r in s if r.id not in first]


# --------------------------------------------------------------------------- the terms


def runtime_table(records: list[dict[str, Any]], gpu: GpuProfile, ov: Overheads,
                  fake_rows: list[Row], nccl_rows: list[Row],
                  label: str) -> tuple[str, dict[str, Any]]:
    rt = [r for r in records if r.get("record") == "runtime_terms"]
    nc = [r for r in records if r.get("record") == "runtime_nccl"]
    total = next(r["device_total_bytes"] for r in records
                 if r.get("record") == "least_memory" and r.get("device_total_bytes"))

    def pt(rec: dict[str, Any], name: str) -> dict[str, Any]:
        return next(p for p in rec["points"] if p["point"].startswith(name))

    ctx_after_init = [pt(r, "context")["device_used"] for r in rt]
    ws = [pt(r, "bf16_matmul")["allocated"] - pt(r, "bf16_operands")["allocated"] for r in rt]
    nccl = [pt(r, "first all_reduce")["device_used"] - pt(r, "nccl init")["device_used"]
            - (pt(r, "first all_reduce")["reserved"] - pt(r, "nccl init")["reserved"])
            for r in nc]
    ovh_fake = [r.rec["runtime_overhead_bytes"] for r in fake_rows if r.rec.get("ok")]
    ovh_nccl = [r.rec["runtime_overhead_bytes"] for r in nccl_rows if r.rec.get("ok")]
    nvml_gap = [p["nvml_used"] - p["device_used"] for r in rt for p in r["points"]
                if p.get("nvml_used") is not None]
    driver_keeps = gpu.memory_bytes - total
    ctx_profile_frame = int(statistics.median(ovh_fake)) + driver_keeps
    lines = [
        f"| term | assumed (planner default) | measured on the {label} | how measured |",
        "|---|---:|---:|---|",
        f"| memory the allocator can reach | {gpu.memory_bytes / GiB:.2f} GiB (profile: "
        f"nvidia-smi total) | {total / GiB:.2f} GiB | `torch.cuda.mem_get_info` total; the "
        f"{driver_keeps / MiB:.0f} MiB gap is what NVML counts as used on an idle device "
        f"(NVML used - mem_get_info used = {statistics.median(nvml_gap) / MiB:.0f} MiB at "
        f"every point) |",
        f"| CUDA context at `torch.cuda.init()` | - | {statistics.median(ctx_after_init) / MiB:.0f}"
        f" MiB | device used right after init ({len(rt)} process{'es' if len(rt) != 1 else ''}) |",
        f"| context + lazily loaded kernels + cuBLAS handles, after training steps | "
        f"{gpu.cuda_context_bytes / MiB:.0f} MiB | {statistics.median(ovh_fake) / MiB:.0f} MiB "
        f"(min {min(ovh_fake) / MiB:.0f}, max {max(ovh_fake) / MiB:.0f}) | device used - "
        f"reserved after the measured steps, {len(ovh_fake)} cases in fake-group processes "
        f"(no NCCL) |",
        f"| the same in the planner's frame (capacity = nvidia-smi total) | "
        f"{gpu.cuda_context_bytes / MiB:.0f} MiB | {ctx_profile_frame / MiB:.0f} MiB | the "
        f"line above + the driver's {driver_keeps / MiB:.0f} MiB |",
        f"| cuBLAS + cuBLASLt workspace | {ov.cublas_workspace_bytes / MiB:.0f} MiB | "
        f"{statistics.median(ws) / MiB:.0f} MiB | allocated growth at the first bf16 matmul "
        f"(the workspace comes from the caching allocator) |",
        f"| NCCL, one 1-rank communicator | {ov.nccl_bytes_per_communicator / MiB:.0f} MiB per "
        f"communicator (not counted at 1 GPU) | {statistics.median(nccl) / MiB:.0f} MiB "
        f"(runtime part); {(statistics.median(ovh_nccl) - statistics.median(ovh_fake)) / MiB:.0f}"
        f" MiB (cases with a 1-rank NCCL group - fake-group cases) | device-used growth "
        f"across the first all_reduce minus reserved growth; a 1-rank communicator has no "
        f"peers, so this is not the multi-GPU value |",
    ]
    facts = {"driver_keeps": driver_keeps, "ctx_profile_frame": ctx_profile_frame,
             "ovh_fake": ovh_fake, "device_total": total,
             "nccl_1rank": int(statistics.median(nccl)) if nccl else None,
             "ctx_init": int(statistics.median(ctx_after_init)),
             "cublas_ws": int(statistics.median(ws)),
             "nccl_cases": int(statistics.median(ovh_nccl) - statistics.median(ovh_fake)),
             "nvml_gap": int(statistics.median(nvml_gap))}
    return "\n".join(lines), facts


OLD_SAC_NOTE = (
    "¹ Measured with the probe's op-level save list from before torchtitan #2095, which has "
    "no `_scaled_dot_product_cudnn_attention`. torch ran SDPA as cuDNN's kernel on these GPUs, "
    "so every block recomputed its attention. The planner keeps the attention output and "
    "logsumexp, as torchtitan's list has since #2095 (docs/accuracy.md §6).")


def old_sac_list(rec: dict[str, Any]) -> bool:
    """A selective SDPA case measured before the probe's save list held cuDNN's SDPA op
    (records without ``sac_save_ops``, probes/gpu_cases.py)."""
    return (rec["candidate"]["checkpointing"] == "selective"
            and rec["training"].get("attention", "sdpa") == "sdpa"
            and "aten._scaled_dot_product_cudnn_attention.default"
            not in rec.get("sac_save_ops", ()))


def case_table(rows: list[Row], ov: Overheads) -> tuple[str, dict[str, list[float]]]:
    lines = ["| case | world | measured peak allocated GiB | planner | err | forward | "
             "backward | optimizer | max reserved GiB | planner | err |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keys = ("peak", "forward", "backward", "optimizer", "reserved")
    errs: dict[str, list[float]] = {k: [] for k in keys}
    moe: dict[str, list[float]] = {k: [] for k in keys}
    seen: dict[str, int] = {}
    marked = False
    for r in rows:
        seen[r.id] = seen.get(r.id, 0) + 1
    for r in sorted(rows, key=lambda x: (x.rec["_run"], x.rec["part"], x.id)):
        e = r.est(ov)
        rec = r.rec
        name = f"{r.id} ({rec['_run']})" if seen[r.id] > 1 else r.id
        if old_sac_list(rec):
            name += " ¹"
            marked = True
        w = f"{r.cluster.n_gpus}{' (fake)' if rec.get('fake_group') else ''}"
        if not rec["ok"]:
            verdict = ("does not fit" if needed(e) + r.cluster.gpu.cuda_context_bytes
                       > r.cluster.gpu.memory_bytes else "fits")
            lines.append(f"| {name} | {w} | out of memory ({rec['oom_moment']}) | "
                         f"{e.peak_allocated_bytes / GiB:.2f} | planner at 0 margin: "
                         f"{verdict} | | | | | | |")
            continue
        into = moe if r.model.is_moe else errs
        mo = rec["moments"]
        pm = {"forward": e.phases[Phase.FORWARD].total, "backward": backward_peak(e),
              "optimizer": e.phases[Phase.OPTIMIZER].total}
        cells = []
        for k in ("forward", "backward", "optimizer"):
            cells.append(pct(pm[k], mo[k]["allocated"]))
            into[k].append((pm[k] - mo[k]["allocated"]) / mo[k]["allocated"])
        a, res = rec["max_allocated_bytes"], rec["max_reserved_bytes"]
        into["peak"].append((e.peak_allocated_bytes - a) / a)
        into["reserved"].append((e.peak_reserved_bytes - res) / res)
        lines.append(f"| {name} | {w} | {a / GiB:.2f} | {e.peak_allocated_bytes / GiB:.2f} | "
                     f"{pct(e.peak_allocated_bytes, a)} | {' | '.join(cells)} | "
                     f"{res / GiB:.2f} | {e.peak_reserved_bytes / GiB:.2f} | "
                     f"{pct(e.peak_reserved_bytes, res)} |")
    lines.append("")
    if marked:
        lines += [OLD_SAC_NOTE, ""]
    for label, d in (("dense", errs), ("MoE", moe)):
        lines.append(f"Median |error| (p90) over the {len(d['peak'])} {label} cases that ran: "
                     + "; ".join(f"{k} {median_abs(v) * 100:.1f}% ({p90_abs(v) * 100:.1f}%)"
                                 for k, v in d.items()) + "  ")
    return "\n".join(lines), errs


# --------------------------------------------------------------------------- fits


def fit_fragmentation(rows: list[Row]) -> float:
    """least = (1 + f) * measured allocated peak, least squares (through the origin)."""
    a = [float(r.rec["max_allocated_bytes"]) for r in rows]
    y = [float(r.rec["least_limit_ok_bytes"]) for r in rows]
    return sum(x * v for x, v in zip(a, y)) / sum(x * x for x in a) - 1.0


def need_errors(rows: list[Row], ov: Overheads) -> list[float]:
    out = []
    for r in rows:
        e = r.est(ov)
        least = r.rec["least_limit_ok_bytes"]
        out.append((needed(e) - least) / least)
    return out


def fit_efficiency(rows: list[Row]) -> float:
    """step time = FLOPs / (peak * e) at world size 1 (no communication): least squares of
    t on FLOPs / peak through the origin, e = 1 / slope."""
    x = [r.rec["flops_per_step"] / peak_flops(r.cluster.gpu, r.training.precision)
         for r in rows]
    t = [r.rec["step_time_s"] for r in rows]
    return sum(v * v for v in x) / sum(v * tt for v, tt in zip(x, t))


def time_errors(rows: list[Row], eff: float | None, compute_only: bool = False) -> list[float]:
    """(predicted - measured) / measured step time; ``compute_only``: the planner's compute
    time alone (fake-group runs, whose collectives take no time)."""
    out = []
    for r in rows:
        gpu = r.cluster.gpu if eff is None else dataclasses.replace(
            r.cluster.gpu, compute_efficiency=eff)
        cl = dataclasses.replace(r.cluster, gpu=gpu)
        st = estimate_step(r.model, r.training, cl, r.cand)
        pred = st.compute_s if compute_only else st.step_time_s
        out.append((pred - r.rec["step_time_s"]) / r.rec["step_time_s"])
    return out


def score_frag(rows: list[Row], f: float) -> list[float]:
    return need_errors(rows, dataclasses.replace(Overheads(), allocator_fragmentation=f))


def fit_scale(rows: list[Row]) -> float:
    """The activation scale s of allocated peak = rest + s * activations, least squares."""
    num = den = 0.0
    for r in rows:
        e = r.est(Overheads())
        act = float(e.breakdown.activations)
        rest = float(e.peak_allocated_bytes) - act
        num += act * (r.rec["max_allocated_bytes"] - rest)
        den += act * act
    return num / den if den else 1.0


def score_scale(rows: list[Row], s: float) -> list[float]:
    o = dataclasses.replace(Overheads(), activation_scale=s)
    return [(r.est(o).peak_allocated_bytes - r.rec["max_allocated_bytes"])
            / r.rec["max_allocated_bytes"] for r in rows]


def held_out(rows: list[Row], fit, score) -> dict[str, Any]:
    """Fit on one half, score the other, both ways round: the scored errors together."""
    a, b = halves(rows)
    errs: list[float] = []
    values = []
    for fit_on, score_on in ((a, b), (b, a)):
        v = fit(fit_on)
        values.append(v)
        errs += score(score_on, v)
    return {"values": values, "errors": errs}


# --------------------------------------------------------------------------- main


def analyse(run: GpuRun, folder: Path | None = None) -> dict[str, Any]:
    gpu = load_gpu(run.profile)
    ov = Overheads()
    records = read_runs(folder or run.runs)
    env = next(r for r in records if r.get("record") == "env")
    cases = rows_of(records, "case", gpu)
    least = [r for r in rows_of(records, "least_memory", gpu) if r.rec.get("ok")]
    fake = [r for r in cases if r.rec.get("fake_group")]
    nccl = [r for r in cases if not r.rec.get("fake_group")]
    runtime_md, facts = runtime_table(records, gpu, ov, fake, nccl, run.label)
    cases_md, case_errs = case_table(cases, ov)

    # least memory: default allocator / expandable segments
    least_default = [r for r in least if r.training.allocator is Allocator.DEFAULT]
    least_exp = [r for r in least if r.training.allocator is Allocator.EXPANDABLE]
    least_lines = ["| case | allocated peak GiB | least limit GiB | least / allocated | max "
                   "reserved GiB | planner needed GiB | err (defaults) |",
                   "|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(least, key=lambda x: x.id):
        e = r.est(ov)
        a, lim = r.rec["max_allocated_bytes"], r.rec["least_limit_ok_bytes"]
        least_lines.append(f"| {r.id}{' (expandable)' if r in least_exp else ''} | "
                           f"{a / GiB:.2f} | {lim / GiB:.2f} | {lim / a:.3f} | "
                           f"{r.rec['max_reserved_bytes'] / GiB:.2f} | {needed(e) / GiB:.2f} | "
                           f"{pct(needed(e), lim)} |")
    ratios = [r.rec["least_limit_ok_bytes"] / r.rec["max_allocated_bytes"] - 1
              for r in least_default]

    # fragmentation: held out
    frag = held_out(least_default, fit_fragmentation, score_frag)
    frag_before = need_errors(least_default, ov)
    frag_all = fit_fragmentation(least_default)

    # compute efficiency: eager world-1 cases (no communication, no compile)
    eager1 = [r for r in nccl if r.rec["ok"] and r.training.compile is CompileMode.NONE]
    eff = held_out(eager1, fit_efficiency, time_errors)
    eff_before = time_errors(eager1, None)
    eff_all = fit_efficiency(eager1)
    # fake-group cases: compute-only steps of the 8B/Mixtral shapes (collectives move nothing)
    fake_ok = [r for r in fake if r.rec["ok"]]
    fake_t = time_errors(fake_ok, eff_all, compute_only=True)
    fake_t0 = time_errors(fake_ok, None, compute_only=True)

    # activation scale: allocated peaks already agree; fitted per family for the record
    dense_ok = [r for r in cases if r.rec["ok"] and architecture_family(r.model) ==
                "decoder-swiglu-gqa"]
    scale = held_out(dense_ok, fit_scale, score_scale)
    scale_before = score_scale(dense_ok, 1.0)

    return dict(run=run, gpu=gpu, ov=ov, env=env, records=records,
                runs=sorted({r["_run"] for r in records}), cases=cases, least=least,
                least_default=least_default, least_exp=least_exp, runtime_md=runtime_md,
                facts=facts, cases_md=cases_md, case_errs=case_errs,
                least_md="\n".join(least_lines), ratios=ratios, frag=frag,
                frag_before=frag_before, frag_all=frag_all, eff=eff, eff_before=eff_before,
                eff_all=eff_all, eager1=eager1, fake_t=fake_t, fake_t0=fake_t0,
                fake_ok=fake_ok, scale=scale, scale_before=scale_before, dense_ok=dense_ok)


def decisions(a: dict[str, Any]) -> dict[str, bool]:
    def better(before: list[float], after: list[float]) -> bool:
        return median_abs(before) - median_abs(after) >= SHIP_GAIN

    return {"allocator_fragmentation": better(a["frag_before"], a["frag"]["errors"]),
            "compute_efficiency": better(a["eff_before"], a["eff"]["errors"]),
            "activation_scale": better(a["scale_before"], a["scale"]["errors"]),
            "cuda_context_bytes": True}


def calibration_doc(a: dict[str, Any], ship: dict[str, bool]) -> dict[str, Any]:
    run, env, f = a["run"], a["env"], a["facts"]
    ctx_vals = f["ovh_fake"]
    if ship["activation_scale"]:
        raise SystemExit("gpu_calibration: the activation scale beat the defaults held out; "
                         "writing it into the calibration file is not implemented")
    values: dict[str, Any] = {
        "cuda_context_bytes": {
            "value": f["ctx_profile_frame"], "n": len(ctx_vals),
            "rms_residual": statistics.pstdev(ctx_vals), "max_abs_residual":
            max(abs(v - statistics.median(ctx_vals)) for v in ctx_vals),
            "relative_error": None, "held_out_error": None,
            "method": "median of device used - reserved after the steps (fake-group cases: "
                      "context, lazily loaded kernels, cuBLAS handles) + the memory the "
                      "driver keeps (nvidia-smi total - mem_get_info total)"},
        "nccl_bytes_per_communicator": None,
        "activation_scale": {},
        "intra_node_comm_efficiency": None,
        "inter_node_comm_efficiency": None,
    }
    if ship["allocator_fragmentation"]:
        errs = a["frag"]["errors"]
        values["allocator_fragmentation"] = {
            "value": round(a["frag_all"], 4), "n": len(a["least_default"]),
            "rms_residual": None, "max_abs_residual": None,
            "relative_error": median_abs(need_errors(a["least_default"], dataclasses.replace(
                a["ov"], allocator_fragmentation=a["frag_all"]))),
            "held_out_error": median_abs(errs),
            "method": "least squares of the least allocator limit a step ran under on its "
                      "measured allocated peak (value = slope - 1); held out: fitted on half "
                      "the cases, scored on the other half, both ways"}
    else:
        values["allocator_fragmentation"] = None
    if ship["compute_efficiency"]:
        values["compute_efficiency"] = {
            "value": round(a["eff_all"], 4), "n": len(a["eager1"]), "rms_residual": None,
            "max_abs_residual": None,
            "relative_error": median_abs(time_errors(a["eager1"], a["eff_all"])),
            "held_out_error": median_abs(a["eff"]["errors"]),
            "method": "least squares of the eager step time on FLOPs / bf16 dense peak at "
                      "world size 1 (value = 1 / slope); held out: fitted on half the "
                      "cases, scored on the other half, both ways"}
    else:
        values["compute_efficiency"] = None
    exp = [r.rec["least_limit_ok_bytes"] / r.rec["max_allocated_bytes"] - 1
           for r in a["least_exp"]]
    folder = f"benchmarks/gpu_runs/{run.runs.name}/"
    smi = (env.get("nvidia_smi") or {}).get("gpus", [{}])[0]
    doc = {
        "schema_version": SCHEMA_VERSION, "id": run.cal_id,
        "source": f"probe: benchmarks/gpu_run.py on one {run.label} (records in {folder}), "
                  "fitted by benchmarks/gpu_calibration.py",
        "gpu": {"profile": run.profile, "name": smi.get("name"),
                "memory_bytes": int(f["device_total"])},
        "versions": {"driver": smi.get("driver_version"), "cuda": env.get("cuda"),
                     "torch": env.get("torch"), "nccl": env.get("nccl")},
        "date": "2026-11-26",
        "values": values,
        "notes": [
            "one GPU: NCCL buffers and link efficiencies are not fitted (a 1-rank "
            "communicator measured "
            f"{(f['nccl_1rank'] or 0) / MiB:.0f} MiB; it has no peers)",
            "cuda_context_bytes is in the profile's frame: capacity = the nvidia-smi total, "
            "so it includes the memory the driver keeps",
            "expandable segments: the least limit was within "
            f"{math.ceil(max(exp) * 100)} % of the allocated peak ({len(exp)} cases, too few "
            "to ship: the 0.02 default stays)",
            f"raw records: {folder}",
        ],
        "records": [],
    }
    parse_calibration(json.loads(json.dumps(doc)), "<fitted>")
    return doc


def head_line(a: dict[str, Any]) -> str:
    env, run = a["env"], a["run"]
    smi = (env.get("nvidia_smi") or {}).get("gpus", [{}])[0]
    return (f"Records: `benchmarks/gpu_runs/{run.runs.name}/` ({len(a['runs'])} runs of "
            f"`benchmarks/gpu_run.py`, one {smi.get('name')}, driver "
            f"{smi.get('driver_version')}, torch {env['torch']}, CUDA {env['cuda']}, NCCL "
            f"{env['nccl']}, 2026-11-26); the planner with the `{run.profile}` profile.")


def report(a: dict[str, Any], ship: dict[str, bool]) -> tuple[str, str]:
    """One GPU's part of the calibration.md and accuracy.md sections."""
    label = a["run"].label
    fr, ef, sc = a["frag"], a["eff"], a["scale"]
    rat = a["ratios"]
    calib = [
        f"### {label}", "", head_line(a), "",
        f"#### {label}: runtime terms, assumed vs measured", "", a["runtime_md"], "",
        f"#### {label}: the least memory a step needs", "",
        "The caching allocator's reserved peak overstates what a step needs: before it raises "
        "out-of-memory it frees its cached blocks and retries (c10/cuda/"
        "CUDACachingAllocator.cpp). Each step below was re-run under "
        "`torch.cuda.set_per_process_memory_fraction` limits, bisected to 256 MiB (or 0.5 %), "
        "after two unconstrained steps; the least limit it ran under is the need the fit "
        "verdict compares with the device.", "",
        a["least_md"], "",
        f"Default allocator, {len(rat)} cases: least / allocated - 1 has median "
        f"{statistics.median(rat) * 100:.1f}%, max {max(rat) * 100:.1f}% (planner default "
        f"{a['ov'].allocator_fragmentation * 100:.0f}%). With expandable segments: "
        + ", ".join(f"{r.rec['least_limit_ok_bytes'] / r.rec['max_allocated_bytes'] - 1:.1%}"
                    for r in a["least_exp"]) +
        " (planner: none; its expandable-segment terms are releasable cache).", "",
        f"#### {label}: the calibration, held out", "",
        "| term | default | fitted (half A / half B / all) | held-out median abs err before "
        "-> after (p90) | shipped |",
        "|---|---:|---:|---|:-:|",
        f"| allocator_fragmentation (needed vs least limit, {len(a['least_default'])} cases) | "
        f"{a['ov'].allocator_fragmentation:.3f} | {fr['values'][0]:.3f} / {fr['values'][1]:.3f}"
        f" / {a['frag_all']:.3f} | {median_abs(a['frag_before']) * 100:.1f}% "
        f"({p90_abs(a['frag_before']) * 100:.1f}%) -> {median_abs(fr['errors']) * 100:.1f}% "
        f"({p90_abs(fr['errors']) * 100:.1f}%) | {'yes' if ship['allocator_fragmentation'] else 'no'} |",
        f"| compute_efficiency (eager step time at world size 1, {len(a['eager1'])} cases) | "
        f"{a['gpu'].compute_efficiency:.3f} | {ef['values'][0]:.3f} / {ef['values'][1]:.3f} / "
        f"{a['eff_all']:.3f} | {median_abs(a['eff_before']) * 100:.1f}% "
        f"({p90_abs(a['eff_before']) * 100:.1f}%) -> {median_abs(ef['errors']) * 100:.1f}% "
        f"({p90_abs(ef['errors']) * 100:.1f}%) | {'yes' if ship['compute_efficiency'] else 'no'} |",
        f"| activation_scale decoder-swiglu-gqa (allocated peak, {len(a['dense_ok'])} cases) | "
        f"1.000 | {sc['values'][0]:.3f} / {sc['values'][1]:.3f} / - | "
        f"{median_abs(a['scale_before']) * 100:.1f}% ({p90_abs(a['scale_before']) * 100:.1f}%)"
        f" -> {median_abs(sc['errors']) * 100:.1f}% ({p90_abs(sc['errors']) * 100:.1f}%) | "
        f"{'yes' if ship['activation_scale'] else 'no'} |",
        f"| cuda_context_bytes | {a['gpu'].cuda_context_bytes / MiB:.0f} MiB | "
        f"{a['facts']['ctx_profile_frame'] / MiB:.0f} MiB (a constant: the spread over "
        f"{len(a['facts']['ovh_fake'])} cases is "
        f"{(max(a['facts']['ovh_fake']) - min(a['facts']['ovh_fake'])) / MiB:.0f} MiB) | - | yes |",
        "",
        f"Step times of the fake-group cases (8B / Mixtral shapes; the fake collectives "
        f"take no time, so they are scored against the planner's compute time alone), "
        f"{len(a['fake_ok'])} cases: median signed error "
        f"{statistics.median(a['fake_t0']) * 100:+.1f}% with the default efficiency, "
        f"{statistics.median(a['fake_t']) * 100:+.1f}% with the fitted one (positive: the "
        f"planner predicts slower steps than measured).",
        "",
        f"Shipped: `hardware_profiles/calibrations/{a['run'].cal_id}.json` (values fitted on "
        f"all cases); `--calibration auto` applies it on `--gpu {a['run'].profile}`, and "
        "reports it stale under another torch, CUDA, NCCL or driver branch.",
    ]
    acc = [f"### {label}", "", head_line(a), "",
           f"Allocated bytes per moment, the planner against the {label}:", "",
           a["cases_md"]]
    return "\n".join(calib), "\n".join(acc)


# --------------------------------------------------------------------------- across GPUs


def _first(rows: list[Row]) -> dict[str, Row]:
    """Each case id once: its record in the earliest run."""
    out: dict[str, Row] = {}
    for r in sorted(rows, key=lambda x: x.rec["_run"]):
        out.setdefault(r.id, r)
    return out


def mfu(r: Row) -> float:
    return r.rec["achieved_tflops"] * 1e12 / peak_flops(r.cluster.gpu, r.training.precision)


def verdicts(a: dict[str, Any], ctx: int) -> tuple[int, int, list[str]]:
    """Fit verdicts at zero margin with context ``ctx``: needed + ctx <= the profile's
    capacity, against what happened (ran: fits; out of memory: does not). Returns (right,
    all, the ids called wrong)."""
    right, wrong = 0, []
    rows = list(a["cases"])
    for r in rows:
        fits = needed(r.est(a["ov"])) + ctx <= r.cluster.gpu.memory_bytes
        if fits == bool(r.rec["ok"]):
            right += 1
        else:
            wrong.append(f"{r.id} ({'ran' if r.rec['ok'] else 'out of memory'})")
    return right, len(rows), wrong


def moe_moments(a: dict[str, Any]) -> str:
    cells = []
    for r in sorted((r for r in a["cases"] if r.model.is_moe and r.rec["ok"]),
                    key=lambda x: x.cluster.n_gpus):
        e = r.est(a["ov"])
        mo = r.rec["moments"]
        fwd = pct(e.phases[Phase.FORWARD].total, mo["forward"]["allocated"])
        cells.append(f"{r.cluster.n_gpus}: {fwd} / "
                     f"{pct(backward_peak(e), mo['backward']['allocated'])}")
    return "; ".join(cells)


def cross_gpu(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Each GPU's measured or fitted terms scored on the other's records."""
    la, lb = a["run"].label, b["run"].label
    fa, fb = a["facts"], b["facts"]

    def mib(v: float) -> str:
        return f"{v / MiB:,.0f} MiB"

    def rel(v: float, ref: float) -> str:
        return f"{(v - ref) / ref * 100:+.1f}%"

    def med(errs: list[float]) -> str:
        return f"{median_abs(errs) * 100:.1f}%"

    def on(src: dict[str, Any], dst: dict[str, Any]) -> dict[str, str]:
        """src's terms scored on dst's records."""
        c_src, c_dst = src["facts"]["ctx_profile_frame"], dst["facts"]["ctx_profile_frame"]
        return {
            "ctx": f"{mib(c_src - c_dst)} ({rel(c_src, c_dst)})",
            "frag": f"{med(score_frag(dst['least_default'], src['frag_all']))} (defaults "
                    f"{med(dst['frag_before'])}, own held out {med(dst['frag']['errors'])})",
            "eff": f"{med(time_errors(dst['eager1'], src['eff_all']))} (assumed "
                   f"{dst['gpu'].compute_efficiency:.3f}: {med(dst['eff_before'])}, own held "
                   f"out {med(dst['eff']['errors'])})",
            "scale": f"{med(score_scale(dst['dense_ok'], fit_scale(src['dense_ok'])))} "
                     f"(1.000: {med(dst['scale_before'])})",
            "verdict": "{}/{} right".format(*verdicts(dst, src['facts']['ctx_profile_frame'])[:2]),
        }

    ab, ba = on(a, b), on(b, a)
    ca, cb = _first([r for r in a["cases"] if r.rec["ok"]]), _first(
        [r for r in b["cases"] if r.rec["ok"]])
    common = sorted(set(ca) & set(cb))
    same_alloc = [i for i in common if ca[i].rec["max_allocated_bytes"]
                  == cb[i].rec["max_allocated_bytes"]]
    same_res = [i for i in common if ca[i].rec["max_reserved_bytes"]
                == cb[i].rec["max_reserved_bytes"]]
    res_diff = [f"{i}: {ca[i].rec['max_reserved_bytes'] / GiB:.2f} vs "
                f"{cb[i].rec['max_reserved_bytes'] / GiB:.2f} GiB" for i in common
                if i not in same_res]
    la_, lb_ = _first(a["least_default"]), _first(b["least_default"])
    lcommon = sorted(set(la_) & set(lb_))
    same_least = [i for i in lcommon if la_[i].rec["least_limit_ok_bytes"]
                  == lb_[i].rec["least_limit_ok_bytes"]]
    least_diff = [f"{i}: {la_[i].rec['least_limit_ok_bytes'] / GiB:.2f} vs "
                  f"{lb_[i].rec['least_limit_ok_bytes'] / GiB:.2f} GiB" for i in lcommon
                  if i not in same_least]
    t_ratio = [cb[i].rec["step_time_s"] / ca[i].rec["step_time_s"] for i in common]

    def ratio_res(x: dict[str, Any]) -> str:
        v = [r.rec["max_reserved_bytes"] / r.rec["max_allocated_bytes"]
             for r in x["cases"] if r.rec["ok"]]
        return f"{statistics.median(v):.3f} (max {max(v):.3f}, {len(v)} cases)"

    def mfu8(x: dict[str, Any]) -> str:
        v = [mfu(r) for r in x["fake_ok"] if "-8b" in r.id]
        return f"{min(v) * 100:.1f}-{max(v) * 100:.1f}% ({len(v)} cases)"

    def mfu1(x: dict[str, Any]) -> str:
        v = [mfu(r) for r in x["eager1"]]
        return f"{statistics.median(v) * 100:.1f}% median ({len(v)} cases)"

    def ctxdef(x: dict[str, Any]) -> str:
        return "{}/{} right".format(*verdicts(x, x["gpu"].cuda_context_bytes)[:2])

    def ctxown(x: dict[str, Any]) -> str:
        r, n, wrong = verdicts(x, x["facts"]["ctx_profile_frame"])
        return f"{r}/{n} right" + (f" (wrong: {', '.join(wrong)})" if wrong else "")

    ooms = {x["run"].label: sorted(r.id for r in x["cases"] if not r.rec["ok"]) for x in (a, b)}
    only_b_oom = [i for i in ooms[lb] if i not in ooms[la]]
    rows = [
        f"| term | {la} | {lb} | {la}'s value on the {lb} records | {lb}'s value on the {la} "
        f"records |",
        "|---|---:|---:|---|---|",
        f"| memory the driver keeps (nvidia-smi total - `mem_get_info` total) | "
        f"{mib(fa['driver_keeps'])} | {mib(fb['driver_keeps'])} | - | - |",
        f"| CUDA context at `torch.cuda.init()` | {mib(fa['ctx_init'])} | {mib(fb['ctx_init'])}"
        f" | - | - |",
        f"| context + lazily loaded kernels + cuBLAS handles after the steps (fake-group cases) "
        f"| {statistics.median(fa['ovh_fake']):,.0f} B | {statistics.median(fb['ovh_fake']):,.0f}"
        f" B | - | - |",
        f"| `cuda_context_bytes` in the profile's frame (the two lines above) | "
        f"{mib(fa['ctx_profile_frame'])} | {mib(fb['ctx_profile_frame'])} | {ab['ctx']} | "
        f"{ba['ctx']} |",
        f"| cuBLAS + cuBLASLt workspace | {mib(fa['cublas_ws'])} | {mib(fb['cublas_ws'])} | - "
        f"| - |",
        f"| 1-rank NCCL communicator (runtime part; cases with it - fake-group cases) | "
        f"{mib(fa['nccl_1rank'])}; {mib(fa['nccl_cases'])} | {mib(fb['nccl_1rank'])}; "
        f"{mib(fb['nccl_cases'])} | - | - |",
        f"| allocator_fragmentation fitted on all least-limit cases; scored: needed vs least "
        f"limit, median abs err | {a['frag_all']:.3f} | {b['frag_all']:.3f} | {ab['frag']} | "
        f"{ba['frag']} |",
        f"| least limit / allocated peak - 1, default allocator: median (max) | "
        f"{statistics.median(a['ratios']) * 100:.1f}% ({max(a['ratios']) * 100:.1f}%) | "
        f"{statistics.median(b['ratios']) * 100:.1f}% ({max(b['ratios']) * 100:.1f}%) | - | - |",
        f"| max reserved / max allocated, cases that ran: median | {ratio_res(a)} | "
        f"{ratio_res(b)} | - | - |",
        f"| planner allocated peak, dense cases that ran: median abs err (p90) | "
        f"{med(a['case_errs']['peak'])} ({p90_abs(a['case_errs']['peak']) * 100:.1f}%), "
        f"{len(a['case_errs']['peak'])} cases | {med(b['case_errs']['peak'])} "
        f"({p90_abs(b['case_errs']['peak']) * 100:.1f}%), {len(b['case_errs']['peak'])} cases "
        f"| - | - |",
        f"| activation_scale fitted on all dense cases; scored: allocated peak, median abs err "
        f"| {fit_scale(a['dense_ok']):.3f} | {fit_scale(b['dense_ok']):.3f} | {ab['scale']} | "
        f"{ba['scale']} |",
        f"| Mixtral (4 layers) past its experts, planner forward / backward err by fake ranks | "
        f"{moe_moments(a)} | {moe_moments(b)} | - | - |",
        f"| compute_efficiency fitted (eager, world size 1); scored: step time, median abs err "
        f"| {a['eff_all']:.3f} | {b['eff_all']:.3f} | {ab['eff']} | {ba['eff']} |",
        f"| MFU of the eager world-size-1 steps (achieved / dense bf16 peak; profile assumes "
        f"{a['gpu'].compute_efficiency:.3f} / {b['gpu'].compute_efficiency:.3f}) | {mfu1(a)} | "
        f"{mfu1(b)} | - | - |",
        f"| MFU of the 8B fake-group steps (seq 8192 and 32768; compute only) | {mfu8(a)} | "
        f"{mfu8(b)} | - | - |",
        f"| fit verdicts at zero margin (needed + context vs the profile's capacity; ran = fits), "
        f"context assumed | {ctxdef(a)} | {ctxdef(b)} | - | - |",
        f"| the same with the GPU's own measured context | {ctxown(a)} | {ctxown(b)} | "
        f"{ab['verdict']} | {ba['verdict']} |",
    ]
    diff = [
        "",
        f"Where the two differ. Of the {len(common)} cases that ran on both, the allocated "
        f"peak is the same to the byte in {len(same_alloc)} and the reserved peak in "
        f"{len(same_res)}" + (f" (not: {'; '.join(res_diff)}, {la} vs {lb})" if res_diff
                              else "") +
        f"; of the {len(lcommon)} least-limit bisections on both, {len(same_least)} found the "
        f"same limit" + (f" (not: {'; '.join(least_diff)})" if least_diff else "") +
        ": with the same torch, shapes and kernels the caching allocator makes the same "
        "requests on both. What differs: the capacity (`mem_get_info` total "
        f"{fa['device_total'] / GiB:.2f} vs {fb['device_total'] / GiB:.2f} GiB), the memory "
        f"the driver keeps ({mib(fa['driver_keeps'])} vs {mib(fb['driver_keeps'])}), hence "
        f"the context in the profile's frame ({mib(fa['ctx_profile_frame'])} vs "
        f"{mib(fb['ctx_profile_frame'])}); the 1-rank NCCL group "
        f"({mib(fa['nccl_cases'])} vs {mib(fb['nccl_cases'])}); the step time: the {lb} "
        f"took {statistics.median(t_ratio):.3f} x the {la}'s (median over the {len(common)} "
        f"cases, {min(t_ratio):.3f}-{max(t_ratio):.3f}) at the same dense bf16 peak in both "
        f"profiles; and what ran out of memory: {len(ooms[lb])} cases on the {lb} ("
        + ", ".join(ooms[lb]) + f"), {len(ooms[la])} on the {la} (" + ", ".join(ooms[la]) +
        ").",
    ]
    facts = {"common": common, "same_alloc": same_alloc, "same_res": same_res,
             "t_ratio": t_ratio, "only_b_oom": only_b_oom}
    return "\n".join(rows + diff), facts


def torchtitan_lines(a: dict[str, Any]) -> str:
    """Lines in torchtitan's training-log format (torchtitan/components/metrics.py: step,
    loss, memory = max reserved GiB and % of the device, tps, tflops, mfu), formatted from
    measured records: test data for reading such logs, not emitted by torchtitan."""
    total = a["facts"]["device_total"]
    out = [f"# formatted by benchmarks/gpu_calibration.py from measured {a['run'].label} "
           f"records (benchmarks/gpu_runs/{a['run'].runs.name}/) in torchtitan's log format; "
           "not emitted by torchtitan"]
    for r in a["cases"]:
        rec = r.rec
        if not rec["ok"] or rec["id"] not in ("w8-8b-fsdp-sel", "w8-8b-fsdp-full", "w1-1b-fsdp-none"):
            continue
        res = rec["max_reserved_bytes"]
        tps = rec["tokens_per_step"] / rec["step_time_s"]
        tflops = rec["achieved_tflops"]
        mfu_ = tflops * 1e12 / peak_flops(a["gpu"], r.training.precision) * 100
        loss = rec.get("loss_last")
        loss_s = f"{loss:7.4f}" if loss == loss and loss is not None else "    nan"
        out.append(f"# case {rec['id']}")
        out.append(f"step: 10  loss: {loss_s}  memory: {res / GiB:5.2f}GiB"
                   f"({res / total * 100:.2f}%)  tps: {round(tps):,}  tflops: {tflops:,.2f}  "
                   f"mfu: {mfu_:.2f}%")
    return "\n".join(out) + "\n"


GENERATED = ("Generated by `python benchmarks/gpu_calibration.py --write` from the records "
             "named below; do not edit by hand. Errors are (planner - measured) / measured; the "
             "planner is evaluated on the reference module's spec (the module the runs built).")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", action="append", default=[], metavar="PROFILE=FOLDER",
                    help="read this GPU's records from FOLDER (default: GPUS)")
    ap.add_argument("--write", action="store_true",
                    help="write the calibration files, the docs sections and the log test data")
    ap.add_argument("--calibration-md", default=str(REPO / "docs" / "calibration.md"),
                    help="with --write: the doc whose gpu-run section is replaced ('' = none)")
    ap.add_argument("--accuracy-md", default=str(REPO / "docs" / "accuracy.md"),
                    help="with --write: the doc whose gpu-run-accuracy section is replaced")
    ap.add_argument("--cal-dir", default=str(CAL_DIR),
                    help="with --write: where the calibration files go, <id>.json ('' = none)")
    ap.add_argument("--log-out", default=str(REPO / "tests" / "data" / "gpu" /
                                             "torchtitan-style-h200.log"),
                    help="with --write: the torchtitan-format lines of the H200 records "
                         "('' = none)")
    args = ap.parse_args(argv)
    folders: dict[str, Path] = {}
    for item in args.runs:
        prof, sep, folder = item.partition("=")
        if not sep or prof not in {g.profile for g in GPUS}:
            ap.error(f"--runs {item!r}: expected PROFILE=FOLDER, PROFILE one of "
                     + ", ".join(g.profile for g in GPUS))
        folders[prof] = Path(folder)
    analyses = [analyse(g, folders.get(g.profile)) for g in GPUS]
    ships = [decisions(a) for a in analyses]
    parts = [report(a, s) for a, s in zip(analyses, ships)]
    cross_md, _ = cross_gpu(*analyses)
    calib_md = "\n\n".join(
        [GENERATED] + [c for c, _ in parts] +
        ["### Across the two GPUs: each one's terms on the other's records\n\n"
         "Each GPU's measured or fitted value, and the error it makes on the other GPU's "
         "records: for the context, that value minus the other's measurement; for a fitted "
         "term, the median abs error over the other GPU's cases scored with it, beside the "
         "defaults' and the other GPU's own held-out error.\n\n" + cross_md])
    acc_md = "\n\n".join([GENERATED] + [x for _, x in parts])
    if not args.write:
        print(calib_md)
        print()
        print(acc_md)
        return 0
    from trace_accuracy import replace_section

    from probes.calibrate import write_calibration

    if args.cal_dir:
        for a, s in zip(analyses, ships):
            out = Path(args.cal_dir) / f"{a['run'].cal_id}.json"
            write_calibration(calibration_doc(a, s), out)
            print(f"wrote {out}", file=sys.stderr)
    if args.calibration_md:
        replace_section(args.calibration_md, calib_md, BEGIN, END)
    if args.accuracy_md:
        replace_section(args.accuracy_md, acc_md, ACC_BEGIN, ACC_END)
    if args.log_out:
        h200 = next(a for a in analyses if a["run"].profile == "h200")
        log_path = Path(args.log_out)
        tmp = log_path.with_name(f".{log_path.name}.tmp")
        tmp.write_text(torchtitan_lines(h200))
        tmp.replace(log_path)
        print(f"wrote {log_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
