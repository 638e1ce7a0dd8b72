"""Pipeline parallel as torchtitan runs it on ``torch.distributed.pipelining`` (docs/model.md
"Pipeline parallel"): how the layers split into stages, which stages a rank holds, how many
micro-batches' activations a rank holds at once under each schedule, and the idle time
(bubble) of a step.

Sources (torch 2.13, ``torch/distributed/pipelining/schedules.py``; torchtitan
``torchtitan/distributed/pipeline_parallel.py``). Every count here is checked against the
schedules' own action lists (tests/test_pipeline.py, ``trace`` tier).
"""

from __future__ import annotations

from planner.spec import PipeSchedule, Pipeline

INPUT_WEIGHT = 1
"""torchtitan counts the token embedding as this many layers when it splits the model
(``generate_llm_fqn_per_model_part(..., input_weight=1, output_weight=1)``)."""
OUTPUT_WEIGHT = 1
"""The same for the final norm and the output head together."""

MULTI_STAGE = (PipeSchedule.INTERLEAVED_1F1B, PipeSchedule.ZBV)
"""Schedules with several stages per rank (``PipelineScheduleMulti``); GPipe and 1F1B hold
one (``PipelineScheduleSingle``)."""


def default_virtual(schedule: PipeSchedule) -> int:
    """Stages per rank when none is given: torchtitan's default, 1 for the single-stage
    schedules and 2 for the multi-stage ones (``pipeline_llm`` without
    ``pipeline_parallel_layers_per_stage``)."""
    return 2 if schedule in MULTI_STAGE else 1


def stage_layers(n_layers: int, n_stages: int) -> list[int]:
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
    return out


def rank_stages(p: Pipeline, rank: int) -> tuple[int, ...]:
    """The stages rank ``rank`` holds: looped (``rank``, ``rank + pp``, ...) for the
    interleaved schedule, a V (``rank``, ``2 pp - 1 - rank``) for ZBV
    (``_utils.generate_stage_to_rank_mapping``: style "v" for ZBV / DualPipeV in torchtitan's
    ``pipeline_module_split``)."""
    if p.schedule is PipeSchedule.ZBV:
        return (rank, 2 * p.degree - 1 - rank)
    return tuple(rank + k * p.degree for k in range(p.virtual))


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
    """
    m, pp, v = p.microbatches, p.degree, p.virtual
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
    (ZBV: not modelled.) Checked against torch's action lists (tests/test_pipeline.py)."""
    stages = rank_stages(p, rank)
    m, pp, v = p.microbatches, p.degree, p.virtual
    if p.schedule is PipeSchedule.ZBV:
        raise ValueError("zbv's memory is not modelled (pipeline.problem)")
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


def bubble_ratio(p: Pipeline) -> float:
    """A rank's idle time per step over its busy time.

    GPipe and 1F1B: (pp - 1) / M (Huang et al. 2019, GPipe §2.3: the bubble is
    (pp - 1) / (M + pp - 1) of the step); interleaved: (pp - 1) / (v M) (Narayanan et al.
    2021, §2.2.2); ZBV: *assumed* none once torch's schedule is full (Qi et al. 2024, Zero
    Bubble PP, ZB-V with equal forward, input- and weight-backward times), and the slots torch
    pads to when M < 2 pp - 1 (``n_micro = max(2 pp - 1, M)``) idle."""
    m, pp = p.microbatches, p.degree
    if p.schedule is PipeSchedule.INTERLEAVED_1F1B:
        return (pp - 1) / (p.virtual * m)
    if p.schedule is PipeSchedule.ZBV:
        return max(0, 2 * pp - 1 - m) / m
    return (pp - 1) / m


def problem(p: Pipeline, n_layers: int) -> tuple[str, str] | None:
    """(field, why) when fitcheck does not model this pipeline or torch / torchtitan would
    refuse it, else None."""
    if p.schedule is PipeSchedule.ZBV:
        # its micro-batch counts are torch's (tests/test_pipeline.py), but its memory is not
        # checked: the split backward could not be traced (docs/model.md §8.7), and between
        # an input and a weight backward it keeps the graph and the weights' output
        # gradients, which the planner does not count
        return "parallel.pp_schedule", ("zbv is NOT MODELLED: its split input/weight "
                                        "backward's memory is not checked")
    return schedule_problem(p, n_layers)


def schedule_problem(p: Pipeline, n_layers: int) -> tuple[str, str] | None:
    """(field, why) when torch or torchtitan would refuse this pipeline, else None. The
    field is the one to name: ``parallel.pp_virtual_stages`` or ``parallel.pp_microbatches``."""
    pp, v, m, s = p.degree, p.virtual, p.microbatches, p.schedule
    if s in MULTI_STAGE and v < 2:
        return "parallel.pp_virtual_stages", f"{s} holds at least 2 stages per rank, got {v}"
    if s is PipeSchedule.ZBV and v != 2:
        return "parallel.pp_virtual_stages", f"zbv holds exactly 2 stages per rank, got {v}"
    if s not in MULTI_STAGE and v != 1:
        return "parallel.pp_virtual_stages", f"{s} holds 1 stage per rank, got {v}"
    if s is PipeSchedule.ONE_F_ONE_B and m < pp:
        # Schedule1F1B.__init__: "Number of microbatches ... must be greater than or equal to
        # the number of stages"
        return "parallel.pp_microbatches", f"1f1b needs at least {pp} micro-batches, got {m}"
    if s is PipeSchedule.INTERLEAVED_1F1B and m % max(1, m // pp):
        return "parallel.pp_microbatches", (
            f"interleaved-1f1b needs the micro-batches ({m}) to be a multiple of the rounds "
            f"({m // pp})")
    try:
        stage_layers(n_layers, p.n_stages)
    except ValueError as exc:
        return "parallel.pp", str(exc)
    return None
