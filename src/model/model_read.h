/* model_read.h — the two model readers, behind mp_model_read_*() (model_load.c), which
 * parse with json/json.h.  Internal to src/model/.  Each reader fills an initialised model
 * and calls mp_model_validate() last; messages are "path: place: problem" with place a JSON
 * path like layers[3].heads.
 */
#ifndef MEMPLAN_MODEL_READ_H
#define MEMPLAN_MODEL_READ_H

#include <cjson/cJSON.h>

#include "json/json.h"
#include "model.h"

/* True when root looks like a Hugging Face config.json (has "model_type" and no "layers"). */
bool mp_json_is_hf(const cJSON *root);

enum mp_status mp_model_from_memplan(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d);
enum mp_status mp_model_from_hf(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d);
/* Rewrites root as the user's request asks (model.h struct mp_model_request): architectures[0]
 * becomes the family's class of the head asked, num_labels the classes asked (id2label and
 * label2id dropped, as transformers' num_labels= does).  Refuses, naming the option, a head the
 * family's transformers classes do not have and classes for a head without them. */
enum mp_status mp_hf_apply_request(cJSON *root, const struct mp_model_request *rq, const char *path,
                                   struct mp_diag *d);

/* Mllama's cross-attention decoder layers (MllamaCrossAttentionDecoderLayer), idle in a text-only
 * step: how many, and the text model's sizes they are built with. */
struct mp_hf_cross {
    uint64_t layers, hidden, heads, kv_heads, head_dim, ffn;
};

/* A multimodal checkpoint's vision tower and projector (model_type gemma3, qwen2_5_vl, qwen2_vl,
 * mistral3, mllama), from root's vision_config, and for mllama the cross-attention layers of
 * cross: their parameters and Linears, and the tower an image step runs (vis: Gemma 3's SigLIP)
 * (model_hf_vision.c). */
enum mp_status mp_hf_vision_modules(const cJSON *root, const char *type, uint64_t text_hidden,
                                    const struct mp_hf_cross *cross, struct mp_idle *v, struct mp_vision *vis,
                                    const char *path, struct mp_diag *d);
/* --images n: the vision tower of the multimodal checkpoint m runs on n images per sample: its
 * blocks go before the text model's (model_hf_vision.c), m->idle is cleared (the tower's
 * parameters are now the blocks'), m->images = n.  MP_ERR_MODEL naming the option for a model
 * without a vision tower or one whose image step is not modelled.  rq->image_h x image_w:
 * --image-size in pixels (0 x 0: the model's default). */
enum mp_status mp_hf_add_images(struct mp_model *m, const struct mp_model_request *rq, struct mp_diag *d);

/* The keys of memplan JSON's layers (model_keys.c): one row per key and the types that take it. */
enum mp_key_kind {
    MP_KEY_DIM,   /* a positive integer (at most MP_DIM_MAX) */
    MP_KEY_COUNT, /* a non-negative integer (at most MP_DIM_MAX; an unsigned field: at most 64) */
    MP_KEY_BOOL,
    MP_KEY_PROB,  /* a probability in [0, 1) */
    MP_KEY_REAL,  /* a positive finite number; 0 in the field means absent */
    MP_KEY_ENUM,  /* one of names[], stored as its index */
    MP_KEY_ACT,   /* an activation (mp_act_parse) */
    MP_KEY_IMPL,  /* an attention implementation (mp_attn_impl_parse); sets attn.impl_set */
};
struct mp_key {
    const char *key;
    unsigned types;            /* bit t: layer type t takes it */
    enum mp_key_kind kind;
    bool own;                  /* read by the type's code in model_json.c (its defaults, its checks);
                                  else read into the field by the generic loop */
    size_t off, size;          /* the struct mp_layer field it sets (size 0: none, derived) */
    const char *const *names;  /* MP_KEY_ENUM: the values, by index, NULL-terminated */
    const char *deflt, *doc;   /* docs/model-format.md's default and meaning cells */
};
extern const struct mp_key mp_keys[];
extern const size_t mp_n_keys;
/* The type under whose heading docs/model-format.md lists the row (its first type). */
enum mp_layer_type mp_key_home(const struct mp_key *k);
/* The keys a layer of type t accepts besides "type" and "name", space-separated into out. */
void mp_json_layer_keys(enum mp_layer_type t, char *out, size_t cap);

/* Largest dimension any reader accepts (2^40): keeps every product of a few dims in 64 bits
 * checkable and rejects 10^15-wide layers with a clear message. */
#define MP_DIM_MAX (UINT64_C(1) << 40)
#define MP_REPEAT_MAX 100000u
#define MP_NEST_MAX 8

#endif
