"""A torchtitan config registry (torchtitan >= 0.3: ``torchtitan/models/<model>/config_registry.py``,
functions returning ``Trainer.Config``), read without executing it.

The module's syntax tree is walked as a tiny interpreter of what registry functions are made
of: literals, keyword calls of ``*.Config`` / ``*Config`` classes (kept as mappings), calls of
the module's other registry functions, local names, ``config.a.b = value`` assignments,
``assert`` and docstrings. Any other call (``decoder_vocab_size(model_spec)``) is an
``Opaque`` value naming itself: harmless where it does not matter to memory, and named by the
reader where it does. A construct outside the subset (a loop, an ``if`` around an assignment)
is a JobError naming the function, the line and the construct: fitcheck never guesses which
branch runs.

``--job path/config_registry.py:llama3_8b`` names the function (``--config`` in torchtitan's
own launcher); a file with a single registry function needs no name.
"""

from __future__ import annotations

import ast
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.jobs.record import JobError

MAX_CALL_DEPTH = 8
ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
              ast.Mult: lambda a, b: a * b, ast.FloorDiv: lambda a, b: a // b,
              ast.Div: lambda a, b: a / b}
"""Arithmetic on literal numbers (``1 * 8192``); anything else stays Opaque."""


@dataclass(frozen=True, slots=True)
class Opaque:
    """A value the reader cannot compute without running code: ``what`` is its source text."""

    what: str

    def __str__(self) -> str:
        return f"<{self.what}>"


class Cls(dict):
    """A config object: its keyword arguments, and the class it was built from."""

    def __init__(self, cls: str, kwargs: dict[str, Any]) -> None:
        super().__init__(kwargs)
        self.cls = cls


class Registry:
    def __init__(self, text: str, name: str) -> None:
        self.name = name
        try:
            self.tree = ast.parse(text)
        except SyntaxError as exc:
            raise JobError(f"{name}: not valid Python: {exc.msg} (line {exc.lineno})") from None
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)
                          and not n.args.args and not n.name.startswith("_")}
        self.constants: dict[str, Any] = {}
        for n in self.tree.body:
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(
                    n.targets[0], ast.Name):
                try:
                    self.constants[n.targets[0].id] = ast.literal_eval(n.value)
                except (ValueError, SyntaxError, TypeError):
                    pass

    def configs(self) -> list[str]:
        """The registry functions: no arguments, annotated or returning a Trainer.Config."""
        out = []
        for fname, f in self.functions.items():
            ret = ast.unparse(f.returns) if f.returns is not None else ""
            if "Config" in ret or any(isinstance(s, ast.Return) for s in f.body):
                out.append(fname)
        return out

    def evaluate(self, fname: str | None) -> tuple[str, Any]:
        names = self.configs()
        if fname is None:
            if len(names) != 1:
                raise JobError(f"{self.name}: holds {len(names)} configs; name one as "
                               f"{self.name}:NAME (one of {', '.join(names[:12])}"
                               f"{', ...' if len(names) > 12 else ''})")
            fname = names[0]
        if fname not in self.functions:
            raise JobError(f"{self.name}: no config {fname!r}; the registry has "
                           f"{', '.join(names[:12])}{', ...' if len(names) > 12 else ''}")
        return fname, self.call(fname, 0)

    # ---- the interpreter -----------------------------------------------------------------

    def call(self, fname: str, depth: int) -> Any:
        if depth > MAX_CALL_DEPTH:
            raise JobError(f"{self.name}: {fname}: calls nested more than {MAX_CALL_DEPTH} deep")
        env: dict[str, Any] = {}
        for stmt in self.functions[fname].body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, (ast.Assert, ast.Pass, ast.Import, ast.ImportFrom)):
                if isinstance(stmt, ast.ImportFrom):
                    for a in stmt.names:
                        env[a.asname or a.name] = Opaque(a.name)
                continue
            if isinstance(stmt, ast.FunctionDef):
                env[stmt.name] = Opaque(f"function {stmt.name}")
                continue
            if isinstance(stmt, ast.Return):
                return self.expr(stmt.value, env, fname, depth) if stmt.value else None
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                v = self.expr(stmt.value, env, fname, depth) if stmt.value is not None else None
                for t in targets:
                    self.assign(t, v, env, fname, stmt)
                continue
            raise self.unsupported(fname, stmt)
        raise JobError(f"{self.name}: {fname}: returns no config")

    def unsupported(self, fname: str, node: ast.AST) -> JobError:
        return JobError(f"{self.name}: {fname}: line {getattr(node, 'lineno', '?')}: "
                        f"{type(node).__name__.lower()} statements are not read (fitcheck reads "
                        "literal configs without running them); give the job's settings as "
                        "flags")

    def assign(self, target: ast.expr, v: Any, env: dict, fname: str, stmt: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = v
            return
        if isinstance(target, ast.Attribute):
            obj = self.expr(target.value, env, fname, 0)
            if isinstance(obj, dict):
                obj[target.attr] = v
                return
            if isinstance(obj, Opaque):
                return  # a field of something unknown: nothing the reader uses
        raise self.unsupported(fname, stmt)

    def expr(self, node: ast.expr, env: dict, fname: str, depth: int) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.expr(e, env, fname, depth) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.expr(k, env, fname, depth) if k is not None else "**":
                    self.expr(v, env, fname, depth) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.constants:
                return self.constants[node.id]
            return Opaque(node.id)
        if isinstance(node, ast.Attribute):
            base = self.expr(node.value, env, fname, depth)
            if isinstance(base, dict):
                return base.get(node.attr, Opaque(ast.unparse(node)))
            return Opaque(ast.unparse(node))
        if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
            try:
                return ast.literal_eval(node)
            except ValueError:
                return Opaque(ast.unparse(node))
        if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
            a = self.expr(node.left, env, fname, depth)
            b = self.expr(node.right, env, fname, depth)
            numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
            if numbers and abs(a) < 1e15 and abs(b) < 1e15 and not (
                    isinstance(node.op, (ast.FloorDiv, ast.Div)) and b == 0):
                return ARITHMETIC[type(node.op)](a, b)
            return Opaque(ast.unparse(node))
        if isinstance(node, ast.Call):
            return self.call_expr(node, env, fname, depth)
        return Opaque(ast.unparse(node))

    def call_expr(self, node: ast.Call, env: dict, fname: str, depth: int) -> Any:
        callee = ast.unparse(node.func)
        short = callee.rsplit(".", 1)[-1]
        kwargs = {k.arg: self.expr(k.value, env, fname, depth) for k in node.keywords
                  if k.arg is not None}
        if isinstance(node.func, ast.Name) and node.func.id in self.functions \
                and not node.args and not node.keywords:
            return self.call(node.func.id, depth + 1)
        if short == "Config" or short.endswith("Config"):
            if node.args:
                kwargs["__args__"] = [self.expr(a, env, fname, depth) for a in node.args]
            return Cls(callee, kwargs)
        if callee in ("model_registry", "default_adamw"):
            args = [self.expr(a, env, fname, depth) for a in node.args]
            return Cls(callee, {"__args__": args, **kwargs})
        return Opaque(callee + "(...)")


def split_name(path: str) -> tuple[str, str | None]:
    """'models/llama3/config_registry.py:llama3_8b' -> (file, 'llama3_8b')."""
    head, sep, tail = path.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():
        return head, tail
    return path, None


def module_name(path: str) -> str | None:
    """The model family a registry file belongs to: models/<name>/config_registry.py."""
    parts = path.replace("\\", "/").split("/")
    if len(parts) >= 2 and parts[-1].endswith(".py"):
        return parts[-2]
    return None
