/* probe_par.h — the probe of one data-parallel rank (parallel.h).
 *
 * The replay of rank r (estimate/replay_par.c) allocates what that rank holds: its shards, the
 * all-gather and reduce-scatter buffers, the DDP buckets, the DeepSpeed partitions
 * (MP_ST_COMM), at their events.  The executor (probe.c) allocates each of them from
 * its counting pool, so the measured peak is rank r's; this file gives those buffers
 * their contents and runs every collective as a local copy of the right size, as if
 * every rank held the same data as rank r:
 *   all-gather      every rank's slot of the output gets rank r's shard;
 *   reduce-scatter  rank r's output is the sum of the input's world chunks (the
 *                   gradient of the shard, which is used in every slot);
 *   all-reduce      the bucket gets the gradients and gives them back.
 * Nodes compute with the gathered parameters; the optimizer steps rank r's shard or
 * partition with its state, and the next all-gather spreads it.  So the step is a real
 * training step of a model whose parameters repeat rank r's shard, and the memory is
 * exactly rank r's.  Storages are read and written in host memory: a backend whose
 * storages are device memory (upload set) moves them through download/upload.
 * Private to probe.c; no printing, no exit.
 */
#ifndef MEMPLAN_PROBE_PAR_H
#define MEMPLAN_PROBE_PAR_H

#include "probe_impl.h"

struct mp_par_exec;

/* The data-parallel state of executor x (x->t.par set, strategy not none).  MP_ERR_UNSUPPORTED
 * (with the reason) for what the per-rank probe does not run: offload, fine-tuning modes,
 * optimizers other than sgd / sgd-momentum / adam / adamw, a backend without download. */
enum mp_status mp_par_exec_new(struct mp_exec *x, struct mp_diag *d);
void mp_par_exec_free(struct mp_par_exec *px); /* NULL-safe */

/* Parameter q as the node computes with it: the gathered copy when q is sharded. */
struct mp_view mp_par_exec_param(const struct mp_exec *x, int q);

/* After a fresh ALLOC of ev (ptr its storage): the contents of a shard or a communication
 * buffer, and the collective that fills it.  *handled false: the executor's own
 * initialisation applies (a replicated parameter, a gradient, an activation...). */
enum mp_status mp_par_exec_alloc(struct mp_exec *x, const struct mp_event *ev, void *ptr, bool *handled);
/* Before a FREE of ev: a gradient about to go is reduced into its partition first. */
enum mp_status mp_par_exec_free_event(struct mp_exec *x, const struct mp_event *ev);
/* The optimizer step of rank r (OPT_STEP). */
enum mp_status mp_par_exec_opt(struct mp_exec *x);

#endif
