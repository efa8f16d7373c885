/* libFuzzer target: the decoding constraints' compilers and recognizers (infer/schema_compile.c,
 * infer/schema_mode.c, infer/regex.c). A schema or a pattern is compiled, then the rest of the
 * input is fed a byte at a time; after every byte taken, the recognizer must be done or take some
 * next byte: a state where nothing fits is a dead end the token masks would hand the model (every
 * logit masked), so it counts as a crash.
 * Input layout: byte 0 bit 0 picks a regex (else a JSON Schema); the spec runs to the first NUL
 * byte, the text after it. */
#include <cJSON.h>
#include <string.h>
#include "infer/regex.h"
#include "infer/schema_mode.h"
#include "fuzz_util.h"

static int schema_takes_a_byte(const glm_json_schema_state *st) {
    for (int c = 0; c < 256; c++) {
        glm_json_schema_state t = *st;
        unsigned char b = (unsigned char)c;
        if (!glm_json_schema_feed(&t, &b, 1)) return 1;
    }
    return 0;
}

static int regex_takes_a_byte(const glm_regex *re, const uint64_t *set, const glm_regex_text *t) {
    for (int c = 0; c < 256; c++) {
        uint64_t s2[GLM_REGEX_MAX_STATES / 64];
        memcpy(s2, set, sizeof s2[0] * (size_t)re->words);
        glm_regex_text t2 = *t;
        if (!glm_regex_byte(re, s2, &t2, (unsigned)c)) return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int regex = data[0] & 1;
    const uint8_t *spec = data + 1, *end = memchr(spec, 0, size - 1);
    size_t ns = end ? (size_t)(end - spec) : size - 1;
    const uint8_t *text = end ? end + 1 : data + size;
    size_t nt = (size_t)(data + size - text);
    char *s = fuzz_cstr(spec, ns), why[512];
    if (regex) {
        glm_regex re;
        if (!glm_regex_compile(&re, s, GLM_REGEX_MAX_STATES, why, sizeof why)) {
            uint64_t set[GLM_REGEX_MAX_STATES / 64];
            glm_regex_text t = {0};
            glm_regex_start(&re, set);
            for (size_t i = 0; i < nt; i++) {
                FUZZ_CHECK(glm_regex_accepts(&re, set) && !t.need ? 1 : regex_takes_a_byte(&re, set, &t),
                           "pattern %s: a dead end after %zu bytes", s, i);
                if (glm_regex_byte(&re, set, &t, text[i])) break;
            }
            glm_regex_free(&re);
        } else {
            FUZZ_CHECK(why[0], "a refusal without a reason");
        }
    } else {
        cJSON *j = cJSON_Parse(s);
        glm_json_schema sc;
        if (j && !glm_json_schema_compile(&sc, j, why, sizeof why)) {
            glm_json_schema_state st;
            glm_json_schema_start(&st, &sc);
            for (size_t i = 0; i < nt; i++) {
                FUZZ_CHECK(st.done || schema_takes_a_byte(&st), "schema %s: a dead end after %zu bytes", s, i);
                if (glm_json_schema_feed(&st, text + i, 1)) break;
            }
            glm_json_schema_free(&sc);
        }
        cJSON_Delete(j);
    }
    free(s);
    return 0;
}
