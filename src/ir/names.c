/* names.c — the names, parsers and traits of the ir's closed sets: dtypes, precisions and
 * optimizers (util/sets.h's tables) and prims (layers.h's MP_PRIMS), all generated from the
 * table rows (layers.h declares them).
 */
#include "layers.h"

#include <stdio.h>
#include <string.h>

uint64_t mp_dtype_size(enum mp_dtype t)
{
    switch (t) {
#define MP_X(id, name, bytes) \
    case MP_DT_##id: return bytes;
        MP_DTYPES(MP_X)
#undef MP_X
    }
    return 1;
}

const char *mp_dtype_str(enum mp_dtype t)
{
    switch (t) {
#define MP_X(id, name, bytes) \
    case MP_DT_##id: return name;
        MP_DTYPES(MP_X)
#undef MP_X
    }
    return "?";
}

static const char *const prec_names[] = {
#define MP_X(id, name) name,
    MP_PRECISIONS(MP_X)
#undef MP_X
};
#define N_PRECISIONS (sizeof prec_names / sizeof prec_names[0])
const char *mp_precision_str(enum mp_precision p) { return (unsigned)p < N_PRECISIONS ? prec_names[p] : "?"; }
int mp_precision_parse(const char *s)
{
    for (size_t i = 0; i < N_PRECISIONS; i++)
        if (strcmp(s, prec_names[i]) == 0)
            return (int)i;
    return -1;
}
const char *mp_precision_names(const char *sep, const char *last)
{
    static char buf[256];
    return mp_join(buf, sizeof buf, prec_names, N_PRECISIONS, sep, last);
}

static const struct opt_row {
    const char *name, *hf, *aliases;
    enum mp_opt_state state;
    enum mp_opt_tmp tmp;
    bool wd, probe, par_probe;
} opt_rows[] = {
#define MP_X(id, name, state, tmp, wd, hf, aliases, probe, par_probe) \
    {name, hf, aliases, MP_OPT_STATE_##state, MP_OPT_TMP_##tmp, wd, probe, par_probe},
    MP_OPTIMIZERS(MP_X)
#undef MP_X
};
#define N_OPTIMIZERS (sizeof opt_rows / sizeof opt_rows[0])

/* The row of o; MP_BUG for a value outside the set (a caller's corrupt enum, never input). */
static const struct opt_row *opt_row(enum mp_optimizer o)
{
    if ((unsigned)o >= N_OPTIMIZERS)
        MP_BUG("optimizer %d outside MP_OPTIMIZERS", (int)o);
    return &opt_rows[o];
}
const char *mp_optimizer_str(enum mp_optimizer o) { return (unsigned)o < N_OPTIMIZERS ? opt_rows[o].name : "?"; }
/* Whether the space-separated list has the word w. */
static bool has_word(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; n && (p = strstr(p, w)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || !p[n]))
            return true;
    return false;
}
/* A CLI name, or one of a row's Hugging Face optim names (the aliases column). */
int mp_optimizer_parse(const char *s)
{
    for (size_t i = 0; i < N_OPTIMIZERS; i++)
        if (strcmp(s, opt_rows[i].name) == 0)
            return (int)i;
    for (size_t i = 0; i < N_OPTIMIZERS; i++)
        if (has_word(opt_rows[i].aliases, s))
            return (int)i;
    return -1;
}
const char *mp_optimizer_names(const char *sep, const char *last)
{
    static char buf[512];
    const char *names[N_OPTIMIZERS];
    for (size_t i = 0; i < N_OPTIMIZERS; i++)
        names[i] = opt_rows[i].name;
    return mp_join(buf, sizeof buf, names, N_OPTIMIZERS, sep, last);
}
const char *mp_optimizer_hf_names(const char *sep, const char *last)
{
    static char buf[512], words[512];
    const char *names[2 * N_OPTIMIZERS];
    size_t n = 0, at = 0;
    for (size_t i = 0; i < N_OPTIMIZERS; i++) /* the aliases but a row's own name, as words (in words[]) */
        for (const char *a = opt_rows[i].aliases; *a && n < sizeof names / sizeof names[0];) {
            size_t k = strcspn(a, " ");
            bool own = strlen(opt_rows[i].name) == k && !strncmp(opt_rows[i].name, a, k); /* listed already */
            if (k && !own && at + k + 1 <= sizeof words) {
                memcpy(words + at, a, k);
                words[at + k] = 0;
                names[n++] = words + at;
                at += k + 1;
            }
            a += k + (a[k] == ' ');
        }
    return mp_join(buf, sizeof buf, names, n, sep, last);
}
/* The names of the rows the probe runs (par: the data-parallel probe), as "a, b and c". */
static const char *rows_where(char *buf, size_t cap, bool par)
{
    const char *names[N_OPTIMIZERS];
    size_t n = 0;
    for (size_t i = 0; i < N_OPTIMIZERS; i++)
        if (par ? opt_rows[i].par_probe : opt_rows[i].probe)
            names[n++] = opt_rows[i].name;
    return mp_join(buf, cap, names, n, ", ", " and ");
}
enum mp_opt_state mp_optimizer_state(enum mp_optimizer o) { return opt_row(o)->state; }
enum mp_opt_tmp mp_optimizer_tmp(enum mp_optimizer o) { return opt_row(o)->tmp; }
const char *mp_optimizer_hf(enum mp_optimizer o) { return opt_row(o)->hf; }
bool mp_optimizer_probe(enum mp_optimizer o) { return opt_row(o)->probe; }
const char *mp_optimizer_probe_names(void)
{
    static char buf[512];
    return rows_where(buf, sizeof buf, false);
}
bool mp_optimizer_par_probe(enum mp_optimizer o) { return opt_row(o)->par_probe; }
bool mp_optimizer_decoupled_wd(enum mp_optimizer o) { return opt_row(o)->wd; }
const char *mp_optimizer_par_probe_names(void)
{
    static char buf[256];
    return rows_where(buf, sizeof buf, true);
}

static const struct loss_row {
    const char *name, *how, *unmodelled;
} loss_rows[] = {
#define MP_X(id, name, how, unmodelled) {name, how, unmodelled},
    MP_LOSSES(MP_X)
#undef MP_X
};
#define N_LOSSES (sizeof loss_rows / sizeof loss_rows[0])

const char *mp_loss_str(enum mp_loss l) { return (unsigned)l < N_LOSSES ? loss_rows[l].name : "?"; }
const char *mp_loss_how(enum mp_loss l) { return (unsigned)l < N_LOSSES ? loss_rows[l].how : "?"; }
const char *mp_loss_unmodelled(enum mp_loss l) { return (unsigned)l < N_LOSSES ? loss_rows[l].unmodelled : NULL; }
int mp_loss_parse(const char *s)
{
    for (size_t i = 0; i < N_LOSSES; i++)
        if (strcmp(s, loss_rows[i].name) == 0)
            return (int)i;
    return -1;
}
const char *mp_loss_names(const char *sep, const char *last)
{
    static char buf[128];
    const char *names[N_LOSSES];
    for (size_t i = 0; i < N_LOSSES; i++)
        names[i] = loss_rows[i].name;
    return mp_join(buf, sizeof buf, names, N_LOSSES, sep, last);
}

static const struct trainer_row {
    const char *name, *how, *unmodelled;
    unsigned seqs, min_batch, ref_fwds, kl_fwds;
    const char *config, *loss_type;
    bool drop0;
} trainer_rows[] = {
#define MP_X(id, name, how, unmodelled, seqs, min_batch, ref_fwds, kl_fwds, config, loss_type, drop0) \
    {name, how, unmodelled, seqs, min_batch, ref_fwds, kl_fwds, config, loss_type, drop0},
    MP_TRAINERS(MP_X)
#undef MP_X
};
#define N_TRAINERS (sizeof trainer_rows / sizeof trainer_rows[0])

const char *mp_trainer_str(enum mp_trainer t) { return (unsigned)t < N_TRAINERS ? trainer_rows[t].name : "?"; }
const char *mp_trainer_unmodelled(enum mp_trainer t)
{
    return (unsigned)t < N_TRAINERS ? trainer_rows[t].unmodelled : NULL;
}
uint64_t mp_trainer_seqs(enum mp_trainer t) { return (unsigned)t < N_TRAINERS ? trainer_rows[t].seqs : 1; }
/* (LLaMA-Factory's KTO makes its KL sequences in preprocessing, data/processor/feedback.py, and its
 * CustomKTOTrainer.__init__ skips KTOTrainer's, which raises below 2: train/kto/trainer.py:89) */
uint64_t mp_trainer_min_batch(enum mp_trainer t, enum mp_loss l)
{
    return mp_trainer_lf(t, l) || (unsigned)t >= N_TRAINERS ? 1 : trainer_rows[t].min_batch;
}
bool mp_trainer_lf(enum mp_trainer t, enum mp_loss l)
{
    return (t == MP_TRAINER_DPO || t == MP_TRAINER_KTO) && l == MP_LOSS_HF;
}
bool mp_trainer_casts_quant_adapters(enum mp_trainer t, enum mp_loss l, enum mp_ft_mode m, enum mp_quant_kind base)
{
    bool bnb = m == MP_FT_QLORA || base == MP_Q_BNB_NF4 || base == MP_Q_BNB_FP4 || base == MP_Q_BNB_INT8;
    if (!bnb || (m != MP_FT_LORA && m != MP_FT_QLORA))
        return false;
    /* SFTTrainer is the step of --loss chunked-nll (its default loss_type "nll"); DPO and KTO but
     * LLaMA-Factory's (Custom{DPO,KTO}Trainer.__init__ calls Trainer.__init__, skipping TRL's);
     * ORPO's experimental trainer only runs peft_module_casting_to_bf16, which leaves LoRA's
     * weights fp32 (trl 1.16 experimental/orpo/orpo_trainer.py:262, experimental/utils.py:950) */
    if (t == MP_TRAINER_SFT)
        return l == MP_LOSS_CHUNKED_NLL;
    return t == MP_TRAINER_GRPO || t == MP_TRAINER_KTO_APO ||
           ((t == MP_TRAINER_DPO || t == MP_TRAINER_KTO) && !mp_trainer_lf(t, l));
}
unsigned mp_trainer_ref_fwds(enum mp_trainer t) { return (unsigned)t < N_TRAINERS ? trainer_rows[t].ref_fwds : 0; }
unsigned mp_trainer_kl_fwds(enum mp_trainer t) { return (unsigned)t < N_TRAINERS ? trainer_rows[t].kl_fwds : 0; }
bool mp_trainer_drops_dropout(enum mp_trainer t) { return (unsigned)t < N_TRAINERS && trainer_rows[t].drop0; }
const char *mp_trainer_config(enum mp_trainer t) { return (unsigned)t < N_TRAINERS ? trainer_rows[t].config : "?"; }
const char *mp_trainer_trl_name(enum mp_trainer t, char *buf, size_t cap)
{
    const char *cfg = mp_trainer_config(t);
    size_t n = strlen(cfg) > 6 ? strlen(cfg) - 6 : strlen(cfg);
    snprintf(buf, cap, "%.*s", (int)n, cfg);
    return buf;
}
const char *mp_trainer_loss_type(enum mp_trainer t)
{
    return (unsigned)t < N_TRAINERS ? trainer_rows[t].loss_type : NULL;
}
int mp_trainer_parse(const char *s)
{
    for (size_t i = 0; i < N_TRAINERS; i++)
        if (strcmp(s, trainer_rows[i].name) == 0)
            return (int)i;
    return -1;
}
const char *mp_trainer_names(const char *sep, const char *last)
{
    static char buf[128];
    const char *names[N_TRAINERS];
    for (size_t i = 0; i < N_TRAINERS; i++)
        names[i] = trainer_rows[i].name;
    return mp_join(buf, sizeof buf, names, N_TRAINERS, sep, last);
}
const char *mp_ref_mode_str(enum mp_ref_mode r)
{
    return r == MP_REF_COPY ? "copy" : r == MP_REF_ADAPTER ? "adapter-disabled" : "none";
}

const char *mp_prim_str(enum mp_prim p)
{
    static const char *const n[MP_P_COUNT] = {
#define MP_X(id, name) name,
        MP_PRIMS(MP_X)
#undef MP_X
    };
    return (unsigned)p < MP_P_COUNT ? n[p] : "?";
}
