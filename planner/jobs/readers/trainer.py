"""Hugging Face TrainingArguments (a JSON dump, ``training_args.json``, or a recipe of its keys
alone), and what every recipe built on the HF Trainer shares (planner/jobs/readers/trl.py,
llamafactory.py, axolotl.py): each key against its framework's table, the framework's default
for a key the file leaves out (named in the assumptions).

per_device_train_batch_size (default 8) -> micro-batch; gradient_accumulation_steps;
bf16/fp16 -> bf16-amp/fp16-amp (autocast over fp32 weights; neither: fp32); optim (default
adamw_torch_fused) -> optimizer; gradient_checkpointing / activation_checkpointing -> full;
torch_compile -> compile model; use_liger_kernel -> fused loss; fsdp ("full_shard auto_wrap",
"offload") + fsdp_config; deepspeed (a path, read, or an inline dict); parallelism_config
(dp_replicate x dp_shard, tp, cp, sp). Without fsdp or deepspeed the job is plain DDP unless an
accelerate config given beside it says otherwise; a model loaded in 16-bit then trains in pure
16-bit (no fp32 master weights), which the DDP plan uses (planner.jobs.record.ModelDtype).
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers import accelerate, deepspeed
from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import ATTN_PATH, HfAttention, JobFormat, ModelDtype, Vocab

TABLE = "transformers"
FSDP_OPTIONS = {"full_shard": "full_shard", "shard_grad_op": "shard_grad_op",
                "hybrid_shard": "hybrid_shard", "hybrid_shard_zero2": Vocab("hybrid_shard_zero2"),
                "no_shard": "no_shard"}
ATTENTION = {"flash_attention_2": "sdpa", "flash_attention_3": "sdpa", "sdpa": "sdpa",
             "flex_attention": "sdpa", "kernels-community/vllm-flash-attn3": "sdpa",
             "kernels-community/flash-attn": "sdpa", "kernels-community/flash-attn3": "sdpa",
             "paged|flash_attention_2": "sdpa", "eager": "eager"}
HALF = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
        "half": "float16"}


def detect(doc: Any) -> int:
    from planner.jobs.keys import recipe_score

    return recipe_score(TABLE, doc)


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    read_args(r, doc, TABLE)
    r.audit(TABLE)


# ---------------------------------------------------------------------------------------------
# What every HF-Trainer recipe shares


def value(r: Reader, table: str, doc: dict, key: str) -> tuple[Any, str]:
    """The file's value for ``key``, else the framework's default (noted); and the key to name
    as its source."""
    if key in doc and doc[key] is not None:
        return doc[key], key
    v = r.default(table, key)
    return v, f"{key} ({r.label(table)} default)"


def read_args(r: Reader, doc: dict, table: str, *, checkpointing: bool = True) -> None:
    """The TrainingArguments keys of a recipe (``table``: whose defaults apply)."""
    mb, key = value(r, table, doc, "per_device_train_batch_size")
    if "per_gpu_train_batch_size" in doc and "per_device_train_batch_size" not in doc:
        mb, key = doc["per_gpu_train_batch_size"], "per_gpu_train_batch_size"
    r.set("training.micro_batch", r.count(mb, key), key)
    ga, key = value(r, table, doc, "gradient_accumulation_steps")
    ga = r.count(ga, key)
    r.set("training.grad_accum", ga, key)
    precision(r, doc, table)
    optim, key = value(r, table, doc, "optim")
    r.optimizer(optim, key)
    if r.boolean(doc.get("adafactor"), "adafactor"):  # the old switch
        r.replace("training.optimizer", "adafactor", "adafactor")
        r.replace("training.optimizer_impl", None, "adafactor")
    compiled = r.boolean(doc.get("torch_compile"), "torch_compile")
    # TrainingArguments.__post_init__: a torch_compile_mode or _backend turns torch_compile on
    implied = next((k for k in ("torch_compile_mode", "torch_compile_backend", "torchdynamo")
                    if doc.get(k) not in (None, "", False)), None)
    if compiled or implied:
        r.set("training.compile", "model", "torch_compile" if compiled else
              f"{implied} (TrainingArguments turns torch_compile on)")
    if r.boolean(doc.get("use_liger_kernel"), "use_liger_kernel"):
        r.set("training.loss", "fused", "use_liger_kernel")
    tf32 = r.boolean(doc.get("tf32"), "tf32")
    if tf32 is not None:  # TrainingArguments.__post_init__: allow_tf32 on or off
        r.set("training.tf32", tf32, "tf32")
    attention(r, doc.get("attn_implementation"), "attn_implementation")
    distributed = fsdp(r, doc) | ds(r, doc)
    if checkpointing:
        gradient_checkpointing(r, doc, table)
    parallelism(r, r.mapping(doc.get("parallelism_config"), "parallelism_config"))
    tp = r.count(doc.get("tp_size"), "tp_size", zero=True)
    if tp and tp > 1:
        r.set("parallel.tp", tp, "tp_size")
    if not distributed:
        r.fallback("strategy", "ddp", f"{r.name}: no fsdp or deepspeed: plain DDP (give an "
                   "accelerate config or --strategy if it launches otherwise)")
    if (ga or 1) > 1:
        r.fallback("training.grad_sync", "last",
                   f"{r.name}: gradient accumulation through accelerate's accumulate(): no "
                   "gradient sync until the last micro-batch (no_sync)")


def precision(r: Reader, doc: dict, table: str) -> None:
    """bf16 / fp16 (autocast over fp32 weights); neither: fp32. ``None`` for bf16 (TRL) means
    'not fp16'."""
    fp16 = r.boolean(doc.get("fp16"), "fp16", auto=True)
    raw_bf16 = doc.get("bf16", MISSING)
    if raw_bf16 is MISSING or raw_bf16 is None:
        from planner.jobs.keys import table as load

        d = load(table).default("bf16")
        bf16 = (not fp16) if d is None else bool(d)
        r.defaulted.setdefault(r.label(table), []).append(
            f"bf16 {'true' if bf16 else 'false'}{' (not fp16)' if d is None else ''}")
        src = f"bf16 ({r.label(table)} default{': not fp16' if d is None else ''})"
    else:
        bf16 = r.boolean(raw_bf16, "bf16", auto=True)
        src = "bf16"
    if bf16 and fp16:
        raise r.fail("bf16", "and fp16 are both true; set one")
    auto = any(str(doc.get(k)).lower() == "auto" for k in ("bf16", "fp16"))
    if bf16:
        r.set("training.precision", "bf16-amp", src)
    elif fp16:
        r.set("training.precision", "fp16-amp", "fp16")
    elif auto:
        r.fallback("training.precision", "bf16-amp",
                   f"{r.name}: bf16/fp16 \"auto\": assumed bf16-amp on a bf16-capable GPU")
    elif "bf16" in doc or "fp16" in doc:
        r.set("training.precision", "fp32", "bf16/fp16 (both false)")
    else:
        r.set("training.precision", "fp32", f"bf16/fp16 ({r.label(table)} defaults: false)")


def model_dtype(r: Reader, dtype: Any, key: str) -> None:
    """A model loaded in 16-bit (torch_dtype / dtype bfloat16): under DDP the HF Trainer trains
    those weights as they are (pure 16-bit, no fp32 master); FSDP (accelerate upcasts under
    mixed precision) and DeepSpeed (fp32 master partition) do not."""
    text = r.text(dtype, key)
    if text is None or text.lower() not in HALF:
        return
    r.set("job.model_dtype", ModelDtype(HALF[text.lower()]), key)


def gradient_checkpointing(r: Reader, doc: dict, table: str) -> None:
    key = "activation_checkpointing" if doc.get("activation_checkpointing") is not None \
        else "gradient_checkpointing"
    gc, src = value(r, table, doc, key)
    on = r.boolean(gc, key)
    if "checkpointing" in r.raw:  # fsdp_config's activation_checkpointing: either one is on
        if on:
            r.replace("checkpointing", "full", src)
        return
    r.set("checkpointing", "full" if on else "none", src)


def attention(r: Reader, impl: Any, key: str) -> None:
    attn = r.text(impl, key)
    if attn:
        r.set("training.attention", ATTENTION.get(attn.lower(), Vocab(attn.lower())), key)
        r.set(ATTN_PATH, HfAttention(attn.lower()), key)  # accelerate's CP: sdpa only


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


def parallelism(r: Reader, pc: Any) -> None:
    """TrainingArguments.parallelism_config (accelerate's ParallelismConfig as a mapping)."""
    if pc:
        accelerate.parallelism(r, pc)


def lora(r: Reader, doc: dict, table: str, *, rank_key: str, targets_key: str,
         dropout_key: str = "lora_dropout") -> None:
    """A LoRA adapter's rank, targets and dropout, the framework's defaults for what is left
    out."""
    rank, key = value(r, table, doc, rank_key)
    r.set("finetune.lora_rank", r.count(rank, key), key)
    targets = doc.get(targets_key)
    if isinstance(targets, str) and "," in targets:
        targets = [t.strip() for t in targets.split(",")]
    if targets is None:
        d = r.default(table, targets_key)
        if d is not None:
            r.lora_targets(d, f"{targets_key} ({r.label(table)} default)")
    else:
        r.lora_targets(targets, targets_key)
    p, key = value(r, table, doc, dropout_key)
    if p is not None:
        r.set("finetune.lora_dropout", r.probability(p, key) > 0, key)


def quantization(r: Reader, doc: dict, table: str) -> None:
    q4 = r.boolean(doc.get("load_in_4bit"), "load_in_4bit")
    q8 = r.boolean(doc.get("load_in_8bit"), "load_in_8bit")
    if q4:
        qt, key = value(r, table, doc, "bnb_4bit_quant_type")
        qt = (r.text(qt, key) or "nf4").lower()
        r.set("finetune.quantize_base", qt if qt == "nf4" else Vocab(qt), "load_in_4bit")
        nested = r.boolean(doc.get("use_bnb_nested_quant"), "use_bnb_nested_quant")
        r.set("finetune.double_quant", bool(nested), "use_bnb_nested_quant" if nested is not None
              else f"use_bnb_nested_quant ({r.label(table)} default: false)")
    elif q8:
        r.set("finetune.quantize_base", "int8", "load_in_8bit")
