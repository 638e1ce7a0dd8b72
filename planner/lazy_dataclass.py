"""``dataclass`` as the standard library's, with its methods made when first used (cold start).

``@dataclass(frozen=True, slots=True, kw_only=True)`` from this module makes the same class as
``dataclasses.dataclass`` does: the same fields (``dataclasses.fields``, ``replace``,
``asdict`` and ``is_dataclass`` work on it), ``__slots__``, ``__match_args__``, docstring,
``__init__`` signature, ``repr``, ``==``, ``hash``, frozenness (``FrozenInstanceError``) and
pickling. What differs is when the work is done. CPython 3.11's ``dataclasses`` writes every
method as source text and compiles it with ``exec`` while the class is being defined: six
compiles per frozen class, ~0.2 ms each here, which made the planner's ~50 dataclasses about a
third of ``fitcheck``'s start (issue 23, item 8). Here:

* ``__init__`` sets the fields generically for a class's first few instantiations (most
  classes are instantiated once or never in a plan), then is compiled from the source the
  standard library writes (``HOT``);
* ``__repr__``, ``__eq__``, ``__hash__``, the frozen ``__setattr__``/``__delattr__`` and the
  slotted frozen class's ``__getstate__``/``__setstate__`` are small closures over the field
  names, compiled once with this module, that compute what the generated ones compute
  (CPython Lib/dataclasses.py: ``_repr_fn``, ``_cmp_fn``, ``_hash_fn``, ``_frozen_get_del_attr``,
  ``_dataclass_getstate``/``_dataclass_setstate``).

The field processing itself (defaults, ``field()``, ``KW_ONLY``, mutable-default checks,
``__slots__``) is the standard library's: this module calls ``dataclasses.dataclass`` with
method generation switched off, then adds the methods. Anything it does not handle (``order``,
``unsafe_hash``, ``weakref_slot``, ``init=False``, ``InitVar``, a dataclass base class) goes to
the standard library unchanged. tests/test_lazy_dataclass.py holds every dataclass of planner/
to the standard library's version of it.
"""

from __future__ import annotations

import builtins
import dataclasses
import inspect
import operator
import reprlib
from collections.abc import Callable
from typing import Any

__all__ = ["dataclass", "init_of"]

_MISSING = dataclasses.MISSING


class _FactorySentinel:
    """The default shown for a ``default_factory`` parameter (the standard library's too)."""

    def __repr__(self) -> str:
        return "<factory>"


_HAS_DEFAULT_FACTORY = _FactorySentinel()


def dataclass(cls: type | None = None, /, *, init: bool = True, repr: bool = True,  # noqa: A002
              eq: bool = True, order: bool = False, unsafe_hash: bool = False,
              frozen: bool = False, match_args: bool = True, kw_only: bool = False,
              slots: bool = False, weakref_slot: bool = False) -> Any:
    """``dataclasses.dataclass``, with the methods written lazily (see the module's doc)."""
    std = dict(init=init, repr=repr, eq=eq, order=order, unsafe_hash=unsafe_hash, frozen=frozen,
               match_args=match_args, kw_only=kw_only, slots=slots)
    if weakref_slot:
        std["weakref_slot"] = weakref_slot

    def wrap(c: type) -> type:
        if order or unsafe_hash or weakref_slot or not init or _has_initvar(c) \
                or any(hasattr(b, "__dataclass_fields__") for b in c.__mro__[1:]):
            return dataclasses.dataclass(c, **std)
        return _process(c, repr=repr, eq=eq, frozen=frozen, match_args=match_args,
                        kw_only=kw_only, slots=slots)

    return wrap if cls is None else wrap(cls)


def _has_initvar(cls: type) -> bool:
    return any("InitVar" in (a if isinstance(a, str) else getattr(a, "__name__", repr(a)))
               or isinstance(a, dataclasses.InitVar)
               for a in cls.__dict__.get("__annotations__", {}).values())


def _process(cls: type, *, repr: bool, eq: bool, frozen: bool, match_args: bool,  # noqa: A002
             kw_only: bool, slots: bool) -> type:
    own = set(cls.__dict__)
    if frozen:
        for name in ("__setattr__", "__delattr__"):
            if name in own:  # the standard library's message (dataclasses._process_class)
                raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
    class_hash = cls.__dict__.get("__hash__", _MISSING)
    has_explicit_hash = not (class_hash is _MISSING
                             or (class_hash is None and "__eq__" in own))
    blank_doc = not cls.__doc__
    if blank_doc:
        cls.__doc__ = "-"  # keeps dataclasses from running inspect.signature on a stub init
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=False,
                                match_args=match_args, kw_only=kw_only, slots=slots)
    params = cls.__dataclass_params__
    params.init, params.repr, params.eq, params.frozen = True, repr, eq, frozen
    fields = dataclasses.fields(cls)
    _check_default_order(fields)
    if blank_doc:
        cls.__doc__ = cls.__name__ + _text_signature(fields)
    if "__init__" not in own:
        cls.__init__ = _lazy_init(cls, frozen)
    if repr and "__repr__" not in own:
        cls.__repr__ = _named(cls, _repr_fn(tuple(f.name for f in fields if f.repr)))
    if eq and "__eq__" not in own:
        cls.__eq__ = _named(cls, _eq_fn(_getter([f.name for f in fields if f.compare])))
    if eq and not has_explicit_hash:
        # dataclasses._hash_action: eq without frozen sets __hash__ = None; eq and frozen add one
        cls.__hash__ = _named(cls, _hash_fn(_getter(
            [f.name for f in fields if (f.compare if f.hash is None else f.hash)]))) \
            if frozen else None
    if frozen:
        names = tuple(f.name for f in fields)
        cls.__setattr__ = _named(cls, _frozen_setattr(cls, names))
        cls.__delattr__ = _named(cls, _frozen_delattr(cls, names))
        if slots:  # dataclasses._add_slots: a frozen slotted class pickles through these
            own_now = set(cls.__dict__)
            if "__getstate__" not in own_now:
                cls.__getstate__ = _getstate
            if "__setstate__" not in own_now:
                cls.__setstate__ = _setstate
    return cls


def _check_default_order(fields: tuple[dataclasses.Field, ...]) -> None:
    """dataclasses._process_class's check, kept at class definition rather than first use."""
    seen_default = False
    for f in fields:
        if f.init and not f.kw_only:
            if f.default is _MISSING and f.default_factory is _MISSING:
                if seen_default:
                    raise TypeError(f"non-default argument {f.name!r} follows default argument")
            else:
                seen_default = True


def _text_signature(fields: tuple[dataclasses.Field, ...]) -> str:
    """``str(inspect.signature(cls))`` of the generated ``__init__``, as dataclasses puts it
    into a class's missing docstring."""
    def param(f: dataclasses.Field) -> str:
        text = f"{f.name}: {inspect.formatannotation(f.type)}"
        if f.default is not _MISSING:
            return f"{text} = {f.default!r}"
        if f.default_factory is not _MISSING:
            return f"{text} = {_HAS_DEFAULT_FACTORY!r}"
        return text

    pos = [param(f) for f in fields if f.init and not f.kw_only]
    kw = [param(f) for f in fields if f.init and f.kw_only]
    return "(" + ", ".join(pos + (["*", *kw] if kw else [])) + ")"


def _named(cls: type, fn: Callable) -> Callable:
    fn.__qualname__ = f"{cls.__qualname__}.{fn.__name__}"
    return fn


# ---------------------------------------------------------------------------------------------
# __init__: the standard library's source (dataclasses._init_fn), compiled on first use


HOT = 32
"""Instantiations of a class after which its ``__init__`` is compiled: until then a generic
one sets the fields (compiling a 48-field ``__init__`` costs more than 32 generic calls)."""


def _lazy_init(cls: type, frozen: bool) -> Callable:
    """An ``__init__`` that sets the fields as the generated one does (the same order, default
    factories called the same way, then ``__post_init__``) without compiling anything; on its
    HOT-th call, or on any call the generated one would reject (so the TypeError is Python's
    own), it compiles and installs the generated one."""
    fields = dataclasses.fields(cls)
    pos = tuple(f.name for f in fields if f.init and not f.kw_only)
    accepted = frozenset(f.name for f in fields if f.init)
    required = frozenset(f.name for f in fields if f.init and f.default is _MISSING
                         and f.default_factory is _MISSING)
    steps = tuple((f.name, f.init, f.default, f.default_factory) for f in fields)
    put = object.__setattr__ if frozen else setattr
    post_init = hasattr(cls, "__post_init__")
    calls, compiled = 0, []

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        given = dict(zip(pos, args))
        if calls >= HOT or compiled or len(args) > len(pos) or not accepted.issuperset(kwargs) \
                or not given.keys().isdisjoint(kwargs) or not required <= given.keys() | kwargs:
            if not compiled:
                compiled.append(init_of(cls, frozen))
                cls.__init__ = compiled[0]
            compiled[0](self, *args, **kwargs)
            return
        given.update(kwargs)
        for name, init, default, factory in steps:
            if init and name in given:
                put(self, name, given[name])
            elif factory is not _MISSING:
                put(self, name, factory())
            elif default is not _MISSING:
                put(self, name, default)
        if post_init:
            self.__post_init__()

    return _named(cls, __init__)


def init_of(cls: type, frozen: bool | None = None) -> Callable:
    """The ``__init__`` dataclasses would write for ``cls`` (compiled now)."""
    if frozen is None:
        frozen = cls.__dataclass_params__.frozen
    fields = dataclasses.fields(cls)
    env: dict[str, Any] = {"__builtins__": builtins, "__dataclass_setattr__": object.__setattr__,
                           "__dataclass_HAS_DEFAULT_FACTORY__": _HAS_DEFAULT_FACTORY}
    annotations: dict[str, Any] = {}
    pos, kw, body = [], [], []
    for f in fields:
        if f.init:
            annotations[f.name] = f.type
            default = ""
            if f.default is not _MISSING:
                env[f"__dataclass_dflt_{f.name}__"] = f.default
                default = f"=__dataclass_dflt_{f.name}__"
            elif f.default_factory is not _MISSING:
                default = "=__dataclass_HAS_DEFAULT_FACTORY__"
            (kw if f.kw_only else pos).append(f"{f.name}{default}")
        value = _init_value(f, env)
        if value is not None:
            body.append(f"__dataclass_setattr__(self,{f.name!r},{value})" if frozen
                        else f"self.{f.name}={value}")
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
    params = ", ".join(["self", *pos, *(["*", *kw] if kw else [])])
    src = f"def __init__({params}):\n" + "".join(f" {line}\n" for line in body or ["pass"])
    exec(src, env)  # noqa: S102  (the source is built above from field names only)
    fn = env["__init__"]
    fn.__annotations__ = {**annotations, "return": None}
    return _named(cls, fn)


def _init_value(f: dataclasses.Field, env: dict[str, Any]) -> str | None:
    """The expression a field is set to (dataclasses._field_init), None when it is not set."""
    if f.default_factory is not _MISSING:
        env[f"__dataclass_factory_{f.name}__"] = f.default_factory
        call = f"__dataclass_factory_{f.name}__()"
        if f.init:
            return f"{call} if {f.name} is __dataclass_HAS_DEFAULT_FACTORY__ else {f.name}"
        return call
    if f.init:
        return f.name
    if f.default is not _MISSING:
        env[f"__dataclass_dflt_{f.name}__"] = f.default
        return f"__dataclass_dflt_{f.name}__"
    return None


# ---------------------------------------------------------------------------------------------
# The other methods: closures over the field names


def _getter(names: list[str]) -> Callable[[Any], tuple]:
    """``obj -> (obj.a, obj.b, ...)``, always a tuple (attrgetter of one name is not)."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        return lambda obj: (one(obj),)
    return operator.attrgetter(*names)


def _repr_fn(names: tuple[str, ...]) -> Callable:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        return self.__class__.__qualname__ + "(" + ", ".join(
            [f"{n}={getattr(self, n)!r}" for n in names]) + ")"

    return __repr__


def _eq_fn(key: Callable[[Any], tuple]) -> Callable:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    return __eq__


def _hash_fn(key: Callable[[Any], tuple]) -> Callable:
    def __hash__(self: Any) -> int:
        return hash(key(self))

    return __hash__


def _frozen_setattr(cls: type, names: tuple[str, ...]) -> Callable:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr(cls: type, names: tuple[str, ...]) -> Callable:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__


def _getstate(self: Any) -> list:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list) -> None:
    for f, value in zip(dataclasses.fields(self), state):
        object.__setattr__(self, f.name, value)  # the class is frozen
