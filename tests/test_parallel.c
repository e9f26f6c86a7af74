/* test_parallel.c — per-rank sharding arithmetic (parallel.c) and the per-rank replay.
 *
 * Expected values are worked by hand from the engines' sources (docs/memory-facts.md#ddp,
 * docs/memory-facts.md#fsdp2, docs/memory-facts.md#zero):
 * FSDP2 pads dim 0 to ceil(dim0/world) rows; ZeRO-3 partitions ceil(numel/world) per
 * parameter and keeps parameters under stage3_param_persistence_threshold whole; ZeRO-1/2
 * pad the flat parameter buffer to a multiple of 2 x world; DDP buckets fill in reverse
 * parameter order with a first cap of 1 MiB.
 *
 * The model: linear(16->30, bias) | 2 x linear(30->30, bias) (a repeat: two FSDP2 groups)
 * | classifier(30->4, bias).  Parameters: W1 30x16 = 480, b1 30, W 30x30 = 900 and b 30
 * (twice), Wc 4x30 = 120, bc 4: 2494 in all.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "estimate/estimate.h"
#include "ir/layers.h"
#include "model/model.h"
#include "estimate/parallel.h"

static const char *MODEL = "{\"name\":\"par\",\"input\":{\"shape\":[16]},\"classes\":4,\"layers\":["
                           "{\"type\":\"linear\",\"in_features\":16,\"out_features\":30,\"bias\":true},"
                           "{\"repeat\":2,\"layers\":[{\"type\":\"linear\",\"in_features\":30,\"out_features\":30,"
                           "\"bias\":true}]},"
                           "{\"type\":\"classifier\",\"in_features\":30,\"classes\":4}]}";

struct fixture {
    struct mp_model m;
    struct mp_program p;
};

static void build(struct fixture *f, enum mp_precision prec)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_string(&f->m, MODEL, strlen(MODEL), "test.json", &d) != MP_OK)
        fail_msg("load: %s", d.msg);
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 2;
    bo.precision = prec;
    if (mp_program_build(&f->m, &bo, &f->p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
}

static void release(struct fixture *f)
{
    mp_program_release(&f->p);
    mp_model_release(&f->m);
}

static void plan(const struct fixture *f, enum mp_par_strategy s, uint64_t world, bool mixed, enum mp_offload off,
                 struct mp_par_plan *pp)
{
    struct mp_parallel par;
    mp_parallel_default(&par);
    par.strategy = s;
    par.gpus = world;
    par.mixed_bf16 = mixed;
    par.offload = off;
    struct mp_diag d = {{0}};
    if (mp_par_plan_make(&par, &f->p, MP_OPT_ADAMW, pp, &d) != MP_OK)
        fail_msg("plan: %s", d.msg);
}

static void test_parallel_shard_sizes(void **state)
{
    (void)state;
    /* FSDP2: a 30x16 weight on 4 ranks keeps ceil(30/4) = 8 rows of 16 */
    struct mp_param w = {.elems = 480, .rows = 30, .cols = 16, .matrix = true};
    assert_int_equal(mp_par_fsdp_shard_elems(&w, 4), 128);
    /* a 30-vector (rows 1): 8 elements; 7 ranks: ceil(30/7) = 5 */
    struct mp_param b = {.elems = 30, .rows = 1, .cols = 30};
    assert_int_equal(mp_par_fsdp_shard_elems(&b, 4), 8);
    assert_int_equal(mp_par_fsdp_shard_elems(&b, 7), 5);
    /* more ranks than rows: every rank still holds one padded row */
    struct mp_param c = {.elems = 120, .rows = 4, .cols = 30, .matrix = true};
    assert_int_equal(mp_par_fsdp_shard_elems(&c, 8), 30);
    /* ZeRO-3: ceil(numel / world) */
    assert_int_equal(mp_par_zero3_shard_elems(1001, 4), 251);
    /* ZeRO-1/2: 1001 padded to a multiple of 8 = 1008, 252 per rank */
    assert_int_equal(mp_par_zero12_partition_elems(1001, 4), 252);
    assert_int_equal(mp_par_zero12_partition_elems(2494, 4), 624);
}

static void test_parallel_fsdp_plan(void **state)
{
    (void)state;
    struct fixture f;
    build(&f, MP_PREC_FP32);
    struct mp_par_plan pp;
    plan(&f, MP_PAR_FSDP, 4, false, MP_OFFLOAD_NONE, &pp);
    /* shards: W1 8x16 = 128, b1 8, per repeated block W 8x30 = 240 + b 8, Wc 1x30 = 30, bc 1
     * -> 128 + 8 + 2 x 248 + 31 = 663 elements, fp32 */
    assert_int_equal(pp.weights_bytes, 663 * 4);
    assert_int_equal(pp.grads_bytes, 663 * 4);
    assert_int_equal(pp.optimizer_bytes, 2 * 663 * 4);
    /* groups: the two repeated blocks, then the root (linear + classifier) */
    assert_int_equal(pp.n_groups, 3);
    assert_int_equal(pp.groups[0].unsharded_elems, 248 * 4);
    assert_int_equal(pp.groups[1].unsharded_elems, 248 * 4);
    assert_true(pp.groups[2].root);
    assert_int_equal(pp.groups[2].unsharded_elems, (128 + 8 + 30 + 1) * 4);
    /* all-gathers: every group in forward, the two non-root groups again in backward */
    assert_true(pp.allgather_bytes == (double)((2 * 992 + 668) + 2 * 992) * 4);
    assert_true(pp.reducescatter_bytes == (double)(2 * 992 + 668) * 4);
    mp_par_plan_release(&pp);
    release(&f);
}

static void test_parallel_ddp_buckets(void **state)
{
    (void)state;
    struct fixture f;
    build(&f, MP_PREC_FP32);
    struct mp_par_plan pp;
    plan(&f, MP_PAR_DDP, 2, false, MP_OFFLOAD_NONE, &pp);
    /* 2494 fp32 gradients = 9976 bytes: under the 1 MiB first bucket, so one bucket */
    assert_int_equal(pp.n_buckets, 1);
    assert_int_equal(pp.bucket_bytes[0], 9976);
    assert_int_equal(pp.weights_bytes, 9976);
    assert_int_equal(pp.buffers_bytes, 9976);
    /* a 4 KiB first cap and 8 KiB cap: reverse order bc 16 + Wc 480 + b 120 + W 3600 = 4216
     * closes the first bucket; b 120 + W 3600 + b1 120 + W1 1920 = 5760 is the rest */
    mp_par_plan_release(&pp);
    struct mp_parallel par;
    mp_parallel_default(&par);
    par.strategy = MP_PAR_DDP;
    par.gpus = 2;
    par.ddp_first_bucket_bytes = 4096;
    par.ddp_bucket_cap_bytes = 8192;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_par_plan_make(&par, &f.p, MP_OPT_ADAMW, &pp, &d), MP_OK);
    assert_int_equal(pp.n_buckets, 2);
    assert_int_equal(pp.bucket_bytes[0], 4216);
    assert_int_equal(pp.bucket_bytes[1], 5760);
    mp_par_plan_release(&pp);
    release(&f);
}

static void test_parallel_zero_model_states(void **state)
{
    (void)state;
    struct fixture f;
    build(&f, MP_PREC_AMP_BF16);
    struct mp_par_plan pp;
    /* ZeRO-2, fp32 parameters under autocast, 4 ranks: partition 624; parameters 4 x 2494,
     * the fp32 clone of the partition, grads_in_partition, Adam m and v: DeepSpeed's own
     * 4 Psi + 16 Psi / N (on the padded partition) */
    plan(&f, MP_PAR_ZERO2, 4, false, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.weights_bytes, 9976 + 624 * 4);
    assert_int_equal(pp.grads_bytes, 624 * 4);
    assert_int_equal(pp.optimizer_bytes, 2 * 624 * 4);
    assert_int_equal(pp.weights_bytes + pp.grads_bytes + pp.optimizer_bytes, 9976 + 16 * 624);
    mp_par_plan_release(&pp);
    /* ZeRO-1: full gradients */
    plan(&f, MP_PAR_ZERO1, 4, false, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.grads_bytes, 9976);
    mp_par_plan_release(&pp);
    /* with optimizer offload the fp32 partition, the state and the fp32 grads go to the host */
    plan(&f, MP_PAR_ZERO2, 4, false, MP_OFFLOAD_OPTIMIZER, &pp);
    assert_int_equal(pp.weights_bytes, 9976);
    assert_int_equal(pp.optimizer_bytes, 0);
    assert_int_equal(pp.host_bytes, 624 * 4 + 2 * 624 * 4 + 624 * 4);
    assert_true(pp.pcie_bytes == 2.0 * 624 * 4);
    mp_par_plan_release(&pp);
    release(&f);

    /* ZeRO-3 with bf16 parameters (mixed-bf16), 4 ranks.  Persistence threshold 10 x hidden
     * (hidden 16: the first matrix's width) = 160: the biases (30 x 3, 4) and Wc (120) stay
     * whole: 214 elements.  Partitions ceil(n/4): W1 120, b1 8, W 225 x 2, b 8 x 2, Wc 30,
     * bc 1 = 625, of which 55 belong to the persisted ones. */
    build(&f, MP_PREC_BF16);
    plan(&f, MP_PAR_ZERO3, 4, true, MP_OFFLOAD_NONE, &pp);
    /* bf16: persisted 214 x 2 + the other partitions 570 x 2, + the fp32 master 625 x 4 */
    assert_int_equal(pp.weights_bytes, 214 * 2 + 570 * 2 + 625 * 4);
    /* grad_partitions_flat_buffer in the model's dtype, bf16 (deepspeed 0.19.8 engine.py:1799-1810
     * get_data_types with data_types.grad_accum_dtype unset; stage3.py:791-795) */
    assert_int_equal(pp.grads_bytes, 625 * 2);
    assert_int_equal(pp.optimizer_bytes, 2 * 625 * 4);
    mp_par_plan_release(&pp);
    release(&f);
}

/* Sums events of one replay by store, to check per-rank setup bytes and balance. */
struct tally {
    int64_t by_store[16];
    uint64_t comm_allocs;
};
static enum mp_status tally_event(void *ctx, const struct mp_event *ev)
{
    struct tally *t = ctx;
    if (ev->kind == MP_EV_ALLOC)
        t->by_store[ev->store] += (int64_t)ev->bytes;
    else if (ev->kind == MP_EV_FREE)
        t->by_store[ev->store] -= (int64_t)ev->bytes;
    if (ev->kind == MP_EV_ALLOC && ev->store == MP_ST_COMM)
        t->comm_allocs++;
    return MP_OK;
}

static void test_parallel_replay_per_rank(void **state)
{
    (void)state;
    struct fixture f;
    build(&f, MP_PREC_FP32);
    struct mp_parallel par;
    mp_parallel_default(&par);
    par.strategy = MP_PAR_FSDP;
    par.gpus = 4;
    struct mp_train_opts t = {.optimizer = MP_OPT_ADAMW, .par = &par};
    struct tally ty = {0};
    struct mp_diag d = {{0}};
    assert_int_equal(mp_replay(&f.p, NULL, &t, tally_event, &ty, &d), MP_OK);
    /* what stays at the end of the step: the fp32 shards and their Adam state; every
     * gather buffer, reduce-scatter buffer and sharded gradient was freed */
    assert_int_equal(ty.by_store[MP_ST_PARAM], 663 * 4);
    assert_int_equal(ty.by_store[MP_ST_OPT_STATE], 2 * 663 * 4);
    assert_int_equal(ty.by_store[MP_ST_COMM], 0);
    assert_int_equal(ty.by_store[MP_ST_PGRAD], 0);
    /* forward: 3 all-gathers + 3 unshards; backward: 2 all-gathers + 2 unshards, 3
     * reduce-scatter inputs and outputs */
    assert_int_equal(ty.comm_allocs, 3 + 3 + 2 + 2 + 3 + 3);

    /* the estimator: per-rank figures, and sharding lowers the peak */
    struct mp_estimate e1, e4;
    struct mp_train_opts t1 = {.optimizer = MP_OPT_ADAMW};
    assert_int_equal(mp_estimate_run(&f.p, NULL, &t1, 0, &e1, &d), MP_OK);
    assert_int_equal(mp_estimate_run(&f.p, NULL, &t, 0, &e4, &d), MP_OK);
    assert_int_equal(e4.world, 4);
    assert_int_equal(e4.weights_bytes, 663 * 4);
    assert_true(e4.peak_allocated_bytes < e1.peak_allocated_bytes);
    mp_estimate_release(&e1);
    mp_estimate_release(&e4);

    /* DDP: the buckets are one persistent copy of the gradients */
    par.strategy = MP_PAR_DDP;
    struct tally td = {0};
    assert_int_equal(mp_replay(&f.p, NULL, &t, tally_event, &td, &d), MP_OK);
    assert_int_equal(td.by_store[MP_ST_COMM], 9976);
    /* gradient_as_bucket_view: each fresh .grad is dropped for its bucket view after the
     * parameter's backward, so at the optimizer step (the peak) the 9976 gradient bytes held
     * besides the buckets are gone */
    struct mp_estimate ev, ec;
    assert_int_equal(mp_estimate_run(&f.p, NULL, &t, 0, &ec, &d), MP_OK);
    par.ddp_grad_as_bucket_view = true;
    assert_int_equal(mp_estimate_run(&f.p, NULL, &t, 0, &ev, &d), MP_OK);
    assert_int_equal(ec.peak_phase, MP_PH_STEP);
    assert_int_equal(ec.peak_requested_bytes - ev.peak_requested_bytes, 9976);
    assert_int_equal(ev.grads_bytes, 0);
    mp_estimate_release(&ev);
    mp_estimate_release(&ec);
    release(&f);
}

static void test_parallel_validate(void **state)
{
    (void)state;
    struct mp_parallel p;
    struct mp_diag d = {{0}};
    mp_parallel_default(&p);
    assert_int_equal(mp_par_validate(&p, &d), MP_OK);
    p.gpus = 8;
    assert_int_equal(mp_par_validate(&p, &d), MP_ERR_USAGE); /* 8 GPUs, no strategy */
    p.strategy = MP_PAR_ZERO2;
    p.offload = MP_OFFLOAD_PARAMS;
    assert_int_equal(mp_par_validate(&p, &d), MP_ERR_USAGE); /* params offload needs zero3 */
    p.strategy = MP_PAR_ZERO3;
    assert_int_equal(mp_par_validate(&p, &d), MP_OK);
    p.strategy = MP_PAR_FSDP;
    p.offload = MP_OFFLOAD_OPTIMIZER;
    assert_int_equal(mp_par_validate(&p, &d), MP_ERR_USAGE); /* FSDP2 offloads everything */
    p.offload = MP_OFFLOAD_NONE;
    p.strategy = MP_PAR_DDP;
    p.mixed_bf16 = true;
    assert_int_equal(mp_par_validate(&p, &d), MP_ERR_USAGE);
    assert_int_equal(mp_par_strategy_parse("fsdp-no-reshard"), MP_PAR_FSDP_NO_RESHARD);
    assert_int_equal(mp_par_strategy_parse("zero4"), -1);
}

/* LoRA across ranks on a tiny Llama (HF config): hidden 64, 2 layers, 4 heads of 16, 2 kv heads
 * (k/v 32 wide), MLP 128, vocab 100, untied head; peft r 4 on q_proj and v_proj.
 * Base: embed 100x64 = 6400; per layer q 4096 + k 2048 + v 2048 + o 4096 + gate/up/down 3 x 8192
 * + 2 norms 128 = 36992, twice 73984; final norm 64; lm_head 6400: 86848 elements, fp32.
 * Adapters per layer: q A 4x64 + B 64x4 = 512, v A 4x64 + B 32x4 = 384: 896, twice 1792. */
static const char *LLAMA = "{\"model_type\":\"llama\",\"architectures\":[\"LlamaForCausalLM\"],"
                           "\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                           "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":100,"
                           "\"max_position_embeddings\":64,\"tie_word_embeddings\":false,\"hidden_act\":\"silu\"}";

/* The Llama config cfg, mode full, lora or qlora (storage: bnb_4bit_quant_storage, -1 auto). */
static void build_llama(struct fixture *f, const char *cfg, enum mp_precision prec, enum mp_adapter_cast cast,
                        enum mp_ft_mode mode, int storage)
{
    struct mp_diag d = {{0}};
    if (mp_model_load_string(&f->m, cfg, strlen(cfg), "llama.json", &d) != MP_OK)
        fail_msg("load: %s", d.msg);
    struct mp_build_opts bo;
    mp_build_opts_default(&bo);
    bo.batch = 1;
    bo.seq = 16;
    bo.precision = prec;
    bo.ft.mode = mode;
    bo.ft.r = 4;
    bo.ft.alpha = 8;
    bo.ft.adapters_cast = cast;
    bo.ft.quant.storage = storage;
    if ((mode != MP_FT_FULL && mp_finetune_parse_targets(&bo.ft, "q_proj,v_proj", &d) != MP_OK) ||
        mp_program_build(&f->m, &bo, &f->p, &d) != MP_OK)
        fail_msg("build: %s", d.msg);
}

static void build_lora(struct fixture *f, enum mp_precision prec, enum mp_adapter_cast cast)
{
    build_llama(f, LLAMA, prec, cast, MP_FT_LORA, -1);
}

static void test_parallel_lora_ddp(void **state)
{
    (void)state;
    struct fixture f;
    build_lora(&f, MP_PREC_FP32, MP_AC_NONE);
    struct mp_par_plan pp;
    plan(&f, MP_PAR_DDP, 2, false, MP_OFFLOAD_NONE, &pp);
    /* only the 1792 adapter gradients (fp32: 7168 bytes) are the reducer's: one bucket under the
     * 1 MiB first cap; the frozen base (86848 x 4 = 347392 bytes) is replicated */
    assert_int_equal(pp.n_buckets, 1);
    assert_int_equal(pp.bucket_bytes[0], 7168);
    assert_int_equal(pp.buffers_bytes, 7168);
    assert_int_equal(pp.grads_bytes, 7168);
    assert_int_equal((uint64_t)pp.allreduce_bytes, 7168);
    assert_int_equal(pp.weights_bytes, 347392 + 7168);
    assert_int_equal(pp.optimizer_bytes, 2 * 7168); /* AdamW: exp_avg, exp_avg_sq of the adapters */
    mp_par_plan_release(&pp);
    /* ZeRO-1/2 flatten only the optimizer's (trainable) parameters: 1792 elements, a multiple of
     * 2 x 2, so 896 per rank; the module keeps its frozen base (347392 + 7168 bytes) plus the
     * fp32 partition 896 x 4; AdamW's state on the partition 2 x 896 x 4 */
    plan(&f, MP_PAR_ZERO2, 2, false, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.total_elems, 1792);
    assert_int_equal(pp.partition_elems, 896);
    assert_int_equal(pp.weights_bytes, 347392 + 7168 + 896 * 4);
    assert_int_equal(pp.grads_bytes, 896 * 4); /* grads_in_partition */
    assert_int_equal(pp.optimizer_bytes, 2 * 896 * 4);
    mp_par_plan_release(&pp);
    plan(&f, MP_PAR_ZERO1, 2, false, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.grads_bytes, 1792 * 4); /* stage 1: the adapters' full gradients */
    mp_par_plan_release(&pp);
    /* ZeRO-3 partitions every parameter (zero.Init: the frozen base too), ceil(n / 2) each, and
     * keeps those under stage3_param_persistence_threshold (10 x hidden = 640) whole: the 5 norms
     * (320) and every adapter matrix (1792); the optimizer's gradient partition (the model's
     * dtype, fp32 here; and, fp32, no separate master) only of the adapters, 896 a rank (deepspeed 0.19.8 stage3.py
     * _get_trainable_parameter_groups, grad_partitions_flat_buffer):
     * (320 + 1792) x 4 + ((86848 + 1792) / 2 - (160 + 896)) x 4 */
    plan(&f, MP_PAR_ZERO3, 2, false, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.weights_bytes, (320 + 1792) * 4 + ((86848 + 1792) / 2 - (160 + 896)) * 4);
    assert_int_equal(pp.grads_bytes, 896 * 4);
    assert_int_equal(pp.optimizer_bytes, 2 * 896 * 4);
    mp_par_plan_release(&pp);
    release(&f);
}

static void test_parallel_lora_fsdp(void **state)
{
    (void)state;
    struct fixture f;
    build_lora(&f, MP_PREC_FP32, MP_AC_NONE);
    struct mp_par_plan pp;
    plan(&f, MP_PAR_FSDP, 2, false, MP_OFFLOAD_NONE, &pp);
    /* every dim 0 is even: each rank keeps half of every parameter, the frozen base too:
     * (86848 + 1792) / 2 = 44320 elements, fp32 */
    assert_int_equal(pp.weights_bytes, 44320 * 4);
    /* gradients and the reduce-scatter only of the adapters: 896 shard elements, 1792 in */
    assert_int_equal(pp.grad_shard_total, 896);
    assert_int_equal(pp.grads_bytes, 896 * 4);
    assert_int_equal((uint64_t)pp.reducescatter_bytes, 1792 * 4);
    assert_int_equal(pp.optimizer_bytes, 2 * 896 * 4);
    /* accelerate's units in forward order (fsdp2_prepare_model): the embedding (6400, resharded),
     * each decoder layer, the tail [lm_head] (6400, kept after forward, reduced after the head's
     * backward), and the root: the final norm (64), which _find_final_norm cannot see through
     * peft's wrapper (getattr(PeftModel, "model") is the CausalLM: children model and lm_head) */
    assert_int_equal(pp.n_groups, 5);
    assert_int_equal(pp.root_group, 4);
    assert_int_equal(pp.groups[4].unsharded_elems, 64);
    assert_false(pp.groups[4].reshard);
    assert_int_equal(pp.group_of_block[0], 0);
    assert_int_equal(pp.groups[0].unsharded_elems, 6400);
    assert_true(pp.groups[0].reshard);
    /* a decoder layer's group: 36992 + 896 elements, half each; the adapters' 448 of them */
    assert_int_equal(pp.group_of_block[1], 1);
    assert_int_equal(pp.groups[1].shard_elems, (36992 + 896) / 2);
    assert_int_equal(pp.groups[1].grad_shard_elems, 448);
    assert_int_equal(pp.groups[1].grad_unsharded_elems, 896);
    assert_true(pp.groups[1].reshard);
    /* the tail is all frozen: no reduce-scatter */
    assert_int_equal(pp.group_of_block[3], 3);
    assert_int_equal(pp.groups[3].unsharded_elems, 6400);
    assert_false(pp.groups[3].reshard);
    assert_int_equal(pp.groups[3].first_block, 3);
    assert_int_equal(pp.groups[3].grad_unsharded_elems, 0);
    /* all-gathers: every unit in forward, the resharded ones (embedding, layers) again in
     * backward: (86848 + 1792 + 2 x 37888 + 6400) x 4 */
    assert_true(pp.allgather_bytes == (double)(86848 + 1792 + 2 * 37888 + 6400) * 4);
    mp_par_plan_release(&pp);
    /* reshard_after_forward=False: the embedding kept too */
    plan(&f, MP_PAR_FSDP_NO_RESHARD, 2, false, MP_OFFLOAD_NONE, &pp);
    assert_false(pp.groups[0].reshard);
    assert_false(pp.groups[1].reshard);
    assert_true(pp.allgather_bytes == (double)(86848 + 1792) * 4);
    mp_par_plan_release(&pp);
    release(&f);
    /* mixed-bf16 (MixedPrecisionPolicy casts the adapters too): bf16 adapters in the program,
     * their fp32 originals the shards: (86848 x 4) / 2 + 896 x 4 */
    build_lora(&f, MP_PREC_BF16, MP_AC_FSDP2);
    for (size_t q = 0; q < f.p.n_params; q++)
        if (f.p.params[q].adapter)
            assert_int_equal(f.p.params[q].dtype, MP_DT_BF16);
    plan(&f, MP_PAR_FSDP, 2, true, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.weights_bytes, 86848 * 4 / 2 + 896 * 4);
    assert_int_equal(pp.grads_bytes, 896 * 4); /* reduce_dtype fp32 */
    mp_par_plan_release(&pp);
    release(&f);
}

/* A tied table: accelerate puts the input embedding in the tail unit (final norm, embedding,
 * lm_head) so that it unshards at the embedding, first, and stays until the backward's end. */
static void test_parallel_fsdp_tied_units(void **state)
{
    (void)state;
    struct fixture f;
    char cfg[1024];
    const char *at = strstr(LLAMA, "false");
    snprintf(cfg, sizeof cfg, "%.*strue%s", (int)(at - LLAMA), LLAMA, at + 5);
    build_llama(&f, cfg, MP_PREC_FP32, MP_AC_NONE, MP_FT_FULL, -1);
    struct mp_par_plan pp;
    plan(&f, MP_PAR_FSDP, 2, false, MP_OFFLOAD_NONE, &pp);
    assert_int_equal(pp.n_groups, 3);
    assert_int_equal(pp.root_group, -1);
    assert_int_equal(pp.group_of_block[0], 0);
    assert_int_equal(pp.group_of_block[3], 0);
    assert_int_equal(pp.groups[0].unsharded_elems, 6400 + 64);
    assert_false(pp.groups[0].reshard);
    assert_int_equal(pp.groups[0].first_block, 0);
    assert_int_equal(pp.groups[0].grad_unsharded_elems, 6400 + 64);
    assert_int_equal(pp.group_of_block[2], 2);
    assert_true(pp.groups[2].reshard);
    mp_par_plan_release(&pp);
    release(&f);
}

/* FSDP-QLoRA (bnb nf4, double quant, r 4 on q/v) on the tiny Llama, 2 ranks.  q_proj 64 x 64 =
 * 4096 elements: packed (4096 + 1) / (2 x 2) = 1024 bf16 rows of one (bitsandbytes
 * quantize_4bit with quant_storage bf16), 512 a rank, 1024 bytes; its quant_state (not a
 * parameter: on every rank) is code 64 B, absmax 64 B, offset 4 B, absmax2 4 B, code2 1024 B,
 * each 512-rounded: 3072 bytes.  uint8 storage: accelerate leaves it out of FSDP2, whole: 2048 +
 * 3072 bytes.  The embedding (bf16, frozen: no fp32 copy) 100 x 64 / 2 x 2 bytes. */
static void test_parallel_fsdp_qlora(void **state)
{
    (void)state;
    for (int storage = 0; storage < 2; storage++) {
        struct fixture f;
        build_llama(&f, LLAMA, MP_PREC_BF16, MP_AC_NONE, MP_FT_QLORA, storage ? MP_DT_U8 : -1); /* -1: auto, bf16 */
        int qp = -1, emb = f.p.input_embed;
        for (size_t q = 0; q < f.p.n_params && qp < 0; q++)
            if (f.p.params[q].dtype == MP_DT_U8 && f.p.params[q].rows == 64 && f.p.params[q].cols == 64)
                qp = (int)q;
        assert_true(qp >= 0 && emb >= 0);
        struct mp_par_plan pp;
        plan(&f, MP_PAR_FSDP, 2, false, MP_OFFLOAD_NONE, &pp);
        assert_int_equal(mp_par_quant_state_bytes(&pp, &f.p.params[qp]), 3072);
        if (!storage) {
            assert_int_equal(pp.quant_storage, MP_DT_BF16);
            assert_int_equal(pp.shard_elems[qp], 512);
            assert_int_equal(mp_par_rank_param_bytes(&pp, &f.p, (size_t)qp), 512 * 2 + 3072);
            assert_int_equal(pp.group_of_param[qp], pp.group_of_block[f.p.params[qp].block]);
        } else {
            assert_true(mp_par_fsdp_ignored(&pp, &f.p.params[qp]));
            assert_int_equal(mp_par_rank_param_bytes(&pp, &f.p, (size_t)qp), 2048 + 3072);
            assert_int_equal(pp.group_of_param[qp], -1);
        }
        assert_int_equal(mp_par_rank_param_bytes(&pp, &f.p, (size_t)emb), 100 * 64 / 2 * 2);
        mp_par_plan_release(&pp);
        release(&f);
    }
}

/* Who casts peft's adapters (mp_par_adapters_cast), from the sources its comments cite: DeepSpeed
 * 0.19.8 engine.py:1859-1862 (ZeRO-1/2 under "bf16"), FSDP2's policy, TRL 1.16 (ZeRO-3 LoRA's
 * autocast_adapter_dtype=False; sft_trainer.py:905-911 on a bitsandbytes base). */
static void test_parallel_adapters_cast(void **state)
{
    (void)state;
    struct mp_parallel p = {.strategy = MP_PAR_ZERO2, .gpus = 2, .nodes = 1};
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_LORA, MP_PREC_BF16, false), MP_AC_DEEPSPEED);
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_QLORA, MP_PREC_BF16, true), MP_AC_DEEPSPEED);
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_LORA, MP_PREC_AMP_BF16, false), MP_AC_NONE); /* torch_autocast */
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_FULL, MP_PREC_BF16, false), MP_AC_NONE);
    p.strategy = MP_PAR_ZERO1;
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_LORA, MP_PREC_BF16, false), MP_AC_DEEPSPEED);
    p.strategy = MP_PAR_ZERO3;
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_LORA, MP_PREC_BF16, false), MP_AC_ZERO3_TRL);
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_QLORA, MP_PREC_BF16, false), MP_AC_NONE);
    p.strategy = MP_PAR_FSDP;
    p.mixed_bf16 = true;
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_LORA, MP_PREC_BF16, false), MP_AC_FSDP2);
    p = (struct mp_parallel){.strategy = MP_PAR_NONE, .gpus = 1, .nodes = 1};
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_QLORA, MP_PREC_AMP_BF16, true), MP_AC_TRL_QUANT);
    assert_int_equal(mp_par_adapters_cast(&p, MP_FT_QLORA, MP_PREC_AMP_BF16, false), MP_AC_NONE);
    /* which steps are TRL's (the cast): SFTTrainer's head, DPO/KTO but LLaMA-Factory's, GRPO; not ORPO */
    assert_true(mp_trainer_casts_quant_adapters(MP_TRAINER_SFT, MP_LOSS_CHUNKED_NLL, MP_FT_QLORA, MP_Q_NONE));
    assert_false(mp_trainer_casts_quant_adapters(MP_TRAINER_SFT, MP_LOSS_HF, MP_FT_QLORA, MP_Q_NONE));
    assert_true(mp_trainer_casts_quant_adapters(MP_TRAINER_DPO, MP_LOSS_CHUNKED_NLL, MP_FT_QLORA, MP_Q_NONE));
    assert_false(mp_trainer_casts_quant_adapters(MP_TRAINER_DPO, MP_LOSS_HF, MP_FT_QLORA, MP_Q_NONE));
    assert_false(mp_trainer_casts_quant_adapters(MP_TRAINER_KTO, MP_LOSS_HF, MP_FT_QLORA, MP_Q_NONE));
    assert_true(mp_trainer_casts_quant_adapters(MP_TRAINER_KTO_APO, MP_LOSS_CHUNKED_NLL, MP_FT_QLORA, MP_Q_NONE));
    assert_true(mp_trainer_casts_quant_adapters(MP_TRAINER_GRPO, MP_LOSS_HF, MP_FT_QLORA, MP_Q_NONE));
    assert_false(mp_trainer_casts_quant_adapters(MP_TRAINER_ORPO, MP_LOSS_HF, MP_FT_QLORA, MP_Q_NONE));
    /* a bitsandbytes checkpoint (is_loaded_in_8bit too) under --finetune lora; not GPTQ's, not a bf16 base */
    assert_true(mp_trainer_casts_quant_adapters(MP_TRAINER_DPO, MP_LOSS_CHUNKED_NLL, MP_FT_LORA, MP_Q_BNB_INT8));
    assert_false(mp_trainer_casts_quant_adapters(MP_TRAINER_DPO, MP_LOSS_CHUNKED_NLL, MP_FT_LORA, MP_Q_GPTQ));
    assert_false(mp_trainer_casts_quant_adapters(MP_TRAINER_SFT, MP_LOSS_CHUNKED_NLL, MP_FT_LORA, MP_Q_NONE));
    /* the program: bf16 adapters beside an fp32 base (amp-bf16) */
    struct fixture f;
    build_llama(&f, LLAMA, MP_PREC_AMP_BF16, MP_AC_TRL_QUANT, MP_FT_QLORA, -1);
    size_t n = 0;
    for (size_t q = 0; q < f.p.n_params; q++)
        if (f.p.params[q].adapter) {
            assert_int_equal(f.p.params[q].dtype, MP_DT_BF16);
            n++;
        }
    assert_true(n > 0);
    release(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_shard_sizes),      cmocka_unit_test(test_parallel_fsdp_plan),
        cmocka_unit_test(test_parallel_ddp_buckets),      cmocka_unit_test(test_parallel_zero_model_states),
        cmocka_unit_test(test_parallel_replay_per_rank),  cmocka_unit_test(test_parallel_validate),
        cmocka_unit_test(test_parallel_lora_ddp),         cmocka_unit_test(test_parallel_lora_fsdp),
        cmocka_unit_test(test_parallel_fsdp_tied_units), cmocka_unit_test(test_parallel_fsdp_qlora),
        cmocka_unit_test(test_parallel_adapters_cast),
    };
    return cmocka_run_group_tests_name("parallel", tests, NULL, NULL);
}
