"""Write a framework's key list (a schema snapshot) from its source, without importing it.

    python tests/data/jobs/schemas/extract.py ROOT [PREFIX=]module:Class ... > OUT.txt
    python tests/data/jobs/schemas/extract.py ROOT --args [PREFIX=]path/to/file.py ... > OUT.txt

ROOT is an unpacked wheel or sdist (pip download --no-deps NAME==VERSION). Each class is a
dataclass or a pydantic model; its fields and those of the classes it inherits from (found in
ROOT) are listed as ``key<TAB>default<TAB>class`` lines, the default as the source writes it
(``-`` when the field has none or it is computed). A pydantic ``alias`` is listed as a key of
its own. ``--args`` lists a file's argparse options (``add_argument("--name", ...)``) and the
parameters of its ``setup`` function instead. PREFIX (``zero_optimization.``) is put before
every key listed from that class or file. Only the key names and defaults are kept: they are facts about the framework that the
tables in planner/data/job_keys_*.json classify (tests/test_jobs_keys.py checks that every
key listed here is classified).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def _module_file(root: Path, module: str) -> Path:
    base = root.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


class Index:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[str, ast.Module] = {}

    def tree(self, module: str) -> ast.Module:
        if module not in self.cache:
            self.cache[module] = ast.parse(_module_file(self.root, module).read_text())
        return self.cache[module]

    def find(self, module: str, name: str, seen: int = 0) -> tuple[str, ast.ClassDef] | None:
        """The class ``name`` as seen from ``module``: defined there or imported into it."""
        if seen > 8:
            return None
        try:
            tree = self.tree(module)
        except (FileNotFoundError, SyntaxError):
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module is not None or (
                    isinstance(node, ast.ImportFrom) and node.level):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        src = node.module or ""
                        if node.level:
                            parts = module.split(".")
                            pkg = parts[:len(parts) - node.level] if not _module_file(
                                self.root, module).name == "__init__.py" else parts[
                                :len(parts) - node.level + 1]
                            src = ".".join(pkg + ([src] if src else []))
                        got = self.find(src, alias.name, seen + 1)
                        if got:
                            return got
        return None


def _default(value: ast.expr | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, ast.Call):
        fn = ast.unparse(value.func)
        if fn.split(".")[-1] in ("field", "Field"):
            for kw in value.keywords:
                if kw.arg == "default":
                    return ast.unparse(kw.value)
                if kw.arg == "default_factory":
                    return f"factory:{ast.unparse(kw.value)}"
            if value.args:
                return ast.unparse(value.args[0])
            return "-"
    return ast.unparse(value)


def _alias(value: ast.expr | None) -> str | None:
    if isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] == "Field":
        for kw in value.keywords:
            if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                return kw.value.value
    return None


def fields(index: Index, module: str, name: str, out: dict[str, tuple[str, str]]) -> None:
    got = index.find(module, name)
    if got is None:
        raise SystemExit(f"class {name} not found from {module}")
    mod, cls = got
    for base in cls.bases:
        bname = ast.unparse(base).split(".")[-1]
        if bname in ("object", "BaseModel", "Generic") or bname.startswith("Generic["):
            continue
        if index.find(mod, bname):
            fields(index, mod, bname, out)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            key = node.target.id
            if key.startswith("_") or "ClassVar" in ast.unparse(node.annotation):
                continue
            out[key] = (_default(node.value), cls.name)
            alias = _alias(node.value)
            if alias:
                out[alias] = (_default(node.value), f"{cls.name} (alias of {key})")


def options(path: Path) -> dict[str, tuple[str, str]]:
    """argparse options and setup() parameters of a file."""
    tree = ast.parse(path.read_text())
    out: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
            for a in node.args:
                if isinstance(a, ast.Constant) and str(a.value).startswith("--"):
                    default = next((ast.unparse(k.value) for k in node.keywords
                                    if k.arg == "default"), "-")
                    out[str(a.value)[2:].replace("-", "_")] = (default, path.name)
        if isinstance(node, ast.FunctionDef) and node.name == "setup":
            a = node.args
            defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
            for arg, d in zip(a.args, defaults):
                out[arg.arg] = (ast.unparse(d) if d is not None else "-", path.name)
    return out


def main(argv: list[str]) -> None:
    root = Path(argv[0])
    index = Index(root)
    as_args = "--args" in argv
    for spec in (a for a in argv[1:] if a != "--args"):
        prefix, _, target = spec.rpartition("=")
        out: dict[str, tuple[str, str]] = {}
        if as_args:
            out = options(root / target)
        else:
            module, name = target.split(":")
            fields(index, module, name, out)
        for key, (default, owner) in out.items():
            print(f"{prefix}{key}\t{' '.join(default.split())}\t{owner}")


if __name__ == "__main__":
    main(sys.argv[1:])
