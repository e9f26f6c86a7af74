/* cmd_probe.c — memplan probe: real training steps on the GPU or the CPU, measured. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* isatty */

#include "cli/cli.h"

int cmd_probe(struct args *a)
{
    struct mp_diag d = {{0}};
    struct setup s;
    int rc = cli_setup(a, &s, false, &d);
    if (rc)
        return rc;
    struct mp_program prog;
    struct mp_probe *p = NULL;
    struct mp_chain ch;
    struct mp_ckpt_plan plan;
    struct mp_estimate e;
    struct mp_probe_result r;
    memset(&prog, 0, sizeof prog);
    memset(&ch, 0, sizeof ch);
    mp_ckpt_plan_init(&plan);
    memset(&e, 0, sizeof e);
    memset(&r, 0, sizeof r);
    int code = MP_EXIT_OK;
    enum mp_status st = mp_program_build(&s.model, &s.build, &prog, &d);
    if (st != MP_OK)
        goto out;
    struct mp_probe_opts po;
    mp_probe_opts_default(&po);
    po.backend = a->backend;
    po.device = a->device;
    po.steps = (unsigned)a->steps;
    po.capacity_bytes = a->capacity;
    po.progress = isatty(2); /* stderr, on a terminal: a host step can take seconds */
    po.trace = a->timeline != NULL;
    if (a->ckpt.offload) { /* its executor keeps every checkpoint on the device */
        rc = cli_usage_error("probe", "%s", "--checkpoint ...+offload: probe does not run offloaded checkpoints; "
                                            "use 'memplan estimate'");
        goto out;
    }
    if (a->ckpt.sac != MP_SAC_NONE) { /* (its executor runs every op of a recompute) */
        rc = cli_usage_error("probe", "%s", "--checkpoint ...+sac: probe does not run selective checkpointing; "
                                            "use 'memplan estimate'");
        goto out;
    }
    bool autohost = !strcmp(a->backend, "auto") && !mp_cuda_device_available();
    if ((autohost || !strcmp(a->backend, "host")) &&
        (st = mp_probe_host_admit(&prog, &s.train, a->capacity, autohost, &d)) != MP_OK)
        goto out;
    if (autohost) {
        fprintf(stderr, "memplan: no usable GPU: probing on the host backend (CPU)\n");
        po.backend = "host";
    }
    if (a->ckpt.strategy == MP_CKPT_OPTIMAL || a->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS) {
        rc = cli_usage_error("probe", "%s", "probe takes a fixed plan (none, sqrt, segments:K, every:K, layers); "
                                        "use 'memplan plan' to find an optimal one");
        goto out;
    }
    if ((st = mp_probe_open(&p, &po, &d)) != MP_OK || (st = mp_estimate_chain(&prog, &ch, &d)) != MP_OK ||
        (st = mp_ckpt_plan_make(&ch, &a->ckpt, 0, a->slots, &plan, &d)) != MP_OK ||
        (st = mp_estimate_run_chain(&prog, &plan.sched, &s.train, 0, &ch, &e, &d)) != MP_OK ||
        (st = mp_probe_run(p, &prog, &plan.sched, &s.train, &r, &d)) != MP_OK)
        goto out;
    struct mp_report_ctx c;
    cli_fill_ctx(&c, "probe", &s, &prog, &a->ckpt, a);
    c.gpu = NULL;
    /* the picture before the report: a failed write (exit 5) prints no report */
    if ((rc = cli_write_timeline(a, "probe", &s, &prog, &plan.sched, 0, false, r.trace, r.n_trace)) != 0)
        goto out;
    mp_report_probe(stdout, &c, &e, &r);
    code = r.fits ? MP_EXIT_OK : MP_EXIT_NOFIT;
out: /* the one way out: everything released, then the status */
    mp_probe_result_release(&r);
    mp_estimate_release(&e);
    mp_ckpt_plan_release(&plan);
    mp_chain_release(&ch);
    mp_probe_close(p);
    mp_program_release(&prog);
    mp_model_release(&s.model);
    return cli_leave(st, &d, rc, code, a->model);
}
