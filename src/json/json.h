/* json.h — reading untrusted JSON input (model files, HF configs, GPU profiles): the strict
 * parser and typed, range-checked field readers with "path: where.key: expected ..." messages.
 * Only the readers (src/model/, src/search/gpu.c) include it; they alone see cJSON.
 */
#ifndef MEMPLAN_JSON_H
#define MEMPLAN_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"

/* Parses a whole file's text as one JSON value, held to RFC 8259 where cJSON is lenient: a
 * number with a leading zero, a \u0000 escape or a raw control character in a string, a
 * control character between tokens, nesting deeper than CJSON_NESTING_LIMIT, text after the
 * value and duplicate keys are errors.  MP_ERR_JSON "path:line:col: ..." (duplicates:
 * MP_ERR_MODEL "path: place.key: duplicate key"); on success *out is the tree (cJSON_Delete it). */
enum mp_status mp_json_parse(const char *text, size_t len, const char *path, cJSON **out, struct mp_diag *d);

/* Shared field readers.  Each returns MP_OK, or MP_ERR_MODEL/RANGE with
 * "path: where.key: expected ..." in d.  `required` false leaves *out untouched when absent. */
enum mp_status mp_json_u64(const cJSON *obj, const char *key, bool required, uint64_t max, uint64_t *out,
                           const char *path, const char *where, struct mp_diag *d);
enum mp_status mp_json_bool(const cJSON *obj, const char *key, bool *out, const char *path, const char *where,
                            struct mp_diag *d);
enum mp_status mp_json_prob(const cJSON *obj, const char *key, double *out, const char *path, const char *where,
                            struct mp_diag *d);
/* A finite number in [lo, hi] (in (lo, hi] when above_lo); absent or null leaves *out untouched. */
enum mp_status mp_json_num(const cJSON *obj, const char *key, double lo, bool above_lo, double hi, double *out,
                           const char *path, const char *where, struct mp_diag *d);
/* Returns the string or NULL if absent; wrong type → MP_ERR_MODEL via *st. */
const char *mp_json_str(const cJSON *obj, const char *key, enum mp_status *st, const char *path, const char *where,
                        struct mp_diag *d);

/* Every key of obj is one of the space-separated words of allowed, or starts with "_" or
 * "comment" (ignored); else MP_ERR_MODEL "path: where.key: unknown key for <what>", with
 * (did you mean "word"?) when a word of allowed is within two edits. */
enum mp_status mp_json_check_keys(const cJSON *obj, const char *allowed, const char *what, const char *path,
                                  const char *where, struct mp_diag *d);
/* The word of list closest to key within two edits, copied to out ("" when none). */
void mp_json_suggest(const char *list, const char *key, char *out, size_t cap);

#endif
