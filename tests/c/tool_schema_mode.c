/* Test driver for structured outputs' recognizer (infer/schema_mode.h), so that
 * tests/py/test_serve_constrained.py can hold it against the jsonschema package. Each input line is
 * a JSON list [schema, text]; each output line: "done" (a whole object the schema allows), "prefix"
 * (every byte taken, not finished), "refused N" (the first byte refused, at offset N) or
 * "schema: WHY" (the schema is not supported). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/schema_mode.h"

int main(void) {
    static char line[1 << 18];
    while (fgets(line, sizeof line, stdin)) {
        cJSON *j = cJSON_Parse(line);
        const cJSON *sc = cJSON_GetArrayItem(j, 0), *tx = cJSON_GetArrayItem(j, 1);
        glm_json_schema s;
        char why[512];
        if (glm_json_schema_compile(&s, sc, why, sizeof why)) {
            printf("schema: %s\n", why);
        } else {
            const char *t = cJSON_IsString(tx) ? tx->valuestring : "";
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
