/* GLM-4's tokenizer (THUDM's ChatGLM4Tokenizer in glm-4-9b's tokenization_chatglm.py) behind the
 * public interface: the rank file, the pre-tokenisation pattern and the 14 special tokens that
 * follow the ranks, and this kind's encode, pieces and decode. chatglm.c routes GLM_TOK_GLM4 here. */
#include "tokenizer/bpe_bytes.h"
#include <stdlib.h>
#include <string.h>

/* ChatGLM4Tokenizer's pat_str
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with \s spelled out. PCRE2 agrees with the regex crate under tiktoken on the rest (leftmost-first
 * alternation, Unicode \p{L}/\p{N}, case folding of the contractions: 'ſ is 's), but its \s also
 * takes U+180E, which left Unicode's White_Space in 6.3; the class below is White_Space exactly. */
#define WS "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
static const char kPattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                               " ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+";
#undef WS

/* In this order, with the ids n, n+1, ... after the n ranks. */
static const char *const kSpecial[] = {"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                                       "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
                                       "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>",
                                       "<|end_of_video|>"};
enum { ENDOFTEXT = 0, MASK = 1, GMASK = 2, SOP = 4, EOP = 5, USER = 7, OBSERVATION = 9 };

int glm4_setup(glm_tokenizer *t, const char *buf, size_t len, const char *what, glm_err *err) {
    bpe_bytes *b = glm_calloc(1, sizeof *b);
    if (bpe_ranks_parse(b, buf, len, what, err)) { free(b); return -1; }
    t->bpe = b; /* from here glm_tokenizer_free releases it */
    if (bpe_set_pattern(b, kPattern, err)) return -1;
    for (size_t i = 0; i < sizeof kSpecial / sizeof *kSpecial; i++)
        if (bpe_add_special(b, kSpecial[i], err)) return -1;
    int32_t n = b->n;
    t->kind = GLM_TOK_GLM4;
    /* GLM-4 pads with <|endoftext|> (its tokenizer_config.json) and has no unknown token. */
    t->ids = (glm_special_ids){n + MASK, n + GMASK, n + SOP, n + EOP, n + ENDOFTEXT, -1};
    t->eos = n + ENDOFTEXT;
    return 0;
}

int glm4_stop_ids(const glm_tokenizer *t, int32_t *ids) {
    int32_t n = t->bpe->n;
    ids[0] = n + ENDOFTEXT;
    ids[1] = n + USER;
    ids[2] = n + OBSERVATION;
    return 3;
}

int glm4_encode_sc(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc, glm_ids *out,
                   glm_err *err) {
    if (flags & GLM_TOK_ADD_SPECIAL) { /* get_prefix_tokens: [gMASK] <sop> */
        glm_ids_push(out, t->ids.gmask);
        glm_ids_push(out, t->ids.sop);
    }
    return bpe_encode(t->bpe, text, len, flags & GLM_TOK_ENCODE_SPECIAL, sc, out, err);
}

int glm4_encode_pieces(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_pieces *out,
                       glm_err *err) {
    memset(out, 0, sizeof *out);
    spm_scratch sc = {0};
    glm_ids ids = {0};
    int rc = glm4_encode_sc(t, text, len, flags, &sc, &ids, err);
    spm_scratch_free(&sc);
    if (rc) { glm_ids_free(&ids); return -1; }
    spm_buf b = {0};
    out->off = glm_malloc((size_t)(ids.n + 1) * sizeof *out->off);
    out->len = glm_malloc((size_t)(ids.n + 1) * sizeof *out->len);
    for (int i = 0; i < ids.n; i++) { /* a piece is the token's bytes (a special: its text) */
        size_t l;
        const char *s = bpe_token(t->bpe, ids.data[i], &l);
        out->off[i] = b.n;
        out->len[i] = l;
        spm_buf_put(&b, s, l);
        spm_buf_put(&b, "", 1);
    }
    out->n = ids.n;
    if (!b.s) spm_buf_put(&b, "", 1);
    out->data = b.s;
    glm_ids_free(&ids);
    return 0;
}

char *glm4_decode(const glm_tokenizer *t, const int32_t *ids, int n, int flags, size_t *len) {
    spm_buf o = {0};
    /* Specials are dropped (HF's skip_special_tokens) and broken UTF-8 becomes U+FFFD as in
     * tiktoken's decode; GLM_TOK_SPM_ONLY is the rank level, tiktoken's decode_bytes. */
    bpe_decode(t->bpe, ids, n, 1, !(flags & GLM_TOK_SPM_ONLY), &o);
    if (len) *len = o.n;
    spm_buf_put(&o, "", 1);
    return o.s;
}

const char *glm4_piece(const glm_tokenizer *t, int32_t id) {
    size_t l;
    return bpe_token(t->bpe, id, &l);
}

int32_t glm4_piece_id(const glm_tokenizer *t, const char *piece) {
    const bpe_bytes *b = t->bpe;
    for (int i = 0; i < b->n_special; i++)
        if (strcmp(piece, b->special[i]) == 0) return b->n + i;
    return bpe_rank(b, (const uint8_t *)piece, strlen(piece));
}
