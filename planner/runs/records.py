"""Measured records written by fitcheck's own GPU runs, read as runs that carry their job.

Two JSONL schemas: ``fitcheck probe`` (probes/cuda_probe.py, ``schema: fitcheck-probe/1``,
``record: step``) and ``benchmarks/gpu_run.py`` (probes/gpu_cases.py: ``record: case`` with
the allocator's peak per moment, ``least_memory`` with the least limit a step ran under, and
an ``env`` record with the versions). Each record names its model, training run, candidate and
world size, so the fitting code pairs it with the planner as it pairs a user's log with the
job flags (docs/explain.md).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from planner.lazy_dataclass import dataclass
import planner.spec as spec_mod
from planner.errors import InputDataError
from planner.runs.evidence import Moment, Quantity, Run, Sample
from planner.runs.oom import find_ooms
from planner.runs.units import Figure
from planner.spec import Candidate, ModelSpec, TrainingSpec

__all__ = ["Recorded", "looks_like_records", "read_records"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recorded:
    """One measured case: the job as the record states it, and its evidence."""

    id: str
    model: ModelSpec
    training: TrainingSpec
    candidate: Candidate
    world_size: int
    gpus_per_node: int
    gpu_profile: str | None
    run: Run
    fake_group: bool = False
    """Ranks simulated by torch's fake process group: collectives move nothing and take no
    time, every allocation is real."""
    device_total_bytes: int | None = None
    """cudaMemGetInfo's total on that machine (what the allocator could reach)."""


def _from_dict(cls: type, data: dict[str, Any], where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise InputDataError(f"{where}: unknown {cls.__name__} field(s) "
                             f"{', '.join(sorted(unknown))}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        ann = fields[name].type
        ann_name = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
        typ = getattr(spec_mod, ann_name.split(" ")[0], None)
        if isinstance(typ, type) and issubclass(typ, enum.Enum) and value is not None:
            value = typ(value)
        elif isinstance(typ, type) and dataclasses.is_dataclass(typ) and isinstance(value, dict):
            value = _from_dict(typ, value, where)
        elif ann_name.startswith("tuple") and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise InputDataError(f"{where}: {cls.__name__}: {exc}") from None


def looks_like_records(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    if not first.lstrip().startswith("{"):
        return False
    try:
        doc = json.loads(first)
    except ValueError:
        return False
    return isinstance(doc, dict) and "record" in doc


def _fig(v: Any) -> Figure | None:
    return Figure(int(v), 0, str(v)) if isinstance(v, (int, float)) and v else None


def read_records(text: str, where: str) -> tuple[list[Recorded], dict[str, Any]]:
    """(cases, facts: versions and GPU name) from a JSONL file of records."""
    cases: list[Recorded] = []
    facts: dict[str, Any] = {}
    total = None
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise InputDataError(f"{where}:{i + 1}: not a JSON record ({exc})") from None
        if not isinstance(rec, dict):
            continue
        kind = rec.get("record")
        env = rec.get("env") if isinstance(rec.get("env"), dict) and kind != "env" else None
        if kind == "env" or env:
            src = rec if kind == "env" else env
            smi = ((src.get("nvidia_smi") or {}).get("gpus") or [{}])[0]
            for k in ("torch", "cuda", "nccl"):
                if src.get(k):
                    facts[k] = str(src[k])
            if src.get("driver") or smi.get("driver_version"):
                facts["driver"] = str(src.get("driver") or smi.get("driver_version"))
            if src.get("gpu_name") or smi.get("name"):
                facts["gpu_name"] = src.get("gpu_name") or smi.get("name")
        if rec.get("device_total_bytes"):
            total = int(rec["device_total_bytes"])
        if kind not in ("case", "step", "least_memory") or "model" not in rec:
            continue
        here = f"{where}:{i + 1}"
        model = _from_dict(ModelSpec, rec["model"], here)
        training = _from_dict(TrainingSpec, rec["training"], here)
        cand = _from_dict(Candidate, rec["candidate"], here)
        samples: list[Sample] = []
        figs = {q: f for q, f in ((Quantity.PEAK_ALLOCATED, _fig(rec.get("max_allocated_bytes"))),
                                  (Quantity.PEAK_RESERVED, _fig(rec.get("max_reserved_bytes"))),
                                  (Quantity.DEVICE_USED, _fig(rec.get("device_used_bytes"))))
                if f is not None}
        ok = rec.get("ok", not rec.get("oom"))
        if kind == "least_memory" and ok and rec.get("least_limit_ok_bytes"):
            figs[Quantity.NEEDED] = Figure(int(rec["least_limit_ok_bytes"]),
                                           int(rec.get("resolution_bytes") or 0), "least limit")
        tokens = rec.get("tokens_per_step")
        t = rec.get("step_time_s")
        if ok and figs:
            samples.append(Sample(where=here, format="records", moment=Moment.STEP,
                                  label=str(rec.get("id", "")), figures=figs,
                                  tokens_per_s_per_gpu=(tokens / t) if tokens and t else None,
                                  step_time_s=float(t) if t else None))
        for name, mo in (("forward", Moment.FORWARD), ("backward", Moment.BACKWARD),
                         ("optimizer", Moment.OPTIMIZER)):
            m = (rec.get("moments") or {}).get(name) or {}
            if ok and m.get("allocated"):
                samples.append(Sample(where=here, format="records", moment=mo,
                                      label=str(rec.get("id", "")), figures={
                                          Quantity.PEAK_ALLOCATED: Figure(int(m["allocated"])),
                                          Quantity.PEAK_RESERVED: Figure(int(m["reserved"]))}))
        ooms = tuple(find_ooms((rec.get("traceback") or rec.get("oom_message") or "")
                               .splitlines(), here)) if rec.get("oom") else ()
        world = int(rec.get("world_size") or 1)
        cases.append(Recorded(
            id=str(rec.get("id") or rec.get("candidate_id") or f"record-{i + 1}"), model=model,
            training=training, candidate=cand, world_size=world,
            gpus_per_node=int(rec.get("gpus_per_node") or min(world, 8)),
            gpu_profile=rec.get("gpu_profile") or (env or {}).get("gpu_profile"),
            run=Run(files=(where,), samples=tuple(samples), ooms=ooms),
            fake_group=bool(rec.get("fake_group"))))
    if total is None:  # an OOM message states cudaMemGetInfo's total
        total = next((o.capacity.value for c in cases for o in c.run.ooms), None)
    if total is not None:
        cases = [dataclasses.replace(c, device_total_bytes=total) for c in cases]
    return cases, facts
