/* GLM-4's tools block: the system turn glm-4-9b-chat's chat template writes for a message that
 * carries "tools" (Hugging Face renders the template with trim_blocks, which takes the first line
 * end after each tool's {% if %}; its tojson is json.dumps(ensure_ascii=False, indent=4) in the
 * given key order). Its finetune_demo (finetune.py process_message) first drops the null entries
 * of each function's parameters.properties; its openai_api_server sends a request's tools as
 * they come. */
#ifndef GLM_DATA_GLM4_TOOLS_H
#define GLM_DATA_GLM4_TOOLS_H
#include <stddef.h>

#define GLM4_TOOLS_HEADER                                                                                      \
    "你是一个名为 ChatGLM 的人工智能助手。你是基于智谱AI训练的语言模型 GLM-4 模型开发的，"                    \
    "你的任务是针对用户的问题和要求提供适当的答复和支持。"
#define GLM4_TOOLS_TITLE "\n\n# 可用工具"
#define GLM4_TOOL_SUFFIX "\n在调用上述函数时，请使用 Json 格式表示调用的参数。"

enum {
    GLM4_TOOLS_FUNCTIONS = 1,       /* the list holds function objects (OpenAI's older "functions") */
    GLM4_TOOLS_DROP_NULL_PROPS = 2, /* finetune.py's process_message */
};

/* The block's text for the JSON list tools_json[0..len): GLM4_TOOLS_HEADER + GLM4_TOOLS_TITLE,
 * then for each {"type": "function", "function": F}: "\n## " + F.name + "\n\n" + F's dump +
 * GLM4_TOOL_SUFFIX. The template's own texts for its built-in tools (python, simple_browser,
 * cogview) are not written: such a tool, another type, or a function without a string name is
 * refused. NULL with why. */
char *glm4_tools_text(const char *tools_json, size_t len, int flags, char *why, size_t why_len);

#endif
