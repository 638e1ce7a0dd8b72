"""Run one trace configuration in its own subprocess, safely.

``run_job(job, timeout_s=...)`` starts ``python -m probes.trace`` in a new process group
(session), sends the job (probes/trace.py: a reference-model trace, a Hugging Face trace or
inspection, or a batch of those) as one JSON object on stdin and reads the child's single
JSON result line from stdout. Whatever happens in the child (a Python exception, a C++
abort/SIGABRT or segfault, running past the timeout, garbage on stdout) comes back as a
``TraceResult`` with ``ok=False`` and a ``reason``; it never raises for a failed probe and
never hangs (on timeout the whole process group is killed with SIGKILL).
``run_trace(model, training, candidate, ...)`` is the reference-model job;
``run_batch(jobs)`` runs several jobs in one child (one torch import) and, if that child
dies, each job again in its own child, so one crash is charged to the job that caused it.

The child's wall time and peak resident set size (``wait4``'s rusage ``ru_maxrss``, KiB on
Linux) are measured by the parent and reported as ``wall_s`` and ``max_rss_bytes``.

Also here (no torch import): JSON (de)serialisation of ``ModelSpec`` / ``TrainingSpec`` /
``Candidate`` (``dataclasses.asdict`` with enum values as their strings).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.spec import Candidate, ModelSpec, TrainingSpec

__all__ = [
    "TraceResult",
    "job_specs",
    "job_to_dict",
    "run_batch",
    "run_job",
    "run_trace",
    "spec_to_dict",
    "spec_from_dict",
    "config_to_json",
    "config_from_json",
]

_REPO_ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- serialisation


def spec_to_dict(obj: Any) -> dict[str, Any]:
    """A frozen spec dataclass as a JSON-ready dict (enums as their values)."""

    def conv(v: Any) -> Any:
        if isinstance(v, enum.Enum):
            return v.value
        if dataclasses.is_dataclass(v):
            return spec_to_dict(v)
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [conv(x) for x in v]
        return v

    return {f.name: conv(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


def spec_from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Inverse of ``spec_to_dict``: enum-typed fields are rebuilt from their values; unknown
    keys are rejected (they would silently change the meaning of a spec)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    # Field annotations are strings (``from __future__ import annotations``): resolve the
    # enum types by name in planner.spec.
    import planner.spec as spec_mod

    for name, value in data.items():
        ann = fields[name].type
        ann_name = ann if isinstance(ann, str) else getattr(ann, "__name__", "")
        ann_name = ann_name.removesuffix(" | None")  # an optional enum or dataclass
        typ = getattr(spec_mod, ann_name, None)
        if isinstance(typ, type) and issubclass(typ, enum.Enum) and value is not None:
            value = typ(value)
        elif isinstance(typ, type) and dataclasses.is_dataclass(typ) and isinstance(value, dict):
            value = spec_from_dict(typ, value)
        elif ann_name.startswith("tuple") and isinstance(value, list):
            value = tuple(value)
        kwargs[name] = value
    return cls(**kwargs)


def config_to_json(
    model: ModelSpec,
    training: TrainingSpec,
    candidate: Candidate,
    world_size: int,
    gpus_per_node: int,
    options: dict[str, Any] | None = None,
) -> str:
    """``options``: keyword arguments for ``probes.trace.trace_step`` (e.g.
    ``{"selective_policy": "op"}``)."""
    d: dict[str, Any] = {
        "model": spec_to_dict(model),
        "training": spec_to_dict(training),
        "candidate": spec_to_dict(candidate),
        "world_size": int(world_size),
        "gpus_per_node": int(gpus_per_node),
    }
    if options:
        d["options"] = dict(options)
    return json.dumps(d)


def config_from_json(text: str) -> tuple[ModelSpec, TrainingSpec, Candidate, int, int]:
    d = json.loads(text)
    return (spec_from_dict(ModelSpec, d["model"]), *job_specs(d))


def job_specs(d: dict[str, Any]) -> tuple[TrainingSpec, Candidate, int, int]:
    """A job's training run, candidate, world size and GPUs per node."""
    return (
        spec_from_dict(TrainingSpec, d.get("training", {})),
        spec_from_dict(Candidate, d["candidate"]),
        int(d.get("world_size", 1)),
        int(d.get("gpus_per_node", 8)),
    )


def job_to_dict(source: dict[str, Any], training: TrainingSpec, candidate: Candidate,
                world_size: int, gpus_per_node: int,
                options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A trace job of a model given by ``source`` (probes/trace.py: ``{"kind": "hf",
    "config": {...}, "layers": N}``)."""
    d: dict[str, Any] = {
        "source": source,
        "training": spec_to_dict(training),
        "candidate": spec_to_dict(candidate),
        "world_size": int(world_size),
        "gpus_per_node": int(gpus_per_node),
    }
    if options:
        d["options"] = dict(options)
    return d


# --------------------------------------------------------------------------- results


@dataclass
class TraceResult:
    ok: bool
    reason: str = ""
    """Why the probe failed ("" when ok)."""
    unsupported: bool = False
    """The configuration is outside what the probe can trace (not a crash)."""
    data: dict[str, Any] = field(default_factory=dict)
    """The child's result (``probes.trace.trace_step``'s dict) when ok."""
    wall_s: float = 0.0
    """Wall time of the child process, measured by the parent."""
    max_rss_bytes: int = 0
    """Peak resident set size of the child process."""
    returncode: int | None = None
    stderr_tail: str = ""

    @property
    def peak_bytes(self) -> int | None:
        return self.data.get("peak_bytes") if self.ok else None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def run_trace(
    model: ModelSpec,
    training: TrainingSpec,
    candidate: Candidate,
    world_size: int = 1,
    gpus_per_node: int = 8,
    *,
    timeout_s: float = 600.0,
    python: str | None = None,
    env: dict[str, str] | None = None,
    options: dict[str, Any] | None = None,
) -> TraceResult:
    """Trace one configuration of the reference model in a fresh subprocess; never raises
    for a failed probe. ``options`` are passed to ``trace_step`` as keyword arguments."""
    job = json.loads(config_to_json(model, training, candidate, world_size, gpus_per_node,
                                    options))
    return run_job(job, timeout_s=timeout_s, python=python, env=env)


def run_batch(jobs: list[dict[str, Any]], *, timeout_s: float = 600.0,
              python: str | None = None, env: dict[str, str] | None = None,
              isolate_on_crash: bool = True) -> list[TraceResult]:
    """Run ``jobs`` in one child (``timeout_s`` for all of them); one TraceResult each, in
    order. The child's wall time and peak RSS are those of the whole batch. If the child
    itself fails (crash, timeout), each job is run again in its own child
    (``isolate_on_crash``) so that the failure is charged to the job that caused it."""
    if not jobs:
        return []
    if len(jobs) == 1:
        return [run_job(jobs[0], timeout_s=timeout_s, python=python, env=env)]
    whole = run_job({"batch": jobs}, timeout_s=timeout_s, python=python, env=env)
    items = whole.data.get("results") if whole.ok else None
    if items is None or len(items) != len(jobs):
        if not isolate_on_crash:
            return [dataclasses.replace(whole, ok=False, data={}) for _ in jobs]
        return [run_job(j, timeout_s=timeout_s, python=python, env=env) for j in jobs]
    common = dict(wall_s=whole.wall_s, max_rss_bytes=whole.max_rss_bytes,
                  returncode=whole.returncode, stderr_tail=whole.stderr_tail)
    out = []
    for item in items:
        if item.get("ok"):
            out.append(TraceResult(ok=True, data=item, **common))
        else:
            out.append(TraceResult(ok=False, reason=str(item.get("reason", "probe failed")),
                                   unsupported=bool(item.get("unsupported")), data=item,
                                   **common))
    return out


def run_job(
    job: dict[str, Any],
    *,
    timeout_s: float = 600.0,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> TraceResult:
    """Run one job (or ``{"batch": [...]}``) of ``python -m probes.trace`` in a fresh
    subprocess; never raises for a failed probe."""
    payload = json.dumps(job).encode()
    child_env = dict(os.environ)
    # One CPU thread per probe: the work is bookkeeping, not math, and this keeps
    # several probes from fighting over the cores.
    child_env.setdefault("OMP_NUM_THREADS", "1")
    pp = child_env.get("PYTHONPATH", "")
    child_env["PYTHONPATH"] = str(_REPO_ROOT) + (os.pathsep + pp if pp else "")
    if env:
        child_env.update(env)
    cmd = [python or sys.executable, "-m", "probes.trace"]
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env,
            cwd=str(_REPO_ROOT),
            start_new_session=True,  # own process group: a timeout kills all of it
        )
    except OSError as exc:
        return TraceResult(ok=False, reason=f"could not start probe: {exc}")

    out = bytearray()
    err = bytearray()
    timed_out = False
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    deadline = t0 + timeout_s
    open_streams = 2
    while open_streams:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(remaining, 1.0)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                open_streams -= 1
            else:
                buf = key.data
                buf += chunk
                if len(buf) > 8 << 20:  # keep the last 8 MiB at most
                    del buf[: len(buf) - (8 << 20)]
    sel.close()
    if timed_out:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # Reap the child (and get its rusage). After EOF on both pipes the child has exited or
    # is about to; after a kill it dies promptly. Bound the wait anyway.
    status = None
    ru = None
    wait_deadline = time.monotonic() + (5.0 if not timed_out else 10.0)
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            break
        if time.monotonic() > wait_deadline:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.02)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for stream in (proc.stdout, proc.stderr):
        try:
            stream.close()
        except OSError:
            pass
    wall = time.monotonic() - t0
    rss = int(ru.ru_maxrss) * 1024 if ru is not None else 0
    rc = proc.returncode
    stderr_tail = err[-4000:].decode(errors="replace")
    common = dict(wall_s=round(wall, 3), max_rss_bytes=rss, returncode=rc, stderr_tail=stderr_tail)

    if timed_out:
        return TraceResult(ok=False, reason=f"timeout after {timeout_s:g} s (killed)", **common)
    # The result is the last line of stdout that parses as a JSON object.
    result: dict[str, Any] | None = None
    for line in reversed(out.decode(errors="replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                result = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
    if rc != 0:
        if rc < 0:
            reason = f"probe killed by {_signal_name(-rc)}"
        else:
            reason = f"probe exited with status {rc}"
        if result is not None and result.get("reason"):
            reason += f": {result['reason']}"
        else:
            last = stderr_tail.strip().splitlines()[-1:] or [""]
            if last[0]:
                reason += f": {last[0][:500]}"
        unsupported = bool(result and result.get("unsupported"))
        return TraceResult(ok=False, reason=reason, unsupported=unsupported, **common)
    if result is None:
        return TraceResult(ok=False, reason="probe printed no JSON result", **common)
    if not result.get("ok", False):
        return TraceResult(
            ok=False,
            reason=str(result.get("reason", "probe reported failure")),
            unsupported=bool(result.get("unsupported")),
            data=result,
            **common,
        )
    return TraceResult(ok=True, data=result, **common)
