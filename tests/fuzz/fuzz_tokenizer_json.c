/* libFuzzer target: arbitrary bytes as GLM-4's tokenizer.json (tokenizer/glm4_json.c, transformers'
 * GLM layout). Loading must fail with a message or give a tokenizer that encodes fixed texts,
 * special tokens' names included, with every id in its vocabulary and decodes them back. The
 * file lives in a folder in /dev/shm (else /tmp), rewritten for each input: the loader knows it
 * by its name. */
#include <string.h>
#include <unistd.h>
#include "tokenizer/tokenizer.h"
#include "fuzz_util.h"

static char dir[256], path[300];

static void cleanup(void) {
    unlink(path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    snprintf(dir, sizeof dir, "%s/glm_fuzz_tokjson.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(1); }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    glm_tokenizer *t = NULL;
    glm_err err;
    err.msg[0] = 0;
    if (glm_tokenizer_load(&t, dir, &err)) {
        FUZZ_CHECK(err.msg[0], "load failed without a message");
        return 0;
    }
    static const char *const texts[] = {"hello world", "你好，世界 123", "<|user|>\nhi<|assistant|>", "  \n\t x", ""};
    int V = glm_tokenizer_vocab_size(t);
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++)
        for (int flags = 0; flags <= GLM_TOK_ADD_SPECIAL + GLM_TOK_ENCODE_SPECIAL; flags += GLM_TOK_ADD_SPECIAL) {
            glm_ids ids = {0};
            int rc = glm_tokenizer_encode_ex(t, texts[i], strlen(texts[i]), flags, &ids, &err);
            FUZZ_CHECK(rc == 0, "encode failed on a loaded tokenizer: %s", err.msg);
            for (int k = 0; k < ids.n; k++) FUZZ_CHECK(ids.data[k] >= 0 && ids.data[k] < V, "id %d out of [0, %d)", ids.data[k], V);
            char *back = glm_tokenizer_decode(t, ids.data, ids.n);
            FUZZ_CHECK(back, "decode gave NULL");
            free(back);
            glm_ids_free(&ids);
        }
    glm_tokenizer_free(t);
    return 0;
}
