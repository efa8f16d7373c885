/* What the engine's files share (serve/engine.c: the pool, the steps and the engine thread;
 * serve/rows.c: a row's tokens, text, sampling and end; serve/prefill.c: new prompts into their
 * slots and score requests' texts). Internal to serve/: every function runs on the engine thread. */
#ifndef GLM_SERVE_ENGINE_STEPS_H
#define GLM_SERVE_ENGINE_STEPS_H
#include "serve/engine.h"

/* The tokens whose rows r's slot holds (its slot_len): while r prefills, its prompt's first so
 * many (the cached ones, then each part's); then the prompt and the answer as far as
 * it went through the model (the last token sampled has not). */
static inline int srv_held(const srv_engine *e, const srv_req *r) { return e->slot_len[r->slot]; }

/* ---- serve/engine.c ---- */
/* The model's adapter views and settings for adapter k (-1: the base), in every stage. */
void srv_set_adapter(srv_engine *e, int k);
/* One forward of rows [slot0, slot0 + nrows) of the pool, on the whole model or stage by stage
 * (n_new: each row's real new tokens, NULL all Tq). greedy: every row decodes greedily without an
 * adjustment of its logits, so the device picks the tokens (e->greedy) and the logits stay there;
 * otherwise they come to e->logits. */
int srv_forward_slots(srv_engine *e, int slot0, int nrows, int Tq, const int *len, const int *n_new, const int32_t *ids,
                      int greedy, glm_err *err);
/* The token idle and padding rows feed. */
int32_t srv_pad_id(const srv_engine *e);

/* ---- serve/rows.c ---- */
/* The ids that end r's answer (the model's eos, the template's stop ids, the request's
 * stop_token_ids) into ends[SRV_MAX_ENDS]; their count. */
#define SRV_MAX_ENDS (1 + 4 + SRV_MAX_STOP_IDS)
int srv_row_ends(const srv_engine *e, const srv_req *r, int32_t *ends);
/* Ends a request: its final text, the rest of the stream, the slot back to the pool (what it
 * holds kept for prefix caching). cut >= 0: a stop string was found at that offset of the
 * streamer's text. */
void srv_finish(srv_engine *e, srv_req *r, const char *why, long cut, const char *errmsg);
/* What a row's new token asks for once its text is out (srv_row_text). */
enum { ROW_GOES_ON, ROW_STOP_ID, ROW_STOP_TEXT, ROW_LENGTH };
/* One sampled token of a row: the stop rule, the text it settles and whether a stop string or the
 * limit ends the row (*cut: where the stop string starts). Touches only this request and reads
 * the tokenizer, so rows run in parallel; finishing is left to srv_row_apply. */
int srv_row_text(srv_engine *e, srv_req *r, int32_t id, const srv_logprob *lp, long *cut);
void srv_row_apply(srv_engine *e, srv_req *r, int what, long cut);
/* srv_row_text then srv_row_apply (one row). */
void srv_row_token(srv_engine *e, srv_req *r, int32_t id, const srv_logprob *lp);
/* log_softmax of logits at id and the k most likely tokens (by logit, then the lower id). */
void srv_logprob_of(const float *logits, int V, int32_t id, int k, srv_logprob *o);
/* The request's next token from its row of logits (changed in place), and with logprobs its
 * srv_logprob from the logits as they came. */
int32_t srv_pick(const srv_engine *e, srv_req *r, float *logits, srv_logprob *lp);
/* A request whose next token is the argmax of its logits as they are. */
int srv_is_greedy(const srv_req *r);

/* ---- serve/draft.c ---- */
/* The decode step of rows [lo_s, lo_s + nr) (mem[b]: the decoding request of row b, or NULL; the
 * rows' lengths in e->lens) with prompt lookup's drafts: 1 when it ran the step, 0 when no row has
 * a draft (or room for one) and the plain step is to run. */
int srv_decode_drafted(srv_engine *e, int lo_s, int nr, srv_req **mem);

/* ---- serve/prefill.c ---- */
/* The step's prefills: the new requests adm[0..n) and the prompts prefilling in parts cont[0..ncont). */
void srv_prefill_all(srv_engine *e, srv_req **adm, int n, srv_req **cont, int ncont);
/* A score request's next texts (one forward). */
void srv_score_next(srv_engine *e, srv_req *r);

#endif
