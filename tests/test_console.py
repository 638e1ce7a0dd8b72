"""The console script's interpreter set-up (planner/console.py, issue 23 item 8): the cyclic
garbage collector off for a plan and frozen at exit, back on for the long commands, and the
answer the same as ``planner.cli``'s."""

from __future__ import annotations

import gc
import subprocess
import sys
import tomllib
from pathlib import Path

from click.testing import CliRunner

from planner.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = ["--params", "13e9", "--gpu", "h100-80", "--n", "8"]

# Run the console script's main in a fresh interpreter; an atexit handler (it runs after
# main's ``finally``) reports the collector's state as the process ends.
PROBE = ("import atexit, gc, sys\n"
         "atexit.register(lambda: print('GC', gc.isenabled(), gc.get_freeze_count() > 0, "
         "file=sys.stderr))\n"
         "sys.argv = ['fitcheck', *sys.argv[1:]]\n"
         "from planner.console import main\n"
         "main()")


def _console(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          cwd=ROOT, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})


def _cli(*args: str) -> subprocess.CompletedProcess:
    code = "import sys\nfrom planner.cli import main\nsys.argv = ['fitcheck', *sys.argv[1:]]\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          cwd=ROOT, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})


def test_the_console_script_is_planner_console_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["fitcheck"] == "planner.console:main"
    assert "planner.console import main" in (ROOT / "planner" / "__main__.py").read_text()


def test_a_plan_runs_without_the_collector_and_answers_as_planner_cli():
    fast, plain = _console(*README), _cli(*README)
    assert fast.returncode == plain.returncode == 0
    assert fast.stdout == plain.stdout and fast.stdout.startswith("model     assumed-13B")
    # off through the plan; what is alive at the end frozen (skipped by shutdown collections)
    assert "GC False True" in fast.stderr
    err_fast, err_plain = _console(*README, "--n", "0"), _cli(*README, "--n", "0")
    assert err_fast.returncode == err_plain.returncode == 2  # a usage error, unchanged
    assert err_fast.stderr.replace("GC False True\n", "") == err_plain.stderr
    assert "GC False True" in err_fast.stderr


def test_subcommands_turn_the_collector_back_on():
    spec = str(ROOT / "tests" / "data" / "gate" / "llama8b-8xh100.json")
    r = _console("gate", spec)
    assert r.returncode in (0, 3) and "GC True" in r.stderr, r.stderr


def test_from_trace_turns_the_collector_back_on():
    gc.disable()
    try:
        # refused before any trace (LoRA is not traced), after the collector is back on
        r = CliRunner().invoke(cli, [*README, "--from-trace", "--lora-rank", "8"])
        assert r.exit_code == 2 and "not traced yet" in r.output
        assert gc.isenabled()
    finally:
        gc.enable()
