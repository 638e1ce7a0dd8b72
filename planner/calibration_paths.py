"""Where calibration files live (kept apart so that `--calibration auto` costs a listdir and
a json read of each file when none is for the GPU, instead of importing planner.calibration)."""

from __future__ import annotations

import os

from hardware_profiles import CALIBRATION_DIR

CALIBRATION_DIRS: tuple[str, ...] = (CALIBRATION_DIR,)
"""Searched after ``$FITCHECK_CALIBRATION_PATH`` (``os.pathsep``-separated)."""


def calibration_dirs() -> list[str]:
    env = os.environ.get("FITCHECK_CALIBRATION_PATH", "")
    return [d for d in env.split(os.pathsep) if d] + list(CALIBRATION_DIRS)


def any_calibration_for(gpu_id: str) -> bool:
    """Whether a calibration file may be for ``gpu_id`` (its ``gpu.profile``), read with json
    alone; a file json cannot read, or without a ``gpu`` object, counts as a maybe, so that
    planner.calibration reports it (a broken file is never skipped silently)."""
    import json

    for d in calibration_dirs():
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(d, name), encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError, RecursionError):
                return True
            gpu = doc.get("gpu") if isinstance(doc, dict) else None
            if not isinstance(gpu, dict) or gpu.get("profile") in (gpu_id, None):
                return True
    return False
