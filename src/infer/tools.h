/* ChatGLM3's tool calling, as its openai_api_demo (utils.py) does it: the request's tools in a
 * system turn, and the model's tool call, "NAME\n```python\ntool_call(k=v, ...)\n```" ended by
 * <|observation|>, read into a name and JSON arguments (and written back the same way when a
 * client sends the call again in the next request's history). */
#ifndef GLM_INFER_TOOLS_H
#define GLM_INFER_TOOLS_H
#include <stddef.h>

#define GLM_TOOLS_PREAMBLE "Answer the following questions as best as you can. You have access to the following tools:"

/* The system turn's text for the request's tools (tools_json: the JSON text of their list, as
 * given): GLM_TOOLS_PREAMBLE + "\n" + json.dumps(tools, indent=4, ensure_ascii=False), what
 * build_chat_input makes of a system turn with "tools". NULL with why on bad JSON. */
char *glm_tools_system_text(const char *tools_json, size_t len, char *why, size_t why_len);

/* Whether a response text is a tool call, read as process_response(text, use_tool=True): the
 * part after its last "<|assistant|>", whose first line is the tool's name and whose other lines
 * but the last (the code fence's) hold tool_call(k=v, ...) with Python literal values. 1 with
 * *name and *args (json.dumps(kwargs, ensure_ascii=False)) set, caller frees; 0 when it is not
 * one (the demo's eval fails): then the text is the answer. */
int glm_tool_call_read(const char *text, char **name, char **args);

/* A tool call's assistant turn back from its JSON arguments (an object): the content
 * "```python\ntool_call(k=repr(v), ...)\n```" (the turn's metadata is the name). NULL with why
 * when args is not a JSON object. */
char *glm_tool_call_write(const char *args_json, char *why, size_t why_len);

#endif
