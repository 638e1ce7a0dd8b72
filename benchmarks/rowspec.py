"""A benchmark row's inputs as fitcheck spec fields, parsed the way the gate parses a spec.

Both public-run benchmarks (memory_accuracy.py, throughput_accuracy.py) state the common inputs
in columns and anything else in the ``extra`` column: one JSON object of spec fields by spec
path, for example

    {"training.grad_sync": "last", "training.loss": "chunked:8", "training.compile": "blocks"}

Every key must be a field of ``planner.fields.FIELDS`` (so a new field, ``deepspeed.*`` or
``finetune.*`` included, can be stated per row without a new column), and is parsed by
``planner.request.build_request`` with the gate's naming (``fields.SPEC``): a bad value fails the
benchmark with the row id and the field, never silently. A key may not repeat a column.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from planner import fields
from planner.errors import FitcheckError
from planner.request import Request, build_request


class RowError(SystemExit):
    """A benchmark row that does not parse (the message names the row and the field)."""


def extra_fields(row: Mapping[str, str]) -> dict[str, Any]:
    """The row's ``extra`` JSON object -> {spec path: raw value} ({} when empty)."""
    text = (row.get("extra") or "").strip()
    if not text:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RowError(f"{row['id']}: extra: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise RowError(f"{row['id']}: extra: must be a JSON object of spec fields")
    unknown = [k for k in obj if k not in fields.BY_PATH]
    if unknown:
        raise RowError(f"{row['id']}: extra: unknown spec field(s) {', '.join(map(repr, unknown))}"
                       " (a key is a spec path of planner/fields.py, e.g. 'training.grad_sync')")
    return obj


def request_for(row: Mapping[str, str], columns: Mapping[str, Any]) -> Request:
    """The typed request of one row: its columns (already as {spec path: raw}) plus ``extra``,
    parsed together by build_request. Calibration is off: the raw model is scored."""
    extra = extra_fields(row)
    both = sorted(set(extra) & set(columns))
    if both:
        raise RowError(f"{row['id']}: extra repeats a column: {', '.join(both)}")
    values = {"calibration": "none", **columns, **extra}
    try:
        return build_request(values, fields.SPEC, allow_files=False)
    except FitcheckError as exc:
        raise RowError(f"{row['id']}: {exc}") from None


def update_bands(path: str, section: str, content: dict[str, Any]) -> None:
    """Replace one section ('memory' or 'throughput') of error_bands.json, keeping the other,
    atomically (write a temporary file beside it, then rename)."""
    import os

    from planner.error_bands import SCHEMA_VERSION

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        data = {}
    data = {"schema_version": SCHEMA_VERSION,
            "generated_by": "benchmarks/memory_accuracy.py (memory), "
                            "benchmarks/throughput_accuracy.py (throughput); do not edit by hand",
            **{k: v for k, v in data.items() if k not in ("schema_version", "generated_by")},
            section: content}
    data = {k: data[k] for k in ("schema_version", "generated_by", "memory", "throughput")
            if k in data}
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
