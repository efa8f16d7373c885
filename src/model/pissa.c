/* PiSSA (model/pissa.h): LoRA started from the principal singular triplets of each adapted
 * weight, the base keeping the residual. */
#include "model/pissa.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_gemm.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/adapter.h"
#include "model/ckpt.h"

/* The base row a LoRA row adapts (the same layer, the module's weight), or NULL. */
static const glm_tensor *base_of(const glm_model *m, const glm_tensor *lora, void **ptr) {
    for (int i = 0; i < glm_model_nrows(m); i++) {
        const glm_tensor *t = glm_model_row(m, i, ptr);
        if (t->layer == lora->layer && glm_linear_index(t->kind) == glm_lora_module(lora->kind)) return t;
    }
    return NULL;
}

/* Where a weight's float values come from. A row kept as floats: the row itself. A quantized
 * row: the base's files again (m->origin, with the adapters m->merged merges), since PiSSA
 * splits the float weight and the residual is what gets quantized (QPiSSA); the row's
 * dequantized values would split the quantization's error too. */
typedef struct float_src {
    glm_ckpt file;
    glm_merge *merge;
    int open;
} float_src;

static int float_weight(glm_model *m, float_src *fs, const glm_tensor *tw, void *wp, float *w, glm_err *err) {
    if (!tw->qtype) { glm_model_row_download(m, tw, w, wp); return 0; }
    if (!fs->open) {
        if (!m->origin[0] || glm_ckpt_open(&fs->file, m->origin, err))
            return glm_fail(err, "PiSSA on a quantized base needs the base's float weights, and %s has none to read",
                            m->origin[0] ? m->origin : "this model"),
                   glm_hint(err, "give the float16/bfloat16 model as --model_name_or_path with --quantization_bit");
        fs->open = 1;
        if (m->merged[0] && glm_merge_open(&fs->merge, &m->cfg, m->merged, err)) return -1;
    }
    if (glm_ckpt_quantized_type(&fs->file, tw->name, tw->shape[0], tw->shape[1]) != GLM_Q_NONE)
        return glm_fail(err, "PiSSA on %s: its weight %s is stored quantized, so its float values are gone", m->origin,
                        tw->name),
               glm_hint(err, "start PiSSA from the float model (--model_name_or_path FLOAT --quantization_bit N)");
    if (glm_ckpt_read_values(&fs->file, tw->name, tw, w, err)) return -1;
    return glm_merge_apply(fs->merge, tw->name, tw, w, err);
}

static void float_src_close(float_src *fs) {
    if (fs->open) glm_ckpt_close(&fs->file);
    glm_merge_close(fs->merge);
}

/* Row tw (at wp) made W - scaling B A from w, its float values, on the host: a quantized row is
 * quantized from the float residual. b [OC, r], a [r, C]. */
static void store_residual(glm_model *m, const glm_tensor *tw, void *wp, float *w, const float *b, const float *a, int r,
                           float scaling) {
    int OC = (int)tw->shape[0], C = (int)tw->shape[1];
    cpu_sgemm(0, 0, OC, C, r, -scaling, b, r, a, C, 1.0f, w, C);
    glm_model_row_upload(m, tw, wp, w);
}

/* Orthonormal columns of x [n, q] in place (modified Gram-Schmidt, twice over for accuracy, in
 * double: torch's QR gives the same span; the signs do not matter to what follows). A column
 * the others span becomes zero. */
static void orthonormalize(float *x, int n, int q) {
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < q; j++) {
            for (int k = 0; k < j; k++) {
                double d = 0;
                for (int i = 0; i < n; i++) d += (double)x[(size_t)i * q + j] * x[(size_t)i * q + k];
                for (int i = 0; i < n; i++) x[(size_t)i * q + j] -= (float)(d * x[(size_t)i * q + k]);
            }
            double s = 0;
            for (int i = 0; i < n; i++) s += (double)x[(size_t)i * q + j] * x[(size_t)i * q + j];
            float inv = s > 0 ? (float)(1.0 / sqrt(s)) : 0.0f;
            for (int i = 0; i < n; i++) x[(size_t)i * q + j] *= inv;
        }
}

/* Eigenvalues (descending) and vectors (columns of v) of the symmetric q x q matrix a, by
 * cyclic Jacobi rotations in double. */
static void sym_eigen(double *a, double *v, double *ev, int q) {
    for (int i = 0; i < q * q; i++) v[i] = i % (q + 1) == 0;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0, diag = 0;
        for (int i = 0; i < q; i++)
            for (int j = 0; j < q; j++) {
                if (i == j) diag += a[i * q + j] * a[i * q + j];
                else off += a[i * q + j] * a[i * q + j];
            }
        if (off <= 1e-30 * diag) break;
        for (int p = 0; p < q; p++)
            for (int r = p + 1; r < q; r++) {
                double apr = a[p * q + r];
                if (fabs(apr) < 1e-300) continue;
                double th = (a[r * q + r] - a[p * q + p]) / (2 * apr);
                double t = (th >= 0 ? 1 : -1) / (fabs(th) + sqrt(th * th + 1)), c = 1 / sqrt(t * t + 1), s = t * c;
                for (int k = 0; k < q; k++) { /* a = J^T a J, v = v J */
                    double akp = a[k * q + p], akr = a[k * q + r];
                    a[k * q + p] = c * akp - s * akr;
                    a[k * q + r] = s * akp + c * akr;
                }
                for (int k = 0; k < q; k++) {
                    double apk = a[p * q + k], ark = a[r * q + k];
                    a[p * q + k] = c * apk - s * ark;
                    a[r * q + k] = s * apk + c * ark;
                }
                for (int k = 0; k < q; k++) {
                    double vkp = v[k * q + p], vkr = v[k * q + r];
                    v[k * q + p] = c * vkp - s * vkr;
                    v[k * q + r] = s * vkp + c * vkr;
                }
            }
    }
    for (int i = 0; i < q; i++) ev[i] = a[i * q + i];
    for (int i = 0; i < q; i++) { /* descending, the vectors with them */
        int best = i;
        for (int j = i + 1; j < q; j++) if (ev[j] > ev[best]) best = j;
        if (best == i) continue;
        double t = ev[i]; ev[i] = ev[best]; ev[best] = t;
        for (int k = 0; k < q; k++) { t = v[k * q + i]; v[k * q + i] = v[k * q + best]; v[k * q + best] = t; }
    }
}

/* y = W x (x [C, q], y [OC, q]) or, trans, W^T x (x [OC, q], y [C, q]), with x and y on the host:
 * on the host, or where W lives as floats (be: its float product, the skinny x and y copied). */
typedef struct w_prod {
    glm_backend *be; /* NULL: w is on the host */
    const float *w;  /* [OC, C] */
    float *dx, *dy;  /* be's buffers of max(OC, C) x q floats */
} w_prod;
static void w_times(w_prod *p, int trans, const float *x, float *y, int OC, int C, int q) {
    int rows = trans ? C : OC, inner = trans ? OC : C;
    if (!p->be) { cpu_sgemm(trans, 0, rows, q, inner, 1.0f, p->w, C, x, q, 0.0f, y, q); return; }
    p->be->upload(p->be, p->dx, x, (size_t)inner * q * sizeof(float));
    p->be->sgemm(p->be, trans, 0, rows, q, inner, 1.0f, p->w, C, p->dx, q, 0.0f, p->dy, q);
    p->be->download(p->be, y, p->dy, (size_t)rows * q * sizeof(float));
}

/* The SVD of B = W Q [OC, q] through the eigenvectors of B^T B: the top `take` triplets into
 * u [OC, take], s [take], v [C, take] (V = Q E). */
static void ritz(const float *bq, const float *qc, int OC, int C, int q, int take, float *u, float *s, float *v) {
    double *g = glm_calloc((size_t)q * q, sizeof(double)), *ev = glm_malloc((size_t)q * q * sizeof(double)),
           *e = glm_malloc((size_t)q * sizeof(double));
    for (int i = 0; i < OC; i++) /* B^T B */
        for (int a = 0; a < q; a++)
            for (int b = 0; b < q; b++) g[a * q + b] += (double)bq[(size_t)i * q + a] * bq[(size_t)i * q + b];
    sym_eigen(g, ev, e, q);
    for (int j = 0; j < take; j++) s[j] = e[j] > 0 ? (float)sqrt(e[j]) : 0.0f;
    for (int i = 0; u && i < OC; i++) /* U = B E / S */
        for (int j = 0; j < take; j++) {
            double d = 0;
            for (int k = 0; k < q; k++) d += (double)bq[(size_t)i * q + k] * ev[k * q + j];
            u[(size_t)i * take + j] = s[j] > 0 ? (float)(d / s[j]) : 0.0f;
        }
    for (int i = 0; i < C; i++)
        for (int j = 0; j < take; j++) {
            double d = 0;
            for (int k = 0; k < q; k++) d += (double)qc[(size_t)i * q + k] * ev[k * q + j];
            v[(size_t)i * take + j] = (float)d;
        }
    free(g);
    free(ev);
    free(e);
}

/* The largest 1 - |v_j . w_j| over the columns of two [C, r] sets of unit vectors: how far the
 * right singular vectors moved (sign-free). */
static double moved(const float *v, const float *w, int C, int r) {
    double worst = 0;
    for (int j = 0; j < r; j++) {
        double d = 0;
        for (int i = 0; i < C; i++) d += (double)v[(size_t)i * r + j] * w[(size_t)i * r + j];
        if (1 - fabs(d) > worst) worst = 1 - fabs(d);
    }
    return worst;
}

/* Subspace iterations until the top r right singular vectors stop moving (peft's "pissa", the
 * full SVD's triplets, where they are distinct), with twice the columns for a faster
 * convergence: 1 - |cos| below 1e-10 between checks 4 iterations apart, at most this many. */
enum { CONVERGE_MAX_ITERS = 4000 };

static int svd_lowrank(w_prod *p, int OC, int C, int r, int niter, uint64_t seed, float *u, float *s, float *v) {
    /* torch.svd_lowrank for a weight wider in rank than q: a basis Q [C, q] of W's row space from
     * W^T R (R [OC, q] normal), refined by niter rounds of Q' = orth(W Q), Q = orth(W^T Q'); then
     * the SVD of B = W Q [OC, q] gives U, S and V = Q (B's right vectors). niter < 0: until
     * converged (returns the iterations, or -1 when the cap came first). */
    int full = niter < 0, lim = OC < C ? OC : C, q = full ? (2 * r < lim ? 2 * r : lim) : r, it = 0, done = !full;
    float *b = glm_malloc((size_t)OC * q * sizeof(float)), *qc = glm_malloc((size_t)C * q * sizeof(float));
    float *vprev = full ? glm_malloc((size_t)C * r * sizeof(float)) : NULL;
    glm_rng rng;
    glm_rng_seed(&rng, seed);
    for (size_t i = 0; i < (size_t)OC * q; i++) b[i] = glm_rng_normal(&rng);
    w_times(p, 1, b, qc, OC, C, q); /* W^T R */
    orthonormalize(qc, C, q);
    for (it = 0; full ? it < CONVERGE_MAX_ITERS : it < niter; it++) {
        w_times(p, 0, qc, b, OC, C, q); /* W Q */
        orthonormalize(b, OC, q);
        w_times(p, 1, b, qc, OC, C, q); /* W^T Q' */
        orthonormalize(qc, C, q);
        if (full && it % 4 == 3) {
            w_times(p, 0, qc, b, OC, C, q);
            ritz(b, qc, OC, C, q, r, NULL, s, v);
            if (it > 3 && moved(v, vprev, C, r) < 1e-10) { done = 1; it++; break; }
            memcpy(vprev, v, (size_t)C * r * sizeof(float));
        }
    }
    w_times(p, 0, qc, b, OC, C, q); /* B = W Q [OC, q] */
    ritz(b, qc, OC, C, q, r, u, s, v);
    free(b);
    free(qc);
    free(vprev);
    return done ? it : -1;
}

int glm_svd_lowrank(const float *w, int OC, int C, int q, int niter, uint64_t seed, float *u, float *s, float *v) {
    w_prod p = {.w = w};
    return svd_lowrank(&p, OC, C, q, niter, seed, u, s, v);
}

/* The initial rows kept on the host (the adapter folders carry them: pissa_init/). */
static void keep_initial(glm_model *m) {
    free(m->pissa_init);
    m->pissa_init = glm_malloc((m->tab.total ? m->tab.total : 1) * sizeof(float));
    m->be->download_f32(m->be, m->pissa_init, m->params, m->tab.total);
}

int glm_pissa_init(glm_model *m, uint64_t seed, glm_err *err) {
    const glm_peft *p = &m->cfg.peft;
    int r = p->lora_rank, rc = 0;
    float scaling = glm_lora_scaling(p);
    float_src fs = {0};
    for (int i = 0; i < m->tab.n && rc == 0; i++) {
        const glm_tensor *ta = &m->tab.t[i];
        if (!glm_is_lora_ab(ta->kind) || (ta->kind - T_QKV_LA) % 2) continue; /* each A with its B after it */
        const glm_tensor *tb = &m->tab.t[i + 1];
        void *wp;
        const glm_tensor *tw = base_of(m, ta, &wp);
        if (!tw) { rc = glm_fail(err, "PiSSA: no base weight for %s", ta->name); break; }
        int OC = (int)tw->shape[0], C = (int)tw->shape[1];
        if (r > OC || r > C) {
            rc = glm_fail(err, "--pissa_init: rank %d is above the rank of %s [%d, %d]", r, tw->name, OC, C);
            glm_hint(err, "lower --lora_rank");
            break;
        }
        float *u = glm_malloc((size_t)OC * r * sizeof(float)), *v = glm_malloc((size_t)C * r * sizeof(float)),
              *sv = glm_malloc((size_t)r * sizeof(float));
        float *a = glm_malloc((size_t)r * C * sizeof(float)), *b = glm_malloc((size_t)OC * r * sizeof(float)), *w = NULL;
        /* the products where the weight lives, as torch runs svd_lowrank on the weight's device:
         * a GPU's float copy of it, else the host's (a quantized row's floats: float_weight) */
        glm_backend *be = m->be;
        int dev = be->sgemm && be->to_f32 && be->from_f32; /* else the host's products */
        int on_dev = dev && !tw->qtype;                       /* the residual made on the device too */
        w_prod prod = {.w = NULL};
        if (!on_dev) {
            w = glm_malloc((size_t)OC * C * sizeof(float));
            if (float_weight(m, &fs, tw, wp, w, err)) { rc = -1; free(u); free(v); free(sv); free(a); free(b); free(w); break; }
            prod.w = w;
        }
        if (dev) {
            size_t wide = (size_t)(OC > C ? OC : C) * r * sizeof(float);
            prod = (w_prod){.be = be, .w = be->alloc(be, tw->numel * sizeof(float)), .dx = be->alloc(be, wide),
                            .dy = be->alloc(be, wide)};
            if (on_dev) be->to_f32(be, (float *)prod.w, wp, tw->numel);
            else be->upload(be, (float *)prod.w, w, tw->numel * sizeof(float));
        }
        /* one stream per (layer, module), as the LoRA rows draw theirs: every rank and stage agrees */
        int its = svd_lowrank(&prod, OC, C, r, p->pissa_niter,
                              seed * 1000003ULL + 7919ULL * ((uint64_t)(ta->layer + 1) * T_NKINDS + ta->kind), u, sv, v);
        if (p->pissa_niter < 0 && its < 0)
            glm_warn("PiSSA: %s's top %d singular vectors still moved after %d subspace iterations (its singular values "
                     "%d and %d are close, %.4g and the next): the start is the subspace reached", tw->name, r,
                     CONVERGE_MAX_ITERS, r, r + 1, sv[r - 1]);
        /* peft's: A = diag(sqrt(S / scaling)) V^T, B = U diag(sqrt(S / scaling)), W -= scaling B A */
        for (int j = 0; j < r; j++) {
            float f = sqrtf(sv[j] / scaling);
            for (int k = 0; k < C; k++) a[(size_t)j * C + k] = f * v[(size_t)k * r + j];
            for (int k = 0; k < OC; k++) b[(size_t)k * r + j] = u[(size_t)k * r + j] * f;
        }
        /* A and B as the model holds them (16-bit on a bf16/fp16 backend): the residual subtracts
         * exactly what the adapter adds back, so the start computes the base but for W's own rounding */
        void *pa = glm_at(be, m->params, ta->offset), *pb = glm_at(be, m->params, tb->offset);
        be->upload_f32(be, pa, a, ta->numel);
        be->upload_f32(be, pb, b, tb->numel);
        be->download_f32(be, a, pa, ta->numel);
        be->download_f32(be, b, pb, tb->numel);
        if (on_dev) { /* the residual in float where W is, then rounded into the row */
            float *da = prod.dx, *db = prod.dy; /* [r, C] and [OC, r] fit the skinny buffers */
            be->upload(be, da, a, (size_t)r * C * sizeof(float));
            be->upload(be, db, b, (size_t)OC * r * sizeof(float));
            be->sgemm(be, 0, 0, OC, C, r, -scaling, db, r, da, C, 1.0f, (float *)prod.w, C);
            be->from_f32(be, wp, prod.w, tw->numel);
            be->sync(be);
        } else {
            store_residual(m, tw, wp, w, b, a, r, scaling);
        }
        if (dev) {
            be->free(be, (void *)prod.w);
            be->free(be, prod.dx);
            be->free(be, prod.dy);
        }
        free(w); free(u); free(v); free(sv); free(a); free(b);
    }
    float_src_close(&fs);
    if (rc == 0) keep_initial(m);
    return rc;
}

int glm_pissa_init_file(const char *adapter_dir, char *path, size_t n, glm_err *err) {
    char dir[4096];
    glm_path_join(dir, sizeof dir, adapter_dir, GLM_PISSA_INIT_DIR);
    if (glm_is_adapter_dir(dir) && glm_adapter_file(dir, path, n) == 0) return 0;
    glm_fail(err, "%s is a PiSSA adapter (init_lora_weights \"pissa...\"): it was trained on the base less its first "
                  "values, which %s should hold, and it is missing", adapter_dir, dir);
    return glm_hint(err, "use its converted form, a plain LoRA of twice the rank (LLaMA-Factory's --pissa_convert writes "
                         "pissa_converted/; peft: save_pretrained(..., path_initial_model_for_weight_conversion=...))");
}

int glm_pissa_residual(glm_model *m, const char *adapter_dir, glm_err *err) {
    char path[4096];
    if (glm_pissa_init_file(adapter_dir, path, sizeof path, err)) return -1;
    glm_ckpt c;
    if (glm_ckpt_open(&c, path, err)) return -1;
    float scaling = glm_lora_scaling(&m->cfg.peft);
    /* the first values, kept on the host for the folders this model writes */
    float *first = glm_calloc(m->tab.total ? m->tab.total : 1, sizeof(float));
    int rc = 0;
    char name[300];
    for (int i = 0; i < m->tab.n && rc == 0; i++) {
        const glm_tensor *t = &m->tab.t[i];
        if (!glm_is_lora_ab(t->kind)) continue;
        snprintf(name, sizeof name, "%s%s", GLM_ADAPTER_PREFIX, t->name);
        rc = glm_ckpt_read_f32(&c, name, first + t->offset, 2, t->shape, err);
        if (rc) glm_hint(err, "%s holds the PiSSA adapter's first values: it belongs to %s", path, adapter_dir);
    }
    glm_ckpt_close(&c);
    if (rc) { free(first); return -1; }
    if (m->pissa_init) { /* the base is a residual already (a checkpoint of this run: the best one at the end) */
        int same = 1;
        for (int i = 0; i < m->tab.n; i++) {
            const glm_tensor *t = &m->tab.t[i];
            if (glm_is_lora_ab(t->kind))
                same &= memcmp(first + t->offset, m->pissa_init + t->offset, t->numel * sizeof(float)) == 0;
        }
        free(first);
        if (same) return 0;
        glm_fail(err, "%s is a PiSSA adapter of another start than the one this model's base was made the residual of",
                 adapter_dir);
        return glm_hint(err, "load it into a fresh model (its own run, or generate/chat --adapter)");
    }
    m->pissa_init = first;
    float_src fs = {0};
    for (int i = 0; i < m->tab.n && rc == 0; i++) {
        const glm_tensor *ta = &m->tab.t[i];
        if (!glm_is_lora_ab(ta->kind) || (ta->kind - T_QKV_LA) % 2) continue;
        const glm_tensor *tb = &m->tab.t[i + 1];
        float *a = m->pissa_init + ta->offset, *b = m->pissa_init + tb->offset;
        void *wp;
        const glm_tensor *tw = base_of(m, ta, &wp);
        if (!tw) continue; /* a pipeline stage without that layer */
        float *w = glm_malloc(tw->numel * sizeof(float));
        rc = float_weight(m, &fs, tw, wp, w, err);
        if (rc == 0) store_residual(m, tw, wp, w, b, a, (int)ta->shape[0], scaling);
        free(w);
    }
    float_src_close(&fs);
    if (rc) { free(m->pissa_init); m->pissa_init = NULL; }
    return rc;
}
