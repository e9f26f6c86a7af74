/* test_fold.c — a fit evaluated through folds (fold.h: a long run of identical blocks counted
 * through four of them) gives what the replay of the whole model gives: the same verdict,
 * peak (allocated and requested), peak event, activations at the loss, static figures,
 * FLOPs, plan and per-block figures, for every bundled model, plan, precision and batch
 * tried.  The expected values are the full replay's, which the rest of the suite checks
 * against PyTorch; folding must not change a byte.  No GPU.
 */
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cJSON.h>

#include "fit_job.h"
#include "estimate/fold.h"
#include "search/search.h"
#include "tier.h"

static bool close_enough(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fmax(fabs(a), fabs(b))); }

#define SAME_U64(field)                                                                            \
    do {                                                                                           \
        if (a->field != b->field)                                                                  \
            fail_msg("%s: %s: %llu folded, %llu replayed", what, #field, (unsigned long long)b->field, \
                     (unsigned long long)a->field);                                                \
    } while (0)

static void assert_same_fit(const char *what, const struct mp_fit *a, const struct mp_fit *b, bool verdict)
{
    SAME_U64(fits);
    SAME_U64(peak_device_bytes);
    SAME_U64(activation_budget);
    SAME_U64(infeasible);
    SAME_U64(static_bytes);
    SAME_U64(nockpt_activation_peak);
    SAME_U64(est.peak_allocated_bytes);
    SAME_U64(est.peak_requested_bytes);
    SAME_U64(est.activations_bytes);
    SAME_U64(est.params);
    SAME_U64(est.trainable_params);
    SAME_U64(est.weights_bytes);
    SAME_U64(est.grads_bytes);
    SAME_U64(est.optimizer_bytes);
    SAME_U64(est.optimizer_tmp_bytes);
    SAME_U64(est.input_bytes);
    SAME_U64(est.static_bytes);
    SAME_U64(est.peak_phase);
    SAME_U64(est.world); /* data parallel: what one rank holds and moves */
    SAME_U64(est.buffers_bytes);
    SAME_U64(est.host_bytes);
    SAME_U64(est.nvme_bytes);
    SAME_U64(est.n_groups);
    if (!close_enough(a->est.allgather_bytes, b->est.allgather_bytes) ||
        !close_enough(a->est.reducescatter_bytes, b->est.reducescatter_bytes) ||
        !close_enough(a->est.allreduce_bytes, b->est.allreduce_bytes) ||
        !close_enough(a->est.pcie_bytes, b->est.pcie_bytes) || !close_enough(a->est.host_step_elems, b->est.host_step_elems))
        fail_msg("%s: collective or offload traffic differs", what);
    if (!verdict) /* a verdict has no per-block figures (mp_job.verdict_only) */
        SAME_U64(est.n_blocks);
    if (strcmp(a->est.peak_event, b->est.peak_event) != 0)
        fail_msg("%s: peak at %s folded, %s replayed", what, b->est.peak_event, a->est.peak_event);
    if (!close_enough(a->est.fwd_flops, b->est.fwd_flops) || !close_enough(a->est.bwd_flops, b->est.bwd_flops) ||
        !close_enough(a->est.recompute_flops, b->est.recompute_flops) || !close_enough(a->step_s, b->step_s))
        fail_msg("%s: FLOPs or step time differ", what);
    if (a->plan.sched.n != b->plan.sched.n ||
        (a->plan.sched.n && memcmp(a->plan.sched.ops, b->plan.sched.ops, a->plan.sched.n * sizeof *a->plan.sched.ops)))
        fail_msg("%s: the plans differ", what);
    for (size_t i = 0; i < a->est.n_blocks && a->est.blocks && b->est.blocks; i++)
        if (memcmp(&a->est.blocks[i], &b->est.blocks[i], sizeof a->est.blocks[i]) != 0)
            fail_msg("%s: block %zu's figures differ", what, i);
}

/* How the model trains, besides the defaults. */
enum variant { V_PLAIN, V_LORA, V_ACCUM_ADAFACTOR, V_EAGER_SGD, V_QLORA, N_VARIANTS };

/* compare_model's combinations in the quick tier: every 7th of the 84 (7 is prime to the 2
 * verdicts, 3 batches and 2 precisions, so the quick ones still take every plan, both
 * precisions, every batch and both kinds of report); the long tier takes the others. */
#define COMBO_STRIDE 7

/* Every plan, two precisions, three batches, verdicts and full reports (state: a tier's share of
 * them, tier.h; NULL: all): returns the blocks the folded fits did not replay. */
static size_t compare_model(void **state, const struct mp_model *m, const char *name, enum variant v,
                            const struct mp_parallel *par)
{
    static const struct mp_ckpt_spec plans[] = {
        {.strategy = MP_CKPT_NONE, .k = 0},  {.strategy = MP_CKPT_SQRT, .k = 0},  {.strategy = MP_CKPT_LAYERS, .k = 0},  {.strategy = MP_CKPT_EVERY, .k = 3},
        {.strategy = MP_CKPT_SEGMENTS, .k = 4}, {.strategy = MP_CKPT_OPTIMAL, .k = 0}, {.strategy = MP_CKPT_OPTIMAL_SEGMENTS, .k = 0},
    };
    static const enum mp_precision precs[] = {MP_PREC_AMP_BF16, MP_PREC_FP32};
    static const uint64_t batches[] = {1, 3, 64};
    size_t folded = 0, combo = 0;
    for (size_t pi = 0; pi < sizeof plans / sizeof plans[0]; pi++)
        for (size_t qi = 0; qi < 2; qi++)
            for (size_t bi = 0; bi < 3; bi++)
                for (int verdict = 0; verdict < 2; verdict++) {
                    if (state && !in_tier_n(state, combo++, COMBO_STRIDE))
                        continue;
                    struct mp_job j = job_for(m, "t4");
                    j.train.skip_reserved = true; /* the allocator model is not folded: as in suggest's search */
                    j.ckpt = plans[pi];
                    j.build.precision = par && par->mixed_bf16 ? MP_PREC_BF16 : precs[qi];
                    j.train.par = par;
                    j.build.ep = par && par->ep > 1 ? par->ep : 0; /* (--ep: the program is a rank's) */
                    j.build.batch = batches[bi];
                    j.verdict_only = verdict;
                    if (v == V_LORA || v == V_QLORA)
                        j.build.ft.mode = v == V_LORA ? MP_FT_LORA : MP_FT_QLORA;
                    if (v == V_ACCUM_ADAFACTOR) {
                        j.train.accumulate = true;
                        j.train.optimizer = MP_OPT_ADAFACTOR;
                    }
                    if (v == V_EAGER_SGD) {
                        j.build.attention = MP_ATTN_EAGER;
                        j.build.attention_forced = true;
                        j.train.optimizer = MP_OPT_SGD_MOMENTUM;
                    }
                    struct mp_fit a, b;
                    struct mp_diag d = {{0}};
                    j.fold = -1;
                    enum mp_status sa = mp_fit_eval(&j, &a, &d);
                    j.fold = 1;
                    enum mp_status sb = mp_fit_eval(&j, &b, &d);
                    char what[160], sb_[32];
                    char pd[96] = "one GPU";
                    if (par)
                        mp_par_describe(par, pd, sizeof pd);
                    snprintf(what, sizeof what, "%s variant %d %s %s batch %llu%s, %s%s", name, (int)v,
                             mp_ckpt_spec_str(&plans[pi], sb_, sizeof sb_), mp_precision_str(j.build.precision),
                             (unsigned long long)batches[bi], verdict ? " (verdict)" : "", pd,
                             par && par->mixed_bf16 ? " mixed-bf16" : "");
                    if (sa != sb)
                        fail_msg("%s: status %d replayed, %d folded (%s)", what, (int)sa, (int)sb, d.msg);
                    if (sa != MP_OK)
                        continue;
                    assert_same_fit(what, &a, &b, verdict);
                    folded += b.folded_blocks;
                    mp_fit_release(&a);
                    mp_fit_release(&b);
                }
    return folded;
}

static void load_file(struct mp_model *m, const char *path)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_file(m, path, &d) != MP_OK)
        fail_msg("load %s: %s", path, d.msg);
}

/* m with `extra` more copies of its last repeated block (big's block array is its own). */
static void stretch(const struct mp_model *m, size_t extra, struct mp_model *big)
{
    size_t last = 0;
    for (size_t i = 0; i < m->n_blocks; i++)
        if (m->blocks[i].repeat_group > 0)
            last = i;
    assert_true(last > 0);
    *big = *m;
    size_t n = m->n_blocks + extra;
    big->blocks = calloc(n, sizeof *big->blocks);
    assert_non_null(big->blocks);
    memcpy(big->blocks, m->blocks, (last + 1) * sizeof *big->blocks);
    for (size_t i = last + 1; i < last + 1 + extra; i++) {
        big->blocks[i] = m->blocks[last];
        snprintf(big->blocks[i].name, sizeof big->blocks[i].name, "h.%zu", i - 1);
    }
    memcpy(big->blocks + last + 1 + extra, m->blocks + last + 1, (m->n_blocks - last - 1) * sizeof *big->blocks);
    big->n_blocks = big->cap_blocks = n;
    mp_model_mark_copies(big);
}

/* A long GPT-2 style chain and a long Llama style chain: folds that count hundreds of blocks. */
static void test_fold_long_chains_equal_their_replay(void **state)
{
    static const char *files[] = {"models/tiny-test.json", "models/gpt2-124m.json", "models/hf/llama-2-7b.json"};
    for (size_t k = 0; k < 3; k++) {
        struct mp_model m;
        load_file(&m, files[k]);
        struct mp_model big;
        stretch(&m, 60, &big);
        for (int v = 0; v < N_VARIANTS; v++) {
            if (v == V_QLORA && k == 0)
                continue; /* tiny-test has no HF family: peft's default targets are unknown */
            size_t folded = compare_model(state, &big, files[k], (enum variant)v, NULL);
            assert_true(folded > 0);
        }
        free(big.blocks);
        mp_model_release(&m);
    }
}

/* estimate and check (main.c): a model of 512 blocks or more is evaluated through folds where a
 * fit keeps only the program it had to build (mp_job.keep_built), with the reserved bytes the
 * report prints: where the whole program has few enough nodes for the caching-allocator model
 * it is replayed whole (and kept for the report), above that both give reserved = allocated.
 * Either way the report's figures are the whole replay's: tiny-test with 600 and 3,000 more
 * blocks, Llama-2 with 1,200 more layers, four plans, on one GPU and with ZeRO-3. */
static void test_fold_estimate_equals_its_replay(void **state)
{
    (void)state;
    static const struct {
        const char *file;
        size_t extra;
        uint64_t seq;
    } cases[] = {{"models/tiny-test.json", 600, 8}, {"models/tiny-test.json", 3000, 8},
                 {"models/hf/llama-2-7b.json", 1200, 64}};
    static const struct mp_ckpt_spec plans[] = {
        {.strategy = MP_CKPT_NONE, .k = 0}, {.strategy = MP_CKPT_SQRT, .k = 0}, {.strategy = MP_CKPT_EVERY, .k = 3}, {.strategy = MP_CKPT_OPTIMAL, .k = 0},
    };
    size_t folded = 0, whole = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct mp_model m, big;
        load_file(&m, cases[k].file);
        stretch(&m, cases[k].extra, &big);
        for (size_t pi = 0; pi < sizeof plans / sizeof plans[0]; pi++)
            for (int dp = 0; dp < 2; dp++) {
                struct mp_parallel par;
                mp_parallel_default(&par);
                par.strategy = MP_PAR_ZERO3;
                par.gpus = 8;
                struct mp_job j = job_for(&big, "t4");
                j.ckpt = plans[pi];
                j.build.batch = 2;
                j.build.seq = cases[k].seq;
                j.train.par = dp ? &par : NULL;
                struct mp_fit a, b;
                struct mp_diag d = {{0}};
                j.keep_program = true; /* the whole model, as estimate did */
                if (mp_fit_eval(&j, &a, &d) != MP_OK)
                    fail_msg("%s", d.msg);
                j.keep_program = false;
                j.keep_built = true; /* estimate and check now */
                if (mp_fit_eval(&j, &b, &d) != MP_OK)
                    fail_msg("%s", d.msg);
                char what[160], sb[32];
                snprintf(what, sizeof what, "%s +%zu %s%s", cases[k].file, cases[k].extra,
                         mp_ckpt_spec_str(&plans[pi], sb, sizeof sb), dp ? " zero3 x8" : "");
                assert_same_fit(what, &a, &b, false);
                if (a.est.peak_reserved_bytes != b.est.peak_reserved_bytes)
                    fail_msg("%s: reserved %llu folded, %llu replayed", what,
                             (unsigned long long)b.est.peak_reserved_bytes,
                             (unsigned long long)a.est.peak_reserved_bytes);
                if (a.prog.n_nodes <= MP_ASIM_MAX_NODES) { /* replayed whole, the program kept */
                    assert_int_equal(b.folded_blocks, 0);
                    assert_int_equal(b.prog.n_nodes, a.prog.n_nodes);
                    whole++;
                } else if (b.folded_blocks) { /* the whole program was not built */
                    assert_null(b.prog.blocks);
                    folded++;
                } else { /* a fold that did not hold (the whole program, kept), or folded nothing */
                    assert_true(!b.prog.blocks || b.prog.n_nodes == a.prog.n_nodes);
                }
                mp_fit_release(&a);
                mp_fit_release(&b);
            }
        free(big.blocks);
        mp_model_release(&m);
    }
    assert_true(folded >= 12 && whole == 8); /* both ways were taken */
}

/* Data parallelism: every engine and option the planner offers, on the long chains.  The
 * full model's buckets, partitions and groups come from the weighted short program. */
static void test_fold_data_parallel_equals_its_replay(void **state)
{
    static const char *files[] = {"models/gpt2-124m.json", "models/hf/llama-2-7b.json"};
    struct par_case {
        enum mp_par_strategy s;
        uint64_t gpus, nodes;
        enum mp_offload off;
        enum mp_offload_dev dev;
        bool mixed, bucket_view;
    } cases[] = {
        {MP_PAR_DDP, 4, 1, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, false, false},
        {MP_PAR_DDP, 8, 2, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, false, true},
        {MP_PAR_ZERO1, 8, 1, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, false, false},
        {MP_PAR_ZERO2, 8, 1, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, true, false},
        {MP_PAR_ZERO2, 8, 2, MP_OFFLOAD_OPTIMIZER, MP_OFFDEV_CPU, false, false},
        {MP_PAR_ZERO3, 8, 1, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, false, false},
        {MP_PAR_ZERO3, 8, 4, MP_OFFLOAD_OPTIMIZER, MP_OFFDEV_CPU, true, false},
        {MP_PAR_ZERO3, 8, 1, MP_OFFLOAD_PARAMS, MP_OFFDEV_NVME, false, false},
        {MP_PAR_FSDP, 8, 1, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, false, false},
        {MP_PAR_FSDP, 8, 16, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, true, false},
        {MP_PAR_FSDP, 2, 1, MP_OFFLOAD_PARAMS, MP_OFFDEV_CPU, false, false},
        {MP_PAR_FSDP_NO_RESHARD, 8, 1, MP_OFFLOAD_NONE, MP_OFFDEV_CPU, false, false},
    };
    for (size_t k = 0; k < 2; k++) {
        struct mp_model m, big;
        load_file(&m, files[k]);
        stretch(&m, 60, &big);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            struct mp_parallel par;
            mp_parallel_default(&par);
            par.strategy = cases[c].s;
            par.gpus = cases[c].gpus;
            par.nodes = cases[c].nodes;
            par.offload = cases[c].off;
            par.offload_device = cases[c].dev;
            par.mixed_bf16 = cases[c].mixed;
            par.ddp_grad_as_bucket_view = cases[c].bucket_view;
            struct mp_diag d = {{0}};
            assert_int_equal(mp_par_validate(&par, &d), MP_OK);
            /* plain and with accumulation (sharded gradients carried between micro-steps) */
            assert_true(compare_model(state, &big, files[k], c % 2 ? V_ACCUM_ADAFACTOR : V_PLAIN, &par) > 0);
        }
        free(big.blocks);
        mp_model_release(&m);
    }
}

/* --ep: an MoE model's experts units (nested in their layers', gathered and resharded at the
 * experts module, divided into a temporary on a one-rank efsdp mesh) fold as their layers do. */
static void test_fold_expert_parallel_equals_its_replay(void **state)
{
    struct mp_model m, big;
    load_file(&m, "models/hf/mixtral-8x7b.json");
    stretch(&m, 60, &big);
    static const uint64_t eps[][2] = {{8, 2}, {8, 8}, {16, 4}}; /* (world, ep): efsdp 4, 1, 4 */
    for (size_t c = 0; c < sizeof eps / sizeof eps[0]; c++) {
        struct mp_parallel par;
        mp_parallel_default(&par);
        par.strategy = MP_PAR_FSDP;
        par.gpus = eps[c][0];
        par.ep = eps[c][1];
        par.mixed_bf16 = c == 2;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_par_validate(&par, &d), MP_OK);
        assert_true(compare_model(state, &big, "mixtral-8x7b", V_PLAIN, &par) > 0);
    }
    free(big.blocks);
    mp_model_release(&m);
}

/* An HF config with `layers` decoder layers: its per-layer lists (layer_types, no_rope_layers)
 * go on as they were, from their start again. */
static void load_stretched(struct mp_model *m, const char *path, int layers)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    char buf[1 << 16];
    size_t len = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[len] = '\0';
    cJSON *root = cJSON_Parse(buf);
    assert_non_null(root);
    /* (T5: num_layers per stack, and num_decoder_layers when given) */
    const char *key = cJSON_GetObjectItem(root, "num_hidden_layers") ? "num_hidden_layers" : "num_layers";
    int old = cJSON_GetObjectItem(root, key)->valueint;
    cJSON_ReplaceItemInObject(root, key, cJSON_CreateNumber(layers));
    if (cJSON_GetObjectItem(root, "num_decoder_layers"))
        cJSON_ReplaceItemInObject(root, "num_decoder_layers", cJSON_CreateNumber(layers));
    static const char *lists[] = {"layer_types", "no_rope_layers"};
    for (size_t k = 0; k < 2; k++) {
        cJSON *a = cJSON_GetObjectItem(root, lists[k]);
        if (!a)
            continue;
        assert_int_equal(cJSON_GetArraySize(a), old);
        for (int i = old; i < layers; i++)
            cJSON_AddItemToArray(a, cJSON_Duplicate(cJSON_GetArrayItem(a, i % old), true));
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    struct mp_diag d = {{0}};
    if (mp_model_load_string(m, text, strlen(text), path, &d) != MP_OK)
        fail_msg("load %s x%d: %s", path, layers, d.msg);
    free(text);
}

/* Layers that alternate (fold.h: units of a period): gemma-2's sliding and global layers in
 * turn, gemma-3's five sliding and a global one, OLMo-3's three sliding and a full one,
 * SmolLM3's rotary on three layers of four, each with 60 layers (gemma-3: 62). */
static void test_fold_alternating_layers_equal_their_replay(void **state)
{
    static const struct {
        const char *path;
        int layers;
        unsigned period;
    } models[] = {
        {"models/hf/gemma-2-2b.json", 60, 2},
        {"models/hf/gemma-3-1b.json", 62, 6},
        {"models/hf/olmo-3-7b.json", 60, 4},
        {"models/hf/smollm3-3b.json", 60, 4},
    };
    for (size_t k = 0; k < sizeof models / sizeof models[0]; k++) {
        struct mp_model m;
        load_stretched(&m, models[k].path, models[k].layers);
        assert_int_equal(m.blocks[m.n_blocks - 2].period, models[k].period);
        for (int v = 0; v < N_VARIANTS; v++) {
            char what[300];
            snprintf(what, sizeof what, "%s x%d", models[k].path, models[k].layers);
            size_t folded = compare_model(state, &m, what, (enum variant)v, NULL);
            assert_true(folded > 0);
        }
        /* and data parallel: a weighted unit's FSDP2 / ZeRO-3 groups and DDP buckets */
        static const enum mp_par_strategy engines[] = {MP_PAR_DDP, MP_PAR_ZERO3, MP_PAR_FSDP};
        for (size_t e = 0; k < 2 && e < 3; e++) {
            struct mp_parallel par;
            mp_parallel_default(&par);
            par.strategy = engines[e];
            par.gpus = 8;
            char what[300];
            snprintf(what, sizeof what, "%s x%d", models[k].path, models[k].layers);
            assert_true(compare_model(state, &m, what, V_PLAIN, &par) > 0);
        }
        mp_model_release(&m);
    }
    /* runs of periods that overlap: blocks 1-9 a b a b a b a b a (period 2), then (c a b) x 20
     * (period 3, whose first unit takes blocks of the period-2 run's last units; the greedy
     * marks 11-12 period 4 on the way) */
#define TB(ffn) "{\"type\": \"transformer_block\", \"dim\": 16, \"heads\": 2, \"ffn\": " #ffn ", \"norm\": \"layernorm\"}"
    const char *json = "{\"name\": \"runs\", \"input\": {\"tokens\": 8}, \"layers\": ["
                       "{\"block\": \"embed\", \"layers\": [{\"type\": \"embedding\", \"vocab\": 64, \"dim\": 16}]},"
                       "{\"repeat\": 4, \"name\": \"p\", \"layers\": [" TB(32) "," TB(48) "]},"
                       "{\"repeat\": 1, \"name\": \"q\", \"layers\": [" TB(32) "]},"
                       "{\"repeat\": 20, \"name\": \"h\", \"layers\": [" TB(64) "," TB(32) "," TB(48) "]},"
                       "{\"block\": \"head\", \"layers\": [{\"type\": \"layernorm\", \"dim\": 16},"
                       "{\"type\": \"lm_head\", \"tied\": true}]}]}";
#undef TB
    struct mp_model m;
    struct mp_diag d = {{0}};
    if (mp_model_load_string(&m, json, strlen(json), "runs.json", &d) != MP_OK)
        fail_msg("%s", d.msg);
    assert_int_equal(m.n_blocks, 71);
    static const unsigned per[] = {0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 0, 4, 4, 3};
    for (size_t i = 0; i < m.n_blocks - 1; i++)
        assert_int_equal(m.blocks[i].period, i < 13 ? per[i] : 3);
    for (int v = 0; v < N_VARIANTS; v++)
        if (v != V_QLORA) /* no HF family: peft's default targets are unknown */
            assert_true(compare_model(state, &m, "runs.json", (enum variant)v, NULL) > 0);
    mp_model_release(&m);
}

/* Encoder-decoders: T5's stacks hand tensors to all their blocks (p->held: the encoder's output
 * to every decoder block's cross-attention, each stack's position bias made in its first block),
 * held across the folded blocks as across the replayed ones.  Each T5 family with 30 layers per
 * stack, every variant, and the data-parallel engines (t5-small). */
static void test_fold_encoder_decoder_equals_its_replay(void **state)
{
    static const char *files[] = {"models/hf/t5-small.json", "models/hf/flan-t5-base.json",
                                  "models/hf/mt5-small.json", "models/hf/umt5-small.json"};
    for (size_t k = 0; k < 4; k++) {
        struct mp_model m;
        load_stretched(&m, files[k], 30);
        assert_true(m.enc_dec);
        for (int v = 0; v < N_VARIANTS; v++)
        {
            size_t folded = compare_model(state, &m, files[k], (enum variant)v, NULL);
            /* QLoRA does not fold: its whole model is replayed (umt5, every layer with its own
             * relative attention bias, folds: each layer leaves the builder as it found it) */
            if (v != V_QLORA)
                assert_true(folded > 0);
        }
        static const enum mp_par_strategy engines[] = {MP_PAR_DDP, MP_PAR_ZERO3, MP_PAR_FSDP};
        for (size_t e = 0; k == 0 && e < 3; e++) {
            struct mp_parallel par;
            mp_parallel_default(&par);
            par.strategy = engines[e];
            par.gpus = 8;
            assert_true(compare_model(state, &m, files[k], V_PLAIN, &par) > 0);
        }
        mp_model_release(&m);
    }
}

/* Every bundled model, as it is. */
static void test_fold_bundled_models_equal_their_replay(void **state)
{
    static const char *dirs[] = {"models", "models/hf"};
    size_t folded = 0, models = 0;
    for (size_t di = 0; di < 2; di++) {
        DIR *dir = opendir(dirs[di]);
        assert_non_null(dir);
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) {
            size_t len = strlen(e->d_name);
            if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0)
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dirs[di], e->d_name);
            struct mp_model m;
            load_file(&m, path);
            size_t f = compare_model(state, &m, path, V_PLAIN, NULL);
            /* layers that make tensors of their own for no other layer fold too: GPT-J's sinusoid
             * tables (one tensor, sized for every layer by the first), the interleaved rotary's
             * cos/sin pair per layer (ERNIE 4.5, GLM-4-0414) */
            if (strstr(path, "gpt-j-6b") || strstr(path, "ernie-4.5") || strstr(path, "glm-4-9b-0414"))
                if (f == 0)
                    fail_msg("%s: nothing folded", path);
            folded += f;
            models++;
            mp_model_release(&m);
        }
        closedir(dir);
    }
    assert_true(models > 40);
    assert_true(folded > 0);
}

/* Folds of folds (fold.h, mp_fold_make_nested): sqrt's segments (S blocks) over a long run of
 * period p repeat every lcm(S, p) blocks; those super-units are folded, and the segments inside
 * them.  GPT-2 with 1,000 more blocks (p 1: S 31), gemma-3 (p 6: S 34, super-units of 102) and
 * SmolLM3 (p 4: 68) with 1,200 layers: the nested fold is the one a sqrt fit uses, and it holds
 * (fewer short blocks than one fold, all of the full model's other blocks counted); every plan's
 * fit through folds equals the whole replay. */
static void test_fold_nested_equals_its_replay(void **state)
{
    for (int k = 0; k < 3; k++) {
        struct mp_model m, base;
        if (k == 0) {
            load_file(&base, "models/gpt2-124m.json");
            stretch(&base, 1000, &m);
        } else {
            load_stretched(&m, k == 1 ? "models/hf/gemma-3-1b.json" : "models/hf/smollm3-3b.json", 1200);
        }
        const char *what = k == 0 ? "gpt2-124m +1000" : k == 1 ? "gemma-3-1b x1200" : "smollm3-3b x1200";
        struct mp_job j = job_for(&m, "t4");
        j.train.skip_reserved = true;
        j.ckpt = (struct mp_ckpt_spec){.strategy = MP_CKPT_SQRT, .k = 0};
        j.fold = 1;
        struct mp_fit fit;
        struct mp_diag d = {{0}};
        assert_int_equal(mp_fit_eval(&j, &fit, &d), MP_OK);
        struct mp_fold one, two;
        assert_int_equal(mp_fold_make(&m, &fit.plan.sched, &one, &d), MP_OK);
        assert_int_equal(mp_fold_make_nested(&m, &fit.plan.sched, &two, &d), MP_OK);
        if (mp_fold_levels(&two) != 2 || 2 * two.n > one.n)
            fail_msg("%s: a nested fold of %zu short blocks, one fold %zu", what, two.n, one.n);
        if (fit.folded_blocks != m.n_blocks - two.n)
            fail_msg("%s: the sqrt fit replayed %zu of %zu blocks, not the nested fold's %zu", what,
                     m.n_blocks - fit.folded_blocks, m.n_blocks, two.n);
        mp_fold_release(&one);
        mp_fold_release(&two);
        mp_fit_release(&fit);
        /* the comparisons: GPT-2's shared by the tiers, gemma-3's and SmolLM3's (slow) long */
        void **share = k == 0 ? state : NULL;
        if (k == 0 || !tier_quick(state)) {
            assert_true(compare_model(share, &m, what, V_PLAIN, NULL) > 0);
            assert_true(compare_model(share, &m, what, k == 0 ? V_ACCUM_ADAFACTOR : V_LORA, NULL) > 0);
        }
        if (k == 0) {
            free(m.blocks);
            mp_model_release(&base);
        } else {
            mp_model_release(&m);
        }
    }
}

/* On a long model the optimal plan is never worse than sqrt's (search.c sqrt_floor, ckpt.c): at
 * the batch where sqrt's plan fits tiny-test x100,000 on a T4 (5,912 in amp-fp16 with the step's
 * two cuBLAS workspaces; 5,917 with one), the optimal one fits too and recomputes no more.  Its DP
 * on 64 groups alone fitted only 1,766. */
static void test_long_model_optimal_never_worse_than_sqrt(void **state)
{
    (void)state;
    struct mp_model m, big;
    load_file(&m, "models/tiny-test.json");
    stretch(&m, 99998, &big);
    struct mp_job j = job_for(&big, "t4");
    j.build.precision = MP_PREC_AMP_FP16;
    j.verdict_only = true;
    struct mp_fit fs, fo;
    struct mp_diag d = {{0}};
    for (uint64_t b = 5912; b <= 5913; b++) {
        j.build.batch = b;
        j.ckpt = (struct mp_ckpt_spec){.strategy = MP_CKPT_SQRT, .k = 0};
        assert_int_equal(mp_fit_eval(&j, &fs, &d), MP_OK);
        j.ckpt = (struct mp_ckpt_spec){.strategy = MP_CKPT_OPTIMAL, .k = 0};
        assert_int_equal(mp_fit_eval(&j, &fo, &d), MP_OK);
        if (b == 5912)
            assert_true(fs.fits); /* (the largest batch sqrt's plan fits) */
        if (fs.fits) {
            assert_true(fo.fits);
            assert_true(fo.est.recompute_flops <= fs.est.recompute_flops);
        }
        mp_fit_release(&fs);
        mp_fit_release(&fo);
    }
    free(big.blocks);
    mp_model_release(&m);
}

/* --checkpoint layers:N on Llama 3.2 Vision (text-only): transformers 5.24's every_n_layers counts
 * the skipped cross-attention layers (GradientCheckpointingLayers too), so the self-attention
 * layers it checkpoints are those at an index i % N == 0 of text_config's 40.  Expected lists:
 * MllamaForConditionalGeneration on the meta device, activation_checkpointing_enable(
 * every_n_layers=N), the self-attention layers whose gradient_checkpointing is set.  The folded
 * fit equals the replayed one. */
static void test_fold_mllama_every_n_layers(void **state)
{
    (void)state;
    static const struct {
        uint64_t n;
        int layers[17];
    } cases[] = {{2, {0, 2, 4, 6, 10, 12, 14, 16, 20, 22, 24, 26, 30, 32, 34, 36, -1}},
                 {3, {0, 6, 9, 12, 15, 21, 24, 27, 30, 36, 39, -1}}};
    struct mp_model m;
    load_file(&m, "models/hf/llama-3.2-11b-vision.json");
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct mp_job j = job_for(&m, "t4");
        j.train.skip_reserved = true;
        j.ckpt = (struct mp_ckpt_spec){.strategy = MP_CKPT_LAYERS, .k = cases[k].n};
        j.build.seq = 512;
        struct mp_fit a, b;
        struct mp_diag d = {{0}};
        j.fold = -1;
        assert_int_equal(mp_fit_eval(&j, &a, &d), MP_OK);
        j.fold = 1;
        assert_int_equal(mp_fit_eval(&j, &b, &d), MP_OK);
        assert_same_fit("llama-3.2-11b-vision layers:N", &a, &b, false);
        char got[256] = "", want[256] = "";
        for (size_t i = 0; i < a.plan.L; i++)
            if (a.plan.checkpointed[i])
                snprintf(got + strlen(got), sizeof got - strlen(got), "%s ", m.blocks[i].name);
        for (size_t i = 0; cases[k].layers[i] >= 0; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "h.%d ", cases[k].layers[i]);
        assert_string_equal(got, want);
        mp_fit_release(&a);
        mp_fit_release(&b);
    }
    mp_model_release(&m);
}

int main(void)
{
    /* tier.h: each comparison's combinations shared by the tiers (every 7th quick) */
    const struct CMUnitTest quick[] = {
        TIER_CASE_QUICK(test_fold_long_chains_equal_their_replay),
        TIER_CASE_QUICK(test_fold_alternating_layers_equal_their_replay),
        TIER_CASE_QUICK(test_fold_bundled_models_equal_their_replay),
        TIER_CASE_QUICK(test_fold_data_parallel_equals_its_replay),
        TIER_CASE_QUICK(test_fold_expert_parallel_equals_its_replay),
        cmocka_unit_test(test_fold_estimate_equals_its_replay),
        TIER_CASE_QUICK(test_fold_encoder_decoder_equals_its_replay),
        TIER_CASE_QUICK(test_fold_nested_equals_its_replay),
        cmocka_unit_test(test_long_model_optimal_never_worse_than_sqrt),
        cmocka_unit_test(test_fold_mllama_every_n_layers),
    };
    const struct CMUnitTest long_[] = {
        TIER_CASE_LONG(test_fold_long_chains_equal_their_replay),
        TIER_CASE_LONG(test_fold_alternating_layers_equal_their_replay),
        TIER_CASE_LONG(test_fold_bundled_models_equal_their_replay),
        TIER_CASE_LONG(test_fold_data_parallel_equals_its_replay),
        TIER_CASE_LONG(test_fold_expert_parallel_equals_its_replay),
        TIER_CASE_LONG(test_fold_encoder_decoder_equals_its_replay),
        TIER_CASE_LONG(test_fold_nested_equals_its_replay),
    };
    return run_tiers(quick, long_);
}
