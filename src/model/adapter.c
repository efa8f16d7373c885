/* peft-format LoRA adapters (adapter.h). */
#include "model/adapter.h"
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_ops.h"
#include "core/fileutil.h"
#include "core/hub.h"
#include "core/json_text.h"
#include "model/ckpt.h"

/* what an adapter folder holds: the adapters, and the whole modules of modules_to_save (every
 * other row a LoRA model trains) */
static int in_adapter(const glm_model *m, const glm_tensor *t) {
    return glm_is_lora(t->kind) || glm_whole_row(&m->cfg.peft, t->kind);
}

/* The keys peft 0.6's LoraConfig knows (a newer key would make an older peft refuse the
 * file): use_rslora and use_dora are written only when on. */
static char *config_json(const glm_model *m) {
    const glm_peft *p = &m->cfg.peft;
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
    cJSON_AddBoolToObject(o, "init_lora_weights", 1);
    cJSON_AddNullToObject(o, "layers_pattern");
    cJSON_AddNullToObject(o, "layers_to_transform");
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
            if (p->extra_modules & bit)
                cJSON_AddItemToArray(ms, cJSON_CreateString(glm_extra_module_name(&m->cfg, bit, name, sizeof name)));
    }
    cJSON_AddStringToObject(o, "peft_type", "LORA");
    cJSON_AddNumberToObject(o, "r", p->lora_rank);
    cJSON_AddNullToObject(o, "revision");
    cJSON *tm = cJSON_AddArrayToObject(o, "target_modules");
    for (int i = 0; i < 4; i++)
        if (p->lora_targets >> i & 1) cJSON_AddItemToArray(tm, cJSON_CreateString(glm_lora_target_name(1 << i)));
    cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
    if (p->use_rslora) cJSON_AddBoolToObject(o, "use_rslora", 1);
    if (p->use_dora) cJSON_AddBoolToObject(o, "use_dora", 1); /* peft 0.9 and later read it */
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

int glm_adapter_save(glm_model *m, const char *dir, st_dtype dtype, glm_err *err) {
    if (glm_mkdirs(dir, err)) return -1;
    float *host = glm_malloc((m->tab.total ? m->tab.total : 1) * sizeof(float));
    m->be->download_f32(m->be, host, m->params, m->tab.total);
    st_entry *e = glm_calloc((size_t)m->tab.n + 1, sizeof *e);
    char (*names)[192] = glm_calloc((size_t)m->tab.n + 1, 192);
    int n = 0;
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        if (!in_adapter(m, t)) continue;
        snprintf(names[n], 192, "%s%s", GLM_ADAPTER_PREFIX, t->name); /* a whole module as peft's save names it */
        e[n] = (st_entry){.name = names[n], .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]}, .data = host + t->offset,
                          .data_dtype = ST_F32, .file_dtype = dtype};
        n++;
    }
    char path[4096];
    glm_path_join(path, sizeof path, dir, "adapter_model.safetensors");
    int rc = st_save(path, e, n, 0, err);
    free(e);
    free(names);
    free(host);
    if (rc) return -1;
    return glm_adapter_write_config(m, dir, err);
}

int glm_adapter_write_config(const glm_model *m, const char *dir, glm_err *err) {
    char path[4096];
    char *cfg = config_json(m);
    glm_path_join(path, sizeof path, dir, "adapter_config.json");
    size_t len = strlen(cfg);
    cfg = glm_realloc(cfg, len + 2);
    cfg[len++] = '\n';
    int rc = glm_write_file_atomic(path, cfg, len, err);
    free(cfg);
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
    return glm_model_load_adapter_file(m, path, GLM_ADAPTER_PREFIX, err);
}

/* ---- merge ---- */

typedef struct merge_src {
    glm_ckpt base, adapter;
    glm_peft peft;
    float *a, *b;      /* scratch for one adapter's A and B */
    float *mag, *norm; /* and DoRA's magnitudes and row norms */
} merge_src;

/* The base tensor, with scaling * B A added when its module has an adapter; a module of
 * modules_to_save, the adapter's whole copy. */
static int read_merged(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err) {
    merge_src *ms = ctx;
    const char *src = name;
    if (glm_whole_row(&ms->peft, t->kind)) {
        char an[256];
        snprintf(an, sizeof an, "%s%s", GLM_ADAPTER_PREFIX, name);
        if (glm_ckpt_info(&ms->adapter, an, NULL, NULL, NULL)) {
            glm_fail(err, "%s: tensor %s is missing", ms->adapter.path, an);
            return glm_hint(err, "its adapter_config.json names the module in modules_to_save, so peft saved it whole");
        }
        if (glm_ckpt_read_values(&ms->adapter, an, t, dst, err)) return glm_hint(err, "the adapter was made for another base model");
        return 0;
    }
    if (t->kind == T_WORD_EMB && glm_ckpt_info(&ms->base, name, NULL, NULL, NULL) != 0 &&
        glm_ckpt_info(&ms->base, "lm_head.weight", NULL, NULL, NULL) == 0)
        src = "lm_head.weight"; /* a tied model's embedding may be stored only as lm_head */
    if (glm_ckpt_info(&ms->base, src, NULL, NULL, NULL) != 0) {
        glm_fail(err, "%s: tensor %s is missing", ms->base.path, name);
        return glm_hint(err, "the base does not match its config.json");
    }
    if (glm_ckpt_read_values(&ms->base, src, t, dst, err)) return -1;
    int i = glm_linear_index(t->kind);
    if (i < 0 || !(ms->peft.lora_targets >> i & 1)) return 0;
    const char *dot = strrchr(name, '.'); /* name is <module>.weight */
    char an[256], bn[256];
    snprintf(an, sizeof an, "%s%.*s.lora_A.weight", GLM_ADAPTER_PREFIX, (int)(dot - name), name);
    snprintf(bn, sizeof bn, "%s%.*s.lora_B.weight", GLM_ADAPTER_PREFIX, (int)(dot - name), name);
    int r = ms->peft.lora_rank;
    int64_t ash[2] = {r, t->shape[1]}, bsh[2] = {t->shape[0], r};
    if (glm_ckpt_info(&ms->adapter, an, NULL, NULL, NULL) || glm_ckpt_info(&ms->adapter, bn, NULL, NULL, NULL)) {
        glm_fail(err, "%s: tensor %s is missing", ms->adapter.path, an);
        return glm_hint(err, "the adapter was made for other modules or layers (its adapter_config.json's target_modules)");
    }
    if (glm_ckpt_read_f32(&ms->adapter, an, ms->a, 2, ash, err) || glm_ckpt_read_f32(&ms->adapter, bn, ms->b, 2, bsh, err))
        return glm_hint(err, "the adapter was made for another base model or rank (see its adapter_config.json)");
    int OC = (int)t->shape[0], C = (int)t->shape[1];
    float s = glm_lora_scaling(&ms->peft);
    /* DoRA (peft's merge): ||W + s B A|| per row, the training's own definition (the CPU op) */
    if (ms->peft.use_dora) cpu_dora_norm(ms->norm, dst, ms->a, ms->b, s, OC, C, r);
    /* W[out, in] += s * B[out, r] A[r, in] */
    cpu_sgemm(0, 0, OC, C, r, s, ms->b, r, ms->a, C, 1.0f, dst, C);
    if (!ms->peft.use_dora) return 0;
    char mn[300];
    int64_t msh[1] = {t->shape[0]};
    snprintf(mn, sizeof mn, "%s%.*s.lora_magnitude_vector", GLM_ADAPTER_PREFIX, (int)(dot - name), name);
    if (glm_ckpt_info(&ms->adapter, mn, NULL, NULL, NULL)) strcat(mn, ".weight");
    if (glm_ckpt_info(&ms->adapter, mn, NULL, NULL, NULL)) {
        glm_fail(err, "%s: tensor %s is missing", ms->adapter.path, mn);
        return glm_hint(err, "the adapter_config.json says use_dora, so each adapted module has a magnitude vector");
    }
    if (glm_ckpt_read_f32(&ms->adapter, mn, ms->mag, 1, msh, err))
        return glm_hint(err, "the adapter was made for another base model (see its adapter_config.json)");
    for (int j = 0; j < OC; j++) /* times m / the row's norm */
        for (int k = 0; k < C; k++) dst[(size_t)j * C + k] *= ms->mag[j] / ms->norm[j];
    return 0;
}

int glm_adapter_merge(const char *base, const char *adapter_dir, const char *dir, const glm_export_opts *o, glm_err *err) {
    char path[4096];
    glm_path_join(path, sizeof path, adapter_dir, "config.json");
    char *text = glm_is_dir(adapter_dir) && !glm_is_adapter_dir(adapter_dir) && glm_is_file(path) ? glm_read_file(path, NULL, err) : NULL;
    int ptuning = text && strstr(text, "\"pre_seq_len\"") != NULL;
    free(text);
    if (ptuning) {
        glm_fail(err, "%s is a P-Tuning v2 checkpoint: its prefix feeds every layer's attention and is not a weight change, so it cannot be merged", adapter_dir);
        return glm_hint(err, "load it beside the base with --adapter (generate, chat), or fine-tune with --finetuning_type lora to get a mergeable adapter");
    }
    merge_src ms = {0};
    if (glm_adapter_read_config(adapter_dir, &ms.peft, err)) return -1;
    glm_config c;
    if (glm_config_load(&c, base, err)) return -1;
    if (glm_extra_modules_check(&c, &ms.peft, adapter_dir, err)) return -1;
    if (glm_adapter_file(adapter_dir, path, sizeof path)) return glm_fail(err, "%s: no adapter_model.safetensors or adapter_model.bin", adapter_dir);
    if (glm_ckpt_open(&ms.base, base, err)) return -1;
    if (glm_ckpt_open(&ms.adapter, path, err)) { glm_ckpt_close(&ms.base); return -1; }
    /* A [r, in] and B [out, r] of the widest module (dense_h_to_4h's B is [2F, r] in the ChatGLM2 block) */
    size_t in = (size_t)glm_linear_in_max(&c), out = (size_t)glm_linear_out_max(&c), r = (size_t)ms.peft.lora_rank;
    ms.a = glm_malloc(in * r * sizeof(float));
    ms.b = glm_malloc(out * r * sizeof(float));
    ms.mag = glm_malloc(out * sizeof(float));
    ms.norm = glm_malloc(out * sizeof(float));
    char cfg[4096], folder[4096];
    glm_origin_paths(base, cfg, folder, sizeof cfg);
    glm_export_opts oo = *o;
    if (!oo.config_from && cfg[0]) oo.config_from = cfg;
    if (!oo.files_from && folder[0]) oo.files_from = folder;
    int rc = glm_export(&c, read_merged, NULL, &ms, dir, &oo, err); /* c.peft is zero: the base's own rows */
    free(ms.a);
    free(ms.b);
    free(ms.mag);
    free(ms.norm);
    glm_ckpt_close(&ms.adapter);
    glm_ckpt_close(&ms.base);
    return rc;
}
