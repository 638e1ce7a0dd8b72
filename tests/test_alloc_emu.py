"""probes/alloc_emu.py against sequences worked by hand from CUDACachingAllocator.cpp's rules
(the rule each step uses is named in the comment)."""

import pytest

from probes.alloc_emu import CachingAllocator, OutOfMemory, allocation_size, round_size

MiB = 1 << 20
U = 20 * MiB  # one large-pool page of an expandable segment (kLargeBuffer)


def test_round_and_segment_sizes():
    # round_size: at least 512, multiples of 512
    assert (round_size(1), round_size(512), round_size(513)) == (512, 512, 1024)
    # get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else ceil to 2 MiB
    assert allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_small_requests_share_one_2mib_segment():
    a = CachingAllocator()
    for i in range(3):
        a.malloc(i, 1000)  # 1024 B each, split off the first 2 MiB small segment
    assert (a.allocated, a.reserved) == (3 * 1024, 2 * MiB)


def test_large_split_and_unsplit_remainder():
    a = CachingAllocator()
    a.malloc("a", 5 * MiB)  # miss: 20 MiB segment, remainder 15 MiB > 1 MiB: split
    a.malloc("b", 5 * MiB)  # best fit: the 15 MiB remainder, split again
    assert (a.allocated, a.reserved) == (10 * MiB, 20 * MiB)
    b = CachingAllocator()
    b.malloc("x", 12 * MiB)  # segment of 12 MiB (a multiple of 2 MiB)
    b.free("x")
    b.malloc("y", 11 * MiB + MiB // 2)  # fits the 12 MiB block; remainder 0.5 MiB <= 1 MiB:
    assert (b.allocated, b.reserved) == (12 * MiB, 12 * MiB)  # no split, all 12 MiB handed out


def test_streams_do_not_share_cached_blocks():
    a = CachingAllocator()
    a.malloc("a", 100 * MiB, stream=0)
    a.free("a")
    a.malloc("b", 100 * MiB, stream=1)  # the cached 100 MiB block is stream 0's
    assert a.reserved == 200 * MiB
    a.free("b")
    a.malloc("c", 100 * MiB, stream=0)  # stream 0's block again
    assert a.reserved == 200 * MiB


def test_segments_never_merge_but_expandable_pages_do():
    # default: two 40 MiB segments freed; 60 MiB fits neither -> a third segment
    a = CachingAllocator()
    a.replay([("alloc", "A", 40 * MiB), ("alloc", "B", 40 * MiB), ("free", "A"),
              ("free", "B"), ("alloc", "C", 60 * MiB)])
    assert a.reserved == 140 * MiB and a.max_reserved == 140 * MiB
    # expandable: A and B are adjacent pages of one segment; freed they merge into one
    # 80 MiB block that serves C (split, 20 MiB left free)
    e = CachingAllocator(expandable=True)
    e.replay([("alloc", "A", 40 * MiB), ("alloc", "B", 40 * MiB), ("free", "A"),
              ("free", "B"), ("alloc", "C", 60 * MiB)])
    assert (e.allocated, e.reserved, e.max_reserved) == (60 * MiB, 80 * MiB, 80 * MiB)


def test_expandable_tail_grows_by_whole_pages_from_the_free_tail():
    e = CachingAllocator(expandable=True)
    e.malloc("a", 30 * MiB)  # maps 2 pages (40 MiB); 10 MiB free at the tail
    assert e.reserved == 40 * MiB
    # 15 MiB: no free block fits (10 MiB); the lowest room is the free 10 MiB + unmapped:
    # map ceil(5 MiB / 20 MiB) = 1 page; the 30 MiB free block serves it
    e.malloc("b", 15 * MiB)
    assert (e.allocated, e.reserved) == (45 * MiB, 60 * MiB)


def test_interior_gap_serves_only_requests_that_fit_it():
    # The colleague's sequence in 20 MiB units: [copy 6U][B 1U] live, then the copy is freed;
    # the grad (4U) best-fits the 6U interior gap (split: 2U stay free between grad and B);
    # the next 4U tensor fits no free block (2U) -> 4 new pages at the tail.
    seq = [("alloc", "copy", 6 * U), ("alloc", "B", U), ("free", "copy"),
           ("alloc", "grad", 4 * U), ("alloc", "next", 4 * U)]
    e = CachingAllocator(expandable=True).replay(seq)
    # reserved 6 + 1 + 4 = 11U; allocated 4 + 1 + 4 = 9U: 2U reserved beyond allocated
    assert (e.allocated, e.reserved) == (9 * U, 11 * U)
    # the default allocator does the same here (6U segment split by the grad: 2U > 1 MiB)
    d = CachingAllocator().replay(seq)
    assert (d.allocated, d.reserved) == (9 * U, 11 * U)
    # had the next tensor been 2U it would have filled the gap: no growth
    e2 = CachingAllocator(expandable=True).replay(seq[:4] + [("alloc", "n2", 2 * U)])
    assert (e2.allocated, e2.reserved) == (7 * U, 7 * U)


def test_expandable_best_fit_prefers_an_interior_block_over_the_tail():
    # [a 2U][gap 3U][b 1U][tail free 4U | unmapped]: a 3U request fits both the gap and
    # the tail; the tail's expandable size (4U + unmapped) is larger, so the gap serves it
    e = CachingAllocator(expandable=True)
    e.replay([("alloc", "a", 2 * U), ("alloc", "g", 3 * U), ("alloc", "b", U),
              ("alloc", "t", 4 * U), ("free", "g"), ("free", "t")])
    blk = e.malloc("r", 3 * U)
    assert blk.ptr - e.live["a"].ptr == 2 * U  # right after a: the gap
    assert e.reserved == 10 * U


def test_capacity_miss_frees_cached_segments_and_retries():
    a = CachingAllocator(capacity=100 * MiB)
    a.malloc("a", 60 * MiB)
    a.free("a")
    # 80 MiB: the 60 MiB cached block is too small; a new segment would make 140 > 100 MiB;
    # release_cached_blocks frees the whole 60 MiB segment, the retry fits
    a.malloc("b", 80 * MiB)
    assert (a.reserved, a.num_alloc_retries) == (80 * MiB, 1)
    with pytest.raises(OutOfMemory):
        a.malloc("c", 40 * MiB)  # 80 + 40 > 100 and nothing cached


def test_expandable_capacity_miss_unmaps_free_pages():
    e = CachingAllocator(expandable=True, capacity=80 * MiB)
    e.replay([("alloc", "A", 40 * MiB), ("alloc", "B", 20 * MiB), ("free", "A")])
    # 60 MiB: the 40 MiB interior gap is too small; mapping 60 MiB more needs 120 > 80 MiB;
    # release_cached_blocks unmaps A's 2 pages (reserved 20 MiB), then 3 pages are mapped
    # at the tail (the unmapped hole before B is only 40 MiB)
    e.malloc("C", 60 * MiB)
    assert (e.reserved, e.max_reserved, e.num_alloc_retries) == (80 * MiB, 80 * MiB, 1)


def test_small_pool_expandable_pages_are_2mib():
    e = CachingAllocator(expandable=True)
    e.malloc("s", 1000)
    assert e.reserved == 2 * MiB
    e.malloc("l", 2 * MiB)  # large pool: its own segment, 20 MiB pages
    assert e.reserved == 22 * MiB


def test_bad_event_kind():
    with pytest.raises(ValueError, match="'alloc' or 'free'"):
        CachingAllocator().replay([("resize", 1)])


# ---------------------------------------------------------------- fed from fake-tensor traces

def _running_peak(events, start=0):
    """Peak of the raw bytes live, from the events alone (no allocator): what the tracker's
    own counter saw if the hook recorded every allocation and free."""
    live, size, peak = 0, {}, 0
    for i, ev in enumerate(events):
        if ev[0] == "alloc":
            size[ev[1]] = ev[2]
            live += ev[2]
        else:
            live -= size.pop(ev[1])
        if i >= start:
            peak = max(peak, live)
    return peak


@pytest.mark.trace
def test_trace_hook_records_every_storage_and_fsdp_streams():
    pytest.importorskip("torch")
    from planner.spec import Candidate, ModelSpec, Precision, Strategy, TrainingSpec
    from probes.trace import trace_step

    tiny = ModelSpec(name="tiny", n_layers=2, hidden=64, n_heads=4, n_kv_heads=4,
                     ffn_hidden=128, vocab=256)
    training = TrainingSpec(seq=32, micro_batch=2, precision=Precision.BF16_AMP)
    r = trace_step(tiny, training, Candidate(strategy=Strategy.FULL_SHARD), 4, 8,
                   warmup="iteration", record_events=True)
    ev = r["alloc_events"]
    # the measured iteration's peak from the events equals the tracker's own peak
    assert _running_peak(ev, r["alloc_events_measured_from"]) == r["peak_bytes"]
    # FSDP2 allocates its all-gather output in the copy-in stream and the reduce-scatter
    # output in the reduce-scatter stream: streams other than the default one appear
    assert {e[3] for e in ev if e[0] == "alloc"} - {0}
    emu = CachingAllocator().replay(ev)
    assert emu.max_allocated >= _running_peak(ev)  # 512 B rounding only adds


@pytest.mark.trace
def test_loss_region_by_hand():
    pytest.importorskip("torch")
    from probes.alloc_loss import loss_region

    # tokens 10240, vocab 2048, hidden 5120: h 100 MiB, W 20 MiB, bf16 logits (pred) 40 MiB,
    # fp32 copy 80, log_softmax output 80, labels 80 KiB and 4-byte scalars (small pool, one
    # 2 MiB page or segment). Forward: h W pred copy lsm at the tail (320 MiB). The copy and
    # pred are freed (copy after the loss, pred by del). Backward: nll_loss_backward's 80 MiB
    # grad g1, then log_softmax_backward's 80 MiB g2 (peak allocated: 100+20+80+80+80 = 360
    # MiB + 80 KiB + scalars), the bf16 grad (40), grad_W (20), grad_h (100).
    M = 1 << 20
    e = loss_region(10240, 2048, 5120, expandable=True)
    assert 360 * M < e["max_allocated"] < 361 * M
    # expandable: pred and copy are adjacent, freed they merge (120); g1 takes 80 of it, g2
    # does not fit the 40 left -> 80 more at the tail: 320 + 80 = 400, + the 2 MiB small page;
    # later requests fit the merged free space
    assert e["max_reserved"] == 402 * M
    # default: every request >= 10 MiB is its own segment; g1 reuses the copy's 80, g2 a new
    # 80 (400), the bf16 grad pred's 40; grad_W (20) splits the lowest free 80 segment, and
    # grad_h (100) fits no free segment (80, 80, 60): a new one, 500 + the small 2 MiB = 502
    d = loss_region(10240, 2048, 5120, expandable=False)
    assert d["max_reserved"] == 502 * M


def test_other_streams_cache_counts_at_the_peak():
    # stream 1 frees 100 MiB (cached, its own pool); stream 0 then needs 100 MiB: a new
    # segment. At the peak (200 MiB reserved) stream 1 holds 100 MiB free, stream 0 none.
    a = CachingAllocator().replay([("alloc", "g", 100 * MiB, 1), ("free", "g"),
                                   ("alloc", "x", 100 * MiB, 0)])
    assert a.max_reserved == 200 * MiB
    assert a.cached_at_peak() == {1: 100 * MiB, 0: 0}


@pytest.mark.trace
def test_loss_parallel_region_leaves_the_shards_logits_free():
    """loss_parallel on one rank (tp 4, vocab 8192 -> 2048 local, 10240 tokens, hidden 5120):
    the local logits (bf16) are 40 MiB, each fp32 shard-sized tensor 80 MiB. Forward: pred 40,
    its fp32 copy 80, _log_softmax's shifted 80, exp 80 (freed after the sum), out 80 (in exp's
    place); the copy, shifted and pred are freed. Backward peak: out + grad_input (zeros) +
    exp(out) + their sum = 4 x 80 = 320 MiB beyond h, W and the labels: 16 B per local logit.
    Expandable: pred, copy and shifted leave one 200 MiB hole (40 + 80 + 80) below out;
    grad_input and exp take 160 of it, the sum (80) does not fit the 40 left: 80 more mapped at
    the tail, so 40 MiB (2 B per local logit, the bf16 logits) stay reserved and free."""
    pytest.importorskip("torch")
    from probes.alloc_loss import loss_parallel_region

    M = 1 << 20
    e = loss_parallel_region(10240, 8192, 5120, tp=4)
    # + the targets' token-sized temporaries (safe_target, _MaskPartial's mask and masked
    # target, arange: a few x 80 KiB, 0.016 B per local logit in all)
    assert 16 <= e["beyond_inputs_per_local_logit"] < 16.05
    assert abs((e["max_reserved"] - e["max_allocated"]) - 40 * M) <= 2 * M  # small-pool page


def test_default_stream_hole_of_a_split_logits_block():
    # The fixed-segment loss hole of docs/model.md §7.4, scaled down (the logits 20 MiB in
    # 2 B, their fp32 copy 40 MiB):
    a = CachingAllocator()
    a.malloc("g", 30 * MiB, stream=1)  # a side stream's block (>= 10 MiB: a 30 MiB segment)
    a.free("g")  # free in stream 1's pool: counted as the other streams' cache
    a.malloc("f32", 40 * MiB)  # step 1's fp32 logits: a 40 MiB segment
    a.free("f32")
    a.malloc("bf16", 20 * MiB)  # step 2's bf16 logits: best fit is the 40 MiB block;
    # remainder 20 MiB > kSmallSize (should_split): split, 20 MiB free at the segment's end
    a.malloc("f32b", 40 * MiB)  # the 20 MiB rest does not fit: a new 40 MiB segment
    assert (a.max_allocated, a.max_reserved) == (60 * MiB, 110 * MiB)  # 20 + 40; 30 + 40 + 40
    assert a.cached_at_peak() == {1: 30 * MiB, 0: 20 * MiB}
    # 110 - 60 - 30 (stream 1's free block) = 20 MiB: the bf16 block's free rest
    assert a.default_stream_hole() == 20 * MiB
    # seen from stream 1: 110 - 60 - 20 (stream 0's free rest) = its own free 30 MiB block
    assert a.default_stream_hole(stream=1) == 30 * MiB
