"""The memory model's value types: the moments of a step, a breakdown, an estimate."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import field
from typing import Any

from planner.lazy_dataclass import dataclass
from planner import vec
from planner.spec import Candidate

MiB = 2**20
GiB = 2**30


class Phase(enum.StrEnum):
    """The moments of one training step the model evaluates (the peak is the largest)."""

    INIT = "init"
    """Loading: the weights reaching the GPU before the first step (--init)."""
    FORWARD = "forward"
    """At the loss, end of forward: every saved activation, the logits being reduced."""
    LOSS_BWD = "loss_bwd"
    """The loss's backward: the fp32 vocabulary gradients on top of all activations."""
    BLOCK_BWD = "block_bwd"
    """Inside the blocks' backward: gradient temporaries, recompute, FSDP's unsharded grads
    and reduce-scatter buffers (the largest of a few sub-moments)."""
    BWD_END = "bwd_end"
    """End of backward: every gradient, the embedding's backward and the root's reduction."""
    OPTIMIZER = "optimizer"
    """The optimizer step: states, gradients and the step's temporaries."""


PHASES: tuple[Phase, ...] = tuple(Phase)


@dataclass(frozen=True, slots=True, kw_only=True)
class Overheads:
    """Runtime terms no parameter count predicts. Defaults and sources in docs/model.md §6."""

    cublas_workspace_bytes: int = 32 * MiB
    """cuBLAS + cuBLASLt workspaces through the caching allocator (CublasHandlePool.cpp:
    4096 KiB x 8 on Hopper and newer; set per profile family)."""
    nccl_bytes_per_communicator: int = 512 * MiB
    """NCCL's device buffers per communicator (channels x peers x protocol buffers)."""
    allocator_fragmentation: float = 0.08
    """Caching allocator with fixed segments: what the default stream holds free beyond the
    allocated peak, a fraction of allocated (*assumed*; the emulator measures 1.1-31.9 %,
    median 4.9 %, over 55 GPU cases: docs/model.md §7.4)."""
    host_bytes_per_process: int = 4 * GiB
    """Host RAM of one training process (Python, torch, CUDA libraries) before offload."""
    ddp_bucket_view: bool = False
    """DDP(gradient_as_bucket_view=...); PyTorch's default is False."""
    activation_scale: float = 1.0
    """Calibrated correction of the activation terms per architecture family (1.0: the
    tensor-by-tensor count as is; planner/calibration.py sets it from GPU measurements)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Breakdown:
    """Allocated bytes on one GPU at one moment, by what holds them."""

    params: Any = 0
    """Resident parameter storage (sharded or not): fp32 master under torch AMP."""
    gradients: Any = 0
    optimizer_states: Any = 0
    """Optimizer state, plus the fp32 master copy under ZeRO mixed precision."""
    gathered_params: Any = 0
    """Working copies: FSDP/ZeRO-3 unsharded units, or autocast's cached bf16 weights."""
    activations: Any = 0
    """Tensors saved for backward."""
    transients: Any = 0
    """Loss and backward temporaries, checkpoint recompute."""
    comm_buffers: Any = 0
    """DDP gradient buckets, FSDP reduce-scatter / all-gather buffers, ZeRO buckets."""
    optimizer_temporaries: Any = 0
    cublas_workspace: Any = 0

    @property
    def total(self) -> Any:
        return (self.params + self.gradients + self.optimizer_states + self.gathered_params
                + self.activations + self.transients + self.comm_buffers
                + self.optimizer_temporaries + self.cublas_workspace)

    def plus(self, **terms: Any) -> Breakdown:
        """A copy with the given terms added (negative to remove)."""
        values = self.as_dict()
        for k, v in terms.items():
            # a new value, never in place (an array may be shared); KeyError: not a term
            values[k] = values[k] + v
        return Breakdown(**values)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in BREAKDOWN_FIELDS}


BREAKDOWN_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Breakdown))


def pick(index: Any, moments: list[Breakdown]) -> Breakdown:
    """moments[index], elementwise for arrays."""
    if isinstance(index, int):
        return moments[index]
    return Breakdown(**{k: vec.choose(index, [getattr(b, k) for b in moments])
                        for k in BREAKDOWN_FIELDS})


def largest(moments: list[Breakdown]) -> tuple[Any, Breakdown]:
    """(index, breakdown) of the moment with the most allocated bytes (elementwise for
    arrays; the first on ties)."""
    i = vec.argmax([b.total for b in moments])
    return i, pick(i, moments)


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    candidate: Candidate
    shard_degree: Any
    peak_phase: Phase
    """The moment that needs the most device memory (allocated + what the allocator cannot
    give back): what decides the fit. (An index into PHASES when evaluated on arrays.)"""
    breakdown: Breakdown
    """Allocated bytes at the peak moment, term by term."""
    phases: dict[Phase, Breakdown]
    """Every moment of the step, term by term (what the trace comparison reads)."""
    allocator_overhead_bytes: Any
    """At the peak moment: what the caching allocator holds beyond the allocated bytes and
    cannot release (rounding and split blocks inside live segments)."""
    peak_allocated_bytes: Any
    """The most allocated at any moment (torch.cuda.max_memory_allocated)."""
    peak_reserved_bytes: Any
    """The most reserved at any moment (torch.cuda.max_memory_reserved): the above plus the
    free blocks the allocator keeps cached (other streams' pools, the loss gap: docs/model.md
    §7.4), which it releases (then retries) before it raises out-of-memory, so never beyond
    what the device has."""
    cuda_context_bytes: Any
    nccl_bytes: Any
    capacity_bytes: Any
    usable_bytes: Any
    """capacity x (1 - margin)."""
    host_bytes_per_node: Any
    """Host RAM of the busiest node: the larger of loading (--init) and training."""
    host_capacity_bytes: Any
    phase_reserved: tuple[Any, ...] = field(default=())
    """Reserved at each moment of ``phases`` (allocated + the unreleasable overhead + the
    releasable cache: other streams' pools, the loss gap; docs/model.md §7.4), capped by what
    the device leaves; ``peak_reserved_bytes`` is their maximum."""
    notes: tuple[str, ...] = field(default=())
    risk: Any = None
    """The measured error of this kind of job (planner.error_bands.RiskBand), or None: then
    the verdict is the point one (needed <= usable)."""

    @property
    def required_bytes(self) -> Any:
        """What must fit on the device at the peak: allocated, the allocator's unreleasable
        overhead, the CUDA context and NCCL's buffers."""
        return (self.breakdown.total + self.allocator_overhead_bytes + self.cuda_context_bytes
                + self.nccl_bytes)

    @property
    def device_used_bytes(self) -> Any:
        """What nvidia-smi shows at the peak: reserved + context + NCCL."""
        return self.peak_reserved_bytes + self.cuda_context_bytes + self.nccl_bytes

    @property
    def headroom_bytes(self) -> Any:
        return self.usable_bytes - self.required_bytes

    @property
    def required_low_bytes(self) -> Any:
        """The low end of the need's interval (``risk``): required x its low factor."""
        return self.required_bytes if self.risk is None else \
            vec.floor_int(self.required_bytes * self.risk.low)

    @property
    def required_high_bytes(self) -> Any:
        """The high end of the need's interval (``risk``): required x its high factor."""
        return self.required_bytes if self.risk is None else \
            vec.ceil_int(self.required_bytes * self.risk.high)

    @property
    def fits_gpu(self) -> Any:
        """Fits: the whole interval of the need is within the usable bytes (the probability of
        running out of memory is at most half of 1 - the interval's coverage)."""
        return self.required_high_bytes <= self.usable_bytes

    @property
    def may_fit_gpu(self) -> Any:
        """Fits or at risk: the interval's low end is within the usable bytes."""
        return self.required_low_bytes <= self.usable_bytes

    @property
    def outcome(self) -> str:
        """fits, at_risk or does_not_fit (one configuration; host RAM included: a job whose
        host RAM does not suffice does not fit)."""
        from planner.error_bands import AT_RISK, DOES_NOT_FIT, FITS

        if not self.fits_host or not self.may_fit_gpu:
            return DOES_NOT_FIT
        return FITS if self.fits_gpu else AT_RISK

    @property
    def oom_probability(self) -> float | None:
        """The probability of running out of device memory (one configuration), from the
        measured error of this kind of job; None without a risk band."""
        if self.risk is None:
            return None
        return self.risk.p_oom(int(self.required_bytes), int(self.usable_bytes))

    @property
    def fits_host(self) -> Any:
        return self.host_bytes_per_node <= self.host_capacity_bytes

    @property
    def fits(self) -> Any:
        return self.fits_gpu & self.fits_host

    def phase_totals(self) -> dict[str, Any]:
        """Allocated bytes at each moment, keyed by the moment's name."""
        return {str(p): b.total for p, b in self.phases.items()}

    def phase_reserved_bytes(self) -> dict[str, Any]:
        """Reserved bytes at each moment, keyed by the moment's name."""
        return {str(p): r for p, r in zip(self.phases, self.phase_reserved)}
