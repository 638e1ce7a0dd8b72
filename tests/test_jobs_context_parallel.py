"""Context- and expert-parallel degrees in job files (issue 26, item 7): what each framework's
degree runs, read off its source at the table's version, and what fitcheck makes of it.

torchtune's ``context_parallel_dim`` runs torch's ``context_parallel`` as torchtitan wires it
(training/_distributed.py ``get_context_parallel_manager``, bd2a0fc7): it maps to --cp.
axolotl's ring-flash-attn, LLaMA-Factory's Ulysses and the EP backends of both are other
mechanisms: NOT MODELLED lines that name the mechanism and its file.

Each file is a public config (tests/data/jobs/SOURCES.md) with a one-key edit; the expected
values are read by hand from the edited file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line_error, run

from planner.jobs import JobError, read_job

DATA = Path(__file__).parent / "data" / "jobs"
TT_FULL = "torchtune_llama3_1_8B_full.yaml"


def edited(tmp_path: Path, name: str, replace: dict[str, str], append: str = "",
           out: str | None = None) -> str:
    text = (DATA / name).read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new, 1)
    folder = tmp_path / (out or "a")
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text + append)
    return str(path)


# max_seq_len null would plan at --seq; 8192 = 2 x 2 x 2048 splits into 2 x CP chunks
SEQ_8K = {"  max_seq_len: null": "  max_seq_len: 8192"}
CP2 = "context_parallel_dim: 2\ncontext_parallel_rotate_method: alltoall\n"


# ---- torchtune: mapped -----------------------------------------------------------------------

def test_torchtune_cp_degree_and_rotation_are_read(tmp_path):
    j = read_job(edited(tmp_path, TT_FULL, SEQ_8K, CP2))
    assert (j.values["parallel.cp"], j.values["parallel.cp_rotate"]) == (2, "alltoall")
    assert j.values["training.seq"] == 8192
    assert not [line for line in j.unmodelled if "context" in line]
    # no rotation key: torchtune's default (recipes: cfg.get(..., "allgather")) is the field's
    j = read_job(edited(tmp_path, TT_FULL, SEQ_8K, "context_parallel_dim: 4\n", out="b"))
    assert j.values["parallel.cp"] == 4 and "parallel.cp_rotate" not in j.values


def _plan(*args: str) -> dict:
    r = run("--gpu", "h100-80", "--n", "8", *args, "--json")
    assert r.exit_code in (0, 3), (r.exit_code, r.stderr)
    return json.loads(r.stdout)


def test_torchtune_cp_plans_as_the_cp_flags_do(tmp_path):
    """The job's CP plan is the one --cp 2 --cp-rotate alltoall gives for the same settings
    (the same file without the CP keys): a wiring test, the numbers are held by
    tests/test_context_parallel.py."""
    job = _plan("--job", edited(tmp_path, TT_FULL, SEQ_8K, CP2))
    flags = _plan("--job", edited(tmp_path, TT_FULL, SEQ_8K, out="b"), "--cp", "2",
                  "--cp-rotate", "alltoall")
    assert (job["inputs"]["cp"], job["inputs"]["cp_rotate"]) == (2, "alltoall")
    for key in ("inputs", "candidates", "recommendation"):
        assert job[key] == flags[key], key
    # 8192 tokens over CP 2: 4096 per GPU (the plan's own words)
    r = run("--gpu", "h100-80", "--n", "8", "--job", edited(tmp_path, TT_FULL, SEQ_8K, CP2,
                                                             out="c"))
    assert "context parallel 2 (alltoall ring): 4096 tokens" in " ".join(r.stdout.split())


def test_torchtune_lora_cp_is_read_and_refused_by_the_planner(tmp_path):
    # lora_finetune_distributed.py reads context_parallel_dim; fitcheck's CP is full training
    path = edited(tmp_path, "torchtune_llama3_1_8B_lora.yaml", SEQ_8K, CP2)
    assert read_job(path).values["parallel.cp"] == 2
    r = run("--gpu", "h100-80", "--n", "8", "--job", path)
    one_line_error(r, 4, "context_parallel_dim (parallel.cp)", "CP with a fine-tune")


def test_torchtune_cp_with_packing_is_refused_as_torchtune_refuses_it(tmp_path):
    path = edited(tmp_path, TT_FULL, {**SEQ_8K, "packed: False": "packed: True"}, CP2)
    with pytest.raises(JobError, match=r"context_parallel_dim: 2 with dataset.packed true: "
                       r"torchtune refuses it .*flex attention"):
        read_job(path)


def test_torchtune_cp_with_fp8_is_refused_as_torchtune_refuses_it(tmp_path):
    path = edited(tmp_path, TT_FULL, SEQ_8K, CP2 + "enable_fp8_training: true\n")
    with pytest.raises(JobError, match="context_parallel_dim: 2 with enable_fp8_training"):
        read_job(path)


def test_torchtune_dpo_recipe_ignores_the_cp_key(tmp_path):
    # lora_dpo_distributed.py never reads context_parallel_dim (only the full / LoRA / QAT
    # finetune recipes do): the key changes nothing there, and the plan says so
    j = read_job(edited(tmp_path, "torchtune_llama3_1_8B_lora_dpo.yaml", {}, CP2))
    assert "parallel.cp" not in j.values
    assert any("context_parallel_dim 2 is ignored" in w and "DPO" in w for w in j.warnings)


# ---- accelerate (and the HF Trainer / TRL reading its ParallelismConfig): mapped, grouped ---

ACC_CP = "trl_accelerate_context_parallel_2gpu.yaml"  # TRL's docs: FSDP2, cp_size 2, 2 GPUs


def test_accelerate_cp_is_read_with_grouped_keys(tmp_path):
    # parallelism_config_cp_size: 2; no cp_comm_strategy: TorchContextParallelConfig's
    # allgather (the field's default); HF attention under accelerate's hooks: enable_gqa
    j = read_job(str(DATA / ACC_CP))
    assert (j.values["parallel.cp"], j.values["parallel.cp_kv"]) == (2, "grouped")
    assert j.values["hardware.n"] == 2 and "parallel.cp_rotate" not in j.values
    assert not [line for line in j.unmodelled if "context" in line]
    path = edited(tmp_path, ACC_CP, {}, "  parallelism_config_cp_comm_strategy: alltoall\n")
    assert read_job(path).values["parallel.cp_rotate"] == "alltoall"


def test_accelerate_cp_plans_as_the_cp_flags_do(tmp_path):
    # llama3-8b (32 heads, 8 key/value heads): grouped is not repeated here
    model = ("--model", "llama3-8b", "--seq", "8192")
    job = _plan(*model, "--job", str(DATA / ACC_CP))
    flags = _plan(*model, "--job", edited(tmp_path, ACC_CP, {
        "parallelism_config_cp_size: 2": "parallelism_config_cp_size: 1"}), "--cp", "2",
        "--cp-kv", "grouped")
    assert (job["inputs"]["cp"], job["inputs"]["cp_rotate"], job["inputs"]["cp_kv"]) == \
        (2, "allgather", "grouped")
    for key in ("inputs", "candidates", "recommendation"):
        assert job[key] == flags[key], key
    repeated = _plan(*model, "--job", str(DATA / ACC_CP), "--cp-kv", "repeated")
    assert repeated["candidates"] != job["candidates"]  # the key/value heads matter


def test_training_arguments_parallelism_config_cp(tmp_path):
    # TrainingArguments.parallelism_config as a mapping (accelerate's ParallelismConfig
    # fields), its TorchContextParallelConfig under cp_handler
    path = edited(tmp_path, "trl_cli_example_config.yaml", {}, (
        "parallelism_config:\n  dp_shard_size: 2\n  cp_size: 2\n"
        "  cp_handler:\n    cp_comm_strategy: alltoall\n"))
    v = read_job(path).values
    assert (v["parallel.cp"], v["parallel.cp_rotate"], v["parallel.cp_kv"]) == \
        (2, "alltoall", "grouped")


def test_hf_trainer_cp_needs_sdpa(tmp_path):
    # transformers Trainer._prepare_context_parallel_inputs raises for any attention but
    # sdpa; flash-attention-2 plans as SDPA elsewhere, so the name is kept for this check,
    # which sees both files of the job (the accelerate config and TRL's recipe)
    recipe = tmp_path / "sft.yaml"
    recipe.write_text("model_name_or_path: meta-llama/Meta-Llama-3-8B\nmax_length: 8192\n"
                      "model_init_kwargs:\n  attn_implementation: flash_attention_2\n")
    r = run("--gpu", "h100-80", "--job", str(DATA / ACC_CP), "--job", str(recipe))
    one_line_error(r, 4, "model_init_kwargs.attn_implementation", "'flash_attention_2' with "
                   "context parallel 2", "sdpa only")
    recipe.write_text(recipe.read_text().replace("flash_attention_2", "sdpa"))
    r = run("--gpu", "h100-80", "--job", str(DATA / ACC_CP), "--job", str(recipe))
    assert r.exit_code in (0, 3), r.stderr
    # without context parallel flash-attention-2 plans as SDPA, as before
    recipe.write_text(recipe.read_text().replace("sdpa", "flash_attention_2"))
    r = run("--gpu", "h100-80", "--job", str(DATA / "trl_accelerate_fsdp2.yaml"), "--job",
            str(recipe))
    assert r.exit_code in (0, 3), r.stderr


# ---- refused, the mechanism named ----------------------------------------------------------

def _cp_line(job) -> str:
    (line,) = [x for x in job.unmodelled if "context parallel degree" in x]
    return line


def test_axolotl_cp_line_names_the_ring_function(tmp_path):
    # the public file packs samples (sample_packing: true): varlen_llama3 by default
    name = "axolotl_distributed-parallel_qwen3-8b-fsdp-tp-cp.yaml"
    line = _cp_line(read_job(str(DATA / name)))
    assert "ring-flash-attn" in line and "varlen_llama3 all-gathers" in line
    assert "heads_k_stride 1" in line
    line = _cp_line(read_job(edited(tmp_path, name, {"sample_packing: true":
                                                     "sample_packing: false"})))
    assert "batch_ring passes keys and values round the ring by point-to-point" in line
    line = _cp_line(read_job(edited(tmp_path, name, {}, "heads_k_stride: 4\n", out="b")))
    assert "heads_k_stride 4" in line


def test_llamafactory_cp_line_names_ulysses():
    line = _cp_line(read_job(str(DATA / "llamafactory_v1_train_full_ulysses_cp.yaml")))
    assert "cp_mode ulysses" in line and "UlyssesAttention" in line and "not a ring" in line


@pytest.mark.parametrize("name, needle", [
    ("axolotl_expert_parallel_qwen3_30ba3b_ep_lora_4gpu.yaml", "DeepEP's fused kernels"),
    ("llamafactory_v1_train_full_qwen3_moe_fsdpturbo_ep_fsdp.yaml", "fsdp_turbo's"),
])
def test_ep_lines_name_the_mechanism(name, needle):
    (line,) = [x for x in read_job(str(DATA / name)).unmodelled
               if "expert parallel degree" in x]
    assert needle in line and "torchtitan's expert parallel" in line


# ---- a CP option without CP: a warning naming it, no refusal -------------------------------

INERT = "has no effect at context parallel degree 1"


def _warnings(*args: str) -> list[str]:
    return _plan(*args)["warnings"]


def test_cp_options_at_degree_1_are_named_on_the_command_line():
    w = _warnings("--model", "llama3-8b", "--cp-rotate", "alltoall", "--cp-kv", "grouped")
    assert [x for x in w if INERT in x] == [
        f"--cp-rotate alltoall {INERT} (--cp): no ring to configure",
        f"--cp-kv grouped {INERT} (--cp): no ring to configure"]
    # the same options with --cp 2: nothing inert; none given: nothing said
    assert not [x for x in _warnings("--model", "llama3-8b", "--seq", "8192", "--cp", "2",
                                     "--cp-rotate", "alltoall") if INERT in x]
    assert not [x for x in _warnings("--model", "llama3-8b") if INERT in x]


def test_cp_rotation_at_degree_1_in_job_files_is_named(tmp_path):
    # torchtitan: context_parallel_degree = 1 beside the rotate method (its configs carry it)
    tt = edited(tmp_path, "torchtitan_llama3_70b.v0.1.0.toml", {
        "context_parallel_degree = 1\n": "context_parallel_degree = 1\n"
        "context_parallel_rotate_method = \"alltoall\"\n"})
    # torchtune: the rotate method without context_parallel_dim (read before: dropped)
    tn = edited(tmp_path, TT_FULL, {}, "context_parallel_rotate_method: alltoall\n", out="b")
    # accelerate: cp_size 1 with a comm strategy (read before: dropped)
    acc = edited(tmp_path, ACC_CP, {"parallelism_config_cp_size: 2":
                                    "parallelism_config_cp_size: 1"},
                 "  parallelism_config_cp_comm_strategy: alltoall\n", out="c")
    for path, key, extra in (
            (tt, "[parallelism] context_parallel_rotate_method", ()),
            (tn, "context_parallel_rotate_method", ()),
            (acc, "parallelism_config.parallelism_config_cp_comm_strategy",
             ("--model", "llama3-8b"))):  # an accelerate config names no model
        w = [x for x in _warnings("--job", path, *extra) if INERT in x]
        # the job's naming: "FILE KEY (parallel.cp_rotate) VALUE ..."
        assert len(w) == 1 and f"{key} (parallel.cp_rotate) alltoall {INERT}" in w[0], (path, w)
