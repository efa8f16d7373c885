/* Each model's chat prompt and stop ids (chat.c), beside generate.h's ChatGLM-6B functions, which
 * take the tokenizer's model too (glm_chat_inputs, glm_response_text, the streamer):
 *
 *  ChatGLM-6B  (model.chat)   the query alone, or "[Round i]\n问：q\n答：r\n"... + "[Round n]\n问：query\n答："
 *              (rounds from 0); text ids + [gMASK] <sop>; stops at <eop>; the response stripped, its
 *              ASCII , ! : ; ? beside CJK made full-width, "[[训练时间]]" -> "2023年".
 *  ChatGLM2-6B (build_prompt) "[Round i+1]\n\n问：q\n\n答：r\n\n"... + "[Round n+1]\n\n问：query\n\n答："
 *              (rounds from 1, the first turn too); [gMASK] sop + text ids; stops at eos; the
 *              response stripped, "[[训练时间]]" -> "2023年".
 *  ChatGLM3-6B (build_chat_input) [gMASK] sop, then per turn <|role|> + sp("\n") + sp(text), sp =
 *              SentencePiece alone: the optional system turn, each round's <|user|> and
 *              <|assistant|> turns, the query's <|user|> turn, then <|assistant|>; stops at eos,
 *              <|user|> or <|observation|> (the stop token is not part of the response); the
 *              response as ChatGLM2's (the tool-call metadata line, if any, stays in the text).
 * A system prompt for ChatGLM-6B/2 goes before the prompt text as "system\n", as the training
 * examples have it. */
#ifndef GLM_INFER_CHAT_H
#define GLM_INFER_CHAT_H
#include "infer/generate.h"

/* The prompt text the tokenizer's model chats with (caller frees); NULL for ChatGLM3, whose
 * prompt is role tokens (glm_chat_inputs_sys builds its ids). hist: 2*n_hist strings q0, r0, ... */
char *glm_chat_prompt_for(const glm_tokenizer *tok, const char *query, const char *const *hist, int n_hist);
/* glm_chat_inputs with an optional system prompt (NULL: none); the system prompt is never dropped. */
int glm_chat_inputs_sys(const glm_tokenizer *tok, const glm_config *c, const char *system, const char *query,
                        const char *const *hist, int n_hist, int max_prompt, glm_ids *out, int *dropped,
                        char **prompt_text, glm_err *err);

/* A turn of a ChatGLM3 / GLM-4 conversation: its role, its metadata line (NULL: empty; a tool
 * call's is the tool's name) and its content. */
typedef enum { GLM_TURN_SYSTEM, GLM_TURN_USER, GLM_TURN_ASSISTANT, GLM_TURN_OBSERVATION } glm_turn_role;
typedef struct glm_chat_turn {
    glm_turn_role role;
    const char *metadata, *content;
} glm_chat_turn;
/* build_chat_input over the turns as given (the last one the query, whatever its role, e.g. a
 * tool's observation), then <|assistant|>: [gMASK] sop and each turn <|role|> + sp(metadata +
 * "\n") + sp(content) (GLM-4: encode(metadata + "\n" + content), no turn for an empty content,
 * as its chat template writes them). Only for tokenizers with role
 * tokens; a conversation without metadata gives glm_chat_inputs_sys's ids. */
int glm_chat_inputs_turns(const glm_tokenizer *tok, const glm_chat_turn *t, int n, glm_ids *out, glm_err *err);

/* Appends the first ids of an assistant turn whose metadata line is line ("NAME\n"), after its
 * <|assistant|>: ChatGLM3's sp(metadata + "\n"), GLM-4's encode(metadata + "\n"), which is where
 * its pre-tokenizer splits the turn's one text. A prompt ending so makes the response the rest
 * of a call of that tool. */
int glm_chat_assistant_metadata(const glm_tokenizer *tok, const char *line, glm_ids *out, glm_err *err);

/* Appends the ids of a reasoning model's empty thought (data/thought.h GLM_THOUGHT_EMPTY, added
 * tokens such as <think> split out as Hugging Face's encode does): the end of a GLM-Z1 prompt
 * with thinking off. */
int glm_chat_empty_thought(const glm_tokenizer *tok, glm_ids *out, glm_err *err);

/* Sets g->stop_ids / n_stop to the ids model.chat stops at (glm_tokenizer_stop_ids: eos, <eop>
 * for ChatGLM-6B, and with ChatGLM3's role tokens <|user|> and <|observation|>). */
void glm_gen_cfg_chat_stops(glm_gen_cfg *g, const glm_tokenizer *tok);
/* model.chat's defaults for the tokenizer's model: glm_gen_cfg_chat_defaults (ChatGLM-6B), or
 * ChatGLM2/3's max_length 8192, top_p 0.8, temperature 0.8. */
void glm_gen_cfg_chat_defaults_for(glm_gen_cfg *g, const glm_tokenizer *tok);

#endif
