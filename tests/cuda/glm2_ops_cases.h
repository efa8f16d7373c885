/* The ChatGLM2 family's ops against their CPU twins (included by test_cuda_ops.c, whose ctx,
 * NAME and tolerances they use): RMSNorm, SwiGLU, rotary on pairs, grouped-query attention in
 * the training layout (q | k | v rows, backward summing each group) and over a k|v cache
 * (the decoding kernel), copy_rows. */
#ifndef GLM2_OPS_CASES_H
#define GLM2_OPS_CASES_H

static void t_rmsnorm(ctx *c, int N, int C) {
    glm_backend *be = c->be;
    char name[128];
    float *x = rnd(&c->rng, c->dt, (size_t)N * C, 2.0f), *w = rnd(&c->rng, c->dt, C, 0.2f);
    for (int i = 0; i < C; i++) w[i] = round_one(c->dt, w[i] + 1.0f);
    float *ref = malloc(sizeof(float) * N * C), *rr = malloc(sizeof(float) * N);
    cpu_rmsnorm_fwd(ref, rr, x, w, N, C, 1e-5f);
    void *dx = up_s(be, x, (size_t)N * C), *dw = up_s(be, w, C), *dout = be->alloc(be, (size_t)N * C * glm_dtype_size(c->dt));
    float *dr = be->alloc(be, sizeof(float) * N);
    poison(be, dout, (size_t)N * C, 0);
    poison(be, dr, N, 1);
    be->rmsnorm_fwd(be, dout, dr, dx, dw, N, C, 1e-5f);
    float *got = down_s(be, dout, (size_t)N * C), *gr = down_f(be, dr, N);
    check_close(c->tc, NAME("rmsnorm_fwd_%s_%dx%d", c->tag, N, C), got, ref, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("rmsnorm_rstd_%s_%dx%d", c->tag, N, C), gr, rr, N, 1e-5);
    float *g = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f), *w0 = rnd(&c->rng, c->dt, C, 0.1f);
    float *rdx = malloc(sizeof(float) * N * C), *rdw = fcopy(w0, C);
    cpu_rmsnorm_bwd(rdx, rdw, g, x, w, rr, N, C);
    void *dg = up_s(be, g, (size_t)N * C), *ddw = up_s(be, w0, C);
    poison(be, dout, (size_t)N * C, 0);
    be->rmsnorm_bwd(be, dout, ddw, dg, dx, dw, dr, N, C);
    float *odx = down_s(be, dout, (size_t)N * C), *odw = down_s(be, ddw, C);
    check_close(c->tc, NAME("rmsnorm_bwd_dx_%s_%dx%d", c->tag, N, C), odx, rdx, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    check_close(c->tc, NAME("rmsnorm_bwd_dw_%s_%dx%d", c->tag, N, C), odw, rdw, C, tol(c, 1e-5, 1e-2, 2e-3));
    poison(be, dout, (size_t)N * C, 0); /* a frozen norm: dx alone */
    be->rmsnorm_bwd(be, dout, NULL, dg, dx, dw, dr, N, C);
    float *fdx = down_s(be, dout, (size_t)N * C);
    check_close(c->tc, NAME("rmsnorm_bwd_frozen_dx_%s_%dx%d", c->tag, N, C), fdx, rdx, (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
    if (be->rmsnorm_bwd_add) { /* dx + a residual branch's gradient in the same pass, with dw and frozen */
        float *res = rnd(&c->rng, c->dt, (size_t)N * C, 1.0f), *rsum = malloc(sizeof(float) * N * C);
        for (size_t i = 0; i < (size_t)N * C; i++) rsum[i] = rdx[i] + res[i];
        void *dres = up_s(be, res, (size_t)N * C);
        for (int frozen = 0; frozen < 2; frozen++) {
            float *rw2 = fcopy(w0, C);
            cpu_rmsnorm_bwd(rdx, rw2, g, x, w, rr, N, C);
            be->upload_f32(be, ddw, w0, C);
            poison(be, dout, (size_t)N * C, 0);
            be->rmsnorm_bwd_add(be, dout, frozen ? NULL : ddw, dg, dx, dw, dr, dres, N, C);
            float *adx = down_s(be, dout, (size_t)N * C), *adw = down_s(be, ddw, C);
            check_close(c->tc, NAME("rmsnorm_bwd_add%s_dx_%s_%dx%d", frozen ? "_frozen" : "", c->tag, N, C), adx, rsum,
                        (size_t)N * C, tol(c, 1e-5, 1e-2, 2e-3));
            if (!frozen) check_close(c->tc, NAME("rmsnorm_bwd_add_dw_%s_%dx%d", c->tag, N, C), adw, rw2, C, tol(c, 1e-5, 1e-2, 2e-3));
            free(rw2); free(adx); free(adw);
        }
        be->free(be, dres);
        free(res); free(rsum);
    }
    void *bufs[] = {dx, dw, dout, dr, dg, ddw};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    float *hs[] = {x, w, ref, rr, got, gr, g, w0, rdx, rdw, odx, odw, fdx};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

static void t_swiglu(ctx *c, int N, int F) {
    glm_backend *be = c->be;
    char name[128];
    size_t n = (size_t)N * F;
    float *x = rnd(&c->rng, c->dt, 2 * n, 3.0f), *ref = malloc(sizeof(float) * n);
    cpu_swiglu_fwd(ref, x, N, F);
    void *dx = up_s(be, x, 2 * n), *dout = be->alloc(be, n * glm_dtype_size(c->dt));
    poison(be, dout, n, 0);
    be->swiglu_fwd(be, dout, dx, N, F);
    float *got = down_s(be, dout, n);
    check_close(c->tc, NAME("swiglu_fwd_%s_%dx%d", c->tag, N, F), got, ref, n, tol(c, 1e-5, 1e-2, 2e-3));
    float *g = rnd(&c->rng, c->dt, n, 1.0f), *rdx = malloc(sizeof(float) * 2 * n);
    cpu_swiglu_bwd(rdx, x, g, N, F);
    void *dg = up_s(be, g, n), *ddx = be->alloc(be, 2 * n * glm_dtype_size(c->dt));
    poison(be, ddx, 2 * n, 0);
    be->swiglu_bwd(be, ddx, dx, dg, N, F);
    float *gdx = down_s(be, ddx, 2 * n);
    check_close(c->tc, NAME("swiglu_bwd_%s_%dx%d", c->tag, N, F), gdx, rdx, 2 * n, tol(c, 1e-5, 1e-2, 2e-3));
    be->free(be, dx); be->free(be, dout); be->free(be, dg); be->free(be, ddx);
    free(x); free(ref); free(got); free(g); free(rdx); free(gdx);
}

/* The q heads then the k heads of rows W wide, as the ChatGLM2 block calls it. */
static void t_rope_pairs(ctx *c, int N, int NH, int NKV, int HD, float theta) {
    glm_backend *be = c->be;
    char name[128];
    int W = (NH + 2 * NKV) * HD;
    size_t n = (size_t)N * W;
    int32_t *pos = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) pos[i] = (int32_t)glm_rng_below(&c->rng, 8192);
    float *x = rnd(&c->rng, c->dt, n, 1.0f);
    void *dp = up_raw(be, pos, sizeof(int32_t) * N), *dx = up_s(be, x, n);
    for (int inv = 0; inv < 2; inv++) {
        float *ref = fcopy(x, n);
        cpu_rope_pairs(ref, W, N, NH, HD, HD / 2, pos, theta, inv);
        cpu_rope_pairs(ref + NH * HD, W, N, NKV, HD, HD / 2, pos, theta, inv);
        be->upload_f32(be, dx, x, n);
        be->rope_pairs(be, dx, W, N, NH, HD, HD / 2, dp, theta, inv);
        be->rope_pairs(be, glm_at(be, dx, (size_t)NH * HD), W, N, NKV, HD, HD / 2, dp, theta, inv);
        float *got = down_s(be, dx, n);
        /* angles up to 8191 rad: cos/sin arguments lose ~1e-3 in fp32 reduction on both sides alike */
        check_close(c->tc, NAME("rope_pairs%s_%s_N%dNH%dNKV%dHD%d", inv ? "_inverse" : "", c->tag, N, NH, NKV, HD), got, ref,
                    n, tol(c, 2e-5, 1e-2, 2e-3));
        free(ref);
        free(got);
    }
    be->free(be, dp); be->free(be, dx);
    free(pos); free(x);
}

/* Causal key ranges per segment, as the ChatGLM2 rule makes them (padding its own segment). */
static void causal_ranges(glm_rng *r, int B, int T, int32_t *lo, int32_t *hi) {
    for (int b = 0; b < B; b++) {
        int n = T - (int)glm_rng_below(r, T / 4 + 1), s = 0;
        if (b == 1 && n > 8) s = n / 3; /* a packed second example */
        for (int i = 0; i < T; i++) {
            int start = i < s ? 0 : i < n ? s : n;
            lo[b * T + i] = start;
            hi[b * T + i] = i + 1;
        }
    }
}

/* Training layout [B, T, W] with W = (NH + 2 NKV) HD: q | k | v; forward and backward. */
static void t_attention_grouped(ctx *c, int B, int T, int NH, int NKV, int HD) {
    glm_backend *be = c->be;
    char name[160];
    int g = NH / NKV;
    long W = (long)(NH + 2 * NKV) * HD, bs = (long)T * W;
    size_t es = glm_dtype_size(c->dt), nq = (size_t)B * T * W, no = (size_t)B * T * NH * HD, nl = (size_t)B * NH * T;
    int32_t *lo = malloc(sizeof(int32_t) * B * T), *hi = malloc(sizeof(int32_t) * B * T);
    causal_ranges(&c->rng, B, T, lo, hi);
    float *qkv = rnd(&c->rng, c->dt, nq, 1.0f), *out = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl);
    float scale = 1.0f / sqrtf((float)HD);
#define GV(base, e, off, grp) ((glm_qkv_view){(char *)(base) + (size_t)(off) * (e), bs, W, HD, grp})
    cpu_attention_fwd(out, lse, GV(qkv, 4, 0, 1), GV(qkv, 4, NH * HD, g), GV(qkv, 4, (NH + NKV) * HD, g), lo, hi, B, T, T, NH,
                      HD, scale);
    void *dqkv = up_s(be, qkv, nq), *dlo = up_raw(be, lo, sizeof(int32_t) * B * T), *dhi = up_raw(be, hi, sizeof(int32_t) * B * T);
    void *dout = be->alloc(be, no * es);
    float *dlse = be->alloc(be, nl * sizeof(float));
    poison(be, dout, no, 0);
    poison(be, dlse, nl, 1);
    glm_qkv_view q = GV(dqkv, es, 0, 1), k = GV(dqkv, es, NH * HD, g), v = GV(dqkv, es, (NH + NKV) * HD, g);
    be->attention_fwd(be, dout, dlse, q, k, v, dlo, dhi, B, T, T, NH, HD, scale);
    float *go = down_s(be, dout, no), *gl = down_f(be, dlse, nl);
    check_close(c->tc, NAME("attention_grouped_fwd_out_%s_B%dT%dNH%dNKV%dHD%d", c->tag, B, T, NH, NKV, HD), go, out, no,
                tol(c, 1e-5, 2e-2, 4e-3));
    check_close(c->tc, NAME("attention_grouped_fwd_lse_%s_B%dT%dNH%dNKV%dHD%d", c->tag, B, T, NH, NKV, HD), gl, lse, nl,
                tol(c, 1e-5, 1e-3, 1e-3));
    float *gr = rnd(&c->rng, c->dt, no, 1.0f), *rd = malloc(sizeof(float) * nq);
    for (size_t i = 0; i < nq; i++) rd[i] = NAN;
    cpu_attention_bwd(GV(rd, 4, 0, 1), GV(rd, 4, NH * HD, g), GV(rd, 4, (NH + NKV) * HD, g), gr, out, lse, GV(qkv, 4, 0, 1),
                      GV(qkv, 4, NH * HD, g), GV(qkv, 4, (NH + NKV) * HD, g), lo, hi, B, T, T, NH, HD, scale);
    void *dg = up_s(be, gr, no), *dd = be->alloc(be, nq * es);
    poison(be, dd, nq, 0);
    be->attention_bwd(be, GV(dd, es, 0, 1), GV(dd, es, NH * HD, g), GV(dd, es, (NH + NKV) * HD, g), dg, dout, dlse, q, k, v,
                      dlo, dhi, B, T, T, NH, HD, scale);
    float *gd = down_s(be, dd, nq);
    /* dq | dk | dv parts of every row, compared separately */
    const char *part[3] = {"dq", "dk", "dv"};
    long off[4] = {0, (long)NH * HD, (long)(NH + NKV) * HD, W};
    for (int p = 0; p < 3; p++) {
        size_t w = (size_t)(off[p + 1] - off[p]), m = (size_t)B * T * w;
        float *a = malloc(sizeof(float) * m), *r = malloc(sizeof(float) * m);
        for (size_t t = 0; t < (size_t)B * T; t++) {
            memcpy(a + t * w, gd + t * W + off[p], sizeof(float) * w);
            memcpy(r + t * w, rd + t * W + off[p], sizeof(float) * w);
        }
        check_close(c->tc, NAME("attention_grouped_bwd_%s_%s_B%dT%dNH%dNKV%dHD%d", part[p], c->tag, B, T, NH, NKV, HD), a, r, m,
                    tol(c, 2e-5, 3e-2, 6e-3));
        free(a); free(r);
    }
#undef GV
    void *bufs[] = {dqkv, dlo, dhi, dout, dlse, dg, dd};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    void *hs2[] = {lo, hi, qkv, out, lse, go, gl, gr, rd, gd};
    for (size_t i = 0; i < sizeof hs2 / sizeof *hs2; i++) free(hs2[i]);
}

/* Decoding: Tq queries (their own rows) over a k|v cache [B, Tmax, 2 NKV HD] of Tk keys. */
static void t_attention_grouped_cached(ctx *c, int B, int Tq, int Tk, int NH, int NKV, int HD) {
    glm_backend *be = c->be;
    char name[160];
    int g = NH / NKV, Tmax = Tk + 3;
    long KV = 2L * NKV * HD, cbs = (long)Tmax * KV, qbs = (long)Tq * NH * HD;
    size_t es = glm_dtype_size(c->dt), nc = (size_t)B * Tmax * KV, nqq = (size_t)B * Tq * NH * HD, nl = (size_t)B * NH * Tq;
    int32_t *lo = malloc(sizeof(int32_t) * B * Tq), *hi = malloc(sizeof(int32_t) * B * Tq);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tq; i++) { lo[b * Tq + i] = b; hi[b * Tq + i] = Tk - Tq + i + 1; }
    float *cache = rnd(&c->rng, c->dt, nc, 1.0f), *qs = rnd(&c->rng, c->dt, nqq, 1.0f);
    float *out = malloc(sizeof(float) * nqq), *lse = malloc(sizeof(float) * nl);
    float scale = 1.0f / sqrtf((float)HD);
    glm_qkv_view rq = {qs, qbs, (long)NH * HD, HD, 1}, rk = {cache, cbs, KV, HD, g}, rv = {cache + NKV * HD, cbs, KV, HD, g};
    cpu_attention_fwd(out, lse, rq, rk, rv, lo, hi, B, Tq, Tk, NH, HD, scale);
    void *dc = up_s(be, cache, nc), *dq = up_s(be, qs, nqq);
    void *dlo = up_raw(be, lo, sizeof(int32_t) * B * Tq), *dhi = up_raw(be, hi, sizeof(int32_t) * B * Tq);
    void *dout = be->alloc(be, nqq * es);
    float *dlse = be->alloc(be, nl * sizeof(float));
    poison(be, dout, nqq, 0);
    glm_qkv_view q = {dq, qbs, (long)NH * HD, HD, 1}, k = {dc, cbs, KV, HD, g}, v = {glm_at(be, dc, (size_t)NKV * HD), cbs, KV, HD, g};
    be->attention_fwd(be, dout, dlse, q, k, v, dlo, dhi, B, Tq, Tk, NH, HD, scale);
    float *go = down_s(be, dout, nqq), *gl = down_f(be, dlse, nl);
    check_close(c->tc, NAME("attention_grouped_cached_out_%s_B%dTq%dTk%dNH%dNKV%dHD%d", c->tag, B, Tq, Tk, NH, NKV, HD), go,
                out, nqq, tol(c, 1e-5, 2e-2, 4e-3));
    check_close(c->tc, NAME("attention_grouped_cached_lse_%s_B%dTq%dTk%dNH%dNKV%dHD%d", c->tag, B, Tq, Tk, NH, NKV, HD), gl,
                lse, nl, tol(c, 1e-5, 1e-3, 1e-3));
    void *bufs[] = {dc, dq, dlo, dhi, dout, dlse};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(be, bufs[i]);
    void *hs[] = {lo, hi, cache, qs, out, lse, go, gl};
    for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) free(hs[i]);
}

static void t_copy_rows(ctx *c, int rows, int width, int sstride, int dstride) {
    glm_backend *be = c->be;
    char name[128];
    size_t ns = (size_t)rows * sstride, nd = (size_t)rows * dstride;
    float *s = rnd(&c->rng, c->dt, ns, 1.0f), *ref = malloc(sizeof(float) * nd);
    for (size_t i = 0; i < nd; i++) ref[i] = -7.0f;
    for (int r = 0; r < rows; r++) memcpy(ref + (size_t)r * dstride, s + (size_t)r * sstride, sizeof(float) * width);
    void *ds = up_s(be, s, ns), *dd = up_s(be, ref, nd);
    float *minus = malloc(sizeof(float) * nd);
    for (size_t i = 0; i < nd; i++) minus[i] = -7.0f;
    be->upload_f32(be, dd, minus, nd);
    be->copy_rows(be, dd, dstride, ds, sstride, width, rows);
    float *got = down_s(be, dd, nd);
    check_close(c->tc, NAME("copy_rows_%s_%dx%d", c->tag, rows, width), got, ref, nd, 0.0);
    be->free(be, ds); be->free(be, dd);
    free(s); free(ref); free(minus); free(got);
}

static void run_glm2_ops(ctx *c, int quick) {
    t_rmsnorm(c, 5, 32);
    t_rmsnorm(c, 33, 1000);
    t_rmsnorm(c, 7, 37); /* odd width: the non-vector kernels */
    t_rmsnorm(c, 300, 4096); /* more rows than the backward's fixed grid */
    if (!quick) t_rmsnorm(c, 1024, 4096);
    t_swiglu(c, 7, 48);
    t_swiglu(c, 5, 13); /* odd width: the non-vector kernels */
    if (!quick) t_swiglu(c, 512, 13696);
    t_rope_pairs(c, 9, 4, 2, 16, 10000.0f);
    t_rope_pairs(c, 64, 8, 2, 128, 5e6f);
    t_rope_pairs(c, 1100, 4, 2, 64, 10000.0f); /* enough tokens for one thread to take every head */
    t_copy_rows(c, 5, 24, 40, 32);
}

static void run_glm2_attention(ctx *c, int quick) {
    t_attention_grouped(c, 2, 12, 4, 2, 8);
    t_attention_grouped(c, 2, 77, 6, 3, 64);
    t_attention_grouped(c, 2, 130, 8, 2, 128);
    if (!quick) t_attention_grouped(c, 1, 512, 32, 2, 128);
    t_attention_grouped_cached(c, 2, 3, 20, 4, 2, 8);
    t_attention_grouped_cached(c, 2, 1, 300, 8, 2, 128);
    t_attention_grouped_cached(c, 1, 1, 2048, 32, 2, 128);
}
#endif
