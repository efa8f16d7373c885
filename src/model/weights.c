/* Parameter initialisation and weights I/O (safetensors or torch .bin in, safetensors out),
 * driven by the tensor table. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "io/torchbin.h"
#include "model/adapter.h"
#include "model/ckpt.h"
#include "model/family_names.h"
#include "model/glm.h"
#include "model/hf_layout.h"

static int is_adapter(const glm_tensor *t) { return glm_is_extra(t->kind); } /* LoRA, prefix or value head rows */

void glm_model_init_random(glm_model *m, uint64_t seed, float std) {
    size_t cap = 0;
    for (int i = 0; i < glm_model_nrows(m); i++) cap = glm_model_row(m, i, NULL)->numel > cap ? glm_model_row(m, i, NULL)->numel : cap;
    float *host = glm_malloc(cap * sizeof(float));
    glm_rng rng;
    /* one stream per tensor, numbered by its row in the whole model's table, so a pipeline
     * stage (a part of the table) gets the same values as the whole model */
    glm_table full;
    glm_table_build(&full, &m->cfg);
    for (int i = 0; i < glm_model_nrows(m); i++) {
        void *dst;
        const glm_tensor *t = glm_model_row(m, i, &dst);
        if (is_adapter(t)) continue; /* glm_model_init_adapters */
        glm_rng_seed(&rng, seed * 1000003ULL + (uint64_t)(glm_table_find(&full, t->name) - full.t));
        for (size_t j = 0; j < t->numel; j++)
            host[j] = t->ndim == 2 ? std * glm_rng_normal(&rng) : (glm_is_norm_w(t->kind) ? 1.0f : 0.0f);
        glm_model_row_upload(m, t, dst, host);
    }
    glm_table_free(&full);
    free(host);
}

void glm_model_init_adapters(glm_model *m, uint64_t seed) {
    glm_rng rng;
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        if (!is_adapter(t)) continue;
        float *host = glm_calloc(t->numel, sizeof(float));
        /* one stream per (layer, kind): a pipeline stage draws the values the whole model would */
        uint64_t id = (uint64_t)(t->layer + 1) * GLM_SEED_KINDS + (uint64_t)t->kind + 1;
        glm_rng_seed(&rng, seed * 1000003ULL + 7919ULL * id);
        if (t->kind == T_PREFIX_EMB) { /* torch's nn.Embedding: N(0, 1) */
            for (size_t j = 0; j < t->numel; j++) host[j] = glm_rng_normal(&rng);
        } else if (glm_is_prefix(t->kind)) { /* torch's nn.Linear: weight and bias U(-1/sqrt(in), 1/sqrt(in)) */
            /* trans.0 takes the embedding's width (v1: H; ChatGLM2: its kv width), trans.2 takes H */
            int in = t->kind == T_PREFIX_W1 || t->kind == T_PREFIX_B1 ? glm_prefix_emb_width(&m->cfg) : m->cfg.hidden_size;
            float bound = 1.0f / sqrtf((float)in);
            for (size_t j = 0; j < t->numel; j++) host[j] = bound * (2.0f * glm_rng_uniform(&rng) - 1.0f);
        } else if (glm_is_vhead(t->kind)) { /* TRL's ValueHead: torch's nn.Linear(H, 1), weight and bias U(-1/sqrt(H), 1/sqrt(H)) */
            float bound = 1.0f / sqrtf((float)m->cfg.hidden_size);
            for (size_t j = 0; j < t->numel; j++) host[j] = bound * (2.0f * glm_rng_uniform(&rng) - 1.0f);
        } else if (glm_is_dora(t->kind)) { /* the row norms of the base: glm_dora_init_magnitudes below */
        } else if ((t->kind - T_QKV_LA) % 2 == 0) { /* LoRA A: kaiming_uniform_(a=sqrt(5)) over fan_in: 1/sqrt(in) */
            float bound = 1.0f / sqrtf((float)t->shape[1]);
            for (size_t j = 0; j < t->numel; j++) host[j] = bound * (2.0f * glm_rng_uniform(&rng) - 1.0f);
        } /* LoRA B: zero */
        int parts = m->cfg.peft.lora_qkv_parts;
        if (t->kind == T_QKV_LA && glm_lora_split(&m->cfg, 0) > 1 && parts) /* q, k or v without an adapter: its A */
            for (int k = 0; k < 3; k++) /* zero too, so its rows keep zero gradients and stay no adapter */
                if (!(parts >> k & 1)) memset(host + (size_t)k * (t->numel / 3), 0, t->numel / 3 * sizeof(float));
        m->be->upload_f32(m->be, glm_at(m->be, m->params, t->offset), host, t->numel);
        free(host);
    }
    if (m->cfg.peft.use_dora) glm_dora_init_magnitudes(m);
}

/* A quantized row stored as THUDM's pre-quantized folders hold it: `name` int8 [OC, C] (int4:
 * [OC, C/2], two per byte) and `name`_scale fp16 [OC]; copied as they are. */
static int load_prequantized(glm_model *m, glm_ckpt *c, const glm_tensor *t, void *dst, const char *src_name,
                             glm_err *err) {
    int64_t OC = t->shape[0], C = t->shape[1], shape[ST_MAX_DIMS];
    int stored = glm_ckpt_quantized_type(c, src_name, OC, C), nd;
    st_dtype dt;
    if (t->qtype == GLM_Q_NF4) {
        glm_fail(err, "%s: tensor %s is stored quantized (int8), but this run asks for NF4", c->path, src_name);
        return glm_hint(err, "NF4 quantizes a float16/bfloat16 base as it loads: give the float model, or drop --quantization_type nf4");
    }
    if (stored != GLM_Q_NONE && stored != t->qtype) {
        int fbits = glm_qtype_bits((glm_qtype)stored);
        glm_fail(err, "%s: tensor %s holds int%d weights but this run quantizes to int%d", c->path, src_name, fbits,
                 glm_qtype_bits((glm_qtype)t->qtype));
        return glm_hint(err, "use --quantization_bit %d (the folder's), or quantize the float16 model instead", fbits);
    }
    if (stored == GLM_Q_NONE) {
        glm_ckpt_info(c, src_name, &dt, &nd, shape);
        glm_fail(err, "%s: tensor %s has shape [%lld, %lld], a %s weight of [%lld, %lld] needs [%lld, %lld]", c->path, src_name,
                 (long long)shape[0], (long long)(nd == 2 ? shape[1] : 0), glm_qtype_name((glm_qtype)t->qtype), (long long)OC,
                 (long long)C, (long long)OC, (long long)(C * glm_qtype_bits((glm_qtype)t->qtype) / 8));
        return glm_hint(err, "the checkpoint does not match config.json (hidden_size? inner_hidden_size?)");
    }
    char scale[300];
    snprintf(scale, sizeof scale, "%s_scale", src_name);
    if (glm_ckpt_info(c, scale, &dt, &nd, shape) != 0 || nd != 1 || shape[0] != OC || dt != ST_F16) {
        glm_fail(err, "%s: tensor %s is quantized, but %s (float16 [%lld]) is missing or malformed", c->path, src_name,
                 scale, (long long)OC);
        return glm_hint(err, "a chatglm-6b-int4/int8 folder stores each quantized weight with its weight_scale");
    }
    size_t bytes = glm_qlayout_of((glm_qtype)t->qtype, (size_t)OC, (size_t)C).bytes;
    void *q = glm_malloc(bytes);
    int rc = glm_ckpt_read_quantized(c, src_name, t->qtype, OC, C, q, err);
    if (rc == 0) {
        m->be->upload(m->be, dst, q, bytes);
        m->qscratch_of = NULL;
    }
    free(q);
    return rc;
}

/* Host buffers of a load: p[] grown to the largest tensor read so far (the float paths), and
 * one part buffer of PART_BYTES for the stored bytes, page-locked where the backend has such
 * memory (so each part's copy runs at the link's speed) and touched once for the whole load
 * (fresh pages cost a fault each: a whole-tensor buffer would fault in a GB per model). */
enum { PART_BYTES = 64 << 20 };
typedef struct load_bufs {
    void *p[2];
    size_t cap[2];
    void *part;
    glm_backend *part_be;  /* the backend part came from (NULL: malloc) */
} load_bufs;
static void *part_buf(load_bufs *b, glm_backend *be) {
    if (!b->part) {
        b->part_be = be->host_alloc ? be : NULL;
        b->part = b->part_be ? be->host_alloc(be, PART_BYTES) : glm_malloc(PART_BYTES);
    }
    return b->part;
}
static void free_bufs(load_bufs *b) {
    free(b->p[0]);
    free(b->p[1]);
    if (b->part_be) { b->part_be->sync(b->part_be); b->part_be->host_free(b->part_be, b->part); }
    else free(b->part);
}
static void *buf_at_least(load_bufs *b, int i, size_t bytes) {
    if (bytes > b->cap[i]) {
        free(b->p[i]);
        b->p[i] = glm_malloc(bytes);
        b->cap[i] = bytes;
    }
    return b->p[i];
}

static int same_shape(int nd, const int64_t *shape, const glm_tensor *t) {
    if (nd != t->ndim) return 0;
    for (int i = 0; i < nd; i++) if (shape[i] != t->shape[i]) return 0;
    return 1;
}

/* The dtype a float tensor is stored as, in the backend's terms; -1 for others (F64, ints). */
static int backend_dtype(st_dtype d) { return d == ST_F32 ? GLM_F32 : d == ST_BF16 ? GLM_BF16 : d == ST_F16 ? GLM_F16 : -1; }

static int fail_nonfinite(glm_ckpt *c, const char *name, const char *what, size_t j, glm_err *err) {
    /* training from a NaN/inf weight only yields NaN */
    glm_fail(err, "%s: tensor %s holds %s at element %zu (%s checkpoint)", c->path, name, what, j, glm_ckpt_format(c));
    return glm_hint(err, "the weights are damaged or came from a diverged run: use another checkpoint");
}

/* Reads one tensor and uploads it to dst, tensor by tensor, so host memory stays at the largest
 * tensor (the embedding) instead of a copy of the whole model. A float tensor of the table's
 * shape goes up as its stored bytes and the backend converts it (no float copy on the host: a
 * 13 GB model loads at the speed the file is read); a quantized row is quantized on the way (or
 * copied from a pre-quantized checkpoint). */
static int load_one(glm_model *m, glm_ckpt *c, const glm_tensor *t, void *dst, const char *src_name, load_bufs *b,
                    glm_merge *g, glm_err *err) {
    st_dtype dt;
    int nd;
    int64_t shape[ST_MAX_DIMS];
    glm_ckpt_info(c, src_name, &dt, &nd, shape);
    int merge = glm_merge_changes(g, t);
    if (merge && dt == ST_I8) {
        glm_fail(err, "%s: tensor %s is stored quantized, so the adapters %s cannot be merged into it", c->path, src_name,
                 m->merged);
        return glm_hint(err, "merge them into the float model first (glmtrain merge --model_name_or_path FLOAT --adapter "
                             "%s --output_dir MERGED) and quantize that as it loads (--quantization_bit)", m->merged);
    }
    if (t->qtype && dt == ST_I8) return load_prequantized(m, c, t, dst, src_name, err);
    if (!t->qtype && dt == ST_I8) {
        glm_fail(err, "%s: tensor %s is stored quantized (int8) but this run does not quantize", c->path, src_name);
        return glm_hint(err, "say quantization_bit in the folder's config.json, or pass --quantization_bit 4|8");
    }
    int bdt = backend_dtype(dt);
    if (!merge && !t->qtype && bdt >= 0 && same_shape(nd, shape, t) && glm_ckpt_partwise(c, src_name)) {
        size_t es = st_dtype_size(dt), per = PART_BYTES / es;
        void *raw = part_buf(b, m->be);
        for (size_t e0 = 0; e0 < t->numel; e0 += per) {
            size_t k = t->numel - e0 < per ? t->numel - e0 : per;
            m->be->sync(m->be); /* the previous part's copy has left the buffer */
            if (glm_ckpt_read_raw_at(c, src_name, dt, raw, (uint64_t)e0 * es, k * es, err)) return -1;
            size_t j = st_first_nonfinite(dt, raw, k);
            if (j < k) {
                const uint16_t *h = raw;
                float v = dt == ST_F32 ? ((const float *)raw)[j] : dt == ST_F16 ? st_f16_to_f32(h[j]) : st_bf16_to_f32(h[j]);
                return fail_nonfinite(c, src_name, isnan(v) ? "NaN" : "inf", e0 + j, err);
            }
            m->be->upload_cast(m->be, glm_at(m->be, dst, e0), raw, (glm_dtype)bdt, k);
        }
        return 0;
    }
    float *buf = buf_at_least(b, 0, t->numel * sizeof(float));
    if (glm_ckpt_read_f32(c, src_name, buf, t->ndim, t->shape, err)) return -1;
    for (size_t j = 0; j < t->numel; j++)
        if (!isfinite(buf[j])) return fail_nonfinite(c, src_name, isnan(buf[j]) ? "NaN" : "inf", j, err);
    if (merge && glm_merge_apply(g, t->name, t, buf, err)) return -1;
    glm_model_row_upload(m, t, dst, buf);
    return 0;
}

/* The original checkpoint stores lm_head as a copy of word_embeddings. A tied model keeps one
 * copy; if the two differ in the file, it came from an untied model and dropping lm_head
 * changes the outputs, which deserves a warning rather than silence. Two copies stored alike
 * are compared as bytes; otherwise as floats. */
static int check_tied_copy(glm_ckpt *c, const char *wte, const char *head, const glm_tensor *te, load_bufs *b,
                           glm_err *err) {
    st_dtype da, dh;
    int na, nh;
    int64_t sa[ST_MAX_DIMS], sh[ST_MAX_DIMS];
    glm_ckpt_info(c, wte, &da, &na, sa);
    glm_ckpt_info(c, head, &dh, &nh, sh);
    if (da == dh && backend_dtype(da) >= 0 && same_shape(na, sa, te) && same_shape(nh, sh, te) &&
        glm_ckpt_partwise(c, wte) && glm_ckpt_partwise(c, head)) {
        size_t bytes = te->numel * st_dtype_size(da);
        char *x = glm_malloc(PART_BYTES), *y = glm_malloc(PART_BYTES);
        int same = 1, rc = 0;
        for (size_t off = 0; off < bytes && same && rc == 0; off += PART_BYTES) {
            size_t k = bytes - off < PART_BYTES ? bytes - off : PART_BYTES;
            rc = glm_ckpt_read_raw_at(c, wte, da, x, off, k, err) || glm_ckpt_read_raw_at(c, head, dh, y, off, k, err);
            same = rc == 0 && memcmp(x, y, k) == 0;
        }
        free(x);
        free(y);
        if (rc) return -1;
        if (same) return 0;
    }
    float *x = buf_at_least(b, 0, te->numel * sizeof(float)), *y = buf_at_least(b, 1, te->numel * sizeof(float));
    if (glm_ckpt_read_f32(c, wte, x, te->ndim, te->shape, err) || glm_ckpt_read_f32(c, head, y, te->ndim, te->shape, err))
        return -1;
    double md = 0;
    for (size_t j = 0; j < te->numel; j++) {
        double d = fabs((double)x[j] - y[j]);
        if (d > md || d != d) md = d;
    }
    if (md > 0)
        glm_warn("%s: lm_head.weight differs from word_embeddings (max |diff| %.3g) but config.json ties them; "
                 "using word_embeddings (set \"tie_word_embeddings\": false to use both)", c->path, md);
    return 0;
}

/* q, k and v's adapters of transformers' GLM layout (config.h glm_lora_split), however the file
 * holds them (glm_ckpt_read_qkv_lora): 1 when read and uploaded, 0 when the file has none, -1. */
static int load_qkv_lora(glm_model *m, glm_ckpt *c, const glm_tensor *t, void *dst, const char *src, load_bufs *b,
                         glm_err *err) {
    float *buf = buf_at_least(b, 0, t->numel * sizeof(float));
    int got = glm_ckpt_read_qkv_lora(c, src, t->kind == T_QKV_LB, &m->cfg, m->cfg.peft.lora_rank, t->shape[1], buf, err);
    if (got < 0) return glm_hint(err, "the adapter was made for another base model or another rank r (see its adapter_config.json)");
    for (size_t j = 0; got && j < t->numel; j++)
        if (!isfinite(buf[j])) return fail_nonfinite(c, src, isnan(buf[j]) ? "NaN" : "inf", j, err);
    if (got) glm_model_row_upload(m, t, dst, buf);
    return got;
}

/* Loads rows [r0, r1) of glm_model_row's order from path, each under prefix + its name: the
 * adapters only (`adapters`: with LoRA's modules_to_save, their whole rows too), or everything
 * but the adapters (the base, those whole rows' starting values included). */
static int load_rows(glm_model *m, const char *path, int r0, int r1, int adapters, const char *prefix, glm_merge *g,
                     glm_err *err) {
    glm_ckpt c;
    if (glm_ckpt_open(&c, path, err)) return -1;
    load_bufs bufs = {0};
    const char *head = m->fam->head, *wte = m->fam->embed;
    int has_head = glm_ckpt_info(&c, head, NULL, NULL, NULL) == 0;
    int rc = 0;
    char name[256];
    for (int i = r0; i < r1 && rc == 0; i++) {
        void *dst;
        const glm_tensor *t = glm_model_row(m, i, &dst);
        if (glm_is_vhead(t->kind)) continue; /* its own file: glm_model_load_value_head */
        int whole = glm_whole_row(&m->cfg.peft, t->kind);
        if (adapters ? !(is_adapter(t) || whole) : is_adapter(t)) continue;
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        const char *src = name;
        /* a tied model takes word_embeddings; a file holding only lm_head serves it too */
        if (t->kind == T_WORD_EMB && m->cfg.tie_word_embeddings && has_head && glm_ckpt_info(&c, wte, NULL, NULL, NULL))
            src = head;
        char alt[264]; /* DoRA's magnitude as a module's weight (.lora_magnitude_vector.weight), as some tools write it */
        if (glm_is_dora(t->kind) && glm_ckpt_info(&c, src, NULL, NULL, NULL) != 0) {
            snprintf(alt, sizeof alt, "%s.weight", name);
            if (glm_ckpt_info(&c, alt, NULL, NULL, NULL) == 0) src = alt;
        }
        if ((t->kind == T_QKV_LA || t->kind == T_QKV_LB) && glm_lora_split(&m->cfg, 0) > 1) {
            int got = load_qkv_lora(m, &c, t, dst, src, &bufs, err);
            if (got < 0) { rc = -1; break; }
            if (got) continue; /* else missing: said below */
        }
        if (glm_ckpt_info(&c, src, NULL, NULL, NULL) != 0) {
            rc = glm_fail(err, "%s: tensor %s is missing (%s checkpoint)", path, src, glm_ckpt_format(&c));
            if (t->kind == T_LM_HEAD)
                glm_hint(err, "the checkpoint has no separate lm_head; set \"tie_word_embeddings\": true in config.json");
            else if (is_adapter(t))
                glm_hint(err, "the adapter was made for other modules or layers (its adapter_config.json's target_modules)");
            else if (whole && adapters)
                glm_hint(err, "its adapter_config.json names the module in modules_to_save, so peft saved it whole");
            else
                glm_hint(err, "the checkpoint does not match config.json (num_layers? model family?)");
            break;
        }
        int nd;
        int64_t shape[ST_MAX_DIMS];
        glm_ckpt_info(&c, src, NULL, &nd, shape);
        int mismatch = nd != t->ndim || shape[0] != t->shape[0] || (nd > 1 && shape[1] != t->shape[1]);
        if ((is_adapter(t) || (whole && adapters)) && mismatch) {
            rc = glm_fail(err, "%s: tensor %s has shape [%lld, %lld], this model needs [%lld, %lld]", path, src,
                          (long long)shape[0], (long long)(nd > 1 ? shape[1] : 1), (long long)t->shape[0], (long long)t->shape[1]);
            if (t->kind == T_PREFIX_EMB) /* [P, 2LH] or [P, H]: the two P-Tuning settings */
                glm_hint(err, "the checkpoint has pre_seq_len %lld and prefix_projection %s, this run %d and %s: use the "
                              "checkpoint's (--pre_seq_len, --prefix_projection)", (long long)shape[0],
                         nd > 1 && shape[1] == m->cfg.hidden_size ? "true" : "false", m->cfg.peft.pre_seq_len,
                         m->cfg.peft.prefix_projection ? "true" : "false");
            else if (glm_is_prefix(t->kind))
                glm_hint(err, "the checkpoint's prefix_projection or model differs from this run's");
            else
                glm_hint(err, "the adapter was made for another base model or another rank r (see its adapter_config.json)");
            break;
        }
        rc = load_one(m, &c, t, dst, src, &bufs, g, err);
    }
    const glm_tensor *te = glm_model_find(m, wte, NULL);
    int te_row = 0;
    for (int i = r0; i < r1; i++) te_row |= glm_model_row(m, i, NULL) == te;
    if (rc == 0 && te && te_row && m->cfg.tie_word_embeddings && has_head && glm_ckpt_info(&c, wte, NULL, NULL, NULL) == 0)
        rc = check_tied_copy(&c, wte, head, te, &bufs, err);
    free_bufs(&bufs);
    glm_ckpt_close(&c);
    glm_dora_forget(m);
    return rc;
}

int glm_model_load(glm_model *m, const char *path, glm_err *err) {
    if (!m->origin[0]) snprintf(m->origin, sizeof m->origin, "%s", path); /* where its float weights can be read again */
    glm_merge *g = NULL; /* the adapters merged into the base as it loads (never into a checkpoint's rows) */
    if (m->merged[0] && glm_merge_open(&g, &m->cfg, m->merged, err)) return -1;
    int rc = load_rows(m, path, 0, glm_model_nrows(m), 0, "", g, err);
    glm_merge_close(g);
    return rc;
}

int glm_model_load_adapter_file(glm_model *m, const char *path, const char *prefix, glm_err *err) {
    return load_rows(m, path, 0, m->tab.n, 1, prefix, NULL, err);
}

static int load_trainable_rows(glm_model *m, const char *path, glm_err *err);
int glm_model_load_trainable(glm_model *m, const char *path, glm_err *err) {
    if (load_trainable_rows(m, path, err)) return -1;
    char dir[4096]; /* the value head lies in the folder, or beside a file given for the rows */
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!glm_is_dir(path)) { if (slash) *slash = 0; else snprintf(dir, sizeof dir, "."); }
    return glm_model_load_value_head(m, dir, 1, err) < 0 ? -1 : 0;
}

static int load_trainable_rows(glm_model *m, const char *path, glm_err *err) {
    /* LoRA: peft's files, or the rows under their own names where pipeline stages wrote them */
    if (m->cfg.peft.kind == GLM_FT_LORA && (!glm_is_dir(path) || glm_is_adapter_dir(path))) return glm_adapter_load(m, path, err);
    if (m->cfg.peft.kind == GLM_FT_LORA) return load_rows(m, path, 0, m->tab.n, 1, "", NULL, err);
    if (m->cfg.peft.kind == GLM_FT_PTUNING) return load_rows(m, path, 0, m->tab.n, 1, "", NULL, err);
    /* BAdam: every layer has moved, so the checkpoint holds them all (merged adapters included) */
    if (m->cfg.peft.badam) return load_rows(m, path, 0, glm_model_nrows(m), 0, "", NULL, err);
    return load_rows(m, path, 0, m->tab.n, 0, "", NULL, err);
}

/* The trainable rows downloaded into *host, as safetensors/torch entries under their names. */
static st_entry *trainable_entries(glm_model *m, float **host) {
    *host = glm_malloc((m->tab.total ? m->tab.total : 1) * sizeof(float));
    m->be->download_f32(m->be, *host, m->params, m->tab.total);
    st_entry *e = glm_calloc((size_t)m->tab.n + 1, sizeof *e);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        e[i] = (st_entry){.name = t->name, .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]}, .data = *host + t->offset,
                          .data_dtype = ST_F32, .file_dtype = ST_F32};
    }
    return e;
}

int glm_model_save_trainable_bin(glm_model *m, const char *path, glm_err *err) {
    float *host;
    st_entry *e = trainable_entries(m, &host);
    int rc = tbin_save(path, e, m->tab.n, err);
    free(e);
    free(host);
    return rc;
}

static int save_trainable_rows(glm_model *m, const char *dir, glm_err *err);
int glm_model_save_trainable(glm_model *m, const char *dir, glm_err *err) {
    return save_trainable_rows(m, dir, err) || glm_model_save_value_head(m, dir, err) ? -1 : 0;
}

static int save_trainable_rows(glm_model *m, const char *dir, glm_err *err) {
    if (m->cfg.peft.kind == GLM_FT_FULL) return glm_model_save(m, dir, ST_F32, 0, err);
    if (m->cfg.peft.badam) /* every row, as stored: the frozen ones have no other copy, and the
                            * trained layer's fp32 values are the optimizer's master copy */
        return glm_model_save(m, dir, m->be->dtype == GLM_BF16 ? ST_BF16 : m->be->dtype == GLM_F16 ? ST_F16 : ST_F32, 0, err);
    if (m->cfg.peft.kind == GLM_FT_LORA) return glm_adapter_save(m, dir, ST_F32, err);
    /* freeze and P-Tuning: the rows that train, under their own names (the base comes from the
     * base model): THUDM's ptuning checkpoints hold transformer.prefix_encoder.* the same way */
    float *host;
    st_entry *e = trainable_entries(m, &host);
    char path[4096];
    if (glm_mkdirs(dir, err)) { free(e); free(host); return -1; }
    glm_path_join(path, sizeof path, dir, "model.safetensors");
    int rc = st_save(path, e, m->tab.n, 0, err);
    free(e);
    free(host);
    if (rc == 0 && m->cfg.peft.kind == GLM_FT_PTUNING) { /* pre_seq_len and prefix_projection, as THUDM's checkpoints */
        char cfg[4096], folder[4096];
        glm_origin_paths(m->origin, cfg, folder, sizeof cfg);
        rc = glm_write_hf_config(&m->cfg, cfg[0] ? cfg : NULL, ST_F32, dir, err);
    }
    return rc;
}

/* ---- the value head (--stage rm): LLaMA-Factory's value_head.safetensors beside the model or adapter */

int glm_model_save_value_head(glm_model *m, const char *dir, glm_err *err) {
    if (!m->cfg.value_head) return 0;
    const glm_tensor *rows[2] = {glm_table_get(&m->tab, -1, T_VHEAD_W), glm_table_get(&m->tab, -1, T_VHEAD_B)};
    GLM_ASSERT(rows[0] && rows[1]);
    float *host = glm_malloc(sizeof(float) * (rows[0]->numel + 1));
    st_entry e[2];
    for (int i = 0; i < 2; i++) {
        const glm_tensor *t = rows[i];
        m->be->download_f32(m->be, host + (i ? rows[0]->numel : 0), glm_at(m->be, m->params, t->offset), t->numel);
        e[i] = (st_entry){.name = t->name, .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]},
                          .data = host + (i ? rows[0]->numel : 0), .data_dtype = ST_F32, .file_dtype = ST_F32};
    }
    char path[4096];
    glm_path_join(path, sizeof path, dir, GLM_VALUE_HEAD_FILE);
    int rc = glm_mkdirs(dir, err) || st_save(path, e, 2, 0, err) ? -1 : 0;
    free(host);
    return rc;
}

/* The file of dir's value head into path: 0, or 1 when dir holds none. */
static int value_head_path(const char *dir, char *path, size_t cap) {
    glm_path_join(path, cap, dir, GLM_VALUE_HEAD_FILE);
    if (!glm_is_file(path)) glm_path_join(path, cap, dir, "value_head.bin"); /* as LLaMA-Factory also reads it */
    return glm_is_file(path) ? 0 : 1;
}

int glm_value_head_read(const char *dir, int H, float **out, glm_err *err) {
    static const char *const names[2] = {GLM_VHEAD_W, GLM_VHEAD_B};
    char path[4096];
    *out = NULL;
    if (value_head_path(dir, path, sizeof path)) return 1;
    glm_ckpt c;
    if (glm_ckpt_open(&c, path, err)) return -1;
    float *host = glm_malloc(sizeof(float) * ((size_t)H + 1));
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) {
        int64_t want[2] = {1, i ? 1 : H}; /* [1, H] and [1] */
        int want_nd = i ? 1 : 2, nd;
        int64_t shape[ST_MAX_DIMS];
        if (glm_ckpt_info(&c, names[i], NULL, &nd, shape) != 0) {
            rc = glm_fail(err, "%s: tensor %s is missing", path, names[i]);
            glm_hint(err, "a value head file holds v_head.summary.weight [1, hidden] and v_head.summary.bias [1]");
            break;
        }
        if (nd != want_nd || shape[0] != want[0] || (nd > 1 && shape[1] != want[1])) {
            rc = glm_fail(err, "%s: tensor %s has shape [%lld, %lld], this model needs [%lld, %lld]", path, names[i],
                          (long long)shape[0], (long long)(nd > 1 ? shape[1] : 1), (long long)want[0],
                          (long long)want[1]);
            glm_hint(err, "the value head was trained on a model of another hidden size");
            break;
        }
        rc = glm_ckpt_read_f32(&c, names[i], host + (i ? H : 0), nd, shape, err);
    }
    glm_ckpt_close(&c);
    if (rc) { free(host); return -1; }
    *out = host;
    return 0;
}

int glm_model_load_value_head(glm_model *m, const char *dir, int required, glm_err *err) {
    if (!m->cfg.value_head) return 0;
    const glm_tensor *w = glm_table_get(&m->tab, -1, T_VHEAD_W), *b = glm_table_get(&m->tab, -1, T_VHEAD_B);
    GLM_ASSERT(w && b && w->numel == (size_t)m->cfg.hidden_size && b->numel == 1);
    float *host;
    int rc = glm_value_head_read(dir, m->cfg.hidden_size, &host, err);
    if (rc == 1 && required) {
        glm_fail(err, "%s holds no %s (the value head of a --stage rm run)", dir, GLM_VALUE_HEAD_FILE);
        return glm_hint(err, "resume from a checkpoint of the same --stage rm run");
    }
    if (rc) return rc;
    m->be->upload_f32(m->be, glm_at(m->be, m->params, w->offset), host, w->numel);
    m->be->upload_f32(m->be, glm_at(m->be, m->params, b->offset), host + w->numel, 1);
    free(host);
    return 0;
}

int glm_model_save(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err) {
    glm_export_opts o;
    glm_export_opts_init(&o);
    o.dtype = (st_dtype)file_dtype;
    o.max_shard_bytes = shard_bytes;
    o.original_layout = 0; /* only the parameters: what resume reads back */
    o.overwrite = 1;       /* the caller's own folder (a checkpoint, the run's output) */
    return glm_model_export(m, dir, &o, err);
}

static int save_final_rows(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err);
int glm_model_save_final(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err) {
    return save_final_rows(m, dir, file_dtype, shard_bytes, err) || glm_model_save_value_head(m, dir, err) ? -1 : 0;
}

static int save_final_rows(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err) {
    if (m->cfg.peft.kind == GLM_FT_LORA) return glm_adapter_save(m, dir, ST_F32, err); /* peft's files */
    char cfg[4096], folder[4096], bin[4096];
    glm_origin_paths(m->origin, cfg, folder, sizeof cfg);
    if (m->cfg.peft.kind == GLM_FT_PTUNING) { /* THUDM's ptuning output */
        glm_path_join(bin, sizeof bin, dir, "pytorch_model.bin");
        return glm_model_save_trainable(m, dir, err) || glm_model_save_trainable_bin(m, bin, err) ||
                       glm_write_hf_config(&m->cfg, cfg[0] ? cfg : NULL, (st_dtype)file_dtype, dir, err) ||
                       (folder[0] && glm_copy_source_files(folder, dir, err))
                   ? -1 : 0;
    }
    /* full and freeze: the whole model, laid out as the original download (the tied head's copy,
     * the rotary buffers), so every loader of chatglm-6b folders reads it */
    glm_export_opts o;
    glm_export_opts_init(&o);
    o.dtype = (st_dtype)file_dtype;
    o.overwrite = 1;
    o.max_shard_bytes = shard_bytes;
    return glm_model_export(m, dir, &o, err);
}
