"""Read the files a user's run left behind: tell each one's kind by its content and return
the evidence (planner/runs/evidence.py ``Run``), or one error naming the file and what was
looked for (exit 4)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from planner.errors import InputDataError
from planner.runs.evidence import Run
from planner.runs.logs import FORMATS, parse_logs
from planner.runs.oom import OOM_MARKER, find_ooms
from planner.runs.records import Recorded, looks_like_records, read_records
from planner.runs.snapshot import load_snapshot, looks_like_pickle, summarize

__all__ = ["LOOKED_FOR", "RunFileError", "read_file", "read_run"]

MAX_BYTES = 4 * 2**30
LOOKED_FOR = ("a CUDA/HIP out-of-memory message ('CUDA out of memory. Tried to allocate ...')",
              *(f.looks_for for f in FORMATS),
              "a torch.cuda.memory._dump_snapshot pickle",
              "fitcheck probe / benchmarks/gpu_run.py records (JSONL)")


class RunFileError(InputDataError):
    """A run file that cannot be read, or that holds no memory figure (exit 4)."""


def _read_bytes(path: str) -> bytes:
    try:
        size = os.path.getsize(path)
        if size > MAX_BYTES:
            raise RunFileError(f"{path}: {size:,} bytes is larger than the {MAX_BYTES:,} a run "
                               "file may have")
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise RunFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise RunFileError(f"{path}: is a directory") from None
    except OSError as exc:
        raise RunFileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def read_file(path: str, data: bytes | None = None) -> tuple[Run, list[Recorded]]:
    """One file -> (its evidence, the measured cases it carries with their own jobs)."""
    data = _read_bytes(path) if data is None else data
    if looks_like_pickle(data):
        snap = summarize(load_snapshot(data, path), path)
        return Run(files=(path,), snapshots=(snap,)), []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    if "\x00" in text[:4096]:
        raise RunFileError(f"{path}: a binary file that is not a pickle; looked for "
                           + "; ".join(LOOKED_FOR))
    if looks_like_records(text):
        cases, facts = read_records(text, path)
        if not cases:
            raise RunFileError(f"{path}: JSONL records without a measured case ('case', "
                               "'step' or 'least_memory' record with its model)")
        versions = {k: facts.get(k) for k in ("torch", "cuda", "driver", "nccl") if facts.get(k)}
        merged = Run(files=(path,), versions=versions, gpu_name=facts.get("gpu_name"))
        return merged, [c for c in cases]
    lines = text.splitlines()
    ooms = tuple(find_ooms(lines, path))
    samples, facts = parse_logs(lines, path)
    notes = tuple(n for n in facts.get("notes", "").split("\n") if n)
    versions = {k: facts[k] for k in ("driver",) if facts.get(k)}
    if not ooms and not samples:
        if any(OOM_MARKER.search(line) for line in lines):
            raise RunFileError(f"{path}: an out-of-memory message in a wording this fitcheck "
                               "does not read (docs/explain.md lists the ones it does)")
        raise RunFileError(f"{path}: no memory figure found; looked for "
                           + "; ".join(LOOKED_FOR))
    return Run(files=(path,), ooms=ooms, samples=tuple(samples), versions=versions,
               gpu_name=facts.get("gpu_name"), notes=notes), []


def read_run(paths: Sequence[str]) -> tuple[Run, list[Recorded]]:
    """The evidence of several files of one run (a log, its OOM, a snapshot) together."""
    run = Run()
    cases: list[Recorded] = []
    for p in paths:
        r, c = read_file(p)
        run = run.merged(r)
        cases += c
    return run, cases
