/* Export as a Hugging Face folder (model/ckpt.h): safetensors shards in state-dict order,
 * model.safetensors.index.json, config.json, tokenizer and remote-code files. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/json_text.h"
#include "core/log.h"
#include "model/ckpt.h"
#include "model/hf_layout.h"

void glm_export_opts_init(glm_export_opts *o) {
    *o = (glm_export_opts){.dtype = ST_F16, .max_shard_bytes = 0, .original_layout = 1, .layout = -1};
}

/* One tensor of the output: a table row, the tied head (a copy of the embedding) or an
 * inv_freq buffer. */
typedef struct item {
    char name[GLM_HF_NAME];
    const char *src;          /* name to read (table rows and the tied head) */
    const glm_tensor *t;      /* table row, or NULL for inv_freq */
    int ndim;
    int64_t shape[2];
    size_t numel;
    int shard;
    int qpart;                /* quantized export: 1 the weight's integers (int8), 2 its fp16 scales */
    int64_t row0;             /* the -hf layout's q/k/v: rows [row0, row0 + shape[0]) of the row */
    size_t bytes;             /* bytes of a quantized part */
} item;

static int n_items_max(const glm_table *tab) { return 3 * tab->n + tab->num_layers + 1; }

static int build_items(const glm_table *tab, const glm_config *c, int original, int quant, item *it) {
    int n = 0, rot = glm_head_dim(c) / 4; /* rotary dim HD/2, one frequency per pair */
    for (int i = 0; i < tab->n; i++) {
        const glm_tensor *t = &tab->t[i];
        if (c->hf_layout) { /* transformers' names; query_key_value as three row blocks (model/hf_layout.h) */
            char hf[3][GLM_HF_NAME];
            int64_t row0[3], rows[3], cols = t->ndim == 2 ? t->shape[1] : 1;
            int parts = glm_hf_row_parts(c, t, t->name, hf, row0, rows);
            for (int p = 0; p < parts; p++) {
                it[n] = (item){.src = t->name, .t = t, .ndim = t->ndim, .shape = {rows[p], t->shape[1]},
                               .numel = (size_t)(rows[p] * cols), .row0 = row0[p]};
                memcpy(it[n].name, hf[p], sizeof it[n].name);
                n++;
            }
            continue;
        }
        it[n] = (item){.src = t->name, .t = t, .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]}, .numel = t->numel};
        snprintf(it[n].name, sizeof it[n].name, "%s", t->name);
        n++;
        if (quant && t->layer >= 0 && glm_is_linear_w(t->kind)) { /* the integers, then the scales */
            item *w = &it[n - 1];
            w->qpart = 1;
            w->shape[1] = t->shape[1] * glm_qtype_bits((glm_qtype)quant) / 8;
            w->bytes = (size_t)(w->shape[0] * w->shape[1]);
            it[n] = (item){.src = t->name, .t = t, .ndim = 1, .shape = {t->shape[0], 1}, .numel = (size_t)t->shape[0],
                           .qpart = 2, .bytes = (size_t)t->shape[0] * 2};
            snprintf(it[n].name, sizeof it[n].name, "%.120s_scale", t->name);
            n++;
        }
        /* ChatGLM2's rotary buffer follows the embedding (its forward recomputes the table) */
        if (original && c->family == GLM_FAMILY_GLM2 && t->kind == T_WORD_EMB) {
            it[n] = (item){.ndim = 1, .shape = {rot, 1}, .numel = (size_t)rot};
            snprintf(it[n].name, sizeof it[n].name, "transformer.rotary_pos_emb.inv_freq");
            n++;
        }
        /* the original registers rotary_emb (and its buffer) between input_layernorm and qkv */
        if (original && t->kind == T_LN1_B) {
            it[n] = (item){.ndim = 1, .shape = {rot, 1}, .numel = (size_t)rot};
            snprintf(it[n].name, sizeof it[n].name, "transformer.layers.%d.attention.rotary_emb.inv_freq", t->layer);
            n++;
        }
    }
    if (original && c->tie_word_embeddings) {
        const glm_tensor *e = glm_table_get(tab, -1, T_WORD_EMB);
        it[n] = (item){.src = e->name, .t = e, .ndim = 2, .shape = {e->shape[0], e->shape[1]}, .numel = e->numel};
        snprintf(it[n].name, sizeof it[n].name, "lm_head.weight");
        n++;
    }
    return n;
}

/* fp16(1 / 10000^(2j/R)), R = HD/2: the inverse frequencies the original computes in fp32 and
 * stores as half (and the rope op uses). */
static void inv_freq(float *dst, int n) {
    int R = 2 * n;
    for (int j = 0; j < n; j++) {
        float v = (float)(1.0 / pow(10000.0, (double)(2 * j) / R));
        dst[j] = st_f16_to_f32(st_f32_to_f16(v));
    }
}

/* Model weight files a previous export (or training save) left in dir. */
static int is_weight_file(const char *n) {
    return strncmp(n, "model", 5) == 0 && (strstr(n, ".safetensors") != NULL);
}

static int prepare_dir(const char *dir, int overwrite, glm_err *err) {
    if (glm_mkdirs(dir, err)) return -1;
    DIR *d = opendir(dir);
    if (!d) return glm_fail(err, "%s: cannot open the folder", dir);
    struct dirent *e;
    int rc = 0;
    char path[4096];
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (!is_weight_file(e->d_name)) continue;
        if (!overwrite) {
            rc = glm_fail(err, "%s already holds model weights (%s)", dir, e->d_name);
            glm_hint(err, "choose an empty folder or pass --overwrite_output_dir to replace them");
            break;
        }
        glm_path_join(path, sizeof path, dir, e->d_name);
        if (unlink(path)) rc = glm_fail(err, "%s: cannot remove the old weights file", path);
    }
    closedir(d);
    return rc;
}

static int write_json(const char *path, cJSON *o, glm_err *err) {
    char *s = cJSON_Print(o);
    size_t n = strlen(s);
    s = glm_realloc(s, n + 2);
    s[n] = '\n';
    int rc = glm_write_file_atomic(path, s, n + 1, err);
    free(s);
    return rc;
}

static const char *torch_dtype_name(st_dtype d) {
    return d == ST_F16 ? "float16" : d == ST_BF16 ? "bfloat16" : "float32";
}

int glm_write_hf_config(const glm_config *c, const char *config_from, st_dtype dtype, const char *dir, glm_err *err) {
    char *text = config_from ? glm_read_file(config_from, NULL, err) : glm_config_to_json(c);
    if (!text) return -1;
    glm_err perr;
    cJSON *j = glm_json_parse_doc(text, strlen(text), config_from ? config_from : "config", "config.json", &perr); /* only to refuse a broken source before copying it */
    int ok = cJSON_IsObject(j);
    cJSON *nl = cJSON_GetObjectItem(j, "num_layers");
    int relayered = cJSON_IsNumber(nl) && nl->valueint != c->num_layers; /* a model with layers added (model/expand.h) */
    cJSON_Delete(j);
    char value[32], *out = NULL;
    snprintf(value, sizeof value, "\"%s\"", torch_dtype_name(dtype));
    if (ok) out = glm_json_set_key(text, "torch_dtype", value);
    free(text);
    if (out && relayered) {
        snprintf(value, sizeof value, "%d", c->num_layers);
        char *o2 = glm_json_set_key(out, "num_layers", value);
        free(out);
        out = o2;
    }
    if (out && c->peft.kind == GLM_FT_PTUNING) { /* what THUDM's loader reads to build the prefix encoder */
        snprintf(value, sizeof value, "%d", c->peft.pre_seq_len);
        char *o2 = glm_json_set_key(out, "pre_seq_len", value);
        free(out);
        out = o2 ? glm_json_set_key(o2, "prefix_projection", c->peft.prefix_projection ? "true" : "false") : NULL;
        free(o2);
    }
    /* what THUDM's loader reads to build QuantizedLinear modules; 0 where a quantized source's
     * weights were written as floats */
    if (out && (c->quant == GLM_Q_INT8 || c->quant == GLM_Q_INT4 || strstr(out, "\"quantization_bit\""))) {
        snprintf(value, sizeof value, "%d", c->quant == GLM_Q_INT8 || c->quant == GLM_Q_INT4 ? glm_qtype_bits((glm_qtype)c->quant) : 0);
        char *o2 = glm_json_set_key(out, "quantization_bit", value);
        free(out);
        out = o2;
    }
    if (!out) return glm_fail(err, "%s: not a JSON object", config_from ? config_from : "config");
    size_t n = strlen(out);
    if (n == 0 || out[n - 1] != '\n') { out = glm_realloc(out, n + 2); out[n++] = '\n'; out[n] = 0; }
    char path[4096];
    glm_path_join(path, sizeof path, dir, "config.json");
    int rc = glm_write_file_atomic(path, out, n, err);
    free(out);
    return rc;
}

static int is_source_file(const char *n) {
    static const char *const names[] = {"ice_text.model", "tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                        "special_tokens_map.json", "added_tokens.json", "generation_config.json"};
    size_t len = strlen(n);
    if (len > 3 && strcmp(n + len - 3, ".py") == 0) return 1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(n, names[i]) == 0) return 1;
    return 0;
}

int glm_copy_source_files(const char *from, const char *dir, glm_err *err) {
    char fa[4096], fb[4096];
    if (realpath(from, fa) && realpath(dir, fb) && strcmp(fa, fb) == 0) return 0; /* already there */
    DIR *d = opendir(from);
    if (!d) return glm_fail(err, "%s: cannot open the source folder", from);
    struct dirent *e;
    int rc = 0;
    char src[4096], dst[4096];
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (!is_source_file(e->d_name)) continue;
        glm_path_join(src, sizeof src, from, e->d_name);
        if (!glm_is_file(src)) continue;
        glm_path_join(dst, sizeof dst, dir, e->d_name);
        rc = glm_copy_file(src, dst, err);
    }
    closedir(d);
    return rc;
}

void glm_origin_paths(const char *origin, char *config, char *folder, size_t n) {
    config[0] = folder[0] = 0;
    if (!origin || !origin[0]) return;
    if (glm_is_dir(origin)) {
        snprintf(folder, n, "%s", origin);
        glm_path_join(config, n, origin, "config.json");
        if (!glm_is_file(config)) config[0] = 0;
    } else if (glm_is_file(origin)) {
        snprintf(config, n, "%s", origin);
    }
}

int glm_check_remote_code(const char *dir) {
    static const char *const need[] = {"configuration_chatglm.py", "modeling_chatglm.py", "tokenization_chatglm.py"};
    char path[4096], missing[256] = "";
    for (int i = 0; i < 3; i++) {
        glm_path_join(path, sizeof path, dir, need[i]);
        if (!glm_is_file(path)) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "", need[i]);
    }
    if (!missing[0]) return 1;
    glm_info("%s loads in glmtrain; for transformers (trust_remote_code) it lacks %s: copy THUDM's code files "
             "(and quantization.py) from a chatglm-6b download into it (config.json already names them in auto_map)",
             dir, missing);
    return 0;
}

static void shard_name(char *dst, size_t n, int i, int count) {
    if (count == 1) snprintf(dst, n, "model.safetensors");
    else snprintf(dst, n, "model-%05d-of-%05d.safetensors", i + 1, count);
}

/* A quantized weight's bytes (backend/quant.h's layout): from the source as stored, or its
 * floats quantized here. */
static int quantized_bytes(const item *it, glm_tensor_reader rd, glm_qtensor_reader qrd, void *ctx, int quant, void *dst,
                           glm_err *err) {
    const glm_tensor *t = it->t;
    int got = qrd ? qrd(ctx, t, quant, dst, err) : 0;
    if (got) return got < 0 ? -1 : 0;
    float *f = glm_malloc(t->numel * sizeof(float));
    int rc = rd(ctx, it->src, t, f, err);
    if (rc == 0) glm_quantize((glm_qtype)quant, dst, f, (size_t)t->shape[0], (size_t)t->shape[1]);
    free(f);
    return rc;
}

int glm_export(const glm_config *c, glm_tensor_reader rd, glm_qtensor_reader qrd, void *ctx, const char *dir,
               const glm_export_opts *o, glm_err *err) {
    if (o->dtype != ST_F32 && o->dtype != ST_F16 && o->dtype != ST_BF16)
        return glm_fail(err, "export dtype must be float32, float16 or bfloat16");
    if (o->quant != GLM_Q_NONE && o->quant != GLM_Q_INT8 && o->quant != GLM_Q_INT4)
        return glm_fail(err, "only int8 and int4 weights are written quantized (THUDM's layout), not %s",
                        glm_qtype_name((glm_qtype)o->quant));
    if (o->quant != GLM_Q_NONE && c->hf_layout) {
        glm_fail(err, "int8/int4 weights are written in THUDM's original layout only, and this model is in transformers' GLM layout");
        return glm_hint(err, "write it as floats (no --quantization_bit), or quantize it as it loads in glmtrain");
    }
    if (prepare_dir(dir, o->overwrite, err)) return -1;
    glm_table tab;
    glm_config cb = *c; /* the base rows: what the folder holds */
    cb.quant = GLM_Q_NONE;
    glm_table_build(&tab, &cb);
    item *it = glm_calloc((size_t)n_items_max(&tab), sizeof *it);
    int n = build_items(&tab, c, o->original_layout && !c->hf_layout, o->quant, it);
    /* Hugging Face's shard_checkpoint: a new shard starts when the next tensor would overflow
     * the current one; a tensor larger than the limit gets a shard of its own. A weight's
     * scales stay in its shard. */
    size_t es = st_dtype_size(o->dtype), cur = 0, total = 0;
    int shards = 1;
    for (int i = 0; i < n; i++) {
        size_t b = it[i].qpart ? it[i].bytes : it[i].numel * es;
        if (o->max_shard_bytes && cur > 0 && cur + b > o->max_shard_bytes && it[i].qpart != 2) { shards++; cur = 0; }
        it[i].shard = shards - 1;
        cur += b;
        total += b;
    }
    int rc = 0;
    char name[64], path[4096];
    float *whole = NULL;             /* the row the last row block came from */
    const glm_tensor *whole_of = NULL;
    for (int s = 0; s < shards && rc == 0; s++) {
        int k = 0;
        st_entry *e = glm_calloc((size_t)n, sizeof *e);
        void **bufs = glm_calloc((size_t)n, sizeof *bufs);
        for (int i = 0; i < n && rc == 0; i++) {
            if (it[i].shard != s) continue;
            e[k] = (st_entry){.name = it[i].name, .ndim = it[i].ndim, .shape = {it[i].shape[0], it[i].shape[1]},
                              .data_dtype = ST_F32, .file_dtype = o->dtype};
            if (it[i].qpart == 1) { /* the layout's bytes: integers first, the scales at L.scale */
                glm_qlayout L = glm_qlayout_of((glm_qtype)o->quant, (size_t)it[i].t->shape[0], (size_t)it[i].t->shape[1]);
                bufs[k] = glm_calloc(L.bytes, 1);
                rc = quantized_bytes(&it[i], rd, qrd, ctx, o->quant, bufs[k], err);
                e[k].data_dtype = e[k].file_dtype = ST_I8;
            } else if (it[i].qpart == 2) { /* the scales of the weight just before */
                glm_qlayout L = glm_qlayout_of((glm_qtype)o->quant, (size_t)it[i].t->shape[0], (size_t)it[i].t->shape[1]);
                bufs[k] = NULL;
                e[k].data = (char *)bufs[k - 1] + L.scale;
                e[k].data_dtype = e[k].file_dtype = ST_F16;
                k++;
                continue;
            } else if (it[i].t && it[i].numel != it[i].t->numel) { /* a row block of the row */
                if (whole_of != it[i].t) {
                    whole = glm_realloc(whole, it[i].t->numel * sizeof(float));
                    whole_of = it[i].t;
                    rc = rd(ctx, it[i].src, it[i].t, whole, err);
                }
                bufs[k] = glm_malloc(it[i].numel * sizeof(float));
                int64_t cols = it[i].ndim == 2 ? it[i].shape[1] : 1;
                if (rc == 0) memcpy(bufs[k], whole + it[i].row0 * cols, it[i].numel * sizeof(float));
            } else {
                float *b = bufs[k] = glm_malloc(it[i].numel * sizeof(float));
                if (it[i].t) rc = rd(ctx, it[i].src, it[i].t, b, err);
                else inv_freq(b, (int)it[i].numel);
            }
            e[k].data = bufs[k];
            k++;
        }
        shard_name(name, sizeof name, s, shards);
        glm_path_join(path, sizeof path, dir, name);
        if (rc == 0) rc = st_save(path, e, k, 0, err);
        for (int i = 0; i < k; i++) free(bufs[i]);
        free(bufs);
        free(e);
    }
    if (rc == 0 && shards > 1) {
        cJSON *ix = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(ix, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        cJSON *wm = cJSON_AddObjectToObject(ix, "weight_map");
        for (int i = 0; i < n; i++) {
            shard_name(name, sizeof name, it[i].shard, shards);
            cJSON_AddStringToObject(wm, it[i].name, name);
        }
        glm_path_join(path, sizeof path, dir, "model.safetensors.index.json");
        rc = write_json(path, ix, err);
        cJSON_Delete(ix);
    }
    cb = *c;
    cb.quant = o->quant; /* quantization_bit says what the folder holds */
    if (rc == 0) rc = glm_write_hf_config(&cb, o->config_from, o->dtype, dir, err);
    /* tokenizer and code files travel with the weights, so the folder loads as it is */
    if (rc == 0 && o->files_from) rc = glm_copy_source_files(o->files_from, dir, err);
    free(whole);
    free(it);
    glm_table_free(&tab);
    return rc;
}

/* ---- sources ---- */

static int read_model(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err) {
    glm_model *m = ctx;
    /* by name in the model's own table: a pipeline stage's table holds only its layers */
    void *p;
    const glm_tensor *mt = glm_model_find(m, name, &p); /* trainable or frozen */
    if (!mt) {
        glm_fail(err, "tensor %s is not in this model (a pipeline stage holds only its own layers)", name);
        return glm_hint(err, "export from a model that holds every layer");
    }
    glm_model_row_download(m, mt, dst, p);
    return 0;
}

static int read_model_quantized(void *ctx, const glm_tensor *t, int q, void *dst, glm_err *err) {
    glm_model *m = ctx;
    void *p;
    const glm_tensor *mt = glm_model_find(m, t->name, &p);
    if (!mt || mt->qtype != q) return 0;
    m->be->download(m->be, dst, p, glm_qlayout_of((glm_qtype)q, (size_t)t->shape[0], (size_t)t->shape[1]).bytes);
    return 1;
}

int glm_export_from(const glm_config *c, glm_tensor_reader rd, glm_qtensor_reader qrd, void *ctx, const char *origin,
                    const char *dir, const glm_export_opts *o, glm_err *err) {
    char cfg[4096], folder[4096];
    glm_origin_paths(origin, cfg, folder, sizeof cfg);
    glm_export_opts oo = *o;
    if (!oo.config_from && cfg[0]) oo.config_from = cfg;
    if (!oo.files_from && folder[0]) oo.files_from = folder;
    return glm_export(c, rd, qrd, ctx, dir, &oo, err);
}

int glm_model_export(glm_model *m, const char *dir, const glm_export_opts *o, glm_err *err) {
    return glm_export_from(&m->cfg, read_model, read_model_quantized, m, m->origin, dir, o, err);
}

int glm_ckpt_reader(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err) {
    glm_ckpt *c = ctx;
    /* a tied model's embedding may be stored only as lm_head (see glm_model_load) */
    if (t->kind == T_WORD_EMB && glm_ckpt_info(c, name, NULL, NULL, NULL) != 0 &&
        glm_ckpt_info(c, "lm_head.weight", NULL, NULL, NULL) == 0)
        name = "lm_head.weight";
    if (glm_ckpt_info(c, name, NULL, NULL, NULL) != 0) {
        glm_fail(err, "%s: tensor %s is missing (%s checkpoint)", c->path, name, glm_ckpt_format(c));
        return glm_hint(err, "the checkpoint does not match its config.json (num_layers? tie_word_embeddings?)");
    }
    return glm_ckpt_read_values(c, name, t, dst, err);
}

/* A pre-quantized source weight of the type asked for: its bytes as stored. */
static int read_ckpt_quantized(void *ctx, const glm_tensor *t, int q, void *dst, glm_err *err) {
    glm_ckpt *c = ctx;
    if (glm_ckpt_quantized_type(c, t->name, t->shape[0], t->shape[1]) != q) return 0;
    return glm_ckpt_read_quantized(c, t->name, q, t->shape[0], t->shape[1], dst, err) ? -1 : 1;
}

/* The same tensors under the other layout's names (model/hf_layout.h), with a config.json in that
 * layout's keys made from the config (the rotary base kept: THUDM's rope_ratio 500 is transformers'
 * rope_theta 5e6) and the source's list of end ids; the tokenizer and code files copied as they are. */
static int convert_layout(glm_config *c, glm_ckpt *ck, const char *from, const char *dir, const glm_export_opts *o,
                          glm_err *err) {
    if (c->family != GLM_FAMILY_GLM2 || c->sandwich_norms || c->quant != GLM_Q_NONE) {
        glm_fail(err, "%s: --layout changes the names of a GLM-4-shaped float model; this one is %s", from,
                 c->family != GLM_FAMILY_GLM2 ? "ChatGLM-6B (GLM v1), which has THUDM's layout only"
                 : c->sandwich_norms ? "GLM-4-0414, which has transformers' layout only" : "stored quantized");
        return glm_hint(err, "leave --layout out to keep the source's layout");
    }
    char cfg[4096], folder[4096];
    glm_origin_paths(from, cfg, folder, sizeof cfg);
    c->hf_layout = o->layout;
    glm_export_opts oo = *o;
    oo.config_from = NULL; /* made from c in the new layout's keys */
    oo.files_from = folder[0] ? folder : NULL;
    int rc = glm_export(c, glm_ckpt_reader, NULL, ck, dir, &oo, err);
    char *src = rc || !cfg[0] ? NULL : glm_read_file(cfg, NULL, err);
    cJSON *j = src ? cJSON_Parse(src) : NULL, *eos = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id");
    if (cJSON_IsArray(eos)) { /* GLM-4's chat stops at <|user|> and <|observation|> too */
        char out[4096], *list = cJSON_PrintUnformatted(eos), *text;
        glm_path_join(out, sizeof out, dir, "config.json");
        if ((text = glm_read_file(out, NULL, err)) != NULL) {
            char *with = glm_json_set_key(text, "eos_token_id", list);
            rc = with ? glm_write_file_atomic(out, with, strlen(with), err) : glm_fail(err, "%s: not a JSON object", out);
            free(with);
            free(text);
        } else {
            rc = -1;
        }
        free(list);
    }
    cJSON_Delete(j);
    free(src);
    if (rc == 0 && !c->hf_layout)
        glm_info("%s: THUDM's layout loads in transformers with THUDM's code files (modeling_chatglm.py and the rest, "
                 "trust_remote_code) and its tokenizer.model; glmtrain reads it as it is", dir);
    return rc;
}

int glm_ckpt_convert(const char *from, const char *dir, const glm_export_opts *o, glm_err *err) {
    char fa[4096], fb[4096];
    if (realpath(from, fa) && realpath(dir, fb) && strcmp(fa, fb) == 0) {
        glm_fail(err, "--from and --to are the same folder (%s)", from);
        return glm_hint(err, "write the converted model to a new folder");
    }
    glm_config c;
    if (glm_config_load(&c, from, err)) return -1;
    glm_ckpt ck;
    if (glm_ckpt_open(&ck, from, err)) return -1;
    /* Tensors the model does not use (P-tuning prefix encoders, other families) are not
     * exported; say so instead of dropping them silently. */
    glm_table tab;
    glm_table_build(&tab, &c);
    int unused = 0;
    for (int i = 0; i < glm_ckpt_count(&ck); i++) {
        const char *nm = glm_ckpt_name(&ck, i);
        if (glm_table_find(&tab, nm) || strstr(nm, "rotary_emb.inv_freq") || strstr(nm, "rotary_pos_emb.inv_freq") || strcmp(nm, "lm_head.weight") == 0 ||
            (strlen(nm) > 13 && strcmp(nm + strlen(nm) - 13, ".weight_scale") == 0)) continue; /* read with its weight */
        if (unused++ < 5) glm_warn("%s: tensor %s is not part of the model and is not exported", from, nm);
    }
    if (unused > 5) glm_warn("... and %d more unused tensors", unused - 5);
    glm_table_free(&tab);
    int rc;
    if (o->layout >= 0 && o->layout != c.hf_layout) {
        rc = convert_layout(&c, &ck, from, dir, o, err);
    } else {
        rc = glm_export_from(&c, glm_ckpt_reader, read_ckpt_quantized, &ck, from, dir, o, err);
    }
    glm_ckpt_close(&ck);
    return rc;
}
