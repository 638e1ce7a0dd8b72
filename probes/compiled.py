"""What ``torch.compile`` saves for backward, per transformer block family, measured on a CPU.

AOTAutograd splits a compiled block's joint graph with the min-cut partitioner
(``torch/_functorch/partitioners.py`` ``min_cut_rematerialization_partition``): it saves the
cheapest set of tensors from which backward can recompute the rest, using inductor's
decompositions. That choice can be read without a GPU or a C++ compiler: run ``aot_function``
with that partitioner and inductor's decomposition table on fake tensors of the reference
block (probes/models.py) and a forward "compiler" that only records the forward graph's
outputs (the tensors saved for backward) and returns the graph uncompiled.

Each saved tensor is classified by what it is computed from (the block input, the parameters
only, or the shared RoPE/ALiBi/mask inputs) and its size is matched to one product of the
block's dimensions (t·h, t·f, t·q_dim, ...; t = micro-batch x seq tokens), with test
dimensions chosen so that the products are all different. What the block computes from its
input is its saved activations; weight casts are autocast's cache (already counted by the
planner) and the shared inputs are the root's. The result, bytes per dimension product, is
written to planner/data/compiled_blocks.json, which the planner reads without torch:

    python -m probes.compiled --write        (regenerates the table; tests check it is current)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

import torch

from planner.compiled import DATA_PATH, TERMS, family_key, family_of
from planner.presets import PRESETS
from planner.spec import Attention, ModelSpec, PositionKind

B, SEQ = 2, 96
T = B * SEQ
HIDDEN, HEADS, HEAD_DIM, FFN = 224, 6, 40, 608
"""Test dimensions: every product in planner.compiled.TERMS has a different value."""

VIEW_OPS = {"aten.view.default", "aten.permute.default", "aten.t.default", "aten.transpose.int",
            "aten.alias.default", "aten.expand.default", "aten._unsafe_view.default",
            "aten.reshape.default", "aten.unsqueeze.default", "aten.squeeze.dim",
            "aten.slice.Tensor", "aten.select.int"}


def test_spec(family: ModelSpec) -> ModelSpec:
    """A small model of the family with the test dimensions."""
    kv = HEADS if family.n_kv_heads == family.n_heads else (1 if family.n_kv_heads == 1 else 2)
    return dataclasses.replace(
        family, name="compiled-probe", n_layers=1, hidden=HIDDEN, n_heads=HEADS, n_kv_heads=kv,
        head_dim=HEAD_DIM, ffn_hidden=FFN, vocab=512, n_experts=1, experts_per_token=1,
        max_positions=max(family.max_positions, SEQ) if family.max_positions else 0)


def term_values(spec: ModelSpec) -> dict[str, int]:
    return {name: fn(spec, T, SEQ) for name, fn in TERMS.items()}


def _ancestors(node: Any, cache: dict) -> frozenset:
    """The placeholders a node is computed from."""
    if node.name in cache:
        return cache[node.name]
    if node.op == "placeholder":
        out = frozenset({node.name})
    else:
        out = frozenset()
        for a in node.all_input_nodes:
            out |= _ancestors(a, cache)
    cache[node.name] = out
    return out


def saved_block(family: ModelSpec, *, autocast: bool, attention: Attention) -> dict[str, int]:
    """Bytes per dimension product that a compiled block saves for backward."""
    from functorch.compile import aot_function, make_boxed_func
    from functorch.compile import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from torch._subclasses.fake_tensor import FakeTensorMode

    from probes.autocast_emul import CudaAutocastEmulation
    from probes.models import build_model

    spec = test_spec(family)
    low = torch.bfloat16
    dtype = torch.float32 if autocast else low
    model = build_model(spec, device="meta", attention=str(attention)).to(dtype)
    blk = model.blocks[0]
    graph: dict[str, Any] = {}

    def fw_compiler(gm, _inputs):
        graph["gm"] = gm
        return make_boxed_func(gm)

    with FakeTensorMode(allow_non_fake_inputs=True):
        blk = blk.to_empty(device="cpu")
        params = dict(blk.named_parameters())
        x = torch.randn(B, SEQ, spec.hidden, dtype=dtype, requires_grad=True)
        extra: dict[str, Any] = {"cos": None, "sin": None, "alibi": None, "mask": None}
        if spec.position is PositionKind.ROPE:
            extra["cos"] = torch.randn(SEQ, spec.d_head, dtype=dtype)
            extra["sin"] = torch.randn(SEQ, spec.d_head, dtype=dtype)
        causal = not spec.encoder_head
        if causal and (attention is Attention.EAGER or spec.position is PositionKind.ALIBI):
            extra["mask"] = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
        if spec.position is PositionKind.ALIBI:
            extra["alibi"] = torch.randn(spec.n_heads, SEQ, SEQ, dtype=dtype)
            if attention is not Attention.EAGER:
                extra["mask"] = None
        shared = [v for v in extra.values() if v is not None]
        names = list(params)

        def f(x, *rest):
            ps, sh = rest[:len(names)], list(rest[len(names):])
            args = {k: (sh.pop(0) if v is not None else None) for k, v in extra.items()}
            return torch.func.functional_call(blk, dict(zip(names, ps)),
                                              (x, args["cos"], args["sin"], args["alibi"],
                                               args["mask"]))

        g = aot_function(f, fw_compiler=fw_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm),
                         partition_fn=min_cut_rematerialization_partition,
                         decompositions=select_decomp_table())
        blk.train()
        ctx = CudaAutocastEmulation(low) if autocast else torch.autocast("cpu", enabled=False)
        with ctx:
            out = g(x, *params.values(), *shared)
        out.sum().backward()
    gm = graph["gm"]
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    x_name = placeholders[0]
    outputs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    values = term_values(spec)
    if spec.n_kv_heads == spec.n_heads:
        del values["t*kv"]  # multi-head attention: kv width = q width in every model
    by_value: dict[int, str] = {}
    for name, v in values.items():
        if v in by_value:
            raise RuntimeError(f"test dimensions collide: {name} and {by_value[v]} = {v}")
        by_value[v] = name
    cache: dict = {}
    out: dict[str, int] = {}
    for node in outputs[1:]:  # outputs[0] is the block's output
        if not hasattr(node, "meta") or "val" not in node.meta:
            continue
        if x_name not in _ancestors(node, cache):
            continue  # computed from parameters (weight casts) or the shared root inputs only
        val = node.meta["val"]
        term = by_value.get(val.numel())
        if term is None:
            raise RuntimeError(f"{family_key(family, autocast, attention)}: saved tensor "
                               f"{node.name} {tuple(val.shape)} matches no dimension product")
        out[term] = out.get(term, 0) + val.dtype.itemsize
    return out


def families() -> dict[str, tuple[ModelSpec, bool, Attention]]:
    """Every (family, regime, attention) the presets need, by key. MoE blocks are left out
    (their token dispatch has data-dependent shapes)."""
    out = {}
    for spec in PRESETS.values():
        if spec.is_moe:
            continue
        fam = family_of(spec)
        for autocast in (False, True):
            for attention in Attention:
                out.setdefault(family_key(fam, autocast, attention), (fam, autocast, attention))
    return out


def table() -> dict[str, Any]:
    rows = {key: saved_block(fam, autocast=ac, attention=att)
            for key, (fam, ac, att) in sorted(families().items())}
    return {"torch": torch.__version__.split("+")[0],
            "command": "python -m probes.compiled --write",
            "method": "aot_function + min_cut_rematerialization_partition + inductor "
                      "decompositions on fake tensors of probes/models.py's block",
            "families": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {DATA_PATH}")
    args = ap.parse_args(argv)
    doc = table()
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if args.write:
        tmp = DATA_PATH + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, DATA_PATH)
        print(f"wrote {DATA_PATH}: {len(doc['families'])} families", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
