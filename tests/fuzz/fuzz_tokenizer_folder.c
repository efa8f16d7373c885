/* libFuzzer target: a tokenizer folder's JSON as glm_tokenizer_load reads it: tokenizer_config.json
 * (special-token names as strings or AddedToken objects, num_image_tokens, remove_space,
 * tokenizer_class, name_or_path, chat_template, encode_special_tokens) beside a fixed model file,
 * and whether a tokenization_chatglm.py is there (with or without ChatGLM3's role tokens).
 * Loading must fail with a message or give a tokenizer whose special ids are in the vocabulary
 * (or -1) and which encodes fixed texts, special tokens' names included, with every id in range.
 * Input layout: byte 0 bits 0-1 the model (GLM_FUZZ_TOKENIZERS' first three files: the test
 * script gives a ChatGLM-6B-style unigram model as ice_text.model, a plain BPE model and a GLM-4
 * rank file, the last two as tokenizer.model), bits 2-3 tokenization_chatglm.py: none, ChatGLM2's,
 * ChatGLM3's; the rest is tokenizer_config.json (none when empty). The folder lives in /dev/shm
 * (else /tmp) and is rewritten for each input. */
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "tokenizer/tokenizer.h"
#include "fuzz_util.h"

enum { MAX_MODELS = 3 };
static char dir[256], models[MAX_MODELS][4096];
static int n_models;

static void cleanup(void) {
    static const char *const names[] = {"ice_text.model", "tokenizer.model", "tokenizer_config.json", "tokenization_chatglm.py"};
    for (int i = 0; i < 4; i++) {
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *list = getenv("GLM_FUZZ_TOKENIZERS");
    for (const char *p = list; p && *p && n_models < MAX_MODELS;) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        snprintf(models[n_models++], sizeof models[0], "%.*s", (int)n, p);
        p = e ? e + 1 : NULL;
    }
    if (!n_models) { fprintf(stderr, "GLM_FUZZ_TOKENIZERS names no model\n"); exit(1); }
    snprintf(dir, sizeof dir, "%s/glm_fuzz_tokdir.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(1); }
    atexit(cleanup);
    return 0;
}

static void put(const char *name, const char *s, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!s) { unlink(p); return; }
    fuzz_write_file(p, s, n);
}

static const char *texts[] = {"Hello world", "[gMASK]<sop>你好 sop <|user|>\nhi<|assistant|>", "  a\tb\n\nc ", "<eop></s><pad>"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int m = (data[0] & 3) % n_models, py = (data[0] >> 2) & 3;
    glm_err err;
    size_t len;
    char *model = glm_read_file(models[m], &len, &err);
    FUZZ_CHECK(model, "cannot read %s", models[m]);
    const char *base = strrchr(models[m], '/');
    int ice = base && !strcmp(base + 1, "ice_text.model");
    put("ice_text.model", ice ? model : NULL, len);
    put("tokenizer.model", ice ? NULL : model, len);
    free(model);
    put("tokenizer_config.json", size > 1 ? (const char *)data + 1 : NULL, size - 1);
    static const char *const pys[] = {NULL, "class ChatGLMTokenizer: # ChatGLM2\n", "special = ['<|user|>', '<|observation|>']\n", NULL};
    put("tokenization_chatglm.py", pys[py], pys[py] ? strlen(pys[py]) : 0);
    glm_tokenizer *t = NULL;
    err.msg[0] = 0;
    if (glm_tokenizer_load(&t, dir, &err) != 0) {
        FUZZ_CHECK(err.msg[0], "load failed without a message");
        return 0;
    }
    int vocab = glm_tokenizer_vocab_size(t);
    glm_special_ids s = glm_tokenizer_specials(t);
    const int32_t sp[] = {s.mask, s.gmask, s.sop, s.eop, s.pad, s.unk, glm_tokenizer_eos(t)};
    for (int i = 0; i < 7; i++) FUZZ_CHECK(sp[i] >= -1 && sp[i] < vocab, "special id %d of %d (vocab %d)", sp[i], i, vocab);
    for (int i = 0; i < 4; i++)
        for (int flags = 0; flags < 4; flags++) {
            glm_ids ids = {0};
            if (glm_tokenizer_encode_ex(t, texts[i], strlen(texts[i]), flags, &ids, &err) == 0) {
                for (int k = 0; k < ids.n; k++) FUZZ_CHECK(ids.data[k] >= 0 && ids.data[k] < vocab, "id %d of %d", ids.data[k], vocab);
                free(glm_tokenizer_decode(t, ids.data, ids.n));
            }
            glm_ids_free(&ids);
        }
    glm_tokenizer_free(t);
    return 0;
}
