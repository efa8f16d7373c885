#include "train/train.h"
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "data/data.h"
#include "data/loader.h"
#include "io/safetensors.h"
#include "io/tensorboard.h"
#include "model/glm.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "optim/schedule.h"
#include "parallel/dp.h"
#include "parallel/dp_stats.h"
#include "parallel/gpustat.h"
#include "parallel/launch.h"
#include "parallel/pipe_train.h"
#include "parallel/signals.h"
#include "tokenizer/tokenizer.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "train/checkpoint.h"
#include "train/progress.h"

/* Everything one training run holds, passed explicitly. */
typedef struct trainer {
    glm_train_args *a;
    glm_backend *be;
    glm_model m;
    glm_adamw opt;
    glm_tokenizer *tok;
    char tok_path[4096], cache_dir[4096];
    glm_encoder enc;
    glm_data_cfg dcfg;
    glm_data data;
    glm_loader *train_ld, *eval_ld;
    glm_batch *micro;         /* [accum] host batches of one optimizer step */
    glm_batch eval_batch;
    tb_writer *tb;
    glm_progress prog;
    glm_train_state st;
    glm_loss_scaler scaler;
    glm_lr_kind sched;
    long total_steps, warmup, steps_per_epoch, micro_per_epoch;
    char *args_json;
    cJSON *history;           /* log_history records */
    glm_dp *dp;               /* data parallel (a no-op with one process) */
    glm_gpustat *gs;          /* NVML figures of this rank's GPU, NULL on the CPU */
    glm_pp *pp;               /* pipeline stages (--pipeline_parallel_size > 1), else NULL */
} trainer;

/* The job's first rank: with pipeline stages dp->rank is the replica within a stage. */
static int lead(const trainer *t) { return t->pp ? t->pp->world_rank == 0 : t->dp->rank == 0; }

int glm_train_check_args(glm_train_args *a, glm_err *err) {
    if (!a->output_dir) return glm_fail(err, "--output_dir is required"), glm_hint(err, "e.g. --output_dir out/my-run");
    if (!a->train_file) return glm_fail(err, "--train_file is required"), glm_hint(err, "a .json or .jsonl file of {\"instruction\", \"output\"} records");
    if (!a->model_name_or_path && !a->init_from_config)
        return glm_fail(err, "one of --model_name_or_path or --init_from_config is required"),
               glm_hint(err, "--model_name_or_path takes a Hugging Face style chatglm-6b folder");
    if (a->per_device_train_batch_size < 1) return glm_fail(err, "--per_device_train_batch_size must be at least 1");
    if (a->per_device_eval_batch_size < 1) return glm_fail(err, "--per_device_eval_batch_size must be at least 1");
    if (a->gradient_accumulation_steps < 1) return glm_fail(err, "--gradient_accumulation_steps must be at least 1");
    if (a->learning_rate < 0) return glm_fail(err, "--learning_rate must not be negative");
    if (a->num_train_epochs <= 0 && a->max_steps <= 0) return glm_fail(err, "--num_train_epochs must be positive (or set --max_steps)");
    if (a->logging_steps < 1) return glm_fail(err, "--logging_steps must be at least 1");
    if (a->bf16 + a->fp16 + a->fp32 > 1) return glm_fail(err, "choose one of --bf16, --fp16, --fp32");
    if (a->warmup_ratio < 0 || a->warmup_ratio > 1) return glm_fail(err, "--warmup_ratio must be in [0, 1]");
    if (!(a->fp16_initial_scale > 0)) return glm_fail(err, "--fp16_initial_scale must be positive");
    if (a->save_total_limit < 0) return glm_fail(err, "--save_total_limit must not be negative");
    if (strcmp(a->save_strategy, "steps") == 0 && a->save_steps < 1) return glm_fail(err, "--save_steps must be at least 1");
    if (a->pipeline_parallel_size < 1) return glm_fail(err, "--pipeline_parallel_size must be at least 1");
    if (a->num_microbatches < 0) return glm_fail(err, "--num_microbatches must not be negative");
    if (a->num_microbatches > 0) a->gradient_accumulation_steps = a->num_microbatches; /* the same count, pipeline's name */
    return 0;
}

static int pick_backend(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    int want_cuda = strcmp(a->device, "cuda") == 0;
#ifdef GLM_HAVE_CUDA
    if (strcmp(a->device, "cpu") != 0) {
        char msg[512] = "";
        glm_dtype dt = a->fp32 ? GLM_F32 : a->fp16 ? GLM_F16 : GLM_BF16;
        t->be = glm_backend_cuda(glm_local_device(t->dp->dist.local_rank), dt, msg, sizeof msg);
        if (t->be) return 0;
        if (want_cuda) return glm_fail(err, "--device cuda: %s", msg);
        glm_info("no usable GPU (%s); training on the CPU", msg);
    }
#else
    if (want_cuda) {
        glm_fail(err, "--device cuda: this glmtrain was built without CUDA");
        return glm_hint(err, "rebuild on a machine with nvcc (make), or use --device cpu");
    }
#endif
    if (a->bf16 || a->fp16) {
        glm_fail(err, "--%s needs a GPU; the CPU backend trains in fp32", a->bf16 ? "bf16" : "fp16");
        return glm_hint(err, "drop --%s (or pass --fp32) to train on the CPU", a->bf16 ? "bf16" : "fp16");
    }
    t->be = glm_backend_cpu();
    return 0;
}

/* The same distribution as glm_model_init_random (normal matrices, LayerNorm weights 1, zero
 * biases) drawn on the GPU: 6B normal samples take minutes on one host core. The numbers
 * differ from the CPU's for the same seed. */
static void init_random_on_device(glm_model *m, uint64_t seed, float std) {
#ifdef GLM_HAVE_CUDA
    glm_table full; /* streams numbered by the whole model's rows: a pipeline stage draws the same values */
    glm_table_build(&full, &m->cfg);
    for (int i = 0; i < m->tab.n; i++) {
        const glm_tensor *t = &m->tab.t[i];
        void *p = glm_at(m->be, m->params, t->offset);
        uint64_t row = (uint64_t)(glm_table_find(&full, t->name) - full.t);
        if (t->ndim == 2) glm_cuda_fill_normal(m->be, p, t->numel, seed * 1000003ULL + row, std);
        else if (t->kind == T_LN1_W || t->kind == T_LN2_W || t->kind == T_LNF_W) glm_cuda_fill(m->be, p, t->numel, 1.0f);
    }
    glm_table_free(&full);
#else
    glm_model_init_random(m, seed, std);
#endif
}

static int load_model(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_config c;
    const char *src = a->model_name_or_path ? a->model_name_or_path : a->init_from_config;
    if (glm_config_load(&c, src, err)) return -1;
    int cuda = strncmp(t->be->name, "cuda", 4) == 0;
    if (t->dp->rank == 0) glm_pp_print_plan(a, &c, cuda, t->dp->world, stderr);
    if (glm_pp_check_memory(a, &c, cuda, t->dp->world, err)) return -1;
    if (a->pipeline_parallel_size > 1 || (a->device_map && strcmp(a->device_map, "auto") && strcmp(a->device_map, "thudm"))) {
        if (glm_pp_open(&t->pp, t->dp, a, &c, t->be, err)) return -1; /* from here t->dp is this stage's replicas */
        glm_pp_model_init(t->pp, &t->m, &c, t->be);
    } else {
        glm_model_init(&t->m, &c, t->be);
    }
    t->m.gradient_checkpointing = a->gradient_checkpointing;
    if (t->dp->world > 1 && t->dp->rank > 0) {
        /* nothing to read or draw: glm_dp_attach broadcasts rank 0's weights */
    } else if (a->model_name_or_path) {
        if (glm_model_load(&t->m, a->model_name_or_path, err)) return -1;
    } else if (strncmp(t->be->name, "cuda", 4) == 0) {
        init_random_on_device(&t->m, (uint64_t)a->seed, (float)a->init_std);
    } else {
        glm_model_init_random(&t->m, (uint64_t)a->seed, (float)a->init_std);
    }
    glm_info("model: %d layers, hidden %d, %d heads, vocab %d, %.1fM parameters (%s head), backend %s",
             c.num_layers, c.hidden_size, c.num_attention_heads, c.vocab_size, t->m.tab.n_params / 1e6,
             c.tie_word_embeddings ? "tied" : "untied", t->be->name);
    return 0;
}

static int load_tokenizer(trainer *t, glm_err *err) {
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
    return t->pp ? glm_pp_sum(t->pp, failed, 1, 1, what, err) : glm_dp_sum_long(t->dp, failed, 1, what, err);
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

static int load_data(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    glm_data_cfg *d = &t->dcfg;
    glm_data_cfg_init(d);
    d->train_file = a->train_file;
    d->validation_file = a->validation_file;
    if (glm_schema_parse(strcmp(a->data_format, "chatglm") == 0 ? "columns" : a->data_format, &d->read.schema))
        return glm_fail(err, "--data_format %s is not known", a->data_format);
    d->read.columns.prompt = a->prompt_column;
    d->read.columns.response = a->response_column;
    d->read.columns.history = a->history_column;
    d->read.skip_bad_samples = a->skip_bad_samples;
    d->example.max_source_length = a->max_source_length;
    d->example.max_target_length = a->max_target_length;
    d->example.source_prefix = a->source_prefix;
    if (a->prompt_template) glm_unescape(a->prompt_template);
    if (a->history_template) glm_unescape(a->history_template);
    d->example.prompt_template = a->prompt_template;
    d->example.history_template = a->history_template;
    d->example.train_on_prompt = a->train_on_prompt;
    if (glm_example_cfg_check(&d->example, err)) return -1;
    d->val_size = a->val_size;
    d->seed = (uint64_t)a->seed;
    d->num_threads = a->dataloader_num_workers;
    if (a->cache_dir) snprintf(t->cache_dir, sizeof t->cache_dir, "%s", a->cache_dir);
    else glm_path_join(t->cache_dir, sizeof t->cache_dir, a->output_dir, ".cache");
    d->cache_dir = t->cache_dir;
    if (load_data_ranked(t, err)) return -1;
    glm_data_print_summary(stderr, &t->data, d);
    glm_loader_cfg lc;
    glm_loader_cfg_init(&lc);
    lc.batch_size = a->per_device_train_batch_size;
    lc.group_by_length = a->group_by_length;
    lc.packing = a->packing;
    lc.seed = (uint64_t)a->seed;
    lc.rank = t->dp->rank;
    lc.world = t->dp->world;
    if (lc.packing) lc.max_len = a->max_source_length + a->max_target_length;
    if (glm_loader_open(&t->train_ld, &t->data.train, &lc, err)) return -1;
    if (t->data.val.n > 0) {
        glm_loader_cfg ec;
        glm_loader_cfg_init(&ec);
        ec.batch_size = a->per_device_eval_batch_size;
        ec.shuffle = 0;
        ec.rank = t->dp->rank;
        ec.world = t->dp->world;
        if (glm_loader_open(&t->eval_ld, &t->data.val, &ec, err)) return -1;
        glm_loader_batch_alloc(t->eval_ld, &t->eval_batch);
    }
    t->micro = glm_calloc(a->gradient_accumulation_steps, sizeof(glm_batch));
    for (int i = 0; i < a->gradient_accumulation_steps; i++) glm_loader_batch_alloc(t->train_ld, &t->micro[i]);
    return 0;
}

static void plan_steps(trainer *t) {
    glm_train_args *a = t->a;
    t->micro_per_epoch = glm_loader_steps_per_epoch(t->train_ld);
    t->steps_per_epoch = (t->micro_per_epoch + a->gradient_accumulation_steps - 1) / a->gradient_accumulation_steps;
    if (t->steps_per_epoch < 1) t->steps_per_epoch = 1;
    t->total_steps = a->max_steps > 0 ? a->max_steps : (long)ceil(a->num_train_epochs * t->steps_per_epoch);
    t->warmup = a->warmup_steps > 0 ? a->warmup_steps : (long)ceil(a->warmup_ratio * t->total_steps);
    glm_lr_kind_parse(a->lr_scheduler_type, &t->sched);
}

/* Mean loss over the validation tokens of every rank's share. */
static int evaluate(trainer *t, double *loss, double *ppl, glm_err *err) {
    glm_err lerr;
    glm_loader_seek(t->eval_ld, (glm_data_cursor){0, 0}, &lerr);
    int64_t n = glm_loader_steps_per_epoch(t->eval_ld);
    double v[2] = {0, 0}; /* loss sum, tokens */
    for (int64_t i = 0; i < n; i++) {
        if (glm_loader_next(t->eval_ld, &t->eval_batch, &lerr)) break;
        if (t->eval_batch.n_targets == 0) continue;
        if (t->pp) {
            if (glm_pp_eval(t->pp, &t->eval_batch, v, err)) return -1;
            continue;
        }
        v[0] += glm_forward_loss(&t->m, &t->eval_batch);
        v[1] += t->eval_batch.n_targets;
    }
    if (t->pp ? glm_pp_sum(t->pp, v, 2, 0, "evaluation loss", err) : glm_dp_sum(t->dp, v, 2, "evaluation loss", err))
        return -1;
    *loss = v[1] > 0 ? v[0] / v[1] : NAN;
    *ppl = exp(*loss);
    return 0;
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
        cJSON_AddNumberToObject(r, "eval_perplexity", v2);
    }
    cJSON_AddItemToArray(t->history, r);
}

static int save_checkpoint(trainer *t, glm_err *err) {
    free(t->st.log_history);
    t->st.log_history = cJSON_PrintUnformatted(t->history);
    glm_data_cursor c = glm_loader_cursor(t->train_ld);
    t->st.epoch = (long)c.epoch;
    t->st.cursor = (long)c.step;
    t->st.loss_scale = t->scaler.scale;
    t->st.good_steps = t->scaler.good_steps;
    t->st.skipped_steps = t->scaler.skipped;
    if (t->pp ? glm_pp_save(t->pp, t->a->output_dir, &t->st, t->tok_path, t->args_json, err)
              : glm_dp_save(t->dp, t->a->output_dir, &t->st, t->tok_path, t->args_json, err))
        return -1;
    if (!lead(t)) return 0;
    char line[256];
    snprintf(line, sizeof line, "[glmtrain] saved %s/checkpoint-%ld", t->a->output_dir, t->st.global_step);
    glm_progress_log(&t->prog, line);
    return glm_checkpoint_rotate(t->a->output_dir, t->a->save_total_limit, err);
}

static int resume(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    char dir[4096];
    if (strcmp(a->resume_from_checkpoint, "latest") == 0 || strcmp(a->resume_from_checkpoint, "true") == 0 ||
        strcmp(a->resume_from_checkpoint, "True") == 0) {
        if (glm_checkpoint_latest(a->output_dir, dir, sizeof dir) != 0) {
            glm_fail(err, "--resume_from_checkpoint: no complete checkpoint-N folder in %s", a->output_dir);
            return glm_hint(err, "check --output_dir, or start without --resume_from_checkpoint");
        }
    } else {
        snprintf(dir, sizeof dir, "%s", a->resume_from_checkpoint);
    }
    if (glm_dp_load(t->dp, dir, &t->st, err)) return -1;
    if (t->st.log_history) {
        cJSON_Delete(t->history);
        t->history = cJSON_Parse(t->st.log_history);
        if (!t->history) t->history = cJSON_CreateArray();
    }
    if (t->st.loss_scale > 0) { t->scaler.scale = t->st.loss_scale; t->scaler.good_steps = t->st.good_steps; t->scaler.skipped = t->st.skipped_steps; }
    if (glm_loader_seek(t->train_ld, (glm_data_cursor){t->st.epoch, t->st.cursor}, err)) return -1;
    glm_info("resumed from %s at step %ld (epoch %ld, batch %ld)", dir, t->st.global_step, t->st.epoch, t->st.cursor);
    return 0;
}

static int check_output_dir(glm_train_args *a, glm_err *err) {
    if (!glm_is_dir(a->output_dir)) return glm_mkdirs(a->output_dir, err);
    char probe[4096];
    glm_path_join(probe, sizeof probe, a->output_dir, "config.json");
    char latest[4096];
    int has = glm_is_file(probe) || glm_checkpoint_latest(a->output_dir, latest, sizeof latest) == 0;
    if (has && !a->overwrite_output_dir && !a->resume_from_checkpoint) {
        glm_fail(err, "output directory %s already holds a model or checkpoints", a->output_dir);
        return glm_hint(err, "pass --resume_from_checkpoint to continue it, --overwrite_output_dir to start over, or another --output_dir");
    }
    return 0;
}

/* One optimizer step over up to gradient_accumulation_steps micro-batches (fewer at the end
 * of an epoch). Returns the mean loss over the supervised tokens of the step's global batch
 * (every rank's share); sets *norm, *tokens (global). With measure, *compute_s is this rank's
 * forward+backward time (after a device sync). *stop: a rank got SIGINT/SIGTERM, and the step
 * was not taken (the data cursor is back where it was, for the checkpoint). */
static double train_step(trainer *t, float lr, int measure, double *norm, double *tokens, int *skipped, int *stop,
                         double *compute_s, glm_err *err) {
    glm_train_args *a = t->a;
    glm_data_cursor c = glm_loader_cursor(t->train_ld);
    long left = t->micro_per_epoch - (long)c.step;
    int k = a->gradient_accumulation_steps < left ? a->gradient_accumulation_steps : (int)left;
    long n_sup = 0;
    *tokens = 0;
    double t0 = glm_now();
    for (int i = 0; i < k; i++) {
        if (glm_loader_next(t->train_ld, &t->micro[i], err)) return NAN;
        n_sup += t->micro[i].n_targets;
        *tokens += (double)glm_loader_last_tokens(t->train_ld);
    }
    /* every rank scales its gradients by 1/(supervised tokens of the whole global batch) */
    double g[3] = {(double)n_sup, *tokens, glm_signal_pending() ? 1 : 0};
    if (t->pp) { /* over every rank: every stage of a replica counted the same batches */
        if (glm_pp_sum(t->pp, g, 3, 0, "batch token counts", err)) return NAN;
        g[0] /= t->pp->pipe.P;
        g[1] /= t->pp->pipe.P;
    } else if (glm_dp_sum(t->dp, g, 3, "batch token counts", err)) {
        return NAN;
    }
    if (g[2] > 0) {
        if (glm_loader_seek(t->train_ld, c, err)) return NAN;
        *stop = 1;
        return NAN;
    }
    n_sup = (long)g[0];
    *tokens = g[1];
    glm_zero_grads(&t->m);
    double scale = a->fp16 ? t->scaler.scale : 1.0;
    double sum = 0;
    if (n_sup > 0 && t->pp) {
        if (glm_pp_forward_backward(t->pp, t->micro, k, (float)(scale / n_sup), &sum, err)) return NAN;
    } else if (n_sup > 0) {
        for (int i = 0; i < k; i++) {
            glm_dp_micro_begin(t->dp, i == k - 1); /* gradients are reduced during the last backward */
            sum += glm_forward_backward(&t->m, &t->micro[i], (float)(scale / n_sup));
        }
    }
    if (measure) { t->be->sync(t->be); *compute_s = glm_now() - t0; }
    if (glm_dp_reduce_grads(t->dp, err)) return NAN;
    if (t->pp ? glm_pp_grad_norm(t->pp, (float)(1.0 / scale), &sum, norm, err)
              : glm_dp_grad_norm(t->dp, (float)(1.0 / scale), &sum, norm, err))
        return NAN;
    *skipped = 0;
    if (a->fp16 && glm_scaler_update(&t->scaler, *norm)) { *skipped = 1; return n_sup ? sum / n_sup : NAN; }
    if (n_sup > 0) {
        float coef = glm_clip_coef(*norm, (float)a->max_grad_norm);
        if (glm_dp_optimizer_step(t->dp, lr, (float)(coef / scale), err)) return NAN;
    }
    t->st.tokens_seen += (double)n_sup;
    return n_sup ? sum / n_sup : NAN;
}

/* At logging steps: every rank's forward+backward time and GPU figures (collective). */
static int log_rank_stats(trainer *t, double compute_s, glm_err *err) {
    int W = t->dp->world;
    if (W == 1 && !t->gs) return 0;
    glm_rank_stat *s = glm_calloc((size_t)W, sizeof *s);
    int rc = glm_dp_stats(t->dp, t->gs, compute_s, s, err);
    if (rc == 0 && t->dp->rank == 0) {
        char line[4096], warn[2048];
        glm_dp_stats_format(W, t->gs != NULL, s, line, sizeof line, warn, sizeof warn);
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

/* Rank 0 writes the final model; every rank learns whether that worked. */
static int save_final(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    int rc = 0;
    if (t->pp) {
        st_dtype dt = strcmp(a->save_dtype, "float16") == 0 ? ST_F16 : strcmp(a->save_dtype, "bfloat16") == 0 ? ST_BF16 : ST_F32;
        rc = glm_pp_save_final(t->pp, a->output_dir, dt, t->tok_path, t->args_json, err);
        if (rc == 0 && lead(t)) glm_info("saved the final model to %s", a->output_dir);
        return rc;
    }
    if (t->dp->rank == 0) {
        st_dtype dt = strcmp(a->save_dtype, "float16") == 0 ? ST_F16 : strcmp(a->save_dtype, "bfloat16") == 0 ? ST_BF16 : ST_F32;
        char path[4096];
        glm_path_join(path, sizeof path, a->output_dir, "training_args.json");
        rc = glm_model_save(&t->m, a->output_dir, dt, 0, err) || glm_copy_tokenizer_files(t->tok_path, a->output_dir, err) ||
             glm_write_file_atomic(path, t->args_json, strlen(t->args_json), err) ? -1 : 0;
        if (rc == 0) glm_info("saved the final model to %s", a->output_dir);
    }
    double failed = rc != 0;
    glm_err e2;
    if (glm_dp_sum_long(t->dp, &failed, 1, "final model written", rc ? &e2 : err)) return -1;
    if (rc == 0 && failed > 0) return glm_fail(err, "rank %d: rank 0 could not write the final model", t->dp->rank);
    return rc;
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
    if (t->tok) glm_tokenizer_free(t->tok);
    if (t->tb) tb_close(t->tb);
    if (t->opt.m) glm_adamw_free(&t->opt, &t->m);
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
}

/* SIGINT/SIGTERM reached a rank: every rank stops before the step (with --save_on_interrupt
 * after writing a checkpoint of the steps done) and the run ends with an error. */
static int stop_on_signal(trainer *t, glm_err *err) {
    char line[256];
    int sig = glm_signal_pending();
    snprintf(line, sizeof line, "[glmtrain] %s%s: stopping at step %ld", sig ? "received " : "another rank received ",
             sig ? glm_signal_name(sig) : "a stop signal", t->st.global_step);
    glm_progress_log(&t->prog, line);
    if (t->a->save_on_interrupt && t->st.global_step > 0 && save_checkpoint(t, err)) return -1;
    glm_fail(err, "training stopped by a signal at step %ld%s", t->st.global_step,
             t->a->save_on_interrupt && t->st.global_step > 0 ? " (checkpoint saved)" : "");
    return glm_hint(err, "continue with --resume_from_checkpoint%s", t->a->save_on_interrupt ? "" : "; --save_on_interrupt saves one on Ctrl-C");
}

static int run(trainer *t, glm_err *err) {
    glm_train_args *a = t->a;
    if (glm_train_check_args(a, err) || check_output_dir(a, err)) return -1;
    glm_dp_cfg dc = {.zero_stage = a->zero_stage, .bucket_mb = a->bucket_size_mb, .timeout = a->ddp_timeout,
                     .save_on_interrupt = a->save_on_interrupt};
    if (glm_dp_open(&t->dp, &dc, err) || glm_dp_redirect_log(t->dp, a->output_dir, err)) return -1;
    if (a->save_on_interrupt) glm_signals_install();
    t->args_json = glm_args_to_json(glm_train_flags, glm_train_nflags, a);
    fprintf(stderr, "[glmtrain] effective settings:\n%s\n", t->args_json);
    char path[4096];
    glm_path_join(path, sizeof path, a->output_dir, "training_args.json");
    if (t->dp->rank == 0 && glm_write_file_atomic(path, t->args_json, strlen(t->args_json), err)) return -1;
    if (pick_backend(t, err) || load_model(t, err)) return -1;
    if (glm_dp_attach(t->dp, &t->m, &t->opt, (float)a->learning_rate, (float)a->adam_beta1, (float)a->adam_beta2,
                      (float)a->adam_epsilon, (float)a->weight_decay, err))
        return -1;
    if (t->pp && glm_pp_ready(t->pp, err)) return -1;
    if (load_tokenizer(t, err) || load_data(t, err)) return -1;
    plan_steps(t);
    glm_scaler_init(&t->scaler, a->fp16_initial_scale, 2000);
    t->history = cJSON_CreateArray();
    if (a->resume_from_checkpoint && resume(t, err)) return -1;
    if (strcmp(a->report_to, "tensorboard") == 0 && lead(t)) {
        char logdir[4096];
        if (a->logging_dir) snprintf(logdir, sizeof logdir, "%s", a->logging_dir);
        else glm_path_join(logdir, sizeof logdir, a->output_dir, "runs");
        if (tb_open(&t->tb, logdir, err)) return -1;
    }
    if (strncmp(t->be->name, "cuda", 4) == 0) t->gs = glm_gpustat_open(glm_local_device(t->dp->dist.local_rank));
    long eval_every = a->eval_steps > 0 ? a->eval_steps : a->logging_steps;
    int eval_on = t->eval_ld && strcmp(a->eval_strategy, "no") != 0;
    if (strcmp(a->eval_strategy, "no") != 0 && !t->eval_ld)
        glm_warn("--eval_strategy %s but no validation data (--validation_file or --val_size): evaluation skipped", a->eval_strategy);
    glm_info("training: %ld optimizer steps (%ld per epoch, %ld micro-batches of %d rows per epoch, accumulation %d), warmup %ld, schedule %s",
             t->total_steps, t->steps_per_epoch, t->micro_per_epoch, a->per_device_train_batch_size,
             a->gradient_accumulation_steps, t->warmup, a->lr_scheduler_type);
    glm_progress_init(&t->prog, stderr, t->st.global_step, t->total_steps, a->disable_tqdm);
    double t_start = glm_now(), t_log = t_start, loss_acc = 0, tok_acc = 0, last_loss = NAN;
    long n_acc = 0;
    char line[512];
    while (t->st.global_step < t->total_steps) {
        long next = t->st.global_step + 1;
        int log_now = next % a->logging_steps == 0 || (a->logging_first_step && next == 1) || next == t->total_steps;
        float lr = glm_lr_at(t->sched, (float)a->learning_rate, t->st.global_step, t->warmup, t->total_steps);
        double norm = 0, tokens = 0, compute_s = 0;
        int skipped = 0, stop = 0;
        glm_dp_set_step(t->dp, next);
        double loss = train_step(t, lr, log_now, &norm, &tokens, &skipped, &stop, &compute_s, err);
        if (stop) return stop_on_signal(t, err);
        if (isnan(loss) && err->msg[0]) return -1;
        t->st.global_step++;
        if (isfinite(loss)) { loss_acc += loss; n_acc++; last_loss = loss; }
        tok_acc += tokens;
        if (skipped) {
            snprintf(line, sizeof line, "[glmtrain] step %ld: inf/nan gradients, step skipped, loss scale now %.0f",
                     t->st.global_step, t->scaler.scale);
            glm_progress_log(&t->prog, line);
        }
        double now = glm_now();
        if (log_now) {
            log_train(t, n_acc ? loss_acc / n_acc : NAN, lr, norm, tok_acc / (now - t_log > 1e-9 ? now - t_log : 1e-9));
            if (log_rank_stats(t, compute_s, err)) return -1;
            if (t->pp) {
                char pl[1024];
                if (glm_pp_stats(t->pp, a->gradient_accumulation_steps, pl, sizeof pl, err)) return -1;
                if (pl[0]) glm_progress_log(&t->prog, pl);
            }
            loss_acc = 0; n_acc = 0; tok_acc = 0; t_log = now;
        }
        int epoch_end = t->st.global_step % t->steps_per_epoch == 0;
        if (eval_on && ((strcmp(a->eval_strategy, "steps") == 0 && t->st.global_step % eval_every == 0) ||
                        (strcmp(a->eval_strategy, "epoch") == 0 && epoch_end))) {
            double el, ppl;
            if (evaluate(t, &el, &ppl, err)) return -1;
            snprintf(line, sizeof line, "{'eval_loss': %.4f, 'eval_perplexity': %.4f, 'step': %ld}", el, ppl, t->st.global_step);
            glm_progress_log(&t->prog, line);
            if (t->tb) { tb_scalar(t->tb, "eval/loss", (float)el, t->st.global_step); tb_scalar(t->tb, "eval/perplexity", (float)ppl, t->st.global_step); tb_flush(t->tb); }
            log_record(t, "eval", el, ppl, 0, 0);
        }
        /* ranks must agree on stopping: rank clocks differ, so they vote */
        double out_of_time = a->max_train_seconds > 0 && now - t_start > a->max_train_seconds;
        if (a->max_train_seconds > 0 && (t->pp ? glm_pp_sum(t->pp, &out_of_time, 1, 0, "time limit", err)
                                               : glm_dp_sum(t->dp, &out_of_time, 1, "time limit", err)))
            return -1;
        if ((strcmp(a->save_strategy, "steps") == 0 && t->st.global_step % a->save_steps == 0) ||
            (strcmp(a->save_strategy, "epoch") == 0 && epoch_end) || out_of_time > 0)
            if (save_checkpoint(t, err)) return -1;
        glm_progress_update(&t->prog, t->st.global_step, last_loss, tok_acc / (now - t_log > 1e-3 ? now - t_log : 1e-3));
        if (out_of_time > 0) { glm_progress_log(&t->prog, "[glmtrain] --max_train_seconds reached; stopping"); break; }
    }
    glm_progress_done(&t->prog);
    glm_info("trained %ld steps in %.1f s", t->st.global_step, glm_now() - t_start);
    return save_final(t, err);
}

int glm_train_preflight(glm_train_args *a, glm_err *err) {
    return glm_train_check_args(a, err) || check_output_dir(a, err) ? -1 : 0;
}

int glm_train_run(glm_train_args *a, glm_err *err) {
    trainer t = {.a = a};
    err->msg[0] = 0;
    int rc = run(&t, err);
    int rank = t.pp ? t.pp->world_rank : t.dp ? t.dp->rank : 0; /* the job's rank, also with stages */
    if (rc && t.dp && (t.dp->world > 1 || (t.pp && t.pp->world_size > 1))) {
        if (strncmp(err->msg, "rank ", 5) != 0) glm_wrap(err, "rank %d: ", rank);
        if (rank > 0) glm_err_print(err); /* into its log file; the CLI prints it on the terminal */
    }
    trainer_free(&t, rc == 0);
    return rc;
}
