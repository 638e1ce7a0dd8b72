"""The moments of one training step, one small function each (docs/model.md §3).

Every function takes the ``Step`` (what is resident, what the strategy keeps as working copies
and buffers, the activation totals) and returns the ``Breakdown`` of allocated bytes at that
moment. Numbers may be numpy arrays (planner/memory/vec.py); branches are on categorical
inputs only.
"""

from __future__ import annotations

from typing import Any

from planner.lazy_dataclass import dataclass
from planner.activations import ActivationPlan
from planner import vec
from planner.memory.breakdown import Breakdown, Phase, largest
from planner.memory.states import Resident
from planner.memory.working import Working


@dataclass(frozen=True, slots=True, kw_only=True)
class Activations:
    """The activation totals the moments read (from planner/activations.py)."""

    kept_per_block: Any
    """What one (trainable) block keeps for backward under the chosen checkpointing."""
    kept_blocks: Any
    """What all blocks keep (frozen first blocks keep less, or nothing)."""
    root: Any
    """Saved outside the blocks (embeddings, final norm, head input, the loss's output)."""
    loss_out: Any
    """The loss's saved log-softmax output (freed after the loss's backward)."""
    loss_fwd: Any
    loss_bwd: Any
    block_bwd: Any
    """Gradient temporaries inside one block's backward."""
    block_bwd_late: Any = None
    """Of those, what a block's late backward moments (FSDP2: its unsharded gradients all
    made, counted on their own) carry: ``block_bwd`` less the gradients the ring's moment
    counts (context parallel, ``ActivationPlan.ring_grads``); ``block_bwd`` without CP."""
    recompute: Any
    """One block's recomputed activations during its backward (checkpointing)."""
    residual_bytes: int
    kept_logits: Any = 0
    """Logits a loop holds from the loss to the end of the step (--keep-logits)."""
    loss_gap: Any = 0
    """Free bytes the loss's backward leaves inside reserved memory (ActivationPlan.loss_gap)."""
    root_before: Any = 0
    """Saved by the root before the first block (embedding norm and dropout mask, RoPE's
    tables): what the root holds while the blocks run forward."""
    host: Any = 0
    """Pinned host RAM of one rank for offloaded activations (--activation-offload)."""
    ring_fwd: Any = 0
    """Context parallel: the ring attention's forward peak above its inputs (0 without)."""
    ckpt_fwd: Any = 0
    """Full checkpointing: one block's forward inside its checkpoint (0 otherwise)."""
    gpu_per_block: Any = None
    """What one block holds on the GPU until its backward ends (``kept_per_block``; with
    activation offloading its tensors too small to offload)."""
    bwd_blocks: Any = None
    """What the blocks hold on the GPU when their backward starts (``kept_blocks``; with
    activation offloading their small tensors: the forward stash is gone by then)."""
    back: Any = 0
    """Activation offloading: the tensors brought back and alive at once in a block's
    backward (ActivationPlan.gpu_back; 0 without)."""

    first_block: Any = None
    """What the first block holds until its backward ends, where the blocks differ (an MoE
    model's dense first blocks: ActivationPlan.ends_kept); None: ``gpu_per_block``."""
    second_block: Any = None
    """... the second block (None: ``gpu_per_block``)."""
    last_block: Any = None
    """... the last block and the one before it (None: ``gpu_per_block``)."""

    def __post_init__(self) -> None:
        if self.gpu_per_block is None:
            object.__setattr__(self, "gpu_per_block", self.kept_per_block)
        for f in ("first_block", "second_block", "last_block"):
            if getattr(self, f) is None:
                object.__setattr__(self, f, self.gpu_per_block)
        if self.bwd_blocks is None:
            object.__setattr__(self, "bwd_blocks", self.kept_blocks)
        if self.block_bwd_late is None:
            object.__setattr__(self, "block_bwd_late", self.block_bwd)

    @classmethod
    def of(cls, plan: ActivationPlan) -> Activations:
        # context parallel: a block's backward transient is the larger of its MLP's and its
        # ring attention's (ActivationPlan.ring_backward; 0 without CP)
        return cls(kept_per_block=plan.block_kept, kept_blocks=plan.gpu_blocks_kept,
                   gpu_per_block=plan.gpu_block_kept, bwd_blocks=plan.gpu_blocks_bwd,
                   back=plan.gpu_back,
                   root=plan.gpu_root, root_before=plan.gpu_root_before,
                   host=plan.host_bytes,
                   loss_out=plan.root_saved[-1].nbytes,
                   loss_fwd=plan.loss_forward_transient, loss_bwd=plan.loss_backward_transient,
                   block_bwd=vec.maximum(plan.block_backward_transient, plan.ring_backward),
                   # late in the block's backward the ring has run: its buffers may still
                   # bound the moment, its weight gradients are the unit's (counted there)
                   block_bwd_late=vec.maximum(plan.block_backward_transient,
                                              plan.ring_backward - plan.ring_grads),
                   recompute=plan.recompute, ring_fwd=plan.ring_forward,
                   ckpt_fwd=plan.checkpointed_forward,
                   residual_bytes=plan.residual_bytes, kept_logits=plan.kept_logits,
                   loss_gap=plan.loss_gap,
                   **({} if plan.ends_kept is None or plan.offload else dict(zip(
                       ("first_block", "second_block", "last_block"), plan.ends_kept))))


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """Everything the moments need, per GPU."""

    n_layers: int
    block_params: int
    """Parameters of one block (P_block)."""
    root_params: int
    train_block_params: int
    """Trainable parameters of a trainable block (LoRA: its adapters)."""
    train_blocks: int
    """Blocks with trainable parameters."""
    train_root_params: int
    """Trainable parameters outside the blocks."""
    root_grad_elems: int = 0
    """The root's unsharded gradient elements on one GPU at its post-backward (under TP the
    head's is split, the embedding's is whole: see estimator.step_for)."""
    vocab_x_hidden: int
    tokens: Any
    """Tokens per micro-batch (micro-batch x seq)."""
    tokens_x_hidden: Any
    tied: bool
    fsdp: bool
    compute_bytes: int
    grad_bytes: int
    grad_shards: Any
    degree: Any
    """Shard degree (FSDP's shard group)."""
    offloaded: bool
    params_offloaded: bool
    accumulating: Any
    """More than one micro-batch per step: later micro-batches run on accumulated grads."""
    fsdp_version: int = 2
    """FSDP1 or FSDP2 (the FSDP strategies)."""
    block_grad_pad: Any = 0
    """FSDP2: elements one rank's sharded gradient of a block holds beyond an even split (the
    stacked MoE experts' dim-0 padding, states.expert_padding)."""
    dense_grad_delta: Any = 0
    """An MoE model's trainable dense first blocks: the elements of their sharded gradients
    on one rank minus as many typical blocks' (with their padding); 0 without."""
    allocator: Any = "default"
    """The CUDA allocator mode (planner.spec.Allocator)."""
    init: Any = "meta"
    """How the weights reach the GPU (planner.spec.InitMode)."""
    load_bytes: Any = 0
    """The whole model in the dtype it is loaded in."""
    unit_load_bytes: Any = 0
    """One block in that dtype (moved or broadcast unsharded while loading)."""
    unsynced_root: Any = 0
    """Of ``unsynced_grads``, the root's."""
    unsynced_block: Any = 0
    """Of ``unsynced_grads``, one trainable block's."""
    two_micro_batches: bool = False
    """The only micro-batch before the last is the first (grad_accum 2): its root has no
    accumulated gradient yet when its own arrives."""
    unsynced_grads: Any = 0
    """FSDP with gradient sync on the last micro-batch only: the unsharded gradients every
    unit accumulates until the last reduce-scatter (0 when gradients sync every time)."""
    whole_graph: bool = False
    """``--compile model`` without FSDP / ZeRO: the backward is one compiled graph (or one per
    DDP bucket) whose new gradients are accumulated after it returns
    (planner/memory/compiled_model.py)."""
    graph_grads: Any = 0
    """Of those, the new gradients one graph returns at once."""
    graph_table: Any = 0
    """What the embeddings' compiled backward holds beyond the gradients."""
    in_backward: bool = False
    """``--optimizer-in-backward``: each parameter is stepped in its post-accumulate-grad
    hook and its gradient freed (torchtune ``register_optim_in_bwd_hooks``); no gradient
    set is held and no step runs after backward."""
    in_flight: Any = 0
    """Optimizer in backward: inside a block's backward, the gradients not yet stepped (the
    largest tensor's; a compiled block's whole backward graph returns all of its own at
    once) and the step temporaries of its largest tensor."""
    head_bwd: Any = 0
    """The head's backward beyond the activations less the loss's saved output: its weight
    gradients (a chunked loss sums one per chunk) and the logits' gradients beside them, or
    under autocast its cast's fp32 copy (estimator.head_backward_bytes); 0: not modelled."""
    table_grad: Any = 0
    """Optimizer in backward: the embedding table's gradient (the tied head's waits in the
    autograd engine's input buffer until the embeddings' backward adds its own)."""
    table_step: Any = 0
    """Optimizer in backward: the step temporaries of the embedding table (and of an untied
    head)."""
    states: Resident
    work: Working
    acts: Activations
    cublas: int

    @property
    def base(self) -> Breakdown:
        """What every moment holds: resident params and optimizer state, cuBLAS's workspace."""
        return Breakdown(params=self.states.params,
                         optimizer_states=self.states.optimizer_states,
                         cublas_workspace=self.cublas)

    @property
    def accumulated(self) -> Any:
        """Gradients accumulated by earlier micro-batches (every GPU's own copy, its shard, or
        FSDP's unsharded gradients when they are not synced)."""
        held = self.unsynced_grads if self.unsynced_grads else self.states.gradients
        return vec.where(self.accumulating, held, 0)

    @property
    def activations_all(self) -> Any:
        return self.acts.kept_blocks + self.acts.root


def initialization(s: Step) -> Breakdown:
    """Loading, before the first step: the resident parameters, plus one unit moved or
    broadcast unsharded (rank 0 broadcast, or every rank's full host copy moved unit by unit
    as FSDP shards it), or the whole model when it is moved to the GPU before sharding
    (``model.to("cuda")``, --init full-gpu). No optimizer state exists yet."""
    if s.init == "full-gpu":
        return Breakdown(params=vec.maximum(s.load_bytes, s.states.params))
    unit = s.unit_load_bytes if s.init in ("rank0", "full") else 0
    # DeepSpeed: ZeRO-1/2 flatten the module (a second copy for a moment), zero.Init holds
    # one module whole (planner/memory/zero.py)
    return Breakdown(params=s.states.params, transients=unit + s.work.init_extra)


def forward(s: Step) -> Breakdown:
    """At the loss, end of forward: every activation and the logits being reduced. Under
    FSDP2 also the last block's all-gather, where two all-gather outputs and the unit being
    filled are alive (``Working.fwd_gather``; the larger of the two: at 64 ranks a padded
    Mixtral unit is 21 GiB). Under checkpointing, also inside the last blocks' checkpointed
    forward (``_checkpointed_block``)."""
    at_loss = s.base.plus(gathered_params=s.work.gathered_fwd, activations=s.activations_all,
                          gradients=s.accumulated, transients=s.acts.loss_fwd,
                          comm_buffers=s.work.buckets)
    # context parallel's ring in the last block (without CP never above the loss's moment,
    # which is listed first and wins ties)
    at_loss = largest([at_loss, _ring_forward(s), *_checkpointed_block(s)])[1]
    if not (s.fsdp and s.fsdp_version == 2):
        return at_loss
    # the last block's input (the residual stream) and what the blocks before it kept
    acts = (s.acts.kept_blocks - s.acts.gpu_per_block + s.acts.root_before
            + s.acts.residual_bytes * s.tokens_x_hidden)
    at_gather = s.base.plus(gathered_params=s.work.fwd_gather, activations=acts,
                            gradients=s.accumulated, comm_buffers=s.work.buckets)
    return largest([at_loss, at_gather])[1]


def _checkpointed_block(s: Step) -> list[Breakdown]:
    """Checkpointing: inside the last block's checkpointed forward, its own tensors
    (``ActivationPlan.checkpointed_forward``) on top of what every block keeps and the
    root's tensors from before the blocks, its unit gathered beside the all-gather output
    kept (``Working.gathered_in_block``); under EP also the block before it, one block's
    kept tensors fewer and the next unit's all-gather output more
    (``Working.fwd_prefetched``). A zero transient without checkpointing."""
    last = s.base.plus(gathered_params=vec.maximum(s.work.gathered_in_block,
                                                   s.work.gathered_fwd),
                       activations=s.acts.kept_blocks + s.acts.root_before,
                       gradients=s.accumulated, transients=s.acts.ckpt_fwd,
                       comm_buffers=s.work.buckets)
    if s.n_layers < 2:
        return [last]
    before = last.plus(gathered_params=s.work.fwd_prefetched,
                       activations=-s.acts.gpu_per_block)
    return [last, before]  # without a prefetch ``before`` is below ``last``


def _ring_forward(s: Step) -> Breakdown:
    """Context parallel: the last block's ring attention in forward, its buffers on top of
    what every block keeps (a bound: the last block's own saved set counted whole) and the
    root's tensors from before the blocks."""
    return s.base.plus(gathered_params=s.work.gathered_fwd,
                       activations=s.acts.kept_blocks + s.acts.root_before,
                       gradients=s.accumulated, transients=s.acts.ring_fwd,
                       comm_buffers=s.work.buckets)


def loss_backward(s: Step) -> Breakdown:
    """The loss's backward: the fp32 vocabulary gradients on top of all activations. With
    the optimizer in backward an untied head is stepped right after its own backward: its
    gradient and its step temporaries beside the head's input gradient; the loss's saved
    output and the logits' gradient are gone by then (the engine drops a node's inputs
    before the next node runs; traced). Then the head's own backward: the loss's saved output
    gone, the head weight's gradients (a chunked loss sums one per chunk) beside the logits'
    gradients (``head_bwd``)."""
    at_loss = s.base.plus(gathered_params=s.work.gathered_loss, activations=s.activations_all,
                          gradients=s.accumulated,
                          transients=s.acts.loss_bwd + s.acts.kept_logits,
                          comm_buffers=s.work.buckets)
    # 0 (not modelled) leaves at_loss the larger
    head_bwd = s.base.plus(gathered_params=s.work.gathered_loss,
                           activations=s.activations_all - s.acts.loss_out,
                           gradients=s.accumulated,
                           transients=s.head_bwd + s.acts.kept_logits,
                           comm_buffers=s.work.buckets)
    at_loss = largest([at_loss, head_bwd])[1]
    if not s.in_backward or s.tied or not s.work.root_grad_bwd:
        return at_loss
    head = s.base.plus(gathered_params=s.work.gathered_loss,
                       activations=s.activations_all - s.acts.loss_out,
                       gradients=s.work.root_grad_bwd,
                       transients=s.acts.residual_bytes * s.tokens_x_hidden + s.acts.kept_logits,
                       optimizer_temporaries=s.table_step, comm_buffers=s.work.buckets)
    return largest([at_loss, head])[1]


def _last_block(s: Step) -> Breakdown:
    """The last block's backward: the loss's tensors are gone (log_softmax output freed), and
    so are what the head and the final norm saved (their backward has run: only what the
    root saved before the blocks is left), the head's gradient exists, one block is being
    differentiated (and recomputed). Full-size accumulated grads already hold the head's;
    FSDP's unsharded root grad is separate."""
    if s.in_backward:
        # the tied head's gradient waits in the engine's input buffer for the embeddings'
        # (one AccumulateGrad node per leaf); an untied head was stepped and freed
        grads = s.table_grad if s.tied else 0
        return s.base.plus(gathered_params=s.work.gathered_bwd,
                           activations=s.acts.bwd_blocks + s.acts.back + s.acts.root_before,
                           gradients=grads, transients=s.acts.recompute + s.acts.kept_logits
                           + vec.maximum(s.acts.block_bwd - s.in_flight, 0),
                           optimizer_temporaries=s.in_flight)
    if s.fsdp:
        grads = s.accumulated + s.work.root_grad_bwd
    else:
        grads = vec.where(s.grad_shards > 1, s.accumulated + s.work.root_grad_bwd,
                          vec.maximum(s.accumulated, s.work.root_grad_bwd))
    return s.base.plus(gathered_params=s.work.gathered_bwd,
                       activations=s.acts.bwd_blocks + s.acts.back + s.acts.root_before,
                       gradients=grads, transients=s.acts.block_bwd + s.acts.recompute
                       + s.acts.kept_logits, comm_buffers=s.work.buckets + s.work.bwd_buffers)


def _block_grad(s: Step) -> Any:
    """One block's new gradient (or shard); accumulated grads already hold it."""
    if s.offloaded or s.in_backward:
        return 0  # optimizer in backward: stepped and freed (``in_flight``)
    return vec.where(s.accumulating, 0,
                     (vec.ceil_div(s.train_block_params, s.grad_shards) + s.block_grad_pad)
                     * s.grad_bytes)


def block_backward(s: Step) -> Breakdown:
    """The largest of the blocks' backward sub-moments.

    - the last block (``_last_block``);
    - the block before it: one block's activations are gone, its gradient exists (sharded
      under FSDP, whose reduce-scatter input stays alive until the next reduce-scatter), and
      its working copy is freed (SHARD_GRAD_OP / autocast cache);
    - the first block (the last one differentiated): every other block's gradient exists and
      its activations are gone; the peak is here when a block's gradient (shard) outweighs
      what it kept, e.g. full checkpointing on few ranks (traced: Llama-2-7B, 8 ranks, seq
      8192);
    - FSDP: a block's post-backward, where its unsharded gradients (param dtype) are alive
      while its reduce-scatter input is allocated and filled and its activations are gone
      (a 70B block is 1.6 GiB of bf16 gradients + 3.2 GiB of fp32 reduce input; traced); at
      the first block's post-backward its all-gather output is still allocated too.
    """
    last = _last_block(s)
    g = _block_grad(s)
    # what the first, the second and the last block keep (they differ where an MoE model has
    # dense first blocks; the block before the last keeps as the last)
    k_first, k_second, kept = s.acts.first_block, s.acts.second_block, s.acts.last_block
    prev = last.plus(activations=-kept, gradients=g, gathered_params=-s.work.freed_per_block,
                     comm_buffers=s.work.rs_unit)
    # the first block's unit and unsharded gradients (a dense first block's are smaller)
    unit_less, grads_less = s.work.first_less
    first = last.plus(activations=k_first - s.acts.bwd_blocks,
                      gradients=(vec.maximum(s.train_blocks, 1) - 1) * g,
                      gathered_params=s.work.gathered_bwd_first - s.work.gathered_bwd
                      - unit_less, comm_buffers=s.work.rs_unit)
    subs = [last, prev, first] if s.n_layers > 1 else [last]
    if s.fsdp and s.fsdp_version == 2:
        if s.unsynced_grads:
            # the blocks' reduce-scatters run in the last micro-batch only: a block reduced
            # there trades its accumulated unsharded gradient for a new sharded one (the
            # micro-batches before it, which reduce nothing, are ``last`` and its late moment)
            g = (0 if s.offloaded else
                 (vec.ceil_div(s.train_block_params, s.grad_shards) + s.block_grad_pad)
                 * s.grad_bytes) - s.unsynced_block
            prev = last.plus(activations=-kept, gradients=g, comm_buffers=s.work.rs_unit)
            first = last.plus(activations=k_first - s.acts.bwd_blocks,
                              gradients=(vec.maximum(s.train_blocks, 1) - 1) * g,
                              gathered_params=s.work.gathered_bwd_first - s.work.gathered_bwd
                              - unit_less, comm_buffers=s.work.rs_unit)
            subs = [last, prev, first] if s.n_layers > 1 else [last]
        if s.n_layers == 2:
            # the block before the last is the first: nothing is prefetched for it
            subs = [last, first]
        # FSDP2, traced block by block: late in a block's backward its own kept (and
        # recomputed) activations are freed and its unsharded gradients exist; at its
        # post-backward its unsharded parameters are freed before its reduce-scatter input
        # is allocated (``_fsdp_param_group.py`` ``post_backward``: ``reshard()``, then
        # ``foreach_reduce``, which first frees the previous reduce-scatter input)
        early = list(subs)
        if s.n_layers > 2:
            # the second block (the one before the first): every later block's gradient,
            # and the first block's all-gather output prefetched beside its own unit
            early.insert(2, first.plus(activations=k_second, gradients=-g,
                                       gathered_params=s.work.post_freed))
            subs = list(early)
        # each early sub-moment's own block: the last, the one before it, the second, the first
        own = {2: [kept, k_first], 3: [kept, kept, k_first]}.get(len(early), [kept, kept,
                                                                       k_second, k_first])
        if s.n_layers > 1:
            # the first block's copy-out (pre-backward): its all-gather output and its
            # unsharded parameters alive together, before its backward runs
            subs.append(first.plus(gathered_params=s.work.post_freed - unit_less,
                                   transients=s.acts.kept_logits - first.transients))
        # (the ring's weight gradients, context parallel, are among the unit's here:
        # ``Activations.block_bwd_late``)
        late = s.acts.block_bwd_late - s.acts.block_bwd
        # ... and its unit, unsharded gradients and reduce-scatter input: the first block's
        # (a dense first block's) for the last of them
        rs_first = s.work.rs_unit if s.work.rs_first is None else s.work.rs_first
        mine = [(0, 0, s.work.rs_unit)] * (len(early) - 1) + [(unit_less, grads_less, rs_first)]
        if len(early) == 1:
            mine = [(0, 0, s.work.rs_unit)]
        for b, k, (ul, gl, _) in zip(early, own, mine):
            subs.append(b.plus(activations=-k,
                               transients=s.work.grad_layout_copy - s.acts.recompute + late,
                               gradients=s.work.unsharded_block_grads - gl))
        for i in (0, -1):
            b, k, (ul, gl, rs) = early[i], own[i], mine[i]
            subs.append(b.plus(activations=-k,
                               transients=s.acts.kept_logits - b.transients,
                               gradients=s.work.unsharded_block_grads - gl,
                               gathered_params=-(s.work.post_freed - ul),
                               comm_buffers=s.work.buckets + rs - b.comm_buffers))
        return largest(subs)[1]
    if s.fsdp:
        for b, lingering in ((last, 0), (first, s.work.lingering_first)):
            subs.append(b.plus(activations=-s.acts.gpu_per_block,
                               transients=s.acts.kept_logits - b.transients,
                               gradients=s.work.unsharded_block_grads,
                               gathered_params=lingering,
                               comm_buffers=s.work.buckets + s.work.rs_unit - b.comm_buffers))
    return largest(subs)[1]


def backward_end(s: Step) -> Breakdown:
    """End of backward: the embeddings' backward (their input gradient arriving) and, under
    FSDP, the root's reduce-scatter after it.

    A tied table's backward makes a new table-sized gradient, then accumulates it into the
    head's out of place (``torch/csrc/autograd/functions/accumulate_grad.h``): the new
    gradient and the sum are alive together with the head's (traced). Under FSDP the root's
    unsharded gradients are alive through both sub-moments; during the embeddings' backward
    the last block's reduce-scatter input still is, at the root's reduce-scatter its own
    input replaces it, and the root's gathered params are gone (FSDP2's post-backward
    reshards before reducing: ``_fsdp_param_group.py`` ``post_backward``).
    """
    grad_in = s.acts.residual_bytes * s.tokens_x_hidden + s.acts.kept_logits
    if s.tied:
        grad_in = grad_in + 2 * s.vocab_x_hidden * (s.compute_bytes if s.fsdp else s.grad_bytes)
    if s.whole_graph:
        return _compiled_end(s)
    if s.in_backward:
        return _in_backward_end(s, grad_in)
    if not s.fsdp:
        return s.base.plus(gathered_params=s.work.gathered_end, gradients=s.states.gradients,
                           transients=grad_in,
                           comm_buffers=s.work.buckets + s.work.bwd_buffers)
    block_grads = 0 if s.params_offloaded else \
        (s.train_blocks * (vec.ceil_div(s.train_block_params, s.degree) + s.block_grad_pad)
         + s.dense_grad_delta) * s.grad_bytes
    # the last block differentiated is the first: its reduce-scatter input (a dense first
    # block's where the MoE model has them)
    rs_first = s.work.rs_unit if s.work.rs_first is None else s.work.rs_first
    root_grads = 0 if s.params_offloaded else vec.where(
        s.accumulating, vec.ceil_div(s.train_root_params, s.degree) * s.grad_bytes, 0)
    emb = s.base.plus(gathered_params=s.work.gathered_end,
                      gradients=block_grads + root_grads
                      + s.root_grad_elems * s.compute_bytes,
                      transients=grad_in, comm_buffers=rs_first)
    root_rs = emb.plus(transients=s.acts.kept_logits - grad_in,
                       comm_buffers=s.work.rs_root - rs_first,
                       gathered_params=-s.work.gathered_end)
    subs = [emb, root_rs]
    if s.unsynced_grads:
        # the last micro-batch: the blocks' accumulated gradients are reduced, the root's
        # accumulated one is still held beside its new one (traced)
        subs = [b.plus(gradients=s.unsynced_root) for b in subs]
        # a micro-batch before the last: nothing is reduced; every unit's unsharded gradient
        # is kept (FSDP2: converted to the reduce dtype in post-backward), the root's new one
        # arriving on top (of its accumulated one, unless this is the first micro-batch)
        held = s.unsynced_grads - (s.unsynced_root if s.two_micro_batches else 0)
        subs.append(s.base.plus(gathered_params=s.work.gathered_end,
                                gradients=vec.where(s.accumulating, held, 0)
                                + s.root_grad_elems * s.compute_bytes, transients=grad_in))
    return largest(subs)[1]


def _in_backward_end(s: Step, grad_in: Any) -> Breakdown:
    """Optimizer in backward, one GPU: the embeddings' backward makes the table's gradient
    (tied: added to the head's, out of place, as without it), then its hook steps it: the
    table's gradient and its step temporaries, the input gradient freed (the engine drops a
    node's inputs before the next node runs). No other gradient is held."""
    emb = s.base.plus(gathered_params=s.work.gathered_end, gradients=s.table_grad,
                      transients=grad_in, comm_buffers=s.work.buckets + s.work.bwd_buffers)
    step = s.base.plus(gradients=s.table_grad, transients=s.acts.kept_logits,
                       optimizer_temporaries=s.table_step)
    return largest([emb, step])[1]


def _compiled_end(s: Step) -> Breakdown:
    """``--compile model``: the compiled backward's last op, the embeddings' backward, with
    every new gradient of its graph returned at once; after the first micro-batch they are
    alive beside the accumulated ones until AccumulateGrad adds them
    (planner/memory/compiled_model.py; traced)."""
    grad_in = s.acts.residual_bytes * s.tokens_x_hidden + s.acts.kept_logits + s.graph_table
    return s.base.plus(gathered_params=s.work.gathered_end,
                       gradients=s.states.gradients + vec.where(s.accumulating, s.graph_grads, 0),
                       transients=grad_in, comm_buffers=s.work.buckets + s.work.bwd_buffers)


def optimizer_step(s: Step) -> Breakdown:
    """optimizer.step(): states, every gradient and the step's temporaries. With the
    optimizer in backward there is no step here: what stays between steps."""
    if s.in_backward:
        return s.base.plus(transients=s.acts.kept_logits)
    return s.base.plus(gradients=s.states.gradients - s.work.step_grads_freed,
                       comm_buffers=s.work.buckets,
                       transients=s.acts.kept_logits,
                       optimizer_temporaries=s.states.optimizer_temporaries
                       + s.work.step_extra)


MOMENTS = {
    Phase.INIT: initialization,
    Phase.FORWARD: forward,
    Phase.LOSS_BWD: loss_backward,
    Phase.BLOCK_BWD: block_backward,
    Phase.BWD_END: backward_end,
    Phase.OPTIMIZER: optimizer_step,
}
