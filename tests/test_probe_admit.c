/* test_probe_admit.c — which models the host backend takes (probe.c mp_probe_host_admit). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "ir/layers.h"
#include "probe/probe.h"

static enum mp_status admit(const char *path, uint64_t capacity, bool automatic, struct mp_diag *d)
{
    struct mp_model m;
    assert_int_equal(mp_model_load_file(&m, path, d), MP_OK);
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = 1;
    struct mp_program p;
    assert_int_equal(mp_program_build(&m, &o, &p, d), MP_OK);
    struct mp_train_opts t;
    mp_train_opts_default(&t);
    enum mp_status st = mp_probe_host_admit(&p, &t, capacity, automatic, d);
    mp_program_release(&p);
    mp_model_release(&m);
    return st;
}

/* A tiny model runs on the CPU, chosen automatically or not. */
static void test_admit_tiny(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(admit("models/tiny-test.json", 0, true, &d), MP_OK);
    assert_int_equal(admit("models/tiny-test.json", 0, false, &d), MP_OK);
}

/* GPT-2 124M at seq 1024 is about 0.8 TFLOP a step: too slow for an automatic host probe. */
static void test_admit_gpt2_auto_refused(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(admit("models/gpt2-124m.json", 0, true, &d), MP_ERR_DEVICE);
    assert_non_null(strstr(d.msg, "too large for the host backend"));
}

/* Llama-70B needs over a TiB: refused by RAM unless a capacity limits the pool. */
static void test_admit_ram(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(admit("models/llama-70b.json", 0, false, &d), MP_ERR_DEVICE);
    assert_non_null(strstr(d.msg, "of RAM for llama-70b"));
    assert_int_equal(admit("models/llama-70b.json", 1ull << 20, false, &d), MP_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_admit_tiny),
        cmocka_unit_test(test_admit_gpt2_auto_refused),
        cmocka_unit_test(test_admit_ram),
    };
    return cmocka_run_group_tests_name("probe_admit", tests, NULL, NULL);
}
