/* libFuzzer target: an adapter folder's settings as generate, chat, serve, merge and training read
 * them (model/adapter_config.c): peft's adapter_config.json checked against the names in
 * adapter_model.safetensors, or a P-Tuning v2 checkpoint's config.json. A folder is either refused
 * with a message or gives settings the model can be built with: a LoRA rank of at least 1, a
 * finite alpha, modules among the four linear ones and, when there are tensors, every tensor a
 * LoRA A or B (or, with use_dora, a DoRA magnitude) of exactly those modules, or a whole row of a
 * module outside the layers that modules_to_save names (the word embedding, the final norm, the
 * head); a P-Tuning length of 1..65536 tokens.
 * Input layout: byte 0 bit 0 P-Tuning (config.json) else LoRA (adapter_config.json), bit 1 no
 * tensor file; then the JSON text up to the first NUL, then the tensor names, one a line (at most
 * 64). The folder lives in /dev/shm (else /tmp) and is rewritten for each input. */
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "io/safetensors.h"
#include "model/adapter.h"
#include "fuzz_util.h"

enum { MAX_NAMES = 64 };
static char dir[256], cfg_path[300], ptuning_path[300], st_path[300];
static int trace; /* GLM_FUZZ_TRACE=1: each input's outcome on stderr (to see what the seeds reach) */

static void cleanup(void) {
    unlink(cfg_path);
    unlink(ptuning_path);
    unlink(st_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    trace = getenv("GLM_FUZZ_TRACE") != NULL;
    snprintf(dir, sizeof dir, "%s/glm_fuzz_adapter.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(1); }
    snprintf(cfg_path, sizeof cfg_path, "%s/adapter_config.json", dir);
    snprintf(ptuning_path, sizeof ptuning_path, "%s/config.json", dir);
    snprintf(st_path, sizeof st_path, "%s/adapter_model.safetensors", dir);
    atexit(cleanup);
    return 0;
}

/* The length of the suffix a peft adapter tensor name ends with (A, B, or DoRA's magnitude,
 * *dora set), 0 for none. */
static size_t adapter_suffix(const char *name, int *dora) {
    static const char *const sfx[4] = {".lora_A.weight", ".lora_B.weight", ".lora_magnitude_vector",
                                       ".lora_magnitude_vector.weight"};
    size_t n = strlen(name);
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(sfx[i]);
        if (n > k && !strcmp(name + n - k, sfx[i])) {
            *dora = i >= 2;
            return k;
        }
    }
    return 0;
}

/* The module bit a name would adapt under peft's naming, 0 when it is no LoRA A, B or DoRA
 * magnitude of one (*dora set for a magnitude). */
static int name_bit(const char *name, int *dora) {
    static const char *const mods[4] = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"};
    size_t n = strlen(name), k = adapter_suffix(name, dora);
    if (!k) return 0;
    for (int i = 0; i < 4; i++) {
        size_t m = strlen(mods[i]);
        if (n - k >= m && !memcmp(name + n - k - m, mods[i], m) && (n - k == m || name[n - k - m - 1] == '.')) return 1 << i;
    }
    return 0;
}

/* The bit (1 embedding, 2 final norm, 4 head) of a whole row outside the layers under peft's
 * prefix, in either family's names; 0 for any other name. */
static int outside_bit(const char *name) {
    static const struct { const char *row; int bit; } rows[] = {
        {"transformer.word_embeddings.weight", 1}, {"transformer.final_layernorm.weight", 2},
        {"transformer.final_layernorm.bias", 2}, {"lm_head.weight", 4}, {"transformer.embedding.word_embeddings.weight", 1},
        {"transformer.encoder.final_layernorm.weight", 2}, {"transformer.output_layer.weight", 4}};
    const char *pre = "base_model.model.";
    if (strncmp(name, pre, strlen(pre))) return 0;
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        if (!strcmp(name + strlen(pre), rows[i].row)) return rows[i].bit;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int ptuning = data[0] & 1, no_tensors = (data[0] >> 1) & 1;
    const char *text = (const char *)data + 1, *end = text + size - 1;
    const char *nul = memchr(text, 0, (size_t)(end - text));
    size_t json_len = nul ? (size_t)(nul - text) : (size_t)(end - text);
    unlink(cfg_path);
    unlink(ptuning_path);
    unlink(st_path);
    fuzz_write_file(ptuning ? ptuning_path : cfg_path, text, json_len);

    /* the tensor file: one float per name */
    char *names[MAX_NAMES];
    int n = 0, written = 1, want_bits = 0, any_dora = 0, whole_bits = 0, other = 0;
    if (nul && !no_tensors) {
        char *list = fuzz_cstr((const uint8_t *)nul + 1, (size_t)(end - nul - 1));
        for (char *p = list, *q; p && *p && n < MAX_NAMES; p = q) {
            q = strchr(p, '\n');
            if (q) *q++ = 0;
            if (!*p) continue;
            names[n++] = strdup(p);
        }
        free(list);
        static const float one = 1;
        st_entry e[MAX_NAMES];
        for (int i = 0; i < n; i++) {
            e[i] = (st_entry){.name = names[i], .ndim = 1, .shape = {1}, .data = &one, .data_dtype = ST_F32, .file_dtype = ST_F32};
            int dora = 0, b = name_bit(names[i], &dora);
            want_bits |= b;
            any_dora |= b && dora;
            whole_bits |= b ? 0 : outside_bit(names[i]);
            other |= !b && !outside_bit(names[i]);
        }
        glm_err serr;
        if (n && st_save(st_path, e, n, 0, &serr)) written = 0; /* names the writer refuses (repeated ones): no file */
    }

    glm_peft p;
    glm_err err = {0};
    int rc = glm_adapter_read_config(dir, &p, &err);
    if (trace) fprintf(stderr, "%s, %d tensors: %s%s\n", ptuning ? "P-Tuning" : "LoRA", written ? n : 0, rc ? "refused: " : "read",
                       rc ? err.msg : "");
    if (rc) {
        FUZZ_CHECK(err.msg[0], "refused without a message");
    } else if (p.kind == GLM_FT_LORA) {
        FUZZ_CHECK(!ptuning, "a P-Tuning folder read as LoRA");
        FUZZ_CHECK(p.lora_rank >= 1 && isfinite(p.lora_alpha), "rank %d, alpha %g", p.lora_rank, p.lora_alpha);
        FUZZ_CHECK(p.lora_targets >= 1 && p.lora_targets <= 15, "targets %d", p.lora_targets);
        FUZZ_CHECK(p.extra_modules >= 0 && p.extra_modules <= 7, "modules_to_save bits %d", p.extra_modules);
        if (n && written) {
            FUZZ_CHECK(!other, "a tensor that is no LoRA A, B or DoRA magnitude of the four modules, nor a whole row outside "
                               "the layers, was accepted");
            FUZZ_CHECK((whole_bits & ~p.extra_modules) == 0, "whole rows %d accepted beside modules_to_save %d", whole_bits,
                       p.extra_modules);
            FUZZ_CHECK(!any_dora || p.use_dora, "DoRA magnitudes accepted without use_dora");
            FUZZ_CHECK(p.lora_targets == want_bits, "targets %d, the tensors adapt %d", p.lora_targets, want_bits);
        }
    } else {
        FUZZ_CHECK(ptuning && p.kind == GLM_FT_PTUNING, "kind %d from a %s folder", p.kind, ptuning ? "P-Tuning" : "LoRA");
        FUZZ_CHECK(p.pre_seq_len >= 1 && p.pre_seq_len <= 65536, "pre_seq_len %d", p.pre_seq_len);
    }
    for (int i = 0; i < n; i++) free(names[i]);
    return 0;
}
