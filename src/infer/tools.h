/* Tool calling as THUDM's OpenAI-style servers do it: the request's tools in a system turn, the
 * model's tool call read into a name and JSON arguments, and written back the same way when a
 * client sends the call again in the next request's history.
 *   ChatGLM3-6B (openai_api_demo, utils.py): "NAME\n```python\ntool_call(k=v, ...)\n```";
 *   GLM-4 (basic_demo/openai_api_server.py): "NAME\n{...}", the arguments' JSON (the tools'
 *   system turn is GLM-4's tools block, data/glm4_tools.h).
 * Both end the call with <|observation|>. */
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

/* GLM-4's tool call, read as its server's process_response(text, use_tool=True): the part after
 * the last "<|assistant|>", whose first line (stripped) is the tool's name and the rest (stripped)
 * its arguments, a dict as eval() reads it or, failing that, as JSON (what the tools block asks
 * the model for). Unlike the demo, the name must be one of names[n_names] and the arguments a
 * dict, so that an answer that happens to have a line break is not taken for a call. 1 with
 * *name and *args (json.dumps(value, ensure_ascii=False)) set, caller frees; 0: an answer. */
int glm4_tool_call_read(const char *text, char *const *names, int n_names, char **name, char **args);

/* A GLM-4 tool call's assistant turn back from its JSON arguments (an object): the content
 * json.dumps(json.loads(args), ensure_ascii=False) (the turn's metadata is the name). NULL with
 * why when args is not a JSON object. */
char *glm4_tool_call_write(const char *args_json, char *why, size_t why_len);

#endif
