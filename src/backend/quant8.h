/* 8-bit blockwise optimizer states: bitsandbytes' dynamic quantization maps and the per-element
 * arithmetic of its 8-bit blockwise Adam (kOptimizerStatic8bit2StateBlockwise, the version with
 * BLOCKSIZE_2STATE 2048), shared by the backends' adamw8 ops (backend/backend.h), the tests and
 * checkpoint conversion. Plain C with no dependency beyond backend/ headers, so the CPU op and
 * the CUDA kernel (cuda/k_adam8.cu) compile the same inline functions: fp32 results are equal
 * bit for bit across backends (on the device every product and sum is an explicitly rounded
 * intrinsic, so nvcc contracts nothing into an FMA; the host code is built without contraction).
 *
 * A state of n elements is codes u8 [n] and absmax f32 [ceil(n / GLM_ADAM8_BLOCK)]; element j
 * reads back as map[code[j]] * absmax[j / GLM_ADAM8_BLOCK]. The first moment uses the signed map
 * (create_dynamic_map(signed=True): 127 negative values, 0 at code 127, 127 positive, 1.0 at
 * 255; no -1), the second moment the unsigned one (create_dynamic_map(signed=False): 0 at code
 * 0, 254 positive values, 1.0 at 255), both as bitsandbytes computes them in float32.
 *
 * Fresh state: absmax 0 in every block. Any codes then decode to +-0, and the first step's
 * results do not depend on them (tests/py/test_adam8.py checks it bit for bit): all-zero bytes
 * (be->zero on codes and absmax, bitsandbytes' torch.zeros) is a fresh state, and so is codes =
 * glm_q8_zero_code(kind) (the code of 0.0) with absmax 0.
 *
 * Encoding (bitsandbytes' quantize_2D, exact comparisons kept): x = value / absmax, a 7-step
 * binary search from code 127, then the nearer neighbour by the float32 midpoint (a + b) * 0.5f;
 * at an exact midpoint the search's own pivot wins. For the signed map a code whose sign differs
 * from the value's is moved one code toward the value (its sign fix; at x = NaN from an all-zero
 * block, value +0 lands on code 255 by uint8 wrap-around, as there: absmax 0 decodes it to 0).
 *
 * Where this differs from bitsandbytes, deliberately:
 *   - every tensor is 8-bit (bitsandbytes keeps fp32 states for tensors under min_8bit_size =
 *     4096 elements);
 *   - exact IEEE division and square root where its kernel uses __fdividef and __powf: bc1 and
 *     bc2 come from the caller, step_size = (-lr * sqrt(bc2)) / bc1 rounded once;
 *   - a partial last block's absmax is the max over its real elements (its kernel also folds
 *     in the padding lanes, code 128's value times the old absmax times b1: < 5.5e-7 of it);
 *   - parameters are updated in fp32 (the master copy, or the S value read once) and rounded
 *     to S once (without a master its kernel rounds to T after the Adam step and again after
 *     the decay);
 *   - non-finite gradients propagate (the fp16 loss scaler skips those steps before the
 *     optimizer; newer bitsandbytes zeroes such an element's moments).
 * Decoupled weight decay is applied after the Adam step, p = p * (1 - lr*wd), as its kernel does
 * (PyTorch's AdamW decays first: a difference of order lr^2 wd). */
#ifndef GLM_OPTIM_QUANT8_H
#define GLM_OPTIM_QUANT8_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include "backend/backend.h"
#include "backend/quant_codes.h"

#ifdef __cplusplus
extern "C" {
#endif

/* create_dynamic_map(signed=True) is backend/quant_codes.h's GLM_DYN_CODE_INIT (the NF4
 * double quantization's map); create_dynamic_map(signed=False), float32: */
#define GLM_Q8_UNSIGNED_INIT \
    0.0f, 3.2500003e-07f, 7.7499999e-07f, 2.12499981e-06f, 4.37499966e-06f, 6.62499997e-06f, 8.87499937e-06f, 1.56249989e-05f, \
    2.68750009e-05f, 3.81249993e-05f, 4.93749976e-05f, 6.06250032e-05f, 7.18750016e-05f, 8.31249927e-05f, 9.43749983e-05f, 0.000128125001f, \
    0.000184375007f, 0.000240624999f, 0.00029687502f, 0.000353124982f, 0.000409375003f, 0.000465625024f, 0.000521875045f, 0.000578125007f, \
    0.000634375028f, 0.000690625049f, 0.000746875012f, 0.000803125091f, 0.000859375054f, 0.000915625016f, 0.000971875037f, 0.00114062498f, \
    0.00142187497f, 0.00170312496f, 0.00198437483f, 0.00226562493f, 0.00254687481f, 0.00282812468f, 0.00310937478f, 0.00339062465f, \
    0.00367187499f, 0.00395312486f, 0.0042343745f, 0.00451562507f, 0.00479687471f, 0.00507812481f, 0.00535937492f, 0.00564062456f, \
    0.00592187513f, 0.0062031243f, 0.00648437487f, 0.00676562544f, 0.00704687461f, 0.00732812518f, 0.00760937436f, 0.00789062493f, \
    0.0081718741f, 0.0084531242f, 0.00873437524f, 0.00901562441f, 0.00929687452f, 0.00957812369f, 0.00985937472f, 0.010703126f, \
    0.0121093756f, 0.0135156242f, 0.0149218757f, 0.0163281243f, 0.0177343749f, 0.0191406254f, 0.020546874f, 0.0219531264f, \
    0.0233593769f, 0.0247656256f, 0.0261718761f, 0.0275781285f, 0.0289843734f, 0.0303906258f, 0.0317968726f, 0.033203125f, \
    0.0346093737f, 0.036015626f, 0.0374218784f, 0.0388281234f, 0.0402343757f, 0.0416406207f, 0.0430468731f, 0.0444531254f, \
    0.0458593741f, 0.0472656265f, 0.0486718789f, 0.0500781238f, 0.0514843762f, 0.0528906249f, 0.0542968772f, 0.0557031296f, \
    0.057109382f, 0.0585156269f, 0.0599218719f, 0.0613281243f, 0.0627343804f, 0.0641406253f, 0.0655468777f, 0.0669531301f, \
    0.068359375f, 0.0697656274f, 0.0711718798f, 0.0725781247f, 0.0739843771f, 0.0753906295f, 0.0767968819f, 0.0782031268f, \
    0.0796093717f, 0.0810156241f, 0.0824218765f, 0.0838281214f, 0.0852343738f, 0.0866406187f, 0.0880468711f, 0.0894531235f, \
    0.0908593759f, 0.0922656283f, 0.0936718732f, 0.0950781256f, 0.096484378f, 0.0978906229f, 0.0992968753f, 0.103515625f, \
    0.110546872f, 0.117578126f, 0.124609374f, 0.131640613f, 0.138671875f, 0.145703137f, 0.152734369f, 0.159765631f, \
    0.166796863f, 0.173828125f, 0.180859387f, 0.187890619f, 0.194921881f, 0.201953113f, 0.208984375f, 0.216015637f, \
    0.223046869f, 0.230078131f, 0.237109393f, 0.244140625f, 0.251171887f, 0.258203119f, 0.265234381f, 0.272265643f, \
    0.279296875f, 0.286328137f, 0.293359399f, 0.300390631f, 0.307421893f, 0.314453125f, 0.321484387f, 0.328515619f, \
    0.335546851f, 0.342578113f, 0.349609375f, 0.356640607f, 0.363671869f, 0.370703101f, 0.377734363f, 0.384765625f, \
    0.391796887f, 0.398828119f, 0.405859351f, 0.412890613f, 0.419921875f, 0.426953107f, 0.433984369f, 0.441015631f, \
    0.448046863f, 0.455078125f, 0.462109387f, 0.469140619f, 0.476171881f, 0.483203113f, 0.490234375f, 0.497265607f, \
    0.504296899f, 0.511328101f, 0.518359303f, 0.525390625f, 0.532421827f, 0.539453149f, 0.546484351f, 0.553515673f, \
    0.560546875f, 0.567578137f, 0.574609399f, 0.581640601f, 0.588671923f, 0.595703125f, 0.602734387f, 0.609765649f, \
    0.616796851f, 0.623828113f, 0.630859375f, 0.637890577f, 0.644921899f, 0.651953101f, 0.658984423f, 0.666015625f, \
    0.673046947f, 0.680078149f, 0.687109351f, 0.694140673f, 0.701171875f, 0.708203197f, 0.715234399f, 0.722265601f, \
    0.729296923f, 0.736328125f, 0.743359327f, 0.750390649f, 0.757421851f, 0.764453173f, 0.771484375f, 0.778515577f, \
    0.785546899f, 0.792578101f, 0.799609303f, 0.806640625f, 0.813671827f, 0.820703149f, 0.827734351f, 0.834765673f, \
    0.841796875f, 0.848828137f, 0.855859399f, 0.862890601f, 0.869921923f, 0.876953125f, 0.883984387f, 0.891015649f, \
    0.898046851f, 0.905078113f, 0.912109375f, 0.919140577f, 0.926171899f, 0.933203101f, 0.940234423f, 0.947265625f, \
    0.954296947f, 0.961328149f, 0.968359351f, 0.975390673f, 0.982421875f, 0.989453197f, 0.996484399f, 1.0f

/* Which map: the first moment's (signed) or the second's (unsigned). */
enum { GLM_Q8_SIGNED = 0, GLM_Q8_UNSIGNED = 1 };

extern const float glm_q8_signed_map[256];
extern const float glm_q8_unsigned_map[256];
static inline const float *glm_q8_map(int kind) { return kind == GLM_Q8_SIGNED ? glm_q8_signed_map : glm_q8_unsigned_map; }
/* The code of 0.0: 127 (signed), 0 (unsigned). */
static inline uint8_t glm_q8_zero_code(int kind) { return kind == GLM_Q8_SIGNED ? 127 : 0; }
/* Blocks of absmax for n elements. */
static inline size_t glm_q8_blocks(size_t n) { return (n + GLM_ADAM8_BLOCK - 1) / GLM_ADAM8_BLOCK; }

/* ---- per-element arithmetic, one text for the host and the device ---- */
#ifdef __CUDACC__
#define GLM_Q8_UNROLL _Pragma("unroll")
#define GLM_Q8_FN static __host__ __device__ __forceinline__
#if defined(__CUDA_ARCH__)
#define GLM_Q8_MUL(a, b) __fmul_rn((a), (b))
#define GLM_Q8_ADD(a, b) __fadd_rn((a), (b))
#define GLM_Q8_DIV(a, b) __fdiv_rn((a), (b))
#define GLM_Q8_SQRT(a) __fsqrt_rn(a)
#endif
#else
#define GLM_Q8_FN static inline
#if defined(__GNUC__) && !defined(__clang__)
#define GLM_Q8_UNROLL _Pragma("GCC unroll 8")
#endif
#endif
#ifndef GLM_Q8_UNROLL
#define GLM_Q8_UNROLL
#endif
#ifndef GLM_Q8_MUL
#define GLM_Q8_MUL(a, b) ((a) * (b))
#define GLM_Q8_ADD(a, b) ((a) + (b))
#define GLM_Q8_DIV(a, b) ((a) / (b))
#define GLM_Q8_SQRT(a) sqrtf(a)
#endif

/* bitsandbytes' quantize_2D<SIGNED> over a 256-entry map: the code of x (a normalised value),
 * without the sign fix. Branch-free selects, so a loop over it can vectorise. */
GLM_Q8_FN uint8_t glm_q8_search(const float *code, int is_signed, float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = is_signed ? -1.0f : 0.0f, upper = 1.0f, val = code[127];
    GLM_Q8_UNROLL
    for (int k = 6; k >= 0; k--) { /* steps i = 64, 32, ..., 1 */
        int i = 1 << k, gt = x > val;
        lower_pivot = gt ? pivot : lower_pivot;
        lower = gt ? val : lower;
        upper_pivot = gt ? upper_pivot : pivot;
        upper = gt ? upper : val;
        pivot += gt ? i : -i;
        val = code[pivot];
    }
    int r;
    if (x > val) r = x > GLM_Q8_MUL(GLM_Q8_ADD(upper, val), 0.5f) ? upper_pivot : pivot;
    else r = x < GLM_Q8_MUL(GLM_Q8_ADD(lower, val), 0.5f) ? lower_pivot : pivot;
    return (uint8_t)r;
}

/* The code of a moment value in a block of absmax amax over glm_q8_map(kind) (bitsandbytes'
 * quantization step of the optimizer, its sign fix on the signed map included: there the
 * code's value is negative exactly for codes below 127, so signbit(code[c]) is c < 127). */
GLM_Q8_FN uint8_t glm_q8_encode(const float *code, int kind, float value, float amax) {
    uint8_t c = glm_q8_search(code, kind == GLM_Q8_SIGNED, GLM_Q8_DIV(value, amax));
    if (kind == GLM_Q8_SIGNED && (c < 127) != (signbit(value) != 0)) c = (uint8_t)(value > 0.0f ? c + 1 : c - 1);
    return c;
}

GLM_Q8_FN float glm_q8_decode(const float *code, uint8_t c, float amax) { return GLM_Q8_MUL(code[c], amax); }

/* The step's scalars, computed once on the host by every backend: step_size = -lr sqrt(bc2) /
 * bc1, c2eps = sqrt(bc2) eps, decay = 1 - lr wd (the factor of an element that decays). */
typedef struct glm_adam8_scalars { float b1, b2, omb1, omb2, step_size, c2eps, decay; } glm_adam8_scalars;
static inline glm_adam8_scalars glm_adam8_prepare(float lr, float b1, float b2, float eps, float wd, float bc1, float bc2) {
    float c2 = sqrtf(bc2);
    glm_adam8_scalars s = {b1, b2, 1.0f - b1, 1.0f - b2, (-lr * c2) / bc1, c2 * eps, 1.0f - lr * wd};
    return s;
}
/* m = m_old * b1 + (1-b1) g;  v = v_old * b2 + ((1-b2) g) g  (m_old, v_old decoded) */
GLM_Q8_FN float glm_adam8_m(const glm_adam8_scalars *s, float m_old, float g) {
    return GLM_Q8_ADD(GLM_Q8_MUL(m_old, s->b1), GLM_Q8_MUL(s->omb1, g));
}
GLM_Q8_FN float glm_adam8_v(const glm_adam8_scalars *s, float v_old, float g) {
    return GLM_Q8_ADD(GLM_Q8_MUL(v_old, s->b2), GLM_Q8_MUL(GLM_Q8_MUL(s->omb2, g), g));
}
/* p + step_size * (m / (sqrt(v) + sqrt(bc2) eps)), then times f: s->decay for an element that
 * decays, else 1 (an exact identity: x * 1 = x in IEEE arithmetic, so no branch is needed) */
GLM_Q8_FN float glm_adam8_param(const glm_adam8_scalars *s, float p, float m, float v, float f) {
    p = GLM_Q8_ADD(p, GLM_Q8_MUL(s->step_size, GLM_Q8_DIV(m, GLM_Q8_ADD(GLM_Q8_SQRT(v), s->c2eps))));
    return GLM_Q8_MUL(p, f);
}
GLM_Q8_FN float glm_adam8_factor(const glm_adam8_scalars *s, int decays) { return decays ? s->decay : 1.0f; }
/* Whether element j of a call with flat offset flat0 decays (backend.h adamw8). */
GLM_Q8_FN int glm_adam8_decays(const uint8_t *bits, size_t flat0, size_t j) {
    size_t k = (flat0 + j) >> 6;
    return (bits[k >> 3] >> (k & 7)) & 1;
}

/* ---- whole states (host memory), for checkpoints and conversions ---- */
/* out[j] = map[q[j]] * absmax[j / GLM_ADAM8_BLOCK], j < n */
void glm_q8_dequantize_state(int kind, float *out, const uint8_t *q, const float *absmax, size_t n);
/* absmax[b] = max |x| over block b's elements, q[j] = glm_q8_encode(x[j], absmax[b]): the
 * state adamw8 would store for unquantized moments x. Lossy: an fp32 moment comes back within
 * half a code step of its block; dequantize then quantize again need not give the same bytes
 * (the signed map has no -1: a block whose largest |m| is negative shrinks), so a checkpoint of
 * this run keeps codes and absmax as they are. */
void glm_q8_quantize_state(int kind, uint8_t *q, float *absmax, const float *x, size_t n);

#ifdef __cplusplus
}
#endif
#endif
