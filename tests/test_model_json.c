/* test_model_json.c — the memplan JSON reader (src/model/model_json.c).
 *
 * Parses every layer type and checks its fields and defaults, repeat expansion
 * (names, groups, nesting), the bad-input corpus in tests/data/bad (status and
 * exact message, cross-checked with its README), and the bundled models'
 * parameter counts, both from an independent formula over the parsed fields and
 * from mp_program_build.  Run from the repository root (make test-unit).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/layers.h"
#include "model/model.h"
#include "model/model_read.h"

#define BAD_DIR "tests/data/bad"
#define NEST_MAX 8 /* NEST_MAX of model_read.h, which only the readers include */

/* ---- helpers ----------------------------------------------------------------------- */

static enum mp_status load(const char *json, struct mp_model *m, struct mp_diag *d)
{
    memset(d, 0, sizeof *d);
    return mp_model_load_string(m, json, strlen(json), "t.json", d);
}

/* Loads json expecting failure with status st and message msg (exact). */
static void expect_error(const char *json, enum mp_status st, const char *msg)
{
    struct mp_model m;
    struct mp_diag d;
    enum mp_status got = load(json, &m, &d);
    if (got != st || strcmp(d.msg, msg) != 0)
        print_error("input: %s\nexpected %s: %s\ngot      %s: %s\n", json, mp_status_str(st), msg,
                    mp_status_str(got), d.msg);
    assert_int_equal(got, st);
    assert_string_equal(d.msg, msg);
    mp_model_release(&m);
}

/* Loads json expecting success (prints the diagnostic otherwise). */
static void expect_ok(const char *json, struct mp_model *m)
{
    struct mp_diag d;
    enum mp_status st = load(json, m, &d);
    if (st != MP_OK)
        print_error("input: %s\nerror: %s\n", json, d.msg);
    assert_int_equal(st, MP_OK);
}

static const struct mp_layer *layer_at(const struct mp_model *m, size_t block, size_t j)
{
    assert_true(block < m->n_blocks);
    assert_true(j < m->blocks[block].n_layers);
    return &m->blocks[block].layers[j];
}

/* Parameters of one layer, written from the PyTorch modules independently of layers.c. */
static uint64_t ref_layer_params(const struct mp_layer *l)
{
    uint64_t hd = l->head_dim, q = l->heads * hd, kv = l->kv_heads * hd, norm;
    uint64_t attn = l->dim * q + q * l->dim + 2 * l->dim * kv + (l->qkv_bias ? q + 2 * kv : 0) +
                    (l->out_bias ? l->dim : 0);
    uint64_t mlp = l->gated ? 3 * l->dim * l->ffn + (l->mlp_bias ? 2 * l->ffn + l->dim : 0)
                            : 2 * l->dim * l->ffn + (l->mlp_bias ? l->ffn + l->dim : 0);
    switch (l->type) {
    case MP_LT_EMBEDDING:
    case MP_LT_POS_EMBEDDING: return l->vocab * l->dim;
    case MP_LT_LINEAR: return l->in_features * l->out_features + (l->bias ? l->out_features : 0);
    case MP_LT_LAYERNORM: return l->dim * (l->norm_bias ? 2 : 1);
    case MP_LT_RMSNORM: return l->dim;
    case MP_LT_ATTENTION: return attn;
    case MP_LT_MLP: return mlp;
    case MP_LT_TRANSFORMER_BLOCK:
        norm = l->dim * (l->norm == MP_NORM_LAYERNORM && l->norm_bias ? 2 : 1);
        return attn + mlp + (l->shared_norm ? 1 : 2) * norm;
    case MP_LT_CONV2D:
        return l->out_ch * (l->in_ch / l->groups) * l->kernel * l->kernel + (l->bias ? l->out_ch : 0);
    case MP_LT_BATCHNORM2D: return 2 * l->in_ch;
    case MP_LT_BOTTLENECK:
        return l->in_ch * l->mid_ch + 2 * l->mid_ch + l->mid_ch * (l->mid_ch / l->groups) * 9 + 2 * l->mid_ch +
               l->mid_ch * l->out_ch + 2 * l->out_ch + (l->downsample ? l->in_ch * l->out_ch + 2 * l->out_ch : 0);
    case MP_LT_LM_HEAD: return (l->tied ? 0 : l->vocab * l->dim) + (l->bias ? l->vocab : 0);
    case MP_LT_CLASSIFIER: return l->in_features * l->vocab + (l->bias ? l->vocab : 0);
    case MP_LT_CUSTOM: return l->c_params;
    default: return 0;
    }
}

static uint64_t ref_params(const struct mp_model *m)
{
    uint64_t n = 0;
    for (size_t i = 0; i < m->n_blocks; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++)
            n += ref_layer_params(&m->blocks[i].layers[j]);
    return n;
}

/* The reader's fields and the lowering agree on the parameter count. */
static void assert_params_agree(const struct mp_model *m)
{
    struct mp_build_opts o;
    struct mp_program p;
    struct mp_diag d = {{0}};
    mp_build_opts_default(&o);
    enum mp_status st = mp_program_build(m, &o, &p, &d);
    if (st != MP_OK)
        print_error("%s\n", d.msg);
    assert_int_equal(st, MP_OK);
    uint64_t built = p.total_params;
    mp_program_release(&p);
    assert_int_equal(built, ref_params(m));
}

/* ---- every layer type, fields and defaults -------------------------------------------- */

static const char TOKEN_OPS[] =
    "{\"name\": \"ops\", \"input\": {\"tokens\": 8}, \"layers\": ["
    " {\"block\": \"embed\", \"layers\": ["
    "   {\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 64, \"dim\": 16},"
    "   {\"type\": \"pos_embedding\", \"max_positions\": 8},"
    "   {\"type\": \"dropout\"}]},"
    " {\"block\": \"attn\", \"layers\": ["
    "   {\"type\": \"layernorm\", \"dim\": 16, \"bias\": false},"
    "   {\"type\": \"attention\", \"dim\": 16, \"heads\": 4, \"kv_heads\": 2, \"rope\": true, \"rotary_dim\": 2,"
    "    \"impl\": \"flash\", \"causal\": false, \"attn_dropout\": 0.1, \"fused_qkv\": true, \"qkv_bias\": false},"
    "   {\"type\": \"residual\"}]},"
    " {\"block\": \"ffn\", \"layers\": ["
    "   {\"type\": \"rmsnorm\", \"dim\": 16},"
    "   {\"type\": \"mlp\", \"dim\": 16, \"ffn\": 48, \"gated\": true, \"bias\": false},"
    "   {\"type\": \"residual\"}]},"
    " {\"block\": \"proj\", \"layers\": ["
    "   {\"type\": \"linear\", \"in_features\": 16, \"out_features\": 32, \"bias\": false},"
    "   {\"type\": \"activation\", \"act\": \"relu\", \"inplace\": true},"
    "   {\"type\": \"linear\", \"in_features\": 32, \"out_features\": 16}]},"
    " {\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2},"
    " {\"type\": \"lm_head\", \"bias\": true}]}";

static void test_parse_token_ops(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok(TOKEN_OPS, &m);
    assert_string_equal(m.name, "ops");
    assert_string_equal(m.source, "memplan");
    assert_int_equal(m.input, MP_INPUT_TOKENS);
    assert_int_equal(m.seq_len, 8);
    assert_int_equal(m.n_blocks, 6);

    const struct mp_layer *l = layer_at(&m, 0, 0);
    assert_int_equal(l->type, MP_LT_EMBEDDING);
    assert_string_equal(l->name, "wte");
    assert_int_equal(l->vocab, 64);
    assert_int_equal(l->dim, 16);
    l = layer_at(&m, 0, 1); /* dim defaults to the embedding's */
    assert_int_equal(l->type, MP_LT_POS_EMBEDDING);
    assert_int_equal(l->vocab, 8);
    assert_int_equal(l->dim, 16);
    assert_string_equal(l->name, "");
    l = layer_at(&m, 0, 2); /* nn.Dropout's default */
    assert_int_equal(l->type, MP_LT_DROPOUT);
    assert_float_equal(l->p, 0.5, 0);

    l = layer_at(&m, 1, 0);
    assert_int_equal(l->type, MP_LT_LAYERNORM);
    assert_int_equal(l->norm, MP_NORM_LAYERNORM);
    assert_false(l->norm_bias);
    l = layer_at(&m, 1, 1);
    assert_int_equal(l->type, MP_LT_ATTENTION);
    assert_int_equal(l->heads, 4);
    assert_int_equal(l->kv_heads, 2);
    assert_int_equal(l->head_dim, 4);
    assert_true(l->rope);
    assert_int_equal(l->rotary_dim, 2);
    assert_true(l->impl_set);
    assert_int_equal(l->impl, MP_ATTN_FLASH);
    assert_false(l->causal);
    assert_float_equal(l->attn_dropout, 0.1, 1e-12);
    assert_true(l->fused_qkv);
    assert_false(l->qkv_bias);
    assert_true(l->out_bias); /* "bias" defaults to true */
    assert_int_equal(layer_at(&m, 1, 2)->type, MP_LT_RESIDUAL);

    l = layer_at(&m, 2, 0);
    assert_int_equal(l->type, MP_LT_RMSNORM);
    assert_int_equal(l->norm, MP_NORM_RMSNORM);
    assert_int_equal(l->dim, 16);
    l = layer_at(&m, 2, 1);
    assert_int_equal(l->type, MP_LT_MLP);
    assert_int_equal(l->ffn, 48);
    assert_true(l->gated);
    assert_int_equal(l->act, MP_ACT_SILU); /* gated default */
    assert_false(l->mlp_bias);

    l = layer_at(&m, 3, 0);
    assert_int_equal(l->type, MP_LT_LINEAR);
    assert_int_equal(l->in_features, 16);
    assert_int_equal(l->out_features, 32);
    assert_false(l->bias);
    l = layer_at(&m, 3, 1);
    assert_int_equal(l->type, MP_LT_ACTIVATION);
    assert_int_equal(l->act, MP_ACT_RELU);
    assert_true(l->inplace);
    assert_true(layer_at(&m, 3, 2)->bias); /* nn.Linear default */

    l = layer_at(&m, 5, 0); /* untied head: vocab/dim from the embedding */
    assert_int_equal(l->type, MP_LT_LM_HEAD);
    assert_false(l->tied);
    assert_true(l->bias);
    assert_int_equal(l->vocab, 64);
    assert_int_equal(l->dim, 16);
    assert_string_equal(m.blocks[5].name, "lm_head");
    assert_params_agree(&m);
    mp_model_release(&m);
}

static void test_defaults_transformer_block(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok(TOKEN_OPS, &m);
    const struct mp_layer *l = layer_at(&m, 4, 0);
    assert_int_equal(l->type, MP_LT_TRANSFORMER_BLOCK);
    assert_string_equal(m.blocks[4].name, "transformer_block");
    assert_string_equal(l->name, "");
    assert_int_equal(l->dim, 16);
    assert_int_equal(l->heads, 2);
    assert_int_equal(l->kv_heads, 2);
    assert_int_equal(l->head_dim, 8);
    assert_int_equal(l->ffn, 64);
    assert_int_equal(l->act, MP_ACT_GELU);
    assert_false(l->gated);
    assert_true(l->causal);
    assert_true(l->qkv_bias);
    assert_true(l->out_bias);
    assert_true(l->mlp_bias);
    assert_int_equal(l->norm, MP_NORM_LAYERNORM);
    assert_true(l->norm_bias);
    assert_false(l->fused_qkv);
    assert_false(l->rope);
    assert_int_equal(l->rotary_dim, 0);
    assert_false(l->impl_set);
    assert_float_equal(l->p, 0.0, 0);
    assert_float_equal(l->attn_dropout, 0.0, 0);
    assert_false(l->parallel_residual);
    assert_false(l->shared_norm);
    assert_false(l->post_norm);
    mp_model_release(&m);

    /* Llama-style: rmsnorm has no bias; gated defaults to silu; explicit head_dim need not divide. */
    expect_ok("{\"input\": {\"tokens\": 4}, \"layers\": ["
              " {\"type\": \"embedding\", \"vocab\": 32, \"dim\": 12},"
              " {\"type\": \"transformer_block\", \"dim\": 12, \"heads\": 5, \"head_dim\": 4, \"kv_heads\": 1,"
              "  \"norm\": \"rmsnorm\", \"gated\": true, \"ffn\": 20, \"bias\": false, \"impl\": \"eager\","
              "  \"parallel_residual\": true, \"shared_norm\": true, \"p\": 0.2}]}",
              &m);
    l = layer_at(&m, 1, 0);
    assert_string_equal(m.name, "t");
    assert_int_equal(l->norm, MP_NORM_RMSNORM);
    assert_false(l->norm_bias);
    assert_int_equal(l->act, MP_ACT_SILU);
    assert_int_equal(l->head_dim, 4);
    assert_int_equal(l->kv_heads, 1);
    assert_false(l->qkv_bias || l->out_bias || l->mlp_bias);
    assert_true(l->impl_set);
    assert_int_equal(l->impl, MP_ATTN_EAGER);
    assert_true(l->parallel_residual && l->shared_norm);
    assert_float_equal(l->p, 0.2, 1e-12);
    assert_params_agree(&m);
    mp_model_release(&m);
}

static void test_parse_image_ops(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok("{\"input\": {\"shape\": [3, 32, 32]}, \"classes\": 10, \"layers\": ["
              " {\"block\": \"stem\", \"layers\": ["
              "   {\"type\": \"conv2d\", \"in_ch\": 3, \"out_ch\": 8, \"kernel\": 3, \"padding\": 1, \"bias\": false},"
              "   {\"type\": \"batchnorm2d\", \"channels\": 8},"
              "   {\"type\": \"activation\", \"act\": \"relu\", \"inplace\": true},"
              "   {\"type\": \"maxpool2d\", \"kernel\": 2}]},"
              " {\"type\": \"avgpool2d\", \"kernel\": 3, \"stride\": 1, \"padding\": 1},"
              " {\"type\": \"bottleneck\", \"in_ch\": 8, \"mid_ch\": 4, \"out_ch\": 16, \"stride\": 2},"
              " {\"type\": \"bottleneck\", \"in_ch\": 16, \"mid_ch\": 4},"
              " {\"block\": \"head\", \"layers\": ["
              "   {\"type\": \"adaptive_avgpool2d\", \"output_size\": 2},"
              "   {\"type\": \"flatten\"},"
              "   {\"type\": \"classifier\", \"in_features\": 64}]}]}",
              &m);
    assert_int_equal(m.input, MP_INPUT_IMAGE);
    assert_int_equal(m.channels, 3);
    assert_int_equal(m.height, 32);
    assert_int_equal(m.width, 32);
    assert_int_equal(m.labels_vocab, 10);
    assert_int_equal(m.n_blocks, 5);

    const struct mp_layer *l = layer_at(&m, 0, 0);
    assert_int_equal(l->type, MP_LT_CONV2D);
    assert_int_equal(l->in_ch, 3);
    assert_int_equal(l->out_ch, 8);
    assert_int_equal(l->kernel, 3);
    assert_int_equal(l->stride, 1);
    assert_int_equal(l->padding, 1);
    assert_int_equal(l->groups, 1);
    assert_false(l->bias);
    l = layer_at(&m, 0, 1);
    assert_int_equal(l->type, MP_LT_BATCHNORM2D);
    assert_int_equal(l->in_ch, 8);
    assert_int_equal(l->dim, 8);
    l = layer_at(&m, 0, 3);
    assert_int_equal(l->type, MP_LT_MAXPOOL2D);
    assert_int_equal(l->kernel, 2);
    assert_int_equal(l->stride, 2); /* defaults to the kernel */
    assert_int_equal(l->padding, 0);
    l = layer_at(&m, 1, 0);
    assert_int_equal(l->type, MP_LT_AVGPOOL2D);
    assert_int_equal(l->stride, 1);
    assert_int_equal(l->padding, 1);

    l = layer_at(&m, 2, 0);
    assert_int_equal(l->type, MP_LT_BOTTLENECK);
    assert_int_equal(l->stride, 2);
    assert_true(l->downsample); /* needed: stride 2 and 8 -> 16 channels */
    l = layer_at(&m, 3, 0);
    assert_int_equal(l->out_ch, 16); /* 4 x mid_ch */
    assert_int_equal(l->stride, 1);
    assert_false(l->downsample);

    l = layer_at(&m, 4, 0);
    assert_int_equal(l->type, MP_LT_ADAPTIVE_AVGPOOL2D);
    assert_int_equal(l->out_h, 2);
    assert_int_equal(l->out_w, 2);
    assert_int_equal(layer_at(&m, 4, 1)->type, MP_LT_FLATTEN);
    l = layer_at(&m, 4, 2);
    assert_int_equal(l->type, MP_LT_CLASSIFIER);
    assert_int_equal(l->in_features, 64);
    assert_int_equal(l->vocab, 10); /* the model's classes */
    assert_true(l->bias);
    assert_params_agree(&m);
    mp_model_release(&m);

    /* Adaptive pooling: [h, w] and out_h/out_w forms; the default is 1x1. */
    expect_ok("{\"input\": {\"shape\": [4, 8, 8]}, \"layers\": ["
              " {\"type\": \"adaptive_avgpool2d\", \"output_size\": [4, 2]},"
              " {\"type\": \"adaptive_avgpool2d\", \"out_h\": 2, \"out_w\": 1},"
              " {\"type\": \"adaptive_avgpool2d\"}]}",
              &m);
    assert_int_equal(layer_at(&m, 0, 0)->out_h, 4);
    assert_int_equal(layer_at(&m, 0, 0)->out_w, 2);
    assert_int_equal(layer_at(&m, 1, 0)->out_h, 2);
    assert_int_equal(layer_at(&m, 1, 0)->out_w, 1);
    assert_int_equal(layer_at(&m, 2, 0)->out_h, 1);
    assert_int_equal(layer_at(&m, 2, 0)->out_w, 1);
    mp_model_release(&m);
}

/* patch_embedding (ViT): conv 3 -> 64 with kernel = stride = 8 on a 32 x 32 image: 16 patches +
 * the class token = 17 positions.  Parameters by hand: conv 64*3*8*8 + 64, class token 64,
 * positions 17*64 = 13504 (ViTEmbeddings of the same sizes). */
static void test_parse_patch_embedding(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok("{\"input\": {\"shape\": [3, 32, 32]}, \"classes\": 10, \"layers\": ["
              " {\"type\": \"patch_embedding\", \"dim\": 64, \"patch\": 8},"
              " {\"type\": \"transformer_block\", \"dim\": 64, \"heads\": 4, \"ffn\": 96, \"causal\": false},"
              " {\"block\": \"head\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 64},"
              "   {\"type\": \"classifier\", \"in_features\": 64, \"pool\": \"first\"}]}]}",
              &m);
    const struct mp_layer *l = layer_at(&m, 0, 0);
    assert_int_equal(l->type, MP_LT_PATCH_EMBEDDING);
    assert_int_equal(l->in_ch, 3);
    assert_int_equal(l->kernel, 8);
    assert_true(l->cls_token);
    assert_int_equal(layer_at(&m, 2, 1)->pool, MP_POOL_FIRST);
    struct mp_build_opts o;
    struct mp_program p;
    struct mp_diag d = {{0}};
    mp_build_opts_default(&o);
    assert_int_equal(mp_program_build(&m, &o, &p, &d), MP_OK);
    assert_int_equal(p.blocks[0].params, 13504);
    assert_int_equal(p.tensors[p.blocks[1].output].shape[1], 17); /* the sequence after the embedding */
    assert_int_equal(p.total_params, 13504 + ref_layer_params(layer_at(&m, 1, 0)) + 128 + 650);
    mp_program_release(&p);
    mp_model_release(&m);
    expect_error("{\"input\": {\"tokens\": 16}, \"layers\": [{\"type\": \"patch_embedding\", \"dim\": 64, "
                 "\"patch\": 8}]}", MP_ERR_MODEL,
                 "t.json: layers[0].type: a patch_embedding needs an image input (input.shape [C, H, W])");
    expect_error("{\"input\": {\"shape\": [3, 32, 32]}, \"layers\": [{\"type\": \"patch_embedding\", "
                 "\"dim\": 64, \"patch\": 5}]}", MP_ERR_MODEL,
                 "t.json: layers[0].patch: 5 does not divide the image's 32 x 32");
    expect_error("{\"input\": {\"shape\": [3, 32, 32]}, \"classes\": 4, \"layers\": [{\"type\": \"flatten\"}, "
                 "{\"type\": \"classifier\", \"in_features\": 3072, \"pool\": \"last\"}]}", MP_ERR_MODEL,
                 "t.json: layers[1].pool: expected \"first\" or \"none\", got \"last\"");
}

static void test_parse_custom_and_inputs(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok("{\"input\": {\"bytes_per_sample\": 64}, \"layers\": ["
              " {\"type\": \"custom\", \"name\": \"a\", \"output_bytes\": 128},"
              " {\"type\": \"custom\", \"output_bytes\": 32, \"saved_bytes\": 96, \"params\": 7,"
              "  \"fwd_flops\": 1000, \"bwd_flops\": 2500}]}",
              &m);
    assert_int_equal(m.input, MP_INPUT_BYTES);
    assert_int_equal(m.bytes_per_sample, 64);
    const struct mp_layer *l = layer_at(&m, 0, 0);
    assert_string_equal(m.blocks[0].name, "a");
    assert_int_equal(l->type, MP_LT_CUSTOM);
    assert_int_equal(l->c_output_bytes, 128);
    assert_int_equal(l->c_saved_bytes, 128); /* defaults to the output */
    assert_int_equal(l->c_params, 0);
    assert_int_equal(l->c_fwd_flops, 0);
    assert_int_equal(l->c_bwd_flops, 0);
    l = layer_at(&m, 1, 0);
    assert_int_equal(l->c_saved_bytes, 96);
    assert_int_equal(l->c_params, 7);
    assert_int_equal(l->c_fwd_flops, 1000);
    assert_int_equal(l->c_bwd_flops, 2500);
    assert_params_agree(&m);
    mp_model_release(&m);

    expect_ok("{\"input\": {\"bytes_per_sample\": 8}, \"layers\": ["
              " {\"type\": \"custom\", \"output_bytes\": 8, \"fwd_flops\": 300}]}",
              &m);
    assert_int_equal(layer_at(&m, 0, 0)->c_bwd_flops, 600); /* 2 x fwd */
    mp_model_release(&m);

    /* A 1-D input shape is [1, 1, F]: linear layers act on the last dimension. */
    expect_ok("{\"input\": {\"shape\": [16]}, \"layers\": ["
              " {\"type\": \"linear\", \"in_features\": 16, \"out_features\": 4}]}",
              &m);
    assert_int_equal(m.input, MP_INPUT_IMAGE);
    assert_int_equal(m.channels, 1);
    assert_int_equal(m.height, 1);
    assert_int_equal(m.width, 16);
    mp_model_release(&m);
}

static void test_lm_head_tied_takes_embedding(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok("{\"input\": {\"tokens\": 4}, \"layers\": ["
              " {\"type\": \"embedding\", \"vocab\": 64, \"dim\": 16},"
              " {\"type\": \"lm_head\", \"tied\": true}]}",
              &m);
    const struct mp_layer *l = layer_at(&m, 1, 0);
    assert_true(l->tied);
    assert_false(l->bias);
    assert_int_equal(l->vocab, 64);
    assert_int_equal(l->dim, 16);
    assert_int_equal(ref_params(&m), 64 * 16);
    mp_model_release(&m);

    expect_error("{\"input\": {\"tokens\": 4}, \"layers\": ["
                 " {\"type\": \"embedding\", \"vocab\": 64, \"dim\": 16},"
                 " {\"type\": \"lm_head\", \"tied\": true, \"vocab\": 65}]}",
                 MP_ERR_MODEL, "t.json: layers[1].vocab: 65 differs from the tied embedding's vocab (64)");
    expect_error("{\"input\": {\"shape\": [16]}, \"layers\": ["
                 " {\"type\": \"lm_head\", \"dim\": 16}]}",
                 MP_ERR_MODEL, "t.json: layers[0].vocab: missing (expected a positive integer)");
}

/* ---- repeats: expansion, names, groups, nesting ------------------------------------------ */

#define LIN "{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 16}"
#define LIN_NAMED(n) "{\"type\": \"linear\", \"name\": \"" n "\", \"in_features\": 16, \"out_features\": 16}"
#define MODEL16(layers) "{\"input\": {\"shape\": [16]}, \"layers\": [" layers "]}"

static void assert_names(const struct mp_model *m, const char *const *names, size_t n)
{
    assert_int_equal(m->n_blocks, n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(m->blocks[i].name, names[i]);
}

static void test_repeat_expansion_names_groups(void **state)
{
    (void)state;
    struct mp_model m;

    expect_ok(MODEL16(LIN_NAMED("in") ", {\"repeat\": 3, \"layers\": [" LIN_NAMED("h") "]}, " LIN), &m);
    static const char *const a[] = {"in", "h.0", "h.1", "h.2", "linear"};
    assert_names(&m, a, 5);
    assert_int_equal(m.blocks[0].repeat_group, 0);
    assert_true(m.blocks[1].repeat_group > 0);
    assert_int_equal(m.blocks[2].repeat_group, m.blocks[1].repeat_group);
    assert_int_equal(m.blocks[3].repeat_group, m.blocks[1].repeat_group);
    assert_int_equal(m.blocks[4].repeat_group, 0);
    /* Each block owns a copy of the op. */
    assert_ptr_not_equal(m.blocks[1].layers, m.blocks[2].layers);
    assert_int_equal(layer_at(&m, 3, 0)->out_features, 16);
    mp_model_release(&m);

    /* Named repeat with one block: "h.i"; start offsets the index; unnamed ops take the type. */
    expect_ok(MODEL16("{\"repeat\": 2, \"name\": \"h\", \"start\": 5, \"layers\": [" LIN "]},"
                      " {\"repeat\": 2, \"layers\": [" LIN "]}"),
              &m);
    static const char *const b[] = {"h.5", "h.6", "linear.0", "linear.1"};
    assert_names(&m, b, 4);
    assert_true(m.blocks[0].repeat_group > 0);
    assert_true(m.blocks[2].repeat_group > 0);
    assert_int_not_equal(m.blocks[0].repeat_group, m.blocks[2].repeat_group);
    mp_model_release(&m);

    /* Named repeat with several blocks: "R.i.<block>"; one group for all of them. */
    expect_ok(MODEL16("{\"repeat\": 2, \"name\": \"enc\", \"layers\": [" LIN_NAMED("a") ","
                      " {\"block\": \"b\", \"layers\": [" LIN ", {\"type\": \"activation\", \"act\": \"tanh\"}]}]}"),
              &m);
    static const char *const c[] = {"enc.0.a", "enc.0.b", "enc.1.a", "enc.1.b"};
    assert_names(&m, c, 4);
    for (size_t i = 1; i < 4; i++)
        assert_int_equal(m.blocks[i].repeat_group, m.blocks[0].repeat_group);
    assert_int_equal(m.blocks[1].n_layers, 2);
    assert_int_equal(layer_at(&m, 3, 1)->act, MP_ACT_TANH);
    mp_model_release(&m);
}

/* The loader's chain check (mp_program_check) lowers only the first copies of a run of
 * identical blocks that give back the shape they take; it still finds a copy that gets a
 * shape it does not take (the second of three 16 -> 32 Linears) and a block after 2,000 copies
 * that does not take what they give. */
static void test_repeat_chain_checked(void **state)
{
    (void)state;
    expect_error(MODEL16("{\"repeat\": 3, \"name\": \"h\", \"layers\": [{\"type\": \"linear\", \"in_features\": 16,"
                         " \"out_features\": 32}]}"),
                 MP_ERR_MODEL, "t.json: h.1.linear: linear: in_features 16 does not match the incoming width 32");
    expect_error(MODEL16("{\"repeat\": 2000, \"name\": \"h\", \"layers\": [" LIN "]}, {\"type\": \"linear\","
                         " \"name\": \"out\", \"in_features\": 32, \"out_features\": 16}"),
                 MP_ERR_MODEL, "t.json: out.linear: linear: in_features 32 does not match the incoming width 16");
    struct mp_model m;
    expect_ok(MODEL16("{\"repeat\": 2000, \"name\": \"h\", \"layers\": [" LIN "]}, " LIN), &m);
    assert_int_equal(m.n_blocks, 2001);
    mp_model_release(&m);
}

static void test_repeat_nesting(void **state)
{
    (void)state;
    struct mp_model m;

    /* Unnamed in unnamed: indices outer first; one group per inner expansion. */
    expect_ok(MODEL16("{\"repeat\": 2, \"layers\": [{\"repeat\": 3, \"layers\": [" LIN_NAMED("fc") "]}]}"), &m);
    static const char *const a[] = {"fc.0.0", "fc.0.1", "fc.0.2", "fc.1.0", "fc.1.1", "fc.1.2"};
    assert_names(&m, a, 6);
    int g0 = m.blocks[0].repeat_group, g1 = m.blocks[3].repeat_group;
    assert_true(g0 > 0 && g1 > 0 && g0 != g1);
    assert_int_equal(m.blocks[2].repeat_group, g0);
    assert_int_equal(m.blocks[5].repeat_group, g1);
    mp_model_release(&m);

    /* Named in unnamed, named in named. */
    expect_ok(MODEL16("{\"repeat\": 2, \"layers\": [{\"repeat\": 2, \"name\": \"h\", \"layers\": [" LIN "]}]},"
                      "{\"repeat\": 2, \"name\": \"enc\", \"layers\": [{\"repeat\": 2, \"name\": \"l\", \"layers\": [" LIN
                      "]}]}"),
              &m);
    static const char *const b[] = {"h.0.0", "h.0.1", "h.1.0", "h.1.1", "enc.0.l.0", "enc.0.l.1", "enc.1.l.0",
                                    "enc.1.l.1"};
    assert_names(&m, b, 8);
    mp_model_release(&m);

    /* NEST_MAX (8) nested repeats are fine; one more is a range error at its place. */
    char json[4096], place[512];
    for (int depth = NEST_MAX; depth <= NEST_MAX + 1; depth++) {
        char inner[2048] = "";
        for (int i = 0; i < depth; i++)
            strcat(inner, "{\"repeat\": 2, \"layers\": [");
        strcat(inner, LIN);
        for (int i = 0; i < depth; i++)
            strcat(inner, "]}");
        snprintf(json, sizeof json, MODEL16("%s"), inner);
        if (depth == NEST_MAX) {
            expect_ok(json, &m);
            assert_int_equal(m.n_blocks, 1u << NEST_MAX);
            assert_string_equal(m.blocks[255].name, "linear.1.1.1.1.1.1.1.1");
            mp_model_release(&m);
        } else {
            char msg[640];
            strcpy(place, "layers[0]");
            for (int i = 0; i < NEST_MAX; i++)
                strcat(place, ".layers[0]");
            snprintf(msg, sizeof msg, "t.json: %s: repeats nested more than %d deep", place, NEST_MAX);
            expect_error(json, MP_ERR_RANGE, msg);
        }
    }
}

/* A model expands to at most 131,072 ops (a composite counting as one; docs/model-format.md), and a
 * repeat that would take it past that is refused, naming it, before any of it is made: nested
 * repeats of a few hundred bytes asked for a million GPT-2 blocks (19 GB, exit 5 out of memory). */
#define GROUP4 "{\"block\": \"b\", \"layers\": [" LIN ", " LIN ", " LIN ", " LIN "]}"
static void test_ops_limit(void **state)
{
    (void)state;
    struct mp_model m;
    /* 32,768 blocks of 4 ops: 131,072, the limit */
    expect_ok(MODEL16("{\"repeat\": 32768, \"layers\": [" GROUP4 "]}"), &m);
    assert_int_equal(m.n_blocks, 32768);
    mp_model_release(&m);
    expect_ok(MODEL16("{\"repeat\": 4, \"layers\": [{\"repeat\": 8192, \"layers\": [" GROUP4 "]}]}"), &m);
    assert_int_equal(m.n_blocks, 32768);
    mp_model_release(&m);
    static const char *const limit = " (memplan's limit on a model's ops, repeats expanded)";
    char msg[256];
    /* one op more, wherever it is */
    snprintf(msg, sizeof msg, "t.json: layers[0].repeat: 32769 repeats of 4 ops take the model over 131072 ops%s",
             limit);
    expect_error(MODEL16("{\"repeat\": 32769, \"layers\": [" GROUP4 "]}"), MP_ERR_RANGE, msg);
    snprintf(msg, sizeof msg, "t.json: layers[1].repeat: 32768 repeats of 4 ops take the model over 131072 ops%s",
             limit);
    expect_error(MODEL16(LIN ", {\"repeat\": 32768, \"layers\": [" GROUP4 "]}"), MP_ERR_RANGE, msg);
    snprintf(msg, sizeof msg, "t.json: layers[1]: the model has more than 131072 ops here%s", limit);
    expect_error(MODEL16("{\"repeat\": 32768, \"layers\": [" GROUP4 "]}, " LIN), MP_ERR_RANGE, msg);
    /* nested: the outer repeat is named, its body counted through the inner one (2 x 100,000
     * per iteration) */
    snprintf(msg, sizeof msg, "t.json: layers[0].repeat: 2 repeats of 200000 ops take the model over 131072 ops%s",
             limit);
    expect_error(MODEL16("{\"repeat\": 2, \"layers\": [{\"repeat\": 100000, \"layers\": [" LIN ", " LIN "]}]}"),
                 MP_ERR_RANGE, msg);
    /* eight levels of the largest repeat: more ops than 64 bits count, refused all the same */
    char json[1024] = "", inner[1024] = "";
    for (int i = 0; i < 8; i++)
        strcat(inner, "{\"repeat\": 100000, \"layers\": [");
    strcat(inner, LIN);
    for (int i = 0; i < 8; i++)
        strcat(inner, "]}");
    snprintf(json, sizeof json, MODEL16("%s"), inner);
    snprintf(msg, sizeof msg, "t.json: layers[0].repeat: 100000 repeats of %llu ops take the model over 131072 ops%s",
             (unsigned long long)UINT64_MAX, limit);
    expect_error(json, MP_ERR_RANGE, msg);
}

static void test_keys_ignored_and_rejected(void **state)
{
    (void)state;
    struct mp_model m;
    expect_ok("{\"_about\": 1, \"comment\": \"x\", \"comments\": [1],"
              " \"input\": {\"shape\": [16], \"_why\": \"\"},"
              " \"layers\": [{\"_x\": {\"bogus\": 1}, \"comment2\": 3, \"type\": \"linear\", \"in_features\": 16,"
              "  \"out_features\": 16},"
              "  {\"repeat\": 1, \"_n\": 0, \"layers\": [{\"block\": \"g\", \"comment\": \"\", \"layers\": [" LIN "]}]}]}",
              &m);
    assert_int_equal(m.n_blocks, 2);
    mp_model_release(&m);

    expect_error(MODEL16("{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 16, \"heads\": 2}"),
                 MP_ERR_MODEL, "t.json: layers[0].heads: unknown key for a linear layer");
    expect_error(MODEL16("{\"type\": \"linear\", \"in_feature\": 16, \"out_features\": 16}"), MP_ERR_MODEL,
                 "t.json: layers[0].in_feature: unknown key for a linear layer (did you mean \"in_features\"?)");
    expect_error(MODEL16("{\"type\": \"linear\", \"in_features\": 16, \"in_features\": 32, \"out_features\": 16}"),
                 MP_ERR_MODEL, "t.json: layers[0].in_features: duplicate key");
    expect_error("{\"input\": {\"shape\": [16]}, \"layer\": []}", MP_ERR_MODEL,
                 "t.json: layer: unknown key for a memplan model (did you mean \"layers\"?)");
    expect_error(MODEL16("{\"repeat\": 2, \"times\": 3, \"layers\": [" LIN "]}"), MP_ERR_MODEL,
                 "t.json: layers[0].times: unknown key for a repeat");
    expect_error(MODEL16("{\"block\": \"b\", \"name\": \"c\", \"layers\": [" LIN "]}"), MP_ERR_MODEL,
                 "t.json: layers[0].name: unknown key for a block");
    expect_error("{\"input\": {\"token\": 8}, \"layers\": [" LIN "]}", MP_ERR_MODEL,
                 "t.json: input.token: unknown key for the input (did you mean \"tokens\"?)");
    expect_error(MODEL16("{\"type\": \"linaer\", \"in_features\": 16, \"out_features\": 16}"), MP_ERR_MODEL,
                 "t.json: layers[0].type: unknown layer type \"linaer\" (did you mean \"linear\"?)");
}

/* Loads text of len bytes (NULs included) expecting status st and message msg. */
static void expect_error_len(const char *text, size_t len, enum mp_status st, const char *msg)
{
    struct mp_model m;
    struct mp_diag d = {{0}};
    enum mp_status got = mp_model_load_string(&m, text, len, "t.json", &d);
    if (got != st || strcmp(d.msg, msg) != 0)
        print_error("expected %s: %s\ngot      %s: %s\n", mp_status_str(st), msg, mp_status_str(got), d.msg);
    assert_int_equal(got, st);
    assert_string_equal(d.msg, msg);
    mp_model_release(&m);
}

/* Text cJSON takes but RFC 8259 (and Python's json) does not, or that cJSON would read as
 * something else: refused with the line and column (1-based, counted by hand below). */
static void test_json_text_refused(void **state)
{
    (void)state;
    /* \u0000: cJSON's strings end at the NUL, so "na\u0000me" would be read as "na" */
    expect_error("{\"na\\u0000me\": \"x\", \"input\": {\"shape\": [16]}, \"layers\": [" LIN "]}", MP_ERR_JSON,
                 "t.json:1:5: a \\u0000 (NUL) escape in a string is not supported");
    expect_error("{\"name\": \"a\\u0000b\", \"input\": {\"shape\": [16]}, \"layers\": [" LIN "]}", MP_ERR_JSON,
                 "t.json:1:12: a \\u0000 (NUL) escape in a string is not supported");
    expect_error("{\n  \"_c\": \"\\u0000\",\n  \"input\": {\"shape\": [16]}, \"layers\": [" LIN "]}", MP_ERR_JSON,
                 "t.json:2:10: a \\u0000 (NUL) escape in a string is not supported");
    /* an escaped backslash then "u0000" is six plain characters */
    struct mp_model m;
    expect_ok("{\"name\": \"a\\\\u0000\", \"input\": {\"shape\": [16]}, \"layers\": [" LIN "]}", &m);
    assert_string_equal(m.name, "a\\u0000");
    mp_model_release(&m);
    /* raw control bytes: inside a string (a NUL cut it too), or between tokens (cJSON skips
     * every byte up to a space) */
    static const char nul_key[] = "{\"na\0me\": 1}";
    expect_error_len(nul_key, sizeof nul_key - 1, MP_ERR_JSON,
                     "t.json:1:5: malformed JSON: a control character inside a string (JSON needs it escaped)");
    expect_error("{\"name\": \"a\tb\"}", MP_ERR_JSON,
                 "t.json:1:12: malformed JSON: a control character inside a string (JSON needs it escaped)");
    expect_error("{\"name\":\n\x01\"a\"}", MP_ERR_JSON, "t.json:2:1: malformed JSON: a control character outside a string");
    static const char nul_ws[] = "{\"name\": \"a\"}\0";
    expect_error_len(nul_ws, sizeof nul_ws - 1, MP_ERR_JSON,
                     "t.json:1:14: malformed JSON: a control character outside a string");
}

/* Nesting beyond cJSON's limit (1000 levels) is said as such, at the first bracket too deep. */
static void test_json_nesting_limit(void **state)
{
    (void)state;
    char text[4200];
    size_t n = 0;
    for (int i = 0; i < 1001; i++)
        text[n++] = '[';
    for (int i = 0; i < 1001; i++)
        text[n++] = ']';
    text[n] = '\0';
    expect_error(text, MP_ERR_JSON, "t.json:1:1001: nested deeper than 1000 levels");
    /* 1000 levels parse (and are then not a model) */
    memmove(text + 1000, text + 1001, 1001 + 1);
    text[2000] = '\0';
    expect_error(text, MP_ERR_MODEL, "t.json: expected a JSON object at the top level");
    n = 0;
    text[n++] = '{';
    memcpy(text + n, "\"a\":\n", 5);
    n += 5;
    for (int i = 0; i < 1000; i++)
        text[n++] = '[';
    for (int i = 0; i < 1000; i++)
        text[n++] = ']';
    text[n++] = '}';
    text[n] = '\0';
    expect_error(text, MP_ERR_JSON, "t.json:2:1000: nested deeper than 1000 levels");
    /* a syntax error before the deep part is reported as it is */
    n = 0;
    memcpy(text, "[1,,", 4);
    n = 4;
    for (int i = 0; i < 1001; i++)
        text[n++] = '[';
    text[n] = '\0';
    struct mp_model m;
    struct mp_diag d;
    assert_int_equal(load(text, &m, &d), MP_ERR_JSON);
    assert_non_null(strstr(d.msg, "malformed JSON"));
    assert_null(strstr(d.msg, "nested"));
}

static void test_errors_field_values(void **state)
{
    (void)state;
    static const struct {
        const char *json;
        enum mp_status st;
        const char *msg;
    } cases[] = {
        {MODEL16("{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 16, \"bias\": \"yes\"}"),
         MP_ERR_MODEL, "t.json: layers[0].bias: expected true or false"},
        {MODEL16("{\"type\": \"activation\", \"act\": \"gelu2\"}"), MP_ERR_MODEL,
         "t.json: layers[0].act: unknown activation \"gelu2\" (expected gelu, gelu_tanh, relu, silu, tanh, "
         "sigmoid, gelu_new, gelu_fast, relu2 or xielu)"},
        {MODEL16("{\"type\": \"activation\"}"), MP_ERR_MODEL,
         "t.json: layers[0].act: missing (expected gelu, gelu_tanh, relu, silu, tanh, sigmoid, gelu_new, gelu_fast, "
         "relu2 or xielu)"},
        {MODEL16("{\"type\": \"attention\", \"dim\": 16, \"heads\": 2, \"impl\": \"xformers\"}"), MP_ERR_MODEL,
         "t.json: layers[0].impl: unknown attention implementation \"xformers\" (expected eager, flash or sdpa)"},
        {MODEL16("{\"type\": \"attention\", \"dim\": 16, \"heads\": 2, \"rotary_dim\": 4}"), MP_ERR_MODEL,
         "t.json: layers[0].rotary_dim: needs \"rope\": true"},
        {MODEL16("{\"type\": \"attention\", \"dim\": 16, \"heads\": 2, \"rope\": true, \"rotary_dim\": 3}"),
         MP_ERR_MODEL, "t.json: layers[0].rotary_dim: 3 must be even and at most head_dim (8)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"norm\": \"batchnorm\"}"),
         MP_ERR_MODEL, "t.json: layers[0].norm: unknown norm \"batchnorm\" (expected layernorm or rmsnorm)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"norm\": \"rmsnorm\","
                 " \"norm_bias\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].norm_bias: rmsnorm has no bias"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"shared_norm\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].shared_norm: needs \"parallel_residual\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"post_norm\": true,"
                 " \"parallel_residual\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].post_norm: cannot be combined with parallel_residual"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16}"), MP_ERR_MODEL,
         "t.json: layers[0].heads: missing (expected a positive integer)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 0}"), MP_ERR_MODEL,
         "t.json: layers[0].heads: expected a positive integer"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"attn_dropout\": -0.1}"),
         MP_ERR_MODEL, "t.json: layers[0].attn_dropout: expected a probability in [0, 1)"},
        {"{\"input\": {\"tokens\": 8}, \"layers\": [{\"type\": \"embedding\", \"vocab\": 8, \"dim\": 4},"
         " {\"type\": \"pos_embedding\", \"max_positions\": 4}]}",
         MP_ERR_MODEL, "t.json: layers[1].max_positions: 4 is less than input.tokens (8)"},
        {"{\"input\": {\"shape\": [3, 8, 8]}, \"layers\": [{\"type\": \"conv2d\", \"in_ch\": 3, \"out_ch\": 8,"
         " \"kernel\": 3, \"groups\": 2}]}",
         MP_ERR_MODEL, "t.json: layers[0].groups: 2 must divide in_ch (3) and out_ch (8)"},
        {"{\"input\": {\"shape\": [3, 8, 8]}, \"layers\": [{\"type\": \"maxpool2d\", \"kernel\": 2, \"padding\": 2}]}",
         MP_ERR_MODEL, "t.json: layers[0].padding: 2 is more than half the kernel (2)"},
        {"{\"input\": {\"shape\": [8, 8, 8]}, \"layers\": [{\"type\": \"bottleneck\", \"in_ch\": 8, \"mid_ch\": 4,"
         " \"downsample\": false}]}",
         MP_ERR_MODEL,
         "t.json: layers[0].downsample: needed when stride is not 1 or in_ch (8) differs from out_ch (16)"},
        {"{\"input\": {\"shape\": [8, 8, 8]}, \"layers\": [{\"type\": \"adaptive_avgpool2d\", \"output_size\": [1]}]}",
         MP_ERR_MODEL, "t.json: layers[0].output_size: expected a positive integer or [h, w]"},
        {"{\"input\": {\"shape\": [8, 8, 8]}, \"layers\": [{\"type\": \"adaptive_avgpool2d\", \"output_size\": 1,"
         " \"out_h\": 1}]}",
         MP_ERR_MODEL, "t.json: layers[0].output_size: give either output_size or out_h/out_w, not both"},
        {MODEL16("{\"type\": \"classifier\", \"in_features\": 16}"), MP_ERR_MODEL,
         "t.json: layers[0].classes: missing (expected a positive integer)"},
        {"{\"input\": {\"shape\": [16]}, \"classes\": 10, \"layers\": [{\"type\": \"classifier\","
         " \"in_features\": 16, \"classes\": 9}]}",
         MP_ERR_MODEL, "t.json: layers[0].classes: 9 differs from the model's classes (10)"},
        {MODEL16("{\"type\": \"custom\", \"saved_bytes\": 4}"), MP_ERR_MODEL,
         "t.json: layers[0].output_bytes: missing (expected a positive integer)"},
        {MODEL16("{\"type\": \"custom\", \"output_bytes\": 4, \"fwd_flops\": 1e300}"), MP_ERR_RANGE,
         "t.json: layers[0].fwd_flops: 1e+300 is too large (at most 9007199254740992)"},
        {MODEL16("{\"repeat\": 0, \"layers\": [" LIN "]}"), MP_ERR_MODEL,
         "t.json: layers[0].repeat: expected a positive integer"},
        {MODEL16("{\"repeat\": 2, \"layers\": []}"), MP_ERR_MODEL,
         "t.json: layers[0].layers: expected a non-empty array of blocks"},
        {MODEL16("{\"layers\": [" LIN "]}"), MP_ERR_MODEL, "t.json: layers[0].block: missing (expected the block's name)"},
        {MODEL16("{\"block\": \"b\", \"layers\": [3]}"), MP_ERR_MODEL,
         "t.json: layers[0].layers[0]: expected an op object"},
        {MODEL16("{\"type\": 3}"), MP_ERR_MODEL, "t.json: layers[0].type: expected a string"},
        {MODEL16("{\"dim\": 3}"), MP_ERR_MODEL,
         "t.json: layers[0]: expected an op (\"type\"), a block (\"block\" + \"layers\") or a repeat (\"repeat\" + "
         "\"layers\")"},
        {MODEL16("7"), MP_ERR_MODEL, "t.json: layers[0]: expected an object (an op, a block or a repeat)"},
        {MODEL16("{\"type\": \"flatten\", \"name\": \"\"}"), MP_ERR_MODEL,
         "t.json: layers[0].name: expected a non-empty string"},
        {MODEL16("{\"type\": \"flatten\", \"name\": \"0123456789012345678901234567890123456789012345678901234567890123\"}"),
         MP_ERR_MODEL, "t.json: layers[0].name: longer than 63 characters"},
        {"{\"input\": {\"tokens\": 8, \"shape\": [3]}, \"layers\": [" LIN "]}", MP_ERR_MODEL,
         "t.json: input: expected exactly one of \"tokens\", \"shape\" and \"bytes_per_sample\""},
        {"{\"input\": {\"shape\": [1, 2, 3, 4]}, \"layers\": [" LIN "]}", MP_ERR_MODEL,
         "t.json: input.shape: expected [C, H, W] (or [H, W] or [F]) of positive integers"},
        {"{\"input\": {\"shape\": [3, 0, 2]}, \"layers\": [" LIN "]}", MP_ERR_MODEL,
         "t.json: input.shape[1]: expected a positive integer"},
        {"{\"input\": 8, \"layers\": [" LIN "]}", MP_ERR_MODEL,
         "t.json: input: expected an object: {\"tokens\": S}, {\"shape\": [C, H, W]} or {\"bytes_per_sample\": N}"},
        {"{\"input\": {\"shape\": [16]}, \"layers\": {}}", MP_ERR_MODEL, "t.json: layers: expected an array of layers"},
        {"{\"input\": {\"shape\": [16]}}", MP_ERR_MODEL, "t.json: layers: missing (expected an array of layers)"},
        {"{\"name\": 5, \"input\": {\"shape\": [16]}, \"layers\": [" LIN "]}", MP_ERR_MODEL,
         "t.json: name: expected a string"},
        {"{\"input\": {\"shape\": [16]}, \"layers\": [" LIN "], \"classes\": 1e13}", MP_ERR_RANGE,
         "t.json: classes: 10000000000000 is too large (at most 1099511627776)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 2000000, \"heads\": 1}"), MP_ERR_RANGE,
         "t.json: layers[0].heads: the projections are too large (at most 1099511627776 elements)"},
        {MODEL16("{\"type\": \"mlp\", \"dim\": 16, \"ffn\": 100000000000}"), MP_ERR_RANGE,
         "t.json: layers[0].ffn: the projections are too large (at most 1099511627776 elements)"},
        {MODEL16("{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 1099511627776}"), MP_ERR_RANGE,
         "t.json: layers[0].out_features: the weight is too large (at most 1099511627776 elements)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].json, cases[i].st, cases[i].msg);
}

/* ---- the bad-input corpus ------------------------------------------------------------------- */

static const struct bad_case {
    const char *file;
    enum mp_status st;
    const char *msg; /* exact, after "tests/data/bad/<file>" (JSON errors give ":line:col:") */
} bad_cases[] = {
    {"empty.json", MP_ERR_JSON, ": the file is empty"},
    {"not-json.json", MP_ERR_JSON, ":1:1: malformed JSON"},
    {"truncated.json", MP_ERR_JSON, ":3:34: malformed JSON"},
    {"leading-zero.json", MP_ERR_JSON, ":11:44: malformed JSON: a number with a leading zero"},
    {"top-level-array.json", MP_ERR_MODEL, ": expected a JSON object at the top level"},
    {"unknown-type.json", MP_ERR_MODEL, ": layers[1].type: unknown layer type \"lstm\""},
    {"heads-not-dividing.json", MP_ERR_MODEL, ": layers[1].heads: 5 does not divide dim (768); give head_dim"},
    {"kv-heads-not-dividing.json", MP_ERR_MODEL, ": layers[1].layers[0].kv_heads: 5 must divide heads (12)"},
    {"negative-dim.json", MP_ERR_MODEL, ": layers[0].dim: expected a positive integer"},
    {"float-dim.json", MP_ERR_MODEL, ": layers[0].dim: expected a positive integer"},
    {"string-dim.json", MP_ERR_MODEL, ": layers[1].heads: expected a positive integer"},
    {"huge-layer.json", MP_ERR_RANGE,
     ": layers[0].out_features: 1000000000000000 is too large (at most 1099511627776)"},
    {"repeat-huge.json", MP_ERR_RANGE, ": layers[0].repeat: 1000000000 is too large (at most 100000)"},
    {"too-many-blocks.json", MP_ERR_RANGE,
     ": layers[0].repeat: 2000 repeats of 1000 ops take the model over 131072 ops (memplan's limit on a model's ops, "
     "repeats expanded)"},
    /* 1,000 x 1,000 GPT-2 blocks in 600 bytes: refused before any is made (it took 19 GB) */
    {"nested-repeats.json", MP_ERR_RANGE,
     ": layers[1].repeat: 1000 repeats of 1000 ops take the model over 131072 ops (memplan's limit on a model's ops, "
     "repeats expanded)"},
    {"nesting-deep.json", MP_ERR_RANGE,
     ": layers[0].layers[0].layers[0].layers[0].layers[0].layers[0].layers[0].layers[0].layers[0]: "
     "repeats nested more than 8 deep"},
    {"dropout-p.json", MP_ERR_MODEL, ": layers[1].p: expected a probability in [0, 1)"},
    {"custom-saved-lt-output.json", MP_ERR_MODEL,
     ": layers[0].saved_bytes: 100 is less than output_bytes (200); saved_bytes includes the output"},
    {"tied-no-embedding.json", MP_ERR_MODEL,
     ": layers[1].tied: the model has no embedding before this lm_head to tie to"},
    {"zero-layers.json", MP_ERR_MODEL, ": layers: the model has no layers"},
    {"unknown-key.json", MP_ERR_MODEL,
     ": layers[1].ffm: unknown key for a transformer_block layer (did you mean \"ffn\"?)"},
    {"missing-input.json", MP_ERR_MODEL,
     ": input: missing (expected {\"tokens\": S}, {\"shape\": [C, H, W]} or {\"bytes_per_sample\": N})"},
    {"group-nested.json", MP_ERR_MODEL,
     ": layers[0].layers[1]: expected an op (with \"type\"); a block's layers cannot hold blocks or repeats"},
    /* duplicates are refused in any object, comments included (Python's json keeps the last) */
    {"duplicate-key-nested.json", MP_ERR_MODEL, ": input._note: duplicate key"},
    {"hf-duplicate-key.json", MP_ERR_MODEL, ": hidden_size: duplicate key"},
    /* a key holding a newline: the one-line message shows the control byte as '?' */
    {"key-with-newline.json", MP_ERR_MODEL, ": bad?key: unknown key for a memplan model"},
    /* every HF field within 2^40, one weight beyond it (the memplan reader's cap) */
    {"hf-hidden-huge.json", MP_ERR_RANGE,
     ": hidden_size: the embedding weight is too large (at most 1099511627776 elements)"},
    {"hf-experts-huge.json", MP_ERR_RANGE,
     ": num_local_experts: the experts weight is too large (at most 1099511627776 elements)"},
};

static const struct bad_case *find_bad(const char *file)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++)
        if (strcmp(bad_cases[i].file, file) == 0)
            return &bad_cases[i];
    return NULL;
}

static void bad_expected(const struct bad_case *c, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s%s", BAD_DIR, c->file, c->msg);
}

static void test_bad_corpus_exact(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        char path[256], want[640];
        snprintf(path, sizeof path, "%s/%s", BAD_DIR, bad_cases[i].file);
        bad_expected(&bad_cases[i], want, sizeof want);
        struct mp_model m;
        struct mp_diag d = {{0}};
        enum mp_status st = mp_model_load_file(&m, path, &d);
        if (st != bad_cases[i].st || strcmp(d.msg, want) != 0)
            print_error("%s\nexpected %s: %s\ngot      %s: %s\n", path, mp_status_str(bad_cases[i].st), want,
                        mp_status_str(st), d.msg);
        assert_int_equal(st, bad_cases[i].st);
        assert_string_equal(d.msg, want);
        assert_null(strchr(d.msg, '\n'));
        assert_int_equal(m.n_blocks, 0); /* released on error */
        mp_model_release(&m);
    }
}

/* tests/data/bad/README lists every file with a substring of its message; every .json is listed. */
static void test_bad_corpus_readme(void **state)
{
    (void)state;
    FILE *f = fopen(BAD_DIR "/README", "r");
    assert_non_null(f);
    char line[1024];
    size_t listed = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        if (!line[0] || line[0] == '#')
            continue;
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = '\0';
        const struct bad_case *c = find_bad(line);
        if (!c)
            print_error("README lists %s, which the test table lacks\n", line);
        assert_non_null(c);
        char want[640];
        bad_expected(c, want, sizeof want);
        if (!strstr(want, tab + 1))
            print_error("README substring for %s not in \"%s\": %s\n", line, want, tab + 1);
        assert_non_null(strstr(want, tab + 1));
        listed++;
    }
    fclose(f);
    assert_int_equal(listed, sizeof bad_cases / sizeof bad_cases[0]);

    DIR *dir = opendir(BAD_DIR);
    assert_non_null(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        size_t n = strlen(e->d_name);
        if (n > 5 && strcmp(e->d_name + n - 5, ".json") == 0) {
            if (!find_bad(e->d_name))
                print_error("%s/%s is not in the test table\n", BAD_DIR, e->d_name);
            assert_non_null(find_bad(e->d_name));
        }
    }
    closedir(dir);
}

static void test_load_directory_rejected(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_model_load_file(&m, "models", &d), MP_ERR_IO);
    assert_string_equal(d.msg, "models: is a directory, expected a model file");
    mp_model_release(&m);
    assert_int_equal(mp_model_load_file(&m, "models/no-such-model.json", &d), MP_ERR_IO);
    assert_string_equal(d.msg, "models/no-such-model.json: No such file or directory");
    mp_model_release(&m);
}

/* ---- bundled models ----------------------------------------------------------------------- */

static void test_bundled_param_counts(void **state)
{
    (void)state;
    static const struct {
        const char *path;
        uint64_t params;
        size_t blocks;
        const char *last_block;
    } models[] = {
        {"models/gpt2-124m.json", UINT64_C(124439808), 14, "head"},
        {"models/llama-7b.json", UINT64_C(6738415616), 34, "head"},
        {"models/llama-70b.json", UINT64_C(68976648192), 82, "head"},
        {"models/resnet50.json", UINT64_C(25557032), 18, "head"},
        {"models/tiny-test.json", UINT64_C(5632), 4, "head"},
        {"models/tiny-mlp.json", UINT64_C(2376), 3, "out"},
        {"models/chain-custom.json", UINT64_C(455882), 7, "head"},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        struct mp_model m;
        struct mp_diag d = {{0}};
        enum mp_status st = mp_model_load_file(&m, models[i].path, &d);
        if (st != MP_OK)
            print_error("%s\n", d.msg);
        assert_int_equal(st, MP_OK);
        assert_int_equal(m.n_blocks, models[i].blocks);
        assert_string_equal(m.blocks[m.n_blocks - 1].name, models[i].last_block);
        if (ref_params(&m) != models[i].params)
            print_error("%s: reference count %llu\n", models[i].path, (unsigned long long)ref_params(&m));
        assert_int_equal(ref_params(&m), models[i].params);

        struct mp_build_opts o;
        struct mp_program p;
        mp_build_opts_default(&o);
        st = mp_program_build(&m, &o, &p, &d);
        uint64_t built = st == MP_OK ? p.total_params : 0;
        if (st == MP_OK)
            mp_program_release(&p);
        mp_model_release(&m);
        if (st != MP_OK)
            print_error("%s\n", d.msg);
        assert_int_equal(st, MP_OK);
        if (built != models[i].params)
            print_error("%s: mp_program_build counts %llu\n", models[i].path, (unsigned long long)built);
        assert_int_equal(built, models[i].params);
    }
}

static void test_bundled_shapes(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_model_load_file(&m, "models/gpt2-124m.json", &d), MP_OK);
    assert_string_equal(m.name, "gpt2-124m");
    assert_int_equal(m.seq_len, 1024);
    assert_string_equal(m.blocks[1].name, "h.0");
    assert_string_equal(m.blocks[12].name, "h.11");
    const struct mp_layer *l = layer_at(&m, 5, 0);
    assert_true(l->fused_qkv && l->qkv_bias && l->mlp_bias && l->norm_bias);
    assert_int_equal(l->act, MP_ACT_GELU_NEW);
    assert_float_equal(l->p, 0.1, 1e-12);
    assert_float_equal(l->attn_dropout, 0.1, 1e-12);
    assert_true(layer_at(&m, 13, 1)->tied);
    mp_model_release(&m);

    assert_int_equal(mp_model_load_file(&m, "models/llama-70b.json", &d), MP_OK);
    l = layer_at(&m, 1, 0);
    assert_int_equal(l->kv_heads, 8);
    assert_int_equal(l->head_dim, 128);
    assert_true(l->rope && l->gated);
    assert_int_equal(l->norm, MP_NORM_RMSNORM);
    mp_model_release(&m);

    assert_int_equal(mp_model_load_file(&m, "models/resnet50.json", &d), MP_OK);
    static const char *const names[] = {"stem", "layer1.0", "layer1.1", "layer1.2", "layer2.0"};
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(m.blocks[i].name, names[i]);
    assert_int_equal(m.labels_vocab, 1000);
    assert_true(layer_at(&m, 1, 0)->downsample);
    assert_false(layer_at(&m, 2, 0)->downsample);
    mp_model_release(&m);
}

/* docs/model-format.md documents every key each layer type accepts: under the type's heading
 * ("### conv2d", or "### maxpool2d, avgpool2d"), a table row whose first cell names the key
 * ("| `key` |" or "| `out_h`, `out_w` |"), or in a section the type's text links to
 * ("every field of [attention](#attention)"), for each key the reader takes
 * (mp_json_layer_keys), so the reference and the reader cannot drift. */
static char model_format[1 << 17];

/* The text under the "### " heading that names type (up to the next heading), or NULL. */
static const char *format_section(const char *type, size_t *len)
{
    size_t tl = strlen(type);
    for (const char *h = strstr(model_format, "\n### "); h; h = strstr(h + 1, "\n### ")) {
        const char *eol = strchr(h + 1, '\n');
        for (const char *w = h + 5; eol && (w = strstr(w, type)) && w < eol; w += tl)
            if ((w[-1] == ' ' || w[-1] == ',') && (w[tl] == ',' || w[tl] == '\n' || w[tl] == ' ')) {
                const char *end = strstr(eol, "\n#");
                *len = end ? (size_t)(end - eol) : strlen(eol);
                return eol;
            }
    }
    return NULL;
}

static bool key_documented(const char *sec, size_t len, const char *key, size_t k, int depth)
{
    char want[64];
    snprintf(want, sizeof want, "`%.*s`", (int)k, key);
    for (const char *l = sec; l && l < sec + len; l = strchr(l + 1, '\n')) {
        if (strncmp(l, "\n| ", 3) != 0)
            continue;
        const char *cell_end = strstr(l + 3, " |");
        const char *hit = strstr(l + 3, want);
        if (hit && cell_end && hit < cell_end)
            return true;
    }
    for (const char *a = sec; depth == 0 && (a = strstr(a, "](#")) && a < sec + len; a += 3) {
        char target[48];
        size_t n = strcspn(a + 3, ")");
        snprintf(target, sizeof target, "%.*s", (int)(n < sizeof target ? n : sizeof target - 1), a + 3);
        size_t tl;
        const char *t = format_section(target, &tl);
        if (t && key_documented(t, tl, key, k, 1))
            return true;
    }
    return false;
}

static void test_model_format_documents_every_key(void **state)
{
    (void)state;
    FILE *f = fopen("docs/model-format.md", "r");
    assert_non_null(f);
    size_t n = fread(model_format, 1, sizeof model_format - 1, f);
    fclose(f);
    assert_true(n < sizeof model_format - 1);
    model_format[n] = 0;
    size_t missing = 0;
    for (int t = 0; t < MP_LT_COUNT; t++) {
        const char *type = mp_layer_type_str((enum mp_layer_type)t);
        size_t len;
        const char *sec = format_section(type, &len);
        if (!sec) {
            print_message("  docs/model-format.md: no \"### %s\" section\n", type);
            missing++;
            continue;
        }
        const char *keys = mp_json_layer_keys((enum mp_layer_type)t);
        size_t k;
        for (const char *w; (w = mp_list_word(&keys, &k));)
            if (!key_documented(sec, len, w, k, 0)) {
                print_message("  docs/model-format.md, %s: no row for `%.*s`\n", type, (int)k, w);
                missing++;
            }
    }
    if (missing)
        fail_msg("%zu key(s) the reader accepts are not documented", missing);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_token_ops),
        cmocka_unit_test(test_defaults_transformer_block),
        cmocka_unit_test(test_parse_image_ops),
        cmocka_unit_test(test_parse_custom_and_inputs),
        cmocka_unit_test(test_lm_head_tied_takes_embedding),
        cmocka_unit_test(test_repeat_expansion_names_groups),
        cmocka_unit_test(test_repeat_chain_checked),
        cmocka_unit_test(test_repeat_nesting),
        cmocka_unit_test(test_keys_ignored_and_rejected),
        cmocka_unit_test(test_json_text_refused),
        cmocka_unit_test(test_json_nesting_limit),
        cmocka_unit_test(test_errors_field_values),
        cmocka_unit_test(test_bad_corpus_exact),
        cmocka_unit_test(test_bad_corpus_readme),
        cmocka_unit_test(test_ops_limit),
        cmocka_unit_test(test_load_directory_rejected),
        cmocka_unit_test(test_parse_patch_embedding),
        cmocka_unit_test(test_bundled_param_counts),
        cmocka_unit_test(test_bundled_shapes),
        cmocka_unit_test(test_model_format_documents_every_key),
    };
    return cmocka_run_group_tests_name("model_json", tests, NULL, NULL);
}
