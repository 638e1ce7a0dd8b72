"""GPU profiles as planner values: an embedded id, or a TOML file where files may be read.

A bare id is only ever looked up among the embedded profiles (``hardware_profiles/``); a file
is read only when the value is explicitly a path (``validate.looks_like_path``) and the caller
allows files (never the webhook).
"""

from __future__ import annotations

import os

from hardware_profiles import ProfileError, list_profiles, read_all, read_file, read_profile
from planner.spec import GpuProfile
from planner.validate import looks_like_path

__all__ = ["ProfileError", "all_gpus", "gpu_ids", "load_gpu"]


def load_gpu(value: str | os.PathLike[str], *, allow_files: bool = True, base_dir: str | None = None) -> GpuProfile:
    """A GpuProfile for a profile id, or for a TOML path when files may be read.

    ProfileError when the id is unknown, the file is bad, or a path is given where files may
    not be read.
    """
    value = os.fspath(value)
    if looks_like_path(value):
        if not allow_files:
            raise ProfileError("file paths are not accepted here; give a profile id (see "
                               "fitcheck --list-gpus)")
        path = os.path.expanduser(value)
        if base_dir is not None and not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        return GpuProfile(**read_file(path))
    return GpuProfile(**read_profile(value))


def all_gpus() -> dict[str, GpuProfile]:
    """Every embedded profile, by id."""
    return {k: GpuProfile(**v) for k, v in read_all().items()}


def gpu_ids() -> list[str]:
    return list_profiles()
