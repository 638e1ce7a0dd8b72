"""Trace one pipeline rank of a real ``torch.distributed.pipelining`` step on fake tensors.

The referee of the planner's pipeline-parallel memory (planner/memory/pipeline.py). One
process plays global rank ``pp_rank * dp`` of a fake process group of ``pp x dp`` ranks
(``torch.testing._internal.distributed.fake_pg``), with a 2-D ``(pp, dp)`` mesh as
torchtitan builds it (pipeline outermost). It builds fitcheck's reference transformer
(``probes.models``) on the meta device and keeps, for each stage the rank holds
(``planner.pipeline.rank_stages``), torchtitan's module split (``planner.pipeline
.stage_layers``: the embedding on the first stage, the final norm and the head on the last),
shards every block and then the stage with FSDP2 as torchtitan does under PP
(``reshard_after_forward=False``, bf16 / fp32 MixedPrecisionPolicy under -amp), wraps each
in a ``PipelineStage`` with static metadata and runs ONE ``schedule.step`` of the real
schedule class, then the optimizer step, under torch's ``MemTracker``.

With ``tp`` > 1 (FSDP x TP x PP, torchtitan's 405B layout) the mesh is ``(pp, dp, tp)``, tp
innermost as torchtitan's ``ParallelDims`` builds it, and rank ``pp_rank * dp * tp`` is
traced: the whole meta model is first tensor-parallelized over tp with torchtitan's plan
(``probes.finetune_tp.apply_tp_plan``: sequence parallel, the head vocab-sharded), then split
and FSDP2-sharded over dp; a stage receives and sends its block output's local piece,
seq / tp positions (the last ``RowwiseParallel(output_layouts=Shard(1))`` returns the local
tensor); the step runs inside ``loss_parallel()``, as torchtitan's train context holds it
around the whole schedule step, and DTensor's sharding propagation on global-shape fake
tensors is kept out of the tracker (``probes.trace._untracked_sharding_propagation``).

With ``cp`` > 1 (FSDP x CP x PP, torchtitan's 4D mesh without TP) the ``dp`` dimension is
dp_shard x cp (FSDP2 shards each stage over both: ``parallelize_llama``'s dp_shard_cp), every
stage runs on seq / cp tokens of each micro-batch, and SDPA is torch's ring attention over a
cp group (``probes.context_parallel.ring_sdpa``: torch's ring forward and backward on the
local tensors, this process cp rank 0), around the whole schedule step as torchtitan's train
context holds ``context_parallel``, any checkpointing (the ring's dispatch mode sits below a
selective-checkpoint mode, as DTensor's dispatch does). With ``tp`` > 1 as well (PP x TP x
CP) the mesh is ``(pp, dp_shard x cp, tp)``: TP's column-parallel q, k, v are local tensors
of n_heads / tp heads, which the ring takes as it does on a GPU.

With ``ep`` > 1 (PP x EP, torchtitan's layout for DeepSeek-V3 and Llama-4: docs/model.md
§8.8 "Beside pipeline parallel") every block's MoE is torchtitan's all-to-all dispatch
(``probes.ep_trace.EPMoE``), a sparse ``(pp, efsdp, ep)`` mesh is built over the same ranks
beside the dense ``(pp, dp)`` one (efsdp = dp / ep), and each stage is sharded as torchtitan's
``apply_fsdp_to_decoder`` shards a model part (``probes.ep_trace.shard_stage``: the embedding
and the norm + head their own units, each block one unit with the experts on the stage's
efsdp mesh, explicit prefetching); the stage's all-to-alls run inside its forward and
backward of every micro-batch. Not with TP, CP or selective checkpointing.

What the fake process group cannot do, emulated:

- a received tensor reads back as it was allocated: the warm-up vote of ``_PipelineSchedule
  ._warmup_p2p`` (every stage of the real job passes static metadata, so every vote is
  STATIC) is answered with that result (``PipelineStage._warmup_backward_result``);
- nothing else: the P2P sends and receives run on the fake group with their real buffers.

The tracker's own module hooks on gradients are left out (``_no_backward_module_hooks``):
under a split backward (ZBV, DualPipeV, Interleaved Zero Bubble) they would keep graph nodes
alive that no real run keeps, and torch refuses one of their questions inside the input
backward.

Only this process's rank is measured; the other ranks of the pipeline are not run (their
sends to this rank are the fake group's no-ops). ``python -m probes.pipeline_trace`` runs one
configuration given as JSON and prints the result (with ``"timeline": true`` also what the
rank holds after each compute action); ``trace_job`` runs the same job in the calling
process and tears its process group down after it (``tests/test_pipeline.py``: one
configuration after another in a test worker; the benchmark keeps a process per
configuration).
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner import pipeline
from planner.spec import (
    Checkpointing,
    ModelSpec,
    PipeKeptOutputs,
    PipeSchedule,
    PositionKind,
    TrainingSpec,
)

SCHEDULES = {PipeSchedule.GPIPE: "ScheduleGPipe", PipeSchedule.ONE_F_ONE_B: "Schedule1F1B",
             PipeSchedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
             PipeSchedule.INTERLEAVED_ZB: "ScheduleInterleavedZeroBubble",
             PipeSchedule.ZBV: "ScheduleZBVZeroBubble",
             PipeSchedule.DUALPIPEV: "ScheduleDualPipeV"}


@contextlib.contextmanager
def _no_backward_module_hooks() -> Any:
    """The tracker's module bookkeeping (``ModTracker._fw_pre_hook`` / ``_fw_post_hook``)
    puts a multi-grad hook on each module's inputs and outputs to learn when the module's
    backward starts and ends; the probe reads only the global counters, which the hooks do
    not feed. Under a split backward (ZBV, DualPipeV) these hooks cost what no real run
    pays, so they are left out (for every schedule: the 1F1B, GPipe and interleaved traces
    are byte-identical either way):

    - an input hook's closure holds its tensor's ``grad_fn`` (``register_multi_grad_hook``:
      ``grad_fns``) and is stored on that node: a cycle that the garbage collector does not
      break, so the nodes the weight backward does not run keep their saved tensors to the
      end of the step (+21 MB per micro-batch on the last stage of the 8-layer model);
    - its first call asks ``torch._C._will_engine_execute_node`` about the stage's received
      input, a leaf, inside the input backward's ``autograd.grad``, which torch 2.13 refuses:
      "A leaf node was passed to _will_engine_execute_node but we are currently running
      autograd.grad()"."""
    from torch.distributed._tools import mod_tracker

    class _Nothing:
        def remove(self) -> None:
            pass

    original = mod_tracker.register_multi_grad_hook
    mod_tracker.register_multi_grad_hook = lambda *args, **kwargs: _Nothing()
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = original


def _each_micro_batch(base: type) -> type:
    """``MemTracker`` refuses a root module's second forward (a second iteration); a pipeline
    stage runs one forward per micro-batch. The stage's own per-module statistics (unused
    here) are dropped before each, so it is tracked as new; the global counters are
    untouched (``probes.trace`` clears them all per micro-batch with ``reset_mod_stats``,
    which a rank holding two stages cannot: the other's backward hooks read them)."""

    class _Tracker(base):  # type: ignore[misc, valid-type]
        def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
            name = self._mod_tracker.get_known_fqn(module)
            if module in self.memory_tracking and not self._mod_tracker.is_bw and \
                    set(self._mod_tracker.parents) - {name} == {"Global"}:
                del self.memory_tracking[module]
            super()._pre_fw_hook(module, inputs)

    return _Tracker


def _global_peak_only(base: type) -> type:
    """``MemTracker`` with only its global peak kept: the base ``_update_peak_stats`` also
    walks every tracked module (a weak dictionary) on every op to keep per-module peaks,
    which this probe never reads (a quarter of the trace's time on the 8-layer model). The
    global peak and its snapshot are updated as the base updates them (``_peak_mem``,
    ``_peak_mem_snap``: a copy of the current per-device snapshot, whose values are ints).
    ``probes.trace._tracker_class`` replaces the method the same way."""

    class _Tracker(base):  # type: ignore[misc, valid-type]
        def _update_peak_stats(self, peak_state: Any) -> None:
            for dev, dev_snap in self._curr_mem_snap.items():
                total = dev_snap["Total"]
                if self._peak_mem.get(dev, 0) < total:
                    self._peak_mem[dev] = total
                    self._peak_mem_snap[dev] = dict(dev_snap)

    return _Tracker


class _StaticVote:
    """The warm-up vote's result, read with ``.item()`` (a tensor would be fake inside
    FakeTensorMode, whose ``item()`` has no value)."""

    def item(self) -> int:
        return 1


class StageModule(nn.Module):
    """One pipeline stage of the reference transformer: torchtitan's ``pipeline_module_split``
    keeps the modules of the stage and drops the rest; the forward is the reference model's
    with the missing parts skipped (RoPE's tables are computed on every stage, as torchtitan's
    model reads its ``freqs_cis`` buffer on every stage)."""

    def __init__(self, net: nn.Module, first: bool, last: bool, lo: int, hi: int,
                 tp: int = 1) -> None:
        super().__init__()
        self.spec: ModelSpec = net.spec
        self.tp = tp  # a received activation holds seq / tp positions (sequence parallel)
        self.embed = net.embed if first else None
        self.blocks = nn.ModuleList(net.blocks[lo:hi])
        self.final_norm = net.final_norm if last else None
        self.lm_head = net.lm_head if last else None
        if self.spec.position is PositionKind.ROPE:
            self.register_buffer("rope_inv_freq", net.rope_inv_freq.clone(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1] * (1 if self.embed is not None else self.tp)
        if self.embed is not None:
            x = self.embed(x)
        cos = sin = None
        if self.spec.position is PositionKind.ROPE:
            pos = torch.arange(t, device=x.device, dtype=torch.float32)
            freqs = torch.outer(pos, self.rope_inv_freq.float())
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin, None, None)
        if self.lm_head is not None:
            x = self.lm_head(self.final_norm(x))
        return x


def _loss(spec: ModelSpec):
    """The loss as torchtitan's ``cross_entropy_loss`` (under tensor parallel the logits are
    a vocab-sharded DTensor, and the step runs under ``loss_parallel()``)."""
    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten(0, 1))
    return loss_fn


def _record_actions(schedule: Any, stages: list, tracker: Any, out: list) -> None:
    """Append [kind, stage, micro-batch, bytes held] after each compute action of the step:
    F once its loss (last stage) has run (``_maybe_compute_loss`` follows every forward), I
    or B after ``backward_one_chunk`` (``full_backward``), W after
    ``backward_weight_one_chunk``; an I or B also with the most held while it ran and the
    categories then."""

    def held() -> int:
        snap = tracker.get_tracker_snapshot("current")
        return sum(int(v) for dev in snap.values() for k, v in dev.items()
                   if str(k).endswith("Total"))

    def during(run: Any) -> tuple[Any, int, dict]:
        """(run(), the most held while it ran, the categories then): the tracker's peak is
        started afresh from what is held now and restored to the larger after."""
        kept = dict(tracker._peak_mem), dict(tracker._peak_mem_snap)
        tracker._peak_mem_snap = tracker.get_tracker_snapshot("current")
        tracker._peak_mem = {d: snap["Total"] for d, snap in tracker._peak_mem_snap.items()}
        result = run()
        snap = tracker.get_tracker_snapshot("peak")
        top = sum(int(v) for dev in snap.values() for k, v in dev.items()
                  if str(k).endswith("Total"))
        cats = {str(k).split(".")[-1]: int(v) for dev in snap.values() for k, v in dev.items()}
        for d, v in kept[0].items():
            if v >= tracker._peak_mem.get(d, 0):
                tracker._peak_mem[d], tracker._peak_mem_snap[d] = v, kept[1][d]
        return result, top, cats

    loss = schedule._maybe_compute_loss

    def after_loss(stage: Any, output: Any, target_mbs: Any, mb_index: int, *rest: Any) -> Any:
        result = loss(stage, output, target_mbs, mb_index, *rest)
        out.append(["F", stage.stage_index, mb_index, held()])
        return result

    schedule._maybe_compute_loss = after_loss
    for stage in stages:
        backward, weight = stage.backward_one_chunk, stage.backward_weight_one_chunk

        def after_backward(mb: int, *args: Any, _s: Any = stage, _b: Any = backward,
                           **kwargs: Any) -> Any:
            result, top, cats = during(lambda: _b(mb, *args, **kwargs))
            # the backward's own peak too (its categories: the referee's diagnosis)
            out.append(["B" if kwargs.get("full_backward", True) else "I", _s.stage_index,
                        mb, held(), top, cats])
            return result

        def after_weight(mb: int, *args: Any, _s: Any = stage, _w: Any = weight,
                         **kwargs: Any) -> Any:
            result = _w(mb, *args, **kwargs)
            out.append(["W", _s.stage_index, mb, held()])
            return result

        stage.backward_one_chunk = after_backward
        stage.backward_weight_one_chunk = after_weight


def trace_rank(spec: ModelSpec, training: TrainingSpec, checkpointing: Checkpointing,
               pp_rank: int, dp: int, tp: int = 1, timeline: bool = False,
               record_events: bool = False, steps: int = 1) -> dict[str, Any]:
    """Peak bytes (and the categories at the peak) of pipeline rank ``pp_rank`` over
    ``steps`` steps: the schedule's step and the optimizer step; with ``timeline``, also the
    bytes held after each compute action (``_record_actions``); with ``record_events``, also
    ``alloc_events``, every storage allocation and free in order with its stream, for the
    allocator emulator (probes/alloc_emu.py; as ``probes.trace.trace_step``'s): two steps
    or more show the steady state, where the previous step's blocks sit in the side streams'
    pools (``step_starts``: each step's first event)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from probes.models import build_model
    from probes.trace import (
        _to_bf16,
        _to_empty,
        _tracker_class,
        _untracked_sharding_propagation,
        fsdp_policies,
        make_optimizer,
        storage_dtype,
    )

    p = training.pipeline
    cp = training.cp
    if p.kept_outputs is PipeKeptOutputs.ALL:
        raise ValueError("every stage's outputs kept (torch before PR #153383) cannot be "
                         "traced on this torch")
    world = p.degree * dp * tp
    dist.init_process_group("fake", store=FakeStore(), rank=pp_rank * dp * tp,
                            world_size=world)
    mesh = init_device_mesh("cpu", (p.degree, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    net = build_model(spec, device="meta", checkpointing=checkpointing,
                      attention=training.attention.value)
    ep = training.ep
    sparse = None
    if ep > 1:  # PP x EP: torchtitan's all-to-all dispatch in every MoE block (module doc)
        from probes.ep_trace import install
        from probes.trace_types import UnsupportedConfig

        if tp > 1 or cp > 1 or checkpointing is Checkpointing.SELECTIVE:
            raise UnsupportedConfig("PP x EP is traced without TP, CP and selective "
                                    "checkpointing")
        if dp % ep:
            raise ValueError(f"EP {ep} does not divide the {dp} data-parallel ranks of a stage")
        install(net, spec, training)
        # torchtitan's sparse mesh (pp, efsdp, ep) over the same ranks (parallel_dims.py
        # ``build_mesh``, lines 280-330: efsdp = dp_shard x cp x tp / ep, ep innermost)
        sparse = init_device_mesh("cpu", (p.degree, dp // ep, ep),
                                  mesh_dim_names=("pp", "efsdp", "ep"))
    if tp > 1:  # torchtitan: TP first, then FSDP over dp_shard, then the stage split
        from probes.finetune_tp import apply_tp_plan

        apply_tp_plan(net, mesh["tp"])
    store = storage_dtype(training)
    if store is not None:
        _to_bf16(net, store)
    layers = pipeline.stage_layers(spec.n_layers, p.n_stages)
    starts = [sum(layers[:i]) for i in range(p.n_stages)]
    mp, root_mp = fsdp_policies(training)
    stages, mods = [], []
    # context parallel: each GPU holds seq / cp tokens of every micro-batch
    b, t, m = training.micro_batch, training.local_seq, p.microbatches
    act_dtype = mp.param_dtype or torch.float32
    one = _StaticVote()
    # the fake group reads every received vote back as 0 (DYNAMIC); the real job's stages
    # all pass static metadata, so its vote is STATIC
    PipelineStage._warmup_backward_result = lambda self, received_result=None: one
    for s in pipeline.rank_stages(p, pp_rank):
        first, last = s == 0, s == p.n_stages - 1
        mod = StageModule(net, first, last, starts[s], starts[s] + layers[s], tp)
        if sparse is not None:
            from probes.ep_trace import shard_stage

            shard_stage(mod, spec, mesh["dp"], sparse["efsdp", "ep"], mp, reshard=False)
        for blk in mod.blocks if sparse is None else ():
            fully_shard(blk, mesh=mesh["dp"], reshard_after_forward=False, mp_policy=mp)
        fully_shard(mod, mesh=mesh["dp"], reshard_after_forward=False, mp_policy=root_mp)
        mods.append((s, mod))
    with FakeTensorMode(allow_non_fake_inputs=True):
        for s, mod in mods:
            _to_empty(mod)
            first, last = s == 0, s == p.n_stages - 1
            # a received activation requires grad (torch's dynamic inference marks it so
            # when the schedule has a backward; torchtitan passes no example inputs)
            # under sequence parallel a stage sends its block output's local shard, seq / tp
            inp = torch.zeros(b, t, dtype=torch.int64) if first else \
                torch.zeros(b, t // tp, spec.hidden, dtype=act_dtype, requires_grad=True)
            out = torch.zeros(b, t, spec.vocab // tp, dtype=act_dtype) if last else \
                torch.zeros(b, t // tp, spec.hidden, dtype=act_dtype)
            stages.append(PipelineStage(
                mod, s, p.n_stages, torch.device("cpu"), input_args=inp, output_args=out,
                output_grads=None if last else torch.zeros_like(out),
                input_grads=None if first else torch.zeros_like(inp),
                group=mesh["pp"].get_group()))
        params = [q for _, mod in mods for q in mod.parameters()]
        local = [q._local_tensor for q in params]
        optimizer = make_optimizer(local, training)
        for lp in local:  # the optimizer's state, before the measured step
            lp.grad = torch.zeros_like(lp)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        cls = getattr(S, SCHEDULES[p.schedule])
        multi = p.schedule in pipeline.MULTI_STAGE
        schedule = cls(stages if multi else stages[0], n_microbatches=m,
                       loss_fn=_loss(spec), scale_grads=False)
        x = torch.zeros(b * m, t, dtype=torch.int64)
        y = torch.zeros(b * m, t, dtype=torch.int64)
        has_first = any(s == 0 for s, _ in mods)
        has_last = any(s == p.n_stages - 1 for s, _ in mods)
        tracker = _each_micro_batch(_tracker_class(MemTracker) if record_events
                                    else _global_peak_only(MemTracker))()
        tracker.track_external(*[mod for _, mod in mods], optimizer)
        if record_events:
            tracker.start_events()
        actions: list[list[Any]] = []
        if timeline:
            _record_actions(schedule, stages, tracker, actions)
        # torchtitan runs the whole schedule step inside its train context, which holds
        # ``loss_parallel()`` under tensor parallel (``dist_utils.get_train_context``): the
        # loss's backward runs in it too
        # DTensor's sharding propagation runs each op once more on global-shape fake tensors
        # that no GPU allocates: left out of the tracker as in probes/trace.py
        parallel_loss = loss_parallel() if tp > 1 else contextlib.nullcontext()
        untracked = _untracked_sharding_propagation() if tp > 1 else contextlib.nullcontext()
        # context parallel: torchtitan's train context holds ``context_parallel`` around the
        # schedule step; the ring's mesh is made before the tracker starts, its dispatch mode
        # entered inside the tracker (above it, as ring_sdpa asks)
        ring: Any = contextlib.nullcontext()
        if cp > 1:
            from probes.context_parallel import cp_mesh, ring_sdpa

            cp_mesh(cp)
            ring = ring_sdpa(cp, training.cp_rotate.value, str(training.cp_kv) == "repeated")
        with untracked, tracker, ring, parallel_loss, _no_backward_module_hooks():
            args = (x,) if has_first else ()
            starts = []
            for _ in range(steps):
                starts.append(len(tracker.alloc_events) if record_events else 0)
                # as torchtitan's train step calls it: the losses collected, the last
                # stage's outputs not kept for the caller (--pp-kept-outputs last: kept and
                # returned, the merged result dropped at once)
                schedule.step(*args, target=y if has_last else None,
                              losses=[] if has_last else None,
                              return_outputs=p.kept_outputs is PipeKeptOutputs.LAST)
                for lp, q in zip(local, params):
                    lp.grad = None if q.grad is None else q.grad._local_tensor
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                for q in params:
                    q.grad = None
            peak = tracker.get_tracker_snapshot("peak")
    cats: dict[str, int] = {}
    for dev_snap in peak.values():
        for k, v in dev_snap.items():
            cats[str(k).split(".")[-1]] = cats.get(str(k).split(".")[-1], 0) + int(v)
    scalar = sum(v.numel() * v.element_size() for st in optimizer.state.values()
                 for v in st.values() if isinstance(v, torch.Tensor) and v.dim() == 0)
    return {"peak_bytes": cats.get("Total", 0), "at_peak": cats,
            "optimizer_scalar_bytes": int(scalar), "actions": actions,
            "alloc_events": tracker.alloc_events if record_events else None,
            "step_starts": starts if record_events else None}


def trace_job(job: dict[str, Any]) -> dict[str, Any]:
    """One job as ``main`` reads it -> ``trace_rank``'s result, in this process: the fake
    process group it initialised is destroyed after it and the warm-up vote's stand-in
    (``PipelineStage._warmup_backward_result``) put back, so that one process (a test
    worker) can trace several configurations, one after another; the result is as JSON
    gives it back (lists, string keys). Context parallel's options, which the ring sets
    (``ring_sdpa``: rotation, load balancing), are put back too. The same bytes as a fresh
    process's: the fake tensors' shapes and the tracker's counts do not depend on what ran
    before (checked on 1F1B, GPipe, interleaved, ZBV, DualPipeV, TP, CP and selective
    checkpointing)."""
    from planner.fields import SPEC
    from planner.request import build_request
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.tensor.experimental._context_parallel import _attention as cpa

    if dist.is_initialized():
        raise RuntimeError("a process group is initialised already: trace_rank makes its own")
    r = build_request(job["values"], SPEC)
    tp = job["values"].get("parallel.tp") or 1
    dp = r.cluster.n_gpus // (r.training.pipeline.degree * tp)
    vote = PipelineStage._warmup_backward_result
    cp_options = (cpa._cp_options.enable_load_balance, cpa._cp_options.rotate_method)
    try:
        out = trace_rank(r.model, r.training, Checkpointing(job["values"]["checkpointing"]),
                         job["pp_rank"], dp, tp, timeline=bool(job.get("timeline")),
                         record_events=bool(job.get("record_events")),
                         steps=job.get("steps", 1))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        PipelineStage._warmup_backward_result = vote
        cpa._cp_options.enable_load_balance, cpa._cp_options.rotate_method = cp_options
    return json.loads(json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    """``python -m probes.pipeline_trace '<json>'``: {"values": {spec path: value, as
    ``planner.request.build_request`` takes them}, "pp_rank": r, optionally "timeline":
    true, "record_events": true, "steps": k} -> the trace of that rank
    of the request's pipeline (its ``--n``, ``--pp`` and ``--tp`` give dp = n / (pp x tp)), as
    JSON on stdout (``trace_job``)."""
    job = json.loads((argv or sys.argv[1:])[0])
    print(json.dumps(trace_job(job)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
