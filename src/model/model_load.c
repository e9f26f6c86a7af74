/* model_load.c — model files: read, parse (json.h: mp_json_parse, RFC 8259), dispatch to the
 * memplan-JSON or HF reader.  The check that the layers chain (mp_program_check) is the ir's:
 * mp_model_load_*() (ir/model_check.c) call these, then it.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_read.h" /* the readers */

#define MP_FILE_MAX (64u << 20)

static enum mp_status read_string(struct mp_model *m, const char *text, size_t len, const char *path,
                                  const struct mp_model_request *rq, struct mp_diag *d)
{
    mp_model_init(m);
    snprintf(m->path, sizeof m->path, "%s", path);
    cJSON *root;
    enum mp_status st = mp_json_parse(text, len, path, &root, d);
    if (st != MP_OK)
        return st;
    if (!cJSON_IsObject(root))
        st = mp_fail(d, MP_ERR_MODEL, "%s: expected a JSON object at the top level", path);
    else if (rq && (rq->head >= 0 || rq->num_labels) && !mp_json_is_hf(root))
        st = mp_fail(d, MP_ERR_MODEL, "%s: --%s applies to a Hugging Face config.json (a memplan model names its "
                     "head layers itself)", path, rq->head >= 0 ? "head" : "num-labels");
    else if (rq && rq->images && !mp_json_is_hf(root))
        st = mp_fail(d, MP_ERR_MODEL, "%s: --images applies to a multimodal checkpoint's config.json (Gemma 3); this "
                     "is a memplan model", path);
    else if (mp_json_is_hf(root)) {
        if ((st = rq ? mp_hf_apply_request(root, rq, path, d) : MP_OK) == MP_OK)
            st = mp_model_from_hf(m, root, path, d);
        if (st == MP_OK && rq && rq->images)
            st = mp_hf_add_images(m, rq->images, rq->image_h, rq->image_w, d);
    } else
        st = mp_model_from_memplan(m, root, path, d);
    cJSON_Delete(root);
    if (st == MP_OK)
        mp_model_mark_copies(m); /* (the program check skips copies of copies by their period) */
    if (st != MP_OK)
        mp_model_release(m);
    return st;
}

enum mp_status mp_model_read_string(struct mp_model *m, const char *text, size_t len, const char *path,
                                    struct mp_diag *d)
{
    return read_string(m, text, len, path, NULL, d);
}

enum mp_status mp_model_read_file(struct mp_model *m, const char *path, struct mp_diag *d)
{
    return mp_model_read_file_as(m, path, NULL, d);
}

enum mp_status mp_model_read_file_as(struct mp_model *m, const char *path, const struct mp_model_request *rq,
                                     struct mp_diag *d)
{
    mp_model_init(m);
    char *buf;
    size_t n;
    enum mp_status st = mp_read_file(path, MP_FILE_MAX, "a model file", &buf, &n, d);
    if (st != MP_OK)
        return st;
    st = read_string(m, buf, n, path, rq, d);
    free(buf);
    return st;
}


enum mp_status mp_checkpoint_index_total(const char *path, uint64_t *total, struct mp_diag *d)
{
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    enum mp_status st = mp_read_file(path, (size_t)1 << 28, "checkpoint index", &text, &len, d);
    if (st == MP_OK && (st = mp_json_parse(text, len, path, &root, d)) == MP_OK) {
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
        if (!cJSON_IsObject(meta))
            st = mp_fail(d, MP_ERR_MODEL, "%s: metadata: expected an object", path);
        else
            st = mp_json_u64(meta, "total_size", true, UINT64_C(1) << 53, total, path, "metadata.", d);
    }
    cJSON_Delete(root);
    free(text);
    return st;
}
