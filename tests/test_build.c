/* test_build.c — the program builder's shortcuts give the program a plain build gives: a
 * program rebuilt in the memory of another (the search's scratch) and one whose repeated
 * blocks are copies of the block before them (shifted ids and names, mp_build_opts.no_copies
 * off) equal a fresh build that lowers every block, byte for byte and name for name, for
 * every bundled model and each way of training it.  Every replay and report reads only the
 * program, so equal programs give equal answers.  Sizes beyond 64 bits fail with a message,
 * never a crash.  No GPU.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ir/layers.h"
#include "model/model.h"

static void load_file(struct mp_model *m, const char *path)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_file(m, path, &d) != MP_OK)
        fail_msg("load %s: %s", path, d.msg);
}

static void build(const struct mp_model *m, uint64_t b, enum mp_precision p, struct mp_program *prog)
{
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = b;
    bo.precision = p;
    struct mp_diag d = {{0}};
    if (mp_program_build(m, &bo, prog, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
}

/* a and b are the same program: every tensor, node and parameter, names included. */
static void assert_same_program(const char *what, struct mp_program *a, struct mp_program *b)
{
    if (a->n_tensors != b->n_tensors || a->n_nodes != b->n_nodes || a->n_params != b->n_params)
        fail_msg("%s: %zu/%zu/%zu tensors/nodes/params against %zu/%zu/%zu", what, a->n_tensors, a->n_nodes,
                 a->n_params, b->n_tensors, b->n_nodes, b->n_params);
    assert_int_equal(a->n_blocks, b->n_blocks);
    for (size_t i = 0; i < a->n_tensors; i++) {
        struct mp_tensor *x = &a->tensors[i], *y = &b->tensors[i];
        if (strcmp(x->name, y->name) != 0)
            fail_msg("%s: tensor %zu is %s, not %s", what, i, y->name, x->name);
        const char *keep = x->name;
        x->name = y->name = NULL; /* the rest byte for byte (names live in the name store) */
        if (memcmp(x, y, sizeof *x) != 0)
            fail_msg("%s: tensor %zu (%s) differs", what, i, keep);
        x->name = y->name = keep;
    }
    for (size_t i = 0; i < a->n_nodes; i++) {
        struct mp_node *x = &a->nodes[i], *y = &b->nodes[i];
        if (strcmp(x->name, y->name) != 0)
            fail_msg("%s: node %zu is %s, not %s", what, i, y->name, x->name);
        const char *keep = x->name;
        x->name = y->name = NULL;
        if (memcmp(x, y, sizeof *x) != 0)
            fail_msg("%s: node %zu (%s) differs", what, i, keep);
        x->name = y->name = keep;
    }
    for (size_t i = 0; i < a->n_params; i++) {
        struct mp_param *x = &a->params[i], *y = &b->params[i];
        if (strcmp(x->name, y->name) != 0)
            fail_msg("%s: parameter %zu is %s, not %s", what, i, y->name, x->name);
        const char *keep = x->name;
        x->name = y->name = NULL;
        if (memcmp(x, y, sizeof *x) != 0)
            fail_msg("%s: parameter %zu (%s) differs", what, i, keep);
        x->name = y->name = keep;
    }
    assert_memory_equal(a->blocks, b->blocks, a->n_blocks * sizeof *a->blocks);
    assert_int_equal(a->n_subops, b->n_subops); /* eager attention's ops */
    if (a->n_subops)
        assert_memory_equal(a->subops, b->subops, a->n_subops * sizeof *a->subops);
    assert_int_equal(a->total_params, b->total_params);
    assert_int_equal(a->trainable_params, b->trainable_params);
    assert_int_equal(a->adapter_params, b->adapter_params);
    assert_int_equal(a->n_held, b->n_held);
    assert_int_equal(a->rope_tables, b->rope_tables);
    assert_int_equal(a->attn_mask, b->attn_mask);
    assert_true(a->fwd_flops == b->fwd_flops && a->bwd_flops == b->bwd_flops);
}

/* A program rebuilt in the memory of another (the search's scratch) equals one built fresh. */
static void test_build_rebuild_equals_build(void **state)
{
    (void)state;
    static const char *const models[] = {"models/gpt2-124m.json", "models/hf/llama-2-7b.json", "models/resnet50.json"};
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        struct mp_model m;
        load_file(&m, models[k]);
        struct mp_program fresh, re;
        build(&m, 4, MP_PREC_AMP_BF16, &fresh);
        build(&m, 64, MP_PREC_FP32, &re); /* more and larger slots than needed next */
        struct mp_build_opts bo;
        mp_build_opts_default(&bo);
        bo.batch = 4;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_program_rebuild(&m, &bo, &re, &d), MP_OK);
        assert_same_program(models[k], &fresh, &re);
        mp_program_release(&fresh);
        mp_program_release(&re);
        mp_model_release(&m);
    }
}

/* The ways a model is built that change what a block lowers to. */
static void set_way(struct mp_build_opts *bo, int way)
{
    struct mp_diag d = {{0}};
    switch (way) {
    case 0: break;                                     /* amp-bf16, full training */
    case 1: bo->precision = MP_PREC_FP32; break;
    case 2: bo->precision = MP_PREC_BF16; bo->batch = 3; break;
    case 3: bo->ft.mode = MP_FT_LORA; bo->ft.input_grad = true; break;
    case 4: bo->ft.mode = MP_FT_QLORA; bo->hf_checkpointing = true; break;
    case 5: /* freeze: some decoder blocks train, others not, so copies differ */
        bo->ft.mode = MP_FT_FREEZE;
        assert_int_equal(mp_finetune_parse_blocks(&bo->ft, "1-2,head", &d), MP_OK);
        break;
    case 6: bo->attention = MP_ATTN_EAGER; bo->attention_forced = true; break;
    }
}
#define N_WAYS 7

static void check_model_copies(const struct mp_model *m, const char *path, size_t *copies)
{
    for (int way = 0; way < N_WAYS; way++) {
        struct mp_build_opts bo;
        mp_build_opts_default(&bo);
        bo.batch = 2;
        set_way(&bo, way);
        struct mp_program plain, copied;
        struct mp_diag d1 = {{0}}, d2 = {{0}};
        bo.no_copies = true;
        enum mp_status s1 = mp_program_build(m, &bo, &plain, &d1);
        bo.no_copies = false;
        enum mp_status s2 = mp_program_build(m, &bo, &copied, &d2);
        if (s1 != s2 || strcmp(d1.msg, d2.msg) != 0)
            fail_msg("%s way %d: %s (%s) against %s (%s)", path, way, mp_status_str(s1), d1.msg, mp_status_str(s2),
                     d2.msg);
        if (s1 == MP_OK) {
            char what[300];
            snprintf(what, sizeof what, "%s way %d", path, way);
            assert_int_equal(plain.copied_blocks, 0);
            *copies += copied.copied_blocks;
            copied.copied_blocks = 0;
            assert_same_program(what, &plain, &copied);
            mp_program_release(&plain);
            mp_program_release(&copied);
        }
    }
}

static void check_copies(const char *path, size_t *copies)
{
    struct mp_model m;
    load_file(&m, path);
    check_model_copies(&m, path, copies);
    mp_model_release(&m);
}

/* Calls fn(path, ctx) for each .json file in dir; returns how many. */
static size_t for_each_json(const char *dir, void (*fn)(const char *path, size_t *ctx), size_t *ctx)
{
    DIR *dp = opendir(dir);
    assert_non_null(dp);
    size_t n = 0;
    for (struct dirent *e; (e = readdir(dp));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 5, ".json") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        fn(path, ctx);
        n++;
    }
    closedir(dp);
    return n;
}

static void check_dir(const char *dir, size_t *copies)
{
    assert_true(for_each_json(dir, check_copies, copies) >= 5);
}

/* Sizes beyond 64 bits: building m each way at batch b, sequence s makes the program or fails
 * with a message (MP_ERR_RANGE for the overflow; others: a sequence beyond a learned position
 * table, a way that trains nothing); a step that failed must not be read or written after it
 * (its tensor id is -1: a heap overflow under the sanitizers).  Counts the overflows. */
static void check_model_overflow(const struct mp_model *m, const char *path, uint64_t b, uint64_t s, size_t *n_range)
{
    for (int way = 0; way < N_WAYS; way++) {
        struct mp_build_opts bo;
        mp_build_opts_default(&bo);
        set_way(&bo, way);
        bo.batch = b;
        bo.seq = s;
        struct mp_program p;
        struct mp_diag d = {{0}};
        enum mp_status st = mp_program_build(m, &bo, &p, &d);
        if (st == MP_OK) {
            mp_program_release(&p);
            continue;
        }
        if (st == MP_ERR_INTERNAL || !d.msg[0] || (st == MP_ERR_RANGE && !strstr(d.msg, "overflow")))
            fail_msg("%s way %d at batch %llu, seq %llu: %s (%s)", path, way, (unsigned long long)b,
                     (unsigned long long)s, mp_status_str(st), d.msg);
        *n_range += st == MP_ERR_RANGE;
    }
}

static void check_file_overflow(const char *path, size_t *n_range)
{
    /* batch x seq x seq overflows (the attention mask), batch x seq x hidden does */
    static const uint64_t bs[][2] = {{65536, 16777216}, {16777216, 16777216}, {1048576, 1048576}};
    struct mp_model m;
    load_file(&m, path);
    for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k++)
        check_model_overflow(&m, path, bs[k][0], bs[k][1], n_range);
    mp_model_release(&m);
}

static void check_overflow_dir(const char *dir, size_t *n_range)
{
    for_each_json(dir, check_file_overflow, n_range);
}

/* Every bundled model, each way, at sizes beyond 64 bits: an error, never a crash. */
static void test_build_overflow_fails_cleanly(void **state)
{
    (void)state;
    size_t n_range = 0;
    check_overflow_dir("models", &n_range);
    check_overflow_dir("models/hf", &n_range);
    assert_true(n_range > 100);
}

/* Copies of repeated blocks equal lowering every block, for every bundled model and way. */
static void test_build_copies_equal_lowering(void **state)
{
    (void)state;
    size_t copies = 0;
    check_dir("models", &copies);
    check_dir("models/hf", &copies);
    /* the shortcut is taken: of GPT-2's 12 layers, the first is lowered, the second lowered and
     * found to be the first shifted, the other 10 copied */
    assert_true(copies > 1000);
    struct mp_model m;
    load_file(&m, "models/gpt2-124m.json");
    struct mp_program p;
    build(&m, 1, MP_PREC_AMP_BF16, &p);
    assert_int_equal(p.copied_blocks, 10);
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Layers that alternate: each block repeats the one a period before it (mp_block.period), and
 * the builder copies it from that one.  gemma-2-2b: 26 layers, sliding and global in turn
 * (transformers' Gemma2 layer_types: every second layer full attention); blocks 1 and 2 are
 * the first pair, 3 and 4 the second (lowered: the state before block 1 is not the state
 * before block 3, the rotary tables and masks are made by the first layers), 5 and 6 lowered and
 * found to be 3 and 4 shifted, then copied: blocks 7 to 26, and block 6 itself, 21 blocks. */
static void test_build_copies_by_period(void **state)
{
    (void)state;
    struct mp_model m;
    load_file(&m, "models/hf/gemma-2-2b.json");
    assert_int_equal(m.n_blocks, 28);
    for (size_t i = 0; i < m.n_blocks; i++)
        assert_int_equal(m.blocks[i].period, i >= 3 && i <= 26 ? 2 : 0);
    struct mp_program p;
    build(&m, 1, MP_PREC_AMP_BF16, &p);
    assert_int_equal(p.copied_blocks, 21);
    mp_program_release(&p);
    mp_model_release(&m);
    /* gemma-3-1b: five sliding layers and a global one (sliding_window_pattern 6): blocks 2 to
     * 5 repeat the one before, 7 to 26 the one six before; of the fourth six, all are copies */
    load_file(&m, "models/hf/gemma-3-1b.json");
    assert_int_equal(m.n_blocks, 28);
    for (size_t i = 0; i < m.n_blocks; i++)
        assert_int_equal(m.blocks[i].period, i >= 2 && i <= 5 ? 1 : i >= 7 && i <= 26 ? 6 : 0);
    build(&m, 1, MP_PREC_AMP_BF16, &p);
    for (size_t i = 19; i <= 26; i++)
        assert_true(p.copied[i]);
    mp_program_release(&p);
    mp_model_release(&m);
    /* a memplan model whose repeat holds three blocks, two alike: period 3 from block 4 on
     * (blocks 1-3, 4-6, ...: a a b), copies equal to lowering every block, every way */
    const char *json = "{\"input\": {\"shape\": [16]}, \"layers\": [{\"repeat\": 20, \"name\": \"h\", \"layers\": ["
                       "{\"block\": \"a\", \"layers\": [{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 16}]},"
                       "{\"block\": \"a2\", \"layers\": [{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 16}]},"
                       "{\"block\": \"b\", \"layers\": [{\"type\": \"linear\", \"in_features\": 16, \"out_features\": 32},"
                       "{\"type\": \"activation\", \"act\": \"gelu\"}, {\"type\": \"linear\", \"in_features\": 32, \"out_features\": 16}]}]}]}";
    struct mp_diag d = {{0}};
    if (mp_model_load_string(&m, json, strlen(json), "t.json", &d) != MP_OK)
        fail_msg("%s", d.msg);
    assert_int_equal(m.n_blocks, 60);
    assert_int_equal(m.blocks[1].period, 1);
    for (size_t i = 3; i < 60; i++)
        assert_int_equal(m.blocks[i].period, 3);
    size_t copies = 0;
    check_model_copies(&m, "t.json", &copies);
    assert_true(copies > 0);
    build(&m, 2, MP_PREC_AMP_BF16, &p);
    assert_true(p.copied_blocks >= 60 - 4 * 3); /* the first four triples lowered, at most */
    mp_program_release(&p);
    mp_model_release(&m);
}

/* Names are cut at 95 bytes.  A copy whose names could reach that (from p.9.b to p.10.b the
 * block name grows by one byte) is lowered instead, and the program is still the plain
 * build's: with a 37-byte layer name the first copies are made and block 10 is lowered; with
 * 38 bytes block 10's names are cut and nothing is copied. */
static void test_build_copies_long_names(void **state)
{
    (void)state;
    for (size_t len = 37; len <= 38; len++) {
        char json[1024], layer[48], pre[48];
        memset(layer, 'l', len);
        layer[len] = '\0';
        memset(pre, 'p', 40);
        pre[40] = '\0';
        snprintf(json, sizeof json,
                 "{\"input\": {\"shape\": [16]}, \"layers\": [{\"repeat\": 14, \"name\": \"%s\", \"layers\": ["
                 "{\"block\": \"b\", \"layers\": [{\"type\": \"linear\", \"name\": \"%s\", \"in_features\": 16,"
                 " \"out_features\": 16}]}]}]}",
                 pre, layer);
        struct mp_model m;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_model_load_string(&m, json, strlen(json), "t.json", &d), MP_OK);
        struct mp_build_opts bo;
        mp_build_opts_default(&bo);
        struct mp_program plain, copied;
        bo.no_copies = true;
        assert_int_equal(mp_program_build(&m, &bo, &plain, &d), MP_OK);
        bo.no_copies = false;
        assert_int_equal(mp_program_build(&m, &bo, &copied, &d), MP_OK);
        /* the autocast copy of block 9's weight: "<40 p>.9.b.<len l>.weight_copy" */
        int w9 = plain.nodes[plain.blocks[9].node0].wcopy, w10 = plain.nodes[plain.blocks[10].node0].wcopy;
        assert_int_equal(strlen(plain.tensors[w9].name), 57 + len);
        if (len == 37) {
            assert_int_equal(strlen(plain.tensors[w10].name), 95);
            assert_int_equal(copied.copied_blocks, 7); /* blocks 10 to 13 are lowered */
        } else {
            assert_int_equal(plain.tensors[w10].name[94], 'p'); /* "...weight_cop": cut */
            assert_int_equal(copied.copied_blocks, 0);
        }
        copied.copied_blocks = 0;
        assert_same_program("long names", &plain, &copied);
        mp_program_release(&plain);
        mp_program_release(&copied);
        mp_model_release(&m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build_rebuild_equals_build),
        cmocka_unit_test(test_build_copies_equal_lowering),
        cmocka_unit_test(test_build_copies_long_names),
        cmocka_unit_test(test_build_copies_by_period),
        cmocka_unit_test(test_build_overflow_fails_cleanly),
    };
    return cmocka_run_group_tests_name("build", tests, NULL, NULL);
}
