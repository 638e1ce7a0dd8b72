"""A torchtitan TOML (train_configs/*.toml, torchtitan/models/*/train_configs/*.toml).

Three layouts, told apart and named in ``Job.layout``: 2025-02 (parallel degrees under
[training], pipeline/context under [experimental], [training] compile), v0.1 ([parallelism],
[training] compile, local_batch_size) and v0.2 ([parallelism], [compile] enable/components).
[model] name + flavor -> a preset (llama3 8B -> llama3-8b, ...); [training] batch_size /
local_batch_size -> micro-batch, global_batch_size (-1: local x DP) -> the accumulation,
seq_len; data_parallel_shard_degree (-1 or > 1) -> FSDP2 full_shard, with replicate > 1 ->
hybrid_shard, shard 1 and replicate > 1 -> ddp; fsdp_reshard_after_forward "never" ->
shard_grad_op; tensor/pipeline/context/expert degrees > 1 -> parallel.*; [activation_checkpoint]
mode none/selective/full (+ selective_ac_option: 'op' selective, k = full on every k-th block);
enable_cpu_offload -> params_and_optimizer; mixed_precision_param bfloat16 -> bf16-amp (FSDP2
MixedPrecisionPolicy over fp32 params), float32 -> fp32; [optimizer] name / implementation;
compile -> blocks (torchtitan compiles each TransformerBlock); float8 -> training.float8.
torchtitan builds on the meta device, and its run_train.sh sets expandable segments.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import Vocab

FLAVORS = {  # torchtitan/models/<name>/__init__.py flavors -> fitcheck presets
    ("llama3", "8b"): "llama3-8b", ("llama3", "70b"): "llama3-70b",
    ("llama3", "405b"): "llama3.1-405b", ("llama2", "7b"): "llama2-7b",
    ("llama2", "13b"): "llama2-13b", ("llama2", "70b"): "llama2-70b",
}
AC_MODES = {"none": "none", "selective": "selective", "full": "full",
            "memory_budget": Vocab("memory_budget")}
OPTIMIZERS = {"adamw": "adamw", "adam": "adam", "sgd": "sgd"}
IMPLEMENTATIONS = {"fused": "fused", "foreach": "foreach", "for-loop": "for-loop"}
DTYPES = {"bfloat16": "bf16-amp", "float32": "fp32", "float16": Vocab("fp16-param")}
RESHARD = {"default": None, "always": "full_shard", "never": "shard_grad_op"}


def detect(doc: Any) -> int:
    return sum(2 for k in ("job", "model", "training", "parallelism", "activation_checkpoint",
                           "optimizer", "lr_scheduler", "checkpoint", "metrics", "float8",
                           "experimental", "compile") if k in doc)


def layout(doc: dict) -> str:
    if "parallelism" not in doc:
        return "torchtitan 2025-02 layout: parallel degrees under [training], [experimental]"
    if "compile" in doc:
        return "torchtitan v0.2 layout: [parallelism], [compile]"
    return "torchtitan v0.1 layout: [parallelism], [training] compile"


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    r.layout = layout(doc)
    par_section = "parallelism" if "parallelism" in doc else "training"
    training = r.mapping(doc.get("training"), "[training]")
    par = r.mapping(doc.get(par_section), f"[{par_section}]")
    exp = r.mapping(doc.get("experimental"), "[experimental]")
    model(r, r.mapping(doc.get("model"), "[model]"))
    # ---- batch and sequence
    for key in ("batch_size", "local_batch_size"):
        r.set("training.micro_batch", r.count(training.get(key), f"[training] {key}"),
              f"[training] {key}")
    r.set("training.seq", r.count(training.get("seq_len"), "[training] seq_len"),
          "[training] seq_len")
    gb = training.get("global_batch_size", MISSING)
    if gb not in (MISSING, -1, "-1"):
        r.set("training.global_batch", r.count(gb, "[training] global_batch_size"),
              "[training] global_batch_size")
    # ---- parallelism
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
        if d not in (MISSING, None) and d > 1:
            r.set(path, d, f"[{where}] {name}")
    degrees = [shard, rep] + [deg(n, exp if n in exp else par, par_section) for n in
                              ("tensor_parallel_degree", "pipeline_parallel_degree",
                               "context_parallel_degree")]
    if all(isinstance(d, int) and d > 0 for d in degrees[:1]) and shard not in (None, -1):
        total = 1
        for d in degrees:
            total *= d if isinstance(d, int) and d > 0 else 1
        r.set("hardware.n", total, f"[{par_section}] degrees (product)")
    r.set("training.fsdp_version", 2, "torchtitan (FSDP2 fully_shard)")
    r.set("training.init", "meta", "torchtitan (meta-device init)")
    r.fallback("training.allocator", "expandable",
               f"{r.name}: allocator expandable: torchtitan's run_train.sh sets "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    # ---- checkpointing, offload, precision, compile
    ac = r.mapping(doc.get("activation_checkpoint"), "[activation_checkpoint]")
    ac_key = "[activation_checkpoint] mode" + ("" if "mode" in ac else " (default selective)")
    mode = r.choose(ac.get("mode", "selective"), ac_key, AC_MODES)
    if mode == "selective":
        opt = r.text(ac.get("selective_ac_option", "2"), "[activation_checkpoint] "
                     "selective_ac_option")
        if opt != "op":
            k = r.count(opt, "[activation_checkpoint] selective_ac_option")
            mode = "full" if k == 1 else Vocab(f"full-every-{k}-blocks")
    r.set("checkpointing", mode, ac_key)
    for section in ("training", "parallelism"):
        sec = r.mapping(doc.get(section), f"[{section}]")
        if "enable_cpu_offload" in sec:
            off = r.boolean(sec["enable_cpu_offload"], f"[{section}] enable_cpu_offload")
            r.set("offload", "params_and_optimizer" if off else "none",
                  f"[{section}] enable_cpu_offload")
        for k, path in (("mixed_precision_param", "training.precision"),
                        ("mixed_precision_reduce", "training.reduce_dtype")):
            if k in sec:
                v = r.choose(sec[k], f"[{section}] {k}", {**DTYPES, "float32": "fp32"})
                if path == "training.reduce_dtype":
                    v = None if v == "fp32" else Vocab(str(sec[k]))
                r.set(path, v, f"[{section}] {k}")
    if "offload" not in r.raw:
        r.set("offload", "none", "[training] enable_cpu_offload (default false)")
    if "training.precision" not in r.raw:
        r.set("training.precision", "bf16-amp",
              "[training] mixed_precision_param (default bfloat16)")
    comp = r.mapping(doc.get("compile"), "[compile]")
    on = r.boolean(comp.get("enable"), "[compile] enable") if comp else \
        r.boolean(training.get("compile"), "[training] compile")
    if on:
        parts = comp.get("components") if comp else None
        # [compile] components lists what torchtitan compiles: "model" (each block), "loss"
        with_loss = isinstance(parts, list) and "loss" in parts
        r.set("training.compile", "blocks+loss" if with_loss else "blocks",
              "[compile] components" if with_loss else
              "[compile] enable" if comp else "[training] compile")
    optimizer(r, r.mapping(doc.get("optimizer"), "[optimizer]"))
    float8(r, doc)


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


def optimizer(r: Reader, o: dict) -> None:
    kind = r.text(o.get("name"), "[optimizer] name")
    if kind:
        r.set("training.optimizer", OPTIMIZERS.get(kind.lower(), Vocab(kind.lower())),
              "[optimizer] name")
    impl = o.get("implementation")
    if impl is not None:
        r.set("training.optimizer_impl", r.choose(impl, "[optimizer] implementation",
                                                  IMPLEMENTATIONS), "[optimizer] implementation")
    else:
        r.fallback("training.optimizer_impl", "fused",
                   f"{r.name}: [optimizer] implementation not given: torchtitan's default, fused")


def float8(r: Reader, doc: dict) -> None:
    f8 = r.mapping(doc.get("float8"), "[float8]")
    if r.boolean(f8.get("enable_float8_linear"), "[float8] enable_float8_linear"):
        r.set("training.float8", True, "[float8] enable_float8_linear")
    converters = r.mapping(doc.get("model"), "[model]").get("converters")
    if isinstance(converters, list) and any("float8" in str(c) for c in converters):
        r.set("training.float8", True, "[model] converters")
