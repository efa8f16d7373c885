/* libFuzzer target: arbitrary text through the tokenizer (ChatGLM pre-processing, normaliser,
 * unigram/BPE encoders, pieces, decoding) and arbitrary ids through decoding.
 * The tokenizers: the .model files named in GLM_FUZZ_TOKENIZERS (colon-separated; the test
 * script makes small unigram and BPE ones with spm_train and adds ChatGLM-6B's ice_text.model
 * from ../shared when present), else ../shared/tokenizers/chatglm-6b/ice_text.model.
 * Input layout: byte 0 bits 0-1 pick the tokenizer, bit 2 GLM_TOK_SPM_ONLY, bit 3
 * GLM_TOK_ADD_SPECIAL, bit 4 decode mode (the rest is little-endian int32 ids); otherwise the
 * rest is the text. Ids must be in range and pieces must match the ids one to one. */
#include <string.h>
#include "tokenizer/tokenizer.h"
#include "fuzz_util.h"

static glm_tokenizer *toks[4];
static int ntok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *env = getenv("GLM_FUZZ_TOKENIZERS");
    char *list = strdup(env && *env ? env : "../shared/tokenizers/chatglm-6b/ice_text.model");
    for (char *p = strtok(list, ":"); p && ntok < 4; p = strtok(NULL, ":")) {
        glm_err err;
        if (glm_tokenizer_load(&toks[ntok], p, &err) == 0) ntok++;
        else fprintf(stderr, "fuzz_tokenizer_text: %s\n", err.msg);
    }
    free(list);
    if (!ntok) { fprintf(stderr, "fuzz_tokenizer_text: no tokenizer loaded (set GLM_FUZZ_TOKENIZERS)\n"); exit(1); }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const glm_tokenizer *t = toks[(data[0] & 3) % ntok];
    int flags = (data[0] >> 2) & 3;
    int vocab = glm_tokenizer_vocab_size(t);
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    size_t n;
    if (data[0] & 16) {
        int nid = (int)(len / 4);
        int32_t *ids = malloc((size_t)nid * 4 + 4);
        memcpy(ids, text, (size_t)nid * 4);
        free(glm_tokenizer_decode_ex(t, ids, nid, flags & GLM_TOK_SPM_ONLY, &n));
        free(glm_tokenizer_decode(t, ids, nid));
        free(ids);
        return 0;
    }
    glm_ids ids = {0};
    glm_err err;
    err.msg[0] = 0;
    if (glm_tokenizer_encode_ex(t, text, len, flags, &ids, &err) == 0) {
        for (int k = 0; k < ids.n; k++) FUZZ_CHECK(ids.data[k] >= 0 && ids.data[k] < vocab, "id %d of %d", ids.data[k], vocab);
        glm_pieces pc;
        FUZZ_CHECK(glm_tokenizer_encode_pieces(t, text, len, flags, &pc, &err) == 0, "pieces failed: %s", err.msg);
        FUZZ_CHECK(pc.n == ids.n, "%d pieces for %d ids", pc.n, ids.n);
        glm_pieces_free(&pc);
        free(glm_tokenizer_decode_ex(t, ids.data, ids.n, flags & GLM_TOK_SPM_ONLY, &n));
        free(glm_tokenizer_decode(t, ids.data, ids.n));
    } else {
        FUZZ_CHECK(err.msg[0], "encode failed without a message");
    }
    glm_ids_free(&ids);
    char *s = fuzz_cstr(data + 1, len);
    free(glm_chat_postprocess(s));
    free(s);
    return 0;
}
