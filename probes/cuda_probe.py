"""The per-rank worker of a probe run: real training steps, measured, one record per candidate.

Launched by ``fitcheck probe`` (planner/probe_cli.py, through probes/cuda_launch.py) as::

    python -m torch.distributed.run --nproc-per-node N -m probes.cuda_probe \
        --config CONFIG.json --out RECORDS.jsonl

``CONFIG.json`` (written by the launcher): the model, training and candidate specs
(probes.runner's JSON form), steps, warm-up steps, device, proxy layers and the bandwidth sweep.

Per candidate, every rank builds the reference transformer (``probes.models``), wraps it
(DDP; FSDP2 ``fully_shard`` per block + root with ``MixedPrecisionPolicy`` for the -amp
precisions, meshes as in probes/trace.py; ``CPUOffloadPolicy`` for params_and_optimizer
offload), runs ``warmup`` steps, resets the allocator's peak counters, runs ``steps``
measured steps, and reports

* ``max_allocated_bytes`` / ``max_reserved_bytes``: torch.cuda.max_memory_allocated/reserved
  over the measured steps;
* ``device_used_bytes``: torch.cuda.mem_get_info total - free after the measured steps (the
  caching allocator keeps its segments, so this is the step's peak device use); NVML's
  device used too when pynvml is importable;
* ``runtime_overhead_bytes`` = device used - reserved: what is outside the allocator (CUDA
  context, lazily loaded kernels, NCCL buffers);
* per process, once: ``cuda_context_bytes`` (device used after ``torch.cuda.init()`` + a
  1-element tensor, minus the pre-context baseline from NVML / nvidia-smi when available,
  minus that tensor's reserved segment) and ``nccl_buffer_bytes`` (device-used growth across
  the first collective minus the allocator's reserved growth);
* ``step_time_s``: median of the measured steps (CUDA events on a GPU, perf_counter on CPU),
  the slowest rank's; ``achieved_tflops`` from ``planner.throughput.training_flops_per_token``.

After the candidates, one ``collectives`` record: all_reduce / all_gather / reduce_scatter of
a few sizes, with bus bandwidth as nccl-tests defines it (``busbw = algbw * 2(n-1)/n`` for
all-reduce, ``* (n-1)/n`` for all-gather and reduce-scatter; NCCL's PERFORMANCE.md).

An out-of-memory error is a result: the candidate is recorded with ``oom: true`` (and the
peak reached before it) and the next candidate runs. Without CUDA (or with ``device: cpu``)
the same code runs with the gloo backend; the device memory fields are null and
``host_max_rss_bytes`` is the only memory figure.

Rank 0 rewrites the whole JSONL output atomically (temp file + ``os.replace``) after every
candidate, so a run cut short keeps what it measured. Progress goes to stderr.

Fault injection for tests (``FITCHECK_CUDA_PROBE_FAULT``): ``oom:I`` raises
``torch.OutOfMemoryError`` in candidate I's first step (every rank); ``hang`` sleeps forever
after start-up; ``crash`` raises on rank 0 after start-up.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import warnings
from contextlib import nullcontext
from typing import Any

import torch
import torch.distributed as dist

from planner.spec import (
    Candidate,
    ModelSpec,
    Offload,
    Precision,
    Strategy,
    TrainingSpec,
)
from probes.runner import spec_from_dict, spec_to_dict

SCHEMA = "fitcheck-probe/1"
PROBED_STRATEGIES = (Strategy.DDP, Strategy.NO_SHARD, Strategy.SHARD_GRAD_OP,
                     Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
MiB = 2**20

warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
warnings.filterwarnings("ignore", message="DTensor random operators")


def log(msg: str) -> None:
    print(f"[probe] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- environment


def _nvml_handle(index: int) -> Any:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def _physical_index(local_rank: int) -> int:
    """The NVML index of this rank's device (CUDA_VISIBLE_DEVICES remaps torch's)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in vis.split(",") if v.strip()]
    if ids and local_rank < len(ids) and ids[local_rank].isdigit():
        return int(ids[local_rank])
    return local_rank


def _nvml_used(nv: Any) -> int | None:
    if nv is None:
        return None
    try:
        mod, h = nv
        return int(mod.nvmlDeviceGetMemoryInfo(h).used)
    except Exception:  # noqa: BLE001
        return None


def _smi(query: str, index: int) -> str | None:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits",
                              "-i", str(index)], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip().splitlines()
    return text[0].strip() if out.returncode == 0 and text else None


def _driver_version(nv: Any, index: int) -> str | None:
    if nv is not None:
        try:
            v = nv[0].nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:  # noqa: BLE001
            pass
    return _smi("driver_version", index)


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - no NCCL in a CPU build
        return None
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v)
    return str(v)


def _rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


# --------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Ctx:
    cfg: dict[str, Any]
    rank: int
    local_rank: int
    world: int
    device: torch.device
    cuda: bool
    nv: Any
    env: dict[str, Any]
    process: dict[str, Any]
    """Per-process measurements: context, NCCL growth (this rank)."""


def _used(ctx: Ctx) -> int | None:
    if not ctx.cuda:
        return None
    free, total = torch.cuda.mem_get_info(ctx.device)
    return int(total - free)


def _sync(ctx: Ctx) -> None:
    if ctx.cuda:
        torch.cuda.synchronize(ctx.device)


def setup(cfg: dict[str, Any]) -> Ctx:
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    want = cfg.get("device", "cuda")
    cuda = want == "cuda" and torch.cuda.is_available()
    if want == "cuda" and not cuda and rank == 0:
        log("CUDA not available: running on CPU with gloo (memory fields are null)")
    process: dict[str, Any] = {}
    nv = None
    phys = _physical_index(local_rank)
    if cuda:
        nv = _nvml_handle(phys)
        # Baseline before this process creates a context: NVML or nvidia-smi (both read the
        # device without a CUDA context); None when neither exists (then the device is
        # assumed idle before we start).
        base = _nvml_used(nv)
        base_src = "nvml" if base is not None else None
        if base is None:
            s = _smi("memory.used", phys)
            if s is not None and s.replace(".", "").isdigit():
                base, base_src = int(float(s) * MiB), "nvidia-smi"
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.cuda.init()
        free0, total = torch.cuda.mem_get_info(device)
        used_init = int(total - free0)
        tiny = torch.ones(1, device=device)
        torch.cuda.synchronize(device)
        used_tiny = int(total - torch.cuda.mem_get_info(device)[0])
        reserved_tiny = int(torch.cuda.memory_reserved(device))
        del tiny
        process.update(
            device_used_baseline_bytes=base, baseline_source=base_src or "assumed-idle",
            device_used_after_init_bytes=used_init, device_used_after_tensor_bytes=used_tiny,
            cuda_context_bytes=used_tiny - (base or 0) - reserved_tiny)
        torch.cuda.empty_cache()
        mem_total: int | None = int(total)
        gpu_name = torch.cuda.get_device_name(device)
    else:
        device = torch.device("cpu")
        mem_total = None
        gpu_name = "cpu"
    env = {
        "gpu_name": gpu_name,
        "gpu_profile": cfg.get("gpu_profile"),
        "memory_total_bytes": mem_total,
        "driver": _driver_version(nv, phys) if cuda else None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "nccl": _nccl_version() if cuda else None,
        "hostname": socket.gethostname(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device.type,
        "backend": "nccl" if cuda else "gloo",
        "python": sys.version.split()[0],
    }
    backend = "nccl" if cuda else "gloo"
    timeout = _dt.timedelta(seconds=float(cfg.get("collective_timeout_s", 600)))
    dist.init_process_group(backend, timeout=timeout)
    ctx = Ctx(cfg=cfg, rank=rank, local_rank=local_rank, world=world, device=device, cuda=cuda,
              nv=nv, env=env, process=process)
    # NCCL creates its communicator (and its device buffers) at the first collective.
    used0, res0 = _used(ctx), torch.cuda.memory_reserved(device) if cuda else 0
    one = torch.ones(1, device=device)
    dist.all_reduce(one)
    _sync(ctx)
    if cuda:
        used1, res1 = _used(ctx), torch.cuda.memory_reserved(device)
        process["nccl_buffer_bytes"] = int((used1 - used0) - (res1 - res0))
    del one
    return ctx


def _fault(kind: str, ctx: Ctx) -> None:
    fault = os.environ.get("FITCHECK_CUDA_PROBE_FAULT", "")
    if fault == "hang" and kind == "start":
        log(f"rank {ctx.rank}: injected hang")
        while True:
            time.sleep(1)
    if fault == "crash" and kind == "start" and ctx.rank == 0:
        raise RuntimeError("injected crash (FITCHECK_CUDA_PROBE_FAULT=crash)")


def _oom_injected(index: int) -> bool:
    fault = os.environ.get("FITCHECK_CUDA_PROBE_FAULT", "")
    return fault.startswith("oom:") and fault[4:].strip() == str(index)


def _layers_for(ctx: Ctx, model: ModelSpec, training: TrainingSpec, cand: Candidate) -> tuple[
        int, str | None]:
    """(layers to build, why fewer than the model's). ``--proxy-layers`` wins; on a GPU, the
    depth is reduced when the planner predicts that the model states (params + grads +
    optimizer state) alone exceed 80 % of the device."""
    k = ctx.cfg.get("proxy_layers")
    if k:
        k = min(int(k), model.n_layers)
        return k, None if k == model.n_layers else f"--proxy-layers {k}"
    total = ctx.env.get("memory_total_bytes")
    if not total:
        return model.n_layers, None
    from planner.memory import estimate
    from planner.spec import Cluster, GpuProfile

    gpu = GpuProfile(id="probe", name=ctx.env["gpu_name"], vendor="nvidia", memory_bytes=total,
                     bf16_tflops=1.0, fp16_tflops=1.0, tf32_tflops=1.0, fp32_tflops=1.0,
                     hbm_bandwidth_bytes_per_s=1.0, intra_node_link="?",
                     intra_node_bandwidth_bytes_per_s=1.0, inter_node_bandwidth_bytes_per_s=1.0,
                     gpus_per_node=int(ctx.cfg.get("gpus_per_node", ctx.world)),
                     host_ram_bytes_per_node=1 << 40, pcie_bandwidth_bytes_per_s=1.0,
                     cuda_context_bytes=0)
    cluster = Cluster(gpu=gpu, n_gpus=ctx.world, gpus_per_node=gpu.gpus_per_node,
                      host_ram_bytes_per_node=1 << 40)

    def states(layers: int) -> int:
        m = dataclasses.replace(model, n_layers=layers)
        b = estimate(m, training, cluster, cand).breakdown
        return b.params + b.gradients + b.optimizer_states

    limit = 0.8 * total
    if states(model.n_layers) <= limit:
        return model.n_layers, None
    k = model.n_layers
    while k > 1 and states(k) > limit:
        k = max(1, k // 2) if states(max(1, k // 2)) > limit else k - 1
    return k, (f"model states of {model.n_layers} layers predicted above 80 % of "
               f"{total / 2**30:.1f} GiB")


def _mesh(ctx: Ctx, strategy: Strategy):
    from torch.distributed.device_mesh import init_device_mesh

    from probes.trace import mesh_shape_for

    gpn = int(ctx.cfg.get("gpus_per_node") or ctx.world)
    shape = mesh_shape_for(strategy, ctx.world, gpn)
    names = ("dp",) if len(shape) == 1 else ("replicate", "shard")
    return init_device_mesh(ctx.device.type, shape, mesh_dim_names=names), list(shape)


def _build(ctx: Ctx, model: ModelSpec, training: TrainingSpec, cand: Candidate):
    """(module to call, optimizer, wrapper name, mesh shape, autocast dtype or None)."""
    from probes.models import build_model, init_weights
    from probes.trace import low_dtype, make_optimizer

    low = low_dtype(training.precision)
    strat = cand.strategy
    if strat not in PROBED_STRATEGIES:
        raise ValueError(f"strategy {strat.value} is not probed (no DeepSpeed in the probe)")
    ckpt = dict(checkpointing=cand.checkpointing, attention=training.attention.value,
                selective_policy="op")
    torch.manual_seed(0)
    if strat is Strategy.DDP:
        if cand.offload is not Offload.NONE:
            raise ValueError("ddp has no offload")
        net = build_model(model, device=ctx.device, **ckpt)
        if training.precision is Precision.BF16:
            net = net.to(torch.bfloat16)
        wrapper, mesh_shape = "none (world size 1)", [1]
        module: torch.nn.Module = net
        if ctx.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            kw = {"device_ids": [ctx.local_rank]} if ctx.cuda else {}
            module = DDP(net, **kw)
            wrapper, mesh_shape = "ddp", [ctx.world]
        opt = make_optimizer(list(module.parameters()), training)
        return module, opt, wrapper, mesh_shape, low
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    from probes.trace import fsdp_policies, storage_dtype

    net = build_model(model, device="meta", **ckpt)
    store = storage_dtype(training)  # --precision bf16 or the policy's storage dtype
    if store is not None:
        net = net.to(store)
    mesh, mesh_shape = _mesh(ctx, strat)
    reshard = strat in (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
    mp, root_mp = fsdp_policies(training)
    kw: dict[str, Any] = dict(mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    offload = cand.offload is Offload.PARAMS_AND_OPTIMIZER
    if offload:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=ctx.cuda)
    elif cand.offload is not Offload.NONE:
        raise ValueError(f"offload {cand.offload.value} is ZeRO-Offload (not probed)")
    for blk in net.blocks:
        fully_shard(blk, **kw)
    fully_shard(net, **{**kw, "mp_policy": root_mp})
    # Materialise the sharded parameters where FSDP keeps them (host RAM under offload).
    net.to_empty(device="cpu" if offload else ctx.device)
    with torch.no_grad():
        init_weights(net)
    opt = make_optimizer(list(net.parameters()), training)
    return net, opt, "fully_shard", mesh_shape, low


def _step(ctx: Ctx, module, opt, ids, ga: int, low, fsdp: bool) -> None:
    for micro in range(ga):
        last = micro == ga - 1
        if fsdp:
            module.set_requires_gradient_sync(last)
            sync_ctx = nullcontext()
        else:
            sync_ctx = module.no_sync() if (not last and hasattr(module, "no_sync")) else nullcontext()
        amp = (torch.autocast(ctx.device.type, dtype=low) if (low is not None and not fsdp)
               else nullcontext())
        with sync_ctx:
            with amp:
                loss = module(ids, ids)
            loss.backward()
        del loss
    opt.step()
    opt.zero_grad(set_to_none=True)


def run_candidate(ctx: Ctx, index: int, model: ModelSpec, training: TrainingSpec,
                  cand: Candidate) -> dict[str, Any]:
    from planner.throughput import training_flops_per_token

    layers, proxy_reason = _layers_for(ctx, model, training, cand)
    used_model = model if layers == model.n_layers else dataclasses.replace(
        model, n_layers=layers, name=f"{model.name}@{layers}L")
    warm = int(ctx.cfg.get("warmup", 2))
    steps = int(ctx.cfg.get("steps", 5))
    rec: dict[str, Any] = {
        "n_layers_used": layers, "proxy": layers != model.n_layers,
        "proxy_reason": proxy_reason, "model": spec_to_dict(used_model),
        "oom": False, "ok": False, "error": None,
    }
    if ctx.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
    module = opt = ids = None
    times: list[float] = []
    t_build = time.perf_counter()
    try:
        module, opt, wrapper, mesh_shape, low = _build(ctx, used_model, training, cand)
        rec.update(wrapper=wrapper, mesh_shape=mesh_shape)
        fsdp = wrapper == "fully_shard"
        g = torch.Generator(device="cpu").manual_seed(1234 + ctx.rank)
        ids = torch.randint(0, used_model.vocab, (training.micro_batch, training.seq),
                            generator=g).to(ctx.device)
        rec["build_s"] = round(time.perf_counter() - t_build, 3)
        for i in range(warm + steps):
            if i == 0 and _oom_injected(index):
                raise torch.OutOfMemoryError(
                    f"injected out of memory (FITCHECK_CUDA_PROBE_FAULT=oom:{index})")
            if i == warm and ctx.cuda:
                _sync(ctx)
                torch.cuda.reset_peak_memory_stats(ctx.device)
            if ctx.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                _step(ctx, module, opt, ids, training.grad_accum, low, fsdp)
                end.record()
                end.synchronize()
                dt = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                _step(ctx, module, opt, ids, training.grad_accum, low, fsdp)
                dt = time.perf_counter() - t0
            if i >= warm:
                times.append(dt)
        rec["ok"] = True
    except torch.OutOfMemoryError as exc:
        rec["oom"] = True
        rec["error"] = f"OutOfMemoryError: {str(exc).splitlines()[0][:300]}"
    except Exception as exc:  # noqa: BLE001 - one candidate's failure is a result too
        rec["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        if os.environ.get("FITCHECK_DEBUG"):
            import traceback

            traceback.print_exc()
    # Memory as the step left it (or as the OOM left it: the peak reached is a lower bound).
    if ctx.cuda:
        _sync(ctx)
        max_alloc = int(torch.cuda.max_memory_allocated(ctx.device))
        max_res = int(torch.cuda.max_memory_reserved(ctx.device))
        reserved_now = int(torch.cuda.memory_reserved(ctx.device))
        used = _used(ctx)
        rec.update(max_allocated_bytes=max_alloc, max_reserved_bytes=max_res,
                   device_used_bytes=used, nvml_device_used_bytes=_nvml_used(ctx.nv),
                   runtime_overhead_bytes=None if used is None else used - reserved_now)
    else:
        rec.update(max_allocated_bytes=None, max_reserved_bytes=None, device_used_bytes=None,
                   nvml_device_used_bytes=None, runtime_overhead_bytes=None)
    rec["host_max_rss_bytes"] = _rss_bytes()
    rec["step_times_s"] = [round(t, 6) for t in times]
    rec["step_time_s"] = statistics.median(times) if times else None
    tokens = training.micro_batch * training.seq * training.grad_accum
    flops = tokens * training_flops_per_token(used_model, training.seq, cand.checkpointing)
    rec["tokens_per_step_per_rank"] = tokens
    rec["flops_per_step_per_rank"] = flops
    rec["achieved_tflops"] = (flops / rec["step_time_s"] / 1e12) if rec["step_time_s"] else None
    del module, opt, ids
    gc.collect()
    if ctx.cuda:
        torch.cuda.empty_cache()
    return rec


def _merge(ctx: Ctx, local: dict[str, Any]) -> dict[str, Any] | None:
    """Gather every rank's record; rank 0 gets one record (the worst rank on top)."""
    local = {**local, "rank": ctx.rank, "local_rank": ctx.local_rank, **ctx.process}
    gathered: list[Any] = [None] * ctx.world
    dist.all_gather_object(gathered, local)
    if ctx.rank != 0:
        return None
    out = dict(gathered[0])
    for key in ("max_allocated_bytes", "max_reserved_bytes", "device_used_bytes",
                "nvml_device_used_bytes", "runtime_overhead_bytes", "step_time_s",
                "cuda_context_bytes", "nccl_buffer_bytes", "host_max_rss_bytes"):
        vals = [g.get(key) for g in gathered if g.get(key) is not None]
        out[key] = max(vals) if vals else None
    out["oom"] = any(g.get("oom") for g in gathered)
    out["ok"] = all(g.get("ok") for g in gathered)
    errors = [g.get("error") for g in gathered if g.get("error")]
    out["error"] = errors[0] if errors else None
    if out["step_time_s"]:
        out["achieved_tflops"] = out["flops_per_step_per_rank"] / out["step_time_s"] / 1e12
    out["per_rank"] = [{k: g.get(k) for k in (
        "rank", "local_rank", "max_allocated_bytes", "max_reserved_bytes", "device_used_bytes",
        "runtime_overhead_bytes", "cuda_context_bytes", "nccl_buffer_bytes", "step_time_s",
        "host_max_rss_bytes", "oom", "error")} for g in gathered]
    for k in ("rank", "local_rank"):
        out.pop(k, None)
    return out


def bandwidth_sweep(ctx: Ctx) -> list[dict[str, Any]]:
    n = ctx.world
    sizes = ctx.cfg.get("bandwidth_sizes") or ([1 * MiB, 16 * MiB, 128 * MiB, 512 * MiB]
                                               if ctx.cuda else [64 * 1024, 1 * MiB])
    iters = int(ctx.cfg.get("bandwidth_iters", 10 if ctx.cuda else 3))
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    out = []
    for size in sizes:
        elems = max(n, size // 4 // n * n)  # fp32, divisible by n
        nbytes = elems * 4
        full = torch.ones(elems, device=ctx.device)
        part = torch.ones(elems // n, device=ctx.device)
        ops = {
            "all_reduce": (lambda f=full: dist.all_reduce(f), 2.0 * (n - 1) / n),
            "all_gather": (lambda f=full, p=part: ag(f, p), (n - 1) / n),
            "reduce_scatter": (lambda f=full, p=part: rs(p, f), (n - 1) / n),
        }
        for name, (fn, factor) in ops.items():
            fn()  # warm-up (and algorithm selection)
            _sync(ctx)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            _sync(ctx)
            dt = (time.perf_counter() - t0) / iters
            # the slowest rank's time is the collective's time
            t = torch.tensor([dt], dtype=torch.float64, device=ctx.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            dt = float(t.item())
            algbw = nbytes / dt
            out.append({"op": name, "bytes": nbytes, "time_s": dt, "algbw_bytes_per_s": algbw,
                        "busbw_bytes_per_s": algbw * factor, "iters": iters})
        del full, part
    if ctx.cuda:
        torch.cuda.empty_cache()
    return out


def _write_atomic(path: str, records: list[dict[str, Any]]) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="fitcheck probe worker (run under torchrun)")
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        cfg = json.load(f)
    model = spec_from_dict(ModelSpec, cfg["model"])
    training = spec_from_dict(TrainingSpec, cfg["training"])
    cands = [spec_from_dict(Candidate, c) for c in cfg["candidates"]]
    ctx = setup(cfg)
    _fault("start", ctx)
    common = {
        "schema": SCHEMA, "run_id": cfg.get("run_id"), "env": ctx.env,
        "world_size": ctx.world, "gpus_per_node": int(cfg.get("gpus_per_node") or ctx.world),
        "requested_model": spec_to_dict(model), "training": spec_to_dict(training),
        "steps": {"warmup": int(cfg.get("warmup", 2)), "measured": int(cfg.get("steps", 5))},
    }
    records: list[dict[str, Any]] = []
    for i, cand in enumerate(cands):
        label = f"{cand.strategy.value} offload={cand.offload.value} ckpt={cand.checkpointing.value}"
        if ctx.rank == 0:
            log(f"candidate {i + 1}/{len(cands)}: {label}")
        rec = run_candidate(ctx, i, model, training, cand)
        merged = _merge(ctx, rec)
        if ctx.rank == 0 and merged is not None:
            merged = {**common, "record": "step", "candidate": spec_to_dict(cand), **merged}
            records.append(merged)
            _write_atomic(args.out, records)
            if merged["oom"]:
                state = "OOM"
            elif merged["ok"]:
                alloc = merged.get("max_allocated_bytes")
                mem = f", max allocated {alloc / 2**30:.2f} GiB" if alloc is not None else ""
                state = f"ok, {merged['step_time_s']:.4f} s/step{mem}"
            else:
                state = f"failed: {merged['error']}"
            log(f"candidate {i + 1}/{len(cands)}: {label}: {state}")
    if cfg.get("bandwidth", True):
        if ctx.rank == 0:
            log("collective bandwidth sweep")
        sweep = bandwidth_sweep(ctx)
        if ctx.rank == 0:
            records.append({**common, "record": "collectives", "bandwidth": sweep,
                            **{k: v for k, v in ctx.process.items()}})
            _write_atomic(args.out, records)
    dist.barrier()
    dist.destroy_process_group()
    if ctx.rank == 0:
        log(f"wrote {len(records)} records to {args.out}")
    return 0


def _main() -> int:
    try:
        return main()
    except BaseException as exc:  # noqa: BLE001 - one line the launcher reports as the reason
        if isinstance(exc, SystemExit):
            raise
        import traceback

        traceback.print_exc()
        first = str(exc).splitlines()[0][:300] if str(exc) else ""
        log(f"FATAL rank {os.environ.get('RANK', '0')}: {type(exc).__name__}: {first}")
        return 1


if __name__ == "__main__":
    sys.exit(_main())
