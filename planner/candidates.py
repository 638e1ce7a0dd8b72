"""What a candidate is, which ones exist, and the one expander every caller uses.

A candidate is strategy x offload x checkpointing. ``expand`` lists the candidates of a request
in the order an engineer would try them; ``plan``, ``report``, ``gate`` and the CUDA probe all
call it, so a combination that does not exist (DDP with CPU offload) is refused in one place.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from planner import vec
from planner.spec import Candidate, Checkpointing, Cluster, Offload, Strategy

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


def degree_of(strategy: Strategy, n_gpus: Any, gpus_per_node: Any) -> Any:
    """Ranks the model states are sharded over: 1 for DDP and NO_SHARD, a node for
    HYBRID_SHARD, every GPU otherwise (numbers may be numpy arrays)."""
    if strategy in (Strategy.DDP, Strategy.NO_SHARD):
        return 1
    if strategy is Strategy.HYBRID_SHARD:
        return vec.minimum(n_gpus, gpus_per_node)
    return n_gpus


def shard_degree(strategy: Strategy, cluster: Cluster) -> int:
    return degree_of(strategy, cluster.n_gpus, cluster.gpus_per_node)


def checkpointing_modes(checkpointing: Checkpointing) -> tuple[Checkpointing, ...]:
    """'auto' -> every mode, lightest first; a mode -> itself."""
    return CHECKPOINTING_ORDER if checkpointing is Checkpointing.AUTO else (checkpointing,)


def skipped_on_one_gpu(strategy: Strategy, offload: Offload) -> bool:
    """On one GPU every FSDP flavour without offload is plain training plus overhead: the
    planner answers it with DDP's row (one rank, no buckets)."""
    return strategy.is_fsdp and offload is Offload.NONE


def expand(strategies: Iterable[Strategy], offloads: Iterable[Offload],
           checkpointing: Checkpointing, n_gpus: int,
           skipped: list[str] | None = None) -> Iterator[tuple[Candidate, ...]]:
    """Per (offload, strategy), the candidates to try, lightest checkpointing first.

    Each item is one (strategy, offload) with its checkpointing modes; the caller keeps the
    first that fits (`auto`) or the only one. Combinations that do not exist are left out and
    described in ``skipped`` when a list is given.
    """
    modes = checkpointing_modes(checkpointing)
    for offload in offloads:
        for strategy in strategies:
            if n_gpus == 1 and skipped_on_one_gpu(strategy, offload):
                continue
            try:
                check_supported(Candidate(strategy=strategy, offload=offload,
                                          checkpointing=modes[0]))
            except UnsupportedCandidate as exc:
                if skipped is not None:
                    skipped.append(f"{strategy}+{offload}: {exc}")
                continue
            yield tuple(Candidate(strategy=strategy, offload=offload, checkpointing=ck)
                        for ck in modes)


def label(c: Candidate) -> str:
    """'full_shard + full checkpointing + params_and_optimizer offload'."""
    out = str(c.strategy)
    if c.checkpointing is not Checkpointing.NONE:
        out += f" + {c.checkpointing} checkpointing"
    if c.offload is not Offload.NONE:
        out += f" + {c.offload} offload"
    return out


def preference_key(c: Candidate, multi_node: bool) -> tuple[int, int, int]:
    """Simplest first: no offload, lighter checkpointing, then STRATEGY_PREFERENCE."""
    order = [s for s in STRATEGY_PREFERENCE if multi_node or s is not Strategy.HYBRID_SHARD]
    s_rank = order.index(c.strategy) if c.strategy in order else len(STRATEGY_PREFERENCE)
    return (OFFLOAD_ORDER.index(c.offload), CHECKPOINTING_ORDER.index(c.checkpointing), s_rank)


def fit_first_key(c: Candidate) -> tuple[int, int, int]:
    """Most memory saved first: offload, checkpointing, sharding."""
    return (-OFFLOAD_ORDER.index(c.offload), -CHECKPOINTING_ORDER.index(c.checkpointing),
            SHARDING_ORDER.index(c.strategy))
