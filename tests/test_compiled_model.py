"""``--compile model`` with gradient accumulation (issue 24 item 3): the compiled backward
returns every new gradient at once, so after the first micro-batch the micro-batch's whole
gradient set is alive beside ``.grad`` before AccumulateGrad adds it
(planner/memory/compiled_model.py). Planner terms against hand-derived numbers; the trace
(probes/compile_step.py ``compile_model``) against the same numbers and the planner.
"""

from __future__ import annotations

import pytest

from planner.memory import Overheads, estimate
from planner.memory.compiled_model import DDP_BUCKET_BYTES
from planner.spec import (
    Candidate,
    Cluster,
    CompileMode,
    ModelSpec,
    Precision,
    Strategy,
    TrainingSpec,
)
from tests.conftest import TEST_H100

H100 = TEST_H100

# Llama-2-7B (HF config): 32 layers, 4096 hidden, 32 heads, ffn 11008, vocab 32000, untied.
# Parameters: per block 4 x 4096^2 (q, k, v, o) + 3 x 4096 x 11008 (gate, up, down)
# + 2 x 4096 (norms) = 67,108,864 + 135,266,304 + 8,192 = 202,383,360; x 32 = 6,476,267,520;
# + embeddings and head 2 x 32000 x 4096 = 262,144,000 + final norm 4096 = 6,738,415,616.
LLAMA2_7B = ModelSpec(name="llama2-7b", n_layers=32, hidden=4096, n_heads=32, n_kv_heads=32,
                      ffn_hidden=11008, vocab=32000)
P7 = 6_738_415_616
VH = 32000 * 4096  # 131,072,000 elements in the embedding table
CUBLAS = Overheads().cublas_workspace_bytes


def _cluster(n: int) -> Cluster:
    return Cluster(gpu=H100, n_gpus=n, gpus_per_node=8, host_ram_bytes_per_node=2 * 2**40)


def _end(model: ModelSpec, n: int = 1, **kw):
    tr = TrainingSpec(seq=1024, micro_batch=1, **kw)
    return estimate(model, tr, _cluster(n), Candidate(strategy=Strategy.DDP)).phases["bwd_end"]


def test_accumulating_compiled_model_holds_two_gradient_sets_at_the_end_of_backward():
    # pure bf16, one GPU, 2 micro-batches: .grad (2 B x P) plus the new set returned by the
    # compiled backward (2 B x P) = 4 B x 6,738,415,616 = 26,953,662,464
    eager = _end(LLAMA2_7B, precision=Precision.BF16, grad_accum=2)
    comp = _end(LLAMA2_7B, precision=Precision.BF16, grad_accum=2, compile=CompileMode.MODEL)
    assert eager.gradients == 2 * P7
    assert comp.gradients == 4 * P7 == 26_953_662_464
    # the embeddings' backward scatters into an fp32 table (4 B x 131,072,000 = 524,288,000)
    # beside its bf16 cast; the eager one holds the incoming t x h gradient only (2 B x 1024
    # x 4096 = 8,388,608), which the compiled one holds too
    assert comp.transients - eager.transients == 4 * VH == 524_288_000


def test_first_micro_batch_adds_nothing_but_the_fp32_table():
    # grad_accum 1: AccumulateGrad steals each returned gradient into the empty .grad
    eager = _end(LLAMA2_7B, precision=Precision.BF16)
    comp = _end(LLAMA2_7B, precision=Precision.BF16, compile=CompileMode.MODEL)
    assert comp.gradients == eager.gradients == 2 * P7
    assert comp.total - eager.total == 4 * VH


def test_fp32_gradients_scatter_into_the_gradient_itself():
    # bf16-amp under DDP: fp32 parameters and gradients; the fp32 table is the gradient
    # (4 B x P for .grad and again for the new set = 8 B x P)
    comp = _end(LLAMA2_7B, grad_accum=4, compile=CompileMode.MODEL)
    eager = _end(LLAMA2_7B, grad_accum=4)
    assert comp.gradients == 8 * P7
    assert comp.transients == eager.transients


def test_tied_table_holds_the_heads_part_until_the_embeddings_is_added():
    # tied, bf16: the head's part (2 B x V h) and the fp32 table (4 B x V h) beside the
    # gradients; eager holds the new table gradient and the sum (2 x 2 B x V h)
    tied = ModelSpec(name="tied", n_layers=2, hidden=1024, n_heads=8, n_kv_heads=8,
                     ffn_hidden=4096, vocab=50000, tied_embeddings=True)
    vh = 50000 * 1024
    eager = _end(tied, precision=Precision.BF16)
    comp = _end(tied, precision=Precision.BF16, compile=CompileMode.MODEL)
    assert comp.transients - eager.transients == (2 + 4) * vh - 2 * 2 * vh


def test_ddp_splits_the_graph_at_its_buckets():
    # 8 GPUs: DDPOptimizer's graphs return about one bucket (25 MiB) each; the last one also
    # the table's gradient: 26,214,400 + 2 x 131,072,000 = 288,358,400 beyond .grad
    comp = _end(LLAMA2_7B, n=8, precision=Precision.BF16, grad_accum=2,
                compile=CompileMode.MODEL)
    assert DDP_BUCKET_BYTES == 26_214_400
    assert comp.gradients == 2 * P7 + 26_214_400 + 2 * VH


def test_fsdp_keeps_eager_accounting_and_says_so():
    tr = TrainingSpec(seq=1024, micro_batch=1, grad_accum=2, compile=CompileMode.MODEL)
    e = estimate(LLAMA2_7B, tr, _cluster(8), Candidate(strategy=Strategy.FULL_SHARD))
    assert any("compile model under FSDP / ZeRO" in n and "NOT MODELLED" in n for n in e.notes)


# --------------------------------------------------------------------------- the trace

LLAMA = ModelSpec(name="llama", n_layers=3, hidden=256, n_heads=8, n_kv_heads=4,
                  ffn_hidden=512, vocab=2048)
# parameters: per block q 256x256 + k, v 2 x 256x128 + o 256x256 + 3 x 256x512 + 2 x 256
# = 65,536 + 65,536 + 65,536 + 393,216 + 512 = 590,336; x 3 = 1,771,008; + embeddings and
# head 2 x 2048 x 256 = 1,048,576 + final norm 256 = 2,819,840
P = 2_819_840
TABLE_FP32 = 4 * 2048 * 256  # 2,097,152


def _trace(precision: Precision, grad_accum: int, compile: CompileMode, model=LLAMA):
    pytest.importorskip("torch")
    from probes.trace import trace_step

    # seq 16, one sequence: activations are small, so the end of backward is the step's
    # backward peak and the gradient terms are what it holds
    tr = TrainingSpec(seq=16, micro_batch=1, precision=precision, grad_accum=grad_accum,
                      compile=compile)
    return tr, trace_step(model, tr, Candidate(strategy=Strategy.DDP), 1, 8)


@pytest.mark.trace
@pytest.mark.parametrize("grad_accum", [1, 2])
def test_trace_the_compiled_backward_returns_every_gradient_at_once(grad_accum):
    _, r = _trace(Precision.BF16, grad_accum, CompileMode.MODEL)
    assert r["compile"] == "model"
    # no block hook fires inside the compiled graph: the whole backward is one moment
    snap = r["moments"]["loss_bwd"]["at_peak"]
    # .grad: 2 B x P once accumulated (the second micro-batch), else nothing yet
    assert snap["grads"] == (2 * P if grad_accum == 2 else 0)
    # the new set (2 B x P = 5,639,680) and the fp32 table (2,097,152) = 7,736,832
    assert snap["temp"] == 2 * P + TABLE_FP32 == 7_736_832
    assert snap["activations"] <= 8  # every saved tensor freed by then


@pytest.mark.trace
def test_trace_eager_accumulates_each_gradient_as_it_arrives():
    _, r = _trace(Precision.BF16, 2, CompileMode.NONE)
    # no backward moment holds a second gradient set: at most the table's new gradient
    # (2 B x 2048 x 256 = 1,048,576) plus the loss's temporaries
    for m in ("loss_bwd", "block_bwd", "bwd_end"):
        assert r["moments"][m]["at_peak"]["temp"] < P, m


@pytest.mark.trace
@pytest.mark.parametrize("arch,precision", [("llama", "bf16"), ("llama", "fp32"),
                                            ("gpt2", "bf16"), ("falcon", "bf16")])
def test_trace_planner_matches_the_compiled_accumulation(arch, precision):
    from planner.hardware import load_gpu
    from probes.compare import compare
    from probes.matrix import ARCHS

    model = ARCHS[arch]
    tr, r = _trace(Precision(precision), 2, CompileMode.MODEL, model)
    cl = Cluster(gpu=load_gpu("h100-80"), n_gpus=1, gpus_per_node=8,
                 host_ram_bytes_per_node=2**40)
    c = compare(model, tr, cl, Candidate(strategy=Strategy.DDP), r)
    assert c.traced_peak_phase == "backward" and c.predicted_peak_phase == "bwd_end"
    assert abs(c.peak.rel_error) <= 0.02, c.peak
