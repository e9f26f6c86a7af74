/* model.c — the validated model: names of enums, lifecycle, cross-field
 * validation, parameter counts, and the file loader that dispatches to the
 * memplan-JSON or HF reader.  cJSON is used only to parse and dispatch.
 */
#include "model.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "layers.h"
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
} act_rows[MP_ACT_COUNT] = {
#define MP_X(id, name, aliases, saves, extras, amp32) {name, aliases, extras, amp32, SAVES_##saves == SAVES_OUT},
    MP_ACTIVATIONS(MP_X)
#undef MP_X
};

const char *mp_act_str(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT ? act_rows[a].name : "?"; }
bool mp_act_saves_output(enum mp_act a) { return (unsigned)a < MP_ACT_COUNT && act_rows[a].saves_out; }
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

/* True when word is one of the space-separated words of list (model_read.h). */
bool mp_in_list(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; *p;) {
        while (*p == ' ')
            p++;
        const char *e = p;
        while (*e && *e != ' ')
            e++;
        if ((size_t)(e - p) == n && n > 0 && strncmp(p, word, n) == 0)
            return true;
        p = e;
    }
    return false;
}

int mp_act_parse(const char *s)
{
    for (int i = 0; i < MP_ACT_COUNT; i++)
        if (strcmp(s, act_rows[i].name) == 0 || mp_in_list(act_rows[i].aliases, s))
            return i;
    return -1;
}

const char *mp_attn_impl_str(enum mp_attn_impl a)
{
    switch (a) {
    case MP_ATTN_SDPA: return "sdpa";
    case MP_ATTN_FLASH: return "flash";
    case MP_ATTN_EAGER: return "eager";
    }
    return "?";
}

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
    if (l->heads == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.heads: expected a positive integer", m->path, where);
    if (l->kv_heads == 0 || l->kv_heads > l->heads || l->heads % l->kv_heads != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.kv_heads: %llu must divide heads (%llu)", m->path, where,
                       (unsigned long long)l->kv_heads, (unsigned long long)l->heads);
    if (l->head_dim == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s.head_dim: expected a positive integer", m->path, where);
    if (l->rotary_dim > l->head_dim || l->rotary_dim % 2)
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
            if (l->type == MP_LT_TRANSFORMER_BLOCK && l->ffn == 0)
                return mp_fail(d, MP_ERR_MODEL, "%s: %s.ffn: expected a positive integer", m->path, where);
        }
    }
    /* The shapes must chain; layers.c checks that while building, at batch 1. */
    struct mp_program prog;
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = 1;
    o.seq = m->input == MP_INPUT_TOKENS ? m->seq_len : 1;
    enum mp_status st = mp_program_build(m, &o, &prog, d);
    mp_program_release(&prog);
    return st;
}

bool mp_model_has_attention(const struct mp_model *m)
{
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++)
            if (m->blocks[i].layers[j].type == MP_LT_ATTENTION || m->blocks[i].layers[j].type == MP_LT_TRANSFORMER_BLOCK)
                return true;
    return false;
}

/* ---- loading ---------------------------------------------------------------------- */

#define MP_FILE_MAX (64u << 20)

/* 1-based line and column of byte off in text. */
static void line_col(const char *text, size_t off, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static int cmp_item_names(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* Duplicate keys are an error (cJSON keeps both and lookups see the first; Python's json,
 * and so transformers, keep the last): "path: place: duplicate key", place like
 * layers[3].heads.  Each object's names are sorted, so a huge object stays O(n log n). */
static enum mp_status check_duplicates(const cJSON *node, char *place, size_t cap, const char *path,
                                       struct mp_diag *d)
{
    size_t n = 0, len = strlen(place);
    for (const cJSON *c = node->child; c; c = c->next)
        n++;
    if (cJSON_IsObject(node) && n > 1) {
        const cJSON **v = malloc(n * sizeof *v);
        if (!v)
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
        size_t i = 0;
        for (const cJSON *c = node->child; c; c = c->next)
            v[i++] = c;
        qsort(v, n, sizeof *v, cmp_item_names);
        for (i = 1; i < n && strcmp(v[i - 1]->string, v[i]->string) != 0; i++)
            ;
        if (i < n) {
            enum mp_status st = mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: duplicate key", path, place, *place ? "." : "",
                                        v[i]->string);
            free(v);
            return st;
        }
        free(v);
    }
    size_t idx = 0;
    for (const cJSON *c = node->child; c; c = c->next, idx++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c))
            continue;
        if (cJSON_IsObject(node))
            snprintf(place + len, cap - len, "%s%s", len ? "." : "", c->string);
        else
            snprintf(place + len, cap - len, "[%zu]", idx);
        enum mp_status st = check_duplicates(c, place, cap, path, d);
        place[len] = '\0';
        if (st != MP_OK)
            return st;
    }
    return MP_OK;
}

enum mp_status mp_model_load_string(struct mp_model *m, const char *text, size_t len, const char *path,
                                    struct mp_diag *d)
{
    mp_model_init(m);
    snprintf(m->path, sizeof m->path, "%s", path);
    if (len == 0)
        return mp_fail(d, MP_ERR_JSON, "%s: the file is empty", path);
    long lz = mp_json_leading_zero(text, len);
    if (lz >= 0) {
        size_t line, col;
        line_col(text, (size_t)lz, &line, &col);
        return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: malformed JSON: a number with a leading zero", path, line, col);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root && end) { /* only whitespace may follow the value */
        while (end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
            end++;
        if (end < text + len) {
            cJSON_Delete(root);
            size_t line, col;
            line_col(text, (size_t)(end - text), &line, &col);
            return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: unexpected text after the JSON value", path, line, col);
        }
    }
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        size_t off = (e && e >= text && e <= text + len) ? (size_t)(e - text) : len;
        size_t line, col;
        line_col(text, off, &line, &col);
        return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: malformed JSON", path, line, col);
    }
    enum mp_status st;
    char place[256] = "";
    if (!cJSON_IsObject(root))
        st = mp_fail(d, MP_ERR_MODEL, "%s: expected a JSON object at the top level", path);
    else if ((st = check_duplicates(root, place, sizeof place, path, d)) == MP_OK)
        st = mp_json_is_hf(root) ? mp_model_from_hf(m, root, path, d) : mp_model_from_memplan(m, root, path, d);
    cJSON_Delete(root);
    if (st != MP_OK)
        mp_model_release(m);
    return st;
}

enum mp_status mp_model_load_file(struct mp_model *m, const char *path, struct mp_diag *d)
{
    mp_model_init(m);
    char *buf;
    size_t n;
    enum mp_status st = mp_read_file(path, MP_FILE_MAX, "a model file", &buf, &n, d);
    if (st != MP_OK)
        return st;
    st = mp_model_load_string(m, buf, n, path, d);
    free(buf);
    return st;
}

/* ---- shared JSON field readers ------------------------------------------------------ */

enum mp_status mp_json_u64(const cJSON *obj, const char *key, bool required, uint64_t max, uint64_t *out,
                           const char *path, const char *where, struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: missing (expected a positive integer)", path, where,
                           *where ? "." : "", key);
        return MP_OK;
    }
    double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || x < 0 || x != floor(x))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a non-negative integer", path, where,
                       *where ? "." : "", key);
    if (x > (double)max) /* compared as doubles: no conversion of values >= 2^64 */
        return mp_fail(d, MP_ERR_RANGE, "%s: %s%s%s: %.0f is too large (at most %llu)", path, where,
                       *where ? "." : "", key, x, (unsigned long long)max);
    *out = (uint64_t)x;
    return MP_OK;
}

enum mp_status mp_json_bool(const cJSON *obj, const char *key, bool *out, const char *path, const char *where,
                            struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (!cJSON_IsBool(v))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected true or false", path, where, *where ? "." : "", key);
    *out = cJSON_IsTrue(v);
    return MP_OK;
}

enum mp_status mp_json_prob(const cJSON *obj, const char *key, double *out, const char *path, const char *where,
                            struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0.0 && v->valuedouble < 1.0))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a probability in [0, 1)", path, where,
                       *where ? "." : "", key);
    *out = v->valuedouble;
    return MP_OK;
}

const char *mp_json_str(const cJSON *obj, const char *key, enum mp_status *st, const char *path, const char *where,
                        struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *st = MP_OK;
    if (!v || cJSON_IsNull(v))
        return NULL;
    if (!cJSON_IsString(v)) {
        *st = mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a string", path, where, *where ? "." : "", key);
        return NULL;
    }
    return v->valuestring;
}
