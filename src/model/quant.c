/* quant.c — exact storage of quantized Linear weights (see quant.h).
 *
 * Sources (read, not copied):
 *  - bitsandbytes 0.50 functional.py quantize_4bit / quantize_blockwise / get_4bit_type,
 *    checked on this machine by quantizing real tensors on the CPU (bench/accuracy/peft_step.py):
 *    packed weight uint8 ceil(n/2); absmax fp32 ceil(n/blocksize); the 16-entry code
 *    fp32 (a fresh tensor per Linear).  Double quant (compress_statistics): absmax
 *    uint8 ceil(n/blocksize), its fp32 mean `offset` (0-dim), a second-level fp32
 *    absmax per 256 first-level blocks and the 256-entry fp32 dynamic code.
 *  - bitsandbytes nn/modules.py Int8Params: CB int8 out x in, SCB fp32 per output row.
 *  - auto-gptq QuantLinear: qweight int32 (in*bits/32, out), qzeros int32
 *    (groups, out*bits/32), scales fp16 (groups, out), g_idx int32 (in);
 *    groups = ceil(in / group_size) (group_size -1: one group).
 *  - autoawq WQLinear_GEMM: qweight int32 (in, out*bits/32), qzeros int32
 *    (in/group, out*bits/32), scales fp16 (in/group, out).
 */
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *mp_quant_kind_str(enum mp_quant_kind k)
{
    static const char *const n[] = {"none", "bnb-nf4", "bnb-fp4", "bnb-int8", "gptq", "awq"};
    return (unsigned)k <= MP_Q_AWQ ? n[k] : "?";
}

void mp_quant_init(struct mp_quant *q, enum mp_quant_kind kind)
{
    memset(q, 0, sizeof *q);
    q->kind = kind;
    q->blocksize = 64;  /* quantize_4bit's default */
    q->bits = 4;
    q->group_size = 128;
    q->compute_dtype = -1;
    q->storage = MP_DT_U8; /* transformers' BitsAndBytesConfig bnb_4bit_quant_storage default */
}

int mp_quant_storage(const struct mp_quant *q, bool fsdp)
{
    return q->storage >= 0 ? q->storage : fsdp ? MP_DT_BF16 : MP_DT_U8;
}

static const struct {
    const char *name;
    int dt;
} STORAGE[] = {{"uint8", MP_DT_U8}, {"bfloat16", MP_DT_BF16}, {"float16", MP_DT_F16}, {"float32", MP_DT_F32}};

int mp_quant_storage_parse(const char *s)
{
    for (size_t i = 0; s && i < sizeof STORAGE / sizeof STORAGE[0]; i++)
        if (!strcmp(s, STORAGE[i].name) || (!strncmp(s, "torch.", 6) && !strcmp(s + 6, STORAGE[i].name)))
            return STORAGE[i].dt;
    return -1;
}

const char *mp_quant_storage_names(const char *sep, const char *last)
{
    static char buf[64];
    const char *n[sizeof STORAGE / sizeof STORAGE[0]];
    for (size_t i = 0; i < sizeof STORAGE / sizeof STORAGE[0]; i++)
        n[i] = STORAGE[i].name;
    return mp_join(buf, sizeof buf, n, sizeof STORAGE / sizeof STORAGE[0], sep, last);
}

const char *mp_quant_storage_str(int dt)
{
    for (size_t i = 0; i < sizeof STORAGE / sizeof STORAGE[0]; i++)
        if (STORAGE[i].dt == dt)
            return STORAGE[i].name;
    return "auto";
}

/* NF4: functional.py get_4bit_type("nf4"), normalised by its max (1.0). */
const float mp_nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

static bool part(struct mp_quant_part *p, size_t *n, const char *name, uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t v;
    if (!mp_mul3_u64(a, b, c, &v))
        return false;
    p[*n].name = name;
    p[*n].bytes = v;
    (*n)++;
    return true;
}

size_t mp_quant_parts(const struct mp_quant *q, uint64_t out_f, uint64_t in_f,
                      struct mp_quant_part parts[MP_QUANT_PARTS_MAX])
{
    uint64_t n;
    size_t k = 0;
    if (!mp_mul_u64(out_f, in_f, &n) || n == 0)
        return 0;
    switch (q->kind) {
    case MP_Q_NONE: return 0;
    case MP_Q_BNB_NF4:
    case MP_Q_BNB_FP4: {
        uint64_t bs = q->blocksize ? q->blocksize : 64, nb = mp_ceil_div(n, bs);
        bool ok = part(parts, &k, "weight", mp_ceil_div(n, 2), 1, 1) && part(parts, &k, "code", 16, 4, 1);
        if (!q->double_quant)
            ok = ok && part(parts, &k, "absmax", nb, 4, 1);
        else
            ok = ok && part(parts, &k, "absmax", nb, 1, 1) && part(parts, &k, "offset", 1, 4, 1) &&
                 part(parts, &k, "absmax2", mp_ceil_div(nb, 256), 4, 1) && part(parts, &k, "code2", 256, 4, 1);
        return ok ? k : 0;
    }
    case MP_Q_BNB_INT8:
        return part(parts, &k, "CB", n, 1, 1) && part(parts, &k, "SCB", out_f, 4, 1) ? k : 0;
    case MP_Q_GPTQ: {
        uint64_t g = q->group_size ? mp_ceil_div(in_f, q->group_size) : 1, bits = q->bits ? q->bits : 4;
        bool ok = part(parts, &k, "qweight", mp_ceil_div(in_f * bits, 32), out_f, 4) &&
                  part(parts, &k, "qzeros", g, mp_ceil_div(out_f * bits, 32), 4) &&
                  part(parts, &k, "scales", g, out_f, 2) && part(parts, &k, "g_idx", in_f, 4, 1);
        return ok ? k : 0;
    }
    case MP_Q_AWQ: {
        uint64_t g = q->group_size ? mp_ceil_div(in_f, q->group_size) : 1, bits = q->bits ? q->bits : 4;
        bool ok = part(parts, &k, "qweight", in_f, mp_ceil_div(out_f * bits, 32), 4) &&
                  part(parts, &k, "qzeros", g, mp_ceil_div(out_f * bits, 32), 4) &&
                  part(parts, &k, "scales", g, out_f, 2);
        return ok ? k : 0;
    }
    }
    return 0;
}

static uint64_t sum_parts(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, bool round)
{
    struct mp_quant_part p[MP_QUANT_PARTS_MAX];
    size_t n = mp_quant_parts(q, out_f, in_f, p);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t b = round ? mp_ceil_div(p[i].bytes, 512) * 512 : p[i].bytes;
        if (!mp_add_u64(s, b, &s))
            return 0;
    }
    return s;
}

uint64_t mp_quant_weight_bytes(const struct mp_quant *q, uint64_t out_f, uint64_t in_f)
{
    return sum_parts(q, out_f, in_f, false);
}

uint64_t mp_quant_alloc_bytes(const struct mp_quant *q, uint64_t out_f, uint64_t in_f)
{
    return sum_parts(q, out_f, in_f, true);
}

/* bnb MatMul4Bit.backward: dequantize_4bit(B) (out x in in the quant dtype), which for
 * double quant first expands the absmax to fp32 (nb x 4).  The forward's dense path is
 * the same dequantize followed by F.linear.  GPTQ/AWQ training paths dequantize the
 * same way (their backward is a matmul with the dequantized weight); int8 backward
 * dequantizes CB x SCB. */
uint64_t mp_quant_dequant_bytes(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, uint64_t dtype_bytes)
{
    uint64_t n, w;
    if (q->kind == MP_Q_NONE || !mp_mul_u64(out_f, in_f, &n) || !mp_mul_u64(n, dtype_bytes, &w))
        return 0;
    if ((q->kind == MP_Q_BNB_NF4 || q->kind == MP_Q_BNB_FP4) && q->double_quant) {
        uint64_t nb = mp_ceil_div(n, q->blocksize ? q->blocksize : 64);
        if (!mp_add_u64(w, mp_ceil_div(nb * 4, 512) * 512, &w))
            return 0;
    }
    return w;
}

/* ---- executing NF4 (the probe) ----------------------------------------------------------------- */

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void mp_quant_dynamic_code(float code[256])
{
    /* signed, max_exponent_bits 7, total_bits 8: 7 exponent levels i, each 2^i + 1 linearly
     * spaced boundaries in [0.1, 1] whose midpoints scaled by 10^(i-6) (and negated) are codes;
     * no additional items (2^(7-7) - 1 = 0); then 0 and 1; sorted. */
    int n = 0;
    for (int i = 0; i < 7; i++) {
        int items = (1 << i) + 1;
        double scale = pow(10.0, (double)(i - 6));
        for (int j = 0; j + 1 < items; j++) {
            /* torch.linspace(0.1, 1, items) in fp32, then the midpoint in fp32 */
            float b0 = (float)(0.1 + (0.9 * j) / (items - 1)), b1 = (float)(0.1 + (0.9 * (j + 1)) / (items - 1));
            float mid = (b0 + b1) / 2.0f;
            code[n++] = (float)(scale * mid);
            code[n++] = (float)(-scale * mid);
        }
    }
    code[n++] = 0.0f;
    code[n++] = 1.0f;
    while (n < 256)
        code[n++] = 0.0f;
    qsort(code, 256, sizeof code[0], cmp_float);
}

static uint8_t nearest(const float *code, int n, float v)
{
    int best = 0;
    float bd = fabsf(code[0] - v);
    for (int i = 1; i < n; i++) {
        float dd = fabsf(code[i] - v);
        if (dd < bd) {
            bd = dd;
            best = i;
        }
    }
    return (uint8_t)best;
}

/* Offsets of the parts in the executor's layout. */
static size_t layout(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, uint64_t off[MP_QUANT_PARTS_MAX],
                     struct mp_quant_part parts[MP_QUANT_PARTS_MAX])
{
    size_t n = mp_quant_parts(q, out_f, in_f, parts);
    uint64_t o = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = o;
        o += mp_ceil_div(parts[i].bytes, 512) * 512;
    }
    return n;
}

/* The NF4 tensor's part offsets, element count, block size and block count:
 * what packing and unpacking both start from. */
static enum mp_status nf4_shape(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, uint64_t *off,
                                uint64_t *n, uint64_t *bs, uint64_t *nb)
{
    if (q->kind != MP_Q_BNB_NF4)
        return MP_ERR_UNSUPPORTED;
    struct mp_quant_part parts[MP_QUANT_PARTS_MAX];
    if (!layout(q, out_f, in_f, off, parts))
        return MP_ERR_RANGE;
    *n = out_f * in_f;
    *bs = q->blocksize ? q->blocksize : 64;
    *nb = mp_ceil_div(*n, *bs);
    return MP_OK;
}

enum mp_status mp_quant_nf4_layout(const struct mp_quant *q, uint64_t out_f, uint64_t in_f,
                                   uint64_t off[MP_QUANT_PARTS_MAX], uint64_t *blocksize)
{
    uint64_t n, nb;
    return nf4_shape(q, out_f, in_f, off, &n, blocksize, &nb);
}

struct nf4_job {
    const float *w;
    uint8_t *packed;
    float *absmax;
    uint64_t n, bs;
};

#define NF4_GRAIN_BLOCKS ((uint64_t)1 << 14) /* 1M values of 64-element blocks per range */

/* quantize_4bit of blocks [b0, b1): each block's absmax, then each value's nearest code. */
static void nf4_blocks(void *ctx, uint64_t b0, uint64_t b1)
{
    const struct nf4_job *j = ctx;
    for (uint64_t b = b0; b < b1; b++) {
        uint64_t e = mp_min_u64(j->n, (b + 1) * j->bs);
        float m = 0;
        for (uint64_t i = b * j->bs; i < e; i++)
            m = fmaxf(m, fabsf(j->w[i]));
        j->absmax[b] = m;
        for (uint64_t i = b * j->bs; i < e; i++) {
            uint8_t c = nearest(mp_nf4_code, 16, m > 0 ? j->w[i] / m : 0.0f);
            j->packed[i / 2] |= (uint8_t)(i % 2 ? c : c << 4); /* first element in the high nibble */
        }
    }
}

enum mp_status mp_quant_pack(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, const float *w, uint8_t *dst)
{
    uint64_t off[MP_QUANT_PARTS_MAX], n, bs, nb;
    enum mp_status st = nf4_shape(q, out_f, in_f, off, &n, &bs, &nb);
    if (st != MP_OK)
        return st;
    uint8_t *packed = dst + off[0];
    memcpy(dst + off[1], mp_nf4_code, sizeof mp_nf4_code);
    float *absmax = malloc(nb * sizeof *absmax);
    if (!absmax)
        return MP_ERR_NOMEM;
    memset(packed, 0, mp_ceil_div(n, 2));
    struct nf4_job j = {w, packed, absmax, n, bs};
    /* blocks on several threads (a 7B base is billions of values); an even block size keeps each
     * packed byte within one block */
    mp_parallel_for(nb, bs % 2 ? nb : NF4_GRAIN_BLOCKS, nf4_blocks, &j);
    if (!q->double_quant) {
        memcpy(dst + off[2], absmax, nb * 4);
    } else {
        double mean = 0;
        for (uint64_t b = 0; b < nb; b++)
            mean += absmax[b];
        float offset = (float)(mean / (double)nb);
        float code2[256];
        mp_quant_dynamic_code(code2);
        uint8_t *qa = dst + off[2];
        float *absmax2 = (float *)(void *)(dst + off[4]);
        memcpy(dst + off[3], &offset, 4);
        memcpy(dst + off[5], code2, sizeof code2);
        for (uint64_t g = 0; g < mp_ceil_div(nb, 256); g++) {
            uint64_t e = mp_min_u64(nb, (g + 1) * 256);
            float m = 0;
            for (uint64_t b = g * 256; b < e; b++)
                m = fmaxf(m, fabsf(absmax[b] - offset));
            absmax2[g] = m;
            for (uint64_t b = g * 256; b < e; b++)
                qa[b] = nearest(code2, 256, m > 0 ? (absmax[b] - offset) / m : 0.0f);
        }
    }
    free(absmax);
    return MP_OK;
}

enum mp_status mp_quant_unpack(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, const uint8_t *src, float *w)
{
    uint64_t off[MP_QUANT_PARTS_MAX], n, bs, nb;
    enum mp_status st = nf4_shape(q, out_f, in_f, off, &n, &bs, &nb);
    if (st != MP_OK)
        return st;
    const uint8_t *packed = src + off[0];
    float code[16], offset = 0, code2[256];
    memcpy(code, src + off[1], sizeof code);
    if (q->double_quant) {
        memcpy(&offset, src + off[3], 4);
        memcpy(code2, src + off[5], sizeof code2);
    }
    for (uint64_t b = 0; b < nb; b++) {
        float m;
        if (!q->double_quant) {
            memcpy(&m, src + off[2] + 4 * b, 4);
        } else {
            float m2;
            memcpy(&m2, src + off[4] + 4 * (b / 256), 4);
            m = code2[src[off[2] + b]] * m2 + offset;
        }
        uint64_t e = mp_min_u64(n, (b + 1) * bs);
        for (uint64_t i = b * bs; i < e; i++) {
            uint8_t c = i % 2 ? packed[i / 2] & 15 : packed[i / 2] >> 4;
            w[i] = code[c] * m;
        }
    }
    return MP_OK;
}
