/* nccl.h — NCCL's device memory per rank for a data-parallel plan: the buffers of each
 * communicator's ring and tree connections and NVLink SHARP's (docs/memory-facts.md#nccl).
 * Written from NCCL 2.30.7's source (NVIDIA/nccl 5067397c); each figure names its file:line.
 */
#ifndef MEMPLAN_NCCL_H
#define MEMPLAN_NCCL_H

#include "estimate/estimate.h"
#include "search/gpu.h"

#include <stdbool.h>
#include <stdint.h>

/* src/include/device.h:26,97-98,114-115 and src/init.cc:810-813: the per-connection buffer of
 * each protocol, NCCL_STEPS slots: LL 8 lines x 512 threads x 8 steps x 16 bytes, LL128 120
 * elements x 640 threads x 8 steps x 8 bytes, Simple 1 << 22. */
#define MP_NCCL_STEPS 8u
#define MP_NCCL_LL_BYTES (8u * 512u * MP_NCCL_STEPS * 16u)
#define MP_NCCL_LL128_BYTES (120u * 640u * MP_NCCL_STEPS * 8u)
#define MP_NCCL_SIMPLE_BYTES (1u << 22)
#define MP_NCCL_MAXCHANNELS 64u          /* src/include/device.h:91 */
#define MP_NCCL_MEM_HEADER 4096u         /* sizeof ncclSendMem / ncclRecvMem: MEM_ALIGN, comm.h:45-76 */
#define MP_NCCL_IPC_ALIGN (2u << 20)     /* CUDA_IPC_MIN (comm.h:46) and cuMem's 2 MiB granularity */
#define MP_NCCL_NVLS_CHUNK (128u << 10)  /* NCCL_NVLS_CHUNKSIZE's default, transport/nvls.cc:160 */
#define MP_NCCL_NVLS_CH_SM90 16u         /* NVLS_NCHANNELS_SM90, transport/nvls.cc:155 */
#define MP_NCCL_NVLS_CH_SM100 32u        /* NVLS_NCHANNELS_SM100 (more than one node), nvls.cc:156 */
#define MP_NCCL_NVLS_CH_SM100_NVL 24u    /* NVLS_NCHANNELS_SM100_NVL (one node), nvls.cc:157 */

/* The NCCL_* environment variables that change these bytes. */
struct mp_nccl_env {
    uint64_t buff[3];      /* per connection: LL, LL128, Simple (NCCL_LL_BUFFSIZE, NCCL_LL128_BUFFSIZE,
                            * NCCL_BUFFSIZE) */
    uint64_t nvls_chunk;   /* NCCL_NVLS_CHUNKSIZE */
    int nvls;              /* NCCL_NVLS_ENABLE: 0 off, 1 on, 2 (default) where the GPUs have it */
    unsigned min_ch, max_ch; /* NCCL_MIN_NCHANNELS (0), NCCL_MAX_NCHANNELS (64) */
    unsigned min_p2p, max_p2p; /* NCCL_MIN_P2P_NCHANNELS (1), NCCL_MAX_P2P_NCHANNELS (64) */
    int p2p_read;          /* NCCL_P2P_READ_ENABLE: 0, 1, -1 (default: the topology's) */
    char unmodelled[40];   /* a variable set that changes the buffers in ways not modelled ("": none) */
    char set[160];         /* the variables read, "" for none */
};

/* What one rank holds, and why. */
struct mp_nccl_est {
    bool counted;          /* false: not modelled (why says what); bytes 0 */
    bool profile;          /* the profile's nccl_overhead_mib decided */
    uint64_t bytes;        /* per rank, all communicators */
    unsigned comms;        /* NCCL communicators a rank holds */
    unsigned channels;     /* collective channels a communicator connects */
    unsigned peers;        /* connections per channel (ring 1; a tree's other neighbour 1 more) */
    bool read;             /* P2P read: Simple's buffer on the sender (A100 NVLink) */
    uint64_t peer_bytes;   /* one connection, its receive + send sides */
    uint64_t nvls_bytes;   /* NVLink SHARP's buffer per communicator (0: none) */
    unsigned nvls_channels;
    /* --ep (transformers' DistributedConfig: a dense mesh and an expert mesh, graph of
     * pp x dp_replicate x efsdp x ep): the EP group's all-to-all runs NCCL send/recv, a
     * connection per peer and P2P channel; the efsdp group (world / ep ranks holding the same
     * experts) all-gathers and reduce-scatters them, a communicator of its own */
    unsigned ep_peers;     /* ep - 1 */
    unsigned p2p_channels; /* P2P channels per peer (p2pnChannelsPerPeer) */
    uint64_t ep_bytes;     /* the EP group's send/recv connections */
    unsigned efsdp_ranks;  /* world / ep: 1, no such communicator's connections */
    uint64_t efsdp_bytes;  /* its ring and tree connections, and NVLS */
    char why[96];
};

void mp_nccl_env_default(struct mp_nccl_env *e);
/* Reads the NCCL_* variables through get (getenv, or a test's); a value NCCL would not take
 * (not a whole number, out of range) is a one-line error naming the variable. */
enum mp_status mp_nccl_env_read(struct mp_nccl_env *e, const char *(*get)(const char *), struct mp_diag *d);

/* Per-rank NCCL bytes for strategy p on g (e NULL: the defaults).  One GPU: counted, 0. */
void mp_nccl_estimate(const struct mp_gpu *g, const struct mp_parallel *p, const struct mp_nccl_env *e,
                      struct mp_nccl_est *out);

/* "1 comm x 24 ch x 2 peers x 12.00 MiB + NVLS 256.00 MiB" (the world's communicators; --ep's
 * groups are ep_bytes and efsdp_bytes), or why not counted, into buf. */
const char *mp_nccl_describe(const struct mp_nccl_est *n, char *buf, size_t len);

#endif
