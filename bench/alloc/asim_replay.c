/* asim_replay.c — memplan's allocator simulation (src/estimate/alloc_sim.c) over a recorded request
 * sequence: the GPU's own (bench/alloc/traces/, the kit's MEMPLAN_KIT_TRACE) or memplan's
 * (MEMPLAN_ALLOC_TRACE).  With the GPU's sequence, a peak that matches the GPU's says alloc_sim's
 * rules hold for those settings, and a miss of memplan's estimate is in its requests.
 *
 *   make bench/alloc/asim_replay
 *   bench/alloc/asim_replay TRACE [--alloc-conf CONF] [--from MARK]
 *
 * Trace lines: `a KEY BYTES ...` (an allocation; KEY the GPU's address or memplan's key), `f KEY`
 * (its free; in a record with `F KEY` lines, the block is reusable at `F`: free_completed, later
 * than free_requested where a stream still uses it),
 * `e` (empty_cache), `r` (reset_peak_memory_stats), `m NAME` (a mark: with --from NAME the peaks
 * are reset there, as the kit resets them at "step 1"), `x KEY` (a host allocation: its lines are
 * dropped); `s`/`u` (the GPU's segment lines) are read by gpu_traces.py, not here.  Prints the
 * peak reserved and allocated bytes (the caching allocator's block sizes), one line; with
 * --series first each trace line (1-based) after which the reserved bytes changed, and them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "estimate/estimate.h"

struct live {
    char key[40];
    int blk;
};

static int find(struct live *l, size_t n, const char *key)
{
    for (size_t i = n; i-- > 0;)
        if (l[i].blk >= 0 && !strcmp(l[i].key, key))
            return (int)i;
    return -1;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *conf = "", *from = NULL;
    bool series = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--alloc-conf") && i + 1 < argc)
            conf = argv[++i];
        else if (!strcmp(argv[i], "--from") && i + 1 < argc)
            from = argv[++i];
        else if (!strcmp(argv[i], "--series"))
            series = true;
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "usage: asim_replay TRACE [--alloc-conf CONF] [--from MARK] [--series]\n");
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "usage: asim_replay TRACE [--alloc-conf CONF] [--from MARK] [--series]\n");
        return 2;
    }
    struct mp_alloc_conf c;
    struct mp_diag d = {0};
    mp_alloc_conf_default(&c);
    if (*conf && mp_alloc_conf_parse(conf, "--alloc-conf", &c, &d) != MP_OK) {
        fprintf(stderr, "asim_replay: %s\n", d.msg);
        return 2;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "asim_replay: cannot read %s\n", path);
        return 2;
    }
    struct mp_asim a;
    mp_asim_init(&a, &c, 0, 0);
    size_t n = 0, cap = 0, lineno = 0;
    struct live *l = NULL;
    char line[512], host[4096][40];
    size_t nhost = 0;
    bool completed = false; /* the record has free_completed lines: blocks are reusable there */
    /* pass 1: host keys (x lines) */
    while (fgets(line, sizeof line, f)) {
        char k[40];
        if (line[0] == 'x' && sscanf(line + 1, "%39s", k) == 1 && nhost < 4096)
            snprintf(host[nhost++], sizeof host[0], "%s", k);
        completed |= line[0] == 'F';
    }
    rewind(f);
    uint64_t last = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (series && a.reserved != last) {
            printf("%zu %llu\n", lineno - 1, (unsigned long long)a.reserved);
            last = a.reserved;
        }
        char k[40] = "";
        unsigned long long bytes = 0;
        bool is_host = false;
        if ((line[0] == 'a' || line[0] == 'f' || line[0] == 'F') && sscanf(line + 1, "%39s", k) == 1)
            for (size_t h = 0; h < nhost && !is_host; h++)
                is_host = !strcmp(host[h], k);
        if (is_host)
            continue;
        if (line[0] == 'a' && sscanf(line + 1, "%39s %llu", k, &bytes) == 2) {
            if (n == cap) {
                cap = cap ? 2 * cap : 4096;
                struct live *nl = realloc(l, cap * sizeof *l);
                if (!nl) {
                    fprintf(stderr, "asim_replay: out of memory\n");
                    return 1;
                }
                l = nl;
            }
            int b = mp_asim_alloc(&a, bytes);
            if (b < 0) {
                fprintf(stderr, "asim_replay: %s:%zu: the simulation failed\n", path, lineno);
                return 1;
            }
            snprintf(l[n].key, sizeof l[n].key, "%s", k);
            l[n++].blk = b;
        } else if (line[0] == (completed ? 'F' : 'f') && k[0]) {
            int i = find(l, n, k);
            if (i >= 0) {
                mp_asim_free(&a, l[i].blk);
                l[i].blk = -1;
            }
        } else if (line[0] == 'e') {
            mp_asim_empty_cache(&a);
        } else if (line[0] == 'r') {
            a.peak_reserved = a.reserved;
            a.peak_allocated = a.allocated;
        } else if (line[0] == 'm' && from) {
            char *name = line + 1;
            name += strspn(name, " ");
            name[strcspn(name, "\n")] = 0;
            if (!strcmp(name, from)) {
                a.peak_reserved = a.reserved;
                a.peak_allocated = a.allocated;
            }
        }
    }
    fclose(f);
    printf("%llu %llu\n", (unsigned long long)a.peak_reserved, (unsigned long long)a.peak_allocated);
    free(l);
    mp_asim_release(&a);
    return 0;
}
