/* LLaMA-Factory's dataset_info.json: `--dataset a,b --dataset_dir DIR` names entries of
 * DIR/dataset_info.json, each a local file with its formatting ("alpaca", the default, or
 * "sharegpt"), column names and sharegpt tags. They become data sources (data.h), read as
 * glmtrain reads those schemas: alpaca with LLaMA-Factory's default columns (instruction, input,
 * output, system, history) as the alpaca schema, other column names as the columns schema;
 * sharegpt records as sharegpt. What glmtrain cannot read as LLaMA-Factory does is refused
 * naming the entry and the key: hub datasets (hf_hub_url, ms_hub_url, script_url without
 * file_name), ranking (preference) data, a folder as file_name, image/video/tools/preference
 * columns, tags other than the role names glmtrain knows (from/role, value/content,
 * human/user, gpt/assistant, observation, system), a messages column other than conversations
 * or messages. */
#ifndef GLM_DATA_DATASET_INFO_H
#define GLM_DATA_DATASET_INFO_H
#include <string.h>
#include "core/err.h"
#include "data/data.h"
#include "data/examples.h"

/* The sources for names (comma-separated) in dir/dataset_info.json (*out: caller frees). */
int glm_dataset_info_sources(const char *dir, const char *names, glm_data_source **out, int *n, glm_err *err);

/* LLaMA-Factory's --template: glmtrain builds examples and prompts as the tokenizer's model does,
 * so the name (chatglm, chatglm2, chatglm3, glm4) only has to agree with the tokenizer's layout. */
int glm_lf_template_check(const char *name, glm_layout layout, glm_err *err);
/* Whether LLaMA-Factory's template `name` (NULL: none) is a reasoning model's (glmz1: GLM-Z1's
 * thoughts, examples.h reasoning). */
static inline int glm_lf_template_reasons(const char *name) { return name && strcmp(name, "glmz1") == 0; }

#endif
