"""DeepSpeed ZeRO++ (issue 26 item 6): qwZ, hpZ and qgZ in memory and in the step time.
Expected numbers are derived by hand from DeepSpeed v0.19.6 (commit edaa7221:
runtime/zero/partition_parameters.py, stage3.py, partitioned_param_coordinator.py,
runtime/comm/coalesced_collectives.py, utils/groups.py) and the ZeRO++ paper (Wang et al.
2023, arXiv 2306.10209, sec. 3.4: 3M -> 0.75M cross-node); hpZ's secondary partition is also
measured by the CPU referee (tests/data/deepspeed_cpu.json case z3-hpz, tests/test_deepspeed.py).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from planner.fields import FLAGS, parse
from planner.memory.estimator import estimate
from planner.memory.zero import hpz_secondary_bytes, qwz_gather_bytes
from planner.presets import get_preset
from planner.spec import (
    Candidate,
    Checkpointing,
    DeepSpeedConfig,
    Offload,
    Strategy,
    TrainingSpec,
)
from planner.throughput import step_core, step_inputs
from tests.conftest import cluster, one_line_error, run

LLAMA3_8B = get_preset("llama3-8b")
# llama3-8b (untied): per block q, o 4096·4096 = 16,777,216; k, v 1024·4096 = 4,194,304;
# gate, up, down 14336·4096 = 58,720,256; two norms of 4096. Matrices per block:
# 2·16,777,216 + 2·4,194,304 + 3·58,720,256 = 218,103,808; x 32 = 6,979,321,856; embedding
# and head 128256·4096 = 525,336,576 each: 8,029,995,008 matrix elements.
MATS = 8_029_995_008
NORMS = 65 * 4096  # 2 per block + the final norm: 266,240
P = MATS + NORMS  # 8,030,261,248
EMBED = 128256 * 4096  # the largest tensor, 525,336,576


def zero3(ds: DeepSpeedConfig, n: int = 16, offload: Offload = Offload.NONE, **training):
    return estimate(LLAMA3_8B, TrainingSpec(deepspeed=ds, **training), cluster(n),
                    Candidate(strategy=Strategy.ZERO3, offload=offload,
                              checkpointing=Checkpointing.FULL))


# ---- hpZ: the secondary partition -------------------------------------------------------------

def test_hpz_secondary_partition_by_hand():
    # every parameter's aligned size // h in bf16; 16 GPUs divide every llama3-8b tensor, so
    # no padding: 8,030,261,248 / 8 = 1,003,782,656 elements x 2 B = 2,007,565,312 B
    ds = DeepSpeedConfig(zero_hpz_partition_size=8)
    assert hpz_secondary_bytes(LLAMA3_8B, ds, 16, 2) == 2_007_565_312
    # off: nothing
    assert hpz_secondary_bytes(LLAMA3_8B, DeepSpeedConfig(), 16, 2) == 0
    # 48 GPUs pad the 4096-element norms: ceil(4096 / 48) = 86, x 48 = 4128, // 8 = 516 each
    # (65 of them: 33,540) instead of 512 (33,280); the matrices: q/o 16,777,216 / 48 =
    # 349,525.3 -> 349,526 x 48 = 16,777,248 // 8 = 2,097,156; k/v 4,194,304 / 48 = 87,381.3
    # -> 87,382 x 48 = 4,194,336 // 8 = 524,292; gate/up/down 58,720,256 / 48 = 1,223,338.67
    # -> 1,223,339 x 48 = 58,720,272 // 8 = 7,340,034; embed/head 525,336,576 / 48 =
    # 10,944,512 exactly -> 525,336,576 // 8 = 65,667,072.
    # per block 2·2,097,156 + 2·524,292 + 3·7,340,034 = 27,262,998; x 32 = 872,415,936;
    # + 2·65,667,072 = 131,334,144; + 33,540 = 1,003,783,620 elements x 2 B
    assert hpz_secondary_bytes(LLAMA3_8B, ds, 48, 2) == 2 * 1_003_783_620


def test_hpz_group_is_at_most_the_world():
    # utils/groups.py: min(zero_hpz_partition_size, world): 8 on 4 GPUs is a group of 4, the
    # secondary the same size as the primary partition: 8,030,261,248 / 4 x 2 B
    ds = DeepSpeedConfig(zero_hpz_partition_size=8)
    assert hpz_secondary_bytes(LLAMA3_8B, ds, 4, 2) == P // 4 * 2


def test_hpz_adds_the_secondary_at_every_moment_or_to_the_host():
    plain = zero3(DeepSpeedConfig())
    hpz = zero3(DeepSpeedConfig(zero_hpz_partition_size=8))
    for phase, b in hpz.phases.items():
        assert b.params - plain.phases[phase].params == 2_007_565_312, phase
    # parameter offload: the secondary lives on offload_param's device (remote_device)
    off = zero3(DeepSpeedConfig(), offload=Offload.PARAMS_AND_OPTIMIZER)
    off_hpz = zero3(DeepSpeedConfig(zero_hpz_partition_size=8),
                    offload=Offload.PARAMS_AND_OPTIMIZER)
    assert off_hpz.phases["forward"].params == off.phases["forward"].params
    # 8 ranks per node (h100-80 profile) each holding one
    assert off_hpz.host_bytes_per_node - off.host_bytes_per_node == 8 * 2_007_565_312


# ---- qwZ: the quantized gather's buffers ------------------------------------------------------

def test_qwz_gather_buffers_by_hand():
    # in flight: the embedding and the 5e7 prefetch, int8 = 575,336,576 B, plus an fp32 scale
    # per 4096: ceil(575,336,576 / 4096) = 140,464 x 4 = 561,856 B; the fp16 dequantized copy
    # of the module waited on 2 x 525,336,576 = 1,050,673,152 B; bf16 parameters: the fp16
    # concatenation before .to(bf16), 1,050,673,152 B more
    in_flight = EMBED + 50_000_000
    assert qwz_gather_bytes(in_flight, EMBED, param_fp16=False) == \
        575_336_576 + 561_856 + 1_050_673_152 + 1_050_673_152
    # fp16 parameters: no conversion copy
    assert qwz_gather_bytes(in_flight, EMBED, param_fp16=True) == \
        575_336_576 + 561_856 + 1_050_673_152
    plain = zero3(DeepSpeedConfig())
    q = zero3(DeepSpeedConfig(zero_quantized_weights=True))
    assert q.phases["forward"].gathered_params - plain.phases["forward"].gathered_params == \
        2_677_244_736  # the sum above


# ---- qgZ: the reduction's temporaries ---------------------------------------------------------

def test_qgz_replaces_the_bucket_copies_across_nodes():
    # ZeRO-3 backward, default 5e8 bucket, overlap_comm: 3 reductions in flight, each a
    # flattened copy of the bucket (5e8 x 2 B); the 525,336,576-element embedding, larger than
    # the bucket, reduced from its own gradient beside them. qgZ on 2 nodes of 8 reduces the
    # matrices one at a time: the largest, the embedding, n (1 + 3/8) bytes: int4 sent and
    # received 2 x 262,668,288, the reduced 1/8 re-quantized and received 2 x 32,833,536, the
    # fp16 dequantized 1/8 131,334,144: 722,337,792 B, 3 in flight = 2,167,013,376 B instead
    # of 3,000,000,000 B: 832,986,624 B less
    plain = zero3(DeepSpeedConfig(), n=16)
    qgz = zero3(DeepSpeedConfig(zero_quantized_gradients=True), n=16)
    assert plain.phases["block_bwd"].comm_buffers - qgz.phases["block_bwd"].comm_buffers == \
        832_986_624
    # one node: DeepSpeed's plain reduce-scatter, the same buffers
    one = zero3(DeepSpeedConfig(zero_quantized_gradients=True), n=8)
    assert one.phases["block_bwd"].comm_buffers == \
        zero3(DeepSpeedConfig(), n=8).phases["block_bwd"].comm_buffers


# ---- the step time: cross-node volume -----------------------------------------------------

def _network_only(n: int, **ds) -> float:
    """Comm seconds of one llama3-8b ZeRO-3 step with free NVLink and no latency: what the
    network carries, over the NIC bandwidth."""
    t = TrainingSpec(deepspeed=DeepSpeedConfig(**ds))
    c = Candidate(strategy=Strategy.ZERO3, offload=Offload.NONE, checkpointing=Checkpointing.FULL)
    x = step_inputs(LLAMA3_8B, t, cluster(n), c)
    x = dataclasses.replace(x, bw_intra=1e30, lat_intra=0.0, lat_inter=0.0)
    return float(step_core(x).comm_s), float(x.bw_inter)


def test_cross_node_volume_by_hand_on_two_nodes():
    # 16 GPUs, 8 per node: a ring over 16 is network-bound at 8 NICs per node, each GPU's NIC
    # carrying 15/16 x bytes / 8. ZeRO-3: forward gather, backward gather (bf16, 2 B) and the
    # reduce-scatter (bf16 grads): 3 x 15/16 x 2P / 8
    base, bw = _network_only(16)
    assert base == pytest.approx(3 * 15 / 16 * 2 * P / 8 / bw, rel=1e-12)
    # qwZ: both gathers int8 + fp32 scale per 4096 (1 + 1/1024 B)
    q, _ = _network_only(16, zero_quantized_weights=True)
    assert q == pytest.approx((2 * 15 / 16 * (1 + 1 / 1024) * P + 15 / 16 * 2 * P) / 8 / bw,
                              rel=1e-12)
    # hpZ: the backward gather inside the node (free here): 2 of the 3
    h, _ = _network_only(16, zero_hpz_partition_size=8)
    assert h / base == pytest.approx(2 / 3, rel=1e-12)
    # qgZ: the matrices' int4 all-to-all across the k = 2 nodes, (k-1)/k = 1/2 of P_mats / 8
    # per GPU, int4 (0.5 B) and an fp32 scale per max(rows, cols) groups: per block
    # 4·4096 + 3·14336 = 59,392, x 32 = 1,900,544, + 2·128256 = 2,157,056 scales, 8,628,224 B;
    # MATS / 2 = 4,014,997,504 B; the 65 norms by a bf16 reduce-scatter 15/16 x 2 x 266,240 / 8
    g, _ = _network_only(16, zero_quantized_gradients=True)
    qgz_wire = 4_014_997_504 + 8_628_224
    assert g == pytest.approx((2 * 15 / 16 * 2 * P + 0.5 * qgz_wire
                               + 15 / 16 * 2 * NORMS) / 8 / bw, rel=1e-12)
    # all three: forward gather quantized, backward inside the node, qgZ
    allq, _ = _network_only(16, zero_quantized_weights=True, zero_hpz_partition_size=8,
                            zero_quantized_gradients=True)
    assert allq == pytest.approx((15 / 16 * (1 + 1 / 1024) * P + 0.5 * qgz_wire
                                  + 15 / 16 * 2 * NORMS) / 8 / bw, rel=1e-12)


def test_cross_node_volume_is_the_papers_quarter_at_scale():
    # ZeRO++ sec. 3.4: 3M -> 0.5M + 0 + 0.25M = 0.75M across nodes, a quarter; the source adds
    # the scales (1/1024 of the gather, 0.2 % of qgZ) and the ring factors, (n-1)/n and
    # (k-1)/k: at 1024 GPUs (128 nodes) (1023/1024 x 1.000977 + 127/128 x 0.501075 + ~0) / 6
    # / (1023/1024) = 0.2497
    base, _ = _network_only(1024)
    allq, _ = _network_only(1024, zero_quantized_weights=True, zero_hpz_partition_size=8,
                            zero_quantized_gradients=True)
    assert allq / base == pytest.approx(0.25, rel=0.005)


def test_qgz_needs_more_than_one_node():
    # stage3.py __avg_scatter_grads: the all-to-all only when world // local > 1
    base, _ = _network_only(8)
    g, _ = _network_only(8, zero_quantized_gradients=True)
    assert g == base


# ---- inputs: fields, messages, the DeepSpeed reader ------------------------------------------

def test_fields_parse():
    v = parse({"deepspeed.zero_hpz_partition_size": "0"}, FLAGS)
    assert v["deepspeed.zero_hpz_partition_size"] == 1  # DeepSpeed: 0 or 1 is off
    assert parse({"deepspeed.zero_hpz_partition_size": 8}, FLAGS)[
        "deepspeed.zero_hpz_partition_size"] == 8


@pytest.mark.parametrize("args, needles", [
    (("--n", "16", "--strategy", "zero2", "--ds-zero-quantized-weights"),
     ("--ds-zero-quantized-weights", "ZeRO-3 only", "zero2")),
    (("--n", "16", "--strategy", "zero1,full_shard", "--ds-zero-quantized-gradients"),
     ("--ds-zero-quantized-gradients", "ZeRO-3 only")),
    (("--n", "16", "--ds-hpz-partition-size", "3"),
     ("--ds-hpz-partition-size", "16 GPUs are not a multiple of 3")),
    (("--n", "24", "--ds-hpz-partition-size", "3"),
     ("--ds-hpz-partition-size", "does not divide the 8 GPUs per node")),
    (("--n", "16", "--ds-hpz-partition-size", "-1"),
     ("--ds-hpz-partition-size", "-1")),
])
def test_bad_values_are_one_message(args, needles):
    one_line_error(run("--model", "llama3-8b", "--gpu", "h100-80", *args), 2, *needles)


def test_hpz_over_whole_nodes_is_accepted():
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "32", "--strategy", "zero3",
            "--ds-hpz-partition-size", "16", "--json")
    assert r.exit_code == 0, r.stderr


def _read(tmp_path, zo: dict):
    from planner.jobs import read_job

    src = tmp_path / "ds.json"
    src.write_text(json.dumps({"zero_optimization": zo, "bf16": {"enabled": True},
                               "train_micro_batch_size_per_gpu": 1}))
    return read_job(str(src))


def test_reader_models_zeropp_at_stage_3(tmp_path):
    j = _read(tmp_path, {"stage": 3, "zero_quantized_weights": True,
                         "zero_hpz_partition_size": 8, "zero_quantized_gradients": True})
    assert j.unmodelled == []
    assert j.values["deepspeed.zero_quantized_weights"] is True
    assert j.values["deepspeed.zero_hpz_partition_size"] == 8
    assert j.values["deepspeed.zero_quantized_gradients"] is True


def test_reader_warns_that_deepspeed_ignores_zeropp_below_stage_3(tmp_path):
    j = _read(tmp_path, {"stage": 2, "zero_quantized_weights": True,
                         "zero_hpz_partition_size": 8, "zero_quantized_gradients": False})
    assert j.unmodelled == []
    assert "deepspeed.zero_quantized_weights" not in j.values
    assert "deepspeed.zero_hpz_partition_size" not in j.values
    said = [w for w in j.warnings if "ZeRO++" in w]
    assert len(said) == 2 and all("stage 2" in w for w in said), said


# ---- the fewest-GPUs search -----------------------------------------------------------------

@pytest.mark.parametrize("h", [4, 8, 16])
def test_fewest_gpus_searches_the_counts_hpz_divides(h):
    # llama3-70b ZeRO-3 with full checkpointing: hpZ's Psi/h secondary copy (35 GB at h = 4)
    # does not shrink with the GPUs, so a smaller group needs more of them. The oracle: every
    # count h divides (h, 2h, ... past a node: whole nodes), each planned on its own; the
    # search must land on its first fit, never on a count DeepSpeed refuses (24 for h = 16)
    from planner.plan import fits_any, min_gpus
    from planner.request import build_request

    v = {"model.preset": "llama3-70b", "hardware.gpu": "h100-80", "strategy": "zero3",
         "offload": "none", "checkpointing": "full", "deepspeed.zero_hpz_partition_size": h}
    r = build_request(v)
    first = next(n for n in range(h, 257, h) if (n % 8 == 0 or n < 8)
                 and fits_any(r.with_gpus(n)))
    assert min_gpus(r) == first
    # fewer GPUs than without hpZ are never enough: the secondary copy only adds
    plain = build_request({k: x for k, x in v.items() if "hpz" not in k})
    assert first >= min_gpus(plain)


def test_hpz_frozen_parameters_gather_inside_the_node_from_the_first_forward():
    # stage3.py invalidate_secondary_tensor drops only the trainable parameters' secondary
    # copies: with every block frozen but the last, the first forward gathers the frozen
    # share inside the node too; free NVLink: what is left on the network is the trainable
    # share of the first gather plus the reduce-scatter of the trainable gradients
    t = TrainingSpec(deepspeed=DeepSpeedConfig(zero_hpz_partition_size=8))
    t = dataclasses.replace(t, finetune=dataclasses.replace(t.finetune, train_last_layers=1))
    c = Candidate(strategy=Strategy.ZERO3, offload=Offload.NONE, checkpointing=Checkpointing.FULL)
    x = step_inputs(LLAMA3_8B, t, cluster(16), c)
    x = dataclasses.replace(x, bw_intra=1e30, lat_intra=0.0, lat_inter=0.0)
    trained = x.p_grad
    assert 0 < trained < P
    want = (15 / 16 * 2 * trained + 15 / 16 * 2 * trained) / 8 / x.bw_inter
    assert float(step_core(x).comm_s) == pytest.approx(want, rel=1e-9)
