"""Probe records: one JSON object per line (docs/calibration.md), read by the probe command
and the calibration fit."""

from __future__ import annotations

import json
import os
from typing import Any

from planner.errors import InputDataError


def read_records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise InputDataError(f"{path}: line {n}: not JSON ({exc.msg})") from None
                if not isinstance(rec, dict):
                    raise InputDataError(f"{path}: line {n}: not a JSON object")
                out.append(rec)
    except FileNotFoundError:
        return []
    return out
