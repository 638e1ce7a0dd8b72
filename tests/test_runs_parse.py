"""Reading what runs leave behind: out-of-memory messages of every wording, training logs,
the files fitcheck's GPU runs wrote. Expected figures are the printed numbers times their unit
(derived by hand from each message), never the parser's own output."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.runs.evidence import Moment, Quantity
from planner.runs.oom import find_ooms
from planner.runs.read import RunFileError, read_file, read_run

DATA = Path(__file__).parent / "data"
PUBLIC = DATA / "runs" / "public"
GPU = DATA / "gpu"
KiB, MiB, GiB = 2**10, 2**20, 2**30


def _oom(name: str):
    run, _ = read_file(str(PUBLIC / name))
    assert len(run.ooms) == 1, run.ooms
    return run.ooms[0]


# file, wording, requested, capacity, free, allocated, reserved-but-unallocated, in use (NVML)
OOMS = [
    ("oom-pytorch16417-torch1-cached.txt", "torch1-cached", 12.50 * MiB, 10.92 * GiB,
     9.28 * GiB, 8.57 * MiB, 4.68 * MiB, None),
    ("oom-pytorch59778-torch1-reserved.txt", "torch1-reserved", 2.26 * GiB, 6.00 * GiB,
     3.03 * GiB, 781.59 * MiB, 1.24 * GiB - 781.59 * MiB, None),
    ("oom-shannonai6-no-head.txt", "torch1-reserved", 20.00 * MiB, 1.96 * GiB, 2.88 * MiB,
     1.24 * GiB, 1.25 * GiB - 1.24 * GiB, None),
    ("oom-one2345-25-other-processes.txt", "torch1-reserved", 1.69 * GiB, 14.56 * GiB,
     1.31 * GiB, 649.97 * MiB, 1.01 * GiB - 649.97 * MiB, None),
    ("oom-localgpt7-torch1-other-memory.txt", "torch1-reserved", 1.63 * GiB, 44.56 * GiB,
     565.31 * MiB, 27.91 * GiB, 27.93 * GiB - 27.91 * GiB, None),
    ("oom-ipassr9-torch1-reserved-hint.txt", "torch1-reserved", 10.73 * GiB, 8.00 * GiB, 0,
     17.20 * GiB, 19.15 * GiB - 17.20 * GiB, None),
    ("oom-starcoder15-rich-traceback.txt", "torch1-reserved", 144.00 * MiB, 23.69 * GiB,
     77.06 * MiB, 21.01 * GiB, 22.23 * GiB - 21.01 * GiB, None),
    ("oom-hf-blog-fsdp-gpt2xl-ddp.txt", "torch1-reserved", 40.00 * MiB, 23.65 * GiB,
     20.31 * MiB, 22.27 * GiB, 22.76 * GiB - 22.27 * GiB, None),
    ("oom-llamafactory1221-zero2-optimizer.txt", "torch1-reserved", 3.14 * GiB, 31.75 * GiB,
     1.95 * GiB, 28.28 * GiB, 0, None),
    ("oom-mgfn35-torch2.1-capacty.txt", "torch2.1", 1.70 * GiB, 6.00 * GiB, 0, 2.93 * GiB,
     2.30 * GiB, None),
    ("oom-neurolens2-torch2.1-larger-than-device.txt", "torch2.1", 55.57 * GiB, 12.00 * GiB,
     9.02 * GiB, 984.52 * MiB, 463.48 * MiB, None),
    ("oom-mygirlgpt11-torch2.1-this-process.txt", "torch2.1", 32.00 * MiB, 4.00 * GiB,
     41.56 * MiB, 2.58 * GiB, 1.90 * MiB, 3.44 * GiB),
    ("oom-fooocus1902-torch2.1-free-exceeds.txt", "torch2.1", 10.00 * MiB, 6.00 * GiB,
     1.57 * GiB, 3.24 * GiB, 154.45 * MiB, None),
    ("oom-pytorch16417-comment-torch2.2.txt", "torch2.2", 22.00 * MiB, 23.65 * GiB,
     11.06 * MiB, 22.90 * GiB, 194.87 * MiB, 23.60 * GiB),
    ("oom-cads4-torch2.5.txt", "torch2.2", 22.78 * GiB, 31.47 * GiB, 12.73 * GiB,
     9.08 * GiB, 9.35 * GiB, 18.73 * GiB),
    ("oom-taggui188-torch2.2-no-nvml.txt", "torch2.2", 20.00 * MiB, 4.00 * GiB, 2.35 * GiB,
     825.15 * MiB, 24.85 * MiB, None),
    ("oom-kaito976-fragmentation-private-pools.txt", "torch2.2", 546.00 * MiB, 15.77 * GiB,
     514.19 * MiB, 13.73 * GiB, 736.86 * MiB, None),
    ("oom-therock2118-hip-allowed.txt", "torch2.2", 2.00 * MiB, 255.98 * GiB, 244.65 * GiB,
     1017.01 * MiB, 54.99 * MiB, None),
    ("oom-fbgemm5605-docs-url.txt", "torch2.2", 122.07 * GiB, 255.98 * GiB, 50.64 * GiB,
     123.74 * GiB, 8.94 * MiB, None),
    ("oom-framepack369-larger-than-device.txt", "torch2.2", 30.29 * GiB, 10.74 * GiB,
     3.69 * GiB, 6.10 * GiB, 396.58 * MiB, 6.68 * GiB),
]


@pytest.mark.parametrize("name,wording,req,cap,free,alloc,unalloc,in_use", OOMS,
                         ids=[o[0] for o in OOMS])
def test_public_oom_messages(name, wording, req, cap, free, alloc, unalloc, in_use):
    o = _oom(name)
    assert o.format == wording
    # each figure is the printed number x its unit, to c10's format_size rounding
    for fig, want in ((o.requested, req), (o.capacity, cap), (o.free, free),
                      (o.allocated, alloc), (o.reserved_unallocated, unalloc)):
        assert abs(fig.value - want) <= fig.resolution + 1, (fig, want)
    if in_use is None:
        assert o.process_in_use is None
    else:
        assert abs(o.process_in_use.value - in_use) <= o.process_in_use.resolution + 1


def test_wording_details():
    k = _oom("oom-kaito976-fragmentation-private-pools.txt")
    assert k.private_pools.value == round(46.00 * MiB)
    assert [(pid, f.value) for pid, f in k.other_processes] == [(562167, round(15.25 * GiB))]
    assert k.exception == "torch.OutOfMemoryError" and k.hint == "expandable_segments"
    h = _oom("oom-therock2118-hip-allowed.txt")
    assert h.backend == "HIP" and h.allowed.value == round(1.05 * GiB)
    assert h.limit == round(1.05 * GiB)
    assert h.private_pools.value == round(17.00 * MiB)
    m = _oom("oom-mgfn35-torch2.1-capacty.txt")
    assert m.exception == "torch.cuda.OutOfMemoryError" and m.hint == "max_split_size_mb"
    assert _oom("oom-pytorch16417-torch1-cached.txt").exception == "RuntimeError"
    assert _oom("oom-shannonai6-no-head.txt").exception == ""
    # 'N cached' (<= 1.4) is the reserved-but-unallocated part: 8.57 MiB + 4.68 MiB reserved
    c = _oom("oom-pytorch16417-torch1-cached.txt")
    assert abs(c.reserved - (8.57 + 4.68) * MiB) < 2 * c.allocated.resolution + 2
    # without NVML's line: whole-device used - reserved, other processes included
    o = _oom("oom-one2345-25-other-processes.txt")
    assert abs(o.non_pytorch - (14.56 * GiB - 1.31 * GiB - 1.01 * GiB)) < 0.02 * GiB
    # with it: this process in use - reserved
    g = _oom("oom-pytorch16417-comment-torch2.2.txt")
    assert abs(g.non_pytorch - (23.60 * GiB - 22.90 * GiB - 194.87 * MiB)) < 0.02 * GiB


def test_h200_tracebacks_name_the_moment_and_the_allocation():
    opt, _ = read_file(str(GPU / "oom-h200-llama3.1-8b-ddp-bf16amp-optimizer.txt"))
    (o,) = opt.ooms
    assert o.moment is Moment.OPTIMIZER and "opt.step()" in o.moment_evidence
    assert o.category_hint == "optimizer_temporaries" and "_foreach_sqrt" in o.category_evidence
    assert o.exception == "torch.OutOfMemoryError" and o.format == "torch2.2"
    assert abs(o.allocated.value - 138.31 * GiB) <= o.allocated.resolution + 1
    # this process's memory outside the allocator: 139.76 - 138.31 GiB - 165.25 MiB
    assert abs(o.non_pytorch - (139.76 * GiB - 138.31 * GiB - 165.25 * MiB)) < 0.02 * GiB
    bwd, _ = read_file(str(GPU / "oom-h200-mixtral4L-fsdp64-full-backward.txt"))
    (b,) = bwd.ooms
    assert b.moment is Moment.BACKWARD and "loss.backward()" in b.moment_evidence
    assert b.category_hint == "gathered_params" and "foreach_all_gather" in b.category_evidence
    assert abs(b.requested.value - 21.08 * GiB) <= b.requested.resolution + 1
    assert abs(b.reserved_unallocated.value - 44.52 * GiB) <= b.reserved_unallocated.resolution


def test_the_same_message_from_every_rank_counts_once(tmp_path):
    line = (PUBLIC / "oom-cads4-torch2.5.txt").read_text().strip()
    p = tmp_path / "ranks.log"
    p.write_text("\n".join(f"[rank{i}]: {line}" for i in range(4)) + "\n")
    assert len(read_file(str(p))[0].ooms) == 1


def test_a_message_wrapped_over_lines_is_read():
    text = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 15.00 GiB.\n"
            "GPU 0 has a total capacity of 14.56 GiB of which 6.91 GiB is free.\n"
            "Including non-PyTorch memory, this process has 7.65 GiB memory in use.\n"
            "Of the allocated memory 7.23 GiB is allocated by PyTorch,\n"
            "and 301.94 MiB is reserved by PyTorch but unallocated.\n")
    (o,) = list(find_ooms(text.splitlines(), "wrapped"))
    assert o.requested.value == round(15.00 * GiB) and o.process_in_use.text == "7.65 GiB"


# --------------------------------------------------------------------------- logs


def _peak(run, q: Quantity) -> int:
    return max(s.figures[q].value for s in run.samples if q in s.figures)


def test_torchtitan_lines():
    run, _ = read_file(str(PUBLIC / "torchtitan-pr1287.log"))
    assert len(run.samples) == 6 and {s.format for s in run.samples} == {"torchtitan"}
    assert _peak(run, Quantity.PEAK_RESERVED) == round(49.66 * GiB)
    # 49.66 GiB is 52.28 % of the device: 94.99 GiB, to the rounding of both
    cap = run.samples[0].figures[Quantity.CAPACITY]
    assert abs(cap.value - 49.66 * GiB / 0.5228) <= cap.resolution
    assert [s.tokens_per_s_per_gpu for s in run.samples][:2] == [5856, 5593]
    assert run.samples[0].mfu == pytest.approx(0.3429)
    g, _ = read_file(str(PUBLIC / "torchtitan-pr3393-grad-norm.log"))
    assert _peak(g, Quantity.PEAK_RESERVED) == round(9.46 * GiB) and len(g.samples) == 4
    h, _ = read_file(str(GPU / "torchtitan-style-h200.log"))
    assert [s.figures[Quantity.PEAK_RESERVED].value for s in h.samples] == [
        round(44.88 * GiB), round(49.14 * GiB), round(37.74 * GiB)]


def test_deepspeed_see_memory_usage_and_throughput():
    run, _ = read_file(str(PUBLIC / "deepspeed-2302-engine-moments.log"))
    by = {s.label: s for s in run.samples}
    assert by["Engine after forward"].moment is Moment.FORWARD
    assert by["Engine after backward"].moment is Moment.BACKWARD
    assert by["Engine after backward"].figures[Quantity.PEAK_ALLOCATED].value == round(0.08 * GiB)
    # Max_CA is printed as round(x): an integer number of GiB, +- half a GiB
    assert by["Engine before forward"].figures[Quantity.PEAK_RESERVED].resolution == GiB // 2
    z, _ = read_file(str(PUBLIC / "deepspeed-2899-zero3-galactica.log"))
    assert _peak(z, Quantity.PEAK_ALLOCATED) == round(55.83 * GiB)
    assert _peak(z, Quantity.PEAK_RESERVED) == 56 * GiB
    e, _ = read_file(str(PUBLIC / "deepspeed-examples777-optimizer-states.log"))
    assert {s.moment for s in e.samples if s.label} == {Moment.LOADING}
    t, _ = read_file(str(PUBLIC / "deepspeed-2629-throughput.log"))
    assert _peak(t, Quantity.PEAK_ALLOCATED) == round(2.62 * GiB)
    assert t.samples[0].samples_per_s == pytest.approx(158.31157878546472)
    o, _ = read_file(str(PUBLIC / "deepspeed-1825-throughput-old.log"))
    assert _peak(o, Quantity.PEAK_ALLOCATED) == round(9.02 * GiB) and o.samples[0].step == 40


def test_hf_trainer_memory_metrics():
    run, _ = read_file(str(PUBLIC / "hf-trainer-13915-before-init.txt"))
    (s,) = run.samples
    # before_init 312 MiB + train alloc delta -153 MiB + peaked delta 2012 MiB (v >> 20 'MB')
    assert s.figures[Quantity.PEAK_ALLOCATED].value == (312 - 153 + 2012) * MiB
    z2, _ = read_file(str(PUBLIC / "hf-trainer-13616-zero2.txt"))
    assert z2.samples[0].figures[Quantity.PEAK_ALLOCATED].value == (1635 + 8862) * MiB
    assert any("before_init_mem_gpu not printed" in n for n in z2.notes)


def test_tracemalloc_torchtune_pynvml():
    lr, _ = read_file(str(PUBLIC / "llama-recipes-pr206-memorytrace.log"))
    (s,) = lr.samples  # int(x / 2**30) printed as 'GB': within [47, 48) GiB
    assert abs(s.figures[Quantity.PEAK_ALLOCATED].value - 47.5 * GiB) <= GiB // 2
    assert abs(s.figures[Quantity.PEAK_RESERVED].value - 55.5 * GiB) <= GiB // 2
    tt, _ = read_file(str(PUBLIC / "torchtune-pr2406-steps.log"))
    assert len(tt.samples) == 3
    assert tt.samples[0].tokens_per_s_per_gpu == pytest.approx(46.731, 1e-3)
    assert _peak(tt, Quantity.PEAK_ALLOCATED) == round(54.96961975097656 * GiB)
    assert any("carry no unit" in n for n in tt.notes)
    nv, _ = read_file(str(PUBLIC / "pynvml-hf-perf-bert-large-bs4-fp32.log"))
    assert abs(nv.samples[0].figures[Quantity.DEVICE_USED].value - 14949.5 * MiB) <= MiB // 2


def test_nvidia_smi_csv_and_lightning_metrics(tmp_path):
    # nvidia-smi --query-gpu=index,name,memory.used,memory.total,driver_version --format=csv
    # (the header names each field with its unit: nvidia-smi(1), "QUERY OPTIONS")
    smi = tmp_path / "smi.csv"
    smi.write_text("index, name, memory.used [MiB], memory.total [MiB], driver_version\n"
                   "0, NVIDIA H100 80GB HBM3, 71234 MiB, 81559 MiB, 550.54.15\n"
                   "1, NVIDIA H100 80GB HBM3, 72001 MiB, 81559 MiB, 550.54.15\n")
    run, _ = read_file(str(smi))
    assert _peak(run, Quantity.DEVICE_USED) == 72001 * MiB
    assert run.gpu_name == "NVIDIA H100 80GB HBM3" and run.versions == {"driver": "550.54.15"}
    # Lightning's CSVLogger: DeviceStatsMonitor.{hook}/{torch.cuda.memory_stats key} in bytes
    # (lightning/pytorch/callbacks/device_stats_monitor.py, _prefix_metric_keys)
    csvf = tmp_path / "metrics.csv"
    csvf.write_text(
        "DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.peak,"
        "DeviceStatsMonitor.on_train_batch_end/reserved_bytes.all.peak,epoch,step\n"
        "10737418240,12884901888,0,9\n12884901888,15032385536,0,19\n")
    run, _ = read_file(str(csvf))
    assert _peak(run, Quantity.PEAK_ALLOCATED) == 12 * GiB
    assert _peak(run, Quantity.PEAK_RESERVED) == 14 * GiB and run.samples[-1].step == 19


def test_a_log_without_a_memory_line_says_what_was_looked_for(tmp_path):
    p = tmp_path / "train.log"
    p.write_text("epoch 1 loss 2.3\nepoch 2 loss 2.1\n")
    with pytest.raises(RunFileError) as e:
        read_file(str(p))
    msg = str(e.value)
    assert str(p) in msg and "no memory figure" in msg
    for needle in ("CUDA out of memory", "torchtitan", "train_mem_gpu_peaked_delta",
                   "DeviceStatsMonitor", "Max_MA", "nvidia-smi", "_dump_snapshot"):
        assert needle in msg
    with pytest.raises(RunFileError, match="no such file"):
        read_file(str(tmp_path / "missing.log"))


def test_gpu_run_records_carry_their_jobs():
    run, cases = read_run([str(Path(__file__).parent.parent / "benchmarks" / "gpu_runs"
                               / "2026-11-26-h200" / "run1-records.jsonl")])
    assert run.versions == {"torch": "2.11.0+cu130", "cuda": "13.0", "driver": "580.159.04",
                            "nccl": "2.28.9"}
    c = next(c for c in cases if c.id == "w1-1b-fsdp-none")
    assert c.model.name == "llama3.2-1b" and c.training.micro_batch == 4
    moments = {s.moment: s.figures[Quantity.PEAK_ALLOCATED].value for s in c.run.samples}
    assert moments[Moment.FORWARD] == 40310560256 and moments[Moment.OPTIMIZER] == 24783462912
    oom = next(c for c in cases if c.id == "w64-mixtral4L-fsdp-full")
    assert oom.fake_group and oom.run.ooms[0].moment is Moment.BACKWARD
