"""An axolotl config YAML (https://docs.axolotl.ai/docs/config-reference.html), against axolotl's
key table (planner/data/job_keys_axolotl.json, 0.19.0; axolotl ignores keys it does not know,
so an unknown key is a warning).

base_model -> the model; sequence_len (default 512), micro_batch_size (1),
gradient_accumulation_steps (1; or batch_size / micro_batch_size); bf16 (default auto: true on
a bf16-capable GPU; axolotl then loads the model in bf16) / fp16 -> amp precision,
bfloat16/float16 -> pure 16-bit, float32; fp8 -> training.float8; optimizer (default
adamw_torch_fused); gradient_checkpointing (true -> full; offload/offload_disk not modelled),
activation_offloading true -> training.activation_offload, impl trl (legacy / disk: not modelled);
flash_attention / sdp_attention / flex_attention / sage_attention / attn_implementation ->
attention; torch_compile;
liger_fused_linear_cross_entropy / cut_cross_entropy -> fused loss, chunked_cross_entropy
(_num_chunks) -> chunked; adapter lora/qlora with lora_r, lora_dropout, lora_target_linear /
lora_target_modules, lora_modules_to_save, load_in_4bit / load_in_8bit, bnb_config_kwargs,
peft_autocast_adapter_dtype -> finetune.*; unfrozen_parameters -> finetune.freeze; fsdp /
fsdp_config / fsdp_version; deepspeed (a path); dp_shard_size x dp_replicate_size (HSDP),
tensor_parallel_size, context_parallel_size (sequence_parallel_degree), expert_parallel_size
-> strategy, parallel.* and, when dp_shard_size is given, the GPU count; rl (dpo, ipo, kto,
orpo, simpo, grpo, ...) and reward models -> what they add (not modelled).
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers import trainer
from planner.jobs.readers.common import ALL_LINEAR, MISSING, Reader, unread_cp, unread_ep
from planner.jobs.record import Unmodelled, Vocab

TABLE = "axolotl"
RL_PAIRED = ("dpo", "ipo", "kto", "orpo", "simpo", "cpo")
RL_REFERENCE = ("dpo", "ipo", "kto")
RL_GENERATION = ("grpo", "gdpo", "ebft")
PLUGINS = {  # integrations/<name>: what listing the plugin does with its keys left out
    "CutCrossEntropyPlugin": "loss",  # cut_cross_entropy defaults to true
    "LigerPlugin": None, "ExpertParallelPlugin": None, "KernelsPlugin": None,
    "SwanLabPlugin": None, "LMEvalPlugin": None, "NemoGymPlugin": None,
    "DenseMixerPlugin": "DenseMixer MoE routing (all experts computed)",
    "SpectrumPlugin": "Spectrum (only the layers with the highest signal-to-noise ratio train)",
    "KDPlugin": "knowledge distillation (teacher logits)",
    "GrokfastPlugin": "Grokfast (an EMA of the gradients)",
    "LLMCompressorPlugin": "LLM Compressor (sparse or quantized training)",
    "DiffusionPlugin": "diffusion language-model training",
    "MoraPlugin": "MoRA adapters",
    "HatcheryPlugin": "Hatchery remote training",
}
"""None: the plugin only makes its keys valid, and the keys are read (or audited) as given."""


def detect(doc: Any) -> int:
    from planner.jobs.keys import recipe_score

    return recipe_score(TABLE, doc)


def value(r: Reader, doc: dict, key: str) -> tuple[Any, str]:
    return trainer.value(r, TABLE, doc, key)


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    model = doc.get("base_model_config") or doc.get("base_model")
    r.model(model, "base_model_config" if doc.get("base_model_config") else "base_model")
    seq, key = value(r, doc, "sequence_len")
    if doc.get("max_packed_sequence_len"):
        seq, key = doc["max_packed_sequence_len"], "max_packed_sequence_len"
    r.set("training.seq", r.count(seq, key), key)
    mb, key = value(r, doc, "micro_batch_size")
    mb = r.count(mb, key)
    r.set("training.micro_batch", mb, key)
    if doc.get("gradient_accumulation_steps") is None and doc.get("batch_size") is not None:
        bs = r.count(doc["batch_size"], "batch_size")
        if bs % mb:
            raise r.fail("batch_size", f"({bs}) must be a multiple of micro_batch_size ({mb})")
        ga, key = bs // mb, "batch_size / micro_batch_size"
    else:
        ga, key = value(r, doc, "gradient_accumulation_steps")
        ga = r.count(ga, key)
    r.set("training.grad_accum", ga, key)
    precision(r, doc)
    optim, key = value(r, doc, "optimizer")
    r.optimizer(optim, key)
    checkpointing(r, doc)
    attention(r, doc)
    tf32 = r.boolean(doc.get("tf32"), "tf32")
    if tf32 is not None:  # passed to TrainingArguments.tf32
        r.set("training.tf32", tf32, "tf32")
    tc = doc.get("torch_compile")
    if tc is True or (isinstance(tc, str) and tc.lower() in ("true", "auto")):
        r.set("training.compile", "model", "torch_compile")
    for key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        if r.boolean(doc.get(key), key):
            r.set("training.loss", "fused", key)
    if r.boolean(doc.get("chunked_cross_entropy"), "chunked_cross_entropy"):
        n = r.count(doc.get("chunked_cross_entropy_num_chunks"),
                    "chunked_cross_entropy_num_chunks")
        r.set("training.loss", f"chunked:{n}" if n else "chunked", "chunked_cross_entropy")
    finetune(r, doc)
    distributed = trainer.fsdp(r, doc) | trainer.ds(r, doc)
    parallel(r, doc, distributed)
    if not distributed and "strategy" not in r.raw:
        r.fallback("strategy", "ddp", f"{r.name}: no fsdp or deepspeed: plain DDP (or one GPU)")
    if (ga or 1) > 1:
        r.fallback("training.grad_sync", "last",
                   f"{r.name}: gradient accumulation through the HF Trainer: no gradient sync "
                   "until the last micro-batch (no_sync)")
    kinds(r, doc)
    plugins(r, doc)
    r.audit(TABLE)


def plugins(r: Reader, doc: dict) -> None:
    listed = doc.get("plugins") or []
    if not isinstance(listed, list):
        raise r.fail("plugins", f"must be a list of plugin classes, got {listed!r}")
    for i, path in enumerate(listed):
        name = str(path).rsplit(".", 1)[-1]
        what = PLUGINS.get(name, f"the plugin {path} (fitcheck does not know what it does)")
        if what == "loss":
            if doc.get("cut_cross_entropy") is None:
                r.set("training.loss", "fused", "plugins (CutCrossEntropyPlugin: "
                      "cut_cross_entropy defaults to true)")
        elif what is not None:
            r.set(f"axolotl.plugins.{name}", Unmodelled(
                path, f"{what} ({r.name} plugins[{i}]: {path}) is not modelled yet"),
                f"plugins[{i}]")


def precision(r: Reader, doc: dict) -> None:
    """utils/config/__init__.py: bf16 auto -> true on a bf16-capable GPU (unless fp16); bf16 or
    bfloat16 -> the model is loaded in bfloat16 (cfg.torch_dtype)."""
    bf16, bkey = value(r, doc, "bf16")
    fp16 = r.boolean(doc.get("fp16"), "fp16")
    auto = isinstance(bf16, str) and bf16.strip().lower() == "auto"
    amp_bf16 = (auto and not fp16) or (not auto and r.boolean(bf16, bkey))
    if amp_bf16 and fp16:
        raise r.fail("bf16", f"{bf16!r} and fp16 true contradict each other; set one")
    if r.boolean(doc.get("bfloat16"), "bfloat16"):
        r.set("training.precision", "bf16", "bfloat16")
    elif r.boolean(doc.get("float16"), "float16"):
        r.set("training.precision", "bf16", "float16")  # pure fp16: the same bytes as pure bf16
        r.warn(f"{r.name}: float16: pure fp16, sized as pure bf16 (the same bytes)")
    elif amp_bf16:
        r.set("training.precision", "bf16-amp", bkey)
        trainer.model_dtype(r, "bfloat16", bkey)
        if auto:
            r.warn(f"{r.name}: {bkey}: auto read as bf16 (a bf16-capable GPU)")
    elif fp16:
        r.set("training.precision", "fp16-amp", "fp16")
        trainer.model_dtype(r, "float16", "fp16")
    else:
        r.set("training.precision", "fp32", "float32" if doc.get("float32") else "bf16 (false)")
    if r.boolean(doc.get("fp8"), "fp8"):
        # torchao float8 through accelerate's AORecipeKwargs: a default Float8LinearConfig
        # (tensorwise)
        r.set("training.float8", "tensorwise", "fp8")
        if r.boolean(doc.get("fp8_enable_fsdp_float8_all_gather"),
                     "fp8_enable_fsdp_float8_all_gather"):
            r.set("training.float8_all_gather", True, "fp8_enable_fsdp_float8_all_gather")


def checkpointing(r: Reader, doc: dict) -> None:
    gc = doc.get("gradient_checkpointing")
    if gc is None:  # axolotl's default (false), unless fsdp_config's own checkpointing says
        r.fallback("checkpointing", "none", "")
    elif isinstance(gc, str) and gc.lower() not in ("true", "false"):
        r.set("checkpointing", Vocab(gc.lower()), "gradient_checkpointing")  # offload(_disk)
    else:
        r.set("checkpointing", "full" if r.boolean(gc, "gradient_checkpointing") else "none",
              "gradient_checkpointing")
    ao = doc.get("activation_offloading")
    if isinstance(ao, str) and ao.lower() not in ("true", "false"):
        # "legacy" (offloading checkpoint wrapper) and "disk": other mechanisms, not modelled
        r.set("training.activation_offload", Vocab(ao.lower()), "activation_offloading")
    elif ao not in (None, False, "false"):
        # true: TRL's OffloadActivations around the training step (axolotl's
        # ActivationOffloadingMixin): TRL's copy of torchtune's class
        on = r.boolean(ao, "activation_offloading")
        r.set("training.activation_offload", on, "activation_offloading")
        if on:
            r.set("training.activation_offload_impl", "trl", "activation_offloading")


def attention(r: Reader, doc: dict) -> None:
    for key in ("flash_attention", "sdp_attention", "xformers_attention", "flex_attention",
                "sage_attention"):
        if r.boolean(doc.get(key), key):
            r.set("training.attention", "sdpa", key)
    if r.boolean(doc.get("eager_attention"), "eager_attention"):
        r.set("training.attention", "eager", "eager_attention")
    if r.boolean(doc.get("s2_attention"), "s2_attention"):
        r.set("training.attention", Vocab("s2"), "s2_attention")
    trainer.attention(r, doc.get("attn_implementation"), "attn_implementation")


def finetune(r: Reader, doc: dict) -> None:
    adapter = (r.text(doc.get("adapter"), "adapter") or "").lower()
    if adapter:
        if adapter not in ("lora", "qlora"):
            r.set("finetune.lora_rank", Vocab(adapter), "adapter")
        else:
            rank = r.count(doc.get("lora_r"), "lora_r")
            if rank is None:
                raise r.fail("lora_r", f"required with adapter {adapter}")
            r.set("finetune.lora_rank", rank, "lora_r")
            p, key = value(r, doc, "lora_dropout")
            r.set("finetune.lora_dropout", r.probability(p or 0.0, key) > 0, key)
        if r.boolean(doc.get("lora_target_linear"), "lora_target_linear"):
            r.set("finetune.lora_targets", ALL_LINEAR, "lora_target_linear")
        else:
            r.lora_targets(doc.get("lora_target_modules"), "lora_target_modules")
        r.set("finetune.modules_to_save", doc.get("lora_modules_to_save") or None,
              "lora_modules_to_save")
        autocast = r.boolean(doc.get("peft_autocast_adapter_dtype"),
                             "peft_autocast_adapter_dtype")
        if autocast is False:
            r.set("finetune.lora_dtype", "base", "peft_autocast_adapter_dtype")
    bnb = r.mapping(doc.get("bnb_config_kwargs"), "bnb_config_kwargs")
    if r.boolean(doc.get("load_in_4bit"), "load_in_4bit"):
        qt = (r.text(bnb.get("bnb_4bit_quant_type"), "bnb_config_kwargs.bnb_4bit_quant_type")
              or "nf4").lower()
        r.set("finetune.quantize_base", "nf4" if qt == "nf4" else Vocab(qt), "load_in_4bit")
        dq = bnb.get("bnb_4bit_use_double_quant", MISSING)
        if dq is not MISSING:
            r.set("finetune.double_quant", r.boolean(dq, "bnb_config_kwargs."
                  "bnb_4bit_use_double_quant"), "bnb_config_kwargs.bnb_4bit_use_double_quant")
    elif r.boolean(doc.get("load_in_8bit"), "load_in_8bit"):
        r.set("finetune.quantize_base", "int8", "load_in_8bit")
    if adapter == "qlora" and "finetune.quantize_base" not in r.raw:
        raise r.fail("adapter", "qlora needs load_in_4bit: true")
    unfrozen = doc.get("unfrozen_parameters")
    if unfrozen:
        # name patterns, not a layer count: not something --freeze can say (unmodelled)
        n = len(unfrozen) if isinstance(unfrozen, list) else 1
        r.set("finetune.freeze", Vocab(f"all but {n} unfrozen_parameters patterns"),
              "unfrozen_parameters")


def parallel(r: Reader, doc: dict, distributed: bool) -> None:
    """dp_replicate_size x dp_shard_size (x tp x cp): axolotl's device mesh (utils/schemas/
    config.py; the FSDP2 path). A given dp_shard_size fixes the GPU count."""
    def size(key: str) -> int | None:
        return r.count(doc.get(key), key) if doc.get(key) is not None else None

    rep, shard = size("dp_replicate_size"), size("dp_shard_size")
    tp, ep = size("tensor_parallel_size"), size("expert_parallel_size")
    cp_key = "context_parallel_size" if doc.get("context_parallel_size") is not None \
        else "sequence_parallel_degree"
    cp = size(cp_key)
    if rep and rep > 1:
        if shard == 1:
            r.replace("strategy", "ddp", "dp_replicate_size (dp_shard_size 1)")
        else:
            r.replace("strategy", "hybrid_shard", "dp_replicate_size x dp_shard_size")
            if "training.fsdp_version" not in r.raw:
                r.set("training.fsdp_version", 2, "dp_replicate_size (FSDP2 device mesh)")
            r.raw.setdefault("offload", "none")
    elif shard and shard > 1 and not distributed:
        r.set("strategy", "full_shard", "dp_shard_size")
        r.set("training.fsdp_version", 2, "dp_shard_size (FSDP2 device mesh)")
        r.set("offload", "none", "dp_shard_size (no offload)")
    if tp and tp > 1:
        r.set("parallel.tp", tp, "tensor_parallel_size")
    if cp and cp > 1:
        r.set("parallel.cp", unread_cp(r, cp, cp_key, ring_attention(r, doc)), cp_key)
    if ep and ep > 1:
        # integrations/expert_parallel/plugin.py (067b021c): ExpertParallelPlugin
        r.set("parallel.ep", unread_ep(
            r, ep, "expert_parallel_size", "axolotl's swaps the MoE dispatch and combine for "
            "DeepEP's fused kernels (expert_parallel_backend deep_ep, integrations/"
            "expert_parallel/plugin.py) in place of torch's all-to-all, with its own buffers "
            "(expert_parallel_num_nvl_bytes / _num_rdma_bytes)"), "expert_parallel_size")
    if shard:
        n = (rep or 1) * shard * (tp or 1) * (cp or 1)
        r.set("hardware.n", n, "dp_replicate_size x dp_shard_size x tensor_parallel_size x "
              "context_parallel_size")


def ring_attention(r: Reader, doc: dict) -> str:
    """How axolotl's context parallel differs from torch's ``context_parallel`` (067b021c):
    it patches transformers' flash-attention-2 forward with ring-flash-attn
    (monkeypatch/ring_attn/patch.py ``register_ring_attn_from_device_mesh``) over contiguous
    sequence chunks (utils/ctx_managers/sequence_parallel.py: ``chunk`` per rank, no
    head-tail load balancing); ``ring_attn_func`` defaults to varlen_llama3 with sample
    packing, else batch_ring (utils/schemas/validation.py ``validate_ring_attn_func``)."""
    func = (r.text(doc.get("ring_attn_func"), "ring_attn_func") or
            ("varlen_llama3" if doc.get("sample_packing") else "batch_ring")).lower()
    base = ("axolotl's patches flash-attention-2 with ring-flash-attn over contiguous "
            "sequence chunks (no load balancing; monkeypatch/ring_attn/patch.py)")
    if func == "varlen_llama3":
        stride = doc.get("heads_k_stride") or 1
        return (f"{base}: ring_attn_func varlen_llama3 all-gathers every rank's keys and "
                f"values (heads_k_stride {stride}: key heads gathered per "
                "step; llama3_flash_attn_varlen_func), not a ring of SDPA steps")
    return (f"{base}: ring_attn_func {func} passes keys and values round the ring by "
            "point-to-point send/recv (ring_flash_attn_func), with flash-attn's kernels and "
            "the key/value heads unrepeated")


def kinds(r: Reader, doc: dict) -> None:
    """rl / reward models: what they add to the step (never modelled, never dropped)."""
    rl = (r.text(doc.get("rl"), "rl") or "").lower()
    trl = r.mapping(doc.get("trl"), "trl")
    lora = bool(doc.get("adapter"))
    if rl in RL_PAIRED:
        r.set("training.paired_batch", True, f"rl {rl} (chosen + rejected sequences)")
        if rl in RL_REFERENCE and not lora and not doc.get("precompute_ref_log_probs"):
            r.set("training.reference_model", True, f"rl {rl} (a frozen reference model)")
    elif rl in RL_GENERATION:
        r.set("training.generation", True, f"rl {rl} (completions generated each step)")
        beta = trl.get("beta", doc.get("rl_beta"))
        if isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta > 0 and not lora:
            r.set("training.reference_model", True, "trl.beta (> 0: a reference model)")
    elif rl:
        r.set("training.paired_batch", Vocab(rl), "rl")
    if doc.get("reward_model") or doc.get("process_reward_model"):
        r.set("training.paired_batch", True, "reward_model (chosen + rejected sequences)")
