/* DoRA's three ops on the CPU (backend.h dora_norm, dora_scale, dora_bwd): the oracle the CUDA
 * kernels are compared with. Sums run in double, in a fixed order. */
#include <math.h>
#include <stdlib.h>
#include "backend/cpu/cpu_ops.h"
#include "core/err.h"

void cpu_dora_norm(float *n, const float *w, const float *a, const float *b, float scale, int OC, int C, int r) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < OC; j++) {
        const float *bj = b + (size_t)j * r;
        const float *wj = w + (size_t)j * C;
        double ss = 0;
        for (int k = 0; k < C; k++) {
            float d = 0; /* (B A)[j, k] */
            for (int q = 0; q < r; q++) d += bj[q] * a[(size_t)q * C + k];
            float v = wj[k] + scale * d;
            ss += (double)v * v;
        }
        n[j] = (float)sqrt(ss);
    }
}

void cpu_dora_scale(float *out, const float *z, const float *mag, const float *n, float shift, const float *bias,
                    const float *res, float res_scale, int N, int OC) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++)
        for (int j = 0; j < OC; j++) {
            size_t i = (size_t)t * OC + j;
            float v = (mag[j] / n[j] - shift) * z[i] + (bias ? bias[j] : 0.0f);
            out[i] = res ? v + res_scale * res[i] : v;
        }
}

void cpu_dora_bwd(float *dz, float *dmag, const float *dout, const float *z, const float *mag, const float *n, float shift,
                  int N, int OC) {
#pragma omp parallel for schedule(static)
    for (int j = 0; j < OC; j++) {
        double s = 0;
        float c = mag[j] / n[j] - shift;
        for (int t = 0; t < N; t++) {
            size_t i = (size_t)t * OC + j;
            s += (double)dout[i] * z[i];
            dz[i] = c * dout[i];
        }
        dmag[j] += (float)(s / n[j]);
    }
}
