/* lower_conv.c — vision: convolution, batch norm, pooling, the ResNet bottleneck and patch embeddings
 * (build.h). */
#include "build.h"

#include <stdio.h>

struct val lower_conv(struct bld *B, struct val x, uint64_t cin, uint64_t cout, uint64_t k, uint64_t stride,
                      uint64_t pad, uint64_t groups, bool bias, const char *name)
{
    if (failed(B))
        return x;
    if (x.rank != 4 || x.shape[1] != cin) {
        fail_model(B, MP_ERR_MODEL, "%s: in_ch %llu does not match the incoming channels %llu", name,
                   (unsigned long long)cin, (unsigned long long)(x.rank == 4 ? x.shape[1] : 0));
        return x;
    }
    if (groups == 0 || cin % groups || cout % groups || k == 0 || stride == 0) {
        fail_model(B, MP_ERR_MODEL, "%s: kernel, stride and groups must be positive and groups divide channels",
                   name);
        return x;
    }
    uint64_t hi = x.shape[2], wi = x.shape[3];
    if (hi + 2 * pad < k || wi + 2 * pad < k) {
        fail_model(B, MP_ERR_MODEL, "%s: kernel %llu is larger than the padded input %llux%llu", name,
                   (unsigned long long)k, (unsigned long long)hi, (unsigned long long)wi);
        return x;
    }
    uint64_t ho = (hi + 2 * pad - k) / stride + 1, wo = (wi + 2 * pad - k) / stride + 1;
    char cn[64];
    snprintf(cn, sizeof cn, "%s.cast", name);
    struct val xin = autocast_in(B, x, cn);
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    int w = new_param(B, pn, cout, mul(B, mul(B, cin / groups, k), k), true);
    snprintf(pn, sizeof pn, "%s.bias", name);
    int bp = bias ? new_param(B, pn, 1, cout, false) : -1;
    uint64_t shape[4] = {x.shape[0], cout, ho, wo};
    struct val y = new_val(B, name, B->amp ? B->p->compute_dtype : dt_of(B, xin), 4, shape, true);
    struct mp_node *n = matmul_node(B, MP_P_CONV2D, name, xin, y, w, bp);
    if (!n)
        return y;
    n->c_in = cin;
    n->c_out = cout;
    n->h_in = hi;
    n->w_in = wi;
    n->h_out = ho;
    n->w_out = wo;
    n->kernel = k;
    n->stride = stride;
    n->padding = pad;
    n->groups = groups;
    n->fwd_flops = 2.0 * (double)x.shape[0] * (double)cout * (double)ho * (double)wo * (double)(cin / groups) *
                   (double)k * (double)k;
    n->bwd_flops = ng(B, xin) ? 2.0 * n->fwd_flops : n->fwd_flops;
    return y;
}

struct val lower_batchnorm(struct bld *B, struct val x, uint64_t c, const char *name)
{
    if (failed(B))
        return x;
    if (x.rank != 4 || x.shape[1] != c) {
        fail_model(B, MP_ERR_MODEL, "%s: channels %llu do not match the incoming channels %llu", name,
                   (unsigned long long)c, (unsigned long long)(x.rank == 4 ? x.shape[1] : 0));
        return x;
    }
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", name);
    int g = new_param(B, pn, 1, c, false);
    snprintf(pn, sizeof pn, "%s.bias", name);
    int be = new_param(B, pn, 1, c, false);
    struct val y = like(B, name, x, dt_of(B, x), true);
    struct mp_node *n = new_node(B, MP_P_BATCHNORM, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = g;
    n->param[1] = be;
    save(n, x.t);
    snprintf(pn, sizeof pn, "%s.save_mean", name);
    extra_as(n, new_flat(B, pn, MP_DT_F32, c), MP_XR_BN_MEAN);
    snprintf(pn, sizeof pn, "%s.save_invstd", name);
    extra_as(n, new_flat(B, pn, MP_DT_F32, c), MP_XR_BN_INVSTD);
    n->c_in = n->c_out = c;
    n->h_in = n->h_out = x.shape[2];
    n->w_in = n->w_out = x.shape[3];
    n->fwd_flops = 8.0 * (double)T(B, x.t)->elems;
    n->bwd_flops = 2.0 * n->fwd_flops;
    return y;
}

struct val lower_pool(struct bld *B, struct val x, enum mp_prim prim, uint64_t k, uint64_t stride,
                      uint64_t pad, uint64_t oh, uint64_t ow, const char *name)
{
    if (failed(B))
        return x;
    if (x.rank != 4) {
        fail_model(B, MP_ERR_MODEL, "%s: pooling needs an image-shaped input (C, H, W)", name);
        return x;
    }
    uint64_t hi = x.shape[2], wi = x.shape[3], ho, wo;
    if (prim == MP_P_ADAPTIVE_AVGPOOL) {
        if (oh == 0 || ow == 0 || oh > hi || ow > wi) {
            fail_model(B, MP_ERR_MODEL, "%s: output size %llux%llu must be within the input %llux%llu", name,
                       (unsigned long long)oh, (unsigned long long)ow, (unsigned long long)hi,
                       (unsigned long long)wi);
            return x;
        }
        ho = oh;
        wo = ow;
    } else {
        if (k == 0 || stride == 0 || hi + 2 * pad < k || wi + 2 * pad < k || pad * 2 > k) {
            fail_model(B, MP_ERR_MODEL, "%s: kernel %llu, stride %llu, padding %llu do not fit the input %llux%llu",
                       name, (unsigned long long)k, (unsigned long long)stride, (unsigned long long)pad,
                       (unsigned long long)hi, (unsigned long long)wi);
            return x;
        }
        ho = (hi + 2 * pad - k) / stride + 1;
        wo = (wi + 2 * pad - k) / stride + 1;
    }
    uint64_t shape[4] = {x.shape[0], x.shape[1], ho, wo};
    struct val y = new_val(B, name, dt_of(B, x), 4, shape, ng(B, x));
    struct mp_node *n = new_node(B, prim, name);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    save(n, x.t);
    if (prim == MP_P_MAXPOOL) {
        char en[80];
        snprintf(en, sizeof en, "%s.indices", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, T(B, y.t)->elems), MP_XR_POOL_INDICES);
    }
    n->c_in = n->c_out = x.shape[1];
    n->h_in = hi;
    n->w_in = wi;
    n->h_out = ho;
    n->w_out = wo;
    n->kernel = k;
    n->stride = stride;
    n->padding = pad;
    n->fwd_flops = (double)T(B, x.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return y;
}

struct val lower_bottleneck(struct bld *B, struct val x, const struct mp_layer *l)
{
    uint64_t mid = l->conv.mid_ch, out = l->conv.out_ch ? l->conv.out_ch : mid * 4,
             st = l->conv.stride ? l->conv.stride : 1;
    struct val y = lower_conv(B, x, l->conv.in_ch, mid, 1, 1, 0, 1, false, "conv1");
    y = lower_act(B, lower_batchnorm(B, y, mid, "bn1"), MP_ACT_RELU, true, "relu1");
    y = lower_conv(B, y, mid, mid, 3, st, 1, 1, false, "conv2");
    y = lower_act(B, lower_batchnorm(B, y, mid, "bn2"), MP_ACT_RELU, true, "relu2");
    y = lower_conv(B, y, mid, out, 1, 1, 0, 1, false, "conv3");
    y = lower_batchnorm(B, y, out, "bn3");
    struct val sc = x;
    if (l->conv.downsample) {
        sc = lower_conv(B, x, l->conv.in_ch, out, 1, st, 0, 1, false, "downsample.0");
        sc = lower_batchnorm(B, sc, out, "downsample.1");
    } else if (!failed(B) && (l->conv.in_ch != out || st != 1)) {
        fail_model(B, MP_ERR_MODEL, "in_ch %llu -> out_ch %llu (stride %llu) needs \"downsample\": true",
                   (unsigned long long)l->conv.in_ch, (unsigned long long)out, (unsigned long long)st);
        return x;
    }
    y = lower_add(B, y, sc, "residual");
    return lower_act(B, y, MP_ACT_RELU, true, "relu3");
}

/* The class token prepended to each image's patches, (N, patches, dim) -> (N, patches + 1, dim):
 * torch.cat with the (1, 1, dim) parameter expanded (ViT's cls_token, Llama 4's class_embedding):
 * a new tensor, its dtype promoted with the parameter's (fp32 under autocast); nothing saved. */
struct val lower_class_cat(struct bld *B, struct val x, const char *param)
{
    if (failed(B))
        return x;
    uint64_t N = x.shape[0], s = add(B, x.shape[1], 1), dim = x.shape[2];
    const uint64_t shape[3] = {N, s, dim};
    int cls = new_param(B, param, 1, dim, false);
    struct val e = new_val(B, "cat", promote(dt_of(B, x), B->p->param_dtype), 3, shape, true);
    struct mp_node *n = new_node(B, MP_P_CAST, "cat");
    if (!n)
        return e;
    n->in[0] = x.t;
    n->out = e.t;
    n->param[0] = cls;
    n->rows = mul(B, N, s);
    n->n = dim;
    n->fwd_flops = (double)T(B, e.t)->elems;
    n->bwd_flops = n->fwd_flops;
    return e;
}

/* ViT's embeddings: projection (conv, kernel = stride = patch) -> flatten(2).transpose(1, 2), a
 * view (b, patches, dim) -> torch.cat with the expanded class token (a new tensor; the dtype
 * promotes: fp32 under autocast, the token being fp32) -> + position_embeddings (1, seq, dim):
 * a new tensor.  Nothing is saved besides the conv's input (and its weight copy).  From here on
 * the sequence is patches + 1. */
struct val lower_patch_embedding(struct bld *B, struct val x, const struct mp_layer *l)
{
    if (failed(B))
        return x;
    uint64_t p = l->conv.kernel;
    if (x.rank != 4 || p == 0 || x.shape[2] % p || x.shape[3] % p) {
        fail_model(B, MP_ERR_MODEL, "patch %llu must divide the image's height and width (input.shape [C, H, W])",
                   (unsigned long long)p);
        return x;
    }
    struct val c = lower_conv(B, x, l->conv.in_ch, l->dim, p, p, 0, 1, true, "projection");
    if (failed(B))
        return c;
    uint64_t np = mul(B, c.shape[2], c.shape[3]), s = add(B, np, l->emb.cls_token ? 1 : 0);
    struct val e = c; /* (b, patches, dim): a view of the conv output */
    e.rank = 3;
    e.shape[1] = np;
    e.shape[2] = l->dim;
    if (l->emb.cls_token)
        e = lower_class_cat(B, e, "cls_token");
    B->s = s;
    struct mp_layer pos = *l;
    pos.vocab = s;
    struct mp_node *n;
    if (!l->vision)
        return lower_add_table(B, e, &pos, "position_embeddings", s, false, &n); /* an nn.Parameter */
    /* SigLIP: + position_embedding(position_ids), an nn.Embedding looked up with its registered
     * (1, patches) int64 buffer: the (1, patches, dim) rows a transient of the add, the ids saved */
    struct val y = lower_add_table(B, e, &pos, "position_embedding", s, true, &n);
    if (n) {
        tmp_one(B, n, false, MP_TR_OTHER, mul(B, mul(B, s, l->dim), mp_dtype_size(B->p->param_dtype)));
        save(n, id_buffer(B, "position_ids", s));
    }
    return y;
}
