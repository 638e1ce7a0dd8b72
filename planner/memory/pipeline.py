"""Per-GPU memory of one step under pipeline parallel (``--pp``), FSDP2 inside each stage, as
torchtitan runs it (docs/model.md "Pipeline parallel").

What differs from the FSDP moments of planner/memory/moments.py:

- torchtitan shards every unit with ``reshard_after_forward = not pp_enabled``
  (``torchtitan/models/llama3/infra/parallelize.py`` ``apply_fsdp``, policy "default"), and
  ``torch.distributed.pipelining`` runs every backward with ``set_reshard_after_backward(False)``
  and ``set_requires_gradient_sync(False)`` (``stage.py`` ``backward_maybe_with_nosync``) until
  the schedule's REDUCE_GRAD (``perform_reduce_grad``): a rank's stages stay unsharded (in
  ``param_dtype``) from their first forward to the end of the step, and their unsharded
  gradients (FSDP2 accumulates them in ``reduce_dtype``: ``to_accumulated_grad_if_needed``)
  from their first backward;
- a rank holds the activations of several micro-batches at once (planner/pipeline.py
  ``peak_in_flight``), and each stage's output in ``fwd_cache`` until its backward (the
  last stage's output is the logits);
- ``PipelineStage`` allocates a receive buffer per micro-batch for the activations
  (``_setup_forward_recv_info``, stages after the first) and for the gradients
  (``_setup_backward_recv_info``, stages before the last), each micro-batch x seq x hidden
  in the compute dtype, alive for the whole run.

Under tensor parallel beside the pipeline (``--pp`` with ``--tp``, torchtitan's FSDP x TP x
PP): each stage's modules are TP-parallelized over the tp mesh dimension first and then
FSDP2-sharded over dp (``parallelize_llama``: ``apply_tp`` before ``apply_fsdp``, on every
model part ``pipeline_llm`` returns). A rank holds its TP shard of every matrix (``tp_local``),
the activations of its tp share (the candidate's ``tp``: planner/activations.py ``tp_saved``),
and, as sequence parallel leaves every block's output sharded on the sequence (the last
``RowwiseParallel(output_layouts=Shard(1))`` returns the local tensor, and pipelining sends
the stage's local output), its stage outputs and P2P buffers at seq / tp; the last stage's
logits are vocab-sharded (``loss_parallel``).

Under context parallel beside the pipeline (``--pp`` with ``--cp``, torchtitan's 4D mesh
pp, dp_shard, cp, tp): every stage runs on the rank's seq / cp tokens of each micro-batch
(``context_parallel`` shards the batch before the schedule runs), so each micro-batch's saved
set, its stage outputs and the P2P buffers are at seq / cp (and / tp under sequence
parallel); FSDP2 shards over dp_shard x cp (``parallelize_llama``: the ``dp_shard_cp`` mesh),
n / (pp x tp) ranks, as without CP. The ring attention's buffers are transients inside one
block's attention (planner/context_parallel.py): one micro-batch's at a time, on top of the
held micro-batches' saved sets (``Activations.ring_fwd`` in forward, ``block_bwd`` in
backward).

Under the split-backward schedules (``split_rank_phases``: ZBV and DualPipeV, whose V puts
the first and the last stage on rank 0, and Interleaved Zero Bubble) a rank's moments are
walked along its own action list (``pipeline.split_actions``), the backward split into an
input step and a weight step (docs/model.md §8.7).

Every rank is evaluated; the fullest decides the fit. Scalars only (the report refuses
``--pp``).
"""

from __future__ import annotations

import dataclasses
import functools

from collections import Counter
from typing import Any, Callable

from planner import pipeline, vec
from planner.lazy_dataclass import dataclass
from planner.memory.breakdown import PHASES, Breakdown, Overheads, Phase, largest
from planner.memory.moments import Activations
from planner.memory.states import dtypes, optimizer_state_bytes
from planner.memory.zero import optimizer_temp_bytes
from planner.params import block_tensors, numel, root_tensors
from planner.spec import (Checkpointing, ModelSpec, PipeKeptOutputs, PipeSchedule, Strategy,
                          TrainingSpec)
from planner.vec import ceil_div

INPUT_MODULES = ("embed.", "pos_embed.", "type_embed.", "embed_norm")
"""Root tensors torchtitan keeps on the first stage (``tok_embeddings``); the final norm and
the head go to the last (``norm``, ``output``)."""


ROWWISE = ("attn.o.weight", "mlp.down.weight")
"""Block matrices torchtitan splits on their input dimension (``RowwiseParallel``: the
attention output ``wo`` and the MLP's ``w2``); their biases stay replicated."""


def tp_local(name: str, shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """The shape of one TP rank's piece of a parameter under torchtitan's ``apply_tp`` plan:
    norms (``SequenceParallel``) and the row-wise layers' biases replicated; the row-wise
    matrices split on dim 1; everything else (q/k/v, gate/up: ``ColwiseParallel``; the
    embedding: ``RowwiseParallel`` over its vocabulary rows; the head: ``ColwiseParallel``)
    on dim 0. FSDP2 then shards dim 0 of that local piece."""
    if tp == 1 or "norm" in name or name in ("attn.o.bias", "mlp.down.bias"):
        return shape
    if name in ROWWISE:
        return (shape[0], shape[1] // tp, *shape[2:])
    return (shape[0] // tp, *shape[1:])


@functools.lru_cache(maxsize=4096)
def rank_groups(model: ModelSpec, blocks: int, first: bool, last: bool, tp: int = 1
                ) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """(name, shape, how many) of the parameters one rank holds (its TP piece). Cached: a
    pipeline plan asks it per rank and stage, the mesh search per layout."""
    out = [(n, tp_local(n, s, tp), blocks) for n, s in block_tensors(model)] if blocks else []
    for n, s in root_tensors(model):
        if n.startswith(INPUT_MODULES) and first or not n.startswith(INPUT_MODULES) and last:
            out.append((n, tp_local(n, s, tp), 1))
    return tuple(out)


def whole_table(model: ModelSpec, first: bool, tp: int) -> int:
    """Elements the first stage's embedding gradient holds beyond its TP piece. DTensor has no
    sharding rule for ``embedding_dense_backward`` over a vocabulary-sharded table: the
    gradient comes back ``Replicate``, the whole table on every TP rank (docs/model.md §8.5),
    and under PP FSDP2 accumulates it whole in the reduce dtype
    (``FSDPParam.to_accumulated_grad_if_needed``) until REDUCE_GRAD, where
    ``_get_grad_inner_tensor`` redistributes it to the parameter's ``Shard(0)`` (a copy of the
    rank's rows). Traced (tests/test_pipeline.py)."""
    if tp == 1 or not first:
        return 0
    table = sum(numel(s) for n, s in root_tensors(model) if n.startswith("embed."))
    return table - table // tp


def stage_sizes(model: ModelSpec, training: TrainingSpec, layers: list[int],
                stages: tuple[int, ...], acts: Activations, c: int, tp: int = 1,
                ckpt: Checkpointing = Checkpointing.NONE) -> dict[int, Any]:
    """Bytes one micro-batch holds on each stage of the rank: its blocks' saved tensors, its
    output (cached until its backward; the last stage's is the logits), what the root saves
    before the blocks on the first stage, and the final norm's, the head's and the loss's
    on the last. Under TP the output is the rank's piece: seq / tp positions of a block's
    output (sequence parallel), vocab / tp of the logits (``loss_parallel``).

    Under full checkpointing a block keeps its input by reference (the checkpoint saves the
    tensor it is given), and the first block of a stage after the first is given the
    micro-batch's P2P receive buffer, already counted as a buffer: that block-input is not
    counted twice (traced: the interleaved ranks read up to +2.5 % with it)."""
    t = training.micro_batch * training.local_seq
    last = len(layers) - 1
    boundary = t * model.hidden // tp * c
    return {s: layers[s] * acts.kept_per_block
            - (boundary if ckpt is Checkpointing.FULL and s != 0 and layers[s] else 0)
            + t * (model.vocab if s == last else model.hidden) // tp * c
            + (acts.root_before if s == 0 else 0)
            + (acts.root - acts.root_before if s == last else 0) for s in stages}


@dataclass(frozen=True, slots=True)
class StageBytes:
    """One stage of a rank: a held micro-batch's bytes, its unsharded parameters (held from
    the step's start to its gradient reduction), its unsharded gradients (from its first
    backward to that reduction) and its sharded gradients (the reduction's output, to the
    optimizer step); ``kept``: the part of ``held`` that stays past the micro-batch's
    backward to the step's end (the stage output, under ``Pipeline.kept_outputs``)."""

    held: Any
    gathered: Any
    grads: Any
    sharded_grads: Any
    kept: Any = 0
    last_output: Any = 0
    """A micro-batch's stage output (beyond ``kept``) that outlives its backward under GPipe
    and 1F1B when it is the rank's latest forward's: ``_step_microbatches`` binds each
    forward's output to a local (``output = self._stage.forward_one_chunk(...)``, torch 2.13
    schedules.py, ``ScheduleGPipe`` and ``Schedule1F1B``), which holds it until the next
    forward rebinds it, or through the rest of the backward loop and
    ``perform_reduce_grad`` (traced: after each backward of 1F1B's last rank and after the
    last backward of every rank, one micro-batch's logits on the last stage, a block output
    elsewhere; docs/model.md §8.7)."""
    input_grad: Any = 0
    """A micro-batch's input gradient (the stage's P2P send to the previous stage), under
    GPipe and 1F1B: ``backward_one_chunk`` leaves it in ``bwd_cache``, and the schedule's
    ``get_bwd_send_ops`` moves it into the send ops, which a local (``ops`` /
    ``bwd_sends``) holds until the next backward's rebinds it: after a backward, its own and
    the one before it; otherwise one (traced: 1,048,576 B each at seq 1024, h 512, bf16)."""


@dataclass(frozen=True, slots=True)
class Moment:
    """What a rank holds at one point of its op list (bytes), and the stage of the op."""

    activations: Any
    gradients: Any
    gathered: Any
    stage: int
    rs_free: Any = 0
    """The previous step's sharded gradients of the stages not yet reduced: free in those
    stages' reduce-scatter pools (``estimator.pipeline_cache``)."""


@dataclass(frozen=True, slots=True)
class Walk:
    """The moments of a rank's step (``pipeline.rank_ops``): after each forward, at the start
    and at the end of each backward, and at each stage's gradient reduction (before its
    gradients are reduced)."""

    after_forward: list[Moment]
    backward_start: list[Moment]
    backward_end: list[Moment]
    reduce: list[Moment]
    actions: list[tuple[str, Moment]]
    """(``F`` or ``B``, the moment after it) for each op in order, without ``records_only``
    (the referee's timeline: ``Ranks.timeline``)."""


def walk(p: Any, rank: int, stage: dict[int, StageBytes], *, records_only: bool = False,
         last: int = -1, end_extra: Any = None) -> Walk:
    """Walk the rank's forwards and backwards in order. A micro-batch is held from its
    forward to its backward (its ``kept`` bytes to the step's end); a stage's unsharded
    gradients exist from its first backward; right after its last backward (the M-th) the
    stage's gradients are reduced and the stage resharded: torch 2.13 schedules a
    REDUCE_GRAD per stage there (``schedules.py`` ``_add_reduce_grad``: "schedule it just
    after the last backward-like stage"; the
    single-stage schedules call ``perform_reduce_grad`` after their last backward), which
    runs FSDP2's ``post_backward`` with ``reshard_after_backward`` set: the unsharded
    parameters and gradients go, the sharded gradients stay. (torch 1963fc8, 2024-12, did
    the same in ``backward_maybe_with_nosync`` at the stage's ``last_backward``.) So under
    interleaved 1F1B with M = pp a rank holds one stage's unsharded gradients at a time.

    With ``records_only`` and scalar bytes, a forward's or a backward's moment is kept only
    where it holds more
    than every earlier one of its kind (after a forward: overall, and on stage ``last``; at
    a backward's end: with ``end_extra(stage)`` bytes added): the first of the largest is
    kept, so the largest of each list is the largest of all the moments, in work that does
    not grow with the moments kept. Every reduction's moment is kept."""
    done = dict.fromkeys(stage, 0)
    started: set[int] = set()
    out = Walk([], [], [], [], [])
    # running totals, updated at each op (the same sums as recounting every stage each time:
    # micro-batches held x bytes each, unsharded gradients of started stages and sharded ones
    # of reduced stages, gathered parameters of stages not yet resharded)
    activations: Any = 0
    gradients: Any = 0
    gathered: Any = sum(b.gathered for b in stage.values())
    rs_free: Any = sum(b.sharded_grads for b in stage.values())

    scalar = records_only and all(isinstance(v, (int, float)) for b in stage.values()
                 for v in (b.held, b.gathered, b.grads, b.sharded_grads))
    none = float("-inf")
    top_f = top_last = top_start = top_end = none

    def now(s: int) -> Moment:
        return Moment(activations=activations, gradients=gradients, gathered=gathered, stage=s,
                      rs_free=rs_free)

    # the latest forward's (stage, micro-batch), and its output held past its backward by
    # the schedule's local (StageBytes.last_output) until the next forward rebinds it
    latest: tuple[int, int] | None = None
    dangling: Any = 0
    sent: dict[int, int] = dict.fromkeys(stage, 0)  # input gradients held (input_grad)
    count: Counter = Counter()
    for kind, s in pipeline.rank_ops(p, rank):
        b = stage[s]
        mb = count[(kind, s)]
        count[(kind, s)] += 1
        if kind == "F":
            activations = activations + b.held - dangling
            latest, dangling = (s, mb), 0
            key = activations + gradients + gathered
            if not records_only:
                out.actions.append(("F", now(s)))
            if not scalar or key > top_f or (s == last and key > top_last):
                out.after_forward.append(now(s))
                top_f = max(top_f, key) if scalar else top_f
                top_last = max(top_last, key) if scalar and s == last else top_last
            continue
        key = activations + gradients + gathered
        if not scalar or key > top_start:
            out.backward_start.append(now(s))
            top_start = max(top_start, key) if scalar else top_start
        activations = activations - b.held + b.kept
        if s not in started:
            started.add(s)
            gradients = gradients + b.grads
        done[s] += 1
        if (s, mb) == latest:
            dangling = b.last_output
            activations = activations + dangling
        activations = activations + b.input_grad
        sent[s] += 1
        if not records_only:
            out.actions.append(("B", now(s)))
        key = activations + gradients + gathered + (end_extra(s) if end_extra else 0)
        if not scalar or key > top_end:
            out.backward_end.append(now(s))
            top_end = max(top_end, key) if scalar else top_end
        if sent[s] == 2:  # the earlier send ops rebound to this backward's
            activations = activations - b.input_grad
            sent[s] = 1
        if done[s] == p.microbatches:
            out.reduce.append(now(s))
            gradients = gradients - b.grads + b.sharded_grads
            gathered = gathered - b.gathered
            rs_free = rs_free - b.sharded_grads
    return out


@functools.lru_cache(maxsize=4096)
def group_elements(model: ModelSpec, blocks: int, first: bool, last: bool, tp: int, dp: int
                   ) -> tuple[int, int]:
    """(elements, elements of the dim-0 shards over ``dp``) of ``rank_groups``' tensors."""
    g = rank_groups(model, blocks, first, last, tp)
    return (sum(k * numel(sh) for _, sh, k in g),
            sum(k * ceil_div(numel(sh), dp) for _, sh, k in g))


@functools.lru_cache(maxsize=4096)
def ep_group_elements(model: ModelSpec, blocks: int, first: bool, last: bool, dp: int,
                      ep: int) -> tuple[int, int, int]:
    """(gathered, unsharded-gradient, shard) elements of ``rank_groups``' tensors on one rank
    of a stage of ``dp`` ranks under expert parallel ``ep`` (docs/model.md §8.8 "Beside
    pipeline parallel"): a block's stacked routed experts are its stage's E / ep local ones,
    FSDP2-sharded over the stage's efsdp = dp / ep ranks (torchtitan b5bcd76 ``fsdp.py``
    lines 318-360, the per-parameter mesh; ``expert_parallel._held``): all-gathered from the
    efsdp ranks' padded shards, their unsharded gradients the local experts' (unpadded), each
    rank's shard ``_held``; every other tensor as ``group_elements`` (dim-0 shards over dp).
    ep 1: no EP."""
    from planner.expert_parallel import ep_expert_padding, gathered_experts

    el, shard = group_elements(model, blocks, first, last, 1, dp)
    if ep <= 1 or not blocks:
        return el, el, shard
    whole, gathered = gathered_experts(list(block_tensors(model)), ep, dp)
    pad = ep_expert_padding(rank_groups(model, blocks, first, last), ep, dp)
    return (el + blocks * (gathered - whole), el - blocks * (whole - whole // ep),
            shard + pad)


@functools.lru_cache(maxsize=4096)
def units(model: ModelSpec, first: bool, last: bool, blocks: int, tp: int = 1, ep: int = 1,
          dp: int = 1) -> tuple[int, int]:
    """(the rank's largest FSDP unit, the unit its backward reaches last) in elements (of its
    TP piece); units as torchtitan's ``apply_fsdp`` makes them: a block, the embedding, the
    norm + head. The last one reached is the embedding on the first stage, else a block.
    Under expert parallel ``ep`` (stages of ``dp`` ranks) a block's unit holds its E / ep
    local experts as gathered (``ep_group_elements``)."""
    roots = rank_groups(model, 0, first, last, tp)
    block = sum(numel(tp_local(n, s, tp)) for n, s in block_tensors(model))
    if ep > 1:
        block = ep_group_elements(model, 1, False, False, dp, ep)[0]
    embed = sum(numel(s) for n, s, _ in roots if n.startswith(INPUT_MODULES))
    head = sum(numel(s) for n, s, _ in roots if not n.startswith(INPUT_MODULES))
    return max(block if blocks else 0, embed, head), embed if first else block


def rank_phases(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                acts: Activations, ov: Overheads, tp: int = 1,
                ckpt: Checkpointing = Checkpointing.NONE) -> dict[Phase, Breakdown]:
    """The moments of one step on pipeline rank ``rank`` (of ``dp`` data-parallel ranks, each
    stage tensor-parallel over ``tp``; ``acts`` counted for that tp and checkpointing)."""
    p = training.pipeline
    if p.schedule in pipeline.SPLIT_BACKWARD:
        return split_rank_phases(model, training, rank, dp, acts, ov)
    return _rank(model, training, rank, dp, acts, ov, tp, ckpt)[1]()


@functools.lru_cache(maxsize=4096)
def kept_output(model: ModelSpec, training: TrainingSpec, s: int, c: int, tp: int) -> int:
    """Bytes of stage ``s``'s output that each micro-batch leaves to the end of the step
    (``Pipeline.kept_outputs``): ``PipelineStage.forward_one_chunk`` appends the output to
    ``output_chunks``, which the schedule merges for the caller on the last stage and the
    next step's ``clear_runtime_states`` empties. Before pytorch PR #153383 (2025-05) every
    stage appended (a block output: t x h / tp x c); since, only the last stage and only
    with ``return_outputs`` (its logits: t x V / tp x c, vocab-sharded under loss_parallel),
    which torchtitan now passes False. The same tensor as the output ``stage_sizes`` counts
    until the micro-batch's backward, which no longer frees it."""
    kept = training.pipeline.kept_outputs
    last = s == training.pipeline.n_stages - 1
    if kept is PipeKeptOutputs.NONE or (kept is PipeKeptOutputs.LAST and not last):
        return 0
    t = training.micro_batch * training.local_seq
    return t * (model.vocab if last else model.hidden) // tp * c


def most_in_flight(p: Any, rank: int) -> dict[int, int]:
    """The most micro-batches each of the rank's stages holds at once (``rank_ops``). GPipe
    and 1F1B hold one stage per rank: its most is the rank's (``pipeline.peak_in_flight``:
    M, or min(M, pp - rank) forwards before 1F1B's first backward), without the walk."""
    if p.schedule in (PipeSchedule.GPIPE, PipeSchedule.ONE_F_ONE_B) and p.microbatches > 0:
        return {pipeline.rank_stages(p, rank)[0]: pipeline.peak_in_flight(p, rank)}
    held: dict[int, int] = {}
    most: dict[int, int] = {}
    for kind, s in pipeline.rank_ops(p, rank):
        held[s] = held.get(s, 0) + (1 if kind == "F" else -1)
        most[s] = max(most.get(s, 0), held[s])
    return most


@dataclass(frozen=True, slots=True)
class KindStates:
    """What a pipeline rank holds whatever its activations, alike for every rank whose stages
    are alike (blocks, first, last of each: most ranks of a deep pipeline). Per stage of the
    rank, in its order (``RankStates.stages``)."""

    last: bool
    """It holds the last stage (the norm and head)."""
    base: Breakdown
    """Sharded parameters, optimizer state, the cuBLAS workspace."""
    parts: tuple[tuple[Any, Any, Any], ...]
    """(gathered, grads, sharded_grads) of each stage's ``StageBytes``."""
    rs_units: tuple[int, ...]
    """Each stage's largest FSDP unit's elements (the reduce-scatter input at its
    reduction)."""
    p2p: Any
    """The P2P receive buffers of every micro-batch."""
    optimizer: Breakdown
    """The optimizer step's moment."""
    fixed: Any
    """What every moment of ``Ranks.bound`` counts whatever the activations: base, P2P
    buffers, and per stage its gathered parameters and the larger of its unsharded and
    sharded gradients."""
    optimizer_total: Any
    """``optimizer.total``."""


class RankStates:
    """One rank's stages, the most micro-batches each holds at once (``most_in_flight``;
    zeros under the split-backward schedules, which ``Ranks`` does not walk) and what the
    rank holds whatever its activations (a plain class: one per rank of every layout)."""

    __slots__ = ("stages", "flight", "kind")

    def __init__(self, stages: tuple[int, ...], flight: tuple[int, ...],
                 kind: KindStates) -> None:
        self.stages, self.flight, self.kind = stages, flight, kind


@functools.lru_cache(maxsize=256)
def rank_states(model: ModelSpec, training: TrainingSpec, dp: int, ov: Overheads, tp: int
                ) -> tuple[RankStates, ...]:
    """``RankStates`` of every rank of the pipeline (index = rank). Cached: the checkpointing
    modes of one layout share them (the key is hashed once per pipeline plan). Ranks whose
    stages are alike share one ``KindStates``, and everything of it but the P2P buffers (seq
    / cp long) is shared with the layouts that differ from this one in CP alone
    (``_kind_parts``)."""
    p = training.pipeline
    n_stages = p.n_stages
    layers = pipeline.stage_layers(model.n_layers, n_stages)
    fd = training.fsdp_dtypes
    d = dtypes(Strategy.FULL_SHARD, training.precision, fd)
    no_cp = training if training.cp == 1 else dataclasses.replace(training, cp=1)
    # a received activation / its gradient: seq / cp positions under context parallel,
    # / tp under sequence parallel
    boundary = training.micro_batch * training.local_seq * model.hidden // tp * d.compute
    split = p.schedule in pipeline.SPLIT_BACKWARD
    alike: dict[tuple, KindStates] = {}
    out = []
    for r in range(p.degree):
        stages = pipeline.rank_stages(p, r)
        kind = tuple((layers[s], s == 0, s == n_stages - 1) for s in stages)
        if kind not in alike:
            base, parts, rs_units, grads, temps = _kind_parts(model, no_cp, kind, dp, ov, tp)
            p2p = sum(p.microbatches * boundary * ((not first) + (not last))
                      for _, first, last in kind)
            optimizer = base.plus(gradients=grads, comm_buffers=p2p,
                                  optimizer_temporaries=temps)
            alike[kind] = KindStates(
                last=any(last for _, _, last in kind), base=base, parts=parts,
                rs_units=rs_units, p2p=p2p, optimizer=optimizer,
                fixed=base.total + p2p + sum(g + max(gr, sh) for g, gr, sh in parts),
                optimizer_total=optimizer.total)
        most = {} if split else most_in_flight(p, r)
        out.append(RankStates(stages, tuple(most.get(s, 0) for s in stages), alike[kind]))
    return tuple(out)


def clear_caches() -> None:
    """Forget the rank states kept between plans (``rank_states``, ``_kind_parts``): a
    benchmark times a search as a fresh process runs it."""
    rank_states.cache_clear()
    _kind_parts.cache_clear()


@functools.lru_cache(maxsize=1024)
def _kind_parts(model: ModelSpec, training: TrainingSpec, kind: tuple[tuple[int, bool, bool],
                                                                       ...],
                dp: int, ov: Overheads, tp: int) -> tuple[Breakdown, tuple, tuple, Any, Any]:
    """(base, parts, rs_units, the optimizer step's gradients and temporaries) of
    ``KindStates`` for a rank whose stages are ``kind`` ((blocks, first, last) each);
    ``training`` without CP (nothing here depends on the sequence)."""
    blocks = sum(b for b, _, _ in kind)
    first, last = any(f for _, f, _ in kind), any(x for _, _, x in kind)
    groups = rank_groups(model, blocks, first, last, tp)
    fd = training.fsdp_dtypes
    d = dtypes(Strategy.FULL_SHARD, training.precision, fd)
    ep = training.ep
    _, local = group_elements(model, blocks, first, last, tp, dp)  # dim-0 shards
    # expert parallel (ep_group_elements): each rank's padded expert shards, their
    # optimizer state alike (states.resident's padding)
    pad = ep_group_elements(model, blocks, first, last, dp, ep)[2] - local if ep > 1 else 0
    local += pad
    base = Breakdown(params=local * d.param,
                     optimizer_states=optimizer_state_bytes(model, training.optimizer, d.state,
                                                            dp, groups)
                     + optimizer_state_bytes(model, training.optimizer, d.state, 1,
                                             (("pad", (1,), pad),)),
                     cublas_workspace=ov.cublas_workspace_bytes)
    whole = whole_table(model, first, tp)

    def part(b: int, is_first: bool, is_last: bool) -> tuple[Any, Any, Any]:
        if ep > 1:
            el, grad_el, shard = ep_group_elements(model, b, is_first, is_last, dp, ep)
            return el * fd.param, grad_el * fd.reduce, shard * d.grad
        el, shard = group_elements(model, b, is_first, is_last, tp, dp)
        # the first stage's embedding gradient is the whole table under TP (whole_table)
        return el * fd.param, (el + (whole if is_first else 0)) * fd.reduce, shard * d.grad

    temps = optimizer_temp_bytes(max(numel(s) for _, s, _ in groups), local, training,
                                 d.state, False, dp)
    return (base, tuple(part(*k) for k in kind),
            tuple(units(model, f, x, b, tp, ep, dp)[0] for b, f, x in kind), local * d.grad,
            temps)


class Ranks:
    """The ranks of one pipeline plan (one checkpointing mode) under a single- or
    looped-stage schedule: each rank's upper bound (``bound``) and moments (``phases``)."""

    def __init__(self, model: ModelSpec, training: TrainingSpec, dp: int, acts: Activations,
                 ov: Overheads, tp: int, ckpt: Checkpointing) -> None:
        self.acts = acts
        self.p = p = training.pipeline
        self.n_stages = p.n_stages
        self.states = rank_states(model, training, dp, ov, tp)
        self.fd = fd = training.fsdp_dtypes
        layers = pipeline.stage_layers(model.n_layers, p.n_stages)
        compute = dtypes(Strategy.FULL_SHARD, training.precision, fd).compute
        # one micro-batch's bytes on every stage of the pipeline (stage_sizes)
        self.size = stage_sizes(model, training, layers, tuple(range(p.n_stages)), acts,
                                compute, tp, ckpt)
        # the stage outputs each micro-batch leaves to the step's end (kept_output)
        self.kept = tuple(kept_output(model, training, s, compute, tp)
                          for s in range(p.n_stages))
        # the latest forward's stage output, held past its backward by GPipe's and 1F1B's
        # loop (StageBytes.last_output), less what ``kept`` already holds of it
        t = training.micro_batch * training.local_seq
        single = p.schedule in (PipeSchedule.GPIPE, PipeSchedule.ONE_F_ONE_B)
        self.last_output = tuple(
            single * (t * (model.vocab if s == p.n_stages - 1 else model.hidden) // tp
                      * compute - self.kept[s]) for s in range(p.n_stages))
        # a micro-batch's input gradient held by the send ops (StageBytes.input_grad)
        self.input_grad = tuple(single * (s > 0) * (t * model.hidden // tp * compute)
                                for s in range(p.n_stages))
        self.embed_unit = units(model, True, False, 0, tp)[0]
        self.whole = whole_table(model, True, tp)
        block_unit = units(model, False, False, 1, tp, training.ep, dp)[0]
        # the last unit's new gradient at a backward's end: the embedding (whole under TP)
        # on the first stage, else a block
        self.end_first = (self.embed_unit + self.whole) * fd.param
        self.end_other = block_unit * fd.param
        # expert parallel (docs/model.md §8.8 "Beside pipeline parallel"), traced: a block's
        # backward peaks in its MoE's, after the local experts' down projection's weight
        # gradient (param dtype, E / ep x h x f: autograd's, before the block's
        # post-backward adds it into the accumulated ones) and, on the last stage, after the
        # loss's, the head's and the final norm's backward freed what they saved (as
        # moments._last_block); without EP the pipeline's block moment stays as it was
        ep = training.ep
        self.ep_grad = (model.n_experts // ep * model.hidden * model.ffn_hidden * fd.param
                        if ep > 1 else 0)
        self.head_saved = acts.root - acts.root_before if ep > 1 else 0
        # ``bound``'s extras after a forward (with the loss's or a ring's transients) and at a
        # backward's start, on a rank without and with the last stage
        self.anywhere = tuple(max(0, acts.loss_fwd if last else 0,
                                  acts.loss_bwd if last else 0, acts.ring_fwd,
                                  acts.block_bwd + acts.recompute + self.ep_grad)
                              for last in (False, True))

    def end_extra(self, s: int) -> Any:
        return self.end_first if s == 0 else self.end_other

    def stage_bytes(self, st: RankStates) -> dict[int, StageBytes]:
        return {s: StageBytes(self.size[s], *part, kept=self.kept[s],
                              last_output=self.last_output[s],
                              input_grad=self.input_grad[s])
                for s, part in zip(st.stages, st.kind.parts)}

    def kept_all(self, st: RankStates) -> Any:
        """Every micro-batch's kept stage outputs of the rank's stages, alive from their
        backward until the next step clears them."""
        return sum(self.p.microbatches * self.kept[s] for s in st.stages)

    def end_moments(self, st: RankStates) -> tuple[Breakdown, list[Breakdown]]:
        """(the optimizer step, the schedule's merge of the kept outputs) when the rank keeps
        stage outputs: the optimizer step holds them too; on the last stage, after every
        backward and reduction, ``_merge_outputs`` concatenates them (``merge_chunks``:
        ``torch.cat``) beside the chunks themselves."""
        kind, kept_all = st.kind, self.kept_all(st)
        if not kept_all:
            return kind.optimizer, []
        merge = []
        last = self.n_stages - 1
        if last in st.stages and self.kept[last]:
            merge = [kind.base.plus(gradients=kind.optimizer.gradients, comm_buffers=kind.p2p,
                                    activations=kept_all,
                                    transients=self.p.microbatches * self.kept[last])]
        return kind.optimizer.plus(activations=kept_all), merge

    def bound(self, rank: int) -> Any:
        """An upper bound of the rank's peak without walking its ops. Every moment of
        ``phases`` is ``at`` a point of the walk plus the extras of its kind. At any point
        each stage holds at most its gathered parameters, the larger of its unsharded and
        sharded gradients, and its most micro-batches in flight (``most_in_flight``); at the
        end of a backward on stage s, one fewer of s's; at s's reduction, none of s's (all M
        are through their backward). Kept stage outputs: at most all M of each stage (the
        one whose backward just ended among them). The optimizer step and the merge of the
        kept outputs are exact. None for arrays (every rank is walked)."""
        st, size, reduce = self.states[rank], self.size, self.fd.reduce
        kind = st.kind
        held_most, extra = self.kept_all(st), self.anywhere[kind.last]
        for s, most, rs in zip(st.stages, st.flight, kind.rs_units):
            kept = max(0, size[s])
            flight = kept * most
            # the schedule's locals (StageBytes.input_grad, last_output): an input gradient
            # is held beside the most micro-batches in flight only where 1F1B reaches them
            # again after a backward (M > its warm-up); elsewhere the moments that hold it
            # hold a micro-batch fewer, which is no smaller (an input gradient is a stage
            # output's size). Two after a backward, one at the reduction, and the latest
            # forward's output past its backward. Kept tight: an upper bound above the
            # walked peaks makes ``fullest_rank`` walk more ranks.
            ig = self.input_grad[s]
            ig_held = ig if (self.p.schedule is PipeSchedule.ONE_F_ONE_B
                             and most < self.p.microbatches) else 0
            held_most += flight + ig_held
            out = self.last_output[s] + ig - ig_held
            extra = max(extra, self.end_extra(s) - kept + out + ig,  # at a backward's end
                        # at s's reduction
                        max(rs, (s == 0 and self.whole and self.embed_unit)) * reduce - flight
                        + out)
        top = kind.fixed + held_most + extra
        if not isinstance(top, (int, float)):
            return None
        optimizer, merge = self.end_moments(st)
        return max(top, optimizer.total, *(m.total for m in merge))

    def timeline(self, rank: int) -> list[tuple[str, int, int, Breakdown]]:
        """(``F`` or ``B``, stage, micro-batch, what the rank holds after it) for each of the
        rank's ops in order (``walk``'s moments, without the transients of ``phases``): the
        referee compares it with the traced step's actions (after a forward of the last
        stage: with its loss; a backward's end before the stage's reduction)."""
        st = self.states[rank]
        kind = st.kind
        seen: dict[tuple[str, int], int] = {}
        out = []
        for op, m in walk(self.p, rank, self.stage_bytes(st)).actions:
            mb = seen.get((op, m.stage), 0)
            seen[(op, m.stage)] = mb + 1
            out.append((op, m.stage, mb, kind.base.plus(
                gathered_params=m.gathered, activations=m.activations, gradients=m.gradients,
                comm_buffers=kind.p2p)))
        return out

    def phases_and_free(self, rank: int) -> tuple[dict[Phase, Breakdown], dict[Phase, Any]]:
        """(the moments of the rank's step, walked along its ops (``walk``), each moment's
        ``rs_free``: the previous step's sharded gradients of the stages not yet reduced)."""
        st, acts, fd, n_stages = self.states[rank], self.acts, self.fd, self.n_stages
        kind = st.kind
        base, p2p, last = kind.base, kind.p2p, kind.last
        rs_units = dict(zip(st.stages, kind.rs_units))
        embed_unit = self.embed_unit

        start = base.as_dict()

        def at(m: Moment, **more: Any) -> Breakdown:
            """``base.plus(gathered_params=m.gathered, activations=m.activations,
            gradients=m.gradients, comm_buffers=p2p).plus(**more)``, built once."""
            v = dict(start)
            v["gathered_params"] = v["gathered_params"] + m.gathered
            v["activations"] = v["activations"] + m.activations
            v["gradients"] = v["gradients"] + m.gradients
            v["comm_buffers"] = v["comm_buffers"] + p2p
            for k, x in more.items():
                v[k] = v[k] + x
            return Breakdown(**v)

        def most(items: list[tuple[Moment, dict[str, Any]]]) -> tuple[Breakdown, Any]:
            """(``largest([at(m, **more) for m, more in items])[1]``, that moment's
            ``rs_free``), choosing by the moments' totals before building one breakdown (base
            and P2P buffers are common to all; the first on ties, as ``largest``); arrays take
            ``largest`` itself."""
            keys = [m.gathered + m.activations + m.gradients + sum(more.values())
                    for m, more in items]
            if not all(isinstance(k, (int, float)) for k in keys):
                i, b = largest([at(m, **more) for m, more in items])
                return b, vec.choose(i, [m.rs_free for m, _ in items])
            i = keys.index(max(keys))
            return at(items[i][0], **items[i][1]), items[i][0].rs_free

        def reduce_moments(m: Moment) -> list[Breakdown]:
            # the stage's gradient reduction: each unit's post_backward reshards, then
            # allocates its reduce-scatter input (``foreach_reduce``) while the stage's
            # unsharded gradients still exist; under TP the embedding's unit first copies its
            # rows out of its whole gradient (``unsharded_accumulated_grad_data``) and then
            # drops the whole one (``FSDPParamGroup.post_backward``:
            # ``unsharded_accumulated_grad = None``)
            s = m.stage
            whole_s = self.whole if s == 0 else 0
            return [at(m, gradients=-whole_s * fd.reduce,
                       comm_buffers=rs_units[s] * fd.reduce),
                    at(m, transients=(whole_s and embed_unit) * fd.reduce)]

        w = walk(self.p, rank, self.stage_bytes(st), records_only=True, last=n_stages - 1,
                 end_extra=self.end_extra)
        optimizer, merge = self.end_moments(st)
        held, held_free = most([(m, {}) for m in w.after_forward])
        # the loss runs right after a forward of the last stage
        on_last = [(m, {}) for m in w.after_forward if m.stage == n_stages - 1]
        loss, loss_free = most(on_last) if on_last else (held, held_free)
        i_fwd, forward = largest([held, loss.plus(transients=acts.loss_fwd if last else 0),
                                  held.plus(transients=acts.ring_fwd)])
        block_bwd, block_free = most(
            # a backward starting with what the rank holds then
            # (under EP: the experts' new gradient, and on the last stage what the head saved
            # gone: see __init__)
            [(m, {"transients": acts.block_bwd + acts.recompute + self.ep_grad,
                  "activations": -self.head_saved if m.stage == n_stages - 1 else 0})
             for m in w.backward_start]
            # the end of a backward: that micro-batch's activations are gone, its stage's
            # unsharded gradients exist (fp32 under -amp), and the stage's last unit's new
            # gradient in the param dtype is being converted or added into them (FSDP2
            # ``to_accumulated_grad_if_needed`` / ``accumulate_unsharded_grad_if_needed``)
            + [(m, {"transients": self.end_extra(m.stage)}) for m in w.backward_end])
        # a reduction's moment is before its reduce-scatter output exists: that stage's
        # cached block is still free; after the last reduction (the merge) none is
        ends = [(b, m.rs_free) for m in w.reduce for b in reduce_moments(m)] \
            + [(b, 0) for b in merge]
        i_end, bwd_end = largest([b for b, _ in ends])
        phases = {
            Phase.INIT: Breakdown(params=base.params),
            # context parallel: a block's ring attention in forward, its buffers on top of the
            # most the rank holds (a bound: that micro-batch's stage counted whole); one
            # micro-batch's ring runs at a time, the others hold only their saved set
            Phase.FORWARD: forward,
            Phase.LOSS_BWD: loss.plus(transients=acts.loss_bwd if last else 0),
            Phase.BLOCK_BWD: block_bwd,
            Phase.BWD_END: bwd_end,
            Phase.OPTIMIZER: optimizer,
        }
        free = {
            Phase.INIT: 0,
            Phase.FORWARD: vec.choose(i_fwd, [held_free, loss_free, held_free]),
            Phase.LOSS_BWD: loss_free,
            Phase.BLOCK_BWD: block_free,
            Phase.BWD_END: vec.choose(i_end, [f for _, f in ends]),
            Phase.OPTIMIZER: 0,  # every stage reduced: its sharded gradients are in use
        }
        return phases, free

    def phases(self, rank: int) -> dict[Phase, Breakdown]:
        """The moments of the rank's step, walked along its ops (``walk``)."""
        return self.phases_and_free(rank)[0]


def rank_timeline(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                  acts: Activations, ov: Overheads, ckpt: Checkpointing = Checkpointing.NONE
                  ) -> list[tuple[str, int, int, Breakdown]]:
    """What rank ``rank`` holds after each forward and backward of a single- or looped-stage
    schedule (``Ranks.timeline``), no TP."""
    return Ranks(model, training, dp, acts, ov, 1, ckpt).timeline(rank)


def _rank(model: ModelSpec, training: TrainingSpec, rank: int, dp: int, acts: Activations,
          ov: Overheads, tp: int, ckpt: Checkpointing) -> tuple[Callable[[], Any],
                                                             Callable[[], dict]]:
    """(an upper bound of the rank's peak without walking its ops, its moments) of a
    single- or looped-stage schedule (``rank_phases``; ``Ranks``)."""
    ranks = Ranks(model, training, dp, acts, ov, tp, ckpt)
    return functools.partial(ranks.bound, rank), functools.partial(ranks.phases, rank)


def fullest_rank(model: ModelSpec, training: TrainingSpec, dp: int, acts: Activations,
                 ov: Overheads, tp: int = 1, ckpt: Checkpointing = Checkpointing.NONE
                 ) -> tuple[int, dict[Phase, Breakdown]]:
    """(rank, its moments) of the pipeline rank with the largest peak (``fullest_rank_free``)."""
    rank, phases, _ = fullest_rank_free(model, training, dp, acts, ov, tp, ckpt)
    return rank, phases


def fullest_rank_free(model: ModelSpec, training: TrainingSpec, dp: int, acts: Activations,
                      ov: Overheads, tp: int = 1, ckpt: Checkpointing = Checkpointing.NONE
                      ) -> tuple[int, dict[Phase, Breakdown], dict[Phase, Any] | None]:
    """(rank, its moments, each moment's ``Moment.rs_free``; None under the split-backward
    schedules, not derived there) of the pipeline rank with the largest peak (the lowest rank
    on ties). The ranks are walked in the order of an upper bound of their peaks
    (``Ranks.bound``), and a rank whose bound cannot beat the fullest one walked so far is
    not walked: the same answer as walking them all (tests/test_pipeline.py), in a few walks
    instead of pp."""
    p = training.pipeline
    ranks = list(range(p.degree))
    if p.schedule in pipeline.SPLIT_BACKWARD:
        bounds: dict[int, Any] = dict.fromkeys(ranks)
        split = functools.partial(rank_phases, model, training, dp=dp, acts=acts, ov=ov,
                                  tp=tp, ckpt=ckpt)

        def walked(rank: int) -> tuple[dict[Phase, Breakdown], None]:
            return split(rank=rank), None
    else:
        every = Ranks(model, training, dp, acts, ov, tp, ckpt)
        bounds = {r: every.bound(r) for r in ranks}
        walked = every.phases_and_free
    if any(b is None for b in bounds.values()):
        order, bounds = ranks, dict.fromkeys(ranks)
    else:
        order = sorted(ranks, key=lambda r: (-bounds[r], r))
    best: tuple[Any, int, dict[Phase, Breakdown], Any] | None = None
    for rank in order:
        b = bounds[rank]
        if best is not None and b is not None and (b < best[0]
                                                   or (b == best[0] and rank > best[1])):
            continue
        phases, free = walked(rank)
        peak = largest([phases[ph] for ph in PHASES])[1].total
        if best is None or peak > best[0] or (peak == best[0] and rank < best[1]):
            best = (peak, rank, phases, free)
    assert best is not None
    return best[1], best[2], best[3]


# ---- the split-backward schedules (ZBV, DualPipeV, Interleaved Zero Bubble) -------------

def weight_op_width(names_shapes: Any) -> int:
    """Output features of the ops that multiply by a weight, summed: a linear's out
    features, a norm's hidden size (its bias, if any, belongs to the same op)."""
    return sum(shape[0] for name, shape in names_shapes if name.endswith(".weight"))


def split_sizes(model: ModelSpec, training: TrainingSpec, layers: list[int],
                stages: tuple[int, ...], acts: Activations, c: int, size: dict[int, Any]
                ) -> dict[int, Any]:
    """Bytes one micro-batch holds on each stage between its input backward (I) and its
    weight backward (W) (torch 2.13 ``_backward.stage_backward_input``):

    - the graph is kept (``retain_graph=True``) from each weight-consuming op down: every
      saved tensor of the stage stays;
    - the gradient reaching each such op's output is kept for W (the ``intermediate
      .register_prehook`` hooks fill ``param_group["grads"]``): ``t x c`` per output
      feature of every linear and norm (``weight_op_width``), the head's ``t x V x c``
      (the logits' gradient) on the last stage;
    - what lies above the last such op is freed once the output is detached
      (``t.detach_()``): on the last stage the loss's saved log-softmax and the logits;
    - the first stage runs no I at all (``backward_one_chunk``: "Skip the backward for the
      first stage"; its W is a full backward): it holds what its forward left.
    """
    t = training.micro_batch * training.seq
    last = len(layers) - 1
    head = [(n, s) for n, s in root_tensors(model) if not n.startswith(INPUT_MODULES)]
    block = weight_op_width(block_tensors(model))
    out = {}
    for s in stages:
        if s == 0:
            out[s] = size[s]
            continue
        kept = t * c * (layers[s] * block + (weight_op_width(head) if s == last else 0))
        freed = t * model.vocab * c + acts.loss_out if s == last else 0
        out[s] = size[s] + kept - freed
    return out


def _stage_groups(model: ModelSpec, layers: list[int], s: int
                  ) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, how many) of stage ``s``'s parameters (its blocks, the embedding on the
    first, the norm and head on the last)."""
    return rank_groups(model, layers[s], s == 0, s == len(layers) - 1)


def split_rank_phases(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                      acts: Activations, ov: Overheads) -> dict[Phase, Breakdown]:
    """The moments of one step on rank ``rank`` under a split-backward schedule (ZBV,
    DualPipeV, Interleaved Zero Bubble: ``_split_walk``)."""
    return _split_walk(model, training, rank, dp, acts, ov)[0]


def split_timeline(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                   acts: Activations, ov: Overheads) -> list[tuple[pipeline.Op, Breakdown]]:
    """What rank ``rank`` holds after each of its actions under a split-backward schedule
    (after a forward of the last stage: with its loss), as ``_split_walk`` counts it: the
    referee compares it with a trace action by action."""
    return _split_walk(model, training, rank, dp, acts, ov)[1]


def _split_walk(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                acts: Activations, ov: Overheads
                ) -> tuple[dict[Phase, Breakdown], list[tuple[pipeline.Op, Breakdown]]]:
    """The moments of one step on rank ``rank`` under a split-backward schedule, walked along
    the rank's action list (``pipeline.split_actions``; FSDP2 inside each stage, no TP), and
    what it holds after each action.

    Held per micro-batch: ``stage_sizes`` from its forward to its input backward,
    ``split_sizes`` from there to its weight backward; a full backward (B, and the first
    stage's W) frees it at once. The rank's two stages stay unsharded all step. Their
    gradients, as FSDP2 keeps them under pipelining (``set_requires_gradient_sync(False)``):

    - a full backward runs FSDP2's post-backward hooks: the stage's gradients accumulate in
      the reduce dtype (``to_accumulated_grad_if_needed``), the last unit's new one in the
      param dtype while it is converted;
    - a weight backward writes ``param.grad`` in the param dtype
      (``stage_backward_weight``: ``weight.grad = dw``) and runs no hook: it is folded into
      the reduce-dtype gradient by the stage's next input or full backward (whose hooks run),
      or by REDUCE_GRAD at the end of the step;
    - a stage's received input keeps its gradient as ``.grad`` until the next step
      (``stage_backward_input``: ``inp.grad = dinput``; ``clear_runtime_states``), but for
      the second stage of the pair on rank pp - 1, whose input gradient is handed to the
      first stage of the pair as its output gradient (``set_local_bwd_input``).

    P2P buffers as ``rank_phases`` counts them; the V's two adjacent stages on rank pp - 1
    pass tensors by reference (``set_local_fwd_input``: the lower stage's output becomes the
    upper one's input buffer), so that output is not counted twice."""
    p = training.pipeline
    n_stages, last = p.n_stages, p.n_stages - 1
    layers = pipeline.stage_layers(model.n_layers, n_stages)
    stages = pipeline.rank_stages(p, rank)
    fd = training.fsdp_dtypes
    d = dtypes(Strategy.FULL_SHARD, training.precision, fd)
    groups = rank_groups(model, sum(layers[s] for s in stages), 0 in stages, last in stages)
    local = sum(k * ceil_div(numel(s), dp) for _, s, k in groups)
    base = Breakdown(params=local * d.param,
                     optimizer_states=optimizer_state_bytes(model, training.optimizer, d.state,
                                                            dp, groups),
                     cublas_workspace=ov.cublas_workspace_bytes)
    t = training.micro_batch * training.seq
    boundary = t * model.hidden * d.compute
    size = stage_sizes(model, training, layers, stages, acts, d.compute)
    for s in stages:  # the V's pair: the lower stage's output is the upper one's buffer
        if s + 1 in stages:
            size[s] -= boundary
    held_i = split_sizes(model, training, layers, stages, acts, d.compute, size)
    p2p = sum(p.microbatches * boundary * ((s != 0) + (s != last)) for s in stages)
    groups_of = {s: _stage_groups(model, layers, s) for s in stages}
    stage_elems = {s: sum(k * numel(sh) for _, sh, k in groups_of[s]) for s in stages}
    rs_unit, last_unit = units(model, 0 in stages, last in stages,
                               sum(layers[s] for s in stages))
    same = fd.reduce == fd.param  # no conversion: param.grad accumulates in place
    acc: set[int] = set()  # stages with a reduce-dtype accumulated gradient
    new: set[int] = set()  # stages with a param-dtype param.grad not yet folded in
    reduced: set[int] = set()  # stages past their REDUCE_GRAD: sharded and resharded
    finished: Counter[int] = Counter()  # each stage's W and B actions so far
    held = 0
    input_grads = 0

    def moment(activations: Any, transients: Any = 0) -> Breakdown:
        grads = sum(stage_elems[s] * (fd.reduce * (s in acc) + fd.param * (s in new))
                    for s in stages if s not in reduced)
        shards = sum(k * ceil_div(numel(sh), dp) * d.grad for s in reduced
                     for _, sh, k in groups_of[s])
        gathered = sum(stage_elems[s] for s in stages if s not in reduced) * fd.param
        return base.plus(gathered_params=gathered, activations=activations,
                         gradients=grads + shards, comm_buffers=p2p + input_grads,
                         transients=transients)

    def reduce_grad(s: int) -> None:
        """REDUCE_GRAD right after the stage's M-th W or B (``_add_reduce_grad``): each unit's
        post-backward folds its param.grad in and allocates its reduce-scatter input
        (``foreach_reduce``); then the stage holds its gradient shard, and RESHARD frees its
        unsharded parameters before the next action (``_add_unshard_reshard``: a stage no
        later action uses is evicted)."""
        unit = units(model, s == 0, s == last, layers[s])[0]
        ends.append(moment(held, unit * fd.reduce - (unit * fd.param if s in new and not same
                                                     else 0)))
        reduced.add(s)

    def fold(s: int) -> None:
        """FSDP2's post-backward hooks of stage s ran: param.grad goes into the
        reduce-dtype gradient (in place when the dtypes are the same)."""
        if s in new and not same:
            new.discard(s)
            acc.add(s)

    fwd: list[Breakdown] = []
    loss: list[Breakdown] = []
    bwd: list[Breakdown] = []
    ends: list[Breakdown] = []
    after: list[tuple[pipeline.Op, Breakdown]] = []

    def _split_backward(op: pipeline.Op, full: bool, held: Any) -> Any:
        """The moments of one backward action (I, W or B); what is held after it."""
        nonlocal input_grads
        s = op.stage
        if op.kind in ("I", "B") and s == last:
            loss.append(moment(held, acts.loss_bwd))
        if op.kind == "B" or full:
            # a full backward frees each block's saved tensors as it goes: its start
            bwd.append(moment(held, acts.block_bwd + acts.recompute))
        if op.kind in ("I", "B") and s != 0 and s - 1 not in stages:
            input_grads += boundary
        if op.kind == "I":
            # an input backward frees nothing and keeps each op's output gradient; its
            # FSDP2 hooks fold the stage's param.grad in as it goes: its end, with the first
            # block's backward temporaries
            held += held_i[s] - size[s]
            fold(s)
            bwd.append(moment(held, acts.block_bwd + acts.recompute))
        elif op.kind == "W" and not full:
            # dW of one of the stage's units before it is added to param.grad
            bwd.append(moment(held, units(model, s == 0, s == last, layers[s])[0] * fd.param))
            held -= held_i[s]
            new.add(s)
        else:
            held -= held_i[s] if op.kind == "W" else size[s]
            new.add(s)
            fold(s)
            bwd.append(moment(held, last_unit * fd.param))
        return held

    for op in pipeline.split_actions(p, rank):
        s = op.stage
        full = op.kind == "B" or op.kind == "W" and s == 0
        if op.kind == "F":
            held += size[s]
            fwd.append(moment(held))
            if s == last:
                fwd.append(moment(held, acts.loss_fwd))
        elif op.kind == "I" and s == 0:
            pass  # torch skips the first stage's input backward
        else:
            held = _split_backward(op, full, held)
        after.append((op, moment(held)))
        finished[s] += op.kind in ("W", "B")
        if finished[s] == p.microbatches:
            reduce_grad(s)
    return {
        Phase.INIT: Breakdown(params=base.params),
        Phase.FORWARD: largest(fwd)[1],
        Phase.LOSS_BWD: largest(loss or fwd)[1],
        Phase.BLOCK_BWD: largest(bwd)[1],
        Phase.BWD_END: largest(ends)[1],
        Phase.OPTIMIZER: base.plus(gradients=local * d.grad, comm_buffers=p2p + input_grads,
                                   optimizer_temporaries=optimizer_temp_bytes(
                                       max(numel(s) for _, s, _ in groups), local, training,
                                       d.state, False, dp)),
    }, after
