/* Quantized weight matrices: the byte layouts every backend reads, and the host quantizers.
 *
 * INT8 / INT4 are THUDM's scheme (chatglm-6b's quantization.py): per output row, symmetric
 * absmax with an fp16 scale s = fp16(max|w| / (2^(bits-1) - 1)) and q = round(fp16(w / s))
 * (round half to even, as torch.round), computed from the fp16 weight (the original quantizes
 * a .half() model). INT4 packs two values per byte, the even column in the high nibble
 * (cpm_kernels' int4WeightCompression). A weight reads back as q * s. Where the original
 * divides by zero (an all-zero row) q is 0; where a subnormal scale pushes |q| past 2^(bits-1)-1
 * (the original's int8 cast wraps it to the other sign) q is clamped to it.
 *
 * NF4 is bitsandbytes' quantize_4bit(quant_type="nf4", blocksize=64, compress_statistics=True):
 * the flattened matrix in blocks of 64, each block's absmax a, codes = the nearest of the 16
 * NormalFloat values to w / a (bitsandbytes' decision tree), two per byte, the first in the high
 * nibble. The absmax are double-quantized: offset = mean(a) (in double, rounded once), then (a - offset) in blocks of 256
 * to 8 bits over bitsandbytes' signed dynamic map, with one fp32 absmax2 per block of 256.
 * A weight reads back as nf4[code] * (dyn[qa] * absmax2 + offset).
 *
 * Device (and host) bytes of one [OC, C] matrix, each part starting on a 256-byte boundary:
 *   INT8: q int8 [OC, C]               then scale fp16 [OC]
 *   INT4: q int8 [OC, C/2] (packed)    then scale fp16 [OC]
 *   NF4:  codes u8 [OC*C/2] (packed)   then qa u8 [nb]  then absmax2 f32 [ceil(nb/256)]  then offset f32 [1]
 * with nb = OC*C/64 blocks. C must be even (INT4) or OC*C a multiple of 64 (NF4). */
#ifndef GLM_BACKEND_QUANT_H
#define GLM_BACKEND_QUANT_H
#include <stddef.h>
#include <stdint.h>

typedef enum glm_qtype { GLM_Q_NONE = 0, GLM_Q_INT8 = 1, GLM_Q_INT4 = 2, GLM_Q_NF4 = 3 } glm_qtype;

#define GLM_Q_ALIGN 256
#define GLM_NF4_BLOCK 64
#define GLM_NF4_BLOCK2 256

static inline size_t glm_q_round(size_t b) { return (b + GLM_Q_ALIGN - 1) / GLM_Q_ALIGN * GLM_Q_ALIGN; }

/* Where the parts of a quantized [OC, C] matrix lie (byte offsets from its start). */
typedef struct glm_qlayout {
    size_t q;        /* the integers / codes: always 0 */
    size_t q_bytes;
    size_t scale;    /* INT8/INT4: fp16 row scales */
    size_t qa;       /* NF4: the quantized block absmax [nb] */
    size_t absmax2;  /* NF4: fp32 [nb2] */
    size_t offset;   /* NF4: fp32 [1] */
    size_t nb, nb2;  /* NF4 blocks of 64 and of 256 */
    size_t bytes;    /* the whole matrix */
} glm_qlayout;

static inline glm_qlayout glm_qlayout_of(glm_qtype t, size_t OC, size_t C) {
    glm_qlayout l = {0};
    size_t n = OC * C;
    if (t == GLM_Q_NF4) {
        l.q_bytes = n / 2;
        l.nb = n / GLM_NF4_BLOCK;
        l.nb2 = (l.nb + GLM_NF4_BLOCK2 - 1) / GLM_NF4_BLOCK2;
        l.qa = glm_q_round(l.q_bytes);
        l.absmax2 = l.qa + glm_q_round(l.nb);
        l.offset = l.absmax2 + glm_q_round(l.nb2 * 4);
        l.bytes = l.offset + GLM_Q_ALIGN;
    } else {
        l.q_bytes = t == GLM_Q_INT4 ? n / 2 : n;
        l.scale = glm_q_round(l.q_bytes);
        l.bytes = l.scale + glm_q_round(OC * 2);
    }
    return l;
}

/* "int8"/"8", "int4"/"4", "nf4"; the name of each. */
const char *glm_qtype_name(glm_qtype t);
/* bits per weight element (8 or 4), 0 for none */
static inline int glm_qtype_bits(glm_qtype t) { return t == GLM_Q_INT8 ? 8 : t == GLM_Q_NONE ? 0 : 4; }

/* The 16 NormalFloat values (bitsandbytes' NF4 code book) and the 256 of its signed dynamic
 * map (create_dynamic_map(signed=True)), as float. */
extern const float glm_nf4_code[16];
extern const float glm_dyn_code[256];

/* Quantizes w [OC, C] (float; rounded to fp16 first for INT8/INT4, as the original) into dst
 * (glm_qlayout_of(t, OC, C).bytes bytes, zeroed padding). An all-zero row gets scale 0 and
 * q 0 (the original divides by zero there). */
void glm_quantize(glm_qtype t, void *dst, const float *w, size_t OC, size_t C);
/* The weights back as float: w [OC, C] = dequantized src (the values every backend computes with). */
void glm_dequantize(glm_qtype t, float *w, const void *src, size_t OC, size_t C);
/* Rows [r0, r1) only, into w [(r1 - r0), C]. */
void glm_dequantize_rows(glm_qtype t, float *w, const void *src, size_t OC, size_t C, size_t r0, size_t r1);

/* One element's code value (shared with the CUDA kernels' reading of the same bytes):
 * NF4's absmax of block b. */
static inline float glm_nf4_absmax(const uint8_t *qa, const float *absmax2, float offset, size_t b) {
    return glm_dyn_code[qa[b]] * absmax2[b / GLM_NF4_BLOCK2] + offset;
}

#endif
