"""One typed request, built by one function from whatever the user gave.

``build_request`` takes the flat ``{path: raw value}`` mapping that every front end produces
(planner/fields.py: command-line flags, gate specs, job configs) and returns a ``Request``:
the model, the training run, the cluster, the options of the search and the runtime terms.
The planner (plan, find), the gate, the report and the probes all start from it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.errors import InputDataError
from planner.notices import Kind, Notice
from planner.fields import FIELDS, FLAGS, Naming, parse
from planner.memory.breakdown import Overheads
from planner.error_bands import DEFAULT_AT_RISK, DEFAULT_MARGIN
from planner.spec import (
    Checkpointing,
    Cluster,
    CompileMode,
    DeepSpeedConfig,
    FineTune,
    FlatParams,
    Float8Recipe,
    GpuProfile,
    MlpKind,
    ModelSpec,
    Offload,
    OffloadImpl,
    PipeKeptOutputs,
    PipeSchedule,
    Pipeline,
    Precision,
    Quantize,
    Strategy,
    TracedModel,
    TrainingSpec,
)
from planner import pipeline
from planner.candidates import tp_problem
from planner.context_parallel import CP_STRATEGIES, cp_problem
from planner.expert_parallel import EP_STRATEGIES, ep_problem, ep_tp_problem
from planner.memory.zero import zeropp_problem
from planner.params import trainable
from planner.throughput import DEFAULT_ASSUMPTIONS, ThroughputAssumptions


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    """What to search over and how strictly."""

    strategies: tuple[Strategy, ...] = tuple(Strategy)
    offloads: tuple[Offload, ...] | None = None
    """None: no offload, and offload candidates only when nothing else fits."""
    checkpointing: Checkpointing = Checkpointing.AUTO
    margin: float = DEFAULT_MARGIN
    """Fraction of device memory kept free (the user's own headroom; default none)."""
    at_risk: str = DEFAULT_AT_RISK
    """What a verdict does with a job at risk: admit, reject or warn (planner/gate.py)."""
    global_batch: int | None = None
    """Sequences per optimizer step over all GPUs; sets grad_accum (pure data parallel)."""
    tp: int | None = 1
    """Tensor-parallel degree of the FSDP candidates; None: 1, and 2/4/8 when nothing fits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    """The terms no parameter count predicts, and where they came from."""

    overheads: Overheads = field(default_factory=Overheads)
    assumptions: ThroughputAssumptions = DEFAULT_ASSUMPTIONS
    """The step-time model's free terms (defaults, or a calibration's)."""
    calibration: dict[str, Any] | None = None
    """Which calibration the overheads, profile and assumptions came from: id, source, stale."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    model: ModelSpec
    training: TrainingSpec
    cluster: Cluster
    options: Options = field(default_factory=Options)
    runtime: Runtime = field(default_factory=Runtime)
    model_source: str = "explicit"
    """Where the model came from: params, preset, config, explicit, or trace."""
    traced: TracedModel | None = None
    """A model known by its traced module (``build_request(..., traced=)``): its own counts;
    ``model`` then holds only its depth and the widths it knows (TracedModel.proxy_spec)."""
    warnings: tuple[Notice, ...] = ()
    """What the request assumed, each line with its kind (planner/notices.py)."""
    attention: str = ""
    """Which attention and why, for the assumptions ("" when not stated: sdpa, no family)."""

    def resolved(self) -> Request:
        """grad_accum from global_batch: ceil(global_batch / (micro_batch x n_gpus))."""
        gb = self.options.global_batch
        if gb is None:
            return self
        # a context-parallel group shares each sequence (planner/context_parallel.py)
        per_step = self.training.micro_batch * (self.cluster.n_gpus // self.training.cp)
        return self.with_training(grad_accum=max(1, -(-gb // per_step)))

    def with_training(self, **changes: Any) -> Request:
        return dataclasses.replace(self, training=dataclasses.replace(self.training, **changes))

    def with_options(self, **changes: Any) -> Request:
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **changes))

    def with_gpus(self, n: int) -> Request:
        return dataclasses.replace(self, cluster=dataclasses.replace(self.cluster, n_gpus=n))


# ---------------------------------------------------------------------------------------------
# The model


SHAPE_FIELDS = {  # spec key -> ModelSpec field
    "layers": "n_layers", "hidden": "hidden", "heads": "n_heads", "kv_heads": "n_kv_heads",
    "ffn": "ffn_hidden", "vocab": "vocab", "tied_embeddings": "tied_embeddings", "mlp": "mlp",
    "experts": "n_experts", "experts_per_token": "experts_per_token",
}


def llama_ffn(hidden: int) -> int:
    """Llama's rule: 2/3 of 4h for SwiGLU, rounded up to a multiple of 256 (Touvron et al.
    2023, and the reference implementation's ``multiple_of``)."""
    f = int(2 * 4 * hidden / 3)
    return 256 * -(-f // 256)


def resolve_model(v: Mapping[str, Any], naming: Naming, *, allow_files: bool,
                  base_dir: str | None,
                  warnings: list[str] | None = None) -> tuple[ModelSpec, str]:
    """The model and a word for where its shape came from: params, preset, config, explicit.
    ``warnings`` collects the accepted approximations of a config (model.approximate)."""
    given = [p for p in ("model.params", "model.preset", "model.config") if v.get(p) is not None]
    if len(given) > 1:
        raise naming.error(f"give only one of {', '.join(naming.name(p) for p in given)}")
    ov_paths = [p for p in v if p.startswith("model.") and p.split(".")[1] in SHAPE_FIELDS
                and v[p] is not None]
    ov = {SHAPE_FIELDS[p.split('.')[1]]: v[p] for p in ov_paths}
    if v.get("model.params") is not None:
        from planner.scaling import shape_from_params

        try:
            spec, source = shape_from_params(v["model.params"]), "params"
        except ValueError as exc:
            raise naming.fail("model.params", str(exc)) from None
    elif v.get("model.preset") is not None:
        from planner.presets import UnknownModelError, get_preset

        try:
            spec, source = get_preset(v["model.preset"]), "preset"
        except UnknownModelError as exc:
            raise naming.fail("model.preset", str(exc.args[0] if exc.args else exc)) from None
    elif isinstance(v.get("model.config"), dict):
        # the config.json mapping itself (a webhook annotation cannot name a file)
        from planner.hf_config import ConfigError, spec_from_hf_config

        shape = [p for p in ov_paths if p != "model.config"]
        if shape:
            raise naming.error(f"give only one of {naming.name('model.config')} (inline) and "
                               f"{naming.name(shape[0])}")
        label = f"{naming.name('model.config')} (inline config.json)"
        try:
            return spec_from_hf_config(v["model.config"], label, notes=warnings,
                                       approximate=bool(v.get("model.approximate"))), "config"
        except ConfigError as exc:
            raise naming.error(str(exc)) from None
    elif v.get("model.config") is not None:
        from planner.hf_config import ConfigError, load_hf_config

        if not allow_files:
            raise naming.fail("model.config", "file paths are not accepted here; give "
                              "model.preset or the shape fields")
        path = os.path.expanduser(v["model.config"])
        if base_dir is not None and not os.path.isabs(path):
            path = os.path.join(base_dir, path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise naming.fail("model.config", f"no such file: {v['model.config']!r}")
        try:
            spec, source = load_hf_config(path, notes=warnings,
                                          approximate=bool(v.get("model.approximate"))), "config"
        except ConfigError as exc:
            raise InputDataError(str(exc)) from None
    else:
        missing = [p for p in ("model.layers", "model.hidden", "model.heads", "model.vocab")
                   if v.get(p) is None]
        if missing:
            raise naming.error(
                "describe the model with one of "
                f"{', '.join(naming.name(p) for p in ('model.params', 'model.preset', 'model.config'))}"
                f", or explicit shape fields (missing: {', '.join(naming.name(p) for p in missing)})")
        mlp = MlpKind(ov.get("mlp", MlpKind.SWIGLU))
        hidden = ov["hidden"]
        base = dict(name="custom", n_layers=ov["n_layers"], hidden=hidden, n_heads=ov["n_heads"],
                    n_kv_heads=ov.get("n_kv_heads", ov["n_heads"]),
                    ffn_hidden=ov.get("ffn_hidden", llama_ffn(hidden) if mlp.gated else 4 * hidden),
                    vocab=ov["vocab"], mlp=mlp)
        try:
            return ModelSpec(**base, **{k: x for k, x in ov.items() if k not in base}), "explicit"
        except ValueError as exc:
            raise naming.error(f"model shape: {exc}") from None
    if ov:
        if "n_heads" in ov and "n_kv_heads" not in ov and spec.n_kv_heads == spec.n_heads:
            ov["n_kv_heads"] = ov["n_heads"]  # multi-head attention stays multi-head
        try:
            spec = dataclasses.replace(spec, **ov, name=f"{spec.name}+overrides")
        except ValueError as exc:
            raise naming.error(f"model shape: {exc}") from None
    return spec, source


# ---------------------------------------------------------------------------------------------
# Hardware and calibration


def resolve_gpu(value: str | None, naming: Naming, *, allow_files: bool,
                base_dir: str | None) -> GpuProfile:
    from planner.hardware import ProfileError, load_gpu
    from planner.validate import looks_like_path

    if value is None:
        raise naming.fail("hardware.gpu", "required (a profile id such as h100-80, or a TOML "
                          "file; see fitcheck --list-gpus)")
    try:
        return load_gpu(value, allow_files=allow_files, base_dir=base_dir)
    except ProfileError as exc:
        if looks_like_path(value) and allow_files:
            raise InputDataError(str(exc)) from None  # a bad file: exit 4
        raise naming.fail("hardware.gpu", str(exc)) from None


def resolve_cluster(gpu: GpuProfile, n: int, gpus_per_node: int | None,
                    host_ram_gib: float | None, naming: Naming = FLAGS) -> Cluster:
    gpn = gpus_per_node if gpus_per_node is not None else gpu.gpus_per_node
    if n > gpn and n % gpn:
        raise naming.error(f"{naming.name('hardware.n')} ({n}) must be a multiple of "
                           f"{naming.name('hardware.gpus_per_node')} ({gpn}) past one node")
    host = int(host_ram_gib * 2**30) if host_ram_gib is not None else gpu.host_ram_bytes_per_node
    return Cluster(gpu=gpu, n_gpus=n, gpus_per_node=gpn, host_ram_bytes_per_node=host)


def resolve_runtime(choice: str, gpu: GpuProfile, model: ModelSpec | None, naming: Naming, *,
                    allow_files: bool) -> tuple[Runtime, GpuProfile]:
    """--calibration FILE|auto|none -> the runtime terms (and the profile, whose context and
    efficiency a calibration may replace). A bad file is InputDataError (exit 4)."""
    if choice == "none":
        return Runtime(), gpu
    from planner.calibration_paths import any_calibration_for

    if choice == "auto" and not any_calibration_for(gpu.id):
        return Runtime(), gpu
    from planner import calibration as cal_mod

    torch_version = cal_mod.installed_torch_version()
    if choice == "auto":
        cal = cal_mod.find_calibration(gpu.id, torch_version)
        if cal is None:
            return Runtime(), gpu
    else:
        if not allow_files:
            raise naming.fail("calibration", "file paths are not accepted here; use auto or "
                              "none")
        if not os.path.isfile(choice):
            raise naming.fail("calibration", f"no such file: {choice!r} (or use auto / none)")
        cal = cal_mod.load_calibration(choice)
    overheads, gpu = cal_mod.apply(cal, Overheads(), gpu, model=model)
    info = {"id": cal.id, "source": _calibration_source(cal.path or choice, choice),
            "explicit": choice != "auto", "stale": cal_mod.is_stale(cal, torch_version)}
    return Runtime(overheads=overheads,
                   assumptions=cal_mod.apply_throughput(cal, DEFAULT_ASSUMPTIONS),
                   calibration=info), gpu


def _calibration_source(path: str, choice: str) -> str:
    """Where a calibration came from, as the user can read it: the path given, or for one
    that ``auto`` found in the package, its place in the source tree (not this machine's
    install path)."""
    from hardware_profiles import CALIBRATION_DIR

    if choice == "auto" and os.path.dirname(os.path.abspath(path)) == \
            os.path.abspath(CALIBRATION_DIR):
        return "hardware_profiles/calibrations/" + os.path.basename(path)
    return path


# ---------------------------------------------------------------------------------------------
# The request


def training_from(v: Mapping[str, Any]) -> TrainingSpec:
    """The training run from parsed fields (``fields.parse``): every ``training.*`` field
    whose key is a ``TrainingSpec`` attribute is passed as it is (a new training input is a
    field and an attribute, nothing here), the loss splits into kind and chunks, fine-tuning
    and DeepSpeed are built from their sections."""
    loss, chunks = v["training.loss"]
    emb, first, last = v["finetune.freeze"]
    rank = v["finetune.lora_rank"] or 0
    finetune = FineTune(
        lora_rank=rank, lora_targets=v["finetune.lora_targets"],
        lora_fp32=v["finetune.lora_dtype"], lora_dropout=bool(v["finetune.lora_dropout"]),
        quantize_base=v["finetune.quantize_base"], double_quant=bool(v["finetune.double_quant"]),
        freeze_embeddings=emb, freeze_layers=first, train_last_layers=last)
    given = {key: bool(v[path]) if flag else v[path] for path, key, flag in _training_fields()
             if not (key == "attention" and v[path] is None)}  # the model's: job_from
    return TrainingSpec(**given, loss=loss, loss_chunks=chunks, finetune=finetune,
                        deepspeed=deepspeed_from(v), cp=v["parallel.cp"],
                        cp_rotate=v["parallel.cp_rotate"], cp_kv=v["parallel.cp_kv"],
                        ep=v["parallel.ep"],
                        ep_imbalance=float(v["parallel.ep_imbalance"]))


def fsdp2_only(v: Mapping[str, Any], naming: Naming, what: str, how: str,
               allowed: tuple[Strategy, ...]) -> Any:
    """The strategies asked for (None: none asked) where ``what`` runs under FSDP2 only
    without offload, or one error naming the field: a strategy outside ``allowed`` or an
    offload (context and expert parallel as torchtitan runs them)."""
    asked = v["strategy"]
    other = [str(s) for s in asked or () if s not in allowed]
    if other:
        raise naming.fail("strategy", f"{', '.join(other)} with {what} is not modelled "
                          f"({how}: " + ", ".join(str(s) for s in allowed) + ")")
    if v["offload"] not in ("auto", Offload.NONE):
        raise naming.fail("offload", f"{v['offload']} with {what} is not modelled")
    return asked


def cp_options(v: Mapping[str, Any], model: ModelSpec, training: TrainingSpec,
               cluster: Cluster, options: Options, naming: Naming) -> Options:
    """The search options under context parallel, or one error naming the field: CP is
    modelled as torchtitan runs it, FSDP2 over dp_shard x cp without CPU offload, so the
    strategies are the FSDP ones (any other asked for is refused) and offload is none; TP
    composes only at a given degree (``--tp auto`` tries none)."""
    tp = options.tp or 1
    problem = cp_problem(model, training, cluster.n_gpus, tp)
    if problem:
        raise naming.fail("parallel.cp", problem)
    asked = fsdp2_only(v, naming, "context parallel", "CP runs under FSDP2 over dp_shard x cp",
                       CP_STRATEGIES)
    # under a pipeline the strategies are already the pipeline's (FSDP2 full_shard inside
    # each stage: pipeline_cluster_problem)
    default = options.strategies if training.pipeline.enabled else CP_STRATEGIES
    return dataclasses.replace(options, strategies=asked or default,
                               offloads=(Offload.NONE,), tp=tp)


CP_ONLY = {"parallel.cp_rotate": "cp_rotate", "parallel.cp_kv": "cp_kv"}
"""Fields read only by context parallel's ring (planner/context_parallel.py): their
TrainingSpec attributes."""


def cp_inert(values: Mapping[str, Any], training: TrainingSpec, naming: Naming) -> list[Notice]:
    """A warning per context-parallel option given while the degree is 1: the ring it
    configures does not run (torchtitan's configs carry the rotate method at degree 1, so this
    is no error)."""
    if training.cp > 1:
        return []
    return [Notice(f"{naming.name(path)} {getattr(training, attr)} has no effect at context "
                   f"parallel degree 1 ({naming.name('parallel.cp')}): no ring to configure",
                   Kind.INERT)
            for path, attr in CP_ONLY.items() if values.get(path) is not None]


def sac_force_notes(model: ModelSpec, training: TrainingSpec, naming: Naming) -> list[Notice]:
    """``training.sac_force_recompute`` against the model's blocks (planner/sac.py): one error
    naming the field for an entry fitcheck cannot resolve, a warning for one that matches no
    linear of this model (torchtitan forces nothing for it; its own default in a dense model
    is not worth a line)."""
    from planner import sac

    entries = training.sac_force_recompute
    why = sac.problem(model, entries)
    if why:
        raise naming.fail("training.sac_force_recompute", why)
    return [Notice(f"{naming.name('training.sac_force_recompute')}: {e!r} matches no linear "
                   "of this model's blocks: nothing recomputed for it (as in torchtitan)",
                   Kind.INERT)
            for e in sac.no_effect(model, entries) if e not in sac.DEFAULT]


TRAINING_ATTRS = frozenset(f.name for f in dataclasses.fields(TrainingSpec))
"""The attributes of a training run: a ``training.*`` field of one of these names sets it."""


def flat_params_problem(training: TrainingSpec, name: Any = str) -> str | None:
    """Why ``--flat-params mixed`` cannot be (None: it can, or it is not asked for). FSDP1
    flattens a unit's tensors into one FlatParameter of one dtype (``_flat_param.py``
    ``_validate_tensors_to_flatten``: "Must flatten tensors with uniform dtype", "Cannot
    flatten integer dtype tensors")."""
    if training.flat_params is not FlatParams.MIXED:
        return None
    if training.fsdp_version != 1:
        return (f"mixed is FSDP1's flat parameter ({name('training.fsdp_version')} 1); FSDP2 "
                "shards every parameter on its own")
    ft = training.finetune
    if ft.quantize_base is not Quantize.NONE:
        return "a quantized base cannot share a flat parameter with its float adapters"
    if ft.lora and ft.lora_fp32:
        return ("fp32 adapters cannot share a flat parameter with a bf16 base (one dtype per "
                f"flat parameter): give {name('finetune.lora_dtype')} base, or apart")
    return None


def deepspeed_problem(training: TrainingSpec, offload: Any,
                      name: Any = str) -> tuple[str, str] | None:
    """The field and why DeepSpeed would refuse the bf16 master settings (None: it would not), as
    ``runtime/config.py`` ``_do_error_check`` and ``base_optimizer.py``
    ``_configure_master_weights`` (0.19.6-0.19.8) assert."""
    ds = training.deepspeed
    master = name("deepspeed.bf16_master_weights_and_grads")
    if ds.bf16_optimizer_states and not ds.bf16_master_weights_and_grads:
        return ("deepspeed.bf16_optimizer_states",
                f"bf16 optimizer states need bf16 master weights ({master})")
    if not ds.bf16_master_weights_and_grads:
        return None
    if training.precision is not Precision.BF16_AMP:
        return ("deepspeed.bf16_master_weights_and_grads",
                f"bf16 master weights are DeepSpeed's bf16 mode "
                f"({name('training.precision')} bf16-amp), got {training.precision}")
    if not ds.bf16_optimizer_states and (offload == Offload.NONE or not ds.fused_adam):
        return ("deepspeed.bf16_master_weights_and_grads",
                f"without {name('deepspeed.bf16_optimizer_states')} the optimizer states "
                "stay fp32, which DeepSpeed allows only under ZeRO-Offload with "
                f"DeepSpeedCPUAdam ({name('offload')} optimizer or params_and_optimizer, "
                f"{name('deepspeed.fused_adam')})")
    return None


def onebit_problem(training: TrainingSpec, strategies: Any, offload: Any, tp: Any,
                   name: Any = str) -> tuple[str, str] | None:
    """(field, why) DeepSpeed would not run a 1-bit optimizer here (None: it would). They are
    DeepSpeed's own, on its stage-0 engine: ``engine.py`` ``_configure_basic_optimizer``
    asserts "1bit-Adam is not compatible with ZeRO" (0/1 Adam, 1bit-Lamb alike), offload
    needs ZeRO, and FSDP is not DeepSpeed. Tensor, pipeline, context and expert parallel
    with them are not modelled (the engine's ``mpu`` groups)."""
    from planner.onebit import ENGINE_NAMES

    who = ENGINE_NAMES[training.optimizer]
    other = [s for s in (strategies or ()) if s is not Strategy.DDP]
    if other:
        zero = [s for s in other if s.is_zero]
        why = (f"DeepSpeed: \"{who} is not compatible with ZeRO\" (engine.py "
               "_configure_basic_optimizer)" if zero else
               f"{who} is DeepSpeed's optimizer, on its stage-0 engine only (ddp)")
        return ("strategy", f"{other[0]} with {name('training.optimizer')} "
                f"{training.optimizer}: {why}")
    if offload not in ("auto", Offload.NONE, None):
        return ("offload", f"{offload} with {name('training.optimizer')} {training.optimizer}: "
                f"DeepSpeed offloads under ZeRO only, and \"{who} is not compatible with ZeRO\"")
    for path, on in (("parallel.tp", tp not in ("auto", 1, None)),
                     ("parallel.pp", training.pipeline.enabled),
                     ("parallel.cp", training.cp > 1), ("parallel.ep", training.ep > 1)):
        if on:
            return (path, f"NOT MODELLED with {name('training.optimizer')} "
                    f"{training.optimizer} (DeepSpeed's 1-bit optimizers are planned on "
                    "data parallel alone)")
    return None


def in_backward_problem(training: TrainingSpec, n_gpus: int, strategies: Any, offload: Any,
                        name: Any = str) -> tuple[str, str] | None:
    """(field, why) when ``--optimizer-in-backward`` cannot be planned; None when it can or
    is not asked. torchtune refuses it with gradient accumulation and with gradient clipping
    (recipes/full_finetune_single_device.py:146-157 at 1814feb17); only its full-finetune
    recipes read it (not the LoRA ones). Modelled on one GPU: torchtune's distributed recipes
    run it under FSDP2, whose post-backward calls the sharded parameters' hooks after each
    reduce-scatter (torch ``_fsdp_collectives.py`` ``foreach_reduce``): not modelled, nor
    DeepSpeed (its engine steps its own optimizer), nor offload."""
    if not training.optimizer_in_backward:
        return None
    flag = name("training.optimizer_in_backward")
    if training.grad_accum > 1:
        return ("training.grad_accum", f"{training.grad_accum} with {flag}: every gradient is "
                "stepped and freed as it is accumulated, so there is nothing to accumulate "
                "into (torchtune: \"Gradient accumulation is not supported with optimizer in "
                "bwd\")")
    if n_gpus > 1:
        return ("hardware.n", f"{n_gpus} GPUs with {flag} are NOT MODELLED (one GPU only: "
                "under FSDP2 each parameter steps after its unit's reduce-scatter)")
    other = [s for s in (strategies or ()) if s is not Strategy.DDP]
    if other:
        return ("strategy", f"{other[0]} with {flag} is NOT MODELLED (one GPU, no sharding)")
    if offload not in ("auto", Offload.NONE, None):
        return ("offload", f"{offload} with {flag} is NOT MODELLED")
    if not training.finetune.full:
        return ("training.optimizer_in_backward", "with LoRA or frozen parameters is NOT "
                "MODELLED (torchtune's LoRA recipes do not read optimizer_in_bwd)")
    if training.compile is CompileMode.MODEL:
        return ("training.compile", f"model with {flag} is NOT MODELLED (one compiled "
                "backward returns every gradient at once)")
    if training.optimizer.onebit:
        return ("training.optimizer", f"{training.optimizer} with {flag}: DeepSpeed's "
                "optimizer steps in its engine, not in a hook")
    return None


def float8_problem(model: ModelSpec, training: TrainingSpec, gpu: GpuProfile
                   ) -> tuple[str, str] | None:
    """(field, why) when ``--float8`` cannot be planned; None when it can or is not asked.
    torchao refuses float8 all-gather with rowwise scaling (``Float8LinearConfig.__post_init__``:
    "enable_fsdp_float8_all_gather only supports tensorwise scaling granularity")."""
    from planner import float8

    if training.float8_all_gather and training.float8 is not Float8Recipe.TENSORWISE:
        return ("training.float8_all_gather", "needs --float8 tensorwise (torchao gathers "
                f"float8 weights with tensorwise scales only), got {training.float8.value}")
    if not float8.enabled(training):
        return None
    if gpu.fp8_tflops is None:
        return ("training.float8", f"{gpu.id} has no float8 tensor cores (no fp8_tflops in "
                "its profile): torchao float8 needs an H100, H200, B200, L4, L40S, RTX 4090, "
                "MI300X or newer")
    why = float8.unsupported(model)
    if why:
        return ("training.float8", why)
    return None


@functools.cache
def _training_fields() -> tuple[tuple[str, str, bool], ...]:
    """(path, key, is_flag) of the ``training.*`` fields ``training_from`` passes as they are
    (made on first use, not at import: the mesh search builds a request per layout)."""
    return tuple((f.path, f.key, f.is_flag) for f in FIELDS if f.section == "training"
                 and f.key in TRAINING_ATTRS and f.key != "loss")


@functools.cache
def _deepspeed_fields() -> tuple[tuple[str, str], ...]:
    """(path, key) of the ``deepspeed.*`` fields."""
    return tuple((f.path, f.key) for f in FIELDS if f.section == "deepspeed")


def deepspeed_from(v: Mapping[str, Any]) -> DeepSpeedConfig:
    """The DeepSpeed settings given (``deepspeed.*`` fields); DeepSpeed's defaults for the
    rest. "auto" stays until ``resolve_deepspeed`` knows the model."""
    given = {key: v[path] for path, key in _deepspeed_fields() if v.get(path) is not None}
    return DeepSpeedConfig(**given)


def resolve_deepspeed(training: TrainingSpec, model: ModelSpec) -> tuple[TrainingSpec, list[str]]:
    """"auto" DeepSpeed sizes filled in as the HF integration does, from the hidden size, and
    the assumption line that says so."""
    ds = training.deepspeed
    if not ds.autos:
        return training, []
    done = ds.resolved(model.hidden)
    shown = ", ".join(f"{k} {getattr(done, k):,}" for k in ds.autos)
    note = Notice(f'DeepSpeed "auto" filled in as the HF integration does from hidden '
                  f"{model.hidden:,}: {shown}", Kind.DEEPSPEED_AUTO)
    return dataclasses.replace(training, deepspeed=done), [note]


@dataclass(frozen=True, slots=True)
class Job:
    """What a job trains, independent of the hardware it runs on: the model, the training
    loop (DeepSpeed settings resolved against the model) and the notes of both. The CUDA
    probe, which measures whatever GPUs it finds, stops here; ``build_request`` goes on."""

    model: ModelSpec
    training: TrainingSpec
    source: str
    """Where the model's shape came from: params, preset, config, explicit, trace."""
    warnings: tuple[str, ...] = ()
    attention: str = ""
    """The assumption line for the attention (planner/attention.py); "" when not stated."""


ATTENTION_WHY = "job.attention_why"
"""A job's reason for its attention (planner.jobs.record.FrameworkAttention: a framework whose
own model code picks the kernel, not transformers), beside ``training.attention`` in the
values ``build_request`` is given: the assumption line says it instead of "given"."""


def job_from(v: Mapping[str, Any], naming: Naming = FLAGS, *, allow_files: bool = True,
             base_dir: str | None = None, traced: TracedModel | None = None,
             attention_why: str | None = None) -> Job:
    """{path: value} parsed (planner.fields.parse) -> the Job, or one error naming the field.
    The model is one of: a spec (``model.preset``, ``model.params`` or the shape fields), a
    config.json (``model.config``: a path, or the mapping itself), or ``traced``: a module
    known by its own counts (probes/), given instead of any ``model.*`` value.
    ``attention_why``: why the attention given is the one that runs (``ATTENTION_WHY``)."""
    model_warnings: list[str] = []
    if traced is not None:
        given = [p for p in v if p.startswith("model.") and v[p] not in (None, False)]
        if given:
            raise naming.error(f"{naming.name(given[0])}: a traced module is described by "
                               "its own structure; give no model fields")
        model, source = traced.proxy_spec(), "trace"
    else:
        model, source = resolve_model(v, naming, allow_files=allow_files, base_dir=base_dir,
                                      warnings=model_warnings)
    try:
        training = training_from(v)
    except ValueError as exc:  # a combination FineTune refuses (a quantized base without LoRA)
        raise naming.fail("finetune.lora_rank" if v["finetune.lora_rank"] or
                          v["finetune.quantize_base"] != "none" else "finetune.freeze",
                          str(exc)) from None
    try:
        trainable(model, training.finetune)
    except ValueError as exc:  # targets the model does not have (gate on a GELU MLP)
        raise naming.fail("finetune.lora_targets", str(exc)) from None
    problem = flat_params_problem(training, naming.name)
    if problem:
        raise naming.fail("training.flat_params", problem)
    training, ds_notes = resolve_deepspeed(training, model)
    training, attention = resolve_attention(training, model, v["training.attention"],
                                            attention_why)
    training = dataclasses.replace(training, pipeline=pipeline_from(v, model, training, naming))
    return Job(model=model, training=training, source=source,
               warnings=tuple(model_warnings) + tuple(ds_notes), attention=attention)


def resolve_attention(training: TrainingSpec, model: ModelSpec, given: Any,
                      why: str | None = None) -> tuple[TrainingSpec, str]:
    """The attention given, else the one transformers runs for the model's family
    (planner/attention.py), and the assumption line that says which ("" when nothing is
    known about the model's family and none was given: sdpa, as always). ``why``: a job's
    reason for the one given (``ATTENTION_WHY``)."""
    from planner.attention import default_attention

    if given is not None:
        return training, f"attention: {given} ({why or 'given'})"
    if not (model.family or model.attn_implementation):
        return training, ""
    attn, line = default_attention(model, training.transformers_version)
    return dataclasses.replace(training, attention=attn), line


def pipeline_from(v: Mapping[str, Any], model: ModelSpec, training: TrainingSpec,
                  naming: Naming) -> Pipeline:
    """The pipeline of ``--pp`` and its schedule, micro-batches and stages per rank
    (planner/pipeline.py), or one error naming the field torch or torchtitan would refuse.
    What the model does not cover under a pipeline is refused by name: a tied embedding (its
    two uses sit on the first and the last stage), MoE, fine-tuning, FSDP1, gradient
    accumulation around the schedule."""
    pp = v["parallel.pp"]
    schedule = v["parallel.pp_schedule"] or PipeSchedule.ONE_F_ONE_B
    virtual = v["parallel.pp_virtual_stages"] or pipeline.default_virtual(schedule)
    if pp == 1:
        for path in ("parallel.pp_schedule", "parallel.pp_microbatches",
                     "parallel.pp_virtual_stages", "parallel.pp_kept_outputs"):
            if v[path] is not None:
                raise naming.fail(path, f"needs {naming.name('parallel.pp')} > 1")
        return Pipeline()
    kept = v["parallel.pp_kept_outputs"] or PipeKeptOutputs.NONE
    if kept is not PipeKeptOutputs.NONE and schedule in pipeline.SPLIT_BACKWARD:
        raise naming.fail("parallel.pp_kept_outputs", f"kept outputs under {schedule.value} "
                          "(a split backward) are NOT MODELLED")
    p = Pipeline(degree=pp, schedule=schedule, virtual=virtual,
                 microbatches=v["parallel.pp_microbatches"] or pp * virtual, kept_outputs=kept)
    why = pipeline.problem(p, model.n_layers)
    if why:
        raise naming.fail(*why)
    unmodelled = [(model.tied_embeddings, None, "tied embeddings"),
                  (model.is_moe, None, "an MoE model"),
                  (not training.finetune.full, None, "LoRA or frozen parameters"),
                  (training.fsdp_version == 1, "training.fsdp_version", "FSDP1"),
                  (training.grad_accum > 1, "training.grad_accum", "gradient accumulation"),
                  (training.activation_offload, "training.activation_offload",
                   "activation offload"),
                  (training.keep_logits, "training.keep_logits", "--keep-logits")]
    for bad, path, what in unmodelled:
        if bad:
            raise naming.fail("parallel.pp", f"pipeline parallel with {what} is NOT MODELLED"
                              + (f" ({naming.name(path)})" if path else ""))
    return p


def ep_options(v: Mapping[str, Any], model: ModelSpec, training: TrainingSpec,
               cluster: Cluster, options: Options, naming: Naming) -> Options:
    """The search options under expert parallel, or one error naming the field: EP is
    modelled as torchtitan runs it, FSDP2 (full_shard or shard_grad_op) over every GPU
    without offload, TP only when given (``--tp auto`` is 1 under EP; docs/model.md §8.8)."""
    problem = ep_problem(model, training, cluster.n_gpus)
    if problem:
        raise naming.fail("parallel.ep", problem)
    tp = options.tp or 1
    if tp > 1:
        # torchtitan's EP x TP (docs/model.md §8.8): each TP rank routes its own sequence
        # shard, so the (local) sequence must split over TP (torchtitan/models/common/moe.py:
        # "the caller must provide a TP-divisible token count")
        problem = ep_tp_problem(model, training, tp, options.checkpointing)
        if problem:
            raise naming.fail(*problem)
    asked = fsdp2_only(v, naming, "expert parallel", "EP runs under FSDP2", EP_STRATEGIES)
    return dataclasses.replace(options, strategies=tuple(asked) if asked else EP_STRATEGIES,
                               offloads=(Offload.NONE,), tp=tp)


def pipeline_cluster_problem(p: Pipeline, cluster: Cluster, tp: Any, strategies: Any,
                             offload: Any, global_batch: Any, naming: Naming,
                             model: ModelSpec | None = None, seq: int = 0, cp: int = 1
                             ) -> None:
    """The cluster and the search options under a pipeline: the GPUs split into pp stages of
    n / (pp x tp) data-parallel ranks each (torchtitan's mesh: pp outermost, tp innermost),
    FSDP2 (full_shard) inside a stage, TP only when given (``--tp auto`` is 1 under
    ``--pp``), no offload."""
    if not p.enabled:
        return
    n = cluster.n_gpus
    t = 1 if tp == "auto" else tp
    if n % (p.degree * t) or n // (p.degree * t) < 2:
        raise naming.fail("parallel.pp", f"{n} GPUs must be a multiple of {p.degree * t} "
                          f"(pp {p.degree} x tp {t}) with at least 2 data-parallel ranks per "
                          "stage (PP without FSDP is NOT MODELLED)")
    if t > 1 and model is not None:
        # sequence parallel splits every stage's output on the sequence and the head and the
        # embedding on the vocabulary; uneven shards are not modelled
        # (under context parallel each GPU's share of the sequence: seq / cp)
        local = f"{seq} / CP {cp} = {seq // cp}" if cp > 1 else f"{seq}"
        for what, size, shown in (("training.seq", seq // cp, local),
                                  ("model.vocab", model.vocab, f"{model.vocab}")):
            if size % t:
                raise naming.fail(what, f"{shown} is not a multiple of TP {t}: pipeline "
                                  "parallel with uneven tensor-parallel shards is NOT "
                                  "MODELLED")
    if strategies and any(s is not Strategy.FULL_SHARD for s in strategies):
        raise naming.fail("strategy", "pipeline parallel is modelled with FSDP2 full_shard "
                          "inside each stage (torchtitan) only")
    if offload not in ("auto", Offload.NONE):
        raise naming.fail("offload", "pipeline parallel with CPU offload is NOT MODELLED")
    if global_batch is not None:
        # a step is M micro-batches per pipeline; accumulation around the schedule is not
        # modelled
        raise naming.fail("training.global_batch", "with pipeline parallel the step is "
                          "--pp-microbatches micro-batches per pipeline; --global-batch (gradient "
                          "accumulation around the schedule) is NOT MODELLED")


def split_schedule_problem(p: Pipeline, tp: Any, checkpointing: Checkpointing, cp: int = 1
                           ) -> tuple[str, str] | None:
    """(field, why) for what fitcheck does not model under ZBV, DualPipeV and Interleaved Zero
    Bubble (``pipeline.SPLIT_BACKWARD``; docs/model.md §8.7): tensor parallel or context
    parallel inside the stages (not traced: their walk counts neither the sequence-sharded
    stages nor the ring's buffers), and activation checkpointing, whose split backward torch
    2.13 runs differently:

    - op-level selective checkpointing raises in the weight backward
      (``torch/utils/checkpoint.py`` ``_CachedTorchDispatchMode``: "Trying to backward an
      extra time. You are only allowed to backward once on any region computed under
      selective activation checkpoint");
    - full checkpointing runs one ``autograd.grad`` per parameter group in the weight
      backward (``_backward.stage_backward_weight``), each recomputing the block (counted: 9
      recomputes of a block per W) and keeping what it does not unpack until the weight
      backward ends: traced 834 MB on rank 1 of the 8-layer test model (pp 2, M 4) where the
      same rank holds 559 MB without checkpointing.
    """
    if p.schedule not in pipeline.SPLIT_BACKWARD:
        return None
    if tp not in ("auto", 1):
        return "parallel.tp", f"{p.schedule} with tensor parallel is NOT MODELLED (not traced)"
    if cp > 1:
        return "parallel.cp", f"{p.schedule} with context parallel is NOT MODELLED (not traced)"
    if checkpointing in (Checkpointing.FULL, Checkpointing.SELECTIVE):
        return "checkpointing", (f"{checkpointing} checkpointing under {p.schedule} is NOT "
                                 "MODELLED (its split backward: torch 2.13 refuses op-level "
                                 "selective checkpointing, and recomputes a block once per "
                                 "parameter group under full)")
    return None


def build_request(values: Mapping[str, Any], naming: Naming = FLAGS, *,
                  allow_files: bool = True, base_dir: str | None = None,
                  traced: TracedModel | None = None,
                  hardware: dict[tuple, tuple[Runtime, GpuProfile]] | None = None) -> Request:
    """{path: raw value} (planner/fields.py) -> the typed Request, or one error naming the
    field the way the front end calls it (``naming``). With ``allow_files=False`` (the
    webhook) nothing on disk is read: profile ids, presets and ``auto`` calibration only.
    What is trained comes from ``job_from`` (the model: a spec, a config.json or
    ``traced``), then the hardware, the calibration and the search options. ``hardware``:
    a caller's memo of the GPU profile and calibration resolved already, keyed by everything
    they are read from (the mesh search builds one request per layout of the same GPU,
    calibration and model: read once, not per layout)."""
    v = parse(values, naming)
    if v["parallel.mesh"] == "auto":
        # a search over whole plans, run by the plan command (planner/mesh.py), which builds
        # one request per layout with --mesh given
        raise naming.fail("parallel.mesh", "auto is a search over whole plans, run by "
                          "fitcheck plan --mesh auto (without --job or --find); here give the "
                          "degrees (--tp, --pp, --cp)")
    job = job_from(v, naming, allow_files=allow_files, base_dir=base_dir, traced=traced,
                   attention_why=values.get(ATTENTION_WHY))
    model, training, source = job.model, job.training, job.source
    # a traced module has no architecture family: no activation scale applies
    read_by = (v["hardware.gpu"], v["calibration"], None if traced else model, allow_files,
               base_dir)
    if hardware is not None and read_by in hardware:
        runtime, gpu = hardware[read_by]
    else:
        gpu = resolve_gpu(v["hardware.gpu"], naming, allow_files=allow_files,
                          base_dir=base_dir)
        runtime, gpu = resolve_runtime(v["calibration"], gpu, None if traced else model,
                                       naming, allow_files=allow_files)
        if hardware is not None:
            hardware[read_by] = runtime, gpu
    cluster = resolve_cluster(gpu, v["hardware.n"], v["hardware.gpus_per_node"],
                              v["hardware.host_ram_gib"], naming)
    problem = float8_problem(model, training, gpu)
    if problem:
        raise naming.fail(*problem)
    if training.activation_offload_impl is not OffloadImpl.TORCHTUNE \
            and not training.activation_offload:
        raise naming.fail("training.activation_offload_impl",
                          f"needs {naming.name('training.activation_offload')}")
    tp = v["parallel.tp"]
    p = training.pipeline
    pipeline_cluster_problem(p, cluster, tp, v["strategy"], v["offload"],
                             v["training.global_batch"], naming, model, training.seq,
                             training.cp)
    problem = split_schedule_problem(p, tp, v["checkpointing"], training.cp)
    if problem:
        raise naming.fail(*problem)
    if p.enabled and tp == "auto":
        tp = 1
    if tp != "auto":
        problem = tp_problem(model, tp, cluster.n_gpus, cluster.gpus_per_node, training.ep)
        if problem:
            raise naming.fail("parallel.tp", problem)
    strategies = v["strategy"] or tuple(Strategy)
    problem_at = zeropp_problem(training.deepspeed, strategies, cluster.n_gpus,
                                cluster.gpus_per_node)
    if problem_at:
        raise naming.fail(*problem_at)
    offload = v["offload"]
    problem = deepspeed_problem(training, offload, naming.name)
    if problem:
        raise naming.fail(*problem)
    if training.optimizer.onebit:
        problem = onebit_problem(training, v["strategy"], offload, tp, naming.name)
        if problem:
            raise naming.fail(*problem)
        strategies, offload, tp = (Strategy.DDP,), Offload.NONE, 1
    problem = in_backward_problem(training, cluster.n_gpus, v["strategy"], offload,
                                  naming.name)
    if problem:
        raise naming.fail(*problem)
    if training.optimizer_in_backward:
        strategies, offload = (Strategy.DDP,), Offload.NONE
    ds = training.deepspeed
    if offload == "auto" and ds.bf16_master_weights_and_grads and not ds.bf16_optimizer_states:
        # fp32 states beside bf16 master weights: DeepSpeed runs them only offloaded
        offloads: tuple[Offload, ...] | None = (Offload.OPTIMIZER, Offload.PARAMS_AND_OPTIMIZER)
    else:
        offloads = None if offload == "auto" else (offload,)
    options = Options(
        strategies=(Strategy.FULL_SHARD,) if p.enabled and not v["strategy"] else strategies,
        offloads=(Offload.NONE,) if p.enabled else offloads,
        # under a split backward only no checkpointing is modelled (split_schedule_problem)
        checkpointing=Checkpointing.NONE if p.schedule in pipeline.SPLIT_BACKWARD and p.enabled
        else v["checkpointing"], margin=v["margin"], at_risk=v["at_risk"],
        global_batch=v["training.global_batch"], tp=None if tp == "auto" else tp)
    if training.cp > 1:
        options = cp_options(v, model, training, cluster, options, naming)
    if training.ep > 1:
        options = ep_options(v, model, training, cluster, options, naming)
    elif training.ep_imbalance != 1.0:
        raise naming.fail("parallel.ep_imbalance", "applies to expert parallel only (--ep > 1)")
    warnings = list(job.warnings) + cp_inert(values, training, naming)
    if traced is None:
        warnings += sac_force_notes(model, training, naming)
    if model.shape_assumed:
        warnings.append(Notice(f"model shape assumed from {naming.name('model.params')}; give "
                               f"{naming.name('model.preset')} or a shape for an exact "
                               "estimate", Kind.SHAPE_ASSUMED))
    if training.optimizer.onebit:
        from planner import onebit

        warnings.append(Notice(onebit.notice(training), Kind.ONEBIT))
    if training.float8.value != "none":
        rate = ("measured on one H100" if cluster.gpu.fp8_matmul_speedup else
                "assumed: the datasheet peaks' ratio")
        warnings.append(Notice(
            f"float8 step time: the linears' matmuls at {cluster.gpu.id}'s float8 / bf16 "
            f"matmul rate ({rate}), torchao's casts at HBM bandwidth as measured on one H100; "
            "against one H100's steps the float8 / bf16 step-time ratio is 32 % low to 8 % high "
            "(eager float8 casts cost more there than the cast measurement explains), on "
            "published torchtitan runs (H100, compiled) 2-17 % fewer tokens/s than measured "
            "(docs/model.md \"Float8 training\")",
            Kind.FLOAT8))
    if runtime.calibration and runtime.calibration.get("stale") and \
            runtime.calibration["explicit"]:  # one auto found is stated in the assumptions
        warnings.append(Notice(str(runtime.calibration["stale"]), Kind.CALIBRATION_STALE))
    return Request(model=model, training=training, cluster=cluster, options=options,
                   runtime=runtime, model_source=source, traced=traced,
                   warnings=tuple(warnings), attention=job.attention)
