"""The misreads, wrong refusals and crashes issue 21 names, one test each, on real files (or a
one-key edit of one): what the framework does is read off its source (the table's version)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line_error, run

from planner.jobs import JobError, read_job, read_jobs, resolve

DATA = Path(__file__).parent / "data" / "jobs"


def edited(tmp_path, name: str, old: str | None, new: str) -> str:
    text = (DATA / name).read_text()
    if old is None:
        text = text + new
    else:
        assert old in text, old
        text = text.replace(old, new, 1)
    out = tmp_path / Path(name).name
    out.write_text(text)
    return str(out)


def write(tmp_path, name: str, doc) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if name.endswith(".json") else doc)
    return str(p)


# ---- DeepSpeed ----------------------------------------------------------------------------

def test_deepspeed_train_batch_size_alone_derives_the_micro_batch(tmp_path):
    # runtime/config.py _set_batch_related_parameters: micro = train_batch / (GA x world)
    path = write(tmp_path, "ds.json", {"train_batch_size": 256, "gradient_accumulation_steps": 4,
                                       "zero_optimization": {"stage": 2}})
    j = read_job(path)
    assert "training.micro_batch" not in j.values  # known once the GPU count is
    v = resolve(j, {"hardware.n": 8}).values
    assert v["training.micro_batch"] == 8 and v["training.grad_accum"] == 4
    with pytest.raises(JobError, match=r"256 / \(4 x 6\) is not a whole number"):
        resolve(j, {"hardware.n": 6})
    # train_batch_size and the micro-batch: the accumulation is derived
    path = write(tmp_path, "ds2.json", {"train_batch_size": 64, "train_micro_batch_size_per_gpu":
                                        2, "zero_optimization": {"stage": 1}})
    v = resolve(read_job(path), {"hardware.n": 8}).values
    assert v["training.grad_accum"] == 4


def test_deepspeed_bf16_master_weights_and_states_are_read(tmp_path):
    # modelled since issue 24 (planner/memory/zero.py master_bytes): fields, not NOT MODELLED
    path = edited(tmp_path, "axolotl_deepspeed_zero3_bf16.json", '"enabled": true',
                  '"enabled": true, "bf16_master_weights_and_grads": true, '
                  '"bf16_optimizer_states": true')
    j = read_job(path)
    assert not any("bf16_master" in u or "bf16_optimizer" in u for u in j.unmodelled)
    assert j.values["deepspeed.bf16_master_weights_and_grads"] is True
    assert j.values["deepspeed.bf16_optimizer_states"] is True


def test_deepspeed_comment_and_unknown_top_level_keys_are_not_refusals(tmp_path):
    path = edited(tmp_path, "accelerate_ds_zero_stage2_config.json", "{",
                  '{"_comment": "tuned", "comms_config": {"verbose": false},')
    j = read_job(path)
    assert j.unmodelled == []
    assert any("comms_config is not a key of DeepSpeed 0.19.8, which ignores it" in w
               for w in j.warnings)


def test_accelerates_own_zero3_config_with_autos_is_read(tmp_path):
    j = read_job(str(DATA / "accelerate_tests_ds_config_zero3.json"))
    assert j.unmodelled == [] and j.values["strategy"] == "zero3"
    assert any("zero3_save_16bit_model" in w for w in j.warnings)


# ---- accelerate, TRL defaults -------------------------------------------------------------

def test_accelerate_without_mixed_precision_is_fp32_and_says_so():
    j = read_job(str(DATA / "accelerate_template_multi_node.yaml"))
    assert j.values["training.precision"] == "fp32"
    assert any('launches with "no" (fp32)' in w for w in j.warnings)
    # the recipe beside it decides when it sets bf16
    j = read_jobs([str(DATA / "accelerate_template_multi_node.yaml"),
                   str(DATA / "trl_cli_example_config.yaml")])
    assert j.values["training.precision"] == "bf16-amp"  # TRL: bf16 unless fp16


def test_accelerate_distributed_type_no_is_one_process(tmp_path):
    # trl/accelerate_configs/single_gpu.yaml (TRL f2cd5771) says num_processes 8; launch.py
    # takes the simple launcher for distributed_type NO: one process
    path = write(tmp_path, "single_gpu.yaml", 'distributed_type: "NO"\nmixed_precision: bf16\n'
                 "num_machines: 1\nnum_processes: 8\nuse_cpu: false\n")
    j = read_job(path)
    assert j.values["hardware.n"] == 1 and j.values["strategy"] == "ddp"
    assert any("num_processes 8 is not used" in w for w in j.warnings), j.warnings


def test_trl_sft_defaults_are_applied_and_named():
    j = read_job(str(DATA / "trl_cli_example_config.yaml"))
    assert j.values["checkpointing"] == "full" and j.values["training.seq"] == 1024
    line = next(w for w in j.warnings if "TRL 1.16.0 defaults" in w)
    for needle in ("gradient_checkpointing true", "max_length 1024", "bf16 true (not fp16)",
                   "per_device_train_batch_size 8"):
        assert needle in line


def test_a_16bit_model_under_plain_ddp_trains_pure_bf16_but_not_under_fsdp():
    recipe = str(DATA / "alignment-handbook_zephyr-7b-gemma_sft_config_full.yaml")  # bfloat16
    model = {"model.preset": "gemma2-9b"}
    v = resolve(read_job(recipe), model).values
    assert v["training.precision"] == "bf16"  # no fsdp/deepspeed: DDP over bf16 weights
    job = read_jobs([str(DATA / "alignment-handbook_accelerate_fsdp.yaml"), recipe])
    assert resolve(job, model).values["training.precision"] == "bf16-amp"  # accelerate upcasts


# ---- axolotl ------------------------------------------------------------------------------

def test_axolotl_checkpointing_with_activation_offloading_is_no_conflict():
    # issue 26: activation_offloading true is modelled (training.activation_offload)
    j = read_job(str(DATA / "axolotl_gpt-oss_gpt-oss-20b-fft-fsdp2-offload.yaml"))
    assert j.values["checkpointing"] == "full"
    assert j.values["training.activation_offload"] is True
    assert not any("activation offloading" in u for u in j.unmodelled)


def test_axolotl_hsdp_tp_is_16_gpus_not_fsdp_on_8():
    j = read_job(str(DATA / "axolotl_distributed-parallel_llama-3_1-8b-hsdp-tp.yaml"))
    assert (j.values["strategy"], j.values["parallel.tp"], j.values["hardware.n"]) == (
        "hybrid_shard", 2, 16)


def test_axolotl_unknown_key_is_a_warning_trl_unknown_key_is_named(tmp_path):
    j = read_job(edited(tmp_path, "axolotl_llama-3_fft-8b.yaml", None, "\nmystery_knob: 3\n"))
    assert j.unmodelled == [] and any("mystery_knob" in w for w in j.warnings)
    j = read_job(edited(tmp_path, "trl_cli_example_config.yaml", None, "\nmystery_knob: 3\n"))
    assert any("mystery_knob: 3 is not a key of TRL 1.16.0" in u for u in j.unmodelled)


def test_lora_dropout_is_read_in_every_reader():
    for name, want in (("alignment-handbook_zephyr-7b-beta_sft_config_qlora.yaml", True),
                       ("axolotl_llama-3_lora-8b.yml", True),
                       ("litgpt_finetune_llama-3.1-8b_lora.yaml", True),
                       ("torchtune_llama3_1_8B_lora.yaml", False),
                       ("llamafactory_qwen3_lora_sft.yaml", False)):
        assert read_job(str(DATA / name)).values["finetune.lora_dropout"] is want, name


# ---- LLaMA-Factory ------------------------------------------------------------------------

def test_llamafactory_full_dpo_has_a_reference_model_lora_dpo_reuses_the_base(tmp_path):
    lora = read_job(str(DATA / "llamafactory_qwen3_lora_dpo.yaml"))
    assert not any("reference model" in u for u in lora.unmodelled)
    full = read_job(edited(tmp_path, "llamafactory_qwen3_lora_dpo.yaml",
                           "finetuning_type: lora", "finetuning_type: full"))
    assert any("reference model" in u for u in full.unmodelled)
    assert any("chosen + rejected" in u for u in full.unmodelled)


def test_llamafactory_v1_dist_config_and_fp8_are_read(tmp_path):
    j = read_job(str(DATA / "llamafactory_v1_train_full_qwen3_moe_fsdpturbo_ep_fsdp.yaml"))
    assert any("expert parallel degree 16" in u for u in j.unmodelled)
    j = read_job(str(DATA / "llamafactory_extras_fp8_llama3_fp8_fsdp_sft.yaml"))
    # fp8_backend torchao, fp8_enable_fsdp_float8_all_gather: torchao float8, modelled
    assert j.values["training.float8"] == "tensorwise"
    assert j.values["training.float8_all_gather"] is True


def test_llamafactory_write_back_does_not_crash(tmp_path):
    path = edited(tmp_path, "llamafactory_qwen3_lora_sft.yaml", "model_name_or_path:",
                  "disable_gradient_checkpointing: true\nmodel_name_or_path:")
    r = run("--job", path, "--gpu", "h100-80", "--model", "qwen2.5-7b", "--n", "1",
            "--job-diff")
    assert r.exit_code in (0, 3), r.stderr
    assert "internal error" not in r.stderr


def test_deepspeed_json_with_a_trailing_comma_is_refused(tmp_path):
    # DeepSpeed reads its config with json.load: YAML's leniency is not the framework's
    path = write(tmp_path, "ds.json", "")
    Path(path).write_text('{"train_micro_batch_size_per_gpu": 2,\n "zero_optimization": '
                          '{"stage": 2,},\n}')
    with pytest.raises(JobError, match="not valid JSON \\(line 2"):
        read_job(path)


def test_fused_projection_names_are_read_as_their_parts(tmp_path):
    # axolotl examples/archived/replit-3b: Replit's (MPT's) fused Wqkv and mlp_up / mlp_down
    path = edited(tmp_path, "axolotl_llama-3_lora-8b.yml", "lora_target_linear: true",
                  "lora_target_modules:\n  - Wqkv\n  - mlp_up\n  - mlp_down")
    j = read_job(path)
    assert j.values["finetune.lora_targets"] == ("q", "k", "v", "up", "down")
    assert any("fused projections read as their parts" in w for w in j.warnings)


def test_llamafactory_quantization_outside_lora_and_oft(tmp_path):
    # hparams/parser.py: quantization only under LoRA or OFT; QOFT is not modelled
    qoft = edited(tmp_path, "llamafactory_extras_qoft_llama3_oft_sft_awq.yaml",
                  "finetuning_type: oft", "finetuning_type: oft\nquantization_bit: 4")
    j = read_job(qoft)
    assert any("4-bit base under OFT" in u for u in j.unmodelled), j.unmodelled
    full = edited(tmp_path, "llamafactory_extras_qoft_llama3_oft_sft_awq.yaml",
                  "finetuning_type: oft", "finetuning_type: full\nquantization_bit: 4")
    with pytest.raises(JobError, match="quantization_bit: 4 with finetuning_type full"):
        read_job(full)


def test_llamafactory_without_do_train_trains_nothing(tmp_path):
    # train/sft/workflow.py trains only under do_train; an export config has export_dir instead
    path = write(tmp_path, "qwen3_gptq.yaml", "model_name_or_path: Qwen/Qwen3-4B-Instruct-2507\n"
                 "template: qwen3_nothink\nexport_dir: saves/qwen3_gptq\n"
                 "export_quantization_bit: 4\n")
    with pytest.raises(JobError, match="do_train: not set: LLaMA-Factory trains nothing.*"
                       "export_dir"):
        read_job(path, fmt="llamafactory")


def test_a_target_modules_regex_is_matched_like_peft(tmp_path):
    # peft: a single string is full-matched against each module name (here a VLM's text tower)
    path = edited(tmp_path, "axolotl_llama-3_lora-8b.yml", "lora_target_linear: true",
                  "lora_target_modules: 'model.text_model.layers.[\\d]+.(mlp|self_attn)."
                  "(gate|q|v)_proj'")
    assert read_job(path).values["finetune.lora_targets"] == ("q", "v", "gate")
    # axolotl examples/ebft: attention on every fourth layer, the MLP on all of them
    some = edited(tmp_path, "axolotl_llama-3_lora-8b.yml", "lora_target_linear: true",
                  "lora_target_modules: '.*\\.layers\\.(3|7|11)\\.self_attn\\.(q|v)_proj|"
                  ".*\\.mlp\\.(gate|up|down)_proj'")
    j = read_job(some)
    assert j.values["finetune.lora_targets"] == ("q", "v", "gate", "up", "down")
    assert any("matches q,v on some layers only" in w for w in j.warnings), j.warnings
    bad = edited(tmp_path, "axolotl_llama-3_lora-8b.yml", "lora_target_linear: true",
                 "lora_target_modules: '.*vision.*'")
    with pytest.raises(JobError, match="lora_target_modules: the regular expression"):
        read_job(bad)


# ---- torchtune, torchtitan, litgpt --------------------------------------------------------

def test_torchtune_is_never_read_as_a_gate_spec():
    from planner.jobs.readers import spec

    doc = {"model": {"_component_": "torchtune.models.llama3_1.llama3_1_8b"},
           "checkpointer": {"_component_": "torchtune.training.FullModelHFCheckpointer"},
           "batch_size": 2}
    assert spec.detect(doc) == 0
    assert read_job(str(DATA / "torchtune_llama3_1_8B_full.yaml")).format == "torchtune"
    r = run("gate", str(DATA / "torchtune_llama3_1_8B_full.yaml"), "--gpu", "h100-80", "--n",
            "8")
    assert r.exit_code in (0, 3) and "checkpointing" not in r.stderr, r.stderr


def test_a_torchtune_evaluation_config_is_not_a_training_job(tmp_path):
    # recipes/configs/eleuther_evaluation.yaml (bd2a0fc7), trimmed: no optimizer, no loss
    path = write(tmp_path, "eleuther_evaluation.yaml",
                 "model:\n  _component_: torchtune.models.llama2.llama2_7b\n"
                 "checkpointer:\n  _component_: torchtune.training.FullModelHFCheckpointer\n"
                 "dtype: bf16\ntasks: [\"truthfulqa_mc2\"]\nbatch_size: 8\n"
                 "enable_kv_cache: True\n")
    with pytest.raises(JobError, match="optimizer: not set: this is a torchtune evaluation"):
        read_job(path, fmt="torchtune")


@pytest.mark.parametrize("components, want", [
    ('["loss"]', "torch.compile loss only"), ('["model"]', "blocks"), (None, "blocks+loss")])
def test_torchtitan_compile_components(tmp_path, components, want):
    name = "torchtitan_llama3_8b.v0.2.0.toml"
    text = (DATA / name).read_text().replace("[compile]\nenable=false", "[compile]\nenable=true")
    line = 'components = ["model", "loss"]\n'
    text = text.replace(line, f"components = {components}\n" if components else "")
    path = tmp_path / name
    path.write_text(text)
    j = read_job(str(path))
    if components == '["loss"]':  # the loss compiled, the blocks eager: no fitcheck mode
        assert any(want in u for u in j.unmodelled), j.unmodelled
    else:  # model alone: each block; none: torchtitan's default, model and loss
        assert j.values["training.compile"] == want


def test_litgpt_lora_head_is_named_not_an_error():
    j = read_job(str(DATA / "litgpt_finetune_phi-2_lora.yaml"))
    assert any("LoRA on the output head" in u for u in j.unmodelled)
    r = run("--job", str(DATA / "litgpt_finetune_phi-2_lora.yaml"), "--gpu", "h100-80")
    assert r.exit_code in (0, 3), r.stderr


def test_a_registry_with_several_configs_asks_for_a_name():
    path = DATA / "layouts/torchtitan/torchtitan/models/llama3/config_registry.py"
    with pytest.raises(JobError, match="name one as .*:NAME .*llama3_8b"):
        read_job(str(path))
    with pytest.raises(JobError, match="no config 'llama9'"):
        read_job(f"{path}:llama9")


def test_a_spec_names_a_registry_function(tmp_path):
    reg = DATA / "layouts/torchtitan/torchtitan/models/llama3/config_registry.py"
    spec = tmp_path / "job.yaml"
    spec.write_text(f"job: {{path: {reg}, config: llama3_70b}}\nhardware: {{gpu: h100-80, "
                    "n: 64}\n")
    r = run("gate", str(spec))
    v = json.loads(r.stdout)
    assert r.exit_code in (0, 3) and v["verdict"] in ("admit", "reject"), r.stderr
    j = read_job(str(spec))
    assert j.values["parallel.tp"] == 8 and j.values["model.preset"] == "llama3-70b"


def test_registry_constructs_outside_the_subset_are_refused(tmp_path):
    path = tmp_path / "config_registry.py"
    path.write_text("def a():\n    for i in range(2):\n        pass\n    return Trainer.Config()\n")
    with pytest.raises(JobError, match=r"a: line 2: for statements are not read"):
        read_job(str(path))
    one_line_error(run("--job", str(path), "--gpu", "h100-80"), 4, "for statements")


def test_the_gate_reads_a_torchtune_recipe_as_a_job_not_as_a_misspelt_spec():
    """`fitcheck gate recipe.yaml` with no flags: torchtune's model: and its top-level keys
    once made it a fitcheck spec with a misspelt key ("did you mean 'checkpointer' ->
    'checkpointing'?"); its _component_ entries say it is a torchtune recipe, which then
    asks for the model it names."""
    from planner.gate import gate_path
    from planner.jobs.record import JobError as RecordJobError

    path = Path(__file__).parent / "data" / "jobs" / "torchtune_gemma_2B_lora.yaml"
    with pytest.raises((JobError, RecordJobError)) as err:
        gate_path(str(path))
    message = str(err.value)
    assert "did you mean" not in message
    assert "model._component_ 'torchtune.models.gemma.lora_gemma_2b'" in message


REGISTRY = (Path(__file__).parent / "data" / "jobs" / "layouts" / "torchtitan" / "torchtitan"
            / "models" / "llama3" / "config_registry.py")


def test_a_registry_entry_is_a_job_on_the_command_line_and_for_the_gate():
    # torchtitan's llama3_8b recipe: seq 8192, local batch 1 (config_registry.py)
    r = run("--job", f"{REGISTRY}:llama3_8b", "--gpu", "h100-80", "--n", "8", "--json")
    assert r.exit_code == 0, r.stderr  # 8B with selective AC fits 8 x 80 GB (torchtitan's own)
    doc = json.loads(r.stdout)
    assert doc["inputs"]["model"]["name"] == "llama3-8b"
    assert (doc["inputs"]["training"]["seq"], doc["inputs"]["training"]["micro_batch"]) == (
        8192, 1)
    # the recipe's FSDP with selective (op) activation checkpointing, as the registry says
    assert (doc["inputs"]["strategies"], doc["inputs"]["checkpointing"]) == (
        ["full_shard"], "selective")
    one_line_error(run("gate", f"{REGISTRY}:no_such_config", "--gpu", "h100-80", "--n", "8"),
                   4, "no_such_config")


def test_a_fifo_or_a_directory_is_refused_not_read(tmp_path):
    import os

    fifo = tmp_path / "job.fifo"
    os.mkfifo(fifo)
    for args in (("--job", str(fifo), "--gpu", "h100-80"),
                 ("--deepspeed-config", str(fifo), "--gpu", "h100-80"),
                 ("gate", str(fifo)), ("--job", str(tmp_path), "--gpu", "h100-80")):
        one_line_error(run(*args), 2, "not a regular file")
