/* frozen.c — frozen parameters: what autograd records when only some parameters train (build.h). */
#include "build.h"

#include <stdio.h>
#include <string.h>

/* ---- frozen parameters: what autograd records ------------------------------------------------ */

const struct mp_quant *mp_program_base_quant(const struct mp_program *p)
{
    if (p->model->quant.kind != MP_Q_NONE)
        return &p->model->quant;
    return p->opts.ft.mode == MP_FT_QLORA ? &p->opts.ft.quant : NULL;
}

uint64_t mp_param_grad_bytes(const struct mp_param *q)
{
    return q->trainable ? q->elems * mp_dtype_size(q->dtype) : 0;
}

static bool param_trains(const struct mp_program *p, int q) { return q >= 0 && p->params[q].trainable; }

/* Sets an RMSNorm's backward transient (its one part) to bytes (at most the 20 N bytes it was
 * lowered within: no overflow). */
static void rmsnorm_tmp_set(struct mp_node *n, uint64_t bytes)
{
    if (n->n_bwd_tmp != 1)
        return;
    n->bwd_tmp[0].bytes = bytes;
    n->bwd_tmp_bytes = bytes;
}

/* With frozen parameters, autograd records an op only if an input requires grad or it
 * has a trainable parameter, and a recorded op saves only what the gradients it must
 * compute need (torch derivatives.yaml, checked with saved_tensors_hooks in
 * bench/accuracy/peft_step.py):
 *  - linear (mm/addmm): x is saved for the weight gradient, W (its autocast copy) for
 *    the input gradient;
 *  - mul: each factor is saved for the other's gradient;
 *  - HF RMSNorm: weight * normed saves normed only for the weight's gradient; x and
 *    rsqrt only when x needs a gradient;
 *  - layer_norm, attention, softmax, activations, dropout: saved whenever recorded.
 * enable_input_require_grads (ft.input_grad) makes the embedding output a leaf that
 * requires grad; its AccumulateGrad node holds it until the backward ends.  It hooks the input
 * embeddings of every PreTrainedModel inside the model (transformers 5.24 modeling_utils.py:2160):
 * with images (--images) also the vision tower's, SiglipVisionModel.get_input_embeddings, the
 * patch Conv2d, whose output is then such a leaf (Llama4VisionModel's: the unfold convolution,
 * its bias-free Linear's output). */
void apply_requires_grad(struct mp_program *p)
{
    for (size_t i = 0; i < p->n_tensors; i++)
        p->tensors[i].needs_grad = false;
    for (size_t k = 0; k < p->n_nodes; k++) {
        struct mp_node *n = &p->nodes[k];
        bool ing[3] = {false, false, false}, any_in = false;
        for (int j = 0; j < 3; j++)
            if (n->in[j] >= 0 && p->tensors[n->in[j]].needs_grad)
                ing[j] = any_in = true;
        bool wt = param_trains(p, n->param[0]), pt = wt || param_trains(p, n->param[1]);
        bool leaf = (n->prim == MP_P_EMBED || ((n->prim == MP_P_CONV2D || n->prim == MP_P_LINEAR) && n->layer->vision &&
                                               n->layer->type == MP_LT_PATCH_EMBEDDING)) &&
                    p->opts.ft.input_grad && !pt;
        bool rec = any_in || pt;
        if (n->out >= 0)
            p->tensors[n->out].needs_grad = p->tensors[n->out].needs_grad || rec || leaf;
        if (leaf) {
            n->n_saved = 0;
            n->grad_in = false;
            n->bwd_flops = 0;
            n->bwd_tmp_bytes = 0;
            n->n_bwd_tmp = 0;
            save(n, n->out);
            continue;
        }
        if (!rec) {
            n->no_grad = true;
            n->wcopy = -1; /* a frozen weight: autocast does not cache its copy */
            n->n_saved = 0;
            n->grad_in = false;
            n->bwd_flops = 0;
            n->bwd_tmp_bytes = 0;
            n->n_bwd_tmp = 0;
            continue;
        }
        switch (n->prim) {
        case MP_P_LINEAR: {
            double f = 2.0 * (double)n->rows * (double)n->k * (double)n->n;
            double dq = n->quantized ? 2.0 * (double)n->k * (double)n->n : 0;
            if (!wt) {
                /* (DeepSpeed 0.19.8 runtime/zero/linear.py:97-103 LinearFunctionForZeroStage3.
                 * setup_context saves input, weight and bias whatever needs_input_grad says; the
                 * ZeRO-3 Init patches torch.nn.functional.linear with it, partition_parameters.py:
                 * 411-419, memory_efficient_linear; bitsandbytes' 4-bit matmul is not F.linear;
                 * measured: bench/accuracy/grpo_zero3_results.md) */
                if (!p->opts.zero3_linear || n->quantized)
                    unsave(n, n->in[0]);
                n->wcopy = -1; /* autocast caches copies of leaves that require grad only */
            }
            if (!ing[0])
                for (int j = 0; j < n->n_extra; j++)
                    unsave(n, n->extra[j]); /* the autocast weight copy */
            n->bwd_flops = (wt ? f : 0) + (ing[0] ? f + dq : 0);
            if ((!wt && !n->quantized) || (n->quantized && !ing[0])) {
                n->bwd_tmp_bytes = 0; /* no half weight gradient to copy into .grad / no dequantized W */
                n->n_bwd_tmp = 0;
            }
            break;
        }
        case MP_P_GROUPED_MM:
            if (!wt) {
                unsave(n, n->in[0]); /* x is kept for the experts' weight gradient only */
                n->wcopy = -1;       /* autocast caches copies of leaves that require grad only */
                if (n->n_bwd_tmp == 1 && n->bwd_tmp[0].role == MP_TR_WGRAD_HALF) {
                    n->bwd_tmp_bytes = 0; /* no half weight gradient to copy into .grad */
                    n->n_bwd_tmp = 0;
                }
            }
            break;
        case MP_P_MUL:
            if (!ing[1])
                unsave(n, n->in[0]);
            if (!ing[0])
                unsave(n, n->in[1]);
            break;
        case MP_P_RMSNORM:
            /* its backward transient (lower_norm.c rmsnorm_bwd_tmp) counted the normed tensor as
             * held at PowBackward0's moment: unsaved, torch's moment is that much above the rest */
            if (!wt && n->n_extra > 0) {
                unsave(n, n->extra[n->n_extra - 1]); /* normed */
                rmsnorm_tmp_set(n, n->bwd_tmp_bytes + p->tensors[n->extra[n->n_extra - 1]].bytes);
            }
            /* no input gradient: no fp32 chain, only MulBackward0's weight gradient, (b, s, h) in
             * the output's dtype before the engine sums it to (h) */
            if (!ing[0] && wt)
                rmsnorm_tmp_set(n, p->tensors[n->out].bytes);
            if (!ing[0]) {
                unsave(n, n->in[0]);
                for (int j = 0; j + 1 < n->n_extra; j++)
                    unsave(n, n->extra[j]); /* x in fp32, rsqrt */
            }
            break;
        default: break;
        }
    }
}

/* Gradient parts follow their whole tensor (apply_requires_grad sets needs_grad on node outputs). */
void parts_need_grad(struct mp_program *p)
{
    for (size_t k = 0; k < p->n_nodes; k++)
        for (int j = 0; j < 2; j++)
            if (p->nodes[k].out_parts[j] >= 0 && p->nodes[k].out >= 0)
                p->tensors[p->nodes[k].out_parts[j]].needs_grad = p->tensors[p->nodes[k].out].needs_grad;
}

/* LoRA on an MoE model where peft 0.21 would adapt what memplan does not lower as Linears: all-linear
 * (finetune.c's per-family list: routers and fused experts), or, for the families measured so
 * (DeepSeek-V3; not Qwen2-MoE, whose MLP names stay plain Linears), the MLP names that peft's MoE
 * mapping sends to the experts' 3-D parameters.  NULL: modelled (named attention targets equal
 * peft's count, bench/accuracy/peft_step.py). */
const char *mp_moe_lora_unmodelled(const struct mp_model *m, const struct mp_finetune *f)
{
    /* PhiMoE: PhimoeTopKRouter is an nn.Linear subclass whose forward returns a tuple; peft wraps
     * it (all-linear, or a name matching "router") and its LoRA forward then fails ('tuple' object
     * has no attribute 'dtype': peft 0.21 on transformers 5.24, run on the CPU) */
    bool router = f->all_linear || ((f->mode == MP_FT_LORA || f->mode == MP_FT_QLORA) && !f->n_targets &&
                                    !mp_finetune_default_targets(m->hf_type));
    for (size_t t = 0; t < f->n_targets; t++)
        router |= !strcmp(f->targets[t], "router");
    bool llama4 = !strcmp(m->hf_type, "llama4_text") || !strcmp(m->hf_type, "llama4");
    if (!strcmp(m->hf_type, "phimoe") && router && (f->mode == MP_FT_LORA || f->mode == MP_FT_QLORA))
        return "peft wraps PhiMoE's router (PhimoeTopKRouter, an nn.Linear returning a tuple) and its LoRA forward "
               "fails";
    /* Llama 4: Llama4Router is the same (peft 0.21 on transformers 5.24, run on the CPU); peft has no
     * default targets for llama4_text (all-linear stands in); the MLP names are plain Linears (the
     * shared expert's, the dense layers'): peft adapts those alone, as memplan does */
    if (llama4 && router && !f->all_linear && !f->n_targets && (f->mode == MP_FT_LORA || f->mode == MP_FT_QLORA))
        return "peft 0.21 has no default LoRA targets for llama4_text (get_peft_model raises), and all-linear wraps "
               "Llama 4's router (Llama4Router, an nn.Linear returning a tuple), whose LoRA forward fails";
    if (llama4 && router && (f->mode == MP_FT_LORA || f->mode == MP_FT_QLORA))
        return "peft wraps Llama 4's router (Llama4Router, an nn.Linear returning a tuple) and its LoRA forward "
               "fails";
    if (mp_finetune_all_linear_unmodelled(f, m->hf_type))
        return "peft's all-linear also adapts the MoE routers and the experts' 3-D parameters";
    bool moe = false;
    for (size_t i = 0; i < m->n_blocks && !moe; i++)
        for (size_t j = 0; j < m->blocks[i].n_layers; j++)
            moe |= m->blocks[i].layers[j].moe.experts > 0;
    if (moe && !m->hf_type[0] && !f->n_targets) /* memplan JSON: no family, so all-linear */
        return "peft's all-linear also adapts the MoE routers and the experts' 3-D parameters";
    if (!moe || !strcmp(m->hf_type, "qwen2_moe") || llama4)
        return NULL;
    static const char *const mlp[] = {"gate_proj", "up_proj", "down_proj", "gate_up_proj", "gate", "experts"};
    for (size_t t = 0; t < f->n_targets; t++)
        for (size_t k = 0; k < sizeof mlp / sizeof mlp[0]; k++)
            if (!strcmp(f->targets[t], mlp[k]))
                return "peft maps the MLP names (gate_proj, up_proj, down_proj) to the experts' 3-D parameters";
    return NULL;
}

/* A multimodal checkpoint's vision tower and projector in a text-only step (model.h struct
 * mp_idle): one resident parameter in the model's dtype that no op reads, trainable in full
 * fine-tuning (requires_grad, but .grad stays None: no gradient, no optimizer state) and frozen
 * otherwise; and the LoRA adapters peft puts on its Linears that the targets name (fp32 A and B,
 * r x in and out x r each; requires_grad, unused: no gradient either).  Lowered first in the
 * embedding block (block 0).  A quantized base quantizes the tower's Linears too: transformers
 * 5.24's bitsandbytes quantizer converts every nn.Linear that get_keys_to_not_convert (the tied
 * and output embeddings, the last parameter's module) and the class's _keep_in_fp32_modules do not
 * name (quantizers/base.py:39-63, quantizer_bnb_4bit.py:121), which on gemma3, qwen2_vl,
 * qwen2_5_vl, mistral3 and mllama is every Linear of the tower and projector (and Mllama's idle
 * cross-attention layers) (bench/accuracy/peft_step.py
 * qlora-bytes): each is packed storage as the language model's (lower_linear_p), the rest (norms,
 * the patch convolution, position embeddings, biases, Gemma 3's projection Parameter) stays in
 * the model's dtype. */
void lower_idle(struct bld *B)
{
    const struct mp_idle *v = &B->m->idle;
    const struct mp_finetune *ft = &B->p->opts.ft;
    if (!v->params || failed(B))
        return;
    const struct mp_quant *qz = mp_program_base_quant(B->p);
    uint64_t rest = v->params;
    for (size_t i = 0; qz && i < v->n_linears; i++) {
        uint64_t w = mul(B, mul(B, v->linears[i].in, v->linears[i].out), v->linears[i].count);
        if (w > rest) {
            overflow(B);
            return;
        }
        rest -= w;
    }
    bool was = B->trained;
    B->trained = false;
    int q = new_param(B, v->what, 1, rest, false);
    if (q >= 0)
        B->p->params[q].idle = ft->mode == MP_FT_FULL;
    for (size_t i = 0; qz && i < v->n_linears && !failed(B); i++) {
        const struct mp_idle_linear *l = &v->linears[i];
        char name[64];
        snprintf(name, sizeof name, "%s.weight", l->name);
        int w = new_param(B, name, mul(B, l->count, l->out), l->in, true);
        if (w < 0)
            break;
        struct mp_param *pw = &B->p->params[w];
        pw->dtype = MP_DT_U8;
        pw->trainable = false;
        pw->raw_bytes = mul(B, l->count, mp_quant_weight_bytes(qz, l->out, l->in));
        pw->bytes = mul(B, l->count, mp_quant_alloc_bytes(qz, l->out, l->in));
        if (!pw->bytes)
            overflow(B);
    }
    for (size_t i = 0; i < v->n_linears && !failed(B); i++) {
        const struct mp_idle_linear *l = &v->linears[i];
        if (!mp_finetune_targets_module(ft, B->m->hf_type, l->name))
            continue;
        char name[64];
        snprintf(name, sizeof name, "%s.lora", l->name);
        B->in_adapter = true;
        int a = new_param(B, name, mul(B, l->count, ft->r), add(B, l->in, l->out), false);
        B->in_adapter = false;
        if (a < 0)
            continue;
        B->p->params[a].trainable = false;
        B->p->params[a].idle = true;
        B->p->adapter_params = add(B, B->p->adapter_params, B->p->params[a].elems);
    }
    B->trained = was;
}
