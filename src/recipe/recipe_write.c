/* recipe_write.c — the recipe handed back (suggest --recipe F --write-recipe OUT): the keys of the
 * file to change so that it runs the recommended micro-batch and accumulation, and the file
 * written with them changed, the rest byte for byte.
 *
 * A key the file has is changed where it is (its line, from the reader): the value after
 * "KEY:" (YAML block or flow, JSON) is replaced, its quotes kept.  A key it leaves out is added:
 * at the end of a block mapping, or first in a flow/JSON one.  The file written is read back as
 * the same format and trainer: it must say the plan's values, or nothing is written.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe/recipe_impl.h"

/* The change of setting id (fact f) to the plan's value: on the key the file has, else on the
 * key the format reads it from (recipe_keys.c's table). */
static void change_of(const struct mp_recipe *r, enum mp_recipe_setting_id id, enum fact f, uint64_t to,
                      struct mp_recipe_change *c)
{
    const struct mp_recipe_setting *s = &r->s[id];
    memset(c, 0, sizeof *c);
    c->id = id;
    bool in_file = s->set && s->line && s->src != MP_RSRC_DEFAULT && !strchr(s->key, '.');
    const char *k = in_file ? s->key : mp_recipe_fact_key(1u << r->format, f);
    snprintf(c->key, sizeof c->key, "%s", k ? k : "");
    c->line = in_file ? s->line : 0;
    snprintf(c->from, sizeof c->from, "%s", s->set ? s->value : "");
    snprintf(c->to, sizeof c->to, "%" PRIu64, to);
}

size_t mp_recipe_changes(const struct mp_recipe *r, uint64_t batch, uint64_t accum,
                         struct mp_recipe_change out[MP_RECIPE_MAX_CHANGES])
{
    size_t n = 0;
    struct mp_recipe_change c;
    change_of(r, MP_RS_BATCH, F_BATCH, batch, &c);
    if (strcmp(c.from, c.to) != 0)
        out[n++] = c;
    change_of(r, MP_RS_GRAD_ACCUM, F_GA, accum, &c);
    if (strcmp(c.from, c.to) != 0)
        out[n++] = c;
    return n;
}

/* ---- the text edits ------------------------------------------------------------------------- */

/* Offset of line (1-based) in buf, or -1. */
static long line_start(const char *buf, size_t len, unsigned line)
{
    size_t off = 0;
    for (unsigned l = 1; l < line; l++) {
        const char *nl = memchr(buf + off, '\n', len - off);
        if (!nl)
            return -1;
        off = (size_t)(nl - buf) + 1;
    }
    return off <= len ? (long)off : -1;
}

/* In [from, to): the value of KEY (bare or quoted, then ':'), as [*v0, *v1). */
static bool find_value(const char *buf, size_t from, size_t to, const char *key, size_t *v0, size_t *v1)
{
    size_t kl = strlen(key);
    for (size_t i = from; i + kl <= to; i++) {
        size_t k = i, q = 0;
        if (buf[k] == '"' || buf[k] == '\'')
            q = 1;
        if (k + q + kl > to || memcmp(buf + k + q, key, kl) != 0)
            continue;
        if (k > from && !strchr(" \t{,", buf[k - 1]))
            continue;
        size_t e = k + q + kl;
        if (q) {
            if (e >= to || buf[e] != buf[k])
                continue;
            e++;
        }
        while (e < to && (buf[e] == ' ' || buf[e] == '\t'))
            e++;
        if (e >= to || buf[e] != ':')
            continue;
        e++;
        while (e < to && (buf[e] == ' ' || buf[e] == '\t'))
            e++;
        size_t s = e;
        if (s < to && (buf[s] == '"' || buf[s] == '\'')) {
            const char *cl = memchr(buf + s + 1, buf[s], to - s - 1);
            if (!cl)
                return false;
            e = (size_t)(cl - buf) + 1;
        } else {
            while (e < to && !strchr(",}]#\r\n", buf[e]))
                e++;
            while (e > s && (buf[e - 1] == ' ' || buf[e - 1] == '\t'))
                e--;
        }
        if (e == s)
            return false; /* "key:" with the value on the next lines: not a scalar here */
        *v0 = s;
        *v1 = e;
        return true;
    }
    return false;
}

/* buf with [a, b) replaced by ins (malloc'd; NULL: no memory). */
static char *splice(const char *buf, size_t len, size_t a, size_t b, const char *ins, size_t *out_len)
{
    size_t il = strlen(ins), n = len - (b - a) + il;
    char *o = malloc(n + 1);
    if (!o)
        return NULL;
    memcpy(o, buf, a);
    memcpy(o + a, ins, il);
    memcpy(o + a + il, buf + b, len - b);
    o[n] = '\0';
    *out_len = n;
    return o;
}

/* The first character of the document's content (comments, blank lines and "---" skipped). */
static long content_start(const char *buf, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t e = i;
        while (e < len && buf[e] != '\n')
            e++;
        size_t s = i;
        while (s < e && isspace((unsigned char)buf[s]))
            s++;
        bool skip = s == e || buf[s] == '#' || (e - s >= 3 && !strncmp(buf + s, "---", 3));
        if (!skip)
            return (long)s;
        i = e + 1;
    }
    return -1;
}

static enum mp_status apply_one(char **buf, size_t *len, const struct mp_recipe_change *c, const char *path,
                                struct mp_diag *d)
{
    char *o = NULL;
    size_t n = 0;
    if (c->line) {
        long a = line_start(*buf, *len, c->line);
        const char *nl = a >= 0 ? memchr(*buf + a, '\n', *len - (size_t)a) : NULL;
        size_t b = nl ? (size_t)(nl - *buf) : *len, v0, v1;
        if (a < 0 || !find_value(*buf, (size_t)a, b, c->key, &v0, &v1))
            return mp_fail(d, MP_ERR_MODEL, "%s:%u: %s: not a 'KEY: VALUE' memplan can change in place: set it "
                                            "to %s by hand", path, c->line, c->key, c->to);
        char v[80];
        char q = (*buf)[v0];
        if (q == '"' || q == '\'')
            snprintf(v, sizeof v, "%c%s%c", q, c->to, q);
        else
            snprintf(v, sizeof v, "%s", c->to);
        o = splice(*buf, *len, v0, v1, v, &n);
    } else {
        long s = content_start(*buf, *len);
        char ins[160];
        if (s >= 0 && (*buf)[s] == '{') { /* JSON or a flow mapping: first in it */
            size_t p = (size_t)s + 1, q = p;
            while (q < *len && isspace((unsigned char)(*buf)[q]))
                q++;
            snprintf(ins, sizeof ins, "\"%s\": %s%s", c->key, c->to, q < *len && (*buf)[q] == '}' ? "" : ", ");
            o = splice(*buf, *len, p, p, ins, &n);
        } else { /* a block mapping: last in it */
            bool nl = *len && (*buf)[*len - 1] != '\n';
            snprintf(ins, sizeof ins, "%s%s: %s\n", nl ? "\n" : "", c->key, c->to);
            o = splice(*buf, *len, *len, *len, ins, &n);
        }
    }
    if (!o)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    free(*buf);
    *buf = o;
    *len = n;
    return MP_OK;
}

static enum mp_status write_all(const char *path, const char *buf, size_t len, struct mp_diag *d)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return mp_fail(d, MP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    bool ok = fwrite(buf, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok) {
        remove(path);
        return mp_fail(d, MP_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    return MP_OK;
}

enum mp_status mp_recipe_write(const struct mp_recipe *r, enum mp_trainer t, const struct mp_recipe_change *ch,
                               size_t n, const char *out_path, struct mp_diag *d)
{
    char *buf = NULL;
    size_t len = 0;
    enum mp_status st = mp_read_file(r->path, (size_t)64 << 20, "a recipe", &buf, &len, d);
    if (st != MP_OK)
        return st;
    for (size_t i = 0; i < n && st == MP_OK; i++)
        st = apply_one(&buf, &len, &ch[i], r->path, d);
    /* written beside OUT first, read back, then moved over it: a failure leaves OUT as it was */
    char tmp[4096];
    if (st == MP_OK && snprintf(tmp, sizeof tmp, "%s.memplan-tmp", out_path) >= (int)sizeof tmp)
        st = mp_fail(d, MP_ERR_IO, "%s: path too long", out_path);
    if (st == MP_OK)
        st = write_all(tmp, buf, len, d);
    free(buf);
    if (st != MP_OK)
        return st;
    struct mp_recipe *back = calloc(1, sizeof *back);
    if (!back) {
        remove(tmp);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    }
    struct mp_diag d2 = {{0}};
    st = mp_recipe_read_as(tmp, (int)r->format, t, back, &d2);
    for (size_t i = 0; i < n && st == MP_OK; i++)
        if (strcmp(back->s[ch[i].id].value, ch[i].to) != 0)
            st = mp_fail(&d2, MP_ERR_INTERNAL, "%s reads back %s '%s', not the plan's %s", out_path,
                         mp_recipe_setting_option(ch[i].id), back->s[ch[i].id].value, ch[i].to);
    free(back);
    if (st != MP_OK) {
        remove(tmp);
        return mp_fail(d, st == MP_ERR_INTERNAL ? MP_ERR_INTERNAL : MP_ERR_MODEL, "--write-recipe: %s not written: %s",
                       out_path, d2.msg);
    }
    if (rename(tmp, out_path) != 0) {
        int e = errno;
        remove(tmp);
        return mp_fail(d, MP_ERR_IO, "%s: cannot write: %s", out_path, strerror(e));
    }
    return MP_OK;
}
