"""The report's request: what to sweep, parsed from what the user typed (one line per
error, planner.errors.UsageError)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from planner.candidates import CHECKPOINTING_ORDER
from planner.errors import UsageError
from planner.memory import DEFAULT_MARGIN
from planner.spec import Checkpointing, GpuProfile, ModelSpec, Strategy, TrainingSpec

OFFLOAD_MODES = ("auto", "none", "all")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportRequest:
    models: tuple[tuple[str, ModelSpec], ...]
    """(label, spec): the label is what the user typed (a preset id or a config path)."""
    gpus: tuple[GpuProfile, ...]
    ns: tuple[int, ...]
    seqs: tuple[int, ...] = (2048,)
    micro_batches: tuple[int, ...] = (1,)
    strategies: tuple[Strategy, ...] = tuple(Strategy)
    checkpointings: tuple[Checkpointing, ...] = CHECKPOINTING_ORDER
    offload: str = "auto"
    """auto: no offload, plus offload candidates where nothing else fits (as `fitcheck plan`);
    none: never offload; all: every offload mode for every configuration."""
    training: TrainingSpec = field(default_factory=TrainingSpec)
    """Everything about the run but the swept seq and micro-batch (as a plan's)."""
    margin: float = DEFAULT_MARGIN
    tokens: float = 1e12
    """Tokens to train, for the time and cost columns."""
    prices: dict[str, float] | None = None
    """GPU profile id -> $ per GPU-hour; None: no cost columns."""

    @property
    def n_configurations(self) -> int:
        """Upper bound of report rows before offload expansion (for the progress bar)."""
        return (len(self.models) * len(self.gpus) * len(self.ns) * len(self.seqs)
                * len(self.micro_batches) * len(self.strategies) * len(self.checkpointings))


def parse_list(text: str | Iterable[str], flag: str) -> list[str]:
    """'a,b' (or repeated values) -> ['a', 'b']; empty -> UsageError."""
    parts = [text] if isinstance(text, str) else list(text)
    out = [p.strip() for part in parts for p in part.split(",") if p.strip()]
    if not out:
        raise UsageError(f"{flag}: give at least one value")
    return list(dict.fromkeys(out))


def parse_ints(text: str | Iterable[str], flag: str, limit: int = 1 << 24) -> tuple[int, ...]:
    from planner.validate import count

    out = []
    for raw in parse_list(text, flag):
        try:
            out.append(count(raw, limit=limit))
        except ValueError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    return tuple(sorted(set(out)))


def _enum_list(enum_cls: type, text: str | Iterable[str], flag: str) -> tuple[Any, ...]:
    out = []
    for raw in parse_list(text, flag):
        try:
            value = enum_cls(raw.lower())
        except ValueError:
            choices = [str(e) for e in enum_cls if e is not Checkpointing.AUTO]
            raise UsageError(f"{flag}: unknown value {raw!r}; choose from "
                             + ", ".join(choices)) from None
        if value is Checkpointing.AUTO:
            raise UsageError(f"{flag}: give modes explicitly (none, selective, full); "
                             "the report sweeps them")
        out.append(value)
    return tuple(dict.fromkeys(out))


def parse_prices(text: str | None, gpu_ids: Sequence[str]) -> dict[str, float] | None:
    """'2.5' (every GPU), '2.5,1.8' (in --gpus order) or 'h100-80=2.5,a100-80=1.8'."""
    if text is None or not text.strip():
        return None
    flag = "--price-per-gpu-hour"
    parts = parse_list(text, flag)

    def num(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{flag}: expected $ per GPU-hour like 2.5, got {raw!r}") from None
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{flag}: must be a non-negative number, got {raw!r}")
        return value

    if all("=" in p for p in parts):
        prices = {}
        for p in parts:
            key, _, raw = p.partition("=")
            key = key.strip()
            if key not in gpu_ids:
                raise UsageError(f"{flag}: {key!r} is not one of --gpus ({', '.join(gpu_ids)})")
            prices[key] = num(raw)
        return prices
    if any("=" in p for p in parts):
        raise UsageError(f"{flag}: give one price, one per GPU, or GPU=PRICE pairs, not a mix")
    values = [num(p) for p in parts]
    if len(values) == 1:
        return {g: values[0] for g in gpu_ids}
    if len(values) != len(gpu_ids):
        raise UsageError(f"{flag}: {len(values)} prices for {len(gpu_ids)} GPUs "
                         f"({', '.join(gpu_ids)}); give one, or one per GPU")
    return dict(zip(gpu_ids, values))


def model_label(name: str, typed: Sequence[str]) -> str:
    """How a model is labelled in tables and plots: a preset as typed; a config path by its
    folder (.../Llama-3.1-8B/config.json) or file stem, unless two would read the same."""
    import os

    from planner.validate import looks_like_path

    def short(n: str) -> str:
        if not looks_like_path(n):
            return n
        base = os.path.basename(n.rstrip("/\\"))
        if base == "config.json":
            return os.path.basename(os.path.dirname(os.path.abspath(n))) or n
        return base[:-5] if base.endswith(".json") else base

    label = short(name)
    return label if sum(short(t) == label for t in typed) == 1 else name


SWEPT = ("training.seq", "training.micro_batch", "training.global_batch")
"""Training fields the report sweeps as lists (the others are one value, as for a plan)."""


def build_request(*, models: str | Iterable[str], gpus: str | Iterable[str],
                  ns: str | Iterable[str], seqs: str | Iterable[str] = "2048",
                  micro_batches: str | Iterable[str] = "1",
                  strategies: str | Iterable[str] = (),
                  checkpointing: str | Iterable[str] = "none,selective,full",
                  offload: str = "auto", margin: float = DEFAULT_MARGIN,
                  tokens: str | float = "1e12", prices: str | None = None,
                  training: dict[str, Any] | None = None, **training_kw: Any) -> ReportRequest:
    """Strings as typed -> a request; bad values raise planner.errors.UsageError (one line).

    ``training`` holds the plan's training fields by spec path ({"training.precision":
    "bf16", ...}; planner/fields.py); keywords such as ``precision="bf16"`` or
    ``grad_accum=4`` are the same fields by key."""
    from planner.fields import BY_PATH, FLAGS, Naming, parse
    from planner.request import resolve_gpu, resolve_model, training_from
    from planner.validate import looks_like_path

    models_naming = Naming(lambda path: "--models", UsageError)
    typed = parse_list(models, "--models")
    resolved_models = []
    for name in typed:
        key = "model.config" if looks_like_path(name) else "model.preset"
        spec, _ = resolve_model({key: name}, models_naming, allow_files=True, base_dir=None)
        resolved_models.append((model_label(name, typed), spec))
    gpus_naming = Naming(lambda path: "--gpus", UsageError)
    profiles = [resolve_gpu(name, gpus_naming, allow_files=True, base_dir=None)
                for name in parse_list(gpus, "--gpus")]
    ids = [p.id for p in profiles]
    if len(set(ids)) != len(ids):
        raise UsageError(f"--gpus: a GPU type is named twice ({', '.join(ids)})")
    strategies_t = _enum_list(Strategy, strategies, "--strategy") if (
        strategies if isinstance(strategies, str) else list(strategies)) else tuple(Strategy)
    if offload not in OFFLOAD_MODES:
        raise UsageError(f"--offload: choose from {', '.join(OFFLOAD_MODES)}, got {offload!r}")
    try:
        BY_PATH["margin"].check(margin)
    except ValueError as exc:
        raise FLAGS.fail("margin", str(exc)) from None
    values = {**(training or {}), **{f"training.{k}": v for k, v in training_kw.items()}}
    unknown = [p for p in values if p not in BY_PATH or p in SWEPT]
    if unknown:
        raise UsageError(f"report: not a training field: {', '.join(unknown)}")
    try:
        template = training_from(parse(values, FLAGS))
    except ValueError as exc:  # a fine-tuning combination FineTune refuses
        raise UsageError(f"report: {exc}") from None
    from planner.params import trainable

    for label, m in resolved_models:
        try:
            trainable(m, template.finetune)
        except ValueError as exc:
            raise FLAGS.fail("finetune.lora_targets", f"{label}: {exc}") from None
    from planner.validate import params as parse_count

    try:
        tokens_f = parse_count(tokens, limit=1e18)
    except ValueError as exc:
        raise UsageError(f"--tokens: {exc}") from None
    return ReportRequest(
        models=tuple(resolved_models), gpus=tuple(profiles),
        ns=parse_ints(ns, "--n"), seqs=parse_ints(seqs, "--seq"),
        micro_batches=parse_ints(micro_batches, "--micro-batch"),
        strategies=strategies_t,
        checkpointings=tuple(sorted(_enum_list(Checkpointing, checkpointing, "--checkpointing"),
                                    key=CHECKPOINTING_ORDER.index)),
        offload=offload, training=template, margin=margin, tokens=tokens_f,
        prices=parse_prices(prices, ids))
