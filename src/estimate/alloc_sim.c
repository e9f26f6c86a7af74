/* alloc_sim.c — a simulation of PyTorch's CUDA caching allocator (estimate.h, mp_asim_*).
 *
 * Written from the facts of pytorch c10/cuda/CUDACachingAllocator.cpp (DeviceCachingAllocator, torch
 * 2.15: the functions named at each rule) and the constants of c10/core/AllocatorConfig.h
 * (kMinBlockSize 512, kSmallSize 1 MiB, kSmallBuffer 2 MiB, kMinLargeAlloc 10 MiB, kRoundLarge
 * 2 MiB; large_segment_size 20 MiB).  One device, one stream (memplan's step runs on one), so the
 * pools order blocks by (size, address).  Segment addresses are made up (increasing in creation
 * order): where two free blocks have the same size the older one is taken; cudaMalloc's real
 * addresses decide that on a device.  docs/memory-facts.md#caching-allocator lists the rules. */
#include "replay.h"

#include <stdlib.h>
#include <string.h>

#define MIB (UINT64_C(1) << 20)
#define SMALL_SIZE MIB            /* kSmallSize: the largest small-pool request */
#define SMALL_BUFFER (2 * MIB)    /* kSmallBuffer: a small-pool segment / expandable page */
#define MIN_LARGE_ALLOC (10 * MIB) /* kMinLargeAlloc */
#define ROUND_LARGE (2 * MIB)     /* kRoundLarge */

static bool push_int(int **arr, int *n, int *cap, int v)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 256;
        int *na = realloc(*arr, (size_t)nc * sizeof *na);
        if (!na)
            return false;
        *arr = na;
        *cap = nc;
    }
    (*arr)[(*n)++] = v;
    return true;
}

void mp_asim_init(struct mp_asim *a, const struct mp_alloc_conf *c, uint64_t limit, uint64_t total)
{
    memset(a, 0, sizeof *a);
    if (c)
        a->conf = *c;
    else
        mp_alloc_conf_default(&a->conf);
    a->limit = limit;
    a->total = total;
    a->es[0] = a->es[1] = -1;
    a->next_addr = UINT64_C(1) << 40;
}

void mp_asim_release(struct mp_asim *a)
{
    free(a->b);
    free(a->dead);
    free(a->fl[0]);
    free(a->fl[1]);
    free(a->fk[0]);
    free(a->fk[1]);
    a->fk[0] = a->fk[1] = NULL;
    a->b = NULL;
    a->dead = a->fl[0] = a->fl[1] = NULL;
}

static int new_blk(struct mp_asim *a)
{
    if (a->n_dead)
        return a->dead[--a->n_dead];
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 256;
        struct mp_asim_blk *nb = realloc(a->b, (size_t)nc * sizeof *nb);
        if (!nb) {
            a->nomem = true;
            return -1;
        }
        a->b = nb;
        a->cap = nc;
    }
    return a->n++;
}

static void kill_blk(struct mp_asim *a, int i)
{
    if (!push_int(&a->dead, &a->n_dead, &a->cap_dead, i))
        a->nomem = true;
}

static int pool_ix(bool small) { return small ? 1 : 0; }

/* The position of the first free block of the pool at or after (size, addr): the pools' order
 * (BlockComparatorSize) is size, then address. */
static int lb_pos(const struct mp_asim *a, int p, uint64_t size, uint64_t addr)
{
    const struct mp_asim_key *k = a->fk[p];
    int lo = 0, hi = a->nfl[p];
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (k[mid].size < size || (k[mid].size == size && k[mid].addr < addr))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* BlockPool::insert_into_blocks: a free block enters its pool; its age counts from now. */
static void free_list_add(struct mp_asim *a, int i)
{
    int p = pool_ix(a->b[i].small);
    if (a->nfl[p] == a->capfl[p]) {
        int nc = a->capfl[p] ? a->capfl[p] * 2 : 256;
        int *na = realloc(a->fl[p], (size_t)nc * sizeof *na);
        if (na)
            a->fl[p] = na;
        struct mp_asim_key *nk = realloc(a->fk[p], (size_t)nc * sizeof *nk);
        if (nk)
            a->fk[p] = nk;
        if (!na || !nk) {
            a->nomem = true;
            return;
        }
        a->capfl[p] = nc;
    }
    int pos = lb_pos(a, p, a->b[i].size, a->b[i].addr);
    memmove(&a->fl[p][pos + 1], &a->fl[p][pos], (size_t)(a->nfl[p] - pos) * sizeof(int));
    memmove(&a->fk[p][pos + 1], &a->fk[p][pos], (size_t)(a->nfl[p] - pos) * sizeof a->fk[p][0]);
    a->fl[p][pos] = i;
    a->fk[p][pos] = (struct mp_asim_key){a->b[i].size, a->b[i].addr};
    a->nfl[p]++;
    a->b[i].free_pos = 1;
    a->b[i].gc_base = a->gc_calls[p];
}

static void free_list_del(struct mp_asim *a, int i)
{
    int p = pool_ix(a->b[i].small), pos = lb_pos(a, p, a->b[i].size, a->b[i].addr);
    if (pos >= a->nfl[p] || a->fl[p][pos] != i) { /* (cannot happen: the list is kept sorted) */
        a->nomem = true;
        return;
    }
    memmove(&a->fl[p][pos], &a->fl[p][pos + 1], (size_t)(a->nfl[p] - pos - 1) * sizeof(int));
    memmove(&a->fk[p][pos], &a->fk[p][pos + 1], (size_t)(a->nfl[p] - pos - 1) * sizeof a->fk[p][0]);
    a->nfl[p]--;
    a->b[i].free_pos = -1;
}

static bool is_free(const struct mp_asim *a, int i) { return i >= 0 && a->b[i].free_pos >= 0; }
static bool is_unmapped(const struct mp_asim *a, int i) { return i >= 0 && !a->b[i].mapped; }

/* The first free block of the pool at or after (size, addr) in the pool's order, -1 none
 * (std::set::lower_bound / the next element). */
static int lower_bound(const struct mp_asim *a, bool small, uint64_t size, uint64_t addr)
{
    int p = pool_ix(small), pos = lb_pos(a, p, size, addr);
    return pos < a->nfl[p] ? a->fl[p][pos] : -1;
}

/* The last free block of the pool before (size, addr), -1 none. */
static int below(const struct mp_asim *a, bool small, uint64_t size, uint64_t addr)
{
    int p = pool_ix(small), pos = lb_pos(a, p, size, addr);
    return pos > 0 ? a->fl[p][pos - 1] : -1;
}

/* try_merge_blocks: j follows i (neither in a free list, mapped alike); j is absorbed into i. */
static void absorb(struct mp_asim *a, int i, int j)
{
    a->b[i].size += a->b[j].size;
    a->b[i].next = a->b[j].next;
    if (a->b[j].next >= 0)
        a->b[a->b[j].next].prev = i;
    kill_blk(a, j);
}

/* free_block: free mapped block i (not yet in its pool) merged with its free mapped neighbours,
 * and the result into the pool; returns it. */
static int merge_free(struct mp_asim *a, int i)
{
    int nx = a->b[i].next, pv = a->b[i].prev;
    if (is_free(a, nx)) {
        free_list_del(a, nx);
        absorb(a, i, nx);
    }
    if (is_free(a, pv)) {
        free_list_del(a, pv);
        absorb(a, pv, i);
        i = pv;
    }
    free_list_add(a, i);
    return i;
}

/* A new block after i holding i's last `rest` bytes (i keeps the rest); flags copied. */
static int split_off(struct mp_asim *a, int i, uint64_t rest)
{
    int r = new_blk(a);
    if (r < 0)
        return -1;
    a->b[r] = a->b[i];
    a->b[r].addr = a->b[i].addr + (a->b[i].size - rest);
    a->b[r].size = rest;
    a->b[r].prev = i;
    a->b[r].free_pos = -1;
    if (a->b[i].next >= 0)
        a->b[a->b[i].next].prev = r;
    a->b[i].next = r;
    a->b[i].size -= rest;
    return r;
}

static uint64_t page_of(const struct mp_asim *a, bool small)
{
    /* find_expandable_block: kSmallBuffer pages for the small pool, large_segment_size else */
    return small ? SMALL_BUFFER : a->conf.large_segment_size;
}

static bool gc_on(const struct mp_asim *a)
{
    /* malloc / get_free_block: garbage collection runs only with a memory fraction set */
    return a->conf.gc_threshold > 0 && a->conf.memory_fraction > 0 && a->total;
}

static uint64_t allowed_max(const struct mp_asim *a)
{
    return (uint64_t)((double)a->total * a->conf.memory_fraction); /* allowed_memory_maximum */
}

/* expandable_size in get_free_block: a block before unmapped pages may grow into them. */
static uint64_t exp_size(const struct mp_asim *a, int i)
{
    int nx = a->b[i].next;
    return a->b[i].size + (is_unmapped(a, nx) ? a->b[nx].size : 0);
}

/* get_free_block: the pool's best fit, or -1. */
static int get_free_block(struct mp_asim *a, bool small, uint64_t rs)
{
    if (gc_on(a))
        a->gc_calls[pool_ix(small)]++;
    int it = lower_bound(a, small, rs, 0);
    if (it < 0)
        return -1;
    if (a->b[it].expandable && a->conf.expandable) {
        /* a block that could grow counts as its grown size: a later block that cannot is taken */
        for (int nx = lower_bound(a, small, a->b[it].size, a->b[it].addr + 1);
             a->b[it].expandable && nx >= 0 && exp_size(a, nx) < exp_size(a, it);
             nx = lower_bound(a, small, a->b[it].size, a->b[it].addr + 1))
            it = nx;
    }
    uint64_t mss = a->conf.max_split_size;
    if (rs < mss && a->b[it].size >= mss)
        return -1; /* no oversize block for a request under max_split_size */
    if (rs >= mss && a->b[it].size - rs >= a->conf.max_non_split_rounding)
        return -1; /* an oversize block only within max_non_split_rounding (20 MiB) of the request */
    return it;
}

/* release_block: a whole (never split, or merged back) segment goes back to the driver. */
static void release_segment(struct mp_asim *a, int i)
{
    free_list_del(a, i);
    a->reserved -= a->b[i].size;
    kill_blk(a, i);
}

static bool whole_segment(const struct mp_asim *a, int i)
{
    return !a->b[i].expandable && a->b[i].prev < 0 && a->b[i].next < 0;
}

/* garbage_collect_cached_blocks: above garbage_collection_threshold x the allowed memory, free
 * whole large-pool segments whose age (get_free_block calls since they were freed) is at least
 * the mean age, pass after pass, until the excess is reclaimed or nothing is freed. */
static void garbage_collect(struct mp_asim *a)
{
    uint64_t thr = (uint64_t)(a->conf.gc_threshold * (double)allowed_max(a));
    if (a->reserved <= thr)
        return;
    uint64_t target = a->reserved - thr, got = 0;
    double total_age = 0;
    int count = 0;
    for (int k = 0; k < a->nfl[0]; k++) {
        int i = a->fl[0][k];
        if (whole_segment(a, i)) {
            total_age += (double)(a->gc_calls[0] - a->b[i].gc_base);
            count++;
        }
    }
    bool freed = true;
    while (got < target && freed && count > 0) {
        double mean = total_age / count;
        freed = false;
        for (int k = 0; k < a->nfl[0]; k++) {
            int i = a->fl[0][k];
            double age = (double)(a->gc_calls[0] - a->b[i].gc_base);
            if (!whole_segment(a, i) || age < mean)
                continue;
            got += a->b[i].size;
            total_age -= age;
            count--;
            freed = true;
            release_segment(a, i);
            k--; /* (the list moved down one) */
        }
    }
}

/* release_available_cached_blocks: with max_split_size set, free the smallest oversize block
 * that covers the request, else oversize blocks from the largest down until they cover it. */
static bool release_available(struct mp_asim *a, bool small, uint64_t rs)
{
    uint64_t mss = a->conf.max_split_size;
    if (mss == UINT64_MAX)
        return false;
    uint64_t key = rs < mss ? mss : rs;
    int it = lower_bound(a, small, key, 0);
    if (it >= 0 && !a->b[it].expandable) {
        if (!whole_segment(a, it))
            return false;
        release_segment(a, it);
        return true;
    }
    uint64_t bs = it >= 0 ? a->b[it].size : UINT64_MAX, ba = it >= 0 ? a->b[it].addr : UINT64_MAX;
    uint64_t total = 0;
    for (int c = below(a, small, bs, ba); c >= 0 && total < key && a->b[c].size >= mss;) {
        uint64_t cs = a->b[c].size, ca = a->b[c].addr;
        if (whole_segment(a, c)) {
            total += cs;
            release_segment(a, c);
        }
        c = below(a, small, cs, ca);
    }
    return total >= key;
}

/* unmap_block: the pages wholly inside free block i of an expandable segment are unmapped; the
 * mapped pieces before and after them stay free blocks, the unmapped one joins unmapped
 * neighbours. */
static void unmap_free(struct mp_asim *a, int i)
{
    uint64_t pg = page_of(a, a->b[i].small), lo = a->b[i].addr, hi = lo + a->b[i].size;
    uint64_t begin = (lo + pg - 1) / pg * pg, end = hi / pg * pg;
    if (begin >= end)
        return;
    free_list_del(a, i);
    int u = i;
    if (begin > lo) {
        if ((u = split_off(a, i, hi - begin)) < 0)
            return;
        free_list_add(a, i);
    }
    if (end < hi) {
        int t = split_off(a, u, hi - end);
        if (t < 0)
            return;
        free_list_add(a, t);
    }
    a->b[u].mapped = false;
    a->reserved -= end - begin;
    if (is_unmapped(a, a->b[u].next))
        absorb(a, u, a->b[u].next);
    if (is_unmapped(a, a->b[u].prev))
        absorb(a, a->b[u].prev, u);
}

/* release_cached_blocks (empty_cache): every whole segment of both pools; in expandable segments
 * the pages inside free blocks. */
void mp_asim_empty_cache(struct mp_asim *a)
{
    int n = a->nfl[0] + a->nfl[1], *list = malloc((size_t)(n ? n : 1) * sizeof *list);
    if (!list) {
        a->nomem = true;
        return;
    }
    if (a->nfl[0]) /* (an empty list may have no storage: memcpy from NULL is undefined) */
        memcpy(list, a->fl[0], (size_t)a->nfl[0] * sizeof *list);
    if (a->nfl[1])
        memcpy(list + a->nfl[0], a->fl[1], (size_t)a->nfl[1] * sizeof *list);
    for (int k = 0; k < n; k++) {
        int i = list[k];
        if (a->b[i].expandable)
            unmap_free(a, i);
        else if (whole_segment(a, i))
            release_segment(a, i);
    }
    free(list);
}

/* map_block: m bytes at the start of unmapped block u are mapped and join the free blocks
 * around them; returns the free block holding them. */
static int map_pages(struct mp_asim *a, int u, uint64_t m)
{
    if (m < a->b[u].size && split_off(a, u, a->b[u].size - m) < 0)
        return -1;
    a->b[u].mapped = true;
    a->reserved += m;
    return merge_free(a, u);
}

/* The expandable segment of a pool (one per pool and stream), all unmapped at first.  Its
 * address space (9/8 of the device's memory in torch) is taken as unbounded: beyond the
 * device's memory the mapping fails first. */
static int expandable_head(struct mp_asim *a, bool small)
{
    int *h = &a->es[pool_ix(small)];
    if (*h >= 0)
        return *h;
    uint64_t pg = page_of(a, small), space = UINT64_C(1) << 50;
    space = space / pg * pg;
    int i = new_blk(a);
    if (i < 0)
        return -1;
    uint64_t base = (a->next_addr + pg - 1) / pg * pg; /* page-aligned, as the driver reserves it */
    a->b[i] = (struct mp_asim_blk){.addr = base, .size = space, .prev = -1, .next = -1, .free_pos = -1,
                                   .small = small, .expandable = true};
    a->next_addr = base + space;
    *h = i;
    return i;
}

/* try_allocate_expandable_block / find_expandable_block: the lowest run of free and unmapped
 * blocks (starting at the free block before an unmapped one) that holds rs, its pages mapped as
 * far as rs needs.  *need: the bytes it maps; with !commit nothing changes. */
static int expandable_block(struct mp_asim *a, bool small, uint64_t rs, bool commit, uint64_t *need)
{
    int h = expandable_head(a, small);
    if (h < 0)
        return -1;
    int c = -1;
    for (int u = h; u >= 0 && c < 0; u = a->b[u].next) {
        if (a->b[u].mapped)
            continue;
        int s = is_free(a, a->b[u].prev) ? a->b[u].prev : u;
        uint64_t bytes = 0;
        for (int x = s; x >= 0 && bytes < rs && (is_free(a, x) || is_unmapped(a, x)); x = a->b[x].next)
            bytes += a->b[x].size;
        if (bytes >= rs)
            c = s;
    }
    if (c < 0)
        return -1; /* the address space is used up */
    uint64_t pg = page_of(a, small), have = 0, m = 0;
    for (int x = c; x >= 0 && have < rs; x = a->b[x].next) {
        if (a->b[x].mapped) {
            have += a->b[x].size;
            continue;
        }
        uint64_t want = (rs - have + pg - 1) / pg * pg;
        uint64_t take = want < a->b[x].size ? want : a->b[x].size;
        m += take;
        have += take;
    }
    *need = m;
    if (!commit)
        return c;
    uint64_t addr = a->b[c].addr;
    have = a->b[c].mapped ? a->b[c].size : 0;
    int cur = c;
    if (!a->b[c].mapped) {
        uint64_t want = (rs + pg - 1) / pg * pg;
        if ((cur = map_pages(a, c, want < a->b[c].size ? want : a->b[c].size)) < 0)
            return -1;
    }
    while (a->b[cur].size - (addr - a->b[cur].addr) < rs) {
        int nx = a->b[cur].next;
        uint64_t got = a->b[cur].size - (addr - a->b[cur].addr);
        uint64_t want = (rs - got + pg - 1) / pg * pg;
        if (nx < 0 || (cur = map_pages(a, nx, want < a->b[nx].size ? want : a->b[nx].size)) < 0)
            return -1;
    }
    return cur;
}

/* get_allocation_size: the segment a new cudaMalloc makes for request rs. */
static uint64_t segment_size(const struct mp_asim *a, uint64_t rs)
{
    if (rs <= SMALL_SIZE)
        return SMALL_BUFFER;
    if (rs < MIN_LARGE_ALLOC)
        return a->conf.large_segment_size;
    return rs > UINT64_MAX - ROUND_LARGE ? 0 : (rs + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* alloc_block: a new segment (or an expandable segment's pages), within the memory fraction and
 * the device's limit unless forced; returns its free block or -1. */
static int alloc_block(struct mp_asim *a, bool small, uint64_t rs, bool retry, bool force)
{
    if (retry)
        a->retries++; /* num_alloc_retries */
    uint64_t size = segment_size(a, rs), need = size, sum;
    if (!size) {
        a->overflow = true;
        return -1;
    }
    if (!mp_add_u64(a->reserved, size, &sum)) {
        a->overflow = true;
        return -1;
    }
    if (!force && a->conf.memory_fraction > 0 && a->total && sum > allowed_max(a))
        return -1; /* set_fraction: beyond allowed_memory_maximum */
    int c = -1;
    if (a->conf.expandable) {
        if (expandable_block(a, small, rs, false, &need) < 0)
            return -1;
    }
    if (!mp_add_u64(a->reserved, need, &sum)) {
        a->overflow = true;
        return -1;
    }
    if (!force && a->limit && sum > a->limit)
        return -1; /* cudaMalloc: out of memory */
    if (a->conf.expandable)
        return expandable_block(a, small, rs, true, &need);
    if ((c = new_blk(a)) < 0)
        return -1;
    a->b[c] = (struct mp_asim_blk){.addr = a->next_addr, .size = size, .prev = -1, .next = -1, .free_pos = -1,
                                   .small = small, .mapped = true};
    a->next_addr += size;
    a->reserved = sum;
    free_list_add(a, c);
    return c;
}

/* should_split: the remainder of a block becomes a free block of its own. */
static bool should_split(const struct mp_asim *a, const struct mp_asim_blk *b, uint64_t rs)
{
    uint64_t rem = b->size - rs;
    if (b->small || a->conf.expandable)
        return rem >= 512; /* kMinBlockSize */
    return rs < a->conf.max_split_size && rem > SMALL_SIZE;
}

/* DeviceCachingAllocator::malloc. */
int mp_asim_alloc(struct mp_asim *a, uint64_t bytes)
{
    uint64_t rs = mp_alloc_round(&a->conf, bytes);
    if (!rs) {
        a->overflow = true;
        return -1;
    }
    bool small = rs <= SMALL_SIZE; /* get_pool */
    int blk = get_free_block(a, small, rs);
    if (blk < 0) {
        if (gc_on(a))
            garbage_collect(a);
        blk = alloc_block(a, small, rs, false, false);
        if (blk < 0 && !a->overflow && release_available(a, small, rs))
            blk = alloc_block(a, small, rs, false, false);
        if (blk < 0 && !a->overflow) {
            mp_asim_empty_cache(a); /* release_cached_blocks, then the counted retry */
            blk = alloc_block(a, small, rs, true, false);
        }
        if (blk < 0 && !a->overflow) { /* out of memory: noted, and from here on no limit (the
                                        * figures then say what the step would need) */
            if (!a->ooms++)
                a->oom_request = rs;
            a->limit = 0;
            blk = alloc_block(a, small, rs, false, true);
        }
        if (blk < 0 || a->nomem)
            return -1;
    }
    /* alloc_found_block */
    free_list_del(a, blk);
    if (should_split(a, &a->b[blk], rs)) {
        int r = split_off(a, blk, a->b[blk].size - rs);
        if (r < 0)
            return -1;
        free_list_add(a, r);
    }
    a->b[blk].allocated = true;
    a->allocated += a->b[blk].size;
    if (a->reserved > a->peak_reserved)
        a->peak_reserved = a->reserved;
    if (a->allocated > a->peak_allocated) { /* fragmentation where it matters: at the allocated peak */
        a->peak_allocated = a->allocated;
        a->frag_at_peak = a->reserved - a->allocated;
    }
    return a->nomem ? -1 : blk;
}

/* free_block: back to its pool, merged with free neighbours (mapped alike); stays reserved. */
void mp_asim_free(struct mp_asim *a, int i)
{
    a->b[i].allocated = false;
    a->allocated -= a->b[i].size;
    merge_free(a, i);
}
