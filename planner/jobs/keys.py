"""Every key of each framework's configuration schema, classified: never a silent key.

A table per framework (``planner/data/job_keys_<name>.json``) lists every key of the schema at
a stated version (the key lists come from the framework's own source: its pydantic models and
config dataclasses; tests/data/jobs/schemas/ holds the snapshots and the script that took
them) and says of each:

- ``field``: read by the format's reader into a fitcheck field (``field`` names it). Whether
  the planner models that field is the registry's call at run time (planner/fields.py): a
  degree mapped to ``parallel.pp`` is a NOT MODELLED line until the registry has it.
  ``parallel.cp`` is in the registry (torch's ``context_parallel`` as torchtitan wires it;
  torchtune and accelerate run the same, the latter with ``parallel.cp_kv`` grouped); a
  reader whose framework runs another mechanism says which itself (``readers/common.py``
  ``unread_cp``).
- ``memory``: changes memory or step time and fitcheck does not model it: a NOT MODELLED line
  (a warning in a plan, the reason of a gate's reject) unless the file gives the framework's
  default (``default``) or a value that changes nothing (``neutral``).
- ``irrelevant``: logging, paths, seeds, evaluation: no effect on a training step's memory or
  time.
- ``section``: a mapping whose own keys are listed (``zero_optimization`` -> ``zero_optimization
  .stage``); ``open`` on any other kind covers the whole mapping under the key.

``audit`` walks a parsed document against its table after the reader ran: what the table
says is not modelled, and every key it does not know, becomes a line naming the file, the
key and the value. docs/jobs.md's key tables are generated from the same data
(planner/jobs/keydoc.py).
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from planner.lazy_dataclass import dataclass

DATA = Path(__file__).resolve().parent.parent / "data"
TABLES = ("deepspeed", "accelerate", "transformers", "trl", "llamafactory", "llamafactory_v1",
          "axolotl", "litgpt", "torchtune", "torchtitan")
"""Every table, in the order docs/jobs.md lists them."""
NO_DEFAULT = object()


class Kind(enum.StrEnum):
    FIELD = "field"
    MEMORY = "memory"
    IRRELEVANT = "irrelevant"
    SECTION = "section"


@dataclass(frozen=True, slots=True)
class Key:
    name: str
    """Dotted from the document's top: 'zero_optimization.stage', 'fsdp_config.fsdp_version'."""
    kind: Kind
    field: str = ""
    """FIELD: the fitcheck field path the reader maps it to (or '-' when it only decides how
    other keys are read)."""
    default: Any = NO_DEFAULT
    """The framework's default at the table's version (NO_DEFAULT: none, or computed)."""
    neutral: tuple[Any, ...] = ()
    """Values besides the default that change nothing (a degree of 1, an empty list)."""
    what: str = ""
    """MEMORY: what the key changes, in a few words ('GaLore low-rank gradient projection')."""
    open: bool = False
    """The whole mapping under the key is covered by this entry."""
    bound: bool = False
    """MEMORY that only lowers memory, at no cost in step time fitcheck would plan: the plan
    is an upper bound, so the key is a warning rather than a NOT MODELLED line."""


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    """The table's file stem: 'deepspeed', 'llamafactory_v1'."""
    framework: str
    """As people write it: 'DeepSpeed', 'LLaMA-Factory v1'."""
    version: str
    source: str
    """Where the key list and the defaults come from (package version, files)."""
    keys: dict[str, Key]
    parents: frozenset[str] = frozenset()
    """Every key with keys of its own under it ('zero_optimization', 'optimizer.params')."""
    ignores_unknown: tuple[str, ...] = ()
    """Prefixes ('' for the top level) under which the framework itself ignores a key it does
    not know (DeepSpeed's top level): such a key is a warning, not a NOT MODELLED line."""

    @property
    def label(self) -> str:
        return f"{self.framework} {self.version}"

    def get(self, name: str) -> Key | None:
        return self.keys.get(name)

    def default(self, name: str) -> Any:
        k = self.keys.get(name)
        return NO_DEFAULT if k is None else k.default

    def top_level(self) -> frozenset[str]:
        return frozenset(k.split(".", 1)[0] for k in self.keys)

    def has_children(self, name: str) -> bool:
        return name in self.parents


def _key(name: str, raw: Any) -> Key:
    if isinstance(raw, str):  # "irrelevant", "section", "field training.seq"
        kind, _, rest = raw.partition(" ")
        return Key(name=name, kind=Kind(kind), field=rest.strip())
    return Key(name=name, kind=Kind(raw["kind"]), field=raw.get("field", ""),
               default=raw.get("default", NO_DEFAULT),
               neutral=tuple(raw.get("neutral", ())), what=raw.get("what", ""),
               open=bool(raw.get("open", False)), bound=bool(raw.get("bound", False)))


@functools.cache
def table(name: str) -> Table:
    """The table ``planner/data/job_keys_<name>.json``."""
    doc = json.loads((DATA / f"job_keys_{name}.json").read_text(encoding="utf-8"))
    keys = {k: _key(k, v) for k, v in doc["keys"].items()}
    parents = frozenset(".".join(k.split(".")[:i]) for k in keys
                        for i in range(1, k.count(".") + 1))
    return Table(name=name, framework=doc["framework"], version=doc["version"],
                 source=doc["source"], keys=keys, parents=parents,
                 ignores_unknown=tuple(doc.get("ignores_unknown", ())))


# ---------------------------------------------------------------------------------------------
# The audit


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        if isinstance(a, str) and a.strip().lower() in ("true", "false"):
            a = a.strip().lower() == "true"
        if isinstance(b, str) and b.strip().lower() in ("true", "false"):
            b = b.strip().lower() == "true"
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def at_default(key: Key, value: Any) -> bool:
    """Does ``value`` leave the framework doing what it does without the key?"""
    if value is None:
        return True
    if isinstance(value, (dict, list, str)) and not value and (
            key.default in (None, NO_DEFAULT) or key.default in ({}, [], "")):
        return True
    if key.default is not NO_DEFAULT and _same(value, key.default):
        return True
    if any(_same(value, n) for n in key.neutral):
        return True
    # a feature section switched off
    return isinstance(value, Mapping) and "enabled" in value and _same(value["enabled"], False)


def shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {shown(v)}" for k, v in list(value.items())[:3]) + (
            ", ...}" if len(value) > 3 else "}")
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value[:4]) + (", ...]" if len(value) > 4
                                                                else "]")
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, slots=True)
class Finding:
    """One key the audit reports: not modelled (known) or not in the table (unknown)."""

    key: str
    value: Any
    known: bool
    what: str = ""
    ignored: bool = False
    """Unknown, where the framework ignores what it does not know: a warning only."""
    bound: bool = False
    """Known, not modelled, and only lowers memory: a warning (the plan is an upper bound)."""

    @property
    def warning(self) -> bool:
        return self.ignored or self.bound

    def line(self, file: str, tab: Table) -> str:
        if self.bound:
            return (f"{file} {self.key}: {shown(self.value)}: {self.what}; not modelled, and it "
                    "only lowers memory")
        if self.known:
            return f"{self.what} ({file} {self.key}: {shown(self.value)}) is not modelled yet"
        if self.ignored:
            return (f"{file}: {self.key} is not a key of {tab.label}, which ignores it "
                    "(a misspelt key?)")
        return (f"{file} {self.key}: {shown(self.value)} is not a key of {tab.label} as "
                f"fitcheck knows it (planner/data/job_keys_{tab.name}.json): what it does to "
                "memory is unknown")


def walk(tab: Table, doc: Mapping[str, Any], prefix: str = "",
         skip: frozenset[str] = frozenset()) -> Iterator[Finding]:
    """What ``doc`` (the mapping at ``prefix`` of a document) sets that its table says is not
    modelled, and every key the table does not have. ``skip``: keys a reader consumed in a way
    the table cannot say (read them as fields)."""
    for k, v in doc.items():
        name = f"{prefix}{k}"
        if name in skip:
            continue
        key = tab.get(name)
        if key is None:
            if isinstance(k, str) and k.startswith("_") and k != "_component_":
                continue  # a comment key ("_comment"): no framework reads it
            if v is None:
                continue  # null sets nothing
            yield Finding(name, v, known=False,
                          ignored=any(prefix == p or (p and prefix.startswith(p + "."))
                                      for p in tab.ignores_unknown))
            continue
        if key.open:
            if key.kind is Kind.MEMORY and not at_default(key, v):
                yield Finding(name, v, known=True, what=key.what or name, bound=key.bound)
            continue
        if isinstance(v, Mapping) and (key.kind is Kind.SECTION or tab.has_children(name)):
            yield from walk(tab, v, f"{name}.", skip)
            continue
        if key.kind is Kind.SECTION:
            if not at_default(key, v):
                yield Finding(name, v, known=False)
            continue
        if key.kind is Kind.MEMORY and not at_default(key, v):
            yield Finding(name, v, known=True, what=key.what or name, bound=key.bound)


RECIPES = ("transformers", "trl", "llamafactory", "axolotl")
"""The HF-Trainer recipe formats, which share TrainingArguments' keys: told apart by the keys
only one of them has."""


@functools.cache
def _distinctive(name: str) -> frozenset[str]:
    others = frozenset().union(*(table(o).top_level() for o in RECIPES if o != name))
    return table(name).top_level() - others


def recipe_score(name: str, doc: Mapping[str, Any]) -> int:
    """How much ``doc`` (a mapping of top-level keys) looks like the recipe format ``name``:
    its own keys count three times, shared keys once, keys it does not know against it."""
    tab = table(name)
    top = tab.top_level()
    own = _distinctive(name)
    keys = [k for k in doc if isinstance(k, str)]
    return (3 * sum(1 for k in keys if k in own) + sum(1 for k in keys if k in top)
            - 2 * sum(1 for k in keys if k not in top))


def field_keys(tab: Table) -> list[Key]:
    return [k for k in tab.keys.values() if k.kind is Kind.FIELD]
