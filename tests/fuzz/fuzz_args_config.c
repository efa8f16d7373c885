/* libFuzzer target: the `train` flag table (train/train_flags.c) through core/args.c.
 * Input layout: byte 0 even: the rest is a --config file, JSON (argv = --config FILE), or YAML
 * when byte 0 & 3 is 2 (LLaMA-Factory's flat configs), or a --deepspeed file when byte 0 & 7 is 4
 * (train/deepspeed.c: it must fail with a message or pass, and then its plan check too); odd: the
 * rest is a command line, arguments separated by NUL bytes (at most 64), so the flag forms
 * (--name value, --name=value, bare booleans, --config=...) are fuzzed too.
 * Parsing must fail with a message or give settings whose printed JSON (glm_args_to_json)
 * loads back through --config to the same settings. */
#include <string.h>
#include "train/train_args.h"
#include "fuzz_util.h"

static char *settings_json(const char *cfg_path, int *ok) {
    glm_train_args a = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &a);
    char *argv[] = {"--config", (char *)cfg_path};
    glm_err err;
    *ok = glm_args_parse(glm_train_flags, glm_train_nflags, &a, 2, argv, &err) == 0;
    char *s = *ok ? glm_args_to_json(glm_train_flags, glm_train_nflags, &a) : glm_strdup(err.msg);
    glm_train_args_free(&a);
    return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    glm_train_args a = {0};
    glm_args_defaults(glm_train_flags, glm_train_nflags, &a);
    glm_err err;
    err.msg[0] = 0;
    char path[64];
    int fd = -1, rc;
    char *text = NULL;
    if (!(data[0] & 1)) {
        fd = fuzz_memfile(data + 1, size - 1, path, sizeof path);
        if (fd < 0) { glm_train_args_free(&a); return 0; }
        if ((data[0] & 7) == 4) {
            a.deepspeed = glm_strdup(path);
            rc = glm_ds_apply(&a, &err);
            if (rc == 0) rc = glm_ds_check_plan(&a, 1 + (data[0] >> 4), 100, 10, &err);
            FUZZ_CHECK(rc == 0 || err.msg[0], "a DeepSpeed file failed without a message");
            glm_train_args_free(&a);
            close(fd);
            return 0;
        }
        char *argv[] = {"--config", path};
        rc = (data[0] & 3) == 2 ? glm_args_load_yaml(glm_train_flags, glm_train_nflags, &a, path, glm_train_config_key, &err) /* .yaml */
                                : glm_args_parse(glm_train_flags, glm_train_nflags, &a, 2, argv, &err);
    } else {
        text = fuzz_cstr(data + 1, size - 1);
        char *argv[64];
        int argc = 0;
        for (size_t i = 0; i < size - 1 && argc < 64; i += strlen(text + i) + 1) argv[argc++] = text + i;
        /* --config from the command line would open whatever path the fuzzer spells (/dev/zero):
         * the file form is mode 0's job */
        for (int i = 0; i < argc; i++)
            if (strstr(argv[i], "config")) { free(text); glm_train_args_free(&a); return 0; }
        rc = glm_args_parse(glm_train_flags, glm_train_nflags, &a, argc, argv, &err);
    }
    if (rc == 0) {
        char *json = glm_args_to_json(glm_train_flags, glm_train_nflags, &a);
        FUZZ_CHECK(json, "to_json gave NULL");
        char p2[64];
        int fd2 = fuzz_memfile((const uint8_t *)json, strlen(json), p2, sizeof p2);
        if (fd2 >= 0) {
            int ok;
            char *again = settings_json(p2, &ok);
            FUZZ_CHECK(ok, "printed settings do not load back: %s\n%s", again, json);
            FUZZ_CHECK(strcmp(again, json) == 0, "settings changed on reload:\n%s\n---\n%s", json, again);
            free(again);
            close(fd2);
        }
        free(json);
    } else {
        FUZZ_CHECK(err.msg[0], "parse failed without a message");
    }
    glm_train_args_free(&a);
    free(text);
    if (fd >= 0) close(fd);
    return 0;
}
