#include "io/io_util.h"
#include <fcntl.h>
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/json_text.h"

static int pread_serial(int fd, void *buf, size_t n, uint64_t off) {
    char *p = buf;
    while (n) {
        /* Linux caps one read near 2 GiB; stay well under it. */
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        if (off > (uint64_t)INT64_MAX) { errno = EINVAL; return -1; }
        ssize_t k = pread(fd, p, chunk, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) { errno = 0; return -1; }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* A model's tensors are 16-1000 MB each and sit in the page cache when a server restarts; one
 * thread copies them out at a fraction of what the memory system gives, so large reads are
 * split into pieces read by all threads (pread is positioned, so they share the descriptor). */
int io_pread_full(int fd, void *buf, size_t n, uint64_t off) {
    enum { PIECE = 8 << 20 };
    if (n < 4 * (size_t)PIECE) return pread_serial(fd, buf, n, off);
    long np = (long)((n + PIECE - 1) / PIECE);
    int bad = 0, bad_errno = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (long i = 0; i < np; i++) {
        size_t at = (size_t)i * PIECE, k = n - at < PIECE ? n - at : PIECE;
        if (pread_serial(fd, (char *)buf + at, k, off + at) != 0) {
            int e = errno;
#pragma omp critical(io_pread_fail)
            if (!bad) { bad = 1; bad_errno = e; }
        }
    }
    if (bad) { errno = bad_errno; return -1; }
    return 0;
}

static int nonfinite16(uint16_t h, st_dtype d) { return d == ST_F16 ? (h & 0x7c00) == 0x7c00 : (h & 0x7f80) == 0x7f80; }

/* Whether element i of src (dtype d, as stored) is one the scan looks for: NaN or infinity, or
 * (past_f16, F32 only) a finite value float16 cannot hold: 65520 and beyond round to infinity. */
static int is_bad(st_dtype d, const void *src, size_t i, int past_f16) {
    if (past_f16) { float f; memcpy(&f, (const char *)src + 4 * i, 4); return fabsf(f) >= 65520.0f && isfinite(f); }
    if (d == ST_F32) { uint32_t u; memcpy(&u, (const char *)src + 4 * i, 4); return (u & 0x7f800000u) == 0x7f800000u; }
    uint16_t h;
    memcpy(&h, (const char *)src + 2 * i, 2);
    return nonfinite16(h, d);
}

/* The first such element, or n: chunks scanned on every thread. */
static size_t first_bad(st_dtype d, const void *src, size_t n, int past_f16) {
    size_t first = n;
    enum { CH = 1 << 20 };
    long nch = (long)((n + CH - 1) / CH);
#pragma omp parallel for schedule(static) reduction(min : first)
    for (long c = 0; c < nch; c++) {
        size_t lo = (size_t)c * CH, hi = lo + CH < n ? lo + CH : n;
        for (size_t i = lo; i < hi; i++)
            if (is_bad(d, src, i, past_f16)) { if (i < first) first = i; break; }
    }
    return first;
}

size_t st_first_nonfinite(st_dtype d, const void *src, size_t n) { return first_bad(d, src, n, 0); }
size_t st_first_past_f16(const float *src, size_t n) { return first_bad(ST_F32, src, n, 1); }

int io_is_float(st_dtype d) { return d == ST_F32 || d == ST_F16 || d == ST_BF16 || d == ST_F64; }

int io_to_f32(st_dtype d, const void *src, float *dst, size_t n) {
    const unsigned char *s = src;
    switch (d) {
    case ST_F32: memmove(dst, src, n * 4); return 0;
    case ST_F16:
        for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = st_f16_to_f32(h); }
        return 0;
    case ST_BF16:
        for (size_t i = 0; i < n; i++) { uint16_t h; memcpy(&h, s + 2 * i, 2); dst[i] = st_bf16_to_f32(h); }
        return 0;
    case ST_F64:
        for (size_t i = 0; i < n; i++) { double v; memcpy(&v, s + 8 * i, 8); dst[i] = (float)v; }
        return 0;
    default: return -1;
    }
}

int io_read_f32(int fd, uint64_t off, st_dtype d, size_t n, float *dst) {
    if (d == ST_F32) return io_pread_full(fd, dst, n * 4, off); /* straight into place */
    if (!io_is_float(d)) { errno = EINVAL; return -1; }
    size_t esz = st_dtype_size(d), chunk = (size_t)1 << 18;
    unsigned char *buf = glm_malloc(chunk * esz);
    for (size_t i = 0; i < n; i += chunk) {
        size_t k = n - i < chunk ? n - i : chunk;
        if (io_pread_full(fd, buf, k * esz, off + (uint64_t)i * esz) != 0) { free(buf); return -1; }
        io_to_f32(d, buf, dst + i, k);
    }
    free(buf);
    return 0;
}

const char *io_shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

void io_index_free(io_index *ix) {
    for (int i = 0; i < ix->n; i++) { free(ix->names[i]); free(ix->files[i]); }
    free(ix->names);
    free(ix->files);
    memset(ix, 0, sizeof *ix);
}

/* A shard name from a downloaded index must stay inside the checkpoint folder. */
static int safe_rel_name(const char *s) {
    if (!s[0] || s[0] == '/') return 0;
    for (const char *p = s; *p; ) {
        const char *q = strchr(p, '/');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.') return 0;
        if (!q) break;
        p = q + 1;
    }
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int io_shards_open(io_shards *s, const char *path, glm_err *err) {
    for (int i = 0; i < s->n; i++) if (strcmp(s->paths[i], path) == 0) return i;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return glm_fail_open(path, errno, err);
    s->paths = glm_realloc(s->paths, (size_t)(s->n + 1) * sizeof *s->paths);
    s->fds = glm_realloc(s->fds, (size_t)(s->n + 1) * sizeof *s->fds);
    s->paths[s->n] = glm_strdup(path);
    s->fds[s->n] = fd;
    return s->n++;
}

void io_shards_close(io_shards *s) {
    for (int i = 0; i < s->n; i++) { close(s->fds[i]); free(s->paths[i]); }
    free(s->paths);
    free(s->fds);
    *s = (io_shards){0};
}

int io_index_load(io_index *ix, const char *index_path, glm_err *err) {
    memset(ix, 0, sizeof *ix);
    size_t len;
    char *text = glm_read_file(index_path, &len, err);
    if (!text) return -1;
    cJSON *root = glm_json_parse_doc(text, len, index_path, "a weight index {\"metadata\": ..., \"weight_map\": {name: file}}", err);
    free(text);
    if (!root) return glm_hint(err, "re-download the index file; it should hold {\"metadata\": ..., \"weight_map\": {name: file}}");
    cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return glm_fail(err, "%s: no \"weight_map\" object (expected {\"weight_map\": {tensor name: shard file}})", index_path);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", index_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
    int cap = cJSON_GetArraySize(wm);
    ix->names = glm_calloc((size_t)cap + 1, sizeof(char *));
    ix->files = glm_calloc((size_t)cap + 1, sizeof(char *));
    for (cJSON *e = wm->child; e; e = e->next) {
        if (!e->string || !cJSON_IsString(e) || !e->valuestring) {
            glm_fail(err, "%s: weight_map entry '%s' is not a file name string", index_path, e->string ? e->string : "?");
            goto fail;
        }
        if (!safe_rel_name(e->valuestring)) {
            glm_fail(err, "%s: tensor '%s' maps to '%s', which is outside the checkpoint folder", index_path, e->string, e->valuestring);
            goto fail;
        }
        char full[4096];
        glm_path_join(full, sizeof full, dir, e->valuestring);
        ix->names[ix->n] = glm_strdup(e->string);
        ix->files[ix->n] = glm_strdup(full);
        ix->n++;
    }
    cJSON_Delete(root);
    if (ix->n == 0) {
        io_index_free(ix);
        return glm_fail(err, "%s: weight_map is empty", index_path);
    }
    /* a key repeated in the JSON object would make two tensors of one name */
    char **sorted = glm_malloc((size_t)ix->n * sizeof *sorted);
    memcpy(sorted, ix->names, (size_t)ix->n * sizeof *sorted);
    qsort(sorted, (size_t)ix->n, sizeof *sorted, cmp_str);
    for (int i = 1; i < ix->n; i++)
        if (strcmp(sorted[i], sorted[i - 1]) == 0) {
            glm_fail(err, "%s: tensor '%s' appears twice in weight_map", index_path, sorted[i]);
            free(sorted);
            io_index_free(ix);
            return -1;
        }
    free(sorted);
    return 0;
fail:
    cJSON_Delete(root);
    io_index_free(ix);
    return -1;
}

static int cmp_first_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

void io_table_free(void *table, int n, size_t size) {
    for (int i = 0; i < n; i++) free(*(char **)((char *)table + (size_t)i * size));
    free(table);
}

void io_table_sort(void *table, int n, size_t size) { qsort(table, (size_t)n, size, cmp_first_name); }

const void *io_table_find(const void *table, int n, size_t size, const char *name) {
    return n ? bsearch(&name, table, (size_t)n, size, cmp_first_name) : NULL;
}

int io_index_gather(io_shards *sh, const char *index_path, const io_table_format *fmt, void **table, int *n,
                    glm_err *err) {
    *table = NULL;
    *n = 0;
    io_index ix;
    if (io_index_load(&ix, index_path, err) != 0) return -1;
    char *all = glm_calloc((size_t)ix.n + 1, fmt->size);
    void *ft = NULL;
    int fn = 0, m = 0, cur = -1, rc = -1;
    for (int i = 0; i < ix.n; i++) {
        int f = io_shards_open(sh, ix.files[i], err);
        if (f < 0) { glm_wrap(err, "%s lists tensor '%s' in a missing shard: ", index_path, ix.names[i]); goto done; }
        if (f != cur) {
            io_table_free(ft, fn, fmt->size);
            ft = NULL;
            fn = 0;
            if (fmt->parse(sh->paths[f], sh->fds[f], f, &ft, &fn, err) != 0) goto done;
            cur = f;
        }
        const void *t = io_table_find(ft, fn, fmt->size, ix.names[i]);
        if (!t) {
            glm_fail(err, "%s: tensor '%s' is listed in %s but missing from that shard", sh->paths[f], ix.names[i], index_path);
            glm_hint(err, "%s", fmt->mismatch_hint);
            goto done;
        }
        char *e = all + (size_t)m * fmt->size;
        memcpy(e, t, fmt->size);
        *(char **)e = glm_strdup(*(char *const *)t);
        m++;
    }
    qsort(all, (size_t)m, fmt->size, cmp_first_name); /* names are unique: io_index_load checked */
    rc = 0;
done:
    io_table_free(ft, fn, fmt->size);
    io_index_free(&ix);
    if (rc != 0) io_table_free(all, m, fmt->size);
    else { *table = all; *n = m; }
    return rc;
}

const char *io_checkpoint_file(const char *path, const char *index_name, const char *file_name, char *buf, size_t n,
                               glm_err *err) {
    if (!glm_is_dir(path)) return path;
    glm_path_join(buf, n, path, index_name);
    if (!glm_is_file(buf)) glm_path_join(buf, n, path, file_name);
    if (glm_is_file(buf)) return buf;
    glm_fail(err, "%s: no %s or %s in this folder", path, index_name, file_name);
    glm_hint(err, "point at the checkpoint folder or at the %s file itself", file_name);
    return NULL;
}

int io_is_index(const char *path) {
    size_t len = strlen(path);
    return len >= 5 && strcmp(path + len - 5, ".json") == 0;
}

