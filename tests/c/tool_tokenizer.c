/* `glmtrain tokenize` as a standalone binary (build/tests/tool_tokenizer) so the Python tests and
 * bench/bench_tokenizer.sh can drive the tokenizer even while the main CLI is being reworked. */
#include "cli/cmd_tokenize.h"

int main(int argc, char **argv) { return glm_cmd_tokenize(argc - 1, argv + 1); }
