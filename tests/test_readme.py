"""README's set-up commands and .ci/run must not drift apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [c.strip() for c in re.findall(r"```\n(python3 -m venv[^\n]*)\n```", text)]


def test_readme_has_the_two_setup_commands():
    cmds = _commands()
    assert len(cmds) == 2
    assert "fitcheck --params 13e9 --gpu h100-80 --n 8" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_installs_and_tests_exactly_as_readme_says():
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [s.strip() for s in _commands()[1].split("&&")][2:]  # after venv + activate
    for step in steps:
        assert step in ci, step


def test_the_readme_example_is_what_the_command_prints():
    """The example block after ``$ fitcheck --params 13e9 --gpu h100-80 --n 8`` is the
    command's output, byte for byte at the width README was written at (COLUMNS=100); where
    torch is installed, but for the calibration's STALE note and the wrapping it moves."""
    import os
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    start = text.index("$ fitcheck --params 13e9 --gpu h100-80 --n 8\n")
    block = text[text.index("\n", start) + 1:]
    block = block[:block.index("```")]
    env = dict(os.environ, COLUMNS="100")
    out = subprocess.run([sys.executable, "-m", "planner", "--params", "13e9", "--gpu",
                          "h100-80", "--n", "8"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    # README was printed where torch is not installed (`pip install .`): where it is, the
    # calibration line also says the calibration's torch is not the installed one
    printed = re.sub(r" \(STALE: torch [^)]*\) != [^)]*\)\)", "",
                     re.sub(r"\s+", " ", out.stdout))
    assert printed == re.sub(r"\s+", " ", block)
    if "STALE" not in out.stdout:  # then the wrapping is README's too
        assert out.stdout == block
