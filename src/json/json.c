/* json.c — the JSON text of every input file (models, HF configs, GPU profiles) held to
 * RFC 8259 where cJSON is lenient (json.h: mp_json_parse): no leading zeros, no duplicate
 * keys, no control characters or \u0000 in strings, nothing after the value, so the readers
 * see one well-formed document.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* 1-based line and column of byte off in text. */
static void line_col(const char *text, size_t off, size_t *line, size_t *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static int cmp_item_names(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* Duplicate keys are an error (cJSON keeps both and lookups see the first; Python's json,
 * and so transformers, keep the last): "path: place: duplicate key", place like
 * layers[3].heads.  Each object's names are sorted, so a huge object stays O(n log n). */
static enum mp_status check_duplicates(const cJSON *node, char *place, size_t cap, const char *path,
                                       struct mp_diag *d)
{
    size_t n = 0, len = strlen(place);
    for (const cJSON *c = node->child; c; c = c->next)
        n++;
    if (cJSON_IsObject(node) && n > 1) {
        const cJSON **v = malloc(n * sizeof *v);
        if (!v)
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", path);
        size_t i = 0;
        for (const cJSON *c = node->child; c; c = c->next)
            v[i++] = c;
        qsort(v, n, sizeof *v, cmp_item_names);
        for (i = 1; i < n && strcmp(v[i - 1]->string, v[i]->string) != 0; i++)
            ;
        if (i < n) {
            enum mp_status st = mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: duplicate key", path, place, *place ? "." : "",
                                        v[i]->string);
            free(v);
            return st;
        }
        free(v);
    }
    size_t idx = 0;
    for (const cJSON *c = node->child; c; c = c->next, idx++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c))
            continue;
        if (cJSON_IsObject(node))
            snprintf(place + len, cap - len, "%s%s", len ? "." : "", c->string);
        else
            snprintf(place + len, cap - len, "[%zu]", idx);
        enum mp_status st = check_duplicates(c, place, cap, path, d);
        place[len] = '\0';
        if (st != MP_OK)
            return st;
    }
    return MP_OK;
}

/* The first place where text departs from RFC 8259 in a way cJSON lets through, or -1:
 * a \u0000 escape in a string (cJSON keeps strings NUL-terminated, so "a\u0000b" would be read
 * as "a" where Python reads another key), a raw control byte inside a string (RFC 8259 wants
 * it escaped) or between tokens (cJSON skips every byte up to a space as white space).  *what
 * says which.  *deep is the offset of the first bracket nested deeper than cJSON's limit
 * (CJSON_NESTING_LIMIT), or -1. */
static long json_scan(const char *text, size_t len, const char **what, long *deep)
{
    bool in_str = false;
    size_t depth = 0;
    *deep = -1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (in_str) {
            if (c == '"') {
                in_str = false;
            } else if (c < 0x20) {
                *what = "malformed JSON: a control character inside a string (JSON needs it escaped)";
                return (long)i;
            } else if (c == '\\' && i + 1 < len) {
                if (text[i + 1] == 'u' && i + 5 < len && !memcmp(text + i + 2, "0000", 4)) {
                    *what = "a \\u0000 (NUL) escape in a string is not supported";
                    return (long)i;
                }
                i++;
            }
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            *what = "malformed JSON: a control character outside a string";
            return (long)i;
        } else if (c == '[' || c == '{') {
            if (++depth > CJSON_NESTING_LIMIT && *deep < 0)
                *deep = (long)i;
        } else if ((c == ']' || c == '}') && depth) {
            depth--;
        }
    }
    return -1;
}

enum mp_status mp_json_parse(const char *text, size_t len, const char *path, cJSON **out, struct mp_diag *d)
{
    *out = NULL;
    if (len == 0)
        return mp_fail(d, MP_ERR_JSON, "%s: the file is empty", path);
    size_t line, col;
    long lz = mp_json_leading_zero(text, len);
    if (lz >= 0) {
        line_col(text, (size_t)lz, &line, &col);
        return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: malformed JSON: a number with a leading zero", path, line, col);
    }
    const char *what = NULL;
    long deep, bad = json_scan(text, len, &what, &deep);
    if (bad >= 0) {
        line_col(text, (size_t)bad, &line, &col);
        return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: %s", path, line, col, what);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (root && end) { /* only whitespace may follow the value */
        while (end < text + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r'))
            end++;
        if (end < text + len) {
            cJSON_Delete(root);
            line_col(text, (size_t)(end - text), &line, &col);
            return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: unexpected text after the JSON value", path, line, col);
        }
    }
    if (!root) {
        const char *e = cJSON_GetErrorPtr();
        size_t off = (e && e >= text && e <= text + len) ? (size_t)(e - text) : len;
        if (deep >= 0 && (size_t)deep <= off) { /* cJSON stopped at its nesting limit */
            line_col(text, (size_t)deep, &line, &col);
            return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: nested deeper than %d levels", path, line, col,
                           CJSON_NESTING_LIMIT);
        }
        line_col(text, off, &line, &col);
        return mp_fail(d, MP_ERR_JSON, "%s:%zu:%zu: malformed JSON", path, line, col);
    }
    char place[256] = "";
    enum mp_status st = check_duplicates(root, place, sizeof place, path, d);
    if (st != MP_OK) {
        cJSON_Delete(root);
        return st;
    }
    *out = root;
    return MP_OK;
}
