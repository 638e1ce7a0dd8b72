"""Memory snapshots: read as plain data only (a pickle that wants to run code is refused
before anything runs), replayed, and attributed to what the planner calls each allocation."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from planner.errors import EXIT_BAD_DATA
from planner.runs.evidence import Moment
from planner.runs.read import read_file
from planner.runs.snapshot import SnapshotError, load_snapshot, summarize

GPU = Path(__file__).parent / "data" / "gpu"
SNAP = GPU / "memory_snapshot-h200-small-step.pickle"
MiB = 2**20


class _WritesAFile:
    """Unpickling this calls open(path, 'w'): what a malicious snapshot would do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    target = tmp_path / "pwned"
    evil = tmp_path / "snapshot.pickle"
    evil.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_WritesAFile(str(target))]]}))
    with pytest.raises(SnapshotError) as e:
        read_file(str(evil))
    assert e.value.exit_code == EXIT_BAD_DATA
    assert "io.open" in str(e.value) or "builtins.open" in str(e.value)
    assert "nothing was loaded" in str(e.value)
    assert not target.exists()
    # an os.system payload names its callable the same way
    class _Shell:
        def __reduce__(self):
            return (os.system, (f"touch {target}",))
    evil.write_bytes(pickle.dumps([_Shell()]))
    with pytest.raises(SnapshotError, match="system"):
        read_file(str(evil))
    assert not target.exists()


def test_broken_or_foreign_pickles_are_bad_data(tmp_path):
    p = tmp_path / "x.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": []})[:-3])
    with pytest.raises(SnapshotError, match="not a readable memory snapshot"):
        read_file(str(p))
    p.write_bytes(pickle.dumps({"weights": [1, 2, 3]}))
    with pytest.raises(SnapshotError, match="not a memory snapshot"):
        read_file(str(p))


def test_the_h200_snapshot():
    run, _ = read_file(str(SNAP))
    (s,) = run.snapshots
    # 692 alloc + 649 free_requested + 649 free_completed + 27 segment_alloc entries
    assert s.trace_entries == 2017
    # benchmarks/gpu_runs/2026-11-26-h200/run1-records.jsonl, record 'snapshot':
    # max_allocated_bytes 369620480 over the same two steps (the replay starts when the
    # recording did; within 2 %), max_reserved_bytes 411041792 >= the segments at the dump
    assert abs(s.peak_allocated_bytes - 369620480) / 369620480 < 0.02
    assert s.reserved_bytes <= 411041792
    assert s.peak_moment is Moment.BACKWARD
    assert s.expandable_segments is False and s.oom is None
    # the forward grows to the loss, backward is the peak, the optimizer step is below both
    p = s.moment_peaks
    assert p[Moment.FORWARD] < p[Moment.LOSS] < p[Moment.BACKWARD]
    assert p[Moment.OPTIMIZER] < p[Moment.FORWARD]
    cats = s.categories_at_peak
    assert {"activations", "gradients", "optimizer_states"} <= set(cats)
    # the weights were built before the recording began: 2 layers x hidden 512, vocab 8192,
    # tied embeddings (probes/gpu_cases.py _tiny_llama_dict), fp32: about 39 MiB
    assert 30 * MiB < cats["before_trace"] < 45 * MiB
    assert s.moment_categories[Moment.OPTIMIZER].get("optimizer_temporaries", 0) > 0


def _entry(action, addr, size, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}


F_FWD = [{"name": "forward", "filename": "torch/nn/modules/linear.py", "line": 125}]
F_BWD = [{"name": "_engine_run_backward", "filename": "torch/autograd/graph.py", "line": 1},
         {"name": "run", "filename": "train.py", "line": 9}]
F_OPT = [{"name": "_multi_tensor_adam", "filename": "torch/optim/adam.py", "line": 1}]
F_AG = [{"name": "foreach_all_gather", "filename": "torch/distributed/fsdp/_fully_shard/"
         "_fsdp_collectives.py", "line": 1},
        {"name": "_engine_run_backward", "filename": "torch/autograd/graph.py", "line": 1}]


def test_attribution_by_moment_and_lifetime():
    trace = [
        _entry("alloc", 1, 100, F_FWD),           # activation: alive when forward ends
        _entry("alloc", 2, 10, F_FWD),            # temporary of forward
        _entry("free_completed", 2, 10, F_FWD),
        _entry("alloc", 3, 40, F_BWD),            # gradient: alive after backward
        _entry("alloc", 4, 30, F_BWD),            # backward temporary
        _entry("free_completed", 4, 30, F_BWD),
        _entry("alloc", 5, 25, F_AG),             # FSDP all-gather output
        _entry("free_completed", 5, 25, F_AG),
        _entry("free_completed", 1, 100, F_BWD),
        _entry("alloc", 6, 80, F_OPT),            # optimizer state (outlives the step)
        _entry("alloc", 7, 20, F_OPT),            # optimizer temporary
        _entry("free_completed", 7, 20, F_OPT),
        {"action": "oom", "size": 500, "device_free": 7, "frames": F_OPT, "addr": 0,
         "stream": 0},
    ]
    doc = {"segments": [{"device": 0, "total_size": 1024, "blocks": [
        {"address": 3, "size": 40, "state": "active_allocated", "frames": F_BWD},
        {"address": 6, "size": 80, "state": "active_allocated", "frames": F_OPT}]}],
        "device_traces": [trace]}
    s = summarize(load_snapshot(pickle.dumps(doc), "synthetic"), "synthetic")
    assert s.allocated_bytes == 120 and s.reserved_bytes == 1024 and s.baseline_bytes == 0
    # the peak: activation 100 + gradient 40 + backward temporary 30 = 170 at entry 4
    assert s.peak_allocated_bytes == 170 and s.peak_moment is Moment.BACKWARD
    assert s.categories_at_peak == {"activations": 100, "gradients": 40, "transients": 30}
    assert s.moment_peaks[Moment.FORWARD] == 110
    assert s.moment_categories[Moment.OPTIMIZER] == {"gradients": 40, "optimizer_states": 80,
                                                     "optimizer_temporaries": 20}
    # the all-gather buffer is named by its frame, whatever the moment
    assert max(s.moment_peaks.values()) == 170
    assert s.oom == {"requested_bytes": 500, "device_free_bytes": 7, "moment": "optimizer",
                     "where": "_multi_tensor_adam (adam.py:1)", "entry": 12, "category": None}
