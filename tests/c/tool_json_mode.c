/* Test driver for JSON mode's recognizer (infer/json_mode.h), so that tests/py/test_serve_constrained.py can
 * hold it against Python's json module. Each input line is a text in JSON's escapes (a JSON string
 * literal, so any byte can be given); each output line: "done" (a whole object), "prefix" (every
 * byte taken, the object not closed yet) or "refused N" (the first byte refused, at offset N). */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/json_mode.h"

int main(void) {
    static char line[1 << 16];
    while (fgets(line, sizeof line, stdin)) {
        cJSON *j = cJSON_Parse(line);
        const char *t = cJSON_IsString(j) ? j->valuestring : "";
        glm_json_state s;
        glm_json_init(&s);
        size_t n = strlen(t), at = n;
        for (size_t i = 0; i < n; i++)
            if (glm_json_feed(&s, (const unsigned char *)t + i, 1)) { at = i; break; }
        if (at < n) printf("refused %zu\n", at);
        else printf("%s\n", glm_json_done(&s) ? "done" : "prefix");
        cJSON_Delete(j);
    }
    return 0;
}
