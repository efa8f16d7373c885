/* `glmtrain train`: parses the Hugging Face-named flags and runs the training loop. */
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "parallel/launch.h"
#include "train/train.h"

int glm_cmd_train(int argc, char **argv) {
    glm_train_args a = {0};
    glm_err err = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &a);
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            glm_args_usage(glm_train_flags, glm_train_nflags, "train");
            glm_train_args_free(&a);
            return 0;
        }
    int rc = glm_args_parse_ex(glm_train_flags, glm_train_nflags, &a, argc, argv, glm_train_config_key, &err) ||
             glm_train_resolve_args(&a, &err);
    glm_par_opts po = glm_train_par_opts(&a);
    int launcher = rc ? 0 : glm_launch_wanted(&po, &err);
    if (launcher < 0) rc = -1;
    if (launcher > 0) {
        /* this process only starts and watches the data-parallel workers (parallel/launch.h) */
        rc = glm_train_preflight(&a, &err);
        if (!rc) rc = glm_launch(&po, argc, argv, &err);
        if (rc < 0) glm_err_print(&err);
        glm_train_args_free(&a);
        return rc < 0 ? 1 : rc;
    }
    if (!rc) rc = glm_train_run(&a, &err);
    if (rc) glm_err_print(&err);
    glm_train_args_free(&a);
    return rc ? 1 : 0;
}
