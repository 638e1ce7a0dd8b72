"""torchtitan's job configuration in its four forms, against torchtitan's key table
(planner/data/job_keys_torchtitan.json): the TOML files of the 2025-02 layout (parallel degrees
under [training], pipeline/context under [experimental], [training] compile), v0.1
([parallelism], [training] compile, local_batch_size) and v0.2 ([parallelism], [compile]
enable/components), and the config_registry.py functions of 0.3 (planner/jobs/pyconfig.py
reads them without running them; ``from_registry`` lays them out as the TOML sections).

[model] name + flavor -> a preset (llama3 8B -> llama3-8b, ...); [training] batch_size /
local_batch_size -> micro-batch, global_batch_size (-1: local x DP) -> the accumulation,
seq_len; data_parallel_shard_degree (-1 or > 1) -> FSDP2 full_shard, with replicate > 1 ->
hybrid_shard, shard 1 and replicate > 1 -> ddp; fsdp_reshard_after_forward "never" ->
shard_grad_op; tensor/pipeline/context/expert degrees > 1 -> parallel.* (pipeline: the
schedule, the split-backward ones (ZBVZeroBubble, DualPipeV, InterleavedZeroBubble) not
beside activation checkpointing, and local_batch_size // pipeline_parallel_microbatch_size
micro-batches);
[activation_checkpoint] mode none/selective/full (+ selective_ac_option: 'op' selective,
1 = full, k > 1 full on every
k-th block: not modelled; 0.3: SelectiveAC (per-op) / FullAC / MemoryBudgetAC; per-op selective's
save list -> training.sac_list: pre-2026-03-23 for a TOML config, current assumed for a config
registry, ``sac_list``); enable_cpu_offload
-> params_and_optimizer; [training] dtype bfloat16 -> pure bf16, else mixed_precision_param
bfloat16 -> bf16-amp (FSDP2 MixedPrecisionPolicy over fp32 params), float32 -> fp32;
mixed_precision_reduce -> --reduce-dtype (default float32, which a pure-bf16 model keeps too:
apply_fsdp passes it to the policy whatever the model's dtype); [optimizer]
name / implementation (default fused); compile: [compile] components (default model and loss:
blocks+loss; model alone: blocks; loss alone: not modelled), [training] compile -> blocks;
float8 and other [model] converters -> training.float8; 0.3's ChunkedLossWrapper (lm_head and
loss per sequence chunk, backward per chunk) -> fused loss. torchtitan builds on the meta
device, and its run_train.sh sets expandable segments.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import Unmodelled, Vocab

TABLE = "torchtitan"
FLAVORS = {  # torchtitan/models/<name>/__init__.py flavors -> fitcheck presets
    ("llama3", "8b"): "llama3-8b", ("llama3", "70b"): "llama3-70b",
    ("llama3", "405b"): "llama3.1-405b", ("llama2", "7b"): "llama2-7b",
    ("llama2", "13b"): "llama2-13b", ("llama2", "70b"): "llama2-70b",
    # models/qwen3/__init__.py _8b, _30b_a3b; models/deepseek_v3/__init__.py _671b (main):
    # the shapes of the Qwen3-8B, Qwen3-30B-A3B and DeepSeek-V3 presets
    ("qwen3", "8b"): "qwen3-8b", ("qwen3", "30b-a3b"): "qwen3-30b-a3b",
    ("deepseek_v3", "671b"): "deepseek-v3",
}
AC_MODES = {"none": "none", "selective": "selective", "full": "full",
            "memory_budget": Vocab("memory_budget")}
OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "sgd": "sgd"}
IMPLEMENTATIONS = {"fused": "fused", "foreach": "foreach", "for-loop": "for-loop",
                   "fused_opt_states_bf16": Vocab("fused, bf16 optimizer states")}
DTYPES = {"bfloat16": "bf16-amp", "float32": "fp32", "float16": Vocab("fp16-param")}
REDUCE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
"""[training] mixed_precision_reduce -> --reduce-dtype (FSDP's reduce_dtype)."""
RESHARD = {"default": None, "always": "full_shard", "never": "shard_grad_op"}
REGISTRY = "__registry__"
"""Set by ``from_registry``: the function a 0.3 config came from."""


def detect(doc: Any) -> int:
    return sum(2 for k in ("job", "model", "training", "parallelism", "activation_checkpoint",
                           "optimizer", "lr_scheduler", "checkpoint", "metrics", "float8",
                           "experimental", "compile") if k in doc)


def layout(doc: dict) -> str:
    if REGISTRY in doc:
        return f"torchtitan 0.3 config registry: {doc[REGISTRY]}"
    if "parallelism" not in doc:
        return "torchtitan 2025-02 layout: parallel degrees under [training], [experimental]"
    if "compile" in doc:
        return "torchtitan v0.2 layout: [parallelism], [compile]"
    return "torchtitan v0.1 layout: [parallelism], [training] compile"


def read(r: Reader) -> None:
    doc = dict(r.mapping(r.doc, "file"))
    r.layout = layout(doc)
    registry = doc.pop(REGISTRY, None)
    par_section = "parallelism" if "parallelism" in doc or registry else "training"
    training = r.mapping(doc.get("training"), "[training]")
    par = r.mapping(doc.get(par_section), f"[{par_section}]")
    exp = r.mapping(doc.get("experimental"), "[experimental]")
    model(r, r.mapping(doc.get("model"), "[model]"))
    batch(r, training, registry)
    parallelism(r, par, exp, par_section)
    r.set("training.fsdp_version", 2, "torchtitan (FSDP2 fully_shard)")
    r.set("training.init", "meta", "torchtitan (meta-device init)")
    r.fallback("training.allocator", "expandable",
               f"{r.name}: allocator expandable: torchtitan's run_train.sh sets "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    checkpointing(r, r.mapping(doc.get("activation_checkpoint"), "[activation_checkpoint]"),
                  registry is not None)
    split_schedule_with_checkpointing(r)
    precision_and_offload(r, doc)
    compile_mode(r, doc, training)
    optimizer(r, r.mapping(doc.get("optimizer"), "[optimizer]"))
    float8(r, doc)
    loss(r, doc.get("loss"))
    r.audit(TABLE, doc)


def model(r: Reader, m: dict) -> None:
    name = r.text(m.get("name"), "[model] name")
    flavor = r.text(m.get("flavor"), "[model] flavor")
    if name is None:
        return
    preset = FLAVORS.get((name.lower(), (flavor or "").lower()))
    assets = r.text(m.get("hf_assets_path"), "[model] hf_assets_path")
    if preset is not None:
        r.set("model.preset", preset, "[model] name/flavor")
        if assets:
            r.warn(f"{r.name}: [model] {name} {flavor} read as fitcheck's {preset} preset "
                   f"(hf_assets_path {assets} holds the tokenizer)")
    else:
        from planner.jobs.record import Source

        r.unresolved = Source(r.name, f"[model] name/flavor {name!r} {flavor!r}")


def batch(r: Reader, training: dict, registry: Any) -> None:
    for key in ("batch_size", "local_batch_size"):
        r.set("training.micro_batch", r.count(training.get(key), f"[training] {key}"),
              f"[training] {key}")
    tokens = training.get("num_tokens_per_microbatch_per_dp_rank")
    context = training.get("max_context_length")
    if tokens is not None or context is not None:  # main since 0.3: a token budget
        tkey, ckey = ("[training] num_tokens_per_microbatch_per_dp_rank",
                      "[training] max_context_length")
        t = r.count(r.default(TABLE, "training.num_tokens_per_microbatch_per_dp_rank", tokens),
                    tkey)
        c = r.count(r.default(TABLE, "training.max_context_length", context), ckey)
        if t % c:
            raise r.fail(tkey, f"({t}) must be a multiple of max_context_length ({c}): the "
                         "planner counts whole sequences")
        r.set("training.micro_batch", t // c, f"{tkey} / max_context_length")
        r.set("training.seq", c, ckey)
        step = training.get("num_tokens_per_train_step", -1)
        if step not in (-1, "-1", None):
            total = r.count(step, "[training] num_tokens_per_train_step")
            if total % c:
                raise r.fail("[training] num_tokens_per_train_step", f"({total}) must be a "
                             f"multiple of max_context_length ({c})")
            r.set("training.global_batch", total // c,
                  "[training] num_tokens_per_train_step / max_context_length")
        return
    if registry and "training.micro_batch" not in r.raw:
        r.set("training.micro_batch", r.default(TABLE, "training.local_batch_size"),
              f"[training] local_batch_size ({r.label(TABLE)} default)")
    seq = training.get("seq_len")
    if seq is None and registry:
        seq = r.default(TABLE, "training.seq_len")
    r.set("training.seq", r.count(seq, "[training] seq_len"), "[training] seq_len")
    gb = training.get("global_batch_size", MISSING)
    if gb not in (MISSING, -1, "-1"):
        r.set("training.global_batch", r.count(gb, "[training] global_batch_size"),
              "[training] global_batch_size")


def parallelism(r: Reader, par: dict, exp: dict, par_section: str) -> None:
    def deg(key: str, section: dict, where: str) -> Any:
        v = section.get(key, MISSING)
        return MISSING if v is MISSING else r.degree(v, f"[{where}] {key}")

    shard = deg("data_parallel_shard_degree", par, par_section)
    rep = deg("data_parallel_replicate_degree", par, par_section)
    shard = -1 if shard is MISSING else shard  # torchtitan's default: -1 (the rest)
    rep = 1 if rep in (MISSING, None) else rep
    key = f"[{par_section}] data_parallel_shard_degree"
    if shard is None or shard == -1 or shard > 1:
        r.set("strategy", "hybrid_shard" if rep > 1 else "full_shard", key)
    elif rep > 1:
        r.set("strategy", "ddp", f"[{par_section}] data_parallel_replicate_degree")
    else:
        r.set("strategy", "ddp", key)
    reshard = par.get("fsdp_reshard_after_forward")
    pp = deg("pipeline_parallel_degree", exp if "pipeline_parallel_degree" in exp else par,
             "experimental" if "pipeline_parallel_degree" in exp else par_section)
    # the planner's pipeline has FSDP, TP and CP inside each stage (torchtitan's 4D mesh,
    # the 405B recipe: FSDP x CP x TP x PP): the degrees are read below
    if isinstance(pp, int) and pp > 1:
        pipeline(r, exp if "pipeline_parallel_schedule" in exp else par,
                 "experimental" if "pipeline_parallel_schedule" in exp else par_section,
                 reshard)
        reshard = None  # decided by pipeline()
    if reshard is not None and r.raw.get("strategy") == "full_shard":
        value = r.choose(reshard, f"[{par_section}] fsdp_reshard_after_forward", RESHARD)
        if value is not None:
            r.replace("strategy", value, f"[{par_section}] fsdp_reshard_after_forward")
    for name, path in (("tensor_parallel_degree", "parallel.tp"),
                       ("pipeline_parallel_degree", "parallel.pp"),
                       ("context_parallel_degree", "parallel.cp"),
                       ("expert_parallel_degree", "parallel.ep")):
        where = "experimental" if name in exp else par_section
        d = deg(name, exp if name in exp else par, where)
        if d not in (MISSING, None) and d > 1 and not isinstance(r.raw.get(path), Unmodelled):
            r.set(path, d, f"[{where}] {name}")
    # context parallel's ring rotation (torch's set_rotate_method; torchtitan's default
    # allgather): a value the field does not know is a NOT MODELLED line
    for section, where in ((par, par_section), (exp, "experimental")):
        rotate = section.get("context_parallel_rotate_method")
        if rotate is not None:
            r.set("parallel.cp_rotate", Vocab(rotate),
                  f"[{where}] context_parallel_rotate_method")
    degrees = [shard, rep] + [deg(n, exp if n in exp else par, par_section) for n in
                              ("tensor_parallel_degree", "pipeline_parallel_degree",
                               "context_parallel_degree")]
    if all(isinstance(d, int) and d > 0 for d in degrees[:1]) and shard not in (None, -1):
        total = 1
        for d in degrees:
            total *= d if isinstance(d, int) and d > 0 else 1
        r.set("hardware.n", total, f"[{par_section}] degrees (product)")


def pipeline(r: Reader, sec: dict, where: str, reshard: Any) -> None:
    """Pipeline parallel (degree > 1): the schedule (torchtitan's names, default 1F1B; those
    fitcheck does not model become NOT MODELLED lines through the field's check), and the
    micro-batches: torchtitan's ``build_pipeline_schedule`` runs local_batch_size //
    pipeline_parallel_microbatch_size micro-batches of pipeline_parallel_microbatch_size
    (default 1) samples. fsdp_reshard_after_forward "default" and "never" are what
    torchtitan does under PP (``reshard_after_forward = not pp_enabled``); "always" is not
    modelled under PP."""
    key = f"[{where}] pipeline_parallel_schedule"
    schedule = r.text(sec.get("pipeline_parallel_schedule", "1F1B"), key)
    r.set("parallel.pp_schedule", Vocab(schedule),
          key if "pipeline_parallel_schedule" in sec else f"{key} (default 1F1B)")
    mkey = f"[{where}] pipeline_parallel_microbatch_size"
    size = r.count(sec.get("pipeline_parallel_microbatch_size", 1), mkey)
    local = r.raw.get("training.micro_batch")
    if isinstance(local, int):
        if local % size:
            raise r.fail(mkey, f"({size}) must divide [training] local_batch_size ({local}), "
                         "as torchtitan's build_pipeline_schedule requires")
        r.replace("training.micro_batch", size, mkey)
        r.set("parallel.pp_microbatches", local // size,
              f"[training] local_batch_size / {mkey.split('] ')[1]}")
    if reshard is not None and str(reshard).lower() == "always":
        from planner.jobs.record import Unmodelled

        r.set("parallel.pp_reshard", Unmodelled(
            reshard, f"FSDP resharded after forward under pipeline parallel ({where} "
            "fsdp_reshard_after_forward always) is not modelled yet"),
              f"[{where}] fsdp_reshard_after_forward")


def split_schedule_with_checkpointing(r: Reader) -> None:
    """ZBVZeroBubble, DualPipeV and InterleavedZeroBubble are modelled without activation
    checkpointing only (``planner.request.split_schedule_problem``: torch 2.13 refuses
    op-level selective checkpointing in their split backward and recomputes a block once per
    parameter group under full): beside any checkpointing the schedule is a NOT MODELLED
    line."""
    from planner.fields import parse_pp_schedule
    from planner.jobs.record import Unmodelled
    from planner.pipeline import SPLIT_BACKWARD

    schedule, mode = r.raw.get("parallel.pp_schedule"), r.raw.get("checkpointing")
    if not isinstance(schedule, Vocab) or mode in (None, "none"):
        return
    try:
        modelled = parse_pp_schedule(schedule.value)
    except ValueError:
        return  # refused by name on its own
    if modelled in SPLIT_BACKWARD:
        key = r.sources["parallel.pp_schedule"].key
        mode = mode.value if isinstance(mode, Vocab) else mode
        r.replace("parallel.pp_schedule", Unmodelled(
            schedule.value, f"pipeline_parallel_schedule {schedule.value} with {mode} "
            "activation checkpointing is not modelled (its split backward: torch 2.13 "
            "refuses op-level selective checkpointing and recomputes a block once per "
            "parameter group under full)"), key)


def checkpointing(r: Reader, ac: dict, registry: bool = False) -> None:
    ac_key = "[activation_checkpoint] mode" + ("" if "mode" in ac else
                                               f" ({r.label(TABLE)} default selective)")
    mode = r.choose(ac.get("mode", "selective"), ac_key, AC_MODES)
    if mode == "selective":
        opt = r.text(ac.get("selective_ac_option", "2"), "[activation_checkpoint] "
                     "selective_ac_option")
        if opt != "op":
            k = r.count(opt, "[activation_checkpoint] selective_ac_option")
            mode = "full" if k == 1 else Vocab(f"full-every-{k}-blocks")
        else:
            sac_list(r, registry)
            force_recompute(r, ac, registry)
    r.set("checkpointing", mode, ac_key)


FORCE_KEYS = ("force_recompute_mm_shapes_by_fqns",  # SelectiveAC.Config since c5d93d109
              "per_op_sac_force_recompute_mm_shapes_by_fqns")  # the TOML JobConfig's name
"""torchtitan's ``force_recompute_mm_shapes_by_fqns`` (planner/sac.py) by era."""


def force_recompute(r: Reader, ac: dict, registry: bool) -> None:
    """[activation_checkpoint] (per_op_sac_)force_recompute_mm_shapes_by_fqns ->
    training.sac_force_recompute (a list of module names, checked against the model when
    the request is built). Absent from a TOML config: torchtitan's default
    ``["moe.router.gate"]`` from 9a8cb98f1 (2025-07-16) on, nothing before it: assumed and
    said (it changes MoE blocks only). A config registry postdates it: the default."""
    for key in FORCE_KEYS:
        if key in ac:
            names = ac[key]
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise r.fail(f"[activation_checkpoint] {key}",
                             f"must be a list of module names, got {names!r}")
            r.set("training.sac_force_recompute", names, f"[activation_checkpoint] {key}")
            return
    if not registry:
        r.fallback("training.sac_force_recompute", ["moe.router.gate"],
                   f"{r.name}: [activation_checkpoint] per_op_sac_force_recompute_mm_shapes_by_"
                   "fqns not set: torchtitan's default ['moe.router.gate'] ASSUMED (since "
                   "9a8cb98f1, 2025-07-16; before it nothing was forced: "
                   "--sac-force-recompute none); it changes MoE blocks only")


def sac_list(r: Reader, registry: bool) -> None:
    """Which op save list the job's per-op SAC ran (planner.spec.SacList). A TOML config is a
    torchtitan up to v0.2.2 (TOML configs went with 9810191bb, 2026-02-23), which had the
    per-model ``_op_sac_save_list``: the older list, for certain. A config registry does not
    name its torchtitan commit: ``current`` (the list since 114151ad4, 2026-03-23) is assumed
    and said."""
    if not registry:
        r.set("training.sac_list", "pre-2026-03-23",
              "[activation_checkpoint] selective_ac_option 'op' in a TOML config (torchtitan "
              "<= v0.2.2: the per-model op save list)")
        return
    r.fallback("training.sac_list", "current",
               f"{r.name}: selective checkpointing's save list ASSUMED current (torchtitan "
               "since 114151ad4, 2026-03-23): the config does not name its torchtitan commit; "
               "an older checkout saves fewer ops (--sac-list pre-2026-03-23)")


def precision_and_offload(r: Reader, doc: dict) -> None:
    for section in ("training", "parallelism"):
        sec = r.mapping(doc.get(section), f"[{section}]")
        if "enable_cpu_offload" in sec:
            off = r.boolean(sec["enable_cpu_offload"], f"[{section}] enable_cpu_offload")
            r.set("offload", "params_and_optimizer" if off else "none",
                  f"[{section}] enable_cpu_offload")
        if "mixed_precision_reduce" in sec:
            k = "mixed_precision_reduce"
            r.set("training.reduce_dtype", r.choose(sec[k], f"[{section}] {k}", REDUCE_DTYPES),
                  f"[{section}] {k}")
        dtype = sec.get("dtype")
        if dtype is not None and str(dtype).lower() in ("bfloat16", "bf16"):
            # config/configs.py: dtype bfloat16 trains the parameters themselves in bf16
            r.set("training.precision", "bf16", f"[{section}] dtype")
            continue
        if "mixed_precision_param" in sec:
            k = "mixed_precision_param"
            r.set("training.precision", r.choose(sec[k], f"[{section}] {k}", DTYPES),
                  f"[{section}] {k}")
    if "offload" not in r.raw:
        r.set("offload", "none", "[training] enable_cpu_offload (default false)")
    if "training.precision" not in r.raw:
        r.set("training.precision", "bf16-amp",
              "[training] mixed_precision_param (default bfloat16)")
    if r.raw.get("training.precision") == "bf16" and "training.reduce_dtype" not in r.raw:
        # parallelize.py apply_fsdp passes mixed_precision_reduce to MixedPrecisionPolicy
        # whatever [training] dtype is: a bf16 model still reduces (and, unsynced,
        # accumulates) in fp32. Under -amp and fp32 that is already --precision's own value.
        r.set("training.reduce_dtype", "fp32",
              "[training] mixed_precision_reduce (default float32)")


def compile_mode(r: Reader, doc: dict, training: dict) -> None:
    comp = r.mapping(doc.get("compile"), "[compile]")
    on = r.boolean(comp.get("enable"), "[compile] enable") if comp else \
        r.boolean(training.get("compile"), "[training] compile")
    if not on:
        return
    if not comp:  # 2025-02 and v0.1: [training] compile compiles each TransformerBlock
        r.set("training.compile", "blocks", "[training] compile")
        return
    parts = comp.get("components", MISSING)
    key = "[compile] components"
    if parts is MISSING:
        parts = r.default(TABLE, "compile.components")
        key = f"[compile] components ({r.label(TABLE)} default [model, loss])"
    if not isinstance(parts, list):
        raise r.fail("[compile] components", f"must be a list of model and loss, got {parts!r}")
    parts = {str(p).lower() for p in parts}
    unknown = parts - {"model", "loss"}
    if unknown:
        raise r.fail("[compile] components", f"unknown component {min(unknown)!r}; expected "
                     "model and loss")
    if parts == {"model", "loss"}:
        r.set("training.compile", "blocks+loss", key)
    elif parts == {"model"}:
        r.set("training.compile", "blocks", key)
    elif parts == {"loss"}:  # the loss compiled, the blocks eager: no fitcheck mode says it
        r.set("training.compile", Vocab("loss only"), key)


def optimizer(r: Reader, o: dict) -> None:
    kind = r.text(o.get("name"), "[optimizer] name")
    if kind:
        r.set("training.optimizer", OPTIMIZERS.get(kind.lower(), Vocab(kind.lower())),
              "[optimizer] name")
    impl = o.get("implementation")
    if impl is not None:
        r.set("training.optimizer_impl", r.choose(impl, "[optimizer] implementation",
                                                  IMPLEMENTATIONS), "[optimizer] implementation")
    elif o.get("fused") is not None:  # 2025-02
        fused = r.boolean(o.get("fused"), "[optimizer] fused")
        r.set("training.optimizer_impl", "fused" if fused else "foreach", "[optimizer] fused")
    else:
        r.fallback("training.optimizer_impl", "fused",
                   f"{r.name}: [optimizer] implementation not given: torchtitan's default, fused")


def float8(r: Reader, doc: dict) -> None:
    """[float8] and [model] converters (torchtitan components/quantization/float8.py): the
    "float8" converter (or the older enable_float8_linear) swaps the linears for torchao's
    Float8Linear with recipe_name's config (none given: tensorwise); float8 all-gather as
    enable_fsdp_float8_all_gather says. precompute_float8_dynamic_scale_for_fsdp folds the
    per-weight amax all-reduces into one (no memory; its latency is not modelled either way);
    force_recompute_fp8_weight_in_bwd does nothing since pytorch/ao#2356 (2025-06)."""
    f8 = r.mapping(doc.get("float8"), "[float8]")
    if not f8:  # 0.2: [quantize.linear.float8]
        q = r.mapping(r.mapping(doc.get("quantize"), "[quantize]").get("linear"),
                      "[quantize.linear]")
        f8 = r.mapping(q.get("float8"), "[quantize.linear.float8]")
    converters = r.mapping(doc.get("model"), "[model]").get("converters")
    names = [str(c) for c in converters] if isinstance(converters, list) else []
    f8_names = ("float8", "quantize.linear.float8")  # the converter's name before / in 0.2+
    other = [n for n in names if "lora" not in n.lower() and n not in f8_names]
    on = any(n in names for n in f8_names) or r.boolean(f8.get("enable_float8_linear"),
                                       "[float8] enable_float8_linear")
    if on:
        key = "[model] converters" if any(n in names for n in f8_names) else \
            "[float8] enable_float8_linear"
        recipe = f8.get("recipe_name")
        r.set("training.float8", Vocab(str(recipe)) if recipe else "tensorwise",
              "[float8] recipe_name" if recipe else f"{key} (recipe_name not given: "
              "tensorwise)")
        if r.boolean(f8.get("enable_fsdp_float8_all_gather"),
                     "[float8] enable_fsdp_float8_all_gather"):
            r.set("training.float8_all_gather", True, "[float8] enable_fsdp_float8_all_gather")
        fqns = f8.get("filter_fqns")
        if isinstance(fqns, list) and [str(x) for x in fqns] not in ([], ["output"], ["lm_head"]):
            r.set("training.float8_filter_fqns", Unmodelled(
                fqns, f"float8 filter_fqns {','.join(map(str, fqns))} ({r.name} [float8] "
                "filter_fqns: linears kept in bf16 beside the output head) is not modelled "
                "yet"), "[float8] filter_fqns")
    if other:
        r.set("training.float8" if not on else "training.model_converters",
              Vocab(",".join(other)), "[model] converters")
    if len(names) > len(other) + sum(n in names for n in f8_names):
        r.set("finetune.lora_rank", Vocab("torchtitan LoRA converter"), "[model] converters")


def loss(r: Reader, value: Any) -> None:
    """0.3's loss config (a TOML file has none: torchtitan's cross-entropy upcasts the logits)."""
    if not isinstance(value, dict):
        return
    kind = str(value.get("class", ""))
    if kind.endswith("ChunkedLossWrapper.Config"):
        r.set("training.loss", "fused", "loss (ChunkedLossWrapper: lm_head and loss per "
              "sequence chunk, backward per chunk)")
    elif kind.endswith("CrossEntropyLoss.Config"):
        r.set("training.loss", "fp32", "loss (CrossEntropyLoss: fp32 logits)")
    elif kind:
        r.set("training.loss", Vocab(kind), "loss")


# ---------------------------------------------------------------------------------------------
# 0.3: a config_registry.py function, laid out as the TOML sections


AC_CLASSES = {"SelectiveAC": "selective", "FullAC": "full", "MemoryBudgetAC": "memory_budget"}


def from_registry(cfg: Any, function: str, module: str | None, name: str) -> dict[str, Any]:
    """The Trainer.Config a registry function returns (planner.jobs.pyconfig.Cls), as a
    TOML-shaped document the reader above reads."""
    from planner.jobs.pyconfig import Cls, Opaque
    from planner.jobs.record import JobError

    if not isinstance(cfg, Cls) or not cfg.cls.endswith("Config"):
        raise JobError(f"{name}: {function} returns {cfg}, not a Trainer.Config")

    def plain(v: Any) -> Any:
        if isinstance(v, Cls):
            return {**{k: plain(x) for k, x in v.items() if k != "__args__"}, "class": v.cls}
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, Opaque):
            return str(v)
        return v

    doc: dict[str, Any] = {REGISTRY: function}
    for key, v in cfg.items():
        if key == "model_spec":
            doc["model"] = _model_spec(v, module)
            f8 = doc["model"].pop("float8", None)
            if f8 is not None:  # Float8LinearConverter.Config(...)'s keywords: [float8]
                doc["float8"] = f8
        elif key == "activation_checkpoint":
            doc[key] = _ac(v)
        elif key == "optimizer":
            doc[key] = _optimizer(v)
        elif key in ("training", "parallelism", "compile", "debug", "comm"):
            section = plain(v)
            if isinstance(section, dict):
                section.pop("class", None)
            doc[key] = section
        else:
            doc[key] = plain(v)
    doc.setdefault("activation_checkpoint", {"mode": "selective"})  # Trainer.Config default
    return doc


def _model_spec(v: Any, module: str | None) -> dict[str, Any]:
    from planner.jobs.pyconfig import Cls

    if not isinstance(v, Cls) or v.cls != "model_registry":
        return {"name": module, "flavor": str(v)}
    args = v.get("__args__") or [None]
    converters = [c.cls.rsplit(".Config", 1)[0] if isinstance(c, Cls) else str(c)
                  for c in v.get("converters") or []]
    out: dict[str, Any] = {"name": module, "flavor": args[0]}
    for c in v.get("converters") or []:
        if isinstance(c, Cls) and c.cls.rsplit(".Config", 1)[0] == "Float8LinearConverter":
            # the TOML layout's [float8] keys, as the converter's keywords name them; 0.3 /
            # main's Float8LinearConverter.Config: recipe_name "rowwise" by default (tensorwise
            # and float8 all-gather are gone: quantization/float8.py at b5bcd76c)
            out["float8"] = {"recipe_name": "rowwise",
                             **{k: x for k, x in c.items() if k != "__args__"}}
    converters = ["float8" if n == "Float8LinearConverter" else n for n in converters]
    if converters:
        out["converters"] = converters
    return out


def _ac(v: Any) -> dict[str, Any]:
    from planner.jobs.pyconfig import Cls

    if v is None:
        return {"mode": "none"}
    if isinstance(v, Cls):
        cls = v.cls.rsplit(".Config", 1)[0].rsplit(".", 1)[-1]
        mode = AC_CLASSES.get(cls, cls)
        out = {"mode": mode if mode in AC_CLASSES.values() else f"{mode}"}
        if mode == "selective":
            out["selective_ac_option"] = "op"  # per-op SAC (_get_default_save_ops)
        out.update({k: x for k, x in v.items() if k != "__args__"})
        return out
    return {"mode": str(v)}


def _optimizer(v: Any) -> dict[str, Any]:
    from planner.jobs.pyconfig import Cls

    if isinstance(v, Cls) and v.cls == "default_adamw":
        return {"name": "AdamW"}  # components/optimizer/optimizer.py: one AdamW group
    if isinstance(v, Cls):
        groups = v.get("param_groups") or []
        names = {str(g.get("optimizer_name")) for g in groups if isinstance(g, Cls)}
        out: dict[str, Any] = {}
        if len(names) == 1:
            out["name"] = names.pop()
        elif names:
            out["name"] = "+".join(sorted(names))
        if "implementation" in v:
            out["implementation"] = v["implementation"]
        return out
    return {}
