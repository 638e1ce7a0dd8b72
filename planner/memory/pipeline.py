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

Every rank is evaluated; the fullest decides the fit. Scalars only (the report refuses
``--pp``).
"""

from __future__ import annotations

from typing import Any

from planner import pipeline
from planner.memory.breakdown import PHASES, Breakdown, Overheads, Phase, largest
from planner.memory.moments import Activations
from planner.memory.states import dtypes, optimizer_state_bytes
from planner.memory.zero import optimizer_temp_bytes
from planner.params import block_tensors, numel, root_tensors
from planner.spec import ModelSpec, Strategy, TrainingSpec
from planner.vec import ceil_div

INPUT_MODULES = ("embed.", "pos_embed.", "type_embed.", "embed_norm")
"""Root tensors torchtitan keeps on the first stage (``tok_embeddings``); the final norm and
the head go to the last (``norm``, ``output``)."""


def rank_groups(model: ModelSpec, blocks: int, first: bool, last: bool
                ) -> list[tuple[str, tuple[int, ...], int]]:
    """(name, shape, how many) of the parameters one rank holds."""
    out = [(n, s, blocks) for n, s in block_tensors(model)] if blocks else []
    for n, s in root_tensors(model):
        if n.startswith(INPUT_MODULES) and first or not n.startswith(INPUT_MODULES) and last:
            out.append((n, s, 1))
    return out


def stage_sizes(model: ModelSpec, training: TrainingSpec, layers: list[int],
                stages: tuple[int, ...], acts: Activations, c: int) -> dict[int, Any]:
    """Bytes one micro-batch holds on each stage of the rank: its blocks' saved tensors, its
    output (cached until its backward; the last stage's is the logits), what the root saves
    before the blocks on the first stage, and the final norm's, the head's and the loss's
    on the last."""
    t = training.micro_batch * training.seq
    last = len(layers) - 1
    return {s: layers[s] * acts.kept_per_block
            + t * (model.vocab if s == last else model.hidden) * c
            + (acts.root_before if s == 0 else 0)
            + (acts.root - acts.root_before if s == last else 0) for s in stages}


def held_bytes(training: TrainingSpec, rank: int, size: dict[int, Any], last: int
               ) -> tuple[Any, Any]:
    """(the most activation bytes the rank holds, the most while its last stage holds the
    micro-batch whose loss runs): the heaviest mix of held micro-batches
    (``pipeline.held_by_stage``)."""
    moments = pipeline.held_by_stage(training.pipeline, rank)
    most = max(sum(size[s] * k for s, k in held.items()) for held in moments)
    at_loss = max((sum(size[s] * k for s, k in held.items()) for held in moments
                   if held.get(last)), default=most)
    return most, at_loss


def units(model: ModelSpec, first: bool, last: bool, blocks: int) -> tuple[int, int]:
    """(the rank's largest FSDP unit, the unit its backward reaches last) in elements; units
    as torchtitan's ``apply_fsdp`` makes them: a block, the embedding, the norm + head. The
    last one reached is the embedding on the first stage, else a block."""
    roots = rank_groups(model, 0, first, last)
    block = sum(numel(s) for _, s in block_tensors(model))
    embed = sum(numel(s) for n, s, _ in roots if n.startswith(INPUT_MODULES))
    head = sum(numel(s) for n, s, _ in roots if not n.startswith(INPUT_MODULES))
    return max(block if blocks else 0, embed, head), embed if first else block


def rank_phases(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                acts: Activations, ov: Overheads) -> dict[Phase, Breakdown]:
    """The moments of one step on pipeline rank ``rank`` (of ``dp`` data-parallel ranks)."""
    p = training.pipeline
    n_stages = p.n_stages
    layers = pipeline.stage_layers(model.n_layers, n_stages)
    stages = pipeline.rank_stages(p, rank)
    first, last = 0 in stages, n_stages - 1 in stages
    blocks = sum(layers[s] for s in stages)
    groups = rank_groups(model, blocks, first, last)
    fd = training.fsdp_dtypes
    d = dtypes(Strategy.FULL_SHARD, training.precision, fd)
    elems = sum(k * numel(s) for _, s, k in groups)
    local = sum(k * ceil_div(numel(s), dp) for _, s, k in groups)  # dim-0 shards
    base = Breakdown(params=local * d.param,
                     optimizer_states=optimizer_state_bytes(model, training.optimizer, d.state,
                                                            dp, groups),
                     cublas_workspace=ov.cublas_workspace_bytes)
    gathered = elems * fd.param
    unsharded_grads = elems * fd.reduce
    size = stage_sizes(model, training, layers, stages, acts, d.compute)
    activations, at_loss = held_bytes(training, rank, size, n_stages - 1)
    boundary = training.micro_batch * training.seq * model.hidden * d.compute
    p2p = sum(p.microbatches * boundary * ((s != 0) + (s != n_stages - 1)) for s in stages)
    grads_at_peak = unsharded_grads if pipeline.steady(p, rank) else 0
    rs_unit, last_unit = units(model, first, last, blocks)
    held = base.plus(gathered_params=gathered, activations=activations,
                     gradients=grads_at_peak, comm_buffers=p2p)
    loss = held.plus(activations=at_loss - activations)
    return {
        Phase.INIT: Breakdown(params=base.params),
        Phase.FORWARD: largest([held, loss.plus(transients=acts.loss_fwd if last else 0)])[1],
        Phase.LOSS_BWD: loss.plus(transients=acts.loss_bwd if last else 0),
        Phase.BLOCK_BWD: largest([
            # a backward starting with the most micro-batches held (and, in a steady phase,
            # every unsharded gradient already there)
            held.plus(transients=acts.block_bwd + acts.recompute),
            # the end of the rank's first backward: that micro-batch's activations are gone,
            # every unit's unsharded gradient exists (fp32 under -amp), and the last unit's
            # new gradient in the param dtype is being converted into it (FSDP2
            # ``to_accumulated_grad_if_needed``)
            held.plus(activations=-max(size.values()),
                      gradients=unsharded_grads - grads_at_peak,
                      transients=last_unit * fd.param)])[1],
        # REDUCE_GRAD: each unit's post_backward reshards, then allocates its reduce-scatter
        # input (``foreach_reduce``) while every unsharded gradient still exists
        Phase.BWD_END: base.plus(gathered_params=gathered, gradients=unsharded_grads,
                                 comm_buffers=p2p + rs_unit * fd.reduce),
        Phase.OPTIMIZER: base.plus(gradients=local * d.grad, comm_buffers=p2p,
                                   optimizer_temporaries=optimizer_temp_bytes(
                                       max(numel(s) for _, s, _ in groups), local, training,
                                       d.state, False, dp)),
    }


def fullest_rank(model: ModelSpec, training: TrainingSpec, dp: int, acts: Activations,
                 ov: Overheads) -> tuple[int, dict[Phase, Breakdown]]:
    """(rank, its moments) of the pipeline rank with the largest peak."""
    best: tuple[Any, int, dict[Phase, Breakdown]] | None = None
    for rank in range(training.pipeline.degree):
        phases = rank_phases(model, training, rank, dp, acts, ov)
        peak = largest([phases[ph] for ph in PHASES])[1].total
        if best is None or peak > best[0]:
            best = (peak, rank, phases)
    assert best is not None
    return best[1], best[2]
