"""The job record every reader produces, the one rule for what fitcheck does not model, and how
jobs combine with each other and with flags.

A reader turns a file into ``{path: raw value}`` in the field registry's vocabulary
(planner/fields.py), plus where each value came from. Paths the registry does not have, and
values its check refuses that the reader marked as the format's own vocabulary (``Vocab``),
become ``unmodelled`` lines through ``split_modelled``: never dropped, never guessed. When a
field is added to the registry, the same reader output passes through unchanged.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import field, replace
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.errors import InputDataError


class JobError(InputDataError):
    """A job file is unreadable or says something impossible (exit 4)."""


class JobFormat(enum.StrEnum):
    TORCHTITAN = "torchtitan"  # torchtitan TOML, or a config_registry.py function (0.3)
    DEEPSPEED = "deepspeed"  # a DeepSpeed config JSON (ds_config.json)
    ACCELERATE = "accelerate"  # an accelerate config YAML (accelerate launch --config_file)
    TRAINER = "trainer"  # HF TrainingArguments (a JSON dump, or a recipe of its keys only)
    TRL = "trl"  # a TRL config (SFT/DPO/GRPO/...): TRL, alignment-handbook, open-r1 recipes
    LLAMAFACTORY = "llamafactory"  # a LLaMA-Factory recipe (v0 hparams or v1 config)
    AXOLOTL = "axolotl"  # an axolotl config YAML
    LITGPT = "litgpt"  # a litgpt config_hub YAML
    TORCHTUNE = "torchtune"  # a torchtune recipe config (recipes/configs/*.yaml)
    KUBEFLOW = "kubeflow"  # a Kubeflow PyTorchJob (or Trainer v2) manifest
    SPEC = "spec"  # fitcheck's own gate spec (docs/gating.md)


@dataclass(frozen=True, slots=True)
class Vocab:
    """A value of the job format's own vocabulary, named as fitcheck would name it
    ('adagrad', 'hybrid_shard_zero2'): it passes when the field's check accepts it and is
    unmodelled otherwise (a value fitcheck does not know is never a data error)."""

    value: Any


@dataclass(frozen=True, slots=True)
class Unmodelled:
    """A key of the job's framework that fitcheck does not model (or does not know), with the
    line that says so: never a field, always a NOT MODELLED line (planner/jobs/keys.py)."""

    value: Any
    line: str


@dataclass(frozen=True, slots=True)
class Share:
    """A per-GPU value the framework derives at start-up from a total and the GPU count:
    DeepSpeed's micro-batch is train_batch_size / (gradient_accumulation_steps x GPUs) when
    the file gives no train_micro_batch_size_per_gpu (runtime/config.py
    _set_batch_related_parameters). Resolved once the GPU count is known."""

    total: int
    per: int
    """What else divides the total (the gradient accumulation steps)."""
    keys: str
    """'train_batch_size / (gradient_accumulation_steps x GPUs)', for the messages."""


@dataclass(frozen=True, slots=True)
class ModelDtype:
    """The dtype the training code loads the model in (a recipe's torch_dtype bfloat16, axolotl's
    bf16): a 16-bit model trains as loaded under DDP (pure 16-bit weights, gradients and
    optimizer state), while FSDP under mixed precision (accelerate upcasts the trainable
    parameters) and DeepSpeed (fp32 master partition) keep fp32 master weights. Resolved once
    the strategy is known (``resolve``)."""

    dtype: str


@dataclass(frozen=True, slots=True)
class HfAttention:
    """The attn_implementation a transformers model is loaded with (``ATTN_PATH``), kept
    beside ``training.attention`` (where flash-attention-2 and SDPA plan alike) because it
    decides whether the HF Trainer runs accelerate's context parallel at all: it raises for
    any but sdpa (transformers Trainer ``_prepare_context_parallel_inputs``). Checked in
    ``resolve``, once every file of the job is in."""

    name: str


ATTN_PATH = "hf.attn_implementation"


@dataclass(frozen=True, slots=True)
class FrameworkAttention:
    """``training.attention`` as a framework's own model code runs it (torchtune's modules, not
    transformers' classes): the kind, and the reason the plan's attention line gives
    (planner.request.ATTENTION_WHY). A user's --attention replaces both."""

    kind: str
    why: str


@dataclass(frozen=True, slots=True)
class Source:
    file: str
    key: str
    """Where in the file: '[training] local_batch_size', 'zero_optimization.stage'."""

    def __str__(self) -> str:
        return f"{self.file} {self.key}"


@dataclass(frozen=True, slots=True)
class Fallback:
    """A value the job implies only when nothing else says otherwise (a DeepSpeed "auto", a
    recipe without fsdp/deepspeed meaning plain DDP), with the note that says so."""

    value: Any
    """The value, or a function of the values read so far (their own fallbacks applied
    before it) returning it, None when it does not apply."""
    note: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """What a job file asks for, in fitcheck's field paths."""

    format: JobFormat
    path: str
    """The file as given ('-' for stdin)."""
    values: dict[str, Any]
    """What the file says that fitcheck models: paths of planner.fields.BY_PATH, raw values."""
    warnings: list[str]
    """One line each: assumptions made, things read but not used."""
    unmodelled: list[str]
    """Settings that matter for memory that fitcheck does not model (one line each)."""
    layout: str = ""
    """Which variant of the format was seen ('torchtitan v0.2 layout: [parallelism], [compile]')."""
    raw: dict[str, Any] = field(default_factory=dict)
    """Everything the file says, before the unmodelled rule (Vocab values, unknown paths)."""
    sources: dict[str, Source] = field(default_factory=dict)
    fallbacks: dict[str, Fallback] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    """Every file read: this one and the ones it references (a DeepSpeed JSON, a job config)."""
    unresolved_model: Source | None = None
    """The model id the file names when it is no fitcheck preset (the id is in key)."""
    said: list[str] = field(default_factory=list)
    """The readers' own warnings (``warnings`` adds the notes of the fallbacks in use)."""

    def where(self, path: str) -> str:
        """'train.toml [training] seq_len (training.seq)', or the path alone."""
        src = self.sources.get(path)
        return f"{src} ({path})" if src else path


# ---------------------------------------------------------------------------------------------
# The one rule: what passes to the planner, what is unmodelled

WORDS: dict[str, str] = {
    "parallel.tp": "tensor parallel degree",
    "parallel.pp": "pipeline parallel degree",
    "parallel.cp": "context parallel degree",
    "parallel.ep": "expert parallel degree",
    "parallel.sp": "sequence parallel (Ulysses) degree",
    "finetune.lora_rank": "LoRA rank",
    "finetune.lora_targets": "LoRA target modules",
    "finetune.quantize_base": "quantized base weights",
    "finetune.freeze": "frozen parameters",
    "finetune.modules_to_save": "modules trained in full beside LoRA",
    "training.grad_sync": "gradient sync under accumulation",
    "training.loss": "loss",
    "training.compile": "torch.compile",
    "training.allocator": "CUDA allocator",
    "training.fsdp_version": "FSDP version",
    "training.init": "weight initialisation",
    "training.float8": "float8 training",
    "training.reduce_dtype": "gradient reduce dtype",
    "training.reference_model": "a frozen reference model copy",
    "training.paired_batch": "chosen + rejected sequences per example (preference training)",
    "training.generation": "generation during training (completions sampled each step: the "
                           "KV cache and the generation batch)",
    "training.teacher_model": "a teacher model (distillation)",
    "training.reward_model": "a reward model",
    "training.activation_offload": "activation offloading to host RAM",
    "training.activation_offload_impl": "whose activation offloading class",
    "finetune.lora_head": "LoRA on the output head",
    "training.precision": "precision",
    "training.optimizer": "optimizer",
    "training.attention": "attention",
    "strategy": "strategy",
    "offload": "offload",
    "checkpointing": "activation checkpointing",
}


def describe(path: str, value: Any, source: Source | None) -> str:
    """'tensor parallel degree 8 (parallel.tp, from train.toml [parallelism] ...) is not
    modelled yet'."""
    if path in WORDS:
        words = WORDS[path]
    elif path.startswith("deepspeed."):
        words = f"DeepSpeed {path.split('.', 1)[1]}"
    else:
        words = path
    shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
    shown = {True: "true", False: "false"}.get(shown, shown) if isinstance(shown, bool) else shown
    where = f"{path}, from {source}" if source else path
    return f"{words} {shown} ({where}) is not modelled yet"


def split_modelled(values: Mapping[str, Any], sources: Mapping[str, Source] | None = None
                   ) -> tuple[dict[str, Any], list[str]]:
    """{path: raw} -> (what the planner models, one line per what it does not).

    A path the field registry does not have is unmodelled; so is a ``Vocab`` value its check
    refuses. Everything else passes as the raw value (checked later, with the file named).
    The registry is read at run time: a field added there passes through with no change here.
    """
    from planner.fields import BY_PATH

    sources = sources or {}
    kept: dict[str, Any] = {}
    lines: list[str] = []
    for path, v in values.items():
        if isinstance(v, Unmodelled):
            lines.append(v.line)
            continue
        if isinstance(v, (Share, ModelDtype, HfAttention)):  # checked in resolve
            continue
        if isinstance(v, FrameworkAttention):  # its reason: attention_why
            kept[path] = v.kind
            continue
        raw = v.value if isinstance(v, Vocab) else v
        f = BY_PATH.get(path)
        if f is None:
            lines.append(describe(path, raw, sources.get(path)))
            continue
        if isinstance(v, Vocab):
            try:
                f.check(raw)
            except ValueError:
                lines.append(describe(path, raw, sources.get(path)))
                continue
        kept[path] = raw
    return kept, lines


# ---------------------------------------------------------------------------------------------
# Combining jobs

MODEL_SOURCES = ("model.params", "model.preset", "model.config")
SOFT = {"checkpointing": "none"}
"""Two independent switches for the same thing (accelerate's fsdp_activation_checkpointing and
the recipe's gradient_checkpointing): one file's 'none' yields to the other's mode."""


def finish(job: Job) -> Job:
    """values, warnings and unmodelled of the job on its own (fallbacks applied)."""
    values = dict(job.raw)
    notes = apply_fallbacks(job, values)
    kept, lines = split_modelled(values, job.sources)
    return replace(job, values=kept, unmodelled=lines, warnings=_unique([*job.said, *notes]))


def apply_fallbacks(job: Job, values: dict[str, Any]) -> list[str]:
    """Fill the job's defaults (fallbacks) for the paths ``values`` lacks, in place; their
    notes."""
    notes = []
    for path, fb in job.fallbacks.items():
        if path not in values:
            value = fb.value(values) if callable(fb.value) else fb.value
            if callable(fb.value) and value is None:
                continue  # a derived default that does not apply to these values
            if value is not None:
                values[path] = value
            if fb.note:
                notes.append(fb.note)
    return notes


def merge(first: Job, second: Job) -> Job:
    """Two files of one job (an accelerate config and the recipe it launches, a recipe and its
    DeepSpeed JSON): the union of what they say; the same field set two ways is an error
    naming both files and keys."""
    raw = dict(first.raw)
    sources = dict(first.sources)
    for path, v in second.raw.items():
        if path in raw and _plain(raw[path]) != _plain(v):
            a, b = _plain(raw[path]), _plain(v)
            if SOFT.get(path) in (a, b):
                if b == SOFT[path]:
                    continue
            else:
                raise JobError(f"conflicting {path}: {first.where(path)} says {a!r}, "
                               f"{second.where(path)} says {b!r}; make them agree")
        raw[path] = v
        if path in second.sources:
            sources[path] = second.sources[path]
    fallbacks = {**second.fallbacks, **first.fallbacks}
    return finish(replace(
        first, raw=raw, sources=sources, fallbacks=fallbacks,
        said=[*first.said, *second.said],
        files=tuple(dict.fromkeys(first.files + second.files)),
        unresolved_model=first.unresolved_model or second.unresolved_model,
        layout="; ".join(x for x in (first.layout, second.layout) if x)))


def overlay(base: Job, top: Job, *, primary: Job | None = None) -> Job:
    """``top`` over ``base`` (a fitcheck spec over the job config it names): top wins. The
    result is named after ``primary`` (default: top), the file the user gave."""
    raw = dict(base.raw)
    if any(p in top.raw for p in MODEL_SOURCES):
        raw = {p: v for p, v in raw.items() if p not in MODEL_SOURCES}
        base = replace(base, unresolved_model=None)
    raw.update(top.raw)
    first = primary or top
    return finish(replace(
        top, format=first.format, path=first.path, raw=raw, sources={**base.sources, **top.sources},
        fallbacks={**base.fallbacks, **top.fallbacks},
        said=[*base.said, *top.said],
        files=tuple(dict.fromkeys(first.files + top.files + base.files)),
        unresolved_model=top.unresolved_model or base.unresolved_model,
        layout="; ".join(x for x in (top.layout, base.layout) if x)))


def _plain(v: Any) -> Any:
    v = v.value if isinstance(v, (Vocab, Unmodelled)) else v
    return str(v).lower() if isinstance(v, str) else v


def _unique(lines: list[str]) -> list[str]:
    """Each line once, as a job Notice (planner/notices.py)."""
    from planner.notices import Kind, Notice

    return [Notice(w, Kind.JOB) for w in dict.fromkeys(lines)]


# ---------------------------------------------------------------------------------------------
# A job under flags (or gate options, or a spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolved:
    """The values a request is built from, after the user's own values override the job's."""

    values: dict[str, Any]
    warnings: list[str]
    unmodelled: list[str]
    given: frozenset[str]
    """Paths the user gave (flags, gate options): they name themselves in errors."""


def resolve(job: Job, given: Mapping[str, Any]) -> Resolved:
    """The job's values under the user's (``given``: {path: raw}, None = not given).

    A model given by the user replaces the job's model entirely. A model id the job names
    that is no fitcheck preset is an error unless the user gives one.
    """
    given = {p: v for p, v in given.items() if v is not None and v != () and v != []}
    values = dict(job.raw)
    if any(p in given for p in MODEL_SOURCES):
        values = {p: v for p, v in values.items() if p not in MODEL_SOURCES}
    elif job.unresolved_model is not None:
        src = job.unresolved_model
        raise JobError(f"{src.file}: {src.key}: not a fitcheck model preset and fitcheck does "
                       "not download configs; give --config path/to/config.json (the model's own "
                       "config.json), --model PRESET when a preset has the same config (fitcheck "
                       "--list-models), or the shape flags (--layers --hidden --heads --vocab)")
    values.update(given)
    warnings = [*job.said, *apply_fallbacks(job, values)]
    _shares(job, values)
    warnings += _model_dtype(job, values, given)
    _cp_attention(job, values)
    kept, lines = split_modelled(values, job.sources)
    _check_batch(job, kept)
    return Resolved(values=kept, warnings=_unique(warnings), unmodelled=lines,
                    given=frozenset(given))


def attention_why(job: Job, resolved: Resolved) -> str | None:
    """The reason a job's framework gives for its attention (``FrameworkAttention``), unless
    the user gave --attention."""
    attn = job.raw.get("training.attention")
    if isinstance(attn, FrameworkAttention) and "training.attention" not in resolved.given:
        return attn.why
    return None


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str) and v.strip().isdigit() and len(v) < 20:
        return int(v)
    return None


def _model_dtype(job: Job, values: dict[str, Any], given: Mapping[str, Any]) -> list[str]:
    """A model loaded in 16-bit under plain DDP trains in pure 16-bit (``ModelDtype``)."""
    md = values.pop("job.model_dtype", None)
    if not isinstance(md, ModelDtype):
        return []
    where = job.where("job.model_dtype")
    strategies = [s.strip() for s in str(values.get("strategy") or "").split(",") if s.strip()]
    precision = values.get("training.precision")
    if strategies == ["ddp"] and "training.precision" not in given and precision in (
            "bf16-amp", "fp16-amp", "fp32"):
        values["training.precision"] = "bf16"
        return [f"{where}: the model is loaded in {md.dtype} and plain DDP trains it as loaded: "
                "pure 16-bit weights, gradients and optimizer state (--precision bf16)"]
    if not strategies:
        return [f"{where}: the model is loaded in {md.dtype}: under plain DDP it trains in pure "
                "16-bit (fp32 master weights under FSDP and DeepSpeed); planned with the "
                "precision above"]
    return []


def _shares(job: Job, values: dict[str, Any]) -> None:
    """Per-GPU values the framework derives from the GPU count (``Share``), now that it is
    known; one that does not divide is the framework's own start-up error."""
    for path, v in list(values.items()):
        if not isinstance(v, Share):
            continue
        n = _int(values.get("hardware.n"))
        where = job.where(path)
        if n is None:
            raise JobError(f"{where}: the framework derives it as {v.keys} and the job does not "
                           "say how many GPUs it uses; give --n")
        if v.total % (v.per * n):
            raise JobError(f"{where}: {v.keys} = {v.total} / ({v.per} x {n}) is not a whole "
                           "number (the framework refuses it at start-up); give a GPU count "
                           "that divides it")
        values[path] = v.total // (v.per * n)


def _cp_attention(job: Job, values: Mapping[str, Any]) -> None:
    """accelerate's context parallel (``parallel.cp_kv`` grouped: transformers' attention)
    under a model loaded with another attention than SDPA: the HF Trainer's start-up error
    (``_prepare_context_parallel_inputs``: "Context parallelism is supported only with SDPA
    attention")."""
    attn, cp = values.get(ATTN_PATH), _int(values.get("parallel.cp"))
    if not isinstance(attn, HfAttention) or attn.name == "sdpa" or not cp or cp <= 1 \
            or str(values.get("parallel.cp_kv", "")).lower() != "grouped":
        return
    raise JobError(f"{job.where(ATTN_PATH)} {attn.name!r} with context parallel {cp} "
                   f"({job.where('parallel.cp')}): the HF Trainer runs accelerate's context "
                   "parallel with sdpa only (Trainer._prepare_context_parallel_inputs raises "
                   "for any other); load the model with attn_implementation sdpa")


def _check_batch(job: Job, v: Mapping[str, Any]) -> None:
    """A job that sets the global batch and the accumulation both: they must agree with the
    micro-batch and the GPU count (DeepSpeed refuses the same mismatch at start-up)."""
    gb, ga = _int(v.get("training.global_batch")), _int(v.get("training.grad_accum"))
    mb, n = _int(v.get("training.micro_batch", 1)), _int(v.get("hardware.n"))
    if None in (gb, ga, mb, n) or gb <= 0 or "training.global_batch" not in job.sources:
        return
    if mb * ga * n != gb:
        raise JobError(f"{job.where('training.global_batch')} is {gb}, but micro-batch {mb} x "
                       f"gradient accumulation {ga} x {n} GPUs is {mb * ga * n}; make them "
                       "agree (or drop one)")


def naming_for(job: Job, resolved: Resolved, given_name: Callable[[str], str],
               given_error: Callable[[str], Exception]):
    """A planner.fields.Naming that names a job's field by file and key and a given one the
    user's way; the error is the job's (exit 4) unless the field it names was given."""
    from planner.fields import Naming

    last: list[str] = []

    def name(path: str) -> str:
        last.append(path)
        if path in resolved.given or path not in job.sources:
            return given_name(path)
        return job.where(path)

    def error(message: str) -> Exception:
        named = [p for p in set(last) if p in job.sources and p not in resolved.given
                 and job.where(p) in message]
        return JobError(message) if named else given_error(message)

    return Naming(name, error)  # type: ignore[arg-type]
