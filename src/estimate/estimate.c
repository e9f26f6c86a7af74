/* estimate.c — the estimator: its visitor of the replay's events, the static figures, one run and the run
 * over a chain (replay.h). */
#include "replay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *mp_phase_str(enum mp_phase ph)
{
    static const char *n[] = {"setup", "forward", "loss", "recompute", "backward", "optimizer.step", "end",
                              "generation", "load"};
    return (unsigned)ph <= MP_PH_LOAD ? n[ph] : "?";
}

void mp_train_opts_default(struct mp_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->optimizer = MP_OPT_ADAMW;
    o->cublas_workspace_bytes = 8519680; /* :4096:2:16:8 (docs/memory-facts.md#cublas-workspace); 32 MiB on sm90 */
    o->accumulate = false;
    o->par = NULL;
}

/* bytes rounded up to the allocator's 512-byte granule, false when that leaves 64 bits */
bool round512(uint64_t bytes, uint64_t *r)
{
    if (bytes > UINT64_MAX - 511)
        return false;
    *r = mp_round512(bytes);
    return true;
}

static size_t key_of(const struct mp_program *p, const struct mp_event *ev)
{
    /* distinct slots per store kind */
    size_t nt = p->n_tensors, np = p->n_params, nn = p->n_nodes;
    switch (ev->store) {
    case MP_ST_PARAM: return (size_t)ev->id;
    case MP_ST_OPT_STATE: return np + (size_t)ev->id;
    case MP_ST_PGRAD: return 2 * np + (size_t)ev->id;
    case MP_ST_OPT_TMP: return 3 * np + (size_t)ev->id;
    case MP_ST_WORKSPACE: return 4 * np + 1;
    case MP_ST_INPUT:
    case MP_ST_ACT: return 4 * np + 2 + (size_t)ev->id;
    case MP_ST_GRAD: return 4 * np + 2 + nt + (size_t)ev->id;
    case MP_ST_TMP: return 4 * np + 2 + 2 * nt + (size_t)ev->id;
    case MP_ST_COMM: return 4 * np + 2 + 2 * nt + nn + 1 + (size_t)ev->id;
    }
    (void)nn;
    return 0;
}

/* Communication buffers that live for the whole run (DDP / DeepSpeed buckets, partitions). */
static bool persistent_comm(const struct mp_program *p, size_t key)
{
    size_t base = 4 * p->n_params + 2 + 2 * p->n_tensors + p->n_nodes + 1;
    if (key < base)
        return false;
    size_t kind = (key - base) % MP_COMM_KINDS;
    return kind == MP_COMM_BUCKET || kind == MP_COMM_PARTITION;
}

/* After an allocation: a new peak is where the event is. */
static void note_peak(struct counter *c, const struct mp_event *ev)
{
    if (c->cur > c->peak) {
        c->peak = c->cur;
        c->peak_phase = ev->phase;
        c->peak_node = ev->node;
        c->peak_store = ev->store;
        c->peak_id = ev->id;
    }
    if (c->cur_req > c->peak_req)
        c->peak_req = c->cur_req;
}

/* MEMPLAN_ALLOC_TRACE=FILE (a debugging aid, bench/alloc/README.md): the allocator model's
 * requests in bench/alloc/cca_ref.py's trace format, to replay them in another model of it. */
static void trace_event(struct counter *c, const struct mp_event *ev, size_t key)
{
    static const char *store[] = {"param", "opt_state", "workspace", "input", "act", "grad", "pgrad", "tmp",
                                  "opt_tmp", "comm"};
    if (!c->trace)
        return;
    if ((int)ev->phase != c->trace_phase)
        fprintf(c->trace, "m %s\n", mp_phase_str(ev->phase));
    c->trace_phase = (int)ev->phase;
    const struct mp_node *n = ev->node >= 0 && (size_t)ev->node < c->p->n_nodes ? &c->p->nodes[ev->node] : NULL;
    if (ev->kind == MP_EV_ALLOC) /* a KEY BYTES STORE PRIM NODE */
        fprintf(c->trace, "a %zu %llu %s %s %s\n", key, (unsigned long long)ev->bytes,
                (unsigned)ev->store < sizeof store / sizeof *store ? store[ev->store] : "?",
                n ? mp_prim_str(n->prim) : "-", n ? n->name : "-");
    else
        fprintf(c->trace, "f %zu\n", key);
}

/* A request to the allocator model; key's first block is the one its free releases. */
static enum mp_status asim_alloc(struct counter *c, size_t key, uint64_t bytes)
{
    int b = mp_asim_alloc(&c->as, bytes);
    if (b < 0 && c->as.overflow) {
        c->overflow = true;
        return MP_ERR_RANGE;
    }
    if (b < 0)
        return MP_ERR_NOMEM;
    if (!c->blk_of[key])
        c->blk_of[key] = (size_t)b + 1; /* (the state's other moments are never freed) */
    return MP_OK;
}

/* The optimizer state in the caching allocator's warm-up step.  torch.optim makes it lazily, in
 * the first optimizer.step(): _init_group creates each trainable parameter's state, parameter by
 * parameter, one torch.zeros_like tensor per moment (torch 2.11 torch/optim/adam.py _init_group:
 * state["exp_avg"], state["exp_avg_sq"]; AdamW is Adam with decoupled decay; SGD's momentum_buffer
 * a clone of the gradient in the step, sgd.py), before the update's foreach temporaries.  By then
 * the warm-up step's forward and backward have left their blocks cached, and the state is carved
 * from them instead of new segments: made at setup instead (before the first forward), it cost
 * GPT-2 8x1024 amp-bf16 + layers 1.3 GiB of reserved memory the H200 never had
 * (bench/alloc/README.md).  The allocated figures count it from the setup on as before (the
 * measured step starts with it).  Single-GPU plans only: DeepSpeed makes its partitions' state at
 * engine creation. */
static enum mp_status lazy_opt_state(struct counter *c, const struct mp_event *ev)
{
    size_t np = c->p->n_params;
    for (size_t q = 0; q < np; q++) {
        uint64_t b = c->lazy_state[q], part = b / (uint64_t)c->state_parts;
        if (!b)
            continue;
        for (int k = 0; k < c->state_parts; k++) {
            uint64_t n = k + 1 < c->state_parts ? part : b - part * (uint64_t)k;
            struct mp_event one = {.kind = MP_EV_ALLOC, .store = MP_ST_OPT_STATE, .node = -1, .phase = ev->phase,
                                   .bytes = n};
            trace_event(c, &one, np + q);
            enum mp_status st = asim_alloc(c, np + q, n);
            if (st != MP_OK)
                return st;
        }
    }
    free(c->lazy_state);
    c->lazy_state = NULL;
    return MP_OK;
}

/* The backward's cuBLAS workspace, in the caching allocator's warm-up step.  torch keeps one
 * workspace per (cuBLAS handle, stream) (aten/src/ATen/cuda/CublasHandlePool.cpp,
 * cublas_handle_stream_to_workspace), allocated through the caching allocator at a handle's first
 * GEMM; handles are per thread (DeviceThreadHandlePool), and the autograd engine runs a CUDA
 * backward on its own device thread: its first GEMM (the LM head's, after its output) makes a
 * second workspace, carved from what the loss's backward has just freed.  The allocated figures
 * hold both from the start (the measured steps' state: replay.c's setup, mp_workspaces_bytes);
 * the allocator model's warm-up requests this one here. */
static enum mp_status backward_workspace(struct counter *c, const struct mp_event *ev)
{
    if (ev->kind != MP_EV_ALLOC || (ev->phase != MP_PH_BACKWARD && ev->phase != MP_PH_RECOMPUTE) || ev->node < 0 ||
        (size_t)ev->node >= c->p->n_nodes || c->p->nodes[ev->node].prim != MP_P_LINEAR)
        return MP_OK;
    uint64_t b = c->ws_each;
    c->bwd_workspace = false;
    struct mp_event ws = {.kind = MP_EV_ALLOC, .store = MP_ST_WORKSPACE, .node = -1, .phase = ev->phase, .bytes = b};
    trace_event(c, &ws, c->nkeys);
    return mp_asim_alloc(&c->as, b) >= 0 ? MP_OK : c->as.overflow ? MP_ERR_RANGE : MP_ERR_NOMEM;
}

/* A node's transient is several tensors (its parts: build.c tmp_parts), each a request of its own
 * to the caching allocator, as torch makes them: one lump of their sum would take a segment torch
 * never makes (GPT-2 bf16: gelu_new's two 48 MiB intermediates, a 96 MiB segment).  How many
 * parts ev's transient has (1: one request), into parts[]. */
static int tmp_split(const struct counter *c, const struct mp_event *ev, uint64_t *parts)
{
    if (ev->store != MP_ST_TMP || ev->id < 0 || (size_t)ev->id >= c->p->n_nodes || !c->tmp_more)
        return 1;
    const struct mp_node *n = &c->p->nodes[ev->id];
    bool bwd = ev->phase == MP_PH_BACKWARD;
    int cnt = bwd ? n->n_bwd_tmp : n->n_fwd_tmp;
    const struct mp_tmp_part *pt = bwd ? n->bwd_tmp : n->fwd_tmp;
    if (cnt < 2 || ev->bytes != (bwd ? n->bwd_tmp_bytes : n->fwd_tmp_bytes)) /* (another transient) */
        return 1;
    for (int i = 0; i < cnt; i++)
        parts[i] = pt[i].bytes;
    return cnt;
}

static size_t more_key(const struct counter *c, int node, int i)
{
    return c->nkeys + 1 + (size_t)node * (MP_NODE_TMP_MAX - 1) + (size_t)i; /* (trace keys only) */
}

static enum mp_status asim_request(struct counter *c, const struct mp_event *ev, size_t key)
{
    if (ev->store == MP_ST_WORKSPACE && c->ws_each) {
        /* one request per handle's workspace; in the warm-up step the backward thread's comes at
         * its first GEMM (backward_workspace), else all of them here */
        struct mp_event one = *ev;
        one.bytes = c->ws_each;
        trace_event(c, &one, key);
        enum mp_status st = asim_alloc(c, key, one.bytes);
        for (int h = 1; h < MP_CUBLAS_HANDLES && st == MP_OK && !c->bwd_workspace; h++) {
            trace_event(c, &one, key);
            int b = mp_asim_alloc(&c->as, one.bytes); /* (never freed: no key of its own) */
            st = b >= 0 ? MP_OK : c->as.overflow ? MP_ERR_RANGE : MP_ERR_NOMEM;
        }
        return st;
    }
    uint64_t parts[MP_NODE_TMP_MAX];
    int cnt = tmp_split(c, ev, parts);
    if (cnt == 1) {
        trace_event(c, ev, key);
        return asim_alloc(c, key, ev->bytes);
    }
    for (int i = 0; i < cnt; i++) {
        struct mp_event one = *ev;
        one.bytes = parts[i];
        size_t k = i ? more_key(c, ev->id, i - 1) : key;
        trace_event(c, &one, k);
        if (!parts[i])
            continue;
        if (!i) {
            enum mp_status st = asim_alloc(c, key, parts[i]);
            if (st != MP_OK)
                return st;
            continue;
        }
        int b = mp_asim_alloc(&c->as, parts[i]);
        if (b < 0)
            return c->as.overflow ? MP_ERR_RANGE : MP_ERR_NOMEM;
        c->tmp_more[(size_t)ev->id * (MP_NODE_TMP_MAX - 1) + (size_t)(i - 1)] = b + 1;
    }
    return MP_OK;
}

static void asim_release(struct counter *c, const struct mp_event *ev, size_t key)
{
    trace_event(c, ev, key);
    mp_asim_free(&c->as, (int)c->blk_of[key] - 1);
    c->blk_of[key] = 0;
    if (ev->store != MP_ST_TMP || !c->tmp_more || ev->id < 0 || (size_t)ev->id >= c->p->n_nodes)
        return;
    for (int i = 0; i < MP_NODE_TMP_MAX - 1; i++) {
        int *m = &c->tmp_more[(size_t)ev->id * (MP_NODE_TMP_MAX - 1) + (size_t)i];
        if (*m) {
            struct mp_event one = *ev;
            trace_event(c, &one, more_key(c, ev->id, i));
            mp_asim_free(&c->as, *m - 1);
            *m = 0;
        }
    }
}

/* One event into c: the allocated bytes and their peaks, the caching allocator's requests. */
static enum mp_status count_one(struct counter *c, const struct mp_event *ev)
{
    if (ev->phase == MP_PH_FORWARD && !c->have_fwd) { /* (before the forward's first event counts) */
        c->have_fwd = true;
        c->fwd_start = c->cur;
    }
    if (ev->phase == MP_PH_SETUP && ev->store == MP_ST_PGRAD && ev->kind == MP_EV_ALLOC && !c->have_fwd)
        c->setup_grads += mp_round512(ev->bytes);
    if (ev->kind == MP_EV_LOSS_GRAD && !c->have_loss) {
        c->have_loss = true;
        c->act_at_loss = c->act_cur;
    }
    if (c->lazy_state && ev->phase == MP_PH_STEP) { /* (any event: SGD's step allocates nothing) */
        enum mp_status st = lazy_opt_state(c, ev);
        if (st != MP_OK)
            return st;
    }
    if (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE)
        return MP_OK;
    if (ev->kind == MP_EV_ALLOC && ev->phase == MP_PH_LOSS && ev->store == MP_ST_GRAD && !c->have_loss)
        c->before_loss = c->cur; /* (the seed's allocation, before it is counted) */
    uint64_t r = 0;
    bool act = ev->store == MP_ST_ACT || ev->store == MP_ST_GRAD || ev->store == MP_ST_TMP;
    size_t key = key_of(c->p, ev);
    if (ev->kind == MP_EV_ALLOC) {
        if (!round512(ev->bytes, &r) || !mp_add_u64(c->cur, r, &c->cur) ||
            !mp_add_u64(c->cur_req, ev->bytes, &c->cur_req) || (act && !mp_add_u64(c->act_cur, r, &c->act_cur))) {
            c->overflow = true;
            return MP_ERR_RANGE;
        }
        note_peak(c, ev);
        /* (the steady step's setup: what the first step left allocated keeps its block; what it
         * freed, such as the .grad an accumulating step makes at setup and zero_grad drops, is
         * requested again) */
        bool kept = c->warm && ev->phase == MP_PH_SETUP && key < c->nkeys && c->blk_of && c->blk_of[key];
        if (ev->bytes && key < c->nkeys && !c->no_asim && !kept) {
            if (c->lazy_state && ev->store == MP_ST_OPT_STATE && (size_t)ev->id < c->p->n_params) {
                c->lazy_state[ev->id] = ev->bytes; /* made at the first optimizer.step (lazy_opt_state) */
                return MP_OK;
            }
            enum mp_status st = asim_request(c, ev, key);
            if (st == MP_OK && c->bwd_workspace)
                st = backward_workspace(c, ev);
            if (st != MP_OK)
                return st;
        }
    } else {
        r = mp_round512(ev->bytes); /* (allocated before: it was checked then) */
        c->cur -= r;
        c->cur_req -= ev->bytes;
        if (act)
            c->act_cur -= r;
        if (ev->bytes && c->blk_of && key < c->nkeys && c->blk_of[key])
            asim_release(c, ev, key);
    }
    return MP_OK;
}

/* The estimator's visitor: count_one, and the reserved series where asked (run_counter). */
static enum mp_status count_event(void *ctx, const struct mp_event *ev)
{
    struct counter *c = ctx;
    enum mp_status st = count_one(c, ev);
    struct mp_series *sr = c->series;
    if (st != MP_OK || !sr || !c->warm || (ev->kind != MP_EV_ALLOC && ev->kind != MP_EV_FREE))
        return st;
    if (sr->n == sr->cap) {
        size_t nc = sr->cap ? 2 * sr->cap : 1024;
        uint64_t *nv = realloc(sr->v, nc * sizeof *nv);
        if (!nv) {
            sr->nomem = true;
            return MP_ERR_NOMEM;
        }
        sr->v = nv;
        sr->cap = nc;
    }
    sr->v[sr->n++] = c->as.reserved;
    return MP_OK;
}

void mp_estimate_release(struct mp_estimate *e)
{
    if (!e)
        return;
    free(e->blocks);
    e->blocks = NULL;
}

/* The batch and the module buffers (resident from the start), into e; false on an overflow. */
bool inputs_bytes(const struct mp_program *p, struct mp_estimate *e)
{
    bool ok = mp_add_u64(p->tensors[p->input].bytes, p->labels >= 0 ? p->tensors[p->labels].bytes : 0,
                         &e->input_bytes);
    for (int k = 0; k < 2; k++) { /* --images: the ids and token_type_ids beside the pixel values */
        int t = k ? p->type_ids : p->ids;
        ok = ok && (t < 0 || mp_add_u64(e->input_bytes, p->tensors[t].bytes, &e->input_bytes));
    }
    for (size_t b = 0; b < p->n_buffers; b++)
        ok = ok && mp_add_u64(e->module_buffers_bytes, p->tensors[p->buffers[b]].bytes, &e->module_buffers_bytes);
    return ok;
}

/* The cuBLAS workspaces into e (mp_workspaces_bytes): MP_ERR_RANGE past 64 bits, naming --workspace. */
enum mp_status workspaces_into(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                               struct mp_diag *d)
{
    if (!mp_workspaces_bytes(t, &e->workspace_bytes))
        return mp_fail(d, MP_ERR_RANGE, "%s: %d cuBLAS workspaces (--workspace) of %llu bytes overflow 64 bits",
                       p->model->path, MP_CUBLAS_HANDLES, (unsigned long long)t->cublas_workspace_bytes);
    return MP_OK;
}

/* e->static_bytes: what is resident before the step, the cuBLAS workspace included.  With the
 * gradients it is all live as the optimizer step starts: that sum must fit 64 bits too. */
enum mp_status static_total(const struct mp_program *p, struct mp_estimate *e, struct mp_diag *d)
{
    uint64_t s = e->weights_bytes, all;
    if (!mp_add_u64(s, e->ref_weights_bytes, &s) || !mp_add_u64(s, e->optimizer_bytes, &s) || !mp_add_u64(s, e->input_bytes, &s) ||
        !mp_add_u64(s, e->module_buffers_bytes, &s) || !mp_add_u64(s, e->grads_bytes, &all))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    if (!mp_add_u64(s, e->workspace_bytes, &e->static_bytes) || !mp_add_u64(all, e->workspace_bytes, &all))
        return mp_fail(d, MP_ERR_RANGE, "%s: the cuBLAS workspace (--workspace) of %llu bytes overflows 64 bits "
                       "with the weights, gradients and optimizer state", p->model->path,
                       (unsigned long long)e->workspace_bytes);
    return MP_OK;
}

/* The step's bytes left 64 bits: MP_ERR_RANGE, naming --workspace when it is most of them. */
enum mp_status peak_overflow(const struct mp_program *p, const struct mp_train_opts *t, struct mp_diag *d)
{
    if (t->cublas_workspace_bytes > UINT64_MAX / (2 * MP_CUBLAS_HANDLES))
        return mp_fail(d, MP_ERR_RANGE, "%s: memory overflows 64 bits with the cuBLAS workspace (--workspace) of %llu "
                       "bytes", p->model->path, (unsigned long long)t->cublas_workspace_bytes);
    return mp_fail(d, MP_ERR_RANGE, "%s: memory overflows 64 bits", p->model->path);
}

/* e's peak on the device: the allocated peak plus the CUDA context.  The load (FSDP2 with a 4-bit
 * base: the model whole on the GPU before fully_shard) is the peak where it is larger: torch's
 * max_memory_allocated counts it, and the step never runs if it does not fit. */
enum mp_status device_peak(const struct mp_program *p, uint64_t context_bytes, struct mp_estimate *e,
                           struct mp_diag *d)
{
    if (e->load_bytes > e->peak_allocated_bytes) {
        e->peak_allocated_bytes = e->load_bytes;
        e->peak_requested_bytes = mp_max_u64(e->peak_requested_bytes, e->load_bytes);
        e->peak_reserved_bytes = mp_max_u64(e->peak_reserved_bytes, e->load_bytes);
        e->reserved_frag_bytes = 0; /* (the load's reserved bytes are not simulated) */
    }
    e->overhead_bytes = context_bytes;
    if (!mp_add_u64(e->peak_allocated_bytes, context_bytes, &e->peak_device_bytes) ||
        !mp_add_u64(e->peak_device_bytes, e->vllm_bytes, &e->peak_device_bytes))
        return mp_fail(d, MP_ERR_RANGE, "%s: the CUDA context (--context) of %llu bytes overflows 64 bits with "
                       "the peak", p->model->path, (unsigned long long)context_bytes);
    return MP_OK;
}

/* The load named as the peak where it is (device_peak raised the peak to it). */
void name_load_peak(struct mp_estimate *e)
{
    if (!e->load_bytes || e->load_bytes < e->peak_allocated_bytes)
        return;
    e->peak_phase = MP_PH_LOAD;
    snprintf(e->peak_event, sizeof e->peak_event, "load:from_pretrained");
}

/* One rank's resident figures under data-parallel plan pp (replacing one GPU's). */
void par_static(const struct mp_par_plan *pp, const struct mp_train_opts *t, struct mp_estimate *e)
{
    e->world = pp->world;
    e->load_bytes = 0;
    if (pp->load_bytes && !mp_add_u64(pp->load_bytes, e->module_buffers_bytes, &e->load_bytes))
        e->load_bytes = UINT64_MAX; /* (saturated: it fits nothing) */
    e->weights_bytes = pp->weights_bytes;
    e->grads_bytes = pp->grads_bytes;
    e->optimizer_bytes = pp->optimizer_bytes;
    e->buffers_bytes = pp->buffers_bytes;
    e->host_bytes = pp->host_bytes;
    e->nvme_bytes = pp->nvme_bytes;
    e->allgather_bytes = pp->allgather_bytes;
    e->reducescatter_bytes = pp->reducescatter_bytes;
    e->allreduce_bytes = pp->allreduce_bytes;
    e->pcie_bytes = pp->pcie_bytes;
    e->host_step_elems = pp->host_step_elems;
    e->n_groups = (size_t)pp->groups_total;
    if (pp->efsdp) {
        e->ep = pp->par.ep, e->efsdp = pp->efsdp;
        e->expert_weights_bytes = pp->expert_weights_bytes;
        e->expert_grads_bytes = pp->expert_grads_bytes;
        e->expert_optimizer_bytes = pp->expert_optimizer_bytes;
        e->expert_gather_bytes = pp->expert_gather_bytes;
    }
    if (mp_par_is_deepspeed(pp->par.strategy) || pp->par.offload != MP_OFFLOAD_NONE)
        e->optimizer_tmp_bytes = 0; /* fused Adam / the host steps */
    else if (mp_par_is_fsdp(pp->par.strategy) && e->optimizer_tmp_bytes)
        e->optimizer_tmp_bytes = mp_optimizer_tmp(t->optimizer) == MP_OPT_TMP_LARGEST ? e->optimizer_tmp_bytes / pp->world
                                                                  : pp->grad_shard_total * pp->reduce_elem_bytes;
}

/* The forwards a step runs over the batch's sequences: the policy's, and the trainer's no-grad
 * ones: the reference's (its adapter off; DPO one, KTO two: the KL sequences and the batch) and
 * the policy's (KTO's KL sequences). */
double mp_fwd_passes(enum mp_trainer tr, const struct mp_train_opts *t)
{
    /* (GRPO's no-grad forwards, old log-probs and reference, serve num_iterations passes) */
    double it = t->gen_every && t->gen_iterations > 1 ? t->gen_iterations : 1.0;
    return 1.0 + mp_trainer_kl_fwds(tr) + (t->ref != MP_REF_NONE ? mp_trainer_ref_fwds(tr) / it : 0) +
           (t->old_logps ? 1.0 / it : 0.0);
}

enum mp_status mp_estimate_static(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                                  struct mp_diag *d)
{
    memset(e, 0, sizeof *e);
    e->params = p->total_params;
    e->trainable_params = p->trainable_params;
    bool ok = true;
    for (size_t q = 0; q < p->n_params; q++)
        ok = ok && mp_add_u64(e->weights_bytes, p->params[q].raw_bytes, &e->weights_bytes) &&
             mp_add_u64(e->grads_bytes, mp_param_grad_bytes(&p->params[q]), &e->grads_bytes) &&
             mp_add_u64(e->optimizer_bytes, mp_opt_state_bytes(p, t->optimizer, &p->params[q]), &e->optimizer_bytes);
    if (!ok || !inputs_bytes(p, e))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    e->optimizer_tmp_bytes = mp_opt_step_tmp_bytes(p, t->optimizer); /* (at most grads_bytes: checked) */
    enum mp_status wst = workspaces_into(p, t, e, d);
    if (wst != MP_OK)
        return wst;
    double passes = mp_fwd_passes(p->opts.trainer, t);
    e->fwd_flops = p->fwd_flops * passes;
    for (size_t i = 0; i < p->n_blocks; i++) /* (a reference copy is never quantized: QLoRA's is the adapter) */
        e->dequant_bytes += p->blocks[i].dequant_bytes * (passes + 1.0);
    e->bwd_flops = p->bwd_flops;

    e->world = 1;
    if (!ok || !mp_ref_weights_bytes(p, t, &e->ref_weights_bytes))
        return mp_fail(d, MP_ERR_RANGE, "%s: sizes overflow 64 bits", p->model->path);
    if (t->par && t->par->strategy != MP_PAR_NONE) {
        struct mp_par_plan pp;
        enum mp_status st = mp_par_plan_make(t->par, p, t->optimizer, &pp, d);
        if (st != MP_OK)
            return st;
        par_static(&pp, t, e);
        mp_par_plan_release(&pp);
    }
    return static_total(p, e, d);
}

enum mp_status mp_estimate_run(const struct mp_program *p, const struct mp_schedule *sched,
                               const struct mp_train_opts *t, uint64_t context_bytes, struct mp_estimate *e,
                               struct mp_diag *d)
{
    return mp_estimate_run_chain(p, sched, t, context_bytes, NULL, e, d);
}

/* Block j's figures (activation: what it keeps for backward, from the chain). */
void block_est(const struct mp_program *p, const struct mp_train_opts *t, size_t j, uint64_t activation,
               struct mp_block_est *b)
{
    const struct mp_block_prog *bp = &p->blocks[j];
    b->params = bp->params;
    for (size_t q = bp->param0; q < bp->param0 + bp->n_params; q++) {
        b->weights_bytes += p->params[q].raw_bytes;
        b->grads_bytes += mp_param_grad_bytes(&p->params[q]);
        b->optimizer_bytes += mp_opt_state_bytes(p, t->optimizer, &p->params[q]);
    }
    b->activation_bytes = activation;
    b->output_bytes = p->tensors[bp->output].bytes;
    b->fwd_flops = bp->fwd_flops;
    b->bwd_flops = bp->bwd_flops;
}

/* ---- DPO's and KTO's reference forward (mp_train_opts.ref) ------------------------------------------------
 * trl 1.16.0 DPOTrainer._compute_loss (trainer/dpo_trainer.py:1317-1338): after the policy's
 * forward (its graph, saved tensors and per-token outputs held), the reference runs the same
 * 2 x batch sequences under torch.no_grad through its fused LM head, with the copy (ref_model) or
 * the policy itself with the adapter disabled (use_adapter(model, None) = peft's disable_adapter);
 * then the loss and the policy's backward.  Under amp the policy's autocast cache is gone by then:
 * accelerate wraps each prepared model's forward in autocast (accelerate 1.15 accelerator.py
 * :1825-1835; transformers 5.24 trainer.py:2231-2236 adds none), so the policy's region ends with
 * its forward, and the frozen reference caches no copy.  Its forward is this program's, every block run
 * without grad (Fn), measured alone: what it adds above what it starts with at its peak.
 * trl 1.16.0 KTOTrainer._compute_loss (trainer/kto_trainer.py:1370-1436) runs its two reference
 * forwards (the KL sequences, then the batch) at that point, one after the other: what the first
 * leaves is its (b) sum of log-probs, so the two peak alike.  Its first forward, the policy's
 * no-grad forward of the KL sequences, runs before the policy's graph exists: at every op it holds
 * no more than the policy's forward does at the same op, so it is never the step's peak. */
bool mp_ref_weights_bytes(const struct mp_program *p, const struct mp_train_opts *t, uint64_t *bytes)
{
    *bytes = 0;
    if (t->ref == MP_REF_COPY && t->par && mp_par_is_fsdp(t->par->strategy)) {
        /* sharded as one unit; without reshard_after_forward its first forward leaves it gathered
         * for good (no backward reshards a frozen model) */
        uint64_t shard, whole;
        if (!mp_par_fsdp_ref_bytes(t->par, p, &shard, &whole))
            return false;
        return mp_add_u64(shard, t->par->strategy == MP_PAR_FSDP_NO_RESHARD ? whole : 0, bytes);
    }
    if (t->ref == MP_REF_COPY && t->par && t->par->strategy == MP_PAR_ZERO3) /* partitioned by its own engine */
        return mp_par_z3_ref_bytes(t->par, p, bytes, NULL);
    if (t->ref == MP_REF_COPY) /* trl dpo_trainer.py:916-927: the model again, frozen, in its dtype */
        for (size_t q = 0; q < p->n_params; q++)
            if (!mp_add_u64(*bytes, p->params[q].raw_bytes, bytes))
                return false;
    return true;
}

struct ref_meter {
    uint64_t cur, base, peak;
    int peak_node;
    bool started, overflow;
    const char *what; /* the event's prefix: "reference" (NULL) or "policy" */
    size_t limit;     /* peaks only at nodes below this one (0: every node) */
    char peak_name[sizeof ((struct mp_estimate *)0)->ref_forward_event];
};

static enum mp_status ref_event(void *ctx, const struct mp_program *p, const struct mp_event *ev)
{
    struct ref_meter *m = ctx;
    if (ev->kind == MP_EV_OP_BEGIN && !m->started) {
        m->started = true;
        m->base = m->peak = m->cur;
    }
    if (ev->kind == MP_EV_ALLOC) {
        uint64_t r;
        if (!round512(ev->bytes, &r) || !mp_add_u64(m->cur, r, &m->cur)) {
            m->overflow = true;
            return MP_ERR_RANGE;
        }
        bool counted = !m->limit || (ev->node >= 0 && (size_t)ev->node < m->limit);
        if (m->started && ev->phase == MP_PH_FORWARD && m->cur > m->peak && counted) {
            m->peak = m->cur;
            m->peak_node = ev->node;
            snprintf(m->peak_name, sizeof m->peak_name, "%s.forward:%s", m->what ? m->what : "reference",
                     ev->node >= 0 && (size_t)ev->node < p->n_nodes ? p->nodes[ev->node].name : "?");
        }
    } else if (ev->kind == MP_EV_FREE)
        m->cur -= mp_round512(ev->bytes);
    return MP_OK;
}

/* The reference forward's own peak (above its start) into e->ref_forward_tmp_bytes: a copy's
 * activations as on one GPU (mp_replay_nograd_forward) and, under FSDP2, mp_ref_gather_bytes. */
bool mp_ref_gather_bytes(const struct mp_program *p, const struct mp_train_opts *t, uint64_t *bytes)
{
    uint64_t shard, whole;
    *bytes = 0;
    if (t->ref != MP_REF_COPY || !t->par || t->par->strategy != MP_PAR_FSDP)
        return true;
    /* the parameters and the flat output, each one 512-rounded block */
    return mp_par_fsdp_ref_bytes(t->par, p, &shard, &whole) && round512(whole, &whole) &&
           mp_add_u64(whole, whole, bytes);
}

static enum mp_status ref_forward(const struct mp_program *policy, const struct mp_train_opts *t,
                                  struct mp_estimate *e, struct mp_diag *d)
{
    struct ref_meter m = {.peak_node = -1, .peak_name = "reference.forward:?"};
    enum mp_status st = mp_replay_nograd_forward(policy, t, true, ref_event, &m, d);
    if (st == MP_ERR_RANGE && m.overflow)
        return peak_overflow(policy, t, d);
    if (st != MP_OK)
        return st;
    uint64_t gather;
    if (!mp_ref_gather_bytes(policy, t, &gather) || !mp_add_u64(m.peak - m.base, gather, &e->ref_forward_tmp_bytes))
        return peak_overflow(policy, t, d);
    snprintf(e->ref_forward_event, sizeof e->ref_forward_event, "%s", m.peak_name);
    return MP_OK;
}

/* The step's peak as the larger of its two phases (e's policy figures, c's forward end): the
 * reference's forward on top of what the policy's forward holds (DPO, KTO; with what the trainer
 * holds besides, p->ref_held_bytes: LLaMA-Factory's logits), or on the resident
 * state alone where it runs before the policy's (GRPO: the replay's setup, no gradients). */
static enum mp_status ref_phases(const struct mp_program *p, const struct mp_train_opts *t, const struct counter *c,
                                 struct mp_estimate *e, struct mp_diag *d)
{
    enum mp_status st = ref_forward(p, t, e, d);
    if (st != MP_OK)
        return st;
    /* (GRPO: the policy's resident state, whose adapters and their optimizer state the reference's
     * own replay, built without the adapters, does not hold; the accumulated gradients only when
     * generation falls mid-accumulation) */
    uint64_t w = e->ref_weights_bytes, pol, ref, res, req;
    uint64_t pre = c->fwd_start - (t->gen_grads ? 0 : c->setup_grads);
    if (!mp_add_u64(c->peak, w, &pol) || !mp_add_u64(t->ref_before_policy ? pre : c->before_loss, w, &ref) ||
        !mp_add_u64(ref, e->ref_forward_tmp_bytes, &ref) || !mp_add_u64(ref, p->ref_held_bytes, &ref) ||
        !mp_add_u64(mp_max_u64(c->as.peak_reserved, c->peak), w, &res) || !mp_add_u64(c->peak_req, w, &req))
        return peak_overflow(p, t, d);
    e->policy_peak_bytes = pol;
    e->ref_forward_peak_bytes = ref;
    e->peak_allocated_bytes = mp_max_u64(pol, ref);
    e->peak_requested_bytes = mp_max_u64(req, ref); /* (the reference phase's: its rounded bytes) */
    e->peak_reserved_bytes = mp_max_u64(res, ref);  /* (its reserved bytes are not modelled) */
    return MP_OK;
}

static void raise_peaks(struct mp_estimate *e, uint64_t bytes) /* (a phase's reserved: its allocated) */
{
    e->peak_allocated_bytes = mp_max_u64(e->peak_allocated_bytes, bytes);
    e->peak_requested_bytes = mp_max_u64(e->peak_requested_bytes, bytes);
    e->peak_reserved_bytes = mp_max_u64(e->peak_reserved_bytes, bytes);
}

/* The first node of the trainer's code on the model's output: LLaMA-Factory's loss node, and the
 * fp32 cast before it (`.logits.to(torch.float32)`, or accelerate's convert_outputs_to_fp32),
 * both outside the model's autocast region. */
static size_t lf_tail(const struct mp_program *p)
{
    size_t k = p->n_nodes;
    while (k > 0 && p->nodes[k - 1].prim != MP_P_FUSED_LOSS)
        k--;
    if (k == 0)
        return p->n_nodes;
    k--;
    if (k > 0 && p->nodes[k - 1].out == p->nodes[k].in[0] && strstr(p->nodes[k - 1].name, "logits_fp32"))
        k--;
    return k;
}

/* One no-grad forward of the policy's own program into m (gen_pass: autocast caches the trainable
 * weights' half copies); MP_ERR_RANGE as peak_overflow's. */
static enum mp_status policy_nograd(const struct mp_program *p, const struct mp_train_opts *t, bool gen,
                                    struct ref_meter *m, struct mp_diag *d)
{
    struct mp_train_opts rt = *t;
    rt.gen_pass = gen;
    enum mp_status st = mp_replay_nograd_forward(p, &rt, false, ref_event, m, d);
    return st == MP_ERR_RANGE && m->overflow ? peak_overflow(p, t, d) : st;
}

/* LLaMA-Factory's KTO (llamafactory 0.9.5 train/kto/trainer.py:183-199 concatenated_forward): after
 * the policy's forward on the batch, with its graph and its fp32 logits held (p->kl_held_bytes),
 * the policy itself runs the KL sequences under torch.no_grad (its adapter on).  Its weights
 * require grad, so under autocast their half copies are cached through the model's forward as with
 * grad (gen_pass) and dropped as the autocast region ends, before the trainer's fp32 cast and
 * get_batch_logps (lf_tail): the forward's peak is the larger of the model's part with the copies
 * and the whole without them (bench/accuracy/lf_kto_step.py: the bf16-amp LoRA row).  Part of the
 * policy's step: its figure, and the step's peak where it is the larger. */
static enum mp_status kl_phase(const struct mp_program *p, const struct mp_train_opts *t, const struct counter *c,
                               struct mp_estimate *e, struct mp_diag *d)
{
    struct ref_meter m = {.peak_node = -1, .what = "policy", .peak_name = "policy.forward:?", .limit = lf_tail(p)};
    struct ref_meter w = {.peak_node = -1, .what = "policy", .peak_name = "policy.forward:?"};
    enum mp_status st = policy_nograd(p, t, true, &m, d);
    if (st == MP_OK)
        st = policy_nograd(p, t, false, &w, d);
    if (st != MP_OK)
        return st;
    const struct ref_meter *top = m.peak - m.base > w.peak - w.base ? &m : &w;
    uint64_t kl;
    if (!mp_add_u64(c->before_loss, e->ref_weights_bytes, &kl) || !mp_add_u64(kl, top->peak - top->base, &kl) ||
        !mp_add_u64(kl, p->kl_held_bytes, &kl))
        return peak_overflow(p, t, d);
    e->kl_forward_peak_bytes = kl;
    snprintf(e->kl_forward_event, sizeof e->kl_forward_event, "%s", top->peak_name);
    e->policy_peak_bytes = mp_max_u64(e->policy_peak_bytes, kl);
    raise_peaks(e, kl);
    return MP_OK;
}

/* GRPO's old log-probs: the policy's own forward under torch.no_grad over the generation batch, a
 * micro-batch at a time (trl 1.16.0 grpo_trainer.py:2646-2655, _get_per_token_logps_and_entropies
 * at batch_size = per_device_train_batch_size), through the fused head as the step's, on the
 * resident state and the reference copy.  The policy's weights require grad, so under autocast
 * its half copies are cached for the forward (gen_pass).  The step's peak where it is larger.
 * What generation leaves for the step (the ids, masks, the (b x C) log-probs) is not counted:
 * kilobytes to a few megabytes beside the forward's. */
static enum mp_status old_phase(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                                struct mp_diag *d)
{
    struct ref_meter m = {.peak_node = -1, .what = "policy", .peak_name = "policy.forward:?"};
    struct mp_train_opts rt = *t;
    rt.gen_pass = true;
    enum mp_status st = mp_replay_nograd_forward(p, &rt, false, ref_event, &m, d);
    if (st == MP_ERR_RANGE && m.overflow)
        return peak_overflow(p, t, d);
    if (st != MP_OK)
        return st;
    if (!mp_add_u64(m.peak, e->ref_weights_bytes, &e->old_forward_peak_bytes))
        return peak_overflow(p, t, d);
    snprintf(e->old_forward_event, sizeof e->old_forward_event, "%s", m.peak_name);
    raise_peaks(e, e->old_forward_peak_bytes);
    return MP_OK;
}

/* GRPO's generation (generate.c), the reference copy beside it: the step's peak where it is larger.
 * Its reserved bytes are not simulated: the allocated figure stands for them. */
static enum mp_status gen_phase(const struct mp_program *p, const struct mp_train_opts *t, struct mp_estimate *e,
                                struct mp_diag *d)
{
    enum mp_status st = mp_generation_phase(p, t, e, d);
    if (st != MP_OK)
        return st;
    /* FSDP2: a reference copy's forward runs after generate, the policy's units it left gathered
     * still held (the root, the tail not resharded after forward; every unit under
     * fsdp-no-reshard); the adapter-off reference is the policy's own forward, whose replay
     * gathers them itself */
    if (t->ref == MP_REF_COPY && t->ref_before_policy && e->gen_left_bytes) {
        if (!mp_add_u64(e->ref_forward_peak_bytes, e->gen_left_bytes, &e->ref_forward_peak_bytes))
            return peak_overflow(p, t, d);
        raise_peaks(e, e->ref_forward_peak_bytes);
    }
    if (!mp_add_u64(e->gen_peak_bytes, e->ref_weights_bytes, &e->gen_peak_bytes) ||
        !mp_add_u64(e->gen_prefill_peak_bytes, e->ref_weights_bytes, &e->gen_prefill_peak_bytes) ||
        !mp_add_u64(e->gen_decode_peak_bytes, e->ref_weights_bytes, &e->gen_decode_peak_bytes))
        return peak_overflow(p, t, d);
    raise_peaks(e, e->gen_peak_bytes);
    return MP_OK;
}

/* The caching allocator is not simulated: too many nodes, or the caller decides on allocated bytes. */
static bool asim_skipped(const struct mp_program *p, const struct mp_train_opts *t)
{
    return p->n_nodes > MP_ASIM_MAX_NODES || t->skip_reserved;
}

/* The step through counter c twice (the caching allocator reaches its steady state in the
 * second; once where it is not simulated): c's peaks, the allocator's figures and, with
 * c->series, its reserved bytes after each ALLOC/FREE event of the second step. */
static enum mp_status run_counter(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, struct counter *cp, struct mp_diag *d)
{
    struct counter c = *cp;
    enum mp_status st = MP_OK;
    /* The allocator model scans free blocks per allocation; beyond this many nodes
     * (thousands of layers) it would dominate the run, so reserved falls back to the
     * allocated peak (fit decisions never use it). */
    c.p = p;
    c.peak_node = -1;
    c.no_asim = asim_skipped(p, t);
    c.nkeys = 4 * p->n_params + 2 + 2 * p->n_tensors + p->n_nodes + 1;
    if (t->par && t->par->strategy != MP_PAR_NONE) /* communication slots: groups or buckets */
        c.nkeys += (p->n_params + 2 * p->n_blocks + 2) * MP_COMM_KINDS;
    mp_asim_init(&c.as, t->alloc, t->alloc_limit, t->device_total);
    c.ws_each = t->cublas_workspace_bytes;
    c.blk_of = c.no_asim ? NULL : calloc(c.nkeys, sizeof *c.blk_of); /* only the allocator model reads it */
    if (!c.no_asim && !c.blk_of)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    if (!c.no_asim && !(c.tmp_more = calloc((p->n_nodes ? p->n_nodes : 1) * (MP_NODE_TMP_MAX - 1), sizeof *c.tmp_more))) {
        free(c.blk_of);
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    }
    if (!c.no_asim && (!t->par || t->par->strategy == MP_PAR_NONE)) { /* (lazy_opt_state) */
        c.bwd_workspace = t->cublas_workspace_bytes != 0;
        c.state_parts = mp_optimizer_state(t->optimizer) == MP_OPT_STATE_TWO ? 2 : 1;
        if (!(c.lazy_state = calloc(p->n_params ? p->n_params : 1, sizeof *c.lazy_state))) {
            free(c.blk_of);
            free(c.tmp_more);
            return mp_fail(d, MP_ERR_NOMEM, "out of memory");
        }
    }
    const char *trace = c.no_asim || c.series ? NULL : getenv("MEMPLAN_ALLOC_TRACE");
    if (trace && *trace && !(c.trace = fopen(trace, "w")))
        fprintf(stderr, "memplan: warning: MEMPLAN_ALLOC_TRACE: cannot write %s\n", trace);
    /* Two steps: the caching allocator reaches its steady state in the second. */
    for (int step = 0; step < (c.no_asim ? 1 : 2) && st == MP_OK; step++) {
        c.have_loss = c.have_fwd = false;
        c.setup_grads = 0;
        c.trace_phase = -1;
        if (c.trace)
            fprintf(c.trace, "m step %d\n", step);
        st = mp_replay(p, sched, t, count_event, &c, d);
        if (st == MP_OK && step == 0 && c.lazy_state) /* a step without an optimizer phase */
            st = lazy_opt_state(&c, &(struct mp_event){.phase = MP_PH_END});
        if (st == MP_OK && step == 0) {
            c.cur = c.cur_req = c.act_cur = 0;
            c.warm = true; /* persistent storages (setup) keep their blocks; anything else
                            * still held would be a replay bug and is released */
            for (size_t k = 0; c.blk_of && k < c.nkeys; k++)
                if (c.blk_of[k] && k >= 3 * p->n_params && k != 4 * p->n_params + 1 && !persistent_comm(p, k) &&
                    !(k >= 4 * p->n_params + 2 && k < 4 * p->n_params + 2 + p->n_tensors &&
                      mp_program_resident(p, (int)(k - 4 * p->n_params - 2)))) {
                    if (c.trace)
                        fprintf(c.trace, "f %zu\n", k);
                    mp_asim_free(&c.as, (int)c.blk_of[k] - 1);
                    c.blk_of[k] = 0;
                }
            for (size_t k = 0; c.tmp_more && k < p->n_nodes * (MP_NODE_TMP_MAX - 1); k++)
                if (c.tmp_more[k]) {
                    mp_asim_free(&c.as, c.tmp_more[k] - 1);
                    c.tmp_more[k] = 0;
                }
        }
    }
    free(c.blk_of);
    free(c.tmp_more);
    free(c.lazy_state);
    mp_asim_release(&c.as);
    if (c.trace)
        fclose(c.trace);
    c.blk_of = NULL;
    c.tmp_more = NULL;
    c.lazy_state = NULL;
    c.trace = NULL;
    *cp = c;
    if (st == MP_ERR_RANGE && c.overflow)
        return peak_overflow(p, t, d);
    if (st != MP_OK)
        return st == MP_ERR_NOMEM ? mp_fail(d, st, "out of memory") : st;
    return MP_OK;
}

enum mp_status mp_reserved_series(const struct mp_program *p, const struct mp_schedule *sched,
                                  const struct mp_train_opts *t, uint64_t **out, size_t *n, struct mp_diag *d)
{
    *out = NULL;
    *n = 0;
    if (asim_skipped(p, t))
        return MP_OK;
    struct mp_series ser = {0};
    struct counter c = {.series = &ser};
    enum mp_status st = run_counter(p, sched, t, &c, d);
    if (st != MP_OK || c.no_asim || ser.nomem) {
        free(ser.v);
        return st == MP_OK && ser.nomem ? mp_fail(d, MP_ERR_NOMEM, "out of memory") : st;
    }
    *out = ser.v;
    *n = ser.n;
    return MP_OK;
}

enum mp_status mp_estimate_run_chain(const struct mp_program *p, const struct mp_schedule *sched,
                                     const struct mp_train_opts *t, uint64_t context_bytes,
                                     const struct mp_chain *chain, struct mp_estimate *e, struct mp_diag *d)
{
    enum mp_status st = mp_estimate_static(p, t, e, d);
    if (st != MP_OK)
        return st;
    struct counter c = {0};
    if ((st = run_counter(p, sched, t, &c, d)) != MP_OK)
        return st;
    e->peak_allocated_bytes = c.peak;
    e->peak_requested_bytes = c.peak_req;
    e->peak_reserved_bytes = mp_max_u64(c.as.peak_reserved, c.peak);
    e->alloc_simulated = !c.no_asim;
    e->reserved_frag_bytes = c.as.frag_at_peak;
    e->alloc_retries = c.as.retries;
    e->alloc_ooms = c.as.ooms;
    e->activations_bytes = c.act_at_loss;
    if (t->ref != MP_REF_NONE && (st = ref_phases(p, t, &c, e, d)) != MP_OK)
        return st;
    if (t->ref == MP_REF_NONE) /* (ref_phases sets it beside a reference copy) */
        e->policy_peak_bytes = e->peak_allocated_bytes;
    if (p->kl_held_bytes && (st = kl_phase(p, t, &c, e, d)) != MP_OK)
        return st;
    if (t->gen_steps && (st = gen_phase(p, t, e, d)) != MP_OK)
        return st;
    if (t->old_logps && (st = old_phase(p, t, e, d)) != MP_OK)
        return st;
    /* --checkpoint layers+offload: pinned host RAM, and its two PCIe copies (device to host in the
     * forward, back at the recompute) in the step's PCIe bytes (search.c prices them) */
    uint64_t copied = 0;
    e->host_pinned_bytes = replay_pinned_bytes(p, sched, &copied);
    if (e->host_pinned_bytes == UINT64_MAX)
        return mp_fail(d, MP_ERR_RANGE, "offloaded checkpoint inputs exceed 64 bits");
    e->ckpt_offload_bytes = copied;
    e->pcie_bytes += 2.0 * (double)copied;
    /* --act-offload: every offloaded pack's pinned copy and the copies over PCIe (replay.c) */
    struct rp_aoff_out ao;
    if ((st = replay_act_offload(p, sched, t, &ao, d)) != MP_OK)
        return st;
    if (t->act_offload) {
        e->host_pinned_bytes = ao.pinned;
        e->act_offload_pcie_bytes = ao.pcie;
        e->pcie_bytes += (double)ao.pcie;
    }
    /* What the GPU must have: the allocated peak plus the context.  Reserved can be
     * higher (cached blocks of other sizes), but on a failed cudaMalloc the caching
     * allocator frees its cached blocks and retries, so the cache does not decide
     * whether a step fits; fragmentation is left to the safety margin. */
    e->vllm_bytes = t->vllm_bytes;
    if ((st = device_peak(p, context_bytes, e, d)) != MP_OK)
        return st;
    e->peak_phase = c.peak_phase;
    if (t->gen_steps && e->gen_peak_bytes >= e->peak_allocated_bytes) {
        e->peak_phase = MP_PH_GENERATE;
        snprintf(e->peak_event, sizeof e->peak_event, "%s", e->gen_event);
    } else if (t->old_logps && e->old_forward_peak_bytes >= e->peak_allocated_bytes &&
               e->old_forward_peak_bytes > e->policy_peak_bytes) {
        e->peak_phase = MP_PH_GENERATE;
        snprintf(e->peak_event, sizeof e->peak_event, "generation:%s", e->old_forward_event);
    } else if (e->kl_forward_peak_bytes && e->kl_forward_peak_bytes >= e->peak_allocated_bytes &&
               e->kl_forward_peak_bytes >= e->ref_forward_peak_bytes) { /* (LLaMA-Factory's KTO: kl_phase) */
        e->peak_phase = MP_PH_LOSS;
        snprintf(e->peak_event, sizeof e->peak_event, "loss:%s", e->kl_forward_event);
    } else if (t->ref != MP_REF_NONE && e->ref_forward_peak_bytes > e->policy_peak_bytes) {
        e->peak_phase = t->ref_before_policy ? MP_PH_GENERATE : MP_PH_LOSS; /* (DPO's compute_loss runs it) */
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", t->ref_before_policy ? "generation" : "loss",
                 e->ref_forward_event);
    } else if (c.peak_store == MP_ST_COMM && c.peak_node >= 0) {
        int b = p->nodes[c.peak_node].block;
        const char *bn = p->model && b >= 0 && (size_t)b < p->model->n_blocks ? p->model->blocks[b].name
                                                                               : p->nodes[c.peak_node].name;
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s %s", mp_phase_str(c.peak_phase), bn,
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_store == MP_ST_COMM) {
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 mp_comm_kind_str((enum mp_comm_kind)(c.peak_id % MP_COMM_KINDS)));
    } else if (c.peak_node >= 0)
        snprintf(e->peak_event, sizeof e->peak_event, "%s:%s", mp_phase_str(c.peak_phase),
                 p->nodes[c.peak_node].name);
    else
        snprintf(e->peak_event, sizeof e->peak_event, "%s", mp_phase_str(c.peak_phase));
    name_load_peak(e);

    /* per block */
    e->n_blocks = p->n_blocks;
    e->blocks = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *e->blocks);
    if (!e->blocks)
        return mp_fail(d, MP_ERR_NOMEM, "out of memory");
    struct mp_chain own = {0};
    if (!chain) {
        st = mp_estimate_chain(p, &own, d);
        if (st != MP_OK)
            return st;
        chain = &own;
    }
    for (size_t i = 0; i < p->n_blocks; i++)
        block_est(p, t, i, chain->xb[i + 1], &e->blocks[i]);
    /* recompute FLOPs: forwards the schedule runs beyond one per block */
    if (sched) {
        size_t *runs = calloc(p->n_blocks ? p->n_blocks : 1, sizeof *runs);
        if (!runs) {
            mp_chain_release(&own);
            return mp_fail(d, MP_ERR_NOMEM, "out of memory");
        }
        for (size_t k = 0; k < sched->n; k++) {
            const struct mp_sched_op *op = &sched->ops[k];
            if (op->kind == MP_SCHED_FN || op->kind == MP_SCHED_FC || op->kind == MP_SCHED_FE) {
                if (runs[op->index]++ > 0) {
                    e->recompute_flops += p->blocks[op->index].fwd_flops - replay_sac_recompute(p, sched, op->index, e);
                    if (k + 1 < sched->n && sched->ops[k + 1].kind == MP_SCHED_B && sched->ops[k + 1].index == op->index)
                        e->recompute_flops -= replay_stop_skips(p, sched, op->index); /* (replay.c fwd_block) */
                    e->dequant_bytes += p->blocks[op->index].dequant_bytes;
                }
                else if (op->kind != MP_SCHED_FE)
                    e->blocks[op->index].checkpointed = true;
            }
        }
        free(runs);
    }
    mp_chain_release(&own);
    return MP_OK;
}
