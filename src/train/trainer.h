/* The state of one training run and the set-up steps train.c calls (setup.c): backend,
 * model, tokenizer, data, step plan, output folder. Internal to train/. */
#ifndef GLM_TRAINER_H
#define GLM_TRAINER_H
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
#include "model/adapter.h"
#include "model/ckpt.h"
#include "model/glm.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "optim/schedule.h"
#include "parallel/dp/dp.h"
#include "parallel/dp/dp_stats.h"
#include "parallel/gpustat.h"
#include "parallel/launch.h"
#include "parallel/par.h"
#include "parallel/pipe/pipe_train.h"
#include "parallel/comm/presence.h"
#include "parallel/comm/signals.h"
#include "tokenizer/tokenizer.h"
#ifdef GLM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "ckpt/checkpoint.h"
#include "train/progress.h"

/* Everything one training run holds, passed explicitly. */
#include "train/pref.h"

typedef struct trainer {
    glm_train_args *a;
    glm_backend *be;
    glm_model m;
    glm_adamw opt;
    glm_tokenizer *tok;
    char tok_path[4096], cache_dir[4096];
    glm_encoder enc;
    glm_data_cfg dcfg;
    glm_data_source *sources; /* --dataset's files (dcfg.sources points here), else NULL */
    glm_data_source *val_sources; /* --eval_dataset's (dcfg.val_sources), else NULL */
    glm_data data;
    glm_loader *train_ld, *eval_ld;
    glm_batch *micro;         /* [accum] host batches of one optimizer step */
    glm_batch eval_batch;
    tb_writer *tb;
    glm_progress prog;
    glm_train_state st;
    glm_loss_scaler scaler;
    glm_lr_sched sched;      /* the learning rate of each optimizer update */
    long total_steps, warmup, steps_per_epoch, micro_per_epoch;
    long log_every, eval_every, save_every; /* --logging_steps, --eval_steps, --save_steps in steps */
    /* when to log, evaluate and save: the strategy flags (no|steps|epoch) read once */
    enum { GLM_WHEN_NO, GLM_WHEN_STEPS, GLM_WHEN_EPOCH, GLM_WHEN_BEST } log_when, eval_when, save_when;
    uint64_t data_hash;      /* of the tokenized training examples: resume compares it with the checkpoint's */
    double eval_loss, eval_ppl; /* the last evaluation during training, at step eval_step (0: none yet) */
    long eval_step;
    glm_presence pres;       /* every rank's last step, for naming the ranks a timeout waited for */
    char *args_json;
    cJSON *history;           /* log_history records */
    glm_dp *dp;               /* data parallel (a no-op with one process) */
    glm_gpustat *gs;          /* NVML figures of this rank's GPU, NULL on the CPU */
    glm_pp *pp;               /* pipeline stages (--pipeline_parallel_size > 1), else NULL */
    glm_badam badam;          /* BAdam's block schedule (m.cfg.peft.badam) */
    /* --stage dpo (pref_train.c): the loss, the reference's values of every pair of the training and
     * validation views (2 per dataset position: chosen, rejected; NULL without a reference), the
     * pairs of each micro-batch of a step (dataset positions), the metrics since the last log */
    glm_pref_cfg pref;
    double *ref_train, *ref_val;
    int64_t *micro_pairs;
    glm_pref_sums psums, esums;
    double eval_accuracy; /* --stage rm: the last evaluation's share of pairs scored right */
} trainer;

/* The job's first rank: with pipeline stages dp->rank is the replica within a stage. */
static inline int lead(const trainer *t) { return t->pp ? t->pp->world_rank == 0 : t->dp->rank == 0; }

/* The seed of the training rows' order: --data_seed, or --seed without it (-1 with err for text
 * that is not a whole number in int's range). */
int trainer_data_seed(const glm_train_args *a, int *out, glm_err *err);
int trainer_pick_backend(trainer *t, glm_err *err);
int trainer_load_model(trainer *t, glm_err *err);
int trainer_load_tokenizer(trainer *t, glm_err *err);
int trainer_load_data(trainer *t, glm_err *err);
/* Steps, warmup and the learning-rate schedule; fails when a --deepspeed file's values for them differ. */
int trainer_plan_steps(trainer *t, glm_err *err);
/* The lead rank says what the run's checkpoints and final model will take on output_dir's disk,
 * and warns when that is more than is free there (disk.c). */
void trainer_disk_plan(const trainer *t);
int trainer_check_output_dir(glm_train_args *a, glm_err *err);
/* After the ranks are known: the run id, and the lead removes what belongs to no live run. */
int trainer_prepare_output_dir(trainer *t, glm_err *err);
/* --resume_from_checkpoint: restores weights, optimizer, data position and log history from
 * the newest intact checkpoint of this run (or the one named), on every rank (train/resume.c). */
int trainer_resume(trainer *t, glm_err *err);

/* --stage dpo (pref_train.c). setup: the loss settings, and the reference's values of every pair,
 * computed by the model as it is before training (and before a resume loads a checkpoint: the
 * model training started from). forward_backward: the step's k micro-batches (t->micro, their
 * pairs in t->micro_pairs) into the gradients at dscale per pair; adds the pairs' loss sum.
 * eval_batch: v[0] += the eval batch's pair losses, v[1] += its pairs. pairs: in a batch. */
int trainer_pref_setup(trainer *t, glm_err *err);
int trainer_pref_forward_backward(trainer *t, int k, float dscale, double *loss_sum, glm_err *err);
int trainer_pref_eval_batch(trainer *t, const glm_batch *b, double v[2], glm_err *err);
int trainer_pref_pairs(const glm_batch *b);
/* --stage rm --do_predict: --test_file's pairs scored (generated_predictions.jsonl, predict_results.json). */
int trainer_rm_predict(trainer *t, glm_err *err);


#endif
