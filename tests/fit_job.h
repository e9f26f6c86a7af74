/* fit_job.h — a fit job on a named GPU profile with memplan's defaults, for the test suites
 * that evaluate fits (test_search.c, test_fold.c).  Test code only: a static function. */
#ifndef MEMPLAN_TESTS_FIT_JOB_H
#define MEMPLAN_TESTS_FIT_JOB_H

#include <string.h>

#include "search.h"

static struct mp_job job_for(const struct mp_model *m, const char *gpu)
{
    struct mp_job j;
    memset(&j, 0, sizeof j);
    j.model = m;
    mp_build_opts_default(&j.build);
    mp_train_opts_default(&j.train);
    j.margin = 0.05;
    struct mp_diag d = {{0}};
    if (mp_gpu_load(gpu, NULL, &j.gpu, &d) != MP_OK)
        fail_msg("gpu: %s", d.msg);
    j.train.cublas_workspace_bytes = j.gpu.workspace_bytes;
    return j;
}

#endif
