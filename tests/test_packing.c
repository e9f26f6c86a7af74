/* test_packing.c — packed rows (--packing, --padding-free / --tokens-per-batch): the tensors
 * transformers 5.24 adds under SDPA, checked by hand arithmetic on Llama-3.2-1B's config
 * (models/hf/llama-3.2-1b.json: 16 layers, hidden 2048, 32 heads, 8 k/v heads, head_dim 64).
 *
 * With position ids that restart per document, masking_utils.create_causal_mask
 * (transformers 5.24.0 masking_utils.py:991-1002) never skips the mask, and sdpa_mask
 * (:536-547) materialises one (b, 1, s, s) bool tensor; SDPA converts it to q's dtype in every
 * layer (a where, then saved by the attention's backward); sdpa_attention.py's use_gqa_in_sdpa
 * is false with a mask, so k and v are repeat_kv'd to the 32 heads; the rotary embedding's cos
 * and sin follow the (b, s) position ids the collator passes.  The whole step against PyTorch:
 * bench/accuracy/torch_step.py --packing rows|padding-free (rows in rows/torch_step.jsonl).
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

#define LLAMA "models/hf/llama-3.2-1b.json"
#define LAYERS 16

static void load(struct mp_model *m, const char *path)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_file(m, path, &d) != MP_OK)
        fail_msg("load %s: %s", path, d.msg);
    m->use_cache = false; /* as trainers run it (TrainingArguments use_cache false): no k/v cache copies */
}

/* m at batch b, seq s, amp-bf16, the attention impl given: MP_OK or the status. */
static enum mp_status build(const struct mp_model *m, uint64_t b, uint64_t s, enum mp_attn_impl a, bool packing,
                            bool padding_free, struct mp_program *p)
{
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = b;
    o.seq = s;
    o.attention = a;
    o.attention_forced = true;
    o.packing = packing;
    o.padding_free = padding_free;
    struct mp_diag d = {{0}};
    enum mp_status st = mp_program_build(m, &o, p, &d);
    return st;
}

/* How many tensors are named exactly name, or end in "." name (suffix), and their bytes (each
 * must be the same: *each). */
static size_t count_named(const struct mp_program *p, const char *name, bool suffix, uint64_t *each)
{
    size_t n = 0, ln = strlen(name);
    *each = 0;
    for (size_t i = 0; i < p->n_tensors; i++) {
        const char *t = p->tensors[i].name;
        size_t lt = t ? strlen(t) : 0;
        bool hit = t && (suffix ? lt > ln && t[lt - ln - 1] == '.' && !strcmp(t + lt - ln, name) : !strcmp(t, name));
        if (!hit)
            continue;
        if (n && p->tensors[i].bytes != *each)
            fail_msg("%s: tensors of %llu and %llu bytes", name, (unsigned long long)*each,
                     (unsigned long long)p->tensors[i].bytes);
        *each = p->tensors[i].bytes;
        n++;
    }
    return n;
}

/* Unpacked SDPA on a causal model: is_causal, no mask tensor at all. */
static void test_unpacked_no_mask(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LLAMA);
    struct mp_program p;
    assert_int_equal(build(&m, 2, 64, MP_ATTN_SDPA, false, false, &p), MP_OK);
    uint64_t each;
    assert_int_equal(count_named(&p, "attn_mask", false, &each), 0);
    assert_int_equal(count_named(&p, "attn_mask_float", true, &each), 0);
    /* cos and sin of the model's own (1, s) position ids: 2 x 64 x 64 fp32 (amp: fp32 params) */
    assert_int_equal(count_named(&p, "rope.cos_sin", true, &each), 1);
    assert_int_equal(each, 2 * 64 * 64 * 4);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Packed rows, b 2 x s 64: the bool mask 2 x 64 x 64 = 8192 bytes once; a bf16 copy per layer
 * (16 x 2 x 64 x 64 x 2 = 16 x 16384); k and v repeated to 32 heads per layer, what SDPA saves
 * in bf16: 2 x 32 x 64 x 64 x 2 = 524288 bytes each (torch repeats the fp32 rotated k, then
 * autocast's bf16 cast is what SDPA saves: repeat_kv's comment in src/ir/lower_attention.c);
 * cos and sin per row: 2 x (2 x 64) x 64 x 4 = 65536. */
static void test_packed_rows_sdpa(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LLAMA);
    struct mp_program p;
    assert_int_equal(build(&m, 2, 64, MP_ATTN_SDPA, true, false, &p), MP_OK);
    uint64_t each;
    assert_int_equal(count_named(&p, "attn_mask", false, &each), 1);
    assert_int_equal(each, 8192);
    assert_int_equal(count_named(&p, "attn_mask_float", true, &each), LAYERS);
    assert_int_equal(each, 16384);
    assert_int_equal(count_named(&p, "k_repeat", true, &each), LAYERS);
    assert_int_equal(each, 524288);
    assert_int_equal(count_named(&p, "v_repeat", true, &each), LAYERS);
    assert_int_equal(each, 524288);
    assert_int_equal(count_named(&p, "rope.cos_sin", true, &each), 1);
    assert_int_equal(each, 65536);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Padding-free, b 2 x s 64: one row of 128 tokens, so the mask is 128 x 128 = 16384 bytes (twice
 * the rows' 8192: the documents of both rows share one square) and each layer's copy 32768. */
static void test_padding_free_sdpa(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LLAMA);
    struct mp_program p;
    assert_int_equal(build(&m, 2, 64, MP_ATTN_SDPA, true, true, &p), MP_OK);
    uint64_t each;
    assert_int_equal(count_named(&p, "attn_mask", false, &each), 1);
    assert_int_equal(each, 16384);
    assert_int_equal(count_named(&p, "attn_mask_float", true, &each), LAYERS);
    assert_int_equal(each, 32768);
    /* the input ids: one row of 128 int64 = 1024 bytes, the tokens of 2 x 64 */
    assert_int_equal(p.tensors[p.input].bytes, 128 * 8);
    assert_int_equal(p.opts.batch, 2); /* the micro-batch counts samples still */
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Flash attention runs varlen on packed rows: no mask, no repeat (GQA in the kernel). */
static void test_packed_flash_no_mask(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, LLAMA);
    struct mp_program p;
    assert_int_equal(build(&m, 2, 64, MP_ATTN_FLASH, true, false, &p), MP_OK);
    uint64_t each;
    assert_int_equal(count_named(&p, "attn_mask", false, &each), 0);
    assert_int_equal(count_named(&p, "k_repeat", true, &each), 0);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* A model that is not a causal LM refuses packing (BERT: bidirectional self-attention). */
static void test_not_causal_refused(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "models/hf/bert-base-uncased.json");
    struct mp_program p;
    assert_int_equal(build(&m, 2, 64, MP_ATTN_SDPA, true, false, &p), MP_ERR_USAGE);
    mp_model_release(&m);
}

/* Learned position embeddings (GPT-2's wpe) would look up every row's positions: refused. */
static void test_learned_positions_refused(void **state)
{
    (void)state;
    struct mp_model m;
    load(&m, "models/hf/gpt2.json");
    struct mp_program p;
    assert_int_equal(build(&m, 2, 64, MP_ATTN_SDPA, true, true, &p), MP_ERR_USAGE);
    mp_model_release(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unpacked_no_mask),   cmocka_unit_test(test_packed_rows_sdpa),
        cmocka_unit_test(test_padding_free_sdpa),  cmocka_unit_test(test_packed_flash_no_mask),
        cmocka_unit_test(test_not_causal_refused), cmocka_unit_test(test_learned_positions_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
