"""Job configs read where they live (planner/jobs, docs/jobs.md): every reader on real public
files (tests/data/jobs/SOURCES.md), autodetection, flags over job values, the unmodelled rule,
the gate's reject, writing the recommendation back, hub-style model ids."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import one_line_error, run

from planner.jobs import (
    FORMATS,
    JobError,
    JobFormat,
    read_job,
    read_jobs,
    split_modelled,
)
from planner.presets import resolve_name

DATA = Path(__file__).parent / "data" / "jobs"
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted(p.name for p in DATA.iterdir() if p.suffix in (".json", ".yaml", ".yml",
                                                                 ".toml"))

FORMAT_OF = {  # by the file's source (SOURCES.md), not by what the reader says
    "torchtitan_": JobFormat.TORCHTITAN, "accelerate_ds_": JobFormat.DEEPSPEED,
    "axolotl_deepspeed_": JobFormat.DEEPSPEED, "deepspeedexamples_": JobFormat.DEEPSPEED,
    "transformers_tests_ds_": JobFormat.DEEPSPEED, "llamafactory_ds_": JobFormat.DEEPSPEED,
    "accelerate_": JobFormat.ACCELERATE, "trl_accelerate_": JobFormat.ACCELERATE,
    "alignment-handbook_accelerate_": JobFormat.ACCELERATE,
    "llamafactory_fsdp": JobFormat.ACCELERATE, "peft_sft_": JobFormat.ACCELERATE,
    "alignment-handbook_zephyr": JobFormat.TRL, "alignment-handbook_smollm3": JobFormat.TRL,
    "alignment-handbook_smollm": JobFormat.TRL, "alignment-handbook_constitutional": JobFormat.TRL,
    "alignment-handbook_pref": JobFormat.TRL, "alignment-handbook_starchat": JobFormat.TRL,
    "llamafactory_qwen3": JobFormat.LLAMAFACTORY, "llamafactory_extras": JobFormat.LLAMAFACTORY,
    "llamafactory_v1": JobFormat.LLAMAFACTORY, "llamafactory_fsdp_config": JobFormat.ACCELERATE,
    "hf_training_args": JobFormat.TRL, "hf_training_args_marketguardians": JobFormat.TRAINER,
    "axolotl_": JobFormat.AXOLOTL,
    "litgpt_": JobFormat.LITGPT, "kubeflow_": JobFormat.KUBEFLOW,
    "accelerate_tests_ds_config": JobFormat.DEEPSPEED, "open-r1_accelerate": JobFormat.ACCELERATE,
    "open-r1_": JobFormat.TRL, "trl_cli_": JobFormat.TRL, "torchtune_": JobFormat.TORCHTUNE,
}


def expected_format(name: str) -> JobFormat:
    return FORMAT_OF[max((p for p in FORMAT_OF if name.startswith(p)), key=len)]


def job(name: str, **kw):
    return read_job(str(DATA / name), **kw)


# ---------------------------------------------------------------------------------------------
# Every real file: read, detected as what it is

def test_every_fixture_is_listed_with_its_source():
    sources = (DATA / "SOURCES.md").read_text()
    assert len(FIXTURES) == 206
    for name in FIXTURES:
        assert f"`{name}`" in sources, name
        if not name.endswith(".json"):
            assert (DATA / name).read_text().startswith("# fitcheck test fixture"), name


@pytest.mark.parametrize("name", FIXTURES)
def test_every_real_file_is_read_and_detected(name):
    j = job(name)
    assert j.format is expected_format(name)
    assert all("\n" not in w for w in j.warnings + j.unmodelled)
    # what passes is in the registry's vocabulary; the rest is said, not dropped
    from planner.fields import BY_PATH
    from planner.jobs.record import HfAttention, ModelDtype, Share, Unmodelled

    assert set(j.values) <= set(BY_PATH)
    said = {p for p, v in j.raw.items() if isinstance(v, Unmodelled) and v.line in j.unmodelled}
    # resolved or checked once every file of the job is in (record.resolve)
    derived = {p for p, v in j.raw.items() if isinstance(v, (Share, ModelDtype, HfAttention))}
    assert set(j.raw) - set(j.values) - said - derived <= {
        p for p in j.raw if any(p in u for u in j.unmodelled)}


# Expected values read off the files by hand (the comment says where).
EXPECTED = {
    "torchtitan_llama3_8b.2025-02.toml": dict(  # [training] batch_size = 1, mode = 'selective'
        values={"model.preset": "llama3-8b", "training.micro_batch": 1, "training.seq": 8192,
                "strategy": "full_shard", "checkpointing": "selective", "offload": "none",
                "training.precision": "bf16-amp", "training.fsdp_version": 2},
        layout="2025-02", unmodelled=[]),
    "torchtitan_llama3_8b.v0.1.0.toml": dict(  # [training] local_batch_size = 1, [parallelism]
        values={"training.micro_batch": 1, "strategy": "full_shard"}, layout="v0.1",
        unmodelled=[]),
    "torchtitan_llama3_8b.v0.2.0.toml": dict(values={"checkpointing": "selective"},
                                             layout="v0.2", unmodelled=[]),
    "torchtitan_llama3_70b.2025-02.toml": dict(  # batch_size = 8, tensor_parallel_degree = 8
        values={"model.preset": "llama3-70b", "training.micro_batch": 8, "checkpointing": "full",
                "parallel.tp": 8}, unmodelled=[]),
    "torchtitan_llama3_70b.v0.2.0.toml": dict(
        values={"parallel.tp": 8}, unmodelled=[]),
    "accelerate_ds_zero_stage1_config.json": dict(  # stage 1, fp16 enabled, GA 1, micro "auto"
        values={"strategy": "zero1", "training.precision": "fp16-amp", "training.grad_accum": 1,
                "offload": "none", "deepspeed.allgather_bucket_size": 200_000_000,
                "deepspeed.overlap_comm": True, "deepspeed.reduce_bucket_size": "auto",
                # optimizer.params.torch_adam: torch.optim.AdamW, not FusedAdam (DeepSpeed
                # engine.py get_optimizer_configuration), foreach by torch's default
                "deepspeed.fused_adam": False, "training.optimizer_impl": "foreach"},
        warnings=['train_micro_batch_size_per_gpu is "auto"'],
        # the engine settings are modelled (issue 12): nothing left over
        unmodelled=[]),
    "accelerate_ds_zero_stage2_offload_config.json": dict(
        values={"strategy": "zero2", "offload": "optimizer"}),
    "accelerate_ds_zero_stage3_offload_config.json": dict(
        values={"strategy": "zero3", "offload": "params_and_optimizer",
                "deepspeed.stage3_max_live_parameters": 1_000_000_000}),
    "transformers_tests_ds_config_zero3.old.json": dict(
        values={"strategy": "zero3", "offload": "params_and_optimizer",
                "training.precision": "fp16-amp"}),
    "deepspeedexamples_autotuning_ds_config_z3.json": dict(  # only stage + micro
        values={"strategy": "zero3", "training.precision": "fp32"},
        warnings=["neither fp16 nor bf16 is enabled"], unmodelled=[]),
    "axolotl_deepspeed_zero3_bf16.json": dict(  # max_live_parameters: DeepSpeed's field name
        values={"strategy": "zero3", "training.precision": "bf16-amp",
                "deepspeed.stage3_max_live_parameters": 0, "deepspeed.sub_group_size": 0,
                "deepspeed.reduce_bucket_size": "auto", "deepspeed.fused_adam": False,
                "deepspeed.stage3_gather_16bit_weights_on_model_save": True},
        unmodelled=[]),
    "llamafactory_ds_z2_offload_config.json": dict(
        values={"strategy": "zero2", "offload": "optimizer"},
        warnings=['fp16.enabled and bf16.enabled are "auto"']),
    "accelerate_template_fsdp.yaml": dict(  # FULL_SHARD, no offload, no AC, bf16, 2 procs
        values={"strategy": "full_shard", "offload": "none", "checkpointing": "none",
                "training.precision": "bf16-amp", "hardware.n": 2, "training.init": "rank0",
                "training.fsdp_version": 1}, unmodelled=[]),
    "accelerate_tests_latest_fsdp.yaml": dict(
        values={"training.precision": "fp32", "hardware.n": 1}),
    "accelerate_tp_hsdp_fsdp2.yaml": dict(  # dp_replicate 2 x dp_shard 2 x tp 2
        values={"strategy": "hybrid_shard", "training.fsdp_version": 2, "hardware.n": 8,
                "parallel.tp": 2}, unmodelled=[]),
    "trl_accelerate_fsdp1.yaml": dict(  # fsdp_reshard_after_forward: FULL_SHARD (FSDP1 name)
        values={"strategy": "full_shard", "training.fsdp_version": 1, "hardware.n": 8,
                "hardware.gpus_per_node": 8}),
    "trl_accelerate_fsdp2.yaml": dict(  # fsdp_reshard_after_forward: true
        values={"strategy": "full_shard", "training.fsdp_version": 2}),
    "trl_accelerate_deepspeed_zero1.yaml": dict(
        values={"strategy": "zero1", "training.grad_accum": 1, "offload": "none"}),
    "trl_accelerate_deepspeed_zero3.yaml": dict(values={"strategy": "zero3"}),
    "peft_sft_fsdp_config_qlora.yaml": dict(
        values={"offload": "params_and_optimizer", "training.precision": "fp32"}),
    "llamafactory_fsdp2_config.yaml": dict(values={"strategy": "full_shard",
                                                   "training.fsdp_version": 2}),
    "alignment-handbook_zephyr-7b-beta_sft_config_full.yaml": dict(
        values={"model.preset": "mistral-7b", "training.micro_batch": 16,
                "training.grad_accum": 1, "training.seq": 2048, "checkpointing": "full",
                "training.precision": "bf16-amp", "strategy": "ddp"},
        warnings=["plain DDP"], unmodelled=[]),
    "alignment-handbook_zephyr-7b-beta_sft_config_qlora.yaml": dict(
        values={"training.micro_batch": 4, "training.grad_accum": 2, "finetune.lora_rank": 16,
                "finetune.quantize_base": "nf4",
                "finetune.lora_targets": ("q", "k", "v", "o", "gate", "up", "down")},
        unmodelled=[]),
    "alignment-handbook_zephyr-141b-A35b_orpo_config_full.yaml": dict(
        values={"training.optimizer": "adamw-8bit", "training.seq": 2048},
        unresolved="mistral-community/Mixtral-8x22B-v0.1",
        unmodelled=["chosen + rejected sequences"]),
    "hf_training_args_serialized_grpo.json": dict(  # 128 prompt + 96 completion tokens
        values={"training.micro_batch": 6, "training.grad_accum": 2, "training.seq": 224,
                "training.precision": "fp16-amp", "training.optimizer": "adamw-8bit",
                "checkpointing": "none"},
        warnings=["paged"], unmodelled=["a frozen reference model copy"]),
    "llamafactory_qwen3_full_sft.yaml": dict(
        values={"training.seq": 2048, "training.grad_accum": 2},
        unresolved="Qwen/Qwen3-4B-Instruct-2507", warnings=["not found"]),
    "llamafactory_qwen3_lora_sft_ds3.yaml": dict(values={"finetune.lora_rank": 8},
                                                 unresolved="Qwen/Qwen3-4B-Instruct-2507"),
    "axolotl_llama-3_lora-8b.yml": dict(
        values={"model.preset": "llama3-8b", "training.micro_batch": 2, "training.grad_accum": 4,
                "training.seq": 4096, "training.optimizer": "adamw-8bit", "checkpointing": "full",
                "finetune.lora_rank": 32, "finetune.quantize_base": "int8"},
        unmodelled=["modules trained in full beside LoRA embed_tokens,lm_head"]),
    "axolotl_llama-3_qlora-fsdp-70b.yaml": dict(
        values={"model.preset": "llama3-70b", "strategy": "full_shard",
                "offload": "params_and_optimizer", "training.optimizer_impl": "fused",
                "training.seq": 512, "finetune.lora_rank": 8, "finetune.quantize_base": "nf4"},
        unmodelled=[]),
    "axolotl_llama-3_fft-8b.yaml": dict(
        values={"model.preset": "llama3.1-8b", "training.seq": 8192, "training.grad_accum": 8,
                "strategy": "ddp"}, unmodelled=[]),
    "axolotl_llama-3_3b-fp8-fsdp2.yaml": dict(  # un-prefixed fsdp_config keys, fsdp_version 2
        values={"model.preset": "llama3.2-3b", "training.fsdp_version": 2,
                "strategy": "full_shard", "checkpointing": "none", "training.micro_batch": 16,
                "training.compile": "model", "training.loss": "fused",
                # torchao float8 (accelerate AORecipeKwargs: tensorwise), gathered in float8
                "training.float8": "tensorwise", "training.float8_all_gather": True}),
    "axolotl_deepseek-v2_fft-fsdp-16b.yaml": dict(  # DeepSeek-V2-Lite: a preset (issue 13)
        values={"model.preset": "deepseek-v2-lite", "strategy": "full_shard",
                "offload": "params_and_optimizer"}),
    "axolotl_mistral_bigstral_bigstral-ds-zero3.yaml": dict(
        warnings=["zero3_bf16_cpuoffload_params.json", "not found"],
        unmodelled=["frozen parameters"], unresolved="mistral-community/Mixtral-8x22B-v0.1"),
    "litgpt_finetune_llama-3.1-8b_lora.yaml": dict(  # bf16-true = pure bf16, devices 1
        values={"model.preset": "llama3.1-8b", "training.precision": "bf16", "hardware.n": 1,
                "training.micro_batch": 1, "training.global_batch": 8, "training.seq": 512,
                "strategy": "ddp", "finetune.lora_rank": 32, "finetune.lora_targets": ("q", "v")},
        unmodelled=[]),
    "litgpt_finetune_llama-3.1-8b_qlora.yaml": dict(
        values={"training.micro_batch": 2, "finetune.quantize_base": "nf4"}, unmodelled=[]),
    "litgpt_finetune_llama-3.1-8b_full.yaml": dict(  # devices 4: FSDP + Block checkpointing
        values={"hardware.n": 4, "strategy": "full_shard", "checkpointing": "full",
                "training.global_batch": 64, "training.micro_batch": 4}, unmodelled=[]),
    "litgpt_finetune_llama-2-7b_full.yaml": dict(values={"model.preset": "llama2-7b"}),
    "litgpt_pretrain_tinyllama.yaml": dict(  # bf16-mixed, devices auto
        values={"training.precision": "bf16-amp", "training.global_batch": 512,
                "training.seq": 2048, "strategy": "hybrid_shard"},
        warnings=["devices: auto", "FSDP HYBRID_SHARD"], unresolved="tiny-llama-1.1b"),
    "kubeflow_pytorchjob_deepspeed_demo.yaml": dict(
        values={"hardware.n": 2, "hardware.gpus_per_node": 1}),
    "kubeflow_pytorchjob_mnist_nccl.yaml": dict(values={"hardware.n": 2}),
    "kubeflow_pytorchjob_elastic_imagenet.yaml": dict(warnings=["elastic", "no nvidia.com/gpu"]),
    "kubeflow_trainer_v2_clustertrainingruntime_torch_distributed.yaml": dict(
        warnings=["numProcPerNode is 'auto'"]),
    "accelerate_template_deepspeed.yaml": dict(  # names ../deepspeed_config_templates/...
        values={"hardware.n": 2, "strategy": "zero1,zero2,zero3"}, warnings=["not found"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reader_values_on_real_files(name):
    exp = EXPECTED[name]
    j = job(name)
    for path, value in exp.get("values", {}).items():
        assert j.values.get(path) == value, (path, j.values.get(path), value)
    if "layout" in exp:
        assert exp["layout"] in j.layout
    for needle in exp.get("warnings", []):
        assert any(needle in w for w in j.warnings), (needle, j.warnings)
    if exp.get("unmodelled") == []:
        assert j.unmodelled == []
    for needle in exp.get("unmodelled", []):
        assert any(needle in u for u in j.unmodelled), (needle, j.unmodelled)
    if "unresolved" in exp:
        assert j.unresolved_model is not None and exp["unresolved"] in j.unresolved_model.key
        assert "model.preset" not in j.values  # never a guess
    else:
        assert j.unresolved_model is None


def test_references_resolve_in_the_upstream_layout(monkeypatch):
    # accelerate: deepspeed_config_file relative to the config's folder
    j = job("layouts/accelerate/examples/config_yaml_templates/deepspeed.yaml")
    assert j.values["strategy"] == "zero1" and j.values["training.precision"] == "fp16-amp"
    assert len(j.files) == 2
    # LLaMA-Factory: deepspeed relative to where llamafactory-cli runs (the repository root)
    monkeypatch.chdir(DATA / "layouts" / "llamafactory")
    j = read_job("examples/train_full/qwen3_full_sft.yaml")
    assert j.values["strategy"] == "zero3" and j.values["training.grad_accum"] == 2
    assert not any('"auto"' in w and "grad" in w for w in j.warnings)  # the recipe's GA


def test_repository_pytorchjob_example_carries_a_spec():
    j = read_job(str(ROOT / "integrations" / "kubernetes" / "pytorchjob-example.yaml"))
    assert j.format is JobFormat.KUBEFLOW
    assert j.values["hardware.n"] == 16 and j.values["hardware.gpus_per_node"] == 8
    assert j.values["model.preset"] == "llama3-8b" and j.values["strategy"] == "full_shard"


# ---------------------------------------------------------------------------------------------
# Formats, detection, errors

def test_format_names_match_the_cli():
    from planner.cli import JOB_FORMATS

    assert JOB_FORMATS == FORMATS


def test_format_override_and_a_wrong_one(tmp_path):
    assert job("trl_accelerate_fsdp2.yaml", fmt="accelerate").format is JobFormat.ACCELERATE
    with pytest.raises(JobError, match="--format deepspeed, but the file has none of its keys "
                       r"\(it reads as litgpt\)"):
        job("litgpt_finetune_llama-3.1-8b_full.yaml", fmt="deepspeed")
    with pytest.raises(JobError, match="--format torchtitan but the file is YAML"):
        job("trl_accelerate_fsdp2.yaml", fmt="torchtitan")
    r = run("--job", str(DATA / "litgpt_finetune_llama-3.1-8b_full.yaml"), "--format",
            "deepspeed", "--gpu", "h100-80")
    one_line_error(r, 4, "litgpt_finetune_llama-3.1-8b_full.yaml", "none of its keys")
    r = run("--job", str(DATA / "trl_accelerate_fsdp2.yaml"), "--format", "nope")
    assert r.exit_code == 2


def _edited(tmp_path, name: str, old: str, new: str) -> str:
    text = (DATA / name).read_text()
    assert old in text
    out = tmp_path / name
    out.write_text(text.replace(old, new))
    return str(out)


@pytest.mark.parametrize("name, old, new, needles", [
    ("accelerate_template_fsdp.yaml", "fsdp_sharding_strategy: FULL_SHARD",
     "fsdp_sharding_strategy: HALF_SHARD",
     ["fsdp_config.fsdp_sharding_strategy", "unknown value 'HALF_SHARD'", "FULL_SHARD"]),
    ("accelerate_ds_zero_stage1_config.json", '"stage": 1', '"stage": 4',
     ["zero_optimization.stage", "unknown value 4"]),
    ("axolotl_deepspeed_zero3_bf16.json", '"bf16": {\n    "enabled": true',
     '"fp16": {"enabled": true}, "bf16": {\n    "enabled": true',
     ["fp16.enabled", "both true"]),
    ("torchtitan_llama3_8b.v0.2.0.toml", "local_batch_size = 1", "local_batch_size = 0",
     ["[training] local_batch_size", "positive integer"]),
    ("torchtitan_llama3_8b.v0.2.0.toml", 'mode = "selective"', 'mode = "some"',
     ["[activation_checkpoint] mode", "unknown value 'some'"]),
    ("litgpt_finetune_llama-3.1-8b_qlora.yaml", "devices: 1", "devices: 2",
     ["quantize", "more than one device"]),
    ("axolotl_llama-3_fft-8b.yaml", "micro_batch_size: 1", "micro_batch_size: lots",
     ["micro_batch_size", "'lots'"]),
])
def test_unknown_and_conflicting_values_are_one_line_exit_4(tmp_path, name, old, new, needles):
    path = _edited(tmp_path, name, old, new)
    r = run("--job", path, "--gpu", "h100-80", "--model", "llama3-8b")
    one_line_error(r, 4, name, *needles)


def test_two_files_of_one_job_must_agree():
    with pytest.raises(JobError, match=r"conflicting hardware.n: .*trl_accelerate_fsdp1.yaml "
                       r"num_processes .* says 8, .*litgpt_finetune_llama-3.1-8b_full.yaml "
                       r"devices .* says 4"):
        read_jobs([str(DATA / "trl_accelerate_fsdp1.yaml"),
                   str(DATA / "litgpt_finetune_llama-3.1-8b_full.yaml")])


def test_global_batch_must_agree_with_accumulation():
    # litgpt: global 64 = micro 4 x 4 devices x GA 4; a flag setting GA 2 contradicts it
    r = run("--job", str(DATA / "litgpt_finetune_llama-3.1-8b_full.yaml"), "--gpu", "h100-80",
            "--grad-accum", "2")
    one_line_error(r, 4, "train.global_batch_size", "is 64", "is 32")


@pytest.mark.parametrize("text, needle", [
    ("a: &x [1, 2]\nb: *x\n", "anchors and aliases"),
    ('{"a": 1, "a": 2}', "duplicate key 'a'"),
    ("[training]\nseq_len = \n", "invalid TOML"),
    ("key: [unclosed\n", "invalid YAML"),
    ('{"zero_optimization": {"stage": NaN}}', "bad.yaml: zero_optimization.stage: nan is not a "
                                              "finite number"),
])
def test_malformed_files_are_one_line_exit_4(tmp_path, text, needle):
    p = tmp_path / ("bad.toml" if "[training]" in text else "bad.yaml")
    p.write_text(text)
    one_line_error(run("--job", str(p), "--gpu", "h100-80"), 4, needle)


def test_large_and_binary_files_are_refused(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("a: " + "x" * (1 << 20) + "\n")
    one_line_error(run("--job", str(big), "--gpu", "h100-80"), 4, "larger than")
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{}")
    one_line_error(run("--job", str(binary), "--gpu", "h100-80"), 4, "not UTF-8")


def test_cannot_tell_the_format(tmp_path):
    p = tmp_path / "x.yaml"
    p.write_text("colour: blue\n")
    one_line_error(run("--job", str(p)), 4, "cannot tell which job format", "--format")


# ---------------------------------------------------------------------------------------------
# The unmodelled rule: one function, read from the registry at run time

def test_unknown_paths_are_unmodelled_until_the_registry_has_them(monkeypatch):
    from planner import fields
    from planner.jobs import Vocab

    values = {"parallel.sp": 8, "training.seq": 4096, "training.optimizer": Vocab("adagrad")}
    kept, lines = split_modelled(values)
    assert kept == {"training.seq": 4096}
    assert "sequence parallel (Ulysses) degree 8 (parallel.sp) is not modelled yet" in lines
    assert "optimizer adagrad (training.optimizer) is not modelled yet" in lines
    # another developer adds the field: the same reader output now passes through
    monkeypatch.setitem(fields.BY_PATH, "parallel.sp",
                        fields.Field(path="parallel.sp", flag="--sp", check=int))
    kept, lines = split_modelled(values)
    assert kept["parallel.sp"] == 8 and not any("parallel.sp" in x for x in lines)


def test_plan_shows_unmodelled_as_warnings_and_gate_rejects_them(tmp_path):
    # torchtitan's 70B recipe with expert tensor parallel switched on (not modelled)
    text = (DATA / "torchtitan_llama3_70b.v0.2.0.toml").read_text()
    assert "[parallelism]\n" in text
    path = tmp_path / "etp.toml"
    path.write_text(text.replace("[parallelism]\n",
                                 "[parallelism]\nexpert_tensor_parallel_degree = 2\n"))
    r = run("--job", str(path), "--gpu", "h100-80", "--n", "64", "--json")
    assert r.exit_code in (0, 3), r.output
    doc = json.loads(r.stdout)
    assert any("expert tensor parallel degree" in u for u in doc["job"]["unmodelled"])
    assert any("NOT MODELLED: expert tensor parallel degree" in a for a in doc["assumptions"])
    r = run("gate", str(path), "--gpu", "h100-80", "--n", "64")
    assert r.exit_code == 3, r.output
    v = json.loads(r.stdout)
    assert v["verdict"] == "reject" and v["predicted"] is None
    assert "does not model" in v["reason"] and "expert tensor parallel degree" in v["reason"]
    assert v["unmodelled"] and "expert_tensor_parallel_degree" in v["unmodelled"][0]


def test_torchtitan_expert_parallel_on_a_dense_model_is_refused_by_key(tmp_path):
    # --ep is modelled (planner/expert_parallel.py); on a dense model it is refused, naming
    # the file's key (bad input data in a job file: exit 4)
    text = (DATA / "torchtitan_llama3_70b.v0.2.0.toml").read_text()
    path = tmp_path / "ep.toml"
    path.write_text(text.replace("[parallelism]\n", "[parallelism]\nexpert_parallel_degree = 4\n"))
    one_line_error(run("--job", str(path), "--gpu", "h100-80", "--n", "64"), 4,
                   "[parallelism] expert_parallel_degree", "dense")


def test_torchtitan_70b_recipe_with_tp8_is_admitted():
    # issue 15: torchtitan's own 70B recipe (FSDP 8 x TP 8 on 64 H100s, local batch 8 x 8192,
    # full AC) "fit on no number of GPUs" before TP could be expressed
    r = run("gate", str(DATA / "torchtitan_llama3_70b.v0.2.0.toml"), "--gpu", "h100-80",
            "--n", "64")
    v = json.loads(r.stdout)
    assert r.exit_code == 0 and v["verdict"] == "admit", v
    assert v["recommendation"]["tp"] == 8 and v["recommendation"]["checkpointing"] == "full"


def test_gate_reads_any_format_with_hardware_from_file_or_options():
    # torchtitan 8B on 8 H100: pinned full_shard + selective fits
    r = run("gate", str(DATA / "torchtitan_llama3_8b.v0.2.0.toml"), "--gpu", "h100-80",
            "--n", "8")
    v = json.loads(r.stdout)
    assert r.exit_code == 0 and v["verdict"] == "admit" and v["pinned"] is True
    assert v["recommendation"]["checkpointing"] == "selective"
    # accelerate FSDP2: the GPU count from num_processes, the model from --model (hub id)
    r = run("gate", str(DATA / "trl_accelerate_fsdp2.yaml"), "--gpu", "h100-80", "--model",
            "meta-llama/Llama-3.1-8B-Instruct")
    v = json.loads(r.stdout)
    assert r.exit_code == 0 and "8 x h100-80" in v["reason"]
    # no GPU count anywhere
    r = run("gate", str(DATA / "kubeflow_pytorchjob_elastic_imagenet.yaml"), "--gpu", "h100-80",
            "--model", "gpt2")
    one_line_error(r, 4, "does not say how many GPUs", "--n")
    # an unknown model is named with the next step, never guessed
    r = run("gate", str(DATA / "axolotl_mistral_bigstral_bigstral-ds-zero3.yaml"), "--gpu",
            "h100-80", "--n", "8")
    one_line_error(r, 4, "'mistral-community/Mixtral-8x22B-v0.1'", "not a fitcheck model preset",
                   "--model PRESET", "--config")


def test_gate_on_a_plain_spec_never_loads_planner_jobs():
    code = ("import sys; from planner.cli import cli\n"
            "try:\n    cli.main(['gate', %r])\n"
            "except SystemExit: pass\n"
            "print('JOBS', 'planner.jobs' in sys.modules, file=sys.stderr)")
    spec = str(Path(__file__).parent / "data" / "gate" / "llama8b-8xh100.json")
    r = subprocess.run([sys.executable, "-c", code % spec], capture_output=True, text=True)
    assert "JOBS False" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", code.replace("['gate', %r]", "['--params', '7e9', "
                        "'--gpu', 'h100-80']")], capture_output=True, text=True)
    assert "JOBS False" in r.stderr, r.stderr


# ---------------------------------------------------------------------------------------------
# Flags over job values

def test_flags_override_job_values():
    path = str(DATA / "torchtitan_llama3_8b.v0.2.0.toml")
    r = run("--job", path, "--gpu", "h100-80", "--n", "8", "--json")
    base = json.loads(r.stdout)
    assert base["inputs"]["training"]["seq"] == 8192
    assert base["inputs"]["checkpointing"] == "selective" and base["inputs"]["strategies"] == [
        "full_shard"]
    r = run("--job", path, "--gpu", "h100-80", "--n", "8", "--seq", "4096", "--checkpointing",
            "auto", "--strategy", "full_shard,zero3", "--json")
    doc = json.loads(r.stdout)
    assert doc["inputs"]["training"]["seq"] == 4096
    assert doc["inputs"]["checkpointing"] == "auto"
    assert doc["inputs"]["strategies"] == ["full_shard", "zero3"]
    assert doc["inputs"]["training"]["micro_batch"] == 1  # still the job's
    assert doc["inputs"]["model"]["name"] == "llama3-8b"
    assert any("torchtitan v0.2 layout" in a for a in doc["assumptions"])
    assert isinstance(doc["warnings"], list)


def test_a_model_flag_replaces_an_unknown_job_model():
    path = str(DATA / "llamafactory_qwen3_full_sft.yaml")
    r = run("--job", path, "--gpu", "h100-80")
    one_line_error(r, 4, "'Qwen/Qwen3-4B-Instruct-2507'", "--model PRESET")
    r = run("--job", path, "--gpu", "h100-80", "--model", "Qwen/Qwen2.5-7B-Instruct", "--json")
    assert r.exit_code in (0, 3), r.stderr
    assert json.loads(r.stdout)["inputs"]["model"]["name"] == "qwen2.5-7b"


def test_a_bad_flag_is_still_a_usage_error():
    r = run("--job", str(DATA / "trl_accelerate_fsdp2.yaml"), "--gpu", "h100-80", "--model",
            "llama3-8b", "--seq", "0")
    one_line_error(r, 2, "--seq")


def test_two_job_files_plan_as_one_job():
    r = run("--job", str(DATA / "alignment-handbook_accelerate_fsdp.yaml"), "--job",
            str(DATA / "alignment-handbook_zephyr-7b-beta_sft_config_full.yaml"), "--gpu",
            "h100-80", "--json")
    doc = json.loads(r.stdout)
    assert doc["inputs"]["strategies"] == ["full_shard"]  # the accelerate config's
    assert doc["inputs"]["checkpointing"] == "full"  # the recipe's gradient_checkpointing
    assert doc["inputs"]["training"]["micro_batch"] == 16 and doc["inputs"]["hardware"][
        "n_gpus"] == 8
    assert not any("plain DDP" in w for w in doc["warnings"])


def test_job_options_need_a_job():
    one_line_error(run("--params", "7e9", "--gpu", "h100-80", "--job-diff"), 2, "need --job")


# ---------------------------------------------------------------------------------------------
# Writing the job back: only the needed lines change, and it reads back as the recommendation

ROUND_TRIPS = [
    # (file, flags): each asks for less than it needs, or more than it must
    ("trl_accelerate_fsdp1.yaml", ["--model", "llama3-70b", "--seq", "4096"]),
    ("trl_accelerate_fsdp2.yaml", ["--model", "llama3-70b", "--seq", "4096"]),
    ("accelerate_template_fsdp.yaml", ["--model", "llama3-8b", "--seq", "8192"]),
    ("trl_accelerate_deepspeed_zero1.yaml", ["--model", "llama3-70b"]),
    ("accelerate_ds_zero_stage2_config.json", ["--model", "llama3-70b", "--n", "16",
                                               "--micro-batch", "1"]),
    ("axolotl_deepspeed_zero3_bf16_cpuoffload_all.json", ["--model", "llama3-8b", "--n", "8"]),
    # at 16384 tokens selective checkpointing is at risk (71.0 GiB, its interval past 79.6 GiB:
    # docs/accuracy.md §5) and full fits: the file's checkpointing changes
    ("torchtitan_llama3_8b.v0.2.0.toml", ["--n", "8", "--seq", "16384"]),
    ("torchtitan_llama3_8b.2025-02.toml", ["--n", "8", "--seq", "2048"]),
    ("alignment-handbook_zephyr-7b-beta_sft_config_full.yaml", ["--n", "8"]),
    ("axolotl_deepseek-v2_fft-fsdp-16b.yaml", ["--model", "llama3-8b", "--n", "8"]),
    ("hf_training_args_serialized_grpo.json", ["--model", "llama3-8b", "--n", "8",
                                               "--optimizer", "adamw"]),
]


@pytest.mark.parametrize("name, flags", ROUND_TRIPS)
def test_write_back_round_trip(tmp_path, name, flags):
    src = tmp_path / name
    shutil.copy(DATA / name, src)
    out = tmp_path / f"new-{name}"
    args = ["--job", str(src), "--gpu", "h100-80", *flags]
    r = run(*args, "--write-job", str(out), "--json")
    assert r.exit_code == 0, (r.stdout, r.stderr)
    rw = json.loads(r.stdout)["job"]["rewrite"]
    want = rw["candidate"]
    old, new = src.read_text(), out.read_text()
    assert rw["changes"] and old != new
    # only the changed keys' lines differ (plus lines added for keys that were missing)
    changed = [line for line in rw["diff"].splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert len([c for c in changed if c.startswith("-")]) <= len(rw["changes"]) + 2, changed
    # read back, the written job plans to the recommended candidate
    back = [a if a != str(src) else str(out) for a in args]
    r2 = run(*back, "--json")
    doc = json.loads(r2.stdout)
    rec = doc["recommendation"]
    assert rec is not None, r2.stdout
    got = {k: rec[k] for k in ("strategy", "offload")}
    assert got == {k: want[k] for k in ("strategy", "offload")}, (got, want)
    if not rw["notes"]:  # the file says the checkpointing too
        assert rec["checkpointing"] == want["checkpointing"]
    # and written again, nothing changes
    r3 = run(*back, "--job-diff")
    assert r3.exit_code == 0 and r3.stdout == "", r3.stdout


def test_write_in_place_keeps_comments_and_mode(tmp_path):
    src = tmp_path / "torchtitan.toml"
    shutil.copy(DATA / "torchtitan_llama3_8b.v0.2.0.toml", src)
    src.chmod(0o640)
    # at 16384 tokens selective checkpointing is at risk and full fits (which one fits
    # depends on the measured error band, docs/accuracy.md §5); this test is about writing in
    # place
    r = run("--job", str(src), "--gpu", "h100-80", "--n", "8", "--seq", "16384",
            "--write-job", str(src))
    assert r.exit_code == 0, r.stderr
    text = src.read_text()
    assert 'mode = "full"  # ["none", "selective", "full"]' in text
    assert text.startswith("# fitcheck test fixture")
    assert oct(src.stat().st_mode & 0o777) == "0o640"
    assert "[activation_checkpoint] mode: selective -> full" in r.stderr
    assert not list(tmp_path.glob(".fitcheck-*"))  # no temporary left behind


def test_job_diff_prints_a_unified_diff(tmp_path):
    args = ("--job", str(DATA / "accelerate_ds_zero_stage2_config.json"), "--gpu", "h100-80",
            "--model", "llama3-70b", "--n", "16")
    r = run(*args, "--job-diff")
    assert r.exit_code == 0
    assert r.stdout.startswith("--- a/accelerate_ds_zero_stage2_config.json")
    assert '-        "stage": 2,' in r.stdout and '+        "stage": 3,' in r.stdout
    assert '"allgather_bucket_size": 2e8' in r.stdout  # the number as written, kept
    rw = json.loads(run(*args, "--job-diff", "--json").stdout)["job"]["rewrite"]
    assert rw["diff"] == r.stdout
    # a DeepSpeed JSON has no checkpointing switch: a note says what the code must do
    assert (rw["candidate"]["checkpointing"] != "none") == any("cannot say" in n
                                                               for n in rw["notes"])


def test_write_back_refuses_what_the_format_cannot_say(tmp_path):
    r = run("--job", str(DATA / "litgpt_finetune_llama-3.1-8b_full.yaml"), "--gpu", "h100-80",
            "--job-diff")
    one_line_error(r, 4, "litgpt", "no strategy, offload or checkpointing keys")
    r = run("--job", str(DATA / "accelerate_template_fsdp.yaml"), "--gpu", "h100-80",
            "--model", "llama3.1-405b", "--write-job", str(tmp_path / "x.yaml"))
    assert r.exit_code == 3 and "not written" in r.stderr
    assert not (tmp_path / "x.yaml").exists()


# ---------------------------------------------------------------------------------------------
# Hub-style model ids

@pytest.mark.parametrize("ident, preset", [
    ("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b"),
    ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama3.1-8b"),
    ("meta-llama/Meta-Llama-3-8B-Instruct", "llama3-8b"),
    ("meta-llama/Llama-2-7b-chat-hf", "llama2-7b"),
    ("meta-llama/Llama-3.2-1B-Instruct", "llama3.2-1b"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama3.1-70b"),
    ("NousResearch/Meta-Llama-3.1-8B", "llama3.1-8b"),
    ("casperhansen/llama-3-70b-fp16", "llama3-70b"),
    ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b"),
    ("mistralai/Mistral-7B-Instruct-v0.2", "mistral-7b-v0.2"),  # no sliding window
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("Qwen/Qwen2-7B-Instruct", "qwen2.5-7b"),
    ("google/gemma-2-9b-it", "gemma2-9b"),
    ("tiiuae/falcon-7b-instruct", "falcon-7b"),
    ("microsoft/Phi-3.5-mini-instruct", "phi3-mini-128k"),  # sliding window 262144
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
    ("Llama-3.1-8B-Instruct", "llama3.1-8b"),
])
def test_hub_ids_resolve_to_presets(ident, preset):
    assert resolve_name(ident) == preset


@pytest.mark.parametrize("ident", [
    "mistralai/Mistral-7B-Instruct-v0.3",  # vocab 32768: not mistral-7b
    "mistralai/Mistral-7B-v0.3",
    "mistralai/Mixtral-8x22B-Instruct-v0.1",
    "Qwen/Qwen2.5-VL-7B-Instruct",  # + a vision tower
    "google/gemma-3-4b-it",
])
def test_variants_with_another_config_do_not_resolve(ident):
    assert resolve_name(ident) is None


def test_hub_id_in_a_gate_spec_and_an_inline_config_for_the_webhook():
    from planner.gate import gate

    v = gate({"model": {"preset": "meta-llama/Llama-3.1-8B-Instruct"},
              "hardware": {"gpu": "h100-80", "n": 8}}, allow_files=False)
    assert v["verdict"] == "admit"
    cfg = json.loads((Path(__file__).parent / "data" / "configs" / "qwen2.5-7b.json").read_text())
    inline = gate({"model": {"config": cfg}, "hardware": {"gpu": "h100-80", "n": 8},
                   "strategy": "full_shard"}, allow_files=False)
    preset = gate({"model": {"preset": "qwen2.5-7b"}, "hardware": {"gpu": "h100-80", "n": 8},
                   "strategy": "full_shard"}, allow_files=False)
    assert inline["predicted"]["peak_allocated_bytes"] == preset["predicted"][
        "peak_allocated_bytes"]
    from planner.fields import SpecError

    with pytest.raises(SpecError, match=r"model.config \(inline config.json\) is missing"):
        gate({"model": {"config": {"model_type": "llama"}}, "hardware": {"gpu": "h100-80",
                                                                         "n": 8}})


def test_job_options_are_part_of_the_cli_surface():
    from planner.cli import cli
    from planner.gate_cli import gate_cmd

    plan = {o for p in cli.commands["plan"].params for o in p.opts}
    assert {"--job", "--format", "--write-job", "--job-diff"} <= plan
    gate = {o for p in gate_cmd.params for o in p.opts}
    assert {"--format", "--gpu", "--n", "--gpus-per-node", "--model"} <= gate
