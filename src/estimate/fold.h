/* fold.h — a long run of identical blocks (or units) evaluated through four of them (suggest at
 * scale).
 *
 * In a run of identical blocks (a "repeat") every copy lowers to the same program, shifted
 * (layers.c, "copies of a repeated block"); so does each block of a run of blocks that repeat
 * with a period p (alternating layers: sliding and global attention), shifted from the block
 * p before it.  Such a run is taken in units of p blocks (of one block for copies in a row).
 * Where a schedule also treats consecutive units alike (each op that touches one of them is
 * part of a run of alike steps, the ops in a row on one unit, over all of them, in order), the
 * replay of an interior unit is the replay of the unit before it, shifted: the same events,
 * and so the same bytes.  A fold stands each such interval of m >= 5 units for four of them:
 * its first unit, two interior ones and its last; the second interior one is weighted m - 3,
 * the copies it stands for.  The short model (a few thousand blocks at most) is lowered and
 * replayed once per evaluation instead of the full one, and mp_estimate_run_folded (fold_count.c)
 * counts each step on a weighted unit weight times in a row and each parameter, tensor or node
 * of one weight times in the sweeps outside the blocks' ops (setup, loss, optimizer step).
 *
 * The fold holds only if the short build made each weighted block as a verified copy of the
 * block it repeats (mp_program.copied: same lowering, same builder state before and after), and
 * the two interior units' steps made the same events: the estimator checks both and says when
 * they do not, and the caller then evaluates the full model.
 *
 * A fold of a fold (mp_fold_make_nested): sqrt's plan checkpoints segments of S blocks, which
 * cut the runs of units at every segment's ends, so one fold keeps a few units per segment (some
 * 9,500 blocks of gemma-3 with 100,000 layers: S = 315, units of 6).  Super-units of lcm(S, p)
 * blocks from a segment's start repeat exactly, blocks and schedule alike: they are folded the
 * same way (a step on a super-unit holds whole steps on its units), and the short model of that
 * fold is folded again in the run's units (a few hundred blocks in all).  The estimator counts a
 * step on a weighted unit inside a step on a weighted super-unit, and checks both levels. */
#ifndef MP_FOLD_H
#define MP_FOLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt/ckpt.h"
#include "ir/layers.h"
#include "model/model.h"

/* Intervals shorter than this (in units) are not folded (nothing to gain). */
#define MP_FOLD_MIN_RUN 5

struct mp_fold {
    size_t n_full;            /* blocks of the full model */
    size_t n;                 /* blocks of the short model */
    struct mp_model model;    /* the short model: copies of n of the full model's blocks, whose
                                 layers stay the full model's (mp_fold_release frees the array) */
    size_t *full_of;          /* [n] the full block that short block j is (the first it stands for) */
    uint64_t *weight;         /* [n] the consecutive full units its unit stands for (1 but for the
                                 second interior unit of a folded interval) */
    uint32_t *short_of;       /* [n_full] the short block full block i is counted in */
    uint32_t *unit;           /* [n] the first short block of short block j's unit: a run of blocks
                                 that repeat with a period p is folded in units of p blocks (one
                                 block for copies in a row), all of a unit weighted alike */
    uint32_t *unit_len;       /* [n] the blocks of its unit */
    struct mp_schedule sched; /* the full schedule's ops on the short blocks: a run of steps over
                                 a weighted unit's copies is one step */
    size_t folded;            /* full blocks not replayed (the sum of weight - 1) */
    const struct mp_model *full; /* the full model */
    /* A fold of a fold (mp_fold_make_nested; NULL otherwise): weight is then the product of the
     * two folds' weights, and a step on a unit (level 0) runs step_w times; the super-units
     * (level 1) hold whole steps of units, and a step on one runs outer_w times. */
    uint64_t *step_w;         /* [n] */
    uint32_t *outer;          /* [n] short block j's super-unit (an id, consecutive ones differ
                                 by their length) */
    uint32_t *outer_len;      /* [n] its blocks in the full model */
    uint64_t *outer_w;        /* [n] */
};

void mp_fold_init(struct mp_fold *f);
void mp_fold_release(struct mp_fold *f);

/* Folds model m for schedule s (on m's n_blocks blocks; NULL: the no-checkpoint schedule).
 * f->folded 0: nothing to fold (f is still a valid fold, of m itself).  MP_ERR_NOMEM, or
 * MP_ERR_INTERNAL for a schedule that does not fit m. */
enum mp_status mp_fold_make(const struct mp_model *m, const struct mp_schedule *s, struct mp_fold *f,
                            struct mp_diag *d);

/* mp_fold_make, then, where s checkpoints segments of one length in a row over a run of blocks
 * that repeat (sqrt's plan), a fold of a fold where it has fewer short blocks (fold.c, "folds of
 * folds"): the segments' repeats folded, and each segment inside them.  Not for a data-parallel
 * plan (its weighted buckets take a weighted block's copies as consecutive). */
enum mp_status mp_fold_make_nested(const struct mp_model *m, const struct mp_schedule *s, struct mp_fold *f,
                                   struct mp_diag *d);

/* The full model's chain from the chain of f's short program (f made for the no-checkpoint
 * schedule): each full block takes the figures of the short block it is counted in.  false:
 * the two interior blocks of an interval differ (the fold does not hold), or out of memory
 * (*st says which: MP_OK for the first). */
bool mp_fold_expand_chain(const struct mp_fold *f, const struct mp_chain *shortc, struct mp_chain *full,
                          enum mp_status *st);

/* Was each weighted block of f's short program p (lowered from f.model) made as a verified copy
 * of the block it repeats (mp_program.copied)?  The fold cannot hold otherwise. */
bool mp_fold_copied(const struct mp_fold *f, const struct mp_program *p);

/* The full model's parameter counts from f's short program p: all (total_params), trainable and
 * LoRA adapter elements, each block of a weighted short block counted weight times.  false: they
 * overflow 64 bits. */
bool mp_fold_counts(const struct mp_fold *f, const struct mp_program *p, uint64_t *total, uint64_t *trainable,
                    uint64_t *adapter);

/* Steps come in levels: level 0 the ops in a row on one unit (one op for the loss), level 1
 * (folds of folds) the ops in a row on one super-unit.  How many levels f has (1 or 2). */
int mp_fold_levels(const struct mp_fold *f);

/* The length of the step at op k of f's short schedule. */
size_t mp_fold_step_len(const struct mp_fold *f, int level, size_t k);

/* Are short blocks a and b of one unit?  Is a's unit the one just before b's, of as many blocks? */
bool mp_fold_same_unit(const struct mp_fold *f, int level, uint32_t a, uint32_t b);
bool mp_fold_unit_before(const struct mp_fold *f, int level, uint32_t a, uint32_t b);

/* How many times in a row a step on short block j's unit runs; the full blocks of that unit. */
uint64_t mp_fold_step_weight(const struct mp_fold *f, int level, uint32_t j);
uint32_t mp_fold_unit_len(const struct mp_fold *f, int level, uint32_t j);

/* Did each weighted unit's step make the same events (sig: a hash of them, per op that starts a
 * step of the level) as the same step on the unit before it, the first interior one, next to it
 * in f's short schedule?  The fold holds only if so, at each level. */
bool mp_fold_steps_agree(const struct mp_fold *f, int level, const uint64_t *sig);

/* How many full blocks short block j (or -1: no block) stands for. */
uint64_t mp_fold_weight(const struct mp_fold *f, int j);

/* For a report of m at o: the short program of m's no-checkpoint fold, with its parameter
 * counts (total_params, trainable_params, adapter_params) and model the full model's: what a
 * report reads of a program (counts, options, a parameter's shape), without lowering every
 * block.  Where the fold does not hold, m's own program. */
enum mp_status mp_fold_report_program(const struct mp_model *m, const struct mp_build_opts *o, struct mp_program *p,
                                      struct mp_diag *d);

/* The chain's "repeated" marks (what the fixed plans read) from m itself. */
void mp_fold_mark_chain(const struct mp_model *m, struct mp_chain *c);

#endif
