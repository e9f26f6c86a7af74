/* recipe.h — a trainer's recipe read into memplan's settings (--recipe FILE).
 *
 * A recipe is the file a user launches: HF TrainingArguments (JSON as to_json_string() writes it,
 * or YAML as HfArgumentParser takes it), a TRL SFTConfig YAML (with its ModelConfig keys), an
 * Axolotl, LLaMA-Factory or torchtune YAML.  libyaml reads every one of them (JSON is YAML).
 * recipe.c walks the file's keys through one key table (recipe_keys.c): each memory-relevant key
 * sets a fact, or is refused; keys with no memory effect are accepted; keys the table does not
 * know are listed (--explain).  The trainer's defaults (one row per trainer and version, each
 * with its source) fill the facts the file leaves out, and the facts become memplan settings,
 * each an option of the command line (its value as the option takes it).
 */
#ifndef MEMPLAN_RECIPE_H
#define MEMPLAN_RECIPE_H

#include <stdbool.h>
#include <stddef.h>

#include "util/util.h"

/* The formats: X(id, --recipe-format name, the trainer and version whose defaults apply). */
#define MP_RECIPE_FORMATS(X)                                                   \
    X(HF, "hf", "transformers 5.24.0 Trainer (TrainingArguments)")             \
    X(TRL, "trl", "TRL 1.16.0 SFTTrainer (SFTConfig + ModelConfig)")          \
    X(AXOLOTL, "axolotl", "Axolotl 0.19.0")                                    \
    X(LLAMAFACTORY, "llamafactory", "LLaMA-Factory 0.9.5 (stage sft)")         \
    X(TORCHTUNE, "torchtune", "torchtune 0.6.1 (single-device recipes)")

enum mp_recipe_format {
#define MP_X(id, name, trainer) MP_RF_##id,
    MP_RECIPE_FORMATS(MP_X)
#undef MP_X
    MP_RF_N
};

int mp_recipe_format_parse(const char *s); /* -1 if unknown */
const char *mp_recipe_format_str(enum mp_recipe_format f);
const char *mp_recipe_format_names(const char *sep, const char *last);

/* The settings a recipe decides: X(id, the option of the command line that takes it, wired).
 * wired 0: memplan has no such option yet; a recipe whose value is not the one memplan plans
 * (recipe.c: NEUTRAL) is refused, naming the key.  Wiring it is this row (1) and the option. */
#define MP_RECIPE_SETTINGS(X)           \
    X(MODEL, "model", 1)                \
    X(BATCH, "batch", 1)                \
    X(GRAD_ACCUM, "grad-accum", 1)      \
    X(SEQ, "seq", 1)                    \
    X(PRECISION, "precision", 1)        \
    X(OPTIMIZER, "optimizer", 1)        \
    X(CHECKPOINT, "checkpoint", 1)      \
    X(ATTENTION, "attention", 1)        \
    X(USE_CACHE, "use-cache", 1)        \
    X(FINETUNE, "finetune", 1)          \
    X(LORA_R, "lora-r", 1)              \
    X(LORA_ALPHA, "lora-alpha", 1)      \
    X(LORA_DROPOUT, "lora-dropout", 1)  \
    X(LORA_TARGETS, "lora-targets", 1)  \
    X(LOSS, "loss", 1)                  \
    X(PACKING, "packing", 1)            \
    X(PADDING_FREE, "padding-free", 1)  \
    X(PRECOMPUTE_REF, "precompute-ref", 1)             \
    X(DISABLE_DROPOUT, "disable-dropout", 1)           \
    X(COMPLETION_LENGTH, "completion-length", 1)       \
    X(NUM_GENERATIONS, "num-generations", 1)           \
    X(STEPS_PER_GENERATION, "steps-per-generation", 1) \
    X(BETA, "beta", 1)                                 \
    X(VLLM, "vllm", 1)                                 \
    X(NUM_ITERATIONS, "num-iterations", 1)             \
    X(VLLM_IS_CORRECTION, "vllm-correction", 1)       \
    X(DS3_GATHER, "ds3-gather", 1)                     \
    X(TEMPERATURE, "temperature", 1)                   \
    X(TOP_P, "top-p", 1)                               \
    X(TOP_K, "top-k", 1)                               \
    X(MIN_P, "min-p", 1)                               \
    X(REP_PENALTY, "repetition-penalty", 1)            \
    X(QUANT_STORAGE, "quant-storage", 1)               \
    X(ACT_OFFLOAD, "act-offload", 1)

enum mp_recipe_setting_id {
#define MP_X(id, opt, wired) MP_RS_##id,
    MP_RECIPE_SETTINGS(MP_X)
#undef MP_X
    MP_RS_N
};

/* Where a setting's value came from. */
enum mp_recipe_src {
    MP_RSRC_KEY,          /* a key of the file */
    MP_RSRC_DEFAULT,      /* the trainer's default (the file leaves it out) */
    MP_RSRC_COMMAND_LINE, /* the command line overrode the recipe (cli sets it) */
    MP_RSRC_UNUSED,       /* the command searches it (suggest: batch) or does not take it */
};

struct mp_recipe_setting {
    bool set;
    enum mp_recipe_src src;
    char value[256];  /* as the option takes it: "8", "amp-bf16", "layers", "q_proj,v_proj" */
    char key[96];     /* the key that decided it ("bf16", "optimizer._component_"), or the default's */
    unsigned line;    /* its line in the file (1-based; 0: a default) */
};

struct mp_recipe {
    enum mp_recipe_format format;
    const char *trainer;          /* "TRL 1.16.0 SFTTrainer (SFTConfig + ModelConfig)" */
    char how[128];                /* "--recipe-format" or "detected: key 'base_model' (line 1)" */
    char path[1024];
    struct mp_recipe_setting s[MP_RS_N];
    /* A model loaded with dtype "auto" (transformers' default) trains in the checkpoint's dtype:
     * the precision for a float32 and for a bfloat16 checkpoint ("" and why: refused), which
     * mp_recipe_resolve_dtype picks once the model is known. */
    bool dtype_auto;
    char prec_auto[2][16], prec_auto_why[2][160];
    /* Liger's kernels (loss "liger"): given true, given false (MP_LK_* bits of util/sets.h), unset
     * off (Axolotl) or at the model's defaults (transformers), and the key that turned it on */
    unsigned liger_on, liger_off;
    bool liger_unset_off;
    char liger_where[1280];
    size_t n_nomem;               /* keys accepted as having no memory effect */
    size_t n_unknown;
    char unknown[2048];           /* "key (line N), ..." */
    char explain[16384];          /* one line per key: how it was read */
};

const char *mp_recipe_setting_option(enum mp_recipe_setting_id id);
bool mp_recipe_setting_wired(enum mp_recipe_setting_id id);

/* Reads path in format (-1: detect it from the keys) into r.  MP_OK, else MP_ERR_IO /
 * MP_ERR_JSON (not YAML, not a mapping), MP_ERR_MODEL (a refused key or value) with a one-line
 * message "PATH:LINE: KEY: why" in d; r's settings are filled as far as they go even then (tests
 * read them). */
enum mp_status mp_recipe_read(const char *path, int format, struct mp_recipe *r, struct mp_diag *d);
/* The same for trainer t (--trainer): a TRL file is then that trainer's config (DPOConfig,
 * KTOConfig, GRPOConfig, whose own keys only it reads; mp_recipe_read reads SFTConfig). */
enum mp_status mp_recipe_read_as(const char *path, int format, enum mp_trainer t, struct mp_recipe *r,
                                 struct mp_diag *d);

/* Settles a recipe's dtype "auto" from the model's config.json (its "dtype" or "torch_dtype";
 * none: float32, from_pretrained's fallback): the precision setting takes the candidate.  MP_OK,
 * or MP_ERR_MODEL (a float16 checkpoint, a refused candidate) with the message in d. */
enum mp_status mp_recipe_resolve_dtype(struct mp_recipe *r, const char *model_file, struct mp_diag *d);

/* The recipe handed back (suggest --recipe F --write-recipe OUT, recipe_write.c): one key of the
 * file to set so that it runs the plan. */
struct mp_recipe_change {
    enum mp_recipe_setting_id id; /* MP_RS_BATCH or MP_RS_GRAD_ACCUM */
    char key[96];                 /* the file's key ("micro_batch_size") */
    unsigned line;                /* where the file has it (1-based; 0: absent, added) */
    char from[256];               /* its value now (the trainer's default where absent) */
    char to[32];                  /* the plan's */
};
#define MP_RECIPE_MAX_CHANGES 2

/* The keys of r's file to change for micro-batch batch and accumulation accum (the unchanged
 * ones left out): their number. */
size_t mp_recipe_changes(const struct mp_recipe *r, uint64_t batch, uint64_t accum,
                         struct mp_recipe_change out[MP_RECIPE_MAX_CHANGES]);
/* Writes r's file with the n changes made to out_path, the rest byte for byte, after reading
 * the result back as r's format for trainer t: it must say the changes' values.  MP_OK, else
 * MP_ERR_IO, MP_ERR_MODEL (a key not changeable in place: "PATH:LINE: KEY: ...") or
 * MP_ERR_INTERNAL, with out_path untouched. */
enum mp_status mp_recipe_write(const struct mp_recipe *r, enum mp_trainer t, const struct mp_recipe_change *ch,
                               size_t n, const char *out_path, struct mp_diag *d);

#endif
