/* cmd_estimate.c — memplan estimate: where a training step's GPU memory goes, layer by layer,
 * and when it peaks.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cmd_estimate(struct args *a)
{
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = cli_setup(a, &s, false, &d);
    if (rc)
        return rc;
    struct mp_fit f;
    memset(&f, 0, sizeof f);
    enum mp_status st = MP_OK;
    if (!a->gpu) {
        s.gpu.context_bytes = a->context_set ? a->context : 500u << 20;
        if (!a->context_set)
            cli_add_default(&s, "CUDA context %s (typical; probe measures it)", "500 MiB");
        cli_add_default(&s, "column sums' staging %s", "not counted (no --gpu: its SM count sizes it)");
    }
    struct mp_job j = cli_job_of(&s, a);
    cli_fit_program_for_report(a, &s, &j);
    bool budgeted = a->ckpt.strategy == MP_CKPT_OPTIMAL || a->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS;
    if (a->ckpt.sac == MP_SAC_AUTO && !a->gpu) {
        rc = cli_usage_error("estimate", "%s", "--checkpoint ...+sac:auto plans for a target: add --gpu NAME");
        goto out;
    }
    if (budgeted && !a->gpu) {
        rc = cli_usage_error("estimate", "%s", "--checkpoint optimal needs a target: add --gpu NAME (or use 'memplan plan')");
        goto out;
    }
    double t0 = mp_now_ms();
    if ((st = mp_fit_eval(&j, &f, &d)) != MP_OK || (st = cli_fit_report_program(&j, &f, &d)) != MP_OK)
        goto out;
    if (f.infeasible)
        fprintf(stderr, "memplan: warning: no %s plan fits the target's activation budget; showing every "
                        "block checkpointed (every:1)\n",
                a->ckpt.strategy == MP_CKPT_OPTIMAL ? "optimal" : "optimal-segments");
    struct mp_report_ctx c;
    cli_fill_ctx(&c, "estimate", &s, &f.prog, &a->ckpt, a);
    c.gpu = a->gpu ? &s.gpu : NULL;
    c.fit = a->gpu ? &f : NULL;
    s.build.seq = f.prog.opts.seq;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = cli_write_timeline(a, "estimate", &s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL,
                             f.est.overhead_bytes, a->gpu != NULL, NULL, 0)) != 0)
        goto out;
    mp_report_estimate(stdout, &c, &f.est, &f.plan);
    if (getenv("MEMPLAN_TIMING"))
        fprintf(stderr, "memplan: estimate took %.2f ms\n", mp_now_ms() - t0);
out: /* the one way out: everything released, then the status */
    mp_fit_release(&f);
    mp_model_release(&s.model);
    return cli_leave(st, &d, rc, MP_EXIT_OK, a->model);
}
