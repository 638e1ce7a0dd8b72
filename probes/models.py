"""The reference transformer that the trace probes run and the planner counts.

``build_model(spec)`` returns a plain PyTorch module whose ``named_parameters()`` equals
``planner.params.param_tensors(spec)`` exactly (names, order, shapes). The forward is written
out op by op (nothing fused, no dropout) because the planner counts its saved activations
tensor by tensor:

Root ``forward(input_ids (B,T) int64, targets (B,T) int64) -> scalar loss``::

    x = embed(ids) [+ pos_embed(arange(T))] [+ type_embed(zeros)] ; [x = embed_norm(x)]
    RoPE:  cos, sin computed ONCE per forward: (T, d_head), fp32 from the non-persistent
           ``rope_inv_freq`` buffer, then ``.to(x.dtype)``
    ALiBi: the (n_heads, T, T) bias computed ONCE per forward (causal -inf folded in), dtype x
    eager + causal: one (T, T) bool mask computed once per forward
    x = block_i(x, ...) for every block
    decoder head:  logits = lm_head(final_norm(x))   (tied: F.linear(x, embed.weight))
    encoder head:  pooled = tanh(pooler(x[:, 0]))    (kept in the graph via + 0 * pooled.sum())
                   logits = F.linear(head.norm(gelu(head.dense(x))), embed|lm_head.weight,
                                     lm_head.bias)
    loss = F.cross_entropy(logits.float().view(-1, V), targets.view(-1))
    (``configure(loss=...)``: "bf16" without the upcast; "chunked" torchtune's chunked head
    and loss; "fused" Liger's fused linear cross-entropy; ``keep_logits``: the head's output
    held in ``held`` for the loop)

Block (pre-norm)::

    a = norm1(x)
    q, k, v = attn.q(a), attn.k(a), attn.v(a) viewed (B, T, heads, d_head)
    RoPE: q = q * cos + rotate_half(q) * sin ; same for k   (cos/sin as (1, T, 1, d_head))
    -- attention core (selective AC recomputes exactly this) --
    q, k, v -> (B, heads, T, d_head)
    sdpa:  o = F.scaled_dot_product_attention(q, k, v, is_causal=not encoder,
                                              enable_gqa=n_kv < n_heads)
           (ALiBi: attn_mask=bias, is_causal=False)
    eager: k, v = repeat_interleave(., n_heads // n_kv, dim=1)   (only for GQA/MQA)
           s = (q @ k^T) * d_head**-0.5 ; [s = s + alibi] ; [s = s.masked_fill(mask, -inf)]
           p = softmax(s, -1, dtype=fp32).to(q.dtype) ; o = p @ v
    o = o.transpose(1, 2).reshape(B, T, q_dim)
    -- end of attention core --
    attn_out = attn.o(o) ; [attn_out = norm3(attn_out)]   (4 norms)
    parallel block: x = x + attn_out + mlp(a if norms_per_layer == 1 else norm2(x_in))
    sequential:     x = x + attn_out ; mlp_out = mlp(norm2(x)) ; [norm4(mlp_out)] ; x + mlp_out
    (a sequential block with a single norm reuses norm1 for the MLP input)

MLP: ``gelu: down(gelu_tanh(up(m)))``; ``swiglu: down(silu(gate(m)) * up(m))``;
``geglu: down(gelu_tanh(gate(m)) * up(m))``. The part between the up/gate projections and
``down`` is the "activation product" (selective AC recomputes exactly this).

MoE MLP (n_experts E > 1, top-k routing, static shapes so FakeTensor can trace it)::

    xt = m.reshape(N, h)                       N = B * T tokens
    r  = xt @ router.weight.T                  (N, E) logits
    probs = softmax(r, -1, dtype=fp32) ; w, idx = probs.topk(k)   w renormalised to sum 1
    capacity C = ceil(N * k / E) (capacity factor 1.0); assignments are taken token-major,
    an assignment's slot in its expert is its running count (one_hot + cumsum); those past
    C are dropped (they go to a spare row E*C on dispatch and get weight 0 on combine)
    xe = zeros(E*C + 1, h).index_add(0, slot, xt.repeat_interleave(k, 0))[:E*C].view(E,C,h)
    g = bmm(xe, w_gate^T) ; u = bmm(xe, w_up^T) ; y = bmm(act(g) * u, w_down^T)   (E, C, h)
    out = (y.view(E*C, h)[slot] * w * kept).view(N, k, h).sum(1).view(B, T, h)

Dropout (``spec.dropout`` p > 0, training mode only; GPT-2/BERT presets use 0.1) runs as
``aten.native_dropout`` (CUDA's path: a bool mask is saved; CPU's F.dropout would save an
input-dtype noise tensor instead) on: the embeddings (after embed_norm); the attention
probabilities (eager: after the cast to q's dtype; sdpa: not applied, because PyTorch's CPU
SDPA falls back to the math path with ``dropout_p > 0`` and would materialise the T x T
scores, while the CUDA flash/efficient kernels keep only the RNG seed/offset, i.e. the memory
of dropout-free SDPA); the attention branch output (after norm3, before the residual add);
the MLP branch output (after norm4, before the add). With dropout, checkpoints preserve the
RNG state so recomputation draws the same masks.

Norms: RMSNorm is exactly Hugging Face's LlamaRMSNorm (fp32 upcast inside, weight applied to
the down-cast result); LayerNorm is ``nn.LayerNorm`` (weight + bias). eps 1e-6 / 1e-5.

Activation checkpointing (``torch.utils.checkpoint``, ``use_reentrant=False``,
``preserve_rng_state`` only with dropout), set per model with ``checkpointing``:

* ``full``: each block's whole forward is one checkpoint: only the block input (plus the
  per-forward cos/sin/mask shared by all blocks) is kept; everything is recomputed in backward.
* ``selective`` with ``selective_policy="regions"``: two checkpoints per block:
  (1) the attention core: from q, k, v after RoPE to ``o`` reshaped to (B, T, q_dim), i.e. the
      transposes, the GQA repeat, scores/probabilities (eager) or the sdpa call, and the output
      transpose/reshape. Kept: q, k, v (post-RoPE, its inputs) and o (the input of attn.o).
  (2) the MLP activation product: ``act(up)`` or ``act(gate) * up`` (for MoE likewise on the
      (E, C, f) expert tensors). Kept: the gate/up outputs (its inputs) and its result (the
      input of ``down``).
  Every linear layer's input and output that feed a matmul stay saved; norms, RoPE, residual
  adds, routing/dispatch are not recomputed. This is ``selective_policy="regions"``
  (Megatron-style; kept for comparison, not what the planner models).
* ``selective`` with ``selective_policy="op"`` (the default): torchtitan's op-level selective
  AC, the policy ``planner/activations.py`` models: the whole block is one checkpoint under
  ``create_selective_checkpoint_contexts`` with torchtitan's policy (``_op_sac_policy``) and
  save list (``sac_list``: "current", torchtitan since 2026-03-23, or "pre-2026-03-23"): the
  outputs of every other ``aten.mm`` and of the SDPA kernel are saved, under "current" also
  every ``addmm`` (a biased linear), ``bmm`` and ``topk``; everything else is recomputed.

``checkpoint_context`` (a callable returning a pair of context managers) is handed to
``torch.utils.checkpoint`` as ``context_fn``; the trace uses it to re-enter the CUDA-autocast
emulation during recomputation (real autocast is re-entered by checkpoint itself).

MoE experts: with bf16 operands they run as ``fitcheck::grouped_expert_mm`` (``_expert_mm``), an
op standing for torchtitan's ``torch._grouped_mm``: ``bmm``'s forward, saved tensors and backward,
but not ``aten.bmm`` for selective checkpointing's save lists (the current one saves ``bmm``,
neither saves ``_grouped_mm``).

MoE parameter order: ``param_tensors`` lists ``mlp.router.weight`` before the module's own
``mlp.w_gate/w_up/w_down``, while ``nn.Module`` yields a module's own parameters before its
children's; ``MoEMLP.named_modules`` therefore yields the router first (this only changes
iteration order, nothing else).
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.spec import Checkpointing, MlpKind, ModelSpec, NormKind, PositionKind

__all__ = ["build_model", "Transformer", "init_weights"]

_RMS_EPS = 1e-6
_LN_EPS = 1e-5


class RMSNorm(nn.Module):
    """Hugging Face LlamaRMSNorm."""

    def __init__(self, hidden: int, eps: float = _RMS_EPS) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dt)


def make_norm(spec: ModelSpec) -> nn.Module:
    if spec.norm is NormKind.RMSNORM:
        return RMSNorm(spec.hidden)
    return nn.LayerNorm(spec.hidden, eps=_LN_EPS)


def dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``F.dropout`` as it runs on CUDA: ``aten.native_dropout``, which saves a bool mask.
    (On CPU ``F.dropout`` multiplies by an input-dtype noise tensor and saves that instead.)"""
    return torch.native_dropout(x, p, True)[0]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _no_ctx() -> tuple[nullcontext, nullcontext]:
    return nullcontext(), nullcontext()


class _BothContexts:
    """Enter two context managers (in order), exit them in reverse."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        try:
            self.second.__enter__()
        except BaseException:
            self.first.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.second.__exit__(*exc)
        finally:
            self.first.__exit__(*exc)
        return False


# torchtitan's op-level SAC save lists (``--sac-list``, planner.spec.SacList; docs/model.md §5.6).
#
# "pre-2026-03-23": the per-model ``_op_sac_save_list`` (torchtitan/models/llama3/infra/
# parallelize.py and its siblings) before 114151ad4 (#2357, 2026-03-23), as of torchtitan
# b39377f9f (#2095, 2025-12-01: "add all SDPA backends to op_sac_save_list"): every SDPA
# backend's op, not only flash / efficient. Before that commit a cuDNN-dispatched SDPA was
# recomputed in backward, and torch prefers cuDNN's kernel on SM 9.x / 10.x with cuDNN > 9.15
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, ``check_prefer_cudnn_attention``):
# the H100 / H200 runs of 2026-11-26 (torch 2.11, cuDNN 9.19) took this list without cuDNN's
# op and kept no attention output (docs/accuracy.md, GPU section). The math and "overrideable"
# ops are CompositeImplicit / PrivateUse1 ops that a CPU or CUDA trace never shows the policy;
# they are listed because torchtitan lists them. ``_scaled_dot_product_flash_attention_for_cpu``
# is what the CPU trace dispatches to (in both lists: it stands for CUDA's flash op).
OP_SAC_SAVE_OPS = (
    "aten.mm.default",
    "aten._scaled_dot_product_efficient_attention.default",
    "aten._scaled_dot_product_flash_attention.default",
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "aten.max.default",
)

# "current": torchtitan/distributed/activation_checkpoint.py ``_get_default_save_ops`` (at
# b5bcd76; since 114151ad4, 2026-03-23): the ``.default`` overload of every op in torch's
# ``torch._functorch.partitioners.get_default_op_list().compute_intensive_ops`` (torch 2.13:
# mm, addmm, bmm, _scaled_mm, convolution, convolution_backward, the flash / efficient SDPA and
# attention-forward ops, upsample_bilinear2d; read at trace time, as torchtitan does), plus
# these (``aten.topk`` since 7074b056a, #3146, 2026-05-26); ``aten._grouped_mm`` is in neither.
OP_SAC_SAVE_OPS_CURRENT_EXTRA = (
    "aten._scaled_dot_product_cudnn_attention.default",
    "aten._scaled_dot_product_attention_math.default",
    "aten._scaled_dot_product_fused_attention_overrideable.default",
    "aten._scaled_dot_product_flash_attention_for_cpu.default",
    "aten.max.default",
    "aten.linear.default",
    "aten.topk.default",
    "_c10d_functional.reduce_scatter_tensor.default",
    "_c10d_functional.all_to_all_single.default",
)

SAC_LISTS = ("current", "pre-2026-03-23")


def sac_save_ops(sac_list: str = "current") -> tuple[str, ...]:
    """The names (``namespace.op.overload``) of the ops ``sac_list`` saves."""
    if sac_list == "pre-2026-03-23":
        return OP_SAC_SAVE_OPS
    if sac_list != "current":
        raise ValueError(f"sac_list must be one of {', '.join(SAC_LISTS)}, not {sac_list!r}")
    from torch._functorch.partitioners import get_default_op_list

    # each an OpOverloadPacket; torchtitan saves its ``.default`` overload
    torch_ops = sorted(op.default.name().replace("::", ".") + ".default"
                       for op in get_default_op_list().compute_intensive_ops)
    return tuple(dict.fromkeys(torch_ops + list(OP_SAC_SAVE_OPS_CURRENT_EXTRA)))


def _resolve_ops(names) -> set:
    """The ``torch.ops`` overloads named (``namespace.op.overload``); one this torch build
    lacks is left out (as torchtitan resolves its conditional ops)."""
    out = set()
    for name in names:
        obj = torch.ops
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except (AttributeError, RuntimeError):
            continue
        out.add(obj)
    return out


def _op_sac_policy(meta: dict[str, int], sac_list: str = "current",
                   force_shapes: frozenset = frozenset()):
    """torchtitan's op-level selective AC policy (``SelectiveAC._wrap_block``'s
    ``wrapped_policy`` at b5bcd76; ``_get_custom_policy`` in the per-model era): save the
    outputs of the ops of ``sac_list`` (``sac_save_ops``), except every second ``mm`` /
    ``linear`` (the 1st, 3rd, ... kept, counted apart in forward and in recompute); recompute
    everything else. ``force_shapes``: ``force_recompute_mm_shapes_by_fqns`` resolved to
    (in, out) weight shapes (an mm whose right operand has one is recomputed and not counted:
    activation_checkpoint.py:260-267). Not reproduced: the CUDA-to-CPU ``_to_copy`` it saves
    (no such copy in the reference blocks)."""
    from torch.utils.checkpoint import CheckpointPolicy

    mm_ops = {torch.ops.aten.mm.default, torch.ops.aten.linear.default}
    save = _resolve_ops(sac_save_ops(sac_list))

    def policy(ctx, func, *args, **kwargs):
        key = "recompute_mm_count" if ctx.is_recompute else "forward_mm_count"
        if func in mm_ops:
            if force_shapes:
                shape = tuple(args[1].shape)
                if func is torch.ops.aten.linear.default:  # weight (out, in)
                    shape = shape[::-1]
                if shape in force_shapes:
                    return CheckpointPolicy.PREFER_RECOMPUTE
            meta[key] += 1
        to_save = func in save and not (func in mm_ops and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def torchtitan_force_shapes(block: nn.Module, index: int, entries) -> frozenset:
    """torchtitan's own resolution of ``force_recompute_mm_shapes_by_fqns`` on a real block
    (activation_checkpoint.py:226-237): every module whose ``layers.<index>.<name>`` contains
    an entry must be an ``nn.Linear`` (else ValueError, as torchtitan raises); its weight's
    (in, out). For a module whose names are not torchtitan's (a Hugging Face layer) the
    default ``moe.router.gate`` matches nothing, as it would there."""
    shapes = set()
    for name, sub in block.named_modules():
        if not any(e in f"layers.{index}.{name}" for e in entries):
            continue
        if not isinstance(sub, nn.Linear):
            raise ValueError("force_recompute_mm_shapes_by_fqns expected to match a nn.Linear, "
                             f"but got: {type(sub).__name__} at layers.{index}.{name}")
        out_f, in_f = sub.weight.shape
        shapes.add((int(in_f), int(out_f)))
    return frozenset(shapes)


def _op_sac_context_fn(extra: Callable[[], tuple], sac_list: str = "current",
                       force_shapes: frozenset = frozenset()) -> Callable[[], tuple]:
    sac_save_ops(sac_list)  # a bad name fails here, not inside the checkpoint

    def context_fn():
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        fwd, rec = create_selective_checkpoint_contexts(
            _op_sac_policy(defaultdict(int), sac_list, force_shapes))
        fwd2, rec2 = extra()
        return _BothContexts(fwd, fwd2), _BothContexts(rec, rec2)

    return context_fn


class _Ckpt:
    """Activation-checkpointing settings shared by all blocks of one model."""

    def __init__(self) -> None:
        self.mode: Checkpointing = Checkpointing.NONE
        self.context_fn: Callable[[], tuple] = _no_ctx
        self.preserve_rng = False  # True with dropout: recompute must draw the same masks

    def run(self, fn: Callable, *args: torch.Tensor) -> torch.Tensor:
        # the default context function is left out, not passed: torch.compile traces a
        # checkpoint only with none or one returning torch's dispatch modes
        extra = {} if self.context_fn is _no_ctx else {"context_fn": self.context_fn}
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=self.preserve_rng,
                          **extra)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        qkv_bias = spec.bias or spec.qkv_bias
        h = spec.hidden
        self.q = nn.Linear(h, spec.q_dim, bias=qkv_bias)
        self.k = nn.Linear(h, spec.kv_dim, bias=qkv_bias)
        self.v = nn.Linear(h, spec.kv_dim, bias=qkv_bias)
        self.o = nn.Linear(spec.q_dim, h, bias=spec.bias)
        self.n_heads = spec.n_heads
        self.n_kv = spec.n_kv_heads
        self.d_head = spec.d_head
        self.q_dim = spec.q_dim
        self.causal = not spec.encoder_head
        self.eager = False  # set by Transformer.configure
        self.dropout = spec.dropout

    def core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        alibi: torch.Tensor | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention core: post-RoPE (B, T, heads, d) q/k/v -> (B, T, q_dim)."""
        b, t = q.shape[0], q.shape[1]
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)
        gqa = self.n_kv < self.n_heads
        if self.eager:
            if gqa:
                rep = self.n_heads // self.n_kv
                k = torch.repeat_interleave(k, rep, dim=1)
                v = torch.repeat_interleave(v, rep, dim=1)
            s = (q @ k.transpose(-1, -2)) * self.d_head**-0.5
            if alibi is not None:
                s = s + alibi
            if mask is not None:
                s = s.masked_fill(mask, float("-inf"))
            p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
            if self.dropout and self.training:
                p = dropout(p, self.dropout)
            o = p @ v
        elif alibi is not None:
            # (dropout_p is left at 0: see the module docstring)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=alibi, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=gqa)
        return o.transpose(1, 2).reshape(b, t, self.q_dim)


class DenseMLP(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.kind = spec.mlp
        if spec.mlp.gated:
            self.gate = nn.Linear(h, f, bias=spec.bias)
        self.up = nn.Linear(h, f, bias=spec.bias)
        self.down = nn.Linear(f, h, bias=spec.bias)
        self.ckpt = _Ckpt()

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        if self.kind is MlpKind.GELU:
            u = self.up(m)
            if self.ckpt.mode is Checkpointing.SELECTIVE:
                a = self.ckpt.run(_act_gelu, u)
            else:
                a = _act_gelu(u)
        else:
            g = self.gate(m)
            u = self.up(m)
            fn = _act_swiglu if self.kind is MlpKind.SWIGLU else _act_geglu
            if self.ckpt.mode is Checkpointing.SELECTIVE:
                a = self.ckpt.run(fn, g, u)
            else:
                a = fn(g, u)
        return self.down(a)


def _act_gelu(u: torch.Tensor) -> torch.Tensor:
    return F.gelu(u, approximate="tanh")


def _act_swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def _act_geglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.gelu(g, approximate="tanh") * u


@torch.library.custom_op("fitcheck::grouped_expert_mm", mutates_args=())
def _grouped_expert_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """torchtitan's grouped expert matmul (``GroupedExperts``: ``torch._grouped_mm``) as an op
    of its own, computed and differentiated as ``bmm`` (module doc)."""
    return torch.bmm(x, w)


@_grouped_expert_mm.register_fake
def _(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], x.shape[1], w.shape[2])


def _grouped_expert_mm_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)  # bmm saves its two operands


def _grouped_expert_mm_backward(ctx, grad):
    x, w = ctx.saved_tensors
    return torch.bmm(grad, w.transpose(1, 2)), torch.bmm(x.transpose(1, 2), grad)


_grouped_expert_mm.register_autograd(_grouped_expert_mm_backward,
                                     setup_context=_grouped_expert_mm_setup)


def _expert_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(E, C, a) x (E, a, b) per expert. torchtitan runs ``torch._grouped_mm`` (bf16 only);
    selective checkpointing's current list saves ``bmm`` but not it, so with bf16 operands the
    experts run as ``fitcheck::grouped_expert_mm``: an op in no save list, whose forward and
    backward are ``bmm``'s (the kernel the H200 runs of this module measured; torch's CPU
    ``_grouped_mm`` fallback allocates otherwise in backward). Under the autocast emulation
    (fp32 weights) the experts stay ``bmm``, which the emulation casts."""
    if x.dtype == torch.bfloat16 and w.dtype == torch.bfloat16:
        return _grouped_expert_mm(x, w)
    return torch.bmm(x, w)


class MoEMLP(nn.Module):
    """Top-k routed experts with static-shape capacity dispatch (see the module docstring)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, e = spec.hidden, spec.ffn_hidden, spec.n_experts
        self.kind = spec.mlp
        self.n_experts = e
        self.top_k = spec.experts_per_token
        self.router = nn.Linear(h, e, bias=False)
        if spec.mlp.gated:
            self.w_gate = nn.Parameter(torch.empty(e, f, h))
        self.w_up = nn.Parameter(torch.empty(e, f, h))
        self.w_down = nn.Parameter(torch.empty(e, h, f))
        self.ckpt = _Ckpt()

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        # Router first, then this module (whose own parameters are the experts): matches the
        # order of planner.params.block_tensors.
        if memo is None:
            memo = set()
        yield from self.router.named_modules(
            memo, prefix + ("." if prefix else "") + "router", remove_duplicate
        )
        if self not in memo or not remove_duplicate:
            if remove_duplicate:
                memo.add(self)
            yield prefix, self

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        b, t, h = m.shape
        n, e, k = b * t, self.n_experts, self.top_k
        cap = -(-n * k // e)
        xt = m.reshape(n, h)
        r = xt @ self.router.weight.T
        probs = torch.softmax(r, dim=-1, dtype=torch.float32)
        w, idx = probs.topk(k, dim=-1)  # (N, k)
        w = w / w.sum(dim=-1, keepdim=True)
        # Position of each (token, choice) assignment inside its expert, token-major order.
        onehot = F.one_hot(idx.reshape(n * k), e)  # (N*k, E) int64
        pos = ((onehot.cumsum(0) - 1) * onehot).sum(-1)  # (N*k,)
        kept = pos < cap
        expert = idx.reshape(n * k)
        slot = torch.where(kept, expert * cap + pos, torch.full_like(pos, e * cap))
        src = xt.repeat_interleave(k, dim=0)  # (N*k, h)
        buf = xt.new_zeros(e * cap + 1, h).index_add(0, slot, src)
        xe = buf[: e * cap].view(e, cap, h)
        u = _expert_mm(xe, self.w_up.transpose(1, 2))
        sel = self.ckpt.mode is Checkpointing.SELECTIVE
        if self.kind is MlpKind.GELU:
            a = self.ckpt.run(_act_gelu, u) if sel else _act_gelu(u)
        else:
            g = _expert_mm(xe, self.w_gate.transpose(1, 2))
            fn = _act_swiglu if self.kind is MlpKind.SWIGLU else _act_geglu
            a = self.ckpt.run(fn, g, u) if sel else fn(g, u)
        y = _expert_mm(a, self.w_down.transpose(1, 2))  # (E, C, h)
        gathered = y.view(e * cap, h)[slot.clamp(max=e * cap - 1)]  # (N*k, h)
        weight = (w.reshape(n * k) * kept).to(gathered.dtype).unsqueeze(-1)
        out = (gathered * weight).view(n, k, h).sum(1)
        return out.view(b, t, h)


class Block(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.norm1 = make_norm(spec)
        self.attn = Attention(spec)
        self.n_norms = spec.norms_per_layer
        if spec.norms_per_layer >= 2:
            self.norm2 = make_norm(spec)
        if spec.norms_per_layer >= 4:
            self.norm3 = make_norm(spec)
            self.norm4 = make_norm(spec)
        self.mlp = MoEMLP(spec) if spec.is_moe else DenseMLP(spec)
        self.parallel = spec.parallel_block
        self.rope = spec.position is PositionKind.ROPE
        self.dropout = spec.dropout
        self.ckpt = _Ckpt()
        self.op_sac = False  # selective_policy "op": the whole block under torchtitan's SAC

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.dropout) if self.dropout and self.training else x

    def forward(self, x, cos=None, sin=None, alibi=None, mask=None):
        if self.ckpt.mode is Checkpointing.FULL or self.op_sac:
            return self.ckpt.run(self._forward, x, cos, sin, alibi, mask)
        return self._forward(x, cos, sin, alibi, mask)

    def _forward(self, x, cos, sin, alibi, mask):
        attn = self.attn
        a = self.norm1(x)
        b, t = a.shape[0], a.shape[1]  # the full sequence also under sequence parallel
        q = attn.q(a).view(b, t, attn.n_heads, attn.d_head)
        k = attn.k(a).view(b, t, attn.n_kv, attn.d_head)
        v = attn.v(a).view(b, t, attn.n_kv, attn.d_head)
        if self.rope:
            c = cos.view(1, t, 1, attn.d_head)
            s = sin.view(1, t, 1, attn.d_head)
            q = q * c + rotate_half(q) * s
            k = k * c + rotate_half(k) * s
        if self.ckpt.mode is Checkpointing.SELECTIVE:
            o = self.ckpt.run(attn.core, q, k, v, alibi, mask)
        else:
            o = attn.core(q, k, v, alibi, mask)
        attn_out = attn.o(o)
        if self.n_norms >= 4:
            attn_out = self.norm3(attn_out)
        attn_out = self._drop(attn_out)
        if self.parallel:
            m = a if self.n_norms == 1 else self.norm2(x)
            return x + attn_out + self._drop(self.mlp(m))
        x = x + attn_out
        m = self.norm2(x) if self.n_norms >= 2 else self.norm1(x)
        mlp_out = self.mlp(m)
        if self.n_norms >= 4:
            mlp_out = self.norm4(mlp_out)
        return x + self._drop(mlp_out)


class _LMHeadBias(nn.Module):
    """BERT's decoder: an optional (untied) weight and the output bias."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        if not spec.tied_embeddings:
            self.weight = nn.Parameter(torch.empty(spec.vocab, spec.hidden))
        self.bias = nn.Parameter(torch.zeros(spec.vocab))


class _MLMHead(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(spec.hidden, spec.hidden, bias=True)
        self.norm = make_norm(spec)


def _alibi_slopes(n_heads: int) -> list[float]:
    """BLOOM / press et al. slopes (geometric; interleaved for non-power-of-two head counts)."""

    def pow2(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return pow2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return pow2(closest) + pow2(2 * closest)[0::2][: n_heads - closest]


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        h = spec.hidden
        self.embed = nn.Embedding(spec.vocab, h)
        if spec.position is PositionKind.LEARNED:
            self.pos_embed = nn.Embedding(spec.max_positions, h)
        if spec.type_vocab:
            self.type_embed = nn.Embedding(spec.type_vocab, h)
        if spec.embedding_norm:
            self.embed_norm = make_norm(spec)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.n_layers))
        if spec.encoder_head:
            self.pooler = nn.Linear(h, h, bias=True)
            self.head = _MLMHead(spec)
            self.lm_head = _LMHeadBias(spec)
        else:
            self.final_norm = make_norm(spec)
            if not spec.tied_embeddings:
                self.lm_head = nn.Linear(h, spec.vocab, bias=False)
        if spec.position is PositionKind.ROPE:
            d = spec.d_head
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            self.register_buffer("rope_inv_freq", inv_freq, persistent=False)
        if spec.position is PositionKind.ALIBI:
            slopes = torch.tensor(_alibi_slopes(spec.n_heads), dtype=torch.float32)
            self.register_buffer("alibi_slopes", slopes, persistent=False)
        self.checkpointing = Checkpointing.NONE
        self.selective_policy = "op"
        self.sac_list = "current"
        self.attention = "sdpa"
        self.loss_kind = "fp32"
        self.loss_chunks = 8
        self.keep_logits = False
        self.held: list[torch.Tensor] = []
        """Logits the training loop holds (``keep_logits``): replaced by the next forward's
        (``pred = model(x)``), cleared by the trace after the optimizer step."""

    def configure(
        self,
        *,
        checkpointing: Checkpointing | str = Checkpointing.NONE,
        attention: str = "sdpa",
        context_fn: Callable[[], tuple] | None = None,
        selective_policy: str = "op",
        sac_list: str = "current",
        sac_force: tuple[str, ...] = (),
        loss: str = "fp32",
        loss_chunks: int = 8,
        keep_logits: bool = False,
    ) -> Transformer:
        """Set activation checkpointing (none/selective/full), the selective policy
        ("regions": attention core + MLP activation, "op": torchtitan's op-level SAC) and the
        attention kernel; ``sac_list``: the op save list of "op" (``sac_save_ops``);
        ``sac_force``: torchtitan's ``force_recompute_mm_shapes_by_fqns``, its torchtitan
        module names resolved to weight shapes as the planner resolves them
        (``planner.sac.forced_shapes``: this model's linears are torchtitan's under other
        names; the shape rule and the count are the policy's).
        ``context_fn`` is added to every checkpoint's contexts.
        ``loss`` (decoder head only): "fp32" ``cross_entropy(logits.float())``; "bf16"
        cross-entropy on the logits as computed; "chunked" torchtune's chunked output and
        loss over ``loss_chunks`` chunks of the sequence; "fused" Liger's fused linear
        cross-entropy (``_FusedLinearCrossEntropy``). ``keep_logits``: the loop holds the
        model's output (the head's output, or its chunks) through backward and the optimizer
        step, in ``held``."""
        if loss not in ("fp32", "bf16", "chunked", "fused"):
            raise ValueError(f"loss must be fp32, bf16, chunked or fused, not {loss!r}")
        if loss != "fp32" and self.spec.encoder_head:
            raise ValueError(f"loss {loss!r}: only decoder heads (no encoder head)")
        self.loss_kind = loss
        self.loss_chunks = int(loss_chunks)
        self.keep_logits = bool(keep_logits)
        mode = Checkpointing(checkpointing)
        if mode is Checkpointing.AUTO:
            raise ValueError("checkpointing 'auto' must be expanded before building the model")
        if selective_policy not in ("regions", "op"):
            raise ValueError(
                f"selective_policy must be 'regions' or 'op', not {selective_policy!r}"
            )
        self.checkpointing = mode
        self.selective_policy = selective_policy
        self.sac_list = sac_list
        self.attention = str(attention)
        extra = context_fn or _no_ctx
        op_sac = mode is Checkpointing.SELECTIVE and selective_policy == "op"
        from planner.sac import forced_shapes

        shapes = forced_shapes(self.spec, sac_force)  # no dense blocks here (build_model)
        for blk in self.blocks:
            blk.op_sac = op_sac
            for ck in (blk.ckpt, blk.mlp.ckpt):
                ck.mode = Checkpointing.NONE if op_sac else mode
                ck.context_fn = extra
                ck.preserve_rng = self.spec.dropout > 0
            if op_sac:
                blk.ckpt.context_fn = _op_sac_context_fn(extra, sac_list, shapes)
            blk.attn.eager = self.attention == "eager"
        return self

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        spec = self.spec
        b, t = input_ids.shape
        x = self.embed(input_ids)
        if spec.position is PositionKind.LEARNED:
            x = x + self.pos_embed(torch.arange(t, device=input_ids.device))
        if spec.type_vocab:
            x = x + self.type_embed(torch.zeros_like(input_ids))
        if spec.embedding_norm:
            x = self.embed_norm(x)
        if spec.dropout and self.training:
            x = dropout(x, spec.dropout)
        cos = sin = alibi = mask = None
        causal = not spec.encoder_head
        if spec.position is PositionKind.ROPE:
            pos = torch.arange(t, device=x.device, dtype=torch.float32)
            freqs = torch.outer(pos, self.rope_inv_freq.float())
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos().to(x.dtype)
            sin = emb.sin().to(x.dtype)
        eager = self.attention == "eager"
        if causal and (eager or spec.position is PositionKind.ALIBI):
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        if spec.position is PositionKind.ALIBI:
            rel = torch.arange(t, device=x.device, dtype=torch.float32)
            rel = rel.view(1, t) - rel.view(t, 1)  # j - i
            alibi = self.alibi_slopes.float().view(-1, 1, 1) * rel
            if not eager and causal:
                alibi = alibi.masked_fill(mask, float("-inf"))
                mask = None
            alibi = alibi.to(x.dtype)
        if not eager:
            mask = None
        for blk in self.blocks:
            x = blk(x, cos, sin, alibi, mask)
        if spec.encoder_head:
            pooled = torch.tanh(self.pooler(x[:, 0]))
            hd = self.head.norm(F.gelu(self.head.dense(x), approximate="tanh"))
            w = self.embed.weight if spec.tied_embeddings else self.lm_head.weight
            logits = F.linear(hd, w, self.lm_head.bias)
        else:
            x = self.final_norm(x)
            if self.loss_kind != "fp32":
                return self._loss_variant(x, targets)
            if spec.tied_embeddings:
                logits = F.linear(x, self.embed.weight)
            else:
                logits = self.lm_head(x)
            if self.keep_logits:
                # the loop holds the model's output (torchtitan's train step kept ``pred``
                # through backward and the step before it added ``del pred``; HF's
                # ``outputs.logits``); the loss's fp32 copy is freed once log_softmax has run
                # (autograd saves its output, and ``_to_copy`` saves nothing)
                self.held = [logits]
        loss = F.cross_entropy(logits.float().view(-1, spec.vocab), targets.view(-1))
        if spec.encoder_head:
            loss = loss + 0.0 * pooled.sum()  # keeps the pooler in the graph (BERT's NSP head)
        return loss


    def _head(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.embed.weight) if self.spec.tied_embeddings else self.lm_head(x)

    def _loss_variant(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The output head and cross-entropy for ``loss_kind`` bf16 / chunked / fused (see
        ``configure``); ``x`` is the final norm's output (B, T, h)."""
        v = self.spec.vocab
        if self.loss_kind == "bf16":
            logits = self._head(x)
            if self.keep_logits:
                self.held = [logits]
            return F.cross_entropy(logits.view(-1, v), targets.view(-1))
        if self.loss_kind == "chunked":
            # torchtune: TransformerDecoder(num_output_chunks=N) returns
            # [output(chunk) for chunk in h.chunk(N, dim=1)]; CEWithChunkedOutputLoss sums
            # F.cross_entropy(chunk.float(), labels, reduction="sum") over the chunks and
            # divides by the number of tokens (torchtune/modules/loss/ce_chunked_output_loss.py)
            chunks = [self._head(c) for c in x.chunk(self.loss_chunks, dim=1)]
            if self.keep_logits:
                self.held = list(chunks)
            total = None
            for lc, tc in zip(chunks, targets.chunk(self.loss_chunks, dim=1)):
                part = F.cross_entropy(lc.reshape(-1, v).float(), tc.reshape(-1),
                                       reduction="sum")
                total = part if total is None else total + part
            del chunks
            return total / targets.numel()
        # fused (Liger)
        w = self.embed.weight if self.spec.tied_embeddings else self.lm_head.weight
        return _FusedLinearCrossEntropy.apply(x.reshape(-1, x.shape[-1]), w, targets.reshape(-1))


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger-Kernel's ``LigerFusedLinearCrossEntropyFunction`` (liger_kernel/ops/
    fused_linear_cross_entropy.py, ``fused_linear_cross_entropy_forward``), with the same
    allocations: ``grad_input = zeros_like(input)``, ``grad_weight = zeros_like(weight)``,
    a (BT,) fp32 per-token loss; per chunk of ``next_pow2(ceil(BT / ceil(V / H)))`` tokens,
    ``logits_chunk = input_chunk @ weight.T`` (its Triton kernel turns it into its own
    gradient in place: no new tensor), ``grad_input[chunk] = logits_chunk @ weight`` and
    ``addmm(grad_weight, logits_chunk.T, input_chunk, out=grad_weight)``. Forward saves
    grad_input and grad_weight; backward returns them (Liger scales them in place only when
    the incoming gradient is not 1.0, a data-dependent test skipped on fake tensors)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor):
        n, h = x.shape
        v = weight.shape[0]
        ratio = -(-v // h)
        chunk = 1 << max(0, (-(-n // ratio) - 1).bit_length())
        grad_x = torch.zeros_like(x)
        grad_w = torch.zeros_like(weight) if weight.requires_grad else None
        loss_1d = torch.zeros(n, dtype=torch.float32, device=x.device)
        for s in range(0, n, chunk):
            xc = x[s:s + chunk]
            logits = xc @ weight.t()  # (chunk, V); becomes its own gradient in place
            loss_1d[s:s + chunk] = 0.0
            grad_x[s:s + chunk] = logits @ weight
            if grad_w is not None:
                torch.addmm(grad_w, logits.t(), xc, out=grad_w)
            del logits
        loss = loss_1d.sum()
        ctx.save_for_backward(grad_x.detach(),
                              grad_w.detach() if grad_w is not None else None)
        return loss

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_x, grad_w = ctx.saved_tensors
        return grad_x, grad_w, None


@torch.no_grad()
def init_weights(model: Transformer, std: float = 0.02) -> Transformer:
    """Give real (non-meta) tensors sensible values: normal(0, std) matrices, unit norms."""
    spec = model.spec
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if p.dim() >= 2:
            p.normal_(0.0, std)
        elif "norm" in name and leaf == "weight":
            p.fill_(1.0)
        else:
            p.zero_()
    if spec.position is PositionKind.ROPE:
        d = spec.d_head
        model.rope_inv_freq.copy_(
            1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        )
    if spec.position is PositionKind.ALIBI:
        model.alibi_slopes.copy_(torch.tensor(_alibi_slopes(spec.n_heads)))
    return model


def build_model(
    spec: ModelSpec,
    *,
    device: str | torch.device = "meta",
    checkpointing: Checkpointing | str = Checkpointing.NONE,
    attention: str = "sdpa",
    selective_policy: str = "op",
) -> Transformer:
    """The reference module for ``spec``; on a real device its weights are initialised."""
    with torch.device(device):
        model = Transformer(spec)
    if torch.device(device).type != "meta":
        init_weights(model)
    return model.configure(
        checkpointing=checkpointing, attention=attention, selective_policy=selective_policy
    )



# --------------------------------------------------------------------------- what it can build

_HF_ONLY_SAVES = ("python_gelu", "fused_qkv", "fused_gate_up", "attn_softcap", "final_softcap",
                  "partial_rotary", "norm_weight_fp32", "router_fp32")
"""ModelSpec fields that describe how a Hugging Face class computes (what it saves), not its
parameters: the reference module computes its own way (fused GELU, separate projections, no
softcapping, full RoPE, Llama's norms, a router in the compute dtype)."""


def reference_spec(spec: ModelSpec) -> ModelSpec:
    """``spec`` as the reference module builds it: the Hugging Face implementation details
    dropped (the planner then predicts what the reference module saves), or ValueError
    naming the parameters it cannot build (MLA, qk-norm, shared experts, ...)."""
    import dataclasses

    from planner.spec import NormKind, QkNorm

    missing = [name for name, on in (
        ("multi-head latent attention", spec.mla), ("qk-norm", spec.qk_norm is not QkNorm.NONE),
        ("norms after the branches", spec.post_norms), ("shared experts", spec.shared_ffn),
        ("dense blocks in an MoE model", spec.n_dense_layers),
        ("an attention output bias without MLP biases", spec.attn_out_bias and not spec.bias),
        ("a biased output head", spec.head_bias),
        ("a weightless LayerNorm", spec.norm is NormKind.LAYERNORM_PLAIN),
        ("a BERT head without pooler", spec.encoder_head and not spec.pooler)) if on]
    if missing:
        raise ValueError(f"the reference model cannot build {', '.join(missing)} of "
                         f"{spec.name}; trace the Hugging Face class (--config)")
    return dataclasses.replace(spec, loss_upcast=True, **{f: False for f in _HF_ONLY_SAVES})
