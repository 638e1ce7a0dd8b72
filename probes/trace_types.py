"""The vocabulary of a trace (probes/trace.py) that model factories share: what a factory is
given (``BuildOptions``), what it returns (``TraceModel``), and the two ways a trace ends
without a result (``UnsupportedConfig``, ``TraceFailure``). Its own module so that the
factories (probes/hf.py, probes/finetune_tp.py) and the trace import it without importing
each other."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from planner.spec import Attention, Candidate, Checkpointing, Precision, TrainingSpec

__all__ = ["BuildOptions", "ModelFactory", "TraceFailure", "TraceModel", "UnsupportedConfig"]


class UnsupportedConfig(Exception):
    """The configuration cannot be traced by this probe (not a crash)."""


class TraceFailure(RuntimeError):
    """An operation failed inside the traced step; the message names the phase, the module
    and the operation (one line)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BuildOptions:
    """What a model factory needs to build the module of one trace."""

    checkpointing: Checkpointing
    """none, selective or full; applied per block by the factory."""
    attention: Attention
    precision: Precision
    recompute_context: Callable[[], tuple] | None = None
    """A ``torch.utils.checkpoint`` ``context_fn`` every checkpoint must add (it re-enters the
    CUDA-autocast emulation during recomputation, for DDP under -amp); None: nothing."""
    selective_policy: str = "op"
    """What selective checkpointing means: "op" (torchtitan's op-level SAC) or, for the
    reference model only, "regions"."""
    training: TrainingSpec | None = None
    """The whole training run, for the loop effects a factory may implement (the loss
    variant, kept logits, fine-tuning); a factory that cannot must leave them out of
    ``TraceModel.effects``, and the trace then refuses the run."""
    candidate: Candidate | None = None


@dataclass(slots=True, kw_only=True)
class TraceModel:
    """A module built on the meta device and how to train it (what a factory returns)."""

    module: nn.Module
    blocks: Sequence[nn.Module]
    """The repeated layers: one FSDP unit each (then the root), and what "block backward"
    (``Phase.BLOCK_BWD``) means."""
    block_path: str
    """Module path of the blocks' container ("blocks", "model.layers"), for the record."""
    make_batch: Callable[[int, int], tuple]
    """(micro_batch, seq) -> the batch's tensors; called inside fake mode (device cpu)."""
    loss: Callable[[nn.Module, tuple], torch.Tensor]
    """(module, batch) -> the scalar loss (forward included)."""
    kernel_context: Callable[[], AbstractContextManager] = nullcontext
    """Entered around every forward and backward (e.g. CUDA kernel emulations)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Facts about the model, copied into the result under "model"."""
    effects: frozenset[str] = frozenset()
    """The non-default training-loop effects of ``BuildOptions.training`` this model
    implements ("loss", "keep_logits", "finetune", "tp"); any other one asked for is refused
    (``UnsupportedConfig``)."""
    after_step: Callable[[], None] = lambda: None
    """Called after the optimizer step and zero_grad (drops what the loop held through it,
    e.g. kept logits)."""
    parallelize: Callable[[int, int], tuple[int, ...]] | None = None
    """(world size, GPUs per node) -> mesh shape: applies tensor parallel + FSDP itself
    (probes/finetune_tp.py) instead of ``_apply_fsdp``; the fake group exists already."""


ModelFactory = Callable[[BuildOptions], TraceModel]
"""Builds the module of one trace (a fresh one per call: sharding mutates it)."""
