/* test_probe.c — the probe: backends, the host executor's arithmetic and its memory.
 *
 * Gradients of every prim are checked against central finite differences of
 * the loss (double accumulation, fp32 programs) on small models; the host's
 * measured peak must equal mp_estimate_run()'s peak_allocated_bytes exactly for
 * the bundled small models under several precisions, optimizers and checkpoint
 * schedules; a capacity one byte below the peak is a clean "does not fit";
 * training lowers the loss.  CUDA tests skip without a device.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "probe/probe_impl.h"
#include "probe_check.h"

/* ---- helpers ----------------------------------------------------------------------------- */

/* Loads models/<name>.json; false when the file is not there. */
static bool load_file(struct mp_model *m, const char *name)
{
    char path[256];
    struct mp_diag d = {{0}};
    snprintf(path, sizeof path, "models/%s.json", name);
    mp_model_init(m);
    if (mp_model_load_file(m, path, &d) != MP_OK) {
        mp_model_release(m);
        return false;
    }
    return true;
}

static void build(struct mp_program *p, const struct mp_model *m, enum mp_precision prec, uint64_t batch, int attn)
{
    struct mp_build_opts o;
    struct mp_diag d = {{0}};
    mp_build_opts_default(&o);
    o.batch = batch;
    o.precision = prec;
    if (attn >= 0) {
        o.attention = (enum mp_attn_impl)attn;
        o.attention_forced = true;
    }
    if (mp_program_build(m, &o, p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
}

static bool has_prim(const struct mp_program *p, enum mp_prim prim)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        if (p->nodes[k].prim == prim)
            return true;
    return false;
}

/* ---- models ---------------------------------------------------------------------------------- */

/* GPT-2 style: embeddings, a fused-qkv block with residual and attention dropout, a tied head. */
static const char *gpt_json =
    "{\"name\":\"g\",\"input\":{\"tokens\":4},\"layers\":["
    "{\"block\":\"embed\",\"layers\":[{\"type\":\"embedding\",\"name\":\"wte\",\"vocab\":11,\"dim\":8},"
    "{\"type\":\"pos_embedding\",\"name\":\"wpe\",\"max_positions\":4,\"dim\":8}]},"
    "{\"repeat\":2,\"name\":\"h\",\"layers\":[{\"type\":\"transformer_block\",\"dim\":8,\"heads\":2,\"ffn\":16,"
    "\"act\":\"gelu_tanh\",\"fused_qkv\":true,\"p\":0.1,\"attn_dropout\":0.2}]},"
    "{\"block\":\"head\",\"layers\":[{\"type\":\"layernorm\",\"name\":\"ln_f\",\"dim\":8},"
    "{\"type\":\"lm_head\",\"vocab\":11,\"dim\":8,\"tied\":true}]}]}";

/* NeoX style: parallel residual, one shared norm, exact GELU, non-causal, no attention dropout;
 * a BERT-style token-type table (row 0 added everywhere). */
static const char *neox_json =
    "{\"name\":\"n\",\"input\":{\"tokens\":3},\"layers\":["
    "{\"block\":\"embed\",\"layers\":[{\"type\":\"embedding\",\"name\":\"wte\",\"vocab\":7,\"dim\":8},"
    "{\"type\":\"embedding\",\"name\":\"token_type\",\"vocab\":2,\"dim\":8}]},"
    "{\"type\":\"transformer_block\",\"dim\":8,\"heads\":2,\"ffn\":8,\"act\":\"gelu\",\"causal\":false,"
    "\"parallel_residual\":true,\"shared_norm\":true,\"rope\":true},"
    "{\"block\":\"head\",\"layers\":[{\"type\":\"layernorm\",\"name\":\"ln_f\",\"dim\":8,\"bias\":false},"
    "{\"type\":\"lm_head\",\"vocab\":7,\"dim\":8}]}]}";

/* Llama style: RMSNorm, GQA, partial rotary, SwiGLU, no biases; fused or separate q/k/v. */
static const char *llama_fmt =
    "{\"name\":\"l\",\"input\":{\"tokens\":5},\"layers\":["
    "{\"type\":\"embedding\",\"name\":\"tok\",\"vocab\":13,\"dim\":8},"
    "{\"repeat\":2,\"name\":\"h\",\"layers\":[{\"type\":\"transformer_block\",\"dim\":8,\"heads\":4,\"kv_heads\":2,"
    "\"head_dim\":4,\"ffn\":12,\"norm\":\"rmsnorm\",\"gated\":true,\"bias\":false,\"rope\":true,\"rotary_dim\":2,"
    "\"fused_qkv\":%s}]},"
    "{\"block\":\"head\",\"layers\":[{\"type\":\"rmsnorm\",\"name\":\"norm\",\"dim\":8},"
    "{\"type\":\"lm_head\",\"vocab\":13,\"dim\":8}]}]}";

/* Every activation (HF's Python GELUs with their saved parts too), dropout, a bias-free layernorm, an in-place ReLU and a residual; image-shaped features. */
static const char *mlp_json =
    "{\"name\":\"a\",\"input\":{\"shape\":[6]},\"layers\":["
    "{\"block\":\"acts\",\"layers\":["
    "{\"type\":\"linear\",\"name\":\"l0\",\"in_features\":6,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a0\",\"act\":\"gelu\"},"
    "{\"type\":\"linear\",\"name\":\"l1\",\"in_features\":8,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a1\",\"act\":\"silu\"},"
    "{\"type\":\"linear\",\"name\":\"l2\",\"in_features\":8,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a2\",\"act\":\"tanh\"},"
    "{\"type\":\"linear\",\"name\":\"l3\",\"in_features\":8,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a3\",\"act\":\"sigmoid\"},"
    "{\"type\":\"linear\",\"name\":\"l4\",\"in_features\":8,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a4\",\"act\":\"gelu_tanh\"},"
    "{\"type\":\"linear\",\"name\":\"l5\",\"in_features\":8,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a5\",\"act\":\"gelu_new\"},"
    "{\"type\":\"linear\",\"name\":\"l6\",\"in_features\":8,\"out_features\":8},{\"type\":\"activation\",\"name\":\"a6\",\"act\":\"gelu_fast\"},"
    "{\"type\":\"dropout\",\"name\":\"drop\",\"p\":0.25}]},"
    "{\"block\":\"res\",\"layers\":[{\"type\":\"layernorm\",\"name\":\"ln\",\"dim\":8,\"bias\":false},"
    "{\"type\":\"linear\",\"name\":\"fc\",\"in_features\":8,\"out_features\":8},"
    "{\"type\":\"activation\",\"name\":\"relu\",\"act\":\"relu\",\"inplace\":true},"
    "{\"type\":\"linear\",\"name\":\"proj\",\"in_features\":8,\"out_features\":8,\"bias\":false},"
    "{\"type\":\"residual\",\"name\":\"add\"}]},"
    "{\"block\":\"out\",\"layers\":[{\"type\":\"classifier\",\"in_features\":8,\"classes\":5}]}]}";

/* A small CNN: conv with bias, batch norm, in-place ReLU, padded max pool, a ResNet bottleneck with
 * projection, a grouped conv, avg pool, adaptive avg pool, flatten, classifier. */
static const char *cnn_json =
    "{\"name\":\"c\",\"input\":{\"shape\":[2,6,6]},\"layers\":["
    "{\"block\":\"stem\",\"layers\":[{\"type\":\"conv2d\",\"name\":\"conv\",\"in_ch\":2,\"out_ch\":4,\"kernel\":3,"
    "\"stride\":1,\"padding\":1,\"bias\":true},{\"type\":\"batchnorm2d\",\"name\":\"bn\",\"channels\":4},"
    "{\"type\":\"activation\",\"name\":\"relu\",\"act\":\"relu\",\"inplace\":true},"
    "{\"type\":\"maxpool2d\",\"name\":\"pool\",\"kernel\":3,\"stride\":2,\"padding\":1}]},"
    "{\"type\":\"bottleneck\",\"in_ch\":4,\"mid_ch\":2,\"out_ch\":8,\"stride\":2,\"downsample\":true},"
    "{\"block\":\"tail\",\"layers\":[{\"type\":\"conv2d\",\"name\":\"g\",\"in_ch\":8,\"out_ch\":8,\"kernel\":1,"
    "\"groups\":2},{\"type\":\"avgpool2d\",\"name\":\"ap\",\"kernel\":2,\"stride\":1},"
    "{\"type\":\"adaptive_avgpool2d\",\"name\":\"aap\",\"output_size\":1},{\"type\":\"flatten\",\"name\":\"fl\"},"
    "{\"type\":\"classifier\",\"in_features\":8,\"classes\":3}]}]}";

static void llama_model(struct mp_model *m, bool fused)
{
    char buf[1024];
    snprintf(buf, sizeof buf, llama_fmt, fused ? "true" : "false");
    load_json(m, buf);
}

/* ---- conversions ------------------------------------------------------------------------------- */

static void test_half_conversions(void **state)
{
    (void)state;
    /* bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even (1) */
    assert_int_equal(mp_bf16_from_f32(1.0f), 0x3f80);
    assert_int_equal(mp_bf16_from_f32(1.0f + 1.0f / 256.0f), 0x3f80);
    assert_int_equal(mp_bf16_from_f32(1.0f + 3.0f / 256.0f), 0x3f82);
    assert_true(mp_f32_from_bf16(mp_bf16_from_f32(-2.5f)) == -2.5f);
    assert_true(isnan(mp_f32_from_bf16(mp_bf16_from_f32(NAN))));
    /* fp16: exact values, ties to even, overflow, subnormals */
    assert_int_equal(mp_f16_from_f32(1.0f), 0x3c00);
    assert_int_equal(mp_f16_from_f32(65504.0f), 0x7bff);
    assert_int_equal(mp_f16_from_f32(65520.0f), 0x7c00);
    assert_int_equal(mp_f16_from_f32(1.0f + 1.0f / 2048.0f), 0x3c00);
    assert_int_equal(mp_f16_from_f32(1.0f + 3.0f / 2048.0f), 0x3c02);
    assert_int_equal(mp_f16_from_f32(ldexpf(1.0f, -24)), 0x0001);
    assert_int_equal(mp_f16_from_f32(ldexpf(1.0f, -25)), 0x0000);
    assert_int_equal(mp_f16_from_f32(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(mp_f16_from_f32(-ldexpf(1.0f, -14)), 0x8400);
    for (uint32_t h = 0; h < 0x7c00; h++) /* every finite half round-trips */
        assert_int_equal(mp_f16_from_f32(mp_f32_from_f16((uint16_t)h)), h);
    for (uint32_t h = 0; h < 0x7f80; h += 7)
        assert_int_equal(mp_bf16_from_f32(mp_f32_from_bf16((uint16_t)h)), h);
}

/* ---- gradients ------------------------------------------------------------------------------- */

static void test_grad_gpt_flash(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    load_json(&m, gpt_json);
    m.blocks[0].layers[0].emb.dropout = 0.1; /* embedding dropout (HF configs set it; JSON has no key) */
    build(&p, &m, MP_PREC_FP32, 2, MP_ATTN_FLASH);
    assert_true(has_prim(&p, MP_P_EMBED) && has_prim(&p, MP_P_ADD_POS) && has_prim(&p, MP_P_DROPOUT) &&
                has_prim(&p, MP_P_ATTN) && has_prim(&p, MP_P_NLL_LOSS) && has_prim(&p, MP_P_LOG_SOFTMAX) && has_prim(&p, MP_P_LAYERNORM));
    gradcheck(&p, NULL, 4e-3f, 2e-4, 1e-2, 64);
    mp_program_release(&p);
    mp_model_release(&m);
}

static void test_grad_gpt_eager(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    load_json(&m, gpt_json);
    build(&p, &m, MP_PREC_FP32, 2, MP_ATTN_EAGER);
    gradcheck(&p, NULL, 4e-3f, 2e-4, 1e-2, 64);
    mp_program_release(&p);
    mp_model_release(&m);
}

static void test_grad_neox(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    load_json(&m, neox_json);
    for (int attn = MP_ATTN_FLASH; attn <= MP_ATTN_EAGER; attn++) {
        build(&p, &m, MP_PREC_FP32, 2, attn);
        assert_true(has_prim(&p, MP_P_ROPE));
        bool token_types = false;
        for (size_t k = 0; k < p.n_nodes; k++)
            token_types |= p.nodes[k].prim == MP_P_ADD_POS && p.nodes[k].k == 1;
        assert_true(token_types);
        gradcheck(&p, NULL, 4e-3f, 2e-4, 1e-2, 64);
        mp_program_release(&p);
    }
    mp_model_release(&m);
}

static void test_grad_llama(void **state)
{
    (void)state;
    for (int fused = 0; fused < 2; fused++)
        for (int attn = MP_ATTN_FLASH; attn <= MP_ATTN_EAGER; attn++) {
            struct mp_model m;
            struct mp_program p;
            llama_model(&m, fused);
            build(&p, &m, MP_PREC_FP32, 2, attn);
            assert_true(has_prim(&p, MP_P_RMSNORM) && has_prim(&p, MP_P_ROPE) && has_prim(&p, MP_P_MUL));
            gradcheck(&p, NULL, 4e-3f, 2e-4, 1e-2, 48);
            mp_program_release(&p);
            mp_model_release(&m);
        }
}

static void test_grad_mlp_activations(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    load_json(&m, mlp_json);
    build(&p, &m, MP_PREC_FP32, 3, -1);
    assert_true(has_prim(&p, MP_P_ACT) && has_prim(&p, MP_P_ADD) && has_prim(&p, MP_P_DROPOUT));
    gradcheck(&p, NULL, 1e-3f, 3e-4, 1e-2, 96);
    mp_program_release(&p);
    mp_model_release(&m);
}

static void test_grad_cnn(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    load_json(&m, cnn_json);
    build(&p, &m, MP_PREC_FP32, 2, -1);
    assert_true(has_prim(&p, MP_P_CONV2D) && has_prim(&p, MP_P_BATCHNORM) && has_prim(&p, MP_P_MAXPOOL) &&
                has_prim(&p, MP_P_AVGPOOL) && has_prim(&p, MP_P_ADAPTIVE_AVGPOOL) && has_prim(&p, MP_P_VIEW));
    gradcheck(&p, NULL, 1e-3f, 3e-4, 1e-2, 64);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Relative L2 distance of two gradient vectors. */
static double rel_l2(const float *a, const float *b, uint64_t n)
{
    double num = 0, den = 0;
    for (uint64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void grads_of(const struct mp_model *m, enum mp_precision prec, int attn, const struct mp_schedule *s,
                     float *g, double *loss)
{
    struct mp_program p;
    build(&p, m, prec, 2, attn);
    struct mp_exec *x = exec_new(&p, MP_OPT_SGD, 0);
    *loss = step(x, s, false, g);
    mp_host_exec_free(x);
    mp_program_release(&p);
}

/* The flash path (lse only) and the eager path (s x s probabilities, copies)
 * compute the same function, dropout masks included. */
static void test_flash_matches_eager(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    load_json(&m, gpt_json);
    build(&p, &m, MP_PREC_FP32, 2, MP_ATTN_FLASH);
    uint64_t n = p.total_params;
    mp_program_release(&p);
    float *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    double la, lb;
    grads_of(&m, MP_PREC_FP32, MP_ATTN_FLASH, NULL, a, &la);
    grads_of(&m, MP_PREC_FP32, MP_ATTN_EAGER, NULL, b, &lb);
    assert_true(fabs(la - lb) < 1e-5);
    assert_true(rel_l2(a, b, n) < 1e-5);
    free(a);
    free(b);
    mp_model_release(&m);
}

/* Autocast (casts, half copies of weights and activations, the half weight-grad
 * temporary) and pure bf16 stay close to fp32. */
static void test_half_precisions_track_fp32(void **state)
{
    (void)state;
    struct mp_model m;
    llama_model(&m, true);
    struct mp_program p;
    build(&p, &m, MP_PREC_FP32, 2, -1);
    uint64_t n = p.total_params;
    mp_program_release(&p);
    float *ref = calloc(n, sizeof *ref), *g = calloc(n, sizeof *g);
    double lref, l;
    grads_of(&m, MP_PREC_FP32, -1, NULL, ref, &lref);
    grads_of(&m, MP_PREC_AMP_BF16, -1, NULL, g, &l);
    assert_true(fabs(l - lref) < 2e-2 * fabs(lref));
    assert_true(rel_l2(g, ref, n) < 5e-2);
    grads_of(&m, MP_PREC_AMP_FP16, MP_ATTN_EAGER, NULL, g, &l);
    assert_true(fabs(l - lref) < 5e-3 * fabs(lref));
    assert_true(rel_l2(g, ref, n) < 1e-2);
    grads_of(&m, MP_PREC_BF16, -1, NULL, g, &l);
    assert_true(fabs(l - lref) < 3e-2 * fabs(lref));
    assert_true(rel_l2(g, ref, n) < 1.5e-1);
    free(ref);
    free(g);
    mp_model_release(&m);
}

/* Recomputation under a checkpoint schedule reproduces the forward bit for bit
 * (dropout masks included), so gradients are identical. */
static void test_checkpoint_same_grads(void **state)
{
    (void)state;
    struct mp_model m;
    load_json(&m, gpt_json);
    struct mp_program p;
    build(&p, &m, MP_PREC_AMP_BF16, 2, -1);
    uint64_t n = p.total_params;
    size_t L = p.n_blocks;
    mp_program_release(&p);
    struct mp_schedule s;
    mp_schedule_init(&s);
    assert_int_equal(mp_ckpt_schedule_sequential(L, 2, &s), MP_OK);
    float *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    double la, lb;
    grads_of(&m, MP_PREC_AMP_BF16, -1, NULL, a, &la);
    grads_of(&m, MP_PREC_AMP_BF16, -1, &s, b, &lb);
    assert_true(la == lb);
    assert_memory_equal(a, b, n * sizeof *a);
    /* every block checkpointed: each forward runs twice */
    size_t start[4] = {0, 1, 2, 3};
    bool ck[4] = {true, true, true, true};
    assert_int_equal(mp_ckpt_schedule_segments(L, L, start, ck, &s), MP_OK);
    grads_of(&m, MP_PREC_AMP_BF16, -1, &s, b, &lb);
    assert_true(la == lb);
    assert_memory_equal(a, b, n * sizeof *a);
    free(a);
    free(b);
    mp_schedule_release(&s);
    mp_model_release(&m);
}

/* ---- memory: measured == estimated ------------------------------------------------------------ */

static uint64_t estimate_peak(const struct mp_program *p, const struct mp_schedule *s, const struct mp_train_opts *t)
{
    struct mp_estimate e;
    struct mp_diag d = {{0}};
    if (mp_estimate_run(p, s, t, 0, &e, &d) != MP_OK)
        fail_msg("estimate: %s", d.msg);
    uint64_t peak = e.peak_allocated_bytes;
    mp_estimate_release(&e);
    return peak;
}

static size_t peaks_checked;

static void check_peaks(const char *name, const struct mp_model *m, uint64_t batch, int attn)
{
    static const enum mp_precision precs[] = {MP_PREC_FP32, MP_PREC_AMP_BF16, MP_PREC_AMP_FP16, MP_PREC_BF16};
    static const enum mp_optimizer opts[] = {MP_OPT_SGD, MP_OPT_SGD_MOMENTUM, MP_OPT_ADAM,
                                             MP_OPT_ADAMW, MP_OPT_ADAFACTOR, MP_OPT_ADAM8BIT};
    for (size_t i = 0; i < 4; i++) {
        struct mp_program p;
        build(&p, m, precs[i], batch, attn);
        struct mp_schedule none, seq;
        mp_schedule_init(&none);
        mp_schedule_init(&seq);
        assert_int_equal(mp_ckpt_schedule_none(p.n_blocks, &none), MP_OK);
        assert_int_equal(mp_ckpt_schedule_sequential(p.n_blocks, p.n_blocks >= 2 ? 2 : 1, &seq), MP_OK);
        const struct mp_schedule *scheds[3] = {NULL, &none, &seq};
        for (size_t j = 0; j < 6; j++)
            for (size_t k = 0; k < 3; k++) {
                struct mp_train_opts t = train_opts(opts[j], (i + j + k) % 2 ? 8519680 : 0);
                uint64_t est = estimate_peak(&p, scheds[k], &t);
                struct mp_probe_result r;
                probe_host(&p, scheds[k], &t, 0, 1, &r);
                if (!r.fits || r.measured_peak_bytes != est)
                    fail_msg("%s %s %s sched %zu: measured %llu, estimated %llu", name, mp_precision_str(precs[i]),
                             mp_optimizer_str(opts[j]), k, (unsigned long long)r.measured_peak_bytes,
                             (unsigned long long)est);
                peaks_checked++;
            }
        mp_schedule_release(&none);
        mp_schedule_release(&seq);
        mp_program_release(&p);
    }
}

static void test_peak_equals_estimate_bundled(void **state)
{
    (void)state;
    static const char *names[] = {"tiny-test", "tiny-mlp", "chain-custom"};
    size_t found = 0;
    for (size_t i = 0; i < 3; i++) {
        struct mp_model m;
        if (!load_file(&m, names[i])) {
            print_message("  models/%s.json not found: skipped\n", names[i]);
            continue;
        }
        found++;
        check_peaks(names[i], &m, 2, -1);
        if (i == 0)
            check_peaks("tiny-test eager", &m, 3, MP_ATTN_EAGER);
        mp_model_release(&m);
    }
    assert_true(found > 0);
}

static void test_peak_equals_estimate_test_models(void **state)
{
    (void)state;
    const char *jsons[] = {gpt_json, neox_json, mlp_json, cnn_json};
    for (size_t i = 0; i < 4; i++) {
        struct mp_model m;
        load_json(&m, jsons[i]);
        check_peaks("test model", &m, 2, i == 0 ? MP_ATTN_EAGER : -1);
        mp_model_release(&m);
    }
    struct mp_model m;
    llama_model(&m, false);
    check_peaks("llama", &m, 1, -1);
    mp_model_release(&m);
    print_message("  %zu peaks equal\n", peaks_checked);
}

/* The HF families of session 4 (tiny configs, 16 positions): OLMo's weightless LayerNorm and
 * clip_qkv clamps, Nemotron's LayerNorm1P, HunYuan's q/k norms after the rotary, Apertus's xIELU,
 * Ministral's layer types: the host executor's peak equals the estimate. */
static void test_peak_equals_estimate_hf_families(void **state)
{
    (void)state;
    static const char *const cfgs[] = {
        "{\"model_type\": \"olmo\", \"clip_qkv\": 8.0",
        "{\"model_type\": \"nemotron\", \"head_dim\": 8",
        "{\"model_type\": \"hunyuan_v1_dense\", \"head_dim\": 8",
        "{\"model_type\": \"apertus\"",
        "{\"model_type\": \"ministral\", \"head_dim\": 8, \"sliding_window\": 8, "
        "\"layer_types\": [\"sliding_attention\", \"full_attention\"]",
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "%s, \"vocab_size\": 11, \"hidden_size\": 16, \"num_hidden_layers\": 2, "
                 "\"num_attention_heads\": 2, \"num_key_value_heads\": 2, \"intermediate_size\": 24, "
                 "\"max_position_embeddings\": 16}", cfgs[i]);
        struct mp_model m;
        struct mp_diag d = {{0}};
        mp_model_init(&m);
        if (mp_model_load_string(&m, json, strlen(json), "cfg.json", &d) != MP_OK)
            fail_msg("%s", d.msg);
        check_peaks(cfgs[i], &m, 2, -1);
        mp_model_release(&m);
    }
}

/* SDPA's math kernel (--torch 2.11, fp32 grouped-query attention: docs/memory-facts.md#sdpa-math):
 * the llama test model (4 q heads, 2 k/v heads) lowers its attention as the eager op chain; the
 * host executor's peak equals the estimate under every schedule and optimizer, and it computes the
 * fused kernel's function (the same loss and gradients as the default build). */
static void build_torch(struct mp_program *p, const struct mp_model *m, unsigned torch)
{
    struct mp_build_opts o;
    struct mp_diag d = {{0}};
    mp_build_opts_default(&o);
    o.batch = 2;
    o.precision = MP_PREC_FP32;
    o.torch = torch;
    if (mp_program_build(m, &o, p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
}

static void test_sdpa_math_kernel(void **state)
{
    (void)state;
    struct mp_model m;
    llama_model(&m, false);
    struct mp_program p[2];
    build_torch(&p[0], &m, 211);
    build_torch(&p[1], &m, 215);
    assert_true(p[0].sdpa_math && !p[1].sdpa_math);
    size_t eager[2] = {0, 0};
    for (int i = 0; i < 2; i++)
        for (size_t k = 0; k < p[i].n_nodes; k++)
            eager[i] += p[i].nodes[k].prim == MP_P_ATTN && p[i].nodes[k].eager;
    assert_int_equal(eager[0], 2);
    assert_int_equal(eager[1], 0);
    struct mp_schedule none, seq;
    mp_schedule_init(&none);
    mp_schedule_init(&seq);
    assert_int_equal(mp_ckpt_schedule_none(p[0].n_blocks, &none), MP_OK);
    assert_int_equal(mp_ckpt_schedule_sequential(p[0].n_blocks, 2, &seq), MP_OK);
    const struct mp_schedule *scheds[3] = {NULL, &none, &seq};
    static const enum mp_optimizer opts[] = {MP_OPT_SGD, MP_OPT_ADAMW};
    for (size_t j = 0; j < 2; j++)
        for (size_t k = 0; k < 3; k++) {
            struct mp_train_opts t = train_opts(opts[j], k % 2 ? 8519680 : 0);
            struct mp_probe_result r;
            probe_host(&p[0], scheds[k], &t, 0, 1, &r);
            uint64_t est = estimate_peak(&p[0], scheds[k], &t);
            if (!r.fits || r.measured_peak_bytes != est)
                fail_msg("math kernel, %s, sched %zu: measured %llu, estimated %llu", mp_optimizer_str(opts[j]), k,
                         (unsigned long long)r.measured_peak_bytes, (unsigned long long)est);
        }
    mp_schedule_release(&none);
    mp_schedule_release(&seq);
    uint64_t n = p[0].total_params;
    float *g[2] = {calloc(n, sizeof(float)), calloc(n, sizeof(float))};
    double loss[2];
    for (int i = 0; i < 2; i++) {
        struct mp_exec *x = exec_new(&p[i], MP_OPT_SGD, 0);
        loss[i] = step(x, NULL, false, g[i]);
        mp_host_exec_free(x);
        mp_program_release(&p[i]);
    }
    assert_true(fabs(loss[0] - loss[1]) < 1e-5);
    assert_true(rel_l2(g[0], g[1], n) < 1e-5);
    free(g[0]);
    free(g[1]);
    mp_model_release(&m);
}

/* ---- out of memory ---------------------------------------------------------------------------- */

static void test_oom_just_below_peak(void **state)
{
    (void)state;
    struct mp_model m;
    load_json(&m, gpt_json);
    struct mp_program p;
    build(&p, &m, MP_PREC_AMP_BF16, 2, -1);
    struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
    uint64_t peak = estimate_peak(&p, NULL, &t);
    struct mp_probe_result r;
    probe_host(&p, NULL, &t, peak, 2, &r);
    assert_true(r.fits);
    assert_int_equal(r.measured_peak_bytes, peak);
    probe_host(&p, NULL, &t, peak - 1, 2, &r);
    assert_false(r.fits);
    assert_true(r.oom_request_bytes > 0);
    assert_true(r.oom_event[0] != '\0');
    assert_true(r.measured_peak_bytes < peak);
    /* the executor frees every storage on OOM */
    struct mp_exec *x;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_host_exec_new(&x, &p, &t, peak - 1, 1, &d), MP_OK);
    double loss;
    assert_int_equal(mp_host_exec_step(x, NULL, true, NULL, &loss, &d), MP_ERR_OOM);
    assert_int_equal(mp_host_exec_pool(x)->n_live, 0);
    assert_int_equal(mp_host_exec_pool(x)->cur, 0);
    mp_host_exec_free(x);
    /* a capacity below the parameters fails at setup */
    probe_host(&p, NULL, &t, 1024, 1, &r);
    assert_false(r.fits);
    assert_non_null(strstr(r.oom_event, "setup"));
    mp_program_release(&p);
    mp_model_release(&m);
}

/* ---- training --------------------------------------------------------------------------------- */

static void check_falls(const struct mp_program *p, enum mp_optimizer o, bool strictly)
{
    struct mp_train_opts t = train_opts(o, 8519680);
    struct mp_probe_result r;
    probe_host(p, NULL, &t, 0, 5, &r);
    assert_true(r.fits);
    assert_int_equal(r.steps, 5);
    assert_true(r.step_ms > 0 && r.samples_per_s > 0);
    for (int i = 0; i < 5; i++)
        assert_true(isfinite(r.losses[i]));
    if (!(r.losses[4] < r.losses[0]))
        fail_msg("%s: loss %g -> %g", mp_optimizer_str(o), r.losses[0], r.losses[4]);
    if (strictly)
        for (int i = 1; i < 5; i++)
            if (!(r.losses[i] < r.losses[i - 1]))
                fail_msg("%s: loss rose at step %d: %g -> %g", mp_optimizer_str(o), i, r.losses[i - 1], r.losses[i]);
}

static void test_loss_falls_tiny_test(void **state)
{
    (void)state;
    struct mp_model m;
    if (!load_file(&m, "tiny-test")) { /* fall back to the same shape written here */
        load_json(&m, "{\"name\":\"tiny\",\"input\":{\"tokens\":8},\"layers\":["
                      "{\"block\":\"embed\",\"layers\":[{\"type\":\"embedding\",\"name\":\"wte\",\"vocab\":64,\"dim\":16},"
                      "{\"type\":\"pos_embedding\",\"name\":\"wpe\",\"max_positions\":8,\"dim\":16}]},"
                      "{\"repeat\":2,\"name\":\"h\",\"layers\":[{\"type\":\"transformer_block\",\"dim\":16,\"heads\":2,"
                      "\"ffn\":32,\"act\":\"gelu_tanh\",\"fused_qkv\":true}]},"
                      "{\"block\":\"head\",\"layers\":[{\"type\":\"layernorm\",\"name\":\"ln_f\",\"dim\":16},"
                      "{\"type\":\"lm_head\",\"vocab\":64,\"dim\":16,\"tied\":true}]}]}");
    }
    struct mp_program p;
    build(&p, &m, MP_PREC_FP32, 4, -1);
    check_falls(&p, MP_OPT_ADAMW, true);
    check_falls(&p, MP_OPT_ADAM, true);
    check_falls(&p, MP_OPT_SGD, true);
    check_falls(&p, MP_OPT_SGD_MOMENTUM, false);
    check_falls(&p, MP_OPT_ADAFACTOR, true);
    check_falls(&p, MP_OPT_ADAM8BIT, false);
    mp_program_release(&p);
    build(&p, &m, MP_PREC_AMP_BF16, 4, MP_ATTN_EAGER);
    check_falls(&p, MP_OPT_ADAMW, true);
    mp_program_release(&p);
    build(&p, &m, MP_PREC_BF16, 4, -1);
    check_falls(&p, MP_OPT_ADAMW, false);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* 8-bit Adam on tensors large enough for blockwise states (>= 4096 elements). */
static void test_loss_falls_adam8bit_blockwise(void **state)
{
    (void)state;
    struct mp_model m;
    load_json(&m, "{\"name\":\"w\",\"input\":{\"shape\":[64]},\"layers\":["
                  "{\"block\":\"b\",\"layers\":[{\"type\":\"linear\",\"name\":\"l0\",\"in_features\":64,\"out_features\":96},"
                  "{\"type\":\"activation\",\"name\":\"a\",\"act\":\"relu\"},"
                  "{\"type\":\"linear\",\"name\":\"l1\",\"in_features\":96,\"out_features\":64}]},"
                  "{\"block\":\"c\",\"layers\":[{\"type\":\"classifier\",\"in_features\":64,\"classes\":10}]}]}");
    struct mp_program p;
    build(&p, &m, MP_PREC_FP32, 8, -1);
    assert_true(p.params[0].elems >= MP_ADAM8_MIN_ELEMS);
    check_falls(&p, MP_OPT_ADAM8BIT, true);
    check_falls(&p, MP_OPT_ADAFACTOR, true);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Custom chains run deterministically: same losses from the same seed. */
static void test_custom_chain_runs(void **state)
{
    (void)state;
    struct mp_model m;
    if (!load_file(&m, "chain-custom")) {
        load_json(&m, "{\"name\":\"cc\",\"input\":{\"bytes_per_sample\":64},\"layers\":["
                      "{\"type\":\"custom\",\"name\":\"a\",\"output_bytes\":128,\"saved_bytes\":512,\"params\":100,"
                      "\"fwd_flops\":1000},{\"type\":\"custom\",\"name\":\"b\",\"output_bytes\":16,\"saved_bytes\":16,"
                      "\"params\":10,\"fwd_flops\":100}]}");
    }
    struct mp_program p;
    build(&p, &m, MP_PREC_AMP_BF16, 2, -1);
    assert_true(has_prim(&p, MP_P_CUSTOM));
    struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 0);
    struct mp_probe_result a, b;
    probe_host(&p, NULL, &t, 0, 3, &a);
    probe_host(&p, NULL, &t, 0, 3, &b);
    assert_true(a.fits && b.fits);
    assert_memory_equal(a.losses, b.losses, 3 * sizeof a.losses[0]);
    assert_true(isfinite(a.losses[0]));
    mp_program_release(&p);
    mp_model_release(&m);
}

/* ---- the backend interface --------------------------------------------------------------------- */

static void test_backend_registry(void **state)
{
    (void)state;
    struct mp_probe_opts o;
    struct mp_probe *pr = NULL;
    struct mp_diag d = {{0}};
    mp_probe_opts_default(&o);
    assert_string_equal(o.backend, "auto");
    assert_int_equal(o.steps, 3);
    assert_int_equal(o.seed, 1);
    o.backend = "host";
    assert_int_equal(mp_probe_open(&pr, &o, &d), MP_OK);
    assert_string_equal(mp_probe_backend(pr), "host");
    struct mp_device_info di;
    assert_int_equal(mp_probe_device_info(pr, &di), MP_OK);
    assert_non_null(strstr(di.name, "host"));
    mp_probe_close(pr);
    mp_probe_close(NULL);

    o.backend = "auto";
    assert_int_equal(mp_probe_open(&pr, &o, &d), MP_OK);
    assert_string_equal(mp_probe_backend(pr), mp_cuda_device_available() ? "cuda" : "host");
    mp_probe_close(pr);

    o.backend = "cuda";
    enum mp_status st = mp_probe_open(&pr, &o, &d);
    if (!mp_cuda_built()) {
        assert_int_equal(st, MP_ERR_UNSUPPORTED);
        assert_string_equal(d.msg, "the cuda backend is not built in (rebuild with nvcc: make CUDA=yes)");
    } else if (!mp_cuda_device_available()) {
        assert_int_equal(st, MP_ERR_DEVICE);
        assert_null(pr);
    } else {
        assert_int_equal(st, MP_OK);
        mp_probe_close(pr);
    }
    o.backend = "tpu";
    assert_int_equal(mp_probe_open(&pr, &o, &d), MP_ERR_USAGE);

    /* steps out of range */
    struct mp_model m;
    load_json(&m, gpt_json);
    struct mp_program p;
    build(&p, &m, MP_PREC_FP32, 1, -1);
    struct mp_train_opts t = train_opts(MP_OPT_SGD, 0);
    struct mp_probe_result r;
    o.backend = "host";
    o.steps = 65;
    assert_int_equal(mp_probe_open(&pr, &o, &d), MP_OK);
    assert_int_equal(mp_probe_run(pr, &p, NULL, &t, &r, &d), MP_ERR_USAGE);
    mp_probe_close(pr);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* The fused q/k/v view offsets both executors use. */
static void test_layout_offsets(void **state)
{
    (void)state;
    struct mp_model m;
    llama_model(&m, true);
    struct mp_program p;
    build(&p, &m, MP_PREC_FP32, 1, -1);
    struct mp_node_layout *L;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_exec_layout(&p, &L, &d), MP_OK);
    size_t ropes = 0, attns = 0;
    for (size_t k = 0; k < p.n_nodes; k++) {
        const struct mp_node *n = &p.nodes[k];
        if (n->prim == MP_P_ROPE) { /* q rope at 0, k rope at a*d = 16 of the 32-wide fused storage */
            assert_int_equal(L[k].in_w[0], 32);
            assert_int_equal(L[k].in_off[0], ropes++ % 2 ? 16 : 0);
        }
        if (n->prim == MP_P_ATTN) { /* q, k from the ropes; v from the fused storage at a*d + kv*d = 24 */
            attns++;
            assert_int_equal(L[k].in_off[0], 0);
            assert_int_equal(L[k].in_off[1], 0);
            assert_int_equal(L[k].in_w[2], 32);
            assert_int_equal(L[k].in_off[2], 24);
        }
    }
    assert_int_equal(ropes, 4);
    assert_int_equal(attns, 2);
    free(L);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* ---- CUDA (skipped without a device) ------------------------------------------------------------- */

static void test_cuda_matches_host(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    struct mp_model m;
    load_json(&m, gpt_json);
    for (int attn = MP_ATTN_FLASH; attn <= MP_ATTN_EAGER; attn++) {
        struct mp_program p;
        build(&p, &m, MP_PREC_FP32, 2, attn);
        struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
        struct mp_probe_result h, c;
        probe_host(&p, NULL, &t, 0, 3, &h);
        probe_cuda(&p, &t, 0, 3, &c);
        assert_true(c.fits);
        assert_string_equal(c.backend, "cuda");
        assert_int_equal(c.measured_peak_bytes, estimate_peak(&p, NULL, &t));
        for (int i = 0; i < 3; i++)
            if (fabs(c.losses[i] - h.losses[i]) > 2e-3 * fabs(h.losses[i]))
                fail_msg("step %d: cuda loss %g, host %g", i, c.losses[i], h.losses[i]);
        assert_true(c.step_ms > 0 && c.samples_per_s > 0);
        assert_true(c.gemm_tflops > 0);
        assert_true(c.device_used_after >= c.device_used_before);
        mp_program_release(&p);
    }
    mp_model_release(&m);
}

/* SDPA's math kernel (the llama test model, fp32 GQA, --torch 2.11) on the CUDA backend: the
 * eager op chain's kernels, the peak equal to the estimate, the host's losses. */
static void test_cuda_sdpa_math(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    struct mp_model m;
    llama_model(&m, false);
    struct mp_program p;
    build_torch(&p, &m, 211);
    assert_true(p.sdpa_math);
    struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
    struct mp_probe_result h, c;
    probe_host(&p, NULL, &t, 0, 3, &h);
    probe_cuda(&p, &t, 0, 3, &c);
    assert_true(c.fits);
    assert_int_equal(c.measured_peak_bytes, estimate_peak(&p, NULL, &t));
    for (int i = 0; i < 3; i++)
        if (fabs(c.losses[i] - h.losses[i]) > 2e-3 * fabs(h.losses[i]))
            fail_msg("step %d: cuda loss %g, host %g", i, c.losses[i], h.losses[i]);
    mp_program_release(&p);
    mp_model_release(&m);
}

static void test_cuda_all_models_train(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    const char *jsons[] = {gpt_json, neox_json, mlp_json, cnn_json};
    static const enum mp_precision precs[] = {MP_PREC_FP32, MP_PREC_AMP_BF16, MP_PREC_AMP_FP16, MP_PREC_BF16};
    static const enum mp_optimizer opts[] = {MP_OPT_SGD, MP_OPT_SGD_MOMENTUM, MP_OPT_ADAM,
                                             MP_OPT_ADAMW, MP_OPT_ADAFACTOR, MP_OPT_ADAM8BIT};
    for (size_t i = 0; i < 5; i++) {
        struct mp_model m;
        if (i < 4)
            load_json(&m, jsons[i]);
        else
            llama_model(&m, true);
        for (size_t k = 0; k < 4; k++) {
            struct mp_program p;
            build(&p, &m, precs[k], 4, -1);
            struct mp_train_opts t = train_opts(opts[(i + k) % 6], 33554432);
            struct mp_probe_result h, c;
            probe_host(&p, NULL, &t, 0, 4, &h);
            print_message("  cuda: model %zu, %s, %s\n", i, mp_precision_str(precs[k]),
                          mp_optimizer_str(opts[(i + k) % 6]));
            probe_cuda(&p, &t, 0, 4, &c);
            assert_true(c.fits);
            assert_int_equal(c.measured_peak_bytes, h.measured_peak_bytes);
            for (int s = 0; s < 4; s++)
                assert_true(isfinite(c.losses[s]));
            if (fabs(c.losses[0] - h.losses[0]) > 5e-2 * fabs(h.losses[0]) + 1e-3)
                fail_msg("model %zu %s: cuda loss %g, host %g", i, mp_precision_str(precs[k]), c.losses[0],
                         h.losses[0]);
            mp_program_release(&p);
        }
        mp_model_release(&m);
    }
}

static void test_cuda_oom_is_a_result(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    struct mp_model m;
    llama_model(&m, false);
    struct mp_program p;
    build(&p, &m, MP_PREC_AMP_BF16, 4, -1);
    struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
    uint64_t peak = estimate_peak(&p, NULL, &t);
    struct mp_probe_result r;
    probe_cuda(&p, &t, peak - 1, 2, &r);
    assert_false(r.fits);
    assert_true(r.oom_request_bytes > 0);
    probe_cuda(&p, &t, peak, 2, &r); /* the device is usable again after an OOM */
    assert_true(r.fits);
    assert_int_equal(r.measured_peak_bytes, peak);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Two runs on one open cuda backend (as suggest's probes): the second starts from the
 * same device usage as the first (the driver pool is trimmed between runs, so cached
 * blocks of run 1 are not counted as "used" nor cause a false out-of-memory), and the
 * im2col buffer comes from that pool and is reported. */
static void test_cuda_pool_trimmed_between_runs(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    struct mp_model m;
    load_json(&m, cnn_json);
    struct mp_program p;
    build(&p, &m, MP_PREC_AMP_BF16, 8, -1);
    struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 33554432);
    struct mp_probe_opts o;
    struct mp_probe *pr;
    struct mp_diag d = {{0}};
    mp_probe_opts_default(&o);
    o.backend = "cuda";
    o.steps = 1;
    if (mp_probe_open(&pr, &o, &d) != MP_OK)
        fail_msg("cuda open: %s", d.msg);
    struct mp_probe_result r1, r2;
    assert_int_equal(mp_probe_run(pr, &p, NULL, &t, &r1, &d), MP_OK);
    assert_int_equal(mp_probe_run(pr, &p, NULL, &t, &r2, &d), MP_OK);
    assert_true(r1.fits && r2.fits);
    assert_true(r1.measured_peak_bytes >= 33554432);
    assert_true(r1.outside_pool_bytes > 0);
    if (r2.device_used_before > r1.device_used_before + (2u << 20))
        fail_msg("run 2 starts with %llu bytes used, run 1 with %llu: cached blocks were not trimmed",
                 (unsigned long long)r2.device_used_before, (unsigned long long)r1.device_used_before);
    mp_probe_close(pr);
    mp_program_release(&p);
    mp_model_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_layout_offsets),
        cmocka_unit_test(test_grad_gpt_flash),
        cmocka_unit_test(test_grad_gpt_eager),
        cmocka_unit_test(test_grad_neox),
        cmocka_unit_test(test_grad_llama),
        cmocka_unit_test(test_grad_mlp_activations),
        cmocka_unit_test(test_grad_cnn),
        cmocka_unit_test(test_flash_matches_eager),
        cmocka_unit_test(test_half_precisions_track_fp32),
        cmocka_unit_test(test_checkpoint_same_grads),
        cmocka_unit_test(test_peak_equals_estimate_bundled),
        cmocka_unit_test(test_peak_equals_estimate_test_models),
        cmocka_unit_test(test_peak_equals_estimate_hf_families),
        cmocka_unit_test(test_sdpa_math_kernel),
        cmocka_unit_test(test_oom_just_below_peak),
        cmocka_unit_test(test_loss_falls_tiny_test),
        cmocka_unit_test(test_loss_falls_adam8bit_blockwise),
        cmocka_unit_test(test_custom_chain_runs),
        cmocka_unit_test(test_backend_registry),
        cmocka_unit_test(test_cuda_matches_host),
        cmocka_unit_test(test_cuda_sdpa_math),
        cmocka_unit_test(test_cuda_all_models_train),
        cmocka_unit_test(test_cuda_oom_is_a_result),
        cmocka_unit_test(test_cuda_pool_trimmed_between_runs),
    };
    return cmocka_run_group_tests_name("probe", tests, NULL, NULL);
}
