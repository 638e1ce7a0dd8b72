"""``--checkpoint-impl``: reentrant against non-reentrant full checkpointing.

torch/utils/checkpoint.py (torch 2.13): the reentrant ``CheckpointFunction.backward`` re-runs
the block to its end under ``enable_grad`` and keeps its ``outputs`` while
``torch.autograd.backward`` runs through the recomputed graph; the non-reentrant checkpoint
keeps only the saved tensors it recomputes and stops before the block's last matmul
(``early_stop``). So reentrant costs the down projection's forward again (step time) and holds
the block's output, r·t·h, through the block's backward (memory). The memory side is measured
with the fake-tensor referee (probes/trace.py, the reference block under
``use_reentrant=True``); the step time by hand.
"""

from __future__ import annotations

import json

import pytest

from planner.spec import (
    Candidate,
    Checkpointing,
    CheckpointImpl,
    ModelSpec,
    Precision,
    Strategy,
    TrainingSpec,
)

SMALL = ModelSpec(name="small", n_layers=2, hidden=128, n_heads=4, n_kv_heads=2,
                  ffn_hidden=256, vocab=512)


# ---- step time -------------------------------------------------------------------------------

def test_reentrant_recomputes_the_down_projection_by_hand():
    from planner.presets import get_preset
    from planner.throughput import recompute_flops_per_token

    m = get_preset("llama2-7b")  # 32 layers, hidden 4096, ffn 11008
    full = recompute_flops_per_token(m, 4096, Checkpointing.FULL)
    re = recompute_flops_per_token(m, 4096, Checkpointing.FULL, CheckpointImpl.REENTRANT)
    # the non-reentrant recompute skips down (4096 x 11008 weights, 2 FLOPs each per token) in
    # each of the 32 blocks: 2 * 32 * 4096 * 11008 = 2_885_681_152 FLOPs per token more
    assert re - full == 2 * 32 * 4096 * 11008
    # selective checkpointing has no early stop to lose: the same either way
    assert recompute_flops_per_token(m, 4096, Checkpointing.SELECTIVE, CheckpointImpl.REENTRANT) \
        == recompute_flops_per_token(m, 4096, Checkpointing.SELECTIVE)


def test_step_time_slower_by_the_down_recompute():
    from planner.throughput import recompute_of

    def rc(impl, mode=Checkpointing.FULL):
        return recompute_of(SMALL, TrainingSpec(seq=64, micro_batch=1, checkpoint_impl=impl),
                            mode)

    assert rc(CheckpointImpl.NON_REENTRANT).early_stop == 1.0
    # torchtitan's early_stop=False re-runs the whole block as a reentrant checkpoint does
    assert rc(CheckpointImpl.NON_REENTRANT_NO_EARLY_STOP).early_stop == 0.0
    assert rc(CheckpointImpl.REENTRANT).early_stop == 0.0
    assert rc(CheckpointImpl.REENTRANT, Checkpointing.NONE).early_stop == 0.0


# ---- memory ----------------------------------------------------------------------------------

def _estimate(impl: CheckpointImpl, precision: Precision = Precision.BF16):
    from planner.hardware import load_gpu
    from planner.memory import estimate
    from planner.spec import Cluster

    tr = TrainingSpec(seq=64, micro_batch=2, precision=precision, checkpoint_impl=impl)
    cl = Cluster(gpu=load_gpu("h100-80"), n_gpus=1, gpus_per_node=1,
                 host_ram_bytes_per_node=2**40)
    return estimate(SMALL, tr, cl, Candidate(strategy=Strategy.DDP,
                                             checkpointing=Checkpointing.FULL), margin=0.0)


def test_block_backward_holds_the_block_output_by_hand():
    non = _estimate(CheckpointImpl.NON_REENTRANT).phases
    re = _estimate(CheckpointImpl.REENTRANT).phases
    # pure bf16: the residual stream is 2 bytes; t = 2 x 64 tokens, hidden 128:
    # 2 * 128 * 128 = 32768 bytes more while a block is differentiated, nowhere else
    assert re["block_bwd"].total - non["block_bwd"].total == 2 * 128 * 128
    for m in non:
        if m != "block_bwd":
            assert re[m].total == non[m].total, m


@pytest.mark.trace
@pytest.mark.parametrize("precision", [Precision.BF16, Precision.BF16_AMP])
def test_trace_measures_the_held_output_and_the_planner_matches(precision):
    """The referee, the three: the reentrant trace holds r·t·h more at block backward and the
    same everywhere else; without early stop the recompute's end adds at most a transient the
    block's backward already covers; the planner within 2 % at every moment of each."""
    pytest.importorskip("torch")
    from planner.hardware import load_gpu
    from planner.spec import Cluster
    from probes.compare import compare
    from probes.trace import trace_step

    cl = Cluster(gpu=load_gpu("h100-80"), n_gpus=1, gpus_per_node=1,
                 host_ram_bytes_per_node=2**40)
    cand = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.FULL)
    out = {}
    for impl in CheckpointImpl:
        tr = TrainingSpec(seq=64, micro_batch=2, precision=precision, checkpoint_impl=impl)
        out[impl] = compare(SMALL, tr, cl, cand, trace_step(SMALL, tr, cand, 1, 1))
    non, re = out[CheckpointImpl.NON_REENTRANT], out[CheckpointImpl.REENTRANT]
    for pair in out[CheckpointImpl.NON_REENTRANT_NO_EARLY_STOP].moments.values():
        assert abs(pair.rel_error) <= 0.02, pair
    # the residual stream: bf16 (2 B) in pure bf16, fp32 (4 B) under autocast; 128 tokens
    r = 2 if precision is Precision.BF16 else 4
    assert re.moments["block_bwd"].traced_bytes - non.moments["block_bwd"].traced_bytes \
        == r * 128 * 128
    for m, pair in re.moments.items():
        if m != "block_bwd":
            assert pair.traced_bytes == non.moments[m].traced_bytes, m
        assert abs(pair.rel_error) <= 0.02, (m, pair)


# ---- the input -------------------------------------------------------------------------------

def test_cli_rejects_an_unknown_impl():
    from click.testing import CliRunner

    from planner.cli import cli

    r = CliRunner().invoke(cli, ["--params", "7e9", "--gpu", "h100-80", "--n", "8",
                                 "--checkpoint-impl", "sideways"])
    assert r.exit_code == 2
    assert "--checkpoint-impl" in r.output and "sideways" in r.output
    assert "Traceback" not in r.output


def test_cli_reentrant_is_slower_and_echoed():
    from click.testing import CliRunner

    from planner.cli import cli

    def step(*extra):
        r = CliRunner().invoke(cli, ["--model", "llama2-7b", "--gpu", "h100-80", "--n", "8",
                                     "--seq", "4096", "--checkpointing", "full", "--strategy",
                                     "full_shard", "--json", *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["inputs"]["training"]["checkpoint_impl"] == (extra[1] if extra
                                                                else "non-reentrant")
        return doc["candidates"][0]["step_time_s"]

    assert step("--checkpoint-impl", "reentrant") > step()


# ---- the job readers -------------------------------------------------------------------------

def _read(tmp_path, name: str, text: str):
    from planner.jobs import read_job

    p = tmp_path / name
    p.write_text(text)
    j = read_job(str(p))
    return j.raw.get("training.checkpoint_impl"), j.sources["training.checkpoint_impl"].key


def _args(**kw) -> str:
    return json.dumps({"output_dir": "o", "gradient_checkpointing": True, **kw})


def test_transformers_default_and_kwargs(tmp_path):
    # transformers 5.x modeling_utils _activation_checkpointing_enable: {"use_reentrant": False}
    impl, key = _read(tmp_path, "training_args.json", _args())
    assert impl == "non-reentrant" and "5.0: true" in key
    impl, key = _read(tmp_path, "training_args.json",
                      _args(gradient_checkpointing_kwargs={"use_reentrant": True}))
    assert (impl, key) == ("reentrant", "gradient_checkpointing_kwargs.use_reentrant")
    # kwargs without use_reentrant reach torch.utils.checkpoint, whose default is reentrant
    impl, _ = _read(tmp_path, "training_args.json",
                    _args(gradient_checkpointing_kwargs={"preserve_rng_state": False}))
    assert impl == "reentrant"
    # every_n_layers is the Trainer's own key, taken out before checkpoint is called
    impl, _ = _read(tmp_path, "training_args.json",
                    _args(activation_checkpointing_kwargs='{"every_n_layers": 1}'))
    assert impl == "non-reentrant"


def test_fsdp_activation_checkpointing_is_non_reentrant(tmp_path):
    # accelerate's checkpoint_wrapper(checkpoint_impl=NO_REENTRANT), whatever the Trainer's says
    impl, key = _read(tmp_path, "training_args.json", json.dumps({
        "output_dir": "o", "fsdp": "full_shard auto_wrap",
        "fsdp_config": {"activation_checkpointing": True},
        "gradient_checkpointing_kwargs": {"use_reentrant": True}}))
    assert impl == "non-reentrant" and "NO_REENTRANT" in key


def test_trl_default_and_peft_under_zero3(tmp_path):
    recipe = "model_name_or_path: Qwen/Qwen2.5-0.5B\nmax_length: 512\nuse_peft: true\n"
    impl, _ = _read(tmp_path, "sft.yaml", recipe)
    assert impl == "non-reentrant"  # TRL >= 0.27: setdefault("use_reentrant", False)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3},
                                                  "train_micro_batch_size_per_gpu": "auto"}))
    impl, key = _read(tmp_path, "sft.yaml", recipe + "deepspeed: ds.json\n")
    assert impl == "reentrant" and "ZeRO-3" in key


LF = ("model_name_or_path: Qwen/Qwen2.5-0.5B\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
      "dataset: x\ncutoff_len: 512\noutput_dir: o\n")


def test_llamafactory_use_reentrant_gc(tmp_path):
    assert _read(tmp_path, "lf.yaml", LF)[0] == "reentrant"  # use_reentrant_gc default true
    assert _read(tmp_path, "lf.yaml", LF + "use_reentrant_gc: false\n") == \
        ("non-reentrant", "use_reentrant_gc")
    # the Trainer re-enables it through LLaMA-Factory's own method: kwargs decide then
    assert _read(tmp_path, "lf.yaml", LF + "use_reentrant_gc: false\ngradient_checkpointing: "
                 "true\n")[0] == "reentrant"


AX = ("base_model: Qwen/Qwen2.5-0.5B\nsequence_len: 512\nmicro_batch_size: 1\n"
      "gradient_checkpointing: true\ndatasets: []\n")


def test_torchtitan_early_stop_by_release(tmp_path):
    from pathlib import Path

    jobs = Path(__file__).parent / "data" / "jobs"
    v02 = (jobs / "torchtitan_llama3_70b.v0.2.0.toml").read_text()  # mode = "full"
    # v0.2: [activation_checkpoint] early_stop, default false (25413d224)
    impl, key = _read(tmp_path, "t.toml", v02)
    assert impl == "non-reentrant-no-early-stop" and "default false" in key
    on = v02.replace('mode = "full"', 'mode = "full"\nearly_stop = true')
    assert _read(tmp_path, "t.toml", on)[0] == "non-reentrant"
    # v0.1 (2025-06-17) had no such key: torch's default early stop
    v01 = (jobs / "torchtitan_llama3_70b.v0.1.0.toml").read_text()
    assert _read(tmp_path, "t.toml", v01)[0] == "non-reentrant"


def test_axolotl_defaults(tmp_path):
    assert _read(tmp_path, "ax.yaml", AX)[0] == "reentrant"  # normalize_config
    assert _read(tmp_path, "ax.yaml", AX + "rl: dpo\n")[0] == "non-reentrant"  # the builder
    assert _read(tmp_path, "ax.yaml", AX + "gradient_checkpointing_kwargs:\n"
                 "  use_reentrant: false\n")[0] == "non-reentrant"
