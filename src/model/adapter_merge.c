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
    int64_t ash[2] = {r, t->shape[1]}, bsh[2] = {t->shape[0], r}, stored[ST_MAX_DIMS];
    /* peft's q_proj, k_proj, v_proj (some or all of them): each on its rows of W. THUDM's one
     * adapter (A [r, in]) merges as one product below. */
    if (t->kind == T_QKV_W && (glm_ckpt_info(&o->file, an, NULL, NULL, stored) || stored[0] != r)) {
        int64_t C = t->shape[1], row = 0;
        int got = glm_ckpt_read_qkv_lora(&o->file, an, 0, &g->cfg, r, C, g->a, err);
        if (got > 0) got = glm_ckpt_read_qkv_lora(&o->file, bn, 1, &g->cfg, r, C, g->b, err);
        if (got < 0) return glm_hint(err, "the adapter was made for another base model or rank (see its adapter_config.json)");
        if (got > 0 && o->has_init) { /* PiSSA: each block's W_k -= s B0_k A0_k first (the trained-on base) */
            float *a0 = glm_malloc((size_t)3 * r * C * sizeof(float)), *b0 = glm_malloc((size_t)t->shape[0] * r * sizeof(float));
            int g0 = glm_ckpt_read_qkv_lora(&o->init, an, 0, &g->cfg, r, C, a0, err);
            if (g0 > 0) g0 = glm_ckpt_read_qkv_lora(&o->init, bn, 1, &g->cfg, r, C, b0, err);
            for (int k = 0; g0 > 0 && k < 3; k++) {
                int64_t rows = glm_hf_part_rows(&g->cfg, k);
                cpu_sgemm(0, 0, (int)rows, (int)C, r, -glm_lora_scaling(&o->peft), b0 + row * r, r, a0 + (size_t)k * r * C,
                          (int)C, 1.0f, w + row * C, (int)C);
                row += rows;
            }
            row = 0;
            free(a0);
            free(b0);
            if (g0 == 0) glm_fail(err, "%s: tensor %s is missing", o->init.path, an);
            if (g0 <= 0) return glm_hint(err, "%s holds the PiSSA adapter's first values: it belongs to %s", o->init.path, o->dir);
        }
        for (int k = 0; got > 0 && k < 3; k++) { /* a part the file lacks is zero: it adds nothing */
            int64_t rows = glm_hf_part_rows(&g->cfg, k);
            if (o->peft.use_dora) /* each block's rows by its own adapter: ||W_k + s B_k A_k|| */
                cpu_dora_norm(g->norm + row, w + row * C, g->a + (size_t)k * r * C, g->b + row * r, glm_lora_scaling(&o->peft),
                              (int)rows, (int)C, r);
            cpu_sgemm(0, 0, (int)rows, (int)C, r, glm_lora_scaling(&o->peft), g->b + row * r, r, g->a + (size_t)k * r * C,
                      (int)C, 1.0f, w + row * C, (int)C);
            row += rows;
        }
        if (got > 0) return o->peft.use_dora ? dora_rows(o, name, stem, t, g, w, err) : 0;
    }
    if (glm_ckpt_info(&o->file, an, NULL, NULL, stored) || glm_ckpt_info(&o->file, bn, NULL, NULL, NULL)) {
        glm_fail(err, "%s: tensor %s is missing", o->file.path, an);
        return glm_hint(err, "the adapter was made for other modules or layers (its adapter_config.json's target_modules)");
    }
    int OC = (int)t->shape[0], C = (int)t->shape[1];
    float s = glm_lora_scaling(&o->peft);
    if (o->has_init) { /* PiSSA: W -= s B0 A0 first, the base its adapter was trained on */
        if (glm_ckpt_read_f32(&o->init, an, g->a, 2, ash, err) || glm_ckpt_read_f32(&o->init, bn, g->b, 2, bsh, err))
            return glm_hint(err, "%s holds the PiSSA adapter's first values: it belongs to %s", o->init.path, o->dir);
        cpu_sgemm(0, 0, OC, C, r, -s, g->b, r, g->a, C, 1.0f, w, C);
    }
    if (glm_ckpt_read_f32(&o->file, an, g->a, 2, ash, err) || glm_ckpt_read_f32(&o->file, bn, g->b, 2, bsh, err))
        return glm_hint(err, "the adapter was made for another base model or rank (see its adapter_config.json)");
    if (o->peft.use_dora) cpu_dora_norm(g->norm, w, g->a, g->b, s, OC, C, r);
    /* W[out, in] += s * B[out, r] A[r, in] */
    cpu_sgemm(0, 0, OC, C, r, s, g->b, r, g->a, C, 1.0f, w, C);
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
