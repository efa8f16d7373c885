/* What the recognizers' test drivers (tool_schema_mode, tool_regex) share: a line's text, the
 * walks' random numbers and their output lines. */
#ifndef GLM_TESTS_TOOL_LINES_H
#define GLM_TESTS_TOOL_LINES_H
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>

/* Item 1 of a line [x, text] as bytes: its UTF-8, or, when item 2 is a string ("bytes"), its
 * characters below 256 as bytes (so that a test can give bytes that are not UTF-8) in raw[cap]. */
static inline const unsigned char *tool_line_text(const cJSON *line, unsigned char *raw, size_t cap) {
    const cJSON *tx = cJSON_GetArrayItem(line, 1);
    const unsigned char *t = (const unsigned char *)(cJSON_IsString(tx) ? tx->valuestring : "");
    if (!cJSON_IsString(cJSON_GetArrayItem(line, 2))) return t;
    size_t k = 0;
    for (const unsigned char *p = t; *p && k + 1 < cap; k++)
        if (*p < 0x80) raw[k] = *p++;
        else raw[k] = (unsigned char)(((p[0] & 3) << 6) | (p[1] & 0x3F)), p += 2;
    raw[k] = 0;
    return raw;
}

static inline unsigned long long tool_rnd(unsigned long long *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* One output line ["verdict", "text"]. */
static inline void tool_print_pair(const char *verdict, const char *text) {
    cJSON *line = cJSON_CreateArray();
    cJSON_AddItemToArray(line, cJSON_CreateString(verdict));
    cJSON_AddItemToArray(line, cJSON_CreateString(text));
    char *p = cJSON_PrintUnformatted(line);
    printf("%s\n", p);
    free(p);
    cJSON_Delete(line);
}

#endif
