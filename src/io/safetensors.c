/* safetensors reader: dtype table, f16/bf16 conversions, header validation, sharded lookup.
 * Data are read with pread at the offsets the header gives, so opening a 10 GB shard costs
 * one header read and reading one tensor touches only its bytes. Writing is in
 * safetensors_save.c. */
#include "io/safetensors.h"
#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "io/io_util.h"

/* The reference implementation refuses headers over 100 MB; a real one is a few hundred KB. */
#define ST_MAX_HEADER 100000000ull
/* JSON numbers are doubles: integers above 2^53 cannot be exact, so they cannot be offsets. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const char *const k_names[ST_NDTYPES] = {"F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL"};
static const size_t k_sizes[ST_NDTYPES] = {4, 2, 2, 8, 8, 4, 2, 1, 1, 1};

const char *st_dtype_name(st_dtype d) { return (unsigned)d < ST_NDTYPES ? k_names[d] : "?"; }
size_t st_dtype_size(st_dtype d) { return (unsigned)d < ST_NDTYPES ? k_sizes[d] : 0; }
int st_dtype_parse(const char *s, st_dtype *out) {
    for (int i = 0; i < ST_NDTYPES; i++)
        if (strcmp(s, k_names[i]) == 0) { *out = (st_dtype)i; return 0; }
    return -1;
}

/* ---- conversions ---- */
uint16_t st_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x1ff); /* NaN stays a (quiet) NaN */
    if (ax >= 0x47800000u) return sign | 0x7c00;                                /* >= 65536 (and Inf): Inf */
    if (ax >= 0x38800000u) {                                                    /* normal in f16 */
        uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);                           /* round to nearest even */
        return sign | (uint16_t)((r - 0x38000000u) >> 13);                      /* 65520.. rounds up to Inf */
    }
    /* f16 subnormal: value = q * 2^-24 with q = mant * 2^(e-126), rounded to nearest even. */
    uint32_t e = ax >> 23;
    if (e == 0) return sign; /* f32 subnormals are far below 2^-25 */
    uint32_t mant = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
    if (shift > 24) return sign;
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return sign | (uint16_t)q;
}

float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff, x;
    if (exp == 0) {
        float v = (float)mant * 5.9604644775390625e-8f; /* mant * 2^-24, exact */
        return sign ? -v : v;
    }
    if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp + 112) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, 4);
    return f;
}

uint16_t st_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* keep NaN quiet */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);                 /* overflow -> Inf, as RNE says */
}

float st_bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* ---- reading ---- */
typedef struct st_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t begin, end; /* absolute file offsets */
    int file;
} st_tensor;
_Static_assert(offsetof(st_tensor, name) == 0, "io_table_* read the name first");

struct st_reader {
    io_shards sh;
    st_tensor *t; /* sorted by name */
    int n;
};

static int cmp_begin(const void *a, const void *b) {
    uint64_t x = (*(const st_tensor *const *)a)->begin, y = (*(const st_tensor *const *)b)->begin;
    return x < y ? -1 : x > y;
}

static int json_uint(const cJSON *v, uint64_t *out) {
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!(d >= 0) || d >= ST_MAX_JSON_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Validates one header entry; fills t (offsets relative to the data region). */
static int parse_entry(const char *path, const cJSON *e, uint64_t data_len, st_tensor *t, glm_err *err) {
    const char *name = e->string;
    if (!cJSON_IsObject(e)) return glm_fail(err, "%s: tensor '%s': header entry is not an object", path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of))
        return glm_fail(err, "%s: tensor '%s': header entry needs \"dtype\" (string), \"shape\" and \"data_offsets\" (arrays)", path, name);
    if (st_dtype_parse(dt->valuestring, &t->dtype) != 0) {
        glm_fail(err, "%s: tensor '%s' has dtype %s, which glmtrain cannot read", path, name, dt->valuestring);
        return glm_hint(err, "supported dtypes: F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL; convert the checkpoint with safetensors in Python");
    }
    int nd = cJSON_GetArraySize(sh);
    if (nd > ST_MAX_DIMS) return glm_fail(err, "%s: tensor '%s' has %d dimensions (at most %d supported)", path, name, nd, ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    int i = 0;
    for (const cJSON *d = sh->child; d; d = d->next, i++) {
        uint64_t v;
        if (json_uint(d, &v) != 0) return glm_fail(err, "%s: tensor '%s': shape entry %d is not a non-negative integer", path, name, i);
        if (__builtin_mul_overflow(numel, v, &numel) || numel > ((uint64_t)1 << 60))
            return glm_fail(err, "%s: tensor '%s': shape is absurdly large (element count overflows)", path, name);
        t->shape[i] = (int64_t)v;
    }
    uint64_t b, en;
    if (cJSON_GetArraySize(of) != 2 || json_uint(of->child, &b) != 0 || json_uint(of->child->next, &en) != 0)
        return glm_fail(err, "%s: tensor '%s': data_offsets must be two non-negative integers [begin, end]", path, name);
    uint64_t want = numel * st_dtype_size(t->dtype); /* numel <= 2^60, size <= 8: no overflow */
    if (en < b) return glm_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin", path, name, (unsigned long long)b, (unsigned long long)en);
    if (en > data_len)
        return glm_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] lie past the end of the data (%llu bytes; truncated file?)", path, name,
                        (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_len);
    if (en - b != want) {
        char s[160];
        return glm_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes but shape %s of %s needs %llu", path, name,
                        (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b),
                        io_shape_str(s, sizeof s, nd, t->shape), k_names[t->dtype], (unsigned long long)want);
    }
    t->begin = b;
    t->end = en;
    return 0;
}

/* Parses and validates one file's header into *out (sorted by name; absolute offsets). */
static int parse_file(const char *path, int fd, int file_idx, st_tensor **out, int *nout, glm_err *err) {
    struct stat stt;
    if (fstat(fd, &stt) != 0 || !S_ISREG(stt.st_mode)) return glm_fail(err, "%s: not a regular file", path);
    uint64_t size = (uint64_t)stt.st_size, hlen;
    unsigned char lenb[8];
    if (size < 8 || io_pread_full(fd, lenb, 8, 0) != 0)
        return glm_fail(err, "%s: file is only %llu bytes, too short for a safetensors header", path, (unsigned long long)size);
    hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
    if (hlen > size - 8) {
        glm_fail(err, "%s: header length %llu is larger than the file (%llu bytes)", path, (unsigned long long)hlen, (unsigned long long)size);
        return glm_hint(err, "the file is truncated or not a safetensors file; re-download or re-save it");
    }
    if (hlen > ST_MAX_HEADER) return glm_fail(err, "%s: header length %llu exceeds the 100 MB limit; not a safetensors file?", path, (unsigned long long)hlen);
    char *text = glm_malloc(hlen + 1);
    if (io_pread_full(fd, text, hlen, 8) != 0) { free(text); return glm_fail(err, "%s: cannot read the %llu-byte header", path, (unsigned long long)hlen); }
    text[hlen] = 0;
    size_t lead = 0;
    while (lead < hlen && (text[lead] == ' ' || text[lead] == '\n' || text[lead] == '\r' || text[lead] == '\t')) lead++;
    const char *end = NULL;
    cJSON *root = lead < hlen && text[lead] == '{' ? cJSON_ParseWithLengthOpts(text, hlen, &end, 0) : NULL;
    int trailing = 0;
    if (root) for (const char *p = end; p < text + hlen; p++) trailing |= !(*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == 0);
    if (!root || trailing) {
        long at = end ? (long)(end - text) : (long)lead;
        cJSON_Delete(root);
        free(text);
        glm_fail(err, "%s: header is not a JSON object (error near header byte %ld)", path, at);
        return glm_hint(err, "the file is corrupt or not a safetensors file");
    }
    free(text);
    uint64_t data_start = 8 + hlen, data_len = size - data_start;
    int cap = cJSON_GetArraySize(root), n = 0;
    st_tensor *t = glm_calloc((size_t)cap + 1, sizeof *t);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (e->string && strcmp(e->string, "__metadata__") == 0) continue;
        if (!e->string || !e->string[0]) { glm_fail(err, "%s: header has a tensor with an empty name", path); goto fail; }
        if (parse_entry(path, e, data_len, &t[n], err) != 0) goto fail;
        t[n].name = glm_strdup(e->string);
        t[n].begin += data_start;
        t[n].end += data_start;
        t[n].file = file_idx;
        n++;
    }
    cJSON_Delete(root);
    root = NULL;
    /* Overlap check: sort by begin; each must start at or after the previous end. */
    st_tensor **by = glm_malloc(((size_t)n + 1) * sizeof *by);
    for (int i = 0; i < n; i++) by[i] = &t[i];
    qsort(by, (size_t)n, sizeof *by, cmp_begin);
    const st_tensor *last = NULL; /* the non-empty tensor reaching furthest so far */
    for (int i = 0; i < n; i++) {
        if (by[i]->end == by[i]->begin) continue; /* empty tensors occupy no bytes */
        if (last && by[i]->begin < last->end) {
            glm_fail(err, "%s: tensors '%s' and '%s' overlap in the data region (offsets [%llu, %llu] and [%llu, %llu])", path,
                     last->name, by[i]->name, (unsigned long long)(last->begin - data_start),
                     (unsigned long long)(last->end - data_start), (unsigned long long)(by[i]->begin - data_start),
                     (unsigned long long)(by[i]->end - data_start));
            free(by);
            goto fail;
        }
        if (!last || by[i]->end > last->end) last = by[i];
    }
    free(by);
    io_table_sort(t, n, sizeof *t);
    for (int i = 1; i < n; i++)
        if (strcmp(t[i].name, t[i - 1].name) == 0) { glm_fail(err, "%s: tensor '%s' appears twice in the header", path, t[i].name); goto fail; }
    *out = t;
    *nout = n;
    return 0;
fail:
    cJSON_Delete(root);
    io_table_free(t, n, sizeof *t);
    return -1;
}

static int parse_table(const char *path, int fd, int shard, void **table, int *n, glm_err *err) {
    st_tensor *t = NULL;
    int rc = parse_file(path, fd, shard, &t, n, err);
    *table = t;
    return rc;
}
static const io_table_format st_format = {sizeof(st_tensor), parse_table,
                                          "the index and the shards come from different saves; re-download them together"};

int st_open(st_reader **out, const char *path, glm_err *err) {
    *out = NULL;
    char buf[4096];
    const char *p = io_checkpoint_file(path, "model.safetensors.index.json", "model.safetensors", buf, sizeof buf, err);
    if (!p) return -1;
    st_reader *r = glm_calloc(1, sizeof *r);
    int rc;
    if (io_is_index(p)) {
        void *t = NULL;
        rc = io_index_gather(&r->sh, p, &st_format, &t, &r->n, err);
        r->t = t;
    } else {
        rc = io_shards_open(&r->sh, p, err) < 0 ? -1 : parse_file(p, r->sh.fds[0], 0, &r->t, &r->n, err);
    }
    if (rc != 0) { st_close(r); return -1; }
    *out = r;
    return 0;
}

void st_close(st_reader *r) {
    if (!r) return;
    io_shards_close(&r->sh);
    io_table_free(r->t, r->n, sizeof *r->t);
    free(r);
}

int st_count(const st_reader *r) { return r->n; }
const char *st_name(const st_reader *r, int i) { return i >= 0 && i < r->n ? r->t[i].name : NULL; }

int st_info(const st_reader *r, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]) {
    const st_tensor *t = io_table_find(r->t, r->n, sizeof *r->t, name);
    if (!t) return -1;
    if (dtype) *dtype = t->dtype;
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, sizeof t->shape);
    return 0;
}

static const st_tensor *lookup(st_reader *r, const char *name, glm_err *err) {
    const st_tensor *t = io_table_find(r->t, r->n, sizeof *r->t, name);
    if (!t) {
        glm_fail(err, "%s: tensor '%s' not found (%d tensors in the checkpoint)", r->sh.n ? r->sh.paths[0] : "?", name, r->n);
        glm_hint(err, "is this a checkpoint of the right model? list its tensors with `glmtrain info`");
    }
    return t;
}

int st_read_f32(st_reader *r, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err) {
    const st_tensor *t = lookup(r, name, err);
    if (!t) return -1;
    const char *path = r->sh.paths[t->file];
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        return glm_fail(err, "%s: tensor '%s' has shape %s, expected %s", path, name, io_shape_str(a, sizeof a, t->ndim, t->shape),
                        io_shape_str(b, sizeof b, ndim, shape));
    }
    if (!io_is_float(t->dtype)) return glm_fail(err, "%s: tensor '%s' has dtype %s, not a float type", path, name, k_names[t->dtype]);
    size_t n = (size_t)((t->end - t->begin) / st_dtype_size(t->dtype));
    if (io_read_f32(r->sh.fds[t->file], t->begin, t->dtype, n, dst) != 0)
        return glm_fail(err, "%s: tensor '%s': cannot read bytes [%llu, %llu): %s", path, name, (unsigned long long)t->begin,
                        (unsigned long long)t->end, errno ? strerror(errno) : "file is shorter than its header says (truncated?)");
    return 0;
}

int st_read_raw_at(st_reader *r, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err) {
    const st_tensor *t = lookup(r, name, err);
    if (!t) return -1;
    const char *path = r->sh.paths[t->file];
    if (t->dtype != dtype) return glm_fail(err, "%s: tensor '%s' has dtype %s, expected %s", path, name, k_names[t->dtype], st_dtype_name(dtype));
    if (off > t->end - t->begin || bytes > t->end - t->begin - off)
        return glm_fail(err, "%s: tensor '%s' holds %llu bytes, asked for [%llu, +%zu)", path, name,
                        (unsigned long long)(t->end - t->begin), (unsigned long long)off, bytes);
    if (io_pread_full(r->sh.fds[t->file], dst, bytes, t->begin + off) != 0)
        return glm_fail(err, "%s: tensor '%s': cannot read its data: %s", path, name, errno ? strerror(errno) : "file is truncated");
    return 0;
}

int st_read_raw(st_reader *r, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err) {
    const st_tensor *t = lookup(r, name, err);
    if (!t) return -1;
    if (t->dtype == dtype && t->end - t->begin != bytes)
        return glm_fail(err, "%s: tensor '%s' holds %llu bytes, expected %zu", r->sh.paths[t->file], name,
                        (unsigned long long)(t->end - t->begin), bytes);
    return st_read_raw_at(r, name, dtype, dst, 0, bytes, err);
}
