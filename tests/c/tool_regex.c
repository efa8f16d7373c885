/* Test driver for the decoding constraints' regular expressions (infer/regex.h), so that
 * tests/py/test_regex.py can hold them against Python's re. Each input line is a JSON list
 * [pattern, text]; each output line: "match" (the text matches whole), "prefix" (every byte taken,
 * not a match yet), "refused N" (the first byte refused, at offset N) or "regex: WHY"; a third item
 * "bytes" takes the text's characters below 256 as bytes (so a test can give cut characters).
 * `tool_regex --walk N` reads [pattern, seed] lines and writes N random texts the recognizer makes
 * byte by byte (ASCII and a few CJK characters), as ["match"|"cut"|"stuck", text]: "stuck" is a
 * state that is no match and takes no byte, which the masks must never reach. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/regex.h"
#include "tool_lines.h"

static void walk(const glm_regex *re, unsigned long long seed) {
    static const unsigned char cjk[][4] = {"\xe4\xb8\xad", "\xe6\x96\x87", "\xc3\xa9"};
    uint64_t set[GLM_REGEX_MAX_STATES / 64];
    glm_regex_text t = {0};
    glm_regex_start(re, set);
    char text[400];
    int n = 0;
    const char *verdict = "cut";
    while (n < 300) {
        if (glm_regex_accepts(re, set) && (!glm_regex_goes_on(re, set) || tool_rnd(&seed) % 4 == 0)) { verdict = "match"; break; }
        unsigned char opts[127 + 3][4]; /* the ASCII bytes and the 3 characters */
        int no = 0;
        for (int c = 1; c < 128; c++) {
            uint64_t s2[GLM_REGEX_MAX_STATES / 64];
            memcpy(s2, set, sizeof s2[0] * (size_t)re->words);
            glm_regex_text t2 = t;
            if (!glm_regex_byte(re, s2, &t2, (unsigned)c)) opts[no][0] = (unsigned char)c, opts[no][1] = 0, no++;
        }
        for (int k = 0; k < 3; k++) {
            uint64_t s2[GLM_REGEX_MAX_STATES / 64];
            memcpy(s2, set, sizeof s2[0] * (size_t)re->words);
            glm_regex_text t2 = t;
            int ok = 1;
            for (const unsigned char *b = cjk[k]; *b && ok; b++) ok = !glm_regex_byte(re, s2, &t2, *b);
            if (ok) memcpy(opts[no++], cjk[k], 4);
        }
        if (!no) { verdict = glm_regex_accepts(re, set) ? "match" : "stuck"; break; }
        const unsigned char *pick = opts[tool_rnd(&seed) % (unsigned)no];
        for (const unsigned char *b = pick; *b; b++) { glm_regex_byte(re, set, &t, *b); text[n++] = (char)*b; }
    }
    text[n] = 0;
    tool_print_pair(verdict, text);
}

int main(int argc, char **argv) {
    static char line[1 << 16];
    int walks = argc == 3 && !strcmp(argv[1], "--walk") ? atoi(argv[2]) : 0;
    while (fgets(line, sizeof line, stdin)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *pat = cJSON_GetArrayItem(j, 0), *tx = cJSON_GetArrayItem(j, 1);
        glm_regex re;
        char why[300];
        if (!cJSON_IsString(pat) || glm_regex_compile(&re, pat->valuestring, GLM_REGEX_MAX_STATES, why, sizeof why)) {
            printf("regex: %s\n", cJSON_IsString(pat) ? why : "no pattern");
        } else if (walks) {
            for (int i = 0; i < walks; i++) walk(&re, (unsigned long long)(tx ? tx->valuedouble : 0) * 7919ull + (unsigned)i + 1);
            glm_regex_free(&re);
        } else {
            static unsigned char raw[1 << 16];
            const unsigned char *t = tool_line_text(j, raw, sizeof raw);
            uint64_t set[GLM_REGEX_MAX_STATES / 64];
            glm_regex_text st = {0};
            glm_regex_start(&re, set);
            size_t n = strlen((const char *)t), at = n;
            for (size_t i = 0; i < n; i++)
                if (glm_regex_byte(&re, set, &st, t[i])) { at = i; break; }
            if (at < n) printf("refused %zu\n", at);
            else printf("%s\n", glm_regex_accepts(&re, set) && !st.need ? "match" : "prefix");
            glm_regex_free(&re);
        }
        cJSON_Delete(j);
    }
    return 0;
}
