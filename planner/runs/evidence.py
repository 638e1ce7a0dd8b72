"""What a user's run leaves behind, as typed values: out-of-memory events, measured samples
from training logs, memory-snapshot summaries. Every byte count is an integer with the
resolution of its printed rounding (planner/runs/units.py) and the place it was read from.
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import Any

from planner.lazy_dataclass import dataclass
from planner.memory import Phase
from planner.runs.units import Figure

__all__ = ["CATEGORIES", "Moment", "OomEvent", "Quantity", "Run", "Sample", "SnapshotSummary",
           "MOMENT_PHASES"]


class Moment(enum.StrEnum):
    """When in a training step a figure was measured (or the out-of-memory happened)."""

    LOADING = "loading"
    """Model construction / moving weights to the GPU / loading a checkpoint."""
    FORWARD = "forward"
    LOSS = "loss"
    """The loss of the forward pass (cross-entropy over the vocabulary)."""
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    STEP = "step"
    """A peak over whole steps (the usual training-log figure)."""
    UNKNOWN = "unknown"
    """An out-of-memory without a traceback that says where."""


MOMENT_PHASES: dict[Moment, tuple[Phase, ...]] = {
    Moment.LOADING: (Phase.INIT,),
    Moment.FORWARD: (Phase.FORWARD,),
    Moment.LOSS: (Phase.FORWARD,),
    Moment.BACKWARD: (Phase.LOSS_BWD, Phase.BLOCK_BWD, Phase.BWD_END),
    Moment.OPTIMIZER: (Phase.OPTIMIZER,),
    Moment.STEP: (Phase.FORWARD, Phase.LOSS_BWD, Phase.BLOCK_BWD, Phase.BWD_END,
                  Phase.OPTIMIZER),
    Moment.UNKNOWN: (Phase.FORWARD, Phase.LOSS_BWD, Phase.BLOCK_BWD, Phase.BWD_END,
                     Phase.OPTIMIZER),
}
"""The planner's moments (planner/memory/breakdown.py ``Phase``) a measured moment covers:
its prediction is the largest of them."""

CATEGORIES = ("params", "gradients", "optimizer_states", "gathered_params", "activations",
              "transients", "comm_buffers", "optimizer_temporaries", "cublas_workspace")
"""The planner's Breakdown fields: what holds allocated bytes."""


class Quantity(enum.StrEnum):
    """Which allocator or device figure a sample holds (torch.cuda names)."""

    ALLOCATED = "allocated"
    """torch.cuda.memory_allocated() at that point."""
    PEAK_ALLOCATED = "peak_allocated"
    """torch.cuda.max_memory_allocated() since the last reset."""
    RESERVED = "reserved"
    PEAK_RESERVED = "peak_reserved"
    PEAK_ACTIVE = "peak_active"
    DEVICE_USED = "device_used"
    """What the driver counts as used on the device (nvidia-smi / NVML / mem_get_info): the
    caching allocator's segments, the CUDA context, NCCL, other processes."""
    CAPACITY = "capacity"
    """The device's total memory as the tool saw it."""
    NEEDED = "needed"
    """The least memory limit a step ran under (set_per_process_memory_fraction bisected):
    allocated + what the allocator cannot release."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OomEvent:
    """One CUDA/HIP out-of-memory message, its figures as printed (c10's format_size)."""

    where: str
    """file:line of the message."""
    format: str
    """Which release's wording: 'torch1-cached' (<= 1.4: 'N cached' = reserved - allocated),
    'torch1-reserved' (1.5-2.0: 'reserved in total by PyTorch'), 'torch2.1' (the 'GPU N has a
    total capacty' sentence), 'torch2.2' (the same, spelled 'capacity')."""
    backend: str = "CUDA"
    """CUDA or HIP (ROCm's build prints the same message)."""
    exception: str = ""
    """RuntimeError, torch.cuda.OutOfMemoryError, torch.OutOfMemoryError (2.5+), ..."""
    device: int | None = None
    requested: Figure
    """'Tried to allocate X'."""
    capacity: Figure
    """'X total capacity': cudaMemGetInfo's total (less than nvidia-smi's total by what the
    driver keeps)."""
    free: Figure
    """'of which X is free' / 'X free': cudaMemGetInfo's free, whole device."""
    allocated: Figure
    """Allocated by PyTorch at the failure (private pools included)."""
    reserved_unallocated: Figure | None = None
    """Reserved by PyTorch but unallocated, after the allocator freed its cache and retried:
    memory it cannot give back (split blocks in live segments)."""
    process_in_use: Figure | None = None
    """'Including non-PyTorch memory, this process has X memory in use' (NVML, 2.1+)."""
    other_processes: tuple[tuple[int, Figure], ...] = ()
    """'Process N has X memory in use': other processes on the device (or this one, when its
    PID is seen from another namespace, as in containers)."""
    allowed: Figure | None = None
    """'X allowed': set_per_process_memory_fraction's cap."""
    private_pools: Figure | None = None
    """'with X allocated in private pools (e.g., CUDA Graphs)'."""
    hint: str = ""
    """The advice the message carried (max_split_size_mb / expandable_segments)."""
    moment: Moment = Moment.UNKNOWN
    moment_evidence: str = ""
    """The traceback frame that places it (e.g. 'loss.backward()')."""
    category_hint: str | None = None
    """The category the failing allocation belongs to, from the innermost frames (e.g.
    optimizer_temporaries for torch._foreach_sqrt in _multi_tensor_adam)."""
    category_evidence: str = ""
    text: str = ""

    @property
    def reserved(self) -> int | None:
        """Reserved by PyTorch in total."""
        if self.reserved_unallocated is None:
            return None
        return self.allocated.value + self.reserved_unallocated.value

    @property
    def device_used(self) -> int:
        """Used on the whole device (every process): capacity - free."""
        return self.capacity.value - self.free.value

    @property
    def non_pytorch(self) -> int | None:
        """This process's memory outside the caching allocator (context, NCCL, cuBLAS
        handles, other libraries): in use - reserved. Without the per-process figure (older
        releases, no NVML): the whole device's used - reserved, other processes included."""
        if self.reserved is None:
            return None
        if self.process_in_use is not None:
            return self.process_in_use.value - self.reserved
        return self.device_used - self.reserved

    @property
    def limit(self) -> int:
        """What the allocator could reach: the fraction cap if one was set, else capacity."""
        return self.allowed.value if self.allowed is not None else self.capacity.value


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """Figures one log line (or one block of lines) measured at one moment."""

    where: str
    format: str
    moment: Moment = Moment.STEP
    label: str = ""
    """The tool's own words for the point (DeepSpeed: 'Engine after forward')."""
    step: int | None = None
    figures: dict[Quantity, Figure] = field(default_factory=dict)
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    """Samples per second over all GPUs (HF Trainer, DeepSpeed)."""
    mfu: float | None = None
    """As the tool computed it (fraction), for reference."""
    step_time_s: float | None = None
    """Seconds per optimizer step, where the tool measures it directly."""
    device_index: int | None = None

    def get(self, q: Quantity) -> int | None:
        f = self.figures.get(q)
        return None if f is None else f.value


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotSummary:
    """A ``torch.cuda.memory._dump_snapshot`` pickle, reduced to what explain compares."""

    where: str
    reserved_bytes: int
    """Segments' total size at dump time."""
    allocated_bytes: int
    """Active allocated blocks at dump time."""
    peak_allocated_bytes: int
    """The highest allocated total over the trace (replayed)."""
    peak_moment: Moment
    moment_peaks: dict[Moment, int]
    """The highest allocated total inside each moment of the trace."""
    categories_at_peak: dict[str, int]
    """Allocated bytes at the trace's peak by what holds them (CATEGORIES + 'other')."""
    moment_categories: dict[Moment, dict[str, int]]
    expandable_segments: bool | None
    oom: dict[str, Any] | None = None
    """The trace's 'oom' entry: requested bytes, device_free, moment, category."""
    largest_at_peak: tuple[tuple[int, str, str], ...] = ()
    """The largest live allocations at the peak: (bytes, category, frame)."""
    timeline: tuple[tuple[float, dict[str, int]], ...] = ()
    """Allocated bytes by category over the trace (downsampled): (seconds since the first
    entry, {category: bytes})."""
    moment_spans: tuple[tuple[Moment, float, float], ...] = ()
    trace_entries: int = 0
    baseline_bytes: int = 0
    """Allocated before the trace began (not in the ring buffer): attributed to parameters
    and optimizer state by their blocks' frames where the snapshot has them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """Everything read from a user's files about one job."""

    files: tuple[str, ...] = ()
    ooms: tuple[OomEvent, ...] = ()
    samples: tuple[Sample, ...] = ()
    snapshots: tuple[SnapshotSummary, ...] = ()
    versions: dict[str, str | None] = field(default_factory=dict)
    """torch / cuda / driver / nccl when a file states them."""
    gpu_name: str | None = None
    notes: tuple[str, ...] = ()

    def merged(self, other: Run) -> Run:
        return Run(files=self.files + other.files, ooms=self.ooms + other.ooms,
                   samples=self.samples + other.samples,
                   snapshots=self.snapshots + other.snapshots,
                   versions={**self.versions, **{k: v for k, v in other.versions.items() if v}},
                   gpu_name=self.gpu_name or other.gpu_name, notes=self.notes + other.notes)

    @property
    def empty(self) -> bool:
        return not (self.ooms or self.samples or self.snapshots)
