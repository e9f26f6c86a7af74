/* nccl.c — NCCL's device memory per rank (nccl.h; docs/memory-facts.md#nccl). */
#include "nccl.h"

#include "util/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mp_nccl_env_default(struct mp_nccl_env *e)
{
    memset(e, 0, sizeof *e);
    e->buff[0] = MP_NCCL_LL_BYTES;
    e->buff[1] = MP_NCCL_LL128_BYTES;
    e->buff[2] = MP_NCCL_SIMPLE_BYTES;
    e->nvls_chunk = MP_NCCL_NVLS_CHUNK;
    e->nvls = 2;
    e->min_ch = 0;
    e->max_ch = MP_NCCL_MAXCHANNELS;
    e->min_p2p = 1; /* graph/paths.cc:957-958 */
    e->max_p2p = MP_NCCL_MAXCHANNELS;
    e->p2p_read = -1;
}

/* A whole number from lo to hi (NCCL reads them with strtoll: a size in bytes, a count). */
static enum mp_status env_num(const char *name, const char *v, uint64_t lo, uint64_t hi, uint64_t *out,
                              struct mp_diag *d)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = v[0] >= '0' && v[0] <= '9' ? strtoull(v, &end, 10) : 0;
    if (!end || *end || errno || x < lo || x > hi)
        return mp_fail(d, MP_ERR_USAGE, "%s: '%s' is not a whole number from %llu to %llu", name, v,
                       (unsigned long long)lo, (unsigned long long)hi);
    *out = x;
    return MP_OK;
}

enum mp_status mp_nccl_env_read(struct mp_nccl_env *e, const char *(*get)(const char *), struct mp_diag *d)
{
    static const char *const buffs[3] = {"NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE", "NCCL_BUFFSIZE"};
    mp_nccl_env_default(e);
    enum mp_status st;
    uint64_t x;
#define NOTE(n) snprintf(e->set + strlen(e->set), sizeof e->set - strlen(e->set), "%s%s", e->set[0] ? " " : "", n)
    for (int p = 0; p < 3; p++) { /* init.cc:814-826: any size, in bytes */
        const char *v = get(buffs[p]);
        if (!v)
            continue;
        if ((st = env_num(buffs[p], v, 1, (uint64_t)1 << 40, &e->buff[p], d)) != MP_OK)
            return st;
        NOTE(buffs[p]);
    }
    const char *v = get("NCCL_NVLS_ENABLE"); /* nvls.cc:159: 0, 1, 2 (the default) */
    if (v) {
        if ((st = env_num("NCCL_NVLS_ENABLE", v, 0, 2, &x, d)) != MP_OK)
            return st;
        e->nvls = (int)x;
        NOTE("NCCL_NVLS_ENABLE");
    }
    if ((v = get("NCCL_NVLS_CHUNKSIZE"))) { /* nvls.cc:160 */
        if ((st = env_num("NCCL_NVLS_CHUNKSIZE", v, 1, (uint64_t)1 << 30, &e->nvls_chunk, d)) != MP_OK)
            return st;
        NOTE("NCCL_NVLS_CHUNKSIZE");
    }
    /* graph/connect.cc:331-360: the minimum is capped at MAXCHANNELS, the maximum taken to 1..64 */
    if ((v = get("NCCL_MIN_NCHANNELS"))) {
        if ((st = env_num("NCCL_MIN_NCHANNELS", v, 0, 1u << 20, &x, d)) != MP_OK)
            return st;
        e->min_ch = x > MP_NCCL_MAXCHANNELS ? MP_NCCL_MAXCHANNELS : (unsigned)x;
        NOTE("NCCL_MIN_NCHANNELS");
    }
    if ((v = get("NCCL_MAX_NCHANNELS"))) {
        if ((st = env_num("NCCL_MAX_NCHANNELS", v, 0, 1u << 20, &x, d)) != MP_OK)
            return st;
        e->max_ch = x > MP_NCCL_MAXCHANNELS ? MP_NCCL_MAXCHANNELS : x < 1 ? 1 : (unsigned)x;
        NOTE("NCCL_MAX_NCHANNELS");
    }
    /* graph/paths.cc:957-958, 980-985: the P2P channels of a communicator, its collective
     * channels taken to MIN_P2P .. MAX_P2P_NCHANNELS */
    if ((v = get("NCCL_MIN_P2P_NCHANNELS"))) {
        if ((st = env_num("NCCL_MIN_P2P_NCHANNELS", v, 1, MP_NCCL_MAXCHANNELS, &x, d)) != MP_OK)
            return st;
        e->min_p2p = (unsigned)x;
        NOTE("NCCL_MIN_P2P_NCHANNELS");
    }
    if ((v = get("NCCL_MAX_P2P_NCHANNELS"))) {
        if ((st = env_num("NCCL_MAX_P2P_NCHANNELS", v, 1, MP_NCCL_MAXCHANNELS, &x, d)) != MP_OK)
            return st;
        e->max_p2p = (unsigned)x;
        NOTE("NCCL_MAX_P2P_NCHANNELS");
    }
    if ((v = get("NCCL_P2P_READ_ENABLE"))) { /* p2p.cc:327,339-340: overrides the topology's choice */
        if ((st = env_num("NCCL_P2P_READ_ENABLE", v, 0, 1, &x, d)) != MP_OK)
            return st;
        e->p2p_read = (int)x;
        NOTE("NCCL_P2P_READ_ENABLE");
    }
    /* Set, these change the transports, protocols, algorithms or sharing, which the model does
     * not follow: the buffers are then not counted, and the report names the variable. */
    static const char *const unmodelled[] = {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_PROTO", "NCCL_ALGO",
                                             "NCCL_COMM_SPLIT_SHARE_RESOURCES", "NCCL_P2P_LEVEL",
                                             "NCCL_ALLOC_P2P_NET_LL_BUFFERS"};
    for (size_t i = 0; i < sizeof unmodelled / sizeof unmodelled[0] && !e->unmodelled[0]; i++)
        if (get(unmodelled[i]))
            snprintf(e->unmodelled, sizeof e->unmodelled, "%s", unmodelled[i]);
#undef NOTE
    return MP_OK;
}

static uint64_t align_up(uint64_t x, uint64_t a) /* x < 2^41 here: no overflow */
{
    return (x + a - 1) / a * a;
}

/* Whether NVLink SHARP runs: sm90+ GPUs on an NVSwitch (a profile with NVLink) and more than
 * one GPU a node (nvls.cc:262-276, graph/search.cc:1124). */
static bool nvls_on(const struct mp_gpu *g, const struct mp_nccl_env *e, uint64_t gpus)
{
    return e->nvls != 0 && g->cc_major >= 9 && g->nvlink_gbs > 0 && gpus >= 2;
}

static unsigned pow2_up(unsigned x)
{
    unsigned r = 1;
    while (r < x)
        r <<= 1;
    return r;
}

/* NVLink links a GPU has to the NVSwitch: the profile's per-direction NVLink rate over one
 * link's (25 GB/s for NVLink 2-4: V100, A100 and H100 have 6, 12 and 18 links; 50 GB/s for
 * NVLink 5), at least 1; 0 without NVLink. */
static unsigned nvlinks(const struct mp_gpu *g)
{
    if (g->nvlink_gbs <= 0)
        return 0;
    unsigned n = (unsigned)(g->nvlink_gbs / (g->cc_major >= 10 ? 50.0 : 25.0));
    return n ? n : 1;
}

/* --ep's two communicators (one node: the caller refuses more), added to *all:
 * - the EP group (ep ranks, the mesh's innermost dimension: GPUs of one node) runs AllToAllEP's
 *   all_to_all_single (transformers distributed/expert_parallel.py:224-242), which NCCL makes of
 *   send/recv: each peer gets a send and a receive connector (connIndex 1, enqueue.cc:2652-2681)
 *   on each of p2pnChannelsPerPeer channels, each as a ring connection's bytes (p2p.cc:404-410,
 *   484-490). p2pnChannelsPerPeer (graph/paths.cc:961-1004): per NVLink peer 2 x the links
 *   (path bandwidth over one link's, :930-936), over PCIe 2, rounded up to a power of 2 and
 *   capped by p2pnChannels = the communicator's channels taken to MIN/MAX_P2P_NCHANNELS, rounded
 *   up to a power of 2; the communicator's channels are taken as the profile's (an assumption:
 *   a subset of one node's NVSwitch GPUs).
 * - the efsdp group (world / ep ranks holding the same experts) all-gathers and reduce-scatters
 *   them: ring and tree connections as the world's, and NVLS over its ranks. */
static bool ep_groups(const struct mp_gpu *g, const struct mp_parallel *p, const struct mp_nccl_env *e, unsigned ch,
                      struct mp_nccl_est *out, uint64_t *all)
{
    uint64_t world = mp_par_world(p);
    unsigned links = nvlinks(g);
    unsigned per_peer = pow2_up(links ? 2 * links : 2);
    unsigned p2pn = ch < e->min_p2p ? e->min_p2p : ch > e->max_p2p ? e->max_p2p : ch;
    p2pn = pow2_up(p2pn);
    if (p2pn > MP_NCCL_MAXCHANNELS)
        p2pn = MP_NCCL_MAXCHANNELS;
    out->p2p_channels = per_peer < p2pn ? per_peer : p2pn;
    out->ep_peers = (unsigned)(p->ep - 1);
    uint64_t x = 0;
    if (!mp_mul_u64(out->peer_bytes, (uint64_t)out->ep_peers * out->p2p_channels, &out->ep_bytes) ||
        !mp_add_u64(*all, out->ep_bytes, all))
        return false;
    out->efsdp_ranks = (unsigned)(world / p->ep);
    if (out->efsdp_ranks < 2)
        return true;
    if (!mp_mul_u64(out->peer_bytes, (uint64_t)ch * (out->efsdp_ranks > 2 ? 2 : 1), &x))
        return false;
    if (nvls_on(g, e, out->efsdp_ranks)) {
        uint64_t nv = 0;
        if (!mp_mul_u64((uint64_t)out->nvls_channels * 2u * MP_NCCL_STEPS, e->nvls_chunk, &nv) ||
            !mp_mul_u64(nv, out->efsdp_ranks, &nv) || !mp_add_u64(x, align_up(nv, MP_NCCL_IPC_ALIGN), &x))
            return false;
    }
    out->efsdp_bytes = x;
    return mp_add_u64(*all, x, all);
}

void mp_nccl_estimate(const struct mp_gpu *g, const struct mp_parallel *p, const struct mp_nccl_env *e,
                      struct mp_nccl_est *out)
{
    struct mp_nccl_env def;
    if (!e) {
        mp_nccl_env_default(&def);
        e = &def;
    }
    memset(out, 0, sizeof *out);
    uint64_t world = p ? mp_par_world(p) : 1;
    if (world <= 1) {
        out->counted = true;
        return;
    }
    if (g->nccl_overhead_bytes) { /* a measured figure wins */
        out->counted = out->profile = true;
        out->bytes = g->nccl_overhead_bytes;
        return;
    }
    if (p->ep > 1 && p->nodes > 1) {
        snprintf(out->why, sizeof out->why, "--ep across nodes (NCCL's network transport) is not modelled");
        return;
    }
    if (e->unmodelled[0]) {
        snprintf(out->why, sizeof out->why, "%s is set: not modelled", e->unmodelled);
        return;
    }
    /* Channels: the profile's "coll channels" (what NCCL's topology search gives on that node),
     * clamped as NCCL clamps them; both bounds set and equal decide alone. */
    unsigned ch = g->nccl_channels;
    bool pinned = e->min_ch && e->min_ch == e->max_ch;
    if (pinned)
        ch = e->min_ch;
    else if (!ch) {
        snprintf(out->why, sizeof out->why, "profile has no nccl_channels");
        return;
    }
    if (ch < e->min_ch)
        ch = e->min_ch;
    if (ch > e->max_ch)
        ch = e->max_ch;
    out->channels = ch;
    /* The communicators a rank holds: torch's default process group for DDP and FSDP2 (a 1-D
     * mesh reuses it, torch/distributed/device_mesh.py:569-585); DeepSpeed adds its clone of the
     * world group (deepspeed/utils/groups.py, _clone_world_group: dist.new_group of all ranks),
     * a communicator of its own (ncclCommSplit shares no buffers by default). */
    out->comms = mp_par_is_deepspeed(p->strategy) ? 2 : 1;
    /* Each channel's ring receives from one neighbour and sends to the other; the tree (a chain
     * inside a node) also connects the other way: two peers a channel from three ranks on, one
     * with two (graph/connect.cc, transport.cc: a connection per channel and peer). */
    out->peers = world > 2 ? 2 : 1;
    /* transport/p2p.cc:486-491: the receiver holds its ncclRecvMem and the LL and LL128 buffers,
     * and Simple's unless P2P read puts it behind the sender's ncclSendMem (p2p.cc:407-410):
     * read on NVLink between compute capability 8.0 GPUs only (graph/paths.cc:414-418); each
     * side rounded up to CUDA_IPC_MIN, then cuMem's 2 MiB granularity. */
    out->read = e->p2p_read >= 0 ? e->p2p_read == 1 : g->nvlink_gbs > 0 && g->cc_major == 8 && g->cc_minor == 0;
    uint64_t recv = MP_NCCL_MEM_HEADER + e->buff[0] + e->buff[1] + (out->read ? 0 : e->buff[2]);
    uint64_t send = MP_NCCL_MEM_HEADER + (out->read ? e->buff[2] : 0);
    out->peer_bytes = align_up(recv, MP_NCCL_IPC_ALIGN) + align_up(send, MP_NCCL_IPC_ALIGN);
    /* NVLS (nvls.cc:420-430): nvlsChannels x 2 x (chunk x NCCL_STEPS) x nHeads of unicast memory
     * bound to the multicast object, nHeads = the node's GPUs (graph/search.cc:1127-1137). */
    uint64_t gpus = p->gpus ? p->gpus : 1;
    if (nvls_on(g, e, gpus)) {
        out->nvls_channels = g->cc_major >= 10 ? (p->nodes > 1 ? MP_NCCL_NVLS_CH_SM100 : MP_NCCL_NVLS_CH_SM100_NVL)
                                               : MP_NCCL_NVLS_CH_SM90;
        uint64_t nv = 0;
        if (mp_mul_u64((uint64_t)out->nvls_channels * 2u * MP_NCCL_STEPS, e->nvls_chunk, &nv) &&
            mp_mul_u64(nv, gpus, &nv))
            out->nvls_bytes = align_up(nv, MP_NCCL_IPC_ALIGN);
        else
            out->nvls_bytes = UINT64_MAX / 4;
    }
    uint64_t one = 0, all = 0;
    if (!mp_mul_u64(out->peer_bytes, (uint64_t)ch * out->peers, &one) || !mp_add_u64(one, out->nvls_bytes, &one) ||
        !mp_mul_u64(one, out->comms, &all))
        all = UINT64_MAX / 4;
    if (p->ep > 1 && !ep_groups(g, p, e, ch, out, &all))
        all = UINT64_MAX / 4;
    out->counted = true;
    out->bytes = all;
}

const char *mp_nccl_describe(const struct mp_nccl_est *n, char *buf, size_t len)
{
    char a[32], b[32];
    if (!n->counted)
        snprintf(buf, len, "not counted (%s)", n->why);
    else if (n->profile)
        snprintf(buf, len, "profile nccl_overhead_mib");
    else if (n->nvls_bytes)
        snprintf(buf, len, "%u comm%s x %u ch x %u peer%s x %s + NVLS %s", n->comms, n->comms > 1 ? "s" : "",
                 n->channels, n->peers, n->peers > 1 ? "s" : "", mp_fmt_bytes(n->peer_bytes, a, sizeof a),
                 mp_fmt_bytes(n->nvls_bytes, b, sizeof b));
    else
        snprintf(buf, len, "%u comm%s x %u ch x %u peer%s x %s", n->comms, n->comms > 1 ? "s" : "",
                 n->channels, n->peers, n->peers > 1 ? "s" : "", mp_fmt_bytes(n->peer_bytes, a, sizeof a));
    return buf;
}
