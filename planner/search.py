"""The searches every inverse question uses: the fewest GPUs, the largest value that fits.

Both assume fitting is monotone in the searched value: sharding divides the model states by
the GPU count while activations stay per GPU, and activations grow with micro-batch and
sequence length while nothing else shrinks. n = 1 is special (no NCCL, no DDP buckets) and is
tried on its own.

GPU counts are any count up to one node, then whole nodes: the i-th valid count is
``count_at(i, gpn)``. ``smallest_n`` bisects over that index; the report's sweep runs the very
same bisection on numpy arrays, one search per configuration (``smallest_n_many``), so both
always give the same answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner import vec

MAX_GPUS_SEARCHED = 1 << 16


def count_at(i: Any, gpn: Any) -> Any:
    """The i-th valid GPU count (i from 0): 1 .. gpn, then 2 gpn, 3 gpn, ..."""
    return vec.where(i < gpn, i + 1, (i - gpn + 2) * gpn)


def index_of(n: Any, gpn: Any) -> Any:
    """The index of the first valid count >= n (n >= 1)."""
    return vec.where(n <= gpn, n - 1, gpn - 2 + vec.ceil_div(n, gpn))


def last_index(limit: int, gpn: Any) -> Any:
    """The index of the last valid count <= limit."""
    return vec.where(limit < gpn, limit - 1, gpn - 2 + limit // gpn)


def smallest_n(fits: Callable[[int], bool], gpus_per_node: int, *, start: int = 1,
               limit: int = MAX_GPUS_SEARCHED) -> int | None:
    """Fewest valid GPU counts n >= start with fits(n); None when nothing up to ``limit``
    fits. 1 is tried on its own (when start is 1), the rest by bisection over the index."""
    if start <= 1 and fits(1):
        return 1
    lo = max(index_of(max(start, 2), gpus_per_node), 1) - 1  # known not to fit (or below)
    hi = last_index(limit, gpus_per_node) + 1  # sentinel: fits
    top = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(count_at(mid, gpus_per_node)):
            hi = mid
        else:
            lo = mid
    return None if hi == top else count_at(hi, gpus_per_node)


def smallest_n_many(fits: Callable[[Any], Any], gpus_per_node: Any,
                    limit: int = MAX_GPUS_SEARCHED) -> Any:
    """``smallest_n`` (start 1) for many searches at once: ``gpus_per_node`` is an int array,
    ``fits`` maps an array of counts to a bool array. Returns an int array, -1 for none."""
    import numpy as np

    gpn = np.asarray(gpus_per_node, dtype=np.int64)
    one = np.asarray(fits(np.ones_like(gpn)), dtype=bool)
    lo = np.zeros_like(gpn)
    hi = np.asarray(last_index(limit, gpn), dtype=np.int64) + 1
    top = hi.copy()
    while np.any(hi - lo > 1):
        active = hi - lo > 1
        mid = (lo + hi) // 2
        ok = np.asarray(fits(count_at(np.where(active, mid, lo), gpn)), dtype=bool) & active
        hi = np.where(ok, mid, hi)
        lo = np.where(active & ~ok, mid, lo)
    out = np.where(hi == top, -1, count_at(hi, gpn))
    return np.where(one, 1, out)


def largest(fits: Callable[[int], bool], limit: int) -> int | None:
    """Largest v in [1, limit] with fits(v), fits being monotone decreasing in v."""
    if not fits(1):
        return None
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo
