"""The allocation stream of a loss region on fake tensors, replayed through the caching
allocator emulator (probes/alloc_emu.py): how much the allocator reserves beyond what is
allocated around a cross-entropy over the logits.

``loss_region`` runs torchtitan 9dec370's loss (train.py ``loss_fn``:
``F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``, not compiled, ``del
pred`` before ``loss.backward()``) after the output projection that makes ``pred``, forward and
backward, on fake tensors; ``record(fn)`` records every storage allocation and free in order
(a dispatch mode that weak-references each new storage).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from probes.alloc_emu import CachingAllocator


class _Recorder(TorchDispatchMode):
    """Appends ``("alloc", key, bytes, 0)`` for each new storage an op returns and
    ``("free", key)`` when the storage is collected."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events
        self.keys: dict[int, int] = {}
        self.refs: list = []

    def track(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        st = t.untyped_storage()
        sid = id(st)
        if sid in self.keys or st.nbytes() == 0:
            return
        key = len(self.events)
        self.keys[sid] = key
        self.events.append(("alloc", key, int(st.nbytes()), 0))

        def gone(_: Any, sid: int = sid, key: int = key) -> None:
            if self.keys.get(sid) == key:
                del self.keys[sid]
                self.events.append(("free", key))
        self.refs.append(weakref.ref(st, gone))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.track(t)
        return out


def record(fn: Callable[[_Recorder], None]) -> list:
    """The events of ``fn(recorder)`` run under fake tensors (``recorder.track(t)`` adds a
    tensor made outside the recorded ops, e.g. the live inputs)."""
    events: list = []
    with FakeTensorMode():
        rec = _Recorder(events)
        fn(rec)
    return events


def loss_region(tokens: int = 32768, vocab: int = 128256, hidden: int = 4096,
                expandable: bool = True) -> dict[str, Any]:
    """The loss region's peaks under the emulated allocator: the live inputs (h, the output
    weight, the labels) first, then ``pred = h @ W.T`` (bf16), the loss, ``del pred``,
    ``loss.backward()`` (the fp32 gradient of the copy, its bf16 cast, the matmul's
    gradients)."""

    def run(rec: _Recorder) -> None:
        h = torch.empty(1, tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
        w = torch.empty(vocab, hidden, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.empty(1, tokens, dtype=torch.long)
        for t in (h, w, labels):
            rec.track(t)
        with rec:
            pred = h @ w.t()
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
            del pred
            loss.backward()
            del loss
        run.keep = (h, w, labels)  # type: ignore[attr-defined]

    events = record(run)
    emu = CachingAllocator(expandable=expandable).replay(events)
    return {"tokens": tokens, "vocab": vocab, "events": events,
            "max_allocated": emu.max_allocated, "max_reserved": emu.max_reserved,
            "overhead": emu.max_reserved - emu.max_allocated,
            "overhead_per_logit": (emu.max_reserved - emu.max_allocated) / (tokens * vocab)}


def loss_parallel_region(tokens: int, vocab: int, hidden: int, tp: int,
                         expandable: bool = True) -> dict[str, Any]:
    """The loss region of one rank under tensor parallel's ``loss_parallel`` (torchtitan:
    ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)`` on the output head,
    the loss under ``loss_parallel()``), recorded on the rank's local tensors: DTensor runs its
    custom loss ops below the autograd and dispatch-mode level, so the real local functions of
    torch/distributed/tensor/parallel/loss.py are called here on the local shard (``_log_softmax``
    in forward, ``_nll_loss_and_log_softmax_backward`` in backward, over a fake process group of
    ``tp`` ranks), in the order autograd runs them: the head's local logits (bf16), their fp32
    copy (``_to_copy`` saves nothing: freed once the loss returns), ``_log_softmax`` (autograd
    saves its output), ``del pred``; backward: the fused nll/log_softmax gradient, the saved
    output released by its node, the bf16 cast of the gradient, the head's two matmuls."""
    import torch.distributed as dist
    import torch.distributed.tensor.parallel.loss as lp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    try:
        mesh = init_device_mesh("cpu", (tp,))
        local_v = vocab // tp

        def run(rec: _Recorder) -> None:
            h = torch.empty(tokens, hidden, dtype=torch.bfloat16)  # all-gathered, saved
            w = torch.empty(local_v, hidden, dtype=torch.bfloat16)
            labels = torch.zeros(tokens, dtype=torch.long)
            for t in (h, w, labels):
                rec.track(t)
            with rec:
                pred = h @ w.t()
                x32 = pred.float()
                out = lp._log_softmax(x32, 1, False, mesh, 0)
                del x32, pred
                grad = lp._nll_loss_and_log_softmax_backward(
                    torch.ones((), dtype=torch.float32), out, labels, None, 1, -100,
                    torch.tensor(float(tokens)), torch.Size([tokens, vocab]), 1, mesh, 0)
                del out  # its node is done: the saved output is released
                low = grad.to(torch.bfloat16)
                del grad
                grads = (low.t() @ h, low @ w)
                del low, grads
            run.keep = (h, w, labels)  # type: ignore[attr-defined]

        events = record(run)
    finally:
        if created:
            dist.destroy_process_group()
    emu = CachingAllocator(expandable=expandable).replay(events)
    inputs = (tokens * hidden + local_v * hidden) * 2 + tokens * 8
    local = tokens * local_v
    return {"events": events, "max_allocated": emu.max_allocated,
            "max_reserved": emu.max_reserved,
            "beyond_inputs_per_local_logit": (emu.max_allocated - inputs) / local,
            "overhead_per_local_logit": (emu.max_reserved - emu.max_allocated) / local}
