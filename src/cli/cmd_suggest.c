/* cmd_suggest.c — memplan suggest: the configuration to train with (micro-batch, accumulation, checkpoints,
 * precision), searched.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* isatty */

#include "cli/cli.h"

/* --timeline: the recommended configuration's step, evaluated again with its program kept.
 * 0, or the exit status of a failed write. */
static int suggest_timeline(struct args *a, struct setup *s, const struct mp_job *base, const struct mp_suggestion *sg,
                            struct mp_diag *d, enum mp_status *st)
{
    if (!a->timeline)
        return 0;
    if (sg->best < 0) {
        cli_warn("--timeline: nothing fits, so there is no recommended step to draw (%s not written)",
                 a->timeline);
        return 0;
    }
    const struct mp_candidate *b = &sg->cand[sg->best];
    struct mp_job j = *base;
    struct mp_parallel par = b->par;
    j.build.batch = b->micro_batch;
    j.build.precision = b->precision;
    j.build.ft.mode = b->ft;
    j.ckpt = b->ckpt;
    if (j.train.par)
        j.train.par = &par;
    cli_fit_program_for_report(a, s, &j);
    struct mp_fit f;
    memset(&f, 0, sizeof f);
    int rc = 0;
    if ((*st = mp_fit_eval(&j, &f, d)) == MP_OK)
        rc = cli_write_timeline(a, "suggest", s, &f.prog, f.plan.sched.n ? &f.plan.sched : NULL,
                                f.est.overhead_bytes, true, NULL, 0);
    mp_fit_release(&f);
    return rc;
}

/* A recipe that pads its rows: the packing its trainer offers, as a hint (search.h hint_packing):
 * TRL's packing=True is padding-free (sft_trainer.py:916), so is transformers'
 * DataCollatorWithFlattening; Axolotl's sample_packing is planned under flash attention only. */
static int packing_hint(const struct args *a)
{
    if (!a->rec || a->packing)
        return 0;
    if (a->rec->format == MP_RF_TRL || a->rec->format == MP_RF_HF)
        return 2;
    return a->rec->format == MP_RF_AXOLOTL && a->attention_set && a->attention == MP_ATTN_FLASH ? 1 : 0;
}

/* --write-recipe: a setting the command line gave over the recipe is not written back, so the
 * file would not run the plan: refused before the search.  0, or the exit status. */
static int write_recipe_admit(const struct args *a)
{
    if (!a->write_recipe)
        return 0;
    for (int i = 0; i < MP_RS_N; i++) {
        const struct mp_recipe_setting *r = &a->rec->s[i];
        if (i != MP_RS_MODEL && r->set && r->src == MP_RSRC_COMMAND_LINE) {
            char msg[320];
            snprintf(msg, sizeof msg, "--write-recipe: --%s is given over the recipe's %s: memplan writes back "
                     "only the micro-batch and accumulation; set it in the recipe instead",
                     mp_recipe_setting_option((enum mp_recipe_setting_id)i), r->key);
            return cli_usage_error("suggest", "%s", msg);
        }
    }
    return 0;
}

/* --write-recipe OUT after the search: the recommended plan's batch and accumulation written into
 * the recipe.  0, or the exit status (message printed). */
static int write_recipe(const struct args *a, const struct mp_suggestion *sg)
{
    if (!a->write_recipe)
        return 0;
    if (sg->best < 0) {
        cli_warn("--write-recipe: nothing fits, so there is no plan to write (%s not written)", a->write_recipe);
        return 0;
    }
    const struct mp_candidate *b = &sg->cand[sg->best];
    const struct mp_recipe *r = a->rec;
    const char *prec = mp_precision_str(b->precision);
    if (r->s[MP_RS_PRECISION].set && r->s[MP_RS_PRECISION].src != MP_RSRC_UNUSED &&
        strcmp(r->s[MP_RS_PRECISION].value, prec) != 0) { /* (the recipe fixes the precision: a guard) */
        fprintf(stderr, "memplan: error: --write-recipe: the plan's precision %s is not the recipe's %s (%s): "
                "%s not written\n", prec, r->s[MP_RS_PRECISION].value, r->s[MP_RS_PRECISION].key, a->write_recipe);
        return MP_EXIT_INTERNAL;
    }
    struct mp_recipe_change ch[MP_RECIPE_MAX_CHANGES];
    size_t n = mp_recipe_changes(r, b->micro_batch, b->grad_accum, ch);
    struct mp_diag d = {{0}};
    enum mp_status st = mp_recipe_write(r, (enum mp_trainer)a->trainer, ch, n, a->write_recipe, &d);
    if (st != MP_OK) {
        fprintf(stderr, "memplan: error: %s\n", d.msg);
        return st == MP_ERR_IO ? MP_EXIT_INTERNAL : st == MP_ERR_MODEL ? MP_EXIT_INPUT : MP_EXIT_INTERNAL;
    }
    fprintf(stderr, "memplan: wrote %s:", a->write_recipe);
    for (size_t i = 0; i < n; i++)
        fprintf(stderr, "%s %s %s -> %s", i ? "," : "", ch[i].key, ch[i].from, ch[i].to);
    fprintf(stderr, "%s\n", n ? "" : " the recipe runs this plan as it is (a copy)");
    return 0;
}

int cmd_suggest(struct args *a)
{
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = write_recipe_admit(a);
    if (rc)
        return rc;
    rc = cli_setup(a, &s, true, &d);
    if (rc)
        return rc;
    bool probing = !a->no_probe && (!strcmp(a->backend, "host") || !strcmp(a->backend, "cuda") ||
                                    mp_cuda_device_available());
    if (probing && a->ckpt.offload) { /* the probe's executor keeps checkpoints on the device */
        mp_model_release(&s.model);
        return cli_usage_error("suggest", "%s", "--checkpoint ...+offload: probes do not offload; add --no-probe");
    }
    if (probing && a->ckpt.sac != MP_SAC_NONE) {
        mp_model_release(&s.model);
        return cli_usage_error("suggest", "%s", "--checkpoint ...+sac: probes do not run selective checkpointing; "
                                                "add --no-probe");
    }
    struct mp_job j = cli_job_of(&s, a);
    struct mp_suggest_opts o = {.precision_fixed = a->precision_set, .precision = (enum mp_precision)a->precision,
                                .global_batch = a->global_batch, .max_batch = a->max_batch,
                                .probe = probing,
                                .probe_backend = !strcmp(a->backend, "host") ? "host" : "cuda",
                                .probe_capacity_bytes = a->capacity, .target_is_device = s.target_is_device,
                                .device = a->device,
                                .progress = isatty(2) && !a->json,
                                /* an HF config is trained by transformers' Trainer: every format
                                 * describes one plan it runs (none, layers, layers:N) */
                                .trainer_plans_only = a->emit == MP_EMIT_HF || !strcmp(s.model.source, "hf"),
                                .lora_bf16_base = a->ft.mode == MP_FT_LORA && !strcmp(s.model.source, "hf") &&
                                                  a->emit != MP_EMIT_DEEPSPEED,
                                .ckpt_fixed = a->ckpt_set, .ckpt = a->ckpt,
                                .hints = a->emit == MP_EMIT_NONE,
                                .hint_packing = packing_hint(a)};
    /* probes on the host backend: its pool stands for the device and counts allocated bytes (no
     * caching allocator), so the choice is made at the allocated level, as the probes judge it */
    if (o.probe && !strcmp(o.probe_backend, "host"))
        j.train.skip_reserved = true;
    if (a->gpus_set || a->par_set) { /* data parallel: strategy given, or searched at --gpus x --nodes */
        o.par_search = !a->par_set;
        j.train.par = &s.par;
        o.probe = false; /* the probe runs one rank's step on one GPU: not part of suggest yet */
    }
    struct mp_suggestion *sg = calloc(1, sizeof *sg); /* MP_SUGGEST_MAX_CANDIDATES: ~350 KiB */
    struct mp_program prog;
    memset(&prog, 0, sizeof prog);
    int code = MP_EXIT_OK;
    enum mp_status st = MP_OK;
    if (!sg) {
        st = mp_fail(&d, MP_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (o.probe && !strcmp(o.probe_backend, "host") &&
        (st = mp_suggest_host_admit(&j, &o, mp_host_ram_bytes(), &d)) != MP_OK)
        goto out;
    if ((st = mp_suggest(&j, &o, cli_argv0, sg, &d)) != MP_OK)
        goto out;
    if (a->trainer == MP_TRAINER_GRPO && (st = mp_grpo_limits(&j, sg, &d)) != MP_OK)
        goto out;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = suggest_timeline(a, &s, &j, sg, &d, &st)) != 0 || st != MP_OK)
        goto out;
    /* (a loss head the default precision cannot run, --loss cce: the report's program in the choice's) */
    if (mp_loss_precision_refused(s.build.loss, s.build.precision))
        s.build.precision = sg->best >= 0 ? sg->cand[sg->best].precision : MP_PREC_BF16;
    /* the report reads the program's counts: a long model's through its fold (fold.h) */
    if ((st = s.model.n_blocks >= MP_FIT_FOLD_BLOCKS ? mp_fold_report_program(&s.model, &s.build, &prog, &d)
                                                     : mp_program_build(&s.model, &s.build, &prog, &d)) != MP_OK)
        goto out;
    struct mp_report_ctx c;
    cli_fill_ctx(&c, "suggest", &s, &prog, NULL, a);
    c.build = NULL; /* suggest searches batch and precision: no single config line */
    mp_report_suggest(stdout, &c, sg, a->emit);
    code = sg->best >= 0 ? MP_EXIT_OK : MP_EXIT_NOFIT;
    if ((rc = write_recipe(a, sg)) != 0)
        goto out;
    if (sg->best >= 0 && o.global_batch && !sg->global_met)
        fprintf(stderr, "memplan: warning: global batch %llu cannot be met exactly\n",
                (unsigned long long)o.global_batch);
out: /* the one way out: everything released, then the status */
    mp_program_release(&prog);
    if (sg)
        mp_suggestion_release(sg);
    free(sg);
    mp_model_release(&s.model);
    return cli_leave(st, &d, rc, code, a->model);
}
