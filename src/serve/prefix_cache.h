/* What a free KV-cache slot of `glmtrain serve` still holds (docs/SERVE.md "Prefix caching"):
 * when a request ends, its slot keeps the cache rows of the tokens it fed (the prompt and the
 * answer as far as it went through the model: the last token sampled never does), and a later request whose prompt begins with those tokens, for the same
 * adapter, takes that slot and prefills only the rest. A chat's next turn (the history, the last
 * answer, the new message) or a long system prompt sent again is then computed once.
 *
 * Valid only where a token's keys and values depend on the tokens before it alone (the causal
 * ChatGLM2/3 and GLM-4 blocks: glm_family.causal); GLM v1's prompt sees itself whole, so every
 * prompt token's rows change with what follows, and its slots keep nothing.
 *
 * The engine thread alone uses this (no lock). */
#ifndef GLM_SERVE_PREFIX_CACHE_H
#define GLM_SERVE_PREFIX_CACHE_H
#include <stdint.h>

/* Fewer tokens in common than this and a request takes a fresh slot instead: a prompt format's
 * few opening tokens ([gMASK] sop <|user|>) are common to nearly every request, and chasing them
 * would scatter requests that could prefill together in consecutive slots. */
#define SRV_PREFIX_MIN 16

typedef struct srv_prefix_cache {
    int on, nslots, Tmax;
    int32_t *ids;     /* [nslots * Tmax]: slot s's kept tokens from s * Tmax */
    int *n;           /* [nslots] tokens kept (0: nothing; < Tmax, so an idle row can write past them) */
    int *adapter;     /* [nslots] the adapter they were computed with (-1: the base model) */
    long *stamp;      /* [nslots] when they were kept (larger: later) */
    long clock;
} srv_prefix_cache;

void srv_prefix_init(srv_prefix_cache *pc, int nslots, int Tmax, int on);
void srv_prefix_free(srv_prefix_cache *pc);
/* Slot s's request ended with its first n fed tokens' rows valid: a[0..na) then b[..], n <= na + nb. */
void srv_prefix_keep(srv_prefix_cache *pc, int s, int adapter, const int32_t *a, int na, const int32_t *b, int n);
/* The tokens free slot s keeps (0 with caching off): an idle row of a decode writes its row here. */
static inline int srv_prefix_kept(const srv_prefix_cache *pc, int s) { return pc->on ? pc->n[s] : 0; }
/* Slot s's rows are about to be overwritten: nothing kept. */
void srv_prefix_drop(srv_prefix_cache *pc, int s);
/* The tokens of ids[0..n) whose rows slot s holds for adapter (at most n - 1: the last prompt
 * token is always fed, for its logits), or 0 below SRV_PREFIX_MIN. */
int srv_prefix_match(const srv_prefix_cache *pc, int s, int adapter, const int32_t *ids, int n);
/* slots[0..n) reordered for requests that take a fresh slot: empty ones first (in slot order, so
 * they stay consecutive), then those kept longest ago. */
void srv_prefix_order(const srv_prefix_cache *pc, int *slots, int n);

#endif
