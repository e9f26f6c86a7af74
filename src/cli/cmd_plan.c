/* cmd_plan.c — memplan plan: which blocks to checkpoint so the batch fits, at the least recompute. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* plan's one stderr line (and JSON report) when no optimal plan can be made: the static bytes
 * leave nothing for activations, or not even every block checkpointed fits the budget. */
static void say_noplan(struct args *a, struct setup *s, const struct mp_fit *f)
{
    char a1[32], a2[32], why[256];
    if (f->activation_budget == 0)
        snprintf(why, sizeof why, "weights, grads, optimizer and overheads alone take %s of %s usable",
                 mp_fmt_bytes(f->static_bytes, a1, sizeof a1), mp_fmt_bytes(f->usable_bytes, a2, sizeof a2));
    else
        snprintf(why, sizeof why, "no plan fits the activation budget %s: every block checkpointed needs %s",
                 mp_fmt_bytes(f->activation_budget, a1, sizeof a1), mp_fmt_bytes(f->plan.peak_bytes, a2, sizeof a2));
    fprintf(stderr, "memplan: does not fit: %s\n", why);
    if (a->json) {
        struct mp_report_ctx c;
        cli_fill_ctx(&c, "plan", s, NULL, &a->ckpt, a);
        mp_report_plan_none(stdout, &c, f, why);
    }
}

int cmd_plan(struct args *a)
{
    if (!a->budget && !a->gpu && !a->vram)
        return cli_usage_error("plan", "%s", "plan needs --activation-budget, --vram or --gpu");
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = cli_setup(a, &s, false, &d);
    if (rc)
        return rc;
    if (!a->gpu && !a->vram)
        mp_gpu_from_vram(UINT64_MAX / 4, &s.gpu); /* an explicit budget: no device limit */
    struct mp_job j = cli_job_of(&s, a);
    /* a long model is evaluated through folds (fold.h), and the report reads the counts of its
     * fold's program; a timeline replays the whole program */
    bool folds = s.model.n_blocks >= MP_FIT_FOLD_BLOCKS && !a->timeline;
    j.keep_program = !folds;
    struct mp_fit f;
    struct mp_program rprog;
    memset(&rprog, 0, sizeof rprog);
    int code = MP_EXIT_OK;
    enum mp_status st = mp_fit_eval(&j, &f, &d); /* f is empty, or released, when it fails */
    if (st != MP_OK)
        goto out;
    struct mp_build_opts rbo;
    mp_fit_build_opts(&j, &rbo);
    if (folds && (st = mp_fold_report_program(&s.model, &rbo, &rprog, &d)) != MP_OK)
        goto out;
    bool budgeted = a->ckpt.strategy == MP_CKPT_OPTIMAL || a->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS;
    if (budgeted && (f.activation_budget == 0 || f.infeasible)) {
        say_noplan(a, &s, &f);
        code = MP_EXIT_NOFIT;
        goto out;
    }
    struct mp_plan_cmp cmp = {0};
    if (budgeted && f.plan.sched.n)
        mp_ckpt_compare(&f.chain, f.plan.peak_bytes, a->slots, &cmp);
    struct mp_report_ctx c;
    cli_fill_ctx(&c, "plan", &s, folds ? &rprog : &f.prog, &a->ckpt, a);
    if (!a->gpu && !a->vram)
        c.gpu = NULL;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = cli_write_timeline(a, "plan", &s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL, f.est.overhead_bytes,
                             a->gpu || a->vram, NULL, 0)) != 0)
        goto out;
    mp_report_plan(stdout, &c, &f, &cmp);
    bool fits = f.fits || (!a->gpu && !a->vram);
    if (!fits)
        cli_say_nofit(&f);
    code = fits ? MP_EXIT_OK : MP_EXIT_NOFIT;
out: /* the one way out: everything released, then the status */
    mp_program_release(&rprog);
    mp_fit_release(&f);
    mp_model_release(&s.model);
    return cli_leave(st, &d, rc, code, a->model);
}
