/* --config FILE.yaml: a flat YAML mapping of flag names to values (LLaMA-Factory's training
 * configs are such files), through libyaml. See core/args.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>
#include "core/args.h"

/* A plain (unquoted) YAML 1.1 scalar as the flag setters read it: booleans spelled out, null as
 * NULL (the flag keeps its default); a quoted scalar stays the text it is. */
static const char *plain_value(const yaml_event_t *ev) {
    const char *s = (const char *)ev->data.scalar.value;
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return s;
    static const char *const t[] = {"true", "yes", "on"}, *const f[] = {"false", "no", "off"};
    if (!s[0] || !strcmp(s, "~") || !strcasecmp(s, "null")) return NULL;
    for (int i = 0; i < 3; i++) {
        if (!strcasecmp(s, t[i])) return "true";
        if (!strcasecmp(s, f[i])) return "false";
    }
    return s;
}

int glm_args_load_yaml(const glm_flag *f, int n, void *dst, const char *path, glm_err *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return glm_fail(err, "--config %s: cannot open", path);
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, fp);
    int rc = 0, depth = 0, done = 0;
    char key[256] = "";
    int have_key = 0;
    size_t key_line = 0;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = glm_fail(err, "%s:%zu:%zu: malformed YAML (%s)", path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                          p.problem ? p.problem : "?");
            break;
        }
        size_t line = ev.start_mark.line + 1;
        char where[512];
        snprintf(where, sizeof where, "%s:%zu: ", path, line);
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_MAPPING_START_EVENT:
        case YAML_SEQUENCE_START_EVENT:
            if (depth == 0 && ev.type == YAML_MAPPING_START_EVENT) { depth = 1; break; }
            rc = have_key ? glm_fail(err, "%s:%zu: %s: a nested value; the config is flat: one flag and its value a line", path,
                                     key_line, key)
                          : glm_fail(err, "%sthe config must be a mapping of flag names to values", where);
            break;
        case YAML_SCALAR_EVENT:
            if (depth != 1) { rc = glm_fail(err, "%sthe config must be a mapping of flag names to values", where); break; }
            if (!have_key) {
                snprintf(key, sizeof key, "%s", (const char *)ev.data.scalar.value);
                have_key = 1;
                key_line = line;
                break;
            }
            have_key = 0;
            const char *v = plain_value(&ev);
            const glm_flag *fl = NULL;
            for (int i = 0; i < n && !fl; i++) if (!strcmp(f[i].name, key)) fl = &f[i];
            if (!fl) {
                glm_fail(err, "%sunknown flag %s", where, key);
                const char *c = glm_args_closest(f, n, key);
                rc = c ? glm_hint(err, "did you mean %s?", c) : glm_hint(err, "run with --help to list the flags");
                break;
            }
            if (v) rc = glm_args_set(fl, dst, v, where, err);
            break;
        case YAML_ALIAS_EVENT: rc = glm_fail(err, "%sYAML aliases are not read here", where); break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    fclose(fp);
    return rc;
}
