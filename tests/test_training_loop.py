"""The training loop people actually run: gradient sync, the loss, compile, the allocator,
FSDP1, loading. Expected bytes are derived by hand from the PyTorch source named in each test
(or measured: the compiled saved set)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import cluster, run
from planner.compiled import DATA_PATH, family_key, saved_bytes
from planner.memory import Phase, estimate
from planner.params import count, total_params
from planner.spec import (
    Allocator,
    Attention,
    Candidate,
    Checkpointing,
    CompileMode,
    GradSync,
    InitMode,
    LossKind,
    ModelSpec,
    Precision,
    Strategy,
    TrainingSpec,
)

MODEL = ModelSpec(name="m", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1536,
                  vocab=32000)
FS = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
DDP = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.NONE)
P = total_params(MODEL)


def est(cand=FS, n=8, **training):
    return estimate(MODEL, TrainingSpec(**training), cluster(n), cand)


# ---- gradient accumulation without sync ------------------------------------------------------


def test_fsdp2_no_sync_keeps_unsharded_fp32_gradients():
    """FSDP2 set_requires_gradient_sync(False): _fsdp_param.py to_accumulated_grad_if_needed
    upcasts each unit's bf16 unsharded gradient to the fp32 reduce dtype and keeps it; later
    micro-batches run forward on top of all of them (P x 4 bytes, not the P/8 x 4 shard)."""
    every = est(grad_accum=4)
    last = est(grad_accum=4, grad_sync=GradSync.LAST)
    assert every.phases[Phase.FORWARD].gradients == -(-P // 8) * 4
    assert last.phases[Phase.FORWARD].gradients == P * 4
    # one micro-batch: nothing to keep
    assert est(grad_sync=GradSync.LAST).phases[Phase.FORWARD].gradients == 0
    # after the last reduce-scatter the step sees the same sharded gradients
    assert last.phases[Phase.OPTIMIZER] == every.phases[Phase.OPTIMIZER]


def test_fsdp1_no_sync_keeps_low_precision_gradients():
    """FSDP1 no_sync(): _runtime_utils._post_backward_hook returns before casting the
    unsharded flat_param.grad to the reduce dtype: bf16, P x 2 bytes."""
    e = est(grad_accum=4, grad_sync=GradSync.LAST, fsdp_version=1)
    assert e.phases[Phase.FORWARD].gradients == P * 2
    # pure bf16 (reduce dtype = param dtype): FSDP2 keeps them in bf16 too
    e2 = est(grad_accum=4, grad_sync=GradSync.LAST, precision=Precision.BF16)
    assert e2.phases[Phase.FORWARD].gradients == P * 2


def test_ddp_no_sync_changes_time_not_memory():
    a = est(DDP, grad_accum=4)
    b = est(DDP, grad_accum=4, grad_sync=GradSync.LAST)
    assert a.phases == b.phases


def test_cli_grad_sync_flag():
    base = ["--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--strategy", "full_shard",
            "--grad-accum", "4", "--checkpointing", "full", "--json"]
    every = json.loads(run(*base).stdout)["candidates"][0]
    last = json.loads(run(*base, "--grad-sync", "last").stdout)["candidates"][0]
    # llama3-8b: 8,030,261,248 params x 4 B, less the 1/8 shard that every-sync holds
    grow = last["peak_allocated_bytes"] - every["peak_allocated_bytes"]
    assert grow == pytest.approx(8_030_261_248 * 4 * 7 / 8, rel=0.02)


# ---- the loss --------------------------------------------------------------------------------


def _loss(**kw):
    e = est(cand=FS, seq=1024, micro_batch=2, **kw)
    return e.phases[Phase.FORWARD], e.phases[Phase.LOSS_BWD]


def test_loss_variants_by_hand():
    t, V, c = 2048, 32000, 2
    fwd32, bwd32 = _loss()
    fwd16, bwd16 = _loss(loss=LossKind.BF16)
    fwdc, bwdc = _loss(loss=LossKind.CHUNKED, loss_chunks=8)
    # fp32: logits (c t V) + fp32 copy (4 t V) at the loss, log_softmax saves 4 t V
    # bf16: logits only, log_softmax saves c t V
    assert fwd32.transients - fwd16.transients == 4 * t * V
    assert fwd32.activations - fwd16.activations == (4 - c) * t * V
    # backward: 2 x 4 t V fp32 gradients vs 2 x c t V
    assert bwd32.transients - bwd16.transients == 2 * (4 - c) * t * V
    # chunked: one chunk's fp32 copy at a time; backward one chunk's 2 fp32 grads + cast
    assert fwdc.transients == c * t * V + 4 * t * V // 8
    assert bwdc.transients == (2 * 4 * t * V + c * t * V) // 8
    assert fwdc.activations == fwd32.activations  # the log_softmax outputs are all saved


def test_fused_loss_keeps_gradients_not_logits():
    """Liger's fused linear cross-entropy: chunks of next_pow2(ceil(t / ceil(V/h))) tokens,
    the input's gradient (c t h) and the head's weight gradient kept for backward."""
    t, V, h, c = 2048, 32000, 512, 2
    fwd, bwd = _loss(loss=LossKind.FUSED)
    fwd32, _ = _loss()
    chunk = 64  # ceil(V/h) = 63; ceil(2048 / 63) = 33 -> 64
    assert fwd.transients == c * chunk * (V + h)
    assert fwd.activations - fwd32.activations == (c * t * h + c * V * h) - 4 * t * V
    assert bwd.transients == 0


def test_kept_logits_stay_through_backward():
    t, V = 2048, 32000
    base = est(seq=1024, micro_batch=2)
    kept = est(seq=1024, micro_batch=2, keep_logits=True)
    # the held logits are the model's bf16 output; the loss's fp32 copy is freed once
    # log_softmax has run (traced: tests/test_trace_effects.py test_kept_logits_are_the_bf16_logits)
    for phase in (Phase.LOSS_BWD, Phase.BLOCK_BWD, Phase.BWD_END, Phase.OPTIMIZER):
        assert kept.phases[phase].total - base.phases[phase].total == 2 * t * V, phase


# ---- torch.compile ---------------------------------------------------------------------------


def test_compile_uses_the_measured_saved_set():
    """A compiled block keeps what the min-cut partitioner saves (probes/compiled.py measured
    it; planner/data/compiled_blocks.json), not the eager count."""
    eager = est(seq=1024)
    comp = est(seq=1024, compile=CompileMode.BLOCKS)
    kept = saved_bytes(MODEL, batch=1, seq=1024, autocast=False, attention=Attention.SDPA)
    assert kept is not None and 0 < kept < eager.phases[Phase.FORWARD].activations / 4
    assert comp.phases[Phase.FORWARD].activations - eager.phases[Phase.FORWARD].activations \
        == 4 * kept - 4 * _eager_block(1024)
    # under checkpointing compile keeps what the checkpoint keeps
    full = dataclasses.replace(FS, checkpointing=Checkpointing.FULL)
    assert est(full, seq=1024, compile=CompileMode.BLOCKS).phases == est(full, seq=1024).phases


def _eager_block(seq: int) -> int:
    from planner.memory import activation_plan

    return activation_plan(MODEL, TrainingSpec(seq=seq), FS).block_kept


def test_compiled_table_is_one_entry_per_preset_family():
    with open(DATA_PATH, encoding="utf-8") as f:
        doc = json.load(f)
    from planner.presets import PRESETS

    from planner.compiled import measurable

    for m in PRESETS.values():
        if not measurable(m):  # MoE, or a block the reference module cannot build
            continue
        for autocast in (False, True):
            assert family_key(m, autocast, Attention.SDPA) in doc["families"], m.name


# ---- the allocator ---------------------------------------------------------------------------


def test_expandable_segments_hold_only_the_loss_gap():
    """Expandable segments: freed pages serve any request of their stream, so nothing is held
    that cannot be released; DDP uses the default stream only; what stays reserved and free is
    the loss's gap (docs/model.md §7.4): bf16 logits (2 B) upcast to fp32 and freed before
    backward leave 2 B per logit that the backward's fp32 gradients (4 B) cannot fill.
    1 x 2048 tokens x 32000 vocab x 2 B = 131,072,000 B at the loss's backward."""
    d = est(DDP, n=1)
    x = est(DDP, n=1, allocator=Allocator.EXPANDABLE)
    assert x.breakdown == d.breakdown
    assert x.allocator_overhead_bytes == 0
    gap = 2 * 2048 * 32000
    loss_bwd = x.phases[Phase.LOSS_BWD].total
    assert x.phase_reserved_bytes()["loss_bwd"] == loss_bwd + gap
    assert x.phase_reserved_bytes()["forward"] == x.phases[Phase.FORWARD].total
    # the default allocator holds no gap (its fixed fraction instead)
    assert d.phase_reserved_bytes()["loss_bwd"] == loss_bwd + int(loss_bwd * 0.08)


def test_loss_gap_under_tensor_parallel_is_the_local_logits():
    """torchtitan's loss_parallel: each rank upcasts its vocab shard, and the DTensor loss's
    backward leaves the shard's bf16 logits free (probes/alloc_loss.py loss_parallel_region,
    measured by the allocator emulator: 2.00 B per local logit). FSDP 4 x TP 2, bf16-amp
    (FSDP2 param_dtype bf16), micro-batch 1 x 2048 tokens, vocab 32000 / 2 = 16000 per rank:
    2 B x 2048 x 16000 = 65,536,000 B reserved and free at the loss's backward."""
    from planner.activations import plan_activations

    kw = dict(batch=1, seq=2048, precision=Precision.BF16_AMP, attention=Attention.SDPA,
              checkpointing=Checkpointing.FULL, uses_autocast=False)
    assert plan_activations(MODEL, tp=2, **kw).loss_gap == 65_536_000
    assert plan_activations(MODEL, tp=1, **kw).loss_gap == 2 * 2048 * 32000  # unchanged
    assert plan_activations(MODEL, tp=2, keep_logits=True, **kw).loss_gap == 0
    # and the estimate adds it at loss_bwd only with expandable segments
    tp2 = dataclasses.replace(FS, tp=2, checkpointing=Checkpointing.FULL)
    x = est(tp2, allocator=Allocator.EXPANDABLE, precision=Precision.BF16_AMP)
    d = est(tp2, allocator=Allocator.EXPANDABLE, precision=Precision.BF16_AMP, keep_logits=True)
    assert x.phase_reserved_bytes()["loss_bwd"] - x.phases[Phase.LOSS_BWD].total \
        - (d.phase_reserved_bytes()["loss_bwd"] - d.phases[Phase.LOSS_BWD].total) == 65_536_000


def test_fsdp2_other_streams_cache_the_previous_steps_buffers():
    """FSDP2 on 8 GPUs, bf16-amp (fp32 storage and reduce, bf16 all-gather), default allocator:
    at the forward the previous step's sharded fp32 gradients sit free in the reduce-scatter
    stream's pool (P / 8 x 4 B), and the copy-in stream keeps the largest unit's all-gather
    buffers: the root (embedding 32000 x 512 + output 32000 x 512 + final norm 512 =
    32,768,512 params, padded to 8: 32,768,512) in bf16, 65,537,024 B, plus its fp32 -> bf16
    shard casts (1/8: 8,192,128 B) = 73,729,152 B."""
    e = est()
    fwd = e.phases[Phase.FORWARD]
    frag = int(fwd.total * 0.08)
    grads = -(-P // 8) * 4
    assert e.phase_reserved_bytes()["forward"] == fwd.total + frag + grads + 73_729_152


# ---- FSDP1 -----------------------------------------------------------------------------------


def test_fsdp1_holds_one_more_unit_and_reduce_input():
    """record_stream-delayed frees: one more gathered unit (bf16) and one more fp32
    reduce-scatter input than FSDP2."""
    unit = count(MODEL).per_block
    two, one = est(), est(fsdp_version=1)
    assert one.phases[Phase.FORWARD].gathered_params - two.phases[Phase.FORWARD].gathered_params \
        == unit * 2
    bb1, bb2 = one.phases[Phase.BLOCK_BWD], two.phases[Phase.BLOCK_BWD]
    assert bb1.total > bb2.total


# ---- loading ---------------------------------------------------------------------------------


def test_init_modes_gpu_and_host():
    n = 8
    meta = est(n=n)
    full_gpu = est(n=n, init=InitMode.FULL_GPU)
    rank0 = est(n=n, init=InitMode.RANK0)
    full = est(n=n, init=InitMode.FULL)
    shard = -(-P // 8) * 4
    assert meta.phases[Phase.INIT].total == shard
    assert rank0.phases[Phase.INIT].total == shard + count(MODEL).per_block * 4
    assert full_gpu.phases[Phase.INIT].total == P * 4  # model.to("cuda") before sharding
    per_process = 4 * 2**30
    assert meta.host_bytes_per_node == n * per_process
    assert rank0.host_bytes_per_node == n * per_process + P * 4
    assert full.host_bytes_per_node == n * per_process + n * P * 4


def test_full_load_of_70b_on_8_ranks_exhausts_host_ram():
    r = run("--model", "llama3-70b", "--gpu", "h100-80", "--n", "8", "--init", "full", "--json")
    cands = json.loads(r.stdout)["candidates"]
    # 8 ranks x 70.55e9 x 4 B = 2.26 TB > the DGX H100's 2 TiB
    assert all(not c["fits_host"] for c in cands if c["strategy"] != "zero3")
