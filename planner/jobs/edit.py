"""Change a few values of a YAML, JSON or TOML file in its text, keeping every other line,
comment and number spelling. Each edit is checked by parsing the result: the document must
equal the original with exactly the intended change, or the edit is refused (JobError)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Sequence
from typing import Any

from planner.jobs.record import JobError

Keys = Sequence[str]


def _set_in(doc: Any, keys: Keys, value: Any) -> None:
    node = doc
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def _comment_start(text: str) -> int:
    """Index of an unquoted '#' that starts a comment (after whitespace), or len(text)."""
    quote = None
    for i, c in enumerate(text):
        if quote:
            if c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t"):
            return i
    return len(text)


# ---------------------------------------------------------------------------------------------
# YAML (block mappings)

_YAML_KEY = re.compile(r"^(?P<indent> *)(?P<key>[^\s#'\"\-][^:#]*?|\"[^\"]*\"|'[^']*') *:"
                       r"(?P<rest>(?:[ \t].*)?)$")
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "none", "~", "y", "n"}


def yaml_scalar(value: Any, like: str = "") -> str:
    """A YAML scalar for value; strings keep the quote style of ``like`` (the old value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, (list, tuple)):  # a flow sequence: [full_shard, auto_wrap]
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]"
    text = str(value)
    old = like.strip()
    if old[:1] == "'":
        return "'" + text.replace("'", "''") + "'"
    if old[:1] == '"' or not _PLAIN.fullmatch(text) or text.lower() in _YAML_WORDS:
        return json.dumps(text)
    return text


def _yaml_keys(lines: list[str]) -> list[tuple[int, int, tuple[str, ...]]]:
    """(line index, indent, key path) of every block-mapping key outside lists."""
    out = []
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("#") or s in ("---", "..."):
            continue
        indent = len(line) - len(line.lstrip(" "))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if s.startswith("- ") or s == "-":
            continue
        m = _YAML_KEY.match(line)
        if not m:
            continue
        key = m.group("key").strip().strip("'\"")
        path = tuple(k for _, k in stack) + (key,)
        out.append((i, indent, path))
        stack.append((indent, key))
    return out


def _block_end(lines: list[str], i: int, indent: int) -> int:
    """One past the last line of the value that starts at line i (children more indented,
    or '- ' items at the key's own indent)."""
    last = i
    for j in range(i + 1, len(lines)):
        s = lines[j].strip()
        if not s or s.startswith("#"):
            continue
        ind = len(lines[j]) - len(lines[j].lstrip(" "))
        if ind > indent or (ind == indent and (s.startswith("- ") or s == "-")):
            last = j
        else:
            break
    return last + 1


def yaml_set(text: str, keys: Keys, value: Any, *, name: str = "file") -> str:
    """``text`` with keys[0].keys[1]... set to ``value`` (a scalar or a list of scalars),
    added if missing; a block value under the key is replaced."""
    from planner.specfile import parse_spec_text

    before = parse_spec_text(text, name)
    lines = text.split("\n")
    found = {p: (i, ind) for i, ind, p in _yaml_keys(lines)}
    keys = tuple(keys)
    if keys in found:
        i, ind = found[keys]
        m = _YAML_KEY.match(lines[i])
        rest = m.group("rest")
        cut = _comment_start(rest)
        comment = rest[cut:]
        old = rest[:cut]
        end = _block_end(lines, i, ind)
        head = lines[i][:m.start("rest")]
        lines[i] = f"{head} {yaml_scalar(value, old)}" + (f"  {comment.strip()}" if comment
                                                         else "")
        del lines[i + 1:end]
    else:
        depth = len(keys) - 1
        while depth > 0 and keys[:depth] not in found:
            depth -= 1
        if depth == 0:
            at, child = len(lines), 0
            while at > 0 and not lines[at - 1].strip():
                at -= 1
        else:
            p, pind = found[keys[:depth]]
            at = _block_end(lines, p, pind)
            kids = [ind for _, ind, path in _yaml_keys(lines) if path[:-1] == keys[:depth]]
            child = kids[0] if kids else pind + 2
            while at > p + 1 and not lines[at - 1].strip():
                at -= 1
        new = []
        for d, k in enumerate(keys[depth:]):
            pad = " " * (child + 2 * d)
            last = d == len(keys) - depth - 1
            new.append(f"{pad}{k}: {yaml_scalar(value)}" if last else f"{pad}{k}:")
        lines[at:at] = new
    out = "\n".join(lines)
    expected = copy.deepcopy(before)
    _set_in(expected, keys, value)
    _verify(parse_spec_text(out, name), expected, name, keys)
    return out


def _verify(after: Any, expected: Any, name: str, keys: Keys) -> None:
    if after != expected:
        raise JobError(f"{name}: cannot change {'.'.join(keys)} in place (an unusual layout: "
                       "flow style or lists); edit it by hand")


# ---------------------------------------------------------------------------------------------
# JSON


def _json_spans(text: str) -> tuple[dict[tuple, tuple[int, int]], dict[tuple, tuple[int, int]]]:
    """(value spans by key path, object spans by key path) of a JSON text."""
    from json.decoder import scanstring

    spans: dict[tuple, tuple[int, int]] = {}
    objects: dict[tuple, tuple[int, int]] = {}
    literal = re.compile(r"-?(?:\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")

    def ws(i: int) -> int:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        return i

    def value(i: int, path: tuple) -> int:
        c = text[i]
        if c == "{":
            start = i
            i = ws(i + 1)
            while text[i] != "}":
                key, i = scanstring(text, i + 1)
                i = ws(i)
                i = ws(i + 1)  # ':'
                v0 = i
                i = value(i, path + (key,))
                spans[path + (key,)] = (v0, i)
                i = ws(i)
                if text[i] == ",":
                    i = ws(i + 1)
            objects[path] = (start, i)
            return i + 1
        if c == "[":
            i = ws(i + 1)
            n = 0
            while text[i] != "]":
                i = ws(value(i, path + (n,)))
                n += 1
                if text[i] == ",":
                    i = ws(i + 1)
            return i + 1
        if c == '"':
            return scanstring(text, i + 1)[1]
        m = literal.match(text, i)
        return m.end()

    value(ws(0), ())
    return spans, objects


def json_set(text: str, keys: Keys, value: Any, *, name: str = "file") -> str:
    """``text`` with keys set to ``value`` (any JSON value), the member added if missing."""
    from planner.specfile import parse_spec_text

    before = parse_spec_text(text, name)
    keys = tuple(keys)
    spans, objects = _json_spans(text)
    rendered = json.dumps(value) if not isinstance(value, dict) else \
        "{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in value.items()) + "}"
    if keys in spans:
        a, b = spans[keys]
        out = text[:a] + rendered + text[b:]
    else:
        depth = len(keys) - 1
        while depth > 0 and keys[:depth] not in objects:
            depth -= 1
        member: Any = value
        for k in reversed(keys[depth + 1:]):
            member = {k: member}
        if isinstance(member, dict) and member is not value:
            rendered = json.dumps(member)
        key = keys[depth]
        start, close = objects[keys[:depth]]
        kids = [p for p in spans if len(p) == depth + 1 and p[:depth] == keys[:depth]]
        if kids:
            last_end = max(spans[p][1] for p in kids)
            first_start = min(spans[p][0] for p in kids)
            line_start = text.rfind("\n", 0, first_start) + 1
            indent = re.match(r"[ \t]*", text[line_start:]).group(0)
            sep = f",\n{indent}" if "\n" in text[start:first_start] else ", "
            out = text[:last_end] + f"{sep}{json.dumps(key)}: {rendered}" + text[last_end:]
        else:
            out = text[:start + 1] + f"{json.dumps(key)}: {rendered}" + text[close:]
    expected = copy.deepcopy(before)
    _set_in(expected, keys, value)
    _verify(parse_spec_text(out, name), expected, name, keys)
    return out


# ---------------------------------------------------------------------------------------------
# TOML

_TOML_SECTION = re.compile(r"^\s*\[(?P<name>[^\[\]]+)\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"^(?P<head>\s*(?P<key>[A-Za-z0-9_\-]+)\s*=\s*)(?P<rest>.*)$")


def toml_value(value: Any, like: str = "") -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    quote = "'" if like.strip()[:1] == "'" else '"'
    return f"{quote}{value}{quote}"


def toml_set(text: str, section: str, key: str, value: Any, *, name: str = "file") -> str:
    """``text`` with [section] key = value, the key or section added if missing."""
    from planner.jobs.text import parse_toml

    before = parse_toml(text, name)
    lines = text.split("\n")
    start = end = None
    for i, line in enumerate(lines):
        m = _TOML_SECTION.match(line)
        if m and start is None and m.group("name").strip() == section:
            start = i
        elif m and start is not None and end is None:
            end = i
    if start is None:
        while lines and not lines[-1].strip():
            lines.pop()
        lines += ["", f"[{section}]", f"{key} = {toml_value(value)}", ""]
    else:
        end = len(lines) if end is None else end
        last = start
        for i in range(start + 1, end):
            m = _TOML_KEY.match(lines[i])
            if m and m.group("key") == key:
                rest = m.group("rest")
                cut = _comment_start(rest)
                old, comment = rest[:cut], rest[cut:]
                lines[i] = m.group("head") + toml_value(value, old) + (
                    f"  {comment.strip()}" if comment else "")
                break
            if lines[i].strip() and not lines[i].strip().startswith("#"):
                last = i
        else:
            lines.insert(last + 1, f"{key} = {toml_value(value)}")
    out = "\n".join(lines)
    expected = copy.deepcopy(before)
    _set_in(expected, section.split(".") + [key], value)
    _verify(parse_toml(out, name), expected, name, (section, key))
    return out
