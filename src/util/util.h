/* util.h — status codes, diagnostics, checked 64-bit arithmetic, small helpers.
 *
 * Library code never prints or exits: it returns enum mp_status and, on error,
 * fills a struct mp_diag with one line ("file: place: what is wrong").  Only
 * the command line (src/cli/) turns that into a message and an exit status.  Every byte or element
 * product goes through mp_mul_u64/mp_add_u64 so absurd input is rejected
 * instead of wrapping.
 */
#ifndef MEMPLAN_UTIL_H
#define MEMPLAN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sets.h"

#define MEMPLAN_VERSION "0.1.0"

/* One X-macro gives the enum and the message table (libuv's UV_ERRNO_MAP). */
#define MP_STATUS_MAP(X)                                         \
    X(OK, "success")                                             \
    X(ERR_NOMEM, "out of memory")                                \
    X(ERR_IO, "input/output error")                              \
    X(ERR_JSON, "malformed JSON")                                \
    X(ERR_MODEL, "invalid model")                                \
    X(ERR_RANGE, "value out of range")                           \
    X(ERR_UNSUPPORTED, "unsupported")                            \
    X(ERR_USAGE, "usage error")                                  \
    X(ERR_INFEASIBLE, "no plan fits the budget")                 \
    X(ERR_DEVICE, "device error")                                \
    X(ERR_OOM, "device out of memory")                           \
    X(ERR_INTERNAL, "internal error")

enum mp_status {
#define MP_X(name, msg) MP_##name,
    MP_STATUS_MAP(MP_X)
#undef MP_X
};

const char *mp_status_str(enum mp_status st);

/* Exit statuses (README "Exit status", memplan(1) EXIT STATUS). */
enum mp_exit {
    MP_EXIT_OK = 0,
    MP_EXIT_NOFIT = 1,
    MP_EXIT_USAGE = 2,
    MP_EXIT_INPUT = 3,
    MP_EXIT_DEVICE = 4,
    MP_EXIT_INTERNAL = 5,
};

/* A one-line diagnostic filled by the function that failed. */
struct mp_diag {
    char msg[1024];
};

/* Formats d->msg and returns st, so callers write `return mp_fail(d, MP_ERR_X, ...)`. */
enum mp_status mp_fail(struct mp_diag *d, enum mp_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Checked arithmetic: return false (and leave *out unspecified) on overflow. */
bool mp_mul_u64(uint64_t a, uint64_t b, uint64_t *out);
bool mp_add_u64(uint64_t a, uint64_t b, uint64_t *out);
/* a*b*c... of n factors; false on overflow. */
bool mp_mul3_u64(uint64_t a, uint64_t b, uint64_t c, uint64_t *out);

/* Saturating helpers for quantities already proven bounded. */
static inline uint64_t mp_max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }
static inline uint64_t mp_min_u64(uint64_t a, uint64_t b) { return a < b ? a : b; }
static inline uint64_t mp_ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }
static inline uint64_t mp_gcd_u64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* "1.50 GiB", "512 B": human-readable binary size into buf (>= 32 bytes). */
const char *mp_fmt_bytes(uint64_t bytes, char *buf, size_t len);
/* "1.23 TFLOP" style. */
const char *mp_fmt_flops(double flops, char *buf, size_t len);

/* Parsers for command-line values.  Strict: decimal only (no hex, inf or nan), no trailing junk,
 * no sign (doubles: a sign), no overflow (MP_ERR_RANGE).
 * Sizes: "24GiB", "24G" (GiB), "80GB" (10^9), "1e9", "512", "512B", "4MiB", "4M", "4MB". */
enum mp_status mp_parse_size(const char *s, uint64_t *out);
enum mp_status mp_parse_u64(const char *s, uint64_t *out);
enum mp_status mp_parse_double(const char *s, double *out);

/* Progress of slow work (the planner, the searches, probe steps).  Library code calls
 * mp_progress() at natural steps; it does nothing unless the command line (src/cli/) installed a sink, which
 * shows the latest message on a terminal once the work has run for about 2 s. */
typedef void (*mp_progress_fn)(const char *msg); /* msg NULL: the work is over, clear the line */
void mp_progress_set(mp_progress_fn fn);
void mp_progress(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
void mp_progress_done(void);

/* Wall-clock milliseconds since an arbitrary origin (CLOCK_MONOTONIC). */
double mp_now_ms(void);
/* This machine's physical memory in bytes (0 if unknown). */
uint64_t mp_host_ram_bytes(void);

/* Runs fn(ctx, i0, i1) over [0, n) in contiguous ranges of at least grain (a multiple of grain
 * but the last), on up to the machine's online CPUs (at most 32) threads, the caller's among
 * them; on the caller alone when n < 2 grain or no thread starts.  fn must write disjoint outputs
 * for disjoint ranges, so the result does not depend on the split. */
void mp_parallel_for(uint64_t n, uint64_t grain, void (*fn)(void *ctx, uint64_t i0, uint64_t i1), void *ctx);

/* Impossible states: print file:line and exit 5 (git's BUG()). */
_Noreturn void mp_bug(const char *file, int line, const char *fmt, ...);
#define MP_BUG(...) mp_bug(__FILE__, __LINE__, __VA_ARGS__)

/* Reads a whole regular file of at most max bytes into *out (NUL-terminated, caller frees)
 * without blocking on a FIFO: a directory, FIFO, device or socket is MP_ERR_IO with
 * "path: not a regular file ..., expected <what>". */
enum mp_status mp_read_file(const char *path, size_t max, const char *what, char **out, size_t *len,
                            struct mp_diag *d);

/* Length of the valid UTF-8 sequence at s (1-4), or 0 for an invalid one or the NUL. */
size_t mp_utf8_seq_len(const char *s);
/* A malloc'd copy of s with each byte that is not valid UTF-8 replaced by U+FFFD (NULL: no memory). */
char *mp_utf8_fix(const char *s);
/* s as a text report shows it, in buf (len > 0; NUL-terminated): control characters (C0, DEL)
 * and bytes that are not valid UTF-8 as \xNN, C1 controls as \u00NN, so a name from an input file
 * cannot clear the screen, set the terminal's title or split a line.  Cut before an escape or a
 * character that does not fit; 4 x strlen(s) + 1 bytes always hold all of it.  Returns buf. */
const char *mp_text_clean(const char *s, char *buf, size_t len);
/* Offset of the first JSON number written with a leading zero ("007", "-01"), outside
 * strings, or -1.  JSON (RFC 8259) forbids them; cJSON accepts them. */
long mp_json_leading_zero(const char *text, size_t len);

void *mp_xcalloc(size_t n, size_t size); /* MP_BUG on failure: tiny, bounded allocations only */

/* words[0..n) joined into buf: sep between them, last (e.g. " or ") before the last one (NULL:
 * sep); MP_BUG when buf is too small (the callers join fixed tables into static buffers). */
const char *mp_join(char *buf, size_t cap, const char *const *words, size_t n, const char *sep, const char *last);
/* The index of s among names[0..n), or -1: the parse of a closed set's names (sets.h). */
int mp_name_index(const char *const *names, size_t n, const char *s);

/* True when word is one of the space-separated words of list. */
bool mp_in_list(const char *list, const char *word);
/* The next space-separated word of *list (its length in *n), moving *list past it; NULL when
 * no word is left. */
const char *mp_list_word(const char **list, size_t *n);

#endif
