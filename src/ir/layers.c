/* layers.c — lowers a model into the tensor program (layers.h), block by block, making a repeated block by
 * copying (build.h). */
#include "build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the program ------------------------------------------------------------------ */

/* Every extra has a role, and the parts of each transient add up to it: a transient set
 * without parts (a plain fwd_tmp_bytes/bwd_tmp_bytes assignment) gets one MP_TR_OTHER part
 * for what its parts do not cover, so executors never read it. */
static enum mp_status fill_tmp_other(struct mp_node *n, bool bwd, struct mp_diag *d)
{
    struct mp_tmp_part *pt = bwd ? n->bwd_tmp : n->fwd_tmp;
    int *cnt = bwd ? &n->n_bwd_tmp : &n->n_fwd_tmp;
    uint64_t total = bwd ? n->bwd_tmp_bytes : n->fwd_tmp_bytes, covered = 0;
    for (int i = 0; i < *cnt; i++)
        covered = mp_max_u64(covered, pt[i].offset + pt[i].bytes);
    if (covered > total)
        return mp_fail(d, MP_ERR_INTERNAL, "%s: its %s temporaries (%llu bytes) exceed the transient (%llu)",
                       n->name, bwd ? "backward" : "forward", (unsigned long long)covered,
                       (unsigned long long)total);
    if (covered < total) {
        if (*cnt >= MP_NODE_TMP_MAX)
            return mp_fail(d, MP_ERR_INTERNAL, "%s: too many temporaries", n->name);
        pt[(*cnt)++] = (struct mp_tmp_part){MP_TR_OTHER, covered, total - covered};
    }
    return MP_OK;
}

static enum mp_status check_roles(struct mp_program *p, struct mp_diag *d)
{
    for (size_t k = 0; k < p->n_nodes; k++) {
        struct mp_node *n = &p->nodes[k];
        for (int j = 0; j < n->n_extra; j++)
            if (n->extra_role[j] == MP_XR_NONE || n->extra_role[j] >= MP_XR_COUNT)
                return mp_fail(d, MP_ERR_INTERNAL, "%s: extra %s has no role (layers.c: extra_as)", n->name,
                               p->tensors[n->extra[j]].name);
        enum mp_status st = fill_tmp_other(n, false, d);
        if (st == MP_OK)
            st = fill_tmp_other(n, true, d);
        if (st != MP_OK)
            return st;
    }
    return MP_OK;
}

bool mp_program_resident(const struct mp_program *p, int t)
{
    if (t < 0)
        return false;
    if (t == p->input || t == p->labels || t == p->ids || t == p->type_ids)
        return true;
    for (size_t b = 0; b < p->n_buffers; b++)
        if (p->buffers[b] == t)
            return true;
    return false;
}

void mp_program_release(struct mp_program *p)
{
    if (!p)
        return;
    free(p->tensors);
    free(p->nodes);
    free(p->params);
    free(p->subops);
    free(p->blocks);
    free(p->copied);
    while (p->names) {
        struct mp_name_chunk *next = p->names->next;
        free(p->names);
        p->names = next;
    }
    memset(p, 0, sizeof *p);
}

static enum mp_status lower_program(const struct mp_model *m, const struct mp_build_opts *o, bool check_only,
                                    struct mp_program *p, struct mp_diag *d);

enum mp_status mp_program_build(const struct mp_model *m, const struct mp_build_opts *o, struct mp_program *p,
                                struct mp_diag *d)
{
    memset(p, 0, sizeof *p);
    return lower_program(m, o, false, p, d);
}

enum mp_status mp_program_rebuild(const struct mp_model *m, const struct mp_build_opts *o, struct mp_program *p,
                                  struct mp_diag *d)
{
    struct mp_tensor *t = p->tensors;
    struct mp_node *n = p->nodes;
    struct mp_param *q = p->params;
    struct mp_subop *so = p->subops;
    size_t ct = p->cap_tensors, cn = p->cap_nodes, cq = p->cap_params, cs = p->cap_subops;
    p->tensors = NULL, p->nodes = NULL, p->params = NULL, p->subops = NULL;
    mp_program_release(p); /* names and blocks; p is zeroed */
    p->tensors = t, p->nodes = n, p->params = q, p->subops = so;
    p->cap_tensors = ct, p->cap_nodes = cn, p->cap_params = cq, p->cap_subops = cs;
    enum mp_status st = lower_program(m, o, false, p, d);
    if (st != MP_OK)
        mp_program_release(p);
    return st;
}

/* ---- copies of a repeated block ---------------------------------------------------------------
 *
 * A run of identical blocks (a "repeat") lowers to the same tensors, nodes and parameters each
 * time, shifted: ids by the block's counts, names by the block's name.  So does a run of
 * blocks that repeat with a period p (mp_block.period: layers that alternate, sliding and
 * global attention), each block the shift of the block p before it, ids by the counts of the p
 * blocks from that one.  After a block has been lowered and found to be exactly the shift of
 * the block it repeats, from the same builder state and leaving that state as it was, the block
 * p after it is made by shifting instead of lowering (a 100,000-block model builds in the time
 * it takes to copy its arrays).  Anything else (a first copy, frozen and trained copies, a name
 * that would be cut, state a layer keeps per block) is lowered as usual. */

/* What block i made: its ranges in the program's arrays and the totals it added. */
struct span {
    size_t i, t0, t1, n0, n1, q0, q1;
    struct val in, out;         /* what it was lowered from and to */
    uint64_t total, adapter;    /* p->total_params, p->adapter_params it added */
    uint64_t ep_other;          /* p->ep_other_params it added */
    bool ok;                    /* lowered (or copied) without failure */
};

/* The builder and program state a block's lowering reads, without its counters, arrays,
 * current block and name prefix: copies are made only while it stays the same. */
struct state {
    struct bld b;
    struct mp_program p;
};

static void take_state(const struct bld *B, struct state *s)
{
    memset(s, 0, sizeof *s);
    s->b = *B;
    s->p = *B->p;
    s->b.block = 0;
    s->b.layer = NULL;
    memset(s->b.prefix, 0, sizeof s->b.prefix);
    s->p.n_tensors = s->p.n_nodes = s->p.n_params = 0;
    s->p.tensors = NULL, s->p.nodes = NULL, s->p.params = NULL, s->p.names = NULL;
    s->p.cap_tensors = s->p.cap_nodes = s->p.cap_params = 0;
    s->p.total_params = s->p.adapter_params = s->p.ep_other_params = 0;
    s->p.copied_blocks = 0;
    /* the first SDPA layer's kernel, for the report: written once, by the first block that has
     * one; a copy of a later block leaves it as it is */
    s->p.sdpa_backend = 0;
    s->p.sdpa_head_dim = 0;
    s->p.sdpa_dtype = 0;
}

static bool same_state(const struct state *a, const struct state *b) { return memcmp(a, b, sizeof *a) == 0; }

/* What a block made and the state before it, kept for a block that repeats it. */
struct past {
    struct span sp;  /* sp.ok: made without failure */
    struct state st; /* the state before it */
    unsigned per;    /* it is the exact shift of the block per before it (lowered and verified, or
                        copied); 0: not */
};

/* The shift from span s (block s->i) to block i, whose input is tensor in_to and whose first
 * tensor and parameter are dt and dq past s's (the sizes of the blocks s->i to i - 1). */
struct shift {
    const struct span *s;
    const struct mp_model *m;
    size_t to;
    int in_to;
    size_t dt, dq;
};

static int sh_t(const struct shift *h, int id)
{
    if (id < 0)
        return id;
    if (id == h->s->in.t)
        return h->in_to;
    if ((size_t)id >= h->s->t0 && (size_t)id < h->s->t1)
        return id + (int)h->dt;
    return id;
}

static int sh_q(const struct shift *h, int id)
{
    return id >= 0 && (size_t)id >= h->s->q0 && (size_t)id < h->s->q1 ? id + (int)h->dq : id;
}

/* name with the block name of s replaced by block to's: *rest is what follows the block's name
 * and its dot (NULL: the name does not start with it and stays as it is).  False when the new
 * name could be cut (MP_NAME_MAX): the copy is then lowered instead. */
static bool sh_name(const struct shift *h, const char *name, const char **rest)
{
    const char *from = h->m->blocks[h->s->i].name, *to = h->m->blocks[h->to].name;
    size_t lf = strlen(from), ln = strlen(name);
    *rest = NULL;
    if (ln >= MP_NAME_MAX - 1)
        return false;
    if (strncmp(name, from, lf) != 0 || (name[lf] != '.' && name[lf] != '\0'))
        return true;
    *rest = name[lf] ? name + lf + 1 : "";
    return strlen(to) + 1 + strlen(*rest) < MP_NAME_MAX - 1;
}

static bool same_name(const struct shift *h, const char *from_name, const char *name)
{
    const char *rest;
    if (!sh_name(h, from_name, &rest))
        return false;
    if (!rest)
        return strcmp(from_name, name) == 0;
    const char *to = h->m->blocks[h->to].name;
    size_t lt = strlen(to);
    return strncmp(name, to, lt) == 0 &&
           (*rest ? name[lt] == '.' && strcmp(name + lt + 1, rest) == 0 : name[lt] == '\0');
}

static void sh_tensor(const struct shift *h, struct mp_tensor *t)
{
    if (t->block == (int)h->s->i)
        t->block = (int)h->to;
}

static void sh_node(const struct shift *h, struct mp_node *n)
{
    for (int j = 0; j < 3; j++) {
        n->in[j] = sh_t(h, n->in[j]);
        n->in_grad_part[j] = sh_t(h, n->in_grad_part[j]);
    }
    n->out = sh_t(h, n->out);
    n->wcopy = sh_t(h, n->wcopy);
    n->keep = sh_t(h, n->keep);
    for (int j = 0; j < MP_NODE_LOCALS_MAX; j++)
        n->locals[j] = sh_t(h, n->locals[j]);
    for (int j = 0; j < 2; j++)
        n->score_add[j] = sh_t(h, n->score_add[j]);
    for (int j = 0; j < n->n_extra; j++)
        n->extra[j] = sh_t(h, n->extra[j]);
    for (int j = 0; j < n->n_saved; j++)
        n->saved[j] = sh_t(h, n->saved[j]);
    for (int j = 0; j < 2; j++) {
        n->out_parts[j] = sh_t(h, n->out_parts[j]);
        n->param[j] = sh_q(h, n->param[j]);
    }
    const struct mp_block *bf = &h->m->blocks[h->s->i];
    if (n->layer >= bf->layers && n->layer < bf->layers + bf->n_layers)
        n->layer = h->m->blocks[h->to].layers + (n->layer - bf->layers);
    if (n->block == (int)h->s->i)
        n->block = (int)h->to;
}

static void sh_param(const struct shift *h, struct mp_param *q)
{
    if (q->block == (int)h->s->i)
        q->block = (int)h->to;
}

/* Is block b (span b) exactly span a shifted to it? */
static bool is_shift(const struct mp_program *p, const struct mp_model *m, const struct span *a, const struct span *b)
{
    if (b->t1 - b->t0 != a->t1 - a->t0 || b->n1 - b->n0 != a->n1 - a->n0 || b->q1 - b->q0 != a->q1 - a->q0 ||
        b->t0 < a->t1 || b->n0 < a->n1 || b->q0 < a->q1 || b->total != a->total || b->adapter != a->adapter)
        return false;
    struct shift h = {.s = a, .m = m, .to = b->i, .in_to = b->in.t, .dt = b->t0 - a->t0, .dq = b->q0 - a->q0};
    if (p->blocks[b->i].output != sh_t(&h, p->blocks[a->i].output))
        return false;
    for (size_t k = 0; k < a->t1 - a->t0; k++) {
        struct mp_tensor x = p->tensors[a->t0 + k];
        const struct mp_tensor *y = &p->tensors[b->t0 + k];
        sh_tensor(&h, &x);
        if (!same_name(&h, x.name, y->name))
            return false;
        x.name = y->name;
        if (memcmp(&x, y, sizeof x) != 0)
            return false;
    }
    for (size_t k = 0; k < a->n1 - a->n0; k++) {
        struct mp_node x = p->nodes[a->n0 + k];
        const struct mp_node *y = &p->nodes[b->n0 + k];
        sh_node(&h, &x);
        if (!same_name(&h, x.name, y->name))
            return false;
        x.name = y->name;
        if (memcmp(&x, y, sizeof x) != 0)
            return false;
    }
    for (size_t k = 0; k < a->q1 - a->q0; k++) {
        struct mp_param x = p->params[a->q0 + k];
        const struct mp_param *y = &p->params[b->q0 + k];
        sh_param(&h, &x);
        if (!same_name(&h, x.name, y->name))
            return false;
        x.name = y->name;
        if (memcmp(&x, y, sizeof x) != 0)
            return false;
    }
    return true;
}

/* The program as it is before a block is lowered (tensors, nodes, parameters and blocks
 * already made): lowering a copy must leave them as they are (GPT-J's one sinusoid buffer for
 * all layers grows with each layer, so its layers are not copied). */
struct before {
    struct mp_tensor *t;
    struct mp_node *n;
    struct mp_param *q;
    struct mp_block_prog *b;
    size_t nt, nn, nq, nb;
    bool ok;
};

static void take_before(const struct mp_program *p, size_t nb, struct before *s)
{
    memset(s, 0, sizeof *s);
    s->nt = p->n_tensors, s->nn = p->n_nodes, s->nq = p->n_params, s->nb = nb;
    s->t = malloc(s->nt ? s->nt * sizeof *s->t : 1);
    s->n = malloc(s->nn ? s->nn * sizeof *s->n : 1);
    s->q = malloc(s->nq ? s->nq * sizeof *s->q : 1);
    s->b = malloc(s->nb ? s->nb * sizeof *s->b : 1);
    s->ok = s->t && s->n && s->q && s->b;
    if (s->ok) { /* (an empty array may be NULL: no memcpy from it) */
        if (s->nt)
            memcpy(s->t, p->tensors, s->nt * sizeof *s->t);
        if (s->nn)
            memcpy(s->n, p->nodes, s->nn * sizeof *s->n);
        if (s->nq)
            memcpy(s->q, p->params, s->nq * sizeof *s->q);
        if (s->nb)
            memcpy(s->b, p->blocks, s->nb * sizeof *s->b);
    }
}

/* Frees s; true when p still begins with what s holds. */
static bool unchanged_before(const struct mp_program *p, struct before *s)
{
    bool same = s->ok && (!s->nt || memcmp(s->t, p->tensors, s->nt * sizeof *s->t) == 0) &&
                (!s->nn || memcmp(s->n, p->nodes, s->nn * sizeof *s->n) == 0) &&
                (!s->nq || memcmp(s->q, p->params, s->nq * sizeof *s->q) == 0) &&
                (!s->nb || memcmp(s->b, p->blocks, s->nb * sizeof *s->b) == 0);
    free(s->t);
    free(s->n);
    free(s->q);
    free(s->b);
    memset(s, 0, sizeof *s);
    return same;
}

static const char *copy_name(struct bld *B, const struct shift *h, const char *name)
{
    const char *rest;
    sh_name(h, name, &rest);
    return rest ? store_name(B, h->m->blocks[h->to].name, rest) : store_name(B, "", name);
}

/* Appends span a shifted to block i (input x); false (nothing appended) when a name of the copy
 * could be cut. */
static bool copy_block(struct bld *B, const struct span *a, size_t i, struct val x)
{
    struct mp_program *p = B->p;
    struct shift h = {.s = a, .m = B->m, .to = i, .in_to = x.t, .dt = p->n_tensors - a->t0, .dq = p->n_params - a->q0};
    size_t nt = a->t1 - a->t0, nn = a->n1 - a->n0, nq = a->q1 - a->q0;
    const char *rest;
    /* a's names fit with a's block name (they were checked when a was found to be a shift, or
     * made as a copy): only a longer block name (h.99 to h.100) can make one too long */
    bool longer = strlen(B->m->blocks[i].name) > strlen(B->m->blocks[a->i].name);
    for (size_t k = 0; longer && k < nt; k++)
        if (!sh_name(&h, p->tensors[a->t0 + k].name, &rest))
            return false;
    for (size_t k = 0; longer && k < nn; k++)
        if (!sh_name(&h, p->nodes[a->n0 + k].name, &rest))
            return false;
    for (size_t k = 0; longer && k < nq; k++)
        if (!sh_name(&h, p->params[a->q0 + k].name, &rest))
            return false;
    if (!grow((void **)&p->tensors, &p->cap_tensors, p->n_tensors + nt, sizeof *p->tensors) ||
        !grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + nn, sizeof *p->nodes) ||
        !grow((void **)&p->params, &p->cap_params, p->n_params + nq, sizeof *p->params)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return true;
    }
    for (size_t k = 0; k < nt; k++) {
        struct mp_tensor *t = &p->tensors[p->n_tensors++];
        *t = p->tensors[a->t0 + k];
        sh_tensor(&h, t);
        t->name = copy_name(B, &h, t->name);
    }
    for (size_t k = 0; k < nn; k++) {
        struct mp_node *n = &p->nodes[p->n_nodes++];
        *n = p->nodes[a->n0 + k];
        sh_node(&h, n);
        n->name = copy_name(B, &h, n->name);
    }
    for (size_t k = 0; k < nq; k++) {
        struct mp_param *q = &p->params[p->n_params++];
        *q = p->params[a->q0 + k];
        sh_param(&h, q);
        q->name = copy_name(B, &h, q->name);
    }
    p->total_params = add(B, p->total_params, a->total);
    p->adapter_params = add(B, p->adapter_params, a->adapter);
    p->ep_other_params = add(B, p->ep_other_params, a->ep_other);
    return true;
}

/* The same layers (a copy made by "repeat"). */
static bool same_block(const struct mp_block *a, const struct mp_block *b)
{
    return a->n_layers == b->n_layers &&
           (!a->n_layers || memcmp(a->layers, b->layers, a->n_layers * sizeof *a->layers) == 0);
}

/* The input or output of a block as the next block sees it: shape, dtype, needs a gradient. */
static bool same_val(const struct mp_program *p, struct val a, struct val b)
{
    const struct mp_tensor *x = &p->tensors[a.t], *y = &p->tensors[b.t];
    return a.rank == b.rank && memcmp(a.shape, b.shape, sizeof a.shape) == 0 && x->dtype == y->dtype &&
           x->needs_grad == y->needs_grad;
}

/* Lowers m into p, whose arrays may hold memory from an earlier program (their slots are
 * written afresh: new_val, new_node and new_param clear each one).  check_only: only whether
 * the layers chain (mp_program_check); a block that repeats the block its period before it (or
 * the block before), where the run's last two periods of blocks were lowered each from and to
 * this same input, lowers the same way again and is skipped (its slot in p->blocks stays
 * empty).  Otherwise a block may be a copy of the block it repeats (see "copies of a repeated
 * block" above; not with o->no_copies). */
/* The batch: token ids and labels, images and labels, or raw bytes; returns the input. */
static struct val program_input(struct bld *B)
{
    struct mp_program *p = B->p;
    const struct mp_model *m = B->m;
    struct val x;
    if (m->input == MP_INPUT_TOKENS && m->images) {
        /* Gemma3Processor's batch: pixel_values (batch x images, C, H, W) in the model's dtype, the
         * ids with their image tokens, token_type_ids (1 on them), labels; the vision tower runs
         * first on the images (b and s are its own until the text embedding) */
        uint64_t shape[2] = {B->b, B->s}, px[4] = {mul(B, B->b, m->images), m->channels, m->height, m->width};
        B->text_b = B->b;
        B->text_s = B->s;
        if (MP_VIS_IS_QWEN(m->vision.kind)) {
            /* Qwen2VLProcessor's: pixel_values flattened, (every image's patches, C x t x p x p);
             * the (3, b, s) int64 M-RoPE position_ids in type_ids' place (get_rope_index's, which
             * a collator passes); image_grid_thw's (images, 3) int64 rows are not counted */
            const struct mp_vision *v = &m->vision;
            uint64_t pt = mul(B, v->height / v->patch, v->width / v->patch);
            uint64_t fl[2] = {mul(B, px[0], pt), mul(B, mul(B, v->channels, v->temporal), mul(B, v->patch, v->patch))},
                     ps[3] = {3, B->b, B->s};
            x = new_val(B, "pixel_values", p->param_dtype, 2, fl, false);
            B->ids = new_val(B, "input_ids", MP_DT_I64, 2, shape, false).t;
            B->type_ids = new_val(B, "position_ids", MP_DT_I64, 3, ps, false).t;
        } else if (m->vision.kind == MP_VIS_MLLAMA) {
            /* MllamaProcessor's: pixel_values (batch x images x max_num_tiles, C, image_size,
             * image_size), planned in the model's dtype as for the other families (the processor
             * makes fp32, image_processing_mllama.py pad_batches_and_tiles), the ids, the
             * int64 cross_attention_mask (batch, seq, images, tiles) in type_ids' place,
             * aspect_ratio_ids (batch, images) and aspect_ratio_mask (batch, images, tiles) */
            px[0] = mul(B, px[0], m->vision.tiles);
            px[2] = px[3] = m->vision.image;
            uint64_t cm[4] = {B->b, B->s, m->images, m->vision.tiles};
            x = new_val(B, "pixel_values", p->param_dtype, 4, px, false);
            B->ids = new_val(B, "input_ids", MP_DT_I64, 2, shape, false).t;
            B->type_ids = new_val(B, "cross_attention_mask", MP_DT_I64, 4, cm, false).t;
            B->ar_ids = id_buffer(B, "aspect_ratio_ids", mul(B, B->b, m->images));
            id_buffer(B, "aspect_ratio_mask", mul(B, mul(B, B->b, m->images), m->vision.tiles));
        } else if (m->vision.kind == MP_VIS_LLAMA4) {
            /* Llama4Processor's: every image's tiles, (batch x images x tiles, C, image_size,
             * image_size); aspect_ratios is not a model input */
            px[0] = mul(B, px[0], m->vision.tiles);
            px[2] = px[3] = m->vision.image;
            x = new_val(B, "pixel_values", p->param_dtype, 4, px, false);
            B->ids = new_val(B, "input_ids", MP_DT_I64, 2, shape, false).t;
            B->type_ids = -1;
        } else {
            x = new_val(B, "pixel_values", p->param_dtype, 4, px, false);
            B->ids = new_val(B, "input_ids", MP_DT_I64, 2, shape, false).t;
            if (m->vision.kind == MP_VIS_PIXTRAL) { /* PixtralProcessor's image_sizes (batch x images, 2) */
                uint64_t is[2] = {px[0], 2};
                B->type_ids = new_val(B, "image_sizes", MP_DT_I64, 2, is, false).t;
            } else
                B->type_ids = new_val(B, "token_type_ids", MP_DT_I64, 2, shape, false).t;
        }
        p->labels = new_val(B, "labels", MP_DT_I64, 2, shape, false).t;
        p->ids = B->ids; /* resident like the batch (mp_program_resident) */
        p->type_ids = B->type_ids;
        B->b = px[0];
        B->p->probe_unsupported = "steps with images (--images: the vision tower and masked_scatter)";
    } else if (m->input == MP_INPUT_TOKENS) {
        uint64_t shape[2] = {B->b, B->s};
        x = new_val(B, "input_ids", MP_DT_I64, 2, shape, false);
        p->labels = new_val(B, "labels", MP_DT_I64, 2, shape, false).t;
    } else if (m->input == MP_INPUT_IMAGE) {
        uint64_t shape[4] = {B->b, m->channels, m->height, m->width};
        x = new_val(B, "images", p->param_dtype, 4, shape, false);
        uint64_t ls[1] = {B->b};
        p->labels = new_val(B, "labels", MP_DT_I64, 1, ls, false).t;
    } else {
        uint64_t shape[2] = {B->b, m->bytes_per_sample};
        x = new_val(B, "input", MP_DT_U8, 2, shape, false);
    }
    return x;
}

/* After the blocks: what autograd records with frozen parameters, eager attention's ops, the
 * roles' check, the FLOPs and the trainable count.  On failure the program is released. */
static enum mp_status finish_program(struct bld *B, const struct mp_build_opts *o)
{
    struct mp_program *p = B->p;
    const struct mp_model *m = B->m;
    struct mp_diag *d = B->d;
    if (o->ft.mode != MP_FT_FULL) {
        apply_requires_grad(p);
        parts_need_grad(p);
    }
    for (size_t k = 0; k < p->n_nodes && !failed(B); k++)
        if (p->nodes[k].prim == MP_P_ATTN && p->nodes[k].eager)
            eager_ops(B, (int)k);
    col_sum_staging(B);
    if (failed(B)) {
        enum mp_status st = B->st;
        mp_program_release(p);
        return st;
    }
    enum mp_status rst = check_roles(p, d);
    if (rst != MP_OK) {
        mp_program_release(p);
        return rst;
    }
    for (size_t i = 0; i < p->n_blocks; i++) {
        struct mp_block_prog *bp = &p->blocks[i];
        for (size_t k = bp->node0; k < bp->node0 + bp->n_nodes; k++) {
            const struct mp_node *n = &p->nodes[k];
            bp->fwd_flops += n->fwd_flops;
            bp->bwd_flops += n->bwd_flops;
            const struct mp_tmp_part *dq = n->quantized ? mp_node_tmp(n, false, MP_TR_DEQUANT) : NULL;
            if (dq && n->param[0] >= 0)
                bp->dequant_bytes += (double)p->params[n->param[0]].bytes + (double)dq->bytes;
        }
        p->fwd_flops += bp->fwd_flops;
        p->bwd_flops += bp->bwd_flops;
    }
    for (size_t q = 0; q < p->n_params; q++)
        if (p->params[q].trainable || p->params[q].idle)
            p->trainable_params += p->params[q].elems;
    p->trainable_params += p->ep_other_params; /* (--ep trains every expert: a full fine-tune) */
    if (p->trainable_params == 0 && o->ft.mode != MP_FT_FULL && !o->adapter_off) {
        enum mp_status st = mp_fail(d, MP_ERR_USAGE, "%s: --finetune %s trains no parameter%s", m->path,
                                    mp_ft_mode_str(o->ft.mode),
                                    o->ft.mode == MP_FT_FREEZE ? " (--train-blocks selects none)" : "");
        mp_program_release(p);
        return st;
    }
    return MP_OK;
}

/* Why the rows cannot hold packed documents as memplan plans them, or NULL: packing needs token
 * inputs, no encoder-decoder, every attention layer causal self-attention (what transformers'
 * create_causal_mask packs from position ids); learned positions (GPT-2, OPT) would look up a
 * (b, s, h) table for the collator's position ids and cap each document, not the row: not
 * modelled yet. */
static const char *unpackable(const struct mp_model *m)
{
    const char *causal = "packing is planned for causal language models (token inputs, causal self-attention, "
                         "no encoder-decoder)";
    if (m->input != MP_INPUT_TOKENS || m->enc_dec || !mp_model_has_attention(m))
        return causal;
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++) {
            const struct mp_layer *l = &m->blocks[i].layers[j];
            if ((l->type == MP_LT_ATTENTION || l->type == MP_LT_TRANSFORMER_BLOCK) && !l->attn.causal)
                return causal;
            if (l->type == MP_LT_POS_EMBEDDING)
                return "packed rows with learned position embeddings: not modelled yet";
        }
    return NULL;
}

/* DeepSeek's router runs F.linear on fp32 copies of x and W (hidden.type(fp32), weight.type(fp32),
 * transformers 5.24 modeling_deepseek_v3.py:135); under bf16-amp autocast would cast them back to
 * bf16 for the matmul: copies on copies that the lowering (lower_mlp.c's lower_router) does not make. */
const char *mp_bf16_amp_unmodelled(const struct mp_model *m)
{
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++) {
            const struct mp_layer *l = &m->blocks[i].layers[j];
            if (l->moe.experts && (l->moe.router == MP_ROUTER_FP32_SOFTMAX || l->moe.router == MP_ROUTER_FP32_SIGMOID))
                return "the fp32 router of this family (DeepSeek) under bf16 autocast is not modelled; "
                       "use bf16 or amp-bf16";
        }
    return NULL;
}

static enum mp_status lower_program(const struct mp_model *m, const struct mp_build_opts *o, bool check_only,
                                    struct mp_program *p, struct mp_diag *d)
{
    p->opts = *o;
    p->model = m;
    p->labels = -1;
    p->ids = p->type_ids = -1;
    p->rope_tables = -1;
    p->attn_mask = -1;
    if (p->opts.seq == 0)
        p->opts.seq = m->seq_len ? m->seq_len : 1;
    if (!m->enc_dec)
        p->opts.target_seq = 0;
    else if (p->opts.target_seq == 0 || m->dec_from_input)
        p->opts.target_seq = p->opts.seq;
    if (p->opts.batch == 0)
        return mp_fail(d, MP_ERR_USAGE, "batch must be positive");
    uint64_t seqs; /* the sequences the model runs: DPO's pairs are two each */
    if (!mp_mul_u64(p->opts.batch, mp_trainer_seqs(o->trainer), &seqs))
        return mp_fail(d, MP_ERR_RANGE, "%s: batch %llu overflows 64 bits as %s pairs", m->path,
                       (unsigned long long)p->opts.batch, mp_trainer_str(o->trainer));
    if (mp_finetune_all_linear_unmodelled(&o->ft, m->hf_type))
        return mp_fail(d, MP_ERR_USAGE, "%s: --lora-targets all-linear on %s: peft 0.21 also adapts the MoE routers "
                       "and fused experts, which memplan does not model; name the targets (e.g. q_proj,v_proj)",
                       m->path, m->hf_type);
    /* Llama 4 on a quantized base: transformers' quantizer swaps Llama4TextExperts for
     * SequentialLlama4TextExperts (per-expert Llama4TextMLPs run in a loop into a zeros_like buffer:
     * 5.24 quantizers/base.py:383-415, bitsandbytes and compressed-tensors), not modelled */
    bool llama4 = !strcmp(m->hf_type, "llama4_text") || !strcmp(m->hf_type, "llama4");
    if (llama4 && (o->ft.mode == MP_FT_QLORA || m->quant.kind != MP_Q_NONE))
        return mp_fail(d, o->ft.mode == MP_FT_QLORA ? MP_ERR_USAGE : MP_ERR_MODEL,
                       "%s: %s on Llama 4: transformers' quantizer replaces its experts with "
                       "SequentialLlama4TextExperts (a loop over per-expert Linears), which memplan does not model",
                       m->path, o->ft.mode == MP_FT_QLORA ? "--finetune qlora" : "quantization_config");
    /* memplan JSON, and PhiMoE's and Llama 4's routers (other HF configs: refused above and by the
     * command's setup) */
    const char *moe_why = (!m->hf_type[0] || !strcmp(m->hf_type, "phimoe") || !strcmp(m->hf_type, "llama4_text") ||
                           !strcmp(m->hf_type, "llama4")) &&
                                  (o->ft.mode == MP_FT_LORA || o->ft.mode == MP_FT_QLORA)
                              ? mp_moe_lora_unmodelled(m, &o->ft)
                              : NULL;
    if (moe_why)
        return mp_fail(d, MP_ERR_USAGE, "%s: --finetune %s on a mixture-of-experts model: %s, which memplan does not "
                       "model; name attention modules with --lora-targets (e.g. q_proj,v_proj)", m->path,
                       mp_ft_mode_str(o->ft.mode), moe_why);
    const char *unpacked = o->packing || o->padding_free ? unpackable(m) : NULL;
    if (unpacked)
        return mp_fail(d, MP_ERR_USAGE, "%s: %s: %s", m->path, o->padding_free ? "--padding-free" : "--packing",
                       unpacked);
    /* padding-free: the micro-batch's rows concatenated into one (TRL's DataCollatorForLanguageModeling
     * with padding_free, trl 1.16.0 trainer/sft_trainer.py:186-191): tokens b x s in a row of b x s */
    uint64_t rows = seqs, row_len = m->input == MP_INPUT_TOKENS ? p->opts.seq : 1;
    if (o->padding_free && !mp_mul_u64(seqs, p->opts.seq, &row_len))
        return mp_fail(d, MP_ERR_USAGE, "%s: batch %llu x seq %llu tokens overflow", m->path,
                       (unsigned long long)seqs, (unsigned long long)p->opts.seq);
    if (o->padding_free)
        rows = 1;
    if (m->images) { /* the image tokens are part of the sequence (Gemma3Processor expands each image) */
        uint64_t it;
        if (!mp_mul_u64(m->images, m->vision.tokens, &it) || it > p->opts.seq)
            return mp_fail(d, MP_ERR_USAGE, "%s: --images %llu: %llu image tokens each (%s) exceed --seq %llu, "
                           "which includes them", m->path, (unsigned long long)m->images,
                           (unsigned long long)m->vision.tokens,
                           m->vision.kind == MP_VIS_PIXTRAL ? "--image-size's rows x (columns + 1)"
                           : m->vision.kind == MP_VIS_LLAMA4 ? "its tiles' patch tokens and separators"
                           : MP_VIS_IS_QWEN(m->vision.kind) ? "its patches / spatial_merge_size^2"
                           : m->vision.kind == MP_VIS_MLLAMA ? "its <|image|> token"
                                                            : "mm_tokens_per_image",
                           (unsigned long long)p->opts.seq);
        if (o->packing || o->padding_free || o->trainer != MP_TRAINER_SFT)
            return mp_fail(d, MP_ERR_USAGE, "%s: --images with %s is not modelled yet", m->path,
                           o->trainer != MP_TRAINER_SFT ? "a --trainer other than sft" : "packed rows");
    }
    for (size_t i = 0; i < m->n_blocks && m->no_flash; i++) /* (model.h mp_model.no_flash) */
        for (size_t j = 0; j < m->blocks[i].n_layers; j++) {
            const struct mp_layer *l = &m->blocks[i].layers[j];
            if (l->attn.heads && (o->attention_forced || !l->attn.impl_set ? o->attention : l->attn.impl) == MP_ATTN_FLASH)
                return mp_fail(d, MP_ERR_MODEL, "%s: --attention flash: %s; use sdpa or eager", m->path, m->no_flash);
        }
    const char *no_amp = o->precision == MP_PREC_BF16_AMP ? mp_bf16_amp_unmodelled(m) : NULL;
    if (no_amp)
        return mp_fail(d, MP_ERR_USAGE, "%s: --precision bf16-amp: %s", m->path, no_amp);
    bool half_params = o->precision == MP_PREC_BF16 || o->precision == MP_PREC_BF16_AMP;
    p->param_dtype = half_params ? MP_DT_BF16 : MP_DT_F32;
    p->compute_dtype = o->precision == MP_PREC_FP32 ? MP_DT_F32
                       : o->precision == MP_PREC_AMP_FP16 ? MP_DT_F16
                                                          : MP_DT_BF16;
    struct bld B = {.p = p,
                    .m = m,
                    .d = d,
                    .st = MP_OK,
                    .block = -1,
                    .embed_param = -1,
                    .rope_cos_sin = -1,
                    .rope_pair = -1,
                    .attn_mask = -1,
                    .pos_tables = -1,
                    .enc_out = -1,
                    .pos_bias = -1,
                    .cross_bias = -1,
                    .dec_mask = -1,
                    .ids = -1,
                    .type_ids = -1,
                    .ar_ids = -1,
                    .cross_states = -1,
                    .cross_mask = -1,
                    .row_mask = -1,
                    .b = rows,
                    .s = row_len,
                    .amp = o->precision == MP_PREC_AMP_BF16 || o->precision == MP_PREC_AMP_FP16 ||
                           o->precision == MP_PREC_BF16_AMP,
                    .amp_f32 = o->precision == MP_PREC_AMP_BF16 || o->precision == MP_PREC_AMP_FP16};
    p->blocks = calloc(m->n_blocks ? m->n_blocks : 1, sizeof *p->blocks);
    p->copied = calloc(m->n_blocks ? m->n_blocks : 1, sizeof *p->copied);
    if (!p->blocks || !p->copied) {
        mp_program_release(p);
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    }
    p->n_blocks = m->n_blocks;

    struct val x = program_input(&B);
    p->input = x.t;
    long n_rep = 0, rep_seen = 0, last_rep = -1;
    for (size_t i = 0; i < m->n_blocks; i++)
        if (m->blocks[i].repeat_group > 0 && !mp_block_vision(&m->blocks[i])) {
            n_rep++;
            last_rep = (long)i;
        }
    unsigned fixed = 0; /* check_only: blocks of this run lowered in a row, each from and to x */
    size_t last_per = 0;
    struct val fixed_x = x;
    bool copies = !check_only && !o->no_copies;
    /* what the last MP_PERIOD_MAX + 1 blocks made, for copies of them (copies only) */
    struct past *ring = copies ? calloc(MP_PERIOD_MAX + 1, sizeof *ring) : NULL;
    if (copies && !ring) {
        mp_program_release(p);
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    }
    struct state st_cur;
    unsigned misses = 0; /* verifications of this run that failed: after two, its blocks are lowered
                          * (each one copies what was built before: a long run must not repeat it) */
    for (size_t i = 0; i < m->n_blocks && !failed(&B); i++) {
        const struct mp_block *blk = &m->blocks[i];
        struct mp_block_prog *bp = &p->blocks[i];
        B.block = (int)i;
        /* freeze: numbers name decoder blocks (the repeated ones, as HF's layers.N); without
         * repeated blocks, every block by its index */
        bool vis = mp_block_vision(blk);
        if (!vis && n_rep && blk->repeat_group > 0) /* numbered as transformers' layers (mp_block.num_skip) */
            rep_seen += (long)blk->num_skip;
        long rep = vis ? -1 : n_rep == 0 ? (long)i : blk->repeat_group > 0 ? rep_seen++ : -1;
        /* the block this one repeats: per blocks before (its period; else the one before) */
        size_t per = blk->period && blk->period <= MP_PERIOD_MAX ? blk->period : 1;
        bool again = i >= per && same_block(blk, &m->blocks[i - per]);
        if (check_only && again && per == last_per && fixed >= 2 * per && same_val(p, x, fixed_x))
            continue;
        struct val in = x;
        /* --finetune freeze leaves the vision tower frozen (--train-blocks numbers the text model's) */
        B.trained = vis ? o->ft.mode == MP_FT_FULL : mp_finetune_block_trained(&o->ft, rep, n_rep > 0 && (long)i > last_rep);
        snprintf(B.prefix, sizeof B.prefix, "%s", blk->name);
        bp->input = x.t;
        bp->node0 = p->n_nodes;
        bp->param0 = p->n_params;
        struct span cur = {.i = i, .t0 = p->n_tensors, .n0 = p->n_nodes, .q0 = p->n_params, .in = x};
        uint64_t total0 = p->total_params, adapter0 = p->adapter_params, other0 = p->ep_other_params;
        if (copies)
            take_state(&B, &st_cur);
        if (!again)
            misses = 0;
        const struct past *src = copies && again ? &ring[(i - per) % (MP_PERIOD_MAX + 1)] : NULL;
        bool same_as_prev = src && misses < 2 && src->sp.ok && src->sp.i == i - per &&
                            same_state(&st_cur, &src->st) && same_val(p, x, src->sp.in);
        struct shift h = {.s = src ? &src->sp : NULL, .m = m, .to = i, .in_to = x.t};
        if (src) {
            h.dt = p->n_tensors - src->sp.t0;
            h.dq = p->n_params - src->sp.q0;
        }
        bool copied = same_as_prev && src->per == per && copy_block(&B, &src->sp, i, x),
             tried = same_as_prev && !copied;
        if (copied) {
            p->copied_blocks++;
            p->copied[i] = true;
            x = src->sp.out;
            x.t = sh_t(&h, src->sp.out.t);
        } else {
            struct before before = {.ok = false};
            if (same_as_prev)
                take_before(p, i, &before);
            struct val resid = x;
            if (i == 0)
                lower_idle(&B); /* a multimodal checkpoint's vision modules (frozen.c) */
            for (size_t j = 0; j < blk->n_layers && !failed(&B); j++)
                x = lower_layer(&B, x, &blk->layers[j], &resid);
            B.layer = NULL;
            if (same_as_prev)
                same_as_prev = unchanged_before(p, &before);
        }
        if (check_only && !failed(&B)) {
            bool to_itself = same_val(p, in, x);
            fixed = !to_itself ? 0 : again && per == last_per && fixed && same_val(p, in, fixed_x) ? fixed + 1 : 1;
            fixed_x = x;
            last_per = per;
        }
        bp->output = x.t;
        bp->n_nodes = p->n_nodes - bp->node0;
        bp->n_params = p->n_params - bp->param0;
        for (size_t k = bp->param0; k < p->n_params; k++)
            bp->params += p->params[k].elems;
        if (copies && !failed(&B)) {
            cur.t1 = p->n_tensors, cur.n1 = p->n_nodes, cur.q1 = p->n_params;
            cur.out = x;
            cur.total = p->total_params - total0;
            cur.adapter = p->adapter_params - adapter0;
            cur.ep_other = p->ep_other_params - other0;
            cur.ok = true;
            unsigned ver = copied ? (unsigned)per : 0;
            if (!copied) { /* lowered: is it the block it repeats, shifted, and did it leave the state as it was? */
                struct state after;
                take_state(&B, &after);
                bool verified = same_as_prev && same_state(&after, &st_cur) && is_shift(p, m, &src->sp, &cur);
                ver = verified ? (unsigned)per : 0;
                misses += tried && !verified;
            }
            struct past *me = &ring[i % (MP_PERIOD_MAX + 1)];
            me->sp = cur;
            me->st = st_cur;
            me->per = ver;
        }
        if (!failed(&B) && p->explicit_loss && i + 1 < m->n_blocks) {
            B.layer = NULL;
            fail_model(&B, MP_ERR_MODEL, "the loss (lm_head or classifier) must be in the last block");
        }
    }
    free(ring);
    /* --loss other than hf and --trainer orpo: honoured by a causal LM's head (one fused node), else
     * refused */
    bool fused = false;
    for (size_t k = 0; k < p->n_nodes && !fused; k++)
        fused = p->nodes[k].prim == MP_P_FUSED_LOSS;
    bool own = o->trainer == MP_TRAINER_ORPO || o->trainer == MP_TRAINER_DPO; /* (their loss on the logits) */
    if (!failed(&B) && !fused && (o->loss != MP_LOSS_HF || own)) {
        B.layer = NULL;
        B.prefix[0] = 0;
        if (o->loss != MP_LOSS_HF)
            fail_model(&B, MP_ERR_USAGE, "--loss %s: the model has no causal LM head (lm_head)", mp_loss_str(o->loss));
        else
            fail_model(&B, MP_ERR_USAGE, "--trainer %s: the model has no causal LM head (lm_head)",
                       mp_trainer_str(o->trainer));
    }
    if (failed(&B)) {
        enum mp_status st = B.st;
        mp_program_release(p);
        return st;
    }
    p->input_embed = B.embed_param;
    return finish_program(&B, o);
}

enum mp_status mp_program_check(const struct mp_model *m, struct mp_diag *d)
{
    struct mp_program prog;
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = 1;
    o.seq = m->input == MP_INPUT_TOKENS ? m->seq_len : 1;
    uint64_t it; /* --images: room for the image tokens (checked again against --seq when built) */
    if (m->images && mp_mul_u64(m->images, m->vision.tokens, &it) && it > o.seq)
        o.seq = it;
    memset(&prog, 0, sizeof prog);
    enum mp_status st = lower_program(m, &o, true, &prog, d);
    mp_program_release(&prog);
    return st;
}
