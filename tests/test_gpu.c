/* test_gpu.c — targets: GPU profiles read as untrusted input (gpu.c mp_gpu_load, with the
 * model files' parser and field readers), and the local device as a target (mp_gpu_from_device). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "search/gpu.h"
#include "probe/probe.h"

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

/* ---- profiles -------------------------------------------------------------------------- */

static char dir[64];

static int make_dir(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/memplan-gpu-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_dir(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/p.json", dir);
    unlink(path);
    return rmdir(dir);
}

/* Writes text as dir/p.json and loads it; the path in *path. */
static enum mp_status load_text(const char *text, struct mp_gpu *g, struct mp_diag *d, char *path, size_t cap)
{
    snprintf(path, cap, "%s/p.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    memset(d, 0, sizeof *d);
    return mp_gpu_load(path, "memplan", g, d);
}

#define BASE "\"name\": \"x\", \"memory_mib\": 1024"

/* Every field type- and range-checked, the JSON held to RFC 8259: one message naming the file
 * and the place, and nothing loaded.  Lines and columns counted by hand. */
static void test_profile_refused(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        enum mp_status st;
        const char *msg; /* after the path */
    } cases[] = {
        /* a negative size was converted to a huge unsigned number (undefined behaviour) */
        {"{" BASE ", \"cuda_context_mib\": -600}", MP_ERR_MODEL, ": cuda_context_mib: expected a non-negative integer"},
        {"{" BASE ", \"cublas_workspace_bytes\": -5}", MP_ERR_MODEL,
         ": cublas_workspace_bytes: expected a non-negative integer"},
        {"{" BASE ", \"cublas_workspace_bytes\": 1.5}", MP_ERR_MODEL,
         ": cublas_workspace_bytes: expected a non-negative integer"},
        {"{" BASE ", \"cuda_context_mib\": \"500\"}", MP_ERR_MODEL, ": cuda_context_mib: expected a non-negative integer"},
        {"{" BASE ", \"nccl_overhead_mib\": 1e300}", MP_ERR_RANGE,
         ": nccl_overhead_mib: 1e+300 is too large (at most 1073741824)"},
        {"{" BASE ", \"nccl_overhead_mib\": 2048}", MP_ERR_MODEL, ": nccl_overhead_mib: more than memory_mib"},
        {"{" BASE ", \"nccl_channels\": 65}", MP_ERR_RANGE, ": nccl_channels: 65 is too large (at most 64)"}, /* NCCL's MAXCHANNELS 64 */
        {"{" BASE ", \"nccl_channels\": 1.5}", MP_ERR_MODEL, ": nccl_channels: expected a non-negative integer"},
        /* memory_mib 1e-9 was 0 bytes, and suggest's report read a null profile */
        {"{\"name\": \"x\", \"memory_mib\": 1e-9}", MP_ERR_MODEL, ": memory_mib: expected a positive integer"},
        {"{\"name\": \"x\", \"memory_mib\": 0}", MP_ERR_MODEL, ": memory_mib: expected a positive integer"},
        {"{\"name\": \"x\", \"memory_mib\": -1}", MP_ERR_MODEL, ": memory_mib: expected a positive integer"},
        {"{\"name\": \"x\", \"memory_mib\": 2e9}", MP_ERR_RANGE,
         ": memory_mib: 2000000000 is too large (at most 1073741824)"},
        {"{\"name\": \"x\"}", MP_ERR_MODEL, ": memory_mib: missing (expected a positive integer)"},
        {"{\"memory_mib\": 1024}", MP_ERR_MODEL, ": name: missing (expected a string)"},
        {"{\"name\": \"\", \"memory_mib\": 1024}", MP_ERR_MODEL, ": name: expected a non-empty string"},
        {"{\"name\": 7, \"memory_mib\": 1024}", MP_ERR_MODEL, ": name: expected a string"},
        {"{\"name\": \"0123456789012345678901234567890123456789012345678901234567890123\", \"memory_mib\": 1}",
         MP_ERR_MODEL, ": name: longer than 63 characters"},
        {"{" BASE ", \"usable_fraction\": 0}", MP_ERR_MODEL, ": usable_fraction: expected a number in (0, 1]"},
        {"{" BASE ", \"usable_fraction\": 1.01}", MP_ERR_MODEL, ": usable_fraction: expected a number in (0, 1]"},
        {"{" BASE ", \"bandwidth_gbs\": \"fast\"}", MP_ERR_MODEL, ": bandwidth_gbs: expected a number in [0, 1000000]"},
        {"{" BASE ", \"bandwidth_gbs\": 1e999}", MP_ERR_MODEL, ": bandwidth_gbs: expected a number in [0, 1000000]"},
        {"{" BASE ", \"pcie_gbs\": 0}", MP_ERR_MODEL, ": pcie_gbs: expected a number in (0, 1000000]"},
        {"{" BASE ", \"nvlink_gbs\": -1}", MP_ERR_MODEL, ": nvlink_gbs: expected a number in [0, 1000000]"},
        {"{" BASE ", \"tflops\": 312}", MP_ERR_MODEL,
         ": tflops: expected an object of dense TFLOP/s (fp32, tf32, bf16, fp16)"},
        {"{" BASE ", \"tflops\": {\"bf16\": -1}}", MP_ERR_MODEL, ": tflops.bf16: expected a number in [0, 1000000]"},
        {"{" BASE ", \"tflops\": {\"bf61\": 1}}", MP_ERR_MODEL,
         ": tflops.bf61: unknown key for tflops (did you mean \"bf16\"?)"},
        {"{" BASE ", \"compute_capability\": 8.0}", MP_ERR_MODEL, ": compute_capability: expected a string"},
        {"{" BASE ", \"compute_capability\": \"8\"}", MP_ERR_MODEL,
         ": compute_capability: expected a string like \"8.0\""},
        {"{" BASE ", \"compute_capability\": \"8.0x\"}", MP_ERR_MODEL,
         ": compute_capability: expected a string like \"8.0\""},
        /* unknown keys as the memplan model reader has them */
        {"{" BASE ", \"bandwith_gbs\": 100}", MP_ERR_MODEL,
         ": bandwith_gbs: unknown key for a GPU profile (did you mean \"bandwidth_gbs\"?)"},
        {"{" BASE ", \"hbm\": 3}", MP_ERR_MODEL, ": hbm: unknown key for a GPU profile"},
        /* the JSON text: duplicates, trailing text, malformed text, \u0000, nesting */
        {"{" BASE ", \"memory_mib\": 81920}", MP_ERR_MODEL, ": memory_mib: duplicate key"},
        {"{" BASE ", \"tflops\": {\"bf16\": 1, \"bf16\": 2}}", MP_ERR_MODEL, ": tflops.bf16: duplicate key"},
        {"{" BASE "} x", MP_ERR_JSON, ":1:35: unexpected text after the JSON value"},
        {"{" BASE "}\n{}", MP_ERR_JSON, ":2:1: unexpected text after the JSON value"},
        {"{\"name\": \"x\",\n\"memory_mib\": 01024}", MP_ERR_JSON, ":2:15: malformed JSON: a number with a leading zero"},
        {"{" BASE ", \"description\": \"a\\u0000b\"}", MP_ERR_JSON,
         ":1:52: a \\u0000 (NUL) escape in a string is not supported"},
        {"[1]", MP_ERR_MODEL, ": expected a JSON object at the top level"},
        {"", MP_ERR_JSON, ": the file is empty"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct mp_gpu g;
        struct mp_diag d;
        char path[128], want[400];
        enum mp_status st = load_text(cases[i].text, &g, &d, path, sizeof path);
        snprintf(want, sizeof want, "%s%s", path, cases[i].msg);
        if (st != cases[i].st || strcmp(d.msg, want) != 0)
            print_error("profile: %s\nexpected %s: %s\ngot      %s: %s\n", cases[i].text, mp_status_str(cases[i].st),
                        want, mp_status_str(st), d.msg);
        assert_int_equal(st, cases[i].st);
        assert_string_equal(d.msg, want);
        assert_int_equal(g.memory_bytes, 0);
    }
    /* a malformed profile says where: line 2, after the second comma */
    struct mp_gpu g;
    struct mp_diag d;
    char path[128];
    assert_int_equal(load_text("{\"name\": \"x\",\n \"memory_mib\": 1024,,}", &g, &d, path, sizeof path), MP_ERR_JSON);
    assert_true(strncmp(d.msg + strlen(path), ":2:", 3) == 0);
    assert_non_null(strstr(d.msg, ": malformed JSON"));
    /* nesting beyond 1000 levels */
    char deep[2100] = "{\"_x\": ";
    size_t n = strlen(deep);
    for (int i = 0; i < 1000; i++)
        deep[n++] = '[';
    deep[n] = '\0';
    assert_int_equal(load_text(deep, &g, &d, path, sizeof path), MP_ERR_JSON);
    char want[200];
    snprintf(want, sizeof want, "%s:1:1007: nested deeper than 1000 levels", path);
    assert_string_equal(d.msg, want);
}

/* Values: MiB are whole, converted to bytes exactly; absent fields take the documented defaults
 * (memplan(1), GPU PROFILES); "_" and "comment" keys are ignored. */
static void test_profile_values(void **state)
{
    (void)state;
    struct mp_gpu g;
    struct mp_diag d;
    char path[128];
    assert_int_equal(load_text("{\"name\": \"big\", \"memory_mib\": 1073741824, \"cuda_context_mib\": 300,"
                               " \"nccl_overhead_mib\": 64, \"nccl_channels\": 24, \"cublas_workspace_bytes\": 33554432,"
                               " \"usable_fraction\": 0.9, \"compute_capability\": \"12.10\","
                               " \"tflops\": {\"fp32\": 1.5, \"tf32\": 0, \"bf16\": 2, \"fp16\": null},"
                               " \"nvlink_gbs\": 0, \"pcie_gbs\": 64, \"ib_gbs\": 50, \"bandwidth_gbs\": 3350,"
                               " \"_sources\": {\"any\": [1]}, \"comment\": 1}",
                               &g, &d, path, sizeof path),
                     MP_OK);
    assert_string_equal(g.name, "big");
    assert_string_equal(g.description, "big");
    assert_true(g.memory_bytes == UINT64_C(1) << 50); /* 2^30 MiB */
    assert_true(g.context_bytes == UINT64_C(300) * 1048576);
    assert_true(g.nccl_overhead_bytes == UINT64_C(64) * 1048576);
    assert_int_equal(g.nccl_channels, 24);
    assert_true(g.workspace_bytes == UINT64_C(33554432));
    assert_true(g.usable_fraction == 0.9);
    assert_int_equal(g.cc_major, 12);
    assert_int_equal(g.cc_minor, 10);
    assert_true(g.tflops_fp32 == 1.5 && g.tflops_tf32 == 0 && g.tflops_bf16 == 2 && g.tflops_fp16 == 0);
    assert_true(g.nvlink_gbs == 0 && g.pcie_gbs == 64 && g.ib_gbs == 50 && g.bandwidth_gbs == 3350);

    assert_int_equal(load_text("{\"name\": \"small\", \"description\": \"a card\", \"memory_mib\": 1}", &g, &d, path,
                               sizeof path),
                     MP_OK);
    assert_string_equal(g.description, "a card");
    assert_true(g.memory_bytes == 1048576);
    assert_true(g.context_bytes == UINT64_C(500) * 1048576);
    assert_true(g.workspace_bytes == 8519680);
    assert_true(g.usable_fraction == 1.0 && g.pcie_gbs == 16 && g.ib_gbs == 12.5 && g.nvlink_gbs == 0);
    assert_true(g.nccl_overhead_bytes == 0 && g.cc_major == 0 && g.nccl_channels == 0);
}

/* The context table (docs/memory-facts.md#cuda-context): sm90 771 MiB (H200, torch 2.11 + CUDA
 * 13.0, at a step's end), sm89 426 MiB (RTX 6000 Ada, torch 2.10 + CUDA 13.0); a profile without
 * cuda_context_mib takes its compute capability's row, else 500 MiB; its own figure wins. */
static void test_context_table(void **state)
{
    (void)state;
    const char *stack = NULL, *source = NULL;
    assert_true(mp_cc_context_bytes(9, 0, &stack, &source) == UINT64_C(771) * 1048576);
    assert_string_equal(stack, "torch 2.11 + CUDA 13.0");
    assert_non_null(strstr(source, "gpu-2026-11-28.md"));
    assert_true(mp_cc_context_bytes(8, 9, NULL, NULL) == UINT64_C(426) * 1048576);
    assert_true(mp_cc_context_bytes(8, 0, NULL, NULL) == 0);
    struct mp_gpu g;
    struct mp_diag d;
    char path[128];
    static const struct {
        const char *text;
        uint64_t mib;
    } cases[] = {
        {"{\"name\": \"a\", \"memory_mib\": 1024, \"compute_capability\": \"9.0\"}", 771},
        {"{\"name\": \"a\", \"memory_mib\": 1024, \"compute_capability\": \"8.9\"}", 426},
        {"{\"name\": \"a\", \"memory_mib\": 1024, \"compute_capability\": \"8.0\"}", 500},
        {"{\"name\": \"a\", \"memory_mib\": 1024}", 500},
        {"{\"name\": \"a\", \"memory_mib\": 1024, \"compute_capability\": \"9.0\", \"cuda_context_mib\": 300}", 300},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(load_text(cases[i].text, &g, &d, path, sizeof path), MP_OK);
        assert_true(g.context_bytes == cases[i].mib * 1048576);
    }
}

/* The bundled profiles all load (help gpus lists them); a100-80gb as its file says. */
static void test_profile_bundled(void **state)
{
    (void)state;
    struct mp_gpu *gs;
    size_t n;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_gpu_list("memplan", &gs, &n, &d), MP_OK);
    assert_true(n >= 12);
    free(gs);
    struct mp_gpu g;
    assert_int_equal(mp_gpu_load("a100-80gb", "memplan", &g, &d), MP_OK);
    assert_true(g.memory_bytes == UINT64_C(81920) * 1048576);
    assert_true(g.context_bytes == UINT64_C(500) * 1048576);
    assert_true(g.workspace_bytes == 8519680);
    assert_int_equal(g.cc_major, 8);
    assert_int_equal(g.cc_minor, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_profile_refused, make_dir, remove_dir),
        cmocka_unit_test_setup_teardown(test_profile_values, make_dir, remove_dir),
        cmocka_unit_test(test_profile_bundled),
        cmocka_unit_test_setup_teardown(test_context_table, make_dir, remove_dir),
        cmocka_unit_test(test_from_device_without_one),
        cmocka_unit_test(test_from_device_with_one),
    };
    return cmocka_run_group_tests_name("gpu", tests, NULL, NULL);
}
