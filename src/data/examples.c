/* Prompt rendering and example construction (ptuning/main.py rules of ChatGLM-6B and ChatGLM2-6B;
 * ChatGLM3's in examples_glm3.c). See examples.h. */
#include "data/examples.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/strbuf.h"

#define DEFAULT_HISTORY "[Round {i}]\n问：{q}\n答：{r}\n"
#define GLM2_HISTORY "[Round {i1}]\n\n问：{q}\n\n答：{r}\n\n" /* ChatGLM2's build_prompt */

void glm_example_cfg_init(glm_example_cfg *c) {
    *c = (glm_example_cfg){0};
    c->max_source_length = 1024;
    c->max_target_length = 128;
    c->rounds = GLM_ROUNDS_COLUMN;
    c->pt_group = 1000; /* LLaMA-Factory's preprocessing_batch_size */
}

static void sb_int(glm_strbuf *b, long v) { char t[32]; glm_strbuf_put(b, t, (size_t)snprintf(t, sizeof t, "%ld", v)); }

/* Expands tpl into b: "{name}" becomes values[k] where names[k] == name, "{{"/"}}" a brace.
 * Returns -1 (with the bad placeholder in bad[]) for an unknown name or an unclosed brace. */
static int expand(glm_strbuf *b, const char *tpl, const char *const *names, const char *const *values, int n,
                  char *bad, size_t bad_len) {
    for (const char *p = tpl; *p;) {
        if ((p[0] == '{' && p[1] == '{') || (p[0] == '}' && p[1] == '}')) { glm_strbuf_put(b, p, 1); p += 2; continue; }
        if (*p != '{') { const char *q = p; while (*q && *q != '{' && !(q[0] == '}' && q[1] == '}')) q++; glm_strbuf_put(b, p, (size_t)(q - p)); p = q; continue; }
        const char *e = strchr(p, '}');
        if (!e) { snprintf(bad, bad_len, "%s", p); return -1; }
        size_t len = (size_t)(e - p - 1);
        int k = 0;
        while (k < n && !(strlen(names[k]) == len && !memcmp(names[k], p + 1, len))) k++;
        if (k == n) { snprintf(bad, bad_len, "%.*s", (int)(len + 2), p); return -1; }
        glm_strbuf_str(b, values[k]);
        p = e + 1;
    }
    return 0;
}

/* 1 when the template has the placeholder {name} (not an escaped "{{name}}"). */
static int uses(const char *tpl, const char *name) {
    size_t n = strlen(name);
    for (const char *p = tpl; p && *p; p++) {
        if (p[0] == '{' && p[1] == '{') { p++; continue; }
        if (p[0] == '{' && !strncmp(p + 1, name, n) && p[1 + n] == '}') return 1;
    }
    return 0;
}

static const char *const HIST_NAMES[] = {"i", "i1", "q", "r"};
static const char *const PROMPT_NAMES[] = {"instruction", "query", "input", "system", "history", "round", "round1"};

int glm_example_cfg_check(const glm_example_cfg *c, glm_err *err) {
    if (c->mask_history && c->cutoff_len <= 0)
        return glm_fail(err, "--mask_history cuts the conversation as LLaMA-Factory does, from the last turn back, and needs "
                             "--cutoff_len"), glm_hint(err, "add --cutoff_len N (LLaMA-Factory's default is 2048)");
    if (c->mask_history && c->train_on_prompt)
        return glm_fail(err, "--mask_history trains on the last answer alone and --train_on_prompt on every token: choose one");
    if (c->max_source_length < 2)
        return glm_fail(err, "--max_source_length %d is too small (the prompt keeps max_source_length-1 >= 1 tokens)",
                        c->max_source_length);
    if (c->max_target_length < 3)
        return glm_fail(err, "--max_target_length %d is too small ([gMASK] <sop> ... <eop> leave max_target_length-2 >= 1 answer tokens)",
                        c->max_target_length);
    const char *empty[7] = {"", "", "", "", "", "", ""};
    char bad[64];
    glm_strbuf b = {0};
    int rc = 0;
    if (c->history_template && expand(&b, c->history_template, HIST_NAMES, empty, 4, bad, sizeof bad)) {
        glm_fail(err, "--history_template: unknown placeholder %s", bad);
        rc = glm_hint(err, "history_template knows {i} {i1} {q} {r}; write {{ and }} for literal braces");
    } else if (c->prompt_template && expand(&b, c->prompt_template, PROMPT_NAMES, empty, 7, bad, sizeof bad)) {
        glm_fail(err, "--prompt_template: unknown placeholder %s", bad);
        rc = glm_hint(err, "prompt_template knows {instruction} {query} {input} {system} {history} {round} {round1}; "
                           "write {{ and }} for literal braces");
    }
    free(b.s);
    return rc;
}

/* The history rounds with the history template ({i} {i1} {q} {r}). */
static void render_history(glm_strbuf *b, const glm_example_cfg *c, glm_layout layout, const glm_record *r) {
    const char *tpl = c->history_template ? c->history_template : layout == GLM_LAYOUT_GLM2 ? GLM2_HISTORY : DEFAULT_HISTORY;
    char bad[64];
    for (int i = 0; i < r->n_hist; i++) {
        char si[16], si1[16];
        snprintf(si, sizeof si, "%d", i);
        snprintf(si1, sizeof si1, "%d", i + 1);
        const char *v[4] = {si, si1, r->hist[2 * i], r->hist[2 * i + 1]};
        expand(b, tpl, HIST_NAMES, v, 4, bad, sizeof bad); /* checked by glm_example_cfg_check */
    }
}

/* instruction + "\n" + input (alpaca), or the instruction alone. */
static void render_query(glm_strbuf *b, const glm_record *r, int with_input) {
    glm_strbuf_str(b, r->query);
    if (with_input && r->input && r->input[0]) { glm_strbuf_str(b, "\n"); glm_strbuf_str(b, r->input); }
}

char *glm_example_prompt(const glm_example_cfg *c, const glm_record *r) {
    return glm_example_prompt_as(c, GLM_LAYOUT_GLM, r);
}

char *glm_example_prompt_as(const glm_example_cfg *c, glm_layout layout, const glm_record *r) {
    if (glm_layout_turns(layout)) return NULL;
    glm_strbuf b = {0};
    glm_strbuf_str(&b, c->source_prefix);
    const char *tpl = c->prompt_template;
    const char *system = r->system && r->system[0] ? r->system : c->default_system; /* --default_system for a record without one */
    int has_system = system && system[0];
    if (has_system && !(tpl && uses(tpl, "system"))) { glm_strbuf_str(&b, system); glm_strbuf_str(&b, "\n"); }
    if (tpl) {
        glm_strbuf q = {0}, h = {0};
        render_query(&q, r, !uses(tpl, "input"));
        render_history(&h, c, layout, r);
        char n[16], n1[16], bad[64];
        snprintf(n, sizeof n, "%d", r->n_hist);
        snprintf(n1, sizeof n1, "%d", r->n_hist + 1);
        const char *v[7] = {q.s ? q.s : "", q.s ? q.s : "", r->input ? r->input : "",
                            has_system ? system : "", h.s ? h.s : "", n, n1};
        expand(&b, tpl, PROMPT_NAMES, v, 7, bad, sizeof bad);
        free(q.s); free(h.s);
    } else if (layout == GLM_LAYOUT_GLM2) { /* build_prompt: always in rounds, from 1 */
        render_history(&b, c, layout, r);
        glm_strbuf_str(&b, "[Round "); sb_int(&b, r->n_hist + 1); glm_strbuf_str(&b, "]\n\n问：");
        render_query(&b, r, 1);
        glm_strbuf_str(&b, "\n\n答：");
    } else if (c->rounds == GLM_ROUNDS_NONEMPTY ? r->n_hist > 0 : r->has_history || r->n_hist > 0) {
        render_history(&b, c, layout, r);
        glm_strbuf_str(&b, "[Round "); sb_int(&b, r->n_hist); glm_strbuf_str(&b, "]\n问：");
        render_query(&b, r, 1);
        glm_strbuf_str(&b, "\n答：");
    } else {
        render_query(&b, r, 1);
    }
    if (!b.s) glm_strbuf_put(&b, "", 0);
    return b.s;
}

void glm_infer_seqlen(long source_len, long target_len, long cutoff, long *new_source, long *new_target) {
    long max_target;
    if (target_len * 2 < cutoff) max_target = cutoff; /* the source gives way */
    else if (source_len * 2 < cutoff) max_target = cutoff - source_len; /* the target gives way */
    else max_target = (long)((double)cutoff * ((double)target_len / (double)(source_len + target_len))); /* both, in proportion */
    *new_target = target_len < max_target ? target_len : max_target;
    long max_source = cutoff - *new_target > 0 ? cutoff - *new_target : 0;
    *new_source = source_len < max_source ? source_len : max_source;
}

/* How much of a prompt of la tokens and an answer of lb the example keeps beside its `specials`
 * tokens: LLaMA-Factory's rule under --cutoff_len, else THUDM's limits (src_max, tgt_max). */
static void cut_pair(const glm_example_cfg *c, int specials, long src_max, long tgt_max, long la, long lb, long *ka,
                     long *kb, glm_example_info *info) {
    if (c->cutoff_len > 0) {
        long lt = c->pair_answer_tokens > lb ? c->pair_answer_tokens : lb; /* a pair's longer answer */
        glm_infer_seqlen(la, lt, c->cutoff_len - specials, ka, kb);
        if (*kb > lb) *kb = lb;
    } else {
        *ka = la < src_max ? la : src_max;
        *kb = lb < tgt_max ? lb : tgt_max;
    }
    info->truncated_prompt = *ka < la;
    info->truncated_answer = *kb < lb;
}

/* One prompt/answer example: `head` specials, the prompt's text, `mid` specials, the answer,
 * the closing token; labels from label_from (an index into the example) on, where not pad when
 * skip_pad. The prompt and answer are cut by cut_pair. */
static int build_pair(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r, const char *prompt,
                      const int32_t *head, int nh, const int32_t *mid, int nm, int32_t close, long src_max, long tgt_max,
                      int label_mid, int skip_pad, glm_ids *ids, glm_ids *labels, glm_example_info *info, glm_err *err) {
    glm_ids a = {0}, b = {0};
    int rc = enc->encode(enc->ctx, prompt, strlen(prompt), &a, err) || enc->encode(enc->ctx, r->answer, strlen(r->answer), &b, err);
    if (rc) { glm_ids_free(&a); glm_ids_free(&b); return glm_wrap(err, "record %lld (line %lld): ", (long long)r->index, (long long)r->line); }
    info->prompt_tokens = a.n;
    info->answer_tokens = b.n;
    if (b.n == 0) { info->status = GLM_EX_NO_ANSWER_TOKENS; glm_ids_free(&a); glm_ids_free(&b); return 0; }
    long ka, kb;
    cut_pair(c, nh + nm + 1, src_max, tgt_max, a.n, b.n, &ka, &kb, info);
    if (kb == 0) { info->status = GLM_EX_NO_ANSWER_TOKENS; glm_ids_free(&a); glm_ids_free(&b); return 0; } /* cut to nothing */
    glm_ids_append(ids, head, nh);
    glm_ids_append(ids, a.data, (int)ka);
    glm_ids_append(ids, mid, nm);
    int ctx = ids->n - nm + label_mid; /* the first label */
    glm_ids_append(ids, b.data, (int)kb);
    glm_ids_push(ids, close);
    for (int i = 0; i < ids->n; i++)
        glm_ids_push(labels, c->train_on_prompt || (i >= ctx && !(skip_pad && ids->data[i] == enc->pad)) ? ids->data[i] : -100);
    glm_ids_free(&a);
    glm_ids_free(&b);
    return 0;
}

/* Clears every label before the last run of targets: the last answer alone trains. */
static void keep_last_answer(glm_ids *labels) {
    int i = labels->n - 1;
    while (i >= 0 && labels->data[i] == -100) i--;
    while (i >= 0 && labels->data[i] != -100) i--;
    for (; i >= 0; i--) labels->data[i] = -100;
}

/* The first label of the last answer (labels already cleared before it). */
static int answer_start(const glm_ids *labels) {
    int i = 0;
    while (i < labels->n && labels->data[i] == -100) i++;
    return i;
}

/* LLaMA-Factory's pairwise cut of the role-token layouts: each example is its prompt (every token
 * before its last answer) and that answer; both keep infer_seqlen(prompt, longer answer, cutoff) of
 * them, the prompt from its start. */
/* An example (ids x, labels lab, its answer from answer_start) cut to the first ns tokens of its
 * prompt and at most nt of its answer. */
static void keep_turn(glm_ids *x, glm_ids *lab, long ns, long nt, glm_example_info *info) {
    int s = answer_start(lab), len = x->n - s, keep = (int)(nt < len ? nt : len);
    memmove(x->data + ns, x->data + s, sizeof(int32_t) * (size_t)keep);
    memmove(lab->data + ns, lab->data + s, sizeof(int32_t) * (size_t)keep);
    x->n = lab->n = (int)ns + keep;
    info->truncated_answer |= keep < len;
    info->truncated_prompt |= ns < s;
}

static void cut_turn_pair(int cutoff, glm_ids *ci, glm_ids *cl, glm_ids *ri, glm_ids *rl, glm_example_info *info) {
    int sc = answer_start(cl), lc = ci->n - sc, lr = ri->n - answer_start(rl);
    long ns, nt;
    glm_infer_seqlen(sc, lc > lr ? lc : lr, cutoff, &ns, &nt);
    info->truncated_prompt = 0;
    keep_turn(ci, cl, ns, nt, info);
    keep_turn(ri, rl, ns, nt, info);
}

/* LLaMA-Factory's feedback (KTO) cut: an example and its KL example each keep infer_seqlen(prompt,
 * its own answer, cutoff), the prompt from its start. */
static void cut_turn_one(int cutoff, glm_ids *x, glm_ids *lab, glm_example_info *info) {
    int s = answer_start(lab);
    long ns, nt;
    glm_infer_seqlen(s, x->n - s, cutoff, &ns, &nt);
    keep_turn(x, lab, ns, nt, info);
}

static int build_preference(const glm_example_cfg *c0, const glm_encoder *enc, const glm_record *r, glm_ids *ids,
                            glm_ids *labels, glm_example_info *info, glm_err *err) {
    glm_record rr = *r; /* shallow: the same strings, the rejected answer put in place below */
    rr.rejected = NULL;
    glm_example_info a, b;
    glm_example_cfg cfg = *c0, *c = &cfg;
    int turns = glm_layout_turns(enc->layout), cutoff = c0->cutoff_len;
    if (turns && cutoff > 0) cfg.cutoff_len = 1 << 29; /* whole, then cut as a pair below */
    if (glm_example_build(c, enc, &rr, ids, labels, &a, err)) return -1;
    rr.answer = r->rejected;
    glm_msg *msgs = NULL;
    if (r->msgs && r->n_msgs > 0) { /* the chosen answer is the conversation's last turn */
        msgs = glm_malloc(sizeof *msgs * (size_t)r->n_msgs);
        memcpy(msgs, r->msgs, sizeof *msgs * (size_t)r->n_msgs);
        msgs[r->n_msgs - 1].content = r->rejected;
        msgs[r->n_msgs - 1].metadata = NULL;
        rr.msgs = msgs;
    }
    glm_ids ri = {0}, rl = {0};
    int rc = glm_example_build(c, enc, &rr, &ri, &rl, &b, err);
    if (rc == 0 && !turns && cutoff > 0 && !c0->kto && a.status == GLM_EX_OK && b.status == GLM_EX_OK &&
        a.answer_tokens != b.answer_tokens) { /* both cut with the longer answer's length */
        cfg.pair_answer_tokens = a.answer_tokens > b.answer_tokens ? a.answer_tokens : b.answer_tokens;
        rr.answer = r->answer;
        rr.msgs = r->msgs;
        rc = glm_example_build(c, enc, &rr, ids, labels, &a, err);
        rr.answer = r->rejected;
        rr.msgs = msgs ? msgs : r->msgs;
        if (rc == 0) rc = glm_example_build(c, enc, &rr, &ri, &rl, &b, err);
    }
    free(msgs);
    if (rc == 0) {
        *info = a.status != GLM_EX_OK ? a : b;
        if (a.status == GLM_EX_OK && b.status == GLM_EX_OK) {
            keep_last_answer(labels);
            keep_last_answer(&rl);
            if (turns && cutoff > 0 && c0->kto) {
                info->truncated_prompt = info->truncated_answer = 0;
                cut_turn_one(cutoff, ids, labels, info);
                cut_turn_one(cutoff, &ri, &rl, info);
            } else if (turns && cutoff > 0) {
                cut_turn_pair(cutoff, ids, labels, &ri, &rl, info);
            }
            if (answer_start(labels) == labels->n || answer_start(&rl) == rl.n) { /* an answer cut to nothing */
                info->status = GLM_EX_NO_ANSWER_TOKENS;
                ids->n = labels->n = 0;
                glm_ids_free(&ri);
                glm_ids_free(&rl);
                return 0;
            }
            info->pair_split = ids->n;
            for (int i = 0; i < ri.n; i++) { glm_ids_push(ids, ri.data[i]); glm_ids_push(labels, rl.data[i]); }
            info->truncated_prompt |= a.truncated_prompt | b.truncated_prompt;
            info->truncated_answer |= a.truncated_answer | b.truncated_answer;
            info->prompt_tokens = a.prompt_tokens;
            info->answer_tokens = a.answer_tokens > b.answer_tokens ? a.answer_tokens : b.answer_tokens;
        } else {
            ids->n = labels->n = 0;
        }
    }
    glm_ids_free(&ri);
    glm_ids_free(&rl);
    return rc;
}

/* --stage pt: the text and the tokenizer's eos, every token its own label (the cache builder joins
 * and cuts them into blocks). */
static int build_text(const glm_encoder *enc, const glm_record *r, glm_ids *ids, glm_ids *labels, glm_err *err) {
    const char *text = r->query ? r->query : "";
    if (enc->encode(enc->ctx, text, strlen(text), ids, err))
        return glm_wrap(err, "record %lld (line %lld): ", (long long)r->index, (long long)r->line);
    glm_ids_push(ids, enc->text_eos);
    for (int i = 0; i < ids->n; i++) glm_ids_push(labels, ids->data[i]);
    return 0;
}

int glm_example_build(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r,
                      glm_ids *ids, glm_ids *labels, glm_example_info *info, glm_err *err) {
    *info = (glm_example_info){0};
    ids->n = labels->n = 0;
    if (c->pt_block > 0) return build_text(enc, r, ids, labels, err);
    if (r->rejected) return build_preference(c, enc, r, ids, labels, info, err);
    if (glm_layout_turns(enc->layout)) return glm_example_build_glm3(c, enc, r, ids, labels, info, err);
    int query_empty = !(r->query && r->query[0]) && !(r->input && r->input[0]);
    if (query_empty || !(r->answer && r->answer[0])) { info->status = GLM_EX_EMPTY; return 0; }
    char *prompt = glm_example_prompt_as(c, enc->layout, r);
    int32_t specials[2] = {enc->gmask, enc->sop};
    int rc = enc->layout == GLM_LAYOUT_GLM2
                 /* ChatGLM2's preprocess_function_train: [gMASK, sop] + prompt (HF truncation counts the two)
                  * + answer + eos; labels on the answer and eos, none equal to pad */
                 ? build_pair(c, enc, r, prompt, specials, 2, NULL, 0, enc->eos, c->max_source_length - 2,
                              c->max_target_length, 0, 1, ids, labels, info, err)
                 /* ChatGLM-6B's: prompt + [gMASK, sop] + answer + eop; labels from <sop> on */
                 : build_pair(c, enc, r, prompt, NULL, 0, specials, 2, enc->eop, c->max_source_length - 1,
                              c->max_target_length - 2, 1, 0, ids, labels, info, err);
    free(prompt);
    return rc;
}

int glm_conv_labels_parse(const char *s, glm_conv_labels *out) {
    if (!strcmp(s, "thudm")) *out = GLM_LABELS_THUDM;
    else if (!strcmp(s, "eos")) *out = GLM_LABELS_EOS;
    else return -1;
    return 0;
}

const char *glm_layout_name(glm_layout l) {
    return l == GLM_LAYOUT_GLM4 ? "GLM-4" : l == GLM_LAYOUT_GLM3 ? "ChatGLM3-6B" : l == GLM_LAYOUT_GLM2 ? "ChatGLM2-6B" : "ChatGLM-6B";
}

int glm_example_cfg_check_layout(const glm_example_cfg *c, glm_layout layout, glm_err *err) {
    if (glm_example_cfg_check(c, err)) return -1;
    if (c->reasoning && layout != GLM_LAYOUT_GLM4)
        return glm_fail(err, "--template glmz1 is GLM-Z1's (GLM-4-0414's tokenizer), but the tokenizer is %s's", glm_layout_name(layout)),
               glm_hint(err, "use the GLM-Z1 model's tokenizer, or drop --template");
    if (!glm_layout_turns(layout) || !(c->prompt_template || c->history_template)) return 0;
    glm_fail(err, "--%s: ChatGLM3-6B's examples are role-token turns, not a text prompt", c->prompt_template ? "prompt_template" : "history_template");
    return glm_hint(err, "drop the template: the tokenizer is ChatGLM3's, whose turns are <|user|> / <|assistant|> messages");
}

void glm_unescape(char *s) {
    char *w = s;
    for (char *p = s; *p; p++) {
        if (*p == '\\' && (p[1] == 'n' || p[1] == 't' || p[1] == '\\')) {
            *w++ = p[1] == 'n' ? '\n' : p[1] == 't' ? '\t' : '\\';
            p++;
        } else {
            *w++ = *p;
        }
    }
    *w = 0;
}
