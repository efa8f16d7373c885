/* `glmtrain serve`'s counters for Prometheus (GET /metrics, text format 0.0.4): what the engine
 * counts as requests finish (their tokens, how they ended, the time to their first token and to
 * their end, as histograms) and the gauges of the moment. The names follow vLLM's metrics with
 * the prefix glmtrain: (num_requests_running, prompt_tokens_total, time_to_first_token_seconds,
 * time_per_output_token_seconds, ...), so a dashboard made for vLLM needs only the prefix changed. */
#ifndef GLM_SERVE_METRICS_H
#define GLM_SERVE_METRICS_H

#define SRV_HIST_MAX 20

/* A histogram: count[i] the values in bucket i (le[i - 1], le[i]], count[n_le] those above the
 * last bound; sum of all values. */
typedef struct srv_hist {
    long count[SRV_HIST_MAX + 1];
    double sum;
} srv_hist;

enum { SRV_END_STOP, SRV_END_LENGTH, SRV_END_CANCELLED, SRV_END_ERROR, SRV_END_KINDS };

typedef struct srv_metrics {
    long prompt_tokens, generation_tokens;
    long prefix_queries, prefix_hits; /* prompt tokens of prefilled requests, and of those the cache held */
    long draft_tokens, accepted_tokens; /* prompt lookup: draft tokens fed, and of those the tokens chosen */
    long ended[SRV_END_KINDS];  /* requests by how they ended (finish_reason) */
    srv_hist ttft, e2e;         /* seconds from submission to the first token, and to the end */
    srv_hist itl;               /* seconds between a request's consecutive tokens */
} srv_metrics;

/* One interval between a request's consecutive tokens into h (the request's own histogram,
 * merged into the server's when it finishes). */
void srv_metrics_token_gap(srv_hist *h, double seconds);

/* A finished request: why ("stop", "length", "cancelled", "error"), its tokens, the seconds to its
 * first token (< 0: none came) and to its end. */
void srv_metrics_finished(srv_metrics *m, const char *why, long prompt_tokens, long generation_tokens, double ttft,
                          double e2e, const srv_hist *itl);

/* The gauges of the moment, read by the caller under the engine's lock. */
typedef struct srv_gauges {
    int running, waiting, slots, peak;
    long steps;
    double step_s, forward_s;
} srv_gauges;

/* The exposition of m and g, every series labelled model_name (caller frees). */
char *srv_metrics_text(const srv_metrics *m, const srv_gauges *g, const char *model_name);

#endif
