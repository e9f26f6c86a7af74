/* test_sets.c — the closed sets of util/sets.h: every member's name parses back to it, names
 * are unique, unknown names are refused, and the columns that name things outside memplan
 * name real ones (transformers' TrainingArguments optim values).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ir/layers.h"

/* transformers' OptimizerNames (training_args.py) that memplan may write */
static const char *const HF_OPTIM[] = {"adamw_torch",      "adamw_torch_fused", "adafactor",        "sgd",
                                       "adamw_bnb_8bit",   "adamw_8bit",        "paged_adamw_8bit", "paged_adamw_32bit",
                                       "adagrad",          "rmsprop",           "lion_8bit",        "paged_lion_8bit",
                                       "adamw_torch_8bit", "adamw_torch_4bit"};

static bool hf_optim_known(const char *s)
{
    for (size_t i = 0; i < sizeof HF_OPTIM / sizeof HF_OPTIM[0]; i++)
        if (strcmp(s, HF_OPTIM[i]) == 0)
            return true;
    return false;
}

/* Whether the space-separated list has the word w (the test's own reading of the column). */
static bool has_word(const char *list, const char *w)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save))
        if (!strcmp(t, w))
            return true;
    return false;
}

static void test_optimizers(void **state)
{
    (void)state;
    static const enum mp_optimizer all[] = {
#define MP_X(id, name, st, tmp, wd, hf, aliases, probe, par) MP_OPT_##id,
        MP_OPTIMIZERS(MP_X)
#undef MP_X
    };
    static const char *const names[] = {
#define MP_X(id, name, st, tmp, wd, hf, aliases, probe, par) name,
        MP_OPTIMIZERS(MP_X)
#undef MP_X
    };
    static const char *const aliases[] = {
#define MP_X(id, name, st, tmp, wd, hf, aliases, probe, par) aliases,
        MP_OPTIMIZERS(MP_X)
#undef MP_X
    };
    size_t n = sizeof all / sizeof all[0];
    for (size_t i = 0; i < n; i++) {
        assert_int_equal((int)all[i], (int)i); /* enum values are row positions */
        assert_string_equal(mp_optimizer_str(all[i]), names[i]);
        assert_int_equal(mp_optimizer_parse(names[i]), (int)all[i]);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(names[i], names[j]);
        /* (an empty HF name: transformers 5.24 has no optim for it, torch.optim.Muon) */
        if (mp_optimizer_hf(all[i])[0] && !hf_optim_known(mp_optimizer_hf(all[i])))
            fail_msg("%s: %s is not a transformers optim", names[i], mp_optimizer_hf(all[i]));
        if (!mp_optimizer_hf(all[i])[0] && strcmp(names[i], "muon") != 0)
            fail_msg("%s: no HF optim name", names[i]);
        /* each HF name of the aliases column is a transformers optim and selects this row only */
        char words[256];
        snprintf(words, sizeof words, "%s", aliases[i]);
        for (char *save = NULL, *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save)) {
            if (!hf_optim_known(w))
                fail_msg("%s: alias %s is not a transformers optim", names[i], w);
            assert_int_equal(mp_optimizer_parse(w), (int)all[i]);
            for (size_t j = 0; j < n; j++)
                if (j != i && (has_word(aliases[j], w) || !strcmp(names[j], w)))
                    fail_msg("%s: alias %s also names %s", names[i], w, names[j]);
        }
    }
    assert_string_equal(mp_optimizer_str((enum mp_optimizer)n), "?");
    assert_int_equal(mp_optimizer_parse("adamw_torch_fuse"), -1); /* whole words only */
    assert_int_equal(mp_optimizer_parse("torch"), -1);
    assert_int_equal(mp_optimizer_parse(""), -1);
    assert_int_equal(mp_optimizer_parse("galore_adamw"), -1); /* a transformers optim memplan does not model */
    /* HF's names select the rows (transformers 5.24 training_args.py OptimizerNames and
     * trainer_optimizer.py: adamw_8bit is an alias of adamw_bnb_8bit, adamw_torch is torch's
     * default (foreach) AdamW) */
    assert_int_equal(mp_optimizer_parse("adamw_torch"), MP_OPT_ADAMW);
    assert_int_equal(mp_optimizer_parse("adamw_torch_fused"), MP_OPT_ADAMW_FUSED);
    assert_int_equal(mp_optimizer_parse("adamw_8bit"), MP_OPT_ADAM8BIT);
    assert_int_equal(mp_optimizer_parse("adamw_bnb_8bit"), MP_OPT_ADAM8BIT);
    assert_int_equal(mp_optimizer_parse("paged_adamw_8bit"), MP_OPT_PAGED_ADAM8BIT);
    assert_int_equal(mp_optimizer_parse("lion_8bit"), MP_OPT_LION8BIT);
    assert_int_equal(mp_optimizer_parse("paged_lion_8bit"), MP_OPT_PAGED_LION8BIT);
    assert_int_equal(mp_optimizer_parse("adamw_torch_8bit"), MP_OPT_ADAMW8BIT_AO);
    assert_int_equal(mp_optimizer_parse("adamw_torch_4bit"), MP_OPT_ADAMW4BIT_AO);
    /* the list the CLI prints: every name once, in table order */
    assert_string_equal(mp_optimizer_names(" | ", NULL),
                        "sgd | sgd-momentum | adam | adamw | adafactor | adam8bit | adamw-fused | paged-adam8bit | "
                        "lion8bit | paged-lion8bit | adamw8bit-ao | adamw4bit-ao | muon");
    assert_string_equal(mp_optimizer_names(", ", " or "),
                        "sgd, sgd-momentum, adam, adamw, adafactor, adam8bit, adamw-fused, paged-adam8bit, lion8bit, "
                        "paged-lion8bit, adamw8bit-ao, adamw4bit-ao or muon");
    /* the HF names it also takes, a row's own name (sgd, adafactor) not repeated */
    assert_string_equal(mp_optimizer_hf_names(", ", " or "),
                        "adamw_torch, adamw_bnb_8bit, adamw_8bit, adamw_torch_fused, paged_adamw_8bit, lion_8bit, "
                        "paged_lion_8bit, adamw_torch_8bit or adamw_torch_4bit");
    /* the state a user pays for: Adam keeps two tensors per parameter, SGD none */
    assert_int_equal(mp_optimizer_state(MP_OPT_ADAMW), MP_OPT_STATE_TWO);
    assert_int_equal(mp_optimizer_state(MP_OPT_SGD), MP_OPT_STATE_NONE);
    assert_int_equal(mp_optimizer_tmp(MP_OPT_ADAM), MP_OPT_TMP_ALL_GRADS);
    /* torch's fused AdamW updates in place: its state, no temporaries; HF's default optim */
    assert_int_equal(mp_optimizer_state(MP_OPT_ADAMW_FUSED), MP_OPT_STATE_TWO);
    assert_int_equal(mp_optimizer_tmp(MP_OPT_ADAMW_FUSED), MP_OPT_TMP_NONE);
    assert_string_equal(mp_optimizer_hf(MP_OPT_ADAMW_FUSED), "adamw_torch_fused");
    assert_true(mp_optimizer_decoupled_wd(MP_OPT_ADAMW_FUSED) && !mp_optimizer_decoupled_wd(MP_OPT_ADAM));
    /* bitsandbytes' 8-bit kernels update in place; paged rows keep the same state as theirs;
     * Lion one state; torchao two, with its compiled step's temporaries */
    assert_int_equal(mp_optimizer_state(MP_OPT_PAGED_ADAM8BIT), mp_optimizer_state(MP_OPT_ADAM8BIT));
    assert_int_equal(mp_optimizer_state(MP_OPT_PAGED_LION8BIT), MP_OPT_STATE_BNB8_1);
    assert_int_equal(mp_optimizer_tmp(MP_OPT_LION8BIT), MP_OPT_TMP_NONE);
    assert_int_equal(mp_optimizer_tmp(MP_OPT_ADAMW4BIT_AO), MP_OPT_TMP_LARGEST_2F32);
    /* the snippets write the HF names */
    assert_string_equal(mp_optimizer_hf(MP_OPT_PAGED_ADAM8BIT), "paged_adamw_8bit");
    assert_string_equal(mp_optimizer_hf(MP_OPT_ADAMW4BIT_AO), "adamw_torch_4bit");
    /* the probe runs the rows whose arithmetic its backends have */
    assert_string_equal(mp_optimizer_probe_names(),
                        "sgd, sgd-momentum, adam, adamw, adafactor, adam8bit, adamw-fused and paged-adam8bit");
    assert_string_equal(mp_optimizer_par_probe_names(), "sgd, sgd-momentum, adam and adamw");
}

static void test_precisions_dtypes_attention(void **state)
{
    (void)state;
    static const char *const prec[] = {
#define MP_X(id, name) name,
        MP_PRECISIONS(MP_X)
#undef MP_X
    };
    for (size_t i = 0; i < sizeof prec / sizeof prec[0]; i++) {
        assert_int_equal(mp_precision_parse(prec[i]), (int)i);
        assert_string_equal(mp_precision_str((enum mp_precision)i), prec[i]);
    }
    assert_int_equal(mp_precision_parse("mixed-bf16"), -1); /* the command line's, not a precision */
    assert_string_equal(mp_precision_names(" | ", NULL), "fp32 | amp-bf16 | amp-fp16 | bf16 | bf16-amp");
    static const struct {
        enum mp_dtype t;
        const char *name;
        uint64_t bytes;
    } dt[] = {
#define MP_X(id, name, bytes) {MP_DT_##id, name, bytes},
        MP_DTYPES(MP_X)
#undef MP_X
    };
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        assert_string_equal(mp_dtype_str(dt[i].t), dt[i].name);
        assert_int_equal(mp_dtype_size(dt[i].t), dt[i].bytes);
    }
    assert_int_equal(mp_dtype_size(MP_DT_BF16), 2);
    assert_int_equal(mp_dtype_size(MP_DT_I64), 8);
    static const char *const attn[] = {
#define MP_X(id, name) name,
        MP_ATTN_IMPLS(MP_X)
#undef MP_X
    };
    for (size_t i = 0; i < sizeof attn / sizeof attn[0]; i++) {
        assert_int_equal(mp_attn_impl_parse(attn[i]), (int)i);
        assert_string_equal(mp_attn_impl_str((enum mp_attn_impl)i), attn[i]);
    }
    assert_int_equal(mp_attn_impl_parse("flash_attention_2"), -1);
    assert_string_equal(mp_attn_impl_names(", ", " or "), "sdpa, flash or eager");
}

/* --trainer: the names in the table's order; all but orpo modelled, orpo refused with a reason; DPO's example is a pair (chosen, rejected): 2 sequences; KTO's one, 2 examples at least
 * (trl kto_trainer.py:844-847), a KL forward of the policy and two of the reference a step
 * (:1337-1368, :1425-1436); TRL's config classes by name */
static void test_trainers(void **state)
{
    (void)state;
    assert_string_equal(mp_trainer_names(", ", " or "), "sft, dpo, kto, kto-apo, orpo or grpo");
    for (int i = 0; i <= MP_TRAINER_GRPO; i++) {
        assert_int_equal(mp_trainer_parse(mp_trainer_str((enum mp_trainer)i)), i);
        assert_null(mp_trainer_unmodelled((enum mp_trainer)i));
    }
    assert_int_equal(mp_trainer_parse("ppo"), -1);
    assert_int_equal(mp_trainer_seqs(MP_TRAINER_SFT), 1);
    assert_int_equal(mp_trainer_seqs(MP_TRAINER_DPO), 2);
    assert_int_equal(mp_trainer_seqs(MP_TRAINER_KTO), 1);
    assert_int_equal(mp_trainer_min_batch(MP_TRAINER_DPO, MP_LOSS_CHUNKED_NLL), 1);
    assert_int_equal(mp_trainer_min_batch(MP_TRAINER_KTO, MP_LOSS_CHUNKED_NLL), 2);
    /* LLaMA-Factory's KTO (--loss hf): its preprocessing makes the KL rows (feedback.py), no floor */
    assert_int_equal(mp_trainer_min_batch(MP_TRAINER_KTO, MP_LOSS_HF), 1);
    assert_int_equal(mp_trainer_ref_fwds(MP_TRAINER_SFT), 0);
    assert_int_equal(mp_trainer_ref_fwds(MP_TRAINER_DPO), 1);
    assert_int_equal(mp_trainer_ref_fwds(MP_TRAINER_KTO), 2);
    assert_int_equal(mp_trainer_kl_fwds(MP_TRAINER_KTO), 1);
    assert_int_equal(mp_trainer_kl_fwds(MP_TRAINER_DPO), 0);
    assert_string_equal(mp_trainer_config(MP_TRAINER_KTO), "KTOConfig");
    /* GRPOConfig's disable_dropout defaults to False (trl 1.16 grpo_config.py), DPOConfig's and
     * KTOConfig's to True; GRPO's one reference forward exists only at beta > 0 (setup) */
    assert_true(mp_trainer_drops_dropout(MP_TRAINER_DPO) && mp_trainer_drops_dropout(MP_TRAINER_KTO));
    assert_false(mp_trainer_drops_dropout(MP_TRAINER_GRPO) || mp_trainer_drops_dropout(MP_TRAINER_SFT));
    assert_string_equal(mp_trainer_config(MP_TRAINER_GRPO), "GRPOConfig");
    assert_string_equal(mp_trainer_config(MP_TRAINER_DPO), "DPOConfig");
    /* KTO's apo_zero_unpaired: no KL term (kto_trainer.py:815, 836, 844): one example is enough, no KL
     * forward, one reference forward (the batch); the same config class with its loss_type */
    assert_int_equal(mp_trainer_min_batch(MP_TRAINER_KTO_APO, MP_LOSS_CHUNKED_NLL), 1);
    assert_int_equal(mp_trainer_kl_fwds(MP_TRAINER_KTO_APO), 0);
    assert_int_equal(mp_trainer_ref_fwds(MP_TRAINER_KTO_APO), 1);
    assert_string_equal(mp_trainer_config(MP_TRAINER_KTO_APO), "KTOConfig");
    assert_string_equal(mp_trainer_loss_type(MP_TRAINER_KTO_APO), "apo_zero_unpaired");
    assert_null(mp_trainer_loss_type(MP_TRAINER_KTO));
    assert_string_equal(mp_ref_mode_str(MP_REF_ADAPTER), "adapter-disabled");
    /* ORPO (trl 1.16 experimental/orpo): chosen and rejected concatenated (orpo_trainer.py:606-668),
     * no reference model, ORPOConfig's disable_dropout defaults to True (orpo_config.py) */
    assert_int_equal(mp_trainer_seqs(MP_TRAINER_ORPO), 2);
    assert_int_equal(mp_trainer_ref_fwds(MP_TRAINER_ORPO), 0);
    assert_int_equal(mp_trainer_kl_fwds(MP_TRAINER_ORPO), 0);
    assert_true(mp_trainer_drops_dropout(MP_TRAINER_ORPO));
    assert_string_equal(mp_trainer_config(MP_TRAINER_ORPO), "ORPOConfig");
}

static void test_activations(void **state)
{
    (void)state;
    static const char *const names[] = {
#define MP_X(id, name, aliases, saves, extras, amp32, bwd, fwd) name,
        MP_ACTIVATIONS(MP_X)
#undef MP_X
    };
    assert_int_equal(sizeof names / sizeof names[0], MP_ACT_COUNT);
    for (int i = 0; i < MP_ACT_COUNT; i++) {
        assert_int_equal(mp_act_parse(names[i]), i);
        assert_string_equal(mp_act_str((enum mp_act)i), names[i]);
    }
    assert_int_equal(mp_act_parse("swish"), MP_ACT_SILU);             /* HF's alias */
    assert_int_equal(mp_act_parse("gelu_pytorch_tanh"), MP_ACT_GELU_TANH);
    assert_int_equal(mp_act_parse("mish"), -1);
    /* the list users are shown when a name is wrong has every row */
    assert_string_equal(mp_act_names(),
                        "gelu, gelu_tanh, relu, silu, tanh, sigmoid, gelu_new, gelu_fast, relu2, xielu or "
                        "quick_gelu");
}

/* docs/model-format.md's activation row names every activation of the table (`name`). */
static void test_model_format_lists_every_activation(void **state)
{
    (void)state;
    FILE *f = fopen("docs/model-format.md", "r");
    assert_non_null(f);
    char line[8192], row[8192] = "";
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "| `act` | req. |", 16) == 0)
            snprintf(row, sizeof row, "%s", line);
    fclose(f);
    if (!row[0])
        fail_msg("docs/model-format.md has no activation row (| `act` | req. |)");
    static const char *const names[] = {
#define MP_X(id, name, aliases, saves, extras, amp32, bwd, fwd) "`" name "`",
        MP_ACTIVATIONS(MP_X)
#undef MP_X
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strstr(row, names[i]))
            fail_msg("docs/model-format.md's activation row lacks %s", names[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_optimizers),
        cmocka_unit_test(test_precisions_dtypes_attention),
        cmocka_unit_test(test_trainers),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_model_format_lists_every_activation),
    };
    return cmocka_run_group_tests_name("sets", tests, NULL, NULL);
}
