/* test_estimate.c — the estimator: exact bytes on hand-computed models, the
 * static bytes per parameter of each precision/optimizer, and properties
 * (activations linear in batch, peak >= static + activations, fp32 >= amp >=
 * bf16, sgd < adamw, checkpointing lowers the peak, the timeline balances).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt/ckpt.h"
#include "estimate/estimate.h"
#include "ir/layers.h"
#include "model/model.h"

/* linear(16->32, bias) | relu | classifier(32->4, bias) on a [16] input. */
static const char *MLP = "{\"name\":\"t\",\"input\":{\"shape\":[16]},\"classes\":4,\"layers\":["
                         "{\"type\":\"linear\",\"in_features\":16,\"out_features\":32,\"bias\":true},"
                         "{\"type\":\"activation\",\"act\":\"relu\"},"
                         "{\"type\":\"classifier\",\"in_features\":32,\"classes\":4}]}";

static void load(struct mp_model *m, const char *text)
{
    struct mp_diag d = {{0}};
    enum mp_status st = mp_model_load_string(m, text, strlen(text), "test.json", &d);
    if (st != MP_OK)
        fail_msg("load: %s", d.msg);
}

static void load_file(struct mp_model *m, const char *path)
{
    struct mp_diag d = {{0}};
    enum mp_status st = mp_model_load_file(m, path, &d);
    if (st != MP_OK)
        fail_msg("load: %s", d.msg);
}

/* m's program at batch b, sequence s (0: the model's) and precision p. */
static void build(const struct mp_model *m, uint64_t b, uint64_t s, enum mp_precision p, struct mp_program *prog)
{
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = b;
    bo.seq = s;
    bo.precision = p;
    struct mp_diag d = {{0}};
    if (mp_program_build(m, &bo, prog, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
}

static void run(const struct mp_model *m, uint64_t b, uint64_t s, enum mp_precision p, enum mp_optimizer o,
                const struct mp_schedule *sched, struct mp_estimate *e)
{
    struct mp_train_opts t = {.optimizer = o, .cublas_workspace_bytes = 0};
    struct mp_program prog;
    struct mp_diag d = {{0}};
    build(m, b, s, p, &prog);
    assert_int_equal(mp_estimate_run(&prog, sched, &t, 0, e, &d), MP_OK);
    mp_program_release(&prog);
}

/* Hand replay at batch 2, fp32, SGD, no workspace (every size rounds to 512 B):
 * setup: W1 2048 + b1 512 + W2 512 + b2 512 + images 512 + labels 512 = 4608
 * forward: h1 +512, h2 +512, h1 freed (relu saves its output; the block's input is
 * not saved), logits +512, loss +512, log-probs +512, logits freed -> 6656
 * backward: nll_loss: grad(log-probs) +512, log_softmax: grad(logits) +512 -> 7168, ...;
 * block 0: dW1 2048 + db1 512 on top of 6144 -> 8704 = the peak.
 * Unrounded: 2704 + 144 params/inputs + dW2,db2 528 + grad h1 256 + dW1,db1 2176 = 5808. */
static void test_estimate_mlp_exact_bytes(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, MLP);
    struct mp_estimate e;
    run(&m, 2, 0, MP_PREC_FP32, MP_OPT_SGD, NULL, &e);
    assert_int_equal(e.params, 16 * 32 + 32 + 32 * 4 + 4);
    assert_int_equal(e.weights_bytes, 676 * 4);
    assert_int_equal(e.grads_bytes, 676 * 4);
    assert_int_equal(e.optimizer_bytes, 0);
    assert_int_equal(e.input_bytes, 2 * 16 * 4 + 2 * 8);
    assert_int_equal(e.peak_allocated_bytes, 8704);
    assert_int_equal(e.peak_requested_bytes, 5808);
    assert_int_equal(e.peak_phase, MP_PH_BACKWARD);
    assert_string_equal(e.peak_event, "backward:linear.linear");
    mp_estimate_release(&e);
    mp_model_release(&m);
}

/* embedding(1024, 8) | lm_head(8 -> 1024, untied) on 32 tokens, batch 2: M = 64 rows, V = 1024.
 * amp-bf16, SGD, no workspace.  What PyTorch holds at each step of the loss backward
 * (ForCausalLMLoss: logits.float(), log_softmax, nll_loss; every size a multiple of 512):
 *   params 2 x 1024*8*4 = 65536; input ids + labels 512 + 512; the lm_head's saved bf16 input
 *   64*8*2 = 1024 and bf16 weight copy 1024*8*2 = 16384; fp32 log-probs 64*1024*4 = 262144.
 *   NllLossBackward0: + grad(log-probs) 262144; then frees the shifted labels and total_weight.
 *   LogSoftmaxBackward0: + grad(fp32 logits) 262144 -> 65536 + 1024 + 1024 + 16384 + 3*262144
 *   = 870400, the step's peak; then frees the log-probs and their gradient.
 *   ToCopyBackward0: + bf16 grad(logits) 131072 next to the fp32 one: 477184 only.
 * The half gradient never coexists with the log-probs (it did before: +131072 at the peak). */
static const char *LM = "{\"name\":\"lm\",\"input\":{\"tokens\":32},\"layers\":["
                        "{\"type\":\"embedding\",\"vocab\":1024,\"dim\":8},"
                        "{\"type\":\"lm_head\",\"vocab\":1024,\"dim\":8}]}";

static void test_estimate_loss_backward_order(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LM);
    struct mp_estimate e;
    run(&m, 2, 32, MP_PREC_AMP_BF16, MP_OPT_SGD, NULL, &e);
    assert_int_equal(e.peak_allocated_bytes, 870400);
    assert_non_null(strstr(e.peak_event, "backward:"));
    assert_non_null(strstr(e.peak_event, "log_softmax"));
    mp_estimate_release(&e);
    /* pure bf16: the same (params and their copies: 2 x 16384, no weight copy) */
    run(&m, 2, 32, MP_PREC_BF16, MP_OPT_SGD, NULL, &e);
    assert_int_equal(e.peak_allocated_bytes, 2 * 16384 + 1024 + 1024 + 3 * 262144);
    mp_estimate_release(&e);
    mp_model_release(&m);
}

/* The log-probs' dtype: HF's LM loss upcasts (fp32 in every precision); a classifier's
 * F.cross_entropy upcasts only under autocast, so pure bf16 keeps bf16 log-probs. */
static void test_estimate_loss_dtypes(void **state)
{
    (void)state;
    const enum mp_precision precs[] = {MP_PREC_FP32, MP_PREC_AMP_BF16, MP_PREC_BF16};
    const char *texts[] = {LM, MLP};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) {
            struct mp_model m;
            load(&m, texts[k]);
            struct mp_program prog;
            build(&m, 2, 0, precs[i], &prog);
            int ls = -1;
            for (size_t n = 0; n < prog.n_nodes; n++)
                if (prog.nodes[n].prim == MP_P_LOG_SOFTMAX)
                    ls = (int)n;
            assert_true(ls >= 0);
            enum mp_dtype want = (k == 1 && precs[i] == MP_PREC_BF16) ? MP_DT_BF16 : MP_DT_F32;
            assert_int_equal(prog.tensors[prog.nodes[ls].out].dtype, want);
            mp_program_release(&prog);
            mp_model_release(&m);
        }
}

/* fp32 + AdamW: 4 + 4 + 8 = 16 bytes per parameter; pure bf16 + AdamW: 2 + 2 + 4 = 8. */
static void test_estimate_static_bytes_per_param(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/gpt2-124m.json");
    struct mp_estimate e;
    run(&m, 1, 64, MP_PREC_FP32, MP_OPT_ADAMW, NULL, &e);
    assert_int_equal(e.params, 124439808);
    assert_int_equal(e.weights_bytes + e.grads_bytes + e.optimizer_bytes, 16 * e.params);
    mp_estimate_release(&e);
    run(&m, 1, 64, MP_PREC_BF16, MP_OPT_ADAMW, NULL, &e);
    assert_int_equal(e.weights_bytes + e.grads_bytes + e.optimizer_bytes, 8 * e.params);
    mp_estimate_release(&e);
    /* amp keeps fp32 master weights: the same 16 B/param as fp32 */
    run(&m, 1, 64, MP_PREC_AMP_BF16, MP_OPT_ADAMW, NULL, &e);
    assert_int_equal(e.weights_bytes + e.grads_bytes + e.optimizer_bytes, 16 * e.params);
    mp_estimate_release(&e);
    /* SGD with momentum: one buffer; plain SGD: none */
    run(&m, 1, 64, MP_PREC_FP32, MP_OPT_SGD_MOMENTUM, NULL, &e);
    assert_int_equal(e.optimizer_bytes, 4 * e.params);
    mp_estimate_release(&e);
    run(&m, 1, 64, MP_PREC_FP32, MP_OPT_SGD, NULL, &e);
    assert_int_equal(e.optimizer_bytes, 0);
    mp_estimate_release(&e);
    mp_model_release(&m);
}

static void chain_at(const struct mp_model *m, uint64_t b, uint64_t s, enum mp_precision p, struct mp_chain *c)
{
    struct mp_program prog;
    struct mp_diag d = {{0}};
    build(m, b, s, p, &prog);
    assert_int_equal(mp_estimate_chain(&prog, c, &d), MP_OK);
    mp_program_release(&prog);
}

/* The estimate of m at b x s under checkpoint spec (plan "layers"-like: no budget), with SGD. */
static void run_spec(const struct mp_model *m, uint64_t b, uint64_t s, enum mp_precision p, const char *spec_s,
                     struct mp_estimate *e)
{
    struct mp_chain c;
    chain_at(m, b, s, p, &c);
    struct mp_ckpt_spec spec;
    assert_int_equal(mp_ckpt_spec_parse(spec_s, &spec), MP_OK);
    char buf[32];
    assert_string_equal(mp_ckpt_spec_str(&spec, buf, sizeof buf), spec_s);
    struct mp_ckpt_plan pl;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &pl, &d), MP_OK);
    run(m, b, s, p, MP_OPT_SGD, &pl.sched, e);
    mp_ckpt_plan_release(&pl);
    mp_chain_release(&c);
}

/* What a block keeps for backward scales exactly with the batch. */
static void test_estimate_activations_linear_in_batch(void **state)
{
    (void)state;
    const char *models[] = {"models/gpt2-124m.json", "models/llama-7b.json", "models/resnet50.json"};
    /* fp32 and pure bf16: amp adds batch-independent weight copies */
    const enum mp_precision precs[] = {MP_PREC_FP32, MP_PREC_BF16};
    for (size_t k = 0; k < 3; k++) {
        struct mp_model m;
        load_file(&m, models[k]);
        for (size_t q = 0; q < 2; q++) {
            struct mp_chain c1, c3;
            chain_at(&m, 1, 128, precs[q], &c1);
            chain_at(&m, 3, 128, precs[q], &c3);
            for (size_t i = 1; i < c1.L; i++) { /* the last block holds the batch-independent loss scalar */
                assert_true(c1.xb[i] > 0);
                if (k < 2 && i >= 3) {
                    assert_int_equal(c3.xb[i], 3 * c1.xb[i]);
                } else { /* per-sequence or per-channel tensors do not scale: position ids (block 0),
                          * rotary cos/sin (made in block 1), batchnorm's saved mean/invstd */
                    assert_true(c3.xb[i] <= 3 * c1.xb[i]);
                    assert_true(3 * c1.xb[i] - c3.xb[i] <= c3.xb[i] / 20);
                }
            }
            mp_chain_release(&c1);
            mp_chain_release(&c3);
        }
        mp_model_release(&m);
    }
}

/* peak >= static + activations at the start of backward; fp32 >= amp >= bf16; sgd < adamw. */
static void test_estimate_orderings(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/llama-7b.json");
    struct mp_estimate f32, amp, b16, sgd;
    run(&m, 1, 512, MP_PREC_FP32, MP_OPT_ADAMW, NULL, &f32);
    run(&m, 1, 512, MP_PREC_AMP_BF16, MP_OPT_ADAMW, NULL, &amp);
    run(&m, 1, 512, MP_PREC_BF16, MP_OPT_ADAMW, NULL, &b16);
    run(&m, 1, 512, MP_PREC_FP32, MP_OPT_SGD, NULL, &sgd);
    struct mp_estimate *all[] = {&f32, &amp, &b16, &sgd};
    for (size_t i = 0; i < 4; i++) {
        uint64_t stat = all[i]->weights_bytes + all[i]->optimizer_bytes + all[i]->input_bytes;
        assert_true(all[i]->peak_allocated_bytes >= stat + all[i]->activations_bytes);
        assert_true(all[i]->peak_requested_bytes <= all[i]->peak_allocated_bytes);
        assert_true(all[i]->peak_reserved_bytes >= all[i]->peak_allocated_bytes);
    }
    uint64_t s32 = f32.weights_bytes + f32.grads_bytes + f32.optimizer_bytes;
    uint64_t samp = amp.weights_bytes + amp.grads_bytes + amp.optimizer_bytes;
    uint64_t sb16 = b16.weights_bytes + b16.grads_bytes + b16.optimizer_bytes;
    assert_true(s32 >= samp);
    assert_true(samp > sb16);
    assert_true(f32.peak_allocated_bytes > b16.peak_allocated_bytes);
    assert_true(sgd.peak_allocated_bytes < f32.peak_allocated_bytes);
    /* amp keeps a half copy of every matmul weight from its forward use to its backward */
    assert_true(amp.activations_bytes >= 2 * (amp.params - 32000 * 4096) + f32.activations_bytes / 8);
    for (size_t i = 0; i < 4; i++)
        mp_estimate_release(all[i]);
    mp_model_release(&m);
}

/* Checkpointing every block lowers the activation peak and adds recompute FLOPs equal
 * to one extra forward of the recomputed blocks, less what each early-stopped recompute never
 * runs (docs/checkpointing.md#early-stop). */
static void test_estimate_checkpoint_lowers_peak(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/gpt2-124m.json");
    struct mp_program prog;
    struct mp_diag d = {{0}};
    build(&m, 4, 512, MP_PREC_AMP_BF16, &prog);
    struct mp_chain c;
    assert_int_equal(mp_estimate_chain(&prog, &c, &d), MP_OK);
    struct mp_ckpt_plan p;
    mp_ckpt_plan_init(&p);
    struct mp_ckpt_spec every = {.strategy = MP_CKPT_EVERY, .k = 1};
    assert_int_equal(mp_ckpt_plan_make(&c, &every, 0, 0, &p, &d), MP_OK);
    struct mp_train_opts t = {.optimizer = MP_OPT_ADAMW, .cublas_workspace_bytes = 0};
    struct mp_estimate e0, e1;
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, 0, &e0, &d), MP_OK);
    assert_int_equal(mp_estimate_run(&prog, &p.sched, &t, 0, &e1, &d), MP_OK);
    assert_true(e1.activations_bytes < e0.activations_bytes / 4);
    assert_true(e1.peak_allocated_bytes < e0.peak_allocated_bytes);
    double fwd_ckpt = 0;
    for (size_t i = 0; i < prog.n_blocks; i++)
        if (p.checkpointed[i])
            fwd_ckpt += prog.blocks[i].fwd_flops;
    assert_true(fwd_ckpt > 0);
    /* each of the 12 decoder blocks' recompute stops at its MLP dropout's mask (the last tensor it
     * saves, packed after the op ran): the residual add after it (4 x 512 x 768) is not rerun */
    assert_true(e1.recompute_flops == fwd_ckpt - 12.0 * 4 * 512 * 768);
    assert_true(e0.recompute_flops == 0);
    mp_estimate_release(&e0);
    mp_estimate_release(&e1);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* Every ALLOC has its FREE by the end of the step, and the live bytes never go negative. */
struct balance {
    int64_t cur;
    bool negative;
    uint64_t allocs, frees;
};
static enum mp_status balance_event(void *ctx, const struct mp_event *ev)
{
    struct balance *b = ctx;
    if (ev->kind == MP_EV_ALLOC) {
        b->cur += (int64_t)ev->bytes;
        b->allocs++;
    } else if (ev->kind == MP_EV_FREE) {
        b->cur -= (int64_t)ev->bytes;
        b->frees++;
        if (b->cur < 0)
            b->negative = true;
    }
    return MP_OK;
}

static void test_estimate_timeline_balances(void **state)
{
    (void)state;
    const char *models[] = {"models/gpt2-124m.json", "models/resnet50.json", "models/tiny-test.json",
                            "models/chain-custom.json"};
    for (size_t k = 0; k < 4; k++) {
        struct mp_model m;
        load_file(&m, models[k]);
        struct mp_program prog;
        struct mp_diag d = {{0}};
        build(&m, 2, 0, MP_PREC_AMP_BF16, &prog); /* the model's own sequence length */
        struct mp_schedule s;
        mp_schedule_init(&s);
        assert_int_equal(mp_ckpt_schedule_sequential(prog.n_blocks, 2, &s), MP_OK);
        struct mp_train_opts t = {.optimizer = MP_OPT_ADAMW, .cublas_workspace_bytes = 4096};
        struct balance b = {0};
        assert_int_equal(mp_replay(&prog, &s, &t, balance_event, &b, &d), MP_OK);
        assert_int_equal(b.allocs, b.frees + prog.n_params * (t.optimizer == MP_OPT_SGD ? 1 : 2) + 1 + 1 +
                                       (prog.labels >= 0));
        assert_false(b.negative);
        /* what remains is exactly the persistent set: params, state, workspace, batch */
        struct mp_estimate e;
        assert_int_equal(mp_estimate_run(&prog, &s, &t, 0, &e, &d), MP_OK);
        /* two 4096-byte workspaces: the forward's cuBLAS handle and autograd's device thread's */
        assert_int_equal((uint64_t)b.cur, e.weights_bytes + e.optimizer_bytes + 2 * 4096 + e.input_bytes);
        mp_estimate_release(&e);
        mp_schedule_release(&s);
        mp_program_release(&prog);
        mp_model_release(&m);
    }
}

/* A 10^15-wide layer is refused with a message, not wrapped. */
static void test_estimate_overflow_is_an_error(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/llama-70b.json");
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = UINT64_C(1) << 40;
    bo.seq = 1 << 20;
    struct mp_program prog;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_program_build(&m, &bo, &prog, &d), MP_ERR_RANGE);
    assert_non_null(strstr(d.msg, "overflow"));
    mp_model_release(&m);
}

/* 2^36 fp32 features a sample and three activations after them: at batch 2^23 the input and
 * the three outputs, 2^61 bytes each, and the labels (an int64 a sample, 2^26 bytes) are live
 * together at the third (2^63 + 2^26 bytes); at batch 2^24 that is beyond 2^64 bytes, an
 * error, never a wrapped figure. */
static const char *WIDE = "{\"name\":\"wide\",\"input\":{\"shape\":[68719476736]},\"layers\":[{\"block\":\"a\","
                          "\"layers\":[{\"type\":\"activation\",\"act\":\"gelu\"},{\"type\":\"activation\","
                          "\"act\":\"gelu\"},{\"type\":\"activation\",\"act\":\"gelu\"}]}]}";

static void test_estimate_peak_overflow_is_an_error(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, WIDE);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_program prog;
    struct mp_estimate e;
    struct mp_diag d = {{0}};
    build(&m, UINT64_C(1) << 23, 0, MP_PREC_FP32, &prog);
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, 0, &e, &d), MP_OK);
    uint64_t peak = (UINT64_C(1) << 63) + (UINT64_C(1) << 26);
    assert_true(e.peak_allocated_bytes == peak);
    mp_estimate_release(&e);
    /* the context on top: up to 2^64 - 1 in all, else an error naming --context */
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, UINT64_MAX - peak, &e, &d), MP_OK);
    assert_true(e.peak_device_bytes == UINT64_MAX);
    mp_estimate_release(&e);
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, UINT64_MAX - peak + 1, &e, &d), MP_ERR_RANGE);
    assert_non_null(strstr(d.msg, "--context"));
    mp_program_release(&prog);
    build(&m, UINT64_C(1) << 24, 0, MP_PREC_FP32, &prog);
    memset(&d, 0, sizeof d);
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, 0, &e, &d), MP_ERR_RANGE);
    assert_string_equal(d.msg, "test.json: memory overflows 64 bits");
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* A training step holds two cuBLAS workspaces (estimate.h, MP_CUBLAS_HANDLES): PyTorch keeps one per
 * handle and stream (CublasHandlePool.cpp, setWorkspaceForHandle), and the backward's GEMMs run on
 * autograd's CUDA device thread, which reserves a handle of its own (engine.h:213-237).  The
 * H200's 32 MiB each (parseChosenWorkspaceSize, sm90): against --workspace 0, every resident figure
 * and the peak grow by 2 x 33554432 = 67108864 bytes, as torch's did on the H200 (the DPO kit's
 * first row, 2026-11-28: 499615744 there against 428487680 on the CPU, no workspace, 71128064
 * more), for full training, checkpointed, and DPO with its reference copy alike. */
static void test_estimate_two_cublas_workspaces(void **state)
{
    (void)state;
    const uint64_t one = UINT64_C(33554432), both = UINT64_C(67108864);
    struct mp_model m;
    load_file(&m, "models/tiny-test.json");
    struct mp_program prog;
    build(&m, 2, 0, MP_PREC_BF16, &prog);
    for (int k = 0; k < 3; k++) {
        struct mp_schedule s;
        mp_schedule_init(&s);
        if (k == 1)
            assert_int_equal(mp_ckpt_schedule_sequential(prog.n_blocks, 1, &s), MP_OK);
        struct mp_train_opts t0 = {.optimizer = MP_OPT_ADAMW, .cublas_workspace_bytes = 0};
        if (k == 2)
            t0.ref = MP_REF_COPY;
        struct mp_train_opts t1 = t0;
        t1.cublas_workspace_bytes = one;
        struct mp_estimate e0, e1;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_estimate_run(&prog, k == 1 ? &s : NULL, &t0, 0, &e0, &d), MP_OK);
        assert_int_equal(mp_estimate_run(&prog, k == 1 ? &s : NULL, &t1, 0, &e1, &d), MP_OK);
        assert_int_equal(e0.workspace_bytes, 0);
        assert_int_equal(e1.workspace_bytes, both);
        assert_int_equal(e1.static_bytes - e0.static_bytes, both);
        assert_int_equal(e1.peak_allocated_bytes - e0.peak_allocated_bytes, both);
        mp_estimate_release(&e0);
        mp_estimate_release(&e1);
        mp_schedule_release(&s);
    }
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* A cuBLAS workspace that takes the resident bytes beyond 64 bits is an error naming
 * --workspace. */
static void test_estimate_workspace_overflow_is_an_error(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, MLP);
    struct mp_train_opts t = {.optimizer = MP_OPT_ADAMW, .cublas_workspace_bytes = UINT64_MAX - 2047};
    struct mp_program prog;
    struct mp_estimate e;
    struct mp_diag d = {{0}};
    build(&m, 2, 0, MP_PREC_FP32, &prog);
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, 0, &e, &d), MP_ERR_RANGE);
    assert_non_null(strstr(d.msg, "--workspace"));
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* Pure bf16 AdamW: the optimizer step's foreach temporary is +1x state (2 B/param). */
static void test_estimate_optimizer_step_peak(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, MLP);
    struct mp_program prog;
    build(&m, 1, 0, MP_PREC_FP32, &prog);
    assert_int_equal(mp_opt_step_tmp_bytes(&prog, MP_OPT_ADAMW), 676 * 4);
    assert_int_equal(mp_opt_step_tmp_bytes(&prog, MP_OPT_SGD), 0);
    /* AdamW(fused=True) (HF's adamw_torch_fused): one in-place kernel, Adam's state, no temporary */
    assert_int_equal(mp_opt_step_tmp_bytes(&prog, MP_OPT_ADAMW_FUSED), 0);
    assert_int_equal(mp_opt_state_bytes(&prog, MP_OPT_ADAMW_FUSED, &prog.params[0]),
                     mp_opt_state_bytes(&prog, MP_OPT_ADAMW, &prog.params[0]));
    struct mp_train_opts foreach = {.optimizer = MP_OPT_ADAMW}, fused = {.optimizer = MP_OPT_ADAMW_FUSED};
    struct mp_estimate ef, eu;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_estimate_run(&prog, NULL, &foreach, 0, &ef, &d), MP_OK);
    assert_int_equal(mp_estimate_run(&prog, NULL, &fused, 0, &eu, &d), MP_OK);
    assert_int_equal(ef.optimizer_tmp_bytes, 676 * 4);
    assert_int_equal(eu.optimizer_tmp_bytes, 0);
    assert_true(eu.peak_allocated_bytes <= ef.peak_allocated_bytes);
    mp_estimate_release(&ef);
    mp_estimate_release(&eu);
    /* 8-bit Adam: tensors under 4096 elements keep fp32 states */
    assert_int_equal(mp_opt_state_bytes(&prog, MP_OPT_ADAM8BIT, &prog.params[0]), 512 * 8);
    struct mp_param big = {.elems = 1 << 20, .matrix = true, .rows = 1024, .cols = 1024, .dtype = MP_DT_F32,
                           .trainable = true};
    assert_int_equal(mp_opt_state_bytes(&prog, MP_OPT_ADAM8BIT, &big), 2 * (1 << 20) + 8 * 4096);
    assert_int_equal(mp_opt_state_bytes(&prog, MP_OPT_ADAFACTOR, &big), (1024 + 1024) * 4);
    /* transformers' Adafactor (HF optim "adafactor"): fp32 factors for a bf16 matrix too (.to(grad)
     * of its fp32 gradient), and at the step two fp32 tensors like the largest parameter, four when
     * it is half (its fp32 copy and gradient's): the H200 measured 2 x and 4 x GPT-2's embedding in
     * fp32 (310.6 MB) and bf16 (621.0 MB), bench/gpu/optim_step.py */
    big.dtype = MP_DT_BF16;
    assert_int_equal(mp_opt_state_bytes(&prog, MP_OPT_ADAFACTOR, &big), (1024 + 1024) * 4);
    assert_int_equal(mp_opt_step_tmp_of(MP_OPT_ADAFACTOR, 0, 1 << 20, MP_DT_F32, 0, 0), 8u << 20);
    assert_int_equal(mp_opt_step_tmp_of(MP_OPT_ADAFACTOR, 0, 1 << 20, MP_DT_BF16, 0, 0), 16u << 20);
    assert_int_equal(mp_opt_step_tmp_of(MP_OPT_ADAFACTOR, 0, UINT64_MAX / 4, MP_DT_BF16, 0, 0), UINT64_MAX);
    mp_program_release(&prog);
    mp_model_release(&m);
}


/* torch.optim.Muon (torch 2.15 torch/optim/_muon.py) on the hidden layers' 2-D weights, AdamW on the
 * rest (its docstring: not the embedding; nor the output layer), by hand: an embedding (16 x 8), an
 * MLP 8 -> 32 -> 8 without biases, an untied head (16 x 8), fp32. */
static void test_estimate_muon(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"name\":\"t\",\"input\":{\"tokens\":4},\"layers\":["
             "{\"type\":\"embedding\",\"vocab\":16,\"dim\":8},"
             "{\"type\":\"mlp\",\"dim\":8,\"ffn\":32,\"bias\":false},"
             "{\"type\":\"lm_head\",\"vocab\":16,\"dim\":8}]}");
    struct mp_program prog;
    build(&m, 1, 0, MP_PREC_FP32, &prog);
    uint64_t states = 0;
    size_t muon = 0;
    for (size_t q = 0; q < prog.n_params; q++) {
        states += mp_opt_state_bytes(&prog, MP_OPT_MUON, &prog.params[q]);
        muon += mp_opt_muon_param(&prog.params[q]);
    }
    assert_int_equal(muon, 2); /* the MLP's two weights */
    /* Muon's momentum_buffer on the two 256-element weights, AdamW's two moments on the 128-element
     * embedding and head */
    assert_int_equal(states, 2 * 256 * 4 + 2 * 2 * 128 * 4);
    /* the step, one Muon parameter at a time: its update like the fp32 gradient (256 x 4 B), then
     * bf16 Newton-Schulz iterates, two X (256 each) and the Gram matrix and its update (8 x 8 each):
     * 2304 B, more than AdamW's foreach over the embedding's and head's gradients (2 x 128 x 4) */
    assert_int_equal(mp_opt_step_tmp_bytes(&prog, MP_OPT_MUON), 256 * 4 + 2 * (2 * 256 + 2 * 8 * 8));
    struct mp_train_opts t = {.optimizer = MP_OPT_MUON};
    struct mp_estimate e;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_estimate_run(&prog, NULL, &t, 0, &e, &d), MP_OK);
    assert_int_equal(e.optimizer_bytes, states);
    assert_int_equal(e.optimizer_tmp_bytes, 2304);
    mp_estimate_release(&e);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* The low-bit optimizers' states, per tensor, by hand from the libraries' sources
 * (bitsandbytes 0.50.2 optim/optimizer.py init_state; torchao 0.18.0 optim/adam.py _new_buffer,
 * subclass_8bit.py / subclass_4bit.py zeros; transformers 5.24.0: block_size 256, nn.Embedding
 * weights at 32 bits under bitsandbytes), checked against a real step on CPU tensors
 * (bench/accuracy/optim_states.py measures the same tensor kinds).  Four fp32 tensors:
 *   A 100 x 37 =  3,700 elements: under the 4096-element threshold;
 *   B 300 x 37 = 11,100: above it, not a multiple of 256 (43 full blocks + 92: 44 blocks);
 *   C  64 x 256 = 16,384: a multiple of 256 (64 blocks);
 *   D 1000 x 64 = 64,000: an nn.Embedding weight (250 blocks). */
static void test_estimate_low_bit_optimizer_states(void **state)
{
    (void)state;
    struct mp_param q[4] = {
        {.elems = 3700, .rows = 100, .cols = 37, .matrix = true, .dtype = MP_DT_F32, .trainable = true},
        {.elems = 11100, .rows = 300, .cols = 37, .matrix = true, .dtype = MP_DT_F32, .trainable = true},
        {.elems = 16384, .rows = 64, .cols = 256, .matrix = true, .dtype = MP_DT_F32, .trainable = true},
        {.elems = 64000, .rows = 1000, .cols = 64, .matrix = true, .dtype = MP_DT_F32, .trainable = true,
         .embedding = true},
    };
    struct mp_program p = {.params = q, .n_params = 4, .param_dtype = MP_DT_F32};
    /* bitsandbytes AdamW 8-bit (adamw_bnb_8bit; paged_adamw_8bit the same bytes):
     * A fp32 exp_avg + exp_avg_sq: 2 x 3,700 x 4 = 29,600;
     * B uint8 state1 + state2 (2 x 11,100) + fp32 absmax1 + absmax2 (2 x 44 x 4 = 352) = 22,552,
     *   + qmap1 + qmap2 (2 x 256 x 4 = 2,048: the optimizer's, with its first 8-bit tensor) = 24,600;
     * C 2 x 16,384 + 2 x 64 x 4 = 33,280 (the qmaps are counted once, with B);
     * D an embedding: fp32, 2 x 64,000 x 4 = 512,000 */
    const enum mp_optimizer bnb[] = {MP_OPT_ADAM8BIT, MP_OPT_PAGED_ADAM8BIT};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(mp_opt_state_bytes(&p, bnb[i], &q[0]), 29600);
        assert_int_equal(mp_opt_state_bytes(&p, bnb[i], &q[1]), 24600);
        assert_int_equal(mp_opt_state_bytes(&p, bnb[i], &q[2]), 33280);
        assert_int_equal(mp_opt_state_bytes(&p, bnb[i], &q[3]), 512000);
        assert_int_equal(mp_opt_step_tmp_bytes(&p, bnb[i]), 0); /* the 8-bit kernel updates in place */
    }
    /* Lion 8-bit: one state: A 3,700 x 4 = 14,800; B 11,100 + 44 x 4 + qmap1 1,024 = 12,300;
     * C 16,384 + 64 x 4 = 16,640; D 64,000 x 4 = 256,000 */
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_LION8BIT, &q[0]), 14800);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_PAGED_LION8BIT, &q[1]), 12300);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_LION8BIT, &q[2]), 16640);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_LION8BIT, &q[3]), 256000);
    /* torchao AdamW8bit (adamw_torch_8bit, block 256), per state codes + scale + its qmap:
     * A under 4096: zeros_like, 2 x 3,700 x 4 = 29,600;
     * B not a multiple of 256: zeros_like, 2 x 11,100 x 4 = 88,800;
     * C 2 x (16,384 + 64 x 4 + 256 x 4) = 2 x 17,664 = 35,328;
     * D (no embedding rule in torchao) 2 x (64,000 + 250 x 4 + 1,024) = 132,048 */
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW8BIT_AO, &q[0]), 29600);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW8BIT_AO, &q[1]), 88800);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW8BIT_AO, &q[2]), 35328);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW8BIT_AO, &q[3]), 132048);
    /* torchao AdamW4bit (adamw_torch_4bit; HF's block 256): per state codes n/2 + scale + a
     * 16-entry qmap: C 2 x (8,192 + 256 + 64) = 17,024; D 2 x (32,000 + 1,000 + 64) = 66,128 */
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW4BIT_AO, &q[1]), 88800);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW4BIT_AO, &q[2]), 17024);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW4BIT_AO, &q[3]), 66128);
    /* torchao's compiled step of the largest tensor (D): two fp32 moments and two fp32
     * per-block absmax vectors, 2 x 4 x (64,000 + 250) = 514,000 */
    assert_int_equal(mp_opt_step_tmp_bytes(&p, MP_OPT_ADAMW8BIT_AO), 514000);
    assert_int_equal(mp_opt_step_tmp_bytes(&p, MP_OPT_ADAMW4BIT_AO), 514000);
    /* a bf16 tensor that stays unquantized keeps bf16 states under torchao (zeros_like), fp32
     * under bitsandbytes: 2 x 3,700 x 2 = 14,800 against 29,600 */
    struct mp_param a16 = q[0];
    a16.dtype = MP_DT_BF16;
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW8BIT_AO, &a16), 14800);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAM8BIT, &a16), 29600);
    /* frozen: nothing */
    struct mp_param frozen = q[2];
    frozen.trainable = false;
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_ADAMW4BIT_AO, &frozen), 0);
    assert_int_equal(mp_opt_state_bytes(&p, MP_OPT_LION8BIT, &frozen), 0);
}

/* HF's gelu_new calls torch.pow, which CUDA autocast runs in fp32 (autocast_mode.cpp's
 * fp32 list; the CPU list lacks it).  Block "mlp" = linear(16 -> 64) | gelu_new |
 * linear(64 -> 16), no biases, on 2 x 8 tokens (M = 16) after an fp32 embedding.  What the
 * block keeps (unrounded), amp-bf16 on CUDA:
 *   fc1: bf16 cast of its input 16*16*2 = 512, weight copy 64*16*2 = 2048;
 *   gelu_new: pow's fp32 copy of its input 16*64*4 = 4096, tanh(u) fp32 4096, 0.5x bf16 2048,
 *   1 + tanh(u) fp32 4096 (its bf16 input and fp32 output are not kept);
 *   fc2: bf16 cast of the fp32 output 2048, weight copy 2048; the output 16*16*2 = 512;
 *   minus the embedding output 1024 that nothing here keeps -> 20480.
 * fp32: fc1 keeps its input (the embedding output) and gelu_new keeps x, tanh, 0.5x, 1+tanh and
 * its output (fc2's input), all fp32: 5 * 4096 + the output 1024 = 21504. */
static void test_estimate_gelu_new_autocast(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"name\":\"g\",\"input\":{\"tokens\":8},\"layers\":["
             "{\"type\":\"embedding\",\"vocab\":32,\"dim\":16},"
             "{\"block\":\"mlp\",\"layers\":["
             "{\"type\":\"linear\",\"in_features\":16,\"out_features\":64,\"bias\":false},"
             "{\"type\":\"activation\",\"act\":\"gelu_new\"},"
             "{\"type\":\"linear\",\"in_features\":64,\"out_features\":16,\"bias\":false}]}]}");
    struct mp_chain c;
    chain_at(&m, 2, 8, MP_PREC_AMP_BF16, &c);
    assert_int_equal(c.xb[2], 20480); /* growth over the block (rotor's xb) */
    mp_chain_release(&c);
    chain_at(&m, 2, 8, MP_PREC_FP32, &c);
    assert_int_equal(c.xb[2], 21504);
    mp_chain_release(&c);
    mp_model_release(&m);
}

/* HF's composite gelu_new ends in half_x * one_plus_tanh: its MulBackward0 makes both factors'
 * gradients while the incoming one is alive, one x-sized tensor more than the fused kernels;
 * relu2 (relu then square) two (measured with bench/accuracy/torch_step.py's LiveTracker under fake
 * tensors: the backward peaks 3, 4 and 2 x-sized tensors above what is live before it).  fp32,
 * b=2, s=8, ffn 64: 1024 elements, 4096 / 8192 bytes of backward workspace; gelu_tanh (F.gelu,
 * fused) none. */
static void test_estimate_gelu_new_backward(void **state)
{
    (void)state;
    const char *acts[3] = {"gelu_new", "gelu_tanh", "relu2"};
    const uint64_t want[3] = {4096, 0, 8192};
    for (int i = 0; i < 3; i++) {
        char js[600];
        snprintf(js, sizeof js, "{\"name\":\"g\",\"input\":{\"tokens\":8},\"layers\":["
                 "{\"type\":\"embedding\",\"vocab\":32,\"dim\":16},"
                 "{\"type\":\"linear\",\"in_features\":16,\"out_features\":64,\"bias\":false},"
                 "{\"type\":\"activation\",\"act\":\"%s\"},"
                 "{\"type\":\"linear\",\"in_features\":64,\"out_features\":16,\"bias\":false}]}", acts[i]);
        struct mp_model m;
        load(&m, js);
        struct mp_build_opts o;
        mp_build_opts_default(&o);
        o.batch = 2;
        o.seq = 8;
        o.precision = MP_PREC_FP32;
        struct mp_program p;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_program_build(&m, &o, &p, &d), MP_OK);
        bool seen = false;
        for (size_t k = 0; k < p.n_nodes; k++)
            if (p.nodes[k].prim == MP_P_ACT) {
                assert_int_equal(p.nodes[k].bwd_tmp_bytes, want[i]);
                seen = true;
            }
        assert_true(seen);
        mp_program_release(&p);
        mp_model_release(&m);
    }
}

/* Non-persistent buffers are on the GPU too: HF's rotary embedding registers inv_freq and a
 * clone, original_inv_freq, rotary_dim/2 fp32 each (named_buffers() of transformers 5.23:
 * llama-2-7b 2 x (64,), qwen2-0.5b 2 x (32,)); GPT-2 has none.  BertEmbeddings registers int64
 * position_ids and token_type_ids (1, max positions): bert 2 x (1, 512), roberta 2 x (1, 514);
 * DistilBERT position_ids (1, 512); Gemma's embedding an fp32 scalar embed_scale () besides its
 * rotary pair 2 x (128,). */
static void test_estimate_module_buffers(void **state)
{
    (void)state;
    const char *files[] = {"models/hf/llama-2-7b.json", "models/hf/qwen2-0.5b.json", "models/hf/gpt2.json",
                           "models/hf/bert-base-uncased.json", "models/hf/roberta-base.json",
                           "models/hf/distilbert-base-uncased.json", "models/hf/gemma-2b.json"};
    const uint64_t want[] = {2 * 64 * 4, 2 * 32 * 4, 0, 2 * 512 * 8, 2 * 514 * 8, 512 * 8, 4 + 2 * 128 * 4};
    for (int i = 0; i < 7; i++) {
        struct mp_model m;
        load_file(&m, files[i]);
        struct mp_estimate e;
        run(&m, 1, 16, MP_PREC_AMP_BF16, MP_OPT_SGD, NULL, &e);
        assert_int_equal(e.module_buffers_bytes, want[i]);
        mp_estimate_release(&e);
        mp_model_release(&m);
    }
}

/* Falcon (multi-query 7B layout) and GPT-J, one decoder layer (h.1) worked by hand from what
 * transformers 5.23 saves (saved_tensors_hooks on the CPU, then CUDA's rules).  b=3, s=12,
 * h=64, 4 heads of 16, ffn 256.
 * Falcon fp32, SDPA: LayerNorm mean+rstd 2x144; qkv input 9216; the two int64 indices of the
 * k/v split 2x8; SDPA: q after rope 9216, k after rope (1 head) 2304, v index copy 2304, out
 * 9216 (also dense's input), CUDA mem-efficient lse (3,4,32) fp32 1536, the float conversion of
 * the bool mask (3,1,12,12) 1728; MLP: gelu input 36864, dense_4h_to_h input 36864; the
 * layer's output 9216: 118768.
 * GPT-J bf16, eager: mean+rstd (fp32 on CUDA) 288; q/k/v_proj input 4608; cos and sin of the
 * q and k rotary, (1,12,1,8) each 4x192; _attn's fp32 q and k copies 2x9216; fp32 softmax
 * 6912, its bf16 cast 3456; v copy 4608; out_proj input 4608; gelu_new input and its three
 * intermediates 4x18432; fc_out input 18432; output 4608: 140448.  Its per-layer sinusoid
 * tables (64 x 8 fp32, two layers) are module buffers: 4096. */
static void test_estimate_falcon_gptj_layer(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"model_type\": \"falcon\", \"vocab_size\": 100, \"hidden_size\": 64, "
             "\"num_attention_heads\": 4, \"num_hidden_layers\": 2}");
    struct mp_estimate e;
    run(&m, 3, 12, MP_PREC_FP32, MP_OPT_SGD, NULL, &e);
    assert_int_equal(e.blocks[2].activation_bytes, 118768);
    mp_estimate_release(&e);
    mp_model_release(&m);
    load(&m, "{\"model_type\": \"gptj\", \"vocab_size\": 100, \"n_embd\": 64, \"n_head\": 4, "
             "\"n_layer\": 2, \"rotary_dim\": 8, \"n_positions\": 64}");
    run(&m, 3, 12, MP_PREC_BF16, MP_OPT_SGD, NULL, &e);
    assert_int_equal(e.blocks[2].activation_bytes, 140448);
    assert_int_equal(e.module_buffers_bytes, 4096);
    mp_estimate_release(&e);
    mp_model_release(&m);
}

/* use_cache (transformers 5.23 DynamicLayer.update: torch.cat of k and v onto an empty cache):
 * SDPA then saves the copies.  GPT-2 (fused c_attn): q stays a view of the c_attn output, so
 * that storage stays alive and the k and v copies are extra: 12 layers x 2 x (1·16·768·2 B) at
 * b=1, s=16, amp = 589,824 B more activations when backward starts.  Llama (separate k_proj and
 * v_proj): the copies replace the rotated k and the v_proj output (under autocast the cache
 * holds fp32 copies until the forward returns and SDPA saves their half casts), no change when
 * backward starts.  Under
 * transformers' gradient checkpointing (hf_checkpointing) the cache is off: no copies. */
static void test_estimate_use_cache(void **state)
{
    (void)state;
    const char *files[] = {"models/hf/gpt2.json", "models/hf/llama-2-7b.json"};
    const uint64_t extra[] = {589824, 0};
    for (int i = 0; i < 2; i++) {
        struct mp_model m;
        load_file(&m, files[i]);
        assert_true(m.kv_cache && m.use_cache); /* the config says use_cache: true */
        uint64_t act[2];
        for (int on = 0; on < 2; on++) {
            m.use_cache = on;
            struct mp_estimate e;
            run(&m, 1, 16, MP_PREC_AMP_BF16, MP_OPT_SGD, NULL, &e);
            act[on] = e.activations_bytes;
            mp_estimate_release(&e);
        }
        assert_int_equal(act[1] - act[0], extra[i]);
        struct mp_build_opts bo;
        mp_build_opts_default(&bo);
        bo.seq = 16;
        bo.hf_checkpointing = true;
        struct mp_program prog;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_program_build(&m, &bo, &prog, &d), MP_OK); /* m.use_cache is on here */
        for (size_t k = 0; k < prog.n_nodes; k++)
            assert_null(strstr(prog.nodes[k].name, "_cache"));
        mp_program_release(&prog);
        mp_model_release(&m);
    }
    struct mp_model m;
    load(&m, "{\"model_type\": \"bert\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 1, "
             "\"num_attention_heads\": 4, \"intermediate_size\": 128, \"use_cache\": true}");
    assert_false(m.kv_cache); /* an encoder: no cache whatever the config says */
    assert_false(m.use_cache);
    mp_model_release(&m);
}

/* Whether tensor t is live when the loss gradient is seeded. */
struct live_at_loss {
    int t;
    bool live, at_loss;
};

static enum mp_status live_at_loss_event(void *ctx, const struct mp_event *ev)
{
    struct live_at_loss *w = ctx;
    if (ev->store == MP_ST_ACT && ev->id == w->t && ev->kind == MP_EV_ALLOC)
        w->live = true;
    if (ev->store == MP_ST_ACT && ev->id == w->t && ev->kind == MP_EV_FREE)
        w->live = false;
    if (ev->kind == MP_EV_LOSS_GRAD)
        w->at_loss = w->live;
    return MP_OK;
}

/* T5 (transformers 5.23 modeling_t5.py), an encoder layer after the first at fp32 / SDPA, b 2,
 * s 32, d_model 64, 4 heads of d_kv 16, d_ff 128, relu, no dropout: what it keeps, worked by hand
 * from the module's ops (x itself belongs to the block before):
 *   layer_norm: rsqrt (b*s*4 = 256), normed (b*s*h*4 = 16384), its output weight * normed
 *   (16384, saved by q, k and v); q, k, v: 3 x 16384 (saved by SDPA); the position-bias mask
 *   pb.contiguous() (a*s*s*4 = 16384); SDPA's output (16384) and logsumexp (b*a*32*4 = 1024);
 *   the residual sum x1 (16384, saved by the next norm); its rsqrt (256), normed (16384) and
 *   output (16384, saved by wi); relu's output (b*s*F*4 = 32768, saved by relu and wo).
 *   Total 198144 (bench/accuracy/torch_step.py: saved tensors equal to PyTorch's). */
static const char T5_TINY[] =
    "{\"model_type\": \"t5\", \"vocab_size\": 100, \"d_model\": 64, \"d_kv\": 16, \"d_ff\": 128,"
    " \"num_layers\": 2, \"num_heads\": 4, \"dropout_rate\": 0.0, \"n_positions\": 32}";

static uint64_t block_saved_bytes(const struct mp_program *p, size_t i)
{
    uint64_t sum = 0;
    bool *seen = calloc(p->n_tensors, 1);
    assert_non_null(seen);
    const struct mp_block_prog *bp = &p->blocks[i];
    for (size_t k = bp->node0; k < bp->node0 + bp->n_nodes; k++)
        for (int j = 0; j < p->nodes[k].n_saved; j++) {
            int t = p->nodes[k].saved[j];
            if (!seen[t] && p->tensors[t].block == (int)i)
                sum += p->tensors[t].bytes;
            seen[t] = true;
        }
    free(seen);
    return sum;
}

static void test_estimate_t5_encoder_layer(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_diag d = {{0}};
    mp_model_init(&m);
    assert_int_equal(mp_model_load_string(&m, T5_TINY, sizeof T5_TINY - 1, "t5.json", &d), MP_OK);
    struct mp_program prog;
    build(&m, 2, 32, MP_PREC_FP32, &prog);
    assert_string_equal(m.blocks[2].name, "encoder.block.1");
    assert_int_equal(block_saved_bytes(&prog, 2), 198144);
    assert_int_equal(prog.opts.target_seq, 32); /* the default: = seq */
    assert_non_null(prog.probe_unsupported);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* The encoder output is a local of T5ForConditionalGeneration.forward: under autocast nothing
 * saves it (every cross-attention k / v projection saves its own bf16 cast), so it dies when the
 * forward returns; under --checkpoint layers it is an input of every checkpointed decoder layer,
 * alive until the first one's backward. */
static void test_estimate_t5_encoder_output_held(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_diag d = {{0}};
    mp_model_init(&m);
    assert_int_equal(mp_model_load_string(&m, T5_TINY, sizeof T5_TINY - 1, "t5.json", &d), MP_OK);
    for (int ck = 0; ck < 2; ck++) {
        struct mp_chain c;
        chain_at(&m, 2, 32, MP_PREC_AMP_BF16, &c);
        struct mp_ckpt_spec spec = {.strategy = ck ? MP_CKPT_LAYERS : MP_CKPT_NONE, .k = 0};
        struct mp_ckpt_plan plan;
        assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &plan, &d), MP_OK);
        struct mp_program prog;
        build(&m, 2, 32, MP_PREC_AMP_BF16, &prog);
        assert_string_equal(m.blocks[3].name, "encoder.final");
        struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
        struct live_at_loss w = {.t = prog.blocks[3].output};
        assert_int_equal(mp_replay(&prog, &plan.sched, &t, live_at_loss_event, &w, &d), MP_OK);
        assert_int_equal(w.at_loss, ck == 1);
        assert_false(w.live);
        mp_program_release(&prog);
        mp_ckpt_plan_release(&plan);
        mp_chain_release(&c);
    }
    mp_model_release(&m);
}

/* HF computes the rotary cos/sin once in the model's forward and passes them to every
 * layer; with gradient checkpointing they are checkpoint inputs, so they stay alive through
 * the backward (they were lost with the checkpointed first layer). */
static void test_estimate_rope_tables_under_checkpointing(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/hf/qwen2-0.5b.json");
    struct mp_chain c;
    chain_at(&m, 1, 16, MP_PREC_AMP_BF16, &c);
    struct mp_ckpt_spec spec = {.strategy = MP_CKPT_LAYERS, .k = 0};
    struct mp_ckpt_plan plan;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &plan, &d), MP_OK);
    struct mp_program prog;
    build(&m, 1, 16, MP_PREC_AMP_BF16, &prog);
    assert_true(prog.rope_tables >= 0);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct live_at_loss w = {.t = prog.rope_tables};
    assert_int_equal(mp_replay(&prog, &plan.sched, &t, live_at_loss_event, &w, &d), MP_OK);
    assert_true(w.at_loss);
    assert_false(w.live); /* freed by the end of the step */
    mp_program_release(&prog);
    mp_ckpt_plan_release(&plan);
    mp_chain_release(&c);
    mp_model_release(&m);
}

/* Whether tensor t is live at the forward of node `node` and when the loss gradient is seeded. */
struct live_at_node {
    int t, node;
    bool live, at_node, at_loss;
};

static enum mp_status live_at_node_event(void *ctx, const struct mp_event *ev)
{
    struct live_at_node *w = ctx;
    if (ev->store == MP_ST_ACT && ev->id == w->t)
        w->live = ev->kind == MP_EV_ALLOC ? true : ev->kind == MP_EV_FREE ? false : w->live;
    if (ev->kind == MP_EV_FWD && ev->node == w->node)
        w->at_node = w->live;
    if (ev->kind == MP_EV_LOSS_GRAD)
        w->at_loss = w->live;
    return MP_OK;
}

/* use_cache under autocast: transformers' DynamicCache keeps each layer's fp32 k and v copies
 * (the rotated k is fp32, the empty cache takes its dtype) until the model's forward returns:
 * alive in the loss's forward (inside the model's forward), gone when backward starts (measured
 * with bench/accuracy/torch_step.py --use-cache: llama-2-7b 8x1024 amp peaks in the loss forward). */
static void test_estimate_kv_cache_held_to_loss(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/hf/llama-2-7b.json");
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.seq = 16;
    struct mp_program prog;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_program_build(&m, &bo, &prog, &d), MP_OK);
    int kc = -1;
    for (size_t k = 0; k < prog.n_nodes && kc < 0; k++)
        if (prog.nodes[k].kv_cached)
            kc = prog.nodes[k].out;
    assert_true(kc >= 0);
    assert_int_equal(prog.tensors[kc].dtype, MP_DT_F32);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct live_at_node w = {.t = kc, .node = (int)prog.n_nodes - 1}; /* the nll_loss */
    assert_int_equal(prog.nodes[w.node].prim, MP_P_NLL_LOSS);
    assert_int_equal(mp_replay(&prog, NULL, &t, live_at_node_event, &w, &d), MP_OK);
    assert_true(w.at_node);
    assert_false(w.at_loss);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* Activation gradients as the backward runs: live GRAD bytes and storages, at given nodes. */
struct grad_meter {
    const struct mp_program *p;
    int watch[3];          /* node ids */
    uint64_t live, max_live_after[3]; /* bytes now; the most after watch[i]'s BWD, in its node */
    int stores;            /* GRAD storages alive */
    uint64_t at[3];        /* live bytes at watch[i]'s BWD */
    int stores_at[3];
    uint64_t tmp[3];       /* TMP bytes allocated for watch[i]'s backward */
    bool oop[3];           /* BWD of watch[i] said out of place */
    int cur;               /* the watched node whose backward ran last, -1 */
    bool balanced;
};

static enum mp_status grad_meter_event(void *ctx, const struct mp_event *ev)
{
    struct grad_meter *g = ctx;
    if (ev->kind == MP_EV_BWD) {
        g->cur = -1;
        for (int i = 0; i < 3; i++)
            if (ev->node == g->watch[i]) {
                g->at[i] = g->live;
                g->stores_at[i] = g->stores;
                g->oop[i] = ev->grad_out_of_place;
                g->max_live_after[i] = g->live;
                g->cur = i;
            }
    }
    if (ev->kind == MP_EV_ALLOC && ev->store == MP_ST_TMP && ev->phase == MP_PH_BACKWARD)
        for (int i = 0; i < 3; i++)
            if (ev->node == g->watch[i])
                g->tmp[i] = ev->bytes;
    if (ev->store != MP_ST_GRAD || (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE))
        return MP_OK;
    if (ev->kind == MP_EV_ALLOC) {
        g->live += ev->bytes;
        g->stores++;
        if (g->cur >= 0 && ev->node == g->watch[g->cur] && g->live > g->max_live_after[g->cur])
            g->max_live_after[g->cur] = g->live;
    } else {
        g->balanced &= g->live >= ev->bytes && g->stores > 0;
        g->live -= ev->bytes;
        g->stores--;
    }
    return MP_OK;
}

static int node_named(const struct mp_program *p, const char *name)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        if (strcmp(p->nodes[k].name, name) == 0)
            return (int)k;
    fail_msg("no node %s", name);
    return -1;
}

/* x -> layernorm -> fc1 -> gelu -> fc2, y = x + fc2 (batch 2, 16 wide, 32 in the MLP). */
static const char *RES = "{\"name\":\"res\",\"input\":{\"shape\":[16]},\"layers\":["
                         "{\"type\":\"linear\",\"name\":\"in\",\"in_features\":16,\"out_features\":16},"
                         "{\"type\":\"layernorm\",\"name\":\"in_ln\",\"dim\":16},"
                         "{\"block\":\"r\",\"layers\":["
                         "{\"type\":\"layernorm\",\"name\":\"ln\",\"dim\":16},"
                         "{\"type\":\"linear\",\"name\":\"fc1\",\"in_features\":16,\"out_features\":32},"
                         "{\"type\":\"activation\",\"name\":\"act\",\"act\":\"gelu\"},"
                         "{\"type\":\"linear\",\"name\":\"fc2\",\"in_features\":32,\"out_features\":16},"
                         "{\"type\":\"residual\",\"name\":\"add\"}]},"
                         "{\"type\":\"linear\",\"name\":\"proj\",\"in_features\":16,\"out_features\":8}]}";

/* A residual add's backward (AddBackward0, derivatives.yaml add.Tensor: `self: grad`, `other:
 * grad`) returns its incoming gradient G itself to both inputs; the engine puts it in both
 * inputs' buffers.  Worked by hand from that rule and InputBuffer::accumulate, fp32, batch 2:
 *   add:  x's and fc2's gradients are G (2x16x4 = 128 B); nothing is allocated.
 *   fc2:  G (one storage for x and fc2's output) + the new gradient of gelu's output (2x32x4 =
 *         256 B) = 384 B in 2 storages (a gradient per input was 512 B in 3).
 *   ln:   G (now x's alone) + ln's output gradient 128 B = 256 B in 2; ln's new gradient for x
 *         (128 B) is a tensor of its own until it is added to G in place: in ln's TMP.
 * Under autocast fc2's output is bf16 and x fp32 (layernorm), y fp32: x takes G, fc2's output
 * gets G cast to bf16, a new tensor (2x16x2 = 64 B): 128 + 64 = 192 B at the add's backward. */
static void test_estimate_residual_add_shares_gradient(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, RES);
    struct mp_program prog;
    build(&m, 2, 0, MP_PREC_FP32, &prog);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_diag d = {{0}};
    struct grad_meter g = {.p = &prog, .cur = -1, .balanced = true};
    g.watch[0] = node_named(&prog, "r.add");
    g.watch[1] = node_named(&prog, "r.fc2");
    g.watch[2] = node_named(&prog, "r.ln");
    assert_int_equal(mp_replay(&prog, NULL, &t, grad_meter_event, &g, &d), MP_OK);
    assert_true(g.balanced);
    assert_int_equal(g.live, 0);
    assert_int_equal(g.at[0], 128);
    assert_int_equal(g.stores_at[0], 1);
    assert_int_equal(g.at[1], 128 + 256);
    assert_int_equal(g.stores_at[1], 2);
    assert_int_equal(g.at[2], 128 + 128);
    assert_int_equal(g.stores_at[2], 2);
    assert_int_equal(g.tmp[2], prog.nodes[g.watch[2]].bwd_tmp_bytes + 128);
    for (int i = 0; i < 3; i++)
        assert_false(g.oop[i]);
    mp_program_release(&prog);

    build(&m, 2, 0, MP_PREC_AMP_BF16, &prog);
    struct grad_meter a = {.p = &prog, .cur = -1, .balanced = true, .watch = {node_named(&prog, "r.add"), -2, -2}};
    assert_int_equal(prog.tensors[prog.nodes[a.watch[0]].in[0]].dtype, MP_DT_F32);
    assert_int_equal(prog.tensors[prog.nodes[a.watch[0]].in[1]].dtype, MP_DT_BF16);
    assert_int_equal(mp_replay(&prog, NULL, &t, grad_meter_event, &a, &d), MP_OK);
    assert_int_equal(a.at[0], 128 + 64);
    assert_int_equal(a.stores_at[0], 2);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* InputBuffer::accumulate adds out of place (old + new: a new storage) when the old gradient's
 * storage is held elsewhere too.  y = x + x (the add's inputs made one tensor): G goes to x's
 * buffer, then G again, while the add's outputs still hold it: x's gradient becomes a new
 * 128 B storage next to G (256 B), then G is freed (128 B). */
static void test_estimate_gradient_added_out_of_place(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, RES);
    struct mp_program prog;
    build(&m, 2, 0, MP_PREC_FP32, &prog);
    int add = node_named(&prog, "r.add");
    prog.nodes[add].in[1] = prog.nodes[add].in[0];
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_diag d = {{0}};
    struct grad_meter g = {.p = &prog, .cur = -1, .balanced = true, .watch = {add, -2, -2}};
    assert_int_equal(mp_replay(&prog, NULL, &t, grad_meter_event, &g, &d), MP_OK);
    assert_true(g.balanced);
    assert_int_equal(g.live, 0);
    assert_true(g.oop[0]);
    assert_int_equal(g.at[0], 128);
    assert_int_equal(g.max_live_after[0], 256);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* The order of one linear node's backward events. */
struct wgrad_order {
    int node, q, x;       /* the node, its weight, its saved input */
    int n, bwd, x_free, pgrad, cast, tmp_free;
};

static enum mp_status wgrad_order_event(void *ctx, const struct mp_event *ev)
{
    struct wgrad_order *o = ctx;
    o->n++;
    if (ev->kind == MP_EV_BWD && ev->node == o->node)
        o->bwd = o->n;
    if (ev->kind == MP_EV_FREE && ev->store == MP_ST_ACT && ev->id == o->x)
        o->x_free = o->n;
    if (ev->kind == MP_EV_ALLOC && ev->store == MP_ST_PGRAD && ev->id == o->q)
        o->pgrad = o->n;
    if (ev->kind == MP_EV_WGRAD_CAST && ev->node == o->node && ev->id == o->q)
        o->cast = o->n;
    if (ev->kind == MP_EV_FREE && ev->store == MP_ST_TMP && ev->node == o->node && ev->phase == MP_PH_BACKWARD)
        o->tmp_free = o->n;
    return MP_OK;
}

/* Under autocast a Linear's weight is an autocast cast (ToCopyBackward0 between the fp32
 * parameter and the node): AddmmBackward0 makes the half weight gradient (its TMP), releases
 * what it saved, and only then ToCopyBackward0 makes the fp32 gradient AccumulateGrad keeps,
 * while the half one is still alive.  Without autocast the gradient is the node's own (its mm
 * output, AccumulateGrad steals it): made during the node, before it releases anything. */
static void test_estimate_autocast_weight_grad_after_node(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, RES);
    struct mp_program prog;
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_diag d = {{0}};
    build(&m, 2, 0, MP_PREC_AMP_BF16, &prog);
    int fc2 = node_named(&prog, "r.fc2");
    struct wgrad_order o = {.node = fc2, .q = prog.nodes[fc2].param[0], .x = prog.nodes[fc2].in[0]};
    assert_int_equal(mp_replay(&prog, NULL, &t, wgrad_order_event, &o, &d), MP_OK);
    assert_true(o.bwd > 0 && o.x_free > o.bwd);
    assert_true(o.pgrad > o.x_free);
    assert_true(o.cast > o.pgrad);
    assert_true(o.tmp_free > o.cast);
    mp_program_release(&prog);

    build(&m, 2, 0, MP_PREC_FP32, &prog);
    fc2 = node_named(&prog, "r.fc2");
    struct wgrad_order f = {.node = fc2, .q = prog.nodes[fc2].param[0], .x = prog.nodes[fc2].in[0]};
    assert_int_equal(mp_replay(&prog, NULL, &t, wgrad_order_event, &f, &d), MP_OK);
    assert_true(f.pgrad > 0 && f.pgrad < f.bwd);
    assert_int_equal(f.cast, 0);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* Eager attention in an HF decoder gets a (b, 1, s, s) mask in the model's dtype from
 * create_causal_mask, once per forward: a checkpoint input under gradient checkpointing (held
 * to the first layer's backward: llama-2-7b 2x1024 amp eager `layers` was -8 MiB = 2·1024²·4 in
 * the bench before it was modelled), a forward local otherwise (gone when backward starts). */
static void test_estimate_eager_mask(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/hf/llama-2-7b.json");
    struct mp_chain c;
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 2;
    bo.seq = 16;
    bo.attention = MP_ATTN_EAGER;
    bo.attention_forced = true;
    struct mp_program prog;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_program_build(&m, &bo, &prog, &d), MP_OK);
    assert_true(prog.attn_mask >= 0);
    assert_int_equal(prog.tensors[prog.attn_mask].bytes, 2 * 16 * 16 * 4);
    assert_int_equal(mp_estimate_chain(&prog, &c, &d), MP_OK);
    struct mp_ckpt_spec spec = {.strategy = MP_CKPT_LAYERS, .k = 0};
    struct mp_ckpt_plan plan;
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &plan, &d), MP_OK);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct live_at_loss w = {.t = prog.attn_mask};
    assert_int_equal(mp_replay(&prog, &plan.sched, &t, live_at_loss_event, &w, &d), MP_OK);
    assert_true(w.at_loss);
    assert_false(w.live);
    w = (struct live_at_loss){.t = prog.attn_mask};
    assert_int_equal(mp_replay(&prog, NULL, &t, live_at_loss_event, &w, &d), MP_OK);
    assert_false(w.at_loss);
    mp_ckpt_plan_release(&plan);
    mp_chain_release(&c);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* Live bytes (512-rounded) while one node runs in one phase: the level just before its first
 * event and the highest level after any of its events. */
struct node_meter {
    int node;
    enum mp_phase phase;
    uint64_t cur, start, peak;
    bool seen;
};

static enum mp_status node_meter_event(void *ctx, const struct mp_event *ev)
{
    struct node_meter *m = ctx;
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    bool mine = ev->node == m->node && ev->phase == m->phase;
    if (mine && !m->seen) {
        m->seen = true;
        m->start = m->peak = m->cur;
    }
    if (ev->kind == MP_EV_ALLOC)
        m->cur += mp_round512(ev->bytes);
    else
        m->cur -= mp_round512(ev->bytes);
    if (mine && m->cur > m->peak)
        m->peak = m->cur;
    return MP_OK;
}

/* How far above its starting level the eager attention node's forward and backward go. */
static void eager_rise(const char *model_json, enum mp_precision prec, uint64_t *fwd, uint64_t *bwd)
{
    struct mp_model m;
    load(&m, model_json);
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 2;
    bo.precision = prec;
    struct mp_program prog;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_program_build(&m, &bo, &prog, &d), MP_OK);
    int k = -1;
    for (size_t i = 0; i < prog.n_nodes; i++)
        if (prog.nodes[i].prim == MP_P_ATTN)
            k = (int)i;
    assert_true(k >= 0 && prog.nodes[k].eager);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct node_meter f = {.node = k, .phase = MP_PH_FORWARD}, b = {.node = k, .phase = MP_PH_BACKWARD};
    assert_int_equal(mp_replay(&prog, NULL, &t, node_meter_event, &f, &d), MP_OK);
    assert_int_equal(mp_replay(&prog, NULL, &t, node_meter_event, &b, &d), MP_OK);
    assert_true(f.seen && b.seen);
    *fwd = f.peak - f.start;
    *bwd = b.peak - b.start;
    mp_program_release(&prog);
    mp_model_release(&m);
}

#define EAGER_MODEL(kv) "{\"name\":\"e\",\"input\":{\"tokens\":16},\"layers\":[" \
    "{\"type\":\"embedding\",\"vocab\":16,\"dim\":32}," \
    "{\"type\":\"attention\",\"dim\":32,\"heads\":4,\"kv_heads\":" kv ",\"impl\":\"eager\"}," \
    "{\"type\":\"lm_head\",\"vocab\":16,\"dim\":32}]}"

/* Eager attention runs as torch's ops (Q@K^T, * scale, the softmax and the casts around it,
 * P@V, the transpose copy), each freeing its input once done; its backward as their autograd
 * nodes, each freeing its saved operands and incoming gradient when it ends (derivatives.yaml
 * bmm, _softmax_backward_data, _to_copy, mul).  Worked by hand, batch 2, seq 16, 4 heads of
 * width 8: the scores (b, a, s, s) have 2048 elements (bf16 4096 B, fp32 8192 B), a head
 * tensor (b, a, s, d) 1024 (bf16 2048 B, fp32 4096 B).
 * amp-bf16 (the softmax in fp32 on CUDA autocast; no mask in memplan JSON):
 *   forward, above the level before the node: the q/k/v copies 3 x 2048, then scores 4096 ->
 *   scaled 4096 (scores die) -> fp32 upcast 8192 (scaled die) -> probabilities 8192 (the upcast
 *   dies) -> their bf16 cast 4096 -> heads 2048 -> output 2048: 6144 + 8192 + 8192 = 22528 at
 *   the softmax (and again at the output: 6144 + 8192 + 4096 + 2048 + 2048), not 38912 (every
 *   transient at once);
 *   backward: dV (v's own gradient: the copy has its size) 2048, dP 4096, then the P@V operands
 *   (v copy 2048, bf16 probabilities 4096) and dO 2048 die; dP's fp32 copy 8192 (dP dies); the
 *   softmax backward's 8192: 2048 + 8192 + 8192 = 18432 - the 8192 freed = 10240 at
 *   _softmax_backward_data (was 22528: every gradient and a 2 x fp32 workspace from the start).
 * fp32, 2 kv heads (repeat_kv: k/v copies of 4 heads, 4096 B each; k and v 2048 B):
 *   forward: copies 3 x 4096, scores 8192, scaled 8192 (no upcast, no cast): 28672 with the
 *   scores and again with the probabilities, and with the heads and the output (4096 each);
 *   backward: dV into a buffer of the copy's size (summed into v's 2048 at the end) 4096, dP
 *   8192: 12288; then the v copy and dO (4096 each) die, the probabilities stay (the softmax
 *   saved them too): 4096; the softmax backward's 8192: 12288 again. */
static void test_estimate_eager_ops(void **state)
{
    (void)state;
    uint64_t fwd, bwd;
    eager_rise(EAGER_MODEL("4"), MP_PREC_AMP_BF16, &fwd, &bwd);
    assert_int_equal(fwd, 22528);
    assert_int_equal(bwd, 10240);
    eager_rise(EAGER_MODEL("2"), MP_PREC_FP32, &fwd, &bwd);
    assert_int_equal(fwd, 28672);
    assert_int_equal(bwd, 12288);
}

/* The forward-phase peak of a replay (512-rounded live bytes). */
struct fwd_meter {
    uint64_t cur, fwd_peak;
};

static enum mp_status fwd_meter_event(void *ctx, const struct mp_event *ev)
{
    struct fwd_meter *m = ctx;
    if (ev->kind == MP_EV_ALLOC) {
        m->cur += mp_round512(ev->bytes);
        if (ev->phase == MP_PH_FORWARD && m->cur > m->fwd_peak)
            m->fwd_peak = m->cur;
    } else if (ev->kind == MP_EV_FREE) {
        m->cur -= mp_round512(ev->bytes);
    }
    return MP_OK;
}

/* torch.autocast caches the bf16 copy of every weight it casts until the autocast region
 * ends (after the loss), so under checkpointing the copies of the no-grad (checkpointed)
 * layers outlive their layer (autocast_mode.cpp cached_cast; clear_autocast_cache on exit).
 * embedding(64, 64) | 3 x linear(64 -> 64, no bias) | lm_head(64 -> 64, untied); 64 tokens,
 * batch 1, amp-bf16, SGD, no workspace, --checkpoint layers.  At log_softmax's forward:
 *   params 16384 + 3 x 16384 + 16384 = 81920; ids + labels 512 + 512;
 *   checkpoints: embedding output 64*64*4 = 16384, the layers' bf16 outputs 3 x 8192;
 *   the cache: 3 x 64*64*2 = 24576; lm_head's saved copy 8192;
 *   bf16 logits 8192, fp32 upcast 16384, log-probs 16384  -> 197632
 * (173056 if the copies died with their layer). */
static void test_estimate_autocast_cache(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"name\":\"c\",\"input\":{\"tokens\":64},\"layers\":["
             "{\"type\":\"embedding\",\"vocab\":64,\"dim\":64},"
             "{\"repeat\":3,\"layers\":[{\"type\":\"linear\",\"in_features\":64,\"out_features\":64,"
             "\"bias\":false}]},"
             "{\"type\":\"lm_head\",\"vocab\":64,\"dim\":64}]}");
    struct mp_chain c;
    chain_at(&m, 1, 64, MP_PREC_AMP_BF16, &c);
    struct mp_ckpt_spec spec = {.strategy = MP_CKPT_LAYERS, .k = 0};
    struct mp_ckpt_plan plan;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &plan, &d), MP_OK);
    struct mp_program prog;
    build(&m, 1, 64, MP_PREC_AMP_BF16, &prog);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct fwd_meter fm = {0};
    assert_int_equal(mp_replay(&prog, &plan.sched, &t, fwd_meter_event, &fm, &d), MP_OK);
    assert_int_equal(fm.fwd_peak, 197632);
    assert_int_equal(fm.cur, 81920 + 1024); /* only params and the batch remain */
    mp_program_release(&prog);
    mp_ckpt_plan_release(&plan);
    mp_chain_release(&c);
    mp_model_release(&m);
}

/* --checkpoint layers wraps the repeated blocks only (transformers' gradient
 * checkpointing: decoder layers, not embeddings or head).  Opaque blocks, batch 1,
 * sizes in bytes (multiples of 512, so rounding changes nothing): embed out 1024 /
 * keeps 4096; three repeated layers out 1024 / keep 8192; head out 512 / keeps 2048.
 * Activations when backward starts (+ the 512-byte gradient of the output):
 *   none:    4096 + 3*8192 + 2048 + 512 = 31232
 *   layers:  embed 4096 (x_1 included) + the checkpoints x_2, x_3 1024 each + head 2048
 *            (its input x_4 is not kept) + 512 = 8704
 *   every:1: x_1..x_4 1024 each + x_5 512 + 512 = 5120 (the head checkpointed too).
 *   layers:2 (transformers' every_n_layers=2: the layers whose index among the decoder layers
 *            is a multiple of 2, here h.0 and h.2): embed 4096 (x_1, h.0's checkpoint, included)
 *            + h.1 whole 8192 (x_3, h.2's checkpoint, included) + head 2048 + 512 = 14848. */
static void test_estimate_checkpoint_layers(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"name\":\"c\",\"input\":{\"bytes_per_sample\":512},\"layers\":["
             "{\"block\":\"embed\",\"layers\":[{\"type\":\"custom\",\"output_bytes\":1024,\"saved_bytes\":4096,"
             "\"fwd_flops\":1}]},"
             "{\"repeat\":3,\"name\":\"h\",\"layers\":[{\"type\":\"custom\",\"output_bytes\":1024,"
             "\"saved_bytes\":8192,\"fwd_flops\":1}]},"
             "{\"block\":\"head\",\"layers\":[{\"type\":\"custom\",\"output_bytes\":512,\"saved_bytes\":2048,"
             "\"fwd_flops\":1}]}]}");
    const char *specs[] = {"none", "layers", "every:1", "layers:2"};
    const uint64_t want[] = {31232, 8704, 5120, 14848};
    const bool ck[4][5] = {{0, 0, 0, 0, 0}, {0, 1, 1, 1, 0}, {1, 1, 1, 1, 1}, {0, 1, 0, 1, 0}};
    for (int k = 0; k < 4; k++) {
        struct mp_chain c;
        chain_at(&m, 1, 0, MP_PREC_FP32, &c);
        struct mp_ckpt_spec spec;
        assert_int_equal(mp_ckpt_spec_parse(specs[k], &spec), MP_OK);
        struct mp_ckpt_plan p;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &p, &d), MP_OK);
        struct mp_estimate e;
        run(&m, 1, 0, MP_PREC_FP32, MP_OPT_SGD, &p.sched, &e);
        assert_int_equal(e.activations_bytes, want[k]);
        for (size_t i = 0; i < 5; i++)
            assert_int_equal(e.blocks[i].checkpointed, ck[k][i]);
        mp_estimate_release(&e);
        mp_ckpt_plan_release(&p);
        mp_chain_release(&c);
    }
    mp_model_release(&m);
    /* nothing repeated: nothing for "layers" to wrap */
    load(&m, MLP);
    struct mp_chain c;
    chain_at(&m, 1, 0, MP_PREC_FP32, &c);
    struct mp_ckpt_spec spec = {.strategy = MP_CKPT_LAYERS, .k = 0};
    struct mp_ckpt_plan p;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &p, &d), MP_ERR_USAGE);
    assert_non_null(strstr(d.msg, "no repeated blocks"));
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
    mp_model_release(&m);
}

/* --checkpoint layers+offload (transformers 5.24 activation_checkpointing_enable(offload=True)):
 * each checkpointed block's input x_i goes to pinned host memory when its forward ends, so the
 * activations live when backward starts are those of plain layers[:N] less the checkpointed
 * inputs that nothing else holds.  Hand figures: the blocks' outputs are 1536 bytes (x_1 =
 * embed's, x_2, x_3 = h.0's, h.1's) and a custom layer saves its output (lower_layer.c
 * lower_custom).  layers wraps h.0-h.2 (inputs x_1, x_2, x_3): x_1 stays on the device, saved
 * by embed (not checkpointed; its host copy is made all the same), x_2 and x_3 are freed (what
 * checkpointed h.0 and h.1 save is dropped).  layers:2 wraps h.0 and h.2 (x_1, x_3): x_1 is saved
 * by embed and x_3 by h.1 (not checkpointed), so the device keeps both.
 * Pinned: each 1536-byte copy rounded up to 2048 by the host caching allocator (power of two);
 * PCIe: 1536 bytes twice (to the host in the forward, back at the recompute) per input. */
static void test_estimate_checkpoint_offload(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"name\":\"c\",\"input\":{\"bytes_per_sample\":512},\"layers\":["
             "{\"block\":\"embed\",\"layers\":[{\"type\":\"custom\",\"output_bytes\":1536,\"saved_bytes\":4096,"
             "\"fwd_flops\":1}]},"
             "{\"repeat\":3,\"name\":\"h\",\"layers\":[{\"type\":\"custom\",\"output_bytes\":1536,"
             "\"saved_bytes\":8192,\"fwd_flops\":1}]},"
             "{\"block\":\"head\",\"layers\":[{\"type\":\"custom\",\"output_bytes\":512,\"saved_bytes\":2048,"
             "\"fwd_flops\":1}]}]}");
    const char *specs[] = {"layers", "layers+offload", "layers:2", "layers:2+offload"};
    const uint64_t n_in[] = {0, 3, 0, 2}; /* checkpointed inputs offloaded */
    uint64_t act[4];
    for (int k = 0; k < 4; k++) {
        struct mp_estimate e;
        run_spec(&m, 1, 0, MP_PREC_FP32, specs[k], &e);
        act[k] = e.activations_bytes;
        assert_int_equal(e.host_pinned_bytes, n_in[k] * 2048);
        assert_int_equal(e.ckpt_offload_bytes, n_in[k] * 1536);
        assert_true(e.pcie_bytes == (double)(2 * n_in[k] * 1536));
        mp_estimate_release(&e);
    }
    assert_int_equal(act[1], act[0] - 2 * 1536);
    assert_int_equal(act[3], act[2]);
    mp_model_release(&m);
    /* +offload only after layers / layers:N */
    /* (and +sac only after layers / layers:N, alone: test_estimate_checkpoint_sac) */
    const char *bad[] = {"sqrt+offload", "every:2+offload", "layers+", "layers+offloadx", "+offload",
                         "layers:0+offload", "layers+offload+offload", "sqrt+sac", "layers+sac:",
                         "layers+sac:none", "layers+sac:bogus", "layers+offload+sac", "layers+sac+offload",
                         "layers+sacx"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        struct mp_ckpt_spec spec;
        assert_int_equal(mp_ckpt_spec_parse(bad[k], &spec), MP_ERR_USAGE);
    }
}

/* --act-offload (TRL 1.16 OffloadActivations, docs/memory-facts.md#activation-offloading) on
 * Llama-3.2-1B (16 layers, h 2048, V 128256), full fine-tuning, bf16, batch 1 x 2048, layers.
 * Packs in order (id: bytes, offloaded or kept), N = 2048 tokens:
 *   1 input ids (the embedding's backward)  8N = 16,384            offloaded
 *   2..17 x_0..x_15 (the checkpoints' inputs) 2 x 2048 N = 8 MiB each  offloaded
 *   18 the final norm's fp32 input 4 x 2048 N = 16 MiB             offloaded
 *   19 its rsqrt 4N = 8,192                                         offloaded
 *   20, 21 the product's packs of both: tracked storages            kept
 *   22 the norm's weight (a parameter)                              kept
 *   23 the normalized x (the weight trains) 2 x 2048 N = 8 MiB      offloaded
 *   (the lm_head: NoOpManager, no pack)
 *   24 log_softmax's output 4 x 128256 N = 1,050,673,152            offloaded
 *   25 nll_loss's pack of the same output                           kept
 *   26 the shifted labels 8N = 16,384                               offloaded
 *   27 total_weight, 4 bytes                                        kept
 * Pinned: each copy rounded up to a power of two: 16,384 + 16 x 8 MiB + 16 MiB + 8,192 + 8 MiB +
 * 1 GiB (2^30 >= 1,050,673,152) + 16,384 = 1,233,166,336.
 * To the host: 16,384 + 134,217,728 + 16,777,216 + 8,192 + 8,388,608 + 1,050,673,152 + 16,384 =
 * 1,210,097,664.  Back: at the end of the forward the stash holds ids above 26 - 5 (23, 24, 26);
 * nll_loss's backward uses 26 from it and its hook empties it, so every offloaded pack but the
 * labels comes back: 1,210,097,664 - 16,384 = 1,210,081,280.  PCIe: 2,420,178,944. */
static void test_estimate_act_offload(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/hf/llama-3.2-1b.json");
    m.use_cache = false;
    struct mp_chain c;
    chain_at(&m, 1, 2048, MP_PREC_BF16, &c);
    struct mp_ckpt_spec spec;
    assert_int_equal(mp_ckpt_spec_parse("layers", &spec), MP_OK);
    struct mp_ckpt_plan p;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &p, &d), MP_OK);
    struct mp_program prog;
    build(&m, 1, 2048, MP_PREC_BF16, &prog);
    struct mp_estimate e, plain;
    struct mp_train_opts t = {.optimizer = MP_OPT_ADAMW, .cublas_workspace_bytes = 0};
    assert_int_equal(mp_estimate_run(&prog, &p.sched, &t, 0, &plain, &d), MP_OK);
    t.act_offload = true;
    assert_int_equal(mp_estimate_run(&prog, &p.sched, &t, 0, &e, &d), MP_OK);
    assert_int_equal(e.host_pinned_bytes, 1233166336);
    assert_int_equal(e.act_offload_pcie_bytes, 2420178944);
    assert_int_equal(plain.host_pinned_bytes, 0);
    /* the 16 checkpoint inputs leave the device once out of the stash: fewer activations live
     * when backward starts (the last ones were pushed out by the head's packs) */
    assert_true(e.activations_bytes + 16 * 8388608 <= plain.activations_bytes);
    mp_estimate_release(&e);
    mp_estimate_release(&plain);
    mp_program_release(&prog);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
    mp_model_release(&m);
}

/* --checkpoint layers+sac (TRL 1.16's policy, docs/checkpointing.md#sac): a Llama of hidden 64,
 * 4 heads of 16 (2 k/v heads), 3 layers, batch 2 x seq 32 in bf16.  Each checkpointed layer keeps
 * its SDPA call's outputs from its forward to its recompute, worked by hand:
 *   attention output  b x s x hidden x 2 B   = 2 x 32 x 64 x 2     = 8,192 B
 *   logsumexp (fp32)  b x heads x s x 4 B    = 2 x 4 x 32 x 4      = 1,024 B (bf16, d = dv: s not
 *                                                                    rounded to 32)
 *   a layer: 9,216 B (both multiples of 512: the same rounded); 3 layers at the loss: 27,648 B.
 * The recompute skips each layer's attention: 4 b heads s^2 d / 2 (causal) = 4 x 2 x 4 x 1024 x
 * 16 / 2 = 262,144 FLOPs a layer, 786,432 in all.  Eager attention keeps nothing. */
static void test_estimate_checkpoint_sac(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 64, "
             "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 3, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 256}");
    const char *specs[] = {"layers", "layers+sac"};
    struct mp_estimate e[2];
    for (int k = 0; k < 2; k++)
        run_spec(&m, 2, 32, MP_PREC_BF16, specs[k], &e[k]);
    assert_int_equal(e[0].sac_layer_bytes, 0);
    assert_int_equal(e[1].sac_policy, MP_SAC_TRL);
    assert_int_equal(e[1].sac_layer_bytes, 9216);
    assert_int_equal(e[1].sac_layers, 3);
    assert_int_equal(e[1].activations_bytes, e[0].activations_bytes + 27648);
    assert_true(e[0].recompute_flops - e[1].recompute_flops == 786432.0);
    /* torchtitan's SelectiveAC: a Llama layer's 1st, 3rd, 5th and 7th aten.mm (q, v, gate, down:
     * 64 tokens x (64 + 32 + 128 + 64) x 2 B) and SDPA's 9,216 B; its recompute (early_stop=False)
     * runs the whole layer but those ops, 2 M n k FLOPs (64 x 2 x (64 x 64 + 64 x 32 + 64 x 128 +
     * 128 x 64) = 2,883,584) and the attention's 262,144 fewer; the layers' recompute (an early
     * stop at down_proj's pack, before its mm runs) skips down_proj's 2 x 64 x 128 x 64 and the
     * residual add's 64 x 64, in each of the 3 layers */
    struct mp_estimate t;
    run_spec(&m, 2, 32, MP_PREC_BF16, "layers+sac:torchtitan", &t);
    assert_int_equal(t.sac_policy, MP_SAC_TORCHTITAN);
    assert_int_equal(t.sac_layer_bytes, 64 * (64 + 32 + 128 + 64) * 2 + 9216);
    assert_int_equal(t.sac_layers, 3);
    assert_int_equal(t.activations_bytes, e[0].activations_bytes + 3 * (36864 + 9216));
    assert_true(e[0].recompute_flops - t.recompute_flops == 3 * (2883584.0 + 262144.0 - 1048576.0 - 4096.0));
    mp_estimate_release(&t);
    mp_estimate_release(&e[0]);
    mp_estimate_release(&e[1]);
    mp_model_release(&m);
    /* malformed specs: test_estimate_checkpoint_offload */
    struct mp_ckpt_spec spec;
    assert_int_equal(mp_ckpt_spec_parse("layers:2+sac:torchtitan", &spec), MP_OK);
    assert_int_equal(spec.sac, MP_SAC_TORCHTITAN);
    assert_int_equal(mp_ckpt_spec_parse("layers+sac:auto", &spec), MP_OK);
    assert_int_equal(spec.sac, MP_SAC_AUTO);
    assert_int_equal(mp_ckpt_spec_parse("layers:2+sac:trl", &spec), MP_OK);
    char buf[32];
    assert_string_equal(mp_ckpt_spec_str(&spec, buf, sizeof buf), "layers:2+sac");
}

/* Node `node`'s backward: the live bytes (512-rounded) just before it, their maximum during it,
 * and whether tensor `a` is live when the gradient of `a` is made. */
struct node_bwd {
    int node, a;
    uint64_t cur, before, max;
    bool started, a_live, a_live_at_grad;
};

static enum mp_status node_bwd_event(void *ctx, const struct mp_event *ev)
{
    struct node_bwd *w = ctx;
    bool mine = ev->phase == MP_PH_BACKWARD && ev->node == w->node;
    if (mine && !w->started) {
        w->started = true;
        w->before = w->max = w->cur;
    }
    if (ev->kind == MP_EV_ALLOC) {
        w->cur += mp_round512(ev->bytes);
        if (ev->store == MP_ST_ACT && ev->id == w->a)
            w->a_live = true;
        if (mine && ev->store == MP_ST_GRAD && ev->id == w->a)
            w->a_live_at_grad = w->a_live;
    } else if (ev->kind == MP_EV_FREE) {
        w->cur -= mp_round512(ev->bytes);
        if (ev->store == MP_ST_ACT && ev->id == w->a)
            w->a_live = false;
    }
    if (mine && w->cur > w->max)
        w->max = w->cur;
    return MP_OK;
}

/* Under torch's non-reentrant checkpoint a node's saved tensors are the recomputed ones, which
 * die with the node's backward (checkpoint.py unpack_hook drops the frame's reference), before
 * the autograd engine casts its output gradients to the inputs' dtypes (validate_outputs); a
 * tensor autograd saved itself lives until release_variables, after the cast.
 * A Mixtral layer in pure bf16 (hidden 64, 4 experts, top-2), batch 1 x 64 tokens: S = 128
 * routed rows.  The routing-weights multiply: a = the experts' bf16 output (S, 64), 16384 B;
 * b = the fp32 weights (S, 1), 512 B; a * b is fp32.  Its backward, as LiveTracker traced it
 * (bench/accuracy/torch_step.py, mixtral-shrunk 2x1024 bf16), on top of the fp32 incoming gradient:
 *   grad * a -> fp32 (S, 64) 32768 (b's, before its sum); grad * b -> fp32 32768 (a's, before
 *   its cast): +65536; [checkpointed: a and b freed, -16896]; the cast of a's gradient to bf16
 *   +16384; the sum of b's 512.
 * Highest point above the live bytes before the node: no checkpointing 65536 + 16384 + 512
 * = 82432 (torch frees a's fp32 product before the 512-byte sum: 81920); `layers` 65536 (it
 * was 82432: +16384, the whole Mixtral/DeepSeek bf16 `layers` excess in the bench). */
static void test_estimate_recomputed_saved_die_before_engine_cast(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"model_type\": \"mixtral\", \"architectures\": [\"MixtralForCausalLM\"], \"vocab_size\": 64, "
             "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_local_experts\": 4, "
             "\"num_experts_per_tok\": 2, \"max_position_embeddings\": 256}");
    const uint64_t rise[2] = {82432, 65536};
    for (int ck = 0; ck < 2; ck++) {
        struct mp_program prog;
        build(&m, 1, 64, MP_PREC_BF16, &prog);
        struct node_bwd w = {.node = -1, .a = -1};
        for (size_t k = 0; k < prog.n_nodes; k++) /* the first layer's routing-weights multiply */
            if (prog.nodes[k].prim == MP_P_MUL && strstr(prog.nodes[k].name, "experts.weighted") && w.node < 0)
                w.node = (int)k;
        assert_true(w.node >= 0);
        const struct mp_node *n = &prog.nodes[w.node];
        w.a = n->in[0];
        assert_int_equal(prog.tensors[n->in[0]].bytes, 128 * 64 * 2);
        assert_int_equal(prog.tensors[n->in[1]].bytes, 128 * 4);
        assert_int_equal(prog.tensors[n->out].dtype, MP_DT_F32);
        struct mp_chain c;
        struct mp_ckpt_plan plan;
        struct mp_diag d = {{0}};
        if (ck) {
            chain_at(&m, 1, 64, MP_PREC_BF16, &c);
            struct mp_ckpt_spec spec = {.strategy = MP_CKPT_LAYERS, .k = 0};
            assert_int_equal(mp_ckpt_plan_make(&c, &spec, 0, 0, &plan, &d), MP_OK);
        }
        struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
        assert_int_equal(mp_replay(&prog, ck ? &plan.sched : NULL, &t, node_bwd_event, &w, &d), MP_OK);
        assert_true(w.started);
        assert_int_equal(w.max - w.before, rise[ck]);
        assert_int_equal(w.a_live_at_grad, !ck);
        if (ck) {
            mp_ckpt_plan_release(&plan);
            mp_chain_release(&c);
        }
        mp_program_release(&prog);
    }
    mp_model_release(&m);
}

/* The gate/up chunk's gradient parts are catted by SplitBackward0, a node of its own that runs
 * before the grouped GEMM's backward: the cat is made, the parts die, and only then does
 * GroupedMmBackward0 make the weight and input gradients (bench: mixtral-8x7b 8x1024 amp-bf16
 * `none` was +2.13 % = 1536 MiB, the parts alive next to the expert weights' gradient).
 * The tiny Mixtral above in fp32, batch 1 x 64 tokens, S = 128 routed rows, E = 4 experts,
 * F = 128, h = 64: cat (S, 2F) 131072 B; then the parts (2 x 65536) freed; then the weight
 * gradient (E, 2F, h) 262144 and the input's (S, h) 32768.  Highest point above the live bytes
 * before the node: max(131072, 262144 + 32768) = 294912 (it was 262144 + 131072 = 393216). */
static void test_estimate_chunk_cat_before_weight_grad(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"model_type\": \"mixtral\", \"architectures\": [\"MixtralForCausalLM\"], \"vocab_size\": 64, "
             "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"num_local_experts\": 4, "
             "\"num_experts_per_tok\": 2, \"max_position_embeddings\": 256}");
    struct mp_program prog;
    build(&m, 1, 64, MP_PREC_FP32, &prog);
    struct node_bwd w = {.node = -1, .a = -1};
    for (size_t k = 0; k < prog.n_nodes && w.node < 0; k++)
        if (prog.nodes[k].prim == MP_P_GROUPED_MM && prog.nodes[k].out_parts[0] >= 0)
            w.node = (int)k;
    assert_true(w.node >= 0);
    const struct mp_node *n = &prog.nodes[w.node];
    assert_int_equal(prog.tensors[n->out].bytes, 128 * 256 * 4);
    assert_int_equal(prog.params[n->param[0]].elems, 4 * 256 * 64);
    struct mp_train_opts t = {.optimizer = MP_OPT_SGD, .cublas_workspace_bytes = 0};
    struct mp_diag d = {{0}};
    assert_int_equal(mp_replay(&prog, NULL, &t, node_bwd_event, &w, &d), MP_OK);
    assert_int_equal(w.max - w.before, 294912);
    mp_program_release(&prog);
    mp_model_release(&m);
}

/* Sliding-window attention once the sequence reaches the window: transformers gives SDPA a
 * (b, 1, s, s) bool mask instead of is_causal (masking_utils _ignore_causal_mask_sdpa), which
 * SDPA converts to a float mask in q's dtype and saves in every layer (convert_boolean_attn_mask),
 * and repeats k and v to every head (sdpa_attention.py: no enable_gqa with a mask; repeat_kv).
 * Batch 2, seq 16, 2 layers of 4 heads of 16; window 16 (masked) against 17 (not), activations
 * when backward starts (the bool mask is a forward local, gone by then), per layer:
 *   mistral, 2 kv heads, fp32: the float mask 2*16*16*4 = 2048; repeat_kv copies k and v to
 *     (2, 16, 4*16) fp32, 8192 each, saved in place of k and v (2, 16, 2*16), 4096 each: +8192;
 *     10240 per layer;
 *   gemma3_text, 1 kv head (repeat_kv's reshape is a view), fp32: the mask only, 2048;
 *   gemma3_text, amp-bf16: the bf16 mask 1024, and autocast's copy of the expanded fp32 rotated
 *     k has every head: (2, 4, 16, 16) bf16 4096 instead of 1024: +3072; 4096 per layer
 * (measured at full size with bench/accuracy/torch_step.py: gemma-3-1b 2x1024 fp32, 8x1024 amp-bf16). */
static void test_estimate_sliding_window_mask(void **state)
{
    (void)state;
    static const struct {
        const char *type;
        uint64_t kv;
        enum mp_precision prec;
        uint64_t per_layer;
    } cases[] = {
        {"mistral", 2, MP_PREC_FP32, 10240},
        {"gemma3_text", 1, MP_PREC_FP32, 2048},
        {"gemma3_text", 1, MP_PREC_AMP_BF16, 4096},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint64_t act[2];
        for (int w = 0; w < 2; w++) {
            char json[512];
            snprintf(json, sizeof json, "{\"model_type\": \"%s\", \"vocab_size\": 64, \"hidden_size\": 64, "
                     "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": %llu, "
                     "\"head_dim\": 16, \"intermediate_size\": 128, \"sliding_window\": %d, \"use_cache\": false}",
                     cases[k].type, (unsigned long long)cases[k].kv, w ? 16 : 17);
            struct mp_model m;
            load(&m, json);
            struct mp_estimate e;
            run(&m, 2, 16, cases[k].prec, MP_OPT_SGD, NULL, &e);
            act[w] = e.activations_bytes;
            mp_estimate_release(&e);
            mp_model_release(&m);
        }
        if (act[1] - act[0] != 2 * cases[k].per_layer)
            fail_msg("%s kv %llu: +%llu bytes, want 2 x %llu", cases[k].type, (unsigned long long)cases[k].kv,
                     (unsigned long long)(act[1] - act[0]), (unsigned long long)cases[k].per_layer);
    }
}

/* A model of custom blocks reproduces a chain from the literature exactly: the unit
 * chain of docs/checkpointing.md#t4-unit-chain (100 blocks, f = b = 1, x = xb = 1, batch 1), whose
 * 10-segment checkpoint_sequential peaks at 22 units for 290 time units, and
 * whose rotor optimum at 20 units costs 290. */
static void test_estimate_custom_chain_reproduces_literature(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "{\"name\":\"unit\",\"input\":{\"bytes_per_sample\":1},\"layers\":[{\"repeat\":100,\"layers\":["
             "{\"type\":\"custom\",\"output_bytes\":1,\"saved_bytes\":1,\"fwd_flops\":1,\"bwd_flops\":1}]}]}");
    struct mp_chain c;
    chain_at(&m, 1, 0, MP_PREC_FP32, &c);
    assert_int_equal(c.L, 100);
    for (size_t i = 0; i <= c.L; i++) {
        assert_int_equal(c.x[i], 1);
        assert_int_equal(c.xb[i], 1);
        assert_int_equal(c.bt[i], 0);
        if (i < c.L) {
            assert_true(c.f[i] == 1.0 && c.b[i] == 1.0);
            assert_int_equal(c.ft[i], 0);
        }
    }
    assert_true(c.b[c.L] == 0.0);
    struct mp_diag d = {{0}};
    struct mp_ckpt_plan p;
    mp_ckpt_plan_init(&p);
    struct mp_ckpt_spec seg = {.strategy = MP_CKPT_SEGMENTS, .k = 10};
    assert_int_equal(mp_ckpt_plan_make(&c, &seg, 0, 0, &p, &d), MP_OK);
    assert_int_equal(p.peak_bytes, 22);
    assert_true(p.total_cost == 290.0);
    mp_ckpt_plan_release(&p);
    struct mp_ckpt_spec opt = {.strategy = MP_CKPT_OPTIMAL, .k = 0};
    mp_ckpt_plan_init(&p);
    assert_int_equal(mp_ckpt_plan_make(&c, &opt, 20, 0, &p, &d), MP_OK);
    assert_true(p.total_cost == 290.0);
    assert_true(p.peak_bytes <= 20);
    mp_ckpt_plan_release(&p);
    mp_chain_release(&c);
    mp_model_release(&m);

    /* the bundled heterogeneous chain: sizes and costs per sample, exactly */
    load_file(&m, "models/chain-custom.json");
    chain_at(&m, 1, 0, MP_PREC_FP32, &c);
    assert_int_equal(c.L, 7);
    assert_int_equal(c.x[0], 4096);
    const uint64_t xb[] = {4096, 36864, 65536, 65536, 65536, 65536, 24576, 8232};
    const uint64_t x[] = {4096, 16384, 16384, 16384, 16384, 16384, 8192, 40};
    for (size_t i = 0; i <= c.L; i++) {
        assert_int_equal(c.x[i], x[i]);
        assert_int_equal(c.xb[i], xb[i]);
    }
    assert_true(c.f[0] == 2400000.0 && c.b[0] == 4800000.0);
    assert_true(c.f[5] == 4200000.0 && c.b[5] == 12600000.0);
    mp_chain_release(&c);
    mp_model_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_estimate_mlp_exact_bytes),
        cmocka_unit_test(test_estimate_loss_backward_order),
        cmocka_unit_test(test_estimate_loss_dtypes),
        cmocka_unit_test(test_estimate_static_bytes_per_param),
        cmocka_unit_test(test_estimate_activations_linear_in_batch),
        cmocka_unit_test(test_estimate_orderings),
        cmocka_unit_test(test_estimate_checkpoint_lowers_peak),
        cmocka_unit_test(test_estimate_checkpoint_layers),
        cmocka_unit_test(test_estimate_checkpoint_offload),
        cmocka_unit_test(test_estimate_act_offload),
        cmocka_unit_test(test_estimate_checkpoint_sac),
        cmocka_unit_test(test_estimate_autocast_cache),
        cmocka_unit_test(test_estimate_gelu_new_autocast),
        cmocka_unit_test(test_estimate_gelu_new_backward),
        cmocka_unit_test(test_estimate_module_buffers),
        cmocka_unit_test(test_estimate_falcon_gptj_layer),
        cmocka_unit_test(test_estimate_use_cache),
        cmocka_unit_test(test_estimate_kv_cache_held_to_loss),
        cmocka_unit_test(test_estimate_eager_mask),
        cmocka_unit_test(test_estimate_eager_ops),
        cmocka_unit_test(test_estimate_residual_add_shares_gradient),
        cmocka_unit_test(test_estimate_gradient_added_out_of_place),
        cmocka_unit_test(test_estimate_autocast_weight_grad_after_node),
        cmocka_unit_test(test_estimate_rope_tables_under_checkpointing),
        cmocka_unit_test(test_estimate_t5_encoder_layer),
        cmocka_unit_test(test_estimate_t5_encoder_output_held),
        cmocka_unit_test(test_estimate_recomputed_saved_die_before_engine_cast),
        cmocka_unit_test(test_estimate_sliding_window_mask),
        cmocka_unit_test(test_estimate_chunk_cat_before_weight_grad),
        cmocka_unit_test(test_estimate_timeline_balances),
        cmocka_unit_test(test_estimate_overflow_is_an_error),
        cmocka_unit_test(test_estimate_peak_overflow_is_an_error),
        cmocka_unit_test(test_estimate_workspace_overflow_is_an_error),
        cmocka_unit_test(test_estimate_two_cublas_workspaces),
        cmocka_unit_test(test_estimate_optimizer_step_peak),
        cmocka_unit_test(test_estimate_muon),
        cmocka_unit_test(test_estimate_low_bit_optimizer_states),
        cmocka_unit_test(test_estimate_custom_chain_reproduces_literature),
    };
    return cmocka_run_group_tests_name("estimate", tests, NULL, NULL);
}
