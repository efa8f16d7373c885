/* PiSSA (model/pissa.h): LoRA started from the principal singular triplets of each adapted
 * weight, the base keeping the residual. */
#include "model/pissa.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/svd.h"
#include "core/fileutil.h"
#include "core/log.h"
#include "core/rng.h"
#include "model/adapter.h"
#include "model/ckpt.h"
#include "model/hf_layout.h"

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

/* The row blocks of module weight tw that have adapters of their own (glm_lora_blocks, less q, k or
 * v without one): their count; row0/rows/part per block (part: the block's place in the stacked A). */
static int blocks_of(const glm_model *m, const glm_tensor *tw, int64_t row0[3], int64_t rows[3], int part[3]) {
    int64_t r0[3], rs[3];
    int S = glm_lora_blocks(&m->cfg, glm_lora_split(&m->cfg, glm_linear_index(tw->kind)), tw->shape[0], r0, rs), n = 0;
    int parts = m->cfg.peft.lora_qkv_parts;
    for (int k = 0; k < S; k++)
        if (S == 1 || !parts || (parts >> k & 1)) { row0[n] = r0[k]; rows[n] = rs[k]; part[n] = k; n++; } /* else no adapter */
    return n;
}

/* Row tw (at wp) made W - scaling B A from w, its float values, block by block, on the host: a
 * quantized row is quantized from the float residual. b [OC, r], a [r or 3 r, C] (a block without
 * an adapter has zero rows there: it subtracts nothing). */
static void store_residual(glm_model *m, const glm_tensor *tw, void *wp, float *w, const float *b, const float *a, int r,
                           float scaling) {
    glm_lora_add_host(&m->cfg, glm_lora_split(&m->cfg, glm_linear_index(tw->kind)), w, tw->shape[0], tw->shape[1], b, a, r,
                      -scaling, NULL);
    glm_model_row_upload(m, tw, wp, w);
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
        int OC = (int)tw->shape[0], C = (int)tw->shape[1], part[3];
        int64_t row0[3], rows[3];
        int nb = blocks_of(m, tw, row0, rows, part);
        for (int k = 0; k < nb && rc == 0; k++)
            if (r > rows[k] || r > C) {
                rc = glm_fail(err, "--pissa_init: rank %d is above the rank of %s%s [%lld, %d]", r, tw->name,
                              nb > 1 || rows[k] < OC ? "'s row block" : "", (long long)rows[k], C);
                glm_hint(err, "lower --lora_rank");
            }
        if (rc) break;
        float *u = glm_malloc((size_t)OC * r * sizeof(float)), *v = glm_malloc((size_t)C * r * sizeof(float)),
              *sv = glm_malloc((size_t)r * sizeof(float));
        float *a = glm_malloc((size_t)r * C * sizeof(float)), *b = glm_malloc((size_t)OC * r * sizeof(float)), *w = NULL;
        /* the products where the weight lives, as torch runs svd_lowrank on the weight's device:
         * a GPU's float copy of it, else the host's (a quantized row's floats: float_weight) */
        glm_backend *be = m->be;
        int dev = glm_svd_runs_on(be) && be->to_f32 && be->from_f32; /* else on the host */
        int on_dev = dev && !tw->qtype;                       /* the residual made on the device too */
        float *dw = NULL; /* the weight as floats on the device (dev) */
        if (!on_dev) {
            w = glm_malloc((size_t)OC * C * sizeof(float));
            if (float_weight(m, &fs, tw, wp, w, err)) { rc = -1; free(u); free(v); free(sv); free(a); free(b); free(w); break; }
        }
        if (dev) {
            dw = be->alloc(be, tw->numel * sizeof(float));
            if (on_dev) be->to_f32(be, dw, wp, tw->numel);
            else be->upload(be, dw, w, tw->numel * sizeof(float));
        }
        for (int k = 0; k < nb; k++) { /* each block (peft's q_proj, k_proj, v_proj) from its own rows' SVD */
            int R = (int)rows[k];
            /* one stream per (layer, module, block), as the LoRA rows draw theirs: every rank and stage agrees */
            uint64_t sd = seed * 1000003ULL + 7919ULL * ((uint64_t)(ta->layer + 1) * GLM_SEED_KINDS + ta->kind) +
                          (uint64_t)part[k] * 0x9e3779b97f4a7c15ULL;
            int its = glm_svd_lowrank_on(dev ? be : NULL, (dev ? dw : w) + row0[k] * C, R, C, r, p->pissa_niter, sd, u, sv, v);
            if (p->pissa_niter < 0 && its < 0)
                glm_warn("PiSSA: %s%s's top %d singular vectors still moved after %d subspace iterations (its singular values "
                         "%d and %d are close, %.4g and the next): the start is the subspace reached", tw->name,
                         nb > 1 ? "'s row block" : "", r, GLM_SVD_MAX_ITERS, r, r + 1, sv[r - 1]);
            /* peft's: A = diag(sqrt(S / scaling)) V^T, B = U diag(sqrt(S / scaling)), W -= scaling B A */
            for (int j = 0; j < r; j++) {
                float f = sqrtf(sv[j] / scaling);
                for (int q = 0; q < C; q++) a[(size_t)j * C + q] = f * v[(size_t)q * r + j];
                for (int q = 0; q < R; q++) b[(size_t)q * r + j] = u[(size_t)q * r + j] * f;
            }
            /* A and B as the model holds them (16-bit on a bf16/fp16 backend): the residual subtracts
             * exactly what the adapter adds back, so the start computes the base but for W's own rounding */
            void *pa = glm_at(be, m->params, ta->offset + (size_t)part[k] * r * C),
                 *pb = glm_at(be, m->params, tb->offset + (size_t)row0[k] * r);
            be->upload_f32(be, pa, a, (size_t)r * C);
            be->upload_f32(be, pb, b, (size_t)R * r);
            be->download_f32(be, a, pa, (size_t)r * C);
            be->download_f32(be, b, pb, (size_t)R * r);
            if (on_dev) { /* the residual in float where W is */
                float *da = be->alloc(be, (size_t)r * C * sizeof(float)), *db = be->alloc(be, (size_t)R * r * sizeof(float));
                be->upload(be, da, a, (size_t)r * C * sizeof(float));
                be->upload(be, db, b, (size_t)R * r * sizeof(float));
                be->sgemm(be, 0, 0, R, C, r, -scaling, db, r, da, C, 1.0f, dw + row0[k] * C, C);
                be->sync(be);
                be->free(be, da);
                be->free(be, db);
            } else {
                cpu_sgemm(0, 0, R, C, r, -scaling, b, r, a, C, 1.0f, w + row0[k] * C, C);
            }
        }
        if (on_dev) be->from_f32(be, wp, dw, tw->numel); /* rounded into the row once */
        else glm_model_row_upload(m, tw, wp, w);
        if (dw) be->free(be, dw);
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
        if ((t->kind == T_QKV_LA || t->kind == T_QKV_LB) && glm_lora_split(&m->cfg, 0) > 1) { /* q, k, v's own */
            int got = glm_ckpt_read_qkv_lora(&c, name, t->kind == T_QKV_LB, &m->cfg, m->cfg.peft.lora_rank, t->shape[1],
                                             first + t->offset, err);
            rc = got < 0 ? -1 : got == 0 ? glm_fail(err, "%s: tensor %s is missing", path, name) : 0;
        } else {
            rc = glm_ckpt_read_f32(&c, name, first + t->offset, 2, t->shape, err);
        }
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
        if (rc == 0) store_residual(m, tw, wp, w, b, a, m->cfg.peft.lora_rank, scaling);
        free(w);
    }
    float_src_close(&fs);
    if (rc) { free(m->pissa_init); m->pissa_init = NULL; }
    return rc;
}
