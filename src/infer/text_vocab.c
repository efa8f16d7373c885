/* Every token's bytes as text (infer/text_vocab.h). */
#include "infer/text_vocab.h"
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

/* b[0..n) is whole, well-formed UTF-8 (no character cut at either end). */
static int utf8_whole(const unsigned char *b, size_t n) {
    uint8_t need = 0, lo = 0, hi = 0;
    for (size_t i = 0; i < n; i++)
        if (glm_utf8_step(&need, &lo, &hi, b[i]) < 0) return 0;
    return need == 0;
}

void glm_text_vocab_build(glm_text_vocab *v, const glm_tokenizer *t, int V) {
    glm_tok_kind kind = glm_tokenizer_kind(t);
    int32_t unk = glm_tokenizer_specials(t).unk, pieces = glm_tokenizer_spm_size(t);
    v->V = V;
    v->drop_first_space = kind != GLM_TOK_GLM4; /* SentencePiece's dummy prefix */
    v->off = glm_malloc(sizeof(size_t) * ((size_t)V + 1));
    v->text = glm_calloc((size_t)V, 1);
    v->plain = glm_calloc((size_t)V, 1);
    v->lead = glm_calloc((size_t)V, 1);
    v->sig = glm_calloc((size_t)V, 1);
    v->nsp = glm_calloc((size_t)V, 1);
    v->chars = glm_calloc((size_t)V, 1);
    size_t cap = (size_t)V * 4 + 16, n = 0;
    v->blob = glm_malloc(cap);
    for (int32_t id = 0; id < V; id++) {
        v->off[id] = n;
        size_t len = 0;
        char *b = glm_tokenizer_token_bytes(t, id, &len);
        /* a token of the text: it decodes to text of its own (control and special pieces decode to
         * nothing), or it is a piece of spaces (decoding drops a text's first space) */
        int text = b && len > 0 && id != unk && !((kind == GLM_TOK_CHATGLM2 || kind == GLM_TOK_GLM4) && id >= pieces);
        if (text) {
            char *d = glm_tokenizer_decode(t, &id, 1);
            int spaces = 1;
            for (size_t i = 0; i < len; i++) spaces &= b[i] == ' ';
            text = (d && d[0]) || spaces;
            free(d);
        }
        if (text) {
            if (n + len > cap) v->blob = glm_realloc(v->blob, cap = 2 * (n + len));
            memcpy(v->blob + n, b, len);
            n += len;
            v->text[id] = 1;
            int plain = 1;
            for (size_t i = 0; i < len; i++) plain &= (unsigned char)b[i] >= 0x20 && b[i] != '"' && b[i] != '\\';
            v->plain[id] = (uint8_t)(plain && utf8_whole((const unsigned char *)b, len));
            size_t nc = 0;
            for (size_t i = 0; i < len; i++) nc += ((unsigned char)b[i] & 0xC0) != 0x80;
            v->chars[id] = (uint8_t)(nc < 255 ? nc : 255);
            v->lead[id] = (uint8_t)b[0];
            size_t w = 0;
            while (w < len && glm_json_space((unsigned char)b[w])) w++;
            v->nsp[id] = (uint8_t)(w < 255 ? w : 255);
            v->sig[id] = w < len ? (uint8_t)b[w] : 0;
        }
        free(b);
    }
    v->off[V] = n;
}

void glm_text_vocab_free(glm_text_vocab *v) {
    free(v->blob);
    free(v->off);
    free(v->text);
    free(v->plain);
    free(v->lead);
    free(v->sig);
    free(v->nsp);
    free(v->chars);
    memset(v, 0, sizeof *v);
}


void glm_text_vocab_mask(const glm_text_vocab *v, const glm_recognizer *r, const int32_t *ends, int n_ends, float *logits) {
    glm_end_logits kept;
    glm_ends_save(v->V, ends, n_ends, logits, &kept);
    if (r->done) {
        for (int id = 0; id < v->V; id++) logits[id] = GLM_MASKED;
    } else {
        uint8_t first[256]; /* which bytes may come next: most tokens are refused by their first */
        for (int b = 0; b < 256; b++) {
            unsigned char c = (unsigned char)b;
            first[b] = (uint8_t)r->fits(r->state, &c, 1);
        }
        for (int id = 0; id < v->V; id++) {
            if (!v->text[id]) { logits[id] = GLM_MASKED; continue; }
            if (r->in_string && v->plain[id]) { /* a string takes it whole and is still open, if it has room */
                if (r->limited && v->chars[id] > r->chars_left) logits[id] = GLM_MASKED;
                continue;
            }
            if (r->between ? v->nsp[id] > r->room || (v->sig[id] && !first[v->sig[id]]) : !first[v->lead[id]]) {
                logits[id] = GLM_MASKED;
                continue;
            }
            if (!r->fits(r->state, (const unsigned char *)v->blob + v->off[id], v->off[id + 1] - v->off[id]))
                logits[id] = GLM_MASKED;
        }
    }
    glm_ends_put(v->V, ends, &kept, r->done, logits); /* the end: once the answer is complete */
}
