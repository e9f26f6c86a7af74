/* test_probe_ops.c — per-op backend tests (as ggml's test-backend-ops).
 *
 * Every prim runs in its own small program: the op under test plus the least scaffolding
 * that gives its input a gradient (an embedding or a Linear, themselves tested first).
 * Host: the loss's gradient with respect to every parameter element of the program against
 * central finite differences (fp32), and a few training steps in every precision stay
 * finite.  cuda (skipped without a device): the same program, host against cuda, loss by
 * loss over training steps in fp32, amp-bf16 and pure bf16, so a first GPU run names the op
 * that differs instead of "the loss differs".  A coverage test fails when a prim has no
 * program here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "probe_check.h"

/* ---- the programs ---------------------------------------------------------------------------- */

/* Scaffolds: token ids -> embedding (8 wide), a 6-vector -> Linear (8 wide), a 2x6x6 image;
 * the argument is ",{layer}..." (or "" for the scaffold alone). */

#define TOK(layers) "{\"name\":\"op\",\"input\":{\"tokens\":4},\"layers\":[" \
    "{\"type\":\"embedding\",\"name\":\"wte\",\"vocab\":11,\"dim\":8}" layers "]}"
#define VEC(layers) "{\"name\":\"op\",\"input\":{\"shape\":[6]},\"layers\":[" \
    "{\"type\":\"linear\",\"name\":\"in\",\"in_features\":6,\"out_features\":8}" layers "]}"
#define IMG(layers) "{\"name\":\"op\",\"input\":{\"shape\":[2,6,6]},\"layers\":[" layers "]}"
#define CONV0 "{\"type\":\"conv2d\",\"name\":\"conv\",\"in_ch\":2,\"out_ch\":4,\"kernel\":3,\"padding\":1,\"bias\":true}"
#define ACT(a) VEC(",{\"type\":\"activation\",\"name\":\"act\",\"act\":\"" a "\"}")
/* 7 wide: 14 elements at batch 2, so the cuda elementwise kernels run their 8-element vector
 * body and their scalar tail */
#define VEC7(layers) "{\"name\":\"op\",\"input\":{\"shape\":[6]},\"layers\":[" \
    "{\"type\":\"linear\",\"name\":\"in\",\"in_features\":6,\"out_features\":7}" layers "]}"

struct op_case {
    const char *name;
    enum mp_prim prim;     /* the prim under test (the program must contain it) */
    const char *json;
    enum mp_ft_mode ft;    /* full; LoRA adapters (the SCALE prim) or QLoRA (NF4 base Linears) */
    bool opaque;           /* custom: a stand-in computation on bytes, no derivative to check */
};

static const struct op_case CASES[] = {
    {"embedding", MP_P_EMBED, TOK(""), MP_FT_FULL, false},
    {"linear", MP_P_LINEAR, VEC(""), MP_FT_FULL, false},
    {"pos_embedding", MP_P_ADD_POS, TOK(",{\"type\":\"pos_embedding\",\"name\":\"wpe\",\"max_positions\":4,\"dim\":8}"),
     MP_FT_FULL, false},
    {"layernorm", MP_P_LAYERNORM, VEC(",{\"type\":\"layernorm\",\"name\":\"ln\",\"dim\":8}"), MP_FT_FULL, false},
    {"rmsnorm", MP_P_RMSNORM, VEC(",{\"type\":\"rmsnorm\",\"name\":\"rms\",\"dim\":8}"), MP_FT_FULL, false},
    /* every activation of util/sets.h's table, one program each */
#define MP_X(id, name, aliases, saves, extras, amp32, bwd, fwd) {"act " name, MP_P_ACT, ACT(name), MP_FT_FULL, false},
    MP_ACTIVATIONS(MP_X)
#undef MP_X
    {"dropout", MP_P_DROPOUT, VEC(",{\"type\":\"dropout\",\"name\":\"drop\",\"p\":0.25}"), MP_FT_FULL, false},
    {"residual add", MP_P_ADD,
     "{\"name\":\"op\",\"input\":{\"shape\":[6]},\"layers\":[{\"type\":\"linear\",\"name\":\"in\",\"in_features\":6,"
     "\"out_features\":8},{\"block\":\"r\",\"layers\":[{\"type\":\"linear\",\"name\":\"fc\",\"in_features\":8,"
     "\"out_features\":8},{\"type\":\"residual\",\"name\":\"add\"}]}]}",
     MP_FT_FULL, false},
    {"gated mlp (mul)", MP_P_MUL, VEC(",{\"type\":\"mlp\",\"name\":\"mlp\",\"dim\":8,\"ffn\":12,\"gated\":true,"
                                      "\"act\":\"silu\"}"),
     MP_FT_FULL, false},
    {"act silu, odd width", MP_P_ACT, VEC7(",{\"type\":\"activation\",\"name\":\"act\",\"act\":\"silu\"}"),
     MP_FT_FULL, false},
    {"dropout, odd width", MP_P_DROPOUT, VEC7(",{\"type\":\"dropout\",\"name\":\"drop\",\"p\":0.25}"), MP_FT_FULL, false},
    {"gated mlp (mul), odd width", MP_P_MUL, VEC7(",{\"type\":\"mlp\",\"name\":\"mlp\",\"dim\":7,\"ffn\":11,"
                                                  "\"gated\":true,\"act\":\"gelu\"}"),
     MP_FT_FULL, false},
    {"residual add, odd width", MP_P_ADD,
     "{\"name\":\"op\",\"input\":{\"shape\":[6]},\"layers\":[{\"type\":\"linear\",\"name\":\"in\",\"in_features\":6,"
     "\"out_features\":7},{\"block\":\"r\",\"layers\":[{\"type\":\"linear\",\"name\":\"fc\",\"in_features\":7,"
     "\"out_features\":7},{\"type\":\"residual\",\"name\":\"add\"}]}]}",
     MP_FT_FULL, false},
    {"attention sdpa causal", MP_P_ATTN, TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":2}"), MP_FT_FULL, false},
    {"attention eager fused, dropout", MP_P_ATTN,
     TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":2,\"fused_qkv\":true,\"impl\":\"eager\","
         "\"attn_dropout\":0.2}"),
     MP_FT_FULL, false},
    {"attention sdpa, dropout", MP_P_ATTN,
     TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":2,\"attn_dropout\":0.2}"), MP_FT_FULL, false},
    /* cuda's flash path does its GEMMs in blocks when its 64 MiB workspace cannot hold every
     * score (16 bytes each): one (sample, head) of 2112 x 2112 is 1.06 times that, so blocks of
     * 128 query rows (the last one partial; causal: growing key ranges); 2 x 4 entries of
     * 1024 x 1024 are twice that, so 4 entries per call.  The host checks gradients on the
     * short programs only (LONG_SEQ) */
    {"attention sdpa causal, long (query blocks)", MP_P_ATTN,
     "{\"name\":\"op\",\"input\":{\"tokens\":2112},\"layers\":[{\"type\":\"embedding\",\"name\":\"wte\","
     "\"vocab\":11,\"dim\":2},{\"type\":\"attention\",\"name\":\"attn\",\"dim\":2,\"heads\":1}]}",
     MP_FT_FULL, false},
    {"attention sdpa, many heads (entry blocks)", MP_P_ATTN,
     "{\"name\":\"op\",\"input\":{\"tokens\":1024},\"layers\":[{\"type\":\"embedding\",\"name\":\"wte\","
     "\"vocab\":11,\"dim\":8},{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":4}]}",
     MP_FT_FULL, false},
    {"attention GQA, non-causal", MP_P_ATTN,
     TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":4,\"kv_heads\":2,\"causal\":false,"
         "\"bias\":false}"),
     MP_FT_FULL, false},
    {"attention eager GQA (batched dK/dV per group member)", MP_P_ATTN,
     TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":4,\"kv_heads\":2,\"impl\":\"eager\"}"),
     MP_FT_FULL, false},
    {"rope (partial, fused qkv)", MP_P_ROPE,
     TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":2,\"rope\":true,\"rotary_dim\":2,"
         "\"fused_qkv\":true}"),
     MP_FT_FULL, false},
    {"rope (GQA)", MP_P_ROPE,
     TOK(",{\"type\":\"attention\",\"name\":\"attn\",\"dim\":8,\"heads\":4,\"kv_heads\":2,\"head_dim\":2,\"rope\":true}"),
     MP_FT_FULL, false},
    {"lm_head: log_softmax + nll_loss", MP_P_NLL_LOSS, TOK(",{\"type\":\"lm_head\",\"vocab\":11,\"dim\":8}"), MP_FT_FULL, false},
    {"classifier (log_softmax)", MP_P_LOG_SOFTMAX, VEC(",{\"type\":\"classifier\",\"in_features\":8,\"classes\":5}"),
     MP_FT_FULL, false},
    {"conv2d", MP_P_CONV2D, IMG(CONV0), MP_FT_FULL, false},
    {"conv2d grouped, strided", MP_P_CONV2D,
     IMG(CONV0 ",{\"type\":\"conv2d\",\"name\":\"g\",\"in_ch\":4,\"out_ch\":4,\"kernel\":3,\"stride\":2,\"groups\":2}"),
     MP_FT_FULL, false},
    {"batchnorm2d", MP_P_BATCHNORM, IMG(CONV0 ",{\"type\":\"batchnorm2d\",\"name\":\"bn\",\"channels\":4}"), MP_FT_FULL, false},
    {"maxpool2d", MP_P_MAXPOOL,
     IMG(CONV0 ",{\"type\":\"maxpool2d\",\"name\":\"pool\",\"kernel\":3,\"stride\":2,\"padding\":1}"), MP_FT_FULL, false},
    {"avgpool2d", MP_P_AVGPOOL, IMG(CONV0 ",{\"type\":\"avgpool2d\",\"name\":\"ap\",\"kernel\":2,\"stride\":2}"), MP_FT_FULL, false},
    {"adaptive_avgpool2d", MP_P_ADAPTIVE_AVGPOOL,
     IMG(CONV0 ",{\"type\":\"adaptive_avgpool2d\",\"name\":\"aap\",\"output_size\":2}"), MP_FT_FULL, false},
    {"flatten (view)", MP_P_VIEW, IMG(CONV0 ",{\"type\":\"flatten\",\"name\":\"fl\"}"), MP_FT_FULL, false},
    {"adaptive_avgpool2d to 1x1 + flatten", MP_P_ADAPTIVE_AVGPOOL,
     IMG(CONV0 ",{\"type\":\"adaptive_avgpool2d\",\"name\":\"aap\",\"output_size\":1},"
               "{\"type\":\"flatten\",\"name\":\"fl\"}"),
     MP_FT_FULL, false},
    {"custom", MP_P_CUSTOM,
     "{\"name\":\"op\",\"input\":{\"bytes_per_sample\":64},\"layers\":[{\"type\":\"custom\",\"name\":\"c\","
     "\"output_bytes\":32,\"saved_bytes\":96,\"params\":40,\"fwd_flops\":1000}]}",
     MP_FT_FULL, true},
    {"lora scale", MP_P_SCALE, VEC(",{\"type\":\"linear\",\"name\":\"fc\",\"in_features\":8,\"out_features\":8}"),
     MP_FT_LORA, false},
    /* QLoRA: the base Linears in bitsandbytes NF4 with double quant (in: 8x6 = 48 weights, one
     * partial 64-block; fc: 9x8 = 72, a full block and a partial one), dequantized in forward and
     * backward, fp32 adapters on both */
    {"qlora linear (nf4)", MP_P_LINEAR,
     VEC(",{\"type\":\"linear\",\"name\":\"fc\",\"in_features\":8,\"out_features\":9}"), MP_FT_QLORA, false},
};
#define N_CASES (sizeof CASES / sizeof CASES[0])

#define LONG_SEQ 256 /* longer programs skip the host finite differences */

static const enum mp_precision PRECS[] = {MP_PREC_FP32, MP_PREC_AMP_BF16, MP_PREC_BF16};

static void build_case(struct mp_program *p, const struct mp_model *m, const struct op_case *c,
                       enum mp_precision prec)
{
    struct mp_build_opts o;
    struct mp_diag d = {{0}};
    mp_build_opts_default(&o);
    o.batch = 2;
    o.precision = prec;
    if (c->ft != MP_FT_FULL) {
        o.ft.mode = c->ft;
        o.ft.r = 2;
        o.ft.alpha = 4;
        o.ft.all_linear = true;
    }
    if (mp_program_build(m, &o, p, &d) != MP_OK)
        fail_msg("%s: build: %s", c->name, d.msg);
}

static bool has(const struct mp_program *p, enum mp_prim prim)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        if (p->nodes[k].prim == prim)
            return true;
    return false;
}

/* ---- tests ----------------------------------------------------------------------------------- */

/* Every prim the executors know has a program here (in some precision: CAST appears under autocast). */
static void test_ops_cover_every_prim(void **state)
{
    (void)state;
    bool seen[MP_P_COUNT] = {false};
    for (size_t i = 0; i < N_CASES; i++) {
        struct mp_model m;
        load_json(&m, CASES[i].json);
        for (size_t k = 0; k < sizeof PRECS / sizeof PRECS[0]; k++) {
            struct mp_program p;
            build_case(&p, &m, &CASES[i], PRECS[k]);
            if (!has(&p, CASES[i].prim))
                fail_msg("%s: the program has no %s node", CASES[i].name, mp_prim_str(CASES[i].prim));
            bool quantized = false;
            for (size_t n = 0; n < p.n_nodes; n++)
                quantized |= p.nodes[n].quantized;
            if (quantized != (CASES[i].ft == MP_FT_QLORA))
                fail_msg("%s: quantized base Linears only under QLoRA", CASES[i].name);
            for (size_t n = 0; n < p.n_nodes; n++)
                seen[p.nodes[n].prim] = true;
            mp_program_release(&p);
        }
        mp_model_release(&m);
    }
    /* mixture-of-experts prims and the fused loss heads (--loss) are estimated only:
     * mp_probe_run refuses their programs (program.probe_unsupported; tests/cli.sh checks the
     * refusals) */
    seen[MP_P_ROUTER] = seen[MP_P_ROWS] = seen[MP_P_GROUPED_MM] = seen[MP_P_FUSED_LOSS] = true;
    seen[MP_P_MASKED_SCATTER] = true; /* (--images: the probe refuses the program) */
    for (int k = 0; k < MP_P_COUNT; k++)
        if (!seen[k])
            fail_msg("prim %s has no per-op program in tests/test_probe_ops.c", mp_prim_str((enum mp_prim)k));
}

/* Host: gradients of each op program against finite differences (fp32, no dropout noise:
 * the mask is a function of the step, the same for the +/- evaluations). */
static void test_ops_host_gradients(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CASES; i++) {
        if (CASES[i].opaque)
            continue;
        struct mp_model m;
        load_json(&m, CASES[i].json);
        struct mp_program p;
        build_case(&p, &m, &CASES[i], MP_PREC_FP32);
        if (p.opts.seq > LONG_SEQ) { /* hundreds of finite-difference steps: too slow for CI */
            mp_program_release(&p);
            mp_model_release(&m);
            continue;
        }
        print_message("  %s\n", CASES[i].name);
        gradcheck(&p, NULL, 2e-3f, 3e-4, 2e-2, 32);
        mp_program_release(&p);
        mp_model_release(&m);
    }
}

/* Host: three training steps of each op program in every precision give finite losses. */
static void test_ops_host_train_every_precision(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_CASES; i++) {
        struct mp_model m;
        load_json(&m, CASES[i].json);
        for (size_t k = 0; k < sizeof PRECS / sizeof PRECS[0]; k++) {
            struct mp_program p;
            build_case(&p, &m, &CASES[i], PRECS[k]);
            struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
            struct mp_probe_result r;
            probe_host(&p, NULL, &t, 0, 3, &r);
            assert_true(r.fits);
            for (unsigned s = 0; s < 3; s++)
                if (!isfinite(r.losses[s]))
                    fail_msg("%s %s: step %u loss %g", CASES[i].name, mp_precision_str(PRECS[k]), s, r.losses[s]);
            mp_program_release(&p);
        }
        mp_model_release(&m);
    }
}

/* cuda against host, op by op and precision by precision: the losses of 3 training steps
 * (the first is the forward alone; the next ones follow the backward and the update). */
static void test_ops_cuda_matches_host(void **state)
{
    (void)state;
    if (!mp_cuda_device_available())
        skip();
    size_t bad = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        struct mp_model m;
        load_json(&m, CASES[i].json);
        for (size_t k = 0; k < sizeof PRECS / sizeof PRECS[0]; k++) {
            struct mp_program p;
            build_case(&p, &m, &CASES[i], PRECS[k]);
            struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
            struct mp_probe_result h, c;
            probe_host(&p, NULL, &t, 0, 3, &h);
            print_message("  cuda: %s, %s\n", CASES[i].name, mp_precision_str(PRECS[k]));
            probe_cuda(&p, &t, 0, 3, &c);
            double tol = PRECS[k] == MP_PREC_FP32 ? 1e-4 : 2e-2;
            for (unsigned s = 0; s < 3; s++)
                if (!c.fits || !(fabs(c.losses[s] - h.losses[s]) <= tol * fabs(h.losses[s]) + 1e-5)) {
                    print_message("  %s %s step %u: cuda %g, host %g\n", CASES[i].name,
                                  mp_precision_str(PRECS[k]), s, c.losses[s], h.losses[s]);
                    bad++;
                    break;
                }
            if (c.fits)
                assert_int_equal(c.measured_peak_bytes, h.measured_peak_bytes);
            mp_program_release(&p);
        }
        mp_model_release(&m);
    }
    if (bad)
        fail_msg("%zu op program(s) differ between cuda and host", bad);
}

/* Every optimizer of util/sets.h's table steps a small program (a Linear, a gated MLP's SiLU
 * and an lm head, in every precision): on the host the loss falls over five steps; with a
 * device, cuda matches the host loss by loss and byte for byte at the peak.  A row the probe
 * does not run (its probe column 0) is refused by both backends with one line that names it. */
static const enum mp_optimizer OPTS[] = {
#define MP_X(id, name, state, tmp, wd, hf, aliases, probe, par_probe) MP_OPT_##id,
    MP_OPTIMIZERS(MP_X)
#undef MP_X
};
#define OPT_PROGRAM TOK(",{\"type\":\"linear\",\"name\":\"fc\",\"in_features\":8,\"out_features\":8}," \
                        "{\"type\":\"activation\",\"name\":\"act\",\"act\":\"silu\"}," \
                        "{\"type\":\"lm_head\",\"vocab\":11,\"dim\":8}")

/* The probe refuses an optimizer it does not run: an unsupported-feature error naming it. */
static void refused_optimizer(const char *backend, const struct mp_program *p, const struct mp_train_opts *t)
{
    struct mp_probe_opts o;
    struct mp_probe *pr;
    struct mp_probe_result r;
    struct mp_diag d = {{0}};
    mp_probe_opts_default(&o);
    o.backend = backend;
    o.steps = 2;
    if (mp_probe_open(&pr, &o, &d) != MP_OK)
        fail_msg("%s open: %s", backend, d.msg);
    assert_int_equal(mp_probe_run(pr, p, NULL, t, &r, &d), MP_ERR_UNSUPPORTED);
    char want[96];
    snprintf(want, sizeof want, "--optimizer %s is estimated only", mp_optimizer_str(t->optimizer));
    if (!strstr(d.msg, want) || strchr(d.msg, '\n'))
        fail_msg("%s: %s", backend, d.msg);
    mp_probe_close(pr);
}

static void test_ops_every_optimizer(void **state)
{
    (void)state;
    const struct op_case c = {"optimizer program", MP_P_LINEAR, OPT_PROGRAM, MP_FT_FULL, false};
    bool cuda = mp_cuda_device_available();
    size_t bad = 0;
    struct mp_model m;
    load_json(&m, c.json);
    for (size_t i = 0; i < sizeof OPTS / sizeof OPTS[0]; i++)
        for (size_t k = 0; k < sizeof PRECS / sizeof PRECS[0]; k++) {
            struct mp_program p;
            build_case(&p, &m, &c, PRECS[k]);
            struct mp_train_opts t = train_opts(OPTS[i], 8519680);
            struct mp_probe_result h;
            if (!mp_optimizer_probe(OPTS[i])) {
                refused_optimizer("host", &p, &t);
                if (cuda)
                    refused_optimizer("cuda", &p, &t);
                mp_program_release(&p);
                continue;
            }
            probe_host(&p, NULL, &t, 0, 5, &h);
            assert_true(h.fits);
            for (unsigned s = 0; s < 5; s++)
                if (!isfinite(h.losses[s]))
                    fail_msg("%s %s: step %u loss %g", mp_optimizer_str(OPTS[i]), mp_precision_str(PRECS[k]), s,
                             h.losses[s]);
            if (!(h.losses[4] < h.losses[0]))
                fail_msg("%s %s: the loss does not fall (%g -> %g)", mp_optimizer_str(OPTS[i]),
                         mp_precision_str(PRECS[k]), h.losses[0], h.losses[4]);
            if (cuda) {
                struct mp_probe_result g;
                print_message("  cuda: %s, %s\n", mp_optimizer_str(OPTS[i]), mp_precision_str(PRECS[k]));
                probe_cuda(&p, &t, 0, 5, &g);
                double tol = PRECS[k] == MP_PREC_FP32 ? 1e-4 : 2e-2;
                for (unsigned s = 0; s < 5; s++)
                    if (!g.fits || !(fabs(g.losses[s] - h.losses[s]) <= tol * fabs(h.losses[s]) + 1e-5)) {
                        print_message("  %s %s step %u: cuda %g, host %g\n", mp_optimizer_str(OPTS[i]),
                                      mp_precision_str(PRECS[k]), s, g.losses[s], h.losses[s]);
                        bad++;
                        break;
                    }
                if (g.fits && g.measured_peak_bytes != h.measured_peak_bytes) {
                    print_message("  %s %s: peak cuda %llu, host %llu\n", mp_optimizer_str(OPTS[i]),
                                  mp_precision_str(PRECS[k]), (unsigned long long)g.measured_peak_bytes,
                                  (unsigned long long)h.measured_peak_bytes);
                    bad++;
                }
            }
            mp_program_release(&p);
        }
    mp_model_release(&m);
    if (bad)
        fail_msg("%zu optimizer program(s) differ between cuda and host", bad);
}

/* Extras are found by role: an eager attention with logit soft-capping (Gemma2) and dropout
 * has seven extras (three copies, tanh, probs, mask, dropped probs).  Before roles the node
 * overflowed the extras table (an internal error) and, without dropout, the executors took
 * the tanh for the probabilities; now the program builds and the probe says what it lacks. */
static void test_ops_extras_by_role(void **state)
{
    (void)state;
    static const char *gemma2 =
        "{\"architectures\":[\"Gemma2ForCausalLM\"],\"model_type\":\"gemma2\",\"hidden_size\":16,"
        "\"intermediate_size\":32,\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
        "\"head_dim\":8,\"vocab_size\":32,\"max_position_embeddings\":16,\"attn_logit_softcapping\":50.0,"
        "\"final_logit_softcapping\":30.0,\"query_pre_attn_scalar\":8,\"sliding_window\":8,"
        "\"hidden_activation\":\"gelu_pytorch_tanh\",\"rms_norm_eps\":1e-6,\"attention_dropout\":0.1}";
    struct mp_model m;
    load_json(&m, gemma2);
    for (int k = 0; k < 2; k++) {
        struct mp_build_opts o;
        struct mp_diag d = {{0}};
        mp_build_opts_default(&o);
        o.seq = 8;
        o.precision = k ? MP_PREC_AMP_BF16 : MP_PREC_FP32;
        struct mp_program p;
        assert_int_equal(mp_program_build(&m, &o, &p, &d), MP_OK);
        int attn = -1;
        for (size_t n = 0; n < p.n_nodes; n++)
            if (p.nodes[n].prim == MP_P_ATTN)
                attn = (int)n;
        assert_true(attn >= 0);
        const struct mp_node *an = &p.nodes[attn];
        assert_true(mp_node_extra(an, MP_XR_SOFTCAP_TANH, 0) >= 0);
        assert_true(mp_node_extra(an, MP_XR_PROBS, 0) >= 0);
        assert_int_not_equal(mp_node_extra(an, MP_XR_PROBS, 0), mp_node_extra(an, MP_XR_SOFTCAP_TANH, 0));
        assert_true(mp_node_extra(an, MP_XR_ATTN_DROP_MASK, 0) >= 0);
        struct mp_train_opts t = train_opts(MP_OPT_ADAMW, 8519680);
        struct mp_probe_opts po;
        struct mp_probe *pr;
        struct mp_probe_result r;
        mp_probe_opts_default(&po);
        po.backend = "host";
        assert_int_equal(mp_probe_open(&pr, &po, &d), MP_OK);
        assert_int_equal(mp_probe_run(pr, &p, NULL, &t, &r, &d), MP_ERR_UNSUPPORTED);
        assert_non_null(strstr(d.msg, "soft-capping"));
        mp_probe_close(pr);
        mp_program_release(&p);
    }
    mp_model_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_cover_every_prim),
        cmocka_unit_test(test_ops_extras_by_role),
        cmocka_unit_test(test_ops_host_gradients),
        cmocka_unit_test(test_ops_host_train_every_precision),
        cmocka_unit_test(test_ops_cuda_matches_host),
        cmocka_unit_test(test_ops_every_optimizer),
    };
    return cmocka_run_group_tests_name("probe_ops", tests, NULL, NULL);
}
