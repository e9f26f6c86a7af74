/* alloc_sim.c — the model of PyTorch's caching allocator: reserved bytes (replay.h). */
#include "replay.h"

#include <stdlib.h>

static uint64_t seg_size(uint64_t rs)
{
    if (rs <= (1u << 20))
        return 2u << 20;               /* kSmallBuffer */
    if (rs < (10u << 20))
        return 20u << 20;              /* kLargeBuffer */
    return mp_ceil_div(rs, 2u << 20) * (2u << 20); /* kRoundLarge */
}

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

static int new_blk(struct alloc_sim *a)
{
    if (a->n_dead)
        return a->dead[--a->n_dead];
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 256;
        struct ablk *nb = realloc(a->b, (size_t)nc * sizeof *nb);
        if (!nb) {
            a->nomem = true;
            return -1;
        }
        a->b = nb;
        a->cap = nc;
    }
    return a->n++;
}

static void free_list_add(struct alloc_sim *a, int i)
{
    a->b[i].free_pos = a->n_free;
    if (!push_int(&a->freel, &a->n_free, &a->cap_free, i))
        a->nomem = true;
}

static void free_list_del(struct alloc_sim *a, int i)
{
    int pos = a->b[i].free_pos, last = a->freel[--a->n_free];
    a->freel[pos] = last;
    a->b[last].free_pos = pos;
    a->b[i].free_pos = -1;
}

/* Best fit among free blocks of the same pool; split when the remainder is
 * >= 512 (small pool) or > 1 MiB (large pool); else a new segment.  Returns
 * the block, or -1 if the model itself ran out of memory. */
int asim_alloc(struct alloc_sim *a, uint64_t bytes)
{
    uint64_t rs = mp_round512(bytes);
    bool small = rs <= (1u << 20);
    int best = -1;
    for (int k = 0; k < a->n_free; k++) {
        int i = a->freel[k];
        if (a->b[i].small != small || a->b[i].size < rs)
            continue;
        if (best < 0 || a->b[i].size < a->b[best].size)
            best = i;
        if (a->b[i].size == rs)
            break; /* nothing smaller can fit: the first exact fit is the best fit */
    }
    if (best < 0) {
        best = new_blk(a);
        if (best < 0)
            return -1;
        uint64_t ss = seg_size(rs);
        if (ss < rs || !mp_add_u64(a->reserved, ss, &a->reserved)) { /* (a rounded size that wrapped) */
            a->overflow = true;
            return -1;
        }
        a->b[best] = (struct ablk){.size = ss, .prev = -1, .next = -1, .free_pos = -1, .small = small};
        free_list_add(a, best);
        if (a->reserved > a->peak_reserved)
            a->peak_reserved = a->reserved;
    }
    uint64_t rem = a->b[best].size - rs;
    if (small ? rem >= 512 : rem > (1u << 20)) {
        int r = new_blk(a);
        if (r < 0)
            return -1;
        a->b[r] = (struct ablk){.size = rem, .prev = best, .next = a->b[best].next, .free_pos = -1, .small = small};
        if (a->b[best].next >= 0)
            a->b[a->b[best].next].prev = r;
        a->b[best].next = r;
        a->b[best].size = rs;
        free_list_add(a, r);
    }
    free_list_del(a, best);
    return a->nomem ? -1 : best;
}

static void asim_merge(struct alloc_sim *a, int i, int j) /* j follows i; both free; j is absorbed */
{
    free_list_del(a, j);
    a->b[i].size += a->b[j].size;
    a->b[i].next = a->b[j].next;
    if (a->b[j].next >= 0)
        a->b[a->b[j].next].prev = i;
    if (!push_int(&a->dead, &a->n_dead, &a->cap_dead, j))
        a->nomem = true;
}

void asim_free(struct alloc_sim *a, int i)
{
    free_list_add(a, i);
    int nx = a->b[i].next, pv = a->b[i].prev;
    if (nx >= 0 && a->b[nx].free_pos >= 0)
        asim_merge(a, i, nx);
    if (pv >= 0 && a->b[pv].free_pos >= 0)
        asim_merge(a, pv, i);
}

void asim_release(struct alloc_sim *a)
{
    free(a->b);
    free(a->dead);
    free(a->freel);
}
