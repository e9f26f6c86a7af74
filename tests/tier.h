/* tier.h — the two test tiers.  `make test` runs every suite's quick cases (the whole of it in
 * under 3 minutes on a loaded 2-core machine); `make test-long` sets MEMPLAN_TEST_LONG=1 and runs
 * the long ones: the same checks over the other models, plans and sizes, and the cases that are
 * slow there.  A check is in one tier or the other, never dropped: the two together are the
 * whole suite, and CI runs both.  Include after <cmocka.h>.
 *
 *   main:    return run_tiers(quick, long_);     (two cmocka groups, one run per tier)
 *   a loop:  if (!in_tier(state, i)) continue;    (item i of a case that both tiers share, its
 *            state a struct tier from TIER_CASE: every TIER_STRIDE-th item is quick, the others
 *            long; tier_quick(state) says which tier a case runs in)
 */
#ifndef MEMPLAN_TESTS_TIER_H
#define MEMPLAN_TESTS_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* MEMPLAN_TEST_LONG set and not "0": the long tier */
static inline bool test_tier_long(void)
{
    const char *e = getenv("MEMPLAN_TEST_LONG");
    return e && *e && strcmp(e, "0") != 0;
}

struct tier {
    bool quick;
};

/* a case that both tiers share, each taking its part of the items (in_tier); the state lives
 * as long as main's block */
#define TIER_CASE_QUICK(f) cmocka_unit_test_prestate(f, &(struct tier){true})
#define TIER_CASE_LONG(f) cmocka_unit_test_prestate(f, &(struct tier){false})

#define TIER_STRIDE 4

static inline bool tier_quick(void **state) { return ((const struct tier *)*state)->quick; }

/* item i of a shared case: 0, stride, 2 x stride ... are quick, the others long */
static inline bool in_tier_n(void **state, size_t i, size_t stride) { return (i % stride == 0) == tier_quick(state); }
static inline bool in_tier(void **state, size_t i) { return in_tier_n(state, i, TIER_STRIDE); }

#define run_tiers(quick, long_)                                                                    \
    (test_tier_long() ? cmocka_run_group_tests_name("long", long_, NULL, NULL)                     \
                      : cmocka_run_group_tests_name("quick", quick, NULL, NULL))

#endif
