/* The training loop of `glmtrain train` (train.h): steps, logging, evaluation, checkpoints;
 * set-up lives in setup.c, resume in resume.c. */
#include "train/trainer.h"
#include "model/pissa.h"
#include "model/adapter.h"

/* Mean loss over the validation tokens of every rank's share. */
/* The run's parallelism, as one interface (parallel/par.h). */
static glm_par par(const trainer *t) { return (glm_par){t->dp, t->pp}; }

static int evaluate(trainer *t, double *loss, double *ppl, glm_err *err) {
    glm_err lerr;
    glm_loader_seek(t->eval_ld, (glm_data_cursor){0, 0}, &lerr);
    int64_t n = glm_loader_steps_per_epoch(t->eval_ld);
    double v[2] = {0, 0}; /* loss sum, tokens */
    glm_par p = par(t);
    /* ZeRO-3: the whole model first, since the ranks' evaluation batches need not match */
    if (glm_par_gather_params(&p, err)) return -1;
    for (int64_t i = 0; i < n; i++) {
        if (glm_loader_next(t->eval_ld, &t->eval_batch, &lerr)) break;
        if (t->eval_batch.n_targets == 0) continue;
        if (glm_train_is_pref(t->a) ? trainer_pref_eval_batch(t, &t->eval_batch, v, err)
                                    : glm_par_eval_batch(&p, &t->m, &t->eval_batch, v, err))
            return -1;
    }
    glm_par_release_params(&p);
    if (glm_par_sum(&p, v, 2, 0, "evaluation loss", err)) return -1;
    if (glm_train_is_pref(t->a) && glm_par_sum(&p, (double *)&t->esums, GLM_PREF_SUMS, 0, "preference metrics", err)) return -1;
    t->eval_accuracy = t->esums.n > 0 ? t->esums.correct / t->esums.n : NAN;
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    *ppl = exp(*loss);
    return 0;
}

/* trainer.save_metrics("eval", ...): output_dir/eval_results.json, on the lead rank */
static int write_eval_results(trainer *t, double el, double ppl, glm_err *err) {
    if (!lead(t)) return 0;
    char path[4096], text[256];
    glm_path_join(path, sizeof path, t->a->output_dir, "eval_results.json");
    if (glm_train_is_rm(t->a)) /* LLaMA-Factory's PairwiseTrainer: the pairs' accuracy, no perplexity */
        snprintf(text, sizeof text, "{\n    \"eval_accuracy\": %.17g,\n    \"eval_loss\": %.17g,\n    \"step\": %ld\n}\n",
                 t->eval_accuracy, el, t->st.global_step);
    else if (glm_train_is_pref(t->a)) /* a preference loss has no perplexity */
        snprintf(text, sizeof text, "{\n    \"eval_loss\": %.17g,\n    \"step\": %ld\n}\n", el, t->st.global_step);
    else
        snprintf(text, sizeof text, "{\n    \"eval_loss\": %.17g,\n    \"eval_perplexity\": %.17g,\n    \"step\": %ld\n}\n", el,
                 ppl, t->st.global_step);
    return glm_write_file_atomic(path, text, strlen(text), err);
}

static void pref_log(trainer *t, int eval);

/* --do_train false --do_eval: the loaded model (and adapter) on the evaluation data, nothing trained or saved */
static int evaluate_only(trainer *t, glm_err *err) {
    if (!t->eval_ld) return glm_fail(err, "--do_eval: the evaluation data is empty"), glm_hint(err, "check --validation_file");
    double el, ppl;
    if (evaluate(t, &el, &ppl, err)) return -1;
    if (glm_train_is_pref(t->a)) fprintf(stderr, "{'eval_loss': %.4f}\n", el);
    else fprintf(stderr, "{'eval_loss': %.4f, 'eval_perplexity': %.4f}\n", el, ppl);
    if (glm_train_is_pref(t->a)) pref_log(t, 1);
    return write_eval_results(t, el, ppl, err);
}

static void log_record(trainer *t, const char *kind, double v1, double v2, double v3, double v4) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddNumberToObject(r, "step", (double)t->st.global_step);
    cJSON_AddNumberToObject(r, "epoch", (double)t->st.global_step / t->steps_per_epoch);
    if (strcmp(kind, "train") == 0) {
        cJSON_AddNumberToObject(r, "loss", v1);
        cJSON_AddNumberToObject(r, "learning_rate", v2);
        cJSON_AddNumberToObject(r, "grad_norm", v3);
        cJSON_AddNumberToObject(r, "tokens_per_second", v4);
    } else {
        cJSON_AddNumberToObject(r, "eval_loss", v1);
        if (!glm_train_is_pref(t->a)) cJSON_AddNumberToObject(r, "eval_perplexity", v2);
    }
    cJSON_AddItemToArray(t->history, r);
}

/* --stage dpo's (rm's) metrics since the last log (LLaMA-Factory's names; eval_ before them for an
 * evaluation): a log line, TensorBoard (train/... or eval/...), the newest log_history record; then
 * the sums start again. */
static void pref_log(trainer *t, int eval) {
    glm_pref_sums *s = eval ? &t->esums : &t->psums;
    int rm = t->pref.loss == GLM_PREF_RM; /* LLaMA-Factory's PairwiseTrainer: the accuracy of evaluations only */
    if (s->n <= 0 || (rm && !eval)) { *s = (glm_pref_sums){0}; return; }
    const char *names[] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                           "logps/chosen", "logps/rejected", "sft_loss", "odds_ratio_loss"};
    double v[] = {s->reward_c, s->reward_r, s->correct, s->margin, s->logp_c, s->logp_r, s->sft, s->odds};
    int n = t->pref.loss == GLM_PREF_ORPO ? 8 : 6;
    double den[8] = {s->n, s->n, s->n, s->n, s->n, s->n, s->n, s->n};
    if (rm) { names[0] = "accuracy"; v[0] = s->correct; n = 1; }
    if (t->pref.loss == GLM_PREF_KTO) { /* TRL's KTO log: each side's means over its own examples, kl over the batches */
        static const char *const kto_names[] = {"rewards/chosen", "logps/chosen", "rewards/rejected", "logps/rejected",
                                                "rewards/margins", "kl"};
        double c = s->n_c > 0 ? s->reward_c / s->n_c : 0, r = s->n_r > 0 ? s->reward_r / s->n_r : 0;
        double kv[] = {s->reward_c, s->logp_c, s->reward_r, s->logp_r, c - r, s->kl};
        double kd[] = {s->n_c, s->n_c, s->n_r, s->n_r, 1, s->n_kl};
        n = 0;
        for (int i = 0; i < 6; i++) {
            if (kd[i] <= 0 || (i == 4 && (s->n_c <= 0 || s->n_r <= 0))) continue; /* a side with no example is not logged */
            names[n] = kto_names[i]; v[n] = kv[i]; den[n] = kd[i]; n++;
        }
    }
    char line[1024];
    size_t u = 0;
    cJSON *rec = cJSON_GetArrayItem(t->history, cJSON_GetArraySize(t->history) - 1);
    for (int i = 0; i < n; i++) {
        double m = v[i] / den[i];
        char key[64], tag[64];
        snprintf(key, sizeof key, "%s%s", eval ? "eval_" : "", names[i]);
        snprintf(tag, sizeof tag, "%s/%s", eval ? "eval" : "train", names[i]);
        u += snprintf(line + u, sizeof line - u, "%s'%s': %.4f", i ? ", " : "{", key, m);
        if (t->tb) tb_scalar(t->tb, tag, (float)m, t->st.global_step);
        if (rec) cJSON_AddNumberToObject(rec, key, m);
    }
    snprintf(line + u, sizeof line - u, "}");
    if (t->prog.out) glm_progress_log(&t->prog, line);
    else fprintf(stderr, "%s\n", line); /* an evaluation alone runs before the progress display exists */
    if (t->tb) tb_flush(t->tb);
    *s = (glm_pref_sums){0};
}

/* One evaluation of the validation set at the current step: the log line, TensorBoard, the
 * log history and t->eval_loss / eval_ppl. */
static int evaluate_and_log(trainer *t, glm_err *err) {
    double el, ppl;
    if (evaluate(t, &el, &ppl, err)) return -1;
    long step = t->st.global_step;
    char line[256];
    if (glm_train_is_pref(t->a)) snprintf(line, sizeof line, "{'eval_loss': %.4f, 'step': %ld}", el, step);
    else snprintf(line, sizeof line, "{'eval_loss': %.4f, 'eval_perplexity': %.4f, 'step': %ld}", el, ppl, step);
    glm_progress_log(&t->prog, line);
    if (t->tb) {
        tb_scalar(t->tb, "eval/loss", (float)el, step);
        if (!glm_train_is_pref(t->a)) tb_scalar(t->tb, "eval/perplexity", (float)ppl, step);
        tb_flush(t->tb);
    }
    log_record(t, "eval", el, ppl, 0, 0);
    if (glm_train_is_pref(t->a)) pref_log(t, 1);
    t->eval_loss = el;
    t->eval_ppl = ppl;
    return 0;
}

/* The newest checkpoint-N in output_dir, or "none": where a failed run can go back to. */
static void last_checkpoint(const trainer *t, char *out, size_t cap) {
    if (glm_checkpoint_latest(t->a->output_dir, out, cap) != 0) snprintf(out, cap, "none");
}

/* The first tensor of this rank's model holding a NaN or inf, or NULL. One sum of squares over
 * the flat buffer (one host wait; squares of floats cannot overflow its double sum); tensor by
 * tensor only when that is not finite (padding, never saved, may be the culprit). */
static const char *first_nonfinite_param(const glm_model *m) {
    if (isfinite(m->be->sumsq(m->be, m->params, m->tab.total))) return NULL;
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *x = &m->tab.t[i];
        if (!isfinite(m->be->sumsq(m->be, glm_at(m->be, m->params, x->offset), x->numel))) return x->name;
    }
    return NULL;
}

/* Before any save: a model with NaN/inf is refused, never written over a good one. Every rank
 * checks its own parameters (a pipeline stage holds only its layers) and they vote, so all
 * ranks take the same decision. */
static int check_params_finite(trainer *t, const char *what, glm_err *err) {
    glm_par p = par(t);
    /* ZeRO-3: the whole model (the save that follows keeps it gathered, and releases it) */
    if (glm_par_gather_params(&p, err)) return -1;
    const char *bad = first_nonfinite_param(&t->m);
    double n_bad = bad != NULL;
    if (glm_par_sum(&p, &n_bad, 1, 0, "parameter check", err)) return -1;
    if (n_bad == 0) return 0;
    char ck[4096];
    last_checkpoint(t, ck, sizeof ck);
    if (bad) glm_fail(err, "not saving %s at step %ld: parameter %s holds NaN or inf", what, t->st.global_step, bad);
    else glm_fail(err, "not saving %s at step %ld: another pipeline stage's parameters hold NaN or inf (see its log)", what,
                  t->st.global_step);
    return glm_hint(err, "the run diverged: lower --learning_rate (%g); the last good checkpoint: %s", t->a->learning_rate, ck);
}

/* A bf16/fp32 step whose global loss or gradient norm was not finite (the update was skipped):
 * a log line, and after --max_bad_steps of them in a row an error. */
static int on_bad_step(trainer *t, double loss, double norm, float lr, int in_a_row, glm_err *err) {
    char line[512];
    if (isnan(loss)) loss = NAN; /* "nan", not "-nan" */
    if (isnan(norm)) norm = NAN;
    snprintf(line, sizeof line, "[glmtrain] step %ld: loss %g, grad norm %g at learning rate %.4g: not finite, update skipped (%d of --max_bad_steps %d)",
             t->st.global_step, loss, norm, lr, in_a_row, t->a->max_bad_steps);
    glm_progress_log(&t->prog, line);
    if (in_a_row < t->a->max_bad_steps) return 0;
    char ck[4096];
    last_checkpoint(t, ck, sizeof ck);
    glm_fail(err, "training diverged: at step %ld the loss (%g) or gradient norm (%g) was not finite for %d steps in a row, "
                  "at learning rate %.4g (their updates were skipped)", t->st.global_step, loss, norm, in_a_row, lr);
    return glm_hint(err, "lower --learning_rate (now %g), check the data and the input model; the last good checkpoint: %s%s",
                    t->a->learning_rate, ck, strcmp(ck, "none") ? " (--resume_from_checkpoint continues from it)" : "");
}

/* --metric_for_best_model's name without eval_: loss, perplexity or (--stage rm) accuracy */
static const char *metric_name(const trainer *t) {
    const char *m = t->a->metric_for_best_model;
    return strstr(m, "perplexity") ? "perplexity" : strstr(m, "accuracy") ? "accuracy" : "loss";
}

/* The last evaluation's --metric_for_best_model. */
static double best_model_metric(const trainer *t) {
    const char *m = metric_name(t);
    return !strcmp(m, "perplexity") ? t->eval_ppl : !strcmp(m, "accuracy") ? t->eval_accuracy : t->eval_loss;
}

/* Whether a greater metric is better: --greater_is_better, and always for an accuracy (transformers'
 * default for a metric that is not a loss) */
static int greater_better(const trainer *t) { return t->a->greater_is_better || !strcmp(metric_name(t), "accuracy"); }

/* Whether the evaluation just made beats the best of the saved ones (none yet: it does). */
static int beats_best(const trainer *t) {
    double v = best_model_metric(t);
    return !t->st.best_checkpoint[0] || (greater_better(t) ? v > t->st.best_metric : v < t->st.best_metric);
}

/* --load_best_model_at_end and --save_strategy best: whether an evaluation at this step beats the
 * best so far (the checkpoint about to be saved then becomes the best, as the Trainer decides in
 * _save_checkpoint) */
static void note_best(trainer *t) {
    const glm_train_args *a = t->a;
    if ((!a->load_best_model_at_end && t->save_when != GLM_WHEN_BEST) || t->eval_step != t->st.global_step) return;
    double v = best_model_metric(t);
    if (!beats_best(t)) return;
    t->st.best_metric = v;
    snprintf(t->st.best_checkpoint, sizeof t->st.best_checkpoint, "%s/checkpoint-%ld", a->output_dir, t->st.global_step);
}

/* --early_stopping_patience, as transformers' EarlyStoppingCallback.check_metric_value: the
 * evaluation just made against the best of the saved ones before it (note_best takes a new best
 * when the checkpoint of this step is saved); whether the run should stop now. */
static int early_stop_due(trainer *t) {
    const glm_train_args *a = t->a;
    if (a->early_stopping_patience <= 0) return 0;
    double v = best_model_metric(t), best = t->st.best_metric;
    int better = !t->st.best_checkpoint[0] ||
                 ((greater_better(t) ? v > best : v < best) && fabs(v - best) > a->early_stopping_threshold);
    t->st.early_stop_count = better ? 0 : t->st.early_stop_count + 1;
    return t->st.early_stop_count >= a->early_stopping_patience;
}

/* the step of the best checkpoint (0: none) */
static long best_step(const trainer *t) {
    const char *s = strrchr(t->st.best_checkpoint, '-');
    return t->st.best_checkpoint[0] && s ? atol(s + 1) : 0;
}

static int save_model_checkpoint(trainer *t, glm_err *err);

/* A checkpoint of the steps done: with --save_only_model the model alone, unless `to_resume`
 * (--save_on_interrupt's: it exists to be resumed from). */
static int save_checkpoint(trainer *t, int to_resume, glm_err *err) {
    if (check_params_finite(t, "a checkpoint", err)) return -1;
    note_best(t);
    t->st.has_plateau = t->sched.kind == LR_REDUCE_ON_PLATEAU;
    t->st.plateau = t->sched.plateau;
    free(t->st.log_history);
    t->st.log_history = cJSON_PrintUnformatted(t->history);
    glm_data_cursor c = glm_loader_cursor(t->train_ld);
    t->st.epoch = (long)c.epoch;
    t->st.cursor = (long)c.step;
    t->st.data_rows = (long)glm_loader_rows_consumed(t->train_ld); /* what another rank count resumes from */
    t->st.data_hash = t->data_hash;
    t->st.loss_scale = t->scaler.scale;
    t->st.good_steps = t->scaler.good_steps;
    t->st.skipped_steps = t->scaler.skipped;
    t->st.scale_hysteresis = t->scaler.ds ? t->scaler.hysteresis_left : 0;
    t->st.world_size = t->dp->world; /* data replicas: what the data cursor counts in */
    glm_par p = par(t);
    if (t->a->save_only_model && !to_resume ? save_model_checkpoint(t, err)
                                            : glm_par_save(&p, t->a->output_dir, &t->st, t->tok_path, t->args_json, err))
        return -1;
    if (!lead(t)) return 0;
    char line[256];
    snprintf(line, sizeof line, "[glmtrain] saved %s/checkpoint-%ld", t->a->output_dir, t->st.global_step);
    glm_progress_log(&t->prog, line);
    return glm_checkpoint_rotate_keep(t->a->output_dir, t->a->save_total_limit, t->st.run_id, best_step(t), err);
}

/* --load_best_model_at_end: the best checkpoint's weights into the model before the final save */
static int load_best(trainer *t, glm_err *err) {
    if (!t->a->load_best_model_at_end) return 0;
    if (!t->st.best_checkpoint[0]) {
        glm_warn("--load_best_model_at_end: no checkpoint was saved with an evaluation; the final model is the last one");
        return 0;
    }
    glm_train_state st = {0};
    const char *best = t->st.best_checkpoint;
    if (glm_checkpoint_is_model_only(best) ? glm_dp_load_weights(t->dp, best, err) : glm_dp_load(t->dp, best, &st, err))
        return glm_wrap(err, "loading the best checkpoint: ");
    free(st.log_history);
    if (lead(t))
        glm_info("loading the best model from %s (%s %.6g)", t->st.best_checkpoint, t->a->metric_for_best_model,
                 t->st.best_metric);
    return 0;
}

/* A strategy flag's value (the flag table allows no|steps|epoch, and best for saving, alone). */
static int when(const char *strategy) {
    return !strcmp(strategy, "steps") ? GLM_WHEN_STEPS : !strcmp(strategy, "epoch") ? GLM_WHEN_EPOCH
         : !strcmp(strategy, "best") ? GLM_WHEN_BEST : GLM_WHEN_NO;
}

/* Whether optimizer step `next` logs the training loss: the Trainer's logging_strategy (steps:
 * every logging_steps, and the last step here; epoch: the step that ends an epoch, known before
 * it runs from the micro-batches left; no: never), and logging_first_step whatever the strategy. */
static int log_due(trainer *t, long next) {
    const glm_train_args *a = t->a;
    if (a->logging_first_step && next == 1) return 1;
    if (t->log_when == GLM_WHEN_STEPS) return next % t->log_every == 0 || next == t->total_steps;
    if (t->log_when == GLM_WHEN_EPOCH) return (long)glm_loader_steps_left(t->train_ld) <= a->gradient_accumulation_steps;
    return 0;
}

/* One optimizer step over up to gradient_accumulation_steps micro-batches (fewer at the end
 * of an epoch). Returns the mean loss over the supervised tokens of the step's global batch
 * (every rank's share); sets *norm, *tokens (global). With measure, *ph gets this rank's
 * phases of the step, each ended by a device sync: forward+backward, the gradient reduction
 * still running after backward, the norm, the update (AdamW and ZeRO's parameter all-gather).
 * *stop: a rank got SIGINT/SIGTERM, and the step was not taken (the data cursor is back where
 * it was, for the checkpoint). */
static double train_step(trainer *t, float lr, int measure, double *norm, double *tokens, int *skipped, int *stop,
                         glm_step_phases *ph, glm_err *err) {
    glm_train_args *a = t->a;
    glm_data_cursor c = glm_loader_cursor(t->train_ld);
    long left = (long)glm_loader_steps_left(t->train_ld); /* a re-mapped epoch is shorter */
    int k = a->gradient_accumulation_steps < left ? a->gradient_accumulation_steps : (int)left;
    long n_sup = 0;
    *tokens = 0;
    double t0 = glm_now();
    int pref = glm_train_is_pref(a), bs = a->per_device_train_batch_size;
    for (int i = 0; i < k; i++) {
        if (glm_loader_next(t->train_ld, &t->micro[i], err)) return NAN;
        /* preference pairs: the loss is a mean over the pairs, not the tokens */
        n_sup += pref ? trainer_pref_pairs(&t->micro[i]) : t->micro[i].n_targets;
        if (pref) glm_loader_last_examples(t->train_ld, t->micro_pairs + (size_t)i * bs, NULL, bs);
        *tokens += (double)glm_loader_last_tokens(t->train_ld);
    }
    /* every rank scales its gradients by 1/(supervised tokens, or pairs, of the whole global batch) */
    double g[3] = {(double)n_sup, *tokens, glm_signal_pending() ? 1 : 0};
    glm_par p = par(t);
    if (glm_par_sum_batch(&p, g, 3, err)) return NAN;
    if (g[2] > 0) { /* a signal reached a rank (summed over a pipeline's stages too: > 0 either way) */
        if (glm_loader_seek(t->train_ld, c, err)) return NAN;
        *stop = 1;
        return NAN;
    }
    n_sup = (long)g[0];
    *tokens = g[1];
    glm_dp_begin_step(t->dp, lr, n_sup > 0);
    glm_dp_zero_grads(t->dp);
    double scale = a->fp16 ? t->scaler.scale : 1.0;
    double sum = 0;
    if (n_sup > 0 && (pref ? trainer_pref_forward_backward(t, k, (float)(scale / n_sup), &sum, err)
                           : glm_par_forward_backward(&p, &t->m, t->micro, k, (float)(scale / n_sup), (uint64_t)a->seed,
                                                      t->st.global_step, NULL, NULL, &sum, err)))
        return NAN;
    double t1 = 0, t2 = 0, t3 = 0;
    if (measure) { t->be->sync(t->be); t1 = glm_now(); ph->compute_s = t1 - t0; }
    if (glm_dp_reduce_grads(t->dp, err)) return NAN;
    if (measure) { t->be->sync(t->be); t2 = glm_now(); ph->tail_s = t2 - t1; }
    if (glm_par_grad_norm(&p, (float)(1.0 / scale), &sum, norm, err)) return NAN;
    if (measure) { t->be->sync(t->be); t3 = glm_now(); ph->norm_s = t3 - t2; }
    *skipped = 0;
    double loss = n_sup ? sum / n_sup : NAN;
    int scaled = a->fp16 ? glm_scaler_update(&t->scaler, *norm) : 0;
    if (scaled < 0) {
        glm_fail(err, "step %ld: the gradients overflow at the minimum loss scale %g (the --deepspeed file's "
                      "fp16.min_loss_scale), where DeepSpeed stops the run too", t->st.global_step + 1, t->scaler.scale);
        glm_hint(err, "resume from the last checkpoint with a lower --learning_rate (now %g), or train in --bf16",
                 a->learning_rate);
        return NAN;
    }
    if (scaled) { *skipped = 1; return loss; }
    /* bf16/fp32: a non-finite step is not applied, so the parameters stay finite. The loss
     * and norm are global here (summed over ranks), so every rank skips the same steps. */
    if (a->optimizer_in_backward && n_sup > 0 && !(isfinite(loss) && isfinite(*norm))) {
        glm_fail(err, "step %ld: the loss or the gradients are not finite (loss %g, grad_norm %g), and with "
                      "--optimizer_in_backward the layers were already updated from them", t->st.global_step + 1, loss, *norm);
        glm_hint(err, "resume from the last checkpoint with a lower --learning_rate (now %g), or train without "
                      "--optimizer_in_backward, which skips such steps", a->learning_rate);
        return NAN;
    }
    if (!a->fp16 && n_sup > 0 && !(isfinite(loss) && isfinite(*norm))) { *skipped = 1; return loss; }
    if (n_sup > 0) {
        float coef = glm_clip_coef(*norm, (float)a->max_grad_norm);
        if (glm_dp_optimizer_step(t->dp, lr, (float)(coef / scale), err)) return NAN;
        if (measure) { t->be->sync(t->be); ph->update_s = glm_now() - t3; }
    }
    t->st.tokens_seen += (double)n_sup;
    return loss;
}

/* At logging steps: every rank's step phases and GPU figures (collective). */
static int log_rank_stats(trainer *t, const glm_step_phases *ph, glm_err *err) {
    int W = t->dp->world;
    if (W == 1 && !t->gs) return 0;
    glm_rank_stat *s = glm_calloc((size_t)W, sizeof *s);
    int rc = glm_dp_stats(t->dp, t->gs, ph, s, err);
    if (rc == 0 && t->dp->rank == 0) {
        char line[4096], warn[2048];
        glm_dp_stats_format(W, t->gs != NULL, s, line, sizeof line, warn, sizeof warn);
        glm_progress_log(&t->prog, line);
        glm_dp_phases_format(W, s, line, sizeof line);
        glm_progress_log(&t->prog, line);
        if (warn[0]) { snprintf(line, sizeof line, "[glmtrain] warning: %s", warn); glm_progress_log(&t->prog, line); }
        for (int r = 0; r < W && t->tb; r++) {
            char tag[96];
            long step = t->st.global_step;
            snprintf(tag, sizeof tag, "system/rank%d/forward_backward_seconds", r); tb_scalar(t->tb, tag, (float)s[r].compute_s, step);
            snprintf(tag, sizeof tag, "system/rank%d/memory_gib", r); tb_scalar(t->tb, tag, (float)(s[r].mem / 1073741824.0), step);
            if (!t->gs) continue;
            snprintf(tag, sizeof tag, "system/rank%d/gpu_utilization", r); tb_scalar(t->tb, tag, (float)s[r].util, step);
            snprintf(tag, sizeof tag, "system/rank%d/power_watts", r); tb_scalar(t->tb, tag, (float)s[r].power, step);
        }
    }
    free(s);
    return rc;
}

/* Every rank learns whether any failed at `what` (long waits allowed: rank 0 may be writing);
 * -1 on every rank when one did, the failing rank keeping its own error. */
static int ranks_agree(trainer *t, int failed, const char *what, glm_err *err) {
    glm_par p = par(t);
    glm_err e2;
    double v = failed;
    if (glm_par_sum(&p, &v, 1, 1, what, failed ? &e2 : err)) return -1;
    if (v > 0 && !failed) return glm_fail(err, "rank 0 failed while %s (see its error)", what);
    return failed ? -1 : 0;
}

/* The model as the final save writes it into dir (full and freeze: the whole model in
 * --save_dtype; LoRA: peft's adapter files; P-Tuning v2: THUDM's prefix files), with the
 * tokenizer and training_args.json. Pipeline stages each write theirs; otherwise rank 0 writes,
 * after ZeRO-3 gathered the weights (left gathered: the caller releases them). Every rank
 * learns whether that worked. */
static int write_model(trainer *t, const char *dir, glm_err *err) {
    glm_train_args *a = t->a;
    st_dtype dt = strcmp(a->save_dtype, "float16") == 0 ? ST_F16 : strcmp(a->save_dtype, "bfloat16") == 0 ? ST_BF16 : ST_F32;
    if (t->pp) return glm_pp_save_final(t->pp, dir, dt, t->tok_path, t->args_json, err);
    glm_par p = par(t);
    if (glm_par_gather_params(&p, err)) return -1; /* ZeRO-3: every rank takes part */
    int rc = 0;
    if (t->dp->rank == 0) {
        size_t shard = 0;
        if (strcmp(a->max_shard_size, "0") != 0) glm_parse_size(a->max_shard_size, &shard); /* checked at start */
        char path[4096];
        glm_path_join(path, sizeof path, dir, "training_args.json");
        rc = glm_model_save_final(&t->m, dir, dt, shard, err);
        if (rc && dt == ST_F16 && strstr(err->msg, ST_PAST_F16)) { /* the trained weights are kept, exactly, not lost */
            glm_warn("%s; the model is written as float32 instead (glmtrain convert --dtype bfloat16 halves it)", err->msg);
            *err = (glm_err){0};
            rc = glm_model_save_final(&t->m, dir, ST_F32, shard, err);
        }
        rc = rc || glm_copy_tokenizer_files(t->tok_path, dir, err) ||
             glm_write_file_atomic(path, t->args_json, strlen(t->args_json), err) ? -1 : 0;
    }
    return ranks_agree(t, rc != 0, "writing the model", err);
}

static int save_final(trainer *t, glm_err *err) {
    if (write_model(t, t->a->output_dir, err)) return -1;
    static const char *const what[] = {"the final model", "the LoRA adapter (load it with --adapter, or merge it with glmtrain merge)",
                                       "the P-Tuning v2 prefix encoder (load it with --adapter beside the base model)",
                                       "the final model"};
    if (lead(t)) glm_info("saved %s to %s", what[t->m.cfg.peft.kind], t->a->output_dir);
    /* transformers' own GLM layout needs no code files */
    if (lead(t) && t->m.cfg.peft.kind != GLM_FT_LORA && !t->m.cfg.hf_layout) glm_check_remote_code(t->a->output_dir);
    if (lead(t) && t->a->pissa_convert) { /* a plain LoRA for the original base beside it */
        char dir[4096];
        glm_path_join(dir, sizeof dir, t->a->output_dir, GLM_PISSA_CONVERTED_DIR);
        if (glm_adapter_save_pissa_converted(&t->m, dir, err)) return -1;
        glm_info("saved the PiSSA adapter converted into a plain LoRA of rank %d for the original base to %s",
                 2 * t->m.cfg.peft.lora_rank, dir);
    }
    return 0;
}

/* --save_only_model: checkpoint-N holds what the final save would write at this step and no
 * optimizer state (trainer_state.json says so: resume refuses it). Written as every checkpoint,
 * under tmp-checkpoint-N, sealed and renamed when complete. */
static int save_model_checkpoint(trainer *t, glm_err *err) {
    const char *out = t->a->output_dir;
    long step = t->st.global_step;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/tmp-checkpoint-%ld", out, step); /* every rank's path; the lead makes it */
    int me = lead(t), made = me && glm_checkpoint_begin(out, step, tmp, sizeof tmp, err) == 0;
    int rc = ranks_agree(t, me && !made, "making the checkpoint folder", err);
    if (rc == 0) {
        rc = write_model(t, tmp, err);
        glm_par p = par(t);
        if (!t->pp) glm_par_release_params(&p);
    }
    if (rc == 0) {
        glm_train_state st = t->st;
        st.model_only = 1;
        rc = ranks_agree(t, me && glm_checkpoint_complete(out, tmp, &st, t->dp->opt->step, err) != 0,
                         "completing the checkpoint", err);
    }
    if (rc == 0 || !me) return rc;
    glm_wrap(err, "saving checkpoint %s/checkpoint-%ld: ", out, step);
    double need = glm_checkpoint_bytes(&t->m.cfg, 0, t->tok_path, strlen(t->args_json) + 4096);
    return glm_checkpoint_abandon(out, made ? tmp : NULL, need, err);
}

static void trainer_free(trainer *t, int ok) {
    glm_pp_close(t->pp, ok); /* before the MPI world closes */
    glm_dp_close(t->dp, ok); /* first: the communicator still uses the device */
    glm_gpustat_close(t->gs);
    if (t->micro) for (int i = 0; i < t->a->gradient_accumulation_steps; i++) glm_batch_free(&t->micro[i]);
    free(t->micro);
    if (t->eval_ld) glm_batch_free(&t->eval_batch);
    if (t->train_ld) glm_loader_free(t->train_ld);
    if (t->eval_ld) glm_loader_free(t->eval_ld);
    if (t->data.train_ex) glm_data_free(&t->data);
    free(t->sources);
    free(t->val_sources);
    free(t->ref_train); free(t->ref_val); free(t->micro_pairs);
    if (t->tok) glm_tokenizer_free(t->tok);
    if (t->tb) tb_close(t->tb);
    if (t->opt.n) glm_adamw_free(&t->opt, &t->m);
    if (t->m.params) glm_model_free(&t->m);
    if (t->be) t->be->destroy(t->be);
    free(t->args_json);
    free(t->st.log_history);
    cJSON_Delete(t->history);
}

static void log_train(trainer *t, double avg, float lr, double norm, double tps) {
    char line[512];
    double epoch = (double)t->st.global_step / t->steps_per_epoch;
    snprintf(line, sizeof line, "{'loss': %.4f, 'learning_rate': %.4g, 'grad_norm': %.4f, 'epoch': %.2f, 'step': %ld, 'tokens_per_second': %.0f}",
             avg, lr, norm, epoch, t->st.global_step, tps);
    glm_progress_log(&t->prog, line);
    if (t->tb) {
        tb_scalar(t->tb, "train/loss", (float)avg, t->st.global_step);
        tb_scalar(t->tb, "train/learning_rate", lr, t->st.global_step);
        tb_scalar(t->tb, "train/grad_norm", (float)norm, t->st.global_step);
        tb_scalar(t->tb, "train/epoch", (float)epoch, t->st.global_step);
        tb_scalar(t->tb, "train/tokens_per_second", (float)tps, t->st.global_step);
        if (t->a->fp16) tb_scalar(t->tb, "train/loss_scale", (float)t->scaler.scale, t->st.global_step);
        tb_flush(t->tb);
    }
    log_record(t, "train", avg, lr, norm, tps);
    if (glm_train_is_pref(t->a)) pref_log(t, 0);
}

/* SIGINT/SIGTERM reached a rank: every rank stops before the step (with --save_on_interrupt
 * after writing a checkpoint of the steps done) and the run ends with an error. */
static int stop_on_signal(trainer *t, glm_err *err) {
    char line[256];
    int sig = glm_signal_pending();
    snprintf(line, sizeof line, "[glmtrain] %s%s: stopping at step %ld", sig ? "received " : "another rank received ",
             sig ? glm_signal_name(sig) : "a stop signal", t->st.global_step);
    glm_progress_log(&t->prog, line);
    if (t->a->save_on_interrupt && t->st.global_step > 0 && save_checkpoint(t, 1, err)) return -1;
    glm_fail(err, "training stopped by a signal at step %ld%s", t->st.global_step,
             t->a->save_on_interrupt && t->st.global_step > 0 ? " (checkpoint saved)" : "");
    return glm_hint(err, "continue with --resume_from_checkpoint%s", t->a->save_on_interrupt ? "" : "; --save_on_interrupt saves one on Ctrl-C");
}

/* BAdam, after `done` optimizer steps: when the next step starts a round, its layer takes over
 * (glm_model_train_layer) with a fresh optimizer state, and the lead logs it. */
static void badam_turn(trainer *t, long done) {
    const glm_badam *b = &t->badam;
    if (glm_badam_round(b, done + 1) == glm_badam_round(b, done)) return;
    int from = t->m.cfg.peft.badam_layer, to = glm_badam_block(b, done + 1);
    glm_model_train_layer(&t->m, to);
    glm_dp_restart_optimizer(t->dp);
    if (!lead(t)) return;
    char line[256];
    snprintf(line, sizeof line, "[glmtrain] BAdam: after step %ld layer %d trains (was layer %d), its optimizer state afresh",
             t->st.global_step, to, from);
    glm_progress_log(&t->prog, line);
}

static int run(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    if (glm_train_check_args(a, err) || trainer_check_output_dir(a, err)) return -1;
    glm_dp_cfg dc = {.zero_stage = a->zero_stage, .bucket_mb = a->bucket_size_mb, .timeout = a->ddp_timeout,
                     .save_on_interrupt = a->save_on_interrupt, .optim = glm_optim_parse(a->optim),
                     .offload = strcmp(a->offload_optimizer, "cpu") == 0, .in_backward = a->optimizer_in_backward};
    if (glm_dp_open(&t->dp, &dc, err) || glm_dp_redirect_log(t->dp, a->output_dir, err)) return -1;
    if (trainer_prepare_output_dir(t, err)) return -1;
    if (glm_presence_open(&t->pres, a->output_dir, t->dp->dist.rank, t->dp->dist.world, err)) return -1;
    if (a->save_on_interrupt) glm_signals_install();
    t->args_json = glm_args_to_json(glm_train_flags, glm_train_nflags, a);
    fprintf(stderr, "[glmtrain] effective settings:\n%s\n", t->args_json);
    char path[4096];
    glm_path_join(path, sizeof path, a->output_dir, "training_args.json");
    if (t->dp->rank == 0 && glm_write_file_atomic(path, t->args_json, strlen(t->args_json), err)) return -1;
    if (trainer_pick_backend(t, err) || trainer_load_model(t, err)) return -1;
    /* what forward/backward will still allocate: an optional buffer (the P2P landing) must leave it */
    glm_mem_plan mp = glm_memory_plan(&t->m.cfg, t->m.be->dtype, glm_train_rows(a),
                                      glm_train_seq_len(a), a->gradient_checkpointing, t->m.head_chunk);
    t->dp->cfg.reserve_bytes = mp.activations + mp.scratch;
    if (a->ds.decay_all) /* DeepSpeed's optimizer from the file: one parameter group, every tensor decays */
        for (int i = 0; i < t->m.tab.n; i++) t->m.tab.t[i].decay = 1;
    if (glm_dp_attach(t->dp, &t->m, &t->opt, (float)a->learning_rate, (float)a->adam_beta1, (float)a->adam_beta2,
                      (float)a->adam_epsilon, (float)(a->use_badam ? 0 : a->weight_decay), err)) /* BAdam: setup.c says why */
        return -1;
    if (t->pp && glm_pp_ready(t->pp, err)) return -1;
    if (trainer_load_tokenizer(t, err) || trainer_load_data(t, err)) return -1;
    if (trainer_plan_steps(t, err)) return -1;
    if (a->ds.fp16_rule)
        glm_scaler_init_ds(&t->scaler, a->fp16_initial_scale, a->ds.scale_window, a->ds.hysteresis,
                           a->ds.consecutive_hysteresis, a->ds.min_scale);
    else
        glm_scaler_init(&t->scaler, a->fp16_initial_scale, 2000);
    t->history = cJSON_CreateArray();
    if (!a->do_train) { /* --stage rm predicts here too; other stages' predictions run after (cli/cmd_train.c) */
        if (a->do_eval && evaluate_only(t, err)) return -1;
        return glm_train_is_rm(a) && a->do_predict ? trainer_rm_predict(t, err) : 0;
    }
    if (a->resume_from_checkpoint && trainer_resume(t, err)) return -1;
    if (strcmp(a->report_to, "tensorboard") == 0 && lead(t)) {
        char logdir[4096];
        if (a->logging_dir) snprintf(logdir, sizeof logdir, "%s", a->logging_dir);
        else glm_path_join(logdir, sizeof logdir, a->output_dir, "runs");
        if (tb_open(&t->tb, logdir, err)) return -1;
    }
    if (glm_backend_on_gpu(t->be)) t->gs = glm_gpustat_open(glm_local_device(t->dp->dist.local_rank));
    t->log_when = when(a->logging_strategy);
    t->eval_when = when(a->eval_strategy);
    t->save_when = when(a->save_strategy);
    int eval_on = t->eval_ld && t->eval_when != GLM_WHEN_NO;
    if (t->eval_when != GLM_WHEN_NO && !t->eval_ld)
        glm_warn("--eval_strategy %s but no validation data (--validation_file or --val_size): evaluation skipped", a->eval_strategy);
    if (a->do_eval && !t->eval_ld)
        glm_warn("--do_eval but no validation data (--validation_file or --val_size): evaluation skipped");
    if (a->predict_with_generate && (a->do_eval || eval_on))
        glm_info("--predict_with_generate: evaluation here is the loss; BLEU-4/ROUGE of generated answers: "
                 "glmtrain generate --model_name_or_path %s --input_file VALIDATION_FILE", a->output_dir);
    glm_info("training: %ld optimizer steps (%ld per epoch, %ld micro-batches of %d rows per epoch, accumulation %d), warmup %ld, schedule %s",
             t->total_steps, t->steps_per_epoch, t->micro_per_epoch, a->per_device_train_batch_size,
             a->gradient_accumulation_steps, t->warmup, a->lr_scheduler_type);
    if (!a->save_final_model && t->save_when == GLM_WHEN_NO && lead(t))
        glm_info("--save_final_model false with --save_strategy no: nothing of this run will be saved");
    if (lead(t)) trainer_disk_plan(t);
    glm_progress_init(&t->prog, stderr, t->st.global_step, t->total_steps, a->disable_tqdm);
    if (a->eval_on_start) { /* the Trainer's eval_on_start: the model as the first step finds it */
        if (!t->eval_ld) glm_warn("--eval_on_start but no validation data (--validation_file or --val_size): evaluation skipped");
        else if (evaluate_and_log(t, err)) return -1;
    }
    double t_start = glm_now(), t_log = t_start, loss_acc = 0, tok_acc = 0, last_loss = NAN;
    int stop_early = 0;
    if (t->sched.kind == LR_REDUCE_ON_PLATEAU && t->st.has_plateau) { /* a resumed run goes on from the saved state */
        if (isnan(t->st.plateau.best)) t->st.plateau.best = t->sched.plateau.best; /* none yet: the mode's worst */
        t->sched.plateau = t->st.plateau;
    }
    t->st.early_stop_patience = a->early_stopping_patience; /* what checkpoints record beside the count */
    t->st.early_stop_threshold = a->early_stopping_threshold;
    long n_acc = 0;
    int bad_in_a_row = 0; /* bf16/fp32 steps skipped for a non-finite loss or norm */
    char line[512];
    while (t->st.global_step < t->total_steps) {
        long next = t->st.global_step + 1;
        int log_now = log_due(t, next);
        /* the schedule advances with the updates applied: a step the fp16 scaler skipped does not count, as in
         * the Trainer (accelerate's optimizer_step_was_skipped) and DeepSpeed */
        float lr = glm_lr_sched_at(&t->sched, t->st.global_step - (a->fp16 ? t->scaler.skipped : 0));
        double norm = 0, tokens = 0;
        glm_step_phases ph = {0};
        int skipped = 0, stop = 0, new_best = 0;
        glm_dp_set_step(t->dp, next);
        glm_presence_step(&t->pres, next);
        double loss = train_step(t, lr, log_now, &norm, &tokens, &skipped, &stop, &ph, err);
        if (stop) return stop_on_signal(t, err);
        if (isnan(loss) && err->msg[0]) return -1;
        t->st.global_step++;
        if (t->m.cfg.peft.badam && !(skipped && a->fp16)) /* inside the step, as BAdam's optimizer switches */
            badam_turn(t, t->st.global_step - (a->fp16 ? t->scaler.skipped : 0));
        if (isfinite(loss)) { loss_acc += loss; n_acc++; last_loss = loss; }
        tok_acc += tokens;
        if (!skipped) bad_in_a_row = 0;
        else if (!a->fp16 && on_bad_step(t, loss, norm, lr, ++bad_in_a_row, err)) return -1;
        if (skipped && a->fp16) {
            snprintf(line, sizeof line, "[glmtrain] step %ld: inf/nan gradients, step skipped, loss scale now %.0f",
                     t->st.global_step, t->scaler.scale);
            glm_progress_log(&t->prog, line);
        }
        double now = glm_now();
        if (log_now) {
            log_train(t, n_acc ? loss_acc / n_acc : NAN, lr, norm, tok_acc / (now - t_log > 1e-9 ? now - t_log : 1e-9));
            if (log_rank_stats(t, &ph, err)) return -1;
            if (t->pp) {
                char pl[1024];
                if (glm_pp_stats(t->pp, a->gradient_accumulation_steps, pl, sizeof pl, err)) return -1;
                if (pl[0]) glm_progress_log(&t->prog, pl);
            }
            loss_acc = 0; n_acc = 0; tok_acc = 0; t_log = now;
        }
        glm_data_cursor cur = glm_loader_cursor(t->train_ld);
        int epoch_end = cur.step == 0; /* the last micro-batch rolled the cursor over */
        /* the Trainer's eval_delay: steps, or epochs done, by the strategy */
        if (eval_on && ((t->eval_when == GLM_WHEN_STEPS && t->st.global_step % t->eval_every == 0 &&
                         a->eval_delay <= (double)t->st.global_step) ||
                        (t->eval_when == GLM_WHEN_EPOCH && epoch_end && a->eval_delay <= (double)cur.epoch))) {
            if (evaluate_and_log(t, err)) return -1;
            t->eval_step = t->st.global_step; /* a checkpoint saved at this step carries it (--load_best_model_at_end) */
            new_best = t->save_when == GLM_WHEN_BEST && beats_best(t);
            if (t->sched.kind == LR_REDUCE_ON_PLATEAU && glm_lr_plateau_step(&t->sched, best_model_metric(t))) {
                snprintf(line, sizeof line, "[glmtrain] reduce_lr_on_plateau: eval_%s has not improved for more than %ld "
                         "evaluations; the learning rate is now %.6g", metric_name(t), t->sched.patience, t->sched.plateau.lr);
                glm_progress_log(&t->prog, line);
            }
            stop_early = early_stop_due(t);
        }
        /* ranks must agree on stopping: rank clocks differ, so they vote */
        double out_of_time = a->max_train_seconds > 0 && now - t_start > a->max_train_seconds;
        glm_par p = par(t);
        if (a->max_train_seconds > 0 && glm_par_sum(&p, &out_of_time, 1, 0, "time limit", err)) return -1;
        if ((t->save_when == GLM_WHEN_STEPS && t->st.global_step % t->save_every == 0) ||
            (t->save_when == GLM_WHEN_EPOCH && epoch_end) || new_best || out_of_time > 0)
            if (save_checkpoint(t, 0, err)) return -1;
        glm_progress_update(&t->prog, t->st.global_step, last_loss, tok_acc / (now - t_log > 1e-3 ? now - t_log : 1e-3));
        if (out_of_time > 0) { glm_progress_log(&t->prog, "[glmtrain] --max_train_seconds reached; stopping"); break; }
        if (stop_early) {
            snprintf(line, sizeof line, "[glmtrain] early stopping at step %ld: eval_%s has not improved on the best (%.6g) by "
                     "more than %g for %ld evaluations (--early_stopping_patience %d)", t->st.global_step,
                     metric_name(t), t->st.best_metric,
                     a->early_stopping_threshold, t->st.early_stop_count, a->early_stopping_patience);
            glm_progress_log(&t->prog, line);
            break;
        }
    }
    glm_progress_done(&t->prog);
    glm_info("trained %ld steps in %.1f s", t->st.global_step, glm_now() - t_start);
    if (load_best(t, err)) return -1; /* the Trainer loads it at the end of train(), before the scripts evaluate */
    if (a->do_eval && t->eval_ld) { /* the scripts' trainer.evaluate() after training */
        if (evaluate_and_log(t, err) || write_eval_results(t, t->eval_loss, t->eval_ppl, err)) return -1;
    }
    if (a->save_final_model && (check_params_finite(t, "the final model", err) || save_final(t, err))) return -1;
    /* --stage rm scores --test_file with the model it holds (other stages answer it after: cli/cmd_train.c) */
    return glm_train_is_rm(a) && a->do_predict ? trainer_rm_predict(t, err) : 0;
}

int glm_train_preflight(glm_train_args *a, glm_err *err) {
    return glm_train_check_args(a, err) || trainer_check_output_dir(a, err) ? -1 : 0;
}

int glm_train_run(glm_train_args *a, glm_err *err) {
    trainer t = {.a = a};
    err->msg[0] = 0;
    int rc = run(&t, err);
    if (rc && strstr(err->msg, "timed out")) { /* name the ranks it waited for */
        char behind[2048];
        glm_presence_explain(&t.pres, t.st.global_step + 1, behind, sizeof behind);
        if (behind[0]) glm_hint(err, "behind this rank: %s; see their logs (output_dir/logs/rank-N.log)", behind);
    }
    int rank = t.pp ? t.pp->world_rank : t.dp ? t.dp->rank : 0; /* the job's rank, also with stages */
    if (rc && t.dp && (t.dp->world > 1 || (t.pp && t.pp->world_size > 1))) {
        if (strncmp(err->msg, "rank ", 5) != 0) glm_wrap(err, "rank %d: ", rank);
        if (rank > 0) glm_err_print(err); /* into its log file; the CLI prints it on the terminal */
    }
    trainer_free(&t, rc == 0);
    return rc;
}
