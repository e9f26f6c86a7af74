/* probe.h — real training steps: a backend interface with two backends.
 *
 * A backend executes the tensor program (layers.h) through the same event
 * stream the estimator replays (estimate.h mp_replay): every ALLOC/FREE event
 * allocates/frees from one pool, every FWD/BWD event computes the node, the
 * OPT_STEP event updates parameters.  So measured and estimated peaks compare
 * event by event.  `host` runs in plain C on the CPU with a capacity limit;
 * `cuda` uses the CUDA runtime, cuBLAS and kernels/.  Out-of-memory is a
 * result (status MP_ERR_OOM, everything freed), not a crash.
 */
#ifndef MEMPLAN_PROBE_H
#define MEMPLAN_PROBE_H

#include "estimate/estimate.h"

struct mp_probe; /* opaque */

struct mp_probe_opts {
    const char *backend;     /* "auto", "host", "cuda" */
    int device;              /* CUDA device index */
    uint64_t capacity_bytes; /* host: the pool limit (0 = unlimited); cuda: 0 = what the device has free */
    unsigned steps;          /* measured steps after one warm-up step (>= 1) */
    bool progress;           /* a line per step on stderr (host: steps take seconds) */
    uint64_t seed;
    bool trace;              /* keep the pool's allocated bytes after every event of the last step */
};
void mp_probe_opts_default(struct mp_probe_opts *o); /* auto, device 0, 3 steps, seed 1 */

struct mp_device_info {
    char name[128];
    uint64_t total_bytes, free_bytes;
    int cc_major, cc_minor;
    unsigned sm_count, sm_threads; /* multiProcessorCount, maxThreadsPerMultiProcessor */
};

struct mp_probe_result {
    bool fits;                    /* false: out of memory (oom_request_bytes says what was asked) */
    uint64_t oom_request_bytes;
    bool oom_capacity;            /* out of memory by the capacity limit (false: the device/allocator said no) */
    char oom_event[96];
    unsigned steps;
    float losses[64];             /* one per measured step (warm-up excluded) */
    uint64_t measured_peak_bytes; /* the pool's peak allocated bytes (512-rounded, like the estimator) */
    uint64_t device_used_before, device_used_after; /* cudaMemGetInfo: context, cuBLAS, other processes */
    uint64_t outside_pool_bytes;  /* device memory outside the counting pool: the im2col buffer, the
                                   * flash-attention workspace, the batched GEMMs' pointer arrays */
    double step_ms;               /* median over measured steps */
    double samples_per_s;
    double gemm_tflops;           /* achieved by the step's GEMMs (cuda), 0 on host */
    char backend[16];
    struct mp_device_info dev;
    uint64_t *trace;              /* opts.trace: allocated bytes after each ALLOC/FREE event of the
                                   * last step run, in replay order (owned: mp_probe_result_release) */
    size_t n_trace;
};
void mp_probe_result_release(struct mp_probe_result *r); /* frees the trace; NULL-safe */

/* Opens a backend.  "auto": cuda if a device is usable, else host (the caller
 * says so on stderr).  MP_ERR_UNSUPPORTED: cuda not built in; MP_ERR_DEVICE: no device. */
enum mp_status mp_probe_open(struct mp_probe **out, const struct mp_probe_opts *o, struct mp_diag *d);
const char *mp_probe_backend(const struct mp_probe *p);
enum mp_status mp_probe_device_info(struct mp_probe *p, struct mp_device_info *out);

/* Runs 1 warm-up + o->steps training steps of prog under sched (NULL = no
 * checkpointing) on random data (fixed batch, so the loss must fall).
 * OOM → MP_OK with r->fits = false; other device errors → MP_ERR_DEVICE with
 * "call failed at file:line: reason" in d. */
enum mp_status mp_probe_run(struct mp_probe *p, const struct mp_program *prog, const struct mp_schedule *sched,
                            const struct mp_train_opts *t, struct mp_probe_result *r, struct mp_diag *d);
void mp_probe_close(struct mp_probe *p); /* NULL-safe */

/* Whether the host backend may run prog (it really allocates, on the CPU): the step's
 * estimated peak must fit in half this machine's RAM unless capacity_bytes (> 0, at
 * most half the RAM) limits the pool; and when the host was chosen automatically (no
 * GPU), the step must be at most 5e11 FLOPs.  MP_ERR_DEVICE with the reason in d. */
enum mp_status mp_probe_host_admit(const struct mp_program *prog, const struct mp_train_opts *t,
                                   uint64_t capacity_bytes, bool automatic, struct mp_diag *d);

/* True when the cuda backend is built in and a device answers (tests skip otherwise). */
bool mp_cuda_device_available(void);
bool mp_cuda_built(void);

#endif
