/* Every CUDA op against its CPU twin (backend/cpu/cpu_ops.c) on fresh random inputs of several
 * shapes, for storage fp32 (tolerance ~1e-5), bf16 and fp16 (per-tensor tolerances). Inputs
 * are rounded to the storage dtype first, so both sides compute on the same numbers; outputs
 * are poisoned with NaN first, so an element the kernel never writes fails the check.
 * Attention runs both the tensor-core path (bf16/fp16, head size 64/128) and the SIMT path.
 *   test_cuda_ops [--quick] [--only f32|bf16|f16|bf16simt]
 * (--quick: small shapes, for compute-sanitizer runs; --only: one variant, to isolate a crash) */
#include <stdlib.h>
#include "backend/cpu/cpu_ops.h"
#include "cuda_test_util.h"

typedef struct {
    glm_backend *be;
    glm_dtype dt;
    const char *tag; /* dtype name, or "bf16simt" */
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
    void *bufs[] = {di, dw, db, dout, dg, dgi, dgw, dgb};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    float *hs[] = {inp, w, bias, ref, g, gi0, gw0, gb0, ri, rw, rb, oi, ow, ob};
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
    return (glm_qkv_view){(char *)base + off * es, bs, ts, hs};
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
    /* to_f32 (optional op) */
    float *dev32 = be->alloc(be, n * sizeof(float));
    be->to_f32(be, dev32, dx, n);
    got = down_f(be, dev32, n);
    check_close(c->tc, NAME("to_f32_%s_%zu", c->tag, n), got, x, n, 0);
    free(got);
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
    for (int grad = 0; grad < 2; grad++) {
        float dscale = grad ? 1.0f / R : 0.0f;
        memcpy(ref, l, sizeof(float) * n);
        cpu_cross_entropy(ref, rl, t, R, V, dscale);
        be->upload_f32(be, dl, l, n);
        poison(be, dloss, R, 1);
        be->cross_entropy(be, dl, dloss, dt, R, V, dscale);
        float *gl = down_f(be, dloss, R), *gg = down_s(be, dl, n);
        check_close(c->tc, NAME("cross_entropy_loss%s_%s_%dx%d", grad ? "_grad" : "", c->tag, R, V), gl, rl, R, tol(c, 1e-5, 1e-4, 1e-4));
        if (grad) check_close(c->tc, NAME("cross_entropy_dlogits_%s_%dx%d", c->tag, R, V), gg, ref, n, tol(c, 1e-5, 1e-2, 2e-3));
        else check_close(c->tc, NAME("cross_entropy_logits_untouched_%s_%dx%d", c->tag, R, V), gg, l, n, 0);
        free(gl); free(gg);
    }
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
    be->free(be, dx); be->free(be, dp); be->free(be, dm); be->free(be, dv);
    float *hs[] = {x, p, m, v, rp, rm, rv, ps, gp, gm, gv, rps};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
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

/* ---------------------------------------------------------------- driver */

static void run_all(ctx *c, int quick, int attention_only) {
    if (!attention_only) {
        t_matmul(c, 7, 16, 24);
        t_matmul(c, 64, 256, 384);
        if (!quick) t_matmul(c, 300, 512, 1000);
        t_embedding(c, 37, 64, 20);
        if (!quick) t_embedding(c, 1024, 4096, 3000);
        t_layernorm(c, 5, 32);
        t_layernorm(c, 33, 1000);
        t_layernorm(c, 7, 37); /* odd width: the non-vector kernels */
        if (!quick) t_layernorm(c, 256, 4096);
        t_rope(c, 12, 2, 8);
        t_rope(c, 64, 4, 128);
        t_elementwise(c, 1001);
        if (!quick) t_elementwise(c, 4096 * 64);
        t_tanh(c, 1001);
        if (!quick) t_tanh(c, 4096 * 64);
        t_prefix(c, 2, 7, 3, 2, 8);
        t_prefix(c, 3, 130, 16, 4, 64);
        t_prefix(c, 2, 5, 4, 3, 6); /* head size 6: the scalar (unpacked) kernels */
        t_cross_entropy(c, 5, 50);
        if (!quick) t_cross_entropy(c, 64, 130528);
        t_optim(c, 10007);
        if (!quick) t_optim(c, 3000017);
    }
    t_attention(c, 2, 12, 2, 8, 1);
    t_attention(c, 2, 77, 3, 64, 1);
    t_attention(c, 2, 130, 2, 128, 0);
    if (!quick) t_attention(c, 1, 512, 2, 128, 0);
    t_attention_cached(c, 2, 3, 20, 2, 8);
    t_attention_cached(c, 2, 1, 70, 2, 128);
}

int main(int argc, char **argv) {
    int quick = 0;
    const char *only = NULL; /* f32, bf16, f16 or bf16simt: one variant (isolates a crash) */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    }
    test_counts tc = {0};
    char err[256];
    glm_dtype dts[3] = {GLM_F32, GLM_BF16, GLM_F16};
    for (int i = 0; i < 3; i++) {
        if ((quick && dts[i] == GLM_F16) || (only && strcmp(only, dt_name(dts[i])) != 0)) continue;
        glm_backend *be = glm_backend_cuda(0, dts[i], err, sizeof err);
        if (!be) { TEST_SKIP(&tc, "cuda_ops", "%s", err); TEST_EXIT(&tc); }
        ctx c = {be, dts[i], dt_name(dts[i]), &tc, {{0}}};
        glm_rng_seed(&c.rng, 1234 + i);
        run_all(&c, quick, 0);
        be->destroy(be);
    }
    /* the SIMT attention kernels on bf16 storage too (bf16 normally takes the tensor-core path) */
    if (only && strcmp(only, "bf16simt") != 0) {
        printf("%d passed, %d failed, %d skipped\n", tc.pass, tc.fail, tc.skip);
        TEST_EXIT(&tc);
    }
    setenv("GLM_CUDA_ATTN", "simt", 1);
    glm_backend *be = glm_backend_cuda(0, GLM_BF16, err, sizeof err);
    unsetenv("GLM_CUDA_ATTN");
    ctx c = {be, GLM_BF16, "bf16simt", &tc, {{0}}};
    glm_rng_seed(&c.rng, 99);
    run_all(&c, quick, 1);
    be->destroy(be);
    printf("%d passed, %d failed, %d skipped\n", tc.pass, tc.fail, tc.skip);
    TEST_EXIT(&tc);
}
