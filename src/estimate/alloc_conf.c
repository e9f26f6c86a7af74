/* alloc_conf.c — PYTORCH_CUDA_ALLOC_CONF: the caching allocator's settings (estimate.h).
 *
 * Facts from torch 2.15 (installed headers c10/core/AllocatorConfig.h, c10/cuda/
 * CUDAAllocatorConfig.h; pytorch c10/core/AllocatorConfig.cpp, AcceleratorAllocatorConfig::parseArgs
 * and its parse* functions; c10/cuda/CUDAAllocatorConfig.cpp, CUDAAllocatorConfig::parseArgs):
 * - ConfigTokenizer: tokens split at ',', ':', '[' and ']', whitespace dropped; "key:value"
 *   pairs separated by ','; an unknown key is an error ("Unrecognized key").
 * - max_split_size_mb, max_non_split_rounding_mb: integers >= 20 (kLargeBuffer / kMB).
 * - large_segment_size_mb: integer > 10 (kMinLargeAlloc / kMB), default 20 MiB.
 * - garbage_collection_threshold: in (0, 1).
 * - roundup_power2_divisions: a power of 2 for every interval, or [MB:div,...,>:div] (MB a power
 *   of 2; the first entry also fills the intervals below it; ">" fills those after the last).
 * - expandable_segments: True or False.
 * - per_process_memory_fraction: the device memory fraction (set_per_process_memory_fraction).
 * - backend: native or cudaMallocAsync (a different allocator: refused here, not modelled).
 * The other keys (pinned host memory, locking, IPC, the expandable reserve of virtual addresses,
 * throwing on OOM) change no device bytes: accepted, with their value checked for syntax only. */
#include "replay.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (UINT64_C(1) << 20)

void mp_alloc_conf_default(struct mp_alloc_conf *c)
{
    memset(c, 0, sizeof *c);
    c->max_split_size = UINT64_MAX;
    c->max_non_split_rounding = 20 * MIB; /* kLargeBuffer (AllocatorConfig constructor) */
    c->large_segment_size = 20 * MIB;     /* large_segment_size_{20971520} */
}

/* Keys with no effect on device bytes (CUDAAllocatorConfig::getKeys, AcceleratorAllocatorConfig). */
static const char *const no_device_effect[] = {
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_max_round_threshold", "pinned_max_cached_size", "pinned_reserve_segment_size_mb",
    "pinned_free_catch_all", "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom",
    "expandable_segments_reserve", "expandable_segments_reserve_by_class",
};

#define MAX_TOK 128

struct toks {
    char t[MAX_TOK][48];
    size_t n;
};

static bool lex(const char *s, struct toks *k)
{
    k->n = 0;
    size_t len = 0;
    for (const char *p = s;; p++) {
        bool sep = *p == ',' || *p == ':' || *p == '[' || *p == ']' || *p == 0;
        if (sep || isspace((unsigned char)*p)) {
            if (len) {
                if (k->n == MAX_TOK)
                    return false;
                k->t[k->n++][len] = 0;
                len = 0;
            }
            if (!*p)
                return true;
            if (sep) {
                if (k->n == MAX_TOK)
                    return false;
                k->t[k->n][0] = *p;
                k->t[k->n++][1] = 0;
            }
            continue;
        }
        if (k->n == MAX_TOK || len + 1 >= sizeof k->t[0])
            return false;
        k->t[k->n][len++] = *p;
    }
}

static bool is(const struct toks *k, size_t i, const char *v) { return i < k->n && !strcmp(k->t[i], v); }

static bool to_u64(const struct toks *k, size_t i, uint64_t *v)
{
    if (i >= k->n || !isdigit((unsigned char)k->t[i][0]))
        return false;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(k->t[i], &end, 10);
    if (*end || errno)
        return false;
    *v = x;
    return true;
}

static bool to_double(const struct toks *k, size_t i, double *v)
{
    if (i >= k->n)
        return false;
    char *end;
    errno = 0;
    *v = strtod(k->t[i], &end);
    return !*end && !errno && end != k->t[i] && isfinite(*v);
}

static bool pow2(uint64_t v) { return v && !(v & (v - 1)); }

static unsigned log2u(uint64_t v) /* v > 0 */
{
    return 63u - (unsigned)__builtin_clzll(v);
}

/* MB value >= lo (>= or > per strict), into bytes */
static bool mb_value(const struct toks *k, size_t i, uint64_t lo, bool strict, uint64_t *bytes)
{
    uint64_t v;
    if (!to_u64(k, i, &v) || (strict ? v <= lo : v < lo))
        return false;
    *bytes = v > UINT64_MAX / MIB ? UINT64_MAX / MIB * MIB : v * MIB; /* (clamped as torch does) */
    return true;
}

/* roundup_power2_divisions' value from token i; returns the last token used, 0 on an error */
static size_t pow2_value(const struct toks *k, size_t i, struct mp_alloc_conf *c)
{
    uint64_t v;
    if (!is(k, i, "[")) {
        if (!to_u64(k, i, &v) || !pow2(v))
            return 0;
        for (size_t j = 0; j < MP_ALLOC_POW2_INTERVALS; j++)
            c->pow2_div[j] = (uint32_t)v;
        return i;
    }
    bool first = true;
    size_t last = 0;
    for (i++; i < k->n && !is(k, i, "]"); i++) {
        size_t key = i;
        if (!is(k, i + 1, ":") || !to_u64(k, i + 2, &v) || (v && !pow2(v)) || v > UINT32_MAX)
            return 0;
        i += 2;
        if (is(k, key, ">")) {
            for (size_t j = last; j < MP_ALLOC_POW2_INTERVALS; j++)
                c->pow2_div[j] = (uint32_t)v;
        } else {
            uint64_t mb;
            if (!to_u64(k, key, &mb) || !pow2(mb))
                return 0;
            size_t idx = log2u(mb);
            if (idx > MP_ALLOC_POW2_INTERVALS - 1)
                idx = MP_ALLOC_POW2_INTERVALS - 1;
            if (first)
                for (size_t j = 0; j < idx; j++)
                    c->pow2_div[j] = (uint32_t)v;
            first = false;
            c->pow2_div[idx] = (uint32_t)v;
            last = idx;
        }
        if (!is(k, i + 1, "]") && !is(k, ++i, ","))
            return 0;
    }
    return i < k->n ? i : 0;
}

enum mp_status mp_alloc_conf_parse(const char *s, const char *what, struct mp_alloc_conf *c, struct mp_diag *d)
{
    struct toks *k = malloc(sizeof *k);
    if (!k)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    enum mp_status st = MP_OK;
    if (!lex(s, k)) {
        st = mp_fail(d, MP_ERR_USAGE, "%s: too long or a token over 47 characters", what);
        goto out;
    }
    for (size_t i = 0; i < k->n; i++) {
        const char *key = k->t[i];
        if (!is(k, i + 1, ":")) {
            st = mp_fail(d, MP_ERR_USAGE, "%s: %s: expected ':' and a value", what, key);
            goto out;
        }
        size_t v = i + 2;
        bool ok = true;
        if (!strcmp(key, "max_split_size_mb"))
            ok = mb_value(k, v, 20, false, &c->max_split_size);
        else if (!strcmp(key, "max_non_split_rounding_mb"))
            ok = mb_value(k, v, 20, false, &c->max_non_split_rounding);
        else if (!strcmp(key, "large_segment_size_mb"))
            ok = mb_value(k, v, 10, true, &c->large_segment_size);
        else if (!strcmp(key, "garbage_collection_threshold"))
            ok = to_double(k, v, &c->gc_threshold) && c->gc_threshold > 0 && c->gc_threshold < 1;
        else if (!strcmp(key, "per_process_memory_fraction"))
            ok = to_double(k, v, &c->memory_fraction) && c->memory_fraction > 0 && c->memory_fraction <= 1;
        else if (!strcmp(key, "expandable_segments")) {
            ok = is(k, v, "True") || is(k, v, "False");
            c->expandable = is(k, v, "True");
        } else if (!strcmp(key, "roundup_power2_divisions")) {
            size_t e = pow2_value(k, v, c);
            ok = e != 0;
            v = e;
        } else if (!strcmp(key, "backend")) {
            if (is(k, v, "cudaMallocAsync")) {
                st = mp_fail(d, MP_ERR_USAGE, "%s: backend:cudaMallocAsync: memplan models the native caching "
                             "allocator only", what);
                goto out;
            }
            ok = is(k, v, "native");
        } else {
            bool known = false;
            for (size_t j = 0; j < sizeof no_device_effect / sizeof *no_device_effect; j++)
                known = known || !strcmp(key, no_device_effect[j]);
            if (!known) {
                st = mp_fail(d, MP_ERR_USAGE, "%s: unknown key '%s' (torch 2.15's allocator refuses it too)", what,
                             key);
                goto out;
            }
            if (is(k, v, "[")) { /* a list: skip to its end */
                while (v < k->n && !is(k, v, "]"))
                    v++;
            }
            ok = v < k->n && !is(k, v, ",") && !is(k, v, ":");
        }
        if (!ok) {
            st = mp_fail(d, MP_ERR_USAGE, "%s: %s: bad value%s%s", what, key, v < k->n ? " at " : "",
                         v < k->n ? k->t[v] : "");
            goto out;
        }
        i = v;
        if (i + 1 < k->n && !is(k, ++i, ",")) {
            st = mp_fail(d, MP_ERR_USAGE, "%s: %s: expected ',' before '%s'", what, key, k->t[i]);
            goto out;
        }
        if (is(k, i, ",") && i + 1 == k->n) {
            st = mp_fail(d, MP_ERR_USAGE, "%s: %s: a trailing ','", what, key);
            goto out;
        }
    }
out:
    free(k);
    return st;
}

void mp_alloc_conf_str(const struct mp_alloc_conf *c, char *buf, size_t n)
{
    struct mp_alloc_conf z;
    mp_alloc_conf_default(&z);
    size_t o = 0;
    buf[0] = 0;
#define ADD(...) \
    (o += (size_t)snprintf(buf + (o < n ? o : n), o < n ? n - o : 0, "%s", o ? "," : ""), \
     o += (size_t)snprintf(buf + (o < n ? o : n), o < n ? n - o : 0, __VA_ARGS__))
    if (c->expandable)
        ADD("expandable_segments:True");
    if (c->max_split_size != z.max_split_size)
        ADD("max_split_size_mb:%llu", (unsigned long long)(c->max_split_size / MIB));
    if (c->max_non_split_rounding != z.max_non_split_rounding)
        ADD("max_non_split_rounding_mb:%llu", (unsigned long long)(c->max_non_split_rounding / MIB));
    if (c->large_segment_size != z.large_segment_size)
        ADD("large_segment_size_mb:%llu", (unsigned long long)(c->large_segment_size / MIB));
    if (c->gc_threshold > 0)
        ADD("garbage_collection_threshold:%g", c->gc_threshold);
    if (c->memory_fraction > 0)
        ADD("per_process_memory_fraction:%g", c->memory_fraction);
    if (memcmp(c->pow2_div, z.pow2_div, sizeof z.pow2_div)) {
        /* the list as torch reads it: the first entry fills the intervals below it, ">" those
         * after the last; so the leading run by its last interval, the trailing run by its first */
        const uint32_t *v = c->pow2_div;
        size_t lead = 0, trail = MP_ALLOC_POW2_INTERVALS - 1;
        while (lead + 1 < MP_ALLOC_POW2_INTERVALS && v[lead + 1] == v[0])
            lead++;
        while (trail > lead && v[trail - 1] == v[MP_ALLOC_POW2_INTERVALS - 1])
            trail--;
        if (lead == MP_ALLOC_POW2_INTERVALS - 1)
            ADD("roundup_power2_divisions:%u", v[0]);
        else {
            ADD("roundup_power2_divisions:[");
            for (size_t j = lead; j <= trail; j++)
                o += (size_t)snprintf(buf + (o < n ? o : n), o < n ? n - o : 0, "%s%llu:%u", j > lead ? "," : "",
                                      1ULL << j, v[j]);
            o += (size_t)snprintf(buf + (o < n ? o : n), o < n ? n - o : 0, ",>:%u]", v[trail]);
        }
    }
#undef ADD
}

/* CUDACachingAllocator.cpp, DeviceCachingAllocator::round_size and roundup_power2_next_division;
 * AcceleratorAllocatorConfig::roundup_power2_divisions(size): the interval is floor(log2 size) -
 * 20, clamped to 0..15. */
uint64_t mp_alloc_round(const struct mp_alloc_conf *c, uint64_t size)
{
    if (size < 512)
        return 512;
    if (size <= 512 * 2) /* (no division of 2 or more applies: size must exceed 512 x div) */
        return (size + 511) / 512 * 512;
    unsigned lg = log2u(size);
    size_t idx = lg > 20 ? lg - 20 : 0;
    if (idx > MP_ALLOC_POW2_INTERVALS - 1)
        idx = MP_ALLOC_POW2_INTERVALS - 1;
    uint64_t div = c->pow2_div[idx];
    if (div > 1 && size > 512 * div) {
        if (pow2(size))
            return size;
        uint64_t floor2 = UINT64_C(1) << lg;
        uint64_t step = floor2 >> log2u(div);
        if (step == 0)
            return floor2 << 1;
        uint64_t low = size & ~(step - 1);
        return low == size ? size : low + step;
    }
    return size > UINT64_MAX - 511 ? 0 : (size + 511) / 512 * 512; /* 0: overflow (checked by callers) */
}
