/* model_read.h — the two model readers, behind mp_model_load_*() (model_load.c),
 * and the JSON parser and field readers they share (model_load.c, json_field.c).
 * Internal: only the model files and gpu.c (GPU profiles, read as untrusted as a
 * model) include it, and only they see cJSON.  Dependencies run one way:
 * model_load -> readers -> json_field, model; the loader then calls
 * mp_program_check (layers.c).  Each reader fills an initialised model and calls
 * mp_model_validate() last;
 * messages are "path: place: problem" with place a JSON path like layers[3].heads.
 */
#ifndef MEMPLAN_MODEL_READ_H
#define MEMPLAN_MODEL_READ_H

#include <cjson/cJSON.h>

#include "model.h"

/* True when root looks like a Hugging Face config.json (has "model_type" and no "layers"). */
bool mp_json_is_hf(const cJSON *root);

enum mp_status mp_model_from_memplan(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d);
enum mp_status mp_model_from_hf(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d);

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

/* True when word is one of the space-separated words of list. */
bool mp_in_list(const char *list, const char *word);
/* The next space-separated word of *list (its length in *n), moving *list past it; NULL when
 * no word is left. */
const char *mp_list_word(const char **list, size_t *n);

/* Largest dimension any reader accepts (2^40): keeps every product of a few dims in 64 bits
 * checkable and rejects 10^15-wide layers with a clear message. */
#define MP_DIM_MAX (UINT64_C(1) << 40)
#define MP_REPEAT_MAX 100000u
#define MP_NEST_MAX 8

#endif
