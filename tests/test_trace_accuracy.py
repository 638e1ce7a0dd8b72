"""The planner held to the trace (the referee) on 96 small configurations (probes/matrix.py):
3 architectures x 4 strategies x 2 world sizes x checkpointing none/full x bf16-amp/bf16.

Tolerances:
- peak allocated: 3 % (the issue's bar; measured worst 0.9 %).
- params, gradients, optimizer state: 0.1 %. They are exact by construction (per-tensor
  element counts x dtype bytes, sharded over dim 0); the slack is for dim-0 padding.
- activations (+ loss and backward temporaries) at the loss's backward: 1 %. The planner
  counts every saved tensor of the reference block; what it leaves out is a handful of
  scalars and per-row statistics kept by ops outside the blocks (measured worst 0.05 %).
- FSDP working set (gathered params + reduce-scatter buffers) in block backward: 1 %.
- every moment of the step (forward, loss/block backward, end of backward, optimizer): 8 %.
  Block backward is modelled at two sub-moments (the last block, and the one before with the
  previous reduce-scatter input alive); the real peak falls inside a block's backward, a
  little below either, so the planner errs high there. At the end of backward of tied models
  in pure bf16 the trace holds 6 bytes per token x hidden more than the planner (fp32 and
  bf16 copies of the gradient reaching the embedding in the CPU embedding-backward kernel):
  -7.2 % on that moment at these tiny shapes, never the peak.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.trace

pytest.importorskip("torch")

from probes.matrix import CASES, run_case  # noqa: E402

TOL = {"params": 0.001, "gradients": 0.001, "optimizer": 0.001, "activations": 0.01,
       "fsdp_buffers": 0.01}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label())
def test_planner_matches_trace(case):
    c = run_case(case)
    assert c.ok, c.reason
    assert abs(c.peak.rel_error) <= 0.03, (c.peak, c.traced_peak_phase, c.predicted_peak_phase)
    for name, pair in c.categories.items():
        assert pair.rel_error is not None and abs(pair.rel_error) <= TOL[name], (name, pair)
    for name, pair in c.moments.items():
        assert abs(pair.rel_error) <= 0.08, (name, pair)
