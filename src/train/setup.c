/* Set-up of a training run (train/trainer.h): backend, tokenizer, data and loaders, the step
 * plan, and the output folder check (the flags' checks: check_args.c; the model: model_setup.c). */
#include "train/trainer.h"
#include <errno.h>
#include <limits.h>
#include "data/thought.h"
#include "data/dataset_info.h"
#include "optim/schedule.h"
#include "data/hash.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

/* The seed of the training rows' order: --data_seed, or --seed when it is not given (the
 * Trainer's data_seed). -1 with err for text that is not a whole number of int's range. */
int trainer_data_seed(const glm_train_args *a, int *out, glm_err *err) {
    *out = a->seed;
    if (!a->data_seed) return 0;
    char *end;
    errno = 0;
    long v = strtol(a->data_seed, &end, 10);
    if (end == a->data_seed || *end || errno || v < INT_MIN || v > INT_MAX)
        return glm_fail(err, "--data_seed %s: not a whole number", a->data_seed), glm_hint(err, "e.g. --data_seed 42, or leave it out to use --seed");
    *out = (int)v;
    return 0;
}

int trainer_pick_backend(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_dtype dt = a->fp32 ? GLM_F32 : a->fp16 ? GLM_F16 : GLM_BF16;
    char why[512];
    if (glm_backend_open(a->device, glm_local_device(t->dp->dist.local_rank), &dt, 1, &t->be, why, sizeof why, err))
        return -1;
    if (t->be && glm_backend_on_gpu(t->be)) {
        if (a->tf32 && t->be->capability < 80) { /* as Hugging Face's Trainer: TF32 is Ampere's */
            t->be->destroy(t->be);
            t->be = NULL;
            glm_fail(err, "--tf32 needs an Ampere or newer GPU (compute capability 8.0+); this one has no TF32");
            return glm_hint(err, "drop --tf32: the fp32 products then run in plain fp32");
        }
        t->be->allow_tf32 = a->tf32; /* Ampere and newer (checked above) */
        t->be->deterministic = a->full_determinism;
        t->be->tune_products = 1;
        if (a->tf32 && dt != GLM_F32)
            glm_warn("--tf32 changes only fp32 products; this run's are %s (pass --fp32 with --tf32)", a->fp16 ? "fp16" : "bf16");
        return 0;
    }
    if (!t->be && glm_cuda_device_count() > 0) { /* a GPU this run cannot use as asked: say so, do not crawl on the CPU */
        glm_fail(err, "%s", why);
        return glm_hint(err, "or pass --device cpu to train on the CPU");
    }
    if (!t->be && why[0]) glm_info("no usable GPU (%s); training on the CPU", why);
    if (a->tf32 || a->bf16 || a->fp16) { /* the CPU trains in plain fp32 */
        if (t->be) t->be->destroy(t->be);
        t->be = NULL;
        if (a->tf32) {
            glm_fail(err, "--tf32 needs an NVIDIA GPU (Ampere or newer): the CPU backend has no TF32");
            return glm_hint(err, "drop --tf32 to train on the CPU in plain fp32");
        }
        glm_fail(err, "--%s needs a GPU; the CPU backend trains in fp32", a->bf16 ? "bf16" : "fp16");
        return glm_hint(err, "drop --%s (or pass --fp32) to train on the CPU", a->bf16 ? "bf16" : "fp16");
    }
    if (!t->be) t->be = glm_backend_cpu();
    return 0;
}

int trainer_load_tokenizer(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    const char *p = a->tokenizer_name ? a->tokenizer_name : a->model_name_or_path;
    char dir[4096];
    if (!p) { /* random init: look beside the config */
        snprintf(dir, sizeof dir, "%s", a->init_from_config);
        char *slash = strrchr(dir, '/');
        if (glm_is_file(dir)) { if (slash) *slash = 0; else snprintf(dir, sizeof dir, "."); }
        p = dir;
    }
    snprintf(t->tok_path, sizeof t->tok_path, "%s", p);
    if (glm_tokenizer_load(&t->tok, p, err)) return glm_hint(err, "pass --tokenizer_name with the folder holding ice_text.model");
    if (glm_tokenizer_vocab_size(t->tok) > t->m.cfg.vocab_size) {
        glm_fail(err, "tokenizer %s has %d pieces but the model's vocab_size is %d", p, glm_tokenizer_vocab_size(t->tok),
                 t->m.cfg.vocab_size);
        return glm_hint(err, "use the tokenizer that belongs to the model");
    }
    return glm_encoder_from_tokenizer(&t->enc, t->tok, p, err);
}

/* Rank 0 tokenizes (or validates) the cache first; the others wait without the collective
 * timeout (that can take long on a big file), then read the cache it wrote. */
static int data_vote(trainer *t, double *failed, glm_err *err) {
    const char *what = "data cache built by rank 0";
    glm_par p = {t->dp, t->pp};
    return glm_par_sum(&p, failed, 1, 1, what, err);
}

static int load_data_ranked(trainer *t, glm_err *err) {
    if (!lead(t)) {
        double failed = 0;
        if (data_vote(t, &failed, err)) return -1;
        if (failed > 0) return glm_fail(err, "rank %d: rank 0 could not load the data (see its error)", t->dp->rank);
    }
    int rc = glm_data_load(&t->data, &t->dcfg, &t->enc, err);
    if (lead(t)) {
        double failed = rc != 0;
        glm_err e2;
        if (data_vote(t, &failed, rc ? &e2 : err)) return -1;
    }
    return rc;
}


/* The text of ids[0..n) with every token as itself, special tokens by name (what the model reads). */
/* The tokens' bytes as text: valid UTF-8 as it is, any other byte as SentencePiece names a byte
 * piece (<0xE5>), so a character that truncation cut, or a run of byte pieces, stays readable
 * text on the terminal and in log files. */
static void put_tokens(FILE *f, const glm_tokenizer *tok, const int32_t *ids, int n) {
    char *all = NULL;
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        size_t k;
        char *b = glm_tokenizer_token_bytes(tok, ids[i], &k);
        all = glm_realloc(all, len + k + 1);
        memcpy(all + len, b, k);
        len += k;
        free(b);
    }
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)all[i];
        size_t k = c < 0x80 ? 1 : c >> 5 == 6 ? 2 : c >> 4 == 14 ? 3 : c >> 3 == 30 ? 4 : 0;
        if (k && i + k <= len && glm_utf8_valid(all + i, k)) { fwrite(all + i, 1, k, f); i += k; }
        else { fprintf(f, "<0x%02X>", c); i++; }
    }
    free(all);
}

/* The first training example as the model sees it, the way THUDM's ptuning (print_dataset_example)
 * and LLaMA-Factory show it before training: where a template or a label went wrong, it shows. */
static void print_first_example(FILE *f, const glm_tokenizer *tok, const glm_examples *ex) {
    if (ex->n == 0) return;
    int n = glm_examples_len(ex, 0), targets = 0;
    int32_t *lab = glm_malloc(sizeof *lab * (size_t)(n + 1));
    glm_examples_labels(ex, 0, lab);
    for (int i = 0; i < n; i++) targets += lab[i] != -100;
    const int32_t *ids = ex->ids + ex->off[0];
    fprintf(f, "[glmtrain] the first training example (%d tokens, %d of them targets; special tokens by name):\ninputs: ", n,
            targets);
    put_tokens(f, tok, ids, n);
    fprintf(f, "\nlabels: "); /* the target tokens, \u22ef where tokens without a target come between them */
    for (int i = 0, any = 0; i < n;) {
        if (lab[i] == -100) { i++; continue; }
        int j = i;
        while (j < n && lab[j] != -100) j++; /* a run of targets, written as one text */
        if (any) fputs(" \u22ef ", f);
        any = 1;
        put_tokens(f, tok, &lab[i], j - i);
        i = j;
    }
    fputc('\n', f);
    free(lab);
}

int trainer_load_data(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_data_cfg *d = &t->dcfg;
    glm_data_cfg_init(d);
    d->train_file = a->train_file;
    d->validation_file = a->validation_file;
    if (a->dataset) {
        if (glm_dataset_info_sources(a->dataset_dir, a->dataset, &t->sources, &d->n_sources, err)) return -1;
        d->sources = t->sources;
    }
    if (a->eval_dataset) {
        if (a->validation_file)
            return glm_fail(err, "--eval_dataset and --validation_file both name the validation set"), glm_hint(err, "give one");
        if (glm_dataset_info_sources(a->dataset_dir, a->eval_dataset, &t->val_sources, &d->n_val_sources, err)) return -1;
        d->val_sources = t->val_sources;
        if (a->val_size > 0) /* LLaMA-Factory splits off val_size only without an eval_dataset */
            glm_info("--val_size %g is not used: --eval_dataset %s is the validation set", a->val_size, a->eval_dataset);
    }
    if (!a->do_train) { /* an evaluation alone: of the validation set, or else of the training data itself */
        if (!a->do_eval && !d->train_file && !d->n_sources) /* --stage rm's scores alone: the loader reads the test file */
            d->train_file = d->validation_file = a->test_file;
        if (!d->validation_file && !d->n_val_sources && a->val_size <= 0) {
            d->validation_file = a->train_file;
            d->val_sources = d->sources;
            d->n_val_sources = d->n_sources;
        }
        if (!d->train_file && !d->n_sources) { /* the loader wants a training set: the same data */
            d->train_file = d->validation_file;
            d->sources = d->val_sources;
            d->n_sources = d->n_val_sources;
        }
        if (!d->validation_file && !d->n_val_sources && !(a->val_size > 0))
            return glm_fail(err, "--do_train false --do_eval: no data to evaluate"),
                   glm_hint(err, "give --validation_file FILE (or --train_file, --dataset, --eval_dataset)");
    }
    if (a->template && glm_lf_template_check(a->template, t->enc.layout, err)) return -1;
    const char *tp = a->tokenizer_name ? a->tokenizer_name : a->model_name_or_path;
    if (!a->template && t->enc.layout == GLM_LAYOUT_GLM4 && glm_tokenizer_template_thinks(tp))
        glm_info("%s's chat template writes <think> thoughts (GLM-Z1): give --template glmz1 to train as LLaMA-Factory's "
                 "glmz1 (answers without a thought get the empty one; --enable_thinking)", tp);
    if ((a->dataset || a->template) && a->quantization_bit == 4 && !strcmp(a->quantization_type, "int"))
        glm_warn("--quantization_bit 4 is THUDM's INT4 here; LLaMA-Factory's is bitsandbytes NF4: add --quantization_type nf4 for that");
    if (glm_schema_parse(strcmp(a->data_format, "chatglm") == 0 ? "columns" : a->data_format, &d->read.schema))
        return glm_fail(err, "--data_format %s is not known", a->data_format);
    d->read.pairs = glm_train_is_pref(a) && !glm_train_is_kto(a); /* KTO's second row is built, not read */
    d->read.kto = d->example.kto = glm_train_is_kto(a);
    if (d->read.kto) d->example.pt_group = a->preprocessing_batch_size;
    d->read.texts = glm_train_is_pt(a);
    if (d->read.texts) {
        if (t->enc.layout == GLM_LAYOUT_GLM)
            return glm_fail(err, "--stage pt with a ChatGLM-6B tokenizer: ChatGLM-6B is a prefix-LM (GLM's blank infilling), "
                                 "and plain next-token blocks would let every token see the ones it predicts"),
                   glm_hint(err, "continue pre-training a ChatGLM2/3 or GLM-4 model, or train ChatGLM-6B with --stage sft");
        if (t->enc.text_eos < 0) return glm_fail(err, "--stage pt: the tokenizer has no eos token to end each text with");
        d->example.pt_block = a->cutoff_len;
        d->example.pt_group = a->preprocessing_batch_size;
    }
    d->read.columns.prompt = a->prompt_column;
    d->read.columns.response = a->response_column;
    d->read.columns.history = a->history_column;
    d->read.skip_bad_samples = a->skip_bad_samples;
    d->example.max_source_length = a->max_source_length;
    d->example.max_target_length = a->max_target_length;
    d->example.cutoff_len = a->cutoff_len;
    d->example.mask_history = a->mask_history;
    d->example.source_prefix = a->source_prefix;
    d->example.default_system = a->default_system;
    if (a->prompt_template) glm_unescape(a->prompt_template);
    if (a->history_template) glm_unescape(a->history_template);
    d->example.prompt_template = a->prompt_template;
    d->example.history_template = a->history_template;
    d->example.train_on_prompt = a->train_on_prompt;
    d->example.reasoning = glm_lf_template_reasons(a->template);
    d->example.disable_thinking = d->example.reasoning && !a->enable_thinking;
    if (!a->enable_thinking && !d->example.reasoning)
        glm_info("--enable_thinking false changes nothing without --template glmz1 (the other templates have no thoughts)");
    if (glm_conv_labels_parse(a->conversation_labels, &d->example.conv_labels))
        return glm_fail(err, "--conversation_labels %s is not known (thudm or eos)", a->conversation_labels);
    if (glm_example_cfg_check(&d->example, err)) return -1;
    d->val_size = a->eval_dataset ? 0 : a->val_size;
    if (a->max_train_samples < 0) return glm_fail(err, "--max_train_samples %d: must be 0 (all) or a count", a->max_train_samples);
    d->max_train_samples = a->max_train_samples;
    d->max_samples = a->max_samples;
    if (a->plot_loss)
        glm_info("--plot_loss: no PNG is drawn; the loss is in checkpoint-N/trainer_state.json (and TensorBoard with --report_to tensorboard)");
    d->seed = (uint64_t)a->seed;
    d->num_threads = a->preprocessing_num_workers > 0 ? a->preprocessing_num_workers : a->dataloader_num_workers;
    d->overwrite_cache = a->overwrite_cache;
    if (a->cache_dir) snprintf(t->cache_dir, sizeof t->cache_dir, "%s", a->cache_dir);
    else glm_path_join(t->cache_dir, sizeof t->cache_dir, a->output_dir, ".cache");
    d->cache_dir = t->cache_dir;
    if (load_data_ranked(t, err)) return -1;
    glm_data_print_summary(stderr, &t->data, d);
    print_first_example(stderr, t->tok, t->data.train_ex);
    const glm_examples *ex = t->data.train_ex; /* the examples as trained: file, tokenizer and settings together */
    t->data_hash = glm_xxh64(ex->sup, (size_t)ex->n_tokens, glm_xxh64(ex->ids, (size_t)ex->n_tokens * 4, 0x5eed));
    glm_loader_cfg lc;
    glm_loader_cfg_init(&lc);
    lc.batch_size = a->per_device_train_batch_size;
    lc.group_by_length = a->group_by_length;
    lc.packing = a->packing;
    lc.pairs = glm_train_is_pref(a);
    lc.drop_last = a->dataloader_drop_last;
    lc.shuffle = !a->disable_shuffling;
    int order_seed;
    if (trainer_data_seed(a, &order_seed, err)) return -1;
    lc.seed = (uint64_t)order_seed;
    lc.rank = t->dp->rank;
    lc.world = t->dp->world;
    if (lc.packing) lc.max_len = glm_train_seq_len(a);
    if (glm_loader_open(&t->train_ld, &t->data.train, &lc, err)) return -1;
    if (t->data.val.n > 0) {
        glm_loader_cfg ec;
        glm_loader_cfg_init(&ec);
        ec.batch_size = a->per_device_eval_batch_size;
        ec.shuffle = 0;
        ec.no_loss_on_wrap = 1; /* eval counts each example once over the ranks */
        ec.pairs = lc.pairs;
        ec.rank = t->dp->rank;
        ec.world = t->dp->world;
        if (glm_loader_open(&t->eval_ld, &t->data.val, &ec, err)) return -1;
        glm_loader_batch_alloc(t->eval_ld, &t->eval_batch);
    }
    t->micro = glm_calloc(a->gradient_accumulation_steps, sizeof(glm_batch));
    for (int i = 0; i < a->gradient_accumulation_steps; i++) glm_loader_batch_alloc(t->train_ld, &t->micro[i]);
    if (glm_train_is_pref(a)) return trainer_pref_setup(t, err);
    return 0;
}

/* A step interval in steps: a ratio below 1 of the run's steps, rounded up as the Trainer does. */
static long interval_steps(double v, long total) { return v < 1 ? (long)ceil(v * (double)total) : (long)v; }

int trainer_plan_steps(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    t->micro_per_epoch = glm_loader_steps_per_epoch(t->train_ld);
    t->steps_per_epoch = (t->micro_per_epoch + a->gradient_accumulation_steps - 1) / a->gradient_accumulation_steps;
    if (t->steps_per_epoch < 1) t->steps_per_epoch = 1;
    t->total_steps = a->max_steps > 0 ? a->max_steps : (long)ceil(a->num_train_epochs * t->steps_per_epoch);
    t->warmup = a->warmup_steps > 0 ? a->warmup_steps : (long)ceil(a->warmup_ratio * t->total_steps);
    t->log_every = interval_steps(a->logging_steps, t->total_steps);
    t->eval_every = a->eval_steps > 0 ? interval_steps(a->eval_steps, t->total_steps) : t->log_every;
    t->save_every = interval_steps(a->save_steps, t->total_steps);
    if (t->log_every < 1) t->log_every = 1; /* a ratio of a run of no steps */
    if (t->eval_every < 1) t->eval_every = 1;
    if (t->save_every < 1) t->save_every = 1;
    t->sched = (glm_lr_sched){.base_lr = (float)a->learning_rate, .warmup = t->warmup, .total = t->total_steps};
    glm_lr_kind_parse(a->lr_scheduler_type, &t->sched.kind);
    if (glm_lr_kwargs(&t->sched, a->lr_scheduler_kwargs, err)) return -1; /* the warmup of a ratio may round to 0 */
    if (a->ds.sched) { /* a --deepspeed file's scheduler replaces --lr_scheduler_type, as in the Trainer */
        t->sched.kind = (glm_lr_kind)a->ds.sched;
        t->sched.log_warmup = a->ds.log_warmup;
        t->sched.min_lr = a->ds.min_lr;
        t->sched.warmup_min_ratio = a->ds.warmup_min_ratio;
        t->sched.cos_min_ratio = a->ds.cos_min_ratio;
    }
    return glm_ds_check_plan(a, t->dp->world, t->total_steps, t->warmup, err);
}

int trainer_check_output_dir(glm_train_args *a, glm_err *err) {
    if (!glm_is_dir(a->output_dir)) return glm_mkdirs(a->output_dir, err);
    char probe[4096];
    glm_path_join(probe, sizeof probe, a->output_dir, "config.json");
    char latest[4096];
    int has = glm_is_file(probe) || glm_checkpoint_latest(a->output_dir, latest, sizeof latest) == 0;
    if (has && !a->overwrite_output_dir && !a->resume_from_checkpoint && a->do_train) {
        glm_fail(err, "output directory %s already holds a model or checkpoints", a->output_dir);
        return glm_hint(err, "pass --resume_from_checkpoint to continue it, --overwrite_output_dir to start over, or another --output_dir");
    }
    return 0;
}

/* Once per run, on the lead rank (every rank calls trainer_check_output_dir, so it cannot
 * delete): the run's id, then what would make this run trip on another's files. A fresh start
 * with --overwrite_output_dir removes the previous run's checkpoints, which resume and rotation
 * would otherwise take for this run's; tmp-checkpoint-* of a killed save are removed always. */
int trainer_prepare_output_dir(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_run_id_new(t->st.run_id, sizeof t->st.run_id); /* resume replaces it with the checkpoint's */
    if (!lead(t) || !a->do_train) return 0; /* an evaluation alone writes eval_results.json and removes nothing */
    if (a->overwrite_output_dir && a->resume_from_checkpoint)
        glm_info("--overwrite_output_dir with --resume_from_checkpoint: keeping the checkpoints in %s to resume from", a->output_dir);
    else if (a->overwrite_output_dir && glm_checkpoint_remove_all(a->output_dir, err))
        return -1;
    if (!a->resume_from_checkpoint && glm_output_run_id_write(a->output_dir, t->st.run_id, err)) return -1;
    return glm_checkpoint_clean_stale(a->output_dir, err);
}
