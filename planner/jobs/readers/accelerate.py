"""An accelerate config YAML (``accelerate launch --config_file``).

distributed_type FSDP: fsdp_config's sharding strategy (FULL_SHARD/SHARD_GRAD_OP/NO_SHARD/
HYBRID_SHARD, or 1-5; accelerate >= 1.6 also spells it fsdp_reshard_after_forward, a bool for
FSDP2), fsdp_offload_params -> params_and_optimizer, fsdp_activation_checkpointing -> full,
fsdp_version, fsdp_cpu_ram_efficient_loading -> init rank0 (else every rank loads: full).
DEEPSPEED: deepspeed_config's zero_stage / offload devices / gradient_accumulation_steps, or the
deepspeed_config_file it names. MULTI_GPU: DDP; NO: one process (launch.py's simple launcher,
whatever num_processes says). num_processes (all machines) -> hardware.n; / num_machines ->
gpus_per_node. mixed_precision sets the precision unless the training
arguments do (the HF Trainer's bf16/fp16 win). parallelism_config: dp_replicate x dp_shard ->
strategy, tp_size, sp_size, and cp_size / cp_comm_strategy -> parallel.cp / parallel.cp_rotate
with the key/value heads grouped (``context_parallel`` below).
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers.common import MISSING, PRECISIONS, Reader, unread_cp
from planner.jobs.record import JobFormat, Unmodelled, Vocab

SHARDING = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op",
            "NO_SHARD": "no_shard", "HYBRID_SHARD": "hybrid_shard",
            "HYBRID_SHARD_ZERO2": Vocab("hybrid_shard_zero2"),
            "_HYBRID_SHARD_ZERO2": Vocab("hybrid_shard_zero2"),
            "1": "full_shard", "2": "shard_grad_op", "3": "no_shard", "4": "hybrid_shard",
            "5": Vocab("hybrid_shard_zero2")}
"""torch.distributed.fsdp.ShardingStrategy by name, or by its value (1-5)."""
OFFLOAD_DEVICES = {"none": None, "cpu": "cpu", "nvme": "nvme"}


def detect(doc: Any) -> int:
    score = 3 * ("distributed_type" in doc) + 2 * ("compute_environment" in doc)
    score += sum(1 for k in ("num_processes", "num_machines", "machine_rank", "mixed_precision",
                             "main_training_function", "rdzv_backend", "downcast_bf16",
                             "use_cpu", "same_network") if k in doc)
    fc = doc.get("fsdp_config")
    if isinstance(fc, dict) and any(str(k).startswith("fsdp_") for k in fc) \
            and "base_model" not in doc:
        score += 2
    dc = doc.get("deepspeed_config")
    if isinstance(dc, dict) and ("zero_stage" in dc or "deepspeed_config_file" in dc):
        score += 2
    return score


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    dist = (r.text(doc.get("distributed_type"), "distributed_type") or "NO").upper()
    mp = r.choose(doc.get("mixed_precision"), "mixed_precision",
                  {**PRECISIONS, "fp8": "bf16-amp"})
    if mp is not None:
        r.fallback("training.precision", mp, "")
    else:  # launch.py: a config without mixed_precision launches with "no"
        r.fallback("training.precision", "fp32", f"{r.name}: no mixed_precision: accelerate "
                   "launches with \"no\" (fp32) unless the training arguments set it")
    if str(doc.get("mixed_precision", "")).lower() == "fp8":
        fp8 = doc.get("fp8_config")
        backend = str((fp8 or {}).get("backend", "")).upper() if isinstance(fp8, dict) else ""
        if backend == "AO":  # torchao float8 (AORecipeKwargs: a default Float8LinearConfig)
            r.set("training.float8", "tensorwise", "mixed_precision fp8, fp8_config backend AO")
        else:
            name = {"MSAMP": "MS-AMP"}.get(backend, "TransformerEngine")
            r.set("training.float8", Unmodelled(
                "fp8", f"float8 training with {name} (mixed_precision fp8"
                f"{', fp8_config backend ' + backend if backend else ''}, from {r.name}) is "
                "not modelled yet (only torchao float8 is)"), "mixed_precision")
    hardware(r, doc, single=dist == "NO")
    pc = r.mapping(doc.get("parallelism_config"), "parallelism_config")
    if dist == "FSDP":
        fsdp(r, r.mapping(doc.get("fsdp_config"), "fsdp_config"), "fsdp_config", prefix="fsdp_")
        parallelism(r, pc)
        if "training.fsdp_version" not in r.raw:
            r.set("training.fsdp_version", 1, "fsdp_config (no fsdp_version: FSDP1)")
    elif dist == "DEEPSPEED":
        deepspeed(r, r.mapping(doc.get("deepspeed_config"), "deepspeed_config"))
        parallelism(r, pc)
    elif dist in ("MULTI_GPU", "NO"):
        r.set("strategy", "ddp", "distributed_type")
        parallelism(r, pc)
    elif dist == "MEGATRON_LM":
        r.set("strategy", Vocab("megatron-lm"), "distributed_type")
    else:
        r.set("strategy", Vocab(dist.lower()), "distributed_type")
    dyn = r.mapping(doc.get("dynamo_config"), "dynamo_config")
    backend = r.text(dyn.get("dynamo_backend", doc.get("dynamo_backend")),
                     "dynamo_config.dynamo_backend")
    if backend and backend.upper() != "NO":
        regional = r.boolean(dyn.get("dynamo_use_regional_compilation"),
                             "dynamo_config.dynamo_use_regional_compilation")
        r.set("training.compile", "blocks" if regional else "model",
              "dynamo_config.dynamo_use_regional_compilation" if regional else
              "dynamo_config.dynamo_backend")
    r.audit("accelerate")


def hardware(r: Reader, doc: dict, *, single: bool = False) -> None:
    raw = doc.get("num_processes")
    n = None if raw in (-1, "-1") else r.count(raw, "num_processes")
    machines = r.count(doc.get("num_machines"), "num_machines") or 1
    if single:  # launch.py: distributed_type NO takes simple_launcher, one process
        if n is not None and n > 1:
            r.warn(f"{r.name}: num_processes {n} is not used: distributed_type NO launches one "
                   "process (accelerate launch --multi_gpu would launch them)")
        r.set("hardware.n", 1, "distributed_type NO (one process)")
        r.set("hardware.gpus_per_node", 1, "distributed_type NO (one process)")
        return
    if n is None:
        return
    if n % machines:
        raise r.fail("num_processes", f"({n}) must be a multiple of num_machines ({machines}): "
                     "it counts the processes of all machines")
    r.set("hardware.n", n, "num_processes")
    r.set("hardware.gpus_per_node", n // machines,
          "num_processes / num_machines" if machines > 1 else "num_processes")


def _plugin_reduce_dtype(values: dict) -> str | None:
    """The reduce dtype accelerate's FSDP plugin picks for the precision in effect (None: no
    policy, under fp32 or pure bf16)."""
    return {"bf16-amp": "bf16", "fp16-amp": "fp16"}.get(str(values.get("training.precision")))


def fsdp(r: Reader, fc: Any, where: str, *, prefix: str) -> None:
    """An FSDP plugin config: accelerate's fsdp_* keys, or the same without the prefix (HF
    TrainingArguments.fsdp_config, axolotl with fsdp_version 2)."""

    def key(name: str) -> str:
        return next((k for k in (f"{prefix}{name}", name, f"fsdp_{name}") if k in fc), name)

    def get(name: str) -> Any:
        return fc.get(key(name), MISSING)

    if get("mixed_precision_policy") is MISSING:
        # accelerate 1.15 utils/dataclasses.py FullyShardedDataParallelPlugin.set_mixed_precision
        # (called by state.py with the run's mixed precision): without a policy of its own the
        # plugin builds MixedPrecision(Policy)(param_dtype=dtype, reduce_dtype=dtype): the
        # gradients are reduced (and FSDP2 accumulates unsynced ones) in bf16 / fp16, not fp32
        r.fallback("training.reduce_dtype", _plugin_reduce_dtype,
                   f"{where}: no mixed_precision_policy: accelerate's FSDP plugin reduces "
                   "gradients in the mixed-precision dtype (param_dtype = reduce_dtype)")
    version = get("version")
    v = r.count(version, f"{where}.{key('version')}") if version is not MISSING else None
    if v is not None and v not in (1, 2):
        raise r.fail(f"{where}.{key('version')}", f"must be 1 or 2, got {version!r}")
    if v is not None:
        r.set("training.fsdp_version", v, f"{where}.{key('version')}")
    strategy = None
    raw = get("sharding_strategy")
    if raw is not MISSING and raw is not None:
        strategy = r.choose(str(raw), f"{where}.{key('sharding_strategy')}", SHARDING)
        r.set("strategy", strategy, f"{where}.{key('sharding_strategy')}")
    reshard = get("reshard_after_forward")
    if reshard is not MISSING and reshard is not None:
        k = f"{where}.{key('reshard_after_forward')}"
        if isinstance(reshard, bool) or str(reshard).lower() in ("true", "false"):
            value = "full_shard" if r.boolean(reshard, k) else "shard_grad_op"
            if strategy == "hybrid_shard" and value == "full_shard":
                value = "hybrid_shard"
            if strategy in (None, "full_shard", "shard_grad_op", "hybrid_shard"):
                # FSDP2: reshard_after_forward decides; an FSDP1 sharding_strategy beside it is
                # what accelerate < 1.6 read, and the two must agree
                if strategy is not None and strategy != value and v != 2:
                    raise r.fail(k, f"{reshard!r} contradicts "
                                 f"{key('sharding_strategy')} {raw!r}")
                r.replace("strategy", value, k)
        else:  # accelerate >= 1.6 FSDP1: the sharding strategy under its new name
            r.set("strategy", r.choose(str(reshard), k, SHARDING), k)
    if "strategy" not in r.raw:
        r.set("strategy", "full_shard", f"{where} (FULL_SHARD: accelerate's default)")
    off = get("offload_params")
    if off is not MISSING:
        k = f"{where}.{key('offload_params')}"
        r.set("offload", "params_and_optimizer" if r.boolean(off, k) else "none", k)
    ac = get("activation_checkpointing")
    if ac is not MISSING:
        k = f"{where}.{key('activation_checkpointing')}"
        r.set("checkpointing", "full" if r.boolean(ac, k) else "none", k)
    eff = get("cpu_ram_efficient_loading")
    if eff is not MISSING:
        k = f"{where}.{key('cpu_ram_efficient_loading')}"
        r.set("training.init", "rank0" if r.boolean(eff, k) else "full", k)


def parallelism(r: Reader, pc: Any) -> None:
    """accelerate's ParallelismConfig (dp_replicate x dp_shard x tp x cp)."""

    def size(name: str) -> int | None:
        for k in (f"parallelism_config_{name}_size", f"{name}_size", name):
            if k in pc:
                return r.count(pc[k], f"parallelism_config.{k}")
        return None

    rep, shard = size("dp_replicate"), size("dp_shard")
    if r.raw.get("strategy") not in ("full_shard", "shard_grad_op", "hybrid_shard", "ddp",
                                     "no_shard"):
        rep = None  # DeepSpeed: ZeRO shards over the data-parallel ranks whatever their split
    if rep and rep > 1 and shard and shard > 1:
        r.replace("strategy", "hybrid_shard", "parallelism_config (dp_replicate x dp_shard)")
    elif rep and rep > 1 and (shard or 1) == 1:
        r.replace("strategy", "ddp", "parallelism_config (dp_replicate only)")
    for name, path in (("tp", "parallel.tp"), ("sp", "parallel.sp")):
        d = size(name)
        if d and d > 1:
            r.set(path, d, f"parallelism_config.parallelism_config_{name}_size")
    cp = size("cp")
    if cp and cp > 1:
        context_parallel(r, pc, cp)
    else:  # inert without CP: the request's warning says so
        comm_strategy(r, pc)


def context_parallel(r: Reader, pc: Any, cp: int) -> None:
    """ParallelismConfig cp_size -> parallel.cp, cp_comm_strategy -> parallel.cp_rotate, and
    the key/value heads grouped (parallel.cp_kv).

    accelerate (16cb6eb8) runs torch's ``context_parallel`` as fitcheck's --cp models it:
    ``Accelerator._prepare_cp`` calls ``set_rotate_method(cp_handler.cp_comm_strategy)``
    (TorchContextParallelConfig: allgather, the default, or alltoall) and
    ``maybe_context_parallel`` enters ``context_parallel(mesh["cp"], buffers, ...)`` with
    torch's default load balancing; FSDP2 shards over ``dp_shard_cp``
    (``ParallelismConfig.fsdp_dim_names``; accelerate refuses CP without FSDP2). The HF
    Trainer's ``_prepare_context_parallel_inputs`` (transformers) refuses any attention but
    SDPA and shards input_ids, labels, shift_labels, position_ids and a causal mask.
    ``_attach_context_parallel_hooks`` (big_modeling.py) drops every ``self_attn`` module's
    mask for ``is_causal=True``, so transformers' ``sdpa_attention_forward`` takes its
    ``enable_gqa=True`` branch (``use_gqa_in_sdpa``: CUDA, torch >= 2.5, no mask) and gives
    SDPA the model's key/value heads, not repeated (torchtitan repeats them): CpKv.GROUPED."""
    key = "parallelism_config.parallelism_config_cp_size" if \
        "parallelism_config_cp_size" in pc else "parallelism_config.cp_size"
    backend = next((pc[k] for k in ("parallelism_config_cp_backend", "cp_backend")
                    if pc.get(k) is not None), "torch")
    if str(backend).lower() != "torch":
        # ParallelismConfig.cp_backend: Literal["torch"] (v1.14.0 .. 16cb6eb8)
        r.set("parallel.cp", unread_cp(r, cp, key, f"cp_backend {backend!r} is not torch's, "
                                       "the only one accelerate knows"), key)
        return
    r.set("parallel.cp", cp, key)
    r.set("parallel.cp_kv", "grouped", f"{key} (accelerate's CP hooks drop the mask: "
          "transformers' SDPA attention passes enable_gqa=True)")
    comm_strategy(r, pc)


def comm_strategy(r: Reader, pc: Any) -> None:
    """cp_comm_strategy (the ParallelismConfig key or its cp_handler's) -> parallel.cp_rotate."""
    handler = pc.get("cp_handler") if isinstance(pc.get("cp_handler"), dict) else {}
    for k, where in (("parallelism_config_cp_comm_strategy", "parallelism_config."),
                     ("cp_comm_strategy", "parallelism_config."),
                     ("cp_comm_strategy", "parallelism_config.cp_handler.")):
        source = handler if where.endswith("cp_handler.") else pc
        if source.get(k) is not None:
            r.set("parallel.cp_rotate", Vocab(str(source[k])), f"{where}{k}")


def deepspeed(r: Reader, dc: Any) -> None:
    if dc.get("deepspeed_config_file"):
        init = r.boolean(dc.get("zero3_init_flag"), "deepspeed_config.zero3_init_flag")
        if init is False:  # ZeRO-3 (the file's stage) without zero.Init: whole model per rank
            r.set("deepspeed.zero_init", False, "deepspeed_config.zero3_init_flag")
        ref = r.reference(dc["deepspeed_config_file"], "deepspeed_config.deepspeed_config_file",
                          JobFormat.DEEPSPEED)
        if ref is not None:
            r.peers.append(ref)
        else:
            r.set("strategy", "zero1,zero2,zero3", "deepspeed_config.deepspeed_config_file")
        return
    stage = dc.get("zero_stage")
    if stage is not None:
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise r.fail("deepspeed_config.zero_stage", f"unknown value {stage!r}; expected 0-3")
        r.set("strategy", ["ddp", "zero1", "zero2", "zero3"][stage], "deepspeed_config.zero_stage")
    opt = r.choose(dc.get("offload_optimizer_device"), "deepspeed_config.offload_optimizer_device",
                   OFFLOAD_DEVICES) if "offload_optimizer_device" in dc else None
    par = r.choose(dc.get("offload_param_device"), "deepspeed_config.offload_param_device",
                   OFFLOAD_DEVICES) if "offload_param_device" in dc else None
    if par and not opt:
        r.set("offload", Vocab("params"), "deepspeed_config.offload_param_device")
    elif opt or par:
        value = "params_and_optimizer" if par else "optimizer"
        k = "deepspeed_config.offload_" + ("param" if par else "optimizer") + "_device"
        r.set("offload", value if {opt, par} <= {"cpu", None} else Vocab(f"{value}-nvme"), k)
    else:
        r.set("offload", "none", "deepspeed_config (no offload device)")
    key = "deepspeed_config.gradient_accumulation_steps"
    r.set("training.grad_accum", r.count(dc.get("gradient_accumulation_steps"), key, auto=True),
          key)
    for key, path in (("zero3_init_flag", "deepspeed.zero_init"),
                      ("zero3_save_16bit_model",
                       "deepspeed.stage3_gather_16bit_weights_on_model_save")):
        v = r.boolean(dc.get(key), f"deepspeed_config.{key}")
        if v is not None and stage == 3 and path not in r.raw:
            r.set(path, v, f"deepspeed_config.{key}")
