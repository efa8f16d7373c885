/* Train/validation sets: loading, the val_size split, the start-up summary. See data.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/rng.h"
#include "data/data.h"

void glm_data_cfg_init(glm_data_cfg *c) {
    *c = (glm_data_cfg){0};
    glm_example_cfg_init(&c->example);
    c->seed = 42; /* HF TrainingArguments.seed default */
}

void glm_data_default_cache_dir(char *buf, size_t n) {
    const char *d = getenv("GLM_CACHE_DIR"), *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (d && d[0]) snprintf(buf, n, "%s", d);
    else if (x && x[0]) snprintf(buf, n, "%s/glmtrain", x);
    else snprintf(buf, n, "%s/.cache/glmtrain", h && h[0] ? h : ".");
}

/* "3 malformed JSON, 1 bad record, ..." for error messages and the summary. */
static void skipped_text(char *dst, size_t n, const glm_data_summary *s) {
    snprintf(dst, n, "%lld malformed JSON, %lld bad records, %lld empty query/answer, %lld answers encoding to nothing",
             (long long)s->bad_json, (long long)s->bad_record, (long long)s->empty, (long long)s->no_answer_tokens);
}

static int load_one(glm_examples **ex, const char *path, const char *what, const glm_data_cfg *cfg,
                    const glm_encoder *enc, glm_err *err) {
    if (glm_examples_load(ex, path, cfg, enc, err)) return -1;
    if ((*ex)->n > 0) return 0;
    const glm_data_summary *s = &(*ex)->summary;
    char sk[256];
    skipped_text(sk, sizeof sk, s);
    glm_fail(err, "%s %s has no usable examples (%lld records; skipped: %s)%s%s", what, path,
             (long long)s->records, sk, s->first_bad[0] ? "; first bad record: " : "", s->first_bad);
    glm_hint(err, s->records == 0 ? "the file holds no records: check the path and that it is a JSON array or JSON Lines"
                                  : "check the column names (--prompt_column/--response_column) and the data format");
    glm_examples_free(*ex);
    *ex = NULL;
    return -1;
}

/* The smaller of two record limits, 0 being none. */
static int64_t min_limit(int64_t a, int64_t b) { return a <= 0 ? b : b <= 0 ? a : a < b ? a : b; }

/* The examples of sources[0..n), each read with its own settings, one after another; at most
 * `limit` records in all (0: no limit) and cfg->max_samples of each. */
static int load_sources(glm_examples **out, const glm_data_source *sources, int n, int64_t limit, const glm_data_cfg *cfg,
                        const glm_encoder *enc, glm_err *err) {
    glm_examples **parts = glm_calloc((size_t)n, sizeof *parts);
    char names[4096] = "", what[200];
    int rc = 0, k = 0;
    int64_t left = limit; /* records still to read (> 0), when limited */
    for (; k < n && rc == 0; k++) {
        const glm_data_source *src = &sources[k];
        glm_data_cfg c = *cfg;
        c.read = src->read;
        c.read.skip_bad_samples = cfg->read.skip_bad_samples;
        c.read.texts = cfg->read.texts; /* --stage pt reads the entry's prompt column as text */
        if (src->read.kto && !cfg->read.kto) {
            rc = glm_fail(err, "dataset %s is KTO data (columns.kto_tag): train it with --stage kto", src->name);
            break;
        }
        c.read.kto = cfg->read.kto; /* --stage kto reads every entry's tags ("kto_tag" or "label" where none is named) */
        if (c.read.pairs != cfg->read.pairs) {
            rc = cfg->read.pairs ? (glm_fail(err, "dataset %s is not ranking data, but --stage dpo and rm train on preference pairs",
                                             src->name),
                                    glm_hint(err, "name ranking datasets (\"ranking\": true, with chosen and rejected columns)"))
                                 : (glm_fail(err, "dataset %s is ranking (preference) data: train it with --stage dpo (or rm)", src->name),
                                    glm_hint(err, "--stage sft trains on instruction data; drop this dataset or give --stage dpo or rm"));
            break;
        }
        if (limit > 0 && left <= 0) break; /* the first N records are all read */
        c.read.max_records = min_limit(limit > 0 ? left : 0, cfg->max_samples);
        snprintf(what, sizeof what, "dataset %s:", src->name);
        rc = load_one(&parts[k], src->path, what, &c, enc, err);
        if (rc == 0) left -= parts[k]->summary.records;
        size_t at = strlen(names);
        snprintf(names + at, sizeof names - at, "%s%s", k ? "," : "", src->name);
    }
    if (rc == 0) {
        char path[4200];
        snprintf(path, sizeof path, "datasets %s", names);
        *out = glm_examples_concat(parts, k, path);
    }
    for (int i = 0; i < k; i++) glm_examples_free(parts[i]);
    free(parts);
    return rc;
}

int glm_data_load(glm_data *d, const glm_data_cfg *cfg, const glm_encoder *enc, glm_err *err) {
    *d = (glm_data){0};
    if (!cfg->train_file && cfg->n_sources == 0) return glm_fail(err, "no --train_file given");
    if (cfg->val_size < 0 || (cfg->val_size >= 1 && cfg->val_size != floor(cfg->val_size)))
        return glm_fail(err, "--val_size %g must be a fraction in [0, 1) or a whole count", cfg->val_size);
    glm_data_cfg tc = *cfg; /* the train file's: only its records are limited */
    tc.read.max_records = min_limit(cfg->max_train_samples, cfg->max_samples);
    if (cfg->n_sources ? load_sources(&d->train_ex, cfg->sources, cfg->n_sources, cfg->max_train_samples, cfg, enc, err)
                       : load_one(&d->train_ex, cfg->train_file, "train file", &tc, enc, err))
        return -1;
    int64_t n = d->train_ex->n;
    d->train = (glm_dataset){d->train_ex, NULL, n};
    d->val_size = cfg->val_size;
    d->seed = cfg->seed;
    if (cfg->validation_file || cfg->n_val_sources) {
        if (cfg->n_val_sources ? load_sources(&d->val_ex, cfg->val_sources, cfg->n_val_sources, 0, cfg, enc, err)
                               : load_one(&d->val_ex, cfg->validation_file, "validation file", cfg, enc, err)) {
            glm_data_free(d);
            return -1;
        }
        d->val = (glm_dataset){d->val_ex, NULL, d->val_ex->n};
        return 0;
    }
    if (cfg->val_size <= 0) return 0;
    /* HF train_test_split: a fraction is rounded up; the test share is a seeded random subset */
    int64_t nv = cfg->val_size < 1 ? (int64_t)ceil(cfg->val_size * (double)n) : (int64_t)cfg->val_size;
    if (nv >= n) {
        glm_fail(err, "--val_size %g takes %lld of the %lld train examples, leaving none to train on",
                 cfg->val_size, (long long)nv, (long long)n);
        glm_data_free(d);
        return glm_hint(err, "lower --val_size or pass a --validation_file");
    }
    int32_t *perm = glm_malloc((size_t)n * sizeof *perm);
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    glm_rng rng;
    glm_rng_seed(&rng, cfg->seed ^ 0x76616c73706c6974ULL); /* "valsplit": independent of the epoch shuffles */
    glm_rng_shuffle_i32(&rng, perm, (int)n);
    /* both sides keep file order (membership is what the split decides) */
    uint8_t *is_val = glm_calloc((size_t)n, 1);
    for (int64_t i = 0; i < nv; i++) is_val[perm[i]] = 1;
    d->idx_ = glm_malloc((size_t)n * sizeof *d->idx_);
    int64_t *tr = d->idx_, *va = d->idx_ + (n - nv), kt = 0, kv = 0;
    for (int64_t i = 0; i < n; i++) { if (is_val[i]) va[kv++] = i; else tr[kt++] = i; }
    d->train = (glm_dataset){d->train_ex, tr, n - nv};
    d->val = (glm_dataset){d->train_ex, va, nv};
    free(perm); free(is_val);
    return 0;
}

void glm_data_free(glm_data *d) {
    glm_examples_free(d->train_ex);
    glm_examples_free(d->val_ex);
    free(d->idx_);
    *d = (glm_data){0};
}

void glm_examples_print_summary(FILE *f, const char *name, const glm_examples *ex, const glm_example_cfg *ec) {
    const glm_data_summary *s = &ex->summary;
    fprintf(f, "%s: %s (%s%s)%s%s%s%s\n", name, ex->path, glm_schema_name((glm_schema)s->schema), s->bom ? ", UTF-8 BOM" : "",
            ex->cache_path[0] ? "; cache " : "", ex->cache_note, ex->cache_path[0] ? ": " : "", ex->cache_path);
    char sk[256];
    skipped_text(sk, sizeof sk, s);
    fprintf(f, "  records %lld, examples %lld; skipped: %s\n", (long long)s->records, (long long)s->examples, sk);
    if (s->first_bad[0]) fprintf(f, "  first bad record: %s\n", s->first_bad);
    if (ec->cutoff_len > 0) /* LLaMA-Factory's cut: a conversation's turns count as prompts and answers */
        fprintf(f, "  truncated by --cutoff_len %d: %lld prompts, %lld answers\n", ec->cutoff_len,
                (long long)s->truncated_prompt, (long long)s->truncated_answer);
    else
        fprintf(f, "  truncated: %lld prompts (max_source_length %d), %lld answers (max_target_length %d)\n",
                (long long)s->truncated_prompt, ec->max_source_length, (long long)s->truncated_answer, ec->max_target_length);
    fprintf(f, "  tokens %lld (%lld supervised), longest %lld, shortest %lld, mean %.1f\n", (long long)s->tokens,
            (long long)s->supervised, (long long)s->longest, (long long)s->shortest,
            s->examples ? (double)s->tokens / (double)s->examples : 0.0);
}

void glm_data_print_summary(FILE *f, const glm_data *d, const glm_data_cfg *cfg) {
    glm_examples_print_summary(f, "train data", d->train_ex, &cfg->example);
    if (d->val_ex) glm_examples_print_summary(f, "validation data", d->val_ex, &cfg->example);
    if (!d->val_ex && d->val.n > 0)
        fprintf(f, "  split: %lld train / %lld validation (val_size %g, seed %llu)\n", (long long)d->train.n,
                (long long)d->val.n, d->val_size, (unsigned long long)d->seed);
    else if (!d->val_ex)
        fprintf(f, "  no validation set\n");
}
