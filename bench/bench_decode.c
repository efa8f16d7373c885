/* Decoding speed and memory of the CUDA backend on ChatGLM-6B shapes (the tied download),
 * batch 1: a prompt of P tokens in one call, then one token per call up to T tokens with the
 * KV cache, as `glmtrain chat` runs it (logits of the new token to the host every step).
 * Random weights on the device; --quant stores the linear weights quantized.
 *
 *   bench_decode [--family chatglm|chatglm2] [--quant int8|int4|nf4] [--prompt 1024] [--total 2048] [--layers L]
 *                [--detail] [--verify 1,2,4,8,11,16] [--out FILE]
 * (--family chatglm2: ChatGLM2-6B's shapes, 2 key/value groups, a causal prompt)
 * (--detail: one more decode step at the end with an event at every op, printed per op;
 *  --attn_only: only the attention of one decode step over a 2048-key cache of the model's shape,
 *  28 calls back to back, by kernel: the decoding kernel and the flash kernel)
 * (--verify LIST: after the decode, passes of k new tokens each after the prompt, as prompt lookup
 *  checks a draft (infer/generate.c): every row's logits to the host (glm_cached_rows_logits), the
 *  cache rewound after each pass; the median of 40 passes for each k of LIST, and what it is
 *  against a one-token step)
 *
 * Reported: prefill ms, decode tokens/s (median step over the decode), the weight bytes read per
 * token and what that is as GB/s, and peak GPU memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_kernels.h"
#include "bench_common.h"
#include "model/glm.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

int main(int argc, char **argv) {
    int quant = 0, P = 1024, T = 2048, layers = 0, detail = 0, attn_only = 0, glm2 = 0;
    const char *out = NULL, *verify = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--quant")) {
            quant = bench_parse_quant(v);
            if (quant < 0) { fprintf(stderr, "bench_decode: --quant int8|int4|nf4\n"); return 2; }
            i++;
        } else if (!strcmp(a, "--prompt")) { P = atoi(v); i++; }
        else if (!strcmp(a, "--total")) { T = atoi(v); i++; }
        else if (!strcmp(a, "--layers")) { layers = atoi(v); i++; }
        else if (!strcmp(a, "--detail")) detail = 1;
        else if (!strcmp(a, "--attn_only")) attn_only = 1;
        else if (!strcmp(a, "--family")) { glm2 = !strcmp(v, "chatglm2"); i++; }
        else if (!strcmp(a, "--out")) { out = v; i++; }
        else if (!strcmp(a, "--verify")) { verify = v; i++; }
        else { fprintf(stderr, "usage: see the header of bench/bench_decode.c (unknown %s)\n", a); return 2; }
    }
    if (P < 1 || T <= P) { fprintf(stderr, "bench_decode: need 1 <= --prompt < --total\n"); return 2; }
    glm_config c = glm2 ? glm_config_chatglm2_6b() : glm_config_chatglm6b();
    if (layers > 0) c.num_layers = layers;
    c.quant = quant;
    if (glm2 && attn_only) { fprintf(stderr, "bench_decode: --attn_only measures ChatGLM-6B's layout\n"); return 2; }
    char err[256];
    glm_backend *be = glm_backend_cuda(0, GLM_BF16, err, sizeof err);
    if (!be) { fprintf(stderr, "bench_decode: %s\n", err); return 1; }
    if (attn_only) { /* [1, T, NH, 3, HD] as the cache lays it out; one query at T - 1 */
        int NH = c.num_attention_heads, HD = glm_head_dim(&c), H = c.hidden_size, L = 28;
        void *cache = be->alloc(be, (size_t)T * 3 * H * 2 * L), *out = be->alloc(be, (size_t)H * 2);
        float *lse = be->alloc(be, (size_t)NH * 4);
        glm_cuda_fill_normal(be, cache, (size_t)T * 3 * H * L, 5, 1.0f);
        int32_t lo0 = 0, hi0 = T, *dlo = be->alloc(be, 4), *dhi = be->alloc(be, 4);
        be->upload(be, dlo, &lo0, 4);
        be->upload(be, dhi, &hi0, 4);
        float *ws = be->alloc(be, glmk_decode_attention_scratch(1, 1, T, NH, HD));
        int smem_max = 48 << 10;
        cudaDeviceGetAttribute(&smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
        for (int kind = 0; kind < 2; kind++)
            for (int rep = 0; rep < 3; rep++) {
                be->sync(be);
                double a = now();
                for (int l = 0; l < L; l++) { /* each layer its own cache: from HBM, not L2 */
                    char *base = (char *)cache + (size_t)l * T * 3 * H * 2;
                    glm_qkv_view q = {base + (size_t)(T - 1) * 3 * H * 2, (long)T * 3 * H, 3L * H, 3L * HD, 1}, k = q, v = q;
                    k.base = base + (size_t)HD * 2;
                    v.base = base + (size_t)2 * HD * 2;
                    if (kind == 0)
                        glmk_decode_attention(GLM_BF16, out, lse, ws, q, k, v, dlo, dhi, 1, 1, T, NH, HD, 0.088f,
                                              (cudaStream_t)glm_cuda_stream(be));
                    else
                        glmk_flash_fwd(GLM_BF16, out, lse, q, k, v, dlo, dhi, 1, 1, T, NH, HD, 0.088f, smem_max,
                                       (cudaStream_t)glm_cuda_stream(be));
                }
                be->sync(be);
                double t = (now() - a) / L;
                printf("attention %s, 1 query over %d keys (NH %d, HD %d): %.1f us per layer, %.0f GB/s of keys+values\n",
                       kind ? "flash" : "decode", T, NH, HD, t * 1e6, (double)T * 2 * H * 2 / t / 1e9);
            }
        return 0;
    }
    glm_cuda_memory_reset_peak(be);
    glm_model m;
    glm_model_init_inference(&m, &c, be);
    size_t weight_bytes = 0;
    for (int i = 0; i < glm_model_nrows(&m); i++) {
        void *p;
        const glm_tensor *t = glm_model_row(&m, i, &p);
        if (t->qtype) bench_fill_quantized(&m, t, p, 1000 + (uint64_t)i);
        else if (t->ndim == 2) glm_cuda_fill_normal(be, p, t->numel, 1000 + (uint64_t)i, 0.02f);
        else if (t->kind == T_LN1_W || t->kind == T_LN2_W || t->kind == T_LNF_W) glm_cuda_fill(be, p, t->numel, 1.0f);
        /* what one decode step reads: every weight once (the embedding as the head) */
        weight_bytes += t->qtype ? glm_qlayout_of((glm_qtype)t->qtype, (size_t)t->shape[0], (size_t)t->shape[1]).bytes
                                 : t->numel * glm_dtype_size(be->dtype);
    }
    glm_kvcache kv;
    glm_kvcache_init(&m, &kv, 1, T);
    int32_t *ids = malloc(sizeof(int32_t) * P), *pos = malloc(sizeof(int32_t) * P), *bpos = malloc(sizeof(int32_t) * P);
    int32_t *lo = malloc(sizeof(int32_t) * P), *hi = malloc(sizeof(int32_t) * P);
    float *logits = malloc(sizeof(float) * c.vocab_size);
    for (int i = 0; i < P; i++) { ids[i] = 5 + (i * 131) % 60000; pos[i] = i; bpos[i] = 0; lo[i] = 0; hi[i] = glm2 ? i + 1 : P; }
    glm_err e = {0};
    /* a warm-up pass of the prompt (first-call setup), then the timed one into an empty cache */
    if (glm_forward_cached(&m, &kv, P, ids, pos, bpos, lo, hi, NULL, logits, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    kv.len = 0;
    double t0 = now();
    if (glm_forward_cached(&m, &kv, P, ids, pos, bpos, lo, hi, NULL, logits, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
    double prefill = now() - t0;
    int n = T - P;
    double *ts = malloc(sizeof(double) * n);
    for (int s = 0; s < n; s++) {
        int32_t id = 5 + s % 1000, p = glm2 ? P + s : P - 1, bp = glm2 ? 0 : s + 1, l = 0, h = P + s + 1;
        double a = now();
        if (glm_forward_cached(&m, &kv, 1, &id, &p, &bp, &l, &h, NULL, logits, &e)) { fprintf(stderr, "%s\n", e.msg); return 1; }
        ts[s] = now() - a;
    }
    qsort(ts, n, sizeof(double), cmp_d);
    double med = ts[n / 2];
    if (detail) { /* the last step again (its cache slot rewritten), one event per op */
        int32_t id = 5, p = glm2 ? T - 1 : P - 1, bp = glm2 ? 0 : n, l = 0, h = T;
        char what[64];
        kv.len = T - 1;
        snprintf(what, sizeof what, "one decode step at position %d", T - 1);
        glm_cuda_profile(be, 2);
        glm_forward_cached(&m, &kv, 1, &id, &p, &bp, &l, &h, NULL, logits, &e);
        bench_print_ops(be, what);
    }
    for (const char *v = verify; v && *v;) { /* passes of k tokens after the prompt, rewound each time */
        int k = atoi(v);
        v = strchr(v, ',') ? strchr(v, ',') + 1 : "";
        if (k < 1 || k > GLM_ROWS_LOGITS_MAX || P + k > T) { fprintf(stderr, "bench_decode: --verify %d out of range\n", k); return 2; }
        int32_t vid[GLM_ROWS_LOGITS_MAX], vp[GLM_ROWS_LOGITS_MAX], vb[GLM_ROWS_LOGITS_MAX], vl[GLM_ROWS_LOGITS_MAX],
            vh[GLM_ROWS_LOGITS_MAX];
        for (int i = 0; i < k; i++) {
            vid[i] = 5 + i;
            vp[i] = glm2 ? P + i : P - 1;
            vb[i] = glm2 ? 0 : i + 1;
            vl[i] = 0;
            vh[i] = P + i + 1;
        }
        float *rows = malloc(sizeof(float) * (size_t)k * c.vocab_size);
        double vt[40];
        for (int r = -2; r < 40; r++) { /* two passes to warm up */
            kv.len = P;
            double a = now();
            if (glm_forward_cached(&m, &kv, k, vid, vp, vb, vl, vh, NULL, k == 1 ? rows : NULL, &e) ||
                (k > 1 && glm_cached_rows_logits(&m, &kv, 0, k, rows, &e))) { fprintf(stderr, "%s\n", e.msg); return 1; }
            if (r >= 0) vt[r] = now() - a;
        }
        qsort(vt, 40, sizeof(double), cmp_d);
        printf("%sverify %2d tokens after %d: %.3f ms a pass = %.2fx a one-token step (%.3f ms)\n", glm2 ? "chatglm2 " : "", k,
               P, vt[20] * 1e3, vt[20] / med, med * 1e3);
        if (out) {
            FILE *f = fopen(out, "a");
            if (f) {
                fprintf(f, "{\"bench\":\"verify\",\"family\":\"%s\",\"k\":%d,\"prompt\":%d,\"pass_ms\":%.3f,\"step_ms\":%.3f}\n",
                        glm2 ? "chatglm2" : "chatglm", k, P, vt[20] * 1e3, med * 1e3);
                fclose(f);
            }
        }
        free(rows);
    }
    size_t used, peak, total;
    glm_cuda_memory(be, &used, &peak, &total);
    const char *qn = quant ? glm_qtype_name((glm_qtype)quant) : "bf16";
    printf("%s", glm2 ? "chatglm2 " : "");
    printf("decode %-5s prompt %d -> %d tokens: prefill %.1f ms, decode %.2f ms/token = %.1f tokens/s, weights %.2f GiB "
           "(%.0f GB/s), peak %.2f GiB\n", qn, P, T, prefill * 1e3, med * 1e3, 1.0 / med, weight_bytes / 1073741824.0,
           weight_bytes / med / 1e9, peak / 1073741824.0);
    if (out) {
        FILE *f = fopen(out, "a");
        if (f) {
            fprintf(f, "{\"bench\":\"decode\",\"weights\":\"%s\",\"prompt\":%d,\"total\":%d,\"prefill_ms\":%.2f,\"step_ms\":%.3f,"
                       "\"tok_s\":%.2f,\"weight_gib\":%.3f,\"gb_s\":%.1f,\"peak_gib\":%.3f}\n",
                    qn, P, T, prefill * 1e3, med * 1e3, 1.0 / med, weight_bytes / 1073741824.0, weight_bytes / med / 1e9,
                    peak / 1073741824.0);
            fclose(f);
        }
    }
    free(ts); free(ids); free(pos); free(bpos); free(lo); free(hi); free(logits);
    glm_kvcache_free(&m, &kv);
    glm_model_free(&m);
    be->destroy(be);
    return 0;
}
