/* test_ckpt.c — checkpoint placement: the known answers of
 * docs/checkpointing.md#known-answers (T1 Revolve, T2 Griewank DP, T4 unit chain,
 * T5 segment rule), the T8 invariants on random chains, brute-force optimality of the segment DP,
 * discretisation, spec parsing and the simulator's errors.
 * Random chains come from a fixed-seed PRNG, so every run checks the same cases.
 * Costs in random chains are small integers, so DP and simulator sums are exact.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "tier.h"

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint64_t rng_range(uint64_t lo, uint64_t hi)
{
    return lo + rng_next() % (hi - lo + 1);
}

/* f = b = 1, b[L] = 0, x = xb = scale, no temporaries. */
static void unit_chain(struct mp_chain *c, size_t L, uint64_t scale)
{
    assert_int_equal(mp_chain_init(c, L), MP_OK);
    for (size_t i = 0; i <= L; i++) {
        c->x[i] = c->xb[i] = scale;
        c->b[i] = i < L ? 1 : 0;
        if (i < L)
            c->f[i] = 1;
    }
}

/* T8 chains: sizes 1..6, xb = x + 0..10, integer f and b; temporaries 0..tmax. */
static void random_chain(struct mp_chain *c, size_t L, uint64_t tmax)
{
    assert_int_equal(mp_chain_init(c, L), MP_OK);
    for (size_t i = 0; i <= L; i++) {
        c->x[i] = rng_range(1, 6);
        c->xb[i] = i == 0 ? c->x[0] : c->x[i] + rng_range(0, 10);
        c->b[i] = (double)rng_range(i < L ? 1 : 0, 20);
        c->bt[i] = tmax ? rng_range(0, tmax) : 0;
        if (i < L) {
            c->f[i] = (double)rng_range(1, 10);
            c->ft[i] = tmax ? rng_range(0, tmax) : 0;
        }
    }
}

static double sum_fb(const struct mp_chain *c)
{
    double s = c->b[c->L];
    for (size_t i = 0; i < c->L; i++)
        s += c->f[i] + c->b[i];
    return s;
}

static uint64_t none_peak(const struct mp_chain *c)
{
    struct mp_schedule s;
    uint64_t peak;
    double cost;
    mp_schedule_init(&s);
    assert_int_equal(mp_ckpt_schedule_none(c->L, &s), MP_OK);
    assert_int_equal(mp_ckpt_simulate(c, &s, &peak, &cost, NULL), MP_OK);
    mp_schedule_release(&s);
    return peak;
}

static double dp_cost(const struct mp_chain *c, enum mp_ckpt_strategy st, uint64_t budget)
{
    double v = -1;
    struct mp_diag d;
    assert_int_equal(mp_ckpt_dp_cost(c, st, budget, 0, &v, &d), MP_OK);
    return v;
}

/* Makes a plan with the given spec; returns its status and leaves p released on error. */
static enum mp_status make(const struct mp_chain *c, enum mp_ckpt_strategy st, uint64_t k, uint64_t budget,
                           size_t slots, struct mp_ckpt_plan *p)
{
    struct mp_ckpt_spec spec = {.strategy = st, .k = k};
    struct mp_diag d;
    return mp_ckpt_plan_make(c, &spec, budget, slots, p, &d);
}

/* ---- T1, T2: Revolve -------------------------------------------------- */

static void test_revolve_beta_known(void **state)
{
    (void)state;
    assert_int_equal(mp_revolve_beta(5, 5), 252);
    assert_int_equal(mp_revolve_beta(10, 3), 286);
    assert_int_equal(mp_revolve_beta(3, 10), 286);
    assert_int_equal(mp_revolve_beta(0, 7), 1);
    assert_int_equal(mp_revolve_beta(1, 7), 8);
    assert_true(mp_revolve_beta(200, 200) == UINT64_MAX); /* saturates */
}

static void test_revolve_numforw_small(void **state)
{
    (void)state;
    static const uint64_t c2[15] = {0, 1, 2, 4, 6, 8, 11, 14, 17, 20, 24, 28, 32, 36, 40};
    static const uint64_t c3[15] = {0, 1, 2, 3, 5, 7, 9, 11, 13, 15, 18, 21, 24, 27, 30};
    static const uint64_t c4[15] = {0, 1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24};
    for (uint64_t l = 1; l <= 40; l++)
        assert_int_equal(mp_revolve_numforw(l, 1), l * (l - 1) / 2);
    for (uint64_t l = 1; l <= 15; l++) {
        assert_int_equal(mp_revolve_numforw(l, 2), c2[l - 1]);
        assert_int_equal(mp_revolve_numforw(l, 3), c3[l - 1]);
        assert_int_equal(mp_revolve_numforw(l, 4), c4[l - 1]);
    }
}

static void test_revolve_numforw_large(void **state)
{
    (void)state;
    static const uint64_t l100[10] = {4950, 845, 490, 374, 316, 280, 255, 245, 234, 222};
    for (uint64_t c = 1; c <= 10; c++)
        assert_int_equal(mp_revolve_numforw(100, c), l100[c - 1]);
    static const uint64_t cs[7] = {1, 2, 3, 4, 5, 10, 20};
    static const uint64_t l1000[7] = {499500, 28820, 12155, 7998, 6284, 3636, 2747};
    for (size_t k = 0; k < 7; k++)
        assert_int_equal(mp_revolve_numforw(1000, cs[k]), l1000[k]);
}

/* T2: the homogeneous Griewank DP (u_f = u_b = 1), written here independently. */
static void test_revolve_griewank_dp_matches(void **state)
{
    (void)state;
    enum { LMAX = 120, CMAX = 10 };
    static uint64_t opt[LMAX + 1][CMAX + 1];
    for (int m = 1; m <= CMAX; m++) {
        opt[0][m] = 1;
        opt[1][m] = 3;
    }
    for (int l = 0; l <= LMAX; l++)
        opt[l][1] = (uint64_t)(l + 1) + (uint64_t)l * (uint64_t)(l + 1) / 2;
    for (int m = 2; m <= CMAX; m++)
        for (int l = 2; l <= LMAX; l++) {
            uint64_t best = UINT64_MAX;
            for (int j = 1; j < l; j++) {
                uint64_t v = (uint64_t)j + opt[l - j][m - 1] + opt[j - 1][m];
                if (v < best)
                    best = v;
            }
            opt[l][m] = best;
        }
    int mismatches = 0;
    for (int l = 0; l <= LMAX; l++)
        for (int m = 1; m <= CMAX; m++)
            if (opt[l][m] - (uint64_t)(l + 1) != mp_revolve_numforw((uint64_t)l + 1, (uint64_t)m))
                mismatches++;
    assert_int_equal(mismatches, 0);
}

/* ---- chain, spec, schedule basics -------------------------------------- */

static void test_chain_init_zeroed(void **state)
{
    (void)state;
    struct mp_chain c;
    assert_int_equal(mp_chain_init(&c, 3), MP_OK);
    assert_int_equal(c.L, 3);
    for (size_t i = 0; i <= 3; i++) {
        assert_true(c.x[i] == 0 && c.xb[i] == 0 && c.bt[i] == 0 && c.b[i] == 0);
        if (i < 3)
            assert_true(c.f[i] == 0 && c.ft[i] == 0);
    }
    mp_chain_release(&c);
    assert_null(c.f);
    mp_chain_release(&c); /* idempotent */
}

static void test_spec_parse_roundtrip(void **state)
{
    (void)state;
    static const char *ok[] = {"none", "sqrt", "segments:4", "every:2", "optimal", "optimal-segments",
                               "segments:18446744073709551615", "layers", "layers:3"};
    char buf[64];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        struct mp_ckpt_spec s;
        assert_int_equal(mp_ckpt_spec_parse(ok[i], &s), MP_OK);
        assert_string_equal(mp_ckpt_spec_str(&s, buf, sizeof buf), ok[i]);
    }
    struct mp_ckpt_spec s;
    assert_int_equal(mp_ckpt_spec_parse("segments:12", &s), MP_OK);
    assert_int_equal(s.strategy, MP_CKPT_SEGMENTS);
    assert_int_equal(s.k, 12);
    assert_int_equal(mp_ckpt_spec_parse("every:3", &s), MP_OK);
    assert_int_equal(s.strategy, MP_CKPT_EVERY);
    assert_int_equal(s.k, 3);
    assert_int_equal(mp_ckpt_spec_parse("layers:4", &s), MP_OK);
    assert_int_equal(s.strategy, MP_CKPT_LAYERS);
    assert_int_equal(s.k, 4);
}

static void test_spec_parse_rejects(void **state)
{
    (void)state;
    static const char *bad[] = {"",           "segments:0", "segments:x", "every:",     "segments",
                                "every:0",    "segments:-1", "segments:+2", "segments: 2", "segments:2 ",
                                "segments:2x", "every:1e3", "segments:99999999999999999999", "Optimal",
                                "sqrt:2",     "none ",      "optimal-segment", "segments::2", "every:0x10",
                                "layers:",    "layers:0",   "layers:-2",  "layers:2x",  "layers2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct mp_ckpt_spec s = {.strategy = MP_CKPT_OPTIMAL, .k = 77};
        assert_int_equal(mp_ckpt_spec_parse(bad[i], &s), MP_ERR_USAGE);
        assert_int_equal(s.strategy, MP_CKPT_OPTIMAL); /* untouched */
        assert_int_equal(s.k, 77);
    }
    assert_int_equal(mp_ckpt_spec_parse(NULL, NULL), MP_ERR_USAGE);
}

static void test_schedule_none_ops(void **state)
{
    (void)state;
    struct mp_schedule s;
    mp_schedule_init(&s);
    assert_int_equal(mp_ckpt_schedule_none(3, &s), MP_OK);
    static const struct mp_sched_op want[] = {{MP_SCHED_FE, 0}, {MP_SCHED_FE, 1}, {MP_SCHED_FE, 2},
                                              {MP_SCHED_LOSS, 3}, {MP_SCHED_B, 2}, {MP_SCHED_B, 1},
                                              {MP_SCHED_B, 0}};
    assert_int_equal(s.n, 7);
    for (size_t i = 0; i < 7; i++) {
        assert_int_equal(s.ops[i].kind, want[i].kind);
        assert_int_equal(s.ops[i].index, want[i].index);
    }
    mp_schedule_release(&s);
}

static void test_schedule_segments_ops(void **state)
{
    (void)state;
    /* [0,2) checkpointed, [2,3) stored. */
    struct mp_schedule s;
    mp_schedule_init(&s);
    size_t start[] = {0, 2};
    bool ck[] = {true, false};
    assert_int_equal(mp_ckpt_schedule_segments(3, 2, start, ck, &s), MP_OK);
    static const struct mp_sched_op want[] = {{MP_SCHED_FC, 0}, {MP_SCHED_FN, 1}, {MP_SCHED_FE, 2},
                                              {MP_SCHED_LOSS, 3}, {MP_SCHED_B, 2}, {MP_SCHED_FE, 0},
                                              {MP_SCHED_FE, 1}, {MP_SCHED_B, 1}, {MP_SCHED_B, 0}};
    assert_int_equal(s.n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < s.n; i++) {
        assert_int_equal(s.ops[i].kind, want[i].kind);
        assert_int_equal(s.ops[i].index, want[i].index);
    }
    /* Bad boundaries. */
    size_t bad1[] = {1, 2};
    size_t bad2[] = {0, 0};
    size_t bad3[] = {0, 3};
    assert_int_equal(mp_ckpt_schedule_segments(3, 2, bad1, ck, &s), MP_ERR_USAGE);
    assert_int_equal(mp_ckpt_schedule_segments(3, 2, bad2, ck, &s), MP_ERR_USAGE);
    assert_int_equal(mp_ckpt_schedule_segments(3, 2, bad3, ck, &s), MP_ERR_USAGE);
    assert_int_equal(mp_ckpt_schedule_segments(3, 0, start, ck, &s), MP_ERR_USAGE);
    assert_int_equal(mp_ckpt_schedule_sequential(3, 0, &s), MP_ERR_USAGE);
    assert_int_equal(mp_ckpt_schedule_sequential(3, 4, &s), MP_ERR_USAGE);
    mp_schedule_release(&s);
}

/* ---- simulator ---------------------------------------------------------- */

static void test_simulate_counts_input_and_gradients(void **state)
{
    (void)state;
    struct mp_chain c;
    assert_int_equal(mp_chain_init(&c, 1), MP_OK);
    c.x[0] = c.xb[0] = 10;
    c.x[1] = 3;
    c.xb[1] = 5;
    c.ft[0] = 7;
    c.bt[0] = 11;
    c.bt[1] = 13;
    c.f[0] = 2;
    c.b[0] = 4;
    c.b[1] = 0.5;
    struct mp_schedule s;
    mp_schedule_init(&s);
    assert_int_equal(mp_ckpt_schedule_none(1, &s), MP_OK);
    uint64_t peak;
    double cost;
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, NULL), MP_OK);
    /* Fe_0: 10+5+7 = 22; Loss: 10+5+3+13 = 31; B_0: 10+5+3+10+11 = 39. */
    assert_int_equal(peak, 39);
    assert_float_equal(cost, 6.5, 0);
    mp_schedule_release(&s);
    mp_chain_release(&c);
}

static void test_simulate_loss_frees_plain_xl(void **state)
{
    (void)state;
    struct mp_chain c;
    assert_int_equal(mp_chain_init(&c, 1), MP_OK);
    c.x[0] = c.xb[0] = 1;
    c.x[1] = c.xb[1] = 4;
    c.f[0] = c.b[0] = 1;
    struct mp_schedule s;
    mp_schedule_init(&s);
    size_t start[] = {0};
    bool ck[] = {true};
    assert_int_equal(mp_ckpt_schedule_segments(1, 1, start, ck, &s), MP_OK);
    uint64_t peak;
    double cost;
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, NULL), MP_OK);
    /* Fc_0: 1+4; Loss: 1+4+4 = 9, frees x_1; Fe_0: 1+4+4 = 9; B_0: 1+4+4+1 = 10.
     * Were x_1 kept after the loss, Fe_0 would reach 13. */
    assert_int_equal(peak, 10);
    assert_float_equal(cost, 3, 0);
    mp_schedule_release(&s);
    mp_chain_release(&c);
}

static void test_simulate_unmet_requirement_names_op(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 3, 1);
    struct mp_schedule s;
    mp_schedule_init(&s);
    struct mp_diag d;
    uint64_t peak;
    double cost;

    /* B_2 before any forward: y_3 missing. */
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_B, 2), MP_OK);
    memset(&d, 0, sizeof d);
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, &d), MP_ERR_INTERNAL);
    assert_non_null(strstr(d.msg, "B_2"));
    assert_non_null(strstr(d.msg, "y_3"));

    /* Fn_1 with x_1 never produced. */
    s.n = 0;
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FN, 1), MP_OK);
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, &d), MP_ERR_INTERNAL);
    assert_non_null(strstr(d.msg, "Fn_1"));
    assert_non_null(strstr(d.msg, "x_1"));

    /* Fn_0 drops x_0, so B_0 later lacks its input. */
    s.n = 0;
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FN, 0), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FE, 1), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FE, 2), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_LOSS, 3), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_B, 2), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_B, 1), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_B, 0), MP_OK);
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, &d), MP_ERR_INTERNAL);
    assert_non_null(strstr(d.msg, "B_0")); /* Fn_0 kept only a plain x_1, not xbar_1 */
    assert_non_null(strstr(d.msg, "xbar_1"));

    /* Loss without x_L, and an out-of-range block. */
    s.n = 0;
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_LOSS, 3), MP_OK);
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, &d), MP_ERR_INTERNAL);
    assert_non_null(strstr(d.msg, "Loss"));
    s.n = 0;
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FE, 3), MP_OK);
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, &d), MP_ERR_INTERNAL);
    assert_non_null(strstr(d.msg, "Fe_3"));

    /* Recomputing an output that is still resident. */
    s.n = 0;
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FE, 0), MP_OK);
    assert_int_equal(mp_schedule_push(&s, MP_SCHED_FE, 0), MP_OK);
    assert_int_equal(mp_ckpt_simulate(&c, &s, &peak, &cost, &d), MP_ERR_INTERNAL);
    assert_non_null(strstr(d.msg, "already resident"));

    mp_schedule_release(&s);
    mp_chain_release(&c);
}

/* ---- T4, T5: checkpoint_sequential on the unit chain ------------------- */

static void test_sequential_unit_table(void **state)
{
    (void)state;
    static const uint64_t seg[] = {2, 4, 5, 8, 10, 12, 16, 20, 25, 50, 100};
    static const double time[] = {250, 275, 280, 284, 290, 288, 290, 295, 296, 298, 299};
    static const uint64_t peak[] = {54, 31, 27, 26, 22, 26, 28, 27, 31, 54, 103};
    struct mp_chain c;
    unit_chain(&c, 100, 1);
    struct mp_ckpt_plan p;
    for (size_t i = 0; i < sizeof seg / sizeof seg[0]; i++) {
        assert_int_equal(make(&c, MP_CKPT_SEGMENTS, seg[i], 0, 0, &p), MP_OK);
        assert_float_equal(p.total_cost, time[i], 0);
        assert_int_equal(p.peak_bytes, peak[i]);
        assert_float_equal(p.recompute_cost, time[i] - 200, 0);
        mp_ckpt_plan_release(&p);
    }
    assert_int_equal(make(&c, MP_CKPT_NONE, 0, 0, 0, &p), MP_OK);
    assert_float_equal(p.total_cost, 200, 0);
    assert_int_equal(p.peak_bytes, 103);
    assert_int_equal(p.n_segments, 0);
    assert_false(p.multilevel);
    mp_ckpt_plan_release(&p);
    /* sqrt = ceil(sqrt(100)) = 10 segments. */
    assert_int_equal(make(&c, MP_CKPT_SQRT, 0, 0, 0, &p), MP_OK);
    assert_float_equal(p.total_cost, 290, 0);
    assert_int_equal(p.peak_bytes, 22);
    assert_int_equal(p.n_segments, 9);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
}

static void test_sequential_segment_rule(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 100, 1);
    struct mp_ckpt_plan p;
    /* 12 segments: [0,8), ..., [80,88) checkpointed, [88,100) not. */
    assert_int_equal(make(&c, MP_CKPT_SEGMENTS, 12, 0, 0, &p), MP_OK);
    assert_int_equal(p.n_segments, 11);
    for (size_t k = 0; k < 11; k++) {
        assert_int_equal(p.segments[k][0], 8 * k);
        assert_int_equal(p.segments[k][1], 8 * k + 8);
    }
    for (size_t i = 0; i < 100; i++)
        assert_int_equal(p.checkpointed[i], i < 88);
    assert_false(p.multilevel);
    mp_ckpt_plan_release(&p);
    /* 1 segment: nothing checkpointed. */
    assert_int_equal(make(&c, MP_CKPT_SEGMENTS, 1, 0, 0, &p), MP_OK);
    assert_int_equal(p.n_segments, 0);
    assert_float_equal(p.total_cost, 200, 0);
    assert_int_equal(p.peak_bytes, 103);
    mp_ckpt_plan_release(&p);
    /* N segments: the no-checkpoint peak. */
    assert_int_equal(make(&c, MP_CKPT_SEGMENTS, 100, 0, 0, &p), MP_OK);
    assert_int_equal(p.peak_bytes, 103);
    assert_int_equal(p.n_segments, 99);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
}

static void test_plan_segments_k_limits(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 10, 1);
    struct mp_ckpt_plan p;
    char buf[32];
    /* K > L clamps to L. */
    assert_int_equal(make(&c, MP_CKPT_SEGMENTS, 1000, 0, 0, &p), MP_OK);
    assert_string_equal(mp_ckpt_spec_str(&p.spec, buf, sizeof buf), "segments:10");
    uint64_t pk = p.peak_bytes;
    double tc = p.total_cost;
    mp_ckpt_plan_release(&p);
    assert_int_equal(make(&c, MP_CKPT_SEGMENTS, 10, 0, 0, &p), MP_OK);
    assert_int_equal(p.peak_bytes, pk);
    assert_float_equal(p.total_cost, tc, 0);
    mp_ckpt_plan_release(&p);
    /* K = 0 is a usage error. */
    assert_int_equal(make(&c, MP_CKPT_SEGMENTS, 0, 0, 0, &p), MP_ERR_USAGE);
    assert_int_equal(make(&c, MP_CKPT_EVERY, 0, 0, 0, &p), MP_ERR_USAGE);
    assert_null(p.checkpointed);
    mp_chain_release(&c);
}

static void test_plan_every_includes_last_run(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 10, 1);
    struct mp_ckpt_plan p;
    assert_int_equal(make(&c, MP_CKPT_EVERY, 4, 0, 0, &p), MP_OK);
    /* [0,4), [4,8), [8,10), all checkpointed: one extra forward of everything. */
    assert_int_equal(p.n_segments, 3);
    assert_int_equal(p.segments[0][0], 0);
    assert_int_equal(p.segments[0][1], 4);
    assert_int_equal(p.segments[1][0], 4);
    assert_int_equal(p.segments[1][1], 8);
    assert_int_equal(p.segments[2][0], 8);
    assert_int_equal(p.segments[2][1], 10);
    for (size_t i = 0; i < 10; i++)
        assert_true(p.checkpointed[i]);
    assert_float_equal(p.total_cost, 20 + 10, 0);
    assert_float_equal(p.recompute_cost, 10, 0);
    /* Peak: x_0, x_4, x_8 stored, the last run recomputed with y_10: 3 + 1 + 2 + 2 ... */
    assert_true(p.peak_bytes < 13);
    mp_ckpt_plan_release(&p);
    /* every:1 on a 1-block chain recomputes the block. */
    mp_chain_release(&c);
    unit_chain(&c, 1, 1);
    assert_int_equal(make(&c, MP_CKPT_EVERY, 5, 0, 0, &p), MP_OK);
    assert_int_equal(p.n_segments, 1);
    assert_float_equal(p.total_cost, 3, 0);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
}

static void test_plan_empty_chain(void **state)
{
    (void)state;
    struct mp_chain c;
    assert_int_equal(mp_chain_init(&c, 0), MP_OK);
    c.x[0] = c.xb[0] = 5;
    c.bt[0] = 2;
    c.b[0] = 1;
    static const enum mp_ckpt_strategy all[] = {MP_CKPT_NONE, MP_CKPT_SQRT, MP_CKPT_SEGMENTS, MP_CKPT_EVERY,
                                                MP_CKPT_OPTIMAL, MP_CKPT_OPTIMAL_SEGMENTS};
    for (size_t i = 0; i < 6; i++) {
        struct mp_ckpt_plan p;
        assert_int_equal(make(&c, all[i], 3, 12, 0, &p), MP_OK);
        assert_int_equal(p.peak_bytes, 12); /* x_0 + y_0 + bt */
        assert_float_equal(p.total_cost, 1, 0);
        mp_ckpt_plan_release(&p);
    }
    struct mp_ckpt_plan p;
    assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, 11, 0, &p), MP_ERR_INFEASIBLE);
    mp_chain_release(&c);
}

/* ---- T4: rotor on the unit chain --------------------------------------- */

static const uint64_t T4_BUDGET[] = {5, 6, 7, 8, 9, 10, 12, 14, 16, 18, 20, 22, 25, 30, 40, 60, 100, 102, 103, 150};
static const double T4_TIME[] = {5149, 1031, 654, 521, 452, 411, 363, 337, 309, 294,
                                 290,  287,  282, 276, 265, 244, 204, 202, 200, 200};

static void check_rotor_unit_table(uint64_t scale)
{
    struct mp_chain c;
    unit_chain(&c, 100, scale);
    struct mp_ckpt_plan p;
    for (uint64_t m = 0; m <= 4; m++) {
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, m * scale, 0, &p), MP_ERR_INFEASIBLE);
        assert_true(isinf(dp_cost(&c, MP_CKPT_OPTIMAL, m * scale)));
    }
    for (size_t i = 0; i < sizeof T4_BUDGET / sizeof T4_BUDGET[0]; i++) {
        uint64_t budget = T4_BUDGET[i] * scale;
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, budget, 0, &p), MP_OK);
        assert_float_equal(p.total_cost, T4_TIME[i], 0);
        assert_true(p.peak_bytes <= budget);
        assert_float_equal(dp_cost(&c, MP_CKPT_OPTIMAL, budget), T4_TIME[i], 0);
        if (T4_BUDGET[i] <= 10)
            assert_true(p.multilevel);
        mp_ckpt_plan_release(&p);
    }
    mp_chain_release(&c);
}

static void test_optimal_unit_table(void **state)
{
    (void)state;
    check_rotor_unit_table(1);
}

/* GCD sizes are solved exactly: the unit chain in 4096-byte units gives T4. */
static void test_optimal_unit_table_scaled_gcd(void **state)
{
    (void)state;
    check_rotor_unit_table(4096);
}

/* The most slots (--slots 100000) on a 100-block chain: T4's times.  Sizes of a million bytes and
 * one byte more for the input make the discretisation round (unit = budget / 100,000); the DP's
 * tables were dense, 5151 x 100,000 entries (6 GB: refused as out of memory, and 82 blocks of
 * Llama-2-70B took 19 CPU seconds and 4 GB), and are step functions now. */
static void test_optimal_unit_table_most_slots(void **state)
{
    (void)state;
    const uint64_t S = 1000000;
    struct mp_chain c;
    unit_chain(&c, 100, S);
    c.x[0] = c.xb[0] = S + 1;
    for (size_t i = 0; i < sizeof T4_BUDGET / sizeof T4_BUDGET[0]; i++) {
        uint64_t budget = T4_BUDGET[i] * S + 1;
        struct mp_ckpt_plan p;
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, budget, 100000, &p), MP_OK);
        assert_float_equal(p.total_cost, T4_TIME[i], 0);
        assert_true(p.peak_bytes <= budget);
        mp_ckpt_plan_release(&p);
    }
    mp_chain_release(&c);
}

/* ---- the dense rotor DP: the reference for its step functions ------------------------------
 * ckpt.c kept OPT and WHAT as dense arrays of M + 1 entries per (s, l) (4 GB and 19 CPU seconds
 * for 82 blocks at 100,000 slots); it now keeps each as a step function.  Written here as it was
 * (discretisation, tables, the downward scan of m0, back-tracking), the plans must be equal, op
 * for op, at every budget and slot count tried. */
struct ref_dp {
    size_t L, Mn;
    uint64_t *x, *xb, *ft, *bt, unit, M, Mtop;
    double *f, *b, *opt;
    int32_t *what;
    bool exact;
};

static size_t ref_at(const struct ref_dp *r, size_t s, size_t l)
{
    size_t row = s * (r->L + 1) - s * (s - 1) / 2; /* tables of s' < s: L + 1 - s' each */
    return (row + (l - s)) * r->Mn;
}

static void ref_units(struct ref_dp *r, const struct mp_chain *c, uint64_t budget, size_t slots)
{
    size_t L = c->L;
    r->L = L;
    r->x = calloc(4 * (L + 2), sizeof *r->x);
    r->f = calloc(2 * (L + 1), sizeof *r->f);
    assert_true(r->x && r->f);
    r->xb = r->x + (L + 2), r->ft = r->xb + (L + 2), r->bt = r->ft + (L + 2), r->b = r->f + (L + 1);
    uint64_t g = 0;
    for (size_t i = 0; i <= L; i++) {
        g = mp_gcd_u64(mp_gcd_u64(mp_gcd_u64(g, c->x[i]), c->xb[i]), c->bt[i]);
        if (i < L)
            g = mp_gcd_u64(g, c->ft[i]);
    }
    g = g ? g : 1;
    r->exact = budget / g <= slots;
    r->unit = r->exact ? g : mp_ceil_div(budget, slots);
    r->M = budget / r->unit;
    r->Mtop = r->exact ? r->M : r->M + (2 * (uint64_t)(L + 1) + 2 < r->M + 1 ? 2 * (uint64_t)(L + 1) + 2 : r->M + 1);
    uint64_t cap = r->Mtop + 1;
    for (size_t i = 0; i <= L; i++) {
        uint64_t v[4] = {c->x[i], c->xb[i], c->bt[i], i < L ? c->ft[i] : 0}, *to[4] = {r->x, r->xb, r->bt, r->ft};
        for (int k = 0; k < 4; k++) {
            uint64_t q = mp_ceil_div(v[k], r->unit);
            to[k][i] = q < cap ? q : cap;
        }
        r->f[i] = i < L ? c->f[i] : 0;
        r->b[i] = c->b[i];
    }
}

static void ref_solve(struct ref_dp *r)
{
    const uint64_t *x = r->x, *xb = r->xb, *ft = r->ft, *bt = r->bt, M = r->Mtop - x[0];
    size_t L = r->L;
    r->Mn = (size_t)M + 1;
    size_t n = (L + 1) * (L + 2) / 2 * r->Mn;
    r->opt = malloc(n * sizeof *r->opt);
    r->what = malloc(n * sizeof *r->what);
    assert_true(r->opt && r->what);
    for (size_t i = 0; i <= L; i++) {
        uint64_t need = x[i + 1] + xb[i + 1] + ft[i], n2 = x[i] + x[i + 1] + xb[i + 1] + bt[i];
        need = need > n2 ? need : n2;
        for (size_t m = 0; m < r->Mn; m++) {
            r->opt[ref_at(r, i, i) + m] = m >= need ? r->f[i] + r->b[i] : HUGE_VAL;
            r->what[ref_at(r, i, i) + m] = -1;
        }
    }
    for (size_t dd = 1; dd <= L; dd++)
        for (size_t s = 0; s + dd <= L; s++) {
            size_t l = s + dd;
            double *o = r->opt + ref_at(r, s, l);
            int32_t *w = r->what + ref_at(r, s, l);
            for (size_t m = 0; m < r->Mn; m++)
                o[m] = HUGE_VAL, w[m] = -1;
            uint64_t mmin = x[l + 1] + x[s + 1] + ft[s];
            for (size_t j = s + 1; j < l; j++)
                if (x[l + 1] + x[j] + x[j + 1] + ft[j] > mmin)
                    mmin = x[l + 1] + x[j] + x[j + 1] + ft[j];
            if (mmin > M)
                continue;
            double sumf = 0;
            for (size_t j = s + 1; j <= l; j++) {
                sumf += r->f[j - 1];
                uint64_t lo = mmin > x[j] ? mmin : x[j];
                for (size_t m = (size_t)lo; m < r->Mn; m++) {
                    double cst = sumf + r->opt[ref_at(r, j, l) + m - x[j]] + r->opt[ref_at(r, s, j - 1) + m];
                    if (cst < o[m])
                        o[m] = cst, w[m] = (int32_t)j;
                }
            }
            uint64_t need = xb[s + 1] + x[l + 1] + ft[s], n2 = x[s] + x[s + 1] + xb[s + 1] + bt[s];
            need = need > n2 ? need : n2;
            need = need > mmin ? need : mmin;
            for (size_t m = (size_t)need; m < r->Mn; m++) {
                double cst = r->f[s] + r->b[s] + r->opt[ref_at(r, s + 1, l) + m - xb[s + 1]];
                if (w[m] < 0 || cst < o[m])
                    o[m] = cst, w[m] = -1;
            }
        }
}

static void ref_schedule(const struct ref_dp *r, size_t s, size_t l, uint64_t m, struct mp_schedule *out)
{
    assert_true(m < r->Mn && !isinf(r->opt[ref_at(r, s, l) + m]));
    if (s == l) {
        if (s == r->L) {
            assert_int_equal(mp_schedule_push(out, MP_SCHED_LOSS, (uint32_t)s), MP_OK);
        } else {
            assert_int_equal(mp_schedule_push(out, MP_SCHED_FE, (uint32_t)s), MP_OK);
            assert_int_equal(mp_schedule_push(out, MP_SCHED_B, (uint32_t)s), MP_OK);
        }
        return;
    }
    int32_t w = r->what[ref_at(r, s, l) + m];
    if (w < 0) {
        assert_int_equal(mp_schedule_push(out, MP_SCHED_FE, (uint32_t)s), MP_OK);
        ref_schedule(r, s + 1, l, m - r->xb[s + 1], out);
        assert_int_equal(mp_schedule_push(out, MP_SCHED_B, (uint32_t)s), MP_OK);
        return;
    }
    assert_int_equal(mp_schedule_push(out, MP_SCHED_FC, (uint32_t)s), MP_OK);
    for (size_t k = s + 1; k < (size_t)w; k++)
        assert_int_equal(mp_schedule_push(out, MP_SCHED_FN, (uint32_t)k), MP_OK);
    ref_schedule(r, (size_t)w, l, m - r->x[w], out);
    ref_schedule(r, s, (size_t)w - 1, m, out);
}

/* The reference plan at budget (below the no-checkpoint peak): false when none fits. */
static bool ref_plan(const struct mp_chain *c, uint64_t budget, size_t slots, struct mp_schedule *out)
{
    struct ref_dp r = {0};
    ref_units(&r, c, budget, slots);
    bool found = false;
    if (r.x[0] <= r.Mtop) {
        ref_solve(&r);
        uint64_t top = r.Mtop - r.x[0], lo = r.M >= r.x[0] ? r.M - r.x[0] : 0;
        for (uint64_t m0 = top + 1; m0-- > lo && !found;) {
            if (isinf(r.opt[ref_at(&r, 0, r.L) + m0]))
                break;
            out->n = 0;
            ref_schedule(&r, 0, r.L, m0, out);
            uint64_t peak;
            double cost;
            assert_int_equal(mp_ckpt_simulate(c, out, &peak, &cost, NULL), MP_OK);
            found = r.exact || peak <= budget;
        }
    }
    free(r.x);
    free(r.f);
    free(r.opt);
    free(r.what);
    return found;
}

static void test_optimal_equals_dense_dp(void **state)
{
    (void)state;
    rng_state = 20261127;
    static const size_t slots[] = {10, 37, 500, 2000};
    int compared = 0, feasible = 0;
    for (int trial = 0; trial < 60; trial++) {
        struct mp_chain c;
        size_t L = (size_t)rng_range(1, 16);
        random_chain(&c, L, trial % 3 == 0 ? 0 : 6);
        /* sizes of up to a few million bytes, no common factor: the rounded discretisation */
        uint64_t scale = trial % 4 == 0 ? 1 : rng_range(1000, 1000000);
        for (size_t i = 0; i <= L; i++) {
            uint64_t kept = c.xb[i] - c.x[i];
            c.x[i] = c.x[i] * scale + rng_range(0, scale / 2);
            c.xb[i] = c.x[i] + kept * scale;
            c.bt[i] *= scale;
            if (i < L)
                c.ft[i] = c.ft[i] * scale + rng_range(0, 3);
        }
        uint64_t np = none_peak(&c);
        for (int k = 0; k < 6; k++) {
            uint64_t budget = rng_range(c.x[0], np - 1);
            size_t sl = slots[rng_range(0, 3)];
            struct mp_schedule want;
            mp_schedule_init(&want);
            bool found = ref_plan(&c, budget, sl, &want);
            feasible += found;
            struct mp_ckpt_plan p;
            enum mp_status st = make(&c, MP_CKPT_OPTIMAL, 0, budget, sl, &p);
            if (!found) {
                assert_int_equal(st, MP_ERR_INFEASIBLE);
            } else {
                if (st != MP_OK || !mp_schedule_equal(&p.sched, &want))
                    fail_msg("trial %d: L %zu, budget %llu, %zu slots: the plans differ", trial, L,
                             (unsigned long long)budget, sl);
                mp_ckpt_plan_release(&p);
            }
            mp_schedule_release(&want);
            compared++;
        }
        mp_chain_release(&c);
    }
    assert_int_equal(compared, 360);
    assert_true(feasible > 100 && feasible < 300); /* plans to compare, and budgets too small */
}

/* rotor(M = peak of checkpoint_sequential(k)) <= time of checkpoint_sequential(k). */
static void test_optimal_beats_sequential_unit(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 100, 1);
    for (uint64_t k = 1; k <= 100; k++) {
        struct mp_ckpt_plan s, o;
        assert_int_equal(make(&c, MP_CKPT_SEGMENTS, k, 0, 0, &s), MP_OK);
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, s.peak_bytes, 0, &o), MP_OK);
        assert_true(o.total_cost <= s.total_cost);
        assert_true(o.peak_bytes <= s.peak_bytes);
        if (k == 10) {
            assert_float_equal(o.total_cost, 287, 0); /* 22 units */
            mp_ckpt_plan_release(&o);
            assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, 20, 0, &o), MP_OK);
            assert_float_equal(o.total_cost, 290, 0); /* sequential's 290 with 20 units */
        }
        mp_ckpt_plan_release(&s);
        mp_ckpt_plan_release(&o);
    }
    mp_chain_release(&c);
}

static void test_optimal_below_input_infeasible(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 5, 8);
    struct mp_ckpt_plan p;
    struct mp_ckpt_spec spec = {.strategy = MP_CKPT_OPTIMAL, .k = 0};
    struct mp_diag d = {{0}};
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 7, 0, &p, &d), MP_ERR_INFEASIBLE);
    assert_non_null(strstr(d.msg, "optimal"));
    spec.strategy = MP_CKPT_OPTIMAL_SEGMENTS;
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 7, 0, &p, &d), MP_ERR_INFEASIBLE);
    assert_true(isinf(dp_cost(&c, MP_CKPT_OPTIMAL, 7)));
    assert_true(isinf(dp_cost(&c, MP_CKPT_OPTIMAL_SEGMENTS, 7)));
    mp_chain_release(&c);
}

static void test_plan_rejects_bad_chain(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 3, 4);
    c.xb[2] = 3; /* < x[2] */
    struct mp_ckpt_plan p;
    assert_int_equal(make(&c, MP_CKPT_NONE, 0, 0, 0, &p), MP_ERR_MODEL);
    c.xb[2] = 4;
    c.f[1] = -1;
    assert_int_equal(make(&c, MP_CKPT_NONE, 0, 0, 0, &p), MP_ERR_MODEL);
    c.f[1] = NAN;
    assert_int_equal(make(&c, MP_CKPT_NONE, 0, 0, 0, &p), MP_ERR_MODEL);
    mp_chain_release(&c);
}

/* ---- T8: invariants on random chains ----------------------------------- */

static void check_plan_matches_dp(const struct mp_chain *c, enum mp_ckpt_strategy st, uint64_t M, double v)
{
    struct mp_ckpt_plan p;
    enum mp_status rc = make(c, st, 0, M, 0, &p);
    if (isinf(v)) {
        assert_int_equal(rc, MP_ERR_INFEASIBLE);
        return;
    }
    assert_int_equal(rc, MP_OK);
    assert_true(p.peak_bytes <= M);
    assert_float_equal(p.total_cost, v, 0);
    assert_float_equal(p.recompute_cost, v - sum_fb(c), 0);
    /* checkpointed[] and segments agree. */
    size_t nck = 0, nseg = 0;
    for (size_t i = 0; i < c->L; i++)
        nck += p.checkpointed[i];
    for (size_t k = 0; k < p.n_segments; k++) {
        assert_true(p.segments[k][0] < p.segments[k][1]);
        nseg += p.segments[k][1] - p.segments[k][0];
    }
    assert_int_equal(nck, nseg);
    if (st == MP_CKPT_OPTIMAL_SEGMENTS)
        assert_false(p.multilevel);
    mp_ckpt_plan_release(&p);
}

static void test_invariants_random_chains(void **state)
{
    (void)state;
    rng_state = 20240601;
    int checked = 0;
    for (int trial = 0; trial < 300; trial++) {
        struct mp_chain c;
        size_t L = (size_t)rng_range(1, 14);
        random_chain(&c, L, trial % 3 == 0 ? 0 : 6); /* a third with no temporaries */
        const uint64_t np = none_peak(&c);
        const double sfb = sum_fb(&c);
        /* Dense sweep of budgets on some chains, sampled on the rest. */
        bool dense = trial % 10 == 0;
        double prev_r = HUGE_VAL, prev_s = HUGE_VAL;
        for (uint64_t M = c.x[0] > 0 ? c.x[0] - 1 : 0; M <= np + 2; M += dense ? 1 : rng_range(1, 1 + np / 8)) {
            double r = dp_cost(&c, MP_CKPT_OPTIMAL, M);
            double s = dp_cost(&c, MP_CKPT_OPTIMAL_SEGMENTS, M);
            if (M < c.x[0])
                assert_true(isinf(r) && isinf(s));
            assert_true(r <= prev_r); /* non-increasing in M */
            assert_true(s <= prev_s);
            assert_true(r <= s); /* rotor <= single-level */
            if (M >= np) {
                assert_float_equal(r, sfb, 0);
                assert_float_equal(s, sfb, 0);
            }
            if (!isinf(r))
                assert_true(r >= sfb);
            check_plan_matches_dp(&c, MP_CKPT_OPTIMAL, M, r);
            check_plan_matches_dp(&c, MP_CKPT_OPTIMAL_SEGMENTS, M, s);
            prev_r = r;
            prev_s = s;
            checked++;
        }
        /* rotor <= segment DP <= checkpoint_sequential at the sequential plan's peak. */
        for (uint64_t k = 1; k <= L; k++) {
            struct mp_ckpt_plan p;
            assert_int_equal(make(&c, MP_CKPT_SEGMENTS, k, 0, 0, &p), MP_OK);
            double r = dp_cost(&c, MP_CKPT_OPTIMAL, p.peak_bytes);
            double s = dp_cost(&c, MP_CKPT_OPTIMAL_SEGMENTS, p.peak_bytes);
            assert_true(r <= s);
            assert_true(s <= p.total_cost);
            mp_ckpt_plan_release(&p);
            assert_int_equal(make(&c, MP_CKPT_EVERY, k, 0, 0, &p), MP_OK);
            s = dp_cost(&c, MP_CKPT_OPTIMAL_SEGMENTS, p.peak_bytes);
            assert_true(s <= p.total_cost);
            mp_ckpt_plan_release(&p);
        }
        mp_chain_release(&c);
    }
    assert_true(checked > 3000);
}

/* ---- brute force over single-level plans -------------------------------- */

struct sl_result {
    uint64_t peak;
    double cost;
};

/* Every segmentation of 0..L-1 with every flag assignment, simulated. */
static size_t enumerate_single_level(const struct mp_chain *c, struct sl_result **out)
{
    const size_t L = c->L;
    size_t cap = 1024, n = 0;
    struct sl_result *r = malloc(cap * sizeof *r);
    size_t start[16];
    bool ck[16];
    struct mp_schedule s;
    mp_schedule_init(&s);
    assert_non_null(r);
    assert_true(L >= 1 && L <= 16);
    for (uint32_t cuts = 0; cuts < (1u << (L - 1)); cuts++) {
        size_t nseg = 0;
        start[nseg++] = 0;
        for (size_t i = 1; i < L; i++)
            if (cuts & (1u << (i - 1)))
                start[nseg++] = i;
        for (uint32_t flags = 0; flags < (1u << nseg); flags++) {
            for (size_t k = 0; k < nseg; k++)
                ck[k] = (flags >> k) & 1;
            assert_int_equal(mp_ckpt_schedule_segments(L, nseg, start, ck, &s), MP_OK);
            if (n == cap) {
                cap *= 2;
                r = realloc(r, cap * sizeof *r);
                assert_non_null(r);
            }
            assert_int_equal(mp_ckpt_simulate(c, &s, &r[n].peak, &r[n].cost, NULL), MP_OK);
            n++;
        }
    }
    mp_schedule_release(&s);
    *out = r;
    return n;
}

static int by_peak(const void *a, const void *b)
{
    const struct sl_result *x = a, *y = b;
    return (x->peak > y->peak) - (x->peak < y->peak);
}

static void check_against_brute_force(const struct mp_chain *c)
{
    struct sl_result *all;
    size_t n = enumerate_single_level(c, &all);
    const uint64_t np = none_peak(c);
    qsort(all, n, sizeof *all, by_peak);
    size_t i = 0;
    double best = HUGE_VAL; /* cheapest plan with peak <= M */
    for (uint64_t M = c->x[0]; M <= np; M++) {
        for (; i < n && all[i].peak <= M; i++)
            if (all[i].cost < best)
                best = all[i].cost;
        double s = dp_cost(c, MP_CKPT_OPTIMAL_SEGMENTS, M);
        double r = dp_cost(c, MP_CKPT_OPTIMAL, M);
        if (isinf(best))
            assert_true(isinf(s));
        else
            assert_float_equal(s, best, 0); /* the segment DP is optimal among single-level plans */
        assert_true(r <= best);             /* rotor is never worse */
    }
    free(all);
}

static void test_segdp_brute_force_small(void **state)
{
    (void)state;
    rng_state = 777;
    for (int trial = 0; trial < 60; trial++) {
        struct mp_chain c;
        random_chain(&c, (size_t)rng_range(1, 8), trial % 2 ? 6 : 0);
        check_against_brute_force(&c);
        mp_chain_release(&c);
    }
}

static void test_segdp_brute_force_twelve_blocks(void **state)
{
    (void)state;
    rng_state = 4242;
    for (int trial = 0; trial < 2; trial++) {
        struct mp_chain c;
        random_chain(&c, trial == 0 ? 12 : 11, trial == 0 ? 5 : 0);
        check_against_brute_force(&c);
        mp_chain_release(&c);
    }
}

/* ---- discretisation ----------------------------------------------------- */

static void test_discretise_non_gcd_within_budget(void **state)
{
    (void)state;
    rng_state = 99;
    int feasible = 0;
    for (int trial = 0; trial < 12; trial++) {
        struct mp_chain c;
        size_t L = (size_t)rng_range(20, 40);
        assert_int_equal(mp_chain_init(&c, L), MP_OK);
        for (size_t i = 0; i <= L; i++) {
            c.x[i] = rng_range(1000003, 9000001);
            c.xb[i] = i == 0 ? c.x[0] : c.x[i] + rng_range(0, 30000017);
            c.bt[i] = rng_range(0, 2000003);
            c.b[i] = (double)rng_range(i < L ? 1 : 0, 50);
            if (i < L) {
                c.f[i] = (double)rng_range(1, 25);
                c.ft[i] = rng_range(0, 2000003);
            }
        }
        uint64_t np = none_peak(&c);
        struct mp_ckpt_plan sq;
        assert_int_equal(make(&c, MP_CKPT_SQRT, 0, 0, 0, &sq), MP_OK);
        static const size_t slots[] = {30, 100, 500};
        static const double frac[] = {0.15, 0.3, 0.5, 0.8, 0.999};
        for (size_t si = 0; si < 3; si++) {
            for (size_t fi = 0; fi < 5; fi++) {
                uint64_t budget = (uint64_t)(frac[fi] * (double)np) + (uint64_t)fi; /* odd byte counts */
                for (int st = 0; st < 2; st++) {
                    struct mp_ckpt_plan p;
                    enum mp_status rc = make(&c, st ? MP_CKPT_OPTIMAL_SEGMENTS : MP_CKPT_OPTIMAL, 0, budget,
                                             slots[si], &p);
                    assert_true(rc == MP_OK || rc == MP_ERR_INFEASIBLE);
                    double v = -1;
                    struct mp_diag d;
                    assert_int_equal(mp_ckpt_dp_cost(&c, st ? MP_CKPT_OPTIMAL_SEGMENTS : MP_CKPT_OPTIMAL, budget,
                                                     slots[si], &v, &d),
                                     MP_OK);
                    if (rc == MP_OK) {
                        assert_true(p.peak_bytes <= budget);
                        assert_true(p.total_cost >= sum_fb(&c));
                        assert_float_equal(v, p.total_cost, 0); /* the DP's figure is the simulated one */
                        feasible++;
                        mp_ckpt_plan_release(&p);
                    } else
                        assert_true(isinf(v));
                }
            }
            /* With 15% slack over sqrt's own peak, 500 slots find a plan no worse than sqrt. */
            if (slots[si] == 500) {
                uint64_t budget = sq.peak_bytes + sq.peak_bytes / 20 * 3;
                struct mp_ckpt_plan p;
                assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, budget, 500, &p), MP_OK);
                assert_true(p.peak_bytes <= budget);
                assert_true(p.total_cost <= sq.total_cost);
                mp_ckpt_plan_release(&p);
            }
        }
        mp_ckpt_plan_release(&sq);
        mp_chain_release(&c);
    }
    assert_true(feasible > 100);
}

/* A GPT-like chain in odd byte sizes (rounded units): at the peak of every
 * checkpoint_sequential(K), OPTIMAL and OPTIMAL_SEGMENTS at 500 slots are no
 * worse than it, and rotor is no worse than the segment DP. */
static void test_optimal_heterogeneous_rounded_beats_sequential(void **state)
{
    (void)state;
    const size_t L = 48;
    const uint64_t h = 25169923; /* ~24 MiB + odd bytes */
    struct mp_chain c;
    assert_int_equal(mp_chain_init(&c, L), MP_OK);
    c.x[0] = c.xb[0] = 262147;
    for (size_t i = 0; i < L; i++) {
        c.x[i + 1] = i + 1 == L ? 205520997 : h;
        bool attn = i % 2 == 1;
        c.xb[i + 1] = i + 1 == L ? c.x[L] + h : (attn ? 6 : 9) * h + 777 * i;
        c.f[i] = i == 0 ? 1 : (i + 1 == L ? 40 : (attn ? 10 : 20));
        c.b[i] = 2 * c.f[i];
        c.ft[i] = attn ? 50331659 : 100663301;
        c.bt[i] = attn ? 75497485 : 100663305;
    }
    c.b[L] = 1;
    c.bt[L] = c.x[L];
    static const uint64_t ks[] = {2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 48};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        const uint64_t k = ks[ki];
        struct mp_ckpt_plan sq, o, g;
        assert_int_equal(make(&c, MP_CKPT_SEGMENTS, k, 0, 0, &sq), MP_OK);
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, sq.peak_bytes, 500, &o), MP_OK);
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL_SEGMENTS, 0, sq.peak_bytes, 500, &g), MP_OK);
        assert_true(o.peak_bytes <= sq.peak_bytes && g.peak_bytes <= sq.peak_bytes);
        assert_true(o.total_cost <= sq.total_cost);
        assert_true(g.total_cost <= sq.total_cost);
        assert_true(o.total_cost <= g.total_cost);
        mp_ckpt_plan_release(&sq);
        mp_ckpt_plan_release(&o);
        mp_ckpt_plan_release(&g);
    }
    mp_chain_release(&c);
}

/* Budget not a multiple of the GCD: rounding it down keeps the solve exact. */
static void test_discretise_gcd_budget_rounds_down(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 100, 4096);
    assert_float_equal(dp_cost(&c, MP_CKPT_OPTIMAL, 22 * 4096 + 4095), 287, 0);
    assert_float_equal(dp_cost(&c, MP_CKPT_OPTIMAL, 22 * 4096 - 1), dp_cost(&c, MP_CKPT_OPTIMAL, 21 * 4096), 0);
    assert_float_equal(dp_cost(&c, MP_CKPT_OPTIMAL, 20 * 4096 + 1), 290, 0);
    mp_chain_release(&c);
}

/* Coarse slots on a GCD chain: rounding up never under-estimates. */
static void test_discretise_coarse_slots(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 100, 1);
    struct mp_ckpt_plan p;
    for (uint64_t M = 5; M <= 103; M++) {
        enum mp_status rc = make(&c, MP_CKPT_OPTIMAL, 0, M, 7, &p); /* 7 slots: units of ceil(M/7) */
        assert_true(rc == MP_OK || rc == MP_ERR_INFEASIBLE);
        if (rc == MP_OK) {
            assert_true(p.peak_bytes <= M);
            mp_ckpt_plan_release(&p);
        }
    }
    mp_chain_release(&c);
}

/* ---- comparisons and long chains ------------------------------------------ */

/* mp_ckpt_compare finds the segments:K of least recompute within the limit, as a
 * brute force over every K does, and the sqrt plan's figures. */
static void test_compare_best_segments(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 40, 1);
    for (uint64_t limit = 8; limit <= 45; limit += 6) {
        struct mp_plan_cmp cmp;
        mp_ckpt_compare(&c, limit, 0, &cmp);
        bool have = false;
        uint64_t bk = 0;
        double best = 0;
        for (uint64_t k = 1; k <= c.L; k++) {
            struct mp_ckpt_plan p;
            if (make(&c, MP_CKPT_SEGMENTS, k, 0, 0, &p) == MP_OK && p.peak_bytes <= limit &&
                (!have || p.recompute_cost < best)) {
                have = true;
                bk = k;
                best = p.recompute_cost;
            }
            mp_ckpt_plan_release(&p);
        }
        assert_int_equal(cmp.have_seg, have);
        assert_false(cmp.seg_sampled);
        if (have) {
            assert_int_equal(cmp.seg_k, bk);
            assert_float_equal(cmp.seg_recompute, best, 0);
            assert_true(cmp.seg_peak <= limit);
        }
        struct mp_ckpt_plan q;
        assert_int_equal(make(&c, MP_CKPT_SQRT, 0, 0, 0, &q), MP_OK);
        assert_true(cmp.have_sqrt);
        assert_int_equal(cmp.sqrt_peak, q.peak_bytes);
        mp_ckpt_plan_release(&q);
    }
    mp_chain_release(&c);
}

/* Beyond 128 blocks the optimal DP runs on groups: the plan still fits its budget on
 * the full chain, never costs less than the exact optimum's lower bound (no recompute),
 * and says how coarse it was. */
static void test_optimal_long_chain_grouped(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 1000, 1);
    for (uint64_t budget = 60; budget <= 600; budget += 180) {
        struct mp_ckpt_plan p;
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, budget, 0, &p), MP_OK);
        assert_true(p.peak_bytes <= budget);
        assert_true(p.dp_group > 1);
        assert_true(p.recompute_cost > 0);
        struct mp_ckpt_plan s;
        /* no worse than sqrt when sqrt fits the same budget */
        if (make(&c, MP_CKPT_SQRT, 0, 0, 0, &s) == MP_OK && s.peak_bytes <= budget)
            assert_true(p.total_cost <= s.total_cost);
        mp_ckpt_plan_release(&s);
        mp_ckpt_plan_release(&p);
    }
    mp_chain_release(&c);
}

/* On a chain so long that a group of blocks is longer than sqrt's segments (20,000 blocks: 64
 * groups of about 313), whose blocks save 16 times their input (a transformer block's saved
 * activations against its input), the DP on groups alone cannot go down to sqrt's memory: at
 * sqrt's own peak the optimal plan still exists, fits, and costs no more than sqrt's. */
static void test_optimal_long_chain_never_worse_than_sqrt(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 20000, 1);
    for (size_t i = 1; i <= c.L; i++)
        c.xb[i] = 16;
    struct mp_ckpt_plan s, p;
    assert_int_equal(make(&c, MP_CKPT_SQRT, 0, 0, 0, &s), MP_OK);
    for (uint64_t extra = 0; extra <= 200; extra += 100) {
        assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, s.peak_bytes + extra, 0, &p), MP_OK);
        assert_true(p.peak_bytes <= s.peak_bytes + extra);
        assert_true(p.total_cost <= s.total_cost);
        mp_ckpt_plan_release(&p);
    }
    mp_ckpt_plan_release(&s);
    mp_chain_release(&c);
}

/* ---- plan readout -------------------------------------------------------- */

static void test_plan_readout_rotor(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 100, 1);
    struct mp_ckpt_plan p;
    assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, 8, 0, &p), MP_OK);
    assert_true(p.multilevel);
    assert_true(p.n_segments >= 1);
    assert_int_equal(p.segments[0][0], 0);
    /* Every segment starts at an Fc: its first block's first forward keeps the input. */
    for (size_t k = 0; k < p.n_segments; k++) {
        size_t a = p.segments[k][0];
        for (size_t i = 0; i < p.sched.n; i++)
            if (p.sched.ops[i].index == a && p.sched.ops[i].kind != MP_SCHED_B &&
                p.sched.ops[i].kind != MP_SCHED_LOSS) {
                assert_int_equal(p.sched.ops[i].kind, MP_SCHED_FC);
                break;
            }
    }
    assert_float_equal(p.recompute_cost, 521 - 200, 0);
    mp_ckpt_plan_release(&p);
    /* At or above the no-checkpoint peak: nothing checkpointed. */
    assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, 103, 0, &p), MP_OK);
    assert_int_equal(p.n_segments, 0);
    assert_false(p.multilevel);
    for (size_t i = 0; i < 100; i++)
        assert_false(p.checkpointed[i]);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
}

/* A plan with a huge sqrt/optimal chain: schedule back-tracking has no deep recursion. */
static void test_optimal_long_chain(void **state)
{
    (void)state;
    struct mp_chain c;
    unit_chain(&c, 400, 1);
    struct mp_ckpt_plan p;
    assert_int_equal(make(&c, MP_CKPT_OPTIMAL, 0, 30, 40, &p), MP_OK);
    assert_true(p.peak_bytes <= 30);
    assert_true(p.total_cost >= 800);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_revolve_beta_known),
        cmocka_unit_test(test_revolve_numforw_small),
        cmocka_unit_test(test_revolve_numforw_large),
        cmocka_unit_test(test_revolve_griewank_dp_matches),
        cmocka_unit_test(test_chain_init_zeroed),
        cmocka_unit_test(test_spec_parse_roundtrip),
        cmocka_unit_test(test_spec_parse_rejects),
        cmocka_unit_test(test_schedule_none_ops),
        cmocka_unit_test(test_schedule_segments_ops),
        cmocka_unit_test(test_simulate_counts_input_and_gradients),
        cmocka_unit_test(test_simulate_loss_frees_plain_xl),
        cmocka_unit_test(test_simulate_unmet_requirement_names_op),
        cmocka_unit_test(test_sequential_unit_table),
        cmocka_unit_test(test_sequential_segment_rule),
        cmocka_unit_test(test_plan_segments_k_limits),
        cmocka_unit_test(test_plan_every_includes_last_run),
        cmocka_unit_test(test_plan_empty_chain),
        cmocka_unit_test(test_optimal_unit_table),
        cmocka_unit_test(test_optimal_unit_table_most_slots),
        cmocka_unit_test(test_optimal_equals_dense_dp),
        cmocka_unit_test(test_optimal_below_input_infeasible),
        cmocka_unit_test(test_plan_rejects_bad_chain),
        cmocka_unit_test(test_invariants_random_chains),
        cmocka_unit_test(test_segdp_brute_force_small),
        cmocka_unit_test(test_segdp_brute_force_twelve_blocks),
        cmocka_unit_test(test_optimal_heterogeneous_rounded_beats_sequential),
        cmocka_unit_test(test_discretise_gcd_budget_rounds_down),
        cmocka_unit_test(test_plan_readout_rotor),
        cmocka_unit_test(test_compare_best_segments),
        cmocka_unit_test(test_optimal_long_chain_grouped),
        cmocka_unit_test(test_optimal_long_chain_never_worse_than_sqrt),
        cmocka_unit_test(test_optimal_long_chain),
    };
    /* the long tier (tier.h): the cases that take a second or more each on a loaded 2-core
     * machine (larger unit tables and slot counts; the quick tier keeps one of each kind) */
    const struct CMUnitTest long_[] = {
        cmocka_unit_test(test_optimal_unit_table_scaled_gcd),
        cmocka_unit_test(test_optimal_beats_sequential_unit),
        cmocka_unit_test(test_discretise_non_gcd_within_budget),
        cmocka_unit_test(test_discretise_coarse_slots),
    };
    return run_tiers(tests, long_);
}
