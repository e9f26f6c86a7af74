/* util.c — status strings, diagnostics, checked arithmetic, parsers. */
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *mp_status_str(enum mp_status st)
{
    switch (st) {
#define MP_X(name, msg) \
    case MP_##name:     \
        return msg;
        MP_STATUS_MAP(MP_X)
#undef MP_X
    }
    return "unknown status";
}

enum mp_status mp_fail(struct mp_diag *d, enum mp_status st, const char *fmt, ...)
{
    if (d) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(d->msg, sizeof d->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

bool mp_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a != 0 && b > UINT64_MAX / a)
        return false;
    *out = a * b;
    return true;
}

bool mp_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b > UINT64_MAX - a)
        return false;
    *out = a + b;
    return true;
}

bool mp_mul3_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t t;
    return mp_mul_u64(a, b, &t) && mp_mul_u64(t, c, out);
}

const char *mp_fmt_bytes(uint64_t bytes, char *buf, size_t len)
{
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.2f %s", v, unit[u]);
    return buf;
}

const char *mp_fmt_flops(double flops, char *buf, size_t len)
{
    static const char *unit[] = {"", "K", "M", "G", "T", "P", "E"};
    int u = 0;
    while (flops >= 1000.0 && u < 6) {
        flops /= 1000.0;
        u++;
    }
    snprintf(buf, len, "%.2f %sFLOP", flops, unit[u]);
    return buf;
}

enum mp_status mp_parse_u64(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
        return MP_ERR_USAGE;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno == ERANGE)
        return MP_ERR_RANGE;
    if (*end != '\0')
        return MP_ERR_USAGE;
    *out = v;
    return MP_OK;
}

enum mp_status mp_parse_double(const char *s, double *out)
{
    if (!s || !*s || *s == ' ')
        return MP_ERR_USAGE;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno == ERANGE || !isfinite(v))
        return MP_ERR_RANGE;
    if (*end != '\0' || end == s)
        return MP_ERR_USAGE;
    *out = v;
    return MP_OK;
}

enum mp_status mp_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+' || *s == ' ')
        return MP_ERR_USAGE;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || errno == ERANGE || !isfinite(v) || v < 0)
        return MP_ERR_USAGE;
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"K", 1024.0},
        {"KiB", 1024.0},
        {"KB", 1e3},
        {"M", 1048576.0},
        {"MiB", 1048576.0},
        {"MB", 1e6},
        {"G", 1073741824.0},
        {"GiB", 1073741824.0},
        {"GB", 1e9},
        {"T", 1099511627776.0},
        {"TiB", 1099511627776.0},
        {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mult;
            if (b >= 18446744073709551615.0)
                return MP_ERR_RANGE;
            if (b != floor(b))
                return MP_ERR_USAGE; /* fractional bytes */
            *out = (uint64_t)b;
            return MP_OK;
        }
    }
    return MP_ERR_USAGE;
}

double mp_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

_Noreturn void mp_bug(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "memplan: BUG at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(MP_EXIT_INTERNAL);
}

void *mp_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        MP_BUG("allocation of %zu x %zu bytes failed", n, size);
    return p;
}
