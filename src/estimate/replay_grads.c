/* replay_grads.c — the replay's events, and the storages of activation gradients (replay.h). */
#include "replay.h"

void emit(struct rp *r, enum mp_ev_kind k, enum mp_store s, int id, uint64_t bytes)
{
    if (r->st != MP_OK)
        return;
    struct mp_event ev = {.kind = k, .store = s, .id = id, .node = r->node, .bytes = bytes, .phase = r->phase,
                          .grad_of = r->grad_of};
    r->st = r->fn(r->ctx, &ev);
}

/* a + b, the bytes of one event: an overflow ends the replay (MP_ERR_RANGE) */
uint64_t r_add(struct rp *r, uint64_t a, uint64_t b)
{
    uint64_t s;
    if (mp_add_u64(a, b, &s))
        return s;
    if (r->st == MP_OK)
        r->st = mp_fail(r->d, MP_ERR_RANGE, "%s: memory overflows 64 bits",
                        r->p->model ? r->p->model->path : "model");
    return 0;
}

void emit_fwd(struct rp *r, int node, bool grad, int step)
{
    if (r->st != MP_OK)
        return;
    struct mp_event ev = {.kind = MP_EV_FWD, .store = MP_ST_TMP, .id = node, .node = node, .phase = r->phase,
                          .grad_mode = grad, .step = step, .grad_of = r->grad_of};
    r->st = r->fn(r->ctx, &ev);
}

void t_alloc(struct rp *r, int t)
{
    if (t < 0 || r->live[t])
        return;
    r->live[t] = true;
    emit(r, MP_EV_ALLOC, MP_ST_ACT, t, r->p->tensors[t].bytes);
}

void t_maybe_free(struct rp *r, int t)
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

bool g_wanted(const struct rp *r, int t)
{
    return t >= 0 && r->p->tensors[t].needs_grad && !r->is_input[t];
}

bool g_has(const struct rp *r, int t) { return t >= 0 && r->grad_of[t] >= 0; }

/* A new storage (id t) for t's gradient. */
void g_new(struct rp *r, int t)
{
    if (r->grefs[t] > 0)
        MP_BUG("gradient storage %d (%s) made twice", t, r->p->tensors[t].name);
    r->grad_of[t] = t;
    r->grefs[t] = 1;
    emit(r, MP_EV_ALLOC, MP_ST_GRAD, t, r->p->tensors[t].bytes);
}

void g_unref(struct rp *r, int s)
{
    if (--r->grefs[s] == 0)
        emit(r, MP_EV_FREE, MP_ST_GRAD, s, r->p->tensors[s].bytes);
}

void g_alloc(struct rp *r, int t)
{
    if (g_wanted(r, t) && !g_has(r, t))
        g_new(r, t);
}

/* t's gradient is consumed (its producer's backward ran): its storage loses one holder. */
void g_free(struct rp *r, int t)
{
    if (!g_has(r, t))
        return;
    int s = r->grad_of[t];
    r->grad_of[t] = -1;
    g_unref(r, s);
}

/* Does n's backward hand its output's gradient itself to input j (whose gradient is tensor g)? */
bool g_passes(const struct rp *r, const struct mp_node *n, int g)
{
    const struct mp_tensor *a = &r->p->tensors[g], *y = &r->p->tensors[n->out];
    return n->prim == MP_P_ADD && g_has(r, n->out) && a->dtype == y->dtype && a->elems == y->elems;
}

void tmp(struct rp *r, int node, uint64_t bytes, bool alloc)
{
    if (bytes)
        emit(r, alloc ? MP_EV_ALLOC : MP_EV_FREE, MP_ST_TMP, node, bytes);
}

bool node_makes(const struct mp_node *n, int t)
{
    for (int j = 0; j < n->n_extra; j++)
        if (n->extra[j] == t)
            return true;
    return false;
}

/* Is t made by one of n's forward ops (layers.h mp_subop), allocated when that op runs? */
bool fop_makes(const struct mp_program *p, const struct mp_node *n, int t)
{
    for (int i = 0; i < n->n_fops; i++)
        if (p->subops[n->fop0 + i].dst == t || p->subops[n->fop0 + i].dst2 == t)
            return true;
    return false;
}

/* The forward of node k as several ops: each op's tensors appear before it runs, its input
 * transient dies after it (the node's extras and output stay, as for any node). */
void fwd_ops(struct rp *r, const struct mp_node *n, int k, bool grad)
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

bool node_reads(const struct mp_node *n, int t, int upto)
{
    for (int j = 0; j < upto; j++)
        if (n->in[j] == t)
            return true;
    return false;
}

/* ZeRO-3 / FSDP gather each layer's parameters for its forward: what autocast's cache
 * would keep of those is not modelled (DeepSpeed casts the parameters themselves). */
bool params_sharded(const struct rp *r)
{
    return r->pp && (r->t->par->strategy == MP_PAR_ZERO3 || r->t->par->strategy == MP_PAR_FSDP ||
                     r->t->par->strategy == MP_PAR_FSDP_NO_RESHARD);
}

/* Does autograd save anything (a parameter included) when n runs with grad?  A Linear whose
 * input needs a gradient saves its weight; a quantized one (bitsandbytes MatMul4Bit) keeps the
 * packed weight outside save_for_backward. */
bool node_packs(const struct mp_node *n)
{
    return !n->no_grad && (n->n_saved > 0 || (n->grad_in && n->param[0] >= 0 && !n->quantized));
}

/* The tensors a model hands to many blocks (p->held: T5's encoder output and position biases):
 * held from the forward that makes them until the loss, or, when their release block is a
 * checkpoint (whose inputs keep them), until that block's backward.  release_at: the loss (-1)
 * or block i's backward. */
void hold_made(struct rp *r, const struct mp_node *n)
{
    for (size_t j = 0; j < r->p->n_held; j++) {
        int t = r->p->held[j].t;
        if (r->phase == MP_PH_FORWARD && !r->held_on[j] && (n->out == t || node_makes(n, t))) {
            r->held_on[j] = true;
            r->holds[t]++;
        }
    }
}

void release_held(struct rp *r, int release_at)
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

/* After block i's forward: the held locals of a forward that returned with it (fwd_end), unless
 * their release block is a checkpoint (whose inputs keep them to its backward). */
void release_held_fwd(struct rp *r, size_t i)
{
    for (size_t j = 0; j < r->p->n_held; j++) {
        int rb = r->p->held[j].release, t = r->p->held[j].t;
        if (!r->held_on[j] || r->p->held[j].fwd_end != (int)i || (rb >= 0 && r->ckpt[rb]))
            continue;
        r->held_on[j] = false;
        r->holds[t]--;
        t_maybe_free(r, t);
    }
}

/* A held leaf keeps its gradient (.grad) past its producer's backward. */
bool held_leaf(const struct rp *r, int t)
{
    for (size_t j = 0; j < r->p->n_held; j++)
        if (r->p->held[j].t == t && r->p->held[j].leaf)
            return true;
    return false;
}
