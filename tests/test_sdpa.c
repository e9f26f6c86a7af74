/* test_sdpa.c — the kernel torch 2.15's SDPA dispatcher picks on CUDA (mp_sdpa_backend,
 * lower_attention.c; docs/memory-facts.md#sdpa-backend), each case worked from sdp_utils.cpp's
 * checks: cuDNN first on sm90 / sm100 (half dtypes, head dims multiples of 8, <= 256 on sm90 and
 * <= 128 on sm100); then flash (sm80-sm121, half dtypes, no mask, equal head dims <= 256, not
 * training head dims in (192, 224] or > 224 with dropout on sm86-89 / sm120-121); then the
 * memory-efficient kernel (sm50-sm121; fp16, fp32, bf16 from sm80; head dims multiples of 8 in
 * half, 4 in fp32 from sm80, 1 in fp32 before); else math.  And the memory-efficient kernel's
 * logsumexp rows rounded up to 32 where the target makes torch pick it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ir/build.h"
#include "ir/layers.h"
#include "model/model.h"

static void test_backend_rules(void **state)
{
    (void)state;
    static const struct {
        int major, minor;
        enum mp_dtype dt;
        uint64_t d, dv;
        bool masked, dropout, math;
        enum mp_sdpa_backend want;
    } cases[] = {
        {9, 0, MP_DT_BF16, 64, 64, false, false, false, MP_SDPA_CUDNN},
        {9, 0, MP_DT_F16, 256, 256, true, true, false, MP_SDPA_CUDNN},      /* cuDNN takes the mask */
        {9, 0, MP_DT_BF16, 60, 60, false, false, false, MP_SDPA_FLASH},     /* not a multiple of 8 */
        {9, 0, MP_DT_BF16, 288, 288, false, false, false, MP_SDPA_EFFICIENT}, /* > 256 for both */
        {9, 0, MP_DT_F32, 64, 64, false, false, false, MP_SDPA_EFFICIENT},
        {10, 0, MP_DT_BF16, 192, 192, false, false, false, MP_SDPA_FLASH},  /* > 128 on sm100 */
        {10, 0, MP_DT_BF16, 128, 128, false, false, false, MP_SDPA_CUDNN},
        {9, 1, MP_DT_BF16, 64, 64, false, false, false, MP_SDPA_FLASH},     /* cuDNN first on x.0 only */
        {8, 0, MP_DT_BF16, 128, 128, false, false, false, MP_SDPA_FLASH},
        {8, 0, MP_DT_BF16, 128, 128, true, false, false, MP_SDPA_EFFICIENT}, /* a mask: no flash */
        {8, 0, MP_DT_BF16, 192, 128, false, false, false, MP_SDPA_EFFICIENT}, /* head dims differ */
        {8, 0, MP_DT_F32, 62, 62, false, false, false, MP_SDPA_MATH},       /* fp32: multiples of 4 */
        {8, 6, MP_DT_BF16, 200, 200, false, false, false, MP_SDPA_EFFICIENT},
        {8, 9, MP_DT_BF16, 256, 256, false, true, false, MP_SDPA_EFFICIENT},
        {8, 9, MP_DT_BF16, 256, 256, false, false, false, MP_SDPA_FLASH},
        {7, 5, MP_DT_BF16, 64, 64, false, false, false, MP_SDPA_MATH},      /* bf16 before sm80 */
        {7, 5, MP_DT_F16, 64, 64, false, false, false, MP_SDPA_EFFICIENT},
        {7, 0, MP_DT_F32, 62, 62, false, false, false, MP_SDPA_EFFICIENT},  /* no tensor cores: 1 */
        {7, 0, MP_DT_F16, 60, 60, false, false, false, MP_SDPA_MATH},       /* half: multiples of 8 */
        {9, 0, MP_DT_BF16, 64, 64, false, false, true, MP_SDPA_MATH},       /* sdpa_math decided */
        {0, 0, MP_DT_BF16, 64, 64, false, false, false, MP_SDPA_UNKNOWN},   /* no target */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        enum mp_sdpa_backend got = mp_sdpa_backend(cases[i].major, cases[i].minor, cases[i].dt, cases[i].d,
                                                   cases[i].dv, cases[i].masked, cases[i].dropout, cases[i].math);
        if (got != cases[i].want)
            fail_msg("case %zu (sm%d%d, d %llu): %s, not %s", i, cases[i].major, cases[i].minor,
                     (unsigned long long)cases[i].d, mp_sdpa_backend_str(got), mp_sdpa_backend_str(cases[i].want));
    }
    assert_string_equal(mp_sdpa_backend_str(MP_SDPA_CUDNN), "cudnn");
    assert_string_equal(mp_sdpa_backend_str(MP_SDPA_EFFICIENT), "efficient");
}

/* GPT-2 (12 heads, no mask) at seq 100 in fp16: flash keeps a (1, 12, 100) fp32 logsumexp, 4,800
 * bytes; on a V100 (sm70) torch runs the memory-efficient kernel, rows rounded up to 128: 6,144. */
static uint64_t lse_bytes(int major, int minor, int *backend)
{
    struct mp_model m;
    struct mp_diag d = {{0}};
    if (mp_model_load_file(&m, "models/gpt2-124m.json", &d) != MP_OK)
        fail_msg("load: %s", d.msg);
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 1;
    bo.seq = 100;
    bo.precision = MP_PREC_AMP_FP16;
    bo.cc_major = major;
    bo.cc_minor = minor;
    struct mp_program p;
    if (mp_program_build(&m, &bo, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    uint64_t bytes = 0;
    for (size_t i = 0; i < p.n_nodes && !bytes; i++)
        if (p.nodes[i].prim == MP_P_ATTN) {
            int x = mp_node_extra(&p.nodes[i], MP_XR_LSE, 0);
            if (x >= 0)
                bytes = p.tensors[x].bytes;
        }
    *backend = p.sdpa_backend;
    mp_program_release(&p);
    mp_model_release(&m);
    return bytes;
}

static void test_lse_rounding(void **state)
{
    (void)state;
    int bk = -1;
    assert_true(lse_bytes(8, 0, &bk) == 1 * 12 * 100 * 4);
    assert_int_equal(bk, MP_SDPA_FLASH);
    assert_true(lse_bytes(7, 0, &bk) == 1 * 12 * 128 * 4);
    assert_int_equal(bk, MP_SDPA_EFFICIENT);
    assert_true(lse_bytes(0, 0, &bk) == 1 * 12 * 100 * 4); /* no target: flash's */
    assert_int_equal(bk, MP_SDPA_UNKNOWN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_rules),
        cmocka_unit_test(test_lse_rounding),
    };
    return cmocka_run_group_tests_name("sdpa", tests, NULL, NULL);
}
