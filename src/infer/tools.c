/* ChatGLM3's and GLM-4's tool calls (infer/tools.h). */
#include "infer/tools.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "core/strbuf.h"
#include "data/pyjson.h"
#include "data/pyliteral.h"

char *glm_tools_system_text(const char *tools_json, size_t len, char *why, size_t why_len) {
    char *dump = glm_pyjson_dumps(tools_json, len, 4, why, why_len);
    if (!dump) return NULL;
    glm_strbuf b = {0};
    glm_strbuf_str(&b, GLM_TOOLS_PREAMBLE "\n");
    glm_strbuf_str(&b, dump);
    free(dump);
    return b.s;
}

/* s[0..n) without the spaces, tabs and line ends str.strip() takes off its ends. */
static void strip(const char **s, const char **e) {
    while (*s < *e && strchr(" \t\r\n\v\f", **s)) (*s)++;
    while (*e > *s && strchr(" \t\r\n\v\f", (*e)[-1])) (*e)--;
}

/* Both demos' process_response: the part after the last "<|assistant|>", its first line the
 * metadata (stripped, [*m0, *m1)) and the rest after it (from *body). 0 when there is no line end
 * or the metadata is blank: an answer, not a call. */
static int call_parts(const char *text, const char **m0, const char **m1, const char **body) {
    const char *seg = text, *a;
    while ((a = strstr(seg, "<|assistant|>"))) seg = a + strlen("<|assistant|>");
    const char *nl = strchr(seg, '\n');
    if (!nl) return 0; /* response.split("\n", maxsplit=1) has no second part */
    *m0 = seg;
    *m1 = nl;
    strip(m0, m1);
    *body = nl + 1;
    return *m0 < *m1;
}

int glm_tool_call_read(const char *text, char **name, char **args) {
    *name = *args = NULL;
    const char *m0, *m1, *body;
    if (!call_parts(text, &m0, &m1, &body)) return 0;
    /* content.split("\n")[1:-1]: the lines between the first and the last */
    const char *first_end = strchr(body, '\n');
    if (!first_end) return 0;
    const char *last_start = strrchr(body, '\n') + 1;
    if (last_start <= first_end + 1) return 0; /* fewer than three lines: nothing between */
    char why[128];
    char *kw = glm_py_call_kwargs_json(first_end + 1, (size_t)(last_start - 1 - (first_end + 1)), "tool_call", why, sizeof why);
    if (!kw) return 0;
    *name = glm_strndup(m0, (size_t)(m1 - m0));
    *args = kw;
    return 1;
}

char *glm_tool_call_write(const char *args_json, char *why, size_t why_len) {
    if (why && why_len) why[0] = 0;
    /* as json.loads reads it: a repeated key once, with its last value */
    char *norm = glm_pyjson_dumps(args_json, strlen(args_json), -1, why, why_len);
    cJSON *o = norm ? cJSON_Parse(norm) : NULL;
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        free(norm);
        if (why && !why[0]) snprintf(why, why_len, "the arguments are not a JSON object");
        return NULL;
    }
    size_t len = strlen(norm);
    int plain = 1; /* every key a Python identifier: k=v, else tool_call(**{...}) */
    const cJSON *it;
    cJSON_ArrayForEach(it, o) { /* a key with a \u0000 ends early as a C string: it is found as no key, so ** */
        size_t vs, ve;
        plain &= glm_py_is_identifier(it->string, strlen(it->string)) && glm_json_locate(norm, len, it->string, 0, &vs, &ve) == 0;
    }
    glm_strbuf b = {0};
    glm_strbuf_str(&b, "```python\ntool_call(");
    int rc = 0;
    if (plain) {
        int k = 0;
        cJSON_ArrayForEach(it, o) {
            size_t vs, ve;
            if (glm_json_locate(norm, len, it->string, 0, &vs, &ve)) { rc = -1; break; }
            char *v = glm_pyjson_repr(norm + vs, ve - vs, why, why_len);
            if (!v) { rc = -1; break; }
            if (k++) glm_strbuf_str(&b, ", ");
            glm_strbuf_str(&b, it->string);
            glm_strbuf_str(&b, "=");
            glm_strbuf_str(&b, v);
            free(v);
        }
    } else {
        char *v = glm_pyjson_repr(norm, len, why, why_len);
        if (!v) rc = -1;
        else { glm_strbuf_str(&b, "**"); glm_strbuf_str(&b, v); free(v); }
    }
    cJSON_Delete(o);
    free(norm);
    if (rc) { free(b.s); return NULL; }
    glm_strbuf_str(&b, ")\n```");
    return b.s;
}

/* The JSON text of a dict given as a Python literal or as JSON; NULL when it is neither. */
static char *dict_json(const char *s, size_t n) {
    char *j = glm_py_literal_json(s, n, NULL, 0);
    if (!j) j = glm_pyjson_dumps(s, n, -1, NULL, 0);
    if (j && j[0] != '{') { free(j); j = NULL; }
    return j;
}

int glm4_tool_call_read(const char *text, char *const *names, int n_names, char **name, char **args) {
    *name = *args = NULL;
    const char *m0, *m1, *c0;
    if (!call_parts(text, &m0, &m1, &c0)) return 0;
    const char *c1 = c0 + strlen(c0);
    strip(&c0, &c1);
    int known = 0;
    for (int i = 0; i < n_names && !known; i++) known = strlen(names[i]) == (size_t)(m1 - m0) && !memcmp(names[i], m0, (size_t)(m1 - m0));
    if (!known || c0 == c1) return 0;
    char *j = dict_json(c0, (size_t)(c1 - c0));
    if (!j) return 0;
    *name = glm_strndup(m0, (size_t)(m1 - m0));
    *args = j;
    return 1;
}

char *glm4_tool_call_write(const char *args_json, char *why, size_t why_len) {
    char *j = glm_pyjson_dumps(args_json, strlen(args_json), -1, why, why_len);
    if (j && j[0] != '{') {
        free(j);
        if (why && why_len) snprintf(why, why_len, "the arguments are not a JSON object");
        return NULL;
    }
    return j;
}
