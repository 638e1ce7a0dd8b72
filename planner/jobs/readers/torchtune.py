"""A torchtune recipe config (recipes/configs/<model>/*.yaml, ``tune run <recipe> --config``),
against torchtune's key table (planner/data/job_keys_torchtune.json; torchtune ignores
top-level keys no recipe reads: a warning).

model._component_ -> the model (torchtune.models.llama3_1.llama3_1_8b -> llama3.1-8b; the
lora_/qlora_ builders -> LoRA, with lora_attn_modules, apply_lora_to_mlp, lora_rank,
lora_dropout, quantize_base; apply_lora_to_output: not modelled); batch_size -> micro-batch;
gradient_accumulation_steps; tokenizer.max_seq_len -> seq (null: the dataset decides; give
--seq); dtype bf16 -> pure bf16 (the recipes train the weights in the dtype: "all activations,
gradients and optimizer states are in bfloat16"), fp32 -> fp32; optimizer._component_ (+ fused
/ foreach) -> optimizer; loss._component_ (LinearCrossEntropyLoss, CEWithChunkedOutputLoss ->
chunked:num_output_chunks); enable_activation_checkpointing -> full (ac_mode selective: not
modelled); enable_activation_offloading -> training.activation_offload; optimizer_in_bwd ->
training.optimizer_in_backward (a single-device full fine-tune; under FSDP2 a warning, the plan
an upper bound; refused with clip_grad_norm, as torchtune refuses it); compile true -> each
layer and the loss; fsdp_cpu_offload -> params_and_optimizer; fsdp_reshard_after_forward false ->
shard_grad_op; data_parallel_shard_dim / _replicate_dim / tensor_parallel_dim -> strategy and
parallel.*; context_parallel_dim and context_parallel_rotate_method -> parallel.cp and
parallel.cp_rotate (torch's context_parallel as torchtitan wires it: ``context_parallel``
below). The recipe decides the strategy: a
*_distributed recipe (the config's name says which: *_single_device.yaml runs on one GPU)
shards every layer with FSDP2. The attention is torchtune's own (``attention`` below): SDPA,
flex attention for packed samples (planned as sdpa), Gemma-2's eager ops.
"""

from __future__ import annotations

import os
import re
from typing import Any

from planner.jobs.readers.common import Reader
from planner.jobs.record import FrameworkAttention, Vocab

TABLE = "torchtune"
LORA_MODULES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "output_proj": "o"}
OPTIMIZERS = {"torch.optim.adamw": ("adamw", None), "torch.optim.adam": ("adam", None),
              "torch.optim.sgd": ("sgd", None),
              "bitsandbytes.optim.pagedadamw8bit": ("adamw-8bit", None),
              "bitsandbytes.optim.adamw8bit": ("adamw-8bit", None),
              "torchao.optim.adamw8bit": ("adamw-8bit", None),
              "torchao.prototype.low_bit_optim.adamw8bit": ("adamw-8bit", None),
              "bitsandbytes.optim.pagedadamw": ("adamw", None)}
MODEL = re.compile(r"^torchtune\.models\.(?P<family>[a-z0-9_]+)\.(?P<lora>(q?lora_)?)"
                   r"(?P<builder>[a-z0-9_]+)$")


def detect(doc: Any) -> int:
    comps = sum(1 for v in doc.values() if isinstance(v, dict) and "_component_" in v)
    if not comps:
        return 0
    keys = ("batch_size", "gradient_accumulation_steps", "enable_activation_checkpointing",
            "checkpointer", "tokenizer", "dtype", "epochs", "max_steps_per_epoch", "loss",
            "metric_logger", "output_dir")
    return 10 + 3 * comps + sum(1 for k in keys if k in doc)


def preset_of(component: str) -> str | None:
    """torchtune.models.llama3_1.lora_llama3_1_8b -> the builder's fitcheck preset."""
    from planner.presets import resolve_name

    m = MODEL.match(component.lower())
    if m is None:
        return None
    builder = m.group("builder")
    family = m.group("family")
    # llama3_1_8b -> llama3.1-8b; qwen2_5_7b_instruct -> qwen2.5-7b; gemma2_9b -> gemma2-9b
    size = re.search(r"_(\d+(?:_\d+)?[bm])(?:_[a-z]+)*$", builder)
    if size is None:
        return None
    head = builder[:size.start()]
    version = re.sub(r"(\d)_(\d)", r"\1.\2", head).replace("_", "")
    for name in (f"{version}-{size.group(1).replace('_', '.')}",
                 f"{family.replace('_', '.')}-{size.group(1)}"):
        preset = resolve_name(name)
        if preset is not None:
            return preset
    return None


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    single = "single_device" in os.path.basename(r.name)
    r.layout = "torchtune recipe config" + (" (single device)" if single else "")
    if "optimizer" not in doc:  # every training recipe's config has one (recipes/configs/)
        training = doc.get("training")
        if isinstance(training, dict) and "optimizer" in training:
            raise r.fail("training.optimizer", "the async GRPO layout (orchestration, "
                         "inference, training sections) is not read; give the settings as "
                         "flags")
        raise r.fail("optimizer", "not set: this is a torchtune evaluation, generation or "
                     "quantization config (no training step to plan), not a training recipe")
    model(r, r.mapping(doc.get("model"), "model"))
    attention(r, doc)
    r.set("training.micro_batch", r.count(doc.get("batch_size"), "batch_size"), "batch_size")
    ga = r.count(r.default(TABLE, "gradient_accumulation_steps",
                           doc.get("gradient_accumulation_steps")), "gradient_accumulation_steps")
    r.set("training.grad_accum", ga, "gradient_accumulation_steps")
    tok = r.mapping(doc.get("tokenizer"), "tokenizer")
    seq = r.count(tok.get("max_seq_len"), "tokenizer.max_seq_len")
    if seq is not None:
        r.set("training.seq", seq, "tokenizer.max_seq_len")
    else:
        r.warn(f"{r.name}: tokenizer.max_seq_len is null: each sample keeps its own length; "
               "planned at --seq")
    dtype = (r.text(doc.get("dtype"), "dtype") or "bf16").lower()
    prec = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32"}.get(dtype)
    r.set("training.precision", prec or Vocab(dtype), "dtype" if "dtype" in doc
          else "dtype (the recipes' default: bf16)")
    checkpointing(r, doc)
    compiled = doc.get("compile", False)
    if compiled not in (False, None, "false", "False"):
        parts = compiled if isinstance(compiled, dict) else {}
        blocks = parts.get("model", True)
        with_loss = parts.get("loss", True)
        mode = ("blocks+loss" if with_loss else "blocks") if blocks else Vocab("loss only")
        r.set("training.compile", mode, "compile (each layer and the loss)" if mode ==
              "blocks+loss" else "compile")
    optimizer(r, r.mapping(doc.get("optimizer"), "optimizer"))
    loss(r, r.mapping(doc.get("loss"), "loss"))
    distribution(r, doc, single)
    in_backward(r, doc, single)
    if r.boolean(doc.get("enable_fp8_training"), "enable_fp8_training"):
        recipe = doc.get("fp8_recipe_name") or "tensorwise"
        r.set("training.float8", Vocab(str(recipe)), "enable_fp8_training")
    for key, path in (("teacher_model", "training.teacher_model"),
                      ("ref_checkpointer", "training.reference_model"),
                      ("policy_model", "training.generation")):
        if doc.get(key):
            r.set(path, True, key)
    if isinstance(doc.get("loss"), dict) and "dpo" in str(doc["loss"].get("_component_",
                                                                          "")).lower():
        r.set("training.paired_batch", True, "loss._component_ (DPO: chosen + rejected)")
    r.audit(TABLE)


def packed(r: Reader, doc: dict) -> bool:
    """Whether a dataset of the config packs its samples (``dataset.packed``, one dataset or
    a list of them)."""
    dataset = doc.get("dataset")
    sets = dataset if isinstance(dataset, list) else [dataset]
    return any(isinstance(s, dict) and r.boolean(s.get("packed"), "dataset.packed")
               for s in sets)


def attention(r: Reader, doc: dict) -> None:
    """The attention torchtune's own modules run, not transformers' (torchtune bd2a0fc7):
    ``MultiHeadAttention`` (modules/attention.py:140, :292) calls ``_sdpa_or_flex_attention()``
    (modules/attention_utils.py:185-250): ``nn.functional.scaled_dot_product_attention`` with
    ``is_causal`` and no mask, or, for packed samples (the collate's ``BlockMask``:
    data/_collate.py:611 ``packed_block_causal_mask``) on a GPU of compute capability >= 7.5
    (utils/_import_guard.py:12), a compiled ``flex_attention``. Either keeps the output and
    its logsumexp for backward, no T x T scores: fitcheck's sdpa. Gemma-2's own
    ``Gemma2Attention`` (models/gemma2/_attention.py:299-340) is eager: q·kᵀ, the tanh
    soft-cap, an additive mask, an fp32 softmax and ·v as separate ops (the T x T scores
    kept), and it refuses a packed batch's BlockMask (:218-222)."""
    comp = r.text(r.mapping(doc.get("model"), "model").get("_component_"), "model._component_")
    match = MODEL.match(comp.lower()) if comp else None
    if match is not None and match.group("family") == "gemma2":
        if packed(r, doc):
            raise r.fail("dataset.packed", "true with a Gemma-2 model: torchtune refuses it "
                         "(Gemma2Attention: \"Block masks are not implemeted yet, use "
                         "packed=False.\")")
        r.set("training.attention", FrameworkAttention("eager", (
            "torchtune's Gemma2Attention: q·kᵀ, tanh soft-cap, additive mask, fp32 softmax, ·v "
            "as eager ops (models/gemma2/_attention.py), no SDPA")), "model._component_ "
            "(torchtune's own attention)")
        return
    if packed(r, doc):
        why = ("torchtune's MultiHeadAttention with dataset.packed: flex_attention on the "
               "packed BlockMask (modules/attention_utils.py _sdpa_or_flex_attention), planned "
               "as sdpa: it keeps the output and logsumexp, no T x T scores; its speed "
               "assumed sdpa's")
    else:
        why = ("torchtune's MultiHeadAttention: torch's scaled_dot_product_attention, causal, "
               "no mask (modules/attention_utils.py _sdpa_or_flex_attention), not "
               "transformers' classes")
    r.set("training.attention", FrameworkAttention("sdpa", why), "model._component_ "
          "(torchtune's own attention)")


def model(r: Reader, m: dict) -> None:
    comp = r.text(m.get("_component_"), "model._component_")
    if comp is None:
        return
    match = MODEL.match(comp.lower())
    preset = preset_of(comp)
    if preset is not None:
        r.set("model.preset", preset, "model._component_")
        r.warn(f"{r.name}: model._component_ {comp} read as fitcheck's {preset} preset")
    else:
        from planner.jobs.record import Source

        r.unresolved = Source(r.name, f"model._component_ {comp!r}")
    lora = match is not None and bool(match.group("lora"))
    if not lora:
        return
    rank = r.count(m.get("lora_rank"), "model.lora_rank")
    if rank is None:
        raise r.fail("model.lora_rank", f"required by the LoRA builder {comp}")
    r.set("finetune.lora_rank", rank, "model.lora_rank")
    mods = m.get("lora_attn_modules") or []
    if not isinstance(mods, list):
        raise r.fail("model.lora_attn_modules", f"must be a list, got {mods!r}")
    targets = [LORA_MODULES.get(str(x).lower(), str(x)) for x in mods]
    if r.boolean(m.get("apply_lora_to_mlp"), "model.apply_lora_to_mlp"):
        targets += ["gate", "up", "down"]
    if targets:
        r.set("finetune.lora_targets", tuple(dict.fromkeys(targets)),
              "model.lora_attn_modules + apply_lora_to_mlp")
    if r.boolean(m.get("apply_lora_to_output"), "model.apply_lora_to_output"):
        r.set("finetune.lora_head", True, "model.apply_lora_to_output")
    p = m.get("lora_dropout", 0.0)
    r.set("finetune.lora_dropout", r.probability(p, "model.lora_dropout") > 0,
          "model.lora_dropout")
    r.set("finetune.lora_dtype", "base", "model._component_ (torchtune: adapters in the "
          "model's dtype)")
    quant = match.group("lora") == "qlora_" or r.boolean(m.get("quantize_base"),
                                                         "model.quantize_base")
    if quant:
        r.set("finetune.quantize_base", "nf4", "model._component_ (QLoRA: NF4 base)"
              if match.group("lora") == "qlora_" else "model.quantize_base")
        r.set("finetune.double_quant", True, "model._component_ (torchao NF4Tensor: the block "
              "scalers are quantized again, in blocks of 256)")


def checkpointing(r: Reader, doc: dict) -> None:
    ac = r.boolean(doc.get("enable_activation_checkpointing"),
                   "enable_activation_checkpointing")
    mode = r.text(doc.get("ac_mode"), "ac_mode")
    if ac and mode and mode.lower() == "selective":
        opt = doc.get("ac_option")
        r.set("checkpointing", "full" if opt in (1, "1") else Vocab(f"selective every {opt}"),
              "ac_mode")
    else:
        r.set("checkpointing", "full" if ac else "none",
              "enable_activation_checkpointing" if ac is not None else
              "enable_activation_checkpointing (the recipes' default: false)")
    if r.boolean(doc.get("enable_activation_offloading"), "enable_activation_offloading"):
        r.set("training.activation_offload", True, "enable_activation_offloading")


def optimizer(r: Reader, o: dict) -> None:
    comp = r.text(o.get("_component_"), "optimizer._component_")
    if comp is None:
        return
    kind, _ = OPTIMIZERS.get(comp.lower(), (Vocab(comp.rsplit(".", 1)[-1].lower()), None))
    r.set("training.optimizer", kind, "optimizer._component_")
    r.sgd_momentum(o.get("momentum"), "optimizer.momentum")
    fused = r.boolean(o.get("fused"), "optimizer.fused")
    foreach = r.boolean(o.get("foreach"), "optimizer.foreach")
    if comp.lower().startswith("torch.optim."):
        r.set("training.optimizer_impl", "fused" if fused else "for-loop" if foreach is False
              else "foreach", "optimizer.fused" if fused else "optimizer.foreach"
              if foreach is not None else "optimizer._component_ (torch's foreach default)")
    if "paged" in comp.lower():
        r.warn(f"{r.name}: optimizer._component_ {comp} is paged: its state may spill to host "
               "RAM under pressure; sized as if it stays on the GPU")


def in_backward(r: Reader, doc: dict, single: bool) -> None:
    """optimizer_in_bwd: the full-finetune recipes step each parameter in its
    post-accumulate-grad hook (torchtune/training/memory.py ``register_optim_in_bwd_hooks``)
    and raise on clip_grad_norm or gradient_accumulation_steps > 1 with it
    (recipes/full_finetune_single_device.py, ``__init__``); the LoRA recipes never read it.
    Planned on one GPU; a distributed recipe runs it under FSDP2 (each parameter steps after
    its unit's reduce-scatter), which is not modelled: planned without it, which holds every
    sharded gradient and the step's temporaries, an upper bound."""
    if not r.boolean(doc.get("optimizer_in_bwd"), "optimizer_in_bwd"):
        return
    if "lora_" in str(r.mapping(doc.get("model"), "model").get("_component_", "")):
        r.warn(f"{r.name}: optimizer_in_bwd is not read by torchtune's LoRA recipes; ignored")
        return
    if doc.get("clip_grad_norm") is not None:
        raise r.fail("clip_grad_norm", f"{doc['clip_grad_norm']!r} with optimizer_in_bwd: "
                     "torchtune refuses it (\"Gradient clipping is not supported with "
                     "optimizer in bwd\"); set clip_grad_norm: null")
    if not single:
        r.warn(f"{r.name}: optimizer_in_bwd under FSDP2 (each parameter stepped after its "
               "unit's reduce-scatter) is not modelled: planned without it, which holds "
               "more (an upper bound)")
        return
    r.set("training.optimizer_in_backward", True, "optimizer_in_bwd")


def loss(r: Reader, l: dict) -> None:
    comp = r.text(l.get("_component_"), "loss._component_")
    if comp is None:
        return
    short = comp.rsplit(".", 1)[-1]
    if short in ("LinearCrossEntropyLoss", "CEWithChunkedOutputLoss"):
        n = r.count(l.get("num_output_chunks", 8), "loss.num_output_chunks")
        r.set("training.loss", f"chunked:{n}", "loss._component_")
    elif short in ("CrossEntropyLoss",):
        r.set("training.loss", "fp32", "loss._component_")
    elif "dpo" not in short.lower():
        r.set("training.loss", Vocab(short), "loss._component_")


def distribution(r: Reader, doc: dict, single: bool) -> None:
    if single:
        r.set("strategy", "ddp", "the config's name (*_single_device: one GPU)")
        r.set("hardware.n", 1, "the config's name (*_single_device: one GPU)")
        r.set("offload", "none", "the config's name (*_single_device)")
        return
    off = r.boolean(doc.get("fsdp_cpu_offload"), "fsdp_cpu_offload")
    r.set("offload", "params_and_optimizer" if off else "none",
          "fsdp_cpu_offload" if off is not None else "fsdp_cpu_offload (default false)")
    reshard = r.boolean(doc.get("fsdp_reshard_after_forward", True),
                        "fsdp_reshard_after_forward")
    rep = r.count(doc.get("data_parallel_replicate_dim", 1), "data_parallel_replicate_dim") or 1
    shard = doc.get("data_parallel_shard_dim", -1)
    if rep > 1 and shard not in (1, "1"):
        strategy, key = "hybrid_shard", "data_parallel_replicate_dim"
    elif rep > 1:
        strategy, key = "ddp", "data_parallel_replicate_dim"
    else:
        strategy = "full_shard" if reshard else "shard_grad_op"
        key = "fsdp_reshard_after_forward" if "fsdp_reshard_after_forward" in doc else \
            "recipe (*_distributed: FSDP2 per layer)"
    r.set("strategy", strategy, key)
    r.set("training.fsdp_version", 2, "recipe (FSDP2 fully_shard)")
    tp = r.count(doc.get("tensor_parallel_dim") if doc.get("tensor_parallel_dim") is not None
                 else 1, "tensor_parallel_dim")
    if tp and tp > 1:
        r.set("parallel.tp", tp, "tensor_parallel_dim")
    context_parallel(r, doc)


def context_parallel(r: Reader, doc: dict) -> None:
    """context_parallel_dim -> parallel.cp, context_parallel_rotate_method -> parallel.cp_rotate.

    torchtune (bd2a0fc7) wires torch's ``context_parallel`` as fitcheck's --cp models it
    (torchtitan's wiring): training/_distributed.py ``get_context_parallel_manager`` calls
    ``set_rotate_method`` and ``context_parallel(world_mesh["cp"], buffers=the batch's tensors,
    buffer_seq_dims=1)`` with torch's default load balancing (the collate pads every batch to
    a multiple of 2 x tp x cp: ``ParallelDims.min_seq_len_divisor``) and SDPA restricted to the
    flash / efficient / cuDNN kernels (``_get_sdpa_context``); ``ParallelDims.build_mesh``
    shards FSDP2 over ``dp_shard_cp``; ``MultiHeadAttention`` expands the key/value heads to
    the query heads before SDPA (torchtitan's ``repeat_kv``). RoPE's cache is not a CP buffer
    there (each rank slices it at its local length: a view), which changes no memory.
    Only recipes/{full,lora}_finetune_distributed.py and qat_distributed.py read the key."""
    d = r.count(doc.get("context_parallel_dim") if doc.get("context_parallel_dim") is not None
                else 1, "context_parallel_dim")
    rotate = r.text(doc.get("context_parallel_rotate_method"), "context_parallel_rotate_method")
    if not d or d <= 1:
        if rotate is not None:  # inert without CP: the request's warning says so
            r.set("parallel.cp_rotate", Vocab(rotate), "context_parallel_rotate_method")
        return
    other = next((k for k in ("teacher_model", "ref_checkpointer", "policy_model") if doc.get(k)),
                 None) or ("loss._component_ (DPO)" if "dpo" in str(
                     r.mapping(doc.get("loss"), "loss").get("_component_", "")).lower() else None)
    if other is not None:
        r.warn(f"{r.name}: context_parallel_dim {d} is ignored: the recipe this config is for "
               f"({other}) does not read it (only {{full,lora}}_finetune_distributed and "
               "qat_distributed do)")
        return
    if packed(r, doc):
        # packed samples carry a BlockMask: flex attention, which the CP manager refuses
        raise r.fail("context_parallel_dim", f"{d} with dataset.packed true: torchtune refuses "
                     "it (get_context_parallel_manager: \"Context parallel with flex attention "
                     "is not yet supported\"); unpack the dataset or drop context parallel")
    if r.boolean(doc.get("enable_fp8_training"), "enable_fp8_training"):
        raise r.fail("context_parallel_dim", f"{d} with enable_fp8_training: torchtune refuses "
                     "it (full_finetune_distributed: \"Context Parallel for fp8 training is not "
                     "currently supported\")")
    r.set("parallel.cp", d, "context_parallel_dim")
    if rotate is not None:
        r.set("parallel.cp_rotate", Vocab(rotate), "context_parallel_rotate_method")
