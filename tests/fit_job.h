/* fit_job.h — a fit job on a target with memplan's defaults, for the test suites that
 * evaluate fits (test_search.c, test_fold.c, test_probe_suggest.c).  Test code only. */
#ifndef MEMPLAN_TESTS_FIT_JOB_H
#define MEMPLAN_TESTS_FIT_JOB_H

#include <string.h>

#include "search/search.h"

/* A fit job of m on target g with memplan's defaults. */
static inline struct mp_job job_on(const struct mp_model *m, const struct mp_gpu *g)
{
    struct mp_job j;
    memset(&j, 0, sizeof j);
    j.model = m;
    mp_build_opts_default(&j.build);
    mp_train_opts_default(&j.train);
    j.margin = 0.05;
    j.gpu = *g;
    j.train.cublas_workspace_bytes = j.gpu.workspace_bytes;
    return j;
}

/* ... on the named GPU profile */
static inline struct mp_job job_for(const struct mp_model *m, const char *gpu)
{
    struct mp_gpu g;
    struct mp_diag d = {{0}};
    if (mp_gpu_load(gpu, NULL, &g, &d) != MP_OK)
        fail_msg("gpu: %s", d.msg);
    return job_on(m, &g);
}

#endif
