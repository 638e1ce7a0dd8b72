"""Trace results cached on disk, keyed by everything that changes them.

A trace of a real model takes seconds; the same trace asked again (another --n with the same
shard group, the report, the gate, a rerun) is read back. The key is the sha256 of the
canonical JSON of:

- ``format``: this module's ``FORMAT`` (bumped when the result layout changes);
- ``code``: sha256 of the probe sources that produce the numbers (probes/trace.py, hf.py,
  models.py, autocast_emul.py, context_parallel.py, ep_trace.py): any edit to them
  invalidates every entry;
- ``torch``, ``transformers`` and ``torchao`` versions (the kernels and classes traced; torchao's
  Float8Linear under ``--float8``);
- the job: the model (the config.json's digest and the depth traced, or the reference spec),
  the training run (every TrainingSpec field), the candidate, world size, GPUs per node and
  the trace options.

An entry is one JSON file ``<key>.json`` holding the key's inputs and the result; it is read
back only if the stored inputs equal the asked ones and the result has the shape the readers
rely on (``valid_result``: a trace's byte counts, an inspection's structure, a failure's
reason); anything else (``null``, ``[]``, a result missing a key or with a wrong type) is a
miss, traced again and written over. Writes go to a temporary file renamed
into place (atomic on POSIX), so concurrent writers never leave a torn entry. A failure the
child reported (an exception: the same inputs repeat it) is kept; crashes and timeouts are not.

Location: ``$FITCHECK_TRACE_CACHE`` if set (``off`` disables the cache), else
``$XDG_CACHE_HOME/fitcheck/traces``, else ``~/.cache/fitcheck/traces``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

FORMAT = 1
ENV = "FITCHECK_TRACE_CACHE"
CODE_FILES = ("trace.py", "hf.py", "models.py", "autocast_emul.py", "context_parallel.py",
              "ep_trace.py")


def default_dir() -> Path | None:
    """Where the cache lives (None: disabled)."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in ("off", "0", "none", "") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fitcheck" / "traces"


@lru_cache(maxsize=1)
def code_digest() -> str:
    h = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for name in CODE_FILES:
        h.update(name.encode())
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


@lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """torch, transformers and torchao versions without importing them (importlib.metadata)."""
    from importlib import metadata

    out = {}
    for dist in ("torch", "transformers", "torchao"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def key_inputs(job: dict[str, Any]) -> dict[str, Any]:
    """What a job's cache key is made of (the module doc)."""
    job = dict(job)
    source = dict(job.get("source") or {})
    if "config" in source:  # the config's digest stands for its contents
        from probes.hf import config_digest

        source["config"] = config_digest(source["config"])
    job["source"] = source
    if "inspect" in job:
        insp = dict(job["inspect"])
        if "config" in insp:
            from probes.hf import config_digest

            insp["config"] = config_digest(insp["config"])
        job["inspect"] = insp
    return {"format": FORMAT, "code": code_digest(), **versions(), "job": job}


def key_of(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _counts(v: Any) -> bool:
    """{category: bytes}."""
    return isinstance(v, dict) and all(isinstance(k, str) and _count(x) for k, x in v.items())


def _moment(v: Any) -> bool:
    return isinstance(v, dict) and _count(v.get("peak_bytes")) and _counts(v.get("at_peak"))


def _moments(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(k, str) and _moment(m) for k, m in v.items())


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(_count(x) for x in v)


def _optional_count(v: Any) -> bool:
    return v is None or _count(v)


TRACE_KEYS: dict[str, Any] = {
    "peak_bytes": _count, "peak_phase": lambda v: isinstance(v, str), "at_peak": _counts,
    "max_by_category": _counts, "moments": _moments, "end_of_step": _counts,
    "sub_moments": lambda v: isinstance(v, dict) and all(
        isinstance(k, str) and _moments(m) for k, m in v.items()),
    "model": lambda v: isinstance(v, dict), "n_blocks": _count, "n_params": _count,
    "n_trainable_params": _count, "optimizer_scalar_bytes": _count,
    "optimizer_scalars_on_host": lambda v: isinstance(v, bool),
}
"""What a trace (probes/trace.py ``trace_step``'s dict) holds that its readers use, and its
type: probes/trace_plan.py reads the moments, their categories and the peak."""
INSPECT_KEYS: dict[str, Any] = {
    "class": lambda v: isinstance(v, str), "n_layers": lambda v: _count(v) and v > 0,
    "period": _optional_count, "params": _count, "active_params": _count,
    "per_block_params": _ints, "root_params": _count, "matmul_per_block": _ints,
    "matmul_head": _count, "q_dim": _count,
    **{k: _optional_count for k in ("hidden", "heads", "kv_heads", "ffn", "vocab", "experts",
                                     "top_k")},
}
"""An inspection (probes/hf.py ``inspect``) as planner.spec ``TracedModel.from_inspect``
reads it (the optional keys may be absent or null)."""
_OPTIONAL_INSPECT = {"hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k"}


def valid_result(job: dict[str, Any], result: Any) -> bool:
    """Whether ``result`` has the shape a result of ``job`` has: a failure the child
    reported (``ok`` false, a reason), an inspection (``inspect`` jobs) or a trace."""
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        return False
    if not result["ok"]:
        return (result.get("deterministic") is True and isinstance(result.get("reason"), str)
                and isinstance(result.get("unsupported", False), bool))
    if "inspect" in job:
        d = result.get("inspect")
        return isinstance(d, dict) and all(
            (k in _OPTIONAL_INSPECT and k not in d) or (k in d and check(d[k]))
            for k, check in INSPECT_KEYS.items())
    return all(k in result and check(result[k]) for k, check in TRACE_KEYS.items())


def _keep(result: dict[str, Any]) -> bool:
    """A result worth keeping: a trace, or a failure the child reported (an exception in
    Python: the same code and versions repeat it). Crashes and timeouts are not kept."""
    return bool(result.get("ok") or result.get("deterministic"))


@dataclass
class TraceCache:
    """Get and put trace results by job (``directory`` None: a cache that keeps nothing)."""

    directory: Path | None

    @classmethod
    def default(cls) -> TraceCache:
        return cls(default_dir())

    def get(self, job: dict[str, Any]) -> dict[str, Any] | None:
        if self.directory is None:
            return None
        inputs = key_inputs(job)
        path = self.directory / f"{key_of(inputs)}.json"
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
            return None
        if not isinstance(entry, dict) or entry.get("inputs") != json.loads(json.dumps(inputs)):
            return None
        result = entry.get("result")
        return result if valid_result(job, result) and _keep(result) else None

    def put(self, job: dict[str, Any], result: dict[str, Any], **meta: Any) -> None:
        if self.directory is None or not _keep(result):
            return
        inputs = key_inputs(job)
        entry = {"inputs": inputs, "result": result, "created": time.time(), **meta}
        from planner.tempfiles import sweep

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            sweep(str(self.directory), lambda n: n.endswith(".tmp"))  # a killed writer's
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(entry, fh)
                os.replace(tmp, self.directory / f"{key_of(inputs)}.json")
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        except OSError:
            pass  # a cache that cannot be written is a cache that misses
