/* The ChatGLM tokenizer: a SentencePiece model (unigram or BPE) read from its .model file,
 * plus ChatGLM-6B's pre/post-processing (<n>, <|tab|>, <|blank_N|>) and special tokens.
 * This header is the contract the data pipeline, chat and CLI use. */
#ifndef GLM_TOKENIZER_H
#define GLM_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef struct glm_tokenizer glm_tokenizer;

/* Special token ids, resolved from the model's pieces ("[MASK]", "[gMASK]", "<sop>", "<eop>",
 * "<pad>", "<unk>") and tokenizer_config.json when present; -1 when the model lacks one. */
typedef struct glm_special_ids {
    int32_t mask, gmask, sop, eop, pad, unk;
} glm_special_ids;

/* path: a folder holding ice_text.model or tokenizer.model (and optionally
 * tokenizer_config.json), or GLM-4's tokenizer.json (transformers' GLM layout), or such a file
 * itself. */
int glm_tokenizer_load(glm_tokenizer **out, const char *path, glm_err *err);
void glm_tokenizer_free(glm_tokenizer *t);

int glm_tokenizer_vocab_size(const glm_tokenizer *t);    /* number of pieces */
int glm_tokenizer_spm_size(const glm_tokenizer *t);      /* pieces of the SentencePiece model alone (GLM_TOK_SPM_ONLY ids) */
glm_special_ids glm_tokenizer_specials(const glm_tokenizer *t);
const char *glm_tokenizer_piece(const glm_tokenizer *t, int32_t id); /* NULL when out of range */
int32_t glm_tokenizer_piece_id(const glm_tokenizer *t, const char *piece); /* -1 when absent */
/* The bytes one token stands for in text (caller frees; *len the length, which may hold bytes
 * that are not UTF-8 on their own): a piece with its U+2581 as a space (and ChatGLM-6B's <n>,
 * <|tab|>, <|blank_N|> as their text), a byte piece's byte, a BPE rank's bytes, a special or
 * control piece's name ([gMASK], <sop>); nothing for ids out of range. The dummy-prefix space
 * decoding drops from a text's first piece is kept. */
char *glm_tokenizer_token_bytes(const glm_tokenizer *t, int32_t id, size_t *len);

/* ChatGLM encode of `text` (len bytes) WITHOUT special tokens (add_special_tokens=False):
 * pre-processing, SentencePiece encode, ids appended to out. Thread-safe (t is read-only). */
int glm_tokenizer_encode(const glm_tokenizer *t, const char *text, size_t len, glm_ids *out, glm_err *err);
/* Decode ids to text (caller frees): drops pad and control pieces, joins byte pieces, "▁" to
 * space, removes the dummy-prefix space, then <n>/<|tab|>/<|blank_N|> back to text. */
char *glm_tokenizer_decode(const glm_tokenizer *t, const int32_t *ids, int n);

/* ChatGLM's model.chat response post-processing (spec 7.1): strip, "[[训练时间]]" -> "2023年",
 * ASCII , ! : ; ? next to a CJK character become full-width. Caller frees. */
char *glm_chat_postprocess(const char *response);

/* ---- Additions (issue 3) ---- */

/* What kind of tokenizer was loaded, which decides pre/post-processing and special tokens. */
typedef enum glm_tok_kind {
    GLM_TOK_SPM = 0,      /* a plain SentencePiece model: no ChatGLM layer, no special tokens */
    GLM_TOK_CHATGLM1 = 1, /* ChatGLM-6B ice_text.model: <n>/<|tab|>/<|blank_N|>, suffix [gMASK] <sop> */
    GLM_TOK_CHATGLM2 = 2, /* ChatGLM2/3 tokenizer.model: plain SentencePiece, specials appended after
                             the pieces ([MASK] [gMASK] [sMASK] sop eop (<|system|> ...)), prefix [gMASK] sop */
    GLM_TOK_GLM4 = 3      /* GLM-4 tokenizer.model: a tiktoken rank file ("<base64> <rank>" lines), byte-level
                             BPE; 14 specials after the ranks (<|endoftext|> [MASK] [gMASK] [sMASK] <sop> <eop>
                             <|system|> ...), prefix [gMASK] <sop>, pad and eos <|endoftext|>, no unk */
} glm_tok_kind;
glm_tok_kind glm_tokenizer_kind(const glm_tokenizer *t);

/* The id that closes a (prompt, answer) pair: <eop> for ChatGLM-6B, </s> for ChatGLM2/3; for a
 * plain SentencePiece model trainer_spec's eos_id when that is a control piece, else -1. (Plain
 * models also take glm_special_ids.pad from trainer_spec's pad_id.) */
int32_t glm_tokenizer_eos(const glm_tokenizer *t);

/* encode flags */
#define GLM_TOK_SPM_ONLY    1 /* SentencePiece only: no ChatGLM pre-processing, no id offset */
#define GLM_TOK_ADD_SPECIAL 2 /* apply build_inputs_with_special_tokens (single sequence) */

/* Literal special-token text ("<|user|>", "[gMASK]"...) becomes the special's id; without it that
 * text is plain text. GLM-4: ChatGLM4Tokenizer(encode_special_tokens=True), tiktoken's
 * allowed_special="all". Kinds that cannot do it refuse the flag with an error. */
#define GLM_TOK_ENCODE_SPECIAL 4

/* glm_tokenizer_encode with flags. flags = 0 is exactly glm_tokenizer_encode. */
int glm_tokenizer_encode_ex(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_ids *out,
                            glm_err *err);
/* Pieces of one encoding: piece i is data[off[i] .. off[i] + len[i]) (also NUL-terminated; a
 * piece can itself contain a NUL byte when the text did). */
typedef struct glm_pieces { char *data; size_t *off, *len; int n; } glm_pieces;
/* Like encode_ex but gives the pieces as SentencePiece's EncodeAsPieces reports them (a merged
 * run of unknown characters keeps its text). Fills *out (free with glm_pieces_free). */
int glm_tokenizer_encode_pieces(const glm_tokenizer *t, const char *text, size_t len, int flags, glm_pieces *out,
                                glm_err *err);
void glm_pieces_free(glm_pieces *p);

/* ChatGLM's build_inputs_with_special_tokens, appended to out. ChatGLM-6B: a + [gMASK, <sop>],
 * with b: a + [gMASK, <sop>] + b + [<eop>]. ChatGLM2/3: [gMASK, sop] + a (+ b + [</s>]).
 * A plain SentencePiece model: a (+ b). b may be NULL (nb ignored). */
void glm_tokenizer_build_inputs(const glm_tokenizer *t, const int32_t *a, int na, const int32_t *b, int nb,
                                glm_ids *out);

/* Decode with flags: GLM_TOK_SPM_ONLY gives SentencePiece's DecodeIds alone (no pad removal, no
 * <n>/<|tab|>/<|blank_N|> post-processing). Ids out of range are skipped. *len (optional) gets
 * the byte length (the text may contain NUL bytes). Caller frees. */
char *glm_tokenizer_decode_ex(const glm_tokenizer *t, const int32_t *ids, int n, int flags, size_t *len);

/* Encodes n texts (texts[i] of lens[i] bytes; lens NULL: NUL-terminated) with up to n_threads
 * threads (<= 0: all cores); ids (flags = 0 semantics, no special tokens) are appended to outs[i],
 * which the caller zero-initialises. On error returns -1 with the first failing index in err. */
int glm_tokenizer_encode_batch(const glm_tokenizer *t, const char **texts, const size_t *lens, int n, glm_ids *outs,
                               int n_threads, glm_err *err);
/* Same with flags (GLM_TOK_SPM_ONLY, GLM_TOK_ADD_SPECIAL). */
int glm_tokenizer_encode_batch_ex(const glm_tokenizer *t, const char **texts, const size_t *lens, int n, int flags,
                                  glm_ids *outs, int n_threads, glm_err *err);

/* ---- Additions (issue 18: GLM-4) ----
 * For GLM_TOK_GLM4: vocab_size counts ranks + specials, spm_size the ranks; a piece is a token's
 * bytes (NUL-terminated; a special's text); encode needs valid UTF-8 (else an error naming the
 * byte); decode drops specials and turns broken UTF-8 into U+FFFD, and with GLM_TOK_SPM_ONLY gives
 * the ranks' raw bytes; build_inputs is ChatGLM2/3's with <|endoftext|> closing a pair. */

/* The ids chat generation stops on, written to ids[0..return): eos, and for tokenizers with role
 * tokens (ChatGLM3, GLM-4) also <|user|> and <|observation|>. A kind without eos gives 0. */
int glm_tokenizer_stop_ids(const glm_tokenizer *t, int32_t ids[4]);

/* ---- Additions (issue 18: ChatGLM2/3) ----
 * GLM_TOK_CHATGLM2 is both: ChatGLM2's tokenizer appends 5 specials after the pieces (vocab 64794),
 * ChatGLM3's 9, ending in its role tokens (64798); chatglm.c says how the two are told apart.
 * Encoding (flags 0) is Hugging Face's tokenizer.encode: SentencePiece's pieces, a piece spelled
 * like a special ("sop", "eop") becoming that special's id as convert_token_to_id maps it;
 * GLM_TOK_SPM_ONLY is SPTokenizer.encode, SentencePiece's ids as they are (ChatGLM3's
 * build_single_message). ChatGLM3 also takes GLM_TOK_ENCODE_SPECIAL (encode_special_tokens=True,
 * which tokenizer_config.json can set for every encode): the 9 specials' names in the text become
 * their ids; ChatGLM2 refuses it. Decoding drops pad/unk, bos and eos; ChatGLM2's specials vanish,
 * ChatGLM3's are written as their names ("<|user|>"), as its _convert_id_to_token does. */
typedef struct glm_role_ids { int32_t system, user, assistant, observation; } glm_role_ids;
/* The role tokens' ids (ChatGLM3, GLM-4); -1 each where the tokenizer has none (ChatGLM2). */
glm_role_ids glm_tokenizer_roles(const glm_tokenizer *t);

#endif
