"""fitcheck's own spec (docs/gating.md), plus one key only job files know: ``job``, naming a job
config (a path relative to the spec, or {path, format}) whose settings the spec's own fields
override. The Slurm wrapper's ``#FITCHECK job=...`` and a manifest's spec annotation use it.
"""

from __future__ import annotations

import os
from typing import Any

from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import JobError, JobFormat, Source


def detect(doc: Any) -> int:
    """A spec's keys only; a spec section among other keys reads as a spec with a misspelt key
    (its error names it), unless another format's marks are there (torchtune's
    ``_component_`` sections)."""
    from planner.fields import TOP_KEYS

    if looks_foreign(doc):
        return 0
    keys = set(doc)
    if keys and keys <= set(TOP_KEYS) | {"job"} and keys & {"model", "training", "hardware",
                                                               "job"}:
        return 20
    # a spec with a misspelt key: read as a spec, whose error names the key
    return 5 * sum(isinstance(doc.get(k), dict) for k in ("model", "training", "hardware"))


def looks_foreign(doc: Any) -> bool:
    """Marks no fitcheck spec has: a ``_component_`` section (torchtune), a DeepSpeed or
    accelerate top-level key."""
    if not isinstance(doc, dict):
        return False
    if any(isinstance(v, dict) and "_component_" in v for v in doc.values()):
        return True
    return any(k in doc for k in ("distributed_type", "zero_optimization", "base_model",
                                  "model_name_or_path", "checkpointer", "batch_size"))


def read(r: Reader) -> None:
    from planner.fields import SpecError, spec_values

    doc = dict(r.mapping(r.doc, "file"))
    ref = doc.pop("job", MISSING)
    try:
        values = spec_values(doc)
    except SpecError as exc:
        raise JobError(f"{r.name}: {exc}") from None
    for path, v in values.items():
        if path in ("model.config", "calibration") and isinstance(v, str) and r.base_dir \
                and not os.path.isabs(v) and v not in ("auto", "none"):
            v = os.path.join(r.base_dir, os.path.expanduser(v))
        if path == "hardware.gpu" and isinstance(v, str) and r.base_dir:
            from planner.validate import looks_like_path

            if looks_like_path(v) and not os.path.isabs(os.path.expanduser(v)):
                v = os.path.join(r.base_dir, v)
        if v is not None:
            r.raw[path] = v
            r.sources[path] = Source(r.name, path)
    if ref is MISSING:
        return
    fmt = None
    config = None
    if isinstance(ref, dict):
        unknown = set(ref) - {"path", "format", "config"}
        if unknown:
            raise r.fail("job", f"unknown key {min(unknown)!r}; allowed: path, format, config")
        config = r.text(ref.get("config"), "job.config")
        f = r.text(ref.get("format"), "job.format")
        if f is not None:
            try:
                fmt = JobFormat(f.lower())
            except ValueError:
                raise r.fail("job.format", f"unknown format {f!r}; expected one of "
                             f"{', '.join(JobFormat)}") from None
        ref = ref.get("path")
    if ref is None:
        raise r.fail("job", "needs a path (job: train.toml, or job: {path: ..., format: ...})")
    if config is not None:  # a torchtitan config_registry.py function, by name
        ref = f"{r.text(ref, 'job.path')}:{config}"
    base = r.reference(ref, "job", fmt)
    if base is None:
        raise r.fail("job", f"no such file: {ref!r}")
    r.bases.append(base)
