/* search.c — fit evaluation, largest micro-batch, and the recommendation.
 *
 * One judge (mp_fit_eval) for check, plan and suggest.  The batch search
 * finds a boundary (b* fits, b*+1 does not) by extrapolating and then
 * interpolating the peak — memory is near-affine in batch while the plan
 * does not change — with bisection as the fallback (mp_search_max_batch
 * says what the answer promises).  Throughput without a
 * GPU is an estimate: FLOPs / (MP_MATMUL_EFFICIENCY x the profile's dense
 * TFLOP/s) plus the optimizer step's memory traffic over the bandwidth.
 */
#include "search.h"

#include "estimate/estimate.h"
#include "search/nccl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mp_fit_release(struct mp_fit *f)
{
    if (!f)
        return;
    mp_estimate_release(&f->est);
    mp_ckpt_plan_release(&f->plan);
    mp_chain_release(&f->chain);
    mp_program_release(&f->prog);
}

static uint64_t sub0(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

static double step_seconds(const struct mp_job *job, const struct mp_estimate *e, bool *nominal)
{
    double tfl = mp_gpu_tflops(&job->gpu, job->build.precision);
    *nominal = tfl <= 0;
    if (tfl <= 0)
        tfl = 100.0; /* no profile figure (--vram): a nominal card, for ranking only */
    double flops = e->fwd_flops + e->bwd_flops + e->recompute_flops;
    double t = flops / (MP_MATMUL_EFFICIENCY * tfl * 1e12);
    /* a quantized base's dequantization is memory-bound: at the profile's bandwidth (1000 GB/s
     * without one), as the optimizer's step */
    double bw = job->gpu.bandwidth_gbs > 0 ? job->gpu.bandwidth_gbs : 1000.0;
    return t + e->dequant_bytes / (bw * 1e9);
}

/* GRPO's generation by transformers' generate, once per steps_per_generation x num_iterations
 * micro-steps: the prefill's forward FLOPs (the step's forward, per token, over the generation
 * batch's prompts) and C - 1 decoding steps, each the larger of its forward FLOPs and reading
 * every weight and the cache so far (the cache grows from the prompt's to kv_last).  A roofline
 * estimate for ranking (not measured); a colocated vLLM's own time is not counted.  Seconds. */
static double gen_seconds(const struct mp_job *job, const struct mp_estimate *e)
{
    const struct mp_train_opts *t = &job->train;
    if (!t->gen_steps || !e->gen_batch || !job->build.seq || !job->build.batch)
        return 0;
    double tfl = mp_gpu_tflops(&job->gpu, job->build.precision);
    if (tfl <= 0)
        tfl = 100.0;
    double bw = job->gpu.bandwidth_gbs > 0 ? job->gpu.bandwidth_gbs : 1000.0;
    double P = (double)t->gen_prompt, C = (double)t->gen_completion, T = P + C - 1;
    double per_tok = e->fwd_flops / mp_fwd_passes(job->build.trainer, t) /
                     ((double)job->build.batch * (double)job->build.seq); /* (one forward's, a token's) */
    double rate = MP_MATMUL_EFFICIENCY * tfl * 1e12, g = (double)e->gen_batch;
    double prefill = per_tok * g * P / rate;
    double kv_avg = T > 0 ? (double)e->gen_kv_bytes * (P + T) / (2.0 * T) : 0; /* (the cache's mean length) */
    double step = fmax(per_tok * g / rate, ((double)e->weights_bytes + kv_avg) / (bw * 1e9));
    return prefill + (C > 1 ? (C - 1) * step : 0);
}

/* Collectives and offload for one step (parallel.h); compute_s is forward + backward. */
static void par_seconds(const struct mp_job *job, const struct mp_estimate *e, double compute_s, struct mp_fit *f)
{
    const struct mp_parallel *par = job->train.par;
    if (!par || par->strategy == MP_PAR_NONE) {
        /* one GPU: only --checkpoint layers+offload moves bytes over PCIe (estimate.c), on the
         * compute stream (transformers 5.24 modeling_utils.py:3135-3136), so not overlapped;
         * 16 GB/s without a profile figure, as mp_par_time */
        double pcie = job->gpu.pcie_gbs > 0 ? job->gpu.pcie_gbs : 16;
        f->offload_s = f->est.offload_s = e->pcie_bytes / (pcie * 1e9);
        return;
    }
    struct mp_par_plan tp;
    memset(&tp, 0, sizeof tp);
    tp.par = *par;
    tp.world = e->world;
    tp.n_groups = e->n_groups;
    tp.n_buckets = par->strategy == MP_PAR_DDP ? (size_t)(e->buffers_bytes / par->ddp_bucket_cap_bytes) + 1 : 1;
    tp.allgather_bytes = e->allgather_bytes;
    tp.reducescatter_bytes = e->reducescatter_bytes;
    tp.allreduce_bytes = e->allreduce_bytes;
    tp.pcie_bytes = e->pcie_bytes;
    tp.host_step_elems = e->host_step_elems;
    struct mp_links l = {.intra_gbs = job->gpu.nvlink_gbs > 0 ? job->gpu.nvlink_gbs : job->gpu.pcie_gbs,
                         .inter_gbs = job->gpu.ib_gbs, .pcie_gbs = job->gpu.pcie_gbs,
                         .host_adam_gparams = MP_HOST_ADAM_GPARAMS};
    double bwd = e->fwd_flops + e->bwd_flops > 0 ? (e->bwd_flops + e->recompute_flops) /
                                                       (e->fwd_flops + e->bwd_flops + e->recompute_flops)
                                                 : 0.66;
    struct mp_par_time t;
    mp_par_time(&tp, &l, compute_s, bwd, &t);
    f->comm_s = t.comm_s;
    f->exposed_comm_s = t.exposed_comm_s;
    f->offload_s = t.offload_s;
    f->est.comm_s = t.comm_s;
    f->est.exposed_comm_s = t.exposed_comm_s;
    f->est.offload_s = t.offload_s;
}

static double opt_seconds(const struct mp_job *job, const struct mp_estimate *e)
{
    double bw = job->gpu.bandwidth_gbs > 0 ? job->gpu.bandwidth_gbs : 1000.0;
    /* the step reads params, grads and state and writes params and state */
    double bytes = 2.0 * (double)e->weights_bytes + (double)e->grads_bytes + 2.0 * (double)e->optimizer_bytes;
    return bytes / (bw * 1e9);
}

/* ---- how a fit evaluates: the full program, or folds of it (fold.h) --------------------------- */

struct evalr {
    const struct mp_job *job;
    struct mp_build_opts bo;
    struct mp_program *prog, own; /* the full program (job->scratch, or own), once built */
    bool built;
    bool fold;                    /* folds are tried (until one does not hold) */
    struct mp_fold nf;            /* the fold for the no-checkpoint schedule (chain, static figures) */
    struct mp_program nprog, *np; /* its short program (np: job->fold_scratch[0], or &nprog) */
    bool nf_made;
    struct mp_program sprog, *sp; /* a fold's short program for a replay (job->fold_scratch[1], or &sprog) */
};

static bool fold_wanted(const struct mp_job *job)
{
    const struct mp_model *m = job->model;
    if (job->fold < 0 || job->keep_program || job->build.ft.mode == MP_FT_FREEZE)
        return false;
    return job->fold > 0 || m->n_blocks >= MP_FIT_FOLD_BLOCKS;
}

static enum mp_status ev_build(struct evalr *ev, struct mp_diag *d)
{
    if (ev->built)
        return MP_OK;
    ev->prog = ev->job->scratch && !ev->job->keep_program && !ev->job->keep_built ? ev->job->scratch : &ev->own;
    enum mp_status st = ev->prog == &ev->own ? mp_program_build(ev->job->model, &ev->bo, ev->prog, d)
                                             : mp_program_rebuild(ev->job->model, &ev->bo, ev->prog, d);
    ev->built = st == MP_OK;
    return st;
}

static void ev_release(struct evalr *ev, struct mp_fit *f, bool ok)
{
    if (ev->built && ev->prog == &ev->own && ok && (ev->job->keep_program || ev->job->keep_built))
        f->prog = ev->own;
    else if (ev->built && ev->prog == &ev->own)
        mp_program_release(&ev->own);
    mp_fold_release(&ev->nf);
    mp_program_release(&ev->nprog); /* (the scratch programs are the caller's) */
    mp_program_release(&ev->sprog);
}

/* The no-checkpoint fold and its short program. */
static enum mp_status ev_none_fold(struct evalr *ev, struct mp_diag *d)
{
    if (ev->nf_made)
        return MP_OK;
    enum mp_status st = mp_fold_make(ev->job->model, NULL, &ev->nf, d);
    if (st == MP_OK)
        st = ev->np->blocks ? mp_program_rebuild(&ev->nf.model, &ev->bo, ev->np, d)
                            : mp_program_build(&ev->nf.model, &ev->bo, ev->np, d);
    ev->nf_made = st == MP_OK;
    return st;
}

/* Is the whole program small enough for the caching-allocator model (MP_ASIM_MAX_NODES), which a
 * report of reserved bytes wants and folds do not run?  Counted from the no-checkpoint fold's
 * short program: each weighted block a verified copy, of its block's nodes. */
static bool ev_whole_for_reserved(const struct evalr *ev)
{
    if (ev->job->train.skip_reserved)
        return false;
    uint64_t nodes = ev->np->n_nodes, more;
    for (size_t j = 0; j < ev->nf.n && j < ev->np->n_blocks; j++)
        if (!mp_mul_u64(ev->np->blocks[j].n_nodes, ev->nf.weight[j] - 1, &more) || !mp_add_u64(nodes, more, &nodes))
            return false;
    return nodes <= MP_ASIM_MAX_NODES;
}

/* The chain (or only its marks, for a fixed plan's verdict). */
static enum mp_status ev_chain(struct evalr *ev, bool marks_only, struct mp_chain *c, struct mp_diag *d)
{
    enum mp_status st;
    if (marks_only) {
        if ((st = mp_chain_init(c, ev->job->model->n_blocks)) != MP_OK)
            return mp_fail(d, st, "out of memory");
        mp_fold_mark_chain(ev->job->model, c);
        return MP_OK;
    }
    if (ev->fold) {
        if ((st = ev_none_fold(ev, d)) != MP_OK)
            return st;
        struct mp_chain sc;
        /* (a replay with the allocator model folds nowhere: mp_estimate_run_folded) */
        if (mp_fold_copied(&ev->nf, ev->np) && !ev_whole_for_reserved(ev)) {
            if ((st = mp_estimate_chain(ev->np, &sc, d)) != MP_OK)
                return st;
            bool held = mp_fold_expand_chain(&ev->nf, &sc, c, &st);
            mp_chain_release(&sc);
            if (held) {
                mp_fold_mark_chain(ev->job->model, c);
                return MP_OK;
            }
            if (st != MP_OK)
                return mp_fail(d, st, "out of memory");
        }
        ev->fold = false;
    }
    if ((st = ev_build(ev, d)) != MP_OK)
        return st;
    return mp_estimate_chain(ev->prog, c, d);
}

static enum mp_status ev_static(struct evalr *ev, struct mp_estimate *e, struct mp_diag *d)
{
    enum mp_status st;
    if (ev->fold) {
        if ((st = ev_none_fold(ev, d)) != MP_OK)
            return st;
        bool holds;
        st = mp_estimate_static_folded(&ev->nf, ev->np, &ev->job->train, e, &holds, d);
        if (st != MP_OK || holds)
            return st;
        ev->fold = false;
    }
    if ((st = ev_build(ev, d)) != MP_OK)
        return st;
    return mp_estimate_static(ev->prog, &ev->job->train, e, d);
}

/* The step's replay with schedule s. */
static enum mp_status ev_run(struct evalr *ev, const struct mp_schedule *s, uint64_t context, const struct mp_chain *c,
                             struct mp_estimate *e, size_t *folded, struct mp_diag *d)
{
    enum mp_status st;
    /* folds of folds on one GPU (fold.h: not for a data-parallel plan); where one does not
     * hold, the one fold; where that does not, the whole model from then on */
    for (bool nested = !ev->job->train.par; ev->fold; nested = false) {
        struct mp_fold fd;
        if ((st = nested ? mp_fold_make_nested(ev->job->model, s, &fd, d) : mp_fold_make(ev->job->model, s, &fd, d)) !=
            MP_OK)
            return st;
        st = ev->sp->blocks ? mp_program_rebuild(&fd.model, &ev->bo, ev->sp, d)
                            : mp_program_build(&fd.model, &ev->bo, ev->sp, d);
        bool holds = false, two = mp_fold_levels(&fd) == 2;
        if (st == MP_OK)
            st = mp_estimate_run_folded(&fd, ev->sp, s, &ev->job->train, context,
                                        ev->job->verdict_only ? NULL : c, e, &holds, d);
        *folded = holds ? fd.folded : 0;
        mp_fold_release(&fd);
        if (st != MP_OK || holds)
            return st;
        if (!two)
            ev->fold = false;
    }
    if ((st = ev_build(ev, d)) != MP_OK)
        return st;
    return mp_estimate_run_chain(ev->prog, s, &ev->job->train, context, c, e, d);
}

/* mp_ckpt_plan_make for job's model: the planner's overflow (MP_ERR_RANGE) names the model file. */
static enum mp_status plan_make(const struct mp_job *job, const struct mp_chain *c, const struct mp_ckpt_spec *spec,
                                uint64_t budget, struct mp_ckpt_plan *p, struct mp_diag *d)
{
    enum mp_status st = mp_ckpt_plan_make(c, spec, budget, job->slots, p, d);
    if (st == MP_ERR_RANGE) {
        char why[sizeof d->msg];
        snprintf(why, sizeof why, "%s", d->msg);
        mp_fail(d, st, "%s: %s", job->model->path, why);
    }
    return st;
}

/* --checkpoint layers[:N]+sac:auto (docs/checkpointing.md#sac-auto): which candidate ops of a
 * decoder layer (mp_sac_candidate: SDPA, the Linears' matmuls; every layer alike) keep their outputs
 * to the recompute, for the least recompute FLOPs with the step within the usable bytes.  Each
 * subset of a layer's n candidates (n <= 16) costs the bytes it holds per layer and saves the FLOPs
 * of its ops; of the subsets holding as many bytes or fewer, the one saving the most FLOPs is the
 * best (the Pareto frontier, ascending in bytes).  The step's replayed peak grows with the bytes a
 * layer holds, so the last frontier point whose step fits (the fit's verdict: allocated and, where
 * simulated, reserved) is found by bisection: about log2 of the frontier's size replays.  f->plan.sched.sac_keep and f->est are that point's; none fitting (not
 * even keeping nothing) leaves nothing kept. */
#define SAC_AUTO_MAX 16
/* The fit's verdict on e (device_verdict's): allocated peak + context within the usable bytes and,
 * where the caching allocator ran, no failed allocation and reserved + context within them. */
static bool est_fits(const struct mp_estimate *e, uint64_t context, uint64_t usable)
{
    uint64_t dev;
    if (e->peak_device_bytes > usable)
        return false;
    return !e->alloc_simulated || (!e->alloc_ooms && mp_add_u64(e->peak_reserved_bytes, context, &dev) &&
                                   mp_add_u64(dev, e->vllm_bytes, &dev) && dev <= usable);
}

static enum mp_status sac_auto(struct evalr *ev, uint64_t context, struct mp_fit *f, struct mp_diag *d)
{
    const struct mp_program *p = ev->built ? ev->prog : ev->sp;
    size_t i0 = SIZE_MAX;
    int n = 0;
    for (size_t k = 0; k < p->n_nodes && (i0 == SIZE_MAX || p->nodes[k].block == (int)i0); k++)
        if (mp_sac_candidate(p, k, NULL) >= 0) {
            i0 = (size_t)p->nodes[k].block;
            n++;
        }
    if (n > SAC_AUTO_MAX)
        return mp_fail(d, MP_ERR_UNSUPPORTED, "%s: --checkpoint ...+sac:auto: %d candidate ops in a layer (at most "
                       "%d)", ev->job->model->path, n, SAC_AUTO_MAX);
    if (n == 0 || !est_fits(&f->est, context, f->usable_bytes))
        return MP_OK; /* nothing to keep, or nothing fits: the plain plan */
    size_t m = (size_t)1 << n, nf = 0;
    uint64_t *hb = malloc(m * sizeof *hb);
    double *fl = malloc(m * sizeof *fl);
    uint32_t *order = malloc(m * sizeof *order);
    if (!hb || !fl || !order) {
        free(hb), free(fl), free(order);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory planning selective checkpointing");
    }
    for (size_t s = 0; s < m; s++)
        mp_sac_block(p, MP_SAC_AUTO, s, i0, &hb[s], &fl[s]);
    /* the frontier: by bytes (fewer FLOPs saved first among equal bytes), a subset kept when it saves
     * more than every one before it */
    for (size_t s = 0; s < m; s++) {
        size_t at = nf;
        while (at > 0 && (hb[order[at - 1]] > hb[s] || (hb[order[at - 1]] == hb[s] && fl[order[at - 1]] > fl[s])))
            at--;
        memmove(&order[at + 1], &order[at], (nf - at) * sizeof *order);
        order[at] = (uint32_t)s;
        nf++;
    }
    size_t nfr = 0;
    for (size_t q = 0; q < nf; q++)
        if (nfr == 0 || fl[order[q]] > fl[order[nfr - 1]])
            order[nfr++] = order[q];
    /* bisection: order[lo] fits (subset 0's replay is f->est), order[hi] is past the last fit */
    size_t lo = 0, hi = nfr;
    struct mp_estimate best = f->est;
    enum mp_status st = MP_OK;
    while (hi - lo > 1 && st == MP_OK) {
        size_t mid = lo + (hi - lo) / 2;
        f->plan.sched.sac_keep = order[mid];
        struct mp_estimate e;
        size_t folded = 0;
        memset(&e, 0, sizeof e);
        if ((st = ev_run(ev, &f->plan.sched, context, &f->chain, &e, &folded, d)) != MP_OK)
            break;
        if (est_fits(&e, context, f->usable_bytes)) {
            mp_estimate_release(&best); /* (the first time f->est's: replaced below) */
            best = e;
            f->folded_blocks = folded;
            lo = mid;
        } else {
            mp_estimate_release(&e);
            hi = mid;
        }
    }
    f->plan.sched.sac_keep = order[lo];
    f->est = best;
    free(hb), free(fl), free(order);
    return st;
}

/* The sqrt plan in place of f's budgeted one (planned: f has one) where it fits and that does
 * not, or costs less; f->plan keeps the job's strategy as its name. */
static enum mp_status sqrt_floor(struct evalr *ev, const struct mp_job *job, uint64_t context, struct mp_fit *f,
                                 bool *planned, struct mp_diag *d)
{
    bool fits = *planned && f->est.peak_device_bytes <= f->usable_bytes;
    struct mp_ckpt_spec sqrt = {.strategy = MP_CKPT_SQRT, .k = 0};
    struct mp_ckpt_plan sp;
    mp_ckpt_plan_init(&sp);
    enum mp_status st = plan_make(job, &f->chain, &sqrt, 0, &sp, d);
    if (st != MP_OK || (fits && sp.total_cost >= f->plan.total_cost) ||
        (*planned && mp_schedule_equal(&sp.sched, &f->plan.sched))) { /* (the DP's plan is sqrt's) */
        mp_ckpt_plan_release(&sp);
        return st;
    }
    struct mp_estimate se;
    size_t folded = 0;
    memset(&se, 0, sizeof se);
    st = ev_run(ev, &sp.sched, context, &f->chain, &se, &folded, d);
    if (st == MP_OK && se.peak_device_bytes <= f->usable_bytes) {
        sp.spec = job->ckpt;
        sp.dp_group = f->plan.dp_group;
        mp_ckpt_plan_release(&f->plan);
        f->plan = sp;
        mp_estimate_release(&f->est);
        f->est = se;
        f->folded_blocks = folded;
        *planned = true;
        return MP_OK;
    }
    mp_estimate_release(&se);
    mp_ckpt_plan_release(&sp);
    return st;
}

/* The two verdicts: f->fits (allocated level) is kept as fits_allocated; where the caching
 * allocator ran, the device level (no allocation failed after its retry; peak reserved +
 * context within the usable bytes) decides f->fits. */
static void device_verdict(struct mp_fit *f, uint64_t context)
{
    f->fits_allocated = f->fits;
    f->device_simulated = f->est.alloc_simulated;
    if (!f->device_simulated)
        return;
    if (!mp_add_u64(f->est.peak_reserved_bytes, context, &f->device_bytes) ||
        !mp_add_u64(f->device_bytes, f->est.vllm_bytes, &f->device_bytes))
        f->device_bytes = UINT64_MAX;
    f->fits_device = !f->est.alloc_ooms && f->device_bytes <= f->usable_bytes;
    f->fits = f->fits_allocated && f->fits_device;
}

void mp_fit_build_opts(const struct mp_job *job, struct mp_build_opts *bo)
{
    *bo = job->build;
    bo->ft.input_grad = job->ckpt.strategy != MP_CKPT_NONE; /* transformers: enable_input_require_grads */
    bo->hf_checkpointing = job->ckpt.strategy == MP_CKPT_LAYERS; /* and use_cache off */
}

enum mp_status mp_fit_eval(const struct mp_job *job_in, struct mp_fit *f, struct mp_diag *d)
{
    memset(f, 0, sizeof *f);
    mp_ckpt_plan_init(&f->plan);
    f->capacity_bytes = mp_gpu_capacity(&job_in->gpu);
    /* NCCL's communicator buffers sit beside the CUDA context when there are peers: the
     * profile's measured figure, else modelled (search/nccl.h) */
    uint64_t context = job_in->gpu.context_bytes;
    struct mp_nccl_est nccl;
    mp_nccl_estimate(&job_in->gpu, job_in->train.par, job_in->train.nccl, &nccl);
    if (!mp_add_u64(context, nccl.bytes, &context))
        return mp_fail(d, MP_ERR_RANGE, "%s: the CUDA context (--context) of %llu bytes overflows 64 bits with "
                       "NCCL's buffers", job_in->model->path, (unsigned long long)job_in->gpu.context_bytes);
    f->usable_bytes = (uint64_t)((double)f->capacity_bytes * (1.0 - job_in->margin));
    /* The caching allocator sees the usable bytes less the context and NCCL's buffers: a
     * cudaMalloc beyond them fails (and the allocator frees its cache and retries).  A target
     * with nothing left gives the allocator 1 byte: everything fails. */
    struct mp_job jl = *job_in;
    const struct mp_job *job = &jl;
    jl.build.sm_count = jl.gpu.sm_count; /* (the column sums' staging is the target's) */
    jl.build.sm_threads = jl.gpu.sm_threads;
    /* a colocated vLLM (GRPO's --vllm F) holds F of the device outside the allocator */
    jl.train.vllm_bytes = mp_vllm_bytes(job_in->train.vllm_fraction, jl.gpu.memory_bytes);
    uint64_t beside = context > UINT64_MAX - jl.train.vllm_bytes ? UINT64_MAX : context + jl.train.vllm_bytes;
    f->alloc_limit = f->usable_bytes > beside ? f->usable_bytes - beside : 1;
    jl.train.alloc_limit = jl.gpu.memory_bytes ? f->alloc_limit : 0;
    jl.train.device_total = jl.gpu.memory_bytes;
    struct evalr ev = {.job = job, .fold = fold_wanted(job)};
    ev.np = job->fold_scratch ? &job->fold_scratch[0] : &ev.nprog;
    ev.sp = job->fold_scratch ? &job->fold_scratch[1] : &ev.sprog;
    mp_fit_build_opts(job, &ev.bo);
    enum mp_status st = MP_OK;
    if (!ev.fold && (st = ev_build(&ev, d)) != MP_OK)
        return st;
    bool budgeted = job->ckpt.strategy == MP_CKPT_OPTIMAL || job->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS;
    bool no_chain = job->verdict_only && !budgeted;
    if ((st = ev_chain(&ev, no_chain, &f->chain, d)) != MP_OK)
        goto out;
    if (!no_chain) {
        struct mp_ckpt_spec none = {.strategy = MP_CKPT_NONE, .k = 0};
        struct mp_ckpt_plan p0;
        mp_ckpt_plan_init(&p0);
        if (mp_ckpt_plan_make(&f->chain, &none, 0, job->slots, &p0, d) == MP_OK)
            f->nockpt_activation_peak = p0.peak_bytes;
        mp_ckpt_plan_release(&p0);
    }
    if (!budgeted) {
        st = plan_make(job, &f->chain, &job->ckpt, 0, &f->plan, d);
        if (st != MP_OK)
            goto out;
        st = ev_run(&ev, &f->plan.sched, context, &f->chain, &f->est, &f->folded_blocks, d);
        if (st == MP_OK && job->ckpt.sac == MP_SAC_AUTO)
            st = sac_auto(&ev, context, f, d);
        if (st != MP_OK)
            goto out;
        if (job->ckpt.sac != MP_SAC_NONE) { /* the chain model recomputes whole blocks: the plan's
                                              * recompute is the replay's, less the kept ops */
            f->plan.total_cost -= f->plan.recompute_cost - f->est.recompute_flops;
            f->plan.recompute_cost = f->est.recompute_flops;
        }
    } else {
        /* The activation budget: what the target leaves after everything that is not an
         * activation (weights, gradients, optimizer state, workspace, context). */
        uint64_t budget = job->activation_budget;
        if (!budget) {
            struct mp_estimate e0;
            st = ev_static(&ev, &e0, d); /* static figures do not depend on the plan */
            if (st != MP_OK)
                goto out;
            uint64_t fixed = e0.weights_bytes;
            bool ok = mp_add_u64(fixed, e0.grads_bytes, &fixed) && mp_add_u64(fixed, e0.optimizer_bytes, &fixed) &&
                      mp_add_u64(fixed, e0.workspace_bytes, &fixed) && mp_add_u64(fixed, e0.buffers_bytes, &fixed);
            mp_estimate_release(&e0);
            if (!ok) {
                st = mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", job->model->path);
                goto out;
            }
            if (!mp_add_u64(fixed, context, &fixed)) {
                st = mp_fail(d, MP_ERR_RANGE, "%s: the CUDA context (--context) of %llu bytes overflows 64 bits "
                             "with the weights, gradients and optimizer state", job->model->path,
                             (unsigned long long)context);
                goto out;
            }
            f->static_bytes = fixed;
            budget = sub0(f->usable_bytes, fixed);
        }
        /* Plan, replay, and shrink the budget by any excess the storage-level replay finds
         * (allocator rounding, gradients overlapping activations).  A shrink that left the peak
         * as it was (the DP's slots are coarser than the excess: the same plan again) is
         * followed by one of a slot, then two, four...: without it the rounds ran out on the
         * same plan, and a batch that a plan fits was said not to fit while a larger one did. */
        bool planned = false;
        uint64_t last_peak = 0;
        unsigned stuck = 0;
        for (int round = 0; round < 6 && budget > 0; round++) {
            struct mp_ckpt_plan np;
            mp_ckpt_plan_init(&np);
            st = plan_make(job, &f->chain, &job->ckpt, budget, &np, d);
            if (st != MP_OK) {
                mp_ckpt_plan_release(&np);
                if (st != MP_ERR_INFEASIBLE)
                    goto out;
                st = MP_OK; /* (the last round's plan, if any, stays) */
                break;
            }
            /* the same plan as the last round's (a long chain's DP on groups often gives it
             * again, or sqrt's): the same replay */
            bool again = planned && mp_schedule_equal(&np.sched, &f->plan.sched);
            mp_ckpt_plan_release(&f->plan);
            f->plan = np;
            if (!again) {
                mp_estimate_release(&f->est);
                st = ev_run(&ev, &f->plan.sched, context, &f->chain, &f->est, &f->folded_blocks, d);
                if (st != MP_OK)
                    goto out;
            }
            planned = true;
            f->activation_budget = budget;
            if (job->activation_budget || f->est.peak_device_bytes <= f->usable_bytes)
                break;
            uint64_t excess = f->est.peak_device_bytes - f->usable_bytes, shrink;
            if (!mp_add_u64(excess, excess / 8 + 4096, &shrink))
                shrink = UINT64_MAX; /* (the budget goes to 0: nothing fits) */
            if (f->est.peak_device_bytes == last_peak)
                shrink = mp_max_u64(shrink, budget / (job->slots ? job->slots : 500) << stuck++);
            last_peak = f->est.peak_device_bytes;
            budget = sub0(budget, shrink);
        }
        /* On a long chain the DP runs on groups (ckpt.c) and its chain model counts a little
         * more than the replay: sqrt's plan, replayed, is taken where it fits and the DP's plan
         * does not, or costs less, so the optimal plan is never worse than sqrt's */
        if (!job->activation_budget && f->chain.L > MP_CKPT_DP_MAX_BLOCKS &&
            (st = sqrt_floor(&ev, job, context, f, &planned, d)) != MP_OK)
            goto out;
        if (planned && !f->activation_budget)
            f->activation_budget = budget;
        if (!planned) {
            /* nothing fits: report the fully checkpointed peak (every block) for the shortfall */
            struct mp_ckpt_spec every = {.strategy = MP_CKPT_EVERY, .k = 1};
            mp_ckpt_plan_release(&f->plan);
            mp_ckpt_plan_init(&f->plan);
            st = plan_make(job, &f->chain, &every, 0, &f->plan, d);
            if (st != MP_OK)
                goto out;
            f->plan.spec = job->ckpt;
            mp_estimate_release(&f->est);
            st = ev_run(&ev, &f->plan.sched, context, &f->chain, &f->est, &f->folded_blocks, d);
            if (st != MP_OK)
                goto out;
            f->activation_budget = budget;
            f->peak_device_bytes = f->est.peak_device_bytes;
            f->fits = false;
            f->infeasible = true;
            device_verdict(f, context);
            goto throughput;
        }
    }
    f->peak_device_bytes = f->est.peak_device_bytes;
    f->fits = f->peak_device_bytes <= f->usable_bytes;
    device_verdict(f, context);
    if (f->fits_allocated && f->device_simulated && !f->fits_device && (job->keep_program || job->keep_built) &&
        !(job->train.alloc && job->train.alloc->expandable)) {
        /* would expandable segments make the difference?  The same plan replayed with them */
        struct mp_alloc_conf ex;
        if (job->train.alloc)
            ex = *job->train.alloc;
        else
            mp_alloc_conf_default(&ex);
        ex.expandable = true;
        jl.train.alloc = &ex;
        struct mp_estimate e2;
        size_t folded = 0;
        memset(&e2, 0, sizeof e2);
        st = ev_run(&ev, &f->plan.sched, context, NULL, &e2, &folded, d);
        jl.train.alloc = job_in->train.alloc;
        if (st != MP_OK)
            goto out;
        uint64_t dev;
        f->expandable_fits = e2.alloc_simulated && !e2.alloc_ooms &&
                             mp_add_u64(e2.peak_reserved_bytes, context, &dev) && dev <= f->usable_bytes;
        f->expandable_device_bytes = f->expandable_fits ? dev : 0;
        mp_estimate_release(&e2);
    }
throughput: {
    bool nominal;
    double compute = step_seconds(job, &f->est, &nominal);
    par_seconds(job, &f->est, compute, f);
    f->step_s = compute + f->exposed_comm_s + f->offload_s + opt_seconds(job, &f->est);
    f->samples_per_s = f->step_s > 0 ? (double)job->build.batch / f->step_s : 0;
}
out:
    ev_release(&ev, f, st == MP_OK);
    if (st != MP_OK)
        mp_fit_release(f);
    return st;
}

static enum mp_status fits_at(const struct mp_job *job, uint64_t b, bool *fits, uint64_t *peak, unsigned *evals,
                              struct mp_diag *d)
{
    struct mp_job j = *job;
    j.build.batch = b;
    j.train.skip_reserved = true; /* the search decides on allocated bytes */
    j.verdict_only = true;
    struct mp_fit f;
    enum mp_status st = mp_fit_eval(&j, &f, d);
    (*evals)++;
    if (st == MP_ERR_RANGE) { /* a batch so large that sizes overflow cannot fit */
        *fits = false;
        *peak = UINT64_MAX;
        return MP_OK;
    }
    if (st != MP_OK)
        return st;
    *fits = f.fits;
    *peak = f.peak_device_bytes;
    mp_fit_release(&f);
    return MP_OK;
}

/* The micro-batch the search promises (README and memplan(1), suggest): b fits, and b + 1 does
 * not (or b is max_batch).  A checkpoint plan needs no more memory at a smaller batch (no
 * tensor shrinks as the batch grows), so b's plan also fits every batch below b.  Where "fits"
 * is monotone in the batch, b is the largest batch that fits: so it is with the fixed plans
 * (none, sqrt, every, segments, layers), whose schedule does not depend on the batch.  With the
 * optimal plans a larger batch can fit again (the planner's budget rounds and slots), and b is
 * the boundary the search meets.
 *
 * The search goes up from 1: doubling while the peak does not grow with the batch, else a jump
 * to where the line through the last two fitting batches reaches the usable bytes.  Once a
 * batch fails, it interpolates between the bracket's peaks.  Each such guess is followed by its
 * neighbour: memory is near-affine in the batch, so the boundary is usually there.  Two guesses
 * that missed turn the search to plain doubling and bisection, which the optimal plans use
 * from the start.  So with an optimal plan b lies between the last power of two that fits and
 * the first that does not (or max_batch), found by bisection. */
/* mp_search_max_batch from batch `from` when it fits (a batch a weaker plan of the same job was
 * found to fit: the search then starts there), else from 1. */
static enum mp_status search_max_batch_from(const struct mp_job *job, uint64_t max_batch, uint64_t from,
                                            uint64_t *best, unsigned *evals, struct mp_diag *d)
{
    *best = 0;
    bool ok = false;
    uint64_t least = mp_trainer_min_batch(job->build.trainer, job->build.loss); /* (KTO's KL term: 2) */
    uint64_t plo, start = least;
    enum mp_status st = MP_OK;
    if (least > max_batch)
        return MP_OK;
    if (from > least && from <= max_batch && (st = fits_at(job, from, &ok, &plo, evals, d)) == MP_OK && ok)
        start = from;
    if (st == MP_OK && start == least)
        st = fits_at(job, least, &ok, &plo, evals, d);
    if (st != MP_OK || !ok)
        return st;
    uint64_t usable = (uint64_t)((double)mp_gpu_capacity(&job->gpu) * (1.0 - job->margin));
    uint64_t lo = start, prev = 0, pprev = 0; /* lo fits (peak plo); prev < lo fitted before it (0: none) */
    uint64_t hi = 0, phi = 0;             /* hi > lo does not fit (peak phi); 0: none found yet */
    uint64_t next = start > 1 ? start + 1 : 0; /* the last guess's neighbour, tried next (after a
                                                * start: the batch above it) */
    uint64_t round_lo = 0, round_span = 0; /* lo and the bracket before the last guess */
    /* guesses that missed; after two, doubling and bisection only.  An optimal plan fills its
     * budget whatever the batch, so its peak says nothing of the boundary: no guesses at all */
    unsigned misses = job->ckpt.strategy == MP_CKPT_OPTIMAL || job->ckpt.strategy == MP_CKPT_OPTIMAL_SEGMENTS ? 2 : 0;
    while (hi ? hi - lo > 1 : lo < max_batch) {
        bool guess = false;
        uint64_t b;
        if (next <= lo || (hi && next >= hi) || next > max_batch) {
            next = 0;
            if (round_lo) /* the guess and its neighbour are done: did they bracket the boundary
                           * (before a failure) or halve the bracket? */
                misses += !(round_span ? 2 * (hi - lo) <= round_span : hi != 0);
            round_lo = round_span = 0;
        }
        if (next) {
            b = next;
        } else if (!hi) {
            b = lo > max_batch / 2 ? max_batch : 2 * lo;
            if (misses < 2 && prev && plo > pprev) { /* the line through (prev, pprev) and (lo, plo) */
                double g = (double)lo + (double)(usable - plo) * (double)(lo - prev) / (double)(plo - pprev);
                b = g >= (double)max_batch ? max_batch : g < (double)lo + 1 ? lo + 1 : (uint64_t)g;
                guess = true;
                round_lo = lo;
            }
        } else if (misses < 2 && phi > plo && phi != UINT64_MAX) {
            double g = (double)lo + (double)(usable - plo) * (double)(hi - lo) / (double)(phi - plo);
            b = g < (double)lo + 1 ? lo + 1 : g >= (double)(hi - 1) ? hi - 1 : (uint64_t)g;
            guess = true;
            round_lo = lo;
            round_span = hi - lo;
        } else {
            b = lo + (hi - lo) / 2;
        }
        uint64_t pb;
        st = fits_at(job, b, &ok, &pb, evals, d);
        if (st != MP_OK)
            return st;
        if (ok) {
            prev = lo, pprev = plo;
            lo = b, plo = pb;
        } else {
            hi = b, phi = pb;
        }
        next = guess ? (ok ? b + 1 : b - 1) : 0;
    }
    *best = lo;
    return MP_OK;
}

enum mp_status mp_search_max_batch(const struct mp_job *job, uint64_t max_batch, uint64_t *best, unsigned *evals,
                                   struct mp_diag *d)
{
    return search_max_batch_from(job, max_batch, 1, best, evals, d);
}

/* ---- suggest -------------------------------------------------------------------------- */

void mp_suggestion_release(struct mp_suggestion *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        mp_fit_release(&s->cand[i].fit);
    s->n = 0;
}

static uint64_t largest_divisor_le(uint64_t g, uint64_t b)
{
    for (uint64_t k = b < g ? b : g; k >= 1; k--)
        if (g % k == 0)
            return k;
    return 1;
}

/* Sets c to micro-batch b with grad_accum accumulation steps and re-evaluates everything that
 * depends on it (fit, peak, headroom, estimated throughput, plan figures).  c->fits is the
 * estimate's verdict only when c was found fitting (bmax > 0); callers set it otherwise. */
static enum mp_status cand_set_batch(const struct mp_job *job, struct mp_candidate *c, uint64_t b, uint64_t accum,
                                     struct mp_diag *d)
{
    struct mp_job j = *job;
    j.build.precision = c->precision;
    j.ckpt = c->ckpt;
    j.build.batch = b;
    j.train.accumulate = accum > 1;
    mp_grpo_phases(&j.train, accum);
    j.train.skip_reserved = job->train.skip_reserved || !c->fits; /* the device level (the allocator
                                       * simulated, unless the job says not) decides a
                                       * fitting candidate; a model too long for it folds and
                                       * decides on allocated bytes */
    mp_fit_release(&c->fit);
    enum mp_status st = mp_fit_eval(&j, &c->fit, d);
    if (st != MP_OK) {
        memset(&c->fit, 0, sizeof c->fit);
        return st;
    }
    c->micro_batch = b;
    c->grad_accum = accum;
    c->global_batch = b * accum * (c->par.strategy != MP_PAR_NONE ? mp_par_world(&c->par) : 1);
    c->peak_device_bytes = c->fit.peak_device_bytes;
    c->capacity_bytes = c->fit.capacity_bytes;
    c->usable_bytes = c->fit.usable_bytes;
    c->headroom_pct = c->capacity_bytes
                          ? 100.0 * ((double)c->capacity_bytes - (double)c->peak_device_bytes) / (double)c->capacity_bytes
                          : 0;
    double flops_time = c->fit.step_s - opt_seconds(&j, &c->fit.est);
    double t = (double)c->grad_accum * flops_time + opt_seconds(&j, &c->fit.est);
    /* GRPO: a generation every steps_per_generation x num_iterations micro-steps (suggest's
     * --global-batch: the whole accumulation's) */
    uint64_t every = mp_grpo_every(&j.train, accum);
    if (every)
        t += gen_seconds(&j, &c->fit.est) * (double)accum / (double)every;
    c->samples_per_s = c->fits && t > 0 ? (double)c->global_batch / t : 0;
    double base = c->fit.est.fwd_flops + c->fit.est.bwd_flops;
    c->recompute_pct = base > 0 ? 100.0 * c->fit.est.recompute_flops / base : 0;
    c->n_ckpt_blocks = 0;
    for (size_t i = 0; i < c->fit.plan.L; i++)
        c->n_ckpt_blocks += c->fit.plan.checkpointed[i];
    return MP_OK;
}

/* How many batches below the allocated-level choice are each tried at the device level (its
 * verdict is not monotone in the batch: eval_candidate) before galloping down */
#define MP_DEVICE_SCAN 16

/* Does job fit micro-batch b (accum micro-steps) at the device level (the allocator simulated)? */
static enum mp_status device_fits_at(const struct mp_job *job, uint64_t b, uint64_t accum, bool *ok, unsigned *evals,
                                     struct mp_diag *d)
{
    struct mp_job j = *job;
    j.build.batch = b;
    j.train.accumulate = accum > 1;
    mp_grpo_phases(&j.train, accum);
    j.verdict_only = true;
    struct mp_fit f;
    (*evals)++;
    enum mp_status st = mp_fit_eval(&j, &f, d);
    if (st != MP_OK)
        return st;
    *ok = f.fits;
    mp_fit_release(&f);
    return MP_OK;
}

static enum mp_status eval_candidate_any(const struct mp_job *job, const struct mp_suggest_opts *o, uint64_t from,
                                         struct mp_candidate *c, unsigned *evals, struct mp_diag *d)
{
    uint64_t bmax = 0;
    /* With a global batch, micro-steps accumulate into resident gradients unless one
     * micro-batch is the whole global batch: search under accumulation, then re-check. */
    struct mp_job sj = *job;
    sj.train.accumulate = o->global_batch > 1;
    mp_grpo_phases(&sj.train, 0); /* (the accumulation comes with the micro-batch: the worst case) */
    enum mp_status st = search_max_batch_from(&sj, o->max_batch ? o->max_batch : 65536, from, &bmax, evals, d);
    c->search_bmax = bmax;
    if (st != MP_OK)
        return st;
    if (o->global_batch > 1 && bmax < o->global_batch) {
        /* one micro-batch of the whole global batch needs no accumulation: it may fit */
        struct mp_job gj = *job;
        gj.build.batch = o->global_batch;
        mp_grpo_phases(&gj.train, 1);
        struct mp_fit gf;
        st = mp_fit_eval(&gj, &gf, d);
        (*evals)++;
        if (st == MP_OK && gf.fits)
            bmax = o->global_batch;
        if (st == MP_OK)
            mp_fit_release(&gf);
        else if (st != MP_ERR_RANGE)
            return st;
        st = MP_OK;
    }
    c->precision = job->build.precision;
    c->ckpt = job->ckpt;
    uint64_t least = mp_trainer_min_batch(job->build.trainer, job->build.loss); /* (KTO's KL term: 2) */
    uint64_t mb = bmax && o->global_batch ? largest_divisor_le(o->global_batch, bmax) : bmax;
    if (mb < least) { /* nothing fits, or (KTO) no divisor of the global batch from 2 to bmax */
        c->fits = false;
        c->micro_batch = least;
        c->grad_accum = o->global_batch ? mp_max_u64(o->global_batch / least, 1) : 1;
        if (bmax) /* (the fitting-batch checks below do not apply) */
            return MP_OK;
    } else {
        c->fits = true;
        c->micro_batch = mb;
        c->grad_accum = o->global_batch ? o->global_batch / mb : 1;
    }
    (*evals)++;
    st = cand_set_batch(job, c, c->micro_batch, c->grad_accum, d);
    if (st != MP_OK || !c->fits || !c->fit.device_simulated || c->fit.fits_device)
        return st;
    /* The search decided on allocated bytes (fast, and folds); the choice is held to the
     * device level: the largest smaller batch where no allocation fails after the caching
     * allocator's retry.  That verdict is not monotone in the batch: which segments a step's
     * blocks land in, and so what the retry can free, moves with every size (Apertus-8B, bf16,
     * checkpointed layers on an A100 80GB: micro-batch 4 fits, 1-3 and 5-8 do not).  So the
     * MP_DEVICE_SCAN batches below the one found are each tried, from the top; past them (the
     * allocator's slack is a few percent of the batch's bytes, so the boundary is usually near)
     * galloping down (1, 2, 4... below), then bisecting; with a global batch, its divisors from
     * the top. */
    uint64_t lo = 0, hi = c->micro_batch, step = 1;
    for (unsigned k = 0; k < MP_DEVICE_SCAN && !o->global_batch && hi > least; k++) {
        bool ok = false;
        if ((st = device_fits_at(job, hi - 1, 1, &ok, evals, d)) != MP_OK)
            return st;
        if (ok) {
            lo = hi - 1;
            break;
        }
        hi--;
    }
    for (; !lo;) { /* hi does not fit */
        uint64_t b = o->global_batch ? largest_divisor_le(o->global_batch, hi - 1) : (hi > step ? hi - step : 1);
        if (!o->global_batch && b < least)
            b = least;
        if (b < least || b >= hi)
            break;
        bool ok = false;
        if ((st = device_fits_at(job, b, o->global_batch ? o->global_batch / b : 1, &ok, evals, d)) != MP_OK)
            return st;
        if (ok) {
            lo = b;
            break;
        }
        hi = b;
        step *= 2;
    }
    while (!o->global_batch && lo && hi - lo > 1) { /* lo fits, hi does not */
        uint64_t mid = lo + (hi - lo) / 2;
        bool ok = false;
        if ((st = device_fits_at(job, mid, 1, &ok, evals, d)) != MP_OK)
            return st;
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    if (!lo) {
        c->fits = false;
        c->samples_per_s = 0;
        return MP_OK;
    }
    (*evals)++;
    return cand_set_batch(job, c, lo, o->global_batch ? o->global_batch / lo : 1, d);
}

/* eval_candidate_any's micro-batch held to job->batch_unit (GRPO: the generation batch holds whole
 * prompt groups, grpo_config.py:1131-1135): the largest multiple of it at or below the one found
 * (a plan needs no more memory at a smaller batch), or, where there is none, the unit, not
 * fitting. */
static enum mp_status eval_candidate(const struct mp_job *job, const struct mp_suggest_opts *o, uint64_t from,
                                     struct mp_candidate *c, unsigned *evals, struct mp_diag *d)
{
    enum mp_status st = eval_candidate_any(job, o, from, c, evals, d);
    uint64_t u = job->batch_unit;
    if (st != MP_OK || u <= 1 || (c->fits && c->micro_batch % u == 0))
        return st;
    uint64_t b = c->fits ? c->micro_batch - c->micro_batch % u : 0;
    c->fits = b > 0;
    (*evals)++;
    st = cand_set_batch(job, c, b ? b : u, c->grad_accum, d);
    if (st == MP_OK && b && c->fit.device_simulated && !c->fit.fits)
        c->fits = false; /* (the device level is not monotone in the batch) */
    if (!c->fits)
        c->samples_per_s = 0;
    return st;
}

static bool precision_supported(const struct mp_gpu *g, enum mp_precision p)
{
    if (p == MP_PREC_FP32)
        return true;
    if (g->tflops_bf16 == 0 && g->tflops_fp16 == 0 && g->tflops_fp32 == 0)
        return true; /* --vram: no figures, anything goes */
    return mp_gpu_tflops(g, p) > 0;
}


/* Runs one probe of job at batch b (the plan of mp_fit_eval at that batch). */
static enum mp_status probe_at(struct mp_probe *pr, const struct mp_job *job, uint64_t b, struct mp_probe_result *r,
                               struct mp_diag *d)
{
    struct mp_job j = *job;
    j.build.batch = b;
    struct mp_fit f;
    enum mp_status st = mp_fit_eval(&j, &f, d);
    if (st != MP_OK)
        return st;
    struct mp_program prog;
    j.build.ft.input_grad = j.ckpt.strategy != MP_CKPT_NONE;
    j.build.hf_checkpointing = j.ckpt.strategy == MP_CKPT_LAYERS;
    st = mp_program_build(j.model, &j.build, &prog, d);
    if (st == MP_OK) {
        memset(r, 0, sizeof *r);
        st = mp_probe_run(pr, &prog, &f.plan.sched, &j.train, r, d);
        mp_program_release(&prog);
    }
    mp_fit_release(&f);
    return st;
}

/* The micro-batch next to b in direction dir (+1/-1): any batch, or with a global batch
 * G only divisors of G (the divisor rule); 0 when there is none. */
static uint64_t next_batch(const struct mp_suggest_opts *o, uint64_t b, int dir)
{
    uint64_t g = o->global_batch;
    if (dir < 0) {
        for (uint64_t k = b - 1; k >= 1; k--)
            if (!g || g % k == 0)
                return k;
        return 0;
    }
    uint64_t lim = g ? g : (o->max_batch ? o->max_batch : 65536);
    for (uint64_t k = b + 1; k <= lim; k++)
        if (!g || g % k == 0)
            return k;
    return 0;
}

/* The probes' pool limit for the target: what the estimate allows the step's storages
 * (usable capacity less the context the target's profile assumes).  The pool counts
 * exactly what the estimator counts, so on the target itself the limits agree. */
static uint64_t target_pool_bytes(const struct mp_job *base, const struct mp_suggest_opts *o)
{
    if (o->probe_capacity_bytes)
        return o->probe_capacity_bytes;
    uint64_t usable = (uint64_t)((double)mp_gpu_capacity(&base->gpu) * (1.0 - base->margin));
    return sub0(usable, base->gpu.context_bytes);
}

enum mp_status mp_suggest_host_admit(const struct mp_job *base, const struct mp_suggest_opts *o, uint64_t ram_bytes,
                                     struct mp_diag *d)
{
    uint64_t lim = o->probe_capacity_bytes ? o->probe_capacity_bytes
                                           : (uint64_t)((double)mp_gpu_capacity(&base->gpu) * (1.0 - base->margin));
    if (lim <= ram_bytes / 2)
        return MP_OK;
    char b1[32], b2[32];
    return mp_fail(d, MP_ERR_DEVICE, "--backend host: probes up to %s do not fit this machine's RAM (%s); use a "
                                     "smaller --vram or --capacity, or --no-probe",
                   mp_fmt_bytes(lim, b1, sizeof b1), mp_fmt_bytes(ram_bytes, b2, sizeof b2));
}

#define MP_PROBES_PER_CANDIDATE 4
#define MP_PROBES_MAX 10

/* Confirms candidate c with probes under the target's pool limit: b*, then b*+1 (or the
 * next divisor of the global batch) when b* fits, walking down while it does not.  A
 * batch counts as probed only if it ran; a move re-evaluates the estimate at the new
 * batch (fit, peak, headroom, estimated throughput), and never goes above what the
 * estimate says fits the target.  *inconclusive: the local device itself ran out of
 * memory below the target's limit (it is not the target), so nothing was learned. */
static enum mp_status probe_confirm(struct mp_probe *pr, const struct mp_job *base, const struct mp_suggest_opts *o,
                                    struct mp_candidate *c, unsigned *probes, bool *inconclusive, struct mp_diag *d)
{
    *inconclusive = false;
    struct mp_job j = *base;
    j.build.precision = c->precision;
    j.ckpt = c->ckpt;
    uint64_t b = c->micro_batch, ok_b = 0, fail_b = 0;
    struct mp_probe_result r, ok_r;
    memset(&ok_r, 0, sizeof ok_r);
    enum mp_status st = MP_OK;
    for (unsigned n = 0; n < MP_PROBES_PER_CANDIDATE && *probes < MP_PROBES_MAX && b >= 1; n++) {
        bool est_fits = true; /* above ok_b, a batch is taken only where the estimate agrees */
        if (ok_b && b > ok_b) {
            struct mp_job uj = j;
            uj.build.batch = b;
            uj.train.accumulate = o->global_batch && o->global_batch / b > 1;
            struct mp_fit uf;
            st = mp_fit_eval(&uj, &uf, d);
            if (st != MP_OK && st != MP_ERR_RANGE)
                return st;
            est_fits = st == MP_OK && uf.fits;
            if (st == MP_OK)
                mp_fit_release(&uf);
            st = MP_OK;
        }
        if (o->progress)
            mp_progress("probing micro-batch %llu on the %s backend", (unsigned long long)b, mp_probe_backend(pr));
        j.train.accumulate = o->global_batch && o->global_batch / b > 1;
        st = probe_at(pr, &j, b, &r, d);
        (*probes)++;
        if (st != MP_OK)
            return st;
        if (r.fits) {
            if (!est_fits)
                break; /* it ran, but the estimate puts it over the target: keep the estimate's */
            ok_b = b;
            ok_r = r;
            uint64_t up = next_batch(o, b, +1);
            if (!up || (fail_b && fail_b == up))
                break;
            b = up;
        } else {
            if (!r.oom_capacity && !o->target_is_device) {
                *inconclusive = true; /* the local device is smaller than the target */
                break;
            }
            fail_b = b;
            if (ok_b)
                break; /* ok_b fits, the next batch up does not: the boundary */
            b = next_batch(o, b, -1);
        }
    }
    if (o->progress)
        mp_progress_done();
    if (*inconclusive)
        return MP_OK;
    if (!ok_b) {
        c->fits = false;
        c->probe_oom = true;
        c->samples_per_s = 0;
        return MP_OK;
    }
    if (ok_b != c->micro_batch) {
        c->fits = true;
        st = cand_set_batch(base, c, ok_b, o->global_batch ? o->global_batch / ok_b : 1, d);
        if (st != MP_OK)
            return st;
    }
    c->probed = true;
    c->probe_samples_per_s = ok_r.samples_per_s;
    c->probe_step_ms = ok_r.step_ms;
    c->probe_peak_bytes = ok_r.measured_peak_bytes;
    return MP_OK;
}

/* The best candidate: highest estimated throughput among mixed precision and fp32; pure
 * bf16 (no fp32 master weights) only when nothing else fits.  Where bf16-amp is searched (LoRA
 * on an HF config: the peft recipe), the best of its candidates first.  Estimates only: a
 * probe's step time (memplan's kernels) is never compared with an estimate. */
static int choose_best(const struct mp_suggestion *s, const struct mp_suggest_opts *o, bool *bf16_only)
{
    int best = -1;
    *bf16_only = false;
    for (int pass = 0; pass < 3 && best < 0; pass++) {
        for (size_t i = 0; i < s->n; i++) {
            const struct mp_candidate *c = &s->cand[i];
            if (!c->fits || (pass == 0 && c->precision != MP_PREC_BF16_AMP) ||
                (pass == 1 && c->precision == MP_PREC_BF16 && !c->par.mixed_bf16 && !o->precision_fixed))
                continue;
            if (best < 0 || c->samples_per_s > s->cand[best].samples_per_s * (1 + 1e-9))
                best = (int)i;
        }
        *bf16_only = best >= 0 && pass == 2;
    }
    return best;
}

/* Probes the best candidate until the best one is confirmed: a candidate whose probes all
 * ran out of memory no longer fits, and one moved to a smaller batch may lose its place,
 * so the choice is made again after each confirmation. */
static enum mp_status probe_best(const struct mp_job *base, const struct mp_suggest_opts *o, struct mp_suggestion *s,
                                 bool *bf16_only, struct mp_diag *d)
{
    struct mp_probe_opts po;
    mp_probe_opts_default(&po);
    po.backend = o->probe_backend ? o->probe_backend : "cuda";
    po.device = o->device;
    po.capacity_bytes = target_pool_bytes(base, o);
    if (po.capacity_bytes == 0) {
        snprintf(s->probe_note, sizeof s->probe_note, "not probed: the target leaves nothing beyond its context");
        return MP_OK;
    }
    struct mp_probe *pr = NULL;
    enum mp_status st = mp_probe_open(&pr, &po, d);
    if (st != MP_OK)
        return st;
    s->probe_capacity_bytes = po.capacity_bytes;
    while (s->best >= 0 && !s->cand[s->best].probed && s->probes < MP_PROBES_MAX) {
        struct mp_candidate *c = &s->cand[s->best];
        bool inconclusive;
        st = probe_confirm(pr, base, o, c, &s->probes, &inconclusive, d);
        if (st != MP_OK)
            break;
        if (inconclusive) {
            snprintf(s->probe_note, sizeof s->probe_note,
                     "not confirmed: the local GPU ran out of memory below the target's limit (it has less "
                     "free memory than the target)");
            break;
        }
        s->best = choose_best(s, o, bf16_only);
    }
    mp_probe_close(pr);
    if (st != MP_OK)
        return st;
    if (s->best >= 0 && !s->cand[s->best].probed && !s->probe_note[0]) {
        /* the budget is spent: only a confirmed candidate may be recommended */
        int best = -1;
        for (size_t i = 0; i < s->n; i++)
            if (s->cand[i].probed && s->cand[i].fits &&
                (best < 0 || s->cand[i].samples_per_s > s->cand[best].samples_per_s * (1 + 1e-9)))
                best = (int)i;
        s->best = best;
        if (best >= 0)
            *bf16_only = s->cand[best].precision == MP_PREC_BF16 && !o->precision_fixed;
        snprintf(s->probe_note, sizeof s->probe_note,
                 "the probe budget (%d runs) is spent: only a probe-confirmed candidate is recommended",
                 MP_PROBES_MAX);
    }
    return MP_OK;
}

/* The repeated blocks (decoder layers): what "layers" wraps. */
static size_t model_repeats(const struct mp_model *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->n_blocks; i++)
        n += m->blocks[i].repeat_group > 0;
    return n;
}

/* A strategy the plan models for this job: its fine-tune (mp_par_finetune_modelled), its quantized
 * base and its trainer (mp_trainer_par_modelled, GRPO's mp_par_grpo_unmodelled; cli refuses the
 * rest). */
static bool strategy_modelled(const struct mp_job *base, enum mp_par_strategy s)
{
    const struct mp_quant *qz = base->model->quant.kind != MP_Q_NONE ? &base->model->quant
                                : base->build.ft.mode == MP_FT_QLORA ? &base->build.ft.quant
                                                                       : NULL;
    return mp_par_finetune_modelled(s, base->build.ft.mode, base->train.optimizer) &&
           !mp_par_quant_unmodelled(s, qz) &&
           !mp_par_fused_head_unmodelled(s, base->build.ft.mode, base->build.loss) &&
           mp_trainer_par_modelled(base->build.trainer, base->build.loss, s) &&
           (base->build.trainer != MP_TRAINER_GRPO ||
            !mp_par_grpo_unmodelled(s, base->build.ft.mode, MP_OFFLOAD_NONE,
                                    base->train.vllm_fraction > 0 || base->train.vllm_server));
}

/* Does a sharding strategy (FSDP2, then ZeRO-3) fit micro-batch 1 with every block
 * checkpointed on w ranks (8 GPUs per node), in prec or, where mixed, in its mixed-bf16 (the
 * sharded search's own: a 4-bit base loads whole in the compute dtype, so only bf16's load may
 * fit a card)?  Sets *par to the one that fits (mixed_bf16 left to the world's own search).
 * *hopeless: no strategy could fit at any world: what its peak holds besides this rank's
 * sharded state (activations, gathered units, the load: none of them shrinks with more ranks)
 * is twice the usable bytes or more. */
static bool world_fits(const struct mp_job *base, enum mp_precision prec, bool mixed, uint64_t w,
                       struct mp_parallel *par, bool *hopeless, struct mp_diag *d)
{
    *hopeless = true;
    static const enum mp_par_strategy shard[] = {MP_PAR_FSDP, MP_PAR_ZERO3};
    mp_parallel_default(par);
    par->gpus = w < 8 ? w : 8;
    par->nodes = w < 8 ? 1 : w / 8;
    for (size_t k = 0; k < 2; k++) {
        par->strategy = shard[k];
        if (!strategy_modelled(base, par->strategy))
            continue; /* (a fine-tune, a trainer: only what the plan models) */
        struct mp_job j = *base;
        j.train.par = par;
        /* (the device level where the allocator is simulated, as the choice's) */
        j.verdict_only = true;
        j.build.batch = 1;
        j.ckpt = (struct mp_ckpt_spec){.strategy = MP_CKPT_EVERY, .k = 1};
        bool again = true; /* (mixed-bf16 only where prec's peak is the load) */
        for (int m = 0; m < (mixed ? 2 : 1) && again; m++) {
            par->mixed_bf16 = m == 1;
            j.build.precision = m == 1 ? MP_PREC_BF16 : prec;
            struct mp_fit f;
            if (mp_fit_eval(&j, &f, d) != MP_OK) {
                *hopeless = false; /* (no verdict: the larger worlds still tried) */
                break;
            }
            bool fits = f.fits;
            again = f.est.peak_phase == MP_PH_LOAD;
            uint64_t state = 0, u2 = 0;
            bool far = mp_add_u64(f.est.weights_bytes, f.est.grads_bytes, &state) &&
                       mp_add_u64(state, f.est.optimizer_bytes, &state) && mp_add_u64(f.usable_bytes, f.usable_bytes, &u2) &&
                       f.peak_device_bytes > state && f.peak_device_bytes - state >= u2;
            *hopeless = *hopeless && far;
            mp_fit_release(&f);
            par->mixed_bf16 = false;
            if (fits)
                return true;
        }
    }
    return false;
}

/* The smallest data-parallel world that fits (0 if none up to 128 nodes): 2, 4, 8 GPUs, then
 * whole nodes of 8, found by doubling the node count and bisecting (what one rank holds only
 * shrinks as ranks are added).  *par is set for that world. */
static uint64_t smallest_world(const struct mp_job *base, enum mp_precision prec, bool mixed, struct mp_parallel *par,
                               struct mp_diag *d)
{
    bool hopeless;
    for (uint64_t w = 2; w <= 8; w *= 2)
        if (world_fits(base, prec, mixed, w, par, &hopeless, d))
            return w;
        else if (hopeless) /* (more ranks shrink nothing that matters) */
            return 0;
    uint64_t lo = 1, hi = 0; /* nodes: lo does not fit, hi fits */
    for (uint64_t n = 2; n <= 128 && !hi; n *= 2) {
        if (world_fits(base, prec, mixed, 8 * n, par, &hopeless, d))
            hi = n;
        else if (hopeless)
            return 0;
        else
            lo = n;
    }
    if (!hi)
        return 0;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (world_fits(base, prec, mixed, 8 * mid, par, &hopeless, d))
            hi = mid;
        else
            lo = mid;
    }
    return world_fits(base, prec, mixed, 8 * hi, par, &hopeless, d) ? 8 * hi : 0;
}

static enum mp_status suggest_run(const struct mp_job *base, const struct mp_suggest_opts *o_in, const char *argv0,
                                  struct mp_suggestion *s, struct mp_diag *d);

/* Every evaluation of one suggest (nested ones included) builds into the same program
 * memory, and its folds into the same two short programs: on long models, page faults and
 * copies would otherwise cost as much as the work. */
enum mp_status mp_suggest(const struct mp_job *base, const struct mp_suggest_opts *o_in, const char *argv0,
                          struct mp_suggestion *s, struct mp_diag *d)
{
    struct mp_program scratch, fold_scratch[2];
    memset(&scratch, 0, sizeof scratch);
    memset(fold_scratch, 0, sizeof fold_scratch);
    struct mp_job b = *base;
    if (!b.scratch)
        b.scratch = &scratch;
    if (!b.fold_scratch)
        b.fold_scratch = fold_scratch;
    enum mp_status st = suggest_run(&b, o_in, argv0, s, d);
    mp_program_release(&scratch);
    mp_program_release(&fold_scratch[0]);
    mp_program_release(&fold_scratch[1]);
    return st;
}

/* The axes of suggest's search: precisions, checkpoint strategies, data-parallel engines and
 * fine-tuning modes; every combination is a candidate. */
struct space {
    enum mp_precision precs[4];
    bool mixed[4]; /* precs[i] (bf16) is the sharding engine's mixed-bf16: bf16 compute copies of an
                      fp32 master (struct mp_parallel.mixed_bf16) */
    size_t np;
    struct mp_ckpt_spec strategies[8];
    size_t ns;
    struct mp_parallel pars[8];
    size_t npar;
    enum mp_ft_mode modes[2];
    size_t nm;
};

/* transformers' expert parallelism suggest tries for an MoE model's full fine-tune (--trainer
 * sft) on `world` ranks: the largest ep dividing the world and every MoE layer's experts (each
 * rank then gathers the fewest experts), or 0 where none above 1 does. */
static uint64_t searched_ep(const struct mp_job *base, uint64_t world)
{
    if (base->build.ft.mode != MP_FT_FULL || base->build.trainer != MP_TRAINER_SFT)
        return 0;
    uint64_t ep = world;
    bool moe = false;
    for (size_t i = 0; i < base->model->n_blocks; i++)
        for (size_t j = 0; j < base->model->blocks[i].n_layers; j++) {
            uint64_t e = base->model->blocks[i].layers[j].moe.experts;
            if (!e)
                continue;
            if (base->model->blocks[i].layers[j].moe.router == MP_ROUTER_DENSE_SIGMOID)
                return 0; /* Llama 4's experts under --ep: not modelled (lower_mlp.c) */
            moe = true;
            while (ep > 1 && (e % ep || world % ep))
                ep--;
        }
    return moe && ep > 1 ? ep : 0;
}

static void search_space(const struct mp_job *base, const struct mp_suggest_opts *o, struct space *sp)
{
    memset(sp, 0, sizeof *sp);
    if (o->precision_fixed) {
        sp->precs[sp->np++] = o->precision;
    } else {
        /* bf16-amp first: the peft recipe, preferred when it fits (choose_best); never data
         * parallel (refused there) nor where the GPU has no bf16; LoRA only (QLoRA, lora_alternative
         * too: prepare_model_for_kbit_training upcasts the unquantized weights to fp32) */
        if (o->lora_bf16_base && base->build.ft.mode == MP_FT_LORA && !base->train.par &&
            precision_supported(&base->gpu, MP_PREC_BF16_AMP) && !mp_bf16_amp_unmodelled(base->model))
            sp->precs[sp->np++] = MP_PREC_BF16_AMP;
        if (precision_supported(&base->gpu, MP_PREC_AMP_BF16))
            sp->precs[sp->np++] = MP_PREC_AMP_BF16;
        else if (precision_supported(&base->gpu, MP_PREC_AMP_FP16))
            sp->precs[sp->np++] = MP_PREC_AMP_FP16;
        sp->precs[sp->np++] = MP_PREC_FP32;
        if (precision_supported(&base->gpu, MP_PREC_BF16))
            sp->precs[sp->np++] = MP_PREC_BF16;
        size_t kept = 0; /* (the precisions the loss head cannot run in: --loss cce, torchtune) */
        for (size_t i = 0; i < sp->np; i++)
            if (!mp_loss_precision_refused(base->build.loss, sp->precs[i]))
                sp->precs[kept++] = sp->precs[i];
        sp->np = kept;
    }
    /* "layers" is what HF's gradient_checkpointing does, "layers:N" its every_n_layers (every
     * N-th decoder layer: less recompute for more memory); a Trainer (--emit hf) can run only
     * none and those.  A model without repeated blocks has no "layers" plan, and N must leave
     * more than one layer checkpointed. */
    if (o->ckpt_fixed) { /* --checkpoint: the plan the user will run */
        sp->strategies[sp->ns++] = o->ckpt;
    } else {
        sp->strategies[sp->ns++] = (struct mp_ckpt_spec){.strategy = MP_CKPT_NONE, .k = 0};
        if (!o->trainer_plans_only) {
            sp->strategies[sp->ns++] = (struct mp_ckpt_spec){.strategy = MP_CKPT_SQRT, .k = 0};
            sp->strategies[sp->ns++] = (struct mp_ckpt_spec){.strategy = MP_CKPT_OPTIMAL, .k = 0};
        }
        size_t layers = model_repeats(base->model);
        if (layers)
            sp->strategies[sp->ns++] = (struct mp_ckpt_spec){.strategy = MP_CKPT_LAYERS, .k = 0};
        for (uint64_t every = 2; every <= 4; every++)
            if (layers > every)
                sp->strategies[sp->ns++] = (struct mp_ckpt_spec){.strategy = MP_CKPT_LAYERS, .k = every};
    }
    /* data parallel: the strategy given, or every one at the world given (--gpus alone) */
    if (o->par_search && base->train.par) {
        static const enum mp_par_strategy all[] = {MP_PAR_DDP, MP_PAR_ZERO1, MP_PAR_ZERO2, MP_PAR_ZERO3, MP_PAR_FSDP,
                                                   MP_PAR_FSDP_NO_RESHARD};
        for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
            if (!strategy_modelled(base, all[k]))
                continue; /* a fine-tune, a trainer: only what the plan models (cli refuses the rest) */
            sp->pars[sp->npar] = *base->train.par;
            sp->pars[sp->npar].strategy = all[k];
            sp->npar++;
        }
        /* an MoE model: FSDP2 with transformers' expert parallelism too (--ep) */
        uint64_t ep = base->train.par->offload == MP_OFFLOAD_NONE ? searched_ep(base, mp_par_world(base->train.par))
                                                                  : 0;
        if (ep) {
            sp->pars[sp->npar] = *base->train.par;
            sp->pars[sp->npar].strategy = MP_PAR_FSDP;
            sp->pars[sp->npar].ep = ep;
            sp->npar++;
        }
        /* and ZeRO-3 with the optimizer on the host (ZeRO-Offload), unless --offload was given */
        if (base->train.par->offload == MP_OFFLOAD_NONE && strategy_modelled(base, MP_PAR_ZERO3)) {
            sp->pars[sp->npar] = *base->train.par;
            sp->pars[sp->npar].strategy = MP_PAR_ZERO3;
            sp->pars[sp->npar].offload = MP_OFFLOAD_OPTIMIZER;
            sp->npar++;
        }
        /* bounded: the first precision only (amp unless --precision), plus mixed-bf16 (bf16
         * compute copies, fp32 master) for the sharding engines unless --precision is given */
        sp->np = 1;
        if (!o->precision_fixed && sp->precs[0] == MP_PREC_AMP_BF16)
            sp->precs[sp->np++] = MP_PREC_BF16;
    } else if (base->train.par) {
        sp->pars[sp->npar++] = *base->train.par;
        /* a sharding engine given (--parallel fsdp, zero*): its mixed-bf16 is searched too, where
         * the GPU computes in bf16 (issue 25: FSDP's best plan is often mixed-bf16) */
        bool bf16 = false;
        for (size_t i = 0; i < sp->np; i++)
            bf16 |= sp->precs[i] == MP_PREC_BF16;
        struct mp_parallel mp = *base->train.par;
        mp.mixed_bf16 = true;
        struct mp_diag vd = {{0}};
        if (!o->precision_fixed && bf16 && !base->train.par->mixed_bf16 && sp->np < 4 &&
            mp_par_validate(&mp, &vd) == MP_OK) {
            sp->precs[sp->np] = MP_PREC_BF16;
            sp->mixed[sp->np++] = true;
        }
    } else {
        mp_parallel_default(&sp->pars[sp->npar++]);
    }
    /* fine-tuning: the method the user asked for, never another (when nothing fits, QLoRA is
     * offered as an alternative: lora_alternative) */
    sp->modes[sp->nm++] = base->build.ft.mode;
    if (sp->nm * sp->npar * sp->np * sp->ns > MP_SUGGEST_MAX_CANDIDATES)
        MP_BUG("suggest's space has %zu candidates, more than MP_SUGGEST_MAX_CANDIDATES",
               sp->nm * sp->npar * sp->np * sp->ns);
}

/* Every candidate of the space evaluated into s->cand (at most its size).  On a failure s is
 * released. */
static enum mp_status search_space_eval(const struct mp_job *base, const struct mp_suggest_opts *o,
                                        const struct space *sp, struct mp_suggestion *s, struct mp_diag *d)
{
    unsigned evals = 0;
    for (size_t mi = 0; mi < sp->nm; mi++)
    for (size_t pi = 0; pi < sp->npar; pi++)
    for (size_t i = 0; i < sp->np; i++) {
        for (size_t k = 0; k < sp->ns; k++) {
            struct mp_diag vd = {{0}};
            if (mp_par_validate(&sp->pars[pi], &vd) != MP_OK)
                continue;
            /* every_n_layers is the Trainer's (and torch's) option; FSDP's and DeepSpeed's own
             * checkpointing wrap every layer (accelerate's fsdp_activation_checkpointing) */
            if (sp->strategies[k].strategy == MP_CKPT_LAYERS && sp->strategies[k].k > 1 &&
                sp->pars[pi].strategy != MP_PAR_NONE && sp->pars[pi].strategy != MP_PAR_DDP)
                continue;
            struct mp_parallel cp = sp->pars[pi];
            if ((o->par_search && !o->precision_fixed && sp->precs[i] == MP_PREC_BF16) || sp->mixed[i])
                cp.mixed_bf16 = true; /* the searched bf16 row is mixed-bf16 */
            if (mp_par_validate(&cp, &vd) != MP_OK)
                continue;
            if (cp.strategy != MP_PAR_NONE && sp->precs[i] == MP_PREC_BF16 && !cp.mixed_bf16 &&
                mp_par_is_deepspeed(cp.strategy))
                continue; /* DeepSpeed always keeps an fp32 master: that is mixed-bf16 */
            struct mp_job j = *base;
            j.build.precision = sp->precs[i];
            j.build.ft.mode = sp->modes[mi];
            mp_par_build_opts(&j.build, &cp, base->model->quant.kind);
            j.build.ep = cp.ep > 1 ? cp.ep : 0;       /* (--ep: a rank's experts are lowered) */
            j.ckpt = sp->strategies[k];
            s->cand[s->n].par = cp;
            j.train.par = cp.strategy != MP_PAR_NONE ? &s->cand[s->n].par : NULL;
            if (o->progress) {
                char sb[32];
                mp_progress("evaluating %s, checkpoint %s", mp_precision_str(sp->precs[i]),
                            mp_ckpt_spec_str(&j.ckpt, sb, sizeof sb));
            }
            struct mp_candidate *c = &s->cand[s->n];
            struct mp_parallel keep = c->par;
            memset(c, 0, sizeof *c);
            c->par = keep;
            c->ft = sp->modes[mi];
            /* On a long model the optimal plan is never worse than sqrt (ckpt.c): its search
             * starts at the batch sqrt's reached, two candidates before (same mode, engine and
             * precision), once that batch is confirmed to fit */
            uint64_t from = 0;
            if (j.ckpt.strategy == MP_CKPT_OPTIMAL && k >= 1 && sp->strategies[k - 1].strategy == MP_CKPT_SQRT &&
                base->model->n_blocks >= MP_FIT_FOLD_BLOCKS)
                from = s->cand[s->n - 1].search_bmax;
            enum mp_status st = eval_candidate(&j, o, from, c, &evals, d);
            if (st != MP_OK) {
                mp_fit_release(&c->fit);
                mp_suggestion_release(s);
                return st;
            }
            s->n++;
        }
    }
    if (o->progress)
        mp_progress_done();
    return MP_OK;
}

/* Does not fit one GPU: the smallest world (8 GPUs per node) where a sharding strategy fits
 * micro-batch 1 with every block checkpointed, then the full search there, as one line in
 * alt (empty when none fits there).  Returns false when no world up to 128 nodes fits. */
static bool world_alternative(const struct mp_job *base, const struct mp_suggest_opts *o, enum mp_precision prec,
                              const char *argv0, char *alt, size_t len, struct mp_diag *d)
{
    struct mp_parallel par;
    /* (mixed-bf16 where the world's search has it, the precision not given on a bf16 GPU, for a
     * 4-bit base: its load, whole in the compute dtype, can decide the world there (world_fits
     * tries it where it does); elsewhere amp's verdict stands for both) */
    bool quant = base->model->quant.kind != MP_Q_NONE || base->build.ft.mode == MP_FT_QLORA;
    bool mixed = quant && !o->precision_fixed && precision_supported(&base->gpu, MP_PREC_BF16);
    uint64_t w = smallest_world(base, prec, mixed, &par, d);
    if (!w)
        return false;
    struct mp_job wj = *base;
    wj.train.par = &par;
    struct mp_suggest_opts wo = *o;
    wo.par_search = true;
    wo.probe = false;
    wo.hints = false;
    struct mp_suggestion *ws = calloc(1, sizeof *ws);
    if (ws && mp_suggest(&wj, &wo, argv0, ws, d) == MP_OK && ws->best >= 0) {
        const struct mp_candidate *b = &ws->cand[ws->best];
        char a1[32], off[64] = "", pr[32] = "";
        /* every flag the plan needs, so that following the line plans this run: the offload and a
         * precision the search chose (FSDP2's or DeepSpeed's mixed-bf16) */
        if (b->par.offload != MP_OFFLOAD_NONE)
            snprintf(off, sizeof off, " --offload %s%s%s", mp_offload_str(b->par.offload),
                     b->par.offload_device != MP_OFFDEV_CPU ? " --offload-device " : "",
                     b->par.offload_device != MP_OFFDEV_CPU ? mp_offload_dev_str(b->par.offload_device) : "");
        bool base_mixed = base->train.par && base->train.par->mixed_bf16;
        if (b->precision != base->build.precision || b->par.mixed_bf16 != base_mixed)
            snprintf(pr, sizeof pr, " --precision %s", b->par.mixed_bf16 ? "mixed-bf16" : mp_precision_str(b->precision));
        snprintf(alt, len,
                 "--gpus %llu --nodes %llu --parallel %s%s%s (%llu ranks): micro-batch %llu per rank, peak %s, "
                 "%.1f samples/s",
                 (unsigned long long)b->par.gpus, (unsigned long long)b->par.nodes,
                 mp_par_strategy_str(b->par.strategy), off, pr, (unsigned long long)mp_par_world(&b->par),
                 (unsigned long long)b->micro_batch, mp_fmt_bytes(b->peak_device_bytes, a1, sizeof a1),
                 b->samples_per_s);
    }
    if (ws)
        mp_suggestion_release(ws);
    free(ws);
    return true;
}

/* Nothing fits: the best plan of a smaller fine-tuning method (peft's default targets) as an
 * alternative of s: full training -> LoRA, else QLoRA; LoRA -> QLoRA (the base in 4 bits). */
static void lora_alternative(const struct mp_job *base, const struct mp_suggest_opts *o_in, const char *argv0,
                             struct mp_suggestion *s, struct mp_diag *d)
{
    enum mp_ft_mode from = base->build.ft.mode;
    struct mp_finetune lft = base->build.ft;
    lft.mode = MP_FT_LORA;
    if ((from != MP_FT_FULL && from != MP_FT_LORA) || base->model->quant.kind != MP_Q_NONE || base->train.par ||
        base->model->keep_fp32_wo || base->model->input != MP_INPUT_TOKENS ||
        mp_moe_lora_unmodelled(base->model, &lft))
        return;
    struct mp_suggest_opts ao = *o_in;
    ao.probe = false;
    ao.progress = false;
    ao.hints = false;
    struct mp_suggestion *ls = calloc(1, sizeof *ls);
    bool found = false;
    for (int m = from == MP_FT_FULL ? MP_FT_LORA : MP_FT_QLORA; ls && !found && m <= MP_FT_QLORA; m++) {
        struct mp_job lj = *base;
        lj.build.ft.mode = (enum mp_ft_mode)m;
        mp_suggestion_release(ls);
        memset(ls, 0, sizeof *ls);
        found = mp_suggest(&lj, &ao, argv0, ls, d) == MP_OK && ls->best >= 0;
    }
    if (found) {
        const struct mp_candidate *b = &ls->cand[ls->best];
        char a1[32], sb[32];
        snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                 "--finetune %s (adapters r %llu on peft's default targets): micro-batch %llu, %s, checkpoint "
                 "%s, peak %s, %.1f samples/s",
                 mp_ft_mode_str(b->ft), (unsigned long long)base->build.ft.r,
                 (unsigned long long)b->micro_batch, mp_precision_str(b->precision),
                 mp_ckpt_spec_str(&b->ckpt, sb, sizeof sb), mp_fmt_bytes(b->peak_device_bytes, a1, sizeof a1),
                 b->samples_per_s);
    }
    if (ls)
        mp_suggestion_release(ls);
    free(ls);
}

/* Nothing fits: the first larger GPU profile where j (micro-batch 1, every block checkpointed)
 * fits, as an alternative of s.  Returns whether one was found. */
static bool gpu_alternative(struct mp_job *j, const struct mp_gpu *target, const char *argv0,
                            struct mp_suggestion *s, struct mp_diag *d)
{
    struct mp_gpu *gpus = NULL;
    size_t ng = 0;
    bool gpu_found = false;
    if (mp_gpu_list(argv0, &gpus, &ng, d) != MP_OK)
        return false;
    for (size_t i = 0; i < ng; i++) {
        if (mp_gpu_capacity(&gpus[i]) <= mp_gpu_capacity(target))
            continue;
        j->gpu = gpus[i];
        struct mp_fit f;
        if (mp_fit_eval(j, &f, d) != MP_OK)
            continue;
        bool ok = f.fits;
        if (ok) {
            char a[32], b[32];
            snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                     "--gpu %s: peak %s of %s usable at micro-batch %llu (checkpoint every:1), fits",
                     gpus[i].name, mp_fmt_bytes(f.peak_device_bytes, a, sizeof a),
                     mp_fmt_bytes(f.usable_bytes, b, sizeof b), (unsigned long long)j->build.batch);
        }
        mp_fit_release(&f);
        if (ok) {
            gpu_found = true;
            break;
        }
    }
    free(gpus);
    return gpu_found;
}

/* Nothing fits: j (micro-batch 1, every block checkpointed) changed as what says, as an
 * alternative of s, fitting or not. */
static void fit_alternative(const struct mp_job *j, const char *what, struct mp_suggestion *s, struct mp_diag *d)
{
    struct mp_fit f;
    if (mp_fit_eval(j, &f, d) != MP_OK)
        return;
    char a[32], b[32];
    snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
             "%s: peak %s of %s usable at micro-batch %llu (checkpoint every:1)%s", what,
             mp_fmt_bytes(f.peak_device_bytes, a, sizeof a), mp_fmt_bytes(f.usable_bytes, b, sizeof b),
             (unsigned long long)j->build.batch,
             f.fits             ? ", fits"
             : f.fits_allocated ? ", does not fit the caching allocator's segments"
                                : ", still does not fit");
    mp_fit_release(&f);
}

#define EXPANDABLE_FLAG "--alloc-conf expandable_segments:True"
#define EXPANDABLE_WHAT "PYTORCH_CUDA_ALLOC_CONF: pages mapped as needed"

/* vj, a copy of base, with expandable segments in its allocator settings ex (base's otherwise);
 * false where they are set already. */
static bool expandable_job(const struct mp_job *base, struct mp_job *vj, struct mp_alloc_conf *ex)
{
    if (base->train.alloc && base->train.alloc->expandable)
        return false;
    if (base->train.alloc)
        *ex = *base->train.alloc;
    else
        mp_alloc_conf_default(ex);
    ex->expandable = true;
    vj->train.alloc = ex;
    return true;
}

/* Nothing fits at the device level, but a plan fits the allocated bytes: expandable segments
 * searched (no probes, no hints), listed in s's alternatives when they fit. */
static void expandable_alternative(const struct mp_job *base, const struct mp_suggest_opts *o_in,
                                   const char *argv0, struct mp_suggestion *s)
{
    struct mp_job vj = *base;
    struct mp_alloc_conf ex;
    if (s->n_alternatives >= sizeof s->alternatives / sizeof s->alternatives[0] || !expandable_job(base, &vj, &ex))
        return;
    struct mp_suggest_opts vo = *o_in;
    vo.probe = false;
    vo.progress = false;
    vo.hints = false;
    vo.no_alternatives = true;
    struct mp_suggestion *vs = calloc(1, sizeof *vs);
    struct mp_diag vd = {{0}};
    if (vs && mp_suggest(&vj, &vo, argv0, vs, &vd) == MP_OK && vs->best >= 0) {
        const struct mp_candidate *c = &vs->cand[vs->best];
        char a1[32], sb[32];
        snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                 "%s (%s): micro-batch %llu, %s, checkpoint %s, peak %s", EXPANDABLE_FLAG, EXPANDABLE_WHAT,
                 (unsigned long long)c->micro_batch,
                 mp_precision_str(c->precision), mp_ckpt_spec_str(&c->ckpt, sb, sizeof sb),
                 mp_fmt_bytes(c->peak_device_bytes, a1, sizeof a1));
    }
    if (vs)
        mp_suggestion_release(vs);
    free(vs);
}

/* Nothing fits (or the probes refuted every fit, any_fit): what would, as s's alternatives (an
 * 8-bit optimizer, pure bf16, adapters, a larger GPU, a data-parallel world in world_alt), and
 * the note. */
static void nofit_alternatives(const struct mp_job *base, const struct mp_suggest_opts *o,
                               const struct mp_suggest_opts *o_in, enum mp_precision prec, const char *argv0,
                               bool any_fit, bool no_world, const char *world_alt, struct mp_suggestion *s,
                               struct mp_diag *d)
{
    if (!any_fit) /* (the probes refuted it: no allocator setting helps) */
        expandable_alternative(base, o_in, argv0, s);
    struct mp_job j = *base;
    j.build.batch = mp_trainer_min_batch(base->build.trainer, base->build.loss); /* 1 (KTO: 2) */
    j.ckpt = (struct mp_ckpt_spec){.strategy = MP_CKPT_EVERY, .k = 1};
    j.build.precision = o->precision_fixed ? o->precision : prec;
    /* verdicts at the device level where the allocator is simulated, as the choice's */
    j.verdict_only = true;
    j.train.optimizer = MP_OPT_ADAM8BIT;
    if (base->train.optimizer != MP_OPT_ADAM8BIT)
        fit_alternative(&j, "--optimizer adam8bit", s, d);
    j.train.optimizer = base->train.optimizer;
    if (j.build.precision != MP_PREC_BF16 && precision_supported(&base->gpu, MP_PREC_BF16)) {
        j.build.precision = MP_PREC_BF16; /* not proposed where the GPU has no bf16 (a T4) */
        fit_alternative(&j, "--precision bf16", s, d);
    }
    lora_alternative(base, o_in, argv0, s, d);
    j.build.precision = o->precision_fixed ? o->precision : prec;
    bool gpu_found = gpu_alternative(&j, &base->gpu, argv0, s, d);
    if (!gpu_found && s->n_alternatives < sizeof s->alternatives / sizeof s->alternatives[0]) {
        unsigned long long mb = (unsigned long long)j.build.batch;
        char *alt = s->alternatives[s->n_alternatives++];
        size_t n = sizeof s->alternatives[0];
        if (mp_trainer_ref_fwds(base->build.trainer) && !strategy_modelled(base, MP_PAR_FSDP))
            snprintf(alt, n, "no single GPU profile in configs/gpus fits it at micro-batch %llu (a %s step across "
                     "GPUs is not modelled yet)", mb, mp_trainer_str(base->build.trainer));
        else if (no_world) /* (world_fits tries what strategy_modelled allows) */
            snprintf(alt, n, "no single GPU profile in configs/gpus fits it at micro-batch %llu, nor does %s on up to "
                     "1024 GPUs (128 nodes of 8) with every block checkpointed%s", mb,
                     strategy_modelled(base, MP_PAR_ZERO3) ? "FSDP2 or ZeRO-3" : "FSDP2",
                     base->train.ref == MP_REF_COPY ? " (TRL's reference copy, one FSDP2 unit, is gathered whole)"
                                                    : "");
        else if (!mp_par_finetune_modelled(MP_PAR_FSDP, base->build.ft.mode, base->train.optimizer))
            snprintf(alt, n, "no single GPU profile in configs/gpus fits it at micro-batch %llu (memplan does not "
                     "model Muon sharded: DDP replicates the model)", mb);
        else
            snprintf(alt, n, "no single GPU profile in configs/gpus fits it at micro-batch %llu: shard the model and "
                     "optimizer state across GPUs (FSDP/ZeRO) or offload", mb);
    }
    if (any_fit)
        snprintf(s->note, sizeof s->note, "the estimate said it fits but the probes ran out of memory at every "
                                          "batch they tried; rerun with a larger --margin");
    else
        snprintf(s->note, sizeof s->note, "nothing fits, even micro-batch %llu with every block checkpointed",
                 (unsigned long long)mp_trainer_min_batch(base->build.trainer, base->build.loss));
    /* where the load decides (FSDP2 with a 4-bit base): the step does not matter */
    const struct mp_candidate *least = NULL;
    for (size_t i = 0; i < s->n; i++)
        if (!least || s->cand[i].peak_device_bytes < least->peak_device_bytes)
            least = &s->cand[i];
    if (!any_fit && least && least->fit.est.peak_phase == MP_PH_LOAD) {
        char lb[32];
        snprintf(s->note, sizeof s->note, "nothing fits: from_pretrained loads the 4-bit model whole onto each GPU "
                 "(%s with the CUDA context) before FSDP2 shards it; no micro-batch, checkpointing or GPU count "
                 "lowers that", mp_fmt_bytes(least->peak_device_bytes, lb, sizeof lb));
    }
    /* the smallest data-parallel world that fits (the full search: suggest --gpus N) */
    if (world_alt[0]) {
        if (s->n_alternatives == sizeof s->alternatives / sizeof s->alternatives[0])
            s->n_alternatives--;
        snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0], "%s", world_alt);
    }
}

/* The step variants a recommendation is compared with (o->hints): one row each, applied to a
 * copy of the job when the user did not choose them. */
static const struct variant {
    const char *flag, *what;
    enum mp_loss loss;           /* MP_LOSS_HF: the loss is not this variant's */
    enum mp_optimizer optimizer; /* MP_OPT_ADAMW: the optimizer is not this variant's */
    int packing;                 /* 1 rows of packed documents, 2 padding-free (search.h hint_packing) */
    bool expandable;             /* the caching allocator's expandable segments (not where they are set) */
    enum mp_sac_policy sac;      /* the recommendation's layers plan with this selective checkpointing */
    bool act_offload;            /* TRL's activation offloading at the recommendation's layers plan */
} VARIANTS[] = {
    {.flag = "--loss chunked-nll", .what = "TRL 1.16's fused LM head", .loss = MP_LOSS_CHUNKED_NLL,
     .optimizer = MP_OPT_ADAMW},
    {.flag = "--loss liger", .what = "Liger's fused linear cross-entropy", .loss = MP_LOSS_LIGER,
     .optimizer = MP_OPT_ADAMW},
    /* (bf16 weights only, as Axolotl loads them under bf16: true; a candidate in fp32 weights is refused) */
    {.flag = "--loss cce", .what = "Cut Cross-Entropy, Axolotl's CutCrossEntropyPlugin", .loss = MP_LOSS_CCE,
     .optimizer = MP_OPT_ADAMW},
    {.flag = "--optimizer adamw-fused", .what = "adamw_torch_fused, HF's default: no foreach temporaries",
     .loss = MP_LOSS_HF, .optimizer = MP_OPT_ADAMW_FUSED},
    {.flag = "--optimizer adam8bit", .what = "adamw_bnb_8bit: 8-bit states", .loss = MP_LOSS_HF,
     .optimizer = MP_OPT_ADAM8BIT},
    /* where the rows are padded: each packed row holds seq real tokens (listed when it fits) */
    {.flag = "--packing", .what = "rows of packed documents, no padding", .loss = MP_LOSS_HF,
     .optimizer = MP_OPT_ADAMW, .packing = 1},
    {.flag = "--padding-free", .what = "TRL packing=True, DataCollatorWithFlattening: one row", .loss = MP_LOSS_HF,
     .optimizer = MP_OPT_ADAMW, .packing = 2},
    /* where the device level (segments half used when the retry needs them whole) holds it back */
    {.flag = EXPANDABLE_FLAG, .what = EXPANDABLE_WHAT, .loss = MP_LOSS_HF, .optimizer = MP_OPT_ADAMW,
     .expandable = true},
    /* where the recommendation checkpoints layers: memplan's op-level plan keeps what fits of the
     * outputs the recompute would redo (the flag is written with the recommendation's layers:N) */
    {.flag = "+sac:auto", .what = "memplan's selective checkpointing: kept ops not recomputed", .loss = MP_LOSS_HF,
     .optimizer = MP_OPT_ADAMW, .sac = MP_SAC_AUTO},
    /* (TRL's SFT of a causal LM on one GPU, with every layer checkpointed: what act_offload.py measured) */
    {.flag = "--act-offload", .what = "TRL's activation_offloading: layer inputs in pinned host RAM",
     .loss = MP_LOSS_HF, .optimizer = MP_OPT_ADAMW, .act_offload = true},
};

/* It fits: each variant of VARIANTS the user did not pick, searched alone (no probes), listed in
 * s's alternatives when it raises the micro-batch or the throughput: "--loss chunked-nll (...):
 * micro-batch 1 -> 4, peak 20.1 GiB, 3.2 samples/s". */
static void variant_hints(const struct mp_job *base, const struct mp_suggest_opts *o_in, const char *argv0,
                          struct mp_suggestion *s)
{
    const struct mp_candidate *b = &s->cand[s->best];
    struct mp_suggest_opts vo = *o_in;
    vo.probe = false;
    vo.progress = false;
    vo.hints = false;
    struct mp_suggestion *vs = calloc(1, sizeof *vs);
    for (size_t k = 0; vs && k < sizeof VARIANTS / sizeof VARIANTS[0]; k++) {
        const struct variant *v = &VARIANTS[k];
        struct mp_job vj = *base;
        if (v->loss != MP_LOSS_HF) {
            if (base->build.loss != MP_LOSS_HF)
                continue;
            vj.build.loss = v->loss;
        }
        if (v->optimizer != MP_OPT_ADAMW) {
            if (base->train.optimizer != MP_OPT_ADAMW)
                continue; /* (an optimizer the user chose, or adam/sgd: not AdamW's variants) */
            vj.train.optimizer = v->optimizer;
        }
        if (v->packing) {
            if (v->packing != o_in->hint_packing || base->build.packing || base->build.padding_free)
                continue; /* (no recipe that pads; a model that is not a causal LM: mp_suggest refuses) */
            vj.build.packing = true;
            vj.build.padding_free = v->packing == 2;
        }
        struct mp_alloc_conf ex;
        if (v->expandable && !expandable_job(base, &vj, &ex))
            continue;
        char flag[64];
        snprintf(flag, sizeof flag, "%s", v->flag);
        struct mp_suggest_opts so = vo;
        if (v->sac != MP_SAC_NONE) { /* (the user's own selective plan, or none of layers: nothing to add) */
            if (b->ckpt.strategy != MP_CKPT_LAYERS || b->ckpt.sac != MP_SAC_NONE || b->ckpt.offload ||
                base->train.act_offload)
                continue;
            so.ckpt_fixed = true;
            so.ckpt = b->ckpt;
            so.ckpt.sac = v->sac;
            char sb[32];
            snprintf(flag, sizeof flag, "--checkpoint %s", mp_ckpt_spec_str(&so.ckpt, sb, sizeof sb));
        }
        if (v->act_offload) {
            size_t cl = strlen(base->model->hf_class), sl = strlen("ForCausalLM");
            if (b->ckpt.strategy != MP_CKPT_LAYERS || b->ckpt.k > 1 || b->ckpt.sac != MP_SAC_NONE ||
                b->ckpt.offload || base->train.act_offload || base->build.trainer != MP_TRAINER_SFT ||
                (base->build.loss != MP_LOSS_HF && base->build.loss != MP_LOSS_CHUNKED_NLL) || cl < sl ||
                strcmp(base->model->hf_class + cl - sl, "ForCausalLM"))
                continue;
            vj.train.act_offload = true;
            so.ckpt_fixed = true;
            so.ckpt = b->ckpt;
        }
        struct mp_diag vd = {{0}};
        memset(vs, 0, sizeof *vs);
        if (mp_suggest(&vj, &so, argv0, vs, &vd) != MP_OK) /* (a model the variant refuses) */
            continue;
        if (vs->best >= 0 && s->n_alternatives < sizeof s->alternatives / sizeof s->alternatives[0]) {
            const struct mp_candidate *c = &vs->cand[vs->best];
            uint64_t seq = base->build.seq ? base->build.seq : base->model->seq_len, tok = 0;
            if (v->packing && c->micro_batch >= b->micro_batch && mp_mul_u64(c->micro_batch, seq, &tok)) {
                /* padded rows hold fewer real tokens whenever documents are shorter than seq: better
                 * for certain only where the packed rows are no fewer (under SDPA the packed mask
                 * can cost more rows than any padding saves: memplan does not know the padding) */
                char a1[32];
                snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                         "%s (%s): micro-batch %llu -> %llu = %llu real tokens per micro-batch, peak %s", flag,
                         v->what, (unsigned long long)b->micro_batch, (unsigned long long)c->micro_batch,
                         (unsigned long long)tok, mp_fmt_bytes(c->peak_device_bytes, a1, sizeof a1));
            } else if (v->act_offload) {
                /* what it frees on the device, and the pinned host RAM it takes */
                if (c->micro_batch > b->micro_batch) {
                    char a1[32], a2[32];
                    snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                             "%s (%s): micro-batch %llu -> %llu, peak %s, %s pinned host RAM, %.1f samples/s", flag,
                             v->what, (unsigned long long)b->micro_batch, (unsigned long long)c->micro_batch,
                             mp_fmt_bytes(c->peak_device_bytes, a1, sizeof a1),
                             mp_fmt_bytes(c->fit.est.host_pinned_bytes, a2, sizeof a2), c->samples_per_s);
                }
            } else if (v->sac != MP_SAC_NONE) {
                /* the same plan keeping what fits: what it saves is recompute, at the same peak target */
                if (c->samples_per_s > 1.01 * b->samples_per_s || c->micro_batch > b->micro_batch) {
                    char a1[32];
                    snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                             "%s (%s): micro-batch %llu -> %llu, recompute +%.1f%% -> +%.1f%%, peak %s, "
                             "%.1f -> %.1f samples/s",
                             flag, v->what, (unsigned long long)b->micro_batch, (unsigned long long)c->micro_batch,
                             b->recompute_pct, c->recompute_pct, mp_fmt_bytes(c->peak_device_bytes, a1, sizeof a1),
                             b->samples_per_s, c->samples_per_s);
                }
            } else if (!v->packing) {
                /* the variant at the recommendation's own plan (what it frees there), when the
                 * variant's best is another plan: "...; at checkpoint layers: micro-batch 6" */
                const struct mp_candidate *same = NULL;
                for (size_t q = 0; q < vs->n; q++) {
                    const struct mp_candidate *e = &vs->cand[q];
                    if (e != c && e->fits && e->ft == b->ft && e->precision == b->precision &&
                        e->par.strategy == b->par.strategy && e->ckpt.strategy == b->ckpt.strategy &&
                        e->ckpt.k == b->ckpt.k && e->ckpt.offload == b->ckpt.offload &&
                        e->micro_batch > b->micro_batch)
                        same = e;
                }
                if (c->micro_batch > b->micro_batch || c->samples_per_s > 1.01 * b->samples_per_s || same) {
                    char a1[32], sb[32], at[64] = "";
                    if (same) {
                        char sc[32];
                        snprintf(at, sizeof at, "; at checkpoint %s: micro-batch %llu",
                                 mp_ckpt_spec_str(&same->ckpt, sc, sizeof sc), (unsigned long long)same->micro_batch);
                    }
                    snprintf(s->alternatives[s->n_alternatives++], sizeof s->alternatives[0],
                             "%s (%s): micro-batch %llu -> %llu, %s, checkpoint %s, peak %s, %.1f samples/s%s",
                             flag, v->what, (unsigned long long)b->micro_batch, (unsigned long long)c->micro_batch,
                             mp_precision_str(c->precision), mp_ckpt_spec_str(&c->ckpt, sb, sizeof sb),
                             mp_fmt_bytes(c->peak_device_bytes, a1, sizeof a1), c->samples_per_s, at);
                }
            }
        }
        mp_suggestion_release(vs);
    }
    free(vs);
}

/* suggest: the space searched, the best candidate chosen (and confirmed by probes), else what
 * would fit. */
static enum mp_status suggest_run(const struct mp_job *base, const struct mp_suggest_opts *o_in, const char *argv0,
                                  struct mp_suggestion *s, struct mp_diag *d)
{
    memset(s, 0, sizeof *s);
    s->best = -1;
    double t0 = mp_now_ms();
    /* Data parallel: the global batch is micro x accumulation x ranks, so each rank's share is
     * G / world; the search below works per rank. */
    struct mp_suggest_opts rank_o = *o_in;
    const struct mp_suggest_opts *o = &rank_o;
    uint64_t world = base->train.par ? mp_par_world(base->train.par) : 1;
    if (world > 1 && rank_o.global_batch) {
        if (rank_o.global_batch % world)
            return mp_fail(d, MP_ERR_USAGE, "--global-batch %llu is not a multiple of the %llu data-parallel ranks",
                           (unsigned long long)rank_o.global_batch, (unsigned long long)world);
        rank_o.global_batch /= world;
    }
    struct space sp;
    search_space(base, o, &sp);
    enum mp_status st = search_space_eval(base, o, &sp, s, d);
    if (st != MP_OK)
        return st;
    bool bf16_only;
    s->best = choose_best(s, o, &bf16_only);
    char world_alt[160] = "";
    bool no_world = false; /* no world up to 128 nodes fits either */
    /* a fine-tune whose sharding is not modelled (QLoRA: DDP only, which does not shrink what a
     * rank holds) is never proposed a world (cli refuses it) */
    if (s->best < 0 && !base->train.par && !o->par_search && !o_in->no_alternatives &&
        strategy_modelled(base, MP_PAR_FSDP)) /* (GRPO's generation sharded: refused; DDP replicates) */
        no_world = !world_alternative(base, o, sp.precs[0], argv0, world_alt, sizeof world_alt, d);
    bool any_fit = s->best >= 0;
    if (s->best >= 0 && o->probe && (st = probe_best(base, o, s, &bf16_only, d)) != MP_OK) {
        mp_suggestion_release(s);
        return st;
    }
    if (s->best >= 0 && bf16_only)
        snprintf(s->note, sizeof s->note,
                 "only pure bf16 (no fp32 master weights) fits; watch convergence, or use a larger GPU");
    if (s->best >= 0) {
        const struct mp_candidate *b = &s->cand[s->best];
        s->global_met = !o_in->global_batch || b->global_batch == o_in->global_batch;
        if (o_in->hints && !base->train.par) /* (one GPU: four more searches) */
            variant_hints(base, o_in, argv0, s);
    } else if (!o_in->no_alternatives) {
        nofit_alternatives(base, o, o_in, sp.precs[0], argv0, any_fit, no_world, world_alt, s, d);
    }
    s->elapsed_ms = mp_now_ms() - t0;
    return MP_OK;
}

uint64_t mp_fit_shortfall(const struct mp_fit *f)
{
    uint64_t by = f->peak_device_bytes > f->usable_bytes ? f->peak_device_bytes - f->usable_bytes : 0;
    if (f->device_simulated && !f->fits_device && f->device_bytes > f->usable_bytes &&
        f->device_bytes - f->usable_bytes > by)
        by = f->device_bytes - f->usable_bytes;
    return by;
}

/* ---- GRPO's limits at the plan ------------------------------------------------------------------ */

/* Does the plan fit with completion comp (the prompt kept) and a vLLM share f?  window: the model's
 * smallest sliding window (0: none): generation's cache is not modelled past it (setup_grpo refuses
 * it), so a longer sequence does not fit. */
static enum mp_status grpo_fits(const struct mp_job *base, const struct mp_candidate *c, uint64_t comp, double f,
                                uint64_t window, bool *ok, struct mp_diag *d)
{
    struct mp_job j = *base;
    j.build.precision = c->precision;
    j.build.batch = c->micro_batch;
    j.ckpt = c->ckpt;
    j.train.accumulate = c->grad_accum > 1;
    mp_grpo_phases(&j.train, c->grad_accum);
    j.train.vllm_fraction = f;
    uint64_t P = base->build.seq - base->build.completion;
    if (window && window < P + comp) {
        *ok = false;
        return MP_OK;
    }
    j.build.seq = P + comp;
    j.build.completion = comp;
    if (j.train.gen_steps)
        j.train.gen_completion = comp;
    j.verdict_only = true;
    struct mp_fit fit;
    struct mp_diag why = {{0}};
    enum mp_status st = mp_fit_eval(&j, &fit, &why);
    if (st == MP_ERR_NOMEM || st == MP_ERR_INTERNAL) {
        *d = why;
        return st;
    }
    if (st != MP_OK) { /* a length the model refuses (its positions, sizes past 64 bits): not this plan */
        *ok = false;
        return MP_OK;
    }
    *ok = fit.fits;
    mp_fit_release(&fit);
    return MP_OK;
}

enum mp_status mp_grpo_limits(const struct mp_job *base, struct mp_suggestion *s, struct mp_diag *d)
{
    if (s->best < 0 || !base->build.completion || base->build.seq <= base->build.completion)
        return MP_OK;
    const struct mp_candidate *c = &s->cand[s->best];
    double f = base->train.vllm_fraction;
    uint64_t window = mp_model_min_window(base->model);
    uint64_t lo = base->build.completion, hi = 0;
    bool ok = false;
    enum mp_status st;
    /* the completion: doubling past the planned one, then bisecting [lo fits, hi does not] */
    for (uint64_t t = lo * 2; t <= MP_GRPO_MAX_COMPLETION; t *= 2) {
        if ((st = grpo_fits(base, c, t, f, window, &ok, d)) != MP_OK)
            return st;
        if (!ok) {
            hi = t;
            break;
        }
        lo = t;
    }
    while (hi && hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((st = grpo_fits(base, c, mid, f, window, &ok, d)) != MP_OK)
            return st;
        if (ok)
            lo = mid;
        else
            hi = mid;
    }
    s->grpo_max_completion = lo;
    s->grpo_completion_capped = !hi;
    /* vLLM's share, in hundredths: the planned one fits, and so does any smaller; the largest that
     * still does, of those tried (--vllm takes less than 1: at most 0.99) */
    if (f > 0) {
        unsigned a = (unsigned)floor(f * 100.0 + 1e-9), b = 100; /* [a fits, b cannot be asked] */
        while (b - a > 1) {
            unsigned mid = a + (b - a) / 2;
            if ((st = grpo_fits(base, c, base->build.completion, mid / 100.0, window, &ok, d)) != MP_OK)
                return st;
            if (ok)
                a = mid;
            else
                b = mid;
        }
        s->grpo_max_vllm = a / 100.0 > f ? a / 100.0 : f;
    }
    return MP_OK;
}
