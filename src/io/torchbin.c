/* torch .bin import: zip container (torchbin_zip.c) + data.pkl (torchbin_pickle.c) -> a table
 * of tensors pointing at their storage bytes in the archive; data are read on demand. */
#include "io/torchbin.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "io/io_util.h"
#include "io/torchbin_pickle.h"
#include "io/torchbin_zip.h"

#define TBIN_MAX_PICKLE ((uint64_t)256 << 20) /* ChatGLM's data.pkl is ~30 KB */

typedef struct tbin_tensor {
    char *name;
    st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS], stride[ST_MAX_DIMS];
    uint64_t data_off; /* file offset of the first element viewed (storage start + offset) */
    uint64_t numel;
    int file;
} tbin_tensor;
_Static_assert(offsetof(tbin_tensor, name) == 0, "io_table_* read the name first");

struct tbin_reader {
    io_shards sh;
    tbin_tensor *t; /* sorted by name */
    int n;
};


int tbin_is_archive(const char *path) {
    unsigned char m[4];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int ok = io_pread_full(fd, m, 4, 0) == 0 && memcmp(m, "PK\3\4", 4) == 0;
    close(fd);
    return ok;
}

static int check_magic(int fd, const char *path, glm_err *err) {
    unsigned char m[4] = {0};
    if (io_pread_full(fd, m, 4, 0) != 0) return glm_fail(err, "%s: file is too short to be a torch.save archive", path);
    if (memcmp(m, "PK\3\4", 4) == 0) return 0;
    if (m[0] == 0x80 && m[1] == 0x02 && m[2] == 0x8a) {
        glm_fail(err, "%s: legacy (pre-1.6, non-zip) torch.save format is not supported", path);
        return glm_hint(err, "re-save it with a current torch: torch.save(torch.load(p), p2), or convert it to safetensors");
    }
    glm_fail(err, "%s: not a torch.save zip archive (does not start with PK\\3\\4)", path);
    return glm_hint(err, "is this a git-lfs pointer file or an HTML error page? re-download the checkpoint");
}

/* Reads a small whole entry (data.pkl, byteorder) into a NUL-terminated buffer. */
static unsigned char *read_entry(const tz_archive *z, const tz_entry *e, glm_err *err) {
    uint64_t off;
    if (tz_locate(z, e, &off, err) != 0) return NULL;
    if (e->size > TBIN_MAX_PICKLE) { glm_fail(err, "%s: entry '%s' is %llu bytes, too large", z->path, e->name, (unsigned long long)e->size); return NULL; }
    unsigned char *b = glm_malloc((size_t)e->size + 1);
    if (io_pread_full(z->fd, b, (size_t)e->size, off) != 0) { free(b); glm_fail(err, "%s: cannot read entry '%s'", z->path, e->name); return NULL; }
    b[e->size] = 0;
    return b;
}

/* Finds <root>/data.pkl: the root is the folder of the first entry (torch puts everything
 * under one), else any "*\/data.pkl" in a single-folder layout. */
static const tz_entry *find_pickle(const tz_archive *z, char *root, size_t rn) {
    for (int i = 0; i < z->n; i++) {
        const char *nm = z->e[i].name, *sl = strchr(nm, '/');
        if (!sl || strcmp(sl, "/data.pkl") != 0 || (size_t)(sl - nm) >= rn) continue;
        snprintf(root, rn, "%.*s", (int)(sl - nm), nm);
        return &z->e[i];
    }
    return NULL;
}

/* Appends the tensor a storage failure belongs to (the message already names the file). */
static void name_tensor(glm_err *err, const char *tensor) {
    if (!err) return;
    size_t n = strlen(err->msg);
    snprintf(err->msg + n, sizeof err->msg - n, " (storage of tensor '%s')", tensor);
}

static int parse_archive(const char *path, int fd, int file_idx, tbin_tensor **out, int *nout, glm_err *err) {
    if (check_magic(fd, path, err) != 0) return -1;
    tz_archive z;
    if (tz_open(&z, fd, path, err) != 0) return -1;
    char root[512], name[700];
    tp_tensor *pt = NULL;
    tbin_tensor *t = NULL;
    int np = 0, n = 0, rc = -1;
    const tz_entry *pk = find_pickle(&z, root, sizeof root), *e;
    if (!pk) { glm_fail(err, "%s: zip archive has no <folder>/data.pkl; not a torch.save file", path); goto done; }
    snprintf(name, sizeof name, "%s/byteorder", root);
    if ((e = tz_find(&z, name)) && e->size < 16) {
        unsigned char *bo = read_entry(&z, e, err);
        if (!bo) goto done;
        int big = strncmp((char *)bo, "big", 3) == 0;
        free(bo);
        if (big) { glm_fail(err, "%s: saved on a big-endian machine; glmtrain reads little-endian archives only", path); goto done; }
    }
    unsigned char *pkl = read_entry(&z, pk, err);
    if (!pkl) goto done;
    int prc = tp_load(pkl, (size_t)pk->size, path, &pt, &np, err);
    free(pkl);
    if (prc != 0) goto done;
    t = glm_calloc((size_t)np + 1, sizeof *t);
    for (; n < np; n++) {
        const tp_tensor *p = &pt[n];
        size_t esz = st_dtype_size(p->dtype);
        snprintf(name, sizeof name, "%s/data/%s", root, p->key);
        uint64_t off;
        if (!(e = tz_find(&z, name))) { glm_fail(err, "%s: tensor '%s': storage entry '%s' is missing from the archive", path, p->name, name); goto done; }
        if (tz_locate(&z, e, &off, err) != 0) { name_tensor(err, p->name); goto done; }
        if (e->size / esz < p->storage_numel) {
            glm_fail(err, "%s: tensor '%s': storage '%s' holds %llu bytes but the pickle claims %llu %s elements (%llu bytes)", path, p->name,
                     name, (unsigned long long)e->size, (unsigned long long)p->storage_numel, st_dtype_name(p->dtype),
                     (unsigned long long)(p->storage_numel * esz));
            goto done;
        }
        tbin_tensor *q = &t[n];
        q->name = glm_strdup(p->name);
        q->dtype = p->dtype;
        q->ndim = p->ndim;
        memcpy(q->shape, p->shape, sizeof q->shape);
        memcpy(q->stride, p->stride, sizeof q->stride);
        q->data_off = off + p->offset * esz; /* offset < storage_numel: inside the entry */
        q->numel = 1;
        for (int d = 0; d < q->ndim; d++) q->numel *= (uint64_t)q->shape[d];
        q->file = file_idx;
    }
    io_table_sort(t, n, sizeof *t);
    for (int i = 1; i < n; i++)
        if (strcmp(t[i].name, t[i - 1].name) == 0) { glm_fail(err, "%s: tensor '%s' appears twice", path, t[i].name); goto done; }
    *out = t;
    *nout = n;
    t = NULL;
    n = 0;
    rc = 0;
done:
    io_table_free(t, n, sizeof *t);
    tp_free(pt, np);
    tz_free(&z);
    return rc;
}

static int parse_table(const char *path, int fd, int shard, void **table, int *n, glm_err *err) {
    tbin_tensor *t = NULL;
    int rc = parse_archive(path, fd, shard, &t, n, err);
    *table = t;
    return rc;
}
static const io_table_format tbin_format = {sizeof(tbin_tensor), parse_table,
                                            "the index and the shards come from different downloads; fetch them again together"};

int tbin_open(tbin_reader **out, const char *path, glm_err *err) {
    *out = NULL;
    char buf[4096];
    const char *p = io_checkpoint_file(path, "pytorch_model.bin.index.json", "pytorch_model.bin", buf, sizeof buf, err);
    if (!p) return -1;
    tbin_reader *r = glm_calloc(1, sizeof *r);
    int rc;
    if (io_is_index(p)) {
        void *t = NULL;
        rc = io_index_gather(&r->sh, p, &tbin_format, &t, &r->n, err);
        r->t = t;
    } else
        rc = io_shards_open(&r->sh, p, err) < 0 ? -1 : parse_archive(p, r->sh.fds[0], 0, &r->t, &r->n, err);
    if (rc != 0) { tbin_close(r); return -1; }
    *out = r;
    return 0;
}

void tbin_close(tbin_reader *r) {
    if (!r) return;
    io_shards_close(&r->sh);
    io_table_free(r->t, r->n, sizeof *r->t);
    free(r);
}

int tbin_count(const tbin_reader *r) { return r->n; }
const char *tbin_name(const tbin_reader *r, int i) { return i >= 0 && i < r->n ? r->t[i].name : NULL; }

int tbin_info(const tbin_reader *r, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]) {
    const tbin_tensor *t = io_table_find(r->t, r->n, sizeof *r->t, name);
    if (!t) return -1;
    if (dtype) *dtype = t->dtype;
    if (ndim) *ndim = t->ndim;
    if (shape) memcpy(shape, t->shape, sizeof t->shape);
    return 0;
}

static const tbin_tensor *lookup(tbin_reader *r, const char *name, glm_err *err) {
    const tbin_tensor *t = io_table_find(r->t, r->n, sizeof *r->t, name);
    if (!t) {
        glm_fail(err, "%s: tensor '%s' not found (%d tensors in the checkpoint)", r->sh.n ? r->sh.paths[0] : "?", name, r->n);
        glm_hint(err, "is this a checkpoint of the right model? list its tensors with `glmtrain info`");
    }
    return t;
}

static int contiguous(const tbin_tensor *t) {
    int64_t want = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] != 1 && t->stride[d] != want) return 0; /* a size-1 dim's stride is never used */
        want *= t->shape[d];
    }
    return 1;
}

/* Reads the elements a strided view selects, row-major, into dst (numel * esz bytes): the
 * span of storage it touches is read once, then gathered. */
static int gather(tbin_reader *r, const tbin_tensor *t, unsigned char *dst) {
    size_t esz = st_dtype_size(t->dtype);
    uint64_t last = 0;
    for (int d = 0; d < t->ndim; d++) last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
    unsigned char *span = malloc((size_t)((last + 1) * esz));
    if (!span) { errno = ENOMEM; return -1; }
    if (io_pread_full(r->sh.fds[t->file], span, (size_t)((last + 1) * esz), t->data_off) != 0) { free(span); return -1; }
    int64_t idx[ST_MAX_DIMS] = {0};
    uint64_t off = 0;
    for (uint64_t i = 0; i < t->numel; i++) {
        memcpy(dst + i * esz, span + off * esz, esz);
        for (int d = t->ndim - 1; d >= 0; d--) { /* odometer over the multi-index */
            off += (uint64_t)t->stride[d];
            if (++idx[d] < t->shape[d]) break;
            off -= (uint64_t)t->stride[d] * (uint64_t)t->shape[d];
            idx[d] = 0;
        }
    }
    free(span);
    return 0;
}

static int read_fail(tbin_reader *r, const tbin_tensor *t, glm_err *err) {
    return glm_fail(err, "%s: tensor '%s': cannot read its data: %s", r->sh.paths[t->file], t->name,
                    errno ? strerror(errno) : "the file is shorter than its directory says (truncated?)");
}

int tbin_read_f32(tbin_reader *r, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err) {
    const tbin_tensor *t = lookup(r, name, err);
    if (!t) return -1;
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char a[160], b[160];
        return glm_fail(err, "%s: tensor '%s' has shape %s, expected %s", r->sh.paths[t->file], name, io_shape_str(a, sizeof a, t->ndim, t->shape),
                        io_shape_str(b, sizeof b, ndim, shape));
    }
    if (!io_is_float(t->dtype)) return glm_fail(err, "%s: tensor '%s' has dtype %s, not a float type", r->sh.paths[t->file], name, st_dtype_name(t->dtype));
    if (t->numel == 0) return 0;
    errno = 0;
    if (contiguous(t)) return io_read_f32(r->sh.fds[t->file], t->data_off, t->dtype, (size_t)t->numel, dst) == 0 ? 0 : read_fail(r, t, err);
    size_t esz = st_dtype_size(t->dtype);
    /* F32 gathers straight into dst; narrower types gather into the tail of dst, then widen
     * front to back (element i's source lies at or after byte i*4 of the output). */
    unsigned char *raw = (unsigned char *)dst + t->numel * (4 - (esz < 4 ? esz : 4));
    if (esz > 4) raw = malloc((size_t)(t->numel * esz));
    if (!raw || gather(r, t, raw) != 0) { if (esz > 4) free(raw); return read_fail(r, t, err); }
    io_to_f32(t->dtype, raw, dst, (size_t)t->numel);
    if (esz > 4) free(raw);
    return 0;
}

int tbin_contiguous(tbin_reader *r, const char *name) {
    glm_err e = {0};
    const tbin_tensor *t = lookup(r, name, &e);
    return t && contiguous(t);
}

int tbin_read_raw_at(tbin_reader *r, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err) {
    const tbin_tensor *t = lookup(r, name, err);
    if (!t) return -1;
    size_t total = t->numel * st_dtype_size(t->dtype);
    if (t->dtype != dtype) return glm_fail(err, "%s: tensor '%s' has dtype %s, expected %s", r->sh.paths[t->file], name, st_dtype_name(t->dtype), st_dtype_name(dtype));
    if (!contiguous(t)) return glm_fail(err, "%s: tensor '%s' is a strided view: read it whole", r->sh.paths[t->file], name);
    if (off > total || bytes > total - off)
        return glm_fail(err, "%s: tensor '%s' holds %zu bytes, asked for [%llu, +%zu)", r->sh.paths[t->file], name, total,
                        (unsigned long long)off, bytes);
    errno = 0;
    return io_pread_full(r->sh.fds[t->file], dst, bytes, t->data_off + off) == 0 ? 0 : read_fail(r, t, err);
}

int tbin_read_raw(tbin_reader *r, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err) {
    const tbin_tensor *t = lookup(r, name, err);
    if (!t) return -1;
    size_t esz = st_dtype_size(t->dtype);
    if (t->dtype != dtype) return glm_fail(err, "%s: tensor '%s' has dtype %s, expected %s", r->sh.paths[t->file], name, st_dtype_name(t->dtype), st_dtype_name(dtype));
    if (t->numel * esz != bytes) return glm_fail(err, "%s: tensor '%s' holds %llu bytes, expected %zu", r->sh.paths[t->file], name, (unsigned long long)(t->numel * esz), bytes);
    if (t->numel == 0) return 0;
    errno = 0;
    int rc = contiguous(t) ? io_pread_full(r->sh.fds[t->file], dst, bytes, t->data_off) : gather(r, t, dst);
    return rc == 0 ? 0 : read_fail(r, t, err);
}
