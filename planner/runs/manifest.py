"""A list of runs of different jobs, for ``fitcheck calibrate --runs`` (and the public runs of
tests/data/runs/): ``{"runs": [{"id": str, "files": [path, ...], "job": {spec path: value},
"source": url, ...}]}``. Each job is read by the one request builder (planner/request.py)
with the gate's field names (``training.seq``), file paths relative to the manifest."""

from __future__ import annotations

import json
import os
from typing import Any

from planner.errors import FitcheckError, InputDataError
from planner.fields import SPEC
from planner.request import build_request
from planner.runs.fit import Case, case_from_request
from planner.runs.read import read_run

__all__ = ["read_manifest"]


def read_manifest(path: str) -> tuple[list[Case], dict[str, str | None]]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise InputDataError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise InputDataError(f"{path}: not a JSON runs file ({exc})") from None
    runs = doc.get("runs") if isinstance(doc, dict) else None
    if not isinstance(runs, list) or not runs:
        raise InputDataError(f"{path}: runs = {type(runs).__name__}: must be a non-empty list")
    base = os.path.dirname(os.path.abspath(path))
    cases: list[Case] = []
    versions: dict[str, str | None] = {}
    seen = set()
    for i, r in enumerate(runs):
        if not isinstance(r, dict):
            raise InputDataError(f"{path}: runs[{i}] must be an object")
        rid = r.get("id")
        if not isinstance(rid, str) or not rid or rid in seen:
            raise InputDataError(f"{path}: runs[{i}].id = {rid!r}: must be a unique string")
        seen.add(rid)
        files = r.get("files")
        if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
            raise InputDataError(f"{path}: {rid}.files must be a list of paths")
        job = r.get("job")
        if not isinstance(job, dict):
            raise InputDataError(f"{path}: {rid}.job must be an object of spec fields")
        try:
            request = build_request({"calibration": "none", **job}, SPEC, allow_files=True,
                                    base_dir=base)
        except FitcheckError as exc:
            raise InputDataError(f"{path}: {rid}.job: {exc}") from None
        run, _recs = read_run([os.path.join(base, f) for f in files])
        versions.update({k: v for k, v in run.versions.items() if v})
        cases.append(case_from_request(request, run, id=rid, source=str(r.get("source", ""))))
    return cases, versions


def manifest_entries(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)["runs"]
