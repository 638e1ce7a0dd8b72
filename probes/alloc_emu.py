"""A pure-Python emulator of PyTorch's CUDA caching allocator, for what matters to peak
*reserved* memory: replays an ordered stream of allocations and frees (sizes, streams) and
reports the allocator's allocated and reserved bytes and their peaks.

A probe (a referee of the planner's allocator terms), never imported by the plan path.

Source read: c10/cuda/CUDACachingAllocator.cpp, pytorch/pytorch commit
001074d25084fdb87a799823e395a50f5ec044d3 (the stored snapshot; the GPU records ran torch
2.11.0, whose file has the same functions; the whole repository is too large to fetch here, so
functions are cited by name, not by line):

* ``round_size``: every request rounded up to a multiple of kMinBlockSize = 512 B (the
  ``roundup_power2_divisions`` option is off by default and not emulated).
* ``get_pool``: <= kSmallSize (1 MiB) -> the small pool, else the large pool. Every free-block
  search is keyed (stream, size, address) (``BlockComparatorSize``): a block freed on one
  stream serves only requests made on that stream (the stream the block was allocated on).
* ``get_free_block``: best fit, the smallest cached block of the pool and stream with
  size >= request (ties: lowest address). With max_split_size set, a block >= max_split_size
  serves no request below it, and an oversize request only a block < request + kLargeBuffer.
* ``get_allocation_size``: a miss cudaMallocs a new segment of kSmallBuffer (2 MiB) for a small
  request, kLargeBuffer (20 MiB) for a request < kMinLargeAlloc (10 MiB), else the request
  rounded up to kRoundLarge (2 MiB).
* ``should_split``: the found block is split when the remainder is >= 512 B (small pool, or any
  pool under expandable segments), else (large pool) when request < max_split_size and the
  remainder > kSmallSize (1 MiB); an unsplit block hands out its whole size (counted as
  allocated: ``alloc_found_block`` adds ``block->size``).
* ``free_block`` / ``try_merge_blocks``: a freed block merges with its free neighbours of the
  same segment (and the same mapped state); segments never merge with each other.
* ``malloc``'s miss path: ``alloc_block``; on failure ``release_available_cached_blocks`` (only
  with max_split_size: frees oversize cached blocks) and retry; then ``release_cached_blocks``
  (cudaFree every cached segment that is wholly free; under expandable segments unmap every
  whole page inside a free block) and retry; then out of memory.
* Expandable segments (Note [Expandable Segments], ``find_expandable_block``, ``map_block``,
  ``try_allocate_expandable_block``, ``unmap_block``): one segment of virtual address space per
  (stream, pool), pages of kSmallBuffer (2 MiB, small pool) or kLargeBuffer (20 MiB, large
  pool). A request first goes through the same best fit over the free *mapped* blocks, where a
  block followed by the unmapped tail counts as its size plus the tail's ("expandable_size":
  the search steps past it to any other fitting block whose expandable size is smaller). A
  request no free block fits is served at the lowest address where free and unmapped space
  together fit it: the free block just before the unmapped tail, if any, plus newly mapped
  pages (request minus that free block, rounded up to whole pages). A free block in the
  middle of the segment (allocated blocks on both sides) serves only requests that fit in it.
  Pages are unmapped only by ``release_cached_blocks`` (on an allocation failure or
  ``empty_cache``), never on a plain free.

Left out (no effect on the GPU records' event streams, or not knowable from a trace):
``record_stream`` / cross-stream events (FSDP2 uses none: it keeps references and waits on
events instead), CUDA-graph private pools, ``garbage_collection_threshold``,
``roundup_power2_divisions``, ``set_per_process_memory_fraction``, IPC, the free-memory
callbacks, and the addresses cudaMalloc returns (new segments get increasing addresses: the
best-fit tie-break between equal-sized blocks in different segments is by address).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Hashable, Iterable

K_MIN_BLOCK = 512  # kMinBlockSize
K_SMALL_SIZE = 1 << 20  # kSmallSize: largest "small" request, 1 MiB
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: small segments (and small expandable pages), 2 MiB
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: 20 MiB segments (and large expandable pages)
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests below get a 20 MiB segment
K_ROUND_LARGE = 2 << 20  # kRoundLarge: larger segments rounded to 2 MiB
NO_LIMIT = 1 << 62  # CUDAAllocatorConfig::max_split_size() default (SIZE_MAX)
_ADDRESS_SPACE = 1 << 44  # virtual space of one expandable segment (unbounded here)


class OutOfMemory(RuntimeError):
    """The emulated device could not hold a request even after releasing cached blocks."""


def round_size(size: int) -> int:
    """``round_size``: at least 512 B, a multiple of 512 B."""
    return max(K_MIN_BLOCK, -(-size // K_MIN_BLOCK) * K_MIN_BLOCK)


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment a miss cudaMallocs for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(eq=False)
class Block:
    """A range of one segment: allocated, free (cached) or, in an expandable segment, not
    mapped to physical pages."""

    seg: int
    ptr: int
    size: int
    stream: Hashable
    small: bool
    allocated: bool = False
    mapped: bool = True
    expandable: bool = False
    prev: Block | None = None
    next: Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


@dataclass
class _Pool:
    """The free mapped blocks of one (pool, stream), sorted by (size, address), and its
    unmapped blocks (expandable segments)."""

    keys: list[tuple[int, int]] = field(default_factory=list)
    blocks: dict[tuple[int, int], Block] = field(default_factory=dict)
    unmapped: list[Block] = field(default_factory=list)

    def insert(self, b: Block) -> None:
        k = (b.size, b.ptr)
        bisect.insort(self.keys, k)
        self.blocks[k] = b

    def remove(self, b: Block) -> None:
        k = (b.size, b.ptr)
        i = bisect.bisect_left(self.keys, k)
        assert self.keys[i] == k, "free block not in its pool"
        del self.keys[i]
        del self.blocks[k]


class CachingAllocator:
    """The allocator of one device. ``malloc(key, size, stream)`` and ``free(key)`` replay a
    program's requests; ``allocated``, ``reserved`` and their peaks are the counters
    ``torch.cuda.memory_allocated`` / ``memory_reserved`` / ``max_memory_*`` read."""

    def __init__(self, *, expandable: bool = False, capacity: int = NO_LIMIT,
                 max_split_size: int = NO_LIMIT) -> None:
        self.expandable = expandable
        self.capacity = capacity  # bytes the device can map/cudaMalloc in all
        self.max_split = max_split_size
        self.pools: dict[tuple[bool, Hashable], _Pool] = {}
        self.live: dict[Hashable, Block] = {}
        self.allocated = 0
        self.reserved = 0
        self.max_allocated = 0
        self.max_reserved = 0
        self.num_alloc_retries = 0
        self.num_segments = 0
        self._next_addr = 1 << 32
        self.growths: list[tuple[int, int, int, int]] = []
        """Every growth of reserved: (request number, bytes added, request's rounded size,
        bytes allocated before the request), for finding which requests made the peak."""
        self.n_requests = 0
        self._request = 0
        self.by_stream: dict[Hashable, list[int]] = {}
        """Per stream: [allocated, reserved] bytes now."""
        self.at_peak: dict[Hashable, tuple[int, int]] = {}
        """Per stream: (allocated, reserved) when reserved last reached its peak."""
        self.peak_request: tuple[Hashable, int] = (0, 0)
        """The (stream, rounded size) of the request that made reserved reach its peak."""

    # ------------------------------------------------------------------ the public calls

    def malloc(self, key: Hashable, size: int, stream: Hashable = 0) -> Block:
        if key in self.live:
            raise KeyError(f"allocation {key!r} is live already")
        size = round_size(size)
        self.n_requests += 1
        self._request = size
        small = size <= K_SMALL_SIZE
        pool = self._pool(small, stream)
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, small, stream, size)
        if block is None and self.max_split < NO_LIMIT:
            if self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, small, stream, size)
        if block is None:
            self.num_alloc_retries += 1
            self._release_cached_blocks()
            block = self._alloc_block(pool, small, stream, size)
        if block is None:
            raise OutOfMemory(f"request of {size} B: reserved {self.reserved} B of "
                              f"{self.capacity} B")
        block = self._split(pool, block, size)
        block.allocated = True
        self.live[key] = block
        self.allocated += block.size
        self._stream(stream)[0] += block.size
        self.max_allocated = max(self.max_allocated, self.allocated)
        return block

    def free(self, key: Hashable) -> None:
        block = self.live.pop(key)
        block.allocated = False
        self.allocated -= block.size
        self._stream(block.stream)[0] -= block.size
        pool = self._pool(block.small, block.stream)
        for other in (block.prev, block.next):
            self._merge(pool, block, other)
        pool.insert(block)

    def cached_at_peak(self) -> dict[Hashable, int]:
        """Per stream: reserved - allocated when reserved reached its peak, the request that
        reached it counted as allocated (what that stream's pool held free then)."""
        out = {s: r - a for s, (a, r) in self.at_peak.items()}
        s, size = self.peak_request
        if s in out:
            out[s] -= size
        return out

    def default_stream_hole(self, stream: Hashable = 0) -> int:
        """What ``stream``'s own pool keeps beyond the allocated peak: max reserved - max
        allocated - what the *other* streams held free when reserved peaked. With fixed
        segments this is the term the planner's ``fragmentation`` stands for (docs/model.md
        §7.4): blocks split by best fit whose free rest no later request fits."""
        others = sum(v for k, v in self.cached_at_peak().items() if k != stream)
        return self.max_reserved - self.max_allocated - others

    def empty_cache(self) -> None:
        self._release_cached_blocks()

    def replay(self, events: Iterable[tuple]) -> CachingAllocator:
        """Replays ``("alloc", key, size, stream)`` and ``("free", key)`` events."""
        for ev in events:
            if ev[0] == "alloc":
                self.malloc(ev[1], ev[2], ev[3] if len(ev) > 3 else 0)
            elif ev[0] == "free":
                self.free(ev[1])
            else:
                raise ValueError(f"event kind must be 'alloc' or 'free', got {ev[0]!r}")
        return self

    # ------------------------------------------------------------------ the search

    def _pool(self, small: bool, stream: Hashable) -> _Pool:
        return self.pools.setdefault((small, stream), _Pool())

    def _expandable_size(self, b: Block) -> int:
        nxt = b.next
        return b.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def _get_free_block(self, pool: _Pool, size: int) -> Block | None:
        """``get_free_block``: best fit by (size, address) in the (pool, stream)."""
        i = bisect.bisect_left(pool.keys, (size, -1))
        if i == len(pool.keys):
            return None
        b = pool.blocks[pool.keys[i]]
        if b.expandable:
            # the block at the end of the mapped range counts as what it can grow to
            while i + 1 < len(pool.keys):
                nb = pool.blocks[pool.keys[i + 1]]
                if self._expandable_size(nb) < self._expandable_size(b):
                    i, b = i + 1, nb
                else:
                    break
        if size < self.max_split <= b.size:
            return None
        if size >= self.max_split and b.size >= size + K_LARGE_BUFFER:
            return None
        pool.remove(b)
        return b

    def _should_split(self, b: Block, size: int) -> bool:
        remaining = b.size - size
        if b.small or self.expandable:
            return remaining >= K_MIN_BLOCK
        return size < self.max_split and remaining > K_SMALL_SIZE

    def _split(self, pool: _Pool, b: Block, size: int) -> Block:
        """``alloc_found_block``: the request takes the block's front; the rest stays free."""
        if not self._should_split(b, size):
            return b
        front = Block(b.seg, b.ptr, size, b.stream, b.small, expandable=b.expandable,
                      prev=b.prev, next=b)
        if b.prev is not None:
            b.prev.next = front
        b.prev = front
        b.ptr += size
        b.size -= size
        pool.insert(b)
        return front

    def _merge(self, pool: _Pool, dst: Block, src: Block | None) -> None:
        """``try_merge_blocks``: ``src`` (a neighbour) joins ``dst`` if free and mapped alike."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            pool.remove(src)
        else:
            pool.unmapped.remove(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    # ------------------------------------------------------------------ a miss

    def _alloc_block(self, pool: _Pool, small: bool, stream: Hashable,
                     size: int) -> Block | None:
        if self.expandable:
            return self._expandable_block(pool, small, stream, size)
        seg_size = allocation_size(size)
        if self.reserved + seg_size > self.capacity:
            return None
        self._grow(seg_size, stream)
        self.num_segments += 1
        ptr = self._next_addr
        self._next_addr += seg_size + (1 << 21)
        return Block(self.num_segments, ptr, seg_size, stream, small)

    def _expandable_block(self, pool: _Pool, small: bool, stream: Hashable,
                          size: int) -> Block | None:
        """``try_allocate_expandable_block``: the lowest address where free + unmapped space
        fits ``size``, mapping whole pages."""
        cand = self._find_expandable_block(pool, small, stream, size)
        if not cand.mapped and not self._map(pool, cand, min(cand.size, size)):
            return None
        while cand.size < size:
            nxt = cand.next
            assert nxt is not None and not nxt.mapped
            if not self._map(pool, nxt, min(size - cand.size, nxt.size)):
                return None
            cand = nxt  # map merged the old candidate into it
        pool.remove(cand)
        return cand

    def _find_expandable_block(self, pool: _Pool, small: bool, stream: Hashable,
                               size: int) -> Block:
        def allocatable(b: Block | None) -> bool:
            return b is not None and not b.allocated

        def room(b: Block | None) -> bool:
            total = 0
            while total < size and allocatable(b):
                total += b.size
                b = b.next
            return total >= size

        for c in sorted(pool.unmapped, key=lambda b: b.ptr):
            if allocatable(c.prev):
                c = c.prev
            if room(c):
                return c
        self.num_segments += 1
        ptr = self._next_addr
        self._next_addr += _ADDRESS_SPACE
        seg = Block(self.num_segments, ptr, _ADDRESS_SPACE, stream, small, mapped=False,
                    expandable=True)
        pool.unmapped.append(seg)
        return seg

    def _map(self, pool: _Pool, b: Block, size: int) -> bool:
        """``map_block``: pages from ``b``'s start covering ``size`` become mapped and free
        (merged with a free mapped neighbour); the rest of ``b`` stays unmapped."""
        page = K_SMALL_BUFFER if b.small else K_LARGE_BUFFER
        mapped = -(-size // page) * page
        if self.reserved + mapped > self.capacity:
            return False
        pool.unmapped.remove(b)
        if mapped < b.size:
            rest = Block(b.seg, b.ptr + mapped, b.size - mapped, b.stream, b.small,
                         mapped=False, expandable=True, prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            pool.unmapped.append(rest)
            b.size = mapped
        b.mapped = True
        self._merge(pool, b, b.prev)
        self._merge(pool, b, b.next)
        pool.insert(b)
        self._grow(mapped, b.stream)
        return True

    def _stream(self, stream: Hashable) -> list[int]:
        return self.by_stream.setdefault(stream, [0, 0])

    def _grow(self, nbytes: int, stream: Hashable) -> None:
        self.reserved += nbytes
        self._stream(stream)[1] += nbytes
        if self.reserved > self.max_reserved:
            self.max_reserved = self.reserved
            # the request being served is not counted as allocated yet
            self.at_peak = {s: (a, r) for s, (a, r) in self.by_stream.items()}
            self.peak_request = (stream, self._request)
        self.growths.append((self.n_requests, nbytes, self._request, self.allocated))

    # ------------------------------------------------------------------ releasing the cache

    def _release_available_cached_blocks(self, pool: _Pool, size: int) -> bool:
        """``release_available_cached_blocks`` (max_split_size set): cudaFree the smallest
        oversize cached block >= the request, or the largest ones until enough is freed."""
        want = max(size, self.max_split)
        whole = [pool.blocks[k] for k in pool.keys
                 if pool.blocks[k].size >= self.max_split and not pool.blocks[k].is_split()]
        fits = [b for b in whole if b.size >= want]
        if fits:
            self._release_block(pool, fits[0])
            return True
        freed = 0
        for b in reversed(whole):
            if freed >= want:
                break
            freed += b.size
            self._release_block(pool, b)
        return freed >= want

    def _release_block(self, pool: _Pool, b: Block) -> None:
        pool.remove(b)
        self.reserved -= b.size
        self._stream(b.stream)[1] -= b.size

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks``: cudaFree every wholly free segment; unmap the whole
        pages inside every free expandable block (``unmap_block``)."""
        for pool in self.pools.values():
            for b in [pool.blocks[k] for k in list(pool.keys)]:
                if b.expandable:
                    self._unmap(pool, b)
                elif not b.is_split():
                    self._release_block(pool, b)

    def _unmap(self, pool: _Pool, b: Block) -> None:
        page = K_SMALL_BUFFER if b.small else K_LARGE_BUFFER
        start = self._segment_start(b)  # pages are aligned to the segment's start
        lo = start + -(-(b.ptr - start) // page) * page
        hi = start + (b.ptr + b.size - start) // page * page
        if hi <= lo:
            return
        pool.remove(b)
        if lo > b.ptr:
            before = Block(b.seg, b.ptr, lo - b.ptr, b.stream, b.small, expandable=True,
                           prev=b.prev, next=b)
            if b.prev is not None:
                b.prev.next = before
            b.prev = before
            pool.insert(before)
        if hi < b.ptr + b.size:
            after = Block(b.seg, hi, b.ptr + b.size - hi, b.stream, b.small, expandable=True,
                          prev=b, next=b.next)
            if b.next is not None:
                b.next.prev = after
            b.next = after
            pool.insert(after)
        b.ptr, b.size, b.mapped = lo, hi - lo, False
        self.reserved -= hi - lo
        self._stream(b.stream)[1] -= hi - lo
        pool.unmapped.append(b)
        for other in (b.prev, b.next):
            if other is not None and not other.mapped and not other.allocated:
                self._merge(pool, b, other)

    @staticmethod
    def _segment_start(b: Block) -> int:
        while b.prev is not None:
            b = b.prev
        return b.ptr
