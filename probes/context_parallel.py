"""The referee for context parallel's ring attention: torch's own code on fake tensors.

torch's ``context_parallel`` (torch/distributed/tensor/experimental/_context_parallel/
_attention.py) shards the batch along the sequence (load-balanced head-tail chunks when the
sequence divides into 2 x cp) and routes every SDPA call through DTensor to
``_templated_ring_attention`` (forward) and ``_templated_ring_attention_backward``. This
probe runs exactly that code on fake CPU tensors, on a fake process group of cp ranks, for
each rank in turn (the causal load balancing makes ranks do different work), and records
the bytes alive while the ring runs: the forward's peak above its inputs, what the forward
leaves (the output and the logsumexp), and the backward's peak above what it starts from.

Two things differ from a GPU and are emulated: ``F.scaled_dot_product_attention`` on CPU
dispatches to ``_scaled_dot_product_flash_attention_for_cpu``, which the CP dispatcher does
not handle (it has no sharding rule), so the probe calls the CUDA flash op
``aten._scaled_dot_product_flash_attention`` directly (its meta kernel gives the shapes, and
it is the op torchtitan's SDPA reaches on an H100); and the collectives run on the fake
process group (their outputs are allocated as on a GPU; nothing is sent).

Not traced here: the rest of the training step (FSDP over dp_shard x cp, the blocks' other
activations, the loss), which the planner scales by seq / cp (docs/model.md "Context
parallel").
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Bytes of every tensor storage an op creates while this mode is active, alive until
    the storage is freed; ``peak`` is the largest total seen since ``reset``. Storages made
    before the mode (the inputs) are counted through ``hold``."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, Any] = {}

    def _add(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self._seen and self._seen[key]() is not None:
            return
        n = st.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)

        def gone(_: Any, key: int = key, n: int = n) -> None:
            self.live -= n
            self._seen.pop(key, None)

        self._seen[key] = weakref.ref(st, gone)

    def _forget(self, t: torch.Tensor) -> None:
        ref = self._seen.pop(id(t.untyped_storage()), None)
        if ref is not None:  # dropping the weak reference drops its callback too
            self.live -= t.untyped_storage().nbytes()

    def hold(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            self._add(t)

    def reset(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops._c10d_functional.wait_tensor.default:
            # on a GPU ``wait_tensor`` returns its input (the collective's output buffer);
            # the fake kernel returns a new tensor: move the bytes over, count them once
            self._forget(args[0])
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                self._add(t)
        return out


def _fake_group(cp: int, rank: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=cp)
    return init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))


def ring_attention_bytes(*, cp: int, rank: int, rotate: str, batch: int, seq: int,
                         n_heads: int, d_head: int, n_kv_heads: int | None = None,
                         dtype: str = "bf16") -> dict[str, int]:
    """One rank's bytes through one causal, load-balanced ring attention, forward and
    backward: ``_scaled_dot_product_ring_flash_attention`` and its ``_backward``, the
    functions the CP dispatcher (``_sdpa_handler``) calls with the local tensors of the
    DTensor flash op. A ``TorchDispatchMode`` does not see inside a DTensor's dispatch, so
    they are called here directly, with the same local arguments.

    q is (batch, n_heads, seq / cp, d_head) in ``dtype``, k and v the same with
    ``n_kv_heads`` (default n_heads: the heads SDPA is given), made outside the count;
    ``fwd_peak`` is the most alive above them during the forward, ``fwd_left`` what the
    forward returns (its output and logsumexp, which autograd saves); ``bwd_peak`` the most
    alive during the backward above the inputs, those outputs and the incoming gradient,
    ``bwd_left`` what it returns (dq, dk, dv)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.distributed.tensor.experimental._context_parallel import _attention as cpa

    if seq % (2 * cp):
        raise ValueError(f"seq ({seq}) must divide into 2 x cp ({2 * cp}) chunks")
    set_rotate_method(rotate)
    cpa._cp_options.enable_load_balance = True  # as context_parallel sets it here
    mesh = _fake_group(cp, rank)
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    try:
        with FakeTensorMode():
            kv_heads = n_heads if n_kv_heads is None else n_kv_heads
            q = torch.empty(batch, n_heads, seq // cp, d_head, dtype=dt)
            k, v = (torch.empty(batch, kv_heads, seq // cp, d_head, dtype=dt)
                    for _ in range(2))
            meter = LiveBytes()
            meter.hold(q, k, v)
            base = meter.live
            with meter:
                out, lse, *rest = cpa._scaled_dot_product_ring_flash_attention(
                    mesh, q, k, v, is_causal=True)
            fwd_peak = meter.peak - base
            fwd_left = meter.live - base
            with meter:
                g = torch.empty_like(out)
                meter.reset()
                start = meter.live
                grads = cpa._scaled_dot_product_ring_flash_attention_backward(
                    mesh, g, q, k, v, out, lse, *rest[:4], 0.0, True, *rest[4:6])
                bwd_peak = meter.peak - start
                bwd_left = meter.live - start
            del grads
    finally:
        dist.destroy_process_group()
    return {"fwd_peak": fwd_peak, "fwd_left": fwd_left, "bwd_peak": bwd_peak,
            "bwd_left": bwd_left}




# --------------------------------------------------------------------------- the whole step


class _RingDispatch(TorchDispatchMode):
    """What DTensor's CP dispatch does, as a dispatch mode: the flash op and its backward
    (``aten._scaled_dot_product_flash_attention`` and ``_backward``) run as torch's ring
    (``_scaled_dot_product_ring_flash_attention`` and its ``_backward``, the functions the
    CP handler ``_sdpa_handler`` calls) on the local tensors; every other op passes through.

    Pushed after the tracker and before any checkpoint's selective-checkpoint mode, it sits
    between them as DTensor's dispatch does on a GPU: a mode above it (the op-level SAC
    policy) sees ONE flash op per layer and saves its merged output and logsumexp (on a GPU
    the ring runs inside the DTensor flash op, where no mode sees its per-rotation ops:
    a dispatch mode entered around a DTensor flash op under the CP dispatcher sees that op
    alone, checked on torch 2.13), while the ring's own ops go down to the modes below (the
    tracker, fake mode) and are counted. The flash op's autograd formula saves what the
    DTensor flash op's does (q, k, v, out, logsumexp and the small rest)."""

    def __init__(self, mesh: Any) -> None:
        super().__init__()
        self.mesh = mesh

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cpa

        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten._scaled_dot_product_flash_attention.default:
            return tuple(cpa._scaled_dot_product_ring_flash_attention(self.mesh, *args,
                                                                      **kwargs))
        if func is aten._scaled_dot_product_flash_attention_backward.default:
            return tuple(cpa._scaled_dot_product_ring_flash_attention_backward(
                self.mesh, *args, **kwargs))
        return func(*args, **kwargs)


_MESHES: dict[tuple[int, int, int], Any] = {}


def cp_mesh(cp: int) -> Any:
    """The cp dimension of a (world / cp, cp) mesh over the fake process group already
    initialised (made once per group; its own tensors are real, outside every mode). This
    process's cp rank is its global rank modulo cp: a trace of cp rank r initialises the
    fake group as global rank r (the causal load balancing gives the ranks different ring
    work: rank 0 runs the half-query steps, every other rank the half-key steps)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.utils._python_dispatch import _disable_current_modes

    world = dist.get_world_size()
    key = (id(dist.distributed_c10d._get_default_group()), world, cp)
    if key not in _MESHES:
        with _disable_current_modes():
            _MESHES[key] = init_device_mesh("cpu", (world // cp, cp),
                                            mesh_dim_names=("dp", "cp"))["cp"]
    return _MESHES[key]


class ring_sdpa:
    """Context manager for a traced step under context parallel ``cp`` over a fake process
    group already initialised: ``F.scaled_dot_product_attention`` becomes the flash op, run
    as torch's ring attention over the cp dimension of a (world / cp, cp) mesh
    (``_RingDispatch``), this process being cp rank (global rank) mod cp (``cp_mesh``), with
    the keys and values repeated to the query heads first as torchtitan's ``repeat_kv`` does
    (expand + reshape of the (B, T, kv, d) layout, then the transpose), or with ``repeat_kv``
    False given as they are (transformers' ``enable_gqa=True``: the flash op takes the
    grouped heads). Enter it inside the tracker (and around the backward too): its dispatch
    mode must sit above the tracker's."""

    def __init__(self, cp: int, rotate: str, repeat_kv: bool = True) -> None:
        self.cp, self.rotate, self.repeat_kv = cp, rotate, repeat_kv

    def __enter__(self) -> None:
        import torch.nn.functional as F
        from torch.distributed.tensor.experimental._attention import set_rotate_method
        from torch.distributed.tensor.experimental._context_parallel import _attention as cpa

        set_rotate_method(self.rotate)
        cpa._cp_options.enable_load_balance = True
        self._mode = _RingDispatch(cp_mesh(self.cp))
        self._orig = F.scaled_dot_product_attention
        flash = torch.ops.aten._scaled_dot_product_flash_attention.default

        def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
                 dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                 enable_gqa: bool = False) -> torch.Tensor:
            if attn_mask is not None or not is_causal:
                raise NotImplementedError("context parallel: causal SDPA without a mask only")
            rep = q.shape[1] // k.shape[1]
            if rep > 1 and self.repeat_kv:
                k, v = (_repeat_kv(t, rep) for t in (k, v))
            # SDPA's composite calls the flash op so on an H100 (attention.cpp, head dims
            # a multiple of 8 need no padding)
            return flash(q, k, v, dropout_p, True, scale=scale)[0]

        F.scaled_dot_product_attention = sdpa
        self._mode.__enter__()

    def __exit__(self, *exc: object) -> None:
        import torch.nn.functional as F

        self._mode.__exit__(*exc)
        F.scaled_dot_product_attention = self._orig


def _repeat_kv(t: torch.Tensor, rep: int) -> torch.Tensor:
    """(B, kv, T, d), a transposed view of (B, T, kv, d) -> (B, kv x rep, T, d) as torchtitan's
    ``repeat_kv`` makes it: expand and reshape in the (B, T, kv, d) layout (a copy), then the
    transpose back (a view)."""
    b, kv, s, d = t.shape
    x = t.transpose(1, 2)
    x = x[:, :, :, None, :].expand(b, s, kv, rep, d).reshape(b, s, kv * rep, d)
    return x.transpose(1, 2)


__all__ = ["LiveBytes", "cp_mesh", "ring_attention_bytes", "ring_sdpa"]
