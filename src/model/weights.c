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
#include "model/ckpt.h"
#include "model/glm.h"

void glm_model_init_random(glm_model *m, uint64_t seed, float std) {
    float *host = glm_calloc(m->tab.total, sizeof(float));
    glm_rng rng;
    /* one stream per tensor, numbered by its row in the whole model's table, so a pipeline
     * stage (a part of the table) gets the same values as the whole model */
    glm_table full;
    glm_table_build(&full, &m->cfg);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        float *p = host + t->offset;
        glm_rng_seed(&rng, seed * 1000003ULL + (uint64_t)(glm_table_find(&full, t->name) - full.t));
        int is_ln_w = t->kind == T_LN1_W || t->kind == T_LN2_W || t->kind == T_LNF_W;
        for (size_t j = 0; j < t->numel; j++)
            p[j] = t->ndim == 2 ? std * glm_rng_normal(&rng) : (is_ln_w ? 1.0f : 0.0f);
    }
    glm_table_free(&full);
    glm_model_set_params(m, host);
    free(host);
}

/* Reads one table tensor into buf and uploads it: tensor by tensor, so host memory stays at
 * the largest tensor (the embedding) instead of a float copy of the whole model. */
static int load_one(glm_model *m, glm_ckpt *c, const glm_tensor *t, const char *src_name, float *buf, glm_err *err) {
    if (glm_ckpt_read_f32(c, src_name, buf, t->ndim, t->shape, err)) return -1;
    /* training from a NaN/inf weight only yields NaN; a pass over what was just read is cheap */
    for (size_t j = 0; j < t->numel; j++)
        if (!isfinite(buf[j])) {
            glm_fail(err, "%s: tensor %s holds %s at element %zu (%s checkpoint)", c->path, src_name,
                     isnan(buf[j]) ? "NaN" : "inf", j, glm_ckpt_format(c));
            return glm_hint(err, "the weights are damaged or came from a diverged run: use another checkpoint");
        }
    m->be->upload_f32(m->be, glm_at(m->be, m->params, t->offset), buf, t->numel);
    return 0;
}

int glm_model_load(glm_model *m, const char *path, glm_err *err) {
    glm_ckpt c;
    if (glm_ckpt_open(&c, path, err)) return -1;
    size_t cap = 0;
    for (int i = 0; i < m->tab.n; i++) cap = m->tab.t[i].numel > cap ? m->tab.t[i].numel : cap;
    float *buf = glm_malloc(cap * sizeof(float));
    const char *head = "lm_head.weight", *wte = "transformer.word_embeddings.weight";
    int has_head = glm_ckpt_info(&c, head, NULL, NULL, NULL) == 0;
    int rc = 0;
    for (int i = 0; i < m->tab.n && rc == 0; i++) {
        const glm_tensor *t = &m->tab.t[i];
        const char *src = t->name;
        /* a tied model takes word_embeddings; a file holding only lm_head serves it too */
        if (t->kind == T_WORD_EMB && m->cfg.tie_word_embeddings && has_head && glm_ckpt_info(&c, wte, NULL, NULL, NULL))
            src = head;
        if (glm_ckpt_info(&c, src, NULL, NULL, NULL) != 0) {
            rc = glm_fail(err, "%s: tensor %s is missing (%s checkpoint)", path, t->name, glm_ckpt_format(&c));
            if (t->kind == T_LM_HEAD)
                glm_hint(err, "the checkpoint has no separate lm_head; set \"tie_word_embeddings\": true in config.json");
            else
                glm_hint(err, "the checkpoint does not match config.json (num_layers? model family?)");
            break;
        }
        rc = load_one(m, &c, t, src, buf, err);
    }
    /* The original checkpoint stores lm_head as a copy of word_embeddings. A tied model keeps
     * one copy; if the two differ, the file came from an untied model and dropping lm_head
     * changes the outputs, which deserves a warning rather than silence. */
    const glm_tensor *te = glm_table_get(&m->tab, -1, T_WORD_EMB);
    if (rc == 0 && te && m->cfg.tie_word_embeddings && has_head && glm_ckpt_info(&c, wte, NULL, NULL, NULL) == 0) {
        float *emb = glm_malloc(te->numel * sizeof(float));
        m->be->download_f32(m->be, emb, m->w.wte, te->numel);
        rc = glm_ckpt_read_f32(&c, head, buf, te->ndim, te->shape, err);
        double md = 0;
        for (size_t j = 0; rc == 0 && j < te->numel; j++) {
            double d = fabs((double)buf[j] - emb[j]);
            if (d > md || d != d) md = d;
        }
        if (rc == 0 && md > 0)
            glm_warn("%s: lm_head.weight differs from word_embeddings (max |diff| %.3g) but config.json ties them; "
                     "using word_embeddings (set \"tie_word_embeddings\": false to use both)", path, md);
        free(emb);
    }
    free(buf);
    glm_ckpt_close(&c);
    return rc;
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
