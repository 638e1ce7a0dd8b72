"""GPU hardware profiles: one TOML file per GPU id, and the one loader that validates them.

Each ``<id>.toml`` next to this module holds the GPU's values as top-level keys plus a
``[sources]`` table naming where each numeric value comes from. Users may pass their own TOML
file (same layout; ``sources`` optional). ``calibrations/`` holds fitted runtime terms per GPU
(docs/calibration.md).

This package is data: it imports nothing from the planner and returns plain dicts of checked
values; ``planner.hardware`` turns them into ``GpuProfile``. Every value has a physical range,
and error messages name the file and the field, never a value or a key read from the file
(a spec may name a file the server can read, and its contents must not leak into a reply).
Only the standard library is used, and nothing is read until a function is called.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import tomllib
from typing import Any

__all__ = [
    "CALIBRATION_DIR",
    "FIELDS",
    "NUMERIC_FIELDS",
    "PROFILE_DIR",
    "ProfileError",
    "list_profiles",
    "read_all",
    "read_file",
    "read_profile",
]

# os.path rather than pathlib: pathlib (and difflib) cost milliseconds of import on every
# gating call; this module is on the planner's fast path.
PROFILE_DIR = os.path.dirname(os.path.abspath(__file__))
"""Directory holding the embedded ``<id>.toml`` files."""
CALIBRATION_DIR = os.path.join(PROFILE_DIR, "calibrations")
"""Shipped calibration files (``<gpu>-*.json``), installed with the package."""
MAX_FILE_BYTES = 1 << 20

_STR_FIELDS = ("id", "name", "vendor", "intra_node_link")
_INT_RANGES: dict[str, tuple[int, int]] = {
    "memory_bytes": (1 << 30, 1 << 46),  # 1 GiB .. 64 TiB
    "gpus_per_node": (1, 4096),
    "host_ram_bytes_per_node": (1 << 30, 1 << 50),  # 1 GiB .. 1 PiB
    "cuda_context_bytes": (0, 1 << 36),  # 0 .. 64 GiB (and below memory_bytes)
}
"""Byte counts and counts: TOML integers in these closed ranges."""
_RATE_RANGES: dict[str, tuple[float, float]] = {
    "bf16_tflops": (0.1, 1e5),
    "fp16_tflops": (0.1, 1e5),
    "tf32_tflops": (0.1, 1e5),
    "fp32_tflops": (0.1, 1e5),
    "fp8_tflops": (0.1, 1e5),
    "fp8_matmul_speedup": (0.1, 10.0),
    "fp8_rowwise_matmul_speedup": (0.1, 10.0),
    "hbm_bandwidth_bytes_per_s": (1e9, 1e14),
    "intra_node_bandwidth_bytes_per_s": (1e8, 1e14),
    "inter_node_bandwidth_bytes_per_s": (1e7, 1e14),
    "pcie_bandwidth_bytes_per_s": (1e8, 1e13),
    "compute_efficiency": (0.01, 1.0),
    "compiled_compute_efficiency": (0.01, 1.0),
}
"""Rates: finite numbers (TOML integer or float) in these closed ranges, stored as float."""
_USER_OPTIONAL_FIELDS = frozenset({"compute_efficiency", "compiled_compute_efficiency"})
"""A user's file may omit these (GpuProfile's default applies); embedded files may not."""
_OPTIONAL_FIELDS = frozenset({"fp8_tflops", "fp8_matmul_speedup", "fp8_rowwise_matmul_speedup"})
"""Any file may omit these: a GPU without float8 tensor cores (A100 and older, MI250X) has no
fp8 peak, and float8 training is refused on it; a GPU whose float8 matmuls were not measured
has no ``fp8_*matmul_speedup`` (the datasheet peaks' ratio is assumed)."""

NUMERIC_FIELDS: tuple[str, ...] = tuple(_INT_RANGES) + tuple(_RATE_RANGES)
"""Fields that must each carry a source in the embedded profiles."""
FIELDS: frozenset[str] = frozenset(_STR_FIELDS + NUMERIC_FIELDS)
"""Every value field of a profile (a test checks planner.spec.GpuProfile has the same)."""


class ProfileError(Exception):
    """A GPU profile could not be found or is invalid. The message is a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def list_profiles() -> list[str]:
    """Sorted ids of the embedded profiles."""
    return sorted(f[:-5] for f in os.listdir(PROFILE_DIR)
                  if f.endswith(".toml") and os.path.isfile(os.path.join(PROFILE_DIR, f)))


def read_all() -> dict[str, dict[str, Any]]:
    """Every embedded profile's values, by id (sorted)."""
    return {gpu_id: read_profile(gpu_id) for gpu_id in list_profiles()}


def read_profile(gpu_id: str) -> dict[str, Any]:
    """An embedded profile by id (case-insensitive). Never reads any other file."""
    if not isinstance(gpu_id, str):
        raise ProfileError(f"GPU must be a profile id, got {type(gpu_id).__name__}")
    key = gpu_id.strip().lower()
    known = list_profiles()
    if key in known:
        path = os.path.join(PROFILE_DIR, f"{key}.toml")
        try:
            st = os.stat(path)
        except OSError:
            return _load(path, embedded=True, label=f"{key}.toml")  # says why, by name
        return copy.deepcopy(_embedded(path, st.st_mtime_ns, st.st_size, f"{key}.toml"))
    # Ids that extend what was typed ("h100" -> h100-80, h100-nvl, ...) first, then fuzzy ones.
    extending = [k for k in known if key and k.startswith(key)]
    import difflib  # only on the error path

    fuzzy = [k for k in difflib.get_close_matches(key, known, n=4, cutoff=0.5)
             if k not in extending]
    close = (extending + fuzzy)[: max(4, len(extending))]
    hint = f"close matches: {', '.join(close)}" if close else "no close matches"
    shown = gpu_id if len(gpu_id) <= 40 else gpu_id[:37] + "..."
    raise ProfileError(f"unknown GPU {shown!r}; {hint}; known ids: {', '.join(known)}; "
                       "run `fitcheck --list-gpus`, or give a path to a TOML profile")


@functools.lru_cache(maxsize=64)
def _embedded(path: str, mtime_ns: int, size: int, label: str) -> dict[str, Any]:
    """An embedded profile's values, parsed once per version of its file (the mesh search
    reads one per layout); keyed by the file's path, modification time and size, so a
    changed file is read again. Callers get a copy (read_profile)."""
    return _load(path, embedded=True, label=label)


def read_file(path: str) -> dict[str, Any]:
    """A user's TOML profile file."""
    if not os.path.isfile(path):
        raise ProfileError(f"{path}: GPU profile file not found")
    return _load(path, embedded=False, label=path)


def _load(path: str, *, embedded: bool, label: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"{label}: cannot read file: {exc.strerror or type(exc).__name__}") \
            from None
    if len(raw) > MAX_FILE_BYTES:
        raise ProfileError(f"{label}: larger than {MAX_FILE_BYTES} bytes; not a GPU profile")
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ProfileError(f"{label}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        where = str(exc)
        where = where[where.find("(at "):] if "(at " in where else ""
        raise ProfileError(f"{label}: malformed TOML {where}".strip()) from None
    except RecursionError:
        raise ProfileError(f"{label}: nested too deeply") from None
    except ValueError:  # e.g. an integer of more than 4,300 digits
        raise ProfileError(f"{label}: a value is out of range for a GPU profile") from None
    stem = os.path.basename(path)[:-5] if embedded else None
    return _validate(data, label=label, stem=stem, embedded=embedded)


def _validate(data: dict[str, Any], *, label: str, stem: str | None,
              embedded: bool) -> dict[str, Any]:
    unknown = set(data) - FIELDS - {"sources"}
    if unknown:
        raise ProfileError(f"{label}: {len(unknown)} key(s) not in the profile schema; allowed: "
                           f"{', '.join(sorted(FIELDS | {'sources'}))}")
    required = (FIELDS | {"sources"} if embedded else FIELDS - _USER_OPTIONAL_FIELDS) \
        - _OPTIONAL_FIELDS
    missing = sorted(required - set(data))
    if missing:
        noun = "field" if len(missing) == 1 else "fields"
        raise ProfileError(f"{label}: missing {noun} {', '.join(repr(k) for k in missing)}")

    values: dict[str, Any] = {}
    for name in _STR_FIELDS:
        value = data[name]
        if not isinstance(value, str) or not value.strip() or len(value) > 200:
            raise ProfileError(f"{label}: field {name!r} must be a non-empty string of at most "
                               "200 characters")
        values[name] = value
    for name, (lo, hi) in _INT_RANGES.items():
        value = data[name]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise ProfileError(f"{label}: field {name!r} must be an integer in [{lo}, {hi}]")
        values[name] = value
    if values["cuda_context_bytes"] >= values["memory_bytes"]:
        raise ProfileError(f"{label}: field 'cuda_context_bytes' must be below 'memory_bytes'")
    for name, (flo, fhi) in _RATE_RANGES.items():
        if name not in data:  # an optional field of a user's file
            continue
        value = data[name]
        if (not isinstance(value, (int, float)) or isinstance(value, bool)
                or not math.isfinite(value) or not flo <= value <= fhi):
            raise ProfileError(f"{label}: field {name!r} must be a number in [{flo:g}, {fhi:g}]")
        values[name] = float(value)

    if stem is not None and values["id"] != stem:
        raise ProfileError(f"{label}: field 'id' must equal the file name stem {stem!r}")

    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise ProfileError(f"{label}: field 'sources' must be a table of strings")
    for key, note in sources.items():
        if key not in FIELDS:
            raise ProfileError(f"{label}: table 'sources' has an entry for a field not in the "
                               "profile schema")
        if not isinstance(note, str) or not note.strip():
            raise ProfileError(f"{label}: field 'sources.{key}' must be a non-empty string")
    if embedded:
        unsourced = [name for name in NUMERIC_FIELDS if name in data and name not in sources]
        if unsourced:
            raise ProfileError(f"{label}: field 'sources' lacks an entry for "
                               f"{', '.join(unsourced)}")
    values["sources"] = dict(sources)
    return values
