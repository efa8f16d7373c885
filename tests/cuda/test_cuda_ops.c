/* Every CUDA op against its CPU twin (backend/cpu/cpu_ops.c) on fresh random inputs of several
 * shapes, for storage fp32 (tolerance ~1e-5), bf16 and fp16 (per-tensor tolerances). Inputs
 * are rounded to the storage dtype first, so both sides compute on the same numbers; outputs
 * are poisoned with NaN first, so an element the kernel never writes fails the check.
 * Attention runs both the tensor-core path (bf16/fp16, head size 64/128) and the SIMT path.
 * Quantized weights (INT8/INT4/NF4): dequantize bit-identical to the CPU's weights rounded to S,
 * qmatmul_fwd against its CPU twin. 8-bit blockwise AdamW (adamw8) bit for bit against its twin.
 *   test_cuda_ops [--quick] [--only f32|bf16|f16|bf16simt|bf16det|bf16mma|f16mma] [--quant] [--attention]
 * (--quick: small shapes, for compute-sanitizer runs; --only: one variant, to isolate a crash;
 * --quant: the quantized-weight ops only. GLM_QUANT_BENCH=1: afterwards, the bandwidth of
 * dequantize and of the decode GEMV on ChatGLM-6B's shapes, bf16, against cuBLAS's bf16 GEMV;
 * GLM_ADAM8_BENCH=1: the time of adamw8 and adamw on 2^28 bf16 parameters) */
#include <math.h>
#include <stdlib.h>
#include "backend/cpu/cpu_adam8.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/quant.h"
#include "backend/quant8.h"
#include "backend/svd.h"
#include "cuda_test_util.h"

typedef struct {
    glm_backend *be;
    glm_dtype dt;
    const char *tag; /* dtype name, or an attention path's variant ("bf16simt", "bf16det", "bf16mma", "f16mma") */
    test_counts *tc;
    glm_rng rng;
} ctx;

static double tol(const ctx *c, double f32, double bf16, double f16) {
    return c->dt == GLM_F32 ? f32 : c->dt == GLM_BF16 ? bf16 : f16;
}

#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)

/* ---------------------------------------------------------------- GEMM */

static void t_matmul(ctx *c, int N, int C, int OC) {
    glm_backend *be = c->be;
    char name[128];
    float *inp = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f), *w = rnd(&c->rng, c->dt, (size_t)OC * C, 0.05f);
    float *bias = rnd(&c->rng, c->dt, OC, 0.1f), *ref = malloc(sizeof(float) * N * OC);
    void *di = up_s(be, inp, (size_t)N * C), *dw = up_s(be, w, (size_t)OC * C), *db = up_s(be, bias, OC);
    void *dout = be->alloc(be, (size_t)N * OC * glm_dtype_size(c->dt));
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        cpu_matmul_fwd(ref, inp, w, with_bias ? bias : NULL, N, C, OC);
        poison(be, dout, (size_t)N * OC, 0);
        be->matmul_fwd(be, dout, di, dw, with_bias ? db : NULL, N, C, OC);
        float *got = down_s(be, dout, (size_t)N * OC);
        check_close(c->tc, NAME("matmul_fwd%s_%s_%dx%dx%d", with_bias ? "_bias" : "", c->tag, N, C, OC), got, ref,
                    (size_t)N * OC, tol(c, 1e-5, 1e-2, 2e-3));
        free(got);
    }
    if (c->dt == GLM_F32 && C >= 64) { /* --tf32: within TF32's rounding of the inputs, and not the fp32 result */
        cpu_matmul_fwd(ref, inp, w, bias, N, C, OC);
        be->matmul_fwd(be, dout, di, dw, db, N, C, OC);
        float *strict = down_s(be, dout, (size_t)N * OC);
        be->allow_tf32 = 1;
        be->matmul_fwd(be, dout, di, dw, db, N, C, OC);
        be->allow_tf32 = 0;
        float *got = down_s(be, dout, (size_t)N * OC);
        size_t differ = 0;
        for (size_t i = 0; i < (size_t)N * OC; i++) differ += got[i] != strict[i];
        check_close(c->tc, NAME("matmul_fwd_tf32_%dx%dx%d", N, C, OC), got, ref, (size_t)N * OC, 5e-3);
        if (N >= 64) /* a product of a row or two may run on a kernel without tensor cores: TF32 allows, not forces */
            TEST_CHECK(c->tc, NAME("matmul_fwd_tf32_takes_effect_%dx%dx%d", N, C, OC), differ > 0,
                       "all %d x %d outputs equal the fp32 product's", N, OC);
        free(strict); free(got);
    }
    /* out = inp w^T + bias + s res: res a separate tensor, and res = out (an adapter's add) */
    float *res = rnd(&c->rng, c->dt, (size_t)N * OC, 1.0f);
    void *dres = up_s(be, res, (size_t)N * OC);
    for (int k = 0; k < 4; k++) {
        int with_bias = k & 1, inplace = k >> 1;
        float s = inplace ? 1.0f : 7.48331f; /* sqrt(56): GLM v1's residual scale */
        cpu_matmul_fwd(ref, inp, w, with_bias ? bias : NULL, N, C, OC);
        cpu_scale_add(ref, s, res, ref, (size_t)N * OC);
        if (inplace) be->copy(be, dout, dres, (size_t)N * OC * glm_dtype_size(c->dt));
        else poison(be, dout, (size_t)N * OC, 0);
        be->matmul_fwd_add(be, dout, di, dw, with_bias ? db : NULL, inplace ? dout : dres, s, N, C, OC);
        float *got = down_s(be, dout, (size_t)N * OC);
        check_close(c->tc, NAME("matmul_fwd_add%s%s_%s_%dx%dx%d", with_bias ? "_bias" : "", inplace ? "_inplace" : "", c->tag,
                                N, C, OC), got, ref, (size_t)N * OC, tol(c, 1e-5, 1e-2, 2e-3) * (inplace ? 1 : 4));
        free(got);
    }
    be->free(be, dres);
    free(res);
    /* the first MLP product with its GELU in the epilogue (act, and the pre-activation kept):
     * the CPU's product, then its GELU on the unrounded sums */
    float *rpre = malloc(sizeof(float) * N * OC);
    void *dpre = be->alloc(be, (size_t)N * OC * glm_dtype_size(c->dt));
    for (int with_bias = 0; with_bias < 2 && be->matmul_fwd_gelu; with_bias++) {
        cpu_matmul_fwd(rpre, inp, w, with_bias ? bias : NULL, N, C, OC);
        cpu_gelu_fwd(ref, rpre, (size_t)N * OC);
        poison(be, dout, (size_t)N * OC, 0);
        poison(be, dpre, (size_t)N * OC, 0);
        be->matmul_fwd_gelu(be, dout, dpre, di, dw, with_bias ? db : NULL, N, C, OC);
        float *got = down_s(be, dout, (size_t)N * OC), *gotp = down_s(be, dpre, (size_t)N * OC);
        check_close(c->tc, NAME("matmul_fwd_gelu%s_%s_%dx%dx%d", with_bias ? "_bias" : "", c->tag, N, C, OC), got, ref,
                    (size_t)N * OC, tol(c, 1e-5, 1e-2, 2e-3));
        check_close(c->tc, NAME("matmul_fwd_gelu%s_pre_%s_%dx%dx%d", with_bias ? "_bias" : "", c->tag, N, C, OC), gotp, rpre,
                    (size_t)N * OC, tol(c, 1e-5, 1e-2, 2e-3));
        free(got); free(gotp);
    }
    be->free(be, dpre);
    free(rpre);
    /* the second MLP product's input gradient through GELU's derivative at pre [N, C] */
    if (be->matmul_bwd_dgelu) {
        float *g = rnd(&c->rng, c->dt, (size_t)N * OC, 1.0f), *pre = rnd(&c->rng, c->dt, (size_t)N * C, 1.5f);
        float *ri = malloc(sizeof(float) * N * C);
        cpu_matmul_bwd(ri, NULL, NULL, g, inp, w, N, C, OC, 0);
        cpu_gelu_bwd(ri, pre, ri, (size_t)N * C);
        void *dg = up_s(be, g, (size_t)N * OC), *dp = up_s(be, pre, (size_t)N * C);
        void *dgi = be->alloc(be, (size_t)N * C * glm_dtype_size(c->dt));
        poison(be, dgi, (size_t)N * C, 0);
        be->matmul_bwd_dgelu(be, dgi, dg, dw, dp, N, C, OC);
        float *got = down_s(be, dgi, (size_t)N * C);
        /* fp32: the epilogue's derivative rounds a little apart from the CPU's (1.1e-5 seen) */
        check_close(c->tc, NAME("matmul_bwd_dgelu_%s_%dx%dx%d", c->tag, N, C, OC), got, ri, (size_t)N * C,
                    tol(c, 3e-5, 1e-2, 2e-3));
        be->free(be, dg); be->free(be, dp); be->free(be, dgi);
        free(g); free(pre); free(ri); free(got);
    }
    /* the input gradient with a residual's gradient added in the epilogue: res a separate
     * tensor, and res = dinp itself */
    for (int inplace = 0; inplace < 2 && be->matmul_bwd_add; inplace++) {
        float s = inplace ? 1.0f : 7.48331f;
        float *g = rnd(&c->rng, c->dt, (size_t)N * OC, 1.0f), *res = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f);
        float *ri = malloc(sizeof(float) * N * C);
        cpu_matmul_bwd(ri, NULL, NULL, g, inp, w, N, C, OC, 0);
        cpu_scale_add(ri, s, res, ri, (size_t)N * C);
        void *dg = up_s(be, g, (size_t)N * OC), *dres = up_s(be, res, (size_t)N * C);
        void *dgi = inplace ? dres : be->alloc(be, (size_t)N * C * glm_dtype_size(c->dt));
        if (!inplace) poison(be, dgi, (size_t)N * C, 0);
        be->matmul_bwd_add(be, dgi, dg, dw, dres, s, N, C, OC);
        float *got = down_s(be, dgi, (size_t)N * C);
        check_close(c->tc, NAME("matmul_bwd_add%s_%s_%dx%dx%d", inplace ? "_inplace" : "", c->tag, N, C, OC), got, ri,
                    (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3) * (inplace ? 1 : 4));
        if (!inplace) be->free(be, dgi);
        be->free(be, dg); be->free(be, dres);
        free(g); free(res); free(ri); free(got);
    }
    /* backward, accumulating into random gradients */
    float *g = rnd(&c->rng, c->dt, (size_t)N * OC, 1.0f), *gi0 = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f);
    float *gw0 = rnd(&c->rng, c->dt, (size_t)OC * C, 0.1f), *gb0 = rnd(&c->rng, c->dt, OC, 0.1f);
    float *ri = fcopy(gi0, (size_t)N * C), *rw = fcopy(gw0, (size_t)OC * C), *rb = fcopy(gb0, OC);
    cpu_matmul_bwd(ri, rw, rb, g, inp, w, N, C, OC, 1);
    void *dg = up_s(be, g, (size_t)N * OC), *dgi = up_s(be, gi0, (size_t)N * C), *dgw = up_s(be, gw0, (size_t)OC * C);
    void *dgb = up_s(be, gb0, OC);
    be->matmul_bwd(be, dgi, dgw, dgb, dg, di, dw, N, C, OC, 1);
    float *oi = down_s(be, dgi, (size_t)N * C), *ow = down_s(be, dgw, (size_t)OC * C), *ob = down_s(be, dgb, OC);
    check_close(c->tc, NAME("matmul_bwd_dinp_acc_%s_%dx%dx%d", c->tag, N, C, OC), oi, ri, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("matmul_bwd_dw_%s_%dx%dx%d", c->tag, N, C, OC), ow, rw, (size_t)OC * C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("matmul_bwd_dbias_%s_%dx%dx%d", c->tag, N, C, OC), ob, rb, OC, tol(c, 1e-5, 1e-2, 2e-3));
    free(oi);
    /* dinp overwritten (accumulate_dinp = 0), weight and bias gradients skipped */
    cpu_matmul_bwd(ri, NULL, NULL, g, inp, w, N, C, OC, 0);
    poison(be, dgi, (size_t)N * C, 0);
    be->matmul_bwd(be, dgi, NULL, NULL, dg, di, dw, N, C, OC, 0);
    oi = down_s(be, dgi, (size_t)N * C);
    check_close(c->tc, NAME("matmul_bwd_dinp_%s_%dx%dx%d", c->tag, N, C, OC), oi, ri, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    /* both gradients, no bias (LoRA's B side: one pass over dout for the two where C is small) */
    for (int acc = 0; acc < 2; acc++) {
        float *ri2 = fcopy(gi0, (size_t)N * C), *rw2 = fcopy(gw0, (size_t)OC * C);
        cpu_matmul_bwd(ri2, rw2, NULL, g, inp, w, N, C, OC, acc);
        be->upload_f32(be, dgi, gi0, (size_t)N * C);
        be->upload_f32(be, dgw, gw0, (size_t)OC * C);
        be->matmul_bwd(be, dgi, dgw, NULL, dg, di, dw, N, C, OC, acc);
        float *oi2 = down_s(be, dgi, (size_t)N * C), *ow2 = down_s(be, dgw, (size_t)OC * C);
        check_close(c->tc, NAME("matmul_bwd_both%s_dinp_%s_%dx%dx%d", acc ? "_acc" : "", c->tag, N, C, OC), oi2, ri2,
                    (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
        check_close(c->tc, NAME("matmul_bwd_both%s_dw_%s_%dx%dx%d", acc ? "_acc" : "", c->tag, N, C, OC), ow2, rw2,
                    (size_t)OC * C, tol(c, 1e-5, 1e-2, 2e-3));
        free(ri2); free(rw2); free(oi2); free(ow2);
    }
    void *bufs[] = {di, dw, db, dout, dg, dgi, dgw, dgb};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    float *hs[] = {inp, w, bias, ref, g, gi0, gw0, gb0, ri, rw, rb, oi, ow, ob};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* LoRA's down-projection with its input dropout (lora_down, lora_down_bwd) against the CPU's
 * mask_scale + matmul_fwd / matmul_bwd + mask_scale + scale_add it replaces; shapes it does not
 * take must return 0 and leave the outputs alone. */
static void t_lora(ctx *c, int N, int C, int r) {
    glm_backend *be = c->be;
    char name[128];
    size_t nx = (size_t)N * C, nt = (size_t)N * r, na = (size_t)r * C;
    float *x = rnd(&c->rng, c->dt, nx, 1.0f), *a = rnd(&c->rng, c->dt, na, 0.05f), *dt = rnd(&c->rng, c->dt, nt, 1.0f);
    float *da0 = rnd(&c->rng, c->dt, na, 0.1f), *dx0 = rnd(&c->rng, c->dt, nx, 1.0f);
    float *u = malloc(sizeof(float) * nx), *tref = malloc(sizeof(float) * nt), *du = malloc(sizeof(float) * nx);
    void *dx_ = up_s(be, x, nx), *da_ = up_s(be, a, na), *ddt = up_s(be, dt, nt);
    void *dt_out = be->alloc(be, nt * glm_dtype_size(c->dt));
    int P = (int)(16 / glm_dtype_size(c->dt)), takes = r <= 16 && C % P == 0;
    for (int k = 0; k < 2; k++) {
        float p = k ? 0.3f : 0.0f, s = 2.0f;
        uint64_t seed = 777ULL + (uint64_t)N * 31 + k;
        cpu_mask_scale(u, x, nx, 1.0f, p, seed);
        cpu_matmul_fwd(tref, u, a, NULL, N, C, r);
        for (size_t i = 0; i < nt; i++) tref[i] *= s;
        poison(be, dt_out, nt, 0);
        int done = be->lora_down(be, dt_out, dx_, da_, N, C, r, s, p, seed);
        TEST_CHECK(c->tc, NAME("lora_down_takes_%s_%dx%dx%d", c->tag, N, C, r), done == takes, "returned %d", done);
        if (done) {
            float *got = down_s(be, dt_out, nt);
            check_close(c->tc, NAME("lora_down_%s_%s_%dx%dx%d", k ? "dropout" : "plain", c->tag, N, C, r), got, tref, nt,
                        tol(c, 1e-5, 1e-2, 2e-3));
            free(got);
        }
        /* backward: da += dt^T u; dx += mask(dt a) */
        float *rda = fcopy(da0, na), *rdx = fcopy(dx0, nx);
        cpu_matmul_bwd(du, rda, NULL, dt, u, a, N, C, r, 0);
        cpu_mask_scale(du, du, nx, 1.0f, p, seed);
        for (size_t i = 0; i < nx; i++) rdx[i] += du[i];
        void *dda = up_s(be, da0, na), *ddx = up_s(be, dx0, nx);
        done = be->lora_down_bwd(be, dda, ddx, ddt, dx_, da_, N, C, r, p, seed);
        TEST_CHECK(c->tc, NAME("lora_down_bwd_takes_%s_%dx%dx%d", c->tag, N, C, r), done == takes, "returned %d", done);
        float *gda = down_s(be, dda, na), *gdx = down_s(be, ddx, nx);
        if (done) {
            check_close(c->tc, NAME("lora_down_bwd_da_%s_%s_%dx%dx%d", k ? "dropout" : "plain", c->tag, N, C, r), gda, rda, na,
                        tol(c, 1e-5, 1e-2, 2e-3));
            check_close(c->tc, NAME("lora_down_bwd_dx_%s_%s_%dx%dx%d", k ? "dropout" : "plain", c->tag, N, C, r), gdx, rdx, nx,
                        tol(c, 1e-5, 1e-2, 2e-3));
        } else { /* untouched */
            check_close(c->tc, NAME("lora_down_bwd_untouched_%s_%dx%dx%d", c->tag, N, C, r), gda, da0, na, 0);
        }
        free(gda); free(gdx);
        /* da alone, then dx alone (NULL skips) */
        if (takes) {
            be->upload_f32(be, dda, da0, na);
            be->upload_f32(be, ddx, dx0, nx);
            be->lora_down_bwd(be, dda, NULL, ddt, dx_, da_, N, C, r, p, seed);
            be->lora_down_bwd(be, NULL, ddx, ddt, dx_, da_, N, C, r, p, seed);
            gda = down_s(be, dda, na);
            gdx = down_s(be, ddx, nx);
            check_close(c->tc, NAME("lora_down_bwd_da_alone_%s_%dx%dx%d_%d", c->tag, N, C, r, k), gda, rda, na, tol(c, 1e-5, 1e-2, 2e-3));
            check_close(c->tc, NAME("lora_down_bwd_dx_alone_%s_%dx%dx%d_%d", c->tag, N, C, r, k), gdx, rdx, nx, tol(c, 1e-5, 1e-2, 2e-3));
            free(gda); free(gdx);
        }
        be->free(be, dda); be->free(be, ddx);
        free(rda); free(rdx);
    }
    be->free(be, dx_); be->free(be, da_); be->free(be, ddt); be->free(be, dt_out);
    float *hs[] = {x, a, dt, da0, dx0, u, tref, du};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* DoRA: the row norms of W + s B A, the row scale with and without bias and residual (and in
 * place over the residual), and its backward (dz, and dmag accumulated onto a start value) */
static void t_dora(ctx *c, int N, int C, int OC, int r) {
    glm_backend *be = c->be;
    char name[128];
    size_t nw = (size_t)OC * C, nz = (size_t)N * OC;
    float *w = rnd(&c->rng, c->dt, nw, 0.05f), *a = rnd(&c->rng, c->dt, (size_t)r * C, 0.1f);
    float *b = rnd(&c->rng, c->dt, (size_t)OC * r, 0.1f), *z = rnd(&c->rng, c->dt, nz, 1.0f);
    float *mag = rnd(&c->rng, c->dt, OC, 1.0f), *bias = rnd(&c->rng, c->dt, OC, 0.1f);
    float *res = rnd(&c->rng, c->dt, nz, 1.0f), *dout = rnd(&c->rng, c->dt, nz, 1.0f), *dm0 = rnd(&c->rng, c->dt, OC, 0.1f);
    for (int j = 0; j < OC; j++) mag[j] = round_one(c->dt, 1.0f + fabsf(mag[j])); /* representable: both sides scale alike */
    float *n = malloc(sizeof(float) * OC), *ref = malloc(sizeof(float) * nz), *rdm = fcopy(dm0, OC);
    void *dw = up_s(be, w, nw), *da = up_s(be, a, (size_t)r * C), *db = up_s(be, b, (size_t)OC * r);
    void *dz = up_s(be, z, nz), *dmag = up_s(be, mag, OC), *dbias = up_s(be, bias, OC), *dres = up_s(be, res, nz);
    void *ddout = up_s(be, dout, nz), *ddm = up_s(be, dm0, OC), *dout_ = be->alloc(be, nz * glm_dtype_size(c->dt));
    float *dn = be->alloc(be, sizeof(float) * OC);
    cpu_dora_norm(n, w, a, b, 1.5f, OC, C, r);
    be->dora_norm(be, dn, dw, da, db, 1.5f, OC, C, r);
    float *got = down_f(be, dn, OC);
    check_close(c->tc, NAME("dora_norm_%s_%dx%dx%d", c->tag, OC, C, r), got, n, OC, 1e-5); /* float on both sides */
    free(got);
    be->upload(be, dn, n, sizeof(float) * OC); /* the same norms for the rest */
    for (int k = 0; k < 4; k++) { /* plain; bias + residual; bias + residual in place over it; (c - 1) in place */
        int with = k == 1 || k == 2, inplace = k >= 2;
        float shift = k == 3 ? 1.0f : 0.0f, rs = k == 3 ? 1.0f : 7.48331f;
        cpu_dora_scale(ref, z, mag, n, shift, with ? bias : NULL, with || inplace ? res : NULL, rs, N, OC);
        if (inplace) be->copy(be, dout_, dres, nz * glm_dtype_size(c->dt));
        else poison(be, dout_, nz, 0);
        be->dora_scale(be, dout_, dz, dmag, dn, shift, with ? dbias : NULL, inplace ? dout_ : with ? dres : NULL, rs, N, OC);
        got = down_s(be, dout_, nz);
        check_close(c->tc, NAME("dora_scale_%d_%s_%dx%d", k, c->tag, N, OC), got, ref, nz, tol(c, 1e-5, 1e-2, 2e-3));
        free(got);
    }
    for (int k = 0; k < 2; k++) { /* dz = c dout, then (c - 1) dout; dmag accumulates over both calls */
        cpu_dora_bwd(ref, rdm, dout, z, mag, n, (float)k, N, OC);
        poison(be, dout_, nz, 0);
        be->dora_bwd(be, dout_, ddm, ddout, dz, dmag, dn, (float)k, N, OC);
        got = down_s(be, dout_, nz);
        check_close(c->tc, NAME("dora_bwd_dz_shift%d_%s_%dx%d", k, c->tag, N, OC), got, ref, nz, tol(c, 1e-5, 1e-2, 2e-3));
        free(got);
        got = down_s(be, ddm, OC);
        check_close(c->tc, NAME("dora_bwd_dmag_%d_%s_%dx%d", k, c->tag, N, OC), got, rdm, OC, tol(c, 1e-4, 1e-2, 4e-3));
        free(got);
    }
    void *dv[] = {dw, da, db, dz, dmag, dbias, dres, ddout, ddm, dout_, dn};
    for (size_t i = 0; i < sizeof dv / sizeof *dv; i++) be->free(be, dv[i]);
    float *hs[] = {w, a, b, z, mag, bias, res, dout, dm0, n, ref, rdm};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* ---------------------------------------------------------------- embedding, rows */

static void t_embedding(ctx *c, int N, int H, int V) {
    glm_backend *be = c->be;
    char name[128];
    int32_t *ids = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)glm_rng_below(&c->rng, V);
    float *wte = rnd(&c->rng, c->dt, (size_t)V * H, 1.0f), *ref = malloc(sizeof(float) * N * H);
    cpu_embedding_fwd(ref, ids, wte, N, H);
    void *dids = up_raw(be, ids, sizeof(int32_t) * N), *dwte = up_s(be, wte, (size_t)V * H);
    void *dout = be->alloc(be, (size_t)N * H * glm_dtype_size(c->dt));
    poison(be, dout, (size_t)N * H, 0);
    be->embedding_fwd(be, dout, dids, dwte, N, H);
    float *got = down_s(be, dout, (size_t)N * H);
    check_close(c->tc, NAME("embedding_fwd_%s_%dx%d", c->tag, N, H), got, ref, (size_t)N * H, 0);
    float *g = rnd(&c->rng, c->dt, (size_t)N * H, 1.0f), *dw0 = rnd(&c->rng, c->dt, (size_t)V * H, 0.1f);
    float *rw = fcopy(dw0, (size_t)V * H);
    cpu_embedding_bwd(rw, g, ids, N, H, V);
    void *dg = up_s(be, g, (size_t)N * H), *ddw = up_s(be, dw0, (size_t)V * H);
    be->embedding_bwd(be, ddw, dg, dids, N, H, V);
    float *ow = down_s(be, ddw, (size_t)V * H);
    check_close(c->tc, NAME("embedding_bwd_%s_%dx%dx%d", c->tag, N, H, V), ow, rw, (size_t)V * H, tol(c, 1e-6, 1e-2, 2e-3));
    /* gather / scatter rows with the same ids as row indices into a [V, H] table */
    int R = N < V ? N : V;
    int32_t *perm = malloc(sizeof(int32_t) * V);
    for (int i = 0; i < V; i++) perm[i] = i;
    glm_rng_shuffle_i32(&c->rng, perm, V); /* distinct rows: scatter targets must not repeat */
    void *dperm = up_raw(be, perm, sizeof(int32_t) * R);
    float *rg = malloc(sizeof(float) * R * H);
    cpu_gather_rows(rg, wte, perm, R, H);
    poison(be, dout, (size_t)R * H, 0);
    be->gather_rows(be, dout, dwte, dperm, R, H);
    free(got);
    got = down_s(be, dout, (size_t)R * H);
    check_close(c->tc, NAME("gather_rows_%s_%dx%d", c->tag, R, H), got, rg, (size_t)R * H, 0);
    float *rs = fcopy(dw0, (size_t)V * H);
    cpu_scatter_rows(rs, g, perm, R, H);
    be->upload_f32(be, ddw, dw0, (size_t)V * H);
    be->scatter_rows(be, ddw, dg, dperm, R, H);
    free(ow);
    ow = down_s(be, ddw, (size_t)V * H);
    check_close(c->tc, NAME("scatter_rows_%s_%dx%d", c->tag, R, H), ow, rs, (size_t)V * H, 0);
    void *bufs[] = {dids, dwte, dout, dg, ddw, dperm};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    void *hs[] = {ids, wte, ref, got, g, dw0, rw, ow, perm, rg, rs};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* ---------------------------------------------------------------- LayerNorm */

static void t_layernorm(ctx *c, int N, int C) {
    glm_backend *be = c->be;
    char name[128];
    float *x = rnd(&c->rng, c->dt, (size_t)N * C, 2.0f), *w = rnd(&c->rng, c->dt, C, 0.2f), *b = rnd(&c->rng, c->dt, C, 0.1f);
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = round_one(c->dt, x[i] + 0.5f); /* a mean to subtract */
    for (int i = 0; i < C; i++) w[i] = round_one(c->dt, w[i] + 1.0f);
    float *ref = malloc(sizeof(float) * N * C), *rm = malloc(sizeof(float) * N), *rr = malloc(sizeof(float) * N);
    cpu_layernorm_fwd(ref, rm, rr, x, w, b, N, C, 1e-5f);
    void *dx = up_s(be, x, (size_t)N * C), *dw = up_s(be, w, C), *db = up_s(be, b, C);
    void *dout = be->alloc(be, (size_t)N * C * glm_dtype_size(c->dt));
    float *dm = be->alloc(be, sizeof(float) * N), *dr = be->alloc(be, sizeof(float) * N);
    poison(be, dout, (size_t)N * C, 0);
    poison(be, dm, N, 1);
    poison(be, dr, N, 1);
    be->layernorm_fwd(be, dout, dm, dr, dx, dw, db, N, C, 1e-5f);
    float *got = down_s(be, dout, (size_t)N * C), *gm = down_f(be, dm, N), *gr = down_f(be, dr, N);
    check_close(c->tc, NAME("layernorm_fwd_%s_%dx%d", c->tag, N, C), got, ref, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("layernorm_mean_%s_%dx%d", c->tag, N, C), gm, rm, N, 1e-5);
    check_close(c->tc, NAME("layernorm_rstd_%s_%dx%d", c->tag, N, C), gr, rr, N, 1e-5);
    float *g = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f), *w0 = rnd(&c->rng, c->dt, C, 0.1f), *b0 = rnd(&c->rng, c->dt, C, 0.1f);
    float *rdx = malloc(sizeof(float) * N * C), *rdw = fcopy(w0, C), *rdb = fcopy(b0, C);
    cpu_layernorm_bwd(rdx, rdw, rdb, g, x, w, rm, rr, N, C);
    void *dg = up_s(be, g, (size_t)N * C), *ddw = up_s(be, w0, C), *ddb = up_s(be, b0, C);
    poison(be, dout, (size_t)N * C, 0);
    be->layernorm_bwd(be, dout, ddw, ddb, dg, dx, dw, dm, dr, N, C);
    float *odx = down_s(be, dout, (size_t)N * C), *odw = down_s(be, ddw, C), *odb = down_s(be, ddb, C);
    check_close(c->tc, NAME("layernorm_bwd_dx_%s_%dx%d", c->tag, N, C), odx, rdx, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("layernorm_bwd_dw_%s_%dx%d", c->tag, N, C), odw, rdw, C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("layernorm_bwd_db_%s_%dx%d", c->tag, N, C), odb, rdb, C, tol(c, 1e-5, 1e-2, 2e-3));
    /* a frozen LayerNorm (LoRA, freeze): no parameter gradients, the same dx */
    poison(be, dout, (size_t)N * C, 0);
    be->layernorm_bwd(be, dout, NULL, NULL, dg, dx, dw, dm, dr, N, C);
    float *fdx = down_s(be, dout, (size_t)N * C);
    check_close(c->tc, NAME("layernorm_bwd_frozen_dx_%s_%dx%d", c->tag, N, C), fdx, rdx, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    free(fdx);
    void *bufs[] = {dx, dw, db, dout, dm, dr, dg, ddw, ddb};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    float *hs[] = {x, w, b, ref, rm, rr, got, gm, gr, g, w0, b0, rdx, rdw, rdb, odx, odw, odb};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* ---------------------------------------------------------------- rotary */

static void t_rope(ctx *c, int N, int NH, int HD) {
    glm_backend *be = c->be;
    char name[128];
    size_t n = (size_t)N * NH * 3 * HD;
    int32_t *pos = malloc(sizeof(int32_t) * N), *bpos = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) { pos[i] = (int32_t)glm_rng_below(&c->rng, 2048); bpos[i] = (int32_t)glm_rng_below(&c->rng, 512); }
    float *x = rnd(&c->rng, c->dt, n, 1.0f);
    void *dp = up_raw(be, pos, sizeof(int32_t) * N), *dbp = up_raw(be, bpos, sizeof(int32_t) * N), *dx = up_s(be, x, n);
    for (int inv = 0; inv < 2; inv++) {
        float *ref = fcopy(x, n);
        cpu_rope(ref, pos, bpos, N, NH, HD, inv);
        be->upload_f32(be, dx, x, n);
        be->rope(be, dx, dp, dbp, N, NH, HD, inv);
        float *got = down_s(be, dx, n);
        check_close(c->tc, NAME("rope%s_%s_%dx%dx%d", inv ? "_inverse" : "", c->tag, N, NH, HD), got, ref, n, tol(c, 1e-5, 1e-2, 2e-3));
        free(ref);
        free(got);
    }
    be->free(be, dp); be->free(be, dbp); be->free(be, dx);
    free(pos); free(bpos); free(x);
}

/* ---------------------------------------------------------------- attention */

/* Key ranges as the batch builder makes them: per row, packed examples (context bidirectional,
 * answer causal) then padding (its own causal segment); `empty` makes one query see nothing. */
static void make_ranges(glm_rng *r, int B, int T, int32_t *lo, int32_t *hi, int empty) {
    for (int b = 0; b < B; b++) {
        int n = T - (int)glm_rng_below(r, T / 4 + 1), s = 0;
        while (s < n) {
            int len = 1 + (int)glm_rng_below(r, n - s);
            if (len < n - s && len < 8) len = n - s; /* avoid many tiny segments */
            int ctx = 1 + (int)glm_rng_below(r, len);
            for (int i = 0; i < len; i++) {
                lo[b * T + s + i] = s;
                hi[b * T + s + i] = s + (ctx > i + 1 ? ctx : i + 1);
            }
            s += len;
        }
        for (int i = n; i < T; i++) { lo[b * T + i] = n; hi[b * T + i] = i + 1; }
    }
    if (empty) { lo[T / 2] = hi[T / 2] = 3; }
}

static glm_qkv_view view_at(void *base, size_t es, size_t off, long bs, long ts, long hs) {
    return (glm_qkv_view){(char *)base + off * es, bs, ts, hs, 1};
}
/* lse is -inf for a query that sees no key: equal infinities compare as 0, a lone one fails */
static void match_inf(float *got, float *ref, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isinf(ref[i]) || isinf(got[i])) {
            if (got[i] == ref[i]) got[i] = ref[i] = 0.0f;
            else got[i] = NAN;
        }
}

/* Training layout: q|k|v interleaved per head in [B, T, NH, 3, HD]; forward and backward. */
static void t_attention(ctx *c, int B, int T, int NH, int HD, int empty) {
    glm_backend *be = c->be;
    char name[128];
    size_t es = glm_dtype_size(c->dt), nq = (size_t)B * T * NH * 3 * HD, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
    int32_t *lo = malloc(sizeof(int32_t) * B * T), *hi = malloc(sizeof(int32_t) * B * T);
    make_ranges(&c->rng, B, T, lo, hi, empty);
    float *qkv = rnd(&c->rng, c->dt, nq, 1.0f), *out = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl);
    long bs = (long)T * NH * 3 * HD, ts = (long)NH * 3 * HD, hs = 3L * HD;
    float scale = 1.0f / sqrtf((float)HD);
    cpu_attention_fwd(out, lse, view_at(qkv, 4, 0, bs, ts, hs), view_at(qkv, 4, HD, bs, ts, hs),
                      view_at(qkv, 4, 2 * HD, bs, ts, hs), lo, hi, B, T, T, NH, HD, scale);
    void *dqkv = up_s(be, qkv, nq), *dlo = up_raw(be, lo, sizeof(int32_t) * B * T), *dhi = up_raw(be, hi, sizeof(int32_t) * B * T);
    void *dout = be->alloc(be, no * es);
    float *dlse = be->alloc(be, nl * sizeof(float));
    poison(be, dout, no, 0);
    poison(be, dlse, nl, 1);
    glm_qkv_view q = view_at(dqkv, es, 0, bs, ts, hs), k = view_at(dqkv, es, HD, bs, ts, hs), v = view_at(dqkv, es, 2 * HD, bs, ts, hs);
    be->attention_fwd(be, dout, dlse, q, k, v, dlo, dhi, B, T, T, NH, HD, scale);
    float *go = down_s(be, dout, no), *gl = down_f(be, dlse, nl);
    float *lse_cmp = fcopy(lse, nl);
    match_inf(gl, lse_cmp, nl);
    check_close(c->tc, NAME("attention_fwd_out_%s_B%dT%dNH%dHD%d", c->tag, B, T, NH, HD), go, out, no, tol(c, 1e-5, 2e-2, 4e-3));
    check_close(c->tc, NAME("attention_fwd_lse_%s_B%dT%dNH%dHD%d", c->tag, B, T, NH, HD), gl, lse_cmp, nl, tol(c, 1e-5, 1e-3, 1e-3));
    /* backward from the GPU's own out/lse (as the model runs it) against the CPU's */
    float *g = rnd(&c->rng, c->dt, no, 1.0f), *rd = malloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) rd[i] = NAN; /* the CPU writes every q/k/v slot too */
    cpu_attention_bwd(view_at(rd, 4, 0, bs, ts, hs), view_at(rd, 4, HD, bs, ts, hs), view_at(rd, 4, 2 * HD, bs, ts, hs), g, out,
                      lse, view_at(qkv, 4, 0, bs, ts, hs), view_at(qkv, 4, HD, bs, ts, hs), view_at(qkv, 4, 2 * HD, bs, ts, hs),
                      lo, hi, B, T, T, NH, HD, scale);
    void *dg = up_s(be, g, no), *dd = be->alloc(be, nq * es);
    poison(be, dd, nq, 0);
    be->attention_bwd(be, view_at(dd, es, 0, bs, ts, hs), view_at(dd, es, HD, bs, ts, hs), view_at(dd, es, 2 * HD, bs, ts, hs),
                      dg, dout, dlse, q, k, v, dlo, dhi, B, T, T, NH, HD, scale);
    float *gd = down_s(be, dd, nq);
    if (be->deterministic) { /* --full_determinism: the same inputs give the same bits again */
        be->attention_bwd(be, view_at(dd, es, 0, bs, ts, hs), view_at(dd, es, HD, bs, ts, hs), view_at(dd, es, 2 * HD, bs, ts, hs),
                          dg, dout, dlse, q, k, v, dlo, dhi, B, T, T, NH, HD, scale);
        float *again = down_s(be, dd, nq);
        size_t diff = 0;
        for (size_t i = 0; i < nq; i++) diff += memcmp(&again[i], &gd[i], sizeof(float)) != 0;
        TEST_CHECK(c->tc, NAME("attention_bwd_repeats_bitwise_%s_B%dT%dNH%dHD%d", c->tag, B, T, NH, HD), diff == 0,
                   "%zu of %zu gradient elements differ between two identical calls", diff, nq);
        free(again);
    }
    /* split the packed gradient into dq, dk, dv for separate errors */
    const char *part[3] = {"dq", "dk", "dv"};
    float *a = malloc(sizeof(float) * no), *r = malloc(sizeof(float) * no);
    for (int p = 0; p < 3; p++) {
        for (size_t t = 0; t < (size_t)B * T * NH; t++) {
            memcpy(a + t * HD, gd + t * 3 * HD + p * HD, sizeof(float) * HD);
            memcpy(r + t * HD, rd + t * 3 * HD + p * HD, sizeof(float) * HD);
        }
        check_close(c->tc, NAME("attention_bwd_%s_%s_B%dT%dNH%dHD%d", part[p], c->tag, B, T, NH, HD), a, r, no,
                    tol(c, 2e-5, 3e-2, 6e-3));
    }
    void *bufs[] = {dqkv, dlo, dhi, dout, dlse, dg, dd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    void *hs2[] = {lo, hi, qkv, out, lse, lse_cmp, go, gl, g, rd, gd, a, r};
    for (size_t i = 0; i < sizeof hs2 / sizeof *hs2; i++) free(hs2[i]);
}

/* Decode layout: Tq new queries against a KV cache [B, Tmax, NH, 3, HD] holding Tk keys. */
static void t_attention_cached(ctx *c, int B, int Tq, int Tk, int NH, int HD) {
    glm_backend *be = c->be;
    char name[128];
    int Tmax = Tk + 5, len = Tk - Tq;
    size_t es = glm_dtype_size(c->dt), nc = (size_t)B * Tmax * NH * 3 * HD, no = (size_t)B * Tq * NH * HD, nl = (size_t)B * NH * Tq;
    int32_t *lo = malloc(sizeof(int32_t) * B * Tq), *hi = malloc(sizeof(int32_t) * B * Tq);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++) { lo[b * Tq + i] = b; hi[b * Tq + i] = len + i + 1; }
    float *cache = rnd(&c->rng, c->dt, nc, 1.0f), *out = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl);
    long bs = (long)Tmax * NH * 3 * HD, ts = (long)NH * 3 * HD, hs = 3L * HD;
    float scale = 1.0f / sqrtf((float)HD);
    size_t qoff = (size_t)len * NH * 3 * HD;
    cpu_attention_fwd(out, lse, view_at(cache, 4, qoff, bs, ts, hs), view_at(cache, 4, HD, bs, ts, hs),
                      view_at(cache, 4, 2 * HD, bs, ts, hs), lo, hi, B, Tq, Tk, NH, HD, scale);
    void *dc = up_s(be, cache, nc), *dlo = up_raw(be, lo, sizeof(int32_t) * B * Tq), *dhi = up_raw(be, hi, sizeof(int32_t) * B * Tq);
    void *dout = be->alloc(be, no * es);
    float *dlse = be->alloc(be, nl * sizeof(float));
    poison(be, dout, no, 0);
    be->attention_fwd(be, dout, dlse, view_at(dc, es, qoff, bs, ts, hs), view_at(dc, es, HD, bs, ts, hs),
                      view_at(dc, es, 2 * HD, bs, ts, hs), dlo, dhi, B, Tq, Tk, NH, HD, scale);
    float *go = down_s(be, dout, no), *gl = down_f(be, dlse, nl);
    check_close(c->tc, NAME("attention_cached_out_%s_B%dTq%dTk%dHD%d", c->tag, B, Tq, Tk, HD), go, out, no, tol(c, 1e-5, 2e-2, 4e-3));
    check_close(c->tc, NAME("attention_cached_lse_%s_B%dTq%dTk%dHD%d", c->tag, B, Tq, Tk, HD), gl, lse, nl, tol(c, 1e-5, 1e-3, 1e-3));
    be->free(be, dc); be->free(be, dlo); be->free(be, dhi); be->free(be, dout); be->free(be, dlse);
    free(lo); free(hi); free(cache); free(out); free(lse); free(go); free(gl);
}

/* ---------------------------------------------------------------- elementwise */

static void t_svd_ops(ctx *c);
static void t_elementwise(ctx *c, size_t n) {
    glm_backend *be = c->be;
    char name[128];
    float *x = rnd(&c->rng, c->dt, n, 2.0f), *y = rnd(&c->rng, c->dt, n, 1.0f), *ref = malloc(sizeof(float) * n);
    void *dx = up_s(be, x, n), *dy = up_s(be, y, n), *dout = be->alloc(be, n * glm_dtype_size(c->dt));
    cpu_gelu_fwd(ref, x, n);
    poison(be, dout, n, 0);
    be->gelu_fwd(be, dout, dx, n);
    float *got = down_s(be, dout, n);
    check_close(c->tc, NAME("gelu_fwd_%s_%zu", c->tag, n), got, ref, n, tol(c, 1e-6, 1e-2, 2e-3));
    free(got);
    cpu_gelu_bwd(ref, x, y, n);
    be->gelu_bwd(be, dy, dx, dy, n); /* dx aliasing dout, as the model calls it */
    got = down_s(be, dy, n);
    check_close(c->tc, NAME("gelu_bwd_%s_%zu", c->tag, n), got, ref, n, tol(c, 1e-6, 1e-2, 2e-3));
    free(got);
    be->upload_f32(be, dy, y, n);
    cpu_scale_add(ref, 7.483314773547883f, x, y, n);
    be->scale_add(be, dy, 7.483314773547883f, dx, dy, n); /* out aliasing y */
    got = down_s(be, dy, n);
    check_close(c->tc, NAME("scale_add_%s_%zu", c->tag, n), got, ref, n, tol(c, 1e-6, 1e-2, 2e-3));
    free(got);
    { /* scale_rows: rows of 13 (element by element) or of 4096 (16-byte packs), signed weights */
        int C = n % 4096 == 0 ? 4096 : 13, R = (int)(n / (size_t)C);
        float *sc = malloc(sizeof(float) * R);
        for (int r = 0; r < R; r++) sc[r] = (float)(glm_rng_normal(&c->rng) * 0.01);
        memcpy(ref, x, sizeof(float) * (size_t)R * C);
        cpu_scale_rows(ref, sc, R, C);
        float *dsc = up_raw(be, sc, sizeof(float) * R);
        be->upload_f32(be, dy, x, n);
        be->scale_rows(be, dy, dsc, R, C);
        got = down_s(be, dy, (size_t)R * C);
        check_close(c->tc, NAME("scale_rows_%s_%dx%d", c->tag, R, C), got, ref, (size_t)R * C, tol(c, 1e-6, 1e-2, 2e-3));
        free(got);
        free(sc);
        be->free(be, dsc);
    }
    /* mask_scale: dropout with the same mask as the CPU twin (exact zeros), and a plain scale */
    for (int k = 0; k < 2; k++) {
        float p = k ? 0.3f : 0.0f, sc = k ? 1.0f : 0.70710678f;
        cpu_mask_scale(ref, x, n, sc, p, 1234567ULL + n);
        poison(be, dout, n, 0);
        be->mask_scale(be, dout, dx, n, sc, p, 1234567ULL + n);
        got = down_s(be, dout, n);
        size_t zeros_ref = 0, zeros_mismatch = 0;
        for (size_t i = 0; i < n; i++) { zeros_ref += ref[i] == 0; zeros_mismatch += (ref[i] == 0) != (got[i] == 0); }
        check_close(c->tc, NAME("mask_scale_%s_%s_%zu", k ? "dropout" : "scale", c->tag, n), got, ref, n, tol(c, 1e-6, 1e-2, 2e-3));
        TEST_CHECK(c->tc, NAME("mask_scale_%s_same_mask_%s_%zu", k ? "dropout" : "scale", c->tag, n), zeros_mismatch == 0 &&
                   (k == 0 || (zeros_ref > n * 0.25 && zeros_ref < n * 0.35)), "%zu of %zu zeros differ; %zu dropped", zeros_mismatch, n, zeros_ref);
        free(got);
    }
    /* noise_add (NEFTune): the CPU twin's draws, fused the same way (equal to the bit in fp32) */
    memcpy(ref, x, n * sizeof(float));
    cpu_noise_add(ref, n, 0.05f, 4242ULL + n);
    be->upload_f32(be, dout, x, n);
    be->noise_add(be, dout, n, 0.05f, 4242ULL + n);
    got = down_s(be, dout, n);
    check_close(c->tc, NAME("noise_add_%s_%zu", c->tag, n), got, ref, n, tol(c, 0, 1e-2, 2e-3));
    free(got);
    /* sgemm (float products on the backend's buffers) against cpu_sgemm, both transposes */
    if (be->sgemm && c->dt == GLM_F32 && n == 1001) {
        int M = 300, K = 70, N = 8;
        float *a = rnd(&c->rng, GLM_F32, (size_t)M * K, 1.0f), *b = rnd(&c->rng, GLM_F32, (size_t)K * N, 1.0f);
        for (int ta = 0; ta < 2; ta++) {
            float *want = rnd(&c->rng, GLM_F32, (size_t)M * N, 1.0f);
            float *da = be->alloc(be, (size_t)M * K * sizeof(float)), *db = be->alloc(be, (size_t)K * N * sizeof(float)),
                  *dc = be->alloc(be, (size_t)M * N * sizeof(float));
            be->upload(be, da, a, (size_t)M * K * sizeof(float));
            be->upload(be, db, b, (size_t)K * N * sizeof(float));
            be->upload(be, dc, want, (size_t)M * N * sizeof(float));
            /* op(A) [M, K]: A stored [M, K], or [K, M] read transposed */
            cpu_sgemm(ta, 0, M, N, K, 0.5f, a, ta ? M : K, b, N, -1.0f, want, N);
            be->sgemm(be, ta, 0, M, N, K, 0.5f, da, ta ? M : K, db, N, -1.0f, dc, N);
            got = down_f(be, dc, (size_t)M * N);
            check_close(c->tc, NAME("sgemm_%s_%dx%dx%d", ta ? "tn" : "nn", M, N, K), got, want, (size_t)M * N, 1e-5);
            free(got); free(want);
            be->free(be, da); be->free(be, db); be->free(be, dc);
        }
        free(a); free(b);
    }
    /* the SVD's small ops (gram_f64, mul_small_f64) against their CPU twins, at GaLore's thin
     * shapes and at ones past a block's rows and threads; then glm_svd_top on this backend
     * against the host's iteration */
    if (c->dt == GLM_F32 && n == 1001) t_svd_ops(c);
    /* to_f32 (optional op) */
    float *dev32 = be->alloc(be, n * sizeof(float));
    be->to_f32(be, dev32, dx, n);
    got = down_f(be, dev32, n);
    check_close(c->tc, NAME("to_f32_%s_%zu", c->tag, n), got, x, n, 0);
    free(got);
    /* from_f32 (optional op): floats off the grid of S round to it as upload_f32 rounds them */
    if (be->from_f32) {
        float *off = rnd(&c->rng, GLM_F32, n, 1.0f);
        void *d16 = be->alloc(be, n * glm_dtype_size(be->dtype)), *u16 = be->alloc(be, n * glm_dtype_size(be->dtype));
        be->upload(be, dev32, off, n * sizeof(float));
        be->from_f32(be, d16, dev32, n);
        be->upload_f32(be, u16, off, n);
        float *g1 = down_s(be, d16, n), *g2 = down_s(be, u16, n);
        check_close(c->tc, NAME("from_f32_%s_%zu", c->tag, n), g1, g2, n, 0);
        free(g1); free(g2); free(off);
        be->free(be, d16); be->free(be, u16);
    }
    be->free(be, dev32); be->free(be, dx); be->free(be, dy); be->free(be, dout);
    free(x); free(y); free(ref);
}

/* ---------------------------------------------------------------- loss */

static void t_cross_entropy(ctx *c, int R, int V) {
    glm_backend *be = c->be;
    char name[128];
    size_t n = (size_t)R * V;
    float *l = rnd(&c->rng, c->dt, n, 3.0f), *ref = fcopy(l, n), *rl = malloc(sizeof(float) * R);
    int32_t *t = malloc(sizeof(int32_t) * R);
    for (int r = 0; r < R; r++) t[r] = (int32_t)glm_rng_below(&c->rng, V);
    void *dl = up_s(be, l, n), *dt = up_raw(be, t, sizeof(int32_t) * R);
    float *dloss = be->alloc(be, sizeof(float) * R);
    /* row scales as a preference loss makes them: signed, one of them zero */
    float *rs = malloc(sizeof(float) * R);
    for (int r = 0; r < R; r++) rs[r] = r == 1 ? 0.0f : (float)(glm_rng_normal(&c->rng) * 2.0);
    float *drs = up_raw(be, rs, sizeof(float) * R);
    for (int grad = 0; grad < 3; grad++) { /* 0: loss only, 1: gradient, 2: gradient with row scales */
        float dscale = grad ? 1.0f / R : 0.0f;
        const float *scale_h = grad == 2 ? rs : NULL, *scale_d = grad == 2 ? drs : NULL;
        const char *kind = grad == 2 ? "_rows" : "";
        memcpy(ref, l, sizeof(float) * n);
        cpu_cross_entropy(ref, rl, t, R, V, dscale, scale_h);
        be->upload_f32(be, dl, l, n);
        poison(be, dloss, R, 1);
        be->cross_entropy(be, dl, dloss, dt, R, V, dscale, scale_d);
        float *gl = down_f(be, dloss, R), *gg = down_s(be, dl, n);
        check_close(c->tc, NAME("cross_entropy_loss%s%s_%s_%dx%d", grad ? "_grad" : "", kind, c->tag, R, V), gl, rl, R, tol(c, 1e-5, 1e-4, 1e-4));
        if (grad) check_close(c->tc, NAME("cross_entropy_dlogits%s_%s_%dx%d", kind, c->tag, R, V), gg, ref, n, tol(c, 1e-5, 1e-2, 2e-3));
        else check_close(c->tc, NAME("cross_entropy_logits_untouched_%s_%dx%d", c->tag, R, V), gg, l, n, 0);
        free(gl); free(gg);
    }
    be->free(be, drs);
    free(rs);
    be->free(be, dl); be->free(be, dt); be->free(be, dloss);
    free(l); free(ref); free(rl); free(t);
}

/* ---------------------------------------------------------------- optimizer */

static void t_optim(ctx *c, size_t n) {
    glm_backend *be = c->be;
    char name[128];
    float *x = rnd(&c->rng, c->dt, n, 1.0f);
    void *dx = up_s(be, x, n);
    double ref = cpu_sumsq(x, n), got = be->sumsq(be, dx, n);
    double e = fabs(got - ref) / ref;
    TEST_CHECK(c->tc, NAME("sumsq_%s_%zu", c->tag, n), e < 1e-9, "rel err %.3g", e);
    printf("  err %-48s %.3g (tol 1e-9)\n", name, e);
    /* sumsq over spans: 300 random ranges (more than one batch of result slots), some of them
     * at odd offsets (the scalar path) and some empty */
    {
        enum { K = 300 };
        glm_span sp[K];
        double want = 0;
        for (int i = 0; i < K; i++) {
            size_t lo = (size_t)(glm_rng_uniform(&c->rng) * (double)n), len = (size_t)(glm_rng_uniform(&c->rng) * (double)(n / 8));
            if (i % 7 == 0) lo = lo / 64 * 64;
            if (lo + len > n) len = n - lo;
            if (i % 11 == 0) len = 0;
            sp[i] = (glm_span){lo, len};
            want += cpu_sumsq(x + lo, len);
        }
        double got_s = be->sumsq_spans(be, dx, sp, K), es = fabs(got_s - want) / (want > 0 ? want : 1);
        TEST_CHECK(c->tc, NAME("sumsq_spans_%s_%zu", c->tag, n), es < 1e-9, "rel err %.3g", es);
        printf("  err %-48s %.3g (tol 1e-9)\n", name, es);
    }
    /* add_sumsq_spans: 40 disjoint ranges of a copy of x get ranges of y added (some at odd
     * offsets: the scalar path; one empty); x outside them must stay as it was */
    {
        enum { K = 40 };
        glm_span sp[K];
        size_t yoff[K];
        float *y = rnd(&c->rng, c->dt, n, 1.0f), *want_x = fcopy(x, n);
        void *dx2 = up_s(be, x, n), *dy = up_s(be, y, n);
        double want = 0;
        for (int i = 0; i < K; i++) {
            size_t lo = (size_t)i * (n / K) + (i % 5 == 0 ? 3 : 0), len = (size_t)(glm_rng_uniform(&c->rng) * (double)(n / K - 3));
            size_t yo = (size_t)(glm_rng_uniform(&c->rng) * (double)(n - len)) / (i % 3 ? 8 : 1) * (i % 3 ? 8 : 1);
            if (i == 7) len = 0;
            sp[i] = (glm_span){lo, len};
            yoff[i] = yo;
            for (size_t j = 0; j < len; j++) want_x[lo + j] += y[yo + j];
            round_dt(c->dt, want_x + lo, len);
            want += cpu_sumsq(want_x + lo, len);
        }
        double got_a = be->add_sumsq_spans(be, dx2, dy, yoff, sp, K), ea = fabs(got_a - want) / (want > 0 ? want : 1);
        TEST_CHECK(c->tc, NAME("add_sumsq_spans_%s_%zu", c->tag, n), ea < 1e-9, "rel err %.3g", ea);
        printf("  err %-48s %.3g (tol 1e-9)\n", name, ea);
        float *got_x = down_s(be, dx2, n);
        check_close(c->tc, NAME("add_sumsq_spans_x_%s_%zu", c->tag, n), got_x, want_x, n, 0);
        free(got_x); free(want_x); free(y);
        be->free(be, dx2); be->free(be, dy);
    }
    /* AdamW: fp32 master (bf16/fp16) or the fp32 param itself; two steps */
    float *p = rnd(&c->rng, GLM_F32, n, 0.5f), *m = rnd(&c->rng, GLM_F32, n, 0.01f), *v = rnd(&c->rng, GLM_F32, n, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = v[i] * v[i];
    float *rp = fcopy(p, n), *rm = fcopy(m, n), *rv = fcopy(v, n), *ps = fcopy(p, n);
    round_dt(c->dt, ps, n);
    int master = c->dt != GLM_F32;
    void *dp = up_s(be, ps, n), *dg = dx;
    float *dmaster = master ? up_raw(be, p, n * 4) : NULL, *dm = up_raw(be, m, n * 4), *dv = up_raw(be, v, n * 4);
    for (int step = 1; step <= 2; step++) {
        float bc1 = 1.0f - powf(0.9f, (float)step), bc2 = 1.0f - powf(0.95f, (float)step);
        cpu_adamw(rp, x, rm, rv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2, 0.5f);
        be->adamw(be, dp, dmaster, dg, dm, dv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, bc1, bc2, 0.5f);
    }
    float *gp = down_s(be, dp, n), *gm = down_f(be, dm, n), *gv = down_f(be, dv, n);
    float *rps = fcopy(rp, n);
    round_dt(c->dt, rps, n);
    check_close(c->tc, NAME("adamw_param_%s_%zu", c->tag, n), gp, rps, n, tol(c, 1e-6, 1e-2, 1e-3));
    check_close(c->tc, NAME("adamw_m_%s_%zu", c->tag, n), gm, rm, n, 1e-6);
    check_close(c->tc, NAME("adamw_v_%s_%zu", c->tag, n), gv, rv, n, 1e-6);
    if (master) {
        float *gmm = down_f(be, dmaster, n);
        check_close(c->tc, NAME("adamw_master_%s_%zu", c->tag, n), gmm, rp, n, 1e-6);
        free(gmm);
        be->free(be, dmaster);
    }
    /* GaLore's steps (adam_dir, apply_dir) on float buffers, two steps: bit for bit in fp32 (the
     * kernels round each product and sum as the CPU ops do), the S param rounded from the master */
    {
        float *g32 = rnd(&c->rng, GLM_F32, n, 1e-3f), *m2 = fcopy(m, n), *v2 = fcopy(v, n), *dir = malloc(n * 4);
        float *q = fcopy(p, n), *qs = fcopy(p, n);
        round_dt(c->dt, qs, n);
        float *dg32 = up_raw(be, g32, n * 4), *dm2 = up_raw(be, m, n * 4), *dv2 = up_raw(be, v, n * 4);
        float *ddir = be->alloc(be, n * 4), *dq = master ? up_raw(be, p, n * 4) : NULL;
        void *dqs = up_s(be, master ? qs : q, n);
        for (int step = 1; step <= 2; step++) {
            cpu_adam_dir(dir, g32, m2, v2, n, 0.9f, 0.999f, 1e-6f);
            cpu_apply_dir(q, dir, n, -3e-3f, -1e-4f);
            be->adam_dir(be, ddir, dg32, dm2, dv2, n, 0.9f, 0.999f, 1e-6f);
            be->apply_dir(be, dqs, dq, ddir, n, -3e-3f, -1e-4f);
        }
        float *gdir = down_f(be, ddir, n), *gm2 = down_f(be, dm2, n), *gv2 = down_f(be, dv2, n), *gq = down_s(be, dqs, n);
        float *qr = fcopy(q, n);
        round_dt(c->dt, qr, n);
        check_close(c->tc, NAME("adam_dir_%s_%zu", c->tag, n), gdir, dir, n, 0);
        check_close(c->tc, NAME("adam_dir_moments_%s_%zu", c->tag, n), gm2, m2, n, 0);
        check_close(c->tc, NAME("adam_dir_v_%s_%zu", c->tag, n), gv2, v2, n, 0);
        check_close(c->tc, NAME("apply_dir_param_%s_%zu", c->tag, n), gq, qr, n, 0);
        if (master) {
            float *gqm = down_f(be, dq, n);
            check_close(c->tc, NAME("apply_dir_master_%s_%zu", c->tag, n), gqm, q, n, 0);
            free(gqm);
            be->free(be, dq);
        }
        be->free(be, dg32); be->free(be, dm2); be->free(be, dv2); be->free(be, ddir); be->free(be, dqs);
        float *fs[] = {g32, m2, v2, dir, q, qs, gdir, gm2, gv2, gq, qr};
        for (size_t i = 0; i < sizeof fs / sizeof *fs; i++) free(fs[i]);
    }
    be->free(be, dx); be->free(be, dp); be->free(be, dm); be->free(be, dv);
    float *hs[] = {x, p, m, v, rp, rm, rv, ps, gp, gm, gv, rps};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* ---------------------------------------------------------------- the SVD's small ops */

/* gram_f64 in double: the sums' order differs from the CPU's (chunks of rows per block), so
 * within 1e-13 of the largest entry; mul_small_f64 sums each entry in the same order as the CPU
 * and rounds once: within one rounding of float. In place too (y = x). */
static void t_svd_ops(ctx *c) {
    glm_backend *be = c->be;
    char name[128];
    static const int shapes[][3] = {{16384, 32, 32}, {4096, 32, 16}, {1001, 7, 5}, {300, 130, 3}};
    for (size_t t = 0; t < sizeof shapes / sizeof *shapes; t++) {
        int n = shapes[t][0], q = shapes[t][1], k = shapes[t][2];
        float *x = rnd(&c->rng, GLM_F32, (size_t)n * q, 1.0f), *y = rnd(&c->rng, GLM_F32, (size_t)n * k, 1.0f);
        float *dx = up_raw(be, x, (size_t)n * q * 4), *dy = up_raw(be, y, (size_t)n * k * 4);
        double *want = malloc((size_t)q * k * sizeof(double)), *got = malloc((size_t)q * k * sizeof(double));
        cpu_gram_f64(want, x, y, n, q, k);
        be->gram_f64(be, got, dx, dy, n, q, k);
        double big = 0, err = 0;
        for (int e = 0; e < q * k; e++) big = fmax(big, fabs(want[e]));
        for (int e = 0; e < q * k; e++) err = fmax(err, fabs(got[e] - want[e]) / big);
        TEST_CHECK(c->tc, NAME("gram_f64_%dx%dx%d", n, q, k), err < 1e-13, "err %.3g of the largest entry", err);
        printf("  err %-48s %.3g (tol 1e-13)\n", name, err);
        double *M = malloc((size_t)q * k * sizeof(double));
        for (int e = 0; e < q * k; e++) M[e] = glm_rng_normal(&c->rng) / q;
        float *fy = malloc((size_t)n * k * 4);
        cpu_mul_small_f64(fy, x, M, n, q, k);
        be->mul_small_f64(be, dy, dx, M, n, q, k);
        float *gy = down_f(be, dy, (size_t)n * k);
        check_close(c->tc, NAME("mul_small_f64_%dx%dx%d", n, q, k), gy, fy, (size_t)n * k, 1e-6);
        free(gy);
        if (k <= q) { /* in place: the first k columns' width is k, so only the square case */
            double *Mq = malloc((size_t)q * q * sizeof(double));
            for (int e = 0; e < q * q; e++) Mq[e] = glm_rng_normal(&c->rng) / q;
            float *fx = malloc((size_t)n * q * 4);
            cpu_mul_small_f64(fx, x, Mq, n, q, q);
            be->mul_small_f64(be, dx, dx, Mq, n, q, q);
            gy = down_f(be, dx, (size_t)n * q);
            check_close(c->tc, NAME("mul_small_f64_in_place_%dx%d", n, q), gy, fx, (size_t)n * q, 1e-6);
            free(gy); free(fx); free(Mq);
        }
        be->free(be, dx); be->free(be, dy);
        free(x); free(y); free(want); free(got); free(M); free(fy);
    }
    /* orth_f64 (Cholesky QR twice, R made on the device) against the host's: the Gram sums'
     * order differs (1e-13), so within a few roundings of float; dependent columns refused by both
     * and left as they came; 96 and 97 are either side of the factor's shared-memory limit */
    if (be->orth_f64) {
        static const int oshapes[][2] = {{16384, 32}, {4096, 16}, {1001, 7}, {300, 64}, {2000, 96}, {2000, 97}};
        for (size_t t = 0; t < sizeof oshapes / sizeof *oshapes; t++) {
            int n = oshapes[t][0], q = oshapes[t][1];
            float *x = rnd(&c->rng, GLM_F32, (size_t)n * q, 1.0f);
            float *dx = up_raw(be, x, (size_t)n * q * 4);
            int rc_h = cpu_orth_f64(x, n, q), rc_d = be->orth_f64(be, dx, n, q);
            float *gx = down_f(be, dx, (size_t)n * q);
            TEST_CHECK(c->tc, NAME("orth_f64_status_%dx%d", n, q), rc_h == 0 && rc_d == 0, "host %d, device %d", rc_h, rc_d);
            check_close(c->tc, NAME("orth_f64_%dx%d", n, q), gx, x, (size_t)n * q, 1e-5);
            free(gx); free(x);
            be->free(be, dx);
        }
        int n = 500, q = 6;
        float *x = rnd(&c->rng, GLM_F32, (size_t)n * q, 1.0f), *x0 = malloc((size_t)n * q * 4);
        for (int i = 0; i < n; i++) x[(size_t)i * q + 4] = x[(size_t)i * q + 1]; /* column 4 = column 1 */
        memcpy(x0, x, (size_t)n * q * 4);
        float *dx = up_raw(be, x, (size_t)n * q * 4);
        int rc_h = cpu_orth_f64(x, n, q), rc_d = be->orth_f64(be, dx, n, q);
        float *gx = down_f(be, dx, (size_t)n * q);
        TEST_CHECK(c->tc, "orth_f64_dependent_columns_refused_and_left", rc_h == -1 && rc_d == -1 &&
                   memcmp(gx, x0, (size_t)n * q * 4) == 0, "host %d, device %d", rc_h, rc_d);
        free(gx); free(x); free(x0);
        be->free(be, dx);
    }
    /* the whole iteration on this backend against the host's: a 600 x 900 matrix of ten
     * directions (two close values among them) over noise of spectral norm ~5e-3, rank 6 */
    int OC = 600, C = 900, r = 6;
    float *w = rnd(&c->rng, GLM_F32, (size_t)OC * C, 1e-4f);
    for (int j = 0; j < 10; j++) { /* w += s_j a_j b_j^T, s = 1, 0.8, 0.6, 0.59, ... */
        float sj = j < 3 ? 1.0f - 0.2f * j : 0.59f * powf(0.8f, (float)(j - 3));
        float *a = rnd(&c->rng, GLM_F32, OC, 1.0f / sqrtf((float)OC)), *b = rnd(&c->rng, GLM_F32, C, 1.0f / sqrtf((float)C));
        for (int i = 0; i < OC; i++)
            for (int k = 0; k < C; k++) w[(size_t)i * C + k] += sj * a[i] * b[k];
        free(a); free(b);
    }
    float *dw = up_raw(be, w, (size_t)OC * C * 4);
    float *u1 = malloc((size_t)OC * r * 4), *v1 = malloc((size_t)C * r * 4), s1[8];
    float *u2 = malloc((size_t)OC * r * 4), *v2 = malloc((size_t)C * r * 4), s2[8];
    int its_host = glm_svd_top(NULL, w, OC, C, r, 200, 3, NULL, 0, u1, s1, v1);
    int its_dev = glm_svd_top(be, dw, OC, C, r, 200, 3, NULL, 0, u2, s2, v2);
    glm_svd_fix_signs(u1, v1, OC, C, r);
    glm_svd_fix_signs(u2, v2, OC, C, r);
    check_close(c->tc, "svd_top_values_on_device_equal_the_host", s2, s1, r, 1e-5);
    check_close(c->tc, "svd_top_right_vectors_on_device_equal_the_host", v2, v1, (size_t)C * r, 1e-3);
    check_close(c->tc, "svd_top_left_vectors_on_device_equal_the_host", u2, u1, (size_t)OC * r, 1e-3);
    /* both converge; how many iterations they take is not compared: the stop rule ends on rounding
     * noise between the two close values, so the count moves with the last bits of any product (an
     * H100 gave 24 against the host's 8 with the kernel another run gave 8 with); the values and
     * vectors above carry the accuracy */
    TEST_CHECK(c->tc, "svd_top_on_device_converges_as_on_the_host", its_dev > 0 && its_dev < 200 && its_host > 0 && its_host < 200,
               "%d iterations on the device, %d on the host", its_dev, its_host);
    be->free(be, dw);
    free(w); free(u1); free(v1); free(u2); free(v2);
}

/* ---------------------------------------------------------------- 8-bit blockwise AdamW */

/* adamw8 against cpu_adamw8 (backend/cpu/cpu_adam8.c) for 3 steps from a fresh state: bf16/fp16
 * storage with an fp32 master, fp32 storage without. Both run backend/quant8.h's per-element
 * arithmetic as the same sequence of IEEE operations (the kernel through rounded intrinsics), so
 * everything must agree bit for bit: master, the parameter (the CPU master rounded to S), every
 * code (no ties to allow: a tie is decided by the same comparison of the same numbers) and every
 * absmax. Gradients span magnitudes per block (1e-6 .. 1) with 1e3x outliers and zeros; decay
 * bits are random at a flat offset of 192; grad_scale 0.5; n covers one element, partial last
 * blocks and many blocks. */
static void t_adam8(ctx *c, size_t n) {
    glm_backend *be = c->be;
    char name[128];
    const size_t nb = glm_q8_blocks(n), flat0 = 192, nbits = ((flat0 + n + 63) / 64 + 7) / 8;
    const int master = c->dt != GLM_F32, K = 3;
    float *p = rnd(&c->rng, GLM_F32, n, 0.05f), *ps = fcopy(p, n);
    round_dt(c->dt, ps, n); /* the S parameter; the master starts from it too (as glm_adamw_init) */
    float *rp = fcopy(ps, n);
    uint8_t *bits = malloc(nbits), *rqm = calloc(n, 1), *rqv = calloc(n, 1);
    float *ram = calloc(nb, sizeof(float)), *rav = calloc(nb, sizeof(float));
    for (size_t i = 0; i < nbits; i++) bits[i] = (uint8_t)glm_rng_below(&c->rng, 256);
    void *dp = up_s(be, ps, n), *dbits = up_raw(be, bits, nbits);
    float *dmaster = master ? up_raw(be, ps, n * 4) : NULL;
    uint8_t *dqm = be->alloc(be, n), *dqv = be->alloc(be, n);
    float *dam = be->alloc(be, nb * 4), *dav = be->alloc(be, nb * 4);
    be->zero(be, dqm, n); be->zero(be, dqv, n); be->zero(be, dam, nb * 4); be->zero(be, dav, nb * 4); /* fresh */
    void *dg = be->alloc(be, n * glm_dtype_size(c->dt));
    float *g = malloc(n * sizeof(float));
    for (int step = 1; step <= K; step++) {
        for (size_t i = 0; i < n; i++) {
            size_t b = i / GLM_ADAM8_BLOCK;
            float mag = powf(10.0f, (float)((b * 5 + (size_t)step) % 7) - 6.0f); /* 1e-6 .. 1 by block */
            float x = glm_rng_normal(&c->rng) * mag;
            if (glm_rng_below(&c->rng, 5000) == 0) x *= 1e3f; /* (within fp16's range) */
            if (glm_rng_below(&c->rng, 100) == 0) x = 0.0f;
            g[i] = round_one(c->dt, x);
        }
        be->upload_f32(be, dg, g, n);
        float lr = 1e-3f / (float)step, bc1 = 1.0f - powf(0.9f, (float)step), bc2 = 1.0f - powf(0.999f, (float)step);
        cpu_adamw8(rp, NULL, g, rqm, rqv, ram, rav, n, bits, flat0, lr, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2, 0.5f);
        be->adamw8(be, dp, dmaster, dg, dqm, dqv, dam, dav, n, dbits, flat0, lr, 0.9f, 0.999f, 1e-8f, 0.1f, bc1, bc2, 0.5f);
    }
    float *gp = down_s(be, dp, n), *gam = down_f(be, dam, nb), *gav = down_f(be, dav, nb), *rps = fcopy(rp, n);
    uint8_t *gqm = malloc(n), *gqv = malloc(n);
    be->download(be, gqm, dqm, n);
    be->download(be, gqv, dqv, n);
    round_dt(c->dt, rps, n);
    check_close(c->tc, NAME("adamw8_param_%s_%zu", c->tag, n), gp, rps, n, 0);
    if (master) {
        float *gm = down_f(be, dmaster, n);
        check_close(c->tc, NAME("adamw8_master_%s_%zu", c->tag, n), gm, rp, n, 0);
        free(gm);
        be->free(be, dmaster);
    }
    check_close(c->tc, NAME("adamw8_absm_%s_%zu", c->tag, n), gam, ram, nb, 0);
    check_close(c->tc, NAME("adamw8_absv_%s_%zu", c->tag, n), gav, rav, nb, 0);
    size_t dm = 0, dv = 0;
    for (size_t i = 0; i < n; i++) { dm += gqm[i] != rqm[i]; dv += gqv[i] != rqv[i]; }
    TEST_CHECK(c->tc, NAME("adamw8_codes_%s_%zu", c->tag, n), dm == 0 && dv == 0, "%zu m codes and %zu v codes differ of %zu",
               dm, dv, n);
    void *bufs[] = {dp, dbits, dqm, dqv, dam, dav, dg};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    void *hs[] = {p, ps, rp, bits, rqm, rqv, ram, rav, g, gp, gam, gav, rps, gqm, gqv};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

/* GLM_ADAM8_BENCH=1: the time of one adamw8 and one adamw step on 2^28 bf16 parameters with an
 * fp32 master (bytes moved: 16 per element for adamw8, 28 for adamw) */
static void run_adam8_bench(void) {
    char err[256];
    glm_backend *be = glm_backend_cuda(0, GLM_BF16, err, sizeof err);
    if (!be) { printf("  bench: no GPU (%s)\n", err); return; }
    const size_t n = (size_t)1 << 28, nb = glm_q8_blocks(n), nbits = n / 64 / 8 + 1;
    void *p = be->alloc(be, n * 2), *g = be->alloc(be, n * 2);
    float *master = be->alloc(be, n * 4), *m = be->alloc(be, n * 4), *v = be->alloc(be, n * 4);
    uint8_t *qm = be->alloc(be, n), *qv = be->alloc(be, n), *bits = be->alloc(be, nbits);
    float *am = be->alloc(be, nb * 4), *av = be->alloc(be, nb * 4);
    glm_cuda_fill_normal(be, p, n, 3, 0.05f);
    glm_cuda_fill_normal(be, g, n, 4, 1e-3f);
    be->to_f32(be, master, p, n);
    be->zero(be, qm, n); be->zero(be, qv, n); be->zero(be, am, nb * 4); be->zero(be, av, nb * 4);
    be->zero(be, m, n * 4); be->zero(be, v, n * 4);
    uint8_t *ones = malloc(nbits);
    memset(ones, 0xff, nbits);
    be->upload(be, bits, ones, nbits);
    free(ones);
    cudaStream_t st = (cudaStream_t)glm_cuda_stream(be);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int which = 0; which < 2; which++) {
        enum { REPS = 10 };
        float ms = 0;
        for (int r = -2; r < REPS; r++) {
            if (r == 0) cudaEventRecord(e0, st);
            if (which == 0)
                be->adamw8(be, p, master, g, qm, qv, am, av, n, bits, 0, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.5f, 0.1f, 1.0f);
            else be->adamw(be, p, master, g, m, v, n, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.5f, 0.1f, 1.0f);
        }
        cudaEventRecord(e1, st);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        double us = ms * 1e3 / REPS, bytes = (double)n * (which == 0 ? 16 : 28);
        printf("  bench %-52s %9.1f us %8.0f GB/s\n", which == 0 ? "adamw8 bf16 + fp32 master, 2^28 elements" : "adamw bf16 + fp32 master, 2^28 elements",
               us, bytes / (us * 1e3));
    }
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    void *bufs[] = {p, g, master, m, v, qm, qv, bits, am, av};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    be->destroy(be);
}

/* ---------------------------------------------------------------- P-Tuning v2: prefix kv, tanh */

/* prefix_kv and prefix_kv_bwd against the CPU twin, layer 2 of L = 3 (the pkv slot offsets):
 * kv poisoned; the dropout mask equal (exact zeros in the same places, about p dropped); the
 * sequence rows exact copies; dqkv's q slots kept bit for bit while its k|v slots (poisoned)
 * are written; dpkv accumulated onto random values, other layers' slots untouched; a second
 * run of the backward bit-identical (no atomics). */
static void t_prefix(ctx *c, int B, int T, int P, int NH, int HD) {
    glm_backend *be = c->be;
    char name[160];
    const int L = 3, layer = 2;
    const size_t es = glm_dtype_size(c->dt), H = (size_t)NH * HD, nkv = (size_t)B * (P + T) * 2 * H;
    const size_t nqkv = (size_t)B * T * 3 * H, npkv = (size_t)P * 2 * L * H, npre = (size_t)B * P * 2 * H;
    float *qkv = rnd(&c->rng, c->dt, nqkv, 1.0f), *pkv = rnd(&c->rng, c->dt, npkv, 0.5f), *ref = malloc(sizeof(float) * nkv);
    void *dq = up_s(be, qkv, nqkv), *dp = up_s(be, pkv, npkv), *dkvb = be->alloc(be, nkv * es);
    for (int k = 0; k < 2; k++) {
        float p = k ? 0.1f : 0.0f;
        uint64_t seed = 0xabcdef12ULL + (uint64_t)B * 1000 + T;
        cpu_prefix_kv(ref, qkv, pkv, layer, L, B, T, P, NH, HD, p, seed);
        poison(be, dkvb, nkv, 0);
        be->prefix_kv(be, dkvb, dq, dp, layer, L, B, T, P, NH, HD, p, seed);
        float *got = down_s(be, dkvb, nkv);
        size_t zeros_ref = 0, zeros_mismatch = 0, seq_bad = 0;
        for (int b = 0; b < B; b++)
            for (int j = 0; j < P + T; j++)
                for (size_t e = 0; e < 2 * H; e++) {
                    size_t i = ((size_t)b * (P + T) + j) * 2 * H + e;
                    if (j < P) { zeros_ref += ref[i] == 0; zeros_mismatch += (ref[i] == 0) != (got[i] == 0); }
                    else seq_bad += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
                }
        check_close(c->tc, NAME("prefix_kv_%s_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD), got,
                    ref, nkv, tol(c, 1e-6, 1e-2, 2e-3));
        TEST_CHECK(c->tc, NAME("prefix_kv_%s_same_mask_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD),
                   zeros_mismatch == 0 && (k == 0 ? zeros_ref == 0 : npre < 2000 || (zeros_ref > npre * 0.08 && zeros_ref < npre * 0.12)),
                   "%zu of %zu zeros differ; %zu dropped", zeros_mismatch, npre, zeros_ref);
        TEST_CHECK(c->tc, NAME("prefix_kv_%s_sequence_exact_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD),
                   seq_bad == 0, "%zu sequence elements differ", seq_bad);
        free(got);

        /* backward */
        float *g = rnd(&c->rng, c->dt, nkv, 1.0f), *dqkv0 = rnd(&c->rng, c->dt, nqkv, 1.0f), *dpkv0 = rnd(&c->rng, c->dt, npkv, 0.1f);
        for (size_t r = 0; r < (size_t)B * T * NH; r++) /* k|v slots: written with =, so poisoned */
            for (size_t e = HD; e < 3 * (size_t)HD; e++) dqkv0[r * 3 * HD + e] = NAN;
        float *rq = fcopy(dqkv0, nqkv), *rp = fcopy(dpkv0, npkv);
        cpu_prefix_kv_bwd(rq, rp, g, layer, L, B, T, P, NH, HD, p, seed);
        void *dg = up_s(be, g, nkv), *ddq = up_s(be, dqkv0, nqkv), *ddp = up_s(be, dpkv0, npkv);
        be->prefix_kv_bwd(be, ddq, ddp, dg, layer, L, B, T, P, NH, HD, p, seed);
        float *oq = down_s(be, ddq, nqkv), *op = down_s(be, ddp, npkv);
        size_t q_bad = 0;
        for (size_t r = 0; r < (size_t)B * T * NH; r++)
            for (int d = 0; d < HD; d++) q_bad += memcmp(&oq[r * 3 * HD + d], &dqkv0[r * 3 * HD + d], sizeof(float)) != 0;
        TEST_CHECK(c->tc, NAME("prefix_kv_bwd_%s_q_untouched_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD),
                   q_bad == 0, "%zu q elements changed", q_bad);
        check_close(c->tc, NAME("prefix_kv_bwd_%s_dqkv_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD), oq,
                    rq, nqkv, 0);
        check_close(c->tc, NAME("prefix_kv_bwd_%s_dpkv_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD), op,
                    rp, npkv, tol(c, 1e-6, 1e-2, 2e-3));
        /* again from the same start: bit for bit */
        be->upload_f32(be, ddq, dqkv0, nqkv);
        be->upload_f32(be, ddp, dpkv0, npkv);
        be->prefix_kv_bwd(be, ddq, ddp, dg, layer, L, B, T, P, NH, HD, p, seed);
        float *oq2 = down_s(be, ddq, nqkv), *op2 = down_s(be, ddp, npkv);
        TEST_CHECK(c->tc, NAME("prefix_kv_bwd_%s_deterministic_%s_B%dT%dP%dNH%dHD%d", k ? "dropout" : "copy", c->tag, B, T, P, NH, HD),
                   memcmp(oq, oq2, sizeof(float) * nqkv) == 0 && memcmp(op, op2, sizeof(float) * npkv) == 0,
                   "a second run differs");
        be->free(be, dg); be->free(be, ddq); be->free(be, ddp);
        free(g); free(dqkv0); free(dpkv0); free(rq); free(rp); free(oq); free(op); free(oq2); free(op2);
    }
    be->free(be, dq); be->free(be, dp); be->free(be, dkvb);
    free(qkv); free(pkv); free(ref);
}

static void t_tanh(ctx *c, size_t n) {
    glm_backend *be = c->be;
    char name[128];
    float *x = rnd(&c->rng, c->dt, n, 2.0f), *g = rnd(&c->rng, c->dt, n, 1.0f), *ref = malloc(sizeof(float) * n);
    void *dx = up_s(be, x, n), *dg = up_s(be, g, n), *dout = be->alloc(be, n * glm_dtype_size(c->dt));
    cpu_tanh_fwd(ref, x, n);
    poison(be, dout, n, 0);
    be->tanh_fwd(be, dout, dx, n);
    float *got = down_s(be, dout, n);
    check_close(c->tc, NAME("tanh_fwd_%s_%zu", c->tag, n), got, ref, n, tol(c, 1e-6, 1e-2, 2e-3));
    /* backward from the GPU's (rounded) forward output, dx aliasing dout as the model calls it */
    cpu_tanh_bwd(ref, got, g, n);
    be->tanh_bwd(be, dg, dout, dg, n);
    free(got);
    got = down_s(be, dg, n);
    check_close(c->tc, NAME("tanh_bwd_%s_%zu", c->tag, n), got, ref, n, tol(c, 1e-6, 1e-2, 2e-3));
    free(got);
    be->free(be, dx); be->free(be, dg); be->free(be, dout);
    free(x); free(g); free(ref);
}

/* argmax_rows against its CPU twin: rows with ties (the first maximum wins), a NaN row and an
 * infinite row (both answer 5), a row whose maximum is the last element. */
static void t_argmax(ctx *c, int R, int V) {
    glm_backend *be = c->be;
    char name[128];
    float *x = rnd(&c->rng, c->dt, (size_t)R * V, 3.0f);
    if (R > 3) {
        x[(size_t)1 * V + V / 3] = x[(size_t)1 * V + V / 2] = 100.0f;   /* a tie */
        x[(size_t)2 * V + V - 1] = 1000.0f;                          /* the last element */
        x[(size_t)3 * V + 7] = NAN;
        x[(size_t)(R - 1) * V + 11] = INFINITY;
    }
    void *d = up_s(be, x, (size_t)R * V);
    int32_t *got = malloc(sizeof(int32_t) * R), *ref = malloc(sizeof(int32_t) * R);
    cpu_argmax_rows(ref, x, R, V);
    be->argmax_rows(be, got, d, R, V);
    int bad = 0;
    for (int r = 0; r < R; r++) bad += got[r] != ref[r];
    TEST_CHECK(c->tc, NAME("argmax_rows_%s_%dx%d", c->tag, R, V), bad == 0 && (R <= 3 || (ref[1] == V / 3 && ref[3] == 5)),
               "%d of %d rows differ (row 1: %d vs %d)", bad, R, R > 1 ? got[1] : 0, R > 1 ? ref[1] : 0);
    be->free(be, d);
    free(x); free(got); free(ref);
}

/* upload_cast (a checkpoint's stored bytes, converted on the GPU) == upload_f32 of the same
 * values (the host's float copy, the path it replaces), byte for byte, for every stored dtype;
 * n past the staging buffer crosses its chunks. Values span normals, subnormals and halfway
 * cases of the roundings (random bit patterns, non-finite ones dropped). */
static void t_upload_cast(ctx *c, size_t n) {
    glm_backend *be = c->be;
    char name[128];
    size_t es = glm_dtype_size(c->dt);
    static const glm_dtype srcs[] = {GLM_F32, GLM_BF16, GLM_F16};
    for (int s = 0; s < 3; s++) {
        glm_dtype sd = srcs[s];
        size_t ss = glm_dtype_size(sd);
        unsigned char *raw = malloc(n * ss);
        float *f = malloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            do {
                u = (uint32_t)glm_rng_u64(&c->rng);
                if (sd == GLM_F32) f[i] = glm_bits_f32(u);
                else f[i] = sd == GLM_BF16 ? glm_bf16_to_f32((uint16_t)u) : glm_f16_to_f32((uint16_t)u);
            } while (!isfinite(f[i]) || fabsf(f[i]) > 6e4f); /* fp16 storage holds at most 65504 */
            if (sd == GLM_F32) memcpy(raw + 4 * i, &u, 4);
            else { uint16_t h = (uint16_t)u; memcpy(raw + 2 * i, &h, 2); }
        }
        void *a = be->alloc(be, n * es), *b = be->alloc(be, n * es);
        be->upload_f32(be, a, f, n);
        be->upload_cast(be, b, raw, sd, n);
        unsigned char *ha = malloc(n * es), *hb = malloc(n * es);
        be->download(be, ha, a, n * es);
        be->download(be, hb, b, n * es);
        size_t bad = 0;
        for (size_t i = 0; i < n * es; i++) bad += ha[i] != hb[i];
        TEST_CHECK(c->tc, NAME("upload_cast_from_%s_%s_%zu", sd == GLM_F32 ? "f32" : sd == GLM_BF16 ? "bf16" : "f16", c->tag, n),
                   bad == 0, "%zu of %zu bytes differ from upload_f32's", bad, n * es);
        be->free(be, a); be->free(be, b);
        free(raw); free(f); free(ha); free(hb);
    }
}

/* ---------------------------------------------------------------- quantized weights */

/* A random [OC, C] float matrix with some structure for the quantizers: row 1 all zero (INT: a
 * zero scale; NF4: all-zero blocks), a few large outliers, otherwise N(0, 0.05). */
static float *quant_source(glm_rng *r, int OC, int C) {
    size_t n = (size_t)OC * C;
    float *w = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) w[i] = 0.05f * glm_rng_normal(r);
    if (OC > 2)
        for (int j = 0; j < C; j++) w[(size_t)C + j] = 0.0f;
    for (int k = 0; k < 1 + (int)(n / 5000); k++) w[glm_rng_below(r, n)] = 2.0f * (glm_rng_uniform(r) - 0.5f);
    return w;
}

/* (a) dequantize == the CPU's dequantized weights through upload_f32 (the backend's own float ->
 * S rounding), byte for byte; (b) qmatmul_fwd against cpu_qmatmul_fwd for each N, with and
 * without bias, output poisoned first. */
static void t_quant(ctx *c, glm_qtype t, int OC, int C, const int *Ns, int nN) {
    glm_backend *be = c->be;
    char name[160];
    const char *qn = glm_qtype_name(t);
    const size_t n = (size_t)OC * C, es = glm_dtype_size(c->dt);
    const glm_qlayout L = glm_qlayout_of(t, (size_t)OC, (size_t)C);
    float *w = quant_source(&c->rng, OC, C), *ref = malloc(sizeof(float) * n);
    uint8_t *hq = malloc(L.bytes);
    glm_quantize(t, hq, w, (size_t)OC, (size_t)C);
    cpu_dequantize(ref, hq, (int)t, OC, C);
    void *dq = up_raw(be, hq, L.bytes), *dref = up_s(be, ref, n), *dw = be->alloc(be, n * es);
    poison(be, dw, n, 0);
    be->dequantize(be, dw, dq, (int)t, OC, C);
    uint8_t *got = malloc(n * es), *want = malloc(n * es);
    be->download(be, got, dw, n * es);
    be->download(be, want, dref, n * es);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(got + i * es, want + i * es, es) != 0 && bad++ == 0) first = i;
    TEST_CHECK(c->tc, NAME("dequantize_%s_%s_%dx%d", qn, c->tag, OC, C), bad == 0,
               "%zu of %zu elements differ from the CPU's rounded to S (first at %zu)", bad, n, first);
    /* each dequantize kernel on the same matrix: 1 (a 16-byte chunk a thread), 2 (eight weights a
     * thread), 3 (scalar); shapes a kernel cannot take fall back */
    for (int v = 1; v <= 3; v++) {
        if (v == 3 && n > 100000) continue;
        poison(be, dw, n, 0);
        glmk_dequantize_cfg(c->dt, dw, dq, (int)t, OC, C, v, (cudaStream_t)glm_cuda_stream(be));
        be->download(be, got, dw, n * es);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(got + i * es, want + i * es, es) != 0 && bad++ == 0) first = i;
        TEST_CHECK(c->tc, NAME("dequantize_v%d_%s_%s_%dx%d", v, qn, c->tag, OC, C), bad == 0,
                   "%zu of %zu elements differ from the CPU's rounded to S (first at %zu)", bad, n, first);
    }
    /* the matrix 4 bytes off a 16-byte boundary: the scalar kernels, the same bytes */
    uint8_t *dq4 = be->alloc(be, L.bytes + 16);
    be->upload(be, dq4 + 4, hq, L.bytes);
    if (n <= 100000) {
        poison(be, dw, n, 0);
        be->dequantize(be, dw, dq4 + 4, (int)t, OC, C);
        be->download(be, got, dw, n * es);
        bad = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(got + i * es, want + i * es, es) != 0 && bad++ == 0) first = i;
        TEST_CHECK(c->tc, NAME("dequantize_unaligned_%s_%s_%dx%d", qn, c->tag, OC, C), bad == 0,
                   "%zu of %zu elements differ from the CPU's rounded to S (first at %zu)", bad, n, first);
    }
    free(got); free(want);
    float *bias = rnd(&c->rng, c->dt, OC, 0.1f);
    void *db = up_s(be, bias, OC);
    for (int k = 0; k < nN; k++) {
        const int N = Ns[k];
        float *x = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f), *r = malloc(sizeof(float) * N * OC);
        void *dx = up_s(be, x, (size_t)N * C), *dout = be->alloc(be, (size_t)N * OC * es);
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            cpu_qmatmul_fwd(r, x, hq, (int)t, with_bias ? bias : NULL, N, C, OC);
            poison(be, dout, (size_t)N * OC, 0);
            be->qmatmul_fwd(be, dout, dx, dq, (int)t, with_bias ? db : NULL, N, C, OC);
            float *o = down_s(be, dout, (size_t)N * OC);
            check_close(c->tc, NAME("qmatmul_fwd%s_%s_%s_%dx%dx%d", with_bias ? "_bias" : "", qn, c->tag, N, C, OC), o, r,
                        (size_t)N * OC, tol(c, 1e-5, 1e-2, 2e-3));
            free(o);
        }
        /* each kernel choice of glmk_qmatmul_fwd_cfg, whichever the default takes: SIMT with the
         * columns over 4 or 1 warps, 4 rows per warp group at N = 1, INT4 on tensor cores with
         * 32- and 16-row tiles (fp32 storage: SIMT) */
        static const int cfgs[6][3] = {{1, 4, 0}, {1, 1, 0}, {1, 4, 4}, {1, 1, 4}, {2, 0, 0}, {2, 0, 1}};
        cpu_qmatmul_fwd(r, x, hq, (int)t, bias, N, C, OC);
        for (int v = 0; v < 6; v++) {
            if ((v == 2 || v == 3) && N != 1) continue;
            if (v >= 4 && t != GLM_Q_INT4) continue;
            poison(be, dout, (size_t)N * OC, 0);
            glmk_qmatmul_fwd_cfg(c->dt, dout, dx, dq, (int)t, db, N, C, OC, cfgs[v][0], cfgs[v][1], cfgs[v][2],
                                 (cudaStream_t)glm_cuda_stream(be));
            float *o = down_s(be, dout, (size_t)N * OC);
            check_close(c->tc, NAME("qmatmul_fwd_p%dkw%drb%d_%s_%s_%dx%dx%d", cfgs[v][0], cfgs[v][1], cfgs[v][2], qn, c->tag, N,
                                    C, OC), o, r, (size_t)N * OC, tol(c, 1e-5, 1e-2, 2e-3));
            free(o);
        }
        if (n <= 100000 && k == 1) { /* the scalar kernel on the unaligned copy */
            cpu_qmatmul_fwd(r, x, hq, (int)t, bias, N, C, OC);
            poison(be, dout, (size_t)N * OC, 0);
            be->qmatmul_fwd(be, dout, dx, dq4 + 4, (int)t, db, N, C, OC);
            float *o = down_s(be, dout, (size_t)N * OC);
            check_close(c->tc, NAME("qmatmul_fwd_unaligned_%s_%s_%dx%dx%d", qn, c->tag, N, C, OC), o, r, (size_t)N * OC,
                        tol(c, 1e-5, 1e-2, 2e-3));
            free(o);
        }
        be->free(be, dx); be->free(be, dout);
        free(x); free(r);
    }
    be->free(be, dq); be->free(be, dq4); be->free(be, dref); be->free(be, dw); be->free(be, db);
    free(w); free(ref); free(hq); free(bias);
}

static void run_quant(ctx *c, int quick) {
    static const int n_small[] = {1, 3, 16, 40}, n_fallback[] = {1, 3, 16}, n_long[] = {1, 2, 5, 8}, n_big[] = {1};
    const glm_qtype ts[3] = {GLM_Q_INT8, GLM_Q_INT4, GLM_Q_NF4};
    for (int i = 0; i < 3; i++) {
        t_quant(c, ts[i], 37, 192, n_small, 4); /* OC not a multiple of the row blocks */
        t_quant(c, ts[i], 37, 384, n_small, 4); /* INT4: the tensor-core kernel (C % 128 == 0), fewer steps than warps */
        /* the scalar kernels: C not a multiple of a 16-byte chunk (NF4: blocks across rows) */
        if (ts[i] == GLM_Q_NF4) t_quant(c, ts[i], 40, 40, n_fallback, 3);
        else t_quant(c, ts[i], 37, 50, n_fallback, 3);
        if (quick) continue;
        t_quant(c, ts[i], 24, 16384, n_long, 4); /* many chunks per thread: the prefetch loop */
        t_quant(c, ts[i], 4096, 4096, n_big, 1);  /* a decode shape */
    }
}

/* ---- GLM_QUANT_BENCH=1: microseconds per call and GB/s, each call on another copy of the
 * weights (copies spanning > 256 MiB, so they come from HBM, not from L2), in a CUDA graph of
 * back-to-back calls (no launch gaps on the host). */
typedef struct {
    glm_backend *be;
    int kind; /* 0 qmatmul, 1 dequantize, 2 cuBLAS bf16 matmul_fwd, 3 copy */
    int qtype, N, C, OC, var; /* var: the kernel (qbench_call's table; dequantize: its variant) */
    void **w; /* the copies */
    void *x, *out;
    size_t bytes;
} qbench;

static void qbench_call(qbench *b, int i) {
    glm_backend *be = b->be;
    static const int cf[7][3] = {{0, 0, 0}, {1, 4, 8}, {1, 4, 4}, {1, 1, 8}, {1, 1, 4}, {2, 0, 0}, {2, 0, 1}};
    if (b->kind == 0)
        glmk_qmatmul_fwd_cfg(be->dtype, b->out, b->x, b->w[i], b->qtype, NULL, b->N, b->C, b->OC, cf[b->var][0],
                             cf[b->var][1], cf[b->var][2], (cudaStream_t)glm_cuda_stream(be));
    else if (b->kind == 1)
        glmk_dequantize_cfg(be->dtype, b->out, b->w[i], b->qtype, b->OC, b->C, b->var, (cudaStream_t)glm_cuda_stream(be));
    else if (b->kind == 2) be->matmul_fwd(be, b->out, b->x, b->w[i], NULL, b->N, b->C, b->OC);
    else be->copy(be, b->out, b->w[i], b->bytes);
}

/* microseconds per call */
static double qbench_time(qbench *b, int ncopies) {
    enum { PER_GRAPH = 48, REPS = 5 };
    cudaStream_t st = (cudaStream_t)glm_cuda_stream(b->be);
    for (int i = 0; i < ncopies; i++) qbench_call(b, i); /* warm-up (and cuBLAS plans) */
    b->be->sync(b->be);
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int graph = cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (graph) {
        for (int i = 0; i < PER_GRAPH; i++) qbench_call(b, i % ncopies);
        graph = cudaStreamEndCapture(st, &g) == cudaSuccess && cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    if (!graph) { cudaGetLastError(); printf("  (no CUDA graph: plain launches)\n"); }
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    if (graph) cudaGraphLaunch(ge, st);
    cudaEventRecord(e0, st);
    for (int r = 0; r < REPS; r++) {
        if (graph) cudaGraphLaunch(ge, st);
        else for (int i = 0; i < PER_GRAPH; i++) qbench_call(b, i % ncopies);
    }
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    return ms * 1e3 / (REPS * PER_GRAPH);
}

static void qbench_report(const char *what, double us, size_t bytes) {
    printf("  bench %-52s %9.2f us %8.0f GB/s\n", what, us, (double)bytes / (us * 1e3));
    fflush(stdout);
}

static int copies_for(size_t bytes) {
    size_t k = ((size_t)256 << 20) / bytes + 1;
    return (int)(k < 2 ? 2 : k > 64 ? 64 : k);
}

static void run_quant_bench(void) {
    char err[256], what[128];
    glm_backend *be = glm_backend_cuda(0, GLM_BF16, err, sizeof err);
    if (!be) { printf("  bench: no GPU (%s)\n", err); return; }
    const int shapes[4][2] = {{12288, 4096}, {4096, 4096}, {16384, 4096}, {4096, 16384}}; /* [OC, C] */
    const glm_qtype ts[3] = {GLM_Q_INT8, GLM_Q_INT4, GLM_Q_NF4};
    const size_t nmax = (size_t)16384 * 4096;
    float *src = malloc(sizeof(float) * nmax);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < nmax; i++) { /* about N(0, 0.05): a sum of 4 uniforms from a hash of i */
        uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ULL;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        z ^= z >> 31;
        float u = (float)(z & 0xffff) + (float)((z >> 16) & 0xffff) + (float)((z >> 32) & 0xffff) + (float)(z >> 48);
        src[i] = (u / 65536.0f - 2.0f) * 0.087f;
    }
    /* the achievable: a device-to-device copy of 512 MiB (read + write) */
    {
        size_t bytes = (size_t)512 << 20;
        void *a = be->alloc(be, bytes), *o = be->alloc(be, bytes);
        be->zero(be, a, bytes);
        qbench b = {be, 3, 0, 0, 0, 0, 0, &a, NULL, o, bytes};
        qbench_report("copy 512 MiB (read + write)", qbench_time(&b, 1), 2 * bytes);
        be->free(be, a); be->free(be, o);
    }
    for (int si = 0; si < 4; si++) {
        const int OC = shapes[si][0], C = shapes[si][1];
        const size_t n = (size_t)OC * C;
        void *x = be->alloc(be, (size_t)16 * C * 2), *out = be->alloc(be, n * 2 > (size_t)16 * OC * 2 ? n * 2 : (size_t)16 * OC * 2);
        glm_cuda_fill_normal(be, x, (size_t)16 * C, 7, 1.0f);
        /* cuBLAS bf16 (cuBLASLt through matmul_fwd), N = 1 and 16 */
        {
            size_t bytes = n * 2;
            int k = copies_for(bytes);
            void **w = malloc(sizeof(void *) * k);
            for (int i = 0; i < k; i++) { w[i] = be->alloc(be, bytes); glm_cuda_fill_normal(be, w[i], n, 11 + i, 0.05f); }
            for (int N = 1; N <= 16; N += 15) {
                qbench b = {be, 2, 0, N, C, OC, 0, w, x, out, 0};
                snprintf(what, sizeof what, "cublas_bf16 N=%d [%dx%d]", N, OC, C);
                qbench_report(what, qbench_time(&b, k), bytes + (size_t)N * (C + OC) * 2);
            }
            for (int i = 0; i < k; i++) be->free(be, w[i]);
            free(w);
        }
        for (int ti = 0; ti < 3; ti++) {
            const glm_qtype t = ts[ti];
            const glm_qlayout L = glm_qlayout_of(t, (size_t)OC, (size_t)C);
            uint8_t *hq = malloc(L.bytes);
            glm_quantize(t, hq, src, (size_t)OC, (size_t)C);
            int k = copies_for(L.bytes);
            void **w = malloc(sizeof(void *) * k);
            w[0] = up_raw(be, hq, L.bytes);
            for (int i = 1; i < k; i++) { w[i] = be->alloc(be, L.bytes); be->copy(be, w[i], w[0], L.bytes); }
            /* N = 1: the default, then each kernel */
            static const int cf[7][3] = {{0, 0, 0}, {1, 4, 8}, {1, 4, 4}, {1, 1, 8}, {1, 1, 4}, {2, 0, 0}, {2, 0, 1}};
            for (int v = 0; v < 7; v++) {
                if (v >= 5 && t != GLM_Q_INT4) continue;
                qbench b = {be, 0, (int)t, 1, C, OC, v, w, x, out, 0};
                snprintf(what, sizeof what, "qmatmul_fwd %s N=1 [%dx%d] %s p%d kw%d rb%d", glm_qtype_name(t), OC, C,
                         v ? "" : "default", cf[v][0], cf[v][1], cf[v][2]);
                qbench_report(what, qbench_time(&b, k), L.bytes + (size_t)(C + OC) * 2);
            }
            const int Ns[4] = {2, 4, 8, 16};
            for (int ni = 0; ni < 4; ni++)
                for (int v = 0; v < 4; v++) { /* default, SIMT kw 4, SIMT kw 1, tensor cores 16-row tiles */
                    const int N = Ns[ni], vv = v == 0 ? 0 : v == 1 ? 1 : v == 2 ? 3 : 6;
                    if (vv == 6 && t != GLM_Q_INT4) continue;
                    qbench b = {be, 0, (int)t, N, C, OC, vv, w, x, out, 0};
                    snprintf(what, sizeof what, "qmatmul_fwd %s N=%d [%dx%d] %s p%d kw%d rb%d", glm_qtype_name(t), N, OC, C,
                             vv ? "" : "default", cf[vv][0], cf[vv][1], cf[vv][2]);
                    qbench_report(what, qbench_time(&b, k), L.bytes + (size_t)N * (C + OC) * 2);
                }
            if (si == 2 || si == 1)
                for (int v = 1; v <= 2; v++) {
                    qbench b = {be, 1, (int)t, 0, C, OC, v, w, NULL, out, 0};
                    snprintf(what, sizeof what, "dequantize %s [%dx%d] -> bf16 v%d", glm_qtype_name(t), OC, C, v);
                    qbench_report(what, qbench_time(&b, k), L.bytes + n * 2);
                }
            for (int i = 0; i < k; i++) be->free(be, w[i]);
            free(w);
            free(hq);
        }
        be->free(be, x); be->free(be, out);
    }
    free(src);
    be->destroy(be);
}

/* ---------------------------------------------------------------- driver */

#include "glm2_ops_cases.h"

static void run_all(ctx *c, int quick, int attention_only) {
    if (attention_only == 2) { run_quant(c, quick); return; }
    if (!attention_only) {
        run_quant(c, quick);
        t_matmul(c, 1, 256, 384); /* decoding: one row */
        t_matmul(c, 3, 4096, 1000);
        t_matmul(c, 4, 200, 37);  /* odd output count */
        t_matmul(c, 2, 12, 20);   /* C not a multiple of 8 */
        t_matmul(c, 7, 16, 24);
        t_matmul(c, 64, 256, 384);
        t_matmul(c, 37, 8, 1000);  /* LoRA's B product (a sum of rank terms): the small-K kernel, a partial chunk */
        t_matmul(c, 33, 7, 64);    /* odd rank */
        t_matmul(c, 40, 16, 520);  /* rank 16 */
        if (!quick) t_matmul(c, 300, 8, 12288);
        if (!quick) t_matmul(c, 300, 512, 1000);
        t_lora(c, 37, 256, 4);
        t_lora(c, 64, 1024, 16);
        t_lora(c, 300, 4096, 8);   /* ChatGLM-6B's hidden size, rows past one block of the backward */
        t_lora(c, 33, 1000, 7);    /* packs not a multiple of a warp's, rank 7 */
        t_lora(c, 40, 16384, 8);   /* dense_4h_to_h's input width */
        t_lora(c, 5, 20, 8);       /* a row not in 16-byte packs: not taken */
        t_lora(c, 9, 64, 24);      /* rank above 16: not taken */
        if (!quick) t_lora(c, 2048, 4096, 8);
        t_dora(c, 37, 64, 96, 4);
        t_dora(c, 5, 1000, 33, 7);    /* a ragged block of rows, odd rank */
        t_dora(c, 130, 2900, 300, 16); /* row chunks of the scale and its backward past one */
        t_dora(c, 9, 100, 70, 24);    /* rank 24 */
        if (!quick) t_dora(c, 1024, 4096, 12288, 8); /* ChatGLM-6B's query_key_value */
        t_embedding(c, 37, 64, 20);
        if (!quick) t_embedding(c, 1024, 4096, 3000);
        t_layernorm(c, 5, 32);
        t_layernorm(c, 33, 1000);
        t_layernorm(c, 7, 37); /* odd width: the non-vector kernels */
        if (!quick) t_layernorm(c, 256, 4096);
        if (!quick) t_layernorm(c, 9, 16384); /* wider than the register-held rows: a block a row */
        t_rope(c, 12, 2, 8);
        t_rope(c, 1, 32, 128); /* decoding: one token, a block per head */
        t_rope(c, 64, 4, 128);
        t_rope(c, 70, 3, 64);  /* head 64: quarter-heads of 16 (two bf16 packs)  */
        t_elementwise(c, 1001);
        if (!quick) t_elementwise(c, 4096 * 64);
        t_tanh(c, 1001);
        if (!quick) t_tanh(c, 4096 * 64);
        t_argmax(c, 1, 1000);
        t_argmax(c, 9, 130528); /* ChatGLM-6B's vocabulary */
        t_upload_cast(c, 1003);
        if (!quick) t_upload_cast(c, (40u << 20) + 7); /* past the 16M-float staging buffer */
        t_prefix(c, 2, 7, 3, 2, 8);
        t_prefix(c, 3, 130, 16, 4, 64);
        t_prefix(c, 2, 5, 4, 3, 6); /* head size 6: the scalar (unpacked) kernels */
        t_cross_entropy(c, 5, 50);
        t_cross_entropy(c, 7, 4096);  /* rows in 16-byte packs */
        if (!quick) t_cross_entropy(c, 64, 130528);
        t_optim(c, 10007);
        if (!quick) t_optim(c, 3000017);
        t_adam8(c, 1);
        t_adam8(c, 2049);
        t_adam8(c, 10007);
        if (!quick) t_adam8(c, 3000017);
        run_glm2_ops(c, quick);
    }
    run_glm2_attention(c, quick);
    t_attention(c, 2, 12, 2, 8, 1);
    t_attention(c, 2, 77, 3, 64, 1);
    t_attention(c, 2, 130, 2, 128, 0);
    if (!quick) t_attention(c, 1, 512, 2, 128, 0);
    /* the wgmma kernels' tile edges: 128-query / 128-key blocks, 64-row steps, ragged ends */
    t_attention(c, 1, 300, 2, 64, 1);
    if (!quick) t_attention(c, 2, 1100, 1, 128, 0);
    t_attention_cached(c, 2, 3, 20, 2, 8);
    t_attention_cached(c, 2, 1, 70, 2, 128);
    /* the decoding kernel (k_decode.cu: Tq <= 4, the keys split in chunks): long caches, ragged
     * last chunks, several queries per row, head sizes 32..128 */
    t_attention_cached(c, 1, 1, 2048, 4, 128);
    t_attention_cached(c, 2, 2, 301, 3, 128);
    t_attention_cached(c, 3, 4, 257, 2, 64);
    t_attention_cached(c, 2, 1, 197, 2, 96);
    t_attention_cached(c, 1, 3, 164, 2, 32);
}

int main(int argc, char **argv) {
    setenv("GLM_CUDA_ORTH", "1", 1); /* orth_f64 on the device (off by default until it has run on a GPU) */
    int quick = 0, quant_only = 0, attn_only = 0;
    const char *only = NULL; /* one variant (a dtype or an attention path's tag): isolates a crash */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--quant") == 0) quant_only = 1;
        else if (strcmp(argv[i], "--attention") == 0) attn_only = 1; /* the attention cases alone, every path */
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    }
    test_counts tc = {0};
    char err[256];
    /* the products timed at their first call (a run times a class of shapes at its second): the
     * kernels a run would pick are the ones tested */
    setenv("GLM_CUDA_GEMM_TUNE", "1", 0);
    glm_dtype dts[3] = {GLM_F32, GLM_BF16, GLM_F16};
    for (int i = 0; i < 3; i++) {
        if ((quick && dts[i] == GLM_F16) || (only && strcmp(only, dt_name(dts[i])) != 0)) continue;
        glm_backend *be = glm_backend_cuda(0, dts[i], err, sizeof err);
        if (!be && dts[i] == GLM_F32) { TEST_SKIP(&tc, "cuda_ops", "%s", err); TEST_EXIT(&tc); }
        if (!be) { TEST_SKIP(&tc, dt_name(dts[i]), "%s", err); continue; } /* bf16 on Turing */
        be->tune_products = 1; /* the products on the kernels training would time and pick */
        ctx c = {be, dts[i], dt_name(dts[i]), &tc, {{0}}};
        glm_rng_seed(&c.rng, 1234 + i);
        run_all(&c, quick, quant_only ? 2 : attn_only);
        be->destroy(be);
    }
    const char *qb = getenv("GLM_QUANT_BENCH");
    if (qb && strcmp(qb, "0") != 0 && qb[0]) run_quant_bench();
    const char *ab = getenv("GLM_ADAM8_BENCH");
    if (ab && strcmp(ab, "0") != 0 && ab[0]) run_adam8_bench();
    if (quant_only) {
        printf("%d passed, %d failed, %d skipped\n", tc.pass, tc.fail, tc.skip);
        TEST_EXIT(&tc);
    }
    /* the attention cases again on the other paths: the SIMT kernels on bf16 storage (bf16
     * normally takes tensor cores), --full_determinism's backend flag (bit-identical repeats of
     * the backward), and on a 9.0 device, where bf16/fp16 took the wgmma kernels above, the
     * mma.sync pair */
    const struct { const char *tag, *attn; glm_dtype dt; int deterministic, hopper_only; uint64_t seed; } alt[] = {
        {"bf16simt", "simt", GLM_BF16, 0, 0, 99}, {"bf16det", NULL, GLM_BF16, 1, 0, 55},
        {"bf16mma", "mma", GLM_BF16, 0, 1, 77},   {"f16mma", "mma", GLM_F16, 0, 1, 78},
    };
    for (size_t i = 0; i < sizeof alt / sizeof *alt; i++) {
        if ((alt[i].hopper_only && !glmk_flash90_available(0)) || (only && strcmp(only, alt[i].tag) != 0)) continue;
        if (alt[i].attn) setenv("GLM_CUDA_ATTN", alt[i].attn, 1);
        glm_backend *be = glm_backend_cuda(0, alt[i].dt, err, sizeof err);
        unsetenv("GLM_CUDA_ATTN");
        if (!be) { TEST_SKIP(&tc, alt[i].tag, "%s", err); continue; }
        be->deterministic = alt[i].deterministic;
        ctx c = {be, alt[i].dt, alt[i].tag, &tc, {{0}}};
        glm_rng_seed(&c.rng, alt[i].seed);
        run_all(&c, quick, 1);
        be->destroy(be);
    }
    printf("%d passed, %d failed, %d skipped\n", tc.pass, tc.fail, tc.skip);
    TEST_EXIT(&tc);
}
