#include "parallel/pipe/pipe_ckpt.h"
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/adapter.h"
#include "model/hf_layout.h"
#include "model/ckpt.h"

static void shard_name(char *out, size_t n, const char *kind, int k, int P) {
    snprintf(out, n, "%s-%05d-of-%05d.safetensors", kind, k + 1, P);
}

void glm_pipe_q8_file(char *out, size_t n, int k, int P) { shard_name(out, n, "optimizer_8bit", k, P); }

/* The tensors stage k writes (its table without the copies a later stage holds: the tied
 * embedding, the prefix encoder). */
static int stage_writes(const glm_config *c, const glm_stage *s, const glm_tensor *t) {
    return !glm_stage_row_is_copy(s->embed, t->kind);
}

/* The final model of a freeze run is the whole model: its frozen rows go into the shards too. */
static int final_with_frozen(const glm_model *m) { return m->cfg.peft.kind == GLM_FT_FREEZE; }

int glm_pipe_save_stage(glm_pipe *p, const char *dir, int file_dtype, const glm_opt_state *o, glm_err *err) {
    glm_model *m = p->m;
    float *host = glm_malloc(m->tab.total * sizeof(float));
    glm_model_get_params(m, host);
    int kinds = o ? (o->master ? 3 : 2) : 0, frozen = !o && final_with_frozen(m) ? m->ftab.n : 0;
    float *fhost = frozen ? glm_malloc(m->ftab.total * sizeof(float)) : NULL;
    if (frozen) m->be->download_f32(m->be, fhost, m->fparams, m->ftab.total);
    const char *prefix[] = {"exp_avg/", "exp_avg_sq/", "master/"};
    const float *src[] = {o ? o->m : NULL, o ? o->v : NULL, o ? o->master : NULL};
    /* the final model of transformers' GLM layout under its names (model/hf_layout.h); checkpoints
     * keep the table's names, which resume reads */
    int hf = !o && m->cfg.hf_layout;
    st_entry *e = glm_calloc((size_t)(m->tab.n + frozen) * 3 + (size_t)m->tab.n * kinds + 1, sizeof *e);
    char (*names)[128] = glm_calloc((size_t)m->tab.n * (kinds + 1) + 1, 128);
    char (*hfn)[GLM_HF_NAME] = hf ? glm_calloc((size_t)(m->tab.n + frozen) * 3, GLM_HF_NAME) : NULL;
    int nw = 0, no = 0;
    for (int pass = 0; pass < 2; pass++) /* the trainable rows, then a freeze model's frozen ones */
        for (int i = 0; i < (pass ? frozen : m->tab.n); i++) {
            const glm_tensor *t = pass ? &m->ftab.t[i] : &m->tab.t[i];
            const float *base = (pass ? fhost : host) + t->offset;
            if (!glm_pipe_owns_tensor(p, t)) continue;
            int64_t row0[3] = {0}, rows[3] = {t->shape[0]}, cols = t->ndim == 2 ? t->shape[1] : 1;
            int parts = hf ? glm_hf_row_parts(&m->cfg, t, t->name, &hfn[nw], row0, rows) : 1;
            for (int k = 0; k < parts; k++) {
                e[nw + k] = (st_entry){.name = hf ? hfn[nw + k] : t->name, .ndim = t->ndim, .data = base + row0[k] * cols,
                                       .data_dtype = ST_F32, .file_dtype = (st_dtype)file_dtype, .shape = {rows[k], t->shape[1]}};
            }
            nw += parts;
        }
    st_entry *eo = e + nw;
    for (int k = 0; k < kinds; k++)
        for (int i = 0; i < m->tab.n; i++) {
            const glm_tensor *t = &m->tab.t[i];
            if (!glm_pipe_owns_tensor(p, t)) continue;
            snprintf(names[no], 128, "%s%s", prefix[k], t->name);
            eo[no] = (st_entry){.name = names[no], .ndim = t->ndim, .data = src[k] + t->offset, .data_dtype = ST_F32,
                                .file_dtype = ST_F32, .shape = {t->shape[0], t->shape[1]}};
            no++;
        }
    char file[64], path[4096];
    shard_name(file, sizeof file, "model", p->stage, p->P);
    glm_path_join(path, sizeof path, dir, file);
    int rc = st_save(path, e, nw, 0, err);
    if (rc == 0 && o) {
        shard_name(file, sizeof file, "optimizer", p->stage, p->P);
        glm_path_join(path, sizeof path, dir, file);
        rc = st_save(path, eo, no, 0, err);
    }
    if (rc == 0 && o && o->q8_n) { /* the codes as stored: this layout resumes from them exactly */
        glm_pipe_q8_file(file, sizeof file, p->stage, p->P);
        glm_path_join(path, sizeof path, dir, file);
        rc = glm_checkpoint_save_8bit(path, o, err);
    }
    free(e);
    free(names);
    free(hfn);
    free(host);
    free(fhost);
    return rc ? glm_wrap(err, "stage %d: ", p->stage) : 0;
}

/* {"metadata": {"total_size": bytes}, "weight_map": {name: shard}} over every stage's tables;
 * hf: the final model of transformers' GLM layout, under its names as glm_pipe_save_stage wrote them. */
static int write_index(const glm_device_map *map, const glm_config *c, const char *dir, int opt_kinds, int file_dtype,
                       glm_part part, int hf, glm_err *err) {
    int with_opt = opt_kinds > 0;
    const char *prefix[] = {"", "exp_avg/", "exp_avg_sq/", "master/"};
    cJSON *o = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(o, "metadata"), *wm = cJSON_AddObjectToObject(o, "weight_map");
    double total = 0;
    char file[64], name[160];
    for (int k = 0; k < map->n; k++) {
        const glm_stage *s = &map->s[k];
        glm_table tab;
        glm_table_build_part(&tab, c, s->l0, s->l1, s->embed, s->head, 64, part);
        shard_name(file, sizeof file, with_opt ? "optimizer" : "model", k, map->n);
        for (int v = with_opt ? 1 : 0; v < (with_opt ? 1 + opt_kinds : 1); v++)
            for (int i = 0; i < tab.n; i++) {
                const glm_tensor *t = &tab.t[i];
                if (!stage_writes(c, s, t)) continue;
                char hfn[3][GLM_HF_NAME];
                int64_t row0[3], rows[3], cols = t->ndim == 2 ? t->shape[1] : 1;
                int parts = hf ? glm_hf_row_parts(c, t, t->name, hfn, row0, rows) : 0;
                for (int k = 0; k < parts; k++) { /* the final model of transformers' layout: its names */
                    cJSON_AddStringToObject(wm, hfn[k], file);
                    total += (double)(rows[k] * cols) * st_dtype_size((st_dtype)file_dtype);
                }
                if (parts) continue;
                snprintf(name, sizeof name, "%s%s", prefix[v], t->name);
                cJSON_AddStringToObject(wm, name, file);
                total += (double)t->numel * (with_opt ? 4 : st_dtype_size((st_dtype)file_dtype));
            }
        glm_table_free(&tab);
    }
    cJSON_AddNumberToObject(meta, "total_size", total);
    char *text = cJSON_Print(o), path[4096];
    cJSON_Delete(o);
    glm_path_join(path, sizeof path, dir, with_opt ? "optimizer.safetensors.index.json" : "model.safetensors.index.json");
    int rc = glm_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

int glm_pipe_save_index(const glm_device_map *map, const glm_model *m, const char *dir, int file_dtype, int opt_kinds,
                        glm_err *err) {
    const glm_config *c = &m->cfg;
    /* a checkpoint's shards hold the trainable rows; a final freeze model every base row */
    glm_part part = !opt_kinds && final_with_frozen(m) ? GLM_PART_BASE : GLM_PART_TRAINABLE;
    if (write_index(map, c, dir, 0, file_dtype, part, !opt_kinds && c->hf_layout, err)) return -1;
    /* master/ entries only when the shards hold them: a reader decides by asking for one */
    if (opt_kinds && write_index(map, c, dir, opt_kinds, file_dtype, GLM_PART_TRAINABLE, 0, err)) return -1;
    char cfg[4096], folder[4096];
    glm_origin_paths(m->origin, cfg, folder, sizeof cfg);
    if (glm_write_hf_config(c, cfg[0] ? cfg : NULL, (st_dtype)file_dtype, dir, err)) return -1;
    return folder[0] ? glm_copy_source_files(folder, dir, err) : 0;
}

/* A barrier that also tells every rank whether any rank failed. */
static int agree(glm_pipe *p, int local_failed, const char *what, glm_err *err) {
    double f = local_failed;
    double keep = p->world->timeout;
    if (p->world->timeout > 0 && p->world->timeout < 3600) p->world->timeout = 3600; /* rank 0 may be writing */
    int rc = p->world->sum_host(p->world, &f, 1, -1, what, err);
    p->world->timeout = keep;
    if (rc) return -1;
    if (f > 0 && !local_failed) return glm_fail(err, "rank %d: another rank failed while %s (see its log)", p->world->rank, what);
    return local_failed ? -1 : 0;
}

static int write_text(const char *dir, const char *name, const char *text, glm_err *err) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, name);
    return glm_write_file_atomic(path, text, strlen(text), err);
}

/* Every stage writes its shards into rank 0's tmp-checkpoint-N; rank 0 adds the rest, seals
 * the folder (ckpt/checkpoint.h) and renames it. When any rank fails, rank 0 removes the tmp
 * folder, so nothing of a failed save is left for a later run to trip on. */
int glm_pipe_checkpoint_save(glm_pipe *p, const char *output_dir, const glm_opt_state *o, const glm_train_state *st,
                             const char *tokenizer_path, const char *args_json, glm_err *err) {
    char tmp[4096], fin[4096];
    snprintf(tmp, sizeof tmp, "%s/tmp-checkpoint-%ld", output_dir, st->global_step); /* every stage writes into it */
    snprintf(fin, sizeof fin, "%s/checkpoint-%ld", output_dir, st->global_step);
    int rank0 = p->world->rank == 0, bad = 0, made = 0;
    size_t text = (args_json ? strlen(args_json) : 0) + (st->log_history ? 2 * strlen(st->log_history) : 0) + 4096;
    double need = rank0 ? glm_checkpoint_bytes(&p->m->cfg, o && o->master ? 3 : 2, tokenizer_path, text) : 0;
    if (rank0) {
        bad = glm_checkpoint_begin(output_dir, st->global_step, tmp, sizeof tmp, err) != 0;
        made = !bad;
    }
    if (agree(p, bad, "creating the checkpoint folder", err)) goto fail;
    if (p->replica == 0 && !o) bad = glm_fail(err, "rank %d: no optimizer state to save", p->world->rank) != 0;
    else if (p->replica == 0) bad = glm_pipe_save_stage(p, tmp, ST_F32, o, err) != 0;
    if (agree(p, bad, "writing the checkpoint shards", err)) goto fail;
    if (rank0) {
        int rc = glm_pipe_save_index(&p->map, p->m, tmp, ST_F32, o->master ? 3 : 2, err);
        if (!rc && tokenizer_path) rc = glm_copy_tokenizer_files(tokenizer_path, tmp, err);
        if (!rc && args_json) rc = write_text(tmp, "training_args.json", args_json, err);
        if (!rc) rc = glm_checkpoint_complete(output_dir, tmp, st, o->step, err);
        bad = rc != 0;
    }
    if (agree(p, bad, "completing the checkpoint", err) == 0) return 0;
fail:
    if (rank0) {
        if (strncmp(err->msg, "saving checkpoint", 17) != 0) glm_wrap(err, "saving checkpoint %s: ", fin);
        glm_checkpoint_abandon(output_dir, made ? tmp : NULL, need, err);
    }
    return -1;
}

/* LoRA: the stages' adapter rows (each stage's shard) in one peft adapter_model.safetensors with
 * peft's names, and adapter_config.json; the shards are removed. Rank 0 only. */
static int gather_adapter(glm_pipe *p, const char *dir, int file_dtype, glm_err *err) {
    st_entry *e = NULL;
    float **data = NULL;
    char (*names)[192] = NULL;
    int n = 0, cap = 0, rc = 0;
    char file[64], path[4096];
    for (int k = 0; k < p->P && !rc; k++) {
        shard_name(file, sizeof file, "model", k, p->P);
        glm_path_join(path, sizeof path, dir, file);
        st_reader *r;
        if ((rc = st_open(&r, path, err))) break;
        for (int i = 0; i < st_count(r) && !rc; i++) {
            int nd;
            int64_t sh[ST_MAX_DIMS];
            const char *nm = st_name(r, i);
            st_info(r, nm, NULL, &nd, sh);
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                e = glm_realloc(e, sizeof *e * cap);
                data = glm_realloc(data, sizeof *data * cap);
                names = glm_realloc(names, sizeof *names * cap);
            }
            size_t numel = (size_t)sh[0] * (nd > 1 ? (size_t)sh[1] : 1);
            data[n] = glm_malloc(numel * sizeof(float));
            snprintf(names[n], sizeof names[n], "%s%s", GLM_ADAPTER_PREFIX, nm);
            rc = st_read_f32(r, nm, data[n], nd, sh, err);
            e[n] = (st_entry){.name = names[n], .ndim = nd, .shape = {sh[0], nd > 1 ? sh[1] : 1}, .data = data[n],
                              .data_dtype = ST_F32, .file_dtype = (st_dtype)file_dtype};
            n++;
        }
        st_close(r);
    }
    if (!rc) {
        glm_path_join(path, sizeof path, dir, "adapter_model.safetensors");
        rc = st_save(path, e, n, 0, err);
    }
    if (!rc) rc = glm_adapter_write_config(p->m, dir, err);
    for (int k = 0; k < p->P && !rc; k++) { /* the shards are in the adapter file now */
        shard_name(file, sizeof file, "model", k, p->P);
        glm_path_join(path, sizeof path, dir, file);
        remove(path);
    }
    for (int i = 0; i < n; i++) free(data[i]);
    free(data);
    free(e);
    free(names);
    return rc;
}

int glm_pipe_save_final(glm_pipe *p, const char *output_dir, int file_dtype, const char *tokenizer_path,
                        const char *args_json, glm_err *err) {
    int bad = p->replica == 0 && glm_pipe_save_stage(p, output_dir, file_dtype, NULL, err) != 0;
    if (agree(p, bad, "writing the model shards", err)) return -1;
    if (p->world->rank == 0) {
        int lora = p->m->cfg.peft.kind == GLM_FT_LORA, ptuning = p->m->cfg.peft.kind == GLM_FT_PTUNING;
        int rc = 0;
        if (ptuning) { /* stage 0 holds the whole prefix encoder: THUDM's ptuning layout as one process writes it */
            for (int k = 0; k < p->P; k++) {
                char file[64], path[4096];
                shard_name(file, sizeof file, "model", k, p->P);
                glm_path_join(path, sizeof path, output_dir, file);
                remove(path);
            }
            rc = glm_model_save_final(p->m, output_dir, file_dtype, 0, err);
        } else {
            rc = lora ? gather_adapter(p, output_dir, file_dtype, err)
                      : glm_pipe_save_index(&p->map, p->m, output_dir, file_dtype, 0, err);
        }
        if (!rc && tokenizer_path) rc = glm_copy_tokenizer_files(tokenizer_path, output_dir, err);
        if (!rc && args_json) rc = write_text(output_dir, "training_args.json", args_json, err);
        bad = rc != 0;
    }
    return agree(p, bad, "completing the final model", err);
}
