"""Activation offloading (issue 26, item 5): torchtune's ``enable_activation_offloading`` and
axolotl's / TRL's ``activation_offloading`` (torchtune/training/_activation_offloading.py;
TRL's copy, trl/models/activation_offloading.py).

The expected bytes below are derived by hand from the hooks' source and the reference block
(probes/models.py), and were checked against probes/offload_trace.py, which records what
autograd hands the pack hook on fake tensors (tests/test_activation_offload_gpu.py holds the
planner to the GPU's own tallies):

- torchtune's pack_tensor copies every save of at least min_offload_size = 1024 bytes that is
  not an nn.Parameter into its own pinned host tensor: a tensor several ops save is copied
  once per op, and a matmul's saved weight (``weight.t()``, a plain tensor) is copied too;
- with streams, fwd_stash keeps the last max_fwd_stash_size = 5 offloaded saves alive on the
  GPU, into backward until the first offloaded node's hook;
- in backward a node's saves are brought back when it unpacks them and freed in the next
  such node's post-hook: two consecutive nodes' saves at once;
- the output layer runs under NoOpManager and torchtune's recipes compute the loss outside
  the context: both stay on the GPU;
- under non-reentrant checkpointing only _NoopSaveInputs' saves reach the outer hooks: the
  block's tensor arguments (its input and, in the reference block, RoPE's cos and sin).
"""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from conftest import cluster, run
from planner.activations import plan_activations
from planner.memory import Phase, estimate
from planner.spec import (
    Attention,
    Candidate,
    Checkpointing,
    ModelSpec,
    OffloadImpl,
    Precision,
    Strategy,
    TrainingSpec,
)
from planner.throughput import estimate_step

# 4 layers, hidden 512, 8 heads of 64 (2 KV heads), SwiGLU 1536, RMSNorm, RoPE, vocab 32000
MODEL = ModelSpec(name="m", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, ffn_hidden=1536,
                  vocab=32000)
FS = Candidate(strategy=Strategy.FULL_SHARD, checkpointing=Checkpointing.FULL)

# seq 1024 x micro-batch 2 = 2048 tokens, FSDP2 computing in bf16 (module regime: c = r = 2)
T, H, D = 2048, 512, 64
BLOCK_INPUT = 2 * T * H                    # 2,097,152: one block's checkpointed input (bf16)
ROPE = 2 * 2 * 1024 * D                    # 262,144: cos and sin, (seq, head_dim) bf16
INDICES = 8 * T                            # 16,384: the embedding's int64 indices
# the final norm: pow and mul save the fp32 input (4,194,304 each), rsqrt and mul the rstd
# (8,192 each), the weight's mul the bf16 normed cast (2,097,152)
FINAL_SAVES = 2 * 4 * T * H + 2 * 4 * T + 2 * T * H    # 10,502,144
FINAL_NORM = 4 * T * H + 4 * T + 2 * T * H             # 6,299,648: those tensors, once each
# every checkpoint saves the block input, cos and sin: 4 x 2,359,296
HOST = 4 * (BLOCK_INPUT + ROPE) + INDICES + FINAL_SAVES  # 19,955,712
# the last five offloaded saves of the forward are the final norm's five
STASH_BLOCKS = 0
STASH_ROOT = FINAL_NORM
# in backward: block i's checkpoint inputs come back while block i+1's are not yet freed
BACK = 2 * (BLOCK_INPUT + ROPE)            # 4,718,592


def train(**kw):
    return TrainingSpec(seq=1024, micro_batch=2, precision=Precision.BF16_AMP, **kw)


def test_hand_count_of_what_goes_to_the_host_and_what_stays():
    assert HOST == 19_955_712
    p = plan_activations(MODEL, batch=2, seq=1024, precision=Precision.BF16_AMP,
                         attention=Attention.SDPA, checkpointing=Checkpointing.FULL,
                         uses_autocast=False, offload=True)
    assert p.host_bytes == HOST
    assert (p.offload_stash, p.offload_stash_root) == (STASH_BLOCKS, STASH_ROOT)
    assert p.gpu_blocks_kept == STASH_BLOCKS  # was 4 x 2,097,152 = 8,388,608
    assert (p.gpu_blocks_bwd, p.gpu_back) == (0, BACK)
    off = dataclasses.replace(p, offload=False)
    assert off.host_bytes == 0 and off.gpu_blocks_kept == 4 * BLOCK_INPUT


def test_loss_backward_moment_loses_the_offloaded_bytes_and_host_ram_gains_them():
    """At the loss's backward every block's input and the rotary tables are on the host;
    what stays is the stash (the final norm's tensors), the head's input and the loss."""
    a = estimate(MODEL, train(), cluster(8), FS)
    b = estimate(MODEL, train(activation_offload=True), cluster(8), FS)
    saved = 4 * BLOCK_INPUT + ROPE
    assert saved == 8_650_752
    assert a.phases[Phase.LOSS_BWD].activations - b.phases[Phase.LOSS_BWD].activations == saved
    # 8 ranks on the node, each pinning its own copies
    assert b.host_bytes_per_node - a.host_bytes_per_node == 8 * HOST


# 128 tokens (micro-batch 1), no checkpointing, module regime: every op's saves, by hand.
# norm: fp32 input 4*128*512 = 262,144 twice (pow, mul), rstd 512 twice (under 1 KiB: stays),
#   normed bf16 131,072                                                        = 655,360
# q, k, v: the normed input 131,072 each, weights 512x512, 512x128, 512x128 bf16
#   (524,288 + 131,072 + 131,072)                                              = 1,179,648
# RoPE: q*cos, rot(q)*sin, k*cos, rot(k)*sin save a 128x64 bf16 table each    = 65,536
# SDPA: q 131,072, k 32,768, v 32,768, out 131,072, logsumexp 4*8*128 = 4,096 = 331,776
# o: its input (SDPA's output, saved again) 131,072 + weight 524,288         = 655,360
# norm2                                                                        = 655,360
# gate, up: input 131,072 each + weights 512x1536 bf16 (1,572,864) each       = 3,407,872
# silu: gate 393,216; mul: silu out + up 786,432; down: input 393,216 + weight 1,572,864
#                                                                              = 3,145,728
SMALL_BLOCK = (655_360 + 1_179_648 + 65_536 + 331_776 + 655_360 + 655_360 + 3_407_872
               + 3_145_728)
SMALL_HOST = 4 * SMALL_BLOCK + 8 * 128 + 2 * 262_144 + 131_072  # + indices + final norm


def test_small_tensors_stay_on_the_gpu_and_every_save_is_copied():
    """At 128 tokens each RMSNorm's fp32 rstd is 4 x 128 = 512 bytes, under the 1 KiB
    threshold: a pre-norm block's two stay. Everything else is copied once per save."""
    assert SMALL_BLOCK == 10_096_640 and SMALL_HOST == 41_042_944
    p = plan_activations(MODEL, batch=1, seq=128, precision=Precision.BF16_AMP,
                         attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                         uses_autocast=False, offload=True)
    assert p.offload_small_per_block == 2 * 4 * 128
    assert p.host_bytes == SMALL_HOST
    # two consecutive nodes: gate (1,572,864 + 131,072) then up (the same)
    assert p.gpu_back == 2 * (1_572_864 + 131_072)
    assert any("without checkpointing" in n for n in p.notes)


def test_trl_keeps_a_repeated_save_on_the_gpu():
    """TRL's copy: the second save of a storage (mul after pow, k and v after q, o after
    SDPA, up after gate) stays on the GPU, the first is copied once; a pure-bf16 model's
    weights are parameters' storages, never copied; the rotary tables are copied by the
    first block only. Per block kept: the norms' fp32 inputs 2 x 262,144, the normed input
    131,072, SDPA's output 131,072, the MLP's input 131,072 (rstd: under 1 KiB anyway)."""
    p = plan_activations(MODEL, batch=1, seq=128, precision=Precision.BF16_AMP,
                         attention=Attention.SDPA, checkpointing=Checkpointing.NONE,
                         uses_autocast=False, offload=True, offload_trl=True,
                         offload_weights=False)
    kept = 2 * 262_144 + 3 * 131_072
    assert p.offload_small_per_block == 2 * 512 + kept
    weights = 524_288 + 2 * 131_072 + 524_288 + 3 * 1_572_864
    repeats = 262_144 * 2 + 2 * 131_072 + 131_072 + 131_072  # second saves, per block
    rope = 4 * 16_384
    # the final norm's second fp32 save stays; the first block's two table saves are copied
    host = 4 * (SMALL_BLOCK - weights - repeats - rope) + 8 * 128 + 262_144 + 131_072 \
        + 2 * 16_384
    assert p.host_bytes == host == 12_239_872
    # its __exit__ empties the forward stash before backward
    assert p.offload_stash == p.offload_stash_root == 0


def test_trl_is_read_from_trl_and_axolotl_jobs_and_needs_offloading(tmp_path):
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8",
            "--activation-offload-impl", "trl")
    assert r.exit_code != 0 and "--activation-offload" in r.stderr, r.output
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--activation-offload",
            "--activation-offload-impl", "trl", "--json")
    assert r.exit_code == 0, r.output
    assert '"activation_offload_impl": "trl"' in r.stdout
    from planner.jobs import read_job

    data = pathlib.Path(__file__).parent / "data" / "jobs"
    ax = tmp_path / "ax.yaml"
    ax.write_text((data / "axolotl_gpt-oss_gpt-oss-20b-fft-fsdp2-offload.yaml").read_text())
    j = read_job(str(ax))
    assert j.values["training.activation_offload"] is True
    assert j.values["training.activation_offload_impl"] == OffloadImpl.TRL


@pytest.mark.parametrize("ga", [1, 2])
def test_step_time_hides_the_copies_down_and_waits_for_the_copies_up(ga):
    """Per micro-batch, every offloaded byte goes down in forward and up in backward at the
    profile's PCIe bandwidth x the 0.8 efficiency assumed for offload traffic. Down: on the
    side stream, hidden behind the forward's compute (the compute waits only on a copy five
    saves back); up: the compute stream waits for each copy as it is issued. With a link
    ten times faster than the H100's 64 GB/s the copies down hide entirely; with a 1 MB/s
    link only the forward's compute (under a millisecond) is hidden of them."""
    from planner.hardware import load_gpu

    h100 = load_gpu("h100-80")
    for bw, exposed_down in ((640e9, 0.0), (1e6, 1.0)):
        gpu = dataclasses.replace(h100, pcie_bandwidth_bytes_per_s=bw)
        a = estimate_step(MODEL, train(grad_accum=ga), cluster(8, gpu), FS)
        b = estimate_step(MODEL, train(grad_accum=ga, activation_offload=True),
                          cluster(8, gpu), FS)
        one_way = HOST / (bw * 0.8)
        assert b.offload_s - a.offload_s == pytest.approx(
            ga * (1 + exposed_down) * one_way, rel=1e-9 if not exposed_down else 1e-5)
        assert b.compute_s == a.compute_s


def test_default_off_changes_nothing():
    a = estimate(MODEL, train(), cluster(8), FS)
    b = estimate(MODEL, train(activation_offload=False), cluster(8), FS)
    assert a.phases == b.phases and a.host_bytes_per_node == b.host_bytes_per_node


def test_flag_and_bad_value():
    r = run("--model", "llama3-8b", "--gpu", "h100-80", "--n", "8", "--activation-offload",
            "--json")
    assert r.exit_code == 0, r.output
    assert '"activation_offload": true' in r.stdout
    # a bad value in a gate spec: one line naming the field, exit 4 (docs/cli.md)
    r = run("gate", "-", input='{"model": {"preset": "llama3-8b"}, "hardware": {"gpu": '
            '"h100-80", "n": 8}, "training": {"activation_offload": "sometimes"}}')
    assert r.exit_code == 4, (r.exit_code, r.output)
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "training.activation_offload" in err, err


def test_job_keys_are_modelled(tmp_path):
    from planner.jobs import read_job

    y = tmp_path / "tt.yaml"
    src = tmp_path / "src.yaml"
    data = pathlib.Path(__file__).parent / "data" / "jobs"
    text = (data / "torchtune_llama3_1_8B_lora.yaml").read_text().replace(
        "enable_activation_offloading: False", "enable_activation_offloading: True")
    y.write_text(text)
    j = read_job(str(y))
    assert j.values["training.activation_offload"] is True
    assert not any("offloading" in u for u in j.unmodelled)
    ax = (data / "axolotl_gpt-oss_gpt-oss-20b-fft-fsdp2-offload.yaml").read_text().replace(
        "activation_offloading: true", "activation_offloading: legacy")
    src.write_text(ax)
    j = read_job(str(src))
    assert any("activation offloading" in u and "legacy" in u for u in j.unmodelled)


def test_autocast_block_casts_leave_the_gpu_with_the_region():
    """DDP under autocast without checkpointing: each block's matmuls save their cached bf16
    weight casts, which the hooks copy to the host, so after the region only the head's cast
    (saved under NoOpManager) is held. Casts per block: (q 512x512 + k, v 512x128 + o 512x512
    + gate, up, down 512x1536) x 2 B = 6,029,312; the head's 32000 x 512 x 2 = 32,768,000."""
    ddp = Candidate(strategy=Strategy.DDP, checkpointing=Checkpointing.NONE)
    a = estimate(MODEL, train(), cluster(1), ddp)
    b = estimate(MODEL, train(activation_offload=True), cluster(1), ddp)
    assert a.phases[Phase.LOSS_BWD].gathered_params == 4 * 6_029_312 + 32_768_000
    assert b.phases[Phase.LOSS_BWD].gathered_params == 32_768_000
    # at the loss itself (inside the region) the cache is whole either way
    assert b.phases[Phase.FORWARD].gathered_params == a.phases[Phase.FORWARD].gathered_params


@pytest.mark.trace
def test_the_step_trace_refuses_activation_offloading():
    """The fake-tensor step does not run the offloading hooks: a trace of it would be a run
    without offloading, so it is refused by name (probes/offload_trace.py emulates them)."""
    from probes.trace import UnsupportedConfig, check_supported
    from planner.spec import Candidate, Strategy, TrainingSpec

    with pytest.raises(UnsupportedConfig, match="activation offloading: not run"):
        check_supported(TrainingSpec(activation_offload=True),
                        Candidate(strategy=Strategy.FULL_SHARD))
