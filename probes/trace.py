"""Trace one training configuration's per-GPU memory in this process, without a GPU.

``trace_step(model, training, candidate, world_size, gpus_per_node) -> dict`` builds the
reference module (``probes.models``), applies the distributed strategy, and runs training
steps on **fake CPU tensors** (``FakeTensorMode``: shapes and dtypes only, no data) under
PyTorch's memory trackers, which account every tensor storage by category:

* FSDP strategies: FSDP2 ``fully_shard`` on every block, then on the root, with a fake process
  group (``torch.testing._internal.distributed.fake_pg``) so one process plays rank 0 of any
  world size; tracked by ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``.

  ===============  ==========================================================================
  full_shard       1-D mesh (world,), ``reshard_after_forward=True``
  shard_grad_op    1-D mesh (world,), ``reshard_after_forward=False``
  no_shard         2-D mesh (world, 1) = replicate x shard-of-1 (HSDP), ``reshard=False``
  hybrid_shard     2-D mesh (world // gpus_per_node, gpus_per_node), ``reshard=True``
                   (world <= gpus_per_node: (1, world), i.e. full_shard)
  ===============  ==========================================================================

* ddp: the plain module on one rank (DDP's reducer touches data, so it cannot run under fake
  mode; per-rank DDP memory does not depend on world size). The DDP gradient bucket buffers
  are NOT in this trace: the planner adds them. Tracked by ``mem_tracker.MemTracker``.
* zero1/zero2/zero3, CPU offload, Lion, 8-bit AdamW: not traced -> ``UnsupportedConfig``.

Precision: fp32 -> fp32 params, no casts; bf16 -> params (and so grads/optimizer state) in
bf16; bf16-amp / fp16-amp: fp32 params, and with FSDP ``MixedPrecisionPolicy(param_dtype=
bf16|fp16, reduce_dtype=fp32)``, with ddp the CUDA-autocast emulation of
``probes.autocast_emul`` around forward + loss (real CPU autocast casts different ops).

Order (see shared/notes/fake-trace.md): meta model -> bf16 cast -> fully_shard (mesh built
outside fake mode) -> inside ``FakeTensorMode(allow_non_fake_inputs=True)``:
``to_empty(device="cpu")``, optimizer, inputs. Warm-up: by default only the optimizer state
is created (one ``step()`` on zero gradients, before the tracker starts), then ONE measured
iteration runs in steady state (state present, grads None). ``warmup="iteration"`` instead
runs a full tracked warm-up iteration and resets the peak; on every configuration compared
(DDP/FSDP strategies, AC modes, precisions, optimizers, MoE) both give identical numbers, and
the cheap one halves the run time. With FSDP the optimizer steps the DTensors' local shards
(``_local_tensor``): the same local ops DTensor would run, without its sharding propagation,
which is slow (seconds for foreach ops over hundreds of DTensors) and, under FakeTensorMode,
allocates global-shaped temporaries that the tracker counts as optimizer memory (for
SGD-momentum 5x the sharded state; the "inflated first iteration" of the notes). An iteration is
``grad_accum`` micro-batches (capped at 2: the second one already sees the accumulated
gradients, further ones repeat it) of forward + loss + backward, then ``optimizer.step()`` and
``zero_grad(set_to_none=True)``.

Result categories (bytes, one rank; fake CPU tensors so no 512-byte allocator rounding):
``params`` (sharded / local), ``unsharded_params`` (FSDP all-gathered params), ``grads``
(sharded), ``unsharded_grads``, ``optimizer``, ``activations``, ``temp`` (backward
temporaries incl. activation grads), ``all_gather`` / ``reduce_scatter`` (FSDP comm buffers),
``buffers``, ``inputs``, ``other``. ``at_peak`` is the breakdown at the moment of the peak,
``max_by_category`` each category's own maximum over the measured iteration, ``end_of_step``
the breakdown after zero_grad. ``peak_phase`` is forward / backward / optimizer / zero_grad
and ``peak_module`` the innermost module active at the peak (when known).

CLI: ``python -m probes.trace [JSON]`` reads the configuration (see
``probes.runner.config_to_json``) from argv[1] or stdin and prints one JSON line:
``{"ok": true, ...}`` or ``{"ok": false, "reason": ..., "unsupported": bool}``.
``FITCHECK_PROBE_FAULT=raise|abort|segv|hang|exit3`` injects a failure (tests of the runner).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from planner.memory import Phase
from planner.spec import (
    Candidate,
    Checkpointing,
    ModelSpec,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    Precision,
    Strategy,
    TrainingSpec,
)

__all__ = ["trace_step", "UnsupportedConfig", "main"]

_MAX_MICRO_BATCHES = 2

# Tracker labels -> result category names.
_CATEGORY = {
    # MemTracker (_MemRefType)
    "Parameter": "params",
    "Buffer": "buffers",
    "Gradient": "grads",
    "Activation": "activations",
    "Temp": "temp",
    "Optstate": "optimizer",
    "Other": "inputs",  # only the inputs are registered as external tensors here
    # FSDPMemTracker (_FSDPRefType)
    "Sharded Param": "params",
    "Unsharded Param": "unsharded_params",
    "Sharded Grad": "grads",
    "Unsharded Grad": "unsharded_grads",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "OptState": "optimizer",
    "Inputs": "inputs",
}


class UnsupportedConfig(Exception):
    """The configuration cannot be traced by this probe (not a crash)."""


def _check_supported(model: ModelSpec, training: TrainingSpec, candidate: Candidate) -> None:
    if candidate.strategy.is_zero:
        raise UnsupportedConfig(
            f"strategy {candidate.strategy.value}: DeepSpeed ZeRO is not traced (no DeepSpeed"
            " under fake tensors); use the analytic model"
        )
    if candidate.offload is not Offload.NONE:
        raise UnsupportedConfig(
            f"offload {candidate.offload.value}: CPUOffloadPolicy fails under FakeTensorMode"
            " (aten._pin_memory not implemented); offload is modelled analytically"
        )
    if candidate.checkpointing is Checkpointing.AUTO:
        raise UnsupportedConfig("checkpointing 'auto' must be expanded before tracing")
    opt = training.optimizer
    if opt in (OptimizerKind.LION, OptimizerKind.ADAMW_8BIT):
        raise UnsupportedConfig(f"optimizer {opt.value}: not in torch.optim, not traced")
    if opt is OptimizerKind.ADAFACTOR:
        # torch.optim.Adafactor calls .item() on the step count and on parameter/update
        # norms (data-dependent Python scalars): aten._local_scalar_dense raises
        # DataDependentOutputException under FakeTensorMode, for every implementation.
        raise UnsupportedConfig(
            "optimizer adafactor: torch.optim.Adafactor reads tensor values (.item() of"
            " norms), which FakeTensorMode cannot provide; model its state analytically"
        )


def make_optimizer(params: list, training: TrainingSpec) -> torch.optim.Optimizer:
    impl = training.optimizer_impl
    flags: dict[str, Any] = {
        OptimizerImpl.FOREACH: {"foreach": True},
        OptimizerImpl.FUSED: {"fused": True},
        OptimizerImpl.FOR_LOOP: {"foreach": False},
    }[impl]
    opt = training.optimizer
    if opt is OptimizerKind.ADAMW:
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **flags)
    if opt is OptimizerKind.ADAM:
        return torch.optim.Adam(params, lr=1e-4, **flags)
    if opt is OptimizerKind.SGD:
        return torch.optim.SGD(params, lr=1e-3, **flags)
    if opt is OptimizerKind.SGD_MOMENTUM:
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)
    if opt is OptimizerKind.ADAFACTOR:
        return torch.optim.Adafactor(params, lr=1e-2, **flags)
    raise UnsupportedConfig(f"optimizer {opt.value} not traced")


def low_dtype(precision: Precision) -> torch.dtype | None:
    return {
        Precision.BF16_AMP: torch.bfloat16,
        Precision.FP16_AMP: torch.float16,
    }.get(precision)


def mesh_shape_for(strategy: Strategy, world_size: int, gpus_per_node: int) -> tuple[int, ...]:
    if strategy in (Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP):
        return (world_size,)
    if strategy is Strategy.NO_SHARD:
        return (world_size, 1)
    # hybrid_shard
    if world_size <= gpus_per_node:
        return (1, world_size)
    if world_size % gpus_per_node:
        raise UnsupportedConfig(
            f"hybrid_shard: world size {world_size} is not a multiple of gpus_per_node"
            f" {gpus_per_node}"
        )
    return (world_size // gpus_per_node, gpus_per_node)


def _tracker_class(base: type) -> type:
    """Adds per-category maxima, the peak's phase and module, and a peak reset."""

    class _Tracker(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.phase = "setup"
            self.cat_max: dict[str, int] = {}
            self.peak_total = 0
            self.peak_phase = ""
            self.peak_module = ""
            # Peak per moment of the step, the planner's five (planner.memory.Phase): forward,
            # loss_bwd (backward before any block), block_bwd, bwd_end (backward in the root
            # after the blocks: embeddings), optimizer (step + zero_grad).
            self.moment_peaks: dict[str, int] = {}
            self.moment_snaps: dict[str, dict] = {}
            self.seen_block_bwd = False

        def _moment(self) -> str:
            phase = self.phase
            if phase == "backward":
                if any(".blocks." in p for p in self._mod_tracker.parents):
                    self.seen_block_bwd = True
                    return Phase.BLOCK_BWD
                return Phase.BWD_END if self.seen_block_bwd else Phase.LOSS_BWD
            if phase in ("optimizer", "zero_grad"):
                return Phase.OPTIMIZER
            return Phase.FORWARD if phase == "forward" else phase

        def _update_peak_stats(self, peak_state: Any) -> None:
            # Replaces the base method, which also walks every tracked module's weak
            # reference on every op to keep per-module peaks (unused here, and about a
            # fifth of the trace time): only the global peak and category maxima are kept.
            total = 0
            cat_max = self.cat_max
            for dev, dev_snap in self._curr_mem_snap.items():
                for k, v in dev_snap.items():
                    if v > cat_max.get(k, 0):
                        cat_max[k] = v
                dev_total = dev_snap["Total"]
                if self._peak_mem.get(dev, 0) < dev_total:
                    self._peak_mem[dev] = dev_total
                    self._peak_mem_snap[dev] = dict(dev_snap)
                total += dev_total
            moment = self._moment()
            if total > self.moment_peaks.get(moment, -1):
                self.moment_peaks[moment] = total
                self.moment_snaps[moment] = {d: dict(v) for d, v in self._curr_mem_snap.items()}
            if total > self.peak_total:
                self.peak_total = total
                self.peak_phase = self.phase
                parents = self._mod_tracker.parents
                self.peak_module = max(parents, key=lambda s: (s.count("."), len(s)), default="")

        def reset_peak(self) -> None:
            snap = self.get_tracker_snapshot()
            self._peak_mem_snap = snap
            self._peak_mem = {dev: s["Total"] for dev, s in snap.items()}
            self.cat_max = {}
            for s in snap.values():
                for k, v in s.items():
                    self.cat_max[k] = max(self.cat_max.get(k, 0), v)
            self.peak_total = sum(s.get("Total", 0) for s in snap.values())
            self.peak_phase = self.phase
            self.peak_module = ""
            self.moment_peaks = {}
            self.moment_snaps = {}

    _Tracker.__name__ = base.__name__
    return _Tracker


def _module_name(fqn: str, root_cls: str) -> str:
    """ModTracker names modules '<RootClass>.blocks.3.mlp'; drop the root prefix."""
    if not fqn or fqn == "Global":
        return ""
    if fqn == root_cls:
        return "root"
    head, _, rest = fqn.partition(".")
    return rest if head == root_cls else fqn


def _categories(snap_by_dev: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for dev_snap in snap_by_dev.values():
        for k, v in dev_snap.items():
            key = "total" if k == "Total" else _CATEGORY.get(str(getattr(k, "value", k)), str(k))
            out[key] = out.get(key, 0) + int(v)
    return out


def _cat_max(raw: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, v in raw.items():
        key = "total" if k == "Total" else _CATEGORY.get(str(getattr(k, "value", k)), str(k))
        out[key] = max(out.get(key, 0), int(v))
    return out


def trace_step(
    model: ModelSpec,
    training: TrainingSpec,
    candidate: Candidate,
    world_size: int = 1,
    gpus_per_node: int = 8,
    *,
    local_optimizer: bool = True,
    warmup: str = "optimizer",
    selective_policy: str = "op",
) -> dict[str, Any]:
    """One rank's memory for one training step of this configuration (see module doc).

    ``warmup``: "optimizer" (default) creates the optimizer state with one step on zero
    gradients before tracking; "iteration" runs a whole tracked warm-up iteration first
    (slower; gives the same numbers, kept to check that). ``local_optimizer``: with FSDP,
    step the optimizer on the DTensors' local shards (default) instead of the DTensors.
    ``selective_policy``: what ``checkpointing="selective"`` means: "op" (default:
    torchtitan's op-level SAC, the policy the planner models) or "regions" (attention core +
    MLP activation product, Megatron-style); see probes/models.py.
    """
    had_pg = dist.is_initialized()
    try:
        return _trace_step(
            model,
            training,
            candidate,
            world_size,
            gpus_per_node,
            local_optimizer=local_optimizer,
            warmup=warmup,
            selective_policy=selective_policy,
        )
    finally:
        # The fake process group this call created is torn down, so that one process can
        # trace several FSDP configurations (tests); the CLI runs one per process anyway.
        if not had_pg and dist.is_initialized():
            dist.destroy_process_group()


def _trace_step(
    model: ModelSpec,
    training: TrainingSpec,
    candidate: Candidate,
    world_size: int = 1,
    gpus_per_node: int = 8,
    *,
    local_optimizer: bool = True,
    warmup: str = "optimizer",
    selective_policy: str = "op",
) -> dict[str, Any]:
    """See trace_step."""
    if warmup not in ("optimizer", "iteration"):
        raise ValueError(f"warmup must be 'optimizer' or 'iteration', got {warmup!r}")
    t_start = time.perf_counter()
    _check_supported(model, training, candidate)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")

    from torch._subclasses.fake_tensor import FakeTensorMode

    from probes.autocast_emul import CudaAutocastEmulation, recompute_context_fn
    from probes.models import build_model

    strategy = candidate.strategy
    fsdp = strategy.is_fsdp
    precision = training.precision
    low = low_dtype(precision)
    emulate_autocast = low is not None and not fsdp

    net = build_model(model, device="meta")
    net.configure(
        checkpointing=candidate.checkpointing,
        attention=training.attention.value,
        context_fn=recompute_context_fn(low) if emulate_autocast else None,
        selective_policy=selective_policy,
    )
    if precision is Precision.BF16:
        net = net.to(torch.bfloat16)
    n_params = sum(p.numel() for p in net.parameters())

    mesh_shape: tuple[int, ...] = (1,)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.testing._internal.distributed.fake_pg import FakeStore

        if not dist.is_initialized():
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
        elif dist.get_world_size() != world_size:
            raise RuntimeError(
                "a process group of another world size is already initialised in this process;"
                " run each configuration in its own process (probes.runner)"
            )
        mesh_shape = mesh_shape_for(strategy, world_size, gpus_per_node)
        names = ("dp",) if len(mesh_shape) == 1 else ("replicate", "shard")
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        reshard = strategy in (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
        mp = (
            MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
            if low is not None
            else MixedPrecisionPolicy()
        )
        for blk in net.blocks:
            fully_shard(blk, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(net, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)

    t_built = time.perf_counter()
    b, t = training.micro_batch, training.seq
    n_micro = min(training.grad_accum, _MAX_MICRO_BATCHES)
    with FakeTensorMode(allow_non_fake_inputs=True):
        net.to_empty(device="cpu")
        params = list(net.parameters())
        opt_params = params
        if fsdp and local_optimizer:
            # Step the optimizer on the DTensors' local shards: every FSDP placement is
            # Shard(0)/Replicate, so DTensor would run exactly these local ops, but its
            # sharding propagation of foreach ops over hundreds of DTensors costs seconds.
            opt_params = [p._local_tensor for p in params]
            if not all(lp.is_leaf for lp in opt_params):
                opt_params = params
        optimizer = make_optimizer(opt_params, training)
        ids = torch.randint(0, model.vocab, (b, t), dtype=torch.int64)
        targets = torch.randint(0, model.vocab, (b, t), dtype=torch.int64)
        t0 = time.perf_counter()
        if warmup == "optimizer":
            # Cheap warm-up: create the optimizer state with one step on zero gradients
            # (outside the tracker, which picks the state up when entered). The measured
            # iteration then runs in steady state: state present, grads None.
            for lp in opt_params:
                lp.grad = torch.zeros_like(lp)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if fsdp:
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            tracker = _tracker_class(FSDPMemTracker)(net, optimizer)
            tracker.track_inputs((ids, targets))
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = _tracker_class(MemTracker)()
            tracker.track_external(net, optimizer, ids, targets)

        def iteration() -> None:
            for _ in range(n_micro):
                # Per-module stats are not needed (and MemTracker refuses a module's second
                # forward without this); the global counters are untouched.
                tracker.reset_mod_stats()
                tracker.phase = "forward"
                tracker.seen_block_bwd = False
                ctx = CudaAutocastEmulation(low) if emulate_autocast else nullcontext()
                with ctx:
                    loss = net(ids, targets)
                tracker.phase = "backward"
                loss.backward()
                del loss
            tracker.phase = "optimizer"
            if opt_params is not params:
                for lp, p in zip(opt_params, params):
                    lp.grad = None if p.grad is None else p.grad._local_tensor
            optimizer.step()
            tracker.phase = "zero_grad"
            optimizer.zero_grad(set_to_none=True)
            if opt_params is not params:
                net.zero_grad(set_to_none=True)
            tracker.phase = "idle"

        with tracker:
            if warmup == "iteration":
                iteration()  # full warm-up iteration
            t1 = time.perf_counter()
            tracker.reset_peak()
            iteration()  # measured
            t2 = time.perf_counter()
            end = tracker.get_tracker_snapshot()
            peak_snap = tracker.get_tracker_snapshot("peak")
            peak = sum(tracker._peak_mem.values())

    # 0-dim optimizer state tensors (Adam's ``step``): tracked on the fake CPU device here,
    # but on CUDA they live in host memory unless the optimizer is fused (or capturable).
    scalar_bytes = sum(
        v.numel() * v.element_size()
        for st in optimizer.state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() == 0
    )
    at_peak = _categories(peak_snap)
    result = {
        "ok": True,
        "peak_bytes": int(peak),
        "peak_phase": tracker.peak_phase,
        "peak_module": _module_name(tracker.peak_module, type(net).__name__),
        "at_peak": at_peak,
        "max_by_category": _cat_max(tracker.cat_max),
        "moments": {str(k): {"peak_bytes": int(v), "at_peak": _categories(tracker.moment_snaps[k])}
                    for k, v in tracker.moment_peaks.items() if k != "idle"},
        "end_of_step": _categories(end),
        "tracker": type(tracker).__name__,
        "strategy": strategy.value,
        "world_size": world_size,
        "gpus_per_node": gpus_per_node,
        "mesh_shape": list(mesh_shape),
        "precision": precision.value,
        "autocast": "cuda-emulation" if emulate_autocast else ("fsdp-mp" if low else "none"),
        "checkpointing": candidate.checkpointing.value,
        "selective_policy": selective_policy,
        "attention": training.attention.value,
        "optimizer": training.optimizer.value,
        "optimizer_impl": training.optimizer_impl.value,
        "n_params": int(n_params),
        "optimizer_scalar_bytes": int(scalar_bytes),
        "optimizer_scalars_on_host": training.optimizer_impl is not OptimizerImpl.FUSED,
        "iterations": {"warmup": warmup, "measured": 1, "micro_batches": n_micro},
        "local_optimizer": bool(opt_params is not params),
        "build_s": round(t_built - t_start, 3),
        "warmup_s": round(t1 - t0, 3),
        "measured_s": round(t2 - t1, 3),
        "wall_s": round(time.perf_counter() - t_start, 3),
    }
    return result


def _inject_fault() -> None:
    fault = os.environ.get("FITCHECK_PROBE_FAULT", "")
    if not fault:
        return
    if fault == "raise":
        raise RuntimeError("injected failure (FITCHECK_PROBE_FAULT=raise)")
    if fault == "abort":
        os.abort()
    if fault == "segv":
        import ctypes

        ctypes.string_at(0)
    if fault == "hang":
        while True:
            time.sleep(1)
    if fault == "exit3":
        sys.stdout.flush()
        os._exit(3)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from probes.runner import config_from_json

    try:
        text = argv[0] if argv else sys.stdin.read()
        model, training, candidate, world_size, gpus_per_node = config_from_json(text)
        options = json.loads(text).get("options", {})
        _inject_fault()
        result = trace_step(model, training, candidate, world_size, gpus_per_node, **options)
    except UnsupportedConfig as exc:
        result = {"ok": False, "unsupported": True, "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - reported to the parent, not raised
        import traceback

        traceback.print_exc(file=sys.stderr)
        result = {"ok": False, "unsupported": False, "reason": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    # Skip interpreter teardown (process-group / fake-mode finalizers can be slow or noisy).
    os._exit(0)


if __name__ == "__main__":
    main()
