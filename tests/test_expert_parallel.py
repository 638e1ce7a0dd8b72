"""Expert parallel (--ep, --ep-imbalance): torchtitan's EP for MoE models, FSDP2 over the rest.

Every expected number below is derived by hand from torchtitan's source (parallel_dims.py,
distributed/fsdp.py, models/common/token_dispatcher.py), the arithmetic in each test; the
dispatch alone is checked against its referee below (probes/expert_parallel.py), the whole
step against its trace in tests/test_ep_trace.py (probes/ep_trace.py)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import one_line_error, run

from planner.expert_parallel import (
    a2a_bytes,
    dispatch_forward_bytes,
    ep_expert_padding,
    ep_inputs,
    ep_sac_kept,
    ep_saved,
    expert_params,
)
from planner.activations import op_sac_kept, tp_sac_kept
from planner.memory.estimator import activation_plan, estimate
from planner.memory.states import dtypes
from planner.memory.working import fsdp_working
from planner.params import count
from planner.presets import get_preset
from planner.spec import (
    Attention,
    Candidate,
    Checkpointing,
    Cluster,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.hardware import load_gpu

MIXTRAL = get_preset("mixtral-8x7b")  # 32 blocks, h 4096, 8 experts of 14336, top 2
# Llama-4 Scout's MoE shape (hf config: hidden 5120, 16 experts of intermediate 8192, top 1);
# a Llama-style block around it (fitcheck has no Llama-4 preset: its shared expert and
# interleaved attention are left out, the expert stack is what these tests read)
SCOUT = ModelSpec(name="scout-moe", n_layers=48, hidden=5120, n_heads=40, n_kv_heads=8,
                  ffn_hidden=8192, vocab=202048, n_experts=16, experts_per_token=1)
DSV3 = get_preset("deepseek-v3")  # 256 experts of 2048, h 7168, top 8; 58 of 61 blocks MoE


def training(**kw) -> TrainingSpec:
    base = dict(seq=4096, micro_batch=1, precision=Precision.BF16, fsdp_version=2)
    return TrainingSpec(**{**base, **kw})


# ---------------------------------------------------------------------------------------------
# Where the experts live (torchtitan/distributed/fsdp.py: Shard(0), Shard(1) past E)


def test_padding_dim1_past_the_experts_scout():
    # Scout, 48 GPUs, EP 8: efsdp = 48 / 8 = 6 and efsdp x ep = 48 > 16 experts, so
    # torchtitan shards the local 16 / 8 = 2 experts on dim 1: one w_up (16, 8192, 5120)
    # per rank is 2 x ceil(8192 / 6) x 5120 = 2 x 1366 x 5120 = 13,987,840 elements; an
    # even split is ceil(16 x 8192 x 5120 / 48) = ceil(671,088,640 / 48) = 13,981,014:
    # 6,826 more per tensor, three tensors (gate, up, down; down is (16, 5120, 8192):
    # 2 x ceil(5120 / 6) x 8192 = 2 x 854 x 8192 = 13,991,936, 10,922 more), per block
    groups = (("mlp.w_gate", (16, 8192, 5120), 1), ("mlp.w_up", (16, 8192, 5120), 1),
              ("mlp.w_down", (16, 5120, 8192), 1))
    assert ep_expert_padding(groups, 8, 48) == 6_826 + 6_826 + 10_922


def test_padding_dim0_within_the_experts_dsv3():
    # DeepSeek-V3, 64 GPUs, EP 8: efsdp 8, 8 x 8 = 64 <= 256 experts, Shard(0): each rank
    # ceil(32 / 8) = 4 of its 32 experts, 4 x 2048 x 7168 = 58,720,256 = 256 x 2048 x 7168 /
    # 64 exactly: no padding. EP 8 on 24 GPUs: efsdp 3, ceil(32 / 3) = 11 experts per rank
    # where an even split is 256 / 24 = 10.67: 11 x 2048 x 7168 - ceil(256 x 2048 x 7168 / 24)
    # = 161,480,704 - 156,587,350 = 4,893,354 per tensor
    groups = (("mlp.w_up", (256, 2048, 7168), 1),)
    assert ep_expert_padding(groups, 8, 64) == 0
    assert ep_expert_padding(groups, 8, 24) == 161_480_704 - 156_587_350


def test_states_per_gpu_equal_without_padding():
    # each GPU holds E / ep experts sharded over n / ep ranks = E / n of them, as FSDP over
    # every GPU gives: Mixtral on 8 GPUs, EP 2/4/8 (ceil(8/ep / (8/ep)) = 1 expert per rank)
    # holds the same parameter, gradient and optimizer bytes as without EP
    cl = Cluster(gpu=load_gpu("h100-80"), n_gpus=8, gpus_per_node=8,
                 host_ram_bytes_per_node=2 * 2**40)
    c = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                  checkpointing=Checkpointing.FULL)
    base = estimate(MIXTRAL, training(), cl, c).breakdown
    for ep in (2, 4, 8):
        got = estimate(MIXTRAL, training(ep=ep), cl, c).breakdown
        assert (got.params, got.optimizer_states) == (base.params, base.optimizer_states)


def test_block_unit_holds_the_local_experts():
    # FSDP2's block unit under EP gathers E / ep experts: Mixtral's expert stack per block is
    # 3 x 8 x 14336 x 4096 = 1,409,286,144 elements; EP 2 leaves half, so the unit is
    # 704,643,072 elements x 2 B = 1,409,286,144 B smaller (bf16 gathers); its unsharded
    # gradient (FSDP2's real size) is smaller by the same
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.FULL)
    d = dtypes(Strategy.FULL_SHARD, Precision.BF16, training().fsdp_dtypes)
    w1 = fsdp_working(MIXTRAL, count(MIXTRAL), cand, Precision.BF16, d, 8)
    w2 = fsdp_working(MIXTRAL, count(MIXTRAL), cand, Precision.BF16, d, 8, ep=2)
    assert w1.gathered_bwd_first - w2.gathered_bwd_first == 1_409_286_144
    assert w1.unsharded_block_grads - w2.unsharded_block_grads == 1_409_286_144
    # after forward FSDP2 keeps the last all-gather output until the next copy-out; under
    # EP the block has two parameter groups and the experts' is copied out last, freeing the
    # dense group's: only the experts' output (1,409,286,144 B) is kept beside the root, not
    # the dense part, Mixtral's attention 2 x 4096^2 + 2 x 1024 x 4096 = 41,943,040, router
    # 8 x 4096 = 32,768, norms 2 x 4096 = 8,192: 41,984,000 elements, 83,968,000 B (traced:
    # probes/ep_trace.py, tests/test_ep_trace.py)
    assert w2.gathered_fwd == w2.gathered_bwd_first - 83_968_000
    # EP 8 on 8 GPUs: efsdp 1, the experts' group all-gathers nothing: nothing is kept
    w8 = fsdp_working(MIXTRAL, count(MIXTRAL), cand, Precision.BF16, d, 8, ep=8)
    # beside the root: embeddings and head 2 x 32000 x 4096 + norm 4096 = 262,148,096
    # elements, 524,296,192 B
    assert w8.gathered_fwd == 524_296_192


def test_block_unit_beside_tp_keeps_the_experts_whole():
    # EP 2 x TP 2 on 8 GPUs (FSDP2 over dp 4; docs/model.md §8.8): the dense part of the unit
    # is TP-sharded, the routed experts are not (torchtitan's expert_param_placement_sparse).
    # Mixtral's block: dense 41,984,000 elements (attention 41,943,040, router 32,768, norms
    # 8,192) / 2 = 20,992,000; experts E / ep = 4 of 3 x 14336 x 4096 = 704,643,072 whole;
    # bf16: (20,992,000 + 704,643,072) x 2 = 1,451,270,144 B per unit
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.FULL, tp=2)
    d = dtypes(Strategy.FULL_SHARD, Precision.BF16, training().fsdp_dtypes)
    w = fsdp_working(MIXTRAL, count(MIXTRAL), cand, Precision.BF16, d, 4, ep=2)
    # in the first block's backward: the root's gathered (embeddings and head
    # 2 x 32000 x 4096 + norm 4096 = 262,148,096 elements / 2 x 2 B = 262,148,096 B) + one unit
    assert w.gathered_bwd_first == 262_148_096 + 1_451_270_144
    # its unsharded gradients alike (bf16 reduce dtype here: the compute dtype)
    assert w.unsharded_block_grads == 1_451_270_144
    # efsdp = 8 / 2 = 4 ranks: the experts' all-gather output (1,409,286,144 B) is kept after
    # forward beside the root
    assert w.gathered_fwd == 262_148_096 + 1_409_286_144


def test_dispatch_beside_tp_routes_the_sequence_shard():
    # each TP rank routes its own sequence shard (torchtitan moe_sharding.py under EP): at
    # TP 2 the permutation indices are over 4096 / 2 x 2 (top 2) = 4096 rows, 8 B each,
    # in each of Mixtral's 32 MoE blocks (32,768 B per block), and the expert-side saved
    # tensors are half of TP 1's
    plans = {tp: activation_plan(MIXTRAL, training(ep=2), Candidate(
        strategy=Strategy.FULL_SHARD, offload=Offload.NONE, checkpointing=Checkpointing.NONE,
        tp=tp)) for tp in (1, 2)}
    saved = {tp: {s.name: s.nbytes for s in p.block_saved} for tp, p in plans.items()}
    assert saved[2]["moe.ep.permuted_indices"] == 32_768
    assert saved[1]["moe.ep.permuted_indices"] == 65_536
    # mlp.input is the local shard under EP x TP (not all-gathered): half, as the rest
    assert saved[2]["moe.dispatched"] * 2 == saved[1]["moe.dispatched"]
    assert saved[2]["mlp.input"] * 2 == saved[1]["mlp.input"]


# Llama-4 Scout's MoE block with its shared expert (hf config: one shared expert of the
# routed width, 8192): SCOUT's shape plus shared_ffn
SCOUT_SHARED = dataclasses.replace(SCOUT, name="scout-shared", shared_ffn=8192)


def test_shared_experts_beside_tp_save_their_gathered_input():
    # torchtitan (moe_sharding.py _shared_experts_sharding_configs): the shared experts'
    # parent all-gathers the MoE's sequence-shard input to Replicate, which their
    # column-parallel w1 / w3 save whole: 4096 tokens x 5120 x 2 B = 41,943,040 B per block
    # (every block is MoE), beside the router's input, the rank's shard (4096 / 2 x 5120 x 2 =
    # 20,971,520 B); their four SwiGLU intermediates over 8192 / 2 features each: 4096 x 4096
    # x 2 = 33,554,432 B
    plan = activation_plan(SCOUT_SHARED, training(ep=2), Candidate(
        strategy=Strategy.FULL_SHARD, offload=Offload.NONE, checkpointing=Checkpointing.NONE,
        tp=2))
    saved = {s.name: s.nbytes for s in plan.block_saved}
    assert saved["mlp.shared.input"] == 41_943_040
    assert saved["mlp.input"] == 20_971_520
    for name in ("gate_out", "act_out", "up_out", "down.input"):
        assert saved[f"mlp.shared.{name}"] == 33_554_432
    # without TP the shared experts read the router's input (one storage): no second copy
    one = activation_plan(SCOUT_SHARED, training(ep=2), Candidate(
        strategy=Strategy.FULL_SHARD, offload=Offload.NONE, checkpointing=Checkpointing.NONE))
    assert "mlp.shared.input" not in {s.name for s in one.block_saved}


def test_shared_experts_backward_runs_first_by_hand():
    # they run after the routed experts' combine, so backward first: when the routed
    # experts' backward peaks their saved set is freed (the gathered input 41,943,040 + 4 x
    # 33,554,432 = 176,160,768 B) and their unsharded weight gradients exist (3 x 5120 x
    # 8192 / 2 x 2 B = 125,829,120 B). The routed side at Scout's shape, t = 4096 / 2 = 2048
    # tokens, top 1: the residual gradients 2 x 2 x 2048 x 5120 = 41,943,040 B and the
    # pair 2 x 2 x 2048 x 8192 = 67,108,864 B (109,051,904; the combine's 2 x 2 x 2048 x
    # 5120 + 3 x 2 x 2048 x 5120 = 104,857,600 B is less): 109,051,904 - 176,160,768 +
    # 125,829,120 = 58,720,256 B. The shared experts' own backward: the residual gradients
    # 41,943,040, the all-gathered output gradient 4096 x 5120 x 2 = 41,943,040 and their
    # pair 2 x 2 x 4096 x 4096 = 67,108,864: 150,994,944 B, the larger
    plan = activation_plan(SCOUT_SHARED, training(ep=2), Candidate(
        strategy=Strategy.FULL_SHARD, offload=Offload.NONE, checkpointing=Checkpointing.NONE,
        tp=2))
    assert plan.block_backward_transient == 150_994_944
    # full checkpointing: the checkpointed forward peaks at the routed experts, before the
    # shared experts have made anything: less by their 176,160,768 B
    full = {s: activation_plan(m, training(ep=2), Candidate(
        strategy=Strategy.FULL_SHARD, offload=Offload.NONE, checkpointing=Checkpointing.FULL,
        tp=2)) for s, m in (("shared", SCOUT_SHARED), ("none", SCOUT))}
    ckpt = {s: p.checkpointed_forward for s, p in full.items()}
    # Scout's input (the shared experts' gathered copy aside) is the same in both
    assert ckpt["shared"] == ckpt["none"]


def test_shared_experts_bring_back_the_tp_collectives():
    # their all-gather in and reduce-scatter out are a dense MLP's: no MoE layer is spared
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.FULL, tp=2)
    got = ep_inputs(SCOUT_SHARED, training(ep=2), cand, mb=1, seq=4096, gpn=8, c=2, n=8)
    assert got["tp_moe_layers"] == 0.0
    assert ep_inputs(SCOUT, training(ep=2), cand, mb=1, seq=4096, gpn=8, c=2,
                     n=8)["tp_moe_layers"] == 48.0


# A Mixtral-like block at h 512 (8 heads of 64, 2 kv heads, 8 experts of 1792) after one
# dense first block of 1536 (DeepSeek's first_k_dense_replace), the EP trace's shape
SMALL_DENSE = ModelSpec(name="mixtral-dense-like", n_layers=4, hidden=512, n_heads=8,
                        n_kv_heads=2, ffn_hidden=1792, vocab=4096, n_experts=8,
                        experts_per_token=2, n_dense_layers=1, dense_ffn_hidden=1536)


def test_dense_first_block_is_the_last_reduced():
    # the last block differentiated is the dense first one: its reduce-scatter input is alive
    # through the embeddings' backward. Its elements: q and o 512 x 512 each, k and v
    # 128 x 512 each, two norms of 512, the MLP 3 x 512 x 1536: 524,288 + 131,072 + 1,024 +
    # 2,359,296 = 3,015,680; under TP 2, fp32 (the -amp reduce dtype): 1,507,840 x 4 =
    # 6,031,360 B (the trace: 6.033 MB of reduce-scatter buffer at bwd_end, TP 2 x EP 2)
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.NONE, tp=2)
    d = dtypes(Strategy.FULL_SHARD, Precision.BF16_AMP, training().fsdp_dtypes)
    w = fsdp_working(SMALL_DENSE, count(SMALL_DENSE), cand, Precision.BF16_AMP, d, 4, ep=2,
                     reduce_bytes=4)
    assert w.rs_first == 6_031_360
    # and its unit (bf16, TP 2) is the dense part alone: 3,015,680 elements against an MoE
    # block's 655,360 (attention) + 1,024 (norms) + 4,096 (router) = 660,480 / 2 TP-sharded
    # plus E / ep = 4 experts whole, 4 x 3 x 1792 x 512 = 11,010,048: 330,240 + 11,010,048 =
    # 11,340,288 elements; the first block's less by (11,340,288 - 1,507,840) x 2 =
    # 19,664,896 B
    assert w.first_less[0] == 19_664_896


def test_dense_first_block_gradient_shards():
    # at the end of backward every block's gradient shard exists: the dense block's
    # ceil(3,015,680 / 8) = 376,960 elements on each of 8 ranks against an MoE block's
    # ceil(22,680,576 / 8) = 2,835,072 (22,020,096 of experts + 660,480; no padding: E / ep =
    # 4 experts over efsdp 4 ranks, one each): 2,458,112 fewer
    from planner.memory.estimator import dense_grad_delta
    from planner.params import trainable

    T = trainable(SMALL_DENSE, training().finetune)
    assert T.train_per_block == 22_680_576
    assert dense_grad_delta(SMALL_DENSE, training(ep=2), T, 8, 0) == -2_458_112


def test_groups_of_one_rank_gather_nothing_in_forward():
    # TP 8 x EP 8 on 8 GPUs: the dense group (dp = 8 / 8) and the experts' (efsdp = 8 / 8)
    # are one rank each, so FSDP2 copies the shard in and no all-gather output exists: at the
    # last block's forward all-gather the root and the unit alone. h 512 with 8 kv heads:
    # attention 4 x 512 x 512 = 1,048,576, norms 1,024, router 8 x 512 = 4,096: 1,053,696 / 8
    # = 131,712; one expert whole, 3 x 1792 x 512 = 2,752,512; (131,712 + 2,752,512) x 2 B =
    # 5,768,448 B; the root (embedding and head 2 x 4096 x 512, norm 512) / 8 x 2 B =
    # 1,048,704 B: 6,817,152 B (the trace: 6.827 MB of unsharded parameters at that moment)
    model = dataclasses.replace(SMALL_DENSE, n_kv_heads=8, n_dense_layers=0,
                                dense_ffn_hidden=0)
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.FULL, tp=8)
    d = dtypes(Strategy.FULL_SHARD, Precision.BF16_AMP, training().fsdp_dtypes)
    w = fsdp_working(model, count(model), cand, Precision.BF16_AMP, d, 1, ep=8)
    assert w.fwd_gather == 6_817_152
    # nothing prefetched either (both groups gather nothing before their own wait)
    assert w.fwd_prefetched == 0


# ---------------------------------------------------------------------------------------------
# The dispatch (token_dispatcher.py AllToAllTokenDispatcher)


def test_dispatch_buffers_by_hand():
    # Mixtral, 1 x 4096 tokens, top 2: N = 8192 rows routed; balanced, R = 8192 received.
    # forward: max(N + R, 2 R) x h x c = 16384 x 4096 x 2 = 134,217,728 B
    assert dispatch_forward_bytes(MIXTRAL, training(ep=8), 2) == 134_217_728
    # twice the balanced rows on the busiest rank: R = 16384; max(24576, 32768) rows x 8192 B
    assert dispatch_forward_bytes(MIXTRAL, training(ep=8, ep_imbalance=2.0), 2) == 268_435_456


def test_backward_transient_gains_the_imbalanced_pair():
    # the MLP's backward pair of intermediate gradients over R rows instead of N: Mixtral,
    # 4096 tokens, top 2, bf16: 2 x 2 x 8192 x 14336 = 469,762,048 B more at imbalance 2; no
    # all-to-all buffer term (the referee: they never set the backward peak); balanced: as
    # without EP
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.NONE)
    base = activation_plan(MIXTRAL, training(), cand)
    one = activation_plan(MIXTRAL, training(ep=2), cand)
    two = activation_plan(MIXTRAL, training(ep=2, ep_imbalance=2.0), cand)
    assert one.block_backward_transient == base.block_backward_transient
    assert two.block_backward_transient - base.block_backward_transient == 469_762_048
    assert (one.ring_backward, one.ring_forward) == (0, 134_217_728)


def test_saved_set_expert_side_scales_with_imbalance():
    # the expert-side tensors (the grouped GEMM's input, the experts' four SwiGLU
    # intermediates) over R rows; the routed rows' own tensors (router, top-k, combine) stay
    # at N; permuted_indices: 8 B x R = 8 x 8192 = 65,536 B (balanced)
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.NONE)
    plan = activation_plan(MIXTRAL, training(), cand)
    saved = list(plan.block_saved)
    by = {s.name: s.nbytes for s in saved}
    one = {s.name: s.nbytes for s in ep_saved(saved, MIXTRAL, training(ep=2))}
    two = {s.name: s.nbytes for s in ep_saved(saved, MIXTRAL, training(ep=2, ep_imbalance=2.0))}
    assert one.pop("moe.ep.permuted_indices") == 65_536
    assert one == by
    assert two.pop("moe.ep.permuted_indices") == 131_072
    # moe.dispatched: c x t x k x h = 2 x 4096 x 2 x 4096 = 67,108,864, doubled
    assert by["moe.dispatched"] == 67_108_864 and two["moe.dispatched"] == 134_217_728
    assert two["mlp.up_out"] == 2 * by["mlp.up_out"]
    assert two["moe.router_probs"] == by["moe.router_probs"]
    assert two["moe.expert_out"] == by["moe.expert_out"]


def test_dsv3_indices_weighted_by_moe_blocks():
    # DeepSeek-V3: 58 of 61 blocks route; one micro-batch of 4096 tokens, top 8:
    # R = 32768 rows, 8 x 32768 = 262,144 B in an MoE block, x 58 / 61 per average block
    # = 249,250 (int of 249,250.36)
    saved = ep_saved([], DSV3, training(ep=8))
    assert saved[0].nbytes == 262_144 * 58 // 61


def test_selective_keeps_the_all_to_all_outputs_by_hand():
    # torchtitan's op-level SAC saves all_to_all_single's outputs (DeepSeek-V3's
    # _op_sac_save_list at 82a9530f6~1; the every-second rule spares aten.mm only):
    # Mixtral (every block MoE), 1 x 4096 tokens, top 2, bf16: N = 8192 rows;
    # dispatched c R h = 2 x 8192 x 4096 = 67,108,864 B, returned c N h the same; at
    # imbalance 1.5 R = 12288: 2 x 12288 x 4096 = 100,663,296 B, returned still 67,108,864
    one = {s.name: s.nbytes for s in ep_sac_kept(MIXTRAL, training(ep=8), 2)}
    assert one == {"moe.ep.a2a_dispatched": 67_108_864, "moe.ep.a2a_returned": 67_108_864}
    imb = {s.name: s.nbytes for s in ep_sac_kept(MIXTRAL, training(ep=8, ep_imbalance=1.5), 2)}
    assert imb == {"moe.ep.a2a_dispatched": 100_663_296, "moe.ep.a2a_returned": 67_108_864}
    # DeepSeek-V3, 58 of 61 blocks MoE: N = 4096 x 8 = 32768, c N h = 2 x 32768 x 7168 =
    # 469,762,048 B in an MoE block, x 58 = 27,246,198,784, / 61 = 446,658,996 remainder 28
    dsv3 = ep_sac_kept(DSV3, training(ep=8), 2)
    assert [s.nbytes for s in dsv3] == [446_658_996, 446_658_996]


def test_selective_kept_set_grows_under_ep_only():
    # the estimator: selective checkpointing's kept bytes per block gain exactly the two
    # all-to-all outputs (Mixtral, balanced, bf16: 2 x 67,108,864 = 134,217,728 B); full
    # checkpointing keeps the block input alone with EP or without
    sel = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                    checkpointing=Checkpointing.SELECTIVE)
    full = dataclasses.replace(sel, checkpointing=Checkpointing.FULL)
    t = training(precision=Precision.BF16)
    base = activation_plan(MIXTRAL, t, sel)
    ep = activation_plan(MIXTRAL, dataclasses.replace(t, ep=8), sel)
    assert ep.block_kept - base.block_kept == 134_217_728
    assert activation_plan(MIXTRAL, dataclasses.replace(t, ep=8), full).block_kept \
        == activation_plan(MIXTRAL, t, full).block_kept


def test_selective_beside_tp_keeps_the_reduce_scatters_not_the_gathered_input():
    # Scout + shared experts beside TP 2 (activations.tp_sac_kept), 4096 tokens, bf16: the
    # row-parallel linears are attention.wo and the shared experts' w2 (reduce-scattered to
    # the sequence shard: moe_sharding.py _shared_experts_sharding_configs); each
    # reduce_scatter_tensor output, in torchtitan's save list, is 4096 / 2 x 5120 x 2 B =
    # 20,971,520 B. The shared experts' all-gathered input is an all_gather_into_tensor
    # output, in neither list: not kept (a non-checkpointed block saves it: 41,943,040 B).
    # The mm's under the default --sac-force-recompute moe.router.gate (the router left
    # out of the count): q, k, v, o, shared w1, w3, w2; the 7th, w2, kept: its Partial
    # output is the whole sequence, 4096 x 5120 x 2 B = 41,943,040 B on every rank
    sel = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                    checkpointing=Checkpointing.SELECTIVE, tp=2)
    plan = activation_plan(SCOUT_SHARED, training(ep=2), sel)
    t, c = 4096, 2
    kept = {x.name: x.nbytes for x in tp_sac_kept(SCOUT_SHARED, op_sac_kept(
        SCOUT_SHARED, t, 1, t, Attention.SDPA, c, c, force=("moe.router.gate",)), 2, t, c)}
    assert kept["o.reduce_scatter"] == kept["shared.down.reduce_scatter"] == 20_971_520
    assert kept["shared.down.out"] == 41_943_040
    assert "mlp.shared.input" not in kept
    # the plan's kept bytes per block: these plus EP's two all-to-all outputs over the
    # rank's sequence shard (ep_sac_kept at 2048 tokens, top 1: 2 x 2048 x 5120 x 2 B each)
    assert plan.block_kept == sum(kept.values()) + 2 * 20_971_520


# ---------------------------------------------------------------------------------------------
# Step time: the all-to-alls and FSDP's smaller expert collectives


def test_all_to_all_bytes_and_fsdp_saving():
    # one all-to-all: R x h x c x (ep - 1) / ep = 8192 x 4096 x 2 x 7 / 8 = 58,720,256 B
    t = training(ep=8)
    assert a2a_bytes(MIXTRAL, t, 2) == 58_720_256
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.FULL)
    x = expert_params(MIXTRAL)
    assert x == 32 * 1_409_286_144
    # ep = n = 8: every GPU owns its experts whole (efsdp 1): FSDP moves none of them
    got = ep_inputs(MIXTRAL, t, cand, mb=1, seq=4096, gpn=8, c=2, n=8)
    assert got["ep_comm_less"] == pytest.approx(x)
    assert got["ep_bytes"] == pytest.approx(58_720_256) and got["ep_inter"] == 0.0
    # n 16, ep 2: efsdp 8 moves 7/8 of X/2 = 7X/16 where the 16-ring moved 15X/16 of X:
    # X (1 - 7/15) = 8X/15 fewer in the ring's units; ep 2 <= 8 GPUs per node
    got = ep_inputs(MIXTRAL, training(ep=2), cand, mb=1, seq=4096, gpn=8, c=2, n=16)
    assert got["ep_comm_less"] == pytest.approx(8 * x / 15)
    # an EP group of 16 over nodes of 8 crosses the NIC
    got = ep_inputs(DSV3, training(ep=16), cand, mb=1, seq=4096, gpn=8, c=2, n=16)
    assert got["ep_inter"] == 1.0
    # beside TP 2 (§8.8): a rank routes 4096 / 2 tokens, one all-to-all half of TP 1's; FSDP
    # runs over m = 8 / 2 = 4 ranks and moves 3/4 of P / 2 (the dense part TP-sharded), the
    # experts efsdp s = 8 / 2 = 4 ranks' 3/4 of X / 2, not TP-sharded: X (1 - 2 x 3/4 / 2 x
    # 4/3) = 0 fewer in the ring's units (the experts move as much as the dense model would)
    tp2 = dataclasses.replace(cand, tp=2)
    got = ep_inputs(MIXTRAL, training(ep=2), tp2, mb=1, seq=4096, gpn=8, c=2, n=8)
    one = ep_inputs(MIXTRAL, training(ep=2), cand, mb=1, seq=4096, gpn=8, c=2, n=8)
    assert got["ep_bytes"] * 2 == pytest.approx(one["ep_bytes"])
    assert got["ep_comm_less"] == pytest.approx(0.0, abs=1e-3)
    # no sequence-parallel collective around the 32 MoE MLPs
    assert got["tp_moe_layers"] == 32.0
    assert one["tp_moe_layers"] == 0.0


def test_busiest_gpu_runs_the_surplus_expert_flops():
    # imbalance 2: the busiest GPU's routed experts run twice the rows. Mixtral, 4096 tokens,
    # no checkpointing: 2 (fwd) + 4 (bwd) FLOPs x 3 x 4096 x 14336 weights x top 2 x 32
    # layers = 6 x 11,274,289,152 = 67,645,734,912 FLOPs per token more, at peak x eff
    from planner.throughput import step_core, step_inputs

    cl = Cluster(gpu=load_gpu("h100-80"), n_gpus=8, gpus_per_node=8,
                 host_ram_bytes_per_node=2 * 2**40)
    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.NONE)
    x1 = step_inputs(MIXTRAL, training(ep=8), cl, cand)
    x2 = step_inputs(MIXTRAL, training(ep=8, ep_imbalance=2.0), cl, cand)
    assert x1.ep_idle_mm == 0 and x2.ep_idle_mm == 11_274_289_152
    s1, s2 = step_core(x1), step_core(x2)
    want = 4096 * 67_645_734_912 / (x1.peak * x1.eff)
    assert s2.compute_s - s1.compute_s == pytest.approx(want, rel=1e-9)
    assert s2.mfu < s1.mfu  # the same useful FLOPs in a longer step


def test_step_time_counts_the_all_to_alls():
    # balanced vs twice the rows: the all-to-all time doubles (bytes x 2), FSDP's the same
    args = ["--model", "mixtral-8x7b", "--gpu", "h100-80", "--n", "8", "--strategy",
            "full_shard", "--checkpointing", "none", "--json", "--ep", "8"]
    import json

    a = json.loads(run(*args).stdout)["candidates"][0]
    b = json.loads(run(*args, "--ep-imbalance", "2").stdout)["candidates"][0]
    assert b["comm_s"] > a["comm_s"]


# ---------------------------------------------------------------------------------------------
# Refusals (one line, exit 2) and the assumption line


@pytest.mark.parametrize("args,needles", [
    (["--model", "llama3-8b", "--ep", "2"], ("--ep", "dense")),
    (["--model", "mixtral-8x7b", "--ep", "3"], ("--ep", "does not divide the 8 experts")),
    (["--model", "mixtral-8x7b", "--ep", "4", "--n", "6"], ("--ep", "does not divide the 6 GPUs")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--strategy", "zero3"], ("--strategy", "expert")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--offload", "optimizer"], ("--offload", "expert")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--fsdp", "1"], ("--ep", "FSDP1")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--ep-imbalance", "3"], ("--ep", "imbalance")),
    (["--model", "mixtral-8x7b", "--ep-imbalance", "2"], ("--ep-imbalance", "--ep > 1")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--compile", "blocks"], ("--ep", "--compile")),
    # PP x EP (docs/model.md §8.8 "Beside pipeline parallel") is modelled under GPipe and
    # 1F1B with routed experts in every block; what its referee does not trace is refused
    (["--model", "mixtral-8x7b", "--ep", "2", "--pp", "2", "--pp-schedule",
      "interleaved-1f1b"], ("--ep", "interleaved-1f1b is NOT MODELLED")),
    (["--model", "deepseek-v2-lite", "--ep", "2", "--pp", "2"], ("--pp", "shared experts")),
    (["--model", "mixtral-8x7b", "--pp", "2"], ("--pp", "without expert parallel")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--pp", "2", "--cp", "2", "--n", "16"],
     ("--ep", "pipeline and context parallel together is NOT MODELLED")),
    # CP for an MoE model: beside EP only (docs/model.md "Beside context parallel"), not
    # beside TP (not traced)
    (["--model", "mixtral-8x7b", "--cp", "2"], ("--cp", "with expert parallel only")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--cp", "2", "--tp", "2"],
     ("--cp", "beside tensor parallel")),
    # TP for an MoE model without EP (torchtitan TP-shards the experts there): refused;
    # EP x TP (docs/model.md §8.8) is modelled but for what its referee does not trace
    (["--model", "mixtral-8x7b", "--tp", "2"], ("--tp", "without --ep is NOT MODELLED")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--tp", "2", "--checkpointing", "selective"],
     ("--checkpointing", "selective checkpointing is NOT MODELLED")),
    (["--model", "deepseek-v2-lite", "--ep", "2", "--tp", "2"], ("tensor parallel",
                                                                  "NOT MODELLED")),
    (["--model", "mixtral-8x7b", "--ep", "2", "--tp", "2", "--seq", "4095"],
     ("--seq", "not a multiple of TP 2")),
])
def test_refused_by_name(args, needles):
    one_line_error(run(*args, "--gpu", "h100-80", *(["--n", "8"] if "--n" not in args else [])),
                   2, *needles)


def test_from_trace_refuses_ep():
    one_line_error(run("--model", "mixtral-8x7b", "--gpu", "h100-80", "--n", "8", "--ep", "2",
                       "--from-trace"), 2, "--from-trace", "--ep")
    from probes.trace import UnsupportedConfig, check_supported

    from probes.trace import effects_asked

    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE,
                     checkpointing=Checkpointing.FULL)
    # the reference model traces EP (probes/ep_trace.py); a model whose trace does not
    # implement it (a Hugging Face class's own MoE) is refused by name
    check_supported(training(ep=2), cand)
    assert effects_asked(training(ep=2), cand) == {"ep": "expert parallel degree 2"}
    with pytest.raises(UnsupportedConfig, match="expert parallel degree 2: not implemented"):
        from probes.trace import TraceModel, trace_training_step

        def factory(opts):
            import torch

            net = torch.nn.Sequential(torch.nn.Linear(4, 4))
            return TraceModel(module=net, blocks=list(net), block_path="0",
                              make_batch=lambda b, t: (torch.zeros(b, 4),),
                              loss=lambda m, batch: m(*batch).sum(), info={"source": "test"})

        trace_training_step(factory, training(ep=2), cand, 2)


def test_assumption_line_says_so():
    out = run("--model", "mixtral-8x7b", "--gpu", "h100-80", "--n", "8", "--ep", "4").stdout
    flat = " ".join(out.split())
    assert "expert parallel: 4 (torchtitan's all-to-all token dispatch" in flat
    assert "whole step traced on fake tensors" in flat


def test_report_refuses_ep():
    from planner.errors import UsageError
    from planner.report.request import refuse_ep

    with pytest.raises(UsageError, match="expert parallel is not represented"):
        refuse_ep({"parallel.ep": "4"})
    refuse_ep({"parallel.ep": "1"})


def test_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="ep must"):
        dataclasses.replace(training(), ep=0)
    with pytest.raises(ValueError, match="ep_imbalance"):
        dataclasses.replace(training(), ep_imbalance=0.5)


# ---------------------------------------------------------------------------------------------
# The fewest-GPUs search under EP (planner/plan.py first_fit)


def test_padding_stretches_by_hand():
    # Qwen3-30B-A3B: 128 experts, w_gate/w_up (128, 768, 2048), w_down (128, 2048, 768); EP 4
    from planner.expert_parallel import padding_stretch_end

    qwen3 = get_preset("qwen3-30b-a3b")
    # 96 GPUs: ceil(128 / 96) = 2 rows each up to (128 - 1) // (2 - 1) = 127 GPUs
    assert padding_stretch_end(qwen3, 4, 96) == 127
    # 128 GPUs: one expert each (dim 0), the last count before dim 1
    assert padding_stretch_end(qwen3, 4, 128) == 128
    # 132 GPUs, s = 33: ceil(768 / 33) = 24 up to s = 767 // 23 = 33; ceil(2048 / 33) = 63
    # up to 2047 // 62 = 33: the stretch ends at 33 x 4 = 132
    assert padding_stretch_end(qwen3, 4, 132) == 132
    # 2560 GPUs, s = 640: ceil(768 / 640) = 2 up to 767 (3068 GPUs); ceil(2048 / 640) = 4 up
    # to 2047 // 3 = 682 (2728 GPUs): 2728
    assert padding_stretch_end(qwen3, 4, 2560) == 2728


def test_fewest_gpus_matches_planning_every_count():
    # shard_grad_op keeps every unit's padded gather: under EP 4 Qwen3-30B-A3B's need rises
    # from 64 to 124 GPUs (ceil(32 / efsdp) = 2 local experts gathered from each rank) and
    # falls at 128 (one each); past 128 the dim-1 padding rises again in stretches (2560
    # GPUs: 61.0 GiB). The search (which assumed a convex need past E before) must give what
    # planning every multiple of 4 one by one gives
    from planner.fields import SPEC
    from planner.plan import fits_any, min_gpus
    from planner.request import build_request

    values = {"model.preset": "qwen3-30b-a3b", "hardware.gpu": "h100-80", "hardware.n": 4,
              "parallel.ep": 4, "training.seq": 16384, "training.micro_batch": 1,
              "strategy": "shard_grad_op", "offload": "none", "parallel.tp": 1}
    r = build_request(values, SPEC)
    counts = [n for n in list(range(4, 9, 4)) + list(range(16, 129, 8))]
    first = next(n for n in counts if fits_any(r.with_gpus(n)))
    # at 64 GPUs 58.8 GiB x the fsdp-eager-full interval's 1.279 = 75.2 GiB fits the 79.6
    # usable (before the bands' 2026-11-26 refit, x 1.38, the first was 128); at 120, 71.4 GiB
    # does not: the need still rises between them, which the search must see
    assert first == 64
    assert min_gpus(r) == first


def test_fewest_gpus_beside_tp_matches_planning_every_count():
    # EP 2 x TP 2: the fewest GPUs the search gives is what planning every multiple of 4
    # one by one gives (the experts' padding and dim-1 placement count the world, dp x tp);
    # counts: multiples of ep x tp = 4 within a node, whole nodes past it (--find min-gpus)
    from planner.fields import SPEC
    from planner.plan import fits_any, min_gpus
    from planner.request import build_request

    values = {"model.preset": "mixtral-8x7b", "hardware.gpu": "h100-80", "hardware.n": 4,
              "parallel.ep": 2, "parallel.tp": 2, "training.seq": 4096,
              "training.micro_batch": 1, "strategy": "full_shard", "offload": "none"}
    r = build_request(values, SPEC)
    first = next(n for n in [4, 8] + list(range(16, 129, 8)) if fits_any(r.with_gpus(n)))
    assert first > 8  # the search crosses the node boundary
    assert min_gpus(r) == first


# ---------------------------------------------------------------------------------------------
# The referee: torchtitan's dispatcher ops on fake tensors, EP against the local dispatcher

REFEREE_CASES = [
    # (ep, tokens, top_k, hidden, ffn, imbalance, dtype): Mixtral's ratios (ffn 3.5 h, top 2)
    # and DeepSeek-V3's (ffn h / 3.5, top 8), balanced and not, bf16 and fp32
    (4, 256, 2, 512, 1792, 1.0, "bf16"),
    (4, 256, 2, 512, 1792, 2.0, "bf16"),
    (8, 256, 8, 448, 128, 1.0, "bf16"),
    (8, 256, 8, 448, 128, 2.0, "bf16"),
    (4, 256, 2, 512, 1792, 1.0, "fp32"),
    (2, 256, 8, 448, 128, 1.5, "fp32"),
]


def _referee(cases: list[dict], *flags: str) -> list[dict]:
    """In a fresh process (a fake process group is global)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-m", "probes.expert_parallel", json.dumps(cases),
                           *flags],
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.trace
def test_dispatch_matches_the_referee():
    from planner.arch.base import Saved

    cases = []
    for ep, t, k, h, f, imb, dt in REFEREE_CASES:
        shape = dict(tokens=t, top_k=k, hidden=h, ffn=f, dtype=dt)
        cases += [dict(ep=1, **shape), dict(ep=ep, imbalance=imb, **shape)]
    got = _referee(cases)
    for i, (ep, t, k, h, f, imb, dt) in enumerate(REFEREE_CASES):
        local, par = got[2 * i], got[2 * i + 1]
        c = {"bf16": 2, "fp32": 4}[dt]
        model = ModelSpec(name="ref", n_layers=1, hidden=h, n_heads=4, n_kv_heads=4,
                          ffn_hidden=f, vocab=256, n_experts=8 * ep, experts_per_token=k)
        spec = training(seq=t, ep=ep, ep_imbalance=imb)
        n_rows = t * k
        # the referee's routed tensors as Moe.saved names them (its experts: one SwiGLU)
        base = [Saved("moe.dispatched", c * n_rows * h)] + [
            Saved(f"mlp.{x}", c * n_rows * f) for x in ("gate_out", "act_out", "up_out",
                                                        "down.input")]
        more = sum(x.nbytes for x in ep_saved(base, model, spec)) - sum(x.nbytes for x in base)
        # what the forward leaves: exactly the planner's difference (indices, R rows)
        assert par["left"] - local["left"] == more, (i, par, local, more)
        # the forward peak: balanced, EP adds nothing but what it saves; with imbalance the
        # unpermute moment may set it, by less than the planner's dispatch buffers
        extra = (par["fwd_peak"] - local["fwd_peak"]) - more
        if imb == 1.0:
            assert extra == 0, (i, extra)
        else:
            assert 0 <= extra <= dispatch_forward_bytes(model, spec, c), (i, extra)
        # the backward peak: no all-to-all buffer raises it; with imbalance the MLP's pair
        # over R rows (the planner's term) where that pair is the peak (Mixtral's ratio)
        pair = int((imb - 1.0) * 2 * c * n_rows * f)
        d_bwd = par["bwd_peak"] - local["bwd_peak"]
        assert 0 <= d_bwd <= pair, (i, d_bwd, pair)
        if f > h:
            assert d_bwd == pair, (i, d_bwd, pair)


@pytest.mark.trace
def test_selective_kept_matches_the_referee():
    # torchtitan's op-level SAC around the routed path (probes/expert_parallel.py sac_bytes:
    # the DeepSeek-V3 save list, grouped-GEMM experts, bf16): what the forward leaves under EP
    # minus under the local dispatcher is exactly ep_sac_kept (the two all-to-alls' outputs)
    cases = []
    bf16 = [case for case in REFEREE_CASES if case[-1] == "bf16"]
    for ep, t, k, h, f, imb, _ in bf16:
        shape = dict(tokens=t, top_k=k, hidden=h, ffn=f)
        cases += [dict(ep=1, **shape), dict(ep=ep, imbalance=imb, **shape)]
    got = _referee(cases, "--sac")
    for i, (ep, t, k, h, f, imb, _) in enumerate(bf16):
        local, par = got[2 * i], got[2 * i + 1]
        model = ModelSpec(name="ref", n_layers=1, hidden=h, n_heads=4, n_kv_heads=4,
                          ffn_hidden=f, vocab=256, n_experts=8 * ep, experts_per_token=k)
        kept = sum(s.nbytes for s in ep_sac_kept(model, training(seq=t, ep=ep, ep_imbalance=imb),
                                                 2))
        assert par["left"] - local["left"] == kept, (i, par, local, kept)


# ---------------------------------------------------------------------------------------------
# Beside context parallel (docs/model.md "Beside context parallel"; traced in
# tests/test_ep_trace.py)


def _cp_plan(**kw):
    return activation_plan(MIXTRAL, training(cp=2, **kw), Candidate(
        strategy=Strategy.FULL_SHARD, offload=Offload.NONE, checkpointing=Checkpointing.NONE))


def test_ring_backward_counts_the_local_experts_gradients():
    # FSDP2's unsharded gradients (bf16) alive when the ring runs backward, an MoE block's:
    # attn.o 4096 x 4096 = 16,777,216, norm2 4096, the router 8 x 4096 = 32,768 and the
    # rank's routed experts, 3 x 14336 x 4096 = 176,160,768 each: EP 2, 4 of them,
    # 704,643,072 -> 721,457,152 elements x 2 B = 1,442,914,304; EP 8, one: 192,974,848 x 2
    assert _cp_plan(ep=2).ring_grads == 1_442_914_304
    assert _cp_plan(ep=8).ring_grads == 385_949_696


def test_ring_and_dispatch_share_the_forward_slot():
    # the ring runs in the attention, the dispatch in the MLP: the block's forward slot is
    # the larger. 4096 / CP 2 = 2048 local tokens, 32 heads (kv repeated) x 128: O = K =
    # 8,388,608; ring (all-gather): 18 O + 3 x 262,144 (lse) + 2 x 4 K = 218,890,240. The
    # dispatch: N = R = 4096 rows, max(N + R, 2 R) x 4096 x 2 = 67,108,864: below it
    assert _cp_plan(ep=2).ring_forward == 218_890_240
    assert dispatch_forward_bytes(MIXTRAL, training(cp=2, ep=2), 2) == 67_108_864


def test_all_to_all_bytes_are_the_ranks_own_tokens_under_cp():
    # seq 4096 over CP 2: a rank routes 2048 tokens x top 2 = 4096 rows of 4096 x 2 B, 7 / 8
    # of them to other ranks of EP 8: 29,360,128 B per all-to-all (the sweep's seq is the
    # whole sequence)
    from planner.expert_parallel import ep_inputs

    cand = Candidate(strategy=Strategy.FULL_SHARD, offload=Offload.NONE)
    got = ep_inputs(MIXTRAL, training(cp=2, ep=8), cand, mb=1, seq=4096, gpn=8, c=2, n=16)
    assert got["ep_bytes"] == 29_360_128


def test_fewest_gpus_beside_cp_matches_planning_every_count():
    # EP 4 x CP 2: torchtitan needs dp_shard x cp a multiple of ep (parallel_dims.py), so
    # within a node the counts are the multiples of lcm(2, 4) = 4, not of 8: Qwen1.5-MoE
    # (60 experts) fits on 4 H200s, which the search must find
    from planner.fields import SPEC
    from planner.plan import fits_any, min_gpus
    from planner.request import build_request

    values = {"model.preset": "qwen1.5-moe-a2.7b", "hardware.gpu": "h200", "hardware.n": 4,
              "parallel.ep": 4, "parallel.cp": 2, "training.seq": 16384,
              "training.micro_batch": 1, "strategy": "full_shard", "offload": "none",
              "parallel.tp": 1}
    r = build_request(values, SPEC)
    assert fits_any(r.with_gpus(4))
    assert min_gpus(r) == 4
