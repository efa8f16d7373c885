/* backend.h adamw8 on the GPU: bitsandbytes' 8-bit blockwise AdamW. One thread block of 256
 * threads per state block of GLM_ADAM8_BLOCK = 2048 elements, 8 elements per thread, strided so
 * that every load and store of a warp is contiguous; the moments stay in registers between the
 * block's max reduction (warp shuffles, then 8 warp maxima in shared memory: max is exact, so the
 * result does not depend on the order) and the parameter update and encoding. Both maps are
 * copied from constant memory into shared memory (the search's lookups diverge across a warp).
 * The per-element arithmetic is backend/quant8.h's, the same text the CPU op runs, with every
 * product, sum, quotient and square root an explicitly rounded intrinsic (nothing contracts into
 * an FMA), so parameters, master, codes and absmax equal the CPU op's bit for bit. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/quant8.h"

__constant__ float c_q8_signed[256] = {GLM_DYN_CODE_INIT};
__constant__ float c_q8_unsigned[256] = {GLM_Q8_UNSIGNED_INIT};

enum { A8_THREADS = 256, A8_PER = GLM_ADAM8_BLOCK / A8_THREADS, A8_WARPS = A8_THREADS / 32 };

template <typename T>
__global__ void __launch_bounds__(A8_THREADS) adamw8_kernel(T *__restrict__ param, float *__restrict__ master,
                                                            const T *__restrict__ grad, uint8_t *__restrict__ qm,
                                                            uint8_t *__restrict__ qv, float *__restrict__ absm,
                                                            float *__restrict__ absv, size_t n,
                                                            const uint8_t *__restrict__ bits, size_t flat0,
                                                            glm_adam8_scalars sc, float gs) {
    __shared__ float cs[256], cu[256];
    __shared__ float wmax[2][A8_WARPS];
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    cs[t] = c_q8_signed[t];
    cu[t] = c_q8_unsigned[t];
    const glm_adam8_scalars s = sc;
    const size_t b = blockIdx.x, lo = b * GLM_ADAM8_BLOCK;
    const float am = absm[b], av = absv[b];
    __syncthreads();
    float m[A8_PER], v[A8_PER], nm = 0.0f, nv = 0.0f;
#pragma unroll
    for (int k = 0; k < A8_PER; k++) {
        const size_t j = lo + (size_t)k * A8_THREADS + t;
        m[k] = 0.0f;
        v[k] = 0.0f;
        if (j < n) {
            const float g = __fmul_rn(to_f(grad[j]), gs);
            m[k] = glm_adam8_m(&s, glm_q8_decode(cs, qm[j], am), g);
            v[k] = glm_adam8_v(&s, glm_q8_decode(cu, qv[j], av), g);
            nm = fmaxf(nm, fabsf(m[k]));
            nv = fmaxf(nv, fabsf(v[k]));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        nm = fmaxf(nm, __shfl_xor_sync(0xffffffffu, nm, o));
        nv = fmaxf(nv, __shfl_xor_sync(0xffffffffu, nv, o));
    }
    if (lane == 0) {
        wmax[0][warp] = nm;
        wmax[1][warp] = nv;
    }
    __syncthreads(); /* also: every thread has read absm[b], absv[b] before thread 0 writes them */
    nm = wmax[0][0];
    nv = wmax[1][0];
#pragma unroll
    for (int w = 1; w < A8_WARPS; w++) {
        nm = fmaxf(nm, wmax[0][w]);
        nv = fmaxf(nv, wmax[1][w]);
    }
#pragma unroll
    for (int k = 0; k < A8_PER; k++) {
        const size_t j = lo + (size_t)k * A8_THREADS + t;
        if (j < n) {
            float p = master ? master[j] : to_f(param[j]);
            p = glm_adam8_param(&s, p, m[k], v[k], glm_adam8_factor(&s, glm_adam8_decays(bits, flat0, j)));
            if (master) master[j] = p;
            param[j] = from_f<T>(p);
            qm[j] = glm_q8_encode(cs, GLM_Q8_SIGNED, m[k], nm);
            qv[j] = glm_q8_encode(cu, GLM_Q8_UNSIGNED, v[k], nv);
        }
    }
    if (t == 0) {
        absm[b] = nm;
        absv[b] = nv;
    }
}

extern "C" void glmk_adamw8(glm_dtype dt, void *param, float *master, const void *grad, uint8_t *qm, uint8_t *qv,
                            float *absm, float *absv, size_t n, const uint8_t *decay_bits, size_t flat0,
                            const struct glm_adam8_scalars *s, float grad_scale, cudaStream_t st) {
    if (n == 0) return;
    const size_t nb = glm_q8_blocks(n);
    GLMK_DISPATCH(dt, adamw8_kernel<T><<<(unsigned)nb, A8_THREADS, 0, st>>>(
                          (T *)param, master, (const T *)grad, qm, qv, absm, absv, n, decay_bits, flat0, *s, grad_scale));
    GLMK_CHECK_LAUNCH();
}
