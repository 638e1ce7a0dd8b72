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


def rank_phases(model: ModelSpec, training: TrainingSpec, rank: int, dp: int,
                acts: Activations, ov: Overheads) -> dict[Phase, Breakdown]:
    """The moments of one step on pipeline rank ``rank`` (of ``dp`` data-parallel ranks)."""
    p = training.pipeline
    n_stages = p.n_stages
    layers = pipeline.stage_layers(model.n_layers, n_stages)
    stages = pipeline.rank_stages(p, rank)
    first, last = 0 in stages, n_stages - 1 in stages
    groups = rank_groups(model, sum(layers[s] for s in stages), first, last)
    fd = training.fsdp_dtypes
    d = dtypes(Strategy.FULL_SHARD, training.precision, fd)
    elems = sum(k * numel(s) for _, s, k in groups)
    local = sum(k * ceil_div(numel(s), dp) for _, s, k in groups)  # dim-0 shards
    t = training.micro_batch * training.seq
    c = d.compute
    base = Breakdown(params=local * d.param,
                     optimizer_states=optimizer_state_bytes(model, training.optimizer, d.state,
                                                            dp, groups),
                     cublas_workspace=ov.cublas_workspace_bytes)
    gathered = elems * fd.param
    unsharded_grads = elems * fd.reduce
    boundary = t * model.hidden * c  # one micro-batch's activation between two stages
    # one chunk: its blocks' saved tensors and its output, cached until its backward
    # one micro-batch of a stage: its blocks' saved tensors, its output (cached until its
    # backward; the last stage's is the logits), what the root saves before the blocks on
    # the first stage, and the final norm's, the head's and the loss's on the last
    size = {s: layers[s] * acts.kept_per_block
            + (boundary if s != n_stages - 1 else t * model.vocab * c)
            + (acts.root_before if s == 0 else 0)
            + (acts.root - acts.root_before if s == n_stages - 1 else 0) for s in stages}
    moments = pipeline.held_by_stage(p, rank)
    activations = max(sum(size[s] * k for s, k in held.items()) for held in moments)
    # at the loss: the last stage holds the micro-batch whose loss runs
    at_loss = max((sum(size[s] * k for s, k in held.items()) for held in moments
                   if held.get(n_stages - 1)), default=activations) if last else activations
    one_mb = max(size.values())
    p2p = sum(p.microbatches * boundary * ((s != 0) + (s != n_stages - 1)) for s in stages)
    grads_at_peak = unsharded_grads if pipeline.steady(p, rank) else 0
    # FSDP units (torchtitan ``apply_fsdp``): a block, the embedding, the norm + head
    roots = rank_groups(model, 0, first, last)
    blocks = sum(layers[s] for s in stages)
    rs_unit = max([sum(numel(s) for _, s in block_tensors(model)) if blocks else 0]
                  + [sum(numel(s) for n, s, _ in roots if n.startswith(INPUT_MODULES) is inp)
                     for inp in (True, False)])
    # the unit a backward reaches last: the embedding on the first stage, else a block
    last_unit = (sum(numel(s) for n, s, _ in roots if n.startswith(INPUT_MODULES)) if first
                 else sum(numel(s) for _, s in block_tensors(model)))
    loss_fwd = acts.loss_fwd if last else 0
    loss_bwd = acts.loss_bwd if last else 0
    held = base.plus(gathered_params=gathered, activations=activations,
                     gradients=grads_at_peak, comm_buffers=p2p)
    loss = held.plus(activations=at_loss - activations)
    return {
        Phase.INIT: Breakdown(params=base.params),
        Phase.FORWARD: largest([held, loss.plus(transients=loss_fwd)])[1],
        Phase.LOSS_BWD: loss.plus(transients=loss_bwd),
        Phase.BLOCK_BWD: largest([
            # a backward starting with the most micro-batches held (and, in a steady phase,
            # every unsharded gradient already there)
            base.plus(gathered_params=gathered, activations=activations,
                      gradients=grads_at_peak, comm_buffers=p2p,
                      transients=acts.block_bwd + acts.recompute),
            # the end of the rank's first backward: that micro-batch's activations are gone,
            # every unit's unsharded gradient exists (fp32 under -amp), and the last unit's
            # new gradient in the param dtype is being converted into it (FSDP2
            # ``to_accumulated_grad_if_needed``): the embedding's, on the first stage
            base.plus(gathered_params=gathered, activations=activations - one_mb,
                      gradients=unsharded_grads, comm_buffers=p2p,
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
