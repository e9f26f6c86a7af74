/* model_hf.c — reads a Hugging Face config.json into struct mp_model.
 *
 * Supported model_type values: gpt2, llama, mistral, qwen2, gpt_neox, phi
 * (phi-1/1.5/2), gemma and bert (lowered as BertForMaskedLM).  Causal models
 * are lowered as their *ForCausalLM class.  Missing optional fields take the
 * defaults of the transformers config class, so parameter counts equal what
 * transformers instantiates.  Fields that would change memory in a way the
 * model cannot express are rejected, never silently dropped.  cJSON stays here.
 */
#include <stdio.h>
#include <string.h>

#include "model_read.h"

/* Lowering convention (layers.c relies on it):
 *   block 0 "embed":  EMBEDDING (vocab, hidden)
 *                     [EMBEDDING "token_type_embeddings" (type_vocab_size, hidden)]   bert: its
 *                      input is the hidden state, not token ids; it adds a lookup of the
 *                      all-zero token_type_ids (BertEmbeddings' buffer)
 *                     [POS_EMBEDDING (positions, hidden)]        gpt2, bert
 *                     [LAYERNORM (hidden)]                        bert
 *                     [DROPOUT p]                                 when the embedding dropout p > 0
 *   blocks 1..N "h.i": one TRANSFORMER_BLOCK each, repeat_group 1
 *   last block "head": [final LAYERNORM / RMSNORM]               all but bert
 *                      [LINEAR, ACTIVATION, LAYERNORM]           bert's MLM transform
 *                      LM_HEAD (vocab, hidden, tied, bias): logits + cross-entropy
 *
 * Default sequence: seq_len = min(max positions, 2048).  The position count is
 * what the model can take; 2048 keeps the default run of long-context models
 * (Mistral 32768, Qwen2 131072) at a length people fine-tune with; --seq
 * overrides it.  A rope model without max_position_embeddings gets 2048 (every
 * transformers default for these classes is at least 2048); gpt2 and bert
 * tables default to 1024 and 512 rows, as in GPT2Config and BertConfig.
 *
 * Ignored on purpose, because they do not change training memory:
 *   rope_theta, rotary_emb_base, rope_scaling, rope_parameters (except its
 *     partial_rotary_factor for gpt_neox/phi): values of cos/sin, same shapes;
 *   sliding_window, use_sliding_window, max_window_layers: a mask over the same
 *     scores; SDPA/flash save the same tensors;
 *   *_eps, initializer_range, bos/eos/pad_token_id, scale_attn_weights,
 *     scale_attn_by_inverse_layer_idx, pretraining_tp: values or scalars only;
 *   torch_dtype, dtype: the checkpoint's storage; --precision decides training dtypes;
 *   use_cache: memplan assumes use_cache=False, as training with checkpointing forces (with
 *     use_cache=True a gpt2/gpt_neox forward saves fresh k/v copies: bench/torch_saved.md);
 *   gradient_checkpointing: memplan plans checkpointing itself;
 *   architectures, summary_*, task_specific_params, classifier_dropout,
 *     n_special, predict_special_tokens: heads memplan does not train (it
 *     trains the LM head); architectures[0] only names the model;
 *   head_dim for gpt2, gpt_neox and bert, attention_bias for mistral and qwen2,
 *     num_key_value_heads for gpt2, gpt_neox and bert: their transformers classes ignore them;
 *   n_ctx (gpt2): legacy; transformers sizes wpe by n_positions alone;
 *   _attn_implementation: the --attention option chooses the kernel.
 * Rejected when set to a non-default value: add_cross_attention,
 * reorder_and_upcast_attn (gpt2), qk_layernorm (phi), position_embedding_type
 * other than "absolute" (bert).
 */

#define HF_SEQ_DEFAULT 2048u
#define HF_LAYERS_MAX MP_REPEAT_MAX

enum family { F_GPT2, F_LLAMA, F_MISTRAL, F_QWEN2, F_NEOX, F_PHI, F_GEMMA, F_BERT, F_COUNT };

static const char *const family_names[F_COUNT] = {"gpt2", "llama", "mistral", "qwen2",
                                                  "gpt_neox", "phi", "gemma", "bert"};
#define HF_SUPPORTED "gpt2, llama, mistral, qwen2, gpt_neox, phi, gemma, bert"

/* The config after the transformers defaults: everything the lowering needs. */
struct hf {
    enum family f;
    uint64_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
    uint64_t positions;    /* max positions; 0 = not given (rope models only) */
    uint64_t type_vocab;   /* bert token types */
    uint64_t rotary_dim;   /* 0 = whole head */
    enum mp_act act;
    enum mp_norm norm;
    bool learned_pos, rope, gated, fused_qkv, qkv_bias, out_bias, mlp_bias, lm_bias;
    bool tied, causal, parallel, shared_norm, post_norm;
    double emb_p, attn_p, resid_p;
};

/* ---- field readers ---------------------------------------------------------------- */

static bool present(const cJSON *root, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    return v && !cJSON_IsNull(v);
}

/* First of keys[] present in root, else keys[0] (the name a "missing" message uses). */
static const char *first_key(const cJSON *root, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (present(root, keys[i]))
            return keys[i];
    return keys[0];
}

/* A positive integer at most max.  Absent and not required leaves *out untouched. */
static enum mp_status read_pos(const cJSON *root, const char *key, bool required, uint64_t max, uint64_t *out,
                               const char *path, struct mp_diag *d)
{
    uint64_t v = 0;
    enum mp_status st = mp_json_u64(root, key, required, max, &v, path, "", d);
    if (st != MP_OK || !present(root, key))
        return st;
    if (v == 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: expected a positive integer", path, key);
    *out = v;
    return MP_OK;
}

/* A fraction in (0, 1]. */
static enum mp_status read_fraction(const cJSON *obj, const char *key, double *out, const char *path,
                                    const char *where, struct mp_diag *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return MP_OK;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0.0 && v->valuedouble <= 1.0))
        return mp_fail(d, MP_ERR_MODEL, "%s: %s%s%s: expected a number in (0, 1]", path, where, *where ? "." : "",
                       key);
    *out = v->valuedouble;
    return MP_OK;
}

/* An activation name; absent leaves *out untouched. */
static enum mp_status read_act(const cJSON *root, const char *key, enum mp_act *out, const char *path,
                               struct mp_diag *d)
{
    enum mp_status st;
    const char *s = mp_json_str(root, key, &st, path, "", d);
    if (st != MP_OK || !s)
        return st;
    int a = mp_act_parse(s);
    if (a < 0)
        return mp_fail(d, MP_ERR_MODEL,
                       "%s: %s: '%s' is not a supported activation (supported: gelu, gelu_new, gelu_fast, "
                       "gelu_pytorch_tanh, relu, silu, swish, tanh, sigmoid)",
                       path, key, s);
    *out = (enum mp_act)a;
    return MP_OK;
}

/* A flag whose true value changes the model in a way memplan does not express. */
static enum mp_status reject_true(const cJSON *root, const char *key, const char *why, const char *path,
                                  struct mp_diag *d)
{
    bool v = false;
    enum mp_status st = mp_json_bool(root, key, &v, path, "", d);
    if (st != MP_OK)
        return st;
    if (v)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: true is not supported (%s)", path, key, why);
    return MP_OK;
}

/* ---- reading the config ------------------------------------------------------------- */

/* Per-family facts: defaults of the transformers config classes and the module layout. */
static void family_defaults(struct hf *c)
{
    enum family f = c->f;
    bool llama_like = f == F_LLAMA || f == F_MISTRAL || f == F_QWEN2 || f == F_GEMMA;
    c->causal = f != F_BERT;
    c->learned_pos = f == F_GPT2 || f == F_BERT;
    c->rope = !c->learned_pos;
    c->gated = llama_like;
    c->norm = llama_like ? MP_NORM_RMSNORM : MP_NORM_LAYERNORM;
    c->fused_qkv = f == F_GPT2 || f == F_NEOX;
    /* Biases: GPT-2 Conv1D, NeoX, phi and BERT linears all have them; Qwen2 only on q/k/v. */
    bool all = f == F_GPT2 || f == F_NEOX || f == F_PHI || f == F_BERT;
    c->qkv_bias = all || f == F_QWEN2;
    c->out_bias = all;
    c->mlp_bias = all;
    /* phi's lm_head; BERT's decoder bias, one vocab vector (transformers 5 keeps a second,
     * unused one when the decoder is untied; 4.x links the two) */
    c->lm_bias = f == F_PHI || f == F_BERT;
    c->tied = f == F_GPT2 || f == F_GEMMA || f == F_BERT;
    c->parallel = f == F_NEOX || f == F_PHI;
    c->shared_norm = f == F_PHI;
    c->post_norm = f == F_BERT;
    c->type_vocab = 2;
    switch (f) {
    case F_GPT2: c->act = MP_ACT_GELU_NEW; break;   /* gelu_new */
    case F_PHI: c->act = MP_ACT_GELU_NEW; break;    /* gelu_new */
    case F_GEMMA: c->act = MP_ACT_GELU_TANH; break; /* gelu_pytorch_tanh */
    case F_NEOX:
    case F_BERT: c->act = MP_ACT_GELU; break;
    default: c->act = MP_ACT_SILU; break;
    }
    if (f == F_GPT2 || f == F_BERT) /* GPT2Config / BertConfig default every dropout to 0.1 */
        c->emb_p = c->attn_p = c->resid_p = 0.1;
    if (c->learned_pos) /* n_positions / max_position_embeddings defaults: the table's rows */
        c->positions = f == F_GPT2 ? 1024 : 512;
}

/* The size fields shared by every family. */
static enum mp_status read_sizes(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    static const char *const k_hidden[] = {"n_embd", "hidden_size"};
    static const char *const k_layers[] = {"n_layer", "num_hidden_layers"};
    static const char *const k_heads[] = {"n_head", "num_attention_heads"};
    static const char *const k_pos_gpt2[] = {"n_positions", "max_position_embeddings"};
    bool gpt2 = c->f == F_GPT2;
    const char *hk = gpt2 ? first_key(root, k_hidden, 2) : "hidden_size";
    const char *lk = gpt2 ? first_key(root, k_layers, 2) : "num_hidden_layers";
    const char *ak = gpt2 ? first_key(root, k_heads, 2) : "num_attention_heads";
    const char *pk = gpt2 ? first_key(root, k_pos_gpt2, 2) : "max_position_embeddings";
    enum mp_status st;
    if ((st = read_pos(root, "vocab_size", true, MP_DIM_MAX, &c->vocab, path, d)) != MP_OK ||
        (st = read_pos(root, hk, true, MP_DIM_MAX, &c->hidden, path, d)) != MP_OK ||
        (st = read_pos(root, lk, true, HF_LAYERS_MAX, &c->layers, path, d)) != MP_OK ||
        (st = read_pos(root, ak, true, MP_DIM_MAX, &c->heads, path, d)) != MP_OK ||
        (st = read_pos(root, pk, false, MP_DIM_MAX, &c->positions, path, d)) != MP_OK)
        return st;
    if (gpt2) {
        c->ffn = 4 * c->hidden; /* n_inner: null means 4 * n_embd */
        st = read_pos(root, "n_inner", false, MP_DIM_MAX, &c->ffn, path, d);
    } else {
        st = read_pos(root, "intermediate_size", true, MP_DIM_MAX, &c->ffn, path, d);
    }
    if (st != MP_OK)
        return st;

    /* Key/value heads: an explicit null means "as many as heads" in every class; an absent
     * key takes the class default (MistralConfig 8, Qwen2Config 32, GemmaConfig 16). */
    bool gqa = c->f == F_LLAMA || c->f == F_MISTRAL || c->f == F_QWEN2 || c->f == F_PHI || c->f == F_GEMMA;
    c->kv_heads = c->heads;
    if (gqa && !cJSON_GetObjectItemCaseSensitive(root, "num_key_value_heads"))
        c->kv_heads = c->f == F_MISTRAL ? 8 : c->f == F_QWEN2 ? 32 : c->f == F_GEMMA ? 16 : c->heads;
    if (gqa && (st = read_pos(root, "num_key_value_heads", false, MP_DIM_MAX, &c->kv_heads, path, d)) != MP_OK)
        return st;
    if (c->kv_heads > c->heads || c->heads % c->kv_heads != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: num_key_value_heads: %llu does not divide %s %llu", path,
                       (unsigned long long)c->kv_heads, ak, (unsigned long long)c->heads);

    /* head_dim: read by the same classes (gpt2, gpt_neox and bert ignore it); GemmaConfig
     * defaults it to 256, the others to hidden / heads. */
    if (gqa && present(root, "head_dim"))
        return read_pos(root, "head_dim", true, MP_DIM_MAX, &c->head_dim, path, d);
    if (c->f == F_GEMMA) {
        c->head_dim = 256;
        return MP_OK;
    }
    if (c->hidden % c->heads != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: %llu does not divide %s %llu", path, ak,
                       (unsigned long long)c->heads, hk, (unsigned long long)c->hidden);
    c->head_dim = c->hidden / c->heads;
    return MP_OK;
}

/* Partial rotary embeddings: rope_parameters.partial_rotary_factor wins over the legacy key. */
static enum mp_status read_rotary(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    if (c->f != F_NEOX && c->f != F_PHI)
        return MP_OK;
    const char *legacy = c->f == F_NEOX ? "rotary_pct" : "partial_rotary_factor";
    double frac = c->f == F_NEOX ? 0.25 : 0.5;
    const char *key = legacy;
    enum mp_status st = read_fraction(root, legacy, &frac, path, "", d);
    if (st != MP_OK)
        return st;
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (cJSON_IsObject(rp) && present(rp, "partial_rotary_factor")) {
        key = "rope_parameters.partial_rotary_factor";
        if ((st = read_fraction(rp, "partial_rotary_factor", &frac, path, "rope_parameters", d)) != MP_OK)
            return st;
    }
    /* transformers: rotary_ndims = int(head_dim * factor) */
    uint64_t r = (uint64_t)((double)c->head_dim * frac);
    if (r == 0 || r % 2 != 0)
        return mp_fail(d, MP_ERR_MODEL, "%s: %s: %g of head_dim %llu gives %llu rotary dimensions (expected an even "
                       "positive number)", path, key, frac, (unsigned long long)c->head_dim, (unsigned long long)r);
    c->rotary_dim = r == c->head_dim ? 0 : r;
    return MP_OK;
}

/* Activation, biases, dropouts, residual layout, tying: the family-specific keys. */
static enum mp_status read_options(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    enum mp_status st = MP_OK;
    switch (c->f) {
    case F_GPT2:
        if ((st = read_act(root, "activation_function", &c->act, path, d)) != MP_OK ||
            (st = mp_json_prob(root, "embd_pdrop", &c->emb_p, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "attn_pdrop", &c->attn_p, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "resid_pdrop", &c->resid_p, path, "", d)) != MP_OK ||
            (st = reject_true(root, "add_cross_attention", "cross-attention layers are not modelled", path, d)) !=
                MP_OK ||
            (st = reject_true(root, "reorder_and_upcast_attn", "the fp32 reordered attention is not modelled",
                              path, d)) != MP_OK)
            return st;
        break;
    case F_LLAMA:
    case F_MISTRAL:
    case F_QWEN2:
    case F_GEMMA:
        if (c->f == F_GEMMA) {
            /* Gemma's released configs say hidden_act "gelu" but mean the tanh approximation
             * (transformers rewrites it); hidden_activation, where given, wins. */
            const cJSON *ha = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
            bool legacy_gelu = cJSON_IsString(ha) && strcmp(ha->valuestring, "gelu") == 0;
            if (!legacy_gelu && (st = read_act(root, "hidden_act", &c->act, path, d)) != MP_OK)
                return st;
            if ((st = read_act(root, "hidden_activation", &c->act, path, d)) != MP_OK)
                return st;
            bool bidir = false;
            if ((st = mp_json_bool(root, "use_bidirectional_attention", &bidir, path, "", d)) != MP_OK)
                return st;
            c->causal = !bidir;
        } else if ((st = read_act(root, "hidden_act", &c->act, path, d)) != MP_OK) {
            return st;
        }
        if (c->f == F_LLAMA || c->f == F_GEMMA) {
            bool ab = false, mb = false;
            if ((st = mp_json_bool(root, "attention_bias", &ab, path, "", d)) != MP_OK)
                return st;
            c->qkv_bias = c->out_bias = ab;
            if (c->f == F_LLAMA && (st = mp_json_bool(root, "mlp_bias", &mb, path, "", d)) != MP_OK)
                return st;
            c->mlp_bias = mb;
        }
        if ((st = mp_json_prob(root, "attention_dropout", &c->attn_p, path, "", d)) != MP_OK)
            return st;
        break;
    case F_NEOX: {
        bool ab = true;
        if ((st = read_act(root, "hidden_act", &c->act, path, d)) != MP_OK ||
            (st = mp_json_bool(root, "use_parallel_residual", &c->parallel, path, "", d)) != MP_OK ||
            (st = mp_json_bool(root, "attention_bias", &ab, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "attention_dropout", &c->attn_p, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "hidden_dropout", &c->resid_p, path, "", d)) != MP_OK)
            return st;
        c->qkv_bias = c->out_bias = ab; /* query_key_value and dense; the MLP always has biases */
        c->emb_p = c->resid_p;          /* GPTNeoXModel.emb_dropout uses hidden_dropout */
        break;
    }
    case F_PHI:
        if ((st = read_act(root, "hidden_act", &c->act, path, d)) != MP_OK ||
            (st = mp_json_prob(root, "embd_pdrop", &c->emb_p, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "attention_dropout", &c->attn_p, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "resid_pdrop", &c->resid_p, path, "", d)) != MP_OK ||
            (st = reject_true(root, "qk_layernorm", "per-head q/k layernorms are not modelled", path, d)) != MP_OK)
            return st;
        break;
    case F_BERT: {
        enum mp_status sst;
        const char *pet = mp_json_str(root, "position_embedding_type", &sst, path, "", d);
        if (sst != MP_OK)
            return sst;
        if (pet && strcmp(pet, "absolute") != 0)
            return mp_fail(d, MP_ERR_MODEL,
                           "%s: position_embedding_type: '%s' is not supported (supported: absolute)", path, pet);
        bool dec = false;
        if ((st = read_act(root, "hidden_act", &c->act, path, d)) != MP_OK ||
            (st = read_pos(root, "type_vocab_size", false, MP_DIM_MAX, &c->type_vocab, path, d)) != MP_OK ||
            (st = mp_json_prob(root, "hidden_dropout_prob", &c->resid_p, path, "", d)) != MP_OK ||
            (st = mp_json_prob(root, "attention_probs_dropout_prob", &c->attn_p, path, "", d)) != MP_OK ||
            (st = mp_json_bool(root, "is_decoder", &dec, path, "", d)) != MP_OK ||
            (st = reject_true(root, "add_cross_attention", "cross-attention layers are not modelled", path, d)) !=
                MP_OK)
            return st;
        c->emb_p = c->resid_p; /* BertEmbeddings.dropout uses hidden_dropout_prob */
        c->causal = dec;
        break;
    }
    case F_COUNT:
        break;
    }
    return mp_json_bool(root, "tie_word_embeddings", &c->tied, path, "", d);
}

static enum mp_status read_config(const cJSON *root, struct hf *c, const char *path, struct mp_diag *d)
{
    family_defaults(c);
    enum mp_status st;
    if ((st = read_sizes(root, c, path, d)) != MP_OK || (st = read_rotary(root, c, path, d)) != MP_OK)
        return st;
    return read_options(root, c, path, d);
}

/* ---- lowering ------------------------------------------------------------------------ */

static void set_name(struct mp_layer *l, const char *name) { snprintf(l->name, sizeof l->name, "%s", name); }

static void norm_layer(struct mp_layer *l, const struct hf *c, const char *name)
{
    l->type = c->norm == MP_NORM_RMSNORM ? MP_LT_RMSNORM : MP_LT_LAYERNORM;
    l->norm = c->norm;
    l->norm_bias = c->norm == MP_NORM_LAYERNORM;
    l->dim = c->hidden;
    set_name(l, name);
}

static enum mp_status add_embed(struct mp_model *m, const struct hf *c, struct mp_diag *d)
{
    static const char *const tok_names[F_COUNT] = {"wte", "embed_tokens", "embed_tokens", "embed_tokens",
                                                   "embed_in", "embed_tokens", "embed_tokens", "word_embeddings"};
    bool bert = c->f == F_BERT;
    size_t n = 1u + (c->learned_pos ? 1u : 0u) + (bert ? 2u : 0u) + (c->emb_p > 0 ? 1u : 0u);
    struct mp_block *b = mp_model_add_block(m, "embed", n);
    if (!b)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    struct mp_layer *l = b->layers;
    l->type = MP_LT_EMBEDDING;
    l->vocab = c->vocab;
    l->dim = c->hidden;
    set_name(l++, tok_names[c->f]);
    if (bert) { /* BertEmbeddings: words + token types (ids default to zeros) + positions */
        l->type = MP_LT_EMBEDDING;
        l->vocab = c->type_vocab;
        l->dim = c->hidden;
        set_name(l++, "token_type_embeddings");
    }
    if (c->learned_pos) {
        l->type = MP_LT_POS_EMBEDDING;
        l->vocab = c->positions;
        l->dim = c->hidden;
        set_name(l++, bert ? "position_embeddings" : "wpe");
    }
    if (bert)
        norm_layer(l++, c, "LayerNorm");
    if (c->emb_p > 0) {
        l->type = MP_LT_DROPOUT;
        l->p = c->emb_p;
        set_name(l, bert ? "dropout" : "drop");
    }
    return MP_OK;
}

static enum mp_status add_blocks(struct mp_model *m, const struct hf *c, struct mp_diag *d)
{
    for (uint64_t i = 0; i < c->layers; i++) {
        char name[32];
        snprintf(name, sizeof name, "h.%llu", (unsigned long long)i);
        struct mp_block *b = mp_model_add_block(m, name, 1);
        if (!b)
            return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
        b->repeat_group = 1;
        struct mp_layer *l = b->layers;
        l->type = MP_LT_TRANSFORMER_BLOCK;
        l->dim = c->hidden;
        l->heads = c->heads;
        l->kv_heads = c->kv_heads;
        l->head_dim = c->head_dim;
        l->causal = c->causal;
        l->qkv_bias = c->qkv_bias;
        l->out_bias = c->out_bias;
        l->fused_qkv = c->fused_qkv;
        l->rope = c->rope;
        l->rotary_dim = c->rotary_dim;
        l->impl = MP_ATTN_SDPA;
        l->impl_set = false;
        l->attn_dropout = c->attn_p;
        l->ffn = c->ffn;
        l->act = c->act;
        l->gated = c->gated;
        l->mlp_bias = c->mlp_bias;
        l->norm = c->norm;
        l->norm_bias = c->norm == MP_NORM_LAYERNORM;
        l->p = c->resid_p;
        l->parallel_residual = c->parallel;
        l->shared_norm = c->parallel && c->shared_norm;
        l->post_norm = c->post_norm;
    }
    return MP_OK;
}

static enum mp_status add_head(struct mp_model *m, const struct hf *c, struct mp_diag *d)
{
    static const char *const norm_names[F_COUNT] = {"ln_f", "norm", "norm", "norm", "final_layer_norm",
                                                    "final_layernorm", "norm", ""};
    bool bert = c->f == F_BERT;
    struct mp_block *b = mp_model_add_block(m, "head", bert ? 4 : 2);
    if (!b)
        return mp_fail(d, MP_ERR_NOMEM, "%s: out of memory", m->path);
    struct mp_layer *l = b->layers;
    if (bert) { /* BertPredictionHeadTransform: dense, act, LayerNorm */
        l->type = MP_LT_LINEAR;
        l->in_features = l->out_features = c->hidden;
        l->bias = true;
        set_name(l++, "transform.dense");
        l->type = MP_LT_ACTIVATION;
        l->act = c->act;
        set_name(l++, "transform.act");
        norm_layer(l++, c, "transform.LayerNorm");
    } else {
        norm_layer(l++, c, norm_names[c->f]);
    }
    l->type = MP_LT_LM_HEAD;
    l->vocab = c->vocab;
    l->dim = c->hidden;
    l->tied = c->tied;
    l->bias = c->lm_bias;
    set_name(l, bert ? "decoder" : c->f == F_NEOX ? "embed_out" : "lm_head");
    return MP_OK;
}

/* ---- entry points -------------------------------------------------------------------- */

bool mp_json_is_hf(const cJSON *root)
{
    /* any model_type (even a wrong one: the HF reader says what it expected) or an
     * architectures list marks a config.json, unless memplan's own "layers" is there */
    return (cJSON_GetObjectItemCaseSensitive(root, "model_type") ||
            cJSON_GetObjectItemCaseSensitive(root, "architectures")) &&
           !cJSON_GetObjectItemCaseSensitive(root, "layers");
}

/* Model name: _name_or_path, else architectures[0], else model_type. */
static enum mp_status set_model_name(struct mp_model *m, const cJSON *root, const char *type, const char *path,
                                     struct mp_diag *d)
{
    enum mp_status st;
    const char *name = mp_json_str(root, "_name_or_path", &st, path, "", d);
    if (st != MP_OK)
        return st;
    if (!name || !*name) {
        const cJSON *arch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "architectures"), 0);
        name = cJSON_IsString(arch) && *arch->valuestring ? arch->valuestring : type;
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    return MP_OK;
}

enum mp_status mp_model_from_hf(struct mp_model *m, const cJSON *root, const char *path, struct mp_diag *d)
{
    enum mp_status st;
    const char *type = mp_json_str(root, "model_type", &st, path, "", d);
    if (st != MP_OK)
        return st;
    if (!type)
        return mp_fail(d, MP_ERR_MODEL, "%s: model_type: missing (expected one of: " HF_SUPPORTED ")", path);
    struct hf c;
    memset(&c, 0, sizeof c);
    c.f = F_COUNT;
    for (int i = 0; i < F_COUNT; i++)
        if (strcmp(type, family_names[i]) == 0)
            c.f = (enum family)i;
    if (c.f == F_COUNT)
        return mp_fail(d, MP_ERR_MODEL, "%s: model_type: '%s' is not supported (supported: " HF_SUPPORTED ")", path,
                       type);
    if ((st = read_config(root, &c, path, d)) != MP_OK)
        return st;

    snprintf(m->source, sizeof m->source, "hf");
    snprintf(m->hf_type, sizeof m->hf_type, "%s", type);
    if ((st = set_model_name(m, root, type, path, d)) != MP_OK)
        return st;
    m->input = MP_INPUT_TOKENS;
    m->seq_len = c.positions ? mp_min_u64(c.positions, HF_SEQ_DEFAULT) : HF_SEQ_DEFAULT;
    if ((st = add_embed(m, &c, d)) != MP_OK || (st = add_blocks(m, &c, d)) != MP_OK ||
        (st = add_head(m, &c, d)) != MP_OK)
        return st;
    return mp_model_validate(m, d);
}
