/* optim.h — what an optimizer keeps: its state per parameter (persistent) and the
 * temporaries of its step.  The rules of torch.optim, bitsandbytes and torchao, per parameter;
 * the step replay (replay.c) and the sharding arithmetic (parallel.c) both use them.
 * Pure: no allocation, no I/O.  Sizes are bytes in uint64_t.
 */
#ifndef MEMPLAN_OPTIM_H
#define MEMPLAN_OPTIM_H

#include "ir/layers.h"

/* Optimizer state bytes for one parameter (persistent; 0 when it does not train). */
uint64_t mp_opt_state_bytes(const struct mp_program *p, enum mp_optimizer o, const struct mp_param *q);
/* Whether bitsandbytes' 8-bit optimizers (and HF's Trainer) keep q's states in 8 bits: a trained
 * tensor of at least 4096 elements that is not an nn.Embedding weight (the others: fp32). */
bool mp_opt_bnb_8bit(const struct mp_param *q);
/* The largest trainable parameter so far: *elems and *dt become q's where q trains and is larger. */
void mp_opt_largest(const struct mp_param *q, uint64_t *elems, enum mp_dtype *dt);
/* The optimizer step's temporary for all of p's parameters (Adam/AdamW foreach: one tensor per
 * parameter, together the size of the gradients; Adafactor: fp32 tensors like the largest; Muon: its
 * largest one-parameter step or AdamW's foreach over the rest; others none). */
uint64_t mp_opt_step_tmp_bytes(const struct mp_program *p, enum mp_optimizer o);
/* The same from the gradients' total bytes, the largest trainable parameter (its elements and
 * dtype) and Muon's figures (mp_opt_muon_add); UINT64_MAX past 64 bits. */
uint64_t mp_opt_step_tmp_of(enum mp_optimizer o, uint64_t total_grad_bytes, uint64_t largest_elems,
                            enum mp_dtype largest_dtype, uint64_t muon_max, uint64_t adamw_grad);
/* Whether torch.optim.Muon steps q (a hidden layer's 2-D weight; the rest: AdamW). */
bool mp_opt_muon_param(const struct mp_param *q);
/* Muon's step temporaries so far: *muon_max the largest one-parameter step (its update and
 * Newton-Schulz iterates), *adamw_grad the gradient bytes (times weight) of those AdamW steps. */
void mp_opt_muon_add(const struct mp_param *q, uint64_t weight, uint64_t *muon_max, uint64_t *adamw_grad);

#endif
