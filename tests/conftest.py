"""Shared test helpers: GPU profiles and clusters, the CLI runner, one-line error checks.

Markers (pyproject.toml): ``trace`` runs fake-tensor probes in subprocesses (torch, seconds
each); ``integration`` starts processes or servers; ``slow`` is real-size traces (not in CI).
The fast planner suite alone: ``python -m pytest -m "not trace and not integration"``.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.hardware import load_gpu
from planner.spec import Cluster, GpuProfile


def gpu(profile_id: str = "h100-80") -> GpuProfile:
    return load_gpu(profile_id)


def cluster(n: int, profile: str | GpuProfile = "h100-80",
            gpus_per_node: int | None = None) -> Cluster:
    g = load_gpu(profile) if isinstance(profile, str) else profile
    return Cluster(gpu=g, n_gpus=n, gpus_per_node=gpus_per_node or g.gpus_per_node,
                   host_ram_bytes_per_node=g.host_ram_bytes_per_node)


def run(*args: str, input: str | None = None):
    """`fitcheck ARGS` in-process (click's runner; stdout and stderr kept apart)."""
    return CliRunner().invoke(cli, list(args), input=input)


def one_line_error(result, exit_code: int, *needles: str) -> str:
    """The command failed with exit_code and one line on stderr containing every needle."""
    assert result.exit_code == exit_code, (result.exit_code, result.output, result.stderr)
    err = result.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture(scope="session")
def h100() -> GpuProfile:
    return load_gpu("h100-80")
