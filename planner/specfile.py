"""Reading a job spec: JSON or YAML text in, a plain mapping out, bounded in time and memory.

A spec is small (a few dozen values), so anything far outside that is refused as a SpecError
before it can cost anything: text over MAX_SPEC_BYTES, nesting deeper than MAX_SPEC_DEPTH,
more than MAX_SPEC_NODES keys and values, and YAML anchors and aliases (``&a`` / ``*a``),
which let a few hundred bytes expand to billions of values (an "alias bomb"). The result holds
only JSON's types (mapping with string keys, list, string, integer, finite number, boolean,
null), whichever syntax it came in. docs/gating.md, "The spec".
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from planner.fields import SpecError

__all__ = ["MAX_SPEC_BYTES", "MAX_SPEC_DEPTH", "MAX_SPEC_NODES", "parse_spec_text",
           "read_spec"]

MAX_SPEC_BYTES = 1 << 20
"""Longest spec text, in characters."""
MAX_SPEC_DEPTH = 16
"""Deepest nesting of mappings and lists (a spec needs 2)."""
MAX_SPEC_NODES = 10_000
"""Most keys and values in a spec, counted one by one (a spec has about 40)."""

_SCALARS = (str, bool, int, float, type(None))


def _type(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _no_duplicates(name: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise SpecError(f"{name}: duplicate key {k!r}")
            out[k] = v
        return out
    return hook


def _constant(text: str) -> float:
    """JSON's NaN, Infinity and -Infinity as floats: _check_tree refuses them naming the
    file and the key ("spec: NaN is not a valid number" named neither)."""
    return float(text)


def _too_deep(name: str) -> SpecError:
    return SpecError(f"{name}: nested deeper than {MAX_SPEC_DEPTH} levels")


def _too_many(name: str) -> SpecError:
    return SpecError(f"{name}: more than {MAX_SPEC_NODES} keys and values")


def _check_tree(doc: Any, name: str) -> None:
    """Depth, size, and JSON's types only: SpecError naming the first offender's path."""
    todo: list[tuple[Any, str, int]] = [(doc, "", 1)]
    nodes = 0
    while todo:
        v, path, depth = todo.pop()
        nodes += 1
        if nodes > MAX_SPEC_NODES:
            raise _too_many(name)
        where = f"{name}: {path or 'the top level'}"
        if isinstance(v, dict):
            if depth > MAX_SPEC_DEPTH:
                raise _too_deep(name)
            for k, item in v.items():
                if not isinstance(k, str):
                    raise SpecError(f"{where}: keys must be strings, got {_type(k)} {k!r:.40}")
                nodes += 1
                todo.append((item, f"{path}.{k}" if path else k, depth + 1))
        elif isinstance(v, list):
            if depth > MAX_SPEC_DEPTH:
                raise _too_deep(name)
            todo += [(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(v)]
        elif not isinstance(v, _SCALARS):
            raise SpecError(f"{where}: a value of type {type(v).__name__} is not accepted "
                            "(use a string, a number, a boolean, a list or a mapping)")
        elif isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}: {v!r} is not a finite number")


def _parse_json(text: str, name: str) -> Any:
    import json

    try:
        return json.loads(text, object_pairs_hook=_no_duplicates(name), parse_constant=_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{name}: invalid JSON: {exc}") from None
    except RecursionError:
        raise _too_deep(name) from None
    except ValueError as exc:  # e.g. an integer past Python's 4300-digit limit
        raise SpecError(f"{name}: invalid JSON: {str(exc)[:200]}") from None


def _yaml_loader(yaml: Any, name: str) -> type:
    """A safe YAML loader class whose composer refuses anchors and aliases and stops past
    MAX_SPEC_DEPTH or MAX_SPEC_NODES, before anything is built; libyaml's parser when
    PyYAML was built with it."""
    from yaml.composer import Composer
    from yaml.events import AliasEvent, CollectionStartEvent
    from yaml.nodes import ScalarNode

    class BoundedComposer(Composer):
        _nodes = 0
        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            line = event.start_mark.line + 1 if event.start_mark else "?"
            if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
                raise SpecError(f"{name}: YAML anchors and aliases (& and *) are not accepted "
                                f"(line {line})")
            self._nodes += 1
            if self._nodes > MAX_SPEC_NODES:
                raise _too_many(name)
            if not isinstance(event, CollectionStartEvent):
                return super().compose_node(parent, index)
            if self._depth >= MAX_SPEC_DEPTH:
                raise _too_deep(name)
            self._depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_mapping_node(self, anchor: Any) -> Any:
            node = super().compose_mapping_node(anchor)
            seen = set()
            for key, _ in node.value:
                if isinstance(key, ScalarNode):
                    if (key.tag, key.value) in seen:
                        raise SpecError(f"{name}: duplicate key {key.value!r} "
                                        f"(line {key.start_mark.line + 1})")
                    seen.add((key.tag, key.value))
            return node

    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    parser = getattr(yaml, "CParser", None)
    if parser is not None:
        class Loader(BoundedComposer, parser, SafeConstructor, Resolver):
            def __init__(self, stream: str) -> None:
                parser.__init__(self, stream)
                BoundedComposer.__init__(self)
                SafeConstructor.__init__(self)
                Resolver.__init__(self)
    else:
        from yaml.parser import Parser
        from yaml.reader import Reader
        from yaml.scanner import Scanner

        class Loader(Reader, Scanner, Parser, BoundedComposer,  # type: ignore[no-redef]
                     SafeConstructor, Resolver):
            def __init__(self, stream: str) -> None:
                Reader.__init__(self, stream)
                Scanner.__init__(self)
                Parser.__init__(self)
                BoundedComposer.__init__(self)
                SafeConstructor.__init__(self)
                Resolver.__init__(self)
    return Loader


def _parse_yaml(text: str, name: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise SpecError("YAML spec needs PyYAML (pip install pyyaml) or use JSON") from None
    if not hasattr(yaml, "composer"):  # a stand-in module (tests), not PyYAML: trust it
        return yaml.safe_load(text)
    loader = None
    try:
        # inside the try: PyYAML's reader refuses some characters (a NUL byte) as it is built
        loader = _yaml_loader(yaml, name)(text)
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{name}: invalid YAML: {first}") from None
    except RecursionError:
        raise _too_deep(name) from None
    except (ValueError, OverflowError) as exc:  # a scalar the constructor cannot build
        raise SpecError(f"{name}: invalid YAML: {str(exc)[:200]}") from None
    finally:
        if loader is not None:
            loader.dispose()


def parse_spec_text(text: str, name: str = "spec") -> dict[str, Any]:
    """JSON always; YAML when PyYAML is importable. A mapping, or SpecError."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{name}: spec larger than {MAX_SPEC_BYTES} bytes")
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        raise SpecError(f"{name}: empty spec")
    if stripped[0] in "{[":
        doc = _parse_json(stripped, name)
    else:
        doc = _parse_yaml(stripped, name)
    if not isinstance(doc, dict):
        raise SpecError(f"{name}: must be a mapping (a JSON object), got {_type(doc)}")
    _check_tree(doc, name)
    return doc


def read_stdin(limit: int) -> str | None:
    """Up to ``limit`` + 1 bytes of stdin as UTF-8 text; None when they are not UTF-8. Read as
    bytes: Python decodes stdin strictly under a UTF-8 locale (en_US.UTF-8) and with
    surrogateescape under C, so one non-UTF-8 byte was an internal error (admitted by `gate
    --on-error admit`) on one machine and a YAML error on another."""
    import sys

    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream without bytes under it
        return sys.stdin.read(limit + 1)
    data = raw.read(limit + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        if len(data) > limit:  # perhaps cut inside a character: refused as too large anyway
            return data.decode("utf-8", "replace")
        return None


def read_spec(path: str) -> tuple[dict[str, Any], str | None]:
    """The spec at path ('-' = stdin) and the folder relative paths inside it resolve against."""
    if path == "-":
        text = read_stdin(MAX_SPEC_BYTES)
        if text is None:
            raise SpecError("stdin: not UTF-8 text")
        base = None
        name = "stdin"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_SPEC_BYTES + 1)
        except UnicodeDecodeError:
            raise SpecError(f"{path}: not UTF-8 text") from None
        base = os.path.dirname(os.path.abspath(path))
        name = path
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{name}: spec larger than {MAX_SPEC_BYTES} bytes")
    return parse_spec_text(text, name), base
