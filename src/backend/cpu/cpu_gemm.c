#include "backend/cpu/cpu_gemm.h"
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

/* Blocking: a C tile of MC x NC is owned by one thread; K is walked in KC slices. Panels are
 * packed so the micro-kernel streams contiguous memory: A in MR-row slivers, B in NR-column
 * slivers. MR x NR = 6 x 16 floats = 12 AVX2 accumulators, which gcc keeps in registers. */
enum { MR = 6, NR = 16, MC = 96, NC = 256, KC = 256 };

static inline float a_at(int tA, const float *A, int lda, int i, int k) { return tA ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k]; }
static inline float b_at(int tB, const float *B, int ldb, int k, int j) { return tB ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j]; }

/* Packs A[i0:i0+mc, k0:k0+kc] into slivers of MR rows: ap[s][k][r], zero-padded. */
static void pack_a(float *ap, int tA, const float *A, int lda, int i0, int mc, int k0, int kc) {
    for (int s = 0; s < mc; s += MR)
        for (int k = 0; k < kc; k++)
            for (int r = 0; r < MR; r++)
                *ap++ = (s + r < mc) ? a_at(tA, A, lda, i0 + s + r, k0 + k) : 0.0f;
}

/* Packs B[k0:k0+kc, j0:j0+nc] into slivers of NR columns: bp[s][k][c], zero-padded. */
static void pack_b(float *bp, int tB, const float *B, int ldb, int k0, int kc, int j0, int nc) {
    for (int s = 0; s < nc; s += NR)
        for (int k = 0; k < kc; k++) {
            if (!tB && s + NR <= nc) {
                memcpy(bp, B + (size_t)(k0 + k) * ldb + j0 + s, NR * sizeof(float));
                bp += NR;
            } else {
                for (int c = 0; c < NR; c++) *bp++ = (s + c < nc) ? b_at(tB, B, ldb, k0 + k, j0 + s + c) : 0.0f;
            }
        }
}

/* acc[MR][NR] = sum_k ap[k][r] * bp[k][c]. With AVX2+FMA: 12 ymm accumulators (6 rows x 2
 * vectors of 8), one broadcast of A per row and two loads of B per k. */
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline void micro_kernel(int kc, const float *restrict ap, const float *restrict bp, float acc[MR][NR]) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int k = 0; k < kc; k++) {
        const float *a = ap + k * MR;
        __m256 b0 = _mm256_loadu_ps(bp + k * NR), b1 = _mm256_loadu_ps(bp + k * NR + 8), av;
        av = _mm256_broadcast_ss(a + 0); c00 = _mm256_fmadd_ps(av, b0, c00); c01 = _mm256_fmadd_ps(av, b1, c01);
        av = _mm256_broadcast_ss(a + 1); c10 = _mm256_fmadd_ps(av, b0, c10); c11 = _mm256_fmadd_ps(av, b1, c11);
        av = _mm256_broadcast_ss(a + 2); c20 = _mm256_fmadd_ps(av, b0, c20); c21 = _mm256_fmadd_ps(av, b1, c21);
        av = _mm256_broadcast_ss(a + 3); c30 = _mm256_fmadd_ps(av, b0, c30); c31 = _mm256_fmadd_ps(av, b1, c31);
        av = _mm256_broadcast_ss(a + 4); c40 = _mm256_fmadd_ps(av, b0, c40); c41 = _mm256_fmadd_ps(av, b1, c41);
        av = _mm256_broadcast_ss(a + 5); c50 = _mm256_fmadd_ps(av, b0, c50); c51 = _mm256_fmadd_ps(av, b1, c51);
    }
    _mm256_storeu_ps(acc[0], c00); _mm256_storeu_ps(acc[0] + 8, c01);
    _mm256_storeu_ps(acc[1], c10); _mm256_storeu_ps(acc[1] + 8, c11);
    _mm256_storeu_ps(acc[2], c20); _mm256_storeu_ps(acc[2] + 8, c21);
    _mm256_storeu_ps(acc[3], c30); _mm256_storeu_ps(acc[3] + 8, c31);
    _mm256_storeu_ps(acc[4], c40); _mm256_storeu_ps(acc[4] + 8, c41);
    _mm256_storeu_ps(acc[5], c50); _mm256_storeu_ps(acc[5] + 8, c51);
}
#else
static inline void micro_kernel(int kc, const float *restrict ap, const float *restrict bp, float acc[MR][NR]) {
    float c[MR][NR] = {{0}};
    for (int k = 0; k < kc; k++) {
        const float *a = ap + k * MR, *b = bp + k * NR;
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < NR; j++) c[r][j] += a[r] * b[j];
    }
    memcpy(acc, c, sizeof c);
}
#endif

void cpu_sgemm(int tA, int tB, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    int tiles_m = (M + MC - 1) / MC, tiles_n = (N + NC - 1) / NC;
#pragma omp parallel
    {
        float *ap = glm_malloc(sizeof(float) * MC * KC);
        float *bp = glm_malloc(sizeof(float) * KC * NC);
#pragma omp for schedule(static)
        for (int t = 0; t < tiles_m * tiles_n; t++) {
            int i0 = (t / tiles_n) * MC, j0 = (t % tiles_n) * NC;
            int mc = M - i0 < MC ? M - i0 : MC, nc = N - j0 < NC ? N - j0 : NC;
            /* first scale the C tile by beta (beta == 0 overwrites, so NaN garbage never leaks) */
            for (int i = 0; i < mc; i++) {
                float *crow = C + (size_t)(i0 + i) * ldc + j0;
                if (beta == 0.0f) memset(crow, 0, sizeof(float) * nc);
                else if (beta != 1.0f) for (int j = 0; j < nc; j++) crow[j] *= beta;
            }
            for (int k0 = 0; k0 < K; k0 += KC) {
                int kc = K - k0 < KC ? K - k0 : KC;
                pack_a(ap, tA, A, lda, i0, mc, k0, kc);
                pack_b(bp, tB, B, ldb, k0, kc, j0, nc);
                for (int s = 0; s < mc; s += MR)
                    for (int u = 0; u < nc; u += NR) {
                        float acc[MR][NR];
                        micro_kernel(kc, ap + (size_t)s * kc, bp + (size_t)u * kc, acc);
                        int rm = mc - s < MR ? mc - s : MR, rn = nc - u < NR ? nc - u : NR;
                        for (int r = 0; r < rm; r++) {
                            float *crow = C + (size_t)(i0 + s + r) * ldc + j0 + u;
                            for (int j = 0; j < rn; j++) crow[j] += alpha * acc[r][j];
                        }
                    }
            }
        }
        free(ap);
        free(bp);
    }
}
