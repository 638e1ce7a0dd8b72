"""A LLaMA-Factory recipe: the v0 hparams (``llamafactory-cli train recipe.yaml``, the
examples/train_*/ files) against planner/data/job_keys_llamafactory.json (0.9.5), or the v1
config (examples/v1/, ``model:`` + ``*_config`` plugin sections) against
job_keys_llamafactory_v1.json.

v0: stage (sft/pt plain; rm chosen + rejected; dpo/kto also a reference model unless LoRA
reuses the base or pref_loss is orpo/simpo; ppo generation, a reward and a reference model),
finetuning_type (default lora) with lora_rank (8), lora_target (all), lora_dropout (0.0),
freeze_trainable_layers (2: the last two blocks train; negative: the first), quantization_bit
(bitsandbytes nf4 / int8), cutoff_len (2048) -> seq, disable_gradient_checkpointing (false:
checkpointing on), pure_bf16 -> pure bf16, enable_liger_kernel -> fused loss, flash_attn, and
the TrainingArguments keys (planner/jobs/readers/trainer.py). GaLore, APOLLO, BAdam,
Adam-mini, Muon, LLaMA Pro, OFT and the other switches the table lists are not modelled.

v1: micro_batch_size, global_batch_size, cutoff_len, bf16 (default true; the model is loaded
as its checkpoint, 16-bit, and trained so: pure bf16), enable_activation_checkpointing
(default true), dist_config (fsdp2 -> FSDP2 full_shard or shard_grad_op, offload_params;
deepspeed -> its config_file; fsdpturbo -> expert parallel, not modelled), cp_size,
mp_replicate_size, peft_config (lora / freeze), quant_config, init_config, optim_config.
"""

from __future__ import annotations

from typing import Any

from planner.jobs.readers import trainer
from planner.jobs.readers.common import MISSING, Reader, show, unread_cp, unread_ep
from planner.jobs.record import JobFormat, Unmodelled, Vocab

TABLE = "llamafactory"
TABLE_V1 = "llamafactory_v1"
FLASH = {"auto": "sdpa", "fa2": "sdpa", "fa3": "sdpa", "sdpa": "sdpa", "disabled": "eager",
         "eager": "eager", "flash_attention_2": "sdpa", "flash_attention_3": "sdpa"}
V1_MARKERS = ("dist_config", "peft_config", "kernel_config", "quant_config", "init_config",
              "optim_config", "micro_batch_size", "train_dataset", "model_class",
              "enable_activation_checkpointing", "sample_backend")


def detect(doc: Any) -> int:
    from planner.jobs.keys import recipe_score

    if is_v1(doc):
        return 6 + sum(2 for k in V1_MARKERS if k in doc)
    return recipe_score(TABLE, doc)


def is_v1(doc: dict) -> bool:
    return "model" in doc and isinstance(doc.get("model"), str) and any(
        k in doc for k in V1_MARKERS)


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    if is_v1(doc):
        read_v1(r, doc)
        r.audit(TABLE_V1)
        return
    r.layout = "LLaMA-Factory v0 recipe (hparams)"
    if not r.boolean(doc.get("do_train"), "do_train"):  # train/*/workflow.py: trains only then
        export = next((k for k in doc if str(k).startswith("export_")), None)
        said = show(doc["do_train"]) if "do_train" in doc else "not set"
        raise r.fail("do_train", f"{said}: LLaMA-Factory trains nothing "
                     "with this file" + (f" ({export}: an export config for llamafactory-cli "
                                         "export)" if export else
                                         " (set do_train: true if it is a training recipe)"))
    r.model(doc.get("model_name_or_path"), "model_name_or_path")
    trainer.read_args(r, doc, TABLE, checkpointing=False)
    off = r.boolean(doc.get("disable_gradient_checkpointing"), "disable_gradient_checkpointing")
    gc = r.boolean(doc.get("gradient_checkpointing"), "gradient_checkpointing")
    if off and not gc:
        r.set("checkpointing", "none", "disable_gradient_checkpointing")
    else:
        r.set("checkpointing", "full", "gradient_checkpointing" if gc else
              "disable_gradient_checkpointing" if off is not None else
              f"disable_gradient_checkpointing ({r.label(TABLE)} default: false)")
        reentrant_gc(r, doc, bool(gc))
    if r.boolean(doc.get("pure_bf16"), "pure_bf16"):
        r.replace("training.precision", "bf16", "pure_bf16")
    if r.boolean(doc.get("fp8"), "fp8"):
        backend = str(doc.get("fp8_backend") or "auto").lower()
        if backend == "torchao":
            r.set("training.float8", "tensorwise", "fp8, fp8_backend torchao")
            if r.boolean(doc.get("fp8_enable_fsdp_float8_all_gather"),
                         "fp8_enable_fsdp_float8_all_gather"):
                r.set("training.float8_all_gather", True, "fp8_enable_fsdp_float8_all_gather")
        else:
            r.set("training.float8", Unmodelled(
                "fp8", f"float8 training with fp8_backend {backend} (from {r.name}: "
                "TransformerEngine or MS-AMP unless torchao) is not modelled yet"), "fp8")
    seq, key = trainer.value(r, TABLE, doc, "cutoff_len")
    r.set("training.seq", r.count(seq, key), key)
    stage, stage_key = trainer.value(r, TABLE, doc, "stage")
    stage = (r.text(stage, stage_key) or "sft").lower()
    r.layout = f"LLaMA-Factory v0 recipe (stage {stage})"
    if r.boolean(doc.get("enable_liger_kernel"), "enable_liger_kernel") and stage in ("sft", "pt"):
        r.set("training.loss", "fused", "enable_liger_kernel")
    flash = r.text(doc.get("flash_attn"), "flash_attn")
    if flash is not None:
        r.set("training.attention", FLASH.get(flash.lower(), Vocab(flash.lower())), "flash_attn")
    lora = finetune(r, doc)
    stage_extras(r, doc, stage, stage_key, lora)
    r.audit(TABLE)


def finetune(r: Reader, doc: dict) -> bool:
    kind, key = trainer.value(r, TABLE, doc, "finetuning_type")
    kind = (r.text(kind, key) or "lora").lower()
    if kind == "lora":
        trainer.lora(r, doc, TABLE, rank_key="lora_rank", targets_key="lora_target")
        r.set("finetune.modules_to_save", doc.get("additional_target") or None,
              "additional_target")
    elif kind == "freeze":
        layers, lkey = trainer.value(r, TABLE, doc, "freeze_trainable_layers")
        n = layers if isinstance(layers, int) and not isinstance(layers, bool) else None
        if n is None or n == 0:
            raise r.fail(lkey, f"must be a non-zero whole number of blocks, got {layers!r}")
        modules = doc.get("freeze_trainable_modules", "all")
        extra = doc.get("freeze_extra_modules")
        if str(modules).lower() != "all" or extra:
            r.set("finetune.freeze", Vocab(f"blocks {n} with modules {modules} and {extra}"),
                  "freeze_trainable_modules")
        elif n > 0:  # the last n blocks train (finetuning_args.py FreezeArguments)
            r.set("finetune.freeze", f"all-but-{n}-layers", lkey)
        else:  # the first -n blocks train: not something --freeze says
            r.set("finetune.freeze", Vocab(f"only the first {-n} blocks trained"), lkey)
    elif kind != "full":
        r.set("finetune.freeze", Vocab(kind), "finetuning_type")
    bits = doc.get("quantization_bit")
    if bits is not None and kind not in ("lora", "oft"):  # hparams/parser.py refuses it
        raise r.fail("quantization_bit", f"{show(bits)} with finetuning_type {kind}: "
                     "LLaMA-Factory quantizes only under LoRA or OFT")
    if bits is not None and kind == "oft":  # a quantized base under OFT (QOFT)
        r.set("finetune.quantize_base", Vocab(f"{bits}-bit base under OFT"), "quantization_bit")
    elif bits is not None:
        method = str(doc.get("quantization_method", "bnb")).lower()
        if method not in ("bnb", "bitsandbytes"):
            r.set("finetune.quantize_base", Vocab(f"{method} {bits}-bit"), "quantization_method")
        elif bits in (4, "4"):
            qt = str(doc.get("quantization_type", "nf4")).lower()
            r.set("finetune.quantize_base", "nf4" if qt == "nf4" else Vocab(qt),
                  "quantization_bit")
            dq, dkey = trainer.value(r, TABLE, doc, "double_quantization")
            r.set("finetune.double_quant", bool(dq), dkey)
        elif bits in (8, "8"):
            r.set("finetune.quantize_base", "int8", "quantization_bit")
        else:
            r.set("finetune.quantize_base", Vocab(f"{bits}-bit"), "quantization_bit")
    return kind == "lora"


def stage_extras(r: Reader, doc: dict, stage: str, key: str, lora: bool) -> None:
    """What a stage adds to the model's own step (never modelled, never dropped)."""
    if stage in ("rm", "dpo", "kto"):
        r.set("training.paired_batch", True, f"{key} {stage} (chosen + rejected sequences)")
    loss = str(doc.get("pref_loss", "sigmoid")).lower()
    # train/dpo/workflow.py: a LoRA run without ref_model reuses the base (adapters off)
    if stage in ("dpo", "kto") and loss not in ("orpo", "simpo") and (
            doc.get("ref_model") or not lora):
        r.set("training.reference_model", True, f"{key} {stage} (a frozen reference model)")
    if stage == "ppo":
        r.set("training.generation", True, f"{key} ppo (generation each step)")
        r.set("training.reward_model", doc.get("reward_model") or True, "reward_model")
    elif stage not in ("sft", "pt", "rm", "dpo", "kto"):
        r.set("training.paired_batch", Vocab(stage), key)


def reentrant_gc(r: Reader, doc: dict, trainer_gc: bool) -> None:
    """Which torch.utils.checkpoint LLaMA-Factory's checkpointing runs (hiyouga/LLaMA-Factory
    ff6d4d12, src/llamafactory/model/model_utils/checkpointing.py
    ``prepare_model_for_training``): ``use_reentrant_gc`` (hparams/model_args.py, default
    true), false under FSDP2 (``FSDP_VERSION`` 2); before 4196d5b (2024-12-17) always
    reentrant. With ``gradient_checkpointing: true`` the HF Trainer enables it again through
    LLaMA-Factory's own ``_gradient_checkpointing_enable`` (kwargs None -> ``use_reentrant``
    true), so the TrainingArguments kwargs decide then, reentrant without them."""
    if trainer.IMPL in r.raw:  # fsdp_config's activation_checkpointing (accelerate's)
        return
    if trainer_gc:
        key, kwargs = trainer.checkpoint_kwargs(r, doc)
        if kwargs is not None and kwargs.get("use_reentrant") is not None:
            k = f"{key}.use_reentrant"
            r.set(trainer.IMPL, "reentrant" if r.boolean(kwargs["use_reentrant"], k)
                  else "non-reentrant", k)
        else:
            r.set(trainer.IMPL, "reentrant", "gradient_checkpointing (the Trainer re-enables "
                  "it through LLaMA-Factory's gradient_checkpointing_enable: use_reentrant "
                  "true without kwargs)")
        return
    if r.raw.get("training.fsdp_version") == 2:
        r.set(trainer.IMPL, "non-reentrant", "fsdp_version 2 (LLaMA-Factory sets "
              "use_reentrant_gc false under FSDP2)")
        return
    v, key = trainer.value(r, TABLE, doc, "use_reentrant_gc")
    r.set(trainer.IMPL, "reentrant" if r.boolean(v, key) else "non-reentrant", key)


def read_v1(r: Reader, doc: dict) -> None:
    t = TABLE_V1
    r.layout = "LLaMA-Factory v1 config"
    r.model(doc.get("model"), "model")
    mb, key = trainer.value(r, t, doc, "micro_batch_size")
    r.set("training.micro_batch", r.count(mb, key), key)
    gb = r.count(doc.get("global_batch_size"), "global_batch_size")
    r.set("training.global_batch", gb, "global_batch_size")
    seq, key = trainer.value(r, t, doc, "cutoff_len")
    r.set("training.seq", r.count(seq, key), key)
    bf16, key = trainer.value(r, t, doc, "bf16")
    # model_engine.py loads the checkpoint with dtype="auto" (16-bit for nearly every hub
    # model) and nothing upcasts it: bf16 trains the loaded weights as they are
    r.set("training.precision", "bf16" if r.boolean(bf16, key) else Vocab("fp32-param on a "
          "16-bit checkpoint"), key)
    ac, key = trainer.value(r, t, doc, "enable_activation_checkpointing")
    r.set("checkpointing", "full" if r.boolean(ac, key) else "none", key)
    trainer.attention(r, FLASH.get(str(doc.get("flash_attn", "sdpa")).lower(),
                                   doc.get("flash_attn")), "flash_attn")
    dist = r.mapping(doc.get("dist_config"), "dist_config")
    name = (r.text(dist.get("name"), "dist_config.name") or "").lower()
    if name == "fsdp2" or name == "fsdpturbo":
        reshard = r.boolean(dist.get("reshard_after_forward", True),
                            "dist_config.reshard_after_forward")
        rep = r.count(doc.get("mp_replicate_size", 1), "mp_replicate_size") or 1
        shard = r.count(doc.get("mp_shard_size"), "mp_shard_size")
        if shard:
            r.set("hardware.n", rep * shard, "mp_replicate_size x mp_shard_size")
        strategy = "hybrid_shard" if rep > 1 else "full_shard" if reshard else "shard_grad_op"
        r.set("strategy", strategy, "dist_config.name")
        r.set("training.fsdp_version", 2, "dist_config.name (FSDP2 fully_shard)")
        off = r.boolean(dist.get("offload_params"), "dist_config.offload_params")
        r.set("offload", "params_and_optimizer" if off else "none", "dist_config.offload_params")
        ep = r.count(dist.get("ep_size", 1), "dist_config.ep_size") or 1
        if ep > 1:
            r.set("parallel.ep", unread_ep(
                r, ep, "dist_config.ep_size", "LLaMA-Factory's is fsdp_turbo's "
                "(expert_parallelize_modules over an (edp, efsdp, ep, cp) mesh: v1/plugins/"
                "trainer_plugins/distributed/fsdpturbo.py), whose dispatch is not read"),
                  "dist_config.ep_size")
    elif name == "deepspeed":
        ref = r.reference(dist.get("config_file"), "dist_config.config_file",
                          JobFormat.DEEPSPEED)
        if ref is not None:
            r.peers.append(ref)
        else:
            r.set("strategy", "zero1,zero2,zero3", "dist_config.config_file")
    elif name:
        r.set("strategy", Vocab(name), "dist_config.name")
    else:
        r.fallback("strategy", "ddp", f"{r.name}: no dist_config: plain DDP")
    cp = r.count(doc.get("cp_size", 1), "cp_size") or 1
    if cp > 1:
        # v1/config/training_args.py cp_mode (default and only implementation: ulysses)
        mode = r.text(doc.get("cp_mode"), "cp_mode") or "ulysses"
        r.set("parallel.cp", unread_cp(
            r, cp, "cp_size", f"LLaMA-Factory's (cp_mode {mode}) is DeepSpeed-Ulysses "
            "sequence parallel: all-to-alls trade each rank's sequence shard for a shard of "
            "the heads around a whole-sequence flash attention (v1/plugins/model_plugins/"
            "parallelization/ulysses.py UlyssesAttention), not a ring"), "cp_size")
    init = r.mapping(doc.get("init_config"), "init_config")
    mode = {"init_on_meta": "meta", "init_on_rank0": "rank0", "init_on_default": "full"}
    iname = r.text(init.get("name"), "init_config.name")
    if iname:
        r.set("training.init", mode.get(iname, Vocab(iname)), "init_config.name")
    optim = r.mapping(doc.get("optim_config"), "optim_config")
    oname = r.text(optim.get("name"), "optim_config.name")
    if oname:
        r.set("training.optimizer", Vocab(oname.lower()), "optim_config.name")
    else:  # core/base_trainer.py: torch.optim.AdamW with torch's foreach default
        r.set("training.optimizer", "adamw", "optim_config (none: torch.optim.AdamW)")
        r.set("training.optimizer_impl", "foreach", "optim_config (none: torch.optim.AdamW)")
    peft = r.mapping(doc.get("peft_config"), "peft_config")
    pname = (r.text(peft.get("name"), "peft_config.name") or "").lower()
    if pname == "lora":
        _v1_lora(r, peft)
    elif pname == "freeze":
        n = peft.get("freeze_trainable_layers", 2)
        if not isinstance(n, int) or isinstance(n, bool) or n == 0:
            raise r.fail("peft_config.freeze_trainable_layers", f"must be a non-zero whole "
                         f"number of blocks, got {n!r}")
        r.set("finetune.freeze", f"all-but-{n}-layers" if n > 0 else
              Vocab(f"only the first {-n} blocks trained"), "peft_config.freeze_trainable_layers")
    elif pname:
        r.set("finetune.freeze", Vocab(pname), "peft_config.name")
    quant = r.mapping(doc.get("quant_config"), "quant_config")
    bits = quant.get("quantization_bit")
    if bits in (4, "4"):
        qt = str(quant.get("quantization_type", "nf4")).lower()
        r.set("finetune.quantize_base", "nf4" if qt == "nf4" else Vocab(qt),
              "quant_config.quantization_bit")
        r.set("finetune.double_quant", bool(quant.get("double_quantization", True)),
              "quant_config.double_quantization")
    elif bits in (8, "8"):
        r.set("finetune.quantize_base", "int8", "quant_config.quantization_bit")
    elif bits is not None:
        r.set("finetune.quantize_base", Vocab(f"{bits}-bit"), "quant_config.quantization_bit")
    if any(k in doc for k in ("pref_loss", "pref_beta")):
        r.set("training.paired_batch", True, "pref_loss / pref_beta (preference training)")


def _v1_lora(r: Reader, peft: Any) -> None:
    """peft.py LoraParams: r 8, target_modules all, lora_dropout 0.05."""
    rank = peft.get("r", r.default(TABLE_V1, "peft_config.r"))
    r.set("finetune.lora_rank", r.count(rank, "peft_config.r"),
          "peft_config.r" if "r" in peft else f"peft_config.r ({r.label(TABLE_V1)} default)")
    targets = peft.get("target_modules", MISSING)
    if targets is MISSING:
        r.lora_targets(r.default(TABLE_V1, "peft_config.target_modules"),
                       f"peft_config.target_modules ({r.label(TABLE_V1)} default)")
    else:
        r.lora_targets(targets, "peft_config.target_modules")
    p = peft.get("lora_dropout", MISSING)
    if p is MISSING:
        p = r.default(TABLE_V1, "peft_config.lora_dropout")
    r.set("finetune.lora_dropout", r.probability(p, "peft_config.lora_dropout") > 0,
          "peft_config.lora_dropout")
    r.set("finetune.modules_to_save", peft.get("modules_to_save") or None,
          "peft_config.modules_to_save")
