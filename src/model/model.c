/* model.c — the validated model: names of enums, lifecycle, cross-field
 * validation.  No JSON here: the readers (model_json.c, model_hf.c) fill the
 * model, model_load.c parses files and dispatches, json_field.c has the field
 * readers they share.
 */
#include "model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_read.h"

static const char *const layer_type_names[] = {
#define MP_X(id, str) str,
    MP_LAYER_TYPES(MP_X)
#undef MP_X
};

const char *mp_layer_type_str(enum mp_layer_type t)
{
    return (unsigned)t < MP_LT_COUNT ? layer_type_names[t] : "?";
}

int mp_layer_type_parse(const char *s)
{
    for (int i = 0; i < MP_LT_COUNT; i++)
        if (strcmp(s, layer_type_names[i]) == 0)
            return i;
    return -1;
}

enum { SAVES_IN, SAVES_OUT };
static const struct {
    const char *name, *aliases, *extras, *amp32;
    bool saves_out;
    int bwd, fwd;
} act_rows[MP_ACT_COUNT] = {
#define MP_X(id, name, aliases, saves, extras, amp32, bwd, fwd)                                                  \
    {name, aliases, extras, amp32, SAVES_##saves == SAVES_OUT, bwd, fwd},
    MP_ACTIVATIONS(MP_X)
#undef MP_X
};

const char *mp_act_str(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT ? act_rows[a].name : "?"; }
bool mp_act_saves_output(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT && act_rows[a].saves_out; }
int mp_act_bwd_tensors(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT ? act_rows[a].bwd : 0; }
int mp_act_fwd_tensors(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT ? act_rows[a].fwd : 0; }
const char *mp_act_intermediates(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT ? act_rows[a].extras : ""; }
int mp_act_n_intermediates(enum mp_act a)
{
    int n = 0;
    for (const char *e = mp_act_intermediates(a); *e; n++) {
        e += strcspn(e, " ");
        e += strspn(e, " ");
    }
    return n;
}

bool mp_act_fp32_under_amp(enum mp_act a, const char *what)
{
    return (unsigned)a < MP_ACT_COUNT && mp_in_list(act_rows[a].amp32, what);
}

const char *mp_act_names(void)
{
    static char buf[256];
    const char *names[MP_ACT_COUNT];
    for (int i = 0; i < MP_ACT_COUNT; i++)
        names[i] = act_rows[i].name;
    return mp_join(buf, sizeof buf, names, MP_ACT_COUNT, ", ", " or ");
}

int mp_act_parse(const char *s)
{
    for (int i = 0; i < MP_ACT_COUNT; i++)
        if (strcmp(s, act_rows[i].name) == 0 || mp_in_list(act_rows[i].aliases, s))
            return i;
    return -1;
}

static const char *const attn_names[] = {
#define MP_X(id, name) name,
    MP_ATTN_IMPLS(MP_X)
#undef MP_X
};
#define N_ATTN (sizeof attn_names / sizeof attn_names[0])

const char *mp_attn_impl_str(enum mp_attn_impl a) { return (unsigned)a < N_ATTN ? attn_names[a] : "?"; }

const char *mp_attn_impl_names(const char *sep, const char *last)
{
    static char buf[64];
    return mp_join(buf, sizeof buf, attn_names, N_ATTN, sep, last);
}

int mp_attn_impl_parse(const char *s) { return mp_name_index(attn_names, N_ATTN, s); }

static const char *const head_names[] = {
#define MP_X(id, name, suffix) name,
    MP_HEADS(MP_X)
#undef MP_X
};
#define N_HEADS (sizeof head_names / sizeof head_names[0])

const char *mp_head_str(enum mp_head h) { return (unsigned)h < N_HEADS ? head_names[h] : "?"; }

const char *mp_head_names(const char *sep, const char *last)
{
    static char buf[96];
    return mp_join(buf, sizeof buf, head_names, N_HEADS, sep, last);
}

int mp_head_parse(const char *s) { return mp_name_index(head_names, N_HEADS, s); }

void mp_model_init(struct mp_model *m)
{
    memset(m, 0, sizeof *m);
    strcpy(m->source, "memplan");
}

void mp_model_release(struct mp_model *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->n_blocks; i++)
        free(m->blocks[i].layers);
    free(m->blocks);
    m->blocks = NULL;
    m->n_blocks = 0;
    m->cap_blocks = 0;
}

bool mp_block_vision(const struct mp_block *b)
{
    if (!b->n_layers)
        return false;
    const struct mp_layer *l = &b->layers[0];
    return (l->vision && (l->type != MP_LT_EMBEDDING || l->emb.image_lookup)) ||
           (b->n_layers > 1 && b->layers[1].vision &&
            (b->layers[1].type == MP_LT_AVGPOOL2D || b->layers[1].type == MP_LT_LINEAR)); /* the projector, the
                                                                                           merger */
}

struct mp_block *mp_model_add_block(struct mp_model *m, const char *name, size_t n_layers)
{
    if (m->n_blocks >= (size_t)1 << 24)
        return NULL;
    if (m->n_blocks == m->cap_blocks) { /* double: a 100,000-block model reads in linear time */
        size_t cap = m->cap_blocks ? 2 * m->cap_blocks : 16;
        struct mp_block *nb = realloc(m->blocks, cap * sizeof *nb);
        if (!nb)
            return NULL;
        m->blocks = nb;
        m->cap_blocks = cap;
    }
    struct mp_block *b = &m->blocks[m->n_blocks];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->layers = calloc(n_layers ? n_layers : 1, sizeof *b->layers);
    if (!b->layers)
        return NULL;
    b->n_layers = n_layers;
    m->n_blocks++;
    return b;
}

/* ---- validation ---------------------------------------------------------------- */

static enum mp_status check_attention(const struct mp_model *m, const struct mp_layer *l, const char *where,
                                      struct mp_diag *d)
{
    if (l->attn.heads == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.heads: expected a positive integer", m->path, where);
    if (l->attn.kv_heads == 0 || l->attn.kv_heads > l->attn.heads || l->attn.heads % l->attn.kv_heads != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.kv_heads: %llu must divide heads (%llu)", m->path, where,
                       (unsigned long long)l->attn.kv_heads, (unsigned long long)l->attn.heads);
    if (l->attn.head_dim == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.head_dim: expected a positive integer", m->path, where);
    if (l->rope.dim > l->attn.head_dim || l->rope.dim % 2)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.rotary_dim: must be even and at most head_dim", m->path, where);
    return MP_OK;
}

enum mp_status mp_model_validate(const struct mp_model *m, struct mp_diag *d)
{
    if (m->n_blocks == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: layers: the model has no layers", m->path);
    if (m->input == MP_INPUT_TOKENS && m->seq_len == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: input.tokens: expected a positive sequence length", m->path);
    for (size_t i = 0; i < m->n_blocks; i++) {
        const struct mp_block *b = &m->blocks[i];
        for (size_t j = 0; j < b->n_layers; j++) {
            const struct mp_layer *l = &b->layers[j];
            char where[160];
            snprintf(where, sizeof where, "%s.%s", b->name, l->name[0] ? l->name : mp_layer_type_str(l->type));
            if (l->type == MP_LT_ATTENTION || l->type == MP_LT_TRANSFORMER_BLOCK) {
                enum mp_status st = check_attention(m, l, where, d);
                if (st != MP_OK)
                    return st;
            }
            if (l->type == MP_LT_TRANSFORMER_BLOCK && l->mlp.ffn == 0)
                return mp_fail(d, MP_ERR_MODEL, "%s: %s.ffn: expected a positive integer", m->path, where);
        }
    }
    return MP_OK; /* that the shapes chain is mp_program_check's (ir/layers.c), called by the loader */
}

bool mp_model_has_attention(const struct mp_model *m)
{
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++)
            if (m->blocks[i].layers[j].type == MP_LT_ATTENTION ||
                m->blocks[i].layers[j].type == MP_LT_TRANSFORMER_BLOCK)
                return true;
    return false;
}

uint64_t mp_model_min_window(const struct mp_model *m)
{
    uint64_t w = 0;
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++) {
            uint64_t lw = m->blocks[i].layers[j].attn.window;
            if (lw && (!w || lw < w))
                w = lw;
        }
    return w;
}

int mp_model_attention_impl(const struct mp_model *m)
{
    int impl = -1;
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++) {
            const struct mp_layer *l = &m->blocks[i].layers[j];
            if (l->type != MP_LT_ATTENTION && l->type != MP_LT_TRANSFORMER_BLOCK)
                continue;
            if (!l->attn.impl_set || (impl >= 0 && impl != (int)l->attn.impl))
                return -1;
            impl = (int)l->attn.impl;
        }
    return impl;
}

/* A hash of a block's layers (FNV-1a over their bytes, a word at a time). */
static uint64_t block_hash(const struct mp_block *b)
{
    uint64_t h = 1469598103934665603ULL ^ b->n_layers;
    const unsigned char *c = (const unsigned char *)b->layers;
    size_t n = b->n_layers * sizeof *b->layers;
    for (size_t k = 0; k + 8 <= n; k += 8) {
        uint64_t w;
        memcpy(&w, c + k, sizeof w);
        h = (h ^ w) * 1099511628211ULL;
    }
    for (size_t k = n - n % 8; k < n; k++)
        h = (h ^ c[k]) * 1099511628211ULL;
    return h;
}

static bool same_layers(const struct mp_block *a, const struct mp_block *b)
{
    return a->n_layers == b->n_layers &&
           (!a->n_layers || memcmp(a->layers, b->layers, a->n_layers * sizeof *a->layers) == 0);
}

/* cls[i]: the first block with block i's layers; false: out of memory. */
static bool block_classes(const struct mp_model *m, size_t *cls)
{
    size_t N = m->n_blocks, cap = 16;
    while (cap < 2 * N)
        cap *= 2;
    size_t *slot = malloc(cap * sizeof *slot); /* a first block + 1, or 0: empty */
    if (!slot)
        return false;
    memset(slot, 0, cap * sizeof *slot);
    for (size_t i = 0; i < N; i++) {
        size_t k = (size_t)block_hash(&m->blocks[i]) & (cap - 1);
        while (slot[k] && !same_layers(&m->blocks[slot[k] - 1], &m->blocks[i]))
            k = (k + 1) & (cap - 1);
        if (!slot[k])
            slot[k] = i + 1;
        cls[i] = slot[k] - 1;
    }
    free(slot);
    return true;
}

void mp_model_mark_copies(struct mp_model *m)
{
    size_t N = m->n_blocks;
    bool ok = true;
    m->pos_table_elems = 0;
    for (size_t i = 0; ok && i < N; i++)
        for (size_t k = 0; ok && k < m->blocks[i].n_layers; k++) {
            const struct mp_layer *l = &m->blocks[i].layers[k];
            uint64_t e;
            if (l->rope.on && l->rope.table_rows)
                ok = mp_mul_u64(l->rope.table_rows, l->rope.dim ? l->rope.dim : l->attn.head_dim, &e) &&
                     mp_add_u64(m->pos_table_elems, e, &m->pos_table_elems);
        }
    if (!ok)
        m->pos_table_elems = 0; /* (the builder grows its tensor layer by layer, and says it overflows) */
    for (size_t i = 0; i < N; i++)
        m->blocks[i].period = 0;
    size_t *cls = malloc((N ? N : 1) * sizeof *cls);
    if (!cls || !block_classes(m, cls)) { /* no marks: only slower (nothing is copied or folded) */
        free(cls);
        return;
    }
    for (size_t i = 0; i < N;) {
        size_t best = 0, best_p = 0;
        for (size_t p = 1; p <= MP_PERIOD_MAX && p <= i; p++) {
            size_t len = 0;
            while (i + len < N && cls[i + len] == cls[i + len - p])
                len++;
            if (len > best)
                best = len, best_p = p;
        }
        for (size_t k = i; k < i + best; k++)
            m->blocks[k].period = (unsigned)best_p;
        i += best ? best : 1;
    }
    free(cls);
}
