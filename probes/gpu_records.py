"""The records of benchmarks/gpu_run.py read back as planner inputs, one way for every reader
(benchmarks/gpu_calibration.py, benchmarks/memory_accuracy.py --gpu-runs and the tests that
hold the planner to the GPU runs).

A record (probes/gpu_cases.py) holds the spec dicts of the model, the training loop and the
candidate it ran, and its world size; the planner is evaluated on the reference module's spec
(``probes.models.reference_spec``: the module the run built, so this imports torch) on one
node of the GPU's profile.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from planner.memory import Estimate, Overheads, estimate
from planner.spec import (
    Candidate,
    Cluster,
    GpuProfile,
    ModelSpec,
    OffloadImpl,
    TrainingSpec,
)
from probes.models import reference_spec
from probes.runner import spec_from_dict


def read_runs(folder: Path) -> list[dict[str, Any]]:
    """Every record of the ``run*-records.jsonl`` files in ``folder``, in file order, each
    with ``_run`` (the file's run name); [] when there is none."""
    out = []
    for path in sorted(Path(folder).glob("run*-records.jsonl")):
        run = path.name.split("-", 1)[0]
        for line in path.read_text().splitlines():
            if line.strip():
                out.append({**json.loads(line), "_run": run})
    return out


@dataclasses.dataclass
class Row:
    """One record with the planner's inputs for it."""

    rec: dict[str, Any]
    model: ModelSpec
    training: TrainingSpec
    cand: Candidate
    cluster: Cluster

    @property
    def id(self) -> str:
        return self.rec["id"]

    def est(self, ov: Overheads | None = None) -> Estimate:
        return estimate(self.model, self.training, self.cluster, self.cand, overheads=ov)


def row_of(rec: dict[str, Any], gpu: GpuProfile) -> Row:
    """The planner's inputs for one record: the reference module's spec, the record's
    training loop and candidate, its world size on nodes of the profile's size."""
    w = int(rec["world_size"])
    training = spec_from_dict(TrainingSpec, rec["training"])
    source = (rec.get("activation_offload") or {}).get("source", "")
    if training.activation_offload and source.startswith("trl"):
        # the case ran TRL's copy of OffloadActivations (probes/gpu_cases.py offload_impl)
        training = dataclasses.replace(training, activation_offload_impl=OffloadImpl.TRL)
    return Row(rec, reference_spec(spec_from_dict(ModelSpec, rec["model"])),
               training,
               spec_from_dict(Candidate, rec["candidate"]),
               Cluster(gpu=gpu, n_gpus=w, gpus_per_node=min(w, gpu.gpus_per_node),
                       host_ram_bytes_per_node=gpu.host_ram_bytes_per_node))


def rows_of(records: list[dict[str, Any]], kind: str, gpu: GpuProfile) -> list[Row]:
    """``row_of`` every record of this kind ('case', 'least_memory')."""
    return [row_of(r, gpu) for r in records if r.get("record") == kind]
