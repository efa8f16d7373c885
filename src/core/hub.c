/* Hugging Face cache lookup of repository names (hub.h). */
#include "core/hub.h"
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "core/strbuf.h"

void glm_hub_cache_dir(char *out, size_t n) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) snprintf(out, n, "%s", v);
    else if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v) snprintf(out, n, "%s", v);
    else if ((v = getenv("HF_HOME")) && *v) snprintf(out, n, "%s/hub", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v) snprintf(out, n, "%s/huggingface/hub", v);
    else snprintf(out, n, "%s/.cache/huggingface/hub", (v = getenv("HOME")) && *v ? v : ".");
}

static int name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
}

static int word_char(char c) { return name_char(c) && c != '-' && c != '.'; }

/* huggingface_hub's repository names: [org/]name of letters, digits, '_', '-', '.', each part
 * beginning and ending with a letter, digit or '_', no "--" or "..", at most 96 characters.
 * Sets *slash to whether an org is given. */
static int repo_name(const char *s, int *slash) {
    size_t n = strlen(s);
    *slash = 0;
    if (n == 0 || n > 96 || strstr(s, "--") || strstr(s, "..")) return 0;
    const char *part = s;
    for (const char *p = s;; p++) {
        if (*p == '/' || *p == 0) {
            if (p == part || !word_char(part[0]) || !word_char(p[-1])) return 0;
            if (*p == 0) return 1;
            if (++*slash > 1) return 0;
            part = p + 1;
        } else if (!name_char(*p)) {
            return 0;
        }
    }
}

/* The only folder in dir/snapshots, into out; 0 when there is exactly one. */
static int only_snapshot(const char *repo, char *out, size_t n, int *count) {
    char snaps[4096];
    glm_path_join(snaps, sizeof snaps, repo, "snapshots");
    *count = 0;
    DIR *d = opendir(snaps);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[4096];
        glm_path_join(p, sizeof p, snaps, e->d_name);
        if (!glm_is_dir(p)) continue;
        if (++*count == 1) snprintf(out, n, "%s", p);
    }
    closedir(d);
    return *count == 1 ? 0 : -1;
}

int glm_hub_resolve(char **value, const char *flag, const char *revision, glm_err *err) {
    const char *v = *value;
    int org;
    if (!v || glm_is_dir(v) || glm_is_file(v) || !repo_name(v, &org)) return 0;
    const char *rev = revision && *revision ? revision : "main";
    if (strstr(rev, "..")) return glm_fail(err, "--%s %s: revision %s is not a branch, tag or commit", flag, v, rev);
    char cache[2048], repo[4096], folder[512] = "models--";
    glm_hub_cache_dir(cache, sizeof cache);
    for (const char *p = v; *p; p++) {
        size_t l = strlen(folder);
        if (*p == '/') snprintf(folder + l, sizeof folder - l, "--");
        else folder[l] = *p, folder[l + 1] = 0;
    }
    glm_path_join(repo, sizeof repo, cache, folder);
    char ref[4200], snap[4600] = "", commit[256] = "", how[300];
    snprintf(ref, sizeof ref, "%s/refs/%s", repo, rev);
    FILE *f = glm_is_file(ref) ? fopen(ref, "r") : NULL;
    if (f) {
        if (!fgets(commit, sizeof commit, f)) commit[0] = 0;
        fclose(f);
        commit[strcspn(commit, " \t\r\n")] = 0;
    } else {
        snprintf(commit, sizeof commit, "%s", rev); /* a commit given as the revision */
    }
    if (commit[0] && !strchr(commit, '/') && !strstr(commit, "..")) {
        snprintf(snap, sizeof snap, "%s/snapshots/%s", repo, commit);
        if (!glm_is_dir(snap)) snap[0] = 0;
    }
    snprintf(how, sizeof how, f ? "refs/%s" : "revision %s", rev);
    int count = 0;
    if (!snap[0] && !f && !(revision && *revision) && only_snapshot(repo, snap, sizeof snap, &count) == 0)
        snprintf(how, sizeof how, "its only snapshot (no refs/main)");
    if (!snap[0]) {
        if (!glm_is_dir(repo) && !org) return 0; /* a bare word that is no model of the cache: the caller's error */
        if (glm_is_dir(repo))
            glm_fail(err, "--%s %s: the Hugging Face cache has %s, but no snapshot of %s%s", flag, v, repo,
                     revision && *revision ? "revision " : "main", revision && *revision ? rev : count > 1 ? " (several snapshots, no refs/main)" : "");
        else
            glm_fail(err, "--%s %s is no folder here, and the Hugging Face cache (%s) has no model of that name", flag, v, cache);
        return glm_hint(err, "glmtrain downloads nothing: fetch it first (huggingface-cli download %s%s%s --local-dir DIR, or "
                             "from ModelScope) and pass DIR; HF_HUB_CACHE or HF_HOME name another cache", v,
                        revision && *revision ? " --revision " : "", revision && *revision ? rev : "");
    }
    glm_info("--%s %s: the Hugging Face cache's snapshot %s (%s)", flag, v, snap, how);
    free(*value);
    *value = glm_strdup(snap);
    return 0;
}

int glm_hub_resolve_list(char **value, const char *flag, glm_err *err) {
    const char *v = *value;
    if (!v || !strchr(v, ',') || glm_is_dir(v) || glm_is_file(v)) return glm_hub_resolve(value, flag, NULL, err);
    glm_strbuf out = {0};
    int rc = 0;
    for (const char *p = v; rc == 0;) {
        size_t len = strcspn(p, ",");
        const char *a = p, *b = p + len;
        while (a < b && isspace((unsigned char)*a)) a++; /* LLaMA-Factory strips each name */
        while (b > a && isspace((unsigned char)b[-1])) b--;
        if (a == b) {
            rc = glm_fail(err, "--%s %s: an empty name in the list", flag, v);
            glm_hint(err, "a list of adapters is comma-separated folders, e.g. --%s first,second", flag);
            break;
        }
        char *item = glm_strndup(a, (size_t)(b - a));
        rc = glm_hub_resolve(&item, flag, NULL, err);
        if (rc == 0) {
            if (out.n) glm_strbuf_put(&out, ",", 1);
            glm_strbuf_str(&out, item);
        }
        free(item);
        if (!p[len]) break;
        p += len + 1;
    }
    if (rc) { free(out.s); return -1; }
    free(*value);
    *value = out.s;
    return 0;
}

int glm_hub_name_of(const char *path, char *out, size_t n) {
    const char *m = NULL;
    for (const char *p = strstr(path, "models--"); p; p = strstr(p + 1, "models--"))
        if (p == path || p[-1] == '/') m = p; /* the last component that starts so */
    if (!m) return -1;
    const char *end = strchr(m, '/');
    if (!end || strncmp(end, "/snapshots/", 11) || !end[11] || end[11] == '/') return -1;
    char name[256];
    size_t k = 0;
    for (const char *p = m + 8; p < end && k + 1 < sizeof name; p++) {
        if (p[0] == '-' && p[1] == '-') { name[k++] = '/'; p++; }
        else name[k++] = *p;
    }
    name[k] = 0;
    int org;
    if (!repo_name(name, &org)) return -1;
    snprintf(out, n, "%s", name);
    return 0;
}
