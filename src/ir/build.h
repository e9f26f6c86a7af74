/* build.h — the builder shared by the lowering files of src/ir/ (internal: not included outside src/ir/).
 *
 * layers.c lowers a model into the tensor program (layers.h), one block at a time; the
 * lower_*.c files lower one area each on the node and tensor machinery of build.c.
 *
 * Each lower_<type>() takes the incoming value (tensor id + logical shape) and
 * returns the outgoing one, appending tensors, nodes and parameters.  What a
 * node saves follows PyTorch autograd (docs/memory-facts.md#saved-tensors) and autocast (docs/memory-facts.md#autocast):
 * amp keeps fp32 parameters and an fp32 residual stream, every Linear/Conv
 * casts its input to the half dtype (a new, saved copy when the input is
 * fp32) and saves a half copy of its weight; norms, softmax and the loss run
 * in fp32.  Shape letters: b batch, s sequence, h hidden, a heads, d head dim,
 * F ffn width, V vocabulary, M = b*s rows.  Pure: no I/O.
 */
#ifndef MEMPLAN_IR_BUILD_H
#define MEMPLAN_IR_BUILD_H

#include "layers.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- builder ------------------------------------------------------------------- */

struct val {
    int t;                              /* tensor id */
    int rank;
    uint64_t shape[MP_TENSOR_RANK_MAX]; /* logical shape (views change it, not the storage) */
};

struct bld {
    struct mp_program *p;
    const struct mp_model *m;
    struct mp_diag *d;
    enum mp_status st;
    int block;
    const struct mp_layer *layer;
    char prefix[96];  /* name prefix of the current op */
    int embed_param;  /* first embedding table (tied lm_head) */
    int rope_cos_sin; /* the model's rotary cos/sin tables (created by the first rope node), or -1 */
    int rope_pair;    /* interleaved rotary: the current layer's cos/sin pair (made by its q rope), or -1 */
    int attn_mask;    /* the model's (b, 1, s, s) attention mask (created by the first attention), or -1 */
    int pos_tables;   /* GPT-J: the per-layer sinusoid buffers, one resident tensor for all layers, or -1 */
    /* T5: the encoder output (read by every cross-attention), the current stack's position bias
     * (1, a, q, k), the decoder's cross-attention bias (zeros) and eager causal mask, or -1 */
    int enc_out, pos_bias, cross_bias, dec_mask;
    bool dec_started; /* T5: the first decoder block has been lowered */
    uint64_t s_enc;   /* T5: the encoder's length (B->s is the decoder's once the decoder starts) */
    uint64_t b, s;
    bool amp;         /* autocast on (amp-bf16, amp-fp16, bf16-amp) */
    bool amp_f32;     /* autocast over fp32 weights (amp-*): the residual stream, rotary tables and
                       * T5's position bias are fp32; under bf16-amp they are bf16 */
    bool in_adapter;  /* lowering a LoRA adapter: its Linears are trainable fp32, never quantized */
    bool no_lora;     /* the Linear is a module peft cannot adapt (an MoE router's bare Parameter) */
    bool trained;     /* the current block's own parameters train (full, or freeze-selected) */
    bool vision;      /* lowering a layer of the vision tower (--images): its Linears carry SigLIP's names */
    /* --images: the input_ids and token_type_ids (resident, like the batch) and the text model's
     * batch and length (b and s are the images' while the vision tower is lowered), or -1 / 0 */
    int ids, type_ids;
    uint64_t text_b, text_s;
    struct val inputs_embeds; /* --images: the text embedding's output, made before the tower */
    /* --images, Mllama: aspect_ratio_ids (b x images int64, resident), the projector's
     * cross-attention states (b, images x tiles x patches, hidden), the kept float cross-attention
     * mask and full_text_row_masked_out_mask, or -1; mllama_crossed: a cross-attention layer is lowered */
    int ar_ids, cross_states, cross_mask, row_mask;
    bool mllama_crossed;
    struct mp_tensor scratch; /* what T() gives for the id of a step that failed */
};

/* Names of tensors, nodes and parameters: "prefix.name" (or name alone without a prefix),
 * cut at MP_NAME_MAX - 1 bytes, kept in chunks the program owns.  One allocation per
 * chunk instead of a fixed array in every tensor, node and parameter: a 100,000-block
 * model has millions of them. */
#define MP_NAME_MAX 96
#define NAME_CHUNK_BYTES 65536

struct mp_name_chunk {
    struct mp_name_chunk *next;
    size_t used;
    char text[NAME_CHUNK_BYTES];
};

/* build.c */
bool failed(const struct bld *B);
void fail_model(struct bld *B, enum mp_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void overflow(struct bld *B);
bool grow(void **arr, size_t *cap, size_t need, size_t elem);
const char *store_name(struct bld *B, const char *prefix, const char *name);
const char *name_of(struct bld *B, const char *name);
uint64_t mul(struct bld *B, uint64_t a, uint64_t b);
uint64_t add(struct bld *B, uint64_t a, uint64_t b);
struct val new_val(struct bld *B, const char *name, enum mp_dtype dt, int rank, const uint64_t *shape,
                   bool needs_grad);
int new_flat(struct bld *B, const char *name, enum mp_dtype dt, uint64_t n);
struct mp_node *new_node(struct bld *B, enum mp_prim prim, const char *name);
void save(struct mp_node *n, int t);
void hold_to_last(struct bld *B, int t);
void extra_as(struct mp_node *n, int t, enum mp_xrole role);
void tmp_parts(struct bld *B, struct mp_node *n, bool bwd, int count, const enum mp_trole *roles,
               const uint64_t *bytes);
void tmp_one(struct bld *B, struct mp_node *n, bool bwd, enum mp_trole role, uint64_t bytes);
bool saved_module(const struct bld *B);
int new_param(struct bld *B, const char *name, uint64_t rows, uint64_t cols, bool matmul);
struct mp_tensor *T(struct bld *B, int t);
enum mp_dtype dt_of(struct bld *B, struct val v);
bool ng(struct bld *B, struct val v);
uint64_t last_dim(struct val v);
uint64_t rows_of(struct val v);
uint64_t val_elems(struct bld *B, struct val v);
enum mp_dtype promote(enum mp_dtype a, enum mp_dtype b);
void with_prefix(struct bld *B, const char *base, const char *part, char *save_buf);
void restore_prefix(struct bld *B, const char *save_buf);
struct val like(struct bld *B, const char *name, struct val v, enum mp_dtype dt, bool needs_grad);
struct val with_last(struct bld *B, const char *name, struct val v, uint64_t last, enum mp_dtype dt,
                     bool needs_grad);
bool width_ok(struct bld *B, struct val x, uint64_t dim, const char *field, const char *name);
struct mp_node *matmul_node(struct bld *B, enum mp_prim prim, const char *name, struct val xin, struct val y,
                            int w, int bias);
uint64_t round_up(uint64_t v, uint64_t m);
void retype(struct bld *B, struct val v, enum mp_dtype dt);
void held_tensor(struct bld *B, int t, int release);
void unsave(struct mp_node *n, int t);

/* lower_elementwise.c */
struct val lower_copy(struct bld *B, struct val x, enum mp_dtype dt, double scale, const char *name);
int id_buffer(struct bld *B, const char *name, uint64_t rows);
struct val mult_copy(struct bld *B, struct val x, const struct mp_layer *l, const char *name);
struct val cast_to(struct bld *B, struct val x, enum mp_dtype dt, const char *name);
struct val autocast_in(struct bld *B, struct val x, const char *name);
struct val lower_act(struct bld *B, struct val x, enum mp_act act, bool inplace, const char *name);
struct val lower_dropout(struct bld *B, struct val x, double p, const char *name);
struct val lower_add(struct bld *B, struct val a, struct val b, const char *name);
struct val lower_clamp(struct bld *B, struct val x, const char *name);
struct val lower_mul(struct bld *B, struct val a, struct val b, const char *name);

/* lower_linear.c */
const struct mp_quant *base_quant(struct bld *B, bool head);
struct val lower_linear_p(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, bool bias,
                          const char *name, int tied);
struct val lower_linear(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, bool bias,
                        const char *name);

/* lower_norm.c */
struct val lower_rmsnorm(struct bld *B, struct val x, uint64_t dim, bool f32w, const char *name);
/* Llama 4's weightless L2 norm of q or k per head (lower_norm.c). */
struct val lower_l2_norm(struct bld *B, struct val x, uint64_t dim, const char *name);
struct val lower_norm(struct bld *B, struct val x, const struct mp_layer *l, enum mp_norm kind,
                      uint64_t dim, const char *name);

/* lower_attention.c */
struct val lower_attention(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                           const char *name);

/* lower_mlp.c */
struct val lower_mlp(struct bld *B, struct val x, const struct mp_layer *l, uint64_t hidden,
                     const char *name);

/* lower_t5.c */
struct val lower_t5_norm(struct bld *B, struct val x, uint64_t dim, const char *name);
struct val lower_t5_block(struct bld *B, struct val x, const struct mp_layer *l);
struct val lower_t5_decoder_embed(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);

/* lower_embed_head.c */
struct val lower_loss(struct bld *B, struct val logits, const char *name, bool upcast, bool shift);
struct val lower_add_table(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, uint64_t k,
                           bool embedding, struct mp_node **node);
struct val softcap_logits(struct bld *B, struct val z, const char *name);
struct val first_position(struct bld *B, struct val x, const char *name);
struct val pool_logits(struct bld *B, struct val z, const struct mp_layer *l, const char *name);
struct val lower_embedding(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, struct val *resid);
struct val lower_pos_embedding(struct bld *B, struct val x, const struct mp_layer *l, const char *nm,
                               struct val *resid);
struct val lower_lm_head(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_classifier(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);

/* lower_conv.c */
struct val lower_conv(struct bld *B, struct val x, uint64_t cin, uint64_t cout, uint64_t k, uint64_t stride,
                      uint64_t pad, uint64_t groups, bool bias, const char *name);
struct val lower_batchnorm(struct bld *B, struct val x, uint64_t c, const char *name);
struct val lower_pool(struct bld *B, struct val x, enum mp_prim prim, uint64_t k, uint64_t stride,
                      uint64_t pad, uint64_t oh, uint64_t ow, const char *name);
struct val lower_bottleneck(struct bld *B, struct val x, const struct mp_layer *l);
struct val lower_class_cat(struct bld *B, struct val x, const char *param);
struct val lower_patch_embedding(struct bld *B, struct val x, const struct mp_layer *l);

/* lower_vision.c (--images) */
struct val lower_token_pool(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_pixtral_patches(struct bld *B, struct val x, const struct mp_layer *l);
struct val lower_patch_merge(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_llama4_patches(struct bld *B, struct val x, const struct mp_layer *l);
struct val lower_pixel_shuffle(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_mm_projection(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_image_lookup(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_image_merge(struct bld *B, struct val x, const struct mp_layer *l, const char *nm,
                             struct val *resid);
struct val lower_patch_embed3d(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_merger_linear(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_mllama_patches(struct bld *B, struct val x, const struct mp_layer *l);
struct val lower_mllama_post(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_mllama_projector(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
struct val lower_tanh_gate(struct bld *B, struct val x, const char *name);
struct val lower_mllama_cross(struct bld *B, struct val x, const struct mp_layer *l);

/* lower_layer.c */
struct val lower_layer(struct bld *B, struct val x, const struct mp_layer *l, struct val *resid);

/* eager.c */
void eager_ops(struct bld *B, int k);

/* frozen.c */
void lower_idle(struct bld *B);
void apply_requires_grad(struct mp_program *p);
void parts_need_grad(struct mp_program *p);

/* After apply_requires_grad: the column sums' staging on the backward of each node whose trainable
 * bias or norm weight is summed over the tokens (mp_col_sum_staging), at the target's SM count. */
void col_sum_staging(struct bld *B);

#endif
