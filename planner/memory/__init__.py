"""Per-GPU memory of one training step (docs/model.md).

- ``breakdown``: the moments of a step (``Phase``), ``Breakdown``, ``Estimate``, ``Overheads``
- ``states``: parameters, gradients, optimizer state, offload
- ``working``: working copies and communication buffers per strategy family
- ``moments``: one function per moment of the step
- ``estimator``: ``estimate`` and the runtime terms outside the allocator
- ``vec``: arithmetic shared by the scalar planner and the vectorized report sweep
"""

from planner.candidates import UnsupportedCandidate, check_supported, shard_degree
from planner.memory.breakdown import PHASES, Breakdown, Estimate, Overheads, Phase
from planner.memory.estimator import (
    DEFAULT_MARGIN,
    activation_plan,
    estimate,
    from_phases,
    uses_autocast_amp,
)
from planner.memory.states import optimizer_state_bytes

__all__ = ["DEFAULT_MARGIN", "PHASES", "Breakdown", "Estimate", "Overheads", "Phase",
           "UnsupportedCandidate", "activation_plan", "check_supported", "estimate", "from_phases",
           "optimizer_state_bytes", "shard_degree", "uses_autocast_amp"]
