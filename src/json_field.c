/* json_field.c — the JSON field readers both model readers share: one typed,
 * range-checked value per call, with "path: where.key: expected ..." on error.
 */
#include <math.h>
#include <stdio.h>

#include "model_read.h"

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
    if (x > (double)max) /* compared as doubles: no conversion of values >= 2^64 */
        return mp_fail(d, MP_ERR_RANGE, "%s: %s%s%s: %.0f is too large (at most %llu)", path, where,
                       *where ? "." : "", key, x, (unsigned long long)max);
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
