/* Zip reader for torch.save archives. Layout: [local header, data]*, central directory,
 * [zip64 end record, zip64 locator], end-of-central-directory (EOCD). All numbers are
 * little-endian; every length read from the file is checked against the file before use. */
#include "io/torchbin_zip.h"
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "io/io_util.h"

#define TZ_MAX_CDIR ((uint64_t)256 << 20) /* a central directory for 10^6 entries; torch writes ~300 */
#define TZ_MAX_ENTRIES 1000000

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t rd32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const unsigned char *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static int cmp_entry(const void *a, const void *b) { return strcmp(((const tz_entry *)a)->name, ((const tz_entry *)b)->name); }

/* Finds the EOCD and returns the central directory's offset, size and entry count. */
static int find_cdir(tz_archive *z, uint64_t *cd_off, uint64_t *cd_size, uint64_t *count, glm_err *err) {
    uint64_t fs = z->file_size, tail_len = fs < 65557 ? fs : 65557; /* EOCD (22) + longest comment */
    unsigned char *tail = malloc(tail_len ? tail_len : 1);
    if (!tail || io_pread_full(z->fd, tail, tail_len, fs - tail_len) != 0) { free(tail); return glm_fail(err, "%s: cannot read the zip directory", z->path); }
    int64_t at = -1;
    for (int64_t i = (int64_t)tail_len - 22; i >= 0; i--)
        if (rd32(tail + i) == 0x06054b50u && (uint64_t)i + 22 + rd16(tail + i + 20) <= tail_len) { at = i; break; }
    if (at < 0) {
        free(tail);
        glm_fail(err, "%s: no zip end-of-directory record; the file is truncated or not a torch.save archive", z->path);
        return glm_hint(err, "re-download the file (compare its size and sha256 with the source)");
    }
    const unsigned char *e = tail + at;
    uint64_t eocd_pos = fs - tail_len + (uint64_t)at;
    *count = rd16(e + 10);
    *cd_size = rd32(e + 12);
    *cd_off = rd32(e + 16);
    /* zip64: a locator right before the EOCD points at the zip64 end record with 64-bit fields. */
    if (at >= 20 && rd32(e - 20) == 0x07064b50u) {
        uint64_t z64 = rd64(e - 20 + 8);
        unsigned char r[56];
        if (z64 > fs - 56 || fs < 56 || io_pread_full(z->fd, r, 56, z64) != 0 || rd32(r) != 0x06064b50u) {
            free(tail);
            return glm_fail(err, "%s: broken zip64 end-of-directory record", z->path);
        }
        *count = rd64(r + 32);
        *cd_size = rd64(r + 40);
        *cd_off = rd64(r + 48);
        eocd_pos = z64;
    }
    free(tail);
    if (*cd_off > eocd_pos || *cd_size > eocd_pos - *cd_off)
        return glm_fail(err, "%s: zip central directory [%llu, +%llu) lies outside the file (truncated?)", z->path,
                        (unsigned long long)*cd_off, (unsigned long long)*cd_size);
    if (*cd_size > TZ_MAX_CDIR || *count > TZ_MAX_ENTRIES || *count > *cd_size / 46)
        return glm_fail(err, "%s: zip directory claims %llu entries in %llu bytes; not a torch.save archive", z->path,
                        (unsigned long long)*count, (unsigned long long)*cd_size);
    return 0;
}

/* Applies a zip64 extra field: the 64-bit values appear only for fields saturated at 0xFFFFFFFF. */
static int apply_zip64(tz_entry *t, const unsigned char *x, size_t xl, int need_size, int need_comp, int need_off) {
    while (xl >= 4) {
        uint16_t id = rd16(x), sz = rd16(x + 2);
        if ((size_t)sz > xl - 4) return -1;
        if (id == 1) {
            const unsigned char *p = x + 4, *end = x + 4 + sz;
            if (need_size) { if (end - p < 8) return -1; t->size = rd64(p); p += 8; }
            if (need_comp) { if (end - p < 8) return -1; t->comp_size = rd64(p); p += 8; }
            if (need_off) { if (end - p < 8) return -1; t->local_off = rd64(p); }
            return 0;
        }
        x += 4 + sz;
        xl -= 4 + (size_t)sz;
    }
    return need_size || need_comp || need_off ? -1 : 0;
}

int tz_open(tz_archive *z, int fd, const char *path, glm_err *err) {
    memset(z, 0, sizeof *z);
    z->fd = fd;
    z->path = path;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return glm_fail(err, "%s: not a regular file", path);
    z->file_size = (uint64_t)st.st_size;
    uint64_t cd_off = 0, cd_size = 0, count = 0;
    if (find_cdir(z, &cd_off, &cd_size, &count, err) != 0) return -1;
    unsigned char *cd = malloc(cd_size ? cd_size : 1);
    if (!cd) return glm_fail(err, "%s: out of memory for the zip directory", path);
    if (io_pread_full(fd, cd, cd_size, cd_off) != 0) { free(cd); return glm_fail(err, "%s: cannot read the zip directory", path); }
    z->e = calloc(count ? count : 1, sizeof *z->e);
    if (!z->e) { free(cd); return glm_fail(err, "%s: out of memory", path); }
    size_t pos = 0;
    for (uint64_t i = 0; i < count; i++) {
        const unsigned char *h = cd + pos;
        if (cd_size - pos < 46 || rd32(h) != 0x02014b50u) { glm_fail(err, "%s: zip directory entry %llu is corrupt", path, (unsigned long long)i); goto fail; }
        size_t nl = rd16(h + 28), xl = rd16(h + 30), cl = rd16(h + 32);
        if (cd_size - pos - 46 < nl + xl + cl) { glm_fail(err, "%s: zip directory entry %llu runs past the directory", path, (unsigned long long)i); goto fail; }
        tz_entry *t = &z->e[z->n];
        t->flags = rd16(h + 8);
        t->method = rd16(h + 10);
        t->comp_size = rd32(h + 20);
        t->size = rd32(h + 24);
        t->local_off = rd32(h + 42);
        t->name = malloc(nl + 1);
        if (!t->name) { glm_fail(err, "%s: out of memory", path); goto fail; }
        memcpy(t->name, h + 46, nl);
        t->name[nl] = 0;
        z->n++;
        if (apply_zip64(t, h + 46 + nl, xl, t->size == 0xffffffffu, t->comp_size == 0xffffffffu, t->local_off == 0xffffffffu) != 0) {
            glm_fail(err, "%s: zip entry '%s' has a broken zip64 extra field", path, t->name);
            goto fail;
        }
        pos += 46 + nl + xl + cl;
    }
    free(cd);
    qsort(z->e, (size_t)z->n, sizeof *z->e, cmp_entry);
    return 0;
fail:
    free(cd);
    tz_free(z);
    return -1;
}

void tz_free(tz_archive *z) {
    for (int i = 0; i < z->n; i++) free(z->e[i].name);
    free(z->e);
    z->e = NULL;
    z->n = 0;
}

const tz_entry *tz_find(const tz_archive *z, const char *name) {
    tz_entry key = {.name = (char *)name};
    return z->n ? bsearch(&key, z->e, (size_t)z->n, sizeof *z->e, cmp_entry) : NULL;
}

int tz_locate(const tz_archive *z, const tz_entry *e, uint64_t *data_off, glm_err *err) {
    if (e->flags & 1) return glm_fail(err, "%s: zip entry '%s' is encrypted", z->path, e->name);
    if (e->method == 0 && e->comp_size != e->size)
        return glm_fail(err, "%s: zip entry '%s' is stored but its sizes disagree (%llu vs %llu); the archive is corrupt", z->path, e->name,
                        (unsigned long long)e->comp_size, (unsigned long long)e->size);
    if (e->method != 0) {
        glm_fail(err, "%s: zip entry '%s' is compressed (method %u); torch.save stores entries uncompressed", z->path, e->name, e->method);
        return glm_hint(err, "was the archive re-packed with `zip`? re-save it with torch.save, or unzip and re-zip with `zip -0`");
    }
    unsigned char h[30];
    if (e->local_off > z->file_size || z->file_size - e->local_off < 30 || io_pread_full(z->fd, h, 30, e->local_off) != 0 || rd32(h) != 0x04034b50u)
        return glm_fail(err, "%s: zip entry '%s': local header at %llu is missing or corrupt", z->path, e->name, (unsigned long long)e->local_off);
    uint64_t off = e->local_off + 30 + rd16(h + 26) + rd16(h + 28);
    if (off > z->file_size || e->size > z->file_size - off)
        return glm_fail(err, "%s: zip entry '%s' claims %llu bytes at offset %llu, past the end of the file (%llu bytes; truncated?)", z->path,
                        e->name, (unsigned long long)e->size, (unsigned long long)off, (unsigned long long)z->file_size);
    *data_off = off;
    return 0;
}
