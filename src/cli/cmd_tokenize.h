/* `glmtrain tokenize`: ids, pieces or decoded text through the ChatGLM tokenizer, one input line
 * per output line (--text: the whole text is one input). Also the engine of tests/c/tool_tokenizer
 * and bench/bench_tokenizer.sh. */
#ifndef GLM_CMD_TOKENIZE_H
#define GLM_CMD_TOKENIZE_H
int glm_cmd_tokenize(int argc, char **argv);
#endif
