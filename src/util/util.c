/* util.c — status strings, diagnostics, checked arithmetic, parsers. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
        /* a message is one line whatever the input echoed into it (a key or a
         * name with a newline or other control byte in it) */
        for (char *c = d->msg; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                *c = '?';
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

/* A decimal number's start: strtod also reads hex ("0x10", "0x1p3"), "inf" and "nan", which
 * no option takes (the integer options, read in base 10, refuse them too). */
static bool decimal_start(const char *s)
{
    const char *p = s + (*s == '-' || *s == '+');
    return ((*p >= '0' && *p <= '9') || *p == '.') && !strpbrk(s, "xX");
}

enum mp_status mp_parse_double(const char *s, double *out)
{
    if (!s || !decimal_start(s))
        return MP_ERR_USAGE;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if ((errno == ERANGE && fabs(v) > 1) || !isfinite(v)) /* beyond a double; an underflow reads as ~0 */
        return MP_ERR_RANGE;
    if (*end != '\0' || end == s)
        return MP_ERR_USAGE;
    *out = v;
    return MP_OK;
}

enum mp_status mp_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+' || !decimal_start(s))
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

uint64_t mp_host_ram_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

struct par_range {
    void (*fn)(void *ctx, uint64_t i0, uint64_t i1);
    void *ctx;
    uint64_t i0, i1;
};

static void *par_run(void *arg)
{
    struct par_range *r = arg;
    r->fn(r->ctx, r->i0, r->i1);
    return NULL;
}

void mp_parallel_for(uint64_t n, uint64_t grain, void (*fn)(void *ctx, uint64_t i0, uint64_t i1), void *ctx)
{
    enum { MAX_THREADS = 32 };
    if (!n)
        return;
    if (!grain)
        grain = 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t t = cpus > 1 ? (uint64_t)cpus : 1, chunks = n / grain;
    t = mp_min_u64(mp_min_u64(t, MAX_THREADS), chunks);
    if (t < 2) {
        fn(ctx, 0, n);
        return;
    }
    uint64_t per = mp_ceil_div(chunks, t) * grain; /* each range a multiple of grain */
    struct par_range r[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {0};
    size_t k = 0;
    for (uint64_t i0 = 0; i0 < n && k < MAX_THREADS; i0 += per, k++) {
        r[k] = (struct par_range){fn, ctx, i0, mp_min_u64(n, i0 + per)};
        if (k > 0)
            started[k] = pthread_create(&th[k], NULL, par_run, &r[k]) == 0;
    }
    fn(ctx, r[0].i0, r[0].i1);
    for (size_t i = 1; i < k; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            fn(ctx, r[i].i0, r[i].i1);
    }
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

/* ---- files ----------------------------------------------------------------------------- */

enum mp_status mp_read_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                            struct mp_diag *d)
{
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return mp_fail(d, MP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    enum mp_status st = MP_OK;
    if (fstat(fd, &sb) != 0)
        st = mp_fail(d, MP_ERR_IO, "%s: %s", path, strerror(errno));
    else if (S_ISDIR(sb.st_mode))
        st = mp_fail(d, MP_ERR_IO, "%s: is a directory, expected %s", path, what);
    else if (!S_ISREG(sb.st_mode))
        st = mp_fail(d, MP_ERR_IO, "%s: not a regular file (a FIFO, device or socket), expected %s", path, what);
    else if ((uint64_t)sb.st_size > max)
        st = mp_fail(d, MP_ERR_IO, "%s: larger than %zu KiB, not %s", path, max >> 10, what);
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        st = mp_fail(d, MP_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = st == MP_OK ? (size_t)sb.st_size + 1 : 0;
    if (st == MP_OK && !(buf = malloc(cap + 1)))
        st = mp_fail(d, MP_ERR_NOMEM, "%s: out of memory reading the file", path);
    while (st == MP_OK) {
        if (n == cap) { /* the file grew while we read it */
            if (cap > max) {
                st = mp_fail(d, MP_ERR_IO, "%s: larger than %zu KiB, not %s", path, max >> 10, what);
                break;
            }
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                st = mp_fail(d, MP_ERR_NOMEM, "%s: out of memory reading the file", path);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            st = mp_fail(d, MP_ERR_IO, "%s: read error: %s", path, strerror(errno));
        else if (r == 0)
            break;
        else
            n += (size_t)r;
    }
    close(fd);
    if (st == MP_OK && n > max)
        st = mp_fail(d, MP_ERR_IO, "%s: larger than %zu KiB, not %s", path, max >> 10, what);
    if (st != MP_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return MP_OK;
}

/* ---- text ------------------------------------------------------------------------------ */

size_t mp_utf8_seq_len(const char *str)
{
    const unsigned char *u = (const unsigned char *)str;
    unsigned c = u[0];
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    for (size_t j = 1; j < n; j++)
        if ((u[j] & 0xC0) != 0x80)
            return 0;
    if ((n == 2 && c < 0xC2) ||                                            /* overlong */
        (n == 3 && ((c == 0xE0 && u[1] < 0xA0) || (c == 0xED && u[1] >= 0xA0))) || /* overlong, surrogate */
        (n == 4 && (c > 0xF4 || (c == 0xF0 && u[1] < 0x90) || (c == 0xF4 && u[1] >= 0x90))))
        return 0;
    return c ? n : 0;
}

char *mp_utf8_fix(const char *s)
{
    size_t len = strlen(s), bad = 0;
    for (size_t i = 0; i < len;) {
        size_t n = mp_utf8_seq_len(s + i);
        bad += n == 0;
        i += n ? n : 1;
    }
    char *out = malloc(len + 2 * bad + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = mp_utf8_seq_len(s + i);
        if (n) {
            memcpy(out + o, s + i, n);
            o += n;
            i += n;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3); /* U+FFFD REPLACEMENT CHARACTER */
            o += 3;
            i++;
        }
    }
    out[o] = 0;
    return out;
}

const char *mp_text_clean(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    for (const char *p = s; *p;) {
        unsigned char c = (unsigned char)*p;
        size_t n = mp_utf8_seq_len(p), m = n;
        const char *piece = p;
        char esc[8];
        if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7F))) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            piece = esc;
            n = 1;
            m = 4;
        } else if (n == 2 && c == 0xC2 && (unsigned char)p[1] < 0xA0) { /* U+0080..U+009F */
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned char)p[1]);
            piece = esc;
            m = 6;
        }
        if (o + m >= len)
            break;
        memcpy(buf + o, piece, m);
        o += m;
        p += n;
    }
    buf[o] = 0;
    return buf;
}

long mp_json_leading_zero(const char *text, size_t len)
{
    bool in_str = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"') {
            in_str = true;
            continue;
        }
        bool starts = (c == '-' || (c >= '0' && c <= '9')) &&
                      (i == 0 || !((text[i - 1] >= '0' && text[i - 1] <= '9') || text[i - 1] == '.' ||
                                   text[i - 1] == 'e' || text[i - 1] == 'E' || text[i - 1] == '+' ||
                                   text[i - 1] == '-'));
        if (!starts)
            continue;
        size_t j = c == '-' ? i + 1 : i;
        if (j + 1 < len && text[j] == '0' && text[j + 1] >= '0' && text[j + 1] <= '9')
            return (long)j;
    }
    return -1;
}

/* ---- progress -------------------------------------------------------------------------- */

static mp_progress_fn progress_sink;

void mp_progress_set(mp_progress_fn fn) { progress_sink = fn; }

void mp_progress(const char *fmt, ...)
{
    if (!progress_sink)
        return;
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    progress_sink(msg);
}

void mp_progress_done(void)
{
    if (progress_sink)
        progress_sink(NULL);
}

const char *mp_list_word(const char **list, size_t *n)
{
    const char *p = *list;
    while (*p == ' ')
        p++;
    const char *e = p;
    while (*e && *e != ' ')
        e++;
    *list = e;
    *n = (size_t)(e - p);
    return *n ? p : NULL;
}

/* True when word is one of the space-separated words of list (util.h). */
bool mp_in_list(const char *list, const char *word)
{
    size_t n = strlen(word), k;
    for (const char *w; (w = mp_list_word(&list, &k));)
        if (k == n && strncmp(w, word, n) == 0)
            return true;
    return false;
}

const char *mp_join(char *buf, size_t cap, const char *const *words, size_t n, const char *sep, const char *last)
{
    size_t k = 0;
    if (cap)
        buf[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = i == 0 ? "" : i == n - 1 && last ? last : sep;
        k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, "%s%s", s, words[i]);
    }
    if (k >= cap)
        MP_BUG("a joined list of %zu words outgrew its %zu-byte buffer", n, cap);
    return buf;
}

int mp_name_index(const char *const *names, size_t n, const char *s)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return (int)i;
    return -1;
}
