"""Scheduler gating: a job spec (JSON or YAML) in, an admit/reject verdict out (docs/gating.md).

The spec mirrors the plan flags; ``spec_kwargs`` turns it into the keyword dict that
planner.cli.build_question takes, so the gate answers exactly what ``fitcheck --json`` would.
No click here and nothing heavy: the Slurm wrapper and the Kubernetes webhook call ``gate``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from planner import __version__
from planner.errors import EXIT_FITS, EXIT_NOTHING_FITS, FitcheckError, InputDataError
from planner.spec import (
    Attention,
    Checkpointing,
    MlpKind,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    Precision,
    Strategy,
)

GATE_SCHEMA_VERSION = 1
ADMIT, REJECT = "admit", "reject"
GiB = 2**30


class SpecError(InputDataError):
    """The job spec is malformed: unknown keys, wrong types or values (exit 4)."""


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
# Spec -> build_question kwargs

MODEL_KEYS = ("params", "preset", "config", "layers", "hidden", "heads", "kv_heads", "ffn",
              "vocab", "tied_embeddings", "mlp", "experts", "experts_per_token")
TRAINING_KEYS = ("seq", "micro_batch", "grad_accum", "global_batch", "precision", "optimizer",
                 "optimizer_impl", "attention")
HARDWARE_KEYS = ("gpu", "n", "gpus_per_node", "host_ram_gib")
TOP_KEYS = ("model", "training", "hardware", "strategy", "offload", "checkpointing", "margin")
TRAINING_DEFAULTS = {"seq": 2048, "micro_batch": 1, "grad_accum": 1, "global_batch": None,
                     "precision": "bf16-amp", "optimizer": "adamw", "optimizer_impl": "foreach",
                     "attention": "sdpa"}
ENUMS: dict[str, tuple[str, ...]] = {
    "model.mlp": tuple(str(e) for e in MlpKind),
    "training.precision": tuple(str(e) for e in Precision),
    "training.optimizer": tuple(str(e) for e in OptimizerKind),
    "training.optimizer_impl": tuple(str(e) for e in OptimizerImpl),
    "training.attention": tuple(str(e) for e in Attention),
    "strategy": tuple(str(e) for e in Strategy),
    "offload": ("auto",) + tuple(str(e) for e in Offload),
    "checkpointing": tuple(str(e) for e in Checkpointing),
}
# build_question's flag names in its error messages -> spec fields
FLAG_FIELD = {
    "--params": "model.params", "--model": "model.preset", "--config": "model.config",
    "--layers": "model.layers", "--hidden": "model.hidden", "--heads": "model.heads",
    "--kv-heads": "model.kv_heads", "--ffn": "model.ffn", "--vocab": "model.vocab",
    "--mlp": "model.mlp", "--experts": "model.experts",
    "--experts-per-token": "model.experts_per_token", "--gpu": "hardware.gpu",
    "--n": "hardware.n", "--gpus-per-node": "hardware.gpus_per_node",
    "--host-ram-gib": "hardware.host_ram_gib", "--margin": "margin", "--strategy": "strategy",
    "--seq": "training.seq", "--micro-batch": "training.micro_batch",
    "--grad-accum": "training.grad_accum", "--global-batch": "training.global_batch",
}


def _type(v: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown(where: str, given: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    bad = [k for k in given if k not in allowed]
    if not bad:
        return
    hints = []
    for k in bad:
        if not isinstance(k, str):
            continue
        alt = k.replace("-", "_").lower()
        if alt in allowed:
            hints.append(f"{k!r} -> {alt!r}")
        else:
            import difflib

            close = difflib.get_close_matches(k, allowed, n=1)
            if close:
                hints.append(f"{k!r} -> {close[0]!r}?")
    prefix = f"{where}: unknown key" if where else "spec: unknown key"
    msg = f"{prefix}{'s' if len(bad) > 1 else ''} {', '.join(repr(k) for k in bad)}; allowed: " \
          f"{', '.join(allowed)}"
    if hints:
        msg += f" (did you mean {', '.join(hints)})"
    raise SpecError(msg)


def _section(spec: Mapping[str, Any], key: str, allowed: tuple[str, ...],
             required: bool) -> dict[str, Any]:
    value = spec.get(key)
    if value is None:
        if required:
            raise SpecError(f"{key}: required (a mapping with {', '.join(allowed)})")
        return {}
    if not isinstance(value, dict):
        raise SpecError(f"{key}: must be a mapping, got {_type(value)} {_show(value)}")
    _unknown(key, value, allowed)
    return value


def _pos_int(field: str, v: Any) -> int | None:
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer() and not isinstance(v, bool):
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
        raise SpecError(f"{field}: must be a positive integer, got {_show(v)}")
    return v


def _number(field: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise SpecError(f"{field}: must be a finite number, got {_show(v)}")
    return float(v)


def _string(field: str, v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, str) or not v.strip():
        raise SpecError(f"{field}: must be a non-empty string, got {_show(v)}")
    return v.strip()


def _enum(field: str, v: Any) -> str | None:
    s = _string(field, v)
    if s is None:
        return None
    s = s.lower()
    if s not in ENUMS[field]:
        raise SpecError(f"{field}: unknown value {v!r}; choose from {', '.join(ENUMS[field])}")
    return s


def _path(field: str, value: str, base_dir: str | None, allow_files: bool) -> str:
    if not allow_files:
        raise SpecError(f"{field}: file paths are not accepted here, got {_show(value)}")
    if base_dir is not None and not os.path.isabs(value):
        value = os.path.join(base_dir, value)
    return value


def _looks_like_path(s: str) -> bool:
    return "/" in s or "\\" in s or s.endswith(".toml") or s.startswith(".")


def spec_kwargs(spec: Mapping[str, Any], *, base_dir: str | None = None,
                allow_files: bool = True) -> dict[str, Any]:
    """A spec mapping -> the keyword dict planner.cli.build_question takes (SpecError if bad).

    Relative paths (model.config, a TOML hardware.gpu) resolve against base_dir; with
    allow_files=False (the webhook) paths are refused, so a request cannot read server files.
    """
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec: must be a mapping, got {_type(spec)}")
    _unknown("", spec, TOP_KEYS)
    model = _section(spec, "model", MODEL_KEYS, required=True)
    training = _section(spec, "training", TRAINING_KEYS, required=False)
    hardware = _section(spec, "hardware", HARDWARE_KEYS, required=True)
    kw: dict[str, Any] = {}

    params = model.get("params")
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, (int, float, str)):
            raise SpecError(f"model.params: must be a number like 8e9 or a string like '8B', "
                            f"got {_show(params)}")
        if isinstance(params, float) and not math.isfinite(params):
            raise SpecError(f"model.params: must be a positive finite number, got {params}")
        params = str(params)
    kw["params"] = params
    kw["preset"] = _string("model.preset", model.get("preset"))
    config = _string("model.config", model.get("config"))
    kw["config"] = None if config is None else _path("model.config", config, base_dir, allow_files)
    for key in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts",
                "experts_per_token"):
        kw[key] = _pos_int(f"model.{key}", model.get(key))
    tied = model.get("tied_embeddings")
    if tied is not None and not isinstance(tied, bool):
        raise SpecError(f"model.tied_embeddings: must be true or false, got {_show(tied)}")
    kw["tied_embeddings"] = tied
    kw["mlp"] = _enum("model.mlp", model.get("mlp"))

    t = {**TRAINING_DEFAULTS, **{k: v for k, v in training.items() if v is not None}}
    for key in ("seq", "micro_batch", "grad_accum", "global_batch"):
        kw[key] = _pos_int(f"training.{key}", t[key])
    for key in ("precision", "optimizer", "optimizer_impl", "attention"):
        kw[key] = _enum(f"training.{key}", t[key])

    gpu = _string("hardware.gpu", hardware.get("gpu"))
    if gpu is None:
        raise SpecError("hardware.gpu: required (a profile id such as h100-80; see "
                        "fitcheck --list-gpus)")
    if _looks_like_path(gpu):
        gpu = _path("hardware.gpu", gpu, base_dir, allow_files)
    kw["gpu"] = gpu
    n = _pos_int("hardware.n", hardware.get("n"))
    if n is None:
        raise SpecError("hardware.n: required (the total number of GPUs of the job)")
    kw["n_gpus"] = n
    kw["gpus_per_node"] = _pos_int("hardware.gpus_per_node", hardware.get("gpus_per_node"))
    ram = _number("hardware.host_ram_gib", hardware.get("host_ram_gib"))
    if ram is not None and ram <= 0:
        raise SpecError(f"hardware.host_ram_gib: must be positive, got {ram:g}")
    kw["host_ram_gib"] = ram

    strategy = _enum("strategy", spec.get("strategy"))
    kw["strategies"] = (strategy,) if strategy else ()
    kw["offload"] = _enum("offload", spec.get("offload")) or "auto"
    kw["checkpointing"] = _enum("checkpointing", spec.get("checkpointing")) or "auto"
    margin = _number("margin", spec.get("margin"))
    margin = 0.05 if margin is None else margin
    if not 0 <= margin < 1:
        raise SpecError(f"margin: must be a fraction in [0, 1), got {margin:g}")
    kw["margin"] = margin
    return kw


def _flag_to_field(message: str) -> str:
    return re.sub(r"--[a-z][a-z-]*", lambda m: FLAG_FIELD.get(m.group(0), m.group(0)), message)


def question_from_spec(spec: Mapping[str, Any], *, base_dir: str | None = None,
                       allow_files: bool = True):
    """(Question, model_source): the planner's own question for the spec."""
    from planner.cli import build_question

    kw = spec_kwargs(spec, base_dir=base_dir, allow_files=allow_files)
    try:
        return build_question(kw)
    except SpecError:
        raise
    except FitcheckError as exc:  # a usage error names a flag: name the spec field instead
        raise SpecError(_flag_to_field(str(exc))) from None


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
    return max(0, e.device_used_bytes - e.usable_bytes) + max(0, e.host_bytes_per_node
                                                               - e.host_capacity_bytes)


def _closest(answer):
    """The estimate (and its step) that misses by the least."""
    pairs = list(zip(answer.estimates, answer.steps))
    if not pairs:
        return None, None
    return min(pairs, key=lambda p: (_overflow(p[0]), p[0].device_used_bytes))


def _chosen(answer):
    rec = answer.recommendation
    for e, st in zip(answer.estimates, answer.steps):
        if rec is not None and e.candidate == rec.candidate:
            return e, st
    return None, None


def _why(e) -> str:
    if not e.fits_gpu:
        return (f"needs {_gib(e.device_used_bytes)} per GPU, "
                f"{_gib(e.device_used_bytes - e.usable_bytes)} over the usable "
                f"{_gib(e.usable_bytes)}")
    return (f"needs {_gib(e.host_bytes_per_node)} of host RAM per node, more than the "
            f"{_gib(e.host_capacity_bytes)} there")


def _fits_text(e) -> str:
    return (f"{_gib(e.device_used_bytes)} of {_gib(e.usable_bytes)} usable per GPU, "
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


def _hw(q) -> str:
    return f"{q.cluster.n_gpus} x {q.cluster.gpu.id}"


def gate(spec: Mapping[str, Any], *, base_dir: str | None = None,
         allow_files: bool = True) -> dict[str, Any]:
    """The verdict for a spec (SpecError for a bad one). See docs/gating.md."""
    from planner.plan import DEFAULT_STRATEGIES, label, plan

    question, _source = question_from_spec(spec, base_dir=base_dir, allow_files=allow_files)
    pinned = len(question.strategies) == 1 and spec.get("strategy") is not None
    warnings: list[str] = []
    if question.model.shape_assumed:
        warnings.append("model shape assumed from model.params; give model.preset or a shape "
                        "for an exact estimate")
    if not pinned:
        answer = plan(question)
        e, st = _chosen(answer)
        if e is not None:
            rec = _cand(e)
            return verdict_doc(ADMIT, f"{label(e.candidate)} fits on {_hw(question)}: "
                               f"{_fits_text(e)}.", recommendation=rec,
                               predicted=_predicted(e, st), warnings=warnings)
        e, st = _closest(answer)
        need = answer.min_gpus
        tail = (f"; at least {need} GPUs of this type are needed" if need is not None
                else "; no GPU count of this type up to the search limit fits")
        if e is None:
            return verdict_doc(REJECT, f"no requested candidate exists on {_hw(question)}"
                               f" ({'; '.join(answer.skipped) or 'nothing to evaluate'}).",
                               min_gpus=need, warnings=warnings)
        return verdict_doc(REJECT, f"nothing fits on {_hw(question)}: the closest, "
                           f"{label(e.candidate)}, {_why(e)}{tail}.",
                           predicted=_predicted(e, st), min_gpus=need, warnings=warnings)

    strategy = question.strategies[0]
    pinned_q = question
    if question.cluster.n_gpus == 1 and strategy.is_fsdp \
            and question.offloads in (None, (Offload.NONE,)):
        # one GPU: FSDP shards nothing; the planner models it as plain training (DDP's row)
        pinned_q = dataclasses.replace(question, strategies=(strategy, Strategy.DDP))
        warnings.append(f"on one GPU {strategy} shards nothing: estimated as plain training")
    answer = plan(pinned_q)
    e, st = _chosen(answer)
    if e is not None:
        shown = dataclasses.replace(e.candidate, strategy=strategy)
        rec = {**_cand(e), "strategy": str(strategy)}
        return verdict_doc(ADMIT, f"pinned {label(shown)} fits on {_hw(question)}: "
                           f"{_fits_text(e)}.", recommendation=rec,
                           predicted={**_predicted(e, st), "strategy": str(strategy)},
                           pinned=True, warnings=warnings)
    # rejected: what it would take, and what fits instead
    e, st = _closest(answer)
    alt = plan(dataclasses.replace(question, strategies=DEFAULT_STRATEGIES))
    if alt.recommendation is None and (question.offloads is not None
                                       or question.checkpointing is not Checkpointing.AUTO):
        alt = plan(dataclasses.replace(question, strategies=DEFAULT_STRATEGIES, offloads=None,
                                       checkpointing=Checkpointing.AUTO))
    ae, _ = _chosen(alt)
    instead = (f"; {label(ae.candidate)} fits instead, {_fits_text(ae)}" if ae is not None
               else "; nothing else fits either")
    need = answer.min_gpus
    instead += (f"; {strategy} fits on {need} GPUs of this type" if need is not None
                else f"; {strategy} fits on no number of GPUs of this type")
    if e is None:
        what = (f"pinned {strategy} is not possible with these settings "
                f"({'; '.join(answer.skipped) or 'no candidate'})")
    else:
        what = f"pinned {label(e.candidate)} does not fit on {_hw(question)}: {_why(e)}"
    return verdict_doc(REJECT, f"{what}{instead}.",
                       recommendation=_cand(ae) if ae is not None else None,
                       predicted=None if e is None else _predicted(e, st), pinned=True,
                       min_gpus=need, warnings=warnings)
