/* test_probe_suggest.c — suggest's probe confirmation, run on the host backend.
 *
 * The host pool enforces a capacity and counts what the estimator counts, so the
 * whole confirmation path (b*, b*+1, out of memory everywhere, a moved batch, the
 * global-batch divisor rule) runs here without a GPU.  Expected values come from
 * the estimator's own verdicts at neighbouring batches (an independent path: the
 * pool's byte counting is only checked against them), never from the probe loop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fit_job.h"
#include "search/search.h"

/* tiny-test on a --vram-style target sized so that micro-batches are small (fast probes) */
static struct mp_job tiny_job(struct mp_model *m, uint64_t vram)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_file(m, "models/tiny-test.json", &d) != MP_OK)
        fail_msg("load: %s", d.msg);
    struct mp_gpu g;
    mp_gpu_from_vram(vram, &g);
    g.context_bytes = 1u << 20; /* a small context: the step's storages are most of the target */
    struct mp_job j = job_on(m, &g);
    j.train.skip_reserved = true; /* the host probe's pool is the device here: what it counts is the
                                   * allocated level, no caching allocator's segments */
    return j;
}

/* The estimator's peak allocated bytes (what the probe pool counts) at batch b. */
static uint64_t est_alloc(const struct mp_job *job, const struct mp_candidate *c, uint64_t b, bool accumulate)
{
    struct mp_job j = *job;
    j.build.precision = c->precision;
    j.ckpt = c->ckpt;
    j.build.batch = b;
    j.train.accumulate = accumulate;
    struct mp_fit f;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_fit_eval(&j, &f, &d), MP_OK);
    uint64_t v = f.est.peak_allocated_bytes;
    mp_fit_release(&f);
    return v;
}

static void suggest(const struct mp_job *j, const struct mp_suggest_opts *o, struct mp_suggestion *s)
{
    struct mp_diag d = {{0}};
    if (mp_suggest(j, o, NULL, s, &d) != MP_OK)
        fail_msg("suggest: %s", d.msg);
}

/* The target's vram: usable - context sits halfway between the allocations of b and b+1
 * of the fp32 no-checkpoint candidate. */
static uint64_t vram_for_batch(uint64_t b)
{
    struct mp_model m;
    struct mp_job j = tiny_job(&m, (uint64_t)1 << 40);
    struct mp_candidate c;
    memset(&c, 0, sizeof c);
    c.precision = MP_PREC_FP32;
    c.ckpt.strategy = MP_CKPT_NONE;
    uint64_t a = est_alloc(&j, &c, b, false), a1 = est_alloc(&j, &c, b + 1, false);
    assert_true(a1 > a);
    mp_model_release(&m);
    return (uint64_t)((double)(a + (a1 - a) / 2 + (1u << 20)) / 0.95);
}

/* suggest --gpu T on a machine with some other device: the probes run under T's limit
 * (usable less context), confirm b* (it fits) and b*+1 (it does not), and do not move
 * the batch.  Before the fix the probe ran with capacity 0 ("whatever is free") and
 * walked the batch up past what T holds. */
static void test_probe_suggest_uses_the_target_capacity(void **state)
{
    (void)state;
    struct mp_model m;
    uint64_t vram = vram_for_batch(6);
    struct mp_job j = tiny_job(&m, vram);
    struct mp_suggest_opts est = {.precision_fixed = true, .precision = MP_PREC_FP32};
    struct mp_suggestion s0, s1;
    suggest(&j, &est, &s0);
    assert_true(s0.best >= 0);
    struct mp_suggest_opts pr = est;
    pr.probe = true;
    pr.probe_backend = "host";
    suggest(&j, &pr, &s1);
    assert_true(s1.best >= 0);
    const struct mp_candidate *a = &s0.cand[s0.best], *b = &s1.cand[s1.best];
    uint64_t usable = (uint64_t)((double)vram * 0.95);
    assert_int_equal(s1.probe_capacity_bytes, usable - j.gpu.context_bytes);
    assert_true(b->probed);
    assert_int_equal(b->micro_batch, a->micro_batch);
    assert_int_equal(s1.probes, 2); /* b* fits, b*+1 does not: the boundary, confirmed */
    /* the estimate's own boundary: b* within the limit, b*+1 over it */
    assert_true(est_alloc(&j, b, b->micro_batch, false) <= s1.probe_capacity_bytes);
    assert_true(est_alloc(&j, b, b->micro_batch + 1, false) > s1.probe_capacity_bytes);
    /* the measured peak is the estimate's (the host pool counts what the estimator counts) */
    assert_int_equal(b->probe_peak_bytes, b->fit.est.peak_allocated_bytes);
    mp_suggestion_release(&s0);
    mp_suggestion_release(&s1);
    mp_model_release(&m);
}

/* Out of memory at every probed batch: the candidate no longer fits and is never the
 * recommendation (before the fix it stayed best and suggest printed its snippet). */
static void test_probe_suggest_oom_everywhere_recommends_nothing(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_job j = tiny_job(&m, vram_for_batch(6));
    struct mp_suggest_opts o = {.precision_fixed = true, .precision = MP_PREC_FP32, .probe = true,
                                .probe_backend = "host", .probe_capacity_bytes = 4096};
    struct mp_suggestion s;
    suggest(&j, &o, &s);
    assert_int_equal(s.best, -1);
    assert_true(s.probes >= 1);
    size_t oom = 0;
    for (size_t i = 0; i < s.n; i++) {
        assert_false(s.cand[i].probed);
        oom += s.cand[i].probe_oom;
        if (s.cand[i].probe_oom)
            assert_false(s.cand[i].fits);
    }
    assert_true(oom >= 1);
    assert_non_null(strstr(s.note, "probes ran out of memory"));
    mp_suggestion_release(&s);
    mp_model_release(&m);
}

/* A device that holds less than the estimate assumed: the probe walks down to the
 * largest batch that runs, and the candidate's fit, peak, headroom and (estimated)
 * throughput are those of the moved batch; the probe's step time stays apart. */
static void test_probe_suggest_moved_batch_updates_the_candidate(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_job j = tiny_job(&m, vram_for_batch(6));
    struct mp_suggest_opts est = {.precision_fixed = true, .precision = MP_PREC_FP32};
    struct mp_suggestion s0, s1;
    suggest(&j, &est, &s0);
    const struct mp_candidate *a = &s0.cand[s0.best];
    assert_true(a->micro_batch >= 4);
    uint64_t target = a->micro_batch - 2;
    struct mp_suggest_opts pr = est;
    pr.probe = true;
    pr.probe_backend = "host";
    pr.probe_capacity_bytes = est_alloc(&j, a, target, false); /* target fits, target + 1 does not */
    assert_true(est_alloc(&j, a, target + 1, false) > pr.probe_capacity_bytes);
    suggest(&j, &pr, &s1);
    assert_true(s1.best >= 0);
    const struct mp_candidate *b = &s1.cand[s1.best];
    assert_true(b->probed);
    assert_true(b->fits);
    assert_true(est_alloc(&j, b, b->micro_batch, false) <= pr.probe_capacity_bytes);
    assert_true(est_alloc(&j, b, b->micro_batch + 1, false) > pr.probe_capacity_bytes);
    if (b->precision == a->precision && b->ckpt.strategy == a->ckpt.strategy)
        assert_int_equal(b->micro_batch, target);
    /* everything re-evaluated at the moved batch */
    struct mp_job fj = j;
    fj.build.precision = b->precision;
    fj.ckpt = b->ckpt;
    fj.build.batch = b->micro_batch;
    struct mp_fit f;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_fit_eval(&fj, &f, &d), MP_OK);
    assert_int_equal(b->peak_device_bytes, f.peak_device_bytes);
    assert_int_equal(b->fit.est.peak_allocated_bytes, f.est.peak_allocated_bytes);
    double head = 100.0 * ((double)f.capacity_bytes - (double)f.peak_device_bytes) / (double)f.capacity_bytes;
    assert_true(b->headroom_pct > head - 1e-9 && b->headroom_pct < head + 1e-9);
    /* ranking figures are estimates: batch / estimated step time, not the probe's */
    double est_sps = (double)b->micro_batch / f.step_s;
    assert_true(b->samples_per_s > est_sps * (1 - 1e-9) && b->samples_per_s < est_sps * (1 + 1e-9));
    assert_true(b->probe_samples_per_s > 0);
    assert_int_equal(b->global_batch, b->micro_batch * b->grad_accum);
    mp_fit_release(&f);
    mp_suggestion_release(&s0);
    mp_suggestion_release(&s1);
    mp_model_release(&m);
}

/* --global-batch 12: a probe-moved micro-batch is still a divisor of 12 (12 does not run,
 * 11 would break the global batch: the next is 6, with accumulation). */
static void test_probe_suggest_moved_batch_keeps_the_divisor_rule(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_job j = tiny_job(&m, vram_for_batch(20));
    struct mp_suggest_opts est = {.precision_fixed = true, .precision = MP_PREC_FP32, .global_batch = 12};
    struct mp_suggestion s0, s1;
    suggest(&j, &est, &s0);
    assert_true(s0.best >= 0);
    const struct mp_candidate *a = &s0.cand[s0.best];
    assert_int_equal(a->micro_batch, 12);
    struct mp_suggest_opts pr = est;
    pr.probe = true;
    pr.probe_backend = "host";
    pr.probe_capacity_bytes = est_alloc(&j, a, 6, true); /* 6 with accumulation runs */
    assert_true(est_alloc(&j, a, 12, false) > pr.probe_capacity_bytes);
    assert_true(est_alloc(&j, a, 11, true) <= pr.probe_capacity_bytes + (1u << 20)); /* 11 is close */
    suggest(&j, &pr, &s1);
    assert_true(s1.best >= 0);
    const struct mp_candidate *b = &s1.cand[s1.best];
    assert_true(b->probed);
    assert_int_equal(12 % b->micro_batch, 0);
    assert_int_equal(b->micro_batch * b->grad_accum, 12);
    assert_true(s1.global_met);
    if (b->ckpt.strategy == a->ckpt.strategy)
        assert_int_equal(b->micro_batch, 6);
    mp_suggestion_release(&s0);
    mp_suggestion_release(&s1);
    mp_model_release(&m);
}

/* The same confirmation on the cuda backend (skips without a device): a --vram-style target
 * much smaller than the local GPU is answered for the target — b* fits, b*+1 runs out of the
 * target's limit, the batch is not moved up to what the local GPU could hold. */
static void test_probe_suggest_cuda_uses_the_target_capacity(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    struct mp_model m;
    struct mp_job j = tiny_job(&m, vram_for_batch(6));
    struct mp_suggest_opts est = {.precision_fixed = true, .precision = MP_PREC_FP32};
    struct mp_suggestion s0, s1;
    suggest(&j, &est, &s0);
    struct mp_suggest_opts pr = est;
    pr.probe = true;
    pr.probe_backend = "cuda";
    suggest(&j, &pr, &s1);
    assert_true(s1.best >= 0);
    const struct mp_candidate *a = &s0.cand[s0.best], *b = &s1.cand[s1.best];
    assert_true(b->probed);
    assert_int_equal(b->micro_batch, a->micro_batch);
    assert_int_equal(b->probe_peak_bytes, b->fit.est.peak_allocated_bytes);
    mp_suggestion_release(&s0);
    mp_suggestion_release(&s1);
    mp_model_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_suggest_uses_the_target_capacity),
        cmocka_unit_test(test_probe_suggest_oom_everywhere_recommends_nothing),
        cmocka_unit_test(test_probe_suggest_moved_batch_updates_the_candidate),
        cmocka_unit_test(test_probe_suggest_moved_batch_keeps_the_divisor_rule),
        cmocka_unit_test(test_probe_suggest_cuda_uses_the_target_capacity),
    };
    return cmocka_run_group_tests_name("probe_suggest", tests, NULL, NULL);
}
