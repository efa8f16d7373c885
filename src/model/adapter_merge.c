/* LoRA adapters merged into base weights (adapter.h): `glmtrain merge`, and LLaMA-Factory's
 * adapter lists, whose adapters before the last are merged into the base as it loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "core/fileutil.h"
#include "model/adapter.h"
#include "model/ckpt.h"
#include "model/hf_layout.h"
#include "model/pissa.h"

/* ---- the merge set ---- */

typedef struct merge_one {
    char dir[4096];
    glm_ckpt file, init; /* init: a PiSSA adapter's first values (model/pissa.h) */
    int has_init;
    glm_peft peft;
} merge_one;

struct glm_merge {
    int n;
    merge_one *ad;      /* in the list's order: each merges into what the ones before it left */
    float *a, *b;       /* scratch for one adapter's A [r, in] (q, k and v's: [3 r, in]) and B [out, r] at the largest rank */
    glm_config cfg;     /* the base's (the row blocks of q, k and v) */
    float *mag, *norm;  /* and DoRA's magnitudes and row norms [out] */
};

int glm_merge_open(glm_merge **out, const glm_config *c, const char *list, glm_err *err) {
    *out = NULL;
    int n = glm_adapter_list_count(list);
    if (n == 0) return 0;
    glm_merge *g = glm_calloc(1, sizeof *g);
    g->ad = glm_calloc((size_t)n, sizeof *g->ad);
    const char *p = list;
    int rmax = 1, rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        merge_one *o = &g->ad[i];
        size_t len = n == 1 ? strlen(p) : strcspn(p, ",");
        snprintf(o->dir, sizeof o->dir, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
        char path[4096];
        if (glm_adapter_read_config(o->dir, &o->peft, err)) { rc = -1; break; }
        if (o->peft.kind != GLM_FT_LORA) {
            rc = glm_fail(err, "%s is a P-Tuning v2 checkpoint: its prefix feeds every layer's attention and is not a weight "
                               "change, so it cannot be merged into the base", o->dir);
            glm_hint(err, "a P-Tuning v2 checkpoint goes last in a list of adapters, or alone");
            break;
        }
        if (glm_extra_modules_check(c, &o->peft, o->dir, err)) { rc = -1; break; }
        if (glm_adapter_file(o->dir, path, sizeof path)) {
            rc = glm_fail(err, "%s: no adapter_model.safetensors or adapter_model.bin", o->dir);
            break;
        }
        if (glm_ckpt_open(&o->file, path, err)) { rc = -1; break; }
        g->n = i + 1; /* the files opened so far, closed by glm_merge_close */
        if (o->peft.pissa) { /* trained on the base less its first values: those are subtracted too */
            if (glm_pissa_init_file(o->dir, path, sizeof path, err) || glm_ckpt_open(&o->init, path, err)) { rc = -1; break; }
            o->has_init = 1;
        }
        if (o->peft.lora_rank > rmax) rmax = o->peft.lora_rank;
    }
    size_t in = (size_t)glm_linear_in_max(c), outw = (size_t)glm_linear_out_max(c);
    g->a = glm_malloc(in * (size_t)rmax * 3 * sizeof(float));
    g->cfg = *c;
    g->b = glm_malloc(outw * (size_t)rmax * sizeof(float));
    g->mag = glm_malloc(outw * sizeof(float));
    g->norm = glm_malloc(outw * sizeof(float));
    if (rc) { glm_merge_close(g); return -1; }
    *out = g;
    return 0;
}

void glm_merge_close(glm_merge *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        glm_ckpt_close(&g->ad[i].file);
        if (g->ad[i].has_init) glm_ckpt_close(&g->ad[i].init);
    }
    free(g->ad);
    free(g->a);
    free(g->b);
    free(g->mag);
    free(g->norm);
    free(g);
}

static int adapts(const glm_peft *p, const glm_tensor *t) {
    int i = glm_linear_index(t->kind);
    return i >= 0 && (p->lora_targets >> i & 1) && glm_lora_on_layer(p, t->layer);
}

int glm_merge_changes(const glm_merge *g, const glm_tensor *t) {
    for (int i = 0; g && i < g->n; i++)
        if (glm_whole_row(&g->ad[i].peft, t->kind) || adapts(&g->ad[i].peft, t)) return 1;
    return 0;
}

/* DoRA's last step of a merge: each row of the merged w times m / n (g->norm: the rows' norms
 * before the adapter was added). */
static int dora_rows(merge_one *o, const char *name, int stem, const glm_tensor *t, glm_merge *g, float *w, glm_err *err) {
    char mn[320];
    int64_t msh[1] = {t->shape[0]}, C = t->shape[1];
    snprintf(mn, sizeof mn, "%s%.*s.lora_magnitude_vector", GLM_ADAPTER_PREFIX, stem, name);
    if (glm_ckpt_info(&o->file, mn, NULL, NULL, NULL)) strcat(mn, ".weight");
    if (glm_ckpt_info(&o->file, mn, NULL, NULL, NULL)) {
        glm_fail(err, "%s: tensor %s is missing", o->file.path, mn);
        return glm_hint(err, "the adapter_config.json says use_dora, so each adapted module has a magnitude vector");
    }
    if (glm_ckpt_read_f32(&o->file, mn, g->mag, 1, msh, err))
        return glm_hint(err, "the adapter was made for another base model (see its adapter_config.json)");
    for (int64_t j = 0; j < t->shape[0]; j++)
        for (int64_t k = 0; k < C; k++) w[j * C + k] *= g->mag[j] / g->norm[j];
    return 0;
}

void glm_lora_add_host(const glm_config *c, int split, float *w, int64_t out, int64_t C, const float *b, const float *a, int r,
                       float scale, float *norm) {
    int64_t row0[3], rows[3];
    for (int k = 0, n = glm_lora_blocks(c, split, out, row0, rows); k < n; k++) {
        float *wk = w + row0[k] * C;
        const float *bk = b + row0[k] * r, *ak = a + (size_t)k * r * C;
        if (norm) cpu_dora_norm(norm + row0[k], wk, ak, bk, scale, (int)rows[k], (int)C, r);
        cpu_sgemm(0, 0, (int)rows[k], (int)C, r, scale, bk, r, ak, (int)C, 1.0f, wk, (int)C);
    }
}

/* An adapter file's A and B of row t into g->a, g->b: q, k and v's own, stacked (split > 1,
 * glm_ckpt_read_qkv_lora), else as stored ([r, in], [out, r]). 1 when read, 0 when the file has
 * no A, -1 on an error. */
static int read_ab(glm_merge *g, glm_ckpt *f, const char *an, const char *bn, int split, int r, const glm_tensor *t,
                   glm_err *err) {
    int64_t ash[2] = {r, t->shape[1]}, bsh[2] = {t->shape[0], r};
    if (split > 1) {
        int got = glm_ckpt_read_qkv_lora(f, an, 0, &g->cfg, r, t->shape[1], g->a, err);
        return got > 0 ? glm_ckpt_read_qkv_lora(f, bn, 1, &g->cfg, r, t->shape[1], g->b, err) : got;
    }
    if (glm_ckpt_info(f, an, NULL, NULL, NULL) || glm_ckpt_info(f, bn, NULL, NULL, NULL)) return 0;
    return glm_ckpt_read_f32(f, an, g->a, 2, ash, err) || glm_ckpt_read_f32(f, bn, g->b, 2, bsh, err) ? -1 : 1;
}

/* One adapter into w: its whole copy of a modules_to_save row, or W += s B A (peft's merge;
 * DoRA's: then each row times m / ||W + s B A||, the training's own norm). */
static int merge_one_into(glm_merge *g, merge_one *o, const char *name, const glm_tensor *t, float *w, glm_err *err) {
    char an[300], bn[300];
    if (glm_whole_row(&o->peft, t->kind)) {
        snprintf(an, sizeof an, "%s%s", GLM_ADAPTER_PREFIX, name);
        if (glm_ckpt_info(&o->file, an, NULL, NULL, NULL)) {
            glm_fail(err, "%s: tensor %s is missing", o->file.path, an);
            return glm_hint(err, "its adapter_config.json names the module in modules_to_save, so peft saved it whole");
        }
        if (glm_ckpt_read_values(&o->file, an, t, w, err)) return glm_hint(err, "the adapter was made for another base model");
        return 0;
    }
    if (!adapts(&o->peft, t)) return 0;
    const char *dot = strrchr(name, '.'); /* name is <module>.weight */
    int stem = (int)(dot - name);
    snprintf(an, sizeof an, "%s%.*s.lora_A.weight", GLM_ADAPTER_PREFIX, stem, name);
    snprintf(bn, sizeof bn, "%s%.*s.lora_B.weight", GLM_ADAPTER_PREFIX, stem, name);
    int r = o->peft.lora_rank;
    int64_t stored[ST_MAX_DIMS];
    /* peft's q_proj, k_proj, v_proj (some or all of them): an adapter each on its rows of W;
     * THUDM's one adapter (A [r, in]) on all of them */
    int split = t->kind == T_QKV_W && (glm_ckpt_info(&o->file, an, NULL, NULL, stored) || stored[0] != r)
                    ? glm_lora_split(&g->cfg, 0) : 1;
    float s = glm_lora_scaling(&o->peft);
    if (o->has_init) { /* PiSSA: W -= s B0 A0 first, the base its adapter was trained on */
        int got = read_ab(g, &o->init, an, bn, split, r, t, err);
        if (got == 0) glm_fail(err, "%s: tensor %s is missing", o->init.path, an);
        if (got <= 0) return glm_hint(err, "%s holds the PiSSA adapter's first values: it belongs to %s", o->init.path, o->dir);
        glm_lora_add_host(&g->cfg, split, w, t->shape[0], t->shape[1], g->b, g->a, r, -s, NULL);
    }
    int got = read_ab(g, &o->file, an, bn, split, r, t, err);
    if (got == 0) {
        glm_fail(err, "%s: tensor %s is missing", o->file.path, an);
        return glm_hint(err, "the adapter was made for other modules or layers (its adapter_config.json's target_modules)");
    }
    if (got < 0) return glm_hint(err, "the adapter was made for another base model or rank (see its adapter_config.json)");
    /* W[out, in] += s * B[out, r] A[r, in], DoRA's row norms taken first */
    glm_lora_add_host(&g->cfg, split, w, t->shape[0], t->shape[1], g->b, g->a, r, s, o->peft.use_dora ? g->norm : NULL);
    return o->peft.use_dora ? dora_rows(o, name, stem, t, g, w, err) : 0;
}

int glm_merge_apply(glm_merge *g, const char *name, const glm_tensor *t, float *w, glm_err *err) {
    for (int i = 0; g && i < g->n; i++)
        if (merge_one_into(g, &g->ad[i], name, t, w, err)) return -1;
    return 0;
}

/* ---- glmtrain merge ---- */

typedef struct merge_src {
    glm_ckpt base;
    glm_merge *g;
} merge_src;

/* The base tensor, then every adapter of the list merged into it in turn. */
static int read_merged(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err) {
    merge_src *ms = ctx;
    const char *src = name;
    if (t->kind == T_WORD_EMB && glm_ckpt_info(&ms->base, name, NULL, NULL, NULL) != 0 &&
        glm_ckpt_info(&ms->base, "lm_head.weight", NULL, NULL, NULL) == 0)
        src = "lm_head.weight"; /* a tied model's embedding may be stored only as lm_head */
    if (glm_ckpt_info(&ms->base, src, NULL, NULL, NULL) != 0) {
        glm_fail(err, "%s: tensor %s is missing", ms->base.path, name);
        return glm_hint(err, "the base does not match its config.json");
    }
    if (glm_ckpt_read_values(&ms->base, src, t, dst, err)) return -1;
    return glm_merge_apply(ms->g, name, t, dst, err);
}

int glm_adapter_merge(const char *base, const char *adapters, const char *dir, const glm_export_opts *o, glm_err *err) {
    char path[4096];
    int n = glm_adapter_list_count(adapters);
    const char *last = adapters;
    if (n > 1) last = strrchr(adapters, ',') + 1;
    /* THUDM's ptuning output: named first, as the kind of folder it is */
    glm_path_join(path, sizeof path, last, "config.json");
    char *text = glm_is_dir(last) && !glm_is_adapter_dir(last) && glm_is_file(path) ? glm_read_file(path, NULL, err) : NULL;
    int ptuning = text && strstr(text, "\"pre_seq_len\"") != NULL;
    free(text);
    if (ptuning) {
        glm_fail(err, "%s is a P-Tuning v2 checkpoint: its prefix feeds every layer's attention and is not a weight change, so it cannot be merged", last);
        return glm_hint(err, "load it beside the base with --adapter (generate, chat), or fine-tune with --finetuning_type lora to get a mergeable adapter");
    }
    glm_config c;
    if (glm_config_load(&c, base, err)) return -1;
    merge_src ms = {0};
    if (glm_merge_open(&ms.g, &c, adapters, err)) return -1;
    if (glm_ckpt_open(&ms.base, base, err)) { glm_merge_close(ms.g); return -1; }
    char cfg[4096], folder[4096];
    glm_origin_paths(base, cfg, folder, sizeof cfg);
    glm_export_opts oo = *o;
    if (!oo.config_from && cfg[0]) oo.config_from = cfg;
    if (!oo.files_from && folder[0]) oo.files_from = folder;
    int rc = glm_export(&c, read_merged, NULL, &ms, dir, &oo, err); /* c.peft is zero: the base's own rows */
    glm_merge_close(ms.g);
    glm_ckpt_close(&ms.base);
    return rc;
}
