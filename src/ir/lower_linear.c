/* lower_linear.c — Linear (quantized bases included) and its LoRA adapter (build.h). */
#include "build.h"

#include <stdio.h>

static struct val lower_lora(struct bld *B, struct val x, struct val base, uint64_t in_f, uint64_t out_f,
                             const char *name);

/* The model type whose module names the Linears being lowered carry (the vision tower's: SigLIP's,
 * Qwen2-VL's; Pixtral's, Llama 4's and Mllama's are named as the text model's: q_proj .. o_proj,
 * fc1, fc2, and llama4's peft default q_proj,v_proj takes the tower's too). */
static const char *names_type(const struct bld *B)
{
    if (!B->vision || B->m->vision.kind == MP_VIS_PIXTRAL || B->m->vision.kind == MP_VIS_LLAMA4 ||
        B->m->vision.kind == MP_VIS_MLLAMA)
        return B->m->hf_type;
    return MP_VIS_IS_QWEN(B->m->vision.kind) ? "qwen2_vl_vision" : "siglip_vision_model";
}

/* The base storage of a Linear that is not the output layer: quantized (QLoRA, or the
 * checkpoint's quantization_config), else NULL. */
const struct mp_quant *base_quant(struct bld *B, bool head)
{
    if (B->in_adapter || head)
        return NULL;
    if (B->m->quant.kind != MP_Q_NONE)
        return &B->m->quant;
    if (B->p->opts.ft.mode == MP_FT_QLORA)
        return &B->p->opts.ft.quant;
    return NULL;
}

/* nn.Linear: saves its (cast) input and, under autocast, a half copy of W.
 * tied >= 0 uses that parameter as W (an lm_head tied to the embedding).
 * A quantized base (bitsandbytes Linear4bit, GPTQ, AWQ) keeps packed storage and
 * dequantizes W (out x in, compute dtype) into a temporary in forward and again in
 * backward (bitsandbytes MatMul4Bit saves only the packed weight, docs/memory-facts.md#qlora);
 * autocast makes no weight copy of it.  bitsandbytes' Linear4bit.forward casts x to the
 * compute dtype itself and its result back to x's dtype (an fp32 result under autocast
 * when x is fp32, as after prepare_model_for_kbit_training); peft's LoRA Linear4bit clones
 * that result before adding the adapter.  A LoRA target gets its adapter after. */
struct val lower_linear_p(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, bool bias,
                          const char *name, int tied)
{
    if (!width_ok(B, x, in_f, "in_features", name))
        return x;
    bool head = B->layer && (B->layer->type == MP_LT_LM_HEAD || B->layer->type == MP_LT_CLASSIFIER);
    const struct mp_quant *qz = tied < 0 && !B->no_lora ? base_quant(B, head) : NULL; /* bnb replaces nn.Linear only */
    char cname[64];
    snprintf(cname, sizeof cname, "%s.cast", name);
    struct val xin = autocast_in(B, x, cname);
    enum mp_dtype odt = B->amp ? B->p->compute_dtype : dt_of(B, xin);
    int w = tied >= 0 ? tied : new_param(B, name[0] ? name : "weight", out_f, in_f, true);
    char pn[80];
    snprintf(pn, sizeof pn, "%s.bias", name);
    int bp = bias ? new_param(B, pn, 1, out_f, false) : -1;
    if (tied < 0 && w >= 0) {
        snprintf(pn, sizeof pn, "%s.weight", name);
        B->p->params[w].name = name_of(B, pn);
    }
    if (qz && w >= 0) {
        struct mp_param *q = &B->p->params[w];
        q->dtype = MP_DT_U8;
        q->trainable = false;
        q->raw_bytes = mp_quant_weight_bytes(qz, out_f, in_f);
        q->bytes = mp_quant_alloc_bytes(qz, out_f, in_f);
        if (!q->bytes)
            overflow(B);
    }
    struct val y = with_last(B, name, xin, out_f, odt, true);
    bool amp = B->amp;
    if (qz)
        B->amp = false; /* no autocast weight copy of a packed weight */
    struct mp_node *n = matmul_node(B, MP_P_LINEAR, name, xin, y, w, bp);
    B->amp = amp;
    if (!n)
        return y;
    if (xin.t != x.t) /* autocast casts inside F.linear: the module's argument x lives until it returns */
        hold_to_last(B, x.t);
    n->rows = rows_of(xin);
    n->n = out_f;
    n->k = in_f;
    n->fwd_flops = 2.0 * (double)n->rows * (double)in_f * (double)out_f;
    n->bwd_flops = ng(B, xin) ? 2.0 * n->fwd_flops : n->fwd_flops;
    if (qz) {
        uint64_t dq = mp_quant_dequant_bytes(qz, out_f, in_f, mp_dtype_size(odt));
        if (!dq)
            overflow(B);
        n->quantized = true;
        tmp_one(B, n, false, MP_TR_DEQUANT, dq);
        tmp_one(B, n, true, MP_TR_DEQUANT, dq);
        /* dequantize: one pass over the weight in each direction */
        n->fwd_flops += 2.0 * (double)out_f * (double)in_f;
        n->bwd_flops += 2.0 * (double)out_f * (double)in_f;
    }
    /* a module peft keeps whole may not carry an adapter too: all-linear takes a token or QA
     * head (only SEQ_CLS leaves its head out), a named target may take a Linear inside one */
    if (saved_module(B) && !failed(B) &&
        (head ? B->p->opts.ft.all_linear && B->layer->head.pool != MP_POOL_FIRST && B->layer->head.pool != MP_POOL_LAST
              : mp_finetune_targets(&B->p->opts.ft, names_type(B), name, false)))
        fail_model(B, MP_ERR_USAGE, "--lora-targets takes %s, which peft keeps whole for the task head "
                                    "(modules_to_save) and cannot also adapt (peft 0.21): name the targets", name);
    bool bnb4 = qz && (qz->kind == MP_Q_BNB_NF4 || qz->kind == MP_Q_BNB_FP4);
    if (bnb4 && dt_of(B, y) != dt_of(B, x)) {
        snprintf(cname, sizeof cname, "%s.to_%s", name, mp_dtype_str(dt_of(B, x)));
        y = cast_to(B, y, dt_of(B, x), cname); /* .to(inp_dtype) */
    }
    if (!B->in_adapter && !B->no_lora && !B->p->opts.adapter_off && !head && tied < 0 &&
        mp_finetune_targets(&B->p->opts.ft, names_type(B), name, head)) {
        if (bnb4) {
            snprintf(cname, sizeof cname, "%s.clone", name);
            y = cast_to(B, y, dt_of(B, y), cname); /* peft lora.Linear4bit: result.clone() */
        }
        y = lower_lora(B, x, y, in_f, out_f, name);
    }
    return y;
}

struct val lower_linear(struct bld *B, struct val x, uint64_t in_f, uint64_t out_f, bool bias,
                        const char *name)
{
    return lower_linear_p(B, x, in_f, out_f, bias, name, -1);
}

/* peft LoRA Linear.forward (tuners/lora/layer.py): result = base(x); x = x.to(A's dtype);
 * result = result + lora_B(lora_A(dropout(x))) * scaling; result.to(base result dtype).
 * A (r x in) and B (out x r) are fp32 (autocast_adapter_dtype).  Autograd keeps what
 * each op's gradients need: lora_A its input (x, or dropout(x) and the mask), lora_B
 * A.x; the scaling multiply and the sums keep nothing.  Until the forward returns, its frame
 * holds the cast x (rebound, peft 0.21.2 tuners/lora/layer.py:1100) and the caller's call its
 * argument x (mp_node.locals). */
static struct val lower_lora(struct bld *B, struct val x, struct val base, uint64_t in_f, uint64_t out_f,
                             const char *name)
{
    const struct mp_finetune *ft = &B->p->opts.ft;
    char saved[96], nm[64];
    with_prefix(B, B->prefix, name, saved);
    B->in_adapter = true;
    struct val xc = x; /* x = self._cast_input_dtype(x, lora_A.weight.dtype) */
    enum mp_dtype adt = mp_finetune_adapter_dtype(ft, B->p->param_dtype);
    if (dt_of(B, x) != adt)
        xc = lower_copy(B, x, adt, 0, "lora_cast");
    struct val xa = ft->dropout > 0 ? lower_dropout(B, xc, ft->dropout, "lora_dropout") : xc;
    struct val a = lower_linear_p(B, xa, in_f, ft->r, false, "lora_A", -1);
    struct val bo = lower_linear_p(B, a, ft->r, out_f, false, "lora_B", -1);
    B->in_adapter = false;
    if (!failed(B))
        B->p->adapter_params = add(B, B->p->adapter_params, mul(B, ft->r, add(B, in_f, out_f)));
    struct val sc = lower_copy(B, bo, dt_of(B, bo), ft->alpha / (double)ft->r, "lora_scale");
    struct val sum = lower_add(B, base, sc, "lora_add");
    if (!failed(B) && dt_of(B, sum) != dt_of(B, base)) {
        snprintf(nm, sizeof nm, "lora_to_%s", mp_dtype_str(dt_of(B, base)));
        sum = lower_copy(B, sum, dt_of(B, base), 0, nm);
    }
    hold_to_last(B, x.t);
    hold_to_last(B, xc.t);
    restore_prefix(B, saved);
    return sum;
}
