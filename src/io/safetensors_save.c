/* safetensors writer: one file, or shards plus model.safetensors.index.json. Every file is
 * written as NAME.tmp and renamed only after all of them are complete, so a crash mid-save
 * leaves the previous checkpoint readable. Tensor data are packed back to back in entry
 * order from offset 0 (the reference reader refuses gaps). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "core/strbuf.h"
#include "io/safetensors.h"

static void sb_u64(glm_strbuf *b, uint64_t v) { char t[32]; glm_strbuf_put(b, t, (size_t)snprintf(t, sizeof t, "%llu", (unsigned long long)v)); }
/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void sb_json(glm_strbuf *b, const char *s) {
    glm_strbuf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; glm_strbuf_put(b, e, 2); }
        else if (c < 0x20) { char e[8]; glm_strbuf_put(b, e, (size_t)snprintf(e, sizeof e, "\\u%04x", c)); }
        else glm_strbuf_put(b, (const char *)&c, 1);
    }
    glm_strbuf_put(b, "\"", 1);
}

static uint64_t numel_of(const st_entry *e) {
    uint64_t n = 1;
    for (int i = 0; i < e->ndim; i++) n *= (uint64_t)e->shape[i];
    return n;
}
static uint64_t file_bytes(const st_entry *e) { return numel_of(e) * st_dtype_size(e->file_dtype); }

static int check_entry(const char *path, const st_entry *e, glm_err *err) {
    if (!e->name || !e->name[0]) return glm_fail(err, "saving %s: a tensor has no name", path);
    const char *name = e->name;
    if (!strcmp(name, "__metadata__")) /* the format's key for the header's metadata: readers skip it */
        return glm_fail(err, "saving %s: a tensor cannot be named __metadata__ (the safetensors header's own key)", path);
    if (e->ndim < 0 || e->ndim > ST_MAX_DIMS) return glm_fail(err, "saving %s: tensor '%s' has %d dimensions (0..%d allowed)", path, name, e->ndim, ST_MAX_DIMS);
    if ((unsigned)e->data_dtype >= ST_NDTYPES || (unsigned)e->file_dtype >= ST_NDTYPES)
        return glm_fail(err, "saving %s: tensor '%s' has an invalid dtype", path, name);
    uint64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        if (e->shape[i] < 0 || __builtin_mul_overflow(n, (uint64_t)e->shape[i], &n) || n > ((uint64_t)1 << 60))
            return glm_fail(err, "saving %s: tensor '%s' has an invalid shape", path, name);
    int ok = e->data_dtype == e->file_dtype ||
             (e->data_dtype == ST_F32 && (e->file_dtype == ST_F16 || e->file_dtype == ST_BF16));
    if (!ok) return glm_fail(err, "saving %s: tensor '%s': cannot write %s data as %s (only F32 data convert, to F16/BF16)", path, name,
                             st_dtype_name(e->data_dtype), st_dtype_name(e->file_dtype));
    if (n && !e->data) return glm_fail(err, "saving %s: tensor '%s' has no data pointer", path, name);
    if (e->data_dtype == ST_F32 && e->file_dtype == ST_F16) { /* checked before any file is written */
        size_t i = st_first_past_f16(e->data, (size_t)n);
        if (i < n) {
            glm_fail(err, "saving %s: tensor '%s' holds %g (element %zu), " ST_PAST_F16 " (65504): written as float16 it "
                          "would become inf", path, name, (double)((const float *)e->data)[i], i);
            return glm_hint(err, "write it as bfloat16 (float32's range) or float32: --dtype bfloat16 (convert, merge), "
                                 "--save_dtype bfloat16 (train)");
        }
    }
    return 0;
}

static int write_all(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }

static int write_data(FILE *f, const st_entry *e) {
    uint64_t n = numel_of(e);
    if (e->data_dtype == e->file_dtype) return write_all(f, e->data, (size_t)(n * st_dtype_size(e->file_dtype)));
    enum { CHUNK = 8192 };
    uint16_t buf[CHUNK];
    const float *src = e->data;
    for (uint64_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? (size_t)(n - i) : CHUNK;
        for (size_t j = 0; j < k; j++)
            buf[j] = e->file_dtype == ST_F16 ? st_f32_to_f16(src[i + j]) : st_f32_to_bf16(src[i + j]);
        if (write_all(f, buf, k * 2) != 0) return -1;
    }
    return 0;
}

/* Writes entries [a, b) to tmp. */
static int write_file(const char *tmp, const st_entry *e, int a, int b, glm_err *err) {
    glm_strbuf h = {0};
    glm_strbuf_str(&h, "{\"__metadata__\":{\"format\":\"pt\"}"); /* transformers refuses files without format=pt */
    uint64_t off = 0;
    for (int i = a; i < b; i++) {
        glm_strbuf_str(&h, ",");
        sb_json(&h, e[i].name);
        glm_strbuf_str(&h, ":{\"dtype\":\"");
        glm_strbuf_str(&h, st_dtype_name(e[i].file_dtype));
        glm_strbuf_str(&h, "\",\"shape\":[");
        for (int d = 0; d < e[i].ndim; d++) { if (d) glm_strbuf_str(&h, ","); sb_u64(&h, (uint64_t)e[i].shape[d]); }
        glm_strbuf_str(&h, "],\"data_offsets\":[");
        sb_u64(&h, off);
        glm_strbuf_str(&h, ",");
        off += file_bytes(&e[i]);
        sb_u64(&h, off);
        glm_strbuf_str(&h, "]}");
    }
    glm_strbuf_str(&h, "}");
    while (h.n % 8) glm_strbuf_str(&h, " "); /* keeps the data region 8-byte aligned, as the reference writer does */
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    FILE *f = fopen(tmp, "wb");
    if (!f) { free(h.s); return glm_fail(err, "cannot create %s: %s", tmp, strerror(errno)); }
    int bad = write_all(f, len, 8) || write_all(f, h.s, h.n);
    free(h.s);
    for (int i = a; i < b && !bad; i++) bad = write_data(f, &e[i]);
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad) {
        unlink(tmp);
        glm_fail(err, "cannot write %s: %s", tmp, strerror(errno));
        return glm_hint(err, "is the disk full? this file alone needs about %.2f GB", (double)(off + h.n + 8) / 1e9);
    }
    return 0;
}

int st_save(const char *path, const st_entry *entries, int n, size_t max_shard_bytes, glm_err *err) {
    for (int i = 0; i < n; i++) {
        if (check_entry(path, &entries[i], err) != 0) return -1;
        for (int j = 0; j < i; j++)
            if (strcmp(entries[i].name, entries[j].name) == 0) return glm_fail(err, "saving %s: tensor '%s' given twice", path, entries[i].name);
    }
    /* Shards: consecutive entries while they fit; a tensor larger than the limit stands alone. */
    int *start = glm_malloc(((size_t)n + 2) * sizeof *start), ns = 0;
    uint64_t cur = 0, total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t b = file_bytes(&entries[i]);
        if (i == 0 || (max_shard_bytes && cur > 0 && cur + b > max_shard_bytes)) { start[ns++] = i; cur = 0; }
        cur += b;
        total += b;
    }
    if (ns == 0) start[ns++] = 0;
    start[ns] = n;
    char dir[4096] = "", (*names)[4096] = glm_calloc((size_t)ns, sizeof *names);
    int rc = -1, written = 0;
    if (max_shard_bytes == 0) {
        snprintf(names[0], sizeof names[0], "%s", path);
    } else {
        snprintf(dir, sizeof dir, "%s", path);
        if (glm_mkdirs(dir, err) != 0) goto done;
        for (int s = 0; s < ns; s++) {
            char base[64];
            if (ns == 1) snprintf(base, sizeof base, "model.safetensors");
            else snprintf(base, sizeof base, "model-%05d-of-%05d.safetensors", s + 1, ns);
            glm_path_join(names[s], sizeof names[s], dir, base);
        }
    }
    char tmp[4200];
    for (; written < ns; written++) {
        snprintf(tmp, sizeof tmp, "%s.tmp", names[written]);
        if (write_file(tmp, entries, start[written], start[written + 1], err) != 0) goto done;
    }
    for (int s = 0; s < ns; s++) {
        snprintf(tmp, sizeof tmp, "%s.tmp", names[s]);
        if (rename(tmp, names[s]) != 0) { glm_fail(err, "cannot rename %s to %s: %s", tmp, names[s], strerror(errno)); goto done; }
    }
    written = 0; /* renamed: nothing left to clean up */
    /* The index goes last so it never names shards that are not in place yet. */
    if (ns > 1) {
        glm_strbuf ix = {0};
        glm_strbuf_str(&ix, "{\n  \"metadata\": {\"total_size\": ");
        sb_u64(&ix, total);
        glm_strbuf_str(&ix, "},\n  \"weight_map\": {");
        for (int s = 0; s < ns; s++)
            for (int i = start[s]; i < start[s + 1]; i++) {
                glm_strbuf_str(&ix, i ? ",\n    " : "\n    ");
                sb_json(&ix, entries[i].name);
                glm_strbuf_str(&ix, ": ");
                sb_json(&ix, strrchr(names[s], '/') ? strrchr(names[s], '/') + 1 : names[s]);
            }
        glm_strbuf_str(&ix, "\n  }\n}\n");
        char ipath[4200];
        glm_path_join(ipath, sizeof ipath, dir, "model.safetensors.index.json");
        int irc = glm_write_file_atomic(ipath, ix.s, ix.n, err);
        free(ix.s);
        if (irc != 0) goto done;
    } else if (max_shard_bytes) {
        /* A stale index from an earlier sharded save would shadow the new single file. */
        char ipath[4200];
        glm_path_join(ipath, sizeof ipath, dir, "model.safetensors.index.json");
        unlink(ipath);
    }
    rc = 0;
done:
    for (int s = 0; s < written; s++) { snprintf(tmp, sizeof tmp, "%s.tmp", names[s]); unlink(tmp); }
    free(names);
    free(start);
    return rc;
}
