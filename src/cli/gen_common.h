/* What `glmtrain generate` and `glmtrain chat` share: the generation flags (Hugging Face
 * generation names), the device choice, and a loaded model + tokenizer. */
#ifndef GLM_CLI_GEN_COMMON_H
#define GLM_CLI_GEN_COMMON_H
#include <stddef.h>
#include "core/args.h"
#include "infer/generate.h"
#include "infer/text_vocab.h"

typedef struct gen_args {
    /* common */
    char *model_name_or_path, *tokenizer_name, *device, *dtype, *device_map, *adapter, *quantization_type, *system;
    char *ptuning_checkpoint; /* THUDM's name for --adapter, which must then be a P-Tuning v2 checkpoint */
    char *adapter_name_or_path; /* LLaMA-Factory's name for --adapter */
    char *template, *finetuning_type, *infer_backend; /* LLaMA-Factory's inference settings, checked (gen_open_tokenizer) */
    char *infer_dtype; /* LLaMA-Factory's name for --dtype (gen_parse takes it over) */
    /* not a flag: LoRA adapters to merge into the base where the command applies the last
     * adapter itself (serve's model adapter of a list); NULL for none */
    const char *merge_into_base;
    char *model_revision; /* the Hugging Face cache's revision of a model named by repository (core/hub.h) */
    int quantization_bit, enable_thinking;
    int do_sample, max_length, max_new_tokens, top_k, seed, debug, pipeline_parallel_size;
    double top_p, temperature, repetition_penalty;
    /* generate */
    char *prompt, *input_file, *output_file, *metrics_file, *data_format, *prompt_column, *response_column,
        *history_column, *prompt_template, *history_template, *source_prefix;
    int max_source_length, per_device_eval_batch_size, postprocess, max_predict_samples, skip_bad_samples;
    /* chat */
    int reuse_kv_cache;
    /* generate and chat: prompt lookup (Hugging Face generate's names) */
    int prompt_lookup_num_tokens, max_matching_ngram_size;
    /* generate and chat: decoding constraints (vLLM's guided decoding names) */
    char *guided_json, *guided_choice, *guided_regex;
    int guided_json_object;
    /* eval (LLaMA-Factory's eval arguments) */
    char *task, *task_dir, *lang, *save_dir;
    int n_shot, batch_size;
    /* not flags: whether the command line or --config gave these (gen_parse) */
    int max_length_set, max_new_tokens_set, top_p_set, temperature_set;
} gen_args;

#define GEN_F(name, type, def, help) {#name, type, offsetof(gen_args, name), def, help, NULL, NULL}
#define GEN_COMMON_FLAGS \
    GEN_F(model_name_or_path, ARG_STR, NULL, "model folder: config.json + safetensors or pytorch_model*.bin (+ tokenizer), or a Hugging Face name (THUDM/chatglm-6b) in the local cache"), \
    GEN_F(model_revision, ARG_STR, NULL, "the branch, tag or commit of a model named by repository (default main)"), \
    GEN_F(tokenizer_name, ARG_STR, NULL, "tokenizer folder or .model (default: the model folder)"), \
    GEN_F(adapter, ARG_STR, NULL, "LoRA adapter folder or P-Tuning v2 checkpoint on top of the model (glmtrain --finetuning_type lora|ptuning, peft's save_pretrained, THUDM's ptuning output)"), \
    GEN_F(ptuning_checkpoint, ARG_STR, NULL, "a P-Tuning v2 checkpoint on top of the model (THUDM's flag name; as --adapter)"), \
    GEN_F(adapter_name_or_path, ARG_STR, NULL, "LLaMA-Factory's name for --adapter"), \
    GEN_F(template, ARG_STR, NULL, "LLaMA-Factory's: checked against the tokenizer (chatglm, chatglm2, chatglm3, glm4), whose own prompt format is used; glmz1: GLM-Z1's thoughts (earlier answers sent back without them)"), \
    GEN_F(enable_thinking, ARG_BOOL, "true", "--template glmz1: false ends the prompt with the empty thought, so the model answers without thinking"), \
    GEN_F(finetuning_type, ARG_STR, NULL, "LLaMA-Factory's: lora or freeze/full (the adapter's folder decides, as --adapter)"), \
    GEN_F(infer_backend, ARG_STR, NULL, "LLaMA-Factory's: huggingface (glmtrain's own engine runs either way)"), \
    {"infer_dtype", ARG_STR, offsetof(gen_args, infer_dtype), NULL, "LLaMA-Factory's name for --dtype", "auto|float32|float16|bfloat16", NULL}, \
    {"device", ARG_STR, offsetof(gen_args, device), "auto", "where to run (auto: a GPU when built with CUDA and one is usable)", "auto|cpu|cuda", NULL}, \
    {"dtype", ARG_STR, offsetof(gen_args, dtype), "auto", "GPU storage dtype (auto: bfloat16; the CPU computes in float32)", "auto|float32|float16|bfloat16", NULL}, \
    GEN_F(quantization_bit, ARG_INT, "0", "4 or 8: quantize the linear weights as they load (THUDM's INT4/INT8); 0 = as stored"), \
    {"quantization_type", ARG_STR, offsetof(gen_args, quantization_type), "int", "int: THUDM's per-row INT8/INT4; nf4: QLoRA's NormalFloat4", "int|nf4", NULL}, \
    GEN_F(device_map, ARG_STR, NULL, "split the layers over GPUs: auto, thudm, or a JSON map of module names to stages"), \
    GEN_F(pipeline_parallel_size, ARG_INT, "0", "stages for --device_map auto|thudm (0: every visible GPU)"), \
    GEN_F(do_sample, ARG_BOOL, "true", "sample (false = greedy)"), \
    GEN_F(max_length, ARG_INT, "2048", "prompt + response tokens (ChatGLM2/3: 8192 unless given; capped at the model's length)"), \
    GEN_F(max_new_tokens, ARG_INT, NULL, "response tokens, >= 1 (overrides max_length; prompt + these must fit max_sequence_length)"), \
    GEN_F(top_p, ARG_FLOAT, "0.7", "nucleus sampling mass (ChatGLM2/3 models: 0.8 unless given)"), \
    GEN_F(top_k, ARG_INT, "50", "sample among the k most likely tokens (0 = all)"), \
    GEN_F(temperature, ARG_FLOAT, "0.95", "softmax temperature (ChatGLM2/3 models: 0.8 unless given)"), \
    GEN_F(repetition_penalty, ARG_FLOAT, "1.0", "penalty for tokens already in the sequence (1 = none)"), \
    GEN_F(seed, ARG_INT, "42", "sampling seed"), \
    GEN_F(debug, ARG_BOOL, "false", "print prompts and token ids to stderr"), \
    GEN_F(system, ARG_STR, NULL, "system prompt (ChatGLM3/GLM-4: a <|system|> turn; others: \"system\\n\" before the prompt); with --input_file, of the records without one (as train's --default_system)")

/* Prompt lookup, for the commands that decode one prompt at a time (generate, chat). */
#define GEN_LOOKUP_FLAGS \
    GEN_F(prompt_lookup_num_tokens, ARG_INT, "0", "draft up to this many tokens from where the prompt and the response so far repeat their last words, checked in one pass (Hugging Face's prompt lookup; the same tokens, faster where answers copy from the input; 0 = off)"), \
    GEN_F(max_matching_ngram_size, ARG_INT, "2", "the longest run of last tokens looked up for a draft")

/* Decoding constraints (vLLM's GuidedDecodingParams names), for generate and chat. */
#define GEN_GUIDED_FLAGS \
    GEN_F(guided_json, ARG_STR, NULL, "every answer is a JSON object this JSON Schema allows: the schema's text or a .json file (the keywords docs/SERVE.md lists)"), \
    GEN_F(guided_json_object, ARG_BOOL, "false", "every answer is a JSON object (OpenAI's JSON mode)"), \
    GEN_F(guided_regex, ARG_STR, NULL, "every answer matches this regular expression whole (Python's syntax, the subset docs/INFERENCE.md lists)"), \
    GEN_F(guided_choice, ARG_STR, NULL, "every answer is exactly one of these strings: a JSON list ([\"正面\", \"负面\"]) or a file of one choice a line")

/* The adapter folder to load: --adapter, --adapter_name_or_path or --ptuning_checkpoint (gen_parse
 * refuses two of them); a comma list, the adapters before the last are merged into the base. */
static inline const char *gen_adapter(const gen_args *a) {
    return a->adapter ? a->adapter : a->adapter_name_or_path ? a->adapter_name_or_path : a->ptuning_checkpoint;
}

struct glm_pipe_lm;
typedef struct gen_session {
    glm_backend *be;
    glm_model m;
    int model_ok;
    struct glm_pipe_lm *pipe; /* with --device_map: the model split over devices (m unused) */
    glm_tokenizer *tok;
    glm_gen_cfg g;
    glm_config cfg; /* config.json, read before the weights */
    /* gen_adapter's list split (LLaMA-Factory's --adapter_name_or_path a,b): the adapters merged
     * into the base as it loads, and the one loaded beside it ("" for none) */
    char merged[4096], adapter[4096];
    /* --template glmz1 (data/thought.h): earlier answers go back without their thoughts; with
     * --enable_thinking false the prompt ends in the empty thought */
    int reasoning, disable_thinking;
    glm_gen_stats lookup; /* prompt lookup's counts (g.stats points here when it is on) */
    struct glm_constraint *constraint; /* --guided_*: g.constraint, over the tokens' bytes in vocab */
    glm_text_vocab vocab;
} gen_session;

/* model.chat's post-processing of an answer, unless a --guided_* constraint made it (its text is
 * then returned as decoded: ChatGLM-6B's punctuation widening could change a choice or an enum's value). */
static inline int gen_postprocess(const gen_session *s, int want) { return want && !s->constraint; }

/* Parses flags (prints usage and returns 1 for --help; -1 on error). */
int gen_parse(const glm_flag *f, int n, gen_args *a, int argc, char **argv, const char *cmd, glm_err *err);
void gen_args_free(const glm_flag *f, int n, gen_args *a);
/* Backend, model, weights, tokenizer, generation settings: gen_open_tokenizer, then gen_open_model. */
int gen_open(gen_session *s, const gen_args *a, glm_err *err);
/* config.json, the tokenizer and the generation settings fitted to the model's
 * max_sequence_length: enough to check prompts before the weights are read. */
int gen_open_tokenizer(gen_session *s, const gen_args *a, glm_err *err);
/* Backend and weights (after gen_open_tokenizer). */
int gen_open_model(gen_session *s, const gen_args *a, glm_err *err);
void gen_close(gen_session *s);
/* The model generation runs on: the single model or the split one. */
glm_lm gen_lm(gen_session *s);
const glm_config *gen_config(const gen_session *s);
/* glm_chat_inputs_sys under the session's --template glmz1 rules (gen_session.reasoning): the
 * history's answers without their thoughts, and with thinking off the empty thought at the end
 * (room kept for it within max_prompt; *prompt_text, when asked for, shows it too). */
int gen_chat_inputs(const gen_session *s, const char *system, const char *query, const char *const *hist, int n_hist,
                    int max_prompt, glm_ids *out, int *dropped, char **prompt_text, glm_err *err);
/* Prompt lookup's counts so far, as an info line (nothing when it is off). */
void gen_report_lookup(const gen_session *s);
/* "a\nb" -> "a\\nb" for one-line debug output (caller frees). */
char *gen_escape(const char *s);

/* Printing a response as its tokens arrive (chat, and generate --prompt on a terminal):
 * gen_stream_token is a glm_token_fn over a gen_stream. */
typedef struct gen_stream {
    glm_streamer st;
    int show;  /* print the text (else only the --debug token lines) */
    int debug; /* "[debug] token ID" to stderr per token */
} gen_stream;
void gen_stream_token(void *ctx, int row, int32_t id);

#endif
