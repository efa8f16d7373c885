/* `glmtrain train`: parses the Hugging Face-named flags and runs the training loop. */
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "train/train.h"

int glm_cmd_train(int argc, char **argv) {
    glm_train_args a;
    glm_err err = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            glm_args_usage(glm_train_flags, glm_train_nflags, "train");
            glm_train_args_free(&a);
            return 0;
        }
    int rc = glm_args_parse(glm_train_flags, glm_train_nflags, &a, argc, argv, &err);
    if (!rc) rc = glm_train_run(&a, &err);
    if (rc) glm_err_print(&err);
    glm_train_args_free(&a);
    return rc ? 1 : 0;
}
