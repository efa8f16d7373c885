/* A reasoning model's thought in its answers (GLM-Z1; LLaMA-Factory's ReasoningTemplate, its
 * `glmz1` template): "<think>" ... "</think>" before the answer. Training keeps the thoughts the
 * data has and gives an answer without one the empty thought; with thinking off every thought is
 * removed and the empty thought goes into the prompt instead; a conversation's earlier answers
 * are sent back without their thoughts. */
#ifndef GLM_DATA_THOUGHT_H
#define GLM_DATA_THOUGHT_H
#include <stddef.h>

#define GLM_THOUGHT_OPEN "<think>"
#define GLM_THOUGHT_CLOSE "</think>"
/* The empty thought (LLaMA-Factory's get_thought_word_ids: open "\n\n" close "\n\n"). */
#define GLM_THOUGHT_EMPTY "<think>\n\n</think>\n\n"

/* 1 when s holds either tag (an answer that already carries its thought, whole or cut). */
int glm_thought_has_words(const char *s);
/* s without its thoughts (caller frees): every "<think>" ... up to the next "</think>" removed,
 * as re.sub("<think>(.*?)</think>", "", s, flags=DOTALL), then the line ends at the front. */
char *glm_thought_remove(const char *s);

/* A reasoning model's response split into its thought and its answer (an API's reasoning_content
 * and content): a response whose first non-space text is "<think>" has the thought up to
 * "</think>" (to the end while it is missing) and the answer after it, its line ends at the
 * front dropped; any other response is all answer. While the response is still growing
 * (final 0) text that may be the start of a tag is held back, so each field only grows as text
 * comes: emitting what is new in each is a stream of both. Pointers into s. */
typedef struct glm_thought_parts {
    const char *thought, *answer; /* NULL when empty */
    size_t n_thought, n_answer;
} glm_thought_parts;
void glm_thought_split(const char *s, size_t n, int final, glm_thought_parts *out);

/* Whether the tokenizer folder's tokenizer_config.json has a chat template that writes thoughts
 * (GLM-Z1's), so a run without --template glmz1 can say so. 0 for a file or a folder without one. */
int glm_tokenizer_template_thinks(const char *tokenizer_path);

#endif
