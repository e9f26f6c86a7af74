/* test_gpu.c — targets: the local device as a target (gpu.c mp_gpu_from_device). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "gpu.h"
#include "probe.h"

/* Without a usable device the target is refused and left as it was. */
static void test_from_device_without_one(void **state)
{
    (void)state;
    if (mp_cuda_device_available())
        skip();
    struct mp_gpu g;
    memset(&g, 0x5a, sizeof g);
    struct mp_gpu before = g;
    struct mp_diag d = {{0}};
    enum mp_status st = mp_gpu_from_device(0, &g, &d);
    assert_true(st == MP_ERR_DEVICE || st == MP_ERR_UNSUPPORTED);
    assert_true(d.msg[0] != 0);
    assert_memory_equal(&g, &before, sizeof g);
}

/* With one: its whole memory, named cuda:N, described by the device's name. */
static void test_from_device_with_one(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    struct mp_gpu g;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_gpu_from_device(0, &g, &d), MP_OK);
    assert_string_equal(g.name, "cuda:0");
    assert_true(g.memory_bytes > (1ull << 30));
    assert_true(g.description[0] != 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_from_device_without_one),
        cmocka_unit_test(test_from_device_with_one),
    };
    return cmocka_run_group_tests_name("gpu", tests, NULL, NULL);
}
