/* --stage dpo, kto and rm in the trainer (trainer.h, train/pref.h): the reference's values before
 * training, the step's micro-batches through the weighed loss, evaluation, rm's scores. */
#include "train/trainer.h"
#include "core/strbuf.h"

/* The reference's value of every pair of a view, into out [2 * ds->n] (chosen, rejected by
 * dataset position): model m (the one training, as it is now, without its LoRA adapter; or
 * --ref_model's) in evaluation mode (no dropout). Each rank computes
 * its DistributedSampler share (a pair repeated to even the shares out carries no targets and is
 * left out), and a sum over the ranks gives every rank the whole table. */
static int ref_table(trainer *t, glm_model *m, const glm_dataset *ds, double **out, glm_err *err) {
    glm_loader_cfg c;
    glm_loader_cfg_init(&c);
    c.batch_size = t->a->per_device_eval_batch_size;
    c.shuffle = 0;
    c.pairs = 1;
    c.rank = t->dp->rank;
    c.world = t->dp->world;
    c.no_loss_on_wrap = 1;
    glm_loader *l;
    if (glm_loader_open(&l, ds, &c, err)) return -1;
    glm_batch b = {0};
    glm_loader_batch_alloc(l, &b);
    double *tab = glm_malloc(sizeof(double) * 2 * (size_t)ds->n);
    for (int64_t i = 0; i < 2 * ds->n; i++) tab[i] = 0;
    float *tok = glm_malloc(sizeof(float) * b.cap);
    double *rows = glm_malloc(sizeof(double) * (size_t)b.B);
    int64_t *pos = glm_malloc(sizeof(int64_t) * (size_t)c.batch_size);
    glm_par p = {t->dp, t->pp};
    int own = m == &t->m, rc = own ? glm_par_gather_params(&p, err) : 0; /* ZeRO-3 shards the model being trained */
    /* LLaMA-Factory's reference for LoRA is the model with its adapter disabled (a new one starts at B = 0,
     * so this matters for an adapter loaded to train on: --adapter_name_or_path) */
    int off = own && rc == 0 && m->cfg.peft.kind == GLM_FT_LORA;
    if (off) glm_model_adapters_off(m, 1);
    for (int64_t s = 0, n = glm_loader_steps_per_epoch(l); s < n && rc == 0; s++) {
        if ((rc = glm_loader_next(l, &b, err))) break;
        int P = glm_loader_last_examples(l, pos, NULL, c.batch_size);
        glm_forward_token_losses(m, &b, tok);
        glm_pref_row_logps(&t->pref, &b, tok, rows);
        for (int u = 0; u < P; u++) {
            if (isnan(rows[u]) || isnan(rows[P + u])) continue; /* a repeated pair: its own rank has it */
            tab[2 * pos[u]] = rows[u];
            tab[2 * pos[u] + 1] = rows[P + u];
        }
    }
    if (off) glm_model_adapters_off(m, 0);
    if (own) glm_par_release_params(&p);
    if (rc == 0) rc = glm_par_sum(&p, tab, 2 * (int)ds->n, 1, "the reference's log-probabilities", err);
    free(tok); free(rows); free(pos);
    glm_batch_free(&b);
    glm_loader_free(l);
    if (rc) { free(tab); return -1; }
    *out = tab;
    return 0;
}

int trainer_pref_setup(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    t->pref = (glm_pref_cfg){.beta = a->pref_beta, .ftx = a->pref_ftx, .simpo_gamma = a->simpo_gamma,
                             .label_smoothing = a->dpo_label_smoothing};
    t->pref.kto_desirable = a->kto_chosen_weight;
    t->pref.kto_undesirable = a->kto_rejected_weight;
    if (glm_train_is_rm(a)) t->pref.loss = GLM_PREF_RM;
    else if (glm_train_is_kto(a)) t->pref.loss = GLM_PREF_KTO;
    else glm_pref_loss_parse(a->pref_loss, &t->pref.loss); /* checked with the flags */
    if (glm_train_is_kto(a) && lead(t)) { /* LLaMA-Factory's warning: one kind alone has nothing to compare with */
        const glm_dataset *ds = &t->data.train;
        int64_t good = 0;
        for (int64_t k = 0; k < ds->n; k++) {
            good += glm_examples_desirable(ds->ex, glm_dataset_index(ds, k));
        }
        if (good == 0 || good == ds->n)
            glm_warn("--stage kto: every one of the %lld training examples is %s; KTO learns from both kinds (kto_tag "
                     "true and false)", (long long)ds->n, good ? "desirable" : "undesirable");
        else
            glm_info("--stage kto: %lld desirable and %lld undesirable training examples", (long long)good,
                     (long long)(ds->n - good));
    }
    if (!glm_train_is_rm(a)) { /* LLaMA-Factory's CustomDPOTrainer: disable_dropout_in_model (its RM keeps dropout) */
        t->m.no_dropout = 1;
        if (t->m.cfg.peft.kind == GLM_FT_LORA && t->m.cfg.peft.lora_dropout > 0 && lead(t))
            glm_info("--stage %s trains without --lora_dropout %g, as LLaMA-Factory's trainer turns dropout off (the "
                     "adapter's config keeps the value)", a->stage, t->m.cfg.peft.lora_dropout);
    }
    t->micro_pairs = glm_malloc(sizeof(int64_t) * (size_t)a->gradient_accumulation_steps * a->per_device_train_batch_size);
    if (!glm_pref_uses_ref(t->pref.loss)) return 0;
    double t0 = glm_now();
    glm_model ref, *m = &t->m;
    if (a->ref_model) { /* LLaMA-Factory's --ref_model (and --ref_model_adapters merged into it as it loads) */
        glm_config rc;
        if (glm_config_load(&rc, a->ref_model, err)) return glm_wrap(err, "--ref_model: ");
        if (rc.vocab_size != t->m.cfg.vocab_size || rc.family != t->m.cfg.family)
            return glm_fail(err, "--ref_model %s is %s with %d tokens, the model trained %s with %d", a->ref_model,
                            glm_family_of(&rc)->name, rc.vocab_size, glm_family_of(&t->m.cfg)->name, t->m.cfg.vocab_size),
                   glm_hint(err, "the reference must read the same tokens: a model of the same family and tokenizer");
        glm_model_init_inference(&ref, &rc, t->be);
        snprintf(ref.merged, sizeof ref.merged, "%s", a->ref_model_adapters ? a->ref_model_adapters : "");
        if (glm_model_load(&ref, a->ref_model, err)) { glm_model_free(&ref); return glm_wrap(err, "--ref_model: "); }
        m = &ref;
    }
    int rc = ref_table(t, m, &t->data.train, &t->ref_train, err) ||
             (t->data.val.n > 0 && ref_table(t, m, &t->data.val, &t->ref_val, err));
    if (m == &ref) glm_model_free(&ref);
    if (rc) return -1;
    glm_info("--stage %s: the reference's log-probabilities of %lld training and %lld validation %s (%s, without "
             "dropout) in %.1f s", a->stage,
             (long long)t->data.train.n, (long long)t->data.val.n, glm_train_is_kto(a) ? "examples and their KL examples" : "pairs",
             a->ref_model ? a->ref_model : "the model training starts from", glm_now() - t0);
    return 0;
}

/* The reference values of a batch's P pairs (dataset positions pos) in pair order. */
static double *batch_ref(const double *tab, const int64_t *pos, int P) {
    if (!tab) return NULL;
    double *r = glm_malloc(sizeof(double) * 2 * (size_t)(P ? P : 1));
    for (int u = 0; u < P; u++) { r[2 * u] = tab[2 * pos[u]]; r[2 * u + 1] = tab[2 * pos[u] + 1]; }
    return r;
}

/* KTO's tags of a batch's P examples (dataset positions pos), from their first token's mark. */
static uint8_t *batch_tags(const glm_dataset *ds, const int64_t *pos, int P) {
    uint8_t *tags = glm_calloc((size_t)(P ? P : 1), 1);
    for (int u = 0; u < P; u++) tags[u] = (uint8_t)glm_examples_desirable(ds->ex, glm_dataset_index(ds, pos[u]));
    return tags;
}

typedef struct kl_reduce { trainer *t; int failed; glm_err err; } kl_reduce;

/* TRL's gather(kl).mean() over the ranks that have one */
static double kl_over_ranks(void *ctx, double kl, int has) {
    kl_reduce *r = ctx;
    double v[2] = {has ? kl : 0, has ? 1 : 0};
    glm_par p = {r->t->dp, r->t->pp};
    if (!r->failed && glm_par_sum(&p, v, 2, 0, "KTO's kl", &r->err)) r->failed = 1;
    return v[1] > 0 ? v[0] / v[1] : 0;
}

int trainer_pref_forward_backward(trainer *t, int k, float dscale, double *loss_sum, glm_err *err) {
    glm_pref_sums step = {0};
    int bs = t->a->per_device_train_batch_size, kto = t->pref.loss == GLM_PREF_KTO;
    glm_pref_batch *pb = glm_calloc((size_t)k, sizeof *pb);
    void **ctx = glm_calloc((size_t)k, sizeof *ctx);
    kl_reduce kr = {.t = t};
    for (int i = 0; i < k; i++) {
        const int64_t *pos = t->micro_pairs + (size_t)i * bs;
        pb[i] = (glm_pref_batch){.cfg = &t->pref, .sums = &step, .ref = batch_ref(t->ref_train, pos, t->micro[i].B / 2),
                                 .tags = kto ? batch_tags(&t->data.train, pos, t->micro[i].B / 2) : NULL,
                                 .kl_mean = kto ? kl_over_ranks : NULL, .kl_ctx = &kr};
        ctx[i] = &pb[i];
    }
    glm_par p = {t->dp, t->pp};
    glm_batch *rows = t->micro;
    if (kto) { /* the KL examples forward only first (TRL computes them without gradient); then the examples alone */
        rows = glm_calloc((size_t)k, sizeof *rows);
        if (glm_par_gather_params(&p, err)) { free(rows); return -1; } /* ZeRO-3: the whole model for the passes */
        for (int i = 0; i < k; i++) {
            int P = t->micro[i].B / 2;
            double *kl = glm_malloc(sizeof(double) * (size_t)(P ? P : 1));
            glm_pref_kl_sums(&t->m, &t->micro[i], kl);
            pb[i].kl_sums = kl;
            rows[i] = glm_batch_rows(&t->micro[i], 0, P);
        }
        glm_par_release_params(&p);
    }
    int rc = glm_par_forward_backward(&p, &t->m, rows, k, dscale, (uint64_t)t->a->seed, t->st.global_step,
                                      glm_pref_weigh, ctx, loss_sum, err);
    if (rows != t->micro) free(rows);
    for (int i = 0; i < k; i++) { free((void *)pb[i].ref); free((void *)pb[i].tags); free((void *)pb[i].kl_sums); }
    free(pb);
    free(ctx);
    if (kr.failed) { *err = kr.err; return -1; }
    if (rc || glm_par_sum(&p, (double *)&step, GLM_PREF_SUMS, 0, "preference metrics", err)) return -1;
    double *acc = (double *)&t->psums, *s = (double *)&step;
    for (int i = 0; i < GLM_PREF_SUMS; i++) acc[i] += s[i];
    return 0;
}

int trainer_pref_eval_batch(trainer *t, const glm_batch *b, double v[2], glm_err *err) {
    (void)err;
    int64_t *pos = glm_malloc(sizeof(int64_t) * (size_t)(b->B / 2 ? b->B / 2 : 1));
    int P = glm_loader_last_examples(t->eval_ld, pos, NULL, b->B / 2);
    double *ref = batch_ref(t->ref_val, pos, P);
    uint8_t *tags = t->pref.loss == GLM_PREF_KTO ? batch_tags(&t->data.val, pos, P) : NULL; /* kl: this rank's (no collective here) */
    float *tok = glm_malloc(sizeof(float) * (size_t)(b->n_targets ? b->n_targets : 1)),
          *w = glm_malloc(sizeof(float) * (size_t)(b->n_targets ? b->n_targets : 1));
    glm_forward_token_losses(&t->m, b, tok);
    glm_pref_sums before = t->esums;
    glm_pref_batch pb = {.cfg = &t->pref, .ref = ref, .sums = &t->esums, .tags = tags};
    double l = glm_pref_weigh(&pb, b, tok, t->m.bd.n_sup, w); /* the head's outputs: tokens, or rm's rows */
    v[0] += l;
    v[1] += t->esums.n - before.n;
    free(pos); free(ref); free(tok); free(w); free(tags);
    return 0;
}

int trainer_pref_pairs(const glm_batch *b) {
    int n = 0, P = b->B / 2;
    for (int r = 0; r < P; r++) { /* a pair counts when both its rows have targets (not wrap padding) */
        int c = 0, j = 0;
        for (int i = 0; i < b->T && !(c && j); i++) {
            c |= b->targets[r * b->T + i] != -100;
            j |= b->targets[(P + r) * b->T + i] != -100;
        }
        n += c && j;
    }
    return n;
}

/* json.dumps(round(v, 2)) as Python writes it: the value rounded to 2 decimals, then its shortest
 * form ("1.5", "2.0", "-0.25") */
static const char *py_round2(double v, char *buf, size_t n) {
    snprintf(buf, n, "%.2f", v);
    size_t len = strlen(buf);
    while (len > 0 && buf[len - 1] == '0' && len >= 2 && buf[len - 2] != '.') buf[--len] = 0;
    return buf;
}

/* --stage rm --do_predict: --test_file's pairs scored by the model as it is now, on the lead rank
 * (the others wait), as LLaMA-Factory's PairwiseTrainer.save_predictions writes them:
 * generated_predictions.jsonl, {"chosen": score, "rejected": score} (2 decimals) a pair in the
 * file's order, and predict_results.json (predict_loss, predict_accuracy). */
static int rm_predict_lead(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_data_cfg pc = t->dcfg; /* the training data's settings, the test file as the set */
    pc.train_file = a->test_file;
    pc.validation_file = NULL;
    pc.sources = pc.val_sources = NULL;
    pc.n_sources = pc.n_val_sources = 0;
    pc.val_size = 0;
    pc.max_train_samples = a->max_predict_samples > 0 ? a->max_predict_samples : 0;
    glm_data d = {0};
    if (glm_data_load(&d, &pc, &t->enc, err)) return glm_wrap(err, "--do_predict: ");
    glm_loader_cfg c;
    glm_loader_cfg_init(&c);
    c.batch_size = a->per_device_eval_batch_size;
    c.shuffle = 0;
    c.pairs = 1;
    c.no_loss_on_wrap = 1;
    glm_loader *l;
    if (glm_loader_open(&l, &d.train, &c, err)) { glm_data_free(&d); return -1; }
    glm_batch b = {0};
    glm_loader_batch_alloc(l, &b);
    int64_t n = d.train.n;
    double *score = glm_malloc(sizeof(double) * 2 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < 2 * n; i++) score[i] = NAN;
    float *vals = glm_malloc(sizeof(float) * (size_t)b.B), *w = glm_malloc(sizeof(float) * (size_t)b.B);
    double *rv = glm_malloc(sizeof(double) * (size_t)b.B);
    int64_t *pos = glm_malloc(sizeof(int64_t) * (size_t)c.batch_size);
    glm_pref_sums sums = {0};
    int rc = 0;
    for (int64_t s = 0, ns = glm_loader_steps_per_epoch(l); s < ns && rc == 0; s++) {
        if ((rc = glm_loader_next(l, &b, err))) break;
        int P = glm_loader_last_examples(l, pos, NULL, c.batch_size);
        glm_forward_token_losses(&t->m, &b, vals); /* one score a row with targets, in row order */
        glm_pref_batch pb = {.cfg = &t->pref, .sums = &sums};
        glm_pref_weigh(&pb, &b, vals, t->m.bd.n_sup, w);
        glm_pref_row_values(&b, vals, t->m.bd.n_sup, rv);
        for (int u = 0; u < P; u++) { /* the pair: chosen rows first */
            score[2 * pos[u]] = rv[u];
            score[2 * pos[u] + 1] = rv[b.B / 2 + u];
        }
    }
    char path[4096], line[160], cs[48], rs[48];
    glm_strbuf out = {0};
    for (int64_t i = 0; i < n && rc == 0; i++) {
        if (isnan(score[2 * i]) || isnan(score[2 * i + 1])) continue;
        snprintf(line, sizeof line, "{\"chosen\": %s, \"rejected\": %s}\n", py_round2(score[2 * i], cs, sizeof cs),
                 py_round2(score[2 * i + 1], rs, sizeof rs));
        glm_strbuf_str(&out, line);
    }
    glm_path_join(path, sizeof path, a->output_dir, "generated_predictions.jsonl");
    if (rc == 0) rc = glm_write_file_atomic(path, out.s ? out.s : "", out.n, err);
    double loss = sums.n > 0 ? sums.loss / sums.n : NAN, acc = sums.n > 0 ? sums.correct / sums.n : NAN;
    char text[256];
    snprintf(text, sizeof text, "{\n    \"predict_accuracy\": %.17g,\n    \"predict_loss\": %.17g\n}\n", acc, loss);
    glm_path_join(path, sizeof path, a->output_dir, "predict_results.json");
    if (rc == 0) rc = glm_write_file_atomic(path, text, strlen(text), err);
    if (rc == 0) {
        fprintf(stderr, "{'predict_loss': %.4f, 'predict_accuracy': %.4f}\n", loss, acc);
        glm_info("--do_predict: %.0f pairs of %s scored into %s/generated_predictions.jsonl", sums.n, a->test_file,
                 a->output_dir);
    }
    free(out.s); free(score); free(vals); free(w); free(rv); free(pos);
    glm_batch_free(&b);
    glm_loader_free(l);
    glm_data_free(&d);
    return rc;
}

int trainer_rm_predict(trainer *t, glm_err *err) {
    glm_par p = {t->dp, t->pp};
    if (glm_par_gather_params(&p, err)) return -1; /* ZeRO-3: every rank takes part */
    glm_err mine = {0};
    int rc = lead(t) ? rm_predict_lead(t, &mine) : 0;
    glm_par_release_params(&p);
    double failed = rc != 0;
    if (glm_par_sum(&p, &failed, 1, 1, "--do_predict's scores", err)) return -1;
    if (rc) { *err = mine; return -1; }
    if (failed > 0) return glm_fail(err, "rank 0 failed while scoring --test_file (see its error)");
    return 0;
}
