/* --config FILE.yaml: a YAML mapping of flag names to values (LLaMA-Factory's training configs
 * are flat ones), or with a command's key reading, nested ones (THUDM's finetune_demo configs),
 * through libyaml. See core/args.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>
#include "core/args.h"
#include "core/log.h"
#include "core/strbuf.h"

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

typedef struct yaml_reader {
    const glm_flag *f;
    int n;
    void *dst;
    const char *path;
    glm_config_key_fn keys;
    glm_err *err;
    char key[8][128]; /* the mapping keys down to the value being read */
    size_t line[8];
    int depth;        /* mappings open */
    int have_key[8];  /* the mapping at each depth has its key, its value is next */
    glm_strbuf list;  /* a sequence of scalars being read (joined with commas) */
    int in_list;
} yaml_reader;

/* The flag named `name`, or NULL. */
static const glm_flag *flag_named(const yaml_reader *y, const char *name) {
    for (int i = 0; i < y->n; i++) if (!strcmp(y->f[i].name, name)) return &y->f[i];
    return NULL;
}

/* The JSON-object flag whose mapping is open at depth 1, or NULL. */
static const glm_flag *json_parent(const yaml_reader *y) {
    const glm_flag *f = y->depth >= 1 ? flag_named(y, y->key[0]) : NULL;
    return f && f->type == ARG_JSON ? f : NULL;
}

/* One value for the key path key[0..depth): the flag it sets (through keys when given). */
static int set_value(yaml_reader *y, const char *v, size_t line) {
    char dotted[1024] = "", why[300] = "", where[600];
    for (int k = 0; k < y->depth; k++) {
        size_t at = strlen(dotted);
        snprintf(dotted + at, sizeof dotted - at, "%s%s", k ? "." : "", y->key[k]);
    }
    snprintf(where, sizeof where, "%s:%zu: ", y->path, line);
    const glm_flag *jf = y->depth == 2 ? json_parent(y) : NULL;
    if (jf) return glm_args_set_json_key(jf, y->dst, y->key[1], v, where, y->err); /* lr_scheduler_kwargs: {min_lr_rate: 0.1} */
    const char *name = dotted;
    if (y->keys) {
        name = y->keys(dotted, v, why, sizeof why);
        if (!name) return glm_fail(y->err, "%s%s: %s", where, dotted, why);
        if (!name[0]) { glm_info("%s%s is not used: %s", where, dotted, why); return 0; }
    } /* else flat: a nested value was refused where it opened */
    const glm_flag *fl = flag_named(y, name);
    if (!fl) {
        glm_fail(y->err, "%sunknown flag %s", where, dotted);
        const char *c = glm_args_closest(y->f, y->n, name);
        return c ? glm_hint(y->err, "did you mean %s?", c) : glm_hint(y->err, "run with --help to list the flags");
    }
    return v ? glm_args_set(fl, y->dst, v, where, y->err) : 0;
}

int glm_args_load_yaml(const glm_flag *f, int n, void *dst, const char *path, glm_config_key_fn keys, glm_err *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return glm_fail(err, "--config %s: cannot open", path);
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, fp);
    yaml_reader *y = calloc(1, sizeof *y);
    *y = (yaml_reader){.f = f, .n = n, .dst = dst, .path = path, .keys = keys, .err = err};
    int rc = 0, done = 0;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&p, &ev)) {
            rc = glm_fail(err, "%s:%zu:%zu: malformed YAML (%s)", path, p.problem_mark.line + 1, p.problem_mark.column + 1,
                          p.problem ? p.problem : "?");
            break;
        }
        size_t line = ev.start_mark.line + 1;
        int d = y->depth;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT: done = 1; break;
        case YAML_MAPPING_START_EVENT:
            if (y->in_list) { rc = glm_fail(err, "%s:%zu: %s: a list of mappings is not read here", path, line, y->key[d - 1]); break; }
            if (d > 0 && !y->have_key[d - 1]) { rc = glm_fail(err, "%s:%zu: a mapping as a key", path, line); break; }
            if (d >= 2 && json_parent(y)) { rc = glm_fail(err, "%s:%zu: %s: its values are scalars", path, line, y->key[0]); break; }
            if (d > 0 && !keys && !(d == 1 && json_parent(y))) {
                rc = glm_fail(err, "%s:%zu: %s: a nested value; the config is flat: one flag and its value a line", path,
                              y->line[d - 1], y->key[d - 1]);
                break;
            }
            if (d == 8) { rc = glm_fail(err, "%s:%zu: nested too deeply", path, line); break; }
            y->have_key[d] = 0;
            y->depth++;
            break;
        case YAML_MAPPING_END_EVENT:
            y->depth--;
            if (y->depth > 0) y->have_key[y->depth - 1] = 0; /* the parent's value is read */
            break;
        case YAML_SEQUENCE_START_EVENT:
            if (d == 0 || !y->have_key[d - 1] || y->in_list) {
                rc = glm_fail(err, "%s:%zu: the config must be a mapping of flag names to values", path, line);
                break;
            }
            if (!keys) {
                rc = glm_fail(err, "%s:%zu: %s: a list; the config is flat: one flag and its value a line", path,
                              y->line[d - 1], y->key[d - 1]);
                break;
            }
            y->in_list = 1;
            y->list.n = 0;
            glm_strbuf_put(&y->list, "", 0);
            break;
        case YAML_SEQUENCE_END_EVENT:
            y->in_list = 0;
            rc = set_value(y, y->list.s ? y->list.s : "", y->line[d - 1]);
            y->have_key[d - 1] = 0;
            break;
        case YAML_SCALAR_EVENT:
            if (d == 0) { rc = glm_fail(err, "%s:%zu: the config must be a mapping of flag names to values", path, line); break; }
            if (y->in_list) {
                if (y->list.n) glm_strbuf_put(&y->list, ",", 1);
                glm_strbuf_str(&y->list, (const char *)ev.data.scalar.value);
                break;
            }
            if (!y->have_key[d - 1]) {
                snprintf(y->key[d - 1], sizeof y->key[d - 1], "%s", (const char *)ev.data.scalar.value);
                y->line[d - 1] = line;
                y->have_key[d - 1] = 1;
                break;
            }
            y->have_key[d - 1] = 0;
            rc = set_value(y, plain_value(&ev), line);
            break;
        case YAML_ALIAS_EVENT: rc = glm_fail(err, "%s:%zu: YAML aliases are not read here", path, line); break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    free(y->list.s);
    free(y);
    yaml_parser_delete(&p);
    fclose(fp);
    return rc;
}
