"""Launching a probe run: real training steps under torchrun, measured per rank.

``fitcheck probe`` (planner/probe_cli.py) writes the worker's configuration and calls
``launch``, which runs::

    python -m torch.distributed.run --standalone --nproc-per-node N \
        -m probes.cuda_probe --config OUT.config.json --out OUT

in its own process session with a timeout. On a timeout or a crash every process of the run
(torchrun and its workers, which torchrun starts in sessions of their own) is killed; they are
found by a marker in their environment (``FITCHECK_PROBE_RUN_ID``), so none is left behind
even after torchrun itself is gone. The records measured until then stay in OUT, followed by a
``failure`` record with the reason. ``torchrun_args`` replace ``--standalone`` (multi-node
rendezvous); ``srun_command`` is the Slurm line that runs the same worker on every node.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from planner.errors import EXIT_CRASH, FitcheckError, UsageError
from planner.spec import Candidate, Checkpointing, Offload, Strategy
from probes.records import read_records

__all__ = ["ProbeFailed", "ProbeRun", "expand_candidates", "launch", "run_processes",
           "srun_command"]

_REPO_ROOT = Path(__file__).resolve().parent.parent
MARKER = "FITCHECK_PROBE_RUN_ID"
PROBED = (Strategy.DDP, Strategy.NO_SHARD, Strategy.SHARD_GRAD_OP, Strategy.FULL_SHARD,
          Strategy.HYBRID_SHARD)


class ProbeFailed(FitcheckError):
    """The probe run crashed or timed out (exit code 1)."""

    exit_code = EXIT_CRASH


# --------------------------------------------------------------------------- processes


def run_processes(marker: str) -> list[int]:
    """PIDs of live processes whose environment carries ``FITCHECK_PROBE_RUN_ID=marker``."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and needle in env.split(b"\0"):
            found.append(pid)
    return found


def _kill_run(proc: subprocess.Popen, marker: str, grace_s: float = 3.0) -> None:
    """SIGTERM the launcher's group and every marked process, then SIGKILL what is left."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        pids = set(run_processes(marker))
        if proc.poll() is None:
            pids.add(proc.pid)
        if not pids:
            return
        for pid in pids:
            for kill in (lambda p: os.killpg(os.getpgid(p), sig), lambda p: os.kill(p, sig)):
                try:
                    kill(pid)
                except (ProcessLookupError, PermissionError, OSError):
                    pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not run_processes(marker) and proc.poll() is not None:
                return
            time.sleep(0.05)


@dataclasses.dataclass
class ProbeRun:
    ok: bool
    reason: str = ""
    returncode: int | None = None
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    stderr_tail: str = ""
    run_id: str = ""
    command: list[str] = dataclasses.field(default_factory=list)


def _append_failure(out: str, record: dict[str, Any]) -> None:
    records = [r for r in read_records(out) if r.get("record") != "failure"]
    records.append(record)
    tmp = f"{out}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, out)


def worker_command(config_path: str, out: str, nproc: int, torchrun_args: list[str] | None,
                   python: str | None = None) -> list[str]:
    rdzv = torchrun_args if torchrun_args else ["--standalone"]
    return [python or sys.executable, "-m", "torch.distributed.run", *rdzv,
            "--nproc-per-node", str(nproc), "-m", "probes.cuda_probe",
            "--config", config_path, "--out", out]


def launch(config: dict[str, Any], *, nproc: int, out: str, timeout_s: float = 900.0,
           torchrun_args: list[str] | None = None, env: dict[str, str] | None = None,
           echo: bool = True) -> ProbeRun:
    """Run the worker under torchrun; never raises for a failed probe, never leaves a
    process behind. The records (also on failure: those measured before it) are read back
    from ``out``."""
    out = os.path.abspath(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    run_id = config.get("run_id") or uuid.uuid4().hex
    config = {**config, "run_id": run_id}
    config_path = out + ".config.json"
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    if os.path.exists(out):
        os.remove(out)
    cmd = worker_command(config_path, out, nproc, torchrun_args)
    child_env = dict(os.environ)
    pp = child_env.get("PYTHONPATH", "")
    child_env["PYTHONPATH"] = str(_REPO_ROOT) + (os.pathsep + pp if pp else "")
    child_env.setdefault("OMP_NUM_THREADS", "1")
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if env:
        child_env.update(env)
    child_env[MARKER] = run_id
    tail = bytearray()

    def pump(stream: Any) -> None:
        for line in iter(stream.readline, b""):
            tail.extend(line)
            if len(tail) > 16384:
                del tail[:-16384]
            if echo:
                sys.stderr.write(line.decode(errors="replace"))
                sys.stderr.flush()
        stream.close()

    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=child_env, cwd=str(_REPO_ROOT),
                                start_new_session=True)
    except OSError as exc:
        return ProbeRun(ok=False, reason=f"could not start torchrun: {exc}", run_id=run_id,
                        command=cmd)
    reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    except KeyboardInterrupt:
        _kill_run(proc, run_id)
        raise
    finally:
        if timed_out or proc.poll() is None:
            _kill_run(proc, run_id)
        # torchrun stops its workers when it exits; make sure, whatever happened.
        if run_processes(run_id):
            _kill_run(proc, run_id, grace_s=1.0)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    reader.join(timeout=5)
    wall = time.monotonic() - t0
    rc = proc.returncode
    text = tail.decode(errors="replace")
    records = read_records(out)
    run = ProbeRun(ok=False, returncode=rc, records=records, wall_s=round(wall, 3),
                   stderr_tail=text[-4000:], run_id=run_id, command=cmd)
    if timed_out:
        run.reason = f"timeout after {timeout_s:g} s (every process of the run killed)"
    elif rc != 0:
        lines = [ln for ln in text.splitlines() if ln.strip() and "Traceback" not in ln]
        fatal = [ln.split("FATAL ", 1)[1] for ln in lines if "[probe] FATAL " in ln]
        errors = [ln for ln in lines if "Error" in ln and "elastic/errors.html" not in ln]
        last = (fatal[:1] or errors[-1:] or lines[-1:] or [""])[0].strip()
        run.reason = f"torchrun exited with status {rc}" + (f": {last[:300]}" if last else "")
    else:
        run.ok = True
    if not run.ok:
        _append_failure(out, {"schema": "fitcheck-probe/1", "record": "failure",
                              "run_id": run_id, "reason": run.reason, "returncode": rc,
                              "wall_s": run.wall_s,
                              "date": _dt.datetime.now(_dt.timezone.utc).isoformat(
                                  timespec="seconds")})
        run.records = read_records(out)
    return run


# --------------------------------------------------------------------------- candidates


def expand_candidates(strategies: tuple[str, ...], offload: str, checkpointing: str,
                      n_gpus: int) -> tuple[list[Candidate], list[str]]:
    """The probe's candidate list and what was skipped. Defaults differ from ``plan``:
    no strategy given = the five probed (no ZeRO: DeepSpeed is not run); checkpointing auto =
    none and full; offload auto = none."""
    from planner.candidates import expand
    from planner.fields import parse_strategies

    try:
        asked = parse_strategies(strategies) if strategies else PROBED
    except ValueError as exc:
        raise UsageError(f"--strategy: {exc}") from None
    not_probed = [s for s in asked if s not in PROBED]
    if strategies and not_probed:
        raise UsageError(f"--strategy: {', '.join(str(s) for s in not_probed)} not probed "
                         f"(choose from {', '.join(str(s) for s in PROBED)})")
    offloads = (Offload.NONE,) if offload == "auto" else (Offload(offload),)
    skipped: list[str] = []
    out: list[Candidate] = []
    for ck in ((Checkpointing.NONE, Checkpointing.FULL) if checkpointing == "auto"
               else (Checkpointing(checkpointing),)):
        for tries in expand(asked, offloads, ck, max(n_gpus, 2), skipped):
            out += tries
    out.sort(key=lambda c: (asked.index(c.strategy), c.checkpointing != Checkpointing.NONE))
    if not out:
        raise UsageError("no probe candidate left: " + "; ".join(dict.fromkeys(skipped)))
    return out, list(dict.fromkeys(skipped))


def srun_command(config_path: str, out: str, nproc: int) -> str:
    """A Slurm srun line that runs the worker of ``config_path`` on every node."""
    worker = ("python -m torch.distributed.run --nnodes \"$SLURM_NNODES\" "
              f"--nproc-per-node {nproc} --rdzv-backend c10d "
              "--rdzv-endpoint \"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)"
              ":29500\" --rdzv-id \"$SLURM_JOB_ID\" "
              f"-m probes.cuda_probe --config {shlex.quote(config_path)} --out "
              f"{shlex.quote(out)}")
    return (f"srun --ntasks-per-node=1 --gpus-per-node={nproc} "
            f"bash -c {shlex.quote(worker)}")
