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

import abc
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
    blank_doc = not cls.__doc__
    if blank_doc:
        cls.__doc__ = "-"  # keeps dataclasses from running inspect.signature (set below)
    plain = _plain(cls)
    if plain:
        attrs = _fields_of_plain_class(cls, match_args=match_args, kw_only=kw_only)
        fields = tuple(attrs["__dataclass_fields__"].values())
    else:
        cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False, frozen=False,
                                    match_args=match_args, kw_only=kw_only, slots=slots)
        attrs, fields = {}, dataclasses.fields(cls)
    params = attrs.get("__dataclass_params__") or cls.__dataclass_params__
    params.init, params.repr, params.eq, params.frozen = True, repr, eq, frozen
    _check_default_order(fields)
    final: list[type] = []  # the class the methods belong to, once made
    attrs.update(_methods(cls, own, fields, final, repr=repr, eq=eq, frozen=frozen,
                          slots=slots))
    if blank_doc:
        attrs["__doc__"] = cls.__name__ + _text_signature(fields)
    if plain and slots:  # one new class with everything in it (each dunder set on a class
        cls = _slotted(cls, fields, attrs)  # afterwards costs an update of the type)
    else:
        for name, value in attrs.items():
            setattr(cls, name, value)
    if plain:
        abc.update_abstractmethods(cls)
    final.append(cls)
    return cls


def _methods(cls: type, own: set[str], fields: tuple[dataclasses.Field, ...],
             final: list[type], *, repr: bool, eq: bool, frozen: bool,  # noqa: A002
             slots: bool) -> dict[str, Any]:
    """The methods dataclasses would add to ``cls`` (none that the class defines itself)."""
    out: dict[str, Any] = {}
    if "__init__" not in own:
        out["__init__"] = _lazy_init(cls, frozen, fields, final)
    if repr and "__repr__" not in own:
        out["__repr__"] = _named(cls, _repr_fn(tuple(f.name for f in fields if f.repr)))
    if eq and "__eq__" not in own:
        out["__eq__"] = _named(cls, _eq_fn(_getter([f.name for f in fields if f.compare])))
    class_hash = cls.__dict__.get("__hash__", _MISSING)
    explicit_hash = not (class_hash is _MISSING or (class_hash is None and "__eq__" in own))
    if eq and not explicit_hash:
        # dataclasses._hash_action: eq without frozen sets __hash__ = None; eq and frozen add one
        out["__hash__"] = _named(cls, _hash_fn(_getter(
            [f.name for f in fields if (f.compare if f.hash is None else f.hash)]))) \
            if frozen else None
    if frozen:
        names = tuple(f.name for f in fields)
        out["__setattr__"] = _named(cls, _frozen_setattr(final, names))
        out["__delattr__"] = _named(cls, _frozen_delattr(final, names))
        if slots:  # dataclasses._add_slots: a frozen slotted class pickles through these
            for name, fn in (("__getstate__", _getstate), ("__setstate__", _setstate)):
                if name not in own:
                    out[name] = fn
    return out


# ---------------------------------------------------------------------------------------------
# The fields of a plain class, as dataclasses._process_class finds them


_PARAMS = dataclasses.dataclass(init=False, repr=False, eq=False)(
    type("_Params", (), {"__doc__": "-"})).__dataclass_params__
"""A ``__dataclass_params__`` to copy (its class is private to dataclasses; the docstring
spares dataclasses an inspect.signature)."""
_PRIVATE = getattr(dataclasses, "_FIELD", None) is not None \
    and "_field_type" in getattr(dataclasses.Field, "__slots__", ())
"""dataclasses.fields() keeps the Field objects whose ``_field_type`` is ``_FIELD``: set here
for a plain class; without them (another Python) the standard library finds the fields."""
_SPECIAL = ("ClassVar", "InitVar", "KW_ONLY")


def _plain(cls: type) -> bool:
    """A class this module finds the fields of itself: no base class, and no annotation that
    dataclasses treats specially (ClassVar, InitVar, KW_ONLY: those go to the standard
    library's processing)."""
    if not _PRIVATE or cls.__bases__ != (object,) or "__slots__" in cls.__dict__:
        return False
    text = " ".join(a if isinstance(a, str) else repr(a)
                    for a in cls.__dict__.get("__annotations__", {}).values())
    return not any(word in text for word in _SPECIAL)


def _fields_of_plain_class(cls: type, *, match_args: bool, kw_only: bool) -> dict[str, Any]:
    """dataclasses._process_class with no method written (``_get_field``, the class
    attributes, ``__match_args__``), for a class ``_plain`` accepts: the attributes to give
    the class (``__dataclass_fields__``, ``__dataclass_params__``, ``__match_args__``)."""
    annotations = cls.__dict__.get("__annotations__", {})
    fields: dict[str, dataclasses.Field] = {}
    for name, annotation in annotations.items():
        default = cls.__dict__.get(name, _MISSING)
        f = default if isinstance(default, dataclasses.Field) else dataclasses.field(
            default=default)
        f.name, f.type, f._field_type = name, annotation, dataclasses._FIELD
        if f.kw_only is _MISSING:
            f.kw_only = kw_only
        if f.default.__class__.__hash__ is None:  # a list, dict or set shared by instances
            raise ValueError(f"mutable default {type(f.default)} for field {name} is not "
                             "allowed: use default_factory")
        fields[name] = f
        if isinstance(default, dataclasses.Field):
            if f.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, f.default)
    for name, value in cls.__dict__.items():
        if isinstance(value, dataclasses.Field) and name not in annotations:
            raise TypeError(f"{name!r} is a field but has no type annotation")
    params = object.__new__(type(_PARAMS))
    for name in type(_PARAMS).__slots__:
        setattr(params, name, getattr(_PARAMS, name))
    for name, value in (("match_args", match_args), ("kw_only", kw_only)):
        if hasattr(params, name):  # Python 3.12 on
            setattr(params, name, value)
    out = {"__dataclass_fields__": fields, "__dataclass_params__": params}
    if match_args and "__match_args__" not in cls.__dict__:
        out["__match_args__"] = tuple(f.name for f in fields.values()
                                      if f.init and not f.kw_only)
    return out


def _slotted(cls: type, fields: tuple[dataclasses.Field, ...], methods: dict[str, Any]) -> type:
    """dataclasses._add_slots (no base class here, so no inherited slots), with the methods
    in the new class's namespace."""
    body = dict(cls.__dict__)
    body["__slots__"] = tuple(f.name for f in fields)
    for name in (*body["__slots__"], "__dict__", "__weakref__"):
        body.pop(name, None)
    body.update(methods)
    slotted = type(cls)(cls.__name__, cls.__bases__, body)
    slotted.__qualname__ = cls.__qualname__
    if hasattr(slotted.__dataclass_params__, "slots"):  # Python 3.12 on
        slotted.__dataclass_params__.slots = True
    return slotted


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
        shown = repr(f.type) if isinstance(f.type, str) else inspect.formatannotation(f.type)
        text = f"{f.name}: {shown}"
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


def _lazy_init(cls: type, frozen: bool, fields: tuple[dataclasses.Field, ...],
               final: list[type]) -> Callable:
    """An ``__init__`` that sets the fields as the generated one does (the same order, default
    factories called the same way, then ``__post_init__``) without compiling anything; on its
    HOT-th call, or on any call the generated one would reject (so the TypeError is Python's
    own), it compiles and installs the generated one."""
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
                compiled.append(init_of(final[0], frozen))
                final[0].__init__ = compiled[0]
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


def _frozen_setattr(final: list[type], names: tuple[str, ...]) -> Callable:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        cls = final[0]
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _frozen_delattr(final: list[type], names: tuple[str, ...]) -> Callable:
    def __delattr__(self: Any, name: str) -> None:
        cls = final[0]
        if type(self) is cls or name in names:
            raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__


def _getstate(self: Any) -> list:
    return [getattr(self, f.name) for f in dataclasses.fields(self)]


def _setstate(self: Any, state: list) -> None:
    for f, value in zip(dataclasses.fields(self), state):
        object.__setattr__(self, f.name, value)  # the class is frozen
