"""Where calibration files live (kept apart so `--calibration auto` costs one listdir when
there are none, instead of importing planner.calibration)."""

from __future__ import annotations

import os

from hardware_profiles import CALIBRATION_DIR

CALIBRATION_DIRS: tuple[str, ...] = (CALIBRATION_DIR,)
"""Searched after ``$FITCHECK_CALIBRATION_PATH`` (``os.pathsep``-separated)."""


def calibration_dirs() -> list[str]:
    env = os.environ.get("FITCHECK_CALIBRATION_PATH", "")
    return [d for d in env.split(os.pathsep) if d] + list(CALIBRATION_DIRS)


def any_calibration_files() -> bool:
    for d in calibration_dirs():
        try:
            if any(name.endswith(".json") for name in os.listdir(d)):
                return True
        except OSError:
            continue
    return False
