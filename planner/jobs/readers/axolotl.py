"""An axolotl config YAML (https://docs.axolotl.ai/docs/config-reference.html).

base_model -> the model; sequence_len, micro_batch_size, gradient_accumulation_steps; bf16
(true/auto) / fp16 -> amp precision, bfloat16/float16 -> pure 16-bit; fp8 -> training.float8;
optimizer; gradient_checkpointing (true -> full; "offload" is activation offloading);
flash_attention / sdp_attention / flex_attention / attn_implementation -> attention;
torch_compile; liger_fused_linear_cross_entropy / cut_cross_entropy -> fused loss,
chunked_cross_entropy -> chunked; adapter lora/qlora with lora_r, lora_target_linear /
lora_target_modules, lora_modules_to_save, load_in_4bit / load_in_8bit -> finetune.*;
unfrozen_parameters -> finetune.freeze; fsdp (a list) / fsdp_config (with or without the fsdp_
prefix) / fsdp_version; deepspeed (a path to a DeepSpeed JSON, read when found).
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers import trainer
from planner.jobs.readers.common import ALL_LINEAR, Reader
from planner.jobs.record import Vocab


def detect(doc: Any) -> int:
    strong = ("base_model", "micro_batch_size", "sequence_len", "adapter", "lora_target_linear",
              "sample_packing", "num_epochs", "base_model_config", "dataset_prepared_path",
              "val_set_size", "special_tokens", "flash_attention", "wandb_project")
    score = sum(2 for k in strong if k in doc)
    ds = doc.get("datasets")
    if isinstance(ds, list) and ds and isinstance(ds[0], dict) and "type" in ds[0]:
        score += 2
    return score


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    model = doc.get("base_model_config") or doc.get("base_model")
    r.model(model, "base_model_config" if doc.get("base_model_config") else "base_model")
    r.set("training.seq", r.count(doc.get("sequence_len"), "sequence_len"), "sequence_len")
    r.set("training.micro_batch", r.count(doc.get("micro_batch_size"), "micro_batch_size"),
          "micro_batch_size")
    ga = r.count(doc.get("gradient_accumulation_steps"), "gradient_accumulation_steps")
    r.set("training.grad_accum", ga, "gradient_accumulation_steps")
    precision(r, doc)
    r.optimizer(doc.get("optimizer"), "optimizer")
    checkpointing(r, doc)
    attention(r, doc)
    tc = doc.get("torch_compile")
    if tc is True or (isinstance(tc, str) and tc.lower() in ("true", "auto")):
        r.set("training.compile", "model", "torch_compile")
    for key in ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        if r.boolean(doc.get(key), key):
            r.set("training.loss", "fused", key)
    if r.boolean(doc.get("chunked_cross_entropy"), "chunked_cross_entropy"):
        r.set("training.loss", "chunked", "chunked_cross_entropy")
    finetune(r, doc)
    distributed = fsdp(r, doc) | trainer.ds(r, doc)
    if not distributed:
        r.fallback("strategy", "ddp", f"{r.name}: no fsdp or deepspeed: plain DDP (or one GPU)")
    if (ga or 1) > 1:
        r.fallback("training.grad_sync", "last",
                   f"{r.name}: gradient accumulation through the HF Trainer: no gradient sync "
                   "until the last micro-batch (no_sync)")


def precision(r: Reader, doc: dict) -> None:
    bf16 = doc.get("bf16")
    amp_bf16 = bf16 is True or (isinstance(bf16, str) and bf16.lower() in ("true", "auto"))
    fp16 = r.boolean(doc.get("fp16"), "fp16")
    if amp_bf16 and fp16:
        raise r.fail("bf16", f"{bf16!r} and fp16 true contradict each other; set one")
    if r.boolean(doc.get("bfloat16"), "bfloat16"):
        r.set("training.precision", "bf16", "bfloat16")
    elif amp_bf16:
        r.set("training.precision", "bf16-amp", "bf16")
        if isinstance(bf16, str) and bf16.lower() == "auto":
            r.warn(f"{r.name}: bf16: auto read as bf16-amp (a bf16-capable GPU)")
    elif fp16:
        r.set("training.precision", "fp16-amp", "fp16")
    elif r.boolean(doc.get("float16"), "float16"):
        r.set("training.precision", "bf16", "float16")  # pure fp16: the same bytes as pure bf16
        r.warn(f"{r.name}: float16: pure fp16, sized as pure bf16 (the same bytes)")
    else:
        r.fallback("training.precision", "fp32", f"{r.name}: no bf16/fp16: fp32 training")
    if r.boolean(doc.get("fp8"), "fp8"):
        r.set("training.float8", True, "fp8")


def checkpointing(r: Reader, doc: dict) -> None:
    gc = doc.get("gradient_checkpointing")
    if isinstance(gc, str) and gc.lower() not in ("true", "false"):
        r.set("checkpointing", Vocab(f"{gc.lower()}"), "gradient_checkpointing")
    elif gc is not None:
        r.set("checkpointing", "full" if r.boolean(gc, "gradient_checkpointing") else "none",
              "gradient_checkpointing")
    else:
        r.fallback("checkpointing", "none", "")  # axolotl's default: false
    ao = doc.get("activation_offloading")
    if ao not in (None, False, "false"):
        r.set("checkpointing", Vocab("offload"), "activation_offloading")


def attention(r: Reader, doc: dict) -> None:
    for key in ("flash_attention", "sdp_attention", "xformers_attention", "flex_attention"):
        if r.boolean(doc.get(key), key):
            r.set("training.attention", "sdpa", key)
    if r.boolean(doc.get("eager_attention"), "eager_attention"):
        r.set("training.attention", "eager", "eager_attention")
    if r.boolean(doc.get("s2_attention"), "s2_attention"):
        r.set("training.attention", Vocab("s2"), "s2_attention")
    attn = r.text(doc.get("attn_implementation"), "attn_implementation")
    if attn:
        r.set("training.attention", trainer.ATTENTION.get(attn.lower(), Vocab(attn.lower())),
              "attn_implementation")


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
        if r.boolean(doc.get("lora_target_linear"), "lora_target_linear"):
            r.set("finetune.lora_targets", ALL_LINEAR, "lora_target_linear")
        else:
            r.lora_targets(doc.get("lora_target_modules"), "lora_target_modules")
        r.set("finetune.modules_to_save", doc.get("lora_modules_to_save") or None,
              "lora_modules_to_save")
    if r.boolean(doc.get("load_in_4bit"), "load_in_4bit"):
        r.set("finetune.quantize_base", "nf4", "load_in_4bit")
    elif r.boolean(doc.get("load_in_8bit"), "load_in_8bit"):
        r.set("finetune.quantize_base", "int8", "load_in_8bit")
    if adapter == "qlora" and "finetune.quantize_base" not in r.raw:
        raise r.fail("adapter", "qlora needs load_in_4bit: true")
    unfrozen = doc.get("unfrozen_parameters")
    if unfrozen:
        # name patterns, not a layer count: not something --freeze can say (unmodelled)
        r.set("finetune.freeze", Vocab(f"all but {len(unfrozen) if isinstance(unfrozen, list) else 1} "
              "unfrozen_parameters patterns"), "unfrozen_parameters")


def fsdp(r: Reader, doc: dict) -> bool:
    return trainer.fsdp(r, doc)
