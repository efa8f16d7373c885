/* Test driver for structured outputs' recognizer (infer/schema_mode.h), so that
 * tests/py/test_serve_constrained.py and test_schema_keywords.py can hold it against the jsonschema
 * package. Each input line is a JSON list [schema, text]; each output line: "done" (a whole object
 * the schema allows), "prefix" (every byte taken, not finished), "refused N" (the first byte
 * refused, at offset N) or "schema: WHY" (the schema is not supported). A third item "bytes" takes
 * the text's characters below 256 as bytes (so that a test can give bytes that are not UTF-8).
 *
 * `tool_schema_mode --walk N` instead reads [schema, seed] lines and writes the recognizer's own
 * texts: N random walks from the start, each byte picked among those it takes (mostly structure's
 * bytes, so that values end), as lines ["done"|"cut"|"stuck", text]; "stuck" is a state that is not
 * done and takes no byte at all, which the masks must never reach. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/schema_mode.h"
#include "tool_lines.h"

#define WALK_BYTES 1500

static void walk(const glm_json_schema *s, unsigned long long seed) {
    static const char prefer[] = "\"}],:{[0123456789-.tfnulrase ";
    glm_json_schema_state st;
    glm_json_schema_start(&st, s);
    char text[WALK_BYTES + 1];
    int n = 0;
    const char *verdict = "cut";
    while (n < WALK_BYTES) {
        unsigned char ok[256], good[256];
        int n_ok = 0, n_good = 0;
        for (int c = 1; c < 256; c++) {
            glm_json_schema_state t = st;
            unsigned char b = (unsigned char)c;
            if (glm_json_schema_feed(&t, &b, 1)) continue;
            if (c >= 0x20 && c < 0x7f) ok[n_ok++] = b; /* (texts stay ASCII: valid UTF-8 for the checks) */
            if (strchr(prefer, c)) good[n_good++] = b;
            if (c >= 0x80) ok[n_ok++] = 0; /* a state that takes only non-ASCII bytes is not stuck */
        }
        if (st.done) { verdict = "done"; break; }
        int usable = 0;
        for (int i = 0; i < n_ok; i++) usable |= ok[i] != 0;
        if (!n_ok) { verdict = "stuck"; break; }
        if (!usable) break;
        unsigned char b;
        do b = (n_good && tool_rnd(&seed) % 10 < 8) ? good[tool_rnd(&seed) % (unsigned)n_good] : ok[tool_rnd(&seed) % (unsigned)n_ok];
        while (!b);
        glm_json_schema_feed(&st, &b, 1);
        text[n++] = (char)b;
    }
    text[n] = 0;
    tool_print_pair(verdict, text);
}

int main(int argc, char **argv) {
    static char line[1 << 18];
    int walks = argc == 3 && !strcmp(argv[1], "--walk") ? atoi(argv[2]) : 0;
    while (fgets(line, sizeof line, stdin)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *sc = cJSON_GetArrayItem(j, 0), *tx = cJSON_GetArrayItem(j, 1);
        glm_json_schema s;
        char why[512];
        if (glm_json_schema_compile(&s, sc, why, sizeof why)) {
            printf("schema: %s\n", why);
        } else if (walks) {
            for (int i = 0; i < walks; i++) walk(&s, (unsigned long long)(tx ? tx->valuedouble : 0) * 1000003ull + (unsigned)i);
            glm_json_schema_free(&s);
        } else {
            static unsigned char raw[1 << 16];
            const char *t = (const char *)tool_line_text(j, raw, sizeof raw);
            glm_json_schema_state st;
            glm_json_schema_start(&st, &s);
            size_t n = strlen(t), at = n;
            for (size_t i = 0; i < n; i++)
                if (glm_json_schema_feed(&st, (const unsigned char *)t + i, 1)) { at = i; break; }
            if (at < n) printf("refused %zu\n", at);
            else printf("%s\n", st.done ? "done" : "prefix");
            glm_json_schema_free(&s);
        }
        cJSON_Delete(j);
    }
    return 0;
}
