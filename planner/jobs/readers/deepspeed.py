"""A DeepSpeed config JSON (https://www.deepspeed.ai/docs/config-json/).

zero_optimization.stage 0/1/2/3 -> ddp/zero1/zero2/zero3; offload_optimizer.device and
offload_param.device -> offload; bf16/fp16.enabled -> precision (DeepSpeed keeps fp32 master
weights: bf16-amp / fp16-amp; neither -> fp32); train_micro_batch_size_per_gpu,
gradient_accumulation_steps, train_batch_size -> the batch fields. "auto" (filled in by the HF
Trainer or accelerate) takes the value of an accompanying file or flag, else the default with
a warning. The zero_optimization knobs go to deepspeed.<key> (the stage3_ spelling; the
registry's deepspeed.* fields model the buffers, "auto" sizes filled in from the hidden size);
an optimizer block -> deepspeed.fused_adam (DeepSpeed's own optimizer), none -> the client's.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import Vocab

STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
BUFFER_KEYS = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm",
               "contiguous_gradients", "sub_group_size")
ALIASES = {"max_live_parameters": "stage3_max_live_parameters",
           "max_reuse_distance": "stage3_max_reuse_distance",
           "prefetch_bucket_size": "stage3_prefetch_bucket_size",
           "param_persistence_threshold": "stage3_param_persistence_threshold",
           "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
           # the deprecated spelling DeepSpeed still accepts for the same setting
           "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
           "model_persistence_threshold": "stage3_model_persistence_threshold"}
"""DeepSpeed's pydantic field names, accepted beside the stage3_ spellings (zero/config.py)."""
NO_MEMORY_EFFECT = {"allgather_partitions", "reduce_scatter", "round_robin_gradients",
                    "elastic_checkpoint", "ignore_unused_parameters", "load_from_fp32_weights",
                    "use_multi_rank_bucket_allreduce", "log_trace_cache_warnings"}
"""zero_optimization keys that change how collectives are issued, not what is held."""
TOP_IGNORED = {"gradient_clipping", "steps_per_print", "wall_clock_breakdown", "scheduler",
               "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "tensorboard",
               "wandb", "csv_monitor", "comet", "flops_profiler", "comms_logger",
               "prescale_gradients", "gradient_predivide_factor", "dump_state", "train_batch_size",
               "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "fp16", "bf16",
               "zero_optimization", "optimizer", "amp", "seed", "memory_breakdown", "aio",
               "checkpoint", "autotuning", "elasticity", "data_efficiency", "timers",
               "monitor_config", "curriculum_learning"}
OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "sgd": "sgd", "adagrad": Vocab("adagrad"),
              "lamb": Vocab("lamb"), "onebitadam": Vocab("onebitadam"),
              "zerooneadam": Vocab("zerooneadam"), "onebitlamb": Vocab("onebitlamb"),
              "lion": "lion", "muadam": Vocab("muadam"), "muadamw": Vocab("muadamw")}


def detect(doc: Any) -> int:
    keys = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size",
            "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "steps_per_print",
            "wall_clock_breakdown", "gradient_clipping")
    score = sum(2 for k in keys if k in doc)
    for k in ("fp16", "bf16"):
        if isinstance(doc.get(k), dict) and "enabled" in doc[k]:
            score += 1
    return score


def _enabled(r: Reader, section: str) -> bool | None | str:
    sec = r.get(section)
    if sec is MISSING:
        return False
    sec = r.mapping(sec, section)
    v = sec.get("enabled", False)
    if isinstance(v, str) and v.strip().lower() == "auto":
        return "auto"
    return r.boolean(v, f"{section}.enabled")


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    # ---- precision
    fp16, bf16 = _enabled(r, "fp16"), _enabled(r, "bf16")
    if fp16 is True and bf16 is True:
        raise r.fail("fp16.enabled", "and bf16.enabled are both true; enable one")
    if bf16 is True:
        r.set("training.precision", "bf16-amp", "bf16.enabled")
    elif fp16 is True:
        r.set("training.precision", "fp16-amp", "fp16.enabled")
    elif "auto" in (fp16, bf16):
        which = [f"{k}.enabled" for k, v in (("fp16", fp16), ("bf16", bf16)) if v == "auto"]
        r.fallback("training.precision", None,
                   f"{r.name}: {' and '.join(which)} {'is' if len(which) == 1 else 'are'} "
                   "\"auto\" and nothing else sets the precision: assumed bf16-amp (give "
                   "--precision)")
    else:
        r.fallback("training.precision", "fp32",
                   f"{r.name}: neither fp16 nor bf16 is enabled: DeepSpeed trains in fp32")
    if isinstance(doc.get("amp"), dict) and r.boolean(doc["amp"].get("enabled"), "amp.enabled"):
        r.set("training.precision", "fp16-amp", "amp.enabled")
    # ---- batch
    for key, path, default in (("train_micro_batch_size_per_gpu", "training.micro_batch", "1"),
                               ("gradient_accumulation_steps", "training.grad_accum", "1")):
        v = doc.get(key, MISSING)
        n = r.count(v, key, auto=True)
        if n is not None:
            r.set(path, n, key)
        elif isinstance(v, str):
            r.fallback(path, None, f"{r.name}: {key} is \"auto\" and nothing else sets it: "
                       f"assumed {default} (give --{path.split('.')[1].replace('_', '-')})")
    tb = r.count(doc.get("train_batch_size", MISSING), "train_batch_size", auto=True)
    if tb is not None:
        r.set("training.global_batch", tb, "train_batch_size")
    # ---- ZeRO
    zo = r.mapping(r.get("zero_optimization"), "zero_optimization")
    stage = zo.get("stage", 0)
    if isinstance(stage, bool) or stage not in STAGES:
        raise r.fail("zero_optimization.stage", f"unknown value {stage!r}; expected 0, 1, 2 or 3")
    r.set("strategy", STAGES[stage], "zero_optimization.stage")
    opt = _device(r, zo, "offload_optimizer")
    par = _device(r, zo, "offload_param")
    if zo.get("cpu_offload") is True:  # DeepSpeed < 0.3.16 spelling
        opt = opt or "cpu"
    if par and stage != 3:
        raise r.fail("zero_optimization.offload_param", "parameter offload needs stage 3, got "
                     f"stage {stage}")
    if par and not opt:
        r.set("offload", Vocab("params"), "zero_optimization.offload_param.device")
    elif opt or par:
        where = "zero_optimization." + ("offload_param" if par else "offload_optimizer") + ".device"
        device = {d for d in (opt, par) if d}
        value = "params_and_optimizer" if par else "optimizer"
        r.set("offload", value, where)
        if "nvme" in device:
            if stage != 3:
                r.set("offload", Vocab(f"{value}-nvme"), where)  # DeepSpeed: stage 3 only
            elif device == {"nvme"}:
                r.set("deepspeed.offload_device", "nvme", where)  # ZeRO-Infinity
            else:
                r.set("offload", Vocab(f"{value}-cpu+nvme"), where)
    else:
        r.set("offload", "none", "zero_optimization (no offload_optimizer/offload_param)")
    for key, v in zo.items():
        if key in ("stage", "offload_optimizer", "offload_param", "cpu_offload"):
            continue
        if key in NO_MEMORY_EFFECT:
            continue
        name = ALIASES.get(key, key)
        r.set(f"deepspeed.{name}", _knob(v), f"zero_optimization.{key}")
    # ---- optimizer
    o = r.get("optimizer")
    if o is not MISSING:
        o = r.mapping(o, "optimizer")
        kind = r.text(o.get("type"), "optimizer.type")
        if kind is not None:
            r.set("training.optimizer", OPTIMIZERS.get(kind.lower(), Vocab(kind.lower())),
                  "optimizer.type")
            # deepspeed/runtime/engine.py _configure_basic_optimizer: Adam/AdamW -> FusedAdam
            # (DeepSpeedCPUAdam under optimizer offload), no step temporaries
            r.set("deepspeed.fused_adam", kind.lower() in ("adam", "adamw"), "optimizer.type")
    else:
        r.set("deepspeed.fused_adam", False,
              "optimizer (none: the client's torch optimizer steps the partitions)")
    # ---- everything else that holds memory goes through the unmodelled rule
    for key, v in doc.items():
        if key not in TOP_IGNORED:
            r.set(f"deepspeed.{key}", _knob(v), key)


def _knob(v: Any) -> Any:
    """A knob's value as written: numbers in plain form (2e8 -> 200000000), sections as 'set'."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, (dict, list)):
        return "(set)"
    return v


def _device(r: Reader, zo: dict, key: str) -> str | None:
    sec = zo.get(key)
    if sec is None:
        return None
    sec = r.mapping(sec, f"zero_optimization.{key}")
    dev = r.text(sec.get("device", "none"), f"zero_optimization.{key}.device") or "none"
    dev = dev.lower()
    if dev not in ("none", "cpu", "nvme"):
        raise r.fail(f"zero_optimization.{key}.device",
                     f"unknown value {dev!r}; expected none, cpu or nvme")
    return None if dev == "none" else dev
