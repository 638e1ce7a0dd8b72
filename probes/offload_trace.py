"""What activation offloading's pack hook is handed, on fake tensors (no GPU, no pinned memory).

The referee for planner/activations.py ``_offload_terms``. torchtune's ``OffloadActivations``
and TRL's copy cannot run here (they create CUDA streams and pin host memory), but what they
decide depends only on what autograd hands their ``pack_tensor``: this module runs the
reference transformer's forward (``probes.models``, the module the GPU cases build) on fake
CPU tensors under a ``saved_tensors_hooks`` pair that records every save: its bytes, whether it
is a Parameter, its storage. The output layer and the loss run with the recording switched off,
as ``NoOpManager`` does (entered after the final norm, as probes/gpu_cases.py
``ActivationOffload`` does on the GPU). Then each class's policy is applied to the record,
as derived from its source (torchtune 0.6.1 ``training/_activation_offloading.py``; TRL 1.16
``trl/models/activation_offloading.py``):

- torchtune: a save of at least ``min_offload_size`` (1024) bytes that is not an
  ``nn.Parameter`` instance is copied to the host, once per save (no deduplication;
  ``weight.t()``, the view a matmul saves, is a plain tensor);
- TRL: the same threshold, but a save whose (storage pointer + offset, dtype) is already
  tracked stays on the GPU (tracked while its first save is in the forward stash of
  ``max_fwd_stash_size`` ids, and from then on while a repeated save holds it), and a save
  whose storage is a parameter's is skipped.

Under bf16-amp with DDP the CUDA autocast emulation (probes/autocast_emul.py) runs around the
forward, as the trace does. Storages are told apart by their ``StorageImpl`` (fake tensors
have no data pointer). Checked against the GPU tallies of benchmarks/gpu_runs/2026-11-26-h100-b
(``activation_offload.last_forward``): torchtune's host bytes equal to the byte, in both
regimes.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from planner.spec import Checkpointing, ModelSpec, Precision

MIN_BYTES = 1024
STASH = 5


def record_saves(spec: ModelSpec, *, batch: int, seq: int, precision: Precision,
                 checkpointing: Checkpointing = Checkpointing.NONE) -> dict[str, Any]:
    """Every save the blocks and the root hand the pack hook in one forward, in order:
    ``{"saves": [{"nbytes", "param", "storage", "key", "param_storage"}], ...}``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from probes.autocast_emul import CudaAutocastEmulation
    from probes.models import build_model
    from probes.trace import _to_bf16, _to_empty

    net = build_model(spec, device="meta")
    net.configure(checkpointing=checkpointing, attention="sdpa")
    if precision is Precision.BF16:
        _to_bf16(net)
    saves: list[dict[str, Any]] = []
    state = {"noop": False}
    net.final_norm.register_forward_hook(lambda *_: state.update(noop=True))

    def pack(t: torch.Tensor) -> Any:
        if not state["noop"]:
            st = t.untyped_storage()._cdata
            saves.append({"nbytes": t.numel() * t.element_size(),
                          "param": isinstance(t, nn.Parameter), "storage": st,
                          "key": (st, t.storage_offset(), str(t.dtype))})
        return t

    with FakeTensorMode(allow_non_fake_inputs=True):
        _to_empty(net)
        params = {p.untyped_storage()._cdata for p in net.parameters()}
        ids = torch.randint(0, spec.vocab, (batch, seq))
        amp = CudaAutocastEmulation(torch.bfloat16) if precision.amp else nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), amp:
            net(ids, ids)
        for s in saves:
            s["param_storage"] = s["storage"] in params
    return {"saves": saves}


def torchtune_tally(saves: list[dict[str, Any]]) -> dict[str, int]:
    """torchtune's ``pack_tensor``: bytes copied to the host, bytes left on the device."""
    host = sum(s["nbytes"] for s in saves if s["nbytes"] >= MIN_BYTES and not s["param"])
    return {"host_bytes": host,
            "kept_bytes": sum(s["nbytes"] for s in saves) - host, "saves": len(saves)}


def trl_tally(saves: list[dict[str, Any]]) -> dict[str, int]:
    """TRL's ``pack_tensor``: host bytes, and the repeated saves it keeps on the GPU (each
    storage once, as probes/gpu_cases.py tallies them)."""
    stash: list[int] = []
    tracked: dict[tuple, int] = {}
    host = 0
    kept: dict[Any, int] = {}
    for i, s in enumerate(saves, start=1):
        if s["key"] in tracked:
            tracked[s["key"]] = i
            kept[s["storage"]] = max(kept.get(s["storage"], 0), s["nbytes"])
            continue
        if s["nbytes"] < MIN_BYTES or s["param"] or s["param_storage"]:
            continue
        for j in [j for j in stash if j <= i - STASH]:
            stash.remove(j)
            for k in [k for k, v in tracked.items() if v == j]:
                del tracked[k]
        host += s["nbytes"]
        stash.append(i)
        tracked[s["key"]] = i
    return {"host_bytes": host, "kept_bytes": sum(kept.values()), "saves": len(saves)}
