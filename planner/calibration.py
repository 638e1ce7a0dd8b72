"""Calibration files: load, validate, find, check for staleness, and apply to the planner.

A calibration replaces the planner's free runtime terms (docs/calibration.md) with values
fitted on measurements of one GPU type under one software stack:

===============================  ==========================================================
calibration value                replaces
===============================  ==========================================================
``cuda_context_bytes``           ``GpuProfile.cuda_context_bytes`` (context + lazily loaded
                                 kernels + everything outside the allocator except NCCL)
``nccl_bytes_per_communicator``  ``Overheads.nccl_bytes_per_communicator``
``allocator_fragmentation``      ``Overheads.allocator_fragmentation``
``activation_scale[family]``     ``Overheads.activation_scale`` (when that field exists)
``compute_efficiency``           ``GpuProfile.compute_efficiency``
``compiled_compute_efficiency``  ``GpuProfile.compiled_compute_efficiency`` (torch.compile;
                                 fitted from runs, planner/runs/fit.py)
``intra_node_comm_efficiency``   ``ThroughputAssumptions.intra_node_comm_efficiency``
``inter_node_comm_efficiency``   ``ThroughputAssumptions.inter_node_comm_efficiency``
===============================  ==========================================================

A value that is absent or ``null`` was not fitted: the planner's default stays. Pure standard
library (this module is on the planner's path): no numpy, no torch, nothing read at import.
The fit itself lives in ``probes/calibrate.py``; the file format is documented in
docs/calibration.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import field
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.errors import InputDataError
from planner.spec import GpuProfile, ModelSpec

__all__ = [
    "CALIBRATION_DIRS",
    "FLOAT_VALUES",
    "INT_VALUES",
    "SCHEMA_VERSION",
    "Calibration",
    "CalibrationError",
    "FittedValue",
    "apply",
    "apply_throughput",
    "architecture_family",
    "calibration_dirs",
    "find_calibration",
    "installed_torch_version",
    "is_stale",
    "load_calibration",
    "parse_calibration",
]

SCHEMA_VERSION = 1

from planner.calibration_paths import CALIBRATION_DIRS, calibration_dirs  # noqa: E402

INT_VALUES = ("cuda_context_bytes", "nccl_bytes_per_communicator")
"""Byte counts: non-negative integers below the GPU's memory."""
FLOAT_VALUES = {
    # name: (lowest allowed, highest allowed, lowest inclusive)
    "allocator_fragmentation": (0.0, 2.0, True),
    "compute_efficiency": (0.0, 1.0, False),
    "compiled_compute_efficiency": (0.0, 1.0, False),
    "intra_node_comm_efficiency": (0.0, 1.0, False),
    "inter_node_comm_efficiency": (0.0, 1.0, False),
}
"""Fractions with their plausible range (a fit outside it is a broken measurement)."""
ACTIVATION_SCALE_RANGE = (0.1, 10.0)
_VALUE_KEYS = frozenset(INT_VALUES) | frozenset(FLOAT_VALUES) | {"activation_scale"}
_TOP_KEYS = frozenset({"schema_version", "id", "source", "gpu", "versions", "date", "values",
                       "notes", "records"})
_REQUIRED_TOP = ("schema_version", "id", "gpu", "versions", "date", "values")
_VERSION_KEYS = ("driver", "cuda", "torch", "nccl")


class CalibrationError(InputDataError):
    """A calibration file is malformed: one line naming the file, the field and the value
    (exit code 4, bad input data)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FittedValue:
    """One fitted term and how well the fit explains the measurements."""

    value: float
    n: int = 0
    """Measurements the value was fitted on."""
    rms_residual: float | None = None
    """Root mean square of (measured - fitted model), in the term's unit (bytes or seconds)."""
    max_abs_residual: float | None = None
    relative_error: float | None = None
    """Median |measured - fitted| / measured of the quantity the term predicts."""
    held_out_error: float | None = None
    """Median relative error on measurements left out of the fit (leave-one-out), if computed."""
    method: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    schema_version: int
    id: str
    gpu_profile: str | None
    """The hardware profile id the measurements correspond to (``--gpu``), if known."""
    gpu_name: str
    """The device's own name (torch.cuda.get_device_name / the source's card)."""
    memory_bytes: int
    """Total device memory the driver reported."""
    driver: str | None
    cuda: str | None
    torch: str | None
    nccl: str | None
    date: str
    values: dict[str, FittedValue]
    """Scalar fitted terms by name (INT_VALUES and FLOAT_VALUES keys); absent = not fitted."""
    activation_scale: dict[str, FittedValue] = field(default_factory=dict)
    """Multiplicative correction of the activation term, by architecture family."""
    source: str = ""
    """Where the measurements come from ("probe" runs, or public measurements)."""
    notes: tuple[str, ...] = ()
    records: tuple[dict[str, Any], ...] = ()
    """The raw measurements (kept opaque)."""
    path: str = ""

    def value(self, name: str) -> float | None:
        v = self.values.get(name)
        return None if v is None else v.value


# --------------------------------------------------------------------------- validation


def _fail(where: str, name: str, value: Any, why: str) -> CalibrationError:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return CalibrationError(f"calibration {where}: {name} = {text}: {why}")


def _finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _opt_str(where: str, name: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str):
        raise _fail(where, name, v, "must be a string or null")
    return v


def _fitted(where: str, name: str, raw: Any, memory_bytes: int) -> FittedValue | None:
    if raw is None:
        return None
    if _finite_number(raw):
        raw = {"value": raw}
    if not isinstance(raw, dict):
        raise _fail(where, name, raw, "must be an object with a 'value' (or a number, or null)")
    unknown = set(raw) - {f.name for f in dataclasses.fields(FittedValue)}
    if unknown:
        raise _fail(where, f"{name}.{sorted(unknown)[0]}", raw[sorted(unknown)[0]], "unknown key")
    if "value" not in raw:
        raise _fail(where, f"{name}.value", None, "missing")
    v = raw["value"]
    if v is None:
        return None
    if not _finite_number(v):
        raise _fail(where, f"{name}.value", v, "must be a finite number")
    if name in INT_VALUES:
        if isinstance(v, float) and not v.is_integer():
            raise _fail(where, f"{name}.value", v, "must be an integer number of bytes")
        v = int(v)
        if v < 0 or (memory_bytes and v >= memory_bytes):
            raise _fail(where, f"{name}.value", v,
                        f"must be in [0, memory_bytes = {memory_bytes}) bytes")
    elif name in FLOAT_VALUES:
        lo, hi, lo_incl = FLOAT_VALUES[name]
        ok = (v >= lo if lo_incl else v > lo) and v <= hi
        if not ok:
            interval = f"{'[' if lo_incl else '('}{lo:g}, {hi:g}]"
            raise _fail(where, f"{name}.value", v, f"must be in {interval}")
        v = float(v)
    else:  # activation_scale.<family>
        lo, hi = ACTIVATION_SCALE_RANGE
        if not lo <= v <= hi:
            raise _fail(where, f"{name}.value", v, f"must be in [{lo:g}, {hi:g}]")
        v = float(v)
    n = raw.get("n", 0)
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise _fail(where, f"{name}.n", n, "must be a non-negative integer")
    stats: dict[str, float | None] = {}
    for key in ("rms_residual", "max_abs_residual", "relative_error", "held_out_error"):
        s = raw.get(key)
        if s is not None and not _finite_number(s):
            raise _fail(where, f"{name}.{key}", s, "must be a finite number or null")
        stats[key] = None if s is None else float(s)
    method = raw.get("method", "")
    if not isinstance(method, str):
        raise _fail(where, f"{name}.method", method, "must be a string")
    return FittedValue(value=v, n=n, method=method, **stats)


def parse_calibration(doc: Any, where: str = "<data>") -> Calibration:
    """Validate a decoded calibration document (see docs/calibration.md)."""
    if not isinstance(doc, dict):
        raise _fail(where, "<top level>", type(doc).__name__, "must be a JSON object")
    for key in _REQUIRED_TOP:
        if key not in doc:
            raise _fail(where, key, None, "missing")
    unknown = sorted(set(doc) - _TOP_KEYS)
    if unknown:
        raise _fail(where, unknown[0], doc[unknown[0]], "unknown key")
    sv = doc["schema_version"]
    if sv != SCHEMA_VERSION or isinstance(sv, bool):
        raise _fail(where, "schema_version", sv, f"this fitcheck reads version {SCHEMA_VERSION}")
    cid = doc["id"]
    if not isinstance(cid, str) or not cid.strip():
        raise _fail(where, "id", cid, "must be a non-empty string")
    gpu = doc["gpu"]
    if not isinstance(gpu, dict):
        raise _fail(where, "gpu", gpu, "must be an object {profile, name, memory_bytes}")
    name = gpu.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, "gpu.name", name, "must be a non-empty string")
    mem = gpu.get("memory_bytes")
    if not isinstance(mem, int) or isinstance(mem, bool) or mem <= 0:
        raise _fail(where, "gpu.memory_bytes", mem, "must be a positive integer")
    profile = _opt_str(where, "gpu.profile", gpu.get("profile"))
    versions = doc["versions"]
    if not isinstance(versions, dict):
        raise _fail(where, "versions", versions, "must be an object {driver, cuda, torch, nccl}")
    vers = {k: _opt_str(where, f"versions.{k}", versions.get(k)) for k in _VERSION_KEYS}
    date = doc["date"]
    if not isinstance(date, str) or not re.match(r"^\d{4}-\d{2}-\d{2}", date):
        raise _fail(where, "date", date, "must be an ISO date (YYYY-MM-DD...)")
    raw_values = doc["values"]
    if not isinstance(raw_values, dict):
        raise _fail(where, "values", raw_values, "must be an object")
    unknown = sorted(set(raw_values) - _VALUE_KEYS)
    if unknown:
        raise _fail(where, f"values.{unknown[0]}", raw_values[unknown[0]], "unknown value")
    values: dict[str, FittedValue] = {}
    for key in (*INT_VALUES, *FLOAT_VALUES):
        fv = _fitted(where, key, raw_values.get(key), mem)
        if fv is not None:
            values[key] = fv
    scales: dict[str, FittedValue] = {}
    raw_scales = raw_values.get("activation_scale") or {}
    if not isinstance(raw_scales, dict):
        raise _fail(where, "activation_scale", raw_scales, "must be an object {family: value}")
    for fam, raw in raw_scales.items():
        fv = _fitted(where, f"activation_scale.{fam}", raw, mem)
        if fv is not None:
            scales[str(fam)] = fv
    notes = doc.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise _fail(where, "notes", notes, "must be a list of strings")
    records = doc.get("records", [])
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise _fail(where, "records", type(records).__name__, "must be a list of objects")
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise _fail(where, "source", source, "must be a string")
    return Calibration(
        schema_version=sv, id=cid, gpu_profile=profile, gpu_name=name, memory_bytes=mem,
        driver=vers["driver"], cuda=vers["cuda"], torch=vers["torch"], nccl=vers["nccl"],
        date=date, values=values, activation_scale=scales, source=source, notes=tuple(notes),
        records=tuple(records), path=where if where != "<data>" else "")


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Read and validate one calibration JSON file; ``CalibrationError`` (one line) if bad."""
    p = os.fspath(path)
    try:
        with open(p, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise CalibrationError(f"calibration {p}: no such file") from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"calibration {p}: not valid JSON (line {exc.lineno}, column "
                               f"{exc.colno}: {exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"calibration {p}: cannot read: {exc}") from None
    except RecursionError:
        raise CalibrationError(f"calibration {p}: JSON nested too deeply") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise CalibrationError(f"calibration {p}: a number is out of range") from None
    return parse_calibration(doc, p)


# --------------------------------------------------------------------------- finding


def _public(version: str | None) -> str | None:
    """'2.5.1+cu124' -> '2.5.1' (the local build tag is the CUDA build, compared separately)."""
    return None if version is None else version.split("+", 1)[0].strip()


def find_calibration(gpu_id: str, torch_version: str | None = None) -> Calibration | None:
    """The best calibration for a GPU profile id, or None.

    Searches ``$FITCHECK_CALIBRATION_PATH`` then ``calibrations/``; among files whose
    ``gpu.profile`` is ``gpu_id``: one measured with the same torch version first, then the
    most recent. Unreadable or invalid files raise ``CalibrationError`` (a broken default file
    must not be skipped silently).
    """
    found: list[Calibration] = []
    for d in calibration_dirs():
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".json"):
                continue
            cal = load_calibration(os.path.join(d, name))
            if cal.gpu_profile == gpu_id:
                found.append(cal)
    if not found:
        return None
    want = _public(torch_version)

    def key(c: Calibration) -> tuple[int, str]:
        return (1 if want is not None and _public(c.torch) == want else 0, c.date)

    return max(found, key=key)


def is_stale(cal: Calibration, torch_version: str | None, *, cuda: str | None = None,
             driver: str | None = None, nccl: str | None = None) -> str | None:
    """Why ``cal`` may not describe this software stack, or None when the versions match.

    A version that is unknown on either side is not compared. torch is compared without its
    local build tag; the driver by its major version (a new branch changes the context size).
    """
    reasons = []
    pairs = [("torch", _public(cal.torch), _public(torch_version)),
             ("CUDA", cal.cuda, cuda),
             ("NCCL", cal.nccl, nccl),
             ("driver", (cal.driver or "").split(".")[0] or None,
              (driver or "").split(".")[0] or None)]
    for label, theirs, ours in pairs:
        if theirs and ours and theirs != ours:
            shown_theirs = cal.driver if label == "driver" else theirs
            shown_ours = driver if label == "driver" else ours
            reasons.append(f"{label} {shown_theirs} (calibrated) != {shown_ours} (installed)")
    if not reasons:
        return None
    return f"calibration {cal.id} is stale: " + "; ".join(reasons)


def installed_torch_version() -> str | None:
    """torch's version string without importing torch (reads ``torch/version.py``); None when
    torch is not installed. Costs well under a millisecond."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    if not locations and spec.origin:
        locations = [os.path.dirname(spec.origin)]
    for loc in locations:
        try:
            with open(os.path.join(loc, "version.py"), encoding="utf-8") as f:
                text = f.read(4096)
        except OSError:
            continue
        m = re.search(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", text, re.M)
        if m:
            return m.group(1)
    return None


# --------------------------------------------------------------------------- applying


def architecture_family(model: ModelSpec) -> str:
    """The key of ``activation_scale``: encoder/decoder, MLP kind, attention layout, MoE.

    Families group models whose activations are laid out alike (same saved tensors per
    block); a correction fitted on one member applies to the others.
    """
    kind = "encoder" if model.encoder_head else "decoder"
    parts = [kind, model.mlp.value]
    if model.n_kv_heads < model.n_heads:
        parts.append("gqa")
    if model.is_moe:
        parts.append("moe")
    return "-".join(parts)


def apply(cal: Calibration, overheads: Any, gpu: GpuProfile, *, model: ModelSpec | None = None,
          check_gpu: bool = True) -> tuple[Any, GpuProfile]:
    """``(overheads, gpu)`` with the calibration's fitted values in place of the defaults.

    ``overheads`` is a ``planner.memory.Overheads``; an activation scale is applied only when
    ``model`` is given, the calibration has one for its family, and ``Overheads`` has an
    ``activation_scale`` field. With ``check_gpu``, a calibration for another profile id is
    refused (``CalibrationError``).
    """
    if check_gpu and cal.gpu_profile is not None and cal.gpu_profile != gpu.id:
        raise CalibrationError(f"calibration {cal.path or cal.id}: gpu.profile = "
                               f"{cal.gpu_profile!r}: does not match the GPU profile {gpu.id!r}")
    gpu_changes: dict[str, Any] = {}
    ov_changes: dict[str, Any] = {}
    if (v := cal.value("cuda_context_bytes")) is not None:
        gpu_changes["cuda_context_bytes"] = int(v)
    if (v := cal.value("compute_efficiency")) is not None:
        gpu_changes["compute_efficiency"] = float(v)
    if (v := cal.value("compiled_compute_efficiency")) is not None:
        gpu_changes["compiled_compute_efficiency"] = float(v)
    if (v := cal.value("nccl_bytes_per_communicator")) is not None:
        ov_changes["nccl_bytes_per_communicator"] = int(v)
    if (v := cal.value("allocator_fragmentation")) is not None:
        ov_changes["allocator_fragmentation"] = float(v)
    ov_fields = {f.name for f in dataclasses.fields(overheads)}
    if model is not None and "activation_scale" in ov_fields:
        fam = cal.activation_scale.get(architecture_family(model))
        if fam is not None:
            ov_changes["activation_scale"] = float(fam.value)
    if gpu_changes:
        sources = dict(gpu.sources)
        for k in gpu_changes:
            sources[k] = f"calibration {cal.id}"
        gpu = dataclasses.replace(gpu, **gpu_changes, sources=sources)
    if ov_changes:
        overheads = dataclasses.replace(overheads, **ov_changes)
    return overheads, gpu


def apply_throughput(cal: Calibration, assumptions: Any) -> Any:
    """A ``planner.throughput.ThroughputAssumptions`` with the fitted link efficiencies."""
    changes = {k: float(v) for k in ("intra_node_comm_efficiency", "inter_node_comm_efficiency")
               if (v := cal.value(k)) is not None}
    return dataclasses.replace(assumptions, **changes) if changes else assumptions
