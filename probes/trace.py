"""Trace one training configuration's per-GPU memory in this process, without a GPU.

One loop for every model: ``trace_training_step(factory, training, candidate, world_size,
gpus_per_node) -> dict`` asks ``factory`` for a module built on the meta device (a
``TraceModel``: the module, its repeated blocks, how to make a batch and a loss), applies the
distributed strategy, and runs training steps on **fake CPU tensors** (``FakeTensorMode``:
shapes and dtypes only, no data) under PyTorch's memory trackers, which account every tensor
storage by category. Factories: ``reference_factory(spec)`` (fitcheck's reference
transformer, ``probes.models``; ``trace_step(spec, ...)`` is the shorthand), and
``probes.hf.hf_factory(config)`` (the real Hugging Face class built from a config.json);
``probes.api`` passes any user module.

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

Training-loop effects (``TrainingSpec``), run for real when the model's factory implements
them (``TraceModel.effects``; the reference model does, otherwise ``UnsupportedConfig``):
``grad_sync="last"`` (FSDP2 ``set_requires_gradient_sync(False)`` on the non-final
micro-batch; every model), ``loss`` bf16 / chunked / fused and ``keep_logits``
(probes/models.py), fine-tunes (LoRA, a QLoRA stand-in, frozen layers) and ``Candidate.tp``
(tensor + sequence parallel on a 2-D fake mesh, FSDP2 over dp) (probes/finetune_tp.py),
``compile="blocks"`` (AOTAutograd-compiled blocks, probes/compile_step.py).

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
``zero_grad(set_to_none=True)``. With ``optimizer_in_backward`` (one GPU) each parameter has its
own optimizer, stepped in its post-accumulate-grad hook as torchtune does (``InBackward``), and
nothing runs after backward: the trace has no optimizer moment.

Result categories (bytes, one rank; fake CPU tensors so no 512-byte allocator rounding):
``params`` (sharded / local), ``unsharded_params`` (FSDP all-gathered params), ``grads``
(sharded), ``unsharded_grads``, ``optimizer``, ``activations``, ``temp`` (backward
temporaries incl. activation grads), ``all_gather`` / ``reduce_scatter`` (FSDP comm buffers),
``buffers``, ``inputs``, ``other``. ``at_peak`` is the breakdown at the moment of the peak,
``max_by_category`` each category's own maximum over the measured iteration, ``end_of_step``
the breakdown after zero_grad, ``moments`` the peak and its breakdown in each moment of the
step (``planner.memory.Phase``). ``peak_phase`` is forward / backward / optimizer / zero_grad
and ``peak_module`` the innermost module active at the peak (when known). A failure inside the
step raises ``TraceFailure`` naming the phase, the module and the operation.

CLI: ``python -m probes.trace [JSON]`` reads one job (``probes.runner``) from argv[1] or stdin
and prints one JSON line: ``{"ok": true, ...}`` or ``{"ok": false, "reason": ...,
"unsupported": bool}``; ``{"batch": [job, ...]}`` runs several jobs in this one process and
prints ``{"ok": true, "results": [...]}``. A job is a reference-model trace (``"model"``), a
Hugging Face trace (``"source": {"kind": "hf", ...}``) or an inspection of a Hugging Face
model's structure (``"inspect": {...}``, no trace; ``probes.hf.inspect``).
``FITCHECK_PROBE_FAULT=raise|abort|segv|hang|exit3`` injects a failure (tests of the runner).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from planner.memory import Phase
from probes.trace_types import (
    BuildOptions,
    ModelFactory,
    TraceFailure,
    TraceModel,
    UnsupportedConfig,
)
from planner.spec import (
    Attention,
    Candidate,
    Checkpointing,
    CpKv,
    CompileMode,
    Float8Recipe,
    GradSync,
    LossKind,
    ModelSpec,
    Offload,
    OptimizerImpl,
    OptimizerKind,
    PositionKind,
    Precision,
    Strategy,
    TrainingSpec,
)

__all__ = ["BuildOptions", "ModelFactory", "TraceFailure", "TraceModel", "UnsupportedConfig",
           "main", "reference_factory", "trace_step", "trace_training_step"]

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


# --------------------------------------------------------------------------- the model


def reference_factory(spec: ModelSpec) -> ModelFactory:
    """fitcheck's reference transformer (``probes.models``) for ``spec``."""

    def build(opts: BuildOptions) -> TraceModel:
        from probes.models import build_model

        net = build_model(spec, device="meta")
        tr = opts.training or TrainingSpec()
        if tr.ep > 1:
            from probes.ep_trace import install

            install(net, spec, tr)  # torchtitan's all-to-all dispatch in every MoE MLP
        net.configure(checkpointing=opts.checkpointing, attention=opts.attention.value,
                      context_fn=opts.recompute_context,
                      selective_policy=opts.selective_policy,
                      sac_list=tr.sac_list.value,
                      sac_force=tr.sac_force_recompute,
                      loss=tr.loss.value, loss_chunks=tr.loss_chunks,
                      keep_logits=tr.keep_logits)
        effects = {"loss", "keep_logits"}
        if tr.compile is CompileMode.BLOCKS and opts.checkpointing is Checkpointing.NONE \
                and spec.position is PositionKind.ROPE and opts.attention is Attention.SDPA \
                and not spec.is_moe:
            from probes.compile_step import compile_blocks

            compile_blocks(net)
            effects.add("compile")
        elif tr.compile is CompileMode.MODEL and opts.checkpointing is Checkpointing.NONE \
                and tr.finetune.full and tr.loss is LossKind.FP32 and not tr.keep_logits \
                and not spec.is_moe and (opts.candidate is None
                                         or opts.candidate.strategy is Strategy.DDP):
            from probes.compile_step import compile_model

            compile_model(net)
            effects.add("compile_model")
        if tr.float8 is not Float8Recipe.NONE:
            float8_convert(net, tr)
            effects.add("float8")
        parallelize = None
        ft = tr.finetune
        ep_tp = opts.candidate.tp if tr.ep > 1 and opts.candidate is not None else 1
        if not ft.full or (opts.candidate is not None and opts.candidate.tp > 1
                           and ep_tp == 1):
            from probes.finetune_tp import apply_finetune, tp_parallelize

            apply_finetune(net, spec, ft, opts.precision)
            effects.add("finetune")
            if opts.candidate is not None and opts.candidate.tp > 1:
                if not ft.full:
                    raise UnsupportedConfig(
                        "tensor parallel with a fine-tune: not traced (torch's Colwise/"
                        "RowwiseParallel accept only nn.Linear / nn.Embedding, not an adapted"
                        " or quantized layer)")
                parallelize = tp_parallelize(net, spec, opts.candidate, opts.precision)
                effects.add("tp")
        kernel_context: Callable[[], AbstractContextManager] = nullcontext
        if parallelize is not None or ep_tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            kernel_context = loss_parallel  # forward and backward (its docs)
        if tr.cp > 1:
            from probes.context_parallel import ring_sdpa

            if parallelize is not None or ep_tp > 1:
                raise UnsupportedConfig("context parallel with TP or a fine-tune: not traced")
            kernel_context = functools.partial(ring_sdpa, tr.cp, tr.cp_rotate.value,
                                               tr.cp_kv is CpKv.REPEATED)
            effects.add("cp")

        if tr.ep > 1:
            from probes.ep_trace import ep_parallelize

            strategy = opts.candidate.strategy if opts.candidate else Strategy.FULL_SHARD
            if parallelize is not None or strategy not in (
                    Strategy.FULL_SHARD, Strategy.SHARD_GRAD_OP):
                raise UnsupportedConfig("expert parallel is traced with FSDP2 (full_shard / "
                                        "shard_grad_op), with or without CP or TP (not both): "
                                        "no fine-tune")
            parallelize = ep_parallelize(net, spec, tr, strategy, fsdp_policies(tr), tp=ep_tp)
            effects.add("ep")
            if ep_tp > 1:
                effects.add("tp")

        def make_batch(b: int, t: int) -> tuple:
            return (torch.randint(0, spec.vocab, (b, t), dtype=torch.int64),
                    torch.randint(0, spec.vocab, (b, t), dtype=torch.int64))

        return TraceModel(module=net, blocks=list(net.blocks), block_path="blocks",
                          make_batch=make_batch, loss=lambda m, batch: m(*batch),
                          info={"class": type(net).__name__, "source": "reference"},
                          effects=frozenset(effects),
                          after_step=lambda: setattr(net, "held", []),
                          parallelize=parallelize, kernel_context=kernel_context)

    return build


# --------------------------------------------------------------------------- pieces


def float8_convert(net: nn.Module, training: TrainingSpec) -> None:
    """torchao's ``convert_to_float8_training`` as torchtitan's float8 converter calls it:
    the recipe's ``Float8LinearConfig`` (``from_recipe_name``), float8 all-gather as asked,
    every ``nn.Linear`` but the output head (``filter_fqns = ["output"]``) and any whose dims
    are not divisible by 16. Needs torchao (``pip install torchao``)."""
    import dataclasses

    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise UnsupportedConfig(f"float8 {training.float8.value}: torchao is not installed "
                                f"({first_line(exc)})") from None
    config = Float8LinearConfig.from_recipe_name(training.float8.value)
    if training.float8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)

    def keep(mod: nn.Module, fqn: str) -> bool:
        if fqn.split(".")[-1] in ("lm_head", "output"):
            return False
        return mod.in_features % 16 == 0 and mod.out_features % 16 == 0

    convert_to_float8_training(net, config=config, module_filter_fn=keep)
    from torchao.float8.float8_linear import Float8Linear

    for mod in net.modules():
        if isinstance(mod, Float8Linear):
            mod.forward = _autocast_input(mod.forward)


def _autocast_input(forward: Callable) -> Callable:
    """``Float8Linear.forward`` casts its input to the autocast dtype when CUDA autocast is on
    (``torch.is_autocast_enabled()``); under the trace's CUDA autocast emulation (a
    TorchFunctionMode, which that call does not see) the same cast, from the emulation's dtype."""
    from probes.autocast_emul import CudaAutocastEmulation

    def run(x: torch.Tensor) -> torch.Tensor:
        from torch.overrides import _get_current_function_mode_stack

        for mode in _get_current_function_mode_stack():
            if isinstance(mode, CudaAutocastEmulation) and x.is_floating_point():
                x = x.to(mode.dtype)
                break
        return forward(x)

    return run



def effects_asked(training: TrainingSpec, candidate: Candidate) -> dict[str, str]:
    """The non-default training-loop effects of this run that the model must implement
    (``TraceModel.effects``) -> how to name them in a refusal."""
    out = {}
    if training.loss is not LossKind.FP32:
        out["loss"] = f"loss {training.loss.value}"
    if training.keep_logits:
        out["keep_logits"] = "keep_logits"
    if not training.finetune.full:
        out["finetune"] = "a fine-tune (LoRA / frozen parameters)"
    if candidate.tp > 1:
        out["tp"] = f"tensor parallel degree {candidate.tp}"
    if training.compile is CompileMode.BLOCKS:
        out["compile"] = "compile blocks"
    if training.float8 is not Float8Recipe.NONE:
        out["float8"] = f"float8 {training.float8.value}"
    if training.compile is CompileMode.MODEL:
        out["compile_model"] = "compile model"
    if training.cp > 1:
        out["cp"] = f"context parallel degree {training.cp}"
    if training.ep > 1:
        # the reference model implements it (probes/ep_trace.py); a Hugging Face class's
        # own MoE does not: a trace without it would be a different run
        out["ep"] = f"expert parallel degree {training.ep}"
    return out


def check_supported(training: TrainingSpec, candidate: Candidate) -> None:
    if candidate.tp > 1 and not candidate.strategy.is_fsdp and candidate.strategy is not \
            Strategy.DDP:
        raise UnsupportedConfig(f"tensor parallel with {candidate.strategy.value}: not traced")
    if training.float8 is not Float8Recipe.NONE and training.compile is not CompileMode.NONE:
        raise UnsupportedConfig(
            f"float8 {training.float8.value} with compile {training.compile.value}: not traced "
            "(torchao's Float8Linear is traced eagerly; the compiled float8 graph is not)")
    if training.compile is CompileMode.MODEL and candidate.strategy is not Strategy.DDP:
        raise UnsupportedConfig(
            f"compile model with {candidate.strategy.value}: not traced (the whole model as"
            " one AOTAutograd graph is traced for ddp only, probes/compile_step.py)")
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
    if training.activation_offload:
        # the step would run without the offloading hooks: a different run
        raise UnsupportedConfig("activation offloading: not run by the step's trace "
                                "(probes/offload_trace.py emulates the hooks' host and device "
                                "bytes)")
    if training.cp > 1 and not candidate.strategy.is_fsdp:
        raise UnsupportedConfig("context parallel is traced with FSDP only")
    if training.optimizer_in_backward and candidate.strategy is not Strategy.DDP:
        raise UnsupportedConfig(f"optimizer in backward with {candidate.strategy.value}: "
                                "traced on one GPU (ddp) only")
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


class InBackward:
    """torchtune's optimizer in backward (``optimizer_in_bwd``): one optimizer per
    parameter, stepped by the parameter's post-accumulate-grad hook, which then frees the
    gradient (torchtune/training/memory.py ``register_optim_in_bwd_hooks``, commit
    1814feb17 l. 219-242: ``optim_dict[param].step()``, ``optim_dict[param].zero_grad()``;
    torch ``Tensor.register_post_accumulate_grad_hook``). ``step`` and ``zero_grad`` of the
    whole do nothing: every step ran in backward."""

    def __init__(self, params: list, training: TrainingSpec) -> None:
        self.optims = {p: make_optimizer([p], training) for p in params}
        self.handles: list = []

    def register(self) -> None:
        """The hooks, registered after the tracker's own (MemTracker labels a gradient in its
        post-accumulate hook: it must see the gradient before the step frees it)."""
        def step_and_clear(p: torch.Tensor) -> None:
            opt = self.optims[p]
            opt.step()
            opt.zero_grad(set_to_none=True)

        self.handles = [p.register_post_accumulate_grad_hook(step_and_clear)
                        for p in self.optims]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def warm(self) -> None:
        """Create every state with one step on zero gradients (the trace's cheap warm-up)."""
        for p, opt in self.optims.items():
            p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)

    @property
    def state(self) -> dict:
        return {p: st for opt in self.optims.values() for p, st in opt.state.items()}


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


class _NoHook:
    """A hook handle for a hook never registered."""

    def remove(self) -> None:
        pass


def _tracker_class(base: type) -> type:
    """Adds per-category maxima, the peak's phase and module, per-moment peaks (and per
    block within each moment) and a peak reset."""

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
            # after the blocks: embeddings), optimizer (step + zero_grad); and within each
            # moment per block index (-1: outside the blocks), which a trace scaled by depth
            # extrapolates (probes/trace_plan.py).
            self.moment_peaks: dict[str, int] = {}
            self.moment_snaps: dict[str, dict] = {}
            self.sub_peaks: dict[tuple[str, int], int] = {}
            self.sub_snaps: dict[tuple[str, int], dict] = {}
            self.seen_block_bwd = False
            self.block = -1
            """The block running now (-1: none); set by ``_watch_blocks``' hooks."""
            self.closing = False
            self.first_block: Any = None
            self.last_op: Any = None
            self.alias_waits = False
            """Return ``wait_tensor``'s input as its output (set for expert parallel's
            functional all-to-alls)."""

        def _moment(self) -> tuple[str, int]:
            phase = self.phase
            if self.closing:
                name = self._mod_tracker._known_modules.get(self.first_block)
                if name not in self._mod_tracker.parents:
                    self.block, self.closing = -1, False
            idx = self.block if phase in ("forward", "backward") else -1
            if phase == "backward":
                if idx >= 0:
                    self.seen_block_bwd = True
                    return Phase.BLOCK_BWD, idx
                return (Phase.BWD_END if self.seen_block_bwd else Phase.LOSS_BWD), -1
            if phase in ("optimizer", "zero_grad"):
                return Phase.OPTIMIZER, -1
            return (Phase.FORWARD if phase == "forward" else phase), idx

        def _track_module_params_and_buffers(self, module: nn.Module,
                                             install_grad_hooks: bool = True) -> tuple:
            # MemTracker registers a gradient hook on every parameter, which raises for a
            # frozen one (a fine-tune): mark those as hooked already
            handles = getattr(self, "_param_to_grad_hook_handles", None)
            if handles is not None:
                for p in module.parameters():
                    if not p.requires_grad and handles.get(p) is None:
                        handles[p] = (_NoHook(), _NoHook())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

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
            moment, idx = self._moment()
            if total > self.sub_peaks.get((moment, idx), -1):
                snap = {d: dict(v) for d, v in self._curr_mem_snap.items()}
                self.sub_peaks[moment, idx] = total
                self.sub_snaps[moment, idx] = snap
                if total > self.moment_peaks.get(moment, -1):
                    self.moment_peaks[moment] = total
                    self.moment_snaps[moment] = snap
            if total > self.peak_total:
                self.peak_total = total
                self.peak_phase = self.phase
                self.peak_module = self.innermost()

        alloc_events: list | None = None
        """When a list: every storage allocation and free in order, for the allocator
        emulator (probes/alloc_emu.py): ``("alloc", key, bytes, stream)`` / ``("free", key)``;
        ``stream`` 0 is the default stream, others numbered as first seen (FSDP2's all-gather
        and reduce-scatter streams: ``torch.cpu``'s stream stubs, which FSDP2 enters with
        ``device_handle.stream(...)`` on fake CPU tensors as on CUDA). A ``resize_`` of a
        storage (FSDP2's unsharded parameters) is a free and a new allocation, as on CUDA."""

        def _update_snap(self, u_type: Any, winfo: Any, old_mem_consumed: Any = None,
                         old_reftype: Any = None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed=old_mem_consumed,
                                 old_reftype=old_reftype)
            if self.alloc_events is not None and u_type.name != "REF":
                self._record_event(u_type.name, winfo)

        def start_events(self) -> None:
            """Record every allocation and free from now on (``alloc_events``), starting with
            what is tracked already, on the default stream (stream 0)."""
            default = torch.cpu.current_stream()
            self._emu_streams = {id(default): (0, default)}
            self.alloc_events = []
            for winfo, _ in list(self._WINFO.values()):  # tracked before recording began
                self._record_event("ADD", winfo)

        def _record_event(self, kind: str, winfo: Any) -> None:
            ev = self.alloc_events
            key = getattr(winfo, "emu_key", None)
            if key is not None and kind in ("DEL", "SIZE"):
                ev.append(("free", key))
                winfo.emu_key = None
            if kind in ("ADD", "SIZE") and winfo.mem_consumed > 0:
                streams = self.__dict__.setdefault("_emu_streams", {})
                cur = torch.cpu.current_stream()
                sid = streams.setdefault(id(cur), (len(streams), cur))[0]
                winfo.emu_key = len(ev)
                ev.append(("alloc", winfo.emu_key, int(winfo.mem_consumed), sid))

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            self.last_op = func  # named in the error if it fails
            out = super().__torch_dispatch__(func, types, args, kwargs)
            if self.alias_waits and func is torch.ops._c10d_functional.wait_tensor.default:
                # CUDA's wait_tensor returns its input (the collective's output buffer);
                # the fake kernel makes a new tensor: hand back the input, as on a GPU (a
                # selective-checkpoint cache holds the collective's output, the forward
                # goes on with the wait's: one buffer, counted once)
                return args[0]
            return out

        def innermost(self) -> str:
            """The deepest module active now ('' outside any)."""
            parents = self._mod_tracker.parents
            return max(parents, key=lambda s: (s.count("."), len(s)), default="")

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
            self.sub_peaks = {}
            self.sub_snaps = {}

    _Tracker.__name__ = base.__name__
    return _Tracker


def _first_tensor(obj: Any) -> torch.Tensor | None:
    from torch.utils._pytree import tree_leaves

    return next((t for t in tree_leaves(obj) if isinstance(t, torch.Tensor)
                 and t.is_floating_point() and t.requires_grad), None)


def _watch_blocks(blocks: Sequence[nn.Module], tracker: Any) -> list:
    """Tell the tracker which block runs: forward hooks around each block's forward, and in
    backward gradient hooks on its output (its backward starts; the previous one's ends)
    and on the first block's input (the blocks' backward ends).
    (ModTracker's module stack cannot tell: modules whose backward post-hook never fires,
    such as attention modules returning a tuple, stay in it.) Returns the hook handles."""
    handles = []

    def hooks(i: int) -> tuple:
        def pre(mod: nn.Module, args: tuple, kwargs: dict) -> None:
            tracker.block = i
            x = _first_tensor((args, kwargs))
            if i == 0 and x is not None and tracker.phase == "forward":
                # the first block's input gradient: the blocks' backward ends once the block
                # leaves the module stack (after its post-backward reduce-scatter); a block
                # i > 0 ends when block i - 1's output gradient arrives
                x.register_hook(lambda g: setattr(tracker, "closing", True))

        def post(mod: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            tracker.block = -2  # after a block: -1 is before the first
            y = _first_tensor(out)
            if y is not None and tracker.phase == "forward":
                y.register_hook(lambda g: setattr(tracker, "block", i))

        return pre, post

    tracker.first_block = blocks[0] if blocks else None
    for i, blk in enumerate(blocks):
        pre, post = hooks(i)
        # prepended: before FSDP's hooks, so that a block's input gradient hook fires after
        # its post-backward (reduce-scatter) and its output hook before its pre-backward
        # (all-gather): both belong to the block
        handles.append(blk.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
        handles.append(blk.register_forward_hook(post, with_kwargs=True, prepend=True))
    return handles


class _ModuleStack:
    """The modules whose forward is running, by name, kept as they were when an exception
    went through them (forward hooks that do not run on exceptions): where a trace failed."""

    def __init__(self, root: nn.Module) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        named = {m: n or "the root" for n, m in root.named_modules()}
        self.names: list[str] = []

        def enter(mod: nn.Module, args: Any) -> None:
            self.names.append(named.get(mod, type(mod).__name__))

        def leave(mod: nn.Module, args: Any, out: Any) -> None:
            if self.names:
                self.names.pop()

        self._handles = [register_module_forward_pre_hook(enter),
                         register_module_forward_hook(leave)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _module_name(fqn: str) -> str:
    """ModTracker names modules '<RootClass>.blocks.3.mlp'; drop the root's class."""
    if not fqn or fqn == "Global":
        return ""
    _, sep, rest = fqn.partition(".")
    return rest if sep else "root"


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


def _sub_moments(tracker: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """{moment: {block index: {"peak_bytes", "at_peak"}}} (outside the blocks: "-1" before
    the first block runs, "-2" after one has)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (m, idx), v in sorted(tracker.sub_peaks.items(), key=lambda kv: (str(kv[0][0]),
                                                                           kv[0][1])):
        if m == "idle":
            continue
        out.setdefault(str(m), {})[str(idx)] = {
            "peak_bytes": int(v), "at_peak": _categories(tracker.sub_snaps[m, idx])}
    return out


def first_line(exc: BaseException, limit: int = 400) -> str:
    """'ExcType: the first non-empty line of the message' (torch's messages run long)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _to_empty(module: nn.Module) -> None:
    """``module.to_empty(device="cpu")``, keeping shared (tied) parameters shared: under
    FakeTensorMode ``Module._apply`` cannot swap a meta parameter's data in place, so it gives
    each module a new parameter and a tied embedding / output head would come back untied
    (counted twice, with two gradients and two optimizer states)."""
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((mod, name))
    module.to_empty(device="cpu")
    for group in owners.values():
        first, name = group[0]
        for mod, other in group[1:]:
            mod._parameters[other] = first._parameters[name]


def _to_bf16(module: nn.Module, dtype: torch.dtype = torch.bfloat16) -> None:
    """Pure bf16 (or the storage dtype given): every floating parameter and buffer in bf16
    (``module.to(torch.bfloat16)``), except what a fine-tune keeps in fp32 on purpose: LoRA
    adapters with ``lora_fp32`` (marked ``_fitcheck_fp32``) and a quantized base's constants
    (``quant_consts``)."""
    keep = {id(p) for p in module.parameters() if getattr(p, "_fitcheck_fp32", False)}
    quant = any(name.endswith("quant_consts") for name, _ in module.named_buffers())
    if not keep and not quant:
        module.to(dtype)
        return
    done: dict[int, nn.Parameter] = {}  # shared (tied) parameters stay shared
    for mod in module.modules():
        for name, p in mod._parameters.items():
            if p is None or not p.is_floating_point() or id(p) in keep:
                continue
            if id(p) not in done:
                done[id(p)] = nn.Parameter(p.to(dtype), requires_grad=p.requires_grad)
            mod._parameters[name] = done[id(p)]
        for name, b in mod._buffers.items():
            if b is not None and b.is_floating_point() and name != "quant_consts":
                mod._buffers[name] = b.to(dtype)


class _untracked_sharding_propagation:
    """DTensor's sharding propagation (``ShardingPropagator._propagate_tensor_meta*``, which
    loss_parallel's handlers call) runs each op once more on fake tensors of the GLOBAL shape
    to learn the output's metadata. On a GPU those never exist; under this trace they would be
    counted (a global fp32 log-softmax output, 2 x the local one at tp 2). They run here with
    the dispatch modes (tracker, fake mode) switched off; their own FakeTensorMode remains."""

    def __enter__(self) -> None:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
        from torch.utils._python_dispatch import _disable_current_modes

        self._saved = {}
        for name in ("_propagate_tensor_meta", "_propagate_tensor_meta_non_cached"):
            orig = getattr(ShardingPropagator, name, None)
            if orig is None:
                continue

            def wrapped(self_: Any, *args: Any, _orig: Any = orig, **kwargs: Any) -> Any:
                with _disable_current_modes():
                    return _orig(self_, *args, **kwargs)

            self._saved[name] = orig
            setattr(ShardingPropagator, name, wrapped)

    def __exit__(self, *exc: object) -> None:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator

        for name, orig in self._saved.items():
            setattr(ShardingPropagator, name, orig)


def _label_accumulated_grads(net: nn.Module, tracker: Any) -> None:
    """Under ``set_requires_gradient_sync(False)`` with a reduce dtype other than the param
    dtype, FSDP2 keeps each unsharded gradient as a new reduce-dtype tensor
    (``FSDPParam.to_accumulated_grad_if_needed``: ``unsharded_accumulated_grad``), which
    FSDPMemTracker counts as a backward temporary; file those under ``unsharded_grads``."""
    from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

    for mod in net.modules():
        state = getattr(mod, "_get_fsdp_state", None)
        group = getattr(state(), "_fsdp_param_group", None) if state else None
        for fp in getattr(group, "fsdp_params", ()):
            g = getattr(fp, "unsharded_accumulated_grad", None)
            if g is not None:
                tracker._update_and_maybe_create_winfos(g, _FSDPRefType.UNSHARDED_GRAD)


def _fake_group(world_size: int) -> None:
    """The fake process group of ``world_size`` ranks (this process is rank 0)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    elif dist.get_world_size() != world_size:
        raise RuntimeError(
            "a process group of another world size is already initialised in this process;"
            " run each configuration in its own process (probes.runner)"
        )


_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def storage_dtype(training: TrainingSpec) -> torch.dtype | None:
    """The dtype the module's parameters are cast to before sharding (None: as built, fp32):
    ``TrainingSpec.mixed_precision.storage_dtype``, else bf16 for pure bf16."""
    given = training.mixed_precision.storage_dtype
    if given is not None:
        return None if given.value == "fp32" else _TORCH_DTYPE[given.value]
    return torch.bfloat16 if training.precision is Precision.BF16 else None


def fsdp_policies(training: TrainingSpec) -> tuple[Any, Any]:
    """(the blocks' MixedPrecisionPolicy, the root's): what ``precision`` implies (-amp:
    param_dtype 16-bit, reduce_dtype fp32; otherwise none), each value the policy gives
    (``TrainingSpec.mixed_precision``) replacing one; output_dtype on the root only. The
    planner resolves the same way (``planner.spec.FsdpDtypes.of``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = training.mixed_precision
    low = low_dtype(training.precision)

    def dt(d: Any, default: torch.dtype | None) -> torch.dtype | None:
        return default if d is None else _TORCH_DTYPE[d.value]

    param = dt(mp.param_dtype, low)
    reduce = dt(mp.reduce_dtype, torch.float32 if low is not None else None)
    block = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)
    root = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce,
                                output_dtype=dt(mp.output_dtype, None))
    return block, root


def _apply_fsdp(tm: TraceModel, strategy: Strategy, training: TrainingSpec, world_size: int,
                gpus_per_node: int) -> tuple[int, ...]:
    """FSDP2 on every block, then on the root, over a fake process group; the mesh shape."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _fake_group(world_size)
    mesh_shape = mesh_shape_for(strategy, world_size, gpus_per_node)
    names = ("dp",) if len(mesh_shape) == 1 else ("replicate", "shard")
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    reshard = strategy in (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD)
    mp, root_mp = fsdp_policies(training)
    for blk in tm.blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    fully_shard(tm.module, mesh=mesh, reshard_after_forward=reshard, mp_policy=root_mp)
    return mesh_shape


# --------------------------------------------------------------------------- the loop


def trace_training_step(
    factory: ModelFactory,
    training: TrainingSpec,
    candidate: Candidate,
    world_size: int = 1,
    gpus_per_node: int = 8,
    *,
    local_optimizer: bool = True,
    warmup: str = "optimizer",
    selective_policy: str = "op",
    record_events: bool = False,
    warmup_iterations: int = 1,
) -> dict[str, Any]:
    """One rank's memory for one training step of the model ``factory`` builds (module doc).

    ``warmup``: "optimizer" (default) creates the optimizer state with one step on zero
    gradients before tracking; "iteration" runs a whole tracked warm-up iteration first
    (slower; gives the same numbers, kept to check that). ``local_optimizer``: with FSDP,
    step the optimizer on the DTensors' local shards (default) instead of the DTensors.
    ``selective_policy``: what ``checkpointing="selective"`` means: "op" (default:
    torchtitan's op-level SAC, the policy the planner models) or "regions" (attention core +
    MLP activation product, Megatron-style; reference model only); see probes/models.py.
    ``record_events``: also return ``alloc_events`` (every storage allocation and free in
    order, with its stream: ``_Tracker.alloc_events``) and ``alloc_events_measured_from`` (the
    first event of the measured iteration), for probes/alloc_emu.py. ``warmup_iterations``:
    how many tracked warm-up iterations ``warmup="iteration"`` runs (the allocator's cache
    settles over the first steps).
    """
    had_pg = dist.is_initialized()
    try:
        return _trace(factory, training, candidate, world_size, gpus_per_node,
                      local_optimizer=local_optimizer, warmup=warmup,
                      selective_policy=selective_policy, record_events=record_events,
                      warmup_iterations=warmup_iterations)
    finally:
        # The fake process group this call created is torn down, so that one process can
        # trace several FSDP configurations (tests, batches); the CLI runs one per process.
        if not had_pg and dist.is_initialized():
            dist.destroy_process_group()


def trace_step(
    model: ModelSpec,
    training: TrainingSpec,
    candidate: Candidate,
    world_size: int = 1,
    gpus_per_node: int = 8,
    **options: Any,
) -> dict[str, Any]:
    """``trace_training_step`` of the reference transformer of ``model`` (probes.models)."""
    return trace_training_step(reference_factory(model), training, candidate, world_size,
                               gpus_per_node, **options)


def _trace(factory: ModelFactory, training: TrainingSpec, candidate: Candidate,
           world_size: int, gpus_per_node: int, *, local_optimizer: bool, warmup: str,
           selective_policy: str, record_events: bool = False,
           warmup_iterations: int = 1) -> dict[str, Any]:
    """See trace_training_step."""
    if warmup not in ("optimizer", "iteration"):
        raise ValueError(f"warmup must be 'optimizer' or 'iteration', got {warmup!r}")
    t_start = time.perf_counter()
    check_supported(training, candidate)
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")

    from torch._subclasses.fake_tensor import FakeTensorMode

    from probes.autocast_emul import CudaAutocastEmulation, recompute_context_fn

    strategy = candidate.strategy
    fsdp = strategy.is_fsdp
    precision = training.precision
    low = low_dtype(precision)
    emulate_autocast = low is not None and not fsdp

    tm = factory(BuildOptions(
        checkpointing=candidate.checkpointing, attention=training.attention,
        precision=precision,
        recompute_context=recompute_context_fn(low) if emulate_autocast else None,
        selective_policy=selective_policy, training=training, candidate=candidate))
    missing = [name for key, name in effects_asked(training, candidate).items()
               if key not in tm.effects]
    if missing:
        raise UnsupportedConfig(f"{', '.join(missing)}: not implemented by this model's "
                                f"trace ({tm.info.get('source', 'factory')})")
    if training.mixed_precision.given and (not fsdp or tm.parallelize is not None):
        raise UnsupportedConfig("an FSDP mixed-precision policy is traced for the FSDP "
                                "strategies of a model without its own parallelize")
    store = storage_dtype(training) if fsdp else (
        torch.bfloat16 if precision is Precision.BF16 else None)
    if store is not None:
        _to_bf16(tm.module, store)
    net = tm.module
    n_params = sum(p.numel() for p in net.parameters())
    n_trainable = sum(p.numel() for p in net.parameters() if p.requires_grad)
    mesh_shape: tuple[int, ...] = (1,)
    if tm.parallelize is not None:
        _fake_group(world_size)
        mesh_shape = tm.parallelize(world_size, gpus_per_node)
    elif fsdp:
        mesh_shape = _apply_fsdp(tm, strategy, training, world_size, gpus_per_node)

    t_built = time.perf_counter()
    b, t = training.micro_batch, training.local_seq  # context parallel: seq / cp per GPU
    n_micro = min(training.grad_accum, _MAX_MICRO_BATCHES)
    with FakeTensorMode(allow_non_fake_inputs=True):
        _to_empty(net)
        params = [p for p in net.parameters() if p.requires_grad]
        opt_params = params
        if fsdp and local_optimizer:
            # Step the optimizer on the DTensors' local shards: every FSDP placement is
            # Shard(0)/Replicate, so DTensor would run exactly these local ops, but its
            # sharding propagation of foreach ops over hundreds of DTensors costs seconds.
            opt_params = [p._local_tensor for p in params]
            if not all(lp.is_leaf for lp in opt_params):
                opt_params = params
        in_bwd = InBackward(opt_params, training) if training.optimizer_in_backward else None
        optimizer = make_optimizer(opt_params, training) if in_bwd is None else None
        batch = tm.make_batch(b, t)
        t0 = time.perf_counter()
        if training.compile is not CompileMode.NONE:
            # the compiled blocks trace their graphs on the first call: one untracked
            # micro-batch first (the FX tracing would otherwise be counted)
            with tm.kernel_context(), (CudaAutocastEmulation(low) if emulate_autocast
                                       else nullcontext()):
                warm = tm.loss(net, batch)
            with tm.kernel_context():
                warm.backward()
            del warm
            tm.after_step()
            net.zero_grad(set_to_none=True)
            for lp in opt_params:
                lp.grad = None
        if warmup == "optimizer" and in_bwd is not None:
            in_bwd.warm()
        elif warmup == "optimizer":
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
            tracker.track_inputs(batch)
        else:
            from torch.distributed._tools.mem_tracker import MemTracker

            tracker = _tracker_class(MemTracker)()
            if in_bwd is None:
                tracker.track_external(net, optimizer, *batch)
            else:
                tracker.track_external(net, *in_bwd.optims.values(), *batch)
                # the tracker's gradient hooks first, then the steps' (InBackward.register)
                tracker._track_module_params_and_buffers(net, install_grad_hooks=True)
                in_bwd.register()
        _watch_blocks(tm.blocks, tracker)
        if record_events:
            tracker.start_events()
        tracker.alias_waits = "ep" in tm.effects

        sync_last = fsdp and training.grad_sync is GradSync.LAST and n_micro > 1

        def iteration() -> None:
            for i in range(n_micro):
                if sync_last:
                    # FSDP2: no reduce-scatter on non-final micro-batches; the unsharded
                    # gradients stay (torch/distributed/fsdp/_fully_shard/_fully_shard.py
                    # set_requires_gradient_sync). DDP's no_sync() changes no memory.
                    net.set_requires_gradient_sync(i == n_micro - 1)
                # Per-module stats are not needed (and MemTracker refuses a module's second
                # forward without this); the global counters are untouched.
                tracker.reset_mod_stats()
                tracker.phase = "forward"
                tracker.seen_block_bwd = False
                tracker.block, tracker.closing = -1, False
                ctx = CudaAutocastEmulation(low) if emulate_autocast else nullcontext()
                with tm.kernel_context(), ctx:
                    loss = tm.loss(net, batch)
                tracker.phase = "backward"
                with tm.kernel_context():
                    loss.backward()
                del loss
                if sync_last and i < n_micro - 1:
                    _label_accumulated_grads(net, tracker)
            tracker.phase = "optimizer"
            if in_bwd is not None:  # every parameter was stepped in backward
                tm.after_step()
                tracker.phase = "idle"
                return
            if opt_params is not params:
                for lp, p in zip(opt_params, params):
                    lp.grad = None if p.grad is None else p.grad._local_tensor
            optimizer.step()
            tracker.phase = "zero_grad"
            optimizer.zero_grad(set_to_none=True)
            if opt_params is not params:
                net.zero_grad(set_to_none=True)
            tm.after_step()
            tracker.phase = "idle"

        stack = _ModuleStack(net)
        untracked = _untracked_sharding_propagation() if tm.parallelize is not None \
            else nullcontext()
        groups = nullcontext()
        if "ep" in tm.effects:
            from probes.ep_trace import per_param_mesh_view

            groups = per_param_mesh_view()  # torchtitan's EP block: two param groups
        with groups, tracker, untracked:
            try:
                if warmup == "iteration":
                    for _ in range(warmup_iterations):
                        iteration()  # full warm-up iteration(s)
                t1 = time.perf_counter()
                measured_from = len(tracker.alloc_events or ())
                tracker.reset_peak()
                iteration()  # measured
            except (UnsupportedConfig, TraceFailure):
                raise
            except Exception as exc:
                where = (stack.names[-1] if stack.names else
                         f"block {tracker.block}" if tracker.block >= 0 else "the root")
                op = f" at {tracker.last_op}" if tracker.last_op is not None else ""
                raise TraceFailure(f"{tracker.phase} failed in {where}{op}: "
                                   f"{first_line(exc)}") from exc
            finally:
                stack.remove()
                if in_bwd is not None:
                    in_bwd.remove()
            t2 = time.perf_counter()
            end = tracker.get_tracker_snapshot()
            peak_snap = tracker.get_tracker_snapshot("peak")
            peak = sum(tracker._peak_mem.values())

    # a quantized base's constants (probes/finetune_tp.py QuantLinear): buffers here, the
    # planner's resident params (bitsandbytes QuantState, kept on the GPU)
    quant_bytes = sum(b.numel() * b.element_size() for name, b in net.named_buffers()
                      if name.endswith("quant_consts"))
    # 0-dim optimizer state tensors (Adam's ``step``): tracked on the fake CPU device here,
    # but on CUDA they live in host memory unless the optimizer is fused (or capturable).
    scalar_bytes = sum(
        v.numel() * v.element_size()
        for st in (optimizer if in_bwd is None else in_bwd).state.values()
        for v in st.values()
        if isinstance(v, torch.Tensor) and v.dim() == 0
    )
    events = {} if tracker.alloc_events is None else {
        "alloc_events": tracker.alloc_events, "alloc_events_measured_from": measured_from}
    return {
        **events,
        "ok": True,
        "peak_bytes": int(peak),
        "peak_phase": tracker.peak_phase,
        "peak_module": _module_name(tracker.peak_module),
        "at_peak": _categories(peak_snap),
        "max_by_category": _cat_max(tracker.cat_max),
        "moments": {str(k): {"peak_bytes": int(v), "at_peak": _categories(tracker.moment_snaps[k])}
                    for k, v in tracker.moment_peaks.items() if k != "idle"},
        "sub_moments": _sub_moments(tracker),
        "end_of_step": _categories(end),
        "tracker": type(tracker).__name__,
        "model": dict(tm.info),
        "strategy": strategy.value,
        "world_size": world_size,
        "gpus_per_node": gpus_per_node,
        "mesh_shape": list(mesh_shape),
        "precision": precision.value,
        "autocast": "cuda-emulation" if emulate_autocast else ("fsdp-mp" if low else "none"),
        "checkpointing": candidate.checkpointing.value,
        "selective_policy": selective_policy,
        "sac_list": training.sac_list.value,
        "sac_force_recompute": list(training.sac_force_recompute),
        "attention": training.attention.value,
        "optimizer": training.optimizer.value,
        "optimizer_impl": training.optimizer_impl.value,
        "optimizer_in_backward": in_bwd is not None,
        "n_params": int(n_params),
        "n_trainable_params": int(n_trainable),
        "quant_const_bytes": int(quant_bytes),
        "loss": training.loss.value,
        "loss_chunks": training.loss_chunks,
        "keep_logits": training.keep_logits,
        "grad_sync": training.grad_sync.value if sync_last else "every",
        "tp": candidate.tp,
        "compile": training.compile.value,
        "float8": training.float8.value,
        "float8_all_gather": training.float8_all_gather,
        "n_blocks": len(tm.blocks),
        "optimizer_scalar_bytes": int(scalar_bytes),
        "optimizer_scalars_on_host": training.optimizer_impl is not OptimizerImpl.FUSED,
        "iterations": {"warmup": warmup, "measured": 1, "micro_batches": n_micro},
        "local_optimizer": bool(opt_params is not params),
        "build_s": round(t_built - t_start, 3),
        "warmup_s": round(t1 - t0, 3),
        "measured_s": round(t2 - t1, 3),
        "wall_s": round(time.perf_counter() - t_start, 3),
    }


# --------------------------------------------------------------------------- the child process


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


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """One job (see the module doc) -> its result dict; failures are results, not raised."""
    from probes.runner import config_from_json

    try:
        _inject_fault()
        if "inspect" in job:
            from probes.hf import inspect

            return {"ok": True, "inspect": inspect(job["inspect"])}
        source = job.get("source") or {"kind": "reference"}
        options = job.get("options", {})
        if source["kind"] == "hf":
            from probes.hf import hf_factory
            from probes.runner import job_specs

            training, candidate, world_size, gpus_per_node = job_specs(job)
            factory = hf_factory(source["config"], layers=source.get("layers"))
            result = trace_training_step(factory, training, candidate, world_size,
                                         gpus_per_node, **options)
            result["layers_traced"] = result["n_blocks"]
            return result
        model, training, candidate, world_size, gpus_per_node = config_from_json(json.dumps(job))
        return trace_step(model, training, candidate, world_size, gpus_per_node, **options)
    except UnsupportedConfig as exc:
        return {"ok": False, "unsupported": True, "reason": str(exc), "deterministic": True}
    except Exception as exc:  # noqa: BLE001 - reported to the parent, not raised
        import traceback

        traceback.print_exc(file=sys.stderr)
        reason = str(exc) if isinstance(exc, TraceFailure) else first_line(exc)
        # an exception, not a crash: the same job fails the same way (probes/trace_cache.py)
        deterministic = not os.environ.get("FITCHECK_PROBE_FAULT")
        return {"ok": False, "unsupported": False, "reason": reason,
                "deterministic": deterministic}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        job = json.loads(argv[0] if argv else sys.stdin.read())
        if "batch" in job:
            result = {"ok": True, "results": [run_job(j) for j in job["batch"]]}
        else:
            result = run_job(job)
    except Exception as exc:  # noqa: BLE001 - a malformed job
        result = {"ok": False, "unsupported": False, "reason": first_line(exc)}
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    # Skip interpreter teardown (process-group / fake-mode finalizers can be slow or noisy).
    os._exit(0)


if __name__ == "__main__":
    main()
