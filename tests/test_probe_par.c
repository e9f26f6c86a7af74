/* test_probe_par.c — the probe of one data-parallel rank on the host backend (probe_par.c).
 *
 * The model of test_parallel.c: linear(16->30, bias) | 2 x linear(30->30, bias) |
 * classifier(30->4, bias); parameters W1 30x16, b1 30, W 30x30 and b 30 (twice), Wc 4x30,
 * bc 4.  For every strategy, at world 2 and 3, the host probe of rank r runs real steps
 * (the loss falls) and its measured peak equals the estimator's per-rank peak, which the
 * estimator computes on its own (estimate.c's visitor, not the probe's pool).  The bytes
 * the probe allocates for the shards are checked against hand-worked sharding arithmetic:
 *   FSDP2, 4 ranks, fp32: ceil(dim0 / 4) rows each: W1 8x16 = 128, b1 8, W 8x30 = 240 (x2),
 *     b 8 (x2), Wc 1x30 = 30, bc 1: each allocation rounded to 512 bytes as the estimator
 *     counts: 512 + 512 + (1024 + 512) x 2 + 512 + 512 = 5120 bytes of parameters; AdamW's
 *     two fp32 states per shard: 1024 + 512 + (2048 + 512) x 2 + 512 + 512 = 7680.
 *   ZeRO-3, 4 ranks (hidden 16: persistence threshold 160 elements): W1 ceil(480/4) = 120,
 *     W ceil(900/4) = 225 (x2); b1, b, Wc (120) and bc stay whole: 512 + 512 + (1024 + 512)
 *     x 2 + 512 + 512 = 5120 bytes.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "estimate/estimate.h"
#include "ir/layers.h"
#include "model/model.h"
#include "estimate/parallel.h"
#include "probe/probe.h"

static const char *MODEL = "{\"name\":\"par\",\"input\":{\"shape\":[16]},\"classes\":4,\"layers\":["
                           "{\"type\":\"linear\",\"in_features\":16,\"out_features\":30,\"bias\":true},"
                           "{\"repeat\":2,\"layers\":[{\"type\":\"linear\",\"in_features\":30,\"out_features\":30,"
                           "\"bias\":true}]},"
                           "{\"type\":\"classifier\",\"in_features\":30,\"classes\":4}]}";

struct run {
    uint64_t estimated, measured;
    float first, last;
    uint64_t trace[64];
    size_t n_trace;
};

static void probe_rank(enum mp_par_strategy s, uint64_t world, uint64_t rank, enum mp_precision prec, bool mixed,
                       struct run *out)
{
    struct mp_diag d = {{0}};
    struct mp_model m;
    struct mp_program p;
    if (mp_model_load_string(&m, MODEL, strlen(MODEL), "test.json", &d) != MP_OK)
        fail_msg("load: %s", d.msg);
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 4;
    bo.precision = prec;
    if (mp_program_build(&m, &bo, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    struct mp_parallel par;
    mp_parallel_default(&par);
    par.strategy = s;
    par.gpus = world;
    par.rank = rank;
    par.mixed_bf16 = mixed;
    struct mp_train_opts t;
    mp_train_opts_default(&t);
    t.cublas_workspace_bytes = 0;
    t.par = &par;
    struct mp_estimate e;
    if (mp_estimate_run(&p, NULL, &t, 0, &e, &d) != MP_OK)
        fail_msg("estimate: %s", d.msg);
    struct mp_probe_opts o;
    mp_probe_opts_default(&o);
    o.backend = "host";
    o.steps = 4;
    o.trace = true;
    struct mp_probe *pr = NULL;
    struct mp_probe_result r;
    if (mp_probe_open(&pr, &o, &d) != MP_OK)
        fail_msg("open: %s", d.msg);
    if (mp_probe_run(pr, &p, NULL, &t, &r, &d) != MP_OK)
        fail_msg("%s x%llu rank %llu: %s", mp_par_strategy_str(s), (unsigned long long)world,
                 (unsigned long long)rank, d.msg);
    assert_true(r.fits);
    out->estimated = e.peak_allocated_bytes;
    out->measured = r.measured_peak_bytes;
    out->first = r.losses[0];
    out->last = r.losses[r.steps - 1];
    out->n_trace = r.n_trace < 64 ? r.n_trace : 64;
    memcpy(out->trace, r.trace, out->n_trace * sizeof *out->trace);
    mp_probe_result_release(&r);
    mp_probe_close(pr);
    mp_estimate_release(&e);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Every strategy, two worlds, the last rank: measured = estimated, the loss falls. */
static void test_probe_par_equals_estimate(void **state)
{
    (void)state;
    static const enum mp_par_strategy S[] = {MP_PAR_DDP,  MP_PAR_ZERO1, MP_PAR_ZERO2,
                                              MP_PAR_ZERO3, MP_PAR_FSDP, MP_PAR_FSDP_NO_RESHARD};
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++)
        for (uint64_t w = 2; w <= 3; w++) {
            struct run r;
            probe_rank(S[i], w, w - 1, MP_PREC_FP32, false, &r);
            if (r.measured != r.estimated || !(r.last < r.first) || !isfinite(r.last))
                fail_msg("%s x%llu: measured %llu, estimated %llu; loss %g -> %g", mp_par_strategy_str(S[i]),
                         (unsigned long long)w, (unsigned long long)r.measured, (unsigned long long)r.estimated,
                         r.first, r.last);
        }
}

/* The mixed-bf16 policy (bf16 compute copies, fp32 master) under the sharding engines. */
static void test_probe_par_mixed_bf16(void **state)
{
    (void)state;
    static const enum mp_par_strategy S[] = {MP_PAR_ZERO2, MP_PAR_ZERO3, MP_PAR_FSDP};
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        struct run r;
        probe_rank(S[i], 2, 0, MP_PREC_BF16, true, &r);
        if (r.measured != r.estimated || !(r.last < r.first))
            fail_msg("%s mixed-bf16: measured %llu, estimated %llu; loss %g -> %g", mp_par_strategy_str(S[i]),
                     (unsigned long long)r.measured, (unsigned long long)r.estimated, r.first, r.last);
    }
}

/* The shards the probe allocates, against the hand-worked sizes above (setup events come
 * first: the parameters in order, then their optimizer state). */
static void test_probe_par_shard_bytes(void **state)
{
    (void)state;
    struct run f, z;
    probe_rank(MP_PAR_FSDP, 4, 1, MP_PREC_FP32, false, &f);
    assert_true(f.n_trace >= 16);
    assert_int_equal(f.trace[7], 5120);
    assert_int_equal(f.trace[15], 5120 + 7680);
    probe_rank(MP_PAR_ZERO3, 4, 3, MP_PREC_FP32, false, &z);
    assert_true(z.n_trace >= 8);
    assert_int_equal(z.trace[7], 5120);
    /* every rank holds the same bytes */
    struct run f0;
    probe_rank(MP_PAR_FSDP, 4, 0, MP_PREC_FP32, false, &f0);
    assert_int_equal(f0.measured, f.measured);
}

/* What the per-rank probe does not run is refused, not faked. */
static void test_probe_par_refusals(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    struct mp_model m;
    struct mp_program p;
    assert_int_equal(mp_model_load_string(&m, MODEL, strlen(MODEL), "test.json", &d), MP_OK);
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    assert_int_equal(mp_program_build(&m, &bo, &p, &d), MP_OK);
    struct mp_parallel par;
    mp_parallel_default(&par);
    par.strategy = MP_PAR_ZERO3;
    par.gpus = 2;
    par.offload = MP_OFFLOAD_OPTIMIZER;
    struct mp_train_opts t;
    mp_train_opts_default(&t);
    t.par = &par;
    struct mp_probe_opts o;
    mp_probe_opts_default(&o);
    o.backend = "host";
    struct mp_probe *pr = NULL;
    struct mp_probe_result r;
    assert_int_equal(mp_probe_open(&pr, &o, &d), MP_OK);
    assert_int_equal(mp_probe_run(pr, &p, NULL, &t, &r, &d), MP_ERR_UNSUPPORTED);
    assert_non_null(strstr(d.msg, "--offload"));
    par.offload = MP_OFFLOAD_NONE;
    par.rank = 2; /* world 2: ranks 0 and 1 */
    assert_int_equal(mp_probe_run(pr, &p, NULL, &t, &r, &d), MP_ERR_USAGE);
    mp_probe_close(pr);
    mp_program_release(&p);
    mp_model_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_par_equals_estimate),
        cmocka_unit_test(test_probe_par_mixed_bf16),
        cmocka_unit_test(test_probe_par_shard_bytes),
        cmocka_unit_test(test_probe_par_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
