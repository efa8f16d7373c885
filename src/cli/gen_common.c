/* Shared set-up of `glmtrain generate` and `glmtrain chat` (cli/gen_common.h). */
#include "cli/gen_common.h"
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "infer/chat.h"
#include "infer/constrain.h"
#include "core/hub.h"
#include "model/adapter.h"
#include "data/dataset_info.h"
#include "data/thought.h"
#include "parallel/pipe/pipe_infer.h"
#include "ckpt/checkpoint.h"

/* A value no flag can hold: what is still this after parsing was not given. */
#define UNSET INT_MIN

int gen_parse(const glm_flag *f, int n, gen_args *a, int argc, char **argv, const char *cmd, glm_err *err) {
    memset(a, 0, sizeof *a); /* what a command's table leaves out (serve has no --adapter_name_or_path) stays unset */
    glm_args_defaults(f, n, a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { glm_args_usage(f, n, cmd); return 1; }
    /* --max_new_tokens 0 is an error (HF's too), leaving it out is not; an explicit --max_length
     * above the model's limit is worth a warning, the default is not */
    int def_len = a->max_length;
    double def_top_p = a->top_p, def_temp = a->temperature;
    a->max_length = a->max_new_tokens = UNSET;
    a->top_p = a->temperature = NAN; /* the model's chat defaults apply where these stay unset */
    int rc = glm_args_parse(f, n, a, argc, argv, err);
    a->max_length_set = a->max_length != UNSET;
    a->max_new_tokens_set = a->max_new_tokens != UNSET;
    a->top_p_set = !isnan(a->top_p);
    a->temperature_set = !isnan(a->temperature);
    if (!a->max_length_set) a->max_length = def_len;
    if (!a->top_p_set) a->top_p = def_top_p;
    if (!a->temperature_set) a->temperature = def_temp;
    if (!a->max_new_tokens_set) a->max_new_tokens = 0;
    if (rc == 0 && (glm_hub_resolve(&a->model_name_or_path, "model_name_or_path", a->model_revision, err) ||
                    glm_hub_resolve(&a->tokenizer_name, "tokenizer_name", a->model_revision, err) ||
                    glm_hub_resolve_list(&a->adapter, "adapter", err) ||
                    glm_hub_resolve_list(&a->adapter_name_or_path, "adapter_name_or_path", err)))
        return -1;
    if (rc == 0 && a->infer_dtype && strcmp(a->infer_dtype, "auto")) { /* LLaMA-Factory's inference configs */
        if (strcmp(a->dtype, "auto") && strcmp(a->dtype, a->infer_dtype))
            return glm_fail(err, "--dtype %s and --infer_dtype %s disagree", a->dtype, a->infer_dtype), glm_hint(err, "give one");
        free(a->dtype);
        a->dtype = glm_strdup(a->infer_dtype);
    }
    if (rc == 0 && !!a->ptuning_checkpoint + !!a->adapter + !!a->adapter_name_or_path > 1)
        return glm_fail(err, "more than one of --adapter, --adapter_name_or_path and --ptuning_checkpoint: one adapter at a time");
    if (rc == 0 && a->max_new_tokens_set && a->max_new_tokens < 1) {
        glm_fail(err, "--max_new_tokens must be >= 1 (got %d)", a->max_new_tokens);
        return glm_hint(err, "leave it out to generate up to --max_length tokens in all");
    }
    return rc;
}

void gen_args_free(const glm_flag *f, int n, gen_args *a) {
    glm_args_free(f, n, a);
}

static glm_dtype gen_dtype(const gen_args *a) {
    return !strcmp(a->dtype, "float32") ? GLM_F32 : !strcmp(a->dtype, "float16") ? GLM_F16 : GLM_BF16;
}

static int pick_backend(gen_session *s, const gen_args *a, glm_err *err) {
    /* --dtype auto on a GPU without bf16 (Turing): fp16, as THUDM's own chat code runs the model */
    glm_dtype dts[2] = {gen_dtype(a), GLM_F16};
    int n = dts[0] == GLM_BF16 && !strcmp(a->dtype, "auto") ? 2 : 1;
    char why[512];
    if (glm_backend_open(a->device, 0, dts, n, &s->be, why, sizeof why, err)) return -1;
    if (s->be && glm_backend_on_gpu(s->be) && s->be->dtype != dts[0])
        glm_info("this GPU has no bf16; running in float16 (--dtype float32 for full precision)");
    if (!s->be) {
        if (why[0]) glm_warn("%s; running on the CPU", why);
        s->be = glm_backend_cpu();
    }
    if (!glm_backend_on_gpu(s->be) && strcmp(a->dtype, "auto") && strcmp(a->dtype, "float32"))
        glm_warn("--dtype %s ignored: the CPU backend computes in float32", a->dtype);
    return 0;
}

/* A training checkpoint (checkpoint-N, sealed by ckpt/checkpoint.h) is verified before its
 * weights are read: a damaged one is refused with the file named. */
static int check_sealed(const char *path, glm_err *err) {
    char manifest[4096], why[1200];
    glm_path_join(manifest, sizeof manifest, path, GLM_CKPT_MANIFEST);
    if (!glm_is_file(manifest) || glm_checkpoint_verify(path, why, sizeof why) >= 0) return 0;
    glm_fail(err, "--model_name_or_path %s: %s", path, why);
    return glm_hint(err, "the checkpoint is damaged: use an older checkpoint-N of the run or its final model");
}

/* The generation settings against config.json's max_sequence_length (HF meanings:
 * max_length = prompt + new tokens, max_new_tokens wins over it). */
static int fit_limits(gen_session *s, const gen_args *a, glm_err *err) {
    char src[4200];
    snprintf(src, sizeof src, "the config.json of %s", a->model_name_or_path);
    if (glm_gen_cfg_fit(&s->g, s->cfg.max_sequence_length, src, err)) return -1;
    int mm = s->g.model_max_length;
    if (mm > 0 && a->max_length_set && !a->max_new_tokens_set && a->max_length > mm)
        glm_warn("--max_length %d is above the model's max_sequence_length %d (%s): prompt + response stop at %d tokens",
                 a->max_length, mm, src, mm);
    return 0;
}

#define MAX_GUIDED_CHOICES 64

/* A flag's JSON: the file the value names, else the value itself. */
static cJSON *flag_json(const char *flag, const char *v, glm_err *err) {
    char *file = glm_is_file(v) ? glm_read_file(v, NULL, err) : NULL;
    if (glm_is_file(v) && !file) return glm_wrap(err, "--%s: ", flag), NULL;
    const char *p = file ? file : v, *end = NULL;
    cJSON *j = cJSON_ParseWithOpts(p, &end, 1);
    if (!j) {
        long line = 1;
        for (const char *q = p; end && q < end; q++) line += *q == '\n';
        if (file) glm_fail(err, "--%s %s: not JSON (line %ld, near \"%.20s\")", flag, v, line, end ? end : "");
        else glm_fail(err, "--%s %.200s: no such file, and not JSON (near \"%.20s\")", flag, v, end ? end : v);
        glm_hint(err, !strcmp(flag, "guided_json") ? "give a JSON Schema object or a .json file holding one"
                                                 : "give a JSON list of strings or a file of one choice a line");
    }
    free(file);
    return j;
}

/* --guided_choice: a file of one choice a line (empty lines skipped), or a JSON list. */
static glm_constraint *guided_choices(const char *v, glm_err *err) {
    const char *s[MAX_GUIDED_CHOICES];
    char *file = NULL;
    cJSON *j = NULL;
    int n = 0, bad = 0;
    if (glm_is_file(v)) {
        if (!(file = glm_read_file(v, NULL, err))) return glm_wrap(err, "--guided_choice: "), NULL;
        for (char *line = strtok(file, "\r\n"); line && !bad; line = strtok(NULL, "\r\n")) {
            if (n == MAX_GUIDED_CHOICES || strlen(line) > 1024) bad = 1;
            else s[n++] = line;
        }
    } else {
        if (!(j = flag_json("guided_choice", v, err))) return NULL;
        const cJSON *it;
        cJSON_ArrayForEach(it, j) {
            if (n == MAX_GUIDED_CHOICES || !cJSON_IsString(it) || !it->valuestring[0] || strlen(it->valuestring) > 1024) { bad = 1; break; }
            s[n++] = it->valuestring;
        }
        bad |= !cJSON_IsArray(j);
    }
    glm_constraint *c = NULL;
    if (bad || n == 0) {
        glm_fail(err, "--guided_choice %s: 1 to %d non-empty strings of at most 1024 bytes", v, MAX_GUIDED_CHOICES);
        glm_hint(err, "a JSON list ([\"yes\", \"no\"]) or a file of one choice a line");
    } else {
        c = glm_constraint_choices(s, n);
    }
    cJSON_Delete(j);
    free(file);
    return c;
}

/* --guided_json, --guided_json_object, --guided_choice, --guided_regex: the constraint every answer keeps to, over
 * the model's tokens' bytes. */
static int open_constraint(gen_session *s, const gen_args *a, glm_err *err) {
    int n = !!a->guided_json + !!a->guided_json_object + !!a->guided_choice + !!a->guided_regex;
    if (!n) return 0;
    if (n > 1) return glm_fail(err, "more than one of --guided_json, --guided_json_object, --guided_choice and --guided_regex"),
               glm_hint(err, "an answer keeps to one constraint");
    char why[512];
    if (a->guided_json) {
        cJSON *j = flag_json("guided_json", a->guided_json, err);
        if (!j) return -1;
        int is_object = cJSON_IsObject(j);
        s->constraint = is_object ? glm_constraint_schema(j, why, sizeof why) : NULL;
        cJSON_Delete(j);
        if (!s->constraint)
            return glm_fail(err, "--guided_json %s: %s", a->guided_json, is_object ? why : "the schema must be a JSON object"),
                   glm_hint(err, "docs/SERVE.md lists the keywords a schema may use");
    } else if (a->guided_regex) {
        if (!(s->constraint = glm_constraint_regex(a->guided_regex, why, sizeof why)))
            return glm_fail(err, "--guided_regex %s: %s", a->guided_regex, why),
                   glm_hint(err, "docs/INFERENCE.md lists the regular expressions' syntax");
    } else if (a->guided_choice) {
        if (!(s->constraint = guided_choices(a->guided_choice, err))) return -1;
    } else {
        s->constraint = glm_constraint_json();
    }
    glm_text_vocab_build(&s->vocab, s->tok, s->cfg.vocab_size);
    s->g.constraint = s->constraint;
    s->g.vocab = &s->vocab;
    return 0;
}

int gen_open_tokenizer(gen_session *s, const gen_args *a, glm_err *err) {
    memset(s, 0, sizeof *s);
    if (!a->model_name_or_path) return glm_fail(err, "--model_name_or_path is required");
    s->g = (glm_gen_cfg){.do_sample = a->do_sample, .max_length = a->max_length, .max_new_tokens = a->max_new_tokens,
                         .temperature = (float)a->temperature, .top_p = (float)a->top_p, .top_k = a->top_k,
                         .repetition_penalty = (float)a->repetition_penalty,
                         .prompt_lookup_num_tokens = a->prompt_lookup_num_tokens,
                         .max_matching_ngram_size = a->max_matching_ngram_size};
    if (s->g.prompt_lookup_num_tokens > 0) s->g.stats = &s->lookup;
    if (glm_gen_cfg_check(&s->g, err)) return -1;
    if (check_sealed(a->model_name_or_path, err)) return -1;
    if (glm_config_load(&s->cfg, a->model_name_or_path, err)) return -1;
    if (glm_config_set_quant(&s->cfg, a->quantization_bit, a->quantization_type, a->model_name_or_path, err)) return -1;
    glm_adapter_list_split(gen_adapter(a), 0, s->merged, sizeof s->merged, s->adapter, sizeof s->adapter);
    if (!s->merged[0] && a->merge_into_base) snprintf(s->merged, sizeof s->merged, "%s", a->merge_into_base);
    const char *ad = s->adapter[0] ? s->adapter : NULL;
    if (s->merged[0] && a->ptuning_checkpoint)
        return glm_fail(err, "--ptuning_checkpoint %s: one P-Tuning v2 checkpoint, not a list", a->ptuning_checkpoint),
               glm_hint(err, "LoRA adapters to merge first go in --adapter_name_or_path LORA1,...,PREFIX_CHECKPOINT");
    if (s->merged[0]) { /* every adapter to merge fits this base, before any weight is read */
        glm_merge *g;
        if (glm_merge_open(&g, &s->cfg, s->merged, err)) return -1;
        glm_merge_close(g);
    }
    if (ad && glm_adapter_read_config(ad, &s->cfg.peft, err)) return -1; /* the model gets its rows */
    if (a->ptuning_checkpoint && s->cfg.peft.kind != GLM_FT_PTUNING) {
        glm_fail(err, "--ptuning_checkpoint %s is a LoRA adapter, not a P-Tuning v2 checkpoint", a->ptuning_checkpoint);
        return glm_hint(err, "pass it as --adapter %s", a->ptuning_checkpoint);
    }
    if (a->finetuning_type && strcmp(a->finetuning_type, "lora") && strcmp(a->finetuning_type, "full") &&
        strcmp(a->finetuning_type, "freeze"))
        return glm_fail(err, "--finetuning_type %s: inference takes lora (with an adapter), full or freeze", a->finetuning_type),
               glm_hint(err, "a P-Tuning v2 checkpoint goes in with --ptuning_checkpoint DIR");
    if (a->finetuning_type && !strcmp(a->finetuning_type, "lora") && !ad)
        return glm_fail(err, "--finetuning_type lora without an adapter"),
               glm_hint(err, "name the adapter: --adapter_name_or_path DIR (or --adapter DIR)");
    if (a->infer_backend && strcmp(a->infer_backend, "huggingface"))
        glm_info("--infer_backend %s: glmtrain generates with its own engine", a->infer_backend);
    const char *tp = a->tokenizer_name ? a->tokenizer_name : a->model_name_or_path;
    if (glm_tokenizer_load(&s->tok, tp, err)) return glm_wrap(err, "tokenizer: ");
    if (a->template && glm_lf_template_check(a->template, glm_layout_of(s->tok), err)) return -1;
    s->reasoning = glm_lf_template_reasons(a->template);
    if (!a->template && glm_layout_of(s->tok) == GLM_LAYOUT_GLM4 && glm_tokenizer_template_thinks(tp))
        glm_info("%s's chat template writes <think> thoughts (GLM-Z1): give --template glmz1 to send earlier answers back "
                 "without them (serve: and to return them as reasoning_content)", tp);
    s->disable_thinking = s->reasoning && !a->enable_thinking;
    if (glm_tokenizer_vocab_size(s->tok) > s->cfg.vocab_size) {
        glm_fail(err, "tokenizer %s has %d pieces but the model's vocab_size is %d", tp, glm_tokenizer_vocab_size(s->tok),
                 s->cfg.vocab_size);
        return glm_hint(err, "use the tokenizer that belongs to the model (--tokenizer_name)");
    }
    /* the model's model.chat defaults where the flags were not given (ChatGLM2/3: max_length
     * 8192, top_p 0.8, temperature 0.8), and its chat stops (ChatGLM3, GLM-4: <|user|>,
     * <|observation|> besides eos) */
    glm_gen_cfg d;
    glm_gen_cfg_chat_defaults_for(&d, s->tok);
    if (!a->max_length_set) s->g.max_length = d.max_length;
    if (!a->top_p_set) s->g.top_p = d.top_p;
    if (!a->temperature_set) s->g.temperature = d.temperature;
    glm_gen_cfg_chat_stops(&s->g, s->tok);
    return open_constraint(s, a, err) || fit_limits(s, a, err) ? -1 : 0;
}

int gen_open(gen_session *s, const gen_args *a, glm_err *err) {
    return gen_open_tokenizer(s, a, err) ? -1 : gen_open_model(s, a, err);
}

static void adapter_info(const gen_session *s) {
    const char *ad = s->adapter[0] ? s->adapter : NULL;
    if (s->merged[0]) glm_info("merged into the base: %s", s->merged);
    if (ad && s->cfg.peft.kind == GLM_FT_PTUNING)
        glm_info("P-Tuning v2 prefix %s: %d tokens%s", ad, s->cfg.peft.pre_seq_len,
                 s->cfg.peft.prefix_projection ? ", projected" : "");
    else if (ad)
        glm_info("%s adapter %s: r %d, alpha %g on %d module kinds", s->cfg.peft.use_dora ? "DoRA" : "LoRA", ad, s->cfg.peft.lora_rank,
                 s->cfg.peft.lora_alpha, __builtin_popcount((unsigned)s->cfg.peft.lora_targets));
}

int gen_open_model(gen_session *s, const gen_args *a, glm_err *err) {
    const glm_config c = s->cfg;
    double t0 = glm_now();
    if (a->device_map && a->device_map[0]) { /* stages on GPU 0..P-1 (or the CPU), one process */
        s->pipe = glm_calloc(1, sizeof *s->pipe);
        if (glm_pipe_lm_open(s->pipe, &c, a->model_name_or_path, s->merged, s->adapter[0] ? s->adapter : NULL, a->device_map,
                             a->pipeline_parallel_size, a->device, gen_dtype(a), err)) {
            free(s->pipe);
            s->pipe = NULL;
            return -1;
        }
        adapter_info(s);
        glm_info("loaded %s split into %d stages (--device_map %s) in %.1f s", a->model_name_or_path, s->pipe->n,
                 a->device_map, glm_now() - t0);
        return 0;
    }
    if (pick_backend(s, a, err)) return -1;
    if (!glm_backend_on_gpu(s->be)) { /* the weights as float32 in host memory: past what is available the
                                        * out-of-memory killer would end the load part-way, silently */
        double need = glm_memory_plan(&c, GLM_F32, 1, 1, 0, 0).params, have = glm_host_mem_available();
        if (have > 0 && need > have) {
            glm_fail(err, "%s takes %.1f GiB as the CPU holds it (%s) but %.1f GiB of memory is available",
                     a->model_name_or_path, need / 1073741824.0,
                     c.quant ? "its linear weights quantized, the rest float32" : "float32 weights", have / 1073741824.0);
            return c.quant ? glm_hint(err, "run it on a GPU")
                           : glm_hint(err, "run it on a GPU, or quantize it as it loads: --quantization_bit 8 (a quarter of "
                                           "the linear weights' bytes) or 4 (an eighth)");
        }
    }
    glm_model_init_inference(&s->m, &c, s->be);
    s->model_ok = 1;
    snprintf(s->m.merged, sizeof s->m.merged, "%s", s->merged);
    if (glm_model_load(&s->m, a->model_name_or_path, err)) return -1;
    if (s->adapter[0] && glm_adapter_load(&s->m, s->adapter, err)) return -1;
    adapter_info(s);
    glm_info("loaded %s on %s in %.1f s (%d layers, hidden %d, vocab %d)", a->model_name_or_path, s->be->name,
             glm_now() - t0, c.num_layers, c.hidden_size, c.vocab_size);
    return 0;
}

glm_lm gen_lm(gen_session *s) { return (glm_lm){s->pipe ? NULL : &s->m, s->pipe}; }
const glm_config *gen_config(const gen_session *s) {
    return s->pipe ? &s->pipe->cfg : s->model_ok ? &s->m.cfg : &s->cfg;
}

void gen_report_lookup(const gen_session *s) {
    const glm_gen_stats *t = &s->lookup;
    if (!s->g.stats || !t->forwards) return;
    glm_info("prompt lookup: %ld of %ld draft tokens taken, %.2f tokens a pass (%ld passes)", t->accepted, t->drafted,
             (double)(t->forwards + t->accepted) / (double)t->forwards, t->forwards);
}

void gen_close(gen_session *s) {
    glm_constraint_unref(s->constraint);
    glm_text_vocab_free(&s->vocab);
    if (s->pipe) { glm_pipe_lm_free(s->pipe); free(s->pipe); }
    if (s->tok) glm_tokenizer_free(s->tok);
    if (s->model_ok) glm_model_free(&s->m);
    if (s->be) s->be->destroy(s->be);
    memset(s, 0, sizeof *s);
}

char *gen_escape(const char *s) {
    size_t n = strlen(s);
    char *o = glm_malloc(2 * n + 1), *p = o;
    for (; *s; s++) {
        if (*s == '\n') { *p++ = '\\'; *p++ = 'n'; }
        else if (*s == '\t') { *p++ = '\\'; *p++ = 't'; }
        else *p++ = *s;
    }
    *p = 0;
    return o;
}

void gen_stream_token(void *ctx, int row, int32_t id) {
    gen_stream *t = ctx;
    (void)row;
    if (t->debug) fprintf(stderr, "[debug] token %d\n", id);
    if (!t->show) return;
    const char *d = glm_streamer_push(&t->st, id);
    if (d[0]) { fputs(d, stdout); fflush(stdout); }
}

int gen_chat_inputs(const gen_session *s, const char *system, const char *query, const char *const *hist, int n_hist,
                    int max_prompt, glm_ids *out, int *dropped, char **prompt_text, glm_err *err) {
    glm_ids think = {0};
    if (s->disable_thinking && glm_chat_empty_thought(s->tok, &think, err)) return -1;
    char **h = NULL; /* glmz1: the answers without their thoughts */
    if (s->reasoning && n_hist) {
        h = glm_malloc(sizeof *h * (size_t)(2 * n_hist));
        for (int i = 0; i < 2 * n_hist; i++) h[i] = i % 2 ? glm_thought_remove(hist[i]) : glm_strdup(hist[i]);
    }
    int rc = glm_chat_inputs_sys(s->tok, gen_config(s), system, query, h ? (const char *const *)h : hist, n_hist,
                                 max_prompt == INT_MAX ? INT_MAX : max_prompt - think.n, out, dropped, prompt_text, err);
    if (rc == 0 && think.n) {
        glm_ids_append(out, think.data, think.n);
        if (prompt_text && *prompt_text) {
            char *t = glm_malloc(strlen(*prompt_text) + strlen(GLM_THOUGHT_EMPTY) + 1);
            sprintf(t, "%s%s", *prompt_text, GLM_THOUGHT_EMPTY);
            free(*prompt_text);
            *prompt_text = t;
        }
    }
    for (int i = 0; h && i < 2 * n_hist; i++) free(h[i]);
    free(h);
    glm_ids_free(&think);
    return rc;
}
