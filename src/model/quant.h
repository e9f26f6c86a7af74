/* quant.h — storage of quantized Linear weights: bitsandbytes 4-bit (NF4/FP4,
 * optional double quantization) and 8-bit, GPTQ and AWQ.
 *
 * One function says which tensors a quantized Linear of out x in weights holds
 * and their exact sizes, read from the libraries' sources (cited per format in
 * quant.c).  The estimator, the fine-tuning lowering and the HF reader
 * (quantization_config) all use it.  Pure: no allocation, no I/O.
 */
#ifndef MEMPLAN_QUANT_H
#define MEMPLAN_QUANT_H

#include "util/util.h"

enum mp_quant_kind {
    MP_Q_NONE,
    MP_Q_BNB_NF4,  /* bitsandbytes Linear4bit, quant_type nf4 */
    MP_Q_BNB_FP4,  /* bitsandbytes Linear4bit, quant_type fp4 */
    MP_Q_BNB_INT8, /* bitsandbytes Linear8bitLt (LLM.int8) */
    MP_Q_GPTQ,     /* auto-gptq / gptqmodel QuantLinear */
    MP_Q_AWQ,      /* autoawq WQLinear_GEMM */
};
const char *mp_quant_kind_str(enum mp_quant_kind k);

struct mp_quant {
    enum mp_quant_kind kind;
    bool double_quant;     /* bnb 4-bit: bnb_4bit_use_double_quant (absmax quantized to 8 bits) */
    uint64_t blocksize;    /* bnb 4-bit: 64 */
    uint64_t bits;         /* gptq / awq: 2, 3, 4 or 8 */
    uint64_t group_size;   /* gptq / awq: 128; 0 = one group per input row (gptq group_size -1) */
    int compute_dtype;     /* bnb 4-bit: bnb_4bit_compute_dtype as enum mp_dtype, or -1 = the input's */
    int storage;           /* bnb 4-bit: bnb_4bit_quant_storage as enum mp_dtype: uint8 (the libraries'
                            * default) or a float dtype, whose packed tensor FSDP2 can shard (the bytes
                            * are the same); -1 = auto (QLoRA: bf16 under FSDP2, uint8 otherwise) */
};
/* The storage dtype in effect: q's, or for auto bf16 when sharded by FSDP2, else uint8. */
int mp_quant_storage(const struct mp_quant *q, bool fsdp);
/* "uint8", "bfloat16", "float16", "float32" (the names transformers takes) -> enum mp_dtype, -1. */
int mp_quant_storage_parse(const char *s);
const char *mp_quant_storage_str(int dt);
const char *mp_quant_storage_names(const char *sep, const char *last);
void mp_quant_init(struct mp_quant *q, enum mp_quant_kind kind); /* the library's defaults */

#define MP_QUANT_PARTS_MAX 7
struct mp_quant_part {
    const char *name;  /* "weight", "absmax", ... */
    uint64_t bytes;
};

/* The tensors of one quantized out x in Linear (bias excluded: it stays an
 * ordinary parameter).  Returns how many parts were written, 0 on overflow. */
size_t mp_quant_parts(const struct mp_quant *q, uint64_t out_f, uint64_t in_f,
                      struct mp_quant_part parts[MP_QUANT_PARTS_MAX]);

/* Sum of the parts' bytes (what the library's tensors hold), and the same with
 * each part rounded to the CUDA caching allocator's 512 bytes.  0 on overflow. */
uint64_t mp_quant_weight_bytes(const struct mp_quant *q, uint64_t out_f, uint64_t in_f);
uint64_t mp_quant_alloc_bytes(const struct mp_quant *q, uint64_t out_f, uint64_t in_f);

/* Bytes of the dequantized weight temporary (out x in in dtype_bytes) that
 * forward and backward materialise before the matmul, plus the library's own
 * scratch (fp32 absmax of a double-quantized weight).  0 on overflow. */
uint64_t mp_quant_dequant_bytes(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, uint64_t dtype_bytes);

/* NF4 code book exactly as bitsandbytes defines it (functional.py get_4bit_type). */
extern const float mp_nf4_code[16];

/* bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(True, 7, 8)), sorted: the code of
 * double-quantized absmax values. */
void mp_quant_dynamic_code(float code[256]);

/* Executors (the probe) hold a bnb NF4 weight in its own layout: the parts of mp_quant_parts,
 * each at an offset rounded to 512 bytes (mp_quant_alloc_bytes in all).  pack quantizes the
 * out x in fp32 weight w into dst the way quantize_4bit does (per-block absmax, nearest code;
 * double quant: absmax minus its mean, blockwise 8-bit per 256 blocks); unpack dequantizes
 * into w (dequantize_4bit).  MP_ERR_UNSUPPORTED for other formats. */
enum mp_status mp_quant_pack(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, const float *w,
                             uint8_t *dst);
enum mp_status mp_quant_unpack(const struct mp_quant *q, uint64_t out_f, uint64_t in_f, const uint8_t *src,
                               float *w);
/* The byte offsets of the parts of that layout (mp_quant_parts' order) and the block size, for
 * an executor that dequantizes elsewhere (the cuda backend's kernel).  MP_ERR_UNSUPPORTED for
 * other formats. */
enum mp_status mp_quant_nf4_layout(const struct mp_quant *q, uint64_t out_f, uint64_t in_f,
                                   uint64_t off[MP_QUANT_PARTS_MAX], uint64_t *blocksize);

#endif
