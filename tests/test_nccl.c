/* test_nccl.c — NCCL's device bytes per rank (search/nccl.c), each rule with its bytes worked
 * by hand from NCCL 2.30.7's source (docs/memory-facts.md#nccl):
 *   LL     8 lines x 512 threads x 8 steps x 16 B           =   524,288
 *   LL128  120 elements x 640 threads x 8 steps x 8 B       = 4,915,200
 *   Simple 1 << 22                                          = 4,194,304
 *   a side: 4,096 B of ncclSendMem / ncclRecvMem + its buffers, rounded up to 2 MiB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "search/nccl.h"

#define MIB (UINT64_C(1) << 20)

static struct mp_gpu h100(void) /* sm90, NVSwitch: NVLS; the profile's 24 channels */
{
    struct mp_gpu g;
    memset(&g, 0, sizeof g);
    g.cc_major = 9;
    g.nvlink_gbs = 450;
    g.nccl_channels = 24;
    return g;
}

static struct mp_gpu a100(void) /* sm80 on NVLink: P2P read */
{
    struct mp_gpu g = h100();
    g.cc_major = 8;
    g.nvlink_gbs = 300;
    g.nccl_channels = 0;
    return g;
}

static struct mp_parallel par(enum mp_par_strategy s, uint64_t gpus, uint64_t nodes)
{
    struct mp_parallel p;
    mp_parallel_default(&p);
    p.strategy = s;
    p.gpus = gpus;
    p.nodes = nodes;
    return p;
}

/* An environment for mp_nccl_env_read: NAME=VALUE pairs. */
static const char *const *test_env;
static const char *get(const char *name)
{
    for (size_t i = 0; test_env && test_env[i]; i += 2)
        if (!strcmp(test_env[i], name))
            return test_env[i + 1];
    return NULL;
}

static struct mp_nccl_env env_of(const char *const *kv)
{
    struct mp_nccl_env e;
    struct mp_diag d = {{0}};
    test_env = kv;
    assert_int_equal(mp_nccl_env_read(&e, get, &d), MP_OK);
    return e;
}

static void test_protocol_sizes(void **state)
{
    (void)state;
    struct mp_nccl_env e = env_of(NULL);
    assert_true(e.buff[0] == 524288 && e.buff[1] == 4915200 && e.buff[2] == 4194304);
    assert_int_equal(e.nvls, 2);
    assert_int_equal(e.max_ch, 64);
    assert_string_equal(e.set, "");
}

/* 8 x H100, DDP: a receive side of 4,096 + LL + LL128 + Simple = 9,637,888 -> 10 MiB, a send
 * side of 4,096 -> 2 MiB: 12 MiB a peer; ring + tree 2 peers x 24 channels = 576 MiB; NVLS 16
 * channels x 2 x (128 KiB x 8) x 8 heads = 256 MiB: 832 MiB. */
static void test_h100_ddp(void **state)
{
    (void)state;
    struct mp_gpu g = h100();
    struct mp_parallel p = par(MP_PAR_DDP, 8, 1);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(n.counted && !n.profile && !n.read);
    assert_true(n.peer_bytes == 12 * MIB);
    assert_int_equal(n.peers, 2);
    assert_int_equal(n.comms, 1);
    assert_true(n.nvls_bytes == 256 * MIB);
    assert_true(n.bytes == 832 * MIB);
    /* FSDP2: the same default group for its all-gathers and reduce-scatters */
    p.strategy = MP_PAR_FSDP;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(n.bytes == 832 * MIB);
}

/* ZeRO: DeepSpeed's clone of the world group is a second communicator; NVLS off: 2 x 576 MiB. */
static void test_zero_two_comms_nvls_off(void **state)
{
    (void)state;
    struct mp_gpu g = h100();
    struct mp_parallel p = par(MP_PAR_ZERO2, 4, 1);
    static const char *const kv[] = {"NCCL_NVLS_ENABLE", "0", NULL};
    struct mp_nccl_env e = env_of(kv);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_int_equal(n.comms, 2);
    assert_true(n.nvls_bytes == 0);
    assert_true(n.bytes == 2 * 576 * MIB);
    assert_string_equal(e.set, "NCCL_NVLS_ENABLE");
}

/* 2 x A100, channels pinned at 8: P2P read puts Simple on the sender: receive 4,096 + LL + LL128
 * = 5,443,584 -> 6 MiB, send 4,096 + 4 MiB -> 6 MiB; one peer (ring and tree coincide); no
 * NVLS on sm80: 8 x 12 MiB = 96 MiB.  NCCL_BUFFSIZE=1 MiB: the send side 2 MiB, 8 x 8 MiB. */
static void test_a100_read_and_buffsize(void **state)
{
    (void)state;
    struct mp_gpu g = a100();
    struct mp_parallel p = par(MP_PAR_DDP, 2, 1);
    static const char *const kv[] = {"NCCL_MIN_NCHANNELS", "8", "NCCL_MAX_NCHANNELS", "8", NULL};
    struct mp_nccl_env e = env_of(kv);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_true(n.counted && n.read);
    assert_int_equal(n.channels, 8);
    assert_int_equal(n.peers, 1);
    assert_true(n.bytes == 96 * MIB);
    static const char *const kv2[] = {"NCCL_MIN_NCHANNELS", "8", "NCCL_MAX_NCHANNELS", "8", "NCCL_BUFFSIZE",
                                      "1048576", NULL};
    e = env_of(kv2);
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_true(n.peer_bytes == 8 * MIB);
    assert_true(n.bytes == 64 * MIB);
}

/* Without P2P read (no NVLink): Simple stays with the receiver, 10 + 2 MiB a peer. */
static void test_pcie_write(void **state)
{
    (void)state;
    struct mp_gpu g = a100();
    g.nvlink_gbs = 0;
    g.nccl_channels = 2;
    struct mp_parallel p = par(MP_PAR_DDP, 4, 1);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(!n.read && n.nvls_bytes == 0);
    assert_true(n.bytes == 2 * 2 * 12 * MIB);
}

/* The channel bounds clamp the profile's count; NVLS's chunk scales its buffer. */
static void test_clamps_and_nvls_chunk(void **state)
{
    (void)state;
    struct mp_gpu g = h100();
    struct mp_parallel p = par(MP_PAR_DDP, 8, 2);
    static const char *const kv[] = {"NCCL_MAX_NCHANNELS", "16", "NCCL_NVLS_CHUNKSIZE", "262144", NULL};
    struct mp_nccl_env e = env_of(kv);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_int_equal(n.channels, 16);
    assert_true(n.nvls_bytes == 512 * MIB); /* 16 x 2 x 256 KiB x 8 x 8 heads (the node's GPUs) */
    assert_true(n.bytes == 16 * 2 * 12 * MIB + 512 * MIB);
    static const char *const lo[] = {"NCCL_MIN_NCHANNELS", "32", NULL};
    e = env_of(lo);
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_int_equal(n.channels, 32);
    static const char *const big[] = {"NCCL_MIN_NCHANNELS", "100", "NCCL_MAX_NCHANNELS", "0", NULL};
    e = env_of(big); /* connect.cc: the minimum capped at 64, the maximum raised to 1 */
    assert_int_equal(e.min_ch, 64);
    assert_int_equal(e.max_ch, 1);
}

/* What is not modelled says why and counts nothing; a profile's figure wins; one GPU is 0. */
static void test_not_counted_and_profile(void **state)
{
    (void)state;
    struct mp_gpu g = a100(); /* no nccl_channels */
    struct mp_parallel p = par(MP_PAR_DDP, 8, 1);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(!n.counted && n.bytes == 0);
    assert_non_null(strstr(n.why, "nccl_channels"));
    g = h100();
    p = par(MP_PAR_FSDP, 8, 2); /* --ep over two nodes: the network transport */
    p.ep = 4;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(!n.counted && n.bytes == 0);
    assert_non_null(strstr(n.why, "--ep across nodes"));
    g.nccl_overhead_bytes = 100 * MIB;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(n.counted && n.profile && n.bytes == 100 * MIB);
    p = par(MP_PAR_NONE, 1, 1);
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(n.counted && n.bytes == 0);
    mp_nccl_estimate(&g, NULL, NULL, &n);
    assert_true(n.counted && n.bytes == 0);
}

/* NCCL_P2P_READ_ENABLE=1 on an H100 with NCCL_BUFFSIZE=1 MiB: Simple's buffer on the sender,
 * receive 4,096 + LL + LL128 = 5,443,584 -> 6 MiB, send 4,096 + 1 MiB -> 2 MiB: 8 MiB a peer
 * (10 MiB without read: receive 6,492,160 -> 8 MiB).  A variable that changes transports or
 * algorithms leaves the buffers not counted, named. */
static void test_read_override_and_unmodelled(void **state)
{
    (void)state;
    struct mp_gpu g = h100();
    struct mp_parallel p = par(MP_PAR_DDP, 8, 1);
    static const char *const kv[] = {"NCCL_P2P_READ_ENABLE", "1", "NCCL_BUFFSIZE", "1048576", NULL};
    struct mp_nccl_env e = env_of(kv);
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_true(n.read && n.peer_bytes == 8 * MIB);
    static const char *const kv0[] = {"NCCL_BUFFSIZE", "1048576", NULL};
    e = env_of(kv0);
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_true(!n.read && n.peer_bytes == 10 * MIB);
    static const char *const algo[] = {"NCCL_ALGO", "Ring", NULL};
    e = env_of(algo);
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_true(!n.counted && n.bytes == 0);
    assert_string_equal(n.why, "NCCL_ALGO is set: not modelled");
    g.nccl_overhead_bytes = 64 * MIB; /* a measured figure still counts */
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_true(n.counted && n.bytes == 64 * MIB);
}

/* --ep on 8 x H100 (one node): the world's 832 MiB, and
 *   ep 8: all-to-all 7 peers x P2P channels x 12 MiB; channels a peer: 2 x 18 links = 36 -> 64,
 *         capped by the communicator's 24 -> 32: 7 x 32 x 12 = 2,688 MiB; efsdp 8/8 = 1 rank:
 *         nothing; 3,520 MiB.
 *   ep 4: 3 x 32 x 12 = 1,152 MiB; efsdp 2 ranks: 24 ch x 1 peer x 12 MiB = 288 MiB + NVLS 16 x
 *         2 x 1 MiB x 2 = 64 MiB; 832 + 1,152 + 352 = 2,336 MiB.
 *   NCCL_MAX_P2P_NCHANNELS=8: 24 -> 8 P2P channels, 3 x 8 x 12 = 288 MiB; 1,472 MiB.
 * 4 PCIe GPUs (no NVLink, channels pinned to 4 by NCCL_MIN/MAX_NCHANNELS), ep 2: the world 4 ch x
 *   2 peers x 12 MiB = 96 MiB; all-to-all 1 peer x min(2, 4) x 12 = 24 MiB; efsdp 2 ranks 4 x 1 x
 *   12 = 48 MiB, no NVLS; 168 MiB. */
static void test_ep_groups(void **state)
{
    (void)state;
    struct mp_gpu g = h100();
    struct mp_parallel p = par(MP_PAR_FSDP, 8, 1);
    p.ep = 8;
    struct mp_nccl_est n;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(n.counted);
    assert_int_equal(n.p2p_channels, 32);
    assert_int_equal(n.ep_peers, 7);
    assert_true(n.ep_bytes == 2688 * MIB && n.efsdp_bytes == 0);
    assert_true(n.bytes == 3520 * MIB);
    p.ep = 4;
    mp_nccl_estimate(&g, &p, NULL, &n);
    assert_true(n.ep_bytes == 1152 * MIB && n.efsdp_bytes == 352 * MIB);
    assert_true(n.bytes == 2336 * MIB);
    static const char *const kv[] = {"NCCL_MAX_P2P_NCHANNELS", "8", NULL};
    struct mp_nccl_env e = env_of(kv);
    mp_nccl_estimate(&g, &p, &e, &n);
    assert_int_equal(n.p2p_channels, 8);
    assert_true(n.bytes == 1472 * MIB);
    struct mp_gpu pcie = h100();
    pcie.nvlink_gbs = 0;
    pcie.nccl_channels = 0;
    p = par(MP_PAR_FSDP, 4, 1);
    p.ep = 2;
    static const char *const pin[] = {"NCCL_MIN_NCHANNELS", "4", "NCCL_MAX_NCHANNELS", "4", NULL};
    e = env_of(pin);
    mp_nccl_estimate(&pcie, &p, &e, &n);
    assert_true(n.counted && n.p2p_channels == 2 && n.nvls_bytes == 0);
    assert_true(n.ep_bytes == 24 * MIB && n.efsdp_bytes == 48 * MIB && n.bytes == 168 * MIB);
}

static void test_env_refused(void **state)
{
    (void)state;
    static const char *const bad[][3] = {
        {"NCCL_BUFFSIZE", "4M", NULL},         {"NCCL_BUFFSIZE", "0", NULL},
        {"NCCL_NVLS_ENABLE", "3", NULL},       {"NCCL_LL128_BUFFSIZE", "-1", NULL},
        {"NCCL_MAX_NCHANNELS", "", NULL},      {"NCCL_NVLS_CHUNKSIZE", "0x10", NULL},
        {"NCCL_P2P_READ_ENABLE", "2", NULL},   {"NCCL_MAX_P2P_NCHANNELS", "0", NULL},
        {"NCCL_MIN_P2P_NCHANNELS", "65", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct mp_nccl_env e;
        struct mp_diag d = {{0}};
        test_env = bad[i];
        assert_int_equal(mp_nccl_env_read(&e, get, &d), MP_ERR_USAGE);
        assert_non_null(strstr(d.msg, bad[i][0]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_protocol_sizes),         cmocka_unit_test(test_h100_ddp),
        cmocka_unit_test(test_zero_two_comms_nvls_off), cmocka_unit_test(test_a100_read_and_buffsize),
        cmocka_unit_test(test_pcie_write),             cmocka_unit_test(test_clamps_and_nvls_chunk),
        cmocka_unit_test(test_not_counted_and_profile), cmocka_unit_test(test_env_refused),
        cmocka_unit_test(test_read_override_and_unmodelled), cmocka_unit_test(test_ep_groups),
    };
    return cmocka_run_group_tests_name("nccl", tests, NULL, NULL);
}
