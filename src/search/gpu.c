/* gpu.c — reads GPU profiles (configs/gpus/NAME.json).  cJSON stays inside. */
#include "gpu.h"

#include "json/json.h"
#include "model/model.h"
#include "probe/probe.h"
#include "search/nccl.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef MEMPLAN_DATADIR
#define MEMPLAN_DATADIR "/usr/local/share/memplan"
#endif

uint64_t mp_gpu_capacity(const struct mp_gpu *g)
{
    double c = (double)g->memory_bytes * g->usable_fraction;
    return c >= (double)g->memory_bytes ? g->memory_bytes : (uint64_t)c;
}

double mp_gpu_tflops(const struct mp_gpu *g, enum mp_precision p)
{
    switch (p) {
    case MP_PREC_FP32: return g->tflops_tf32 > 0 ? g->tflops_tf32 : g->tflops_fp32;
    case MP_PREC_AMP_BF16:
    case MP_PREC_BF16:
    case MP_PREC_BF16_AMP: return g->tflops_bf16;
    case MP_PREC_AMP_FP16: return g->tflops_fp16;
    }
    return 0;
}

/* "Maximum number of resident threads per SM" by compute capability (CUDA C++ Programming Guide,
 * Compute Capabilities, table of technical specifications). */
static const struct {
    int major, minor;
    unsigned threads;
} SM_THREADS[] = {
    {7, 0, 2048}, {7, 2, 2048}, {7, 5, 1024}, {8, 0, 2048}, {8, 6, 1536}, {8, 7, 1536},
    {8, 9, 1536}, {9, 0, 2048}, {10, 0, 2048}, {10, 3, 2048}, {12, 0, 1536},
};

unsigned mp_cc_sm_threads(int major, int minor)
{
    for (size_t i = 0; i < sizeof SM_THREADS / sizeof SM_THREADS[0]; i++)
        if (SM_THREADS[i].major == major && SM_THREADS[i].minor == minor)
            return SM_THREADS[i].threads;
    return 0;
}

/* What a PyTorch process holds on the device beyond the caching allocator, per compute
 * capability and stack, where a figure was published or measured (docs/memory-facts.md#cuda-context);
 * one row a compute capability. */
static const struct {
    int major, minor;
    uint64_t mib;
    const char *stack, *source;
} CONTEXTS[] = {
    {9, 0, 771, "torch 2.11 + CUDA 13.0", "H200, mem_get_info less reserved at a bf16 step's end, "
                                          "bench/results/gpu-2026-11-28.md"},
    {8, 9, 426, "torch 2.10 + CUDA 13.0", "RTX 6000 Ada, nvidia-smi after mem_get_info made the context, "
                                          "unslothai/unsloth-zoo PR #1053"},
};

uint64_t mp_cc_context_bytes(int major, int minor, const char **stack, const char **source)
{
    for (size_t i = 0; i < sizeof CONTEXTS / sizeof CONTEXTS[0]; i++)
        if (CONTEXTS[i].major == major && CONTEXTS[i].minor == minor) {
            if (stack)
                *stack = CONTEXTS[i].stack;
            if (source)
                *source = CONTEXTS[i].source;
            return CONTEXTS[i].mib << 20;
        }
    return 0;
}

void mp_gpu_from_vram(uint64_t bytes, struct mp_gpu *g)
{
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "vram");
    snprintf(g->description, sizeof g->description, "--vram");
    g->memory_bytes = bytes;
    g->usable_fraction = 1.0;
    g->context_bytes = 500u << 20;
    g->workspace_bytes = 8519680;
    g->pcie_gbs = 16;
    g->ib_gbs = 12.5;
}

/* A profile is read as untrusted as a model file: the same parser (mp_json_parse: RFC 8259,
 * duplicate keys, \u0000, nesting, text after the value refused with file:line:col) and the same
 * field readers (json_field.c); unknown keys are refused as the memplan model reader refuses
 * them (keys starting with "_" or "comment" are ignored). */
#define PROFILE_KEYS                                                                                              \
    "name description memory_mib usable_fraction compute_capability tflops bandwidth_gbs cuda_context_mib "       \
    "cublas_workspace_bytes nvlink_gbs pcie_gbs ib_gbs nccl_overhead_mib nccl_channels sm_count"
#define PROFILE_MIB_MAX (UINT64_C(1) << 30)  /* memory, context, NCCL buffers: at most 1 PiB */
#define PROFILE_BYTES_MAX (UINT64_C(1) << 50) /* the cuBLAS workspace */
#define PROFILE_RATE_MAX 1e6                  /* TFLOP/s and GB/s */
#define PROFILE_SMS_MAX 65536                 /* streaming multiprocessors */

/* A whole number of MiB (at most 1 PiB; positive when required), as bytes; absent: def_mib. */
static enum mp_status read_mib(const cJSON *root, const char *key, bool required, uint64_t def_mib,
                               uint64_t *bytes, const char *path, struct mp_diag *d)
{
    uint64_t mib = def_mib;
    enum mp_status st = mp_json_u64(root, key, required, PROFILE_MIB_MAX, &mib, path, "", d);
    bool present = cJSON_GetObjectItemCaseSensitive(root, key) != NULL;
    if (required && present && ((st == MP_OK && mib == 0) || st == MP_ERR_MODEL))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive integer", path, key);
    if (st != MP_OK)
        return st;
    if (!mp_mul_u64(mib, UINT64_C(1) << 20, bytes))
        return mp_fail(d, MP_ERR_RANGE, "%s: %s: too large", path, key);
    return MP_OK;
}

/* A string of at most cap-1 bytes (non-empty), copied to out; absent leaves out as it is. */
static enum mp_status read_text(const cJSON *root, const char *key, bool required, char *out, size_t cap,
                                const char *path, struct mp_diag *d)
{
    enum mp_status st;
    const char *s = mp_json_str(root, key, &st, path, "", d);
    if (st != MP_OK)
        return st;
    if (!s && required)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: missing (expected a string)", path, key);
    if (!s)
        return MP_OK;
    if (!*s)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a non-empty string", path, key);
    if (strlen(s) >= cap)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: longer than %zu characters", path, key, cap - 1);
    snprintf(out, cap, "%s", s);
    return MP_OK;
}

/* compute_capability: "MAJOR.MINOR", each one or two digits. */
static enum mp_status read_cc(const cJSON *root, struct mp_gpu *g, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    const char *s = mp_json_str(root, "compute_capability", &st, path, "", d);
    if (st != MP_OK || !s)
        return st;
    int major = 0, minor = 0, n = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9' && n < 3; p++, n++)
        major = major * 10 + (*p - '0');
    bool ok = n >= 1 && n <= 2 && *p == '.';
    n = 0;
    for (p += ok; ok && *p >= '0' && *p <= '9' && n < 3; p++, n++)
        minor = minor * 10 + (*p - '0');
    if (!ok || n < 1 || n > 2 || *p)
        return mp_fail(d, MP_ERR_MODEL, "%s: compute_capability: expected a string like \"8.0\"", path);
    g->cc_major = major;
    g->cc_minor = minor;
    return MP_OK;
}

static enum mp_status read_profile(const cJSON *root, struct mp_gpu *g, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    if (!cJSON_IsObject(root))
        return mp_fail(d, MP_ERR_MODEL, "%s: expected a JSON object at the top level", path);
    if ((st = mp_json_check_keys(root, PROFILE_KEYS, "a GPU profile", path, "", d)) != MP_OK ||
        (st = read_text(root, "name", true, g->name, sizeof g->name, path, d)) != MP_OK)
        return st;
    snprintf(g->description, sizeof g->description, "%s", g->name);
    if ((st = read_text(root, "description", false, g->description, sizeof g->description, path, d)) != MP_OK ||
        (st = read_mib(root, "memory_mib", true, 0, &g->memory_bytes, path, d)) != MP_OK)
        return st;
    g->usable_fraction = 1.0;
    if ((st = mp_json_num(root, "usable_fraction", 0, true, 1, &g->usable_fraction, path, "", d)) != MP_OK ||
        (st = read_cc(root, g, path, d)) != MP_OK)
        return st;
    const cJSON *tf = cJSON_GetObjectItemCaseSensitive(root, "tflops");
    if (tf && !cJSON_IsNull(tf)) {
        if (!cJSON_IsObject(tf))
            return mp_fail(d, MP_ERR_MODEL, "%s: tflops: expected an object of dense TFLOP/s (fp32, tf32, bf16, fp16)",
                           path);
        if ((st = mp_json_check_keys(tf, "fp32 tf32 bf16 fp16", "tflops", path, "tflops", d)) != MP_OK ||
            (st = mp_json_num(tf, "fp32", 0, false, PROFILE_RATE_MAX, &g->tflops_fp32, path, "tflops", d)) != MP_OK ||
            (st = mp_json_num(tf, "tf32", 0, false, PROFILE_RATE_MAX, &g->tflops_tf32, path, "tflops", d)) != MP_OK ||
            (st = mp_json_num(tf, "bf16", 0, false, PROFILE_RATE_MAX, &g->tflops_bf16, path, "tflops", d)) != MP_OK ||
            (st = mp_json_num(tf, "fp16", 0, false, PROFILE_RATE_MAX, &g->tflops_fp16, path, "tflops", d)) != MP_OK)
            return st;
    }
    g->workspace_bytes = 8519680;
    g->pcie_gbs = 16;
    g->ib_gbs = 12.5;
    /* no cuda_context_mib: the table's figure for the compute capability, else 500 MiB */
    uint64_t ctx_mib = mp_cc_context_bytes(g->cc_major, g->cc_minor, NULL, NULL) >> 20;
    if (!ctx_mib)
        ctx_mib = 500;
    if ((st = mp_json_num(root, "bandwidth_gbs", 0, false, PROFILE_RATE_MAX, &g->bandwidth_gbs, path, "", d)) !=
            MP_OK ||
        (st = read_mib(root, "cuda_context_mib", false, ctx_mib, &g->context_bytes, path, d)) != MP_OK ||
        (st = mp_json_u64(root, "cublas_workspace_bytes", false, PROFILE_BYTES_MAX, &g->workspace_bytes, path, "",
                          d)) != MP_OK ||
        (st = mp_json_num(root, "nvlink_gbs", 0, false, PROFILE_RATE_MAX, &g->nvlink_gbs, path, "", d)) != MP_OK ||
        (st = mp_json_num(root, "pcie_gbs", 0, true, PROFILE_RATE_MAX, &g->pcie_gbs, path, "", d)) != MP_OK ||
        (st = mp_json_num(root, "ib_gbs", 0, true, PROFILE_RATE_MAX, &g->ib_gbs, path, "", d)) != MP_OK ||
        (st = read_mib(root, "nccl_overhead_mib", false, 0, &g->nccl_overhead_bytes, path, d)) != MP_OK)
        return st;
    if (g->nccl_overhead_bytes > g->memory_bytes)
        return mp_fail(d, MP_ERR_MODEL, "%s: nccl_overhead_mib: more than memory_mib", path);
    uint64_t sms = 0, ch = 0;
    if ((st = mp_json_u64(root, "sm_count", false, PROFILE_SMS_MAX, &sms, path, "", d)) != MP_OK ||
        (st = mp_json_u64(root, "nccl_channels", false, MP_NCCL_MAXCHANNELS, &ch, path, "", d)) != MP_OK)
        return st;
    g->nccl_channels = (unsigned)ch;
    g->sm_count = (unsigned)sms;
    g->sm_threads = mp_cc_sm_threads(g->cc_major, g->cc_minor);
    return MP_OK;
}

static enum mp_status parse_profile(const char *path, const char *text, size_t len, struct mp_gpu *g,
                                    struct mp_diag *d)
{
    memset(g, 0, sizeof *g);
    cJSON *root;
    enum mp_status st = mp_json_parse(text, len, path, &root, d);
    if (st != MP_OK)
        return st;
    st = read_profile(root, g, path, d);
    cJSON_Delete(root);
    if (st != MP_OK)
        memset(g, 0, sizeof *g);
    return st;
}

static enum mp_status load_path(const char *path, struct mp_gpu *g, struct mp_diag *d)
{
    char *buf;
    size_t n;
    enum mp_status st = mp_read_file(path, 65536, "a GPU profile", &buf, &n, d);
    if (st != MP_OK)
        return st;
    st = parse_profile(path, buf, n, g, d);
    free(buf);
    return st;
}

#define MAX_DIRS 5

/* Candidate directories, in order: $MEMPLAN_GPUS, ./configs/gpus, then next to the
 * binary (a build tree's configs/gpus, an installed tree's ../share/memplan/gpus),
 * then the compiled-in data directory. */
static size_t profile_dirs(const char *argv0, char dirs[][512], size_t max)
{
    size_t n = 0;
    const char *env = getenv("MEMPLAN_GPUS");
    if (env && *env && n < max)
        snprintf(dirs[n++], 512, "%s", env);
    if (n < max)
        snprintf(dirs[n++], 512, "configs/gpus");
    char exe[400] = "";
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (l > 0 && (size_t)l < sizeof exe - 1)
        exe[l] = 0;
    else if (argv0 && strchr(argv0, '/'))
        snprintf(exe, sizeof exe, "%s", argv0);
    else
        exe[0] = 0;
    const char *slash = strrchr(exe, '/');
    if (slash && n + 2 <= max) {
        int dl = (int)(slash - exe);
        snprintf(dirs[n++], 512, "%.*s/configs/gpus", dl, exe);
        snprintf(dirs[n++], 512, "%.*s/../share/memplan/gpus", dl, exe);
    }
    if (n < max)
        snprintf(dirs[n++], 512, "%s/gpus", MEMPLAN_DATADIR);
    return n;
}

enum mp_status mp_gpu_load(const char *name, const char *argv0, struct mp_gpu *g, struct mp_diag *d)
{
    size_t len = strlen(name);
    struct stat sb;
    if (strchr(name, '/') || (len > 5 && strcmp(name + len - 5, ".json") == 0 && stat(name, &sb) == 0))
        return load_path(name, g, d); /* a profile file given by its path */
    char lower[64];
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == '.') || len >= sizeof lower) /* (a longer name would be looked up cut) */
            return mp_fail(d, MP_ERR_USAGE, "--gpu: '%s' is not a profile name", name);
    char dirs[MAX_DIRS][512];
    size_t nd = profile_dirs(argv0, dirs, MAX_DIRS);
    snprintf(lower, sizeof lower, "%s", name);
    for (char *c = lower; *c; c++)
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c - 'A' + 'a');
    for (size_t i = 0; i < nd; i++) {
        char path[700];
        snprintf(path, sizeof path, "%s/%s.json", dirs[i], lower);
        if (stat(path, &sb) == 0)
            return load_path(path, g, d);
    }
    return mp_fail(d, MP_ERR_USAGE, "--gpu: no profile '%s' (looked in $MEMPLAN_GPUS, configs/gpus; "
                                    "list them with 'memplan help gpus')",
                   name);
}

static int cmp_mem(const void *a, const void *b)
{
    const struct mp_gpu *x = a, *y = b;
    if (x->memory_bytes != y->memory_bytes)
        return x->memory_bytes < y->memory_bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

enum mp_status mp_gpu_list(const char *argv0, struct mp_gpu **out, size_t *n, struct mp_diag *d)
{
    char dirs[MAX_DIRS][512];
    size_t nd = profile_dirs(argv0, dirs, MAX_DIRS);
    *out = NULL;
    *n = 0;
    for (size_t i = 0; i < nd; i++) {
        DIR *dir = opendir(dirs[i]);
        if (!dir)
            continue;
        size_t cap = 0;
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            size_t l = strlen(e->d_name);
            if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0)
                continue;
            if (*n == cap) {
                cap = cap ? cap * 2 : 16;
                struct mp_gpu *ng = realloc(*out, cap * sizeof *ng);
                if (!ng) {
                    closedir(dir);
                    return mp_fail(d, MP_ERR_NOMEM, "out of memory");
                }
                *out = ng;
            }
            char path[800];
            snprintf(path, sizeof path, "%s/%s", dirs[i], e->d_name);
            enum mp_status st = load_path(path, &(*out)[*n], d);
            if (st != MP_OK) { /* a broken or non-regular profile is an error, not a silent gap */
                closedir(dir);
                free(*out);
                *out = NULL;
                *n = 0;
                return st;
            }
            (*n)++;
        }
        closedir(dir);
        if (*n)
            break; /* the first directory that has profiles wins */
    }
    if (*n)
        qsort(*out, *n, sizeof **out, cmp_mem);
    return MP_OK;
}

enum mp_status mp_gpu_from_device(int device, struct mp_gpu *g, struct mp_diag *d)
{
    if (!mp_cuda_built())
        return mp_fail(d, MP_ERR_UNSUPPORTED, "the cuda backend is not built in");
    if (!mp_cuda_device_available())
        return mp_fail(d, MP_ERR_DEVICE, "none found");
    struct mp_probe *p = NULL;
    struct mp_probe_opts po;
    mp_probe_opts_default(&po);
    po.backend = "cuda";
    po.device = device;
    struct mp_device_info di;
    enum mp_status st = mp_probe_open(&p, &po, d);
    if (st == MP_OK && (st = mp_probe_device_info(p, &di)) != MP_OK)
        mp_fail(d, st, "device %d: no device information", device);
    mp_probe_close(p);
    if (st != MP_OK)
        return st;
    mp_gpu_from_vram(di.total_bytes, g);
    snprintf(g->name, sizeof g->name, "cuda:%d", device);
    snprintf(g->description, sizeof g->description, "%s", di.name);
    g->cc_major = di.cc_major;
    g->cc_minor = di.cc_minor;
    /* The context: the table's figure for its compute capability (else 500 MiB), or what the
     * device has in use with memplan's own context open (other processes' memory included:
     * the job cannot have it either) where that is more. */
    uint64_t ctx = mp_cc_context_bytes(di.cc_major, di.cc_minor, NULL, NULL);
    if (ctx)
        g->context_bytes = ctx;
    if (di.total_bytes > di.free_bytes && di.total_bytes - di.free_bytes > g->context_bytes)
        g->context_bytes = di.total_bytes - di.free_bytes;
    g->sm_count = di.sm_count;
    g->sm_threads = di.sm_threads;
    return MP_OK;
}
