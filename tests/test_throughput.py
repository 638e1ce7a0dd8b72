"""Step-time model: every expected number below is derived by hand in the comments.

The toy model used throughout (Llama-style: SwiGLU, RMSNorm, no biases, untied head):
    n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab=100
    d_head = 64/4 = 16, q_dim = 4*16 = 64, kv_dim = 2*16 = 32
    matmul weights per block: q 64*64=4096, k 32*64=2048, v 2048, o 64*64=4096  -> 12288
                              gate/up/down 3*64*128 = 24576                      -> 36864
    N_mm = 2 blocks * 36864 + head 100*64 (6400) = 73728 + 6400 = 80128
    total params (params.py layout) = 2 * (36864 + 2 norms*64) + embed 6400 + final norm 64
                                      + head 6400 = 73984 + 12864 = 86848
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    GpuProfile,
    GradSync,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.throughput import (
    StepEstimate,
    ThroughputAssumptions,
    all_gather_bytes,
    all_reduce_bytes,
    estimate_step,
    model_flops_per_token,
    reduce_scatter_bytes,
    training_flops_per_token,
)

TOY = ModelSpec(name="toy", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                vocab=100)  # fmt: skip
P_TOTAL = 86848

# Round-number GPU: 100 TFLOP/s bf16, NVLink 1 GB/s, network 10 MB/s per GPU, PCIe 1 GB/s.
GPU = GpuProfile(
    id="toy-gpu", name="Toy GPU", vendor="none", memory_bytes=2**30, bf16_tflops=100.0,
    fp16_tflops=100.0, tf32_tflops=50.0, fp32_tflops=10.0, hbm_bandwidth_bytes_per_s=1e12,
    intra_node_link="toy", intra_node_bandwidth_bytes_per_s=1e9,
    inter_node_bandwidth_bytes_per_s=1e7, gpus_per_node=8, host_ram_bytes_per_node=2**34,
    pcie_bandwidth_bytes_per_s=1e9, cuda_context_bytes=0,
)  # fmt: skip
# Efficiencies 1 and zero latency so that the hand numbers are exact.
EXACT = ThroughputAssumptions(
    compute_efficiency=0.5, intra_node_comm_efficiency=1.0, inter_node_comm_efficiency=1.0,
    intra_node_hop_latency_s=0.0, inter_node_hop_latency_s=0.0, overlap_fraction=1.0,
    pcie_efficiency=1.0, cpu_adam_params_per_s=1e6,
)  # fmt: skip


def run(strategy: Strategy, n: int = 8, *, seq: int = 32, mb: int = 1, ga: int = 1,
        precision: Precision = Precision.BF16_AMP, ckpt: Checkpointing = Checkpointing.NONE,
        offload: Offload = Offload.NONE, assumptions: ThroughputAssumptions = EXACT,
        gpu: GpuProfile = GPU, grad_sync: GradSync = GradSync.EVERY) -> StepEstimate:  # fmt: skip
    cluster = Cluster(gpu=gpu, n_gpus=n, gpus_per_node=8, host_ram_bytes_per_node=2**34)
    training = TrainingSpec(seq=seq, micro_batch=mb, grad_accum=ga, precision=precision,
                            grad_sync=grad_sync)
    cand = Candidate(strategy=strategy, checkpointing=ckpt, offload=offload)
    return estimate_step(TOY, training, cluster, cand, assumptions)


# ---- FLOPs -----------------------------------------------------------------------------------


def test_model_flops_per_token_by_hand():
    # 6 * N_mm = 6 * 80128 = 480768; attention 12 * L * seq * q_dim = 12 * 2 * 32 * 64 = 49152
    assert model_flops_per_token(TOY, 32) == 480768 + 49152 == 529920


def test_recompute_flops_by_hand():
    # FULL: one more block forward but its last matmul (the MLP's down projection, 64 x 128 =
    # 8192 weights: non-reentrant checkpoint's early stop): 2 * 2 * (36864 - 8192) = 114688,
    # plus attention forward 4 * L * seq * q_dim = 4 * 2 * 32 * 64 = 16384 (the head is not
    # re-run)
    assert training_flops_per_token(TOY, 32, Checkpointing.FULL) == 529920 + 114688 + 16384
    # SELECTIVE (op-level SAC, torchtitan's policy): every other matmul is re-run, about half
    # the block matmul forward: 0.5 * 147456 = 73728; the SDPA output is kept (no attention)
    assert training_flops_per_token(TOY, 32, Checkpointing.SELECTIVE) == 529920 + 73728
    assert training_flops_per_token(TOY, 32, Checkpointing.NONE) == 529920


def test_tied_head_still_counts_as_a_matmul():
    tied = ModelSpec(name="t", n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128,
                     vocab=100, tied_embeddings=True)  # fmt: skip
    assert model_flops_per_token(tied, 32) == 529920


def test_auto_checkpointing_is_rejected():
    with pytest.raises(ValueError, match="AUTO"):
        run(Strategy.DDP, ckpt=Checkpointing.AUTO)


# ---- collective volumes ----------------------------------------------------------------------


def test_ring_volumes():
    # all-reduce 2(n-1)/n, all-gather / reduce-scatter (n-1)/n (NCCL busbw factors)
    assert all_reduce_bytes(8, 4e9) == 2 * 7 / 8 * 4e9 == 7e9
    assert all_gather_bytes(8, 2e9) == 7 / 8 * 2e9 == 1.75e9
    assert reduce_scatter_bytes(4, 1e9) == 0.75e9


def test_ddp_all_reduce_of_fp32_grads_single_node():
    # bf16-amp DDP reduces the fp32 grads: 86848 * 4 = 347392 B; ring all-reduce over 8 GPUs:
    # 2 * 7/8 * 347392 = 607936 B at 1e9 B/s (NVLink, one node) = 6.07936e-4 s
    est = run(Strategy.DDP)
    assert est.comm_s == pytest.approx(607936 / 1e9, rel=1e-12)


def test_ddp_all_reduce_per_micro_batch_unless_no_sync():
    # a plain loop all-reduces after every micro-batch's backward: 4 x 2 x 7/8 x 347392 B
    assert run(Strategy.DDP, ga=4).comm_s == pytest.approx(4 * 607936 / 1e9, rel=1e-12)
    # no_sync on all but the last: once per optimizer step whatever grad_accum is
    assert run(Strategy.DDP, ga=4, grad_sync=GradSync.LAST).comm_s == pytest.approx(
        607936 / 1e9, rel=1e-12)


def test_fsdp_no_sync_reduce_scatters_once_per_step():
    # bf16-amp FULL_SHARD, 3 micro-batches: 2 AG per micro-batch (303968 B each time), the
    # fp32 reduce-scatter (303968 B) only after the last backward
    est = run(Strategy.FULL_SHARD, ga=3, grad_sync=GradSync.LAST)
    assert est.comm_s == pytest.approx((3 * 303968 + 303968) / 1e9, rel=1e-12)


def test_full_shard_pure_bf16_is_three_times_param_bytes():
    # pure bf16: 2 all-gathers + 1 reduce-scatter of 86848 * 2 B, each 7/8 of it per GPU:
    # 3 * 7/8 * 173696 = 455952 B -> 4.55952e-4 s at 1e9 B/s
    est = run(Strategy.FULL_SHARD, precision=Precision.BF16)
    assert est.comm_s == pytest.approx(455952 / 1e9, rel=1e-12)


def test_full_shard_amp_gathers_bf16_reduces_fp32():
    # bf16-amp: 2 AG of bf16 params (2 * 7/8 * 173696 = 303968) + RS of fp32 grads
    # (7/8 * 347392 = 303968) = 607936 B per micro-batch; x3 micro-batches
    assert run(Strategy.FULL_SHARD).comm_s == pytest.approx(607936 / 1e9, rel=1e-12)
    assert run(Strategy.FULL_SHARD, ga=3).comm_s == pytest.approx(3 * 607936 / 1e9, rel=1e-12)


def test_shard_grad_op_one_gather_per_micro_batch():
    # 1 AG bf16 (151984) + 1 RS fp32 (303968) = 455952 B
    assert run(Strategy.SHARD_GRAD_OP).comm_s == pytest.approx(455952 / 1e9, rel=1e-12)


def test_zero1_and_zero2_reduce_half_precision_grads():
    # DeepSpeed reduces grads in the compute dtype (2 B) and all-gathers updated bf16 params
    # once per step: RS 7/8 * 173696 + AG 7/8 * 173696 = 303968 B (= an all-reduce of bf16)
    assert run(Strategy.ZERO1).comm_s == pytest.approx(303968 / 1e9, rel=1e-12)
    # ZeRO-2 reduce-scatters every micro-batch: 2 * 151984 + 151984 with ga=2
    assert run(Strategy.ZERO2, ga=2).comm_s == pytest.approx(3 * 151984 / 1e9, rel=1e-12)


def test_group_spanning_nodes_is_network_bound():
    # FULL_SHARD over 16 GPUs on 2 nodes: ring bus bandwidth = min(NVLink 1e9,
    # 8 GPUs/node * 1e7 network per GPU) = 8e7 B/s. Bytes: 15/16 * 86848 * (2 + 2 + 4) = 651360
    est = run(Strategy.FULL_SHARD, n=16)
    assert est.comm_s == pytest.approx(651360 / 8e7, rel=1e-12)


def test_hybrid_cross_node_term_uses_inter_node_bandwidth():
    # HYBRID_SHARD on 16 GPUs = 2 nodes x 8: inside the node as FULL_SHARD over 8 GPUs
    # (607936 B at 1e9 B/s) + all-reduce of the fp32 gradient shard (86848/8 * 4 = 43424 B)
    # across the 2 replicas: 2 * 1/2 * 43424 = 43424 B at the network's 1e7 B/s
    est = run(Strategy.HYBRID_SHARD, n=16)
    assert est.comm_s == pytest.approx(607936 / 1e9 + 43424 / 1e7, rel=1e-12)
    # and only that term moves when the network is 10x faster
    from dataclasses import replace

    fast = run(Strategy.HYBRID_SHARD, n=16, gpu=replace(GPU, inter_node_bandwidth_bytes_per_s=1e8))
    assert est.comm_s - fast.comm_s == pytest.approx(43424 / 1e7 - 43424 / 1e8, rel=1e-9)


def test_hybrid_on_one_node_equals_full_shard():
    assert run(Strategy.HYBRID_SHARD).comm_s == run(Strategy.FULL_SHARD).comm_s


def test_latency_term_counts_ring_hops():
    # FULL_SHARD on 8 GPUs: 3 collectives per unit, 3 units (2 blocks + root), 7 hops each,
    # 1e-6 s per hop -> 63e-6 s on top of the bandwidth term
    lat = ThroughputAssumptions(**{**_fields(EXACT), "intra_node_hop_latency_s": 1e-6})
    est = run(Strategy.FULL_SHARD, assumptions=lat)
    assert est.comm_s == pytest.approx(607936 / 1e9 + 63e-6, rel=1e-12)


def _fields(a: ThroughputAssumptions) -> dict:
    return {k: getattr(a, k) for k in a.__slots__}


# ---- compute, overlap, MFU -------------------------------------------------------------------


def test_compute_time_by_hand():
    # 1 GPU, seq 32, mb 2: 64 tokens * 529920 FLOPs = 33914880 FLOPs at 100e12 * 0.5
    est = run(Strategy.DDP, n=1, mb=2)
    assert est.compute_s == pytest.approx(33914880 / 50e12, rel=1e-12)
    assert est.flops_per_step == 33914880
    assert est.comm_s == 0.0 and est.exposed_comm_s == 0.0
    assert est.tokens_per_s_per_gpu == pytest.approx(64 / est.step_time_s)


def test_mfu_of_compute_bound_case_equals_assumed_efficiency():
    assert run(Strategy.DDP, n=1).mfu == pytest.approx(0.5, rel=1e-12)
    # full recompute: same model FLOPs, more executed: 0.5 * 529920 / 660992
    # (660992 = 529920 + 114688 + 16384, test_recompute_flops_by_hand)
    full = run(Strategy.DDP, n=1, ckpt=Checkpointing.FULL)
    assert full.mfu == pytest.approx(0.5 * 529920 / 660992, rel=1e-12)
    assert full.flops_per_step == 32 * 660992


def test_ddp_exposed_comm_is_what_backward_cannot_hide():
    # backward compute of the toy, 32 tokens: 4 * 80128 + 8 * 2 * 32 * 64 = 353280 FLOPs/token
    # -> 32 * 353280 / 50e12 = 2.260992e-7 s; the all-reduce takes 6.07936e-4 s.
    # Exposed = max(last bucket, comm - bwd). The default 25 MiB bucket holds all 347392 B of
    # grads, so the last bucket is the whole all-reduce: nothing can be hidden.
    est = run(Strategy.DDP)
    assert est.exposed_comm_s == pytest.approx(607936 / 1e9, rel=1e-12)
    # with 1 kB buckets the tail is 1024/347392 of the comm, and comm - bwd dominates
    small = ThroughputAssumptions(**{**_fields(EXACT), "ddp_bucket_bytes": 1024})
    est = run(Strategy.DDP, assumptions=small)
    assert est.exposed_comm_s == pytest.approx(607936 / 1e9 - 32 * 353280 / 50e12, rel=1e-12)
    assert est.step_time_s == pytest.approx(est.compute_s + est.exposed_comm_s, rel=1e-12)


def test_fsdp_comm_hidden_behind_long_compute():
    # seq 8192, mb 64 on a slow GPU: compute >> comm, so only the first unit's gather and the
    # last unit's reduce stay exposed: 1/3 of the forward gather + 1/3 of (bwd gather + RS)
    slow = GpuProfile(**{**{k: getattr(GPU, k) for k in GPU.__slots__}, "bf16_tflops": 0.001})
    est = run(Strategy.FULL_SHARD, seq=8192, mb=64, gpu=slow)
    ag = 7 / 8 * 173696 / 1e9
    rs = 7 / 8 * 347392 / 1e9
    assert est.exposed_comm_s == pytest.approx(ag / 3 + (ag + rs) / 3, rel=1e-12)


def test_offload_adds_pcie_and_cpu_time():
    # OPTIMIZER offload under FULL_SHARD on 8 GPUs: local shard 86848/8 = 10856 params;
    # grads down (fp32, 4 B) + updated bf16 params up (2 B) = 65136 B at 1e9 B/s,
    # CPU Adam 10856 params at 1e6 params/s = 0.010856 s
    base = run(Strategy.FULL_SHARD)
    off = run(Strategy.FULL_SHARD, offload=Offload.OPTIMIZER)
    assert off.offload_s == pytest.approx(65136 / 1e9 + 0.010856, rel=1e-12)
    assert off.step_time_s - base.step_time_s == pytest.approx(off.offload_s, rel=1e-9)
    # params_and_optimizer, ga=2: fp32 shard up before forward and backward of each
    # micro-batch (4 B * 10856 * 2 * 2 = 173696) + fp32 grads down per micro-batch
    # (4 B * 10856 * 2 = 86848) = 260544 B, + the CPU step
    po = run(Strategy.FULL_SHARD, ga=2, offload=Offload.PARAMS_AND_OPTIMIZER)
    assert po.offload_s == pytest.approx(260544 / 1e9 + 0.010856, rel=1e-12)


def test_slowdown_vs():
    a = run(Strategy.DDP)
    b = run(Strategy.FULL_SHARD, n=16)
    assert b.slowdown_vs(a) == pytest.approx(b.step_time_s / a.step_time_s)


def test_default_efficiency_comes_from_the_profile():
    from dataclasses import replace

    from planner.hardware import load_gpu
    from planner.throughput import default_compute_efficiency

    # the values fitted per family on the fit half of benchmarks/throughput_measurements.csv
    # (benchmarks/throughput_accuracy.py; tests/test_error_bands.py holds them to the fit)
    assert load_gpu("a100-80").compute_efficiency == 0.615
    assert load_gpu("h100-80").compute_efficiency == 0.395
    assert load_gpu("a100-80").compiled_compute_efficiency == 0.68
    assert load_gpu("h100-80").compiled_compute_efficiency == 0.43
    assert default_compute_efficiency(replace(GPU, compute_efficiency=0.7)) == 0.7


def test_compiled_runs_use_the_compiled_efficiency():
    from dataclasses import replace

    from planner.spec import CompileMode
    from planner.throughput import default_compute_efficiency

    gpu = replace(GPU, compute_efficiency=0.4, compiled_compute_efficiency=0.5)
    assert default_compute_efficiency(gpu) == 0.4
    assert default_compute_efficiency(gpu, CompileMode.BLOCKS) == 0.5
    assert default_compute_efficiency(gpu, CompileMode.MODEL) == 0.5
    # a profile without a compiled value keeps the eager one
    assert default_compute_efficiency(replace(gpu, compiled_compute_efficiency=None),
                                      CompileMode.BLOCKS) == 0.4
    # the step's compute time is FLOPs / (peak x efficiency): 0.4 / 0.5 = 0.8 of the eager one
    profile_eff = replace(EXACT, compute_efficiency=None)
    cluster = Cluster(gpu=gpu, n_gpus=1, gpus_per_node=8, host_ram_bytes_per_node=2**34)
    steps = [estimate_step(TOY, TrainingSpec(seq=32, micro_batch=1, compile=mode), cluster,
                           Candidate(strategy=Strategy.DDP), profile_eff)
             for mode in (CompileMode.NONE, CompileMode.BLOCKS)]
    assert steps[1].compute_s == pytest.approx(0.8 * steps[0].compute_s)


def test_throughput_module_imports_without_numpy():
    code = (
        "import sys; import planner.throughput; "
        "bad = [m for m in ('numpy', 'torch', 'pandas') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
