#include <stddef.h>
#include <stdlib.h>
#include "train/train_args.h"

#define F(name, type, def, help) {#name, type, offsetof(glm_train_args, name), def, help, NULL, NULL}
#define C(name, def, choices, help) {#name, ARG_STR, offsetof(glm_train_args, name), def, help, choices, NULL}

const glm_flag glm_train_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "Hugging Face style folder: config.json + safetensors (+ tokenizer)"),
    F(init_from_config, ARG_STR, NULL, "config.json of a model to initialise randomly instead of loading weights"),
    F(init_std, ARG_FLOAT, "0.02", "std of the normal init with --init_from_config"),
    F(tokenizer_name, ARG_STR, NULL, "tokenizer folder or .model file (default: the model folder)"),
    C(device, "auto", "auto|cpu|cuda", "where to train"),
    F(train_file, ARG_STR, NULL, "training data: .json array or .jsonl (alpaca, prompt/response, sharegpt)"),
    F(validation_file, ARG_STR, NULL, "evaluation data (same formats)"),
    F(val_size, ARG_FLOAT, "0", "hold out this fraction (<1) or count (>=1) of the training data for evaluation"),
    C(data_format, "auto", "auto|alpaca|columns|chatglm|sharegpt", "record schema"),
    F(prompt_column, ARG_STR, NULL, "ptuning-style prompt column (e.g. content)"),
    F(response_column, ARG_STR, NULL, "ptuning-style response column (e.g. summary)"),
    F(history_column, ARG_STR, NULL, "ptuning-style history column"),
    F(prompt_template, ARG_STR, NULL, "prompt body template, e.g. \"[Round 1]\\n\\n问：{instruction}\\n\\n答：\""),
    F(history_template, ARG_STR, NULL, "one history round, e.g. \"[Round {i1}]\\n\\n问：{q}\\n\\n答：{r}\\n\\n\""),
    F(source_prefix, ARG_STR, NULL, "text prepended to every prompt"),
    F(cache_dir, ARG_STR, NULL, "where the tokenized data cache lives (default: <output_dir>/.cache)"),
    F(max_source_length, ARG_INT, "1024", "prompt tokens kept (ptuning's max_source_length)"),
    F(max_target_length, ARG_INT, "128", "answer tokens kept (ptuning's max_target_length)"),
    F(max_train_samples, ARG_INT, "0", "use only the first N training records (0 = all)"),
    F(train_on_prompt, ARG_BOOL, "false", "put loss on the prompt tokens too"),
    F(skip_bad_samples, ARG_BOOL, "false", "skip malformed records (counted) instead of stopping"),
    F(group_by_length, ARG_BOOL, "false", "batch examples of similar length together"),
    F(packing, ARG_BOOL, "false", "pack several examples per row (attention kept apart)"),
    F(dataloader_num_workers, ARG_INT, "0", "threads for tokenization (0 = all cores)"),
    F(output_dir, ARG_STR, NULL, "where checkpoints and the final model go"),
    F(overwrite_output_dir, ARG_BOOL, "false", "allow a non-empty output_dir"),
    F(logging_dir, ARG_STR, NULL, "TensorBoard folder (default: <output_dir>/runs)"),
    C(report_to, "tensorboard", "tensorboard|none", "where metrics go besides the console"),
    F(num_train_epochs, ARG_FLOAT, "3", "passes over the training data"),
    F(max_steps, ARG_LONG, "-1", "stop after this many optimizer steps (overrides epochs when > 0)"),
    F(per_device_train_batch_size, ARG_INT, "8", "micro-batch rows per device"),
    F(per_device_eval_batch_size, ARG_INT, "8", "evaluation rows per device"),
    F(gradient_accumulation_steps, ARG_INT, "1", "micro-batches per optimizer step"),
    F(learning_rate, ARG_FLOAT, "5e-5", "peak learning rate"),
    F(weight_decay, ARG_FLOAT, "0", "AdamW decoupled weight decay (not on biases and LayerNorm)"),
    F(adam_beta1, ARG_FLOAT, "0.9", "AdamW beta1"),
    F(adam_beta2, ARG_FLOAT, "0.999", "AdamW beta2"),
    F(adam_epsilon, ARG_FLOAT, "1e-8", "AdamW epsilon"),
    F(max_grad_norm, ARG_FLOAT, "1.0", "clip the global gradient norm (0 = off)"),
    C(lr_scheduler_type, "linear", "linear|cosine|constant|constant_with_warmup", "learning-rate schedule"),
    F(warmup_steps, ARG_LONG, "0", "linear warmup steps"),
    F(warmup_ratio, ARG_FLOAT, "0", "warmup as a fraction of all steps (when warmup_steps is 0)"),
    F(logging_steps, ARG_LONG, "10", "log every N steps"),
    F(logging_first_step, ARG_BOOL, "false", "log the first step too"),
    C(eval_strategy, "no", "no|steps|epoch", "when to evaluate"),
    F(eval_steps, ARG_LONG, "0", "evaluate every N steps (default: logging_steps)"),
    C(save_strategy, "steps", "no|steps|epoch", "when to save checkpoints"),
    F(save_steps, ARG_LONG, "500", "save a checkpoint every N steps"),
    F(save_total_limit, ARG_INT, "0", "keep at most N checkpoints (0 = all)"),
    C(save_dtype, "float32", "float32|float16|bfloat16", "dtype of the final model's safetensors"),
    {"resume_from_checkpoint", ARG_STR, offsetof(glm_train_args, resume_from_checkpoint), NULL,
     "checkpoint folder, or alone / \"latest\" for the newest in output_dir", NULL, "latest"},
    F(seed, ARG_INT, "42", "seed for init, shuffling and splits"),
    F(disable_tqdm, ARG_BOOL, "false", "plain log lines instead of a progress bar"),
    F(bf16, ARG_BOOL, "false", "bf16 mixed precision (GPU)"),
    F(fp16, ARG_BOOL, "false", "fp16 mixed precision with dynamic loss scaling (GPU)"),
    F(fp32, ARG_BOOL, "false", "everything in fp32"),
    F(gradient_checkpointing, ARG_BOOL, "false", "recompute each layer in backward to save memory"),
    F(max_train_seconds, ARG_FLOAT, "0", "stop (and save) after this many seconds of training (0 = no limit)"),
};
const int glm_train_nflags = sizeof glm_train_flags / sizeof glm_train_flags[0];

void glm_train_args_free(glm_train_args *a) {
    for (int i = 0; i < glm_train_nflags; i++)
        if (glm_train_flags[i].type == ARG_STR) free(*(char **)((char *)a + glm_train_flags[i].offset));
}
