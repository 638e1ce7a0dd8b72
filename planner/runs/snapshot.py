"""Memory snapshots (``torch.cuda.memory._dump_snapshot``), read without executing anything.

The file is a pickle of plain data: ``torch.cuda.memory._snapshot()`` returns ``{'segments':
[...], 'device_traces': [[...], ...], 'allocator_settings': {...}, ...}`` (schema:
torch/cuda/_memory_viz.py and torch/cuda/memory.py; 1.13's ``memory_snapshot()`` was the list
of segments alone). A pickle can name any importable callable and have the loader call it, so
the reader's unpickler refuses every global: dicts, lists, tuples, strings, numbers and
booleans are built by opcodes alone, and a file that needs anything else is rejected (exit 4)
before anything runs.

The trace is replayed as memory_viz replays it (``alloc`` adds a block, ``free_completed``
removes it) and each allocation is attributed to what the planner calls it from its Python
frames and its lifetime: allocated while loading -> parameters; in forward and alive at the
end of forward -> activations, freed inside forward -> transients; in backward and alive after
it -> gradients, else transients; in the optimizer step and alive after it -> optimizer
states, else optimizer temporaries; inside FSDP's all-gather -> gathered parameters, its
reduce-scatter -> communication buffers.
"""

from __future__ import annotations

import io
import pickle
from collections import defaultdict
from typing import Any

from planner.errors import InputDataError
from planner.runs.evidence import CATEGORIES, Moment, SnapshotSummary
from planner.runs.oom import traceback_moment

__all__ = ["SnapshotError", "load_snapshot", "looks_like_pickle", "summarize"]

TIMELINE_POINTS = 1500


class SnapshotError(InputDataError):
    """A snapshot file that is not one (or wants to run code): exit 4."""


class _PlainData(pickle.Unpickler):
    """Builds only what pickle's opcodes build by themselves; any global is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(f"refuses to load {module}.{name}: a memory snapshot is plain data "
                            "(dicts, lists, strings, numbers); this pickle would import and "
                            "call code, so nothing was loaded")

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("refuses a persistent id: a memory snapshot has none")


def looks_like_pickle(data: bytes) -> bool:
    return data[:1] == b"\x80" or data[:1] in (b"(", b"]", b"}")


def load_snapshot(data: bytes, where: str) -> Any:
    try:
        return _PlainData(io.BytesIO(data)).load()
    except SnapshotError as exc:
        raise SnapshotError(f"{where}: {exc}") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"{where}: not a readable memory snapshot pickle "
                            f"({type(exc).__name__}: {exc})") from None


def _frames_of(entry: dict[str, Any]) -> list[str]:
    frames = entry.get("frames")
    if frames is None and entry.get("history"):  # 2.0: blocks carry a 'history'
        frames = entry["history"][-1].get("frames", [])
    out = []
    for f in reversed(frames or []):  # the snapshot lists the innermost frame first
        if isinstance(f, dict):
            out.append(f'  File "{f.get("filename", "?")}", line {f.get("line", 0)}, '
                       f'in {f.get("name", "?")}')
    return out


def _classify(entry: dict[str, Any], cache: dict[tuple, tuple]) -> tuple[Moment, str | None, str]:
    frames = entry.get("frames") or []
    key = tuple((f.get("name"), f.get("filename")) for f in frames if isinstance(f, dict))
    if key not in cache:
        lines = _frames_of(entry)
        moment, _ev, cat, _cev = traceback_moment(lines)
        inner = frames[0] if frames and isinstance(frames[0], dict) else {}
        where = f"{inner.get('name', '?')} ({str(inner.get('filename', '?')).rsplit('/', 1)[-1]}:" \
                f"{inner.get('line', '?')})" if inner else "(no frames recorded)"
        cache[key] = (moment, cat if cat in ("gathered_params", "comm_buffers") else None, where)
    return cache[key]


def _check(doc: Any, where: str) -> tuple[list[dict], list[list[dict]], dict]:
    if isinstance(doc, list):  # 1.13 memory_snapshot(): the segments alone
        doc = {"segments": doc, "device_traces": []}
    if not isinstance(doc, dict) or "segments" not in doc:
        raise SnapshotError(f"{where}: not a memory snapshot (a dict with 'segments' and "
                            "'device_traces', from torch.cuda.memory._dump_snapshot)")
    segs = doc["segments"]
    traces = doc.get("device_traces") or []
    if not isinstance(segs, list) or not all(isinstance(s, dict) for s in segs):
        raise SnapshotError(f"{where}: segments must be a list of dicts")
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError(f"{where}: device_traces must be a list of lists")
    for s in segs:
        if not isinstance(s.get("total_size"), int) or not isinstance(s.get("blocks", []), list):
            raise SnapshotError(f"{where}: a segment without an integer total_size / blocks "
                                "list")
    return segs, traces, doc.get("allocator_settings") or {}


def summarize(doc: Any, where: str) -> SnapshotSummary:
    segs, traces, settings = _check(doc, where)
    device = max(range(len(traces)), key=lambda d: (any(e.get("action") == "oom"
                                                         for e in traces[d]), len(traces[d])),
                 default=None)
    entries = [e for e in (traces[device] if device is not None else []) if isinstance(e, dict)]
    seg_dev = [s for s in segs if device is None or s.get("device", device) == device]
    reserved = sum(s["total_size"] for s in seg_dev)
    live_blocks = [b for s in seg_dev for b in s.get("blocks", [])
                   if isinstance(b, dict) and b.get("state") == "active_allocated"]
    allocated_now = sum(int(b.get("size", 0)) for b in live_blocks)
    expandable = settings.get("expandable_segments")
    if expandable is None and seg_dev:
        expandable = any(bool(s.get("is_expandable")) for s in seg_dev) or None

    cache: dict[tuple, tuple] = {}
    # pass 1: each allocation's moment, span (a run of one moment), free position
    allocs: list[dict[str, Any]] = []
    open_by_addr: dict[int, int] = {}
    spans: list[tuple[Moment, int, int]] = []  # (moment, first entry, last entry)
    span_of_entry: list[int] = []
    cur_moment, cur_start = None, 0
    last_framed = Moment.UNKNOWN
    freed_unknown = 0
    oom = None
    for i, e in enumerate(entries):
        act = e.get("action")
        if act == "alloc":
            moment, forced, inner = _classify(e, cache)
            if not e.get("frames"):
                # no Python stack: the autograd engine's own thread (backward), or C++ code
                # with nothing above it; it continues the moment before it
                moment = Moment.BACKWARD if last_framed in (
                    Moment.FORWARD, Moment.LOSS, Moment.BACKWARD) else last_framed
                inner = "(no Python frames: the autograd engine's thread)" \
                    if moment is Moment.BACKWARD else inner
            else:
                last_framed = moment
            if moment is not cur_moment:
                if cur_moment is not None:
                    spans.append((cur_moment, cur_start, i - 1))
                cur_moment, cur_start = moment, i
            open_by_addr[e.get("addr")] = len(allocs)
            allocs.append({"i": i, "size": int(e.get("size", 0)), "moment": moment,
                           "span": len(spans), "forced": forced, "where": inner, "free": None})
        elif act in ("free_completed", "free"):
            k = open_by_addr.pop(e.get("addr"), None)
            if k is None:
                freed_unknown += int(e.get("size", 0))
            else:
                allocs[k]["free"] = i
        elif act == "oom":
            moment, _f, inner = _classify(e, cache)
            oom = {"requested_bytes": int(e.get("size", 0)),
                   "device_free_bytes": int(e.get("device_free", 0)),
                   "moment": str(moment if moment is not Moment.UNKNOWN
                                 else (cur_moment or Moment.UNKNOWN)),
                   "where": inner, "entry": i}
        span_of_entry.append(len(spans))
    if cur_moment is not None:
        spans.append((cur_moment, cur_start, len(entries) - 1))
    span_end = [end for _m, _s, end in spans]

    def category(a: dict[str, Any]) -> str:
        if a["forced"]:
            return a["forced"]
        m = a["moment"]
        end = span_end[a["span"]] if a["span"] < len(span_end) else len(entries)
        outlives = a["free"] is None or a["free"] > end
        if m is Moment.LOADING:
            return "params"
        if m in (Moment.FORWARD, Moment.LOSS):
            return "activations" if outlives else "transients"
        if m is Moment.BACKWARD:
            return "gradients" if outlives else "transients"
        if m is Moment.OPTIMIZER:
            return "optimizer_states" if outlives else "optimizer_temporaries"
        return "other"

    for a in allocs:
        a["cat"] = category(a)
    # what was allocated before the trace began: blocks alive at the dump whose allocation
    # is not in the trace, by their own frames; the rest of it freed during the trace
    traced_live = sum(a["size"] for a in allocs if a["free"] is None)
    baseline = max(0, allocated_now - traced_live) + freed_unknown
    base_cats: dict[str, int] = defaultdict(int)
    traced_addrs = set(open_by_addr)
    attributed = 0
    for b in live_blocks:
        if b.get("address") in traced_addrs:
            continue
        moment, forced, _w = _classify(b, cache)
        cat = forced or {Moment.LOADING: "params", Moment.OPTIMIZER: "optimizer_states",
                         Moment.BACKWARD: "gradients"}.get(moment, "other")
        if not b.get("frames") and not b.get("history"):
            cat = "before_trace"
        base_cats[cat] += int(b.get("size", 0))
        attributed += int(b.get("size", 0))
    if baseline > attributed:
        base_cats["before_trace"] += baseline - attributed
    # pass 2: replay
    totals: dict[str, int] = defaultdict(int, base_cats)
    current = baseline
    peak, peak_i, peak_cats = current, -1, dict(totals)
    moment_peaks: dict[Moment, int] = {}
    moment_cats: dict[Moment, dict[str, int]] = {}
    frees_at: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in allocs:
        if a["free"] is not None:
            frees_at[a["free"]].append(a)
    alloc_at = {a["i"]: a for a in allocs}
    unknown_frees = {i: int(e.get("size", 0)) for i, e in enumerate(entries)
                     if e.get("action") in ("free_completed", "free")
                     and not any(f["i"] < i for f in frees_at.get(i, []))}
    step = max(1, len(entries) // TIMELINE_POINTS)
    t0 = entries[0].get("time_us") if entries and isinstance(entries[0].get("time_us"), int) \
        else None
    timeline: list[tuple[float, dict[str, int]]] = []
    largest: list[tuple[int, str, str]] = []
    for i, e in enumerate(entries):
        if i in alloc_at:
            a = alloc_at[i]
            totals[a["cat"]] += a["size"]
            current += a["size"]
            m = a["moment"]
            if current > moment_peaks.get(m, -1):
                moment_peaks[m] = current
                moment_cats[m] = {k: v for k, v in totals.items() if v}
            if current > peak:
                peak, peak_i = current, i
                peak_cats = {k: v for k, v in totals.items() if v}
        elif i in frees_at:
            for a in frees_at[i]:
                totals[a["cat"]] -= a["size"]
                current -= a["size"]
        elif i in unknown_frees:
            totals["before_trace"] = max(0, totals["before_trace"] - unknown_frees[i])
            current -= unknown_frees[i]
        if i % step == 0 or i == len(entries) - 1:
            t = ((e.get("time_us", 0) - t0) / 1e6) if t0 is not None and \
                isinstance(e.get("time_us"), int) else float(i)
            timeline.append((t, {k: v for k, v in totals.items() if v}))
    if peak_i >= 0:
        live = [a for a in allocs if a["i"] <= peak_i and (a["free"] is None or a["free"] > peak_i)]
        largest = [(a["size"], a["cat"], a["where"])
                   for a in sorted(live, key=lambda a: -a["size"])[:8]]
    peak_moment = allocs[[a["i"] for a in allocs].index(peak_i)]["moment"] if peak_i >= 0 \
        else Moment.UNKNOWN
    if oom is not None:
        oom_cat = None
        e = entries[oom["entry"]]
        _m, forced, _w = _classify(e, cache)
        oom["category"] = forced or oom_cat
    span_times = []
    for m, s, end in spans:
        ts = entries[s].get("time_us")
        te = entries[end].get("time_us")
        if t0 is not None and isinstance(ts, int) and isinstance(te, int):
            span_times.append((m, (ts - t0) / 1e6, (te - t0) / 1e6))
        else:
            span_times.append((m, float(s), float(end)))
    for cats in (peak_cats, *moment_cats.values()):
        for k in list(cats):
            if k not in CATEGORIES and k not in ("other", "before_trace"):
                cats["other"] = cats.get("other", 0) + cats.pop(k)
    return SnapshotSummary(
        where=where, reserved_bytes=reserved, allocated_bytes=allocated_now,
        peak_allocated_bytes=max(peak, allocated_now if not entries else peak),
        peak_moment=peak_moment, moment_peaks=moment_peaks, categories_at_peak=peak_cats,
        moment_categories=moment_cats,
        expandable_segments=None if expandable is None else bool(expandable), oom=oom,
        largest_at_peak=tuple(largest), timeline=tuple(timeline),
        moment_spans=tuple(span_times), trace_entries=len(entries), baseline_bytes=baseline)
