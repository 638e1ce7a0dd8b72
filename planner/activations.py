"""Activation memory of one training step, counted tensor by tensor.

What autograd keeps between forward and backward is the set of tensors each op saves for its
backward (``derivatives.yaml`` in PyTorch names them per op). The counts below walk the
reference block of ``probes/models.py`` op by op and list every saved tensor with its dtype;
storage shared by several ops (q/k/v reading one normed input) is counted once. The approach
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
from dataclasses import dataclass

from planner.spec import (
    Attention,
    Checkpointing,
    LossKind,
    ModelSpec,
    NormKind,
    PositionKind,
    Precision,
)

FP32 = 4
# LayerNorm / RMSNorm per-row statistics (mean, rstd): fp32 on CUDA (acc type).
STAT = 4


class AmpRegime(enum.StrEnum):
    AUTOCAST = "autocast"
    MODULE = "module"


@dataclass(frozen=True, slots=True)
class Saved:
    """One tensor autograd keeps for backward."""

    name: str
    nbytes: int


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
    notes: tuple[str, ...] = ()

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
            kept_logits=int(self.kept_logits * k))

    @property
    def block_bytes(self) -> int:
        return sum(s.nbytes for s in self.block_saved)

    @property
    def root_bytes(self) -> int:
        return sum(s.nbytes for s in self.root_saved)

    @property
    def saved_total(self) -> int:
        """Activations alive at the end of forward."""
        return self.block_kept * self.n_layers + self.root_bytes


def regime_for(precision: Precision, uses_autocast: bool) -> tuple[AmpRegime, int, int]:
    """(regime, c, r): the compute-dtype bytes and the residual-stream bytes."""
    if precision.amp and uses_autocast:
        return AmpRegime.AUTOCAST, 2, FP32
    c = precision.compute_bytes
    return AmpRegime.MODULE, c, c


def _norm(prefix: str, model: ModelSpec, t: int, regime: AmpRegime, c: int, r: int) -> list[Saved]:
    """A norm over an input of dtype r (residual stream or branch output)."""
    h = model.hidden
    if model.norm is NormKind.RMSNORM:
        # HF LlamaRMSNorm: h32 = x.to(fp32) [saved by pow and mul; the input itself when r == 4]
        # n = h32 * rsqrt(var + eps) [rsqrt saved], then weight * n.to(x.dtype) saves the cast.
        return [
            Saved(f"{prefix}.input_fp32", FP32 * t * h),
            Saved(f"{prefix}.rstd", FP32 * t),
            Saved(f"{prefix}.normed", r * t * h),
        ]
    # nn.LayerNorm: saves its input and per-row mean/rstd. Under CUDA autocast layer_norm is an
    # fp32 op: a bf16 input (a branch output) is cast up first and the fp32 copy is saved.
    in_bytes = FP32 if regime is AmpRegime.AUTOCAST else r
    return [
        Saved(f"{prefix}.input", in_bytes * t * h),
        Saved(f"{prefix}.mean_rstd", 2 * STAT * t),
    ]


def block_saved(model: ModelSpec, t: int, batch: int, seq: int, attention: Attention,
                regime: AmpRegime, c: int, r: int) -> list[Saved]:
    h, f = model.hidden, model.ffn_hidden
    qd, kvd, nh = model.q_dim, model.kv_dim, model.n_heads
    autocast = regime is AmpRegime.AUTOCAST
    out: list[Saved] = []

    # --- attention branch -------------------------------------------------------------
    out += _norm("norm1", model, t, regime, c, r)
    # The norm output has dtype r (RMSNorm: weight(fp32 under autocast) * cast); q, k, v read it.
    norm_out = r if model.norm is NormKind.RMSNORM else (FP32 if autocast else r)
    if autocast and norm_out != c:
        for proj in ("q", "k", "v"):
            out.append(Saved(f"attn.{proj}.input_cast", c * t * h))
    else:
        out.append(Saved("attn.qkv.input", norm_out * t * h))
    # q, k, v come out of the linears in c. RoPE multiplies by cos/sin of the residual dtype:
    # under autocast the product is promoted to fp32 and sdpa/matmul casts it back to c
    # (a new tensor, saved); in module regime RoPE's output is c and saved directly.
    if model.position is PositionKind.ROPE and autocast:
        rope_note = ".rope_cast"
    else:
        rope_note = ""
    if attention is Attention.SDPA:
        # Flash-style SDPA saves q, k, v (GQA: k/v not expanded), out and the fp32
        # logsumexp (B, heads, T): aten/src/ATen/native/transformers/attention.cpp.
        out.append(Saved(f"sdpa.q{rope_note}", c * t * qd))
        out.append(Saved(f"sdpa.k{rope_note}", c * t * kvd))
        out.append(Saved("sdpa.v", c * t * kvd))
        out.append(Saved("sdpa.out", c * t * qd))
        out.append(Saved("sdpa.logsumexp", FP32 * batch * nh * seq))
        # out is (B, T, heads, d) in memory, so transpose(1, 2).reshape is a view that
        # attn.o saves without a copy.
    else:
        # Eager: k, v repeated to n_heads for GQA (repeat_interleave copies), scores
        # s = q @ k^T * scale (not saved), causal masked_fill (bool mask shared across
        # layers), softmax in fp32 (output saved), cast to c (saved by p @ v),
        # o = p @ v, then transpose+reshape copies o for attn.o.
        scores = batch * nh * seq * seq
        out.append(Saved(f"attn.q{rope_note}", c * t * qd))
        out.append(Saved("attn.k_expanded" if kvd != qd else f"attn.k{rope_note}", c * t * qd))
        out.append(Saved("attn.v_expanded" if kvd != qd else "attn.v", c * t * qd))
        out.append(Saved("attn.probs_fp32", FP32 * scores))
        if model.dropout:
            # dropout(probs): p @ v saves the dropped copy; native_dropout keeps a bool mask
            # (aten/src/ATen/native/Dropout.cpp). Flash SDPA kernels keep only RNG state.
            out.append(Saved("attn.probs", c * scores))
            out.append(Saved("attn.probs_dropout_mask", scores))
        elif c != FP32:
            out.append(Saved("attn.probs", c * scores))  # the cast p @ v saves (none in fp32)
        out.append(Saved("attn.o.input", c * t * qd))
    if model.norms_per_layer >= 4:
        # Gemma-2 post-attention norm on the branch output (dtype c).
        out += _norm("norm3", model, t, regime, c, c)
    if model.dropout:
        out.append(Saved("attn.dropout_mask", t * h))  # on attn.o's output, before the add

    # --- MLP branch ---------------------------------------------------------------------
    if model.parallel_block and model.norms_per_layer == 1:
        mlp_in_bytes = None  # reads norm1's output, already saved above
    else:
        out += _norm("norm2", model, t, regime, c, r)
        mlp_in_bytes = norm_out
    n_in = 2 if model.mlp.gated else 1
    if mlp_in_bytes is not None:
        if autocast and mlp_in_bytes != c:
            for i in range(n_in):
                out.append(Saved(f"mlp.in{i}.input_cast", c * t * h))
        else:
            out.append(Saved("mlp.input", mlp_in_bytes * t * h))
    elif autocast and norm_out != c:
        for i in range(n_in):
            out.append(Saved(f"mlp.in{i}.input_cast", c * t * h))
    tokens = t * model.experts_per_token if model.is_moe else t
    if model.is_moe:
        e = model.n_experts
        # Router: logits (t, E) in fp32 softmax, top-k; dispatch buffer (E, C, h) with
        # C = t*k/E (capacity factor 1.0) is saved by the expert bmm.
        out.append(Saved("moe.router_probs", FP32 * t * e))
        out.append(Saved("moe.dispatched", c * tokens * h))
    if model.mlp.gated:
        # down(act(gate(m)) * up(m)): act saves gate's output, mul saves act's output and
        # up's output, down saves the product.
        out.append(Saved("mlp.gate_out", c * tokens * f))
        out.append(Saved("mlp.act_out", c * tokens * f))
        out.append(Saved("mlp.up_out", c * tokens * f))
        out.append(Saved("mlp.down.input", c * tokens * f))
    else:
        # down(gelu(up(m))): gelu saves up's output, down saves gelu's output.
        out.append(Saved("mlp.up_out", c * tokens * f))
        out.append(Saved("mlp.down.input", c * tokens * f))
    if model.is_moe:
        # Combine: expert outputs (E, C, h) gathered back and weighted (weights saved).
        out.append(Saved("moe.expert_out", c * tokens * h))
    if model.norms_per_layer >= 4:
        out += _norm("norm4", model, t, regime, c, c)
    if model.dropout:
        out.append(Saved("mlp.dropout_mask", t * h))
    return out


def mm_outputs(model: ModelSpec, t: int, c: int) -> list[Saved]:
    """A block's matmul outputs in execution order (q, k, v, o, then the MLP's)."""
    h, f = model.hidden, model.ffn_hidden
    out = [Saved("q.out", c * t * model.q_dim), Saved("k.out", c * t * model.kv_dim),
           Saved("v.out", c * t * model.kv_dim), Saved("o.out", c * t * h)]
    if model.is_moe:  # the router is a matmul; experts run as bmm (not saved by the policy)
        return out + [Saved("router.out", c * t * model.n_experts)]
    if model.mlp.gated:
        return out + [Saved("gate.out", c * t * f), Saved("up.out", c * t * f),
                      Saved("down.out", c * t * h)]
    return out + [Saved("up.out", c * t * f), Saved("down.out", c * t * h)]


def op_sac_kept(model: ModelSpec, t: int, batch: int, seq: int, attention: Attention,
                c: int, r: int) -> list[Saved]:
    """What selective (op-level) checkpointing keeps per block.

    PyTorch's selective activation checkpointing as torchtitan configures it
    (``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with the policy in
    torchtitan's ``parallelize_llama.py``, the default ``selective_ac_option = "op"``): inside
    each checkpointed block, the outputs of every other ``mm`` (the 1st, 3rd, ...) and of the
    flash/efficient SDPA kernel are saved, everything else is recomputed in backward. Kept:
    the block input (the checkpoint's input) plus those outputs. (Megatron's "selective",
    recompute the attention core only, is a different policy.)
    """
    kept = [Saved("block.input", r * t * model.hidden)]
    kept += [s for i, s in enumerate(mm_outputs(model, t, c)) if i % 2 == 0]
    if attention is Attention.SDPA:
        kept += [Saved("sdpa.out", c * t * model.q_dim),
                 Saved("sdpa.logsumexp", FP32 * batch * model.n_heads * seq)]
    return kept


def _sac_overlap(model: ModelSpec, saved: list[Saved], regime: AmpRegime) -> int:
    """Bytes of block_saved that are the very tensors SAC keeps (not recomputed twice)."""
    same = {"sdpa.v", "sdpa.out", "mlp.gate_out" if model.mlp.gated else "mlp.up_out"}
    if model.position is not PositionKind.ROPE and regime is AmpRegime.MODULE:
        same.add("sdpa.q")  # no RoPE: sdpa's q is q's matmul output itself
    return sum(s.nbytes for s in saved if s.name in same)


def root_saved(model: ModelSpec, t: int, seq: int, regime: AmpRegime, c: int, r: int) -> list[Saved]:
    h = model.hidden
    autocast = regime is AmpRegime.AUTOCAST
    out: list[Saved] = []
    if model.embedding_norm:
        out += _norm("embed_norm", model, t, regime, c, r)
    if model.dropout:
        out.append(Saved("embed.dropout_mask", t * h))
    if model.position is PositionKind.ROPE:
        # cos and sin (T, head_dim), computed once per forward in the residual dtype and
        # saved by every block's RoPE multiply (shared storage).
        out.append(Saved("rope.cos_sin", 2 * r * seq * model.d_head))
    if model.encoder_head:
        # BERT MLM head: dense -> gelu -> norm -> decoder; the pooler reads token 0 only.
        out += [Saved("head.dense.input", (c if autocast else r) * t * h),
                Saved("head.gelu.input", c * t * h)]
        out += _norm("head.norm", model, t, regime, c, c)
        out.append(Saved("lm_head.input", c * t * h))
    else:
        out += _norm("final_norm", model, t, regime, c, r)
        norm_out = r if model.norm is NormKind.RMSNORM else (FP32 if autocast else r)
        name = "lm_head.input_cast" if autocast and norm_out != c else "lm_head.input"
        out.append(Saved(name, (c if autocast else norm_out) * t * h))
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


def loss_terms(model: ModelSpec, t: int, c: int, r: int, loss: LossKind, chunks: int) -> LossTerms:
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
    """
    v, h = model.vocab, model.hidden
    logits = c * t * v
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
                     backward=2 * FP32 * t * v, kept_logits=logits + upcast)


@functools.lru_cache(maxsize=4096)
def plan_activations(model: ModelSpec, *, batch: int, seq: int, precision: Precision,
                     attention: Attention, checkpointing: Checkpointing,
                     uses_autocast: bool, loss: LossKind = LossKind.FP32, loss_chunks: int = 8,
                     keep_logits: bool = False, compiled: bool = False) -> ActivationPlan:
    t = batch * seq
    regime, c, r = regime_for(precision, uses_autocast)
    saved = block_saved(model, t, batch, seq, attention, regime, c, r)
    block_total = sum(s.nbytes for s in saved)
    h, f = model.hidden, model.ffn_hidden
    tokens = t * model.experts_per_token if model.is_moe else t
    notes: list[str] = []
    if checkpointing is Checkpointing.FULL:
        # Only the block input is kept (non-reentrant checkpoint holds its inputs); in
        # backward one block is recomputed at a time.
        kept = r * t * h
        recompute = block_total
    elif checkpointing is Checkpointing.SELECTIVE:
        kept = sum(x.nbytes for x in op_sac_kept(model, t, batch, seq, attention, c, r))
        # in backward the block is re-run: everything it saves comes back, except what the
        # policy kept (already counted in `kept`)
        recompute = block_total - _sac_overlap(model, saved, regime)
    else:
        kept = block_total
        recompute = 0
        if compiled:
            # torch.compile: what AOTAutograd's min-cut partitioner saves (planner/compiled.py)
            from planner.compiled import saved_bytes

            measured = saved_bytes(model, batch=batch, seq=seq, autocast=uses_autocast and
                                   precision.amp, attention=attention)
            if measured is None:
                notes.append("compiled block's saved set not measured for this architecture "
                             "(MoE or an unlisted block family): eager activations counted")
            else:
                saved, kept = [Saved("compiled.block", measured)], measured
    lt = loss_terms(model, t, c, r, loss, loss_chunks)
    # Inside one block's backward: the grad flowing in (residual dtype), the grad of the
    # branch output and the largest pair of MLP intermediate grads.
    ff = (2 if model.mlp.gated else 1) * c * tokens * f
    block_bwd = 2 * r * t * h + ff
    return ActivationPlan(
        block_saved=tuple(saved),
        block_kept=kept,
        root_saved=tuple(root_saved(model, t, seq, regime, c, r)) + (lt.saved,),
        recompute=recompute,
        loss_forward_transient=lt.forward,
        loss_backward_transient=lt.backward,
        block_backward_transient=block_bwd,
        n_layers=model.n_layers,
        residual_bytes=r,
        kept_logits=lt.kept_logits if keep_logits else 0,
        notes=tuple(notes),
    )


__all__ = ["AmpRegime", "ActivationPlan", "Saved", "plan_activations", "regime_for"]
