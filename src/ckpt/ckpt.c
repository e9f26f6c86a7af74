/* ckpt.c — checkpoint placement: the schedule simulator
 * (docs/checkpointing.md#simulator), builders (none, checkpoint_sequential,
 * segments), the rotor persistent DP (docs/checkpointing.md#rotor-dp), the
 * single-level segment DP (docs/checkpointing.md#segment-dp), discretisation
 * (docs/checkpointing.md#discretisation), Revolve (docs/checkpointing.md#revolve).
 * Not here: building chains from a model (estimate/chain.c), I/O, the multi-option
 * blocks of docs/checkpointing.md#multi-option-chain, non-persistent rotor.
 * Invariants: both DPs use the simulator's memory model exactly (Loss frees a
 * plain x_L), so DP cost == simulated cost; every plan is replayed on byte
 * sizes before it is returned and a budgeted plan's byte peak is <= the budget. */
#include "ckpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CKPT_DEFAULT_SLOTS 500
/* Largest DP table we are willing to allocate; beyond it ask for fewer slots. */
#define CKPT_DP_MAX_BYTES ((uint64_t)4 << 30)

/* ------------------------------------------------------------------------ */
/* Chain and schedule containers                                             */
/* ------------------------------------------------------------------------ */

enum mp_status mp_chain_init(struct mp_chain *c, size_t L)
{
    memset(c, 0, sizeof *c);
    /* Op indices are uint32_t and the DPs index blocks with int32_t. */
    if (L > (size_t)INT32_MAX - 2)
        return MP_ERR_RANGE;
    c->L = L;
    c->f = calloc(L ? L : 1, sizeof *c->f);
    c->b = calloc(L + 1, sizeof *c->b);
    c->x = calloc(L + 1, sizeof *c->x);
    c->xb = calloc(L + 1, sizeof *c->xb);
    c->ft = calloc(L ? L : 1, sizeof *c->ft);
    c->bt = calloc(L + 1, sizeof *c->bt);
    c->repeated = calloc(L ? L : 1, sizeof *c->repeated);
    c->gc_before = calloc(L ? L : 1, sizeof *c->gc_before);
    if (!c->f || !c->b || !c->x || !c->xb || !c->ft || !c->bt || !c->repeated || !c->gc_before) {
        mp_chain_release(c);
        return MP_ERR_NOMEM;
    }
    return MP_OK;
}

void mp_chain_release(struct mp_chain *c)
{
    if (!c)
        return;
    free(c->f);
    free(c->b);
    free(c->x);
    free(c->xb);
    free(c->ft);
    free(c->bt);
    free(c->repeated);
    free(c->gc_before);
    memset(c, 0, sizeof *c);
}

void mp_schedule_init(struct mp_schedule *s)
{
    s->n = 0;
    s->cap = 0;
    s->ops = NULL;
    s->offload = false;
    s->sac = MP_SAC_NONE;
    s->sac_keep = 0;
}

void mp_schedule_release(struct mp_schedule *s)
{
    if (!s)
        return;
    free(s->ops);
    mp_schedule_init(s);
}

enum mp_status mp_schedule_push(struct mp_schedule *s, enum mp_sched_kind k, uint32_t index)
{
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        if (ncap < s->cap || ncap > SIZE_MAX / sizeof *s->ops)
            return MP_ERR_NOMEM;
        struct mp_sched_op *ops = realloc(s->ops, ncap * sizeof *ops);
        if (!ops)
            return MP_ERR_NOMEM;
        s->ops = ops;
        s->cap = ncap;
    }
    s->ops[s->n].kind = k;
    s->ops[s->n].index = index;
    s->n++;
    return MP_OK;
}

bool mp_schedule_equal(const struct mp_schedule *a, const struct mp_schedule *b)
{
    if (a->n != b->n)
        return false;
    for (size_t k = 0; k < a->n; k++)
        if (a->ops[k].kind != b->ops[k].kind || a->ops[k].index != b->ops[k].index)
            return false;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Strategy specs                                                            */
/* ------------------------------------------------------------------------ */

static const char *const sac_names[] = {
#define MP_X(id, name, what, unmodelled) name,
    MP_SAC_POLICIES(MP_X)
#undef MP_X
};
static const char *const sac_why[] = {
#define MP_X(id, name, what, unmodelled) unmodelled,
    MP_SAC_POLICIES(MP_X)
#undef MP_X
};
#define MP_SAC_N (sizeof sac_names / sizeof sac_names[0])

const char *mp_sac_str(enum mp_sac_policy s) { return (size_t)s < MP_SAC_N ? sac_names[s] : "?"; }
const char *mp_sac_why(enum mp_sac_policy s) { return (size_t)s < MP_SAC_N ? sac_why[s] : NULL; }

/* K of "segments:K" / "every:K": decimal digits only, > 0, no overflow. */
static enum mp_status parse_k(const char *s, uint64_t *k)
{
    if (!*s)
        return MP_ERR_USAGE;
    for (const char *p = s; *p; p++)
        if (*p < '0' || *p > '9')
            return MP_ERR_USAGE;
    if (mp_parse_u64(s, k) != MP_OK || *k == 0)
        return MP_ERR_USAGE;
    return MP_OK;
}

enum mp_status mp_ckpt_spec_parse(const char *s, struct mp_ckpt_spec *out)
{
    struct mp_ckpt_spec r = {.strategy = MP_CKPT_NONE, .k = 0};
    if (!s || !out)
        return MP_ERR_USAGE;
    /* "+offload": only after "layers" / "layers:N", HF's offload=True (it wraps the checkpoint
     * of each GradientCheckpointingLayer in save_on_cpu) */
    /* "+sac" / "+sac:NAME": only after "layers" / "layers:N", a policy of MP_SAC_POLICIES ("trl"
     * when unnamed); not with "+offload" (SAC's cache bypasses save_on_cpu: not measured) */
    const char *plus = strchr(s, '+');
    char head[32];
    if (plus) {
        bool off = strcmp(plus, "+offload") == 0, sac = strncmp(plus, "+sac", 4) == 0;
        if ((!off && !sac) || (size_t)(plus - s) >= sizeof head)
            return MP_ERR_USAGE;
        memcpy(head, s, (size_t)(plus - s));
        head[plus - s] = '\0';
        if (mp_ckpt_spec_parse(head, &r) != MP_OK || r.strategy != MP_CKPT_LAYERS)
            return MP_ERR_USAGE;
        r.offload = off;
        if (sac) {
            const char *name = plus[4] == ':' ? plus + 5 : plus[4] ? NULL : "trl";
            int k = name ? mp_name_index(sac_names, MP_SAC_N, name) : -1;
            if (k <= (int)MP_SAC_NONE)
                return MP_ERR_USAGE;
            r.sac = (enum mp_sac_policy)k;
            *out = r;
            return mp_sac_why(r.sac) ? MP_ERR_UNSUPPORTED : MP_OK;
        }
        *out = r;
        return MP_OK;
    }
    if (strcmp(s, "none") == 0)
        r.strategy = MP_CKPT_NONE;
    else if (strcmp(s, "sqrt") == 0)
        r.strategy = MP_CKPT_SQRT;
    else if (strcmp(s, "layers") == 0)
        r.strategy = MP_CKPT_LAYERS;
    else if (strncmp(s, "layers:", 7) == 0) {
        r.strategy = MP_CKPT_LAYERS;
        if (parse_k(s + 7, &r.k) != MP_OK)
            return MP_ERR_USAGE;
    }
    else if (strcmp(s, "optimal") == 0)
        r.strategy = MP_CKPT_OPTIMAL;
    else if (strcmp(s, "optimal-segments") == 0)
        r.strategy = MP_CKPT_OPTIMAL_SEGMENTS;
    else if (strncmp(s, "segments:", 9) == 0) {
        r.strategy = MP_CKPT_SEGMENTS;
        if (parse_k(s + 9, &r.k) != MP_OK)
            return MP_ERR_USAGE;
    } else if (strncmp(s, "every:", 6) == 0) {
        r.strategy = MP_CKPT_EVERY;
        if (parse_k(s + 6, &r.k) != MP_OK)
            return MP_ERR_USAGE;
    } else
        return MP_ERR_USAGE;
    *out = r;
    return MP_OK;
}

const char *mp_ckpt_spec_str(const struct mp_ckpt_spec *s, char *buf, size_t len)
{
    if (!buf || len == 0)
        return "";
    switch (s->strategy) {
    case MP_CKPT_NONE:
        snprintf(buf, len, "none");
        break;
    case MP_CKPT_SQRT:
        snprintf(buf, len, "sqrt");
        break;
    case MP_CKPT_SEGMENTS:
        snprintf(buf, len, "segments:%llu", (unsigned long long)s->k);
        break;
    case MP_CKPT_EVERY:
        snprintf(buf, len, "every:%llu", (unsigned long long)s->k);
        break;
    case MP_CKPT_LAYERS: {
        char tail[32] = "";
        if (s->offload)
            snprintf(tail, sizeof tail, "+offload");
        else if (s->sac == MP_SAC_TRL)
            snprintf(tail, sizeof tail, "+sac");
        else if (s->sac != MP_SAC_NONE)
            snprintf(tail, sizeof tail, "+sac:%s", mp_sac_str(s->sac));
        if (s->k > 1)
            snprintf(buf, len, "layers:%llu%s", (unsigned long long)s->k, tail);
        else
            snprintf(buf, len, "layers%s", tail);
        break;
    }
    case MP_CKPT_OPTIMAL:
        snprintf(buf, len, "optimal");
        break;
    case MP_CKPT_OPTIMAL_SEGMENTS:
        snprintf(buf, len, "optimal-segments");
        break;
    default:
        snprintf(buf, len, "?");
        break;
    }
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Simulator (docs/checkpointing.md#simulator)                              */
/* ------------------------------------------------------------------------ */

static const char *op_name(const struct mp_sched_op *op, char *buf, size_t len)
{
    static const char *names[] = {"Fn", "Fc", "Fe", "Loss", "B"};
    if ((unsigned)op->kind > MP_SCHED_B)
        snprintf(buf, len, "op?%d_%u", (int)op->kind, (unsigned)op->index);
    else if (op->kind == MP_SCHED_LOSS)
        snprintf(buf, len, "Loss");
    else
        snprintf(buf, len, "%s_%u", names[op->kind], (unsigned)op->index);
    return buf;
}

/* Replays s on c.  *complete is set when the replay ends with exactly {y_0}
 * resident, i.e. the schedule is a whole training step. */
static enum mp_status simulate(const struct mp_chain *c, const struct mp_schedule *s, uint64_t *peak_out,
                               double *cost_out, bool *complete, struct mp_diag *d)
{
    const size_t L = c->L;
    /* Resident flags: plain x_i (0..L), xbar_i (1..L), y_i (0..L). */
    unsigned char *hx = calloc(3 * (L + 1), 1);
    if (!hx)
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: simulate: out of memory");
    unsigned char *hxb = hx + (L + 1), *hy = hx + 2 * (L + 1);
    enum mp_status st = MP_OK;
    char nm[48];
    uint64_t cur = c->x[0], peak = c->x[0], use = 0;
    double cost = 0;
    hx[0] = 1;

#define SIM_FAIL(...)                                                         \
    do {                                                                      \
        op_name(op, nm, sizeof nm); /* named only on failure: simulate is hot */ \
        st = mp_fail(d, MP_ERR_INTERNAL, "ckpt: simulate: op %zu (%s): " __VA_ARGS__); \
        goto out;                                                             \
    } while (0)
/* the bytes live at once pass 2^64: said in the user's terms (the caller names the model) */
#define SIM_OVERFLOW()                                                                                            \
    do {                                                                                                          \
        st = mp_fail(d, MP_ERR_RANGE, "the step's activations need more than 16 EiB (2^64 bytes) at once, in the " \
                                      "%s; use a smaller --batch or --seq",                                       \
                     op->kind == MP_SCHED_B ? "backward" : op->kind == MP_SCHED_LOSS ? "loss" : "forward");       \
        goto out;                                                                                                 \
    } while (0)
#define SIM_ADD(v)                             \
    do {                                       \
        if (!mp_add_u64(cur, (v), &cur))       \
            SIM_OVERFLOW();                    \
    } while (0)

    for (size_t k = 0; k < s->n; k++) {
        const struct mp_sched_op *op = &s->ops[k];
        const size_t i = op->index;
        uint64_t tmp = 0;
        switch (op->kind) {
        case MP_SCHED_FE:
        case MP_SCHED_FC:
        case MP_SCHED_FN: {
            if (i >= L)
                SIM_FAIL("block index out of range (chain has %zu blocks)", k, nm, L);
            if (!hx[i] && !hxb[i])
                SIM_FAIL("input x_%zu is not resident", k, nm, i);
            bool full = op->kind == MP_SCHED_FE;
            unsigned char *outp = full ? &hxb[i + 1] : &hx[i + 1];
            if (*outp)
                SIM_FAIL("%s_%zu is already resident", k, nm, full ? "xbar" : "x", i + 1);
            SIM_ADD(full ? c->xb[i + 1] : c->x[i + 1]);
            *outp = 1;
            tmp = c->ft[i];
            cost += c->f[i];
            break;
        }
        case MP_SCHED_LOSS:
            if (i != L)
                SIM_FAIL("Loss must carry index L = %zu", k, nm, L);
            if (!hx[L] && !hxb[L])
                SIM_FAIL("loss input x_%zu is not resident", k, nm, L);
            if (hy[L])
                SIM_FAIL("y_%zu is already resident", k, nm, L);
            SIM_ADD(c->x[L]);
            hy[L] = 1;
            tmp = c->bt[L];
            cost += c->b[L];
            break;
        case MP_SCHED_B:
            if (i >= L)
                SIM_FAIL("block index out of range (chain has %zu blocks)", k, nm, L);
            if (!hy[i + 1])
                SIM_FAIL("gradient y_%zu is not resident", k, nm, i + 1);
            if (!hxb[i + 1])
                SIM_FAIL("saved xbar_%zu is not resident", k, nm, i + 1);
            if (!hx[i] && !hxb[i])
                SIM_FAIL("input x_%zu is not resident", k, nm, i);
            if (hy[i])
                SIM_FAIL("y_%zu is already resident", k, nm, i);
            SIM_ADD(c->x[i]);
            hy[i] = 1;
            tmp = c->bt[i];
            cost += c->b[i];
            break;
        default:
            SIM_FAIL("unknown op kind", k, nm);
        }
        if (!mp_add_u64(cur, tmp, &use))
            SIM_OVERFLOW();
        peak = mp_max_u64(peak, use);
        /* Frees happen after the op's usage is counted. */
        if (op->kind == MP_SCHED_FN) {
            if (hx[i]) {
                hx[i] = 0;
                cur -= c->x[i];
            } else {
                hxb[i] = 0;
                cur -= c->xb[i];
            }
        } else if (op->kind == MP_SCHED_LOSS) {
            if (hx[L]) { /* the loss frees a plain x_L (docs/checkpointing.md#loss-frees-xl) */
                hx[L] = 0;
                cur -= c->x[L];
            }
        } else if (op->kind == MP_SCHED_B) {
            if (hx[i]) {
                hx[i] = 0;
                cur -= c->x[i];
            }
            hy[i + 1] = 0;
            cur -= c->x[i + 1];
            hxb[i + 1] = 0;
            cur -= c->xb[i + 1];
        }
    }
#undef SIM_FAIL
#undef SIM_ADD
#undef SIM_OVERFLOW

    if (complete) {
        bool ok = hy[0] != 0;
        for (size_t i = 0; ok && i <= L; i++)
            ok = !hx[i] && !hxb[i] && (i == 0 || !hy[i]);
        *complete = ok;
    }
    if (peak_out)
        *peak_out = peak;
    if (cost_out)
        *cost_out = cost;
out:
    free(hx);
    return st;
}

enum mp_status mp_ckpt_simulate(const struct mp_chain *c, const struct mp_schedule *s, uint64_t *peak,
                                double *cost, struct mp_diag *d)
{
    return simulate(c, s, peak, cost, NULL, d);
}

/* ------------------------------------------------------------------------ */
/* Schedule builders                                                         */
/* ------------------------------------------------------------------------ */

#define PUSH(sched, kind, idx)                                          \
    do {                                                                \
        if (mp_schedule_push((sched), (kind), (uint32_t)(idx)) != MP_OK) \
            return MP_ERR_NOMEM;                                        \
    } while (0)

/* All builders reset s (s->n = 0, keeping its buffer); s must be initialised. */
enum mp_status mp_ckpt_schedule_none(size_t L, struct mp_schedule *s)
{
    if (L > (size_t)INT32_MAX - 2)
        return MP_ERR_RANGE;
    s->n = 0;
    for (size_t i = 0; i < L; i++)
        PUSH(s, MP_SCHED_FE, i);
    PUSH(s, MP_SCHED_LOSS, L);
    for (size_t i = L; i-- > 0;)
        PUSH(s, MP_SCHED_B, i);
    return MP_OK;
}

enum mp_status mp_ckpt_schedule_segments(size_t L, size_t n_seg, const size_t *seg_start, const bool *seg_ckpt,
                                         struct mp_schedule *s)
{
    if (L > (size_t)INT32_MAX - 2)
        return MP_ERR_RANGE;
    if (L == 0 ? n_seg != 0 : (n_seg == 0 || seg_start[0] != 0))
        return MP_ERR_USAGE;
    for (size_t k = 1; k < n_seg; k++)
        if (seg_start[k] <= seg_start[k - 1] || seg_start[k] >= L)
            return MP_ERR_USAGE;
    s->n = 0;
    for (size_t k = 0; k < n_seg; k++) {
        size_t a = seg_start[k], e = k + 1 < n_seg ? seg_start[k + 1] : L;
        if (seg_ckpt[k]) {
            PUSH(s, MP_SCHED_FC, a);
            for (size_t i = a + 1; i < e; i++)
                PUSH(s, MP_SCHED_FN, i);
        } else {
            for (size_t i = a; i < e; i++)
                PUSH(s, MP_SCHED_FE, i);
        }
    }
    PUSH(s, MP_SCHED_LOSS, L);
    for (size_t k = n_seg; k-- > 0;) {
        size_t a = seg_start[k], e = k + 1 < n_seg ? seg_start[k + 1] : L;
        if (seg_ckpt[k])
            for (size_t i = a; i < e; i++)
                PUSH(s, MP_SCHED_FE, i);
        for (size_t i = e; i-- > a;)
            PUSH(s, MP_SCHED_B, i);
    }
    return MP_OK;
}

/* Segments of `size` blocks from 0; the first n-1 (or all, if last_ckpt) checkpointed. */
static enum mp_status schedule_runs(size_t L, size_t n, size_t size, bool last_ckpt, struct mp_schedule *s)
{
    size_t *start = malloc(n * sizeof *start);
    bool *ck = malloc(n * sizeof *ck);
    enum mp_status st = MP_ERR_NOMEM;
    if (start && ck) {
        for (size_t k = 0; k < n; k++) {
            start[k] = k * size;
            ck[k] = k + 1 < n || last_ckpt;
        }
        st = mp_ckpt_schedule_segments(L, n, start, ck, s);
    }
    free(start);
    free(ck);
    return st;
}

enum mp_status mp_ckpt_schedule_sequential(size_t L, size_t segments, struct mp_schedule *s)
{
    if (segments == 0 || (L > 0 && segments > L) || (L == 0 && segments != 1))
        return MP_ERR_USAGE;
    if (L == 0)
        return mp_ckpt_schedule_none(0, s);
    /* torch.utils.checkpoint.checkpoint_sequential: segment_size = floor(L / segments);
     * the last segment takes the remainder and is not checkpointed
     * (docs/checkpointing.md#checkpoint-sequential). */
    return schedule_runs(L, segments, L / segments, false, s);
}

/* ------------------------------------------------------------------------ */
/* Discretisation                                                            */
/* ------------------------------------------------------------------------ */

/* Sizes in DP units, padded as the DP wants (docs/checkpointing.md#rotor-dp):
 * x, xb have L+2 entries (x[L+1] = xb[L+1] = 0), ft has L+1 (ft[L] = 0), bt
 * has L+1.
 *
 * Exact mode: every size is a multiple of unit (their GCD) and budget/unit <=
 * slots; usage <= M units <=> usage <= budget bytes.  Rounded mode: unit =
 * ceil(budget/slots), sizes round up, so a plan that fits M units fits the
 * budget in bytes; a byte-feasible plan may need up to one unit per resident
 * term more, so the DPs also look at budgets up to Mtop = M + slack and keep
 * the cheapest plan whose byte-exact simulated peak fits (budget_dp).  Every
 * size is clamped to Mtop+1 so small sums cannot overflow and "does not fit"
 * is preserved. */
struct units {
    uint64_t unit;  /* bytes per unit */
    uint64_t M;     /* budget in units (rounded down) */
    uint64_t Mtop;  /* largest budget the DPs try (M in exact mode) */
    bool exact;     /* every size is a multiple of unit */
    uint64_t *x, *xb, *ft, *bt;
    double *f, *b;  /* f has L+1 entries (f[L] = 0), b has L+1 */
};

static void units_release(struct units *u)
{
    free(u->x);
    memset(u, 0, sizeof *u);
}

/* budget: bytes, already clamped to the no-checkpoint peak by the caller. */
static enum mp_status discretise(const struct mp_chain *c, uint64_t budget, size_t slots, struct units *u,
                                 struct mp_diag *d)
{
    const size_t L = c->L;
    memset(u, 0, sizeof *u);
    /* One block for x, xb (L+2 each), ft, bt (L+1 each), f, b (L+1 doubles each). */
    size_t nu = 2 * (L + 2) + 2 * (L + 1), nd = 2 * (L + 1);
    uint64_t *mem = malloc(nu * sizeof(uint64_t) + nd * sizeof(double));
    if (!mem)
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: out of memory");
    u->x = mem;
    u->xb = u->x + (L + 2);
    u->ft = u->xb + (L + 2);
    u->bt = u->ft + (L + 1);
    u->f = (double *)(void *)(u->bt + (L + 1));
    u->b = u->f + (L + 1);

    uint64_t g = 0;
    for (size_t i = 0; i <= L; i++) {
        g = mp_gcd_u64(g, c->x[i]);
        g = mp_gcd_u64(g, c->xb[i]);
        g = mp_gcd_u64(g, c->bt[i]);
        if (i < L)
            g = mp_gcd_u64(g, c->ft[i]);
    }
    if (g == 0) /* every size is zero */
        g = 1;
    if (budget / g <= slots) {
        u->unit = g;
        u->exact = true;
    } else {
        u->unit = mp_ceil_div(budget, slots);
        u->exact = false;
    }
    u->M = budget / u->unit;
    /* Rounding slack: a usage sums about L + 4 rounded sizes (one x or xbar
     * per block index, two gradients, one temporary); 2(L+1) + 2 also covers
     * an x_i and an xbar_i resident together.  Capped at doubling M. */
    u->Mtop = u->exact ? u->M : u->M + mp_min_u64(2 * (uint64_t)(L + 1) + 2, u->M + 1);
    const uint64_t cap = u->Mtop + 1;
#define TO_UNITS(v) mp_min_u64(mp_ceil_div((v), u->unit), cap)
    for (size_t i = 0; i <= L; i++) {
        u->x[i] = TO_UNITS(c->x[i]);
        u->xb[i] = TO_UNITS(c->xb[i]);
        u->bt[i] = TO_UNITS(c->bt[i]);
        u->ft[i] = i < L ? TO_UNITS(c->ft[i]) : 0;
        u->f[i] = i < L ? c->f[i] : 0.0;
        u->b[i] = c->b[i];
    }
#undef TO_UNITS
    u->x[L + 1] = 0;
    u->xb[L + 1] = 0;
    return MP_OK;
}

/* ------------------------------------------------------------------------ */
/* Rotor persistent DP (docs/checkpointing.md#rotor-dp)                      */
/* ------------------------------------------------------------------------ */

/* Tables OPT[s][l][m] and WHAT[s][l][m] for 0 <= s <= l <= L and 0 <= m <= M.
 * Every sub-problem depends only on strictly shorter ones, so lengths are
 * filled in ascending order.
 *
 * Each table is a step function of m, kept as its pieces: from piece k's m up
 * to the next piece's, OPT and WHAT are piece k's (the first piece starts at
 * 0).  OPT is non-increasing in m and takes few values: on Llama-2-70B's 82
 * blocks each table has about 65 pieces (at most 142) at 500 slots and at
 * 5,000, where a dense table of M + 1 entries per (s, l) took 4 GiB and 19
 * CPU seconds at 100,000 slots (and a chain of 84 blocks more than 4 GiB).  Each candidate (a leaf j, the chain) is a
 * sum of shifted step functions, merged into the table piece by piece: the
 * same values, compared in the same order with the same ties, as at every m
 * of a dense table, so the plans are the dense DP's.
 *
 * Memory bounds (m excludes the sub-chain input x_s, includes y_{l+1}):
 *   base s == l:  m >= max(x[s+1] + xb[s+1] + ft[s], x[s] + x[s+1] + xb[s+1] + bt[s])
 *   sweep (l > s): m >= mmin, as in rotor; every schedule forwards each block
 *                 of s..l-1 once with y_{l+1} resident, so this is necessary.
 *   leaf j:       m >= x[j], OPT[s][j-1][m] and OPT[j][l][m - x[j]] finite.
 *   chain:        Fe_s runs with y_{l+1} resident: m >= xb[s+1] + x[l+1] + ft[s];
 *                 B_s: m >= x[s] + x[s+1] + xb[s+1] + bt[s]; OPT[s+1][l][m - xb[s+1]].
 * rotor reuses the base case OPT[s][s] for the chain's Fe_s, which counts
 * x[s+1] where y_{l+1} is resident: that under-estimates Fe_s when
 * x[l+1] > x[s+1] and ft[s] > 0 (and over-estimates otherwise).  The bounds
 * above are exact for the simulator, so DP cost == simulated cost. */
struct piece {
    double v;   /* OPT */
    uint32_t m; /* from this m on (m <= M < 2^32: slots are at most 100,000) */
    int32_t w;  /* WHAT: -1 chain, j leaf */
};

struct pieces {
    struct piece *p;
    size_t n, cap;
};

struct rotor {
    size_t L;
    uint64_t Mn;        /* M + 1 */
    size_t *row;        /* [L+1] */
    size_t *first;      /* [ntri]: table (s, l)'s first piece in all.p */
    size_t *count;      /* [ntri]: its pieces */
    struct pieces all;  /* every table's pieces */
    struct pieces a, b; /* the table being made, and the next version of it */
};

/* Bytes of pieces beyond which the DP gives up (a chain whose tables have as
 * many pieces as m values, at many slots): ask for fewer slots. */
#define CKPT_DP_MAX_PIECE_BYTES ((uint64_t)1 << 30)

static void rotor_release(struct rotor *r)
{
    free(r->row);
    free(r->first);
    free(r->count);
    free(r->all.p);
    free(r->a.p);
    free(r->b.p);
    memset(r, 0, sizeof *r);
}

static inline size_t rotor_tri(const struct rotor *r, size_t s, size_t l) { return r->row[s] + (l - s); }

/* The piece of p (n pieces, the first at 0) that holds m. */
static size_t piece_index(const struct piece *p, size_t n, uint64_t m)
{
    size_t lo = 0, hi = n; /* p[lo].m <= m < p[hi].m */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (p[mid].m <= m)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Table (s, l)'s piece at m (m < Mn). */
static const struct piece *rotor_at(const struct rotor *r, size_t s, size_t l, uint64_t m)
{
    size_t t = rotor_tri(r, s, l);
    const struct piece *p = r->all.p + r->first[t];
    return p + piece_index(p, r->count[t], m);
}

/* Room in b for n more pieces; false: out of memory. */
static bool pieces_reserve(struct pieces *b, size_t n)
{
    if (b->cap - b->n >= n)
        return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->n < n)
        cap *= 2;
    struct piece *q = realloc(b->p, cap * sizeof *q);
    if (!q)
        return false;
    b->p = q;
    b->cap = cap;
    return true;
}

/* Appends (m, v, w) to b, which has room, unless it continues b's last piece. */
static inline void piece_append(struct pieces *b, uint64_t m, double v, int32_t w)
{
    if (b->n && b->p[b->n - 1].v == v && b->p[b->n - 1].w == w)
        return;
    b->p[b->n++] = (struct piece){v, (uint32_t)m, w};
}

/* The same, making room; false: out of memory. */
static bool piece_push(struct pieces *b, uint64_t m, double v, int32_t w)
{
    if (!pieces_reserve(b, 1))
        return false;
    piece_append(b, m, v, w);
    return true;
}

/* A sum of step functions: f1 (n1 pieces) at m - shift, plus f2 (n2) at m
 * where p2 is not NULL. */
struct walk {
    const struct piece *p1, *p2;
    size_t n1, n2;
    uint64_t shift;
};

/* Merges a candidate into table r->a from m = lo (< Mn) on: at each m >= lo
 * the candidate costs add + f1(m - shift) (+ f2(m)) and replaces the table's
 * entry where the dense DP would; below lo the table is unchanged.  leaf: the
 * candidate is leaf j, taken where strictly cheaper; else the chain, taken
 * also where no leaf is.  false: out of memory. */
static bool rotor_merge(struct rotor *r, uint64_t lo, double add, struct walk wk, bool leaf, int32_t j)
{
    /* Where f1 or f2 is infinite (one piece from m = 0, tables being non-increasing) the
     * candidate is, and changes nothing: start after it. */
    if (isinf(wk.p1[0].v))
        lo = mp_max_u64(lo, wk.n1 > 1 ? wk.p1[1].m + wk.shift : r->Mn);
    if (wk.p2 && isinf(wk.p2[0].v))
        lo = mp_max_u64(lo, wk.n2 > 1 ? wk.p2[1].m : r->Mn);
    if (lo >= r->Mn)
        return true;
    const struct pieces *a = &r->a;
    size_t ia = piece_index(a->p, a->n, lo); /* the piece holding lo */
    /* Tables and candidates are non-increasing in m (sums round monotonically): the candidate
     * costs at least its cost at the largest m, so it can replace nothing from where the table
     * is down to that (a leaf where it is not cheaper, the chain where a leaf was taken). */
    double least = add + wk.p1[wk.n1 - 1].v;
    least = wk.p2 ? least + wk.p2[wk.n2 - 1].v : least;
    size_t ih = ia, top = a->n; /* ih: the first piece from lo on at or below least */
    while (ih < top) {
        size_t mid = ih + (top - ih) / 2;
        if (a->p[mid].v <= least)
            top = mid;
        else
            ih = mid + 1;
    }
    const uint64_t end = ih < a->n ? mp_max_u64(a->p[ih].m, lo) : r->Mn;
    if (end <= lo)
        return true;
    struct pieces *b = &r->b;
    b->n = 0;
    /* each piece of the result starts at lo or where a, f1 or f2 has a piece */
    if (!pieces_reserve(b, a->n + wk.n1 + (wk.p2 ? wk.n2 : 0) + 1))
        return false;
    memcpy(b->p, a->p, ia * sizeof *b->p);
    b->n = ia;
    if (a->p[ia].m < lo)
        piece_append(b, a->p[ia].m, a->p[ia].v, a->p[ia].w);
    size_t i1 = piece_index(wk.p1, wk.n1, lo - wk.shift), i2 = wk.p2 ? piece_index(wk.p2, wk.n2, lo) : 0;
    for (uint64_t m = lo; m < end;) {
        const struct piece *t = &a->p[ia];
        /* the dense DP's expression, in its order */
        double cst = wk.p2 ? add + wk.p1[i1].v + wk.p2[i2].v : add + wk.p1[i1].v;
        bool take = leaf ? cst < t->v : t->w < 0 || cst < t->v;
        if (take)
            piece_append(b, m, cst, leaf ? j : -1);
        else
            piece_append(b, m, t->v, t->w);
        /* on to where a, f1 or f2 next changes */
        uint64_t na = ia + 1 < a->n ? a->p[ia + 1].m : end;
        uint64_t n1 = i1 + 1 < wk.n1 ? wk.p1[i1 + 1].m + wk.shift : end;
        uint64_t n2 = wk.p2 && i2 + 1 < wk.n2 ? wk.p2[i2 + 1].m : end;
        m = mp_min_u64(end, mp_min_u64(na, mp_min_u64(n1, n2)));
        ia += na == m && m < end;
        i1 += n1 == m && m < end;
        i2 += n2 == m && m < end;
    }
    for (; ih < a->n; ih++) /* the rest as it was (a->p[ih] starts at end) */
        piece_append(b, a->p[ih].m, a->p[ih].v, a->p[ih].w);
    struct pieces tmp = r->a;
    r->a = *b;
    *b = tmp;
    return true;
}

/* Stores table (s, l) from r->a. */
static enum mp_status rotor_keep(struct rotor *r, size_t s, size_t l, struct mp_diag *d)
{
    size_t t = rotor_tri(r, s, l);
    if (!pieces_reserve(&r->all, r->a.n))
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: out of memory for the DP tables");
    r->first[t] = r->all.n;
    r->count[t] = r->a.n;
    memcpy(r->all.p + r->all.n, r->a.p, r->a.n * sizeof *r->a.p);
    r->all.n += r->a.n;
    if ((uint64_t)r->all.n * sizeof *r->all.p > CKPT_DP_MAX_PIECE_BYTES)
        return mp_fail(d, MP_ERR_USAGE, "ckpt: optimal: the DP's tables take more than %llu MiB at %llu memory "
                                        "slots; use fewer --slots",
                       (unsigned long long)(CKPT_DP_MAX_PIECE_BYTES >> 20), (unsigned long long)(r->Mn - 1));
    return MP_OK;
}

/* Checks a dense table of ntri * Mn entries of elem bytes against CKPT_DP_MAX_BYTES. */
static enum mp_status dp_alloc_check(size_t ntri, size_t Mn, size_t elem, const char *what, struct mp_diag *d)
{
    uint64_t n, bytes;
    if (!mp_mul_u64(ntri, Mn, &n) || !mp_mul_u64(n, elem, &bytes) || bytes > CKPT_DP_MAX_BYTES ||
        bytes > SIZE_MAX)
        return mp_fail(d, MP_ERR_USAGE, "ckpt: %s: DP table of %zu x %zu entries is too large; use fewer --slots",
                       what, ntri, Mn);
    return MP_OK;
}

static enum mp_status rotor_solve(const struct units *u, size_t L, struct rotor *r, struct mp_diag *d)
{
    memset(r, 0, sizeof *r);
    const uint64_t *x = u->x, *xb = u->xb, *ft = u->ft, *bt = u->bt;
    const double *f = u->f, *b = u->b;
    const uint64_t M = u->Mtop - x[0]; /* largest m0: caller guarantees u->Mtop >= x[0] */
    const double INF = HUGE_VAL;
    if ((L + 1) > SIZE_MAX / (L + 2) || M >= UINT32_MAX)
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: chain too long");
    size_t ntri = (L + 1) * (L + 2) / 2;
    r->L = L;
    r->Mn = M + 1;
    r->row = malloc((L + 1) * sizeof *r->row);
    r->first = malloc(ntri * sizeof *r->first);
    r->count = malloc(ntri * sizeof *r->count);
    if (!r->row || !r->first || !r->count) {
        rotor_release(r);
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: out of memory for the DP tables");
    }
    for (size_t s = 0, acc = 0; s <= L; s++) {
        r->row[s] = acc;
        acc += L + 1 - s;
    }
    enum mp_status st = MP_OK;
#define PUSH_OR_FAIL(ok)                                                                       \
    do {                                                                                       \
        if (!(ok)) {                                                                           \
            st = mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: out of memory for the DP tables"); \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

    /* Base: a single block (or the loss when i == L). */
    for (size_t i = 0; i <= L; i++) {
        uint64_t need = mp_max_u64(x[i + 1] + xb[i + 1] + ft[i], x[i] + x[i + 1] + xb[i + 1] + bt[i]);
        r->a.n = 0;
        PUSH_OR_FAIL(piece_push(&r->a, 0, need > 0 ? INF : f[i] + b[i], -1));
        if (need > 0 && need <= M)
            PUSH_OR_FAIL(piece_push(&r->a, need, f[i] + b[i], -1));
        if ((st = rotor_keep(r, i, i, d)) != MP_OK)
            goto out;
    }

    for (size_t dd = 1; dd <= L; dd++) {
        mp_progress("planning: optimal DP, chains of %zu of %zu blocks", dd, L);
        for (size_t s = 0; s + dd <= L; s++) {
            const size_t l = s + dd;
            r->a.n = 0;
            PUSH_OR_FAIL(piece_push(&r->a, 0, INF, -1));
            uint64_t mmin = x[l + 1] + x[s + 1] + ft[s];
            for (size_t j = s + 1; j < l; j++)
                mmin = mp_max_u64(mmin, x[l + 1] + x[j] + x[j + 1] + ft[j]);
            if (mmin <= M) {
                /* Leaf at j: Fc_s, Fn_{s+1..j-1} store x_j; right part with x_j
                 * resident, then the left part with y_j. */
                double sumf = 0;
                for (size_t j = s + 1; j <= l; j++) {
                    sumf += f[j - 1];
                    const uint64_t xj = x[j];
                    const uint64_t lo = mp_max_u64(mmin, xj);
                    if (lo > M)
                        continue;
                    size_t tr = rotor_tri(r, j, l), tl = rotor_tri(r, s, j - 1);
                    struct walk wk = {.p1 = r->all.p + r->first[tr], .n1 = r->count[tr], .shift = xj,
                                      .p2 = r->all.p + r->first[tl], .n2 = r->count[tl]};
                    PUSH_OR_FAIL(rotor_merge(r, lo, sumf, wk, true, (int32_t)j));
                }

                /* Chain: Fe_s keeps xb_{s+1}; solve s+1..l; B_s.  Ties go to the leaf. */
                uint64_t need = mp_max_u64(mmin, mp_max_u64(xb[s + 1] + x[l + 1] + ft[s],
                                                            x[s] + x[s + 1] + xb[s + 1] + bt[s]));
                if (need <= M) {
                    size_t tc = rotor_tri(r, s + 1, l);
                    struct walk wk = {.p1 = r->all.p + r->first[tc], .n1 = r->count[tc], .shift = xb[s + 1]};
                    PUSH_OR_FAIL(rotor_merge(r, need, f[s] + b[s], wk, false, -1));
                }
            }
            if ((st = rotor_keep(r, s, l, d)) != MP_OK)
                goto out;
        }
    }
#undef PUSH_OR_FAIL
out:
    if (st != MP_OK)
        rotor_release(r);
    return st;
}

/* Back-tracks rotor's rec(0, L, m0) into s with an explicit stack. */
static enum mp_status rotor_schedule(const struct rotor *r, const struct units *u, uint64_t m0,
                                     struct mp_schedule *s, struct mp_diag *d)
{
    struct frame {
        uint32_t s, l;
        uint64_t m;
        bool emit_b; /* a pending B_s rather than a sub-problem */
    };
    const size_t L = r->L;
    size_t cap = 2 * (L + 2), n = 0;
    struct frame *stk = malloc(cap * sizeof *stk);
    enum mp_status st = MP_OK;
    if (!stk)
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: out of memory");
    s->n = 0;
    stk[n++] = (struct frame){0, (uint32_t)L, m0, false};
#define EMIT(kind, idx)                                                                \
    do {                                                                               \
        if (mp_schedule_push(s, (kind), (uint32_t)(idx)) != MP_OK) {                   \
            st = mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: out of memory");             \
            goto out;                                                                  \
        }                                                                              \
    } while (0)
    while (n > 0) {
        struct frame fr = stk[--n];
        if (fr.emit_b) {
            EMIT(MP_SCHED_B, fr.s);
            continue;
        }
        const struct piece *at = fr.m < r->Mn ? rotor_at(r, fr.s, fr.l, fr.m) : NULL;
        if (!at || isinf(at->v)) {
            st = mp_fail(d, MP_ERR_INTERNAL, "ckpt: optimal: back-tracking reached an infeasible state (%u, %u, %llu)",
                         (unsigned)fr.s, (unsigned)fr.l, (unsigned long long)fr.m);
            goto out;
        }
        if (fr.s == fr.l) {
            if (fr.s == L)
                EMIT(MP_SCHED_LOSS, L);
            else {
                EMIT(MP_SCHED_FE, fr.s);
                EMIT(MP_SCHED_B, fr.s);
            }
            continue;
        }
        if (n + 2 > cap) {
            size_t ncap = cap * 2;
            struct frame *t = realloc(stk, ncap * sizeof *t);
            if (!t) {
                st = mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal: out of memory");
                goto out;
            }
            stk = t;
            cap = ncap;
        }
        int32_t w = at->w;
        if (w < 0) {
            EMIT(MP_SCHED_FE, fr.s);
            stk[n++] = (struct frame){fr.s, 0, 0, true};
            stk[n++] = (struct frame){fr.s + 1, fr.l, fr.m - u->xb[fr.s + 1], false};
        } else {
            EMIT(MP_SCHED_FC, fr.s);
            for (uint32_t k = fr.s + 1; k < (uint32_t)w; k++)
                EMIT(MP_SCHED_FN, k);
            stk[n++] = (struct frame){fr.s, (uint32_t)w - 1, fr.m, false};           /* then the left part */
            stk[n++] = (struct frame){(uint32_t)w, fr.l, fr.m - u->x[w], false};    /* first the right part */
        }
    }
#undef EMIT
out:
    free(stk);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Single-level segment DP (docs/checkpointing.md#segment-dp)                */
/* ------------------------------------------------------------------------ */

/* State (s, P): blocks 0..s-1 are forwarded in segments, P units resident
 * (P includes x_s or xbar_s).  dp = least recompute cost.  Peaks per segment
 * [s, e) as in docs/checkpointing.md#segment-dp with the Loss freeing a plain
 * x_L; all are exact for the simulator on the schedules mp_ckpt_schedule_segments
 * builds. */
struct segdp {
    size_t L, Mn;
    double *cost;    /* [(L+1) * Mn] */
    int32_t *prev_s; /* segment start that led here */
    int32_t *prev_p;
    unsigned char *ck;
};

static void segdp_release(struct segdp *g)
{
    free(g->cost);
    free(g->prev_s);
    free(g->prev_p);
    free(g->ck);
    memset(g, 0, sizeof *g);
}

static enum mp_status segdp_solve(const struct units *u, size_t L, uint64_t M, struct segdp *g, double *best_cost,
                                  uint64_t *best_p, struct mp_diag *d)
{
    memset(g, 0, sizeof *g);
    const uint64_t *x = u->x, *xb = u->xb, *ft = u->ft, *bt = u->bt;
    const double INF = HUGE_VAL;
    enum mp_status st;
    if (M >= INT32_MAX)
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal-segments: too many slots");
    size_t Mn = (size_t)M + 1;
    if ((st = dp_alloc_check(L + 1, Mn, sizeof(double) + 2 * sizeof(int32_t) + 1, "optimal-segments", d)) != MP_OK)
        return st;
    size_t n = (L + 1) * Mn;
    g->L = L;
    g->Mn = Mn;
    g->cost = malloc(n * sizeof *g->cost);
    g->prev_s = malloc(n * sizeof *g->prev_s);
    g->prev_p = malloc(n * sizeof *g->prev_p);
    g->ck = malloc(n);
    double *F = malloc((L + 1) * sizeof *F); /* prefix sums of f */
    if (!g->cost || !g->prev_s || !g->prev_p || !g->ck || !F) {
        free(F);
        segdp_release(g);
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal-segments: out of memory");
    }
    for (size_t i = 0; i < n; i++)
        g->cost[i] = INF;
    F[0] = 0;
    for (size_t i = 0; i < L; i++)
        F[i + 1] = F[i] + u->f[i];

    *best_cost = INF;
    *best_p = 0;
    if (x[0] <= M)
        g->cost[x[0]] = 0;
    if (L == 0) { /* only the loss */
        if (x[0] <= M && x[0] + x[0] + bt[0] <= M) {
            *best_cost = 0;
            *best_p = x[0];
        }
        free(F);
        return MP_OK;
    }

    for (size_t s = 0; s < L; s++) {
        for (uint64_t P = 0; P <= M; P++) {
            const double base = g->cost[s * Mn + P];
            if (isinf(base))
                continue;
            uint64_t fwd_ck = 0, fwd_st = 0, bwd = 0, recin = 0, sumxb = 0;
            bool ck_ok = true, st_ok = true;
            for (size_t e = s + 1; e <= L; e++) {
                const size_t i = e - 1;
                sumxb += xb[e]; /* sum_{t=s+1}^{e} xb[t] */
                fwd_ck = mp_max_u64(fwd_ck, i == s ? P + x[s + 1] + ft[s] : P + x[i] + x[i + 1] + ft[i]);
                fwd_st = mp_max_u64(fwd_st, P + sumxb + ft[i]);
                bwd = mp_max_u64(bwd, P + sumxb + x[i + 1] + x[i] + bt[i]);
                recin = mp_max_u64(recin, sumxb + ft[i]);
                if (bwd > M)
                    break; /* monotone in e for both flags */
                ck_ok = ck_ok && fwd_ck <= M;
                st_ok = st_ok && fwd_st <= M;
                if (!ck_ok && !st_ok)
                    break;
                for (int flag = 1; flag >= 0; flag--) {
                    uint64_t P2;
                    double c;
                    if (flag) {
                        if (!ck_ok || P + x[e] + recin > M)
                            continue;
                        P2 = P + x[e];
                        c = base + (F[e] - F[s]);
                    } else {
                        if (!st_ok)
                            continue;
                        P2 = P + sumxb;
                        c = base;
                    }
                    if (P2 > M || (e == L && P2 + x[L] + bt[L] > M))
                        continue;
                    size_t at = e * Mn + (size_t)P2;
                    if (c < g->cost[at]) {
                        g->cost[at] = c;
                        g->prev_s[at] = (int32_t)s;
                        g->prev_p[at] = (int32_t)P;
                        g->ck[at] = (unsigned char)flag;
                    }
                }
            }
        }
    }
    for (uint64_t P = 0; P <= M; P++) {
        double c = g->cost[L * Mn + P];
        if (c < *best_cost) {
            *best_cost = c;
            *best_p = P;
        }
    }
    free(F);
    return MP_OK;
}

/* Back-pointers from (L, P) into segment starts and flags (adjacent stored
 * segments merged: the schedule is the same). */
static enum mp_status segdp_schedule(const struct segdp *g, uint64_t P, struct mp_schedule *s, struct mp_diag *d)
{
    const size_t L = g->L;
    if (L == 0)
        return mp_ckpt_schedule_none(0, s) == MP_OK ? MP_OK : mp_fail(d, MP_ERR_NOMEM, "ckpt: out of memory");
    size_t *start = malloc(L * sizeof *start);
    bool *ck = malloc(L * sizeof *ck);
    enum mp_status st = MP_OK;
    if (!start || !ck) {
        st = mp_fail(d, MP_ERR_NOMEM, "ckpt: optimal-segments: out of memory");
        goto out;
    }
    size_t n = 0, e = L;
    while (e > 0) {
        size_t at = e * g->Mn + (size_t)P;
        if (n >= L || isinf(g->cost[at])) {
            st = mp_fail(d, MP_ERR_INTERNAL, "ckpt: optimal-segments: broken back-pointer at block %zu", e);
            goto out;
        }
        start[n] = (size_t)g->prev_s[at];
        ck[n] = g->ck[at] != 0;
        n++;
        P = (uint64_t)g->prev_p[at];
        e = (size_t)g->prev_s[at];
    }
    /* Reverse into ascending order, then merge stored neighbours. */
    for (size_t a = 0, z = n - 1; a < z; a++, z--) {
        size_t ts = start[a];
        bool tc = ck[a];
        start[a] = start[z];
        ck[a] = ck[z];
        start[z] = ts;
        ck[z] = tc;
    }
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        if (m > 0 && !ck[k] && !ck[m - 1])
            continue;
        start[m] = start[k];
        ck[m] = ck[k];
        m++;
    }
    st = mp_ckpt_schedule_segments(L, m, start, ck, s);
    if (st != MP_OK)
        st = mp_fail(d, st, "ckpt: optimal-segments: cannot build the schedule");
out:
    free(start);
    free(ck);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Planning                                                                  */
/* ------------------------------------------------------------------------ */

static enum mp_status check_chain(const struct mp_chain *c, struct mp_diag *d)
{
    if (!c || !c->f || !c->b || !c->x || !c->xb || !c->ft || !c->bt)
        return mp_fail(d, MP_ERR_USAGE, "ckpt: chain is not initialised");
    if (c->L > (size_t)INT32_MAX - 2)
        return mp_fail(d, MP_ERR_RANGE, "ckpt: chain of %zu blocks is too long", c->L);
    for (size_t i = 0; i <= c->L; i++) {
        if (c->xb[i] < c->x[i])
            return mp_fail(d, MP_ERR_MODEL, "ckpt: chain: xb[%zu] = %llu < x[%zu] = %llu", i,
                           (unsigned long long)c->xb[i], i, (unsigned long long)c->x[i]);
        if (!(c->b[i] >= 0) || isinf(c->b[i]))
            return mp_fail(d, MP_ERR_MODEL, "ckpt: chain: b[%zu] must be finite and >= 0", i);
        if (i < c->L && (!(c->f[i] >= 0) || isinf(c->f[i])))
            return mp_fail(d, MP_ERR_MODEL, "ckpt: chain: f[%zu] must be finite and >= 0", i);
    }
    return MP_OK;
}

static enum mp_status none_peak(const struct mp_chain *c, uint64_t *peak, struct mp_diag *d)
{
    struct mp_schedule s;
    mp_schedule_init(&s);
    enum mp_status st = mp_ckpt_schedule_none(c->L, &s);
    if (st != MP_OK)
        st = mp_fail(d, st, "ckpt: out of memory");
    else
        st = simulate(c, &s, peak, NULL, NULL, d);
    mp_schedule_release(&s);
    return st;
}

static const char *strategy_name(enum mp_ckpt_strategy s)
{
    return s == MP_CKPT_OPTIMAL ? "optimal" : "optimal-segments";
}

/* Simulated byte peak of a candidate schedule. */
static enum mp_status trial_peak(const struct mp_chain *c, const struct mp_schedule *s, uint64_t *peak,
                                 struct mp_diag *d)
{
    bool complete = false;
    enum mp_status st = simulate(c, s, peak, NULL, &complete, d);
    if (st == MP_OK && !complete)
        st = mp_fail(d, MP_ERR_INTERNAL, "ckpt: DP schedule is not a complete step");
    return st;
}

static void schedule_swap(struct mp_schedule *a, struct mp_schedule *b)
{
    struct mp_schedule t = *a;
    *a = *b;
    *b = t;
}

/* Rotor: one table up to Mtop holds every smaller budget.  OPT is
 * non-increasing in m, so scanning m0 downwards the first plan whose byte
 * peak fits is the cheapest of those tried; m0 = M - x0 always fits. */
static enum mp_status rotor_search(const struct mp_chain *c, const struct units *u, uint64_t budget, double *cost,
                                   struct mp_schedule *sched, struct mp_diag *d)
{
    struct rotor r;
    struct mp_schedule trial;
    enum mp_status st;
    const size_t L = c->L;
    if ((st = rotor_solve(u, L, &r, d)) != MP_OK)
        return st;
    mp_schedule_init(&trial);
    const uint64_t top = u->Mtop - u->x[0];
    const uint64_t lo = u->M >= u->x[0] ? u->M - u->x[0] : 0;
    for (uint64_t m0 = top + 1; m0-- > lo;) {
        double v = rotor_at(&r, 0, L, m0)->v;
        if (isinf(v))
            break; /* and so is every smaller m0 */
        if (u->exact) { /* nothing to verify: units are bytes */
            *cost = v;
            if (sched)
                st = rotor_schedule(&r, u, m0, sched, d);
            break;
        }
        uint64_t peak;
        if ((st = rotor_schedule(&r, u, m0, &trial, d)) != MP_OK || (st = trial_peak(c, &trial, &peak, d)) != MP_OK)
            break;
        if (peak <= budget) {
            *cost = v;
            if (sched)
                schedule_swap(sched, &trial);
            break;
        }
    }
    mp_schedule_release(&trial);
    rotor_release(&r);
    return st;
}

/* One segment-DP solve at M units; *cost = HUGE_VAL when infeasible, else the
 * plan (in s when s is not NULL). */
static enum mp_status segdp_try(const struct units *u, size_t L, uint64_t M, double sumfb, double *cost,
                                struct mp_schedule *s, struct mp_diag *d)
{
    struct segdp g;
    double best = HUGE_VAL;
    uint64_t bp = 0;
    enum mp_status st = segdp_solve(u, L, M, &g, &best, &bp, d);
    *cost = HUGE_VAL;
    if (st == MP_OK && !isinf(best)) {
        *cost = best + sumfb;
        if (s)
            st = segdp_schedule(&g, bp, s, d);
    }
    segdp_release(&g);
    return st;
}

/* Segment DP: the plan at M fits; in rounded mode bisect (M, Mtop] for the
 * largest unit budget whose plan still fits in bytes, keeping the cheapest. */
static enum mp_status segdp_search(const struct mp_chain *c, const struct units *u, uint64_t budget,
                                   double sumfb, double *cost, struct mp_schedule *sched, struct mp_diag *d)
{
    const size_t L = c->L;
    enum mp_status st = segdp_try(u, L, u->M, sumfb, cost, sched, d);
    if (st != MP_OK || u->exact)
        return st;
    struct mp_schedule trial;
    mp_schedule_init(&trial);
    uint64_t lo = u->M + 1, hi = u->Mtop; /* search [lo, hi] */
    while (lo <= hi) {
        uint64_t mid = lo + (hi - lo) / 2, peak;
        double v;
        if ((st = segdp_try(u, L, mid, sumfb, &v, &trial, d)) != MP_OK)
            break;
        if (isinf(v)) { /* feasibility is monotone in M */
            lo = mid + 1;
            continue;
        }
        if ((st = trial_peak(c, &trial, &peak, d)) != MP_OK)
            break;
        if (peak <= budget) {
            if (v < *cost) {
                *cost = v;
                if (sched)
                    schedule_swap(sched, &trial);
            }
            lo = mid + 1;
        } else {
            if (mid == 0)
                break;
            hi = mid - 1;
        }
    }
    mp_schedule_release(&trial);
    return st;
}

/* Runs the budgeted planner for strategy on c.  *cost = total cost of the
 * chosen plan as the DP computes it (HUGE_VAL when nothing fits); when sched is
 * not NULL and a plan exists, it receives the schedule.  At or above the
 * no-checkpoint peak the plan is `none`.  *unit_out / *exact_out (optional)
 * report the discretisation. */
static enum mp_status budget_dp(const struct mp_chain *c, enum mp_ckpt_strategy strategy, uint64_t budget,
                                size_t slots, double *cost, struct mp_schedule *sched, uint64_t *unit_out,
                                bool *exact_out, struct mp_diag *d)
{
    enum mp_status st;
    uint64_t np;
    struct units u;
    *cost = HUGE_VAL;
    if (unit_out)
        *unit_out = 1;
    if (exact_out)
        *exact_out = true;
    if ((st = none_peak(c, &np, d)) != MP_OK)
        return st;
    double sumfb = c->b[c->L];
    for (size_t i = 0; i < c->L; i++)
        sumfb += c->f[i] + c->b[i];
    if (budget >= np) { /* everything fits: store everything */
        *cost = sumfb;
        if (sched && (st = mp_ckpt_schedule_none(c->L, sched)) != MP_OK)
            return mp_fail(d, st, "ckpt: out of memory");
        return MP_OK;
    }
    if ((st = discretise(c, budget, slots ? slots : CKPT_DEFAULT_SLOTS, &u, d)) != MP_OK)
        return st;
    if (unit_out)
        *unit_out = u.unit;
    if (exact_out)
        *exact_out = u.exact;
    if (u.x[0] > u.Mtop) /* the model input alone does not fit */
        st = MP_OK;
    else if (strategy == MP_CKPT_OPTIMAL)
        st = rotor_search(c, &u, budget, cost, sched, d);
    else
        st = segdp_search(c, &u, budget, sumfb, cost, sched, d);
    units_release(&u);
    return st;
}

/* ---- long chains: the DP on groups of consecutive blocks ---------------------------------- */

/* The rotor DP costs about L^3 x slots: beyond this many blocks consecutive
 * blocks are grouped (identical ones first) and the DP runs on the groups, so
 * checkpoints fall only between groups; the schedule is expanded back to the
 * blocks and verified on the full chain like any other plan. */
#define CKPT_DP_GROUPS 64      /* longer chains: about this many groups */

static bool same_block(const struct mp_chain *c, size_t i, size_t j)
{
    return c->f[i] == c->f[j] && c->b[i] == c->b[j] && c->x[i] == c->x[j] && c->x[i + 1] == c->x[j + 1] &&
           c->xb[i + 1] == c->xb[j + 1] && c->ft[i] == c->ft[j] && c->bt[i] == c->bt[j];
}

/* Group starts for c: runs of identical blocks cut into groups of at most g; other
 * blocks alone; if that leaves too many groups, any consecutive blocks are grouped. */
static size_t make_groups(const struct mp_chain *c, size_t *start, size_t max_groups)
{
    size_t L = c->L, g = (L + max_groups - 1) / max_groups, n = 0;
    for (int mixed = 0; mixed < 2; mixed++) {
        n = 0;
        for (size_t i = 0; i < L;) {
            size_t j = i + 1;
            while (j < L && j - i < g && (mixed || same_block(c, i, j)))
                j++;
            start[n++] = i;
            i = j;
        }
        if (n <= 2 * max_groups)
            break;
    }
    start[n] = L;
    return n;
}

static uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* The chain of the groups: costs add; a group keeps what its blocks keep; its
 * transients are its blocks' peaks above the group's own start and end. */
static enum mp_status group_chain(const struct mp_chain *c, const size_t *start, size_t n, struct mp_chain *g)
{
    enum mp_status st = mp_chain_init(g, n);
    if (st != MP_OK)
        return st;
    for (size_t k = 0; k < n; k++) {
        size_t a = start[k], e = start[k + 1];
        uint64_t kept = 0, fe_peak = 0, fn_peak = 0, b_peak = 0;
        for (size_t j = a; j < e; j++) {
            g->f[k] += c->f[j];
            g->b[k] += c->b[j];
            fe_peak = mp_max_u64(fe_peak, kept + c->xb[j + 1] + c->ft[j]);
            fn_peak = mp_max_u64(fn_peak, c->x[j] + c->x[j + 1] + c->ft[j]);
            kept += c->xb[j + 1];
            b_peak = mp_max_u64(b_peak, kept + c->x[j + 1] + c->x[j] + c->bt[j]);
        }
        g->x[k] = c->x[a];
        g->xb[k + 1] = mp_max_u64(kept, c->x[e]);
        g->ft[k] = mp_max_u64(sat_sub(fe_peak, g->xb[k + 1]), sat_sub(fn_peak, c->x[a] + c->x[e]));
        g->bt[k] = sat_sub(b_peak, kept + c->x[e] + c->x[a]);
        if (c->repeated)
            g->repeated[k] = c->repeated[a];
        for (size_t j = a; c->gc_before && j < e; j++)
            g->gc_before[k] += c->gc_before[j];
    }
    g->x[n] = c->x[c->L];
    g->xb[0] = c->xb[0];
    g->b[n] = c->b[c->L];
    g->bt[n] = c->bt[c->L];
    return MP_OK;
}

/* A schedule on the groups as a schedule on the blocks. */
static enum mp_status expand_schedule(const struct mp_schedule *gs, const size_t *start, size_t L,
                                      struct mp_schedule *s)
{
    enum mp_status st = MP_OK;
    for (size_t k = 0; k < gs->n && st == MP_OK; k++) {
        const struct mp_sched_op *op = &gs->ops[k];
        if (op->kind == MP_SCHED_LOSS) {
            st = mp_schedule_push(s, MP_SCHED_LOSS, (uint32_t)L);
            continue;
        }
        size_t a = start[op->index], e = start[op->index + 1];
        for (size_t j = a; j < e && st == MP_OK; j++) {
            size_t i = op->kind == MP_SCHED_B ? e - 1 - (j - a) : j;
            enum mp_sched_kind kind = op->kind == MP_SCHED_FC && i != a ? MP_SCHED_FN : op->kind;
            st = mp_schedule_push(s, kind, (uint32_t)i);
        }
    }
    return st;
}

static uint64_t ceil_sqrt(uint64_t n);

/* budget_dp, on groups of blocks when the chain is long (*group = blocks per group
 * of the largest group, 1 when exact).  The grouped chain's memory model is an
 * approximation: the expanded plan is simulated on c, and the budget given to the
 * DP is lowered by the excess until the plan fits (or nothing does). */
static enum mp_status budget_dp_long(const struct mp_chain *c, enum mp_ckpt_strategy strategy, uint64_t budget,
                                     size_t slots, double *cost, struct mp_schedule *sched, uint64_t *unit,
                                     bool *exact, size_t *group, struct mp_diag *d)
{
    *group = 1;
    uint64_t np;
    enum mp_status st = none_peak(c, &np, d);
    if (st != MP_OK)
        return st;
    if (c->L <= MP_CKPT_DP_MAX_BLOCKS || budget >= np)
        return budget_dp(c, strategy, budget, slots, cost, sched, unit, exact, d);
    size_t *start = malloc((c->L + 1) * sizeof *start);
    if (!start)
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: out of memory");
    size_t n = make_groups(c, start, CKPT_DP_GROUPS);
    for (size_t k = 0; k < n; k++)
        *group = start[k + 1] - start[k] > *group ? start[k + 1] - start[k] : *group;
    struct mp_chain g;
    st = group_chain(c, start, n, &g);
    if (st != MP_OK) {
        free(start);
        return mp_fail(d, st, "ckpt: out of memory");
    }
    uint64_t b = budget;
    for (int attempt = 0; attempt < 8; attempt++) {
        mp_progress("planning: %s DP on %zu groups of up to %zu blocks (attempt %d)", strategy_name(strategy), n,
                    *group, attempt + 1);
        struct mp_schedule gs;
        mp_schedule_init(&gs);
        st = budget_dp(&g, strategy, b, slots, cost, &gs, unit, exact, d);
        if (st == MP_OK && !isinf(*cost)) {
            mp_schedule_release(sched);
            mp_schedule_init(sched);
            st = expand_schedule(&gs, start, c->L, sched);
        }
        mp_schedule_release(&gs);
        if (st != MP_OK || isinf(*cost))
            break;
        uint64_t peak;
        double total;
        bool complete;
        if ((st = simulate(c, sched, &peak, &total, &complete, d)) != MP_OK)
            break;
        *cost = total;
        if (peak <= budget)
            break;
        uint64_t over = peak - budget + budget / 64;
        if (over >= b) {
            *cost = HUGE_VAL;
            break;
        }
        b -= over;
        *cost = HUGE_VAL;
    }
    /* Checkpoints fall only between groups, so on a long chain the DP's plan can need more
     * memory than sqrt's, or cost more: sqrt's plan is taken instead where it fits and is
     * cheaper, so the optimal plan is never worse than sqrt. */
    if (st == MP_OK) {
        struct mp_schedule sq;
        mp_schedule_init(&sq);
        uint64_t peak;
        double total;
        bool complete;
        st = mp_ckpt_schedule_sequential(c->L, (size_t)ceil_sqrt(c->L), &sq);
        if (st != MP_OK)
            st = mp_fail(d, st, "ckpt: out of memory");
        else if ((st = simulate(c, &sq, &peak, &total, &complete, d)) == MP_OK && complete && peak <= budget &&
                 (isinf(*cost) || total < *cost)) {
            *cost = total;
            schedule_swap(sched, &sq);
        }
        mp_schedule_release(&sq);
    }
    *exact = false;
    mp_chain_release(&g);
    free(start);
    return st;
}

enum mp_status mp_ckpt_dp_cost(const struct mp_chain *c, enum mp_ckpt_strategy strategy, uint64_t budget_bytes,
                               size_t slots, double *cost, struct mp_diag *d)
{
    enum mp_status st;
    if (strategy != MP_CKPT_OPTIMAL && strategy != MP_CKPT_OPTIMAL_SEGMENTS)
        return mp_fail(d, MP_ERR_USAGE, "ckpt: only optimal and optimal-segments have a DP cost");
    if ((st = check_chain(c, d)) != MP_OK)
        return st;
    return budget_dp(c, strategy, budget_bytes, slots, cost, NULL, NULL, NULL, d);
}

void mp_ckpt_plan_init(struct mp_ckpt_plan *p)
{
    memset(p, 0, sizeof *p);
    mp_schedule_init(&p->sched);
}

void mp_ckpt_plan_release(struct mp_ckpt_plan *p)
{
    if (!p)
        return;
    mp_schedule_release(&p->sched);
    free(p->checkpointed);
    free(p->segments);
    mp_ckpt_plan_init(p);
}

/* ceil(sqrt(n)) in integers. */
static uint64_t ceil_sqrt(uint64_t n)
{
    uint64_t r = (uint64_t)sqrt((double)n);
    while (r > 0 && r * r >= n && (r - 1) * (r - 1) >= n)
        r--;
    while (r * r < n)
        r++;
    return r;
}

/* Fills checkpointed[], segments, multilevel from p->sched. */
static enum mp_status plan_readout(struct mp_ckpt_plan *p, struct mp_diag *d)
{
    const size_t L = p->L;
    unsigned char *first = calloc(L ? L : 1, 1); /* kind + 1 of the first forward, 0 = none */
    uint32_t *nfwd = calloc(L ? L : 1, sizeof *nfwd);
    p->checkpointed = calloc(L ? L : 1, sizeof *p->checkpointed);
    if (!first || !nfwd || !p->checkpointed) {
        free(first);
        free(nfwd);
        return mp_fail(d, MP_ERR_NOMEM, "ckpt: out of memory");
    }
    for (size_t k = 0; k < p->sched.n; k++) {
        const struct mp_sched_op *op = &p->sched.ops[k];
        if (op->kind != MP_SCHED_FE && op->kind != MP_SCHED_FC && op->kind != MP_SCHED_FN)
            continue;
        if (!first[op->index])
            first[op->index] = (unsigned char)(op->kind + 1);
        if (nfwd[op->index] < UINT32_MAX)
            nfwd[op->index]++;
    }
    size_t nseg = 0;
    for (size_t i = 0; i < L; i++) {
        p->checkpointed[i] = first[i] == MP_SCHED_FC + 1 || first[i] == MP_SCHED_FN + 1;
        if (nfwd[i] > 2)
            p->multilevel = true;
        if (p->checkpointed[i] && (i == 0 || !p->checkpointed[i - 1] || first[i] == MP_SCHED_FC + 1))
            nseg++;
    }
    if (nseg > 0) {
        p->segments = calloc(nseg, sizeof *p->segments);
        if (!p->segments) {
            free(first);
            free(nfwd);
            return mp_fail(d, MP_ERR_NOMEM, "ckpt: out of memory");
        }
    }
    /* A segment starts at each Fc (or an Fn not continuing a run) and runs over the Fn after it. */
    size_t k = 0;
    for (size_t i = 0; i < L; i++) {
        if (!p->checkpointed[i])
            continue;
        if (i == 0 || !p->checkpointed[i - 1] || first[i] == MP_SCHED_FC + 1) {
            p->segments[k][0] = i;
            p->segments[k][1] = i + 1;
            k++;
        } else
            p->segments[k - 1][1] = i + 1;
    }
    p->n_segments = nseg;
    free(first);
    free(nfwd);
    return MP_OK;
}

/* "layers": one segment per block, checkpointed when the block is repeated (each
 * decoder layer under transformers' gradient checkpointing; embeddings and head run
 * normally).  A chain without repeated blocks has nothing to wrap: MP_ERR_USAGE. */
/* Each repeated block wrapped alone; with every > 1 only the repeated blocks whose index among
 * them is a multiple of every (transformers 5.24 modeling_utils.py _set_gradient_checkpointing:
 * `layer_index % every_n_layers == 0` over its GradientCheckpointingLayer modules in order). */
static enum mp_status schedule_layers(const struct mp_chain *c, uint64_t every, struct mp_schedule *s,
                                      struct mp_diag *d)
{
    size_t L = c->L, n = 0;
    for (size_t i = 0; i < L; i++)
        n += c->repeated && c->repeated[i];
    if (n == 0)
        return mp_fail(d, MP_ERR_USAGE, "ckpt: layers: the model has no repeated blocks (decoder layers) "
                                         "to wrap; use every:1");
    size_t *start = malloc(L * sizeof *start);
    bool *ck = malloc(L * sizeof *ck);
    enum mp_status st = MP_ERR_NOMEM;
    if (start && ck) {
        uint64_t layer = 0;
        for (size_t i = 0; i < L; i++) {
            start[i] = i;
            layer += c->gc_before ? c->gc_before[i] : 0; /* layers without a block of their own */
            ck[i] = c->repeated[i] && (every <= 1 || layer % every == 0);
            layer += c->repeated[i];
        }
        st = mp_ckpt_schedule_segments(L, L, start, ck, s);
    }
    free(start);
    free(ck);
    if (st != MP_OK)
        mp_fail(d, st, "ckpt: layers: out of memory");
    return st;
}

enum mp_status mp_ckpt_plan_make(const struct mp_chain *c, const struct mp_ckpt_spec *spec, uint64_t budget_bytes,
                                 size_t slots, struct mp_ckpt_plan *p, struct mp_diag *d)
{
    enum mp_status st;
    char sbuf[64];
    mp_ckpt_plan_init(p);
    if (!spec)
        return mp_fail(d, MP_ERR_USAGE, "ckpt: no strategy");
    if ((st = check_chain(c, d)) != MP_OK)
        return st;
    const size_t L = c->L;
    struct mp_ckpt_spec eff = *spec;
    bool budgeted = false;
    uint64_t unit = 1;
    bool exact = true;

    switch (spec->strategy) {
    case MP_CKPT_NONE:
        st = mp_ckpt_schedule_none(L, &p->sched);
        break;
    case MP_CKPT_SQRT:
        st = mp_ckpt_schedule_sequential(L, L ? (size_t)ceil_sqrt(L) : 1, &p->sched);
        break;
    case MP_CKPT_SEGMENTS:
    case MP_CKPT_EVERY:
        if (spec->k == 0)
            return mp_fail(d, MP_ERR_USAGE, "ckpt: %s: K must be at least 1",
                           spec->strategy == MP_CKPT_SEGMENTS ? "segments" : "every");
        eff.k = mp_min_u64(spec->k, L ? L : 1); /* K > L means the same plan as K = L */
        if (spec->strategy == MP_CKPT_SEGMENTS)
            st = mp_ckpt_schedule_sequential(L, (size_t)eff.k, &p->sched);
        else if (L == 0)
            st = mp_ckpt_schedule_none(0, &p->sched);
        else
            st = schedule_runs(L, (L + (size_t)eff.k - 1) / (size_t)eff.k, (size_t)eff.k, true, &p->sched);
        break;
    case MP_CKPT_LAYERS:
        st = schedule_layers(c, spec->k, &p->sched, d);
        if (st != MP_OK)
            goto fail;
        p->sched.offload = spec->offload;
        p->sched.sac = spec->sac;
        break;
    case MP_CKPT_OPTIMAL:
    case MP_CKPT_OPTIMAL_SEGMENTS: {
        budgeted = true;
        uint64_t np;
        double cost;
        st = budget_dp_long(c, spec->strategy, budget_bytes, slots, &cost, &p->sched, &unit, &exact, &p->dp_group, d);
        if (st != MP_OK)
            goto fail;
        if (isinf(cost) && (st = none_peak(c, &np, d)) != MP_OK)
            goto fail;
        if (isinf(cost)) {
            char b1[32], b2[32], b3[32];
            if (exact)
                st = mp_fail(d, MP_ERR_INFEASIBLE, "ckpt: %s: no schedule fits in %s (the no-checkpoint peak is %s)",
                             strategy_name(spec->strategy), mp_fmt_bytes(budget_bytes, b1, sizeof b1),
                             mp_fmt_bytes(np, b2, sizeof b2));
            else
                st = mp_fail(d, MP_ERR_INFEASIBLE,
                             "ckpt: %s: no schedule fits in %s at %zu slots of %s (the no-checkpoint peak is %s)",
                             strategy_name(spec->strategy), mp_fmt_bytes(budget_bytes, b1, sizeof b1),
                             slots ? slots : (size_t)CKPT_DEFAULT_SLOTS, mp_fmt_bytes(unit, b3, sizeof b3),
                             mp_fmt_bytes(np, b2, sizeof b2));
            goto fail;
        }
        break;
    }
    default:
        return mp_fail(d, MP_ERR_USAGE, "ckpt: unknown strategy %d", (int)spec->strategy);
    }
    if (st != MP_OK) {
        if (st == MP_ERR_USAGE)
            mp_fail(d, st, "ckpt: %s: bad schedule parameters", mp_ckpt_spec_str(&eff, sbuf, sizeof sbuf));
        else if (st == MP_ERR_NOMEM)
            mp_fail(d, st, "ckpt: out of memory");
        goto fail;
    }

    /* Verify: a complete step, and within budget for the budgeted strategies. */
    bool complete = false;
    if ((st = simulate(c, &p->sched, &p->peak_bytes, &p->total_cost, &complete, d)) != MP_OK)
        goto fail;
    if (!complete) {
        st = mp_fail(d, MP_ERR_INTERNAL, "ckpt: %s: schedule does not end with only y_0 resident",
                     mp_ckpt_spec_str(&eff, sbuf, sizeof sbuf));
        goto fail;
    }
    if (budgeted && p->peak_bytes > budget_bytes) {
        char b1[32], b2[32];
        st = mp_fail(d, MP_ERR_INFEASIBLE, "ckpt: %s: discretised plan peaks at %s > budget %s",
                     strategy_name(spec->strategy), mp_fmt_bytes(p->peak_bytes, b1, sizeof b1),
                     mp_fmt_bytes(budget_bytes, b2, sizeof b2));
        goto fail;
    }
    p->spec = eff;
    p->L = L;
    double sumfb = c->b[L];
    for (size_t i = 0; i < L; i++)
        sumfb += c->f[i] + c->b[i];
    p->recompute_cost = p->total_cost - sumfb;
    if (p->recompute_cost < 0 && p->recompute_cost > -1e-9 * (sumfb > 1 ? sumfb : 1))
        p->recompute_cost = 0; /* rounding of the two sums */
    if ((st = plan_readout(p, d)) != MP_OK)
        goto fail;
    return MP_OK;
fail:
    mp_ckpt_plan_release(p);
    return st;
}

void mp_ckpt_compare(const struct mp_chain *c, uint64_t limit_bytes, size_t slots, struct mp_plan_cmp *cmp)
{
    memset(cmp, 0, sizeof *cmp);
    struct mp_diag d;
    struct mp_ckpt_plan p;
    struct mp_ckpt_spec sq = {.strategy = MP_CKPT_SQRT, .k = 0};
    if (mp_ckpt_plan_make(c, &sq, 0, slots, &p, &d) == MP_OK) {
        cmp->have_sqrt = true;
        cmp->sqrt_peak = p.peak_bytes;
        cmp->sqrt_recompute = p.recompute_cost;
    }
    mp_ckpt_plan_release(&p);
    const uint64_t all = c->L <= 1000 ? c->L : 32; /* every K, or 1..32 then steps of about 6% */
    cmp->seg_sampled = c->L > all;
    for (uint64_t k = 1; k <= c->L; k += k < all ? 1 : 1 + k / 16) {
        struct mp_ckpt_spec sg = {.strategy = MP_CKPT_SEGMENTS, .k = k};
        mp_progress("planning: comparing with segments:%llu of %zu blocks", (unsigned long long)k, c->L);
        if (mp_ckpt_plan_make(c, &sg, 0, slots, &p, &d) == MP_OK && p.peak_bytes <= limit_bytes &&
            (!cmp->have_seg || p.recompute_cost < cmp->seg_recompute)) {
            cmp->have_seg = true;
            cmp->seg_k = k;
            cmp->seg_peak = p.peak_bytes;
            cmp->seg_recompute = p.recompute_cost;
        }
        mp_ckpt_plan_release(&p);
    }
}

/* ------------------------------------------------------------------------ */
/* Revolve (docs/checkpointing.md#revolve)                                   */
/* ------------------------------------------------------------------------ */

uint64_t mp_revolve_beta(uint64_t s, uint64_t t)
{
    /* C(s+t, s), saturating at UINT64_MAX.  r_i = C(n+i, i) = r_{i-1} (n+i) / i
     * with n = max(s, t); each step at least doubles r, so <= 64 steps run
     * before it saturates. */
    uint64_t k = s < t ? s : t, n = s < t ? t : s, r = 1;
    for (uint64_t i = 1; i <= k; i++) {
        uint64_t num;
        if (!mp_add_u64(n, i, &num))
            return UINT64_MAX;
        uint64_t g = mp_gcd_u64(r, i);
        if (!mp_mul_u64(r / g, num / (i / g), &r))
            return UINT64_MAX;
    }
    return r;
}

uint64_t mp_revolve_numforw(uint64_t steps, uint64_t snaps)
{
    if (steps <= 1)
        return 0;
    if (snaps == 0)
        return UINT64_MAX; /* cannot reverse two steps without a snapshot */
    if (snaps >= steps - 1)
        return steps - 1; /* t = 1 */
    /* Smallest t with beta(snaps, t) >= steps; beta(snaps, 0) = 1 < steps and
     * beta(snaps, steps - 1) >= steps. */
    uint64_t lo = 1, hi = steps - 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (mp_revolve_beta(snaps, mid) >= steps)
            hi = mid;
        else
            lo = mid + 1;
    }
    uint64_t t = lo, prod;
    if (!mp_mul_u64(t, steps, &prod))
        return UINT64_MAX;
    uint64_t sub = mp_revolve_beta(snaps + 1, t - 1);
    return sub > prod ? 0 : prod - sub;
}
