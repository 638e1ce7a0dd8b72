"""The searches every inverse question uses: the fewest GPUs, the largest value that fits.

Both assume fitting is monotone in the searched value: sharding divides the model states by
the GPU count while activations stay per GPU, and activations grow with micro-batch and
sequence length while nothing else shrinks. n = 1 is special (no NCCL, no DDP buckets) and is
tried on its own.

GPU counts are any count up to one node, then whole nodes: the i-th valid count is
``count_at(i, gpn)``. ``bisect`` is the search, written once over ``planner.vec``: on plain
numbers for the plan (``smallest_n``, planner.plan ``fewest_gpus``) and on numpy arrays for the
report's sweep, one search per configuration, so both always give the same answer.
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


def any_true(x: Any) -> bool:
    """Whether a bool, or any element of a bool array, is true."""
    return bool(x.any()) if hasattr(x, "any") else bool(x)


def and_not(a: Any, b: Any) -> Any:
    """a and not b, on bools or bool arrays."""
    return vec.where(b, False, a)


def bisect(fits: Callable[[list[tuple[Any, Any]]], list[Any]], gpus_per_node: Any, *,
           start: int = 1, limit: int = MAX_GPUS_SEARCHED, levels: int = 1) -> tuple[Any, Any]:
    """(found, n): the fewest valid GPU counts n >= start that fit, per search.

    ``gpus_per_node`` is a number (one search) or an int array (one search per element).
    ``fits(queries)`` answers a list of queries, each ``(n, live)``: counts shaped like
    ``gpus_per_node`` and where they are asked (the other answers are not read); it returns
    one bool (array) per query. 1 is tried on its own (when start is 1), the rest by
    bisection over the index of the valid counts; ``found`` is False where nothing up to
    ``limit`` fits.

    ``levels`` > 1 asks the next ``levels`` steps of every search at once: every count the
    bisection may try in them (2**levels - 1 per search, and 1 with the first), then walks
    down with the answers. Counts it did not need are asked too, in fewer and larger batches
    (the report's arrays); the answer is the bisection's, whatever ``fits`` is."""
    gpn = gpus_per_node
    lo = vec.maximum(index_of(max(start, 2), gpn), 1) - 1  # known not to fit (or below)
    hi = last_index(limit, gpn) + 1  # sentinel: fits
    top = hi
    one: Any = False
    first: list[tuple[Any, Any]] = []
    if start <= 1:
        if levels == 1:
            (one,) = fits([(gpn * 0 + 1, True)])
        else:
            first = [(gpn * 0 + 1, True)]
    active = and_not(hi - lo > 1, one)
    while any_true(active):
        # the bisection's next steps: node k narrows to node 2k+1 if its count fits, 2k+2 if not
        nodes, queries = [(lo, hi)], []
        for k in range(2**levels - 1):
            a, b = nodes[k]
            mid = (a + b) // 2
            live = active & (b - a > 1)
            queries.append((count_at(vec.where(live, mid, a), gpn), live))
            nodes += [(a, mid), (mid, b)]
        answers = fits(first + queries)
        if first:
            one, answers, first = answers[0], answers[1:], []
        node: Any = 0
        for _ in range(levels):
            mid = (lo + hi) // 2
            live = active & (hi - lo > 1)
            ok = vec.choose(node, answers) & live
            hi = vec.where(ok, mid, hi)
            lo = vec.where(and_not(live, ok), mid, lo)
            node = vec.where(ok, 2 * node + 1, 2 * node + 2)
        active = and_not(hi - lo > 1, one)
    return one | (hi != top), vec.where(one, 1, count_at(hi, gpn))


def smallest_n(fits: Callable[[int], bool], gpus_per_node: int, *, start: int = 1,
               limit: int = MAX_GPUS_SEARCHED) -> int | None:
    """Fewest valid GPU counts n >= start with fits(n); None when nothing up to ``limit``
    fits (``bisect`` on one search)."""
    found, n = bisect(lambda queries: [bool(fits(q)) if live else False for q, live in queries],
                      gpus_per_node, start=start, limit=limit)
    return n if found else None


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
