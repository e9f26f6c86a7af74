/* fuzz_model.c — libFuzzer harness: bytes as a model file (memplan JSON or an HF
 * config.json, detected as for a real file), then what every command does with
 * a model: build the tensor program, run the estimator, and make checkpoint
 * plans (sqrt, and optimal under a budget below the no-checkpoint peak).
 *
 * Any crash, sanitizer report or leak is a bug; a rejected input is fine (it must
 * only say why in the diagnostic).  Run by `make fuzz` (tests/fuzz/README).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "estimate/estimate.h"
#include "ir/layers.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Keep one execution short: the fuzzer looks for crashes, not for slow giants
 * (bench/speed/scale.sh times those), and `make fuzz` must pass on a loaded 2-core machine
 * under -timeout=10.  Under the sanitizers and libFuzzer's comparison tracing the work
 * grows with the program, not with batch or seq: an estimator replay costs about
 * nodes x live allocations (gpt2-124m with 250 blocks, 3,759 nodes: 2.5 s a replay),
 * the optimal DP about blocks^3 x slots (128 blocks at 100 slots: 2.4 s).  So the
 * stages stop at budgets: the bundled 70B-class seeds (1,700 to 2,600 nodes) build, chain
 * and plan but are not replayed, and took 5.4 to 8.6 s each at load 6 to 8 here, now at
 * most 1.0 s (every seed; 128 blocks of tiny-test, the DP's worst, 0.6 s). */
#define MAX_BLOCKS 256   /* above: load only */
#define MAX_NODES 4000   /* above: load and build only */
#define REPLAY_NODES 800 /* above: no estimator replay */
#define DP_SLOTS(L) ((L) <= 32 ? 100 : (L) <= 64 ? 20 : 10)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mp_model m;
    struct mp_diag d = {{0}};
    if (mp_model_load_string(&m, (const char *)data, size, "fuzz.json", &d) != MP_OK) {
        if (!d.msg[0] || strchr(d.msg, '\n'))
            __builtin_trap(); /* every rejection says why, on one line */
        return 0;
    }
    if (m.n_blocks > MAX_BLOCKS) {
        mp_model_release(&m);
        return 0;
    }
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = 2;
    o.seq = m.input == MP_INPUT_TOKENS && m.seq_len > 64 ? 64 : 0;
    struct mp_program p;
    if (mp_program_build(&m, &o, &p, &d) == MP_OK) {
        if (p.n_nodes <= MAX_NODES) {
            bool replay = p.n_nodes <= REPLAY_NODES;
            struct mp_train_opts t;
            mp_train_opts_default(&t);
            struct mp_estimate e;
            if (replay && mp_estimate_run(&p, NULL, &t, 0, &e, &d) == MP_OK)
                mp_estimate_release(&e);
            struct mp_chain c;
            if (mp_estimate_chain(&p, &c, &d) == MP_OK) {
                struct mp_ckpt_plan plan;
                struct mp_ckpt_spec sq = {MP_CKPT_SQRT, 0}, opt = {MP_CKPT_OPTIMAL, 0};
                uint64_t peak = 0;
                if (mp_ckpt_plan_make(&c, &sq, 0, 0, &plan, &d) == MP_OK) {
                    peak = plan.peak_bytes;
                    if (replay && mp_estimate_run(&p, &plan.sched, &t, 0, &e, &d) == MP_OK)
                        mp_estimate_release(&e);
                    mp_ckpt_plan_release(&plan);
                }
                if (peak && mp_ckpt_plan_make(&c, &opt, peak, DP_SLOTS(c.L), &plan, &d) == MP_OK) {
                    if (plan.peak_bytes > peak)
                        __builtin_trap(); /* a budgeted plan never exceeds its budget */
                    mp_ckpt_plan_release(&plan);
                }
                mp_chain_release(&c);
            }
        }
        mp_program_release(&p);
    }
    mp_model_release(&m);
    return 0;
}
