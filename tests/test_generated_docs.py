"""The generated docs are what their generators print today: each generator is rerun into a
temporary file and compared with the committed doc (rerun it and commit when this fails)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
GENERATED = [
    # (doc, command writing it to OUT)
    # --bands '': planner/data/error_bands.json has its own check (tests/test_error_bands.py)
    ("docs/memory_accuracy.md", ["benchmarks/memory_accuracy.py", "--md", "OUT", "--bands", "",
                                 "--accuracy-md", ""]),
    # the risk's acceptance on the held-out half (issue 24): its section of accuracy.md
    ("docs/accuracy.md", ["benchmarks/memory_accuracy.py", "--md", "", "--bands", "",
                          "--accuracy-md", "OUT"]),
    ("docs/throughput_accuracy.md", ["benchmarks/throughput_accuracy.py", "--md", "OUT",
                                     "--bands", ""]),
    ("docs/seed-claims.md", ["benchmarks/seed_claims.py", "--out", "OUT"]),
    ("docs/calibration.md", ["benchmarks/public_memory_calibration.py", "--md", "OUT",
                             "--write-calibrations", ""]),
    # the GPU calibrations (issue 28; H200 and H100): their sections of calibration.md and
    # accuracy.md
    ("docs/calibration.md", ["benchmarks/gpu_calibration.py", "--write", "--calibration-md",
                             "OUT", "--accuracy-md", "", "--cal-dir", "", "--log-out", ""]),
    ("docs/accuracy.md", ["benchmarks/gpu_calibration.py", "--write", "--accuracy-md", "OUT",
                          "--calibration-md", "", "--cal-dir", "", "--log-out", ""]),
    # the second H100 lease (float8, offloading, compile): its section of accuracy.md
    ("docs/accuracy.md", ["benchmarks/gpu_frontier.py", "--write", "--accuracy-md", "OUT"]),
    # every framework's key table (issue 21): the section of jobs.md after its own prose
    ("docs/jobs.md", ["-m", "planner.jobs.keydoc", "--md", "OUT"]),
]


@pytest.mark.parametrize("doc, command", GENERATED,
                         ids=[f"{d}:{Path(c[0]).stem}" for d, c in GENERATED])
def test_generated_doc_is_current(tmp_path, doc, command):
    out = tmp_path / Path(doc).name
    shutil.copy(ROOT / doc, out)  # section writers replace their part of the file in place
    args = [str(out) if a == "OUT" else a for a in command]
    p = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert out.read_text() == (ROOT / doc).read_text(), (
        f"{doc} is stale: run `python {' '.join(a for a in command if a != 'OUT')}` and commit")
