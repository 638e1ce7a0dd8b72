"""Context parallel: torch's ``context_parallel`` with ring attention (docs/model.md
"Context parallel").

Source: torch 2.13, torch/distributed/tensor/experimental/_context_parallel/_attention.py.
``context_parallel(mesh, buffers, buffer_seq_dims)`` shards the batch (token ids, labels,
RoPE's table) along the sequence: with load balancing (the default, when the sequence
divides into 2 x cp chunks: ``_create_default_load_balancer``) rank r keeps chunks r and
2cp-1-r, so each rank holds seq / cp tokens. Every layer outside attention then runs on
those tokens: every activation is the unsharded one at seq / cp. SDPA is routed through
DTensor to ``_templated_ring_attention``, which keeps the local queries and walks the other
ranks' keys and values round the ring, merging each step's output and logsumexp in fp32
(``_SDPAMerger``); its backward (``_templated_ring_attention_backward``) walks the keys and
values again and passes the key/value gradients round in fp32 (``all_to_all`` always).
What autograd saves is the flash op's usual set (q, k, v, out, logsumexp) at the local
length; the ring's buffers are transients inside the op, forward and backward.

The transient formulas below are derived from that source, step by step, for the rank and
step that hold the most (the docstrings give the arithmetic), and checked against the
referee, which runs torch's ring functions on fake tensors over a fake process group for
every rank (probes/context_parallel.py, tests/test_context_parallel.py).

The model: torchtitan's (``parallelize_llama``): FSDP2 over the dp_shard x cp mesh
dimensions (the parameters are sharded over every GPU of the data-parallel and context-
parallel dimensions: ``dp_shard_cp``), TP inside. torchtitan's attention repeats the key
and value heads to the query heads before SDPA (``repeat_kv``), so under CP SDPA saves and
rotates k and v with all the query heads (``CpKv.REPEATED``; torchtune's attention expands
them too). transformers' SDPA attention, run under accelerate's context parallel (which
drops the mask), calls SDPA with ``enable_gqa=True`` and the model's key/value heads: the
flash kernel takes them grouped, and the ring saves and rotates k and v at the key/value
width (``CpKv.GROUPED``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from planner.spec import (
    Attention,
    CompileMode,
    CpRotate,
    ModelSpec,
    PositionKind,
    Strategy,
    TrainingSpec,
)

FP32 = 4

CP_STRATEGIES = (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD, Strategy.SHARD_GRAD_OP)
"""What CP composes with: FSDP2 over dp_shard x cp (torchtitan)."""


def cp_problem(model: ModelSpec, training: TrainingSpec, n_gpus: int, tp: int) -> str | None:
    """Why context parallel of degree ``training.cp`` cannot be modelled here, or None."""
    cp = training.cp
    if cp <= 1:
        return None
    pp = training.pipeline.degree
    if n_gpus % (cp * tp * pp):
        return (f"{n_gpus} GPUs is not a multiple of CP {cp} x TP {tp}"
                + (f" x PP {pp}" if pp > 1 else ""))
    if training.seq % (2 * cp):
        # without the head-tail load balancer the ring skips steps per rank
        # (_is_causal_behavior SKIP): not modelled
        return (f"the sequence ({training.seq}) must split into 2 x CP = {2 * cp} equal "
                "chunks (torch's load-balanced sharding)")
    if training.attention is not Attention.SDPA:
        return "CP routes SDPA only (torch's ring attention); eager attention is not sharded"
    if model.encoder_head or model.position is PositionKind.ALIBI:
        return "CP's load balancing needs causal SDPA without a mask (no encoder, no ALiBi)"
    if model.mla or model.sliding_layers or model.fused_qkv:
        return ("CP with multi-head latent or sliding-window attention or a fused qkv "
                "projection is not modelled")
    if model.is_moe and training.ep <= 1:
        # traced (docs/model.md "Expert parallel", EP beside CP): under EP within 1.3 % at
        # every moment; without EP the reference's capacity MoE misses by 3.9-13 % under
        # CP 2, as it does without CP (its dispatch saves more than the planner counts)
        return ("CP with an MoE model is modelled with expert parallel only (--ep N >= 2, "
                "torchtitan's all-to-all dispatch); without EP it is not modelled")
    if model.is_moe and tp > 1:
        return "CP with an MoE model beside tensor parallel is not modelled (not traced)"
    if not training.finetune.full:
        return "CP with a fine-tune (LoRA, frozen parameters) is not modelled"
    if training.fsdp_version != 2:
        return "CP is modelled with FSDP2 (torchtitan), not FSDP1"
    if training.compile is not CompileMode.NONE:
        return "CP with --compile is not modelled (the compiled saved set is measured without CP)"
    if training.activation_offload:
        return "CP with activation offloading is not modelled"
    return None


def ring_forward_bytes(*, batch: int, local_seq: int, n_heads: int, n_kv_heads: int,
                       d_head: int, c: int, cp: int, rotate: CpRotate) -> int:
    """The ring attention's forward peak above its inputs (q, k, v), on the rank and step
    that hold the most: a rank r >= 1 at a step 1 <= i <= r, merging a whole-block result.

    With O = batch x heads x local_seq x d_head (q's elements), K the same with the key/value
    heads SDPA is given (k's elements) and lse = 4 x batch x heads x local_seq (the fp32 logsumexp):

    - ``_SDPAMerger``: the running output in fp32 (4 O), this step's block output (c O) and
      its fp32 copy (4 O; none in fp32), and inside ``out - sigmoid(block_lse - lse) *
      (out - block_out)`` the difference and the product (4 O each);
    - three logsumexp-sized fp32 tensors (the running one, the block's, the sigmoid);
    - the keys and values in flight: all-gather, the gathered buffer of every rank's k and v
      (cp x 2 x c K, held through all steps); all-to-all, the one received (2 c K) and, at a
      step that still sends (i < cp - 1, so from cp 3), the next one (2 c K).
      (The concatenated send buffer is freed before the merge.)
    """
    O = batch * n_heads * local_seq * d_head
    K = batch * n_kv_heads * local_seq * d_head
    lse = FP32 * batch * n_heads * local_seq
    merge = FP32 * O + c * O + (FP32 * O if c != FP32 else 0) + 2 * FP32 * O
    kv = 2 * c * K
    buffers = cp * kv if rotate is CpRotate.ALLGATHER else min(cp - 1, 2) * kv
    return merge + 3 * lse + buffers


def ring_backward_bytes(*, batch: int, local_seq: int, n_heads: int, n_kv_heads: int,
                        d_head: int, c: int, cp: int, rotate: CpRotate) -> int:
    """The ring attention's backward peak above what it starts from (q, k, v, out,
    logsumexp, the output's gradient): the larger of two moments, O and lse as in
    ``ring_forward_bytes``, K the keys' elements, KV the key/value buffers in flight
    (all-gather: the gathered cp x 2 c K and the last concatenated send buffer 2 c K, which
    stays referenced; all-to-all: the received 2 c K, its concatenation 2 c K and, at a
    step that still sends, the next 2 c K):

    (a) a rank r >= 1 at a step i <= r (whole queries, the first half of the keys), at its
        dK/dV all-to-all: the fp32 dQ accumulator (4 O), the step's gradients (c O for q,
        c K / 2 each for the half keys and values), and four fp32 dK/dV buffers of 8 K each
        (the one received, the sum ``_partial_update`` builds from it, its concatenation,
        the all-to-all output);
    (b) rank 0 at a step i > 0 (the second half of the queries), rebuilding dQ with
        ``_partial_update``: the old and the new fp32 dQ (8 O), the step's gradients
        (c O / 2 for the half queries, c K each for k and v), three fp32 dK/dV buffers
        (received, concatenated, all-to-all output: 8 K each), half a logsumexp made
        contiguous;
    (c) rank 0 inside the flash backward of a step i > 0: the fp32 dQ (4 O), the previous
        step's gradients (c O + 2 c K) beside this step's (c O / 2 + 2 c K), three fp32 dK/dV
        buffers (the accumulator, the last concatenation, the all-to-all output in flight),
        half a logsumexp. (The largest when the compute dtype is fp32.)
    """
    O = batch * n_heads * local_seq * d_head
    K = batch * n_kv_heads * local_seq * d_head
    lse = FP32 * batch * n_heads * local_seq
    kv = 2 * c * K
    if rotate is CpRotate.ALLGATHER:
        buffers = cp * kv + kv
    else:
        buffers = kv + min(cp - 1, 2) * kv
    whole = FP32 * O + c * O + c * K + 4 * 8 * K
    halves = 2 * FP32 * O + c * O // 2 + 2 * c * K + 3 * 8 * K + lse // 2
    in_op = FP32 * O + c * O + c * O // 2 + 4 * c * K + 3 * 8 * K + lse // 2
    return max(whole, halves, in_op) + buffers


def cp_saved(saved: list[Any], model: ModelSpec, t: int, c: int, *,
             repeat_kv: bool = True) -> list[Any]:
    """One block's saved set under CP (already at the local tokens ``t``): with
    ``repeat_kv``, SDPA's keys and values with every query head (torchtitan's ``repeat_kv``
    and torchtune's expand before SDPA); ``repeat_kv``'s expand and reshape save nothing,
    the unrepeated keys are saved by no one. Without it (transformers' SDPA attention calls
    SDPA with ``enable_gqa=True`` once the mask is dropped, as accelerate's CP hooks do; the
    flash kernel takes the grouped heads) the keys and values stay the model's."""
    wide = {"sdpa.k", "sdpa.k.rope_cast", "sdpa.v"} if repeat_kv else set()
    out = [dataclasses.replace(x, nbytes=c * t * model.q_dim) if x.name in wide else x
           for x in saved]
    if not any(x.name == "attn.o.input_copy" for x in out):
        # the ring's output is no longer the flash kernel's (B, T, heads, d) layout once
        # _SDPAMerger's _partial_update has rebuilt it with torch.cat (every rank but the
        # last): the transpose + reshape before attn.o copies it (traced)
        out.append(Saved_like(saved, "attn.o.input_copy", c * t * model.q_dim))
    return out


def Saved_like(saved: list[Any], name: str, nbytes: int) -> Any:  # noqa: N802
    """A new entry of the saved list's own type (planner.activations.Saved)."""
    return dataclasses.replace(saved[0], name=name, nbytes=nbytes)


AFTER_SDPA = ("attn.o.", "attn.dropout", "norm2.", "norm3.", "norm4.", "mlp.", "moe.",
              "lora.o.", "lora.gate.", "lora.up.", "lora.down.")
"""A block's saved entries made after its SDPA: freed by the time the SDPA's backward runs
(the block's backward goes MLP, attention output projection, then SDPA)."""


@functools.lru_cache(maxsize=256)
def grads_before_ring(model: ModelSpec, c: int, *, tp: int = 1, ep: int = 1) -> int:
    """Bytes of FSDP2's unsharded gradients (compute dtype) alive when a block's ring
    backward runs: every block weight whose backward has run by then, the output projection,
    the norms after the attention and the whole MLP (MoE: the router, the shared experts and
    the routed experts' stacks), until the unit's reduce-scatter (FSDP2 reduces at the
    unit's post-backward, ``_fsdp_param_group.py`` ``post_backward``). The routed stacks
    (``mlp.w_*``, 3-D) are the rank's E / ep experts (torchtitan's ``Shard(0)`` on ep); under
    TP the rest is the rank's 1 / tp. The MoE block's, where an MoE model also has dense
    blocks (the larger)."""
    from planner.params import block_tensors, numel

    def after(tensors: Any) -> int:
        stacks = sum(numel(s) for n, s in tensors if n.startswith("mlp.w_") and len(s) == 3)
        rest = sum(numel(s) for n, s in tensors if n.startswith(AFTER_SDPA)) - stacks
        return -(-rest // tp) + stacks // ep

    return c * after(list(block_tensors(model)))


def after_sdpa(saved: Any) -> int:
    """Bytes of a block's saved entries made after its SDPA (``AFTER_SDPA``)."""
    return sum(x.nbytes for x in saved if x.name.startswith(AFTER_SDPA))


def rotation_bytes(*, batch: int, seq: int, n_heads: int, d_head: int, c: int, cp: int
                   ) -> tuple[float, float]:
    """Bytes one GPU receives per layer and micro-batch: (forward, backward). Forward: the
    other cp - 1 ranks' k and v (2 c x local tokens x heads x d_head each), whichever way
    they rotate; backward: the same again, and the fp32 dK/dV passed on at every one of the
    cp steps (2 x 4 bytes per element)."""
    local = batch * (seq // cp) * n_heads * d_head
    kv = 2.0 * c * local
    return (cp - 1) * kv, (cp - 1) * kv + cp * 2.0 * FP32 * local


__all__ = ["CP_STRATEGIES", "CpRotate", "after_sdpa", "grads_before_ring", "cp_problem", "cp_saved",
           "ring_backward_bytes", "ring_forward_bytes", "rotation_bytes"]
