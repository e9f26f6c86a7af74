/* lower_elementwise.c — copies, casts, activations, dropout, add, mul and clamp (build.h). */
#include "build.h"

#include <stdio.h>
#include <string.h>

/* ---- primitive lowerings ------------------------------------------------------------ */

/* A new value of x's shape: a copy in dtype dt (autocast casts, .float(), .contiguous():
 * ToCopyBackward0 saves nothing; its backward converts the gradient back), or LoRA's
 * scaling by a Python float (scale != 0; MulBackward0 of a scalar saves nothing). */
struct val lower_copy(struct bld *B, struct val x, enum mp_dtype dt, double scale, const char *name)
{
    if (failed(B))
        return x;
    struct val y = like(B, name, x, dt, ng(B, x));
    struct mp_node *n = new_node(B, scale != 0 ? MP_P_SCALE : MP_P_CAST, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->p = scale;
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* A module buffer resident like the batch: int64 ids of `rows` elements, or (rows 0) an fp32
 * scalar.  Returns its tensor id (-1 when the table of buffers is full: MP_ERR_INTERNAL). */
int id_buffer(struct bld *B, const char *name, uint64_t rows)
{
    if (failed(B))
        return -1;
    if (B->p->n_buffers >= MP_BUFFERS_MAX) {
        fail_model(B, MP_ERR_INTERNAL, "too many module buffers");
        return -1;
    }
    int t = new_flat(B, name, rows ? MP_DT_I64 : MP_DT_F32, rows ? rows : 1);
    B->p->buffers[B->p->n_buffers++] = t;
    return t;
}

/* x * a Python float (l->mult): a new tensor, nothing saved (MulBackward0 of a scalar). */
struct val mult_copy(struct bld *B, struct val x, const struct mp_layer *l, const char *name)
{
    return l->mult != 0 ? lower_copy(B, x, dt_of(B, x), l->mult, name) : x;
}

struct val cast_to(struct bld *B, struct val x, enum mp_dtype dt, const char *name)
{
    return lower_copy(B, x, dt, 0, name);
}

/* Autocast: matmul/conv inputs in the half dtype.  Returns x itself when no cast is needed. */
struct val autocast_in(struct bld *B, struct val x, const char *name)
{
    enum mp_dtype c = B->p->compute_dtype;
    if (!B->amp || dt_of(B, x) == c || failed(B))
        return x;
    return lower_copy(B, x, c, 0, name);
}

/* An activation.  Under autocast with a half input, a composite that calls an op on CUDA
 * autocast's fp32 list (the amp32 column: gelu_new's torch.pow) runs in fp32 from there on:
 * pow saves an fp32 copy of its input, the later intermediates and the output are fp32,
 * and the next Linear casts the output back (its saved half copy).  CUDA's list, not the
 * CPU's: memplan plans CUDA runs (bench/accuracy/torch_step_results.md lists the CPU difference). */
struct val lower_act(struct bld *B, struct val x, enum mp_act act, bool inplace, const char *name)
{
    if (failed(B))
        return x;
    enum mp_dtype xdt = dt_of(B, x);
    bool amp32 = B->amp && xdt != MP_DT_F32;
    bool saves_out = mp_act_saves_output(act);
    enum mp_dtype odt = amp32 && mp_act_fp32_under_amp(act, "out") ? MP_DT_F32 : xdt;
    struct val y = inplace && act == MP_ACT_RELU ? x : like(B, name, x, odt, ng(B, x));
    struct mp_node *n = new_node(B, MP_P_ACT, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->act = act;
    char en[112];
    if (saves_out) {
        save(n, y.t);
    } else if (amp32 && mp_act_fp32_under_amp(act, "in")) {
        snprintf(en, sizeof en, "%s.x_fp32", name); /* autocast's cast for pow, saved by pow */
        extra_as(n, new_flat(B, en, MP_DT_F32, T(B, x.t)->elems), MP_XR_X_FP32);
    } else {
        save(n, x.t);
    }
    /* HF's Python composites (gelu_new, gelu_fast, xielu) keep intermediates the size of x (in x's
     * dtype, fp32 where the amp32 column says, one byte per element for a ":u8" bool) */
    size_t n_extras = 0;
    bool any32 = false;
    for (const char *e = mp_act_intermediates(act); *e; n_extras++) {
        size_t w = strcspn(e, " "), k = strcspn(e, " :");
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)k, e);
        bool f32 = amp32 && mp_act_fp32_under_amp(act, word);
        any32 |= f32;
        snprintf(en, sizeof en, "%s.%s", name, word);
        enum mp_dtype pdt = k < w ? MP_DT_U8 : f32 ? MP_DT_F32 : xdt;
        extra_as(n, new_flat(B, en, pdt, T(B, x.t)->elems), MP_XR_ACT_PART);
        e += w;
        e += strspn(e, " ");
    }
    /* xIELU's two learned (1,) scalars (the node makes their gradients).  Its two 0-dim buffers
     * (beta, eps: 512 bytes each as allocated) are not modelled: the table of module buffers is
     * short (MP_BUFFERS_MAX) and 1 KiB per layer is below any figure memplan reports */
    if (act == MP_ACT_XIELU) {
        static const char *const pn[2] = {"alpha_p", "alpha_n"};
        for (int i = 0; i < 2; i++) {
            snprintf(en, sizeof en, "%s.%s", name, pn[i]);
            n->param[i] = new_param(B, en, 1, 1, false);
        }
    }
    /* forward transients (the fwd column: gelu's pow(x, 3) and polynomial, xIELU's where branches),
     * not saved; two of them fp32 where autocast or an fp32 parameter upcast them */
    uint64_t elems = T(B, x.t)->elems, nf = (uint64_t)mp_act_fwd_tensors(act), n32 = any32 ? mp_min_u64(nf, 2) : 0;
    if (nf) { /* each its own tensor (the caching allocator's requests), up to MP_NODE_TMP_MAX */
        enum mp_trole roles[MP_NODE_TMP_MAX] = {MP_TR_OTHER, MP_TR_OTHER, MP_TR_OTHER};
        uint64_t parts[MP_NODE_TMP_MAX] = {0}, cnt = mp_min_u64(nf, MP_NODE_TMP_MAX);
        for (uint64_t i = 0; i < nf; i++) {
            uint64_t *pt = &parts[mp_min_u64(i, cnt - 1)];
            *pt = add(B, *pt, mul(B, elems, i < n32 ? 4 : mp_dtype_size(xdt)));
        }
        tmp_parts(B, n, false, (int)cnt, roles, parts);
        n->fwd_tmp_first = true;
    }
    /* backward of HF's composites: the x-sized tensors their chain of autograd nodes holds beyond
     * a fused kernel's gradients (model.h's bwd column, measured); an output promoted to fp32 by a
     * parameter (amp32 "out" without "in": xIELU) casts x's gradient back to x's dtype, one more
     * x-sized tensor; a bool part (xIELU's where mask) is freed before the peak, when the last op's
     * backward is done */
    if (mp_act_bwd_tensors(act)) {
        uint64_t bw = mul(B, mul(B, elems, mp_dtype_size(odt)), (uint64_t)mp_act_bwd_tensors(act));
        if (odt != xdt && !mp_act_fp32_under_amp(act, "in"))
            bw = add(B, bw, mul(B, elems, mp_dtype_size(xdt)));
        for (const char *e = mp_act_intermediates(act); *e; e += strcspn(e, " "), e += strspn(e, " "))
            if (strcspn(e, " ") > strcspn(e, " :") && bw >= elems)
                bw -= elems;
        tmp_one(B, n, true, MP_TR_OTHER, bw);
    }
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = 8.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

/* Dropout with 0 < p < 1 in training: a 1-byte mask per element (CUDA). */
struct val lower_dropout(struct bld *B, struct val x, double p, const char *name)
{
    if (failed(B) || p <= 0.0)
        return x;
    struct val y = like(B, name, x, dt_of(B, x), ng(B, x));
    struct mp_node *n = new_node(B, MP_P_DROPOUT, name);
    if (!n)
        return y;
    char mn[80];
    snprintf(mn, sizeof mn, "%s.mask", name);
    n->in[0] = x.t;
    n->out = y.t;
    n->p = p;
    extra_as(n, new_flat(B, mn, MP_DT_U8, T(B, x.t)->elems), MP_XR_DROP_MASK);
    n->rows = rows_of(x);
    n->n = last_dim(x);
    n->fwd_flops = 2.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

struct val lower_add(struct bld *B, struct val a, struct val b, const char *name)
{
    if (failed(B))
        return a;
    if (T(B, a.t)->elems != T(B, b.t)->elems) {
        fail_model(B, MP_ERR_MODEL, "residual: the branch output (%llu elements) does not match the residual (%llu)",
                   (unsigned long long)T(B, b.t)->elems, (unsigned long long)T(B, a.t)->elems);
        return a;
    }
    struct val y = like(B, name, a, promote(dt_of(B, a), dt_of(B, b)), ng(B, a) || ng(B, b));
    struct mp_node *n = new_node(B, MP_P_ADD, name);
    if (!n)
        return y;
    n->in[0] = a.t;
    n->in[1] = b.t;
    n->out = y.t;
    n->rows = rows_of(a);
    n->n = last_dim(a);
    n->fwd_flops = (double)T(B, a.t)->elems;
    return y;
}

/* x.clamp_(-c, c) (OLMo's clip_qkv): in place, but ClampBackward1 needs x as it was, so autograd
 * saves a clone of it (measured: saved_tensors_hooks sees a new storage).  Modelled as a new clamped
 * tensor whose node saves x: the same two x-sized tensors, the same gradient. */
struct val lower_clamp(struct bld *B, struct val x, const char *name)
{
    struct val y = lower_copy(B, x, dt_of(B, x), 0, name);
    if (!failed(B))
        save(&B->p->nodes[B->p->n_nodes - 1], x.t);
    return y;
}

/* a * b (MulBackward0 saves both factors); b may broadcast over a's last dimension (the MoE
 * weights (S, 1), Qwen2-MoE's shared-expert gate).  The product has a's shape and the promoted
 * dtype. */
struct val lower_mul(struct bld *B, struct val a, struct val b, const char *name)
{
    if (failed(B))
        return a;
    struct val m = like(B, name, a, promote(dt_of(B, a), dt_of(B, b)), true);
    struct mp_node *n = new_node(B, MP_P_MUL, name);
    if (!n)
        return m;
    n->in[0] = a.t;
    n->in[1] = b.t;
    n->out = m.t;
    save(n, a.t);
    save(n, b.t);
    n->rows = rows_of(a);
    n->n = last_dim(a);
    n->fwd_flops = (double)val_elems(B, a);
    n->bwd_flops = 2.0 * n->fwd_flops;
    /* backward temporaries, alive together (measured: MulBackward0 makes b's product, then a's,
     * then casts): b's gradient when b broadcasts ((grad * a), a-shaped, summed after), and a's
     * gradient in the promoted dtype before its cast to a's (_to_copy) */
    uint64_t ma = mul(B, val_elems(B, a), mp_dtype_size(dt_of(B, m)));
    tmp_one(B, n, true, MP_TR_OTHER,
            add(B, val_elems(B, b) < val_elems(B, a) ? ma : 0, dt_of(B, a) != dt_of(B, m) ? ma : 0));
    /* the cast and the sum are the engine's (validate_outputs), after MulBackward0 returns */
    n->engine_grad[0] = dt_of(B, a) != dt_of(B, m);
    n->engine_grad[1] = val_elems(B, b) < val_elems(B, a) || dt_of(B, b) != dt_of(B, m);
    return m;
}
