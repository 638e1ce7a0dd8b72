"""planner.lazy_dataclass makes the classes dataclasses.dataclass makes (issue 23, item 8).

Two ways: small classes covering each feature, made by both decorators side by side; and
every dataclass of planner/ plus a whole plan, made once with the standard library patched in
and once as shipped, in two processes with the same hash seed, compared as text.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
from dataclasses import KW_ONLY, field
from typing import ClassVar
from pathlib import Path

import pytest

from planner.lazy_dataclass import dataclass as lazy_dataclass
from planner.lazy_dataclass import HOT, init_of

ROOT = Path(__file__).resolve().parent.parent


def _classes(deco):
    """The same class bodies under one decorator (dataclasses or the lazy one)."""

    @deco(frozen=True, slots=True, kw_only=True)
    class Frozen:
        """Has a docstring."""

        a: int
        b: str = "x"
        c: dict = field(default_factory=dict)
        d: float = field(default=1.5, repr=False)
        e: int = field(default=0, compare=False)

    @deco(frozen=True, slots=True)
    class Positional:
        a: int
        b: tuple = (1, 2)
        _: KW_ONLY
        k: list = field(default_factory=list)

    @deco(frozen=True)
    class One:
        x: float

    @deco(slots=True)
    class Mutable:
        a: int
        b: list = field(default_factory=list)

        def __post_init__(self) -> None:
            self.b.append(self.a)

    @deco(frozen=True, slots=True)
    class OwnMethods:
        a: int
        b: int = 0

        def __eq__(self, other: object) -> bool:
            return isinstance(other, OwnMethods) and self.a == other.a

        def __repr__(self) -> str:
            return f"<{self.a}>"

    @deco(frozen=True, kw_only=True)
    class HashField:
        a: int
        b: int = field(default=0, hash=False)
        c: int = field(default=0, compare=False, hash=True)

    @deco(frozen=True, slots=True)
    class Empty:
        pass

    class Mixin:
        def double(self) -> int:
            return 2 * self.a

    @deco(frozen=True, slots=True)
    class WithBase(Mixin):  # a base class: the standard library finds the fields
        a: int
        b: list = field(default_factory=list)

    @deco(frozen=True)
    class WithClassVar:  # so does a ClassVar
        a: int
        limit: ClassVar[int] = 3

    return {c.__name__: c for c in (Frozen, Positional, One, Mutable, OwnMethods, HashField,
                                    Empty, WithBase, WithClassVar)}


STD = _classes(dataclasses.dataclass)
LAZY = _classes(lazy_dataclass)
NAN = float("nan")
ARGS = {  # two different instances of each class: (args, kwargs), made afresh for each use
    "Frozen": lambda: [((), dict(a=1)), ((), dict(a=2, b="y", c={"k": 1}, d=2.5, e=3))],
    "Positional": lambda: [((1,), {}), ((2, (3,)), dict(k=[4]))],
    "One": lambda: [((NAN,), {}), ((2.0,), {})],
    "Mutable": lambda: [((1,), {}), ((2, [0]), {})],
    "OwnMethods": lambda: [((1,), {}), ((1, 2), {})],
    "HashField": lambda: [((), dict(a=1)), ((), dict(a=1, b=5, c=6))],
    "Empty": lambda: [((), {}), ((), {})],
    "WithBase": lambda: [((1,), {}), ((2, [3]), {})],
    "WithClassVar": lambda: [((1,), {}), ((), dict(a=2))],
}


def _same_call(fn, name):
    """fn(cls, instances) under both decorators: (the value's repr, or the exception and its
    message) for each."""
    out = []
    for classes in (STD, LAZY):
        try:
            out.append(("ok", repr(fn(classes[name], ARGS[name]()))))
        except Exception as exc:  # the comparison is the point
            out.append((type(exc).__name__, str(exc)))
    return out


@pytest.mark.parametrize("name", sorted(ARGS))
def test_each_feature_matches_dataclasses(name):
    std, lazy = STD[name], LAZY[name]
    assert lazy.__doc__ == std.__doc__
    assert str(inspect.signature(init_of(lazy))) == str(inspect.signature(std.__init__))
    assert init_of(lazy).__annotations__ == std.__init__.__annotations__
    assert [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.compare, f.hash,
             f.kw_only) for f in dataclasses.fields(lazy)] == \
        [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.compare, f.hash,
          f.kw_only) for f in dataclasses.fields(std)]
    for attr in ("__slots__", "__match_args__"):
        assert getattr(lazy, attr, None) == getattr(std, attr, None), attr
    for attr in ("init", "repr", "eq", "order", "unsafe_hash", "frozen"):
        assert getattr(lazy.__dataclass_params__, attr) == getattr(std.__dataclass_params__, attr)
    assert (lazy.__hash__ is None) == (std.__hash__ is None)
    assert dataclasses.is_dataclass(lazy)

    def one(c, args):
        return c(*args[0][0], **args[0][1])

    def two(c, args):
        return c(*args[1][0], **args[1][1])

    for use in (
        one, two,
        lambda c, a: one(c, a) == one(c, a),
        lambda c, a: one(c, a) == two(c, a),
        lambda c, a: one(c, a) != two(c, a),
        lambda c, a: (lambda x: x == x)(one(c, a)),  # the same object (nan == nan in a tuple)
        lambda c, a: one(c, a).__eq__(1),
        lambda c, a: hash(one(c, a)),
        lambda c, a: hash(two(c, a)),
        lambda c, a: {one(c, a): 1, two(c, a): 2},
        lambda c, a: dataclasses.asdict(two(c, a)),
        lambda c, a: dataclasses.astuple(two(c, a)),
        lambda c, a: dataclasses.replace(one(c, a)),
        lambda c, a: pickle.loads(pickle.dumps(two(c, a))),
        lambda c, a: copy.deepcopy(two(c, a)),
        lambda c, a: copy.copy(two(c, a)),
        lambda c, a: setattr(one(c, a), "a", 5),
        lambda c, a: setattr(one(c, a), "zz", 5),
        lambda c, a: delattr(one(c, a), "a"),
        lambda c, a: c(*a[0][0], 99, **a[0][1]),  # too many arguments
        lambda c, a: c(*a[0][0], nope=1, **a[0][1]),
        lambda c, a: c(),
    ):
        std_out, lazy_out = _same_call(use, name)
        if std_out[1] == "super(type, obj): obj must be an instance or subtype of type":
            # CPython 3.11 bug: a frozen slotted dataclass's __setattr__ calls super() with the
            # class it replaced, so setting a name that is not a field fails with this
            # TypeError; the lazy class raises what an unslotted frozen dataclass raises
            assert lazy_out[0] == "FrozenInstanceError"
            continue
        assert lazy_out == std_out


@pytest.mark.parametrize("name", sorted(ARGS))
def test_generic_init_then_compiled_init_set_the_same_fields(name):
    """The first HOT - 1 instances come from the generic __init__, the rest from the compiled
    one (installed on the class at the HOT-th): all equal to the standard library's."""
    lazy, std = _classes(lazy_dataclass)[name], STD[name]
    stub = lazy.__init__
    for i in range(HOT + 2):
        for (args, kwargs), (std_args, std_kwargs) in zip(ARGS[name](), ARGS[name]()):
            assert repr(lazy(*args, **kwargs)) == repr(std(*std_args, **std_kwargs))
        assert (lazy.__init__ is stub) == (i + 1 < HOT // 2), i  # two instances per round
    assert str(inspect.signature(lazy)) == str(inspect.signature(std))


def test_definition_errors_as_dataclasses_raises_them():
    for deco in (dataclasses.dataclass, lazy_dataclass):
        with pytest.raises(TypeError, match="non-default argument 'b' follows default"):
            @deco(frozen=True)
            class Order:
                a: int = 0
                b: int
        with pytest.raises(ValueError, match="mutable default"):
            @deco(frozen=True)
            class Mutable:
                a: list = []  # noqa: RUF012
        with pytest.raises(TypeError, match="Cannot overwrite attribute __setattr__"):
            @deco(frozen=True)
            class Own:
                a: int

                def __setattr__(self, name, value):
                    pass


_DUMP = r"""
import dataclasses, importlib, inspect, json, pickle, pkgutil, sys
import planner.lazy_dataclass as ld
if sys.argv[1] == "stdlib":
    ld.dataclass = dataclasses.dataclass  # before any planner module takes the name
import planner
out = {}
for info in sorted(pkgutil.walk_packages(planner.__path__, "planner."), key=lambda i: i.name):
    if info.name.endswith("__main__"):
        continue
    mod = importlib.import_module(info.name)
    for name, cls in sorted(vars(mod).items()):
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)
                and cls.__module__ == mod.__name__):
            continue
        init = cls.__init__ if sys.argv[1] == "stdlib" else ld.init_of(cls)
        p = cls.__dataclass_params__
        out[f"{mod.__name__}.{cls.__qualname__}"] = {
            "doc": cls.__doc__, "init": str(inspect.signature(init)),
            "annotations": repr(init.__annotations__),
            "fields": repr([(f.name, f.type, None if f.default is dataclasses.MISSING
                             else f.default, f.init, f.repr, f.compare, f.hash, f.kw_only)
                            for f in dataclasses.fields(cls)]),
            "params": [p.init, p.repr, p.eq, p.order, p.unsafe_hash, p.frozen],
            "slots": getattr(cls, "__slots__", None), "match": getattr(cls, "__match_args__", None),
            "hash": cls.__hash__ is None,
            "own": sorted(k for k in vars(cls) if k in ("__eq__", "__repr__", "__hash__",
                          "__setattr__", "__delattr__", "__getstate__", "__setstate__")),
        }
from planner.request import build_request
from planner.plan import plan
r = build_request({"model.preset": "llama3-8b", "hardware.gpu": "h100-80", "hardware.n": "8"})
a = plan(r)
b = pickle.loads(pickle.dumps(a))
out["plan"] = {"repr": repr(a), "hash": hash(r.model), "eq": [a == b, hash(b.request.model)],
               "replace": repr(dataclasses.replace(r.training, seq=4096))}
print(json.dumps(out, indent=1, sort_keys=True))
"""


def test_every_planner_dataclass_and_a_plan_match_dataclasses():
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": str(ROOT)}
    std, lazy = (json.loads(re.sub(r" at 0x[0-9a-f]+", " at 0x...", subprocess.run(
        [sys.executable, "-c", _DUMP, how], capture_output=True, text=True, env=env, check=True,
        cwd=ROOT).stdout)) for how in ("stdlib", "lazy"))
    assert len(std) > 40  # planner/ has ~80 dataclasses; the plan is one more entry
    assert std.keys() == lazy.keys()
    for key in std:
        assert lazy[key] == std[key], key


def test_planner_modules_take_dataclass_from_lazy_dataclass():
    """A dataclass made by dataclasses.dataclass in planner/ or hardware_profiles/ costs its
    compiled methods at every start (issue 23, item 8): import the decorator from
    planner.lazy_dataclass instead."""
    import ast

    offenders = []
    for pkg in ("planner", "hardware_profiles"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            if path.name == "lazy_dataclass.py" or "dataclasses" not in text:
                continue
            for node in ast.walk(ast.parse(text, str(path))):
                if isinstance(node, ast.ImportFrom) and node.module == "dataclasses" \
                        and any(a.name == "dataclass" for a in node.names):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports it")
                elif isinstance(node, ast.Attribute) and node.attr == "dataclass" \
                        and isinstance(node.value, ast.Name) and node.value.id == "dataclasses":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} uses it")
    assert offenders == []
