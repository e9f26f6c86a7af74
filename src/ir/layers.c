/* layers.c — lowers a model into the tensor program (layers.h).
 *
 * Each lower_<type>() takes the incoming value (tensor id + logical shape) and
 * returns the outgoing one, appending tensors, nodes and parameters.  What a
 * node saves follows PyTorch autograd (memory-facts.md §2) and autocast (§5):
 * amp keeps fp32 parameters and an fp32 residual stream, every Linear/Conv
 * casts its input to the half dtype (a new, saved copy when the input is
 * fp32) and saves a half copy of its weight; norms, softmax and the loss run
 * in fp32.  Shape letters: b batch, s sequence, h hidden, a heads, d head dim,
 * F ffn width, V vocabulary, M = b*s rows.  Pure: no I/O.
 */
#include "layers.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mp_build_opts_default(struct mp_build_opts *o)
{
    memset(o, 0, sizeof *o);
    mp_finetune_default(&o->ft);
    o->batch = 1;
    o->precision = MP_PREC_AMP_BF16;
    o->attention = MP_ATTN_SDPA;
}

/* ---- builder ------------------------------------------------------------------- */

struct val {
    int t;                              /* tensor id */
    int rank;
    uint64_t shape[MP_TENSOR_RANK_MAX]; /* logical shape (views change it, not the storage) */
};

struct bld {
    struct mp_program *p;
    const struct mp_model *m;
    struct mp_diag *d;
    enum mp_status st;
    int block;
    const struct mp_layer *layer;
    char prefix[96];  /* name prefix of the current op */
    int embed_param;  /* first embedding table (tied lm_head) */
    int rope_cos_sin; /* the model's rotary cos/sin tables (created by the first rope node), or -1 */
    int rope_pair;    /* interleaved rotary: the current layer's cos/sin pair (made by its q rope), or -1 */
    int attn_mask;    /* the model's (b, 1, s, s) attention mask (created by the first attention), or -1 */
    int pos_tables;   /* GPT-J: the per-layer sinusoid buffers, one resident tensor for all layers, or -1 */
    /* T5: the encoder output (read by every cross-attention), the current stack's position bias
     * (1, a, q, k), the decoder's cross-attention bias (zeros) and eager causal mask, or -1 */
    int enc_out, pos_bias, cross_bias, dec_mask;
    bool dec_started; /* T5: the first decoder block has been lowered */
    uint64_t s_enc;   /* T5: the encoder's length (B->s is the decoder's once the decoder starts) */
    uint64_t b, s;
    bool amp;
    bool in_adapter;  /* lowering a LoRA adapter: its Linears are trainable fp32, never quantized */
    bool no_lora;     /* the Linear is a module peft cannot adapt (an MoE router's bare Parameter) */
    bool trained;     /* the current block's own parameters train (full, or freeze-selected) */
    struct mp_tensor scratch; /* what T() gives for the id of a step that failed */
};

static bool failed(const struct bld *B) { return B->st != MP_OK; }

static void fail_model(struct bld *B, enum mp_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void fail_model(struct bld *B, enum mp_status st, const char *fmt, ...)
{
    if (failed(B))
        return;
    char what[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *bname = B->block >= 0 ? B->m->blocks[B->block].name : "input";
    B->st = mp_fail(B->d, st, "%s: %s%s%s: %s", B->m->path, bname, B->layer ? "." : "",
                    B->layer ? (B->layer->name[0] ? B->layer->name : mp_layer_type_str(B->layer->type)) : "", what);
}

static void overflow(struct bld *B)
{
    fail_model(B, MP_ERR_RANGE, "sizes overflow 64 bits at batch %llu, sequence %llu", (unsigned long long)B->b,
               (unsigned long long)B->s);
}

static bool grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    void *n = realloc(*arr, nc * elem);
    if (!n)
        return false;
    memset((char *)n + *cap * elem, 0, (nc - *cap) * elem);
    *arr = n;
    *cap = nc;
    return true;
}

/* Names of tensors, nodes and parameters: "prefix.name" (or name alone without a prefix),
 * cut at MP_NAME_MAX - 1 bytes, kept in chunks the program owns.  One allocation per
 * chunk instead of a fixed array in every tensor, node and parameter: a 100,000-block
 * model has millions of them. */
#define MP_NAME_MAX 96
#define NAME_CHUNK_BYTES 65536
struct mp_name_chunk {
    struct mp_name_chunk *next;
    size_t used;
    char text[NAME_CHUNK_BYTES];
};

static const char *store_name(struct bld *B, const char *prefix, const char *name)
{
    size_t lp = strlen(prefix), ln = strlen(name);
    size_t len = lp + (lp ? 1 : 0) + ln;
    if (len > MP_NAME_MAX - 1)
        len = MP_NAME_MAX - 1;
    struct mp_name_chunk *c = B->p->names;
    if (!c || c->used + len + 1 > sizeof c->text) {
        c = malloc(sizeof *c);
        if (!c) {
            B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
            return "";
        }
        c->next = B->p->names;
        c->used = 0;
        B->p->names = c;
    }
    char *s = c->text + c->used, *w = s, *end = s + len;
    for (const char *r = prefix; *r && w < end;)
        *w++ = *r++;
    if (lp && w < end)
        *w++ = '.';
    for (const char *r = name; *r && w < end;)
        *w++ = *r++;
    *w = '\0';
    c->used += len + 1;
    return s;
}

/* The current op's name for name: "prefix.name". */
static const char *name_of(struct bld *B, const char *name) { return store_name(B, B->prefix, name); }

static uint64_t mul(struct bld *B, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!mp_mul_u64(a, b, &r)) {
        overflow(B);
        return 0;
    }
    return r;
}

static uint64_t add(struct bld *B, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (!mp_add_u64(a, b, &r)) {
        overflow(B);
        return 0;
    }
    return r;
}

static struct val new_val(struct bld *B, const char *name, enum mp_dtype dt, int rank, const uint64_t *shape,
                          bool needs_grad)
{
    struct val v = {.t = -1, .rank = rank};
    if (failed(B))
        return v;
    struct mp_program *p = B->p;
    if (!grow((void **)&p->tensors, &p->cap_tensors, p->n_tensors + 1, sizeof *p->tensors)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return v;
    }
    struct mp_tensor *t = &p->tensors[p->n_tensors];
    memset(t, 0, sizeof *t); /* a rebuilt program reuses its memory */
    t->name = name_of(B, name);
    t->dtype = dt;
    t->rank = rank;
    uint64_t e = 1;
    for (int i = 0; i < rank; i++) {
        t->shape[i] = shape[i];
        v.shape[i] = shape[i];
        e = mul(B, e, shape[i]);
    }
    t->elems = e;
    t->bytes = mul(B, e, mp_dtype_size(dt));
    t->needs_grad = needs_grad;
    t->block = B->block;
    v.t = (int)p->n_tensors++;
    return v;
}

/* A flat tensor of n elements (extras: masks, stats, copies). */
static int new_flat(struct bld *B, const char *name, enum mp_dtype dt, uint64_t n)
{
    uint64_t shape[1] = {n};
    return new_val(B, name, dt, 1, shape, false).t;
}

static struct mp_node *new_node(struct bld *B, enum mp_prim prim, const char *name)
{
    if (failed(B))
        return NULL;
    struct mp_program *p = B->p;
    if (!grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return NULL;
    }
    struct mp_node *n = &p->nodes[p->n_nodes++];
    memset(n, 0, sizeof *n);
    n->prim = prim;
    n->name = name_of(B, name);
    n->layer = B->layer;
    n->block = B->block;
    n->in[0] = n->in[1] = n->in[2] = -1;
    n->in_grad_part[0] = n->in_grad_part[1] = n->in_grad_part[2] = -1;
    n->out_parts[0] = n->out_parts[1] = -1;
    n->out = -1;
    n->keep = -1;
    n->score_add[0] = n->score_add[1] = -1;
    n->wcopy = -1;
    n->param[0] = n->param[1] = -1;
    n->grad_in = true;
    return n;
}

static void save(struct mp_node *n, int t)
{
    if (!n || t < 0)
        return;
    for (int i = 0; i < n->n_saved; i++)
        if (n->saved[i] == t)
            return;
    if (n->n_saved < MP_NODE_SAVED_MAX)
        n->saved[n->n_saved++] = t;
    else
        MP_BUG("node %s saves too many tensors", n->name);
}

/* An extra tensor t of n (created with it, saved for backward), with its role. */
static void extra_as(struct mp_node *n, int t, enum mp_xrole role)
{
    if (!n || t < 0)
        return;
    if (n->n_extra >= MP_NODE_EXTRA_MAX)
        MP_BUG("node %s has too many extras", n->name);
    n->extra_role[n->n_extra] = role;
    n->extra[n->n_extra++] = t;
    save(n, t);
}

/* Sets n's forward or backward transient workspace to its parts (role, bytes), laid end to end. */
static void tmp_parts(struct bld *B, struct mp_node *n, bool bwd, int count, const enum mp_trole *roles,
                      const uint64_t *bytes)
{
    if (!n)
        return;
    if (count > MP_NODE_TMP_MAX)
        MP_BUG("node %s has too many temporaries", n->name);
    struct mp_tmp_part *pt = bwd ? n->bwd_tmp : n->fwd_tmp;
    uint64_t off = 0;
    for (int i = 0; i < count; i++) {
        pt[i] = (struct mp_tmp_part){roles[i], off, bytes[i]};
        off = add(B, off, bytes[i]);
    }
    *(bwd ? &n->n_bwd_tmp : &n->n_fwd_tmp) = count;
    *(bwd ? &n->bwd_tmp_bytes : &n->fwd_tmp_bytes) = off;
}

/* One transient of one role (MP_TR_OTHER: counted only). */
static void tmp_one(struct bld *B, struct mp_node *n, bool bwd, enum mp_trole role, uint64_t bytes)
{
    tmp_parts(B, n, bwd, bytes ? 1 : 0, &role, &bytes);
}

int mp_node_extra(const struct mp_node *n, enum mp_xrole r, int nth)
{
    for (int j = 0; j < n->n_extra; j++)
        if (n->extra_role[j] == r && nth-- == 0)
            return n->extra[j];
    return -1;
}

const struct mp_tmp_part *mp_node_tmp(const struct mp_node *n, bool bwd, enum mp_trole r)
{
    const struct mp_tmp_part *pt = bwd ? n->bwd_tmp : n->fwd_tmp;
    int cnt = bwd ? n->n_bwd_tmp : n->n_fwd_tmp;
    for (int i = 0; i < cnt; i++)
        if (pt[i].role == r && pt[i].bytes)
            return &pt[i];
    return NULL;
}

/* peft's task types SEQ_CLS, TOKEN_CLS and QUESTION_ANS keep the task head whole and trainable
 * (modules_to_save "classifier", "score" / "qa_outputs", matched as a name suffix, so DistilBERT's
 * pre_classifier too, and every module inside one: RoBERTa's classifier.dense): a trainable copy
 * beside the frozen original (ModulesToSaveWrapper).  memplan assumes the task type of the head
 * (HF configs; the snippet says so). */
static bool saved_module(const struct bld *B)
{
    static const char *const names[] = {"classifier", "score", "qa_outputs"};
    const struct mp_layer *l = B->layer;
    enum mp_ft_mode m = B->p->opts.ft.mode;
    if (B->in_adapter || !l || !B->m->hf_type[0] || (m != MP_FT_LORA && m != MP_FT_QLORA) ||
        (l->type != MP_LT_CLASSIFIER && l->type != MP_LT_LINEAR) || B->block != (int)B->m->n_blocks - 1)
        return false;
    size_t n = strlen(l->name);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        size_t k = strlen(names[i]);
        if ((n >= k && !strcmp(l->name + n - k, names[i])) || (!strncmp(l->name, names[i], k) && l->name[k] == '.'))
            return true;
    }
    return false;
}

static int new_param(struct bld *B, const char *name, uint64_t rows, uint64_t cols, bool matmul)
{
    if (failed(B))
        return -1;
    struct mp_program *p = B->p;
    if (!grow((void **)&p->params, &p->cap_params, p->n_params + 1, sizeof *p->params)) {
        B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
        return -1;
    }
    struct mp_param *q = &p->params[p->n_params];
    memset(q, 0, sizeof *q); /* a rebuilt program reuses its memory */
    q->name = name_of(B, name);
    q->elems = mul(B, rows, cols);
    q->rows = rows;
    q->cols = cols;
    q->matrix = rows > 1 && cols > 1;
    q->matmul = matmul;
    q->block = B->block;
    q->dtype = B->in_adapter ? MP_DT_F32 : p->param_dtype; /* peft autocast_adapter_dtype: fp32 adapters */
    bool saved = saved_module(B);
    q->trainable = B->in_adapter || B->trained || saved;
    q->adapter = B->in_adapter;
    q->raw_bytes = q->bytes = mul(B, q->elems, mp_dtype_size(q->dtype));
    p->total_params = add(B, p->total_params, q->elems);
    int id = (int)p->n_params++;
    if (saved) { /* the frozen original module: held, never used */
        if (!grow((void **)&p->params, &p->cap_params, p->n_params + 1, sizeof *p->params)) {
            B->st = mp_fail(B->d, MP_ERR_NOMEM, "%s: out of memory building the tensor program", B->m->path);
            return -1;
        }
        struct mp_param *o = &p->params[p->n_params];
        char on[96];
        *o = p->params[id];
        o->trainable = false;
        snprintf(on, sizeof on, "%s.original", name);
        o->name = name_of(B, on);
        p->total_params = add(B, p->total_params, o->elems);
        p->n_params++;
    }
    return id;
}

/* Tensor t.  A step that fails makes no tensor (new_val's id -1) and the lowering runs on
 * until its caller looks at B->st, so an id may be -1 once the build has failed: reads and
 * writes through it go to a scratch tensor, never outside the array. */
static struct mp_tensor *T(struct bld *B, int t)
{
    if (t >= 0 && (size_t)t < B->p->n_tensors)
        return &B->p->tensors[t];
    if (!failed(B))
        MP_BUG("tensor id %d of %zu", t, B->p->n_tensors);
    memset(&B->scratch, 0, sizeof B->scratch);
    return &B->scratch;
}
static enum mp_dtype dt_of(struct bld *B, struct val v) { return T(B, v.t)->dtype; }
static bool ng(struct bld *B, struct val v) { return v.t >= 0 && T(B, v.t)->needs_grad; }
static uint64_t last_dim(struct val v) { return v.rank ? v.shape[v.rank - 1] : 0; }
static uint64_t rows_of(struct val v)
{
    uint64_t r = 1;
    for (int i = 0; i + 1 < v.rank; i++)
        r *= v.shape[i]; /* bounded: the tensor's element count was checked */
    return r;
}

/* Elements of a value's logical shape (a view of part of a storage counts its part). */
static uint64_t val_elems(struct bld *B, struct val v)
{
    uint64_t e = 1;
    for (int i = 0; i < v.rank; i++)
        e = mul(B, e, v.shape[i]);
    return e;
}

static enum mp_dtype promote(enum mp_dtype a, enum mp_dtype b)
{
    if (a == MP_DT_F32 || b == MP_DT_F32)
        return MP_DT_F32;
    return a;
}

static void with_prefix(struct bld *B, const char *base, const char *part, char *save_buf)
{
    char b[sizeof B->prefix];
    snprintf(b, sizeof b, "%s", base);
    strcpy(save_buf, B->prefix);
    snprintf(B->prefix, sizeof B->prefix, "%s%s%s", b, (*b && *part) ? "." : "", part);
}

static void restore_prefix(struct bld *B, const char *save_buf) { strcpy(B->prefix, save_buf); }

/* A value of the same shape as v with another dtype. */
static struct val like(struct bld *B, const char *name, struct val v, enum mp_dtype dt, bool needs_grad)
{
    return new_val(B, name, dt, v.rank, v.shape, needs_grad);
}

static struct val with_last(struct bld *B, const char *name, struct val v, uint64_t last, enum mp_dtype dt,
                            bool needs_grad)
{
    uint64_t shape[MP_TENSOR_RANK_MAX];
    memcpy(shape, v.shape, sizeof shape);
    shape[v.rank - 1] = last;
    return new_val(B, name, dt, v.rank, shape, needs_grad);
}

/* The incoming width must equal what the layer declares. */
static bool width_ok(struct bld *B, struct val x, uint64_t dim, const char *field, const char *name)
{
    if (failed(B))
        return false;
    if (last_dim(x) == dim)
        return true;
    fail_model(B, MP_ERR_MODEL, "%s%s%s %llu does not match the incoming width %llu", name, *name ? ": " : "", field,
               (unsigned long long)dim, (unsigned long long)last_dim(x));
    return false;
}

/* A matmul node (linear, conv): saves its input and, under autocast, a half copy
 * of its weight from the forward to its backward (memory-facts §5). */
static struct mp_node *matmul_node(struct bld *B, enum mp_prim prim, const char *name, struct val xin, struct val y,
                                   int w, int bias)
{
    struct mp_node *n = new_node(B, prim, name);
    if (!n)
        return NULL;
    n->in[0] = xin.t;
    n->out = y.t;
    n->param[0] = w;
    n->param[1] = bias;
    save(n, xin.t);
    if (B->amp && w >= 0) {
        char wn[112];
        snprintf(wn, sizeof wn, "%s.weight_copy", name);
        n->wcopy = new_flat(B, wn, B->p->compute_dtype, B->p->params[w].elems);
        extra_as(n, n->wcopy, MP_XR_WEIGHT_COPY);
        /* backward: the half weight gradient, then its fp32 copy into .grad */
        tmp_one(B, n, true, MP_TR_WGRAD_HALF, mul(B, B->p->params[w].elems, mp_dtype_size(B->p->compute_dtype)));
    }
    return n;
}

/* ---- primitive lowerings ------------------------------------------------------------ */

/* A new value of x's shape: a copy in dtype dt (autocast casts, .float(), .contiguous():
 * ToCopyBackward0 saves nothing; its backward converts the gradient back), or LoRA's
 * scaling by a Python float (scale != 0; MulBackward0 of a scalar saves nothing). */
static struct val lower_copy(struct bld *B, struct val x, enum mp_dtype dt, double scale, const char *name)
{
    if (failed(B))
        return x;
    struct val y = like(B, name, x, dt, ng(B, x));
    struct mp_node *n = new_node(B, scale != 0 ? MP_P_SCALE : MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->p = scale;
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* A module buffer resident like the batch: int64 ids of `rows` elements, or (rows 0) an fp32
 * scalar.  Returns its tensor id (-1 when the table of buffers is full: MP_ERR_INTERNAL). */
static int id_buffer(struct bld *B, const char *name, uint64_t rows)
{
    if (failed(B))
        return -1;
    if (B->p->n_buffers >= MP_BUFFERS_MAX) {
        fail_model(B, MP_ERR_INTERNAL, "too many module buffers");
        return -1;
    }
    int t = new_flat(B, name, rows ? MP_DT_I64 : MP_DT_F32, rows ? rows : 1);
    B->p->buffers[B->p->n_buffers++] = t;
    return t;
}

/* x * a Python float (l->mult): a new tensor, nothing saved (MulBackward0 of a scalar). */
static struct val mult_copy(struct bld *B, struct val x, const struct mp_layer *l, const char *name)
{
    return l->mult != 0 ? lower_copy(B, x, dt_of(B, x), l->mult, name) : x;
}

static struct val cast_to(struct bld *B, struct val x, enum mp_dtype dt, const char *name)
{
    return lower_copy(B, x, dt, 0, name);
}

/* Autocast: matmul/conv inputs in the half dtype.  Returns x itself when no cast is needed. */
static struct val autocast_in(struct bld *B, struct val x, const char *name)
{
    enum mp_dtype c = B->p->compute_dtype;
    if (!B->amp || dt_of(B, x) == c || failed(B))
        return x;
    return lower_copy(B, x, c, 0, name);
}

static struct val lower_lora(struct bld *B, struct val x, struct val base, uint64_t in_f, uint64_t out_f,
                             const char *name);
static void unsave(struct mp_node *n, int t);

/* The base storage of a Linear that is not the output layer: quantized (QLoRA, or the
 * checkpoint's quantization_config), else NULL. */
static const struct mp_quant *base_quant(struct bld *B, bool head)
{
    if (B->in_adapter || head)
        return NULL;
    if (B->m->quant.kind != MP_Q_NONE)
        return &B->m->quant;
    if (B->p->opts.ft.mode == MP_FT_QLORA)
        return &B->p->opts.ft.quant;
    return NULL;
}

/* nn.Linear: saves its (cast) input and, under autocast, a half copy of W.
 * tied >= 0 uses that parameter as W (an lm_head tied to the embedding).
 * A quantized base (bitsandbytes Linear4bit, GPTQ, AWQ) keeps packed storage and
 * dequantizes W (out x in, compute dtype) into a temporary in forward and again in
 * backward (bitsandbytes MatMul4Bit saves only the packed weight, memory-facts §12);
 * autocast makes no weight copy of it.  bitsandbytes' Linear4bit.forward casts x to the
 * compute dtype itself and its result back to x's dtype (an fp32 result under autocast
 * when x is fp32, as after prepare_model_for_kbit_training); peft's LoRA Linear4bit clones
 * that result before adding the adapter.  A LoRA target gets its adapter after. */
static struct val lower_linear_p(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, bool bias,
                                 const char *name, int tied)
{
    if (!width_ok(B, x, in_f, "in_features", name))
        return x;
    bool head = B->layer && (B->layer->type == MP_LT_LM_HEAD || B->layer->type == MP_LT_CLASSIFIER);
    const struct mp_quant *qz = tied < 0 && !B->no_lora ? base_quant(B, head) : NULL; /* bnb replaces nn.Linear only */
    char cname[64];
    snprintf(cname, sizeof cname, "%s.cast", name);
    struct val xin = autocast_in(B, x, cname);
    enum mp_dtype odt = B->amp ? B->p->compute_dtype : dt_of(B, xin);
    int w = tied >= 0 ? tied : new_param(B, name[0] ? name : "weight", out_f, in_f, true);
    char pn[80];
    snprintf(pn, sizeof pn, "%s.bias", name);
    int bp = bias ? new_param(B, pn, 1, out_f, false) : -1;
    if (tied < 0 && w >= 0) {
        snprintf(pn, sizeof pn, "%s.weight", name);
        B->p->params[w].name = name_of(B, pn);
    }
    if (qz && w >= 0) {
        struct mp_param *q = &B->p->params[w];
        q->dtype = MP_DT_U8;
        q->trainable = false;
        q->raw_bytes = mp_quant_weight_bytes(qz, out_f, in_f);
        q->bytes = mp_quant_alloc_bytes(qz, out_f, in_f);
        if (!q->bytes)
            overflow(B);
    }
    struct val y = with_last(B, name, xin, out_f, odt, true);
    bool amp = B->amp;
    if (qz)
        B->amp = false; /* no autocast weight copy of a packed weight */
    struct mp_node *n = matmul_node(B, MP_P_LINEAR, name, xin, y, w, bp);
    B->amp = amp;
    if (!n)
        return y;
    n->rows = rows_of(xin);
    n->n = out_f;
    n->k = in_f;
    n->fwd_flops = 2.0 * (double)n->rows * (double)in_f * (double)out_f;
    n->bwd_flops = ng(B, xin) ? 2.0 * n->fwd_flops : n->fwd_flops;
    if (qz) {
        uint64_t dq = mp_quant_dequant_bytes(qz, out_f, in_f, mp_dtype_size(odt));
        if (!dq)
            overflow(B);
        n->quantized = true;
        tmp_one(B, n, false, MP_TR_DEQUANT, dq);
        tmp_one(B, n, true, MP_TR_DEQUANT, dq);
        /* dequantize: one pass over the weight in each direction */
        n->fwd_flops += 2.0 * (double)out_f * (double)in_f;
        n->bwd_flops += 2.0 * (double)out_f * (double)in_f;
    }
    /* a module peft keeps whole may not carry an adapter too: all-linear takes a token or QA
     * head (only SEQ_CLS leaves its head out), a named target may take a Linear inside one */
    if (saved_module(B) && !failed(B) &&
        (head ? B->p->opts.ft.all_linear && B->layer->pool != MP_POOL_FIRST && B->layer->pool != MP_POOL_LAST
              : mp_finetune_targets(&B->p->opts.ft, B->m->hf_type, name, false)))
        fail_model(B, MP_ERR_USAGE, "--lora-targets takes %s, which peft keeps whole for the task head "
                                    "(modules_to_save) and cannot also adapt (peft 0.21): name the targets", name);
    bool bnb4 = qz && (qz->kind == MP_Q_BNB_NF4 || qz->kind == MP_Q_BNB_FP4);
    if (bnb4 && dt_of(B, y) != dt_of(B, x)) {
        snprintf(cname, sizeof cname, "%s.to_%s", name, mp_dtype_str(dt_of(B, x)));
        y = cast_to(B, y, dt_of(B, x), cname); /* .to(inp_dtype) */
    }
    if (!B->in_adapter && !B->no_lora && !head && tied < 0 &&
        mp_finetune_targets(&B->p->opts.ft, B->m->hf_type, name, head)) {
        if (bnb4) {
            snprintf(cname, sizeof cname, "%s.clone", name);
            y = cast_to(B, y, dt_of(B, y), cname); /* peft lora.Linear4bit: result.clone() */
        }
        y = lower_lora(B, x, y, in_f, out_f, name);
    }
    return y;
}

static struct val lower_linear(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, bool bias,
                               const char *name)
{
    return lower_linear_p(B, x, in_f, out_f, bias, name, -1);
}

/* LayerNorm (autocast: fp32).  Saves input, mean, rstd (M fp32 each). */
/* A norm's weight: a (dim) parameter named "<name>.weight". */
static int norm_weight(struct bld *B, const char *name, uint64_t dim)
{
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    return new_param(B, pn, 1, dim, false);
}

/* The layer_norm op on xin: saves xin, mean and rstd (M fp32 each); g and be are its weight and
 * bias parameters (-1: none).  The output has xin's dtype. */
static struct val layernorm_node(struct bld *B, struct val xin, uint64_t dim, int g, int be, const char *name)
{
    struct val y = like(B, name, xin, dt_of(B, xin), true);
    struct mp_node *n = new_node(B, MP_P_LAYERNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(xin);
    n->in[0] = xin.t;
    n->out = y.t;
    n->param[0] = g;
    n->param[1] = be;
    save(n, xin.t);
    char en[80];
    snprintf(en, sizeof en, "%s.mean", name);
    extra_as(n, new_flat(B, en, MP_DT_F32, M), MP_XR_MEAN);
    snprintf(en, sizeof en, "%s.rstd", name);
    extra_as(n, new_flat(B, en, MP_DT_F32, M), MP_XR_RSTD);
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 8.0 * (double)T(B, xin.t)->elems;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

static struct val lower_layernorm(struct bld *B, struct val x, uint64_t dim, bool bias, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    struct val xin = x;
    if (B->amp && dt_of(B, x) != MP_DT_F32) {
        char cn[64];
        snprintf(cn, sizeof cn, "%s.cast", name);
        xin = cast_to(B, x, MP_DT_F32, cn);
    }
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    int g = new_param(B, pn, 1, dim, false);
    snprintf(pn, sizeof pn, "%s.bias", name);
    int be = bias ? new_param(B, pn, 1, dim, false) : -1;
    return layernorm_node(B, xin, dim, g, be, name);
}

/* The LayerNorm variants of HF families, one rule each (lower_norm picks them):
 * OLMo (OlmoLayerNorm): no weight, no bias; x.to(fp32), F.layer_norm, .to(x's dtype): a half x's
 *   fp32 copy is what the norm saves, and its fp32 output is cast back (a forward transient).
 *   Under autocast x is the fp32 residual: no copies.
 * Nemotron (NemotronLayerNorm1P): F.layer_norm(x, weight + 1, bias), weight + 1 a new (dim)
 *   tensor the norm saves; under autocast x, weight + 1 and bias are cast to the half dtype and
 *   the norm runs there with autocast off: x's half copy is saved (not the fp32 residual), the
 *   two half (dim) copies are saved too (layer_norm's backward takes weight and bias), the fp32
 *   weight + 1 is a forward transient, and the output is half. */
static struct val lower_layernorm_variant(struct bld *B, struct val x, const struct mp_layer *l, uint64_t dim,
                                          const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    enum mp_dtype xdt = dt_of(B, x), hdt = B->p->compute_dtype;
    char cn[64];
    if (l->ln_plain) {
        snprintf(cn, sizeof cn, "%s.float", name);
        struct val y = layernorm_node(B, xdt == MP_DT_F32 ? x : cast_to(B, x, MP_DT_F32, cn), dim, -1, -1, name);
        snprintf(cn, sizeof cn, "%s.to_%s", name, mp_dtype_str(xdt));
        return xdt == MP_DT_F32 ? y : cast_to(B, y, xdt, cn);
    }
    int g = norm_weight(B, name, dim);
    char pn[80];
    snprintf(pn, sizeof pn, "%s.bias", name);
    int be = l->norm_bias ? new_param(B, pn, 1, dim, false) : -1;
    struct val xin = x;
    if (B->amp && xdt != hdt) {
        snprintf(cn, sizeof cn, "%s.cast", name);
        xin = cast_to(B, x, hdt, cn);
    }
    struct val y = layernorm_node(B, xin, dim, g, be, name);
    if (failed(B))
        return y;
    struct mp_node *n = &B->p->nodes[B->p->n_nodes - 1];
    enum mp_dtype wdt = B->amp ? hdt : B->p->param_dtype;
    for (int i = 0; i < (B->amp && be >= 0 ? 2 : 1); i++) {
        snprintf(pn, sizeof pn, "%s.%s", name, i ? "bias_cast" : "weight_1p");
        extra_as(n, new_flat(B, pn, wdt, dim), MP_XR_NORM_WEIGHT);
    }
    if (B->amp)
        tmp_one(B, n, false, MP_TR_OTHER, mul(B, dim, mp_dtype_size(B->p->param_dtype)));
    return y;
}

/* HF RMSNorm (LlamaRMSNorm): x.float(); x * rsqrt(mean(x^2) + eps); weight * x.to(in dtype).
 * Saves the fp32 input (a copy when x is half), rsqrt (M fp32) and the normalized
 * tensor in x's dtype; the fp32 x^2 is a forward transient.  f32w (Gemma*RMSNorm,
 * Olmo2RMSNorm): (weight * normalized) in fp32, then .to(x's dtype): the normalized tensor
 * is saved in fp32 and the output has x's dtype. */
static struct val lower_rmsnorm(struct bld *B, struct val x, uint64_t dim, bool f32w, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    int g = norm_weight(B, name, dim);
    enum mp_dtype xdt = dt_of(B, x);
    struct val y = like(B, name, x, f32w ? xdt : promote(xdt, B->p->param_dtype), true);
    struct mp_node *n = new_node(B, MP_P_RMSNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(x), N = val_elems(B, x); /* a view (DeepSeek's kv latent): its part */
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    char en[80];
    if (xdt == MP_DT_F32) {
        save(n, x.t);
    } else {
        snprintf(en, sizeof en, "%s.x_fp32", name);
        extra_as(n, new_flat(B, en, MP_DT_F32, N), MP_XR_X_FP32);
    }
    snprintf(en, sizeof en, "%s.rsqrt", name);
    extra_as(n, new_flat(B, en, MP_DT_F32, M), MP_XR_RSQRT);
    snprintf(en, sizeof en, "%s.normed", name);
    extra_as(n, new_flat(B, en, f32w ? MP_DT_F32 : xdt, N), MP_XR_NORMED);
    tmp_one(B, n, false, MP_TR_OTHER, mul(B, N, 4)); /* x^2 in fp32 (or the fp32 normalized tensor before the cast) */
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 6.0 * (double)N;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

/* Cohere's LayerNorm (CohereLayerNorm: weight, no bias), a Python composite in fp32:
 * h = x.float(); mean; var = (h - mean).pow(2).mean() (pow saves its input, one fp32 h - mean);
 * (h - mean) * rsqrt(var + eps) (a second fp32 h - mean and the rsqrt, saved by the product);
 * weight.float() * normalized (saves the fp32 normalized tensor); .to(x's dtype).  Measured with
 * bench/torch_step.py's trackers under fake tensors: 3 x-sized fp32 tensors saved in fp32 and
 * bf16; backward 2 of them in fp32 beyond the gradients (and a half input's fp32 gradient before
 * its cast).  The executors want a mean: memplan keeps it (M fp32 more than torch). */
static struct val lower_cohere_norm(struct bld *B, struct val x, uint64_t dim, const char *name)
{
    if (!width_ok(B, x, dim, "dim", name))
        return x;
    int g = norm_weight(B, name, dim);
    enum mp_dtype xdt = dt_of(B, x);
    struct val y = like(B, name, x, xdt, true);
    struct mp_node *n = new_node(B, MP_P_LAYERNORM, name);
    if (!n)
        return y;
    uint64_t M = rows_of(x), N = val_elems(B, x);
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    n->param[1] = -1;
    static const char *const parts[5] = {"mean", "rsqrt", "centered", "centered_2", "normed"};
    static const enum mp_xrole roles[5] = {MP_XR_MEAN, MP_XR_RSTD, MP_XR_X_FP32, MP_XR_X_FP32, MP_XR_NORMED};
    for (int i = 0; i < 5; i++) {
        char en[80];
        snprintf(en, sizeof en, "%s.%s", name, parts[i]);
        extra_as(n, new_flat(B, en, MP_DT_F32, i < 2 ? M : N), roles[i]);
    }
    bool half = xdt != MP_DT_F32;
    /* the executors' layernorm backward reads x, which this composite does not keep */
    B->p->probe_unsupported = "Cohere's composite LayerNorm (its backward does not keep x)";
    tmp_one(B, n, false, MP_TR_OTHER, half ? mul(B, N, 4) : 0);       /* x.float() */
    tmp_one(B, n, true, MP_TR_OTHER, add(B, mul(B, N, 8), half ? mul(B, N, 2) : 0));
    n->rows = M;
    n->n = dim;
    n->fwd_flops = 10.0 * (double)N;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

static struct val lower_norm(struct bld *B, struct val x, const struct mp_layer *l, enum mp_norm kind,
                             uint64_t dim, const char *name)
{
    if (kind == MP_NORM_LAYERNORM && l->ln_fp32)
        return lower_cohere_norm(B, x, dim, name);
    if (kind == MP_NORM_LAYERNORM && (l->ln_plain || l->ln_1p))
        return lower_layernorm_variant(B, x, l, dim, name);
    if (kind == MP_NORM_RMSNORM)
        return lower_rmsnorm(B, x, dim, l->rms_fp32, name);
    return lower_layernorm(B, x, dim, l->type == MP_LT_RMSNORM ? false : l->norm_bias, name);
}

/* An activation.  Under autocast with a half input, a composite that calls an op on CUDA
 * autocast's fp32 list (the amp32 column: gelu_new's torch.pow) runs in fp32 from there on:
 * pow saves an fp32 copy of its input, the later intermediates and the output are fp32,
 * and the next Linear casts the output back (its saved half copy).  CUDA's list, not the
 * CPU's: memplan plans CUDA runs (bench/torch_step_results.md lists the CPU difference). */
static struct val lower_act(struct bld *B, struct val x, enum mp_act act, bool inplace, const char *name)
{
    if (failed(B))
        return x;
    enum mp_dtype xdt = dt_of(B, x);
    bool amp32 = B->amp && xdt != MP_DT_F32;
    bool saves_out = mp_act_saves_output(act);
    enum mp_dtype odt = amp32 && mp_act_fp32_under_amp(act, "out") ? MP_DT_F32 : xdt;
    struct val y = inplace && act == MP_ACT_RELU ? x : like(B, name, x, odt, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_ACT, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->act = act;
    char en[112];
    if (saves_out) {
        save(n, y.t);
    } else if (amp32 && mp_act_fp32_under_amp(act, "in")) {
        snprintf(en, sizeof en, "%s.x_fp32", name); /* autocast's cast for pow, saved by pow */
        extra_as(n, new_flat(B, en, MP_DT_F32, T(B, x.t)->elems), MP_XR_X_FP32);
    } else {
        save(n, x.t);
    }
    /* HF's Python composites (gelu_new, gelu_fast, xielu) keep intermediates the size of x (in x's
     * dtype, fp32 where the amp32 column says, one byte per element for a ":u8" bool) */
    size_t n_extras = 0;
    bool any32 = false;
    for (const char *e = mp_act_intermediates(act); *e; n_extras++) {
        size_t w = strcspn(e, " "), k = strcspn(e, " :");
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)k, e);
        bool f32 = amp32 && mp_act_fp32_under_amp(act, word);
        any32 |= f32;
        snprintf(en, sizeof en, "%s.%s", name, word);
        enum mp_dtype pdt = k < w ? MP_DT_U8 : f32 ? MP_DT_F32 : xdt;
        extra_as(n, new_flat(B, en, pdt, T(B, x.t)->elems), MP_XR_ACT_PART);
        e += w;
        e += strspn(e, " ");
    }
    /* xIELU's two learned (1,) scalars (the node makes their gradients).  Its two 0-dim buffers
     * (beta, eps: 512 bytes each as allocated) are not modelled: the table of module buffers is
     * short (MP_BUFFERS_MAX) and 1 KiB per layer is below any figure memplan reports */
    if (act == MP_ACT_XIELU) {
        static const char *const pn[2] = {"alpha_p", "alpha_n"};
        for (int i = 0; i < 2; i++) {
            snprintf(en, sizeof en, "%s.%s", name, pn[i]);
            n->param[i] = new_param(B, en, 1, 1, false);
        }
    }
    /* forward transients (the fwd column: gelu's pow(x, 3) and polynomial, xIELU's where branches),
     * not saved; two of them fp32 where autocast or an fp32 parameter upcast them */
    uint64_t elems = T(B, x.t)->elems, nf = (uint64_t)mp_act_fwd_tensors(act), n32 = any32 ? mp_min_u64(nf, 2) : 0;
    if (nf)
        tmp_one(B, n, false, MP_TR_OTHER,
                add(B, mul(B, mul(B, elems, 4), n32), mul(B, mul(B, elems, mp_dtype_size(xdt)), nf - n32)));
    /* backward of HF's composites: the x-sized tensors their chain of autograd nodes holds beyond
     * a fused kernel's gradients (model.h's bwd column, measured); an output promoted to fp32 by a
     * parameter (amp32 "out" without "in": xIELU) casts x's gradient back to x's dtype, one more
     * x-sized tensor; a bool part (xIELU's where mask) is freed before the peak, when the last op's
     * backward is done */
    if (mp_act_bwd_tensors(act)) {
        uint64_t bw = mul(B, mul(B, elems, mp_dtype_size(odt)), (uint64_t)mp_act_bwd_tensors(act));
        if (odt != xdt && !mp_act_fp32_under_amp(act, "in"))
            bw = add(B, bw, mul(B, elems, mp_dtype_size(xdt)));
        for (const char *e = mp_act_intermediates(act); *e; e += strcspn(e, " "), e += strspn(e, " "))
            if (strcspn(e, " ") > strcspn(e, " :") && bw >= elems)
                bw -= elems;
        tmp_one(B, n, true, MP_TR_OTHER, bw);
    }
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = 8.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* Dropout with 0 < p < 1 in training: a 1-byte mask per element (CUDA). */
static struct val lower_dropout(struct bld *B, struct val x, double p, const char *name)
{
    if (failed(B) || p <= 0.0)
        return x;
    struct val y = like(B, name, x, dt_of(B, x), ng(B, x));
    struct mp_node *n = new_node(B, MP_P_DROPOUT, name);
    if (!n)
        return y;
    char mn[80];
    snprintf(mn, sizeof mn, "%s.mask", name);
    n->in[0] = x.t;
    n->out = y.t;
    n->p = p;
    extra_as(n, new_flat(B, mn, MP_DT_U8, T(B, x.t)->elems), MP_XR_DROP_MASK);
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = 2.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

static struct val lower_add(struct bld *B, struct val a, struct val b, const char *name)
{
    if (failed(B))
        return a;
    if (T(B, a.t)->elems != T(B, b.t)->elems) {
        fail_model(B, MP_ERR_MODEL, "residual: the branch output (%llu elements) does not match the residual (%llu)",
                   (unsigned long long)T(B, b.t)->elems, (unsigned long long)T(B, a.t)->elems);
        return a;
    }
    struct val y = like(B, name, a, promote(dt_of(B, a), dt_of(B, b)), ng(B, a) || ng(B, b));
    struct mp_node *n = new_node(B, MP_P_ADD, name);
    if (!n)
        return y;
    n->in[0] = a.t;
    n->in[1] = b.t;
    n->out = y.t;
    n->rows = rows_of(a);
    n->n = last_dim(a);
    n->fwd_flops = (double)T(B, a.t)->elems;
    return y;
}

/* peft LoRA Linear.forward (tuners/lora/layer.py): result = base(x); x = x.to(A's dtype);
 * result = result + lora_B(lora_A(dropout(x))) * scaling; result.to(base result dtype).
 * A (r x in) and B (out x r) are fp32 (autocast_adapter_dtype).  Autograd keeps what
 * each op's gradients need: lora_A its input (x, or dropout(x) and the mask), lora_B
 * A.x; the scaling multiply and the sums keep nothing. */
static struct val lower_lora(struct bld *B, struct val x, struct val base, uint64_t in_f, uint64_t out_f,
                             const char *name)
{
    const struct mp_finetune *ft = &B->p->opts.ft;
    char saved[96], nm[64];
    with_prefix(B, B->prefix, name, saved);
    B->in_adapter = true;
    struct val xa = x;
    if (dt_of(B, x) != MP_DT_F32)
        xa = lower_copy(B, x, MP_DT_F32, 0, "lora_cast");
    if (ft->dropout > 0)
        xa = lower_dropout(B, xa, ft->dropout, "lora_dropout");
    struct val a = lower_linear_p(B, xa, in_f, ft->r, false, "lora_A", -1);
    struct val bo = lower_linear_p(B, a, ft->r, out_f, false, "lora_B", -1);
    B->in_adapter = false;
    if (!failed(B))
        B->p->adapter_params = add(B, B->p->adapter_params, mul(B, ft->r, add(B, in_f, out_f)));
    struct val sc = lower_copy(B, bo, dt_of(B, bo), ft->alpha / (double)ft->r, "lora_scale");
    struct val sum = lower_add(B, base, sc, "lora_add");
    if (!failed(B) && dt_of(B, sum) != dt_of(B, base)) {
        snprintf(nm, sizeof nm, "lora_to_%s", mp_dtype_str(dt_of(B, base)));
        sum = lower_copy(B, sum, dt_of(B, base), 0, nm);
    }
    restore_prefix(B, saved);
    return sum;
}

static void held_tensor(struct bld *B, int t, int release);

static struct val lower_rope(struct bld *B, struct val x, const struct mp_layer *l, uint64_t heads,
                             const char *name)
{
    if (failed(B))
        return x;
    /* q * cos + rotate_half(q) * sin is in the promoted dtype (fp32 under autocast, the table
     * being in the fp32 residual's dtype).  memplan keeps x's dtype where SDPA follows (its autocast
     * makes the half copy it saves either way); a q/k norm after the rotary gets the promoted one */
    enum mp_dtype ydt = dt_of(B, x);
    if (l->qk_norm_late && !l->rope_cast_back)
        ydt = promote(ydt, l->rope_fp32 ? MP_DT_F32 : B->p->param_dtype);
    struct val y = like(B, name, x, ydt, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_ROPE, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->heads = heads;
    n->head_dim = l->head_dim;
    n->rotary_dim = l->rotary_dim ? l->rotary_dim : l->head_dim;
    uint64_t tmp = mul(B, T(B, x.t)->bytes, 2);
    bool q_call = !strcmp(name, "q_rope");
    if (l->rope_interleave && !q_call) {
        save(n, B->rope_pair); /* k: the layer's pair, made by q's call */
        B->rope_pair = -1;     /* no other's (each layer leaves the builder as it found it:
                                * copies, folds) */
    } else if (l->rope_interleave) {
        /* apply_rotary_pos_emb slices the model's cos/sin to rotary_dim/2 and repeat_interleave's
         * them: a new (1, 1, s, rotary_dim) pair per layer, in the table's dtype (the residual
         * dtype; fp32 for ERNIE 4.5), saved by q's and k's products.  The model's table (made
         * once, by the first layer here) is saved by nobody: a forward local */
        enum mp_dtype cdt = l->rope_fp32 ? MP_DT_F32 : B->p->param_dtype;
        uint64_t pair = mul(B, mul(B, 2, B->s), n->rotary_dim);
        if (B->rope_cos_sin < 0) {
            B->rope_cos_sin = new_flat(B, "rope.cos_sin", cdt, pair);
            extra_as(n, B->rope_cos_sin, MP_XR_COS_SIN);
            unsave(n, B->rope_cos_sin);
            held_tensor(B, B->rope_cos_sin, B->block); /* a checkpoint input under checkpointing */
            const char *bn[2] = {"rotary_emb.inv_freq", "rotary_emb.original_inv_freq"};
            for (int i = 0; i < 2 && B->p->n_buffers < MP_BUFFERS_MAX; i++)
                B->p->buffers[B->p->n_buffers++] = new_flat(B, bn[i], MP_DT_F32, mp_ceil_div(n->rotary_dim, 2));
        }
        char en[112];
        snprintf(en, sizeof en, "%s.cos_sin", name);
        B->rope_pair = new_flat(B, en, cdt, pair);
        extra_as(n, B->rope_pair, MP_XR_COS_SIN);
    } else if (l->rope_table_rows) {
        /* GPT-J: cos and sin gathered from the layer's table for the s positions (position ids
         * of batch 1), cast to x's dtype, repeat_interleave'd: each apply_rotary_pos_emb saves
         * its own pair (1, s, 1, rotary_dim); the table's repeat and the fp32 gather are
         * forward transients */
        char en[112];
        snprintf(en, sizeof en, "%s.cos_sin", name);
        extra_as(n, new_flat(B, en, dt_of(B, x), mul(B, mul(B, 2, B->s), n->rotary_dim)), MP_XR_COS_SIN);
        tmp = add(B, tmp, mul(B, mul(B, add(B, l->rope_table_rows, B->s), n->rotary_dim), 4));
    } else if (B->rope_cos_sin < 0) {
        /* cos and sin (s x rotary_dim each, in the residual dtype) are made once per
         * forward and saved by every q*cos / rotate_half(q)*sin of every layer */
        /* (one pair per distinct layer type where the model keeps a table per type: Gemma3,
         * OLMo3; counted as one tensor) */
        uint64_t kinds = l->rope_kinds > 1 ? l->rope_kinds : 1;
        B->rope_cos_sin = new_flat(B, "rope.cos_sin", l->rope_fp32 ? MP_DT_F32 : B->p->param_dtype,
                                   mul(B, mul(B, mul(B, 2, kinds), B->s), n->rotary_dim));
        extra_as(n, B->rope_cos_sin, MP_XR_COS_SIN);
        B->p->rope_tables = B->rope_cos_sin;
        /* HF's rotary embedding registers inv_freq and a clone, original_inv_freq
         * (persistent=False: not in the checkpoint, but on the GPU): rotary_dim/2 fp32 each,
         * per layer type where there is a table per type */
        const char *bn[2] = {"rotary_emb.inv_freq", "rotary_emb.original_inv_freq"};
        for (int i = 0; i < 2 && B->p->n_buffers < MP_BUFFERS_MAX; i++)
            B->p->buffers[B->p->n_buffers++] =
                new_flat(B, bn[i], MP_DT_F32, mul(B, kinds, mp_ceil_div(n->rotary_dim, 2)));
    } else {
        save(n, B->rope_cos_sin);
    }
    /* products and sum in fp32 (ERNIE, Cohere: q.float() too), cast back */
    if (l->rope_cast_back && dt_of(B, x) != MP_DT_F32)
        tmp = mul(B, mul(B, T(B, x.t)->elems, 4), 3);
    n->seq = B->s;
    n->rows = rows_of(x);
    n->n = last_dim(x);
    /* q*cos, rotate_half(q) (a cat of two halves) and *sin: two x-sized temporaries (x may be a
     * view of the rotary part of each head, DeepSeek's MLA: its part; DeepSeek-V2's complex rotary
     * makes an fp32 copy and an fp32 product) */
    uint64_t xe = l->kv_lora ? val_elems(B, x) : T(B, x.t)->elems;
    if (l->kv_lora)
        tmp = mul(B, mul(B, xe, l->rope_complex ? 4 : mp_dtype_size(dt_of(B, x))), 2);
    tmp_one(B, n, false, MP_TR_OTHER, tmp);
    n->fwd_flops = 3.0 * (double)xe;
    n->bwd_flops = n->fwd_flops;
    return y;
}

static uint64_t round_up(uint64_t v, uint64_t m) { return mp_ceil_div(v, m) * m; }

/* Does attention layer l get a (b, 1, s, s) mask: always (Falcon builds one even for causal
 * attention), or on a sliding-window layer once the sequence reaches the window (transformers'
 * masking_utils then builds the mask instead of relying on SDPA's is_causal:
 * _ignore_causal_mask_sdpa). */
static bool sdpa_masked(const struct bld *B, const struct mp_layer *l)
{
    return l->attn_mask || (l->window && B->s >= l->window);
}

/* x.clamp_(-c, c) (OLMo's clip_qkv): in place, but ClampBackward1 needs x as it was, so autograd
 * saves a clone of it (measured: saved_tensors_hooks sees a new storage).  Modelled as a new clamped
 * tensor whose node saves x: the same two x-sized tensors, the same gradient. */
static struct val lower_clamp(struct bld *B, struct val x, const char *name)
{
    struct val y = lower_copy(B, x, dt_of(B, x), 0, name);
    if (!failed(B))
        save(&B->p->nodes[B->p->n_nodes - 1], x.t);
    return y;
}

/* The (b, 1, s, s) mask a model passes to attention (sdpa_masked; transformers'
 * create_causal_mask): made once per forward (the first attention
 * node's extra, held like the rotary tables).  For SDPA it is a bool mask that SDPA converts to
 * a float mask in q's dtype in every layer (convert_boolean_attn_mask) and saves; for eager
 * attention a float mask in the model's dtype, added to the scores: nothing saved. */
static void attn_mask(struct bld *B, struct mp_node *n, const char *name, bool eager, enum mp_dtype qdt)
{
    if (!n || !(sdpa_masked(B, n->layer) || (eager && n->layer->eager_mask)))
        return;
    uint64_t mb = mul(B, mul(B, B->b, B->s), B->s);
    if (B->attn_mask < 0) {
        uint64_t nm = eager && n->layer->eager_mask > 1 ? n->layer->eager_mask : 1;
        B->attn_mask = new_flat(B, "attn_mask", eager ? B->p->param_dtype : MP_DT_U8, mul(B, mb, nm));
        T(B, B->attn_mask)->name = store_name(B, "", "attn_mask");
        B->p->attn_mask = B->attn_mask;
        extra_as(n, B->attn_mask, MP_XR_ATTN_MASK);
        unsave(n, B->attn_mask);
    }
    if (!eager) {
        char en[112];
        snprintf(en, sizeof en, "%s.attn_mask_float", name);
        extra_as(n, new_flat(B, en, qdt, mb), MP_XR_ATTN_MASK);
    }
}

/* Scaled dot-product attention core: q (b,s,a*d), k (b,s,kv*d) and v (b,s,kv*dv).  Eager
 * attention makes contiguous copies of the inputs that are transposed views (copies: bit 0 q,
 * bit 1 k, bit 2 v; DeepSeek's q and k are fresh (b,a,s,d) tensors, its v a view). */
static struct val lower_attn_core(struct bld *B, struct val q, struct val k, struct val v, const struct mp_layer *l,
                                  uint64_t d, uint64_t dv, unsigned copies, const char *name)
{
    if (failed(B))
        return q;
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->impl_set ? B->p->opts.attention : l->impl;
    bool eager = impl == MP_ATTN_EAGER;
    uint64_t b = B->b, s = B->s, a = l->heads;
    enum mp_dtype cdt = dt_of(B, q);
    struct val y = with_last(B, name, q, mul(B, a, dv), cdt, true);
    struct mp_node *n = new_node(B, MP_P_ATTN, name);
    if (!n)
        return y;
    n->in[0] = q.t;
    n->in[1] = k.t;
    n->in[2] = v.t;
    n->out = y.t;
    n->heads = a;
    n->kv_heads = l->kv_heads;
    n->head_dim = d;
    n->seq = s;
    n->rows = mul(B, b, s);
    n->causal = l->causal;
    n->eager = eager;
    n->p = l->attn_dropout;
    uint64_t asb = mul(B, mul(B, a, s), b);      /* a*s*b */
    uint64_t ass = mul(B, asb, s);                /* a*s*s*b */
    char en[80];
    attn_mask(B, n, name, eager, cdt);
    if (eager && (l->attn_mask || l->eager_mask))
        n->score_add[0] = B->attn_mask;
    if (!eager) {
        /* SDPA flash / mem-efficient: saves q, k, v, out and the fp32 logsumexp. */
        save(n, q.t);
        save(n, k.t);
        save(n, v.t);
        save(n, y.t);
        /* q/k and v widths that differ (DeepSeek's MLA) rule out flash: the memory-efficient kernel
         * runs, whose logsumexp rows are rounded up to 32 in every dtype (_efficient_attention_forward) */
        uint64_t s_lse = cdt == MP_DT_F32 || dv != d ? round_up(s, 32) : s;
        snprintf(en, sizeof en, "%s.lse", name);
        extra_as(n, new_flat(B, en, MP_DT_F32, mul(B, mul(B, a, b), s_lse)), MP_XR_LSE);
        /* backward: softmax_d [b,a,s_r] and dq_accum [b,s_r,a,d_r] in fp32 (flash_api mha_bwd) */
        uint64_t s_r = round_up(s, 128), d_r = round_up(d, 32);
        const enum mp_trole fr[2] = {MP_TR_FLASH_D, MP_TR_FLASH_DQ};
        const uint64_t fb[2] = {mul(B, mul(B, mul(B, b, a), s_r), 4), mul(B, mul(B, mul(B, mul(B, b, s_r), a), d_r), 4)};
        tmp_parts(B, n, true, 2, fr, fb);
    } else {
        /* Eager: contiguous copies of q, k, v (reshape of transposed views, repeat_kv),
         * scores, softmax (fp32 under autocast), its cast, dropout. */
        const char *cn[3] = {"q_copy", "k_copy", "v_copy"};
        const enum mp_xrole cr[3] = {MP_XR_Q_COPY, MP_XR_K_COPY, MP_XR_V_COPY};
        const int in3[3] = {q.t, k.t, v.t};
        for (int i = 0; i < 3; i++) {
            if (!(copies & (1u << i))) { /* already a contiguous (b,a,s,d) tensor: the matmul saves it */
                save(n, in3[i]);
                continue;
            }
            /* GPT-J upcasts q and k to fp32 (under autocast the matmul casts them back) */
            enum mp_dtype qdt = i < 2 && l->qk_fp32 && !B->amp ? MP_DT_F32 : cdt;
            snprintf(en, sizeof en, "%s.%s", name, cn[i]);
            extra_as(n, new_flat(B, en, qdt, mul(B, asb, i == 2 ? dv : d)), cr[i]);
        }
        if (l->attn_softcap > 0) { /* scores / cap, tanh (saves its output), * cap (Gemma2) */
            snprintf(en, sizeof en, "%s.softcap_tanh", name);
            extra_as(n, new_flat(B, en, cdt, ass), MP_XR_SOFTCAP_TANH);
        }
        /* softmax in fp32: under autocast (softmax is on CUDA's fp32 list), or asked for
         * (softmax(..., dtype=torch.float32).to(q.dtype) in most HF decoders) */
        enum mp_dtype sm = B->amp || l->softmax_fp32 ? MP_DT_F32 : cdt;
        snprintf(en, sizeof en, "%s.probs", name);
        extra_as(n, new_flat(B, en, sm, ass), MP_XR_PROBS); /* softmax saves its output */
        if (l->attn_dropout > 0) {
            snprintf(en, sizeof en, "%s.dropout_mask", name);
            extra_as(n, new_flat(B, en, MP_DT_U8, ass), MP_XR_ATTN_DROP_MASK);
            snprintf(en, sizeof en, "%s.probs_dropped", name); /* saved by P@V */
            extra_as(n, new_flat(B, en, cdt, ass), MP_XR_PROBS_DROPPED);
        } else if (sm != cdt) {
            snprintf(en, sizeof en, "%s.probs_cast", name); /* probs.to(v dtype), saved by P@V */
            extra_as(n, new_flat(B, en, cdt, ass), MP_XR_PROBS_CAST);
        }
        /* the scores, their transients and the output heads: op by op, forward and backward
         * (eager_ops, once the program knows which inputs need a gradient) */
    }
    double f = 4.0 * (double)b * (double)a * (double)s * (double)s * (double)d;
    if (l->causal && !eager)
        f /= 2.0;
    n->fwd_flops = f;
    n->bwd_flops = 2.5 * f;
    return y;
}

/* RMSNorm of a q or k projection: over each head (the (b, s, heads, d) view; weight d) or
 * over the whole projection. */
static struct val qk_norm(struct bld *B, struct val x, const struct mp_layer *l, uint64_t heads, const char *name)
{
    if (failed(B) || l->qk_norm == MP_QK_NORM_ALL)
        return lower_rmsnorm(B, x, last_dim(x), l->rms_fp32, name);
    struct val v = x; /* (b, s, heads, d): a view */
    v.rank = x.rank + 1;
    v.shape[x.rank - 1] = heads;
    v.shape[x.rank] = l->head_dim;
    struct val y = lower_rmsnorm(B, v, l->head_dim, l->rms_fp32, name);
    y.rank = x.rank;
    y.shape[x.rank - 1] = last_dim(x);
    if (!failed(B)) { /* the output tensor is stored (b, s, heads * d), like q */
        struct mp_tensor *t = T(B, y.t);
        t->rank = y.rank;
        memcpy(t->shape, y.shape, sizeof t->shape);
    }
    return y;
}

static struct val lower_mla(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h);

/* A copy of x, width wide (Falcon's split of its fused qkv): tmp, the intermediate copies it
 * makes first (forward transients); index, an advanced-indexing copy that saves its int64 index. */
static struct val split_copy(struct bld *B, struct val x, uint64_t width, uint64_t tmp, bool index,
                             const char *name)
{
    if (failed(B))
        return x;
    struct val y = with_last(B, name, x, width, dt_of(B, x), ng(B, x));
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->rows = rows_of(x);
    n->n = width;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    if (index) {
        char en[112];
        snprintf(en, sizeof en, "%s.index", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, 1), MP_XR_SPLIT_INDEX);
    }
    tmp_one(B, n, false, MP_TR_OTHER, tmp);
    return y;
}

/* GPT-J: every attention layer registers its own sinusoid table (rope_table_rows x rotary_dim
 * fp32, persistent=False: on the GPU, not in the checkpoint).  One resident tensor holds them all
 * (m->pos_table_elems; a model made without mp_model_mark_copies: grown layer by layer). */
static void pos_table(struct bld *B, const struct mp_layer *l)
{
    uint64_t e = mul(B, l->rope_table_rows, l->rotary_dim ? l->rotary_dim : l->head_dim);
    if (failed(B))
        return;
    if (B->pos_tables < 0) {
        if (B->p->n_buffers >= MP_BUFFERS_MAX) {
            fail_model(B, MP_ERR_INTERNAL, "too many module buffers");
            return;
        }
        B->pos_tables = new_flat(B, "embed_positions", MP_DT_F32, B->m->pos_table_elems ? B->m->pos_table_elems : e);
        T(B, B->pos_tables)->name = store_name(B, "", "attn.embed_positions (all layers)");
        B->p->buffers[B->p->n_buffers++] = B->pos_tables;
        return;
    }
    if (B->m->pos_table_elems) /* every layer's, made with the first (so each later layer leaves the
                                * program as it found it: copies, folds) */
        return;
    struct mp_tensor *t = T(B, B->pos_tables);
    t->elems = add(B, t->elems, e);
    t->shape[0] = t->elems;
    t->bytes = mul(B, t->elems, 4);
}

/* transformers' repeat_kv(x, heads / kv_heads): expand(b, kv, n_rep, s, d).reshape(b, heads, s, d).
 * More than one kv head: the reshape copies every head (b, s, width) in x's dtype (saved by SDPA
 * in its place).  One kv head: the reshape is a view (SDPA saves x's storage, nothing is made),
 * unless autocast then casts it: that copy has every head.  Under amp the rotated k is fp32 in
 * torch (q * cos, cos in the fp32 residual's dtype; memplan's rope keeps x's dtype, and the bytes
 * SDPA saves are the same), so `rotated` says it is cast.  Not modelled:
 * the view's gradient, every head wide, before the expand's backward sums it.  The copy widens
 * its input, which no probe executor does. */
static struct val repeat_kv(struct bld *B, struct val x, uint64_t kv, uint64_t width, bool rotated,
                            const char *name)
{
    enum mp_dtype c = B->p->compute_dtype;
    bool cast = B->amp && (dt_of(B, x) != c || rotated);
    if (failed(B) || last_dim(x) == width || (kv == 1 && !cast))
        return x;
    B->p->probe_unsupported = "transformers' repeat_kv copies (sliding-window attention past its window)";
    struct val y = split_copy(B, x, width, 0, false, name);
    if (kv == 1 && !failed(B)) { /* the view's cast is the copy */
        struct mp_tensor *t = T(B, y.t);
        t->dtype = c;
        t->bytes = mul(B, t->elems, mp_dtype_size(c));
    }
    return y;
}

/* Multi-head attention with projections: q/k/v (fused or not), rope, core, out projection. */
static struct val lower_attention(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                                  const char *name)
{
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    if (l->kv_lora) {
        struct val y = lower_mla(B, x, l, hidden);
        restore_prefix(B, saved);
        return y;
    }
    uint64_t a = l->heads, kv = l->kv_heads, d = l->head_dim;
    uint64_t qd = mul(B, a, d), kd = mul(B, kv, d);
    struct val q, k, v;
    struct mp_layer core = *l; /* what the attention kernel sees */
    if (l->fused_qkv) {
        struct val qkv = lower_linear(B, x, hidden, add(B, qd, mul(B, 2, kd)), l->qkv_bias, "qkv_proj");
        q = k = v = qkv; /* views of one storage */
        q.shape[q.rank - 1] = qd;
        k.shape[k.rank - 1] = v.shape[v.rank - 1] = kd;
        if (l->qkv_split != MP_QKV_VIEWS) {
            bool expand = l->qkv_split == MP_QKV_COPY_EXPAND, index = l->qkv_split != MP_QKV_COPY_ALL;
            uint64_t kw = expand ? qd : kd, rows = rows_of(qkv), es = mp_dtype_size(dt_of(B, qkv));
            /* the new architecture first flattens each into (b, s, a*d), then copies it transposed;
             * k and v start as index copies (b, s, kv, 1, d) */
            uint64_t flat = expand ? mul(B, mul(B, rows, qd), es) : 0;
            uint64_t kv_tmp = expand ? add(B, flat, mul(B, mul(B, rows, kd), es)) : 0;
            q = split_copy(B, q, qd, flat, false, "q_split");
            k = split_copy(B, k, kw, kv_tmp, index, "k_split");
            v = split_copy(B, v, kw, kv_tmp, index, "v_split");
            if (expand)
                core.kv_heads = kv = a;
        }
    } else {
        q = lower_linear(B, x, hidden, qd, l->qkv_bias, "q_proj");
        k = lower_linear(B, x, hidden, kd, l->qkv_bias, "k_proj");
        v = lower_linear(B, x, hidden, kd, l->qkv_bias, "v_proj");
    }
    if (l->clip_qkv) {
        q = lower_clamp(B, q, "q_clamp");
        k = lower_clamp(B, k, "k_clamp");
        v = lower_clamp(B, v, "v_clamp");
    }
    if (l->qk_norm != MP_QK_NORM_NONE && !l->qk_norm_late) {
        q = qk_norm(B, q, l, a, "q_norm");
        k = qk_norm(B, k, l, kv, "k_norm");
    }
    if (l->rope && l->rope_table_rows)
        pos_table(B, l);
    if (l->rope) {
        q = lower_rope(B, q, l, a, "q_rope");
        k = lower_rope(B, k, l, kv, "k_rope");
    }
    if (l->qk_norm != MP_QK_NORM_NONE && l->qk_norm_late) {
        q = qk_norm(B, q, l, a, "q_norm");
        k = qk_norm(B, k, l, kv, "k_norm");
    }
    /* use_cache (transformers 5.23, no gradient checkpointing): DynamicLayer.update torch.cat's k
     * and v onto an empty cache tensor, so attention gets fresh copies; SDPA saves those (the
     * originals die unless something else keeps them: a fused qkv storage stays alive while q is
     * its view, GPT-2).  Eager attention saves its own contiguous copies of k and v either way. */
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->impl_set ? B->p->opts.attention : l->impl;
    if (B->m->use_cache && !B->p->opts.hf_checkpointing && impl != MP_ATTN_EAGER) {
        /* the cache holds them until the forward returns; under autocast the rotated k is fp32
         * (q * cos with cos in the fp32 residual's dtype), so its copy is too, and so is v's:
         * the empty cache tensors take k's dtype and torch.cat promotes; SDPA saves their half
         * casts (rope_cast_back families cast the rotated k back to k's dtype: no promotion) */
        k = cast_to(B, k, B->amp && l->rope && !l->rope_cast_back ? MP_DT_F32 : dt_of(B, k), "k_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
        v = cast_to(B, v, promote(dt_of(B, k), dt_of(B, v)), "v_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
    }
    /* transformers' SDPA path with a mask (sliding window) repeats k and v to every head
     * (sdpa_attention.py: use_gqa_in_sdpa is false with a mask; repeat_kv) */
    if (impl != MP_ATTN_EAGER && l->window && sdpa_masked(B, l) && kv < a) {
        k = repeat_kv(B, k, kv, qd, l->rope, "k_repeat");
        v = repeat_kv(B, v, kv, qd, false, "v_repeat");
        core.kv_heads = a;
    }
    /* SDPA autocasts its inputs: fp32 q/k (after an fp32 qk-norm) get half copies, and an
     * fp32 v (a bitsandbytes 4-bit v_proj returns x's dtype) too */
    q = autocast_in(B, q, "q_cast");
    k = autocast_in(B, k, "k_cast");
    v = autocast_in(B, v, "v_cast");
    struct val o = lower_attn_core(B, q, k, v, &core, d, d, 7u, "sdpa");
    /* (GPT-J's eager attention merges its heads with the one copy every eager output makes) */
    if (l->rope && !l->rope_table_rows && (l->rope_cat || (l->rotary_dim && l->rotary_dim < l->head_dim)) &&
        !failed(B)) {
        /* Partial rotary builds q with torch.cat, so the attention output follows q's
         * layout and transpose(1, 2).contiguous() copies it (gpt_neox, phi). */
        o = cast_to(B, o, dt_of(B, o), "out_contiguous");
    }
    o = lower_linear(B, o, qd, hidden, l->out_bias, "o_proj");
    restore_prefix(B, saved);
    return o;
}

/* a * b (MulBackward0 saves both factors); b may broadcast over a's last dimension (the MoE
 * weights (S, 1), Qwen2-MoE's shared-expert gate).  The product has a's shape and the promoted
 * dtype. */
static struct val lower_mul(struct bld *B, struct val a, struct val b, const char *name)
{
    if (failed(B))
        return a;
    struct val m = like(B, name, a, promote(dt_of(B, a), dt_of(B, b)), true);
    struct mp_node *n = new_node(B, MP_P_MUL, name);
    if (!n)
        return m;
    n->in[0] = a.t;
    n->in[1] = b.t;
    n->out = m.t;
    save(n, a.t);
    save(n, b.t);
    n->rows = rows_of(a);
    n->n = last_dim(a);
    n->fwd_flops = (double)val_elems(B, a);
    n->bwd_flops = 2.0 * n->fwd_flops;
    /* backward temporaries, alive together (measured: MulBackward0 makes b's product, then a's,
     * then casts): b's gradient when b broadcasts ((grad * a), a-shaped, summed after), and a's
     * gradient in the promoted dtype before its cast to a's (_to_copy) */
    uint64_t ma = mul(B, val_elems(B, a), mp_dtype_size(dt_of(B, m)));
    tmp_one(B, n, true, MP_TR_OTHER,
            add(B, val_elems(B, b) < val_elems(B, a) ? ma : 0, dt_of(B, a) != dt_of(B, m) ? ma : 0));
    /* the cast and the sum are the engine's (validate_outputs), after MulBackward0 returns */
    n->engine_grad[0] = dt_of(B, a) != dt_of(B, m);
    n->engine_grad[1] = val_elems(B, b) < val_elems(B, a) || dt_of(B, b) != dt_of(B, m);
    return m;
}

static struct val lower_mlp(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                            const char *name);

/* ---- mixture of experts (transformers 5.23, experts_implementation "grouped_mm") ----------------
 *
 * grouped_mm is transformers' default (modeling_utils get_correct_experts_implementation) and
 * what its integrations/moe.py grouped_mm_experts_forward does, op by op, for M tokens, top-k
 * k, S = M*k routed rows, E experts of width F:
 *   router (*TopKRouter.forward): logits = Linear(h, E); softmax or sigmoid (saved, M x E); topk
 *     (indices saved, M x k int64); optional renormalization (in place: saves the values and
 *     their sum); the weights (M, k);
 *   sort the S expert ids (perm); x[perm // k] -> (S, h) (IndexBackward saves the index, S int64);
 *     weights[perm] -> (S,) (saves perm); per-expert offsets (E int32, saved by grouped_mm);
 *   grouped_mm(x_sorted, gate_up_proj) -> (S, 2F) [all experts' weights: one (E, 2F, h)
 *     parameter]; act(gate) * up; grouped_mm(., down_proj) -> (S, h); * weights (S, 1);
 *     un-permute (saves inv_perm, S int64); view (M, k, h).sum(1); .to(x's dtype).
 * grouped_mm is not an autocast op: under amp it runs in the weights' dtype, fp32 (x, the
 * RMSNorm output, is fp32 there), so the experts' activations are fp32 (measured on the CPU,
 * bench/torch_step_results.md; CUDA's autocast list has no grouped_mm either, transformers'
 * _grouped_mm comment, pytorch#174763).  The S rows are one grouped GEMM whatever the split
 * over experts: routing imbalance (--moe-capacity) changes no tensor of this path. */

/* Dispatch/combine rows: out (rows, width) of x gathered by an index / permuted / summed over
 * the top-k copies, in dtype dt; n_idx int64 index tensors of S elements each are made and
 * saved (IndexBackward keeps its index).  Backward scatters into a zero gradient of x. */
static struct val moe_rows(struct bld *B, struct val x, uint64_t rows, uint64_t width, enum mp_dtype dt, int n_idx,
                           uint64_t idx, const char *name)
{
    if (failed(B))
        return x;
    uint64_t shape[2] = {rows, width};
    struct val y = new_val(B, name, dt, 2, shape, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_ROWS, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->rows = rows;
    n->n = width;
    char en[96];
    for (int i = 0; i < n_idx; i++) {
        snprintf(en, sizeof en, "%s.index", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, idx), MP_XR_ROW_INDEX);
    }
    if (n_idx) /* IndexBackward: index_put(zeros like x, ..., accumulate) is out of place */
        tmp_one(B, n, true, MP_TR_OTHER, T(B, x.t)->bytes);
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* Gives v's tensor another dtype (an op whose output dtype promotion the generic lowering does
 * not know). */
static void retype(struct bld *B, struct val v, enum mp_dtype dt)
{
    struct mp_tensor *t = T(B, v.t);
    t->dtype = dt;
    t->bytes = mul(B, t->elems, mp_dtype_size(dt));
}

/* grouped_mm(x, all experts' W^T): out (S, out_f) in x's dtype; saves x and the offsets. */
static struct val grouped_mm(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, uint64_t experts,
                             int offsets, const char *name)
{
    if (!width_ok(B, x, in_f, "in_features", name))
        return x;
    int w = new_param(B, name, mul(B, experts, out_f), in_f, false); /* a 3-D (E, out, in) parameter */
    struct val y = with_last(B, name, x, out_f, dt_of(B, x), true);
    struct mp_node *n = new_node(B, MP_P_GROUPED_MM, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    save(n, x.t);
    save(n, offsets);
    n->rows = rows_of(x);
    n->n = out_f;
    n->k = in_f;
    n->fwd_flops = 2.0 * (double)n->rows * (double)in_f * (double)out_f;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

/* The router: logits = Linear(h, E) (DeepSeek: on fp32 copies of x and W outside autocast),
 * then the top-k weights (M, k) as the family's *TopKRouter computes them. */
static struct val lower_router(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h)
{
    uint64_t M = rows_of(x), E = l->experts, k = l->top_k;
    bool ds = l->router == MP_ROUTER_FP32_SOFTMAX || l->router == MP_ROUTER_FP32_SIGMOID;
    struct val xin = x;
    bool copy_w = ds && !B->amp && dt_of(B, x) != MP_DT_F32; /* hidden.type(fp32), weight.type(fp32) */
    if (copy_w)
        xin = cast_to(B, x, MP_DT_F32, "gate.x_fp32");
    B->no_lora = true; /* *TopKRouter holds a Parameter, not an nn.Linear */
    struct val logits = lower_linear(B, xin, h, E, false, "gate");
    B->no_lora = false;
    if (failed(B))
        return logits;
    if (copy_w) /* the matmul saves the fp32 copy of W too */
        extra_as(&B->p->nodes[B->p->n_nodes - 1], new_flat(B, "gate.weight_fp32", MP_DT_F32, mul(B, E, h)),
                 MP_XR_WEIGHT_COPY);
    enum mp_dtype ldt = dt_of(B, logits);
    /* softmax(logits.float()) / softmax(dtype=float): fp32 probabilities; sigmoid: the logits' dtype */
    enum mp_dtype pdt = l->router == MP_ROUTER_FP32_SIGMOID ? ldt : MP_DT_F32;
    enum mp_dtype wdt = l->router == MP_ROUTER_SOFTMAX_CAST ? ldt : pdt; /* the weights */
    uint64_t shape[2] = {M, k};
    struct val w = new_val(B, "gate.weights", wdt, 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_ROUTER, "gate.topk");
    if (!n)
        return w;
    n->in[0] = logits.t;
    n->out = w.t;
    n->rows = M;
    n->n = E;
    n->k = k;
    extra_as(n, new_flat(B, "gate.probs", pdt, mul(B, M, E)), MP_XR_ROUTER_PROBS);
    extra_as(n, new_flat(B, "gate.topk_index", MP_DT_I64, mul(B, M, k)), MP_XR_TOPK_INDEX);
    if (l->norm_topk) { /* values /= values.sum(-1, keepdim=True): DivBackward keeps both */
        extra_as(n, new_flat(B, "gate.topk_values", pdt, mul(B, M, k)), MP_XR_TOPK_VALUES);
        extra_as(n, new_flat(B, "gate.topk_sum", pdt, M), MP_XR_TOPK_SUM);
    }
    if (l->route_mask) /* DeepSeek-V2 group_limited_greedy: masked_fill keeps its mask */
        extra_as(n, new_flat(B, "gate.group_mask", MP_DT_U8, mul(B, M, E)), MP_XR_ROUTE_MASK);
    /* forward transients: an fp32 copy of the logits (Mixtral's .float()) or DeepSeek-V3's
     * scores_for_choice and its masked copy; backward: the dense (M, E) gradient */
    uint64_t me4 = mul(B, mul(B, M, E), 4);
    tmp_one(B, n, false, MP_TR_OTHER,
            l->router == MP_ROUTER_FP32_SIGMOID ? mul(B, me4, 2) : ldt != MP_DT_F32 ? me4 : 0);
    tmp_one(B, n, true, MP_TR_OTHER, me4);
    n->fwd_flops = 5.0 * (double)M * (double)E;
    n->bwd_flops = n->fwd_flops;
    return w;
}

/* The routed experts on x (M, h) with weights w (M, k): grouped_mm_experts_forward. */
static struct val lower_experts(struct bld *B, struct val x, struct val w, const struct mp_layer *l, uint64_t h)
{
    char saved[96];
    with_prefix(B, B->prefix, "experts", saved);
    uint64_t M = rows_of(x), k = l->top_k, E = l->experts, F = l->expert_ffn, S = mul(B, M, k);
    enum mp_dtype xdt = dt_of(B, x);
    struct val xs = moe_rows(B, x, S, h, xdt, 1, S, "dispatch"); /* hidden_states[perm // k] */
    struct val ws = moe_rows(B, w, S, 1, dt_of(B, w), 1, S, "dispatch_weights"); /* weights[perm] */
    if (xdt != B->p->param_dtype) /* input.to(weight.dtype) */
        xs = cast_to(B, xs, B->p->param_dtype, "dispatch_cast");
    int offs = new_flat(B, "offsets", MP_DT_U8, mul(B, E, 4)); /* cumsum(histc(...)), int32 */
    if (!failed(B))
        extra_as(&B->p->nodes[B->p->n_nodes - 1], offs, MP_XR_EXPERT_OFFSETS);
    struct val gu = grouped_mm(B, xs, h, mul(B, 2, F), E, offs, "gate_up_proj");
    struct val g = gu, u = gu; /* chunk(2): two views; their gradients are two tensors, cat by
                                * SplitBackward once both exist */
    g.shape[g.rank - 1] = u.shape[u.rank - 1] = F;
    size_t gun = failed(B) ? 0 : B->p->n_nodes - 1; /* an index: the node array may move */
    struct val gp = like(B, "gate_up_proj.grad_gate", g, dt_of(B, gu), ng(B, gu));
    struct val up = like(B, "gate_up_proj.grad_up", u, dt_of(B, gu), ng(B, gu));
    struct val ga = lower_act(B, g, l->act, false, "act_fn");
    if (!failed(B))
        B->p->nodes[B->p->n_nodes - 1].in_grad_part[0] = gp.t;
    struct val m = lower_mul(B, ga, u, "mul");
    if (!failed(B)) {
        B->p->nodes[B->p->n_nodes - 1].in_grad_part[1] = up.t;
        B->p->nodes[gun].out_parts[0] = gp.t;
        B->p->nodes[gun].out_parts[1] = up.t;
    }
    struct val dn = grouped_mm(B, m, F, h, E, offs, "down_proj");
    struct val wo = lower_mul(B, dn, ws, "weighted");
    struct val un = moe_rows(B, wo, S, h, dt_of(B, wo), 1, S, "unpermute"); /* weighted_out[inv_perm] */
    struct val y = moe_rows(B, un, M, h, dt_of(B, un), 0, 0, "combine");  /* view(M, k, h).sum(1) */
    if (!failed(B) && dt_of(B, y) != xdt)
        y = cast_to(B, y, xdt, "combine_cast");
    restore_prefix(B, saved);
    return y;
}

/* An MoE layer's MLP: [shared expert (Qwen2-MoE, first)], router, experts, [shared expert
 * (DeepSeek)], the sum.  Qwen2-MoE gates its shared expert: sigmoid(Linear(h, 1)) * it. */
static struct val lower_moe(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h, const char *name)
{
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    B->p->probe_unsupported = "mixture-of-experts routing (router, token dispatch, grouped_mm)";
    struct val xt = x; /* hidden_states.view(-1, h) */
    xt.rank = 2;
    xt.shape[0] = rows_of(x);
    xt.shape[1] = h;
    struct mp_layer sl = *l; /* the shared expert: a gated MLP of its own width */
    sl.experts = 0;
    sl.ffn = l->shared_ffn;
    sl.gated = true;
    sl.fused_gate_up = false;
    struct val sh = {.t = -1};
    const char *shn = l->shared_gate ? "shared_expert" : "shared_experts";
    if (l->shared_ffn && l->shared_first)
        sh = lower_mlp(B, xt, &sl, h, shn);
    struct val y = lower_experts(B, xt, lower_router(B, xt, l, h), l, h);
    if (l->shared_ffn && !l->shared_first)
        sh = lower_mlp(B, xt, &sl, h, shn);
    if (sh.t >= 0 && l->shared_gate) {
        struct val gt = lower_act(B, lower_linear(B, xt, h, 1, false, "shared_expert_gate"), MP_ACT_SIGMOID, false,
                                  "shared_expert_gate.sigmoid");
        sh = lower_mul(B, sh, gt, "shared_expert_gated");
    }
    if (sh.t >= 0)
        y = lower_add(B, y, sh, "shared_add");
    y.rank = x.rank;
    memcpy(y.shape, x.shape, sizeof y.shape);
    restore_prefix(B, saved);
    return y;
}

/* ---- multi-head latent attention (DeepSeek-V2/V3 *Attention.forward) ------------------------
 * q = q_b(RMSNorm(q_a(x))) (or q_proj(x)); [kv | k_rot] = kv_a_proj_with_mqa(x);
 * kv = kv_a_layernorm(kv) (a view: its fp32 copy under half precision); rotary on q's and
 * k_rot's rope_dim columns; query = cat(q_nope, q_rot) (a new (b,a,s,nope+rope) tensor);
 * kv_b_proj(kv) -> k_nope | v per head; key = a new (b,a,s,nope+rope) tensor of k_nope and
 * k_rot (broadcast); v stays a view of kv_b's output; attention (SDPA: the memory-efficient
 * kernel, q/k and v widths differ); o_proj. */
static struct val lower_mla(struct bld *B, struct val x, const struct mp_layer *l, uint64_t h)
{
    B->p->probe_unsupported = "multi-head latent attention (q/k and v head widths differ)";
    uint64_t a = l->heads, r = l->rope_dim, qk = add(B, l->nope_dim, r), kvw = add(B, l->nope_dim, l->v_dim);
    struct val q;
    if (l->q_lora) {
        q = lower_linear(B, x, h, l->q_lora, l->qkv_bias, "q_a_proj");
        q = lower_rmsnorm(B, q, l->q_lora, false, "q_a_layernorm");
        q = lower_linear(B, q, l->q_lora, mul(B, a, qk), false, "q_b_proj");
    } else {
        q = lower_linear(B, x, h, mul(B, a, qk), false, "q_proj");
    }
    struct val ckv = lower_linear(B, x, h, add(B, l->kv_lora, r), l->qkv_bias, "kv_a_proj_with_mqa");
    struct val lat = ckv, krot = ckv, qrot = q;
    if (failed(B))
        return q;
    lat.shape[lat.rank - 1] = l->kv_lora;
    krot.shape[krot.rank - 1] = r;
    qrot.shape[qrot.rank - 1] = mul(B, a, r);
    lat = lower_rmsnorm(B, lat, l->kv_lora, false, "kv_a_layernorm");
    struct mp_layer rl = *l; /* rotary over rope_dim of each head */
    rl.head_dim = r;
    rl.rotary_dim = 0;
    qrot = lower_rope(B, qrot, &rl, a, "q_rope");
    krot = lower_rope(B, krot, &rl, 1, "k_rope");
    if (!l->rope_complex && !failed(B)) { /* V3's halves: q * cos with cos in the residual dtype (fp32
                                           * under amp) promote; V2's complex rotary casts back */
        retype(B, qrot, promote(dt_of(B, qrot), B->p->param_dtype));
        retype(B, krot, promote(dt_of(B, krot), B->p->param_dtype));
    }
    /* torch.cat((q_nope, q_rot)) in the promoted dtype (fp32 under amp: SDPA's autocast copies it) */
    struct val query = with_last(B, "query", q, mul(B, a, qk), promote(dt_of(B, q), dt_of(B, qrot)), true);
    struct mp_node *n = new_node(B, MP_P_CAST, "query"); /* torch.cat((q_nope, q_rot)): saves nothing */
    if (n) {
        n->in[0] = q.t;
        n->in[1] = qrot.t;
        n->out = query.t;
        n->rows = rows_of(q);
        n->n = mul(B, a, qk);
    }
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->impl_set ? B->p->opts.attention : l->impl;
    if (B->m->use_cache && !B->p->opts.hf_checkpointing && impl != MP_ATTN_EAGER) {
        /* use_cache: past_key_values.update(kv, k_rot) torch.cat's the latent and the rotated
         * k_rot into the cache (held until the forward returns); expand_kv reads the copies */
        lat = cast_to(B, lat, dt_of(B, lat), "kv_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
        krot = cast_to(B, krot, dt_of(B, krot), "k_rot_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
    }
    struct val kvb = lower_linear(B, lat, l->kv_lora, mul(B, a, kvw), false, "kv_b_proj");
    struct val key = with_last(B, "key", kvb, mul(B, a, qk), dt_of(B, kvb), true);
    n = new_node(B, MP_P_CAST, "key"); /* new_empty + copy_ of k_nope and k_rot: saves nothing */
    if (n) {
        n->in[0] = kvb.t;
        n->in[1] = krot.t;
        n->out = key.t;
        n->rows = rows_of(kvb);
        n->n = mul(B, a, qk);
    }
    struct val v = kvb; /* a view: the v columns of each head */
    v.shape[v.rank - 1] = mul(B, a, l->v_dim);
    struct val o = lower_attn_core(B, autocast_in(B, query, "q_cast"), autocast_in(B, key, "k_cast"), v, l, qk,
                                   l->v_dim, 4u, "sdpa");
    /* SDPA's memory-efficient kernel writes its output (b, s, a, dv): the transpose back is a view.
     * Eager attention's (b, a, s, dv) output is copied by the transpose-contiguous (a forward
     * transient of the node, as for every eager attention). */
    return lower_linear(B, o, mul(B, a, l->v_dim), h, l->out_bias, "o_proj");
}

static struct val lower_mlp(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                            const char *name)
{
    if (l->experts)
        return lower_moe(B, x, l, hidden, name);
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    struct val y;
    if (l->gated) {
        struct val g, u;
        if (l->fused_gate_up) { /* Phi-3: gate_up_proj, chunked into two views of one storage */
            g = u = lower_linear(B, x, hidden, mul(B, 2, l->ffn), l->mlp_bias, "gate_up_proj");
            g.shape[g.rank - 1] = u.shape[u.rank - 1] = l->ffn;
        } else {
            g = lower_linear(B, x, hidden, l->ffn, l->mlp_bias, "gate_proj");
            u = lower_linear(B, x, hidden, l->ffn, l->mlp_bias, "up_proj");
        }
        struct val ga = lower_act(B, g, l->act, false, "act");
        struct val m = lower_mul(B, ga, u, "mul");
        y = lower_linear(B, m, l->ffn, hidden, l->mlp_bias, "down_proj");
    } else {
        struct val f = lower_linear(B, x, hidden, l->ffn, l->mlp_bias, l->up_down ? "up_proj" : "fc1");
        f = lower_act(B, f, l->act, false, "act");
        y = lower_linear(B, f, l->ffn, hidden, l->mlp_bias, l->up_down ? "down_proj" : "fc2");
    }
    restore_prefix(B, saved);
    return y;
}

static struct val lower_transformer(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t h = l->dim;
    if (!width_ok(B, x, h, "dim", ""))
        return x;
    double ap = l->no_attn_out_dropout ? 0.0 : l->p; /* dropout on the attention branch */
    if (l->post_norm) { /* BERT: x = ln(x + drop(attn(x))); x = ln(x + drop(mlp(x))) */
        struct val a = lower_dropout(B, lower_attention(B, x, l, h, "attn"), ap, "attn_dropout");
        struct val h1 = lower_norm(B, lower_add(B, x, a, "attn_residual"), l, l->norm, h, "attn_norm");
        struct val m = lower_dropout(B, lower_mlp(B, h1, l, h, "mlp"), l->p, "mlp_dropout");
        return lower_norm(B, lower_add(B, h1, m, "mlp_residual"), l, l->norm, h, "mlp_norm");
    }
    if (l->branch_norm) { /* Gemma2/3: x + post(attn(pre(x))); OLMo2 (no_pre_norm): x + post(attn(x)) */
        struct val n1 = l->no_pre_norm ? x : lower_norm(B, x, l, l->norm, h, "ln_1");
        struct val a = lower_norm(B, lower_attention(B, n1, l, h, "attn"), l, l->norm, h, "post_attn_norm");
        struct val h1 = lower_add(B, x, lower_dropout(B, a, ap, "attn_dropout"), "attn_residual");
        struct val n2 = l->no_pre_norm ? h1 : lower_norm(B, h1, l, l->norm, h, "ln_2");
        struct val m = lower_norm(B, lower_mlp(B, n2, l, h, "mlp"), l, l->norm, h, "post_mlp_norm");
        return lower_add(B, h1, lower_dropout(B, m, l->p, "mlp_dropout"), "mlp_residual");
    }
    struct val n1 = lower_norm(B, x, l, l->norm, h, "ln_1");
    struct val a = lower_dropout(B, lower_attention(B, n1, l, h, "attn"), ap, "attn_dropout");
    if (l->parallel_residual) {
        struct val n2 = l->shared_norm ? n1 : lower_norm(B, x, l, l->norm, h, "ln_2");
        struct val m = lower_dropout(B, lower_mlp(B, n2, l, h, "mlp"), l->p, "mlp_dropout");
        struct val r = lower_add(B, a, m, "branch_sum");
        return lower_add(B, x, r, "residual");
    }
    struct val h1 = lower_add(B, x, mult_copy(B, a, l, "attn_mult"), "attn_residual");
    struct val n2 = lower_norm(B, h1, l, l->norm, h, "ln_2");
    struct val m = lower_dropout(B, lower_mlp(B, n2, l, h, "mlp"), l->p, "mlp_dropout");
    return lower_add(B, h1, mult_copy(B, m, l, "mlp_mult"), "mlp_residual");
}

/* ---- T5 (transformers 5.23 modeling_t5.py) ------------------------------------------------ */

/* T5LayerNorm: x.to(fp32).pow(2).mean (pow saves the fp32 x: a copy when x is half), x * rsqrt
 * (saves x itself and rsqrt), .to(the weight's dtype) when that is half, weight * normed (saves
 * normed): HF's RMSNorm plus, for a half x, x itself saved. */
static struct val lower_t5_norm(struct bld *B, struct val x, uint64_t dim, const char *name)
{
    struct val y = lower_rmsnorm(B, x, dim, false, name);
    if (!failed(B) && dt_of(B, x) != MP_DT_F32)
        save(&B->p->nodes[B->p->n_nodes - 1], x.t);
    return y;
}

/* A tensor the model makes once per forward and hands to many blocks: held until the loss, or
 * until block release's backward when that block is a checkpoint (estimate.c). */
static void held_tensor(struct bld *B, int t, int release)
{
    if (failed(B) || t < 0)
        return;
    if (B->p->n_held >= MP_HELD_MAX) {
        fail_model(B, MP_ERR_INTERNAL, "too many model-wide tensors");
        return;
    }
    B->p->held[B->p->n_held].t = t;
    B->p->held[B->p->n_held++].release = release;
}

/* A node making a new tensor from in (-1: none) with transients, no saved tensor of its own. */
static struct mp_node *t5_node(struct bld *B, const char *name, int in, int out, uint64_t fwd_tmp)
{
    struct mp_node *n = new_node(B, MP_P_CAST, name);
    if (!n)
        return NULL;
    n->in[0] = in;
    n->out = out;
    n->rows = 1;
    n->n = T(B, out)->elems;
    n->fwd_flops = (double)T(B, out)->elems;
    n->bwd_flops = n->fwd_flops;
    tmp_one(B, n, false, MP_TR_OTHER, fwd_tmp);
    return n;
}

/* compute_bias in layer 0 of a stack (UMT5: in every layer): the (q, k) relative positions
 * bucketed (int64 and fp32 (q, k) intermediates: forward transients), looked up in
 * relative_attention_bias (buckets x heads, the parameters' dtype; Embedding saves the int64
 * bucket index) and permuted to (1, heads, q, k): a view, handed to every layer of the stack
 * (UMT5: used by its own layer only). */
static struct val t5_position_bias(struct bld *B, const struct mp_layer *l, uint64_t ql, uint64_t kl)
{
    uint64_t shape[4] = {1, l->heads, ql, kl}, qk = mul(B, ql, kl);
    int w = new_param(B, "relative_attention_bias.weight", l->rel_buckets, l->heads, false);
    struct val pb = new_val(B, "position_bias", B->p->param_dtype, 4, shape, true);
    struct mp_node *n = t5_node(B, "relative_attention_bias", -1, pb.t, mul(B, qk, 3 * 8));
    if (!n)
        return pb;
    n->param[0] = w;
    extra_as(n, new_flat(B, "relative_position_bucket", MP_DT_I64, qk), MP_XR_POSITION_IDS);
    if (!l->bias_per_layer) /* UMT5: a local of the layer's attention */
        held_tensor(B, pb.t, B->block);
    return pb;
}

/* T5Attention (no 1/sqrt(d) scaling) of x over kv (x itself, or the encoder output) with the
 * position bias pb (1, a, q, k) added to the scores.
 * SDPA (transformers' default for T5): sdpa_attention_forward folds pb into a float attn_mask
 * per layer (create_position_bias_mask): encoder, pb.contiguous() (a copy: pb is a permuted
 * view); causal decoder, torch.where(causal (1, 1, q, k) bool, pb, min) (WhereBackward saves the
 * bool); cross-attention, the shared zeros as they are.  Under autocast SDPA casts the fp32 mask
 * to the half dtype (that copy is saved).  On CUDA a float mask rules out flash: the memory-
 * efficient kernel saves q, k, v, the mask, out and its fp32 logsumexp (b, a, q rounded up to
 * 32); its backward makes the mask's gradient at the expanded (b, a, q, k rounded up to 16) size
 * (_efficient_attention_backward), summed over the batch by ExpandBackward, and keeps delta
 * (b, a, q) and, for half inputs, an fp32 dq accumulator.  (The CPU runs a mask that needs a
 * gradient through the math kernel instead: bench/torch_step_results.md.)
 * Eager (eager_attention_forward): contiguous copies of q, k, v for the matmuls (saved), the
 * scores, + pb (promoted: fp32 under autocast), + the decoder's causal mask, a plain softmax
 * (fp32 under CUDA autocast; saves its output), dropout, the probabilities cast to v's dtype
 * (saved by P@V); the bias gradient is the scores' gradient summed over the batch. */
enum t5_attn { T5_ENC_SELF, T5_DEC_SELF, T5_CROSS };
static struct val t5_attention(struct bld *B, struct val x, struct val kv, const struct mp_layer *l,
                               enum t5_attn kind, const char *name)
{
    char saved[96], en[112];
    with_prefix(B, B->prefix, name, saved);
    uint64_t h = l->dim, a = l->heads, d = l->head_dim, inner = mul(B, a, d);
    uint64_t b = B->b, ql = B->s, kl = kind == T5_CROSS ? B->s_enc : B->s;
    enum mp_attn_impl impl = B->p->opts.attention_forced || !l->impl_set ? B->p->opts.attention : l->impl;
    bool eager = impl == MP_ATTN_EAGER;
    if (impl == MP_ATTN_FLASH) {
        fail_model(B, MP_ERR_USAGE, "--attention flash: transformers has no flash-attention path for T5 (the "
                                    "position bias is an additive mask): use sdpa or eager");
        restore_prefix(B, saved);
        return x;
    }
    struct val q = lower_linear(B, x, h, inner, false, "q");
    struct val k = lower_linear(B, kv, h, inner, false, "k");
    struct val v = lower_linear(B, kv, h, inner, false, "v");
    if (kind != T5_ENC_SELF && B->m->use_cache && !B->p->opts.hf_checkpointing && !eager) {
        /* EncoderDecoderCache: DynamicLayer.update torch.cat's k and v (self and cross) onto an
         * empty tensor; SDPA saves the copies, the cache holds them until the forward returns */
        k = cast_to(B, k, dt_of(B, k), "k_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
        v = cast_to(B, v, dt_of(B, v), "v_cache");
        if (!failed(B))
            B->p->nodes[B->p->n_nodes - 1].kv_cached = true;
    }
    if (failed(B)) {
        restore_prefix(B, saved);
        return x;
    }
    enum mp_dtype cdt = dt_of(B, q);
    uint64_t shape4[4] = {1, a, ql, kl}, aqk = mul(B, mul(B, a, ql), kl), baqk = mul(B, b, aqk);
    int pb;
    if (kind == T5_CROSS) {
        if (B->cross_bias < 0 || l->bias_per_layer) { /* torch.zeros (1, a, q, k) in q's dtype: made
                                                          by layer 0 and handed on (UMT5: every layer) */
            struct val z = new_val(B, "position_bias_zeros", cdt, 4, shape4,
                                   B->p->opts.hf_checkpointing && !l->bias_per_layer);
            struct mp_node *zn = t5_node(B, "position_bias_zeros", -1, z.t, 0);
            if (zn) {
                zn->no_grad = true;
                zn->grad_in = false;
            }
            B->cross_bias = z.t;
            if (!l->bias_per_layer)
                held_tensor(B, z.t, B->block);
            /* under HF checkpointing T5Attention sets requires_grad on it: a leaf (not UMT5's) */
            if (!failed(B) && B->p->opts.hf_checkpointing && !l->bias_per_layer)
                B->p->held[B->p->n_held - 1].leaf = true;
        }
        pb = B->cross_bias;
    } else {
        if (l->rel_buckets)
            B->pos_bias = t5_position_bias(B, l, ql, kl).t;
        pb = B->pos_bias;
    }
    if (pb < 0) {
        fail_model(B, MP_ERR_MODEL, "no relative position bias before this layer (rel_buckets in layer 0)");
        restore_prefix(B, saved);
        return x;
    }
    if (l->bias_per_layer) /* UMT5: the layer's own, for no other (so each layer leaves the builder
                            * as it found it, and a layer repeats the one before: copies, folds) */
        *(kind == T5_CROSS ? &B->cross_bias : &B->pos_bias) = -1;
    bool pb_grad = T(B, pb)->needs_grad;
    enum mp_dtype pdt = T(B, pb)->dtype;
    struct val y = with_last(B, "attn", q, inner, cdt, true);
    int mask = pb;
    if (!eager && kind != T5_CROSS) {
        enum mp_dtype mdt = B->amp ? cdt : pdt;
        mask = new_val(B, "position_bias_mask", mdt, 4, shape4, true).t;
        /* the fp32 contiguous / where output before its autocast copy */
        struct mp_node *mn = t5_node(B, "position_bias_mask", pb, mask, B->amp ? mul(B, aqk, 4) : 0);
        if (mn && kind == T5_DEC_SELF)
            extra_as(mn, new_flat(B, "causal_mask", MP_DT_U8, mul(B, ql, kl)), MP_XR_ATTN_MASK);
        /* backward: the expanded gradient, its batch sum, the sum's fp32 copy (autocast) */
        tmp_one(B, mn, true, MP_TR_OTHER,
                add(B, mul(B, mul(B, mul(B, b, mul(B, a, ql)), round_up(kl, 16)), mp_dtype_size(mdt)),
                    mul(B, aqk, mp_dtype_size(mdt) + (B->amp ? 4 : 0))));
    } else if (pb_grad) {
        /* the scores' (or the zeros' mask's) gradient reaches pb: a view node carries it */
        struct mp_node *vn = new_node(B, MP_P_VIEW, "position_bias_grad");
        if (vn) {
            vn->in[0] = vn->out = pb;
            vn->rows = 1;
            vn->n = aqk;
            /* eager: the batch sum of the scores' gradient; SDPA (the zeros under HF checkpointing):
             * the kernel's expanded gradient and its batch sum */
            uint64_t ex = eager ? 0 : mul(B, mul(B, mul(B, b, mul(B, a, ql)), round_up(kl, 16)), mp_dtype_size(pdt));
            tmp_one(B, vn, true, MP_TR_OTHER, add(B, ex, mul(B, aqk, mp_dtype_size(eager ? promote(cdt, pdt) : pdt))));
        }
    }
    if (eager && kind == T5_DEC_SELF && B->dec_mask < 0) {
        /* create_causal_mask: a (b, 1, q, q) float mask in the model's dtype, once per forward */
        B->dec_mask = new_flat(B, "causal_mask", B->p->param_dtype, mul(B, mul(B, b, ql), kl));
        t5_node(B, "causal_mask", -1, B->dec_mask, 0);
        if (!failed(B)) {
            B->p->nodes[B->p->n_nodes - 1].no_grad = true;
            B->p->nodes[B->p->n_nodes - 1].grad_in = false;
        }
        held_tensor(B, B->dec_mask, B->block);
    }
    struct mp_node *n = new_node(B, MP_P_ATTN, "attention");
    if (!n) {
        restore_prefix(B, saved);
        return y;
    }
    n->in[0] = q.t;
    n->in[1] = k.t;
    n->in[2] = v.t;
    n->out = y.t;
    n->heads = n->kv_heads = a;
    n->head_dim = d;
    n->seq = ql;
    n->rows = mul(B, b, ql);
    n->causal = false; /* the causal mask is in the bias */
    n->eager = eager;
    n->p = l->attn_dropout;
    n->keep = mask; /* the mask is an argument, not an input with a gradient slot: alive until it runs */
    uint64_t baq = mul(B, mul(B, b, a), ql);
    if (!eager) {
        save(n, q.t);
        save(n, k.t);
        save(n, v.t);
        save(n, y.t);
        save(n, mask);
        snprintf(en, sizeof en, "lse");
        extra_as(n, new_flat(B, en, MP_DT_F32, mul(B, mul(B, b, a), round_up(ql, 32))), MP_XR_LSE);
        uint64_t gb = T(B, mask)->needs_grad
                          ? mul(B, mul(B, baq, round_up(kl, 16)), mp_dtype_size(T(B, mask)->dtype)) : 0;
        tmp_one(B, n, true, MP_TR_OTHER,
                add(B, add(B, mul(B, baq, 4), cdt != MP_DT_F32 ? mul(B, mul(B, baq, d), 4) : 0), gb));
    } else {
        extra_as(n, new_flat(B, "q_copy", cdt, mul(B, baq, d)), MP_XR_Q_COPY);
        extra_as(n, new_flat(B, "k_copy", cdt, mul(B, mul(B, mul(B, b, a), kl), d)), MP_XR_K_COPY);
        extra_as(n, new_flat(B, "v_copy", cdt, mul(B, mul(B, mul(B, b, a), kl), d)), MP_XR_V_COPY);
        enum mp_dtype sdt = promote(cdt, pdt);            /* scores + pb */
        enum mp_dtype sm = B->amp ? MP_DT_F32 : sdt;       /* softmax: CUDA autocast's fp32 list */
        extra_as(n, new_flat(B, "probs", sm, baqk), MP_XR_PROBS);
        if (l->attn_dropout > 0) {
            extra_as(n, new_flat(B, "dropout_mask", MP_DT_U8, baqk), MP_XR_ATTN_DROP_MASK);
            extra_as(n, new_flat(B, "probs_dropped", sm, baqk), MP_XR_PROBS_DROPPED);
            if (sm != cdt) {
                unsave(n, n->extra[n->n_extra - 1]); /* P@V saves the cast, not the dropped fp32 */
                extra_as(n, new_flat(B, "probs_cast", cdt, baqk), MP_XR_PROBS_CAST);
            }
        } else if (sm != cdt) {
            extra_as(n, new_flat(B, "probs_cast", cdt, baqk), MP_XR_PROBS_CAST);
        }
        /* the scores (* 1.0), + pb, + the decoder's causal mask, ..., op by op (eager_ops) */
        n->score_add[0] = pb;
        n->score_add[1] = kind == T5_DEC_SELF ? B->dec_mask : -1;
    }
    double f = 4.0 * (double)b * (double)a * (double)ql * (double)kl * (double)d;
    n->fwd_flops = f;
    n->bwd_flops = 2.5 * f;
    struct val o = lower_linear(B, y, inner, h, false, "o");
    restore_prefix(B, saved);
    return o;
}

/* T5LayerFF: DenseReluDense (wi, act; or wi_0 act * wi_1), dropout, the cast to wo's dtype (an
 * fp32 copy of the half activation under autocast; wo then casts it back), wo. */
static struct val t5_ff(struct bld *B, struct val x, const struct mp_layer *l, const char *name)
{
    if (base_quant(B, false)) { /* checked before any Linear of the feed-forward */
        fail_model(B, B->m->quant.kind != MP_Q_NONE ? MP_ERR_MODEL : MP_ERR_USAGE,
                   "a quantized T5 is not modelled: transformers keeps wo in fp32 and unquantized "
                   "(_keep_in_fp32_modules), so the feed-forward's dtypes differ; use --finetune lora");
        return x;
    }
    char saved[96];
    with_prefix(B, B->prefix, name, saved);
    uint64_t h = l->dim, F = l->ffn;
    struct val m;
    if (l->gated) {
        struct val g = lower_act(B, lower_linear(B, x, h, F, false, "wi_0"), l->act, false, "act");
        m = lower_mul(B, g, lower_linear(B, x, h, F, false, "wi_1"), "mul");
    } else {
        m = lower_act(B, lower_linear(B, x, h, F, false, "wi"), l->act, false, "act");
    }
    m = lower_dropout(B, m, l->p, "dropout");
    if (!failed(B) && dt_of(B, m) != B->p->param_dtype)
        m = cast_to(B, m, B->p->param_dtype, "to_wo_dtype");
    struct val y = lower_linear(B, m, F, h, false, "wo");
    restore_prefix(B, saved);
    return y;
}

/* T5Block: x + dropout(SelfAttention(norm(x))); [x + dropout(EncDecAttention(norm(x), encoder
 * output))]; x + dropout(FF(norm(x))).  Module names as transformers': layer.0 / 1 / 2. */
static struct val lower_t5_block(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t h = l->dim;
    if (!width_ok(B, x, h, "dim", ""))
        return x;
    if (l->cross_attn && B->enc_out < 0) {
        fail_model(B, MP_ERR_MODEL, "a T5 decoder block needs the decoder embedding (dec_input) before it");
        return x;
    }
    if (l->cross_attn && !B->dec_started) { /* the first decoder layer: checkpoint inputs hold it */
        B->dec_started = true;
        for (size_t j = 0; j < B->p->n_held; j++)
            if (B->p->held[j].t == B->enc_out)
                B->p->held[j].release = B->block;
    }
    B->p->probe_unsupported = "T5's encoder-decoder attention (relative position bias, cross-attention)";
    char p0[24], p1[24], p2[24];
    snprintf(p0, sizeof p0, "layer.0");
    snprintf(p1, sizeof p1, "layer.1");
    snprintf(p2, sizeof p2, "layer.%d", l->cross_attn ? 2 : 1);
    char sv[96];
    with_prefix(B, B->prefix, p0, sv);
    struct val n0 = lower_t5_norm(B, x, h, "layer_norm");
    struct val a = t5_attention(B, n0, n0, l, l->cross_attn ? T5_DEC_SELF : T5_ENC_SELF, "SelfAttention");
    restore_prefix(B, sv);
    x = lower_add(B, x, lower_dropout(B, a, l->p, "layer.0.dropout"), "layer.0.residual");
    if (l->cross_attn) {
        struct val e = {.t = B->enc_out, .rank = 3, .shape = {B->b, B->s_enc, h}};
        with_prefix(B, B->prefix, p1, sv);
        struct val c = t5_attention(B, lower_t5_norm(B, x, h, "layer_norm"), e, l, T5_CROSS, "EncDecAttention");
        restore_prefix(B, sv);
        x = lower_add(B, x, lower_dropout(B, c, l->p, "layer.1.dropout"), "layer.1.residual");
    }
    with_prefix(B, B->prefix, p2, sv);
    struct val f = t5_ff(B, lower_t5_norm(B, x, h, "layer_norm"), l, "DenseReluDense");
    f = lower_dropout(B, f, l->p, "dropout");
    restore_prefix(B, sv);
    char rn[32];
    snprintf(rn, sizeof rn, "%s.residual", p2);
    return lower_add(B, x, f, rn);
}

/* The decoder's embedding: decoder_input_ids = _shift_right(labels) (new_zeros, a shifted clone,
 * masked_fill_ of -100: int64 (b, t), made when the decoder starts, saved by the lookup), looked
 * up in the shared table.  The incoming value is the encoder output: held for every decoder
 * layer's cross-attention (checkpoint inputs under checkpointing).  From here on the sequence is
 * the decoder's. */
static struct val lower_t5_decoder_embed(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (failed(B))
        return x;
    if (B->embed_param < 0 || !width_ok(B, x, l->dim, "dim", nm)) {
        fail_model(B, MP_ERR_MODEL, "a decoder embedding needs the encoder (its shared table and output) before it");
        return x;
    }
    B->enc_out = x.t;
    held_tensor(B, x.t, B->block);
    B->s_enc = B->s;
    B->s = B->p->opts.target_seq;
    B->pos_bias = -1;
    uint64_t shape[3] = {B->b, B->s, l->dim};
    struct val ids = new_val(B, "decoder_input_ids", MP_DT_I64, 2, shape, false);
    struct mp_node *sn = t5_node(B, "shift_right", B->m->dec_from_input ? B->p->input : B->p->labels, ids.t,
                                 add(B, T(B, ids.t)->bytes, mul(B, B->b, B->s)));
    if (sn) {
        sn->no_grad = true;
        sn->grad_in = false;
    }
    struct val y = new_val(B, nm, B->p->param_dtype, 3, shape, true);
    struct mp_node *n = new_node(B, MP_P_EMBED, nm);
    if (!n)
        return y;
    n->in[0] = ids.t;
    n->out = y.t;
    n->param[0] = B->embed_param;
    save(n, ids.t);
    n->rows = mul(B, B->b, B->s);
    n->n = l->dim;
    n->k = l->vocab;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return lower_dropout(B, y, l->emb_dropout, "dropout");
}

/* Cross-entropy as PyTorch runs it: an fp32 upcast of half logits, log_softmax, nll_loss.
 * upcast: HF's causal-LM loss (ForCausalLMLoss) and token classification call
 * logits.float() whatever the precision; a plain nn.CrossEntropyLoss (HF *ForMaskedLM,
 * pooled classification heads, images) is upcast only by autocast (cross_entropy is on the
 * CUDA fp32 list), so in pure bf16 its log-probs are bf16.  shift: HF causal LMs shift the
 * labels into a new int64 tensor; the others read the labels as they are.
 * The order matters for the peak: backward runs NllLossBackward (the dense M*V gradient of
 * the log-probs; frees the labels and total_weight), LogSoftmaxBackward (the gradient of
 * the fp32 logits; frees the log-probs), and only then ToCopyBackward0 makes the half
 * gradient of the logits (M*V*2) and frees the fp32 one.  In the forward the half logits
 * stay alive (the model's local) while the log-probs are made.
 * One label per logits row: the labels shrink to one per sample for pooled heads. */
static struct val lower_loss(struct bld *B, struct val logits, const char *name, bool upcast, bool shift)
{
    if (failed(B))
        return logits;
    uint64_t M = rows_of(logits), V = last_dim(logits);
    struct mp_tensor *lt = B->p->labels >= 0 ? T(B, B->p->labels) : NULL;
    if (lt && lt->elems != M) {
        lt->rank = 1;
        lt->shape[0] = lt->elems = M;
        lt->bytes = mul(B, M, mp_dtype_size(lt->dtype));
    }
    char en[96];
    struct val z = logits;
    int half_logits = -1;
    if (dt_of(B, logits) != MP_DT_F32 && (upcast || B->amp)) {
        snprintf(en, sizeof en, "%s.upcast", name);
        z = cast_to(B, logits, MP_DT_F32, en);
        half_logits = logits.t;
    }
    snprintf(en, sizeof en, "%s.log_softmax", name);
    struct val lp = like(B, en, z, dt_of(B, z), ng(B, z));
    struct mp_node *ls = new_node(B, MP_P_LOG_SOFTMAX, en);
    if (!ls)
        return lp;
    ls->in[0] = z.t;
    ls->out = lp.t;
    ls->keep = half_logits;
    save(ls, lp.t);
    ls->rows = M;
    ls->n = V;
    uint64_t mv = mul(B, M, V);
    ls->fwd_flops = 4.0 * (double)mv;
    ls->bwd_flops = 3.0 * (double)mv;

    uint64_t shape[1] = {1};
    struct val y = new_val(B, name, MP_DT_F32, 1, shape, true); /* bf16 in torch for bf16 log-probs: 512 B either way */
    struct mp_node *n = new_node(B, MP_P_NLL_LOSS, name);
    if (!n)
        return y;
    n->in[0] = lp.t;
    n->in[1] = B->p->labels;
    n->out = y.t;
    save(n, lp.t);
    /* nll_loss saves its target and total_weight (the bench/torch_saved.md measurements) */
    if (shift) {
        snprintf(en, sizeof en, "%s.shift_labels", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, M), MP_XR_SHIFT_LABELS);
    }
    snprintf(en, sizeof en, "%s.total_weight", name);
    extra_as(n, new_flat(B, en, dt_of(B, lp), 1), MP_XR_TOTAL_WEIGHT);
    n->rows = M;
    n->n = V;
    n->fwd_flops = (double)M;
    n->bwd_flops = (double)mv; /* zero-filled M*V gradient, one scatter per row */
    B->p->explicit_loss = true;
    return y;
}

static struct val lower_conv(struct bld *B, struct val x, uint64_t cin, uint64_t cout, uint64_t k, uint64_t stride,
                             uint64_t pad, uint64_t groups, bool bias, const char *name)
{
    if (failed(B))
        return x;
    if (x.rank != 4 || x.shape[1] != cin) {
        fail_model(B, MP_ERR_MODEL, "%s: in_ch %llu does not match the incoming channels %llu", name,
                   (unsigned long long)cin, (unsigned long long)(x.rank == 4 ? x.shape[1] : 0));
        return x;
    }
    if (groups == 0 || cin % groups || cout % groups || k == 0 || stride == 0) {
        fail_model(B, MP_ERR_MODEL, "%s: kernel, stride and groups must be positive and groups divide channels",
                   name);
        return x;
    }
    uint64_t hi = x.shape[2], wi = x.shape[3];
    if (hi + 2 * pad < k || wi + 2 * pad < k) {
        fail_model(B, MP_ERR_MODEL, "%s: kernel %llu is larger than the padded input %llux%llu", name,
                   (unsigned long long)k, (unsigned long long)hi, (unsigned long long)wi);
        return x;
    }
    uint64_t ho = (hi + 2 * pad - k) / stride + 1, wo = (wi + 2 * pad - k) / stride + 1;
    char cn[64];
    snprintf(cn, sizeof cn, "%s.cast", name);
    struct val xin = autocast_in(B, x, cn);
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    int w = new_param(B, pn, cout, mul(B, mul(B, cin / groups, k), k), true);
    snprintf(pn, sizeof pn, "%s.bias", name);
    int bp = bias ? new_param(B, pn, 1, cout, false) : -1;
    uint64_t shape[4] = {x.shape[0], cout, ho, wo};
    struct val y = new_val(B, name, B->amp ? B->p->compute_dtype : dt_of(B, xin), 4, shape, true);
    struct mp_node *n = matmul_node(B, MP_P_CONV2D, name, xin, y, w, bp);
    if (!n)
        return y;
    n->c_in = cin;
    n->c_out = cout;
    n->h_in = hi;
    n->w_in = wi;
    n->h_out = ho;
    n->w_out = wo;
    n->kernel = k;
    n->stride = stride;
    n->padding = pad;
    n->groups = groups;
    n->fwd_flops = 2.0 * (double)x.shape[0] * (double)cout * (double)ho * (double)wo * (double)(cin / groups) *
                   (double)k * (double)k;
    n->bwd_flops = ng(B, xin) ? 2.0 * n->fwd_flops : n->fwd_flops;
    return y;
}

static struct val lower_batchnorm(struct bld *B, struct val x, uint64_t c, const char *name)
{
    if (failed(B))
        return x;
    if (x.rank != 4 || x.shape[1] != c) {
        fail_model(B, MP_ERR_MODEL, "%s: channels %llu do not match the incoming channels %llu", name,
                   (unsigned long long)c, (unsigned long long)(x.rank == 4 ? x.shape[1] : 0));
        return x;
    }
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    int g = new_param(B, pn, 1, c, false);
    snprintf(pn, sizeof pn, "%s.bias", name);
    int be = new_param(B, pn, 1, c, false);
    struct val y = like(B, name, x, dt_of(B, x), true);
    struct mp_node *n = new_node(B, MP_P_BATCHNORM, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    n->param[1] = be;
    save(n, x.t);
    snprintf(pn, sizeof pn, "%s.save_mean", name);
    extra_as(n, new_flat(B, pn, MP_DT_F32, c), MP_XR_BN_MEAN);
    snprintf(pn, sizeof pn, "%s.save_invstd", name);
    extra_as(n, new_flat(B, pn, MP_DT_F32, c), MP_XR_BN_INVSTD);
    n->c_in = n->c_out = c;
    n->h_in = n->h_out = x.shape[2];
    n->w_in = n->w_out = x.shape[3];
    n->fwd_flops = 8.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

static struct val lower_pool(struct bld *B, struct val x, enum mp_prim prim, uint64_t k, uint64_t stride,
                             uint64_t pad, uint64_t oh, uint64_t ow, const char *name)
{
    if (failed(B))
        return x;
    if (x.rank != 4) {
        fail_model(B, MP_ERR_MODEL, "%s: pooling needs an image-shaped input (C, H, W)", name);
        return x;
    }
    uint64_t hi = x.shape[2], wi = x.shape[3], ho, wo;
    if (prim == MP_P_ADAPTIVE_AVGPOOL) {
        if (oh == 0 || ow == 0 || oh > hi || ow > wi) {
            fail_model(B, MP_ERR_MODEL, "%s: output size %llux%llu must be within the input %llux%llu", name,
                       (unsigned long long)oh, (unsigned long long)ow, (unsigned long long)hi,
                       (unsigned long long)wi);
            return x;
        }
        ho = oh;
        wo = ow;
    } else {
        if (k == 0 || stride == 0 || hi + 2 * pad < k || wi + 2 * pad < k || pad * 2 > k) {
            fail_model(B, MP_ERR_MODEL, "%s: kernel %llu, stride %llu, padding %llu do not fit the input %llux%llu",
                       name, (unsigned long long)k, (unsigned long long)stride, (unsigned long long)pad,
                       (unsigned long long)hi, (unsigned long long)wi);
            return x;
        }
        ho = (hi + 2 * pad - k) / stride + 1;
        wo = (wi + 2 * pad - k) / stride + 1;
    }
    uint64_t shape[4] = {x.shape[0], x.shape[1], ho, wo};
    struct val y = new_val(B, name, dt_of(B, x), 4, shape, ng(B, x));
    struct mp_node *n = new_node(B, prim, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    save(n, x.t);
    if (prim == MP_P_MAXPOOL) {
        char en[80];
        snprintf(en, sizeof en, "%s.indices", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, T(B, y.t)->elems), MP_XR_POOL_INDICES);
    }
    n->c_in = n->c_out = x.shape[1];
    n->h_in = hi;
    n->w_in = wi;
    n->h_out = ho;
    n->w_out = wo;
    n->kernel = k;
    n->stride = stride;
    n->padding = pad;
    n->fwd_flops = (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

static struct val lower_bottleneck(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t mid = l->mid_ch, out = l->out_ch ? l->out_ch : mid * 4, st = l->stride ? l->stride : 1;
    struct val y = lower_conv(B, x, l->in_ch, mid, 1, 1, 0, 1, false, "conv1");
    y = lower_act(B, lower_batchnorm(B, y, mid, "bn1"), MP_ACT_RELU, true, "relu1");
    y = lower_conv(B, y, mid, mid, 3, st, 1, 1, false, "conv2");
    y = lower_act(B, lower_batchnorm(B, y, mid, "bn2"), MP_ACT_RELU, true, "relu2");
    y = lower_conv(B, y, mid, out, 1, 1, 0, 1, false, "conv3");
    y = lower_batchnorm(B, y, out, "bn3");
    struct val sc = x;
    if (l->downsample) {
        sc = lower_conv(B, x, l->in_ch, out, 1, st, 0, 1, false, "downsample.0");
        sc = lower_batchnorm(B, sc, out, "downsample.1");
    } else if (!failed(B) && (l->in_ch != out || st != 1)) {
        fail_model(B, MP_ERR_MODEL, "in_ch %llu -> out_ch %llu (stride %llu) needs \"downsample\": true",
                   (unsigned long long)l->in_ch, (unsigned long long)out, (unsigned long long)st);
        return x;
    }
    y = lower_add(B, y, sc, "residual");
    return lower_act(B, y, MP_ACT_RELU, true, "relu3");
}

static struct val lower_add_table(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, uint64_t k,
                                  struct mp_node **node);

/* ViT's embeddings: projection (conv, kernel = stride = patch) -> flatten(2).transpose(1, 2), a
 * view (b, patches, dim) -> torch.cat with the expanded class token (a new tensor; the dtype
 * promotes: fp32 under autocast, the token being fp32) -> + position_embeddings (1, seq, dim):
 * a new tensor.  Nothing is saved besides the conv's input (and its weight copy).  From here on
 * the sequence is patches + 1. */
static struct val lower_patch_embedding(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t p = l->kernel;
    if (x.rank != 4 || p == 0 || x.shape[2] % p || x.shape[3] % p) {
        fail_model(B, MP_ERR_MODEL, "patch %llu must divide the image's height and width (input.shape [C, H, W])",
                   (unsigned long long)p);
        return x;
    }
    struct val c = lower_conv(B, x, l->in_ch, l->dim, p, p, 0, 1, true, "projection");
    if (failed(B))
        return c;
    uint64_t np = mul(B, c.shape[2], c.shape[3]), s = add(B, np, l->cls_token ? 1 : 0);
    struct val e = c; /* (b, patches, dim): a view of the conv output */
    e.rank = 3;
    e.shape[1] = np;
    e.shape[2] = l->dim;
    if (l->cls_token) {
        uint64_t shape[3] = {B->b, s, l->dim};
        int cls = new_param(B, "cls_token", 1, l->dim, false);
        e = new_val(B, "cat", promote(dt_of(B, c), B->p->param_dtype), 3, shape, true);
        struct mp_node *n = new_node(B, MP_P_CAST, "cat");
        if (!n)
            return e;
        n->in[0] = c.t;
        n->out = e.t;
        n->param[0] = cls;
        n->rows = mul(B, B->b, s);
        n->n = l->dim;
        n->fwd_flops = (double)T(B, e.t)->elems;
        n->bwd_flops = n->fwd_flops;
    }
    B->s = s;
    struct mp_layer pos = *l;
    pos.vocab = s;
    struct mp_node *n;
    return lower_add_table(B, e, &pos, "position_embeddings", s, &n);
}

static struct val lower_custom(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t shape[2] = {B->b, l->c_output_bytes};
    struct val y = new_val(B, "out", MP_DT_U8, 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_CUSTOM, "custom");
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    save(n, y.t);
    if (l->c_saved_bytes > l->c_output_bytes)
        extra_as(n, new_flat(B, "saved", MP_DT_U8, mul(B, B->b, l->c_saved_bytes - l->c_output_bytes)),
                 MP_XR_CUSTOM_SAVED);
    if (l->c_params)
        n->param[0] = new_param(B, "params", 1, l->c_params, false);
    n->rows = B->b;
    n->n = l->c_output_bytes;
    n->fwd_flops = (double)B->b * (double)l->c_fwd_flops;
    n->bwd_flops = (double)B->b * (double)(l->c_bwd_flops ? l->c_bwd_flops : 2 * l->c_fwd_flops);
    return y;
}

/* out = x + rows of a learned table (ADD_POS): k == seq uses row = position
 * (learned positions), k == 1 row 0 everywhere (BERT's all-zero token types). */
static struct val lower_add_table(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, uint64_t k,
                                  struct mp_node **node)
{
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", nm);
    int w = new_param(B, pn, l->vocab, l->dim, false);
    struct val y = like(B, nm, x, promote(dt_of(B, x), B->p->param_dtype), true);
    struct mp_node *n = new_node(B, MP_P_ADD_POS, nm);
    *node = n;
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    n->rows = rows_of(x);
    n->n = l->dim;
    n->seq = B->s;
    n->k = k;
    n->fwd_flops = (double)T(B, y.t)->elems;
    return y;
}

/* Gemma2's final softcapping: logits / cap (a transient), tanh (saves its output), * cap (a new
 * tensor, what the loss reads). */
static struct val softcap_logits(struct bld *B, struct val z, const char *name)
{
    char an[80];
    snprintf(an, sizeof an, "%s.softcap_tanh", name);
    struct val t = lower_act(B, z, MP_ACT_TANH, false, an);
    if (failed(B))
        return t;
    tmp_one(B, &B->p->nodes[B->p->n_nodes - 1], false, MP_TR_OTHER, T(B, z.t)->bytes); /* the divided logits */
    snprintf(an, sizeof an, "%s.softcap_scale", name);
    return lower_copy(B, t, dt_of(B, t), 1.0, an);
}


/* x[:, 0]: a view of the first position (BERT's pooler); a linear on it saves the view,
 * which keeps x's storage, or under autocast its half copy. */
static struct val first_position(struct bld *B, struct val x, const char *name)
{
    if (failed(B) || x.rank != 3)
        return x;
    struct val y = x;
    y.rank = 2;
    y.shape[1] = x.shape[2];
    char vn[80];
    snprintf(vn, sizeof vn, "%s.first_position", name);
    struct mp_node *n = new_node(B, MP_P_VIEW, vn);
    if (n) {
        n->in[0] = n->out = x.t;
        n->rows = y.shape[0];
        n->n = y.shape[1];
    }
    return y;
}

/* A classifier's logits (b, s, classes) as its loss reads them: MP_POOL_LAST gathers each
 * sample's last position (logits[arange(b), last]: a new (b, classes) tensor; backward keeps
 * the two int64 index vectors); MP_POOL_SPAN copies the start and end logits out of the
 * (b, s, 2) output (split, squeeze, contiguous), each a cross-entropy over positions. */
static struct val pool_logits(struct bld *B, struct val z, const struct mp_layer *l, const char *name)
{
    if (failed(B) || z.rank != 3 || (l->pool != MP_POOL_LAST && l->pool != MP_POOL_SPAN))
        return z;
    bool span = l->pool == MP_POOL_SPAN;
    uint64_t shape[2] = {span ? mul(B, 2, z.shape[0]) : z.shape[0], span ? z.shape[1] : z.shape[2]};
    char cn[80];
    snprintf(cn, sizeof cn, "%s.%s", name, span ? "start_end" : "pooled");
    struct val y = new_val(B, cn, dt_of(B, z), 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_CAST, cn);
    if (!n)
        return y;
    n->in[0] = z.t;
    n->out = y.t;
    n->rows = shape[0];
    n->n = shape[1];
    if (!span) {
        char en[96];
        snprintf(en, sizeof en, "%s.index", cn);
        extra_as(n, new_flat(B, en, MP_DT_I64, mul(B, 2, z.shape[0])), MP_XR_GATHER_INDEX);
    }
    return y;
}

/* One layer of a block. */
static struct val lower_layer(struct bld *B, struct val x, const struct mp_layer *l, struct val *resid)
{
    const char *nm = l->name[0] ? l->name : mp_layer_type_str(l->type);
    B->layer = l;
    switch (l->type) {
    case MP_LT_EMBEDDING: {
        if (failed(B))
            return x;
        if (l->dec_input) {
            struct val y = lower_t5_decoder_embed(B, x, l, nm);
            *resid = y;
            return y;
        }
        if (x.t >= 0 && T(B, x.t)->dtype != MP_DT_I64 && B->embed_param >= 0 && last_dim(x) == l->dim) {
            /* A second embedding applied to hidden states: BERT's token-type table looked up
             * with all-zero type ids and added (row 0 broadcast). */
            struct mp_node *n;
            struct val y = lower_add_table(B, x, l, nm, 1, &n);
            if (n)
                tmp_one(B, n, false, MP_TR_OTHER, T(B, y.t)->bytes); /* the looked-up (b,s,h) rows */
            if (l->id_buffer && n) { /* BertEmbeddings' all-zero token_type_ids buffer, its view saved */
                char en[112];
                snprintf(en, sizeof en, "%s.ids", nm);
                save(n, id_buffer(B, en, l->id_rows));
            }
            *resid = y;
            return y;
        }
        if (T(B, x.t)->dtype != MP_DT_I64) {
            fail_model(B, MP_ERR_MODEL, "an embedding needs token ids as its input (input.tokens)");
            return x;
        }
        char pn[80];
        snprintf(pn, sizeof pn, "%s.weight", nm);
        int w = new_param(B, pn, l->vocab, l->dim, false);
        if (B->embed_param < 0)
            B->embed_param = w;
        uint64_t shape[3] = {B->b, B->s, l->dim};
        struct val y = new_val(B, nm, B->p->param_dtype, 3, shape, true);
        struct mp_node *n = new_node(B, MP_P_EMBED, nm);
        if (!n)
            return y;
        n->in[0] = x.t;
        n->out = y.t;
        n->param[0] = w;
        save(n, x.t);
        n->rows = mul(B, B->b, B->s);
        n->n = l->dim;
        n->k = l->vocab;
        n->fwd_flops = (double)T(B, y.t)->elems;
        n->bwd_flops = n->fwd_flops;
        if (l->scale_buffer) /* Gemma: embed_scale, a registered fp32 scalar */
            id_buffer(B, "embed_scale", 0);
        struct val r = lower_dropout(B, mult_copy(B, y, l, "embed_scale"), l->emb_dropout, "dropout");
        *resid = r;
        return r;
    }
    case MP_LT_POS_EMBEDDING: {
        if (failed(B))
            return x;
        if (B->s > l->vocab) {
            fail_model(B, MP_ERR_MODEL, "sequence %llu exceeds the %llu learned positions",
                       (unsigned long long)B->s, (unsigned long long)l->vocab);
            return x;
        }
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        struct mp_node *n;
        struct val y = lower_add_table(B, x, l, nm, B->s, &n);
        if (!n)
            return y;
        char en[112];
        snprintf(en, sizeof en, "%s.position_ids", nm); /* int64, saved by the position lookup */
        int ids = l->id_buffer ? id_buffer(B, en, l->id_rows) : -1;
        if (l->id_view) /* BertEmbeddings: the lookup saves a view of the registered buffer */
            save(n, ids);
        else
            extra_as(n, new_flat(B, en, MP_DT_I64, B->s), MP_XR_POSITION_IDS);
        *resid = y;
        return y;
    }
    case MP_LT_LINEAR:
        return lower_linear(B, l->pool == MP_POOL_FIRST ? first_position(B, x, nm) : x, l->in_features,
                            l->out_features, l->bias, nm);
    case MP_LT_LAYERNORM:
        return lower_norm(B, x, l, MP_NORM_LAYERNORM, l->dim, nm);
    case MP_LT_RMSNORM:
        return l->t5 ? lower_t5_norm(B, x, l->dim, nm) : lower_rmsnorm(B, x, l->dim, l->rms_fp32, nm);
    case MP_LT_ATTENTION:
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        return lower_attention(B, x, l, l->dim, nm);
    case MP_LT_MLP:
        if (!width_ok(B, x, l->dim, "dim", ""))
            return x;
        return lower_mlp(B, x, l, l->dim, nm);
    case MP_LT_ACTIVATION:
        return lower_act(B, x, l->act, l->inplace, nm);
    case MP_LT_DROPOUT:
        return lower_dropout(B, x, l->p, nm);
    case MP_LT_RESIDUAL: {
        struct val y = lower_add(B, *resid, x, nm);
        *resid = y;
        return y;
    }
    case MP_LT_CONV2D:
        return lower_conv(B, x, l->in_ch, l->out_ch, l->kernel, l->stride ? l->stride : 1, l->padding,
                          l->groups ? l->groups : 1, l->bias, nm);
    case MP_LT_BATCHNORM2D:
        return lower_batchnorm(B, x, l->in_ch ? l->in_ch : l->dim, nm);
    case MP_LT_MAXPOOL2D:
        return lower_pool(B, x, MP_P_MAXPOOL, l->kernel, l->stride ? l->stride : l->kernel, l->padding, 0, 0, nm);
    case MP_LT_AVGPOOL2D:
        return lower_pool(B, x, MP_P_AVGPOOL, l->kernel, l->stride ? l->stride : l->kernel, l->padding, 0, 0, nm);
    case MP_LT_ADAPTIVE_AVGPOOL2D:
        return lower_pool(B, x, MP_P_ADAPTIVE_AVGPOOL, 0, 0, 0, l->out_h ? l->out_h : 1, l->out_w ? l->out_w : 1,
                          nm);
    case MP_LT_FLATTEN: {
        if (failed(B))
            return x;
        struct val y = x;
        y.rank = 2;
        y.shape[0] = x.shape[0];
        y.shape[1] = T(B, x.t)->elems / (x.shape[0] ? x.shape[0] : 1);
        struct mp_node *n = new_node(B, MP_P_VIEW, nm);
        if (n) {
            n->in[0] = x.t;
            n->out = x.t;
            n->rows = y.shape[0];
            n->n = y.shape[1];
        }
        return y;
    }
    case MP_LT_LM_HEAD: {
        if (l->tied && B->embed_param < 0) {
            fail_model(B, MP_ERR_MODEL, "a tied lm_head needs an embedding earlier in the model");
            return x;
        }
        if (l->tied && !failed(B) &&
            (B->p->params[B->embed_param].rows != l->vocab || B->p->params[B->embed_param].cols != l->dim)) {
            fail_model(B, MP_ERR_MODEL, "tied: vocab x dim %llux%llu does not match the embedding %llux%llu",
                       (unsigned long long)l->vocab, (unsigned long long)l->dim,
                       (unsigned long long)B->p->params[B->embed_param].rows,
                       (unsigned long long)B->p->params[B->embed_param].cols);
            return x;
        }
        if (l->t5) /* T5: decoder_outputs[0] and the scaled sequence_output are locals of the forward */
            held_tensor(B, x.t, -1);
        if (l->in_mult != 0) { /* T5: sequence_output * d_model**-0.5, a new tensor (saves nothing) */
            x = lower_copy(B, x, dt_of(B, x), l->in_mult, "scale_decoder_outputs");
            if (l->t5)
                held_tensor(B, x.t, -1);
        }
        struct val logits = lower_linear_p(B, x, l->dim, l->vocab, l->bias, nm, l->tied ? B->embed_param : -1);
        if (!failed(B) && l->tied) {
            B->p->params[B->embed_param].matmul = true;
            /* Two gradients reach the tied table's AccumulateGrad: the engine keeps the head's
             * until the embedding's backward has made its dense V x h gradient, then adds them
             * out of place: two more table-sized tensors in that backward (measured,
             * bench/torch_step_results.md). */
            for (size_t k = 0; k < B->p->n_nodes; k++)
                if (B->p->nodes[k].prim == MP_P_EMBED && B->p->nodes[k].param[0] == B->embed_param)
                    tmp_one(B, &B->p->nodes[k], true, MP_TR_OTHER,
                            mul(B, mp_param_grad_bytes(&B->p->params[B->embed_param]), 2));
        }
        logits = mult_copy(B, logits, l, "logits_scaling");
        if (l->logit_softcap > 0)
            logits = softcap_logits(B, logits, nm);
        /* masked LMs call nn.CrossEntropyLoss on the logits (BertForMaskedLM & co.) */
        return lower_loss(B, logits, "loss", !l->masked, B->m->input == MP_INPUT_TOKENS && !l->masked);
    }
    case MP_LT_CLASSIFIER: {
        /* HF's token classification upcasts (logits.float()); pooled heads and images do not.
         * MP_POOL_FIRST on a sequence: the first position (ViT's class token) */
        if (l->pool == MP_POOL_FIRST)
            x = first_position(B, x, nm);
        if (l->t5) /* T5: the stack's output is a local of the forward (outputs[0]) */
            held_tensor(B, x.t, -1);
        struct val logits = lower_linear(B, x, l->in_features, l->vocab, l->bias, nm);
        bool upcast = B->m->input == MP_INPUT_TOKENS && l->pool == MP_POOL_NONE && !l->masked; /* masked: a plain
                                                                 nn.CrossEntropyLoss (T5ForTokenClassification) */
        return lower_loss(B, pool_logits(B, logits, l, nm), "loss", upcast, false);
    }
    case MP_LT_CUSTOM:
        return lower_custom(B, x, l);
    case MP_LT_TRANSFORMER_BLOCK: {
        char saved[96];
        with_prefix(B, B->prefix, "", saved);
        struct val y = l->t5 ? lower_t5_block(B, x, l) : lower_transformer(B, x, l);
        restore_prefix(B, saved);
        *resid = y;
        return y;
    }
    case MP_LT_BOTTLENECK:
        return lower_bottleneck(B, x, l);
    case MP_LT_PATCH_EMBEDDING: {
        struct val y = lower_patch_embedding(B, x, l);
        *resid = y;
        return y;
    }
    case MP_LT_COUNT:
        break;
    }
    MP_BUG("unknown layer type %d", (int)l->type);
}

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
 * validate_outputs).  Checked op by op with bench/torch_step.py's LiveTracker: the forward peaks
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

static void eager_ops(struct bld *B, int k)
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

/* ---- the program ------------------------------------------------------------------ */

/* ---- frozen parameters: what autograd records ------------------------------------------------ */

const struct mp_quant *mp_program_base_quant(const struct mp_program *p)
{
    if (p->model->quant.kind != MP_Q_NONE)
        return &p->model->quant;
    return p->opts.ft.mode == MP_FT_QLORA ? &p->opts.ft.quant : NULL;
}

uint64_t mp_param_grad_bytes(const struct mp_param *q)
{
    return q->trainable ? q->elems * mp_dtype_size(q->dtype) : 0;
}

static void unsave(struct mp_node *n, int t)
{
    for (int i = 0; i < n->n_saved; i++)
        if (n->saved[i] == t) {
            n->saved[i] = n->saved[--n->n_saved];
            return;
        }
}

static bool param_trains(const struct mp_program *p, int q) { return q >= 0 && p->params[q].trainable; }

/* With frozen parameters, autograd records an op only if an input requires grad or it
 * has a trainable parameter, and a recorded op saves only what the gradients it must
 * compute need (torch derivatives.yaml, checked with saved_tensors_hooks in
 * bench/peft_step.py):
 *  - linear (mm/addmm): x is saved for the weight gradient, W (its autocast copy) for
 *    the input gradient;
 *  - mul: each factor is saved for the other's gradient;
 *  - HF RMSNorm: weight * normed saves normed only for the weight's gradient; x and
 *    rsqrt only when x needs a gradient;
 *  - layer_norm, attention, softmax, activations, dropout: saved whenever recorded.
 * enable_input_require_grads (ft.input_grad) makes the embedding output a leaf that
 * requires grad; its AccumulateGrad node holds it until the backward ends. */
static void apply_requires_grad(struct mp_program *p)
{
    for (size_t i = 0; i < p->n_tensors; i++)
        p->tensors[i].needs_grad = false;
    for (size_t k = 0; k < p->n_nodes; k++) {
        struct mp_node *n = &p->nodes[k];
        bool ing[3] = {false, false, false}, any_in = false;
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0 && p->tensors[n->in[j]].needs_grad)
                ing[j] = any_in = true;
        bool wt = param_trains(p, n->param[0]), pt = wt || param_trains(p, n->param[1]);
        bool leaf = n->prim == MP_P_EMBED && p->opts.ft.input_grad && !pt;
        bool rec = any_in || pt;
        if (n->out >= 0)
            p->tensors[n->out].needs_grad = p->tensors[n->out].needs_grad || rec || leaf;
        if (leaf) {
            n->n_saved = 0;
            n->grad_in = false;
            n->bwd_flops = 0;
            n->bwd_tmp_bytes = 0;
            n->n_bwd_tmp = 0;
            save(n, n->out);
            continue;
        }
        if (!rec) {
            n->no_grad = true;
            n->wcopy = -1; /* a frozen weight: autocast does not cache its copy */
            n->n_saved = 0;
            n->grad_in = false;
            n->bwd_flops = 0;
            n->bwd_tmp_bytes = 0;
            n->n_bwd_tmp = 0;
            continue;
        }
        switch (n->prim) {
        case MP_P_LINEAR: {
            double f = 2.0 * (double)n->rows * (double)n->k * (double)n->n;
            double dq = n->quantized ? 2.0 * (double)n->k * (double)n->n : 0;
            if (!wt) {
                unsave(n, n->in[0]);
                n->wcopy = -1; /* autocast caches copies of leaves that require grad only */
            }
            if (!ing[0])
                for (int j = 0; j < n->n_extra; j++)
                    unsave(n, n->extra[j]); /* the autocast weight copy */
            n->bwd_flops = (wt ? f : 0) + (ing[0] ? f + dq : 0);
            if ((!wt && !n->quantized) || (n->quantized && !ing[0])) {
                n->bwd_tmp_bytes = 0; /* no half weight gradient to copy into .grad / no dequantized W */
                n->n_bwd_tmp = 0;
            }
            break;
        }
        case MP_P_GROUPED_MM:
            if (!wt)
                unsave(n, n->in[0]); /* x is kept for the experts' weight gradient only */
            break;
        case MP_P_MUL:
            if (!ing[1])
                unsave(n, n->in[0]);
            if (!ing[0])
                unsave(n, n->in[1]);
            break;
        case MP_P_RMSNORM:
            if (!wt && n->n_extra > 0)
                unsave(n, n->extra[n->n_extra - 1]); /* normed */
            if (!ing[0]) {
                unsave(n, n->in[0]);
                for (int j = 0; j + 1 < n->n_extra; j++)
                    unsave(n, n->extra[j]); /* x in fp32, rsqrt */
            }
            break;
        default: break;
        }
    }
}

/* Gradient parts follow their whole tensor (apply_requires_grad sets needs_grad on node outputs). */
static void parts_need_grad(struct mp_program *p)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        for (int j = 0; j < 2; j++)
            if (p->nodes[k].out_parts[j] >= 0 && p->nodes[k].out >= 0)
                p->tensors[p->nodes[k].out_parts[j]].needs_grad = p->tensors[p->nodes[k].out].needs_grad;
}

/* LoRA on an MoE model where peft 0.21 would adapt what memplan does not lower as Linears: all-linear
 * (finetune.c's per-family list: routers and fused experts), or, for the families measured so
 * (DeepSeek-V3; not Qwen2-MoE, whose MLP names stay plain Linears), the MLP names that peft's MoE
 * mapping sends to the experts' 3-D parameters.  NULL: modelled (named attention targets equal
 * peft's count, bench/peft_step.py). */
const char *mp_moe_lora_unmodelled(const struct mp_model *m, const struct mp_finetune *f)
{
    if (mp_finetune_all_linear_unmodelled(f, m->hf_type))
        return "peft's all-linear also adapts the MoE routers and the experts' 3-D parameters";
    bool moe = false;
    for (size_t i = 0; i < m->n_blocks && !moe; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++)
            moe |= m->blocks[i].layers[j].experts > 0;
    if (!moe || !strcmp(m->hf_type, "qwen2_moe"))
        return NULL;
    static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj", "gate_up_proj", "gate", "experts"};
    for (size_t t = 0; t < f->n_targets; t++)
        for (size_t k = 0; k < sizeof mlp / sizeof mlp[0]; k++)
            if (!strcmp(f->targets[t], mlp[k]))
                return "peft maps the MLP names (gate_proj, up_proj, down_proj) to the experts' 3-D parameters";
    return NULL;
}

bool mp_program_resident(const struct mp_program *p, int t)
{
    if (t < 0)
        return false;
    if (t == p->input || t == p->labels)
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
    s->p.total_params = s->p.adapter_params = 0;
    s->p.copied_blocks = 0;
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
static enum mp_status lower_program(const struct mp_model *m, const struct mp_build_opts *o, bool check_only,
                                    struct mp_program *p, struct mp_diag *d)
{
    p->opts = *o;
    p->model = m;
    p->labels = -1;
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
    if (mp_finetune_all_linear_unmodelled(&o->ft, m->hf_type))
        return mp_fail(d, MP_ERR_USAGE, "%s: --lora-targets all-linear on %s: peft 0.21 also adapts the MoE routers "
                       "and fused experts, which memplan does not model; name the targets (e.g. q_proj,v_proj)",
                       m->path, m->hf_type);
    bool half_params = o->precision == MP_PREC_BF16;
    p->param_dtype = half_params ? MP_DT_BF16 : MP_DT_F32;
    p->compute_dtype = o->precision == MP_PREC_FP32 ? MP_DT_F32
                       : o->precision == MP_PREC_AMP_FP16 ? MP_DT_F16
                                                          : MP_DT_BF16;
    struct bld B = {.p = p, .m = m, .d = d, .st = MP_OK, .block = -1, .embed_param = -1, .rope_cos_sin = -1, .rope_pair = -1, .attn_mask = -1, .pos_tables = -1, .enc_out = -1, .pos_bias = -1, .cross_bias = -1, .dec_mask = -1, .b = p->opts.batch,
                    .s = m->input == MP_INPUT_TOKENS ? p->opts.seq : 1,
                    .amp = o->precision == MP_PREC_AMP_BF16 || o->precision == MP_PREC_AMP_FP16};
    p->blocks = calloc(m->n_blocks ? m->n_blocks : 1, sizeof *p->blocks);
    p->copied = calloc(m->n_blocks ? m->n_blocks : 1, sizeof *p->copied);
    if (!p->blocks || !p->copied) {
        mp_program_release(p);
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    }
    p->n_blocks = m->n_blocks;

    struct val x;
    if (m->input == MP_INPUT_TOKENS) {
        uint64_t shape[2] = {B.b, B.s};
        x = new_val(&B, "input_ids", MP_DT_I64, 2, shape, false);
        p->labels = new_val(&B, "labels", MP_DT_I64, 2, shape, false).t;
    } else if (m->input == MP_INPUT_IMAGE) {
        uint64_t shape[4] = {B.b, m->channels, m->height, m->width};
        x = new_val(&B, "images", p->param_dtype, 4, shape, false);
        uint64_t ls[1] = {B.b};
        p->labels = new_val(&B, "labels", MP_DT_I64, 1, ls, false).t;
    } else {
        uint64_t shape[2] = {B.b, m->bytes_per_sample};
        x = new_val(&B, "input", MP_DT_U8, 2, shape, false);
    }
    p->input = x.t;
    long n_rep = 0, rep_seen = 0, last_rep = -1;
    for (size_t i = 0; i < m->n_blocks; i++)
        if (m->blocks[i].repeat_group > 0) {
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
        long rep = n_rep == 0 ? (long)i : blk->repeat_group > 0 ? rep_seen++ : -1;
        /* the block this one repeats: per blocks before (its period; else the one before) */
        size_t per = blk->period && blk->period <= MP_PERIOD_MAX ? blk->period : 1;
        bool again = i >= per && same_block(blk, &m->blocks[i - per]);
        if (check_only && again && per == last_per && fixed >= 2 * per && same_val(p, x, fixed_x))
            continue;
        struct val in = x;
        B.trained = mp_finetune_block_trained(&o->ft, rep, n_rep > 0 && (long)i > last_rep);
        snprintf(B.prefix, sizeof B.prefix, "%s", blk->name);
        bp->input = x.t;
        bp->node0 = p->n_nodes;
        bp->param0 = p->n_params;
        struct span cur = {.i = i, .t0 = p->n_tensors, .n0 = p->n_nodes, .q0 = p->n_params, .in = x};
        uint64_t total0 = p->total_params, adapter0 = p->adapter_params;
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
    if (failed(&B)) {
        enum mp_status st = B.st;
        mp_program_release(p);
        return st;
    }
    if (o->ft.mode != MP_FT_FULL) {
        apply_requires_grad(p);
        parts_need_grad(p);
    }
    for (size_t k = 0; k < p->n_nodes && !failed(&B); k++)
        if (p->nodes[k].prim == MP_P_ATTN && p->nodes[k].eager)
            eager_ops(&B, (int)k);
    if (failed(&B)) {
        enum mp_status st = B.st;
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
            bp->fwd_flops += p->nodes[k].fwd_flops;
            bp->bwd_flops += p->nodes[k].bwd_flops;
        }
        p->fwd_flops += bp->fwd_flops;
        p->bwd_flops += bp->bwd_flops;
    }
    for (size_t q = 0; q < p->n_params; q++)
        if (p->params[q].trainable)
            p->trainable_params += p->params[q].elems;
    if (p->trainable_params == 0 && o->ft.mode != MP_FT_FULL) {
        enum mp_status st = mp_fail(d, MP_ERR_USAGE, "%s: --finetune %s trains no parameter%s", m->path,
                                    mp_ft_mode_str(o->ft.mode),
                                    o->ft.mode == MP_FT_FREEZE ? " (--train-blocks selects none)" : "");
        mp_program_release(p);
        return st;
    }
    return MP_OK;
}

enum mp_status mp_program_check(const struct mp_model *m, struct mp_diag *d)
{
    struct mp_program prog;
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = 1;
    o.seq = m->input == MP_INPUT_TOKENS ? m->seq_len : 1;
    memset(&prog, 0, sizeof prog);
    enum mp_status st = lower_program(m, &o, true, &prog, d);
    mp_program_release(&prog);
    return st;
}
