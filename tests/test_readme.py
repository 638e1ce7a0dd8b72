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
