/* timeline.c — the step's memory as one self-contained SVG (see timeline.h).
 *
 * Two replays of the step: the first counts the allocation/free events and
 * finds the peak and the phase boundaries, the second fills one column per
 * horizontal pixel with the event of largest total in that column (so no peak
 * is lost to downsampling) and keeps every event of the zoom window around the
 * peak.  Everything drawn is computed here from the replay; the picture has no
 * script and no external reference.
 */
#include "timeline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- categories ------------------------------------------------------------------------- */

enum { K_WEIGHTS, K_GRADS, K_OPT, K_ACT, K_AGRAD, K_TMP, K_COMM, K_WS, K_N };

static const struct {
    const char *name, *color;
} CAT[K_N] = {
    [K_WEIGHTS] = {"weights", "#4e79a7"},
    [K_GRADS] = {"gradients", "#f28e2b"},
    [K_OPT] = {"optimizer state", "#76b7b2"},
    [K_ACT] = {"saved activations", "#59a14f"},
    [K_AGRAD] = {"activation gradients", "#edc948"},
    [K_TMP] = {"temporaries", "#e15759"},
    [K_COMM] = {"collective buffers", "#9c755f"}, /* data parallel: buckets, all-gathers, partitions */
    [K_WS] = {"workspace", "#b07aa1"},
};

static int cat_of(enum mp_store s)
{
    switch (s) {
    case MP_ST_PARAM: return K_WEIGHTS;
    case MP_ST_PGRAD: return K_GRADS;
    case MP_ST_OPT_STATE: return K_OPT;
    case MP_ST_INPUT:
    case MP_ST_ACT: return K_ACT;
    case MP_ST_GRAD: return K_AGRAD;
    case MP_ST_TMP:
    case MP_ST_OPT_TMP: return K_TMP;
    case MP_ST_COMM: return K_COMM; /* some persist (DDP buckets), some are transient (all-gathers) */
    case MP_ST_WORKSPACE: return K_WS;
    }
    return K_TMP;
}

/* Labels drawn over the plot get a white outline under their glyphs, so a line or a
 * band crossing them does not make them unreadable. */
#define HALO " stroke=\"#fff\" stroke-width=\"3\" stroke-linejoin=\"round\" paint-order=\"stroke\""

static const char *PHASE_COLOR[] = {"#d9d9d9", "#a6cee3", "#fdbf6f", "#cab2d6", "#b2df8a", "#fb9a99", "#eeeeee",
                                    "#c7e9c0", "#fee391"};
#define N_PHASES (sizeof PHASE_COLOR / sizeof PHASE_COLOR[0])

/* ---- geometry ----------------------------------------------------------------------------- */

#define SVG_W 1200.0
#define PX0 90.0   /* plot left */
#define PX1 1170.0 /* plot right */
#define MY0 78.0   /* main plot top */
#define MY1 420.0  /* main plot bottom */
#define IY0 540.0  /* inset top */
#define IY1 720.0  /* inset bottom */
#define SVG_H 770.0
#define N_COLS 1080 /* one column per pixel of the main plot */
#define INSET_MAX 600
#define INSET_MIN 80

/* ---- the replay ----------------------------------------------------------------------- */

struct span {
    size_t first, last; /* event indices, inclusive */
    enum mp_phase phase;
};

struct splice_span {
    size_t first, last; /* event indices, inclusive */
    int what;           /* SPLICE_REF, SPLICE_KL, SPLICE_GEN or SPLICE_OLD */
};

struct sample {
    uint64_t v[K_N];
    uint64_t total;
    int node;
    enum mp_phase phase;
};

struct tl {
    const struct mp_program *p;
    const struct mp_schedule *sched;
    int pass;
    uint64_t cur[K_N], total;
    size_t n_ev; /* ALLOC/FREE events seen */
    /* pass 1 */
    uint64_t peak;
    size_t peak_ev;
    struct sample peak_s;
    struct span *spans;
    size_t n_spans, cap_spans;
    size_t *op_first;   /* per schedule op: the first event index at or after its begin */
    size_t *op_last;    /* per schedule op: the last event index before its end */
    size_t cur_op;
    bool in_op;
    bool nomem;
    bool comm_seen; /* a data-parallel step: collective buffers in the legend */
    bool step_seen; /* the optimizer's update, at event step_ev (it may allocate nothing) */
    size_t step_ev;
    /* pass 2 */
    size_t total_ev, n_cols;
    struct sample *col;  /* [n_cols] the sample of largest total in each column */
    bool *col_set;
    size_t win0, win1;   /* zoom window [win0, win1) */
    struct sample *win;
    /* the caching allocator's reserved bytes after each event (mp_reserved_series), NULL where
     * it is not simulated */
    uint64_t *reserved;
    uint64_t reserved_peak;
    /* pass 2 fills reserved from the policy step's series (mp_reserved_series), its events only:
     * plus a reference copy's weights; a spliced forward's events hold the reserved bytes before
     * them or the allocated bytes if more (estimate.c ref_phases: its reserved are not modelled) */
    uint64_t *res_policy;
    size_t res_k;
    bool synthetic;
    /* DPO / KTO (mp_trainer_ref_fwds, mp_trainer_kl_fwds): the no-grad forwards compute_loss runs,
     * spliced into the policy's step where the estimator measures them (estimate.c ref_phases):
     * the reference's at the last activation-gradient allocation of the loss before its seed
     * (the policy's graph held), KTO's KL forward of the policy at its first op */
    const struct mp_train_opts *t;
    unsigned ref_passes, kl_passes;
    bool pre_done;            /* GRPO: generation, the old log-probs' and the reference's forwards,
                               * spliced before the policy's first op, on the resident state */
    uint64_t gen_at;          /* GRPO: generation's peak with the reference copy (mp_generation_phase,
                               * made in pass 1, drawn in both) and its event */
    char gen_event[96];
    bool gen_done;
    uint64_t setup_grads;     /* the setup's resident gradients (accumulation), set aside around
                               * them unless generation falls mid-accumulation (a dip, two events) */
    bool grad_dip;
    uint64_t ref_weights;     /* a frozen reference copy's weights, resident from the start */
    uint64_t load_bytes;      /* FSDP2 or ZeRO-3 with a 4-bit base: the model whole on the GPU when
                               * loaded, drawn as one rise and fall before the step's setup */
    size_t ref_at, n_loss_grads; /* the policy event the reference forwards precede (pass 0 counts) */
    bool w_done, kl_done, have_loss;
    int splicing;             /* 0, SPLICE_REF or SPLICE_KL */
    bool sp_started;
    uint64_t sp_net;          /* the splice's allocated bytes not yet freed */
    struct splice_span splice[4]; /* the spliced forwards (at most two reference and one KL) */
    size_t n_splice;
    char peak_label[160];     /* the peak's event name when a splice holds it */
    struct mp_diag *d;
};
enum { SPLICE_REF = 1, SPLICE_KL = 2, SPLICE_GEN = 3, SPLICE_OLD = 4 };
/* Each splice's name in events and the SVG's data-what, and its bracket's label. */
static const struct {
    const char *name, *label;
} SPLICES[] = {[SPLICE_REF] = {"reference.forward", "reference forward (no grad)"},
               [SPLICE_KL] = {"kl.forward", "KL forward (no grad)"},
               [SPLICE_GEN] = {"generate", "generate (its peak)"},
               [SPLICE_OLD] = {"policy.forward", "old log-probs (no grad)"}};

static size_t col_of(const struct tl *s, size_t ev)
{
    return s->total_ev <= s->n_cols ? ev : (size_t)((double)ev * (double)s->n_cols / (double)s->total_ev);
}

/* The phase of event ev (pass 1's spans). */
static enum mp_phase phase_at(const struct tl *s, size_t ev)
{
    for (size_t i = 0; i < s->n_spans; i++)
        if (s->spans[i].first <= ev && ev <= s->spans[i].last)
            return s->spans[i].phase;
    return MP_PH_SETUP;
}

static void record_phase(struct tl *s, enum mp_phase ph)
{
    if (s->n_spans && s->spans[s->n_spans - 1].phase == ph) {
        s->spans[s->n_spans - 1].last = s->n_ev;
        return;
    }
    if (s->n_spans == s->cap_spans) {
        size_t nc = s->cap_spans ? 2 * s->cap_spans : 16;
        struct span *ns = realloc(s->spans, nc * sizeof *ns);
        if (!ns) {
            s->nomem = true;
            return;
        }
        s->spans = ns;
        s->cap_spans = nc;
    }
    s->spans[s->n_spans++] = (struct span){s->n_ev, s->n_ev, ph};
}

static enum mp_status on_event(void *ctx, const struct mp_event *ev)
{
    struct tl *s = ctx;
    if (ev->kind == MP_EV_OP_BEGIN || ev->kind == MP_EV_OP_END) {
        if (s->pass == 1 && ev->id >= 0 && (size_t)ev->id < s->sched->n) {
            if (ev->kind == MP_EV_OP_BEGIN)
                s->op_first[ev->id] = s->n_ev;
            else
                s->op_last[ev->id] = s->n_ev; /* exclusive */
        }
        return MP_OK;
    }
    if (ev->kind == MP_EV_OPT_STEP && s->pass == 1) {
        s->step_seen = true;
        s->step_ev = s->n_ev;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    int k = cat_of(ev->store);
    /* (a synthetic event is the estimate's own sum, added as it adds it: a bf16 reference copy's
     * bytes need not be a multiple of 512) */
    uint64_t r = s->synthetic ? ev->bytes : mp_round512(ev->bytes);
    if (ev->kind == MP_EV_ALLOC) {
        s->cur[k] += r;
        s->total += r;
    } else {
        s->cur[k] -= r;
        s->total -= r;
    }
    struct sample sm = {.total = s->total, .node = ev->node, .phase = ev->phase};
    memcpy(sm.v, s->cur, sizeof sm.v);
    size_t i = s->n_ev;
    if (s->pass == 1) {
        s->comm_seen = s->comm_seen || k == K_COMM;
        record_phase(s, ev->phase);
        if (s->total > s->peak) {
            s->peak = s->total;
            s->peak_ev = i;
            s->peak_s = sm;
            s->peak_label[0] = 0;
        }
    } else if (i < s->total_ev) {
        if (s->reserved) {
            uint64_t prev = i ? s->reserved[i - 1] : 0;
            s->reserved[i] = s->splicing || s->synthetic ? (prev > s->total ? prev : s->total)
                                                        : s->res_policy[s->res_k++] + s->ref_weights;
        }
        size_t c = col_of(s, i);
        if (c < s->n_cols && (!s->col_set[c] || sm.total > s->col[c].total)) {
            s->col[c] = sm;
            s->col_set[c] = true;
        }
        if (i >= s->win0 && i < s->win1)
            s->win[i - s->win0] = sm;
    }
    s->n_ev++;
    return s->nomem ? MP_ERR_NOMEM : MP_OK;
}

/* The phase a splice is drawn in: GRPO's run before the step (generation); DPO's and KTO's
 * reference forward in compute_loss (loss), KTO's KL forward at the forward's start. */
static enum mp_phase splice_phase(const struct tl *s, int what)
{
    if (s->t->ref_before_policy)
        return MP_PH_GENERATE;
    return what == SPLICE_REF || s->p->kl_held_bytes ? MP_PH_LOSS : MP_PH_FORWARD; /* (LLaMA-Factory's KTO: its
                                                                                    KL forward in compute_loss) */
}

/* One event of a spliced no-grad forward: its forward's allocations and frees, in its phase
 * (splice_phase). */
static enum mp_status splice_event(void *ctx, const struct mp_program *p, const struct mp_event *ev)
{
    struct tl *s = ctx;
    if (ev->kind == MP_EV_OP_BEGIN)
        s->sp_started = true;
    if (!s->sp_started || ev->phase != MP_PH_FORWARD || (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE))
        return MP_OK;
    uint64_t r = mp_round512(ev->bytes);
    if (ev->kind == MP_EV_FREE && r > s->sp_net) /* (a tensor of its setup: resident, never freed here) */
        return MP_OK;
    s->sp_net = ev->kind == MP_EV_ALLOC ? s->sp_net + r : s->sp_net - r;
    struct mp_event e = *ev;
    e.phase = splice_phase(s, s->splicing);
    e.node = -1; /* (a node of p, not of the policy's program) */
    uint64_t before = s->peak;
    enum mp_status st = on_event(s, &e);
    if (s->pass == 1 && s->peak > before && ev->kind == MP_EV_ALLOC)
        snprintf(s->peak_label, sizeof s->peak_label, "%s:%s:%s", mp_phase_str(e.phase), SPLICES[s->splicing].name,
                 ev->node >= 0 && (size_t)ev->node < p->n_nodes ? p->nodes[ev->node].name : "?");
    return st;
}

static enum mp_status splice(struct tl *s, int what)
{
    s->splicing = what;
    s->sp_started = false;
    s->sp_net = 0;
    size_t first = s->n_ev;
    struct mp_train_opts rt = *s->t;
    /* (the policy's own weights under autocast: estimate.c old_phase, kl_phase) */
    rt.gen_pass = what == SPLICE_OLD || (what == SPLICE_KL && s->p->kl_held_bytes);
    enum mp_status st = MP_OK;
    if (what == SPLICE_GEN) {
        /* generate.c's peak is arithmetic past the prefill: drawn as one rise to it and back */
        if (!s->gen_done) {
            struct mp_estimate e;
            memset(&e, 0, sizeof e);
            st = mp_generation_phase(s->p, s->t, &e, s->d);
            if (st == MP_OK && !mp_add_u64(e.gen_peak_bytes, s->ref_weights, &s->gen_at))
                st = mp_fail(s->d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", s->p->model->path);
            snprintf(s->gen_event, sizeof s->gen_event, "%s", e.gen_event);
            s->gen_done = st == MP_OK;
        }
        if (st == MP_OK) { /* (a rise of 0 when it stays below what is held: drawn all the same) */
            uint64_t up = s->gen_at > s->total ? s->gen_at - s->total : 0, before = s->peak;
            st = on_event(s, &(struct mp_event){.kind = MP_EV_ALLOC, .store = MP_ST_ACT, .bytes = up, .node = -1,
                                                .phase = MP_PH_GENERATE});
            if (s->pass == 1 && s->peak > before)
                snprintf(s->peak_label, sizeof s->peak_label, "%s", s->gen_event);
            s->sp_net = mp_round512(up);
        }
    } else {
        /* a reference copy under FSDP2 gathered whole for its forward (mp_ref_gather_bytes) */
        uint64_t gather = 0;
        if (what == SPLICE_REF && !mp_ref_gather_bytes(s->p, &rt, &gather))
            st = mp_fail(s->d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", s->p->model->path);
        struct mp_event g = {.kind = MP_EV_ALLOC, .store = MP_ST_COMM, .bytes = gather, .node = -1,
                             .phase = splice_phase(s, what)};
        /* what the trainer holds of the policy's forward beside it (LLaMA-Factory's fp32 logits) */
        struct mp_event h = {.kind = MP_EV_ALLOC, .store = MP_ST_ACT,
                             .bytes = what == SPLICE_REF ? s->p->ref_held_bytes
                                      : what == SPLICE_KL ? s->p->kl_held_bytes : 0,
                             .node = -1, .phase = splice_phase(s, what)};
        bool held = h.bytes > 0;
        if (st == MP_OK && gather)
            st = on_event(s, &g);
        if (st == MP_OK && held)
            st = on_event(s, &h);
        if (st == MP_OK)
            st = mp_replay_nograd_forward(s->p, &rt, what == SPLICE_REF, splice_event, s, s->d);
        g.kind = h.kind = MP_EV_FREE;
        if (st == MP_OK && held)
            st = on_event(s, &h);
        if (st == MP_OK && gather)
            st = on_event(s, &g);
    }
    if (st == MP_OK && s->sp_net) /* what it still holds (its outputs) goes with it */
        st = on_event(s, &(struct mp_event){.kind = MP_EV_FREE, .store = MP_ST_ACT, .bytes = s->sp_net, .node = -1,
                                            .phase = splice_phase(s, what)});
    if (s->n_ev > first && s->n_splice < sizeof s->splice / sizeof s->splice[0]) {
        s->splice[s->n_splice].first = first;
        s->splice[s->n_splice].last = s->n_ev - 1;
        s->splice[s->n_splice++].what = what;
    }
    s->splicing = 0;
    return st;
}

/* The policy's step, with the no-grad forwards a DPO/KTO step runs spliced in. */
static enum mp_status on_policy_event(void *ctx, const struct mp_event *ev)
{
    struct tl *s = ctx;
    enum mp_status st = MP_OK;
    if (!s->w_done) {
        s->w_done = true;
        s->synthetic = true;
        if (s->load_bytes) {
            struct mp_event l = {.kind = MP_EV_ALLOC, .store = MP_ST_PARAM, .bytes = s->load_bytes, .node = -1,
                                 .phase = MP_PH_LOAD};
            uint64_t before = s->peak;
            st = on_event(s, &l);
            if (s->pass == 1 && s->peak > before)
                snprintf(s->peak_label, sizeof s->peak_label, "load:from_pretrained");
            l.kind = MP_EV_FREE;
            if (st == MP_OK)
                st = on_event(s, &l);
        }
        if (s->ref_weights)
            st = on_event(s, &(struct mp_event){.kind = MP_EV_ALLOC, .store = MP_ST_PARAM, .bytes = s->ref_weights,
                                                .node = -1, .phase = MP_PH_SETUP});
        s->synthetic = false;
    }
    if (ev->kind == MP_EV_ALLOC && ev->phase == MP_PH_SETUP && ev->store == MP_ST_PGRAD)
        s->setup_grads += mp_round512(ev->bytes);
    /* GRPO: _generate_and_score_completions, then the step, before the forward's first op; the
     * accumulated gradients are not there unless generation falls mid-accumulation */
    if (st == MP_OK && s->t->ref_before_policy && !s->pre_done && ev->kind == MP_EV_OP_BEGIN) {
        s->pre_done = true;
        s->grad_dip = !s->t->gen_grads && s->setup_grads;
        s->synthetic = true;
        if (s->grad_dip)
            st = on_event(s, &(struct mp_event){.kind = MP_EV_FREE, .store = MP_ST_PGRAD, .bytes = s->setup_grads,
                                                .node = -1, .phase = MP_PH_GENERATE});
        s->synthetic = false;
        if (s->t->gen_steps)
            st = splice(s, SPLICE_GEN);
        if (st == MP_OK && s->t->old_logps)
            st = splice(s, SPLICE_OLD);
        if (st == MP_OK && s->t->ref != MP_REF_NONE)
            st = splice(s, SPLICE_REF);
        s->synthetic = true;
        if (st == MP_OK && s->grad_dip)
            st = on_event(s, &(struct mp_event){.kind = MP_EV_ALLOC, .store = MP_ST_PGRAD, .bytes = s->setup_grads,
                                                .node = -1, .phase = MP_PH_SETUP});
        s->synthetic = false;
    }
    if (st == MP_OK && s->kl_passes && !s->kl_done && ev->kind == MP_EV_OP_BEGIN && !s->p->kl_held_bytes) {
        s->kl_done = true;
        for (unsigned i = 0; i < s->kl_passes && st == MP_OK; i++)
            st = splice(s, SPLICE_KL);
    }
    if (ev->kind == MP_EV_LOSS_GRAD)
        s->have_loss = true;
    if (st == MP_OK && ev->kind == MP_EV_ALLOC && ev->phase == MP_PH_LOSS && ev->store == MP_ST_GRAD && !s->have_loss &&
        s->ref_passes && ++s->n_loss_grads == s->ref_at) {
        /* LLaMA-Factory's KTO: the policy's KL forward first, at the same point (estimate.c kl_phase) */
        for (unsigned i = 0; s->p->kl_held_bytes && i < s->kl_passes && st == MP_OK; i++)
            st = splice(s, SPLICE_KL);
        for (unsigned i = 0; i < s->ref_passes && st == MP_OK; i++)
            st = splice(s, SPLICE_REF);
    }
    return st == MP_OK ? on_event(s, ev) : st;
}

/* Pass 0: which activation-gradient allocation of the loss is the last before its seed. */
static enum mp_status count_loss_grads(void *ctx, const struct mp_event *ev)
{
    struct tl *s = ctx;
    if (ev->kind == MP_EV_LOSS_GRAD)
        s->have_loss = true;
    if (ev->kind == MP_EV_ALLOC && ev->phase == MP_PH_LOSS && ev->store == MP_ST_GRAD && !s->have_loss)
        s->ref_at++;
    return MP_OK;
}

/* ---- SVG helpers ------------------------------------------------------------------------ */

void mp_xml_puts(FILE *out, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        unsigned c = *u;
        size_t n = mp_utf8_seq_len((const char *)u);
        bool ok = n > 0;
        if (!ok || (n == 1 && c < 0x20 && c != '\t') || c == 0x7F) {
            fputc('?', out);
            u++;
            continue;
        }
        if (n == 2 && c == 0xC2 && u[1] < 0xA0) { /* a C1 control (XML 1.0 discourages them) */
            fputc('?', out);
            u += 2;
            continue;
        }
        if (n > 1) {
            fwrite(u, 1, n, out);
            u += n;
            continue;
        }
        switch (c) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&apos;", out); break;
        default: fputc((int)c, out);
        }
        u++;
    }
}

static void text(FILE *out, double x, double y, const char *anchor, const char *style, const char *s)
{
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s%s%s>", x, y, anchor, style ? " " : "",
            style ? style : "", "");
    mp_xml_puts(out, s);
    fputs("</text>\n", out);
}

/* A round grid step (1, 2 or 5 times a power of ten of a binary unit) for about 5 lines up to top. */
static uint64_t grid_step(uint64_t top)
{
    uint64_t unit = 1;
    while (unit <= UINT64_MAX / 1024 && top / (unit * 1024) >= 5)
        unit *= 1024;
    uint64_t raw = top / 5 / unit + 1, m = 1;
    while (m <= UINT64_MAX / 10 && m * 10 <= raw)
        m *= 10;
    uint64_t f = raw <= m ? 1 : raw <= 2 * m ? 2 : raw <= 5 * m ? 5 : 10;
    uint64_t step = f * m;
    return step > UINT64_MAX / unit ? UINT64_MAX / 4 : step * unit;
}

struct axis {
    double y0, y1;        /* pixel top and bottom */
    uint64_t lo, hi;      /* bytes at bottom and top */
};

static double ypx(const struct axis *a, uint64_t b)
{
    if (b <= a->lo)
        return a->y1;
    double f = (double)(b - a->lo) / (double)(a->hi - a->lo);
    if (f > 1.05)
        f = 1.05;
    return a->y1 - f * (a->y1 - a->y0);
}

/* Horizontal grid lines with labels in one unit, the largest binary unit the top reaches,
 * at a round step of it (1, 2 or 5 times a power of ten): "13.4 GiB, 13.5 GiB", not
 * "13.38 GiB, 13.48 GiB" or "1000.00 MiB, 1.95 GiB". */
static void grid(FILE *out, const struct axis *a)
{
    static const char *UNIT[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (u < 6 && a->hi >> (10 * (u + 1)) != 0)
        u++;
    double unit = ldexp(1.0, 10 * u), lo = (double)a->lo / unit, hi = (double)a->hi / unit;
    double raw = (hi - lo) / 5, m = pow(10, floor(log10(raw > 0 ? raw : 1)));
    double step = raw <= m ? m : raw <= 2 * m ? 2 * m : raw <= 5 * m ? 5 * m : 10 * m;
    if (u == 0 && step < 1)
        step = 1; /* whole bytes */
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    for (double k = ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; k += 1) {
        double v = k * step;
        char lbl[32];
        double y = ypx(a, (uint64_t)llround(v * unit));
        if (k == 0)
            snprintf(lbl, sizeof lbl, "0 B");
        else
            snprintf(lbl, sizeof lbl, "%.*f %s", dec, v, UNIT[u]);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", PX0, y, PX1, y);
        text(out, PX0 - 6, y + 4, "end", "class=\"grid\" font-size=\"11\" fill=\"#555\"", lbl);
    }
}

/* Stacked step areas of n samples s[] over x in [xa, xb); base bytes under category 0. */
static void stack(FILE *out, const struct sample *s, const bool *set, size_t n, double xa, double xb, uint64_t base,
                  const struct axis *a, const char *clip)
{
    double w = (xb - xa) / (double)(n ? n : 1);
    for (int k = 0; k < K_N; k++) {
        bool any = false;
        for (size_t c = 0; c < n && !any; c++)
            any = (!set || set[c]) && s[c].v[k];
        if (!any)
            continue;
        fprintf(out, "<path class=\"cat\" data-category=\"%s\" fill=\"%s\"%s%s%s d=\"", CAT[k].name, CAT[k].color,
                clip ? " clip-path=\"url(#" : "", clip ? clip : "", clip ? ")\"" : "");
        /* top edge left to right, bottom edge right to left */
        uint64_t lo = 0, hi = 0;
        double last_y = -1;
        for (size_t c = 0; c < n; c++) {
            if (!set || set[c]) {
                lo = base;
                for (int j = 0; j < k; j++)
                    lo += s[c].v[j];
                hi = lo + s[c].v[k];
            }
            double y = ypx(a, hi);
            if (c == 0)
                fprintf(out, "M%.1f %.1fV%.1f", xa, ypx(a, lo), y);
            else if (y != last_y)
                fprintf(out, "V%.1f", y);
            fprintf(out, "H%.1f", xa + w * (double)(c + 1));
            last_y = y;
        }
        last_y = -1;
        for (size_t c = n; c-- > 0;) {
            size_t cc = c;
            while (set && !set[cc] && cc > 0)
                cc--;
            lo = base;
            if (!set || set[cc])
                for (int j = 0; j < k; j++)
                    lo += s[cc].v[j];
            double y = ypx(a, lo);
            if (y != last_y)
                fprintf(out, "V%.1f", y);
            fprintf(out, "H%.1f", xa + w * (double)c);
            last_y = y;
        }
        fputs("Z\"/>\n", out);
    }
}

static void event_name(const struct mp_program *p, const struct sample *s, char *buf, size_t len)
{
    if (s->node >= 0 && (size_t)s->node < p->n_nodes)
        snprintf(buf, len, "%s:%s", mp_phase_str(s->phase), p->nodes[s->node].name);
    else
        snprintf(buf, len, "%s", mp_phase_str(s->phase));
}

static const char *block_name(const struct mp_program *p, size_t i, char *buf, size_t len)
{
    if (p->model && i < p->model->n_blocks && p->model->blocks[i].name[0])
        snprintf(buf, len, "%s", p->model->blocks[i].name);
    else
        snprintf(buf, len, "block %zu", i);
    return buf;
}

/* The box a line of text takes, from its font size (DejaVu Sans averages about 0.6 em a
 * character): labels that would overlap are moved apart. */
struct box {
    double x0, x1, y0, y1;
};

static struct box box_of(double x, double y, const char *anchor, double size, const char *s)
{
    double w = 0.6 * size * (double)strlen(s);
    double x0 = !strcmp(anchor, "end") ? x - w : !strcmp(anchor, "middle") ? x - w / 2 : x;
    struct box b = {x0, x0 + w, y - size, y + size * 0.25};
    return b;
}

static bool boxes_meet(const struct box *a, const struct box *b)
{
    return a->x0 < b->x1 && b->x0 < a->x1 && a->y0 < b->y1 && b->y0 < a->y1;
}

/* One legend entry at (*lx, *ly), wrapping to a new row at the plot's right edge. */
static void legend_item(FILE *out, double *lx, double *ly, const char *attrs, const char *fill, const char *label)
{
    double w = 28 + 6.4 * (double)strlen(label);
    if (*lx + w > PX1) {
        *lx = PX0;
        *ly += 16;
    }
    fprintf(out, "<rect%s x=\"%.1f\" y=\"%.1f\" width=\"10\" height=\"10\" fill=\"%s\" stroke=\"#888\" "
                 "stroke-width=\"0.5\"/>\n",
            attrs, *lx, *ly - 9, fill);
    text(out, *lx + 14, *ly, "start", "font-size=\"11\"", label);
    *lx += w;
}

/* ---- the picture -------------------------------------------------------------------------- */

/* The main plot's scale, which every part of the picture draws on. */
struct plot {
    uint64_t ctx;    /* the CUDA context under the stack (0: allocated bytes only) */
    uint64_t usable; /* the capacity less the margin (0: no capacity) */
    struct axis a;   /* bytes to pixels */
    double pw, evw;  /* the plot's width, and an event's */
};

#define XEV(e) (PX0 + evw * (double)(e))

/* The document's head: its size, the hatch pattern, the inset's clip, the title. */
static void draw_head(FILE *out, const struct tl *s, const struct mp_timeline_opts *o, double pw)
{
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                 "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" data-events=\"%zu\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H, s->total_ev);
    fputs("<title>", out);
    mp_xml_puts(out, o->title ? o->title : "memplan timeline");
    fputs("</title>\n", out);
    fprintf(out, "<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
                 "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#000\" fill-opacity=\"0.06\"/>"
                 "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#555\" stroke-opacity=\"0.35\" "
                 "stroke-width=\"2\"/></pattern>\n"
                 "<clipPath id=\"inset-clip\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>"
                 "</defs>\n",
            PX0, IY0, pw, IY1 - IY0);
    fputs("<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n", out);
    text(out, PX0, 22, "start", "font-size=\"16\" font-weight=\"bold\"", o->title ? o->title : "memplan timeline");
    if (o->subtitle)
        text(out, PX0, 40, "start", "font-size=\"12\" fill=\"#444\"", o->subtitle);
}

/* The phase bands above the plot, one label per phase, and the mark of an optimizer step that
 * allocates nothing. */
static void draw_phases(FILE *out, const struct tl *s, double evw)
{
    /* phase bands above the plot */
    for (size_t i = 0; i < s->n_spans; i++) {
        const struct span *sp = &s->spans[i];
        double x = XEV(sp->first), w = evw * (double)(sp->last + 1 - sp->first);
        const char *col = (size_t)sp->phase < N_PHASES ? PHASE_COLOR[sp->phase] : "#eee";
        fprintf(out, "<rect class=\"phase\" data-phase=\"%s\" data-first-event=\"%zu\" data-last-event=\"%zu\" "
                     "x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"14\" fill=\"%s\"/>\n",
                mp_phase_str(sp->phase), sp->first, sp->last, x, MY0 - 24, w, col);
        if (sp->phase == MP_PH_RECOMPUTE)
            fprintf(out, "<rect class=\"recompute\" data-first-event=\"%zu\" data-last-event=\"%zu\" x=\"%.2f\" "
                         "y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"url(#hatch)\"/>\n",
                    sp->first, sp->last, x, MY0, w, MY1 - MY0);
    }
    /* one label per phase, on its widest band */
    for (size_t ph = 0; ph < N_PHASES; ph++) {
        double best = 0, bx = 0;
        for (size_t i = 0; i < s->n_spans; i++)
            if ((size_t)s->spans[i].phase == ph && evw * (double)(s->spans[i].last + 1 - s->spans[i].first) > best) {
                best = evw * (double)(s->spans[i].last + 1 - s->spans[i].first);
                bx = XEV(s->spans[i].first) + best / 2;
            }
        if (best >= 40)
            text(out, bx, MY0 - 13, "middle", "font-size=\"10\" fill=\"#222\"", mp_phase_str((enum mp_phase)ph));
    }

    /* the no-grad forwards a DPO/KTO/GRPO step runs: a bracket under the phase band */
    for (size_t i = 0; i < s->n_splice; i++) {
        const struct splice_span *sp = &s->splice[i];
        const char *what = SPLICES[sp->what].name;
        double x = XEV(sp->first), w = evw * (double)(sp->last + 1 - sp->first);
        fprintf(out, "<rect class=\"splice\" data-what=\"%s\" data-first-event=\"%zu\" data-last-event=\"%zu\" "
                     "x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"6\" fill=\"#555\"/>\n",
                what, sp->first, sp->last, x, MY0 - 8, w);
        if (w >= 60)
            text(out, x + w / 2, MY0 + 10, "middle", "font-size=\"10\" fill=\"#333\"" HALO, SPLICES[sp->what].label);
    }

    /* an optimizer step that allocates nothing (DeepSpeed's fused Adam) has no band: a mark */
    bool step_band = false;
    for (size_t i = 0; i < s->n_spans; i++)
        step_band = step_band || s->spans[i].phase == MP_PH_STEP;
    if (s->step_seen && !step_band) {
        double x = XEV(s->step_ev);
        fprintf(out, "<line class=\"step-mark\" data-event=\"%zu\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                     "stroke=\"#d62728\" stroke-width=\"1.5\" stroke-dasharray=\"4 2\"/>\n",
                s->step_ev, x, MY0 - 24, x, MY1 + 4);
        /* under the axis, where block names (forward, on the left) do not reach */
        text(out, x - 4, MY1 + 14, "end", "font-size=\"10\" fill=\"#a00\"" HALO, "optimizer.step (allocates nothing)");
    }
}

/* The grid, the CUDA context, the stacked categories, the block ticks and the axes. */
static void draw_plot(FILE *out, const struct tl *s, const struct plot *v)
{
    const struct mp_program *p = s->p;
    char buf[256];
    uint64_t ctx = v->ctx;
    struct axis a = v->a;
    double pw = v->pw, evw = v->evw;
    grid(out, &a);
    if (ctx) {
        double y = ypx(&a, ctx);
        fprintf(out, "<rect class=\"context\" data-bytes=\"%llu\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                     "fill=\"#bbbbbb\"/>\n",
                (unsigned long long)ctx, PX0, y, pw, MY1 - y);
    }
    stack(out, s->col, s->col_set, s->n_cols, PX0, PX0 + (s->total_ev <= s->n_cols ? evw * (double)s->n_cols : pw),
          ctx, &a, NULL);
    /* block ticks: each block's first forward, labelled where there is room */
    double last_lbl = -1e9;
    for (size_t k = 0; k < s->sched->n; k++) {
        const struct mp_sched_op *op = &s->sched->ops[k];
        if (op->kind == MP_SCHED_B || op->kind == MP_SCHED_LOSS)
            continue;
        bool first = true;
        for (size_t j = 0; j < k && first; j++)
            first = !(s->sched->ops[j].index == op->index && s->sched->ops[j].kind != MP_SCHED_B &&
                      s->sched->ops[j].kind != MP_SCHED_LOSS);
        if (!first)
            continue;
        double x = XEV(s->op_first[k]);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", x, MY1, x, MY1 + 4);
        /* level, from the tick, where it clears the label before and the plot's end
         * (rotated, a long name such as encoder.block.4 ran into the legend) */
        block_name(p, op->index, buf, 64);
        struct box b = box_of(x + 2, MY1 + 14, "start", 10, buf);
        if (b.x0 >= last_lbl + 10 && b.x1 <= PX1) {
            text(out, x + 2, MY1 + 14, "start", "class=\"block\" font-size=\"10\" fill=\"#444\"", buf);
            last_lbl = b.x1;
        }
    }
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", PX0, MY1, PX1, MY1);
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", PX0, MY0, PX0, MY1);
    text(out, 16, (MY0 + MY1) / 2, "middle", "font-size=\"11\" fill=\"#444\" transform=\"rotate(-90 16 249)\"",
         ctx ? "device memory (allocated + CUDA context)" : "allocated bytes");
}

/* The target lines (capacity, usable); their labels' boxes, which the peak's label keeps clear of,
 * go into lbl: how many. */
static size_t draw_targets(FILE *out, const struct mp_timeline_opts *o, const struct plot *v, struct box lbl[2])
{
    char b1[32], buf[256];
    uint64_t usable = v->usable;
    struct axis a = v->a;
    size_t n_lbl = 0;
    if (o->capacity_bytes) {
        double y = ypx(&a, o->capacity_bytes);
        fprintf(out, "<line id=\"capacity\" data-bytes=\"%llu\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                     "stroke=\"#c00\" stroke-width=\"1.5\"/>\n",
                (unsigned long long)o->capacity_bytes, PX0, y, PX1, y);
        snprintf(buf, sizeof buf, "capacity %s", mp_fmt_bytes(o->capacity_bytes, b1, sizeof b1));
        text(out, PX1 - 4, y - 4, "end", "font-size=\"11\" fill=\"#c00\"" HALO, buf);
        lbl[n_lbl++] = box_of(PX1 - 4, y - 4, "end", 11, buf);
        double yu = ypx(&a, usable);
        fprintf(out, "<line id=\"usable\" data-bytes=\"%llu\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                     "stroke=\"#e67e00\" stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/>\n",
                (unsigned long long)usable, PX0, yu, PX1, yu);
        snprintf(buf, sizeof buf, "usable with a %.1f%% margin %s", 100.0 * o->margin, mp_fmt_bytes(usable, b1, sizeof b1));
        text(out, PX1 - 4, yu + 12, "end", "font-size=\"11\" fill=\"#b35f00\"" HALO, buf);
        lbl[n_lbl++] = box_of(PX1 - 4, yu + 12, "end", 11, buf);
    }
    return n_lbl;
}

/* The largest of v[i .. i + per), within its n: one point of a curve downsampled to columns. */
static uint64_t run_max(const uint64_t *v, size_t i, size_t per, size_t n)
{
    uint64_t m = 0;
    for (size_t j = i; j < i + per && j < n; j++)
        m = v[j] > m ? v[j] : m;
    return m;
}

/* The probe's measured curve, and where a probe that ran out of memory stopped. */
static void draw_measured(FILE *out, const struct tl *s, const struct mp_timeline_opts *o, const struct plot *v)
{
    uint64_t ctx = v->ctx;
    struct axis a = v->a;
    double pw = v->pw, evw = v->evw;
    if (o->measured && o->n_measured) {
        fprintf(out, "<polyline id=\"measured\" fill=\"none\" stroke=\"#000\" stroke-width=\"1.4\" "
                     "stroke-dasharray=\"3 2\" points=\"");
        size_t n = o->n_measured;
        /* on the replay's event axis: a probe that ran out of memory stops where it did */
        double w = n <= s->total_ev ? evw : pw / (double)n;
        size_t per = n > N_COLS ? (n + N_COLS - 1) / N_COLS : 1;
        for (size_t i = 0; i < n; i += per)
            fprintf(out, "%.1f,%.1f ", PX0 + w * (double)i, ypx(&a, run_max(o->measured, i, per, n) + ctx));
        uint64_t mp = 0;
        for (size_t i = 0; i < n; i++)
            mp = o->measured[i] > mp ? o->measured[i] : mp;
        fprintf(out, "\" data-peak-bytes=\"%llu\" data-events=\"%zu\"/>\n", (unsigned long long)mp, n);
        if (n < s->total_ev) { /* the probe stopped early: out of memory */
            double x = XEV(n), y = ypx(&a, o->measured[n - 1] + ctx);
            fprintf(out, "<path class=\"probe-stop\" d=\"M%.1f %.1fl8 -8m-8 0l8 8\" stroke=\"#000\" stroke-width=\"2\" "
                         "transform=\"translate(-4 4)\"/>\n",
                    x, y);
            text(out, x + 8, y - 10, "start", "font-size=\"11\"" HALO, "the probe stopped here: out of memory");
        }
    }
}

/* The caching allocator's reserved bytes (simulated), a line over the stack: per column, the
 * largest of its events. */
static void draw_reserved(FILE *out, const struct tl *s, const struct plot *v)
{
    if (!s->reserved)
        return;
    size_t n = s->total_ev, per = n > N_COLS ? (n + N_COLS - 1) / N_COLS : 1;
    double w = v->evw;
    fprintf(out, "<polyline id=\"reserved\" fill=\"none\" stroke=\"#8b1a1a\" stroke-width=\"1.3\" points=\"");
    for (size_t i = 0; i < n; i += per)
        fprintf(out, "%.1f,%.1f ", PX0 + w * (double)i, ypx(&v->a, run_max(s->reserved, i, per, n) + v->ctx));
    fprintf(out, "\" data-peak-bytes=\"%llu\" data-events=\"%zu\"/>\n", (unsigned long long)s->reserved_peak, n);
}

/* The peak: a dot at the peak event, its label (ev) beside it, clear of the n_lbl boxes lbl. */
static void draw_peak(FILE *out, const struct tl *s, const struct plot *v, const char *ev, const struct box *lbl,
                      size_t n_lbl)
{
    char b1[32], buf[256];
    uint64_t ctx = v->ctx;
    struct axis a = v->a;
    double pw = v->pw, evw = v->evw;
    double px = XEV(s->peak_ev) + evw / 2, py = ypx(&a, s->peak + ctx);
    fprintf(out, "<g id=\"peak\" data-bytes=\"%llu\" data-event=\"%zu\" data-label=\"", (unsigned long long)s->peak,
            s->peak_ev);
    mp_xml_puts(out, ev);
    fprintf(out, "\">\n<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" stroke-dasharray=\"2 2\"/>\n"
                 "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#000\"/>\n",
            px, py, px, MY1, px, py);
    snprintf(buf, sizeof buf, "peak %s allocated at %s", mp_fmt_bytes(s->peak, b1, sizeof b1), ev);
    /* above the dot, on the side with more room; else the other side; else below */
    bool left = px > PX0 + pw * 0.6;
    double ya = py - 8 < MY0 + 10 ? MY0 + 12 : py - 8, yb = py + 20 < MY1 - 4 ? py + 20 : MY1 - 4;
    struct {
        double x, y;
        const char *anchor;
    } at[4] = {{left ? px - 8 : px + 8, ya, left ? "end" : "start"},
               {left ? px + 8 : px - 8, ya, left ? "start" : "end"},
               {left ? px - 8 : px + 8, yb, left ? "end" : "start"},
               {left ? px + 8 : px - 8, yb, left ? "start" : "end"}};
    size_t pick = 0;
    for (size_t c = 0; c < 4; c++) {
        struct box b = box_of(at[c].x, at[c].y, at[c].anchor, 12, buf);
        bool clear = b.x0 >= PX0 - 60 && b.x1 <= PX1 + 20;
        for (size_t i = 0; i < n_lbl && clear; i++)
            clear = !boxes_meet(&b, &lbl[i]);
        if (clear) {
            pick = c;
            break;
        }
    }
    text(out, at[pick].x, at[pick].y, at[pick].anchor, "font-size=\"12\" font-weight=\"bold\"" HALO, buf);
    fputs("</g>\n", out);
}

/* The legend: each category at the peak, then the other marks. */
static void draw_legend(FILE *out, const struct tl *s, const struct mp_timeline_opts *o, uint64_t ctx)
{
    char b1[32], buf[256];
    double lx = PX0, ly = 476;
    uint64_t nccl = o->nccl_bytes <= ctx ? o->nccl_bytes : 0;
    for (int k = 0; k < K_N; k++) {
        if (k == K_COMM && !s->comm_seen)
            continue;
        char attrs[128];
        snprintf(attrs, sizeof attrs, " class=\"legend\" data-category=\"%s\" data-bytes-at-peak=\"%llu\"", CAT[k].name,
                 (unsigned long long)s->peak_s.v[k]);
        snprintf(buf, sizeof buf, "%s %s", CAT[k].name, mp_fmt_bytes(s->peak_s.v[k], b1, sizeof b1));
        legend_item(out, &lx, &ly, attrs, CAT[k].color, buf);
    }
    if (ctx && nccl) {
        char b2[32];
        snprintf(buf, sizeof buf, "CUDA context %s (NCCL's buffers %s of it)", mp_fmt_bytes(ctx, b1, sizeof b1),
                 mp_fmt_bytes(nccl, b2, sizeof b2));
        legend_item(out, &lx, &ly, "", "#bbbbbb", buf);
    } else if (ctx) {
        snprintf(buf, sizeof buf, "CUDA context %s", mp_fmt_bytes(ctx, b1, sizeof b1));
        legend_item(out, &lx, &ly, "", "#bbbbbb", buf);
    }
    bool recomputes = false;
    for (size_t i = 0; i < s->n_spans; i++)
        recomputes = recomputes || s->spans[i].phase == MP_PH_RECOMPUTE;
    if (recomputes)
        legend_item(out, &lx, &ly, " class=\"legend-recompute\"", "url(#hatch)", "recomputed forward");
    if (o->measured && o->n_measured) {
        uint64_t mp = 0;
        for (size_t i = 0; i < o->n_measured; i++)
            mp = o->measured[i] > mp ? o->measured[i] : mp;
        snprintf(buf, sizeof buf, "measured by the probe (dashed), peak %s", mp_fmt_bytes(mp, b1, sizeof b1));
        legend_item(out, &lx, &ly, "", "#000", buf);
    }
    if (s->reserved) {
        snprintf(buf, sizeof buf, "reserved, simulated (line): peak %s",
                 mp_fmt_bytes(s->reserved_peak, b1, sizeof b1));
        legend_item(out, &lx, &ly, " class=\"legend-reserved\"", "#8b1a1a", buf);
    }
}

/* The zoom on the events around the peak (ev: the peak event's name). */
static void draw_inset(FILE *out, const struct tl *s, const struct plot *v, const char *ev)
{
    const struct mp_program *p = s->p;
    char b2[32], buf[256];
    double pw = v->pw, evw = v->evw;
    size_t wn = s->win1 - s->win0;
    uint64_t wmin = UINT64_MAX, wmax = 0;
    for (size_t i = 0; i < wn; i++) {
        wmin = s->win[i].total < wmin ? s->win[i].total : wmin;
        wmax = s->win[i].total > wmax ? s->win[i].total : wmax;
    }
    uint64_t span = wmax - wmin;
    uint64_t lo = span * 2 < wmax && wmin > span ? wmin - span : 0; /* zoom in vertically when it helps */
    if (lo) {
        uint64_t st = grid_step(wmax - lo);
        lo = lo / st * st;
    }
    struct axis ia = {IY0, IY1, lo, wmax + (wmax - lo) / 8 + 1};
    fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"none\" stroke=\"#000\" "
                 "stroke-dasharray=\"4 3\"/>\n",
            XEV(s->win0), MY0, evw * (double)wn, MY1 - MY0);
    snprintf(buf, sizeof buf, "zoom: events %zu to %zu of %zu around the peak%s", s->win0, s->win1 - 1, s->total_ev,
             lo ? " (y axis does not start at 0)" : "");
    text(out, PX0, IY0 - 10, "start", "font-size=\"12\" font-weight=\"bold\" fill=\"#333\"", buf);
    fprintf(out, "<g id=\"inset\" data-first-event=\"%zu\" data-last-event=\"%zu\">\n", s->win0, s->win1 - 1);
    grid(out, &ia);
    stack(out, s->win, NULL, wn, PX0, PX1, 0, &ia, "inset-clip");
    double iw = pw / (double)(wn ? wn : 1);
    /* the schedule ops that start inside the window; a forward after the loss is a recompute */
    size_t loss_op = s->sched->n;
    for (size_t k = 0; k < s->sched->n && loss_op == s->sched->n; k++)
        if (s->sched->ops[k].kind == MP_SCHED_LOSS)
            loss_op = k;
    double last_lbl = -1e9;
    for (size_t k = 0; k < s->sched->n; k++) {
        if (s->op_first[k] < s->win0 || s->op_first[k] >= s->win1)
            continue;
        const struct mp_sched_op *op = &s->sched->ops[k];
        double x = PX0 + iw * (double)(s->op_first[k] - s->win0);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555\" stroke-dasharray=\"2 3\"/>\n",
                x, IY0, x, IY1);
        if (x - last_lbl >= 90) {
            static const char *kn[] = {"forward (no grad)", "forward (checkpoint)", "forward", "loss", "backward"};
            char bn[64];
            bool again = k > loss_op && op->kind != MP_SCHED_B;
            /* a recompute right before its block's backward starts with the backward of the
             * block's trailing nodes (docs/checkpointing.md#early-stop) */
            bool bwd_first = again && phase_at(s, s->op_first[k]) == MP_PH_BACKWARD;
            const char *what = bwd_first ? "backward+recompute" : again ? "recompute" : kn[op->kind];
            snprintf(buf, sizeof buf, "%s %s", what,
                     op->kind == MP_SCHED_LOSS ? "" : block_name(p, op->index, bn, sizeof bn));
            char style[96];
            snprintf(style, sizeof style, "class=\"op\" data-event=\"%zu\" font-size=\"10\" fill=\"#444\"",
                     s->op_first[k]);
            text(out, x + 3, IY1 + 14, "start", style, buf);
            last_lbl = x;
        }
    }
    double ipx = PX0 + iw * ((double)(s->peak_ev - s->win0) + 0.5);
    double ipy = ypx(&ia, s->peak);
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" stroke-dasharray=\"2 2\"/>\n"
                 "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#000\"/>\n",
            ipx, ipy, ipx, IY1, ipx, ipy);
    snprintf(buf, sizeof buf, "%s (%s B)", ev, (snprintf(b2, sizeof b2, "%llu", (unsigned long long)s->peak), b2));
    bool left = ipx > PX0 + pw * 0.6;
    text(out, left ? ipx - 6 : ipx + 6, ipy - 6 < IY0 + 10 ? IY0 + 12 : ipy - 6, left ? "end" : "start",
         "font-size=\"11\"" HALO, buf);
    fputs("</g>\n", out);
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", PX0, IY1, PX1, IY1);
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", PX0, IY0, PX0, IY1);
    (void)b2;
}
#undef XEV

static void draw(FILE *out, struct tl *s, const struct mp_timeline_opts *o)
{
    uint64_t ctx = o->context_bytes;
    uint64_t top = s->peak + ctx;
    uint64_t usable = o->capacity_bytes ? (uint64_t)((double)o->capacity_bytes * (1.0 - o->margin)) : 0;
    if (o->capacity_bytes > top)
        top = o->capacity_bytes;
    if (s->reserved && s->reserved_peak + ctx > top)
        top = s->reserved_peak + ctx;
    if (o->measured)
        for (size_t i = 0; i < o->n_measured; i++)
            if (o->measured[i] + ctx > top)
                top = o->measured[i] + ctx;
    top += top / 10 + 1;
    double pw = PX1 - PX0;
    struct plot v = {ctx, usable, {MY0, MY1, 0, top}, pw, pw / (double)(s->total_ev ? s->total_ev : 1)};
    draw_head(out, s, o, v.pw);
    draw_phases(out, s, v.evw);
    draw_plot(out, s, &v);
    struct box lbl[2];
    size_t n_lbl = draw_targets(out, o, &v, lbl);
    draw_measured(out, s, o, &v);
    draw_reserved(out, s, &v);
    char ev[160];
    if (s->peak_label[0])
        snprintf(ev, sizeof ev, "%s", s->peak_label);
    else
        event_name(s->p, &s->peak_s, ev, sizeof ev);
    draw_peak(out, s, &v, ev, lbl, n_lbl);
    draw_legend(out, s, o, ctx);
    draw_inset(out, s, &v, ev);
    text(out, PX1, SVG_H - 8, "end", "font-size=\"10\" fill=\"#777\"",
         "x: the step's allocations and frees in order (one event per alloc/free); memplan " MEMPLAN_VERSION);
    fputs("</svg>\n", out);
}

enum mp_status mp_timeline_svg(FILE *out, const struct mp_program *p, const struct mp_schedule *sched,
                               const struct mp_train_opts *t, const struct mp_timeline_opts *o, struct mp_diag *d)
{
    struct mp_schedule none;
    mp_schedule_init(&none);
    struct tl s = {.p = p, .pass = 1};
    enum mp_status st = MP_OK;
    if (!sched) {
        if (mp_ckpt_schedule_none(p->n_blocks, &none) != MP_OK) {
            st = mp_fail(d, MP_ERR_NOMEM, "out of memory drawing the timeline");
            goto out;
        }
        sched = &none;
    }
    s.sched = sched;
    s.op_first = calloc(sched->n ? sched->n : 1, sizeof *s.op_first);
    s.op_last = calloc(sched->n ? sched->n : 1, sizeof *s.op_last);
    if (!s.op_first || !s.op_last) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory drawing the timeline");
        goto out;
    }
    s.t = t;
    s.d = d;
    s.ref_passes = t->ref != MP_REF_NONE && !t->ref_before_policy ? mp_trainer_ref_fwds(p->opts.trainer) : 0;
    s.kl_passes = mp_trainer_kl_fwds(p->opts.trainer);
    if (!mp_ref_weights_bytes(p, t, &s.ref_weights)) {
        st = mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
        goto out;
    }
    if (t->par && mp_par_sharded_params(t->par->strategy) && mp_program_base_quant(p)) {
        struct mp_estimate le;
        if ((st = mp_estimate_static(p, t, &le, d)) != MP_OK)
            goto out;
        s.load_bytes = le.load_bytes;
        mp_estimate_release(&le);
    }
    if (s.ref_passes && (st = mp_replay(p, sched, t, count_loss_grads, &s, d)) != MP_OK)
        goto out;
    s.have_loss = false;
    st = mp_replay(p, sched, t, on_policy_event, &s, d);
    if (st != MP_OK || s.n_ev == 0) {
        if (st == MP_OK)
            st = mp_fail(d, MP_ERR_INTERNAL, "timeline: the step has no allocations");
        else if (st == MP_ERR_NOMEM)
            mp_fail(d, st, "out of memory drawing the timeline");
        goto out;
    }
    /* the caching allocator over the same step: one figure an event, or none */
    size_t n_res = 0;
    if ((st = mp_reserved_series(p, sched, t, &s.res_policy, &n_res, d)) != MP_OK)
        goto out;
    size_t extra = (s.ref_weights ? 1 : 0) + (s.grad_dip ? 2 : 0); /* the events that are not the policy step's */
    for (size_t i = 0; i < s.n_splice; i++)
        extra += s.splice[i].last + 1 - s.splice[i].first;
    if (s.res_policy && n_res + extra != s.n_ev) { /* (a replay that is not the same step: not drawn) */
        free(s.res_policy);
        s.res_policy = NULL;
    }
    if (s.res_policy && !(s.reserved = calloc(s.n_ev, sizeof *s.reserved))) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory drawing the timeline");
        goto out;
    }
    /* pass 2: columns and the zoom window (the schedule op holding the peak, widened) */
    s.total_ev = s.n_ev;
    s.n_cols = s.total_ev < N_COLS ? s.total_ev : N_COLS;
    size_t a = s.peak_ev, b = s.peak_ev + 1;
    for (size_t k = 0; k < sched->n; k++)
        if (s.op_first[k] <= s.peak_ev && s.peak_ev < s.op_last[k]) {
            a = s.op_first[k];
            b = s.op_last[k];
        }
    size_t w = b - a;
    w = w < INSET_MIN ? INSET_MIN : w + w; /* the op and as much again around it */
    if (w > INSET_MAX)
        w = INSET_MAX;
    if (w > s.total_ev)
        w = s.total_ev;
    s.win0 = s.peak_ev > w / 2 ? s.peak_ev - w / 2 : 0;
    if (s.win0 + w > s.total_ev)
        s.win0 = s.total_ev - w;
    s.win1 = s.win0 + w;
    s.col = calloc(s.n_cols, sizeof *s.col);
    s.col_set = calloc(s.n_cols, sizeof *s.col_set);
    s.win = calloc(w, sizeof *s.win);
    if (!s.col || !s.col_set || !s.win) {
        st = mp_fail(d, MP_ERR_NOMEM, "out of memory drawing the timeline");
        goto out;
    }
    memset(s.cur, 0, sizeof s.cur);
    s.total = 0;
    s.n_ev = 0;
    s.pass = 2;
    s.w_done = s.kl_done = s.pre_done = s.grad_dip = s.have_loss = false;
    s.setup_grads = 0;
    s.n_loss_grads = s.n_splice = 0;
    st = mp_replay(p, sched, t, on_policy_event, &s, d);
    if (st != MP_OK)
        goto out;
    if (s.reserved)
        s.reserved_peak = run_max(s.reserved, 0, s.n_ev, s.n_ev);
    draw(out, &s, o);
    if (ferror(out))
        st = mp_fail(d, MP_ERR_IO, "writing the timeline failed");
out:
    mp_schedule_release(&none);
    free(s.spans);
    free(s.op_first);
    free(s.op_last);
    free(s.col);
    free(s.col_set);
    free(s.win);
    free(s.reserved);
    free(s.res_policy);
    return st;
}
