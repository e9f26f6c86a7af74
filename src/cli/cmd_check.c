/* cmd_check.c — memplan check: the CI gate, exit 0 if the configuration fits the target, 1 if
 * it does not. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cmd_check(struct args *a)
{
    if (!a->batch_set)
        return cli_usage_error("check", "%s", "check: --batch B is required");
    if (!a->gpu && !a->vram)
        return cli_usage_error("check", "%s", "check: give the target with --gpu NAME or --vram SIZE");
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = cli_setup(a, &s, false, &d);
    if (rc)
        return rc;
    struct mp_fit f;
    memset(&f, 0, sizeof f);
    struct mp_job j = cli_job_of(&s, a);
    cli_fit_program_for_report(a, &s, &j);
    int code = MP_EXIT_OK;
    enum mp_status st = mp_fit_eval(&j, &f, &d);
    if (st == MP_OK)
        st = cli_fit_report_program(&j, &f, &d);
    if (st != MP_OK)
        goto out;
    struct mp_report_ctx c;
    cli_fill_ctx(&c, "check", &s, &f.prog, &a->ckpt, a);
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = cli_write_timeline(a, "check", &s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL, f.est.overhead_bytes,
                             true, NULL, 0)) != 0)
        goto out;
    mp_report_check(stdout, &c, &f);
    if (!f.fits)
        cli_say_nofit(&f);
    code = f.fits ? MP_EXIT_OK : MP_EXIT_NOFIT;
out: /* the one way out: everything released, then the status */
    mp_fit_release(&f);
    mp_model_release(&s.model);
    return cli_leave(st, &d, rc, code, a->model);
}
