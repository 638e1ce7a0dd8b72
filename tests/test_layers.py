"""The house's layers point one way, and no module imports itself back (issue 23).

Every ``import`` statement of planner/, probes/ and hardware_profiles/ counts, the ones inside
functions too (an import deferred for speed is still a dependency). Layers, bottom up:

* ``hardware_profiles``: data and its validation; imports nothing of the project.
* the planner's core: specs, counts, the memory and step-time models, the request, the plan,
  the outputs (planner/render.py) — everything in planner/ that is not a front end. It
  imports no front end and nothing of probes/.
* probes/: the referees (traces, GPU runs). They import the core, never a front end.
* front ends (``FRONTENDS``): command lines, the gate, the webhook, Slurm, job files, the
  report. They may import anything below them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("planner", "probes", "hardware_profiles")
FRONTENDS = ("planner.__main__", "planner.console", "planner.cli", "planner.cli_options",
             "planner.trace_cli", "planner.probe_cli", "planner.gate", "planner.gate_cli",
             "planner.webhook", "planner.slurm", "planner.specfile", "planner.jobs", "planner.report",
             "planner.explain_cli", "planner.explain_plot")
"""Modules (and packages: every module under them) that are front ends."""


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an imported name lives in (the longest module prefix), or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in MODULES:
            return candidate
    return None


def imports_of(module: str) -> set[str]:
    """Project modules ``module`` imports anywhere in its file."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # a submodule (``from pkg import mod``) or a name the module ``stem`` defines
            names = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in MODULES else stem
                     for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                out.add(target)
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def is_frontend(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FRONTENDS)


def test_the_walk_sees_deferred_imports():
    # planner/cli.py imports planner.jobs only inside the plan command (a fast path)
    assert "planner.jobs" in GRAPH["planner.cli"]
    assert FRONTENDS and all(any(is_frontend(m) for m in MODULES if m.startswith(f))
                             for f in FRONTENDS)


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(GRAPH):
        if m not in index:
            visit(m)
    assert cycles == [], cycles


def test_the_core_imports_no_front_end_and_no_probe():
    bad = sorted((m, t) for m, ts in GRAPH.items() for t in ts
                 if m.startswith("planner") and not is_frontend(m)
                 and (is_frontend(t) or t.startswith("probes")))
    assert bad == [], bad


def test_probes_import_no_front_end():
    bad = sorted((m, t) for m, ts in GRAPH.items() for t in ts
                 if m.startswith("probes") and is_frontend(t))
    assert bad == [], bad


def test_hardware_profiles_import_nothing_of_the_project():
    bad = sorted((m, t) for m, ts in GRAPH.items() for t in ts
                 if m.startswith("hardware_profiles") and not t.startswith("hardware_profiles"))
    assert bad == [], bad
