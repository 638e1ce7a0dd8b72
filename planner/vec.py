"""Arithmetic that reads the same on Python ints and on numpy arrays.

The memory and step-time models are written once. The planner evaluates them on plain
numbers (the planning path never imports numpy); ``planner.report.sweep`` evaluates the same
functions on numpy arrays, one element per configuration. Branches on categorical inputs (strategy,
precision, checkpointing) stay Python ``if``s; anything that depends on a number that may be
an array (GPU count, sequence length, micro-batch) goes through these helpers instead of
``max``/``min``/``if``.
"""

from __future__ import annotations

import math
from typing import Any

Num = Any
"""An int (or float), or a numpy array of them."""


def _np() -> Any:
    import numpy

    return numpy


_SCALARS = (int, float, bool)


def _scalar(*xs: Any) -> bool:
    for x in xs:  # a loop, not all(...) over a generator: called on every plan's every term
        if not isinstance(x, _SCALARS):
            return False
    return True


def ceil_div(x: Num, s: Num) -> Num:
    """Per-rank share of x elements sharded s ways (ceil: FSDP pads dim 0)."""
    return -(-x // s)


def maximum(a: Num, b: Num) -> Num:
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if a >= b else b
    return _np().maximum(a, b)


def minimum(a: Num, b: Num) -> Num:
    if isinstance(a, _SCALARS) and isinstance(b, _SCALARS):
        return a if a <= b else b
    return _np().minimum(a, b)


def where(cond: Any, a: Num, b: Num) -> Num:
    if isinstance(cond, bool) or (_scalar(cond) and not hasattr(cond, "shape")):
        return a if cond else b
    return _np().where(cond, a, b)


def ceil(x: Num) -> Num:
    """ceil(x) as a float (array: float64)."""
    if _scalar(x):
        return float(math.ceil(x))
    return _np().ceil(x)


def ceil_int(x: Num) -> Num:
    """ceil(x) as an integer (array: int64)."""
    if _scalar(x):
        return int(math.ceil(x))
    return _np().ceil(x).astype("int64")


def floor_int(x: Num) -> Num:
    """int(x) for non-negative x: floor, as an integer (array: int64)."""
    if _scalar(x):
        return int(x)
    return _np().floor(x).astype("int64")


def argmax(values: list[Num]) -> Num:
    """Index of the largest value (the first on ties), elementwise for arrays."""
    if _scalar(*values):
        best = 0
        for i, v in enumerate(values):
            if v > values[best]:
                best = i
        return best
    np = _np()
    top, index = values[0], np.zeros(np.broadcast_shapes(*map(np.shape, values)), np.int64)
    for i, v in enumerate(values[1:], 1):
        better = v > top
        index = np.where(better, i, index)
        top = np.where(better, v, top)
    return index


def choose(index: Num, options: list[Num]) -> Num:
    """options[index], elementwise for arrays."""
    if _scalar(index):
        return options[int(index)]
    np = _np()
    out = options[0]
    for i, v in enumerate(options[1:], 1):
        out = np.where(index == i, v, out)
    return out
