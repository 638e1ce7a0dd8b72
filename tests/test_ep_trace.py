"""Expert parallel, the whole training step traced (probes/ep_trace.py): the planner held to
the fake-tensor trace of torchtitan's EP at every moment of the step.

The reference transformer with each MoE MLP under torchtitan's all-to-all token dispatch
(``AllToAllTokenDispatcher``, the split sizes given: balanced, or this rank receiving
``imbalance`` x its routed rows), the routed experts placed as torchtitan places them (E / ep
local experts, FSDP2 over efsdp = n / ep ranks on the sparse mesh, Shard(1) where n > E, the
rest over all n ranks: one ``fully_shard`` unit per block with a per-parameter mesh),
torchtitan's explicit prefetching under EP, the experts' grouped GEMM (``torch._grouped_mm``),
AdamW's step; 8 fake ranks. Three MoE shapes at
small width: Mixtral's ratios (ffn 3.5 h, 8 experts, top 2), DeepSeek-V3's (ffn ~ h / 3.5,
16 experts, top 6) and Llama-4 Scout's (4 experts, top 1: n > E, the dim-1 placement).

What the planner counts since (docs/model.md "Expert parallel"): the all-gather output
FSDP2 keeps after a block's forward is the experts' group's alone (nothing where efsdp is 1);
a group of one rank gathers nothing when prefetched; torchtitan's explicit forward prefetch;
a checkpointed block's own tensors inside its forward (the forward's peak under full and
selective checkpointing; the reference model without EP shows it too); torchtitan's combine
backward (3 c N h at the scores' gradient: the backward's peak at DeepSeek's shape); under
selective checkpointing the combine's rows and the dispatch all-to-all's output (the
policy's cache, popped into the recompute) not recomputed again.
"""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.trace

pytest.importorskip("torch")

from planner.hardware import load_gpu  # noqa: E402
from planner.spec import (  # noqa: E402
    Candidate,
    Checkpointing,
    Cluster,
    ModelSpec,
    Strategy,
    TrainingSpec,
)
from probes.compare import compare  # noqa: E402
from probes.trace import trace_step  # noqa: E402

SHAPES = {
    "mixtral": ModelSpec(name="mixtral-like", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2,
                         ffn_hidden=1792, vocab=4096, n_experts=8, experts_per_token=2),
    "dsv3": ModelSpec(name="dsv3-like", n_layers=4, hidden=512, n_heads=8, n_kv_heads=8,
                      ffn_hidden=144, vocab=4096, n_experts=16, experts_per_token=6),
    "scout": ModelSpec(name="scout-like", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2,
                       ffn_hidden=1024, vocab=4096, n_experts=4, experts_per_token=1),
}
# with their shared experts (torchtitan's MoE.shared_experts: DeepSeek-V3 one of the routed
# width, Llama-4 one of the routed width), run after the routed experts and added
SHAPES["dsv3-shared"] = dataclasses.replace(SHAPES["dsv3"], name="dsv3-shared-like",
                                            shared_ffn=144)
SHAPES["mixtral-shared"] = dataclasses.replace(SHAPES["mixtral"], name="mixtral-shared-like",
                                               shared_ffn=1792)
# 8 kv heads (and 8 heads): TP 4 and 8 split them
SHAPES["mixtral-kv8"] = dataclasses.replace(SHAPES["mixtral"], name="mixtral-kv8-like",
                                            n_kv_heads=8)
# with a dense first block (DeepSeek's first_k_dense_replace: a dense MLP of its own width)
SHAPES["mixtral-dense"] = dataclasses.replace(SHAPES["mixtral"], name="mixtral-dense-like",
                                              n_dense_layers=1, dense_ffn_hidden=1536)
# DeepSeek-V3's layout: shared expert and a dense first block (V3: 3 of 61, dense ffn 9 x
# the experts'; here 1 of 4, 1536)
SHAPES["dsv3-full"] = dataclasses.replace(SHAPES["dsv3"], name="dsv3-shared-dense-like",
                                          shared_ffn=144, n_dense_layers=1,
                                          dense_ffn_hidden=1536)
SHAPES["scout-shared"] = dataclasses.replace(SHAPES["scout"], name="scout-shared-like",
                                             shared_ffn=1024)
N = 8
NONE, FULL, SEL = Checkpointing.NONE, Checkpointing.FULL, Checkpointing.SELECTIVE

CASES = [
    # (shape, ep, imbalance, checkpointing, strategy)
    ("mixtral", 2, 1.0, NONE, "full_shard"),
    ("mixtral", 4, 1.0, NONE, "full_shard"),
    ("mixtral", 8, 1.0, NONE, "full_shard"),
    ("mixtral", 2, 2.0, NONE, "full_shard"),
    ("mixtral", 8, 2.0, NONE, "full_shard"),
    ("mixtral", 2, 1.0, FULL, "full_shard"),
    ("mixtral", 4, 1.5, FULL, "full_shard"),
    ("mixtral", 8, 2.0, FULL, "full_shard"),
    ("mixtral", 2, 1.0, SEL, "full_shard"),
    ("mixtral", 4, 1.0, NONE, "shard_grad_op"),
    ("dsv3", 2, 1.0, NONE, "full_shard"),
    ("dsv3", 8, 2.0, NONE, "full_shard"),
    ("dsv3", 8, 2.0, FULL, "full_shard"),
    ("dsv3", 4, 1.0, SEL, "full_shard"),
    ("scout", 2, 1.0, NONE, "full_shard"),
    ("scout", 2, 2.0, FULL, "full_shard"),
    ("scout", 4, 1.0, SEL, "full_shard"),
    # shared experts under EP alone (FSDP2 over every rank, reading the router's input).
    # Measured 2026-11-26 (worst moment): Mixtral-like + shared EP 4 full -0.25 % (+5.56 %
    # in forward before the checkpointed forward left them out: they run after the routed
    # experts' peak), DeepSeek-V3-like + shared EP 2 full -0.40 %, Scout-like + shared EP 2
    # none -0.22 %
    ("mixtral-shared", 4, 1.0, FULL, "full_shard"),
    ("dsv3-shared", 2, 1.0, FULL, "full_shard"),
    # a dense first block under EP alone: bwd_end +24.93 % before the first block's own
    # reduce-scatter input and gradient shards were counted (the last block differentiated is
    # the dense one), -0.00 % since; block_bwd -1.18 % (-4.30 MB, as the shape without the
    # dense block: -4.35 MB)
    ("mixtral-dense", 2, 1.0, NONE, "full_shard"),
    ("scout-shared", 2, 1.0, NONE, "full_shard"),
]

# Selective checkpointing's backward under EP with an imbalance: the block's backward moment
# misses by more than 2 % (measured 2026-11-26, this trace, torchtitan's current save list):
# Mixtral's shape EP 8 at imbalance 2 +2.39 %, DeepSeek-V3's -3.26 % (every other moment
# within 0.3 %; balanced, within 1.7 %). Not found in time: which of the policy's cached
# tensors over the R received rows the recompute keeps while the block's backward peaks.
SELECTIVE_BWD_MISSES = [
    ("mixtral", 8, 2.0, SEL, "full_shard"),
    ("dsv3", 8, 2.0, SEL, "full_shard"),
]


def cluster() -> Cluster:
    gpu = load_gpu("h200")
    return Cluster(gpu=gpu, n_gpus=N, gpus_per_node=8,
                   host_ram_bytes_per_node=gpu.host_ram_bytes_per_node)


def _compare(shape: str, ep: int, imb: float, ck: Checkpointing, strategy: str):
    model = SHAPES[shape]
    training = TrainingSpec(seq=1024, micro_batch=1, ep=ep, ep_imbalance=imb)
    cand = Candidate(strategy=Strategy(strategy), checkpointing=ck)
    result = trace_step(model, training, cand, N, 8)
    c = compare(model, training, cluster(), cand, result)
    assert c.ok, c.reason
    return c


def _within(c, tol: float = 0.02) -> None:
    assert abs(c.peak.rel_error) <= tol, c.peak
    for name, pair in c.moments.items():
        assert abs(pair.rel_error) <= tol, (name, pair)
    # where the parameters live: each rank's experts (E / ep over efsdp ranks, padded
    # alike), its gradients and AdamW's states, as the planner places them
    for name in ("params", "gradients", "optimizer"):
        assert abs(c.categories[name].rel_error) <= 1e-3, (name, c.categories[name])


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_ep_step_every_moment(case) -> None:
    _within(_compare(*case))


@pytest.mark.xfail(strict=True, reason="selective checkpointing's block backward under EP at "
                   "imbalance 2: +2.39 % / -3.26 % (see SELECTIVE_BWD_MISSES)")
@pytest.mark.parametrize("case", SELECTIVE_BWD_MISSES, ids=lambda c: "-".join(map(str, c)))
def test_ep_step_selective_backward(case) -> None:
    _within(_compare(*case))


# EP beside tensor parallel (docs/model.md §8.8 "Beside tensor parallel"): torchtitan's layout
# at b5bcd76, TP 2 with sequence parallel on the dense (dp, tp) mesh, every MoE on its TP
# rank's sequence shard (no all-gather, no reduce-scatter around it), the routed experts
# whole on the sparse (efsdp, ep) mesh, FSDP2 of the dense parameters over dp = 4
# (probes/ep_trace.py ``ep_parallelize(tp=)``). Measured 2026-11-26 (planner - trace, worst
# moment): Mixtral-like TP 2 x EP 2 none -0.66 % (bwd_end), EP 4 full -0.86 % (block_bwd),
# EP 2 imbalance 2 none -1.52 % (block_bwd), EP 4 shard_grad_op none -0.75 % (block_bwd),
# Scout-like EP 4 full -1.96 % (bwd_end).
TP_CASES = [
    # (shape, tp, ep, imbalance, checkpointing[, strategy])
    ("mixtral", 2, 2, 1.0, NONE),
    ("mixtral", 2, 4, 1.0, FULL),
    ("mixtral", 2, 2, 2.0, NONE),
    ("mixtral", 2, 4, 1.0, NONE, "shard_grad_op"),
    ("scout", 2, 4, 1.0, FULL),
    # shared experts beside TP (moe_sharding.py _shared_experts_sharding_configs: the input
    # all-gathered, w1 / w3 colwise, w2 rowwise reduce-scattered; run after the routed
    # experts). Measured 2026-11-26 (planner - trace, worst moment): Scout-like + shared
    # EP 2 none -1.54 % (bwd_end), EP 4 full -1.64 % (bwd_end); before they were modelled
    # (the gathered input, the shared experts' backward first) -3.11 % (forward) and
    # -2.97 % (block_bwd)
    ("scout-shared", 2, 2, 1.0, NONE),
    ("scout-shared", 2, 4, 1.0, FULL),
    # a dense first block beside TP (decoder_sharding.py set_dense_ffn_sharding: TP's dense
    # MLP). Measured 2026-11-26 (worst moment): EP 2 none -0.96 % (bwd_end), EP 4 full
    # -1.55 % (forward), EP 4 shard_grad_op -0.96 % (bwd_end); before the first block was
    # told apart (its unit, gradients, reduce-scatter input and saved set; the blocks at the
    # end of backward MoE ones) +28.46 % / +15.28 % (bwd_end), +3.11 % (loss_bwd)
    ("mixtral-dense", 2, 2, 1.0, NONE),
    ("mixtral-dense", 2, 4, 1.0, FULL),
    ("mixtral-dense", 2, 4, 1.0, NONE, "shard_grad_op"),
    # TP 4 and 8 (dp 2 and 1). Measured 2026-11-26 (worst moment): TP 4 x EP 2 none +1.40 %
    # (block_bwd), TP 4 x EP 4 full -0.42 % (bwd_end), TP 8 x EP 8 full -0.62 % (block_bwd;
    # +3.15 % in forward before a group of one rank, dp = 1 and efsdp = 1, gathered
    # nothing at the forward's all-gather), TP 8 x EP 2 none +1.58 % (block_bwd)
    ("mixtral-kv8", 4, 2, 1.0, NONE),
    ("mixtral-kv8", 4, 4, 1.0, FULL),
    ("mixtral-kv8", 8, 8, 1.0, FULL),
    ("mixtral-kv8", 8, 2, 1.0, NONE),
    # op-level selective checkpointing beside TP (activations.tp_sac_kept: the row-parallel
    # linears' kept Partial output whole, the reduce-scatters' outputs kept; the shared
    # experts' gathered input not). The request still refuses it (expert_parallel.
    # ep_tp_problem: DeepSeek-V3's layout at h 1024 misses the block's backward by +2.68 %,
    # benchmarks/ep_trace_accuracy.py); the estimator is held to the trace here so that the
    # kept set stays right. Measured 2026-11-26 (planner - trace, worst moment):
    # Mixtral-like TP 2 x EP 2 -0.66 % (bwd_end; before the TP fix loss_bwd -0.97 %),
    # Scout-like + shared TP 2 x EP 2 -1.54 % (bwd_end; before forward -2.44 %), Mixtral +
    # dense TP 2 x EP 2 -1.73 % (forward; before -2.46 %), TP 4 x EP 2 +1.37 % (block_bwd)
    ("mixtral", 2, 2, 1.0, SEL),
    ("scout-shared", 2, 2, 1.0, SEL),
    ("mixtral-dense", 2, 2, 1.0, SEL),
    ("mixtral-kv8", 4, 2, 1.0, SEL),
]

# Misses over 2 % (measured 2026-11-26):
# - DeepSeek-V3's shape under EP 2 x TP 2: bwd_end -2.57 % (every other moment within 0.9 %).
#   Not EP's: the same 1.58 MB is missing at bwd_end for a dense model under TP 2 alone (the
#   reference model with ffn 1024, 8 kv heads, no MoE: -3.51 %, the planner's TP model at
#   the root's backward: the trace holds 6.3 MB of the root's unsharded gradients there); at
#   the small widths of DeepSeek-V3's ffn 144 it is over 2 % of the step.
# - Scout's shape (n > E: the experts Shard(1) on efsdp) under EP 2 x TP 2, no
#   checkpointing: block_bwd -2.45 % (-3.1 MB; EP 2 alone -0.26 %, EP 4 x TP 2 full -1.96 %).
#   Not found in time: the trace's block backward peaks with 15.2 MB of temporaries and
#   6.9 MB fewer gathered parameters than the planner's moment (the unit and the prefetched
#   one beside the block's backward transient).
# - TP 4 and 8 (measured 2026-11-26): DeepSeek-V3's shape at TP 8 x EP 2 block_bwd -2.34 %
#   (-1.69 MB, of which 0.52 MB the states of the router and norms, which TP leaves whole:
#   not modelled; at ffn 144 they are 1.1 % of the states) and bwd_end -2.54 % (the dense
#   TP root miss). (Scout's shape with 8 kv heads at TP 4 x EP 2: block_bwd -1.998 %, the
#   Scout-like block backward miss above at the edge: in neither list.)
TP_MISSES = [("dsv3", 2, 2, 1.0, NONE), ("scout", 2, 2, 1.0, NONE),
             ("dsv3", 8, 2, 1.0, NONE)]


def _compare_tp(shape: str, tp: int, ep: int, imb: float, ck: Checkpointing,
                strategy: str = "full_shard"):
    model = SHAPES[shape]
    training = TrainingSpec(seq=1024, micro_batch=1, ep=ep, ep_imbalance=imb)
    cand = Candidate(strategy=Strategy(strategy), checkpointing=ck, tp=tp)
    result = trace_step(model, training, cand, N, 8)
    c = compare(model, training, cluster(), cand, result)
    assert c.ok, c.reason
    return c


@pytest.mark.parametrize("case", TP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_ep_beside_tp_every_moment(case) -> None:
    c = _compare_tp(*case)
    assert abs(c.peak.rel_error) <= 0.02, c.peak
    for name, pair in c.moments.items():
        assert abs(pair.rel_error) <= 0.02, (name, pair)
    _states_but_the_replicated(c, SHAPES[case[0]], case[1])


def _replicated_over_tp(model: ModelSpec, tp: int) -> int:
    """fp32 bytes one rank holds more than an even split of the weights TP leaves whole (the
    router, E x h per MoE block, and the norms, h each: FSDP2 over dp = N / tp ranks only,
    each parameter padded to a multiple of dp), which the planner's TP model leaves out."""
    dp = N // tp

    def held(elems: int, ranks: int) -> int:
        return -(-elems // ranks)

    per_block = [model.n_experts * model.hidden, model.hidden, model.hidden]
    elems = [*per_block * (model.n_layers - model.n_dense_layers),
             *[model.hidden] * 2 * model.n_dense_layers, model.hidden]  # + the final norm
    return 4 * sum(held(e, dp) - held(e, N) for e in elems)


def _states_but_the_replicated(c, model: ModelSpec, tp: int) -> None:
    # params, gradients (fp32) and the optimizer's bytes (AdamW's two states and the
    # foreach step's temporary copy of the rank's elements): the planner's less by exactly
    # the replicated weights' (within 0.02 %: FSDP2's padding of the rest)
    extra = _replicated_over_tp(model, tp)
    for name, k in (("params", 1), ("gradients", 1), ("optimizer", 3)):
        pair = c.categories[name]
        gap = pair.traced_bytes - pair.predicted_bytes
        assert abs(gap - k * extra) <= 2e-4 * pair.traced_bytes, (name, pair, k * extra)


@pytest.mark.xfail(strict=True, reason="EP x TP: DeepSeek-V3-like bwd_end -2.57 % (the dense "
                   "TP model's root backward), Scout-like EP 2 block_bwd -2.45 % (not found); "
                   "at TP 4 / 8 the same two, see TP_MISSES")
@pytest.mark.parametrize("case", TP_MISSES, ids=lambda c: "-".join(map(str, c)))
def test_ep_beside_tp_misses(case) -> None:
    c = _compare_tp(*case)
    for name, pair in c.moments.items():
        assert abs(pair.rel_error) <= 0.02, (name, pair)


@pytest.mark.parametrize("shape, tp, ep, ck", [("dsv3-shared", 2, 2, NONE),
                                               ("dsv3-full", 2, 4, FULL),
                                               ("dsv3-full", 4, 4, FULL),
                                               ("dsv3", 2, 4, SEL)])
def test_ep_beside_tp_deepseek_layout(shape: str, tp: int, ep: int, ck: Checkpointing) -> None:
    # DeepSeek-V3's layout (its shared expert; with a dense first block) beside TP 2: every
    # moment within 2 % but bwd_end, whose miss is the dense TP model's root backward
    # (TP_MISSES): the shared experts and the dense block add nothing to it (the same bytes
    # missing with and without them). Measured 2026-11-26, shared, EP 2, none: forward
    # -0.85 %, loss_bwd -0.24 %, block_bwd -0.27 %, bwd_end -2.48 % (-1.67 MB, as without
    # shared experts), optimizer -0.16 %; before they were modelled forward -3.64 % (their
    # gathered input, 4 x 1,048,576 B). Shared + dense, EP 4, full: forward -1.32 %,
    # block_bwd -0.18 %, bwd_end -2.66 % (-1.63 MB); before -1.98 % (block_bwd), +3.07 %
    # (bwd_end, EP 2). TP 4 x EP 4 full: forward -1.45 %, block_bwd -0.37 %, bwd_end
    # -1.79 %. Selective, TP 2 x EP 4: forward -0.91 %, block_bwd +1.43 %, bwd_end -2.71 %
    # (-1.67 MB, as without checkpointing); before the TP fix forward -2.83 %.
    c = _compare_tp(shape, tp, ep, 1.0, ck)
    base = _compare_tp("dsv3", tp, 2, 1.0, NONE)
    for name, pair in c.moments.items():
        if name != "bwd_end":
            assert abs(pair.rel_error) <= 0.02, (name, pair)

    def miss(x):
        return x.moments["bwd_end"].predicted_bytes - x.moments["bwd_end"].traced_bytes

    assert abs(miss(c) - miss(base)) <= 2e-3 * c.moments["bwd_end"].traced_bytes
    # the router and norms replicated over TP (FSDP2 over dp only; not modelled): 0.16 % of
    # the states at this shape's small experts
    _states_but_the_replicated(c, SHAPES[shape], tp)


def test_per_param_mesh_view_restores_fsdp_state() -> None:
    # the trace lets torch's FSDPMemTracker read a per-parameter-mesh state (two param
    # groups) while it runs, and leaves FSDPState as it was
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    from probes.ep_trace import per_param_mesh_view

    before = FSDPState.__dict__["_fsdp_param_group"]
    with per_param_mesh_view():
        assert FSDPState.__dict__["_fsdp_param_group"] is not before
    assert FSDPState.__dict__["_fsdp_param_group"] is before


# EP beside context parallel (docs/model.md "Expert parallel", "Beside context parallel"):
# torchtitan's layout, the dense parameters FSDP2-sharded over dp_shard x cp (every rank
# here), the experts over efsdp = n / ep, the ring attention of probes/context_parallel.py
# (all-gather rotation, keys and values repeated) in every block, each rank routing its own
# seq / cp tokens. Every cp rank is traced (the ring's load balancing gives rank 0 the
# half-query steps): the planner against the largest. Measured 2026-11-26, planner - trace
# over the worst rank, seq 2048 (1024 local tokens): Mixtral-like EP 2 none: forward
# -0.15 %, loss -0.05 %, block backward -1.03 %, bwd_end / optimizer exact; DeepSeek-V3-like
# EP 4 full: -0.42 / -0.00 / +0.74 % (selective, EP 4 none, EP 2 full and the other shape:
# h 1024 in benchmarks/ep_trace_accuracy.py; measured here at h 512: Mixtral-like EP 2
# selective +0.39 / -0.00 / -1.14 %, DeepSeek-V3-like EP 2 / 4 selective -0.25 / -0.00 / +1.23 %
# / +1.26 %, every other moment exact).
CP_CASES = [
    # (shape, ep, cp, checkpointing)
    ("mixtral", 2, 2, NONE),
    ("dsv3", 4, 2, FULL),
]

# MoE under CP without EP (the reference's capacity MoE, which the planner refuses under CP):
# Mixtral-like forward -3.85 %, loss -1.92 % (DeepSeek-V3-like: forward -10.14 %, block
# backward -13.36 %). Not CP's: the same shapes without CP (seq 1024, one rank) miss by
# -3.61 % / -10.31 % in forward; the reference's dispatch buffer (index_add's output,
# (E C + 1) x h), the gathered expert rows and their weighted copy are three c N k h tensors
# per block where the planner's capacity MoE counts two (planner/arch/mlp.py ``Moe.saved``).
CP_MISSES = [("mixtral", 1, 2, NONE)]


def _compare_cp(shape: str, ep: int, cp: int, ck: Checkpointing) -> dict[str, float]:
    from probes.compare import every_cp_rank

    model = SHAPES[shape]
    training = TrainingSpec(seq=2048, micro_batch=1, ep=ep, cp=cp)
    cand = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck)
    worst = every_cp_rank(model, training, cand, cluster(), N, 8)
    assert set(worst) == {"forward", "loss_bwd", "block_bwd", "bwd_end", "optimizer"}
    return {m: (p - t) / t for m, (t, p) in worst.items()}


@pytest.mark.parametrize("case", CP_CASES, ids=lambda c: "-".join(map(str, c)))
def test_ep_beside_cp_every_moment(case) -> None:
    for m, err in _compare_cp(*case).items():
        assert abs(err) <= 0.02, (case, m, f"{err:+.2%}")


@pytest.mark.xfail(strict=True, reason="MoE under CP without EP: the reference's capacity MoE "
                   "-3.85 % in forward, as without CP (refused; see CP_MISSES)")
@pytest.mark.parametrize("case", CP_MISSES, ids=lambda c: "-".join(map(str, c)))
def test_moe_under_cp_without_ep(case) -> None:
    for m, err in _compare_cp(*case).items():
        assert abs(err) <= 0.02, (case, m, f"{err:+.2%}")
