"""Plan a module you have, not a config: ``plan_module(factory_or_meta_module, ...)``.

    import torch
    from probes.api import plan_module
    from planner.render import table

    with torch.device("meta"):
        net = MyModel()                       # no memory: parameters on the meta device
    answer = plan_module(net, gpu="h100-80", n_gpus=8, seq=4096, micro_batch=2,
                         vocab=32000)
    print(table(answer))                      # the same table and JSON as `fitcheck`

Every candidate (DDP and the FSDP2 strategies, each checkpointing mode) is traced in this
process on fake tensors (probes/trace.py: one rank of ``n_gpus``, no GPU, no memory) at the
model's full depth, and the plan is built from the traces as ``fitcheck --from-trace`` builds
it (probes/trace_plan.py): the result is a ``planner.plan.Answer``, so
``planner.render.table`` and ``planner.render.answer_json`` print it; ``plan_module_traced``
returns the ``TracedAnswer`` (with the traces and the module's counts).

What the trace needs to know about the module (defaults in brackets):

- ``blocks``: its repeated layers, one FSDP unit and one checkpoint each [the
  ``nn.ModuleList`` with the most parameters whose children share a class]; a module path
  ("layers") or a function module -> list of modules.
- ``make_batch(micro_batch, seq) -> tuple`` of input tensors, called on fake tensors [token
  ids and targets, ``(micro_batch, seq)`` int64 below ``vocab``: the module's first
  ``nn.Embedding``'s size unless given].
- ``loss(module, batch) -> scalar`` [``module(*batch)``: a scalar is the loss; an output with
  ``.loss`` gives it; logits ``(..., vocab)`` get fp32 cross-entropy against the last batch
  tensor].

The module must be built on the meta device (``with torch.device("meta"):``) or come from a
factory (a no-argument callable, called under the meta device for each trace); it is never
materialised. Tracing sets up a fake process group in this process: do not call it inside a
job that already initialised torch.distributed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from planner.plan import Answer
from planner.spec import TracedModel
from probes.trace_plan import (
    Traced,
    TracedAnswer,
    TraceJob,
    plan_from_traces,
)

__all__ = ["ModuleTracer", "plan_module", "plan_module_traced"]


class ModuleTracer:
    """A module in this process, traced at full depth (probes.trace_plan.Tracer)."""

    def __init__(self, model: Any, *, name: str | None = None, blocks: Any = None,
                 make_batch: Callable[[int, int], tuple] | None = None,
                 loss: Callable[[Any, tuple], Any] | None = None, vocab: int | None = None,
                 attention_width: int = 0, experts_per_token: int | None = None) -> None:
        import torch
        from torch import nn

        if isinstance(model, nn.Module):
            if any(p.device.type != "meta" for p in model.parameters()):
                raise ValueError("build the module on the meta device (with "
                                 "torch.device('meta'): ...) or pass a factory")
            template = model
            self._new = lambda: copy.deepcopy(template)
        elif callable(model):
            def new() -> Any:
                with torch.device("meta"):
                    return model()

            self._new = new
        else:
            raise TypeError(f"expected an nn.Module or a factory, got {type(model).__name__}")
        self._blocks = blocks
        self._make_batch = make_batch
        self._loss = loss
        self._vocab = vocab
        self._q_dim = attention_width
        self._top_k = experts_per_token
        sample = self._new()
        self.name = name or type(sample).__name__
        self._facts = self._inspect(sample)
        self.trace_wall_s = 0.0
        self.children = 0

    # -- the module

    def _find_blocks(self, module: Any) -> tuple[str, list]:
        from probes.hf import find_blocks

        if self._blocks is None:
            path, blocks = find_blocks(module)
            return path, list(blocks)
        if isinstance(self._blocks, str):
            return self._blocks, list(module.get_submodule(self._blocks))
        return "blocks", list(self._blocks(module))

    def _vocab_of(self, module: Any) -> int:
        from torch import nn

        if self._vocab is not None:
            return self._vocab
        emb = next((m for m in module.modules() if isinstance(m, nn.Embedding)), None)
        if emb is None:
            raise ValueError("no nn.Embedding to take the vocabulary from: pass vocab= or "
                             "make_batch=")
        return int(emb.num_embeddings)

    def _inspect(self, module: Any) -> TracedModel:
        from types import SimpleNamespace

        from probes.hf import _signature, matmul_counts, period_of

        path, blocks = self._find_blocks(module)
        cfg = SimpleNamespace(num_experts_per_tok=self._top_k)
        counts = matmul_counts(module, cfg, path, blocks)
        vocab = self._vocab
        if vocab is None and self._make_batch is None:
            vocab = self._vocab_of(module)
        sigs = [_signature(b) for b in blocks]
        notes = list(counts["notes"])
        if not self._q_dim:
            notes.append("attention_width not given: attention FLOPs left out of the step time")
        return TracedModel(
            name=self.name, cls=type(module).__name__, n_layers=len(blocks),
            period=period_of([sigs]) if len(blocks) > 1 else None, params=counts["params"],
            active_params=counts["active_params"],
            per_block_params=tuple(counts["per_block_params"]),
            root_params=counts["root_params"],
            matmul_per_block=tuple(counts["matmul_per_block"]),
            matmul_head=counts["matmul_head"], q_dim=int(self._q_dim), vocab=vocab,
            top_k=self._top_k, block_class=type(blocks[0]).__name__ if blocks else "",
            notes=tuple(n for n in notes if "attention FLOPs" not in n or not self._q_dim))

    def facts(self) -> TracedModel:
        return self._facts

    def factory(self) -> Callable[[Any], Any]:
        """A probes.trace.ModelFactory for the module."""

        def build(opts: Any) -> Any:
            import torch

            from planner.spec import Checkpointing, TrainingSpec
            from probes.trace_types import TraceModel, UnsupportedConfig

            module = self._new().train()
            path, blocks = self._find_blocks(module)
            vocab = self._vocab if self._make_batch else self._vocab_of(module)
            if opts.checkpointing is not Checkpointing.NONE:
                from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
                    CheckpointImpl,
                    checkpoint_wrapper,
                )

                from probes.hf import _recompute_contexts

                selective = opts.checkpointing is Checkpointing.SELECTIVE
                if selective and opts.selective_policy != "op":
                    raise UnsupportedConfig("selective checkpointing of a module uses 'op'")
                from probes.models import torchtitan_force_shapes

                tr = opts.training or TrainingSpec()
                wrapped = []
                for i, blk in enumerate(blocks):
                    ctx = _recompute_contexts(
                        opts.recompute_context, selective, tr.sac_list.value,
                        torchtitan_force_shapes(blk, i, tr.sac_force_recompute))
                    w = checkpoint_wrapper(blk, checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                           context_fn=ctx, preserve_rng_state=False)
                    _replace(module, blk, w)
                    wrapped.append(w)
                blocks = wrapped

            def make_batch(b: int, t: int) -> tuple:
                if self._make_batch is not None:
                    return tuple(self._make_batch(b, t))
                return (torch.randint(0, vocab, (b, t), dtype=torch.int64),
                        torch.randint(0, vocab, (b, t), dtype=torch.int64))

            return TraceModel(module=module, blocks=blocks, block_path=path,
                              make_batch=make_batch, loss=self._loss or _default_loss,
                              info={"source": "module", "class": type(module).__name__})

        return build

    def trace(self, jobs: Sequence[TraceJob]) -> list[Traced]:
        import time

        from probes.trace import (
            TraceFailure,
            UnsupportedConfig,
            first_line,
            trace_training_step,
        )

        out = []
        for job in jobs:
            t0 = time.perf_counter()
            try:
                r = trace_training_step(self.factory(), job.training, job.candidate,
                                        job.world_size, job.gpus_per_node)
                out.append(Traced(job=job, ok=True, result=r, depths=(self._facts.n_layers,),
                                  wall_s=time.perf_counter() - t0))
            except UnsupportedConfig as exc:
                out.append(Traced(job=job, ok=False, reason=str(exc), unsupported=True,
                                  depths=(self._facts.n_layers,)))
            except Exception as exc:  # noqa: BLE001 - a failed trace is a skipped candidate
                reason = str(exc) if isinstance(exc, TraceFailure) else first_line(exc)
                out.append(Traced(job=job, ok=False, reason=reason,
                                  depths=(self._facts.n_layers,)))
            self.trace_wall_s += time.perf_counter() - t0
        return out


def _replace(root: Any, old: Any, new: Any) -> None:
    """Put ``new`` where ``old`` sits in ``root``'s module tree."""
    for name, mod in root.named_modules():
        for child_name, child in mod.named_children():
            if child is old:
                setattr(mod, child_name, new)
                return
    raise ValueError("block not found under the module")


def _default_loss(module: Any, batch: tuple) -> Any:
    import torch
    import torch.nn.functional as F

    out = module(*batch)
    if hasattr(out, "loss") and out.loss is not None:
        return out.loss
    if isinstance(out, (tuple, list)):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{type(module).__name__} returned {type(out).__name__}: pass loss=")
    if out.dim() == 0:
        return out
    target = batch[-1]
    return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), target.reshape(-1))


def plan_module_traced(
    model: Any,
    *,
    gpu: str = "h100-80",
    n_gpus: int = 8,
    gpus_per_node: int | None = None,
    seq: int = 2048,
    micro_batch: int = 1,
    grad_accum: int = 1,
    precision: str = "bf16-amp",
    optimizer: str = "adamw",
    optimizer_impl: str = "foreach",
    strategies: Sequence[str] | None = None,
    checkpointing: str = "auto",
    margin: float | None = None,
    blocks: Any = None,
    make_batch: Callable[[int, int], tuple] | None = None,
    loss: Callable[[Any, tuple], Any] | None = None,
    vocab: int | None = None,
    attention_width: int = 0,
    experts_per_token: int | None = None,
    name: str | None = None,
    rank: str = "throughput",
) -> TracedAnswer:
    """``plan_module`` with the traces and the module's counts (a ``TracedAnswer``)."""
    from planner.fields import FLAGS
    from planner.request import build_request

    tracer = ModuleTracer(model, name=name, blocks=blocks, make_batch=make_batch, loss=loss,
                          vocab=vocab, attention_width=attention_width,
                          experts_per_token=experts_per_token)
    facts = tracer.facts()
    values: dict[str, Any] = {
        "training.seq": seq, "training.micro_batch": micro_batch,
        "training.grad_accum": grad_accum, "training.precision": precision,
        "training.optimizer": optimizer, "training.optimizer_impl": optimizer_impl,
        "hardware.gpu": gpu, "hardware.n": n_gpus, "hardware.gpus_per_node": gpus_per_node,
        "strategy": list(strategies) if strategies else None, "checkpointing": checkpointing,
        "calibration": "none",
    }
    if margin is not None:
        values["margin"] = margin
    request = build_request(values, FLAGS, allow_files=False, traced=facts)
    return plan_from_traces(request, tracer, rank=rank)


def plan_module(model: Any, **kwargs: Any) -> Answer:
    """The plan of a module (a meta-device ``nn.Module`` or a factory): the same
    ``planner.plan.Answer`` the ``fitcheck`` command prints, every candidate's memory traced
    (module doc; keyword arguments as ``plan_module_traced``). Raises
    ``probes.trace_plan.TraceRefused`` when no candidate can be traced."""
    return plan_module_traced(model, **kwargs).answer
