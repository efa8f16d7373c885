/* libFuzzer target: ChatGLM3's and GLM-4's tool-call texts (model output and client input;
 * data/pyliteral.c, data/pyjson.c, data/glm4_tools.c, infer/tools.c). Every reader must refuse or give well-formed text, and the
 * two directions must agree: a call read into JSON arguments and written back reads again to the
 * same arguments; a JSON value's Python repr reads back as the same value. */
#include <cJSON.h>
#include <string.h>
#include "data/glm4_tools.h"
#include "data/pyjson.h"
#include "data/pyliteral.h"
#include "infer/tools.h"
#include "fuzz_util.h"

/* The JSON arguments of "NAME\n" + content read as a response (NULL when it is not a call). */
static char *read_back(const char *content) {
    size_t n = strlen(content);
    char *text = malloc(n + 3);
    memcpy(text, "f\n", 2);
    memcpy(text + 2, content, n + 1);
    char *name = NULL, *args = NULL;
    int ok = glm_tool_call_read(text, &name, &args);
    free(text);
    if (ok) FUZZ_CHECK(name && !strcmp(name, "f"), "the name came back as %s", name ? name : "NULL");
    free(name);
    return ok ? args : NULL;
}

/* The same value to Python: json.dumps(json.loads(.)) of both alike (a key repeated in one, as
 * json.dumps writes {1: a, '1': b}, merges as json.loads merges it). */
static void same_json(const char *a, const char *b) {
    char w1[128], w2[128];
    char *x = glm_pyjson_dumps(a, strlen(a), -1, w1, sizeof w1), *y = glm_pyjson_dumps(b, strlen(b), -1, w2, sizeof w2);
    FUZZ_CHECK(x && y && !strcmp(x, y), "%s\nvs\n%s", a, b);
    free(x);
    free(y);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_cstr(data, size), why[256];
    size_t n = strlen(text); /* up to the first NUL, as the server's strings */
    /* a call text -> arguments -> the call written back -> the same arguments */
    char *args = glm_py_call_kwargs_json(text, n, "tool_call", why, sizeof why);
    /* Infinity and NaN are what json.dumps writes for inf (1e999) and nan, outside JSON proper */
    if (args && (strstr(args, "Infinity") || strstr(args, "NaN"))) { free(args); args = NULL; why[0] = '-'; }
    if (args) {
        cJSON *o = cJSON_Parse(args);
        FUZZ_CHECK(cJSON_IsObject(o), "not a JSON object: %s", args);
        cJSON_Delete(o);
        /* GLM-4's way: the arguments' JSON after the name */
        char *c4 = glm4_tool_call_write(args, why, sizeof why), *name4, *args4;
        FUZZ_CHECK(c4, "GLM-4 write refused %s: %s", args, why);
        char *t4 = malloc(strlen(c4) + 3);
        sprintf(t4, "f\n%s", c4);
        char *const names[] = {"f"};
        if (!strstr(c4, "<|assistant|>")) {
            FUZZ_CHECK(glm4_tool_call_read(t4, names, 1, &name4, &args4), "GLM-4's written call did not read back:\n%s", t4);
            same_json(args, args4);
            free(name4);
            free(args4);
        }
        free(t4);
        free(c4);
        char *content = glm_tool_call_write(args, why, sizeof why);
        FUZZ_CHECK(content, "write refused %s: %s", args, why);
        /* an argument holding "<|assistant|>" splits the text as the demo splits it: no round trip */
        if (!strstr(content, "<|assistant|>")) {
            char *again = read_back(content);
            FUZZ_CHECK(again, "the written call did not read back:\n%s", content);
            same_json(args, again);
            free(again);
        }
        free(content);
        free(args);
    } else {
        FUZZ_CHECK(why[0], "refused without a reason");
    }
    /* a JSON value -> repr -> read as a Python literal -> the same value */
    char *dump = glm_pyjson_dumps(text, n, -1, why, sizeof why);
    char *rep = glm_pyjson_repr(text, n, why, sizeof why);
    FUZZ_CHECK(!dump == !rep, "dumps %s but repr %s", dump ? "reads" : "refuses", rep ? "reads" : "refuses");
    if (rep && !strstr(dump, "Infinity")) { /* repr(inf) is 'inf', which Python does not read back either */
        size_t k = strlen(rep);
        char *call = malloc(k + 16);
        snprintf(call, k + 16, "tool_call(x=%s)", rep);
        char *kw = glm_py_call_kwargs_json(call, strlen(call), "tool_call", why, sizeof why);
        FUZZ_CHECK(kw, "the repr %s did not read back: %s", rep, why);
        char *want = malloc(strlen(dump) + 16);
        sprintf(want, "{\"x\": %s}", dump);
        same_json(want, kw);
        char *lit = glm_py_literal_json(rep, strlen(rep), why, sizeof why);
        FUZZ_CHECK(lit, "the repr %s did not read as a literal: %s", rep, why);
        same_json(dump, lit);
        free(lit);
        free(want);
        free(kw);
        free(call);
    }
    free(dump);
    free(rep);
    /* a response text: a call or not, never a crash */
    char *name, *a2;
    if (glm_tool_call_read(text, &name, &a2)) { FUZZ_CHECK(name[0] && a2[0] == '{', "%s / %s", name, a2); free(name); free(a2); }
    char *const names[] = {"f", "get_weather"};
    if (glm4_tool_call_read(text, names, 2, &name, &a2)) {
        cJSON *o = cJSON_Parse(a2); /* json.dumps writes inf and nan outside JSON proper */
        FUZZ_CHECK((cJSON_IsObject(o) || strstr(a2, "Infinity") || strstr(a2, "NaN")) &&
                       (!strcmp(name, "f") || !strcmp(name, "get_weather")), "%s / %s", name, a2);
        cJSON_Delete(o);
        free(name);
        free(a2);
    }
    char *lit = glm_py_literal_json(text, n, why, sizeof why);
    FUZZ_CHECK(lit || why[0], "a literal refused without a reason");
    free(lit);
    char *sys = glm_tools_system_text(text, n, why, sizeof why);
    free(sys);
    for (int flags = 0; flags < 4; flags++) {
        why[0] = 0;
        char *block = glm4_tools_text(text, n, flags, why, sizeof why);
        FUZZ_CHECK(block ? !strncmp(block, GLM4_TOOLS_HEADER, strlen(GLM4_TOOLS_HEADER)) : why[0] != 0,
                   "flags %d: %s", flags, block ? block : "refused without a reason");
        free(block);
    }
    free(text);
    return 0;
}
