/* Cache-blocked, OpenMP-parallel single-precision GEMM (row-major):
 *   C[M,N] = alpha * op(A)[M,K] @ op(B)[K,N] + beta * C
 * op(A)(i,k) = transA ? A[k*lda + i] : A[i*lda + k]; likewise B.
 * Deterministic: every element of C is summed by one thread in a fixed k order, so results do
 * not depend on the number of threads (needed for bit-exact resume). */
#ifndef GLM_CPU_GEMM_H
#define GLM_CPU_GEMM_H
void cpu_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
               const float *B, int ldb, float beta, float *C, int ldc);
#endif
