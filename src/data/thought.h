/* A reasoning model's thought in its answers (GLM-Z1; LLaMA-Factory's ReasoningTemplate, its
 * `glmz1` template): "<think>" ... "</think>" before the answer. Training keeps the thoughts the
 * data has and gives an answer without one the empty thought; with thinking off every thought is
 * removed and the empty thought goes into the prompt instead; a conversation's earlier answers
 * are sent back without their thoughts. */
#ifndef GLM_DATA_THOUGHT_H
#define GLM_DATA_THOUGHT_H

#define GLM_THOUGHT_OPEN "<think>"
#define GLM_THOUGHT_CLOSE "</think>"
/* The empty thought (LLaMA-Factory's get_thought_word_ids: open "\n\n" close "\n\n"). */
#define GLM_THOUGHT_EMPTY "<think>\n\n</think>\n\n"

/* 1 when s holds either tag (an answer that already carries its thought, whole or cut). */
int glm_thought_has_words(const char *s);
/* s without its thoughts (caller frees): every "<think>" ... up to the next "</think>" removed,
 * as re.sub("<think>(.*?)</think>", "", s, flags=DOTALL), then the line ends at the front. */
char *glm_thought_remove(const char *s);

#endif
