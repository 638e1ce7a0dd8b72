"""The whole training step under torchtitan's expert parallel, on fake tensors over a fake
process group: the reference transformer (probes/models.py) with each MoE MLP replaced by
torchtitan's all-to-all token dispatch and its routed experts placed as torchtitan places
them (docs/model.md "Expert parallel", docs/trace.md).

torchtitan (snapshot b5bcd76):

- ``torchtitan/distributed/parallel_dims.py``: the routed experts live on the sparse mesh
  ``(efsdp, ep)``, efsdp = n / ep, ep innermost; the rest on the dense ``dp`` mesh of n ranks.
- ``torchtitan/models/common/moe_sharding.py``: the expert stacks ``(E, ., .)`` are
  ``Shard(0)`` on ep: this rank holds its E / ep experts (here: the module is built with the
  local E / ep experts, the local tensor a ``Shard(0)`` DTensor would have).
- ``torchtitan/distributed/fsdp.py`` ``apply_fsdp``: each MoE block is ONE ``fully_shard``
  unit whose ``shard_placement_fn`` returns, for an expert weight, ``Shard(0)`` (``Shard(1)``
  where efsdp x ep > E) on the efsdp mesh (``ShardPlacementResult`` with that mesh's info),
  and ``Shard(0)`` on the dp mesh for every other parameter; then the root. Under EP it sets
  explicit prefetching: forward, each block the next; backward, each block the previous.
- ``torchtitan/models/common/token_dispatcher.py`` ``AllToAllTokenDispatcher``: sort the
  t x top_k routed rows by expert (``argsort``, ``x[idx]``), the count exchange, the rows'
  all-to-all (``all_to_all_single_autograd``), the expert-major gather
  (``routed[permuted_indices]``), the grouped GEMM; combine: ``new_empty`` + index
  assignment, the reverse all-to-all, the score multiply, ``scatter_add``.

Emulated as the referee for the dispatch alone (probes/expert_parallel.py) does: the split
sizes are given (the count exchange's ``.tolist()`` is data-dependent): this rank sends every
EP rank N / ep rows and receives R / ep from each, R = imbalance x N (this process is rank
0, the busiest); the permutation indices are an ``arange`` of R; the grouped GEMM is a
``bmm`` over the local experts, R / (E / ep) rows each (the reference MoE's ``bmm``: the
same saved inputs). The router, top-k and renormalisation are the reference MoE's, and so
is the combine's multiply in the compute dtype (the reference's ``moe.expert_out``;
torchtitan multiplies in fp32, a difference the planner's docs note, with or without EP).

Shared experts (``spec.shared_ffn``) are a dense MLP of that width on every token, run after
the routed experts' combine and added (``MoE.forward``, models/common/moe.py lines 440-452);
the first ``spec.n_dense_layers`` blocks get a dense MLP of ``dense_ffn_hidden`` and no
experts (DeepSeek-V3's dense blocks). Beside TP (``tp`` > 1) the shared experts and the
dense blocks' MLPs are TP-sharded as torchtitan shards them (probes/finetune_tp.py
``apply_tp_plan`` ``ep_moe``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from planner.spec import Checkpointing, MlpKind, ModelSpec, Strategy, TrainingSpec


class _Experts(nn.Module):
    """The local routed experts' stacked weights and their grouped GEMM (torchtitan's
    ``GroupedExperts``): a ``bmm`` over the local experts, R / local rows each (the
    reference MoE's bmm path; selective "regions" checkpoints the activation product as the
    reference does)."""

    def __init__(self, spec: ModelSpec, local: int, ckpt: Any) -> None:
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.kind, self.ckpt = spec.mlp, ckpt
        if spec.mlp.gated:
            self.w_gate = nn.Parameter(torch.empty(local, f, h))
        self.w_up = nn.Parameter(torch.empty(local, f, h))
        self.w_down = nn.Parameter(torch.empty(local, h, f))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        from probes.models import _act_geglu, _act_gelu, _act_swiglu

        local = self.w_up.shape[0]
        if rows.dtype is torch.bfloat16:
            # torchtitan's grouped GEMM, ``torch._grouped_mm`` over the expert-major rows
            # (offsets: R / local rows each); not in either op-level SAC save list, where
            # ``aten.bmm`` is in the current one
            offs = (torch.arange(1, local + 1, dtype=torch.int32)
                    * (rows.shape[0] // local)).to(torch.int32)

            def mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                return torch._grouped_mm(x, w.transpose(1, 2), offs=offs)
            xe = rows
        else:  # fp32: the reference MoE's bmm over equal groups (the same saved inputs)
            def mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
                return torch.bmm(x, w.transpose(1, 2))
            xe = rows.view(local, rows.shape[0] // local, rows.shape[1])
        u = mm(xe, self.w_up)
        sel = self.ckpt.mode is Checkpointing.SELECTIVE
        if self.kind is MlpKind.GELU:
            a = self.ckpt.run(_act_gelu, u) if sel else _act_gelu(u)
        else:
            g = mm(xe, self.w_gate)
            fn = _act_swiglu if self.kind is MlpKind.SWIGLU else _act_geglu
            a = self.ckpt.run(fn, g, u) if sel else fn(g, u)
        return mm(a, self.w_down).reshape(-1, rows.shape[1])


class EPMoE(nn.Module):
    """One MoE MLP under EP (module doc); ``group``: the EP process group, set by
    ``ep_parallelize`` (None: the local dispatcher, no all-to-all)."""

    def __init__(self, spec: ModelSpec, ep: int, imbalance: float, ckpt: Any) -> None:
        super().__init__()
        self.kind = spec.mlp
        self.n_experts, self.top_k, self.ep = spec.n_experts, spec.experts_per_token, ep
        self.imbalance = imbalance
        self.router = nn.Linear(spec.hidden, spec.n_experts, bias=False)
        self.experts = _Experts(spec, spec.n_experts // ep, ckpt)
        self.ckpt = ckpt
        self.group: Any = None
        # torchtitan's shared experts (``MoE.shared_experts``, a FeedForward of
        # moe_inter_dim x num_shared_experts: DeepSeek-V3, Llama-4), run on every token
        # after the routed experts' combine and added to their output (models/common/moe.py
        # ``MoE.forward``, lines 440-452 at b5bcd76)
        self.shared = _mlp(spec, spec.shared_ffn, ckpt) if spec.shared_ffn else None

    def _splits(self, n_rows: int) -> tuple[int, int]:
        """(rows routed, rows received); both must split over the EP ranks and the received
        ones over the local experts (the bmm's equal groups)."""
        r_rows = int(self.imbalance * n_rows) if self.ep > 1 else n_rows
        local = self.n_experts // self.ep
        if n_rows % self.ep or r_rows % self.ep or r_rows % local:
            raise ValueError(f"{n_rows} routed / {r_rows} received rows do not split over EP "
                             f"{self.ep} and {local} local experts")
        return n_rows, r_rows

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        b, t, h = m.shape
        n, k, ep = b * t, self.top_k, self.ep
        n_rows, r_rows = self._splits(n * k)
        xt = m.reshape(n, h)
        probs = torch.softmax(xt @ self.router.weight.T, dim=-1, dtype=torch.float32)
        w, idx = probs.topk(k, dim=-1)
        w = w / w.sum(dim=-1, keepdim=True)
        # dispatch: the routed rows sorted by expert
        order = torch.argsort(idx.reshape(-1), stable=True)
        w_sorted = w.reshape(-1)[order]
        tok = order // k
        del order
        rows = xt[tok]
        perm = None
        if ep > 1:
            rows = all_to_all_single_autograd(rows, [r_rows // ep] * ep, [n_rows // ep] * ep,
                                              self.group)
            perm = torch.arange(r_rows)
            rows = rows[perm]
        y = self.experts(rows)
        del rows
        if ep > 1:
            back = y.new_empty(y.shape)
            back[perm] = y
            del y, perm
            y = all_to_all_single_autograd(back, [n_rows // ep] * ep, [r_rows // ep] * ep,
                                           self.group)
            del back
        out = y * w_sorted.to(y.dtype).unsqueeze(-1)
        res = torch.zeros_like(xt).scatter_add(0, tok.unsqueeze(-1).expand(-1, h), out)
        res = res.view(b, t, h)
        if self.shared is not None:
            res = res + self.shared(m)
        return res


def _mlp(spec: ModelSpec, width: int, ckpt: Any) -> nn.Module:
    """A dense MLP of ``width`` (the reference's ``DenseMLP``: gate, up, down linears) whose
    checkpointing settings are ``ckpt``: a shared expert, or a dense first block's MLP."""
    import dataclasses

    from probes.models import DenseMLP

    mlp = DenseMLP(dataclasses.replace(spec, ffn_hidden=width))
    mlp.ckpt = ckpt
    return mlp


def install(net: nn.Module, spec: ModelSpec, training: TrainingSpec) -> None:
    """Replace every block's MoE MLP with ``EPMoE`` (before ``configure``); the first
    ``n_dense_layers`` blocks get a dense MLP of ``dense_ffn_hidden`` instead (DeepSeek's
    ``first_k_dense_replace``: torchtitan's DeepSeek-V3 builds a ``FeedForward`` there,
    ``moe`` None)."""
    if spec.shared_expert_gate:
        from probes.trace_types import UnsupportedConfig

        raise UnsupportedConfig("a shared expert gate (Qwen2-MoE) is not in torchtitan's MoE: "
                                "not traced under EP")
    for i, blk in enumerate(net.blocks):
        if i < spec.n_dense_layers:
            blk.mlp = _mlp(spec, spec.dense_ffn_hidden, blk.mlp.ckpt)
        else:
            blk.mlp = EPMoE(spec, training.ep, training.ep_imbalance, blk.mlp.ckpt)


def ep_parallelize(net: nn.Module, spec: ModelSpec, training: TrainingSpec,
                   strategy: Strategy, policies: tuple[Any, Any], tp: int = 1) -> Any:
    """(world_size, gpus_per_node) -> mesh shape: torchtitan's ``apply_fsdp`` under EP
    (module doc), the EP group handed to every ``EPMoE``; ``policies``: the blocks' and the
    root's ``MixedPrecisionPolicy`` (probes/trace.py ``fsdp_policies``).

    ``tp`` > 1: tensor + sequence parallel beside EP as torchtitan lays it out (b5bcd76,
    docs/model.md §8.8 "Beside tensor parallel"): the dense mesh ``(dp, tp)`` with tp
    innermost, the attention, norms, embedding and head under fitcheck's TP plan
    (probes/finetune_tp.py ``apply_tp_plan``), every MoE on this rank's sequence shard
    (``ep_moe``), FSDP2 of the dense parameters over dp = n / tp; the sparse mesh
    ``(efsdp, ep)`` over the same n ranks, efsdp = n / ep (``dp_shard * tp / ep``)."""
    from torch.distributed.tensor import Shard

    if tp > 1 and (spec.n_heads % tp or spec.n_kv_heads % tp or spec.vocab % tp
                   or spec.shared_ffn % tp or spec.dense_ffn_hidden % tp
                   or spec.tied_embeddings or spec.parallel_block or spec.kv_lora_rank
                   or spec.norm.value != "rmsnorm"):
        from probes.trace_types import UnsupportedConfig

        raise UnsupportedConfig(f"EP x TP {tp} is traced on the Llama-style reference blocks "
                                "(untied, RMSNorm, sequential, no MLA) with heads, kv heads, "
                                "vocab and the shared and dense MLPs' widths divisible by tp")

    def apply(world_size: int, gpus_per_node: int) -> tuple[int, ...]:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info

        ep = training.ep
        if world_size % ep:
            raise ValueError(f"EP {ep} does not divide {world_size} ranks")
        if world_size % tp:
            raise ValueError(f"TP {tp} does not divide {world_size} ranks")
        if tp > 1:
            from probes.finetune_tp import apply_tp_plan

            dense = init_device_mesh("cpu", (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
            apply_tp_plan(net, dense["tp"], ep_moe=True)
            dp = dense["dp"]
        else:
            dp = init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp",))
        sparse = init_device_mesh("cpu", (world_size // ep, ep),
                                  mesh_dim_names=("efsdp", "ep"))
        edp_info, dp_info = _get_mesh_info(sparse["efsdp"]), _get_mesh_info(dp)
        # Shard(1) where efsdp x ep > E (torchtitan: no padding)
        place = Shard(1) if world_size > spec.n_experts else Shard(0)
        reshard = strategy is Strategy.FULL_SHARD
        mp, root_mp = policies
        blocks = list(net.blocks)
        for blk in blocks:
            shard_ep_block(blk, dp, sparse, place, (edp_info, dp_info), reshard, mp)
        fully_shard(net, mesh=dp, reshard_after_forward=reshard, mp_policy=root_mp)
        # explicit prefetching under EP (the end of apply_fsdp): forward, each block the
        # next; backward, each block the previous (the root here holds the embeddings, norm
        # and head: one unit, unsharded through forward)
        for cur, nxt in zip(blocks, blocks[1:]):
            cur.set_modules_to_forward_prefetch([nxt])
        rev = blocks[::-1]
        for cur, prev in zip(rev, rev[1:]):
            cur.set_modules_to_backward_prefetch([prev])
        return (world_size // ep, ep) if tp == 1 else (world_size // tp, tp)

    return apply


class _GroupSet:
    """Several FSDP param groups of one state seen as one (``per_param_mesh_view``): their
    parameters together; ``pre_backward`` / ``post_backward`` set on it are set on each
    group, each wrapper then calling that group's own method."""

    _HOOKS = ("pre_backward", "post_backward")

    def __init__(self, groups: list) -> None:
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "fsdp_params", [p for g in groups for p in g.fsdp_params])
        object.__setattr__(self, "active", {})
        object.__setattr__(self, "readers", {})

    def __getattr__(self, name: str) -> Any:
        if name not in self._HOOKS:
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.active[name](*args, **kwargs)

        self.readers[id(call)] = call  # kept alive: ids stay unique
        return call

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._HOOKS:
            raise AttributeError(name)
        for g in self.groups:
            g.__dict__.pop(name, None)  # the class's method again
            if id(value) in self.readers:
                # the tracker putting back what it read (an identity test: ``functools.
                # wraps`` copies a reader's attributes onto the tracker's wrapper)
                continue

            def hooked(*args: Any, _g: Any = g, **kwargs: Any) -> Any:
                self.active[name] = getattr(type(_g), name).__get__(_g)
                return value(*args, **kwargs)

            setattr(g, name, hooked)


class per_param_mesh_view:
    """While active, ``FSDPState._fsdp_param_group`` of a state with several param groups
    (a per-param mesh: ``shard_placement_fn`` returning ``ShardPlacementResult``, as
    torchtitan's EP block) is a ``_GroupSet`` instead of an error: torch's
    ``FSDPMemTracker`` (torch 2.13, ``fsdp2_mem_tracker.py``) reads that one group to file
    the parameters, gradients and buffers and to wrap the backward hooks."""

    def __enter__(self) -> per_param_mesh_view:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        self._orig = FSDPState.__dict__["_fsdp_param_group"]
        orig = self._orig

        def one(state: Any) -> Any:
            groups = state._fsdp_param_groups
            if len(groups) <= 1:
                return orig.__get__(state)
            view = state.__dict__.get("_fitcheck_group_set")
            if view is None or view.groups != groups:
                view = _GroupSet(list(groups))
                state.__dict__["_fitcheck_group_set"] = view
            return view

        FSDPState._fsdp_param_group = property(one)
        return self

    def __exit__(self, *exc: object) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

        FSDPState._fsdp_param_group = self._orig


def shard_stage(stage: nn.Module, spec: ModelSpec, dp_mesh: Any, sparse: Any, mp: Any,
                reshard: bool) -> None:
    """FSDP2 of one pipeline stage under EP as torchtitan's ``apply_fsdp_to_decoder``
    (b5bcd76 ``fsdp.py`` lines 234-265, 384-420): the embedding its own unit, the final
    norm and the head one unit (``reshard_after_forward`` only under the "always" policy:
    False here, as under PP by default), each block (``shard_stage_blocks``); the root
    (``stage``, sharded by the caller) holds nothing else. Prefetching: forward, the
    embedding the first block and the last block the norm + head; backward, the head the
    last block and the first block the embedding."""
    from torch.distributed.fsdp import fully_shard

    blocks = list(stage.blocks)
    embed = stage.embed
    head = [stage.final_norm, stage.lm_head] if stage.lm_head is not None else None
    if embed is not None:
        fully_shard(embed, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
    if head is not None:
        fully_shard(head, mesh=dp_mesh, reshard_after_forward=False, mp_policy=mp)
    shard_stage_blocks(blocks, spec, dp_mesh, sparse, mp, reshard)
    if blocks and embed is not None:
        embed.set_modules_to_forward_prefetch([blocks[0]])
        blocks[0].set_modules_to_backward_prefetch([embed])
    if blocks and head is not None:
        blocks[-1].set_modules_to_forward_prefetch([stage.final_norm])
        stage.lm_head.set_modules_to_backward_prefetch([blocks[-1]])


def shard_ep_block(blk: Any, dp_mesh: Any, sparse: Any, place: Any, infos: tuple[Any, Any],
                   reshard: bool, mp: Any) -> None:
    """One block's ``fully_shard`` unit as torchtitan's ``apply_fsdp`` makes it under EP
    (b5bcd76 ``fsdp.py`` lines 318-360): its ``shard_placement_fn`` puts the routed experts
    on the ``efsdp`` mesh with ``place`` (``infos``: that mesh's and the dense mesh's FSDP
    mesh info) and every other parameter ``Shard(0)`` on the dense mesh; the ``EPMoE`` gets
    the ``ep`` group. A dense first block (no ``EPMoE``): every parameter on the dense mesh."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_common import ShardPlacementResult
    from torch.distributed.tensor import Shard

    edp_info, dp_info = infos
    experts: set = set()
    if isinstance(blk.mlp, EPMoE):
        blk.mlp.group = sparse["ep"].get_group()
        experts = set(blk.mlp.experts.parameters())

    def placement(p: nn.Parameter) -> Any:
        if p in experts:
            return ShardPlacementResult(placement=place, mesh_info=edp_info)
        return ShardPlacementResult(placement=Shard(0), mesh_info=dp_info)

    fully_shard(blk, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp,
                shard_placement_fn=placement)


def shard_stage_blocks(blocks: list, spec: ModelSpec, dp_mesh: Any, sparse: Any, mp: Any,
                       reshard: bool) -> None:
    """FSDP2 of one pipeline stage's MoE blocks under EP, as torchtitan shards each stage's
    model part (b5bcd76: ``pipeline_parallel.py`` ``pipeline_llm`` lines 109-120 call the
    model's parallelize function on each part; ``fsdp.py`` ``apply_fsdp_to_decoder`` lines
    318-360): one ``fully_shard`` unit per block whose ``shard_placement_fn`` puts the routed
    experts on the stage's ``efsdp`` mesh (``Shard(1)`` where efsdp x ep > E, lines 282-291)
    and every other parameter on the stage's dense mesh; the EP group (the stage's ``ep``
    mesh) handed to every ``EPMoE``; then the explicit prefetching of lines 384-420 between
    the stage's blocks (forward: the next; backward: the previous). ``sparse``: the stage's
    ``(efsdp, ep)`` mesh, ``dp_mesh``: its dense one."""
    from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info
    from torch.distributed.tensor import Shard

    edp_info, dp_info = _get_mesh_info(sparse["efsdp"]), _get_mesh_info(dp_mesh)
    place = Shard(1) if sparse.size() > spec.n_experts else Shard(0)
    for blk in blocks:
        shard_ep_block(blk, dp_mesh, sparse, place, (edp_info, dp_info), reshard, mp)
    for cur, nxt in zip(blocks, blocks[1:]):
        cur.set_modules_to_forward_prefetch([nxt])
    rev = blocks[::-1]
    for cur, prev in zip(rev, rev[1:]):
        cur.set_modules_to_backward_prefetch([prev])
