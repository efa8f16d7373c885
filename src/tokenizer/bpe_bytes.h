/* Internal: the byte-level BPE behind GLM-4's tokenizer (tiktoken's algorithm). A rank file maps
 * token bytes to ranks 0..n-1 (the ids); text is split by a regex (PCRE2, Unicode classes), each
 * piece is one id when it is a token, else its bytes are merged pair by pair, lowest rank first.
 * Special tokens get the ids n, n+1, ... and are only recognised in text when asked. Not a public
 * header: only files in src/tokenizer include it. */
#ifndef GLM_TOKENIZER_BPE_BYTES_H
#define GLM_TOKENIZER_BPE_BYTES_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "tokenizer/spm.h"

#define BPE_MAX_SPECIAL 128 /* GLM-4's 14 and the ones later tokenizer.json files add after them */

typedef struct bpe_slot { uint32_t hash; int32_t rank; } bpe_slot; /* rank -1: empty */

typedef struct bpe_bytes {
    int32_t n;               /* ranks (= ids 0..n-1) */
    char *arena;             /* token bytes, each followed by a NUL so a token reads as a C string */
    uint32_t *off, *len;     /* token r is arena[off[r] .. off[r] + len[r]) */
    bpe_slot *slots;         /* open addressing, bytes -> rank */
    uint32_t mask;
    int32_t byte_rank[256];  /* the rank of each single byte (all 256 must be tokens) */
    int32_t *pair_rank;      /* [b0 << 8 | b1]: the rank of each two-byte token, -1 (the merge's first lookups) */
    int n_special;           /* specials have ids n + i */
    char special[BPE_MAX_SPECIAL][32];
    uint8_t special_text[BPE_MAX_SPECIAL]; /* an added token that is text (tokenizer.json's "special": false,
                                            * GLM-Z1's <think>): decoding keeps it, as HF's skip_special_tokens */
    uint8_t special_first[256]; /* some special starts with this byte */
    void *re;                /* the compiled pre-tokenisation pattern (pcre2_code *) */
    int jit;                 /* the pattern is JIT-compiled (else PCRE2's interpreter runs) */
} bpe_bytes;

/* ---- the rank file (bpe_ranks.c) ---- */
/* Whether buf starts like a rank file ("<base64> <integer>" up to the first newline) rather than
 * a SentencePiece protobuf (whose first byte is 0x0a, a newline). */
int bpe_looks_like_ranks(const char *buf, size_t len);
/* Parses "<base64 of the token bytes> <rank>" lines; ranks must be 0..n-1, each once, tokens
 * distinct, all 256 single bytes present. `what` (the path) and the line number name errors. */
int bpe_ranks_parse(bpe_bytes *b, const char *buf, size_t len, const char *what, glm_err *err);
/* The rank of bytes s[0..len), -1 when they are not a token. */
int32_t bpe_rank(const bpe_bytes *b, const uint8_t *s, size_t len);

/* ---- encode / decode (bpe_bytes.c) ---- */
/* Compiles the pre-tokenisation pattern (UTF + Unicode properties, JIT when available). */
int bpe_set_pattern(bpe_bytes *b, const char *pattern, glm_err *err);
/* Adds a special token (id n + n_special). */
int bpe_add_special(bpe_bytes *b, const char *text, glm_err *err);
/* Encodes text[0..len) (which must be valid UTF-8) and appends the ids to out. With
 * allow_special, literal special-token text becomes its id (tiktoken's allowed_special="all");
 * without, it is plain text. sc provides working memory (one per thread). */
int bpe_encode(const bpe_bytes *b, const char *text, size_t len, int allow_special, spm_scratch *sc, glm_ids *out,
               glm_err *err);
/* Appends the bytes of ids to out, skipping ids out of range and, with skip_special, specials
 * (otherwise their text). utf8_replace: malformed UTF-8 becomes U+FFFD the way Python's
 * bytes.decode("utf-8", "replace") does it (one per maximal invalid subsequence). */
void bpe_decode(const bpe_bytes *b, const int32_t *ids, int n, int skip_special, int utf8_replace, spm_buf *out);
/* The bytes of one id (a special's text), NULL when out of range; *len gets the length. */
const char *bpe_token(const bpe_bytes *b, int32_t id, size_t *len);
/* Length of the valid UTF-8 character at s (1..4), or minus the length of the maximal invalid
 * subsequence there (-1..-3) when it is malformed. n > 0. */
int bpe_utf8_char(const uint8_t *s, size_t n);
void bpe_free(bpe_bytes *b);

/* ---- GLM-4's tokenizer on top (glm4.c); chatglm.c routes GLM_TOK_GLM4 here ---- */
/* Parses the rank file buf[0..len) (named `what`) into t->bpe and sets kind, specials and eos. */
int glm4_setup(glm_tokenizer *t, const char *buf, size_t len, const char *what, glm_err *err);
/* The same from transformers' tokenizer.json of GLM-4 (glm4_json.c): read back into the ranks. */
int glm4_setup_json(glm_tokenizer *t, const char *buf, size_t len, const char *what, glm_err *err);
int glm4_stop_ids(const glm_tokenizer *t, int32_t *ids);
int glm4_encode_sc(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc, glm_ids *out,
                   glm_err *err);
int glm4_encode_pieces(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_pieces *out,
                       glm_err *err);
char *glm4_decode(const glm_tokenizer *t, const int32_t *ids, int n, int flags, size_t *len);
const char *glm4_piece(const glm_tokenizer *t, int32_t id);
int32_t glm4_piece_id(const glm_tokenizer *t, const char *piece);

#endif
