"""Pipeline parallel (``--pp``): the schedule counts against torch's own action lists, the
layer split, the memory of a stage derived by hand, the request's refusals.

The referee of ``planner.pipeline.peak_in_flight`` is torch itself: every schedule builds its
per-rank action list (``pipeline_order``) from stand-in stages (the schedules read only a
stage's index, count and group), and the test walks it, counting the (stage, micro-batch)
pairs whose forward has run and whose backward (full, or the weight half after a split
backward) has not. The V-shaped schedules (ZBV, DualPipeV) are held to torch's action lists
action by action (``pipeline.split_actions``).
"""

from __future__ import annotations

import types

import pytest

from planner import pipeline
from planner.errors import UsageError
from planner.params import block_tensors, numel, root_tensors
from planner.spec import PipeSchedule, Pipeline

GRID = [(pp, m) for pp in (2, 3, 4, 8) for m in (1, 2, 3, 4, 5, 6, 8, 12, 16)]


# ---- the referee: torch's schedules ---------------------------------------------------------

def _torch_orders(schedule: PipeSchedule, pp: int, m: int, v: int) -> dict[int, list]:
    """Each rank's action list as torch builds it (GPipe / 1F1B: the single-stage schedules'
    ``_get_pipeline_order``; the multi-stage ones: ``pipeline_order``, which their runtime
    executes)."""
    from torch.distributed.pipelining import schedules as S

    cls = {PipeSchedule.GPIPE: S.ScheduleGPipe, PipeSchedule.ONE_F_ONE_B: S.Schedule1F1B,
           PipeSchedule.INTERLEAVED_1F1B: S.ScheduleInterleaved1F1B,
           PipeSchedule.ZBV: S.ScheduleZBVZeroBubble,
           PipeSchedule.DUALPIPEV: S.ScheduleDualPipeV,
           PipeSchedule.INTERLEAVED_ZB: S.ScheduleInterleavedZeroBubble}[schedule]
    n = pp * v

    def stage(i: int, rank: int):
        return types.SimpleNamespace(num_stages=n, group_size=pp, group_rank=rank,
                                     stage_index=i, is_first=i == 0, is_last=i == n - 1,
                                     submod=None)

    out = {}
    for rank in range(pp):
        idx = pipeline.rank_stages(Pipeline(degree=pp, schedule=schedule, virtual=v,
                                            microbatches=m), rank)
        if v == 1:
            order = cls(stage(idx[0], rank), m)._get_pipeline_order()
        else:
            order = cls([stage(i, rank) for i in idx], m).pipeline_order
        out[rank] = order[rank]
    return out


def _held_peak(actions: list) -> int:
    """The most (stage, micro-batch) pairs forwarded and not yet backwarded at once, counted
    per stage (a count, not micro-batch ids: torch's 1F1B visualization numbers the last
    rank's micro-batches from 1)."""
    from torch.distributed.pipelining import schedules as S

    held: dict[int, int] = {}
    peak = 0
    for a in actions:
        for x in (a.sub_actions or (a,)) if a is not None else ():
            if x.computation_type == S.FORWARD:
                held[x.stage_index] = held.get(x.stage_index, 0) + 1
            elif x.computation_type in (S.FULL_BACKWARD, S.BACKWARD_WEIGHT):
                held[x.stage_index] -= 1
            peak = max(peak, sum(held.values()))
    return peak


@pytest.mark.trace
@pytest.mark.parametrize("schedule,v", [(PipeSchedule.GPIPE, 1), (PipeSchedule.ONE_F_ONE_B, 1),
                                        (PipeSchedule.INTERLEAVED_1F1B, 2),
                                        (PipeSchedule.INTERLEAVED_1F1B, 3),
                                        (PipeSchedule.ZBV, 2), (PipeSchedule.DUALPIPEV, 2),
                                        (PipeSchedule.INTERLEAVED_ZB, 2),
                                        (PipeSchedule.INTERLEAVED_ZB, 3)])
def test_in_flight_matches_torch_schedules(schedule, v):
    checked = 0
    for pp, m in GRID:
        p = Pipeline(degree=pp, schedule=schedule, virtual=v, microbatches=m)
        if pipeline.schedule_problem(p, n_layers=64):
            continue  # a pipeline torch refuses (1F1B with M < pp, uneven rounds)
        orders = _torch_orders(schedule, pp, m, v)
        got = [pipeline.peak_in_flight(p, r) for r in range(pp)]
        want = [_held_peak(orders[r]) for r in range(pp)]
        assert got == want, (schedule, pp, m, v)
        checked += 1
    assert checked >= 14  # DualPipeV runs only M >= 2 pp: 14 of the grid


@pytest.mark.trace
def test_interleaved_mix_of_stages_matches_torch():
    """The stages of a rank differ in size (torchtitan's split gives the first and last one
    layer less): the peak of held bytes is the heaviest mix of stages over time. Against
    torch's interleaved action lists with random stage sizes."""
    import random

    from torch.distributed.pipelining import schedules as S

    rng = random.Random(0)
    for pp, m in GRID:
        for v in (2, 3):
            p = Pipeline(degree=pp, schedule=PipeSchedule.INTERLEAVED_1F1B, virtual=v,
                         microbatches=m)
            if pipeline.schedule_problem(p, n_layers=64):
                continue
            orders = _torch_orders(PipeSchedule.INTERLEAVED_1F1B, pp, m, v)
            for rank in range(pp):
                w = {s: rng.randint(1, 9) for s in pipeline.rank_stages(p, rank)}
                held: dict[int, int] = dict.fromkeys(w, 0)
                want = 0
                for a in orders[rank]:
                    if a is None:
                        continue
                    if a.computation_type == S.FORWARD:
                        held[a.stage_index] += 1
                    elif a.computation_type == S.FULL_BACKWARD:
                        held[a.stage_index] -= 1
                    want = max(want, sum(w[s] * k for s, k in held.items()))
                mine: dict[int, int] = dict.fromkeys(w, 0)
                got = 0
                for kind, s in pipeline.rank_ops(p, rank):
                    mine[s] += 1 if kind == "F" else -1
                    got = max(got, sum(w[x] * k for x, k in mine.items()))
                assert got == want, (pp, m, v, rank)


def _flat(actions: list) -> list:
    """torch's compute actions as ``pipeline.Op``s: empty slots dropped, an OVERLAP_F_B pair
    as its two actions in the order its runtime runs them (``_step_microbatches``)."""
    from torch.distributed.pipelining import schedules as S

    kind = {S.FORWARD: "F", S.BACKWARD_INPUT: "I", S.BACKWARD_WEIGHT: "W",
            S.FULL_BACKWARD: "B"}
    return [pipeline.Op(kind[x.computation_type], x.stage_index, x.microbatch_index)
            for a in actions if a is not None for x in (a.sub_actions or (a,))]


@pytest.mark.trace
@pytest.mark.parametrize("schedule,v", [(PipeSchedule.ZBV, 2), (PipeSchedule.DUALPIPEV, 2),
                                        (PipeSchedule.INTERLEAVED_ZB, 2),
                                        (PipeSchedule.INTERLEAVED_ZB, 3)])
def test_split_actions_are_torchs(schedule, v):
    """Every action of every rank, in order, as ScheduleZBVZeroBubble, ScheduleDualPipeV and
    ScheduleInterleavedZeroBubble build them (``pipeline_order``; the empty slots the last
    one adds are no actions), over pp 2..8 and M 1..32."""
    checked = 0
    for pp in (2, 3, 4, 8):
        for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32):
            p = Pipeline(degree=pp, schedule=schedule, virtual=v, microbatches=m)
            if pipeline.schedule_problem(p, n_layers=64):
                continue  # DualPipeV with fewer micro-batches than stages, uneven rounds
            orders = _torch_orders(schedule, pp, m, v)
            for rank in range(pp):
                assert pipeline.split_actions(p, rank) == _flat(orders[rank]), (pp, m, rank)
                checked += 1
    assert checked >= 90  # DualPipeV runs only M >= 2 pp: 92


@pytest.mark.trace
@pytest.mark.parametrize("schedule,v", [(PipeSchedule.GPIPE, 1), (PipeSchedule.ONE_F_ONE_B, 1),
                                        (PipeSchedule.INTERLEAVED_1F1B, 2),
                                        (PipeSchedule.INTERLEAVED_1F1B, 3)])
def test_rank_ops_match_torch_schedules(schedule, v):
    """``pipeline.rank_ops`` (the forwards and backwards of a rank, in order, with their
    stages: which stages have run a backward at each moment) against torch's action lists:
    the interleaved one exactly as ``pipeline_order`` holds it (the runtime executes it);
    GPipe's and 1F1B's action lists number the micro-batches for display, so there the
    order of forwards and backwards is compared."""
    from torch.distributed.pipelining import schedules as S

    for pp, m in GRID:
        p = Pipeline(degree=pp, schedule=schedule, virtual=v, microbatches=m)
        if pipeline.schedule_problem(p, n_layers=64):
            continue
        orders = _torch_orders(schedule, pp, m, v)
        for rank in range(pp):
            want = [("F" if x.computation_type == S.FORWARD else "B", x.stage_index)
                    for a in orders[rank] if a is not None
                    for x in (a.sub_actions or (a,))
                    if x.computation_type in (S.FORWARD, S.FULL_BACKWARD)]
            assert pipeline.rank_ops(p, rank) == want, (schedule, pp, m, v, rank)


@pytest.mark.trace
def test_torch_refuses_what_problem_refuses():
    """1F1B with fewer micro-batches than stages, interleaved with uneven rounds and
    DualPipeV with fewer micro-batches than stages are refused by torch's constructors as by
    ``pipeline.problem``."""
    for schedule, v, pp, m in ((PipeSchedule.ONE_F_ONE_B, 1, 4, 3),
                               (PipeSchedule.INTERLEAVED_1F1B, 2, 4, 9),
                               (PipeSchedule.DUALPIPEV, 2, 4, 7)):
        assert pipeline.schedule_problem(Pipeline(degree=pp, schedule=schedule, virtual=v,
                                                  microbatches=m), n_layers=64)
        with pytest.raises(ValueError):
            _torch_orders(schedule, pp, m, v)


# ---- hand-derived counts --------------------------------------------------------------------

def test_in_flight_by_hand():
    # 1F1B, pp 4, M 8: stage s runs min(8, 4 - s) warm-up forwards -> 4, 3, 2, 1
    p = Pipeline(degree=4, schedule=PipeSchedule.ONE_F_ONE_B, microbatches=8)
    assert [pipeline.peak_in_flight(p, r) for r in range(4)] == [4, 3, 2, 1]
    # GPipe holds all 8 everywhere
    p = Pipeline(degree=4, schedule=PipeSchedule.GPIPE, microbatches=8)
    assert [pipeline.peak_in_flight(p, r) for r in range(4)] == [8] * 4
    # interleaved, pp 4, v 2, M 8: rounds = 8 // 4 = 2, per round 4; rank 0 warm-up
    # (2 - 1) * 4 + 2 * 3 = 10 < 16, plus the first steady forward: 11
    p = Pipeline(degree=4, schedule=PipeSchedule.INTERLEAVED_1F1B, virtual=2, microbatches=8)
    assert pipeline.peak_in_flight(p, 0) == 11
    # ZBV, pp 4, M 8, rank 1: min(8, 2*4 - 1 - 1) + min(8, 2) = 6 + 2 = 8
    p = Pipeline(degree=4, schedule=PipeSchedule.ZBV, virtual=2, microbatches=8)
    assert pipeline.peak_in_flight(p, 1) == 8


def test_walk_reduces_each_stage_after_its_last_backward():
    """Interleaved 1F1B, pp 2, v 2, M 2, rank 0 (stages 0 and 2). rounds = max(1, 2 // 2) = 1,
    per_round = 2, warmup = min((2 - 1) x 2 + 2 x (2 - 1 - 0), 4) = 4: every forward first
    (forward i on local stage (i // 2) % 2: 0, 0, 2, 2), then the backwards (backward j on
    local stage 1 - (j // 2) % 2: 2, 2, 0, 0). With a held micro-batch of 10 / 20 B, unsharded
    parameters 100 / 200 B, unsharded gradients 1000 / 2000 B and sharded gradients 1 / 2 B
    (stage 0 / 2), by hand:
      after the forwards: 10, 20, 40, 60 held, no gradient, 300 gathered;
      stage 2's backwards: start 60 / 40 held with 0 / 2000 B of gradients, end 40 / 20 held
      with 2000; its 2nd (= M-th) is its last: reduced there (20 held, 2000, 300 gathered),
      then its unsharded parameters and gradients go, its sharded 2 B stay;
      stage 0's: start 20 / 10 held with 2 / 1002, end 10 / 0 with 1002, 100 gathered;
      reduced after the last (0 held, 1002, 100)."""
    from planner.memory.pipeline import StageBytes, walk

    p = Pipeline(degree=2, schedule=PipeSchedule.INTERLEAVED_1F1B, virtual=2, microbatches=2)
    assert pipeline.rank_ops(p, 0) == [("F", 0), ("F", 0), ("F", 2), ("F", 2),
                                       ("B", 2), ("B", 2), ("B", 0), ("B", 0)]
    w = walk(p, 0, {0: StageBytes(held=10, gathered=100, grads=1000, sharded_grads=1),
                    2: StageBytes(held=20, gathered=200, grads=2000, sharded_grads=2)})

    def rows(ms):
        return [(m.activations, m.gradients, m.gathered, m.stage) for m in ms]

    assert rows(w.after_forward) == [(10, 0, 300, 0), (20, 0, 300, 0), (40, 0, 300, 2),
                                     (60, 0, 300, 2)]
    assert rows(w.backward_start) == [(60, 0, 300, 2), (40, 2000, 300, 2), (20, 2, 100, 0),
                                      (10, 1002, 100, 0)]
    assert rows(w.backward_end) == [(40, 2000, 300, 2), (20, 2000, 300, 2), (10, 1002, 100, 0),
                                    (0, 1002, 100, 0)]
    assert rows(w.reduce) == [(20, 2000, 300, 2), (0, 1002, 100, 0)]


def test_walk_keeps_outputs_past_their_backward():
    """--pp-kept-outputs: the stage output stays past its micro-batch's backward (torch's
    ``output_chunks``). 1F1B, pp 2, M 4, rank 0: warm-up pp - 1 - 0 = 1 forward more, so
    F F B F B F B B. A held micro-batch of 10 B of which 3 B are its output, by hand:
      B0 starts with 2 held: 20; after it 20 - 10 + 3 = 13; F2: 23 (B1's start);
      after B1 16; F3: 26 (B2's start); after B2 19 (B3's start); after B3 4 x 3 = 12,
    where the stage is reduced (none kept: 10, 20, 20, 10 and 0)."""
    from planner.memory.pipeline import StageBytes, walk

    p = Pipeline(degree=2, schedule=PipeSchedule.ONE_F_ONE_B, microbatches=4)
    assert pipeline.rank_ops(p, 0) == [("F", 0), ("F", 0), ("B", 0), ("F", 0), ("B", 0),
                                       ("F", 0), ("B", 0), ("B", 0)]
    for kept, starts, end in ((3, [20, 23, 26, 19], 12), (0, [20, 20, 20, 10], 0)):
        w = walk(p, 0, {0: StageBytes(held=10, gathered=0, grads=0, sharded_grads=0,
                                      kept=kept)})
        assert [m.activations for m in w.backward_start] == starts
        assert [m.activations for m in w.reduce] == [end]


def test_kept_logits_raise_the_last_rank_by_hand():
    """SMALL (8 layers, h 512, V 32000, seq 1024, micro-batch 1, bf16-amp: c = 2), pp 2,
    1F1B, M 4, rank 1 (the last stage, F B F B F B F B): with the last stage's logits kept
    (--pp-kept-outputs last), the last backward starts with the three earlier micro-batches'
    logits beside the held one: 3 x 1024 x 32000 x 2 B = 196,608,000 B more at the peak
    (traced, torch 2.13 with return_outputs=True: -0.12 %, benchmarks/pipeline_trace_accuracy
    .py). GPipe holds every micro-batch at its first backward anyway: the same peak.
    'all' on rank 0 of 1F1B adds the block outputs kept past B0 and B1 at B2's start:
    (by the walk above) 2 x 1024 x 512 x 2 B = 2,097,152 B."""
    def peak(extra: dict, rank: int) -> int:
        return BENCH.planned_rank(BENCH.values_of(extra), rank)

    assert peak({"parallel.pp_kept_outputs": "last"}, 1) - peak({}, 1) == 196_608_000
    gp = {"parallel.pp_schedule": "gpipe"}
    assert peak({**gp, "parallel.pp_kept_outputs": "last"}, 1) == peak(gp, 1)
    assert peak({"parallel.pp_kept_outputs": "all"}, 0) - peak({}, 0) == 2_097_152


@pytest.mark.parametrize("args, needles", [
    (["--pp-kept-outputs", "all"], ["--pp-kept-outputs", "needs --pp > 1"]),
    (["--pp", "2", "--pp-schedule", "zbv", "--pp-kept-outputs", "last"],
     ["--pp-kept-outputs", "zbv", "NOT MODELLED"]),
    (["--pp", "2", "--pp-kept-outputs", "some"], ["--pp-kept-outputs", "some"]),
])
def test_bad_kept_outputs_is_one_line(args, needles):
    from conftest import one_line_error, run

    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", *args)
    one_line_error(r, 2, *needles)


def test_zbv_actions_by_hand():
    """ZBV, pp 2, M 4, rank 0 (stages a = 0 and b = 3), from the phases of
    ``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (n = max(2 x 2 - 1, 4) = 4):
    warm-up 2 x (2 - 0) - 1 = 3 forwards of a; 0 pairs (F b, F a); 2 x (F b, I b, W b);
    steady: a has run 3 < 4 forwards -> F a, I a, W a, F b, I b, W b; then b has run 3 < 4
    -> I a, W a, F b, I b, W b (a has run its 4); cool-down: 0 x (I a, I b), 2 x (I a, W a).
    Micro-batches count up per stage and kind."""
    p = Pipeline(degree=2, schedule=PipeSchedule.ZBV, virtual=2, microbatches=4)
    got = [f"{op.kind}{op.stage}.{op.mb}" for op in pipeline.split_actions(p, 0)]
    assert got == ["F0.0", "F0.1", "F0.2",
                   "F3.0", "I3.0", "W3.0", "F3.1", "I3.1", "W3.1",
                   "F0.3", "I0.0", "W0.0", "F3.2", "I3.2", "W3.2",
                   "I0.1", "W0.1", "F3.3", "I3.3", "W3.3",
                   "I0.2", "W0.2", "I0.3", "W0.3"]
    # rank 0 holds the embedding's stage and the head's
    assert pipeline.rank_stages(p, 0) == (0, 3) and pipeline.rank_stages(p, 1) == (1, 2)


def test_dualpipev_actions_by_hand():
    """DualPipeV, pp 2, M 4, rank 1 (a = 1, b = 2), the steps of
    ``ScheduleDualPipeV._calculate_single_rank_operations``: 1. 2 x (2 - 1 - 1) = 0 F a;
    2. 2 x (F a, F b); 3. 0 x (I b, W, F b); 4. 4 - 4 + 1 + 1 = 2 x (F a, B b, F b, B a);
    5. none; 6. 2 backwards each of b then a, i = 0, 1; rank 1 is odd: from i = 2 // 2 = 1 on
    b's backward and then a's are input-only; 7. none; 8. 2 x W (the queued I b, I a)."""
    p = Pipeline(degree=2, schedule=PipeSchedule.DUALPIPEV, virtual=2, microbatches=4)
    got = [f"{op.kind}{op.stage}.{op.mb}" for op in pipeline.split_actions(p, 1)]
    assert got == ["F1.0", "F2.0", "F1.1", "F2.1",
                   "F1.2", "B2.0", "F2.2", "B1.0", "F1.3", "B2.1", "F2.3", "B1.1",
                   "B2.2", "B1.2", "I2.3", "I1.3", "W2.3", "W1.3"]
    # at most: step 2's 4 forwards and step 4's first, before the first backward
    assert pipeline.peak_in_flight(p, 1) == 5


def test_stage_split_as_torchtitan():
    # torchtitan's docstring example style: 32 layers, 8 stages -> 34 effective, 4 each, the
    # first two stages 5 (34 % 8 = 2): [5-1, 5, 4, 4, 4, 4, 4, 4-1] = 4,5,4,4,4,4,4,3
    assert pipeline.stage_layers(32, 8) == [4, 5, 4, 4, 4, 4, 4, 3]
    # 32 layers, 4 stages: 34 -> 8 each, the first two 9: [8, 9, 8, 7]
    assert pipeline.stage_layers(32, 4) == [8, 9, 8, 7]
    assert sum(pipeline.stage_layers(80, 16)) == 80
    with pytest.raises(ValueError):
        pipeline.stage_layers(4, 8)  # more stages than 4 + 2 effective layers


def test_bubble_by_hand():
    # GPipe/1F1B pp 4, M 8: idle (pp - 1) / M = 3/8 of the busy time, i.e. 3/11 of the step
    assert pipeline.bubble_ratio(Pipeline(degree=4, microbatches=8)) == 3 / 8
    # interleaved v 2: 3 / 16
    assert pipeline.bubble_ratio(Pipeline(degree=4, schedule=PipeSchedule.INTERLEAVED_1F1B,
                                          virtual=2, microbatches=8)) == 3 / 16


def test_split_bubble_by_hand():
    """The split-backward schedules with equal forward, input- and weight-backward times (1
    each; a full backward 2; torch runs the first stage's whole backward in its W): a rank
    runs v stages x M x 3 = 3 v M. Rank pp - 1 cannot start before the pp - 1 forwards of
    the stages before its first have run one after the other; from then on the schedules
    keep every rank busy (Qi et al. 2024: zero bubble at equal times), so the step is
    3 v M + pp - 1 and the bubble (pp - 1) / (3 v M) of the busy time: v 2, pp 4, M 8:
    3 / 48; pp 2, M 4: 1 / 24; pp 8, M 16: 7 / 96 (1F1B at the same M: 3/8, 1/4, 7/16);
    interleaved-zb v 3, pp 4, M 8: 3 / 72."""
    for schedule, v in ((PipeSchedule.ZBV, 2), (PipeSchedule.DUALPIPEV, 2),
                        (PipeSchedule.INTERLEAVED_ZB, 2), (PipeSchedule.INTERLEAVED_ZB, 3)):
        for pp, m in ((4, 8), (2, 4), (8, 16)):
            p = Pipeline(degree=pp, schedule=schedule, virtual=v, microbatches=m)
            assert pipeline.split_step(p) == (3 * v * m + pp - 1, 3 * v * m)
            assert pipeline.bubble_ratio(p) == pytest.approx((pp - 1) / (3 * v * m))


# ---- memory of a stage, by hand --------------------------------------------------------------

def _bench():
    """benchmarks/pipeline_trace_accuracy.py: every traced configuration, the referee's
    runner and the planner's rank peak (loaded as tests/test_calibration.py loads its
    benchmark)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "pipeline_trace_accuracy.py"
    spec = importlib.util.spec_from_file_location("pipeline_trace_accuracy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
SMALL = BENCH.SMALL
FLAG_PATH = {"--n": "hardware.n", "--pp": "parallel.pp", "--pp-schedule": "parallel.pp_schedule",
             "--pp-microbatches": "parallel.pp_microbatches",
             "--pp-virtual-stages": "parallel.pp_virtual_stages", "--tp": "parallel.tp",
             "--checkpointing": "checkpointing",
             "--grad-accum": "training.grad_accum", "--seq": "training.seq",
             "--cp": "parallel.cp"}


def _request(*extra: str):
    """The request of SMALL plus ``--flag value`` pairs, as the CLI names them."""
    from planner.fields import FLAGS
    from planner.request import build_request

    values = dict(SMALL)
    values.update({FLAG_PATH[k]: v for k, v in zip(extra[::2], extra[1::2])})
    if "strategy" in values and values.get("parallel.tp"):
        values.pop("strategy")
    return build_request(values, FLAGS)


def test_stage_memory_by_hand():
    """pp 2 x dp 2 (4 GPUs), 1F1B, M 4, llama-shaped 8 layers, bf16-amp (FSDP2: fp32
    storage, bf16 gather, fp32 reduce). torchtitan's split of 8 layers in 2 stages: 10
    effective, 5 each -> stage 0: embedding + 4 blocks, stage 1: 4 blocks + norm + head.

    Rank 0, by hand:
      block = q,k,v,o (4 * 512^2, kv 512: 8 heads of 64, no GQA) + w1,w2,w3 (3 * 512 * 1536)
              + 2 norms (2 * 512) = 1,048,576 + 2,359,296 + 1,024 = 3,408,896
      embedding = 32000 * 512 = 16,384,000
      elements = 4 * 3,408,896 + 16,384,000 = 30,019,584
      gathered (bf16, kept all step) = 2 * 30,019,584 = 60,039,168 B
      unsharded gradients (fp32, held from the first backward) = 120,078,336 B
      sharded params (fp32 / 2) = 60,039,168 B; AdamW state = 2 * that = 120,078,336 B
      P2P: stage 0 is not last -> M = 4 gradient receive buffers of 1024 * 512 * 2 B
           = 4 * 1,048,576 = 4,194,304 B
      activations: min(4, 2 - 0) = 2 micro-batches in flight, each 4 blocks' kept tensors
           + the stage output (1,048,576 B) + what the root saves before the blocks.
    """
    from planner.memory.estimator import activation_plan
    from planner.memory.breakdown import Overheads, Phase
    from planner.memory.moments import Activations
    from planner.memory.pipeline import rank_phases

    r = _request("--n", "4", "--pp", "2", "--pp-microbatches", "4")
    m, t = r.model, r.training
    block = sum(numel(s) for _, s in block_tensors(m))
    assert block == 3_408_896
    emb = dict(root_tensors(m))["embed.weight"]
    assert numel(emb) == 16_384_000
    from planner.spec import Candidate, Checkpointing, Strategy

    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    acts = Activations.of(activation_plan(m, t, c))
    ph = rank_phases(m, t, 0, 2, acts, Overheads())
    bwd = ph[Phase.BLOCK_BWD]
    assert bwd.gathered_params == 60_039_168
    assert bwd.gradients == 120_078_336
    assert bwd.params == 60_039_168
    assert bwd.optimizer_states == 120_078_336
    assert bwd.comm_buffers == 4_194_304
    assert bwd.activations == 2 * (4 * acts.kept_per_block + 1_048_576 + acts.root_before)
    # 1F1B's steady phase (M 4 > 2 in flight): the peak of activations recurs with the
    # unsharded gradients held
    assert ph[Phase.FORWARD].gradients == 120_078_336
    # rank 1 (last stage): 1 in flight; head = norm (512) + output (32000 * 512)
    ph1 = rank_phases(m, t, 1, 2, acts, Overheads())
    elems1 = 4 * 3_408_896 + 512 + 16_384_000
    assert ph1[Phase.BLOCK_BWD].gathered_params == 2 * elems1
    # stage 1 is not first -> 4 activation receive buffers
    assert ph1[Phase.BLOCK_BWD].comm_buffers == 4_194_304
    logits = 1024 * 32000 * 2
    # a backward after the first starts with the previous micro-batch's input gradient (1024
    # x 512 x 2 B) still in the send ops the schedule's local holds (StageBytes.input_grad)
    assert ph1[Phase.BLOCK_BWD].activations == (4 * acts.kept_per_block
                                                + acts.root - acts.root_before + logits
                                                + 1_048_576)


def test_full_checkpointing_keeps_the_receive_buffer_once():
    """pp 2, full checkpointing, the model of test_stage_memory_by_hand (8 layers: stages of
    4 blocks), seq 1024: a block keeps its input, 1024 x 512 x 2 B = 1,048,576 B. Stage 0
    holds per micro-batch 4 of them + its output (1,048,576) + the root's before the blocks;
    stage 1's first block is given the P2P receive buffer (counted as a buffer), so it holds
    3 of them + the logits (1024 x 32000 x 2 = 65,536,000) + the root's after the blocks."""
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import stage_sizes
    from planner.spec import Candidate, Checkpointing, Strategy

    r = _request("--n", "4", "--pp", "2", "--pp-microbatches", "4")
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL)
    acts = Activations.of(activation_plan(r.model, r.training, c))
    assert acts.kept_per_block == 1_048_576
    size = stage_sizes(r.model, r.training, [4, 4], (0, 1), acts, 2, 1, Checkpointing.FULL)
    assert size[0] == 5 * 1_048_576 + acts.root_before
    assert size[1] == 3 * 1_048_576 + 65_536_000 + acts.root - acts.root_before
    # without checkpointing the saved set of docs/model.md §5 is counted as it is (the traced
    # pipeline cases without checkpointing are within 0.6 %)
    plain = stage_sizes(r.model, r.training, [4, 4], (0, 1), acts, 2, 1, Checkpointing.NONE)
    assert plain[1] - size[1] == 1_048_576


def test_pp_x_tp_stage_memory_by_hand():
    """pp 2 x dp 2 x tp 2 (8 GPUs, torchtitan's mesh pp, dp, tp), 1F1B, M 4, the model of
    test_stage_memory_by_hand, bf16-amp. Each stage is TP-parallelized (sequence parallel)
    and then FSDP2-sharded over dp.

    Rank 0 (embedding + 4 blocks), its TP piece, by hand:
      block: q, k, v split on dim 0 (3 * 256 * 512 = 393,216), o on dim 1 (512 * 256 =
             131,072), w1, w3 on dim 0 (2 * 768 * 512 = 786,432), w2 on dim 1 (512 * 768 =
             393,216), 2 norms replicated (1,024): 1,704,960
      embedding: vocabulary rows split (RowwiseParallel): 16,000 * 512 = 8,192,000
      elements = 4 * 1,704,960 + 8,192,000 = 15,011,840
      sharded params (fp32, dim 0 over dp 2): block 512 + 3 * 128 * 512 + 256 * 256
             + 2 * 384 * 512 + 256 * 768 = 852,480; embedding 8,000 * 512 = 4,096,000;
             4 * 852,480 + 4,096,000 = 7,505,920 elements -> 30,023,680 B
      gathered (bf16) = 2 * 15,011,840 = 30,023,680 B
      unsharded gradients (fp32): the embedding's is the whole table (DTensor's
             embedding backward returns it Replicate): (15,011,840 + 32,000 * 512 - 8,192,000)
             * 4 = 23,203,840 * 4 = 92,815,360 B
      P2P: 4 gradient receive buffers of 1 x 1024 / 2 x 512 bf16 (sequence-sharded) =
             4 * 524,288 = 2,097,152 B
    Rank 1 (4 blocks + norm + head): logits vocab-sharded, 1024 * 16,000 * 2 = 32,768,000 B
    per micro-batch held; the activation receive buffers 2,097,152 B.
    """
    from planner.memory.breakdown import Overheads, Phase
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import rank_phases
    from planner.spec import Candidate, Checkpointing, Strategy

    r = _request("--n", "8", "--pp", "2", "--tp", "2", "--pp-microbatches", "4")
    m, t = r.model, r.training
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE, tp=2)
    acts = Activations.of(activation_plan(m, t, c))
    ph = rank_phases(m, t, 0, 2, acts, Overheads(), 2)
    bwd = ph[Phase.BLOCK_BWD]
    assert ph[Phase.INIT].params == 30_023_680
    assert bwd.gathered_params == 30_023_680
    assert bwd.gradients == 92_815_360
    assert bwd.optimizer_states == 2 * 30_023_680
    assert bwd.comm_buffers == 2_097_152
    # 2 micro-batches in flight, each 4 blocks' kept tensors (TP's share) + the stage's
    # sequence-sharded output (1 x 512 x 512 x 2 B) + what the root saves first
    assert bwd.activations == 2 * (4 * acts.kept_per_block + 524_288 + acts.root_before)
    ph1 = rank_phases(m, t, 1, 2, acts, Overheads(), 2)
    assert ph1[Phase.BLOCK_BWD].comm_buffers == 2_097_152
    # + the previous micro-batch's input gradient in the send ops, its TP piece (1 x 512 x
    # 512 x 2 B: StageBytes.input_grad)
    assert ph1[Phase.BLOCK_BWD].activations == (4 * acts.kept_per_block
                                                + acts.root - acts.root_before + 32_768_000
                                                + 524_288)
    # the gradient of the last stage holds no whole table: 4 blocks + norm (512) + the
    # head's rows (16,000 * 512), fp32
    assert ph1[Phase.BWD_END].gradients == (4 * 1_704_960 + 512 + 8_192_000) * 4


def test_v_schedule_memory_by_hand():
    """ZBV, pp 2 x dp 2, M 4, the model of test_stage_memory_by_hand (bf16-amp: bf16 compute
    and param.grad, fp32 reduce). 8 layers in 2 x 2 = 4 stages: 10 effective layers, 2 each
    and the first two 3: [3 - 1, 3, 2, 2 - 1] = [2, 3, 2, 1] blocks. Rank 0 holds stages 0
    (embedding + 2 blocks) and 3 (1 block + norm + head), rank 1 stages 1 (3 blocks) and 2
    (2 blocks), the V's adjacent pair. t = 1024 tokens.

    Between its input and weight backward a micro-batch keeps every op's output gradient:
    per block q, k, v, o 4 x 512 + gate, up 2 x 1536 + down 512 + 2 norms 2 x 512 = 6,656
    features, x t x 2 B = 13,631,488 B; stage 1: 3 blocks = 40,894,464; stage 2: 27,262,976;
    stage 3: 1 block + final norm 512 + head 32,000 = 39,168 x 2,048 = 80,216,064, less the
    loss's log-softmax (1024 x 32000 x 4 = 131,072,000) and the logits (65,536,000) its
    output detach frees; stage 0 runs no input backward: unchanged.

    Rank 1's actions (test_split_actions_are_torchs): F1 F2 F1 F2 I2 W2 F1 I1 W1 F2 I2 W2 F1 I1
    W1 F2 I2 W2 I1 I2 I1 W1 W2 W1. With s1 = 3 kept (its output is stage 2's input buffer)
    and s2 = 2 kept + 1,048,576 (its output), the fullest forward is the last, F2 after W1:
    2 s1 + 2 s2 held; both stages then hold an fp32 gradient (folded in by an I) and a bf16
    param.grad (left by a W): 5 blocks x 3,408,896 x (4 + 2) = 102,266,880 B. Buffers: P2P
    4 x 1,048,576 x 4 (stages 1 and 2 each receive activations and gradients) = 16,777,216,
    plus stage 1's received inputs' gradients kept as .grad, one per input backward so far
    (2): 18,874,368 (stage 2's go to stage 1 as its output gradients)."""
    from planner.memory.breakdown import Overheads, Phase
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import rank_phases, split_sizes, stage_sizes, weight_op_width
    from planner.spec import Candidate, Checkpointing, Strategy

    r = _request("--n", "4", "--pp", "2", "--pp-microbatches", "4", "--pp-schedule", "zbv")
    m, t = r.model, r.training
    assert pipeline.stage_layers(8, 4) == [2, 3, 2, 1]
    assert weight_op_width(block_tensors(m)) == 6_656
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    acts = Activations.of(activation_plan(m, t, c))
    layers = [2, 3, 2, 1]
    size = stage_sizes(m, t, layers, (0, 1, 2, 3), acts, 2)
    split = split_sizes(m, t, layers, (0, 1, 2, 3), acts, 2, size)
    assert split[0] == size[0]
    assert split[1] - size[1] == 40_894_464
    assert split[2] - size[2] == 27_262_976
    assert split[3] - size[3] == 80_216_064 - 131_072_000 - 65_536_000
    ph = rank_phases(m, t, 1, 2, acts, Overheads())
    fwd = ph[Phase.FORWARD]
    kept = acts.kept_per_block
    assert fwd.activations == 2 * (3 * kept) + 2 * (2 * kept + 1_048_576)
    assert fwd.gradients == 102_266_880
    assert fwd.comm_buffers == 18_874_368
    # the optimizer step: the gradient shards (fp32, 5 blocks / dp 2) and every buffer
    assert ph[Phase.OPTIMIZER].gradients == 5 * 3_408_896 // 2 * 4
    assert ph[Phase.OPTIMIZER].comm_buffers == 16_777_216 + 4 * 1_048_576


def test_pp_x_tp_fewest_gpus_steps_over_whole_groups():
    """--find min-gpus under --pp 2 --tp 2: the small model fits anywhere, so the fewest is
    the smallest layout torchtitan runs with FSDP in each stage: pp 2 x tp 2 x dp 2 = 8; from
    9 GPUs up, the next multiple of pp x tp = 4 with dp >= 2: 12."""
    from planner.plan import pipeline_min_gpus

    r = _request("--n", "8", "--pp", "2", "--tp", "2")
    assert pipeline_min_gpus(r, 1) == 8
    assert pipeline_min_gpus(r, 9) == 12


def test_pp_x_tp_step_time_by_hand():
    """Each GPU of a TP group is credited 1/tp of the pipeline's tokens: M x mb x seq /
    (pp x tp) = 4 x 1 x 1024 / 4 = 1,024 tokens per GPU per step; and its compute is the
    micro-batches' matmuls at tp x the rate: the same dp and M with TP 2 (8 GPUs) compute
    half the time of TP 1 (4 GPUs)."""
    from planner.throughput import estimate_step
    from planner.spec import Candidate, Checkpointing, Strategy

    def step(n: str, tp: int):
        r = _request("--n", n, "--pp", "2", "--pp-microbatches", "4", "--tp", str(tp))
        c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE, tp=tp)
        return estimate_step(r.model, r.training, r.cluster, c)

    one, two = step("4", 1), step("8", 2)
    assert two.tokens_per_s_per_gpu * two.step_time_s == pytest.approx(1024)
    assert one.tokens_per_s_per_gpu * one.step_time_s == pytest.approx(2048)
    assert two.compute_s == pytest.approx(one.compute_s / 2)
    # the sequence-parallel collectives are exposed on top
    assert two.exposed_comm_s > 0 and two.comm_s >= two.exposed_comm_s


def test_pp_x_cp_stage_memory_by_hand():
    """pp 2 x cp 2 (4 GPUs, torchtitan's 4D mesh pp, dp_shard 1, cp 2), 1F1B, M 4, the model
    of test_stage_memory_by_hand, bf16-amp, seq 1024. FSDP2 shards each stage over
    dp_shard x cp = 4 / 2 = 2 ranks (``parallelize_llama``'s dp_shard_cp mesh), so the
    parameters, gradients and optimizer state are those of test_stage_memory_by_hand; every
    stage runs on 1024 / 2 = 512 tokens of each micro-batch.

    Rank 0, by hand:
      gathered (bf16) = 2 * 30,019,584 = 60,039,168 B; unsharded gradients (fp32) =
      120,078,336 B; sharded params (fp32 / 2) = 60,039,168 B (as without CP)
      P2P: M = 4 gradient receive buffers of 1 x 512 x 512 bf16 = 4 * 524,288 = 2,097,152 B
      activations: 2 micro-batches in flight, each 4 blocks' kept tensors (at 512 tokens)
      + the stage output (512 * 512 * 2 = 524,288 B) + the root's before the blocks
      forward's ring (planner/context_parallel.ring_forward_bytes, all-gather rotation):
        O = K = 1 x 8 heads x 512 x 64 = 262,144; lse = 4 * 8 * 512 = 16,384
        merge = 4 O + 2 O + 4 O + 2 * 4 O = 18 O = 4,718,592
        3 lse = 49,152; gathered k, v = cp 2 x 2 x 2 B x K = 2,097,152
        = 6,864,896 B on top of the held micro-batches (rank 0 is not last: no loss)
    Rank 1: the logits of a micro-batch's 512 tokens, 512 * 32000 * 2 = 32,768,000 B.
    """
    from planner.memory.breakdown import Overheads, Phase
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import rank_phases
    from planner.spec import Candidate, Checkpointing, Strategy

    r = _request("--n", "4", "--pp", "2", "--cp", "2", "--pp-microbatches", "4")
    m, t = r.model, r.training
    assert t.local_seq == 512
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    acts = Activations.of(activation_plan(m, t, c))
    assert acts.ring_fwd == 6_864_896
    ph = rank_phases(m, t, 0, 2, acts, Overheads())
    bwd = ph[Phase.BLOCK_BWD]
    assert bwd.gathered_params == 60_039_168
    assert bwd.gradients == 120_078_336
    assert bwd.params == 60_039_168
    assert bwd.comm_buffers == 2_097_152
    held = 2 * (4 * acts.kept_per_block + 524_288 + acts.root_before)
    assert bwd.activations == held
    fwd = ph[Phase.FORWARD]
    assert (fwd.activations, fwd.transients) == (held, 6_864_896)
    ph1 = rank_phases(m, t, 1, 2, acts, Overheads())
    assert ph1[Phase.BLOCK_BWD].comm_buffers == 2_097_152
    # + the previous micro-batch's input gradient in the send ops, seq / cp long (512 x 512
    # x 2 B: StageBytes.input_grad)
    assert ph1[Phase.BLOCK_BWD].activations == (4 * acts.kept_per_block
                                                + acts.root - acts.root_before + 32_768_000
                                                + 524_288)


def test_pp_x_cp_kept_block_is_the_local_one():
    """The kept set of a block under PP x CP is the unsharded one at seq / cp: with full
    checkpointing a block keeps its input, 1 x 512 tokens x 512 x 2 B = 524,288 B (at CP 1 and
    seq 1024: 1,048,576 B)."""
    from planner.memory.estimator import activation_plan
    from planner.spec import Candidate, Checkpointing, Strategy

    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL)
    r = _request("--n", "4", "--pp", "2", "--cp", "2", "--pp-microbatches", "4")
    assert activation_plan(r.model, r.training, c).block_kept == 524_288
    r1 = _request("--n", "4", "--pp", "2", "--pp-microbatches", "4")
    assert activation_plan(r1.model, r1.training, c).block_kept == 1_048_576


def test_pp_x_cp_fewest_gpus_steps_over_whole_groups():
    """--find min-gpus under --pp 2 --cp 2: the small model fits anywhere, so the fewest is
    the smallest 4D layout: pp 2 x cp 2 x dp_shard 1 = 4 (FSDP over dp_shard x cp = 2 ranks
    per stage); from 5 GPUs up the next multiple of pp x cp = 4: 8; with --tp 2 the groups
    are pp 2 x tp 2 x cp 2 = 8: 8, then 16."""
    from planner.plan import pipeline_min_gpus

    r = _request("--n", "4", "--pp", "2", "--cp", "2")
    assert pipeline_min_gpus(r, 1) == 4
    assert pipeline_min_gpus(r, 5) == 8
    r2 = _request("--n", "8", "--pp", "2", "--cp", "2", "--tp", "2")
    assert pipeline_min_gpus(r2, 1) == 8
    assert pipeline_min_gpus(r2, 9) == 16


def test_pp_x_cp_step_time_by_hand(monkeypatch):
    """pp 2 x cp 2 on 4 GPUs, M 4, seq 1024: each GPU is credited M x mb x seq / (pp x cp) =
    4 x 1024 / 4 = 1,024 tokens per step, and computes half of what pp 2 x dp 2 (no CP)
    computes. The ring's rotation, by hand (planner/context_parallel.rotation_bytes, bf16,
    all-gather), per layer and micro-batch with local = 512 tokens x 8 heads x 64 = 262,144:
      forward (cp - 1) x 2 x 2 B x local = 1,048,576 B; backward the same + cp x 2 x 4 B x
      local = 1,048,576 + 4,194,304 = 5,242,880 B; no checkpointing: no recomputed forward
      calls: one all-gather each way + cp all-to-alls of dK/dV = 4, at 2 us a hop
      at 450e9 x 0.75 B/s inside the node: 6,291,456 / 337.5e9 + 4 x 2e-6 s per layer;
    the slowest rank (the last: 4 blocks and the head) runs 4 blocks x 4 micro-batches of
    it, stretched by 1F1B's bubble (1 + (2 - 1) / 4 = 1.25)."""
    from planner import throughput
    from planner.spec import Candidate, Checkpointing, Strategy
    from planner.throughput import estimate_step

    def step(*extra: str):
        r = _request("--n", "4", "--pp", "2", "--pp-microbatches", "4", *extra)
        c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
        return estimate_step(r.model, r.training, r.cluster, c)

    cp, plain = step("--cp", "2"), step()
    assert cp.tokens_per_s_per_gpu * cp.step_time_s == pytest.approx(1024)
    assert plain.tokens_per_s_per_gpu * plain.step_time_s == pytest.approx(2048)
    assert cp.compute_s == pytest.approx(plain.compute_s / 2)
    per_layer = 6_291_456 / 337.5e9 + 4 * 2e-6
    monkeypatch.setattr(throughput, "cp_rotation_s", lambda x, a: 0.0)
    without = step("--cp", "2")
    assert cp.exposed_comm_s - without.exposed_comm_s == pytest.approx(1.25 * 16 * per_layer)


def test_pp_x_cp_plans_and_zbv_stays_refused():
    """PP x CP plans (torchtitan's 4D recipe); ZBV stays NOT MODELLED with or without CP;
    the GPUs must divide into pp x cp x tp; under TP the local sequence must split evenly."""
    from planner.plan import plan

    est = plan(_request("--n", "4", "--pp", "2", "--cp", "2")).estimates[0]
    assert "pipeline 1f1b" in est.notes[0]
    for extra, needle in (
            (("--n", "4", "--pp", "2", "--cp", "2", "--pp-schedule", "zbv"), "NOT MODELLED"),
            (("--n", "6", "--pp", "2", "--cp", "2"), "not a multiple of CP 2 x TP 1 x PP 2"),
            # 1028 splits into 2 x CP = 4 chunks, but its 514 local tokens not over TP 4
            (("--n", "16", "--pp", "2", "--cp", "2", "--tp", "4", "--seq", "1028"),
             "1028 / CP 2 = 514 is not a multiple of TP 4")):
        with pytest.raises(UsageError) as e:
            _request(*extra)
        assert needle in str(e.value), (extra, str(e.value))


def test_gpipe_holds_more_than_1f1b():
    g = _request("--n", "4", "--pp", "2", "--pp-microbatches", "8", "--pp-schedule", "gpipe")
    o = _request("--n", "4", "--pp", "2", "--pp-microbatches", "8")
    from planner.plan import plan

    eg, eo = plan(g).estimates[0], plan(o).estimates[0]
    assert eg.breakdown.activations > eo.breakdown.activations


# ---- the request ----------------------------------------------------------------------------

@pytest.mark.parametrize("extra,needle", [
    (["--n", "4", "--pp", "2", "--pp-schedule", "loopedbfs"], "NOT MODELLED"),
    (["--n", "4", "--pp", "2", "--pp-schedule", "dualpipev", "--pp-microbatches", "3"],
     "at least 4 micro-batches"),
    (["--n", "3", "--pp", "2"], "multiple of 2"),
    (["--n", "2", "--pp", "2"], "at least 2 data-parallel"),
    # 4 GPUs = pp 2 x tp 2 leaves one data-parallel rank per stage
    (["--n", "4", "--pp", "2", "--tp", "2"], "at least 2 data-parallel"),
    (["--n", "8", "--pp", "2", "--tp", "2", "--seq", "1025"], "not a multiple of TP 2"),
    (["--n", "8", "--pp", "4", "--pp-microbatches", "2"], "--pp-microbatches"),
    (["--n", "8", "--pp", "4", "--pp-schedule", "InterleavedZeroBubble", "--pp-microbatches",
      "9"], "multiple of the rounds"),
    (["--n", "4", "--pp", "2", "--pp-schedule", "interleaved-zb", "--checkpointing", "full"],
     "NOT MODELLED"),
    (["--n", "4", "--pp", "2", "--pp-schedule", "zbv", "--pp-virtual-stages", "3"],
     "exactly 2 stages"),
    (["--n", "4", "--pp", "2", "--pp-schedule", "zbv", "--checkpointing", "selective"],
     "NOT MODELLED"),
    (["--n", "4", "--pp", "2", "--pp-schedule", "dualpipev", "--checkpointing", "full"],
     "NOT MODELLED"),
    (["--n", "8", "--pp", "2", "--pp-schedule", "zbv", "--tp", "2"], "NOT MODELLED"),
    (["--n", "4", "--pp", "2", "--pp-schedule", "interleaved-1f1b", "--pp-virtual-stages",
      "1"], "--pp-virtual-stages"),
    (["--n", "4", "--pp-microbatches", "4"], "--pp-microbatches"),
    (["--n", "4", "--pp", "2", "--grad-accum", "2"], "gradient accumulation"),
])
def test_refusals(extra, needle):
    with pytest.raises(UsageError) as e:
        _request(*extra)
    assert needle in str(e.value)


def test_torchtitan_spelling_accepted():
    r = _request("--n", "8", "--pp", "2", "--pp-schedule", "Interleaved1F1B")
    p = r.training.pipeline
    assert (p.schedule, p.virtual, p.microbatches) == (PipeSchedule.INTERLEAVED_1F1B, 2, 4)


# ---- torchtitan's job file ------------------------------------------------------------------

def _titan(tmp_path, **edits: str):
    """torchtitan's Llama-3-8B v0.2 recipe with ``[parallelism]`` / ``[training]`` lines
    replaced (old line -> new)."""
    from pathlib import Path

    text = (Path(__file__).parent / "data" / "jobs" / "torchtitan_llama3_8b.v0.2.0.toml"
            ).read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    p = tmp_path / "pp.toml"
    p.write_text(text)
    return p


def test_torchtitan_pipeline_read(tmp_path):
    """local_batch_size 4 with pipeline_parallel_microbatch_size 1 (default) is 4
    micro-batches of 1 (torchtitan ``build_pipeline_schedule``: n_microbatches =
    local_batch_size // microbatch_size); the schedule defaults to 1F1B."""
    import json

    from tests.conftest import run

    p = _titan(tmp_path, **{"pipeline_parallel_degree = 1": "pipeline_parallel_degree = 2",
                            "local_batch_size = 1": "local_batch_size = 4"})
    doc = json.loads(run("--job", str(p), "--gpu", "h100-80", "--n", "8", "--json").stdout)
    pp = doc["inputs"]["pp"]
    assert (pp["degree"], pp["schedule"], pp["microbatches"]) == (2, "1f1b", 4)
    assert doc["inputs"]["training"]["micro_batch"] == 1


def test_torchtitan_pp_beside_tp_is_read(tmp_path):
    """torchtitan's Llama-3-70B recipe (TP 8) with pipeline_parallel_degree 4 on 64 GPUs:
    FSDP x TP x PP, dp 64 / (4 x 8) = 2; local_batch_size 8 -> 8 micro-batches of 1, 1F1B."""
    import json
    from pathlib import Path

    from tests.conftest import run

    text = (Path(__file__).parent / "data" / "jobs" / "torchtitan_llama3_70b.v0.2.0.toml"
            ).read_text()
    p = tmp_path / "pp.toml"
    p.write_text(text.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4"))
    doc = json.loads(run("--job", str(p), "--gpu", "h100-80", "--n", "64", "--json").stdout)
    assert doc["job"]["unmodelled"] == []
    pp = doc["inputs"]["pp"]
    assert (pp["degree"], pp["schedule"], pp["microbatches"]) == (4, "1f1b", 8)
    assert doc["recommendation"]["tp"] == 8


def test_torchtitan_pp_beside_cp_and_tp_is_read(tmp_path):
    """torchtitan's 4D mesh (its 405B recipe's layout): the Llama-3-70B recipe (TP 8, seq
    8192) with pipeline_parallel_degree 4 and context_parallel_degree 2 on 128 GPUs:
    dp_shard = 128 / (4 x 2 x 8) = 2, FSDP over dp_shard x cp = 4 ranks; every degree read,
    no NOT MODELLED line (it was one before PP x CP was modelled), 8 micro-batches of 1."""
    import json
    from pathlib import Path

    from tests.conftest import run

    text = (Path(__file__).parent / "data" / "jobs" / "torchtitan_llama3_70b.v0.2.0.toml"
            ).read_text()
    p = tmp_path / "pp_cp.toml"
    p.write_text(text.replace("pipeline_parallel_degree = 1", "pipeline_parallel_degree = 4")
                 .replace("context_parallel_degree = 1", "context_parallel_degree = 2"))
    doc = json.loads(run("--job", str(p), "--gpu", "h100-80", "--n", "128", "--json").stdout)
    assert doc["job"]["unmodelled"] == []
    pp = doc["inputs"]["pp"]
    assert (pp["degree"], pp["schedule"], pp["microbatches"]) == (4, "1f1b", 8)
    assert doc["inputs"]["cp"] == 2 and doc["recommendation"]["tp"] == 8
    assert doc["candidates"][0]["shard_degree"] == 4


def test_torchtitan_unmodelled_schedule_is_a_not_modelled_line(tmp_path):
    """LoopedBFS is not modelled; DualPipeV and InterleavedZeroBubble are, but not beside the
    recipe's selective activation checkpointing (torch 2.13 refuses op-level SAC in a split
    backward): each is a NOT MODELLED line naming the schedule."""
    import json

    from tests.conftest import run

    for name in ("LoopedBFS", "DualPipeV", "InterleavedZeroBubble"):
        pp = f'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "{name}"'
        p = _titan(tmp_path, **{"pipeline_parallel_degree = 1": pp,
                                "local_batch_size = 1": "local_batch_size = 4"})
        doc = json.loads(run("--job", str(p), "--gpu", "h100-80", "--n", "8",
                             "--json").stdout)
        assert any(name in u for u in doc["job"]["unmodelled"]), doc["job"]["unmodelled"]


@pytest.mark.parametrize("name,schedule", [("ZBVZeroBubble", "zbv"), ("DualPipeV", "dualpipev"),
                                         ("InterleavedZeroBubble", "interleaved-zb")])
def test_torchtitan_split_schedule_is_read(tmp_path, name, schedule):
    """torchtitan's split-backward schedules without activation checkpointing: 2 stages per
    rank (its default for the multi-stage schedules), local_batch_size 4 -> 4 micro-batches
    of 1, nothing unmodelled."""
    import json

    from tests.conftest import run

    pp = f'pipeline_parallel_degree = 2\npipeline_parallel_schedule = "{name}"'
    p = _titan(tmp_path, **{"pipeline_parallel_degree = 1": pp,
                            "local_batch_size = 1": "local_batch_size = 4",
                            'mode = "selective"': 'mode = "none"'})
    doc = json.loads(run("--job", str(p), "--gpu", "h100-80", "--n", "8", "--json").stdout)
    assert doc["job"]["unmodelled"] == []
    pp = doc["inputs"]["pp"]
    assert (pp["degree"], pp["schedule"], pp["virtual_stages"], pp["microbatches"]) == \
        (2, schedule, 2, 4)


# ---- the referee: a real pipeline step, one rank, on a fake process group ------------------

_planned_rank = BENCH.planned_rank


def _traced_rank(values: dict, rank: int, timeline: bool = False, **more) -> dict:
    """BENCH.traced_rank's trace (``probes.pipeline_trace``) in this test process
    (``trace_job``: the process group torn down after it), not a fresh one: the same bytes
    without a torch import and cold start per configuration. But for tensor parallel: a
    pipeline trace with TP and a TP trace after it in the same worker (tests/test_tp_sac.py,
    or a TP pipeline trace after tests/test_ep_trace.py's EP x TP) cannot resolve a TP group
    by name ("Could not resolve the process group registered under the name 9"; reproduced
    with -n 0; emptying DTensor's sharding and redistribution caches does not help; cause not
    found, 2026-11-26), so a TP job runs in a fresh process, as the benchmark runs every
    one."""
    from probes.pipeline_trace import trace_job

    if (values.get("parallel.tp") or 1) > 1:
        return BENCH.traced_rank(values, rank, timeline, **more)
    return trace_job({"values": values, "pp_rank": rank, "timeline": timeline, **more})


TRACED = [  # the configurations CI traces (the benchmark traces all of BENCH.CASES)
    pytest.param(c[0], c[1], marks=[pytest.mark.xfail(strict=True, reason=c[3])])
    if c[3] else (c[0], c[1])
    for c in map(BENCH.case, BENCH.CASES) if c[2]]


@pytest.mark.trace
@pytest.mark.parametrize("extra,rank", TRACED)
def test_rank_peak_matches_a_traced_pipeline_step(extra, rank):
    """One rank of ``torch.distributed.pipelining``'s real schedule (1F1B, GPipe,
    Interleaved 1F1B, ZBV, DualPipeV) with FSDP2 inside the stage, on fake tensors: the
    planner's peak of that rank within 2 %. The optimizer's 0-dim ``step`` tensors (host memory on a
    GPU unless fused) are left out, as everywhere (probes/compare.py)."""
    values = {**SMALL, "hardware.n": 4, "parallel.pp": 2, "parallel.pp_microbatches": 4,
              **extra}
    traced = _traced_rank(values, rank)
    measured = traced["peak_bytes"] - traced["optimizer_scalar_bytes"]
    planned = _planned_rank(values, rank)
    assert abs(planned - measured) / measured <= 0.02, (planned, measured, traced["at_peak"])


@pytest.mark.trace
def test_the_traced_pipeline_runs_the_ring():
    """The ring's buffers are in the PP x CP trace: at CP 2 the all-gather rotation holds
    both ranks' keys and values, the all-to-all the one received (``ring_forward_bytes``),
    one key/value pair apart, 2 x 2 B x 8 heads x 512 local tokens x 64 = 1,048,576 B, in the
    traced peak of rank 0 (the forward's ring on top of its held micro-batches)."""
    values = {**SMALL, "hardware.n": 4, "parallel.pp": 2, "parallel.pp_microbatches": 4,
              "parallel.cp": 2}
    ag = _traced_rank({**values, "parallel.cp_rotate": "allgather"}, 0)["peak_bytes"]
    a2a = _traced_rank({**values, "parallel.cp_rotate": "alltoall"}, 0)["peak_bytes"]
    assert ag - a2a == 1_048_576


@pytest.mark.trace
@pytest.mark.parametrize("extra,rank", [
    ({"parallel.pp_schedule": "zbv", "parallel.pp_microbatches": 8}, 1),
    ({"parallel.pp_schedule": "dualpipev"}, 0),
    ({"hardware.n": 8, "parallel.pp": 4, "parallel.pp_microbatches": 8, "model.layers": 14,
      "parallel.pp_schedule": "zbv"}, 3),
    ({"parallel.pp_schedule": "interleaved-zb"}, 0),
])
def test_split_schedule_every_action_matches_a_trace(extra, rank):
    """ZBV, DualPipeV, Interleaved Zero Bubble: what the rank holds after each of its actions
    (after a forward of the last stage: with its loss), planner (``split_timeline``) vs the
    traced step, within 2 % at every action, the actions in the same order."""
    from planner.fields import SPEC
    from planner.memory.breakdown import Overheads
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import split_timeline
    from planner.request import build_request
    from planner.spec import Candidate, Checkpointing, Strategy

    values = {**SMALL, "hardware.n": 4, "parallel.pp": 2, "parallel.pp_microbatches": 4,
              **extra}
    traced = _traced_rank(values, rank, timeline=True)["actions"]
    r = build_request(values, SPEC)
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    acts = Activations.of(activation_plan(r.model, r.training, c))
    dp = r.cluster.n_gpus // r.training.pipeline.degree
    planned = split_timeline(r.model, r.training, rank, dp, acts,
                         Overheads(cublas_workspace_bytes=0))
    assert [[op.kind, op.stage, op.mb] for op, _ in planned] == [a[:3] for a in traced]
    worst = max(abs(b.total - a[3]) / a[3] for (_, b), a in zip(planned, traced))
    assert worst <= 0.02, worst


# ---- step time and the other front ends -----------------------------------------------------

def test_step_time_follows_the_bubble():
    """More micro-batches shrink the bubble ((pp - 1) / M of the busy time): tokens/s per
    GPU rises with M; interleaving two stages per rank halves the bubble at the same M. A step
    carries M x micro-batch x seq tokens through pp ranks: 8 x 1 x 1024 / 2 = 4,096 per GPU."""
    from planner.plan import plan

    def step(*extra):
        return plan(_request("--n", "4", "--pp", "2", *extra)).steps[0]

    few, many = step("--pp-microbatches", "2"), step("--pp-microbatches", "8")
    assert many.tokens_per_s_per_gpu > few.tokens_per_s_per_gpu
    assert many.tokens_per_s_per_gpu * many.step_time_s == pytest.approx(4096)
    inter = step("--pp-microbatches", "8", "--pp-schedule", "interleaved-1f1b")
    assert inter.compute_s < many.compute_s


def test_report_refuses_pp(tmp_path):
    from conftest import run

    r = run("report", "--models", "llama3-8b", "--gpus", "h100-80", "--pp", "2", "--out",
            str(tmp_path / "r"))
    assert r.exit_code == 2 and "--pp" in r.output and "report" in r.output


def test_plan_without_pp_unchanged_by_the_field():
    """--pp 1 (the default) is the plan as before: same estimate as with no pipeline."""
    from planner.plan import plan

    a = plan(_request("--n", "4")).estimates[0]
    b = plan(_request("--n", "4", "--pp", "1")).estimates[0]
    assert a.peak_allocated_bytes == b.peak_allocated_bytes


def test_trace_refuses_pp():
    from conftest import run

    r = run("trace", "--model", "llama3-8b", "--n", "4", "--pp", "2")
    assert r.exit_code == 2 and "--pp" in r.output


def test_a_pipeline_setting_without_pp_is_refused_by_name():
    """--pp-schedule (like --pp-microbatches and --pp-virtual-stages) means nothing without
    --pp > 1: one line naming it, exit 2, not a silently ignored flag."""
    from click.testing import CliRunner

    from planner.cli import cli

    r = CliRunner().invoke(cli, ["--params", "7e9", "--gpu", "h100-80", "--n", "8",
                                 "--pp-schedule", "gpipe"])
    assert r.exit_code == 2
    assert "--pp-schedule" in r.output and "needs --pp > 1" in r.output
    assert "Traceback" not in r.output


def test_the_recorded_walk_keeps_each_kind_s_first_largest_moment():
    """``walk(records_only=True)`` keeps fewer moments; for every schedule, rank and random
    stage sizes the first largest moment of each kind is the one the full walk has: after a
    forward (overall and on the last stage), at a backward's start, at its end with the
    stage's extra bytes; the reductions are all kept."""
    import random

    from planner.memory.pipeline import StageBytes, walk

    rng = random.Random(7)

    def first_max(ms, extra=lambda m: 0):
        keys = [m.activations + m.gradients + m.gathered + extra(m) for m in ms]
        return ms[keys.index(max(keys))] if ms else None

    for schedule, v in ((PipeSchedule.GPIPE, 1), (PipeSchedule.ONE_F_ONE_B, 1),
                        (PipeSchedule.INTERLEAVED_1F1B, 2), (PipeSchedule.INTERLEAVED_1F1B, 3)):
        for pp, m in ((2, 4), (4, 8), (4, 6), (8, 16)):
            p = Pipeline(degree=pp, schedule=schedule, virtual=v, microbatches=m)
            last = p.n_stages - 1
            for rank in range(pp):
                stage = {s: StageBytes(held=rng.randint(0, 50), gathered=rng.randint(0, 300),
                                       grads=rng.randint(0, 400), sharded_grads=rng.randint(0, 9))
                         for s in pipeline.rank_stages(p, rank)}
                extra = {s: rng.randint(0, 80) for s in stage}
                full = walk(p, rank, stage)
                kept = walk(p, rank, stage, records_only=True, last=last,
                            end_extra=extra.__getitem__)
                assert first_max(kept.after_forward) == first_max(full.after_forward)
                on_last = [x for x in full.after_forward if x.stage == last]
                assert first_max([x for x in kept.after_forward if x.stage == last]) == \
                    first_max(on_last)
                assert first_max(kept.backward_start) == first_max(full.backward_start)
                assert first_max(kept.backward_end, lambda x: extra[x.stage]) == \
                    first_max(full.backward_end, lambda x: extra[x.stage])
                assert kept.reduce == full.reduce


@pytest.mark.parametrize("extra", [
    {}, {"parallel.pp_schedule": "gpipe"}, {"parallel.pp_schedule": "interleaved-1f1b"},
    {"checkpointing": "full"}, {"hardware.n": 16, "parallel.pp": 8, "parallel.pp_microbatches": 8},
    {"hardware.n": 16, "parallel.pp": 4, "parallel.tp": 2},
    {"hardware.n": 16, "parallel.pp": 4, "parallel.pp_schedule": "interleaved-1f1b",
     "model.layers": 14},
    # every stage's outputs kept to the step's end (torch before PR #153383), or the last's
    {"hardware.n": 16, "parallel.pp": 4, "parallel.pp_kept_outputs": "all"},
    {"hardware.n": 16, "parallel.pp": 4, "parallel.pp_schedule": "interleaved-1f1b",
     "model.layers": 14, "parallel.pp_kept_outputs": "all"},
    {"parallel.pp_kept_outputs": "last"},
])
def test_fullest_rank_equals_walking_every_rank(extra):
    """fullest_rank skips the ranks whose upper bound cannot beat the fullest walked so far;
    its answer (rank and every moment) equals walking every rank and taking the first with
    the largest peak."""
    from planner.fields import SPEC
    from planner.memory.breakdown import PHASES, Overheads, largest
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import fullest_rank, rank_phases
    from planner.request import build_request
    from planner.spec import Candidate, Checkpointing, Strategy

    values = {**SMALL, "hardware.n": 4, "parallel.pp": 2, "parallel.pp_microbatches": 4,
              **extra}
    r = build_request(values, SPEC)
    tp = values.get("parallel.tp") or 1
    ck = Checkpointing(values.get("checkpointing", "none"))
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck, tp=tp)
    acts = Activations.of(activation_plan(r.model, r.training, c))
    dp = r.cluster.n_gpus // (r.training.pipeline.degree * tp)
    ov = Overheads()
    every = [rank_phases(r.model, r.training, k, dp, acts, ov, tp, ck)
             for k in range(r.training.pipeline.degree)]
    peaks = [largest([ph[x] for x in PHASES])[1].total for ph in every]
    want = peaks.index(max(peaks))
    got, phases = fullest_rank(r.model, r.training, dp, acts, ov, tp, ck)
    assert got == want and phases == every[want]


@pytest.mark.parametrize("extra", [
    {}, {"parallel.pp_schedule": "gpipe"}, {"parallel.pp_schedule": "interleaved-1f1b"},
    {"parallel.pp_schedule": "interleaved-1f1b", "parallel.pp_virtual_stages": 3,
     "model.layers": 10},
    {"hardware.n": 16, "parallel.pp": 8, "parallel.pp_microbatches": 8},
    {"hardware.n": 16, "parallel.pp": 8, "parallel.pp_microbatches": 16},
    {"hardware.n": 16, "parallel.pp": 4, "parallel.tp": 2},
    {"hardware.n": 16, "parallel.pp": 4, "parallel.cp": 2},
    {"hardware.n": 32, "parallel.pp": 4, "parallel.tp": 2, "parallel.cp": 2},
    {"precision": "bf16", "optimizer": "sgd"},
    {"parallel.pp_kept_outputs": "all"}, {"parallel.pp_kept_outputs": "last"},
    {"parallel.pp_schedule": "interleaved-1f1b", "parallel.pp_kept_outputs": "all"},
    {"hardware.n": 16, "parallel.pp": 8, "parallel.pp_microbatches": 8,
     "parallel.pp_kept_outputs": "all"},
])
@pytest.mark.parametrize("ckpt", ["none", "selective", "full"])
def test_the_rank_bound_is_never_below_the_walked_peak(extra, ckpt):
    """fullest_rank skips a rank whose bound (``_rank``'s first function) is below the
    fullest walked; the bound is sound only if no rank's walked peak exceeds it, at every
    schedule, TP, CP, checkpointing and precision here. It is also tight where the walk's
    largest moment is one the bound counts exactly: on 1F1B, whose middle ranks hold their
    most micro-batches together with their unsharded gradients, some rank's bound equals its
    peak (so the search walks few ranks)."""
    from planner.fields import SPEC
    from planner.memory.breakdown import PHASES, Overheads, largest
    from planner.memory.estimator import activation_plan
    from planner.memory.moments import Activations
    from planner.memory.pipeline import _rank
    from planner.request import build_request
    from planner.spec import Candidate, Checkpointing, Strategy

    values = {**SMALL, "hardware.n": 4, "parallel.pp": 2, "parallel.pp_microbatches": 4,
              "checkpointing": ckpt, **extra}
    r = build_request(values, SPEC).resolved()
    tp = values.get("parallel.tp") or 1
    ck = Checkpointing(ckpt)
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=ck, tp=tp)
    acts = Activations.of(activation_plan(r.model, r.training, c))
    dp = r.cluster.n_gpus // (r.training.pipeline.degree * tp)
    gaps = []
    for k in range(r.training.pipeline.degree):
        bound, phases = _rank(r.model, r.training, k, dp, acts, Overheads(), tp, ck)
        ph = phases()
        peak = largest([ph[x] for x in PHASES])[1].total
        assert bound() >= peak, (k, bound(), peak)
        gaps.append(bound() - peak)
    # (kept stage outputs are bounded by all M of each stage: no longer tight)
    if r.training.pipeline.schedule is PipeSchedule.ONE_F_ONE_B and \
            r.training.pipeline.degree > 2 and "parallel.pp_kept_outputs" not in extra:
        assert min(gaps) == 0, gaps


def test_breakdown_plus_makes_new_arrays():
    """``Breakdown.plus`` adds into a copy: a numpy term of the original (the report's sweep
    shares them between moments) is never changed in place."""
    import numpy as np

    from planner.memory.breakdown import Breakdown

    a = np.array([1, 2])
    b = Breakdown(params=a, gradients=5)
    c = b.plus(params=np.array([10, 20]), gradients=1)
    assert a.tolist() == [1, 2] and b.params is a and b.gradients == 5
    assert c.params.tolist() == [11, 22] and c.gradients == 6 and c.activations == 0
    with pytest.raises(KeyError):
        b.plus(not_a_term=1)


def test_most_in_flight_equals_walking_the_rank_s_ops():
    """``most_in_flight`` reads GPipe's and 1F1B's most from ``peak_in_flight`` instead of
    walking ``rank_ops``: the same counts for every rank (and the interleaved schedule, still
    walked, for comparison)."""
    from planner.memory.pipeline import most_in_flight

    for schedule, v in ((PipeSchedule.GPIPE, 1), (PipeSchedule.ONE_F_ONE_B, 1),
                        (PipeSchedule.INTERLEAVED_1F1B, 2)):
        for pp, m in ((2, 2), (2, 5), (4, 4), (4, 9), (8, 8), (8, 16), (16, 16)):
            p = Pipeline(degree=pp, schedule=schedule, virtual=v, microbatches=m)
            for rank in range(pp):
                held: dict[int, int] = {}
                most: dict[int, int] = {}
                for kind, s in pipeline.rank_ops(p, rank):
                    held[s] = held.get(s, 0) + (1 if kind == "F" else -1)
                    most[s] = max(most.get(s, 0), held[s])
                assert most_in_flight(p, rank) == most, (schedule, pp, m, rank)


# ---- the allocator's side-stream pools on a pipeline rank (estimator.pipeline_cache) -----
# SMALL (8 layers, h 512, ffn 1536, vocab 32000, untied), 1F1B, pp 2 x dp 2, M 4, bf16-amp
# (fp32 storage, bf16 param_dtype, fp32 reduce): rank 0 holds stage 0 = the embedding + 4
# blocks ((8 + 2) / 2 = 5 layers, one of them the embedding).
#   block: 4 x 512^2 + 3 x 512 x 1536 + 2 x 512 = 1,048,576 + 2,359,296 + 1,024 = 3,408,896
#   embedding: 32,000 x 512 = 16,384,000
# Reduce-scatter pool: the stage's sharded fp32 gradients, elements / dp x 4 B:
#   16,384,000 / 2 x 4 = 32,768,000; 3,408,896 / 2 x 4 = 6,817,792 per block
#   = 32,768,000 + 4 x 6,817,792 = 60,039,168
# All-gather copy-in pool: the largest unit (the embedding): its bf16 all_gather_output
#   16,384,000 x 2 = 32,768,000 + the shard's cast to bf16 16,384,000 / 2 x 2 = 16,384,000
#   = 49,152,000
RS_STAGE0 = 32_768_000 + 4 * 6_817_792
AG_STAGE0 = 32_768_000 + 16_384_000


def _small_1f1b():
    from planner.fields import SPEC
    from planner.request import build_request

    values = {**SMALL, "hardware.n": 4, "parallel.pp": 2, "parallel.pp_microbatches": 4}
    return values, build_request(values, SPEC)


def test_pipeline_cache_is_each_stage_pools_hand_derived():
    """Before the stage's reduction (its backwards: the rank's peak here) both pools hold
    their blocks free; at the optimizer step the reduce-scatter blocks are the gradients in
    use and only the all-gather pool's stay free; nothing at init."""
    from planner.memory.breakdown import Overheads, Phase
    from planner.memory.estimator import activation_plan, pipeline_cache
    from planner.memory.moments import Activations
    from planner.memory.pipeline import Ranks
    from planner.spec import Candidate, Checkpointing, Strategy

    values, r = _small_1f1b()
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    acts = Activations.of(activation_plan(r.model, r.training, c))
    _, free = Ranks(r.model, r.training, 2, acts, Overheads(), 1,
                    Checkpointing.NONE).phases_and_free(0)

    cached = pipeline_cache(free, r.model, r.training, c, 0, 2)

    def cache(ph):
        return cached[ph]

    assert cache(Phase.BLOCK_BWD) == RS_STAGE0 + AG_STAGE0 == 109_191_168
    assert cache(Phase.FORWARD) == RS_STAGE0 + AG_STAGE0
    assert cache(Phase.OPTIMIZER) == AG_STAGE0
    assert cache(Phase.INIT) == 0


def test_pipeline_plans_reserve_the_side_pools():
    """The estimate's reserved figure carries the fullest rank's pools. Rank 1 is the
    fullest (traced: 929.6 MB allocated against rank 0's 576.6 MB); it holds stage 1 = 4
    blocks + the norm and head (one unit: 512 + 16,384,000 = 16,384,512 elements), and its
    peak (the loss's backward) comes before its reduction:
      reduce-scatter 16,384,512 / 2 x 4 = 32,769,024 + 4 x 6,817,792 = 60,040,192
      all-gather     16,384,512 x 2 = 32,769,024 + 16,384,512 / 2 x 2 = 16,384,512
                     = 49,153,536
    Under expandable segments nothing else is added to the allocated bytes there."""
    import dataclasses

    from planner.memory.estimator import estimate
    from planner.spec import Allocator, Candidate, Checkpointing, Strategy

    values, r = _small_1f1b()
    training = dataclasses.replace(r.training, allocator=Allocator.EXPANDABLE)
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    est = estimate(r.model, training, r.cluster, c)
    assert "rank 1 " in est.notes[0], est.notes
    assert est.peak_reserved_bytes - est.peak_allocated_bytes == 60_040_192 + 49_153_536


@pytest.mark.trace
def test_pipeline_side_streams_in_a_traced_two_step_run():
    """Measured: the allocation events of two traced steps of 1F1B rank 0 (probes/
    pipeline_trace.py ``record_events``): the second step's allocations on the two side
    streams are the hand-derived ones (the all-gather copy-in stream: each unit's cast and
    flat output; the reduce-scatter stream: each unit's sharded gradients), and the
    allocator emulator (probes/alloc_emu.py, expandable segments), at the second step's
    allocated peak, holds each side pool's bytes free, rounded up to its 20 MiB pages."""
    from probes.alloc_emu import CachingAllocator

    values, _ = _small_1f1b()
    out = _traced_rank(values, 0, record_events=True, steps=2)
    ev, second = out["alloc_events"], out["step_starts"][1]
    side: dict[int, list[int]] = {}
    for e in ev[second:]:
        if e[0] == "alloc" and e[3] != 0:
            side.setdefault(e[3], []).append(e[2])
    block_ag = [3_408_896 // 2 * 2, 3_408_896 * 2]  # the shard's bf16 cast, the bf16 output
    assert sorted(side.values(), key=len) == [
        [32_768_000] + [6_817_792] * 4,                   # reduce-scatter outputs
        [16_384_000, 32_768_000] + block_ag * 4]           # all-gather copy-in
    a, best, snap = CachingAllocator(expandable=True), -1, {}
    for i, e in enumerate(ev):
        a.replay([e])
        if i >= second and e[0] == "alloc" and a.allocated > best:
            best = a.allocated
            snap = {s: a._stream(s)[1] - a._stream(s)[0] for s in side}
    page = 20 * 2**20
    for s, derived in ((min(side, key=lambda k: len(side[k])), RS_STAGE0),
                       (max(side, key=lambda k: len(side[k])), AG_STAGE0)):
        assert derived <= snap[s] < derived + page, (s, snap[s], derived)


# ---- PP x EP (docs/model.md §8.8 "Beside pipeline parallel") ---------------------------------

def test_pp_x_ep_stage_elements_by_hand():
    """torchtitan's EP inside a stage: the Mixtral-like model of the PP x EP referee
    (benchmarks/pipeline_trace_accuracy.py MOE: h 512, 8 heads, 2 kv heads, ffn 1792, 8
    experts, vocab 4096), 12 GPUs, pp 2 -> dp 6 per stage, ep 2 -> efsdp 3; 4 layers: stage 0
    = embedding + 2 blocks. By hand:

      a block's dense tensors: norms 2 x 512, q 512^2 = 262,144, k, v 128 x 512 = 65,536
        each, o 262,144, router 8 x 512 = 4,096: 660,480; its experts (8, 1792, 512) x 3
        = 3 x 7,340,032
      the stage's E / ep = 4 local experts over efsdp 3 ranks, dim 0 (dp 6 <= E 8):
        ceil(4 / 3) = 2 experts' rows per rank, 2 x 917,504 = 1,835,008 per matrix
      gathered = embedding 2,097,152 + 2 x (660,480 + 3 x 1,835,008 x 3 ranks)
               = 2,097,152 + 2 x 17,175,552 = 36,448,256 (2 of the 6 gathered experts padding)
      unsharded gradients (the 4 local experts, unpadded)
               = 2,097,152 + 2 x (660,480 + 3 x 4 x 917,504) = 25,438,208
      shard = dense dim-0 shards over 6: embedding ceil(2,097,152 / 6) = 349,526; a block
              86 + 43,691 + 10,923 + 10,923 + 43,691 + 86 + 683 = 110,083
            + experts 2 blocks x 3 x 1,835,008 = 11,010,048
            = 349,526 + 220,166 + 11,010,048 = 11,579,740"""
    from planner.fields import SPEC
    from planner.memory.pipeline import ep_group_elements, group_elements
    from planner.request import build_request

    r = build_request(BENCH.ep_values_of({"hardware.n": 12, "hardware.gpus_per_node": 12}),
                      SPEC)
    assert ep_group_elements(r.model, 2, True, False, 6, 2) == (36_448_256, 25_438_208,
                                                                11_579_740)
    # without EP the same stage gathers all 8 experts: 2,097,152 + 2 x (660,480 + 22,020,096)
    assert group_elements(r.model, 2, True, False, 1, 6)[0] == 47_458_304


def test_walk_holds_the_schedule_s_locals_by_hand():
    """GPipe and 1F1B keep two tensors past a micro-batch's backward (torch 2.13
    schedules.py ``_step_microbatches``): the latest forward's output (``output``) until the
    next forward rebinds it, and a stage's input gradient in the send ops (``ops`` /
    ``bwd_sends``) until the next backward's rebind them: after a backward its own and the one
    before. The last stage of pp 2, M 2, each micro-batch holding 10, its output 5 past its
    backward, an input gradient 3:

      GPipe F F B B: 10, 20; B0 frees 10, adds its gradient: 13; B1 frees 10, the latest
        forward's output stays (5), its gradient (3): 11, then the older send ops go: 8 at
        the reduction
      1F1B F B F B: 10; B0: 0 + 5 + 3 = 8; F1: + 10 - 5 (rebound) = 13; B1: 13 - 10 + 5 + 3
        = 11; the reduction 8"""
    from planner.memory.pipeline import StageBytes, walk
    from planner.spec import Pipeline

    b = {1: StageBytes(held=10, gathered=0, grads=0, sharded_grads=0, last_output=5,
                       input_grad=3)}
    for schedule, after in ((PipeSchedule.GPIPE, [10, 20, 13, 11]),
                            (PipeSchedule.ONE_F_ONE_B, [10, 8, 13, 11])):
        p = Pipeline(degree=2, schedule=schedule, microbatches=2)
        w = walk(p, 1, b)
        assert [m.activations for _, m in w.actions] == after
        assert [m.activations for m in w.reduce] == [8]


@pytest.mark.parametrize("extra,field,needle", [
    (["--pp-schedule", "interleaved-1f1b"], "--ep", "interleaved-1f1b is NOT MODELLED"),
    (["--tp", "2", "--n", "16"], "--tp", "pipeline and tensor parallel"),
    (["--checkpointing", "selective"], "--checkpointing", "selective"),
    (["--ep", "8"], "--ep", "does not divide the 4 data-parallel ranks"),
    (["--ep", "1"], "--pp", "an MoE model without expert parallel"),
])
def test_pp_x_ep_refusals(extra, field, needle):
    from tests.conftest import one_line_error, run

    args = ["--params", "1e9", "--layers", "4", "--hidden", "512", "--heads", "8",
            "--ffn", "1792", "--vocab", "4096", "--experts", "8", "--experts-per-token", "2",
            "--gpu", "h100-80", "--n", "8", "--pp", "2", "--ep", "2"]
    err = one_line_error(run(*args, *extra), 2, field, needle)
    assert "NOT MODELLED" in err or "divide" in err


EP_TRACED = [  # the PP x EP configurations CI traces (the benchmark traces all of EP_CASES)
    pytest.param(c[0], c[1], marks=[pytest.mark.xfail(strict=True, reason=c[3])])
    if c[3] else (c[0], c[1])
    for c in map(BENCH.case, BENCH.EP_CASES) if c[2]]


@pytest.mark.trace
@pytest.mark.parametrize("extra,rank", EP_TRACED)
def test_pp_x_ep_every_action_matches_a_trace(extra, rank):
    """One rank of GPipe or 1F1B with torchtitan's expert parallel inside each stage (the
    all-to-all dispatch in every MoE block, the experts on the stage's (efsdp, ep) mesh), on
    fake tensors: the planner's peak of that rank, and what it holds after each of its
    forwards and backwards, within 2 %."""
    _, traced, planned, t_act, p_act = BENCH.check_ep((extra, rank))
    assert abs(planned - traced) / traced <= 0.02, (planned, traced)
    errors = BENCH.action_errors(t_act, p_act)
    assert max(map(abs, errors)) <= 0.02, errors


def test_pp_x_ep_fewest_gpus_steps_over_whole_ep_groups():
    """Under --pp 2 --ep 4 the fewest-GPUs search steps by pp x ep = 8 (each stage's
    data-parallel ranks split into EP groups of 4): the count found is a multiple of 8, and
    the one below it (one dp_shard rank fewer per EP group) does not fit."""
    from planner.fields import SPEC
    from planner.plan import fits_any, min_gpus
    from planner.request import build_request

    values = BENCH.ep_values_of({"model.layers": 16, "model.hidden": 4096, "model.heads": 32,
                                 "model.ffn": 14336, "hardware.n": 16,
                                 "parallel.ep": 4, "training.seq": 4096})
    r = build_request(values, SPEC)
    n = min_gpus(r, 2)
    assert n is not None and n % 8 == 0 and n > 8, n
    assert fits_any(r.with_gpus(n)) and not fits_any(r.with_gpus(n - 8))


def test_pp_x_ep_step_time_counts_each_rank_s_all_to_alls(monkeypatch):
    """Under --pp 2 --ep 2 (the Mixtral-like referee model: 4 layers, 2 blocks a stage, M 4,
    1F1B) the slowest rank's token all-to-alls are on its critical path, stretched by the
    bubble. By hand, per MoE layer and micro-batch without checkpointing: 4 all-to-alls
    (dispatch and combine, forward and backward), each moving c h R (ep - 1) / ep = 2 x 512
    x 2048 x 1/2 = 1,048,576 B into a GPU at the node's rate, and 5 latencies (the 4 and a
    count exchange); the rank's 2 blocks x M 4 micro-batches x the bubble's 1 + (pp - 1) / M
    = 1.25. The step less the same step with the all-to-alls taken out is that."""
    from planner import throughput
    from planner.fields import SPEC
    from planner.request import build_request
    from planner.spec import Candidate, Checkpointing, Strategy

    r = build_request(BENCH.ep_values_of({}), SPEC)
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)
    x = throughput.step_inputs(r.model, r.training, r.cluster, c)
    assert x.ep_bytes == 1_048_576
    per_layer = 4 * 1_048_576 / x.bw_intra + 5 * x.lat_intra
    with_a2a = throughput.estimate_step(r.model, r.training, r.cluster, c).step_time_s
    monkeypatch.setattr(throughput, "ep_all_to_all_s", lambda x, recompute: 0.0)
    without = throughput.estimate_step(r.model, r.training, r.cluster, c).step_time_s
    assert with_a2a - without == pytest.approx(1.25 * 4 * 2 * per_layer, rel=1e-9)
