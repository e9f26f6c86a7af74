/* dump_saved.c — prints, as JSON lines, every storage memplan's tensor program keeps
 * for backward (node->saved) plus each block's output, with the block that creates it.
 * Used by bench/accuracy/torch_saved.py to compare memplan with PyTorch tensor by tensor.
 *
 *   dump_saved MODEL BATCH SEQ PRECISION [ATTENTION [TARGET_SEQ]]   (TARGET_SEQ: encoder-decoders)
 *
 * Build: see bench/accuracy/torch_saved.md ("Building").  It links memplan's objects except
 * main.o, report.o and the probe (a stub provides the probe symbols nothing here calls).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/layers.h"
#include "model/model.h"

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL BATCH SEQ PRECISION [sdpa|eager]\n", argv[0]);
        return 2;
    }
    struct mp_model m;
    struct mp_diag d = {{0}};
    mp_model_init(&m);
    if (mp_model_load_file(&m, argv[1], &d) != MP_OK) {
        fprintf(stderr, "%s\n", d.msg);
        return 3;
    }
    struct mp_build_opts o;
    mp_build_opts_default(&o);
    o.batch = strtoull(argv[2], NULL, 10);
    o.seq = strtoull(argv[3], NULL, 10);
    int prec = mp_precision_parse(argv[4]);
    if (prec < 0) {
        fprintf(stderr, "bad precision %s\n", argv[4]);
        return 2;
    }
    o.precision = (enum mp_precision)prec;
    if (argc > 5) {
        o.attention_forced = true;
        o.attention = strcmp(argv[5], "eager") == 0 ? MP_ATTN_EAGER : MP_ATTN_SDPA;
    }
    if (argc > 6)
        o.target_seq = strtoull(argv[6], NULL, 10);
    struct mp_program p;
    if (mp_program_build(&m, &o, &p, &d) != MP_OK) {
        fprintf(stderr, "%s\n", d.msg);
        return 3;
    }
    char *kept = calloc(p.n_tensors ? p.n_tensors : 1, 1);
    /* saved tensors, by the node that saves them first */
    for (size_t k = 0; k < p.n_nodes; k++) {
        const struct mp_node *n = &p.nodes[k];
        for (int j = 0; j < n->n_saved; j++) {
            int t = n->saved[j];
            const struct mp_tensor *T = &p.tensors[t];
            printf("{\"kind\":\"saved\",\"block\":\"%s\",\"tensor\":\"%s\",\"dtype\":\"%s\",\"bytes\":%llu,"
                   "\"by\":\"%s:%s\",\"input\":%s,\"first\":%s}\n",
                   T->block >= 0 ? m.blocks[T->block].name : "input", T->name, mp_dtype_str(T->dtype),
                   (unsigned long long)T->bytes, mp_prim_str(n->prim), n->name,
                   (t == p.input || t == p.labels) ? "true" : "false", kept[t] ? "false" : "true");
            kept[t] = 1;
        }
    }
    for (size_t i = 0; i < p.n_blocks; i++) {
        int t = p.blocks[i].output;
        const struct mp_tensor *T = &p.tensors[t];
        printf("{\"kind\":\"output\",\"block\":\"%s\",\"tensor\":\"%s\",\"dtype\":\"%s\",\"bytes\":%llu,"
               "\"saved\":%s}\n",
               m.blocks[i].name, T->name, mp_dtype_str(T->dtype), (unsigned long long)T->bytes,
               kept[t] ? "true" : "false");
    }
    free(kept);
    mp_program_release(&p);
    mp_model_release(&m);
    return 0;
}
