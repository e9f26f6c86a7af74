/* bench_ckpt.c — times the rotor DP (OPTIMAL) on an 80-block heterogeneous
 * chain at 500 slots and compares its cost with sqrt and with the best
 * checkpoint_sequential(K) that fits the same memory.  Prints figures only:
 * it asserts nothing about timing (the target is < 1 s on one core at -O2).
 * Sizes are odd byte counts, so the DP runs on rounded-up units
 * (docs/checkpointing.md#discretisation).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ckpt/ckpt.h"

#define MiB (1024.0 * 1024.0)

/* A GPT-like chain: a cheap embedding, alternating attention / MLP blocks, and
 * a large LM head (196 MiB of logits).  x = 24 MiB hidden states plus odd
 * bytes; attention keeps ~6x its input, MLP ~9x at twice the FLOPs. */
static int build_chain(struct mp_chain *c, size_t L)
{
    if (mp_chain_init(c, L) != MP_OK)
        return -1;
    const uint64_t h = (uint64_t)(24 * MiB) + 4099;
    c->x[0] = c->xb[0] = 262147; /* token ids */
    for (size_t i = 0; i < L; i++) {
        c->x[i + 1] = h;
        if (i == 0) { /* embedding */
            c->xb[1] = h;
            c->f[0] = 0.05e12;
            c->b[0] = 0.1e12;
            c->ft[0] = 0;
            c->bt[0] = (uint64_t)(64 * MiB) + 17;
        } else if (i == L - 1) { /* LM head: logits are large */
            c->x[L] = (uint64_t)(196 * MiB) + 101;
            c->xb[L] = c->x[L] + h;
            c->f[i] = 9.6e12;
            c->b[i] = 19.2e12;
            c->ft[i] = (uint64_t)(96 * MiB) + 3;
            c->bt[i] = (uint64_t)(196 * MiB) + 7;
        } else if (i % 2 == 1) { /* attention */
            c->xb[i + 1] = 6 * h + 12345;
            c->f[i] = 2.4e12;
            c->b[i] = 4.8e12;
            c->ft[i] = (uint64_t)(48 * MiB) + 11;
            c->bt[i] = (uint64_t)(72 * MiB) + 13;
        } else { /* MLP */
            c->xb[i + 1] = 9 * h + 777;
            c->f[i] = 4.8e12;
            c->b[i] = 9.6e12;
            c->ft[i] = (uint64_t)(96 * MiB) + 5;
            c->bt[i] = (uint64_t)(96 * MiB) + 9;
        }
    }
    c->b[L] = 0.2e12;          /* loss backward */
    c->bt[L] = c->x[L];        /* softmax grad temporary */
    return 0;
}

static double sum_fb(const struct mp_chain *c)
{
    double s = c->b[c->L];
    for (size_t i = 0; i < c->L; i++)
        s += c->f[i] + c->b[i];
    return s;
}

/* Best checkpoint_sequential(K) whose peak fits budget; returns its K (0 if none). */
static size_t best_sequential(const struct mp_chain *c, uint64_t budget, double *cost, uint64_t *peak)
{
    size_t bestk = 0;
    *cost = HUGE_VAL;
    for (size_t k = 1; k <= c->L; k++) {
        struct mp_ckpt_spec sp = {MP_CKPT_SEGMENTS, k};
        struct mp_ckpt_plan p;
        struct mp_diag d;
        if (mp_ckpt_plan_make(c, &sp, 0, 0, &p, &d) != MP_OK)
            continue;
        if (p.peak_bytes <= budget && p.total_cost < *cost) {
            *cost = p.total_cost;
            *peak = p.peak_bytes;
            bestk = k;
        }
        mp_ckpt_plan_release(&p);
    }
    return bestk;
}

/* One row: OPTIMAL (timed, best of reps), OPTIMAL_SEGMENTS and the best
 * segments:K at the same budget; overheads are recompute / (sum f + sum b). */
static void run_budget(const struct mp_chain *c, const char *label, uint64_t budget, size_t slots, int reps)
{
    struct mp_ckpt_spec opt = {MP_CKPT_OPTIMAL, 0}, seg = {MP_CKPT_OPTIMAL_SEGMENTS, 0};
    struct mp_ckpt_plan p, q;
    struct mp_diag d = {{0}};
    double best_ms = HUGE_VAL, sfb = sum_fb(c);
    enum mp_status st = MP_OK;
    for (int r = 0; r < reps; r++) {
        double t0 = mp_now_ms();
        st = mp_ckpt_plan_make(c, &opt, budget, slots, &p, &d);
        double ms = mp_now_ms() - t0;
        if (ms < best_ms)
            best_ms = ms;
        if (r + 1 < reps && st == MP_OK)
            mp_ckpt_plan_release(&p);
    }
    printf("%-16s %9.1f %5zu ", label, (double)budget / MiB, slots);
    if (st == MP_OK) {
        printf("%8.1f %9.1f %7.2f%%%s", best_ms, (double)p.peak_bytes / MiB, 100.0 * p.recompute_cost / sfb,
               p.multilevel ? "*" : " ");
        mp_ckpt_plan_release(&p);
    } else
        printf("%8.1f %9s %8s ", best_ms, "-", "infeas.");
    if (mp_ckpt_plan_make(c, &seg, budget, slots, &q, &d) == MP_OK) {
        printf(" %7.2f%%", 100.0 * q.recompute_cost / sfb);
        mp_ckpt_plan_release(&q);
    } else
        printf(" %8s", "infeas.");
    double sc;
    uint64_t speak = 0;
    size_t k = best_sequential(c, budget, &sc, &speak);
    if (k)
        printf("  %7.2f%% (segments:%zu, %.1f MiB)\n", 100.0 * (sc - sfb) / sfb, k, (double)speak / MiB);
    else
        printf("  %8s\n", "none fits");
}

int main(int argc, char **argv)
{
    size_t L = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 80;
    size_t slots = argc > 2 ? (size_t)strtoul(argv[2], NULL, 10) : 500;
    struct mp_chain c;
    if (L < 3 || build_chain(&c, L) != 0) {
        fprintf(stderr, "bench_ckpt: cannot build a chain of %zu blocks\n", L);
        return 1;
    }
    struct mp_ckpt_spec none = {MP_CKPT_NONE, 0}, sq = {MP_CKPT_SQRT, 0};
    struct mp_ckpt_plan pn, ps;
    struct mp_diag d;
    if (mp_ckpt_plan_make(&c, &none, 0, 0, &pn, &d) != MP_OK || mp_ckpt_plan_make(&c, &sq, 0, 0, &ps, &d) != MP_OK) {
        fprintf(stderr, "bench_ckpt: %s\n", d.msg);
        return 1;
    }
    double sfb = sum_fb(&c);
    printf("chain: %zu blocks, sum f+b %.1f TFLOP\n", L, sfb / 1e12);
    printf("none:  peak %9.1f MiB  overhead  0.00%%\n", (double)pn.peak_bytes / MiB);
    printf("sqrt:  peak %9.1f MiB  overhead %5.2f%%  (segments:%llu)\n", (double)ps.peak_bytes / MiB,
           100.0 * ps.recompute_cost / sfb, (unsigned long long)(uint64_t)ceil(sqrt((double)L)));
    printf("\n%-16s %9s %5s %8s %9s %8s  %8s  %s\n", "budget", "MiB", "slots", "opt ms", "opt peak",
           "optimal", "opt-seg", "best segments:K at the same memory");
    run_budget(&c, "sqrt's peak", ps.peak_bytes, slots, 3);
    static const size_t ks[] = {2, 3, 4, 6, 10, 16};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        struct mp_ckpt_spec sk = {MP_CKPT_SEGMENTS, ks[i]};
        struct mp_ckpt_plan pk;
        char label[32];
        if (ks[i] > L || mp_ckpt_plan_make(&c, &sk, 0, 0, &pk, &d) != MP_OK)
            continue;
        snprintf(label, sizeof label, "segments:%zu peak", ks[i]);
        run_budget(&c, label, pk.peak_bytes, slots, 3);
        mp_ckpt_plan_release(&pk);
    }
    run_budget(&c, "75% sqrt peak", ps.peak_bytes / 4 * 3, slots, 3);
    run_budget(&c, "50% sqrt peak", ps.peak_bytes / 2, slots, 3);
    run_budget(&c, "40% sqrt peak", ps.peak_bytes / 10 * 4, slots, 3);
    run_budget(&c, "35% sqrt peak", ps.peak_bytes / 20 * 7, slots, 3);
    run_budget(&c, "30% sqrt peak", ps.peak_bytes / 10 * 3, slots, 3);
    run_budget(&c, "25% sqrt peak", ps.peak_bytes / 4, slots, 3);
    run_budget(&c, "sqrt's peak", ps.peak_bytes, 2000, 1);
    printf("(* = multi-level plan; overhead = recompute / (sum f + sum b))\n");
    mp_ckpt_plan_release(&pn);
    mp_ckpt_plan_release(&ps);
    mp_chain_release(&c);
    return 0;
}
