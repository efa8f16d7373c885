/* Model names of the Hugging Face Hub ("THUDM/chatglm-6b", as THUDM's train.sh and the guides
 * write --model_name_or_path) found in the local Hugging Face cache that transformers and
 * huggingface-cli download into, so a model already used from Python loads without a copy.
 * glmtrain downloads nothing: a name that is no path here and is not in the cache is an error
 * saying how to fetch it.
 *
 * The cache is $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (huggingface_hub's order).
 * A model lives in <cache>/models--<org>--<name>/snapshots/<commit>/, refs/<revision> holding the
 * commit of a branch or tag (main by default). */
#ifndef GLM_CORE_HUB_H
#define GLM_CORE_HUB_H
#include <stddef.h>
#include "core/err.h"

/* The cache folder by the environment, into out. */
void glm_hub_cache_dir(char *out, size_t n);

/* *value (a malloc'd flag value, may be NULL) when it is an existing path or no repository name:
 * unchanged, 0. A repository name ("org/name" or "name") found in the cache at revision (NULL:
 * main; a branch, tag or commit): *value becomes the snapshot's folder (logged), 0. An "org/name"
 * that is neither: -1 with err naming flag, the cache folder and the download command. */
int glm_hub_resolve(char **value, const char *flag, const char *revision, glm_err *err);

/* A comma list of such values (LLaMA-Factory's --adapter_name_or_path a,b), each item stripped
 * of spaces and resolved as glm_hub_resolve does (at main); one path or name: glm_hub_resolve.
 * An empty item is an error naming flag. */
int glm_hub_resolve_list(char **value, const char *flag, glm_err *err);

/* The repository name of a path inside a cache snapshot (".../models--THUDM--chatglm-6b/snapshots/
 * COMMIT[/...]" gives "THUDM/chatglm-6b") into out; 0, or -1 for any other path. What files meant
 * for other machines (an adapter's base_model_name_or_path) name the model by. */
int glm_hub_name_of(const char *path, char *out, size_t n);

#endif
