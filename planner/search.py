"""The searches every inverse question uses: the fewest GPUs, the largest value that fits.

GPU counts are any count up to one node, then whole nodes; a tensor-parallel degree t runs on
its multiples only (``Counts``: the i-th count a search may try). ``first_true`` is the
bisection, written once over ``planner.vec``: on plain numbers for the plan and on numpy
arrays for the report's sweep, one search per element, so both always give the same answer.
It finds where a predicate turns true on an interval where it is false, then true;
planner.plan ``fewest_gpus`` splits the counts into such intervals (fitting is not monotone
in the GPU count over all of them: host RAM per node grows with the ranks on it, FSDP2's
padding of stacked experts grows with the ranks past the experts, and so do ZeRO-3's whole
persistent parameters when the rest is offloaded), ``bisect`` and
``smallest_n`` search a predicate that is monotone as it is, ``largest`` a value that fits
less as it grows (micro-batch, sequence length).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from planner import vec

MAX_GPUS_SEARCHED = 1 << 16


def any_true(x: Any) -> bool:
    """Whether a bool, or any element of a bool array, is true."""
    return bool(x.any()) if hasattr(x, "any") else bool(x)


def and_not(a: Any, b: Any) -> Any:
    """a and not b, on bools or bool arrays."""
    return vec.where(b, False, a)


def _gcd(a: Any, b: int) -> Any:
    if isinstance(a, int):
        return math.gcd(a, b)
    g, r = a, a * 0 + b
    while any_true(r != 0):  # Euclid, elementwise
        nz = r != 0
        g, r = vec.where(nz, r, g), vec.where(nz, g % vec.where(nz, r, 1), 0)
    return g


class Counts:
    """The GPU counts a search walks, per node size ``gpn`` (a number or an int array) and
    tensor-parallel degree ``t``: within a node the multiples of t (``within`` of them: 1 ..
    gpn when t is 1), then whole nodes whose count t divides (multiples of lcm(t, gpn) past
    one node). ``at(i)`` is the i-th (from 0); the within-node counts are indices
    [0, within), the multi-node ones from ``within`` on."""

    def __init__(self, gpn: Any, t: int = 1) -> None:
        self.gpn, self.t = gpn, t
        self.within = gpn // t
        self.step = gpn * t // _gcd(gpn, t)  # lcm: the multi-node counts' step
        self.first = gpn // self.step + 1  # the first multi-node count is first x step

    def at(self, i: Any) -> Any:
        return vec.where(i < self.within, (i + 1) * self.t,
                         (i - self.within + self.first) * self.step)

    def index_of(self, n: Any) -> Any:
        """The index of the first count >= n (n >= 1)."""
        return vec.where(n <= self.within * self.t, vec.ceil_div(n, self.t) - 1,
                         self.within + vec.maximum(vec.ceil_div(n, self.step) - self.first, 0))

    def last_index(self, limit: Any) -> Any:
        """The index of the last count <= limit (-1: none)."""
        return vec.where(limit < self.first * self.step,
                         vec.minimum(limit // self.t, self.within) - 1,
                         self.within + limit // self.step - self.first)


def count_at(i: Any, gpn: Any) -> Any:
    """The i-th valid GPU count (i from 0): 1 .. gpn, then 2 gpn, 3 gpn, ..."""
    return Counts(gpn).at(i)


def index_of(n: Any, gpn: Any) -> Any:
    """The index of the first valid count >= n (n >= 1)."""
    return Counts(gpn).index_of(n)


def last_index(limit: int, gpn: Any) -> Any:
    """The index of the last valid count <= limit."""
    return Counts(gpn).last_index(limit)


Ask = Callable[[list[tuple[Any, Any]]], list[Any]]
"""A predicate asked at many indices at once: queries ``(i, live)`` (indices shaped like the
searches, and where they are asked: the other answers are not read) -> one bool (array) per
query."""


def first_true(ask: Ask, lo: Any, hi: Any, *, levels: int = 1, top: bool = False,
               gallop: bool = False) -> Any:
    """Per search, the first index in [lo, hi) where ``ask`` is true, for a predicate that is
    false, then true there; ``hi`` where it is nowhere true. The bisection asks the middle of
    what it does not know (lo - 1 is taken as false, hi as true). ``top`` asks hi - 1 first
    (where that is false, so is everything: one question when nothing is expected);
    ``gallop`` asks lo, lo + 1, lo + 3, lo + 7, ... first (few questions when the answer is
    expected near lo).

    ``levels`` > 1 asks the next ``levels`` steps of every search at once: every index the
    bisection may try in them (2**levels - 1 per search), then walks down with the answers.
    Indices it did not need are asked too, in fewer and larger batches (the report's arrays);
    the answer is the one-step search's, whatever ``ask`` is."""
    a, b = lo - 1, hi + 0 * lo  # a: known false (or below); b: known true (or the end)
    if top:
        live = b - a > 1
        (ok,) = ask([(vec.where(live, b - 1, b), live)])
        ok = ok & live
        a = vec.where(and_not(live, ok), b - 1, a)
        b = vec.where(ok, b - 1, b)
    if gallop:
        base, k = a, 0
        active = b - a > 1
        while any_true(active):
            queries = []
            for j in range(k, k + levels):
                live = active & (base + (1 << j) < b)
                queries.append((vec.where(live, base + (1 << j), b), live))
            for (i, _), ok in zip(queries, ask(queries)):
                live = active & (i < b)
                ok = ok & live
                b = vec.where(ok, i, b)
                a = vec.where(and_not(live, ok), i, a)
                active = and_not(live, ok)
            k += levels
    active = b - a > 1
    while any_true(active):
        nodes, queries = [(a, b)], []
        for k in range(2**levels - 1):
            x, y = nodes[k]
            mid = (x + y) // 2
            live = active & (y - x > 1)
            queries.append((vec.where(live, mid, y), live))
            nodes += [(x, mid), (mid, y)]
        answers = ask(queries)
        node: Any = 0
        for _ in range(levels):
            mid = (a + b) // 2
            live = active & (b - a > 1)
            ok = vec.choose(node, answers) & live
            b = vec.where(ok, mid, b)
            a = vec.where(and_not(live, ok), mid, a)
            node = vec.where(ok, 2 * node + 1, 2 * node + 2)
        active = b - a > 1
    return b


def bisect(fits: Callable[[list[tuple[Any, Any]]], list[Any]], gpus_per_node: Any, *,
           start: int = 1, limit: int = MAX_GPUS_SEARCHED, levels: int = 1) -> tuple[Any, Any]:
    """(found, n): the fewest valid GPU counts n >= start that fit, per search, for ``fits``
    false, then true over the counts (``first_true`` on ``Counts``; 1 is tried on its own,
    when start is 1: one GPU has no NCCL and no DDP buckets). ``gpus_per_node`` is a number
    (one search) or an int array (one search per element); ``fits(queries)`` answers queries
    ``(n, live)`` of GPU counts. ``found`` is False where nothing up to ``limit`` fits."""
    counts = Counts(gpus_per_node)
    one: Any = False
    if start <= 1:
        (one,) = fits([(gpus_per_node * 0 + 1, True)])
    lo = vec.maximum(counts.index_of(max(start, 2)), 1)
    end = counts.last_index(limit) + 1
    i = first_true(lambda qs: fits([(counts.at(j), vec.where(one, False, live))
                                    for j, live in qs]),
                   vec.where(one, end, lo), end, levels=levels)
    return one | (i < end), vec.where(one, 1, counts.at(i))


def smallest_n(fits: Callable[[int], bool], gpus_per_node: int, *, start: int = 1,
               limit: int = MAX_GPUS_SEARCHED) -> int | None:
    """Fewest valid GPU counts n >= start with fits(n), fits being false, then true over the
    counts; None when nothing up to ``limit`` fits (``bisect`` on one search)."""
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
