/* test_loss.c — the loss heads (--loss): the chunk sizes, the bytes one chunk and the whole head
 * allocate, and the refusals.  Expected values are hand arithmetic from the libraries' source
 * (trl 1.16.0 kernels/chunked_logprob.py and trainer/utils.py; liger-kernel 0.8.5
 * ops/fused_linear_cross_entropy.py and transformers/model/loss_utils.py; Axolotl's Cut
 * Cross-Entropy fork cut_cross_entropy/cce.py, cce_lse_forward.py, indexed_dot.py,
 * cce_backward.py, utils.py; torchtune main modules/loss/cross_entropy_loss.py), written out below;
 * the whole-step figures against PyTorch are bench/accuracy/loss_heads.py's rows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ir/layers.h"
#include "model/model.h"

/* embedding(40000, 64) | lm_head(64 -> 40000, untied) on 5000 tokens: V = 40000 > 32768, so TRL
 * runs two vocabulary tiles, and 4999 label positions after the shift > 4096, two token chunks. */
static const char *LM = "{\"name\":\"lm\",\"input\":{\"tokens\":5000},\"layers\":["
                        "{\"type\":\"embedding\",\"vocab\":40000,\"dim\":64},"
                        "{\"type\":\"lm_head\",\"vocab\":40000,\"dim\":64}]}";

static void load(struct mp_model *m, const char *text)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_string(m, text, strlen(text), "test.json", &d) != MP_OK)
        fail_msg("load: %s", d.msg);
}

/* Builds m with loss l at batch 1, seq 5000, pure bf16 (full training): MP_OK or the status. */
static enum mp_status build(const struct mp_model *m, enum mp_loss l, double frac, struct mp_program *p,
                            struct mp_diag *d)
{
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.seq = 5000;
    o.precision = MP_PREC_BF16;
    o.loss = l;
    o.label_fraction = frac;
    return mp_program_build(m, &o, p, d);
}

static const struct mp_node *fused(const struct mp_program *p)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        if (p->nodes[k].prim == MP_P_FUSED_LOSS)
            return &p->nodes[k];
    fail_msg("no fused_loss node");
    return NULL;
}

/* The bytes of n's extra named "<node>.<part>". */
static uint64_t extra_bytes(const struct mp_program *p, const struct mp_node *n, const char *part)
{
    char want[128];
    snprintf(want, sizeof want, "%s.%s", n->name, part);
    for (int j = 0; j < n->n_extra; j++)
        if (!strcmp(p->tensors[n->extra[j]].name, want))
            return p->tensors[n->extra[j]].bytes;
    fail_msg("no extra %s", want);
    return 0;
}

static void test_chunk_rows(void **state)
{
    (void)state;
    /* TRL: tiles of TOKEN_CHUNK_SIZE = 4096 rows (chunked_logprob.py:31) */
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_CHUNKED_NLL, 8191, 128256, 4096), 4096);
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_CHUNKED_NLL, 1000, 128256, 4096), 1000);
    /* Liger, Llama-3-8B at 8192 tokens: inc = ceil(128256 / 4096) = ceil(31.31) = 32;
     * ceil(8192 / 32) = 256; next_pow2(256) = 256 <= 8192 */
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_LIGER, 8192, 128256, 4096), 256);
    /* Llama-3.2-1B at 2048: inc = ceil(128256 / 2048) = ceil(62.63) = 63; ceil(2048 / 63) = 33;
     * next_pow2(33) = 64 */
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_LIGER, 2048, 128256, 2048), 64);
    /* the source's own example (fused_linear_cross_entropy.py:98): BT = 4096*4, V = 32000,
     * H = 4096 -> inc_factor 8, chunk_size 2048 */
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_LIGER, 16384, 32000, 4096), 2048);
    /* never more than BT (:105): inc = 1, next_pow2(10) = 16 -> 10 */
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_LIGER, 10, 100, 1000), 10);
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_HF, 10, 100, 1000), 10);
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_CCE, 10, 100, 1000), 0); /* no chunks */
    /* torchtune: tensor_split(8), the largest chunk ceil(N / 8): 4999 -> 625, 8191 -> 1024 */
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_TORCHTUNE, 4999, 40000, 64), 625);
    assert_int_equal(mp_loss_chunk_rows(MP_LOSS_TORCHTUNE, 8191, 128256, 4096), 1024);
}

/* TRL, pure bf16 (hidden, weight and compute dtype bf16: no per-tile copies), full training.
 * N = 4999 kept rows (every label), h = 64, V = 40000; mm_buf = min(N, 4096) x 32768 x 2 =
 * 268435456 bytes.
 * Kept for backward: the mask 4999 (bool, b(s-1)), the gathered rows N h 2 = 639872, the targets
 * 8N = 39992, log_z and entropy 4N = 19996 each.
 * Forward transient: max(16N nonzero indices = 79984, 28N statistics + mm_buf + 8N after the
 * tiles = 139972 + 268435456 + 39992 = 268615420, scatter 5N + 13 x 4999 = 89982) = 268615420.
 * Backward: the function holds 4N incoming + N h 4 grad_hidden + V h 4 grad_weight = 19996 +
 * 1279744 + 10240000 = 11539740, mm_buf, and at the end the bf16 copies N h 2 = 639872 and V h 2
 * = 5120000: 11539740 + 268435456 + 5759872 = 285735068, the largest phase; less the weight's
 * .grad (V h 2 = 5120000) and the input's gradient (b s h 2 = 640000) the replay makes:
 * 279975068. */
static void test_trl_bytes(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LM);
    struct mp_program p;
    struct mp_diag d = {{0}};
    if (build(&m, MP_LOSS_CHUNKED_NLL, 1.0, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    const struct mp_node *n = fused(&p);
    assert_int_equal(n->rows, 4999);
    assert_int_equal(extra_bytes(&p, n, "label_mask"), 4999);
    assert_int_equal(extra_bytes(&p, n, "hidden_rows"), 639872);
    assert_int_equal(extra_bytes(&p, n, "targets"), 39992);
    assert_int_equal(extra_bytes(&p, n, "log_z"), 19996);
    assert_int_equal(extra_bytes(&p, n, "entropy"), 19996);
    assert_int_equal(n->fwd_tmp_bytes, 268615420);
    assert_int_equal(n->bwd_tmp_bytes, 279975068);
    assert_true(p.probe_unsupported != NULL);
    mp_program_release(&p);
    /* half the labels kept: N = ceil(0.5 x 4999) = 2500 rows, one token chunk of 2500:
     * mm_buf 2500 x 32768 x 2 = 163840000; forward 28N + mm_buf + 8N = 70000 + 163840000 + 20000 */
    if (build(&m, MP_LOSS_CHUNKED_NLL, 0.5, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    n = fused(&p);
    assert_int_equal(n->rows, 2500);
    assert_int_equal(extra_bytes(&p, n, "hidden_rows"), 2500 * 64 * 2);
    assert_int_equal(n->fwd_tmp_bytes, 163930000);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Liger, pure bf16, full training: BT = 5000, inc = ceil(40000 / 64) = 625, ceil(5000 / 625) = 8,
 * next_pow2(8) = 8 rows a chunk.  Input and weight share bf16 without autocast: the mm(out=)
 * path, one 8 x 40000 x 2 = 640000 logits buffer.  In the forward: grad_input BT h 2 = 640000 and
 * grad_weight V h 2 = 5120000 (kept, handed to backward); the padded labels 5001 x 8 = 40008, the
 * shifted copy 5000 x 8 = 40000, loss_1d 5000 x 4 and target_mask 5000 (25000) live through the
 * chunks: 105008 + 640000 = 745008.  Backward scales both in place: nothing more.  The label
 * fraction changes nothing (Liger runs every row). */
static void test_liger_bytes(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LM);
    for (int k = 0; k < 2; k++) {
        struct mp_program p;
        struct mp_diag d = {{0}};
        if (build(&m, MP_LOSS_LIGER, k ? 0.25 : 1.0, &p, &d) != MP_OK)
            fail_msg("build: %s", d.msg);
        const struct mp_node *n = fused(&p);
        assert_true(n->fwd_grads);
        assert_int_equal(extra_bytes(&p, n, "grad_input"), 640000);
        assert_int_equal(extra_bytes(&p, n, "grad_weight"), 5120000);
        assert_int_equal(n->fwd_tmp_bytes, 745008);
        assert_int_equal(n->bwd_tmp_bytes, 0);
        assert_int_equal(n->wcopy, -1); /* no autocast: no cached half copy */
        mp_program_release(&p);
    }
    mp_model_release(&m);
}

/* Cut Cross-Entropy, pure bf16, full training (the weight trains): N = 4999 valid positions after
 * the shift, h = 64, V = 40000.  Kept: e itself (the input, saved), valids N int64 = 39992, lse
 * N fp32 = 19996, logit_avg V fp32 = 160000 (cce.py:132).
 * Forward: the valids (mask 4999 + nonzero 16N = 84983, or nonzero and its int32 copy 24N =
 * 119976) come before anything is kept and stay under the kept 12N + 4V = 219988: 0; in the
 * function the locks ceil(4999/128) x 4 = 160 or the N fp32 nll and its scalar sum 19996 + 4 =
 * 20000: 20000.
 * Backward: dE b s h 2 = 640000 (the input's gradient), dC V h 2 = 5120000 (the weight's),
 * vocab_ordering 4V = 160000 and the locks ceil(4999/128) x ceil(64/64) x 4 = 160 and
 * ceil(40000/128) x 1 x 4 = 1252: 5921412, above the sort's 12V = 480000; less dE and dC:
 * 161412.  Half the labels: N = ceil(0.5 x 4999) = 2500: valids 20000, lse 10000. */
static void test_cce_bytes(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LM);
    struct mp_program p;
    struct mp_diag d = {{0}};
    if (build(&m, MP_LOSS_CCE, 1.0, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    const struct mp_node *n = fused(&p);
    assert_int_equal(n->rows, 4999);
    assert_int_equal(extra_bytes(&p, n, "valids"), 39992);
    assert_int_equal(extra_bytes(&p, n, "lse"), 19996);
    assert_int_equal(extra_bytes(&p, n, "logit_avg"), 160000);
    bool saves_input = false;
    for (int j = 0; j < n->n_saved; j++)
        saves_input |= n->saved[j] == n->in[0];
    assert_true(saves_input);
    assert_false(n->fwd_grads);
    assert_int_equal(n->fwd_tmp_bytes, 20000);
    assert_int_equal(n->bwd_tmp_bytes, 161412);
    mp_program_release(&p);
    if (build(&m, MP_LOSS_CCE, 0.5, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    n = fused(&p);
    assert_int_equal(extra_bytes(&p, n, "valids"), 20000);
    assert_int_equal(extra_bytes(&p, n, "lse"), 10000);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* torchtune's LinearCrossEntropyLoss, pure bf16, full training: N = 4999 labelled rows (its
 * dataset shifts the labels and appends -100), 8 chunks of 625 x 7 and 624 (tensor_split).
 * Kept: indices and the gathered targets 8N = 39992 each, every chunk's fp32 log-probs N V 4 =
 * 799840000, 8 total_weight scalars (8 x 128 fp32 = 4096) and, the weight training, the gathered
 * rows N h 2 = 639872 (MmBackward0 saves them).
 * Forward: the last chunk (624 rows) with every log-prob already kept: its bf16 logits 624 x
 * 40000 x 2 = 49920000, their fp32 copy 99840000 and the nll scalar 512: 149760512 (the earlier
 * chunks hold less: the replay's kept log-probs of the chunks after them are not made yet).
 * Backward, the last chunk first: NllLossBackward0's and LogSoftmaxBackward0's 624 x 40000 fp32
 * gradients, 2 x 99840000 = 199680000, the largest phase (the second chunk's: 5199872 carried,
 * 200000000 new, its predecessor's 99840000 log-probs gone: 105359872); less the weight's
 * gradient V h 2 = 5120000 and the input's b s h 2 = 640000: 193920000. */
static void test_torchtune_bytes(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LM);
    struct mp_program p;
    struct mp_diag d = {{0}};
    if (build(&m, MP_LOSS_TORCHTUNE, 1.0, &p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
    const struct mp_node *n = fused(&p);
    assert_int_equal(n->rows, 4999);
    assert_int_equal(extra_bytes(&p, n, "indices"), 39992);
    assert_int_equal(extra_bytes(&p, n, "targets"), 39992);
    assert_int_equal(extra_bytes(&p, n, "log_probs"), 799840000);
    assert_int_equal(extra_bytes(&p, n, "total_weight"), 4096);
    assert_int_equal(extra_bytes(&p, n, "hidden_rows"), 639872);
    assert_int_equal(n->fwd_tmp_bytes, 149760512);
    assert_int_equal(n->bwd_tmp_bytes, 193920000);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* What is not modelled is refused, naming the option and the head; never a silent hf. */
static void test_refusals(void **state)
{
    (void)state;
    struct mp_model m;
    struct mp_program p;
    struct mp_diag d = {{0}};
    load(&m, LM);
    /* CCE's backward asserts bf16/fp16 e and c (cce_backward.py:349-356): fp32 weights refused;
     * torchtune runs no autocast */
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.seq = 5000;
    o.precision = MP_PREC_AMP_BF16;
    o.loss = MP_LOSS_CCE;
    assert_int_equal(mp_program_build(&m, &o, &p, &d), MP_ERR_USAGE);
    assert_non_null(strstr(d.msg, "--loss cce: Cut Cross-Entropy's backward takes bf16 or fp16"));
    o.precision = MP_PREC_BF16_AMP;
    o.loss = MP_LOSS_TORCHTUNE;
    assert_int_equal(mp_program_build(&m, &o, &p, &d), MP_ERR_USAGE);
    assert_non_null(strstr(d.msg, "--loss torchtune: torchtune trains without autocast"));
    mp_model_release(&m);
    static const char *CLS = "{\"name\":\"t\",\"input\":{\"shape\":[16]},\"classes\":4,\"layers\":["
                             "{\"type\":\"classifier\",\"in_features\":16,\"classes\":4}]}";
    load(&m, CLS);
    assert_int_equal(build(&m, MP_LOSS_LIGER, 1.0, &p, &d), MP_ERR_USAGE);
    assert_non_null(strstr(d.msg, "--loss liger: not modelled for a classifier head"));
    mp_model_release(&m);
}

/* Which model types --loss liger plans, and which of Liger's kernels a trainer's switch leaves on.
 * Expected values read off liger-kernel 0.8.5 transformers/monkey_patch.py by hand: llama's apply
 * function takes rope, rms_norm, swiglu (default True), cross_entropy (False) and
 * fused_linear_cross_entropy (True); gemma's takes geglu where llama's takes swiglu; granite's
 * defaults fused_linear_cross_entropy to False; gpt2 has no entry in MODEL_TYPE_TO_APPLY_LIGER_FN;
 * Axolotl 0.19's plugin turns rope on when unset for qwen2_vl (plugin.py:199-213). */
static void test_liger_families(void **state)
{
    (void)state;
    char buf[320];
    const struct mp_liger cli = {0}; /* the command line's: the fused linear cross-entropy alone */
    assert_null(mp_liger_refused("llama", &cli, buf, sizeof buf));
    assert_null(mp_liger_refused("", &cli, buf, sizeof buf)); /* memplan's own JSON */
    assert_non_null(mp_liger_refused("gpt2", &cli, buf, sizeof buf));
    assert_non_null(strstr(buf, "patches no model_type 'gpt2'"));
    assert_non_null(mp_liger_refused("mistral3", &cli, buf, sizeof buf));
    /* transformers' switch with no config: every default kernel runs */
    struct mp_liger hf = {.set = true, .where = "r.yaml:3: use_liger_kernel: true"};
    assert_non_null(mp_liger_refused("llama", &hf, buf, sizeof buf));
    assert_non_null(strstr(buf, "(r.yaml:3: use_liger_kernel: true) Liger's rope, rms_norm, swiglu kernels are"));
    hf.off = MP_LK_ROPE | MP_LK_RMS_NORM | MP_LK_SWIGLU;
    assert_null(mp_liger_refused("llama", &hf, buf, sizeof buf));
    assert_non_null(mp_liger_refused("gemma", &hf, buf, sizeof buf)); /* its GeGLU, left at its default */
    assert_non_null(strstr(buf, "Liger's geglu kernel is also on"));
    hf.off |= MP_LK_GEGLU;
    assert_null(mp_liger_refused("gemma", &hf, buf, sizeof buf));
    hf.off = MP_LK_ROPE | MP_LK_RMS_NORM | MP_LK_SWIGLU | MP_LK_CROSS_ENTROPY;
    assert_non_null(mp_liger_refused("granite", &hf, buf, sizeof buf));
    assert_non_null(strstr(buf, "fused linear cross-entropy is off"));
    hf.on = MP_LK_FLCE;
    assert_null(mp_liger_refused("granite", &hf, buf, sizeof buf));
    /* Axolotl: unset flags off, but rope on the Qwen-VL types */
    const struct mp_liger ax = {.set = true, .on = MP_LK_FLCE, .unset_off = true};
    assert_null(mp_liger_refused("llama", &ax, buf, sizeof buf));
    assert_non_null(mp_liger_refused("qwen2_vl", &ax, buf, sizeof buf));
    assert_non_null(strstr(buf, "Liger's rope kernel is also on"));
    const struct mp_liger ax2 = {.set = true, .on = MP_LK_FLCE, .off = MP_LK_ROPE, .unset_off = true};
    assert_null(mp_liger_refused("qwen2_5_vl", &ax2, buf, sizeof buf));
    unsigned llama = mp_liger_params("llama");
    assert_int_equal(llama, MP_LK_FLCE | MP_LK_CROSS_ENTROPY | MP_LK_ROPE | MP_LK_RMS_NORM | MP_LK_SWIGLU);
    assert_int_equal(mp_liger_params("gpt2"), 0);
    /* apply_liger_kernel_to_qwen2_5_vl takes no layer_norm (qwen2_vl's does) */
    assert_int_equal(mp_liger_params("qwen2_5_vl"),
                     MP_LK_FLCE | MP_LK_CROSS_ENTROPY | MP_LK_ROPE | MP_LK_RMS_NORM | MP_LK_SWIGLU);
    assert_true(mp_liger_params("qwen2_vl") & MP_LK_LAYER_NORM);
    assert_string_equal(mp_liger_kernel_name(MP_LK_RELU_SQUARED), "relu_squared");
    assert_int_equal(mp_liger_kernel_parse("geglu"), (int)MP_LK_GEGLU);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunk_rows),
        cmocka_unit_test(test_trl_bytes),
        cmocka_unit_test(test_liger_bytes),
        cmocka_unit_test(test_cce_bytes),
        cmocka_unit_test(test_torchtune_bytes),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_liger_families),
    };
    return cmocka_run_group_tests_name("loss", tests, NULL, NULL);
}
