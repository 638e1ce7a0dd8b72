"""Byte counts as training tools print them, read back as integer bytes with their resolution.

Every figure a run leaves behind was rounded by the tool that printed it. c10's
``format_size`` (c10/cuda/CUDACachingAllocator.cpp) prints ``%.2f`` of the largest binary unit
under which the value fits: ``N bytes`` up to 1 KiB, then KiB, MiB, GiB, so ``12.50 MiB`` is
12.50 x 2**20 bytes +- 0.005 MiB. Other tools print ``GB`` or ``MB`` for binary units
(DeepSpeed's ``see_memory_usage`` divides by 1024**3 and prints "GB"; the HF Trainer's
``metrics_format`` prints ``v >> 20`` as "MB"): each reader states the base it uses, never
this module.
"""

from __future__ import annotations

import re

from planner.lazy_dataclass import dataclass

__all__ = ["BINARY", "DECIMAL", "GiB", "KiB", "MiB", "Figure", "figure", "gib", "parse_size",
           "size"]

KiB, MiB, GiB = 2**10, 2**20, 2**30
BINARY = {"bytes": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 2**40}
"""Unit names of c10's format_size (and their case-insensitive spellings)."""
DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}

_SIZE = re.compile(r"^\s*(?P<num>[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?P<unit>bytes|[KMGT]i?B|B)\s*$",
                   re.I)


@dataclass(frozen=True, slots=True)
class Figure:
    """A measured byte count as printed: ``value`` integer bytes, ``resolution`` the half-step
    of the printed rounding (the true value is within value +- resolution)."""

    value: int
    resolution: int = 0
    text: str = ""
    """The figure as it was printed ("138.31 GiB")."""

    def __int__(self) -> int:
        return self.value


def figure(number: str, unit_bytes: int, text: str = "") -> Figure:
    """``number`` (as printed, commas allowed) x ``unit_bytes``, with the rounding of its
    printed decimals as resolution."""
    digits = number.replace(",", "")
    decimals = len(digits.split(".", 1)[1]) if "." in digits else 0
    value = round(float(digits) * unit_bytes)
    half_step = unit_bytes * 10.0 ** (-decimals) / 2
    return Figure(value=value, resolution=int(round(half_step)) if unit_bytes > 1 else 0,
                  text=text or f"{number}")


def parse_size(text: str, *, gb: int = GiB, mb: int = MiB) -> Figure:
    """'12.50 MiB' / '0 bytes' / '1.70 GiB' -> Figure. ``gb``/``mb``: what the tool meant by
    "GB"/"MB" (binary unless the reader says decimal). ValueError on anything else."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    unit = m.group("unit").lower()
    factor = {"gb": gb, "mb": mb, "kb": KiB, "tb": 2**40}.get(unit) or BINARY.get(unit)
    if factor is None:
        raise ValueError(f"unknown unit in {text!r}")
    return figure(m.group("num"), factor, text.strip())


def gib(n: int | float | None) -> str:
    """'12.34 GiB' (2**30) for a byte count; '-' for None."""
    return "-" if n is None else f"{n / GiB:.2f} GiB"


def size(n: int | float | None) -> str:
    """'138.31 GiB' or, under one GiB, '224.00 MiB' (2**30, 2**20); '-' for None."""
    if n is None:
        return "-"
    if abs(n) < GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"
