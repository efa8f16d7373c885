/* libFuzzer target: arbitrary bytes as a tokenizer.model file: a SentencePiece ModelProto
 * (tokenizer/spm_model.c's reader, then the charsmap, tries and ChatGLM set-up of
 * glm_tokenizer_load) or, by its content, GLM-4's tiktoken rank file (tokenizer/bpe_ranks.c:
 * base64 tokens and ranks; seeds ranks_*).
 * Loading must fail with a message or give a tokenizer that encodes and decodes a few fixed
 * texts with every id in range (a fuzzed charsmap or piece table is then really used). */
#include <string.h>
#include "tokenizer/tokenizer.h"
#include "fuzz_util.h"

static const char *texts[] = {"Hello world", "  a\tb\n\nc   d ", "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c ABC 123", "\xff\xfe\x00z"};
static const size_t lens[] = {11, 14, 16, 4};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    glm_tokenizer *t = NULL;
    glm_err err;
    err.msg[0] = 0;
    if (glm_tokenizer_load(&t, path, &err) == 0) {
        int vocab = glm_tokenizer_vocab_size(t);
        for (int i = 0; i < 4; i++)
            for (int flags = 0; flags < 4; flags++) {
                glm_ids ids = {0};
                if (glm_tokenizer_encode_ex(t, texts[i], lens[i], flags, &ids, &err) == 0) {
                    for (int k = 0; k < ids.n; k++) FUZZ_CHECK(ids.data[k] >= 0 && ids.data[k] < vocab, "id %d of %d", ids.data[k], vocab);
                    size_t n;
                    free(glm_tokenizer_decode_ex(t, ids.data, ids.n, flags & GLM_TOK_SPM_ONLY, &n));
                    free(glm_tokenizer_decode(t, ids.data, ids.n));
                }
                glm_ids_free(&ids);
            }
        int32_t all[64];
        int n = vocab < 64 ? vocab : 64;
        for (int k = 0; k < n; k++) all[k] = vocab - 1 - k;
        free(glm_tokenizer_decode(t, all, n));
        glm_tokenizer_free(t);
    } else {
        FUZZ_CHECK(err.msg[0], "load failed without a message");
    }
    close(fd);
    return 0;
}
