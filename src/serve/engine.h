/* The decode engine of `glmtrain serve` (docs/SERVE.md): one thread owns the model and a pool of
 * KV-cache slots (glm_forward_cached_slots: each slot its own length and key range). Requests wait
 * in a queue; every step the engine admits queued requests into free slots (one prefill forward
 * each), drops cancelled ones, and runs one decode forward over the slots of each adapter that has
 * rows, so requests join and leave the running batch at every step and none waits for another to
 * finish. Sampling, stops and limits are glm_generate's (infer/generate.c), row by row with each
 * request's own random stream, so a greedy row gives the tokens `glmtrain generate` gives.
 *
 * LoRA adapters: the base model is loaded once; each adapter's rows live in their own buffer and
 * the engine points the model's adapter views at them (and sets cfg.peft) before a forward. Rows
 * of different adapters therefore run in separate forwards within one step (grouped by adapter);
 * rows of other adapters inside a group's slot range ride along as idle rows whose results are
 * dropped (their cache slot is written only where its own next forward writes again). */
#ifndef GLM_SERVE_ENGINE_H
#define GLM_SERVE_ENGINE_H
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "core/strbuf.h"
#include "infer/generate.h"
#include "infer/constrain.h"
#include "serve/metrics.h"
#include "serve/prefix_cache.h"

#define SRV_MAX_STOPS 4
#define SRV_MAX_CHOICES 64 /* guided_choice's strings */
#define SRV_MAX_STOP_IDS 16

typedef struct srv_adapter {
    char name[256], dir[4096];
    glm_peft peft;
    int n;                /* shells: 1 for a whole model, one per stage of a device map */
    glm_model *shell;     /* [n] tab + params: the adapter's LoRA rows of the stage's layers (no
                           * base rows), on the stage's backend */
    void *(*ptr)[8];      /* [L] lora_a[0..4), lora_b[0..4), in the shell of the layer's stage */
    float *vhead;         /* [H + 1] the value head beside it (value_head.safetensors of a --stage rm
                           * run: weight, then bias), or NULL */
} srv_adapter;

#define SRV_MAX_TOP_LOGPROBS 20

/* A response token's log-probability under the model: log_softmax of the raw logits it was
 * picked from (before the repetition penalty, temperature and top-k / top-p), and the most
 * likely tokens there (by logit, then by id). */
typedef struct srv_logprob {
    int32_t id;
    float lp;
    int n_top;
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float top_lp[SRV_MAX_TOP_LOGPROBS];
} srv_logprob;

/* News of requests: every request rings its waker when its text grows or it ends, and whoever
 * answers it waits there (srv_waker_rings, look at the request, srv_waker_wait: a ring after the
 * look is not missed). A request gets its own at srv_req_new; the choices of one answer share one.
 * Counted references: the waiter's and each request's. */
typedef struct srv_waker {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned long rings;       /* how often it rang (a waiter compares the count it saw) */
    int refs;
} srv_waker;
srv_waker *srv_waker_new(void);
void srv_waker_put(srv_waker *w);
void srv_waker_ring(srv_waker *w);
/* How often w has rung. */
unsigned long srv_waker_rings(srv_waker *w);
/* Waits until w rings after `seen` rings, or until `until` (CLOCK_REALTIME). */
void srv_waker_wait(srv_waker *w, unsigned long seen, const struct timespec *until);

typedef struct srv_req srv_req;
struct srv_req {
    /* set before srv_engine_submit */
    glm_ids prompt;            /* full model inputs ([gMASK] <sop> included) */
    int adapter;               /* -1: the base model */
    glm_gen_cfg g;             /* sampling, max_new_tokens, model_max_length, stop ids */
    uint64_t seed;
    int postprocess;           /* model.chat's response post-processing (chat) or strip only */
    int ignore_eos;            /* run to the limit: eos and the stop ids do not end the row */
    /* OpenAI's logit adjustments, before glm_sample_next's (repetition penalty, temperature, ...):
     * logit_bias adds bias[i] to token bias_id[i]'s logit; a token generated c times so far loses
     * frequency_penalty x c + presence_penalty (c > 0) */
    int n_bias;
    int32_t *bias_id;
    float *bias;
    float frequency_penalty, presence_penalty;
    /* vLLM's: stop_token_ids end the row as eos does (not part of the answer); until min_tokens
     * tokens are out, eos, the template's stop ids and these are never picked */
    int32_t stop_token_ids[SRV_MAX_STOP_IDS];
    int n_stop_token_ids, min_tokens;
    /* what the answer must be (infer/constrain.h; con.c NULL: anything): OpenAI's response_format
     * json_object or json_schema, vLLM's guided_json or guided_choice; shared by the n choices */
    glm_constrained con;
    /* a score request (POST /v1/score/evaluation): texts[n_texts] (model inputs as they are) go
     * through the slot one per step, and scores[i] is the value head at text i's last token; no
     * tokens are generated. The model (adapter) must have a value head. */
    glm_ids *texts;
    int n_texts, n_scored;
    double *scores;
    char *stops[SRV_MAX_STOPS];/* stop strings (owned) */
    int n_stops;
    int logprobs;              /* record each response token's srv_logprob (its logits come to */
    int top_logprobs;          /* the host), with this many alternatives */
    int prompt_logprobs;       /* echo with logprobs: plps[i] for every prompt token too (a causal */
                               /* model's: token i under the logits of the row before it) */
    int no_generate;           /* echo with max_tokens 0: the prompt only, no token generated */
    char *echo;                /* echo (the HTTP side's): the prompt's text, put before the response */
    srv_waker *waker;          /* rung when text grows or it ends (one reference, the request's) */
    /* shared with the HTTP side, under mu */
    pthread_mutex_t mu;
    glm_strbuf text;           /* text released so far (settled, stop strings held back) */
    char *final;               /* the response when done (post-processed, cut at a stop string) */
    int done;                  /* 1: finished (final, finish set) */
    const char *finish;        /* "stop", "length", "cancelled", "error" */
    char error[512];
    int n_out;                 /* completion tokens */
    int cached;                /* prompt tokens whose cache rows its slot already held (prefix caching;
                                * the engine sets it at admission, the HTTP side reads it once done) */
    srv_logprob *lps;          /* [n_out] with logprobs: one per response token */
    srv_logprob *plps;         /* [n_plps] with prompt_logprobs, once prefilled: one per prompt */
    int n_plps;                /* token, the first without a value (lp NaN, n_top -1) */
    int refs;                  /* the HTTP side and the engine */
    atomic_int cancel;         /* the client went away */
    double t_submit, t_first, t_last; /* t_last: the latest token's time */
    srv_hist itl;              /* the gaps between its tokens (engine only; into the metrics at the end) */
    /* engine only */
    glm_rng rng;
    glm_ids out;
    glm_streamer st;
    uint8_t *seen;
    int state[2], limit, slot, admitted;
    srv_logprob *plps_part;    /* echo's prompt entries while the prompt prefills in chunks */
    srv_req *share_src;        /* admitted in the same step after a request of the same prompt: takes
                                * that one's cache rows instead of a prefill (NULL: its own) */
    srv_req *next;
};

typedef struct srv_engine {
    glm_model *m;              /* the whole model, or the first stage of pipe (config, family) */
    struct glm_pipe_lm *pipe;  /* a model split by --device_map (NULL: m is whole) */
    struct glm_pipe_cache *pc; /* its slots, one cache per stage */
    const glm_tokenizer *tok;
    pthread_mutex_t *tok_mu;   /* the tokenizer is shared with the HTTP threads */
    int nslots, Tmax;
    int batch_tokens;          /* new tokens one forward may carry (the work buffers; --max_num_batched_tokens):
                                * a longer prompt of a causal family prefills in chunks of this many */
    glm_kvcache kv;
    srv_adapter *ad;
    int n_ad, cur;             /* cur: the adapter the model's views point at (-1 base) */
    glm_peft base_peft;
    float *vhead;              /* [H + 1] the base model's value head (weight, bias), or NULL; owned */
    float *hidden;             /* [nslots, H]: scored texts' last final-norm rows */
    srv_req **slot;
    int *slot_len;
    srv_prefix_cache pfx;      /* what the free slots still hold (--enable_prefix_caching) */
    int max_queue;
    int step_delay_ms;         /* a pause after each step (tests and demos of streaming) */
    int lookup_k, lookup_ngram; /* prompt lookup's longest draft (0: off) and n-gram (srv_engine_prompt_lookup) */
    glm_text_vocab jv;         /* the tokens' bytes for JSON mode and guided choices, made when the first
                                * request with either is admitted */
    int debug;                 /* log requests as they join and leave */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_req *qhead, *qtail;
    int qlen, active;
    int draining;              /* SIGTERM: no new requests; running ones finish */
    int stop;                  /* end now: cancel what runs */
    pthread_t th;
    int started;
    /* counters (under mu) */
    long steps, tokens, served;
    double busy_s, forward_s;  /* seconds in steps, and in their forwards (the model's own time) */
    double text_s;             /* and in turning decoded tokens into released text */
    double t_forward, t_text;  /* forward_s and text_s as the engine thread adds them up */
    int peak;                  /* the most requests running at once */
    srv_metrics metrics;       /* finished requests' tokens, ends and latencies (GET /metrics) */
    /* buffers */
    float *logits;
    int32_t *greedy;           /* [nslots]: the device's greedy picks when no row samples */
    int32_t *ids, *pos, *bpos, *lo, *hi;
    int *lens;
} srv_engine;

/* Reads a LoRA adapter folder (glm_adapter_read_config / glm_adapter_load) into its own rows on
 * the model's backend, or on each stage's for the layers it holds when lm is split by a device
 * map (P-Tuning checkpoints are refused). */
int srv_adapter_load(srv_adapter *a, glm_lm lm, const char *name, const char *dir, glm_err *err);
void srv_adapter_free(srv_adapter *a);

/* The pool: nslots slots of Tmax tokens, on the model's device or split over the stages of a
 * device map (lm.pipe), and work buffers for batch_tokens new tokens a forward (0: Tmax, for the
 * causal families at most 8192; at least nslots, and for GLM v1, whose prompts cannot be split,
 * at least Tmax). Prefix caching is off until srv_engine_prefix_caching. ad[n_ad] (loaded for lm)
 * stay owned by the caller. */
int srv_engine_init(srv_engine *e, glm_lm lm, const glm_tokenizer *tok, pthread_mutex_t *tok_mu, int nslots,
                    int Tmax, int batch_tokens, int max_queue, srv_adapter *ad, int n_ad, glm_err *err);
/* Prefix caching on (where the family allows it: glm_family.causal) or off, before
 * srv_engine_start; returns whether it is on. */
int srv_engine_prefix_caching(srv_engine *e, int on);
/* Prompt lookup in the decode steps (serve/draft.c): drafts of up to k tokens (0: off, at most
 * GLM_LOOKUP_MAX) found by n-grams of up to ngram tokens; before srv_engine_start. */
void srv_engine_prompt_lookup(srv_engine *e, int k, int ngram);
int srv_engine_start(srv_engine *e);
/* Queues r (the engine takes a reference): 0, or 429 when max_queue requests already wait beyond
 * the free slots, 503 when draining. */
int srv_engine_submit(srv_engine *e, srv_req *r);
/* Queues rs[0..n) at once (all or none; 429 as above when they do not all fit), so the engine
 * admits them in one step and prefills those in consecutive slots together. */
int srv_engine_submit_all(srv_engine *e, srv_req **rs, int n);
/* The most requests that can ever wait or run at once: max_queue + the slots. */
static inline int srv_engine_capacity(const srv_engine *e) { return e->max_queue + e->nslots; }
/* Stops taking requests; running ones go on until done or until srv_engine_stop. */
void srv_engine_drain(srv_engine *e);
/* Requests running or waiting. */
int srv_engine_busy(srv_engine *e);
/* Cancels whatever still runs, ends the thread and frees the pool. */
void srv_engine_stop(srv_engine *e);

srv_req *srv_req_new(void);
/* A request with r's settings (sampling, stops, logprobs, adapter), no prompt: one more prompt of
 * a batch. */
srv_req *srv_req_clone(const srv_req *r);
/* Drops one reference (the last frees). */
void srv_req_put(srv_req *r);

#endif
