"""Activation memory of one training step, counted tensor by tensor.

What autograd keeps between forward and backward is the set of tensors each op saves for its
backward (``derivatives.yaml`` in PyTorch names them per op). The counts walk the reference
block of ``probes/models.py`` op by op and list every saved tensor with its dtype, each
architecture variant its own (``planner/arch/``: the norm, attention, MLP and positional
variants, in the order of the block's layout); storage shared by several ops (q/k/v reading
one normed input) is counted once. This module adds the root, the loss, checkpointing,
LoRA, tensor parallel and offloading. The approach
follows Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (sec. 4.1, the 34·sbh + 5·as²b derivation), redone for today's blocks: no dropout,
RMSNorm/SwiGLU/GQA/RoPE, flash-style SDPA, and the two mixed-precision regimes below.

Two ways to run bf16/fp16 mixed precision keep different activations:

- ``autocast`` (torch.autocast over fp32 params: DDP and single-GPU scripts, Lightning,
  HF Trainer): the residual stream stays fp32, every matmul casts its input to bf16 and
  saves that cast — q, k and v each cast the same normed input, so it is saved three times
  (autocast caches casts of leaf weights only: ``aten/src/ATen/autocast_mode.h``,
  ``cached_cast``). Norms, softmax and the loss run in fp32 on CUDA.
- ``module`` (the module computes in one dtype: FSDP2 ``MixedPrecisionPolicy(param_dtype)``,
  DeepSpeed's bf16 module, pure bf16, or fp32): every tensor is in that dtype except what the
  code upcasts itself (the RMSNorm statistics, softmax in fp32, the loss).

Names below: t = micro_batch · seq tokens, h = hidden, f = ffn, qd = n_heads · head_dim,
kvd = n_kv_heads · head_dim, V = vocab, c = compute-dtype bytes, r = residual-stream bytes.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import NamedTuple

from planner.arch import variants_of
from planner.arch.base import FP32, Ctx, Saved, scaled
from planner.lazy_dataclass import dataclass
from planner.spec import (
    Attention,
    Checkpointing,
    FineTune,
    LossKind,
    ModelSpec,
    Precision,
    SacList,
)

# Activation offloading (torchtune/training/_activation_offloading.py, ``OffloadActivations``;
# docs/model.md §3.7): tensors under ``min_offload_size`` bytes stay where they are, and with
# streams the forward keeps the last ``max_fwd_stash_size`` offloaded tensors alive on the GPU
# until their copies are done.
OFFLOAD_MIN_BYTES = 1024
OFFLOAD_FWD_STASH = 5


class AmpRegime(enum.StrEnum):
    AUTOCAST = "autocast"
    MODULE = "module"


@dataclass(frozen=True, slots=True)
class ActivationPlan:
    """Activation bytes of one micro-batch on one GPU."""

    block_saved: tuple[Saved, ...]
    """Everything one block keeps with no checkpointing."""
    block_kept: int
    """What one block keeps under the chosen checkpointing (the sum the forward leaves)."""
    root_saved: tuple[Saved, ...]
    """Outside the blocks: embeddings, final norm, lm_head input, the loss's saved output."""
    recompute: int
    """Under checkpointing, one block's recomputed activations alive during its backward."""
    loss_forward_transient: int
    """Alive at once while the loss is computed, beyond root_saved."""
    loss_backward_transient: int
    """Alive at once during the loss's backward, beyond root_saved."""
    block_backward_transient: int
    """Gradient tensors alive inside one block's backward (input grads, not weight grads)."""
    n_layers: int
    residual_bytes: int = FP32
    """Bytes per element of the residual stream (r): the gradient reaching the embeddings."""
    kept_logits: int = 0
    """Logits the loop holds from the loss to the end of the step (--keep-logits)."""
    loss_gap: int = 0
    """Reserved beyond allocated in the loss's backward when the loss upcasts low-precision
    logits that are freed before backward (docs/model.md §7.4): the logits' c bytes per
    logit left free between the fp32 gradients (0 where nothing is upcast or freed)."""
    frozen_blocks: int = 0
    """The first blocks, frozen (--freeze N-layers), that keep ``frozen_block_kept``."""
    frozen_block_kept: int = 0
    first_block_less: int = 0
    """What the first block that computes gradients does not keep when no gradient flows
    into it (frozen embeddings): its input norm's fp32 input and rstd."""
    notes: tuple[str, ...] = ()
    offload: bool = False
    """Activation offloading: the saved tensors of the blocks and of the root before the
    output layer go to pinned host RAM (the fields below; 0 without it)."""
    offload_small_per_block: int = 0
    """What each block keeps in tensors under OFFLOAD_MIN_BYTES (not offloaded)."""
    offload_stash: int = 0
    """The forward stash: of the last OFFLOAD_FWD_STASH offloaded tensors of the forward, the
    blocks' (kept on the GPU until their copies are waited on, into the first backward node)."""
    offload_stash_root: int = 0
    """The root's part of that stash (the final norm's tensors)."""
    offload_root: int = 0
    """Of root_saved, what is offloaded (everything but the output layer's and the loss's)."""
    offload_root_before: int = 0
    """Of that, what the root saves before the first block."""
    offload_host: int = 0
    """Pinned host bytes of one rank: one copy per save (``pack_tensor`` copies every save,
    so a tensor several ops save is copied once per op), the matmuls' weights included."""
    offload_back: int = 0
    """In backward, the brought-back tensors alive at once: two consecutive autograd nodes'
    offloaded saves (``bwd_tensor_stash`` is emptied of the previous node's in the current
    node's post-hook)."""
    ring_forward: int = 0
    """Context parallel: the ring attention's forward peak above its inputs, in one block
    (planner/context_parallel.py; 0 without CP)."""
    ring_backward: int = 0
    """Context parallel: one block's backward transient while its ring attention runs
    backward (the ring's peak, the gradients flowing in); 0 without CP."""
    ring_grads: int = 0
    """Context parallel: of ``ring_backward``, the unit's unsharded weight gradients already
    made when the ring runs (``context_parallel.grads_before_ring``); 0 without CP."""
    checkpointed_forward: int = 0
    """Full or (op-level) selective checkpointing: what one block's forward holds at once
    inside its checkpoint (``checkpointed_forward``) beyond what it keeps (``block_kept``,
    counted with every block's); 0 without checkpointing."""
    ends_kept: tuple[int, int, int] | None = None
    """An MoE model with dense first blocks (``block_kept`` their average): what the first,
    the second and the last blocks keep each (the dense first ones, the MoE ones after
    them), for the backward's sub-moments at either end; None: every block ``block_kept``."""

    def scaled(self, k: float) -> ActivationPlan:
        """Every activation term times k (a calibration's correction)."""
        return dataclasses.replace(
            self,
            block_saved=tuple(Saved(s.name, int(s.nbytes * k)) for s in self.block_saved),
            block_kept=int(self.block_kept * k),
            root_saved=tuple(Saved(s.name, int(s.nbytes * k)) for s in self.root_saved),
            recompute=int(self.recompute * k),
            loss_forward_transient=int(self.loss_forward_transient * k),
            loss_backward_transient=int(self.loss_backward_transient * k),
            block_backward_transient=int(self.block_backward_transient * k),
            kept_logits=int(self.kept_logits * k),
            loss_gap=int(self.loss_gap * k),
            frozen_block_kept=int(self.frozen_block_kept * k),
            first_block_less=int(self.first_block_less * k),
            offload_small_per_block=int(self.offload_small_per_block * k),
            offload_stash=int(self.offload_stash * k),
            offload_stash_root=int(self.offload_stash_root * k),
            offload_root=int(self.offload_root * k),
            offload_root_before=int(self.offload_root_before * k),
            offload_host=int(self.offload_host * k),
            offload_back=int(self.offload_back * k),
            ring_forward=int(self.ring_forward * k),
            ring_backward=int(self.ring_backward * k),
            ring_grads=int(self.ring_grads * k),
            checkpointed_forward=int(self.checkpointed_forward * k),
            ends_kept=None if self.ends_kept is None else tuple(
                int(x * k) for x in self.ends_kept))

    @property
    def block_bytes(self) -> int:
        return sum(s.nbytes for s in self.block_saved)

    @property
    def root_bytes(self) -> int:
        return sum(s.nbytes for s in self.root_saved)

    @property
    def root_before_blocks(self) -> int:
        """What the root saves before the first block runs (embedding norm and dropout
        mask, RoPE's tables): alive while the blocks run forward."""
        return sum(s.nbytes for s in self.root_saved
                   if s.name.startswith(("embed_norm", "embed.", "rope.")))

    @property
    def blocks_kept(self) -> int:
        """What all blocks keep at the end of forward."""
        return (self.block_kept * (self.n_layers - self.frozen_blocks)
                + self.frozen_block_kept * self.frozen_blocks - self.first_block_less)

    @property
    def saved_total(self) -> int:
        """Activations alive at the end of forward."""
        return self.blocks_kept + self.root_bytes

    @property
    def host_bytes(self) -> int:
        """Pinned host RAM of one rank under activation offloading: a copy of every offloaded
        save (``torch.empty_like(..., pin_memory=True)`` per pack), all alive at the end of
        forward."""
        return self.offload_host if self.offload else 0

    @property
    def gpu_blocks_kept(self) -> int:
        """What the blocks hold on the GPU at the end of forward and through the loss's
        backward: everything without offloading; with it, the small tensors and the forward
        stash's blocks' share (emptied in the first offloaded node's post-hook)."""
        if not self.offload:
            return self.blocks_kept
        return min(self.blocks_kept, self.n_layers * self.offload_small_per_block
                   + self.offload_stash)

    @property
    def gpu_block_kept(self) -> int:
        """What one block holds on the GPU until its backward ends (freed then)."""
        return self.offload_small_per_block if self.offload else self.block_kept

    @property
    def gpu_blocks_bwd(self) -> int:
        """What the blocks hold on the GPU when their backward starts, beside ``gpu_back``."""
        if not self.offload:
            return self.blocks_kept
        return min(self.blocks_kept, self.n_layers * self.offload_small_per_block)

    @property
    def gpu_back(self) -> int:
        """Offloaded tensors brought back and alive at once during the blocks' backward."""
        return self.offload_back if self.offload else 0

    @property
    def gpu_root(self) -> int:
        """The root's saved tensors on the GPU: the output layer's and the loss's, the small
        ones, and the final norm's still in the forward stash."""
        return self.root_bytes - self.offload_root + self.offload_stash_root

    @property
    def gpu_root_before(self) -> int:
        return self.root_before_blocks - self.offload_root_before


def regime_for(precision: Precision, uses_autocast: bool) -> tuple[AmpRegime, int, int]:
    """(regime, c, r): the compute-dtype bytes and the residual-stream bytes."""
    if precision.amp and uses_autocast:
        return AmpRegime.AUTOCAST, 2, FP32
    c = precision.compute_bytes
    return AmpRegime.MODULE, c, c


def block_saved(model: ModelSpec, t: int, batch: int, seq: int, attention: Attention,
                regime: AmpRegime, c: int, r: int) -> list[Saved]:
    """What one block saves for backward: its layout's parts in forward order, each variant
    listing its own (planner/arch/). An MoE model with dense blocks (DeepSeek's
    first_k_dense_replace) gets the average block: its MLP entries weighted by how many blocks
    of each kind there are, so that n_layers x this sum is the whole model's."""
    x = Ctx(t, batch, seq, attention, regime is AmpRegime.AUTOCAST, c, r)
    return variants_of(model).block_saved(model, x)


def mm_outputs(model: ModelSpec, t: int, c: int, dense: bool = False) -> list[Saved]:
    """A block's ``aten.mm`` outputs in execution order (q, k, v, o, then the MLP's).

    Only linears without a bias run as ``aten.mm``; a biased one is ``addmm`` (GPT-2's Conv1D,
    BERT, phi-2, Qwen2's q/k/v), which torchtitan's policy does not count in its alternation.
    MoE experts run as grouped matmuls (not counted); DeepSeek's router multiplies in fp32.
    ``dense``: one of an MoE model's dense blocks."""
    return [o.saved for o in variants_of(model).block_linear_outputs(model, t, c, dense)
            if not o.biased]


def sac_linears(model: ModelSpec, t: int, c: int, sac_list: SacList,
                dense: bool = False, force: tuple[str, ...] = ()) -> list[Saved]:
    """The linear outputs selective checkpointing keeps in one block, in execution order:
    every other ``aten.mm`` (the 1st, 3rd, ...: torchtitan's policy counts ``mm`` and
    ``linear`` only) and, under the current list, every ``addmm`` (a biased linear: ``addmm``
    is in torch's ``compute_intensive_ops``, and it is not counted, so it is always saved).
    ``force``: torchtitan's ``force_recompute_mm_shapes_by_fqns`` (planner/sac.py): an
    ``mm`` whose weight has the shape of a named linear's is recomputed and not counted."""
    return [o.saved for o in sac_kept_linears(model, t, c, sac_list, dense, force)]


def sac_kept_linears(model: ModelSpec, t: int, c: int, sac_list: SacList,
                     dense: bool = False, force: tuple[str, ...] = ()) -> list:
    """sac_linears' outputs as the block's ``LinearOut``s (their weight shapes included)."""
    from planner.sac import forced_shapes

    shapes = forced_shapes(model, force, dense)
    kept = []
    n_mm = 0
    for out in variants_of(model).block_linear_outputs(model, t, c, dense):
        if out.biased:
            if sac_list is SacList.CURRENT:
                kept.append(out)
            continue
        if out.weight in shapes:  # recomputed, not counted (torchtitan's lines 265-267)
            continue
        n_mm += 1
        if n_mm % 2:
            kept.append(out)
    return kept


def sac_forced_share(model: ModelSpec, sac_list: SacList, force: tuple[str, ...]) -> float:
    """The block matmul weights ``force`` moves from kept to recomputed (negative: the
    alternation's shift keeps more), as a share of the average block's matmul weights
    (throughput.matmul_params): what selective checkpointing recomputes beyond its share
    without ``force``. Each weight is one matmul a token runs again in backward."""
    if not force:
        return 0.0
    L, nd = model.n_layers, model.n_dense_layers

    def kept(dense: bool, f: tuple[str, ...]) -> int:
        return sum(o.weight[0] * o.weight[1] for o in
                   sac_kept_linears(model, 1, 1, sac_list, dense, f) if not o.biased)

    moved = (L - nd) * (kept(False, ()) - kept(False, force))
    if nd:
        moved += nd * (kept(True, ()) - kept(True, force))
    return moved / L / variants_of(model).block_matmul_weights(model)


def op_sac_kept(model: ModelSpec, t: int, batch: int, seq: int, attention: Attention,
                c: int, r: int, sac_list: SacList = SacList.CURRENT,
                force: tuple[str, ...] = ()) -> list[Saved]:
    """What selective (op-level) checkpointing keeps per block.

    PyTorch's selective activation checkpointing as torchtitan configures it
    (``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with the policy of
    torchtitan/distributed/activation_checkpoint.py): inside each checkpointed block the outputs
    of the save list's ops are kept, except every second ``mm``; everything else is recomputed
    in backward. ``sac_list`` (planner.spec.SacList, docs/model.md §5.6): "pre-2026-03-23", the
    per-model list (mm, every SDPA backend's op since b39377f9f, #2095: before it a cuDNN-run
    SDPA was recomputed, not modelled); "current" (114151ad4, #2357, 2026-03-23), torch's
    ``get_default_op_list().compute_intensive_ops`` and more: also every ``addmm`` (biased
    linears) and, since 7074b056a (#3146, 2026-05-26), the router's ``topk`` (its fp32 values
    and int64 indices). MoE experts (``_grouped_mm``) are in neither list. Kept: the block
    input (the checkpoint's input) plus those outputs. (Megatron's "selective", recompute the
    attention core only, is a different policy.) ``force``: the module names whose linears'
    shapes are recomputed (torchtitan's ``force_recompute_mm_shapes_by_fqns``: sac_linears).
    """
    kept = [Saved("block.input", r * t * model.hidden)]
    linears = sac_linears(model, t, c, sac_list, force=force)
    L, nd = model.n_layers, model.n_dense_layers
    if nd:  # the average block (as block_saved)
        linears = scaled(linears, L - nd, L) + scaled(
            sac_linears(model, t, c, sac_list, dense=True, force=force), nd, L)
    kept += linears
    if attention is Attention.SDPA:
        kept += [Saved("sdpa.out", c * t * model.o_in_dim),
                 Saved("sdpa.logsumexp", FP32 * batch * model.n_heads * seq)]
    if model.is_moe and sac_list is SacList.CURRENT:
        # topk of the fp32 router probabilities: (t, k) values and int64 indices
        k = model.experts_per_token
        kept += scaled([Saved("moe.topk_values", FP32 * t * k),
                        Saved("moe.topk_indices", 8 * t * k)], L - nd, L)
    return kept


def _sac_same(model: ModelSpec) -> dict[str, tuple[str, ...]]:
    """Kept tensors (op_sac_kept's names) that are the very tensors block_saved lists: the
    recompute in backward returns the kept one instead of making a second. q and k reach SDPA
    as their linears' outputs only without RoPE (RoPE makes new ones); a kept linear output
    read only by a residual add or a norm (o, down, the router) is saved by nothing."""
    rotary = variants_of(model).position.rotary
    qk = () if rotary else ("sdpa.q", "sdpa.k")
    same = {"sdpa.out": ("sdpa.out",), "sdpa.logsumexp": ("sdpa.logsumexp",),
            "q.out": qk[:1], "k.out": qk[1:], "v.out": ("sdpa.v",),
            "qkv.out": qk + ("sdpa.v",),
            "moe.topk_indices": ("moe.topk_indices",),
            "shared.gate.out": ("mlp.shared.gate_out",),
            "shared.up.out": ("mlp.shared.up_out",)}
    if not model.is_moe:  # an MoE block's gate/up outputs are its experts' (not linears)
        same.update({"gate.out": ("mlp.gate_out",), "up.out": ("mlp.up_out",),
                     "gate_up.out": ("mlp.gate_out", "mlp.up_out")})
    return same


def _sac_overlap(model: ModelSpec, saved: list[Saved], kept: list[Saved]) -> int:
    """Bytes of block_saved that are the very tensors SAC keeps (not recomputed twice)."""
    same = _sac_same(model)
    names = {n for x in kept for n in same.get(x.name, ())}
    return sum(s.nbytes for s in saved if s.name in names)


def sac_freed_by_rope(model: ModelSpec, kept: list[Saved]) -> int:
    """Bytes of kept q / k projection outputs (separate linears) that a block no longer holds
    once its recompute has passed RoPE: the recompute consumes their cache entries
    (torch/utils/checkpoint.py ``_CachedTorchDispatchMode`` marks them ``_CONSUMED``) and only
    RoPE reads them, whose multiplications save cos and sin, not their input. A fused qkv
    output stays (its v view is SDPA's v). Counted only at a moment known to come after the
    recompute: context parallel's ring backward (memory/estimator.py ``with_ring``); the
    block backward's own moments stay as they are (at 512 tokens the traced peak falls
    where the kept q is still held: tests/test_sac_list.py)."""
    if not variants_of(model).position.rotary:
        return 0
    return sum(x.nbytes for x in kept if x.name in ("q.out", "k.out"))


def root_saved(model: ModelSpec, t: int, seq: int, regime: AmpRegime, c: int, r: int) -> list[Saved]:
    h = model.hidden
    autocast = regime is AmpRegime.AUTOCAST
    arch = variants_of(model)
    x = Ctx(t, t // seq, seq, None, autocast, c, r)
    out: list[Saved] = []
    if model.embedding_norm:
        out += arch.norm.saved(model, x, "embed_norm", r)
    if model.dropout:
        out.append(Saved("embed.dropout_mask", t * h))
    out += arch.position.saved(model, x)  # RoPE's cos and sin tables
    if model.encoder_head:
        # BERT MLM head: dense -> gelu -> norm -> decoder; the pooler reads token 0 only.
        out += [Saved("head.dense.input", (c if autocast else r) * t * h),
                Saved("head.gelu.input", c * t * h)]
        out += arch.norm.saved(model, x, "head.norm", c)
        out.append(Saved("lm_head.input", c * t * h))
    else:
        out += arch.norm.saved(model, x, "final_norm", r)
        norm_out = arch.norm.out_bytes(x)
        name = "lm_head.input_cast" if autocast and norm_out != c else "lm_head.input"
        out.append(Saved(name, (c if autocast else norm_out) * t * h))
        if model.final_softcap:
            # Gemma-2: logits = tanh(logits / cap) * cap before the loss; tanh saves its
            # output (tokens x vocab in the logits' dtype)
            out.append(Saved("logits.softcap_tanh", c * t * model.vocab))
    return out


@dataclass(frozen=True, slots=True)
class LossTerms:
    saved: Saved
    """What the loss keeps for its backward (the last entry of root_saved)."""
    forward: int
    """Alive at once while the loss is computed, beyond what it saves."""
    backward: int
    """Alive at once during the loss's backward, beyond what it saved."""
    kept_logits: int
    """What a loop that holds the logits keeps through backward."""
    upcast_hole: int = 0
    """The low-precision logits an fp32 upcast frees before backward (the loss gap the
    caching allocator keeps: ``ActivationPlan.loss_gap``); 0 where nothing is upcast."""


def loss_terms(model: ModelSpec, t: int, c: int, r: int, loss: LossKind, chunks: int,
               compiled: bool = False) -> LossTerms:
    """The cross-entropy over the vocabulary, per way of computing it.

    - fp32: ``cross_entropy(logits.float())`` (HF ``ForCausalLMLoss``, torchtitan): log_softmax
      saves its fp32 output; at the loss the bf16 logits and their fp32 copy are alive; its
      backward holds nll_loss's dense fp32 gradient and log_softmax_backward's output.
    - bf16: the same on the low-precision logits (log_softmax's output in c bytes).
    - chunked:N (torchtune ``CEWithChunkedOutputLoss``): the output projection and the loss run
      per chunk; each chunk's fp32 copy is freed after its log_softmax (whose outputs, 4tV in
      all, are saved), and each chunk's backward holds its own fp32 gradients and their cast.
    - fused (Liger ``LigerFusedLinearCrossEntropyLoss``): no full logits; the loss and its
      gradients are computed in forward, chunk by chunk of ``next_pow2(ceil(t / ceil(V/h)))``
      tokens (``fused_linear_cross_entropy_forward``), keeping the input's gradient (c·t·h)
      and the head weight's gradient (its own dtype) for backward.
    - compiled (``--compile model`` or ``blocks+loss``: torchtune's ``compile_loss``,
      torchtitan's ``components = ["model", "loss"]``, an HF model computing its loss in
      forward): AOTAutograd's min-cut partitioner saves the low-precision logits (and per-token
      fp32 statistics) instead of the fp32 log-softmax, which inductor never materializes; the
      backward writes the logits' gradient in their dtype. Holding the logits adds nothing:
      the graph keeps them anyway.
    """
    v, h = model.vocab, model.hidden
    logits = c * t * v
    if compiled and loss is not LossKind.FUSED:
        n = chunks if loss is LossKind.CHUNKED else 1
        return LossTerms(saved=Saved("loss.compiled_logits", logits + 2 * FP32 * t),
                         forward=0, backward=-(-logits // n), kept_logits=0)
    if loss is LossKind.FP32 and not model.loss_upcast and r == c:
        # the model's own loss takes cross-entropy on the logits as they are
        # (BertForMaskedLM's CrossEntropyLoss): no fp32 copy when the module computes in c
        # (FSDP2 param_dtype, pure bf16); under autocast log_softmax is an fp32 op anyway
        loss = LossKind.BF16
    if loss is LossKind.FUSED:
        ratio = -(-v // h)
        chunk = 1 << max(0, (-(-t // ratio) - 1).bit_length())
        return LossTerms(saved=Saved("loss.fused_grads", c * t * h + r * v * h),
                         forward=c * chunk * (v + h), backward=0, kept_logits=0)
    if loss is LossKind.BF16:
        return LossTerms(saved=Saved("loss.log_softmax_out", logits), forward=logits,
                         backward=2 * logits, kept_logits=logits)
    upcast = FP32 * t * v if c != FP32 else 0  # .float() copies unless already fp32
    if loss is LossKind.CHUNKED:
        return LossTerms(saved=Saved("loss.log_softmax_out", FP32 * t * v),
                         forward=logits + -(-upcast // chunks),
                         backward=-(-(2 * FP32 * t * v + logits) // chunks), kept_logits=logits)
    return LossTerms(saved=Saved("loss.log_softmax_out", FP32 * t * v), forward=logits + upcast,
                     # kept: the model's output; its fp32 copy is freed once log_softmax
                     # ran (saves its output; _to_copy saves nothing): traced
                     backward=2 * FP32 * t * v, kept_logits=logits,
                     upcast_hole=logits if upcast else 0)


# ---------------------------------------------------------------------------------------------
# Frozen weights, LoRA adapters and tensor parallel (docs/model.md §8)

_LINEAR_INPUTS = {
    # saved tensor -> the linears that save it for their weight gradient
    "attn.qkv.input": ("q", "k", "v"), "attn.q.input_cast": ("q",),
    "attn.k.input_cast": ("k",), "attn.v.input_cast": ("v",), "attn.o.input": ("o",),
    "mlp.input": ("gate", "up"), "mlp.in0.input_cast": ("gate", "up"),
    "mlp.in1.input_cast": ("up",), "mlp.down.input": ("down",), "moe.dispatched": (),
}
"""What a block saves only because a linear's weight needs its gradient. PyTorch's autograd
codegen saves an input only when the other operand needs a gradient
(``should_compute_output`` guards in the generated ``VariableType``): a frozen weight's
matmul keeps its weight, not its input."""


def lora_saved(model: ModelSpec, saved: list[Saved], ft: FineTune, t: int, c: int,
               adapter_bytes: int = 0) -> list[Saved]:
    """One block's saved set with a frozen base and LoRA adapters on ``ft.lora_targets``
    (``ft.lora_rank`` 0: a frozen block without adapters).

    Dropped: the norms' normalized output (saved only for the frozen norm weight's gradient)
    and every linear input no trainable weight reads. peft's ``LoraLayer.forward`` computes
    ``lora_B(lora_A(dropout(x))) * scaling`` beside the base layer, casting ``x`` to the
    adapter's dtype first: lora_A saves its input and lora_B saves lora_A's output (t x r).
    ``adapter_bytes`` 0: the adapter runs in the input's dtype and reads ``x`` itself (FSDP's
    MixedPrecisionPolicy casts adapters to param_dtype; adapters in the base's dtype);
    otherwise each adapted module keeps its own copy of its input in that many bytes (fp32
    adapters: 4, or under autocast the bf16 cast of that copy: 2). With dropout each adapted
    module keeps a bool mask and the dropped input (the copy, if it is cast).
    """
    targets = set(ft.lora_targets) if ft.lora else set()
    dims = {"q": (model.hidden, model.q_dim), "k": (model.hidden, model.kv_dim),
            "v": (model.hidden, model.kv_dim), "o": (model.q_dim, model.hidden),
            "gate": (model.hidden, model.ffn_hidden), "up": (model.hidden, model.ffn_hidden),
            "down": (model.ffn_hidden, model.hidden)}
    shares = not ft.lora_dropout and not adapter_bytes
    out = []
    for x in saved:
        if x.name.endswith(".normed"):
            continue
        users = _LINEAR_INPUTS.get(x.name)
        if users is None:
            out.append(x)
        elif shares and targets & set(users):
            out.append(x)  # the adapters' input, saved once for all that read it
    a_bytes = adapter_bytes or c
    for m in ft.lora_targets if ft.lora else ():
        if m not in dims or (m in ("gate", "up", "down") and model.is_moe) \
                or (m == "gate" and not model.mlp.gated):
            continue
        i, _ = dims[m]
        if ft.lora_dropout:
            out.append(Saved(f"lora.{m}.dropout_mask", t * i))
            out.append(Saved(f"lora.{m}.dropout_out", a_bytes * t * i))
        elif adapter_bytes:
            out.append(Saved(f"lora.{m}.input_cast", a_bytes * t * i))
        out.append(Saved(f"lora.{m}.a_out", a_bytes * t * ft.lora_rank))
    return out


_TP_FULL = ("attn.qkv.input", "attn.q.input_cast", "attn.k.input_cast", "attn.v.input_cast",
            "mlp.input", "mlp.in0.input_cast", "mlp.in1.input_cast", "lm_head.input",
            "lm_head.input_cast", "rope.cos_sin")


OP_INTERNAL = (".input_fp32", ".rstd", ".mean_rstd", "sdpa.logsumexp", ".gelu.half_x",
               ".gelu.pow_input", ".gelu.tanh_out", ".gelu.one_plus_tanh")
"""Saved tensors no variable of the module code outlives their op for: a norm's fp32 copy
and statistics (made and used inside the norm's forward), SDPA's logsumexp (an output the
functional call drops), the op-by-op GELU's inner terms. Only autograd keeps them."""


def checkpointed_forward(saved: list[Saved]) -> int:
    """What one block's forward holds at once inside a full checkpoint: its saved set less
    what only autograd would keep (``OP_INTERNAL``). Inside ``torch.utils.checkpoint``'s
    non-reentrant forward nothing is saved (its pack hook drops every tensor), so a tensor
    lives as long as the block's code refers to it; the block's own tensors (the norms'
    outputs, q, k, v, the attention output, the MLP's intermediates) are alive when the
    MLP runs. A reentrant checkpoint's forward runs the block under ``no_grad``
    (``CheckpointFunction.forward``): the same lifetimes (traced: tests/test_reentrant.py, the
    forward moment equal). A bound: the tensors made after the MLP's activation (its down
    projection's output) are counted too. Traced (probes/ep_trace.py; the reference model at seq 4096:
    the forward's peak is inside a checkpointed block's MLP)."""
    return sum(s.nbytes for s in saved if not s.name.endswith(OP_INTERNAL))


def reentrant_held(t: int, h: int, r: int, tp: int = 1) -> int:
    """What a reentrant checkpoint holds through its block's backward beyond a non-reentrant
    one: the recomputed block's output, r·t·h (the residual stream; split tp ways under
    sequence parallel). torch/utils/checkpoint.py ``CheckpointFunction.backward`` re-runs the
    block (``outputs = ctx.run_function(*detached_inputs)`` under ``enable_grad``) and keeps
    ``outputs`` referenced while ``torch.autograd.backward(outputs_with_grad,
    args_with_grad)`` runs through the recomputed graph; the non-reentrant checkpoint's
    recompute discards its outputs (``_checkpoint_hook`` keeps only the saved tensors in
    ``frame.recomputed``) and with ``early_stop`` does not compute them at all. The saved
    set is the same (every saved tensor recomputed, freed as its node runs in both; the
    inputs kept by ``ctx.save_for_backward`` / ``_NoopSaveInputs``). Traced
    (tests/test_reentrant.py): +r·t·h at block backward, every other moment unchanged."""
    return -(-r * t * h // tp)


def tp_saved(saved: list[Saved], tp: int, mlp_local: MlpLocal | None = None) -> list[Saved]:
    """Per GPU under tensor + sequence parallel (Korthikanti et al. 2022, sec. 4.2.2: every
    activation split tp ways). As torchtitan runs it (``SequenceParallel`` norms,
    ``ColwiseParallel(input_layouts=Shard(1))``), the all-gathered inputs of the
    column-parallel linears (q/k/v, the MLP's inputs, the output head) are saved whole by
    autograd; the paper's re-gather in backward is not done. RoPE's tables are replicated.
    ``mlp_local``: the MLP is expert parallel's MoE beside TP, on its rank's sequence shard
    (no all-gather: docs/model.md §8.8), so its inputs are split tp ways too but what
    ``ep_tp_saved`` keeps whole."""
    if tp <= 1:
        return saved
    if mlp_local is not None:
        return ep_tp_saved(saved, tp, mlp_local)
    out = []
    for x in saved:
        base = x.name.removeprefix("lora.")
        full = x.name in _TP_FULL or (x.name.startswith("lora.") and base.split(".")[0]
                                      in ("q", "k", "v", "gate", "up"))
        out.append(x if full else Saved(x.name, -(-x.nbytes // tp)))
    return out


_TP_ROWWISE = ("o.out", "down.out", "shared.down.out")
"""The block's row-parallel linears under torchtitan's TP (``RowwiseParallel``: attention.wo,
feed_forward.w2, the shared experts' w2 beside EP)."""


def tp_sac_kept(model: ModelSpec, sac: list[Saved], tp: int, t: int, c: int) -> list[Saved]:
    """``op_sac_kept`` per GPU under tensor + sequence parallel, as the policy sees it: it runs
    on the DTensors' ops (its dispatch mode is above DTensor's), so what it keeps is each op's
    local output.

    - A column-parallel linear's output, the block input, SDPA's outputs (heads / tp) and the
      router's (on the sequence shard beside EP) split tp ways (``tp_saved``).
    - A row-parallel linear (``_TP_ROWWISE``) contracts the feature dim both operands are
      sharded on: its output is ``Partial`` (torch cf30153
      torch/distributed/tensor/_ops/_einsum_strategy.py ``gen_einsum_strategies``, "split
      contracting dim"), each rank's local output the whole sequence x the linear's outputs,
      not split. Kept when the every-other-mm count keeps it (down, the 7th mm of a Llama
      block).
    - ``RowwiseParallel._prepare_output_fn`` (torch/distributed/tensor/parallel/style.py:293)
      redistributes that Partial to ``Shard(1)``: ``_c10d_functional.reduce_scatter_tensor``,
      which both of torchtitan's lists save (b5bcd76
      torchtitan/distributed/activation_checkpoint.py:62 ``_get_default_save_ops``; before
      114151ad4, models/llama3/parallelize.py:53 ``_op_sac_save_list``), whatever the count:
      one sequence-shard output (t / tp x h) per row-parallel linear of the block, kept or
      not. The all-gathers (``all_gather_into_tensor``) are in neither list.
    Traced (tests/test_tp_sac.py: the policy's saved bytes equal this set, block by block,
    TP 2 and 4); with everything split tp ways and no reduce-scatter the forward was
    -7.98 % at TP 2 (h 512, seq 1024), -1.04 % since (docs/model.md §8.4)."""
    if tp <= 1:
        return sac
    out = [x if x.name in _TP_ROWWISE else tp_saved([x], tp)[0] for x in sac]
    L, nd = model.n_layers, model.n_dense_layers
    for dense, n in ((False, L - nd), (True, nd)):
        if n == 0:
            continue
        for o in variants_of(model).block_linear_outputs(model, t, c, dense):
            if o.saved.name in _TP_ROWWISE:
                rs = -(-o.saved.nbytes // tp)
                out.append(Saved(o.saved.name.removesuffix(".out") + ".reduce_scatter",
                                 rs * n // L))
    return out


class MlpLocal(NamedTuple):
    """Expert parallel beside TP (``tp_saved``'s ``mlp_local``): what of an MoE model's
    average block is not on the rank's sequence shard. ``dense_share``: the dense first
    blocks' share of the blocks (n_dense_layers / n_layers), whose MLP input is all-gathered
    as without EP; ``shared_input``: the bytes of the shared experts' all-gathered input in
    the average block (c t h x the MoE blocks' share; 0 without shared experts)."""

    dense_share: float = 0.0
    shared_input: int = 0


def mlp_local_for(model: ModelSpec, t: int, c: int) -> MlpLocal:
    """``MlpLocal`` of ``model`` at t tokens per GPU before TP, compute dtype c bytes."""
    L, nd = model.n_layers, model.n_dense_layers
    shared = c * t * model.hidden * (L - nd) // L if model.shared_ffn else 0
    return MlpLocal(dense_share=nd / L, shared_input=shared)


def ep_tp_saved(saved: list[Saved], tp: int, local: MlpLocal) -> list[Saved]:
    """``tp_saved`` under expert parallel beside TP (docs/model.md §8.8 "Beside tensor
    parallel"), as torchtitan lays it out at b5bcd76 (models/common/moe_sharding.py): the
    MoE's router, dispatch and routed experts run on the rank's sequence shard (no
    all-gather), so its input and everything of the MLP splits tp ways; the shared experts
    (``_shared_experts_sharding_configs``, lines 167-198) all-gather that input to Replicate
    for their column-parallel w1 / w3, which save it whole (``local.shared_input``; their
    intermediates over features / tp); a dense first block's MLP is TP's as without EP
    (models/common/decoder_sharding.py ``set_dense_ffn_sharding``): its all-gathered input
    saved whole (``local.dense_share`` of ``mlp.input``)."""
    out = []
    for x in saved:
        if x.name.startswith("mlp.") and x.name not in _TP_FULL:
            out.append(Saved(x.name, -(-x.nbytes // tp)))
        elif x.name.startswith("mlp."):  # the MLP's input: the MoE blocks' share local
            dense = int(x.nbytes * local.dense_share)
            out.append(Saved(x.name, -(-(x.nbytes - dense) // tp)))
            if dense:
                out.append(Saved(x.name.replace("mlp.", "mlp.dense.", 1), dense))
        else:
            out.extend(tp_saved([x], tp))
    if local.shared_input:
        out.append(Saved("mlp.shared.input", local.shared_input))
    return out


@functools.lru_cache(maxsize=4096)
def plan_activations(model: ModelSpec, *, batch: int, seq: int, precision: Precision,
                     attention: Attention, checkpointing: Checkpointing,
                     uses_autocast: bool, loss: LossKind = LossKind.FP32, loss_chunks: int = 8,
                     keep_logits: bool = False, compiled: bool = False,
                     finetune: FineTune | None = None, tp: int = 1,
                     adapter_bytes: int = 0, compiled_loss: bool = False,
                     offload: bool = False, cp: int = 1, offload_trl: bool = False,
                     offload_weights: bool = True, cp_repeat_kv: bool = True,
                     sac_list: SacList = SacList.CURRENT,
                     mlp_local: bool = False,
                     sac_force: tuple[str, ...] = (),
                     reentrant: bool = False) -> ActivationPlan:
    """``seq`` is the sequence one GPU holds (under context parallel ``cp``: seq / cp;
    ``cp_repeat_kv``: SDPA is given the keys and values repeated to the query heads).
    ``offload_trl``: TRL's OffloadActivations instead of torchtune's; ``offload_weights``:
    the weights the matmuls save are offloaded (False: TRL skipping a parameter's storage).
    ``mlp_local``: expert parallel beside TP (``tp_saved``). ``reentrant``: full
    checkpointing runs ``use_reentrant=True`` (``reentrant_held``)."""
    t = batch * seq
    regime, c, r = regime_for(precision, uses_autocast)
    ft = finetune or FineTune()
    saved = block_saved(model, t, batch, seq, attention, regime, c, r)
    if cp > 1:
        from planner.context_parallel import cp_saved

        saved = cp_saved(saved, model, t, c, repeat_kv=cp_repeat_kv)
    eager_saved = saved
    if ft.lora:
        saved = lora_saved(model, saved, ft, t, c, adapter_bytes)
    local = mlp_local_for(model, t, c) if mlp_local else None
    saved = tp_saved(saved, tp, local)
    block_total = sum(s.nbytes for s in saved)
    h, f = model.hidden, model.ffn_hidden
    tokens = t * model.experts_per_token if model.is_moe else t
    notes: list[str] = []
    if checkpointing is Checkpointing.FULL:
        # Only the block input is kept (either checkpoint holds its inputs); in
        # backward one block is recomputed at a time.
        kept = -(-r * t * h // tp)
        kept_list = [Saved("block.input", kept)]
        recompute = block_total
        ckpt_fwd = checkpointed_forward(saved)
    elif checkpointing is Checkpointing.SELECTIVE:
        sac = op_sac_kept(model, t, batch, seq, attention, c, r, sac_list, sac_force)
        kept_list = tp_sac_kept(model, sac, tp, t, c)
        kept = sum(x.nbytes for x in kept_list)
        # in backward the block is re-run: everything it saves comes back, except what the
        # policy kept (already counted in `kept`)
        recompute = block_total - -(-_sac_overlap(model, eager_saved, sac) // tp)
        # torchtitan's op-level SAC runs the whole block in one checkpoint: its forward holds
        # what a full checkpoint's does, the policy's cache (``kept``, counted with every
        # block's) among it
        ckpt_fwd = max(checkpointed_forward(saved) - kept, 0)
    else:
        kept = block_total
        recompute = ckpt_fwd = 0
        if compiled and (not ft.full or tp > 1):
            notes.append("compiled block's saved set measured for full training without TP: "
                         "the eager saved set is counted")
        elif compiled:
            # torch.compile: what AOTAutograd's min-cut partitioner saves (planner/compiled.py)
            from planner.compiled import saved_bytes

            measured = saved_bytes(model, batch=batch, seq=seq, autocast=uses_autocast and
                                   precision.amp, attention=attention)
            if measured is None:
                notes.append("compiled block's saved set not measured for this architecture "
                             "(MoE or an unlisted block family): eager activations counted")
            else:
                saved, kept = [Saved("compiled.block", measured)], measured
    if checkpointing not in (Checkpointing.FULL, Checkpointing.SELECTIVE):
        kept_list = saved  # the eager list, or the compiled block's one total
    lt = loss_terms(model, t, c, r, loss, loss_chunks, compiled_loss)
    head_frozen = ft.head_frozen(model.tied_embeddings)
    root = root_saved(model, t, seq, regime, c, r)
    loss_saved = lt.saved
    if head_frozen:
        # a frozen head keeps no input for its weight gradient (nor the final norm's output)
        root = [x for x in root if not x.name.startswith("lm_head.input")
                and not x.name.endswith(".normed")]
        if loss is LossKind.FUSED:  # no weight gradient computed in forward either
            loss_saved = Saved(lt.saved.name, c * t * h)
    root = tp_saved(root, tp)
    # loss_parallel (torchtitan): the logits stay sharded over the vocabulary
    loss_saved = Saved(loss_saved.name, -(-loss_saved.nbytes // tp))
    tp_loss = 0
    if tp > 1 and loss in (LossKind.FP32, LossKind.BF16) and not compiled_loss:
        # torch/distributed/tensor/parallel/loss.py computes log_softmax from its parts
        # (``_log_softmax``: x - max, then shifted - logsumexp, in fp32) and its backward as
        # ``(grad_input + exp(x)) * grad_output`` beside the zeroed grad_input: one more fp32
        # logits-sized tensor than the fused kernels, in forward and in backward
        tp_loss = FP32 * t * model.vocab
    # Inside one block's backward: the grad flowing in (residual dtype), the grad of the
    # branch output and the largest pair of MLP intermediate grads.
    ff = (2 if model.mlp.gated else 1) * c * tokens * f
    block_bwd = 2 * r * t * h // tp + ff // tp
    if reentrant and checkpointing is Checkpointing.FULL:
        block_bwd += reentrant_held(t, h, r, tp)
    frozen_blocks = ft.frozen_blocks(model.n_layers)
    frozen_kept = 0
    if frozen_blocks and not ft.embeddings_frozen:
        # gradients still flow through the frozen blocks to the embeddings
        frozen_kept = sum(x.nbytes for x in tp_saved(lora_saved(
            model, eager_saved, FineTune(), t, c), tp))
        if checkpointing is not Checkpointing.NONE:
            frozen_kept = min(frozen_kept, kept)
    first_less = 0
    if ft.embeddings_frozen and checkpointing is Checkpointing.NONE and kept == block_total \
            and frozen_blocks < model.n_layers:
        # the first block a gradient reaches has an input that needs none: its RMSNorm keeps
        # neither the fp32 input nor rstd (traced: 4·t·h + 4·t)
        first_less = sum(x.nbytes for x in saved if x.name in ("norm1.input_fp32", "norm1.rstd"))
    off: dict = {}
    if offload:
        off = _offload_inputs(model, kept_list, root, checkpointing, ft, t, c, tp,
                              offload_trl, offload_weights)
        if checkpointing is Checkpointing.NONE:
            notes.append("activation offloading without checkpointing: every saved tensor of "
                         "every block crosses PCIe twice (torchtune's recipes refuse this "
                         "combination; TRL and axolotl run it)")
    return ActivationPlan(
        offload=offload, **off,
        block_saved=tuple(saved),
        block_kept=kept,
        first_block_less=first_less,
        root_saved=tuple(root) + (loss_saved,),
        recompute=recompute,
        checkpointed_forward=ckpt_fwd,
        loss_forward_transient=-(-(lt.forward + tp_loss) // tp),
        loss_backward_transient=-(-(lt.backward + tp_loss) // tp),
        block_backward_transient=block_bwd,
        n_layers=model.n_layers,
        residual_bytes=r,
        kept_logits=-(-lt.kept_logits // tp) if keep_logits else 0,
        # held logits leave no hole. Under TP's loss_parallel each rank upcasts its vocab shard
        # and the DTensor loss (torch/distributed/tensor/parallel/loss.py) frees the shard's
        # low-precision logits, its fp32 copy and log_softmax's ``shifted`` before backward;
        # the backward's four fp32 shard-sized tensors (the saved output, the zeroed
        # grad_input, exp(x), their sum) leave the c B per local logit the bf16 logits held:
        # probes/alloc_loss.py ``loss_parallel_region`` (2.00 B per local logit)
        loss_gap=0 if keep_logits else -(-lt.upcast_hole // tp),
        frozen_blocks=frozen_blocks,
        frozen_block_kept=frozen_kept,
        notes=tuple(notes),
    )


def _offload_inputs(model: ModelSpec, kept_list: list[Saved], root: list[Saved],
                    checkpointing: Checkpointing, ft: FineTune, t: int, c: int, tp: int,
                    trl: bool = False, offload_weights: bool = True) -> dict:
    """``_offload_terms`` for this run: without checkpointing every op's saves (weights
    included for full training); under full checkpointing the checkpoint's saved inputs,
    the block input and, as the reference (Hugging Face) blocks take them as arguments, the
    rotary tables (``torch.utils.checkpoint`` ``_NoopSaveInputs`` saves every tensor
    argument); the embedding's indices (int64) when the embedding trains."""
    tables = sum(x.nbytes for x in root if x.name == "rope.cos_sin")
    halves = (tables // 2,) * 2 if tables else ()
    root_packs = () if ft.embeddings_frozen else (8 * t,)
    per_op = checkpointing is Checkpointing.NONE
    if not per_op:
        kept_list = kept_list + [Saved(f"rope.table{i}", n) for i, n in enumerate(halves)]
    weights = matmul_weight_saves(model, c, tp) if per_op and ft.full and offload_weights \
        else {}
    return _offload_terms(kept_list, root, model.n_layers, per_op=per_op, weights=weights,
                          rope_saves=halves * 2 if per_op else (), root_packs=root_packs,
                          trl=trl)


_NORM_SAVES = {".input_fp32": ("pow", "mul"), ".rstd": ("rsqrt", "mul"), ".normed": ("w",)}
"""RMSNorm's saves per node (probes/models.py ``RMSNorm``, HF LlamaRMSNorm): ``pow`` and the
normalizing ``mul`` both save the fp32 input, ``rsqrt`` saves its result and that ``mul``
saves it again, the weight's ``mul`` saves the normalized cast (and the weight itself, a
Parameter: never offloaded)."""


def _saving_nodes(name: str, names: set[str]) -> tuple[str, ...]:
    """The autograd nodes of the reference block that save tensor ``name``, in forward order.
    A linear's input is saved by each linear reading it (``_LINEAR_INPUTS``: q, k and v each
    save the normed input); SDPA's output is also the output projection's input (a view of
    the same storage) unless the block lists a copy; SwiGLU's product saves both factors.
    A name not listed here is one node saving one tensor."""
    if name == "mlp.in0.input_cast":  # the first reader's cast: gate's, or up's (no gate)
        return ("gate",) if "mlp.in1.input_cast" in names else ("up",)
    users = _LINEAR_INPUTS.get(name)
    if users:
        return users
    for suffix, nodes in _NORM_SAVES.items():
        prefix = name.removesuffix(suffix)
        if prefix != name and "norm" in prefix:
            return tuple(f"{prefix}.{n}" for n in nodes)
    if name == "sdpa.out":
        return ("sdpa",) if {"attn.o.input", "attn.o.input_copy"} & names else ("sdpa", "o")
    if name.startswith("sdpa."):
        return ("sdpa",)
    if name in ("mlp.act_out", "mlp.up_out"):
        return ("mlp.mul",)
    return (name,)


def matmul_weight_saves(model: ModelSpec, c: int, tp: int = 1) -> dict[str, int]:
    """Bytes of the weight each dense linear's ``mm`` saves for its input's gradient
    (``weight.t()``, a view: a plain tensor, not the Parameter; under autocast the cached
    bf16 cast), per node name. MoE experts run grouped matmuls: not listed."""
    h, qd, kvd, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    out = {"q": h * qd, "k": h * kvd, "v": h * kvd, "o": qd * h}
    if not model.is_moe:
        out.update(up=h * f, down=f * h)
        if model.mlp.gated:
            out["gate"] = h * f
    return {k: -(-v * c // tp) for k, v in out.items()}


def _block_packs(kept_list: list[Saved], per_op: bool, weights: dict[str, int],
                 rope_saves: list[int]) -> list[tuple[str, str, int]]:
    """(node, tensor, bytes) of every save one block hands to the pack hook, forward order.
    ``per_op``: without checkpointing, each op's saves (``_saving_nodes``), the matmuls'
    weights and the rotary tables each RoPE multiply saves (``rope_saves``, before SDPA);
    under checkpointing the kept list as one node (full: the checkpoint's inputs, which its
    first backward node unpacks to recompute; selective: a bound)."""
    names = {x.name for x in kept_list}
    packs: list[tuple[str, str, int]] = []
    seen: set[str] = set()
    for x in kept_list:
        if per_op and x.name.startswith("sdpa.") and "rope" not in seen:
            seen.add("rope")
            packs += [(f"rope.{i}", "rope.table", n) for i, n in enumerate(rope_saves)]
        for node in (_saving_nodes(x.name, names) if per_op else ("block",)):
            if node in weights and node not in seen:
                packs.append((node, f"{node}.weight", weights[node]))
            seen.add(node)
            packs.append((node, x.name, x.nbytes))
    return packs


def _pair_peak(packs: list[tuple[str, str, int]], n_layers: int) -> int:
    """The most offloaded bytes two consecutive nodes hold at once in backward (each node's
    saves brought back separately), the last block's first node beside the next's last."""
    nodes: dict[str, int] = {}
    for node, _, n in packs:
        if n >= OFFLOAD_MIN_BYTES:
            nodes[node] = nodes.get(node, 0) + n
    seq = list(nodes.values())
    if not seq:
        return 0
    pairs = list(zip(seq, seq[1:] + seq[:1])) if n_layers > 1 else list(zip(seq, seq[1:]))
    return max([a + b for a, b in pairs] or [seq[0]])


def _trl_repeats(packs: list[tuple[str, str, int]]) -> tuple[list, int]:
    """TRL's deduplication (``_get_unique_tensor_key``, ``storage_to_tensor_id``): a save of a
    storage already tracked stays on the GPU instead of being copied again, and its key stays
    tracked until that save is unpacked; in the reference block every repeated save follows
    its first within the forward stash's 5 ids (pow then mul, q then k then v, SDPA then
    the output projection, gate then up). Returns the packs copied to the host and the bytes
    of one block kept on the GPU by a repeat (each tensor once). The rotary tables are saved
    by every block: tracked from the first, they are never copied again (kept in the root)."""
    out, seen, kept = [], set(), {}
    for p in packs:
        if p[1].startswith("rope.table"):
            continue
        if p[1] in seen:
            if p[2] >= OFFLOAD_MIN_BYTES:
                kept[p[1]] = p[2]
            continue
        seen.add(p[1])
        out.append(p)
    return out, sum(kept.values())


def _offload_terms(kept_list: list[Saved], root: list[Saved], n_layers: int, *,
                   per_op: bool = False, weights: dict[str, int] | None = None,
                   rope_saves: tuple[int, ...] = (), root_packs: tuple[int, ...] = (),
                   trl: bool = False) -> dict:
    """What OffloadActivations moves, from the per-tensor lists. ``root`` is what the root
    saves before the loss (the loss runs outside the context in torchtune's recipes); the
    output layer runs under ``NoOpManager`` (``get_act_offloading_ctx_manager``), so its
    saved input stays. Every other save of at least OFFLOAD_MIN_BYTES is offloaded, one host
    copy per save (torchtune's ``pack_tensor`` neither deduplicates nor skips a parameter's
    view). ``root_packs``: saves of the root that are no activation of the lists (the
    embedding's indices), before the blocks. The rotary tables are the blocks' saves
    (``rope_saves``, or the checkpoint's inputs in ``kept_list``), not the root's; on the GPU
    they are freed with the forward's last reference (``offload_root``).

    ``trl``: TRL's copy of the class keeps a repeated save on the GPU (``_trl_repeats``) and
    its ``__exit__`` synchronises and empties the forward stash, so nothing of it is left
    at the loss's backward (the stash at the loss's forward is not counted)."""
    def big(x: Saved) -> bool:
        return x.nbytes >= OFFLOAD_MIN_BYTES

    small = sum(x.nbytes for x in kept_list if not big(x))
    before = [x for x in root if x.name.startswith(("embed_norm", "embed.", "rope.")) and big(x)]
    after = [x for x in root if not x.name.startswith(("embed_norm", "embed.", "rope.",
                                                       "lm_head.")) and big(x)]
    block = _block_packs(kept_list, per_op, weights or {}, list(rope_saves))
    final = _block_packs(after, True, {}, [])  # the final norm is never checkpointed
    final_kept = tables = 0
    if trl:
        block, repeats = _trl_repeats(block)
        small += repeats
        final, final_kept = _trl_repeats(final)
        # the first block's saves of the tables are copied once; they stay on the GPU
        tables = sum(x.nbytes for x in before if x.name.startswith("rope."))
        before = [x for x in before if not x.name.startswith("rope.")]
    # forward order: the root's first tensors, every block's, the final norm's
    head = [("root", "root.input", n) for n in root_packs] + [
        ("root", x.name, x.nbytes) for x in before if not x.name.startswith("rope.")]
    order = [(p, True) for p in head] + [(p, False) for p in block] * n_layers \
        + [(p, True) for p in final]
    order = [(p, r) for p, r in order if p[2] >= OFFLOAD_MIN_BYTES]
    stash = [] if trl else order[-OFFLOAD_FWD_STASH:]
    # the stash holds GPU tensors: a tensor saved twice in it is one storage
    held: dict[tuple[str, bool], int] = {(p[1], r): p[2] for p, r in stash}
    return {"offload_small_per_block": small,
            "offload_stash": sum(n for (_, r), n in held.items() if not r),
            "offload_stash_root": sum(n for (_, r), n in held.items() if r),
            "offload_root": sum(x.nbytes for x in before + after) - final_kept,
            "offload_root_before": sum(x.nbytes for x in before),
            "offload_host": sum(p[2] for p, _ in order) + tables,
            "offload_back": _pair_peak(block, n_layers)}


__all__ = ["AmpRegime", "ActivationPlan", "Saved", "plan_activations", "regime_for"]
