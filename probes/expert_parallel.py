"""The referee for expert parallel's token dispatch: torchtitan's dispatch and combine, op for
op, on fake tensors over a fake process group.

torchtitan (snapshot b5bcd76) ``torchtitan/models/common/token_dispatcher.py``:
``LocalTokenDispatcher`` (no EP) sorts the t x top_k routed rows by expert
(``argsort``, ``x[idx]``), runs the experts, and combines (the score multiply in fp32,
``scatter_add``); ``AllToAllTokenDispatcher`` (EP) adds the all-to-all of the sorted rows
(``all_to_all_single_autograd``), the expert-major gather (``routed[permuted_indices]``)
and, in combine, the inverse (``new_empty`` + index assignment) and the reverse all-to-all.
This probe runs both paths with the same ops on fake CPU tensors, this process EP rank 0 of
a fake process group, and records the bytes alive: the forward's peak, what the forward
leaves (autograd's saved tensors and the output) and the backward's peak.

What is emulated: the experts are one SwiGLU over all the rows a rank receives (the grouped
GEMM saves its inputs as a matmul does; the per-expert split does not change the bytes), the
split sizes are given (the count exchange's ``.tolist()`` is data-dependent: balanced, each
rank sends every rank N / ep rows and receives R / ep from each, R = imbalance x N), and the
permutation indices are an ``arange`` (torchtitan builds them with a few int64 temporaries
of R elements: ``repeat_interleave``, ``cumsum``; not counted). The router is outside (its
scores are an input that requires grad, as the router's output does).

``sac_bytes`` (``--sac``) runs the same path inside torchtitan's op-level selective activation
checkpointing (``sac_policy``, ``save_list``: the DeepSeek-V3 save list of the issue #1789
run's torchtitan, which has ``all_to_all_single``), the experts as ``torch._grouped_mm``, and
records what the forward leaves.
"""

from __future__ import annotations

import json
import sys
import weakref
from typing import Any

import torch
import torch.distributed as dist

from probes.context_parallel import LiveBytes

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _group(ep: int) -> Any:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ep)
    return dist.group.WORLD


def _rows(ep: int, tokens: int, top_k: int, imbalance: float) -> tuple[int, int]:
    """(rows this rank routes, rows its experts receive); the all-to-alls need both to split
    evenly over the EP ranks."""
    n_rows = tokens * top_k
    r_rows = int(imbalance * n_rows) if ep > 1 else n_rows
    if n_rows % ep or r_rows % ep:
        raise ValueError("the routed and received rows must split evenly over the EP ranks")
    return n_rows, r_rows


def _layer_inputs(tokens: int, top_k: int, hidden: int, ffn: int, c: Any) -> tuple:
    """(x, expert ids, router scores, w1, w2, w3) of one MoE layer, fake tensors (call inside
    a FakeTensorMode)."""
    x = torch.empty(tokens, hidden, dtype=c, requires_grad=True)
    ids = torch.empty(tokens, top_k, dtype=torch.int64)
    scores = torch.empty(tokens, top_k, dtype=torch.float32, requires_grad=True)
    w1, w3 = (torch.empty(hidden, ffn, dtype=c, requires_grad=True) for _ in range(2))
    w2 = torch.empty(ffn, hidden, dtype=c, requires_grad=True)
    return x, ids, scores, w1, w2, w3


def dispatch_bytes(*, ep: int, tokens: int, top_k: int, hidden: int, ffn: int,
                   imbalance: float = 1.0, dtype: str = "bf16") -> dict[str, int]:
    """One MoE layer's routed path on EP rank 0 (``ep`` 1: the local dispatcher), forward
    and backward: ``fwd_peak`` the most alive above the inputs, ``left`` what the forward
    leaves, ``bwd_peak`` the most alive during backward above what it starts from."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    c = DTYPES[dtype]
    n_rows, r_rows = _rows(ep, tokens, top_k, imbalance)
    group = _group(ep) if ep > 1 else None
    try:
        with FakeTensorMode():
            x, ids, scores, w1, w2, w3 = _layer_inputs(tokens, top_k, hidden, ffn, c)
            meter = LiveBytes()
            meter.hold(x, ids, scores, w1, w2, w3)
            base = meter.live
            with meter:
                y = _routed(x, ids, scores, (w1, w2, w3), ep, n_rows, r_rows, group,
                            all_to_all_single_autograd)
                fwd_peak, left = meter.peak - base, meter.live - base
                grad = torch.empty_like(y)
                meter.reset()
                start = meter.live
                y.backward(grad)
                bwd_peak = meter.peak - start
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return {"fwd_peak": fwd_peak, "left": left, "bwd_peak": bwd_peak}


def _routed(x: Any, ids: Any, scores: Any, weights: tuple, ep: int, n_rows: int,
            r_rows: int, group: Any, a2a: Any, grouped: bool = False) -> Any:
    """torchtitan's dispatch, experts and combine (the local path when ``ep`` is 1); every
    intermediate is dropped as soon as the source drops it."""
    w1, w2, w3 = weights
    k, h = ids.shape[1], x.shape[1]
    idx = torch.argsort(ids.view(-1), stable=True)
    s_sorted = scores.view(-1)[idx]
    tok = idx // k
    del idx
    rows = x[tok]
    if ep > 1:
        rows = a2a(rows, [r_rows // ep] * ep, [n_rows // ep] * ep, group)
        perm = torch.arange(r_rows)
        rows = rows[perm]
    if grouped:
        # torchtitan's GroupedExperts (use_grouped_mm): ``torch._grouped_mm`` over the
        # expert-major rows, one group here (the per-expert split does not change the bytes)
        offs = torch.tensor([rows.shape[0]], dtype=torch.int32)
        gmm = torch._grouped_mm
        out = torch.nn.functional.silu(gmm(rows, w1.unsqueeze(0), offs=offs)) \
            * gmm(rows, w3.unsqueeze(0), offs=offs)
        out = gmm(out, w2.unsqueeze(0), offs=offs)
    else:
        out = torch.nn.functional.silu(rows @ w1) * (rows @ w3)
        out = out @ w2
    del rows
    if ep > 1:
        back = out.new_empty(out.shape)
        back[perm] = out
        del out, perm
        out = a2a(back, [n_rows // ep] * ep, [r_rows // ep] * ep, group)
        del back
    out = (out.to(torch.float32) * s_sorted.reshape(-1, 1)).to(x.dtype)
    y = torch.zeros_like(x).scatter_add(0, tok.reshape(-1, 1).expand(-1, h), out)
    return y


class AliasedLiveBytes(LiveBytes):
    """``LiveBytes`` where ``wait_tensor``'s output is its input's storage, as on a GPU: the
    bytes stay counted while either fake storage is alive (the fake kernel returns a new
    tensor; selective checkpointing caches the collective's output, the rest of the forward
    uses the wait's)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        if func is not torch.ops._c10d_functional.wait_tensor.default:
            return super().__torch_dispatch__(func, types, args, kwargs)
        out = func(*args, **(kwargs or {}))
        pair = [args[0].untyped_storage(), out.untyped_storage()]
        n, alive = pair[0].nbytes(), [2]
        if id(pair[0]) not in self._seen:
            self._add(out)  # an input the meter never saw: count the output alone
            return out

        def gone(_: Any, key: int) -> None:
            self._seen.pop(key, None)
            alive[0] -= 1
            if alive[0] == 0:
                self.live -= n

        self._seen.pop(id(pair[0]))  # drops the plain callback: the pair's replaces it
        for st in pair:
            self._seen[id(st)] = weakref.ref(st, lambda ref, key=id(st): gone(ref, key))
        return out


def sac_policy(save: set) -> Any:
    """torchtitan's op-level selective AC policy (torchtitan/distributed/activation_checkpoint
    .py ``_apply_op_sac`` ``_custom_policy``, at 82a9530f6~1, the issue #1789 run's torchtitan):
    save the outputs of the ops in ``save`` (models/deepseek_v3/infra/parallelize.py
    ``_op_sac_save_list``), except every second ``aten.mm`` (counted per region, forward and
    recompute apart), recompute the rest. (The device-to-host ``_to_copy`` it also saves does
    not occur here: the split sizes are given.)"""
    from torch.utils.checkpoint import CheckpointPolicy

    count = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        mode = "recompute" if ctx.is_recompute else "forward"
        if func is torch.ops.aten.mm.default:
            count[mode] += 1
            if count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def save_list() -> set:
    """The DeepSeek-V3 ``_op_sac_save_list`` at 82a9530f6~1 (the ops this build has)."""
    ops = torch.ops
    return {ops.aten.mm.default, ops.aten._scaled_dot_product_efficient_attention.default,
            ops.aten._scaled_dot_product_flash_attention.default,
            ops._c10d_functional.reduce_scatter_tensor.default,
            ops._c10d_functional.all_to_all_single.default, ops.aten.max.default,
            torch._higher_order_ops.flex_attention}


def sac_bytes(*, ep: int, tokens: int, top_k: int, hidden: int, ffn: int,
              imbalance: float = 1.0) -> dict[str, int]:
    """The routed path (bf16, torchtitan's grouped-GEMM experts) inside a non-reentrant
    ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts(sac_policy(...))``
    as torchtitan wraps the MoE module: ``left`` what the forward leaves above the inputs
    (the policy's cache and the checkpoint's own), ``bwd_peak`` the backward's peak above
    where it starts."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    c = torch.bfloat16
    n_rows, r_rows = _rows(ep, tokens, top_k, imbalance)
    group = _group(ep) if ep > 1 else None
    try:
        with FakeTensorMode():
            x, ids, scores, w1, w2, w3 = _layer_inputs(tokens, top_k, hidden, ffn, c)
            meter = AliasedLiveBytes()
            meter.hold(x, ids, scores, w1, w2, w3)
            base = meter.live

            def block(x: Any, scores: Any, w1: Any, w2: Any, w3: Any) -> Any:
                return _routed(x, ids, scores, (w1, w2, w3), ep, n_rows, r_rows, group,
                               all_to_all_single_autograd, grouped=True)

            def context() -> Any:
                return create_selective_checkpoint_contexts(sac_policy(save_list()))

            with meter:
                y = checkpoint(block, x, scores, w1, w2, w3, use_reentrant=False,
                               context_fn=context)
                left = meter.live - base
                grad = torch.empty_like(y)
                meter.reset()
                start = meter.live
                y.backward(grad)
                bwd_peak = meter.peak - start
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return {"left": left, "bwd_peak": bwd_peak}


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    if sys.argv[2:] == ["--sac"]:
        print(json.dumps([sac_bytes(**case) for case in cases]))
    else:
        print(json.dumps([dispatch_bytes(**case) for case in cases]))
