/* probe_pool.h — what every probe backend shares, without the registry (probe.c).
 *
 * The counting pool both executors allocate through (one storage per (store, id),
 * 512-byte-rounded bytes as the estimator counts, a capacity that turns an ALLOC
 * into MP_ERR_OOM), the layout of fused q/k/v views, deterministic starting values
 * and inputs, the dropout hash and half conversions.  Backends depend on this file
 * and never on probe.c, so the registry can name them without a dependency cycle.
 */
#ifndef MEMPLAN_PROBE_POOL_H
#define MEMPLAN_PROBE_POOL_H

#include <string.h>

#include "mp_math.h"
#include "probe.h"

/* ---- the counting pool ------------------------------------------------------------- */

struct mp_pool_ops {
    /* Allocates bytes (> 0).  MP_ERR_OOM when the allocator is out of memory (a
     * result, not an error); anything else is an error with d filled. */
    enum mp_status (*alloc)(void *ctx, uint64_t bytes, void **out, struct mp_diag *d);
    void (*free)(void *ctx, void *ptr);
    void *ctx;
};

struct mp_pool {
    const struct mp_program *p;
    struct mp_pool_ops ops;
    uint64_t capacity;   /* 0 = unlimited */
    uint64_t cur, peak;  /* sum of mp_round512(bytes) of live storages; its maximum */
    size_t n_keys, n_live;
    void **ptr;
    uint64_t *bytes;
    unsigned char *present;
    uint64_t oom_bytes;  /* the request that did not fit */
    bool oom_capacity;   /* the capacity limit said no (false: the allocator itself) */
    char oom_event[96];
    bool trace_on;       /* record cur after every alloc/free of the current step (timeline) */
    uint64_t *trace;
    size_t n_trace, cap_trace;
};

/* Hands the recorded trace of the last step to r (r->trace, r->n_trace); the pool forgets it. */
void mp_pool_take_trace(struct mp_pool *pl, struct mp_probe_result *r);

/* Parameters, optimizer state, the workspace and the input batch live across
 * steps: the replay allocates them at every step's setup; the pool counts them
 * again and keeps their contents. */
bool mp_store_persistent(enum mp_store s);

enum mp_status mp_pool_init(struct mp_pool *pl, const struct mp_program *p, const struct mp_pool_ops *ops,
                            uint64_t capacity, struct mp_diag *d);
/* Frees every storage (persistent ones included); counters to 0. */
void mp_pool_free_all(struct mp_pool *pl);
/* mp_pool_free_all, then the tables.  NULL-safe. */
void mp_pool_release(struct mp_pool *pl);
/* An ALLOC event.  *fresh: a new storage (false: a persistent one counted again).
 * MP_ERR_OOM with oom_bytes/oom_event set when the capacity or the allocator says no. */
enum mp_status mp_pool_alloc(struct mp_pool *pl, const struct mp_event *ev, void **ptr, bool *fresh,
                             struct mp_diag *d);
enum mp_status mp_pool_free(struct mp_pool *pl, const struct mp_event *ev, struct mp_diag *d);
/* The storage of (store, id), or NULL when not allocated (or of zero bytes). */
void *mp_pool_get(const struct mp_pool *pl, enum mp_store s, int id);
bool mp_pool_has(const struct mp_pool *pl, enum mp_store s, int id);
/* Before each step's replay: the live count restarts at 0 (persistent storages are re-counted). */
void mp_pool_step_begin(struct mp_pool *pl);
/* After each step: only persistent storages may remain. */
enum mp_status mp_pool_step_end(struct mp_pool *pl, struct mp_diag *d);

/* "backward:h.1.attn.sdpa", "setup:param wte.weight" */
void mp_event_name(const struct mp_program *p, const struct mp_event *ev, char *buf, size_t len);

/* ---- layout the executors share ------------------------------------------------------ */

/* Row width (elements) and column offset of each input of a node.  The fused
 * q/k/v projection is one storage (b, s, (a+2kv)d): attention reads q at column
 * 0, k at a*d, v at a*d + kv*d; a rope on a fused view reads at the same offset. */
struct mp_node_layout {
    uint64_t in_w[3], in_off[3];
};
enum mp_status mp_exec_layout(const struct mp_program *p, struct mp_node_layout **out, struct mp_diag *d);

/* Deterministic starting values (the same on every backend):
 * matmul/embedding matrices uniform(+-1/sqrt(cols)), norm weights 1, biases 0,
 * other parameters uniform(+-0.1).  Value of element i of parameter q. */
float mp_exec_param_value(const struct mp_program *p, size_t q, uint64_t i, uint64_t seed);
/* Fills the input tensor t (ids < vocab, labels < classes, images N(0,1), opaque
 * bytes) in its dtype into buf (tensors[t].bytes). */
void mp_exec_input_fill(const struct mp_program *p, int t, uint64_t seed, void *buf);

/* The CE node (explicit loss) or -1. */
int mp_exec_loss_node(const struct mp_program *p);

/* Parameter q's starting values in its dtype into buf (params[q].bytes): NF4-packed when
 * the program's base weights are quantized (bitsandbytes quantize_4bit of the values).
 * MP_ERR_NOMEM / MP_ERR_UNSUPPORTED with d filled. */
enum mp_status mp_exec_param_fill(const struct mp_program *p, size_t q, uint64_t seed, void *buf, struct mp_diag *d);

/* Optimizer hyper-parameters, epsilons and shared arithmetic: mp_math.h (C and CUDA). */

/* ---- deterministic hashing ----------------------------------------------------------- */

/* splitmix64 finalizer; kernels/kcommon.cuh has the same function. */
static inline uint64_t mp_hash64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Uniform in [0, 1) with 24 bits. */
static inline float mp_hash_unit(uint64_t x) { return (float)(mp_hash64(x) >> 40) * (1.0f / 16777216.0f); }

/* The key of a dropout node's mask at one step: element i is kept when
 * mp_hash_unit(key + i) >= p.  Recomputation (checkpointing) reuses the key, so
 * masks match PyTorch's RNG-state restore. */
static inline uint64_t mp_dropout_key(uint64_t seed, int node, uint64_t rng_step)
{
    return mp_hash64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(node + 1)) ^
           mp_hash64(rng_step * 0xD1B54A32D192ED03ull + 7);
}

/* ---- half precision (round to nearest even) -------------------------------------------- */

static inline float mp_f32_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t mp_bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mp_f32_from_f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400u));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t mp_f16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)                  /* rounds to >= 65520: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below the smallest normal half (2^-14): subnormal or zero */
        if (a < 0x33000000u) /* < 2^-25: rounds to 0 */
            return sign;
        uint32_t e = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24: value = man * 2^(e-150), half unit 2^-24 */
        uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits, nearest even */
    return (uint16_t)(sign | (((r >> 23) - 112) << 10) | ((r >> 13) & 0x3ffu));
}

#endif
