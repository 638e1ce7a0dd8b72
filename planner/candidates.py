"""What a candidate is, which ones exist, and the one expander every caller uses.

A candidate is strategy x offload x checkpointing (x tensor-parallel degree). ``expand`` lists the candidates of a request
in the order an engineer would try them; ``plan``, ``report``, ``gate`` and the CUDA probe all
call it, so a combination that does not exist (DDP with CPU offload) is refused in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from planner import vec
from planner.spec import Candidate, Checkpointing, Cluster, ModelSpec, Offload, Strategy

CHECKPOINTING_ORDER: tuple[Checkpointing, ...] = (
    Checkpointing.NONE, Checkpointing.SELECTIVE, Checkpointing.FULL)
"""Lightest first: what `--checkpointing auto` tries in turn."""
OFFLOAD_ORDER: tuple[Offload, ...] = (
    Offload.NONE, Offload.OPTIMIZER, Offload.PARAMS_AND_OPTIMIZER)
STRATEGY_PREFERENCE: tuple[Strategy, ...] = (
    Strategy.DDP,
    Strategy.SHARD_GRAD_OP,
    Strategy.HYBRID_SHARD,
    Strategy.FULL_SHARD,
    Strategy.ZERO1,
    Strategy.ZERO2,
    Strategy.ZERO3,
    Strategy.NO_SHARD,
)
"""The simplest first: the order ties are broken in (HYBRID_SHARD only counts multi-node)."""
SHARDING_ORDER: tuple[Strategy, ...] = (
    Strategy.ZERO3, Strategy.FULL_SHARD, Strategy.HYBRID_SHARD, Strategy.ZERO2,
    Strategy.SHARD_GRAD_OP, Strategy.ZERO1, Strategy.NO_SHARD, Strategy.DDP)
"""Most memory saved first: the order a fit search tries candidates in for an early exit."""
EQUIVALENT = {
    Strategy.ZERO2: Strategy.SHARD_GRAD_OP,
    Strategy.ZERO3: Strategy.FULL_SHARD,
    Strategy.SHARD_GRAD_OP: Strategy.ZERO2,
    Strategy.FULL_SHARD: Strategy.ZERO3,
    Strategy.NO_SHARD: Strategy.DDP,
}
"""Named equivalents (DeepSpeed ZeRO stage <-> FSDP sharding strategy), for reasons and docs."""
TP_DEGREES: tuple[int, ...] = (2, 4, 8)
"""Tensor-parallel degrees `--tp auto` tries (within one node, as torchtitan's 2-D mesh)."""
TP_STRATEGIES = (Strategy.FULL_SHARD, Strategy.HYBRID_SHARD, Strategy.SHARD_GRAD_OP,
                 Strategy.NO_SHARD)
"""FSDP2 over the data-parallel dimension of a 2-D mesh (torchtitan parallelize_llama)."""


class UnsupportedCandidate(ValueError):
    """The combination does not exist in PyTorch/DeepSpeed (e.g. DDP with CPU offload)."""


def check_supported(candidate: Candidate) -> None:
    s, o = candidate.strategy, candidate.offload
    if o is Offload.OPTIMIZER and not s.is_zero:
        raise UnsupportedCandidate(
            f"offload 'optimizer' is ZeRO-Offload (zero1/zero2/zero3), not available with {s}")
    if o is Offload.PARAMS_AND_OPTIMIZER and s not in (
            Strategy.FULL_SHARD, Strategy.HYBRID_SHARD, Strategy.SHARD_GRAD_OP, Strategy.ZERO3):
        raise UnsupportedCandidate(
            f"offload 'params_and_optimizer' needs sharded parameters "
            f"(full_shard, hybrid_shard, shard_grad_op, zero3), not {s}")
    if candidate.checkpointing is Checkpointing.AUTO:
        raise UnsupportedCandidate("checkpointing 'auto' must be expanded before estimation")
    if candidate.tp > 1:
        if s not in TP_STRATEGIES:
            raise UnsupportedCandidate(
                f"tensor parallel is modelled with FSDP on a 2-D mesh (full_shard, "
                f"hybrid_shard, shard_grad_op, no_shard), not {s}")
        if o is not Offload.NONE:
            raise UnsupportedCandidate("tensor parallel with CPU offload is not modelled")


def tp_problem(model: ModelSpec, tp: int, n_gpus: int, gpus_per_node: int, ep: int = 1
               ) -> str | None:
    """Why a tensor-parallel degree cannot run this model on this cluster, or None.

    torchtitan's Llama plan (``parallelize_llama``/``apply_tp``): q/k/v and the MLP's input
    projections are column-parallel (heads and FFN columns split), o and down row-parallel;
    local heads are n_heads / tp and n_kv_heads / tp, so both must divide; the TP group lives
    inside a node (NVLink) and the data-parallel group is n_gpus / tp.
    """
    if tp <= 1:
        return None
    if tp > gpus_per_node:
        return f"TP {tp} spans more than a node ({gpus_per_node} GPUs)"
    if n_gpus % tp:
        return f"{n_gpus} GPUs is not a multiple of TP {tp}"
    for what, v in (("heads", model.n_heads), ("kv heads", model.n_kv_heads),
                    ("FFN width", model.ffn_hidden)):
        if v % tp:
            return f"{what} ({v}) not divisible by TP {tp}"
    if model.is_moe and ep <= 1:
        # torchtitan (b5bcd76, models/common/moe_sharding.py): without EP the routed experts
        # are TP-sharded on their FFN dim (not modelled); with EP they stay whole on the EP
        # ranks and each TP rank routes its own sequence shard (docs/model.md §8.8: modelled)
        return ("tensor parallel for an MoE model without --ep is NOT MODELLED (torchtitan "
                "TP-shards the experts there; beside --ep N it is modelled)")
    return None


def degree_of(strategy: Strategy, n_gpus: Any, gpus_per_node: Any, tp: int = 1) -> Any:
    """Ranks the model states are sharded over by data parallelism: 1 for DDP and NO_SHARD,
    a node for HYBRID_SHARD, every GPU otherwise; with tensor parallel the data-parallel
    dimension is n_gpus / tp (a node: gpus_per_node / tp). Numbers may be numpy arrays."""
    if strategy in (Strategy.DDP, Strategy.NO_SHARD):
        return 1
    if strategy is Strategy.HYBRID_SHARD:
        return vec.minimum(n_gpus, gpus_per_node) // tp
    return n_gpus // tp


def shard_degree(strategy: Strategy, cluster: Cluster, tp: int = 1) -> int:
    return degree_of(strategy, cluster.n_gpus, cluster.gpus_per_node, tp)


def checkpointing_modes(checkpointing: Checkpointing | Iterable[Checkpointing]
                        ) -> tuple[Checkpointing, ...]:
    """'auto' -> every mode, lightest first; a mode -> itself; several modes (the report's
    --checkpointing list) -> those, lightest first."""
    if isinstance(checkpointing, Checkpointing):
        return CHECKPOINTING_ORDER if checkpointing is Checkpointing.AUTO else (checkpointing,)
    return tuple(sorted(set(checkpointing), key=CHECKPOINTING_ORDER.index))


def skipped_on_one_gpu(strategy: Strategy, offload: Offload) -> bool:
    """On one GPU every FSDP flavour without offload is plain training plus overhead: the
    planner answers it with DDP's row (one rank, no buckets)."""
    return strategy.is_fsdp and offload is Offload.NONE


def listed_at(candidate: Candidate, n_gpus: Any) -> Any:
    """Whether a candidate is listed at this GPU count (a number or a numpy array of them):
    everywhere but where ``skipped_on_one_gpu`` answers it with DDP's row."""
    if candidate.tp > 1 or not skipped_on_one_gpu(candidate.strategy, candidate.offload):
        return True
    return n_gpus > 1


def expand(strategies: Iterable[Strategy], offloads: Iterable[Offload],
           checkpointing: Checkpointing | Iterable[Checkpointing], n_gpus: int | None,
           skipped: list[str] | None = None, tps: Iterable[int] = (1,),
           quiet_tp: bool = False) -> Iterator[tuple[Candidate, ...]]:
    """Per (offload, strategy, TP degree), the candidates to try, lightest checkpointing
    first.

    Each item is one (strategy, offload, tp) with its checkpointing modes; the caller keeps
    the first that fits (`auto`) or the only one. Combinations that do not exist are left out
    and described in ``skipped`` when a list is given (``quiet_tp``: strategies that do not
    compose with TP are left out silently, for `--tp auto`). Those not listed at ``n_gpus``
    (``listed_at``) are left out too; ``n_gpus=None``: at any count (the caller asks
    ``listed_at`` per configuration, as the report's sweep does).
    """
    modes = checkpointing_modes(checkpointing)
    for offload in offloads:
        for tp in tps:
            for strategy in strategies:
                if n_gpus is not None and not listed_at(
                        Candidate(strategy=strategy, offload=offload, tp=tp), n_gpus):
                    continue
                try:
                    check_supported(Candidate(strategy=strategy, offload=offload,
                                              checkpointing=modes[0], tp=tp))
                except UnsupportedCandidate as exc:
                    if skipped is not None and not (quiet_tp and tp > 1):
                        skipped.append(f"{strategy}+{offload}"
                                       f"{f'+tp{tp}' if tp > 1 else ''}: {exc}")
                    continue
                yield tuple(Candidate(strategy=strategy, offload=offload, checkpointing=ck,
                                      tp=tp) for ck in modes)


def label(c: Candidate) -> str:
    """'full_shard + TP 4 + full checkpointing + params_and_optimizer offload'."""
    out = str(c.strategy)
    if c.tp > 1:
        out += f" + TP {c.tp}"
    if c.checkpointing is not Checkpointing.NONE:
        out += f" + {c.checkpointing} checkpointing"
    if c.offload is not Offload.NONE:
        out += f" + {c.offload} offload"
    return out


def preference_key(c: Candidate, multi_node: bool) -> tuple[int, int, int, int]:
    """Simplest first: no offload, no tensor parallel (then the smallest degree), lighter
    checkpointing, then STRATEGY_PREFERENCE."""
    order = [s for s in STRATEGY_PREFERENCE if multi_node or s is not Strategy.HYBRID_SHARD]
    s_rank = order.index(c.strategy) if c.strategy in order else len(STRATEGY_PREFERENCE)
    return (OFFLOAD_ORDER.index(c.offload), c.tp, CHECKPOINTING_ORDER.index(c.checkpointing),
            s_rank)


def fit_first_key(c: Candidate) -> tuple[int, int, int, int]:
    """Most memory saved first: offload, checkpointing, tensor parallel, sharding."""
    return (-OFFLOAD_ORDER.index(c.offload), -CHECKPOINTING_ORDER.index(c.checkpointing),
            -c.tp, SHARDING_ORDER.index(c.strategy))
