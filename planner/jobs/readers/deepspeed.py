"""A DeepSpeed config JSON (https://www.deepspeed.ai/docs/config-json/), against DeepSpeed's key
table (planner/data/job_keys_deepspeed.json).

zero_optimization.stage 0/1/2/3 -> ddp/zero1/zero2/zero3; offload_optimizer.device and
offload_param.device -> offload; bf16/fp16.enabled -> precision (DeepSpeed keeps fp32 master
weights: bf16-amp / fp16-amp; neither -> fp32); train_micro_batch_size_per_gpu,
gradient_accumulation_steps, train_batch_size -> the batch fields, the missing one derived
from the GPU count as DeepSpeed does (runtime/config.py _set_batch_related_parameters). "auto"
(filled in by the HF Trainer or accelerate) takes the value of an accompanying file or flag,
else the default with a warning. The zero_optimization buffer knobs and ZeRO++'s keys
(zero_quantized_weights, zero_hpz_partition_size, zero_quantized_gradients; stage 3 only, as
DeepSpeed reads them) go to deepspeed.<key> (the stage3_ spelling);
bf16.bf16_master_weights_and_grads, bf16.bf16_optimizer_states and
data_types.grad_accum_dtype -> deepspeed.<key>; an optimizer block -> deepspeed.fused_adam
(DeepSpeed's FusedAdam; with params.torch_adam, torch's AdamW), none -> the client's
optimizer; OneBitAdam, ZeroOneAdam, OneBitLamb -> the 1-bit optimizers (planner/onebit.py;
stage 0 only, as DeepSpeed asserts). Every other key is what the
table says: not modelled (a line unless at its default), irrelevant, or unknown (DeepSpeed
ignores unknown top-level keys: a warning).
"""

from __future__ import annotations

from typing import Any

from planner.fields import DS_MAX_ELEMS
from planner.jobs.readers.common import MISSING, Reader
from planner.jobs.record import Share, Vocab

TABLE = "deepspeed"
STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
OPTIMIZERS = {"adam": "adam", "adamw": "adamw", "sgd": "sgd", "adagrad": Vocab("adagrad"),
              "lamb": Vocab("lamb"), "onebitadam": "onebit-adam",
              "zerooneadam": "zero-one-adam", "onebitlamb": "onebit-lamb",
              "lion": "lion", "muadam": Vocab("muadam"), "muadamw": Vocab("muadamw"),
              "musgd": Vocab("musgd"), "muon": Vocab("muon")}


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
    precision(r, doc)
    batch(r, doc)
    zero(r, r.mapping(r.get("zero_optimization"), "zero_optimization"))
    master_weights(r, doc)
    optimizer(r)
    autotp = r.count(r.mapping(doc.get("tensor_parallel"), "tensor_parallel").get("autotp_size"),
                     "tensor_parallel.autotp_size", zero=True)
    if autotp and autotp > 1:  # DeepSpeed AutoTP: not fitcheck's TP (sequence parallel + FSDP)
        r.set("deepspeed.autotp_size", autotp, "tensor_parallel.autotp_size")
    r.audit(TABLE)


def precision(r: Reader, doc: dict) -> None:
    fp16 = _enabled(r, "fp16")
    bf16 = _enabled(r, "bf16") if "bf16" in doc else _enabled(r, "bfloat16")
    bf16_key = "bf16" if "bf16" in doc or "bfloat16" not in doc else "bfloat16"
    if fp16 is True and bf16 is True:
        raise r.fail("fp16.enabled", f"and {bf16_key}.enabled are both true; enable one")
    if bf16 is True:
        r.set("training.precision", "bf16-amp", f"{bf16_key}.enabled")
    elif fp16 is True:
        r.set("training.precision", "fp16-amp", "fp16.enabled")
    elif "auto" in (fp16, bf16):
        which = [f"{k}.enabled" for k, v in (("fp16", fp16), (bf16_key, bf16)) if v == "auto"]
        r.fallback("training.precision", None,
                   f"{r.name}: {' and '.join(which)} {'is' if len(which) == 1 else 'are'} "
                   "\"auto\" and nothing else sets the precision: assumed bf16-amp (give "
                   "--precision)")
    else:
        r.fallback("training.precision", "fp32",
                   f"{r.name}: neither fp16 nor bf16 is enabled: DeepSpeed trains in fp32")
    if isinstance(doc.get("amp"), dict) and r.boolean(doc["amp"].get("enabled"), "amp.enabled"):
        r.set("training.precision", "fp16-amp", "amp.enabled")


DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
          "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
          "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16"}
"""``data_types.grad_accum_dtype`` spellings (DeepSpeed's ``DtypeEnum``, runtime/config_utils)."""


def master_weights(r: Reader, doc: dict) -> None:
    """bf16.bf16_master_weights_and_grads / bf16_optimizer_states and
    data_types.grad_accum_dtype -> deepspeed.*; refused where DeepSpeed refuses them at stage 0
    (``runtime/config.py`` ``_do_error_check``: master weights need ZeRO 1-3;
    ``engine.py`` ``_do_optimizer_sanity_check``: without ZeRO a gradient accumulation dtype
    other than the model's is NotImplementedError)."""
    key = "bf16" if "bf16" in doc or "bfloat16" not in doc else "bfloat16"
    sec = r.mapping(doc.get(key), key)
    stage = r.mapping(doc.get("zero_optimization"), "zero_optimization").get("stage", 0)
    for name in ("bf16_master_weights_and_grads", "bf16_optimizer_states"):
        if name not in sec:
            continue
        on = r.boolean(sec[name], f"{key}.{name}")
        if on and stage == 0:
            raise r.fail(f"{key}.{name}", "DeepSpeed allows it with ZeRO stage 1, 2 or 3 only, "
                         "got stage 0")
        r.set(f"deepspeed.{name}", bool(on), f"{key}.{name}")
    raw = r.mapping(doc.get("data_types"), "data_types").get("grad_accum_dtype")
    if raw is None:
        return
    dtype = DTYPES.get(str(raw).strip().lower())
    if dtype is None:
        raise r.fail("data_types.grad_accum_dtype",
                     f"unknown value {raw!r}; expected fp32, bf16 or fp16")
    bf16 = r.mapping(doc.get(key), key).get("enabled") is True
    fp16 = r.mapping(doc.get("fp16"), "fp16").get("enabled") is True
    model = "bf16" if bf16 else "fp16" if fp16 else "fp32"
    if stage == 0 and dtype != model:
        raise r.fail("data_types.grad_accum_dtype", f"{dtype} with a {model} model needs ZeRO "
                     "(DeepSpeed: unsupported mix without it), got stage 0")
    r.set("deepspeed.grad_accum_dtype", dtype, "data_types.grad_accum_dtype")


def batch(r: Reader, doc: dict) -> None:
    """The three batch keys; DeepSpeed derives the one left out from the GPU count."""
    got: dict[str, int | None] = {}
    for key, path, default in (("train_micro_batch_size_per_gpu", "training.micro_batch", "1"),
                               ("gradient_accumulation_steps", "training.grad_accum", "1"),
                               ("train_batch_size", "training.global_batch", None)):
        v = doc.get(key, MISSING)
        n = r.count(v, key, auto=True)
        got[key] = n
        if n is not None:
            r.set(path, n, key)
        elif isinstance(v, str) and default is not None:
            r.fallback(path, None, f"{r.name}: {key} is \"auto\" and nothing else sets it: "
                       f"assumed {default} (give --{path.split('.')[1].replace('_', '-')})")
    tb, mb = got["train_batch_size"], got["train_micro_batch_size_per_gpu"]
    ga = got["gradient_accumulation_steps"]
    if tb is not None and mb is None and not isinstance(
            doc.get("train_micro_batch_size_per_gpu"), str):
        r.set("training.micro_batch", Share(tb, ga or 1, "train_batch_size / "
              "(gradient_accumulation_steps x GPUs)"),
              "train_batch_size (no train_micro_batch_size_per_gpu: DeepSpeed derives it)")
        if ga is None:
            r.set("training.grad_accum", 1, "gradient_accumulation_steps (DeepSpeed: 1 when "
                  "only train_batch_size is given)")
    elif tb is not None and ga is None and not isinstance(
            doc.get("gradient_accumulation_steps"), str):
        r.set("training.grad_accum", Share(tb, mb, "train_batch_size / "
              "(train_micro_batch_size_per_gpu x GPUs)"),
              "train_batch_size (no gradient_accumulation_steps: DeepSpeed derives it)")


def zero(r: Reader, zo: Any) -> None:
    stage = zo.get("stage", 0)
    if isinstance(stage, bool) or stage not in STAGES:
        raise r.fail("zero_optimization.stage", f"unknown value {stage!r}; expected 0, 1, 2 or 3")
    r.set("strategy", STAGES[stage], "zero_optimization.stage")
    opt = _device(r, zo, "offload_optimizer")
    par = _device(r, zo, "offload_param")
    if zo.get("cpu_offload") is True:  # DeepSpeed < 0.3.16 spelling
        opt = opt or "cpu"
    if zo.get("cpu_offload_param") is True:
        par = par or "cpu"
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
                r.replace("offload", Vocab(f"{value}-nvme"), where)  # DeepSpeed: stage 3 only
            elif device == {"nvme"}:
                r.set("deepspeed.offload_device", "nvme", where)  # ZeRO-Infinity
            else:
                r.replace("offload", Vocab(f"{value}-cpu+nvme"), where)
    else:
        r.set("offload", "none", "zero_optimization (no offload_optimizer/offload_param)")
    from planner.jobs.keys import Kind, table

    for key, v in zo.items():
        k = table(TABLE).get(f"zero_optimization.{key}")
        if k is None or k.kind is not Kind.FIELD or not k.field.startswith("deepspeed."):
            continue
        if key.endswith(("gather_16bit_weights_on_model_save",
                         "gather_fp16_weights_on_model_save")) and isinstance(v, str) and \
                v.strip().lower() == "auto":
            r.fallback(k.field, False, f"{r.name}: zero_optimization.{key} \"auto\": "
                       "accelerate fills it from zero3_save_16bit_model (default false)")
            continue
        v = _knob(v)
        if key in ZEROPP and stage != 3:
            zeropp_below_stage3(r, key, v, stage)
            continue
        if isinstance(v, int) and not isinstance(v, bool) and v > DS_MAX_ELEMS:
            # more elements than any partition: the same as the bound (1e14 in the HF tests)
            r.warn(f"{r.name}: zero_optimization.{key} {v:.3g} is more than any model holds: "
                   f"read as {DS_MAX_ELEMS:,}")
            v = DS_MAX_ELEMS
        r.set(k.field, v, f"zero_optimization.{key}")


ZEROPP = {"zero_quantized_weights": False, "zero_hpz_partition_size": 1,
          "zero_quantized_gradients": False}
"""ZeRO++'s keys and their off values: read by ZeRO-3 only (``engine.py`` hands them to
``DeepSpeedZeroOptimizer_Stage3`` and ``zero.Init``; ``stage_1_and_2.py`` reads none)."""


def zeropp_below_stage3(r: Reader, key: str, v: object, stage: int) -> None:
    """A ZeRO++ key below stage 3: DeepSpeed runs without it, so the plan does too (a
    warning when it is on)."""
    if v is ZEROPP[key] or (key == "zero_hpz_partition_size" and v in (0, 1)):
        return  # off
    r.warn(f"{r.name}: zero_optimization.{key} {v!r} is ZeRO++, which DeepSpeed applies at "
           f"stage 3 only: ignored at stage {stage}")


def optimizer(r: Reader) -> None:
    o = r.get("optimizer")
    if o is MISSING:
        r.set("deepspeed.fused_adam", False,
              "optimizer (none: the client's torch optimizer steps the partitions)")
        return
    o = r.mapping(o, "optimizer")
    kind = r.text(o.get("type"), "optimizer.type")
    if kind is None:
        return
    r.set("training.optimizer", OPTIMIZERS.get(kind.lower(), Vocab(kind.lower())),
          "optimizer.type")
    params = r.mapping(o.get("params"), "optimizer.params")
    if kind.lower() in ONEBIT:
        onebit(r, kind, params)
        return
    # deepspeed/runtime/engine.py _configure_basic_optimizer: a type outside DEEPSPEED_OPTIMIZERS
    # (SGD) is getattr(torch.optim, type)(params, **optimizer.params)
    r.sgd_momentum(params.get("momentum"), "optimizer.params.momentum")
    adam = kind.lower() in ("adam", "adamw")
    torch_adam = adam and r.boolean(params.get("torch_adam"), "optimizer.params.torch_adam")
    if adam and params.get("adam_w_mode") is False and kind.lower() == "adam":
        r.replace("training.optimizer", "adam", "optimizer.params.adam_w_mode")
    # deepspeed/runtime/engine.py get_optimizer_configuration: Adam/AdamW -> FusedAdam
    # (DeepSpeedCPUAdam under optimizer offload), no step temporaries; torch_adam -> torch's
    # Adam(W) with its foreach default
    r.set("deepspeed.fused_adam", adam and not torch_adam,
          "optimizer.params.torch_adam" if torch_adam else "optimizer.type")
    if torch_adam:
        foreach = r.boolean(params.get("foreach"), "optimizer.params.foreach")
        r.set("training.optimizer_impl", "for-loop" if foreach is False else "foreach",
              "optimizer.params.foreach" if foreach is not None else
              "optimizer.params.torch_adam (torch's foreach default)")


ONEBIT = {"onebitadam": "1bit-Adam", "zerooneadam": "0/1 Adam", "onebitlamb": "1bit-Lamb"}
"""DeepSpeed's 1-bit optimizers (``runtime/config.py`` ONEBIT_ADAM_OPTIMIZER, ... at v0.19.6)
and the names its ZeRO assertions give them."""


def onebit(r: Reader, kind: str, params: dict) -> None:
    """1-bit Adam, 0/1 Adam, 1-bit LAMB (planner/onebit.py): stage 0 only, as DeepSpeed
    asserts (``engine.py`` ``_configure_basic_optimizer``); the warm-up's length is stated,
    the plan describes the steps after it; DeepSpeed 0.19.7 removed them (PR #8490)."""
    stage = r.mapping(r.get("zero_optimization"), "zero_optimization").get("stage", 0)
    who = ONEBIT[kind.lower()]
    if stage != 0:
        raise r.fail("optimizer.type", f"{kind} with zero_optimization.stage {stage}: "
                     f"DeepSpeed asserts \"{who} is not compatible with ZeRO\"")
    zero_one = kind.lower() == "zerooneadam"
    key = "var_freeze_step" if zero_one else "freeze_step"
    freeze = r.count(params.get(key), f"optimizer.params.{key}", zero=True)
    freeze = 100_000 if freeze is None else freeze  # the optimizers' default
    clip = params.get("local_step_clipper")
    if zero_one and clip is not None:
        r.set("deepspeed.local_step_clipper",
              r.count(clip, "optimizer.params.local_step_clipper"),
              "optimizer.params.local_step_clipper")
    r.warn(f"{r.name}: optimizer {kind}: DeepSpeed 0.19.6 or older (0.19.7 removed it); "
           f"the first {freeze:,} steps ({key}) all-reduce the gradients "
           f"{'at the variance-update steps' if zero_one else 'uncompressed'}; the step "
           "time planned is after them")


def _knob(v: Any) -> Any:
    """A knob's value as written: numbers in plain form (2e8 -> 200000000)."""
    if isinstance(v, float) and v.is_integer():
        return int(v)
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
