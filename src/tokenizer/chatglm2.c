/* ChatGLM2-6B / ChatGLM3-6B tokenization: THUDM's tokenization_chatglm.py over SentencePiece
 * (tokenizer.h's issue 18 notes). The text goes to SentencePiece untouched (no <n>/<|blank_N|>
 * layer); the specials [MASK] [gMASK] [sMASK] sop eop (ChatGLM3: then <|system|> <|user|>
 * <|assistant|> <|observation|>) are ids after the pieces.
 *
 * Hugging Face's tokenizer.encode turns text into pieces (EncodeAsPieces) and each piece into an
 * id (convert_token_to_id), which looks the piece up among the specials' names first: a
 * SentencePiece piece spelled "sop" or "eop" becomes the special. SPTokenizer.encode (what
 * ChatGLM3's build_single_message and build_chat_input call) takes SentencePiece's ids as they
 * are: that is GLM_TOK_SPM_ONLY here. */
#include <stdlib.h>
#include <string.h>
#include "tokenizer/chatglm2.h"

static int is_v3(const glm_tokenizer *t) { return t->n_extra == GLM_TOK_MAX_EXTRA; }

/* The special whose name starts s[0..n), or -1 (no name is a prefix of another). */
static int special_at(const glm_tokenizer *t, const char *s, size_t n, size_t *len) {
    for (int k = 0; k < t->n_extra; k++) {
        size_t l = strlen(t->extra[k]);
        if (l <= n && memcmp(s, t->extra[k], l) == 0) { *len = l; return k; }
    }
    return -1;
}

/* How text splits (ChatGLM3's tokenize with encode_special_tokens=True: re.finditer over the
 * specials' names) into segments for SentencePiece and specials. 0, or -1 when flags ask for a
 * split the tokenizer does not have. */
static int want_split(const glm_tokenizer *t, int flags, int *split, glm_err *err) {
    *split = !(flags & GLM_TOK_SPM_ONLY) && ((flags & GLM_TOK_ENCODE_SPECIAL) || t->encode_special);
    if ((flags & GLM_TOK_ENCODE_SPECIAL) && !is_v3(t)) {
        glm_fail(err, "GLM_TOK_ENCODE_SPECIAL: ChatGLM2's tokenizer has no encode_special_tokens (ChatGLM3's has)");
        return glm_hint(err, "add the special tokens as ids");
    }
    return 0;
}

/* Appends SentencePiece's ids for s[0..n), each piece spelled like a special mapped to it unless
 * raw (SPTokenizer.encode). */
static int encode_segment(const glm_tokenizer *t, const char *s, size_t n, int raw, spm_scratch *sc, glm_ids *out,
                          glm_err *err) {
    if (spm_encode(&t->sp, s, n, sc, err)) return -1;
    int32_t alias[GLM_TOK_MAX_EXTRA];
    for (int k = 0; k < t->n_extra; k++)
        alias[k] = raw ? -1 : spm_piece_to_id(&t->sp, t->extra[k], strlen(t->extra[k]));
    for (int i = 0; i < sc->ntok; i++) {
        int32_t id = sc->tok[i].id;
        for (int k = 0; k < t->n_extra; k++)
            if (id == alias[k]) { id = t->sp.p.n + k; break; }
        glm_ids_push(out, id);
    }
    return 0;
}

int glm2_encode_sc(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc,
                   glm_ids *out, glm_err *err) {
    if (len > SPM_MAX_TEXT)
        return glm_fail(err, "text of %zu bytes is too long to tokenize (limit %zu bytes)", len, SPM_MAX_TEXT);
    int split, raw = (flags & GLM_TOK_SPM_ONLY) != 0;
    if (want_split(t, flags, &split, err)) return -1;
    if (flags & GLM_TOK_ADD_SPECIAL) { glm_ids_push(out, t->ids.gmask); glm_ids_push(out, t->ids.sop); }
    size_t a = 0;
    for (size_t i = 0; split && i < len;) {
        size_t l;
        int k = special_at(t, text + i, len - i, &l);
        if (k < 0) { i++; continue; }
        if (i > a && encode_segment(t, text + a, i - a, raw, sc, out, err)) return -1;
        glm_ids_push(out, t->sp.p.n + k);
        a = i += l;
    }
    if ((a < len || !split) && encode_segment(t, text + a, len - a, raw, sc, out, err)) return -1;
    return 0;
}

/* EncodeAsPieces of one segment (an unknown piece keeps its surface, as SentencePiece reports it). */
static int segment_pieces(const glm_tokenizer *t, const char *s, size_t n, spm_scratch *sc, glm_pieces *o, spm_buf *b,
                          int *cap, glm_err *err) {
    if (spm_encode(&t->sp, s, n, sc, err)) return -1;
    const spm_proto *p = &t->sp.p;
    for (int i = 0; i < sc->ntok; i++) {
        const spm_tok *k = &sc->tok[i];
        if (p->type[k->id] == SPM_UNKNOWN) glm_pieces_add(o, b, cap, sc->norm.s + k->off, k->len);
        else glm_pieces_add(o, b, cap, p->piece[k->id], (size_t)p->piece_len[k->id]);
    }
    return 0;
}

int glm2_encode_pieces(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_pieces *out,
                       glm_err *err) {
    memset(out, 0, sizeof *out);
    if (len > SPM_MAX_TEXT)
        return glm_fail(err, "text of %zu bytes is too long to tokenize (limit %zu bytes)", len, SPM_MAX_TEXT);
    int split;
    if (want_split(t, flags, &split, err)) return -1;
    spm_scratch sc = {0};
    spm_buf b = {0};
    int cap = 0, rc = 0;
    if (flags & GLM_TOK_ADD_SPECIAL) {
        glm_pieces_add(out, &b, &cap, t->extra[1], strlen(t->extra[1])); /* [gMASK] */
        glm_pieces_add(out, &b, &cap, t->extra[3], strlen(t->extra[3])); /* sop */
    }
    size_t a = 0;
    for (size_t i = 0; split && i < len && !rc;) {
        size_t l;
        int k = special_at(t, text + i, len - i, &l);
        if (k < 0) { i++; continue; }
        if (i > a) rc = segment_pieces(t, text + a, i - a, &sc, out, &b, &cap, err);
        glm_pieces_add(out, &b, &cap, t->extra[k], l);
        a = i += l;
    }
    if (!rc && (a < len || !split)) rc = segment_pieces(t, text + a, len - a, &sc, out, &b, &cap, err);
    spm_scratch_free(&sc);
    if (!b.s) spm_buf_put(&b, "", 1);
    out->data = b.s;
    if (rc) glm_pieces_free(out);
    return rc;
}

/* Hugging Face's decode: DecodePieces over _convert_id_to_token, which gives "" for pad/unk, bos,
 * eos and ids past the vocabulary, and for the specials "" (ChatGLM2) or their names (ChatGLM3).
 * SentencePiece copies such a piece as text; even "" ends a run of byte pieces. */
char *glm2_decode(const glm_tokenizer *t, const int32_t *ids, int n, size_t *len) {
    const char **lit = glm_malloc(sizeof *lit * (size_t)(n > 0 ? n : 1));
    const int32_t np = t->sp.p.n;
    const spm_proto *p = &t->sp.p;
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        int special = id >= np && id < np + t->n_extra;
        lit[i] = special ? (is_v3(t) ? t->extra[id - np] : "")
               : id < 0 || id >= np || id == t->ids.pad || id == p->bos_id || id == p->eos_id ? "" : NULL;
    }
    spm_buf o = {0};
    spm_decode_lit(&t->sp, ids, lit, n, &o);
    free(lit);
    if (len) *len = o.n;
    spm_buf_put(&o, "", 1);
    return o.s;
}

glm_role_ids glm_tokenizer_roles(const glm_tokenizer *t) {
    glm_role_ids r = {-1, -1, -1, -1};
    if (t->kind == GLM_TOK_SPM || t->kind == GLM_TOK_CHATGLM1) return r; /* a plain model's "<|user|>" piece is text */
    r.system = glm_tokenizer_piece_id(t, "<|system|>");
    r.user = glm_tokenizer_piece_id(t, "<|user|>");
    r.assistant = glm_tokenizer_piece_id(t, "<|assistant|>");
    r.observation = glm_tokenizer_piece_id(t, "<|observation|>");
    return r;
}
