#define _XOPEN_SOURCE 700
#include "ckpt/checkpoint.h"
#include <cJSON.h>
#include <math.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/ckpt.h"
#include "optim/galore.h"

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) { return remove(p); }
int glm_remove_tree(const char *path) { return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

int glm_copy_tokenizer_files(const char *tok, const char *dir, glm_err *err) {
    if (!glm_is_dir(tok)) {
        char dst[4096];
        const char *base = strrchr(tok, '/');
        glm_path_join(dst, sizeof dst, dir, base ? base + 1 : tok);
        return glm_copy_file(tok, dst, err);
    }
    return glm_copy_source_files(tok, dir, err); /* with tokenization_chatglm.py, which its auto_map names */
}

/* Optimizer state as named fp32 tensors, so it survives layout changes of the flat buffer and
 * any number of ranks can read it back (each its own slice). o covers [0, tab.total). */
static int save_optimizer(const char *path, glm_model *m, const glm_opt_state *o, glm_err *err) {
    int kinds = o->master ? 3 : 2;
    const float *src[] = {o->m, o->v, o->master};
    st_entry *e = glm_calloc((size_t)m->tab.n * kinds + 1, sizeof *e);
    char (*names)[128] = glm_calloc((size_t)m->tab.n * kinds, 128);
    const char *prefix[] = {"exp_avg/", "exp_avg_sq/", "master/"};
    int ne = 0;
    for (int k = 0; k < kinds; k++)
        for (int i = 0; i < m->tab.n; i++) {
            const glm_tensor *t = &m->tab.t[i];
            if (k < 2 && o->galore && t->galore) continue; /* its moments are projected: optimizer_galore.safetensors */
            snprintf(names[ne], 128, "%s%s", prefix[k], t->name);
            e[ne] = (st_entry){.name = names[ne], .ndim = t->ndim, .data = src[k] + t->offset,
                               .data_dtype = ST_F32, .file_dtype = ST_F32};
            e[ne].shape[0] = t->shape[0]; e[ne].shape[1] = t->shape[1];
            ne++;
        }
    int rc = st_save(path, e, ne, 0, err);
    free(e); free(names);
    return rc;
}

/* Copies the part of tensor t inside each of o's pieces from src (the whole tensor) into dst,
 * where the pieces lie one after another. */
static void copy_into_pieces(const glm_tensor *t, const glm_span *sp, int ns, const float *src, float *dst) {
    size_t off = 0;
    for (int j = 0; j < ns; off += sp[j].n, j++) {
        size_t a = t->offset > sp[j].lo ? t->offset : sp[j].lo;
        size_t e = t->offset + t->numel < sp[j].lo + sp[j].n ? t->offset + t->numel : sp[j].lo + sp[j].n;
        if (a < e) memcpy(dst + off + (a - sp[j].lo), src + (a - t->offset), (e - a) * sizeof(float));
    }
}

/* Fills o's pieces (elements outside every tensor stay zero). A tensor that lies wholly inside
 * one piece is read in place; one cut by piece edges is read once into a scratch copy. */
static int load_optimizer(const char *path, glm_model *m, glm_opt_state *o, glm_err *err) {
    st_reader *r;
    if (st_open(&r, path, err)) return -1;
    glm_span one = {o->lo, o->hi - o->lo};
    const glm_span *sp = o->nspan ? o->span : &one;
    int ns = o->nspan ? o->nspan : 1;
    size_t n = 0;
    for (int j = 0; j < ns; j++) n += sp[j].n;
    const char *prefix[] = {"exp_avg/", "exp_avg_sq/", "master/"};
    float *dst[] = {o->m, o->v, o->master};
    float *scratch = NULL;
    size_t scratch_n = 0;
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++) {
        if (!dst[k]) continue;
        memset(dst[k], 0, n * sizeof(float));
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix[k], m->tab.t[0].name);
        int from_weights = k == 2 && st_info(r, name, NULL, NULL, NULL) != 0; /* saved by an fp32 run: master = weights */
        for (int i = 0; i < m->tab.n && rc == 0; i++) {
            const glm_tensor *t = &m->tab.t[i];
            if (k < 2 && o->galore && t->galore) continue; /* GaLore's own file (glm_galore_load) */
            int cut = 0, inside = -1;
            size_t off = 0, at = 0;
            for (int j = 0; j < ns; off += sp[j].n, j++) {
                if (t->offset >= sp[j].lo + sp[j].n || t->offset + t->numel <= sp[j].lo) continue;
                if (t->offset >= sp[j].lo && t->offset + t->numel <= sp[j].lo + sp[j].n) { inside = j; at = off + (t->offset - sp[j].lo); }
                else cut = 1;
            }
            if (inside < 0 && !cut) continue;
            snprintf(name, sizeof name, "%s%s", prefix[k], t->name);
            if (inside >= 0 && !from_weights) { rc = st_read_f32(r, name, dst[k] + at, t->ndim, t->shape, err); continue; }
            if (scratch_n < t->numel) { free(scratch); scratch_n = t->numel; scratch = glm_malloc(scratch_n * sizeof(float)); }
            if (from_weights) m->be->download_f32(m->be, scratch, glm_at(m->be, m->params, t->offset), t->numel);
            else rc = st_read_f32(r, name, scratch, t->ndim, t->shape, err);
            if (rc == 0) copy_into_pieces(t, sp, ns, scratch, dst[k]);
        }
    }
    free(scratch);
    st_close(r);
    return rc;
}

/* The 8-bit moments as stored (glm_opt_state's q8 fields). */
int glm_checkpoint_save_8bit(const char *path, const glm_opt_state *o, glm_err *err) {
    int64_t n = (int64_t)o->q8_n, nb = (int64_t)((o->q8_n + GLM_ADAM8_BLOCK - 1) / GLM_ADAM8_BLOCK);
    int64_t layout[3] = {o->q8_ranks > 1 ? o->q8_ranks : 1, n / (o->q8_ranks > 1 ? o->q8_ranks : 1), (int64_t)o->q8_table};
    st_entry e[5] = {
        {.name = "exp_avg.codes", .ndim = 1, .shape = {n}, .data = o->qm, .data_dtype = ST_U8, .file_dtype = ST_U8},
        {.name = "exp_avg.absmax", .ndim = 1, .shape = {nb}, .data = o->am, .data_dtype = ST_F32, .file_dtype = ST_F32},
        {.name = "exp_avg_sq.codes", .ndim = 1, .shape = {n}, .data = o->qv, .data_dtype = ST_U8, .file_dtype = ST_U8},
        {.name = "exp_avg_sq.absmax", .ndim = 1, .shape = {nb}, .data = o->av, .data_dtype = ST_F32, .file_dtype = ST_F32},
        /* ranks, state elements per rank (blocks are cut over each rank's own index space), and
         * the table's fingerprint */
        {.name = "layout", .ndim = 1, .shape = {3}, .data = layout, .data_dtype = ST_I64, .file_dtype = ST_I64},
    };
    return st_save(path, e, 5, 0, err);
}

int glm_checkpoint_load_8bit(const char *dir, const char *file, glm_opt_state *o, glm_err *err) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, file ? file : "optimizer_8bit.safetensors");
    if (!o->q8_n || !glm_is_file(path)) return 0;
    st_reader *r;
    if (st_open(&r, path, err)) return -1;
    int64_t shape[ST_MAX_DIMS];
    int ndim, rc = 0;
    size_t nb = (o->q8_n + GLM_ADAM8_BLOCK - 1) / GLM_ADAM8_BLOCK;
    /* ranks, elements per rank, the table's fingerprint (files of earlier versions: the first two) */
    int64_t layout[3] = {1, (int64_t)o->q8_n, 0}, want = o->q8_ranks > 1 ? o->q8_ranks : 1;
    int64_t ln = 0;
    if (st_info(r, "layout", NULL, &ndim, shape) == 0) {
        ln = ndim == 1 && shape[0] >= 2 && shape[0] <= 3 ? shape[0] : 0;
        if (!ln || st_read_raw(r, "layout", ST_I64, layout, (size_t)ln * sizeof(int64_t), err)) {
            st_close(r);
            return ln ? -1 : glm_fail(err, "%s: its layout entry is not 2 or 3 numbers", path);
        }
    }
    int same_table = ln < 3 || !layout[2] || !o->q8_table || (uint64_t)layout[2] == o->q8_table;
    if (same_table && layout[0] == want && (size_t)(layout[0] * layout[1]) == o->q8_n &&
        st_info(r, "exp_avg.codes", NULL, &ndim, shape) == 0 && ndim == 1 && (size_t)shape[0] == o->q8_n) {
        rc = st_read_raw(r, "exp_avg.codes", ST_U8, o->qm, o->q8_n, err) ||
             st_read_raw(r, "exp_avg_sq.codes", ST_U8, o->qv, o->q8_n, err) ||
             st_read_raw(r, "exp_avg.absmax", ST_F32, o->am, nb * 4, err) ||
             st_read_raw(r, "exp_avg_sq.absmax", ST_F32, o->av, nb * 4, err) ? -1 : 1;
    } else {
        glm_info("%s: 8-bit moments of another layout; starting from their fp32 values", path);
    }
    st_close(r);
    return rc;
}

static int save_state(const char *path, const glm_train_state *st, long opt_step, glm_err *err) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "optimizer_step", (double)opt_step);
    cJSON_AddNumberToObject(o, "global_step", (double)st->global_step);
    cJSON_AddNumberToObject(o, "epoch", (double)st->epoch);
    cJSON_AddNumberToObject(o, "data_cursor", (double)st->cursor);
    cJSON_AddNumberToObject(o, "loss_scale", st->loss_scale);
    cJSON_AddNumberToObject(o, "good_steps", (double)st->good_steps);
    cJSON_AddNumberToObject(o, "skipped_steps", (double)st->skipped_steps);
    if (st->scale_hysteresis > 0) cJSON_AddNumberToObject(o, "loss_scale_hysteresis", (double)st->scale_hysteresis);
    cJSON_AddNumberToObject(o, "tokens_seen", st->tokens_seen);
    if (st->run_id[0]) cJSON_AddStringToObject(o, "run_id", st->run_id);
    if (st->world_size > 0) cJSON_AddNumberToObject(o, "world_size", (double)st->world_size);
    if (st->data_rows >= 0) cJSON_AddNumberToObject(o, "data_rows_consumed", (double)st->data_rows);
    char hex[24];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)st->data_hash);
    if (st->data_hash) cJSON_AddStringToObject(o, "data_hash", hex); /* a string: JSON numbers lose 64-bit values */
    if (st->best_checkpoint[0]) {
        cJSON_AddNumberToObject(o, "best_metric", st->best_metric);
        cJSON_AddStringToObject(o, "best_model_checkpoint", st->best_checkpoint);
    } else {
        cJSON_AddNullToObject(o, "best_metric");
        cJSON_AddNullToObject(o, "best_model_checkpoint");
    }
    if (st->has_plateau) { /* what torch's ReduceLROnPlateau.state_dict() keeps (scheduler.pt in a Trainer checkpoint) */
        cJSON *p = cJSON_AddObjectToObject(o, "lr_scheduler");
        cJSON_AddStringToObject(p, "type", "reduce_lr_on_plateau");
        cJSON_AddNumberToObject(p, "lr", st->plateau.lr);
        if (isfinite(st->plateau.best)) cJSON_AddNumberToObject(p, "best", st->plateau.best);
        else cJSON_AddNullToObject(p, "best"); /* none yet: mode_worse */
        cJSON_AddNumberToObject(p, "num_bad_epochs", (double)st->plateau.num_bad);
        cJSON_AddNumberToObject(p, "cooldown_counter", (double)st->plateau.cooldown_left);
    }
    if (st->early_stop_patience > 0) { /* as transformers' TrainerState writes stateful_callbacks */
        cJSON *es = cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "stateful_callbacks"), "EarlyStoppingCallback");
        cJSON *args = cJSON_AddObjectToObject(es, "args");
        cJSON_AddNumberToObject(args, "early_stopping_patience", (double)st->early_stop_patience);
        cJSON_AddNumberToObject(args, "early_stopping_threshold", st->early_stop_threshold);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(es, "attributes"), "early_stopping_patience_counter", (double)st->early_stop_count);
    }
    if (st->model_only) cJSON_AddTrueToObject(o, "save_only_model");
    cJSON *hist = st->log_history ? cJSON_Parse(st->log_history) : NULL;
    cJSON_AddItemToObject(o, "log_history", hist ? hist : cJSON_CreateArray());
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    int rc = glm_write_file_atomic(path, s, strlen(s), err);
    free(s);
    return rc;
}

static int load_state(const char *path, glm_train_state *st, long *opt_step, glm_err *err) {
    char *text = glm_read_file(path, NULL, err);
    if (!text) return -1;
    cJSON *o = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(o)) { cJSON_Delete(o); return glm_fail(err, "%s: not a JSON object", path); }
    const char *keys[] = {"global_step", "epoch", "data_cursor", "optimizer_step"};
    for (int i = 0; i < 4; i++)
        if (!cJSON_IsNumber(cJSON_GetObjectItem(o, keys[i]))) {
            cJSON_Delete(o);
            return glm_fail(err, "%s: field %s is missing or not a number", path, keys[i]);
        }
    st->global_step = (long)cJSON_GetObjectItem(o, "global_step")->valuedouble;
    st->epoch = (long)cJSON_GetObjectItem(o, "epoch")->valuedouble;
    st->cursor = (long)cJSON_GetObjectItem(o, "data_cursor")->valuedouble;
    *opt_step = (long)cJSON_GetObjectItem(o, "optimizer_step")->valuedouble;
    cJSON *v;
    if ((v = cJSON_GetObjectItem(o, "loss_scale")) && cJSON_IsNumber(v)) st->loss_scale = v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "good_steps")) && cJSON_IsNumber(v)) st->good_steps = (long)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "skipped_steps")) && cJSON_IsNumber(v)) st->skipped_steps = (long)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "loss_scale_hysteresis")) && cJSON_IsNumber(v)) st->scale_hysteresis = (long)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "tokens_seen")) && cJSON_IsNumber(v)) st->tokens_seen = v->valuedouble;
    /* an earlier glmtrain's checkpoint has none: the run keeps the fresh id it drew */
    st->world_size = (v = cJSON_GetObjectItem(o, "world_size")) && cJSON_IsNumber(v) ? (long)v->valuedouble : 0;
    st->data_rows = (v = cJSON_GetObjectItem(o, "data_rows_consumed")) && cJSON_IsNumber(v) ? (long)v->valuedouble : -1;
    st->data_hash = (v = cJSON_GetObjectItem(o, "data_hash")) && cJSON_IsString(v) ? strtoull(v->valuestring, NULL, 16) : 0;
    if ((v = cJSON_GetObjectItem(o, "run_id")) && cJSON_IsString(v)) snprintf(st->run_id, sizeof st->run_id, "%s", v->valuestring);
    st->best_checkpoint[0] = 0;
    cJSON *bm = cJSON_GetObjectItem(o, "best_metric"), *bc = cJSON_GetObjectItem(o, "best_model_checkpoint");
    if (cJSON_IsNumber(bm) && cJSON_IsString(bc)) {
        st->best_metric = bm->valuedouble;
        snprintf(st->best_checkpoint, sizeof st->best_checkpoint, "%s", bc->valuestring);
    }
    free(st->log_history);
    st->log_history = NULL;
    if ((v = cJSON_GetObjectItem(o, "log_history")) && cJSON_IsArray(v)) st->log_history = cJSON_PrintUnformatted(v);
    v = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "stateful_callbacks"), "EarlyStoppingCallback"),
                                                "attributes"), "early_stopping_patience_counter");
    st->early_stop_count = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e9 ? (long)v->valuedouble : 0;
    cJSON *ps = cJSON_GetObjectItem(o, "lr_scheduler");
    const cJSON *plr = cJSON_GetObjectItem(ps, "lr"), *pb = cJSON_GetObjectItem(ps, "best"),
                *pn = cJSON_GetObjectItem(ps, "num_bad_epochs"), *pc = cJSON_GetObjectItem(ps, "cooldown_counter");
    st->has_plateau = cJSON_IsNumber(plr) && plr->valuedouble >= 0 && cJSON_IsNumber(pn) && pn->valuedouble >= 0 &&
                      pn->valuedouble < 1e9 && cJSON_IsNumber(pc) && pc->valuedouble >= 0 && pc->valuedouble < 1e9;
    if (st->has_plateau) /* a best of null is none yet: the caller's mode decides its starting value */
        st->plateau = (glm_lr_plateau){.lr = plr->valuedouble, .best = cJSON_IsNumber(pb) ? pb->valuedouble : NAN,
                                       .num_bad = (long)pn->valuedouble, .cooldown_left = (long)pc->valuedouble};
    cJSON_Delete(o);
    return 0;
}

int glm_checkpoint_begin(const char *output_dir, long step, char *tmp, size_t n, glm_err *err) {
    snprintf(tmp, n, "%s/tmp-checkpoint-%ld", output_dir, step);
    if (glm_is_dir(tmp)) glm_remove_tree(tmp); /* a killed save's */
    if (access(tmp, F_OK) == 0) /* not ours to remove: something else is at that path */
        return glm_fail(err, "%s exists and is not a folder (move it out of the way)", tmp);
    return glm_mkdirs(tmp, err);
}

int glm_checkpoint_complete(const char *output_dir, const char *tmp, const glm_train_state *st, long opt_step, glm_err *err) {
    char fin[4096], path[4096];
    snprintf(fin, sizeof fin, "%s/checkpoint-%ld", output_dir, st->global_step);
    glm_path_join(path, sizeof path, tmp, "trainer_state.json");
    int rc = save_state(path, st, opt_step, err);
    if (!rc) rc = glm_checkpoint_seal(tmp, err); /* the manifest is the last file */
    if (!rc && glm_is_dir(fin)) glm_remove_tree(fin);
    if (!rc && rename(tmp, fin) != 0) rc = glm_fail(err, "cannot rename %s to %s: %s", tmp, fin, strerror(errno));
    return rc;
}

int glm_checkpoint_is_model_only(const char *dir) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "trainer_state.json");
    glm_err e;
    char *text = glm_is_file(path) ? glm_read_file(path, NULL, &e) : NULL;
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    int yes = cJSON_IsTrue(cJSON_GetObjectItem(o, "save_only_model"));
    cJSON_Delete(o);
    return yes;
}

int glm_checkpoint_save_state(const char *output_dir, glm_model *m, const glm_opt_state *o, const glm_train_state *st,
                              const char *tokenizer_path, const char *args_json, glm_err *err) {
    char tmp[4096], path[4096];
    size_t text = (args_json ? strlen(args_json) : 0) + (st->log_history ? 2 * strlen(st->log_history) : 0) + 4096;
    double need = glm_checkpoint_bytes(&m->cfg, o->master ? 3 : 2, tokenizer_path, text);
    if (glm_checkpoint_begin(output_dir, st->global_step, tmp, sizeof tmp, err)) {
        glm_wrap(err, "saving checkpoint %s/checkpoint-%ld: ", output_dir, st->global_step);
        return glm_checkpoint_abandon(output_dir, NULL, need, err);
    }
    int rc = glm_model_save_trainable(m, tmp, err);
    if (!rc) { glm_path_join(path, sizeof path, tmp, "optimizer.safetensors"); rc = save_optimizer(path, m, o, err); }
    if (!rc && o->q8_n) { glm_path_join(path, sizeof path, tmp, "optimizer_8bit.safetensors"); rc = glm_checkpoint_save_8bit(path, o, err); }
    if (!rc && o->galore) { glm_path_join(path, sizeof path, tmp, GLM_GALORE_FILE); rc = glm_galore_save(o->galore, m, path, err); }
    if (!rc && tokenizer_path) rc = glm_copy_tokenizer_files(tokenizer_path, tmp, err);
    if (!rc && args_json) { glm_path_join(path, sizeof path, tmp, "training_args.json"); rc = glm_write_file_atomic(path, args_json, strlen(args_json), err); }
    if (!rc) rc = glm_checkpoint_complete(output_dir, tmp, st, o->step, err);
    if (!rc) return 0;
    glm_wrap(err, "saving checkpoint %s/checkpoint-%ld: ", output_dir, st->global_step);
    return glm_checkpoint_abandon(output_dir, tmp, need, err);
}

void glm_opt_state_alloc_q8(glm_opt_state *o, size_t n, int ranks, const glm_table *tab) {
    size_t nb = (n + GLM_ADAM8_BLOCK - 1) / GLM_ADAM8_BLOCK;
    o->q8_n = n;
    o->q8_ranks = ranks;
    o->q8_table = glm_table_fingerprint(tab);
    o->qm = glm_malloc(n + 1);
    o->qv = glm_malloc(n + 1);
    o->am = glm_malloc(nb * sizeof(float) + 4);
    o->av = glm_malloc(nb * sizeof(float) + 4);
}

void glm_opt_state_free_q8(glm_opt_state *o) {
    free(o->qm); free(o->qv); free(o->am); free(o->av);
    o->qm = o->qv = NULL;
    o->am = o->av = NULL;
    o->q8_n = 0;
}

int glm_checkpoint_save(const char *output_dir, glm_model *m, const glm_adamw *opt, const glm_train_state *st,
                        const char *tokenizer_path, const char *args_json, glm_err *err) {
    glm_backend *be = m->be;
    size_t total = m->tab.total;
    int kinds = opt->master ? 3 : 2;
    float *host = glm_malloc(sizeof(float) * total * kinds);
    glm_adamw_get(opt, be, 0, total, host, host + total, opt->master ? host + 2 * total : NULL);
    glm_opt_state o = {.lo = 0, .hi = total, .m = host, .v = host + total, .master = opt->master ? host + 2 * total : NULL,
                       .step = opt->step, .galore = opt->galore};
    if (opt->kind == GLM_OPTIM_ADAMW8) {
        glm_opt_state_alloc_q8(&o, opt->n, 1, &m->tab);
        glm_adamw_get_q8(opt, be, 0, opt->n, o.qm, o.qv, o.am, o.av);
    }
    int rc = glm_checkpoint_save_state(output_dir, m, &o, st, tokenizer_path, args_json, err);
    glm_opt_state_free_q8(&o);
    free(host);
    return rc;
}

int glm_checkpoint_load_state(const char *dir, glm_model *m, glm_opt_state *o, glm_train_state *st, glm_err *err) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "trainer_state.json");
    if (!glm_is_file(path)) {
        glm_fail(err, "%s is not a complete checkpoint (no trainer_state.json)", dir);
        return glm_hint(err, "pass a checkpoint-N folder of a previous run, or --resume_from_checkpoint alone for the newest");
    }
    glm_path_join(path, sizeof path, dir, GLM_GALORE_FILE);
    int has_galore = glm_is_file(path);
    if (has_galore != (o->galore != NULL)) {
        glm_fail(err, "%s was saved %s GaLore's projected optimizer state, and this run has %s", dir,
                 has_galore ? "with" : "without", o->galore ? "it (--use_galore)" : "none");
        return glm_hint(err, "resume with the flags of the run that wrote it (%s --use_galore), or start a new run "
                             "from its weights (--model_name_or_path %s)", has_galore ? "with" : "without", dir);
    }
    if (glm_model_load_trainable(m, dir, err)) return glm_wrap(err, "resuming from %s: ", dir);
    if (o->galore && glm_galore_load(o->galore, m, path, err)) return glm_wrap(err, "resuming from %s: ", dir);
    glm_path_join(path, sizeof path, dir, "optimizer.safetensors");
    /* pipeline stages write shards and an index (parallel/pipe/pipe_ckpt.h) */
    if (!glm_is_file(path)) glm_path_join(path, sizeof path, dir, "optimizer.safetensors.index.json");
    if (load_optimizer(path, m, o, err)) return glm_wrap(err, "resuming from %s: ", dir);
    glm_path_join(path, sizeof path, dir, "trainer_state.json");
    return load_state(path, st, &o->step, err);
}

int glm_checkpoint_load(const char *dir, glm_model *m, glm_adamw *opt, glm_train_state *st, glm_err *err) {
    return glm_checkpoint_load_as(dir, m, opt, NULL, st, err);
}

int glm_checkpoint_load_as(const char *dir, glm_model *m, glm_adamw *opt, const char *q8_file, glm_train_state *st,
                           glm_err *err) {
    glm_backend *be = m->be;
    size_t total = m->tab.total;
    float *host = glm_malloc(sizeof(float) * total * 3);
    glm_opt_state o = {.lo = 0, .hi = total, .m = host, .v = host + total, .master = opt->master ? host + 2 * total : NULL,
                       .galore = opt->galore};
    int rc = glm_checkpoint_load_state(dir, m, &o, st, err);
    if (rc == 0) {
        glm_adamw_put(opt, be, 0, total, o.m, o.v, o.master);
        opt->step = o.step;
    }
    if (rc == 0 && opt->kind == GLM_OPTIM_ADAMW8) {
        glm_opt_state_alloc_q8(&o, opt->n, 1, &m->tab);
        int got = glm_checkpoint_load_8bit(dir, q8_file, &o, err);
        if (got < 0) rc = -1;
        if (got > 0) glm_adamw_put_q8(opt, be, 0, opt->n, o.qm, o.qv, o.am, o.av);
        glm_opt_state_free_q8(&o);
    }
    free(host);
    return rc;
}

/* Lists complete checkpoints (of run run_id when not NULL): steps[] sorted ascending. */
static int list_checkpoints(const char *output_dir, const char *run_id, long **steps) {
    DIR *d = opendir(output_dir);
    *steps = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%ld%c", &s, &tail) != 1) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s/trainer_state.json", output_dir, e->d_name);
        if (!glm_is_file(path)) continue;
        if (run_id) {
            char id[64];
            snprintf(path, sizeof path, "%s/%s", output_dir, e->d_name);
            glm_checkpoint_run_id(path, id, sizeof id);
            if (strcmp(id, run_id) != 0) continue;
        }
        if (n == cap) { cap = cap ? 2 * cap : 8; *steps = glm_realloc(*steps, sizeof(long) * cap); }
        (*steps)[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) { long t = (*steps)[j]; (*steps)[j] = (*steps)[j - 1]; (*steps)[j - 1] = t; }
    return n;
}

int glm_checkpoint_list(const char *output_dir, long **steps) { return list_checkpoints(output_dir, NULL, steps); }

int glm_checkpoint_latest(const char *output_dir, char *out, size_t n) {
    long *steps;
    int k = list_checkpoints(output_dir, NULL, &steps);
    if (k > 0) snprintf(out, n, "%s/checkpoint-%ld", output_dir, steps[k - 1]);
    free(steps);
    return k > 0 ? 0 : -1;
}

int glm_checkpoint_rotate_keep(const char *output_dir, int limit, const char *run_id, long keep_step, glm_err *err) {
    if (limit <= 0) return 0;
    long *steps;
    int k = list_checkpoints(output_dir, run_id && run_id[0] ? run_id : NULL, &steps);
    int kept = 0;
    for (int i = 0; i < k; i++) kept += steps[i] == keep_step;
    if (kept && limit == 1 && steps[k - 1] != keep_step) limit = 2; /* the best and the newest */
    /* the best moves to the newest end of the order, so the oldest others go first */
    int others = k - kept, drop = k - limit;
    for (int i = 0; i < k && drop > 0 && others > 0; i++) {
        if (steps[i] == keep_step) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/checkpoint-%ld", output_dir, steps[i]);
        if (glm_remove_tree(path) != 0) { free(steps); return glm_fail(err, "cannot delete old checkpoint %s", path); }
        drop--;
        others--;
    }
    free(steps);
    return 0;
}

int glm_checkpoint_rotate(const char *output_dir, int limit, const char *run_id, glm_err *err) {
    return glm_checkpoint_rotate_keep(output_dir, limit, run_id, 0, err);
}

