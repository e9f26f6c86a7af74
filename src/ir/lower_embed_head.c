/* lower_embed_head.c — position tables, the loss and the heads' logits (soft-capping, first position,
 * pooling) (build.h). */
#include "build.h"

#include <math.h>
#include <stdio.h>

static struct val lower_fused_loss(struct bld *B, struct val x, const struct mp_layer *l, const char *nm);
static struct val lower_orpo_loss(struct bld *B, struct val logits, const struct mp_layer *l, const char *nm);
static struct val lower_lf_dpo_loss(struct bld *B, struct val logits, const struct mp_layer *l, const char *nm);

/* Cross-entropy as PyTorch runs it: an fp32 upcast of half logits, log_softmax, nll_loss.
 * upcast: HF's causal-LM loss (ForCausalLMLoss) and token classification call
 * logits.float() whatever the precision; a plain nn.CrossEntropyLoss (HF *ForMaskedLM,
 * pooled classification heads, images) is upcast only by autocast (cross_entropy is on the
 * CUDA fp32 list), so in pure bf16 its log-probs are bf16.  shift: HF causal LMs shift the
 * labels into a new int64 tensor; the others read the labels as they are.
 * The order matters for the peak: backward runs NllLossBackward (the dense M*V gradient of
 * the log-probs; frees the labels and total_weight), LogSoftmaxBackward (the gradient of
 * the fp32 logits; frees the log-probs), and only then ToCopyBackward0 makes the half
 * gradient of the logits (M*V*2) and frees the fp32 one.  In the forward the half logits
 * stay alive (the model's local) while the log-probs are made.
 * One label per logits row: the labels shrink to one per sample for pooled heads. */
struct val lower_loss(struct bld *B, struct val logits, const char *name, bool upcast, bool shift)
{
    if (failed(B))
        return logits;
    uint64_t M = rows_of(logits), V = last_dim(logits);
    struct mp_tensor *lt = B->p->labels >= 0 ? T(B, B->p->labels) : NULL;
    if (lt && lt->elems != M) {
        lt->rank = 1;
        lt->shape[0] = lt->elems = M;
        lt->bytes = mul(B, M, mp_dtype_size(lt->dtype));
    }
    char en[96];
    struct val z = logits;
    int half_logits = -1;
    if (dt_of(B, logits) != MP_DT_F32 && (upcast || B->amp)) {
        snprintf(en, sizeof en, "%s.upcast", name);
        z = cast_to(B, logits, MP_DT_F32, en);
        half_logits = logits.t;
    }
    snprintf(en, sizeof en, "%s.log_softmax", name);
    struct val lp = like(B, en, z, dt_of(B, z), ng(B, z));
    struct mp_node *ls = new_node(B, MP_P_LOG_SOFTMAX, en);
    if (!ls)
        return lp;
    ls->in[0] = z.t;
    ls->out = lp.t;
    ls->keep = half_logits;
    save(ls, lp.t);
    ls->rows = M;
    ls->n = V;
    uint64_t mv = mul(B, M, V);
    ls->fwd_flops = 4.0 * (double)mv;
    ls->bwd_flops = 3.0 * (double)mv;

    uint64_t shape[1] = {1};
    struct val y = new_val(B, name, MP_DT_F32, 1, shape, true); /* bf16 in torch for bf16 log-probs: 512 B either way */
    struct mp_node *n = new_node(B, MP_P_NLL_LOSS, name);
    if (!n)
        return y;
    n->in[0] = lp.t;
    n->in[1] = B->p->labels;
    n->out = y.t;
    save(n, lp.t);
    /* nll_loss saves its target and total_weight (the bench/accuracy/torch_saved.md measurements) */
    if (shift) {
        snprintf(en, sizeof en, "%s.shift_labels", name);
        extra_as(n, new_flat(B, en, MP_DT_I64, M), MP_XR_SHIFT_LABELS);
    }
    snprintf(en, sizeof en, "%s.total_weight", name);
    extra_as(n, new_flat(B, en, dt_of(B, lp), 1), MP_XR_TOTAL_WEIGHT);
    n->rows = M;
    n->n = V;
    n->fwd_flops = (double)M;
    n->bwd_flops = (double)mv; /* zero-filled M*V gradient, one scatter per row */
    B->p->explicit_loss = true;
    return y;
}

/* out = x + rows of a learned table (ADD_POS): k == seq uses row = position
 * (learned positions), k == 1 row 0 everywhere (BERT's all-zero token types); embedding: the
 * table is an nn.Embedding (ViT's position table is an nn.Parameter). */
struct val lower_add_table(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, uint64_t k,
                           bool embedding, struct mp_node **node)
{
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", nm);
    int w = new_param(B, pn, l->vocab, l->dim, false);
    if (w >= 0)
        B->p->params[w].embedding = embedding;
    struct val y = like(B, nm, x, promote(dt_of(B, x), B->p->param_dtype), true);
    struct mp_node *n = new_node(B, MP_P_ADD_POS, nm);
    *node = n;
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    n->rows = rows_of(x);
    n->n = l->dim;
    n->seq = B->s;
    n->k = k;
    n->fwd_flops = (double)T(B, y.t)->elems;
    return y;
}

/* Gemma2's final softcapping: logits / cap (a transient), tanh (saves its output), * cap (a new
 * tensor, what the loss reads). */
struct val softcap_logits(struct bld *B, struct val z, const char *name)
{
    char an[80];
    snprintf(an, sizeof an, "%s.softcap_tanh", name);
    struct val t = lower_act(B, z, MP_ACT_TANH, false, an);
    if (failed(B))
        return t;
    tmp_one(B, &B->p->nodes[B->p->n_nodes - 1], false, MP_TR_OTHER, T(B, z.t)->bytes); /* the divided logits */
    snprintf(an, sizeof an, "%s.softcap_scale", name);
    return lower_copy(B, t, dt_of(B, t), 1.0, an);
}

/* x[:, 0]: a view of the first position (BERT's pooler); a linear on it saves the view,
 * which keeps x's storage, or under autocast its half copy. */
struct val first_position(struct bld *B, struct val x, const char *name)
{
    if (failed(B) || x.rank != 3)
        return x;
    struct val y = x;
    y.rank = 2;
    y.shape[1] = x.shape[2];
    char vn[80];
    snprintf(vn, sizeof vn, "%s.first_position", name);
    struct mp_node *n = new_node(B, MP_P_VIEW, vn);
    if (n) {
        n->in[0] = n->out = x.t;
        n->rows = y.shape[0];
        n->n = y.shape[1];
    }
    return y;
}

/* A classifier's logits (b, s, classes) as its loss reads them: MP_POOL_LAST gathers each
 * sample's last position (logits[arange(b), last]: a new (b, classes) tensor; backward keeps
 * the two int64 index vectors); MP_POOL_SPAN copies the start and end logits out of the
 * (b, s, 2) output (split, squeeze, contiguous), each a cross-entropy over positions. */
struct val pool_logits(struct bld *B, struct val z, const struct mp_layer *l, const char *name)
{
    if (failed(B) || z.rank != 3 || (l->head.pool != MP_POOL_LAST && l->head.pool != MP_POOL_SPAN))
        return z;
    bool span = l->head.pool == MP_POOL_SPAN;
    uint64_t shape[2] = {span ? mul(B, 2, z.shape[0]) : z.shape[0], span ? z.shape[1] : z.shape[2]};
    char cn[80];
    snprintf(cn, sizeof cn, "%s.%s", name, span ? "start_end" : "pooled");
    struct val y = new_val(B, cn, dt_of(B, z), 2, shape, true);
    struct mp_node *n = new_node(B, MP_P_CAST, cn);
    if (!n)
        return y;
    n->in[0] = z.t;
    n->out = y.t;
    n->rows = shape[0];
    n->n = shape[1];
    if (!span) {
        char en[96];
        snprintf(en, sizeof en, "%s.index", cn);
        extra_as(n, new_flat(B, en, MP_DT_I64, mul(B, 2, z.shape[0])), MP_XR_GATHER_INDEX);
    }
    return y;
}

/* A token embedding (T5's decoder input, BERT's token types added to hidden states): the
 * residual stream starts at its output (*resid). */
struct val lower_embedding(struct bld *B, struct val x, const struct mp_layer *l, const char *nm, struct val *resid)
{
    if (failed(B))
        return x;
    if (l->emb.dec_input) {
        struct val y = lower_t5_decoder_embed(B, x, l, nm);
        *resid = y;
        return y;
    }
    if (x.t >= 0 && T(B, x.t)->dtype != MP_DT_I64 && B->embed_param >= 0 && last_dim(x) == l->dim) {
        /* A second embedding applied to hidden states: BERT's token-type table looked up
         * with all-zero type ids and added (row 0 broadcast). */
        struct mp_node *n;
        struct val y = lower_add_table(B, x, l, nm, 1, true, &n);
        if (n)
            tmp_one(B, n, false, MP_TR_OTHER, T(B, y.t)->bytes); /* the looked-up (b,s,h) rows */
        if (l->emb.id_buffer && n) { /* BertEmbeddings' all-zero token_type_ids buffer, its view saved */
            char en[112];
            snprintf(en, sizeof en, "%s.ids", nm);
            save(n, id_buffer(B, en, l->emb.id_rows));
        }
        *resid = y;
        return y;
    }
    if (T(B, x.t)->dtype != MP_DT_I64) {
        fail_model(B, MP_ERR_MODEL, "an embedding needs token ids as its input (input.tokens)");
        return x;
    }
    char pn[80];
    snprintf(pn, sizeof pn, "%s.weight", nm);
    int w = new_param(B, pn, l->vocab, l->dim, false);
    if (w >= 0)
        B->p->params[w].embedding = true;
    if (B->embed_param < 0)
        B->embed_param = w;
    uint64_t shape[3] = {B->b, B->s, l->dim};
    struct val y = new_val(B, nm, B->p->param_dtype, 3, shape, true);
    struct mp_node *n = new_node(B, MP_P_EMBED, nm);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->out = y.t;
    n->param[0] = w;
    save(n, x.t);
    n->rows = mul(B, B->b, B->s);
    n->n = l->dim;
    n->k = l->vocab;
    n->fwd_flops = (double)T(B, y.t)->elems;
    n->bwd_flops = n->fwd_flops;
    if (l->emb.scale_buffer) /* Gemma: embed_scale, a registered fp32 scalar */
        id_buffer(B, "embed_scale", 0);
    struct val r = lower_dropout(B, mult_copy(B, y, l, "embed_scale"), l->emb.dropout, "dropout");
    *resid = r;
    return r;
}

/* Learned positions added to x; the residual stream starts at the sum (*resid). */
struct val lower_pos_embedding(struct bld *B, struct val x, const struct mp_layer *l, const char *nm,
                               struct val *resid)
{
    if (failed(B))
        return x;
    if (B->s > l->vocab) {
        fail_model(B, MP_ERR_MODEL, "sequence %llu exceeds the %llu learned positions",
                   (unsigned long long)B->s, (unsigned long long)l->vocab);
        return x;
    }
    if (!width_ok(B, x, l->dim, "dim", ""))
        return x;
    struct mp_node *n;
    struct val y = lower_add_table(B, x, l, nm, B->s, true, &n);
    if (!n)
        return y;
    char en[112];
    snprintf(en, sizeof en, "%s.position_ids", nm); /* int64, saved by the position lookup */
    int ids = l->emb.id_buffer ? id_buffer(B, en, l->emb.id_rows) : -1;
    if (l->emb.id_view) /* BertEmbeddings: the lookup saves a view of the registered buffer */
        save(n, ids);
    else
        extra_as(n, new_flat(B, en, MP_DT_I64, B->s), MP_XR_POSITION_IDS);
    *resid = y;
    return y;
}

/* A head tied to the embedding table: two or more gradients reach the table's AccumulateGrad.  The
 * engine keeps the head's (the replay's .grad, made at the head) until a lookup's backward has made
 * its dense V x h gradient, then sums them (torch/csrc/autograd/input_buffer.cpp accumulate): in
 * place when the buffered one is a fresh dense tensor with one reference, else out of place, one
 * table more.  The head's is a transposed view of mm's result (TBackward0), so the first sum is out
 * of place, unless the table reaches the head through autocast's cast (amp with a table outside the
 * compute dtype: ToCopyBackward0 hands on a fresh fp32 tensor; Cut Cross-Entropy's dC, zeros_like
 * in its backward, and torchtune's sum of its chunks' gradients likewise: fresh_head);
 * a later lookup (T5's encoder, after its decoder) meets that fresh sum, in place.  Measured with
 * plain PyTorch (torch.profiler: aten::add against aten::add_) and under InplaceTracker
 * (docs/memory-facts.md#tied-head-sums):
 * bench/accuracy/tied_sum_survey.md. */
static void tied_grads(struct bld *B, bool fresh_head)
{
    if (failed(B))
        return;
    struct mp_param *q = &B->p->params[B->embed_param];
    q->matmul = true;
    bool fresh = fresh_head || (B->amp && q->dtype != B->p->compute_dtype);
    uint64_t g = mp_param_grad_bytes(q);
    bool first = true; /* the lookup whose backward runs first: the last in forward order */
    for (size_t k = B->p->n_nodes; k-- > 0;)
        if (B->p->nodes[k].prim == MP_P_EMBED && B->p->nodes[k].param[0] == B->embed_param) {
            tmp_one(B, &B->p->nodes[k], true, MP_TR_OTHER, first && !fresh ? mul(B, g, 2) : g);
            first = false;
        }
}

/* The language-model head (tied to the embedding, or not) and its loss. */
struct val lower_lm_head(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (l->head.tied && B->embed_param < 0) {
        fail_model(B, MP_ERR_MODEL, "a tied lm_head needs an embedding earlier in the model");
        return x;
    }
    if (l->head.tied && !failed(B) &&
        (B->p->params[B->embed_param].rows != l->vocab || B->p->params[B->embed_param].cols != l->dim)) {
        fail_model(B, MP_ERR_MODEL, "tied: vocab x dim %llux%llu does not match the embedding %llux%llu",
                   (unsigned long long)l->vocab, (unsigned long long)l->dim,
                   (unsigned long long)B->p->params[B->embed_param].rows,
                   (unsigned long long)B->p->params[B->embed_param].cols);
        return x;
    }
    if (B->p->opts.loss != MP_LOSS_HF)
        return lower_fused_loss(B, x, l, nm);
    if (l->t5.on) /* T5: decoder_outputs[0] and the scaled sequence_output are locals of the forward */
        held_tensor(B, x.t, -1);
    if (l->head.in_mult != 0) { /* T5: sequence_output * d_model**-0.5, a new tensor (saves nothing) */
        x = lower_copy(B, x, dt_of(B, x), l->head.in_mult, "scale_decoder_outputs");
        if (l->t5.on)
            held_tensor(B, x.t, -1);
    }
    struct val logits = lower_linear_p(B, x, l->dim, l->vocab, l->bias, nm, l->head.tied ? B->embed_param : -1);
    if (l->head.tied)
        tied_grads(B, false);
    logits = mult_copy(B, logits, l, "logits_scaling");
    if (l->head.softcap > 0)
        logits = softcap_logits(B, logits, nm);
    if (B->p->opts.trainer == MP_TRAINER_ORPO) { /* the trainer's loss on the model's logits */
        /* under amp accelerate's prepare wraps the forward in convert_outputs_to_fp32 too (accelerate
         * 1.15 accelerator.py prepare_model, utils/operations.py ConvertOutputsToFp32): the half
         * logits become an fp32 copy as the model returns, and the loss runs on that */
        if (B->amp && dt_of(B, logits) != MP_DT_F32)
            logits = cast_to(B, logits, MP_DT_F32, "logits_fp32");
        return lower_orpo_loss(B, logits, l, nm);
    }
    if (B->p->opts.trainer == MP_TRAINER_DPO || B->p->opts.trainer == MP_TRAINER_KTO) {
        /* --loss hf: LLaMA-Factory's step on the model's logits; llamafactory 0.9.5
         * train/dpo/trainer.py:230, train/kto/trainer.py:179: `.logits.to(torch.float32)`, a copy of half
         * logits (under amp accelerate's convert_outputs_to_fp32 has made it already); the half
         * ones die with the model's output */
        if (dt_of(B, logits) != MP_DT_F32)
            logits = cast_to(B, logits, MP_DT_F32, "logits_fp32");
        return lower_lf_dpo_loss(B, logits, l, nm);
    }
    /* masked LMs call nn.CrossEntropyLoss on the logits (BertForMaskedLM & co.) */
    return lower_loss(B, logits, "loss", !l->head.masked, B->m->input == MP_INPUT_TOKENS && !l->head.masked);
}

/* A classifier head (pooled, or per token) and its loss. */
struct val lower_classifier(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    if (B->p->opts.loss != MP_LOSS_HF) {
        fail_model(B, MP_ERR_USAGE, "--loss %s: not modelled for a classifier head (only hf)",
                   mp_loss_str(B->p->opts.loss));
        return x;
    }
    /* HF's token classification upcasts (logits.float()); pooled heads and images do not.
     * MP_POOL_FIRST on a sequence: the first position (ViT's class token) */
    if (l->head.pool == MP_POOL_FIRST)
        x = first_position(B, x, nm);
    if (l->t5.on) /* T5: the stack's output is a local of the forward (outputs[0]) */
        held_tensor(B, x.t, -1);
    struct val logits = lower_linear(B, x, l->in_features, l->vocab, l->bias, nm);
    bool upcast = B->m->input == MP_INPUT_TOKENS && l->head.pool == MP_POOL_NONE && !l->head.masked; /* masked: a plain
                                                             nn.CrossEntropyLoss (T5ForTokenClassification) */
    return lower_loss(B, pool_logits(B, logits, l, nm), "loss", upcast, false);
}

/* ---- the chunked and fused loss heads (--loss; util/sets.h MP_LOSSES) ------------------------
 * Each replaces the lm_head Linear and lower_loss by one node (MP_P_FUSED_LOSS) whose bytes follow
 * the library's source op by op: what it keeps for backward (saved extras), the largest set of
 * transients of its forward (fwd_tmp) and of its backward (bwd_tmp).  The replay sees a node's
 * backward as one moment holding the weight's gradient, the input's gradient and bwd_tmp, so
 * bwd_tmp is the largest phase of the backward less those two (each phase is written out).
 * Sources: trl 1.16.0 (trainer/utils.py add_fused_lm_head, kernels/chunked_logprob.py),
 * liger-kernel 0.8.5 (ops/fused_linear_cross_entropy.py, transformers/model/loss_utils.py),
 * both on CUDA (their Triton kernels allocate nothing). */

uint64_t mp_loss_chunk_rows(enum mp_loss l, uint64_t rows, uint64_t v, uint64_t h)
{
    switch (l) {
    case MP_LOSS_HF:
        return rows;
    case MP_LOSS_CHUNKED_NLL:
        return mp_min_u64(rows, 4096); /* TOKEN_CHUNK_SIZE: tiles of 4096 tokens x 32768 vocabulary */
    case MP_LOSS_LIGER: {
        if (!rows || !h)
            return 0;
        uint64_t inc = mp_ceil_div(v, h), want = mp_ceil_div(rows, inc ? inc : 1), c = 1;
        while (c < want && c <= (UINT64_MAX >> 1))
            c <<= 1; /* triton.next_power_of_2 */
        return mp_min_u64(c, rows);
    }
    case MP_LOSS_TORCHTUNE: /* tensor_split(8): the largest chunk */
        return mp_ceil_div(rows, MP_TORCHTUNE_CHUNKS);
    case MP_LOSS_CCE: /* no chunks: Triton blocks, folded in registers */
        return 0;
    }
    return 0;
}

const char *mp_loss_precision_refused(enum mp_loss l, enum mp_precision p)
{
    bool f32w = p == MP_PREC_FP32 || p == MP_PREC_AMP_BF16 || p == MP_PREC_AMP_FP16;
    bool amp = p == MP_PREC_AMP_BF16 || p == MP_PREC_AMP_FP16 || p == MP_PREC_BF16_AMP;
    if (l == MP_LOSS_CCE && f32w) /* cce_backward.py:349-356 asserts bf16/fp16 e and c */
        return "Cut Cross-Entropy's backward takes bf16 or fp16 hidden states and weight only "
               "(Axolotl loads the model in bf16: --precision bf16-amp or bf16)";
    if (l == MP_LOSS_TORCHTUNE && amp) /* torchtune's recipes run no autocast */
        return "torchtune trains without autocast (its dtype: --precision bf16 or fp32)";
    return NULL;
}

/* Bytes, checked: a * b (* c). */
static uint64_t mul3(struct bld *B, uint64_t a, uint64_t b, uint64_t c) { return mul(B, mul(B, a, b), c); }

/* An extra of n the head keeps for backward (role r), of n_elems elements of dtype dt. */
static void kept(struct bld *B, struct mp_node *n, const char *nm, const char *part, enum mp_dtype dt,
                 uint64_t elems, enum mp_xrole r)
{
    char en[112];
    snprintf(en, sizeof en, "%s.%s", nm, part);
    int t = new_flat(B, en, dt, elems);
    extra_as(n, t, r);
    save(n, t);
}

/* The backward's transient beyond the gradients the replay makes for the node (the weight's,
 * grad_w, and the input's, grad_x): the largest phase less those, never below 0. */
static uint64_t beyond(uint64_t phase, uint64_t grad_w, uint64_t grad_x)
{
    uint64_t g = grad_w + grad_x;
    return phase > g ? phase - g : 0;
}

/* The label positions after the shift (b(s-1), *np) and how many carry a loss, N: the label
 * fraction's share of them (--label-fraction), or GRPO's completions. */
static uint64_t label_rows(struct bld *B, uint64_t *np)
{
    *np = B->s > 0 ? mul(B, B->b, B->s - 1) : 0;
    uint64_t N = (uint64_t)ceil(B->p->opts.label_fraction * (double)*np);
    if (B->p->opts.completion) /* GRPO: each row's completion (at most s - 1 positions) */
        N = mul(B, B->b, mp_min_u64(B->p->opts.completion, B->s > 0 ? B->s - 1 : 0));
    return N > *np ? *np : N;
}

/* TRL's fused LM head (trl 1.16.0, SFTTrainer's default loss, loss_type "nll"; CUDA path):
 * trainer/utils.py add_fused_lm_head._fused_forward slices the hidden states [:, :-1] (a view),
 * makes mask = labels[:, 1:] != -100 (:1627, bool, b(s-1)) and, on a Triton device (compact,
 * :1642), gathers the N rows whose label is kept: hidden_states[mask] (a new N x h tensor; its
 * IndexBackward0 saves the bool mask, torch derivatives.yaml index.Tensor) and labels[mask] (N
 * int64); each gather makes the mask's nonzero indices (N x 2 int64) as a transient.  kernels/chunked_logprob.py ChunkedLogProbFunction.forward:
 * seven fp32 statistics of N (:340-346), one tile buffer mm_buf of min(N, 4096) x 32768 in the
 * compute dtype (:347), and per tile the hidden rows .to(compute) (:352, a copy when the hidden
 * states are fp32) and weight[start:end].to(compute) (:356, a copy of 32768 rows when the weight
 * is fp32); after the tiles log_z, logprobs, entropy and is_top1 (:378-383); it saves hidden,
 * weight, targets, log_z and entropy (:386).  Back in _fused_forward each output is scattered
 * into a new b(s-1) tensor (:1658; MaskedScatterBackward0 keeps the mask).  Backward (:395-462):
 * the incoming gradient masked_select-ed (N fp32), grad_hidden N x h fp32 and grad_weight v x h
 * fp32 (:406-411), mm_buf again, per tile the hidden and weight copies, the gradient GEMMs added
 * in place (_addmm_fp32's CUDA addmm(out_dtype=fp32, out=acc), :60), then .to() the input's and
 * the weight's dtypes (:456-457, a new tensor when it is not fp32); IndexBackward0 makes the
 * b(s-1) x h gradient (index_put_ with the mask: its nonzero indices again), SliceBackward0 the
 * b x s x h one.  Every row is recomputed in backward:
 * nothing v-sized is kept. */
static void trl_nll(struct bld *B, struct mp_node *n, const char *nm, uint64_t h, uint64_t v, int w)
{
    struct mp_tensor *xt = T(B, n->in[0]);
    uint64_t hd = mp_dtype_size(xt->dtype);
    uint64_t cd = B->amp ? mp_dtype_size(B->p->compute_dtype) : hd;
    const struct mp_param *q = &B->p->params[w];
    uint64_t wd = mp_dtype_size(q->dtype);
    bool wt = q->trainable;
    uint64_t np, N = label_rows(B, &np);
    uint64_t rows = mp_loss_chunk_rows(MP_LOSS_CHUNKED_NLL, N, v, h);
    uint64_t vc = mp_min_u64(v, MP_TRL_VOCAB_CHUNK);
    uint64_t mm_buf = mul3(B, rows, MP_TRL_VOCAB_CHUNK, cd);
    uint64_t hc = hd != cd ? mul3(B, rows, h, cd) : 0; /* hidden[t0:t1].to(compute) */
    uint64_t wc = wd != cd ? mul3(B, vc, h, cd) : 0;   /* weight[v0:v1].to(compute) */
    /* `hidden_chunk = hidden[...].to()` and backward's `w_chunk = weight[...].to()` make the new
     * copy while the old one is still bound: two at once from the second token chunk / tile on
     * (forward's weight copy is a temporary of the mm call: one at a time) */
    uint64_t tok_chunks = rows ? mp_ceil_div(N, rows) : 0, tiles = tok_chunks * mp_ceil_div(v, MP_TRL_VOCAB_CHUNK);
    uint64_t f_copies = mp_max_u64(add(B, hc, wc), tok_chunks > 1 ? mul(B, hc, 2) : 0);
    uint64_t b_copies = mp_max_u64(add(B, hc, mul(B, wc, tiles > 1 ? 2 : 1)),
                                   tok_chunks > 1 ? add(B, mul(B, hc, 2), wc) : 0);
    n->rows = N;
    n->n = v;
    n->k = h;
    /* kept for backward */
    kept(B, n, nm, "label_mask", MP_DT_U8, np, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "hidden_rows", xt->dtype, mul(B, N, h), MP_XR_LOSS_SAVED);
    kept(B, n, nm, "targets", MP_DT_I64, N, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "log_z", MP_DT_F32, N, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "entropy", MP_DT_F32, N, MP_XR_LOSS_SAVED);
    /* forward: each gather's nonzero indices (N x 2 int64, 16N, a transient) before the function; in it the seven statistics
     * (28N) and mm_buf with, per tile, the copies or, after the tiles, logprobs and one N-sized
     * temporary (8N); then the three scattered b(s-1) outputs (fp32, fp32, bool) beside logprobs,
     * is_top1 (5N) and a zeros temporary (4 b(s-1)) */
    uint64_t gather = mul(B, N, 16);
    uint64_t in_fn = add(B, add(B, mul(B, N, 28), mm_buf), mp_max_u64(f_copies, mul(B, N, 8)));
    uint64_t scatter = add(B, mul(B, N, 5), mul(B, np, 13));
    tmp_one(B, n, false, MP_TR_OTHER, mp_max_u64(gather, mp_max_u64(in_fn, scatter)));
    /* backward phases: the function (the N-sized incoming gradient, the fp32 accumulators, mm_buf
     * and the tile copies or the final .to() copies), IndexBackward0, SliceBackward0 */
    uint64_t gw = wt ? mul3(B, v, h, wd) : 0; /* the weight's .grad (the replay's) */
    uint64_t gx = mul3(B, B->b, B->s, mul(B, h, hd));
    uint64_t acc = add(B, add(B, mul(B, N, 4), mul3(B, N, h, 4)), wt ? mul3(B, v, h, 4) : 0);
    uint64_t ends = add(B, hd != 4 ? mul3(B, N, h, hd) : 0, wt && wd != 4 ? gw : 0);
    uint64_t fn = add(B, add(B, acc, mm_buf), mp_max_u64(b_copies, ends));
    uint64_t sliced = mul3(B, np, h, hd);
    uint64_t index_bw = add(B, add(B, add(B, gw, mul3(B, N, h, hd)), sliced), mul(B, N, 16));
    uint64_t slice_bw = add(B, add(B, gw, sliced), gx);
    tmp_one(B, n, true, MP_TR_OTHER, beyond(mp_max_u64(fn, mp_max_u64(index_bw, slice_bw)), gw, gx));
    double mm = 2.0 * (double)N * (double)h * (double)v;
    n->fwd_flops = mm;
    n->bwd_flops = (wt ? 3.0 : 2.0) * mm; /* the tiles again, then dX (and dW) */
}

/* Liger's fused linear cross-entropy (liger-kernel 0.8.5; HF's use_liger_kernel path):
 * transformers/model/loss_utils.py LigerForCausalLMLoss pads the labels by one (:87, b(s+1)
 * int64), copies the shifted ones (:88, b s int64) and views the hidden states as BT x h (:91).
 * ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward: the chunk (:103-105),
 * grad_input zeros like the input (:108) and grad_weight zeros like the weight (:116) made in
 * the forward and saved for backward (:574-578), loss_1d BT fp32 (:125), target_mask BT bool
 * (:131).  Inside autograd.Function.forward grad mode is off, so _can_use_mm_out holds on CUDA
 * when input and weight share a dtype and autocast (if on) is that dtype: then one chunk x v
 * logits buffer (:150-154) and torch.mm(out=) into it and into grad_input (:164, :320).
 * Otherwise (amp with an fp32 residual stream) each chunk's logits are a new chunk x v tensor in
 * the autocast dtype (:168) from autocast copies of the chunk (chunk x h) and of the weight (v x
 * h: cached until the forward ends when the weight trains, else made again for each matmul), the
 * input gradient a chunk x h product copied into grad_input (:322), and the weight gradient's
 * addmm(out_dtype=fp32) a chunk x h copy of the input (:340); in fp32 the weight gradient is a
 * v x h product added to grad_weight (:375).  Backward scales both in place (:420, Triton
 * element_mul) and hands them on: no new gradient storage. */
static void liger(struct bld *B, struct mp_node *n, const char *nm, uint64_t h, uint64_t v, int w)
{
    struct mp_tensor *xt = T(B, n->in[0]);
    uint64_t hd = mp_dtype_size(xt->dtype);
    const struct mp_param *q = &B->p->params[w];
    bool wt = q->trainable;
    uint64_t bt = mul(B, B->b, B->s);
    uint64_t c = mp_loss_chunk_rows(MP_LOSS_LIGER, bt, v, h);
    bool mm_out = xt->dtype == q->dtype && (!B->amp || xt->dtype == B->p->compute_dtype);
    uint64_t cd = mm_out ? hd : mp_dtype_size(B->p->compute_dtype);
    n->rows = bt;
    n->n = v;
    n->k = h;
    n->fwd_grads = true;
    kept(B, n, nm, "grad_input", xt->dtype, mul(B, bt, h), MP_XR_LOSS_GRAD);
    if (wt)
        kept(B, n, nm, "grad_weight", q->dtype, mul(B, v, h), MP_XR_LOSS_GRAD);
    bool cached = !mm_out && wt; /* autocast caches the half copy of a leaf that requires grad */
    if (cached) {
        char wn[112];
        snprintf(wn, sizeof wn, "%s.weight_copy", nm);
        n->wcopy = new_flat(B, wn, B->p->compute_dtype, mul(B, v, h));
        extra_as(n, n->wcopy, MP_XR_WEIGHT_COPY);
    }
    /* the labels (padded, shifted), loss_1d and target_mask live through the chunks */
    uint64_t base = add(B, add(B, mul3(B, B->b, add(B, B->s, 1), 8), mul(B, bt, 8)), mul(B, bt, 5));
    uint64_t logits = mul3(B, c, v, cd);
    uint64_t step;
    if (mm_out) { /* the logits buffer; torch.mm(out=) everywhere; fp32: dW's v x h product */
        step = add(B, logits, hd == 4 && wt ? mul3(B, v, h, 4) : 0);
    } else {
        uint64_t wcopy = cached ? 0 : mul3(B, v, h, cd); /* the frozen weight's copy, per matmul */
        uint64_t xcopy = mul3(B, c, h, cd);             /* the chunk's autocast copy */
        uint64_t fwd_mm = add(B, add(B, logits, xcopy), wcopy);
        uint64_t dx = add(B, add(B, logits, wcopy), mul3(B, c, h, cd)); /* grad_logits @ W */
        uint64_t dw = wt ? add(B, logits, xcopy) : 0;                  /* input_chunk.to() */
        step = mp_max_u64(fwd_mm, mp_max_u64(dx, dw));
    }
    tmp_one(B, n, false, MP_TR_OTHER, add(B, base, step));
    double mm = 2.0 * (double)bt * (double)h * (double)v;
    n->fwd_flops = (wt ? 3.0 : 2.0) * mm; /* logits, dX (and dW) in the forward */
    n->bwd_flops = 0;
}

/* Cut Cross-Entropy as Axolotl 0.19 runs it (`cut_cross_entropy: true`: its fork
 * axolotl-ai-cloud/ml-cross-entropy, pinned at 4dfa522 by integrations/cut_cross_entropy/
 * __init__.py:38; read at 5f0c7a7, the newest snapshot reachable here; file:line below are the
 * fork's cut_cross_entropy/).  Axolotl calls cce_patch(model_type) with every default (__init__.py
 * :107-110; transformers/patch.py:164-174: impl "cce", reduction "mean", filter_eps "auto", no
 * fp32 accumulation, both gradients filtered).  The patched forward (transformers/llama.py:62-78)
 * hands the whole hidden states (hidden_states[:, slice(0, None), :] returns the tensor itself)
 * and lm_head.weight to apply_lce, which, with the Trainer's num_items_in_batch, makes the
 * reduction "sum" and divides after (utils.py:106-111, :162-163) and calls linear_cross_entropy
 * with shift=True (:152-160).  No logits are ever made: Triton kernels (Triton-only, CUDA) fold
 * blocks of them in registers.  cce.py cce_linear_cross_entropy: e and the targets .contiguous()
 * (:265-266: the same tensors), _build_flat_valids (utils.py:25-46): the shifted targets' != -100
 * mask (bool, b(s-1)), its nonzero() (N x 2 int64) .to(int32) (N x 2), scaled in place, and
 * .sum(1), the valid positions as N int64 (integer sums are int64); e.flatten (a view).
 * LinearCrossEntropyFunction.forward: with filter_eps set it asks for logit_avg (cce.py:56-57):
 * cce_lse_forward.py:196-205 lse (N fp32), locks (ceil(N/128) uint32, dies with the call) and
 * logit_avg (V fp32); indexed_dot.py:123 the target logits' negation (N fp32; .to(fp32) at :156
 * is itself), nll = neg_dot.add_(lse) in place (cce.py:120), its sum (:126); it saves e, c, lse,
 * the targets, valids and logit_avg (:132).  Backward (cce.py:141-218): vocab_ordering =
 * argsort(logit_avg).to(int32) (:42-44, :143-144: the sort's values V fp32 and indices V int64,
 * then V int32); cce_backward.py asserts e and c are bf16 or fp16 (:349-356: fp32 weights fail
 * here), dE = zeros_like(e) (b s h, e's dtype) and dC = zeros_like(c) when the weight trains
 * (:363-367; the fp32 accumulators only with accum_*_fp32), lock tables ceil(N/128) x ceil(h/64)
 * and ceil(V/128) x ceil(h/64) int32 (:422-434); the kernel writes both; .to() their own dtypes
 * is no copy (:481-485).  The flatten's backward is a view: dE is the input's gradient.
 * docs/memory-facts.md#cce-head */
static void cce(struct bld *B, struct mp_node *n, const char *nm, uint64_t h, uint64_t v, int w)
{
    struct mp_tensor *xt = T(B, n->in[0]);
    const struct mp_param *q = &B->p->params[w];
    bool wt = q->trainable;
    uint64_t np, N = label_rows(B, &np);
    n->rows = N;
    n->n = v;
    n->k = h;
    save(n, n->in[0]); /* e */
    kept(B, n, nm, "valids", MP_DT_I64, N, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "lse", MP_DT_F32, N, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "logit_avg", MP_DT_F32, v, MP_XR_LOSS_SAVED);
    uint64_t keep = add(B, mul(B, N, 12), mul(B, v, 4)); /* what the replay holds already */
    /* forward: the valids (before any kept tensor exists: mask and nonzero, then nonzero and its
     * int32 copy), then in the function the locks, or the N fp32 nll and its sum */
    uint64_t valids = mp_max_u64(add(B, np, mul(B, N, 16)), mul(B, N, 24));
    uint64_t in_fn = mp_max_u64(mul(B, mp_ceil_div(N, 128), 4), add(B, mul(B, N, 4), 4));
    tmp_one(B, n, false, MP_TR_OTHER, mp_max_u64(valids > keep ? valids - keep : 0, in_fn));
    /* backward: the sort (12V), then dE, dC, vocab_ordering (4V) and the lock tables */
    uint64_t gw = wt ? mul3(B, v, h, mp_dtype_size(q->dtype)) : 0;
    uint64_t gx = mul3(B, B->b, B->s, mul(B, h, mp_dtype_size(xt->dtype)));
    uint64_t hl = mp_ceil_div(h, 64);
    uint64_t locks = add(B, mul3(B, mp_ceil_div(N, 128), hl, 4), wt ? mul3(B, mp_ceil_div(v, 128), hl, 4) : 0);
    uint64_t kernel = add(B, add(B, add(B, gw, gx), mul(B, v, 4)), locks);
    tmp_one(B, n, true, MP_TR_OTHER, beyond(mp_max_u64(mul(B, v, 12), kernel), gw, gx));
    double mm = 2.0 * (double)N * (double)h * (double)v;
    n->fwd_flops = 2.0 * mm;                /* the LSE pass and the target dot (on N x h) */
    n->bwd_flops = (wt ? 3.0 : 2.0) * mm;   /* the logits again, then dE (and dC) */
}

/* torchtune's LinearCrossEntropyLoss (pytorch/torchtune main bd2a0fc, 2026-04-23; not in 0.6.1):
 * modules/loss/cross_entropy_loss.py with its defaults (num_output_chunks 8, mask_ignored_tokens
 * True, :34-40), as the recipes call it on the final norm's output (set_model_output,
 * skip_output_layer, :67-70; recipes/full_finetune_single_device.py _loss_step; labels come shifted from the
 * dataset, datasets/_sft.py:166-175, the last -100).  forward (:147-188): the valid count
 * (torch.where(targets != -100): a bool b s mask and nonzero's N x 2 int64, :160); mask_inputs
 * (:117-145): the mask again and nonzero's N x 1 int64 `indices` (IndexSelectBackward0 keeps
 * them), hidden.index_select (N x h, a new tensor) and the targets' (N int64, nll_loss keeps
 * them); tensor_split into 8 (views, each a SliceBackward0); per chunk compute_cross_entropy
 * (:87-115): logits = output(hidden_chunk) (n x V in the weight's dtype; MmBackward0 keeps the
 * chunk only when the weight trains), logits.float() (a copy unless fp32; ToCopyBackward0 keeps
 * nothing) and F.cross_entropy(reduction="sum"): log_softmax's fp32 n x V output, which
 * LogSoftmaxBackward0 and NllLossBackward0 keep, and nll's total_weight (an fp32 scalar, kept);
 * the bf16 logits live until the function returns.  So every chunk keeps its fp32 log-probs:
 * N x V x 4 bytes at the end of the forward.  Backward, chunk 8 first (the engine runs the
 * highest sequence number): NllLossBackward0's n x V fp32 zeros and LogSoftmaxBackward0's n x V
 * fp32 gradient beside every chunk's log-probs (the peak); then the chunk's log-probs go,
 * ToCopyBackward0 (n x V in the weight's dtype), MmBackward0 (n x h, and V x h for a trainable
 * weight through TBackward0's view: the first two summed out of place, the view being buffered, the
 * later ones in place into that sum, input_buffer.cpp accumulate); after the eight chunks each
 * SliceBackward0 makes
 * an N x h zeros tensor (summed in place), IndexSelectBackward0 the b s h input gradient.
 * docs/memory-facts.md#torchtune-lce */
static void torchtune_lce(struct bld *B, struct mp_node *n, const char *nm, uint64_t h, uint64_t v, int w)
{
    struct mp_tensor *xt = T(B, n->in[0]);
    uint64_t hd = mp_dtype_size(xt->dtype);
    const struct mp_param *q = &B->p->params[w];
    uint64_t wd = mp_dtype_size(q->dtype);
    bool wt = q->trainable;
    uint64_t np, N = label_rows(B, &np);
    (void)np;
    uint64_t bs = mul(B, B->b, B->s), v4 = mul(B, v, 4), hh = mul(B, h, hd);
    /* tensor_split(8) (its chunk i, from 0, has N / 8 rows and one more while i < N % 8) */
    uint64_t rows[MP_TORCHTUNE_CHUNKS];
    for (unsigned i = 0; i < MP_TORCHTUNE_CHUNKS; i++)
        rows[i] = N / MP_TORCHTUNE_CHUNKS + (i < N % MP_TORCHTUNE_CHUNKS);
    n->rows = N;
    n->n = v;
    n->k = h;
    kept(B, n, nm, "indices", MP_DT_I64, N, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "targets", MP_DT_I64, N, MP_XR_LOSS_SAVED);
    kept(B, n, nm, "log_probs", MP_DT_F32, mul(B, N, v), MP_XR_LOSS_SAVED);
    kept(B, n, nm, "total_weight", MP_DT_F32, MP_TORCHTUNE_CHUNKS * 128, MP_XR_LOSS_SAVED); /* 8 scalars */
    uint64_t nh = mul(B, N, hh), sel = wt ? 0 : nh; /* the gathered rows: kept, or the forward's local */
    if (wt)
        kept(B, n, nm, "hidden_rows", xt->dtype, mul(B, N, h), MP_XR_LOSS_SAVED);
    /* forward: the masks and their nonzero indices (before anything is kept); then chunk i's
     * logits, their fp32 copy and the nll sum beside the log-probs kept so far (the replay holds
     * every chunk's: less those of the chunks after i) and the gathered rows */
    uint64_t fwd = add(B, bs, mul(B, N, 16)), later = 0;
    for (unsigned i = MP_TORCHTUNE_CHUNKS; i-- > 0;) {
        uint64_t lv = mul(B, rows[i], v);
        uint64_t t = add(B, add(B, add(B, mul(B, lv, wd), wd != 4 ? mul(B, lv, 4) : 0), sel), 512);
        fwd = mp_max_u64(fwd, t > later ? t - later : 0);
        later = add(B, later, mul(B, lv, 4));
    }
    tmp_one(B, n, false, MP_TR_OTHER, fwd);
    /* backward, chunk 8 first, each phase as pos - neg beside everything the replay keeps: the
     * chunk's nll and log-softmax gradients (8 n V); its MmBackward0 (its log-probs released:
     * the gradient in the weight's dtype, n x h, a new V x h weight gradient beside the first
     * chunk's, which holds the sum); then, every log-prob and the gathered rows released, the
     * slices (the N x h sum, a new N x h and the chunks' gradients not yet summed) and
     * IndexSelectBackward0 (the sum and the b s h input gradient) */
    uint64_t gw = wt ? mul3(B, v, h, wd) : 0, gx = mul(B, bs, hh);
    uint64_t pos = 0, neg = 0, worst = 0;
    for (unsigned i = MP_TORCHTUNE_CHUNKS; i-- > 0;) {
        uint64_t lv = mul(B, rows[i], v);
        uint64_t p1 = add(B, pos, mul(B, lv, 8));
        uint64_t p3 = add(B, add(B, add(B, pos, mul(B, lv, wd)), mul(B, rows[i], hh)), gw);
        uint64_t n3 = add(B, neg, mul(B, lv, 4));
        worst = mp_max_u64(worst, mp_max_u64(p1 > neg ? p1 - neg : 0, p3 > n3 ? p3 - n3 : 0));
        if (wt && i + 2 == MP_TORCHTUNE_CHUNKS && rows[i]) { /* the first sum: out of place (the
            buffered gradient is TBackward0's view), its chunk's logits gradient gone */
            uint64_t ps = add(B, add(B, add(B, pos, mul(B, rows[i], hh)), gw), gw);
            worst = mp_max_u64(worst, ps > n3 ? ps - n3 : 0);
        }
        pos = add(B, add(B, pos, mul(B, rows[i], hh)), i + 1 == MP_TORCHTUNE_CHUNKS ? gw : 0);
        neg = n3;
    }
    uint64_t last = rows[MP_TORCHTUNE_CHUNKS - 1];
    uint64_t slices = mul(B, nh, 3) - mul(B, last, hh);
    uint64_t late = add(B, gw, mp_max_u64(slices, add(B, nh, gx)));
    uint64_t gone = add(B, mul(B, N, v4), wt ? nh : 0);
    worst = mp_max_u64(worst, late > gone ? late - gone : 0);
    tmp_one(B, n, true, MP_TR_OTHER, beyond(worst, gw, gx));
    double mm = 2.0 * (double)N * (double)h * (double)v;
    n->fwd_flops = mm + 5.0 * (double)N * (double)v; /* the logits, the copy, log-softmax */
    n->bwd_flops = (wt ? 2.0 : 1.0) * mm + 5.0 * (double)N * (double)v;
}

/* The node of a trainer's loss on the model's logits (ORPO's, LLaMA-Factory's DPO and KTO; opt
 * names its options, who the step): a decoder-only causal LM's, its rows chosen/rejected pairs
 * (pairs; KTO's are single examples), else refused.  NULL when refused or out of memory; en gets
 * the node's name (nm.tag), *y its scalar output. */
static struct mp_node *pair_loss_node(struct bld *B, struct val logits, const struct mp_layer *l, const char *nm,
                                      const char *tag, const char *opt, const char *who, bool pairs, char *en,
                                      size_t cap, struct val *y)
{
    *y = logits;
    if (failed(B))
        return NULL;
    if (l->t5.on || l->head.masked || B->m->input != MP_INPUT_TOKENS) {
        fail_model(B, MP_ERR_USAGE, "%s: %s: not modelled (%s on a decoder-only causal LM only)", opt,
                   l->t5.on ? "an encoder-decoder model" : l->head.masked ? "a masked-LM head" : "a non-token model",
                   who);
        return NULL;
    }
    if (pairs && (B->b < 2 || B->b % 2)) {
        fail_model(B, MP_ERR_USAGE, "%s: chosen and rejected rows come in pairs (%llu rows)", opt,
                   (unsigned long long)B->b);
        return NULL;
    }
    snprintf(en, cap, "%s.%s", nm, tag);
    uint64_t shape[1] = {1};
    *y = new_val(B, en, MP_DT_F32, 1, shape, true);
    struct mp_node *n = new_node(B, MP_P_FUSED_LOSS, en);
    if (!n)
        return NULL;
    n->in[0] = logits.t;
    n->in[1] = B->p->labels;
    n->out = y->t;
    return n;
}

/* TRL's ORPO loss on the model's logits (trl 1.16.0 experimental/orpo/orpo_trainer.py; CUDA path),
 * one node reading the logits L (b x s x V, b the chosen and rejected rows; under amp the fp32 copy
 * accelerate makes, lower_lm_head) whose bytes follow the source op by op.  It runs after the model
 * returns, outside autocast (compute_loss's own autocast, for a PEFT model cast to bf16, sees fp32
 * logits), so every logits-sized tensor has L's dtype.  concatenated_forward (:745-822) makes the
 * labels from the input ids (:794-797, an int64 b x s local).  The NLL on the chosen half
 * (:779-800): logits[:b/2][..., :-1, :].contiguous() (a copy C, (b/2)(s-1) x V), then
 * nn.CrossEntropyLoss: log_softmax (LS, saved) and nll_loss (saves LS, its int64 target and
 * total_weight); C dies as the call returns.  get_batch_logps (:705-743): the labels [:, 1:].clone(),
 * their mask != -100 (bool, saved by the mul that applies it), torch.where (the int64 index) and
 * trainer/utils.py selective_log_softmax, which on CUDA is kernels/logprob_entropy.py
 * _LogProbEntropyFunction on the view logits[:, :-1, :]: four fp32 b(s-1) outputs (:164-167),
 * saving the view (so L itself), the index, log_z and expected_logit (:190).  The odds ratio
 * (:670-703) and the sums are b-sized.
 * Backward: autograd runs the later-made branch first (its nodes' sequence numbers are higher):
 * the function's grad_logits (empty_like the view, contiguous: b(s-1) x V, :209), then L and what
 * the function saved die and SliceBackward0 makes L's gradient G (b x s x V zeros) from it; then
 * the NLL branch: NllLossBackward0 (a dense (b/2)(s-1) x V gradient), LogSoftmaxBackward0 (another;
 * LS and the first die after it), then the two SliceBackward0 (a (b/2) x s x V and a b x s x V
 * zeros tensor), and the engine adds the last into G in place.  The replay's moment for the node
 * holds L, what it keeps and G: bwd_tmp is the largest phase above that.  (bench/accuracy/
 * orpo_step.py: the order and each phase, InplaceTracker.) */
static struct val lower_orpo_loss(struct bld *B, struct val logits, const struct mp_layer *l, const char *nm)
{
    char en[112];
    struct val y;
    struct mp_node *n = pair_loss_node(B, logits, l, nm, "orpo", "--trainer orpo", "ORPO", true, en, sizeof en, &y);
    if (!n)
        return y;
    uint64_t V = last_dim(logits), s = B->s, half = B->b / 2;
    enum mp_dtype ldt = dt_of(B, logits); /* every logits-sized tensor's (outside autocast) */
    uint64_t ld = mp_dtype_size(ldt);
    uint64_t sm1 = s > 0 ? s - 1 : 0;
    uint64_t n1 = mul(B, half, sm1), n2 = mul(B, B->b, sm1); /* chosen / all positions after the shift */
    uint64_t Lb = T(B, logits.t)->bytes;                        /* L, and its gradient G */
    uint64_t c = mul(B, mul(B, n1, V), ld); /* C, the contiguous chosen copy; LS and each NLL-branch gradient */
    uint64_t g1 = mul(B, mul(B, n2, V), ld);                    /* the function's grad_logits */
    uint64_t z1 = mul(B, mul(B, mul(B, half, s), V), ld);       /* SliceBackward0 of the chosen rows' shift */
    save(n, logits.t); /* the function's view of L */
    kept(B, n, en, "log_softmax", ldt, mul(B, n1, V), MP_XR_LOSS_SAVED);
    kept(B, n, en, "nll_target", MP_DT_I64, n1, MP_XR_LOSS_SAVED);
    kept(B, n, en, "total_weight", ldt, 1, MP_XR_LOSS_SAVED);
    kept(B, n, en, "loss_mask", MP_DT_U8, n2, MP_XR_LOSS_SAVED);
    kept(B, n, en, "index", MP_DT_I64, n2, MP_XR_LOSS_SAVED);
    kept(B, n, en, "log_z", MP_DT_F32, n2, MP_XR_LOSS_SAVED);
    kept(B, n, en, "expected_logit", MP_DT_F32, n2, MP_XR_LOSS_SAVED);
    /* forward: the labels (a local of the forward) beside C while log_softmax runs */
    tmp_one(B, n, false, MP_TR_OTHER, add(B, mul(B, mul(B, B->b, s), 8), c));
    /* backward phases (beyond everything else that is live), in the order they run: the function's
     * backward (L, LS, grad_logits) and SliceBackward0 (grad_logits, G: L's size) hold the same bytes;
     * LogSoftmaxBackward0 (G, LS and two gradients); the chosen rows' SliceBackward0 (G, LS's gradient,
     * its zeros: never above the next); the batch's SliceBackward0 (G, those zeros and its own, then
     * added into G) */
    uint64_t worst = mp_max_u64(add(B, add(B, Lb, c), g1),
                                mp_max_u64(add(B, Lb, mul(B, c, 3)), add(B, add(B, Lb, z1), Lb)));
    tmp_one(B, n, true, MP_TR_OTHER, beyond(worst, add(B, Lb, c), Lb));
    n->rows = n2;
    n->n = V;
    double mv = (double)n2 * (double)V;
    n->fwd_flops = 6.0 * mv; /* log-softmax and the NLL's on half the rows, the fused log-probs */
    n->bwd_flops = 6.0 * mv;
    B->p->explicit_loss = true;
    return y;
}

/* LLaMA-Factory 0.9.5's DPO step on the model's fp32 logits L (b = 2 x the pairs rows of s
 * positions, vocabulary V): concatenated_forward (train/dpo/trainer.py:219-252) after
 * nested_detach's clones of the batch (:227, trainer_utils.py:829-845: input_ids, attention_mask,
 * labels, b x s int64 each, alive through the forward), then get_batch_logps
 * (trainer_utils.py:592-636): labels[:, 1:].clone() (b(s-1) int64, gather's index), the loss mask
 * (b(s-1) bool, the mul's saved operand), log_softmax over the view L[:, :-1] (not contiguous: a
 * contiguous copy C, b(s-1) x V fp32, beside its output LS, which LogSoftmaxBackward0 keeps), the
 * gather (b(s-1)), the mask's product and the sums.  L itself is saved by nothing: the trainer's
 * get_batch_loss_metrics holds it (model_output's chosen/rejected_logits, :286-311) through the
 * reference forward and lets go of it as it returns, before backward (p->ref_held_bytes).
 * Backward, in the engine's order: MulBackward0, GatherBackward0 (zeros G1 the size of LS,
 * scatter_add), LogSoftmaxBackward0 (G2, LS's size; LS, G1 die after it), SliceBackward0 (zeros
 * Z of L's size, b x s x V fp32, G2 copied in), then the cast's ToCopyBackward0.  The replay's
 * moment for the node holds what it keeps (LS) and Z, its input's gradient; bwd_tmp is the
 * largest phase above that: LS + G1 + G2, or G2 + Z.  Every pref_loss of the reference's kind
 * (sigmoid, hinge, ipo, kto_pair) runs this head; what the loss adds is b-sized.
 * Its KTO step (--trainer kto --loss hf; train/kto/trainer.py, b the examples, one sequence each)
 * runs the same head on the batch: forward (:148-181) clones the whole batch (nested_detach, :153:
 * input_ids, attention_mask, labels and the KL sequences' three, b x s int64 each, and kto_tags,
 * b bools) and calls get_batch_logps on `.logits.to(torch.float32)` (:179-180) as above.  Then
 * concatenated_forward (:183-199) runs the policy again on the KL sequences under torch.no_grad
 * while it holds L (p->kl_held_bytes; the estimator replays that forward, estimate.c kl_phase), and
 * picks the chosen and rejected logits by kto_tags (boolean indexing: copies, L's bytes together);
 * L dies as it returns, the copies are held (get_batch_loss_metrics, :228-265) through the
 * reference's concatenated_forward (:201-218), whose own batch logits are held through its KL
 * forward: p->ref_held_bytes is 2 L.  kto_loss and the ftx term act on b-sized log-probs.
 * (bench/accuracy/lf_dpo_step.py, lf_kto_step.py: each phase; docs/memory-facts.md#lf-dpo, #lf-kto.) */
static struct val lower_lf_dpo_loss(struct bld *B, struct val logits, const struct mp_layer *l, const char *nm)
{
    char en[112];
    struct val y;
    bool kto = B->p->opts.trainer == MP_TRAINER_KTO;
    struct mp_node *n = pair_loss_node(B, logits, l, nm, kto ? "lf_kto" : "lf_dpo",
                                       kto ? "--trainer kto --loss hf" : "--trainer dpo --loss hf",
                                       kto ? "LLaMA-Factory's KTO" : "LLaMA-Factory's DPO", !kto, en, sizeof en, &y);
    if (!n)
        return y;
    uint64_t V = last_dim(logits), s = B->s;
    uint64_t sm1 = s > 0 ? s - 1 : 0;
    uint64_t n2 = mul(B, B->b, sm1);    /* the positions after the shift */
    uint64_t Lb = T(B, logits.t)->bytes; /* L, and Z */
    uint64_t c = mul3(B, n2, V, 4);      /* C, LS, G1, G2 */
    kept(B, n, en, "index", MP_DT_I64, n2, MP_XR_LOSS_SAVED);
    kept(B, n, en, "loss_mask", MP_DT_U8, n2, MP_XR_LOSS_SAVED);
    kept(B, n, en, "log_softmax", MP_DT_F32, mul(B, n2, V), MP_XR_LOSS_SAVED);
    /* forward: the batch's clones beside C while log_softmax runs (KTO: six b x s ones and kto_tags);
     * one row's L[:, :-1] is contiguous already (a size-1 dimension's stride does not count), and
     * contiguous() copies nothing (KTO at one example: lf_kto_step.py's 1 x 512 row) */
    uint64_t clones = kto ? add(B, mul3(B, B->b, s, 6 * 8), B->b) : mul3(B, B->b, s, 3 * 8);
    tmp_one(B, n, false, MP_TR_OTHER, add(B, clones, B->b > 1 ? c : 0));
    uint64_t worst = mp_max_u64(mul(B, c, 3), add(B, c, Lb));
    tmp_one(B, n, true, MP_TR_OTHER, beyond(worst, c, Lb));
    B->p->ref_held_bytes = kto ? mul(B, Lb, 2) : Lb;
    B->p->kl_held_bytes = kto ? Lb : 0;
    n->rows = n2;
    n->n = V;
    double mv = (double)n2 * (double)V;
    n->fwd_flops = 5.0 * mv; /* log-softmax (4) and the contiguous copy */
    n->bwd_flops = 4.0 * mv; /* the gather's zeros and scatter, log-softmax's (3) */
    B->p->explicit_loss = true;
    return y;
}

/* The LM head and its loss as --loss names them (not hf): one fused node reading x. */
static struct val lower_fused_loss(struct bld *B, struct val x, const struct mp_layer *l, const char *nm)
{
    enum mp_loss loss = B->p->opts.loss;
    const char *why = mp_loss_unmodelled(loss);
    const char *head = l->head.masked ? "a masked-LM head" : l->t5.on || l->head.in_mult != 0 ? "T5's head"
                     : l->bias ? "an lm_head with a bias" : l->head.softcap > 0 ? "logit soft-capping"
                     : l->mult != 0 ? "scaled logits" : B->m->input != MP_INPUT_TOKENS ? "a non-token model"
                     : B->p->opts.ft.mode == MP_FT_FREEZE ? "--finetune freeze" : NULL;
    if (!why && head)
        why = "not modelled";
    if (!why)
        why = mp_loss_precision_refused(loss, B->p->opts.precision);
    char lbuf[320];
    if (!why && loss == MP_LOSS_LIGER)
        why = mp_liger_refused(B->m->hf_type, &B->p->opts.liger, lbuf, sizeof lbuf);
    if (why) {
        fail_model(B, MP_ERR_USAGE, "--loss %s: %s%s%s", mp_loss_str(loss), why, head ? " for " : "",
                   head ? head : "");
        return x;
    }
    if (!width_ok(B, x, l->dim, "dim", nm))
        return x;
    int w = l->head.tied ? B->embed_param : new_param(B, "weight", l->vocab, l->dim, true);
    if (failed(B))
        return x;
    if (!l->head.tied) {
        char pn[96];
        snprintf(pn, sizeof pn, "%s.weight", nm);
        B->p->params[w].name = name_of(B, pn);
    }
    char en[96];
    snprintf(en, sizeof en, "%s.%s", nm, mp_loss_str(loss));
    uint64_t shape[1] = {1};
    struct val y = new_val(B, en, MP_DT_F32, 1, shape, true);
    struct mp_node *n = new_node(B, MP_P_FUSED_LOSS, en);
    if (!n)
        return y;
    n->in[0] = x.t;
    n->in[1] = B->p->labels;
    n->out = y.t;
    n->param[0] = w;
    switch (loss) {
    case MP_LOSS_CHUNKED_NLL:
        trl_nll(B, n, en, l->dim, l->vocab, w);
        break;
    case MP_LOSS_LIGER:
        liger(B, n, en, l->dim, l->vocab, w);
        break;
    case MP_LOSS_CCE:
        cce(B, n, en, l->dim, l->vocab, w);
        break;
    case MP_LOSS_TORCHTUNE:
        torchtune_lce(B, n, en, l->dim, l->vocab, w);
        break;
    case MP_LOSS_HF:
        MP_BUG("loss %s has no fused head", mp_loss_str(loss));
    }
    /* (liger and chunked-nll hand on fresh weight gradients too, unmeasured under InplaceTracker:
     * their tied rows keep the out-of-place sum) */
    if (l->head.tied)
        tied_grads(B, loss == MP_LOSS_CCE || (loss == MP_LOSS_TORCHTUNE && n->rows >= 2));
    B->p->probe_unsupported = "the chunked and fused loss heads (--loss other than hf)";
    B->p->explicit_loss = true;
    return y;
}
