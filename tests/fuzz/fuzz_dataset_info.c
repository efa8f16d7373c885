/* libFuzzer target: LLaMA-Factory's dataset_info.json as `--dataset a,b --dataset_dir DIR` reads
 * it (data/dataset_info.c). The input's first line is the --dataset value, the rest the file's
 * text; DIR holds two data files (d.json, e.jsonl) and a folder (sub) that entries may name.
 * Reading must fail with a message or give one source per name, in order, each naming a regular
 * file, with the entry's column names exactly as the file writes them (never cut) and a schema
 * that matches its formatting. The folder lives in /dev/shm (else /tmp); dataset_info.json is
 * rewritten for each input. */
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "data/dataset_info.h"
#include "fuzz_util.h"

static char dir[256], info_path[300], d_path[300], e_path[300], sub_path[300];
static int trace; /* GLM_FUZZ_TRACE=1: each input's outcome on stderr */

static void cleanup(void) {
    unlink(info_path);
    unlink(d_path);
    unlink(e_path);
    rmdir(sub_path);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    trace = getenv("GLM_FUZZ_TRACE") != NULL;
    snprintf(dir, sizeof dir, "%s/glm_fuzz_dsinfo.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) { perror("mkdtemp"); exit(1); }
    snprintf(info_path, sizeof info_path, "%s/dataset_info.json", dir);
    snprintf(d_path, sizeof d_path, "%s/d.json", dir);
    snprintf(e_path, sizeof e_path, "%s/e.jsonl", dir);
    snprintf(sub_path, sizeof sub_path, "%s/sub", dir);
    fuzz_write_file(d_path, "[]", 2);
    fuzz_write_file(e_path, "", 0);
    mkdir(sub_path, 0700);
    atexit(cleanup);
    return 0;
}

/* The n-th non-empty name of the comma list (spaces trimmed), as the reader takes them, into out. */
static int nth_name(const char *list, int n, char *out, size_t cap) {
    const char *p = list;
    for (int k = 0; *p;) {
        const char *e = strchr(p, ','), *end = e ? e : p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        if (b > a) {
            if (k++ == n) { snprintf(out, cap, "%.*s", (int)(b - a), a); return 0; }
        }
        if (!e) break;
        p = e + 1;
    }
    return -1;
}

/* A column setting of the entry: its string, def when absent or null. */
static const char *col_of(const cJSON *cols, const char *key, const char *def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cols, key);
    return v && cJSON_IsString(v) ? v->valuestring : def;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nl = memchr(data, '\n', size);
    if (!nl) return 0;
    char *names = fuzz_cstr(data, (size_t)(nl - data));
    fuzz_write_file(info_path, (const char *)nl + 1, size - (size_t)(nl - data) - 1);
    glm_data_source *src = NULL;
    int n = 0;
    glm_err err;
    err.msg[0] = 0;
    int rc = strlen(names) == (size_t)(nl - data) ? glm_dataset_info_sources(dir, names, &src, &n, &err) : -2;
    if (trace) fprintf(stderr, "rc %d, %d sources: %s\n", rc, n, rc ? err.msg : "");
    if (rc == -2) { free(names); return 0; } /* a NUL in the names: a command line cannot carry one */
    if (rc) {
        FUZZ_CHECK(err.msg[0], "refused without a message");
        FUZZ_CHECK(!src && n == 0, "refused but gave sources");
        free(names);
        return 0;
    }
    FUZZ_CHECK(n >= 1 && src, "accepted without a source");
    char *text = fuzz_cstr(nl + 1, size - (size_t)(nl - data) - 1);
    cJSON *info = cJSON_Parse(text);
    FUZZ_CHECK(cJSON_IsObject(info), "accepted a file that is not a JSON object");
    for (int i = 0; i < n; i++) {
        char name[4096];
        FUZZ_CHECK(nth_name(names, i, name, sizeof name) == 0, "more sources (%d) than names", n);
        FUZZ_CHECK(!strcmp(src[i].name, name), "source %d is named '%s', the list says '%s'", i, src[i].name, name);
        struct stat st;
        FUZZ_CHECK(stat(src[i].path, &st) == 0 && S_ISREG(st.st_mode), "source %s: %s is not a file", name, src[i].path);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(info, name), *cols = cJSON_GetObjectItemCaseSensitive(e, "columns");
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(e, "formatting");
        int sharegpt = cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "sharegpt");
        if (sharegpt) {
            FUZZ_CHECK(src[i].read.schema == GLM_SCHEMA_SHAREGPT, "sharegpt entry %s read as schema %d", name, (int)src[i].read.schema);
            continue;
        }
        static const char *const keys[5] = {"prompt", "query", "response", "history", "system"};
        static const char *const defs[5] = {"instruction", "input", "output", NULL, NULL};
        for (int k = 0; k < 5; k++) {
            const char *want = col_of(cols, keys[k], defs[k]);
            if (want) FUZZ_CHECK(!strcmp(src[i].col[k], want), "entry %s: column %s read as '%s', the file says '%s'", name, keys[k],
                                 src[i].col[k], want);
        }
        if (src[i].read.schema == GLM_SCHEMA_COLUMNS) {
            const glm_columns *c = &src[i].read.columns;
            FUZZ_CHECK(c->prompt && !strcmp(c->prompt, src[i].col[0]) && c->response && !strcmp(c->response, src[i].col[2]),
                       "entry %s: the reader's columns are not the entry's", name);
        } else {
            FUZZ_CHECK(src[i].read.schema == GLM_SCHEMA_ALPACA, "alpaca entry %s read as schema %d", name, (int)src[i].read.schema);
        }
    }
    char extra[8];
    FUZZ_CHECK(nth_name(names, n, extra, sizeof extra) != 0, "fewer sources (%d) than names", n);
    cJSON_Delete(info);
    free(text);
    free(src);
    free(names);
    return 0;
}
