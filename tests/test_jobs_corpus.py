"""The current public job files of every format (tests/data/jobs/SOURCES.md, issue 21), each with
what it means, read by hand from the file and from its framework's source (the defaults named
with their version in planner/data/job_keys_*.json), and fitcheck's reading of it: the values it
plans with, the settings it names as not modelled (each a reject reason at the gate), nothing
else. Then every file, old and new, is written back without a crash.

``classify`` is the acceptance measure of the issue: read right, silently misread, wrongly
refused, refused clearly, crashed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from planner.jobs import JobError, read_job

DATA = Path(__file__).parent / "data" / "jobs"
TT = "layouts/torchtitan/torchtitan/models"
ALL = ("q", "k", "v", "o", "gate", "up", "down")

# file -> what it means. values: the fields as the file sets them (or the framework's default,
# commented); unmodelled: a word of each setting fitcheck must name (no more, no fewer);
# model: a preset for the gate when the file names a model fitcheck has no preset for.
CASES: dict[str, dict] = {
    # ---- torchtitan 0.3 config registries (main at b5bcd76c), read without running them
    f"{TT}/llama3/config_registry.py:llama3_8b": dict(  # 1 x 8192 tokens, SelectiveAC
        values={"model.preset": "llama3-8b", "training.micro_batch": 1, "training.seq": 8192,
                "strategy": "full_shard", "checkpointing": "selective",
                "training.loss": "fused",  # ChunkedLossWrapper: lm_head + loss per chunk
                "training.precision": "bf16-amp", "training.optimizer": "adamw"},
        unmodelled=[], n=8),
    f"{TT}/llama3/config_registry.py:llama3_70b": dict(  # 8 x 8192, TP 8, FullAC
        values={"model.preset": "llama3-70b", "training.micro_batch": 8, "parallel.tp": 8,
                "checkpointing": "full"}, unmodelled=[], n=64),
    f"{TT}/llama3/config_registry.py:llama3_405b": dict(  # compile + async TP + float8
        values={"model.preset": "llama3.1-405b", "training.micro_batch": 2, "parallel.tp": 8,
                "training.compile": "blocks+loss",  # CompileConfig default [model, loss]
                # Float8LinearConverter.Config(filter_fqns=["lm_head"]): rowwise by default
                "training.float8": "rowwise"},
        unmodelled=["async tensor parallel"], n=128),
    f"{TT}/llama3/config_registry.py:llama3_8b_mxfp8": dict(
        values={"training.compile": "blocks"},  # components=["model"]
        unmodelled=["MXFP8LinearConverter"], n=8),
    f"{TT}/deepseek_v3/config_registry.py:deepseek_v3_16b": dict(  # EP 8, loss-only compile
        values={"training.micro_batch": 4, "training.seq": 4096, "parallel.ep": 8},
        unmodelled=["torch.compile loss only"],
        model="deepseek-v2-lite", n=8),
    f"{TT}/qwen3/config_registry.py:qwen3_32b": dict(
        values={"training.micro_batch": 2, "training.seq": 4096, "checkpointing": "full"},
        unmodelled=[], model="qwen2.5-72b", n=16),
    # ---- torchtitan v0.2.0 TOML
    "torchtitan_deepseek_v3_16b.v0.2.0.toml": dict(
        values={"training.micro_batch": 4, "training.seq": 4096, "parallel.ep": 8},
        unmodelled=["loss only"], model="deepseek-v2-lite", n=8),
    "torchtitan_llama3_405b.v0.2.0.toml": dict(
        values={"model.preset": "llama3.1-405b", "training.micro_batch": 2, "parallel.tp": 8,
                "training.compile": "blocks+loss",  # enable=true, components default
                # converters = ["float8"], [quantize.linear.float8]
                "training.float8": "tensorwise", "training.float8_all_gather": True},
        unmodelled=["async tensor parallel"], n=128),
    "torchtitan_llama4_17bx16e.v0.2.0.toml": dict(
        values={"training.micro_batch": 8, "parallel.tp": 8, "checkpointing": "full"},
        unmodelled=["expert tensor parallel degree"], model="llama3-70b", n=64),
    "torchtitan_qwen3_32b.v0.2.0.toml": dict(
        values={"training.micro_batch": 2, "training.seq": 4096, "checkpointing": "full"},
        unmodelled=[], model="qwen2.5-72b", n=16),
    "torchtitan_llama3_debug_model.v0.2.0.toml": dict(  # selective_ac_option '2'
        values={"training.micro_batch": 8}, unmodelled=["full-every-2-blocks"],
        model="llama3.2-1b", n=8),
    # ---- DeepSpeed JSON
    "accelerate_tests_ds_config_zero3.json": dict(  # torch_adam, offload both, "auto" save
        values={"strategy": "zero3", "offload": "params_and_optimizer",
                "deepspeed.fused_adam": False, "training.optimizer_impl": "foreach",
                "deepspeed.stage3_max_live_parameters": 1_000_000_000},
        unmodelled=[], n=8),
    "accelerate_tests_ds_config_zero2.json": dict(
        values={"strategy": "zero2", "offload": "optimizer",
                "deepspeed.allgather_bucket_size": 200_000_000}, unmodelled=[], n=8),
    "llamafactory_ds_z0_config.json": dict(  # stage 0: DDP in the engine
        values={"strategy": "ddp", "offload": "none"}, unmodelled=[], n=8),
    "llamafactory_ds_z2_autotp_config.json": dict(  # tensor_parallel.autotp_size 2
        values={"strategy": "zero2"}, unmodelled=["autotp_size 2"], n=8),
    "llamafactory_ds_z3_fp8_config.json": dict(  # comms_config: DeepSpeed ignores it
        values={"strategy": "zero3", "offload": "optimizer",
                "deepspeed.reduce_bucket_size": 12_845_056}, unmodelled=[],
        warnings=["comms_config"], n=8),
    "deepspeedexamples_autotuning_ds_config_fp16_z1.json": dict(
        values={"strategy": "zero1", "training.precision": "fp16-amp"}, unmodelled=[], n=8),
    "deepspeedexamples_autotuning_ds_config_fp16_z3.json": dict(
        values={"strategy": "zero3", "training.precision": "fp16-amp"}, unmodelled=[], n=8),
    "layouts/accelerate/examples/alst_ulysses_sequence_parallelism/sp-alst.ds-config.json":
        dict(values={"strategy": "zero3", "training.precision": "bf16-amp"}, unmodelled=[],
             n=4),
    # ---- accelerate YAML
    "layouts/accelerate/examples/alst_ulysses_sequence_parallelism/sp-alst.accelerate-config"
    ".yml": dict(  # names sp-alst.ds-config.json; zero3_init_flag false
        values={"hardware.n": 4, "strategy": "zero3", "deepspeed.zero_init": False},
        unmodelled=[]),
    "accelerate_tnp_cp.yaml": dict(  # FSDP2, CP 8: torch's context_parallel, HF attention
        values={"hardware.n": 8, "training.fsdp_version": 2, "checkpointing": "full",
                "parallel.cp": 8, "parallel.cp_kv": "grouped"},
        unmodelled=[]),
    "accelerate_template_fp8.yaml": dict(values={"strategy": "ddp"},
                                         unmodelled=["float8"], n=1),
    "accelerate_tests_0_34_0_fp8.yaml": dict(values={"hardware.n": 2},
                                             unmodelled=["float8"]),
    "accelerate_template_multi_gpu.yaml": dict(
        values={"hardware.n": 2, "strategy": "ddp", "training.precision": "bf16-amp"},
        unmodelled=[]),
    "accelerate_template_multi_node.yaml": dict(  # no mixed_precision: fp32 (launch.py)
        values={"hardware.n": 8, "hardware.gpus_per_node": 4, "training.precision": "fp32"},
        unmodelled=[]),
    "accelerate_slurm_fsdp_config.yaml": dict(  # forward_prefetch false, BACKWARD_PRE
        values={"strategy": "full_shard", "training.precision": "fp32"}, unmodelled=[], n=8),
    "trl_accelerate_alst_ulysses_4gpu.yaml": dict(  # ZeRO-3 + Ulysses SP 2 on 4 GPUs
        values={"hardware.n": 4, "strategy": "zero3"},
        unmodelled=["sequence parallel (Ulysses) degree 2"]),
    "trl_accelerate_context_parallel_2gpu.yaml": dict(
        values={"hardware.n": 2, "training.fsdp_version": 2, "parallel.cp": 2,
                "parallel.cp_kv": "grouped"},
        unmodelled=[]),
    "trl_accelerate_multi_gpu.yaml": dict(values={"hardware.n": 8, "strategy": "ddp"},
                                          unmodelled=[]),
    "open-r1_accelerate_zero3.yaml": dict(values={"hardware.n": 8, "strategy": "zero3"},
                                          unmodelled=[]),
    "open-r1_accelerate_ddp.yaml": dict(values={"hardware.n": 8, "strategy": "ddp"},
                                        unmodelled=[]),
    "alignment-handbook_accelerate_ddp.yaml": dict(values={"hardware.n": 8}, unmodelled=[]),
    "llamafactory_fsdp_config.yaml": dict(values={"hardware.n": 2, "strategy": "full_shard"},
                                          unmodelled=[]),
    # ---- TRL recipes (TRL 1.16 defaults: bf16, gradient checkpointing, max_length 1024)
    "trl_cli_example_config.yaml": dict(
        values={"training.micro_batch": 8, "training.grad_accum": 1,  # TrainingArguments
                "training.precision": "bf16-amp", "checkpointing": "full",  # _BaseConfig
                "training.seq": 1024,  # SFTConfig.max_length
                "training.optimizer_impl": "fused"},  # adamw_torch_fused
        unmodelled=[], model="qwen2.5-7b", n=1),
    "open-r1_DeepSeek-R1-Distill-Qwen-1.5B_grpo_config_demo.yaml": dict(
        values={"training.micro_batch": 16, "training.seq": 2560, "training.loss": "fused"},
        unmodelled=["generation during training", "vLLM"], model="qwen2.5-7b", n=8),
    "open-r1_OpenR1-Distill-7B_sft_config_distill.yaml": dict(
        values={"training.micro_batch": 2, "training.grad_accum": 8, "training.seq": 32768},
        unmodelled=[], model="qwen2.5-7b", n=8),
    "open-r1_OlympicCoder-7B_sft_config_v00.00.yaml": dict(
        values={"training.seq": 32768, "training.loss": "fused"}, unmodelled=[],
        model="qwen2.5-7b", n=8),
    "alignment-handbook_zephyr-7b-beta_dpo_config_full.yaml": dict(  # full DPO: a ref copy
        values={"training.micro_batch": 8, "training.seq": 1024,
                "training.optimizer_impl": "foreach"},  # optim adamw_torch
        unmodelled=["chosen + rejected", "reference model"], model="mistral-7b", n=8),
    "alignment-handbook_zephyr-7b-beta_dpo_config_qlora.yaml": dict(  # PEFT: no ref copy
        values={"finetune.lora_rank": 128, "finetune.quantize_base": "nf4",
                "finetune.lora_targets": ALL, "finetune.lora_dropout": True},
        unmodelled=["chosen + rejected"], model="mistral-7b", n=8),
    "alignment-handbook_smollm3_sft_sft.yaml": dict(
        values={"training.seq": 65536, "training.micro_batch": 1}, unmodelled=[],
        model="llama3.2-3b", n=8),
    "alignment-handbook_smollm3_dpo_apo.yaml": dict(
        values={"training.seq": 24576}, unmodelled=["chosen + rejected", "reference model"],
        model="llama3.2-3b", n=8),
    # recipes/zephyr-141b-A35b/orpo/: ORPO (run_orpo.py), the same keys a DPO config has but no
    # reference model: the folder names the trainer
    "alignment-handbook_zephyr-141b-A35b_orpo_config_full.yaml": dict(
        values={"training.micro_batch": 1, "training.grad_accum": 1, "training.seq": 2048,
                "training.optimizer": "adamw-8bit", "checkpointing": "full"},
        unmodelled=["chosen + rejected"], model="mixtral-8x7b", n=64),
    "alignment-handbook_zephyr-7b-gemma_sft_config_full.yaml": dict(
        values={"training.seq": 2048, "training.micro_batch": 4}, unmodelled=[],
        model="gemma2-9b", n=8),
    # ---- LLaMA-Factory v0 (0.9.5 defaults: finetuning_type lora, lora_target all, ...)
    "llamafactory_qwen3_lora_dpo.yaml": dict(  # LoRA: the base is the reference, no copy
        values={"finetune.lora_rank": 8, "finetune.lora_targets": ALL, "training.seq": 2048},
        unmodelled=["chosen + rejected"], model="qwen2.5-7b", n=1),
    "llamafactory_qwen3_lora_kto.yaml": dict(values={"finetune.lora_rank": 8},
                                             unmodelled=["chosen + rejected"],
                                             model="qwen2.5-7b", n=1),
    "llamafactory_qwen3_lora_reward.yaml": dict(values={"finetune.lora_rank": 8},
                                                unmodelled=["chosen + rejected"],
                                                model="qwen2.5-7b", n=1),
    "llamafactory_qwen3_lora_pretrain.yaml": dict(values={"finetune.lora_rank": 8},
                                                  unmodelled=[], model="qwen2.5-7b", n=1),
    "llamafactory_qwen3_lora_sft.yaml": dict(
        values={"finetune.lora_rank": 8, "finetune.lora_dropout": False,  # default 0.0
                "checkpointing": "full",  # disable_gradient_checkpointing default false
                "training.micro_batch": 1, "training.grad_accum": 8},
        unmodelled=[], model="qwen2.5-7b", n=1),
    "llamafactory_extras_galore_llama3_full_sft.yaml": dict(
        values={"training.precision": "bf16"},  # pure_bf16
        unmodelled=["GaLore"], n=1),
    "llamafactory_extras_badam_llama3_full_sft.yaml": dict(
        values={"training.precision": "fp32"},  # no bf16: TrainingArguments default false
        unmodelled=["BAdam"], n=1),
    "llamafactory_extras_adam_mini_qwen2_full_sft.yaml": dict(
        values={"training.precision": "bf16-amp"}, unmodelled=["Adam-mini"],
        model="qwen2.5-7b", n=1),
    "llamafactory_extras_fp8_llama3_fp8_fsdp_sft.yaml": dict(
        values={"strategy": "full_shard", "training.seq": 1024,  # fp8_backend torchao
                "training.float8": "tensorwise", "training.float8_all_gather": True}, n=8),
    "llamafactory_extras_llama_pro_llama3_freeze_sft.yaml": dict(
        values={"finetune.freeze": "all-but-8-layers"}, unmodelled=["LLaMA Pro"],
        model="llama3-8b", n=1),
    "llamafactory_extras_fsdp_qlora_llama3_lora_sft.yaml": dict(
        values={"finetune.quantize_base": "nf4", "finetune.double_quant": True},
        unmodelled=[], n=2),
    "llamafactory_extras_loraplus_llama3_lora_sft.yaml": dict(
        values={"finetune.lora_rank": 8}, unmodelled=[], n=1),
    # ---- LLaMA-Factory v1 (ff6d4d12): bf16 trains the checkpoint's 16-bit weights
    "llamafactory_v1_train_full_fsdp2.yaml": dict(
        values={"strategy": "full_shard", "training.fsdp_version": 2,
                "training.precision": "bf16", "checkpointing": "full"},
        unmodelled=["kernel replacements"], model="qwen2.5-7b", n=8),
    "llamafactory_v1_train_lora_sft.yaml": dict(
        values={"finetune.lora_rank": 16, "finetune.lora_dropout": True},
        unmodelled=["kernel replacements"], model="qwen2.5-7b", n=8),
    "llamafactory_v1_train_full_ulysses_cp.yaml": dict(  # bf16 false over a bf16 checkpoint
        values={"strategy": "full_shard"},
        unmodelled=["context parallel degree 2", "fp32-param on a 16-bit checkpoint"],
        model="qwen2.5-7b", n=8),
    "llamafactory_v1_train_full_qwen3_moe_fsdpturbo_ep_fsdp.yaml": dict(
        values={"training.seq": 256}, unmodelled=["expert parallel degree 16", "kernel",
                                                   "chunk_size"],
        model="qwen3-30b-a3b", n=16),
    "llamafactory_v1_train_qlora_quantization.yaml": dict(
        values={"finetune.quantize_base": "nf4"}, unmodelled=["kernel replacements"],
        model="qwen2.5-7b", n=8),
    # ---- axolotl (0.19.0)
    "axolotl_distributed-parallel_llama-3_1-8b-hsdp-tp.yaml": dict(  # 2 x 4 x TP 2 = 16
        values={"strategy": "hybrid_shard", "parallel.tp": 2, "hardware.n": 16,
                "training.loss": "fused"},  # CutCrossEntropyPlugin listed
        unmodelled=[]),
    "axolotl_distributed-parallel_qwen3-8b-fsdp-tp-cp.yaml": dict(
        values={"parallel.tp": 2, "hardware.n": 8, "training.seq": 8192},
        unmodelled=["context parallel degree 2"]),
    "axolotl_alst_llama3-8b-fsdp2-alst.yaml": dict(
        values={"training.seq": 500_000, "training.optimizer": "adamw-8bit"},
        unmodelled=["activation offloading", "context parallel degree 8", "tiled MLP"], n=8),
    "axolotl_alst_llama3-8b-deepspeed-alst.yaml": dict(
        values={"training.seq": 500_000},
        unmodelled=["activation offloading", "context parallel degree 8", "tiled MLP"],
        warnings=["zero3_bf16_cpuoffload_all.json"], n=8),
    "axolotl_expert_parallel_qwen3_30ba3b_ep_lora_4gpu.yaml": dict(
        values={"finetune.lora_rank": 32, "finetune.lora_dropout": False},
        unmodelled=["expert parallel degree 4", "experts implementation", "lora_mlp_kernel",
                    "lora_qkv_kernel", "lora_o_kernel"], model="qwen3-30b-a3b", n=4),
    "axolotl_gpt-oss_gpt-oss-20b-fft-fsdp2-offload.yaml": dict(
        values={"offload": "params_and_optimizer", "training.fsdp_version": 2,
                "training.activation_offload": True,  # modelled since issue 26
                "training.activation_offload_impl": "trl"},
        unmodelled=["kernels hub", "model_quantization_config:",
                    "model_quantization_config_kwargs"], model="qwen3-30b-a3b", n=8),
    "axolotl_llama-3_instruct-dpo-lora-8b.yml": dict(  # LoRA: no reference copy
        values={"finetune.quantize_base": "int8", "finetune.lora_rank": 32},
        unmodelled=["chosen + rejected"], n=1),
    "axolotl_llama-3_qlora-1b-kto.yaml": dict(
        values={"finetune.quantize_base": "nf4"}, unmodelled=["chosen + rejected"], n=1),
    "axolotl_mistral_orpo_mistral-qlora-orpo.yml": dict(
        values={"finetune.quantize_base": "nf4"}, unmodelled=["chosen + rejected"], n=1),
    "axolotl_llama-3_qlora-1b-gdpo.yaml": dict(  # no adapter: full; trl.beta 0.001
        values={"training.seq": 512},
        unmodelled=["generation during training", "reference model"], n=1),
    # ---- litgpt (0.5.13)
    "litgpt_finetune_gemma-2b_full.yaml": dict(
        values={"hardware.n": 4, "strategy": "full_shard", "training.precision": "bf16",
                "checkpointing": "full"}, unmodelled=[], model="gemma2-9b"),
    "litgpt_finetune_phi-2_lora.yaml": dict(
        values={"finetune.lora_rank": 8, "finetune.lora_targets": ALL,
                "finetune.lora_dropout": True}, unmodelled=["LoRA on the output head"]),
    "litgpt_finetune_mistral-7b_qlora.yaml": dict(
        values={"finetune.quantize_base": "nf4", "finetune.lora_rank": 32}, unmodelled=[]),
    "litgpt_finetune_llama-3.2-1B_full.yaml": dict(
        values={"model.preset": "llama3.2-1b", "hardware.n": 1, "strategy": "ddp"},
        unmodelled=[]),
    "litgpt_pretrain_debug.yaml": dict(  # devices auto: the GPU count is the flag's
        values={"training.precision": "bf16-amp", "training.micro_batch": 5},
        unmodelled=[], warnings=["devices: auto"], model="gpt2", n=8),
    "litgpt_pretrain_microllama.yaml": dict(
        values={"training.micro_batch": 12, "training.seq": 2048, "strategy": "hybrid_shard"},
        unmodelled=[], model="llama3.2-1b", n=8),
    # ---- torchtune (bd2a0fc7): dtype bf16 trains pure bf16
    "torchtune_llama3_1_8B_full.yaml": dict(
        values={"model.preset": "llama3.1-8b", "training.precision": "bf16",
                "training.micro_batch": 2, "checkpointing": "full", "strategy": "full_shard",
                "training.loss": "chunked:8", "training.optimizer_impl": "fused"},
        unmodelled=[], warnings=["custom_sharded_layers"], n=8),
    "torchtune_llama3_1_8B_lora.yaml": dict(
        values={"finetune.lora_rank": 8, "finetune.lora_targets": ("q", "v", "o", "gate",
                                                                   "up", "down"),
                "finetune.lora_dtype": "base", "training.grad_accum": 8},
        unmodelled=[], n=2),
    "torchtune_llama3_1_8B_qlora_single_device.yaml": dict(
        values={"finetune.quantize_base": "nf4", "hardware.n": 1}, unmodelled=[]),
    "torchtune_llama3_1_70B_lora.yaml": dict(values={"finetune.lora_rank": 16},
                                             unmodelled=[], n=8),
    "torchtune_llama3_1_8B_full_single_device.yaml": dict(
        values={"training.optimizer": "adamw-8bit", "training.optimizer_in_backward": True},
        unmodelled=[]),
    "torchtune_qwen2_5_7B_lora.yaml": dict(values={"model.preset": "qwen2.5-7b"},
                                           unmodelled=[], n=2),
    "torchtune_llama3_2_1B_full.yaml": dict(values={"model.preset": "llama3.2-1b"},
                                            unmodelled=[], n=2),
    "torchtune_llama3_1_8B_lora_dpo.yaml": dict(
        values={"training.seq": 1024}, unmodelled=["chosen + rejected"], n=2),
    "torchtune_llama2_7B_full.yaml": dict(values={"model.preset": "llama2-7b"},
                                          unmodelled=[], n=8),
    # ---- Kubeflow Trainer v2 (the GPU count lives in the TrainJob, or the flag)
    "kubeflow_trainer_runtime_torch_distributed.yaml": dict(values={}, unmodelled=[],
                                                            model="llama3-8b", n=8),
    "kubeflow_trainer_runtime_deepspeed_distributed.yaml": dict(values={}, unmodelled=[],
                                                                model="llama3-8b", n=8),
    "kubeflow_trainer_runtime_torchtune_llama3_2_1B.yaml": dict(values={}, unmodelled=[],
                                                                model="llama3.2-1b", n=8),
    "kubeflow_trainer_01-multi-node.yaml": dict(values={}, unmodelled=[], model="llama3-8b",
                                                n=8),
    # ---- the second fresh set of issue 21 (drawn at random from the same repositories, read
    # by hand before fitcheck read them; the fixes they asked for are in the tests above)
    "deepspeedexamples_compression_bert_XTC_ds_config_W1A8_Qgroup1_fp32.json": dict(
        values={"training.micro_batch": 32, "training.global_batch": 32, "strategy": "ddp",
                "training.precision": "fp32"},  # stage 0, fp16 disabled, no bf16 section
        unmodelled=["compression library"], model="bert-base", n=1),  # 1-bit weights
    "deepspeedexamples_compression_bert_XTC_ds_config_layer_reduction_fp16.json": dict(
        values={"training.micro_batch": 32, "strategy": "ddp", "training.precision": "fp32"},
        unmodelled=["compression library"], model="bert-base", n=1),  # keeps 6 layers
    "deepspeedexamples_autotuning_hf_bert-base_ds_config_tune.json": dict(
        values={"strategy": "ddp", "training.precision": "fp32"},
        unmodelled=["autotuner"], model="bert-base", n=8),  # it picks micro-batch and stage
    "deepspeedexamples_imagenet_ds_fp16_z1_config.json": dict(  # 256 = micro x 8 x GA 1
        values={"training.global_batch": 256, "training.grad_accum": 1, "strategy": "zero1",
                "training.precision": "fp16-amp", "training.optimizer": "adam"},
        unmodelled=[], model="bert-base", n=8),
    "llamafactory_fsdp2_kt_bf16.yaml": dict(
        values={"hardware.n": 4, "training.fsdp_version": 2, "strategy": "full_shard",
                "offload": "none", "training.precision": "bf16-amp"},
        unmodelled=[], model="llama3-8b"),
    "trl_accelerate_single_gpu.yaml": dict(  # distributed_type NO
        values={"hardware.n": 1, "strategy": "ddp", "training.precision": "bf16-amp"},
        unmodelled=[], model="llama3.2-1b"),
    "llamafactory_extras_dft_qwen2_full_sft.yaml": dict(
        values={"training.micro_batch": 1, "training.grad_accum": 8, "training.seq": 2048,
                "training.precision": "bf16-amp", "checkpointing": "full"},
        unmodelled=["DFT loss"], model="qwen2.5-7b", n=1),
    "llamafactory_qwen3vl_full_sft.yaml": dict(  # its ds_z3_config.json is not beside it
        values={"training.micro_batch": 1, "training.grad_accum": 2, "training.seq": 2048},
        unmodelled=["image resolution", "video resolution"], model="qwen3-8b", n=8),
    "llamafactory_qwen3vl_lora_dpo.yaml": dict(  # LoRA: the reference is the base, no copy
        values={"finetune.lora_rank": 8, "finetune.lora_targets": ALL,
                "finetune.lora_dropout": False, "training.grad_accum": 8},
        unmodelled=["chosen + rejected", "image resolution", "video resolution"],
        model="qwen3-8b", n=1),
    "alignment-handbook_smollm2_sft_config_smol.yaml": dict(  # max_seq_length: TRL's old key
        values={"training.micro_batch": 4, "training.grad_accum": 4, "training.seq": 8192,
                "checkpointing": "full", "training.precision": "bf16-amp"},
        unmodelled=[], model="llama3.2-1b", n=8),
    "open-r1_Qwen2.5-1.5B-Instruct_grpo_config_demo_code.yaml": dict(  # 1024 + 2048 tokens
        values={"training.micro_batch": 16, "training.grad_accum": 4, "training.seq": 3072},
        unmodelled=["generation during training", "reference model", "vLLM"],
        model="qwen2.5-7b", n=8),  # beta 0.01 without PEFT: a reference model
    "open-r1_Qwen2.5-1.5B-Instruct_grpo_config_demo_code_ioi.yaml": dict(
        values={"training.micro_batch": 16, "training.seq": 3072},
        unmodelled=["generation during training", "reference model", "vLLM"],
        model="qwen2.5-7b", n=8),
    "open-r1_dataset_filtering_filter_python.yaml": dict(  # a filtering run, not training
        values={}, unmodelled=["generation during training", "pass_rate_min", "pass_rate_max"],
        model="qwen2.5-7b", n=8),
    "axolotl_archived_code-llama_34b_lora.yml": dict(
        values={"training.seq": 4096, "training.micro_batch": 2, "training.grad_accum": 4,
                "training.precision": "bf16-amp",  # bf16: auto on an H100
                "training.optimizer": "adamw-8bit", "checkpointing": "full",
                "finetune.lora_rank": 32, "finetune.lora_targets": ALL,
                "finetune.lora_dropout": True, "finetune.quantize_base": "int8"},
        unmodelled=[], model="llama2-13b", n=1),
    "axolotl_gemma3_gemma-3-1b-qlora.yml": dict(
        values={"model.preset": "gemma3-1b", "training.seq": 2048,
                "finetune.quantize_base": "nf4", "finetune.lora_rank": 32},
        unmodelled=["unfrozen_parameters"], n=1),
    "axolotl_qat_nvfp4_Math-Gemma3-27B_qat.yml": dict(
        values={"training.micro_batch": 16, "training.optimizer_impl": "fused",
                "training.loss": "fused",  # liger_fused_linear_cross_entropy
                "training.fsdp_version": 2, "strategy": "full_shard", "checkpointing": "full"},
        unmodelled=["liger_rope", "liger_rms_norm", "liger_glu_activation",
                    "liger_layer_norm", "quantization-aware training"],
        model="gemma2-27b", n=8),
    "axolotl_smolvlm2_smolvlm2-2B-lora.yaml": dict(  # a regex target_modules, as peft reads it
        values={"training.seq": 8192, "finetune.lora_rank": 32, "finetune.lora_targets": ALL},
        unmodelled=[], model="llama3.2-1b", n=1),
    "axolotl_streaming_sft.yaml": dict(  # gradient_checkpointing left out: axolotl's false
        values={"training.seq": 1024, "training.grad_accum": 4,
                "training.optimizer_impl": "foreach", "checkpointing": "none"},
        unmodelled=[], model="llama3.2-1b", n=1),
    "litgpt_finetune_llama-3.2-3B_lora.yaml": dict(  # bf16-true; lora_query + lora_value
        values={"model.preset": "llama3.2-3b", "training.precision": "bf16",
                "training.micro_batch": 1, "training.global_batch": 8, "training.seq": 512,
                "finetune.lora_rank": 32, "finetune.lora_targets": ("q", "v"),
                "checkpointing": "none"}, unmodelled=[]),
    "litgpt_finetune_stablelm-base-alpha-3b_lora.yaml": dict(
        values={"training.precision": "bf16", "finetune.lora_targets": ("q", "v")},
        unmodelled=[], model="llama3.2-3b"),
    "torchtune_gemma_2B_lora.yaml": dict(  # output_proj = o; apply_lora_to_mlp
        values={"finetune.lora_rank": 64,
                "finetune.lora_targets": ("q", "v", "o", "gate", "up", "down"),
                "training.micro_batch": 4, "training.precision": "bf16",
                "checkpointing": "full"}, unmodelled=[], model="gemma3-1b", n=8),
    "torchtune_llama3_8B_qat_lora.yaml": dict(
        values={"model.preset": "llama3-8b", "finetune.lora_rank": 8,
                "training.micro_batch": 2, "training.grad_accum": 8, "checkpointing": "none"},
        unmodelled=["quantization-aware training"], n=8),
    "torchtune_qwen3_8B_qat_lora.yaml": dict(
        values={"model.preset": "qwen3-8b", "finetune.lora_rank": 8, "checkpointing": "none"},
        unmodelled=["quantization-aware training"], n=8),
    "kubeflow_trainer_flux_lammps-train-gpus.yaml": dict(  # 2 nodes x 1 GPU
        values={"hardware.n": 2, "hardware.gpus_per_node": 1}, unmodelled=[],
        model="llama3.2-1b"),
    # ---- the third fresh set
    "axolotl_ebft_qwen35-4b-ebft-structured.yaml": dict(  # q,k,v,o on 8 layers, MLP on all
        values={"training.seq": 1024, "training.micro_batch": 1, "training.grad_accum": 4,
                "finetune.lora_rank": 16, "finetune.lora_targets": ALL,  # an upper bound
                "checkpointing": "full"},
        unmodelled=["generation during training", "EBFT", "vLLM"],
        warnings=["on some layers only"], model="qwen3-8b", n=1),
    "axolotl_gpt-oss_gpt-oss-20b-fft-fsdp2.yaml": dict(
        values={"training.seq": 4096, "training.grad_accum": 2,
                "training.optimizer": "adamw-8bit", "training.fsdp_version": 2,
                "strategy": "full_shard", "training.loss": "fused",  # CutCrossEntropyPlugin
                "checkpointing": "full", "training.activation_offload": True,
                "training.activation_offload_impl": "trl"},
        unmodelled=["Mxfp4Config", "dequantize"],
        model="qwen3-30b-a3b", n=8),
    "axolotl_llama-3_3b-qat-nvfp4.yaml": dict(
        values={"model.preset": "llama3.2-3b", "training.micro_batch": 64,
                "training.seq": 8192},
        unmodelled=["liger_rope", "liger_rms_norm", "liger_glu_activation",
                    "liger_layer_norm", "quantization-aware training"], n=1),
    "axolotl_ministral3_think_ministral3-3b-think-qlora.yaml": dict(
        values={"training.seq": 2048, "training.micro_batch": 2, "training.grad_accum": 4,
                "finetune.lora_rank": 32, "finetune.lora_targets": ALL,
                "finetune.quantize_base": "nf4", "training.loss": "fused"},
        unmodelled=[], model="llama3.2-3b", n=1),
    "llamafactory_extras_qoft_llama3_oft_sft_awq.yaml": dict(
        values={"training.micro_batch": 1, "training.grad_accum": 8},
        unmodelled=["oft"], model="llama3-8b", n=1),
    "llamafactory_qwen3vlmoe_lora_sft_kt.yaml": dict(
        values={"training.seq": 512, "finetune.lora_rank": 8},
        unmodelled=["image resolution", "video resolution", "KTransformers",
                    "kt_cpu_activation", "kt_config"], model="qwen3-8b", n=1),
    "llamafactory_v1_train_full_fsdp2_padding_free.yaml": dict(
        values={"training.micro_batch": 4, "training.seq": 2048, "training.precision": "bf16",
                "checkpointing": "full", "strategy": "full_shard",
                "training.fsdp_version": 2},
        unmodelled=["kernel replacements", "padding-free"], model="llama3.2-1b", n=8),
    "torchtune_gemma_7B_lora_single_device.yaml": dict(
        values={"finetune.lora_rank": 8, "training.micro_batch": 8, "training.grad_accum": 8,
                "hardware.n": 1, "strategy": "ddp", "checkpointing": "full"},
        unmodelled=[], model="gemma2-9b"),
    "torchtune_qwen3_4B_lora_single_device.yaml": dict(
        values={"finetune.lora_rank": 8, "training.micro_batch": 2, "hardware.n": 1},
        unmodelled=[], model="qwen3-8b"),
    "trl_accelerate_pkg_single_gpu.yaml": dict(  # num_processes 8 under distributed_type NO
        values={"hardware.n": 1, "strategy": "ddp", "training.precision": "bf16-amp"},
        unmodelled=[], warnings=["num_processes 8 is not used"], model="llama3.2-1b"),
    "trl_accelerate_pkg_zero3.yaml": dict(
        values={"hardware.n": 8, "strategy": "zero3", "offload": "none"},
        unmodelled=[], model="llama3-8b"),
    "open-r1_dataset_filtering_config_demo.yaml": dict(
        values={}, unmodelled=["generation during training", "pass_rate_min", "pass_rate_max"],
        model="qwen2.5-7b", n=8),
    "open-r1_dataset_filtering_filter_dapo.yaml": dict(
        values={}, unmodelled=["generation during training", "dataset_split", "pass_rate_min",
                               "pass_rate_max", "output_dataset_name"],
        model="qwen2.5-7b", n=8),
    "alignment-handbook_constitutional-ai_sft_config_grok.yaml": dict(
        values={"model.preset": "mistral-7b", "training.micro_batch": 8,
                "training.grad_accum": 4, "training.seq": 2048, "checkpointing": "full"},
        unmodelled=[], n=8),
    "alignment-handbook_smollm_sft_config.yaml": dict(
        values={"training.micro_batch": 4, "training.grad_accum": 4, "training.seq": 2048},
        unmodelled=[], model="llama3.2-1b", n=8),
    "litgpt_finetune_gemma-2b_qlora.yaml": dict(
        values={"training.micro_batch": 2, "training.global_batch": 6, "training.seq": 512,
                "finetune.quantize_base": "nf4", "finetune.lora_rank": 16,
                "finetune.lora_targets": ALL},
        unmodelled=["LoRA on the output head"], model="gemma3-1b"),
    "litgpt_finetune_tiny-llama_qlora.yaml": dict(
        values={"training.micro_batch": 8, "training.global_batch": 8,
                "finetune.lora_rank": 32},
        unmodelled=["LoRA on the output head"], model="llama3.2-1b"),
    "deepspeedexamples_compression_bert_ds_config_W1A8_Qgroup64_fp16.json": dict(
        values={"training.precision": "fp16-amp", "training.micro_batch": 32},
        unmodelled=["compression library"], model="bert-base", n=1),
    "deepspeedexamples_compression_cifar_ds_config.json": dict(
        values={"training.precision": "fp16-amp", "training.micro_batch": 32,
                "training.global_batch": 32, "strategy": "ddp", "training.optimizer": "adam"},
        unmodelled=[], model="bert-base", n=1),
    "deepspeedexamples_bing_bert_01adam_config_seq128_nccl.json": dict(  # GA 4096 / (16 x 8)
        values={"training.micro_batch": 16, "training.global_batch": 4096,
                "training.precision": "fp16-amp", "training.optimizer": "zero-one-adam",
                "strategy": "ddp"},
        unmodelled=[], warnings=["the first 12,500 steps (var_freeze_step)"],
        model="bert-base", n=8),
    "accelerate_template_multi_xpu.yaml": dict(  # Intel XPUs
        values={"hardware.n": 2}, unmodelled=["multi_xpu"], model="llama3.2-1b"),
    # ---- the fourth fresh set (the last one drawn; 2 of its 22 files were wrongly refused
    # before the fused-projection names and LLaMA-Factory's QOFT were read)
    "axolotl_archived_code-llama_13b_lora.yml": dict(
        values={"training.seq": 4096, "training.micro_batch": 2, "training.grad_accum": 4,
                "finetune.quantize_base": "int8", "finetune.lora_rank": 32,
                "finetune.lora_targets": ALL},
        unmodelled=[], model="llama2-13b", n=1),
    "axolotl_archived_replit-3b_config-lora.yml": dict(  # MPT's fused Wqkv, mlp_up, mlp_down
        values={"finetune.lora_rank": 8, "finetune.lora_targets": ("q", "k", "v", "up", "down"),
                "training.micro_batch": 1, "training.grad_accum": 8,  # batch_size 8
                "checkpointing": "none", "training.optimizer_impl": "fused"},  # defaults
        unmodelled=[], warnings=["fused projections"], model="llama3.2-3b", n=1),
    "axolotl_jamba_qlora_deepspeed.yaml": dict(  # its deepspeed_configs/ is the repo's root
        values={"training.seq": 4096, "finetune.lora_rank": 8, "finetune.quantize_base": "nf4"},
        unmodelled=[], warnings=["not found"], model="llama3-8b", n=8),
    "axolotl_llama-2_lora.yml": dict(
        values={"training.seq": 4096, "training.micro_batch": 2,
                "finetune.quantize_base": "int8"}, unmodelled=[], model="llama2-7b", n=1),
    "axolotl_mistral_qlora.yml": dict(
        values={"model.preset": "mistral-7b", "training.seq": 8192, "training.micro_batch": 2,
                "finetune.quantize_base": "nf4", "finetune.lora_targets": ALL},
        unmodelled=[], n=1),
    "llamafactory_fsdp2_kt_int8.yaml": dict(
        values={"hardware.n": 4, "training.fsdp_version": 2, "strategy": "full_shard"},
        unmodelled=[], model="llama3-8b"),
    "llamafactory_extras_qoft_llama3_oft_sft_bnb_npu.yaml": dict(
        values={"model.preset": "llama3-8b"}, unmodelled=["oft", "under OFT"], n=1),
    "llamafactory_extras_fp8_llama3_fp8_deepspeed_sft.yaml": dict(
        values={"model.preset": "llama3-8b", "training.micro_batch": 1,
                "training.grad_accum": 8, "training.seq": 1024,
                "training.float8": "tensorwise"}, n=8),  # fp8_backend torchao
    "torchtune_qwen2_5_0.5B_lora.yaml": dict(
        values={"finetune.lora_rank": 32, "training.micro_batch": 2, "training.grad_accum": 8,
                "checkpointing": "none", "strategy": "full_shard"},
        unmodelled=[], model="llama3.2-1b", n=2),
    "torchtune_qwen2_7B_lora.yaml": dict(
        values={"finetune.lora_rank": 8, "checkpointing": "none"}, unmodelled=[],
        model="qwen2.5-7b", n=2),
    "torchtune_gemma_2B_lora_single_device.yaml": dict(
        values={"finetune.lora_rank": 64, "training.micro_batch": 4, "training.grad_accum": 8,
                "hardware.n": 1, "checkpointing": "full"}, unmodelled=[], model="gemma3-1b"),
    "open-r1_accelerate_zero2.yaml": dict(values={"hardware.n": 8, "strategy": "zero2"},
                                          unmodelled=[], model="llama3-8b"),
    "open-r1_Qwen2.5-Coder-7B-Instruct_grpo_config_codeforces.yaml": dict(  # beta 0.0: no ref
        values={"training.micro_batch": 4, "training.grad_accum": 32, "training.seq": 10192},
        unmodelled=["generation during training", "vLLM generation", "vLLM device",
                    "GPU memory vLLM takes"], model="qwen2.5-7b", n=8),
    "alignment-handbook_pref_align_scan_dpo_config_zephyr.yaml": dict(
        values={"training.micro_batch": 8, "training.grad_accum": 2,
                "training.seq": 1024,  # DPOConfig.max_length default
                "training.optimizer_impl": "foreach"},
        unmodelled=["chosen + rejected", "reference model"], model="mistral-7b", n=8),
    "alignment-handbook_starchat2-15b_sft_config_v0.1.yaml": dict(
        values={"training.micro_batch": 8, "training.grad_accum": 2, "training.seq": 2048},
        unmodelled=[], model="llama3-8b", n=8),
    "litgpt_finetune_gemma-7b_lora.yaml": dict(
        values={"finetune.lora_rank": 16, "finetune.lora_targets": ALL},
        unmodelled=["LoRA on the output head"], model="gemma2-9b"),
    "litgpt_finetune_falcon-7b_lora.yaml": dict(
        values={"model.preset": "falcon-7b", "finetune.lora_rank": 32,
                "finetune.lora_targets": ("q", "v")}, unmodelled=[]),
    "deepspeedexamples_compression_gpt2_ds_config_W8A8_Qgroup64_fp32.json": dict(
        values={"training.micro_batch": 4, "training.global_batch": 8,
                "training.precision": "fp32"},
        unmodelled=["compression library"], model="gpt2", n=2),
    "deepspeedexamples_inference_sglang_ds_offload_nvme_aio.json": dict(  # ZeRO-Inference
        values={"strategy": "zero3", "training.global_batch": 1},
        unmodelled=["offload params", "buffer size"],
        refused='stage3_max_live_parameters): "auto" is filled in',  # DeepSpeed's int field
        model="llama3-8b", n=1),
    "deepspeedexamples_tensor_parallel_hf_integration_ds_config.json": dict(
        values={"strategy": "zero2", "training.optimizer": "adamw"},
        unmodelled=["autotp_size 4"], warnings=['bf16.enabled is "auto"'],
        model="llama3-8b", n=8),
    "kubeflow_trainer_02-runtime-patches.yaml": dict(  # no GPU limits: the count is the flag's
        values={}, unmodelled=[], model="llama3-8b", n=8),
    # ---- a TrainingArguments dump (transformers ~4.44: evaluation_strategy beside
    # eval_strategy): only TrainingArguments' keys, so the trainer format, not TRL's defaults
    "hf_training_args_marketguardians.json": dict(
        values={"training.micro_batch": 16, "training.grad_accum": 2,
                "training.precision": "fp16-amp",  # fp16 true, bf16 false
                "training.optimizer": "adamw", "training.optimizer_impl": "foreach",
                "checkpointing": "none", "strategy": "ddp"},  # fsdp [] and deepspeed null
        unmodelled=[], n=1),
}


def outcome(name: str, exp: dict) -> tuple[str, str]:
    """(class, detail): read right | misread | wrongly refused | refused clearly | crashed."""
    from planner.gate import gate_job

    try:
        j = read_job(str(DATA / name))
    except JobError as exc:
        return ("refused clearly" if exp.get("refused") and exp["refused"] in str(exc)
                else "wrongly refused"), str(exc)
    except Exception as exc:  # that is what this measures
        return "crashed", f"{type(exc).__name__}: {exc}"
    for path, want in exp.get("values", {}).items():
        if j.values.get(path) != want:
            return "misread", f"{path}: {j.values.get(path)!r}, not {want!r}"
    expected = exp.get("unmodelled", [])
    missing = [u for u in expected if not any(u in line for line in j.unmodelled)]
    if missing:
        return "misread", f"not named: {missing}"
    extra = [line for line in j.unmodelled if not any(u in line for u in expected)]
    if extra or len(j.unmodelled) != len(expected):
        return "wrongly refused", f"named beyond the file's meaning: {extra or j.unmodelled}"
    for needle in exp.get("warnings", []):
        if not any(needle in w for w in j.warnings):
            return "misread", f"no warning {needle!r}"
    overrides = {"hardware.gpu": "h100-80"}
    if exp.get("n") is not None:
        overrides["hardware.n"] = exp["n"]
    if exp.get("model"):
        overrides["model.preset"] = exp["model"]
    elif "model.preset" not in j.values:
        overrides["model.preset"] = "llama3-8b"
    try:
        verdict = gate_job(j, overrides)
    except JobError as exc:
        return ("refused clearly" if exp.get("refused") and exp["refused"] in str(exc)
                else "wrongly refused"), f"gate: {exc}"
    except Exception as exc:  # that too
        return "crashed", f"gate: {type(exc).__name__}: {exc}"
    if expected:
        ok = verdict["verdict"] == "reject" and len(verdict.get("unmodelled", [])) == len(
            expected)
        return ("refused clearly" if ok else "misread"), verdict["reason"][:200]
    if verdict.get("unmodelled"):
        return "wrongly refused", verdict["reason"][:200]
    return "read right", verdict["verdict"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_file_reads_as_it_means(name):
    got, detail = outcome(name, CASES[name])
    want = "refused clearly" if CASES[name].get("unmodelled") or CASES[name].get("refused") \
        else "read right"
    assert got == want, detail


def test_corpus_size_per_format():
    from planner.jobs import JobFormat

    formats: dict[str, int] = {}
    for path in DATA.rglob("*"):
        if path.suffix not in (".json", ".yaml", ".yml", ".toml", ".py") or \
                "schemas" in path.parts or "models" in path.parts:
            continue
        text = path.read_text()
        if path.suffix == ".py":
            formats["torchtitan"] = formats.get("torchtitan", 0) + 1
            continue
        try:
            fmt = read_job(str(path)).format
        except JobError:
            continue
        formats[str(fmt)] = formats.get(str(fmt), 0) + 1
        assert text  # every file is data, never generated
    assert sum(formats.values()) >= 100, formats
    for fmt in ("torchtitan", "deepspeed", "accelerate", "trl", "llamafactory", "axolotl",
                "litgpt", "torchtune", "kubeflow"):
        assert formats.get(fmt, 0) >= 4, (fmt, formats)
    assert formats.get(str(JobFormat.TRAINER), 0) >= 1, formats  # TrainingArguments dumps


# ---------------------------------------------------------------------------------------------
# Write-back never crashes on a file fitcheck can read


def corpus_files() -> list[str]:
    names = []
    for path in sorted(DATA.rglob("*")):
        rel = str(path.relative_to(DATA))
        if path.suffix in (".json", ".yaml", ".yml", ".toml") and not rel.startswith(
                ("schemas", "models")):
            names.append(rel)
    return names


WRITE_BACK_SAMPLE = 4
"""Every 4th corpus file (by name, so every upstream's) runs in the unit tier; the rest are
``slow`` (~0.03 s each, 212 files; CI runs them all)."""


@pytest.mark.parametrize("name", [
    name if i % WRITE_BACK_SAMPLE == 0 else pytest.param(name, marks=pytest.mark.slow)
    for i, name in enumerate(corpus_files())])
def test_write_back_never_crashes(tmp_path, name):
    """--write-job / --job-diff on every file: a rewrite, 'nothing fits', or a one-line
    refusal of what the format cannot say; never an internal error, never a file that reads
    back as something else."""
    from planner.errors import FitcheckError
    from planner.fields import FLAGS
    from planner.jobs import build
    from planner.jobs.write import rewrite

    src = DATA / name
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    text = src.read_text(errors="replace")
    for sibling in src.parent.iterdir():  # the files it names, as upstream places them
        # (by name: every corpus file reads the same as with the whole folder beside it, and
        # copying ~200 files per case took half of this test's time)
        if sibling.is_file() and sibling != src and sibling.name in text:
            shutil.copy(sibling, tmp_path / sibling.name)
    try:
        job = read_job(str(dst))
    except JobError:
        return  # refused at reading: the corpus tests say why
    exp = CASES.get(name, {})
    given = {"hardware.gpu": "h100-80", "hardware.n": exp.get("n") or
             (None if job.values.get("hardware.n") else 8)}
    if exp.get("model") or "model.preset" not in job.values:
        given["model.preset"] = exp.get("model") or "llama3-8b"
    from planner.errors import UsageError

    try:
        request, resolved = build(job, given, FLAGS.name, UsageError)
        rw, _ = rewrite(job, request, fixed=resolved.given, given=given)
    except FitcheckError as exc:
        assert "reads back as" not in str(exc), str(exc)
        assert "\n" not in str(exc)
        return
    if rw is not None:
        back = read_job(str(dst), job.format, text=rw.text)
        assert back.format is job.format
