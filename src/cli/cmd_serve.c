/* `glmtrain serve`: an OpenAI-compatible HTTP API and a web chat page for a model and its LoRA
 * adapters, many users at once (docs/SERVE.md): the model loads as for generate (cli/gen_common.h),
 * the decode engine (serve/engine.h) batches every running request continuously, and
 * libmicrohttpd serves the endpoints (serve/server.h). SIGTERM or SIGINT stops it cleanly:
 * no new requests, the running ones finish (up to --shutdown_timeout seconds, then cancelled),
 * everything freed, exit status 0. */
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli/commands.h"
#include "cli/gen_common.h"
#include "model/adapter.h"
#include "core/fileutil.h"
#include "core/hub.h"
#include "core/log.h"
#include "infer/chat.h"
#include "parallel/pipe/pipe_infer.h"
#include "serve/engine.h"
#include "serve/server.h"

typedef struct serve_args {
    gen_args gen; /* first: gen_parse and gen_open read it through the same offsets */
    char *host, *api_key, *served_model_name;
    int port, max_batch_size, max_model_len, max_queue, timeout, max_connections, shutdown_timeout, step_delay_ms;
    int enable_prefix_caching, max_num_batched_tokens;
    long max_body_bytes;
} serve_args;

#define SV_G(name, type, def, help) {#name, type, offsetof(serve_args, gen.name), def, help, NULL, NULL}
#define SV_F(name, type, def, help) {#name, type, offsetof(serve_args, name), def, help, NULL, NULL}
static const glm_flag serve_flags[] = {
    SV_G(model_name_or_path, ARG_STR, NULL, "model folder: config.json + safetensors or pytorch_model*.bin (+ tokenizer), or a Hugging Face name (THUDM/chatglm-6b) in the local cache"),
    SV_G(model_revision, ARG_STR, NULL, "the branch, tag or commit of a model named by repository (default main)"),
    SV_G(tokenizer_name, ARG_STR, NULL, "tokenizer folder or .model (default: the model folder)"),
    {"device", ARG_STR, offsetof(serve_args, gen.device), "auto", "where to run (auto: a GPU when built with CUDA and one is usable)", "auto|cpu|cuda", NULL},
    {"dtype", ARG_STR, offsetof(serve_args, gen.dtype), "auto", "GPU storage dtype (auto: bfloat16; the CPU computes in float32)", "auto|float32|float16|bfloat16", NULL},
    SV_G(quantization_bit, ARG_INT, "0", "4 or 8: quantize the linear weights as they load (THUDM's INT4/INT8); 0 = as stored"),
    {"quantization_type", ARG_STR, offsetof(serve_args, gen.quantization_type), "int", "int: THUDM's per-row INT8/INT4; nf4: QLoRA's NormalFloat4", "int|nf4", NULL},
    SV_G(adapter_name_or_path, ARG_STR, NULL, "a LoRA adapter served as the model itself, the base with it (LLaMA-Factory's API): requests naming --served_model_name or no model get it"),
    SV_G(template, ARG_STR, NULL, "LLaMA-Factory's: checked against the tokenizer, whose own prompt format is used; glmz1: GLM-Z1's thoughts (assistant messages go in without them)"),
    SV_G(enable_thinking, ARG_BOOL, "true", "--template glmz1: false ends prompts with the empty thought (a request's chat_template_kwargs.enable_thinking decides for itself)"),
    SV_G(finetuning_type, ARG_STR, NULL, "LLaMA-Factory's: lora (with --adapter_name_or_path), full or freeze"),
    SV_G(infer_backend, ARG_STR, NULL, "LLaMA-Factory's: huggingface (glmtrain's own engine serves either way)"),
    SV_G(ptuning_checkpoint, ARG_STR, NULL, "a P-Tuning v2 checkpoint on top of the model, served as the model (THUDM's ptuning output or --finetuning_type ptuning; no --adapter then)"),
    SV_G(device_map, ARG_STR, NULL, "split the layers over GPUs: auto, thudm, or a JSON map of module names to stages"),
    SV_G(pipeline_parallel_size, ARG_INT, "0", "stages for --device_map auto|thudm (0: every visible GPU)"),
    SV_G(do_sample, ARG_BOOL, "true", "default for requests without temperature (false = greedy)"),
    SV_G(max_length, ARG_INT, "2048", "default prompt + response tokens for requests without max_tokens (ChatGLM2/3: 8192; capped at --max_model_len)"),
    SV_G(max_new_tokens, ARG_INT, NULL, "default response tokens for requests without max_tokens (overrides max_length)"),
    SV_G(top_p, ARG_FLOAT, "0.7", "default nucleus mass (ChatGLM2/3 models: 0.8 unless given)"),
    SV_G(top_k, ARG_INT, "50", "default top-k (0 = all); requests may send top_k"),
    SV_G(temperature, ARG_FLOAT, "0.95", "default temperature (ChatGLM2/3 models: 0.8 unless given); a request's 0 = greedy"),
    SV_G(repetition_penalty, ARG_FLOAT, "1.0", "default repetition penalty; requests may send repetition_penalty"),
    SV_G(debug, ARG_BOOL, "false", "log every request"),
    SV_F(host, ARG_STR, "127.0.0.1", "address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)"),
    SV_F(port, ARG_INT, "8000", "TCP port (0: any free port, printed at start)"),
    SV_F(api_key, ARG_STR, NULL, "require Authorization: Bearer KEY on every endpoint but /health (default: $GLMTRAIN_API_KEY if set)"),
    SV_F(served_model_name, ARG_STR, NULL, "the base model's name in the API (default: the folder's name)"),
    SV_F(max_batch_size, ARG_INT, "32", "KV-cache slots: requests decoded together (more wait in the queue)"),
    SV_F(max_model_len, ARG_INT, "0", "tokens per slot, prompt + response (0: the model's max_sequence_length, at most 2048)"),
    SV_F(max_queue, ARG_INT, "256", "requests waiting for a slot before new ones get 429"),
    SV_F(max_num_batched_tokens, ARG_INT, "0", "new tokens one forward may carry (the work buffers): a longer prompt of ChatGLM2/3 or GLM-4 prefills in parts of this many, one a step between the others' decode steps (0: max_model_len, at most 8192; ChatGLM-6B: max_model_len, its prompts prefill whole)"),
    SV_G(prompt_lookup_num_tokens, ARG_INT, "0", "each decoding stream feeds a draft of up to this many tokens copied from where its prompt and answer repeat their last words, checked in the same step (as generate's; the same tokens, more a step where answers copy from the prompt; 0 = off, at most 63)"),
    SV_G(max_matching_ngram_size, ARG_INT, "2", "the longest run of last tokens looked up for a draft"),
    SV_F(enable_prefix_caching, ARG_BOOL, "true", "a prompt that begins with what a free slot still holds (a chat's history, a system prompt) prefills only the rest (ChatGLM2/3, GLM-4; GLM v1's prompts see themselves whole)"),
    SV_F(max_body_bytes, ARG_LONG, "1048576", "larger request bodies get 413"),
    SV_F(timeout, ARG_INT, "30", "seconds a connection may idle (a slow or stalled request is closed)"),
    SV_F(max_connections, ARG_INT, "512", "open connections at once"),
    SV_F(shutdown_timeout, ARG_INT, "10", "on SIGTERM: seconds running requests get to finish before they are cancelled"),
    SV_F(step_delay_ms, ARG_INT, "0", "pause after every decode step (for tests and demos of streaming; 0 = none)"),
};
static const int n_serve_flags = sizeof serve_flags / sizeof serve_flags[0];

/* --adapter NAME=DIR (or DIR: named by its folder), repeated or comma-separated: taken out of
 * argv before the flag table parses the rest. */
typedef struct adapter_arg { char *name, *dir; } adapter_arg;

static int take_adapters(int *argc, char **argv, adapter_arg **out, int *n, glm_err *err) {
    int w = 0;
    for (int i = 0; i < *argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--adapter")) {
            if (i + 1 >= *argc) return glm_fail(err, "--adapter needs a value: NAME=DIR");
            v = argv[++i];
        } else if (!strncmp(argv[i], "--adapter=", 10)) {
            v = argv[i] + 10;
        } else {
            argv[w++] = argv[i];
            continue;
        }
        char *list = glm_strdup(v), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            char *eq = strchr(t, '=');
            *out = glm_realloc(*out, sizeof **out * (size_t)(*n + 1));
            adapter_arg *a = &(*out)[(*n)++];
            if (eq) {
                *eq = 0;
                a->name = glm_strdup(t);
                a->dir = glm_strdup(eq + 1);
            } else {
                a->dir = glm_strdup(t);
                char tmp[4096];
                snprintf(tmp, sizeof tmp, "%s", t);
                size_t k = strlen(tmp);
                while (k > 1 && tmp[k - 1] == '/') tmp[--k] = 0;
                const char *b = strrchr(tmp, '/');
                a->name = glm_strdup(b ? b + 1 : tmp);
            }
            if (!a->name[0] || !a->dir[0]) { free(list); return glm_fail(err, "--adapter %s: expected NAME=DIR", v); }
            if (glm_hub_resolve(&a->dir, "adapter", NULL, err)) { free(list); return -1; } /* an adapter of the cache */
        }
        free(list);
    }
    *argc = w;
    return 0;
}

/* The folder's name: the base model's name in the API; a model of the Hugging Face cache is
 * named by its repository ("THUDM/chatglm-6b", not its snapshot's commit). */
static void base_name(const char *path, char *out, size_t cap) {
    if (glm_hub_name_of(path, out, cap) == 0) return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t k = strlen(tmp);
    while (k > 1 && tmp[k - 1] == '/') tmp[--k] = 0;
    const char *b = strrchr(tmp, '/');
    snprintf(out, cap, "%s", b && b[1] ? b + 1 : tmp);
}

int glm_cmd_serve(int argc, char **argv) {
    serve_args a;
    glm_err err = {0};
    gen_session s = {0};
    srv_engine e = {0};
    srv_server S = {0};
    adapter_arg *aa = NULL;
    srv_adapter *ad = NULL;
    int n_aa = 0, n_ad = 0, rc, engine_ok = 0, server_ok = 0;
    pthread_mutex_t tok_mu = PTHREAD_MUTEX_INITIALIZER;
    char **args = glm_calloc((size_t)argc + 1, sizeof(char *));
    memcpy(args, argv, sizeof(char *) * (size_t)argc);
    rc = take_adapters(&argc, args, &aa, &n_aa, &err);
    if (!rc) {
        rc = gen_parse(serve_flags, n_serve_flags, (gen_args *)&a, argc, args, "serve", &err);
        if (rc == 1) { gen_args_free(serve_flags, n_serve_flags, (gen_args *)&a); free(args); return 0; }
    } else {
        glm_args_defaults(serve_flags, n_serve_flags, &a);
    }
    free(args);
    int model_adapter = 0; /* --adapter_name_or_path: the served model is the base with this adapter (index + 1) */
    char merged[4096] = "", last[4096] = "";
    if (!rc && a.gen.adapter_name_or_path && glm_adapter_list_count(a.gen.adapter_name_or_path) > 1) {
        /* LLaMA-Factory's API with a list: the adapters before the last merge into the served base */
        if (n_aa)
            rc = glm_fail(&err, "--adapter_name_or_path %s names several adapters, and --adapter serves others beside them",
                          a.gen.adapter_name_or_path),
            glm_hint(&err, "the --adapter ones would apply to the base with the list's merged in: merge those first "
                           "(glmtrain merge --model_name_or_path BASE --adapter FIRST,... --output_dir MERGED) and serve MERGED");
        glm_adapter_list_split(a.gen.adapter_name_or_path, 0, merged, sizeof merged, last, sizeof last);
        if (!rc) {
            free(a.gen.adapter_name_or_path);
            a.gen.adapter_name_or_path = glm_strdup(last);
            a.gen.merge_into_base = merged;
        }
    }
    if (!rc && a.gen.adapter_name_or_path) {
        if (a.gen.ptuning_checkpoint)
            rc = glm_fail(&err, "--adapter_name_or_path and --ptuning_checkpoint both name the served model's adapter"),
            glm_hint(&err, "give one");
        aa = glm_realloc(aa, sizeof *aa * (size_t)(n_aa + 1));
        char bn[512];
        base_name(a.gen.adapter_name_or_path, bn, sizeof bn);
        aa[n_aa] = (adapter_arg){.name = glm_strdup(bn), .dir = a.gen.adapter_name_or_path};
        a.gen.adapter_name_or_path = NULL; /* loaded as a served adapter below, not into the base */
        if (a.gen.finetuning_type && !strcmp(a.gen.finetuning_type, "lora")) { /* its adapter is that one */
            free(a.gen.finetuning_type);
            a.gen.finetuning_type = NULL;
        }
        model_adapter = ++n_aa;
    }
    if (!rc && (a.max_batch_size < 1 || a.max_queue < 0 || a.timeout < 1 || a.max_connections < 1 || a.max_body_bytes < 64 ||
                a.port < 0 || a.port > 65535 || a.max_model_len < 0 || a.shutdown_timeout < 0 || a.max_num_batched_tokens < 0))
        rc = glm_fail(&err, "serve: --max_batch_size, --timeout and --max_connections must be >= 1, --max_queue, "
                            "--max_model_len, --max_num_batched_tokens and --shutdown_timeout >= 0, --max_body_bytes >= 64, "
                            "--port in [0, 65535]");
    if (!rc) rc = gen_open_tokenizer(&s, &a.gen, &err);
    int Tmax = 0;
    if (!rc) {
        int mm = s.cfg.max_sequence_length > 0 ? s.cfg.max_sequence_length : 2048;
        Tmax = a.max_model_len > 0 ? a.max_model_len : (mm < 2048 ? mm : 2048);
        if (Tmax > mm) {
            rc = glm_fail(&err, "--max_model_len %d is above the model's max_sequence_length %d", Tmax, mm);
        } else if (Tmax < 3) {
            rc = glm_fail(&err, "--max_model_len %d leaves no room for a prompt and a response", Tmax);
        }
    }
    if (!rc) rc = gen_open_model(&s, &a.gen, &err);
    if (!rc && n_aa) {
        ad = glm_calloc((size_t)n_aa, sizeof *ad);
        for (int i = 0; i < n_aa && !rc; i++) {
            for (int j = 0; j < i; j++)
                if (!strcmp(aa[i].name, aa[j].name)) rc = glm_fail(&err, "--adapter: the name %s is given twice", aa[i].name);
            if (!rc) rc = srv_adapter_load(&ad[i], gen_lm(&s), aa[i].name, aa[i].dir, &err);
            if (!rc) {
                n_ad++;
                glm_info("adapter %s: %s (LoRA r %d, alpha %g)", ad[i].name, ad[i].dir, ad[i].peft.lora_rank, ad[i].peft.lora_alpha);
            }
        }
    }
    char name[512];
    base_name(a.gen.model_name_or_path ? a.gen.model_name_or_path : "model", name, sizeof name);
    if (a.served_model_name && a.served_model_name[0]) snprintf(name, sizeof name, "%s", a.served_model_name);
    for (int i = 0; i < n_ad && !rc; i++)
        if (!strcmp(ad[i].name, name)) rc = glm_fail(&err, "--adapter %s has the base model's name", name),
                                        glm_hint(&err, "rename the adapter (NAME=DIR) or the base (--served_model_name)");
    if (!rc) {
        rc = srv_engine_init(&e, gen_lm(&s), s.tok, &tok_mu, a.max_batch_size, Tmax, a.max_num_batched_tokens, a.max_queue, ad,
                             n_ad, &err);
        engine_ok = rc == 0;
        e.step_delay_ms = a.step_delay_ms;
        if (engine_ok) srv_engine_prefix_caching(&e, a.enable_prefix_caching);
        if (engine_ok) srv_engine_prompt_lookup(&e, a.gen.prompt_lookup_num_tokens, a.gen.max_matching_ngram_size);
        e.debug = a.gen.debug;
    }
    if (!rc) { /* a reward model (--stage rm's output): its value head scores texts */
        int k = glm_value_head_read(a.gen.model_name_or_path, gen_config(&s)->hidden_size, &e.vhead, &err);
        if (k < 0) rc = glm_wrap(&err, "--model_name_or_path %s: ", a.gen.model_name_or_path);
        for (int i = -1; i < n_ad && !rc; i++)
            if (i < 0 ? e.vhead != NULL : ad[i].vhead != NULL)
                glm_info("value head: %s scores texts (POST /v1/score/evaluation)", i < 0 ? name : ad[i].name);
    }
    /* every thread from here on leaves SIGTERM/SIGINT to the main thread's sigwait */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (!rc && srv_engine_start(&e)) rc = glm_fail(&err, "serve: cannot start the engine thread");
    if (!rc) {
        srv_options o = {.host = a.host, .port = a.port, .model_name = name, .model_adapter = model_adapter,
                         .max_body = (size_t)a.max_body_bytes,
                         .timeout_s = a.timeout, .max_connections = a.max_connections, .Tmax = Tmax, .defaults = s.g};
        const char *envkey = getenv("GLMTRAIN_API_KEY");
        o.api_key = a.api_key && a.api_key[0] ? a.api_key : envkey && envkey[0] ? envkey : NULL;
        o.defaults.model_max_length = Tmax;
        o.debug = a.gen.debug;
        o.reasoning = s.reasoning;
        o.disable_thinking = s.disable_thinking;
        rc = srv_server_start(&S, &o, &e, s.tok, gen_config(&s), &tok_mu, &err);
        server_ok = rc == 0;
    }
    if (!rc) {
        const glm_config *mc = gen_config(&s);
        double mib = glm_kvcache_bytes(mc, glm_dtype_size((s.pipe ? s.pipe->be[0] : s.be)->dtype), a.max_batch_size, Tmax) /
                     1048576.0;
        char lookup[64] = "";
        if (e.lookup_k) snprintf(lookup, sizeof lookup, ", drafts of up to %d tokens", e.lookup_k);
        glm_info("KV cache pool: %d slots x %d tokens (%.0f MiB), %d tokens a forward, prefix caching %s%s; models: %s%s%s",
                 a.max_batch_size, Tmax, mib, e.batch_tokens, e.pfx.on ? "on" : a.enable_prefix_caching ? "off (GLM v1)" : "off",
                 lookup,
                 name, n_ad ? " + adapters" : "",
                 mc->peft.pre_seq_len > 0 ? " (with its P-Tuning v2 prefix)" : "");
        glm_info("serving %s on http://%s%s%s:%d/ (OpenAI API under /v1%s)", name, strchr(a.host, ':') ? "[" : "", a.host,
                 strchr(a.host, ':') ? "]" : "", S.port, S.o.api_key ? ", API key required" : "");
        fflush(stderr);
        int sig = 0;
        sigwait(&sigs, &sig);
        glm_info("serve: %s: no new requests; %d running or queued get %d s to finish", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 srv_engine_busy(&e), a.shutdown_timeout);
        srv_server_quiesce(&S);
        srv_engine_drain(&e);
        double t0 = glm_now();
        while (srv_engine_busy(&e) && glm_now() - t0 < a.shutdown_timeout) {
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (srv_engine_busy(&e)) glm_warn("serve: cancelling %d requests still running", srv_engine_busy(&e));
    }
    if (engine_ok) srv_engine_stop(&e); /* cancels what still runs: their streams end */
    if (server_ok) srv_server_stop(&S);
    if (rc) glm_err_print(&err);
    else glm_info("serve: stopped (%ld requests, %ld tokens)", e.served, e.tokens);
    for (int i = 0; i < n_ad; i++) srv_adapter_free(&ad[i]);
    free(ad);
    for (int i = 0; i < n_aa; i++) { free(aa[i].name); free(aa[i].dir); }
    free(aa);
    gen_close(&s);
    gen_args_free(serve_flags, n_serve_flags, (gen_args *)&a);
    return rc ? 1 : 0;
}
