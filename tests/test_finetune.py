"""Fine-tuning (LoRA, QLoRA, frozen layers) and tensor parallel: every expected number is
derived by hand below from the source named beside it (peft, bitsandbytes, torchtitan,
PyTorch's autograd codegen), or is a count peft itself prints."""

from __future__ import annotations

import pytest

from conftest import cluster, one_line_error, run
from planner.activations import plan_activations
from planner.candidates import degree_of, tp_problem
from planner.memory import Phase, estimate
from planner.memory.estimator import activation_plan
from planner.params import total_params, trainable
from planner.presets import get_preset
from planner.spec import (
    Attention,
    Candidate,
    Checkpointing,
    FineTune,
    Precision,
    Quantize,
    Strategy,
    TrainingSpec,
)

L2 = get_preset("llama2-7b")
DDP = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.NONE)
FS = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.NONE)


def test_lora_trainable_counts_match_what_peft_prints():
    # peft print_trainable_parameters() for Llama-2-7b: r=8 on q_proj,v_proj ->
    # "trainable params: 4,194,304"; r=16 on every linear -> 39,976,960; r=64 all-linear
    # (QLoRA paper setting) -> 159,907,840.
    assert trainable(L2, FineTune(lora_rank=8)).train == 4_194_304
    all_linear = ("q", "k", "v", "o", "gate", "up", "down")
    assert trainable(L2, FineTune(lora_rank=16, lora_targets=all_linear)).train == 39_976_960
    assert trainable(L2, FineTune(lora_rank=64, lora_targets=all_linear)).train == 159_907_840


def test_lora_states_on_one_gpu():
    # bf16 base (6,738,415,616 elems x 2 B), fp32 adapters (peft autocast_adapter_dtype):
    # 4,194,304 x 4 B of params, the same of gradients, AdamW exp_avg + exp_avg_sq in fp32.
    e = estimate(L2, TrainingSpec(finetune=FineTune(lora_rank=8)), cluster(1), DDP)
    step = e.phases[Phase.OPTIMIZER]
    assert total_params(L2) == 6_738_415_616
    assert step.params == 6_738_415_616 * 2 + 4_194_304 * 4
    assert step.gradients == 4_194_304 * 4
    assert step.optimizer_states == 2 * 4_194_304 * 4


def test_qlora_nf4_double_quant_params():
    # bitsandbytes quantize_4bit, blocksize 64: 0.5 B per element; double quant: 1 B absmax
    # per 64 elements plus an fp32 absmax per 256 of those. Llama-2-7b block linears:
    # 4 x 4096^2 + 3 x 4096 x 11008 = 202,375,168 elements x 32 blocks = 6,476,005,376.
    q = 6_476_005_376
    packed = q // 2                             # 3,238,002,688
    consts = q // 64 + 4 * (q // 64 // 256)     # 101,187,584 + 1,581,056
    rest = (32000 * 4096 * 2 + 65 * 4096) * 2   # embed + head + 65 norms, bf16
    adapters = 39_976_960 * 4                   # r=16 all-linear, fp32
    ft = FineTune(lora_rank=16, lora_targets=("q", "k", "v", "o", "gate", "up", "down"),
                  quantize_base=Quantize.NF4)
    e = estimate(L2, TrainingSpec(finetune=ft), cluster(1), DDP)
    assert e.phases[Phase.OPTIMIZER].params == packed + consts + rest + adapters
    assert packed + consts + rest + adapters == 4_025_499_648


def test_lora_block_saved_set_module_regime():
    # FSDP2 bf16 (module regime), r=8 on q,v, no dropout. With a frozen weight, autograd's
    # generated code saves a matmul's input only if the weight needs a gradient, and the
    # frozen RMSNorm weight's multiply does not save the normalized input. Kept per block:
    # norm1 fp32 input + rstd, the q/v adapters' shared input (2th), SDPA q,k,v,out + lse,
    # norm2 fp32 input + rstd, gate/act/up outputs for the SwiGLU multiply, and each adapter's
    # A output (t x r) saved by B.
    t, h, f = 2048, 4096, 11008
    expected = (4 * t * h + 4 * t) + 2 * t * h + 4 * 2 * t * h + 4 * 32 * t \
        + (4 * t * h + 4 * t) + 3 * 2 * t * f + 2 * 2 * t * 8
    plan = plan_activations(L2, batch=1, seq=t, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=False, finetune=FineTune(lora_rank=8))
    assert plan.block_kept == expected
    full = plan_activations(L2, batch=1, seq=t, precision=Precision.BF16_AMP,
                            attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                            uses_autocast=False)
    # full training also saves both norms' outputs, the MLP input and down's input
    assert full.block_kept - expected == 2 * (2 * t * h) + 2 * t * h + 2 * t * f - 2 * 2 * t * 8


def test_lora_frees_no_base_gradients_under_fsdp():
    e = estimate(L2, TrainingSpec(finetune=FineTune(lora_rank=8)), cluster(8), FS)
    full = estimate(L2, TrainingSpec(), cluster(8), FS)
    # sharded fp32 adapter grads: 32 blocks x ceil(131,072 / 8) x 4 B
    assert e.phases[Phase.OPTIMIZER].gradients == 32 * (131_072 // 8) * 4
    assert e.peak_allocated_bytes < full.peak_allocated_bytes


def test_frozen_first_layers_with_frozen_embeddings_keep_nothing():
    # no gradient reaches the first N blocks when the embeddings are frozen too: autograd
    # records no graph for them, so they save nothing
    ft = FineTune(freeze_embeddings=True, freeze_layers=8)
    plan = activation_plan(L2, TrainingSpec(finetune=ft), FS)
    full = activation_plan(L2, TrainingSpec(), FS)
    # ... and the first block a gradient reaches has an input that needs none, so its input
    # RMSNorm keeps neither its fp32 input (4·t·h) nor rstd (4·t) (traced)
    assert plan.blocks_kept == full.block_kept * (32 - 8) - (4 * 2048 * 4096 + 4 * 2048)
    T = trainable(L2, ft)
    assert T.train == total_params(L2) - 8 * T.train_per_block - 32000 * 4096


def test_tp_degree_and_activations():
    # torchtitan 2-D mesh: FSDP over n / tp; full checkpointing keeps the block input,
    # sequence-sharded: r x t x h / tp (bf16 module regime, r = 2)
    assert degree_of(Strategy.FULL_SHARD, 8, 8, 4) == 2
    assert degree_of(Strategy.HYBRID_SHARD, 64, 8, 8) == 1
    c = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL, tp=4)
    plan = activation_plan(L2, TrainingSpec(), c)
    assert plan.block_kept == 2 * 2048 * 4096 // 4
    e = estimate(L2, TrainingSpec(), cluster(8), c)
    e1 = estimate(L2, TrainingSpec(), cluster(8), Candidate(strategy=Strategy.FULL_SHARD,
                                                            checkpointing=Checkpointing.FULL))
    # parameters: sharded 8 ways either way (tp x dp = 8), fp32 under bf16-amp:
    # ceil(6,738,415,616 / 8) x 4 B
    assert e.phases[Phase.OPTIMIZER].params == e1.phases[Phase.OPTIMIZER].params \
        == 842_301_952 * 4
    assert e.shard_degree == 2


def test_tp_constraints():
    assert tp_problem(L2, 3, 24, 8) == "heads (32) not divisible by TP 3"
    assert tp_problem(L2, 16, 16, 8) == "TP 16 spans more than a node (8 GPUs)"
    assert tp_problem(L2, 4, 6, 8) == "6 GPUs is not a multiple of TP 4"
    assert tp_problem(get_preset("llama3-8b"), 16, 16, 16) == "kv heads (8) not divisible by TP 16"


def test_cli_errors_name_the_field():
    one_line_error(run("--model", "llama2-7b", "--gpu", "a100-80", "--quantize-base", "nf4"),
                   2, "--lora-rank")
    one_line_error(run("--model", "gpt2", "--gpu", "a100-80", "--lora-rank", "8",
                       "--lora-targets", "gate"), 2, "--lora-targets", "gate")
    one_line_error(run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--tp", "3"),
                   2, "--tp", "TP 3")
    one_line_error(run("--model", "llama3-8b", "--gpu", "h100-80", "--freeze", "lots"),
                   2, "--freeze", "lots")


def test_gate_spec_carries_finetune_and_tp(tmp_path):
    import json
    spec = {"model": {"preset": "llama3-70b"}, "hardware": {"gpu": "h100-80", "n": 8},
            "finetune": {"lora_rank": 16, "lora_targets": "all-linear"},
            "strategy": "full_shard", "offload": "none", "parallel": {"tp": 1}}
    p = tmp_path / "s.json"
    p.write_text(json.dumps(spec))
    r = run("gate", str(p))
    verdict = json.loads(r.stdout)
    # 70B full fine-tuning needs 16 B/param / 8 GPUs = 140 GB; its LoRA fits
    assert r.exit_code == 0, verdict
    full = dict(spec, finetune=None)
    p.write_text(json.dumps(full))
    assert run("gate", str(p)).exit_code == 3


def test_tp_auto_tried_only_when_nothing_fits():
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--json")
    import json
    d = json.loads(r.stdout)
    assert {c["tp"] for c in d["candidates"]} == {1}


@pytest.mark.parametrize("targets", [("q", "v"), ("q", "k", "v", "o", "gate", "up", "down")])
def test_lora_step_is_cheaper_than_full(targets):
    from planner.throughput import estimate_step
    lora = estimate_step(L2, TrainingSpec(finetune=FineTune(lora_rank=8, lora_targets=targets)),
                         cluster(1), DDP)
    full = estimate_step(L2, TrainingSpec(), cluster(1), DDP)
    # backward without weight gradients: (2 + 2 + 2·adapters/N) / (2 + 4) of the matmul FLOPs
    assert lora.compute_s < full.compute_s * (4.2 / 6)


def test_tp_collectives_by_hand():
    # NO_SHARD on a 1 x 2 mesh: the data-parallel group is one GPU (no FSDP traffic), so all
    # communication is sequence parallel's: per layer 2 all-gathers + 2 reduce-scatters in
    # forward and the same in backward (Korthikanti et al. 2022, sec. 4.2.2) = 8 x 32 calls,
    # each moving (tp-1)/tp of 1 x 2048 x 4096 x 2 B = 16,777,216 B over NVLink
    # (h100-80: 450 GB/s x 0.75 efficiency) plus one 2 us hop.
    from planner.throughput import estimate_step
    c = Candidate(strategy=Strategy.NO_SHARD, checkpointing=Checkpointing.NONE, tp=2)
    st = estimate_step(L2, TrainingSpec(), cluster(2), c)
    per_call = 0.5 * 16_777_216 / (450e9 * 0.75) + 2e-6
    assert st.comm_s == pytest.approx(256 * per_call, rel=1e-9)
    assert st.exposed_comm_s == pytest.approx(256 * per_call, rel=1e-9)
    # each GPU does half of each micro-batch's FLOPs and is credited half its tokens
    one = estimate_step(L2, TrainingSpec(), cluster(1), DDP)
    assert st.compute_s == pytest.approx(one.compute_s / 2, rel=1e-9)


def test_fsdp1_no_shard_without_a_cast_keeps_no_copy():
    # FSDP1 NO_SHARD with params already in the compute dtype: FlatParamHandle.needs_unshard()
    # is False, so forward runs on the flat parameter itself and the gradient is all-reduced
    # in place (torch/distributed/fsdp/_flat_param.py): nothing gathered at any moment
    c = Candidate(strategy=Strategy.NO_SHARD, checkpointing=Checkpointing.NONE)
    e = estimate(L2, TrainingSpec(precision=Precision.BF16, fsdp_version=1), cluster(2), c)
    assert all(b.gathered_params == 0 for b in e.phases.values())
    amp = estimate(L2, TrainingSpec(fsdp_version=1), cluster(2), c)  # fp32 params cast to bf16
    assert amp.phases[Phase.FORWARD].gathered_params > 32 * 202_375_168 * 2


def test_tp_loss_parallel_keeps_one_more_fp32_logits_tensor():
    # loss_parallel's _log_softmax (x - max, then - logsumexp) and its backward
    # (grad_input + exp(x)) * grad_output hold one more fp32 t x V/tp tensor than the
    # fused aten kernels: 4 x 2048 x 32000 / 2 bytes more at both loss moments
    c2 = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL, tp=2)
    plan = activation_plan(L2, TrainingSpec(), c2)
    unit = 4 * 2048 * 32000
    # without TP: forward = bf16 logits + fp32 copy, backward = two fp32 logits-sized tensors
    assert plan.loss_forward_transient == (2 * 2048 * 32000 + unit + unit) // 2
    assert plan.loss_backward_transient == (2 * unit + unit) // 2


def test_frozen_layers_stay_resident():
    # frozen blocks keep their parameters (fp32 under bf16-amp DDP) with no gradient or state
    ft = FineTune(freeze_layers=8)
    e = estimate(L2, TrainingSpec(finetune=ft), cluster(1), DDP)
    T = trainable(L2, ft)
    step = e.phases[Phase.OPTIMIZER]
    assert step.params == total_params(L2) * 4
    assert step.gradients == T.train * 4 == (total_params(L2) - 8 * (202_375_168 + 2 * 4096)) * 4


@pytest.mark.parametrize("preset", ["llama2-7b", "deepseek-v2-lite", "qwen3-30b-a3b", "gpt2"])
@pytest.mark.parametrize("ft", [FineTune(lora_rank=8), FineTune(freeze_layers=2),
                                FineTune(freeze_embeddings=True, freeze_layers=1),
                                FineTune(train_last_layers=2)])
def test_every_parameter_is_either_trainable_or_frozen(preset, ft):
    # the base's parameters are all somewhere (DeepSeek's dense first layers included); LoRA's
    # adapters come on top of the frozen base
    m = get_preset(preset)
    T = trainable(m, ft)
    base = T.frozen(m.n_layers) + (0 if ft.lora else T.train)
    assert base == total_params(m)
