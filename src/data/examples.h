/* Training examples from records, exactly as THUDM ChatGLM-6B ptuning/main.py
 * preprocess_function_train builds them (spec 5.5):
 *
 *   prompt = source_prefix + [system "\n"] + body, body =
 *              query                                              (no history column)
 *              Σ "[Round {i}]\n问：{q_i}\n答：{r_i}\n" + "[Round {n}]\n问：{query}\n答："  (history)
 *   a = encode(prompt)[: max_source_length - 1]      b = encode(answer)[: max_target_length - 2]
 *   ids = a + [gMASK, sop] + b + [eop]               labels = [-100] * len(a)+1 + ids[len(a)+1:]
 *
 * (query = instruction, plus "\n" + input when an alpaca input is non-empty.) The special tokens
 * are appended after truncation, so they always survive. A record whose query or answer is
 * empty is dropped (ptuning's `if prompt and answer`), counted as "empty". An answer that
 * encodes to no tokens at all (e.g. only spaces, which the normaliser removes) is dropped too,
 * counted as "answer encodes to nothing": such an example would only teach <eop>.
 *
 * Options beyond ptuning: a prompt_template replaces the body (placeholders below), the round
 * rule can follow model.chat (no wrapper for a first turn), train_on_prompt puts labels on the
 * prompt tokens too. Tokenization goes through glm_encoder so tests can use a fake one.
 *
 * That is the layout of ChatGLM-6B. The tokenizer picks the layout (glm_encoder.layout, set by
 * glm_encoder_from_tokenizer from its kind), so a ChatGLM2/3 tokenizer needs no flag:
 *
 * ChatGLM2-6B ptuning/main.py (spec 11): body = tokenizer.build_prompt(query, history), rounds
 *   from 1 even without history ("[Round {i}]

问：{q}

答：{r}

" per history round, then
 *   "[Round {n+1}]

问：{query}

答："), the same prefix/system/template rules as above;
 *   a = [gMASK, sop] + encode(prompt)[: max_source_length - 2]   (HF truncation counts the specials)
 *   b = encode(answer)[: max_target_length]
 *   ids = a + b + [eos]      labels = [-100] * len(a) + b + [eos], a label equal to pad -> -100
 *
 * ChatGLM3-6B finetune_demo (finetune_hf.py process_batch): the record's turns (conversation mode,
 *   reader.h; an alpaca/columns record becomes [system] + history pairs + (query, answer) as
 *   user/assistant turns, source_prefix before the first user turn);
 *   ids = [gMASK, sop] + Σ (<|role|> + sp("
") + sp(content)) + [eos], sp = SentencePiece's
 *   ids alone (build_single_message), cut to max_source_length + max_target_length + 1.
 *   Labels by glm_example_cfg.conv_labels:
 *     THUDM: each token of a turn whose role is not system/user (assistant, and observation too,
 *       as process_batch flags it) is marked, the marks shifted right by one: a turn's role token
 *       is -100, its "
" and content are targets, and so is the token after it (the next role
 *       token, or the final eos);
 *     EOS (LLaMA-Factory's efficient_eos): assistant turns only; their "
" and content are
 *       targets and the token after each assistant turn has the label eos (its id stays the next
 *       role token), so every assistant turn learns to end with eos.
 *   prompt_template / history_template do not apply (refused). An example left without any
 *   target (no assistant turn, or cut before one) is dropped as GLM_EX_NO_ANSWER_TOKENS. */
#ifndef GLM_DATA_EXAMPLES_H
#define GLM_DATA_EXAMPLES_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"
#include "data/reader.h"

/* Tokenizer seen by the data layer. encode appends the ids of text (no special tokens) to out
 * and must be thread-safe (examples are encoded in parallel). fingerprint identifies the
 * vocabulary (a hash of the tokenizer files) and goes into the cache key. */
typedef enum glm_layout {
    GLM_LAYOUT_GLM = 0,  /* ChatGLM-6B (and a plain SentencePiece model) */
    GLM_LAYOUT_GLM2 = 1, /* ChatGLM2-6B */
    GLM_LAYOUT_GLM3 = 2, /* ChatGLM3-6B */
    GLM_LAYOUT_GLM4 = 3, /* GLM-4-9B-chat: ChatGLM3's turns, each <|role|> + encode("\n" + content) as its
                          * chat template tokenizes them, closed by <|user|> as its finetune.py does */
} glm_layout;

typedef struct glm_encoder {
    int (*encode)(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err);
    void *ctx;
    int32_t gmask, sop, eop, pad, mask;
    uint64_t fingerprint;
    /* ChatGLM2/3 (a zeroed tail is ChatGLM-6B's layout) */
    glm_layout layout;
    int32_t eos;       /* closes GLM2/GLM3 examples; the EOS label convention's target */
    int32_t role[4];   /* GLM3: <|system|> <|user|> <|assistant|> <|observation|> (glm_role order) */
    /* GLM3: SentencePiece's ids alone (SPTokenizer.encode, as build_single_message). */
    int (*encode_sp)(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err);
    /* GLM-4: the text with the special and added tokens' names as their ids, as Hugging Face's
     * encode splits them out (LLaMA-Factory's templates encode so; the glmz1 examples use it, where
     * <think> may be an added token); NULL: encode. */
    int (*encode_special)(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err);
    /* The tokenizer's own eos_token (GLM-4's <|endoftext|>, ChatGLM2/3's </s>), which ends a text of
     * --stage pt (LLaMA-Factory appends tokenizer.eos_token); -1: none. */
    int32_t text_eos;
} glm_encoder;

/* Adapter for the real tokenizer (data/encoder_tok.c). tokenizer_path (the folder or .model
 * file given to glm_tokenizer_load) is hashed into the fingerprint; NULL leaves it 0. */
struct glm_tokenizer;
/* The layout a tokenizer's model trains with (GLM3 when it has ChatGLM3's role tokens). */
glm_layout glm_layout_of(const struct glm_tokenizer *t);
const char *glm_layout_name(glm_layout l); /* "ChatGLM-6B", "ChatGLM2-6B", "ChatGLM3-6B", "GLM-4" */
/* Whether a layout's examples are role-token turns (ChatGLM3, GLM-4), not prompt text. */
static inline int glm_layout_turns(glm_layout l) { return l == GLM_LAYOUT_GLM3 || l == GLM_LAYOUT_GLM4; }
int glm_encoder_from_tokenizer(glm_encoder *e, const struct glm_tokenizer *t, const char *tokenizer_path,
                               glm_err *err);
/* Hash of the tokenizer files at path (a .model file, or a folder's ice_text.model /
 * tokenizer.model and tokenizer_config.json). */
int glm_tokenizer_fingerprint(const char *path, uint64_t *out, glm_err *err);

typedef enum {
    GLM_ROUNDS_COLUMN = 0, /* ptuning train: wrap in rounds whenever the record has a history column */
    GLM_ROUNDS_NONEMPTY,   /* model.chat / ptuning eval: wrap only when the history is non-empty */
} glm_rounds_rule;

/* ChatGLM3's label conventions (--conversation_labels thudm|eos). */
typedef enum { GLM_LABELS_THUDM = 0, GLM_LABELS_EOS = 1 } glm_conv_labels;
int glm_conv_labels_parse(const char *s, glm_conv_labels *out); /* "thudm", "eos"; -1 for anything else */

typedef struct glm_example_cfg {
    int max_source_length;        /* default 1024 (ptuning arguments.py) */
    int max_target_length;        /* default 128 */
    const char *source_prefix;    /* prepended to every prompt; NULL = "" */
    const char *default_system;   /* the system prompt of a record without one (LLaMA-Factory's); NULL = none */
    int cutoff_len;               /* > 0: LLaMA-Factory's --cutoff_len instead of the two lengths: the example
                                   * holds at most this many tokens, the prompt and the answer of each turn cut
                                   * in proportion (glm_infer_seqlen) */
    int mask_history;             /* with cutoff_len, ChatGLM3/GLM-4: the last answer alone trains, and the cut
                                   * keeps the last turns first (LLaMA-Factory's mask_history) */
    /* NULL = the ptuning body. Otherwise the body, with placeholders:
     *   {instruction} the query (instruction + "\n" + input) — or the bare instruction when the
     *                 template also uses {input};  {query} the same as {instruction}
     *   {input} alpaca input ("" if none)   {system} system prompt ("" if none; when the
     *   template does not use it, "system\n" is prepended as without a template)
     *   {history} every history round rendered with history_template
     *   {round} n = number of history rounds   {round1} n + 1
     *   {{ and }} literal braces.
     * E.g. ChatGLM2: prompt_template "{history}[Round {round1}]\n\n问：{instruction}\n\n答：",
     *                history_template "[Round {i1}]\n\n问：{q}\n\n答：{r}\n\n". */
    const char *prompt_template;
    /* One history round: {i} index from 0, {i1} index from 1, {q}, {r}.
     * NULL = "[Round {i}]\n问：{q}\n答：{r}\n" (ChatGLM-6B; also used without a prompt_template). */
    const char *history_template;
    glm_rounds_rule rounds;       /* used without a prompt_template */
    int train_on_prompt;          /* labels on every token (the prompt too) */
    glm_conv_labels conv_labels;  /* GLM3: which turns' tokens are targets (see above) */
    /* GLM-4 layout, --template glmz1 (GLM-Z1; LLaMA-Factory's ReasoningTemplate, data/thought.h):
     * an assistant turn whose content has neither <think> nor </think> gets encode(GLM_THOUGHT_EMPTY)
     * after its <|assistant|>, a target as the rest of the turn. With disable_thinking
     * (--enable_thinking false) every assistant turn's thoughts are removed first and the empty
     * thought is prompt (no label; under --cutoff_len part of the turn's source). */
    int reasoning, disable_thinking;
    /* > 0: under cutoff_len the answer counts as at least this many tokens in the cut (a preference
     * pair's longer answer: LLaMA-Factory cuts both examples of a pair alike). Set by the pair's build. */
    int pair_answer_tokens;
    /* --stage pt (LLaMA-Factory's pre-training): > 0, records are texts, each encode(text) + text_eos,
     * every token a target, and the texts of each group of pt_group records are joined and cut into
     * examples of exactly pt_block tokens, the group's remainder dropped (its preprocess_pretrain_dataset
     * with packing, over datasets.map batches of preprocessing_batch_size records). */
    int pt_block, pt_group;
    /* --stage kto (LLaMA-Factory's feedback processor): a record with a KL answer (glm_record.rejected,
     * the previous record's answer in its group of pt_group records) builds as a pair would, but each
     * of its two examples is cut by its own answer's length */
    int kto;
} glm_example_cfg;

void glm_example_cfg_init(glm_example_cfg *c);
/* Checks lengths (max_source_length >= 2, max_target_length >= 3) and template placeholders. */
int glm_example_cfg_check(const glm_example_cfg *c, glm_err *err);

/* Why a record did not become an example. */
typedef enum { GLM_EX_OK = 0, GLM_EX_EMPTY, GLM_EX_NO_ANSWER_TOKENS } glm_ex_status;

typedef struct glm_example_info {
    glm_ex_status status;
    int truncated_prompt, truncated_answer; /* 1 when a / b were cut */
    int prompt_tokens, answer_tokens;       /* before truncation */
    int pair_split; /* a preference pair (glm_record.rejected): where its rejected example starts */
} glm_example_info;

/* The prompt text for a record (caller frees), ChatGLM-6B's rules. */
char *glm_example_prompt(const glm_example_cfg *c, const glm_record *r);
/* The same for a layout: GLM2's rounds; NULL for GLM3, whose prompt is role tokens, not text. */
char *glm_example_prompt_as(const glm_example_cfg *c, glm_layout layout, const glm_record *r);
/* Checks the settings against the layout (GLM3 refuses the text templates). */
int glm_example_cfg_check_layout(const glm_example_cfg *c, glm_layout layout, glm_err *err);
/* Builds ids and labels (cleared first) for one record in the encoder's layout. Returns 0 (see
 * info->status: only GLM_EX_OK filled ids/labels) or -1 when the encoder fails. */
/* LLaMA-Factory's infer_seqlen: how much of a source of source_len tokens and a target of
 * target_len to keep within cutoff tokens (the source gives way while the target is under half,
 * the target while the source is, else both in proportion). */
void glm_infer_seqlen(long source_len, long target_len, long cutoff, long *new_source, long *new_target);
/* A preference pair (r->rejected set) builds two examples, one after the other: the chosen
 * answer's, then the rejected one's (the same record with that answer; in conversation mode as its
 * last turn's content), each by the rules above with the labels of its last answer only (LLaMA-
 * Factory's pairwise examples put every earlier turn in the prompt); info->pair_split is the
 * rejected example's first index. If either is dropped, so is the pair. Under cutoff_len both are cut
 * as LLaMA-Factory's pairwise processor cuts them: infer_seqlen(prompt, the longer answer) — the
 * role-token layouts' prompt being every token before the last answer (kept from its start), the
 * text layouts' the prompt text as for SFT. */
int glm_example_build(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r,
                      glm_ids *ids, glm_ids *labels, glm_example_info *info, glm_err *err);
/* The evaluation prompts of a ChatGLM3 / GLM-4 conversation record, as ChatGLM3's finetune_hf.py
 * and GLM-4's finetune.py process_batch_eval make them: one for every assistant turn (with
 * content), its input the ids of the turns before it ([gMASK] <sop> included, built as the
 * training examples build them) cut to their first max_source_length, then <|assistant|>; its
 * label the turn's text (GLM-4: metadata + "\n" + content when it has metadata). No prompt is
 * made once the turns before a turn reach max_source_length tokens (the scripts stop reading the
 * conversation there). An instruction record gives its one (query, answer) pair the same way. */
typedef struct glm_eval_turn {
    glm_ids in;
    char *label;
    int turn;    /* the assistant turn's index in the record's list (-1: an instruction record's answer) */
} glm_eval_turn;
int glm_example_eval_turns(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r, glm_eval_turn **out,
                           int *n, glm_err *err);
void glm_eval_turns_free(glm_eval_turn *t, int n);
/* GLM3's build (examples_glm3.c), called by glm_example_build. */
int glm_example_build_glm3(const glm_example_cfg *c, const glm_encoder *enc, const glm_record *r,
                           glm_ids *ids, glm_ids *labels, glm_example_info *info, glm_err *err);

/* Turns the escapes \n \t \\ of a command-line template into characters, in place. */
void glm_unescape(char *s);

#endif
