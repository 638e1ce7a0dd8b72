"""The memory model against numbers derived by hand (derivations in each test)."""

from __future__ import annotations

import dataclasses

import pytest

from planner.activations import plan_activations
from planner.memory import Overheads, estimate, optimizer_state_bytes
from planner.params import total_params
from planner.spec import (
    Attention,
    Candidate,
    Checkpointing,
    Cluster,
    ModelSpec,
    MlpKind,
    NormKind,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    PositionKind,
    Precision,
    Strategy,
    TrainingSpec,
)
from tests.conftest import TEST_H100

H100 = TEST_H100

# Llama-2-13B (Touvron et al. 2023; HF config): 40 layers, 5120 hidden, 40 heads, ffn 13824,
# vocab 32000, untied. Published parameter count: 13,015,864,320.
LLAMA2_13B = ModelSpec(name="llama2-13b", n_layers=40, hidden=5120, n_heads=40, n_kv_heads=40,
                       ffn_hidden=13824, vocab=32000)
P13 = 13_015_864_320


def cluster(n: int) -> Cluster:
    return Cluster(gpu=H100, n_gpus=n, gpus_per_node=8, host_ram_bytes_per_node=2 * 2**40)


def test_llama2_13b_parameter_count_is_the_published_one():
    assert total_params(LLAMA2_13B) == P13


def test_13b_ddp_model_states_are_16_bytes_per_param_and_do_not_fit_80gb():
    # bf16-amp AdamW under torch AMP: fp32 params 4 B + fp32 grads 4 B + exp_avg 4 B +
    # exp_avg_sq 4 B = 16 B/param -> 16 x 13,015,864,320 = 208,253,829,120 bytes (208 GB).
    e = estimate(LLAMA2_13B, TrainingSpec(), cluster(8), Candidate(strategy=Strategy.DDP))
    assert e.peak_phase == "optimizer"
    b = e.breakdown
    assert b.params == 4 * P13
    assert b.gradients == 4 * P13
    assert b.optimizer_states == 8 * P13
    assert b.params + b.gradients + b.optimizer_states == 208_253_829_120
    # DDP's reducer buckets are one more fp32 gradient copy (gradient_as_bucket_view=False),
    # and foreach AdamW's sqrt(exp_avg_sq) is one more fp32 copy during the step.
    assert b.comm_buffers == 4 * P13
    assert b.optimizer_temporaries == 4 * P13
    assert not e.fits and e.device_used_bytes > 80 * 10**9


def test_13b_full_shard_on_8_gpus_holds_one_eighth_of_the_states():
    # FULL_SHARD over 8 ranks: every tensor's dim 0 of Llama-2-13B divides by 8, so each rank
    # holds exactly 208,253,829,120 / 8 = 26,031,728,640 bytes of params + grads + Adam.
    e = estimate(LLAMA2_13B, TrainingSpec(), cluster(8), Candidate(strategy=Strategy.FULL_SHARD))
    assert e.shard_degree == 8
    full = estimate(LLAMA2_13B, TrainingSpec(optimizer_impl=OptimizerImpl.FUSED), cluster(8),
                    Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL))
    # With full checkpointing and the fused step the optimizer moment is params + grads + state
    # plus the cuBLAS workspace, nothing else.
    assert full.phases["optimizer"].total == 26_031_728_640 + Overheads().cublas_workspace_bytes
    b = full.phases["optimizer"]
    assert (b.params, b.gradients, b.optimizer_states) == (
        4 * P13 // 8, 4 * P13 // 8, 8 * P13 // 8)
    assert e.fits


def test_zero_stages_follow_the_zero_paper():
    # ZeRO paper (Rajbhandari et al. 2020, sec. 5.1): 2Ψ + 2Ψ + 12Ψ/Nd (P_os),
    # 2Ψ + 14Ψ/Nd (P_os+g), 16Ψ/Nd (P_os+g+p). With Ψ = P13 and Nd = 8:
    psi, nd = P13, 8
    expect = {
        Strategy.ZERO1: 2 * psi + 2 * psi + 12 * psi // nd,
        Strategy.ZERO2: 2 * psi + 14 * psi // nd,
        Strategy.ZERO3: 16 * psi // nd,
    }
    for strategy, states in expect.items():
        e = estimate(LLAMA2_13B, TrainingSpec(), cluster(8),
                     Candidate(strategy=strategy, checkpointing=Checkpointing.FULL))
        # The end-of-backward moment holds the three state terms, the gradient arriving at the
        # embeddings: bf16 (B=1, T=2048, h=5120), and DeepSpeed's engine buffers
        # (stage_1_and_2.py / stage3.py at v0.19.6, docs/model.md "DeepSpeed ZeRO"): a reduce
        # bucket of 5e8 bf16 elements (1e9 B) and the copies being reduced, 1e9 B each (one;
        # three in flight under ZeRO-3's default overlap_comm, the backward fills 27 buckets);
        # ZeRO-1 also copies its own partition into grads_in_partition (2 psi / 8); ZeRO-3
        # keeps the norms whole (81 x 5120 elements < 1e5 threshold, 7/8 of them beyond the
        # rank's share).
        grad_in = 2 * 2048 * 5120
        got = e.phases["bwd_end"].total - Overheads().cublas_workspace_bytes - grad_in
        engine = {Strategy.ZERO1: 2 * psi // nd + 10**9 + 10**9,
                  Strategy.ZERO2: 10**9 + 10**9,
                  Strategy.ZERO3: 10**9 + 3 * 10**9 + (81 * 5120 - 81 * 5120 // 8) * 2}
        assert got == states + engine[strategy], strategy


def test_pure_bf16_adam_is_8_bytes_per_param_no_master():
    # bf16 params 2 + bf16 grads 2 + bf16 exp_avg 2 + bf16 exp_avg_sq 2 = 8 B/param
    e = estimate(LLAMA2_13B, TrainingSpec(precision=Precision.BF16), cluster(1),
                 Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.FULL))
    b = e.breakdown
    assert e.peak_phase == "optimizer"
    assert (b.params, b.gradients, b.optimizer_states) == (2 * P13, 2 * P13, 4 * P13)
    assert b.comm_buffers == 0  # one GPU: no DDP wrapper, no buckets


def test_optimizer_state_sizes():
    m = LLAMA2_13B
    assert optimizer_state_bytes(m, OptimizerKind.SGD, 4, 1) == 0
    assert optimizer_state_bytes(m, OptimizerKind.SGD_MOMENTUM, 4, 1) == 4 * P13
    assert optimizer_state_bytes(m, OptimizerKind.LION, 4, 1) == 4 * P13
    # 8-bit: 2 bytes per param + an fp32 absmax per 2048 values for each of the 2 states
    assert optimizer_state_bytes(m, OptimizerKind.ADAMW_8BIT, 4, 1) == 2 * P13 + 2 * 4 * -(-P13 // 2048)
    # Adafactor on one 5120 x 5120 matrix factors to 5120 + 5120 values instead of 26M
    tiny = ModelSpec(name="t", n_layers=1, hidden=8, n_heads=1, n_kv_heads=1, ffn_hidden=16,
                     vocab=32, tied_embeddings=True)
    # tensors: embed 32x8, norm1 8, q/k/v/o 8x8 each, norm2 8, gate/up 16x8, down 8x16,
    # final_norm 8 -> factored: (32+8) + 4*(8+8) + 2*(16+8) + (8+16) + 3*8 (vectors)
    rows_cols = (32 + 8) + 4 * (8 + 8) + 2 * (16 + 8) + (8 + 16) + 3 * 8
    assert optimizer_state_bytes(tiny, OptimizerKind.ADAFACTOR, 4, 1) == 4 * rows_cols


GPT2 = ModelSpec(name="gpt2", n_layers=12, hidden=768, n_heads=12, n_kv_heads=12,
                 ffn_hidden=3072, vocab=50257, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
                 position=PositionKind.LEARNED, max_positions=1024, bias=True,
                 tied_embeddings=True)


def test_gpt2_block_activations_tensor_by_tensor_bf16_module():
    # GPT-2 small, B=1, T=1024, bf16 module (FSDP MixedPrecisionPolicy): t = 1024 tokens,
    # h = 768, f = 3072, 12 heads. Saved per block (bytes):
    t, h, f = 1024, 768, 3072
    expected = {
        "norm1.input": 2 * t * h,          # LayerNorm saves its bf16 input
        "norm1.mean_rstd": 2 * 4 * t,      # fp32 mean and rstd per row
        "attn.qkv.input": 2 * t * h,       # q, k, v read one normed tensor
        "sdpa.q": 2 * t * h,
        "sdpa.k": 2 * t * h,
        "sdpa.v": 2 * t * h,
        "sdpa.out": 2 * t * h,             # attn.o reads it as a view
        "sdpa.logsumexp": 4 * 12 * 1024,   # fp32 (B, heads, T)
        "norm2.input": 2 * t * h,
        "norm2.mean_rstd": 2 * 4 * t,
        "mlp.input": 2 * t * h,
        "mlp.up_out": 2 * t * f,           # saved by gelu
        "mlp.down.input": 2 * t * f,       # gelu's output
    }
    plan = plan_activations(GPT2, batch=1, seq=1024, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=False)
    assert {s.name: s.nbytes for s in plan.block_saved} == expected
    # 32 t h + 65,536 = 25,231,360 bytes per block
    assert plan.block_bytes == 32 * t * h + 4 * 12 * 1024 + 16 * t == 25_231_360


def test_llama_block_activations_tensor_by_tensor_both_regimes():
    # Llama-2-7B shape: h = 4096, 32 heads (MHA), f = 11008; B=1, T=2048 -> t = 2048.
    m = ModelSpec(name="llama2-7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=32,
                  ffn_hidden=11008, vocab=32000)
    t, h, f = 2048, 4096, 11008
    lse = 4 * 32 * 2048
    module = {  # bf16 module: HF RMSNorm keeps an fp32 copy of its input and the bf16 cast
        "norm1.input_fp32": 4 * t * h, "norm1.rstd": 4 * t, "norm1.normed": 2 * t * h,
        "attn.qkv.input": 2 * t * h,
        "sdpa.q": 2 * t * h, "sdpa.k": 2 * t * h, "sdpa.v": 2 * t * h, "sdpa.out": 2 * t * h,
        "sdpa.logsumexp": lse,
        "norm2.input_fp32": 4 * t * h, "norm2.rstd": 4 * t, "norm2.normed": 2 * t * h,
        "mlp.input": 2 * t * h,
        "mlp.gate_out": 2 * t * f, "mlp.act_out": 2 * t * f, "mlp.up_out": 2 * t * f,
        "mlp.down.input": 2 * t * f,
    }
    plan = plan_activations(m, batch=1, seq=2048, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=False)
    assert {s.name: s.nbytes for s in plan.block_saved} == module
    autocast = {  # fp32 residual: the norm's input is the fp32 stream itself, normed stays
        # fp32, and q, k, v (and gate, up) each save their own bf16 cast of it
        "norm1.input_fp32": 4 * t * h, "norm1.rstd": 4 * t, "norm1.normed": 4 * t * h,
        "attn.q.input_cast": 2 * t * h, "attn.k.input_cast": 2 * t * h,
        "attn.v.input_cast": 2 * t * h,
        "sdpa.q.rope_cast": 2 * t * h, "sdpa.k.rope_cast": 2 * t * h, "sdpa.v": 2 * t * h,
        "sdpa.out": 2 * t * h, "sdpa.logsumexp": lse,
        "norm2.input_fp32": 4 * t * h, "norm2.rstd": 4 * t, "norm2.normed": 4 * t * h,
        "mlp.in0.input_cast": 2 * t * h, "mlp.in1.input_cast": 2 * t * h,
        "mlp.gate_out": 2 * t * f, "mlp.act_out": 2 * t * f, "mlp.up_out": 2 * t * f,
        "mlp.down.input": 2 * t * f,
    }
    plan = plan_activations(m, batch=1, seq=2048, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=True)
    assert {s.name: s.nbytes for s in plan.block_saved} == autocast


def test_full_checkpointing_keeps_only_block_inputs():
    m = LLAMA2_13B
    plan = plan_activations(m, batch=2, seq=4096, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.FULL,
                            uses_autocast=False)
    # one bf16 (B, T, h) input per block: 2 * 2 * 4096 * 5120 bytes
    assert plan.block_kept == 2 * 2 * 4096 * 5120
    assert plan.recompute == plan.block_bytes


def test_eager_attention_keeps_the_scores():
    m = LLAMA2_13B
    sdpa = plan_activations(m, batch=1, seq=4096, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=False)
    eager = plan_activations(m, batch=1, seq=4096, precision=Precision.BF16_AMP,
                             attention=Attention.EAGER, checkpointing=Checkpointing.NONE,
                             uses_autocast=False)
    # eager adds the fp32 probabilities + their bf16 cast: 6 bytes x heads x T^2, and drops
    # sdpa's fp32 logsumexp (4 x heads x T). attn.o's input is a copy in eager (o is
    # (B, heads, T, d), so reshape copies) where sdpa kept its output: same 2 t qd bytes.
    diff = 6 * 40 * 4096 * 4096 - 4 * 40 * 4096
    assert eager.block_bytes - sdpa.block_bytes == diff


def test_offload_moves_states_to_host_and_checks_host_ram():
    m = LLAMA2_13B
    e = estimate(m, TrainingSpec(), cluster(8),
                 Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.PARAMS_AND_OPTIMIZER,
                           checkpointing=Checkpointing.FULL))
    assert e.breakdown.params == 0 and e.breakdown.optimizer_states == 0
    # host: 16 B/param / 8 ranks per rank, 8 ranks per node, plus 4 GiB per process
    assert e.host_bytes_per_node == 8 * (16 * P13 // 8) + 8 * 4 * 2**30
    small_host = Cluster(gpu=H100, n_gpus=8, gpus_per_node=8, host_ram_bytes_per_node=64 * 2**30)
    e2 = estimate(m, TrainingSpec(), small_host, e.candidate)
    assert e2.fits_gpu and not e2.fits_host and not e2.fits


def test_unsupported_combinations_are_refused():
    from planner.memory import UnsupportedCandidate

    with pytest.raises(UnsupportedCandidate, match="ddp"):
        estimate(LLAMA2_13B, TrainingSpec(), cluster(8),
                 Candidate(strategy=Strategy.DDP, offload=Offload.OPTIMIZER))


def test_hybrid_shard_shards_within_a_node():
    e = estimate(LLAMA2_13B, TrainingSpec(), cluster(32),
                 Candidate(strategy=Strategy.HYBRID_SHARD, checkpointing=Checkpointing.FULL))
    assert e.shard_degree == 8
    assert e.nccl_bytes == 2 * Overheads().nccl_bytes_per_communicator  # shard + replicate


def test_dropout_keeps_one_byte_masks():
    # GPT-2 small trains with dropout 0.1 on the attention output, the MLP output and the
    # attention probabilities: bool masks of t*h, t*h and heads*T^2 bytes (B=1, T=1024).
    t, h = 1024, 768
    plain = plan_activations(GPT2, batch=1, seq=1024, precision=Precision.BF16_AMP,
                             attention=Attention.EAGER, checkpointing=Checkpointing.NONE,
                             uses_autocast=False)
    drop = plan_activations(dataclasses.replace(GPT2, dropout=0.1), batch=1, seq=1024,
                            precision=Precision.BF16_AMP, attention=Attention.EAGER,
                            checkpointing=Checkpointing.NONE, uses_autocast=False)
    assert drop.block_bytes - plain.block_bytes == 2 * t * h + 12 * 1024 * 1024
    assert drop.root_bytes - plain.root_bytes == t * h  # the embeddings' dropout


def test_selective_is_op_level_sac():
    # torchtitan's policy: in each block save every other mm output (1st, 3rd, 5th, 7th: q, v,
    # gate, down) and the SDPA output + logsumexp; keep the block input. Llama-3.1-8B shape
    # (h 4096, 32 heads, 8 kv heads -> kv 1024, ffn 14336), B=2, T=8192, bf16 module:
    m = ModelSpec(name="l3", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden=14336, vocab=128256)
    t = 2 * 8192
    kept = 2 * t * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 2 * 32 * 8192
    plan = plan_activations(m, batch=2, seq=8192, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.SELECTIVE,
                            uses_autocast=False)
    assert plan.block_kept == kept == 1_042_284_544


def test_grad_accumulation_keeps_gradients_through_later_forwards():
    # grad_accum = 2: the 2nd micro-batch's forward runs with the 1st one's gradients alive:
    # DDP keeps every fp32 grad (4 x P13 bytes), FULL_SHARD over 8 its shard (4 x P13 / 8).
    for strategy, grads in ((Strategy.DDP, 4 * P13), (Strategy.FULL_SHARD, 4 * P13 // 8)):
        one = estimate(LLAMA2_13B, TrainingSpec(), cluster(8), Candidate(strategy=strategy))
        two = estimate(LLAMA2_13B, TrainingSpec(grad_accum=2), cluster(8),
                       Candidate(strategy=strategy))
        assert two.phases["forward"].total - one.phases["forward"].total == grads, strategy


def test_peak_is_the_moment_the_device_holds_most():
    """The fit is judged on allocated + the allocator's reserve at each moment: ZeRO-1 on 4
    GPUs must not look smaller than on 8 because its peak was picked on allocated bytes only
    (the cached segments are held before the end of backward, not at the step)."""
    from planner.spec import OptimizerKind

    model = ModelSpec(name="m", n_layers=37, hidden=8192, n_heads=64, n_kv_heads=4,
                      ffn_hidden=22016, vocab=50257)
    training = TrainingSpec(seq=4096, micro_batch=8, precision=Precision.FP16_AMP,
                            optimizer=OptimizerKind.LION)
    cand = Candidate(strategy=Strategy.ZERO1, checkpointing=Checkpointing.FULL)
    used = {n: estimate(model, training, cluster(n), cand) for n in (2, 4, 8)}
    assert used[2].device_used_bytes >= used[4].device_used_bytes >= used[8].device_used_bytes
    for e in used.values():
        held = {p: b.total for p, b in e.phases.items()}
        assert e.peak_allocated_bytes == max(held.values())
        assert e.peak_reserved_bytes == e.breakdown.total + e.allocator_overhead_bytes
        assert e.breakdown == e.phases[e.peak_phase]


def test_13b_full_shard_reserved_peaks_with_the_other_streams_caches():
    """docs/model.md §9 worked example, FULL_SHARD on 8 H100, no checkpointing: the fit is
    decided at block_bwd, reserved peaks at loss_bwd (§7.4). By hand: 40,858,293,760 allocated
    (§9's table) + int(0.08 x 40,858,293,760) = 3,268,663,500 + the previous step's sharded
    fp32 gradients on the reduce-scatter stream ceil(P/8) x 4 = 6,507,932,160 + the root's
    bf16 all-gather output on the copy-in stream P_root x 2 = 327,685,120 x 2 = 655,370,240
    and its fp32 -> bf16 shard casts 655,370,240 / 8 = 81,921,280 = 51,372,180,940 B."""
    e = estimate(LLAMA2_13B, TrainingSpec(), cluster(8),
                 Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE))
    assert e.peak_phase == "block_bwd"
    assert e.phases["loss_bwd"].total == 40_858_293_760
    assert e.phase_reserved_bytes()["loss_bwd"] == 51_372_180_940
    assert e.peak_reserved_bytes == 51_372_180_940
