"""A litgpt config YAML (config_hub/finetune/*, config_hub/pretrain/*), against litgpt's key
table (planner/data/job_keys_litgpt.json, 0.5.13).

precision bf16-true -> pure bf16, bf16-mixed -> bf16-amp, 16-mixed -> fp16-amp, 32-true ->
fp32 (none: get_default_supported_precision(training=True), bf16-mixed); devices x num_nodes
-> hardware.n (devices per node); train.micro_batch_size, train.global_batch_size (-> the
accumulation), train.max_seq_length; quantize bnb.nf4 / bnb.nf4-dq / bnb.int8; lora_r,
lora_dropout (default 0.05) and lora_query/key/value/projection/mlp (lora_head: not modelled);
checkpoint_dir or model_name -> the model; optimizer (a name, or class_path + init_args with
fused / foreach). litgpt fixes the strategy in code: above one device a full finetune runs
FSDP1 FULL_SHARD with every Block checkpointed (finetune/full.py FSDPStrategy), a LoRA
finetune FSDP2 fully_shard with every Block checkpointed (finetune/lora.py parallelize_fn), and
pretraining FSDP1 HYBRID_SHARD (pretrain.py); one device is plain training.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers.common import Reader
from planner.jobs.record import Vocab

PRECISION = {"bf16-true": "bf16", "bf16-mixed": "bf16-amp", "bf16": "bf16-amp",
             "16-mixed": "fp16-amp", "16": "fp16-amp", "32-true": "fp32", "32": "fp32",
             "16-true": "bf16", "transformer-engine": Vocab("transformer-engine"),
             "transformer-engine-float16": Vocab("transformer-engine")}
QUANTIZE = {"bnb.nf4": "nf4", "bnb.nf4-dq": "nf4", "bnb.fp4": Vocab("fp4"),
            "bnb.fp4-dq": Vocab("fp4"), "bnb.int8": "int8", "bnb.int8-training": "int8"}
LORA_FLAGS = (("lora_query", ("q",)), ("lora_key", ("k",)), ("lora_value", ("v",)),
              ("lora_projection", ("o",)), ("lora_mlp", ("gate", "up", "down")))
TABLE = "litgpt"


def detect(doc: Any) -> int:
    score = 0
    p = doc.get("precision")
    if isinstance(p, str) and p.lower() in PRECISION:
        score += 3
    train = doc.get("train")
    if isinstance(train, dict) and ("micro_batch_size" in train or "global_batch_size" in train):
        score += 3
    score += sum(2 for k in ("checkpoint_dir", "devices", "num_nodes", "logger_name",
                             "lora_query", "quantize", "out_dir") if k in doc)
    return score


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    pretrain = "model_name" in doc or "model_config" in doc
    if doc.get("checkpoint_dir"):
        r.model(doc["checkpoint_dir"], "checkpoint_dir")
    elif doc.get("model_name"):
        r.model(doc["model_name"], "model_name")
    p = r.choose(doc.get("precision"), "precision", PRECISION)
    if p is not None:
        r.set("training.precision", p, "precision")
        if str(doc["precision"]).lower() == "16-true":
            r.warn(f"{r.name}: precision 16-true (pure fp16) sized as pure bf16 (the same bytes)")
    else:
        r.fallback("training.precision", "bf16-amp", f"{r.name}: no precision: litgpt picks "
                   "bf16-mixed on a bf16-capable GPU (get_default_supported_precision("
                   "training=True))")
    devices, nodes = doc.get("devices", 1), r.count(doc.get("num_nodes"), "num_nodes") or 1
    per_node = None
    if isinstance(devices, str) and devices.strip().lower() in ("auto", "-1"):
        r.warn(f"{r.name}: devices: {devices}: every GPU of the node; give --n")
    elif isinstance(devices, list):
        per_node = len(devices)
    else:
        per_node = r.count(devices, "devices")
    if per_node is not None:
        r.set("hardware.n", per_node * nodes, "devices x num_nodes" if nodes > 1 else "devices")
        r.set("hardware.gpus_per_node", per_node, "devices")
    train = r.mapping(doc.get("train"), "train")
    mb = r.count(train.get("micro_batch_size"), "train.micro_batch_size")
    r.set("training.micro_batch", mb, "train.micro_batch_size")
    gb = r.count(train.get("global_batch_size"), "train.global_batch_size")
    r.set("training.global_batch", gb, "train.global_batch_size")
    r.set("training.seq", r.count(train.get("max_seq_length"), "train.max_seq_length"),
          "train.max_seq_length")
    q = r.choose(doc.get("quantize"), "quantize", QUANTIZE)
    if q is not None:
        r.set("finetune.quantize_base", q, "quantize")
    rank = r.count(doc.get("lora_r"), "lora_r")
    lora = rank is not None
    if lora:
        r.set("finetune.lora_rank", rank, "lora_r")
        flags = {key: r.boolean(r.default(TABLE, key, doc.get(key)), key)
                 for key, _ in LORA_FLAGS}
        targets = tuple(m for key, mods in LORA_FLAGS if flags[key] for m in mods)
        if targets:
            r.set("finetune.lora_targets", targets, "lora_query/key/value/projection/mlp")
        p = r.default(TABLE, "lora_dropout", doc.get("lora_dropout"))
        r.set("finetune.lora_dropout", r.probability(p, "lora_dropout") > 0, "lora_dropout")
        if r.boolean(doc.get("lora_head"), "lora_head"):
            r.set("finetune.lora_head", True, "lora_head")
    n = (per_node or 1) * nodes
    if per_node is None:  # the GPU count comes later (--n): litgpt's strategy above one GPU
        how = "HYBRID_SHARD" if pretrain else "FULL_SHARD with every Block checkpointed"
        note = (f"{r.name}: devices not given: planned as litgpt runs on more than one GPU, "
                f"FSDP {how}")
        r.fallback("strategy", "hybrid_shard" if pretrain else "full_shard", note)
        r.fallback("offload", "none", "")
        r.fallback("training.fsdp_version", 2 if lora else 1, "")
        if not pretrain:
            r.fallback("checkpointing", "full", "")
    elif n > 1:
        if q is not None:
            raise r.fail("quantize", "litgpt refuses quantization with more than one device")
        if pretrain:
            r.set("strategy", "hybrid_shard", "devices (litgpt pretrain: FSDP HYBRID_SHARD)")
        else:
            r.set("strategy", "full_shard", "devices (litgpt finetune: FSDP FULL_SHARD)")
            r.set("checkpointing", "full", "devices (litgpt finetune checkpoints every Block)")
        r.set("offload", "none", "devices (litgpt: cpu_offload=False)")
        if lora:
            r.set("training.fsdp_version", 2, "devices (litgpt LoRA: ModelParallelStrategy, "
                  "FSDP2 fully_shard)")
        else:
            r.set("training.fsdp_version", 1, "devices (Lightning FSDPStrategy: FSDP1)")
    else:
        r.set("strategy", "ddp", "devices (one device: plain training)")
        r.set("checkpointing", "none", "devices (one device: no checkpointing)")
    r.set("training.grad_sync", "last", "litgpt (fabric.no_backward_sync while accumulating)")
    opt = doc.get("optimizer")
    name = opt.get("class_path") if isinstance(opt, dict) else opt
    key = "optimizer.class_path" if isinstance(opt, dict) else "optimizer"
    name = r.text(r.default(TABLE, "optimizer", name), key)
    if name:
        short = name.rsplit(".", 1)[-1].lower()
        kind = {"adamw": "adamw", "adam": "adam", "sgd": "sgd"}.get(short, Vocab(short))
        r.set("training.optimizer", kind, key)
        args = r.mapping(opt.get("init_args"), "optimizer.init_args") \
            if isinstance(opt, dict) else {}
        r.sgd_momentum(args.get("momentum"), "optimizer.init_args.momentum")
        fused = r.boolean(args.get("fused"), "optimizer.init_args.fused")
        foreach = r.boolean(args.get("foreach"), "optimizer.init_args.foreach")
        impl = "fused" if fused else "for-loop" if foreach is False else "foreach"
        r.set("training.optimizer_impl", impl, "optimizer.init_args.fused" if fused else
              "optimizer.init_args.foreach" if foreach is not None else
              "optimizer (torch's foreach default)")
    r.audit(TABLE)
