/* estimate.c — the step replay (alloc/free/compute events) and the estimator.
 *
 * Liveness follows autograd: a tensor lives while a later forward node still
 * reads it, while a node that saved it has not run backward, or while the
 * chain holds it (a block's output until the next block consumes it; a
 * checkpointed block input until that block's backward, as in rotor's model).
 * Gradients of activations appear when their consumer's backward runs and die
 * after their producer's backward (a residual add's inputs share its output's
 * gradient storage, as AddBackward0 returns it); parameter gradients live until
 * zero_grad.
 * The estimator's visitor sums 512-byte-rounded sizes (max_memory_allocated)
 * and feeds a model of PyTorch's caching allocator for reserved bytes.
 */
#include "estimate.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mp_phase_str(enum mp_phase ph)
{
    static const char *n[] = {"setup", "forward", "loss", "recompute", "backward", "optimizer.step", "end"};
    return (unsigned)ph <= MP_PH_END ? n[ph] : "?";
}

void mp_train_opts_default(struct mp_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->optimizer = MP_OPT_ADAMW;
    o->cublas_workspace_bytes = 8519680; /* :4096:2:16:8 (memory-facts §8); 32 MiB on sm90 */
    o->accumulate = false;
    o->par = NULL;
}

/* ---- replay ------------------------------------------------------------------------------- */

struct rp {
    const struct mp_program *p;
    const struct mp_train_opts *t;
    mp_event_fn fn;
    void *ctx;
    struct mp_diag *d;
    enum mp_status st;
    enum mp_phase phase;
    int node;
    bool *live, *pglive, *is_input;
    int *uses, *saved, *holds;
    int *grad_of; /* per tensor: the GRAD storage holding its gradient, -1 none (mp_event.grad_of) */
    int *grefs;   /* per GRAD storage: how many tensors' gradients it holds */
    bool *ckpt; /* per block: its input is held as a checkpoint (Fc) until its backward */
    bool *recomp; /* per block: recorded by a recompute (after the loss) for its backward */
    bool *cached; /* per tensor: an autocast weight copy held by autocast's cache until the loss */
    int shared_block[2]; /* per model-made tensor (rope_tables, attn_mask): the block whose first
                            forward made it (held until its backward), -1 */
    bool held_on[MP_HELD_MAX]; /* p->held[j] is held (made by the forward, not yet released) */
    /* data parallel (NULL pp: one GPU) */
    const struct mp_par_plan *pp;
    bool *uns, *ag_pending, *rs_out; /* per group: unsharded, all-gather issued (prefetch), grads reduced */
    size_t *borrow_list, n_borrow; /* ZeRO-3: groups gathered for a block that uses one of their
                                    * parameters (tied), released after it */
    int ag_held;    /* FSDP2 forward: the all-gather output kept until the next group's copy-out */
    int *first_use; /* DDP gradient_as_bucket_view: per param, the first node using it (its last backward) */
    int rs_pending; /* FSDP2: the reduce-scatter input kept until the next group's reduce */
};

static void emit(struct rp *r, enum mp_ev_kind k, enum mp_store s, int id, uint64_t bytes)
{
    if (r->st != MP_OK)
        return;
    struct mp_event ev = {.kind = k, .store = s, .id = id, .node = r->node, .bytes = bytes, .phase = r->phase,
                          .grad_of = r->grad_of};
    r->st = r->fn(r->ctx, &ev);
}

/* a + b, the bytes of one event: an overflow ends the replay (MP_ERR_RANGE) */
static uint64_t r_add(struct rp *r, uint64_t a, uint64_t b)
{
    uint64_t s;
    if (mp_add_u64(a, b, &s))
        return s;
    if (r->st == MP_OK)
        r->st = mp_fail(r->d, MP_ERR_RANGE, "%s: memory overflows 64 bits",
                        r->p->model ? r->p->model->path : "model");
    return 0;
}

static void emit_fwd(struct rp *r, int node, bool grad, int step)
{
    if (r->st != MP_OK)
        return;
    struct mp_event ev = {.kind = MP_EV_FWD, .store = MP_ST_TMP, .id = node, .node = node, .phase = r->phase,
                          .grad_mode = grad, .step = step, .grad_of = r->grad_of};
    r->st = r->fn(r->ctx, &ev);
}

static void t_alloc(struct rp *r, int t)
{
    if (t < 0 || r->live[t])
        return;
    r->live[t] = true;
    emit(r, MP_EV_ALLOC, MP_ST_ACT, t, r->p->tensors[t].bytes);
}

static void t_maybe_free(struct rp *r, int t)
{
    if (t < 0 || !r->live[t] || r->is_input[t] || r->uses[t] > 0 || r->saved[t] > 0 || r->holds[t] > 0)
        return;
    r->live[t] = false;
    emit(r, MP_EV_FREE, MP_ST_ACT, t, r->p->tensors[t].bytes);
}

/* ---- activation gradients: storages, and the tensors whose gradient each holds ----------------
 * A node's backward makes a new gradient for each input (a GRAD storage with that input's id),
 * except AddBackward0: it returns its incoming gradient itself for every input of the output's
 * shape and dtype (derivatives.yaml add.Tensor, alpha 1; the engine's validate_outputs makes a
 * new tensor only to sum a broadcast away or to cast), so the inputs' gradients share the
 * output's storage.  The engine keeps one gradient per tensor in its consumer's InputBuffer;
 * a second one is added by InputBuffer::accumulate (torch/csrc/autograd/input_buffer.cpp), after
 * the node has run and released its incoming gradient and saved tensors: in place (old += new)
 * when that buffer holds the last reference to the old storage, else out of place (old + new, a
 * new storage).  The new gradient it adds is a tensor of its own until then (counted in the
 * node's TMP).  A storage is freed when no tensor's gradient is in it. */

static bool g_wanted(const struct rp *r, int t)
{
    return t >= 0 && r->p->tensors[t].needs_grad && !r->is_input[t];
}

static bool g_has(const struct rp *r, int t) { return t >= 0 && r->grad_of[t] >= 0; }

/* A new storage (id t) for t's gradient. */
static void g_new(struct rp *r, int t)
{
    if (r->grefs[t] > 0)
        MP_BUG("gradient storage %d (%s) made twice", t, r->p->tensors[t].name);
    r->grad_of[t] = t;
    r->grefs[t] = 1;
    emit(r, MP_EV_ALLOC, MP_ST_GRAD, t, r->p->tensors[t].bytes);
}

static void g_unref(struct rp *r, int s)
{
    if (--r->grefs[s] == 0)
        emit(r, MP_EV_FREE, MP_ST_GRAD, s, r->p->tensors[s].bytes);
}

static void g_alloc(struct rp *r, int t)
{
    if (g_wanted(r, t) && !g_has(r, t))
        g_new(r, t);
}

/* t's gradient is consumed (its producer's backward ran): its storage loses one holder. */
static void g_free(struct rp *r, int t)
{
    if (!g_has(r, t))
        return;
    int s = r->grad_of[t];
    r->grad_of[t] = -1;
    g_unref(r, s);
}

/* Does n's backward hand its output's gradient itself to input j (whose gradient is tensor g)? */
static bool g_passes(const struct rp *r, const struct mp_node *n, int g)
{
    const struct mp_tensor *a = &r->p->tensors[g], *y = &r->p->tensors[n->out];
    return n->prim == MP_P_ADD && g_has(r, n->out) && a->dtype == y->dtype && a->elems == y->elems;
}

static void tmp(struct rp *r, int node, uint64_t bytes, bool alloc)
{
    if (bytes)
        emit(r, alloc ? MP_EV_ALLOC : MP_EV_FREE, MP_ST_TMP, node, bytes);
}

static bool node_makes(const struct mp_node *n, int t)
{
    for (int j = 0; j < n->n_extra; j++)
        if (n->extra[j] == t)
            return true;
    return false;
}

/* Is t made by one of n's forward ops (layers.h mp_subop), allocated when that op runs? */
static bool fop_makes(const struct mp_program *p, const struct mp_node *n, int t)
{
    for (int i = 0; i < n->n_fops; i++)
        if (p->subops[n->fop0 + i].dst == t || p->subops[n->fop0 + i].dst2 == t)
            return true;
    return false;
}

/* The forward of node k as several ops: each op's tensors appear before it runs, its input
 * transient dies after it (the node's extras and output stay, as for any node). */
static void fwd_ops(struct rp *r, const struct mp_node *n, int k, bool grad)
{
    const struct mp_program *p = r->p;
    for (int i = 0; i < n->n_fops && r->st == MP_OK; i++) {
        const struct mp_subop *s = &p->subops[n->fop0 + i];
        t_alloc(r, s->dst);
        t_alloc(r, s->dst2);
        emit_fwd(r, k, grad, i);
        t_maybe_free(r, s->free_buf);
    }
}

static bool node_reads(const struct mp_node *n, int t, int upto)
{
    for (int j = 0; j < upto; j++)
        if (n->in[j] == t)
            return true;
    return false;
}

/* ZeRO-3 / FSDP gather each layer's parameters for its forward: what autocast's cache
 * would keep of those is not modelled (DeepSpeed casts the parameters themselves). */
static bool params_sharded(const struct rp *r)
{
    return r->pp && (r->t->par->strategy == MP_PAR_ZERO3 || r->t->par->strategy == MP_PAR_FSDP ||
                     r->t->par->strategy == MP_PAR_FSDP_NO_RESHARD);
}

/* Does autograd save anything (a parameter included) when n runs with grad?  A Linear whose
 * input needs a gradient saves its weight; a quantized one (bitsandbytes MatMul4Bit) keeps the
 * packed weight outside save_for_backward. */
static bool node_packs(const struct mp_node *n)
{
    return !n->no_grad && (n->n_saved > 0 || (n->grad_in && n->param[0] >= 0 && !n->quantized));
}

/* The tensors a model hands to many blocks (p->held: T5's encoder output and position biases):
 * held from the forward that makes them until the loss, or, when their release block is a
 * checkpoint (whose inputs keep them), until that block's backward.  release_at: the loss (-1)
 * or block i's backward. */
static void hold_made(struct rp *r, const struct mp_node *n)
{
    for (size_t j = 0; j < r->p->n_held; j++) {
        int t = r->p->held[j].t;
        if (r->phase == MP_PH_FORWARD && !r->held_on[j] && (n->out == t || node_makes(n, t))) {
            r->held_on[j] = true;
            r->holds[t]++;
        }
    }
}

static void release_held(struct rp *r, int release_at)
{
    for (size_t j = 0; j < r->p->n_held; j++) {
        int rb = r->p->held[j].release, t = r->p->held[j].t;
        bool leaf = r->p->held[j].leaf;
        if (!r->held_on[j] || (leaf ? release_at != 0 : release_at < 0 ? rb >= 0 && r->ckpt[rb] : rb != release_at))
            continue;
        r->held_on[j] = false;
        r->holds[t]--;
        t_maybe_free(r, t);
        if (leaf) /* its .grad dies with it */
            g_free(r, t);
    }
}

/* A held leaf keeps its gradient (.grad) past its producer's backward. */
static bool held_leaf(const struct rp *r, int t)
{
    for (size_t j = 0; j < r->p->n_held; j++)
        if (r->p->held[j].t == t && r->p->held[j].leaf)
            return true;
    return false;
}

/* Forward of block i; kind FE records for backward, FN/FC do not.  early: the recompute right
 * before block i's backward; torch's non-reentrant checkpoint stops it at the pack of the last
 * tensor the first forward saved (early stop, torch/utils/checkpoint.py _StopRecomputationError):
 * the ops after the block's last saving op do not run again and its output is not remade. */
static void fwd_block(struct rp *r, size_t i, enum mp_sched_kind kind, bool early)
{
    const struct mp_program *p = r->p;
    const struct mp_block_prog *bp = &p->blocks[i];
    bool grad = kind == MP_SCHED_FE;
    size_t end = bp->node0 + bp->n_nodes;
    if (early && grad)
        for (size_t k = end; k-- > bp->node0;)
            if (node_packs(&p->nodes[k])) {
                end = k + 1;
                break;
            }
    bool stopped = end < bp->node0 + bp->n_nodes;
    if (grad && r->phase == MP_PH_RECOMPUTE)
        r->recomp[i] = true;
    for (size_t k = bp->node0; k < end; k++) {
        const struct mp_node *n = &p->nodes[k];
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0 && !node_reads(n, n->in[j], j))
                r->uses[n->in[j]]++;
        if (n->keep >= 0)
            r->uses[n->keep]++;
    }
    for (size_t k = bp->node0; k < end && r->st == MP_OK; k++) {
        const struct mp_node *n = &p->nodes[k];
        r->node = (int)k;
        if (n->out != n->in[0] && !fop_makes(p, n, n->out))
            t_alloc(r, n->out);
        for (int j = 0; j < n->n_extra; j++)
            if (!fop_makes(p, n, n->extra[j]))
                t_alloc(r, n->extra[j]);
        /* torch.autocast caches the half copy of every weight it casts (leaf, requires grad)
         * until the autocast region ends, after the loss: under checkpointing the copies of
         * every checkpointed layer outlive their no-grad forward (autocast_mode.cpp cached_cast) */
        if (n->wcopy >= 0 && r->phase == MP_PH_FORWARD && !r->cached[n->wcopy] && !params_sharded(r)) {
            r->cached[n->wcopy] = true;
            r->holds[n->wcopy]++;
        }
        /* use_cache: the DynamicCache keeps its k/v copies until the model's forward returns */
        if (n->kv_cached && r->phase == MP_PH_FORWARD && !r->cached[n->out]) {
            r->cached[n->out] = true;
            r->holds[n->out]++;
        }
        /* the rotary tables and the attention mask: made once per forward by the model and
         * used by every layer (checkpoint inputs under checkpointing): held until this block's
         * backward */
        const int shared[2] = {p->rope_tables, p->attn_mask};
        for (int j = 0; j < 2; j++)
            if (shared[j] >= 0 && r->phase == MP_PH_FORWARD && r->shared_block[j] < 0 &&
                node_makes(n, shared[j])) {
                r->shared_block[j] = (int)i;
                r->holds[shared[j]]++;
            }
        hold_made(r, n);
        tmp(r, (int)k, n->fwd_tmp_bytes, true);
        if (n->n_fops)
            fwd_ops(r, n, (int)k, grad);
        else
            emit_fwd(r, (int)k, grad, 0);
        tmp(r, (int)k, n->fwd_tmp_bytes, false);
        if (grad)
            for (int j = 0; j < n->n_saved; j++)
                r->saved[n->saved[j]]++;
        if (k + 1 == bp->node0 + bp->n_nodes && !stopped)
            r->holds[bp->output]++; /* the chain holds x_{i+1} before anything can free it */
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0 && !node_reads(n, n->in[j], j)) {
                r->uses[n->in[j]]--;
                t_maybe_free(r, n->in[j]);
            }
        if (n->keep >= 0) {
            r->uses[n->keep]--;
            t_maybe_free(r, n->keep);
        }
        for (int j = 0; j < n->n_extra; j++)
            t_maybe_free(r, n->extra[j]);
        t_maybe_free(r, n->out);
    }
    if (bp->n_nodes == 0)
        r->holds[bp->output]++;
    r->node = -1;
    /* The chain's hold on x_i: Fc keeps it until B_i (a checkpoint); Fn and a
     * plain Fe release it (autograd keeps x_i only if a node saved it); an Fe
     * that recomputes a checkpointed block leaves it for B_i. */
    if (kind == MP_SCHED_FC) {
        r->ckpt[i] = true;
    } else if (!r->ckpt[i] && r->holds[bp->input] > 0) {
        r->holds[bp->input]--;
        t_maybe_free(r, bp->input);
    }
}


/* ---- data parallel: rank r's communication events (parallel.h, memory-facts §13) --------------- */

static bool par_on(const struct rp *r) { return r->pp != NULL; }

static void comm(struct rp *r, bool alloc, size_t slot, enum mp_comm_kind k, uint64_t bytes)
{
    if (bytes)
        emit(r, alloc ? MP_EV_ALLOC : MP_EV_FREE, MP_ST_COMM, (int)(slot * MP_COMM_KINDS + k), bytes);
}

static bool fsdp(const struct rp *r) { return par_on(r) && mp_par_is_fsdp(r->pp->par.strategy); }
static bool zero3(const struct rp *r) { return par_on(r) && r->pp->par.strategy == MP_PAR_ZERO3; }

/* Bytes of the group's unsharded parameters / flat buffers in the compute dtype. */
static uint64_t g_unsharded(const struct rp *r, size_t g)
{
    return r->pp->groups[g].unsharded_elems * r->pp->compute_elem_bytes;
}

/* FSDP2 unshard (all-gather, copy-out) of group g; in forward the flat output is kept until
 * the next group's copy-out (implicit prefetch), otherwise freed right after the copy-out. */
static void fsdp_unshard(struct rp *r, size_t g, bool forward)
{
    if (r->uns[g])
        return;
    uint64_t flat = g_unsharded(r, g);
    if (!r->ag_pending[g]) {
        if (r->pp->par.mixed_bf16) /* flat copy-in of the shards cast to bf16 */
            comm(r, true, g, MP_COMM_COPY_IN, r->pp->groups[g].shard_elems * r->pp->compute_elem_bytes);
        comm(r, true, g, MP_COMM_AG_OUT, flat);
        if (r->pp->par.mixed_bf16)
            comm(r, false, g, MP_COMM_COPY_IN, r->pp->groups[g].shard_elems * r->pp->compute_elem_bytes);
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
            if (o < 0 || (size_t)o == i || r->p->params[q].elems < r->pp->par.ds_persistence_elems)
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

static void par_pre_fwd(struct rp *r, size_t i)
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

static void par_post_fwd(struct rp *r, size_t i)
{
    if (!par_on(r) || !r->pp->group_of_block || r->phase != MP_PH_FORWARD)
        return; /* a recomputation in backward keeps the parameters until its backward */
    int save = r->node;
    r->node = (int)(r->p->blocks[i].node0 + (r->p->blocks[i].n_nodes ? r->p->blocks[i].n_nodes - 1 : 0));
    size_t g = (size_t)r->pp->group_of_block[i];
    if (fsdp(r)) {
        if (r->pp->par.strategy == MP_PAR_FSDP && !r->pp->groups[g].root)
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

static void par_pre_bwd(struct rp *r, size_t i)
{
    if (!par_on(r) || !r->pp->group_of_block)
        return;
    int save = r->node;
    r->node = (int)(r->p->blocks[i].node0 + (r->p->blocks[i].n_nodes ? r->p->blocks[i].n_nodes - 1 : 0));
    size_t g = (size_t)r->pp->group_of_block[i];
    if (fsdp(r)) {
        fsdp_unshard(r, g, false);
        /* backward prefetch: the group of the previous block is all-gathered now */
        for (size_t j = i; j-- > 0;) {
            size_t h = (size_t)r->pp->group_of_block[j];
            if (h == g)
                continue;
            if (!r->pp->groups[h].root && !r->uns[h] && !r->ag_pending[h]) {
                if (r->pp->par.mixed_bf16)
                    comm(r, true, h, MP_COMM_COPY_IN, r->pp->groups[h].shard_elems * r->pp->compute_elem_bytes);
                comm(r, true, h, MP_COMM_AG_OUT, g_unsharded(r, h));
                if (r->pp->par.mixed_bf16)
                    comm(r, false, h, MP_COMM_COPY_IN, r->pp->groups[h].shard_elems * r->pp->compute_elem_bytes);
                r->ag_pending[h] = true;
            }
            break;
        }
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

/* Frees the unsharded gradients of block blk, or with whole_group of every block in group g
 * (blk's own group unless g is the root's): they were copied into a reduce-scatter input or a
 * reduce bucket. */
static void drop_pgrads(struct rp *r, size_t g, bool whole_group, size_t blk)
{
    const struct mp_program *p = r->p;
    bool all = whole_group && r->pp->groups[g].root; /* the root group: the blocks outside repeats */
    for (size_t b = all ? 0 : blk; b < (all ? p->n_blocks : blk + 1); b++) {
        if (all && (size_t)r->pp->group_of_block[b] != g)
            continue;
        const struct mp_block_prog *bp = &p->blocks[b];
        for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++)
            if (r->pglive[q]) {
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
    uint64_t in = pp->groups[g].unsharded_elems * pp->reduce_elem_bytes;
    reshard(r, g);
    if (r->rs_pending >= 0) {
        comm(r, false, (size_t)r->rs_pending, MP_COMM_RS_IN,
             pp->groups[r->rs_pending].unsharded_elems * pp->reduce_elem_bytes);
        r->rs_pending = -1;
    }
    comm(r, true, g, MP_COMM_RS_IN, in);
    drop_pgrads(r, g, true, blk);
    if (!r->rs_out[g]) {
        comm(r, true, g, MP_COMM_RS_OUT, pp->groups[g].shard_elems * pp->reduce_elem_bytes);
        r->rs_out[g] = true;
    }
    r->rs_pending = (int)g;
}

static void par_post_bwd(struct rp *r, size_t i)
{
    if (!par_on(r))
        return;
    int save = r->node;
    r->node = (int)r->p->blocks[i].node0;
    enum mp_par_strategy s = r->pp->par.strategy;
    size_t g = r->pp->group_of_block ? (size_t)r->pp->group_of_block[i] : 0;
    if (fsdp(r)) {
        if (!r->pp->groups[g].root)
            fsdp_post_bwd(r, g, i);
        if (i == 0) { /* end of backward: the root group, then the final callback */
            if (r->pp->root_group >= 0)
                fsdp_post_bwd(r, (size_t)r->pp->root_group, i);
            if (r->rs_pending >= 0) {
                comm(r, false, (size_t)r->rs_pending, MP_COMM_RS_IN,
                     r->pp->groups[r->rs_pending].unsharded_elems * r->pp->reduce_elem_bytes);
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
static uint64_t par_param_bytes(const struct rp *r, size_t q)
{
    const struct mp_program *p = r->p;
    uint64_t P = mp_dtype_size(p->param_dtype), n = p->params[q].elems;
    if (!par_on(r))
        return p->params[q].bytes; /* quantized weights: their packed parts */
    const struct mp_par_plan *pp = r->pp;
    bool off_par = pp->par.offload == MP_OFFLOAD_PARAMS;
    switch (pp->par.strategy) {
    case MP_PAR_FSDP:
    case MP_PAR_FSDP_NO_RESHARD: return off_par ? 0 : pp->shard_elems[q] * pp->master_elem_bytes;
    case MP_PAR_ZERO3:
        if (n < pp->par.ds_persistence_elems)
            return n * P;
        return off_par ? 0 : pp->shard_elems[q] * P;
    default: return n * P;
    }
}

static void par_setup(struct rp *r)
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
    case MP_PAR_ZERO3:
        if (!off) {
            if (pp->compute_elem_bytes != 4) /* fp32 master partition */
                comm(r, true, 0, MP_COMM_PARTITION, pp->shard_total * 4);
            comm(r, true, 1, MP_COMM_PARTITION, pp->shard_total * 4); /* grad_partitions_flat_buffer */
        }
        break;
    default: break;
    }
}

static bool par_opt_per_param(const struct rp *r)
{
    /* ZeRO-1/2 keep the optimizer state as one flat partition; offload keeps it on the host */
    return !par_on(r) || ((r->pp->par.strategy == MP_PAR_DDP || mp_par_is_fsdp(r->pp->par.strategy) ||
                           r->pp->par.strategy == MP_PAR_ZERO3) &&
                          r->pp->par.offload == MP_OFFLOAD_NONE);
}

/* Backward of node n is done with what it saved. */
static void release_saved(struct rp *r, const struct mp_node *n)
{
    for (int j = 0; j < n->n_saved; j++) {
        int t = n->saved[j];
        if (r->saved[t] > 0)
            r->saved[t]--;
        t_maybe_free(r, t);
    }
}

/* Releases n's saved tensor t (once: released[] marks n->saved[] entries already released). */
static void release_saved_one(struct rp *r, const struct mp_node *n, int t, bool *released)
{
    for (int j = 0; j < n->n_saved; j++)
        if (n->saved[j] == t && !released[j]) {
            released[j] = true;
            if (r->saved[t] > 0)
                r->saved[t]--;
            t_maybe_free(r, t);
        }
}

/* The backward of node k that autograd runs as several ops (layers.h mp_subop): each op's
 * gradient appears before it runs; its input buffer, the saved tensors of its autograd node
 * and the output gradient die after it as the op says. */
static void bwd_ops(struct rp *r, const struct mp_node *n, int k)
{
    const struct mp_program *p = r->p;
    bool released[MP_NODE_SAVED_MAX] = {false};
    for (int i = 0; i < n->n_bops && r->st == MP_OK; i++) {
        const struct mp_subop *s = &p->subops[n->bop0 + i];
        if (s->dst >= 0)
            g_alloc(r, s->dst);
        else if (s->grad >= 0)
            g_alloc(r, n->in_grad_part[s->grad] >= 0 ? n->in_grad_part[s->grad] : n->in[s->grad]);
        if (r->st == MP_OK) {
            struct mp_event ev = {.kind = MP_EV_BWD, .store = MP_ST_TMP, .id = k, .node = k, .phase = r->phase,
                                  .step = i, .grad_of = r->grad_of};
            r->st = r->fn(r->ctx, &ev);
        }
        g_free(r, s->free_buf);
        for (int j = 0; j < 2; j++)
            if (s->release[j] >= 0)
                release_saved_one(r, n, s->release[j], released);
        if (s->free_gout && !node_reads(n, n->out, 3))
            g_free(r, n->out);
    }
    for (int j = 0; j < n->n_saved; j++)
        release_saved_one(r, n, n->saved[j], released);
}

static void bwd_block(struct rp *r, size_t i)
{
    const struct mp_program *p = r->p;
    const struct mp_block_prog *bp = &p->blocks[i];
    for (size_t kk = bp->n_nodes; kk-- > 0 && r->st == MP_OK;) {
        size_t k = bp->node0 + kk;
        const struct mp_node *n = &p->nodes[k];
        r->node = (int)k;
        uint64_t incoming = 0; /* accumulation: the node's new weight gradients, added in place */
        int wcast = -1; /* a weight autocast cast: its fp32 gradient is made after the node */
        if (n->no_grad) { /* not recorded: no backward; nothing saved, no gradient flows */
            if (!node_reads(n, n->out, 3) && !held_leaf(r, n->out))
                g_free(r, n->out);
            continue;
        }
        /* the chunk's backward (SplitBackward0, its own node, run first) cats out's gradient parts */
        if (g_has(r, n->out_parts[0]) || g_has(r, n->out_parts[1])) {
            g_alloc(r, n->out);
            g_free(r, n->out_parts[0]);
            g_free(r, n->out_parts[1]);
        }
        for (int j = 0; j < 2; j++) {
            int q = n->param[j];
            if (q < 0 || !p->params[q].trainable)
                continue;
            if (!r->pglive[q] && j == 0 && n->prim == MP_P_LINEAR && mp_node_tmp(n, true, MP_TR_WGRAD_HALF)) {
                wcast = q;
            } else if (!r->pglive[q]) {
                r->pglive[q] = true;
                emit(r, MP_EV_ALLOC, MP_ST_PGRAD, q, mp_param_grad_bytes(&p->params[q]));
            } else if (r->t->accumulate) {
                incoming = r_add(r, incoming, mp_param_grad_bytes(&p->params[q]));
            }
        }
        /* the gradient the node makes for each input: a new storage, its output's own (a residual
         * add), or one added after the node to the gradient the input already has */
        int acc[3] = {-1, -1, -1};  /* the tensor whose gradient input j's is added to, -1 none */
        int late[3] = {-1, -1, -1}; /* a new gradient the engine makes after the node (engine_grad) */
        int passed = -1;           /* a residual add's incoming gradient storage, when it is added to
                                      another: the add's outputs hold it until then */
        uint64_t fresh = 0;        /* the new gradients to be added: tensors until then (TMP) */
        bool oop = false;
        for (int j = 0; j < 3 && n->grad_in && !n->n_bops; j++) { /* (bwd_ops makes its own) */
            int g = n->in_grad_part[j] >= 0 ? n->in_grad_part[j] : n->in[j];
            if (!g_wanted(r, g) || g == n->out)
                continue; /* an in-place op's input: its gradient is the output's */
            if (g_passes(r, n, g)) {
                if (g_has(r, g)) {
                    acc[j] = g;
                    passed = r->grad_of[n->out];
                } else { /* the same storage */
                    r->grad_of[g] = r->grad_of[n->out];
                    r->grefs[r->grad_of[g]]++;
                }
                continue;
            }
            bool dup = false; /* one gradient per distinct input (q and k of one tensor) */
            for (int e = 0; e < j; e++)
                dup |= g == (n->in_grad_part[e] >= 0 ? n->in_grad_part[e] : n->in[e]);
            if (dup)
                continue;
            if (!g_has(r, g)) {
                if (n->engine_grad[j])
                    late[j] = g;
                else
                    g_new(r, g);
                continue;
            }
            acc[j] = g;
            fresh = r_add(r, fresh, p->tensors[g].bytes);
        }
        /* Out of place when, once the node's incoming gradient is released, another tensor's
         * gradient is in the same storage (or the node's outputs still hold it: x + x). */
        int out_s = g_has(r, n->out) && !node_reads(n, n->out, 3) ? r->grad_of[n->out] : -1;
        for (int j = 0; j < 3; j++)
            if (acc[j] >= 0) {
                int s = r->grad_of[acc[j]];
                oop |= r->grefs[s] - (s == out_s) + (s == passed) > 1;
            }
        uint64_t btmp = r_add(r, r_add(r, n->bwd_tmp_bytes, fresh), incoming);
        tmp(r, (int)k, btmp, true);
        if (n->n_bops) {
            bwd_ops(r, n, (int)k);
        } else if (r->st == MP_OK) {
            struct mp_event ev = {.kind = MP_EV_BWD, .store = MP_ST_TMP, .id = (int)k, .node = (int)k,
                                  .phase = r->phase, .grad_of = r->grad_of, .grad_out_of_place = oop};
            r->st = r->fn(r->ctx, &ev);
        }
        /* torch's non-reentrant checkpoint hands the node the recomputed tensors and drops its own
         * reference as it does (checkpoint.py unpack_hook: holder.handles[gid] = None): they die
         * with the node's backward, before the engine makes the gradients it casts or sums
         * (validate_outputs); a tensor autograd saved itself lives until release_variables, after
         * that.  (Bench: the MoE routing-weights MulBackward0 under `layers`, pure bf16.) */
        if (r->recomp[i] && !n->n_bops)
            release_saved(r, n);
        for (int j = 0; j < 3; j++)
            if (late[j] >= 0 && !g_has(r, late[j]))
                g_new(r, late[j]);
        if (!r->recomp[i] && !n->n_bops) /* (bwd_ops released them op by op) */
            release_saved(r, n);
        if (passed >= 0)
            r->grefs[passed]++;
        if (!node_reads(n, n->out, 3))
            g_free(r, n->out);
        for (int j = 0; j < 3; j++) {
            int g = acc[j];
            if (g < 0 || r->grefs[r->grad_of[g]] == 1)
                continue; /* in place: old += new */
            int old = r->grad_of[g]; /* out of place: old + new, then the old storage loses g */
            g_new(r, g);
            g_unref(r, old);
        }
        if (passed >= 0)
            g_unref(r, passed);
        /* Under autocast the weight reaches the node through autocast's cast (ToCopyBackward0): the
         * node's gradient for it is the half one (its TMP); that node, run next, makes the fp32
         * gradient AccumulateGrad keeps, after the node released what it saved and its incoming
         * gradient (measured: 9 MiB of ViT-B's fc2 at 64x197 amp) */
        if (wcast >= 0 && r->st == MP_OK) {
            r->pglive[wcast] = true;
            emit(r, MP_EV_ALLOC, MP_ST_PGRAD, wcast, mp_param_grad_bytes(&p->params[wcast]));
            struct mp_event ev = {.kind = MP_EV_WGRAD_CAST, .store = MP_ST_PGRAD, .id = wcast, .node = (int)k,
                                  .phase = r->phase, .grad_of = r->grad_of};
            if (r->st == MP_OK)
                r->st = r->fn(r->ctx, &ev);
        }
        if (r->first_use) /* DDP gradient_as_bucket_view: the reducer copies the fresh grad into its
                           * bucket view and drops it once the parameter's last backward ran */
            for (int j = 0; j < 2; j++) {
                int q = n->param[j];
                if (q >= 0 && r->pglive[q] && r->first_use[q] == (int)k) {
                    r->pglive[q] = false;
                    emit(r, MP_EV_FREE, MP_ST_PGRAD, q, p->params[q].elems * mp_dtype_size(p->param_dtype));
                }
            }
        tmp(r, (int)k, btmp, false);
    }
    r->node = -1;
    r->recomp[i] = false;
    if (bp->output != bp->input) /* a block of views (flatten) passes its gradient on to block i-1 */
        g_free(r, bp->output);
    /* A hold left on x_{i+1} comes from recomputing block i (B_{i+1} already ran):
     * B_i consumes that recomputed output (rotor: B_i frees xb_{i+1}). */
    while (r->holds[bp->output] > 0 && bp->output != bp->input) {
        r->holds[bp->output]--;
        t_maybe_free(r, bp->output);
    }
    if (r->ckpt[i] && r->holds[bp->input] > 0) {
        r->ckpt[i] = false;
        r->holds[bp->input]--;
        t_maybe_free(r, bp->input);
    }
    const int shared[2] = {p->rope_tables, p->attn_mask};
    for (int j = 0; j < 2; j++)
        if (r->shared_block[j] == (int)i) {
            r->shared_block[j] = -1;
            r->holds[shared[j]]--;
            t_maybe_free(r, shared[j]);
        }
    release_held(r, (int)i);
}

static void loss_op(struct rp *r)
{
    const struct mp_program *p = r->p;
    int out = p->blocks[p->n_blocks - 1].output;
    r->phase = MP_PH_LOSS;
    /* the attention mask is a local of the model's forward: unless the block that first used it
     * is a checkpoint (whose inputs hold it until its backward), it dies with the forward */
    if (p->attn_mask >= 0 && r->shared_block[1] >= 0 && !r->ckpt[r->shared_block[1]]) {
        r->shared_block[1] = -1;
        r->holds[p->attn_mask]--;
        t_maybe_free(r, p->attn_mask);
    }
    release_held(r, -1);
    /* the autocast region ends with the forward (loss included), before backward:
     * its cache of weight copies is cleared */
    for (size_t t = 0; t < p->n_tensors; t++)
        if (r->cached[t]) {
            r->cached[t] = false;
            r->holds[t]--;
            t_maybe_free(r, (int)t);
        }
    if (r->st == MP_OK) {
        g_alloc(r, out);
        struct mp_event ev = {.kind = MP_EV_LOSS_GRAD, .store = MP_ST_GRAD, .id = out, .node = -1,
                              .phase = r->phase, .grad_of = r->grad_of};
        r->st = r->fn(r->ctx, &ev);
    }
    /* the loss frees a plain x_L (checkpointing.md §8): nothing saved holds it */
    if (r->holds[out] > 0 && r->saved[out] == 0) {
        r->holds[out]--;
        t_maybe_free(r, out);
    }
}

/* The optimizer step's temporaries (kind ALLOC or FREE): per trainable parameter q (foreach),
 * tmp_of[q] x ps bytes (sharded) or its gradient's size; else one of otmp bytes (if any). */
static void opt_tmps(struct rp *r, enum mp_ev_kind kind, bool per_param, const uint64_t *tmp_of, uint64_t ps,
                     uint64_t otmp)
{
    const struct mp_program *p = r->p;
    if (per_param) {
        for (size_t q = 0; q < p->n_params; q++)
            if (p->params[q].trainable)
                emit(r, kind, MP_ST_OPT_TMP, (int)q, tmp_of ? tmp_of[q] * ps : mp_param_grad_bytes(&p->params[q]));
    } else if (otmp)
        emit(r, kind, MP_ST_OPT_TMP, 0, otmp);
}

/* mp_replay under a data-parallel plan already made (a fold's, weighted), or NULL to make it. */
static enum mp_status replay_plan(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, const struct mp_par_plan *given, mp_event_fn fn,
                                  void *ctx, struct mp_diag *d);

enum mp_status mp_replay(const struct mp_program *p, const struct mp_schedule *sched, const struct mp_train_opts *t,
                         mp_event_fn fn, void *ctx, struct mp_diag *d)
{
    return replay_plan(p, sched, t, NULL, fn, ctx, d);
}

static enum mp_status replay_plan(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, const struct mp_par_plan *given, mp_event_fn fn,
                                  void *ctx, struct mp_diag *d)
{
    struct rp r = {.p = p, .t = t, .fn = fn, .ctx = ctx, .d = d, .st = MP_OK, .node = -1, .shared_block = {-1, -1}};
    size_t nt = p->n_tensors ? p->n_tensors : 1;
    r.live = calloc(nt, sizeof(bool));
    r.grad_of = malloc(nt * sizeof *r.grad_of);
    r.grefs = calloc(nt, sizeof *r.grefs);
    r.is_input = calloc(nt, sizeof(bool));
    r.pglive = calloc(p->n_params ? p->n_params : 1, sizeof(bool));
    r.uses = calloc(nt, sizeof(int));
    r.saved = calloc(nt, sizeof(int));
    r.holds = calloc(nt, sizeof(int));
    r.ckpt = calloc(p->n_blocks ? p->n_blocks : 1, sizeof(bool));
    r.recomp = calloc(p->n_blocks ? p->n_blocks : 1, sizeof(bool));
    r.cached = calloc(nt, sizeof(bool));
    struct mp_schedule none;
    mp_schedule_init(&none);
    enum mp_status st = MP_OK;
    struct mp_par_plan plan;
    memset(&plan, 0, sizeof plan);
    r.ag_held = r.rs_pending = -1;
    if (t->par && t->par->strategy != MP_PAR_NONE) {
        if (!given) {
            st = mp_par_plan_make(t->par, p, t->optimizer, &plan, d);
            if (st != MP_OK)
                goto out;
        }
        r.pp = given ? given : &plan;
        if (r.pp->par.strategy == MP_PAR_DDP && r.pp->par.ddp_grad_as_bucket_view) {
            r.first_use = malloc((p->n_params ? p->n_params : 1) * sizeof *r.first_use);
            if (!r.first_use) {
                st = mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
                goto out;
            }
            for (size_t q = 0; q < p->n_params; q++)
                r.first_use[q] = -1;
            for (size_t k = p->n_nodes; k-- > 0;)
                for (int j = 0; j < 2; j++)
                    if (p->nodes[k].param[j] >= 0)
                        r.first_use[p->nodes[k].param[j]] = (int)k;
        }
        size_t ng = r.pp->n_groups ? r.pp->n_groups : 1;
        r.uns = calloc(ng, sizeof(bool));
        r.ag_pending = calloc(ng, sizeof(bool));
        r.rs_out = calloc(ng, sizeof(bool));
        r.borrow_list = calloc(ng, sizeof *r.borrow_list);
        if (!r.uns || !r.ag_pending || !r.rs_out || !r.borrow_list) {
            st = mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
            goto out;
        }
    }
    if (!r.live || !r.grad_of || !r.grefs || !r.is_input || !r.pglive || !r.uses || !r.saved || !r.holds ||
        !r.ckpt || !r.recomp || !r.cached) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory replaying the training step");
        goto out;
    }
    for (size_t i = 0; i < nt; i++)
        r.grad_of[i] = -1;
    if (!sched) {
        st = mp_ckpt_schedule_none(p->n_blocks, &none);
        if (st != MP_OK) {
            mp_fail(d, st, "out of memory building the schedule");
            goto out;
        }
        sched = &none;
    }

    /* setup: parameters, optimizer state, workspace, the batch */
    r.phase = MP_PH_SETUP;
    for (size_t q = 0; q < p->n_params; q++) {
        uint64_t b = par_param_bytes(&r, q);
        if (b)
            emit(&r, MP_EV_ALLOC, MP_ST_PARAM, (int)q, b);
    }
    for (size_t q = 0; q < p->n_params && par_opt_per_param(&r); q++) {
        uint64_t b = r.pp ? mp_par_opt_state_bytes(r.pp, p, t->optimizer, q)
                          : mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
        if (b)
            emit(&r, MP_EV_ALLOC, MP_ST_OPT_STATE, (int)q, b);
    }
    if (r.pp)
        par_setup(&r);
    if (t->cublas_workspace_bytes)
        emit(&r, MP_EV_ALLOC, MP_ST_WORKSPACE, 0, t->cublas_workspace_bytes);
    if (t->accumulate && fsdp(&r)) /* sharded gradients left by the previous micro-steps */
        for (size_t g = 0; g < r.pp->n_groups; g++) {
            comm(&r, true, g, MP_COMM_RS_OUT, r.pp->groups[g].shard_elems * r.pp->reduce_elem_bytes);
            r.rs_out[g] = true;
        }
    else if (t->accumulate && !(r.pp && (r.pp->par.strategy == MP_PAR_ZERO2 || r.pp->par.strategy == MP_PAR_ZERO3)))
        for (size_t q = 0; q < p->n_params; q++) {
            if (!p->params[q].trainable)
                continue;
            r.pglive[q] = true;
            emit(&r, MP_EV_ALLOC, MP_ST_PGRAD, (int)q, mp_param_grad_bytes(&p->params[q]));
        }
    r.is_input[p->input] = true;
    r.live[p->input] = true;
    emit(&r, MP_EV_ALLOC, MP_ST_INPUT, p->input, p->tensors[p->input].bytes);
    if (p->labels >= 0) {
        r.is_input[p->labels] = true;
        r.live[p->labels] = true;
        emit(&r, MP_EV_ALLOC, MP_ST_INPUT, p->labels, p->tensors[p->labels].bytes);
    }
    for (size_t b = 0; b < p->n_buffers; b++) { /* module buffers: resident like the batch */
        r.is_input[p->buffers[b]] = true;
        r.live[p->buffers[b]] = true;
        emit(&r, MP_EV_ALLOC, MP_ST_INPUT, p->buffers[b], p->tensors[p->buffers[b]].bytes);
    }

    bool after_loss = false;
    for (size_t k = 0; k < sched->n && r.st == MP_OK; k++) {
        const struct mp_sched_op *op = &sched->ops[k];
        if (op->kind != MP_SCHED_LOSS && op->index >= p->n_blocks)
            MP_BUG("schedule op index %u out of range", op->index);
        emit(&r, MP_EV_OP_BEGIN, MP_ST_TMP, (int)k, 0);
        switch (op->kind) {
        case MP_SCHED_FN:
        case MP_SCHED_FC:
        case MP_SCHED_FE:
            r.phase = after_loss ? MP_PH_RECOMPUTE : MP_PH_FORWARD;
            par_pre_fwd(&r, op->index);
            fwd_block(&r, op->index, op->kind,
                      after_loss && k + 1 < sched->n && sched->ops[k + 1].kind == MP_SCHED_B &&
                          sched->ops[k + 1].index == op->index);
            par_post_fwd(&r, op->index);
            break;
        case MP_SCHED_LOSS:
            loss_op(&r);
            after_loss = true;
            break;
        case MP_SCHED_B:
            r.phase = MP_PH_BACKWARD;
            par_pre_bwd(&r, op->index);
            bwd_block(&r, op->index);
            par_post_bwd(&r, op->index);
            break;
        }
        emit(&r, MP_EV_OP_END, MP_ST_TMP, (int)k, 0);
    }
    /* optimizer step, then zero_grad(set_to_none=True) */
    /* The step's temporaries are per-parameter tensors (foreach ops return one
     * output per input), all alive together for Adam's _foreach_sqrt; Adafactor's
     * is one tensor the size of the largest parameter (id 0). */
    r.phase = MP_PH_STEP;
    bool per_param = mp_optimizer_tmp(t->optimizer) == MP_OPT_TMP_ALL_GRADS;
    uint64_t ps = mp_dtype_size(p->param_dtype); /* sharded paths: per element */
    uint64_t total_grad = 0, largest_grad = 0; /* (mp_opt_step_tmp_bytes, with the total checked) */
    for (size_t q = 0; q < p->n_params; q++) {
        total_grad = r_add(&r, total_grad, mp_param_grad_bytes(&p->params[q]));
        largest_grad = mp_max_u64(largest_grad, mp_param_grad_bytes(&p->params[q]));
    }
    uint64_t otmp = mp_opt_step_tmp_of(t->optimizer, total_grad, largest_grad);
    /* Sharded: torch's foreach AdamW works on the fp32 shards (FSDP2); DeepSpeed's fused
     * Adam has no temporaries but ZeRO-1/2 make an fp32 gradient partition; offload steps
     * on the host. */
    uint64_t *tmp_of = NULL;
    bool z12 = r.pp && (r.pp->par.strategy == MP_PAR_ZERO1 || r.pp->par.strategy == MP_PAR_ZERO2);
    if (r.pp && (mp_par_is_deepspeed(r.pp->par.strategy) || r.pp->par.offload != MP_OFFLOAD_NONE)) {
        per_param = false;
        otmp = 0;
        if (z12 && r.pp->par.offload == MP_OFFLOAD_NONE)
            comm(&r, true, 0, MP_COMM_STEP_GRAD, r.pp->partition_elems * 4);
    } else if (r.pp && mp_par_is_fsdp(r.pp->par.strategy)) {
        tmp_of = r.pp->shard_elems;
        ps = r.pp->master_elem_bytes;
        otmp = 0;
        for (size_t q = 0; q < p->n_params; q++)
            otmp = per_param ? otmp + tmp_of[q] * ps : mp_max_u64(otmp, tmp_of[q] * ps);
    }
    opt_tmps(&r, MP_EV_ALLOC, per_param, tmp_of, ps, otmp);
    if (r.st == MP_OK) {
        struct mp_event ev = {.kind = MP_EV_OPT_STEP, .store = MP_ST_OPT_TMP, .node = -1, .phase = r.phase};
        r.st = fn(ctx, &ev);
    }
    opt_tmps(&r, MP_EV_FREE, per_param, tmp_of, ps, otmp);
    if (z12 && r.pp->par.offload == MP_OFFLOAD_NONE)
        comm(&r, false, 0, MP_COMM_STEP_GRAD, r.pp->partition_elems * 4);
    r.phase = MP_PH_END;
    if (r.pp) /* zero_grad(set_to_none=True) frees the sharded gradients */
        for (size_t g = 0; g < r.pp->n_groups; g++)
            if (r.rs_out[g])
                comm(&r, false, g, MP_COMM_RS_OUT, r.pp->groups[g].shard_elems * r.pp->reduce_elem_bytes);
    for (size_t q = 0; q < p->n_params; q++)
        if (r.pglive[q])
            emit(&r, MP_EV_FREE, MP_ST_PGRAD, (int)q, mp_param_grad_bytes(&p->params[q]));
    /* Anything still live is a bookkeeping bug; release it so visitors stay balanced. */
    for (size_t i = 0; i < p->n_tensors && r.st == MP_OK; i++) {
        g_free(&r, (int)i);
        if (r.live[i] && !r.is_input[i]) {
            r.live[i] = false;
            emit(&r, MP_EV_FREE, MP_ST_ACT, (int)i, p->tensors[i].bytes);
        }
    }
    st = r.st;
out:
    mp_schedule_release(&none);
    mp_par_plan_release(&plan);
    free(r.uns);
    free(r.first_use);
    free(r.ag_pending);
    free(r.rs_out);
    free(r.borrow_list);
    free(r.live);
    free(r.grad_of);
    free(r.grefs);
    free(r.is_input);
    free(r.pglive);
    free(r.uses);
    free(r.saved);
    free(r.holds);
    free(r.ckpt);
    free(r.recomp);
    free(r.cached);
    return st;
}

/* ---- caching-allocator model (memory-facts §7) --------------------------------------------- */

/* Blocks of a segment form a doubly linked list in address order, so a freed
 * block merges with free neighbours as in CUDACachingAllocator; free blocks
 * are also kept in an unordered array for the best-fit search. */
struct ablk {
    uint64_t size;
    int prev, next;  /* neighbours in the segment, -1 at the ends */
    int free_pos;    /* index in free[], -1 when allocated */
    bool small;      /* small pool (<= 1 MiB requests, 2 MiB segments) */
};

struct alloc_sim {
    struct ablk *b;
    int n, cap;
    int *dead;       /* recycled entries */
    int n_dead, cap_dead;
    int *freel;      /* free blocks */
    int n_free, cap_free;
    uint64_t reserved, peak_reserved;
    bool nomem;
    bool overflow;   /* reserved bytes left 64 bits */
};

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
static int asim_alloc(struct alloc_sim *a, uint64_t bytes)
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

static void asim_free(struct alloc_sim *a, int i)
{
    free_list_add(a, i);
    int nx = a->b[i].next, pv = a->b[i].prev;
    if (nx >= 0 && a->b[nx].free_pos >= 0)
        asim_merge(a, i, nx);
    if (pv >= 0 && a->b[pv].free_pos >= 0)
        asim_merge(a, pv, i);
}

static void asim_release(struct alloc_sim *a)
{
    free(a->b);
    free(a->dead);
    free(a->freel);
}

/* ---- the estimator's visitor --------------------------------------------------------------- */

struct counter {
    const struct mp_program *p;
    uint64_t cur, cur_req, peak, peak_req;
    enum mp_phase peak_phase;
    int peak_node;
    enum mp_store peak_store;
    int peak_id;
    uint64_t act_at_loss;
    bool have_loss;
    uint64_t act_cur; /* ACT + GRAD + TMP */
    struct alloc_sim as;
    size_t *blk_of;   /* allocation key -> asim block */
    size_t nkeys;
    bool warm;        /* second step: persistent storages keep their blocks */
    bool no_asim;     /* program too large for the allocator model: reserved = allocated */
    bool overflow;    /* the bytes left 64 bits (MP_ERR_RANGE) */
    struct fold_meter *fm; /* a fold's short program (fold_event), else NULL */
};

/* bytes rounded up to the allocator's 512-byte granule, false when that leaves 64 bits */
static bool round512(uint64_t bytes, uint64_t *r)
{
    if (bytes > UINT64_MAX - 511)
        return false;
    *r = mp_round512(bytes);
    return true;
}

static size_t key_of(const struct mp_program *p, const struct mp_event *ev)
{
    /* distinct slots per store kind */
    size_t nt = p->n_tensors, np = p->n_params, nn = p->n_nodes;
    switch (ev->store) {
    case MP_ST_PARAM: return (size_t)ev->id;
    case MP_ST_OPT_STATE: return np + (size_t)ev->id;
    case MP_ST_PGRAD: return 2 * np + (size_t)ev->id;
    case MP_ST_OPT_TMP: return 3 * np + (size_t)ev->id;
    case MP_ST_WORKSPACE: return 4 * np + 1;
    case MP_ST_INPUT:
    case MP_ST_ACT: return 4 * np + 2 + (size_t)ev->id;
    case MP_ST_GRAD: return 4 * np + 2 + nt + (size_t)ev->id;
    case MP_ST_TMP: return 4 * np + 2 + 2 * nt + (size_t)ev->id;
    case MP_ST_COMM: return 4 * np + 2 + 2 * nt + nn + 1 + (size_t)ev->id;
    }
    (void)nn;
    return 0;
}

/* Communication buffers that live for the whole run (DDP / DeepSpeed buckets, partitions). */
static bool persistent_comm(const struct mp_program *p, size_t key)
{
    size_t base = 4 * p->n_params + 2 + 2 * p->n_tensors + p->n_nodes + 1;
    if (key < base)
        return false;
    size_t kind = (key - base) % MP_COMM_KINDS;
    return kind == MP_COMM_BUCKET || kind == MP_COMM_PARTITION;
}

/* After an allocation: a new peak is where the event is. */
static void note_peak(struct counter *c, const struct mp_event *ev)
{
    if (c->cur > c->peak) {
        c->peak = c->cur;
        c->peak_phase = ev->phase;
        c->peak_node = ev->node;
        c->peak_store = ev->store;
        c->peak_id = ev->id;
    }
    if (c->cur_req > c->peak_req)
        c->peak_req = c->cur_req;
}

static enum mp_status count_event(void *ctx, const struct mp_event *ev)
{
    struct counter *c = ctx;
    if (ev->kind == MP_EV_LOSS_GRAD && !c->have_loss) {
        c->have_loss = true;
        c->act_at_loss = c->act_cur;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    uint64_t r = 0;
    bool act = ev->store == MP_ST_ACT || ev->store == MP_ST_GRAD || ev->store == MP_ST_TMP;
    size_t key = key_of(c->p, ev);
    if (ev->kind == MP_EV_ALLOC) {
        if (!round512(ev->bytes, &r) || !mp_add_u64(c->cur, r, &c->cur) ||
            !mp_add_u64(c->cur_req, ev->bytes, &c->cur_req) || (act && !mp_add_u64(c->act_cur, r, &c->act_cur))) {
            c->overflow = true;
            return MP_ERR_RANGE;
        }
        note_peak(c, ev);
        if (ev->bytes && key < c->nkeys && !c->no_asim && !(c->warm && ev->phase == MP_PH_SETUP)) {
            int b = asim_alloc(&c->as, ev->bytes);
            if (b < 0 && c->as.overflow) {
                c->overflow = true;
                return MP_ERR_RANGE;
            }
            if (b < 0)
                return MP_ERR_NOMEM;
            c->blk_of[key] = (size_t)b + 1;
        }
    } else {
        r = mp_round512(ev->bytes); /* (allocated before: it was checked then) */
        c->cur -= r;
        c->cur_req -= ev->bytes;
        if (act)
            c->act_cur -= r;
        if (ev->bytes && c->blk_of && key < c->nkeys && c->blk_of[key]) {
            asim_free(&c->as, (int)c->blk_of[key] - 1);
            c->blk_of[key] = 0;
        }
    }
    return MP_OK;
}

/* ---- a fold's short program counted as the full model (fold.h) -------------------------------
 * A step of the blocks' schedule (forwards or backwards in a row on one unit) on a weighted unit
 * runs weight times in a row on its copies: each run starts where the one before ended, so the
 * step's peak is its first or last run's (as the step frees or adds memory), and it adds weight
 * times what one run adds.  Outside the blocks' ops (setup, loss, optimizer step, the end) a parameter, tensor or
 * node of a weighted block stands for that many.  Each op's events are hashed: the ops of an
 * interval's two interior blocks must agree. */
/* One level's step in progress (fold.h: level 0 the ops in a row on a unit, level 1 on a
 * super-unit, whose steps hold whole steps of level 0). */
struct fold_step {
    bool on;                 /* a step of this level is open */
    uint64_t w;              /* the copies it runs on */
    size_t op;               /* its first op */
    uint64_t b_cur, b_req, b_act; /* at its start */
    bool l_has;              /* a weighted step allocated: its highest point above b_cur, and where */
    int64_t l_max, l_req;
    enum mp_phase l_phase;
    int l_node, l_id;
    enum mp_store l_store;
    uint64_t l_shift;        /* that point's copy: this many full blocks above its short block's */
    bool desc;               /* the step's runs go down the units */
    uint64_t h;              /* its events, hashed (fold_hash) */
};

struct fold_meter {
    const struct mp_fold *f;
    bool per_param_opt;      /* the optimizer's step temporaries are one per parameter */
    bool in_blocks;          /* in a forward or backward op: counted once or by the op's weight */
    int levels;              /* mp_fold_levels */
    struct fold_step lv[2];
    uint64_t peak_shift;     /* the peak is in the copy this many full blocks above the short block's */
    uint64_t *sig[2];        /* per short op that starts a step of the level */
    bool overflow;
    const struct mp_par_plan *pp; /* data parallel: the weighted plan (its groups' weights) */
};

/* Mixes a word into the op's hash.  Each word's step (xor, odd multiply, xor-shift) is one-to-one
 * on the hash, so two ops whose events differ in one word always hash apart (the bytewise FNV-1a
 * it replaces took eight serial multiplies a word: a tenth of suggest's time on long folds). */
static void fold_hash(struct fold_meter *m, uint64_t v)
{
    for (int l = 0; l < m->levels; l++)
        if (m->lv[l].on) {
            uint64_t h = (m->lv[l].h ^ v) * 0x9E3779B97F4A7C15ULL;
            m->lv[l].h = h ^ (h >> 29);
        }
}

/* base + k x delta + extra, in 64 bits: false when it leaves them */
static bool fold_affine(uint64_t base, uint64_t k, int64_t delta, int64_t extra, uint64_t *out)
{
    uint64_t ad = delta < 0 ? 0 - (uint64_t)delta : (uint64_t)delta, ae = extra < 0 ? 0 - (uint64_t)extra : (uint64_t)extra;
    uint64_t m, v = base;
    if (!mp_mul_u64(k, ad, &m))
        return false;
    if (delta >= 0 ? !mp_add_u64(v, m, &v) : m > v)
        return false;
    if (delta < 0)
        v -= m;
    if (extra >= 0 ? !mp_add_u64(v, ae, &v) : ae > v)
        return false;
    if (extra < 0)
        v -= ae;
    *out = v;
    return true;
}

/* How many of its kind the event's parameter, tensor or node stands for. */
static uint64_t fold_entity_weight(const struct counter *c, const struct mp_event *ev)
{
    const struct mp_program *p = c->p;
    int b = -1;
    switch (ev->store) {
    case MP_ST_OPT_TMP:
        if (!c->fm->per_param_opt)
            return 1; /* one temporary, the size of the largest gradient */
        /* fall through */
    case MP_ST_PARAM:
    case MP_ST_OPT_STATE:
    case MP_ST_PGRAD: b = ev->id >= 0 && (size_t)ev->id < p->n_params ? p->params[ev->id].block : -1; break;
    case MP_ST_INPUT:
    case MP_ST_ACT:
    case MP_ST_GRAD: b = ev->id >= 0 && (size_t)ev->id < p->n_tensors ? p->tensors[ev->id].block : -1; break;
    case MP_ST_TMP: b = ev->id >= 0 && (size_t)ev->id < p->n_nodes ? p->nodes[ev->id].block : -1; break;
    case MP_ST_COMM: {
        /* a group's buffers (FSDP2 / ZeRO-3) stand for its copies; buckets and partitions are
         * the full model's already (mp_par_plan_make_weighted) */
        size_t g = (size_t)ev->id / MP_COMM_KINDS, k = (size_t)ev->id % MP_COMM_KINDS;
        bool per_group = k == MP_COMM_AG_OUT || k == MP_COMM_COPY_IN || k == MP_COMM_UNSHARD ||
                         k == MP_COMM_RS_IN || k == MP_COMM_RS_OUT;
        const struct mp_par_plan *pp = c->fm->pp;
        return per_group && pp && pp->group_weight && g < pp->n_groups ? pp->group_weight[g] : 1;
    }
    default: break;
    }
    return mp_fold_weight(c->fm->f, b);
}

/* A high point of the replay (cur at pk, requested bytes at pr, made by the attributed event, in
 * the copy `shift` full blocks above its short block): the innermost open weighted step above
 * `level` keeps it, relative to its start, else it is the step's peak if higher. */
static void fold_high(struct counter *c, struct fold_meter *m, int level, uint64_t pk, uint64_t pr,
                      enum mp_phase phase, int node, enum mp_store store, int id, uint64_t shift)
{
    for (int l = level; l < m->levels; l++) {
        struct fold_step *s = &m->lv[l];
        if (!s->on || s->w <= 1)
            continue;
        int64_t lc = (int64_t)(pk - s->b_cur), lr = (int64_t)(pr - s->b_req);
        if (!s->l_has || lc > s->l_max) {
            s->l_max = lc;
            s->l_phase = phase, s->l_node = node, s->l_store = store, s->l_id = id;
            s->l_shift = shift;
        }
        if (!s->l_has || lr > s->l_req)
            s->l_req = lr;
        s->l_has = true;
        return;
    }
    if (pk > c->peak) {
        c->peak = pk;
        c->peak_phase = phase, c->peak_node = node, c->peak_store = store, c->peak_id = id;
        m->peak_shift = shift;
    }
    if (pr > c->peak_req)
        c->peak_req = pr;
}

/* Opens level l's step at op k (a forward or backward on short block j). */
static void fold_open(struct counter *c, struct fold_meter *m, int l, size_t k, uint32_t j)
{
    const struct mp_fold *f = m->f;
    const struct mp_schedule *fs = &f->sched;
    struct fold_step *s = &m->lv[l];
    s->on = true;
    s->op = k;
    s->w = mp_fold_step_weight(f, l, j);
    /* a run down the units (a backward) meets the unit before, the first interior one, next */
    size_t e = k + mp_fold_step_len(f, l, k);
    s->desc = s->w > 1 && e < fs->n && fs->ops[e].kind != MP_SCHED_LOSS && mp_fold_unit_before(f, l, fs->ops[e].index, j);
    s->h = 1469598103934665603ULL;
    s->b_cur = c->cur, s->b_req = c->cur_req, s->b_act = c->act_cur;
    s->l_has = false;
}

/* Closes level l's step: its runs on the copies it stands for, one after another. */
static enum mp_status fold_close(struct counter *c, struct fold_meter *m, int l, uint32_t j)
{
    struct fold_step *s = &m->lv[l];
    s->on = false;
    m->sig[l][s->op] = s->h;
    uint64_t w = s->w;
    if (w <= 1)
        return MP_OK;
    int64_t dc = (int64_t)(c->cur - s->b_cur), dr = (int64_t)(c->cur_req - s->b_req), da = (int64_t)(c->act_cur - s->b_act);
    uint64_t pk = 0, pr = 0;
    uint64_t kc = dc > 0 ? w - 1 : 0, kr = dr > 0 ? w - 1 : 0;
    if (s->l_has && (!fold_affine(s->b_cur, kc, dc, s->l_max, &pk) || !fold_affine(s->b_req, kr, dr, s->l_req, &pr)))
        m->overflow = true;
    if (!fold_affine(s->b_cur, w, dc, 0, &c->cur) || !fold_affine(s->b_req, w, dr, 0, &c->cur_req) ||
        !fold_affine(s->b_act, w, da, 0, &c->act_cur))
        m->overflow = true;
    if (m->overflow)
        return MP_ERR_RANGE;
    if (s->l_has) { /* the copy the high point is in: its offset from the short unit's, in units */
        uint64_t rep = s->desc ? w - 1 - kc : kc, shift;
        if (!mp_mul_u64(rep, mp_fold_unit_len(m->f, l, j), &shift) || !mp_add_u64(shift, s->l_shift, &shift)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        fold_high(c, m, l + 1, pk, pr, s->l_phase, s->l_node, s->l_store, s->l_id, shift);
    }
    return MP_OK;
}

static enum mp_status fold_event(void *ctx, const struct mp_event *ev)
{
    struct counter *c = ctx;
    struct fold_meter *m = c->fm;
    const struct mp_fold *f = m->f;
    const struct mp_schedule *fs = &f->sched;
    if (ev->kind == MP_EV_OP_BEGIN) {
        size_t k = (size_t)ev->id;
        const struct mp_sched_op *op = &fs->ops[k];
        m->in_blocks = op->kind != MP_SCHED_LOSS;
        if (!m->in_blocks)
            return MP_OK;
        bool cont = k > 0 && fs->ops[k - 1].kind != MP_SCHED_LOSS; /* the op before was a block's */
        for (int l = m->levels - 1; l >= 0; l--) /* outer steps open first */
            if (!cont || !mp_fold_same_unit(f, l, fs->ops[k - 1].index, op->index))
                fold_open(c, m, l, k, op->index);
        return MP_OK;
    }
    if (ev->kind == MP_EV_OP_END) {
        size_t k = (size_t)ev->id;
        const struct mp_sched_op *op = &fs->ops[k];
        if (op->kind == MP_SCHED_LOSS)
            return MP_OK;
        bool cont = k + 1 < fs->n && fs->ops[k + 1].kind != MP_SCHED_LOSS; /* a block's op follows */
        for (int l = 0; l < m->levels; l++) /* inner steps close first */
            if (!cont || !mp_fold_same_unit(f, l, fs->ops[k + 1].index, op->index)) {
                if (l == 0)
                    m->in_blocks = false;
                enum mp_status st = fold_close(c, m, l, op->index);
                if (st != MP_OK)
                    return st;
            }
        return MP_OK;
    }
    if (ev->kind == MP_EV_LOSS_GRAD && !c->have_loss) {
        c->have_loss = true;
        c->act_at_loss = c->act_cur;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    fold_hash(m, (uint64_t)ev->kind << 8 | (uint64_t)ev->store);
    fold_hash(m, ev->bytes);
    uint64_t w = m->in_blocks ? 1 : fold_entity_weight(c, ev), r = 0, q = ev->bytes;
    if (!round512(ev->bytes, &r) || (w != 1 && (!mp_mul_u64(r, w, &r) || !mp_mul_u64(q, w, &q)))) {
        m->overflow = true;
        return MP_ERR_RANGE;
    }
    bool act = ev->store == MP_ST_ACT || ev->store == MP_ST_GRAD || ev->store == MP_ST_TMP;
    if (ev->kind == MP_EV_FREE) {
        c->cur -= r;
        c->cur_req -= q;
        if (act)
            c->act_cur -= r;
        return MP_OK;
    }
    if (!mp_add_u64(c->cur, r, &c->cur) || !mp_add_u64(c->cur_req, q, &c->cur_req) ||
        (act && !mp_add_u64(c->act_cur, r, &c->act_cur))) {
        m->overflow = true;
        return MP_ERR_RANGE;
    }
    fold_high(c, m, 0, c->cur, c->cur_req, ev->phase, ev->node, ev->store, ev->id, 0);
    return MP_OK;
}

void mp_estimate_release(struct mp_estimate *e)
{
    if (!e)
        return;
    free(e->blocks);
    e->blocks = NULL;
}

/* The batch and the module buffers (resident from the start), into e; false on an overflow. */
static bool inputs_bytes(const struct mp_program *p, struct mp_estimate *e)
{
    bool ok = mp_add_u64(p->tensors[p->input].bytes, p->labels >= 0 ? p->tensors[p->labels].bytes : 0,
                         &e->input_bytes);
    for (size_t b = 0; b < p->n_buffers; b++)
        ok = ok && mp_add_u64(e->module_buffers_bytes, p->tensors[p->buffers[b]].bytes, &e->module_buffers_bytes);
    return ok;
}

/* e->static_bytes: what is resident before the step, the cuBLAS workspace included.  With the
 * gradients it is all live as the optimizer step starts: that sum must fit 64 bits too. */
static enum mp_status static_total(const struct mp_program *p, struct mp_estimate *e, struct mp_diag *d)
{
    uint64_t s = e->weights_bytes, all;
    if (!mp_add_u64(s, e->optimizer_bytes, &s) || !mp_add_u64(s, e->input_bytes, &s) ||
        !mp_add_u64(s, e->module_buffers_bytes, &s) || !mp_add_u64(s, e->grads_bytes, &all))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    if (!mp_add_u64(s, e->workspace_bytes, &e->static_bytes) || !mp_add_u64(all, e->workspace_bytes, &all))
        return mp_fail(d, MP_ERR_RANGE, "%s: the cuBLAS workspace (--workspace) of %llu bytes overflows 64 bits "
                       "with the weights, gradients and optimizer state", p->model->path,
                       (unsigned long long)e->workspace_bytes);
    return MP_OK;
}

/* The step's bytes left 64 bits: MP_ERR_RANGE, naming --workspace when it is most of them. */
static enum mp_status peak_overflow(const struct mp_program *p, const struct mp_train_opts *t, struct mp_diag *d)
{
    if (t->cublas_workspace_bytes > UINT64_MAX / 2)
        return mp_fail(d, MP_ERR_RANGE, "%s: memory overflows 64 bits with the cuBLAS workspace (--workspace) of %llu "
                       "bytes", p->model->path, (unsigned long long)t->cublas_workspace_bytes);
    return mp_fail(d, MP_ERR_RANGE, "%s: memory overflows 64 bits", p->model->path);
}

/* e's peak on the device: the allocated peak plus the CUDA context. */
static enum mp_status device_peak(const struct mp_program *p, uint64_t context_bytes, struct mp_estimate *e,
                                  struct mp_diag *d)
{
    e->overhead_bytes = context_bytes;
    if (!mp_add_u64(e->peak_allocated_bytes, context_bytes, &e->peak_device_bytes))
        return mp_fail(d, MP_ERR_RANGE, "%s: the CUDA context (--context) of %llu bytes overflows 64 bits with "
                       "the peak", p->model->path, (unsigned long long)context_bytes);
    return MP_OK;
}

/* One rank's resident figures under data-parallel plan pp (replacing one GPU's). */
static void par_static(const struct mp_par_plan *pp, const struct mp_train_opts *t, struct mp_estimate *e)
{
    e->world = pp->world;
    e->weights_bytes = pp->weights_bytes;
    e->grads_bytes = pp->grads_bytes;
    e->optimizer_bytes = pp->optimizer_bytes;
    e->buffers_bytes = pp->buffers_bytes;
    e->host_bytes = pp->host_bytes;
    e->nvme_bytes = pp->nvme_bytes;
    e->allgather_bytes = pp->allgather_bytes;
    e->reducescatter_bytes = pp->reducescatter_bytes;
    e->allreduce_bytes = pp->allreduce_bytes;
    e->pcie_bytes = pp->pcie_bytes;
    e->host_step_elems = pp->host_step_elems;
    e->n_groups = (size_t)pp->groups_total;
    if (mp_par_is_deepspeed(pp->par.strategy) || pp->par.offload != MP_OFFLOAD_NONE)
        e->optimizer_tmp_bytes = 0; /* fused Adam / the host steps */
    else if (mp_par_is_fsdp(pp->par.strategy) && e->optimizer_tmp_bytes)
        e->optimizer_tmp_bytes = mp_optimizer_tmp(t->optimizer) == MP_OPT_TMP_LARGEST ? e->optimizer_tmp_bytes / pp->world
                                                                  : pp->shard_total * pp->master_elem_bytes;
}

enum mp_status mp_estimate_static(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                                  struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    e->params = p->total_params;
    e->trainable_params = p->trainable_params;
    bool ok = true;
    for (size_t q = 0; q < p->n_params; q++)
        ok = ok && mp_add_u64(e->weights_bytes, p->params[q].raw_bytes, &e->weights_bytes) &&
             mp_add_u64(e->grads_bytes, mp_param_grad_bytes(&p->params[q]), &e->grads_bytes) &&
             mp_add_u64(e->optimizer_bytes, mp_opt_state_bytes(p, t->optimizer, &p->params[q]), &e->optimizer_bytes);
    if (!ok || !inputs_bytes(p, e))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    e->optimizer_tmp_bytes = mp_opt_step_tmp_bytes(p, t->optimizer); /* (at most grads_bytes: checked) */
    e->workspace_bytes = t->cublas_workspace_bytes;
    e->fwd_flops = p->fwd_flops;
    e->bwd_flops = p->bwd_flops;

    e->world = 1;
    if (t->par && t->par->strategy != MP_PAR_NONE) {
        struct mp_par_plan pp;
        enum mp_status st = mp_par_plan_make(t->par, p, t->optimizer, &pp, d);
        if (st != MP_OK)
            return st;
        par_static(&pp, t, e);
        mp_par_plan_release(&pp);
    }
    return static_total(p, e, d);
}

enum mp_status mp_estimate_run(const struct mp_program *p, const struct mp_schedule *sched,
                               const struct mp_train_opts *t, uint64_t context_bytes, struct mp_estimate *e,
                               struct mp_diag *d)
{
    return mp_estimate_run_chain(p, sched, t, context_bytes, NULL, e, d);
}

/* Block j's figures (activation: what it keeps for backward, from the chain). */
static void block_est(const struct mp_program *p, const struct mp_train_opts *t, size_t j, uint64_t activation,
                      struct mp_block_est *b)
{
    const struct mp_block_prog *bp = &p->blocks[j];
    b->params = bp->params;
    for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++) {
        b->weights_bytes += p->params[q].raw_bytes;
        b->grads_bytes += mp_param_grad_bytes(&p->params[q]);
        b->optimizer_bytes += mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
    }
    b->activation_bytes = activation;
    b->output_bytes = p->tensors[bp->output].bytes;
    b->fwd_flops = bp->fwd_flops;
    b->bwd_flops = bp->bwd_flops;
}

enum mp_status mp_estimate_run_chain(const struct mp_program *p, const struct mp_schedule *sched,
                                     const struct mp_train_opts *t, uint64_t context_bytes,
                                     const struct mp_chain *chain, struct mp_estimate *e, struct mp_diag *d)
{
    enum mp_status st = mp_estimate_static(p, t, e, d);
    if (st != MP_OK)
        return st;
    /* The allocator model scans free blocks per allocation; beyond this many nodes
     * (thousands of layers) it would dominate the run, so reserved falls back to the
     * allocated peak (fit decisions never use it). */
    struct counter c = {.p = p, .peak_node = -1, .no_asim = p->n_nodes > MP_ASIM_MAX_NODES || t->skip_reserved};
    c.nkeys = 4 * p->n_params + 2 + 2 * p->n_tensors + p->n_nodes + 1;
    if (t->par && t->par->strategy != MP_PAR_NONE) /* communication slots: groups or buckets */
        c.nkeys += (p->n_params + p->n_blocks + 2) * MP_COMM_KINDS;
    c.blk_of = c.no_asim ? NULL : calloc(c.nkeys, sizeof *c.blk_of); /* only the allocator model reads it */
    if (!c.no_asim && !c.blk_of)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    /* Two steps: the caching allocator reaches its steady state in the second. */
    for (int step = 0; step < (c.no_asim ? 1 : 2) && st == MP_OK; step++) {
        c.have_loss = false;
        st = mp_replay(p, sched, t, count_event, &c, d);
        if (st == MP_OK && step == 0) {
            c.cur = c.cur_req = c.act_cur = 0;
            c.warm = true; /* persistent storages (setup) keep their blocks; anything else
                            * still held would be a replay bug and is released */
            for (size_t k = 0; c.blk_of && k < c.nkeys; k++)
                if (c.blk_of[k] && k >= 3 * p->n_params && k != 4 * p->n_params + 1 && !persistent_comm(p, k) &&
                    !(k >= 4 * p->n_params + 2 && k < 4 * p->n_params + 2 + p->n_tensors &&
                      mp_program_resident(p, (int)(k - 4 * p->n_params - 2)))) {
                    asim_free(&c.as, (int)c.blk_of[k] - 1);
                    c.blk_of[k] = 0;
                }
        }
    }
    free(c.blk_of);
    asim_release(&c.as);
    if (st == MP_ERR_RANGE && c.overflow)
        return peak_overflow(p, t, d);
    if (st != MP_OK)
        return st == MP_ERR_NOMEM ? mp_fail(d, st, "out of memory") : st;
    e->peak_allocated_bytes = c.peak;
    e->peak_requested_bytes = c.peak_req;
    e->peak_reserved_bytes = mp_max_u64(c.as.peak_reserved, c.peak);
    e->activations_bytes = c.act_at_loss;
    /* What the GPU must have: the allocated peak plus the context.  Reserved can be
     * higher (cached blocks of other sizes), but on a failed cudaMalloc the caching
     * allocator frees its cached blocks and retries, so the cache does not decide
     * whether a step fits; fragmentation is left to the safety margin. */
    if ((st = device_peak(p, context_bytes, e, d)) != MP_OK)
        return st;
    e->peak_phase = c.peak_phase;
    if (c.peak_store == MP_ST_COMM && c.peak_node >= 0) {
        int b = p->nodes[c.peak_node].block;
        const char *bn = p->model && b >= 0 && (size_t)b < p->model->n_blocks ? p->model->blocks[b].name
                                                                               : p->nodes[c.peak_node].name;
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s %s", mp_phase_str(c.peak_phase), bn,
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_store == MP_ST_COMM) {
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_node >= 0)
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 p->nodes[c.peak_node].name);
    else
        snprintf(e->peak_event, sizeof e->peak_event, "%s", mp_phase_str(c.peak_phase));

    /* per block */
    e->n_blocks = p->n_blocks;
    e->blocks = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *e->blocks);
    if (!e->blocks)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    struct mp_chain own = {0};
    if (!chain) {
        st = mp_estimate_chain(p, &own, d);
        if (st != MP_OK)
            return st;
        chain = &own;
    }
    for (size_t i = 0; i < p->n_blocks; i++)
        block_est(p, t, i, chain->xb[i + 1], &e->blocks[i]);
    /* recompute FLOPs: forwards the schedule runs beyond one per block */
    if (sched) {
        size_t *runs = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *runs);
        if (!runs) {
            mp_chain_release(&own);
            return mp_fail(d, MP_ERR_NOMEM, "out of memory");
        }
        for (size_t k = 0; k < sched->n; k++) {
            const struct mp_sched_op *op = &sched->ops[k];
            if (op->kind == MP_SCHED_FN || op->kind == MP_SCHED_FC || op->kind == MP_SCHED_FE) {
                if (runs[op->index]++ > 0)
                    e->recompute_flops += p->blocks[op->index].fwd_flops;
                else if (op->kind != MP_SCHED_FE)
                    e->blocks[op->index].checkpointed = true;
            }
        }
        free(runs);
    }
    mp_chain_release(&own);
    return MP_OK;
}

/* ---- the chain for the checkpoint planner ----------------------------------------------------- */

struct chain_meter {
    uint64_t cur, peak;       /* activation bytes only (ACT, GRAD, TMP), unrounded */
    bool overflow;            /* they left 64 bits */
    uint64_t *begin, *end, *peak_in; /* per schedule op */
    size_t n_ops;
};

static enum mp_status chain_event(void *ctx, const struct mp_event *ev)
{
    struct chain_meter *m = ctx;
    if (ev->kind == MP_EV_OP_BEGIN && (size_t)ev->id < m->n_ops) {
        m->begin[ev->id] = m->cur;
        m->peak = m->cur;
        return MP_OK;
    }
    if (ev->kind == MP_EV_OP_END && (size_t)ev->id < m->n_ops) {
        m->end[ev->id] = m->cur;
        m->peak_in[ev->id] = m->peak;
        return MP_OK;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    if (ev->store != MP_ST_ACT && ev->store != MP_ST_GRAD && ev->store != MP_ST_TMP)
        return MP_OK;
    if (ev->kind == MP_EV_ALLOC) {
        if (!mp_add_u64(m->cur, ev->bytes, &m->cur)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        if (m->cur > m->peak)
            m->peak = m->cur;
    } else {
        m->cur -= ev->bytes;
    }
    return MP_OK;
}

void mp_estimate_chain_mark(const struct mp_program *p, struct mp_chain *c)
{
    for (size_t i = 0; i < c->L && i < p->n_blocks; i++)
        c->repeated[i] = p->model->blocks[i].repeat_group > 0;
}

/* One replay of the no-checkpoint schedule (Fe_0..Fe_{L-1}, Loss, B_{L-1}..B_0)
 * with a meter that snapshots at op boundaries: xb_{i+1} = growth over Fe_i,
 * ft_i = peak inside Fe_i above its end, bt_i = peak inside B_i above (its start
 * + y_i).  Sizes are unrounded bytes; costs are FLOPs. */
enum mp_status mp_estimate_chain(const struct mp_program *p, struct mp_chain *c, struct mp_diag *d)
{
    size_t L = p->n_blocks;
    enum mp_status st = mp_chain_init(c, L);
    if (st != MP_OK)
        return mp_fail(d, st, "out of memory");
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_schedule none;
    mp_schedule_init(&none);
    struct chain_meter m = {0};
    m.n_ops = 2 * L + 1;
    m.begin = calloc(m.n_ops, sizeof *m.begin);
    m.end = calloc(m.n_ops, sizeof *m.end);
    m.peak_in = calloc(m.n_ops, sizeof *m.peak_in);
    if (!m.begin || !m.end || !m.peak_in || mp_ckpt_schedule_none(L, &none) != MP_OK) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
        goto out;
    }
    st = mp_replay(p, &none, &t, chain_event, &m, d);
    if (st == MP_ERR_RANGE && m.overflow)
        st = mp_fail(d, st, "%s: the step's activations need more than 16 EiB (2^64 bytes) at once; use a smaller "
                     "--batch or --seq", p->model->path);
    if (st != MP_OK)
        goto out;
    for (size_t i = 0; i <= L; i++)
        c->x[i] = i < L ? p->tensors[p->blocks[i].input].bytes : p->tensors[p->blocks[L - 1].output].bytes;
    c->x[0] += p->labels >= 0 ? p->tensors[p->labels].bytes : 0;
    mp_estimate_chain_mark(p, c);
    c->xb[0] = c->x[0];
    for (size_t i = 0; i < L; i++) {
        c->f[i] = p->blocks[i].fwd_flops;
        c->b[i] = p->blocks[i].bwd_flops;
        /* a block can free more than it keeps (a small head that frees the last hidden state) */
        uint64_t grow = m.end[i] > m.begin[i] ? m.end[i] - m.begin[i] : 0;
        c->xb[i + 1] = mp_max_u64(grow, c->x[i + 1]);
        c->ft[i] = m.peak_in[i] > m.end[i] ? m.peak_in[i] - m.end[i] : 0;
        size_t bpos = L + 1 + (L - 1 - i);
        const struct mp_tensor *xi = &p->tensors[p->blocks[i].input];
        uint64_t yi = (i > 0 && xi->needs_grad) ? xi->bytes : 0;
        uint64_t base; /* (beyond 64 bits: nothing is above it) */
        if (!mp_add_u64(m.begin[bpos], yi, &base))
            base = UINT64_MAX;
        c->bt[i] = m.peak_in[bpos] > base ? m.peak_in[bpos] - base : 0;
    }
    c->b[L] = 0;
    {
        uint64_t base;
        if (!mp_add_u64(m.begin[L], c->x[L], &base))
            base = UINT64_MAX;
        c->bt[L] = m.peak_in[L] > base ? m.peak_in[L] - base : 0;
    }
out:
    mp_schedule_release(&none);
    free(m.begin);
    free(m.end);
    free(m.peak_in);
    if (st != MP_OK)
        mp_chain_release(c);
    return st;
}

/* ---- the full model's figures from its fold (fold.h) -------------------------------------------- */

static bool fold_mul(uint64_t a, uint64_t w, uint64_t *acc)
{
    uint64_t m;
    return mp_mul_u64(a, w, &m) && mp_add_u64(*acc, m, acc);
}

/* Can fold f's short program p stand for the full model (before its replay)?  Each weighted
 * block must be a verified copy (tensors a model hands to many blocks, T5's, are outside the
 * copies: made by an unweighted block and held as in the full replay). */
static bool fold_admits(const struct mp_fold *f, const struct mp_program *p)
{
    return mp_fold_copied(f, p);
}

/* The data-parallel plan of the full model from f's short program p (none on one GPU). */
static enum mp_status fold_par_plan(const struct mp_fold *f, const struct mp_program *p,
                                    const struct mp_train_opts *t, struct mp_par_plan *pp, bool *made,
                                    struct mp_diag *d)
{
    *made = t->par && t->par->strategy != MP_PAR_NONE;
    if (!*made)
        return MP_OK;
    enum mp_status st = mp_par_plan_make_weighted(t->par, p, t->optimizer, f->weight, pp, d);
    *made = st == MP_OK;
    return st;
}

/* The full model's static figures from f's short program p (pp: the weighted data-parallel plan,
 * or NULL on one GPU). */
static enum mp_status fold_static(const struct mp_fold *f, const struct mp_program *p, const struct mp_train_opts *t,
                                  const struct mp_par_plan *pp, struct mp_estimate *e, struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    uint64_t total_grad = 0, largest_grad = 0, adapter;
    bool ok = mp_fold_counts(f, p, &e->params, &e->trainable_params, &adapter);
    for (size_t q = 0; q < p->n_params; q++) {
        const struct mp_param *pq = &p->params[q];
        uint64_t w = mp_fold_weight(f, pq->block), g = mp_param_grad_bytes(pq);
        ok = ok && fold_mul(pq->raw_bytes, w, &e->weights_bytes) && fold_mul(g, w, &e->grads_bytes) &&
             fold_mul(mp_opt_state_bytes(p, t->optimizer, pq), w, &e->optimizer_bytes) && fold_mul(g, w, &total_grad);
        largest_grad = mp_max_u64(largest_grad, g);
    }
    for (size_t j = 0; j < p->n_blocks; j++) {
        e->fwd_flops += (double)f->weight[j] * p->blocks[j].fwd_flops;
        e->bwd_flops += (double)f->weight[j] * p->blocks[j].bwd_flops;
    }
    if (!ok || !inputs_bytes(p, e))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    e->workspace_bytes = t->cublas_workspace_bytes;
    e->optimizer_tmp_bytes = mp_opt_step_tmp_of(t->optimizer, total_grad, largest_grad);
    e->world = 1;
    if (pp)
        par_static(pp, t, e);
    return static_total(p, e, d);
}

enum mp_status mp_estimate_static_folded(const struct mp_fold *f, const struct mp_program *p,
                                         const struct mp_train_opts *t, struct mp_estimate *e, bool *holds,
                                         struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    *holds = fold_admits(f, p);
    if (!*holds)
        return MP_OK;
    struct mp_par_plan pp;
    bool made;
    enum mp_status st = fold_par_plan(f, p, t, &pp, &made, d);
    if (st == MP_OK)
        st = fold_static(f, p, t, made ? &pp : NULL, e, d);
    if (made)
        mp_par_plan_release(&pp);
    return st;
}

enum mp_status mp_estimate_run_folded(const struct mp_fold *f, const struct mp_program *p,
                                      const struct mp_schedule *full, const struct mp_train_opts *t,
                                      uint64_t context_bytes, const struct mp_chain *chain, struct mp_estimate *e,
                                      bool *holds, struct mp_diag *d)
{
    *holds = false;
    memset(e, 0, sizeof *e);
    if (!fold_admits(f, p))
        return MP_OK;
    uint64_t nodes = p->n_nodes;
    for (size_t j = 0; j < f->n; j++)
        if (!fold_mul(p->blocks[j].n_nodes, f->weight[j] - 1, &nodes))
            return MP_OK;
    if (!t->skip_reserved && nodes <= MP_ASIM_MAX_NODES)
        return MP_OK; /* the full model is small enough for the allocator model: replay it */
    struct mp_par_plan pp;
    bool made;
    enum mp_status st = fold_par_plan(f, p, t, &pp, &made, d);
    if (st == MP_OK)
        st = fold_static(f, p, t, made ? &pp : NULL, e, d);
    struct fold_meter m = {.f = f, .levels = mp_fold_levels(f),
                           .per_param_opt = mp_optimizer_tmp(t->optimizer) == MP_OPT_TMP_ALL_GRADS,
                           .pp = made ? &pp : NULL};
    for (int l = 0; l < m.levels && st == MP_OK; l++)
        if (!(m.sig[l] = calloc(f->sched.n ? f->sched.n : 1, sizeof *m.sig[l])))
            st = mp_fail(d, MP_ERR_NOMEM, "out of memory");
    struct counter c = {.p = p, .peak_node = -1, .no_asim = true, .fm = &m};
    if (st == MP_OK)
        st = replay_plan(p, &f->sched, t, m.pp, fold_event, &c, d);
    if (made)
        mp_par_plan_release(&pp);
    if (st == MP_ERR_RANGE && m.overflow)
        st = peak_overflow(p, t, d);
    /* the step on an interval's first interior unit and the one on its second, weighted, unit
     * must have made the same events */
    bool agree = st == MP_OK;
    for (int l = 0; l < m.levels; l++) {
        agree = agree && mp_fold_steps_agree(f, l, m.sig[l]);
        free(m.sig[l]);
    }
    if (st != MP_OK || !agree) {
        mp_estimate_release(e);
        return st;
    }
    e->peak_allocated_bytes = c.peak;
    e->peak_requested_bytes = c.peak_req;
    e->peak_reserved_bytes = c.peak;
    e->activations_bytes = c.act_at_loss;
    if ((st = device_peak(p, context_bytes, e, d)) != MP_OK) {
        mp_estimate_release(e);
        return st;
    }
    e->peak_phase = c.peak_phase;
    if (c.peak_node >= 0 && c.peak_store == MP_ST_COMM) { /* as mp_estimate_run_chain names it */
        const struct mp_node *n = &p->nodes[c.peak_node];
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s %s", mp_phase_str(c.peak_phase),
                 n->block >= 0 ? f->full->blocks[f->full_of[n->block] + m.peak_shift].name : n->name,
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_store == MP_ST_COMM) {
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_node >= 0) {
        /* the node's name with its short block's name replaced by the full block's */
        const struct mp_node *n = &p->nodes[c.peak_node];
        const char *bn = n->block >= 0 ? f->model.blocks[n->block].name : "";
        size_t fb = n->block >= 0 ? f->full_of[n->block] + m.peak_shift : 0, len = strlen(bn);
        if (n->block >= 0 && m.peak_shift && strncmp(n->name, bn, len) == 0)
            snprintf(e->peak_event, sizeof e->peak_event, "%s:%s%s", mp_phase_str(c.peak_phase),
                     f->full->blocks[fb].name, n->name + len);
        else
            snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase), n->name);
    } else {
        snprintf(e->peak_event, sizeof e->peak_event, "%s", mp_phase_str(c.peak_phase));
    }
    /* recompute: forwards the full schedule runs beyond one per block */
    size_t N = f->n_full;
    bool *ran = calloc(N ? N : 1, sizeof *ran), *ckpt = calloc(N ? N : 1, sizeof *ckpt);
    if (!ran || !ckpt) {
        free(ran);
        free(ckpt);
        mp_estimate_release(e);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    }
    for (size_t k = 0; full && k < full->n; k++) {
        const struct mp_sched_op *op = &full->ops[k];
        if (op->kind != MP_SCHED_FN && op->kind != MP_SCHED_FC && op->kind != MP_SCHED_FE)
            continue;
        if (ran[op->index])
            e->recompute_flops += p->blocks[f->short_of[op->index]].fwd_flops;
        else if (op->kind != MP_SCHED_FE)
            ckpt[op->index] = true;
        ran[op->index] = true;
    }
    free(ran);
    if (chain) { /* per block: each full block has its short block's figures */
        e->n_blocks = N;
        e->blocks = calloc(N ? N : 1, sizeof *e->blocks);
        if (!e->blocks) {
            free(ckpt);
            return mp_fail(d, MP_ERR_NOMEM, "out of memory");
        }
        for (size_t j = 0; j < f->n; j++) /* each short block's figures, then copied */
            block_est(p, t, j, 0, &e->blocks[f->full_of[j]]);
        for (size_t i = 0; i < N; i++) {
            e->blocks[i] = e->blocks[f->full_of[f->short_of[i]]];
            e->blocks[i].activation_bytes = chain->xb[i + 1];
            e->blocks[i].checkpointed = ckpt[i];
        }
    }
    free(ckpt);
    *holds = true;
    return MP_OK;
}
