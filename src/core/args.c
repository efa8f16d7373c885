#include "core/args.h"
#include "core/log.h"
#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/json_text.h"

static void *field(const glm_flag *f, void *dst) { return (char *)dst + f->offset; }

static int parse_bool(const char *v, int *out) {
    const char *t[] = {"true", "True", "TRUE", "1", "yes"}, *n[] = {"false", "False", "FALSE", "0", "no"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(v, t[i]) == 0) { *out = 1; return 0; }
        if (strcmp(v, n[i]) == 0) { *out = 0; return 0; }
    }
    return -1;
}

/* Index of v in "a|b|c", or -1. */
static int choice_index(const char *choices, const char *v) {
    size_t n = strlen(v);
    int i = 0;
    for (const char *p = choices; p && *p; i++) {
        const char *e = strchr(p, '|');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return i;
        p = e ? e + 1 : NULL;
    }
    return -1;
}
static int in_choices(const char *choices, const char *v) { return choice_index(choices, v) >= 0; }

/* The word for level k >= 2 of a boolean flag with levels ("full|selective|auto": 1 = full = true,
 * 2 = selective, ...), written into buf. */
static const char *level_word(const char *choices, int k, char *buf, size_t n) {
    const char *p = choices;
    for (int i = 1; i < k && p; i++) p = strchr(p, '|'), p = p ? p + 1 : NULL;
    if (!p) return NULL;
    const char *e = strchr(p, '|');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    snprintf(buf, n, "%.*s", (int)(len < n ? len : n - 1), p);
    return buf;
}

int glm_args_set(const glm_flag *f, void *dst, const char *v, const char *where, glm_err *err) {
    char *end;
    switch (f->type) {
    case ARG_STR:
        if (f->choices && !in_choices(f->choices, v))
            return glm_fail(err, "%s--%s: \"%s\" is not one of %s", where, f->name, v, f->choices);
        free(*(char **)field(f, dst));
        *(char **)field(f, dst) = glm_strdup(v);
        return 0;
    case ARG_INT:
    case ARG_LONG: {
        errno = 0;
        double d = strtod(v, &end);
        int huge = end != v && !*end && ((errno == ERANGE && fabs(d) > 1) || fabs(d) > 9e15);
        if (huge || (f->type == ARG_INT && end != v && !*end && !errno && fabs(d) > 2147483647.0))
            return glm_fail(err, "%s--%s: %s is out of range (a whole number of at most %s)", where, f->name, v,
                            f->type == ARG_INT ? "2147483647" : "9e15");
        if (end == v || *end || errno || d != floor(d))
            return glm_fail(err, "%s--%s: \"%s\" is not a whole number", where, f->name, v);
        if (f->type == ARG_INT) {
            *(int *)field(f, dst) = (int)d;
        } else {
            *(long *)field(f, dst) = (long)d;
        }
        return 0;
    }
    case ARG_FLOAT: {
        errno = 0;
        double d = strtod(v, &end);
        if (end == v || *end || errno || !isfinite(d)) return glm_fail(err, "%s--%s: \"%s\" is not a number", where, f->name, v);
        *(double *)field(f, dst) = d;
        return 0;
    }
    case ARG_JSON: {
        cJSON *o = cJSON_Parse(v);
        if (!cJSON_IsObject(o)) {
            cJSON_Delete(o);
            return glm_fail(err, "%s--%s: '%s' is not a JSON object", where, f->name, v),
                   glm_hint(err, "e.g. --%s '{\"name\": 0.1}'", f->name);
        }
        free(*(char **)field(f, dst));
        *(char **)field(f, dst) = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        return 0;
    }
    case ARG_BOOL: {
        int b;
        if (parse_bool(v, &b) == 0) { *(int *)field(f, dst) = b; return 0; }
        if (f->choices && (b = choice_index(f->choices, v)) >= 0) { *(int *)field(f, dst) = b + 1; return 0; }
        if (f->choices) return glm_fail(err, "%s--%s: \"%s\" is not true, false or one of %s", where, f->name, v, f->choices);
        return glm_fail(err, "%s--%s: \"%s\" is not true or false", where, f->name, v);
    }
    }
    return -1;
}

void glm_args_defaults(const glm_flag *f, int n, void *dst) {
    for (int i = 0; i < n; i++) {
        switch (f[i].type) {
        case ARG_STR:
        case ARG_JSON: *(char **)field(&f[i], dst) = f[i].def ? glm_strdup(f[i].def) : NULL; break;
        case ARG_INT: *(int *)field(&f[i], dst) = f[i].def ? atoi(f[i].def) : 0; break;
        case ARG_LONG: *(long *)field(&f[i], dst) = f[i].def ? atol(f[i].def) : 0; break;
        case ARG_FLOAT: *(double *)field(&f[i], dst) = f[i].def ? strtod(f[i].def, NULL) : 0; break;
        case ARG_BOOL: { int b = 0; if (f[i].def) parse_bool(f[i].def, &b); *(int *)field(&f[i], dst) = b; break; }
        }
    }
}

void glm_args_free(const glm_flag *f, int n, void *dst) {
    for (int i = 0; i < n; i++)
        if (f[i].type == ARG_STR || f[i].type == ARG_JSON) {
            free(*(char **)field(&f[i], dst));
            *(char **)field(&f[i], dst) = NULL;
        }
}

int glm_args_set_json_key(const glm_flag *f, void *dst, const char *key, const char *v, const char *where, glm_err *err) {
    const char *cur = *(char **)field(f, dst);
    cJSON *o = cJSON_Parse(cur ? cur : "{}"), *item;
    char *end;
    double d = v ? strtod(v, &end) : 0;
    if (!v) item = cJSON_CreateNull();
    else if (end != v && !*end && isfinite(d)) item = cJSON_CreateNumber(d);
    else if (!strcmp(v, "true") || !strcmp(v, "false")) item = cJSON_CreateBool(!strcmp(v, "true"));
    else item = cJSON_CreateString(v);
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddItemToObject(o, key, item);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    int rc = glm_args_set(f, dst, text, where, err);
    free(text);
    return rc;
}

static int lev(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

const char *glm_args_closest(const glm_flag *f, int n, const char *name) {
    const char *best = NULL;
    int bd = 1 << 30;
    for (int i = 0; i < n; i++) {
        int d = lev(name, f[i].name);
        if (strstr(f[i].name, name) && strlen(name) >= 4) d = d < 2 ? d : 2;
        if (d < bd) { bd = d; best = f[i].name; }
    }
    int limit = (int)strlen(name) / 3 + 1;
    return bd <= limit ? best : NULL;
}

static const glm_flag *find(const glm_flag *f, int n, const char *name) {
    for (int i = 0; i < n; i++) if (strcmp(f[i].name, name) == 0) return &f[i];
    return NULL;
}

static int unknown(const glm_flag *f, int n, const char *name, const char *where, glm_err *err) {
    glm_fail(err, "%sunknown flag --%s", where, name);
    const char *c = glm_args_closest(f, n, name);
    if (c) glm_hint(err, "did you mean --%s?", c);
    else glm_hint(err, "run with --help to list the flags");
    return -1;
}

static int load_config(const glm_flag *f, int n, void *dst, const char *path, glm_config_key_fn keys, glm_err *err) {
    size_t pl = strlen(path);
    if ((pl > 5 && !strcmp(path + pl - 5, ".yaml")) || (pl > 4 && !strcmp(path + pl - 4, ".yml")))
        return glm_args_load_yaml(f, n, dst, path, keys, err);
    size_t len;
    char *text = glm_read_file(path, &len, err);
    if (!text) return glm_hint(err, "--config takes a JSON file with the same keys as the flags");
    cJSON *o = glm_json_parse_doc(text, len, path, "--config JSON of flag names and values", err);
    free(text);
    if (!o) return glm_hint(err, "--config takes a JSON object with the same keys as the flags");
    if (!cJSON_IsObject(o)) { cJSON_Delete(o); return glm_fail(err, "--config %s: not a JSON object", path); }
    char where[512];
    snprintf(where, sizeof where, "%s: ", path);
    int rc = 0;
    for (cJSON *it = o->child; it && rc == 0; it = it->next) {
        const glm_flag *fl = find(f, n, it->string);
        char buf[64];
        const char *v = NULL;
        if (cJSON_IsString(it)) v = it->valuestring;
        else if (cJSON_IsBool(it)) v = cJSON_IsTrue(it) ? "true" : "false";
        else if (cJSON_IsNumber(it)) {
            if (it->valuedouble == floor(it->valuedouble) && fabs(it->valuedouble) < 1e15) snprintf(buf, sizeof buf, "%.0f", it->valuedouble);
            else snprintf(buf, sizeof buf, "%.17g", it->valuedouble);
            v = buf;
        } else if (cJSON_IsNull(it)) continue;
        else if (cJSON_IsObject(it) && fl && fl->type == ARG_JSON) {
            char *text = cJSON_PrintUnformatted(it);
            rc = glm_args_set(fl, dst, text, where, err);
            free(text);
            continue;
        } else { rc = glm_fail(err, "%s\"%s\" must be a string, number or boolean", where, it->string); break; }
        if (!fl && keys) { /* as on the command line */
            char why[300] = "";
            const char *to = keys(it->string, v, why, sizeof why);
            if (!to && why[0]) { rc = glm_fail(err, "%s%s: %s", where, it->string, why); break; }
            if (to && !to[0]) { glm_info("%s%s is not used: %s", where, it->string, why); continue; }
            if (to) fl = find(f, n, to);
        }
        if (!fl) { rc = unknown(f, n, it->string, where, err); break; }
        rc = glm_args_set(fl, dst, v, where, err);
    }
    cJSON_Delete(o);
    return rc;
}

int glm_args_parse(const glm_flag *f, int n, void *dst, int argc, char **argv, glm_err *err) {
    return glm_args_parse_ex(f, n, dst, argc, argv, NULL, err);
}

int glm_args_parse_ex(const glm_flag *f, int n, void *dst, int argc, char **argv, glm_config_key_fn keys, glm_err *err) {
    /* --config first, so the command line overrides the file */
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) return glm_fail(err, "--config needs a file");
            if (load_config(f, n, dst, argv[i + 1], keys, err)) return -1;
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            if (load_config(f, n, dst, argv[i] + 9, keys, err)) return -1;
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0)
            return glm_fail(err, "unexpected argument \"%s\" (flags start with --)", a);
        char name[128];
        const char *eq = strchr(a + 2, '='), *val = NULL;
        size_t len = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (len >= sizeof name) return glm_fail(err, "flag %s is too long", a);
        memcpy(name, a + 2, len);
        name[len] = 0;
        if (strcmp(name, "config") == 0) { if (!eq) i++; continue; }
        const glm_flag *fl = find(f, n, name);
        if (!fl && keys) { /* another tool's name for a flag, or a setting read and left alone */
            const char *v = eq ? eq + 1 : i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0 ? argv[i + 1] : NULL;
            char why[300] = "";
            const char *to = keys(name, v, why, sizeof why);
            if (!to && !why[0]) return unknown(f, n, name, "", err);
            if (!to) return glm_fail(err, "--%s%s%s: %s", name, v ? " " : "", v ? v : "", why), glm_hint(err, "leave it out");
            if (v && !eq) i++;
            if (!to[0]) { glm_info("--%s is not used: %s", name, why); continue; }
            fl = find(f, n, to);
            if (!fl) return unknown(f, n, name, "", err);
            if (why[0]) glm_info("--%s: %s", name, why);
            if (glm_args_set(fl, dst, v ? v : fl->type == ARG_BOOL ? "true" : "", "", err)) return -1;
            continue;
        }
        if (!fl) return unknown(f, n, name, "", err);
        if (eq) val = eq + 1;
        else if (fl->type == ARG_BOOL) {
            int b;
            /* a boolean with level words takes any next word as its value (a wrong one is named) */
            if (i + 1 < argc && (parse_bool(argv[i + 1], &b) == 0 || (fl->choices && strncmp(argv[i + 1], "--", 2) != 0)))
                val = argv[++i];
            else val = "true";
        } else if (i + 1 < argc && (strncmp(argv[i + 1], "--", 2) != 0 || fl->type == ARG_FLOAT || fl->type == ARG_INT)) {
            val = argv[++i];
        } else if (fl->bare_value) {
            val = fl->bare_value;
        } else {
            return glm_fail(err, "--%s needs a value", name);
        }
        if (glm_args_set(fl, dst, val, "", err)) return -1;
    }
    return 0;
}

char *glm_args_to_json(const glm_flag *f, int n, const void *dst) {
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < n; i++) {
        const void *p = (const char *)dst + f[i].offset;
        switch (f[i].type) {
        case ARG_STR: { const char *s = *(char *const *)p; if (s) cJSON_AddStringToObject(o, f[i].name, s); else cJSON_AddNullToObject(o, f[i].name); break; }
        case ARG_INT: cJSON_AddNumberToObject(o, f[i].name, *(const int *)p); break;
        case ARG_LONG: cJSON_AddNumberToObject(o, f[i].name, (double)*(const long *)p); break;
        case ARG_FLOAT: cJSON_AddNumberToObject(o, f[i].name, *(const double *)p); break;
        case ARG_JSON: {
            const char *s = *(char *const *)p;
            cJSON *v = s ? cJSON_Parse(s) : NULL;
            cJSON_AddItemToObject(o, f[i].name, v ? v : cJSON_CreateNull());
            break;
        }
        case ARG_BOOL: {
            char w[32];
            int k = *(const int *)p;
            if (k >= 2 && f[i].choices && level_word(f[i].choices, k, w, sizeof w)) cJSON_AddStringToObject(o, f[i].name, w);
            else cJSON_AddBoolToObject(o, f[i].name, k);
            break;
        }
        }
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

void glm_args_usage(const glm_flag *f, int n, const char *cmd) {
    printf("usage: glmtrain %s [--config FILE.json|FILE.yaml] [flags]\n\n", cmd);
    glm_args_list(f, n);
}

void glm_args_list(const glm_flag *f, int n) {
    for (int i = 0; i < n; i++) {
        const char *t = f[i].type == ARG_BOOL ? "" : f[i].type == ARG_STR ? " TEXT" : f[i].type == ARG_JSON ? " JSON" : f[i].type == ARG_FLOAT ? " X" : " N";
        char left[80];
        snprintf(left, sizeof left, "--%s%s", f[i].name, t);
        printf("  %-36s %s", left, f[i].help ? f[i].help : "");
        if (f[i].choices) printf(" [%s]", f[i].choices);
        if (f[i].def && f[i].def[0]) printf(" (default %s)", f[i].def);
        printf("\n");
    }
}
