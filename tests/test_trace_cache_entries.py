"""A trace cache entry is read back only when it has the shape a result has (issue 22, item
10): ``null``, ``[]`` or a result missing what the readers use is a miss, never a crash of
every later `--from-trace` for that job. The last test traces a real (tiny) class."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from probes.trace_cache import TraceCache, key_inputs, key_of

JOB = {"source": {"kind": "reference"}, "world_size": 2, "candidate": {"strategy": "ddp"}}
INSPECT_JOB = {"inspect": {"name": "x"}}
TRACE = {"ok": True, "peak_bytes": 10, "peak_phase": "backward", "at_peak": {"params": 4},
         "max_by_category": {"params": 4}, "moments": {"forward": {"peak_bytes": 8,
                                                                   "at_peak": {"params": 4}}},
         "sub_moments": {"forward": {"0": {"peak_bytes": 8, "at_peak": {"params": 4}}}},
         "end_of_step": {"params": 4}, "model": {}, "n_blocks": 2, "n_params": 2,
         "n_trainable_params": 2, "optimizer_scalar_bytes": 0,
         "optimizer_scalars_on_host": True}
"""Every key probes/trace_cache.TRACE_KEYS names, with the types probes/trace.py writes."""
INSPECT = {"ok": True, "inspect": {"class": "LlamaForCausalLM", "n_layers": 6, "period": 1,
                                   "params": 10, "active_params": 10, "per_block_params": [1],
                                   "root_params": 4, "matmul_per_block": [1], "matmul_head": 1,
                                   "q_dim": 8, "hidden": 8, "experts": None}}
FAILURE = {"ok": False, "unsupported": True, "reason": "no such thing", "deterministic": True}


def _write(cache: TraceCache, job: dict, text: str) -> None:
    cache.directory.mkdir(parents=True, exist_ok=True)
    (cache.directory / f"{key_of(key_inputs(job))}.json").write_text(text)


@pytest.mark.parametrize("job,result", [(JOB, TRACE), (INSPECT_JOB, INSPECT), (JOB, FAILURE)])
def test_a_result_of_the_right_shape_is_read_back(tmp_path, job, result):
    cache = TraceCache(tmp_path)
    cache.put(job, result)
    assert cache.get(job) == result


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


BAD_RESULTS = [
    None, [], "x", 3, {}, {"ok": True}, {"ok": "yes"},
    _without(TRACE, "moments"), {**TRACE, "peak_bytes": "10"}, {**TRACE, "peak_bytes": -1},
    {**TRACE, "peak_bytes": True}, {**TRACE, "at_peak": {"params": 1.5}},
    {**TRACE, "moments": {"forward": None}}, {**TRACE, "moments": []},
    {**TRACE, "sub_moments": {"forward": {"0": {"peak_bytes": 1}}}},
    {**TRACE, "optimizer_scalars_on_host": 1},
    {**FAILURE, "reason": None}, _without(FAILURE, "deterministic"),
]


@pytest.mark.parametrize("result", BAD_RESULTS, ids=[str(i) for i in range(len(BAD_RESULTS))])
def test_a_result_of_another_shape_is_a_miss(tmp_path, result):
    cache = TraceCache(tmp_path)
    _write(cache, JOB, json.dumps({"inputs": key_inputs(JOB), "result": result}))
    assert cache.get(JOB) is None


@pytest.mark.parametrize("inspect", [
    None, [], {**INSPECT["inspect"], "n_layers": 0}, _without(INSPECT["inspect"], "q_dim"),
    {**INSPECT["inspect"], "per_block_params": [1, "2"]}, {**INSPECT["inspect"], "hidden": "8"}])
def test_an_inspection_of_another_shape_is_a_miss(tmp_path, inspect):
    cache = TraceCache(tmp_path)
    _write(cache, INSPECT_JOB, json.dumps({"inputs": key_inputs(INSPECT_JOB),
                                           "result": {"ok": True, "inspect": inspect}}))
    assert cache.get(INSPECT_JOB) is None


@pytest.mark.parametrize("text", ["null", "[]", "{}", '"x"', "[" * 100_000, "{\"inputs\": 1}",
                                  "\udcff not json"])
def test_an_entry_that_is_not_an_entry_is_a_miss(tmp_path, text):
    cache = TraceCache(tmp_path)
    cache.directory.mkdir(parents=True, exist_ok=True)
    path = cache.directory / f"{key_of(key_inputs(JOB))}.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert cache.get(JOB) is None
    cache.put(JOB, TRACE)  # and the next trace writes over it
    assert cache.get(JOB) == TRACE


@pytest.mark.trace
def test_from_trace_after_every_entry_was_spoiled(tmp_path):
    """A real trace, then every cache entry replaced by null, by [], or its result by
    {"ok": true}: the plan traces again and answers what it answered (it crashed with exit 1
    on null). One checkpointing mode: each entry is read and written the same way whatever
    the mode, and four plans of all three took the longest test of the suite."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from probes.hf_matrix import load, shrink

    cfg = shrink(load("llama"), layers=6, hidden=128, heads=4, kv_heads=2, ffn=256, vocab=1024)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    env = dict(os.environ, FITCHECK_TRACE_CACHE=str(tmp_path / "cache"))

    def plan() -> list[int]:
        r = subprocess.run([sys.executable, "-m", "planner", "--config", str(tmp_path / "hf"),
                            "--gpu", "h100-80", "--n", "8", "--seq", "256", "--strategy",
                            "full_shard", "--checkpointing", "none", "--from-trace",
                            "--json"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return [c["peak_allocated_bytes"] for c in json.loads(r.stdout)["candidates"]]

    first = plan()
    entries = sorted((tmp_path / "cache").glob("*.json"))
    assert entries
    for bad in ("null", "[]", "a result without its keys"):
        for path in entries:
            text = bad
            if bad.startswith("a result"):  # its own inputs: only the result is wrong
                text = json.dumps({**json.loads(path.read_text()), "result": {"ok": True}})
            path.write_text(text)
        assert plan() == first, bad
