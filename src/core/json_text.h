/* Edits of a JSON object's text that leave every other byte as written. A config.json that
 * goes through a parser and back loses what the parser does not keep: number literals
 * (1e-05 read as a float and printed back as 9.99999974737875e-06), key order, spacing. The
 * folders glmtrain writes carry the source's config.json over this way, changing only the
 * keys that describe the written weights. */
#ifndef GLM_JSON_TEXT_H
#define GLM_JSON_TEXT_H
#include <stddef.h>
#include "core/err.h"

struct cJSON;

/* A whole JSON document, a file's text (len bytes, NUL-terminated), parsed as Python's json.loads
 * takes one: a NUL byte, or anything but white space after the value, is an error as much as
 * malformed JSON, so that a file holding two objects, or junk after one, is never read as its
 * first part. NULL with err "src:line:col: ... (expected expected)". The caller deletes the result. */
struct cJSON *glm_json_parse_doc(const char *text, size_t len, const char *src, const char *expected, glm_err *err);
/* The same for a text that starts at line line0 of src (a JSON Lines record). */
struct cJSON *glm_json_parse_at(const char *text, size_t len, const char *src, int line0, const char *expected, glm_err *err);

/* A copy of `text` (a JSON object) with its top-level `key` set to `value` (JSON text, e.g.
 * "\"float16\"" or "128"): the old value's bytes are replaced where the key stands, or the key
 * is appended as the object's last member. NULL when text is not an object this scanner can
 * follow (the caller has parsed it already, so that means an unterminated string or bracket).
 * The caller frees the result. */
char *glm_json_set_key(const char *text, const char *key, const char *value);

/* A copy of `text` without its top-level `key` (and the comma that joined it); an unchanged
 * copy when the key is absent. NULL as above. */
char *glm_json_remove_key(const char *text, const char *key);

/* The shortest decimal that reads back as the same float (1e-05, 0.05), not the double
 * expansion of its binary value (9.99999974737875e-06, 0.05000000074505806). */
void glm_json_float(char *buf, size_t n, float v);

#endif
