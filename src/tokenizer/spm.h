/* Internal SentencePiece engine behind tokenizer.h: a ModelProto reader, the precompiled-charsmap
 * normaliser, unigram / BPE / word / char encoders and the decoder. Everything here follows
 * SentencePiece 0.1.97 (the Debian python3-sentencepiece the tests compare against) so that ids
 * are identical, including its float rounding and tie-breaking. Not a public header: only files in
 * src/tokenizer include it. */
#ifndef GLM_TOKENIZER_SPM_H
#define GLM_TOKENIZER_SPM_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include "core/err.h"

enum { SPM_NORMAL = 1, SPM_UNKNOWN = 2, SPM_CONTROL = 3, SPM_USER_DEFINED = 4, SPM_UNUSED = 5, SPM_BYTE = 6 };
enum { SPM_UNIGRAM = 1, SPM_BPE = 2, SPM_WORD = 3, SPM_CHAR = 4 };

/* Texts longer than this are refused: lattice positions are int32 and normalisation can grow a
 * text threefold. */
#define SPM_MAX_TEXT ((size_t)1 << 28)

/* ---- ModelProto (spm_model.c) ---- */
typedef struct spm_normspec {
    int present;
    char name[64];
    const uint8_t *charsmap; /* points into spm_proto.buf; NULL when absent */
    size_t charsmap_len;
    int add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
} spm_normspec;

typedef struct spm_proto {
    uint8_t *buf;            /* the file's bytes (owned): the charsmaps point into it */
    size_t buf_len;
    int n;                   /* pieces */
    char **piece;            /* NUL-terminated copies in `arena` */
    int32_t *piece_len;
    float *score;
    uint8_t *type;
    char *arena;
    int model_type, vocab_size, byte_fallback, treat_ws_as_suffix;
    int32_t unk_id, bos_id, eos_id, pad_id; /* trainer_spec's (defaults 0, 1, 2, -1); informational */
    char unk_surface[64];    /* trainer_spec.unk_surface or its default " \u2047 " */
    spm_normspec norm, denorm;
} spm_proto;

/* Parses a serialized ModelProto (takes ownership of buf, which must be malloc'd). `what` names the
 * file in messages. Checks what SentencePiece checks when loading (non-empty unique pieces, one
 * <unk>, 256 byte pieces iff byte_fallback). */
int spm_proto_parse(spm_proto *p, uint8_t *buf, size_t len, const char *what, glm_err *err);
void spm_proto_free(spm_proto *p);

/* ---- tries and maps (trie.c) ---- */
/* A double-array trie (base/check) built from byte-string keys; val = -1 on non-final nodes. */
typedef struct spm_da_unit { int32_t base, check, val; } spm_da_unit;
typedef struct spm_da { spm_da_unit *u; int32_t n; } spm_da;
int spm_da_build(spm_da *da, int nkeys, char *const *keys, const int32_t *lens, const int32_t *vals, glm_err *err);
void spm_da_free(spm_da *da);
static inline int32_t spm_da_next(const spm_da *da, int32_t s, uint8_t c) {
    int32_t t = da->u[s].base + c;
    return ((uint32_t)t < (uint32_t)da->n && da->u[t].check == s) ? t : -1;
}
/* Length of the longest key that prefixes s[0..len), 0 if none; its value in *val. */
size_t spm_da_longest(const spm_da *da, const char *s, size_t len, int32_t *val);

/* SentencePiece's precompiled charsmap: a darts-clone double array over UTF-8 prefixes whose
 * values index NUL-terminated replacement strings. */
typedef struct spm_charsmap {
    uint32_t *units;         /* owned, host byte order */
    size_t n;
    const char *strs;        /* the replacement blob (points into the proto buffer) */
    size_t strs_len;
} spm_charsmap;
int spm_charsmap_init(spm_charsmap *cm, const uint8_t *blob, size_t len, const char *what, glm_err *err);
void spm_charsmap_free(spm_charsmap *cm);
/* Longest rule matching a prefix of s: returns its length (0: none) and the replacement. */
size_t spm_charsmap_match(const spm_charsmap *cm, const char *s, size_t len, const char **repl, size_t *repl_len);

/* Open-addressing map from piece string to id. */
typedef struct spm_map { int32_t *slots; uint32_t mask; } spm_map;
void spm_map_init(spm_map *m, int capacity_hint);
void spm_map_free(spm_map *m);
/* Returns the existing id when the piece is already there (nothing inserted), else -1. */
int32_t spm_map_put(spm_map *m, const spm_proto *p, int32_t id);
int32_t spm_map_get(const spm_map *m, const spm_proto *p, const char *s, size_t len);

/* ---- growable buffers and per-thread scratch ---- */
typedef struct spm_buf { char *s; size_t n, cap; } spm_buf;
void spm_buf_reserve(spm_buf *b, size_t extra);
static inline void spm_buf_put(spm_buf *b, const char *s, size_t n) {
    if (b->n + n > b->cap) spm_buf_reserve(b, n);
    for (size_t i = 0; i < n; i++) b->s[b->n + i] = s[i];
    b->n += n;
}

/* One output token: id and its span in the normalised text (for unknown pieces the span is the
 * piece's surface, as SentencePiece reports it). */
typedef struct spm_tok { int32_t id; uint32_t off, len; } spm_tok;

typedef struct spm_scratch {
    spm_buf norm;            /* normalised text */
    spm_buf pre;             /* ChatGLM pre-processed text */
    spm_tok *tok; int ntok, cap_tok;
    void *work; size_t work_cap; /* encoder working memory (lattice, BPE symbols) */
    void *work2; size_t work2_cap;
} spm_scratch;
void spm_scratch_free(spm_scratch *sc);
void *spm_scratch_work(void **p, size_t *cap, size_t bytes);
void spm_tok_push(spm_scratch *sc, int32_t id, uint32_t off, uint32_t len);

/* ---- the loaded model (spm.c) ---- */
typedef struct spm_normalizer {
    const spm_normspec *spec;
    spm_charsmap cm;         /* n == 0: identity */
    int treat_ws_as_suffix;
    const spm_da *user;      /* user-defined symbols pass through unnormalised; NULL: none */
    const uint8_t *user_first; /* user_first[b]: some user symbol starts with byte b */
} spm_normalizer;

typedef struct spm_model {
    spm_proto p;
    spm_map normal, reserved;    /* NORMAL/USER_DEFINED/UNUSED pieces; the others */
    spm_da trie;                 /* unigram: usable pieces for the Viterbi */
    double *vscore;              /* unigram: score each piece contributes to a path */
    spm_da user;                 /* user-defined symbols */
    int has_user;
    uint8_t user_first[256];
    int32_t unk_id;
    int32_t byte_id[256];        /* -1 without byte_fallback */
    float min_score, max_score;
    spm_normalizer norm, denorm;
    int has_denorm;
} spm_model;

int spm_model_load(spm_model *m, uint8_t *buf, size_t len, const char *what, glm_err *err);
void spm_model_free(spm_model *m);
int32_t spm_piece_to_id(const spm_model *m, const char *s, size_t len); /* -1 when absent */

/* Normalises in[0..len) into out (appended after out->n = 0). */
void spm_normalize(const spm_normalizer *nz, const char *in, size_t len, spm_buf *out);
/* Full SentencePiece encode: normalise, run the model, merge unknowns / apply byte fallback.
 * Result in sc->tok[0..ntok) with spans into sc->norm. */
int spm_encode(const spm_model *m, const char *text, size_t len, spm_scratch *sc, glm_err *err);
/* Model step only (normalised text in sc->norm); appends raw pieces to sc->tok. */
void spm_unigram_encode(const spm_model *m, spm_scratch *sc);
void spm_bpe_encode(const spm_model *m, spm_scratch *sc);
/* Decodes ids (those out of range are skipped) into out (appended). */
void spm_decode(const spm_model *m, const int32_t *ids, int n, spm_buf *out);
/* DecodePieces where lit[i] (when lit and it are not NULL) stands for ids[i]: a piece the model
 * lacks, whose text SentencePiece copies as it is; it ends a run of byte pieces, and text from
 * it ends the stripping of the dummy-prefix space. */
void spm_decode_lit(const spm_model *m, const int32_t *ids, const char *const *lit, int n, spm_buf *out);

/* UTF-8 helpers with SentencePiece's exact rules. */
static inline int spm_one_char_len(uint8_t c) { return "\1\1\1\1\1\1\1\1\1\1\1\1\2\2\3\4"[c >> 4]; }
/* Length of the valid UTF-8 character at s (1..4), or 0 when it is malformed (then 1 byte is
 * consumed as U+FFFD). A literal U+FFFD counts as valid. */
int spm_utf8_valid_len(const uint8_t *s, size_t len);

/* ---- the public tokenizer object (chatglm.c; shared with batch.c) ---- */
#include "tokenizer/tokenizer.h"
#define GLM_TOK_MAX_EXTRA 9
struct bpe_bytes;
struct glm_tokenizer {
    spm_model sp;                /* unused (zero) for GLM_TOK_GLM4 */
    struct bpe_bytes *bpe;       /* GLM_TOK_GLM4's byte-level BPE (bpe_bytes.h); NULL for the others */
    glm_tok_kind kind;
    glm_special_ids ids;
    int32_t eos;                 /* closes a training pair */
    int32_t offset;              /* num_image_tokens (pre-slim ChatGLM-6B: 20000) */
    int remove_space;            /* tokenizer_config.json remove_space */
    int n_extra;                 /* ChatGLM2/3 specials appended after the pieces */
    char extra[GLM_TOK_MAX_EXTRA][16];
    int encode_special;          /* ChatGLM3 tokenizer_config.json encode_special_tokens */
};
/* Appends piece s[0..n) to o, its bytes and a NUL into b (o->off counts in b); cap is o's
 * capacity: the EncodeAsPieces output of the SentencePiece families (chatglm.c). */
void glm_pieces_add(glm_pieces *o, spm_buf *b, int *cap, const char *s, size_t n);
/* Encode with a caller-owned scratch (reused across texts by batch encoding and the CLI). */
int glm_tok_encode_sc(const glm_tokenizer *t, const char *text, size_t len, int flags, spm_scratch *sc,
                      glm_ids *out, glm_err *err);

/* ChatGLM-6B text transforms (glm_text.c). Pre: optional remove_space (" ".join(text.split())),
 * "\n" -> <n>, "\t" -> <|tab|>, runs of 2..80 spaces -> <|blank_N|> (longer runs: blank_80 first).
 * Post: the reverse replacements. Both write to out (out->n reset). */
void glm_tok_preprocess(const char *s, size_t n, int remove_space, spm_buf *out);
void glm_tok_postprocess(const char *s, size_t n, spm_buf *out);

#endif
