/* GLM-4's tokenizer as transformers' GLM layout ships it (glm-4-9b-chat-hf's tokenizer.json):
 * the same rank file converted by transformers' TikTokenConverter into a byte-level BPE, each
 * token's bytes spelt in GPT-2's printable alphabet, its id its rank, the merges derived from
 * the ranks, GLM-4's split pattern and its 14 special tokens as added tokens after the vocabulary
 * (later releases add more after those: they join the specials in id order).
 * glmtrain reads it back into the ranks and encodes by rank (tiktoken's rule, as THUDM's
 * tokenizer), after checking that the file is that conversion: the pattern, the specials, and
 * merges in the order of the ranks they make, which is what makes merge order and rank order
 * give the same tokens. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/json_text.h"
#include "tokenizer/bpe_bytes.h"

/* GLM-4's pat_str, as the converter writes it into the Split pre-tokenizer */
static const char kGlm4Pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* GPT-2's bytes_to_unicode, inverted: the byte a code point stands for, -1 for none. Printable
 * bytes (! to ~, ¡ to ¬, ® to ÿ) stand for themselves; the other 68 are U+0100 onwards in order. */
static int byte_of(uint32_t cp) {
    static int16_t table[324];
    static int ready; /* filled once; the same values from any thread */
    if (!ready) {
        for (int i = 0; i < 324; i++) table[i] = -1;
        int k = 0;
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            table[printable ? b : 256 + k++] = (int16_t)b;
        }
        ready = 1;
    }
    return cp < 324 ? table[cp] : -1;
}

/* A vocabulary string back to its bytes (out has room for strlen(s) bytes): the length, or -1. */
static long string_bytes(const char *s, uint8_t *out) {
    long n = 0;
    size_t len = strlen(s);
    for (size_t i = 0; i < len;) {
        int k = bpe_utf8_char((const uint8_t *)s + i, len - i);
        if (k <= 0) return -1;
        uint32_t cp = (uint8_t)s[i];
        if (k > 1) {
            cp &= 0xFFu >> (k + 1);
            for (int j = 1; j < k; j++) cp = cp << 6 | ((uint8_t)s[i + j] & 0x3F);
        }
        int b = byte_of(cp);
        if (b < 0) return -1;
        out[n++] = (uint8_t)b;
        i += (size_t)k;
    }
    return n;
}

static void b64(const uint8_t *s, size_t n, spm_buf *o) {
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        char q[4] = {a[v >> 18 & 63], a[v >> 12 & 63], i + 1 < n ? a[v >> 6 & 63] : '=', i + 2 < n ? a[v & 63] : '='};
        spm_buf_put(o, q, 4);
    }
}

/* The Split pre-tokenizer's pattern (alone or in a Sequence), NULL when there is none. */
static const char *split_pattern(const cJSON *pt) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(pt, "type");
    if (cJSON_IsString(ty) && !strcmp(ty->valuestring, "Sequence")) {
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers")) {
            const char *p = split_pattern(x);
            if (p) return p;
        }
        return NULL;
    }
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "Split")) return NULL;
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "Regex");
    return cJSON_IsString(re) ? re->valuestring : NULL;
}

/* The ranks as rank-file text ("<base64> <rank>" lines), from the vocabulary */
static int vocab_ranks(const cJSON *vocab, const char *what, spm_buf *text, glm_err *err) {
    int n = cJSON_GetArraySize(vocab);
    const char **by_id = glm_calloc((size_t)n + 1, sizeof *by_id);
    const cJSON *x;
    int rc = 0;
    cJSON_ArrayForEach(x, vocab) {
        int id = cJSON_IsNumber(x) ? x->valueint : -1;
        if (id < 0 || id >= n || by_id[id]) {
            rc = glm_fail(err, "%s: model.vocab: \"%.60s\" has id %d, but the %d tokens of a rank-ordered vocabulary "
                               "have the ids 0 to %d, each once", what, x->string, id, n, n - 1);
            break;
        }
        by_id[id] = x->string;
    }
    uint8_t *bytes = NULL;
    for (int id = 0; id < n && !rc; id++) {
        bytes = glm_realloc(bytes, strlen(by_id[id]) + 1);
        long k = string_bytes(by_id[id], bytes);
        if (k <= 0) {
            rc = glm_fail(err, "%s: model.vocab: token %d \"%.60s\" is not spelt in byte-level BPE's alphabet", what, id,
                          by_id[id]);
            break;
        }
        b64(bytes, (size_t)k, text);
        char r[24];
        snprintf(r, sizeof r, " %d\n", id);
        spm_buf_put(text, r, strlen(r));
    }
    free(bytes);
    free(by_id);
    return rc;
}

/* Every merge makes a token, and the tokens come in rank order: then merging the listed pair
 * that comes first (Hugging Face's BPE) and merging the pair whose token has the lowest rank
 * (tiktoken's) are the same choice. A merge is "left right" or ["left", "right"]. */
static int check_merges(const bpe_bytes *b, const cJSON *merges, const char *what, glm_err *err) {
    int32_t last = -1, i = 0;
    uint8_t *buf = NULL;
    size_t cap = 0;
    const cJSON *x;
    int rc = 0;
    cJSON_ArrayForEach(x, merges) {
        const char *l = NULL, *r = NULL;
        char *copy = NULL;
        if (cJSON_IsString(x)) {
            copy = glm_strdup(x->valuestring);
            char *sp = strchr(copy, ' ');
            if (sp) { *sp = 0; l = copy; r = sp + 1; }
        } else if (cJSON_GetArraySize(x) == 2 && cJSON_IsString(cJSON_GetArrayItem(x, 0)) && cJSON_IsString(cJSON_GetArrayItem(x, 1))) {
            l = cJSON_GetArrayItem(x, 0)->valuestring;
            r = cJSON_GetArrayItem(x, 1)->valuestring;
        }
        size_t need = (l ? strlen(l) : 0) + (r ? strlen(r) : 0) + 1;
        if (need > cap) buf = glm_realloc(buf, cap = need);
        long nl = l ? string_bytes(l, buf) : -1, nr = nl > 0 && r ? string_bytes(r, buf + nl) : -1;
        int32_t rank = nr > 0 ? bpe_rank(b, buf, (size_t)(nl + nr)) : -1;
        free(copy);
        if (rank < 0) {
            rc = glm_fail(err, "%s: model.merges[%d] does not join two tokens into a token of the vocabulary", what, i);
            break;
        }
        if (rank < last) {
            rc = glm_fail(err, "%s: model.merges[%d] makes rank %d after a merge that made rank %d: the merges are not in "
                               "rank order", what, i, rank, last);
            glm_hint(err, "glmtrain reads GLM-4's tokenizer.json as transformers' TikTokenConverter writes it; "
                          "use the model's tokenizer.model (THUDM/glm-4-9b-chat) instead");
            break;
        }
        last = rank;
        i++;
    }
    free(buf);
    return rc;
}

int glm4_setup_json(glm_tokenizer *t, const char *buf, size_t len, const char *what, glm_err *err) {
    cJSON *o = glm_json_parse_doc(buf, len, what, "tokenizer.json", err);
    if (!o) return -1;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const char *pat = split_pattern(cJSON_GetObjectItemCaseSensitive(o, "pre_tokenizer"));
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(o, "normalizer");
    int rc = 0;
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "BPE") || !cJSON_IsObject(vocab))
        rc = glm_fail(err, "%s: model is not a byte-level BPE with a vocab (GLM-4's tokenizer.json is one)", what);
    else if (!pat || strcmp(pat, kGlm4Pattern))
        rc = glm_fail(err, "%s: the pre_tokenizer's Split pattern is not GLM-4's (%.80s)", what, pat ? pat : "none");
    else if (norm && !cJSON_IsNull(norm))
        rc = glm_fail(err, "%s: a normalizer is set; GLM-4's tokenizer.json has none", what);
    if (rc) {
        cJSON_Delete(o);
        return glm_hint(err, "glmtrain reads the tokenizer.json of GLM-4 (glm-4-9b-chat-hf); other models' are not supported");
    }
    spm_buf text = {0};
    rc = vocab_ranks(vocab, what, &text, err);
    char ranks_what[4200];
    snprintf(ranks_what, sizeof ranks_what, "%s (its vocabulary as ranks)", what);
    if (!rc) rc = glm4_setup(t, text.s ? text.s : "", text.n, ranks_what, err);
    free(text.s);
    if (!rc) rc = check_merges(t->bpe, cJSON_GetObjectItemCaseSensitive(model, "merges"), what, err);
    /* the added tokens: GLM-4's specials at the ids glm4_setup gave them; later releases' further
     * specials (GLM-4-0414's) follow them in id order and join them */
    const cJSON *x, *added = rc ? NULL : cJSON_GetObjectItemCaseSensitive(o, "added_tokens");
    for (int32_t next = rc ? 0 : t->bpe->n + t->bpe->n_special, more = !rc; more && !rc;) {
        more = 0;
        cJSON_ArrayForEach(x, added) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id"), *content = cJSON_GetObjectItemCaseSensitive(x, "content");
            if (cJSON_IsNumber(id) && id->valueint == next && cJSON_IsString(content) &&
                glm4_piece_id(t, content->valuestring) < 0) {
                rc = bpe_add_special(t->bpe, content->valuestring, err);
                if (!rc) t->bpe->special_text[t->bpe->n_special - 1] = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(x, "special"));
                next++;
                more = 1;
                break;
            }
        }
    }
    cJSON_ArrayForEach(x, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(x, "id"), *content = cJSON_GetObjectItemCaseSensitive(x, "content");
        int32_t want = cJSON_IsString(content) ? glm4_piece_id(t, content->valuestring) : -1;
        if (rc) break;
        if (!cJSON_IsNumber(id) || want < t->bpe->n || want != id->valueint) {
            rc = glm_fail(err, "%s: added token \"%.40s\" (id %d) is not one of GLM-4's special tokens at its id (%d)", what,
                          cJSON_IsString(content) ? content->valuestring : "?", cJSON_IsNumber(id) ? id->valueint : -1, want);
            glm_hint(err, "GLM-4's 14 special tokens follow the vocabulary: <|endoftext|> [MASK] [gMASK] [sMASK] <sop> <eop> "
                          "<|system|> <|user|> <|assistant|> <|observation|> and the image/video markers");
            break;
        }
    }
    cJSON_Delete(o);
    return rc;
}
