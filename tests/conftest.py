"""Shared test helpers: GPU profiles and clusters, the CLI runner, one-line error checks, and
the session's trace cache.

Tiers (markers declared in pyproject.toml). A test that traces, starts a process or a server,
or reruns a generator is marked, and so is one that takes seconds in this process (``slow``);
what is left is the planner in this process, the fast unit tier (<= 30 s with ``-n auto`` on
two cores; a test over about a second there is the first to import torch for probes.models'
reference specs, or a property's few examples).

- unit (no marker): the planner in this process; a fresh interpreter only to check what an
  import pulls in (a fraction of a second). The quickest tier:
  ``python -m pytest -q -m "not trace and not integration and not slow"``.
- ``trace``: fake-tensor traces (needs torch), in this process or in subprocesses
  (probes/runner.py). ``python -m pytest -q -n auto -m trace``.
- ``integration``: starts processes or servers, reruns the doc generators, drives the scripts
  under benchmarks/. ``python -m pytest -q -n auto -m integration``.
- ``slurm`` (with ``integration``): a real Slurm on localhost (munged, slurmctld, slurmd:
  Debian's packages, root); skipped with the reason where they are missing, required where
  .ci/run installed them (``FITCHECK_REQUIRE_SLURM=1``). ``python -m pytest -q -m slurm``.
- ``slow``: seconds each in this process: a generated-input property's many examples (its
  few run in the unit tier: fuzz_cases.EXAMPLES), report sweeps and plots, timing ratios.
  CI runs them; ``python -m pytest -q -n auto -m slow`` alone. (Traces of real-size models
  are benchmarks, not tests.)

Everything, in parallel (README's test command, what CI runs): ``python -m pytest -q -n
auto``. Tests are xdist-safe: each writes under its own ``tmp_path``,
servers bind port 0, and no test depends on another having run.

Trace cache: every test in the session (all xdist workers) shares one on-disk trace cache
(probes/trace_cache.py, keyed by every input of a trace), empty when the session starts;
``FITCHECK_TRACE_CACHE`` points at it, so no test reads or writes ``~/.cache``. A test that
checks cold-cache behaviour passes its own empty directory instead.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from planner.cli import cli
from planner.hardware import load_gpu
from planner.spec import Cluster, GpuProfile


TEST_H100 = GpuProfile(
    id="test-80", name="test GPU", vendor="nvidia", memory_bytes=80 * 10**9,
    bf16_tflops=989.0, fp16_tflops=989.0, tf32_tflops=494.0, fp32_tflops=67.0,
    hbm_bandwidth_bytes_per_s=3.35e12, intra_node_link="nvlink4",
    intra_node_bandwidth_bytes_per_s=450e9, inter_node_bandwidth_bytes_per_s=50e9,
    gpus_per_node=8, host_ram_bytes_per_node=2 * 2**40, pcie_bandwidth_bytes_per_s=64e9,
    cuda_context_bytes=500 * 2**20)
"""An H100-like profile written out by hand (not read from hardware_profiles/), so the tests'
hand-derived bytes do not move when a shipped profile is re-measured."""


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


TRACE_MODULE = re.compile(r"^pytestmark = .*\bpytest\.mark\.trace\b", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """A module marked ``trace`` as a whole is not even imported when ``not trace`` is one of
    the ``-m`` expression's and-ed terms: the unit tier skips rewriting and importing them
    (about 2 s on 2 cores). Any other expression collects them."""
    expr = config.getoption("markexpr")
    terms = [t.strip() for t in expr.split(" and ")]
    if collection_path.suffix != ".py" or " or " in expr or "(" in expr \
            or "not trace" not in terms:
        return None
    try:
        text = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    return True if TRACE_MODULE.search(text) else None


@pytest.fixture(scope="session", autouse=True)
def trace_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's trace cache directory, shared by the xdist workers (their base temp
    directories are ``popen-gwN`` under the session's). Concurrent writers are safe: an entry
    is written to a temporary file and renamed into place (probes/trace_cache.py)."""
    from probes.trace_cache import ENV

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / "trace-cache"
    before = os.environ.get(ENV)
    os.environ[ENV] = str(path)
    yield path
    if before is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = before
