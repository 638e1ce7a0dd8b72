"""Keys the key tables called irrelevant that change memory or step time (the audit of
planner/data/job_keys_*.json): each is now read into a field or a NOT MODELLED line.

- torch.optim.SGD keeps ``momentum_buffer`` per parameter when momentum != 0
  (torch/optim/sgd.py ``_init_group``; default 0): a job's SGD with momentum is sgd-momentum
  (the plan's optimizer state: one more fp32 tensor per parameter, planner/memory/states.py).
- torch's Adam / AdamW with ``amsgrad`` keep ``max_exp_avg_sq`` per parameter
  (torch/optim/adam.py ``_init_group``): a NOT MODELLED line.
- torchtitan's ``activation_checkpoint.early_stop`` (v0.2.x job_config.py: "stop recomputing
  early when all activations have already been rematerialized", passed to
  ``checkpoint_wrapper``) and ``.debug`` (torch checkpoint's debug mode): NOT MODELLED lines
  when on (their default is off)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.jobs import read_job

DATA = Path(__file__).parent / "data" / "jobs"


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


TORCHTUNE = "torchtune_llama3_1_8B_full.yaml"


def _torchtune(tmp_path: Path, optimizer: str) -> str:
    text = (DATA / TORCHTUNE).read_text()
    start = text.index("optimizer:\n")
    end = text.index("\n", text.index("lr:", start))
    return _write(tmp_path, TORCHTUNE, text[:start] + optimizer + text[end:])


def test_torchtune_sgd_momentum(tmp_path):
    j = read_job(_torchtune(tmp_path, "optimizer:\n  _component_: torch.optim.SGD\n"
                                      "  lr: 0.01\n  momentum: 0.9"))
    assert j.values["training.optimizer"] == "sgd-momentum"
    j = read_job(_torchtune(tmp_path, "optimizer:\n  _component_: torch.optim.SGD\n"
                                      "  lr: 0.01\n  momentum: 0"))
    assert j.values["training.optimizer"] == "sgd"


def test_torchtune_amsgrad_is_not_modelled(tmp_path):
    j = read_job(_torchtune(tmp_path, "optimizer:\n  _component_: torch.optim.AdamW\n"
                                      "  lr: 2e-5\n  amsgrad: true"))
    assert any("optimizer.amsgrad" in u and "AMSGrad" in u for u in j.unmodelled), j.unmodelled
    j = read_job(_torchtune(tmp_path, "optimizer:\n  _component_: torch.optim.AdamW\n"
                                      "  lr: 2e-5\n  amsgrad: false"))
    assert not [u for u in j.unmodelled if "AMSGrad" in u]


def test_deepspeed_sgd_momentum_and_amsgrad(tmp_path):
    base = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2}}
    sgd = _write(tmp_path, "ds_sgd.json", json.dumps(
        {**base, "optimizer": {"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9}}}))
    assert read_job(sgd).values["training.optimizer"] == "sgd-momentum"
    ams = _write(tmp_path, "ds_ams.json", json.dumps(
        {**base, "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "amsgrad": True,
                                                           "torch_adam": True}}}))
    assert any("optimizer.params.amsgrad" in u for u in read_job(ams).unmodelled)


def test_litgpt_sgd_momentum(tmp_path):
    text = ("# fitcheck test fixture\ncheckpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\n"
            "devices: 1\ntrain:\n  micro_batch_size: 1\n  max_seq_length: 512\n"
            "optimizer:\n  class_path: torch.optim.SGD\n  init_args:\n    lr: 0.01\n"
            "    momentum: 0.9\n")
    j = read_job(_write(tmp_path, "litgpt_sgd.yaml", text), "litgpt")
    assert j.values["training.optimizer"] == "sgd-momentum"


def test_torchtitan_early_stop_and_debug_are_named(tmp_path):
    src = DATA / "torchtitan_llama3_8b.v0.2.0.toml"
    head = "[activation_checkpoint]\n"
    text = src.read_text().replace(head, head + "early_stop = true\ndebug = true\n")
    j = read_job(_write(tmp_path, src.name, text))
    lines = " ".join(j.unmodelled)
    assert "activation_checkpoint.early_stop" in lines and "early stop" in lines
    assert "activation_checkpoint.debug" in lines
    assert not [u for u in read_job(str(src)).unmodelled if "early_stop" in u]


def test_torchtitan_keys_that_change_memory_or_speed_are_named(tmp_path):
    """torchtitan v0.2.0 llama3_8b.toml with each key set off its default: each a NOT MODELLED
    line (norm_type: the Triton fused_rmsnorm saves other tensors; compile.backend aot_eager:
    no inductor; detect_anomaly: torchtitan's own "significant overhead" warning)."""
    src = DATA / "torchtitan_llama3_8b.v0.2.0.toml"
    text = src.read_text()
    for section, line, key in (("[model]", 'norm_type = "fused_rmsnorm"', "model.norm_type"),
                               ("[compile]", 'backend = "aot_eager"', "compile.backend"),
                               ("[debug]", "detect_anomaly = true", "debug.detect_anomaly")):
        edited = text.replace(f"{section}\n", f"{section}\n{line}\n") if f"{section}\n" in text \
            else text + f"\n{section}\n{line}\n"
        j = read_job(_write(tmp_path, src.name, edited))
        assert any(key in u for u in j.unmodelled), (key, j.unmodelled)


# ---- tf32: the HF Trainer's / axolotl's allow_tf32 switch (a step-time input, --tf32) -------

def _compute_s(*args: str) -> float:
    from conftest import run

    r = run("--model", "llama3-8b", "--gpu", "a100-80", "--n", "8", "--strategy", "full_shard",
            "--checkpointing", "full", "--json", *args)
    assert r.exit_code in (0, 3), r.stderr
    return json.loads(r.stdout)["candidates"][0]["compute_s"]


def test_tf32_runs_fp32_matmuls_at_the_tf32_rate():
    """A100 datasheet: 19.5 TFLOPS FP32, 156 TF32 (hardware_profiles/a100-80.toml): an fp32
    run's compute time with --tf32 is 19.5 / 156 = 1/8 of the plain one; under bf16-amp the
    matmuls are bf16 and --tf32 changes nothing."""
    plain, tf32 = _compute_s("--precision", "fp32"), _compute_s("--precision", "fp32", "--tf32")
    assert tf32 / plain == pytest.approx(19.5 / 156, rel=1e-12)
    assert _compute_s("--tf32") == _compute_s()


def test_tf32_is_read_from_axolotl():
    j = read_job(str(DATA / "axolotl_archived_code-llama_13b_lora.yml"))
    assert j.values["training.tf32"] is False  # the file's "tf32: false"


def test_tf32_is_read_from_training_arguments(tmp_path):
    src = DATA / "hf_training_args_serialized_grpo.json"
    text = src.read_text()
    assert '"tf32": false' in text
    assert read_job(str(src)).values["training.tf32"] is False
    j = read_job(_write(tmp_path, src.name, text.replace('"tf32": false', '"tf32": true')))
    assert j.values["training.tf32"] is True
    assert "training.tf32" not in read_job(str(DATA / "hf_training_args_marketguardians.json")
                                           ).values  # null: torch's default


def test_torch_compile_mode_turns_compile_on_and_cuda_graph_modes_are_named(tmp_path):
    """transformers' TrainingArguments.__post_init__: "if (self.torch_compile_mode is not None
    or self.torch_compile_backend is not None) and not self.torch_compile: self.torch_compile
    = True". reduce-overhead captures CUDA graphs (their pools are not modelled)."""
    src = DATA / "hf_training_args_serialized_grpo.json"
    doc = json.loads(src.read_text())
    assert not doc.get("torch_compile") and doc.get("torch_compile_mode") is None
    doc["torch_compile_mode"] = "default"
    j = read_job(_write(tmp_path, src.name, json.dumps(doc)))
    assert j.values["training.compile"] == "model"
    assert not [u for u in j.unmodelled if "CUDA graphs" in u]  # "default": neutral
    doc["torch_compile_mode"] = "reduce-overhead"
    j = read_job(_write(tmp_path, src.name, json.dumps(doc)))
    assert any("torch_compile_mode" in u and "CUDA graphs" in u for u in j.unmodelled)


def test_deepspeed_collective_switches_are_named(tmp_path):
    """DeepSpeed's zero_optimization.reduce_scatter false all-reduces the gradient buckets
    (stage_1_and_2.py: allreduce instead of reduce-scatter, twice the traffic) and
    allgather_partitions false broadcasts each rank's partition instead of one all-gather
    (config docs): step-time changes fitcheck does not plan: NOT MODELLED lines."""
    doc = {"train_micro_batch_size_per_gpu": 1,
           "zero_optimization": {"stage": 2, "reduce_scatter": False,
                                 "allgather_partitions": False}}
    j = read_job(_write(tmp_path, "ds.json", json.dumps(doc)))
    lines = " ".join(j.unmodelled)
    assert "all-reduced instead of reduce-scattered" in lines
    assert "series of broadcasts" in lines
    doc["zero_optimization"] = {"stage": 2, "reduce_scatter": True, "allgather_partitions": True}
    j = read_job(_write(tmp_path, "ds.json", json.dumps(doc)))
    assert not [u for u in j.unmodelled if "broadcasts" in u or "all-reduced" in u]


def test_accelerate_dynamo_mode_is_named(tmp_path):
    src = DATA / "accelerate_template_multi_gpu.yaml"
    text = src.read_text() + ("\ndynamo_config:\n  dynamo_backend: INDUCTOR\n"
                              "  dynamo_mode: max-autotune\n")
    j = read_job(_write(tmp_path, src.name, text), "accelerate")
    assert any("dynamo_config.dynamo_mode" in u and "CUDA graphs" in u for u in j.unmodelled)
