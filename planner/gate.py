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

__all__ = ["ADMIT", "REJECT", "SpecError", "error_verdict", "exit_code", "gate", "gate_job",
           "gate_path", "parse_spec_text", "read_spec", "request_from_spec",
           "verdict_for"]

GATE_SCHEMA_VERSION = 1
ADMIT, REJECT = "admit", "reject"
GiB = 2**30


# ---------------------------------------------------------------------------------------------
# Reading a spec


from planner.specfile import MAX_SPEC_BYTES, parse_spec_text, read_spec, read_stdin


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


def _cand(e) -> dict[str, Any]:
    c = e.candidate
    return {"strategy": str(c.strategy), "offload": str(c.offload),
            "checkpointing": str(c.checkpointing), "tp": c.tp}


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
    from planner.render import risk_json

    out["risk"] = risk_json(e)
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
    from planner.plan import interval

    if not e.fits_host:
        return (f"needs {_gib(e.host_bytes_per_node)} of host RAM per node, more than the "
                f"{_gib(e.host_capacity_bytes)} there")
    over = e.required_bytes - e.usable_bytes
    return (f"needs {_gib(e.required_bytes)}{interval(e)} per GPU, "
            + (f"{_gib(over)} over the usable {_gib(e.usable_bytes)}" if over > 0 else
               f"more than the usable {_gib(e.usable_bytes)} even at the interval's low end"))


def _fits_text(e) -> str:
    from planner.plan import interval

    return (f"needs {_gib(e.required_bytes)}{interval(e)} of {_gib(e.usable_bytes)} usable "
            f"per GPU, {_gib(e.headroom_bytes)} headroom")


def _risk_text(e) -> str:
    from planner.plan import interval

    return (f"needs {_gib(e.required_bytes)}{interval(e)} of {_gib(e.usable_bytes)} usable per "
            f"GPU: {e.oom_probability:.0%} probability of running out of memory")


def _at_risk(request, e, st, policy: str, what: str, warnings: list[str], *,
             pinned: bool, strategy=None) -> dict[str, Any]:
    """The verdict for a job whose best candidate is at risk, per the at_risk policy."""
    from planner.candidates import label

    pred = _predicted(e, st)
    rec = _cand(e)
    if strategy is not None:
        pred["strategy"] = rec["strategy"] = str(strategy)
    shown = e.candidate if strategy is None else dataclasses.replace(e.candidate,
                                                                      strategy=strategy)
    from planner.error_bands import rejects

    text = f"{what}{label(shown)} is at risk on {_hw(request)}: {_risk_text(e)}"
    if rejects(policy, e.oom_probability):
        return verdict_doc(REJECT, f"{text}; rejected (at_risk: {policy}).",
                           recommendation=None if pinned else rec, predicted=pred,
                           pinned=pinned, warnings=warnings)
    if policy != "admit":  # warn, or a probability the job's is under
        warnings = [*warnings, f"at risk: {e.oom_probability:.0%} probability of running out "
                    f"of memory ({e.risk.text() if e.risk is not None else 'no measured band'})"]
    return verdict_doc(ADMIT, f"{text}; admitted (at_risk: {policy}).", recommendation=rec,
                       predicted=pred, pinned=pinned, warnings=warnings)


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
         allow_files: bool = True, at_risk: str | None = None) -> dict[str, Any]:
    """The verdict for a spec (SpecError for a bad one). See docs/gating.md. ``at_risk``
    (admit / reject / warn), when given, overrides the spec's ``at_risk``."""
    request = request_from_spec(spec, base_dir=base_dir, allow_files=allow_files)
    pinned = len(request.options.strategies) == 1 and spec.get("strategy") is not None
    return verdict_for(request, pinned=pinned, warnings=list(request.warnings),
                       at_risk=at_risk)


def verdict_for(request, *, pinned: bool, warnings: list[str],
                at_risk: str | None = None) -> dict[str, Any]:
    """The verdict for a built request: any candidate, or the pinned strategy; with the
    planner's measured error band for the kind of job it judged (planner/error_bands.py),
    its outcome (fits / at_risk / does_not_fit) and the at_risk policy applied."""
    from planner.error_bands import bands_json

    policy = at_risk or request.options.at_risk
    doc = _verdict_for(request, pinned=pinned, warnings=warnings, policy=policy)
    judged = doc.get("predicted") or doc.get("recommendation")
    doc["error_band"] = (None if not judged else
                         bands_json(Strategy(judged["strategy"]), request.training.compile,
                                    request.cluster.gpu))
    pred = doc.get("predicted")
    doc["outcome"] = pred["risk"]["outcome"] if pred else None
    doc["at_risk_policy"] = policy
    return doc


def _verdict_for(request, *, pinned: bool, warnings: list[str],
                 policy: str) -> dict[str, Any]:
    from planner.candidates import label
    from planner.plan import plan

    if not pinned:
        answer = plan(request)
        e, st = answer.chosen()
        if e is not None:
            return verdict_doc(ADMIT, f"{label(e.candidate)} fits on {_hw(request)}: "
                               f"{_fits_text(e)}.", recommendation=_cand(e),
                               predicted=_predicted(e, st), warnings=warnings)
        e, st = answer.least_risk()
        if e is not None:
            return _at_risk(request, e, st, policy, "nothing fits for sure: ", warnings,
                            pinned=False)
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
        from planner.notices import Kind, Notice

        warnings.append(Notice(f"on one GPU {strategy} shards nothing: estimated as plain "
                               "training", Kind.ONE_GPU))
    answer = plan(pinned_r)
    e, st = answer.chosen()
    if e is not None:
        shown = dataclasses.replace(e.candidate, strategy=strategy)
        rec = {**_cand(e), "strategy": str(strategy)}
        return verdict_doc(ADMIT, f"pinned {label(shown)} fits on {_hw(request)}: "
                           f"{_fits_text(e)}.", recommendation=rec,
                           predicted={**_predicted(e, st), "strategy": str(strategy)},
                           pinned=True, warnings=warnings)
    e, st = answer.least_risk()
    if e is not None:
        return _at_risk(request, e, st, policy, "pinned ", warnings, pinned=True,
                        strategy=strategy)
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


# ---------------------------------------------------------------------------------------------
# Any job file (planner/jobs): torchtitan, DeepSpeed, accelerate, HF, axolotl, litgpt, Kubeflow


def _is_plain_spec(doc: Any) -> bool:
    """A fitcheck spec without a job config: only spec keys, or a spec section among others
    (a misspelt key is then the spec's error, naming it)."""
    from planner.fields import TOP_KEYS

    if not isinstance(doc, dict) or "job" in doc:
        return False
    # a torchtune recipe names components ({"_component_": "torchtune.models..."}) where a
    # spec has sections, and has its own model: and training-like keys: a job config
    if any(isinstance(v, dict) and "_component_" in v for v in doc.values()):
        return False
    return set(doc) <= set(TOP_KEYS) or any(
        isinstance(doc.get(k), dict) for k in ("model", "training", "hardware"))


def gate_path(path: str, *, fmt: str | None = None,
              overrides: Mapping[str, Any] | None = None,
              at_risk: str | None = None) -> dict[str, Any]:
    """The verdict for the job in ``path`` ('-': stdin): a fitcheck spec, or any job config
    planner.jobs reads (by content, or ``fmt``). ``overrides`` ({path: raw}: the gate's --gpu,
    --n, --gpus-per-node, --model) win over the file. A plain spec without overrides never
    loads planner.jobs."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    head, sep, tail = path.rpartition(":")
    if sep and head.endswith(".py") and tail.isidentifier():  # a torchtitan registry entry
        from planner.jobs import read_job

        return gate_job(read_job(path, fmt), overrides, at_risk=at_risk)
    if path != "-" and os.path.exists(path) and not os.path.isfile(path):
        raise SpecError(f"{path}: not a regular file (a directory, FIFO or device is not a "
                        "job spec)")
    if path == "-":
        text = read_stdin(MAX_SPEC_BYTES)
        if text is None:
            raise SpecError("stdin: not UTF-8 text")
        name, base = "stdin", None
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_SPEC_BYTES + 1)
        except UnicodeDecodeError:
            raise SpecError(f"{path}: not UTF-8 text") from None
        name, base = path, os.path.dirname(os.path.abspath(path))
    if fmt in (None, "spec") and not overrides and not name.endswith(".toml"):
        try:
            doc = parse_spec_text(text, name)
        except SpecError:
            if fmt == "spec":
                raise
            doc = None
        if _is_plain_spec(doc):
            return gate(doc, base_dir=base, at_risk=at_risk)
    from planner.jobs import read_job

    return gate_job(read_job(path, fmt, text=text), overrides, at_risk=at_risk)


def gate_job(job, overrides: Mapping[str, Any] | None = None, *,
             allow_files: bool = True, at_risk: str | None = None) -> dict[str, Any]:
    """The verdict for a planner.jobs Job. What it sets that fitcheck does not model is a
    reject naming each setting: the memory of such a job cannot be checked."""
    from planner.errors import UsageError
    from planner.fields import FLAGS
    from planner.jobs import JobError, build

    request, resolved = build(job, overrides or {}, FLAGS.name, UsageError,
                              allow_files=allow_files)
    if resolved.values.get("hardware.n") is None:
        raise JobError(f"{job.path}: does not say how many GPUs the job uses; give --n")
    warnings = [*resolved.warnings, *request.warnings]
    if resolved.unmodelled:
        doc = verdict_doc(REJECT, f"{job.path} sets what fitcheck does not model, so its memory "
                          f"cannot be checked: {'; '.join(resolved.unmodelled)}.",
                          warnings=warnings)
        doc["unmodelled"] = list(resolved.unmodelled)
        return doc
    strategy = resolved.values.get("strategy")
    pinned = strategy is not None and len(request.options.strategies) == 1
    return verdict_for(request, pinned=pinned, warnings=warnings, at_risk=at_risk)
