/* The Python-compatible readers and writers of ChatGLM3's tool calls, line by line, for
 * tests/py/test_tool_calls.py to compare with Python itself:
 *
 *   tool_pyliteral call|repr|write   each stdin line -> one output line: a JSON string of the
 *                                    result, or ERR (call: glm_py_call_kwargs_json(line,
 *                                    "tool_call"); repr: glm_pyjson_repr; write: glm_tool_call_write)
 *   tool_pyliteral tools|read        all of stdin -> glm_tools_system_text (a JSON string), or
 *                                    glm_tool_call_read's name and arguments (two JSON strings on
 *                                    two lines) or NONE */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/strbuf.h"
#include "data/pyjson.h"
#include "data/pyliteral.h"
#include "infer/tools.h"

static void out(const char *s) {
    if (!s) { puts("ERR"); return; }
    glm_strbuf b = {0};
    glm_py_json_string(&b, s, strlen(s));
    printf("%s\n", b.s);
    free(b.s);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    char why[256];
    if (!strcmp(mode, "tools") || !strcmp(mode, "read")) {
        glm_strbuf in = {0};
        char buf[4096];
        size_t k;
        while ((k = fread(buf, 1, sizeof buf, stdin)) > 0) glm_strbuf_put(&in, buf, k);
        glm_strbuf_put(&in, "", 0);
        if (!strcmp(mode, "tools")) {
            char *s = glm_tools_system_text(in.s, in.n, why, sizeof why);
            out(s);
            free(s);
        } else {
            char *name, *args;
            if (glm_tool_call_read(in.s, &name, &args)) { out(name); out(args); free(name); free(args); }
            else puts("NONE");
        }
        free(in.s);
        return 0;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (n && line[n - 1] == '\n') line[--n] = 0;
        char *s = !strcmp(mode, "call")    ? glm_py_call_kwargs_json(line, (size_t)n, "tool_call", why, sizeof why)
                  : !strcmp(mode, "repr")  ? glm_pyjson_repr(line, (size_t)n, why, sizeof why)
                  : !strcmp(mode, "write") ? glm_tool_call_write(line, why, sizeof why)
                                           : NULL;
        out(s);
        free(s);
    }
    free(line);
    return 0;
}
