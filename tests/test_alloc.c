/* test_alloc.c — the caching-allocator simulation (src/estimate/alloc_sim.c, alloc_conf.c), one
 * rule a test, on event sequences worked by hand from PyTorch's allocator rules
 * (c10/cuda/CUDACachingAllocator.cpp, c10/core/AllocatorConfig.h of torch 2.15: kMinBlockSize 512,
 * kSmallSize 1 MiB, kSmallBuffer 2 MiB, kMinLargeAlloc 10 MiB, kRoundLarge 2 MiB, large segments
 * 20 MiB; docs/memory-facts.md#caching-allocator).  Expected bytes are written out in comments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "estimate/estimate.h"

#define MiB (UINT64_C(1) << 20)

static void conf(struct mp_alloc_conf *c, const char *s)
{
    struct mp_diag d = {{0}};
    mp_alloc_conf_default(c);
    assert_int_equal(mp_alloc_conf_parse(s, "test", c, &d), MP_OK);
}

/* Every request is rounded up to 512 bytes; <= 1 MiB comes from the small pool's 2 MiB segments,
 * split down to the request (remainder >= 512 is kept as a free block). */
static void test_small_pool_rounding(void **state)
{
    (void)state;
    struct mp_asim a;
    mp_asim_init(&a, NULL, 0, 0);
    int x = mp_asim_alloc(&a, 1000); /* 1000 -> 1024 B; a new 2 MiB segment, split */
    assert_true(x >= 0);
    assert_int_equal(a.reserved, 2 * MiB);  /* 2,097,152 */
    assert_int_equal(a.allocated, 1024);
    int y = mp_asim_alloc(&a, 1); /* 1 -> 512 B from the 2,096,128 B remainder: no new segment */
    assert_true(y >= 0);
    assert_int_equal(a.reserved, 2 * MiB);
    assert_int_equal(a.allocated, 1536);   /* 1024 + 512 */
    assert_int_equal(mp_alloc_round(&a.conf, 513), 1024);
    mp_asim_release(&a);
}

/* A request over 1 MiB and under 10 MiB gets a 20 MiB segment; the next request is served from
 * its remainder (split: remainder > 1 MiB). From 10 MiB the segment is the request rounded up to
 * 2 MiB. */
static void test_twenty_mib_segment(void **state)
{
    (void)state;
    struct mp_asim a;
    mp_asim_init(&a, NULL, 0, 0);
    assert_true(mp_asim_alloc(&a, 5 * MiB) >= 0);  /* 20 MiB segment: 5 + 15 free */
    assert_int_equal(a.reserved, 20 * MiB);
    assert_int_equal(a.allocated, 5 * MiB);
    assert_true(mp_asim_alloc(&a, 12 * MiB) >= 0); /* best fit: the 15 MiB block, split 12 + 3 */
    assert_int_equal(a.reserved, 20 * MiB);
    assert_int_equal(a.allocated, 17 * MiB);
    assert_true(mp_asim_alloc(&a, 10 * MiB) >= 0); /* 10 MiB >= kMinLargeAlloc: a 10 MiB segment */
    assert_int_equal(a.reserved, 30 * MiB);
    assert_true(mp_asim_alloc(&a, 9961472) >= 0);  /* 9.5 MiB: 3 MiB left is too small -> 20 MiB */
    assert_int_equal(a.reserved, 50 * MiB);
    mp_asim_release(&a);
}

/* Large requests: the segment is rounded up to 2 MiB; a remainder of 1 MiB or less is not split
 * off (the block is allocated whole), more than 1 MiB is. */
static void test_large_round_and_split(void **state)
{
    (void)state;
    struct mp_asim a;
    mp_asim_init(&a, NULL, 0, 0);
    /* 11 MiB + 1 B -> 11,534,848 B (512 rounding); segment ceil(/2 MiB) = 6 x 2 MiB = 12,582,912;
     * remainder 1,048,064 < 1 MiB: not split, the whole 12 MiB block is allocated */
    assert_true(mp_asim_alloc(&a, 11 * MiB + 1) >= 0);
    assert_int_equal(a.reserved, 12582912);
    assert_int_equal(a.allocated, 12582912);
    /* 13 MiB -> a 14 MiB segment, remainder exactly 1 MiB: not split */
    assert_true(mp_asim_alloc(&a, 13 * MiB) >= 0);
    assert_int_equal(a.reserved, 12582912 + 14 * MiB);
    assert_int_equal(a.allocated, 12582912 + 14 * MiB);
    /* 12.5 MiB -> 14 MiB segment, remainder 1.5 MiB > 1 MiB: split; a 1.2 MiB request then fits
     * the 1.5 MiB free block (1,258,291 -> 1,258,496 B) without a new segment, and takes it whole
     * (1,572,864 - 1,258,496 = 314,368 B left: not over 1 MiB, not split) */
    assert_true(mp_asim_alloc(&a, 13107200) >= 0);
    assert_int_equal(a.reserved, 12582912 + 28 * MiB);
    assert_true(mp_asim_alloc(&a, 1258291) >= 0);
    assert_int_equal(a.reserved, 12582912 + 28 * MiB);
    assert_int_equal(a.allocated, 12582912 + 14 * MiB + 13107200 + 1572864);
    mp_asim_release(&a);
}

/* Best fit, and freed blocks merge with free neighbours back into a whole segment. */
static void test_best_fit_and_merge(void **state)
{
    (void)state;
    struct mp_asim a;
    mp_asim_init(&a, NULL, 0, 0);
    int x = mp_asim_alloc(&a, 12 * MiB), y = mp_asim_alloc(&a, 16 * MiB); /* segments 12 and 16 */
    mp_asim_free(&a, x);
    mp_asim_free(&a, y);
    assert_true(mp_asim_alloc(&a, 11 * MiB) >= 0); /* the 12 MiB block (not 16): remainder 1 MiB, whole */
    assert_int_equal(a.reserved, 28 * MiB);
    assert_int_equal(a.allocated, 12 * MiB);
    struct mp_asim m;
    mp_asim_init(&m, NULL, 0, 0);
    int p = mp_asim_alloc(&m, 5 * MiB), q = mp_asim_alloc(&m, 5 * MiB); /* one 20 MiB segment: 5+5+10 */
    assert_int_equal(m.reserved, 20 * MiB);
    mp_asim_free(&m, p);
    mp_asim_free(&m, q); /* 5 + 5 + 10 merge into the 20 MiB segment */
    assert_true(mp_asim_alloc(&m, 18 * MiB) >= 0); /* fits the merged 20 MiB block */
    assert_int_equal(m.reserved, 20 * MiB);
    mp_asim_release(&a);
    mp_asim_release(&m);
}

/* max_split_size_mb:20: blocks of 20 MiB and more are not split; a request under it never takes
 * one; a request at or over it takes one only within 20 MiB (max_non_split_rounding) of its size. */
static void test_max_split_size(void **state)
{
    (void)state;
    struct mp_alloc_conf c;
    conf(&c, "max_split_size_mb:20");
    struct mp_asim a;
    mp_asim_init(&a, &c, 0, 0);
    mp_asim_free(&a, mp_asim_alloc(&a, 40 * MiB)); /* a 40 MiB segment, cached */
    int b = mp_asim_alloc(&a, 20 * MiB);            /* 40 >= 20 + 20: not reused -> new 20 MiB */
    assert_int_equal(a.reserved, 60 * MiB);
    mp_asim_free(&a, b);
    assert_true(mp_asim_alloc(&a, 21 * MiB) >= 0);  /* best fit 40 MiB < 21 + 20: reused whole */
    assert_int_equal(a.reserved, 60 * MiB);
    assert_int_equal(a.allocated, 40 * MiB);
    assert_true(mp_asim_alloc(&a, 12 * MiB) >= 0);  /* under 20: the free 20 MiB block is oversize */
    assert_int_equal(a.reserved, 72 * MiB);
    /* the defaults: the 20 MiB request splits the cached 40 MiB block */
    struct mp_asim z;
    mp_asim_init(&z, NULL, 0, 0);
    mp_asim_free(&z, mp_asim_alloc(&z, 40 * MiB));
    assert_true(mp_asim_alloc(&z, 20 * MiB) >= 0);
    assert_int_equal(z.reserved, 40 * MiB);
    assert_int_equal(z.allocated, 20 * MiB);
    mp_asim_release(&a);
    mp_asim_release(&z);
}

/* roundup_power2_divisions: sizes round up to the next of div steps between powers of two. */
static void test_power2_rounding(void **state)
{
    (void)state;
    struct mp_alloc_conf c;
    conf(&c, "roundup_power2_divisions:4");
    /* 1,200,000: floor power of 2 = 1 MiB, step 1 MiB / 4 = 262,144 -> 1,310,720 */
    assert_int_equal(mp_alloc_round(&c, 1200000), 1310720);
    /* 5,000,000: 4 MiB .. 8 MiB in steps of 1 MiB -> 5 MiB */
    assert_int_equal(mp_alloc_round(&c, 5000000), 5 * MiB);
    assert_int_equal(mp_alloc_round(&c, 4 * MiB), 4 * MiB); /* a power of two stays */
    assert_int_equal(mp_alloc_round(&c, 2000), 2048);      /* 2000 <= 512 x 4: 512 rounding */
    struct mp_asim a;
    mp_asim_init(&a, &c, 0, 0);
    assert_true(mp_asim_alloc(&a, 1200000) >= 0); /* 1,310,720 B block in a 20 MiB segment */
    assert_int_equal(a.allocated, 1310720);
    assert_int_equal(a.reserved, 20 * MiB);
    mp_asim_release(&a);
    /* [256:8,>:2]: intervals below 256 MiB get 8 divisions, 256 MiB and up 2 (">" fills from the
     * last interval named, itself included) */
    conf(&c, "roundup_power2_divisions:[256:8,>:2]");
    assert_int_equal(mp_alloc_round(&c, 100 * MiB), 104 * MiB); /* 64 MiB + steps of 8 MiB */
    assert_int_equal(mp_alloc_round(&c, 300 * MiB), 384 * MiB); /* 256 MiB + steps of 128 MiB */
}

/* Out of memory at cudaMalloc: the cached blocks are freed and the allocation retried
 * (num_alloc_retries 1); it fits after the retry.  When even that fails, it is an OOM. */
static void test_oom_retry(void **state)
{
    (void)state;
    struct mp_asim a;
    mp_asim_init(&a, NULL, 40 * MiB, 0);
    mp_asim_free(&a, mp_asim_alloc(&a, 30 * MiB)); /* 30 MiB cached */
    assert_true(mp_asim_alloc(&a, 32 * MiB) >= 0); /* 30 + 32 > 40: free the 30, retry: 32 */
    assert_int_equal(a.retries, 1);
    assert_int_equal(a.ooms, 0);
    assert_int_equal(a.reserved, 32 * MiB);
    assert_int_equal(a.peak_reserved, 32 * MiB);
    mp_asim_release(&a);
    mp_asim_init(&a, NULL, 0, 0); /* without a limit: both stay reserved */
    mp_asim_free(&a, mp_asim_alloc(&a, 30 * MiB));
    assert_true(mp_asim_alloc(&a, 32 * MiB) >= 0);
    assert_int_equal(a.peak_reserved, 62 * MiB);
    assert_int_equal(a.retries, 0);
    mp_asim_release(&a);
    mp_asim_init(&a, NULL, 40 * MiB, 0);
    assert_true(mp_asim_alloc(&a, 30 * MiB) >= 0); /* held */
    assert_true(mp_asim_alloc(&a, 12 * MiB) >= 0); /* 30 + 12 > 40, nothing cached: OOM */
    assert_int_equal(a.retries, 1);
    assert_int_equal(a.ooms, 1);
    assert_int_equal(a.oom_request, 12 * MiB);
    mp_asim_release(&a);
}

/* expandable_segments:True: one segment per pool whose pages (20 MiB large, 2 MiB small) are
 * mapped as needed: a 30 MiB request after a 5 MiB one maps one more 20 MiB page onto the 15 MiB
 * free tail (40 MiB reserved, where separate segments reserve 20 + 30 = 50); empty_cache unmaps
 * the free pages. */
static void test_expandable_segments(void **state)
{
    (void)state;
    struct mp_alloc_conf c;
    conf(&c, "expandable_segments:True");
    struct mp_asim a;
    mp_asim_init(&a, &c, 0, 0);
    int x = mp_asim_alloc(&a, 5 * MiB); /* one 20 MiB page: 5 allocated, 15 free tail */
    assert_int_equal(a.reserved, 20 * MiB);
    int y = mp_asim_alloc(&a, 30 * MiB); /* 15 free + ceil(15 / 20) = 1 page: 35 MiB, split 30 + 5 */
    assert_int_equal(a.reserved, 40 * MiB);
    assert_int_equal(a.allocated, 35 * MiB);
    int s = mp_asim_alloc(&a, 1000); /* the small pool's own segment: one 2 MiB page */
    assert_int_equal(a.reserved, 42 * MiB);
    mp_asim_free(&a, x);
    mp_asim_free(&a, y);
    mp_asim_free(&a, s);
    mp_asim_empty_cache(&a); /* every page is inside a free block: all unmapped */
    assert_int_equal(a.reserved, 0);
    assert_true(mp_asim_alloc(&a, 30 * MiB) >= 0); /* maps 2 pages again */
    assert_int_equal(a.reserved, 40 * MiB);
    mp_asim_release(&a);
    struct mp_asim z; /* the defaults, same requests */
    mp_asim_init(&z, NULL, 0, 0);
    mp_asim_alloc(&z, 5 * MiB);
    mp_asim_alloc(&z, 30 * MiB);
    assert_int_equal(z.reserved, 50 * MiB);
    mp_asim_release(&z);
}

/* garbage_collection_threshold (with a memory fraction): before a new segment, when reserved is
 * over threshold x allowed memory, cached whole segments at least as old as the mean are freed. */
static void test_garbage_collection(void **state)
{
    (void)state;
    struct mp_alloc_conf c;
    conf(&c, "garbage_collection_threshold:0.5,per_process_memory_fraction:1.0");
    struct mp_asim a;
    mp_asim_init(&a, &c, 0, 100 * MiB); /* allowed 100 MiB, threshold 50 MiB */
    int x = mp_asim_alloc(&a, 30 * MiB), y = mp_asim_alloc(&a, 24 * MiB);
    mp_asim_free(&a, x);
    mp_asim_free(&a, y); /* 54 MiB cached, both of age 0 */
    assert_true(mp_asim_alloc(&a, 40 * MiB) >= 0);
    /* the search for 40 MiB ages both to 1 (mean 1); 54 > 50: both freed, then 40 MiB */
    assert_int_equal(a.reserved, 40 * MiB);
    assert_int_equal(a.peak_reserved, 54 * MiB);
    assert_int_equal(a.retries, 0);
    mp_asim_release(&a);
    conf(&c, "garbage_collection_threshold:0.5"); /* without a fraction it does nothing */
    mp_asim_init(&a, &c, 0, 100 * MiB);
    x = mp_asim_alloc(&a, 30 * MiB);
    y = mp_asim_alloc(&a, 24 * MiB);
    mp_asim_free(&a, x);
    mp_asim_free(&a, y);
    mp_asim_alloc(&a, 40 * MiB);
    assert_int_equal(a.reserved, 94 * MiB);
    mp_asim_release(&a);
}

/* PYTORCH_CUDA_ALLOC_CONF syntax: a bad value or key is one line naming the key. */
static void test_conf_errors(void **state)
{
    (void)state;
    static const struct {
        const char *s, *word;
    } bad[] = {
        {"max_split_size_mb:10", "max_split_size_mb"},          /* under 20 */
        {"foo:1", "foo"},                                       /* unknown key */
        {"expandable_segments:yes", "expandable_segments"},     /* True or False */
        {"garbage_collection_threshold:1.5", "garbage_collection_threshold"},
        {"backend:cudaMallocAsync", "cudaMallocAsync"},
        {"roundup_power2_divisions:3", "roundup_power2_divisions"}, /* not a power of 2 */
        {"expandable_segments", "expandable_segments"},         /* no value */
        {"expandable_segments:True,", "expandable_segments"},   /* trailing comma */
        {"large_segment_size_mb:10", "large_segment_size_mb"},  /* must be > 10 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct mp_alloc_conf c;
        struct mp_diag d = {{0}};
        mp_alloc_conf_default(&c);
        assert_int_equal(mp_alloc_conf_parse(bad[i].s, "--alloc-conf", &c, &d), MP_ERR_USAGE);
        assert_non_null(strstr(d.msg, bad[i].word));
        assert_non_null(strstr(d.msg, "--alloc-conf"));
        assert_null(strchr(d.msg, '\n'));
    }
    struct mp_alloc_conf c;
    conf(&c, " expandable_segments : True , max_split_size_mb:128,pinned_use_background_threads:True");
    assert_true(c.expandable);
    assert_int_equal(c.max_split_size, 128 * MiB);
    char buf[256];
    mp_alloc_conf_str(&c, buf, sizeof buf);
    assert_string_equal(buf, "expandable_segments:True,max_split_size_mb:128");
    /* a list comes back in a form torch reads as the same divisions */
    conf(&c, "roundup_power2_divisions:[64:8,256:4,>:2]");
    mp_alloc_conf_str(&c, buf, sizeof buf);
    assert_string_equal(buf, "roundup_power2_divisions:[64:8,128:0,256:2,>:2]");
    struct mp_alloc_conf back;
    conf(&back, buf);
    assert_memory_equal(back.pow2_div, c.pow2_div, sizeof c.pow2_div);
    conf(&c, "roundup_power2_divisions:4");
    mp_alloc_conf_str(&c, buf, sizeof buf);
    assert_string_equal(buf, "roundup_power2_divisions:4");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_pool_rounding),  cmocka_unit_test(test_twenty_mib_segment),
        cmocka_unit_test(test_large_round_and_split), cmocka_unit_test(test_best_fit_and_merge),
        cmocka_unit_test(test_max_split_size),       cmocka_unit_test(test_power2_rounding),
        cmocka_unit_test(test_oom_retry),            cmocka_unit_test(test_expandable_segments),
        cmocka_unit_test(test_garbage_collection),   cmocka_unit_test(test_conf_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
