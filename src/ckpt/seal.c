/* Checkpoint integrity (ckpt/checkpoint.h). Every writer (checkpoint.c for one process and
 * data parallelism, parallel/pipe/pipe_ckpt.c for pipeline stages) seals its tmp-checkpoint-N folder
 * with checksums.json as the last file before the rename: each file's size and XXH64. Sizes
 * are checked first, so a truncated file costs no read; the hashes take one streaming pass at
 * memory/disk speed (a 70 GB ChatGLM-6B checkpoint is read once). Also here: the run id that
 * keeps one run's checkpoints apart from another's, clean-up of what killed or failed saves
 * leave behind, and the size a checkpoint needs on disk. */
#define _XOPEN_SOURCE 700
#include "ckpt/checkpoint.h"
#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/log.h"
#include "data/hash.h"

/* What the hashes are, written into the manifest so a later change of method is detectable. */
#define HASH_NAME "xxh64-8MiB-chained"

static int reg_size(const char *path, long long *out) {
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return -1;
    *out = (long long)sb.st_size;
    return 0;
}

/* Adds the size and hash of every regular file of dir/sub ("" for dir itself) to files, under
 * "sub/name"; the folders of dir one level down too (a PiSSA adapter's pissa_init/). */
static int seal_files(const char *dir, const char *sub, cJSON *files, glm_err *err) {
    char here[4096];
    if (sub[0]) glm_path_join(here, sizeof here, dir, sub);
    else snprintf(here, sizeof here, "%s", dir);
    DIR *d = opendir(here);
    if (!d) return glm_fail(err, "cannot list %s: %s", here, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (e->d_name[0] == '.' || (!sub[0] && strcmp(e->d_name, GLM_CKPT_MANIFEST) == 0)) continue;
        char name[1024], path[4096], hex[17];
        if (sub[0]) snprintf(name, sizeof name, "%s/%s", sub, e->d_name);
        else snprintf(name, sizeof name, "%s", e->d_name);
        glm_path_join(path, sizeof path, dir, name);
        long long size;
        uint64_t h;
        if (reg_size(path, &size) != 0) {
            if (!sub[0] && glm_is_dir(path)) rc = seal_files(dir, name, files, err);
            continue;
        }
        if (glm_hash_file(path, 0, &h, err) != 0) { rc = -1; break; }
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        cJSON *f = cJSON_AddObjectToObject(files, name);
        cJSON_AddNumberToObject(f, "size", (double)size);
        cJSON_AddStringToObject(f, "xxh64", hex);
    }
    closedir(d);
    return rc;
}

int glm_checkpoint_seal(const char *dir, glm_err *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "hash", HASH_NAME);
    cJSON *files = cJSON_AddObjectToObject(root, "files");
    int rc = seal_files(dir, "", files, err);
    char *text = rc == 0 ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (rc) return glm_wrap(err, "sealing %s: ", dir);
    char path[4096];
    glm_path_join(path, sizeof path, dir, GLM_CKPT_MANIFEST);
    rc = glm_write_file_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

/* A checkpoint without checksums.json: one of an earlier glmtrain (1, nothing to verify) unless
 * its trainer_state.json is damaged or carries a run id (this version always seals: -1). */
static int unsealed(const char *dir, char *why, size_t n) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "trainer_state.json");
    glm_err e;
    char *text = glm_is_file(path) ? glm_read_file(path, NULL, &e) : NULL;
    if (!text) { snprintf(why, n, "not a checkpoint of glmtrain (no trainer_state.json)"); return -1; }
    cJSON *o = cJSON_Parse(text);
    free(text);
    int rc = !cJSON_IsObject(o) ? -1 : cJSON_GetObjectItem(o, "run_id") ? -2 : 1;
    cJSON_Delete(o);
    if (rc == -1) snprintf(why, n, "trainer_state.json is damaged (not a JSON object) and there is no %s", GLM_CKPT_MANIFEST);
    else if (rc == -2) snprintf(why, n, "%s is missing (this glmtrain always writes one: the checkpoint was altered)", GLM_CKPT_MANIFEST);
    else snprintf(why, n, "no %s (written by an earlier glmtrain): resumed without verifying it", GLM_CKPT_MANIFEST);
    return rc < 0 ? -1 : 1;
}

/* Every listed file is there with its size: truncation and missing files cost no read. */
static int check_sizes(const char *dir, const cJSON *files, char *why, size_t n) {
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        const cJSON *sz = cJSON_GetObjectItem(f, "size"), *h = cJSON_GetObjectItem(f, "xxh64");
        if (!cJSON_IsNumber(sz) || !cJSON_IsString(h)) {
            snprintf(why, n, "%s is damaged (entry %s has no size or xxh64)", GLM_CKPT_MANIFEST, f->string);
            return -1;
        }
        char path[4096];
        glm_path_join(path, sizeof path, dir, f->string);
        long long have;
        if (reg_size(path, &have) != 0) { snprintf(why, n, "%s is missing", f->string); return -1; }
        if (have != (long long)sz->valuedouble) {
            snprintf(why, n, "%s has %lld bytes where %s lists %lld (%s)", f->string, have, GLM_CKPT_MANIFEST,
                     (long long)sz->valuedouble, have < (long long)sz->valuedouble ? "truncated" : "overwritten");
            return -1;
        }
    }
    return 0;
}

static int check_hashes(const char *dir, const cJSON *files, char *why, size_t n) {
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        char path[4096];
        glm_path_join(path, sizeof path, dir, f->string);
        uint64_t h;
        glm_err e;
        if (glm_hash_file(path, 0, &h, &e) != 0) { snprintf(why, n, "%s", e.msg); return -1; }
        if (h != strtoull(cJSON_GetObjectItem(f, "xxh64")->valuestring, NULL, 16)) {
            snprintf(why, n, "%s does not match its checksum in %s (the file is damaged)", f->string, GLM_CKPT_MANIFEST);
            return -1;
        }
    }
    return 0;
}

int glm_checkpoint_verify(const char *dir, char *why, size_t n) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, GLM_CKPT_MANIFEST);
    if (!glm_is_file(path)) return unsealed(dir, why, n);
    glm_err e;
    char *text = glm_read_file(path, NULL, &e);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *files = cJSON_GetObjectItem(root, "files"), *hash = cJSON_GetObjectItem(root, "hash");
    int rc = -1;
    if (!cJSON_IsObject(files) || !files->child) snprintf(why, n, "%s is damaged (no file list)", GLM_CKPT_MANIFEST);
    else if (!cJSON_IsString(hash) || strcmp(hash->valuestring, HASH_NAME) != 0)
        snprintf(why, n, "%s uses hash %s, which this glmtrain does not know", GLM_CKPT_MANIFEST,
                 cJSON_IsString(hash) ? hash->valuestring : "(none)");
    else rc = check_sizes(dir, files, why, n) || check_hashes(dir, files, why, n) ? -1 : 0;
    cJSON_Delete(root);
    return rc;
}

void glm_run_id_new(char *out, size_t n) {
    uint64_t v = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    int got = f && fread(&v, sizeof v, 1, f) == 1;
    if (f) fclose(f);
    if (!got) { /* no /dev/urandom: the clock and the process are unique enough */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t mix[3] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid()};
        v = glm_xxh64(mix, sizeof mix, (uint64_t)(uintptr_t)out);
    }
    snprintf(out, n, "%016" PRIx64, v);
}

void glm_checkpoint_run_id(const char *dir, char *out, size_t n) {
    char path[4096];
    glm_path_join(path, sizeof path, dir, "trainer_state.json");
    out[0] = 0;
    glm_err e;
    char *text = glm_is_file(path) ? glm_read_file(path, NULL, &e) : NULL;
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    const cJSON *id = cJSON_GetObjectItem(o, "run_id");
    if (cJSON_IsString(id)) snprintf(out, n, "%s", id->valuestring);
    cJSON_Delete(o);
}

/* Removes the folders of output_dir whose names match `pattern` (a "%ld" pattern), logging each. */
static int remove_matching(const char *output_dir, const char *pattern, const char *why, glm_err *err) {
    DIR *d = opendir(output_dir);
    if (!d) return 0;
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        long s;
        char tail, path[4096];
        if (sscanf(e->d_name, pattern, &s, &tail) != 1) continue;
        glm_path_join(path, sizeof path, output_dir, e->d_name);
        if (!glm_is_dir(path)) continue;
        if (glm_remove_tree(path) != 0) {
            rc = glm_fail(err, "cannot remove %s: %s", path, strerror(errno));
            glm_hint(err, "delete it by hand, or use another --output_dir");
        } else {
            glm_info("removed %s: %s", path, why);
        }
    }
    closedir(d);
    return rc;
}

int glm_checkpoint_clean_stale(const char *output_dir, glm_err *err) {
    return remove_matching(output_dir, "tmp-checkpoint-%ld%c", "an unfinished checkpoint of an interrupted or failed save", err);
}

int glm_checkpoint_remove_all(const char *output_dir, glm_err *err) {
    return remove_matching(output_dir, "checkpoint-%ld%c", "a checkpoint of the previous run (--overwrite_output_dir)", err);
}

static double tokenizer_bytes(const char *tok) {
    long long s = 0, sum = 0;
    if (!tok) return 0;
    if (!glm_is_dir(tok)) return reg_size(tok, &s) == 0 ? (double)s : 0;
    static const char *const names[] = {"ice_text.model", "tokenizer.model", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        char path[4096];
        glm_path_join(path, sizeof path, tok, names[i]);
        if (reg_size(path, &s) == 0) sum += s;
    }
    return (double)sum;
}

/* rows of tab, `copies` times each at elem_bytes an element, with their header entries */
static double rows_bytes(const glm_table *tab, double copies, double elem_bytes) {
    double b = 0;
    for (int i = 0; i < tab->n; i++) b += copies * ((double)tab->t[i].numel * elem_bytes + strlen(tab->t[i].name) + 96);
    return b;
}

double glm_checkpoint_bytes(const glm_config *c, int opt_kinds, const char *tokenizer_path, size_t text_bytes) {
    glm_table tab; /* what a checkpoint holds of the model: the rows that train, in fp32 */
    glm_table_build_range(&tab, c, 0, c->num_layers, 1, 1);
    /* BAdam's: every row as stored instead (16-bit where a master copy is kept), the state of one layer */
    double b = rows_bytes(&tab, (c->peft.badam ? 0.0 : 1.0) + opt_kinds, 4);
    if (c->peft.galore_rank > 0) { /* GaLore: a projected row's moments are its projection's (optimizer_galore.safetensors) */
        size_t flat, low, scratch;
        glm_galore_state(c, &tab, &flat, &low, &scratch, NULL);
        for (int i = 0; i < tab.n; i++) b -= tab.t[i].galore ? 2.0 * (double)tab.t[i].numel * 4 : 0;
        b += (double)low * 4;
    }
    glm_table_free(&tab);
    if (c->peft.badam) {
        glm_table_build(&tab, c);
        b += rows_bytes(&tab, 1, opt_kinds == 3 ? 2 : 4);
        glm_table_free(&tab);
    }
    /* config.json, the manifest and the indexes of sharded writers: a few kB */
    return b + tokenizer_bytes(tokenizer_path) + (double)text_bytes + 16384;
}

double glm_final_model_bytes(const glm_config *c, int dtype_bytes, const char *tokenizer_path, size_t text_bytes) {
    glm_table tab;
    double b;
    if (c->peft.kind == GLM_FT_LORA || c->peft.kind == GLM_FT_PTUNING) { /* the adapter or prefix in fp32 (P-Tuning: twice, .bin too) */
        glm_table_build_range(&tab, c, 0, c->num_layers, 1, 1);
        b = rows_bytes(&tab, c->peft.kind == GLM_FT_PTUNING ? 2 : 1, 4);
    } else { /* the whole model as the original download: a tied head's copy too */
        glm_table_build(&tab, c);
        b = rows_bytes(&tab, 1, dtype_bytes);
        const glm_tensor *wte = glm_table_get(&tab, -1, T_WORD_EMB);
        if (c->tie_word_embeddings && wte) b += (double)wte->numel * dtype_bytes;
    }
    glm_table_free(&tab);
    return b + tokenizer_bytes(tokenizer_path) + (double)text_bytes + 16384;
}

int glm_checkpoint_abandon(const char *output_dir, const char *tmp, double need, glm_err *err) {
    if (tmp && glm_is_dir(tmp) && glm_remove_tree(tmp) != 0)
        glm_warn("could not remove %s after the failed save: delete it by hand", tmp);
    char needs[32], has[32];
    glm_fmt_bytes(needs, sizeof needs, need);
    double avail = glm_disk_free(output_dir);
    if (avail < 0) return glm_hint(err, "is the disk full? the checkpoint needs about %s", needs);
    glm_fmt_bytes(has, sizeof has, avail);
    if (avail < need)
        return glm_hint(err, "the disk is full: the checkpoint needs about %s and %s are free in %s; free space, "
                             "lower --save_total_limit or pick another --output_dir", needs, has, output_dir);
    return glm_hint(err, "the checkpoint needs about %s (%s are free in %s); nothing of the failed save was kept", needs, has,
                    output_dir);
}

/* The folder's current run: written at a fresh start and after a resume, read by resume, so a
 * run never continues from checkpoints another run (started later, or still running) put
 * there. */
#define RUN_FILE "run_id.txt"

int glm_output_run_id_write(const char *output_dir, const char *run_id, glm_err *err) {
    char path[4096], text[64];
    glm_path_join(path, sizeof path, output_dir, RUN_FILE);
    snprintf(text, sizeof text, "%s\n", run_id);
    return glm_write_file_atomic(path, text, strlen(text), err);
}

void glm_output_run_id(const char *output_dir, char *out, size_t n) {
    char path[4096];
    glm_path_join(path, sizeof path, output_dir, RUN_FILE);
    out[0] = 0;
    glm_err e;
    char *text = glm_is_file(path) ? glm_read_file(path, NULL, &e) : NULL;
    if (text) snprintf(out, n, "%.*s", (int)strcspn(text, " \r\n"), text);
    free(text);
}
