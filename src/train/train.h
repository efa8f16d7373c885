/* `glmtrain train`: the training loop with Hugging Face Trainer semantics — epochs or
 * max_steps, gradient accumulation (loss = mean over the supervised tokens of the whole
 * optimizer step), LR schedule with warmup, clipping, logging/eval/save steps, checkpoint
 * rotation, exact resume, TensorBoard, a progress bar, fp16 dynamic loss scaling. */
#ifndef GLM_TRAIN_H
#define GLM_TRAIN_H
#include "core/err.h"
#include "model/config.h"
#include "optim/badam.h"
#include "train/train_args.h"

/* Runs training as configured. Returns 0, or -1 with err (the CLI prints it). */
int glm_train_run(glm_train_args *a, glm_err *err);
/* Checks flag combinations before anything heavy happens (exported for tests). */
int glm_train_check_args(glm_train_args *a, glm_err *err);
/* What trains, from --finetuning_type and the LoRA / freeze flags (model/config.h glm_peft),
 * for a model of L layers. */
int glm_train_peft(const glm_train_args *a, const glm_config *c, glm_peft *p, glm_err *err);
/* BAdam's block schedule (optim/badam.h) from --badam_switch_mode, --badam_start_block,
 * --badam_switch_interval and --seed, for a model of `layers` layers. */
void glm_train_badam(const glm_train_args *a, int layers, glm_badam *b);
/* --use_galore's settings checked and put into c->peft (after glm_train_peft): the number of
 * weights GaLore projects, or -1 with err naming the flag. */
int glm_train_galore(const glm_train_args *a, glm_config *c, glm_err *err);
/* The adapters a run starts from (model/adapter.h's lists): those merged into the base as it
 * loads, and the one trained on ("" where a new one trains: none given, or
 * --create_new_adapter); --ptuning_checkpoint is that one. */
void glm_train_adapters(const glm_train_args *a, char *merged, size_t nm, char *from, size_t nf);
/* The checks a data-parallel launcher makes once before starting workers: flags and the
 * output directory (created when missing). */
int glm_train_preflight(glm_train_args *a, glm_err *err);

#endif
