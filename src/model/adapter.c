/* peft-format LoRA adapters (adapter.h). */
#include "model/adapter.h"
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/hub.h"
#include "core/json_text.h"
#include "model/ckpt.h"
#include "model/hf_layout.h"
#include "model/pissa.h"

/* what an adapter folder holds: the adapters, and the whole modules of modules_to_save (every
 * other row a LoRA model trains) */
static int in_adapter(const glm_peft *p, const glm_tensor *t) {
    return glm_is_lora(t->kind) || glm_whole_row(p, t->kind);
}

/* The keys peft 0.6's LoraConfig knows (a newer key would make an older peft refuse the
 * file): use_rslora and use_dora are written only when on. */
static char *config_json(const glm_model *m, const glm_peft *p) {
    cJSON *o = cJSON_CreateObject();
    char base[4096], folder[4096];
    glm_origin_paths(m->origin, base, folder, sizeof base);
    const char *base_name = folder[0] ? folder : m->origin;
    char hub[256]; /* a model of the Hugging Face cache: by its name, which other machines resolve too */
    if (glm_hub_name_of(base_name, hub, sizeof hub) == 0) base_name = hub;
    cJSON_AddStringToObject(o, "base_model_name_or_path", base_name);
    cJSON_AddStringToObject(o, "bias", "none");
    cJSON_AddBoolToObject(o, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(o, "inference_mode", 1);
    if (p->pissa) { /* the start a PiSSA adapter's base residual came from (peft 0.11 and later read it) */
        char init[32];
        if (p->pissa_niter < 0) snprintf(init, sizeof init, "pissa");
        else snprintf(init, sizeof init, "pissa_niter_%d", p->pissa_niter);
        cJSON_AddStringToObject(o, "init_lora_weights", init);
    } else {
        cJSON_AddBoolToObject(o, "init_lora_weights", 1);
    }
    uint64_t every = m->cfg.num_layers >= 64 ? ~0ull : (1ull << m->cfg.num_layers) - 1;
    if (p->lora_layers && (p->lora_layers & every) != every) { /* some layers: peft finds them under "layers.N." */
        cJSON_AddStringToObject(o, "layers_pattern", "layers");
        cJSON *lt = cJSON_AddArrayToObject(o, "layers_to_transform");
        for (int l = 0; l < 64; l++)
            if (p->lora_layers >> l & 1) cJSON_AddItemToArray(lt, cJSON_CreateNumber(l));
    } else {
        cJSON_AddNullToObject(o, "layers_pattern");
        cJSON_AddNullToObject(o, "layers_to_transform");
    }
    char num[32];
    glm_json_float(num, sizeof num, p->lora_alpha);
    cJSON_AddRawToObject(o, "lora_alpha", num);
    glm_json_float(num, sizeof num, p->lora_dropout); /* 0.05 as peft writes it */
    cJSON_AddRawToObject(o, "lora_dropout", num);
    if (!p->extra_modules) {
        cJSON_AddNullToObject(o, "modules_to_save");
    } else { /* the modules by their names, which peft matches at the end of a module's path */
        cJSON *ms = cJSON_AddArrayToObject(o, "modules_to_save");
        char name[64];
        for (int bit = 1; bit <= GLM_EXTRA_HEAD; bit <<= 1)
            if (p->extra_modules & bit) {
                const char *nm = glm_extra_module_name(&m->cfg, bit, name, sizeof name);
                char hf[64]; /* transformers' GLM layout: its module names */
                cJSON_AddItemToArray(ms, cJSON_CreateString(m->cfg.hf_layout && !glm_hf_module_name(nm, hf, sizeof hf) ? hf : nm));
            }
    }
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddNumberToObject(o, "r", p->lora_rank);
    cJSON_AddNullToObject(o, "revision");
    cJSON *tm = cJSON_AddArrayToObject(o, "target_modules");
    for (int i = 0; i < 4; i++) {
        if (!(p->lora_targets >> i & 1)) continue;
        if (!m->cfg.hf_layout) {
            cJSON_AddItemToArray(tm, cJSON_CreateString(glm_lora_target_name(1 << i)));
            continue;
        }
        const char *hf[3]; /* transformers' GLM layout: its module names, q, k, v those with adapters */
        int nh = glm_hf_short_names(m->fam->modules[i], hf);
        for (int k = 0; k < nh; k++)
            if (nh == 1 || !p->lora_qkv_parts || (p->lora_qkv_parts >> k & 1)) cJSON_AddItemToArray(tm, cJSON_CreateString(hf[k]));
    }
    cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
    if (p->use_rslora) cJSON_AddBoolToObject(o, "use_rslora", 1);
    if (p->use_dora) cJSON_AddBoolToObject(o, "use_dora", 1); /* peft 0.9 and later read it */
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

static int write_config(const glm_model *m, const glm_peft *p, const char *dir, glm_err *err) {
    char path[4096];
    char *cfg = config_json(m, p);
    glm_path_join(path, sizeof path, dir, "adapter_config.json");
    size_t len = strlen(cfg);
    cfg = glm_realloc(cfg, len + 2);
    cfg[len++] = '\n';
    int rc = glm_write_file_atomic(path, cfg, len, err);
    free(cfg);
    return rc;
}

/* adapter_model.safetensors of the rows `host` holds in table tab's layout, those that
 * in_adapter takes under p; with `lora_only`, the A and B rows alone. In transformers' GLM layout
 * (c->hf_layout) under its names, q, k and v's stacked adapters as peft's three modules (their
 * row blocks: r rows of A each, q / k / v's rows of B). */
static int write_rows(const glm_config *c, const glm_table *tab, const glm_peft *p, const float *host, int lora_only,
                      const char *dir, st_dtype dtype, glm_err *err) {
    st_entry *e = glm_calloc((size_t)tab->n * 3 + 1, sizeof *e);
    char (*names)[GLM_HF_NAME] = glm_calloc((size_t)tab->n * 3 + 1, GLM_HF_NAME);
    int n = 0;
    glm_config cp = *c;
    cp.peft = *p; /* the adapter written: which of q, k, v it has */
    for (int i = 0; i < tab->n; i++) {
        const glm_tensor *t = &tab->t[i];
        if (lora_only ? !glm_is_lora_ab(t->kind) : !in_adapter(p, t)) continue;
        char name[GLM_HF_NAME], hf[3][GLM_HF_NAME];
        snprintf(name, sizeof name, "%s%s", GLM_ADAPTER_PREFIX, t->name); /* a whole module as peft's save names it */
        int64_t cols = t->ndim == 2 ? t->shape[1] : 1, row0[3] = {0}, rows[3] = {t->shape[0]};
        int parts = c->hf_layout ? glm_hf_row_parts(&cp, t, name, hf, row0, rows) : 1;
        if (!c->hf_layout) memcpy(hf[0], name, GLM_HF_NAME);
        for (int k = 0; k < parts; k++) {
            memcpy(names[n], hf[k], GLM_HF_NAME);
            e[n] = (st_entry){.name = names[n], .ndim = t->ndim, .shape = {rows[k], t->shape[1]},
                              .data = host + t->offset + row0[k] * cols, .data_dtype = ST_F32, .file_dtype = dtype};
            n++;
        }
    }
    char path[4096];
    glm_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    int rc = st_save(path, e, n, 0, err);
    free(e);
    free(names);
    return rc;
}

int glm_adapter_save(glm_model *m, const char *dir, st_dtype dtype, glm_err *err) {
    if (glm_mkdirs(dir, err)) return -1;
    float *host = glm_malloc((m->tab.total ? m->tab.total : 1) * sizeof(float));
    m->be->download_f32(m->be, host, m->params, m->tab.total);
    int rc = write_rows(&m->cfg, &m->tab, &m->cfg.peft, host, 0, dir, dtype, err);
    free(host);
    if (rc == 0 && m->cfg.peft.pissa && m->pissa_init) { /* PiSSA's first values beside it: its base is W - s B0 A0 */
        char init[4096];
        glm_path_join(init, sizeof init, dir, GLM_PISSA_INIT_DIR);
        glm_peft p = m->cfg.peft;
        p.pissa = 0; /* as LLaMA-Factory writes it: a plain start, which peft's conversion reads */
        p.extra_modules = 0;
        rc = glm_mkdirs(init, err) || write_rows(&m->cfg, &m->tab, &p, m->pissa_init, 1, init, ST_F32, err) ||
             write_config(m, &p, init, err);
    }
    if (rc) return -1;
    return glm_adapter_write_config(m, dir, err);
}

int glm_adapter_write_config(const glm_model *m, const char *dir, glm_err *err) {
    return write_config(m, &m->cfg.peft, dir, err);
}

int glm_adapter_save_pissa_converted(glm_model *m, const char *dir, glm_err *err) {
    const glm_peft *p = &m->cfg.peft;
    if (!p->pissa || !m->pissa_init) return glm_fail(err, "not a PiSSA adapter: nothing to convert");
    /* the converted rows: A' = [A; A0] [2r, in], B' = [B, -B0] [out, 2r] */
    glm_config c = m->cfg; /* the doubled rank's settings and table */
    c.peft.lora_rank = 2 * p->lora_rank;
    c.peft.lora_alpha = p->use_rslora ? p->lora_alpha * sqrtf(2.0f) : 2 * p->lora_alpha; /* the same scaling */
    c.peft.pissa = 0;
    glm_table conv_tab;
    glm_table_build_range(&conv_tab, &c, m->layer_lo, m->layer_hi, m->first, m->last);
    float *host = glm_malloc((m->tab.total ? m->tab.total : 1) * sizeof(float));
    float *conv = glm_calloc(conv_tab.total ? conv_tab.total : 1, sizeof(float));
    m->be->download_f32(m->be, host, m->params, m->tab.total);
    int r = p->lora_rank;
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i], *ct = glm_table_find(&conv_tab, t->name);
        if (!ct) continue;
        const float *now = host + t->offset, *first = m->pissa_init + t->offset;
        float *out = conv + ct->offset;
        if (glm_is_lora_ab(t->kind) && (t->kind - T_QKV_LA) % 2 == 0) { /* A [r, in]: rows of A, then of A0 */
            /* split q, k, v (A stacked [S r, in]): each block's [A_k; A0_k] in its place */
            int S = glm_lora_split(&m->cfg, glm_lora_module(t->kind));
            size_t blk = t->numel / (size_t)S;
            for (int k = 0; k < S; k++) {
                memcpy(out + 2 * k * blk, now + k * blk, blk * sizeof(float));
                memcpy(out + (2 * k + 1) * blk, first + k * blk, blk * sizeof(float));
            }
        } else if (glm_is_lora_ab(t->kind)) { /* B [out, r]: each row B_j then -B0_j */
            for (int64_t j = 0; j < t->shape[0]; j++)
                for (int k = 0; k < r; k++) {
                    out[j * 2 * r + k] = now[j * r + k];
                    out[j * 2 * r + r + k] = -first[j * r + k];
                }
        } else { /* a whole module of modules_to_save */
            memcpy(out, now, t->numel * sizeof(float));
        }
    }
    int rc = glm_mkdirs(dir, err) || write_rows(&c, &conv_tab, &c.peft, conv, 0, dir, ST_F32, err) || write_config(m, &c.peft, dir, err)
                 ? -1 : 0;
    free(host);
    free(conv);
    glm_table_free(&conv_tab);
    return rc;
}

int glm_adapter_load(glm_model *m, const char *dir, glm_err *err) {
    if (m->cfg.peft.kind == GLM_FT_PTUNING) return glm_model_load_trainable(m, dir, err); /* transformer.prefix_encoder.* */
    char path[4096];
    if (glm_adapter_file(dir, path, sizeof path)) {
        glm_fail(err, "%s: no adapter_model.safetensors or adapter_model.bin", dir);
        return glm_hint(err, "--adapter takes a folder written by glmtrain (--finetuning_type lora) or by peft's save_pretrained");
    }
    if (glm_extra_modules_check(&m->cfg, &m->cfg.peft, dir, err)) return -1;
    if (glm_model_load_adapter_file(m, path, GLM_ADAPTER_PREFIX, err)) return -1;
    return m->cfg.peft.pissa ? glm_pissa_residual(m, dir, err) : 0; /* the base it was trained on */
}
