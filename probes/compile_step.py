"""``--compile blocks`` and ``--compile model`` in the trace: each block of the reference
transformer, or its whole forward and loss, runs as an AOTAutograd-compiled function (issues 11
and 24).

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

The graphs run as inductor's generated code calls them (``_boxed``): the input list is
cleared once read, so a saved tensor is freed after its last use, and the graph's ``forward``
is called rather than the GraphModule (as a module, the tracker's global module hooks ran on
the backward graph, and AccumulateGrad then copied the gradients it returned instead of
stealing them).

``compile_blocks(net)`` wraps every block's ``_forward``; ``compile_model(net)`` the whole
forward, loss included (``--compile model``). The first call traces (outside the memory
tracker: ``probes.trace`` runs one untracked micro-batch first).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["compile_blocks", "compile_model"]


def compile_blocks(net: nn.Module) -> None:
    """Replace each block's ``_forward`` by an AOT-compiled call (module doc). Blocks under
    activation checkpointing or with ALiBi / an explicit mask are not supported."""
    from probes.models import Block

    for blk in net.blocks:
        blk._forward = _compiled_forward(blk, Block._forward)


def _compiled_forward(blk: nn.Module, plain: Any) -> Any:
    from functorch.compile import aot_function, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from torch.nn.utils.stateless import _reparametrize_module

    names: list[str] = []

    def f(x: torch.Tensor, cos: Any, sin: Any, *params: torch.Tensor) -> torch.Tensor:
        with _reparametrize_module(blk, dict(zip(names, params))):
            return plain(blk, x, cos, sin, None, None)

    boxed = aot_function(f, fw_compiler=_boxed, bw_compiler=_boxed,
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


def compile_model(net: nn.Module) -> None:
    """``--compile model``: the whole forward, loss included, as one AOT-compiled call
    (module doc), as Dynamo hands a graph without breaks to AOTAutograd
    (``aot_module_simplified``: parameters and buffers lifted to graph inputs). Its backward is
    one autograd node, ``CompiledFunction.backward`` (torch/_functorch/_aot_autograd/
    runtime_wrappers.py), whose outputs are every parameter's new gradient at once; autograd
    then runs each parameter's AccumulateGrad on them."""
    from functorch.compile import aot_function, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from torch.nn.utils.stateless import _reparametrize_module

    plain = type(net).forward
    names: list[str] = []

    def f(*args: torch.Tensor) -> torch.Tensor:
        n_in = len(args) - len(names)
        with _reparametrize_module(net, dict(zip(names, args[n_in:]))):
            return plain(net, *args[:n_in])

    boxed = aot_function(f, fw_compiler=_boxed, bw_compiler=_boxed,
                         partition_fn=min_cut_rematerialization_partition,
                         decompositions=select_decomp_table())

    def forward(*inputs: torch.Tensor) -> torch.Tensor:
        named = list(net.named_parameters()) + list(net.named_buffers())
        if not names:
            names.extend(n for n, _ in named)
        return boxed(*inputs, *(t for _, t in named))

    net.forward = forward


def _boxed(gm: Any, _example: Any) -> Any:
    """The graph as inductor's generated ``call(args)`` runs (it clears ``args`` first): the
    boxed calling convention (``torch/fx/graph.py`` ``_BoxedCodeGen``), so each saved tensor
    is freed after its last use, and the graph's ``forward`` rather than the module: called as
    a module, the tracker's global module hooks (ModTracker) ran on the backward graph and
    AccumulateGrad then copied 29 of 30 first-micro-batch gradients instead of stealing them
    (Dynamo with ``aot_eager`` on real tensors steals all 30)."""
    from torch.fx.graph import _BoxedCodeGen

    _scatter_in_place(gm)
    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    code = gm.forward

    def run(args: list) -> Any:
        return code(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _scatter_in_place(gm: Any) -> None:
    """Run the embedding's backward as inductor does. The decomposition
    (``torch/_decomp/decompositions.py`` ``embedding_dense_backward``) builds a zero fp32
    table and scatter-adds into it functionally, so op by op two tables are alive; inductor's
    ``full`` is a lazy pointwise that ``_unsafe_index_put`` realises as the one buffer it
    scatters into (``torch/_inductor/lowering.py`` ``_unsafe_masked_index_put_accumulate``):
    one table."""
    target = torch.ops.aten._unsafe_masked_index_put_accumulate.default
    for node in list(gm.graph.nodes):
        base = node.args[0] if node.target is target else None
        if (base is not None and base.target is torch.ops.aten.full.default
                and len(base.users) == 1):
            node.target = _scatter_add_into
    gm.graph.lint()


def _scatter_add_into(x: torch.Tensor, mask: torch.Tensor, indices: list,
                      values: torch.Tensor) -> torch.Tensor:
    """``_unsafe_masked_index_put_accumulate`` into ``x`` itself (``_scatter_in_place``)."""
    return x.index_put_(indices, torch.where(mask, values, 0), accumulate=True)
