#!/bin/sh
# Builds the two binaries bench/torch_saved.py uses, outside the repository's build/:
#   $OUT/memplan      memplan without the probe (a stub stands in for src/probe*.c)
#   $OUT/dump_saved   bench/dump_saved.c: memplan's saved tensors, one JSON line each
# Usage: sh bench/torch_saved_build.sh [OUT]   (default /tmp/tsbuild; run from the repository root)
set -eu
OUT=${1:-/tmp/tsbuild}
mkdir -p "$OUT"
CF="-std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Isrc $(pkg-config --cflags libcjson 2>/dev/null || echo -I/usr/include/cjson)"
LIBS="$(pkg-config --libs libcjson 2>/dev/null || echo -lcjson) -lm"
for f in src/*.c; do
    case $f in src/probe*) continue ;; esac
    gcc $CF -c "$f" -o "$OUT/$(basename "$f" .c).o"
done
cat > "$OUT/probe_stub.c" <<'STUB'
#include "probe.h"
#include <string.h>
void mp_probe_opts_default(struct mp_probe_opts *o) { memset(o, 0, sizeof *o); }
bool mp_cuda_device_available(void) { return false; }
bool mp_cuda_built(void) { return false; }
enum mp_status mp_probe_open(struct mp_probe **out, const struct mp_probe_opts *o, struct mp_diag *d)
{ (void)out; (void)o; return mp_fail(d, MP_ERR_UNSUPPORTED, "probe not built (torch_saved_build.sh stub)"); }
enum mp_status mp_probe_device_info(struct mp_probe *p, struct mp_device_info *out)
{ (void)p; (void)out; return MP_ERR_UNSUPPORTED; }
enum mp_status mp_probe_run(struct mp_probe *p, const struct mp_program *prog, const struct mp_schedule *sched,
                            const struct mp_train_opts *t, struct mp_probe_result *r, struct mp_diag *d)
{ (void)p; (void)prog; (void)sched; (void)t; (void)r; return mp_fail(d, MP_ERR_UNSUPPORTED, "probe not built"); }
void mp_probe_close(struct mp_probe *p) { (void)p; }
STUB
gcc $CF -c "$OUT/probe_stub.c" -o "$OUT/probe_stub.o"
OBJS=$(ls "$OUT"/*.o)
gcc -o "$OUT/memplan" $OBJS $LIBS
gcc $CF bench/dump_saved.c $(echo "$OBJS" | grep -v -e '/main\.o$' -e '/report\.o$') -o "$OUT/dump_saved" $LIBS
echo "built $OUT/memplan $OUT/dump_saved"
