/* Table-driven command-line flags with Hugging Face TrainingArguments names. One table per
 * subcommand maps "--name" to a field of a settings struct (by offset); the same keys are
 * accepted from a JSON file, or a flat YAML file (LLaMA-Factory's configs: FILE.yaml / .yml),
 * with --config, and the effective settings print as JSON.
 * Accepted forms: --name value, --name=value, and for booleans --name alone, --name true|false
 * (or one of its level words).
 * An unknown flag is an error suggesting the closest known name. */
#ifndef GLM_CORE_ARGS_H
#define GLM_CORE_ARGS_H
#include <stddef.h>
#include "core/err.h"

/* ARG_JSON: a JSON object, kept as its text (char *): on the command line as text
 * ('{"min_lr_rate": 0.1}'), in a --config JSON file as an object, in YAML as a mapping. */
typedef enum { ARG_STR, ARG_INT, ARG_LONG, ARG_FLOAT, ARG_BOOL, ARG_JSON } glm_arg_type;

typedef struct glm_flag {
    const char *name;       /* without the leading "--" */
    glm_arg_type type;
    size_t offset;          /* offsetof(settings struct, field) */
    const char *def;        /* default as text (NULL: empty string / 0) */
    const char *help;
    const char *choices;    /* "a|b|c" for strings with a fixed set of values, or NULL; for a boolean,
                             * the words of its levels: "full|selective" makes full = true = 1,
                             * selective = 2 (false is 0) */
    const char *bare_value; /* value a string flag takes when given without one (e.g. "latest") */
} glm_flag;

/* Fills every field of dst with its default. */
void glm_args_defaults(const glm_flag *f, int n, void *dst);
/* Frees the text fields (ARG_STR, ARG_JSON) glm_args_defaults and the parser made. */
void glm_args_free(const glm_flag *f, int n, void *dst);
/* Sets key `key` of the ARG_JSON flag f's object to the scalar text v (a number, true/false,
 * or else a string; NULL: null): a nested YAML value. */
int glm_args_set_json_key(const glm_flag *f, void *dst, const char *key, const char *v, const char *where, glm_err *err);
/* Parses argv[0..argc) (flags only, no subcommand). "--config FILE" loads keys from JSON first,
 * then the command line overrides them. Returns 0, or -1 with err naming the flag. */
int glm_args_parse(const glm_flag *f, int n, void *dst, int argc, char **argv, glm_err *err);
/* A command's reading of keys other than its flag names, in a config file (nested keys come
 * dotted, "training_args.output_dir", a list of scalars joined with commas) and, as --key, on
 * the command line; value is the key's text (NULL: none given, a bare --key). Returns the flag
 * the key sets (the key itself for a flag name), "" for a key that is read and left alone
 * (*why says why: printed), or NULL when it cannot be used (*why says why: an error; an empty
 * *why on the command line: an unknown flag). */
typedef const char *(*glm_config_key_fn)(const char *key, const char *value, char *why, size_t why_len);

/* --config FILE.yaml (args_yaml.c, libyaml): a mapping of flag names to values; a plain null
 * leaves the default, yes/no/on/off are booleans. Nested values only through keys (NULL: the
 * file must be flat). 0, or -1 with err naming file:line. */
int glm_args_load_yaml(const glm_flag *f, int n, void *dst, const char *path, glm_config_key_fn keys, glm_err *err);
/* glm_args_parse with a config key reading (NULL: flag names only). */
int glm_args_parse_ex(const glm_flag *f, int n, void *dst, int argc, char **argv, glm_config_key_fn keys, glm_err *err);
/* Sets one flag from text (used by the parser and by --config). */
int glm_args_set(const glm_flag *f, void *dst, const char *value, const char *where, glm_err *err);
/* Effective settings as a JSON object text (caller frees). */
char *glm_args_to_json(const glm_flag *f, int n, const void *dst);
void glm_args_usage(const glm_flag *f, int n, const char *cmd);
/* The flags alone, a line each (glm_args_usage without its first line). */
void glm_args_list(const glm_flag *f, int n);
/* The closest known flag name to `name` (Levenshtein), or NULL when nothing is close. */
const char *glm_args_closest(const glm_flag *f, int n, const char *name);

#endif
