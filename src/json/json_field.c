/* json_field.c — the JSON field readers both model readers (and the GPU profile reader)
 * share: one typed, range-checked value per call, with "path: where.key: expected ..." on
 * error; and the check that an object has no unknown keys.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

enum mp_status mp_json_u64(const cJSON *obj, const char *key, bool required, uint64_t max, uint64_t *out,
                           const char *path, const char *where, struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) {
        if (required)
            return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: missing (expected a positive integer)", path, where,
                           *where ? "." : "", key);
        return MP_OK;
    }
    double x = cJSON_IsNumber(v) ? v->valuedouble : -1;
    if (!cJSON_IsNumber(v) || x < 0 || x != floor(x))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a non-negative integer", path, where,
                       *where ? "." : "", key);
    if (x > (double)max) /* compared as doubles: no conversion of values >= 2^64; %g beyond 10^18 */
        return mp_fail(d, MP_ERR_RANGE, x < 1e18 ? "%s: %s%s%s: %.0f is too large (at most %llu)"
                                                 : "%s: %s%s%s: %g is too large (at most %llu)",
                       path, where, *where ? "." : "", key, x, (unsigned long long)max);
    *out = (uint64_t)x;
    return MP_OK;
}

enum mp_status mp_json_bool(const cJSON *obj, const char *key, bool *out, const char *path, const char *where,
                            struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (!cJSON_IsBool(v))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected true or false", path, where, *where ? "." : "", key);
    *out = cJSON_IsTrue(v);
    return MP_OK;
}

enum mp_status mp_json_prob(const cJSON *obj, const char *key, double *out, const char *path, const char *where,
                            struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0.0 && v->valuedouble < 1.0))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a probability in [0, 1)", path, where,
                       *where ? "." : "", key);
    *out = v->valuedouble;
    return MP_OK;
}

const char *mp_json_str(const cJSON *obj, const char *key, enum mp_status *st, const char *path, const char *where,
                        struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *st = MP_OK;
    if (!v || cJSON_IsNull(v))
        return NULL;
    if (!cJSON_IsString(v)) {
        *st = mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a string", path, where, *where ? "." : "", key);
        return NULL;
    }
    return v->valuestring;
}

enum mp_status mp_json_num(const cJSON *obj, const char *key, double lo, bool above_lo, double hi, double *out,
                           const char *path, const char *where, struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(x) || x < lo || (above_lo && x == lo) || x > hi)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a number in %c%.15g, %.15g]", path, where,
                       *where ? "." : "", key, above_lo ? '(' : '[', lo, hi);
    *out = x;
    return MP_OK;
}

/* ---- keys ------------------------------------------------------------------------------- */

static bool ignorable_key(const char *k)
{
    return k[0] == '_' || strncmp(k, "comment", 7) == 0;
}

/* Levenshtein distance, capped for long strings (keys and type names are short). */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    size_t row[41];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

void mp_json_suggest(const char *list, const char *key, char *out, size_t cap)
{
    size_t best = 3;
    out[0] = '\0';
    size_t n;
    for (const char *p; (p = mp_list_word(&list, &n));) {
        char w[48];
        if (n < sizeof w) {
            memcpy(w, p, n);
            w[n] = '\0';
            size_t dist = edit_distance(key, w);
            if (dist < best) {
                best = dist;
                snprintf(out, cap, "%s", w);
            }
        }
    }
}

enum mp_status mp_json_check_keys(const cJSON *obj, const char *allowed, const char *what, const char *path,
                                  const char *where, struct mp_diag *d)
{
    for (const cJSON *c = obj->child; c; c = c->next) {
        if (!c->string || ignorable_key(c->string) || mp_in_list(allowed, c->string))
            continue;
        char hint[48];
        mp_json_suggest(allowed, c->string, hint, sizeof hint);
        if (hint[0])
            return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: unknown key for %s (did you mean \"%s\"?)", path, where,
                           *where ? "." : "", c->string, what, hint);
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: unknown key for %s", path, where, *where ? "." : "", c->string,
                       what);
    }
    return MP_OK;
}
