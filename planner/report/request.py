"""The report's request: what to sweep, and the plan's request of each model on each GPU type.

Every field `fitcheck plan` takes that the report does not sweep (the training run,
fine-tuning, DeepSpeed, tensor parallel, calibration, margin, strategies, offload, GPUs per
node, host RAM) goes through ``planner.request.build_request``, once per model and GPU type,
so it means in a report what it means in a plan. The report adds its lists (models, GPU
types, GPU counts, sequence lengths, micro-batches, checkpointing modes) and the tokens and
prices of the cost columns. Errors are one line (planner.errors.UsageError).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.candidates import CHECKPOINTING_ORDER, OFFLOAD_ORDER
from planner.errors import UsageError
from planner.fields import BY_PATH, FIELDS, FLAGS, Naming
from planner.request import Options, Request
from planner.spec import Checkpointing, GpuProfile, ModelSpec, Offload, Strategy, TrainingSpec

OFFLOAD_MODES = ("auto", "none", "optimizer", "params_and_optimizer", "all")
"""The plan's --offload values, and all: every offload mode at every configuration."""

SWEPT = ("training.seq", "training.micro_batch", "training.global_batch")
"""Training fields the report does not take as one value: sequence length and micro-batch are
swept lists; --global-batch is not offered (its grad-accum depends on each configuration's GPU
count and micro-batch)."""

OWN = ("strategy", "offload", "checkpointing", "margin")
"""Plan fields the report's command line declares itself (a list of checkpointing modes,
offload 'all'); they reach build_request all the same."""

FIELD_PATHS: tuple[str, ...] = tuple(
    f.path for f in FIELDS
    if (f.section in ("training", "finetune", "deepspeed", "parallel")
        or f.path in ("calibration", "hardware.gpus_per_node", "hardware.host_ram_gib"))
    and f.path not in SWEPT)
"""The plan's fields the report takes as one value for the whole sweep, with the plan's
flags, checks and defaults (planner/report/cli.py)."""

BY_KEY: dict[str, str] = {BY_PATH[p].key: p for p in FIELD_PATHS + ("margin",)}
"""``build_request(grad_accum=4, tp=2, ...)``: a field by its key."""

NAMING = Naming(lambda path: {"model.preset": "--models", "model.config": "--models",
                              "hardware.gpu": "--gpus", "hardware.n": "--n"}.get(path)
                or FLAGS.name(path), UsageError)
"""A field as the report's command line names it (--models, --gpus; the rest as the plan)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportRequest:
    models: tuple[tuple[str, ModelSpec], ...]
    """(label, spec): the label is what the user typed (a preset id or a config path)."""
    gpus: tuple[GpuProfile, ...]
    """The GPU types as named (a calibration changes a plan's copy: ``plans[i][j].cluster``)."""
    plans: tuple[tuple[Request, ...], ...]
    """``plans[i][j]``: the plan's request of model i on GPU type j, built by
    planner.request.build_request from the report's fields at one GPU and the first sequence
    length and micro-batch (the sweep sets those per configuration)."""
    ns: tuple[int, ...]
    seqs: tuple[int, ...] = (2048,)
    micro_batches: tuple[int, ...] = (1,)
    checkpointings: tuple[Checkpointing, ...] = CHECKPOINTING_ORDER
    """The modes swept, each a row; a plan tries them lightest first (all three: auto)."""
    offload: str = "auto"
    """As the plan's --offload (auto: offload candidates only where nothing else fits), or
    all: every offload mode for every configuration."""
    tokens: float = 1e12
    """Tokens to train, for the time and cost columns."""
    prices: dict[str, float] | None = None
    """GPU profile id -> $ per GPU-hour; None: no cost columns."""

    @property
    def options(self) -> Options:
        """The plan's options (strategies, offload, margin, tensor parallel): one for all."""
        return self.plans[0][0].options

    @property
    def training(self) -> TrainingSpec:
        """The training run (DeepSpeed "auto" sizes as filled in for the first model)."""
        return self.plans[0][0].training

    @property
    def strategies(self) -> tuple[Strategy, ...]:
        return self.options.strategies

    @property
    def margin(self) -> float:
        return self.options.margin

    @property
    def notes(self) -> list[str]:
        """What the plans' requests assumed (a stale calibration, DeepSpeed "auto"), once
        each."""
        return list(dict.fromkeys(w for row in self.plans for r in row for w in r.warnings))

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


def parse_ints(text: str | Iterable[str], flag: str, path: str | None = None,
               limit: int = 1 << 24) -> tuple[int, ...]:
    """'8,16' -> (8, 16), sorted; each value through the plan field's check (``path``)."""
    from planner.validate import count

    check = BY_PATH[path].check if path else (lambda raw: count(raw, limit=limit))
    out = []
    for raw in parse_list(text, flag):
        try:
            out.append(check(raw))
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


MAX_PRICE = 1e6
"""$ per GPU-hour: far above any price, and small enough that a cost (hours x GPUs x price:
1e18 tokens at most, on at most 2^20 GPUs) stays far from float overflow at 1.8e308."""


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
        if not math.isfinite(value) or not 0 <= value <= MAX_PRICE:
            # 1e308 passed as finite and made every cost inf (hours x GPUs x price)
            raise UsageError(f"{flag}: must be a number from 0 to {MAX_PRICE:,.0f} ($ per "
                             f"GPU-hour), got {raw!r}")
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


def field_values(values: Mapping[str, Any] | None, keywords: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """{path: raw} of the plan's fields given by path or by key; any other is a UsageError."""
    out = dict(values or {})
    for key, raw in keywords.items():
        out[BY_KEY.get(key, f"training.{key}")] = raw
    unknown = [p for p in out if p not in FIELD_PATHS + OWN]
    if unknown:
        raise UsageError(f"report: not a field the report takes: {', '.join(unknown)}")
    return out


def refuse_cp(values: Mapping[str, Any]) -> None:
    """The sweep evaluates one sequence length per GPU count with every sequence whole on a
    GPU (its token counts, its grid of GPU counts): context parallel is not represented, so
    a degree above 1 is refused by name rather than swept as if it were not there."""
    raw = values.get("parallel.cp")
    if raw is None:
        return
    try:
        cp = BY_PATH["parallel.cp"].check(raw)
    except ValueError as exc:
        raise NAMING.fail("parallel.cp", str(exc)) from None
    if cp > 1:
        raise UsageError(f"{NAMING.name('parallel.cp')}: context parallel is not represented in "
                         "the report's sweep; plan it with fitcheck --cp")


def refuse_ep(values: Mapping[str, Any]) -> None:
    """The sweep's grid of GPU counts does not keep an expert-parallel group dividing the
    GPUs and the experts: a degree above 1 is refused by name (plan it with fitcheck --ep)."""
    for path, unset in (("parallel.ep", 1), ("parallel.ep_imbalance", 1.0)):
        raw = values.get(path)
        if raw is None:
            continue
        try:
            value = BY_PATH[path].check(raw)
        except ValueError as exc:
            raise NAMING.fail(path, str(exc)) from None
        if value != unset:
            raise UsageError(f"{NAMING.name(path)}: expert parallel is not represented in the "
                             "report's sweep; plan it with fitcheck --ep")


def plan_offload(offload: str) -> tuple[str, tuple[Offload, ...] | None]:
    """The report's --offload -> the plan's --offload value, and the options' offload modes
    for 'all' (None: as the plan's value says)."""
    if offload not in OFFLOAD_MODES:
        raise UsageError(f"--offload: choose from {', '.join(OFFLOAD_MODES)}, got {offload!r}")
    return ("auto", OFFLOAD_ORDER) if offload == "all" else (offload, None)


def build_request(*, models: str | Iterable[str], gpus: str | Iterable[str],
                  ns: str | Iterable[str], seqs: str | Iterable[str] = "2048",
                  micro_batches: str | Iterable[str] = "1",
                  strategies: str | Iterable[str] = (),
                  checkpointing: str | Iterable[str] = "none,selective,full",
                  offload: str = "auto", margin: Any = None,
                  tokens: str | float = "1e12", prices: str | None = None,
                  training: Mapping[str, Any] | None = None, **fields: Any) -> ReportRequest:
    """Strings as typed -> a request; bad values raise planner.errors.UsageError (one line).

    ``training`` holds the plan's fields by spec path ({"training.precision": "bf16",
    "parallel.tp": 2, "calibration": "none", ...}; planner/fields.py, ``FIELD_PATHS``);
    keywords such as ``precision="bf16"``, ``grad_accum=4`` or ``tp=2`` are the same fields
    by key. The plan's request of every model on every GPU type is built from them by
    planner.request.build_request."""
    from planner.request import build_request as plan_request
    from planner.validate import looks_like_path

    values = field_values(training, fields)
    refuse_cp(values)
    refuse_ep(values)
    if values.get("parallel.pp") not in (None, 1, "1"):
        # the sweep evaluates numpy arrays of configurations through the moments of
        # planner/memory/moments.py; a pipeline's ranks (planner/memory/pipeline.py) are not
        # among them
        raise NAMING.fail("parallel.pp", "pipeline parallel is not in the report's sweep; "
                          "plan it with `fitcheck --pp`")
    if values.get("training.optimizer_in_backward") not in (None, False, "false", "False"):
        # modelled on one GPU only (planner.request.in_backward_problem); the sweep's grid
        # of GPU counts would plan it where it is not modelled
        raise NAMING.fail("training.optimizer_in_backward", "is not in the report's sweep (one "
                          "GPU only); plan it with `fitcheck --n 1 --optimizer-in-backward`")
    typed = parse_list(models, "--models")
    gpu_names = parse_list(gpus, "--gpus")
    if strategies if isinstance(strategies, str) else list(strategies):
        values["strategy"] = list(parse_list(strategies, "--strategy"))
    modes = tuple(sorted(_enum_list(Checkpointing, checkpointing, "--checkpointing"),
                         key=CHECKPOINTING_ORDER.index))
    values["checkpointing"] = "auto" if len(modes) > 1 else str(modes[0])
    values["offload"], offloads = plan_offload(offload)
    if margin is not None:
        values["margin"] = margin
    ns_t = parse_ints(ns, "--n", "hardware.n")
    seqs_t = parse_ints(seqs, "--seq", "training.seq")
    mbs_t = parse_ints(micro_batches, "--micro-batch", "training.micro_batch")
    # tensor parallel: each GPU count is checked on its own in the sweep (tp_problem, as
    # build_request checks the count it is given); the degree is parsed by the field's check
    raw_tp = values.pop("parallel.tp", None)
    try:
        tp = BY_PATH["parallel.tp"].check(raw_tp) if raw_tp is not None else \
            BY_PATH["parallel.tp"].default
    except ValueError as exc:
        raise NAMING.fail("parallel.tp", str(exc)) from None
    plans = []
    for name in typed:
        key = "model.config" if looks_like_path(name) else "model.preset"
        row = []
        for g in gpu_names:
            r = plan_request({**values, key: name, "hardware.gpu": g, "hardware.n": 1,
                              "training.seq": seqs_t[0], "training.micro_batch": mbs_t[0],
                              "parallel.tp": "auto"}, NAMING)
            if r.training.optimizer.onebit and tp not in ("auto", 1):
                raise NAMING.fail("parallel.tp", f"NOT MODELLED with "
                                  f"{NAMING.name('training.optimizer')} "
                                  f"{r.training.optimizer} (DeepSpeed's 1-bit optimizers are "
                                  "planned on data parallel alone)")
            # DeepSpeed's 1-bit optimizers: data parallel alone (planner.request.onebit_problem)
            row.append(r.with_options(tp=1 if r.training.optimizer.onebit else
                                      None if tp == "auto" else tp,
                                      **({"offloads": offloads} if offloads else {})))
        plans.append(tuple(row))
    profiles = [_named_profile(r, g) for r, g in zip(plans[0], gpu_names)]
    ids = [p.id for p in profiles]
    if len(set(ids)) != len(ids):
        raise UsageError(f"--gpus: a GPU type is named twice ({', '.join(ids)})")
    from planner.validate import params as parse_count

    try:
        tokens_f = parse_count(tokens, limit=1e18)
    except ValueError as exc:
        raise UsageError(f"--tokens: {exc}") from None
    return ReportRequest(
        models=tuple((model_label(name, typed), row[0].model) for name, row in zip(typed, plans)),
        gpus=tuple(profiles), plans=tuple(plans), ns=ns_t, seqs=seqs_t, micro_batches=mbs_t,
        checkpointings=modes, offload=offload, tokens=tokens_f,
        prices=parse_prices(prices, ids))


def _named_profile(r: Request, name: str) -> GpuProfile:
    """The GPU type as named, before a calibration replaced some of its terms."""
    if r.runtime.calibration is None:
        return r.cluster.gpu
    from planner.request import resolve_gpu

    return resolve_gpu(name, NAMING, allow_files=True, base_dir=None)
