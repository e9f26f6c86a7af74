/* eager.c — eager attention as its chain of torch ops (build.h). */
#include "build.h"

#include <string.h>

/* ---- eager attention, op by op --------------------------------------------------------- */

/* HF's eager attention (eager_attention_forward and the per-family copies: GPT-2, BERT, GPT-J's
 * _attn, Gemma2's soft-capping, Falcon, OPT) is a chain of torch ops, each an autograd node:
 * Q@K^T (matmul: expand, reshape (the contiguous copies), bmm), the scaling (* scaling,
 * / sqrt(d), OPT's * 1.0 included), [soft-capping: / cap, tanh, * cap], the mask add (promotes
 * bf16 scores to the fp32 mask's dtype under amp), the softmax (fp32 under autocast or with
 * dtype=float32: an upcast copy of half scores first), the cast to v's dtype, [dropout], P@V,
 * the transpose-contiguous copy of the heads.  Forward, each op's input transient dies once it
 * has run; backward runs them in reverse, each node freeing its saved operands and its incoming
 * gradient when it ends (torch derivatives.yaml: bmm, _softmax_backward_data, _to_copy, mul/div
 * by a scalar, native_dropout, tanh; the engine casts a gradient to its input's dtype,
 * validate_outputs).  Checked op by op with bench/accuracy/torch_step.py's LiveTracker: the forward peaks
 * at the softmax (its input and the probabilities), the backward at the softmax backward (the
 * probabilities, their gradient and the softmax's input gradient; P@V's operands and dO already
 * freed, q/k gradients not yet made). */

/* A tensor of node n that only its op sequence allocates: a forward transient (ACT store) or a
 * backward gradient buffer (grad: the GRAD store). */
static int op_tensor(struct bld *B, const struct mp_node *n, const char *what, enum mp_dtype dt, uint64_t elems,
                     bool grad)
{
    int t = new_flat(B, "", dt, elems);
    if (t >= 0) {
        B->p->tensors[t].name = store_name(B, n->name, what);
        B->p->tensors[t].needs_grad = grad;
        B->p->tensors[t].block = n->block;
    }
    return t;
}

/* Appends an op to node k's forward (bwd false) or backward sequence. */
static struct mp_subop *sop(struct bld *B, int k, bool bwd, enum mp_subop_kind op, int src, int dst)
{
    struct mp_program *p = B->p;
    struct mp_node *n = &p->nodes[k];
    if (failed(B))
        return NULL;
    if (!grow((void **)&p->subops, &p->cap_subops, p->n_subops + 1, sizeof *p->subops)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return NULL;
    }
    int *first = bwd ? &n->bop0 : &n->fop0, *count = bwd ? &n->n_bops : &n->n_fops;
    if (*count == 0)
        *first = (int)p->n_subops;
    if (*count >= MP_NODE_SUBOP_MAX || *first + *count != (int)p->n_subops)
        MP_BUG("node %s: too many ops", n->name);
    struct mp_subop *st = &p->subops[p->n_subops++];
    (*count)++;
    memset(st, 0, sizeof *st); /* padding too: programs compare byte for byte (test_build) */
    st->op = op;
    st->src = src;
    st->dst = dst;
    st->dst2 = st->grad = st->free_buf = st->release[0] = st->release[1] = -1;
    return st;
}

/* The gradient a matmul makes for input j through its contiguous copy (copy -1: it saved the
 * input itself): the input's own gradient when the copy has the input's dtype and size and no
 * other input shares its storage (the copy's backward passes it on); else a buffer of the copy's
 * size that a GATHER op adds into the input's gradient. */
static bool copy_grad_direct(const struct mp_program *p, const struct mp_node *n, int j, int copy)
{
    if (copy < 0)
        return true;
    const struct mp_tensor *c = &p->tensors[copy], *in = &p->tensors[n->in[j]];
    for (int i = 0; i < 3; i++)
        if (i != j && n->in[i] == n->in[j])
            return false;
    return c->dtype == in->dtype && c->bytes == in->bytes;
}

/* What the scores pass through between Q@K^T and the softmax, in forward order. */
struct score_op {
    enum mp_subop_kind op;
    enum mp_dtype dt;      /* its output's dtype */
    int saved;             /* its output is this saved extra (soft-capping's tanh), else -1 */
    const char *fwd, *bwd; /* its output's name; its input gradient's name */
};

void eager_ops(struct bld *B, int k)
{
    struct mp_program *p = B->p;
    const struct mp_node *n = &p->nodes[k];
    int copy[3], op[3];
    const enum mp_xrole cr[3] = {MP_XR_Q_COPY, MP_XR_K_COPY, MP_XR_V_COPY};
    for (int j = 0; j < 3; j++) {
        copy[j] = mp_node_extra(n, cr[j], 0);
        op[j] = copy[j] >= 0 ? copy[j] : n->in[j]; /* what the matmuls read and save */
    }
    int probs = mp_node_extra(n, MP_XR_PROBS, 0), mask = mp_node_extra(n, MP_XR_ATTN_DROP_MASK, 0);
    int dropped = mp_node_extra(n, MP_XR_PROBS_DROPPED, 0), cast = mp_node_extra(n, MP_XR_PROBS_CAST, 0);
    int tanh_out = mp_node_extra(n, MP_XR_SOFTCAP_TANH, 0);
    int pv = cast >= 0 ? cast : dropped >= 0 ? dropped : probs; /* what P@V reads and saves */
    if (failed(B) || probs < 0)
        return;
    enum mp_dtype scd = p->tensors[op[0]].dtype, sm = p->tensors[probs].dtype, cdt = p->tensors[n->out].dtype;
    uint64_t ass = p->tensors[probs].elems;
    /* the scores' way to the softmax */
    struct score_op chain[8];
    int nc = 0;
    chain[nc++] = (struct score_op){MP_SOP_SCALE, scd, -1, "scores_scaled", "grad_scores"};
    if (tanh_out >= 0) {
        chain[nc++] = (struct score_op){MP_SOP_SOFTCAP_DIV, scd, -1, "softcap_div", "grad_softcap_in"};
        chain[nc++] = (struct score_op){MP_SOP_SOFTCAP_TANH, scd, tanh_out, NULL, "grad_softcap_div"};
        chain[nc++] = (struct score_op){MP_SOP_SOFTCAP_MUL, scd, -1, "softcap_mul", "grad_softcap_tanh"};
    }
    enum mp_dtype dt = scd;
    for (int i = 0; i < 2; i++) /* + the masks / position bias, promoting to their dtype */
        if (n->score_add[i] >= 0) {
            dt = promote(dt, p->tensors[n->score_add[i]].dtype);
            chain[nc++] = (struct score_op){MP_SOP_MASK, dt, -1, i ? "scores_masked2" : "scores_masked",
                                            i ? "grad_scores_masked2" : "grad_scores_masked"};
        }
    if (dt != sm) /* softmax(dtype=float32) / autocast's fp32 softmax: an upcast copy first */
        chain[nc++] = (struct score_op){MP_SOP_CAST, sm, -1, "scores_f32", "grad_scores_f32"};

    /* forward */
    int cur = op_tensor(B, n, "scores", scd, ass, false);
    sop(B, k, false, MP_SOP_QK, -1, cur);
    for (int i = 0; i < nc; i++) {
        int t = chain[i].saved >= 0 ? chain[i].saved : op_tensor(B, n, chain[i].fwd, chain[i].dt, ass, false);
        struct mp_subop *st = sop(B, k, false, chain[i].op, cur, t);
        if (st && (i == 0 || chain[i - 1].saved < 0))
            st->free_buf = cur;
        cur = t;
    }
    struct mp_subop *st = sop(B, k, false, MP_SOP_SOFTMAX, cur, probs);
    if (st && (nc == 0 || chain[nc - 1].saved < 0))
        st->free_buf = cur;
    /* the probabilities' way to P@V: HF decoders cast them to v's dtype, then dropout; T5
     * drops them out in the softmax's dtype and P@V's autocast casts them */
    struct score_op post[2];
    int np = 0;
    bool drop_first = mask >= 0 && cast >= 0;
    if (mask >= 0 && drop_first)
        post[np++] = (struct score_op){MP_SOP_DROPOUT, sm, dropped, NULL, "grad_probs_undropped"};
    if (pv != probs && p->tensors[pv].dtype != sm)
        post[np++] = (struct score_op){MP_SOP_CAST, cdt, cast, "probs_cast", "grad_probs_f32"};
    if (mask >= 0 && !drop_first)
        post[np++] = (struct score_op){MP_SOP_DROPOUT, cdt, dropped, NULL, "grad_probs_undropped"};
    cur = probs;
    for (int i = 0; i < np; i++) {
        int t = post[i].saved >= 0 ? post[i].saved : op_tensor(B, n, post[i].fwd, post[i].dt, ass, false);
        if ((st = sop(B, k, false, post[i].op, cur, t)) == NULL)
            return;
        if (post[i].op == MP_SOP_DROPOUT)
            st->dst2 = mask;
        if (cur != probs && cur != pv) /* a transient, or T5's dropped probabilities (not saved) */
            st->free_buf = cur;
        cur = t;
    }
    uint64_t dv = p->tensors[n->out].elems / (n->rows * n->heads);
    int heads = op_tensor(B, n, "heads", cdt, n->rows * n->heads * dv, false);
    sop(B, k, false, MP_SOP_PV, pv, heads);
    if ((st = sop(B, k, false, MP_SOP_OUT, heads, n->out)) != NULL)
        st->free_buf = heads;
    if (n->no_grad)
        return;

    /* backward */
    bool need[3];
    int buf[3] = {-1, -1, -1};
    const char *gn[3] = {"grad_q", "grad_k", "grad_v"};
    for (int j = 0; j < 3; j++) {
        need[j] = p->tensors[n->in[j]].needs_grad;
        if (need[j] && !copy_grad_direct(p, n, j, copy[j]))
            buf[j] = op_tensor(B, n, gn[j], p->tensors[copy[j]].dtype, p->tensors[copy[j]].elems, true);
    }
    st = NULL;
    if (need[2] && (st = sop(B, k, true, MP_SOP_PV_DV, -1, buf[2])) != NULL) /* P@V: dV, then dP */
        st->grad = 2;
    int g = -1;
    if (need[0] || need[1]) {
        g = op_tensor(B, n, "grad_probs", p->tensors[pv].dtype, ass, true);
        st = sop(B, k, true, MP_SOP_PV_DP, -1, g);
    }
    if (!st)
        return;
    st->release[0] = op[2];
    st->release[1] = pv != probs ? pv : -1;
    st->free_gout = true;
    if (g >= 0) {
        /* dropout, the cast back to fp32, the softmax, the scores' chain in reverse: one buffer
         * each, the one before dies */
        struct score_op rev[12];
        int nr = 0;
        for (int i = np; i-- > 0;) /* each op's input gradient, in its input's dtype */
            rev[nr++] = (struct score_op){post[i].op, i > 0 ? post[i - 1].dt : sm,
                                          post[i].op == MP_SOP_DROPOUT ? mask : -1, NULL, post[i].bwd};
        rev[nr++] = (struct score_op){MP_SOP_SOFTMAX, sm, probs, NULL, "grad_softmax_in"};
        for (int i = nc; i-- > 0;) {
            /* each op's input gradient, in its input's dtype; the scalar ops and the add make one
             * only when they change something (mask add: only the dtype cast) */
            enum mp_dtype in_dt = i > 0 ? chain[i - 1].dt : scd;
            if (chain[i].op == MP_SOP_MASK && in_dt == chain[i].dt)
                continue;
            rev[nr++] = (struct score_op){chain[i].op == MP_SOP_MASK ? MP_SOP_CAST : chain[i].op, in_dt,
                                          chain[i].op == MP_SOP_SOFTCAP_TANH ? tanh_out : -1, NULL, chain[i].bwd};
        }
        for (int i = 0; i < nr; i++) {
            int g2 = op_tensor(B, n, rev[i].bwd, rev[i].dt, ass, true);
            if ((st = sop(B, k, true, rev[i].op, g, g2)) == NULL)
                return;
            st->free_buf = g;
            st->release[0] = rev[i].saved;
            g = g2;
        }
        /* Q@K^T: dQ, then dK; its operands and the scores' gradient die */
        for (int j = 0; j < 2; j++)
            if (need[j] && (st = sop(B, k, true, j ? MP_SOP_QK_DK : MP_SOP_QK_DQ, g, buf[j])) != NULL)
                st->grad = j;
        if (!st)
            return;
        st->free_buf = g;
        st->release[0] = op[0];
        st->release[1] = op[1];
    }
    /* the copies' gradients into the inputs' (the q side's first, then v's, then k's) */
    const int order[3] = {0, 2, 1};
    for (int i = 0; i < 3; i++) {
        int j = order[i];
        if (buf[j] >= 0 && (st = sop(B, k, true, MP_SOP_GATHER, buf[j], -1)) != NULL) {
            st->grad = j;
            st->free_buf = buf[j];
        }
    }
}
