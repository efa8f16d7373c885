#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/hub.h"
#include "model/glm.h"
#include "train/train_args.h"

#define F(name, type, def, help) {#name, type, offsetof(glm_train_args, name), def, help, NULL, NULL}
#define C(name, def, choices, help) {#name, ARG_STR, offsetof(glm_train_args, name), def, help, choices, NULL}

const glm_flag glm_train_flags[] = {
    F(model_name_or_path, ARG_STR, NULL, "Hugging Face style folder: config.json + safetensors (+ tokenizer), or a Hugging Face name "
      "(THUDM/chatglm-6b) in the local cache"),
    F(model_revision, ARG_STR, NULL, "the branch, tag or commit of a model named by repository (LLaMA-Factory's; default main)"),
    F(init_from_config, ARG_STR, NULL, "config.json of a model to initialise randomly instead of loading weights"),
    F(init_std, ARG_FLOAT, "0.02", "std of the normal init with --init_from_config"),
    F(adapter_name_or_path, ARG_STR, NULL, "a LoRA adapter folder (peft's files) or P-Tuning v2 checkpoint to train on from, "
      "on --model_name_or_path (its settings are the adapter's; LLaMA-Factory's name); a comma list: the LoRA adapters "
      "before the last merge into the base first"),
    F(create_new_adapter, ARG_BOOL, "false", "merge every adapter of --adapter_name_or_path into the base and train a new "
      "one (--finetuning_type's) on top; false: the adapters before the last merge, the last trains on (LLaMA-Factory's)"),
    F(ptuning_checkpoint, ARG_STR, NULL, "a P-Tuning v2 checkpoint whose prefix to start from (THUDM ptuning's name; "
      "--pre_seq_len must match it)"),
    F(tokenizer_name, ARG_STR, NULL, "tokenizer folder or .model file (default: the model folder)"),
    C(device, "auto", "auto|cpu|cuda", "where to train"),
    F(train_file, ARG_STR, NULL, "training data: .json array or .jsonl (alpaca, prompt/response, sharegpt)"),
    F(validation_file, ARG_STR, NULL, "evaluation data (same formats)"),
    F(dataset, ARG_STR, NULL, "LLaMA-Factory's: names (comma-separated) in <dataset_dir>/dataset_info.json, instead of --train_file"),
    F(dataset_dir, ARG_STR, "data", "LLaMA-Factory's: the folder of dataset_info.json"),
    F(eval_dataset, ARG_STR, NULL, "LLaMA-Factory's: names in dataset_info.json for the validation set, instead of --validation_file"),
    F(template, ARG_STR, NULL, "LLaMA-Factory's: chatglm2|chatglm3|glm4 (checked against the tokenizer, which decides the format); "
      "glmz1: GLM-4's turns with GLM-Z1's thoughts (<think>...</think>, see --enable_thinking)"),
    F(enable_thinking, ARG_BOOL, "true", "--template glmz1 (LLaMA-Factory's): true: the answers' thoughts train, an answer "
      "without one gets the empty thought as a target; false: thoughts removed, the empty thought in the prompt"),
    F(stage, ARG_STR, "sft", "LLaMA-Factory's: sft (supervised fine-tuning), pt (pre-training on texts: {\"text\": ...} "
      "records joined and cut into --cutoff_len blocks), dpo (preference pairs: records with a chosen and a rejected "
      "answer, --pref_loss), rm (a reward model on those pairs: a value head scores each answer's last token) or kto "
      "(records with a true/false kto_tag: desirable answers or not)"),
    F(summary_dropout_prob, ARG_FLOAT, "0.1", "--stage rm: dropout on the value head's input while training (TRL's "
      "ValueHead summary_dropout_prob)"),
    F(ref_model, ARG_STR, NULL, "--stage dpo/kto (LLaMA-Factory's): the reference model's folder (default: the model "
      "training starts from); its values are computed once before training, then it is freed"),
    F(ref_model_adapters, ARG_STR, NULL, "--ref_model's LoRA adapters (a comma list), merged into it as it loads"),
    F(kto_chosen_weight, ARG_FLOAT, "1.0", "--stage kto: the weight of the desirable examples' loss"),
    F(kto_rejected_weight, ARG_FLOAT, "1.0", "--stage kto: the weight of the undesirable examples' loss"),
    F(pref_loss, ARG_STR, "sigmoid", "--stage dpo's loss (LLaMA-Factory's): sigmoid (DPO), hinge, ipo, orpo, simpo; the "
      "first three against the reference (the model training starts from), orpo and simpo without one"),
    F(pref_beta, ARG_FLOAT, "0.1", "--stage dpo: beta, the preference loss's temperature"),
    F(pref_ftx, ARG_FLOAT, "0", "--stage dpo: weight of the chosen answers' supervised loss added to the preference loss"),
    F(simpo_gamma, ARG_FLOAT, "0.5", "--pref_loss simpo: the target reward margin gamma"),
    F(dpo_label_smoothing, ARG_FLOAT, "0", "--pref_loss sigmoid: label smoothing (cDPO), in [0, 0.5]"),
    F(val_size, ARG_FLOAT, "0", "hold out this fraction (<1) or count (>=1) of the training data for evaluation"),
    C(data_format, "auto", "auto|alpaca|columns|chatglm|sharegpt", "record schema"),
    F(prompt_column, ARG_STR, NULL, "ptuning-style prompt column (e.g. content)"),
    F(response_column, ARG_STR, NULL, "ptuning-style response column (e.g. summary)"),
    F(history_column, ARG_STR, NULL, "ptuning-style history column"),
    F(prompt_template, ARG_STR, NULL, "prompt body template, e.g. \"[Round 1]\\n\\n问：{instruction}\\n\\n答：\""),
    F(history_template, ARG_STR, NULL, "one history round, e.g. \"[Round {i1}]\\n\\n问：{q}\\n\\n答：{r}\\n\\n\""),
    F(source_prefix, ARG_STR, NULL, "text prepended to every prompt"),
    F(default_system, ARG_STR, NULL, "the system prompt of every example whose record has none (LLaMA-Factory's): a "
      "system turn for ChatGLM3 and GLM-4, a line before the prompt for ChatGLM-6B and ChatGLM2"),
    F(cache_dir, ARG_STR, NULL, "where the tokenized data cache lives (default: <output_dir>/.cache)"),
    F(max_source_length, ARG_INT, "1024", "prompt tokens kept (ptuning's max_source_length)"),
    F(max_target_length, ARG_INT, "128", "answer tokens kept (ptuning's max_target_length)"),
    F(max_train_samples, ARG_INT, "0", "use only the first N training records (0 = all)"),
    F(train_on_prompt, ARG_BOOL, "false", "put loss on the prompt tokens too"),
    C(conversation_labels, "thudm", "thudm|eos", "ChatGLM3 turns: thudm = finetune_demo's (after-turn token a target), eos = LLaMA-Factory's (assistant turns end in eos)"),
    F(skip_bad_samples, ARG_BOOL, "false", "skip malformed records (counted) instead of stopping"),
    F(group_by_length, ARG_BOOL, "false", "batch examples of similar length together"),
    F(disable_shuffling, ARG_BOOL, "false", "LLaMA-Factory's: the training rows in file order every epoch (no shuffle)"),
    F(dataloader_drop_last, ARG_BOOL, "false", "drop each epoch's last partial micro-batch of training rows (evaluation keeps every example)"),
    F(packing, ARG_BOOL, "false", "pack several examples per row (attention kept apart)"),
    F(dataloader_num_workers, ARG_INT, "0", "threads for tokenization (0 = all cores)"),
    F(preprocessing_num_workers, ARG_INT, "0", "the same as --dataloader_num_workers (the scripts' name for it)"),
    F(preprocessing_batch_size, ARG_INT, "1000", "--stage pt: records whose texts are joined before being cut into "
      "--cutoff_len blocks (LLaMA-Factory's datasets.map batch; each batch's remainder is dropped); --stage kto: the "
      "records among which each one's KL example takes the previous record's answer"),
    F(overwrite_cache, ARG_BOOL, "false", "tokenize the data again even when its cache is valid"),
    F(do_train, ARG_BOOL, "true", "Hugging Face's: false with --do_eval evaluates the model (and adapter) without training"),
    F(do_eval, ARG_BOOL, "false", "evaluate the validation set after training (the scripts' trainer.evaluate()); without "
      "training, the validation file or else the training data"),
    F(do_predict, ARG_BOOL, "false", "THUDM ptuning's (evaluate.sh): after training, or alone without --train_file, answer --test_file "
      "as main.py's trainer.predict samples, writing generated_predictions.txt and predict_results.json (BLEU-4, ROUGE)"),
    F(test_file, ARG_STR, NULL, "the records --do_predict answers (the data schemas of --train_file)"),
    F(max_predict_samples, ARG_INT, "0", "--do_predict answers only the first N records (0 = all)"),
    F(predict_with_generate, ARG_BOOL, "false", "accepted as the scripts pass it; generation metrics: glmtrain generate --input_file"),
    F(max_samples, ARG_INT, "0", "LLaMA-Factory's: the first N records of each dataset (0 = all)"),
    F(data_dir, ARG_STR, NULL, "THUDM's finetune_hf.py data_dir: --train_file / --validation_file are relative to it"),
    F(peft_type, ARG_STR, NULL, "peft's: LORA or PREFIX_TUNING (a finetune_demo config's peft_config), as --finetuning_type lora / ptuning"),
    F(use_cpu, ARG_BOOL, "false", "Hugging Face's: train on the CPU (--device cpu)"),
    F(mask_history, ARG_BOOL, "false", "LLaMA-Factory's: the last answer of a ChatGLM3/GLM-4 conversation alone trains, and "
      "--cutoff_len keeps the last turns first (needs --cutoff_len)"),
    F(cutoff_len, ARG_INT, "0", "LLaMA-Factory's: an example holds at most N tokens, the prompt and answer of each turn cut "
      "as its infer_seqlen cuts them (instead of --max_source_length and --max_target_length; 0: those)"),
    F(trust_remote_code, ARG_BOOL, "false", "accepted: glmtrain runs no Python code of a model folder"),
    F(plot_loss, ARG_BOOL, "false", "LLaMA-Factory's; the loss is in trainer_state.json and TensorBoard (no PNG is drawn)"),
    F(save_only_model, ARG_BOOL, "false", "each checkpoint-N holds the model as the final save would write it, without the "
      "optimizer state (a fraction of the space); a run cannot resume from such a checkpoint (--save_on_interrupt's still can)"),
    C(finetuning_type, "full", "full|lora|ptuning|freeze", "what trains: every weight, LoRA adapters, a P-Tuning v2 prefix, or the last layers"),
    F(lora_rank, ARG_INT, "8", "LoRA: rank r of the adapters"),
    F(lora_alpha, ARG_FLOAT, "0", "LoRA: alpha (scaling alpha/r); 0 = 2 x lora_rank"),
    F(lora_dropout, ARG_FLOAT, "-1", "LoRA: dropout on the adapters' input while training; -1: 0.05, or 0 with --use_dora "
      "(peft's and LLaMA-Factory's DoRA default: with dropout DoRA runs each adapted base product a second time, on the "
      "dropped-out input, as peft does)"),
    F(lora_target, ARG_STR, "query_key_value", "LoRA: comma list of query_key_value, dense, dense_h_to_4h, dense_4h_to_h, or all"),
    F(use_rslora, ARG_BOOL, "false", "LoRA: scaling alpha/sqrt(r) (rank-stabilised LoRA)"),
    F(use_dora, ARG_BOOL, "false", "LoRA: DoRA (peft's use_dora): a trainable magnitude per output row of each adapted module "
      "over the row norms of W + s B A"),
    F(pissa_init, ARG_BOOL, "false", "LoRA: PiSSA's start (peft's init_lora_weights pissa_niter_N): A and B from each weight's "
      "principal singular triplets, the base keeping the residual; the adapter folder carries the first values in pissa_init/"),
    F(pissa_iter, ARG_INT, "16", "PiSSA: the randomized SVD's subspace iterations (torch.svd_lowrank's niter); -1: the full "
      "SVD's top triplets (peft's init_lora_weights pissa), iterated until they stop moving"),
    F(pissa_convert, ARG_BOOL, "false", "PiSSA: also write the adapter converted into a plain LoRA for the original base "
      "(rank 2r) into output_dir/pissa_converted at the end"),
    F(loraplus_lr_ratio, ARG_FLOAT, "0", "LoRA+ (LLaMA-Factory's): the lora_B matrices train at this times the learning rate "
      "(16 is common; 0 = off)"),
    F(use_badam, ARG_BOOL, "false", "BAdam (LLaMA-Factory's use_badam, with --finetuning_type full): every weight of the "
      "layers trains, one whole layer at a time with AdamW, the next taking over every --badam_switch_interval steps with "
      "a fresh optimizer state; only that layer has fp32 master weights, gradients and moments (6B on a 24 GB card); the "
      "embedding, final norm and head stay as loaded"),
    C(badam_mode, "layer", "layer|ratio", "BAdam: layer (blocks are layers); ratio (masked parts of every matrix) is refused"),
    F(badam_start_block, ARG_INT, "-1", "BAdam: the layer that trains first (-1: 0 ascending, the last descending)"),
    C(badam_switch_mode, "ascending", "ascending|descending|random|fixed", "BAdam: the order the layers train in (random: "
      "a fresh permutation of the layers, drawn from --seed, every round)"),
    F(badam_switch_interval, ARG_INT, "50", "BAdam: optimizer steps between switches (the first layer trains one step "
      "fewer, as BAdam counts)"),
    F(badam_update_ratio, ARG_FLOAT, "0.05", "BAdam's ratio mode (refused)"),
    C(badam_mask_mode, "adjacent", "adjacent|scatter", "BAdam's ratio mode (refused)"),
    F(badam_verbose, ARG_INT, "0", "BAdam: 1 or 2 log each switch (glmtrain logs every switch at 0 too, in one line)"),
    F(use_galore, ARG_BOOL, "false", "GaLore (LLaMA-Factory's use_galore, with --finetuning_type full or freeze): the AdamW "
      "moments of the linear weights live in a rank --galore_rank projection of their gradients, renewed from the "
      "gradient's SVD every --galore_update_interval steps (galore_torch's GaLoreAdamW, which every weight then takes)"),
    F(galore_target, ARG_STR, "all", "GaLore: the linear modules it projects, a comma list of parts of their names (all: "
      "every linear module but the output layer)"),
    F(galore_rank, ARG_INT, "16", "GaLore: the rank of the projection"),
    F(galore_update_interval, ARG_INT, "200", "GaLore: optimizer steps between new projections"),
    F(galore_scale, ARG_FLOAT, "2.0", "GaLore: the factor on the projected update (LLaMA-Factory's default 2.0)"),
    C(galore_proj_type, "std", "std|reverse_std|right|left|full", "GaLore: which side projects (std: the shorter one; full: "
      "both, an r x r state)"),
    F(galore_layerwise, ARG_BOOL, "false", "GaLore's update inside backward, layer by layer (--optimizer_in_backward): no "
      "gradient buffer of the whole model; no gradient accumulation, no clipping (as LLaMA-Factory's)"),
    F(use_llama_pro, ARG_BOOL, "false", "LLaMA Pro (LLaMA-Factory's, with --finetuning_type freeze): the layers that train are "
      "the blocks `glmtrain expand` added, every (num_layers / --num_layer_trainable)-th one"),
    F(num_layer_trainable, ARG_INT, "2", "freeze: the last N layers train (N < 0: the first -N), the rest stays frozen"),
    F(additional_target, ARG_STR, "", "LoRA: modules outside the layers that train whole beside the adapters (peft's "
      "modules_to_save), a comma list of final_layernorm and, where the head is untied, word_embeddings and lm_head "
      "(ChatGLM2/3, GLM-4: output_layer)"),
    F(freeze_trainable_modules, ARG_STR, "all", "freeze: which modules of those layers train, a comma list of "
      "input_layernorm, attention (ChatGLM2/3, GLM-4: self_attention), post_attention_layernorm, mlp, or all"),
    F(freeze_extra_modules, ARG_STR, "", "freeze: modules outside the layers that train too, a comma list of "
      "word_embeddings, final_layernorm, and the untied head (lm_head; ChatGLM2/3, GLM-4: output_layer)"),
    F(pre_seq_len, ARG_INT, "0", "P-Tuning v2: prefix length (THUDM's ptuning uses 128); alone it selects --finetuning_type ptuning"),
    F(prefix_projection, ARG_BOOL, "false", "P-Tuning v2: an MLP (Linear, tanh, Linear) after the prefix embedding, as THUDM's PrefixEncoder"),
    F(prefix_dropout, ARG_FLOAT, "0.1", "P-Tuning v2: dropout on the prefix keys/values while training (the original's 0.1)"),
    F(neftune_noise_alpha, ARG_FLOAT, "0", "NEFTune (Hugging Face's and LLaMA-Factory's): uniform noise of alpha/sqrt(seq*hidden) "
      "on the embeddings while training (5 is common; 0 = none)"),
    F(quantization_bit, ARG_INT, "0", "4 or 8: the frozen base's linear weights quantized as THUDM's INT4/INT8 (with lora, ptuning or freeze; 0 = as stored)"),
    C(quantization_type, "int", "int|nf4", "int: THUDM's per-row INT8/INT4; nf4: QLoRA's NormalFloat4 (bitsandbytes, 4-bit)"),
    F(output_dir, ARG_STR, NULL, "where checkpoints and the final model go"),
    F(overwrite_output_dir, ARG_BOOL, "false", "allow a non-empty output_dir"),
    F(logging_dir, ARG_STR, NULL, "TensorBoard folder (default: <output_dir>/runs)"),
    F(report_to, ARG_STR, "tensorboard", "where metrics go besides the console: tensorboard or none (all: tensorboard, the one glmtrain writes)"),
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
    F(max_bad_steps, ARG_INT, "3", "bf16/fp32: stop with an error after this many consecutive steps with a non-finite loss or gradient norm (each one skipped; fp16 skips them through the loss scaler)"),
    C(lr_scheduler_type, "linear", "linear|cosine|constant|constant_with_warmup|cosine_with_restarts|polynomial|inverse_sqrt|cosine_with_min_lr|reduce_lr_on_plateau",
      "learning-rate schedule (transformers' get_scheduler)"),
    {"lr_scheduler_kwargs", ARG_JSON, offsetof(glm_train_args, lr_scheduler_kwargs), "{}",
     "the schedule's settings, as transformers': num_cycles (cosine, cosine_with_restarts, cosine_with_min_lr), min_lr or "
     "min_lr_rate (cosine_with_min_lr), lr_end and power (polynomial), timescale (inverse_sqrt), torch's mode, factor, "
     "patience, threshold, threshold_mode, cooldown, min_lr and eps (reduce_lr_on_plateau)", NULL, NULL},
    F(warmup_steps, ARG_LONG, "0", "linear warmup steps"),
    F(warmup_ratio, ARG_FLOAT, "0", "warmup as a fraction of all steps (when warmup_steps is 0)"),
    F(logging_steps, ARG_FLOAT, "10", "log every N steps, or below 1 a ratio of the run's steps (0.1: every tenth of them, rounded up)"),
    F(logging_first_step, ARG_BOOL, "false", "log the first step too"),
    C(logging_strategy, "steps", "steps|epoch|no", "when to log the training loss: every --logging_steps, at each epoch's end, or never"),
    C(eval_strategy, "no", "no|steps|epoch", "when to evaluate"),
    F(eval_steps, ARG_FLOAT, "0", "evaluate every N steps, or below 1 a ratio of the run's steps (default: logging_steps)"),
    F(eval_delay, ARG_FLOAT, "0", "no evaluation before this many steps (--eval_strategy steps) or epochs (epoch)"),
    F(eval_on_start, ARG_BOOL, "false", "evaluate once before the first step (a resumed run: before its next step), as a sanity check"),
    C(save_strategy, "steps", "no|steps|epoch|best", "when to save checkpoints (best: at each evaluation that beats the "
      "best so far by --metric_for_best_model, as transformers 4.47's)"),
    F(save_steps, ARG_FLOAT, "500", "save a checkpoint every N steps, or below 1 a ratio of the run's steps"),
    F(save_total_limit, ARG_INT, "0", "keep at most N checkpoints (0 = all)"),
    F(load_best_model_at_end, ARG_BOOL, "false", "the final model is the checkpoint with the best evaluation (kept through --save_total_limit); needs --eval_strategy equal to --save_strategy"),
    F(metric_for_best_model, ARG_STR, "loss", "what --load_best_model_at_end compares: loss (eval_loss) or perplexity (eval_perplexity)"),
    F(greater_is_better, ARG_BOOL, "false", "whether a greater --metric_for_best_model is better (false for loss and perplexity)"),
    F(early_stopping_patience, ARG_INT, "0", "stop when --metric_for_best_model has not improved on the best by more than "
      "--early_stopping_threshold for N evaluations in a row (transformers' EarlyStoppingCallback; 0: never; needs "
      "--load_best_model_at_end)"),
    F(early_stopping_threshold, ARG_FLOAT, "0", "the improvement of the metric that counts for --early_stopping_patience"),
    C(save_dtype, "float32", "float32|float16|bfloat16", "dtype of the final model's safetensors"),
    F(max_shard_size, ARG_STR, "10GB", "largest safetensors shard of the final model, as save_pretrained (10GB = 1e10 bytes, 1GiB = 2^30; 0 = one file)"),
    F(save_final_model, ARG_BOOL, "true", "write the trained model to output_dir at the end (false: checkpoints only, e.g. benchmarks)"),
    C(resume_mismatch, "warn", "warn|error", "when a resumed run's settings or tokenized data differ from its checkpoint's"),
    {"resume_from_checkpoint", ARG_STR, offsetof(glm_train_args, resume_from_checkpoint), NULL,
     "checkpoint folder, or alone / \"latest\" for the newest in output_dir", NULL, "latest"},
    F(seed, ARG_INT, "42", "seed for init, shuffling and splits"),
    F(data_seed, ARG_STR, NULL, "seed of the training rows' order alone (Hugging Face's: the data sampler's seed; default --seed)"),
    F(disable_tqdm, ARG_BOOL, "false", "plain log lines instead of a progress bar"),
    F(bf16, ARG_BOOL, "false", "bf16 mixed precision (GPU)"),
    F(fp16, ARG_BOOL, "false", "fp16 mixed precision with dynamic loss scaling (GPU)"),
    F(fp32, ARG_BOOL, "false", "everything in fp32"),
    F(tf32, ARG_BOOL, "false", "with --fp32: the matrix products on TF32 tensor cores (10-bit mantissa inputs, fp32 sums; GPU)"),
    F(full_determinism, ARG_BOOL, "false", "bit-identical GPU runs: every sum in a fixed order (on H100/H200 the attention backward then takes the mma.sync kernels, ~2x slower, instead of summing dq by atomics); the CPU always is"),
    F(fp16_initial_scale, ARG_FLOAT, "65536", "fp16: the dynamic loss scale to start from (GradScaler's init_scale)"),
    {"gradient_checkpointing", ARG_BOOL, offsetof(glm_train_args, gradient_checkpointing), "false",
     "recompute in backward to save memory: true = full (each layer's forward again), selective (the norms, attention "
     "and activation only), auto (the least recompute the memory plan fits under --max_memory_per_gpu or the GPU)",
     GLM_CKPT_LEVELS, NULL},
    F(optim, ARG_STR, "adamw_torch", "the optimizer: adamw_torch (fp32 moments) or adamw_8bit (bitsandbytes' blockwise 8-bit moments, a quarter of the bytes; adamw_bnb_8bit is the same); bitsandbytes' paged_adamw_32bit / paged_adamw_8bit update as these"),
    F(offload_optimizer, ARG_STR, "none", "cpu: keep the optimizer state and master weights in host memory and update them on the host's cores (DeepSpeed's ZeRO-Offload); none: on the device"),
    F(optimizer_in_backward, ARG_BOOL, "false", "update each layer as soon as backward finishes its gradients, so no gradient buffer of the whole model exists (no gradient accumulation or clipping then)"),
    F(max_train_seconds, ARG_FLOAT, "0", "stop (and save) after this many seconds of training (0 = no limit)"),
    {"nproc_per_node", ARG_STR, offsetof(glm_train_args, nproc_per_node), "auto",
     "data-parallel worker processes to start on this node: a number, or auto = one per visible GPU (1 on the CPU)", NULL, "auto"},
    F(nnodes, ARG_INT, "1", "nodes of a multi-node job (start glmtrain once per node)"),
    F(node_rank, ARG_INT, "0", "this node's index in a multi-node job"),
    F(master_addr, ARG_STR, NULL, "address of node 0 for the rendezvous (default 127.0.0.1 on one node)"),
    F(master_port, ARG_INT, "0", "TCP port of the rendezvous on node 0 (0 = a free port on one node, 29500 across nodes)"),
    F(deepspeed, ARG_STR, NULL, "a DeepSpeed config (JSON) as the Trainer takes one: \"auto\" values follow the flags, "
      "given ones must equal them; zero_optimization sets --zero_stage and --offload_optimizer, its optimizer, scheduler "
      "and fp16 sections are DeepSpeed's AdamW, WarmupLR/WarmupDecayLR/WarmupCosineLR and loss scaler (docs/DEEPSPEED.md)"),
    F(zero_stage, ARG_INT, "1", "ZeRO: 0 = every rank keeps the whole optimizer state (DDP), 1 = shard it (the same results with less memory, and faster), 2 = also shard the gradients (staged per layer), 3 = also shard the weights (each layer gathered when it is needed; CPU ranks)"),
    {"ddp_bucket_cap_mb", ARG_FLOAT, offsetof(glm_train_args, bucket_size_mb), "400", "Hugging Face's name for --bucket_size_mb", NULL, NULL},
    F(bucket_size_mb, ARG_FLOAT, "400", "gradients are reduced in buckets of this many MiB as backward completes them"),
    F(ddp_timeout, ARG_FLOAT, "1800", "seconds a collective may wait for the other ranks before every rank stops with an error"),
    F(save_on_interrupt, ARG_BOOL, "false", "on Ctrl-C/SIGTERM finish the step and write a checkpoint before stopping"),
    F(pipeline_parallel_size, ARG_INT, "1", "pipeline stages: the layers are split over this many processes (ranks = stages x data-parallel replicas)"),
    F(device_map, ARG_STR, "auto", "the layer split over the stages: auto (memory-balanced), thudm (THUDM utils.py ranges; final norm and head on the last stage) or a JSON file module -> stage"),
    F(num_microbatches, ARG_INT, "0", "micro-batches per optimizer step in the pipeline's schedule (0: gradient_accumulation_steps; when given it sets that)"),
    F(max_memory_per_gpu, ARG_STR, NULL, "refuse to start when a process's memory plan exceeds this, e.g. 70GiB (glmtrain info shows the plan)"),
};
const int glm_train_nflags = sizeof glm_train_flags / sizeof glm_train_flags[0];

void glm_train_args_free(glm_train_args *a) {
    glm_args_free(glm_train_flags, glm_train_nflags, a);
}

glm_par_opts glm_train_par_opts(const glm_train_args *a) {
    return (glm_par_opts){
        .nproc_per_node = a->nproc_per_node, .master_addr = a->master_addr, .device = a->device, .nnodes = a->nnodes,
        .node_rank = a->node_rank, .master_port = a->master_port, .save_on_interrupt = a->save_on_interrupt,
        .ddp_timeout = a->ddp_timeout, .per_device_train_batch_size = glm_train_rows(a),
        .seq_len = glm_train_seq_len(a),
        .gradient_accumulation_steps = a->gradient_accumulation_steps, .num_microbatches = a->num_microbatches,
        .gradient_checkpointing = a->gradient_checkpointing, .fp16 = a->fp16, .fp32 = a->fp32, .seed = a->seed,
        .zero_stage = a->zero_stage, .pipeline_parallel_size = a->pipeline_parallel_size,
        .optimizer_in_backward = a->optimizer_in_backward, .device_map = a->device_map,
        .max_memory_per_gpu = a->max_memory_per_gpu, .optim = a->optim, .offload_optimizer = a->offload_optimizer,
    };
}

/* Keys of THUDM's finetune_demo configs that are glmtrain's flags by other names, and keys read
 * and left alone (the reason said). */
static const struct { const char *key, *flag, *why; } config_keys[] = {
    {"data_config.train_file", "train_file", NULL},
    /* LLaMA-Factory's training configs: kernels and backends glmtrain chooses itself */
    {"flash_attn", "", "glmtrain picks its attention kernels itself (FlashAttention-style on the GPU)"},
    {"use_unsloth", "", "glmtrain's own kernels run either way"},
    {"enable_liger_kernel", "", "glmtrain's own kernels run either way"},
    {"quantization_method", "", "glmtrain's 4-bit base is THUDM's INT4 or NF4 (--quantization_type nf4), its 8-bit THUDM's INT8"},
    {"rope_scaling", NULL, "glmtrain keeps the model's own rotary positions"},
    {"shift_attn", NULL, "LongLoRA's shifted attention changes what trains, and glmtrain has no such option"},
    {"data_config.val_file", "validation_file", NULL},
    {"data_config.test_file", "", "predictions on it: --do_predict --test_file FILE (BLEU-4, ROUGE), or glmtrain generate --input_file"},
    {"data_config.num_proc", "preprocessing_num_workers", NULL},
    {"max_input_length", "max_source_length", NULL},
    {"max_output_length", "max_target_length", NULL},
    {"training_args.generation_config.max_new_tokens", "", "generation settings are glmtrain generate's flags"},
    {"peft_config.task_type", "", "glmtrain trains causal language models"},
    {"peft_config.r", "lora_rank", NULL},
    {"peft_config.target_modules", "lora_target", NULL},
    {"peft_config.modules_to_save", "additional_target", NULL},
    {"peft_config.num_virtual_tokens", "pre_seq_len", NULL},
    {"peft_config.num_attention_heads", "", "the prefix's shape follows the model's config"},
    {"peft_config.token_dim", "", "the prefix's shape follows the model's config"},
};

/* Hugging Face TrainingArguments and LLaMA-Factory arguments that glmtrain has no use for, on
 * the command line and in configs: read and left alone at values that change nothing here
 * (neutral: "a|b", NULL: any), refused at values that would change what trains; and other
 * tools' or older names of flags (flag: the one they set, its value passed on). */
static const struct { const char *key, *neutral, *flag, *why; } trainer_settings[] = {
    {"evaluation_strategy", NULL, "eval_strategy", "transformers' older name for --eval_strategy"},
    {"per_gpu_train_batch_size", NULL, "per_device_train_batch_size", "transformers' older name for --per_device_train_batch_size"},
    {"per_gpu_eval_batch_size", NULL, "per_device_eval_batch_size", "transformers' older name for --per_device_eval_batch_size"},
    {"no_cuda", NULL, "use_cpu", "transformers' older name for --use_cpu"},
    {"remove_unused_columns", NULL, "", "glmtrain builds its examples itself and keeps no other columns"},
    {"dataloader_pin_memory", NULL, "", "glmtrain's loader stages its batches itself"},
    {"ddp_find_unused_parameters", NULL, "", "glmtrain's data parallel reduces the trainable tensors it knows, none unused"},
    {"ddp_broadcast_buffers", NULL, "", "the model has no buffers to broadcast"},
    {"log_level", NULL, "", "glmtrain logs at one level"},
    {"log_level_replica", NULL, "", "glmtrain logs at one level"},
    {"log_on_each_node", NULL, "", "rank 0 logs for the job"},
    {"save_safetensors", "true|True|1", "", "glmtrain writes safetensors"},
    {"torch_compile", NULL, "", "glmtrain's kernels are compiled ahead of time"},
    {"gradient_checkpointing_kwargs", NULL, "", "glmtrain's checkpointing takes its levels: --gradient_checkpointing true|selective|auto"},
    {"label_smoothing_factor", "0|0.0", "", "label smoothing changes the loss, and glmtrain has no such option (the Trainer's "
                                            "LabelSmoother does not shift ChatGLM's labels: ChatGLMForConditionalGeneration is not "
                                            "among transformers' causal-LM classes, so its smoothed loss pairs each logit with its "
                                            "own token, not the next one)"},
    {"push_to_hub", "false|False|0", "", "glmtrain uploads nothing"},
    {"hub_model_id", NULL, "", "glmtrain uploads nothing"},
    {"hub_strategy", NULL, "", "glmtrain uploads nothing"},
    {"hub_token", NULL, "", "glmtrain uploads nothing"},
    {"hub_private_repo", NULL, "", "glmtrain uploads nothing"},
    {"auto_find_batch_size", "false|False|0", "", "the memory plan says what fits before anything runs: glmtrain info, or "
                                                  "--max_memory_per_gpu with --gradient_checkpointing auto"},
    {"include_num_input_tokens_seen", NULL, "", "glmtrain logs tokens_per_second and counts tokens_seen in trainer_state.json"},
    {"loraplus_lr_embedding", NULL, "", "LoRA+'s rate of embedding adapters; glmtrain's LoRA adapts the linear modules"},
    {"adafactor", "false|False|0", "", "glmtrain trains with AdamW (--optim adamw_torch or adamw_8bit)"},
    {"fp16_opt_level", NULL, "", "apex's setting; glmtrain's fp16 is its own"},
    {"half_precision_backend", "auto|cuda_amp|amp|cpu_amp", "", "NVIDIA apex is not used"},
    {"fp16_backend", "auto|cuda_amp|amp|cpu_amp", "", "NVIDIA apex is not used"},
    {"bf16_full_eval", NULL, "", "evaluation runs in the training precision"},
    {"fp16_full_eval", NULL, "", "evaluation runs in the training precision"},
    {"local_rank", NULL, "", "the rank comes from the launcher (LOCAL_RANK, or glmtrain's own --nproc_per_node)"},
    {"ignore_data_skip", "false|False|0", "", "a resumed run always goes on from its exact data position"},
    {"run_name", NULL, "", "TensorBoard's folder is --logging_dir"},
    {"prediction_loss_only", NULL, "", "evaluation here is the loss"},
    {"save_on_each_node", "false|False|0", "", "rank 0 writes the checkpoints (on a folder every node sees)"},
    {"jit_mode_eval", NULL, "", "evaluation runs glmtrain's own kernels"},
    {"eval_accumulation_steps", NULL, "", "evaluation sums the loss as it goes"},
    {"skip_memory_metrics", NULL, "", "glmtrain prints its memory plan and the GPU's peak itself"},
    {"use_legacy_prediction_loop", NULL, "", "evaluation here is the loss"},
    {"dataloader_persistent_workers", NULL, "", "glmtrain's loader stages its batches itself"},
    {"dataloader_prefetch_factor", NULL, "", "glmtrain's loader stages its batches itself"},
    {"group_by_length_column", NULL, "", "--group_by_length uses the examples' token counts"},
    {"length_column_name", NULL, "", "--group_by_length uses the examples' token counts"},
    {"torch_empty_cache_steps", NULL, "", "glmtrain allocates its buffers once, from the memory plan: no cache to empty"},
    {"logging_nan_inf_filter", NULL, "", "a step whose loss is not finite is reported on its own line and left out of the logged mean"},
    {"average_tokens_across_devices", "true|True|1", "", "the loss is always the mean over the supervised tokens of the whole "
                                                         "global batch (every rank and micro-batch), this flag's true"},
    {"ddp_backend", "nccl|gloo|mpi", "", "glmtrain's data parallel takes NCCL between GPUs and MPI between CPU "
                                         "ranks"},
    {"fsdp", "|false|False|0", "", "glmtrain shards with ZeRO: --zero_stage 3 shards weights, gradients and optimizer "
                                   "states as FSDP's full_shard (--zero_stage 2: shard_grad_op), "
                                   "--offload_optimizer cpu as its offload"},
    {"fsdp_config", NULL, "", "FSDP is not used (see --zero_stage)"},
    {"accelerator_config", NULL, "", "accelerate's settings; glmtrain launches its ranks and splits its batches itself"},
    {"split_batches", "false|False|0", "", "each rank takes --per_device_train_batch_size rows of its own"},
    {"optim_args", "", "", "AdamW's settings are --adam_beta1, --adam_beta2, --adam_epsilon and --weight_decay"},
    {"torchdynamo", NULL, "", "glmtrain's kernels are compiled ahead of time"},
    {"torch_compile_backend", NULL, "", "glmtrain's kernels are compiled ahead of time"},
    {"torch_compile_mode", NULL, "", "glmtrain's kernels are compiled ahead of time"},
    {"use_liger_kernel", NULL, "", "glmtrain's kernels are its own"},
    {"use_ipex", "false|False|0", "", "Intel's extension is not used: glmtrain's CPU kernels are its own"},
    {"use_mps_device", "false|False|0", "", "glmtrain runs on NVIDIA GPUs or the CPU"},
    {"past_index", "-1", "", "ChatGLM keeps no past states between training batches"},
    {"label_names", "labels", "", "the labels are the examples' own"},
    {"include_inputs_for_metrics", NULL, "", "evaluation here is the loss"},
    {"include_for_metrics", NULL, "", "evaluation here is the loss"},
    {"batch_eval_metrics", NULL, "", "evaluation here is the loss"},
    {"eval_do_concat_batches", NULL, "", "evaluation here is the loss"},
    {"eval_use_gather_object", NULL, "", "evaluation here is the loss"},
    {"restore_callback_states_from_checkpoint", NULL, "", "glmtrain has no callbacks; a resumed run restores its own state"},
    {"ray_scope", NULL, "", "there is no hyperparameter search here"},
    {"mp_parameters", NULL, "", "SageMaker's model parallel is not used"},
    {"debug", "", "", "the Trainer's debug modes; glmtrain stops at non-finite losses or gradients itself, naming the step "
                      "(--max_bad_steps)"},
    /* LLaMA-Factory's arguments (its webui's commands and example configs write them) */
    {"freeze_trainable_layers", NULL, "num_layer_trainable", "LLaMA-Factory's name for --num_layer_trainable (the last N "
                                                             "layers train; a negative N, the first -N)"},
    {"pure_bf16", NULL, "bf16", "glmtrain's bf16 keeps fp32 master weights and AdamW states for the tensors that train "
                                "(with LoRA a few MB); for less memory: --optim adamw_8bit or --zero_stage"},
    {"modules_to_save", NULL, "additional_target", "peft's name for --additional_target"},
#define LESS_OPTIMIZER_MEMORY "; for less optimizer memory: --use_galore, --optim adamw_8bit, --zero_stage 2|3 or --offload_optimizer cpu"
    {"use_apollo", "false|False|0", "", "APOLLO's optimizer is not here" LESS_OPTIMIZER_MEMORY},
    {"use_adam_mini", "false|False|0", "", "Adam-mini is not here" LESS_OPTIMIZER_MEMORY},
#undef LESS_OPTIMIZER_MEMORY
    {"use_swanlab", "false|False|0", "", "glmtrain reports to TensorBoard (--report_to tensorboard)"},
    {"include_effective_tokens_per_second", NULL, "", "glmtrain logs tokens_per_second, the supervised and prompt tokens alike"},
    {"use_fast_tokenizer", NULL, "", "glmtrain's tokenizer is its own, with the ids of THUDM's"},
    {"low_cpu_mem_usage", NULL, "", "glmtrain reads the weights tensor by tensor, never a second copy"},
    {"disable_version_checking", NULL, "", "glmtrain checks no package versions"},
    {"ray_run_name", NULL, "", "Ray is not used"},
    {"model_max_length", NULL, "", "an example's length is --cutoff_len (or --max_source_length + --max_target_length)"},
    {"infer_dtype", NULL, "", "evaluation runs in the training precision (generate and chat take it as --dtype)"},
    {"moe_aux_loss_coef", NULL, "", "ChatGLM models have no mixture of experts"},
    {"buffer_size", NULL, "", "the data are read whole (no streaming)"},
    {"media_dir", NULL, "", "ChatGLM models take no images, videos or audio"},
    {"image_max_pixels", NULL, "", "ChatGLM models take no images"},
    {"freeze_language_model", "false|False|0", "", "ChatGLM models have only the language model: --finetuning_type freeze picks its layers"},
    {"quantization_device_map", NULL, "", "glmtrain quantizes on the device that trains"},
    {"offload_folder", NULL, "", "glmtrain offloads the optimizer's state to host memory (--offload_optimizer cpu), not weights to disk"},
    {"efficient_packing", NULL, "packing", "LLaMA-Factory's older name for neat_packing: --packing keeps the packed examples apart"},
    {"split_special_tokens", "false|False|0", "", "the tokenizer keeps ChatGLM's special tokens whole, as THUDM's"},
    {"new_special_tokens", "", "", "the tokenizer and the embedding keep the model's vocabulary"},
    {"mixture_of_depths", "", "", "mixture-of-depths layers are not here"},
    {"eval_on_each_dataset", "false|False|0", "", "evaluation takes the eval datasets together, one loss"},
    {"adapter_folder", "", "", "name the adapter folder itself: --adapter_name_or_path DIR"},
    {"freeze_vision_tower", NULL, "", "ChatGLM models have no vision tower"},
    {"freeze_multi_modal_projector", NULL, "", "ChatGLM models have no multi-modal projector"},
    {"resize_vocab", "false|False|0", "", "the tokenizer and the embedding keep the model's vocabulary"},
    {"upcast_layernorm", NULL, "", "glmtrain's norms compute in fp32 whatever the storage"},
    {"upcast_lmhead_output", NULL, "", "glmtrain's loss reads the logits in fp32"},
    {"disable_gradient_checkpointing", NULL, "", "glmtrain recomputes only with --gradient_checkpointing (LLaMA-Factory's "
                                                 "default is on: give --gradient_checkpointing true for the same memory)"},
    {"use_unsloth_gc", NULL, "", "glmtrain's own checkpointing: --gradient_checkpointing true|selective|auto"},
    {"print_param_status", NULL, "", "glmtrain prints the trainable and frozen parameter counts"},
    {"train_from_scratch", "false|False|0", "", "a model drawn at random from a config: --init_from_config FOLDER/config.json"},
    {"neat_packing", NULL, "packing", "glmtrain's --packing keeps the packed examples' attention apart, as neat_packing"},
    {"tool_format", NULL, "", "the tokenizer's model decides how tools are written (ChatGLM3's and GLM-4's own)"},
    {"tokenized_path", NULL, "", "glmtrain keeps the tokenized data in --cache_dir (checked against the data and settings)"},
    {"streaming", "false|False|0", "", "glmtrain reads each data file whole"},
    {"mix_strategy", "concat", "", "datasets are concatenated in the order named"},
    {"interleave_probs", "", "", "datasets are concatenated in the order named"},
    {"ignore_pad_token_for_loss", "true|True|1", "", "padding is never a target here (THUDM's main.py default)"},
    {"compute_accuracy", NULL, "", "evaluation here is the loss and perplexity"},
    {"double_quantization", "true|True|1", "", "glmtrain's NF4 base always quantizes the blocks' scales again, as "
                                               "bitsandbytes' double quantization (LLaMA-Factory's default)"},
    {"eval_num_beams", NULL, "", "generation settings are glmtrain generate's flags"},
    {"max_new_tokens", NULL, "", "generation settings are glmtrain generate's flags"},
    {"do_sample", NULL, "", "generation settings are glmtrain generate's flags"},
    {"temperature", NULL, "", "generation settings are glmtrain generate's flags"},
    {"top_p", NULL, "", "generation settings are glmtrain generate's flags"},
    {"top_k", NULL, "", "generation settings are glmtrain generate's flags"},
    {"repetition_penalty", NULL, "", "generation settings are glmtrain generate's flags"},
    /* Seq2SeqTrainingArguments' (THUDM's ptuning main.py parses them) */
    {"generation_max_length", NULL, "", "--do_predict answers with main.py's trainer.predict settings; others: glmtrain generate"},
    {"generation_num_beams", NULL, "", "--do_predict answers with main.py's trainer.predict settings; others: glmtrain generate"},
    {"sortish_sample", "false|False|0", "", "batches of similar lengths: --group_by_length"},
};

/* one of a "a|b" list */
static int listed(const char *list, const char *v) {
    size_t n = strlen(v);
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, '|');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, v, n)) return 1;
        p = e ? e + 1 : NULL;
    }
    return 0;
}

/* trainer_settings' reading of key (NULL refused, "" left alone, a flag name), or key itself */
static const char *trainer_setting(const char *key, const char *value, char *why, size_t why_len) {
    for (size_t i = 0; i < sizeof trainer_settings / sizeof *trainer_settings; i++) {
        if (strcmp(key, trainer_settings[i].key)) continue;
        snprintf(why, why_len, "%s", trainer_settings[i].why);
        if (trainer_settings[i].flag[0]) return trainer_settings[i].flag;
        if (trainer_settings[i].neutral && !listed(trainer_settings[i].neutral, value ? value : "true")) return NULL;
        return "";
    }
    return key;
}

const char *glm_train_config_key(const char *key, const char *value, char *why, size_t why_len) {
    for (size_t i = 0; i < sizeof config_keys / sizeof *config_keys; i++)
        if (!strcmp(key, config_keys[i].key)) {
            if (config_keys[i].why) snprintf(why, why_len, "%s", config_keys[i].why);
            return config_keys[i].flag;
        }
    if (!strncmp(key, "training_args.generation_config.", 32)) {
        snprintf(why, why_len, "generation settings are glmtrain generate's flags");
        return "";
    }
    /* the rest of training_args and peft_config are flags of the same names */
    if (!strncmp(key, "training_args.", 14)) return trainer_setting(key + 14, value, why, why_len);
    if (!strncmp(key, "peft_config.", 12)) return key + 12;
    if (!strncmp(key, "data_config.", 12)) {
        snprintf(why, why_len, "a data_config key glmtrain does not know (train_file, val_file, test_file, num_proc)");
        return NULL;
    }
    return trainer_setting(key, value, why, why_len);
}

int glm_train_resolve_args(glm_train_args *a, glm_err *err) {
    if (glm_hub_resolve(&a->model_name_or_path, "model_name_or_path", a->model_revision, err) ||
        glm_hub_resolve(&a->tokenizer_name, "tokenizer_name", a->model_revision, err) ||
        glm_hub_resolve_list(&a->adapter_name_or_path, "adapter_name_or_path", err))
        return -1;
    if (a->peft_type) { /* a finetune_demo config's peft_config.peft_type */
        const char *kind = !strcmp(a->peft_type, "LORA") ? "lora" : !strcmp(a->peft_type, "PREFIX_TUNING") ? "ptuning" : NULL;
        if (!kind)
            return glm_fail(err, "peft_type %s: glmtrain trains LORA and PREFIX_TUNING (P-Tuning v2)", a->peft_type),
                   glm_hint(err, "or --finetuning_type full|lora|ptuning|freeze");
        free(a->finetuning_type);
        a->finetuning_type = glm_strdup(kind);
    }
    if (a->use_cpu) { free(a->device); a->device = glm_strdup("cpu"); }
    a->lora_dropout = glm_train_lora_dropout(a->lora_dropout, a->use_dora);
    /* THUDM's evaluate.sh: --do_predict without training data predicts alone (the Trainer's
     * do_train is false unless given; glmtrain's default is true for training scripts) */
    if (a->do_predict && !a->train_file && !a->dataset) a->do_train = 0;
    if (a->data_dir) { /* finetune_hf.py's data_dir: the data files are relative to it */
        char **files[] = {&a->train_file, &a->validation_file, &a->test_file};
        for (int k = 0; k < 3; k++)
            if (*files[k] && (*files[k])[0] != '/') {
                char p[4096];
                glm_path_join(p, sizeof p, a->data_dir, *files[k]);
                free(*files[k]);
                *files[k] = glm_strdup(p);
            }
    }
    return glm_ds_apply(a, err);
}
