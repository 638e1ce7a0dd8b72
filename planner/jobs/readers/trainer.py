"""Hugging Face TrainingArguments (a JSON dump, ``training_args.json``) and the recipe YAMLs
built on them: TRL, alignment-handbook, LLaMA-Factory.

per_device_train_batch_size -> micro-batch; gradient_accumulation_steps; max_seq_length /
max_length / cutoff_len -> seq; bf16/fp16 -> bf16-amp/fp16-amp (autocast; neither: fp32);
optim -> optimizer; gradient_checkpointing -> full; torch_compile -> compile model;
use_liger_kernel -> fused loss; fsdp ("full_shard auto_wrap", "offload") + fsdp_config;
deepspeed (a path, read, or an inline dict); model_name_or_path -> the model; use_peft /
lora_r / lora_target_modules / load_in_4bit (TRL), finetuning_type / lora_rank / lora_target /
quantization_bit (LLaMA-Factory) -> finetune.*. Without fsdp or deepspeed the job is plain DDP
unless an accelerate config given beside it says otherwise.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers import accelerate, deepspeed
from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import JobFormat, Vocab

FSDP_OPTIONS = {"full_shard": "full_shard", "shard_grad_op": "shard_grad_op",
                "hybrid_shard": "hybrid_shard", "hybrid_shard_zero2": Vocab("hybrid_shard_zero2"),
                "no_shard": "no_shard"}
SEQ_KEYS = ("max_seq_length", "max_length", "cutoff_len", "model_max_length", "max_seq_len")
ATTENTION = {"flash_attention_2": "sdpa", "flash_attention_3": "sdpa", "sdpa": "sdpa",
             "flex_attention": "sdpa", "kernels-community/vllm-flash-attn3": "sdpa",
             "eager": "eager"}


def detect(doc: Any) -> int:
    strong = ("per_device_train_batch_size", "model_name_or_path", "cutoff_len",
              "finetuning_type", "max_seq_length", "optim", "per_device_eval_batch_size",
              "eval_strategy", "evaluation_strategy", "save_strategy", "dataset_text_field",
              "logging_strategy", "overwrite_output_dir", "ddp_timeout", "lr_scheduler_type")
    return sum(2 for k in strong if k in doc) + sum(
        1 for k in ("output_dir", "learning_rate", "gradient_checkpointing", "use_peft",
                    "template", "stage", "push_to_hub", "hub_model_id") if k in doc)


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    r.model(doc.get("model_name_or_path"), "model_name_or_path")
    # ---- batch and sequence
    mb = r.count(doc.get("per_device_train_batch_size"), "per_device_train_batch_size")
    r.set("training.micro_batch", mb, "per_device_train_batch_size")
    old = r.count(doc.get("per_gpu_train_batch_size"), "per_gpu_train_batch_size")
    r.set("training.micro_batch", old, "per_gpu_train_batch_size")
    ga = r.count(doc.get("gradient_accumulation_steps"), "gradient_accumulation_steps")
    r.set("training.grad_accum", ga, "gradient_accumulation_steps")
    sequence(r, doc)
    # ---- precision, optimizer, kernels
    precision(r, doc)
    r.optimizer(doc.get("optim"), "optim")
    if doc.get("adafactor") is True:  # the old switch
        r.set("training.optimizer", "adafactor", "adafactor")
    gc = r.boolean(doc.get("gradient_checkpointing"), "gradient_checkpointing")
    if gc is not None:
        r.set("checkpointing", "full" if gc else "none", "gradient_checkpointing")
    elif is_llamafactory(doc):  # LLaMA-Factory checkpoints unless told not to
        off = r.boolean(doc.get("disable_gradient_checkpointing"),
                        "disable_gradient_checkpointing")
        r.set("checkpointing", "none" if off else "full",
              "disable_gradient_checkpointing" if off is not None else
              "disable_gradient_checkpointing (LLaMA-Factory default: false)")
    else:
        r.fallback("checkpointing", "none", "")  # TrainingArguments' default
    if r.boolean(doc.get("torch_compile"), "torch_compile"):
        r.set("training.compile", "model", "torch_compile")
    if r.boolean(doc.get("use_liger_kernel"), "use_liger_kernel") \
            or r.boolean(doc.get("enable_liger_kernel"), "enable_liger_kernel"):
        r.set("training.loss", "fused", "use_liger_kernel")
    attn = r.text(doc.get("attn_implementation"), "attn_implementation")
    if attn:
        r.set("training.attention", ATTENTION.get(attn.lower(), Vocab(attn.lower())),
              "attn_implementation")
    # ---- distribution
    distributed = fsdp(r, doc) | ds(r, doc)
    if not distributed:
        dtype = r.text(doc.get("torch_dtype", doc.get("dtype")), "torch_dtype")
        half = (f"; torch_dtype {dtype} keeps weights, gradients and optimizer state 16-bit "
                "there (give --precision bf16: planned with autocast over fp32)"
                if dtype in ("bfloat16", "float16") else "")
        r.fallback("strategy", "ddp", f"{r.name}: no fsdp or deepspeed: plain DDP (give an "
                   f"accelerate config or --strategy if it launches otherwise){half}")
    if (ga or 1) > 1:
        r.fallback("training.grad_sync", "last",
                   f"{r.name}: gradient accumulation through accelerate's accumulate(): no "
                   "gradient sync until the last micro-batch (no_sync)")
    finetune(r, doc)
    trl_extras(r, doc)


def is_llamafactory(doc: dict) -> bool:
    return "finetuning_type" in doc or ("stage" in doc and "template" in doc)


def sequence(r: Reader, doc: dict) -> None:
    if "num_generations" in doc:  # GRPO: prompt + completion
        p = r.count(doc.get("max_prompt_length"), "max_prompt_length")
        c = r.count(doc.get("max_completion_length"), "max_completion_length")
        if p and c:
            r.set("training.seq", p + c, "max_prompt_length + max_completion_length")
        return
    for key in SEQ_KEYS:
        r.set("training.seq", r.count(doc.get(key), key), key)


def precision(r: Reader, doc: dict) -> None:
    bf16 = r.boolean(doc.get("bf16"), "bf16", auto=True)
    fp16 = r.boolean(doc.get("fp16"), "fp16", auto=True)
    if bf16 and fp16:
        raise r.fail("bf16", "and fp16 are both true; set one")
    if bf16:
        r.set("training.precision", "bf16-amp", "bf16")
    elif fp16:
        r.set("training.precision", "fp16-amp", "fp16")
    elif "bf16" in doc or "fp16" in doc:
        if str(doc.get("bf16")).lower() == "auto" or str(doc.get("fp16")).lower() == "auto":
            r.fallback("training.precision", "bf16-amp",
                       f"{r.name}: bf16/fp16 \"auto\": assumed bf16-amp on a bf16-capable GPU")
        else:
            r.set("training.precision", "fp32", "bf16/fp16 (both false)")
    else:
        r.fallback("training.precision", "fp32",
                   f"{r.name}: neither bf16 nor fp16: fp32 training (TrainingArguments default)")


def fsdp(r: Reader, doc: dict) -> bool:
    """The fsdp options ("full_shard auto_wrap offload", or a list) and fsdp_config (keys with
    or without the fsdp_ prefix). False when the job does not use FSDP."""
    raw = doc.get("fsdp")
    options: list[str] = []
    if isinstance(raw, str):
        options = raw.split()
    elif isinstance(raw, list):
        options = [r.text(x, "fsdp") or "" for x in raw]
    elif raw not in (None, False, MISSING):
        raise r.fail("fsdp", f"must be a string or a list of options, got {raw!r}")
    cfg = r.mapping(doc.get("fsdp_config"), "fsdp_config")
    cfg_is_fsdp = any(k not in HF_FSDP_DEFAULTS for k in cfg)
    if not options and not (cfg_is_fsdp and doc.get("fsdp_version") is not None) \
            and not (cfg_is_fsdp and r.fmt is JobFormat.AXOLOTL):
        return False
    listed = None
    for opt in options:
        low = opt.lower()
        if low in FSDP_OPTIONS:
            listed = FSDP_OPTIONS[low]
        elif low == "offload":
            r.set("offload", "params_and_optimizer", "fsdp")
        elif low != "auto_wrap":
            raise r.fail("fsdp", f"unknown option {opt!r}; expected full_shard, shard_grad_op, "
                         "hybrid_shard, hybrid_shard_zero2, no_shard, offload, auto_wrap")
    version = doc.get("fsdp_version")
    if version is not None:
        v = r.count(version, "fsdp_version")
        if v not in (1, 2):
            raise r.fail("fsdp_version", f"must be 1 or 2, got {version!r}")
        r.set("training.fsdp_version", v, "fsdp_version")
    accelerate.fsdp(r, cfg, "fsdp_config", prefix="fsdp_")
    if listed is not None:
        src = r.sources["strategy"]
        if r.raw["strategy"] != listed and not src.key.endswith("default)"):
            raise r.fail("fsdp", f"{raw!r} contradicts {src.key} ({r.raw['strategy']})")
        r.replace("strategy", listed, "fsdp")
    if "offload" not in r.raw:
        r.set("offload", "none", "fsdp (no offload)")
    if "training.fsdp_version" not in r.raw:
        r.set("training.fsdp_version", 1, "fsdp_config (no version: FSDP1)")
    return True


HF_FSDP_DEFAULTS = {"min_num_params", "xla", "xla_fsdp_v2", "xla_fsdp_grad_ckpt"}
"""What TrainingArguments writes into fsdp_config when FSDP is off."""


def ds(r: Reader, doc: dict) -> bool:
    ref = doc.get("deepspeed")
    if ref in (None, "", MISSING, False):
        return False
    if isinstance(ref, dict):
        sub = Reader(ref, r.name, JobFormat.DEEPSPEED, r.base_dir, r.depth + 1,
                     read_job=r.read_job, read_doc=r.read_doc)
        deepspeed.read(sub)
        job = sub.job()
        r.peers.append(job)
        return True
    job = r.reference(ref, "deepspeed", JobFormat.DEEPSPEED)
    if job is not None:
        r.peers.append(job)
    else:
        r.set("strategy", "zero1,zero2,zero3", "deepspeed")
    return True


def finetune(r: Reader, doc: dict) -> None:
    kind = (r.text(doc.get("finetuning_type"), "finetuning_type") or "").lower()
    peft = r.boolean(doc.get("use_peft"), "use_peft") or kind == "lora"
    if kind == "freeze":
        layers = doc.get("freeze_trainable_layers", 2)
        r.set("finetune.freeze", f"all but {layers} layers", "finetuning_type")
    if kind == "oft" or (kind and kind not in ("lora", "full", "freeze")):
        r.set("finetune.freeze", Vocab(kind), "finetuning_type")
    if peft:
        rank = r.count(doc.get("lora_r", doc.get("lora_rank")),
                       "lora_r" if "lora_r" in doc else "lora_rank")
        default = 8 if kind == "lora" else 16  # LLaMA-Factory lora_rank, TRL ModelConfig.lora_r
        r.set("finetune.lora_rank", rank or default,
              ("lora_r" if "lora_r" in doc else "lora_rank" if "lora_rank" in doc else
               "use_peft (lora_r default)" if kind != "lora" else "finetuning_type lora"))
        targets = doc.get("lora_target_modules", doc.get("lora_target"))
        if isinstance(targets, str) and "," in targets:
            targets = [t.strip() for t in targets.split(",")]
        r.lora_targets(targets, "lora_target_modules" if "lora_target_modules" in doc
                       else "lora_target")
        r.set("finetune.modules_to_save", doc.get("lora_modules_to_save") or None,
              "lora_modules_to_save")
    q4 = r.boolean(doc.get("load_in_4bit"), "load_in_4bit")
    q8 = r.boolean(doc.get("load_in_8bit"), "load_in_8bit")
    qbit = doc.get("quantization_bit")
    if q4 or qbit in (4, "4"):
        qt = (r.text(doc.get("bnb_4bit_quant_type"), "bnb_4bit_quant_type") or "nf4").lower()
        r.set("finetune.quantize_base", qt if qt == "nf4" else Vocab(qt),
              "load_in_4bit" if q4 else "quantization_bit")
    elif q8 or qbit in (8, "8"):
        r.set("finetune.quantize_base", "int8", "load_in_8bit" if q8 else "quantization_bit")


def trl_extras(r: Reader, doc: dict) -> None:
    if "num_generations" in doc:
        beta = doc.get("beta", 0.0)
        if isinstance(beta, (int, float)) and beta > 0:
            r.set("training.reference_model", True, "beta (GRPO, > 0)")
        r.warn(f"{r.name}: GRPO: per_device_train_batch_size counts completions "
               f"({doc.get('num_generations')} per prompt); generation memory is not planned")
    elif "max_prompt_length" in doc and "beta" in doc:
        r.set("training.paired_batch", True, "beta + max_prompt_length (DPO/ORPO-style)")
