/* Python literals read as the eval() of ChatGLM3's tool-call text reads them, written back as
 * json.dumps writes the value: ChatGLM3 answers a tool call with
 * "```python\ntool_call(city='北京', days=3)\n```", which its openai_api_demo evaluates (tool_call
 * returns its keyword arguments) and sends on as json.dumps(kwargs, ensure_ascii=False). */
#ifndef GLM_DATA_PYLITERAL_H
#define GLM_DATA_PYLITERAL_H
#include <stddef.h>

/* The keyword arguments of a call expression text[0..len) of the function `fn` (whitespace
 * around it allowed), each value a Python literal (str in any quotes with its escapes, int,
 * float, True/False/None, list, tuple, dict with str or int keys), as the JSON object
 * json.dumps(kwargs, ensure_ascii=False) writes. NULL with the reason in why when the text is
 * not such a call (another name, positional arguments, an expression that is not a literal). */
char *glm_py_call_kwargs_json(const char *text, size_t len, const char *fn, char *why, size_t why_len);

/* The Python literal text[0..len) (whitespace around it allowed; the values above) as json.dumps
 * writes it (ensure_ascii=False): what eval() of GLM-4's tool-call arguments gives. NULL with
 * why when the text is not one literal. */
char *glm_py_literal_json(const char *text, size_t len, char *why, size_t why_len);

/* Whether s[0..n) can name a keyword argument: an identifier (letters, digits, _, and non-ASCII
 * text in valid UTF-8; not starting with a digit) that is not one of Python's reserved words. */
int glm_py_is_identifier(const char *s, size_t n);

#endif
