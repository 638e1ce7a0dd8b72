"""A TRL config (SFTConfig, DPOConfig, GRPOConfig, ... with ModelConfig and ScriptArguments):
TRL's own recipes and the alignment-handbook and open-r1 recipes built on them, as ``trl sft
--config`` reads them, against TRL's key table (planner/data/job_keys_trl.json, TRL 1.16).

TRL's defaults apply to what the file leaves out (trainer/base_config.py: gradient
checkpointing on, bf16 unless fp16; sft_config.py: max_length 1024; model_config.py: lora_r
16, lora_dropout 0.05) and are named in the assumptions. The trainer is told by the keys only
its config class has (num_generations: GRPO/RLOO, beta: DPO, desirable_weight: KTO, ...) or
by a word of the recipe's path (recipes/<model>/orpo/, dpo_config.yaml); a file with none of
them is read as SFT, and says so. What a non-SFT trainer adds is not modelled: chosen and
rejected sequences per example (DPO, ORPO, KTO, reward), a reference model (DPO and KTO without
PEFT or precomputed log-probs, GRPO with beta > 0), generation (GRPO, RLOO, online DPO), a
teacher model.
"""

from __future__ import annotations

import re
from typing import Any

from planner.jobs.readers import trainer
from planner.jobs.readers.common import Reader

TABLE = "trl"
GENERATION = ("num_generations", "max_completion_length", "use_vllm", "reward_funcs",
              "steps_per_generation", "generation_batch_size", "num_iterations",
              "vllm_mode", "max_new_tokens")
FOLDERS = ("sft", "dpo", "orpo", "kto", "grpo", "rloo", "cpo", "reward", "distill", "gkd")
PREFERENCE = ("dpo", "orpo", "cpo", "kto", "reward")


def detect(doc: Any) -> int:
    from planner.jobs.keys import recipe_score

    return recipe_score(TABLE, doc)


def kind(doc: dict, path: str) -> tuple[str, str]:
    """(trainer, why): the TRL trainer a recipe configures."""
    *folders, base = path.lower().replace("\\", "/").split("/")
    # dpo_config.yaml, llama3-orpo.yaml (not "distill", which names distilled data as often as
    # a distillation trainer), then the folders
    words = [w for w in re.split(r"[-_.]", base) if w not in ("distill", "reward")]
    folder = next((p for p in (*words, *reversed(folders)) if p in FOLDERS), None)
    if any(k in doc for k in GENERATION) and folder not in PREFERENCE:
        return "grpo", f"{next(k for k in GENERATION if k in doc)} (GRPOConfig/RLOOConfig)"
    if "teacher_model_name_or_path" in doc:
        return "distillation", "teacher_model_name_or_path (DistillationConfig)"
    if "desirable_weight" in doc or "undesirable_weight" in doc:
        return "kto", "desirable_weight (KTOConfig)"
    if "center_rewards_coefficient" in doc:
        return "reward", "center_rewards_coefficient (RewardConfig)"
    if "cpo_alpha" in doc or "simpo_gamma" in doc:
        return "cpo", "cpo_alpha (CPOConfig)"
    if folder is not None:
        return {"distill": "distillation", "gkd": "distillation"}.get(folder, folder), \
            f"{folder} in the recipe's path"
    for k in ("beta", "precompute_ref_log_probs", "max_prompt_length", "rpo_alpha",
              "reference_free", "loss_type"):
        if k in doc and not (k == "loss_type" and str(doc[k]).lower() in ("nll", "dft")):
            return "dpo", f"{k} (DPOConfig)"
    return "sft", "no key of another TRL trainer (SFTConfig)"


def read(r: Reader) -> None:
    doc = r.mapping(r.doc, "file")
    what, why = kind(doc, r.name)
    r.layout = f"TRL {what.upper()} recipe ({why})"
    r.model(doc.get("model_name_or_path"), "model_name_or_path")
    trainer.read_args(r, doc, TABLE)
    init = r.mapping(doc.get("model_init_kwargs"), "model_init_kwargs")
    for key, d in (("torch_dtype", doc.get("torch_dtype")), ("dtype", doc.get("dtype")),
                   ("model_init_kwargs.dtype", init.get("dtype")),
                   ("model_init_kwargs.torch_dtype", init.get("torch_dtype"))):
        trainer.model_dtype(r, d, key)
    trainer.attention(r, init.get("attn_implementation"), "model_init_kwargs.attn_implementation")
    if r.boolean(doc.get("use_flash_attention_2"), "use_flash_attention_2"):
        r.set("training.attention", "sdpa", "use_flash_attention_2")
    if r.boolean(doc.get("activation_offloading"), "activation_offloading"):
        # TRL's own copy of OffloadActivations (trl/models/activation_offloading.py)
        r.set("training.activation_offload", True, "activation_offloading")
        r.set("training.activation_offload_impl", "trl", "activation_offloading")
    if r.boolean(doc.get("use_liger"), "use_liger") or r.boolean(doc.get("use_liger_loss"),
                                                                  "use_liger_loss"):
        r.set("training.loss", "fused", "use_liger" if "use_liger" in doc else "use_liger_loss")
    sequence(r, doc, what)
    peft = finetune(r, doc)
    if peft:
        peft_zero3(r)
    extras(r, doc, what, peft)
    r.audit(TABLE)


def sequence(r: Reader, doc: dict, what: str) -> None:
    if what == "grpo":
        c, ckey = trainer.value(r, TABLE, doc, "max_completion_length")
        p = r.count(doc.get("max_prompt_length"), "max_prompt_length")
        c = r.count(c, ckey)
        if p and c:
            r.set("training.seq", p + c, "max_prompt_length + max_completion_length")
        return
    for key in ("max_seq_length", "max_length"):  # SFTConfig's old and new spelling
        if doc.get(key) is not None:
            r.set("training.seq", r.count(doc[key], key), key)
            return
    seq, key = trainer.value(r, TABLE, doc, "max_length")
    r.set("training.seq", r.count(seq, key), key)


def finetune(r: Reader, doc: dict) -> bool:
    peft = bool(r.boolean(doc.get("use_peft"), "use_peft"))
    if peft:
        trainer.lora(r, doc, TABLE, rank_key="lora_r", targets_key="lora_target_modules")
        r.set("finetune.modules_to_save", doc.get("lora_modules_to_save") or None,
              "lora_modules_to_save")
    trainer.quantization(r, doc, TABLE)
    return peft


def peft_zero3(r: Reader) -> None:
    """TRL forces reentrant checkpointing for a PEFT model under DeepSpeed ZeRO-3, whatever the
    kwargs say (huggingface/trl f11b4c3, #4951, 2026-02-06: sft_trainer.py, dpo, grpo, kto,
    reward and rloo trainers' ``__init__``); its default otherwise is non-reentrant (since
    40d8759, #4811, v0.27.0: ``setdefault("use_reentrant", False)`` under transformers < 5,
    whose own default is non-reentrant from 5.0)."""
    if r.raw.get("checkpointing") != "full":
        return
    if any(p.raw.get("strategy") == "zero3" for p in r.peers):
        r.replace(trainer.IMPL, "reentrant", "use_peft under DeepSpeed ZeRO-3 (TRL forces "
                  "use_reentrant true)")


def extras(r: Reader, doc: dict, what: str, peft: bool) -> None:
    """What the trainer adds beside the model's own step: never modelled, never dropped."""
    ref_free = (r.boolean(doc.get("precompute_ref_log_probs"), "precompute_ref_log_probs")
                or r.boolean(doc.get("reference_free"), "reference_free"))
    if what in PREFERENCE:
        r.set("training.paired_batch", True, f"{what} trainer (chosen + rejected sequences)")
    if what in ("dpo", "kto") and not peft and not ref_free:
        r.set("training.reference_model", True, f"{what} trainer (a frozen reference copy; no "
              "use_peft, no precompute_ref_log_probs)")
    if what == "grpo":
        r.set("training.generation", True, "num_generations (completions generated each step)")
        beta = doc.get("beta", r.default(TABLE, "beta"))
        if isinstance(beta, (int, float)) and not isinstance(beta, bool) and beta > 0 \
                and not peft:
            r.set("training.reference_model", True, "beta (> 0: a reference model)")
    if doc.get("reward_model_path"):  # online DPO, PPO: a reward model beside the policy
        r.set("training.reward_model", doc["reward_model_path"], "reward_model_path")
    if doc.get("sft_model_path"):  # PPO: the SFT model is the reference
        r.set("training.reference_model", True, "sft_model_path")
    if what == "distillation":
        r.set("training.teacher_model", doc.get("teacher_model_name_or_path") or True,
              "teacher_model_name_or_path")
