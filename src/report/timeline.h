/* timeline.h — a training step's memory as a picture: one self-contained SVG.
 *
 * mp_timeline_svg() replays the step (estimate.h mp_replay) and draws the live
 * bytes after every allocation and free, stacked by category, with the phases
 * (forward, loss, recompute, backward, optimizer step) as bands, the peak and
 * its event labelled, the target's capacity and margin as lines, recomputed
 * forwards shaded, and a zoom on the events around the peak, so a 100-layer
 * model stays readable.  Bytes are counted as the estimator counts them
 * (512-byte rounding), so the labelled peak is peak_allocated_bytes.
 * Writes only to the FILE given; no printing elsewhere, no exit.
 */
#ifndef MEMPLAN_TIMELINE_H
#define MEMPLAN_TIMELINE_H

#include <stdio.h>

#include "estimate/estimate.h"

struct mp_timeline_opts {
    const char *title;        /* first line, e.g. "gpt2-124m: estimate" (may be NULL) */
    const char *subtitle;     /* second line: the configuration (may be NULL) */
    uint64_t context_bytes;   /* CUDA context, stacked under the allocations (0 = not drawn) */
    uint64_t nccl_bytes;      /* NCCL's buffers, part of context_bytes (0: none; the legend says) */
    uint64_t capacity_bytes;  /* the target's memory (0 = no target: no capacity lines) */
    double margin;            /* safety margin, a fraction of capacity */
    /* probe: the measured allocated bytes after each ALLOC/FREE event of one
     * measured step, in replay order (NULL = none) */
    const uint64_t *measured;
    size_t n_measured;
};

/* Writes the SVG for program p run through sched (NULL = no checkpointing)
 * with training options t.  MP_ERR_NOMEM / MP_ERR_IO (d says why). */
enum mp_status mp_timeline_svg(FILE *out, const struct mp_program *p, const struct mp_schedule *sched,
                               const struct mp_train_opts *t, const struct mp_timeline_opts *o, struct mp_diag *d);

/* Writes s with XML's five special characters escaped, control characters (but tab; C1
 * too) and bytes that are not valid UTF-8 replaced by '?'. */
void mp_xml_puts(FILE *out, const char *s);

#endif
