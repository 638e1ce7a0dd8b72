"""The analytic planner against traces of the real Hugging Face classes it models.

For each architecture the planner reads from a config.json (planner/hf_config.py), the real
config (tests/data/configs, from the Hub) is traced with its transformers class
(probes/hf.py) and the planner's estimate of ``hf_config.spec_from_hf_config(config)`` is
paired with it term by term (probes/compare.py). ``shrink`` keeps every key of the config
(activation, norms, biases, tying, RoPE, experts, sliding windows, softcapping) but makes it
small enough to trace in a fraction of a second: CI runs that (tests/test_hf_trace.py); the
benchmark runs the real sizes (benchmarks/hf_trace_accuracy.py -> docs/accuracy.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.spec import Attention, Candidate, Cluster, SacList, TrainingSpec

CONFIG_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "configs"
ARCHS = {
    "llama": "llama2-7b",
    "qwen2": "qwen2.5-7b",
    "mistral": "mistral-7b",
    "mixtral": "mixtral-8x7b",
    "gemma2": "gemma2-9b",
    "phi3": "phi3-mini",
    "gpt2": "gpt2",
    "bert": "bert-base",
    # issue 13: configs under tests/data/configs/archs
    "qwen3": "archs/qwen3-8b",
    "qwen2_moe": "archs/qwen1.5-moe-a2.7b",
    "qwen3_moe": "archs/qwen3-30b-a3b",
    "gemma3_text": "archs/gemma3-1b",
    "olmo": "archs/olmo-1b",
    "olmo2": "archs/olmo2-7b",
    "phi": "archs/phi-2",
    "phi4": "archs/phi-4",
    "deepseek_v2": "archs/deepseek-v2-lite",
}
"""Architecture -> the real config.json (tests/data/configs/<name>.json)."""
ATTENTION = {"gemma2": Attention.EAGER}
"""transformers 5.23 refuses sdpa for Gemma-2 (attention-logit softcapping): eager there."""
MAX_SEQ = {"gpt2": 1024, "bert": 512}
"""Learned position tables: the longest sequence the model takes."""


def load(arch: str) -> dict[str, Any]:
    """The real config of ``arch`` (its "_source" provenance key dropped)."""
    cfg = json.loads((CONFIG_DIR / f"{ARCHS[arch]}.json").read_text())
    cfg.pop("_source", None)
    cfg.pop("_published", None)
    return cfg


def shrink(config: dict[str, Any], *, layers: int = 3, hidden: int = 128, heads: int = 4,
           kv_heads: int = 2, ffn: int = 256, vocab: int = 512, experts: int = 4,
           positions: int = 512) -> dict[str, Any]:
    """The config at a small size, every other key kept (module doc)."""
    c = dict(config)
    mt = c["model_type"]
    if mt == "gpt2":
        c.update(n_layer=layers, n_embd=hidden, n_head=heads, n_inner=None, vocab_size=vocab,
                 n_positions=positions, n_ctx=positions)
        return c
    c.update(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
             intermediate_size=ffn, vocab_size=vocab)
    if "num_key_value_heads" in c:
        c["num_key_value_heads"] = kv_heads if c["num_key_value_heads"] != c.get(
            "num_attention_heads", 0) or mt != "llama" else heads
    if "head_dim" in c:
        c["head_dim"] = hidden // heads * 2 if mt == "gemma2" else hidden // heads
        c["query_pre_attn_scalar"] = c["head_dim"]
    if "num_local_experts" in c:
        c["num_local_experts"] = experts
    if "max_position_embeddings" in c:
        c["max_position_embeddings"] = max(positions, 64)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(c.get(key), int) and c[key] >= vocab:
            c[key] = 0
    if mt == "phi3":
        c["original_max_position_embeddings"] = c["max_position_embeddings"]
    if mt in ("qwen3", "qwen3_moe", "gemma3_text"):
        c["head_dim"] = hidden // heads
    if "num_experts" in c:
        c.update(num_experts=experts, num_experts_per_tok=min(c.get("num_experts_per_tok", 2),
                                                              experts))
    if "n_routed_experts" in c:
        c.update(n_routed_experts=experts, n_group=1, topk_group=1,
                 num_experts_per_tok=min(c.get("num_experts_per_tok", 2), experts))
    if "moe_intermediate_size" in c:
        c["moe_intermediate_size"] = ffn // 2
    if "shared_expert_intermediate_size" in c:
        c["shared_expert_intermediate_size"] = ffn
    if "kv_lora_rank" in c:  # multi-head latent attention
        c.update(kv_lora_rank=hidden // 4, qk_rope_head_dim=16, qk_nope_head_dim=32,
                 v_head_dim=32, num_key_value_heads=heads)
        if c.get("q_lora_rank"):
            c["q_lora_rank"] = hidden // 2
    return c


@dataclass(frozen=True, slots=True)
class Check:
    arch: str
    strategy: str
    checkpointing: str
    world_size: int

    def label(self) -> str:
        return f"{self.arch}/{self.strategy}/ckpt-{self.checkpointing}/n{self.world_size}"


SAC_LIST = {"mixtral": SacList.PRE_2026_03_23, "qwen3_moe": SacList.PRE_2026_03_23}
"""transformers 5.24's MixtralTopKRouter and Qwen3MoeTopKRouter divide the topk values in place
(``router_top_value /= router_top_value.sum(...)``). torchtitan's current save list keeps
``topk``'s outputs, and torch's selective checkpointing refuses a kept tensor mutated in place
(torch/utils/checkpoint.py: "Tensor cached during selective activation checkpoint has been
mutated", in backward): these classes cannot run under the current list (tests/test_sac_list.py
checks it), so their selective checks run the older one."""


def training_for(arch: str, seq: int, micro_batch: int = 1, **kw: Any) -> TrainingSpec:
    kw.setdefault("sac_list", SAC_LIST.get(arch, SacList.CURRENT))
    # torchtitan's force_recompute_mm_shapes_by_fqns names torchtitan's modules: on a Hugging
    # Face layer its default (moe.router.gate) matches nothing (probes.models
    # torchtitan_force_shapes), so the planner beside it forces nothing either
    kw.setdefault("sac_force_recompute", ())
    return TrainingSpec(seq=min(seq, MAX_SEQ.get(arch, seq)), micro_batch=micro_batch,
                        attention=ATTENTION.get(arch, Attention.SDPA), **kw)


def cross_check(arch: str, config: dict[str, Any], training: TrainingSpec,
                candidate: Candidate, cluster: Cluster, *, result: dict[str, Any] | None = None):
    """Trace ``config``'s class in this process (unless ``result`` is given) and compare it
    with the planner's estimate of the same config (probes.compare.Comparison)."""
    from planner.hf_config import spec_from_hf_config
    from probes.compare import compare

    spec = spec_from_hf_config(config, name=arch)
    if result is None:
        from probes.hf import hf_factory
        from probes.trace import trace_training_step

        result = trace_training_step(hf_factory(config), training, candidate, cluster.n_gpus,
                                     cluster.gpus_per_node)
    return compare(spec, training, cluster, candidate, result)
