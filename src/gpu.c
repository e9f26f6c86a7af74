/* gpu.c — reads GPU profiles (configs/gpus/NAME.json).  cJSON stays inside. */
#include "gpu.h"

#include "probe.h" /* the local device */

#include <cjson/cJSON.h>
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
    case MP_PREC_BF16: return g->tflops_bf16;
    case MP_PREC_AMP_FP16: return g->tflops_fp16;
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

static double num(const cJSON *o, const char *k, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

static enum mp_status parse_profile(const char *path, const char *text, size_t len, struct mp_gpu *g,
                                    struct mp_diag *d)
{
    memset(g, 0, sizeof *g);
    if (mp_json_leading_zero(text, len) >= 0)
        return mp_fail(d, MP_ERR_JSON, "%s: malformed JSON: a number with a leading zero", path);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root)
        return mp_fail(d, MP_ERR_JSON, "%s: malformed JSON", path);
    enum mp_status st = MP_OK;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *mem = cJSON_GetObjectItemCaseSensitive(root, "memory_mib");
    const cJSON *tf = cJSON_GetObjectItemCaseSensitive(root, "tflops");
    if (!cJSON_IsString(name)) {
        st = mp_fail(d, MP_ERR_MODEL, "%s: name: expected a string", path);
    } else if (!cJSON_IsNumber(mem) || mem->valuedouble <= 0 || mem->valuedouble > 1e9) {
        st = mp_fail(d, MP_ERR_MODEL, "%s: memory_mib: expected a positive number", path);
    } else {
        snprintf(g->name, sizeof g->name, "%s", name->valuestring);
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(root, "description");
        snprintf(g->description, sizeof g->description, "%s", cJSON_IsString(desc) ? desc->valuestring : g->name);
        g->memory_bytes = (uint64_t)(mem->valuedouble * 1048576.0);
        g->usable_fraction = num(root, "usable_fraction", 1.0);
        if (!(g->usable_fraction > 0 && g->usable_fraction <= 1))
            st = mp_fail(d, MP_ERR_MODEL, "%s: usable_fraction: expected a number in (0, 1]", path);
        g->tflops_fp32 = num(tf, "fp32", 0);
        g->tflops_tf32 = num(tf, "tf32", 0);
        g->tflops_bf16 = num(tf, "bf16", 0);
        g->tflops_fp16 = num(tf, "fp16", 0);
        g->bandwidth_gbs = num(root, "bandwidth_gbs", 0);
        g->context_bytes = (uint64_t)(num(root, "cuda_context_mib", 500) * 1048576.0);
        g->workspace_bytes = (uint64_t)num(root, "cublas_workspace_bytes", 8519680);
        g->nvlink_gbs = num(root, "nvlink_gbs", 0);
        g->pcie_gbs = num(root, "pcie_gbs", 16);
        g->ib_gbs = num(root, "ib_gbs", 12.5);
        g->nccl_overhead_bytes = (uint64_t)(num(root, "nccl_overhead_mib", 0) * 1048576.0);
        if (g->nvlink_gbs < 0 || g->pcie_gbs <= 0 || g->ib_gbs <= 0 || g->nccl_overhead_bytes > g->memory_bytes)
            st = mp_fail(d, MP_ERR_MODEL, "%s: nvlink_gbs/pcie_gbs/ib_gbs/nccl_overhead_mib: out of range", path);
        const cJSON *cc = cJSON_GetObjectItemCaseSensitive(root, "compute_capability");
        if (cJSON_IsString(cc))
            sscanf(cc->valuestring, "%d.%d", &g->cc_major, &g->cc_minor);
    }
    cJSON_Delete(root);
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
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == '.'))
            return mp_fail(d, MP_ERR_USAGE, "--gpu: '%s' is not a profile name", name);
    char dirs[MAX_DIRS][512];
    size_t nd = profile_dirs(argv0, dirs, MAX_DIRS);
    char lower[64];
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
    return MP_OK;
}
