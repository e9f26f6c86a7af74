#!/usr/bin/env python3
"""cca_ref.py - an independent reference of PyTorch's CUDA caching allocator (default settings:
no max_split_size, no expandable segments, no garbage-collection threshold), over a trace of
allocations and frees.  Written from c10/cuda/CUDACachingAllocator.cpp (torch 2.11; the names
below are its functions), not from memplan's alloc_sim.c, so that the two can be compared.

  round_size         a request is rounded up to a multiple of kMinBlockSize (512 B), 512 at least
  get_pool           <= kSmallSize (1 MiB): the small pool, else the large pool
  get_free_block     the pool's smallest free block of at least the rounded size (std::set
                     ordered by size, then address: lower_bound)
  get_allocation_size  a new segment: kSmallBuffer (2 MiB) for the small pool, kLargeBuffer
                     (20 MiB) below kMinLargeAlloc (10 MiB), else the size rounded up to
                     kRoundLarge (2 MiB)
  alloc_found_block  the block is split when what remains is >= kMinBlockSize (small pool) or
                     > kSmallSize (large pool): the request takes the front, the rest stays free
  free_block         the block merges with a free previous and a free next block of its segment
  release_cached_blocks (empty_cache)  every free block that is a whole segment goes back
A segment's address comes after every earlier one (cudaMalloc's, on an idle device).

Trace lines (bench/alloc/torch_trace.py writes them; memplan's MEMPLAN_ALLOC_TRACE too):
  a ID BYTES [...] | f ID | e (empty_cache) | r (reset_peak_memory_stats) | m NAME | x ID (ID is
  a host allocation: its events are dropped).  memplan's allocation lines go on with the store,
  the prim and the node (ignored here); an ID may be allocated again once it has been freed.
Usage: python3 bench/alloc/cca_ref.py TRACE [--from MARK]   (peak reserved after MARK, e.g.
  "step 1": what torch.cuda.max_memory_reserved() says after reset_peak_memory_stats there)
"""
import argparse
import bisect
import sys

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20


class Block:
    __slots__ = ("addr", "size", "prev", "next", "allocated", "small")

    def __init__(self, addr, size, small):
        self.addr, self.size, self.small = addr, size, small
        self.prev = self.next = None
        self.allocated = False


class Allocator:
    def __init__(self):
        self.pools = {True: [], False: []}   # sorted [(size, addr, block)]
        self.next_addr = 1 << 40
        self.reserved = self.allocated = 0
        self.peak_reserved = self.peak_allocated = 0
        self.segments = 0

    @staticmethod
    def round_size(n):
        return K_MIN_BLOCK if n < K_MIN_BLOCK else (n + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK

    @staticmethod
    def allocation_size(rs):
        if rs <= K_SMALL_SIZE:
            return K_SMALL_BUFFER
        if rs < K_MIN_LARGE_ALLOC:
            return K_LARGE_BUFFER
        return (rs + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE

    def _insert(self, b):
        bisect.insort(self.pools[b.small], (b.size, b.addr, id(b), b))

    def _remove(self, b):
        pool = self.pools[b.small]
        i = bisect.bisect_left(pool, (b.size, b.addr))
        assert pool[i][3] is b
        del pool[i]

    def malloc(self, nbytes):
        rs = self.round_size(nbytes)
        small = rs <= K_SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (rs, 0))
        if i < len(pool):
            b = pool[i][3]
            del pool[i]
        else:
            size = self.allocation_size(rs)
            b = Block(self.next_addr, size, small)
            self.next_addr += size
            self.reserved += size
            self.segments += 1
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rem = b.size - rs
        if (small and rem >= K_MIN_BLOCK) or (not small and rem > K_SMALL_SIZE):
            r = Block(b.addr + rs, rem, small)
            r.prev, r.next = b, b.next
            if b.next:
                b.next.prev = r
            b.next = r
            b.size = rs
            self._insert(r)
        b.allocated = True
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b

    def free(self, b):
        b.allocated = False
        self.allocated -= b.size
        for nb in (b.prev, b.next):
            if nb is not None and not nb.allocated:
                self._remove(nb)
                if nb is b.prev:
                    nb.size += b.size
                    nb.next = b.next
                    if b.next:
                        b.next.prev = nb
                    b = nb
                else:
                    b.size += nb.size
                    b.next = nb.next
                    if nb.next:
                        nb.next.prev = b
        self._insert(b)

    def empty_cache(self):
        for pool in self.pools.values():
            keep = []
            for e in pool:
                b = e[3]
                if b.prev is None and b.next is None:
                    self.reserved -= b.size
                    self.segments -= 1
                else:
                    keep.append(e)
            pool[:] = keep

    def reset_peak(self):
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated


def read_trace(path):
    with open(path) as f:
        lines = [ln.split() for ln in f if ln.strip()]
    host = {w[1] for w in lines if w[0] == "x"}
    return [w for w in lines if w[0] != "x" and not (w[0] in "af" and w[1] in host)]


def run(events, reset_at=None, marks=False):
    """Replays events; returns (allocator, {mark: (reserved, allocated, peak_reserved)})."""
    al, live, seen = Allocator(), {}, {}
    for w in events:
        k = w[0]
        if k == "a":
            live[w[1]] = al.malloc(int(w[2]))
        elif k == "f":
            b = live.pop(w[1], None)
            if b is not None:
                al.free(b)
        elif k == "e":
            al.empty_cache()
        elif k == "r":
            al.reset_peak()
        elif k == "m":
            name = " ".join(w[1:])
            if name == reset_at:
                al.reset_peak()
            if marks:
                seen.setdefault(name, []).append((al.reserved, al.allocated, al.peak_reserved))
    return al, seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--from", dest="frm", default=None, help="reset the peaks at this mark")
    a = ap.parse_args()
    al, _ = run(read_trace(a.trace), a.frm)
    g = 1 << 30
    print("peak reserved %.3f GiB, peak allocated %.3f GiB, reserved now %.3f GiB, %d segments"
          % (al.peak_reserved / g, al.peak_allocated / g, al.reserved / g, al.segments))


if __name__ == "__main__":
    sys.exit(main())
