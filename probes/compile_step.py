"""``--compile blocks`` in the trace: each block of the reference transformer runs as an
AOTAutograd-compiled function (issue 11).

``torch.compile`` itself cannot run here: Dynamo skips every frame while a
``TorchDispatchMode`` is on the stack (torch/_dynamo/convert_frame.py,
``any_torch_dispatch_mode_on_stack``), and both the memory tracker and ``FakeTensorMode`` are
such modes, so a compiled module silently runs eagerly under the tracker. What
``torch.compile`` changes for memory is AOTAutograd's forward/backward split, so the trace
builds that split directly, as probes/compiled.py does for one block: ``aot_function`` with
``min_cut_rematerialization_partition`` and inductor's decomposition table, the forward and
backward graphs kept as FX graphs (no inductor codegen, no C++ compiler). At run time the
forward graph returns the block's output and the tensors it saves for backward; the backward
graph recomputes the rest. The graphs run op by op (inductor would fuse them, so transients
inside a block are an eager upper bound; what is saved between forward and backward is the
partitioner's choice, the same set inductor receives).

``compile_blocks(net)`` wraps every block's ``_forward``; the first call traces (outside the
memory tracker: ``probes.trace`` runs one untracked micro-batch first).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["compile_blocks"]


def compile_blocks(net: nn.Module) -> None:
    """Replace each block's ``_forward`` by an AOT-compiled call (module doc). Blocks under
    activation checkpointing or with ALiBi / an explicit mask are not supported."""
    from probes.models import Block

    for blk in net.blocks:
        blk._forward = _compiled_forward(blk, Block._forward)


def _compiled_forward(blk: nn.Module, plain: Any) -> Any:
    from functorch.compile import (
        aot_function,
        make_boxed_func,
        min_cut_rematerialization_partition,
    )
    from torch._inductor.decomposition import select_decomp_table
    from torch.nn.utils.stateless import _reparametrize_module

    names: list[str] = []

    def f(x: torch.Tensor, cos: Any, sin: Any, *params: torch.Tensor) -> torch.Tensor:
        with _reparametrize_module(blk, dict(zip(names, params))):
            return plain(blk, x, cos, sin, None, None)

    boxed = aot_function(f, fw_compiler=lambda gm, _: make_boxed_func(gm),
                         bw_compiler=lambda gm, _: make_boxed_func(gm),
                         partition_fn=min_cut_rematerialization_partition,
                         decompositions=select_decomp_table())

    def forward(x: torch.Tensor, cos: Any = None, sin: Any = None, alibi: Any = None,
                mask: Any = None) -> torch.Tensor:
        if alibi is not None or mask is not None:
            raise NotImplementedError("compiled blocks: ALiBi / explicit masks not traced")
        named = list(blk.named_parameters())
        if not names:
            names.extend(n for n, _ in named)
        return boxed(x, cos, sin, *(p for _, p in named))

    return forward
