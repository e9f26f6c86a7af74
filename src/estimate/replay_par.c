/* replay_par.c — data parallel: rank r's communication events in the replay (replay.h). */
#include "replay.h"

/* ---- data parallel: rank r's communication events (parallel.h; docs/memory-facts.md#ddp, docs/memory-facts.md#fsdp2, docs/memory-facts.md#zero) */

static bool par_on(const struct rp *r) { return r->pp != NULL; }

void comm(struct rp *r, bool alloc, size_t slot, enum mp_comm_kind k, uint64_t bytes)
{
    if (bytes)
        emit(r, alloc ? MP_EV_ALLOC : MP_EV_FREE, MP_ST_COMM, (int)(slot * MP_COMM_KINDS + k), bytes);
}

bool fsdp(const struct rp *r) { return par_on(r) && mp_par_is_fsdp(r->pp->par.strategy); }

static bool zero3(const struct rp *r) { return par_on(r) && r->pp->par.strategy == MP_PAR_ZERO3; }

/* Bytes of the group's unsharded parameters / flat buffers as gathered. */
static uint64_t g_unsharded(const struct rp *r, size_t g) { return r->pp->groups[g].unsharded_bytes; }

/* FSDP2 unshard (all-gather, copy-out) of group g; in forward the flat output is kept until
 * the next group's copy-out (implicit prefetch), otherwise freed right after the copy-out. */
static void fsdp_unshard(struct rp *r, size_t g, bool forward)
{
    if (r->uns[g])
        return;
    uint64_t flat = g_unsharded(r, g);
    if (!r->ag_pending[g]) {
        /* the shards' copies (cast to bf16, or brought from the host) held while the flat
         * output is made (none: comm skips 0 bytes) */
        comm(r, true, g, MP_COMM_COPY_IN, r->pp->groups[g].copyin_bytes);
        comm(r, true, g, MP_COMM_AG_OUT, flat);
        comm(r, false, g, MP_COMM_COPY_IN, r->pp->groups[g].copyin_bytes);
    }
    r->ag_pending[g] = false;
    if (forward && r->ag_held >= 0) {
        comm(r, false, (size_t)r->ag_held, MP_COMM_AG_OUT, g_unsharded(r, (size_t)r->ag_held));
        r->ag_held = -1;
    }
    comm(r, true, g, MP_COMM_UNSHARD, flat);
    r->uns[g] = true;
    if (forward)
        r->ag_held = (int)g;
    else
        comm(r, false, g, MP_COMM_AG_OUT, flat);
}

static void reshard(struct rp *r, size_t g)
{
    if (!r->uns[g])
        return;
    comm(r, false, g, MP_COMM_UNSHARD, g_unsharded(r, g));
    r->uns[g] = false;
}

/* ZeRO-3 fetch: the block's parameters gathered into their own storage (no flat copy). */
static void z3_fetch(struct rp *r, size_t g)
{
    if (r->uns[g])
        return;
    comm(r, true, g, MP_COMM_UNSHARD, g_unsharded(r, g));
    r->uns[g] = true;
}

/* ZeRO-3: a block that uses a parameter of another block (a tied embedding in the head)
 * has that block's group gathered for it too (DeepSpeed fetches every parameter of the
 * submodule it runs), released after it. */
static void z3_fetch_tied(struct rp *r, size_t i)
{
    const struct mp_block_prog *b = &r->p->blocks[i];
    for (size_t k = b->node0; k < b->node0 + b->n_nodes; k++)
        for (int j = 0; j < 2; j++) {
            int q = r->p->nodes[k].param[j];
            int o = q >= 0 ? r->p->params[q].block : -1;
            if (o < 0 || (size_t)o == i || mp_par_z3_persistent(r->pp, &r->p->params[q]))
                continue;
            size_t h = (size_t)r->pp->group_of_block[o];
            if (!r->uns[h]) {
                z3_fetch(r, h);
                r->borrow_list[r->n_borrow++] = h;
            }
        }
}

static void z3_release_tied(struct rp *r)
{
    /* in group order (a handful at most: insertion sort) */
    size_t *l = r->borrow_list, n = r->n_borrow;
    for (size_t a = 1; a < n; a++)
        for (size_t b = a; b > 0 && l[b - 1] > l[b]; b--) {
            size_t t = l[b];
            l[b] = l[b - 1];
            l[b - 1] = t;
        }
    for (size_t k = 0; k < n; k++) {
        size_t h = l[k];
        comm(r, false, h, MP_COMM_UNSHARD, g_unsharded(r, h));
        r->uns[h] = false;
    }
    r->n_borrow = 0;
}

void par_pre_fwd(struct rp *r, size_t i)
{
    if (!par_on(r) || !r->pp->group_of_block)
        return;
    int save = r->node;
    r->node = (int)r->p->blocks[i].node0;
    size_t g = (size_t)r->pp->group_of_block[i];
    bool forward = r->phase == MP_PH_FORWARD;
    if (fsdp(r)) {
        if (r->pp->root_group >= 0 && forward) /* the root unshards first, before any block */
            fsdp_unshard(r, (size_t)r->pp->root_group, true);
        /* a unit whose first module is inside the block (the tail's lm_head after the root's
         * final norm): at that node (par_pre_node) */
        const struct mp_par_group *gr = &r->pp->groups[g];
        const struct mp_block_prog *bp = &r->p->blocks[i];
        if (!(forward && gr->first_node != SIZE_MAX && gr->first_node > bp->node0 &&
              gr->first_node < bp->node0 + bp->n_nodes))
            fsdp_unshard(r, g, forward);
    } else if (zero3(r)) {
        z3_fetch(r, g);
        z3_fetch_tied(r, i);
        /* prefetch the next block's parameters if they fit the prefetch bucket */
        if (forward && i + 1 < r->p->n_blocks) {
            size_t n = (size_t)r->pp->group_of_block[i + 1];
            if (r->pp->groups[n].unsharded_elems <= r->pp->par.ds_prefetch_bucket_elems)
                z3_fetch(r, n);
        }
    }
    r->node = save;
}

/* --ep: the experts unit of node k's block whose forward starts (first) or ends at k, or -1. */
static int experts_unit_at(const struct rp *r, size_t k, bool first)
{
    const struct mp_node *n = &r->p->nodes[k];
    if (!n->ep_unit || !r->pp->experts_group_of_block || n->block < 0)
        return -1;
    int g = r->pp->experts_group_of_block[n->block];
    if (g < 0 || (first ? r->pp->groups[g].first_node : r->pp->groups[g].last_node) != k)
        return -1;
    return g;
}

void par_pre_node(struct rp *r, size_t k)
{
    if (!par_on(r) || !fsdp(r))
        return;
    int e = experts_unit_at(r, k, true);
    if (e >= 0 && (r->phase == MP_PH_FORWARD || r->phase == MP_PH_RECOMPUTE))
        fsdp_unshard(r, (size_t)e, r->phase == MP_PH_FORWARD);
    if (r->phase != MP_PH_FORWARD)
        return;
    const struct mp_node *n = &r->p->nodes[k];
    for (int j = 0; j < 2; j++) {
        int q = n->param[j], g = q >= 0 ? r->pp->group_of_param[q] : -1;
        if (g >= 0 && r->pp->groups[g].first_node == k && !r->uns[g])
            fsdp_unshard(r, (size_t)g, true);
    }
}

/* The experts module returned: its unit reshards (reshard_after_forward=True); not in a
 * recompute (FSDP2's post-forward skips it in backward). */
void par_post_node(struct rp *r, size_t k)
{
    if (!par_on(r) || !fsdp(r) || r->phase != MP_PH_FORWARD)
        return;
    int e = experts_unit_at(r, k, false);
    if (e >= 0)
        reshard(r, (size_t)e);
}

void par_post_fwd(struct rp *r, size_t i)
{
    if (!par_on(r) || !r->pp->group_of_block || r->phase != MP_PH_FORWARD)
        return; /* a recomputation in backward keeps the parameters until its backward */
    int save = r->node;
    r->node = (int)(r->p->blocks[i].node0 + (r->p->blocks[i].n_nodes ? r->p->blocks[i].n_nodes - 1 : 0));
    size_t g = (size_t)r->pp->group_of_block[i];
    if (fsdp(r)) {
        if (r->pp->groups[g].reshard)
            reshard(r, g);
        if (i + 1 == r->p->n_blocks && r->ag_held >= 0) { /* root post-forward frees the last one */
            comm(r, false, (size_t)r->ag_held, MP_COMM_AG_OUT, g_unsharded(r, (size_t)r->ag_held));
            r->ag_held = -1;
        }
    } else if (zero3(r)) {
        reshard(r, g);
        z3_release_tied(r);
    }
    r->node = save;
}

/* FSDP2's backward prefetch of group h: its all-gather issued, the output kept until it unshards. */
static void prefetch(struct rp *r, size_t h)
{
    if (r->pp->groups[h].root || r->uns[h] || r->ag_pending[h])
        return;
    comm(r, true, h, MP_COMM_COPY_IN, r->pp->groups[h].copyin_bytes);
    comm(r, true, h, MP_COMM_AG_OUT, g_unsharded(r, h));
    comm(r, false, h, MP_COMM_COPY_IN, r->pp->groups[h].copyin_bytes);
    r->ag_pending[h] = true;
}

/* FSDP2 pre-backward of group g (its block i): unshard, then prefetch the unit that ended its
 * forward just before g's (post-forward order): a layer's own experts unit (--ep: it returned
 * inside the layer), else the previous block's. */
static void fsdp_pre_bwd(struct rp *r, size_t g, size_t i)
{
    fsdp_unshard(r, g, false);
    int e = r->pp->experts_group_of_block ? r->pp->experts_group_of_block[i] : -1;
    if (e >= 0 && (size_t)e != g) {
        prefetch(r, (size_t)e);
        return;
    }
    for (size_t j = i; j-- > 0;) {
        size_t h = (size_t)r->pp->group_of_block[j];
        if (h == g)
            continue;
        prefetch(r, h);
        break;
    }
}

void par_pre_bwd_node(struct rp *r, size_t k)
{
    if (!par_on(r))
        return;
    int save = r->node;
    r->node = (int)k;
    if (r->bwd_defer >= 0 && r->pp->groups[r->bwd_defer].last_node == k) {
        fsdp_pre_bwd(r, (size_t)r->bwd_defer, r->bwd_defer_blk);
        r->bwd_defer = -1;
    }
    int e = fsdp(r) ? experts_unit_at(r, k, false) : -1;
    if (e >= 0) /* the experts unit's pre-backward, on its module's output gradient */
        fsdp_pre_bwd(r, (size_t)e, (size_t)r->p->nodes[k].block);
    r->node = save;
}

void par_pre_bwd(struct rp *r, size_t i)
{
    if (!par_on(r) || !r->pp->group_of_block)
        return;
    int save = r->node;
    const struct mp_block_prog *bp = &r->p->blocks[i];
    r->node = (int)(bp->node0 + (bp->n_nodes ? bp->n_nodes - 1 : 0));
    size_t g = (size_t)r->pp->group_of_block[i];
    if (fsdp(r)) {
        /* the unit's pre-backward hook is on its modules' outputs: a unit whose last module is
         * followed by others in the block (the tail's lm_head, then the loss) waits for it */
        size_t last = r->pp->groups[g].last_node;
        if (!r->pp->groups[g].root && last != SIZE_MAX && last >= bp->node0 && last + 1 < bp->node0 + bp->n_nodes) {
            r->bwd_defer = (int)g;
            r->bwd_defer_blk = i;
        } else
            fsdp_pre_bwd(r, g, i);
    } else if (zero3(r)) {
        z3_fetch(r, g);
        z3_fetch_tied(r, i);
        if (i > 0) {
            size_t h = (size_t)r->pp->group_of_block[i - 1];
            if (r->pp->groups[h].unsharded_elems <= r->pp->par.ds_prefetch_bucket_elems)
                z3_fetch(r, h);
        }
    }
    r->node = save;
}

/* Frees the unsharded gradients of block blk, or with whole_group those of group g's parameters
 * (in the blocks that hold them): they were copied into a reduce-scatter input or a reduce
 * bucket. */
static void drop_pgrads(struct rp *r, size_t g, bool whole_group, size_t blk)
{
    const struct mp_program *p = r->p;
    size_t lo = whole_group ? r->pp->groups[g].blk_lo : blk, hi = whole_group ? r->pp->groups[g].blk_hi : blk;
    for (size_t b = lo; b <= hi && b < p->n_blocks; b++) {
        const struct mp_block_prog *bp = &p->blocks[b];
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++)
            if (r->pglive[q] && (!whole_group || r->pp->group_of_param[q] == (int)g)) {
                r->pglive[q] = false;
                emit(r, MP_EV_FREE, MP_ST_PGRAD, (int)q, mp_param_grad_bytes(&p->params[q]));
            }
    }
}

/* FSDP2 post-backward of group g: reshard, release the previous reduce-scatter input, then
 * reduce-scatter: input (padded, reduce dtype), unsharded grads freed, output = sharded grads. */
static void fsdp_post_bwd(struct rp *r, size_t g, size_t blk)
{
    const struct mp_par_plan *pp = r->pp;
    uint64_t in = pp->groups[g].grad_unsharded_elems * pp->reduce_elem_bytes;
    reshard(r, g);
    if (r->rs_pending >= 0) {
        comm(r, false, (size_t)r->rs_pending, MP_COMM_RS_IN,
             pp->groups[r->rs_pending].grad_unsharded_elems * pp->reduce_elem_bytes);
        r->rs_pending = -1;
    }
    if (!in) /* no gradient in the group (a frozen base): no reduce-scatter */
        return;
    comm(r, true, g, MP_COMM_RS_IN, in);
    drop_pgrads(r, g, true, blk);
    if (!r->rs_out[g]) {
        comm(r, true, g, MP_COMM_RS_OUT, pp->groups[g].grad_shard_elems * pp->reduce_elem_bytes);
        r->rs_out[g] = true;
    }
    /* torch 2.15 _fsdp_collectives.py foreach_reduce, world_size 1: reduce_output.copy_(input /
     * gradient_divide_factor); transformers sets the experts' factor to the data-parallel size
     * (distributed/fsdp.py), so on an efsdp mesh of one rank the quotient is a temporary */
    if (pp->groups[g].experts && pp->groups[g].mesh == 1 && pp->world > 1) {
        comm(r, true, g, MP_COMM_DIVIDED, in);
        comm(r, false, g, MP_COMM_DIVIDED, in);
    }
    r->rs_pending = (int)g;
}

/* --ep: the experts unit's post-backward, once its module's inputs have their gradients (the
 * dispatch's backward): reshard, reduce-scatter over the efsdp ranks. */
void par_post_bwd_node(struct rp *r, size_t k)
{
    if (!par_on(r) || !fsdp(r))
        return;
    int e = experts_unit_at(r, k, true);
    if (e < 0)
        return;
    int save = r->node;
    r->node = (int)k;
    fsdp_post_bwd(r, (size_t)e, (size_t)r->p->nodes[k].block);
    r->node = save;
}

void par_post_bwd(struct rp *r, size_t i)
{
    if (!par_on(r))
        return;
    int save = r->node;
    r->node = (int)r->p->blocks[i].node0;
    enum mp_par_strategy s = r->pp->par.strategy;
    size_t g = r->pp->group_of_block ? (size_t)r->pp->group_of_block[i] : 0;
    if (fsdp(r)) {
        if (!r->pp->groups[g].root && r->pp->groups[g].first_block == i) /* its first block's backward */
            fsdp_post_bwd(r, g, i);
        if (i == 0) { /* end of backward: the root group, then the final callback */
            if (r->pp->root_group >= 0)
                fsdp_post_bwd(r, (size_t)r->pp->root_group, i);
            if (r->rs_pending >= 0) {
                comm(r, false, (size_t)r->rs_pending, MP_COMM_RS_IN,
                     r->pp->groups[r->rs_pending].grad_unsharded_elems * r->pp->reduce_elem_bytes);
                r->rs_pending = -1;
            }
        }
    } else if (s == MP_PAR_ZERO3) {
        reshard(r, g);
        z3_release_tied(r);
        drop_pgrads(r, 0, false, i); /* reduced through the bucket into the fp32 partition */
    } else if (s == MP_PAR_ZERO2) {
        drop_pgrads(r, 0, false, i); /* copied into the bucket, reduced into grads_in_partition */
    }
    r->node = save;
}

/* Bytes of parameter q on this rank's GPU at setup. */
uint64_t par_param_bytes(const struct rp *r, size_t q)
{
    const struct mp_program *p = r->p;
    if (!par_on(r))
        return p->params[q].bytes; /* quantized weights: their packed parts */
    const struct mp_par_plan *pp = r->pp;
    bool off_par = pp->par.offload == MP_OFFLOAD_PARAMS;
    switch (pp->par.strategy) {
    case MP_PAR_FSDP:
    case MP_PAR_FSDP_NO_RESHARD:
        return off_par ? mp_par_offload_kept_bytes(pp, p, q) : mp_par_rank_param_bytes(pp, p, q);
    case MP_PAR_ZERO3: /* (parameter offload: the partitions on the host, a quant_state not) */
        return off_par && !mp_par_z3_persistent(pp, &p->params[q]) ? mp_par_offload_kept_bytes(pp, p, q)
                                                                    : mp_par_rank_param_bytes(pp, p, q);
    default: return p->params[q].bytes; /* replicated (DDP, ZeRO-1/2): as on one GPU */
    }
}

void par_setup(struct rp *r)
{
    const struct mp_par_plan *pp = r->pp;
    bool off = pp->par.offload != MP_OFFLOAD_NONE;
    for (size_t b = 0; b < pp->n_buckets; b++)
        comm(r, true, b, MP_COMM_BUCKET, pp->bucket_bytes[b]);
    switch (pp->par.strategy) {
    case MP_PAR_ZERO1:
    case MP_PAR_ZERO2:
        if (!off) {
            comm(r, true, 0, MP_COMM_PARTITION, pp->partition_elems * 4); /* fp32 master partition */
            emit(r, MP_EV_ALLOC, MP_ST_OPT_STATE, 0, pp->optimizer_bytes);
        }
        if (pp->par.strategy == MP_PAR_ZERO2 && !off) /* grads_in_partition */
            comm(r, true, 1, MP_COMM_PARTITION, pp->partition_elems * pp->compute_elem_bytes);
        break;
    case MP_PAR_ZERO3: /* (the trained parameters' partitions: a frozen base is in no optimizer group) */
        if (!off) {
            if (pp->compute_elem_bytes != 4) /* fp32 master partition */
                comm(r, true, 0, MP_COMM_PARTITION, pp->grad_shard_total * 4);
            /* grad_partitions_flat_buffer, in the model's dtype (parallel.c mp_par_plan_make) */
            comm(r, true, 1, MP_COMM_PARTITION, pp->grad_shard_total * pp->compute_elem_bytes);
        }
        break;
    default: break;
    }
}

bool par_opt_per_param(const struct rp *r)
{
    /* ZeRO-1/2 keep the optimizer state as one flat partition; offload keeps it on the host */
    return !par_on(r) || ((r->pp->par.strategy == MP_PAR_DDP || mp_par_is_fsdp(r->pp->par.strategy) ||
                           r->pp->par.strategy == MP_PAR_ZERO3) &&
                          r->pp->par.offload == MP_OFFLOAD_NONE);
}
