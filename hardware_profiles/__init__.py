"""GPU hardware profiles: one TOML file per GPU id, validated into :class:`planner.spec.GpuProfile`.

Each ``<id>.toml`` next to this module holds every field of ``GpuProfile`` except ``sources`` as
top-level keys, plus a ``[sources]`` table mapping each numeric field to where its value comes
from. Users may pass their own TOML file (same layout; ``sources`` optional).

Import cost matters: a gating CLI imports this on every call, so only the standard library (and
the pure-data ``planner.spec``) is used, and nothing is read until a function is called.
"""

from __future__ import annotations

import math
import os
import tomllib
from typing import Any

from planner.spec import GpuProfile

__all__ = [
    "NUMERIC_FIELDS",
    "PROFILE_DIR",
    "ProfileError",
    "list_profiles",
    "load_all",
    "load_profile",
]

# os.path rather than pathlib: pathlib (and difflib) cost milliseconds of import on every
# gating call; this module is on the planner's fast path.
PROFILE_DIR = os.path.dirname(os.path.abspath(__file__))
"""Directory holding the embedded ``<id>.toml`` files."""

_STR_FIELDS = ("id", "name", "vendor", "intra_node_link")
_INT_FIELDS = ("memory_bytes", "gpus_per_node", "host_ram_bytes_per_node", "cuda_context_bytes")
"""Byte counts and counts: TOML integers."""
_RATE_FIELDS = (
    "bf16_tflops",
    "fp16_tflops",
    "tf32_tflops",
    "fp32_tflops",
    "hbm_bandwidth_bytes_per_s",
    "intra_node_bandwidth_bytes_per_s",
    "inter_node_bandwidth_bytes_per_s",
    "pcie_bandwidth_bytes_per_s",
    "compute_efficiency",
)
"""Rates: positive finite numbers (TOML integer or float), stored as float."""
_NON_NEGATIVE_INT_FIELDS = frozenset({"cuda_context_bytes"})
"""May be 0 (a user who wants the planner to ignore the context); the rest must be > 0."""

_USER_OPTIONAL_FIELDS = frozenset({"compute_efficiency"})
"""A user's file may omit these (GpuProfile's default applies); embedded files may not."""

NUMERIC_FIELDS = _INT_FIELDS + _RATE_FIELDS
"""Fields that must each carry a source in the embedded profiles."""

_VALUE_FIELDS = frozenset(_STR_FIELDS + NUMERIC_FIELDS)
_ALL_KEYS = _VALUE_FIELDS | {"sources"}
"""Every field of GpuProfile (a test checks the two stay in step)."""


class ProfileError(Exception):
    """A GPU profile could not be found or is invalid. The message is a single line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


def list_profiles() -> list[str]:
    """Sorted ids of the embedded profiles."""
    return sorted(f[:-5] for f in os.listdir(PROFILE_DIR)
                  if f.endswith(".toml") and os.path.isfile(os.path.join(PROFILE_DIR, f)))


def load_all() -> dict[str, GpuProfile]:
    """Every embedded profile, by id (sorted)."""
    return {gpu_id: _load_file(os.path.join(PROFILE_DIR, f"{gpu_id}.toml"), embedded=True)
            for gpu_id in list_profiles()}


def load_profile(name_or_path: str) -> GpuProfile:
    """Load an embedded profile by id (case-insensitive) or a user TOML file by path.

    The argument is treated as a file when it names an existing file or ends with ``.toml``.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise ProfileError(f"GPU must be an id or a .toml path, got {name_or_path!r}")
    text = os.fspath(name_or_path)
    if not isinstance(text, str):
        raise ProfileError(f"GPU must be an id or a .toml path, got {name_or_path!r}")
    path = os.path.expanduser(text)
    if text.lower().endswith(".toml") or os.path.isfile(path):
        if not os.path.isfile(path):
            raise ProfileError(f"{text}: GPU profile file not found")
        return _load_file(path, embedded=False, label=text)

    key = text.strip().lower()
    known = list_profiles()
    if key in known:
        return _load_file(os.path.join(PROFILE_DIR, f"{key}.toml"), embedded=True)
    # Ids that extend what was typed ("h100" -> h100-80, h100-nvl, ...) first, then fuzzy ones.
    extending = [k for k in known if key and k.startswith(key)]
    import difflib  # only on the error path

    fuzzy = difflib.get_close_matches(key, known, n=4, cutoff=0.5)
    fuzzy = [k for k in fuzzy if k not in extending]
    close = (extending + fuzzy)[: max(4, len(extending))]
    hint = f"close matches: {', '.join(close)}" if close else "no close matches"
    raise ProfileError(
        f"unknown GPU {text!r}; {hint}; known ids: {', '.join(known)};"
        " run `fitcheck --list-gpus`"
    )


def _load_file(path: str, *, embedded: bool, label: str | None = None) -> GpuProfile:
    name = os.path.basename(path)
    label = label or name
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{label}: malformed TOML: {exc}") from None
    except OSError as exc:
        raise ProfileError(f"{label}: cannot read file: {exc.strerror or exc}") from None
    return _validate(data, label=label, stem=name[:-5] if embedded else None, embedded=embedded)


def _validate(
    data: dict[str, Any], *, label: str, stem: str | None, embedded: bool
) -> GpuProfile:
    unknown = sorted(set(data) - _ALL_KEYS)
    if unknown:
        raise ProfileError(
            f"{label}: unknown key(s) {', '.join(repr(k) for k in unknown)};"
            f" allowed: {', '.join(sorted(_ALL_KEYS))}"
        )
    required = _VALUE_FIELDS | {"sources"} if embedded else _VALUE_FIELDS - _USER_OPTIONAL_FIELDS
    missing = sorted(required - set(data))
    if missing:
        noun = "field" if len(missing) == 1 else "fields"
        raise ProfileError(f"{label}: missing {noun} {', '.join(repr(k) for k in missing)}")

    values: dict[str, Any] = {}
    for name in _STR_FIELDS:
        value = data[name]
        if not isinstance(value, str) or not value.strip():
            raise ProfileError(
                f"{label}: field {name!r} must be a non-empty string, got {value!r}"
            )
        values[name] = value
    for name in _INT_FIELDS:
        value = data[name]
        floor, what = (0, "non-negative") if name in _NON_NEGATIVE_INT_FIELDS else (1, "positive")
        if not isinstance(value, int) or isinstance(value, bool) or value < floor:
            raise ProfileError(f"{label}: field {name!r} must be a {what} integer, got {value!r}")
        values[name] = value
    for name in _RATE_FIELDS:
        if name not in data:  # an optional field of a user's file
            continue
        value = data[name]
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ProfileError(f"{label}: field {name!r} must be a positive number, got {value!r}")
        values[name] = float(value)

    if stem is not None and values["id"] != stem:
        raise ProfileError(
            f"{label}: field 'id' must equal the file name stem {stem!r}, got {values['id']!r}"
        )

    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise ProfileError(f"{label}: field 'sources' must be a table of strings, got {sources!r}")
    for key, text in sources.items():
        if key not in _VALUE_FIELDS:
            raise ProfileError(f"{label}: field 'sources' names unknown field {key!r}")
        if not isinstance(text, str) or not text.strip():
            raise ProfileError(
                f"{label}: field 'sources.{key}' must be a non-empty string, got {text!r}"
            )
    if embedded:
        unsourced = [name for name in NUMERIC_FIELDS if name not in sources]
        if unsourced:
            raise ProfileError(
                f"{label}: field 'sources' lacks an entry for {', '.join(unsourced)}"
            )

    return GpuProfile(**values, sources=dict(sources))
