/* probe_check.h — helpers shared by the probe test suites (test_probe.c, test_probe_ops.c):
 * model loading from a JSON string, host executor steps, the finite-difference gradient
 * check, and one probe run on a named backend.  Test code only: static inline functions.
 */
#ifndef MEMPLAN_TESTS_PROBE_CHECK_H
#define MEMPLAN_TESTS_PROBE_CHECK_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "probe/probe_impl.h"

static inline void load_json(struct mp_model *m, const char *json)
{
    struct mp_diag d = {{0}};
    mp_model_init(m);
    enum mp_status st = mp_model_load_string(m, json, strlen(json), "test.json", &d);
    if (st != MP_OK)
        fail_msg("model: %s", d.msg);
}

static inline struct mp_train_opts train_opts(enum mp_optimizer o, uint64_t ws)
{
    struct mp_train_opts t;
    mp_train_opts_default(&t);
    t.optimizer = o;
    t.cublas_workspace_bytes = ws;
    return t;
}

static inline struct mp_exec *exec_new(const struct mp_program *p, enum mp_optimizer o, uint64_t cap)
{
    struct mp_exec *x;
    struct mp_diag d = {{0}};
    struct mp_train_opts t = train_opts(o, 0);
    if (mp_host_exec_new(&x, p, &t, cap, 7, &d) != MP_OK)
        fail_msg("exec: %s", d.msg);
    return x;
}

static inline double step(struct mp_exec *x, const struct mp_schedule *s, bool update, float *grads)
{
    struct mp_diag d = {{0}};
    double loss;
    enum mp_status st = mp_host_exec_step(x, s, update, grads, &loss, &d);
    if (st != MP_OK)
        fail_msg("step: %s (%s)", mp_status_str(st), d.msg);
    return loss;
}

/* Central differences of the loss against the analytic gradient of every
 * parameter element (at most max_per_param per tensor, spread evenly).  An
 * element that misses is tried again at eps/3 and eps/10: a ReLU or max-pool kink
 * inside [v - eps, v + eps] breaks a finite difference, not the gradient. */
static inline double central_diff(struct mp_exec *x, const struct mp_schedule *s, size_t q, uint64_t i, float eps)
{
    float v = mp_host_exec_param_get(x, q, i);
    mp_host_exec_param_set(x, q, i, v + eps);
    double lp = step(x, s, false, NULL);
    mp_host_exec_param_set(x, q, i, v - eps);
    double lm = step(x, s, false, NULL);
    mp_host_exec_param_set(x, q, i, v);
    return (lp - lm) / (2.0 * (double)eps);
}

static inline void gradcheck(const struct mp_program *p, const struct mp_schedule *s, float eps, double atol, double rtol,
                      size_t max_per_param)
{
    struct mp_exec *x = exec_new(p, MP_OPT_SGD, 0);
    float *g = calloc(p->total_params, sizeof *g);
    assert_non_null(g);
    step(x, s, false, g);
    uint64_t off = 0;
    size_t checked = 0, bad = 0;
    double worst = 0;
    for (size_t q = 0; q < p->n_params; q++) {
        uint64_t n = p->params[q].elems, stride = n > max_per_param ? n / max_per_param : 1;
        for (uint64_t i = 0; i < n && p->params[q].trainable; i += stride) { /* frozen: no gradient */
            double fd = central_diff(x, s, q, i, eps), an = g[off + i], err = fabs(fd - an);
            double tol = atol + rtol * fmax(fabs(fd), fabs(an));
            for (int r = 0; r < 2 && err > tol; r++) { /* eps/3, then eps/10 */
                fd = central_diff(x, s, q, i, eps / (r ? 10.0f : 3.0f));
                err = fabs(fd - an);
                tol = atol + rtol * fmax(fabs(fd), fabs(an));
            }
            worst = fmax(worst, err / tol);
            checked++;
            if (err > tol) {
                bad++;
                print_message("  %s[%llu]: analytic %.6g, finite difference %.6g\n", p->params[q].name,
                              (unsigned long long)i, an, fd);
            }
        }
        off += n;
    }
    free(g);
    mp_host_exec_free(x);
    assert_true(checked > 0);
    if (bad)
        fail_msg("%zu of %zu gradient elements off (worst %.2f x tolerance)", bad, checked, worst);
}

/* One probe run of p on the named backend ("host" or "cuda"); any failure but OOM fails the test. */
static inline void probe_on(const char *backend, const struct mp_program *p, const struct mp_schedule *s,
                            const struct mp_train_opts *t, uint64_t cap, unsigned steps, struct mp_probe_result *r)
{
    struct mp_probe_opts o;
    struct mp_probe *pr;
    struct mp_diag d = {{0}};
    mp_probe_opts_default(&o);
    o.backend = backend;
    o.capacity_bytes = cap;
    o.steps = steps;
    if (mp_probe_open(&pr, &o, &d) != MP_OK)
        fail_msg("%s open: %s", backend, d.msg);
    enum mp_status st = mp_probe_run(pr, p, s, t, r, &d);
    if (st != MP_OK)
        fail_msg("%s probe: %s", backend, d.msg);
    mp_probe_close(pr);
}

static inline void probe_host(const struct mp_program *p, const struct mp_schedule *s, const struct mp_train_opts *t,
                              uint64_t cap, unsigned steps, struct mp_probe_result *r)
{
    probe_on("host", p, s, t, cap, steps, r);
}

static inline void probe_cuda(const struct mp_program *p, const struct mp_train_opts *t, uint64_t cap, unsigned steps,
                              struct mp_probe_result *r)
{
    probe_on("cuda", p, NULL, t, cap, steps, r);
}

#endif
