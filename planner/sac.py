"""torchtitan's ``force_recompute_mm_shapes_by_fqns``: the linears selective checkpointing
recomputes whatever its alternation says (``--sac-force-recompute``).

The rule, torchtitan b5bcd76c torchtitan/distributed/activation_checkpoint.py
``SelectiveAC._wrap_block`` (lines 220-267; since 9a8cb98f1, #1380, 2025-07-16, as
``per_op_sac_force_recompute_mm_shapes_by_fqns`` until c5d93d109, 2026-06-15):

* per block, every module whose name ``layers.<i>.<path>`` contains one of the entries (a
  substring test, line 229) must be an ``nn.Linear`` (else ``ValueError``, line 232); its weight
  gives the shape ``(in_features, out_features)`` (line 237);
* in that block's forward and recompute, an ``aten.mm`` / ``aten.linear`` whose right operand
  has one of those shapes is recomputed and *not counted* in the every-other-mm alternation
  (lines 260-267): any mm of that shape, named or not (wq's (h, h) takes wo's with it when
  q_dim = h).

fitcheck's blocks name their linears with torchtitan's module paths (``MODULES``); an entry is
resolved against those, per block (a dense first block of an MoE model has no ``moe``).
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT = ("moe.router.gate",)
"""torchtitan's default since 9a8cb98f1 (2025-07-16)."""

MODULES = {
    # planner/arch linear output -> torchtitan's module path inside a block
    # (models/common/attention.py: wq, wk, wv | wqkv, wo; deepseek_v3/model.py: wq | wq_a,
    # wq_b, wkv_a, wkv_b, wo; common/feed_forward.py FeedForward w1 (gate), w3 (up), w2 (down);
    # common/moe.py MoE router (TokenChoiceTopKRouter.gate), shared_experts (a FeedForward))
    "q.out": "attention.wq", "k.out": "attention.wk", "v.out": "attention.wv",
    "qkv.out": "attention.wqkv", "o.out": "attention.wo",
    "q_a.out": "attention.wq_a", "q_b.out": "attention.wq_b",
    "kv_a.out": "attention.wkv_a", "kv_b.out": "attention.wkv_b",
    "gate.out": "feed_forward.w1", "up.out": "feed_forward.w3", "down.out": "feed_forward.w2",
    "router.out": "moe.router.gate",
    "shared.gate.out": "moe.shared_experts.w1", "shared.up.out": "moe.shared_experts.w3",
    "shared.down.out": "moe.shared_experts.w2",
}
"""fitcheck's linears that torchtitan's models have, by torchtitan's name. Not here (no
torchtitan model has them): a non-gated MLP, a fused gate_up, Qwen2-MoE's shared-expert gate;
they are still recomputed when their shape matches a named one."""

NORMS = ("attention_norm", "ffn_norm")
"""The modules of every torchtitan block that are no linear (llama3/model.py TransformerBlock)."""


def _kinds(model) -> list[bool]:
    """The kinds of block the model has: ``dense`` True for an MoE model's dense first ones."""
    return [False, True] if model.is_moe and model.n_dense_layers else [False]


def _paths(model, dense: bool) -> tuple[list[str], list[str]]:
    """(the block's linears by torchtitan path, its other modules): the parents of the linears,
    the norms, the routed experts."""
    from planner.arch import variants_of

    outs = variants_of(model).block_linear_outputs(model, 1, 1, dense)
    linears = [MODULES[o.saved.name] for o in outs if o.saved.name in MODULES]
    other = {p.rsplit(".", i)[0] for p in linears for i in (1, 2) if p.count(".") >= i}
    other.update(NORMS)
    if model.is_moe and not dense:
        other.update(("moe.experts", "moe.routed_experts"))
    if model.qk_norm != "none":  # QkNorm
        other.update(("attention.q_norm", "attention.k_norm"))
    if model.mla:
        other.add("attention.kv_norm")
        if model.q_lora_rank:
            other.add("attention.q_norm")
    return linears, sorted(other - set(linears))


def forced_shapes(model, entries: Iterable[str], dense: bool = False) -> frozenset:
    """The (in, out) weight shapes one block recomputes (``dense``: an MoE model's dense
    first block)."""
    from planner.arch import variants_of

    entries = tuple(entries)
    if not entries:
        return frozenset()
    return frozenset(o.weight for o in
                     variants_of(model).block_linear_outputs(model, 1, 1, dense)
                     if o.saved.name in MODULES
                     and any(e in MODULES[o.saved.name] for e in entries))


def _layer_indices(entry: str, n_layers: int) -> list[int]:
    """The layer indices whose ``layers.<i>.`` prefix ``entry`` could match, smallest first:
    enough to test, whatever the depth (a config may declare millions of layers). A match
    across the prefix holds the entry's digits against i's: a digit run bounded on both sides
    is i itself, one at the entry's end a prefix of i (smallest: the run, which has no leading
    zero or never matches), one at its start a suffix of i (smallest: the run, or 1 followed
    by it when it has a leading zero); an entry without digits matches every i or none, so 0
    decides."""
    import re

    runs = [d for d in re.findall(r"[0-9]+", entry) if len(d) <= 18]
    cands = {0} | {int(d) for d in runs} | {int("1" + d) for d in runs}
    return sorted(i for i in cands if i < n_layers)


def problem(model, entries: Iterable[str]) -> str | None:
    """Why an entry cannot be planned, or None: one that matches a module other than a linear
    (torchtitan's own ValueError), one that depends on the layer (``layers.3.``: fitcheck's
    blocks are alike), one that names no module fitcheck knows in a torchtitan block."""
    blocks = [_paths(model, dense) for dense in _kinds(model)]
    known = set(MODULES.values())
    for e in entries:
        every = {p for linears, other in blocks for p in linears + other}
        if any(e in f"layers.{i}.{p}" and e not in p for p in every | {""}
               for i in _layer_indices(e, model.n_layers)):
            return (f"{e!r} matches by layer index (torchtitan tests it against "
                    "'layers.<i>.<module>'): a per-layer choice is NOT MODELLED (fitcheck's "
                    "blocks are alike); name modules inside a block, e.g. attention.wq")
        for linears, other in blocks:
            hit = [p for p in other if e in p]
            if hit:
                return (f"{e!r} matches {hit[0]}, not an nn.Linear: torchtitan refuses it "
                        "(\"force_recompute_mm_shapes_by_fqns expected to match a nn.Linear\")")
        if not any(e in p for linears, _ in blocks for p in linears) and \
                not any(e in p for p in known):
            names = sorted({p for linears, _ in blocks for p in linears})
            return (f"{e!r} names no module fitcheck knows in a torchtitan block: NOT "
                    f"MODELLED (this model's linears: {', '.join(names)})")
    return None


def no_effect(model, entries: Iterable[str]) -> list[str]:
    """Entries that match no linear of this model's blocks (a linear torchtitan's other
    models have, ``moe.router.gate`` in a dense model): torchtitan forces nothing for them."""
    linears = {p for dense in _kinds(model) for p in _paths(model, dense)[0]}
    return [e for e in entries if not any(e in p for p in linears)]
