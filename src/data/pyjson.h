/* Python's json.dumps, for the text ChatGLM3 puts in a prompt: build_chat_input appends
 * json.dumps(tools, indent=4, ensure_ascii=False) to a system turn. The dump is made from the
 * record's own JSON text, not from cJSON's tree, because Python keeps what cJSON drops: 1.0 is a
 * float ("1.0") and 1 an int ("1"), ints have every digit, a repeated key keeps its first place
 * with its last value. */
#ifndef GLM_DATA_PYJSON_H
#define GLM_DATA_PYJSON_H
#include <stddef.h>
#include "core/strbuf.h"

/* json.dumps(json.loads(text), indent=indent, ensure_ascii=False) of the JSON value in
 * text[0..len) (whitespace around it allowed). Returns the dump (caller frees), or NULL with the
 * reason in why: text Python's json would refuse or whose dump could not become UTF-8 (a lone
 * \ud800 surrogate). */
char *glm_pyjson_dumps(const char *text, size_t len, int indent, char *why, size_t why_len);
/* indent < 0: json.dumps(..., ensure_ascii=False) without one (", " and ": " separators, one line). */

/* repr(json.loads(text)) of the JSON value in text[0..len): strings in Python's quotes and
 * escapes, ints as written, floats as repr(float), True/False/None, [a, b], {'k': v}. Returns
 * the text (caller frees), or NULL with why as glm_pyjson_dumps. */
char *glm_pyjson_repr(const char *text, size_t len, char *why, size_t why_len);

/* The pieces of json.dumps(ensure_ascii=False) that other Python-compatible writers share: a
 * string with its quotes and escapes, and repr(float). */
void glm_py_json_string(glm_strbuf *b, const char *s, size_t n);
void glm_py_float_repr(glm_strbuf *b, double v);

/* The extent [*vs, *ve) (offsets into text) of the value of member `key` of the JSON object in
 * text[0..len) — the first such member, as cJSON finds it — or, with key NULL, of element idx of
 * the JSON array there. Returns 0, or -1 when there is no such value. */
int glm_json_locate(const char *text, size_t len, const char *key, int idx, size_t *vs, size_t *ve);
/* Member idx of the JSON object in text[0..len): its key's extent [*ks, *ke) (the quoted text as
 * written) and its value's [*vs, *ve). Returns 0, or -1 when there is no such member. */
int glm_json_member(const char *text, size_t len, int idx, size_t *ks, size_t *ke, size_t *vs, size_t *ve);

#endif
