"""Pipeline parallel as torchtitan runs it on ``torch.distributed.pipelining`` (docs/model.md
"Pipeline parallel"): how the layers split into stages, which stages a rank holds, how many
micro-batches' activations a rank holds at once under each schedule, and the idle time
(bubble) of a step.

Sources (torch 2.13, ``torch/distributed/pipelining/schedules.py``; torchtitan
``torchtitan/distributed/pipeline_parallel.py``). Every count here is checked against the
schedules' own action lists (tests/test_pipeline.py, ``trace`` tier).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import NamedTuple

from planner.spec import PipeSchedule, Pipeline

INPUT_WEIGHT = 1
"""torchtitan counts the token embedding as this many layers when it splits the model
(``generate_llm_fqn_per_model_part(..., input_weight=1, output_weight=1)``)."""
OUTPUT_WEIGHT = 1
"""The same for the final norm and the output head together."""

MULTI_STAGE = (PipeSchedule.INTERLEAVED_1F1B, PipeSchedule.INTERLEAVED_ZB, PipeSchedule.ZBV,
               PipeSchedule.DUALPIPEV)
"""Schedules with several stages per rank (``PipelineScheduleMulti``); GPipe and 1F1B hold
one (``PipelineScheduleSingle``)."""

V_SHAPED = (PipeSchedule.ZBV, PipeSchedule.DUALPIPEV)
"""Schedules with exactly 2 stages per rank in a V (stages ``rank`` and ``2 pp - 1 - rank``)."""

SPLIT_BACKWARD = (PipeSchedule.INTERLEAVED_ZB, *V_SHAPED)
"""Schedules whose backward may be split in two: ``I`` (the gradient of the stage's input)
and, later, ``W`` (its weights' gradients); their memory and bubble are walked along their
action lists (``split_actions``)."""


class Op(NamedTuple):
    """One compute action of a rank's schedule (torch's ``_Action``): ``kind`` F (forward),
    I (backward for the input, ``BACKWARD_INPUT``), W (backward for the weights,
    ``BACKWARD_WEIGHT``) or B (both at once, ``FULL_BACKWARD``), on ``stage`` for
    micro-batch ``mb``."""

    kind: str
    stage: int
    mb: int


def default_virtual(schedule: PipeSchedule) -> int:
    """Stages per rank when none is given: torchtitan's default, 1 for the single-stage
    schedules and 2 for the multi-stage ones (``pipeline_llm`` without
    ``pipeline_parallel_layers_per_stage``)."""
    return 2 if schedule in MULTI_STAGE else 1


def stage_layers(n_layers: int, n_stages: int) -> list[int]:
    """``_stage_layers``, as a new list (cached: a pipeline plan asks it per rank)."""
    return list(_stage_layers(n_layers, n_stages))


@lru_cache(maxsize=1024)
def _stage_layers(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Transformer blocks per stage, as torchtitan's ``generate_llm_fqn_per_model_part``
    splits them: the embedding and the head each count as one layer, the L + 2 "effective"
    layers are dealt out evenly (the first ``(L + 2) % S`` stages one more), then the first
    stage gives one to the embedding and the last one to the norm + head. Raises ValueError
    where torchtitan does."""
    if n_stages == 1:
        return [n_layers]
    effective = n_layers + INPUT_WEIGHT + OUTPUT_WEIGHT
    if n_stages > effective:
        raise ValueError(f"{n_stages} stages is more than the model's {n_layers} layers + "
                         "embedding + head (torchtitan needs a layer per stage)")
    base, extra = divmod(effective, n_stages)
    if base < max(INPUT_WEIGHT, OUTPUT_WEIGHT):
        raise ValueError(f"{n_stages} stages leave the first or last stage no room for the "
                         f"embedding or the head ({base} effective layers per stage)")
    out, left = [], n_layers
    for i in range(n_stages):
        share = base + (i < extra)
        share -= INPUT_WEIGHT if i == 0 else OUTPUT_WEIGHT if i == n_stages - 1 else 0
        take = min(share, left)
        out.append(take)
        left -= take
    return tuple(out)


def rank_stages(p: Pipeline, rank: int) -> tuple[int, ...]:
    """The stages rank ``rank`` holds: looped (``rank``, ``rank + pp``, ...) for the
    interleaved schedule, a V (``rank``, ``2 pp - 1 - rank``) for ZBV and DualPipeV
    (``_utils.generate_stage_to_rank_mapping``: style "v" for ZBV / DualPipeV in torchtitan's
    ``pipeline_module_split``): rank 0 holds the embedding's stage and the head's."""
    if p.schedule in V_SHAPED:
        return (rank, 2 * p.degree - 1 - rank)
    return tuple(rank + k * p.degree for k in range(p.virtual))


def _numbered(kinds: list[tuple[str, int]], m: int) -> list[Op]:
    """(kind, stage) in order -> Ops, each numbered as torch numbers them: the micro-batches of
    a stage's forwards, input backwards and weight backwards each count up from 0 (a full
    backward counts as both an input and a weight backward); those past ``m`` dropped (torch
    turns them into empty slots)."""
    seen: Counter[tuple[str, int]] = Counter()
    out = []
    for kind, stage in kinds:
        key = "I" if kind == "B" else kind
        mb = seen[key, stage]
        seen[key, stage] += 1
        if kind == "B":
            seen["W", stage] += 1
        if mb < m:
            out.append(Op(kind, stage, mb))
    return out


def _zbv_order(pp: int, m: int, rank: int) -> list[Op]:
    """``ScheduleZBVZeroBubble._calculate_single_rank_operations`` (torch 2.13
    schedules.py): with a = the rank's first stage, b = its second, and the micro-batches
    padded to n = max(2 pp - 1, M):

    - warm-up: 2 (pp - rank) - 1 forwards of a; rank times (F b, F a); pp - rank times
      (F b, I b, W b);
    - steady, while b has run fewer forwards than a or a fewer than n: F a (while a has run
      fewer than n), I a, W a, F b, I b, W b;
    - cool-down: rank times (I a, I b); pp - rank times (I a, W a); then the weight backwards
      left, b's before a's.
    """
    a, b = rank, 2 * pp - 1 - rank
    n = max(2 * pp - 1, m)
    kinds = ([("F", a)] * (2 * (pp - rank) - 1) + [("F", b), ("F", a)] * rank
             + [("F", b), ("I", b), ("W", b)] * (pp - rank))
    f_a, f_b = 2 * (pp - rank) - 1 + rank, pp
    while f_b < f_a or f_a < n:
        if f_a < n:
            kinds.append(("F", a))
            f_a += 1
        kinds += [("I", a), ("W", a), ("F", b), ("I", b), ("W", b)]
        f_b += 1
    kinds += [("I", a), ("I", b)] * rank + [("I", a), ("W", a)] * (pp - rank)
    done = Counter(kinds)
    kinds += [("W", b)] * (f_b - done["W", b]) + [("W", a)] * (f_a - done["W", a])
    return _numbered(kinds, m)


def _dualpipev_order(pp: int, m: int, rank: int) -> list[Op]:
    """``ScheduleDualPipeV._calculate_single_rank_operations`` (torch 2.13 schedules.py,
    after DeepSeek's DualPipe), a = the rank's first stage, b = its second; each input
    backward queues its weight backward, and "W" runs the oldest queued one:

    1. 2 (pp - rank - 1) forwards of a;
    2. rank + 1 times F a, F b;
    3. pp - rank - 1 times I b, W, F b;
    4. M - 2 pp + rank + 1 times F a + B b, F b + B a (torch's OVERLAP_F_B pairs, which its
       runtime runs one after the other: forward first);
    5. pp - rank - 1 times B b, F b + B a;
    6. rank + 1 times a backward of b then of a, full until the middle one (i = (rank + 1)
       // 2: an odd rank splits from that backward of b on, an even one from that of a),
       input-only from there;
    7. pp - rank - 1 times W, then a backward of a (split as 6 left it);
    8. rank + 1 times W.
    """
    a, b = rank, 2 * pp - 1 - rank
    kinds: list[tuple[str, int]] = []
    queue: list[int] = []

    def add(kind: str, stage: int) -> None:
        kinds.append((kind, stage))
        if kind == "I":
            queue.append(stage)

    def weight() -> None:
        if queue:
            kinds.append(("W", queue.pop(0)))

    kinds += [("F", a)] * (2 * (pp - rank - 1)) + [("F", a), ("F", b)] * (rank + 1)
    for _ in range(pp - rank - 1):
        add("I", b)
        weight()
        add("F", b)
    kinds += [("F", a), ("B", b), ("F", b), ("B", a)] * max(0, m - 2 * pp + rank + 1)
    kinds += [("B", b), ("F", b), ("B", a)] * (pp - rank - 1)
    split = False
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        add("I" if split else "B", b)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        add("I" if split else "B", a)
    for _ in range(pp - rank - 1):
        weight()
        add("I" if split else "B", a)
    for _ in range(rank + 1):
        weight()
    # a weight backward's micro-batch is its input backward's: the queue keeps their order
    return _numbered(kinds, m)


def _interleaved_zb_order(pp: int, m: int, v: int, rank: int) -> list[Op]:
    """``ScheduleInterleavedZeroBubble._calculate_single_rank_operations`` (torch 2.13
    schedules.py: ``_get_1f1b_rank_ops`` with ``enable_zero_bubble``; the empty slots
    ``_add_bubbles_to_actions`` inserts change no order): with per_round = M // max(1, M // pp)
    and warm-up = min((v - 1) per_round + pp - 1 - rank, M v) forwards, op ``i`` of the M v
    runs its forward on local stage (i // per_round) % v; from the warm-up on each op adds an
    input backward of local stage v - 1 - ((i - warm-up) // per_round) % v, and, once rank
    of them have run, the weight backward of the oldest input backward not yet weighted;
    after the last forward the input backwards left (warm-up of them) go on the same way,
    then the weight backwards left."""
    rounds = max(1, m // pp)
    per_round = m // rounds
    total = m * v
    warmup = min((v - 1) * per_round + pp - 1 - rank, total)
    kinds: list[tuple[str, int]] = []
    inputs: list[int] = []  # stages of the input backwards, in order
    for op in range(total + warmup):
        if op < total:
            kinds.append(("F", (op // per_round) % v * pp + rank))
        if op >= warmup:
            inputs.append((v - 1 - (op - warmup) // per_round % v) * pp + rank)
            kinds.append(("I", inputs[-1]))
            if op - warmup >= rank:
                kinds.append(("W", inputs[len(inputs) - 1 - rank]))
    kinds += [("W", s) for s in inputs[max(0, len(inputs) - rank):]]
    return _numbered(kinds, m)


def split_actions(p: Pipeline, rank: int) -> list[Op]:
    """The compute actions of rank ``rank`` under a split-backward schedule, in torch's
    order."""
    if p.schedule is PipeSchedule.INTERLEAVED_ZB:
        return _interleaved_zb_order(p.degree, p.microbatches, p.virtual, rank)
    order = _zbv_order if p.schedule is PipeSchedule.ZBV else _dualpipev_order
    return order(p.degree, p.microbatches, rank)


def split_in_flight(ops: list[Op]) -> list[dict[tuple[int, bool], int]]:
    """After each action of a V-shaped schedule: how many micro-batches each stage holds,
    keyed (stage, input backward done): forwarded and not yet through I (False), or through
    I and not yet through W (True). A full backward (B) or a weight backward (W) ends a
    micro-batch."""
    held: Counter[tuple[int, bool]] = Counter()
    out = []
    for op in ops:
        if op.kind == "F":
            held[op.stage, False] += 1
        elif op.kind == "I":
            held[op.stage, False] -= 1
            held[op.stage, True] += 1
        elif op.kind == "W":
            held[op.stage, True] -= 1
        else:
            held[op.stage, False] -= 1
        out.append(dict(held))
    return out


def peak_in_flight(p: Pipeline, rank: int) -> int:
    """The most (stage, micro-batch) pairs whose saved activations rank ``rank`` holds at
    once: forward run, backward (its weight part, for ZBV) not yet.

    - GPipe (``ScheduleGPipe._step_microbatches``): every forward before any backward: M.
    - 1F1B (``Schedule1F1B._step_microbatches``): ``warmup_chunks = min(M, pp - stage)``
      forwards, then one backward before each further forward.
    - Interleaved 1F1B (``ScheduleInterleaved1F1B._calculate_single_rank_operations``):
      ``_get_warmup_ops`` = min((v - 1) * per_round + 2 * (pp - 1 - rank), M v) forwards
      (rounds = max(1, M // pp), per_round = M // rounds), then each steady step runs one
      forward before one backward: one more while any forward is left.
    - ZBV (``ScheduleZBVZeroBubble._calculate_single_rank_operations``): 2 (pp - rank) - 1
      forwards of the rank's first stage, then ``rank`` pairs (second stage, first stage),
      then the second stage's forward before its input and weight backward; micro-batches
      past M are not run: min(M, 2 pp - 1 - rank) + min(M, rank + 1). The input backward
      (``stage_backward_input``, ``retain_graph=True``) keeps the graph for the weight
      backward, so a micro-batch's activations live until its W.
    - DualPipeV and Interleaved Zero Bubble: counted along their action lists
      (``split_actions``).
    """
    m, pp, v = p.microbatches, p.degree, p.virtual
    if p.schedule in (PipeSchedule.DUALPIPEV, PipeSchedule.INTERLEAVED_ZB):
        return max(sum(h.values()) for h in split_in_flight(split_actions(p, rank)))
    if p.schedule is PipeSchedule.GPIPE:
        return m
    if p.schedule is PipeSchedule.ONE_F_ONE_B:
        return min(m, pp - rank)
    if p.schedule is PipeSchedule.INTERLEAVED_1F1B:
        rounds = max(1, m // pp)
        per_round = m // rounds
        warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), m * v)
        return warmup + 1 if warmup < m * v else warmup
    return min(m, 2 * pp - 1 - rank) + min(m, rank + 1)


def rank_ops(p: Pipeline, rank: int) -> list[tuple[str, int]]:
    """The forwards ("F") and full backwards ("B") rank ``rank`` runs in one step, in order,
    each with its stage, as the runtime runs them:

    - GPipe (``ScheduleGPipe._step_microbatches``): M forwards, then M backwards;
    - 1F1B (``Schedule1F1B._step_microbatches``): ``min(M, pp - rank)`` forwards, then a
      backward before each further forward (its "1B1F" phase), then the backwards left;
    - interleaved 1F1B (``_get_1f1b_rank_ops``, which ``pipeline_order`` holds and the
      runtime executes): ``warmup`` forwards, then a forward and a backward per step, then
      the backwards left; forward ``i`` on local stage (i // per_round) % v, backward ``j``
      on local stage v - 1 - (j // per_round) % v.
    (The split-backward schedules hold micro-batches in two states: ``split_actions``,
    walked by memory/pipeline.py's ``_split_walk``.) Checked against torch's action lists
    (tests/test_pipeline.py)."""
    stages = rank_stages(p, rank)
    m, pp, v = p.microbatches, p.degree, p.virtual
    if p.schedule in SPLIT_BACKWARD:
        raise ValueError(f"{p.schedule} holds micro-batches in two states: split_actions")
    s = stages[0]
    if p.schedule is PipeSchedule.GPIPE:
        return [("F", s)] * m + [("B", s)] * m
    if p.schedule is PipeSchedule.ONE_F_ONE_B:
        w = min(m, pp - rank)
        return [("F", s)] * w + [("B", s), ("F", s)] * (m - w) + [("B", s)] * w
    rounds = max(1, m // pp)
    per_round = m // rounds
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)

    def back(j: int) -> tuple[str, int]:
        return ("B", stages[v - 1 - (j // per_round) % v])

    out: list[tuple[str, int]] = []
    for op in range(total):
        out.append(("F", stages[(op // per_round) % v]))
        if op >= warmup:
            out.append(back(op - warmup))
    out += [back(j) for j in range(total - warmup, total)]
    return out


ASSUMED_COST = {"F": 1.0, "I": 1.0, "W": 1.0, "B": 2.0}
"""*Assumed* time of one action (one stage, one micro-batch), in forwards: Qi et al. 2024
(Zero Bubble Pipeline Parallelism, §2) take the forward, the input backward and the weight
backward as equal; a full backward is both."""


def _cost(op: Op) -> float:
    """``ASSUMED_COST``, but torch runs nothing for the first stage's input backward and the
    whole backward in its weight step (``PipelineStage.backward_one_chunk`` skips the first
    stage; ``backward_weight_one_chunk`` runs its full backward)."""
    if op.stage == 0 and op.kind in ("I", "W"):
        return 0.0 if op.kind == "I" else ASSUMED_COST["B"]
    return ASSUMED_COST[op.kind]


def _needs(op: Op, last: int) -> tuple[str, int, int] | None:
    """The action another stage must have finished first: a forward needs the previous
    stage's forward of that micro-batch, a backward (I or B) the next stage's backward (the
    last stage: its own forward and loss), a weight backward its own input backward."""
    if op.kind == "F":
        return ("F", op.stage - 1, op.mb) if op.stage else None
    if op.kind == "W":
        return ("I", op.stage, op.mb)
    return ("F", op.stage, op.mb) if op.stage == last else ("I", op.stage + 1, op.mb)


@lru_cache(maxsize=64)
def split_step(p: Pipeline) -> tuple[float, float]:
    """(the step's length, the busiest rank's own work), in forwards (``ASSUMED_COST``), of
    a V-shaped schedule: every rank runs its action list (``split_actions``) in order, each action
    starting once its rank is free and what it needs (``_needs``) has finished; transfers
    take no time."""
    orders = [split_actions(p, r) for r in range(p.degree)]
    last = p.n_stages - 1
    done: dict[tuple[str, int, int], float] = {}
    clock = [0.0] * p.degree
    at = [0] * p.degree
    moved = True
    while moved:
        moved = False
        for r, order in enumerate(orders):
            while at[r] < len(order):
                op = order[at[r]]
                need = _needs(op, last)
                if need is not None and need not in done:
                    break
                clock[r] = max(clock[r], done[need] if need else 0.0) + _cost(op)
                done["I" if op.kind == "B" else op.kind, op.stage, op.mb] = clock[r]
                at[r] += 1
                moved = True
    if any(at[r] < len(order) for r, order in enumerate(orders)):
        raise ValueError(f"{p.schedule} pp {p.degree} M {p.microbatches}: the action lists "
                         "deadlock")
    return max(clock), max(sum(map(_cost, order)) for order in orders)


def bubble_ratio(p: Pipeline) -> float:
    """A rank's idle time per step over its busy time.

    GPipe and 1F1B: (pp - 1) / M (Huang et al. 2019, GPipe §2.3: the bubble is
    (pp - 1) / (M + pp - 1) of the step); interleaved: (pp - 1) / (v M) (Narayanan et al.
    2021, §2.2.2); the split-backward schedules (ZBV, DualPipeV, Interleaved Zero Bubble):
    the length of the step their action lists make (``split_step``, *assumed* equal forward,
    input- and weight-backward times) over the busiest rank's work, minus 1."""
    m, pp = p.microbatches, p.degree
    if p.schedule is PipeSchedule.INTERLEAVED_1F1B:
        return (pp - 1) / (p.virtual * m)
    if p.schedule in SPLIT_BACKWARD:
        length, busy = split_step(p)
        return length / busy - 1
    return (pp - 1) / m


def problem(p: Pipeline, n_layers: int) -> tuple[str, str] | None:
    """(field, why) when fitcheck does not model this pipeline or torch / torchtitan would
    refuse it, else None."""
    return schedule_problem(p, n_layers)


def schedule_problem(p: Pipeline, n_layers: int) -> tuple[str, str] | None:
    """(field, why) when torch or torchtitan would refuse this pipeline, else None. The
    field is the one to name: ``parallel.pp_virtual_stages`` or ``parallel.pp_microbatches``."""
    pp, v, m, s = p.degree, p.virtual, p.microbatches, p.schedule
    if s in MULTI_STAGE and v < 2:
        return "parallel.pp_virtual_stages", f"{s} holds at least 2 stages per rank, got {v}"
    if s in V_SHAPED and v != 2:
        # ScheduleZBVZeroBubble / ScheduleDualPipeV.__init__: "requires exactly 2 stages
        # per rank"
        return "parallel.pp_virtual_stages", f"{s} holds exactly 2 stages per rank, got {v}"
    if s is PipeSchedule.DUALPIPEV and m < pp * v:
        # ScheduleDualPipeV.__init__: "DualPipeV requires at least as many microbatches as
        # stages"
        return "parallel.pp_microbatches", (f"dualpipev needs at least {pp * v} micro-batches "
                                            f"(one per stage), got {m}")
    if s not in MULTI_STAGE and v != 1:
        return "parallel.pp_virtual_stages", f"{s} holds 1 stage per rank, got {v}"
    if s is PipeSchedule.ONE_F_ONE_B and m < pp:
        # Schedule1F1B.__init__: "Number of microbatches ... must be greater than or equal to
        # the number of stages"
        return "parallel.pp_microbatches", f"1f1b needs at least {pp} micro-batches, got {m}"
    if s in (PipeSchedule.INTERLEAVED_1F1B, PipeSchedule.INTERLEAVED_ZB) and m % max(1, m // pp):
        # ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble.__init__: "... a multiple
        # of the number of rounds"
        return "parallel.pp_microbatches", (
            f"{s} needs the micro-batches ({m}) to be a multiple of the rounds ({m // pp})")
    try:
        stage_layers(n_layers, p.n_stages)
    except ValueError as exc:
        return "parallel.pp", str(exc)
    return None
