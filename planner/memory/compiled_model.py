"""``--compile model``: what the whole model's compiled backward holds when it ends (issue 24).

Dynamo hands the whole forward (the loss included) to AOTAutograd as one graph. Its backward
is one autograd node (``CompiledFunction.backward``, torch/_functorch/_aot_autograd/
runtime_wrappers.py) whose outputs are every parameter's new gradient at once; only after it
returns does autograd run each parameter's AccumulateGrad
(torch/csrc/autograd/functions/accumulate_grad.h). Eager backward accumulates each gradient as
soon as its own node has run.

- First micro-batch: ``.grad`` is None and AccumulateGrad steals the new tensor, so the set
  that exists is the one ``.grad`` becomes: nothing beyond eager.
- Later micro-batches: ``.grad += new`` in place, parameter by parameter, after the graph
  has returned: the micro-batch's whole gradient set is alive beside the accumulated one.
  Under DDP, Dynamo's DDPOptimizer (torch/_dynamo/backends/distributed.py) splits the graph
  at DDP's bucket boundaries (bucket_cap_mb, 25 MiB by default), so a graph returns about one
  bucket of gradients; the last graph (the embeddings, first in forward) holds at most a
  bucket beside the table's gradient.
- The graph's last op is the embeddings' backward, decomposed
  (torch/_decomp/decompositions.py ``embedding_dense_backward``) into a scatter-add into a
  zero table in fp32 (the computation dtype of a bf16/fp16 gradient), cast to the gradient's
  dtype afterwards: the fp32 table is alive beside its cast. Inductor scatters into one
  buffer (torch/_inductor/lowering.py ``_unsafe_masked_index_put_accumulate``). A tied table
  also holds the head's part of its gradient until the two are added.

Traced on fake tensors (probes/compile_step.py ``compile_model``; tests/test_compiled_model.py).
"""

from __future__ import annotations

from typing import Any

from planner import vec
from planner.memory.states import FP32

DDP_BUCKET_BYTES = 25 * 2**20
"""DDP's ``bucket_cap_mb`` default (torch/nn/parallel/distributed.py), which DDPOptimizer
uses as its split size."""


def graph_gradients(new_grads: Any, table_grad: Any, n_gpus: Any) -> Any:
    """New gradients one compiled graph returns at once: every trainable parameter's on one
    GPU (no DDP wrapper); under DDP one bucket's beside the embedding table's."""
    return vec.where(n_gpus > 1, vec.minimum(new_grads, DDP_BUCKET_BYTES + table_grad),
                     new_grads)


def table_backward(vocab_x_hidden: int, grad_bytes: int, *, tied: bool, trains: bool) -> int:
    """Bytes the embeddings' compiled backward holds beyond the gradients: the fp32 table it
    scatters into, unless that table is the gradient itself (an untied fp32 gradient), and for
    a tied table the head's part of the gradient, held until the embedding's is added."""
    if not trains:
        return 0
    fp32_table = FP32 * vocab_x_hidden if (tied or grad_bytes < FP32) else 0
    return fp32_table + (grad_bytes * vocab_x_hidden if tied else 0)
