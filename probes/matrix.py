"""The small-shape matrix on which CI holds the planner to the trace (tests/test_trace_accuracy.py).

3 architectures (Llama-style: RMSNorm, SwiGLU, GQA, RoPE, untied; GPT-2-style: LayerNorm,
GELU, learned positions, biases, tied; Falcon-style: parallel block, multi-query, tied)
x 4 strategies x 2 world sizes x checkpointing none/full x 2 precisions = 96 traces, run in
this process (a few seconds each would be minutes in subprocesses).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from planner.spec import (
    Candidate,
    Checkpointing,
    Cluster,
    MlpKind,
    ModelSpec,
    NormKind,
    PositionKind,
    Precision,
    Strategy,
    TrainingSpec,
)

# Shapes small enough to trace in about a third of a second, with the proportions of real
# models (activations well above one block's parameters, a vocabulary larger than hidden).
ARCHS = {
    "llama": ModelSpec(name="llama", n_layers=3, hidden=256, n_heads=8, n_kv_heads=4,
                       ffn_hidden=512, vocab=2048),
    "gpt2": ModelSpec(name="gpt2", n_layers=3, hidden=256, n_heads=8, n_kv_heads=8,
                      ffn_hidden=1024, vocab=2048, mlp=MlpKind.GELU, norm=NormKind.LAYERNORM,
                      position=PositionKind.LEARNED, max_positions=256, bias=True,
                      tied_embeddings=True),
    "falcon": ModelSpec(name="falcon", n_layers=3, hidden=256, n_heads=8, n_kv_heads=1,
                        ffn_hidden=1024, vocab=2048, mlp=MlpKind.GELU,
                        norm=NormKind.LAYERNORM, parallel_block=True, norms_per_layer=1,
                        tied_embeddings=True),
}
STRATEGIES = ("ddp", "shard_grad_op", "full_shard", "hybrid_shard")
WORLD_SIZES = (2, 4)
GPUS_PER_NODE = 2  # so hybrid_shard at 4 ranks is a real 2 x 2 mesh
CHECKPOINTING = ("none", "full")
PRECISIONS = ("bf16-amp", "bf16")
SEQ, MICRO_BATCH = 256, 2


@dataclass(frozen=True, slots=True)
class Case:
    arch: str
    strategy: str
    world_size: int
    checkpointing: str
    precision: str

    def label(self) -> str:
        return (f"{self.arch}/{self.strategy}/n{self.world_size}/ckpt-{self.checkpointing}/"
                f"{self.precision}")


CASES = [Case(*c) for c in itertools.product(ARCHS, STRATEGIES, WORLD_SIZES, CHECKPOINTING,
                                              PRECISIONS)]


def run_case(case: Case):
    """Trace the case in this process and compare it with the planner (probes.compare)."""
    from planner.hardware import load_gpu
    from probes.compare import compare
    from probes.trace import trace_step

    model = ARCHS[case.arch]
    training = TrainingSpec(seq=SEQ, micro_batch=MICRO_BATCH, precision=Precision(case.precision))
    cand = Candidate(strategy=Strategy(case.strategy),
                     checkpointing=Checkpointing(case.checkpointing))
    cluster = Cluster(gpu=load_gpu("h100-80"), n_gpus=case.world_size,
                      gpus_per_node=GPUS_PER_NODE, host_ram_bytes_per_node=2**40)
    result = trace_step(model, training, cand, case.world_size, GPUS_PER_NODE)
    return compare(model, training, cluster, cand, result)
