/* Edits of a JSON object's text that leave every other byte as written. A config.json that
 * goes through a parser and back loses what the parser does not keep: number literals
 * (1e-05 read as a float and printed back as 9.99999974737875e-06), key order, spacing. The
 * folders glmtrain writes carry the source's config.json over this way, changing only the
 * keys that describe the written weights. */
#ifndef GLM_JSON_TEXT_H
#define GLM_JSON_TEXT_H
#include <stddef.h>

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
