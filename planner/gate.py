"""Scheduler gating: a job spec (JSON or YAML) in, an admit/reject verdict out (docs/gating.md).

A spec has the plan's fields in sections (planner/fields.py: ``model``, ``training``,
``hardware`` and the top-level options); ``request_from_spec`` builds the planner's own request
from it, so the gate answers exactly what ``fitcheck --json`` would. No click here and nothing
heavy: the Slurm wrapper and the Kubernetes webhook call ``gate``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from planner import __version__
from planner.errors import EXIT_FITS, EXIT_NOTHING_FITS
from planner.fields import SpecError
from planner.spec import Checkpointing, Offload, Strategy

__all__ = ["ADMIT", "REJECT", "SpecError", "error_verdict", "exit_code", "gate",
           "parse_spec_text", "read_spec", "request_from_spec"]

GATE_SCHEMA_VERSION = 1
ADMIT, REJECT = "admit", "reject"
GiB = 2**30


def _type(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


# ---------------------------------------------------------------------------------------------
# Reading a spec


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise SpecError(f"spec: duplicate key {k!r}")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise SpecError(f"spec: {name} is not a valid number")


def parse_spec_text(text: str, name: str = "spec") -> dict[str, Any]:
    """JSON always; YAML when PyYAML is importable. A mapping, or SpecError."""
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        raise SpecError(f"{name}: empty spec")
    if stripped[0] in "{[":
        import json

        try:
            doc = json.loads(stripped, object_pairs_hook=_no_duplicates,
                             parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{name}: invalid JSON: {exc}") from None
        except RecursionError:
            raise SpecError(f"{name}: JSON nested too deeply") from None
    else:
        try:
            import yaml
        except ImportError:
            raise SpecError("YAML spec needs PyYAML (pip install pyyaml) or use JSON") from None
        try:
            doc = yaml.safe_load(stripped)
        except yaml.YAMLError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecError(f"{name}: invalid YAML: {first}") from None
        except RecursionError:
            raise SpecError(f"{name}: YAML nested too deeply") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{name}: must be a mapping (a JSON object), got {_type(doc)}")
    return doc


MAX_SPEC_BYTES = 1 << 20


def read_spec(path: str) -> tuple[dict[str, Any], str | None]:
    """The spec at path ('-' = stdin) and the folder relative paths inside it resolve against."""
    import sys

    if path == "-":
        text = sys.stdin.read(MAX_SPEC_BYTES + 1)
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


# ---------------------------------------------------------------------------------------------
# Spec -> request


def request_from_spec(spec: Mapping[str, Any], *, base_dir: str | None = None,
                      allow_files: bool = True):
    """The planner's Request for a spec (SpecError if it is bad).

    Relative paths (model.config, a TOML hardware.gpu) resolve against base_dir; with
    allow_files=False (the webhook) paths are refused, so a request cannot read server files.
    """
    from planner.fields import SPEC, spec_values
    from planner.request import build_request

    values = spec_values(spec)
    if values.get("hardware.n") is None:
        raise SpecError("hardware.n: required (the total number of GPUs of the job)")
    return build_request(values, SPEC, allow_files=allow_files, base_dir=base_dir)


# ---------------------------------------------------------------------------------------------
# The verdict


def _gib(x: int) -> str:
    return f"{x / GiB:.1f} GiB"


def _cand(e) -> dict[str, str]:
    c = e.candidate
    return {"strategy": str(c.strategy), "offload": str(c.offload),
            "checkpointing": str(c.checkpointing)}


def _predicted(e, step=None) -> dict[str, Any]:
    out = {
        **_cand(e),
        "fits": e.fits,
        "peak_allocated_bytes": e.peak_allocated_bytes,
        "peak_reserved_bytes": e.peak_reserved_bytes,
        "required_bytes": e.required_bytes,
        "device_used_bytes": e.device_used_bytes,
        "capacity_bytes": e.capacity_bytes,
        "usable_bytes": e.usable_bytes,
        "headroom_bytes": e.headroom_bytes,
        "host_bytes_per_node": e.host_bytes_per_node,
        "host_capacity_bytes": e.host_capacity_bytes,
    }
    if step is not None:
        out["step_time_s"] = step.step_time_s
    return out


def _overflow(e) -> int:
    return max(0, e.required_bytes - e.usable_bytes) + max(0, e.host_bytes_per_node
                                                               - e.host_capacity_bytes)


def _closest(answer):
    """The estimate (and its step) that misses by the least."""
    pairs = list(zip(answer.estimates, answer.steps))
    if not pairs:
        return None, None
    return min(pairs, key=lambda p: (_overflow(p[0]), p[0].required_bytes))


def _why(e) -> str:
    if not e.fits_gpu:
        return (f"needs {_gib(e.required_bytes)} per GPU, "
                f"{_gib(e.required_bytes - e.usable_bytes)} over the usable "
                f"{_gib(e.usable_bytes)}")
    return (f"needs {_gib(e.host_bytes_per_node)} of host RAM per node, more than the "
            f"{_gib(e.host_capacity_bytes)} there")


def _fits_text(e) -> str:
    return (f"needs {_gib(e.required_bytes)} of {_gib(e.usable_bytes)} usable per GPU, "
            f"{_gib(e.headroom_bytes)} headroom")


def verdict_doc(verdict: str, reason: str, *, recommendation=None, predicted=None,
                pinned: bool = False, min_gpus: int | None = None,
                warnings: list[str] | None = None, error: str | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema_version": GATE_SCHEMA_VERSION,
        "verdict": verdict,
        "reason": reason,
        "recommendation": recommendation,
        "predicted": predicted,
        "pinned": pinned,
        "min_gpus": min_gpus,
        "warnings": list(warnings or []),
        "fitcheck_version": __version__,
    }
    if error is not None:
        doc["error"] = error
    return doc


def error_verdict(error: str, on_error: str) -> dict[str, Any]:
    """The verdict for an internal error or timeout: admit or reject per --on-error."""
    verdict = ADMIT if on_error == ADMIT else REJECT
    return verdict_doc(verdict, f"fitcheck could not evaluate the job ({error}); "
                       f"{'admitted' if verdict == ADMIT else 'rejected'} per --on-error "
                       f"{on_error}.", error=error)


def exit_code(doc: Mapping[str, Any]) -> int:
    return EXIT_FITS if doc.get("verdict") == ADMIT else EXIT_NOTHING_FITS


def _hw(r) -> str:
    return f"{r.cluster.n_gpus} x {r.cluster.gpu.id}"


def gate(spec: Mapping[str, Any], *, base_dir: str | None = None,
         allow_files: bool = True) -> dict[str, Any]:
    """The verdict for a spec (SpecError for a bad one). See docs/gating.md."""
    from planner.candidates import label
    from planner.plan import plan

    request = request_from_spec(spec, base_dir=base_dir, allow_files=allow_files)
    pinned = len(request.options.strategies) == 1 and spec.get("strategy") is not None
    warnings = list(request.warnings)
    if not pinned:
        answer = plan(request)
        e, st = answer.chosen()
        if e is not None:
            return verdict_doc(ADMIT, f"{label(e.candidate)} fits on {_hw(request)}: "
                               f"{_fits_text(e)}.", recommendation=_cand(e),
                               predicted=_predicted(e, st), warnings=warnings)
        e, st = _closest(answer)
        need = answer.min_gpus
        tail = (f"; at least {need} GPUs of this type are needed" if need is not None
                else "; no GPU count of this type up to the search limit fits")
        if e is None:
            return verdict_doc(REJECT, f"no requested candidate exists on {_hw(request)}"
                               f" ({'; '.join(answer.skipped) or 'nothing to evaluate'}).",
                               min_gpus=need, warnings=warnings)
        return verdict_doc(REJECT, f"nothing fits on {_hw(request)}: the closest, "
                           f"{label(e.candidate)}, {_why(e)}{tail}.",
                           predicted=_predicted(e, st), min_gpus=need, warnings=warnings)

    strategy = request.options.strategies[0]
    pinned_r = request
    if request.cluster.n_gpus == 1 and strategy.is_fsdp \
            and request.options.offloads in (None, (Offload.NONE,)):
        # one GPU: FSDP shards nothing; the planner models it as plain training (DDP's row)
        pinned_r = request.with_options(strategies=(strategy, Strategy.DDP))
        warnings.append(f"on one GPU {strategy} shards nothing: estimated as plain training")
    answer = plan(pinned_r)
    e, st = answer.chosen()
    if e is not None:
        shown = dataclasses.replace(e.candidate, strategy=strategy)
        rec = {**_cand(e), "strategy": str(strategy)}
        return verdict_doc(ADMIT, f"pinned {label(shown)} fits on {_hw(request)}: "
                           f"{_fits_text(e)}.", recommendation=rec,
                           predicted={**_predicted(e, st), "strategy": str(strategy)},
                           pinned=True, warnings=warnings)
    # rejected: what it would take, and what fits instead
    e, st = _closest(answer)
    alt = plan(request.with_options(strategies=tuple(Strategy)))
    if alt.recommendation is None and (request.options.offloads is not None
                                       or request.options.checkpointing
                                       is not Checkpointing.AUTO):
        alt = plan(request.with_options(strategies=tuple(Strategy), offloads=None,
                                        checkpointing=Checkpointing.AUTO))
    ae, _ = alt.chosen()
    instead = (f"; {label(ae.candidate)} fits instead, {_fits_text(ae)}" if ae is not None
               else "; nothing else fits either")
    need = answer.min_gpus
    instead += (f"; {strategy} fits on {need} GPUs of this type" if need is not None
                else f"; {strategy} fits on no number of GPUs of this type")
    if e is None:
        what = (f"pinned {strategy} is not possible with these settings "
                f"({'; '.join(answer.skipped) or 'no candidate'})")
    else:
        what = f"pinned {label(e.candidate)} does not fit on {_hw(request)}: {_why(e)}"
    return verdict_doc(REJECT, f"{what}{instead}.",
                       recommendation=_cand(ae) if ae is not None else None,
                       predicted=None if e is None else _predicted(e, st), pinned=True,
                       min_gpus=need, warnings=warnings)
