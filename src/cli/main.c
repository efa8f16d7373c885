/* glmtrain: fine-tune ChatGLM-family models on a CPU or GPUs. Dispatches to subcommands. */
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "glm_version.h" /* written by the Makefile: the commit and the CUDA code built */

static void usage(void) {
    printf("glmtrain — fine-tune ChatGLM-6B, ChatGLM2/3-6B and GLM-4 models\n\n"
           "usage: glmtrain <command> [flags]   (glmtrain <command> --help lists the flags)\n\n"
           "  train      fine-tune a model on instruction data (Hugging Face TrainingArguments flag names)\n"
           "  generate   one response to --prompt, or answers to a data file (--input_file) with BLEU/ROUGE\n"
           "  chat       talk to a model in the terminal (history, streaming)\n"
           "  eval       MMLU, C-Eval or CMMLU accuracy, as LLaMA-Factory's eval (--task mmlu_test --task_dir evaluation)\n"
           "  serve      an OpenAI-compatible HTTP API and a web chat page (continuous batching, LoRA adapters)\n"
           "  tokenize   ids, pieces or text through the ChatGLM tokenizer\n"
           "  info       model size and the memory plan for a training setup\n"
           "  convert    a checkpoint (.bin or safetensors) to a Hugging Face safetensors folder (fp16/bf16/fp32)\n"
           "  expand     LLaMA Pro: blocks added that pass their input through (ChatGLM2/3, GLM-4), to train alone\n"
           "  merge      a base model and a LoRA adapter into one Hugging Face folder\n"
           "  quantize   a model's linear weights as INT8/INT4 (THUDM's chatglm-6b-int8/int4 layout)\n"
           "  env        check CUDA, cuBLAS, NCCL, every GPU and the links between them\n"
           "  version    the commit this binary was built from and what it holds\n");
}

/* What a bug report needs: the commit, and whether this build has CUDA (for which GPUs), MPI for
 * CPU ranks and NCCL; `glmtrain env` checks the machine itself. */
static int version(void) {
    printf("glmtrain %s\n", GLM_VERSION_COMMIT);
#ifdef GLM_HAVE_CUDA
    printf("CUDA: yes (machine code %s, attention on wgmma for sm_90a; NCCL for GPU ranks)\n", GLM_VERSION_CUDA_ARCHS);
#else
    printf("CUDA: no (built without nvcc: CPU only)\n");
#endif
#ifdef GLM_HAVE_MPI
    printf("MPI: yes (data parallel on CPU ranks)\n");
#else
    printf("MPI: no (CPU ranks need a build with mpicc)\n");
#endif
    printf("compiler: %s\n", __VERSION__);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version") || !strcmp(cmd, "-V")) return version();
    int n = argc - 2;
    char **rest = argv + 2;
    if (!strcmp(cmd, "train")) return glm_cmd_train(n, rest);
    if (!strcmp(cmd, "generate")) return glm_cmd_generate(n, rest);
    if (!strcmp(cmd, "chat")) return glm_cmd_chat(n, rest);
    if (!strcmp(cmd, "eval")) return glm_cmd_eval(n, rest);
    if (!strcmp(cmd, "serve")) return glm_cmd_serve(n, rest);
    if (!strcmp(cmd, "tokenize")) return glm_cmd_tokenize(n, rest);
    if (!strcmp(cmd, "info")) return glm_cmd_info(n, rest);
    if (!strcmp(cmd, "merge")) return glm_cmd_merge(n, rest);
    if (!strcmp(cmd, "quantize")) return glm_cmd_quantize(n, rest);
    if (!strcmp(cmd, "convert")) return glm_cmd_convert(n, rest);
    if (!strcmp(cmd, "expand")) return glm_cmd_expand(n, rest);
    if (!strcmp(cmd, "env")) return glm_cmd_env(n, rest);
    fprintf(stderr, "error: unknown command \"%s\"\n", cmd);
    usage();
    return 2;
}
