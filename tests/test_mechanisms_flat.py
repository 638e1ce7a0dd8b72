"""FSDP1 flat parameters mixing frozen and trainable tensors (issue 24, item 1):
``--flat-params mixed`` (``FullyShardedDataParallel(use_orig_params=True)`` with a block's
frozen and trainable tensors in one FlatParameter) against ``apart`` (trainable modules in units
of their own: peft's ``fsdp_auto_wrap_policy``, the default).

The mechanism (torch 2.13): ``_flat_param.py`` ``_validate_tensors_to_flatten`` permits
non-uniform requires_grad under use_orig_params and makes the FlatParameter's requires_grad the
OR over its tensors; the original parameters are views of it, so autograd accumulates one
full-size gradient into the flat parameter, zeros where frozen; ``_runtime_utils.py``
``_post_backward_hook`` keeps it unsharded under no_sync, else reduce-scatters all of it. The
expected bytes below are derived by hand from the shape (FSDP1 is not traced: the referee
traces FSDP2 only).

4 blocks of hidden 512, 8 heads, ffn 1024 (SwiGLU), vocabulary 4096, untied:
  block = 2 x 512 + 4 x 512 x 512 + 3 x 512 x 1024 = 2,622,464
  LoRA rank 16 on q and v: 2 x 16 x (512 + 512) = 32,768 per block
  root = 4096 x 512 (embedding) + 512 (final norm) + 4096 x 512 (head) = 4,194,816
"""

from __future__ import annotations

import json


from conftest import one_line_error, run
from planner.hardware import load_gpu
from planner.memory import Phase, estimate
from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    FineTune,
    FlatParams,
    GradSync,
    ModelSpec,
    Precision,
    Strategy,
    TrainingSpec,
)

MODEL = ModelSpec(name="small", n_layers=4, hidden=512, n_heads=8, n_kv_heads=8,
                  ffn_hidden=1024, vocab=4096)
BLOCK, ADAPTERS, ROOT = 2_622_464, 32_768, 4_194_816
LORA = FineTune(lora_rank=16, lora_targets=("q", "v"), lora_fp32=False)
FULL = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)


def cluster(n: int) -> Cluster:
    return Cluster(gpu=load_gpu("h100-80"), n_gpus=n, gpus_per_node=8,
                   host_ram_bytes_per_node=2**40)


def plan(flat: FlatParams, ft: FineTune = LORA, **kw) -> dict:
    t = TrainingSpec(seq=512, precision=Precision.BF16, fsdp_version=1, flat_params=flat,
                     finetune=ft, **kw)
    return estimate(MODEL, t, cluster(4), FULL, margin=0.0).phases


def test_lora_gradients_cover_the_whole_flat_parameter():
    """The sharded bf16 gradients the optimizer step sees: 4 blocks x ceil(x / 4) x 2 B."""
    apart = plan(FlatParams.APART)[Phase.OPTIMIZER]
    mixed = plan(FlatParams.MIXED)[Phase.OPTIMIZER]
    assert apart.gradients == 4 * (ADAPTERS // 4) * 2 == 65_536
    assert mixed.gradients == 4 * ((BLOCK + ADAPTERS) // 4) * 2 == 5_310_464
    # the optimizer state stays the adapters' (AdamW: 2 states, bf16 adapters)
    assert mixed.optimizer_states == apart.optimizer_states == 4 * ADAPTERS * 2 * 2 // 4


def test_lora_reduce_scatter_input_is_the_whole_unit():
    """A block's reduce-scatter input in the reduce dtype (pure bf16: 2 B), x 2 for FSDP1's
    record_stream-delayed free (docs/model.md 7.5): 2 x 2,655,232 x 2 B, at the end of
    backward."""
    assert plan(FlatParams.MIXED)[Phase.BWD_END].comm_buffers == 2 * (BLOCK + ADAPTERS) * 2
    assert plan(FlatParams.APART)[Phase.BWD_END].comm_buffers == 2 * ADAPTERS * 2


def test_no_sync_holds_the_whole_unsharded_flat_gradients():
    """grad_accum 2 with sync on the last micro-batch only: from the second micro-batch on
    every block's unsharded flat gradient is held (FSDP1: param dtype, 2 B), frozen base
    included; the root is frozen under LoRA and has none."""
    kw = dict(grad_accum=2, grad_sync=GradSync.LAST)
    assert plan(FlatParams.MIXED, **kw)[Phase.FORWARD].gradients == 4 * (BLOCK + ADAPTERS) * 2
    assert plan(FlatParams.APART, **kw)[Phase.FORWARD].gradients == 4 * ADAPTERS * 2


def test_frozen_embeddings_share_the_root_flat_parameter():
    """Full fine-tuning with frozen embeddings: the root unit (embedding, final norm, head)
    has trainable tensors, so under mixed its whole flat parameter gets a gradient, the
    embedding table's 4096 x 512 included: sharded, ceil(4,194,816 / 4) x 2 B beside the
    blocks' 4 x ceil(2,622,464 / 4) x 2 B; apart, the head and the norm only."""
    ft = FineTune(freeze_embeddings=True)
    blocks = 4 * (BLOCK // 4) * 2
    assert plan(FlatParams.MIXED, ft)[Phase.OPTIMIZER].gradients == blocks + ROOT // 4 * 2
    head_norm = 4096 * 512 + 512
    assert plan(FlatParams.APART, ft)[Phase.OPTIMIZER].gradients == blocks + head_norm // 4 * 2


def test_nothing_changes_without_frozen_parameters_or_under_fsdp2():
    full = FineTune()
    assert plan(FlatParams.MIXED, full) == plan(FlatParams.APART, full)
    t = TrainingSpec(seq=512, precision=Precision.BF16, finetune=LORA)
    assert estimate(MODEL, t, cluster(4), FULL, margin=0.0).phases[Phase.OPTIMIZER] \
        .gradients == 65_536


BASE = ("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--strategy", "full_shard",
        "--checkpointing", "full", "--calibration", "none", "--lora-rank", "16")


def test_flag_is_echoed_and_refused_where_it_cannot_be():
    r = run(*BASE, "--fsdp", "1", "--lora-dtype", "base", "--flat-params", "mixed", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["inputs"]["training"]["flat_params"] == "mixed"
    one_line_error(run(*BASE, "--flat-params", "mixed"), 2, "--flat-params", "--fsdp 1")
    one_line_error(run(*BASE, "--fsdp", "1", "--flat-params", "mixed"), 2, "--flat-params",
                   "--lora-dtype base")
    one_line_error(run(*BASE, "--fsdp", "1", "--flat-params", "lumped"), 2, "--flat-params")


def test_cli_llama3_8b_by_hand():
    """Llama-3-8B, LoRA rank 16 on q and v over 8 ranks: a block is 218,112,000 elements, its
    adapters 16 x (4096 + 4096) + 16 x (4096 + 1024) = 212,992; the optimizer moment differs
    by the sharded bf16 gradients alone: 32 x (ceil(218,324,992 / 8) - 212,992 / 8) x 2 B."""
    def optimizer(flat: str) -> int:
        r = run(*BASE, "--fsdp", "1", "--lora-dtype", "base", "--flat-params", flat, "--json")
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["candidates"][0]["phase_allocated_bytes"]["optimizer"]

    assert optimizer("mixed") - optimizer("apart") == 32 * (27_290_624 - 26_624) * 2
