"""Reading a job file's text: at most 1 MiB; JSON and YAML through planner.specfile (bounded
nesting and size, no YAML aliases, no duplicate keys, no NaN), TOML through tomllib with the
same bounds. Every failure is one line naming the file (exit 4)."""

from __future__ import annotations

import os
import re
from typing import Any

from planner.jobs.record import JobError

MAX_BYTES = 1 << 20
MAX_DEPTH = 16
"""Nesting levels of a TOML document (planner.specfile's bound for JSON and YAML)."""


def read_text(path: str) -> str:
    """The text of ``path`` ('-': stdin), refusing more than MAX_BYTES and non-UTF-8."""
    if path == "-":
        from planner.specfile import read_stdin

        text = read_stdin(MAX_BYTES)
        if text is None:
            raise JobError("stdin: not UTF-8 text")
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_BYTES + 1)
        except UnicodeDecodeError:
            raise JobError(f"{path}: not UTF-8 text") from None
        except IsADirectoryError:
            raise JobError(f"{path}: is a directory, not a job file") from None
        except OSError as exc:
            raise JobError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(text) > MAX_BYTES:
        raise JobError(f"{path}: larger than {MAX_BYTES} bytes; not a job config")
    return text


def _depth(doc: Any, name: str) -> None:
    """tomllib recurses freely; refuse deep documents after parsing."""
    stack = [(doc, 1)]
    while stack:
        node, d = stack.pop()
        if d > MAX_DEPTH:
            raise JobError(f"{name}: nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            stack += [(v, d + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, d + 1) for v in node]


def parse_toml(text: str, name: str) -> dict[str, Any]:
    import tomllib

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise JobError(f"{name}: invalid TOML: {exc}") from None
    except ValueError as exc:  # a value tomllib cannot build: an integer past 4,300 digits
        raise JobError(f"{name}: invalid TOML: {str(exc).split(';')[0][:200]}") from None
    except RecursionError:
        raise JobError(f"{name}: TOML nested too deeply") from None
    _depth(doc, name)
    return doc


MAX_DOCUMENTS = 100
"""YAML documents in one job file (a Kubernetes manifest's objects): each is parsed on its own,
so a 1 MiB stream of 110,000 empty ones must be refused, not parsed."""
_DOC_SEPARATOR = re.compile(r"^(?:---|\.\.\.)(?:[ \t].*)?$", re.MULTILINE)


def parse_mapping(text: str, name: str) -> Any:
    """JSON or YAML through planner.specfile (bounded size, depth and node count, no YAML
    anchors or aliases, no duplicate keys, JSON's types only); a YAML stream of several
    documents (a Kubernetes manifest) -> the list of its mappings."""
    from planner.specfile import parse_spec_text

    parts = [p for p in _DOC_SEPARATOR.split(text) if p.strip() and not _comments_only(p)]
    if text.lstrip().startswith(("{", "[")) or not parts:
        return parse_spec_text(text, name)
    if len(parts) == 1:  # one document (the others only comments, after a '---')
        return parse_spec_text(parts[0], name)
    if len(parts) > MAX_DOCUMENTS:
        raise JobError(f"{name}: {len(parts)} YAML documents; a job file has at most "
                       f"{MAX_DOCUMENTS}")
    return [parse_spec_text(p, f"{name} (document {i + 1})") for i, p in enumerate(parts)]


def _comments_only(part: str) -> bool:
    return all(not line.strip() or line.lstrip().startswith("#") for line in part.splitlines())


_TOML_HEADER = re.compile(r"^\s*\[\[?[A-Za-z0-9_.\-\"' ]+\]\]?\s*(#.*)?$", re.MULTILINE)


def parse(text: str, name: str) -> tuple[str, Any]:
    """('json' | 'toml' | 'yaml', document) of a job file's text; ('python', None) for a
    torchtitan config registry (planner/jobs/pyconfig.py reads it)."""
    if len(text) > MAX_BYTES:  # text read by a caller (the gate) rather than read_text
        raise JobError(f"{name}: larger than {MAX_BYTES} bytes; not a job config")
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        raise JobError(f"{name}: empty file")
    if name.endswith(".py"):
        return "python", None
    first = stripped.splitlines()[0]
    if name.endswith(".toml") or (_TOML_HEADER.search(stripped) and not stripped.startswith("{")):
        try:
            return "toml", parse_toml(stripped, name)
        except JobError:
            if name.endswith(".toml") or _TOML_HEADER.match(first):
                raise
    kind = "json" if stripped[0] in "{[" else "yaml"
    if name.endswith(".json"):  # DeepSpeed, the HF Trainer and accelerate read it with json.load
        import json

        try:
            json.loads(stripped)
        except ValueError as exc:
            line = getattr(exc, "lineno", None)
            raise JobError(f"{name}: not valid JSON" + (f" (line {line}: {exc.msg})"
                           if line else f" ({exc})") + ": the framework's json.load refuses it"
                           ) from None
    return kind, parse_mapping(stripped, name)


def base_dir(path: str) -> str:
    return os.getcwd() if path == "-" else os.path.dirname(os.path.abspath(path))
