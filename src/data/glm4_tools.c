/* GLM-4's tools block (glm4_tools.h). */
#include "data/glm4_tools.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "core/strbuf.h"
#include "data/pyjson.h"

/* fn[0..n) with the null members of its parameters.properties left out, as process_message
 * rebuilds that dict; the text as it was when there are none (or no such object). */
static char *drop_null_properties(const char *fn, size_t n) {
    size_t ps, pe, qs, qe, ks, ke, vs, ve;
    glm_strbuf b = {0};
    if (glm_json_locate(fn, n, "parameters", -1, &ps, &pe) || glm_json_locate(fn + ps, pe - ps, "properties", -1, &qs, &qe) ||
        fn[ps + qs] != '{') {
        glm_strbuf_put(&b, fn, n);
        return b.s;
    }
    const char *props = fn + ps + qs;
    size_t plen = qe - qs;
    glm_strbuf_put(&b, fn, ps + qs);
    glm_strbuf_put(&b, "{", 1);
    for (int k = 0, kept = 0; !glm_json_member(props, plen, k, &ks, &ke, &vs, &ve); k++) {
        if (ve - vs == 4 && !memcmp(props + vs, "null", 4)) continue;
        if (kept++) glm_strbuf_put(&b, ",", 1);
        glm_strbuf_put(&b, props + ks, ke - ks);
        glm_strbuf_put(&b, ":", 1);
        glm_strbuf_put(&b, props + vs, ve - vs);
    }
    glm_strbuf_put(&b, "}", 1);
    glm_strbuf_put(&b, fn + ps + qe, n - (ps + qe));
    return b.s;
}

char *glm4_tools_text(const char *tools_json, size_t len, int flags, char *why, size_t why_len) {
    if (why && why_len) why[0] = 0;
    /* json.loads' reading first: a repeated key once, with its last value */
    char *norm = glm_pyjson_dumps(tools_json, len, -1, why, why_len);
    if (!norm) return NULL;
    size_t nlen = strlen(norm);
    cJSON *list = cJSON_Parse(norm);
    glm_strbuf b = {0};
    int rc = 0;
    if (!cJSON_IsArray(list)) {
        snprintf(why, why_len, "the tools are not a list");
        rc = -1;
    }
    glm_strbuf_str(&b, GLM4_TOOLS_HEADER GLM4_TOOLS_TITLE);
    int i = 0;
    for (const cJSON *t = rc ? NULL : list->child; t && !rc; t = t->next, i++) {
        const cJSON *fn = t, *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        if (!(flags & GLM4_TOOLS_FUNCTIONS)) {
            if (!cJSON_IsObject(t) || !cJSON_IsString(type)) {
                snprintf(why, why_len, "tools[%d]: expected {\"type\": \"function\", \"function\": {...}}", i);
                rc = -1;
                break;
            }
            if (strcmp(type->valuestring, "function")) {
                int builtin = !strcmp(type->valuestring, "python") || !strcmp(type->valuestring, "simple_browser") ||
                              !strcmp(type->valuestring, "cogview");
                snprintf(why, why_len, "tools[%d]: type \"%.40s\": %s", i, type->valuestring,
                         builtin ? "GLM-4's built-in tools are not supported; describe it as a \"function\" tool"
                                 : "only \"function\" tools are supported");
                rc = -1;
                break;
            }
            fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        }
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0]) {
            snprintf(why, why_len, "tools[%d]: the function needs a string \"name\"", i);
            rc = -1;
            break;
        }
        size_t ts, te, fs, fe;
        if (glm_json_locate(norm, nlen, NULL, i, &ts, &te) ||
            (!(flags & GLM4_TOOLS_FUNCTIONS) && glm_json_locate(norm + ts, te - ts, "function", -1, &fs, &fe))) {
            snprintf(why, why_len, "tools[%d]: could not be found again in the text", i);
            rc = -1;
            break;
        }
        if (flags & GLM4_TOOLS_FUNCTIONS) { fs = 0; fe = te - ts; }
        char *fn_text = flags & GLM4_TOOLS_DROP_NULL_PROPS ? drop_null_properties(norm + ts + fs, fe - fs) : NULL;
        char *dump = fn_text ? glm_pyjson_dumps(fn_text, strlen(fn_text), 4, why, why_len)
                             : glm_pyjson_dumps(norm + ts + fs, fe - fs, 4, why, why_len);
        free(fn_text);
        if (!dump) { rc = -1; break; }
        glm_strbuf_str(&b, "\n## ");
        glm_strbuf_str(&b, name->valuestring);
        glm_strbuf_str(&b, "\n\n");
        glm_strbuf_str(&b, dump);
        glm_strbuf_str(&b, GLM4_TOOL_SUFFIX);
        free(dump);
    }
    cJSON_Delete(list);
    free(norm);
    if (rc) { free(b.s); return NULL; }
    return b.s;
}
