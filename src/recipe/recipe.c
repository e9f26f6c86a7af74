/* recipe.c — reading a recipe: libyaml parses the file (JSON too), every key is walked through
 * the key table (recipe_keys.c), the trainer's defaults fill what the file leaves out, and the
 * facts become memplan's settings (recipe.h).  Only facts are read here: nothing is printed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "recipe/recipe_impl.h"
#include "util/sets.h"

#define RECIPE_MAX_BYTES (4u << 20)
#define RECIPE_MAX_DEPTH 32 /* nested mappings: trainers' configs use 3 */

/* ---- names ------------------------------------------------------------------------------------ */

static const struct {
    const char *name, *trainer;
} formats[] = {
#define MP_X(id, name, trainer) {name, trainer},
    MP_RECIPE_FORMATS(MP_X)
#undef MP_X
};

static const struct {
    const char *option;
    bool wired;
} settings[] = {
#define MP_X(id, opt, wired) {opt, wired},
    MP_RECIPE_SETTINGS(MP_X)
#undef MP_X
};

int mp_recipe_format_parse(const char *s)
{
    for (int i = 0; i < MP_RF_N; i++)
        if (!strcmp(s, formats[i].name))
            return i;
    return -1;
}

const char *mp_recipe_format_str(enum mp_recipe_format f) { return formats[f].name; }

const char *mp_recipe_format_names(const char *sep, const char *last)
{
    static char buf[128];
    const char *names[MP_RF_N];
    for (int i = 0; i < MP_RF_N; i++)
        names[i] = formats[i].name;
    return mp_join(buf, sizeof buf, names, MP_RF_N, sep, last);
}

const char *mp_recipe_setting_option(enum mp_recipe_setting_id id) { return settings[id].option; }
bool mp_recipe_setting_wired(enum mp_recipe_setting_id id) { return settings[id].wired; }

/* ---- the facts, as read ------------------------------------------------------------------------ */

struct fact_val {
    bool set;        /* by the file (else the default, if any) */
    char v[256];
    char key[96];
    unsigned line;
};

struct reader {
    struct mp_recipe *r;
    struct mp_diag *d;
    enum mp_status st; /* the first refusal */
    unsigned fmt_bit;
    enum mp_trainer trainer; /* the --trainer it is read for */
    struct fact_val f[F_N];
    yaml_document_t *doc;
};

static void appendf(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void appendf(char *buf, size_t cap, const char *fmt, ...)
{
    size_t l = strlen(buf);
    if (l + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + l, cap - l, fmt, ap);
    va_end(ap);
}

/* The first refusal is the error; later ones are only in --explain. */
static void refuse(struct reader *rd, const char *key, unsigned line, const char *value, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void refuse(struct reader *rd, const char *key, unsigned line, const char *value, const char *fmt, ...)
{
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    char where[48] = "";
    if (line)
        snprintf(where, sizeof where, ":%u", line);
    const char *dflt = line ? "" : " (the trainer's default)";
    if (rd->st == MP_OK)
        rd->st = mp_fail(rd->d, MP_ERR_MODEL, "%s%s: %s%s: %s: %s", rd->r->path, where, key, dflt, value, why);
    appendf(rd->r->explain, sizeof rd->r->explain, "%s%s: refused: %s\n", key, where, why);
}

/* ---- YAML values ------------------------------------------------------------------------------- */

static bool is_null(const yaml_node_t *n)
{
    if (!n || n->type != YAML_SCALAR_NODE)
        return false;
    const char *v = (const char *)n->data.scalar.value;
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") || !strcmp(v, "NULL"));
}

static int truth(const char *v) /* 1 true, 0 false, -1 neither */
{
    static const char *const t[] = {"true", "True", "TRUE", "yes", "Yes", "on", "1"},
                              *const f[] = {"false", "False", "FALSE", "no", "No", "off", "0", ""};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(v, t[i]))
            return 1;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++)
        if (!strcmp(v, f[i]))
            return 0;
    return -1;
}

/* The value as text: a scalar's, a list of scalars joined with ',', "[...]" / "{...}" else. */
static void node_text(yaml_document_t *doc, const yaml_node_t *n, char *out, size_t cap)
{
    out[0] = 0;
    if (is_null(n)) {
        snprintf(out, cap, "null");
    } else if (n->type == YAML_SCALAR_NODE) {
        snprintf(out, cap, "%s", (const char *)n->data.scalar.value);
    } else if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            const yaml_node_t *c = yaml_document_get_node(doc, *it);
            if (!c || c->type != YAML_SCALAR_NODE) {
                snprintf(out, cap, "[...]");
                return;
            }
            appendf(out, cap, "%s%s", it == n->data.sequence.items.start ? "" : ",", (const char *)c->data.scalar.value);
        }
        if (!out[0])
            snprintf(out, cap, "[]");
    } else {
        snprintf(out, cap, n->data.mapping.pairs.start == n->data.mapping.pairs.top ? "{}" : "{...}");
    }
}

/* A value that changes nothing: one of the row's inert words, else null, false, 0, empty. */
static bool inert(const char *text, const char *words)
{
    if (words)
        return mp_in_list(words, text);
    return !strcmp(text, "null") || truth(text) == 0 || !strcmp(text, "[]") || !strcmp(text, "{}") ||
           !strcmp(text, "0.0") || !strcmp(text, "none") || !strcmp(text, "None");
}

/* ---- the key table ------------------------------------------------------------------------------ */

static const struct key_row *row_of(unsigned bit, const char *key)
{
    for (size_t i = 0; i < mp_recipe_n_keys; i++)
        if ((mp_recipe_keys[i].fmts & bit) && !strcmp(mp_recipe_keys[i].key, key))
            return &mp_recipe_keys[i];
    return NULL;
}

/* True when a row names a key nested under key. */
static bool rows_under(unsigned bit, const char *key)
{
    size_t n = strlen(key);
    for (size_t i = 0; i < mp_recipe_n_keys; i++)
        if ((mp_recipe_keys[i].fmts & bit) && !strncmp(mp_recipe_keys[i].key, key, n) && mp_recipe_keys[i].key[n] == '.')
            return true;
    return false;
}

/* key is a no-memory word of the format, or nested under one. */
static bool nomem(enum mp_recipe_format f, const char *key)
{
    const char *list = mp_recipe_nomem[f], *w;
    size_t n;
    while ((w = mp_list_word(&list, &n)) != NULL)
        if (!strncmp(key, w, n) && (key[n] == 0 || key[n] == '.'))
            return true;
    return false;
}

static void set_fact(struct reader *rd, enum fact f, const char *v, const char *key, unsigned line)
{
    struct fact_val *fv = &rd->f[f];
    fv->set = true;
    snprintf(fv->v, sizeof fv->v, "%s", v);
    snprintf(fv->key, sizeof fv->key, "%s", key);
    fv->line = line;
}

static void apply_row(struct reader *rd, const struct key_row *row, const char *key, const yaml_node_t *n)
{
    char text[256];
    node_text(rd->doc, n, text, sizeof text);
    unsigned line = (unsigned)n->start_mark.line + 1;
    char *ex = rd->r->explain;
    switch (row->act) {
    case A_NOMEM:
        rd->r->n_nomem++;
        return;
    case A_REFUSE:
        if (inert(text, row->inert))
            appendf(ex, sizeof rd->r->explain, "%s:%u: %s: read (changes nothing)\n", key, line, text);
        else
            refuse(rd, key, line, text, "%s", row->why);
        return;
    case A_FACT:
        if (row->as) {
            int t = truth(text);
            if (t < 0 && !(row->fact == F_BF16 && !strcmp(text, "auto")))
                refuse(rd, key, line, text, "expected true or false");
            else if (t == 1)
                set_fact(rd, row->fact, row->as, key, line);
        } else {
            set_fact(rd, row->fact, text, key, line);
        }
        appendf(ex, sizeof rd->r->explain, "%s:%u: %s: read\n", key, line, text);
        return;
    }
}

static void unknown(struct reader *rd, const char *key, unsigned line)
{
    struct mp_recipe *r = rd->r;
    appendf(r->unknown, sizeof r->unknown, "%s%s (line %u)", r->n_unknown ? ", " : "", key, line);
    r->n_unknown++;
    appendf(r->explain, sizeof r->explain, "%s:%u: unknown to memplan (accepted, not read)\n", key, line);
}

static void visit(struct reader *rd, const char *key, const yaml_node_t *n)
{
    enum mp_recipe_format f = rd->r->format;
    const struct key_row *row = row_of(rd->fmt_bit, key);
    bool map = n->type == YAML_MAPPING_NODE;
    if (row && !(map && rows_under(rd->fmt_bit, key) && row->act != A_REFUSE)) {
        apply_row(rd, row, key, n);
        return;
    }
    if (map && (rows_under(rd->fmt_bit, key) || !nomem(f, key))) {
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
            const yaml_node_t *k = yaml_document_get_node(rd->doc, p->key), *v = yaml_document_get_node(rd->doc, p->value);
            char sub[256];
            snprintf(sub, sizeof sub, "%s.%s", key, k && k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "?");
            if (v)
                visit(rd, sub, v);
        }
        return;
    }
    if (nomem(f, key)) {
        rd->r->n_nomem++;
        return;
    }
    if (is_null(n) && rows_under(rd->fmt_bit, key))
        return;
    unknown(rd, key, (unsigned)n->start_mark.line + 1);
}

/* ---- format detection ----------------------------------------------------------------------------- */

static const yaml_node_t *top(yaml_document_t *doc, const char *key)
{
    const yaml_node_t *root = yaml_document_get_root_node(doc);
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(doc, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return yaml_document_get_node(doc, p->value);
    }
    return NULL;
}

/* The keys that tell each format (the first found decides, in this order: LLaMA-Factory and TRL
 * share model_name_or_path and TrainingArguments' keys, so LLaMA-Factory's own come first). */
static const struct {
    enum mp_recipe_format f;
    const char *keys;
} tells[] = {
    {MP_RF_TORCHTUNE, "checkpointer tokenizer enable_activation_checkpointing batch_size"},
    {MP_RF_LLAMAFACTORY, "stage finetuning_type cutoff_len template lora_rank"},
    {MP_RF_AXOLOTL, "base_model micro_batch_size sequence_len adapter datasets"},
    {MP_RF_TRL, "model_name_or_path use_peft max_length loss_type dataset_name packing"},
    {MP_RF_HF, "per_device_train_batch_size output_dir optim gradient_accumulation_steps bf16"},
};

static enum mp_status detect(yaml_document_t *doc, struct mp_recipe *r, struct mp_diag *d)
{
    for (size_t i = 0; i < sizeof tells / sizeof tells[0]; i++) {
        const char *list = tells[i].keys, *w;
        size_t n;
        while ((w = mp_list_word(&list, &n)) != NULL) {
            char k[64];
            snprintf(k, sizeof k, "%.*s", (int)n, w);
            const yaml_node_t *v = top(doc, k);
            if (!v)
                continue;
            r->format = tells[i].f;
            snprintf(r->how, sizeof r->how, "detected from key '%s' (line %u)", k, (unsigned)v->start_mark.line + 1);
            return MP_OK;
        }
    }
    return mp_fail(d, MP_ERR_MODEL, "%s: the recipe's format is not told by its keys: give --recipe-format %s",
                   r->path, mp_recipe_format_names("|", NULL));
}

/* ---- from facts to settings ---------------------------------------------------------------------- */

static const struct fact_val *fact(struct reader *rd, enum fact f, struct fact_val *tmp)
{
    if (rd->f[f].set)
        return &rd->f[f];
    const char *dv = mp_recipe_trainers[rd->r->format].dflt[f];
    memset(tmp, 0, sizeof *tmp);
    if (!dv)
        return NULL;
    snprintf(tmp->v, sizeof tmp->v, "%s", dv);
    snprintf(tmp->key, sizeof tmp->key, "%s", dv ? "default" : "");
    return tmp;
}

const char *mp_recipe_fact_key(unsigned fmt_bit, enum fact f)
{
    for (size_t i = 0; i < mp_recipe_n_keys; i++)
        if ((mp_recipe_keys[i].fmts & fmt_bit) && mp_recipe_keys[i].fact == f && mp_recipe_keys[i].act == A_FACT &&
            !mp_recipe_keys[i].as)
            return mp_recipe_keys[i].key;
    return NULL;
}

/* The key that names fact f in a message: the file's, else the format's key for it. */
static const char *fact_key(struct reader *rd, enum fact f)
{
    if (rd->f[f].set)
        return rd->f[f].key;
    const char *k = mp_recipe_fact_key(rd->fmt_bit, f);
    return k ? k : "(default)";
}

static void put(struct reader *rd, enum mp_recipe_setting_id id, const char *value, enum fact from)
{
    struct mp_recipe_setting *s = &rd->r->s[id];
    s->set = true;
    snprintf(s->value, sizeof s->value, "%s", value);
    s->src = rd->f[from].set ? MP_RSRC_KEY : MP_RSRC_DEFAULT;
    snprintf(s->key, sizeof s->key, "%s", fact_key(rd, from));
    s->line = rd->f[from].set ? rd->f[from].line : 0;
}

static int fact_truth(struct reader *rd, enum fact f)
{
    struct fact_val tmp;
    const struct fact_val *v = fact(rd, f, &tmp);
    return v ? truth(v->v) : 0;
}

/* A positive whole number (batch, accumulation, length, rank): into the setting, else refused. */
static void count(struct reader *rd, enum fact f, enum mp_recipe_setting_id id, bool null_ok)
{
    struct fact_val tmp;
    const struct fact_val *v = fact(rd, f, &tmp);
    if (!v || (null_ok && !strcmp(v->v, "null")))
        return;
    uint64_t n = 0;
    if (mp_parse_u64(v->v, &n) != MP_OK || n == 0)
        refuse(rd, fact_key(rd, f), v->line, v->v, "expected a positive integer");
    else
        put(rd, id, v->v, f);
}

enum dt { DT_NONE, DT_F32, DT_BF16, DT_F16, DT_AUTO, DT_BAD };

static enum dt dtype_of(const char *s)
{
    static const struct {
        const char *name;
        enum dt dt;
    } names[] = {{"float32", DT_F32}, {"fp32", DT_F32}, {"torch.float32", DT_F32}, {"float", DT_F32},
                 {"bfloat16", DT_BF16}, {"bf16", DT_BF16}, {"torch.bfloat16", DT_BF16},
                 {"float16", DT_F16}, {"fp16", DT_F16}, {"half", DT_F16}, {"torch.float16", DT_F16},
                 {"auto", DT_AUTO}, {"null", DT_NONE}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (!strcmp(s, names[i].name))
            return names[i].dt;
    return DT_BAD;
}

/* memplan's precision for weights that train in w (the frozen base's dtype for adapters) under
 * autocast a (DT_NONE: none): NULL and why when memplan has none for it. */
static const char *precision_of(enum dt w, enum dt a, char *why, size_t cap)
{
    if (w == DT_F32)
        return a == DT_BF16 ? "amp-bf16" : a == DT_F16 ? "amp-fp16" : "fp32";
    /* bf16 weights under the Trainer's bf16=True: accelerate 1.15 wraps the forward in
     * torch.autocast(bf16) whatever the weights' dtype (accelerator.py:1824-1835, from
     * mixed_precision "bf16": transformers 5.24 training_args.py:1618, trainer.py:744), which
     * changes what is saved (fp32 adapters and ops on CUDA's fp32 list): bf16-amp; without
     * autocast (torchtune, LLaMA-Factory's pure_bf16 alone): pure bf16 */
    if (w == DT_BF16 && a == DT_BF16)
        return "bf16-amp";
    if (w == DT_BF16 && a == DT_NONE)
        return "bf16";
    snprintf(why, cap, "%s", w == DT_BF16 ? "fp16 autocast over bfloat16 weights: not modelled"
                                                      : "float16 weights: not modelled yet (amp-fp16 keeps fp32 weights)");
    return NULL;
}

static void derive_precision(struct reader *rd, bool adapters)
{
    struct fact_val t1, t2;
    enum mp_recipe_format f = rd->r->format;
    const struct fact_val *dt = fact(rd, F_DTYPE, &t1), *b16 = fact(rd, F_BF16, &t2);
    int bf = 0, fp = fact_truth(rd, F_FP16);
    if (b16)
        bf = !strcmp(b16->v, "!fp16") ? !fp : !strcmp(b16->v, "auto") ? !fp : truth(b16->v) == 1;
    enum dt load = dt ? dtype_of(dt->v) : DT_F32, ac = bf ? DT_BF16 : fp ? DT_F16 : DT_NONE, train;
    enum fact decided = rd->f[F_DTYPE].set ? F_DTYPE : rd->f[F_BF16].set ? F_BF16 : rd->f[F_FP16].set ? F_FP16
                        : f == MP_RF_TORCHTUNE || f == MP_RF_HF ? F_DTYPE : F_BF16;
    if (load == DT_BAD) {
        refuse(rd, fact_key(rd, F_DTYPE), dt->line, dt->v, "expected bfloat16, float32 or float16");
        return;
    }
    if (f == MP_RF_AXOLOTL) /* utils/config/__init__.py:198-203: the model is loaded in the autocast dtype */
        load = bf ? DT_BF16 : (fp || fact_truth(rd, F_LOAD8)) ? DT_F16 : DT_F32;
    train = load;
    if (f == MP_RF_LLAMAFACTORY) { /* parser.py:512 loads in the compute dtype; adapter.py:313 upcasts
                                      the trainable parameters to fp32 unless pure_bf16 */
        int pure = fact_truth(rd, F_PURE_BF16);
        load = bf || pure ? DT_BF16 : fp ? DT_F16 : DT_F32;
        ac = bf ? DT_BF16 : fp ? DT_F16 : DT_NONE; /* the Trainer's flags; pure_bf16 is "without AMP"
                                                      (finetuning_args.py) */
        train = pure ? load : DT_F32;
        if (pure && adapters) {
            refuse(rd, "pure_bf16", rd->f[F_PURE_BF16].line, "true", "bf16 adapters: " "not modelled yet");
            return;
        }
        if (rd->f[F_PURE_BF16].set)
            decided = F_PURE_BF16;
    }
    if (f == MP_RF_TORCHTUNE && adapters && load == DT_BF16) {
        refuse(rd, fact_key(rd, F_DTYPE), rd->f[F_DTYPE].line, dt->v,
               "torchtune builds its adapters in this dtype; memplan's are fp32 as peft makes them: not modelled yet");
        return;
    }
    enum dt w = adapters ? load : train;
    char why[160] = "";
    if (w == DT_AUTO) { /* the checkpoint's dtype: settled once the model is known */
        rd->r->dtype_auto = true;
        for (int i = 0; i < 2; i++) {
            const char *p = precision_of(i ? DT_BF16 : DT_F32, ac, rd->r->prec_auto_why[i], sizeof rd->r->prec_auto_why[i]);
            snprintf(rd->r->prec_auto[i], sizeof rd->r->prec_auto[i], "%s", p ? p : "");
        }
        put(rd, MP_RS_PRECISION, "auto", decided);
        return;
    }
    const char *p = precision_of(w, ac, why, sizeof why);
    if (!p) {
        struct fact_val tmp;
        const struct fact_val *v = fact(rd, decided, &tmp);
        refuse(rd, fact_key(rd, decided), rd->f[decided].line, v ? v->v : "", "%s", why);
        return;
    }
    put(rd, MP_RS_PRECISION, p, decided);
}

/* torchtune's optimizer components by their HF TrainingArguments name (recipes/configs use these). */
static const struct {
    const char *component, *hf, *hf_fused;
} tt_optims[] = {
    {"torch.optim.AdamW", "adamw_torch", "adamw_torch_fused"},
    {"torch.optim.Adam", "adamw_torch", "adamw_torch_fused"},
    {"torch.optim.SGD", "sgd", "sgd"},
    {"bitsandbytes.optim.PagedAdamW8bit", "paged_adamw_8bit", "paged_adamw_8bit"},
    {"bitsandbytes.optim.AdamW8bit", "adamw_bnb_8bit", "adamw_bnb_8bit"},
    {"bitsandbytes.optim.PagedAdamW", "paged_adamw_32bit", "paged_adamw_32bit"},
    {"torchao.optim.AdamW8bit", "adamw_torch_8bit", "adamw_torch_8bit"},
    {"torchao.optim.AdamW4bit", "adamw_torch_4bit", "adamw_torch_4bit"},
};

/* memplan's optimizer for an HF optim name: the MP_OPTIMIZERS row whose HF columns name it (a
 * row with AdamW's decoupled weight decay first: HF's adamw_* are AdamW); NULL if none. */
/* The memplan optimizer an HF `optim` name selects: the row of MP_OPTIMIZERS whose aliases (the
 * HF names --optimizer accepts, each in one row) hold it. */
static const char *optimizer_of_hf(const char *hf)
{
    static const struct {
        const char *name, *aliases;
    } rows[] = {
#define MP_X(id, name, state, tmp, wd, hf, aliases, probe, par_probe) {name, aliases},
        MP_OPTIMIZERS(MP_X)
#undef MP_X
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (mp_in_list(rows[i].aliases, hf))
            return rows[i].name;
    return NULL;
}

static void derive_optimizer(struct reader *rd)
{
    struct fact_val tmp;
    const struct fact_val *v = fact(rd, F_OPTIM, &tmp);
    if (!v)
        return;
    const char *hf = v->v;
    if (rd->r->format == MP_RF_TORCHTUNE) {
        hf = NULL;
        for (size_t i = 0; i < sizeof tt_optims / sizeof *tt_optims; i++)
            if (!strcmp(v->v, tt_optims[i].component))
                hf = fact_truth(rd, F_OPT_FUSED) ? tt_optims[i].hf_fused : tt_optims[i].hf;
    }
    const char *name = hf ? optimizer_of_hf(hf) : NULL;
    if (!name)
        refuse(rd, fact_key(rd, F_OPTIM), v->line, v->v, "an optimizer memplan does not model (it models %s)",
               "the HF optim names of --optimizer's table");
    else
        put(rd, MP_RS_OPTIMIZER, name, F_OPTIM);
}

static void derive_checkpoint(struct reader *rd, bool adapters)
{
    struct fact_val t1, t2;
    const struct fact_val *gc = fact(rd, F_GC, &t1);
    if (!gc)
        return;
    int on = truth(gc->v);
    if (on < 0 && rd->r->format == MP_RF_AXOLOTL && !strcmp(gc->v, "offload"))
        on = 1; /* (Axolotl: activation_offloading: true, derive_act_offload) */
    if (on < 0) {
        refuse(rd, fact_key(rd, F_GC), gc->line, gc->v, "%s", !strcmp(gc->v, "offload") || !strcmp(gc->v, "offload_disk") || !strcmp(gc->v, "unsloth")
                                                           ? "offloaded checkpointing: not modelled yet"
                                                           : "expected true or false");
        return;
    }
    const struct fact_val *re = fact(rd, F_REENTRANT, &t2);
    if (on && re && truth(re->v) == 1) {
        refuse(rd, fact_key(rd, F_REENTRANT), re->line, re->v,
               "reentrant checkpointing (it recomputes each layer whole): not modelled yet; set %s: false to "
               "plan torch's non-reentrant checkpoint",
               fact_key(rd, F_REENTRANT));
        return;
    }
    /* offload (transformers 5.24 trainer.py:1509 pops it from the kwargs) */
    struct fact_val t3;
    const struct fact_val *off = on ? fact(rd, F_GC_OFFLOAD, &t3) : NULL;
    int offload = off && strcmp(off->v, "null") ? truth(off->v) : 0;
    if (offload < 0) {
        refuse(rd, fact_key(rd, F_GC_OFFLOAD), off->line, off->v, "expected true or false");
        return;
    }
    /* selective checkpointing: TRL 1.16 reads gradient_checkpointing_kwargs' "selective" in
     * SFTTrainer only (trainer/sft_trainer.py:1085-1096; it raises without gradient checkpointing),
     * and with a PEFT model the Trainer hands the key on to torch's checkpoint, which raises
     * (bench/accuracy/sac_step.py trl-peft); transformers' own Trainer (and LLaMA-Factory's) hands it
     * on too.  Axolotl (loaders/model.py _apply_selective_checkpointing, on the model before peft)
     * saves the "attention" group by default (monkeypatch/selective_checkpointing.py
     * build_sac_policy) */
    struct fact_val t4, t5;
    const struct fact_val *sc = fact(rd, F_GC_SAC, &t4), *sv = fact(rd, F_GC_SAC_SAVE, &t5);
    int sac = sc && strcmp(sc->v, "null") ? truth(sc->v) : 0;
    if (sac < 0) {
        refuse(rd, fact_key(rd, F_GC_SAC), sc->line, sc->v, "expected true or false");
        return;
    }
    if (sv && strcmp(sv->v, "attention")) {
        refuse(rd, fact_key(rd, F_GC_SAC_SAVE), sv->line, sv->v, "ops saved besides attention: " "not modelled yet");
        return;
    }
    sac |= sv != NULL;
    const char *no = NULL;
    bool ax = rd->r->format == MP_RF_AXOLOTL;
    if (sac && !ax && !on)
        no = "TRL raises: selective checkpointing needs gradient checkpointing";
    else if (sac && !ax && (rd->r->format != MP_RF_TRL || (rd->fmt_bit & (B_DPO | B_KTO | B_GRPO | B_ORPO))))
        no = "only TRL's SFTTrainer reads it; this trainer hands it on to torch's checkpoint, which raises";
    else if (sac && !ax && adapters)
        no = "TRL 1.16's SFTTrainer with a PEFT model hands it on to torch's checkpoint, which raises";
    else if (sac && on && offload)
        no = "with offloaded checkpointing: " "not modelled yet";
    if (no) {
        refuse(rd, fact_key(rd, sv && !sc ? F_GC_SAC_SAVE : F_GC_SAC), sc ? sc->line : sv->line, sc ? sc->v : sv->v,
               "%s", no);
        return;
    }
    enum fact from = !sac || !on ? (offload ? F_GC_OFFLOAD : F_N) : sc && rd->f[F_GC_SAC].set ? F_GC_SAC
                                                                                          : F_GC_SAC_SAVE;
    char plus[16];
    snprintf(plus, sizeof plus, "%s", offload ? "+offload" : sac && on ? (ax ? "+sac:axolotl" : "+sac") : "");
    const struct fact_val *every = on ? fact(rd, F_GC_EVERY, &t2) : NULL;
    char spec[64];
    if (every && strcmp(every->v, "1") && strcmp(every->v, "null")) {
        snprintf(spec, sizeof spec, "layers:%.24s%s", every->v, plus); /* (the option's parser checks N) */
        put(rd, MP_RS_CHECKPOINT, spec, from != F_N ? from : F_GC_EVERY);
        return;
    }
    snprintf(spec, sizeof spec, "%s%s", on ? "layers" : "none", plus);
    put(rd, MP_RS_CHECKPOINT, spec, from != F_N ? from : F_GC);
}

/* activation_offloading (--act-offload): TRL's SFTConfig key (sft_trainer.py:1190-1193), or
 * Axolotl 0.19's, which runs TRL's context around each training_step (core/trainers/mixins/
 * activation_checkpointing.py, with a pack-time clone of offset or non-contiguous tensors that moves
 * no byte: bench/accuracy/act_offload.py --axolotl).  Axolotl turns HF's checkpointing off for it
 * (core/builders/base.py _configure_gradient_checkpointing); in full fine-tuning it wraps every
 * decoder layer in torch's non-reentrant checkpoint_wrapper (loaders/model.py
 * _apply_activation_checkpointing, ac_wrap_hf_model): --checkpoint layers, whatever
 * gradient_checkpointing says; with adapters the offloading replaces checkpointing (every
 * layer's saved tensors offloaded), which memplan does not model.  Axolotl's
 * gradient_checkpointing: offload is activation_offloading: true (utils/schemas/validation.py
 * check_gradient_checkpointing_w_offload). */
static void derive_act_offload(struct reader *rd, bool adapters)
{
    struct fact_val t1, t2;
    const struct fact_val *ao = fact(rd, F_ACT_OFFLOAD, &t1);
    bool ax = rd->r->format == MP_RF_AXOLOTL;
    const struct fact_val *gc = ax ? fact(rd, F_GC, &t2) : NULL;
    if (gc && !strcmp(gc->v, "offload"))
        ao = gc; /* (the deprecated spelling: Axolotl's validator sets activation_offloading = True) */
    if (!ao || !strcmp(ao->v, "null"))
        return;
    int on = ao == gc ? 1 : truth(ao->v);
    const char *key = ao == gc ? fact_key(rd, F_GC) : fact_key(rd, F_ACT_OFFLOAD);
    if (on < 0 && ax && (!strcmp(ao->v, "legacy") || !strcmp(ao->v, "disk") || !strcmp(ao->v, "hidden_states")))
        refuse(rd, key, ao->line, ao->v, "%s",
               !strcmp(ao->v, "legacy") ? "TRL's context without its streams (no forward stash, each copy "
                                          "synchronous): not modelled yet"
               : !strcmp(ao->v, "disk") ? "activations offloaded to disk (Axolotl's own hooks): not modelled yet"
                                        : "only the checkpointed layers' hidden states offloaded (Axolotl's "
                                          "monkeypatch/activation_offload_checkpoint.py): not modelled yet");
    else if (on < 0)
        refuse(rd, key, ao->line, ao->v, "expected true or false");
    else if (on == 1 && ax && adapters)
        refuse(rd, key, ao->line, ao->v, "with an adapter Axolotl offloads every layer's saved tensors instead of "
                                         "checkpointing them (loaders/model.py _apply_activation_checkpointing): "
                                         "not modelled yet");
    else if (on == 1) {
        if (ax) /* (its own checkpoint_wrapper on each decoder layer) */
            put(rd, MP_RS_CHECKPOINT, "layers", ao == gc ? F_GC : F_ACT_OFFLOAD);
        put(rd, MP_RS_ACT_OFFLOAD, "true", ao == gc ? F_GC : F_ACT_OFFLOAD);
    }
}

/* The adapters: "full", "lora" or "qlora" (NULL: refused). */
static const char *derive_finetune(struct reader *rd)
{
    struct fact_val tmp;
    const struct fact_val *p = fact(rd, F_PEFT, &tmp);
    const char *v = p ? p->v : "full", *mode = "full";
    int q4 = fact_truth(rd, F_LOAD4);
    switch (rd->r->format) {
    case MP_RF_HF: mode = "full"; break;
    case MP_RF_TRL: mode = truth(v) == 1 ? (q4 ? "qlora" : "lora") : "full"; break;
    case MP_RF_AXOLOTL:
        mode = !strcmp(v, "qlora") ? "qlora" : !strcmp(v, "lora") ? "lora" : !strcmp(v, "none") || !strcmp(v, "null") ? "full" : NULL;
        if (mode && !strcmp(mode, "lora") && q4) {
            refuse(rd, "load_in_4bit", rd->f[F_LOAD4].line, "true", "a 4-bit base with adapter: lora: use adapter: qlora");
            return NULL;
        }
        break;
    case MP_RF_LLAMAFACTORY: {
        struct fact_val t2;
        const struct fact_val *qb = fact(rd, F_QBIT, &t2);
        mode = !strcmp(v, "full") ? "full" : !strcmp(v, "lora") ? "lora" : NULL;
        if (mode && qb && strcmp(qb->v, "null")) {
            if (strcmp(qb->v, "4") || strcmp(mode, "lora")) {
                refuse(rd, "quantization_bit", qb->line, qb->v, "a %s-bit base%s: not modelled yet", qb->v,
                       strcmp(mode, "lora") ? " without adapters" : "");
                return NULL;
            }
            mode = "qlora";
        }
        break;
    }
    case MP_RF_TORCHTUNE:
        mode = strstr(v, ".qlora_") ? "qlora" : strstr(v, ".lora_") ? "lora" : "full";
        break;
    case MP_RF_N: break;
    }
    if (!mode) {
        refuse(rd, fact_key(rd, F_PEFT), p ? p->line : 0, v, "a fine-tuning method memplan does not model yet");
        return NULL;
    }
    if (q4 && !strcmp(mode, "full")) {
        refuse(rd, "load_in_4bit", rd->f[F_LOAD4].line, "true",
               "a 4-bit base cannot be fully fine-tuned: train adapters on it");
        return NULL;
    }
    if (fact_truth(rd, F_LOAD8)) {
        refuse(rd, "load_in_8bit", rd->f[F_LOAD8].line, "true", "an 8-bit base: not modelled yet");
        return NULL;
    }
    put(rd, MP_RS_FINETUNE, mode, F_PEFT);
    return mode;
}

/* torchtune's module names by transformers' (torchtune/models/convert_weights.py's mapping). */
static const struct {
    const char *tt, *hf;
} tt_modules[] = {{"q_proj", "q_proj"}, {"k_proj", "k_proj"}, {"v_proj", "v_proj"}, {"output_proj", "o_proj"}};

static void derive_lora(struct reader *rd, bool qlora)
{
    struct fact_val tmp;
    count(rd, F_LORA_R, MP_RS_LORA_R, false);
    const struct fact_val *al = fact(rd, F_LORA_ALPHA, &tmp);
    if (al && !strcmp(al->v, "2r") && rd->r->s[MP_RS_LORA_R].set) { /* LLaMA-Factory: lora_rank * 2 */
        char a[32];
        snprintf(a, sizeof a, "%llu", 2 * strtoull(rd->r->s[MP_RS_LORA_R].value, NULL, 10));
        put(rd, MP_RS_LORA_ALPHA, a, F_LORA_ALPHA);
    } else if (al && strcmp(al->v, "null")) {
        put(rd, MP_RS_LORA_ALPHA, al->v, F_LORA_ALPHA);
    }
    const struct fact_val *dr = fact(rd, F_LORA_DROPOUT, &tmp);
    if (dr && strcmp(dr->v, "null"))
        put(rd, MP_RS_LORA_DROPOUT, dr->v, F_LORA_DROPOUT);
    const struct fact_val *tg = fact(rd, F_LORA_TARGETS, &tmp);
    if (tg && strcmp(tg->v, "null") && strcmp(tg->v, "[]")) {
        char names[256] = "";
        if (!strcmp(tg->v, "all") || !strcmp(tg->v, "all-linear") || !strcmp(tg->v, "all_linear")) {
            snprintf(names, sizeof names, "all-linear");
        } else if (rd->r->format == MP_RF_TORCHTUNE) {
            for (const char *w = tg->v; *w;) {
                size_t n = strcspn(w, ",");
                const char *hf = NULL;
                for (size_t i = 0; i < sizeof tt_modules / sizeof *tt_modules; i++)
                    if (strlen(tt_modules[i].tt) == n && !strncmp(w, tt_modules[i].tt, n))
                        hf = tt_modules[i].hf;
                if (!hf) {
                    refuse(rd, fact_key(rd, F_LORA_TARGETS), tg->line, tg->v, "a torchtune module memplan does not know");
                    return;
                }
                appendf(names, sizeof names, "%s%s", names[0] ? "," : "", hf);
                w += n + (w[n] == ',');
            }
            if (fact_truth(rd, F_LORA_MLP)) /* w1, w2, w3: gate, down, up */
                appendf(names, sizeof names, ",gate_proj,down_proj,up_proj");
        } else {
            snprintf(names, sizeof names, "%s", tg->v);
        }
        put(rd, MP_RS_LORA_TARGETS, names, F_LORA_TARGETS);
    }
    if (!qlora)
        return;
    const struct fact_val *ne = fact(rd, F_NESTED, &tmp);
    if (ne && truth(ne->v) != 1)
        refuse(rd, fact_key(rd, F_NESTED), ne->line, ne->v,
               "single quantization: memplan's QLoRA base is double-quantized (bitsandbytes' QLoRA recipe); set "
               "%s: true",
               fact_key(rd, F_NESTED));
    const struct fact_val *qt = fact(rd, F_QTYPE, &tmp);
    if (qt && strcmp(qt->v, "nf4"))
        refuse(rd, fact_key(rd, F_QTYPE), qt->line, qt->v, "memplan's 4-bit base is NF4: not modelled yet");
    const struct fact_val *qs = fact(rd, F_QSTORAGE, &tmp);
    if (qs) /* (null: transformers' BitsAndBytesConfig default, uint8) */
        put(rd, MP_RS_QUANT_STORAGE, strcmp(qs->v, "null") ? qs->v : "uint8", F_QSTORAGE);
}

static void derive_attention(struct reader *rd)
{
    static const struct {
        const char *name, *mp;
    } attn[] = {{"sdpa", "sdpa"},          {"flash_attention_2", "flash"}, {"flash_attention_3", "flash"},
                {"fa2", "flash"},          {"fa3", "flash"},               {"eager", "eager"},
                {"disabled", "eager"}};
    struct fact_val tmp;
    const struct fact_val *v = fact(rd, F_ATTN, &tmp);
    if (!v || !strcmp(v->v, "null") || !strcmp(v->v, "auto"))
        return;
    for (size_t i = 0; i < sizeof attn / sizeof *attn; i++)
        if (!strcmp(v->v, attn[i].name)) {
            put(rd, MP_RS_ATTENTION, attn[i].mp, F_ATTN);
            return;
        }
    refuse(rd, fact_key(rd, F_ATTN), v->line, v->v, "an attention implementation memplan does not model yet");
}

/* Axolotl's Cut Cross-Entropy: on when `plugins` lists the CutCrossEntropyPlugin (the only plugin
 * memplan models) and `cut_cross_entropy` is not false (its args default it to True, axolotl 0.19
 * integrations/cut_cross_entropy/args.py:32); the plugin's cce_patch then replaces the causal LM's
 * forward (__init__.py:84-110).  True when it decided the loss (set it, or refused). */
#define CCE_PLUGIN "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"
#define LIGER_PLUGIN "axolotl.integrations.liger.LigerPlugin"
static bool axolotl_cce(struct reader *rd, bool *liger_listed)
{
    struct fact_val t1, t2;
    const struct fact_val *pl = fact(rd, F_PLUGINS, &t1), *on = fact(rd, F_CCE, &t2);
    bool listed = false;
    for (const char *w = pl && strcmp(pl->v, "null") && strcmp(pl->v, "[]") ? pl->v : NULL; w && *w;) {
        size_t n = strcspn(w, ",");
        bool cce = n == strlen(CCE_PLUGIN) && !strncmp(w, CCE_PLUGIN, n);
        bool liger = n == strlen(LIGER_PLUGIN) && !strncmp(w, LIGER_PLUGIN, n);
        if (!cce && !liger) {
            refuse(rd, fact_key(rd, F_PLUGINS), pl->line, pl->v, "%s",
                   "plugins other than the CutCrossEntropyPlugin and the LigerPlugin replace kernels or the "
                   "loss: not modelled yet");
            return true;
        }
        listed |= cce;
        *liger_listed |= liger;
        w += n + (w[n] == ',');
    }
    int t = on ? truth(on->v) : -1;
    if (on && t < 0 && strcmp(on->v, "null")) {
        refuse(rd, fact_key(rd, F_CCE), on->line, on->v, "expected true or false");
        return true;
    }
    if (!listed) {
        if (t == 1)
            refuse(rd, fact_key(rd, F_CCE), on->line, on->v, "%s",
                   "Axolotl reads it through the CutCrossEntropyPlugin: add plugins: [" CCE_PLUGIN "]");
        return t == 1;
    }
    if (t == 0)
        return false;
    put(rd, MP_RS_LOSS, "cce", t == 1 ? F_CCE : F_PLUGINS);
    return true;
}

/* Liger (ir/liger.c): transformers' use_liger_kernel with liger_kernel_config (a kernel the config
 * leaves out runs at its model's default: settled once the model is known), TRL 1.16's trainers
 * (which turn the fused linear cross-entropy off, and raise when it is asked for:
 * sft_trainer.py:1127-1140, dpo_trainer.py:939-952, grpo_trainer.py:1051-1064), Axolotl's
 * LigerPlugin (each flag as given, unset off).  memplan plans the fused linear cross-entropy
 * alone (--loss liger).  True when it decided the loss (set it, or refused). */
static bool derive_liger(struct reader *rd, bool plugin)
{
    static const struct {
        enum fact f;
        unsigned bits;
    } ks[] = {{F_LK_FLCE, MP_LK_FLCE},  {F_LK_CE, MP_LK_CROSS_ENTROPY}, {F_LK_ROPE, MP_LK_ROPE},
              {F_LK_RMS, MP_LK_RMS_NORM}, {F_LK_SWIGLU, MP_LK_SWIGLU},     {F_LK_GEGLU, MP_LK_GEGLU},
              {F_LK_LN, MP_LK_LAYER_NORM}, {F_LK_R2, MP_LK_RELU_SQUARED},  {F_LK_GLU, MP_LK_SWIGLU | MP_LK_GEGLU}};
    unsigned on = 0, off = 0;
    const struct fact_val *flce = NULL, *other = NULL; /* the first key given true of each */
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++) {
        const struct fact_val *v = &rd->f[ks[i].f];
        int t = v->set ? truth(v->v) : -1;
        if (v->set && t < 0 && strcmp(v->v, "null")) {
            refuse(rd, v->key, v->line, v->v, "expected true or false");
            return true;
        }
        if (t == 1 && ks[i].bits == MP_LK_FLCE)
            flce = v;
        else if (t == 1 && !other)
            other = v;
        on |= t == 1 ? ks[i].bits : 0;
        off |= t == 0 ? ks[i].bits : 0;
    }
    const struct fact_val *sw = &rd->f[F_LIGER];
    int lig = rd->r->format == MP_RF_AXOLOTL ? (on ? 1 : 0) : sw->set ? truth(sw->v) : 0;
    if (sw->set && lig < 0 && strcmp(sw->v, "null")) {
        refuse(rd, sw->key, sw->line, sw->v, "expected true or false");
        return true;
    }
    if (lig != 1)
        return false; /* (liger_kernel_config without use_liger_kernel: nothing applies it) */
    const struct fact_val *by = rd->r->format == MP_RF_AXOLOTL ? (flce ? flce : other) : sw;
    if (rd->r->format == MP_RF_AXOLOTL && !plugin) {
        refuse(rd, by->key, by->line, by->v, "%s", "Axolotl reads it through the LigerPlugin: add plugins: [" LIGER_PLUGIN "]");
        return true;
    }
    if (other) {
        refuse(rd, other->key, other->line, other->v, "%s",
               "Liger's kernels other than its fused linear cross-entropy: not modelled yet");
        return true;
    }
    bool trl = rd->r->format == MP_RF_TRL;
    if (trl && flce) {
        refuse(rd, flce->key, flce->line, flce->v, "%s",
               "TRL 1.16's trainers raise on it (their chunked LM head replaces the model's forward)");
        return true;
    }
    if (trl || (off & MP_LK_FLCE)) { /* the fused loss off: the model's kernels only, every one off or refused */
        if ((MP_LK_ALL & ~(unsigned)MP_LK_FLCE & ~off) != 0) {
            refuse(rd, sw->key, sw->line, sw->v, "%s",
                   "Liger's kernels (RoPE, RMSNorm, SwiGLU, ...) at their defaults: not modelled yet (with the fused "
                   "loss off, set each other key of liger_kernel_config false)");
            return true;
        }
        appendf(rd->r->explain, sizeof rd->r->explain, "%s:%u: %s: every kernel of it off: changes nothing\n", sw->key,
                sw->line, sw->v);
        return false;
    }
    rd->r->liger_on = on;
    rd->r->liger_off = off;
    rd->r->liger_unset_off = rd->r->format == MP_RF_AXOLOTL;
    snprintf(rd->r->liger_where, sizeof rd->r->liger_where, "%s:%u: %s: %s", rd->r->path, by->line, by->key, by->v);
    put(rd, MP_RS_LOSS, "liger", by == sw ? F_LIGER : F_LK_FLCE);
    return true;
}

/* The loss: "hf" (the model's own, what memplan plans) or the --loss name of another. */
static void derive_loss(struct reader *rd)
{
    static const struct {
        const char *name, *loss;
    } losses[] = {
        {"hf", "hf"},
        {"liger", "liger"},
        /* TRL 1.16: every SFT loss_type runs through the chunked fused LM head (sft_trainer.py:1144) */
        {"nll", "chunked-nll"},
        {"chunked_nll", "chunked-nll"},
        {"dft", "chunked-nll"},
        {"torchtune.modules.loss.LinearCrossEntropyLoss", "torchtune"},
    };
    struct fact_val tmp;
    bool liger_plugin = false;
    if (rd->r->format == MP_RF_AXOLOTL && axolotl_cce(rd, &liger_plugin)) {
        if (rd->r->s[MP_RS_LOSS].set && (rd->f[F_LK_FLCE].set && truth(rd->f[F_LK_FLCE].v) == 1))
            refuse(rd, rd->f[F_LK_FLCE].key, rd->f[F_LK_FLCE].line, rd->f[F_LK_FLCE].v, "%s",
                   "with Cut Cross-Entropy: one loss head (Axolotl's plugins would both patch the forward)");
        return;
    }
    if (derive_liger(rd, liger_plugin))
        return;
    const struct fact_val *v = fact(rd, F_LOSS, &tmp);
    if (!v)
        return;
    const char *loss = NULL;
    for (size_t i = 0; i < sizeof losses / sizeof *losses; i++)
        if (!strcmp(v->v, losses[i].name))
            loss = losses[i].loss;
    const char *key = fact_key(rd, F_LOSS);
    if (!loss && !strcmp(v->v, "torchtune.modules.loss.CEWithChunkedOutputLoss")) {
        refuse(rd, key, v->line, v->v, "%s",
               "the model's output in 8 chunks of logits, each upcast in the loss: not modelled yet "
               "(--loss torchtune is LinearCrossEntropyLoss)");
        return;
    }
    if (!loss) {
        refuse(rd, key, v->line, v->v, "a loss memplan does not model yet");
        return;
    }
    put(rd, MP_RS_LOSS, loss, F_LOSS);
    if (mp_recipe_setting_wired(MP_RS_LOSS) || !strcmp(loss, "hf"))
        return;
    if (rd->r->format == MP_RF_TRL)
        refuse(rd, key, v->line, v->v,
               "TRL 1.16's SFTTrainer computes every loss_type through its chunked fused LM head "
               "(trl/trainer/sft_trainer.py add_fused_lm_head), not HF's loss; memplan does not model it yet");
    else
        refuse(rd, key, v->line, v->v, "the %s loss: not modelled yet (memplan plans HF's loss)", loss);
}

/* Packing: --packing (each row packs documents, position ids restarting per document) or
 * --padding-free (the micro-batch's rows concatenated into one).  Each trainer as its source runs it;
 * what memplan does not model is refused, naming the key. */
static void derive_packing(struct reader *rd)
{
    struct fact_val tp, ts, tf, tn;
    const struct fact_val *pk = fact(rd, F_PACKING, &tp), *pf = fact(rd, F_PADDING_FREE, &tf);
    const struct fact_val *ne = fact(rd, F_NEAT_PACKING, &tn);
    bool packing = pk && truth(pk->v) == 1, flat = pf && truth(pf->v) == 1;
    switch (rd->r->format) {
    case MP_RF_TRL: {
        /* sft_trainer.py:916 padding_free = args.padding_free or (packing and strategy in {bfd,
         * bfd_split}); sft_config.py:336-343 turns "bfd-requeue" into "bfd_split".  "wrapped" cuts
         * the text into full rows with no document bounds (position ids 0..L-1): no mask, the
         * memory of full unpacked rows */
        const struct fact_val *st = fact(rd, F_PACK_STRATEGY, &ts);
        const char *strat = st ? st->v : "bfd";
        bool bfd = !strcmp(strat, "bfd") || !strcmp(strat, "bfd_split") || !strcmp(strat, "bfd-requeue");
        if (packing && !bfd && strcmp(strat, "wrapped")) {
            refuse(rd, fact_key(rd, F_PACK_STRATEGY), st->line, strat, "a packing strategy TRL 1.16 does not have");
            return;
        }
        if (flat || (packing && bfd))
            put(rd, MP_RS_PADDING_FREE, "on", flat ? F_PADDING_FREE : F_PACKING);
        return;
    }
    case MP_RF_AXOLOTL:
        /* batch_flattening: transformers' DataCollatorWithFlattening, one row */
        if (flat)
            put(rd, MP_RS_PADDING_FREE, "on", F_PADDING_FREE);
        /* sample_packing: with SDPA Axolotl 0.19 swaps in torch's varlen attention kernel
         * (loaders/patch_manager.py:825-870 _apply_sdpa_varlen_patch), with eager its own mask path:
         * only flash attention (varlen from position ids, no mask) is planned */
        if (packing && strcmp(rd->r->s[MP_RS_ATTENTION].value, "flash"))
            refuse(rd, fact_key(rd, F_PACKING), pk->line, pk->v,
                   "Axolotl's packed rows under SDPA or eager attention (its varlen SDPA patch): not modelled "
                   "yet; with flash_attention: true they are");
        else if (packing)
            put(rd, MP_RS_PACKING, "on", F_PACKING);
        return;
    case MP_RF_LLAMAFACTORY:
        /* neat_packing: the collator's 4-D float mask in the compute dtype (data/collator.py
         * prepare_4d_attention_mask) for every implementation but flash */
        if (ne && truth(ne->v) == 1) {
            refuse(rd, fact_key(rd, F_NEAT_PACKING), ne->line, ne->v,
                   "LLaMA-Factory's block-diagonal 4-D float mask from its collator: not modelled yet");
            return;
        }
        /* packing alone concatenates documents into full cutoff_len rows, no mask, no position
         * restarts: the memory of full rows, which memplan plans (nothing to set) */
        return;
    case MP_RF_TORCHTUNE:
        if (packing) /* padded_collate_packed: flex attention's BlockMask where flex runs (CUDA) */
            refuse(rd, fact_key(rd, F_PACKING), pk->line, pk->v,
                   "torchtune's packed batches attend through flex attention's block mask: not modelled yet");
        return;
    case MP_RF_HF:
    case MP_RF_N:
        return;
    }
}

/* GRPOConfig's generation settings (trl 1.16.0 grpo_config.py; its __post_init__ :1098-1117 for the
 * generation batch) */
static void derive_grpo(struct reader *rd)
{
    struct fact_val tk, tg, tb, tmp;
    count(rd, F_COMPLETION, MP_RS_COMPLETION_LENGTH, false);
    count(rd, F_NUM_GEN, MP_RS_NUM_GENERATIONS, false);
    count(rd, F_NUM_ITER, MP_RS_NUM_ITERATIONS, false);
    const struct fact_val *k = fact(rd, F_STEPS_PER_GEN, &tk);
    bool have_k = k && strcmp(k->v, "null");
    const struct fact_val *g = fact(rd, F_GEN_BATCH, &tg);
    if (g && strcmp(g->v, "null")) {
        const struct fact_val *b = fact(rd, F_BATCH, &tb);
        uint64_t gen = 0, batch = 0;
        if (have_k)
            refuse(rd, fact_key(rd, F_GEN_BATCH), g->line, g->v,
                   "with steps_per_generation too: GRPOConfig takes one of them");
        else if (mp_parse_u64(g->v, &gen) != MP_OK || gen == 0)
            refuse(rd, fact_key(rd, F_GEN_BATCH), g->line, g->v, "expected a positive integer");
        else if (!b || mp_parse_u64(b->v, &batch) != MP_OK || batch == 0 || gen % batch)
            refuse(rd, fact_key(rd, F_GEN_BATCH), g->line, g->v, "not a multiple of %s %s (GRPOConfig raises)",
                   fact_key(rd, F_BATCH), b ? b->v : "?");
        else {
            char v[32];
            snprintf(v, sizeof v, "%llu", (unsigned long long)(gen / batch));
            put(rd, MP_RS_STEPS_PER_GENERATION, v, F_GEN_BATCH);
            appendf(rd->r->explain, sizeof rd->r->explain, "generation_batch_size %llu / %s %llu -> "
                    "steps-per-generation %s (one process)\n", (unsigned long long)gen, fact_key(rd, F_BATCH),
                    (unsigned long long)batch, v);
        }
    } else {
        count(rd, F_STEPS_PER_GEN, MP_RS_STEPS_PER_GENERATION, true);
    }
    const struct fact_val *beta = fact(rd, F_BETA, &tmp);
    double bv = 0;
    if (beta && (mp_parse_double(beta->v, &bv) != MP_OK || !(bv >= 0)))
        refuse(rd, fact_key(rd, F_BETA), beta->line, beta->v, "expected a number, 0 or more");
    else if (beta)
        put(rd, MP_RS_BETA, beta->v, F_BETA);
    if (rd->f[F_USE_VLLM].set && fact_truth(rd, F_USE_VLLM) < 0 && strcmp(rd->f[F_USE_VLLM].v, "null"))
        refuse(rd, fact_key(rd, F_USE_VLLM), rd->f[F_USE_VLLM].line, rd->f[F_USE_VLLM].v, "expected true or false");
    if (fact_truth(rd, F_USE_VLLM) == 1) {
        const struct fact_val *mode = fact(rd, F_VLLM_MODE, &tmp);
        if (!mode || !strcmp(mode->v, "colocate")) {
            const struct fact_val *u = fact(rd, F_VLLM_UTIL, &tmp);
            /* grpo_config.py:656 default 0.3: then the setting is use_vllm's */
            put(rd, MP_RS_VLLM, u ? u->v : "0.3", u ? F_VLLM_UTIL : F_USE_VLLM);
        } else if (!strcmp(mode->v, "server")) {
            put(rd, MP_RS_VLLM, "server", F_VLLM_MODE);
        } else {
            refuse(rd, fact_key(rd, F_VLLM_MODE), mode->line, mode->v, "expected colocate or server");
        }
    }
    const struct fact_val *temp = fact(rd, F_TEMPERATURE, &tmp);
    double tv = 0;
    if (temp && (mp_parse_double(temp->v, &tv) != MP_OK || !(tv > 0)))
        refuse(rd, fact_key(rd, F_TEMPERATURE), temp->line, temp->v, "expected a number above 0");
    else if (temp)
        put(rd, MP_RS_TEMPERATURE, temp->v, F_TEMPERATURE);
    /* RepetitionPenaltyLogitsProcessor (logits_process.py: a float above 0); TRL passes 1.0 on */
    const struct fact_val *rp = fact(rd, F_REP_PENALTY, &tmp);
    if (rp && (mp_parse_double(rp->v, &tv) != MP_OK || !(tv > 0)))
        refuse(rd, fact_key(rd, F_REP_PENALTY), rp->line, rp->v, "expected a number above 0");
    else if (rp)
        put(rd, MP_RS_REP_PENALTY, rp->v, F_REP_PENALTY);
    /* the warpers (generation/logits_process.py checks: top_p and min_p in [0, 1], top_k a count;
     * TRL passes None through: no warper) */
    static const struct {
        int f, rs;
        bool count;
    } warp[] = {{F_TOP_P, MP_RS_TOP_P, false}, {F_TOP_K, MP_RS_TOP_K, true}, {F_MIN_P, MP_RS_MIN_P, false}};
    for (size_t i = 0; i < sizeof warp / sizeof warp[0]; i++) {
        const struct fact_val *w = fact(rd, warp[i].f, &tmp);
        uint64_t cnt = 0;
        if (!w || !strcmp(w->v, "null") || !strcmp(w->v, "None"))
            continue;
        if (warp[i].count ? mp_parse_u64(w->v, &cnt) != MP_OK || cnt > UINT32_MAX
                          : mp_parse_double(w->v, &tv) != MP_OK || !(tv >= 0 && tv <= 1))
            refuse(rd, fact_key(rd, warp[i].f), w->line, w->v,
                   warp[i].count ? "expected a count, 0 for none" : "expected a number from 0 to 1");
        else
            put(rd, warp[i].rs, w->v, warp[i].f);
    }
    int dg = fact_truth(rd, F_DS3_GATHER);
    if (rd->f[F_DS3_GATHER].set && dg < 0)
        refuse(rd, fact_key(rd, F_DS3_GATHER), rd->f[F_DS3_GATHER].line, rd->f[F_DS3_GATHER].v, "expected true or false");
    else if (rd->f[F_DS3_GATHER].set)
        put(rd, MP_RS_DS3_GATHER, dg ? "on" : "off", F_DS3_GATHER);
    int is = fact_truth(rd, F_VLLM_IS), uv = fact_truth(rd, F_USE_VLLM);
    if (rd->f[F_VLLM_IS].set && is < 0 && strcmp(rd->f[F_VLLM_IS].v, "null"))
        refuse(rd, fact_key(rd, F_VLLM_IS), rd->f[F_VLLM_IS].line, rd->f[F_VLLM_IS].v, "expected true or false");
    else if (rd->f[F_VLLM_IS].set && is >= 0 && uv == 1) /* (without vLLM it corrects nothing) */
        put(rd, MP_RS_VLLM_IS_CORRECTION, is ? "on" : "off", F_VLLM_IS);
}

static const char *trainer_name(enum mp_trainer t)
{
    static const char *const names[] = {
#define MP_X(id, name, how, unmodelled, seqs, min_batch, ref_fwds, kl_fwds, config, loss_type, drop0) name,
        MP_TRAINERS(MP_X)
#undef MP_X
    };
    return (size_t)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Axolotl 0.19's rl: (schemas/enums.py RLType; core/builders/rl.py HFRLTrainerBuilder): the TRL
 * trainer it builds, planned by the matching --trainer.  True when the file's rl: is planned
 * (dpo, ipo, kto or orpo), and so its loss is the trainer's. */
static bool derive_axolotl_rl(struct reader *rd)
{
    const struct fact_val *rl = rd->f[F_RL].set && strcmp(rd->f[F_RL].v, "null") ? &rd->f[F_RL] : NULL;
    enum mp_trainer t = rd->trainer;
    if (!rl) {
        if (t != MP_TRAINER_SFT)
            refuse(rd, "rl", 0, "null", "Axolotl trains without a preference trainer when rl: is not given (dpo, "
                   "ipo, kto or orpo): give it, or drop --trainer %s", trainer_name(t));
        return false;
    }
    enum mp_trainer want = MP_TRAINER_SFT;
    const char *why = NULL;
    if (!strcmp(rl->v, "dpo") || !strcmp(rl->v, "ipo")) /* ipo: DPOConfig loss_type ["ipo"] */
        want = MP_TRAINER_DPO;
    else if (!strcmp(rl->v, "kto")) /* KTOConfig's loss_type "kto" (the KL term) */
        want = MP_TRAINER_KTO;
    else if (!strcmp(rl->v, "orpo"))
        want = MP_TRAINER_ORPO;
    else if (!strcmp(rl->v, "grpo") || !strcmp(rl->v, "gdpo"))
        why = "Axolotl's own GRPO trainer (core/trainers/grpo/trainer.py over TRL's), and without an adapter "
              "train.py's second copy of the model that the trainer is never given: not modelled yet (a TRL "
              "GRPOConfig file with --trainer grpo is)";
    else if (!strcmp(rl->v, "simpo"))
        why = "SimPO (TRL's CPOTrainer, loss_type simpo): not modelled yet";
    else if (!strcmp(rl->v, "ebft"))
        why = "energy-based fine-tuning (EBFT): not modelled yet";
    else
        why = "expected dpo, ipo, kto, orpo, simpo, grpo, gdpo or ebft";
    if (why) {
        refuse(rd, "rl", rl->line, rl->v, "%s", why);
        return false;
    }
    if (t != want) {
        refuse(rd, "rl", rl->line, rl->v, "read this file with --trainer %s", trainer_name(want));
        return false;
    }
    /* the plugins patch the model's forward, which TRL's fused head (DPO, KTO) does not call, or the
     * loss ORPO computes on its logits: not measured under these trainers */
    struct fact_val t1;
    const struct fact_val *pl = fact(rd, F_PLUGINS, &t1);
    if (pl && strcmp(pl->v, "null") && strcmp(pl->v, "[]"))
        refuse(rd, fact_key(rd, F_PLUGINS), pl->line, pl->v, "%s",
               "Axolotl's plugins under rl: (their patches under TRL's preference trainers): not modelled yet");
    return true;
}

/* LLaMA-Factory 0.9.5's stage (hparams/finetuning_args.py): sft and pt train the model alone; dpo
 * runs LLaMA-Factory's CustomDPOTrainer (train/dpo/trainer.py, over TRL <= 0.24's DPOTrainer,
 * whose compute_loss calls its get_batch_loss_metrics): the model's whole logits cast to fp32 and
 * get_batch_logps (trainer_utils.py:592-636), planned by --trainer dpo --loss hf
 * (lower_embed_head.c lower_lf_dpo_loss).  kto runs CustomKTOTrainer (train/kto/trainer.py, over
 * TRL <= 0.24's KTOTrainer, trl 0.24.0 kto_trainer.py:1477-1499 compute_loss): the same head on
 * the batch, its KL sequences through the policy under no_grad, two reference forwards, planned
 * by --trainer kto --loss hf.  Their reference (dpo/workflow.py:56-63, kto/workflow.py:56-60,
 * trainer_utils.py create_ref_model:116-148): under finetuning_type lora none, the adapter disabled
 * (compute_reference_log_probs, dpo/trainer.py:262-264, kto/trainer.py:206-208); otherwise the
 * model loaded again in the compute dtype, frozen. */
static void derive_lf_stage(struct reader *rd)
{
    const struct fact_val *st = rd->f[F_LF_STAGE].set ? &rd->f[F_LF_STAGE] : NULL;
    if (!st || !strcmp(st->v, "sft") || !strcmp(st->v, "pt")) {
        if (rd->trainer != MP_TRAINER_SFT) /* (finetuning_args.py: stage "sft" by default) */
            refuse(rd, "stage", st ? st->line : 0, st ? st->v : "sft",
                   "this stage trains the model alone: drop --trainer %s", trainer_name(rd->trainer));
        return;
    }
    bool dpo = !strcmp(st->v, "dpo"), kto = !strcmp(st->v, "kto");
    if (dpo || kto) {
        enum mp_trainer want = dpo ? MP_TRAINER_DPO : MP_TRAINER_KTO;
        if (rd->trainer != want) {
            refuse(rd, fact_key(rd, F_LF_STAGE), st->line, st->v, "LLaMA-Factory's %s step: read this file with "
                   "--trainer %s", dpo ? "DPO" : "KTO", trainer_name(want));
            return;
        }
        struct fact_val t1, t2;
        const struct fact_val *ft = fact(rd, F_PEFT, &t1);
        int pure = fact_truth(rd, F_PURE_BF16);
        const struct fact_val *bf = fact(rd, F_BF16, &t2);
        if (ft && !strcmp(ft->v, "full") && pure != 1 && bf && truth(bf->v) == 1)
            /* adapter.py:313 upcasts the trainable weights to fp32; the reference stays in bf16 */
            refuse(rd, fact_key(rd, F_PEFT), ft->line, ft->v, "%s",
                   "a bf16 reference copy (create_ref_model: the compute dtype) beside fp32 trainable weights "
                   "(bf16 without pure_bf16): not modelled yet (pure_bf16: true is)");
        else if (ft && strcmp(ft->v, "full") && strcmp(ft->v, "lora"))
            refuse(rd, fact_key(rd, F_PEFT), ft->line, ft->v, "LLaMA-Factory's %s with this fine-tuning type: "
                   "not modelled yet (lora and full are)", dpo ? "DPO" : "KTO");
        put(rd, MP_RS_LOSS, "hf", F_LF_STAGE); /* (the model's logits: --trainer dpo|kto --loss hf) */
        return;
    }
    const char *why = !strcmp(st->v, "rm") || !strcmp(st->v, "ppo")
                          ? "this stage's models (reward, value, reference): not modelled yet"
                          : "expected sft, pt, rm, ppo, dpo or kto";
    refuse(rd, fact_key(rd, F_LF_STAGE), st->line, st->v, "%s", why);
}

static void derive(struct reader *rd)
{
    if (rd->r->format == MP_RF_LLAMAFACTORY) /* (first: the stage decides the trainer) */
        derive_lf_stage(rd);
    struct fact_val tmp;
    const struct fact_val *m = fact(rd, F_MODEL, &tmp);
    if (m && strcmp(m->v, "null"))
        put(rd, MP_RS_MODEL, m->v, F_MODEL);
    count(rd, F_BATCH, MP_RS_BATCH, false);
    count(rd, F_GA, MP_RS_GRAD_ACCUM, false);
    if (!(rd->fmt_bit & B_GRPO)) /* (GRPOConfig has no length: --seq) */
        count(rd, F_SEQ, MP_RS_SEQ, true);
    const char *mode = derive_finetune(rd);
    bool adapters = mode && strcmp(mode, "full");
    derive_precision(rd, adapters);
    derive_optimizer(rd);
    derive_checkpoint(rd, adapters);
    derive_attention(rd);
    const struct fact_val *uc = fact(rd, F_USE_CACHE, &tmp);
    if (uc && truth(uc->v) >= 0)
        put(rd, MP_RS_USE_CACHE, truth(uc->v) ? "on" : "off", F_USE_CACHE);
    if (adapters)
        derive_lora(rd, !strcmp(mode, "qlora"));
    int drop = fact_truth(rd, F_DROPOUT_OFF);
    if (rd->f[F_DROPOUT_OFF].set && drop < 0 && strcmp(rd->f[F_DROPOUT_OFF].v, "null"))
        refuse(rd, fact_key(rd, F_DROPOUT_OFF), rd->f[F_DROPOUT_OFF].line, rd->f[F_DROPOUT_OFF].v,
               "expected true or false");
    else if (rd->f[F_DROPOUT_OFF].set && drop >= 0)
        put(rd, MP_RS_DISABLE_DROPOUT, drop ? "on" : "off", F_DROPOUT_OFF);
    if (rd->fmt_bit & B_GRPO)
        derive_grpo(rd);
    bool axrl = rd->r->format == MP_RF_AXOLOTL && derive_axolotl_rl(rd);
    bool fused = (rd->fmt_bit & (B_DPO | B_KTO | B_GRPO)) ||
                 (axrl && (rd->trainer == MP_TRAINER_DPO || rd->trainer == MP_TRAINER_KTO));
    if (fused) { /* their head is fused whatever loss_type (dpo_trainer.py:959-962, kto_trainer.py:966-972,
                  * grpo_trainer.py:1068-1077) */
        put(rd, MP_RS_LOSS, "chunked-nll", F_LOSS);
        /* (Axolotl hands precompute_ref_log_probs to DPOConfig alone: dpo/__init__.py DPOStrategy) */
        if (fact_truth(rd, F_PRECOMPUTE) == 1 && (!axrl || rd->trainer == MP_TRAINER_DPO))
            put(rd, MP_RS_PRECOMPUTE_REF, "true", F_PRECOMPUTE);
    } else if (!(rd->fmt_bit & (B_ORPO | B_LFDPO | B_LFKTO)) && !axrl) /* (ORPO, LLaMA-Factory's DPO and KTO:
                                                                         the model's logits and the trainer's
                                                                         loss, hf's head) */
        derive_loss(rd);
    derive_packing(rd);
    derive_act_offload(rd, adapters);
}

/* ---- reading ------------------------------------------------------------------------------------- */

static enum mp_status load(const char *path, yaml_document_t *doc, struct mp_diag *d)
{
    char *buf = NULL;
    size_t len = 0;
    enum mp_status st = mp_read_file(path, RECIPE_MAX_BYTES, "a recipe (YAML or JSON)", &buf, &len, d);
    if (st != MP_OK)
        return st;
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        free(buf);
        return mp_fail(d, MP_ERR_OOM, "%s: out of memory", path);
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)buf, len);
    if (!yaml_parser_load(&p, doc)) {
        st = mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: not YAML or JSON: %s", path, p.problem_mark.line + 1,
                     p.problem_mark.column + 1, p.problem ? p.problem : "unreadable");
        yaml_parser_delete(&p);
        free(buf);
        return st;
    }
    yaml_parser_delete(&p);
    free(buf);
    const yaml_node_t *root = yaml_document_get_root_node(doc);
    if (!root || root->type != YAML_MAPPING_NODE) {
        yaml_document_delete(doc);
        return mp_fail(d, MP_ERR_JSON, "%s: a recipe is a mapping of keys (key: value), got %s", path,
                       root ? "a list or a single value" : "an empty file");
    }
    return MP_OK;
}

/* A key given twice in one mapping (libyaml keeps both): which one would the trainer read? */
static enum mp_status duplicates(yaml_document_t *doc, const yaml_node_t *map, const char *path, struct mp_diag *d,
                                 int depth)
{
    if (depth > RECIPE_MAX_DEPTH)
        return mp_fail(d, MP_ERR_JSON, "%s:%zu: mappings nested deeper than %d levels", path, map->start_mark.line + 1,
                       RECIPE_MAX_DEPTH);
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(doc, p->key), *v = yaml_document_get_node(doc, p->value);
        if (!k || k->type != YAML_SCALAR_NODE)
            return mp_fail(d, MP_ERR_JSON, "%s:%zu: a key that is not a plain name", path,
                           k ? k->start_mark.line + 1 : 0);
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            const yaml_node_t *kq = yaml_document_get_node(doc, q->key);
            if (kq && kq->type == YAML_SCALAR_NODE && !strcmp((const char *)kq->data.scalar.value, (const char *)k->data.scalar.value))
                return mp_fail(d, MP_ERR_JSON, "%s:%zu: %s: duplicate key (first at line %zu)", path,
                               k->start_mark.line + 1, (const char *)k->data.scalar.value, kq->start_mark.line + 1);
        }
        if (v && v->type == YAML_MAPPING_NODE) {
            enum mp_status st = duplicates(doc, v, path, d, depth + 1);
            if (st != MP_OK)
                return st;
        }
    }
    return MP_OK;
}

enum mp_status mp_recipe_read(const char *path, int format, struct mp_recipe *r, struct mp_diag *d)
{
    return mp_recipe_read_as(path, format, MP_TRAINER_SFT, r, d);
}

enum mp_status mp_recipe_read_as(const char *path, int format, enum mp_trainer t, struct mp_recipe *r,
                                 struct mp_diag *d)
{
    memset(r, 0, sizeof *r);
    snprintf(r->path, sizeof r->path, "%s", path);
    yaml_document_t doc;
    enum mp_status st = load(path, &doc, d);
    if (st != MP_OK)
        return st;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    if ((st = duplicates(&doc, root, path, d, 0)) != MP_OK)
        goto out;
    if (format >= 0) {
        r->format = (enum mp_recipe_format)format;
        snprintf(r->how, sizeof r->how, "--recipe-format");
    } else if ((st = detect(&doc, r, d)) != MP_OK) {
        goto out;
    }
    bool dpo = t == MP_TRAINER_DPO && r->format == MP_RF_TRL,
         kto = (t == MP_TRAINER_KTO || t == MP_TRAINER_KTO_APO) && r->format == MP_RF_TRL,
         grpo = t == MP_TRAINER_GRPO && r->format == MP_RF_TRL, orpo = t == MP_TRAINER_ORPO && r->format == MP_RF_TRL;
    bool ax = r->format == MP_RF_AXOLOTL;
    r->trainer = ax && t == MP_TRAINER_DPO   ? "Axolotl 0.19.0 rl: dpo / ipo (TRL 1.16.0 DPOTrainer)"
                 : ax && t == MP_TRAINER_KTO ? "Axolotl 0.19.0 rl: kto (TRL 1.16.0 KTOTrainer)"
                 : ax && t == MP_TRAINER_ORPO ? "Axolotl 0.19.0 rl: orpo (TRL 1.16.0 ORPOTrainer)"
                 : r->format == MP_RF_LLAMAFACTORY && t == MP_TRAINER_DPO
                     ? "LLaMA-Factory 0.9.5 stage: dpo (CustomDPOTrainer, TRL <= 0.24)"
                 : r->format == MP_RF_LLAMAFACTORY && t == MP_TRAINER_KTO
                     ? "LLaMA-Factory 0.9.5 stage: kto (CustomKTOTrainer, TRL <= 0.24)"
                 : dpo  ? "TRL 1.16.0 DPOTrainer (DPOConfig + ModelConfig)"
                 : kto  ? "TRL 1.16.0 KTOTrainer (KTOConfig + ModelConfig)"
                 : grpo ? "TRL 1.16.0 GRPOTrainer (GRPOConfig + ModelConfig)"
                 : orpo ? "TRL 1.16.0 ORPOTrainer (ORPOConfig + ModelConfig)"
                        : formats[r->format].trainer;
    struct reader *rd = mp_xcalloc(1, sizeof *rd);
    rd->r = r;
    rd->d = d;
    rd->doc = &doc;
    rd->trainer = t;
    rd->fmt_bit = 1u << r->format | (dpo ? (unsigned)B_DPO : 0u) | (kto ? (unsigned)B_KTO : 0u) |
                  (ax && t != MP_TRAINER_SFT ? (unsigned)B_AXRL : 0u) |
                  (kto && t == MP_TRAINER_KTO_APO ? (unsigned)B_KTO_APO : 0u) | (grpo ? (unsigned)B_GRPO : 0u) |
                  (orpo ? (unsigned)B_ORPO : 0u) |
                  (r->format == MP_RF_LLAMAFACTORY && t == MP_TRAINER_DPO ? (unsigned)B_LFDPO : 0u) |
                  (r->format == MP_RF_LLAMAFACTORY && t == MP_TRAINER_KTO ? (unsigned)B_LFKTO : 0u);
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top; p++) {
        const yaml_node_t *k = yaml_document_get_node(&doc, p->key), *v = yaml_document_get_node(&doc, p->value);
        if (k && v)
            visit(rd, (const char *)k->data.scalar.value, v);
    }
    if (kto && t == MP_TRAINER_KTO_APO && !top(&doc, "loss_type")) /* KTOConfig's default: "kto" */
        refuse(rd, "loss_type", 0, "kto", "the KL term's loss: read this file with --trainer kto");
    derive(rd);
    st = rd->st;
    free(rd);
out:
    yaml_document_delete(&doc);
    return st;
}

enum mp_status mp_recipe_resolve_dtype(struct mp_recipe *r, const char *model_file, struct mp_diag *d)
{
    if (!r->dtype_auto)
        return MP_OK;
    yaml_document_t doc;
    struct mp_diag ld = {{0}};
    enum dt dt = DT_F32; /* no dtype in the config: from_pretrained's fallback, float32 */
    const char *key = "dtype";
    if (load(model_file, &doc, &ld) == MP_OK) {
        const yaml_node_t *v = top(&doc, "dtype");
        if (!v || is_null(v))
            v = top(&doc, "torch_dtype"), key = "torch_dtype";
        if (v && v->type == YAML_SCALAR_NODE && !is_null(v))
            dt = dtype_of((const char *)v->data.scalar.value);
        yaml_document_delete(&doc);
    }
    struct mp_recipe_setting *s = &r->s[MP_RS_PRECISION];
    if (dt != DT_F32 && dt != DT_BF16)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: the model loads in its checkpoint's dtype (dtype \"auto\"), %s's %s is "
                       "not float32 or bfloat16: not modelled yet", r->path, s->key, model_file, key);
    int i = dt == DT_BF16;
    if (!r->prec_auto[i][0])
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: %s (the model loads in its checkpoint's %s)", r->path, s->key,
                       r->prec_auto_why[i], i ? "bfloat16" : "float32");
    snprintf(s->value, sizeof s->value, "%s", r->prec_auto[i]);
    appendf(r->explain, sizeof r->explain, "dtype auto: the checkpoint's %s -> precision %s\n",
            i ? "bfloat16" : "float32", s->value);
    return MP_OK;
}
