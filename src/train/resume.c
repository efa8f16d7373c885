/* Resuming a run (trainer.h trainer_resume): which checkpoint (the newest of this run that
 * verifies, or the one named), every rank's agreement on it, the state it restores, and a
 * warning for settings that changed since it was written. */
#include "train/trainer.h"

static int resume_latest(const char *r) { return strcmp(r, "latest") == 0 || strcmp(r, "true") == 0 || strcmp(r, "True") == 0; }

/* Whether checkpoint dir belongs to a run other than output_dir's current one (run_id.txt);
 * checkpoints and folders of an earlier glmtrain have no ids and belong to any run. */
static int foreign(const char *output_dir, const char *dir, char *why, size_t n) {
    char run[64], id[64];
    glm_output_run_id(output_dir, run, sizeof run);
    glm_checkpoint_run_id(dir, id, sizeof id);
    if (!run[0] || !id[0] || strcmp(run, id) == 0) return 0;
    snprintf(why, n, "it belongs to run %s, not to run %s that last started in %s", id, run, output_dir);
    return 1;
}

/* The newest checkpoint of output_dir other than `except` that is this folder's run's,
 * verifies and holds the optimizer state, or -1. With `say`, each one skipped is logged with its
 * reason (and named in skipped[], or in model_only[] when saved with --save_only_model). */
static long newest_intact(const char *output_dir, const char *except, int say, char *skipped, char *model_only, size_t cap) {
    long *steps, found = -1;
    int k = glm_checkpoint_list(output_dir, &steps);
    for (int i = k - 1; i >= 0 && found < 0; i--) {
        char dir[4096], why[1200];
        snprintf(dir, sizeof dir, "%s/checkpoint-%ld", output_dir, steps[i]);
        if (except && strcmp(dir, except) == 0) continue;
        int mine = !foreign(output_dir, dir, why, sizeof why);
        if (mine && glm_checkpoint_is_model_only(dir)) {
            if (say) glm_info("not resuming from %s: it was saved with --save_only_model (no optimizer state)", dir);
            size_t u = strlen(model_only);
            snprintf(model_only + u, cap - u, "%scheckpoint-%ld", u ? ", " : "", steps[i]);
            continue;
        }
        int v = mine ? glm_checkpoint_verify(dir, why, sizeof why) : -1;
        if (v >= 0) found = steps[i];
        if (v > 0 && say) glm_info("%s: %s", dir, why);
        if (v < 0 && say) {
            glm_warn("not resuming from %s: %s", dir, why);
            size_t u = strlen(skipped);
            snprintf(skipped + u, cap - u, "%scheckpoint-%ld", u ? ", " : "", steps[i]);
        }
    }
    free(steps);
    return found;
}

/* How to go on from a --save_only_model checkpoint's weights (this run's kind names the flag). */
static int from_weights_hint(const trainer *t, const char *dir, glm_err *err) {
    static const char *const flag[] = {"--model_name_or_path", "--adapter_name_or_path", "--ptuning_checkpoint",
                                       "--model_name_or_path"};
    int kind = t->m.cfg.peft.kind;
    return glm_hint(err, "to train on from its weights, start a new run with %s %s%s (the optimizer state and the "
                         "learning-rate schedule start afresh); keep --save_only_model false where a run must resume exactly",
                    flag[kind], dir, kind == GLM_FT_LORA || kind == GLM_FT_PTUNING ? " beside --model_name_or_path of its base model" : "");
}

/* The lead's choice of checkpoint (into dir): --resume_from_checkpoint alone takes the newest
 * one that verifies; a named one must verify, else the error names the damaged file and the
 * newest intact sibling. */
static int pick_checkpoint(trainer *t, char *dir, size_t n, glm_err *err) {
    glm_train_args *a = t->a;
    const char *r = a->resume_from_checkpoint;
    char why[1200], skipped[1024] = "", model_only[1024] = "";
    if (resume_latest(r)) {
        long s = newest_intact(a->output_dir, NULL, 1, skipped, model_only, sizeof skipped);
        if (s >= 0) { snprintf(dir, n, "%s/checkpoint-%ld", a->output_dir, s); return 0; }
        if (model_only[0]) {
            glm_fail(err, "--resume_from_checkpoint: the checkpoints of this run in %s (%s) were saved with --save_only_model "
                          "true: they hold the model but not the optimizer's state, so no run resumes from them", a->output_dir,
                     model_only);
            snprintf(dir, n, "%s/%.*s", a->output_dir, (int)strcspn(model_only, ","), model_only); /* the newest, named first */
            return from_weights_hint(t, dir, err);
        }
        if (skipped[0]) {
            glm_fail(err, "--resume_from_checkpoint: no checkpoint of this run in %s is intact (skipped: %s)", a->output_dir, skipped);
            return glm_hint(err, "the warnings above say why each was skipped; start over with --overwrite_output_dir");
        }
        glm_fail(err, "--resume_from_checkpoint: no complete checkpoint-N folder in %s", a->output_dir);
        return glm_hint(err, "check --output_dir, or start without --resume_from_checkpoint");
    }
    snprintf(dir, n, "%s", r);
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') dir[--len] = 0;
    int v = glm_checkpoint_verify(dir, why, sizeof why);
    if (v > 0) glm_info("%s: %s", dir, why);
    if (v >= 0 && glm_checkpoint_is_model_only(dir)) {
        glm_fail(err, "--resume_from_checkpoint %s: it was saved with --save_only_model true and holds the model but not the "
                      "optimizer's state, so no run resumes from it", dir);
        return from_weights_hint(t, dir, err);
    }
    if (v >= 0) return 0;
    glm_fail(err, "--resume_from_checkpoint %s: %s", dir, why);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) *slash = 0; else snprintf(parent, sizeof parent, ".");
    long s = newest_intact(parent, dir, 0, skipped, model_only, sizeof skipped);
    if (s >= 0) return glm_hint(err, "%s/checkpoint-%ld is intact: resume from it (--resume_from_checkpoint alone takes the newest intact one)", parent, s);
    return glm_hint(err, "no other checkpoint beside it is intact; start over with --overwrite_output_dir");
}

/* The lead verifies (one read of the checkpoint, not one per rank) and every rank learns its
 * choice: the step, from which the others name the folder. */
static int agree_checkpoint(trainer *t, char *dir, size_t n, glm_err *err) {
    glm_train_args *a = t->a;
    int me = lead(t), bad = me && pick_checkpoint(t, dir, n, err) != 0;
    long s = -1;
    const char *tail = strrchr(dir, '/');
    if (me && !bad && tail) sscanf(tail, "/checkpoint-%ld", &s);
    double v[2] = {me && !bad, me ? (double)s : 0};
    glm_err e2;
    const char *what = "checkpoint chosen by rank 0";
    glm_par p = {t->dp, t->pp};
    if (glm_par_sum(&p, v, 2, 1, what, bad ? &e2 : err)) return -1;
    if (bad) return -1;
    if (v[0] == 0) return glm_fail(err, "cannot resume: rank 0 found no intact checkpoint (see its error)");
    if (!me && resume_latest(a->resume_from_checkpoint)) snprintf(dir, n, "%s/checkpoint-%ld", a->output_dir, (long)v[1]);
    else if (!me) snprintf(dir, n, "%s", a->resume_from_checkpoint);
    return 0;
}

/* Warns (lead only) about settings that differ from the checkpoint's training_args.json and,
 * for a checkpoint of an earlier glmtrain that did not record the rows consumed, about a
 * different number of data-parallel ranks (its cursor counts micro-batches per rank, so part
 * of the epoch is trained twice or skipped). */
static int warn_changes(trainer *t, const char *dir, long saved_world, glm_err *err) {
    int strict = strcmp(t->a->resume_mismatch, "error") == 0;
    if (lead(t) && saved_world > 0 && saved_world != t->dp->world && t->st.cursor > 0) /* at an epoch's start nothing is off */
        glm_warn("%s was written by %ld data-parallel ranks and resumes on %d: the data position (batch %ld of the epoch) "
                 "is not re-mapped, so examples of this epoch may be trained twice or skipped",
                 dir, saved_world, t->dp->world, t->st.cursor);
    char path[4096], diff[1024] = "";
    glm_path_join(path, sizeof path, dir, "training_args.json");
    glm_err e;
    char *text = glm_is_file(path) ? glm_read_file(path, NULL, &e) : NULL;
    cJSON *old = text ? cJSON_Parse(text) : NULL, *now = cJSON_Parse(t->args_json), *v;
    free(text);
    cJSON_ArrayForEach(v, now) {
        if (!strcmp(v->string, "resume_from_checkpoint") || !strcmp(v->string, "overwrite_output_dir") ||
            !strcmp(v->string, "output_dir")) /* a moved folder is the same run */
            continue;
        cJSON *o = cJSON_GetObjectItem(old, v->string);
        if (!old || (o && cJSON_Compare(o, v, 1))) continue;
        char *a = o ? cJSON_PrintUnformatted(o) : NULL, *b = cJSON_PrintUnformatted(v);
        size_t u = strlen(diff);
        snprintf(diff + u, sizeof diff - u, "%s--%s %s -> %s", u ? ", " : "", v->string, a ? a : "(unset)", b);
        free(a); free(b);
    }
    if (t->st.data_hash && t->st.data_hash != t->data_hash) {
        size_t u = strlen(diff);
        snprintf(diff + u, sizeof diff - u, "%sthe training data as tokenized (the file, the tokenizer or the data flags)", u ? ", " : "");
    }
    cJSON_Delete(old);
    cJSON_Delete(now);
    if (!diff[0]) return 0;
    if (strict) { /* every rank sees the same files and flags, so every rank stops here */
        glm_fail(err, "--resume_mismatch error: resuming %s with settings that differ from its checkpoint: %s", dir, diff);
        return glm_hint(err, "resume with the checkpoint's settings, start over with --overwrite_output_dir, or --resume_mismatch warn");
    }
    if (lead(t)) glm_warn("resuming %s with settings that differ from its training_args.json: %s", dir, diff);
    return 0;
}

/* What a peft setting trains, in words ("a LoRA adapter (r 8 on query_key_value,dense)"). */
static void describe(const glm_config *c, const glm_peft *p, char *s, size_t n) {
    if (p->kind == GLM_FT_LORA) {
        char mods[96];
        char whole[96];
        snprintf(s, n, "a %s adapter (r %d on %s%s%s)", p->pissa ? "PiSSA" : "LoRA", p->lora_rank,
                 glm_lora_targets_str(p->lora_targets, mods, sizeof mods), p->extra_modules ? "; whole " : "",
                 p->extra_modules ? glm_modules_str(c, p->extra_modules, 1, whole, sizeof whole) : "");
    } else if (p->kind == GLM_FT_PTUNING) {
        snprintf(s, n, "a P-Tuning v2 prefix (pre_seq_len %d, prefix_projection %s)", p->pre_seq_len, p->prefix_projection ? "true" : "false");
    } else if (p->kind == GLM_FT_FREEZE && p->badam) {
        snprintf(s, n, "every layer in turn (BAdam)");
    } else if (p->kind == GLM_FT_FREEZE) {
        char what[320];
        snprintf(s, n, "%s (freeze fine-tuning)", glm_freeze_describe(c, p, what, sizeof what));
    } else {
        snprintf(s, n, "model weights (full fine-tuning)");
    }
}

/* What the checkpoint folder holds decides what it can resume: a LoRA adapter of its r and
 * modules, a P-Tuning prefix of its length and projection, or model weights. Another kind or
 * shape is refused here, naming both, before anything is loaded (a load would fail on a
 * missing file or a shape instead, and say less). */
static int check_kind(trainer *t, const char *dir, glm_err *err) {
    const glm_peft *now = &t->m.cfg.peft;
    glm_peft was = {.kind = GLM_FT_FULL};
    char path[4096];
    glm_path_join(path, sizeof path, dir, "training_args.json");
    glm_train_args old;
    glm_args_defaults(glm_train_flags, glm_train_nflags, &old);
    char *argv[] = {"--config", path};
    glm_err e;
    /* the writer's own flags say what it trained (pipeline stages' checkpoints hold LoRA rows
     * without adapter_config.json); a checkpoint of an earlier glmtrain, by what the folder holds */
    int known = glm_is_file(path) && glm_args_parse(glm_train_flags, glm_train_nflags, &old, 2, argv, &e) == 0 &&
                glm_train_peft(&old, &t->m.cfg, &was, &e) == 0;
    char merged_was[4096], merged_now[4096], from[4096];
    glm_train_adapters(&old, merged_was, sizeof merged_was, from, sizeof from);
    glm_train_adapters(t->a, merged_now, sizeof merged_now, from, sizeof from);
    glm_train_args_free(&old);
    if (known && strcmp(merged_was, merged_now)) { /* its weights are relative to another base */
        glm_fail(err, "%s was trained on the base with %s merged into it; this run merges %s", dir,
                 merged_was[0] ? merged_was : "no adapter", merged_now[0] ? merged_now : "none");
        return glm_hint(err, "resume with the checkpoint's --adapter_name_or_path and --create_new_adapter (its "
                             "training_args.json)");
    }
    if (!known && glm_is_adapter_dir(dir)) {
        if (glm_adapter_read_config(dir, &was, err)) return -1;
    } else if (!known) {
        glm_peft p;
        was = (glm_peft){.kind = GLM_FT_FULL};
        if (glm_adapter_read_config(dir, &p, &e) == 0 && p.kind == GLM_FT_PTUNING) was = p;
    }
    int same = was.kind == now->kind &&
               (was.kind == GLM_FT_LORA      ? now->lora_rank == was.lora_rank && now->lora_targets == was.lora_targets &&
                                                   now->lora_layers == was.lora_layers &&
                                                   now->extra_modules == was.extra_modules && !now->pissa == !was.pissa
                : was.kind == GLM_FT_PTUNING ? now->pre_seq_len == was.pre_seq_len && !now->prefix_projection == !was.prefix_projection
                : was.kind == GLM_FT_FREEZE  ? !now->badam == !was.badam && now->llama_pro == was.llama_pro &&
                                                   now->num_layer_trainable == was.num_layer_trainable &&
                                                   now->freeze_modules == was.freeze_modules && now->extra_modules == was.extra_modules
                                             : 1);
    if (!known && was.kind == GLM_FT_FULL) same |= now->kind == GLM_FT_FREEZE; /* weights alone do not tell the two apart */
    if (same) return 0;
    char a[320], b[320];
    describe(&t->m.cfg, &was, a, sizeof a);
    describe(&t->m.cfg, now, b, sizeof b);
    glm_fail(err, "%s holds %s; this run trains %s: a checkpoint resumes only the kind of run that wrote it", dir, a, b);
    return glm_hint(err, "resume with the settings it was written with (its training_args.json), or start a new run in "
                         "another --output_dir (or --overwrite_output_dir)");
}

/* BAdam: the layer the checkpoint's next step trains holds the trainable rows before anything
 * is read into them (the optimizer state saved is that layer's). */
static int badam_layer_of(trainer *t, const char *dir, glm_err *err) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "trainer_state.json");
    char *text = glm_read_file(path, NULL, err);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *g = cJSON_GetObjectItem(o, "global_step"), *k = cJSON_GetObjectItem(o, "skipped_steps");
    if (!cJSON_IsNumber(g)) {
        cJSON_Delete(o);
        return glm_fail(err, "%s: no global_step to place BAdam's layer by", path);
    }
    long done = (long)g->valuedouble - (t->a->fp16 && cJSON_IsNumber(k) ? (long)k->valuedouble : 0);
    cJSON_Delete(o);
    glm_model_train_layer(&t->m, glm_badam_block(&t->badam, done + 1));
    return 0;
}

int trainer_resume(trainer *t, glm_err *err) {
    char dir[4096];
    if (agree_checkpoint(t, dir, sizeof dir, err)) return -1;
    if (check_kind(t, dir, err)) return -1;
    if (t->m.cfg.peft.badam && badam_layer_of(t, dir, err)) return -1;
    if (glm_dp_load(t->dp, dir, &t->st, err)) {
        if (!err->hint[0]) glm_hint(err, "if %s is damaged, pass an older checkpoint-N to --resume_from_checkpoint", dir);
        return -1;
    }
    if (t->st.log_history) {
        cJSON_Delete(t->history);
        t->history = cJSON_Parse(t->st.log_history);
        if (!t->history) t->history = cJSON_CreateArray();
    }
    if (t->st.loss_scale > 0) { t->scaler.scale = t->st.loss_scale; t->scaler.good_steps = t->st.good_steps; t->scaler.skipped = t->st.skipped_steps; }
    if (t->scaler.ds && t->st.scale_hysteresis > 0 && t->st.scale_hysteresis <= t->scaler.hysteresis)
        t->scaler.hysteresis_left = (int)t->st.scale_hysteresis;
    /* The cursor counts the writer's batches; the rows it consumed say where the data stands
     * whatever the rank count or batch size now (the same rows when nothing changed). */
    long rows_now = t->st.cursor * (long)t->a->per_device_train_batch_size * t->dp->world;
    if (t->st.data_rows >= 0 && t->st.data_rows != rows_now) {
        if (glm_loader_seek_rows(t->train_ld, t->st.epoch, t->st.data_rows, err)) return -1;
        if (lead(t))
            glm_info("%s: re-mapped the data position: %ld rows of epoch %ld were trained (by %ld ranks); the rest of the "
                     "epoch goes on over %d ranks x %d rows, %ld micro-batches, no example twice", dir, t->st.data_rows,
                     t->st.epoch, t->st.world_size, t->dp->world, t->a->per_device_train_batch_size,
                     (long)glm_loader_steps_left(t->train_ld));
    } else if (glm_loader_seek(t->train_ld, (glm_data_cursor){t->st.epoch, t->st.cursor}, err)) {
        return -1;
    }
    if (warn_changes(t, dir, t->st.data_rows >= 0 ? t->dp->world : t->st.world_size, err)) return -1;
    if (lead(t) && glm_output_run_id_write(t->a->output_dir, t->st.run_id, err)) return -1; /* the folder's run is now this one */
    glm_info("resumed from %s at step %ld (epoch %ld, batch %ld, run %s)", dir, t->st.global_step, t->st.epoch, t->st.cursor,
             t->st.run_id);
    return 0;
}
