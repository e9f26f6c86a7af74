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
    uint64_t hd = l->attn.head_dim, q = l->attn.heads * hd, kv = l->attn.kv_heads * hd, norm;
    uint64_t attn = l->dim * q + q * l->dim + 2 * l->dim * kv + (l->attn.qkv_bias ? q + 2 * kv : 0) +
                    (l->attn.out_bias ? l->dim : 0);
    uint64_t mlp = l->mlp.gated ? 3 * l->dim * l->mlp.ffn + (l->mlp.bias ? 2 * l->mlp.ffn + l->dim : 0)
                            : 2 * l->dim * l->mlp.ffn + (l->mlp.bias ? l->mlp.ffn + l->dim : 0);
    switch (l->type) {
    case MP_LT_EMBEDDING:
    case MP_LT_POS_EMBEDDING: return l->vocab * l->dim;
    case MP_LT_LINEAR: return l->in_features * l->out_features + (l->bias ? l->out_features : 0);
    case MP_LT_LAYERNORM: return l->dim * (l->norm.bias ? 2 : 1);
    case MP_LT_RMSNORM: return l->dim;
    case MP_LT_ATTENTION: return attn;
    case MP_LT_MLP: return mlp;
    case MP_LT_TRANSFORMER_BLOCK:
        norm = l->dim * (l->norm.kind == MP_NORM_LAYERNORM && l->norm.bias ? 2 : 1);
        return attn + mlp + (l->norm.shared ? 1 : 2) * norm;
    case MP_LT_CONV2D:
        return l->conv.out_ch * (l->conv.in_ch / l->conv.groups) * l->conv.kernel * l->conv.kernel +
               (l->bias ? l->conv.out_ch : 0);
    case MP_LT_BATCHNORM2D: return 2 * l->conv.in_ch;
    case MP_LT_BOTTLENECK:
        return l->conv.in_ch * l->conv.mid_ch + 2 * l->conv.mid_ch +
               l->conv.mid_ch * (l->conv.mid_ch / l->conv.groups) * 9 + 2 * l->conv.mid_ch +
               l->conv.mid_ch * l->conv.out_ch + 2 * l->conv.out_ch +
               (l->conv.downsample ? l->conv.in_ch * l->conv.out_ch + 2 * l->conv.out_ch : 0);
    case MP_LT_LM_HEAD: return (l->head.tied ? 0 : l->vocab * l->dim) + (l->bias ? l->vocab : 0);
    case MP_LT_CLASSIFIER: return l->in_features * l->vocab + (l->bias ? l->vocab : 0);
    case MP_LT_CUSTOM: return l->custom.params;
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
    assert_int_equal(l->norm.kind, MP_NORM_LAYERNORM);
    assert_false(l->norm.bias);
    l = layer_at(&m, 1, 1);
    assert_int_equal(l->type, MP_LT_ATTENTION);
    assert_int_equal(l->attn.heads, 4);
    assert_int_equal(l->attn.kv_heads, 2);
    assert_int_equal(l->attn.head_dim, 4);
    assert_true(l->rope.on);
    assert_int_equal(l->rope.dim, 2);
    assert_true(l->attn.impl_set);
    assert_int_equal(l->attn.impl, MP_ATTN_FLASH);
    assert_false(l->attn.causal);
    assert_float_equal(l->attn.dropout, 0.1, 1e-12);
    assert_true(l->attn.fused_qkv);
    assert_false(l->attn.qkv_bias);
    assert_true(l->attn.out_bias); /* "bias" defaults to true */
    assert_int_equal(layer_at(&m, 1, 2)->type, MP_LT_RESIDUAL);

    l = layer_at(&m, 2, 0);
    assert_int_equal(l->type, MP_LT_RMSNORM);
    assert_int_equal(l->norm.kind, MP_NORM_RMSNORM);
    assert_int_equal(l->dim, 16);
    l = layer_at(&m, 2, 1);
    assert_int_equal(l->type, MP_LT_MLP);
    assert_int_equal(l->mlp.ffn, 48);
    assert_true(l->mlp.gated);
    assert_int_equal(l->mlp.act, MP_ACT_SILU); /* gated default */
    assert_false(l->mlp.bias);

    l = layer_at(&m, 3, 0);
    assert_int_equal(l->type, MP_LT_LINEAR);
    assert_int_equal(l->in_features, 16);
    assert_int_equal(l->out_features, 32);
    assert_false(l->bias);
    l = layer_at(&m, 3, 1);
    assert_int_equal(l->type, MP_LT_ACTIVATION);
    assert_int_equal(l->mlp.act, MP_ACT_RELU);
    assert_true(l->inplace);
    assert_true(layer_at(&m, 3, 2)->bias); /* nn.Linear default */

    l = layer_at(&m, 5, 0); /* untied head: vocab/dim from the embedding */
    assert_int_equal(l->type, MP_LT_LM_HEAD);
    assert_false(l->head.tied);
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
    assert_int_equal(l->attn.heads, 2);
    assert_int_equal(l->attn.kv_heads, 2);
    assert_int_equal(l->attn.head_dim, 8);
    assert_int_equal(l->mlp.ffn, 64);
    assert_int_equal(l->mlp.act, MP_ACT_GELU);
    assert_false(l->mlp.gated);
    assert_true(l->attn.causal);
    assert_true(l->attn.qkv_bias);
    assert_true(l->attn.out_bias);
    assert_true(l->mlp.bias);
    assert_int_equal(l->norm.kind, MP_NORM_LAYERNORM);
    assert_true(l->norm.bias);
    assert_false(l->attn.fused_qkv);
    assert_false(l->rope.on);
    assert_int_equal(l->rope.dim, 0);
    assert_false(l->attn.impl_set);
    assert_float_equal(l->p, 0.0, 0);
    assert_float_equal(l->attn.dropout, 0.0, 0);
    assert_false(l->parallel_residual);
    assert_false(l->norm.shared);
    assert_false(l->norm.post);
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
    assert_int_equal(l->norm.kind, MP_NORM_RMSNORM);
    assert_false(l->norm.bias);
    assert_int_equal(l->mlp.act, MP_ACT_SILU);
    assert_int_equal(l->attn.head_dim, 4);
    assert_int_equal(l->attn.kv_heads, 1);
    assert_false(l->attn.qkv_bias || l->attn.out_bias || l->mlp.bias);
    assert_true(l->attn.impl_set);
    assert_int_equal(l->attn.impl, MP_ATTN_EAGER);
    assert_true(l->parallel_residual && l->norm.shared);
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
    assert_int_equal(l->conv.in_ch, 3);
    assert_int_equal(l->conv.out_ch, 8);
    assert_int_equal(l->conv.kernel, 3);
    assert_int_equal(l->conv.stride, 1);
    assert_int_equal(l->conv.padding, 1);
    assert_int_equal(l->conv.groups, 1);
    assert_false(l->bias);
    l = layer_at(&m, 0, 1);
    assert_int_equal(l->type, MP_LT_BATCHNORM2D);
    assert_int_equal(l->conv.in_ch, 8);
    assert_int_equal(l->dim, 8);
    l = layer_at(&m, 0, 3);
    assert_int_equal(l->type, MP_LT_MAXPOOL2D);
    assert_int_equal(l->conv.kernel, 2);
    assert_int_equal(l->conv.stride, 2); /* defaults to the kernel */
    assert_int_equal(l->conv.padding, 0);
    l = layer_at(&m, 1, 0);
    assert_int_equal(l->type, MP_LT_AVGPOOL2D);
    assert_int_equal(l->conv.stride, 1);
    assert_int_equal(l->conv.padding, 1);

    l = layer_at(&m, 2, 0);
    assert_int_equal(l->type, MP_LT_BOTTLENECK);
    assert_int_equal(l->conv.stride, 2);
    assert_true(l->conv.downsample); /* needed: stride 2 and 8 -> 16 channels */
    l = layer_at(&m, 3, 0);
    assert_int_equal(l->conv.out_ch, 16); /* 4 x mid_ch */
    assert_int_equal(l->conv.stride, 1);
    assert_false(l->conv.downsample);

    l = layer_at(&m, 4, 0);
    assert_int_equal(l->type, MP_LT_ADAPTIVE_AVGPOOL2D);
    assert_int_equal(l->conv.out_h, 2);
    assert_int_equal(l->conv.out_w, 2);
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
    assert_int_equal(layer_at(&m, 0, 0)->conv.out_h, 4);
    assert_int_equal(layer_at(&m, 0, 0)->conv.out_w, 2);
    assert_int_equal(layer_at(&m, 1, 0)->conv.out_h, 2);
    assert_int_equal(layer_at(&m, 1, 0)->conv.out_w, 1);
    assert_int_equal(layer_at(&m, 2, 0)->conv.out_h, 1);
    assert_int_equal(layer_at(&m, 2, 0)->conv.out_w, 1);
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
    assert_int_equal(l->conv.in_ch, 3);
    assert_int_equal(l->conv.kernel, 8);
    assert_true(l->emb.cls_token);
    assert_int_equal(layer_at(&m, 2, 1)->head.pool, MP_POOL_FIRST);
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
    assert_int_equal(l->custom.output_bytes, 128);
    assert_int_equal(l->custom.saved_bytes, 128); /* defaults to the output */
    assert_int_equal(l->custom.params, 0);
    assert_int_equal(l->custom.fwd_flops, 0);
    assert_int_equal(l->custom.bwd_flops, 0);
    l = layer_at(&m, 1, 0);
    assert_int_equal(l->custom.saved_bytes, 96);
    assert_int_equal(l->custom.params, 7);
    assert_int_equal(l->custom.fwd_flops, 1000);
    assert_int_equal(l->custom.bwd_flops, 2500);
    assert_params_agree(&m);
    mp_model_release(&m);

    expect_ok("{\"input\": {\"bytes_per_sample\": 8}, \"layers\": ["
              " {\"type\": \"custom\", \"output_bytes\": 8, \"fwd_flops\": 300}]}",
              &m);
    assert_int_equal(layer_at(&m, 0, 0)->custom.bwd_flops, 600); /* 2 x fwd */
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
    assert_true(l->head.tied);
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
    assert_int_equal(layer_at(&m, 3, 1)->mlp.act, MP_ACT_TANH);
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
    expect_ok(
        MODEL16("{\"repeat\": 2, \"layers\": [{\"repeat\": 2, \"name\": \"h\", \"layers\": [" LIN "]}]},"
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
              "  {\"repeat\": 1, \"_n\": 0, \"layers\": [{\"block\": \"g\", \"comment\": \"\", \"layers\": [" LIN
              "]}]}]}",
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
    expect_error("{\"name\":\n\x01\"a\"}", MP_ERR_JSON,
                 "t.json:2:1: malformed JSON: a control character outside a string");
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
        {MODEL16("{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 16, \"bias\": \"yes\"}"), MP_ERR_MODEL,
         "t.json: layers[0].bias: expected true or false"},
        {MODEL16("{\"type\": \"activation\", \"act\": \"gelu2\"}"), MP_ERR_MODEL,
         "t.json: layers[0].act: unknown activation \"gelu2\" (expected gelu, gelu_tanh, relu, silu, tanh, "
         "sigmoid, gelu_new, gelu_fast, relu2, xielu or quick_gelu)"},
        {MODEL16("{\"type\": \"activation\"}"), MP_ERR_MODEL,
         "t.json: layers[0].act: missing (expected gelu, gelu_tanh, relu, silu, tanh, sigmoid, gelu_new, gelu_fast, "
         "relu2, xielu or quick_gelu)"},
        {MODEL16("{\"type\": \"attention\", \"dim\": 16, \"heads\": 2, \"impl\": \"xformers\"}"), MP_ERR_MODEL,
         "t.json: layers[0].impl: unknown attention implementation \"xformers\" (expected eager, flash or sdpa)"},
        {MODEL16("{\"type\": \"attention\", \"dim\": 16, \"heads\": 2, \"rotary_dim\": 4}"), MP_ERR_MODEL,
         "t.json: layers[0].rotary_dim: needs \"rope\": true"},
        {MODEL16("{\"type\": \"attention\", \"dim\": 16, \"heads\": 2, \"rope\": true, \"rotary_dim\": 3}"),
         MP_ERR_MODEL, "t.json: layers[0].rotary_dim: 3 must be even and at most head_dim (8)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"norm\": \"batchnorm\"}"), MP_ERR_MODEL,
         "t.json: layers[0].norm: unknown norm \"batchnorm\" (expected layernorm or rmsnorm)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"norm\": \"rmsnorm\","
                 " \"norm_bias\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].norm_bias: rmsnorm has no bias"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"shared_norm\": true}"), MP_ERR_MODEL,
         "t.json: layers[0].shared_norm: needs \"parallel_residual\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"post_norm\": true,"
                 " \"parallel_residual\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].post_norm: cannot be combined with parallel_residual"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"rope_fp32\": true}"), MP_ERR_MODEL,
         "t.json: layers[0].rope_fp32: needs \"rope\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"rope_complex\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].rope_complex: needs \"rope\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"rope\": true, "
                 "\"rope_complex\": true, \"rotary_dim\": 4}"),
         MP_ERR_MODEL, "t.json: layers[0].rope_complex: needs a whole-head rotary (no other rope_ key)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"rope\": true, "
                 "\"temp_tuning\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].temp_tuning: needs a layer without \"rope\" (NoPE)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"qk_norm\": \"both\"}"), MP_ERR_MODEL,
         "t.json: layers[0].qk_norm: unknown value \"both\" (expected none, head, all or l2)"},
        {MODEL16(
             "{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"qk_norm_late\": true, \"rope\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].qk_norm_late: needs a qk_norm and \"rope\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"qkv_split\": \"copy_mq\"}"),
         MP_ERR_MODEL, "t.json: layers[0].qkv_split: needs \"fused_qkv\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"experts\": 4, \"top_k\": 5, "
                 "\"expert_ffn\": 8}"),
         MP_ERR_MODEL, "t.json: layers[0].top_k: exceeds experts (expected 1 to experts, 4)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"experts\": 4, \"top_k\": 2}"),
         MP_ERR_MODEL, "t.json: layers[0].expert_ffn: missing (expected a positive integer)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"top_k\": 2}"), MP_ERR_MODEL,
         "t.json: layers[0].top_k: needs \"experts\""},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"experts\": 4, \"top_k\": 2, "
                 "\"expert_ffn\": 8, \"router\": \"sinkhorn\"}"),
         MP_ERR_MODEL,
         "t.json: layers[0].router: unknown value \"sinkhorn\" (expected softmax, softmax_cast, fp32_softmax, "
         "fp32_sigmoid, topk_softmax, sparsemixer or dense_sigmoid)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"experts\": 4, \"top_k\": 3, "
                 "\"expert_ffn\": 8, \"router\": \"sparsemixer\"}"),
         MP_ERR_MODEL, "t.json: layers[0].top_k: 3 with \"router\": \"sparsemixer\" (it picks 2)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"input_jitter\": true}"), MP_ERR_MODEL,
         "t.json: layers[0].input_jitter: needs \"experts\""},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"experts\": 4, \"top_k\": 2, "
                 "\"expert_ffn\": 8, \"shared_gate\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].shared_gate: needs a shared_ffn"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"branch_norm\": true, "
                 "\"parallel_residual\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].branch_norm: needs a pre-norm block (no post_norm, no parallel_residual)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"no_pre_norm\": true}"), MP_ERR_MODEL,
         "t.json: layers[0].no_pre_norm: needs \"branch_norm\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"mult\": 0.22, \"post_norm\": true}"),
         MP_ERR_MODEL,
         "t.json: layers[0].mult: needs a pre-norm block (no post_norm, branch_norm or parallel_residual)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"mult\": -1}"), MP_ERR_MODEL,
         "t.json: layers[0].mult: expected a positive number"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"rms_fp32\": true}"), MP_ERR_MODEL,
         "t.json: layers[0].rms_fp32: needs \"norm\": \"rmsnorm\""},
        {MODEL16(
             "{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"norm\": \"rmsnorm\", \"ln_plain\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].ln_plain: needs \"norm\": \"layernorm\""},
        {MODEL16(
             "{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"ln_plain\": true, \"norm_bias\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].ln_plain: this layernorm has no bias"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"ln_plain\": true, \"ln_1p\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].ln_1p: at most one of ln_fp32, ln_plain and ln_1p"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"rope\": true, \"kv_lora\": 8, "
                 "\"rope_dim\": 3, \"nope_dim\": 4, \"v_dim\": 4}"),
         MP_ERR_MODEL, "t.json: layers[0].kv_lora: needs a positive even rope_dim, a nope_dim and a v_dim"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"kv_lora\": 8, \"rope_dim\": 2, "
                 "\"nope_dim\": 4, \"v_dim\": 4}"),
         MP_ERR_MODEL, "t.json: layers[0].kv_lora: needs \"rope\": true"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"v_dim\": 4}"), MP_ERR_MODEL,
         "t.json: layers[0].v_dim: needs a kv_lora"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"gated\": true, \"up_down\": true}"),
         MP_ERR_MODEL, "t.json: layers[0].up_down: needs an MLP that is not gated"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"eager_masks\": 65}"), MP_ERR_RANGE,
         "t.json: layers[0].eager_masks: 65 is too large (at most 64)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16}"), MP_ERR_MODEL,
         "t.json: layers[0].heads: missing (expected a positive integer)"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 0}"), MP_ERR_MODEL,
         "t.json: layers[0].heads: expected a positive integer"},
        {MODEL16("{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"attn_dropout\": -0.1}"), MP_ERR_MODEL,
         "t.json: layers[0].attn_dropout: expected a probability in [0, 1)"},
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
        {MODEL16("{\"layers\": [" LIN "]}"), MP_ERR_MODEL,
         "t.json: layers[0].block: missing (expected the block's name)"},
        {MODEL16("{\"block\": \"b\", \"layers\": [3]}"), MP_ERR_MODEL,
         "t.json: layers[0].layers[0]: expected an op object"},
        {MODEL16("{\"type\": 3}"), MP_ERR_MODEL, "t.json: layers[0].type: expected a string"},
        {MODEL16("{\"dim\": 3}"), MP_ERR_MODEL,
         "t.json: layers[0]: expected an op (\"type\"), a block (\"block\" + \"layers\") or a repeat (\"repeat\" + "
         "\"layers\")"},
        {MODEL16("7"), MP_ERR_MODEL, "t.json: layers[0]: expected an object (an op, a block or a repeat)"},
        {MODEL16("{\"type\": \"flatten\", \"name\": \"\"}"), MP_ERR_MODEL,
         "t.json: layers[0].name: expected a non-empty string"},
        {MODEL16(
             "{\"type\": \"flatten\", \"name\": \"0123456789012345678901234567890123456789012345678901234567890123\"}"),
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
    assert_true(l->attn.fused_qkv && l->attn.qkv_bias && l->mlp.bias && l->norm.bias);
    assert_int_equal(l->mlp.act, MP_ACT_GELU_NEW);
    assert_float_equal(l->p, 0.1, 1e-12);
    assert_float_equal(l->attn.dropout, 0.1, 1e-12);
    assert_true(layer_at(&m, 13, 1)->head.tied);
    mp_model_release(&m);

    assert_int_equal(mp_model_load_file(&m, "models/llama-70b.json", &d), MP_OK);
    l = layer_at(&m, 1, 0);
    assert_int_equal(l->attn.kv_heads, 8);
    assert_int_equal(l->attn.head_dim, 128);
    assert_true(l->rope.on && l->mlp.gated);
    assert_int_equal(l->norm.kind, MP_NORM_RMSNORM);
    mp_model_release(&m);

    assert_int_equal(mp_model_load_file(&m, "models/resnet50.json", &d), MP_OK);
    static const char *const names[] = {"stem", "layer1.0", "layer1.1", "layer1.2", "layer2.0"};
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(m.blocks[i].name, names[i]);
    assert_int_equal(m.labels_vocab, 1000);
    assert_true(layer_at(&m, 1, 0)->conv.downsample);
    assert_false(layer_at(&m, 2, 0)->conv.downsample);
    mp_model_release(&m);
}

/* docs/model-format.md's key tables are model_keys.c's rows: under the heading of each type
 * ("### conv2d", or "### maxpool2d, avgpool2d" for both), the rows "| `key` | default | meaning |"
 * of the rows whose first type it is, in the table's order, and no others.  On a difference the
 * test prints the section's table as it should read. */
static char model_format[1 << 17];

/* The text under the "### " heading that names type (up to the next heading), or NULL; *first:
 * type is the heading's first word. */
static const char *format_section(const char *type, size_t *len, bool *first)
{
    size_t tl = strlen(type);
    for (const char *h = strstr(model_format, "\n### "); h; h = strstr(h + 1, "\n### ")) {
        const char *eol = strchr(h + 1, '\n');
        for (const char *w = h + 5; eol && (w = strstr(w, type)) && w < eol; w += tl)
            if ((w[-1] == ' ' || w[-1] == ',') && (w[tl] == ',' || w[tl] == '\n')) {
                const char *end = strstr(eol, "\n#");
                *len = end ? (size_t)(end - eol) : strlen(eol);
                *first = w == h + 5;
                return eol;
            }
    }
    return NULL;
}

static void test_model_format_rows_are_the_key_table(void **state)
{
    (void)state;
    FILE *f = fopen("docs/model-format.md", "r");
    assert_non_null(f);
    size_t n = fread(model_format, 1, sizeof model_format - 1, f);
    fclose(f);
    assert_true(n < sizeof model_format - 1);
    model_format[n] = 0;
    size_t wrong = 0;
    static char want[1 << 14], have[1 << 14];
    for (int t = 0; t < MP_LT_COUNT; t++) {
        const char *type = mp_layer_type_str((enum mp_layer_type)t);
        size_t w = 0, h = 0, len;
        want[0] = have[0] = 0;
        for (size_t i = 0; i < mp_n_keys; i++)
            if (mp_key_home(&mp_keys[i]) == (enum mp_layer_type)t)
                w += (size_t)snprintf(want + w, sizeof want - w, "| `%s` | %s | %s%s|\n", mp_keys[i].key,
                                      mp_keys[i].deflt, mp_keys[i].doc, *mp_keys[i].doc ? " " : "");
        bool first;
        const char *sec = format_section(type, &len, &first);
        if (!sec || (!first && w)) {
            print_message("  docs/model-format.md: no \"### %s\" section\n", type);
            wrong++;
            continue;
        }
        if (!first) /* "### maxpool2d, avgpool2d": maxpool2d's rows */
            continue;
        for (const char *l = sec; l && l < sec + len; l = strchr(l + 1, '\n'))
            if (strncmp(l, "\n| `", 4) == 0) {
                const char *e = strchr(l + 1, '\n');
                size_t k = e ? (size_t)(e - l) : strlen(l + 1);
                h += (size_t)snprintf(have + h, sizeof have - h, "%.*s\n", (int)k - 1, l + 1);
            }
        assert_true(w < sizeof want - 1 && h < sizeof have - 1);
        if (strcmp(want, have) != 0) {
            print_message("  docs/model-format.md, ### %s: its key table should read\n", type);
            for (const char *r = want; *r;) {
                const char *e = strchr(r, '\n');
                print_message("%.*s\n", (int)(e - r), r);
                r = e + 1;
            }
            wrong++;
        }
    }
    if (wrong)
        fail_msg("%zu section(s) of docs/model-format.md differ from src/model/model_keys.c", wrong);
}

/* ---- every HF layer can be written in memplan JSON ------------------------------------ */

struct buf {
    char *s;
    size_t n, cap;
};

static void put(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int w = vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
        va_end(ap);
        assert_true(w >= 0);
        if ((size_t)w < b->cap - b->n) {
            b->n += (size_t)w;
            return;
        }
        b->cap = 2 * b->cap + (size_t)w + 1;
        b->s = realloc(b->s, b->cap);
        assert_non_null(b->s);
    }
}

/* One layer as a memplan JSON op, every field through model_keys.c's rows. */
static void write_layer(struct buf *b, const struct mp_layer *l)
{
    put(b, "{\"type\": \"%s\"", mp_layer_type_str(l->type));
    if (l->name[0])
        put(b, ", \"name\": \"%s\"", l->name);
    for (size_t i = 0; i < mp_n_keys; i++) {
        const struct mp_key *k = &mp_keys[i];
        if (!(k->types & (1u << l->type)) || !k->size)
            continue;
        const char *f = (const char *)l + k->off;
        uint64_t u = 0;
        double x = 0;
        int e = 0;
        switch (k->kind) {
        case MP_KEY_DIM:
        case MP_KEY_COUNT:
            if (k->size == sizeof u) {
                memcpy(&u, f, sizeof u);
            } else {
                unsigned v;
                memcpy(&v, f, sizeof v);
                u = v;
            }
            if (u || k->kind == MP_KEY_COUNT)
                put(b, ", \"%s\": %llu", k->key, (unsigned long long)u);
            break;
        case MP_KEY_BOOL:
            put(b, ", \"%s\": %s", k->key, *(const bool *)f ? "true" : "false");
            break;
        case MP_KEY_PROB:
        case MP_KEY_REAL:
            memcpy(&x, f, sizeof x);
            if (x != 0 || k->kind == MP_KEY_PROB)
                put(b, ", \"%s\": %.17g", k->key, x);
            break;
        case MP_KEY_ENUM: {
            memcpy(&e, f, sizeof e);
            int n = 0;
            while (k->names[n])
                n++;
            if (e >= n)
                fail_msg("layer %s: %s value %d has no memplan JSON name", l->name, k->key, e);
            put(b, ", \"%s\": \"%s\"", k->key, k->names[e]);
            break;
        }
        case MP_KEY_ACT:
            memcpy(&e, f, sizeof e);
            put(b, ", \"%s\": \"%s\"", k->key, mp_act_str((enum mp_act)e));
            break;
        case MP_KEY_IMPL:
            memcpy(&e, f, sizeof e);
            if (l->attn.impl_set)
                put(b, ", \"%s\": \"%s\"", k->key, mp_attn_impl_str((enum mp_attn_impl)e));
            break;
        }
    }
    put(b, "}");
}

/* Every bundled HF config's layers, written in memplan JSON and read back, are the same layers:
 * memplan JSON reaches every field the HF reader sets (T5's encoder-decoder aside, which the
 * format cannot express). */
static void test_hf_layers_written_in_memplan_json(void **state)
{
    (void)state;
    DIR *dir = opendir("models/hf");
    assert_non_null(dir);
    size_t models = 0, layers = 0, bad = 0;
    for (struct dirent *de; (de = readdir(dir));) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".json") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "models/hf/%s", de->d_name);
        struct mp_model hf, back;
        struct mp_diag d = {0};
        assert_int_equal(mp_model_read_file(&hf, path, &d), MP_OK);
        if (hf.enc_dec) {
            mp_model_release(&hf);
            continue;
        }
        struct buf b = {0};
        put(&b, "{\"name\": \"rt\", \"input\": ");
        if (hf.input == MP_INPUT_IMAGE)
            put(&b, "{\"shape\": [%llu, %llu, %llu]}", (unsigned long long)hf.channels,
                (unsigned long long)hf.height, (unsigned long long)hf.width);
        else
            put(&b, "{\"tokens\": %llu}", (unsigned long long)hf.seq_len);
        if (hf.labels_vocab)
            put(&b, ", \"classes\": %llu", (unsigned long long)hf.labels_vocab);
        put(&b, ", \"layers\": [");
        for (size_t i = 0; i < hf.n_blocks; i++) {
            put(&b, "%s{\"block\": \"%s\", \"layers\": [", i ? ", " : "", hf.blocks[i].name);
            for (size_t j = 0; j < hf.blocks[i].n_layers; j++) {
                put(&b, j ? ", " : "");
                write_layer(&b, &hf.blocks[i].layers[j]);
            }
            put(&b, "]}");
        }
        put(&b, "]}");
        memset(&d, 0, sizeof d);
        enum mp_status st = mp_model_read_string(&back, b.s, b.n, path, &d);
        if (st != MP_OK) {
            print_message("  %s: written back: %s\n", path, d.msg);
            bad++;
        } else if (back.n_blocks != hf.n_blocks) {
            print_message("  %s: %zu blocks read back, %zu written\n", path, back.n_blocks, hf.n_blocks);
            bad++;
        } else {
            for (size_t i = 0; i < hf.n_blocks; i++)
                for (size_t j = 0; j < hf.blocks[i].n_layers && j < back.blocks[i].n_layers; j++) {
                    const struct mp_layer *a = &hf.blocks[i].layers[j], *c = &back.blocks[i].layers[j];
                    layers++;
                    if (memcmp(a, c, sizeof *a) != 0) {
                        size_t at = 0;
                        while (((const char *)a)[at] == ((const char *)c)[at])
                            at++;
                        const char *field = "(no key)";
                        for (size_t r = 0; r < mp_n_keys; r++)
                            if (mp_keys[r].size && at >= mp_keys[r].off && at < mp_keys[r].off + mp_keys[r].size)
                                field = mp_keys[r].key;
                        print_message("  %s: block %s layer %zu (%s) differs at byte %zu (%s)\n", path,
                                      hf.blocks[i].name, j, mp_layer_type_str(a->type), at, field);
                        bad++;
                        i = hf.n_blocks - 1;
                        break;
                    }
                }
            mp_model_release(&back);
        }
        free(b.s);
        mp_model_release(&hf);
        models++;
    }
    closedir(dir);
    print_message("  %zu HF configs, %zu layers written and read back\n", models, layers);
    assert_true(models >= 40);
    assert_int_equal(bad, 0);
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
        cmocka_unit_test(test_model_format_rows_are_the_key_table),
        cmocka_unit_test(test_hf_layers_written_in_memplan_json),
    };
    return cmocka_run_group_tests_name("model_json", tests, NULL, NULL);
}
