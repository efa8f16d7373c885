/* ChatGLM3-6B's training examples, as its finetune_demo builds them (finetune_hf.py process_batch
 * over the tokenizer's build_single_message), with THUDM's or LLaMA-Factory's labels; GLM-4's the
 * same way (its finetune.py process_batch over apply_chat_template: each turn <|role|> then
 * metadata + "\n" + content tokenized as one text, no turn where the content is empty, the tools
 * block as a system turn of its own (the reader makes it), [gMASK] <sop> in front, <|user|> at
 * the end, the loss marks shifted by one as ChatGLM3's). See examples.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/examples.h"
#include "data/thought.h"

/* --cutoff_len: LLaMA-Factory's cut of a conversation. Its (source, target) pairs: a target is an
 * assistant turn's content (after its role token), its source everything since the target
 * before (the [gMASK] <sop> prefix, system, user and observation turns, the <|assistant|> token);
 * the turns after the last answer are a source alone. The closing token is reserved; then pair by
 * pair, while tokens are left, glm_infer_seqlen keeps the head of the source and of the target
 * within what is left, and the pairs after are dropped. With --mask_history the last answer
 * alone is a target (every other label is cleared: the other answers, observation turns, the
 * marks after them) and the pairs take the room from the last one back, as LLaMA-Factory's; under
 * its labels (--conversation_labels eos) the eos after each earlier answer stays a target, as its
 * supervised processor labels every pair's first source token eos whatever mask_history says.
 * Each kept token keeps its label. */
typedef struct { long s0, s1, t0, t1, ns, nt; } turn_pair;

static void cut_turns(const glm_example_cfg *c, const glm_msg *m, int n, const int *start, const int *tgt, glm_ids *ids,
                      glm_ids *labels, glm_example_info *info) {
    int end = ids->n - 1; /* the closing token */
    turn_pair *p = glm_malloc(sizeof *p * (size_t)(n + 1));
    int np = 0, last = -1;
    long src0 = 0;
    for (int k = 0; k < n; k++) {
        if (m[k].role != GLM_ROLE_ASSISTANT || start[k] == start[k + 1]) continue;
        p[np] = (turn_pair){src0, tgt[k], tgt[k], start[k + 1], 0, 0};
        last = np++;
        src0 = start[k + 1];
    }
    if (src0 < end) p[np++] = (turn_pair){src0, end, end, end, 0, 0};
    if (c->mask_history) { /* the last answer and the mark after it alone stay in the loss (and the eos marks) */
        int q = 1; /* the next pair whose first token may keep its eos mark */
        for (long i = 0; i <= end; i++) {
            while (q < np && p[q].s0 < i) q++;
            int mark = c->conv_labels == GLM_LABELS_EOS && q < np && p[q].s0 == i;
            if (!mark && (last < 0 || i < p[last].t0 || i > p[last].t1)) labels->data[i] = -100;
        }
    }
    long total = 1;
    int kept = 0;
    for (int r = 0; r < np && total < c->cutoff_len; r++, kept++) {
        turn_pair *q = &p[c->mask_history ? np - 1 - r : r];
        glm_infer_seqlen(q->s1 - q->s0, q->t1 - q->t0, c->cutoff_len - total, &q->ns, &q->nt);
        if (q->ns < q->s1 - q->s0) info->truncated_prompt = 1;
        if (q->nt < q->t1 - q->t0) info->truncated_answer = 1;
        total += q->ns + q->nt;
    }
    if (kept < np) info->truncated_prompt = 1; /* pairs dropped whole */
    int first = c->mask_history ? np - kept : 0, stop = c->mask_history ? np : kept;
    glm_ids ki = {0}, kl = {0};
    for (int q = first; q < stop; q++) {
        glm_ids_append(&ki, ids->data + p[q].s0, (int)p[q].ns);
        glm_ids_append(&kl, labels->data + p[q].s0, (int)p[q].ns);
        glm_ids_append(&ki, ids->data + p[q].t0, (int)p[q].nt);
        glm_ids_append(&kl, labels->data + p[q].t0, (int)p[q].nt);
    }
    glm_ids_push(&ki, ids->data[end]);
    glm_ids_push(&kl, labels->data[end]);
    kl.data[0] = -100; /* the first token is no one's target (an eos mark may have come first when its answer was cut) */
    ids->n = labels->n = 0;
    glm_ids_append(ids, ki.data, ki.n);
    glm_ids_append(labels, kl.data, kl.n);
    glm_ids_free(&ki);
    glm_ids_free(&kl);
    free(p);
}

/* A record's turns: its own (a conversation), or an instruction record's fields as [system] +
 * history pairs + (query, answer); --default_system as the system turn of a record without one.
 * Strings are borrowed from r and c except the query turn's (instruction + "\n" + input: *owned,
 * freed by the caller, as *out when it is not r->msgs). */
static int turns_of(const glm_example_cfg *c, const glm_record *r, glm_msg **out, char **owned) {
    *owned = NULL;
    const char *dflt = c->default_system && c->default_system[0] ? c->default_system : NULL;
    if (r->conv_key && (!dflt || (r->n_msgs > 0 && r->msgs[0].role == GLM_ROLE_SYSTEM))) { *out = r->msgs; return r->n_msgs; }
    if (r->conv_key) {
        glm_msg *m = glm_malloc(sizeof *m * (size_t)(r->n_msgs + 1));
        m[0] = (glm_msg){GLM_ROLE_SYSTEM, (char *)dflt, NULL, 0, -1};
        memcpy(m + 1, r->msgs, sizeof *m * (size_t)r->n_msgs);
        *out = m;
        return r->n_msgs + 1;
    }
    int n = 0;
    glm_msg *m = glm_malloc(sizeof *m * (size_t)(2 * r->n_hist + 3));
    if (r->system && r->system[0]) m[n++] = (glm_msg){GLM_ROLE_SYSTEM, r->system, NULL, 0, -1};
    else if (dflt) m[n++] = (glm_msg){GLM_ROLE_SYSTEM, (char *)dflt, NULL, 0, -1};
    for (int i = 0; i < r->n_hist; i++) {
        m[n++] = (glm_msg){GLM_ROLE_USER, r->hist[2 * i], NULL, 0, -1};
        m[n++] = (glm_msg){GLM_ROLE_ASSISTANT, r->hist[2 * i + 1], NULL, 0, -1};
    }
    size_t ql = strlen(r->query), il = r->input && r->input[0] ? strlen(r->input) : 0;
    char *q = glm_malloc(ql + il + 2);
    memcpy(q, r->query, ql + 1);
    if (il) { q[ql] = '\n'; memcpy(q + ql + 1, r->input, il + 1); } /* instruction + "\n" + input */
    *owned = q;
    m[n++] = (glm_msg){GLM_ROLE_USER, q, NULL, 0, -1};
    m[n++] = (glm_msg){GLM_ROLE_ASSISTANT, r->answer, NULL, 0, -1};
    *out = m;
    return n;
}

/* The content a turn is encoded from: source_prefix goes before the first user turn's. */
static char *content_of(const glm_example_cfg *c, const glm_msg *m, int first_user) {
    const char *p = first_user && c->source_prefix ? c->source_prefix : "";
    size_t a = strlen(p), b = strlen(m->content);
    char *s = glm_malloc(a + b + 1);
    memcpy(s, p, a);
    memcpy(s + a, m->content, b + 1);
    return s;
}

/* The empty thought's ids, its text through the encoder's Hugging Face encode where it has one (a
 * glmz1 example's texts go through it: <think> may be an added token). */
static int empty_thought(const glm_encoder *enc, glm_ids *ids, glm_err *err) {
    return (enc->encode_special ? enc->encode_special : enc->encode)(enc->ctx, GLM_THOUGHT_EMPTY, strlen(GLM_THOUGHT_EMPTY), ids,
                                                                      err);
}

/* How a glmz1 assistant turn is written (examples.h reasoning). */
typedef enum {
    THOUGHT_AS_DATA = 0, /* training: the turn's thoughts as they are, the empty one where it has none */
    THOUGHT_NONE,        /* an evaluation prompt's earlier turns: thoughts removed, no empty one */
} thought_rule;

/* [gMASK] <sop> and the turns m[0..n) into ids; turn k is ids [start[k], start[k+1]) (start has
 * n + 1 places; an empty GLM-4 turn is empty), its targets from tgt[k] on (n places: after the
 * role token, or after an empty thought that is prompt). */
static int encode_turns(const glm_example_cfg *c, const glm_encoder *enc, const glm_msg *m, int n, thought_rule rule,
                        glm_ids *ids, int *start, int *tgt, glm_err *err) {
    int (*sp)(void *, const char *, size_t, glm_ids *, glm_err *) = enc->encode_sp ? enc->encode_sp : enc->encode;
    glm_ids_push(ids, enc->gmask);
    glm_ids_push(ids, enc->sop);
    int rc = 0, seen_user = 0;
    /* glmz1 is LLaMA-Factory's: its text goes through Hugging Face's encode, added tokens split out */
    int (*text_enc)(void *, const char *, size_t, glm_ids *, glm_err *) =
        c->reasoning && enc->encode_special ? enc->encode_special : enc->encode;
    for (int k = 0; k < n && !rc; k++) {
        start[k] = ids->n;
        tgt[k] = ids->n + 1;
        char *text = content_of(c, &m[k], m[k].role == GLM_ROLE_USER && !seen_user++);
        int think = c->reasoning && m[k].role == GLM_ROLE_ASSISTANT;
        if (think && (c->disable_thinking || rule == THOUGHT_NONE)) {
            char *t = glm_thought_remove(text);
            free(text);
            text = t;
        }
        if (enc->layout == GLM_LAYOUT_GLM4) { /* the template's metadata + "\n" + content, one text */
            if (!text[0]) { free(text); continue; } /* the template writes no turn without content */
            glm_ids_push(ids, enc->role[m[k].role]);
            if (think && rule == THOUGHT_AS_DATA && !glm_thought_has_words(text)) {
                rc = empty_thought(enc, ids, err);
                if (c->disable_thinking) tgt[k] = ids->n; /* LLaMA-Factory puts it in the prompt then */
            }
            const char *meta = m[k].metadata ? m[k].metadata : "";
            size_t n0 = strlen(meta), n1 = strlen(text);
            char *j = glm_malloc(n0 + n1 + 2);
            memcpy(j, meta, n0);
            j[n0] = '\n';
            memcpy(j + n0 + 1, text, n1 + 1);
            rc = rc || text_enc(enc->ctx, j, n0 + n1 + 1, ids, err);
            free(j);
        } else { /* finetune_hf.py: build_single_message(role, "", content) */
            glm_ids_push(ids, enc->role[m[k].role]);
            rc = sp(enc->ctx, "\n", 1, ids, err) || sp(enc->ctx, text, strlen(text), ids, err); /* metadata "" + "\n" */
        }
        free(text);
    }
    start[n] = ids->n;
    return rc;
}

int glm_example_build_glm3(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r,
                           glm_ids *ids, glm_ids *labels, glm_example_info *info, glm_err *err) {
    if (!r->conv_key) { /* an instruction record: ptuning's "if prompt and answer" */
        int query_empty = !(r->query && r->query[0]) && !(r->input && r->input[0]);
        if (query_empty || !(r->answer && r->answer[0])) { info->status = GLM_EX_EMPTY; return 0; }
    } else if (r->n_msgs == 0) {
        info->status = GLM_EX_EMPTY;
        return 0;
    }
    glm_msg *m;
    char *owned;
    int n = turns_of(c, r, &m, &owned);
    int *start = glm_malloc(sizeof *start * (size_t)(n + 1)); /* turn k is ids [start[k], start[k+1]) */
    int *tgt = glm_malloc(sizeof *tgt * (size_t)(n + 1));     /* its targets from tgt[k] */
    int rc = encode_turns(c, enc, m, n, THOUGHT_AS_DATA, ids, start, tgt, err);
    glm_ids_push(ids, enc->eos);
    for (int i = 0; i < ids->n; i++) glm_ids_push(labels, c->train_on_prompt ? ids->data[i] : -100);
    for (int k = 0; k < n && !rc && !c->train_on_prompt; k++) {
        int a = start[k], e = start[k + 1];
        if (a == e) continue; /* a GLM-4 turn without content */
        if (c->conv_labels == GLM_LABELS_EOS) {
            if (m[k].role != GLM_ROLE_ASSISTANT) continue;
            for (int i = tgt[k]; i < e; i++) labels->data[i] = ids->data[i];
            labels->data[e] = enc->eos; /* the next role token (or the final eos) is where the turn ends */
        } else if (m[k].role == GLM_ROLE_ASSISTANT || (m[k].role == GLM_ROLE_OBSERVATION && enc->layout != GLM_LAYOUT_GLM4)) {
            /* finetune_hf.py (ChatGLM3) leaves only system and user turns out of the loss, GLM-4's
             * finetune.py observation turns too; the marks shifted by one */
            for (int i = tgt[k]; i <= e; i++) labels->data[i] = ids->data[i];
        }
    }
    info->prompt_tokens = ids->n;
    if (!rc && c->cutoff_len > 0) cut_turns(c, m, n, start, tgt, ids, labels, info);
    if (m != r->msgs) free(m);
    free(owned);
    free(start);
    free(tgt);
    if (rc) return glm_wrap(err, "record %lld (line %lld): ", (long long)r->index, (long long)r->line);
    int max = c->max_source_length + c->max_target_length + 1;
    if (c->cutoff_len <= 0 && ids->n > max) { ids->n = labels->n = max; info->truncated_answer = 1; }
    int targets = 0;
    for (int i = 0; i < labels->n; i++) targets += labels->data[i] != -100;
    info->answer_tokens = targets;
    if (targets == 0) { info->status = GLM_EX_NO_ANSWER_TOKENS; ids->n = labels->n = 0; }
    return 0;
}

int glm_example_eval_turns(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r, glm_eval_turn **out,
                           int *n_out, glm_err *err) {
    *out = NULL;
    *n_out = 0;
    glm_msg *m;
    char *owned;
    int n = turns_of(c, r, &m, &owned);
    int *start = glm_malloc(sizeof *start * (size_t)(n + 1)), *tgt = glm_malloc(sizeof *tgt * (size_t)(n + 1));
    glm_ids ids = {0};
    /* glmz1: the earlier answers without their thoughts (LLaMA-Factory's encode_oneturn) */
    int rc = encode_turns(c, enc, m, n, THOUGHT_NONE, &ids, start, tgt, err);
    for (int k = 0; k < n && !rc; k++) {
        if (start[k] >= c->max_source_length) break; /* process_batch_eval stops reading the conversation */
        if (m[k].role != GLM_ROLE_ASSISTANT) continue;
        if (c->reasoning ? !m[k].content[0] : start[k] == start[k + 1]) continue; /* a GLM-4 turn without content */
        /* glmz1: the label without its thoughts when thinking is off, and then the empty thought
         * ends the prompt (with thinking on the model writes its own) */
        char *content = c->reasoning && c->disable_thinking ? glm_thought_remove(m[k].content) : glm_strdup(m[k].content);
        glm_eval_turn *t;
        *out = glm_realloc(*out, sizeof **out * (size_t)(*n_out + 1));
        t = &(*out)[(*n_out)++];
        *t = (glm_eval_turn){.turn = m[k].src};
        glm_ids_append(&t->in, ids.data, start[k] < c->max_source_length ? start[k] : c->max_source_length);
        glm_ids_push(&t->in, enc->role[GLM_ROLE_ASSISTANT]);
        if (c->reasoning && c->disable_thinking && !glm_thought_has_words(content))
            rc = empty_thought(enc, &t->in, err);
        const char *meta = enc->layout == GLM_LAYOUT_GLM4 && m[k].metadata && m[k].metadata[0] ? m[k].metadata : NULL;
        size_t n0 = meta ? strlen(meta) + 1 : 0, n1 = strlen(content);
        t->label = glm_malloc(n0 + n1 + 1);
        if (meta) sprintf(t->label, "%s\n", meta);
        memcpy(t->label + n0, content, n1 + 1);
        free(content);
    }
    glm_ids_free(&ids);
    if (m != r->msgs) free(m);
    free(owned);
    free(start);
    free(tgt);
    if (rc) {
        glm_eval_turns_free(*out, *n_out);
        *out = NULL;
        *n_out = 0;
        return glm_wrap(err, "record %lld (line %lld): ", (long long)r->index, (long long)r->line);
    }
    return 0;
}

void glm_eval_turns_free(glm_eval_turn *t, int n) {
    for (int i = 0; i < n; i++) { glm_ids_free(&t[i].in); free(t[i].label); }
    free(t);
}
