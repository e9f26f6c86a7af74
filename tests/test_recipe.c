/* test_recipe.c — recipes read into memplan's settings: every file of tests/data/recipes/ with each
 * setting it derives asserted (value, the key that decided it, its line, recipe or trainer default),
 * the trainers' defaults where the file is silent, and the refusals (one line naming the file, the
 * key and its line).  Expected values are read off the files and the trainers' sources cited in
 * src/recipe/recipe_keys.c, never from memplan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h> /* getpid */

#include <cmocka.h>

#include "recipe/recipe.h"

#define D "tests/data/recipes/"

static struct mp_recipe r;

static void expect_at(enum mp_recipe_setting_id id, const char *value, enum mp_recipe_src src, const char *key,
                      unsigned line, int at)
{
    const struct mp_recipe_setting *s = &r.s[id];
    if (!s->set || strcmp(s->value, value) || s->src != src || strcmp(s->key, key) || s->line != line) {
        print_error("line %d: %s: got %s'%s' from %s (line %u, src %d); want '%s' from %s (line %u, src %d)\n", at,
                    mp_recipe_setting_option(id), s->set ? "" : "(unset) ", s->value, s->key, s->line, (int)s->src,
                    value, key, line, (int)src);
        fail();
    }
}
#define expect(id, v, src, key, line) expect_at(MP_RS_##id, v, MP_RSRC_##src, key, line, __LINE__)
#define unset(id) assert_false(r.s[MP_RS_##id].set)

static void read_ok(const char *path, int format)
{
    struct mp_diag d = {{0}};
    enum mp_status st = mp_recipe_read(path, format, &r, &d);
    if (st != MP_OK)
        print_error("%s: %s\n", path, d.msg);
    assert_int_equal(st, MP_OK);
}

/* A refusal: exit-3 status, one line starting "PATH:LINE: KEY" (LINE: none for a default). */
static void read_refused(const char *path, const char *where_key, const char *why)
{
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_read(path, -1, &r, &d), MP_ERR_MODEL);
    char head[256];
    snprintf(head, sizeof head, "%s%s", path, where_key);
    if (strncmp(d.msg, head, strlen(head)) || !strstr(d.msg, why) || strchr(d.msg, '\n')) {
        print_error("got: %s\nwant: %s... %s\n", d.msg, head, why);
        fail();
    }
}

/* transformers 5.24.0 TrainingArguments(...).to_json_string(), written by transformers itself. */
static void test_hf_json(void **state)
{
    (void)state;
    read_ok(D "hf-trainingargs.json", -1);
    assert_int_equal(r.format, MP_RF_HF);
    unset(MODEL); /* TrainingArguments names no model */
    expect(BATCH, "2", KEY, "per_device_train_batch_size", 3);
    expect(GRAD_ACCUM, "8", KEY, "gradient_accumulation_steps", 17);
    unset(SEQ); /* no length in TrainingArguments: memplan's default */
    /* bf16: true and no dtype key: the model loads as from_pretrained's default "auto" */
    assert_true(r.dtype_auto);
    assert_string_equal(r.prec_auto[0], "amp-bf16"); /* a float32 checkpoint, bf16 autocast */
    /* a bfloat16 one: bf16 weights and states, and bf16=True autocasts them (accelerate 1.15
     * accelerator.py:1824: the forward wrapped whatever the weights' dtype) */
    assert_string_equal(r.prec_auto[1], "bf16-amp");
    expect(OPTIMIZER, "adamw", KEY, "optim", 10); /* adamw_torch: torch.optim.AdamW (foreach) */
    expect(CHECKPOINT, "layers", KEY, "gradient_checkpointing", 30);
    expect(USE_CACHE, "off", KEY, "use_cache", 39);
    expect(FINETUNE, "full", DEFAULT, "(default)", 0);
    expect(LOSS, "hf", DEFAULT, "(default)", 0);
    assert_int_equal(r.n_unknown, 0); /* every key of a transformers 5.24 dump is known */
    /* llama-3.2-1b's config.json says "torch_dtype": "bfloat16" */
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_resolve_dtype(&r, "models/hf/llama-3.2-1b.json", &d), MP_OK);
    assert_string_equal(r.s[MP_RS_PRECISION].value, "bf16-amp");
}

/* HfArgumentParser YAML: fp16, and the Trainer's defaults for the rest. */
static void test_hf_yaml(void **state)
{
    (void)state;
    read_ok(D "hf-args.yaml", MP_RF_HF);
    assert_string_equal(r.how, "--recipe-format");
    expect(BATCH, "4", KEY, "per_device_train_batch_size", 4);
    expect(GRAD_ACCUM, "2", KEY, "gradient_accumulation_steps", 5);
    expect(OPTIMIZER, "adamw-fused", DEFAULT, "optim", 0); /* training_args.py:811 adamw_torch_fused */
    expect(CHECKPOINT, "none", DEFAULT, "gradient_checkpointing", 0);
    expect(USE_CACHE, "off", DEFAULT, "use_cache", 0);
    assert_string_equal(r.prec_auto[0], "amp-fp16");
    assert_string_equal(r.prec_auto[1], ""); /* fp16 autocast over bf16 weights: refused */
    struct mp_diag d = {{0}};
    /* gpt2's config.json has no dtype: float32, from_pretrained's fallback */
    assert_int_equal(mp_recipe_resolve_dtype(&r, "models/hf/gpt2.json", &d), MP_OK);
    assert_string_equal(r.s[MP_RS_PRECISION].value, "amp-fp16");
    assert_int_equal(mp_recipe_resolve_dtype(&r, "models/hf/llama-3.2-1b.json", &d), MP_ERR_MODEL);
    assert_non_null(strstr(d.msg, "fp16 autocast over bfloat16 weights"));
}

/* TRL SFT + LoRA: the loss is TRL 1.16's chunked fused LM head (--loss chunked-nll), its default. */
static void test_trl_lora(void **state)
{
    (void)state;
    read_ok(D "trl-sft-lora.yaml", -1);
    assert_int_equal(r.format, MP_RF_TRL);
    expect(MODEL, "models/hf/qwen2-0.5b.json", KEY, "model_name_or_path", 4);
    expect(BATCH, "4", KEY, "per_device_train_batch_size", 11);
    expect(GRAD_ACCUM, "4", KEY, "gradient_accumulation_steps", 12);
    expect(SEQ, "2048", KEY, "max_length", 13);
    expect(PRECISION, "bf16-amp", KEY, "dtype", 5); /* bfloat16 base, adapters fp32 (peft), bf16 autocast */
    expect(CHECKPOINT, "layers", DEFAULT, "gradient_checkpointing", 0); /* base_config.py:62 True */
    expect(OPTIMIZER, "adamw-fused", DEFAULT, "optim", 0);
    expect(ATTENTION, "sdpa", KEY, "attn_implementation", 6);
    expect(FINETUNE, "lora", KEY, "use_peft", 17);
    expect(LORA_R, "32", KEY, "lora_r", 18);
    expect(LORA_ALPHA, "16", KEY, "lora_alpha", 19);
    expect(LORA_DROPOUT, "0.05", DEFAULT, "lora_dropout", 0); /* model_config.py lora_dropout 0.05 */
    expect(LORA_TARGETS, "q_proj,k_proj,v_proj,o_proj", KEY, "lora_target_modules", 21);
    expect(LOSS, "chunked-nll", DEFAULT, "loss_type", 0);
}

/* TRL SFT with activation_offloading: --act-offload (sft_trainer.py:1190-1193) with TRL's fused
 * head.  Axolotl's: full fine-tuning is --checkpoint layers --act-offload (its checkpoint_wrapper on
 * every layer, whatever gradient_checkpointing says; gradient_checkpointing: offload means the
 * same); with an adapter, or legacy, refused; false accepted. */
static void test_trl_act_offload(void **state)
{
    (void)state;
    read_ok(D "trl-sft-actoff.yaml", -1);
    expect(ACT_OFFLOAD, "true", KEY, "activation_offloading", 7);
    expect(CHECKPOINT, "layers", DEFAULT, "gradient_checkpointing", 0);
    expect(LOSS, "chunked-nll", DEFAULT, "loss_type", 0);
    expect(FINETUNE, "lora", KEY, "use_peft", 5);
    expect(LORA_TARGETS, "all-linear", KEY, "lora_target_modules", 6);
    read_ok(D "axolotl-actoff.yaml", -1);
    expect(ACT_OFFLOAD, "true", KEY, "activation_offloading", 7);
    expect(CHECKPOINT, "layers", KEY, "activation_offloading", 7);
    expect(FINETUNE, "full", DEFAULT, "adapter", 0);
    read_ok(D "axolotl-gc-offload.yaml", -1);
    expect(ACT_OFFLOAD, "true", KEY, "gradient_checkpointing", 5);
    expect(CHECKPOINT, "layers", KEY, "gradient_checkpointing", 5);
    read_refused(D "axolotl-lora-actoff.yaml", ":8: activation_offloading:", "instead of checkpointing");
    read_refused(D "axolotl-actoff-legacy.yaml", ":4: activation_offloading:", "without its streams");
    read_ok(D "axolotl-full.yaml", -1);
    unset(ACT_OFFLOAD);
}

static void test_trl_qlora(void **state)
{
    (void)state;
    read_ok(D "trl-sft-qlora.yaml", -1);
    expect(LOSS, "chunked-nll", KEY, "loss_type", 10); /* nll: the fused head too */
    expect(FINETUNE, "qlora", KEY, "use_peft", 6); /* use_peft + load_in_4bit */
    expect(PRECISION, "amp-bf16", DEFAULT, "bf16", 0); /* dtype float32 (model_config.py:90), bf16 = not fp16 */
    expect(SEQ, "1024", DEFAULT, "max_length", 0);     /* sft_config.py:202 */
    expect(BATCH, "8", DEFAULT, "per_device_train_batch_size", 0);
    expect(LORA_R, "16", DEFAULT, "lora_r", 0);
    expect(LORA_ALPHA, "32", DEFAULT, "lora_alpha", 0);
    expect(LORA_TARGETS, "all-linear", KEY, "lora_target_modules", 9);
}

/* Axolotl QLoRA: a Hub id, paged 8-bit AdamW through the HF-name column, flash attention. */
static void test_axolotl_qlora(void **state)
{
    (void)state;
    read_ok(D "axolotl-qlora.yaml", -1);
    assert_int_equal(r.format, MP_RF_AXOLOTL);
    expect(MODEL, "meta-llama/Llama-3.2-1B", KEY, "base_model", 3);
    expect(BATCH, "2", KEY, "micro_batch_size", 24);
    expect(GRAD_ACCUM, "4", KEY, "gradient_accumulation_steps", 23);
    expect(SEQ, "2048", KEY, "sequence_len", 20);
    expect(PRECISION, "bf16-amp", KEY, "bf16", 30); /* bf16: auto on a bf16 GPU: the model loads in bf16,
                                                        * the Trainer's bf16=True autocasts */
    expect(OPTIMIZER, "paged-adam8bit", KEY, "optimizer", 26);
    expect(CHECKPOINT, "layers", KEY, "gradient_checkpointing", 33);
    expect(ATTENTION, "flash", KEY, "flash_attention", 34);
    expect(FINETUNE, "qlora", KEY, "adapter", 14);
    expect(LORA_R, "32", KEY, "lora_r", 15);
    expect(LORA_ALPHA, "16", KEY, "lora_alpha", 16);
    expect(LORA_DROPOUT, "0.05", KEY, "lora_dropout", 17);
    expect(LORA_TARGETS, "all-linear", KEY, "lora_target_linear", 18);
    expect(LOSS, "hf", DEFAULT, "(default)", 0);
    assert_int_equal(r.n_unknown, 1);
    assert_string_equal(r.unknown, "unknown_key_here (line 40)");
}

static void test_axolotl_full(void **state)
{
    (void)state;
    read_ok(D "axolotl-full.yaml", -1);
    expect(BATCH, "1", KEY, "micro_batch_size", 9);
    expect(SEQ, "1024", KEY, "sequence_len", 8);
    expect(PRECISION, "bf16-amp", KEY, "bf16", 13); /* utils/config/__init__.py:198: loaded in bfloat16;
                                                        * bf16=True: autocast over it */
    expect(OPTIMIZER, "adamw-fused", DEFAULT, "optimizer", 0); /* schemas/training.py:122 */
    expect(CHECKPOINT, "layers", KEY, "gradient_checkpointing", 14);
    expect(ATTENTION, "sdpa", KEY, "attn_implementation", 17);
    expect(FINETUNE, "full", DEFAULT, "adapter", 0);
    unset(LORA_R);
}

static void test_llamafactory_lora(void **state)
{
    (void)state;
    read_ok(D "llamafactory-lora.yaml", -1);
    assert_int_equal(r.format, MP_RF_LLAMAFACTORY);
    expect(MODEL, "models/hf/llama-3.2-1b.json", KEY, "model_name_or_path", 4);
    expect(BATCH, "1", KEY, "per_device_train_batch_size", 31);
    expect(GRAD_ACCUM, "8", KEY, "gradient_accumulation_steps", 32);
    expect(SEQ, "2048", KEY, "cutoff_len", 18);
    expect(PRECISION, "bf16-amp", KEY, "bf16", 37); /* bf16 base (parser.py:512), fp32 adapters, bf16
                                                        * autocast (the Trainer's bf16=True) */
    expect(CHECKPOINT, "layers", DEFAULT, "gradient_checkpointing", 0); /* model_args.py:145 */
    expect(FINETUNE, "lora", KEY, "finetuning_type", 10);
    expect(LORA_R, "8", KEY, "lora_rank", 11);
    expect(LORA_ALPHA, "16", DEFAULT, "lora_alpha", 0); /* finetuning_args.py:568: lora_rank * 2 */
    expect(LORA_DROPOUT, "0", DEFAULT, "lora_dropout", 0);
    expect(LORA_TARGETS, "all-linear", KEY, "lora_target", 12);
}

/* LLaMA-Factory's default checkpointing is reentrant: refused, naming use_reentrant_gc. */
static void test_llamafactory_defaults(void **state)
{
    (void)state;
    read_refused(D "llamafactory-defaults.yaml", ": use_reentrant_gc (the trainer's default): true:", "reentrant");
    expect(SEQ, "2048", DEFAULT, "cutoff_len", 0);                 /* data_args.py:46 */
    expect(BATCH, "8", DEFAULT, "per_device_train_batch_size", 0); /* TrainingArguments' */
    expect(PRECISION, "amp-bf16", KEY, "bf16", 10); /* full: trainable upcast to fp32 (adapter.py:313) */
    expect(FINETUNE, "full", KEY, "finetuning_type", 6);
}

static void test_torchtune_full(void **state)
{
    (void)state;
    read_refused(D "torchtune-full.yaml", ":36: loss._component_:", "not modelled yet");
    assert_int_equal(r.format, MP_RF_TORCHTUNE);
    expect(MODEL, "tests/data/recipes/llama-3.2-1b/", KEY, "checkpointer.checkpoint_dir", 20);
    expect(BATCH, "4", KEY, "batch_size", 29);
    expect(GRAD_ACCUM, "1", KEY, "gradient_accumulation_steps", 38);
    expect(SEQ, "4096", KEY, "tokenizer.max_seq_len", 10);
    expect(PRECISION, "bf16", KEY, "dtype", 45); /* pure bf16: torchtune's model in bf16, no master */
    expect(OPTIMIZER, "adamw-fused", KEY, "optimizer._component_", 32); /* AdamW + fused: True */
    expect(CHECKPOINT, "layers", KEY, "enable_activation_checkpointing", 43);
    expect(FINETUNE, "full", KEY, "model._component_", 5);
}

static const char *scratch(const char *name);
static void write_text(const char *path, const char *text);

/* The loss heads a recipe turns on: Axolotl's CutCrossEntropyPlugin (its key defaults to true,
 * integrations/cut_cross_entropy/args.py:32), torchtune's LinearCrossEntropyLoss (its arguments
 * other than the defaults refused). */
static void test_loss_heads(void **state)
{
    (void)state;
    const char *path = scratch("loss.yaml");
    write_text(path, "base_model: m\nbf16: true\nplugins:\n"
                     "  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n");
    read_ok(path, -1);
    expect(LOSS, "cce", KEY, "plugins", 4);
    write_text(path, "base_model: m\nbf16: true\nplugins:\n"
                     "  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\ncut_cross_entropy: true\n");
    read_ok(path, -1);
    expect(LOSS, "cce", KEY, "cut_cross_entropy", 5);
    write_text(path, "base_model: m\nbf16: true\nplugins:\n"
                     "  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\ncut_cross_entropy: false\n");
    read_ok(path, -1);
    expect(LOSS, "hf", DEFAULT, "(default)", 0);
    write_text(path, "base_model: m\nbf16: true\ncut_cross_entropy: true\n");
    read_refused(path, ":3: cut_cross_entropy: true:", "CutCrossEntropyPlugin");
    write_text(path, "base_model: m\nplugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
                     "  - axolotl.integrations.foo.FooPlugin\n");
    read_refused(path, ":3: plugins:", "not modelled yet");
    write_text(path, "base_model: m\nbf16: true\nplugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n"
                     "  - axolotl.integrations.liger.LigerPlugin\nliger_fused_linear_cross_entropy: true\n");
    read_refused(path, ":6: liger_fused_linear_cross_entropy: true:", "one loss head");
    write_text(path, "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nbatch_size: 2\ndtype: bf16\n"
                     "loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n");
    read_ok(path, -1);
    expect(LOSS, "torchtune", KEY, "loss._component_", 6);
    write_text(path, "model:\n  _component_: torchtune.models.llama3_2.llama3_2_1b\nbatch_size: 2\ndtype: bf16\n"
                     "loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n  num_output_chunks: 16\n");
    read_refused(path, ":7: loss.num_output_chunks: 16:", "8 chunks");
}

/* Liger's switches (transformers 5.24 Trainer, TRL 1.16 sft_trainer.py:1127-1140, Axolotl 0.19
 * integrations/liger/plugin.py:192-228): the fused linear cross-entropy is --loss liger, with
 * the kernels the file sets true and false (the model's defaults are ir/liger.c's, test_loss.c). */
static void test_liger(void **state)
{
    (void)state;
    const char *path = scratch("liger.yaml");
    write_text(path, "per_device_train_batch_size: 2\nuse_liger_kernel: true\n");
    read_ok(path, -1);
    expect(LOSS, "liger", KEY, "use_liger_kernel", 2);
    assert_int_equal(r.liger_on | r.liger_off, 0);
    assert_false(r.liger_unset_off);
    write_text(path, "per_device_train_batch_size: 2\nuse_liger_kernel: true\nliger_kernel_config:\n"
                     "  fused_linear_cross_entropy: true\n  rope: false\n  rms_norm: false\n  swiglu: false\n");
    read_ok(path, -1);
    expect(LOSS, "liger", KEY, "use_liger_kernel", 2);
    assert_int_equal(r.liger_on, MP_LK_FLCE);
    assert_int_equal(r.liger_off, MP_LK_ROPE | MP_LK_RMS_NORM | MP_LK_SWIGLU);
    assert_non_null(strstr(r.liger_where, ":2: use_liger_kernel: true"));
    /* every kernel off: nothing of Liger runs */
    write_text(path, "per_device_train_batch_size: 2\nuse_liger_kernel: true\nliger_kernel_config:\n"
                     "  fused_linear_cross_entropy: false\n  cross_entropy: false\n  rope: false\n  rms_norm: false\n"
                     "  swiglu: false\n  geglu: false\n  layer_norm: false\n  relu_squared: false\n");
    read_ok(path, -1);
    expect(LOSS, "hf", DEFAULT, "(default)", 0);
    write_text(path, "per_device_train_batch_size: 2\nuse_liger_kernel: true\nliger_kernel_config:\n"
                     "  fused_linear_cross_entropy: false\n");
    read_refused(path, ":2: use_liger_kernel: true:", "at their defaults");
    write_text(path, "per_device_train_batch_size: 2\nliger_kernel_config:\n  rope: true\n");
    read_ok(path, -1); /* no switch: nothing applies the config */
    expect(LOSS, "hf", DEFAULT, "(default)", 0);
    /* TRL: the trainers raise on the fused loss, and turn it off */
    write_text(path, "model_name_or_path: m\nmax_length: 512\nuse_liger_kernel: true\nliger_kernel_config:\n"
                     "  fused_linear_cross_entropy: true\n");
    read_refused(path, ":5: liger_kernel_config.fused_linear_cross_entropy: true:", "raise on it");
    write_text(path, "model_name_or_path: m\nmax_length: 512\nuse_liger_kernel: true\n");
    read_refused(path, ":3: use_liger_kernel: true:", "at their defaults");
    /* Axolotl: the plugin's flags, unset off */
    write_text(path, "base_model: m\nbf16: true\nplugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
                     "liger_fused_linear_cross_entropy: true\nliger_rope: false\n");
    read_ok(path, -1);
    expect(LOSS, "liger", KEY, "liger_fused_linear_cross_entropy", 5);
    assert_int_equal(r.liger_on, MP_LK_FLCE);
    assert_int_equal(r.liger_off, MP_LK_ROPE);
    assert_true(r.liger_unset_off);
    write_text(path, "base_model: m\nbf16: true\nliger_fused_linear_cross_entropy: true\n");
    read_refused(path, ":3: liger_fused_linear_cross_entropy: true:", "add plugins: [axolotl.integrations.liger.LigerPlugin]");
    write_text(path, "base_model: m\nplugins:\n  - axolotl.integrations.liger.LigerPlugin\n"
                     "liger_fused_linear_cross_entropy: true\nliger_glu_activation: true\n");
    read_refused(path, ":5: liger_glu_activation: true:", "not modelled yet");
    write_text(path, "base_model: m\nplugins:\n  - axolotl.integrations.liger.LigerPlugin\nliger_rope: maybe\n");
    read_refused(path, ":4: liger_rope: maybe:", "expected true or false");
}

/* A scratch recipe file NAME in $TMPDIR (or /tmp), per process: the tests run from the
 * repository root with any BUILD directory (make test SAN=1 BUILD=build-san). */
static const char *scratch(const char *name)
{
    static char path[3][256];
    static int next;
    const char *dir = getenv("TMPDIR");
    char *p = path[next++ % 3];
    snprintf(p, sizeof path[0], "%s/memplan-test-%ld-%s", dir && *dir ? dir : "/tmp", (long)getpid(), name);
    return p;
}

/* Refusals: each names the file, the line and the key; one line. */
static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *text, *where, *why;
    } cases[] = {
        {"base_model: m\nsample_packing: true\n", ":2: sample_packing: true:", "not modelled yet"},
        {"base_model: m\nplugins:\n  - axolotl.integrations.foo.FooPlugin\n", ":3: plugins:", "not modelled yet"},
        {"base_model: m\noptimizer: lion_32bit\n", ":2: optimizer: lion_32bit:", "does not model"},
        {"base_model: m\ngradient_checkpointing: offload_disk\n", ":2: gradient_checkpointing: offload_disk:", "offloaded"},
        {"base_model: m\nadapter: lora\nload_in_8bit: true\n", ":3: load_in_8bit: true:", "8-bit base"},
        {"base_model: m\nmicro_batch_size: 0\n", ":2: micro_batch_size: 0:", "positive integer"},
        {"per_device_train_batch_size: 2\ndeepspeed: ds.json\n", ":2: deepspeed: ds.json:", "--parallel"},
        {"per_device_train_batch_size: 2\nuse_liger_kernel: true\nliger_kernel_config:\n  rms_norm: true\n",
         ":4: liger_kernel_config.rms_norm: true:", "other than its fused linear cross-entropy"},
        /* selective checkpointing: TRL's SFTTrainer only, full weights (sac_step.py trl-peft) */
        {"model_name_or_path: m\nuse_peft: true\ngradient_checkpointing_kwargs:\n  selective: true\n",
         ":4: gradient_checkpointing_kwargs.selective: true:", "PEFT model"},
        {"per_device_train_batch_size: 2\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n"
         "  selective: true\n",
         ":4: gradient_checkpointing_kwargs.selective: true:", "only TRL's SFTTrainer"},
        {"model_name_or_path: m\ngradient_checkpointing: false\ngradient_checkpointing_kwargs:\n  selective: true\n",
         ":4: gradient_checkpointing_kwargs.selective: true:", "TRL raises"},
        {"base_model: m\ngradient_checkpointing: true\nselective_checkpointing:\n  save:\n    - attention\n"
         "    - aten::mm\n",
         ":5: selective_checkpointing.save: attention,aten::mm:", "besides attention"},
        {"base_model: m\ngradient_checkpointing: true\nselective_checkpointing:\n  offload: true\n",
         ":4: selective_checkpointing.offload: true:", "pinned host memory"},
        {"per_device_train_batch_size: 2\ngradient_checkpointing: true\ngradient_checkpointing_kwargs:\n"
         "  offload: maybe\n",
         ":4: gradient_checkpointing_kwargs.offload: maybe:", "expected true or false"},
        {"model_name_or_path: m\nuse_peft: true\nload_in_4bit: true\nloss_type: nll\n",
         ": use_bnb_nested_quant (the trainer's default): false:", "double-quantized"},
        {"model_name_or_path: m\nload_in_4bit: true\n", ":2: load_in_4bit", "cannot be fully fine-tuned"},
        {"model_name_or_path: m\ndtype: auto\nloss_type: bogus\n", ":3: loss_type: bogus:", "does not model"},
        /* LLaMA-Factory's DPO is --trainer dpo's (test_lf_dpo), its KTO --trainer kto's (test_lf_kto) */
        {"stage: dpo\nmodel_name_or_path: m\n", ":1: stage: dpo:", "read this file with --trainer dpo"},
        {"stage: kto\nmodel_name_or_path: m\n", ":1: stage: kto:", "read this file with --trainer kto"},
        {"stage: rm\nmodel_name_or_path: m\n", ":1: stage: rm:", "reward, value"},
        {"stage: grpo\nmodel_name_or_path: m\n", ":1: stage: grpo:", "expected sft, pt"},
        {"stage: sft\nmodel_name_or_path: m\nfinetuning_type: freeze\nuse_reentrant_gc: false\n",
         ":3: finetuning_type: freeze:", "not model yet"},
        {"model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_rank: 8\n"
         "  lora_attn_modules: [q_proj, v_proj]\nbatch_size: 2\ndtype: bf16\n",
         ":6: dtype: bf16:", "fp32 as peft makes them"},
        {"base_model: m\nbase_model: n\n", ":2: base_model: duplicate key", "first at line 1"},
        {"just: [unclosed\n", ":2:1: not YAML or JSON", "did not find expected"},
        {"- a\n- b\n", ": a recipe is a mapping", "list"},
        {"learning_rate: 1\n", ": the recipe's format is not told", "--recipe-format"},
        {"base_model: m\nrl: dpo\n", ":2: rl: dpo:", "read this file with --trainer dpo"},
    };
    const char *path = scratch("recipe-case.yaml");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(path, cases[i].text);
        struct mp_diag d = {{0}};
        enum mp_status st = mp_recipe_read(path, -1, &r, &d);
        char head[256];
        snprintf(head, sizeof head, "%s%s", path, cases[i].where);
        if (st == MP_OK || strncmp(d.msg, head, strlen(head)) || !strstr(d.msg, cases[i].why) || strchr(d.msg, '\n')) {
            print_error("case %zu: status %d: got: %s\nwant: %s... %s\n", i, (int)st, d.msg, head, cases[i].why);
            fail();
        }
    }
    /* 40 nested mappings: refused at 32 (trainers' configs nest 3 deep), not a deep recursion */
    char deep[512] = "base_model: m\nx: ";
    for (int i = 0; i < 40; i++)
        strcat(deep, "{a: ");
    strcat(deep, "1");
    for (int i = 0; i < 40; i++)
        strcat(deep, "}");
    strcat(deep, "\n");
    write_text(path, deep);
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_read(path, -1, &r, &d), MP_ERR_JSON);
    assert_non_null(strstr(d.msg, ":2: mappings nested deeper than 32 levels"));
    remove(path);
}

/* A file read with a trainer: read (where NULL), or refused with one line that starts with the
 * file and where, and holds why. */
struct trainer_case {
    const char *text, *where, *why;
    enum mp_trainer t;
};

static void read_cases(const char *path, const struct trainer_case *cases, size_t n)
{
    struct mp_diag d = {{0}};
    for (size_t i = 0; i < n; i++) {
        write_text(path, cases[i].text);
        memset(&d, 0, sizeof d);
        enum mp_status st = mp_recipe_read_as(path, -1, cases[i].t, &r, &d);
        char head[256];
        snprintf(head, sizeof head, "%s%s", path, cases[i].where ? cases[i].where : "");
        bool good = cases[i].where ? st != MP_OK && !strncmp(d.msg, head, strlen(head)) &&
                                         strstr(d.msg, cases[i].why) && !strchr(d.msg, '\n')
                                   : st == MP_OK;
        if (!good) {
            print_error("case %zu: status %d: got: %s\nwant: %s... %s\n", i, (int)st, d.msg, head,
                        cases[i].why ? cases[i].why : "(read)");
            fail();
        }
    }
}

/* Axolotl 0.19's rl: read with the matching --trainer (core/builders/rl.py): TRL's DPOTrainer for
 * dpo and ipo, KTOTrainer for kto, ORPOTrainer for orpo; what it cannot plan refused, one line
 * naming the key */
static void test_axolotl_rl(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_read_as(D "axolotl-dpo-lora.yaml", -1, MP_TRAINER_DPO, &r, &d), MP_OK);
    assert_string_equal(r.trainer, "Axolotl 0.19.0 rl: dpo / ipo (TRL 1.16.0 DPOTrainer)");
    expect(BATCH, "2", KEY, "micro_batch_size", 22);
    expect(SEQ, "1024", KEY, "sequence_len", 21); /* DPOConfig max_length (core/builders/base.py) */
    expect(FINETUNE, "lora", KEY, "adapter", 16);
    expect(LOSS, "chunked-nll", DEFAULT, "(default)", 0); /* TRL's fused head (dpo_trainer.py:959-962) */
    unset(PRECOMPUTE_REF);
    assert_int_equal(r.n_unknown, 0); /* rl_beta, dpo_loss_type [sigmoid]: read */
    /* KTO: precompute_ref_log_probs is DPOConfig's alone in Axolotl (DPOStrategy): not planned */
    assert_int_equal(mp_recipe_read_as(D "axolotl-kto-full.yaml", -1, MP_TRAINER_KTO, &r, &d), MP_OK);
    expect(BATCH, "4", KEY, "micro_batch_size", 17);
    expect(FINETUNE, "full", DEFAULT, "adapter", 0);
    expect(LOSS, "chunked-nll", DEFAULT, "(default)", 0);
    unset(PRECOMPUTE_REF);
    static const struct trainer_case cases[] = {
        {"base_model: m\nrl: ipo\nprecompute_ref_log_probs: true\n", NULL, NULL, MP_TRAINER_DPO},
        {"base_model: m\nrl: orpo\norpo_alpha: 0.1\n", NULL, NULL, MP_TRAINER_ORPO},
        {"base_model: m\nrl: kto\n", ":2: rl: kto:", "read this file with --trainer kto", MP_TRAINER_KTO_APO},
        {"base_model: m\nrl: dpo\n", ":2: rl: dpo:", "read this file with --trainer dpo", MP_TRAINER_KTO},
        {"base_model: m\nmicro_batch_size: 2\n", ": rl (the trainer's default): null:", "give it, or drop --trainer dpo", MP_TRAINER_DPO},
        {"base_model: m\nrl: grpo\n", ":2: rl: grpo:", "Axolotl's own GRPO trainer", MP_TRAINER_GRPO},
        {"base_model: m\nrl: simpo\n", ":2: rl: simpo:", "CPOTrainer", MP_TRAINER_DPO},
        {"base_model: m\nrl: ebft\n", ":2: rl: ebft:", "not modelled yet", MP_TRAINER_DPO},
        {"base_model: m\nrl: ppo\n", ":2: rl: ppo:", "expected dpo, ipo", MP_TRAINER_DPO},
        {"base_model: m\nrl: dpo\nadapter: lora\nrl_adapter_ref_model: true\n", ":4: rl_adapter_ref_model: true:",
         "second copy", MP_TRAINER_DPO},
        {"base_model: m\nrl: dpo\ndpo_use_weighting: true\n", ":3: dpo_use_weighting: true:", "WPO",
         MP_TRAINER_DPO},
        {"base_model: m\nrl: dpo\ndpo_use_liger_kernel: true\n", ":3: dpo_use_liger_kernel: true:", "Liger",
         MP_TRAINER_DPO},
        {"base_model: m\nrl: dpo\ndpo_loss_type: [sigmoid, sft]\n", ":3: dpo_loss_type: sigmoid,sft:",
         "several at once", MP_TRAINER_DPO},
        {"base_model: m\nrl: dpo\nplugins:\n  - axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin\n",
         ":4: plugins:", "under TRL's preference trainers", MP_TRAINER_DPO},
    };
    const char *path = scratch("recipe-axrl.yaml");
    read_cases(path, cases, sizeof cases / sizeof cases[0]);
    /* a LLaMA-Factory sft file (stage sft by default) with a preference trainer: refused */
    write_text(path, "model_name_or_path: m\nfinetuning_type: lora\n");
    memset(&d, 0, sizeof d);
    assert_int_equal(mp_recipe_read_as(path, -1, MP_TRAINER_DPO, &r, &d), MP_ERR_MODEL);
    assert_non_null(strstr(d.msg, "stage (the trainer's default): sft: this stage trains the model alone: drop "
                                  "--trainer dpo"));
    /* ipo is DPO's trainer: its precompute_ref_log_probs planned; orpo: the model's own head */
    write_text(path, cases[0].text);
    assert_int_equal(mp_recipe_read_as(path, -1, MP_TRAINER_DPO, &r, &d), MP_OK);
    expect(PRECOMPUTE_REF, "true", KEY, "precompute_ref_log_probs", 3);
    write_text(path, cases[1].text);
    assert_int_equal(mp_recipe_read_as(path, -1, MP_TRAINER_ORPO, &r, &d), MP_OK);
    unset(LOSS);
    remove(path);
}

/* LLaMA-Factory 0.9.5's stage: dpo read with --trainer dpo: its CustomDPOTrainer's step is --loss hf
 * (the model's logits, lower_lf_dpo_loss); its reference follows finetuning_type (create_ref_model);
 * what changes memory and is not planned refused, one line naming the key */
static void test_lf_dpo(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_read_as(D "llamafactory-dpo-lora.yaml", -1, MP_TRAINER_DPO, &r, &d), MP_OK);
    assert_string_equal(r.trainer, "LLaMA-Factory 0.9.5 stage: dpo (CustomDPOTrainer, TRL <= 0.24)");
    expect(LOSS, "hf", KEY, "stage", 8);
    expect(FINETUNE, "lora", KEY, "finetuning_type", 10);
    expect(SEQ, "1024", KEY, "cutoff_len", 20);
    expect(BATCH, "1", KEY, "per_device_train_batch_size", 33);
    expect(PRECISION, "bf16-amp", KEY, "bf16", 39); /* bf16 weights, the Trainer's autocast */
    unset(PRECOMPUTE_REF);
    assert_int_equal(r.n_unknown, 0); /* pref_beta, pref_loss sigmoid: read */
    static const struct trainer_case cases[] = {
        {"model_name_or_path: m\nstage: dpo\nfinetuning_type: full\npure_bf16: true\npref_loss: ipo\n"
         "pref_ftx: 0.5\nuse_reentrant_gc: false\n", NULL, NULL, MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\npref_loss: hinge\npref_bco_weight: 0.5\nuse_reentrant_gc: false\n", NULL, NULL, MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\nuse_reentrant_gc: false\n", ":2: stage: dpo:", "read this file with --trainer dpo",
         MP_TRAINER_KTO},
        {"model_name_or_path: m\nstage: dpo\npref_loss: simpo\nuse_reentrant_gc: false\n", ":3: pref_loss: simpo:", "without a reference",
         MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\npref_loss: orpo\nuse_reentrant_gc: false\n", ":3: pref_loss: orpo:", "use_ref_model false",
         MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\nld_alpha: 0.5\nuse_reentrant_gc: false\n", ":3: ld_alpha: 0.5:", "LD-DPO", MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\nref_model: other\nuse_reentrant_gc: false\n", ":3: ref_model: other:", "of its own",
         MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\nref_model_quantization_bit: 4\nuse_reentrant_gc: false\n", ":3: ref_model_quantization_bit: 4:",
         "quantized reference", MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\nfinetuning_type: full\nbf16: true\nuse_reentrant_gc: false\n", ":3: finetuning_type: full:",
         "bf16 reference copy", MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: dpo\nfinetuning_type: freeze\nuse_reentrant_gc: false\n", ":3: finetuning_type: freeze:",
         "lora and full are", MP_TRAINER_DPO},
    };
    const char *path = scratch("recipe-lfdpo.yaml");
    read_cases(path, cases, sizeof cases / sizeof cases[0]);
    /* full under pure_bf16: bf16 weights and a bf16 copy, the head the model's logits */
    write_text(path, cases[0].text);
    assert_int_equal(mp_recipe_read_as(path, -1, MP_TRAINER_DPO, &r, &d), MP_OK);
    expect(FINETUNE, "full", KEY, "finetuning_type", 3);
    expect(PRECISION, "bf16", KEY, "pure_bf16", 4);
    expect(LOSS, "hf", KEY, "stage", 2);
    remove(path);
}

/* LLaMA-Factory 0.9.5's stage: kto read with --trainer kto: CustomKTOTrainer's step is --loss hf (the
 * model's logits, lower_lf_dpo_loss); the reference as DPO's; its weights and beta read (b-sized),
 * the DPO loss's keys it does not read accepted, a reference of its own refused */
static void test_lf_kto(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_read_as(D "llamafactory-kto-lora.yaml", -1, MP_TRAINER_KTO, &r, &d), MP_OK);
    assert_string_equal(r.trainer, "LLaMA-Factory 0.9.5 stage: kto (CustomKTOTrainer, TRL <= 0.24)");
    expect(LOSS, "hf", KEY, "stage", 8);
    expect(FINETUNE, "lora", KEY, "finetuning_type", 10);
    expect(SEQ, "1024", KEY, "cutoff_len", 21);
    expect(BATCH, "1", KEY, "per_device_train_batch_size", 34); /* (one example: no KL floor) */
    expect(PRECISION, "bf16-amp", KEY, "bf16", 40);
    unset(PRECOMPUTE_REF);
    assert_int_equal(r.n_unknown, 0); /* pref_beta, kto_chosen_weight, kto_rejected_weight: read */
    static const struct trainer_case cases[] = {
        {"model_name_or_path: m\nstage: kto\nfinetuning_type: full\npure_bf16: true\npref_ftx: 0.5\n"
         "kto_rejected_weight: 1.33\npref_loss: simpo\nld_alpha: 0.5\nuse_reentrant_gc: false\n", NULL, NULL,
         MP_TRAINER_KTO},
        {"model_name_or_path: m\nstage: kto\nuse_reentrant_gc: false\n", ":2: stage: kto:",
         "read this file with --trainer kto", MP_TRAINER_DPO},
        {"model_name_or_path: m\nstage: kto\nuse_reentrant_gc: false\n", ":2: stage: kto:",
         "read this file with --trainer kto", MP_TRAINER_KTO_APO},
        {"model_name_or_path: m\nstage: kto\nref_model: other\nuse_reentrant_gc: false\n", ":3: ref_model: other:",
         "of its own", MP_TRAINER_KTO},
        {"model_name_or_path: m\nstage: kto\nref_model_adapters: a\nuse_reentrant_gc: false\n",
         ":3: ref_model_adapters: a:", "of its own", MP_TRAINER_KTO},
        {"model_name_or_path: m\nstage: kto\nfinetuning_type: full\nbf16: true\nuse_reentrant_gc: false\n",
         ":3: finetuning_type: full:", "bf16 reference copy", MP_TRAINER_KTO},
        {"model_name_or_path: m\nstage: kto\nfinetuning_type: oft\nuse_reentrant_gc: false\n",
         ":3: finetuning_type: oft:", "LLaMA-Factory's KTO with this fine-tuning type", MP_TRAINER_KTO},
    };
    const char *path = scratch("recipe-lfkto.yaml");
    read_cases(path, cases, sizeof cases / sizeof cases[0]);
    /* full under pure_bf16: bf16 weights and a bf16 copy; the DPO loss's keys are no KTO's */
    write_text(path, cases[0].text);
    assert_int_equal(mp_recipe_read_as(path, -1, MP_TRAINER_KTO, &r, &d), MP_OK);
    expect(FINETUNE, "full", KEY, "finetuning_type", 3);
    expect(PRECISION, "bf16", KEY, "pure_bf16", 4);
    expect(LOSS, "hf", KEY, "stage", 2);
    assert_int_equal(r.n_unknown, 0);
    remove(path);
}

/* The optimizer goes through --optimizer's HF-name columns: a row's names map back to it. */
static void test_optimizer_hf_names(void **state)
{
    (void)state;
    static const struct {
        const char *hf, *mp;
    } cases[] = {{"adamw_torch", "adamw"},          {"adamw_torch_fused", "adamw-fused"},
                 {"adamw_bnb_8bit", "adam8bit"},     {"paged_adamw_8bit", "paged-adam8bit"},
                 {"adafactor", "adafactor"},         {"sgd", "sgd"},
                 {"adamw_torch_4bit", "adamw4bit-ao"}, {"lion_8bit", "lion8bit"}};
    const char *path = scratch("recipe-optim.yaml");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[128];
        snprintf(text, sizeof text, "base_model: m\noptimizer: %s\n", cases[i].hf);
        write_text(path, text);
        read_ok(path, -1);
        expect(OPTIMIZER, cases[i].mp, KEY, "optimizer", 2);
    }
    remove(path);
}

/* transformers 5.24's every_n_layers: --checkpoint layers:N (decoder layers 0, N, 2N, ...). */
static void test_every_n_layers(void **state)
{
    (void)state;
    const char *path = scratch("recipe-every.yaml");
    write_text(path, "per_device_train_batch_size: 2\nactivation_checkpointing: true\n"
                "activation_checkpointing_kwargs:\n  every_n_layers: 3\n");
    read_ok(path, -1);
    expect(CHECKPOINT, "layers:3", KEY, "activation_checkpointing_kwargs.every_n_layers", 4);
    write_text(path, "per_device_train_batch_size: 2\ngradient_checkpointing: true\n"
                "gradient_checkpointing_kwargs:\n  every_n_layers: 1\n");
    read_ok(path, -1);
    expect(CHECKPOINT, "layers", KEY, "gradient_checkpointing", 2);
    /* offload (trainer.py:1509 pops it): --checkpoint layers[:N]+offload */
    write_text(path, "per_device_train_batch_size: 2\ngradient_checkpointing: true\n"
                "gradient_checkpointing_kwargs:\n  offload: true\n");
    read_ok(path, -1);
    expect(CHECKPOINT, "layers+offload", KEY, "gradient_checkpointing_kwargs.offload", 4);
    write_text(path, "per_device_train_batch_size: 2\nactivation_checkpointing: true\n"
                "activation_checkpointing_kwargs:\n  every_n_layers: 2\n  offload: true\n");
    read_ok(path, -1);
    expect(CHECKPOINT, "layers:2+offload", KEY, "activation_checkpointing_kwargs.offload", 5);
    write_text(path, "per_device_train_batch_size: 2\ngradient_checkpointing: true\n"
                "gradient_checkpointing_kwargs:\n  offload: false\n");
    read_ok(path, -1);
    expect(CHECKPOINT, "layers", KEY, "gradient_checkpointing", 2);
    /* selective checkpointing: TRL's SFTConfig key (sft_trainer.py:1085-1096), Axolotl's own
     * (with gradient checkpointing off Axolotl's wrapper has nothing to wrap: none) */
    static const struct {
        const char *text, *spec, *key;
        unsigned line;
    } sac[] = {
        {"model_name_or_path: m\nuse_peft: false\ngradient_checkpointing_kwargs:\n  selective: true\n", "layers+sac",
         "gradient_checkpointing_kwargs.selective", 4},
        {"model_name_or_path: m\ngradient_checkpointing_kwargs:\n  selective: true\n  every_n_layers: 2\n",
         "layers:2+sac", "gradient_checkpointing_kwargs.selective", 3},
        {"base_model: m\ngradient_checkpointing: true\nselective_checkpointing: true\n", "layers+sac:axolotl",
         "selective_checkpointing", 3},
        {"base_model: m\ngradient_checkpointing: true\nselective_checkpointing:\n  save: [attention]\n",
         "layers+sac:axolotl", "selective_checkpointing.save", 4},
        {"base_model: m\ngradient_checkpointing: false\nselective_checkpointing: true\n", "none",
         "gradient_checkpointing", 2},
    };
    for (size_t k = 0; k < sizeof sac / sizeof *sac; k++) {
        write_text(path, sac[k].text);
        read_ok(path, -1);
        expect(CHECKPOINT, sac[k].spec, KEY, sac[k].key, sac[k].line);
    }
    remove(path);
}

/* The file's text, malloc'd. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *b = calloc(1, 1 << 16);
    assert_non_null(b);
    size_t n = fread(b, 1, (1 << 16) - 1, f);
    b[n] = '\0';
    fclose(f);
    return b;
}

/* Reads IN as format, writes it for micro-batch batch and accumulation accum to a scratch file,
 * and expects that file's text to be want (written out by hand from IN). */
static void write_expect(const char *in, int format, uint64_t batch, uint64_t accum, size_t want_changes,
                         const char *want)
{
    read_ok(in, format);
    struct mp_recipe_change ch[MP_RECIPE_MAX_CHANGES];
    size_t n = mp_recipe_changes(&r, batch, accum, ch);
    assert_int_equal(n, want_changes);
    const char *out = scratch("written.yaml");
    struct mp_diag d = {{0}};
    enum mp_status st = mp_recipe_write(&r, MP_TRAINER_SFT, ch, n, out, &d);
    if (st != MP_OK)
        print_error("%s\n", d.msg);
    assert_int_equal(st, MP_OK);
    char *got = slurp(out);
    if (strcmp(got, want))
        print_error("got:\n%s\nwant:\n%s\n", got, want);
    assert_string_equal(got, want);
    free(got);
    remove(out);
}

/* suggest --write-recipe: the recipe handed back changes the batch and accumulation keys where
 * they are (quotes and comments kept), adds the absent ones (last in a block mapping, first in
 * JSON), and refuses a value it cannot change in place, naming the file, line and key. */
static void test_write_recipe(void **state)
{
    (void)state;
    char in[256]; /* (scratch's names are reused) */
    snprintf(in, sizeof in, "%s", scratch("in.yaml"));
    /* in place, a comment and a quoted value kept; the model line untouched */
    write_text(in, "model_name_or_path: m\nper_device_train_batch_size: 4   # per GPU\n"
                   "gradient_accumulation_steps: \"4\"\nmax_length: 2048\n");
    write_expect(in, MP_RF_TRL, 75, 1, 2,
                 "model_name_or_path: m\nper_device_train_batch_size: 75   # per GPU\n"
                 "gradient_accumulation_steps: \"1\"\nmax_length: 2048\n");
    /* absent keys (TRL's defaults 8 and 1): the batch added at the end, the accumulation unchanged */
    write_text(in, "model_name_or_path: m\nmax_length: 2048");
    write_expect(in, MP_RF_TRL, 12, 1, 1, "model_name_or_path: m\nmax_length: 2048\nper_device_train_batch_size: 12\n");
    /* Axolotl's own key */
    write_text(in, "base_model: m\nmicro_batch_size: 2\ngradient_accumulation_steps: 8\nsequence_len: 1024\n");
    write_expect(in, MP_RF_AXOLOTL, 3, 5, 2,
                 "base_model: m\nmicro_batch_size: 3\ngradient_accumulation_steps: 5\nsequence_len: 1024\n");
    /* JSON on one line: both keys of that line; then JSON without them: added first */
    write_text(in, "{\"per_device_train_batch_size\": 2, \"gradient_accumulation_steps\": 8, \"bf16\": true}\n");
    write_expect(in, MP_RF_HF, 16, 2, 2,
                 "{\"per_device_train_batch_size\": 16, \"gradient_accumulation_steps\": 2, \"bf16\": true}\n");
    write_text(in, "{\n  \"bf16\": true\n}\n");
    write_expect(in, MP_RF_HF, 6, 3, 2,
                 "{\"gradient_accumulation_steps\": 3, \"per_device_train_batch_size\": 6, \n  \"bf16\": true\n}\n");
    /* torchtune's batch_size; the plan's values already there: nothing to change, a copy */
    write_text(in, "batch_size: 4\ngradient_accumulation_steps: 2\noptimizer:\n  _component_: torch.optim.AdamW\n");
    write_expect(in, MP_RF_TORCHTUNE, 4, 2, 0,
                 "batch_size: 4\ngradient_accumulation_steps: 2\noptimizer:\n  _component_: torch.optim.AdamW\n");
    /* a value on the next line is not changed in place: refused, naming the place */
    write_text(in, "model_name_or_path: m\nper_device_train_batch_size:\n  4\n");
    read_ok(in, MP_RF_TRL);
    struct mp_recipe_change ch[MP_RECIPE_MAX_CHANGES];
    size_t n = mp_recipe_changes(&r, 9, 1, ch);
    assert_int_equal(n, 1);
    const char *out = scratch("written.yaml");
    remove(out);
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_write(&r, MP_TRAINER_SFT, ch, n, out, &d), MP_ERR_MODEL);
    char head[512];
    snprintf(head, sizeof head, "%s:3: per_device_train_batch_size: ", in); /* (the value's line) */
    if (strncmp(d.msg, head, strlen(head)) || !strstr(d.msg, "set it to 9 by hand"))
        print_error("got: %s\n", d.msg);
    assert_true(strncmp(d.msg, head, strlen(head)) == 0 && strstr(d.msg, "set it to 9 by hand"));
    assert_int_equal(access(out, F_OK), -1); /* nothing written */
    remove(in);
}

/* TRL GRPOConfig files read with --trainer grpo (trl 1.16.0 grpo_config.py): the generation keys as
 * their options, no length (GRPOConfig has none), generation_batch_size over the file's micro-batch */
static void test_trl_grpo(void **state)
{
    (void)state;
    struct mp_diag d = {{0}};
    assert_int_equal(mp_recipe_read_as(D "trl-grpo-vllm.yaml", -1, MP_TRAINER_GRPO, &r, &d), MP_OK);
    assert_string_equal(r.trainer, "TRL 1.16.0 GRPOTrainer (GRPOConfig + ModelConfig)");
    expect(BATCH, "8", KEY, "per_device_train_batch_size", 9);
    expect(NUM_GENERATIONS, "8", KEY, "num_generations", 11);
    expect(COMPLETION_LENGTH, "256", KEY, "max_completion_length", 12);
    expect(BETA, "0.04", KEY, "beta", 13);
    expect(TEMPERATURE, "0.9", KEY, "temperature", 15);
    expect(VLLM, "0.25", KEY, "vllm_gpu_memory_utilization", 18);
    expect(LOSS, "chunked-nll", DEFAULT, "loss_type", 0); /* grpo_trainer.py:1068-1077 the fused head */
    unset(SEQ);
    unset(STEPS_PER_GENERATION);
    unset(VLLM_IS_CORRECTION);
    unset(DISABLE_DROPOUT);
    assert_int_equal(mp_recipe_read_as(D "trl-grpo-genbatch.yaml", -1, MP_TRAINER_GRPO, &r, &d), MP_OK);
    expect(STEPS_PER_GENERATION, "4", KEY, "generation_batch_size", 9); /* 32 / per_device_train_batch_size 8 */
    expect(NUM_GENERATIONS, "4", KEY, "num_generations", 10);
    expect(COMPLETION_LENGTH, "128", KEY, "max_completion_length", 11);
    expect(DISABLE_DROPOUT, "on", KEY, "disable_dropout", 12);
    unset(VLLM);
    unset(BETA);
    /* the sampling settings, each its option (min_p null: none, no setting) */
    assert_int_equal(mp_recipe_read_as(D "trl-grpo-sampling.yaml", -1, MP_TRAINER_GRPO, &r, &d), MP_OK);
    expect(TEMPERATURE, "0.7", KEY, "temperature", 12);
    expect(TOP_P, "0.95", KEY, "top_p", 13);
    expect(TOP_K, "50", KEY, "top_k", 14);
    expect(REP_PENALTY, "1.05", KEY, "repetition_penalty", 16);
    expect(DS3_GATHER, "off", KEY, "ds3_gather_for_generation", 17);
    unset(MIN_P);
    unset(VLLM);
    /* read as SFTConfig, a GRPOConfig key is refused with the hint */
    assert_int_equal(mp_recipe_read(D "trl-grpo-vllm.yaml", -1, &r, &d), MP_ERR_MODEL);
    assert_non_null(strstr(d.msg, "give --trainer grpo"));
    assert_null(strchr(d.msg, '\n'));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_n_layers),  cmocka_unit_test(test_hf_json),          cmocka_unit_test(test_hf_yaml),
        cmocka_unit_test(test_trl_lora),         cmocka_unit_test(test_trl_qlora),
        cmocka_unit_test(test_trl_act_offload),
        cmocka_unit_test(test_axolotl_qlora),    cmocka_unit_test(test_axolotl_full),
        cmocka_unit_test(test_llamafactory_lora), cmocka_unit_test(test_llamafactory_defaults),
        cmocka_unit_test(test_torchtune_full),   cmocka_unit_test(test_loss_heads),   cmocka_unit_test(test_liger),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_optimizer_hf_names), cmocka_unit_test(test_write_recipe),
        cmocka_unit_test(test_trl_grpo),         cmocka_unit_test(test_axolotl_rl), cmocka_unit_test(test_lf_dpo), cmocka_unit_test(test_lf_kto),
    };
    return cmocka_run_group_tests_name("recipe", tests, NULL, NULL);
}
