"""Every field of a planning request, defined once: its spec path, its flag, its check, its
default and its help.

The command line (planner/cli.py builds its options from ``FIELDS``), gate specs
(``spec_values``: the nested sections of a JSON/YAML spec) and job-config readers all produce
the same flat mapping ``{path: raw value}``; ``parse`` checks it and
``planner.request.build_request`` turns it into the typed request. A message about a field
names it the way the user wrote it (``--seq`` on the command line, ``training.seq`` in a spec).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any

from planner.lazy_dataclass import dataclass
from planner import validate
from planner.errors import FitcheckError, InputDataError, UsageError
from planner.error_bands import DEFAULT_AT_RISK, DEFAULT_MARGIN, parse_at_risk
from planner.spec import (
    Allocator,
    Attention,
    CheckpointImpl,
    Checkpointing,
    CompileMode,
    CpKv,
    CpRotate,
    Dtype,
    FlatParams,
    Float8Recipe,
    OffloadImpl,
    GradSync,
    InitMode,
    LINEAR_MODULES,
    LossKind,
    MeshMode,
    MlpKind,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    PipeKeptOutputs,
    PipeSchedule,
    Precision,
    SacList,
    Quantize,
    Strategy,
    TrainingSpec,
)

MAX_PARAMS = 1e13


def _train_default(name: str) -> Any:
    return TrainingSpec.__dataclass_fields__[name].default


def _count(limit: int) -> Callable[[Any], int]:
    return lambda raw: validate.count(raw, limit=limit)


def _choice(enum_cls: type, extra: tuple[str, ...] = ()) -> Callable[[Any], Any]:
    return lambda raw: validate.choice(raw, enum_cls, extra)


def parse_strategies(raw: Any) -> tuple[Strategy, ...]:
    """'ddp,full_shard', a list of names, or several flag values -> strategies, in order."""
    parts = [raw] if isinstance(raw, str) else raw
    if not isinstance(parts, (list, tuple)):
        raise ValueError(f"must be a strategy name or a list of them, got {parts!r}")
    out: list[Strategy] = []
    for part in parts:
        if not isinstance(part, str):
            raise ValueError(f"must be strategy names, got {part!r}")
        for name in part.split(","):
            if name.strip():
                s = validate.choice(name, Strategy)
                if s not in out:
                    out.append(s)
    if not out:
        raise ValueError("give at least one strategy: " + ", ".join(str(s) for s in Strategy))
    return tuple(out)


def parse_transformers_version(raw: Any) -> str:
    """'4.45.2' or '4.45' -> '4.45': the release the model's loss code comes from."""
    if isinstance(raw, float):  # 4.50 read as a number is 4.5
        raise ValueError(f"must be a release written as text (\"4.50\"), got {raw!r}")
    text = str(raw).strip().lstrip("v")
    parts = text.split(".")
    if isinstance(raw, bool) or len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
        raise ValueError(f"must be a transformers release such as 4.46 or 4.45.2, got "
                         f"{validate._show(raw)}")
    major, minor = int(parts[0]), int(parts[1])
    if major < 4 or major > 99:
        raise ValueError(f"must be transformers 4.x or later, got {validate._show(raw)}")
    return f"{major}.{minor}"


def parse_loss(raw: Any) -> tuple[LossKind, int]:
    """'fp32', 'bf16', 'fused', 'chunked' or 'chunked:N' -> (kind, chunks)."""
    text = validate.text(raw, limit=40).lower()
    kind_text, _, chunks_text = text.partition(":")
    kind = validate.choice(kind_text, LossKind)
    default = TrainingSpec.__dataclass_fields__["loss_chunks"].default
    if chunks_text and kind is not LossKind.CHUNKED:
        raise ValueError(f"only chunked takes a number of chunks (chunked:N), got {raw!r}")
    return kind, validate.count(chunks_text, limit=1 << 16) if chunks_text else default


def parse_fsdp_version(raw: Any) -> int:
    if str(raw).strip() not in ("1", "2"):
        raise ValueError(f"must be 1 or 2, got {validate._show(raw)}")
    return int(str(raw).strip())


def parse_module_names(raw: Any) -> tuple[str, ...]:
    """'moe.router.gate,attention.wq', a list of names, or 'none' / an empty list -> names,
    in order (torchtitan's ``force_recompute_mm_shapes_by_fqns``; planner/sac.py resolves
    them against the model)."""
    parts = [raw] if isinstance(raw, str) else raw
    if not isinstance(parts, (list, tuple)):
        raise ValueError(f"must be module names (attention.wq,feed_forward.w1, ...) or none, "
                         f"got {validate._show(raw)}")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ValueError(f"must be module names, got {validate._show(part)}")
        out += [n for n in part.replace(" ", "").split(",") if n]
    if [n.lower() for n in out] == ["none"]:
        return ()
    return tuple(dict.fromkeys(out))


LORA_TARGET_GROUPS = {"attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down"),
                      "all-linear": LINEAR_MODULES}


def parse_lora_targets(raw: Any) -> tuple[str, ...]:
    """'q,v', 'attn', 'mlp', 'all-linear' or a list of those -> module names, in order."""
    parts = [raw] if isinstance(raw, str) else raw
    if not isinstance(parts, (list, tuple)) or not parts:
        raise ValueError(f"must be module names (q,k,v,o,gate,up,down, attn, mlp, all-linear), "
                         f"got {validate._show(raw)}")
    out: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ValueError(f"must be module names, got {validate._show(part)}")
        for name in part.lower().replace(" ", "").split(","):
            if not name:
                continue
            names = LORA_TARGET_GROUPS.get(name, (name,))
            for n in names:
                if n not in LINEAR_MODULES:
                    raise ValueError(f"unknown module {name!r}; use "
                                     f"{', '.join(LINEAR_MODULES)}, attn, mlp or all-linear")
                if n not in out:
                    out.append(n)
    if not out:
        raise ValueError("give at least one module")
    return tuple(out)


def parse_freeze(raw: Any) -> tuple[bool, int, int]:
    """'embeddings', 'N-layers' (the first N blocks), both comma-separated, 'all-but-N-layers'
    (only the last N blocks train) or 'none' -> (embeddings, first N, last N trained)."""
    import re

    text = validate.text(raw, limit=80).lower().strip()
    if text == "none":
        return False, 0, 0
    emb, first, last = False, 0, 0
    for part in (p.strip() for p in text.split(",")):
        m = re.fullmatch(r"all[- ]but[- ](\d{1,6})[- ]layers?", part)
        n = re.fullmatch(r"(\d{1,6})[- ]layers?", part)
        if part in ("embeddings", "embedding", "embed"):
            emb = True
        elif m:
            last = int(m.group(1))
            if last < 1:
                raise ValueError(f"all-but-N-layers needs N >= 1, got {raw!r}")
        elif n:
            first = int(n.group(1))
        else:
            raise ValueError(f"must be embeddings, N-layers, embeddings,N-layers, "
                             f"all-but-N-layers or none, got {validate._show(raw)}")
    if last and (first or emb):
        raise ValueError(f"all-but-N-layers already freezes the embeddings and first layers, "
                         f"got {raw!r}")
    return emb, first, last


def _at_risk(raw: Any) -> str:
    """admit, reject, warn (case-insensitive) or a probability of running out of memory at and
    above which a job at risk is rejected (planner.error_bands.parse_at_risk)."""
    text = validate.text(raw, limit=20) if not isinstance(raw, (int, float)) or \
        isinstance(raw, bool) else str(raw)
    return parse_at_risk(text)


def parse_tp(raw: Any) -> int | str:
    """'auto' or a tensor-parallel degree (1 = none)."""
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    return validate.count(raw, limit=1024)


def _pp_degree(raw: Any) -> int:
    """A pipeline-parallel degree (1 = none)."""
    return validate.count(raw, limit=1024)


NOT_MODELLED_SCHEDULES = ("loopedbfs",)
"""torch.distributed.pipelining schedules fitcheck refuses by name (planner/pipeline.py)."""


def parse_pp_schedule(raw: Any) -> PipeSchedule:
    """A modelled pipeline schedule, spelled as fitcheck or as torchtitan writes it (1F1B,
    Interleaved1F1B, GPipe, ZBVZeroBubble, DualPipeV, InterleavedZeroBubble); the others are
    refused by name."""
    text = validate.text(raw, limit=40).strip().lower().replace("_", "").replace("-", "")
    aliases = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved-1f1b",
               "zbv": "zbv", "zbvzerobubble": "zbv", "dualpipev": "dualpipev",
               "interleavedzb": "interleaved-zb", "interleavedzerobubble": "interleaved-zb"}
    modelled = ", ".join(PipeSchedule)
    if text in NOT_MODELLED_SCHEDULES:
        raise ValueError(f"{validate._show(raw)} is NOT MODELLED (modelled: {modelled})")
    if text not in aliases:
        raise ValueError(f"must be one of {modelled}, got {validate._show(raw)}")
    return PipeSchedule(aliases[text])


def parse_lora_dtype(raw: Any) -> bool:
    """fp32 (peft's autocast_adapter_dtype default) or base -> adapters in fp32?"""
    text = validate.text(raw, limit=20).lower().strip()
    if text not in ("fp32", "base"):
        raise ValueError(f"must be fp32 or base, got {validate._show(raw)}")
    return text == "fp32"


DS_MAX_ELEMS = 1 << 40
"""Upper bound for a DeepSpeed element count (DeepSpeed itself only asks >= 0)."""


def parse_ds_elems(raw: Any, auto: bool = False) -> int | str:
    """A DeepSpeed element count: a non-negative integer (5e8 and 500_000_000 alike; DeepSpeed's
    pydantic config refuses a fractional one) or, where the HF integration fills it in,
    "auto"."""
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text == "auto":
            if not auto:
                raise ValueError('"auto" is filled in by the Hugging Face integration only for '
                                 "reduce_bucket_size, allgather_bucket_size, "
                                 "stage3_prefetch_bucket_size and "
                                 "stage3_param_persistence_threshold")
            return "auto"
        try:
            raw = float(text) if any(c in text for c in ".e") else int(text.replace("_", ""))
        except ValueError:
            raise ValueError(f"must be a number of elements{' or auto' if auto else ''}, "
                             f"got {validate._show(raw)}") from None
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"must be a whole number of elements (DeepSpeed refuses "
                         f"{validate._show(raw)})")
    if raw < 0 or raw > DS_MAX_ELEMS:
        raise ValueError(f"must be between 0 and {DS_MAX_ELEMS:,} elements, got {raw}")
    return raw


def _ds_auto(raw: Any) -> int | str:
    return parse_ds_elems(raw, auto=True)


class _OffloadDevice(enum.StrEnum):
    CPU = "cpu"
    NVME = "nvme"


def _ds_bool(raw: Any) -> bool:
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        raise ValueError('"auto" is not filled in by the Hugging Face integration here; '
                         "give true or false")
    return validate.boolean(raw)


def _hpz_size(raw: Any) -> int:
    """ZeRO++ hpZ group size: a whole number of ranks; DeepSpeed's pydantic field takes >= 0
    and turns hpZ on above 1, so 0 is the same as 1 (off)."""
    if not isinstance(raw, bool) and (raw == 0 or (isinstance(raw, str) and raw.strip() == "0")):
        return 1
    return validate.count(raw, limit=1 << 20, what="a number of GPUs (0 or 1: off)")


@dataclass(frozen=True, slots=True, kw_only=True)
class Field:
    path: str
    """Where it lives in a spec: 'training.seq' (section.key) or a top-level key."""
    flag: str
    """The command-line option: '--seq'."""
    check: Callable[[Any], Any]
    """Raw value -> typed value, or ValueError (validate.py)."""
    default: Any = None
    """The value when the user gives none (None: not given)."""
    shown_default: str | None = None
    """How the default is written on the command line (when str(default) is not it)."""
    help: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    """Shown in --help and offered by shell completion."""
    is_flag: bool = False
    """A --x/--no-x switch on the command line."""
    multiple: bool = False
    """Repeatable on the command line."""
    files: bool = False
    """The value may name a file (refused where files may not be read: the webhook)."""

    @property
    def section(self) -> str:
        return self.path.split(".", 1)[0] if "." in self.path else ""

    @property
    def key(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def dest(self) -> str:
        """The keyword click passes: '--kv-heads' -> kv_heads."""
        return self.flag.lstrip("-").replace("-", "_")


def _names(enum_cls: type) -> tuple[str, ...]:
    return tuple(str(e.value) for e in enum_cls)


FIELDS: tuple[Field, ...] = (
    # ---- model -------------------------------------------------------------------------
    Field(path="model.params", flag="--params", metavar="N",
          check=lambda raw: validate.params(raw, limit=MAX_PARAMS),
          help="Total parameters (13e9, 13B): a Llama-style shape is derived by a documented "
          "scaling rule and marked as assumed."),
    Field(path="model.preset", flag="--model", metavar="PRESET", check=validate.text,
          help="A preset id or hub-style name (see --list-models)."),
    Field(path="model.config", flag="--config", metavar="PATH", check=validate.path_or_mapping,
          files=True, help="A local Hugging Face config.json (or its directory)."),
    Field(path="model.approximate", flag="--approximate", check=validate.boolean, is_flag=True,
          help="Accept an approximate reading of a --config that fitcheck does not model fully "
          "(an unknown model_type, a vision tower, ...); each approximation is a warning."),
    Field(path="model.layers", flag="--layers", check=_count(100_000),
          help="Transformer blocks (overrides)."),
    Field(path="model.hidden", flag="--hidden", check=_count(1 << 20),
          help="Hidden size (overrides)."),
    Field(path="model.heads", flag="--heads", check=_count(1 << 16),
          help="Attention heads (overrides)."),
    Field(path="model.kv_heads", flag="--kv-heads", check=_count(1 << 16),
          help="Key/value heads: < heads for GQA (overrides)."),
    Field(path="model.ffn", flag="--ffn", check=_count(1 << 22),
          help="MLP inner width, per expert (overrides)."),
    Field(path="model.vocab", flag="--vocab", check=_count(1 << 24),
          help="Vocabulary size (overrides)."),
    Field(path="model.tied_embeddings", flag="--tied-embeddings", check=validate.boolean,
          is_flag=True, help="Output head shares the embedding table (overrides)."),
    Field(path="model.mlp", flag="--mlp", check=_choice(MlpKind), choices=_names(MlpKind),
          help="MLP type (overrides)."),
    Field(path="model.experts", flag="--experts", check=_count(1 << 16),
          help="MoE experts per layer (overrides)."),
    Field(path="model.experts_per_token", flag="--experts-per-token", check=_count(1 << 16),
          help="MoE experts each token uses."),
    # ---- training ----------------------------------------------------------------------
    Field(path="training.seq", flag="--seq", check=_count(1 << 24),
          default=_train_default("seq"), help="Sequence length."),
    Field(path="training.micro_batch", flag="--micro-batch", check=_count(1 << 20),
          default=_train_default("micro_batch"), help="Sequences per GPU per forward."),
    Field(path="training.grad_accum", flag="--grad-accum", check=_count(1 << 20),
          default=_train_default("grad_accum"), help="Micro-batches per optimizer step."),
    Field(path="training.global_batch", flag="--global-batch", check=_count(1 << 30),
          help="Sequences per optimizer step over all GPUs: sets --grad-accum to "
          "ceil(global / (micro-batch x n))."),
    Field(path="training.precision", flag="--precision", check=_choice(Precision),
          choices=_names(Precision), default=_train_default("precision"),
          help="-amp keeps fp32 master weights; bf16 is pure bf16 params, grads and state."),
    Field(path="training.optimizer", flag="--optimizer", check=_choice(OptimizerKind),
          choices=_names(OptimizerKind), default=_train_default("optimizer"),
          help="onebit-adam, zero-one-adam, onebit-lamb: DeepSpeed's 1-bit optimizers "
          "(DeepSpeed <= 0.19.6; --strategy ddp only, DeepSpeed's stage-0 engine: their error "
          "buffers and the compressed all-reduce after the warm-up)."),
    Field(path="training.optimizer_impl", flag="--optimizer-impl", check=_choice(OptimizerImpl),
          choices=_names(OptimizerImpl), default=_train_default("optimizer_impl"),
          help="Step temporaries: foreach one state-sized copy, fused none, for-loop the "
          "largest tensor's."),
    Field(path="training.attention", flag="--attention", check=_choice(Attention),
          choices=_names(Attention), shown_default="the model's",
          help="sdpa: flash-style kernels; eager: materialized T x T scores. Default: what "
          "transformers runs for the model's family (eager for bloom and gemma2, which have "
          "no sdpa; a config.json's attn_implementation), else sdpa."),
    Field(path="training.grad_sync", flag="--grad-sync", check=_choice(GradSync),
          choices=_names(GradSync), default=_train_default("grad_sync"),
          help="With --grad-accum: reduce gradients every micro-batch, or only the last "
          "(DDP/FSDP no_sync, FSDP2 set_requires_gradient_sync(False): unsharded gradients "
          "stay on every GPU until then)."),
    Field(path="training.loss", flag="--loss", metavar="fp32|bf16|chunked[:N]|fused",
          check=parse_loss, default=(_train_default("loss"), _train_default("loss_chunks")),
          shown_default=str(_train_default("loss")),
          help="Cross-entropy: fp32 upcast of the logits (default), bf16 logits, chunked into "
          "N pieces each upcast on its own (torchtune; N default 8), or fused linear + loss "
          "(Liger)."),
    Field(path="training.transformers_version", flag="--transformers-version",
          metavar="X.Y[.Z]", check=parse_transformers_version, shown_default="recent",
          help="The transformers release of the model's own loss: where no autocast runs "
          "(DeepSpeed's bf16 module, pure bf16) it decides whether --loss fp32 upcasts the "
          "logits (Llama-style classes since 4.31, GPT-2/Falcon/BLOOM since 4.49) or takes "
          "cross-entropy in bf16 (docs/model.md \"Loss\"); and the default attention of a "
          "family that gained sdpa later (e.g. GPT-2 before 4.42: eager)."),
    Field(path="training.tf32", flag="--tf32", check=validate.boolean, is_flag=True,
          help="fp32 matmuls on TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32; "
          "the HF Trainer's tf32): an fp32 run's matmuls at the GPU's TF32 rate, not its "
          "fp32 rate (torch's default since 1.12). Changes step time only."),
    Field(path="training.keep_logits", flag="--keep-logits", check=validate.boolean,
          is_flag=True, help="The loop keeps the logits alive through backward (a reference "
          "held past the loss)."),
    Field(path="training.optimizer_in_backward", flag="--optimizer-in-backward",
          check=validate.boolean, is_flag=True,
          help="Each parameter is stepped by its own optimizer as soon as its gradient is "
          "accumulated, then its gradient is freed (torchtune optimizer_in_bwd: "
          "register_post_accumulate_grad_hook): no full gradient set is held. One GPU, "
          "one micro-batch per step."),
    Field(path="training.activation_offload", flag="--activation-offload",
          check=validate.boolean, is_flag=True,
          help="Saved activations copied to pinned host RAM in forward and brought back in "
          "backward (torchtune enable_activation_offloading, axolotl/TRL "
          "activation_offloading: OffloadActivations); the output layer and the loss stay "
          "on the GPU."),
    Field(path="training.activation_offload_impl", flag="--activation-offload-impl",
          check=_choice(OffloadImpl), choices=_names(OffloadImpl),
          default=_train_default("activation_offload_impl"),
          help="Whose OffloadActivations runs --activation-offload: torchtune's (its recipes) "
          "or TRL's copy (TRL, axolotl), which keeps a tensor saved twice on the GPU and "
          "never offloads a parameter's storage."),
    Field(path="training.compile", flag="--compile", check=_choice(CompileMode),
          choices=_names(CompileMode), default=_train_default("compile"),
          help="torch.compile: none, each transformer block (torchtitan), or the whole "
          "model."),
    Field(path="training.checkpoint_impl", flag="--checkpoint-impl",
          check=_choice(CheckpointImpl), choices=_names(CheckpointImpl),
          default=_train_default("checkpoint_impl"),
          help="Which torch.utils.checkpoint runs --checkpointing full: non-reentrant "
          "(use_reentrant=False: torchtune, accelerate, transformers 5; the recompute stops "
          "before the block's last matmul), non-reentrant-no-early-stop (early_stop=False: "
          "torchtitan since 2025-08-29; the whole block re-runs) or reentrant "
          "(use_reentrant=True: transformers before 5, LLaMA-Factory, axolotl; the whole "
          "block re-runs and its output is held through its backward)."),
    Field(path="training.sac_list", flag="--sac-list", check=_choice(SacList),
          choices=_names(SacList), default=_train_default("sac_list"),
          help="The op save list of --checkpointing selective: current (torchtitan since "
          "114151ad4, 2026-03-23: every compute-intensive op of torch's partitioner list "
          "saved, so biased linears' addmm outputs too; mm alternates) or pre-2026-03-23 "
          "(the per-model list: every other mm and the SDPA output)."),
    Field(path="training.sac_force_recompute", flag="--sac-force-recompute",
          metavar="MODULE,...|none", check=parse_module_names,
          default=_train_default("sac_force_recompute"), shown_default="moe.router.gate",
          help="torchtitan's force_recompute_mm_shapes_by_fqns under --checkpointing "
          "selective: the block linears (torchtitan's module names: attention.wq, "
          "attention.wo, feed_forward.w1, moe.router.gate, ...) whose weight shape is "
          "recomputed, never saved, and left out of the every-other-mm count; none: no "
          "linear forced (torchtitan before 2025-07-16)."),
    Field(path="training.float8", flag="--float8", check=_choice(Float8Recipe),
          choices=_names(Float8Recipe), default=_train_default("float8"),
          help="torchao float8 training of the blocks' linears (torchtitan's float8 "
          "converter, axolotl fp8): tensorwise, rowwise or rowwise_with_gw_hp scaling; the "
          "output head stays in bf16. Needs a GPU profile with an fp8 peak."),
    Field(path="training.float8_all_gather", flag="--float8-all-gather",
          check=validate.boolean, is_flag=True,
          help="With --float8 tensorwise under FSDP: all-gather the float8 linears' weights in "
          "float8 (torchao enable_fsdp_float8_all_gather): half the gathered bytes."),
    Field(path="training.allocator", flag="--allocator", check=_choice(Allocator),
          choices=_names(Allocator), default=_train_default("allocator"),
          help="CUDA caching allocator: default segments, or expandable "
          "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)."),
    Field(path="training.fsdp_version", flag="--fsdp", metavar="1|2", check=parse_fsdp_version,
          default=_train_default("fsdp_version"),
          help="FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard) for the FSDP "
          "strategies."),
    Field(path="training.param_dtype", flag="--param-dtype", check=_choice(Dtype),
          choices=_names(Dtype), shown_default="from --precision",
          help="FSDP MixedPrecisionPolicy param_dtype: the all-gathered parameters, the "
          "compute and the unsharded gradients (default: bf16/fp16 for -amp, else the "
          "storage dtype)."),
    Field(path="training.reduce_dtype", flag="--reduce-dtype", check=_choice(Dtype),
          choices=_names(Dtype), shown_default="from --precision",
          help="FSDP MixedPrecisionPolicy reduce_dtype: the reduce-scatter input, and FSDP2's "
          "accumulated unsynced gradients (default: fp32 for -amp, else param_dtype)."),
    Field(path="training.output_dtype", flag="--output-dtype", check=_choice(Dtype),
          choices=_names(Dtype), shown_default="none",
          help="FSDP MixedPrecisionPolicy output_dtype on the root module: the logits' dtype "
          "(default: no cast)."),
    Field(path="training.storage_dtype", flag="--storage-dtype", check=_choice(Dtype),
          choices=_names(Dtype), shown_default="from --precision",
          help="FSDP: the dtype the sharded parameters are stored in (the model as loaded), "
          "and so their gradients and optimizer state (default: fp32, bf16 for "
          "--precision bf16)."),
    Field(path="training.flat_params", flag="--flat-params", check=_choice(FlatParams),
          choices=_names(FlatParams), default=_train_default("flat_params"),
          help="FSDP1 (--fsdp 1) with frozen parameters (LoRA, --freeze): apart (default: "
          "trainable modules in FSDP units of their own, peft's fsdp_auto_wrap_policy) or "
          "mixed (use_orig_params=True, frozen and trainable tensors in one flat parameter "
          "per block: its gradient covers the whole flat parameter, frozen elements "
          "included)."),
    Field(path="training.init", flag="--init", check=_choice(InitMode),
          choices=_names(InitMode), default=_train_default("init"),
          help="How the weights reach the GPUs: meta-device init then sharded (default), "
          "rank 0 loads and broadcasts, or every rank loads the full model."),
    # ---- fine-tuning ---------------------------------------------------------------------
    Field(path="finetune.lora_rank", flag="--lora-rank", metavar="R",
          check=lambda raw: validate.count(raw, limit=1 << 16),
          help="LoRA adapters of rank R on a frozen base (peft): only they have gradients and "
          "optimizer state."),
    Field(path="finetune.lora_targets", flag="--lora-targets", metavar="q,v|attn|mlp|all-linear",
          check=parse_lora_targets, default=("q", "v"), shown_default="q,v",
          help="Linears that get adapters (peft's Llama default q,v)."),
    Field(path="finetune.lora_dtype", flag="--lora-dtype", metavar="fp32|base",
          check=parse_lora_dtype, default=True, shown_default="fp32",
          help="Adapters in fp32 (peft's autocast_adapter_dtype default) or the base's dtype "
          "(torchtune)."),
    Field(path="finetune.lora_dropout", flag="--lora-dropout", check=validate.boolean,
          is_flag=True, help="lora_dropout > 0: each adapter keeps its dropped input and mask."),
    Field(path="finetune.quantize_base", flag="--quantize-base", check=_choice(Quantize),
          choices=_names(Quantize), default=Quantize.NONE,
          help="QLoRA: the frozen base's linears in 4-bit NF4 or LLM.int8 (bitsandbytes)."),
    Field(path="finetune.double_quant", flag="--double-quant", check=validate.boolean,
          is_flag=True, default=True,
          help="NF4 constants quantized again (QLoRA recipes)."),
    Field(path="finetune.freeze", flag="--freeze",
          metavar="embeddings|N-layers|all-but-N-layers", check=parse_freeze,
          default=(False, 0, 0), shown_default="none",
          help="Full fine-tuning with frozen parts: the embeddings, the first N blocks, or "
          "all but the last N blocks."),
    Field(path="parallel.tp", flag="--tp", metavar="auto|N", check=parse_tp, default="auto",
          help="Tensor-parallel degree with sequence parallel, FSDP on the other mesh "
          "dimension (torchtitan). auto: TP 2/4/8 only when nothing fits without it (none "
          "under --pp)."),
    Field(path="parallel.pp", flag="--pp", metavar="N", check=_pp_degree, default=1,
          help="Pipeline-parallel degree (torch.distributed.pipelining as torchtitan runs it), "
          "FSDP2 over the data-parallel ranks of each stage, with --tp N tensor parallel "
          "and --cp N context parallel inside it; 1: none."),
    Field(path="parallel.pp_schedule", flag="--pp-schedule", check=parse_pp_schedule,
          metavar="gpipe|1f1b|interleaved-1f1b|interleaved-zb|zbv|dualpipev",
          shown_default="1f1b",
          help="Pipeline schedule (torchtitan's pipeline_parallel_schedule; zbv and dualpipev "
          "hold 2 stages per rank in a V; interleaved-zb, zbv and dualpipev split the "
          "backward). loopedbfs is not modelled."),
    Field(path="parallel.pp_microbatches", flag="--pp-microbatches", metavar="M",
          check=lambda raw: validate.count(raw, limit=1 << 16), shown_default="stages",
          help="Micro-batches per step of the pipeline, each of --micro-batch samples "
          "(torchtitan: local_batch_size / pipeline_parallel_microbatch_size). Default: the "
          "number of stages (pp x virtual stages)."),
    Field(path="parallel.pp_virtual_stages", flag="--pp-virtual-stages", metavar="V",
          check=lambda raw: validate.count(raw, limit=64), shown_default="1, or 2 for "
          "interleaved-1f1b",
          help="Pipeline stages per rank (torchtitan's default: 1 for gpipe and 1f1b, 2 for "
          "the multi-stage schedules)."),
    Field(path="parallel.pp_kept_outputs", flag="--pp-kept-outputs",
          check=_choice(PipeKeptOutputs), choices=_names(PipeKeptOutputs), shown_default="none",
          help="Stage outputs each micro-batch leaves to the step's end, by torch version: "
          "none (torch 2.13, torchtitan's return_outputs=False), last (the last stage's "
          "logits: return_outputs=True), all (every stage's output, the last stage's logits: "
          "torch before PR #153383, 2025-05, e.g. the Dec 2024 torch of torchtitan's 405B "
          "runs)."),
    # ---- context parallel (planner/context_parallel.py; docs/model.md "Context parallel")
    Field(path="parallel.cp", flag="--cp", metavar="N", check=_count(1024), default=1,
          help="Context-parallel degree: torch's context_parallel (ring attention, "
          "load-balanced sequence sharding), FSDP2 over dp_shard x cp (torchtitan). Each GPU "
          "holds seq / N tokens; 1: none."),
    Field(path="parallel.cp_rotate", flag="--cp-rotate", check=_choice(CpRotate),
          choices=_names(CpRotate), default=CpRotate.ALLGATHER,
          help="How CP's ring moves keys and values (torch's set_rotate_method): allgather "
          "(one all-gather, every rank's keys and values held) or alltoall (one chunk "
          "passed on per step)."),
    Field(path="parallel.cp_kv", flag="--cp-kv", check=_choice(CpKv),
          choices=_names(CpKv), default=CpKv.REPEATED,
          help="The key/value heads CP's SDPA is given: repeated (to every query head before "
          "SDPA: torchtitan's repeat_kv, torchtune) or grouped (the model's key/value heads, "
          "SDPA's enable_gqa: transformers' SDPA attention under accelerate's context "
          "parallel). The same for a model without grouped-query attention."),
    # ---- expert parallel (planner/expert_parallel.py; docs/model.md "Expert parallel")
    Field(path="parallel.ep", flag="--ep", metavar="N", check=_count(1024), default=1,
          help="Expert-parallel degree for MoE models: torchtitan's EP (each GPU owns "
          "experts / N routed experts, tokens sent to them by all-to-all), FSDP2 over every "
          "GPU for the rest (with --tp N: tensor parallel for the attention, each TP rank "
          "routing its own sequence shard; with --cp N: each GPU routing its seq / N "
          "tokens; with --pp M under gpipe or 1f1b: EP inside each stage's ranks). 1: none."),
    Field(path="parallel.ep_imbalance", flag="--ep-imbalance", metavar="X",
          check=lambda raw: validate.number(raw, low=1, high=1024), default=1.0,
          help="EP (dropless): rows the busiest GPU's experts receive over the balanced "
          "tokens x top_k (1: balanced routing; N: all of the group's on one GPU)."),
    Field(path="parallel.mesh", flag="--mesh", check=_choice(MeshMode),
          choices=_names(MeshMode), default=MeshMode.GIVEN.value,
          help="given: the --tp/--pp/--cp/--ep degrees as given. auto: search every modelled "
          "layout of the GPUs (TP 1/2/4/8 x CP, PP alone or x TP and/or x CP, EP alone, x TP "
          "or x CP for an MoE model) and plan "
          "the one that fits with the most "
          "tokens/s per GPU, the simpler within 2 % (fitcheck plan only; docs/model.md "
          "\"Mesh search\")."),
    # ---- DeepSpeed (the ZeRO candidates; DeepSpeed's defaults, docs/model.md "DeepSpeed ZeRO")
    Field(path="deepspeed.reduce_bucket_size", flag="--ds-reduce-bucket-size",
          metavar="N|auto", check=_ds_auto,
          help="Gradient bucket in elements (DeepSpeed default 5e8; auto: hidden^2 as the HF "
          "integration sets it). One bucket, two with overlap_comm under ZeRO-1/2."),
    Field(path="deepspeed.allgather_bucket_size", flag="--ds-allgather-bucket-size",
          metavar="N|auto", check=_ds_auto,
          help="ZeRO-1/2 parameter all-gather bucket (default 5e8): accepted, holds no memory "
          "with current torch (gathered into the flat parameter buffer)."),
    Field(path="deepspeed.overlap_comm", flag="--ds-overlap-comm", check=_ds_bool,
          is_flag=True, help="Overlap gradient reduction with backward (default: DeepSpeed's, "
          "on for ZeRO-3, off for ZeRO-1/2): a second bucket, more reductions in flight."),
    Field(path="deepspeed.contiguous_gradients", flag="--ds-contiguous-gradients",
          check=_ds_bool, is_flag=True,
          help="Copy gradients into the bucket as they are produced (DeepSpeed default on)."),
    Field(path="deepspeed.sub_group_size", flag="--ds-sub-group-size", metavar="N",
          check=parse_ds_elems,
          help="ZeRO-3: elements of the fp32 partition the optimizer steps at a time "
          "(default 1e9)."),
    Field(path="deepspeed.stage3_prefetch_bucket_size", flag="--ds-prefetch-bucket-size",
          metavar="N|auto", check=_ds_auto,
          help="ZeRO-3: parameters gathered ahead of use, elements (default 5e7; auto: "
          "0.9 hidden^2)."),
    Field(path="deepspeed.stage3_param_persistence_threshold",
          flag="--ds-param-persistence-threshold", metavar="N|auto", check=_ds_auto,
          help="ZeRO-3: parameters smaller than this stay whole on every GPU (default 1e5; "
          "auto: 10 hidden)."),
    Field(path="deepspeed.stage3_max_live_parameters", flag="--ds-max-live-parameters",
          metavar="N", check=parse_ds_elems,
          help="ZeRO-3: caps the gathered parameters the prefetcher keeps (default 1e9)."),
    Field(path="deepspeed.stage3_max_reuse_distance", flag="--ds-max-reuse-distance",
          metavar="N", check=parse_ds_elems,
          help="ZeRO-3: parameters used again within this many elements stay gathered "
          "(default 1e9; accepted, not modelled beyond the prefetch bucket)."),
    Field(path="deepspeed.stage3_gather_16bit_weights_on_model_save",
          flag="--ds-gather-16bit-on-save", check=_ds_bool, is_flag=True,
          help="ZeRO-3: saving gathers a 16-bit state dict into rank 0's host RAM (the whole "
          "model; checked against host RAM, outside the step)."),
    Field(path="deepspeed.zero_init", flag="--ds-zero-init", check=_ds_bool, is_flag=True,
          help="ZeRO-3: the model is built under deepspeed.zero.Init (default; the HF "
          "integration does so). --no-ds-zero-init: every rank builds the full model and "
          "the engine moves it to its GPU before partitioning."),
    # ZeRO++ (ZeRO-3 only; docs/model.md "ZeRO++", docs/throughput.md "ZeRO++")
    Field(path="deepspeed.zero_quantized_weights", flag="--ds-zero-quantized-weights",
          check=_ds_bool, is_flag=True,
          help="ZeRO++ qwZ (ZeRO-3): parameter all-gathers in int8 with per-group scales, "
          "half the bytes of a 16-bit gather; the int8 and dequantized fp16 copies of the "
          "module being gathered are extra memory."),
    Field(path="deepspeed.zero_hpz_partition_size", flag="--ds-hpz-partition-size",
          metavar="N", check=_hpz_size,
          help="ZeRO++ hpZ (ZeRO-3): a secondary 16-bit parameter shard over N GPUs (a "
          "node; N divides the GPUs per node), 1/N of the model per GPU, so every gather but "
          "the first forward's stays inside the node. 0 or 1: off (default)."),
    Field(path="deepspeed.zero_quantized_gradients", flag="--ds-zero-quantized-gradients",
          check=_ds_bool, is_flag=True,
          help="ZeRO++ qgZ (ZeRO-3, more than one node): gradients reduced by int4 "
          "all-to-alls inside the node then across nodes, a quarter of the bytes of a 16-bit "
          "reduce-scatter."),
    Field(path="deepspeed.fused_adam", flag="--ds-fused-adam", check=_ds_bool, is_flag=True,
          help="DeepSpeed's own optimizer (a config optimizer block: FusedAdam, no step "
          "temporaries; default). --no-ds-fused-adam: the client's torch optimizer "
          "(--optimizer-impl decides its temporaries), as the HF Trainer without one."),
    Field(path="deepspeed.offload_device", flag="--ds-offload-device",
          check=lambda raw: validate.choice(raw, _OffloadDevice),
          choices=("cpu", "nvme"), shown_default="cpu",
          help="ZeRO-3 offload target: cpu (ZeRO-Offload) or nvme (ZeRO-Infinity: host RAM "
          "holds only the swapper's pinned buffers)."),
    Field(path="deepspeed.grad_accum_dtype", flag="--ds-grad-accum-dtype",
          check=_choice(Dtype), choices=_names(Dtype), shown_default="the model's",
          help="data_types.grad_accum_dtype. fp32 with --precision bf16-amp on zero1 without "
          "offload: DeepSpeed's BF16_Optimizer (a full-size fp32 gradient buffer, 4 B/param, "
          "beside the bf16 grads); ZeRO-2/3 do not read it."),
    Field(path="deepspeed.bf16_master_weights_and_grads",
          flag="--ds-bf16-master-weights-and-grads", check=_ds_bool, is_flag=True,
          help="bf16.bf16_master_weights_and_grads: the ZeRO master partition and the "
          "gradient partition it steps in bf16 (2 B instead of 4). Without "
          "--ds-bf16-optimizer-states DeepSpeed needs optimizer offload (DeepSpeedCPUAdam)."),
    Field(path="deepspeed.bf16_optimizer_states", flag="--ds-bf16-optimizer-states",
          check=_ds_bool, is_flag=True,
          help="bf16.bf16_optimizer_states: the optimizer's moments in bf16 too (needs "
          "--ds-bf16-master-weights-and-grads)."),
    Field(path="deepspeed.local_step_clipper", flag="--ds-local-step-clipper",
          check=_count(1 << 20), metavar="N", shown_default="16",
          help="--optimizer zero-one-adam: 0/1 Adam's local_step_clipper, the most steps "
          "between two all-reduces after var_freeze_step (the step time is their average)."),
    # ---- hardware ----------------------------------------------------------------------
    Field(path="hardware.gpu", flag="--gpu", metavar="NAME|PATH", check=validate.text, files=True,
          help="GPU profile id (see --list-gpus) or a path to a TOML profile."),
    Field(path="hardware.n", flag="--n", check=_count(1 << 20), default=1,
          help="Total GPUs."),
    Field(path="hardware.gpus_per_node", flag="--gpus-per-node", check=_count(4096),
          help="Default: the profile's."),
    Field(path="hardware.host_ram_gib", flag="--host-ram-gib",
          check=lambda raw: validate.number(raw, low=0, high=1 << 24, low_open=True),
          help="Host RAM per node in GiB (default: the profile's); checked for offload."),
    # ---- candidates and options --------------------------------------------------------
    Field(path="strategy", flag="--strategy", metavar="NAME[,NAME]", check=parse_strategies,
          multiple=True, choices=_names(Strategy),
          help="Candidates (repeat or comma-separate): " + ", ".join(_names(Strategy))
          + ". Default: all."),
    Field(path="offload", flag="--offload", check=_choice(Offload, ("auto",)),
          choices=("auto",) + _names(Offload), default="auto",
          help="auto: none, and offload candidates only when nothing else fits."),
    Field(path="checkpointing", flag="--checkpointing", check=_choice(Checkpointing),
          choices=_names(Checkpointing), default=Checkpointing.AUTO,
          help="Activation checkpointing; auto: the lightest that fits, per strategy."),
    Field(path="margin", flag="--margin",
          check=lambda raw: validate.number(raw, low=0, high=1, high_open=True),
          default=DEFAULT_MARGIN, help="Fraction of GPU memory kept free, your own headroom "
          "(default 0: the verdict's interval already covers the planner's measured error, "
          "docs/accuracy.md)."),
    Field(path="at_risk", flag="--at-risk", check=lambda raw: _at_risk(raw),
          metavar="admit|reject|warn|P", default=DEFAULT_AT_RISK,
          help="A job at risk (the interval of its need straddles the usable memory; the "
          "probability of running out of memory is printed): admit it, reject it, warn "
          "(admit with a warning), or a probability P (0.5, 50%): reject when the job's "
          "probability of running out of memory is at least P, else warn. Decides the gate's "
          "verdict and, when nothing fits for sure, the exit code (0 or 3)."),
    Field(path="calibration", flag="--calibration", metavar="FILE|auto|none",
          check=validate.text, default="auto", files=True,
          help="Fitted runtime terms (docs/calibration.md): a calibration file, auto (the one "
          "for this GPU and torch version, if any), or none (raw model)."),
)

BY_PATH: dict[str, Field] = {f.path: f for f in FIELDS}
SECTIONS: dict[str, tuple[str, ...]] = {}
for _f in FIELDS:
    SECTIONS.setdefault(_f.section, ())
    SECTIONS[_f.section] += (_f.key,)
TOP_KEYS: tuple[str, ...] = tuple(s for s in SECTIONS if s) + SECTIONS[""]


@dataclass(frozen=True, slots=True)
class Naming:
    """How a front end names fields in messages, and which error it raises."""

    name: Callable[[str], str]
    error: type[FitcheckError]

    def fail(self, path: str, message: str) -> FitcheckError:
        return self.error(f"{self.name(path)}: {message}")


FLAGS = Naming(lambda path: BY_PATH[path].flag if path in BY_PATH else path, UsageError)
"""Command line: '--seq: must be ...', exit 2."""


class SpecError(InputDataError):
    """A job spec is malformed: unknown keys, wrong types or values (exit 4)."""


SPEC = Naming(lambda path: path, SpecError)
"""Gate specs and job configs: 'training.seq: must be ...', exit 4."""


def parse(values: Mapping[str, Any], naming: Naming) -> dict[str, Any]:
    """{path: raw} -> {path: typed} for every field (defaults filled in, None = not given)."""
    out: dict[str, Any] = {}
    for f in FIELDS:
        raw = values.get(f.path)
        if raw is None or (f.multiple and raw in ((), [])):
            out[f.path] = f.default
            continue
        try:
            out[f.path] = f.check(raw)
        except ValueError as exc:
            raise naming.fail(f.path, str(exc)) from None
    return out


def _unknown(where: str, given: Mapping[Any, Any], allowed: tuple[str, ...]) -> None:
    bad = [k for k in given if k not in allowed]
    if not bad:
        return
    import difflib

    hints = []
    for k in bad:
        if not isinstance(k, str):
            continue
        alt = k.replace("-", "_").lower()
        if alt in allowed:
            hints.append(f"{k!r} -> {alt!r}")
        else:
            close = difflib.get_close_matches(alt, allowed, n=1, cutoff=0.8)
            if close:
                hints.append(f"{k!r} -> {close[0]!r}?")
    prefix = f"{where}: unknown key" if where else "spec: unknown key"
    msg = (f"{prefix}{'s' if len(bad) > 1 else ''} {', '.join(repr(k) for k in bad)}; "
           f"allowed: {', '.join(allowed)}")
    if hints:
        msg += f" (did you mean {', '.join(hints)})"
    raise SpecError(msg)


def spec_values(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A nested spec ({"model": {...}, "training": {...}, "strategy": ...}) -> {path: raw}.
    Unknown keys are a SpecError naming them (with a hint when one is close)."""
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec: must be a mapping, got {validate._type(spec)}")
    _unknown("", spec, TOP_KEYS)
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key in SECTIONS and key:
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise SpecError(f"{key}: must be a mapping, got {validate._type(value)} "
                                f"{validate._show(value)}")
            _unknown(key, value, SECTIONS[key])
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def cli_values(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """click's keyword arguments -> {path: raw}."""
    return {f.path: kwargs.get(f.dest) for f in FIELDS if f.dest in kwargs}
