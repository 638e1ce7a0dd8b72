"""Checks for user-given values, shared by every front end (flags, gate specs, job configs).

Each check takes the raw value (a string from the command line, or a JSON/YAML/TOML value)
and returns the typed value, or raises ``ValueError`` with a message that does not name the
field: the caller prefixes the flag or spec path the user wrote. Every number has a physical
range, so a 4,300-digit integer or 1e308 is a clear error, never an overflow later.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from typing import Any, TypeVar

E = TypeVar("E", bound=enum.Enum)

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
MAX_DIGITS = 30
"""Integers longer than this are refused before Python converts them (a 4,301-digit integer
otherwise raises inside int())."""


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _type(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def count(raw: Any, *, limit: int, what: str = "a positive integer") -> int:
    """A positive integer no larger than ``limit``; integral floats from JSON are accepted."""
    if isinstance(raw, str):
        text = raw.strip().replace("_", "")
        if len(text) > MAX_DIGITS or not text.lstrip("+").isdigit():
            raise ValueError(f"must be {what}, got {_show(raw)}")
        raw = int(text)
    elif isinstance(raw, float) and not isinstance(raw, bool):
        if not math.isfinite(raw) or not raw.is_integer():
            raise ValueError(f"must be {what}, got {_show(raw)}")
        if abs(raw) > limit:
            raise ValueError(f"must be at most {limit:,}, got {raw:g}")
        raw = int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool):
        raise ValueError(f"must be {what}, got {_type(raw)} {_show(raw)}")
    if raw <= 0:
        raise ValueError(f"must be {what}, got {raw}")
    if raw > limit:
        raise ValueError(f"must be at most {limit:,}, got {_show(raw)}")
    return raw


def number(raw: Any, *, low: float, high: float, low_open: bool = False,
           high_open: bool = False) -> float:
    """A finite number in [low, high] (open ends as asked)."""
    if isinstance(raw, str):
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(f"must be a number, got {_show(raw)}") from None
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = math.inf if isinstance(raw, int) and abs(raw) > 10**MAX_DIGITS else float(raw)
    else:
        raise ValueError(f"must be a number, got {_type(raw)} {_show(raw)}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {_show(raw)}")
    lo_ok = value > low if low_open else value >= low
    hi_ok = value < high if high_open else value <= high
    if not (lo_ok and hi_ok):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"must be in {interval}, got {value:g}")
    return value


def choice(raw: Any, enum_cls: type[E], extra: tuple[str, ...] = ()) -> E | str:
    """One of the enum's values (case-insensitive), or one of ``extra`` (returned as str)."""
    if not isinstance(raw, str) or not raw.strip():
        names = tuple(str(e.value) for e in enum_cls) + extra
        raise ValueError(f"must be one of {', '.join(names)}, got {_type(raw)} {_show(raw)}")
    key = raw.strip().lower()
    if key in extra:
        return key
    # the member whose value is key, looked up (the map holds every member by its value)
    found = enum_cls._value2member_map_.get(key)  # type: ignore[attr-defined]
    if found is not None:
        return found
    for e in enum_cls:  # values the map cannot hold
        if e.value == key:
            return e
    names = tuple(str(e.value) for e in enum_cls) + extra
    raise ValueError(f"unknown value {_show(raw)}; choose from {', '.join(names)}")


def boolean(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return raw.strip().lower() in ("true", "yes", "1")
    raise ValueError(f"must be true or false, got {_show(raw)}")


def text(raw: Any, *, limit: int = 4096) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"must be a non-empty string, got {_type(raw)} {_show(raw)}")
    if len(raw) > limit:
        raise ValueError(f"must be at most {limit} characters, got {len(raw)}")
    return raw.strip()


def path_or_mapping(raw: Any) -> str | dict:
    """A path (text), or a mapping given in place of the file it names (a webhook annotation's
    inline config.json: it cannot name a file)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    return text(raw)


def params(raw: Any, *, limit: float) -> float:
    """'13e9', '13B', '1.5t', '7_000_000_000' or a number -> a positive finite float."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError(f"must be a number like 8e9 or a string like '8B', got {_show(raw)}")
    if isinstance(raw, (int, float)):
        value = math.inf if isinstance(raw, int) and abs(raw) > 10**MAX_DIGITS else float(raw)
    else:
        body = raw.strip().replace("_", "")
        scale = 1.0
        if body and body[-1].lower() in _SUFFIX:
            scale = _SUFFIX[body[-1].lower()]
            body = body[:-1]
        if len(body) > MAX_DIGITS:
            raise ValueError(f"expected a number of parameters like 13e9 or 13B, got {_show(raw)}")
        try:
            value = float(body) * scale
        except ValueError:
            raise ValueError("expected a number of parameters like 13e9 or 13B, got "
                             f"{_show(raw)}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be a positive finite number, got {_show(raw)}")
    if value > limit:
        raise ValueError(f"must be at most {limit:g}, got {value:g}")
    return value


def looks_like_path(s: str) -> bool:
    """Explicitly a path: has a directory separator, a TOML/JSON suffix, or starts with '.' or
    '~'. A bare word is never looked up on disk."""
    return ("/" in s or "\\" in s or s.endswith((".toml", ".json")) or s.startswith((".", "~")))
