/* Parameter initialisation and Hugging Face safetensors I/O, driven by the tensor table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/glm.h"

void glm_model_init_random(glm_model *m, uint64_t seed, float std) {
    float *host = glm_calloc(m->tab.total, sizeof(float));
    glm_rng rng;
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        float *p = host + t->offset;
        /* one stream per tensor, so a tensor's values do not depend on which others exist */
        glm_rng_seed(&rng, seed * 1000003ULL + (uint64_t)i);
        int is_ln_w = t->kind == T_LN1_W || t->kind == T_LN2_W || t->kind == T_LNF_W;
        for (size_t j = 0; j < t->numel; j++)
            p[j] = t->ndim == 2 ? std * glm_rng_normal(&rng) : (is_ln_w ? 1.0f : 0.0f);
    }
    glm_model_set_params(m, host);
    free(host);
}

int glm_model_load(glm_model *m, const char *path, glm_err *err) {
    st_reader *r;
    if (st_open(&r, path, err) != 0) return -1;
    float *host = glm_calloc(m->tab.total, sizeof(float));
    int rc = 0;
    for (int i = 0; i < m->tab.n && rc == 0; i++) {
        const glm_tensor *t = &m->tab.t[i];
        if (st_info(r, t->name, NULL, NULL, NULL) != 0) {
            rc = glm_fail(err, "%s: tensor %s is missing", path, t->name);
            if (t->kind == T_LM_HEAD) glm_hint(err, "the checkpoint has no separate lm_head; set \"tie_word_embeddings\": true in config.json");
            else glm_hint(err, "the checkpoint does not match config.json (num_layers? model family?)");
            break;
        }
        rc = st_read_f32(r, t->name, host + t->offset, t->ndim, t->shape, err);
    }
    st_close(r);
    if (rc == 0) glm_model_set_params(m, host);
    free(host);
    return rc;
}

int glm_model_save(glm_model *m, const char *dir, int file_dtype, size_t shard_bytes, glm_err *err) {
    if (glm_mkdirs(dir, err) != 0) return -1;
    float *host = glm_malloc(m->tab.total * sizeof(float));
    glm_model_get_params(m, host);
    st_entry *e = glm_calloc(m->tab.n, sizeof *e);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        e[i] = (st_entry){.name = t->name, .ndim = t->ndim, .data = host + t->offset,
                          .data_dtype = ST_F32, .file_dtype = (st_dtype)file_dtype};
        e[i].shape[0] = t->shape[0];
        e[i].shape[1] = t->shape[1];
    }
    char path[4096];
    int rc;
    if (shard_bytes == 0) {
        glm_path_join(path, sizeof path, dir, "model.safetensors");
        rc = st_save(path, e, m->tab.n, 0, err);
    } else {
        rc = st_save(dir, e, m->tab.n, shard_bytes, err);
    }
    free(e);
    free(host);
    if (rc != 0) return -1;
    char *cfg = glm_config_to_json(&m->cfg);
    glm_path_join(path, sizeof path, dir, "config.json");
    rc = glm_write_file_atomic(path, cfg, strlen(cfg), err);
    free(cfg);
    return rc;
}
