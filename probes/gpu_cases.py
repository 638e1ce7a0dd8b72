"""One process, many measured training cases: the worker of ``benchmarks/gpu_run.py``.

    python -m probes.gpu_cases --cases CASES.json --out RECORDS.jsonl [--device cuda|cpu]
    python -m probes.gpu_cases --runtime-terms --out RECORDS.jsonl
    python -m probes.gpu_cases --snapshot DIR --out RECORDS.jsonl

``--cases``: a JSON list of cases, all with the same world size and process-group kind (one
process group per process). A case is::

    {"id": str, "model": PRESET | ModelSpec dict, "layers": int | null,
     "training": {TrainingSpec fields}, "candidate": {Candidate fields},
     "world": int, "fake": bool, "warmup": int, "steps": int}

``fake: false`` (world 1 only): a real 1-rank NCCL group (gloo on the CPU). ``fake: true``:
torch's fake process group of ``world`` ranks (``torch.testing._internal.distributed.
fake_pg``); this process is rank 0 and holds real tensors, collectives move no data, so FSDP2
allocates exactly what one rank of a ``world``-GPU job allocates (its all-gather and
reduce-scatter buffers included) while no other GPU exists. Gradients are then garbage: the
loss values mean nothing, the memory and the step's compute do.

Per case (probes.models' reference transformer, wrapped as probes/cuda_probe.py wraps it):
warm-up steps, then measured steps; each moment's peak is read by resetting the allocator's
peak counters at the moment's start (``torch.cuda.reset_peak_memory_stats``, host-side
counters, no synchronisation):

=============  =========================================================================
moment         measured from ... to ...
=============  =========================================================================
forward        the micro-batch's start to the scalar loss (every saved activation, logits)
backward       ``loss.backward()`` start to its end (planner: loss_bwd, block_bwd, bwd_end)
optimizer      ``optimizer.step()``
=============  =========================================================================

each the maximum over the measured steps and micro-batches, allocated and reserved; plus the
device used after the measured steps (``mem_get_info``; the caching allocator keeps its
segments, so this is the step's peak device use), device used - reserved, step times (CUDA
events), and for an out-of-memory its whole message and traceback. One record per case is
appended to ``--out`` and flushed (and fsynced) at once, so a process killed at its time cap
keeps every case measured before.

``--runtime-terms``: the CUDA context, lazily loaded kernels, cuBLAS / cuBLASLt workspaces, a
1-rank NCCL communicator's buffers, each as device-used and allocator deltas (one record).
``--gemm``: achieved TFLOP/s of bf16 and float8 (``torch._scaled_mm``, tensorwise and rowwise
scales) matmuls at the shapes of Llama-3.1-8B's and -70B's linears (one record per shape).
``--float8-layer``: one linear's forward + backward, bf16 against torchao float8, eager and
compiled, and the dynamic cast alone (one record per shape and mode).
``--snapshot DIR``: a memory-history snapshot of one small training step
(``torch.cuda.memory._dump_snapshot``) written to DIR, one record.

A case with ``"least_memory": true`` is not measured per moment: ``least_memory`` bisects the
smallest allocator limit under which its steps still run (one ``least_memory`` record).
``FITCHECK_GPU_CASES_FAULT=hang:ID`` makes case ID never end (tests of the time caps).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import os
import resource
import socket
import statistics
import sys
import time
import traceback
import warnings
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from planner.spec import (
    Candidate,
    Checkpointing,
    CompileMode,
    Float8Recipe,
    GradSync,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
)

SCHEMA = "fitcheck-gpu-run/1"
MiB = 2**20

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.distributed")


def log(msg: str) -> None:
    print(f"[gpu_cases {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def append_record(path: str, rec: dict[str, Any]) -> None:
    """One JSON line appended and made durable before the next case starts."""
    line = json.dumps(rec, sort_keys=True, default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# --------------------------------------------------------------------------- device helpers


class Dev:
    def __init__(self, want: str) -> None:
        self.cuda = want == "cuda" and torch.cuda.is_available()
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def used(self) -> int | None:
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return int(total - free)

    def allocated(self) -> int | None:
        return int(torch.cuda.memory_allocated(self.device)) if self.cuda else None

    def reserved(self) -> int | None:
        return int(torch.cuda.memory_reserved(self.device)) if self.cuda else None

    def max_allocated(self) -> int | None:
        return int(torch.cuda.max_memory_allocated(self.device)) if self.cuda else None

    def max_reserved(self) -> int | None:
        return int(torch.cuda.max_memory_reserved(self.device)) if self.cuda else None

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)


def _nvml_used() -> int | None:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def _rss() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(dev: Dev, world: int, fake: bool) -> str:
    """The process group of this process's cases; returns its backend name."""
    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        return "fake"
    if world != 1:
        raise ValueError(f"world {world} needs fake: true (one process plays rank 0)")
    backend = "nccl" if dev.cuda else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1, timeout=_dt.timedelta(seconds=120))
    return backend


# --------------------------------------------------------------------------- one case


def model_spec(case: dict[str, Any]) -> ModelSpec:
    from planner.presets import get_preset
    from probes.runner import spec_from_dict

    m = case["model"]
    spec = get_preset(m) if isinstance(m, str) else spec_from_dict(ModelSpec, m)
    layers = case.get("layers")
    if layers and int(layers) != spec.n_layers:
        spec = dataclasses.replace(spec, n_layers=int(layers), name=f"{spec.name}@{layers}L")
    return spec


def build(dev: Dev, spec: ModelSpec, training: TrainingSpec, cand: Candidate, world: int):
    """(module, optimizer, fsdp?, autocast dtype or None, mesh shape)."""
    from probes.models import build_model, init_weights
    from probes.trace import low_dtype, make_optimizer, mesh_shape_for

    low = low_dtype(training.precision)
    strat = cand.strategy
    if cand.tp != 1:
        raise ValueError("tensor parallel is not measured by this worker")
    if strat.is_zero:
        raise ValueError(f"strategy {strat.value}: no DeepSpeed here")
    torch.manual_seed(0)
    fsdp = strat.is_fsdp
    net = build_model(spec, device="meta" if fsdp else dev.device)
    net.configure(checkpointing=cand.checkpointing, attention=training.attention.value,
                  selective_policy="op", sac_list=training.sac_list.value,
                  sac_force=training.sac_force_recompute, loss=training.loss.value,
                  loss_chunks=training.loss_chunks, keep_logits=training.keep_logits)
    if training.precision is Precision.BF16:
        net = net.to(torch.bfloat16)
    if training.float8 is not Float8Recipe.NONE:
        # torchtitan's order: the float8 converter, then compile, then FSDP (train.py)
        from probes.trace import float8_convert

        float8_convert(net, training)
    if training.compile is CompileMode.BLOCKS:
        # torchtitan: each transformer block compiled on its own, before FSDP wraps it
        for blk in net.blocks:
            blk.compile()
    elif training.compile is CompileMode.MODEL:
        net.compile()
    if not fsdp:
        if strat is not Strategy.DDP:
            raise ValueError(f"strategy {strat.value} is not measured by this worker")
        if world != 1:
            raise ValueError("ddp is measured at world size 1 only (its memory per rank does"
                             " not depend on the world size; buckets aside)")
        opt = make_optimizer([p for p in net.parameters() if p.requires_grad], training)
        return net, opt, False, low, [1]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    shape = mesh_shape_for(strat, world, world)
    names = ("dp",) if len(shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh(dev.device.type, shape, mesh_dim_names=names)
    reshard = strat in (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
    mp = (MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
          if low is not None else MixedPrecisionPolicy())
    kw: dict[str, Any] = dict(mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    offload = cand.offload is Offload.PARAMS_AND_OPTIMIZER
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=dev.cuda)
    elif cand.offload is not Offload.NONE:
        raise ValueError(f"offload {cand.offload.value} is not measured by this worker")
    for blk in net.blocks:
        fully_shard(blk, **kw)
    fully_shard(net, **kw)
    net.to_empty(device="cpu" if offload else dev.device)
    with torch.no_grad():
        init_weights(net)
    opt = make_optimizer([p for p in net.parameters() if p.requires_grad], training)
    return net, opt, True, None, list(shape)


_MOMENTS = ("forward", "backward", "optimizer")

def _float8_precompute(training: TrainingSpec, fsdp: bool):
    """torchtitan's ``precompute_float8_dynamic_scale_for_fsdp`` after each optimizer step
    (float8 tensorwise with float8 all-gather under FSDP2: one amax all-reduce for all
    weights instead of one per weight); None where it does not apply."""
    if not (fsdp and training.float8 is Float8Recipe.TENSORWISE and training.float8_all_gather):
        return None
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    return precompute_float8_dynamic_scale_for_fsdp


OFFLOAD_DIR_ENV = "FITCHECK_OFFLOAD_DIR"
"""A folder holding the activation-offloading files as their wheels ship them (the device run
carries them; fitcheck does not ship them): ``torchtune_<version>_activation_offloading.py``
(torchtune/training/_activation_offloading.py, the class the planner reads) and
``trl_<version>_activation_offloading.py`` (trl/models/activation_offloading.py, TRL's copy,
which axolotl uses)."""


def _load_offload_module(impl: str):
    """The named implementation's module, loaded from its file. torchtune's imports
    ``torchtune.modules.TiedLinear`` (an isinstance check on the output layer) and
    ``torchtune.utils.get_logger``: stood in for by a stub class and ``logging.getLogger``
    when torchtune itself is not installed, so the rest of torchtune is not needed."""
    import glob
    import importlib.util
    import logging
    import types

    folder = os.environ.get(OFFLOAD_DIR_ENV) or ""
    found = sorted(glob.glob(os.path.join(folder, f"{impl}_*_activation_offloading.py")))
    if not found:
        raise RuntimeError(f"{OFFLOAD_DIR_ENV}={folder!r} holds no {impl} offloading file")
    if impl == "torchtune":
        if importlib.util.find_spec("torchtune") is None:
            tt = types.ModuleType("torchtune")
            mods = types.ModuleType("torchtune.modules")
            utils = types.ModuleType("torchtune.utils")
            mods.TiedLinear = type("TiedLinear", (), {})
            utils.get_logger = lambda level=None: logging.getLogger("torchtune-offload")
            tt.modules, tt.utils = mods, utils
            sys.modules.update({"torchtune": tt, "torchtune.modules": mods,
                                "torchtune.utils": utils})
        try:  # torchao moved NF4Tensor (0.18: torchao.quantization...nf4); the file checks
            found_nf4 = importlib.util.find_spec("torchao.dtypes.nf4tensor") is not None
        except ImportError:  # torchao.dtypes itself missing
            found_nf4 = False
        if not found_nf4:
            nf4 = types.ModuleType("torchao.dtypes.nf4tensor")
            try:
                from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor
            except ImportError:
                NF4Tensor = type("NF4Tensor", (), {})
            nf4.NF4Tensor = NF4Tensor
            sys.modules["torchao.dtypes.nf4tensor"] = nf4
    spec = importlib.util.spec_from_file_location(f"{impl}_activation_offloading", found[-1])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, os.path.basename(found[-1])


class ActivationOffload:
    """Activation offloading as torchtune's recipes apply it: ``OffloadActivations()`` with its
    defaults (pinned memory, a second stream, 1,024 B minimum, 5 tensors of forward stash)
    around the model's forward, the output layer and the loss under ``NoOpManager`` (torchtune
    hooks the output layer; its loss runs outside the context). The reference model computes
    the loss inside ``forward``, so the no-op manager is entered after the final norm and left
    when ``forward`` returns: the final norm's own saved tensors are offloaded, the output
    layer's input and the loss's are not (planner.activations._offload_terms). ``impl``:
    ``torchtune`` (the class the planner reads) or ``trl`` (TRL's later copy: its
    ``__exit__`` synchronises both streams and clears the forward stash)."""

    def __init__(self, net, dev: Dev, impl: str = "torchtune") -> None:
        if not dev.cuda:
            raise RuntimeError("activation offloading needs CUDA (streams, pinned memory)")
        mod, self.source = _load_offload_module(impl)
        self.ctx = mod.OffloadActivations()
        if hasattr(self.ctx, "update_model_params"):
            self.ctx.update_model_params(net)  # TRL: parameters are never offloaded
        self.noop = mod.NoOpManager()
        self.inside = False  # the no-op manager entered (after the final norm)
        self.active = False  # inside forward()
        self.last: dict[str, int] | None = None  # the last forward's tally
        net.final_norm.register_forward_hook(self._enter_noop)

    def _enter_noop(self, *_: Any) -> None:
        if self.active and not self.inside:
            self.noop.__enter__()
            self.inside = True

    def describe(self) -> dict[str, Any]:
        c = self.ctx
        return {"source": self.source, "use_pin_memory": c.use_pin_memory,
                "use_streams": c.use_streams, "min_offload_size": c.min_tensor_size_bytes,
                "max_fwd_stash_size": getattr(c, "max_fwd_stash_size", None),
                "no_op": "output layer and loss"}

    @contextmanager
    def forward(self):
        with self.ctx:
            self.active = True
            try:
                yield
            finally:
                if self.inside:
                    self.noop.__exit__(None, None, None)
                    self.inside = False
                self.active = False
                self.tally()


    def tally(self) -> None:
        """What the forward handed to the hooks, read from the class's own ``tracker``
        (tensor id -> (tensor, modified, ...)): bytes copied to the host, and bytes left on
        the device (small, parameters, no-op region, repeated storages), each storage once."""
        host = device = 0
        seen: set[tuple[int, int]] = set()
        for entry in getattr(self.ctx, "tracker", {}).values():
            t, moved = entry[0], bool(entry[1])
            if not isinstance(t, torch.Tensor):
                continue
            try:
                key = (t.untyped_storage().data_ptr(), int(t.device.type == "cuda"))
                n = t.untyped_storage().nbytes()
            except (RuntimeError, NotImplementedError):
                key, n = (id(t), 2), t.numel() * t.element_size()
            if key in seen:
                continue
            seen.add(key)
            if moved:
                host += n
            elif t.device.type == "cuda":
                device += n
        self.last = {"host_bytes": host, "kept_on_device_bytes": device,
                     "tensors": len(getattr(self.ctx, "tracker", {}))}


def sdpa_backend(dev: Dev, spec: ModelSpec, training: TrainingSpec) -> str | None:
    """The SDPA backend torch picks for this case's attention (``torch._fused_sdp_choice``
    on empty q, k, v of the case's shapes, in the dtype the kernel sees): which op the
    selective policy is shown (flash, efficient, cuDNN...). None for eager attention or when
    torch cannot say."""
    from torch.nn.attention import SDPBackend

    if training.attention.value != "sdpa":
        return None
    dt = {Precision.FP32: torch.float32, Precision.FP16_AMP: torch.float16}.get(
        training.precision, torch.bfloat16)
    b, t, d = training.micro_batch, training.seq, spec.d_head
    try:
        q = torch.empty(b, spec.n_heads, t, d, dtype=dt, device=dev.device)
        kv = torch.empty(b, spec.n_kv_heads, t, d, dtype=dt, device=dev.device)
        choice = torch._fused_sdp_choice(q, kv, kv, None, 0.0, not spec.encoder_head,
                                         enable_gqa=spec.n_kv_heads < spec.n_heads)
        del q, kv
        return next((name for name in dir(SDPBackend) if not name.startswith("_")
                     and int(getattr(SDPBackend, name)) == int(choice)), str(choice))
    except (RuntimeError, TypeError, ValueError, AttributeError) as exc:
        return f"unknown ({type(exc).__name__})"


def run_case(dev: Dev, case: dict[str, Any], world: int, fake: bool) -> dict[str, Any]:
    from planner.throughput import training_flops_per_token
    from probes.runner import spec_from_dict, spec_to_dict

    spec = model_spec(case)
    training = spec_from_dict(TrainingSpec, case.get("training", {}))
    cand = spec_from_dict(Candidate, case["candidate"])
    warm, steps = int(case.get("warmup", 2)), int(case.get("steps", 3))
    rec: dict[str, Any] = {
        "record": "case", "id": case["id"], "part": case.get("part"), "world_size": world,
        "fake_group": fake, "model": spec_to_dict(spec), "model_name": spec.name,
        "training": spec_to_dict(training), "candidate": spec_to_dict(cand),
        "steps": {"warmup": warm, "measured": steps}, "ok": False, "oom": False,
        "error": None, "allocator_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }
    # before the baseline below (its empty q, k, v are freed and the cache emptied)
    rec["sdpa_backend"] = sdpa_backend(dev, spec, training)
    if cand.checkpointing is Checkpointing.SELECTIVE:
        from probes.models import sac_save_ops

        rec["sac_list"] = training.sac_list.value
        rec["sac_save_ops"] = list(sac_save_ops(training.sac_list.value))
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()
        dev.sync()
    rec["before"] = {"allocated": dev.allocated(), "reserved": dev.reserved(),
                     "device_used": dev.used()}
    dev.reset_peak()
    peaks = {m: {"allocated": 0, "reserved": 0} for m in _MOMENTS}
    after = {}
    times: list[float] = []
    losses: list[float] = []
    net = opt = ids = None
    moment = "build"
    t0 = time.perf_counter()
    try:
        net, opt, fsdp, low, mesh_shape = build(dev, spec, training, cand, world)
        dev.sync()
        rec["float8_linears"] = sum(type(m).__name__ == "Float8Linear" for m in net.modules())
        rec.update(build_s=round(time.perf_counter() - t0, 3), mesh_shape=mesh_shape,
                   wrapper="fully_shard" if fsdp else "none (world size 1)")
        rec["after_build"] = {"allocated": dev.allocated(), "reserved": dev.reserved(),
                              "max_allocated": dev.max_allocated()}
        g = torch.Generator(device="cpu").manual_seed(1234)
        ids = torch.randint(0, spec.vocab, (training.micro_batch, training.seq),
                            generator=g).to(dev.device)
        ga = training.grad_accum
        sync_last = fsdp and training.grad_sync is GradSync.LAST
        offload = (ActivationOffload(net, dev, case.get("offload_impl", "torchtune"))
                   if training.activation_offload else None)
        precompute = _float8_precompute(training, fsdp)
        rec["float8_precompute_scale"] = precompute is not None
        if offload:
            rec["activation_offload"] = offload.describe()

        def peak(m: str) -> None:
            a, r = dev.max_allocated(), dev.max_reserved()
            if a is not None and measuring:
                peaks[m]["allocated"] = max(peaks[m]["allocated"], a)
                peaks[m]["reserved"] = max(peaks[m]["reserved"], r)

        for i in range(warm + steps):
            measuring = i >= warm
            if dev.cuda:
                ev0, ev1 = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
                ev0.record()
            ts = time.perf_counter()
            for micro in range(ga):
                if fsdp:
                    net.set_requires_gradient_sync((micro == ga - 1) or not sync_last)
                moment = "forward"
                dev.reset_peak()
                amp = (torch.autocast(dev.device.type, dtype=low) if low is not None
                       else nullcontext())
                with (offload.forward() if offload else nullcontext()), amp:
                    loss = net(ids, ids)
                peak("forward")
                if measuring and micro == 0:
                    after["forward"] = dev.allocated()
                moment = "backward"
                dev.reset_peak()
                loss.backward()
                peak("backward")
                if i == warm + steps - 1 and micro == ga - 1:
                    losses.append(float(loss.detach().float().item()))
                del loss
            if measuring:
                after["backward"] = dev.allocated()
            moment = "optimizer"
            dev.reset_peak()
            opt.step()
            if precompute:
                precompute(net)
            peak("optimizer")
            opt.zero_grad(set_to_none=True)
            net.held = []
            moment = "idle"
            if measuring:
                after["step_end"] = dev.allocated()
                if offload is not None and offload.last is not None:
                    rec["activation_offload"]["last_forward"] = offload.last
            if dev.cuda:
                ev1.record()
                ev1.synchronize()
                dt = ev0.elapsed_time(ev1) / 1e3
            else:
                dt = time.perf_counter() - ts
            if measuring:
                times.append(dt)
        rec["ok"] = True
    except torch.OutOfMemoryError as exc:
        rec.update(oom=True, oom_moment=moment, error=f"OutOfMemoryError: {_first(exc)}",
                   oom_message=str(exc), traceback=traceback.format_exc())
    except Exception as exc:  # noqa: BLE001 - a case's failure is a result
        rec.update(error=f"{type(exc).__name__}: {_first(exc)}", failed_moment=moment,
                   traceback=traceback.format_exc()[-6000:])
    dev.sync()
    rec["moments"] = peaks if dev.cuda else None
    rec["allocated_after"] = after if dev.cuda else None
    if dev.cuda:
        stats = torch.cuda.memory_stats(dev.device)
        rec["max_allocated_bytes"] = max(p["allocated"] for p in peaks.values()) or None
        rec["max_reserved_bytes"] = max(p["reserved"] for p in peaks.values()) or None
        used, res = dev.used(), dev.reserved()
        rec.update(device_used_bytes=used, reserved_bytes=res, nvml_used_bytes=_nvml_used(),
                   runtime_overhead_bytes=None if used is None else used - res,
                   allocator_stats={k: stats.get(k) for k in (
                       "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
                       "segment.all.peak", "inactive_split_bytes.all.peak",
                       "requested_bytes.all.peak", "oversize_allocations.peak")})
        if rec["oom"]:
            # the peaks reached before the failure (a lower bound)
            rec["max_allocated_bytes"] = dev.max_allocated()
            rec["max_reserved_bytes"] = dev.max_reserved()
    else:  # the CPU: no device memory to read
        rec.update(max_allocated_bytes=None, max_reserved_bytes=None, device_used_bytes=None,
                   reserved_bytes=None, runtime_overhead_bytes=None)
    rec["host_max_rss_bytes"] = _rss()
    if dev.cuda and hasattr(torch.cuda, "host_memory_stats"):
        try:  # the pinned host memory torch's CachingHostAllocator holds (activation offload)
            hs = torch.cuda.host_memory_stats()
            rec["host_pinned"] = {k: hs.get(k) for k in (
                "allocated_bytes.current", "allocated_bytes.peak", "reserved_bytes.current",
                "reserved_bytes.peak", "num_host_alloc")}
        except Exception as exc:  # noqa: BLE001 - a record without it is still a record
            rec["host_pinned"] = {"error": _first(exc)}
    rec["step_times_s"] = [round(t, 6) for t in times]
    rec["step_time_s"] = statistics.median(times) if times else None
    rec["loss_last"] = losses[-1] if losses else None
    tokens = training.micro_batch * training.seq * training.grad_accum
    flops = tokens * training_flops_per_token(spec, training.seq, cand.checkpointing)
    rec["tokens_per_step"] = tokens
    rec["flops_per_step"] = flops
    rec["achieved_tflops"] = flops / rec["step_time_s"] / 1e12 if rec["step_time_s"] else None
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    del net, opt, ids
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()
    return rec


def _first(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else "")[:400]


def run_cases(dev: Dev, cases: list[dict[str, Any]], out: str) -> int:
    worlds = {(int(c.get("world", 1)), bool(c.get("fake", False))) for c in cases}
    if len(worlds) != 1:
        raise ValueError(f"one world size and group kind per process, got {sorted(worlds)}")
    world, fake = worlds.pop()
    if not fake and os.environ.get("FITCHECK_GPU_GROUP") == "fake":
        # the runtime part found no working NCCL: a fake 1-rank group (FSDP2 allocates the
        # same; only NCCL's own buffers are missing from device used)
        log("FITCHECK_GPU_GROUP=fake: a fake 1-rank group instead of NCCL")
        fake = True
    t = time.perf_counter()
    backend = init_group(dev, world, fake)
    used0 = dev.used()
    if not fake:
        one = torch.ones(1, device=dev.device)
        dist.all_reduce(one)  # the communicator (and its buffers) exists from here
        dev.sync()
        del one
    append_record(out, {"record": "group", "backend": backend, "world_size": world,
                        "fake_group": fake, "init_s": round(time.perf_counter() - t, 3),
                        "device_used_before_bytes": used0,
                        "device_used_after_first_collective_bytes": dev.used(),
                        "reserved_bytes": dev.reserved(), "date": _now()})
    fault = os.environ.get("FITCHECK_GPU_CASES_FAULT", "")
    for i, case in enumerate(cases):
        log(f"case {i + 1}/{len(cases)} {case['id']}")
        if fault == f"hang:{case['id']}":  # tests: a case that never ends
            while True:
                time.sleep(1)
        if case.get("least_memory"):
            least_memory(dev, case, world, out)
            continue
        rec = run_case(dev, case, world, fake)
        rec["date"] = _now()
        append_record(out, rec)
        state = ("OOM" if rec["oom"] else
                 f"ok {rec['step_time_s']:.4f} s/step" if rec["ok"] else f"failed: {rec['error']}")
        mem = (f", max allocated {rec['max_allocated_bytes'] / 2**30:.2f} GiB, reserved "
               f"{rec['max_reserved_bytes'] / 2**30:.2f} GiB"
               if rec.get("max_allocated_bytes") else "")
        log(f"case {case['id']}: {state}{mem} ({rec['wall_s']:.1f} s)")
    dist.destroy_process_group()
    return 0


# --------------------------------------------------------------------------- the least memory a step needs


def _plain_step(net, opt, ids, training: TrainingSpec, fsdp: bool, low) -> None:
    """One optimizer step of ``grad_accum`` micro-batches, no instrumentation."""
    ga = training.grad_accum
    for micro in range(ga):
        if fsdp:
            net.set_requires_gradient_sync(micro == ga - 1
                                           or training.grad_sync is not GradSync.LAST)
        with torch.autocast(net_device(net).type, dtype=low) if low is not None else \
                nullcontext():
            loss = net(ids, ids)
        loss.backward()
        del loss
    opt.step()
    opt.zero_grad(set_to_none=True)
    net.held = []


def net_device(net) -> torch.device:
    return next(iter(net.parameters())).device


def bisect_least(lo: int, hi: int, tol: int, trial, out_of_time
                 ) -> tuple[int, int | None, list[dict[str, Any]]]:
    """(least limit that ran, largest that failed or None, the trials), given that ``hi``
    ran and nothing below ``lo`` can: ``lo`` is tried first, then the interval is halved
    while it is wider than ``tol`` and ``out_of_time()`` is false. ``trial(limit)`` ->
    (ran, error)."""
    trials: list[dict[str, Any]] = []

    def attempt(limit: int) -> bool:
        t1 = time.perf_counter()
        ok, err = trial(limit)
        trials.append({"limit_bytes": limit, "ok": ok, "error": err,
                       "s": round(time.perf_counter() - t1, 2)})
        return ok

    if attempt(lo):
        return lo, None, trials
    while hi - lo > tol and not out_of_time():
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if attempt(mid) else (mid, hi)
    return hi, lo, trials


def least_memory(dev: Dev, case: dict[str, Any], world: int, out: str) -> dict[str, Any]:
    """The smallest allocator limit under which the step still runs: bisection over
    ``torch.cuda.set_per_process_memory_fraction`` (the caching allocator then fails exactly
    as at a real out-of-memory: it frees its cached blocks and retries before raising;
    c10/cuda/CUDACachingAllocator.cpp). Steady state: two unconstrained steps first (the
    optimizer state exists), then each trial runs ``trial_steps`` steps under the limit; the
    model is rebuilt after a failed trial (an exception inside FSDP's hooks leaves it
    mid-step)."""
    from probes.runner import spec_from_dict, spec_to_dict

    spec = model_spec(case)
    training = spec_from_dict(TrainingSpec, case.get("training", {}))
    cand = spec_from_dict(Candidate, case["candidate"])
    fake = bool(case.get("fake"))
    total = torch.cuda.get_device_properties(dev.device).total_memory if dev.cuda else None
    rec: dict[str, Any] = {
        "record": "least_memory", "id": case["id"], "part": case.get("part"),
        "world_size": world, "fake_group": fake, "model": spec_to_dict(spec),
        "model_name": spec.name, "training": spec_to_dict(training),
        "candidate": spec_to_dict(cand), "allocator_conf": os.environ.get(
            "PYTORCH_CUDA_ALLOC_CONF"), "device_total_bytes": total, "trials": [],
        "ok": False, "error": None}
    steps = int(case.get("trial_steps", 2))
    state: dict[str, Any] = {}

    def fresh() -> None:
        state.clear()
        gc.collect()
        if dev.cuda:
            torch.cuda.empty_cache()
        net, opt, fsdp, low, _ = build(dev, spec, training, cand, world)
        ids = torch.randint(0, spec.vocab, (training.micro_batch, training.seq),
                            generator=torch.Generator().manual_seed(1234)).to(dev.device)
        state.update(net=net, opt=opt, fsdp=fsdp, low=low, ids=ids)
        for _ in range(2):
            dev.reset_peak()
            _plain_step(net, opt, ids, training, fsdp, low)
        dev.sync()

    def trial(limit: int | None) -> tuple[bool, str | None]:
        if not state:
            fresh()
        if dev.cuda:
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(
                1.0 if limit is None else min(1.0, limit / total), dev.device)
            dev.reset_peak()
        try:
            for _ in range(steps):
                _plain_step(state["net"], state["opt"], state["ids"], training,
                            state["fsdp"], state["low"])
            dev.sync()
            return True, None
        except torch.OutOfMemoryError as exc:
            state.clear()
            return False, _first(exc)
        finally:
            if dev.cuda:
                torch.cuda.set_per_process_memory_fraction(1.0, dev.device)

    t0 = time.perf_counter()
    try:
        ok, err = trial(None)
        if not ok:
            raise RuntimeError(f"out of memory without a limit: {err}")
        a, r = dev.max_allocated(), dev.max_reserved()
        rec.update(max_allocated_bytes=a, max_reserved_bytes=r)
        if dev.cuda:
            budget = float(case.get("budget_s", 25))
            ok_at, failed_at, trials = bisect_least(
                a, r, max(256 * MiB, a // 200), trial,
                lambda: time.perf_counter() - t0 >= budget)
            rec["trials"] = trials
            rec.update(least_limit_ok_bytes=ok_at, largest_limit_failed_bytes=failed_at,
                       resolution_bytes=0 if failed_at is None else ok_at - failed_at)
        rec["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a result
        rec.update(error=f"{type(exc).__name__}: {_first(exc)}",
                   traceback=traceback.format_exc()[-4000:])
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    state.clear()
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()
    rec["date"] = _now()
    append_record(out, rec)
    lim = rec.get("least_limit_ok_bytes")
    log(f"least memory {case['id']}: " + (
        f"{lim / 2**30:.2f} GiB (allocated peak {rec['max_allocated_bytes'] / 2**30:.2f}, "
        f"reserved peak {rec['max_reserved_bytes'] / 2**30:.2f}, "
        f"{len(rec['trials'])} trials, {rec['wall_s']:.1f} s)" if lim else
        f"{rec['error'] or 'no device memory on the CPU'}"))
    return rec


# --------------------------------------------------------------------------- runtime terms


def runtime_terms(dev: Dev, out: str) -> int:
    """What the runtime holds outside the tensors a training step allocates (one record)."""
    rec: dict[str, Any] = {"record": "runtime_terms", "date": _now(),
                           "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING"),
                           "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
                           "cublaslt_workspace_size": os.environ.get(
                               "CUBLASLT_WORKSPACE_SIZE"),
                           "device": dev.device.type}
    steps: list[dict[str, Any]] = []

    def point(name: str, **extra: Any) -> None:
        dev.sync()
        steps.append({"point": name, "device_used": dev.used(), "nvml_used": _nvml_used(),
                      "allocated": dev.allocated(), "reserved": dev.reserved(), **extra})

    base = _nvml_used() if dev.cuda else None
    rec["nvml_used_before_context"] = base
    if dev.cuda:
        torch.cuda.init()
    point("context")
    x = torch.ones(1, device=dev.device)
    point("one_element_tensor")
    n = 4096
    a = torch.randn(n, n, device=dev.device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev.device, dtype=torch.bfloat16)
    point("bf16_operands")
    c = a @ b
    del c
    point("bf16_matmul (cuBLAS handle + workspace)")
    bias = torch.randn(n, device=dev.device, dtype=torch.bfloat16)
    c = torch.addmm(bias, a, b)
    del c
    point("bf16_addmm with bias (cuBLASLt)")
    af, bf = a.float(), b.float()
    c = af @ bf
    del c, af, bf
    point("fp32_matmul")
    lin = torch.nn.Linear(n, n, device=dev.device, dtype=torch.bfloat16)
    y = torch.nn.functional.scaled_dot_product_attention(
        *(torch.randn(2, 8, 1024, 128, device=dev.device, dtype=torch.bfloat16,
                      requires_grad=True) for _ in range(3)), is_causal=True)
    y.sum().backward()
    z = lin(a).float().log_softmax(-1).sum()
    z.backward()
    opt = torch.optim.AdamW(lin.parameters(), fused=dev.cuda)
    opt.step()
    opt2 = torch.optim.AdamW(lin.parameters(), foreach=True)
    opt2.step()
    del y, z, opt, opt2, lin
    point("kernels: sdpa fwd/bwd, log_softmax, linear bwd, fused + foreach AdamW")
    del a, b, bias, x
    gc.collect()
    if dev.cuda:
        torch.cuda.empty_cache()
    point("empty_cache")
    rec["points"] = list(steps)
    append_record(out, rec)  # kept even if NCCL hangs below and the part is killed
    steps.clear()
    t = time.perf_counter()
    init_group(dev, 1, False)
    point("nccl init_process_group (world 1)")
    one = torch.ones(1, device=dev.device)
    dist.all_reduce(one)
    point("first all_reduce (communicator + buffers)", s=round(time.perf_counter() - t, 3))
    big = torch.ones(64 * MiB // 4, device=dev.device)
    dist.all_reduce(big)
    dist.all_gather_into_tensor(torch.empty(64 * MiB // 4, device=dev.device), big)
    del big
    if dev.cuda:
        torch.cuda.empty_cache()
    point("64 MiB all_reduce + all_gather, empty_cache")
    dist.destroy_process_group()
    point("destroy_process_group")
    append_record(out, {"record": "runtime_nccl", "date": _now(), "points": steps,
                        "nccl_env": {k: v for k, v in os.environ.items()
                                     if k.startswith("NCCL_")}})
    log("runtime terms recorded")
    return 0


# --------------------------------------------------------------------------- snapshot


def snapshot(dev: Dev, folder: str, out: str) -> int:
    """A memory-history snapshot of one small training step, and a torchtitan-style log line
    of the same step."""
    from probes.models import build_model
    from probes.trace import make_optimizer

    spec = model_spec({"model": {**_tiny_llama_dict(), "name": "snapshot-llama"}})
    training = TrainingSpec(seq=512, micro_batch=2)
    net = build_model(spec, device=dev.device)
    opt = make_optimizer(list(net.parameters()), training)
    ids = torch.randint(0, spec.vocab, (2, 512), device=dev.device)
    path = os.path.join(folder, "memory_snapshot.pickle")
    rec: dict[str, Any] = {"record": "snapshot", "date": _now(), "model": spec.name}
    if dev.cuda:
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=20000)
    for _ in range(2):
        with torch.autocast(dev.device.type, dtype=torch.bfloat16):
            loss = net(ids, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if dev.cuda:
        dev.sync()
        tmp = path + ".tmp"
        torch.cuda.memory._dump_snapshot(tmp)
        os.replace(tmp, path)
        torch.cuda.memory._record_memory_history(enabled=None)
        rec.update(path=os.path.basename(path), bytes=os.path.getsize(path),
                   max_allocated_bytes=dev.max_allocated(),
                   max_reserved_bytes=dev.max_reserved())
    else:
        rec.update(path=None, note="no CUDA: no snapshot")
    append_record(out, rec)
    return 0


def _tiny_llama_dict() -> dict[str, Any]:
    from planner.presets import get_preset
    from probes.runner import spec_to_dict

    d = spec_to_dict(get_preset("llama3.2-1b"))
    d.update(n_layers=2, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1408, vocab=8192,
             head_dim=0)
    return d


# --------------------------------------------------------------------------- GEMM rates


def gemm_shapes() -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) of one linear's three GEMMs at 8,192 tokens: the forward (M x K @ K x N),
    the input gradient (M x N @ N x K) and the weight gradient (N x M @ M x K), for the
    linears of Llama-3.1-8B and -70B (q|k|v fused as torchtitan's float8 sees them separately:
    q, kv, o, gate, down) and a small square control."""
    out = []
    t = 8192
    for model, h, kv, f in (("8b", 4096, 1024, 14336), ("70b", 8192, 1024, 28672)):
        for lin, k, n in (("q", h, h), ("kv", h, kv), ("o", h, h), ("gate", h, f),
                          ("down", f, h)):
            out += [(f"{model}.{lin}.fwd", t, k, n), (f"{model}.{lin}.dgrad", t, n, k),
                    (f"{model}.{lin}.wgrad", n, t, k)]
    out.append(("square2048", 2048, 2048, 2048))
    return out


def _time_op(dev: Dev, fn, reps: int = 10, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    dev.sync()
    times = []
    for _ in range(reps):
        if dev.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_rates(dev: Dev, out: str, tiny: bool = False) -> int:
    """Achieved TFLOP/s of bf16 ``mm`` and of ``torch._scaled_mm`` in float8 (e4m3 x e4m3
    tensorwise and rowwise scales; e5m2 x e4m3 for the gradients, as torchao's tensorwise
    recipe casts ``grad_output`` to e5m2) at each shape of ``gemm_shapes`` (one record per
    shape): what a linear's matmuls reach on this GPU, beside the datasheet peaks the
    profiles hold."""
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    for name, m, k, n in gemm_shapes():
        if tiny:
            m, k, n = 64, 32, 48
        rec: dict[str, Any] = {"record": "gemm", "shape": name, "m": m, "k": k, "n": n,
                               "flops": 2 * m * k * n, "date": _now(), "device": dev.device.type}
        try:
            a = torch.randn(m, k, device=dev.device, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev.device, dtype=torch.bfloat16)
            rec["bf16_s"] = _time_op(dev, lambda: torch.mm(a, w.t()))
            one = torch.ones((), device=dev.device, dtype=torch.float32)
            grad = name.endswith(("dgrad", "wgrad"))
            a8 = a.to(e5 if grad else e4)
            w8 = w.to(e4)
            rec["fp8_tensorwise_dtypes"] = f"{a8.dtype} x {w8.dtype}"
            rec["fp8_tensorwise_s"] = _time_op(dev, lambda: torch._scaled_mm(
                a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
            a8r = a.to(e4)
            sa = torch.ones(m, 1, device=dev.device, dtype=torch.float32)
            sb = torch.ones(1, n, device=dev.device, dtype=torch.float32)
            rec["fp8_rowwise_s"] = _time_op(dev, lambda: torch._scaled_mm(
                a8r, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
        except Exception as exc:  # noqa: BLE001 - a shape's failure is a result
            rec["error"] = f"{type(exc).__name__}: {_first(exc)}"
        for key in ("bf16", "fp8_tensorwise", "fp8_rowwise"):
            t = rec.get(f"{key}_s")
            rec[f"{key}_tflops"] = rec["flops"] / t / 1e12 if t else None
        append_record(out, rec)
    log("gemm rates recorded")
    return 0


def float8_layer_times(dev: Dev, out: str, tiny: bool = False) -> int:
    """One linear's forward + backward at 8,192 tokens, bf16 ``nn.Linear`` against torchao's
    ``Float8Linear`` (tensorwise, rowwise), eager and under ``torch.compile``, and torchao's
    dynamic cast of one bf16 activation alone (``hp_tensor_to_float8_dynamic``): what the
    casts cost on this GPU beside the float8 GEMMs' saving (one record per shape and mode)."""
    import torch.nn as nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    t = 64 if tiny else 8192
    shapes = (("1b.o", 2048, 2048), ("1b.up", 2048, 8192), ("1b.down", 8192, 2048),
              ("8b.o", 4096, 4096), ("8b.up", 4096, 14336), ("8b.down", 14336, 4096))
    for name, k, n in shapes:
        if tiny:
            k, n = 32, 48
        for compiled in (False, True):
            rec: dict[str, Any] = {"record": "float8_layer", "shape": name, "tokens": t,
                                   "k": k, "n": n, "compiled": compiled, "date": _now(),
                                   "device": dev.device.type}
            try:
                x = torch.randn(t, k, device=dev.device, dtype=torch.bfloat16,
                                requires_grad=True)
                g = torch.randn(t, n, device=dev.device, dtype=torch.bfloat16)
                for recipe in ("bf16", "tensorwise", "rowwise"):
                    lin = nn.Sequential(nn.Linear(k, n, bias=False)).to(dev.device,
                                                                           torch.bfloat16)
                    if recipe != "bf16":
                        convert_to_float8_training(
                            lin, config=Float8LinearConfig.from_recipe_name(recipe))
                    if compiled:  # a fresh dynamo cache per module: in one process the
                        # ninth compile of Sequential.forward hit recompile_limit (8) and ran
                        # eager (2026-11-26-h100-b run3.log: 1B down rowwise and every 8B one)
                        torch._dynamo.reset()
                    fn = torch.compile(lin) if compiled else lin

                    def step(fn=fn):
                        y = fn(x)
                        y.backward(g)
                    rec[f"{recipe}_s"] = _time_op(dev, step, reps=10, warm=3)
                for key in ("tensorwise", "rowwise"):
                    rec[f"{key}_over_bf16"] = rec[f"{key}_s"] / rec["bf16_s"]
                cfg = LinearMMConfig()
                a = x.detach()

                def cast(a=a):
                    return hp_tensor_to_float8_dynamic(a, torch.float8_e4m3fn, cfg)
                castf = torch.compile(cast) if compiled else cast
                rec["cast_s"] = _time_op(dev, castf, reps=10, warm=3)
                rec["cast_elements"] = t * k
            except Exception as exc:  # noqa: BLE001 - a shape's failure is a result
                rec["error"] = f"{type(exc).__name__}: {_first(exc)}"
            append_record(out, rec)
    log("float8 layer times recorded")
    return 0


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--cases")
    g.add_argument("--runtime-terms", action="store_true")
    g.add_argument("--snapshot")
    g.add_argument("--gemm", action="store_true")
    g.add_argument("--float8-layer", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="with --gemm: tiny shapes")
    args = ap.parse_args(argv)
    dev = Dev(args.device)
    if args.device == "cuda" and not dev.cuda:
        log("CUDA not available: running on the CPU (memory fields are null)")
    if args.runtime_terms:
        return runtime_terms(dev, args.out)
    if args.snapshot:
        return snapshot(dev, args.snapshot, args.out)
    if args.gemm:
        return gemm_rates(dev, args.out, args.tiny)
    if args.float8_layer:
        return float8_layer_times(dev, args.out, args.tiny)
    with open(args.cases, encoding="utf-8") as f:
        cases = json.load(f)
    return run_cases(dev, cases, args.out)


if __name__ == "__main__":
    sys.exit(main())
