/* One reader over safetensors and torch .bin checkpoints (model/ckpt.h). */
#include "model/ckpt.h"
#include "backend/quant.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <strings.h>
#include "core/fileutil.h"
#include "model/hf_layout.h"

static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcasecmp(s + n - k, suf) == 0;
}

/* 1 when path names a torch checkpoint, 0 for safetensors, -1 when a folder holds neither. */
static int is_torch(const char *path) {
    char buf[4096];
    if (glm_is_dir(path)) {
        const char *st[] = {"model.safetensors.index.json", "model.safetensors"};
        const char *tb[] = {"pytorch_model.bin.index.json", "pytorch_model.bin"};
        for (int i = 0; i < 2; i++) {
            glm_path_join(buf, sizeof buf, path, st[i]);
            if (glm_is_file(buf)) return 0;
        }
        for (int i = 0; i < 2; i++) {
            glm_path_join(buf, sizeof buf, path, tb[i]);
            if (glm_is_file(buf)) return 1;
        }
        return -1;
    }
    if (ends_with(path, ".safetensors") || ends_with(path, ".safetensors.index.json")) return 0;
    if (ends_with(path, ".bin") || ends_with(path, ".bin.index.json") || ends_with(path, ".pt") ||
        ends_with(path, ".pth"))
        return 1;
    return tbin_is_archive(path) ? 1 : 0;
}

/* The stored tensors, by their names in the file. */
static int raw_count(const glm_ckpt *c) { return c->tb ? tbin_count(c->tb) : st_count(c->st); }
static const char *raw_name(const glm_ckpt *c, int i) { return c->tb ? tbin_name(c->tb, i) : st_name(c->st, i); }
static int raw_info(const glm_ckpt *c, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]) {
    return c->tb ? tbin_info(c->tb, name, dtype, ndim, shape) : st_info(c->st, name, dtype, ndim, shape);
}
static int raw_read_f32(glm_ckpt *c, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err) {
    return c->tb ? tbin_read_f32(c->tb, name, dst, ndim, shape, err) : st_read_f32(c->st, name, dst, ndim, shape, err);
}
static int raw_read_raw(glm_ckpt *c, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err) {
    return c->tb ? tbin_read_raw(c->tb, name, dtype, dst, bytes, err) : st_read_raw(c->st, name, dtype, dst, bytes, err);
}
static int raw_read_raw_at(glm_ckpt *c, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err) {
    return c->tb ? tbin_read_raw_at(c->tb, name, dtype, dst, off, bytes, err) : st_read_raw_at(c->st, name, dtype, dst, off, bytes, err);
}

/* A folder in transformers' own GLM layout holds model.embed_tokens or model.layers.N tensors
 * (a model's whole or a part); its names are listed by their original forms, query_key_value
 * once (where the first of its blocks in the file is). */
static void list_hf_names(glm_ckpt *c) {
    int n = raw_count(c), part; /* part: unused (any of q, k, v lists the tensor) */
    char orig[GLM_HF_NAME];
    for (int i = 0; i < n && !c->hf; i++) {
        const char *s = raw_name(c, i);
        if (strncmp(s, "base_model.model.", 17) == 0) s += 17; /* peft's adapters */
        c->hf = strncmp(s, "model.layers.", 13) == 0 || strcmp(s, "model.embed_tokens.weight") == 0;
    }
    if (!c->hf) return;
    c->names = glm_calloc((size_t)n, sizeof *c->names);
    for (int i = 0; i < n; i++) {
        const char *s = raw_name(c, i);
        if (glm_hf_orig_name(s, orig, sizeof orig, &part)) { c->names[c->n_names++] = glm_strdup(s); continue; }
        int seen = 0; /* q, k, v's parts name one tensor (an adapter may have some of them) */
        for (int k = c->n_names - 1; k >= 0 && !seen; k--) seen = !strcmp(c->names[k], orig);
        if (!seen) c->names[c->n_names++] = glm_strdup(orig);
    }
}

int glm_ckpt_open(glm_ckpt *c, const char *path, glm_err *err) {
    memset(c, 0, sizeof *c);
    snprintf(c->path, sizeof c->path, "%s", path);
    if (!glm_is_dir(path) && !glm_is_file(path))
        return glm_fail(err, "%s: no such file or folder", path);
    int t = is_torch(path);
    if (t < 0) {
        static const char *const names[] = {"model.safetensors.index.json", "model.safetensors", "pytorch_model.bin.index.json",
                                            "pytorch_model.bin"};
        for (int i = 0; i < 4; i++) { /* a weight file whose link points nowhere: why none was found */
            char f[4096], to[8];
            glm_path_join(f, sizeof f, path, names[i]);
            if (glm_dangling_link(f, to, sizeof to)) return glm_fail_open(f, ENOENT, err);
        }
        glm_fail(err, "%s: no model weights in this folder", path);
        return glm_hint(err, "expected model.safetensors(.index.json) or pytorch_model.bin(.index.json); "
                             "a training checkpoint-N folder or a Hugging Face chatglm-6b download has them");
    }
    int rc = t ? tbin_open(&c->tb, path, err) : st_open(&c->st, path, err);
    if (rc) return glm_wrap(err, "loading weights: ");
    list_hf_names(c);
    return 0;
}

void glm_ckpt_close(glm_ckpt *c) {
    if (c->st) st_close(c->st);
    if (c->tb) tbin_close(c->tb);
    for (int i = 0; i < c->n_names; i++) free(c->names[i]);
    free(c->names);
    c->st = NULL;
    c->tb = NULL;
    c->names = NULL;
    c->n_names = 0;
}

const char *glm_ckpt_format(const glm_ckpt *c) { return c->tb ? "torch .bin" : "safetensors"; }
int glm_ckpt_count(const glm_ckpt *c) { return c->hf ? c->n_names : raw_count(c); }
const char *glm_ckpt_name(const glm_ckpt *c, int i) { return c->hf ? c->names[i] : raw_name(c, i); }

/* The stored tensors a name reads from: itself, or in a -hf folder its -hf name(s); for
 * query_key_value three row blocks of one dtype and the same trailing dims. -1 when absent. */
typedef struct parts {
    int n;
    char name[3][GLM_HF_NAME];
    int64_t rows[3];
    st_dtype dt;
    int nd;
    int64_t shape[ST_MAX_DIMS]; /* the whole: rows summed */
} parts;
static int resolve(const glm_ckpt *c, const char *name, parts *p) {
    int direct = raw_info(c, name, &p->dt, &p->nd, p->shape) == 0;
    if (direct || !c->hf) {
        if (!direct) return -1;
        p->n = 1;
        snprintf(p->name[0], GLM_HF_NAME, "%s", name);
        p->rows[0] = p->nd > 0 ? p->shape[0] : 1;
        return 0;
    }
    p->n = glm_hf_names(name, p->name);
    if (p->n == 0) return -1;
    for (int i = 0; i < p->n; i++) {
        st_dtype dt;
        int nd;
        int64_t sh[ST_MAX_DIMS];
        if (raw_info(c, p->name[i], &dt, &nd, sh) || nd < 1) return -1;
        if (i == 0) { p->dt = dt; p->nd = nd; memcpy(p->shape, sh, sizeof sh); p->shape[0] = 0; }
        else if (dt != p->dt || nd != p->nd || (nd == 2 && sh[1] != p->shape[1])) return -1;
        p->rows[i] = sh[0];
        p->shape[0] += sh[0];
    }
    return 0;
}
/* elements in one row of a resolved tensor */
static int64_t row_elems(const parts *p) {
    int64_t r = 1;
    for (int d = 1; d < p->nd; d++) r *= p->shape[d];
    return r;
}

int glm_ckpt_info(const glm_ckpt *c, const char *name, st_dtype *dtype, int *ndim, int64_t shape[ST_MAX_DIMS]) {
    parts p;
    if (resolve(c, name, &p)) return -1;
    if (dtype) *dtype = p.dt;
    if (ndim) *ndim = p.nd;
    if (shape) memcpy(shape, p.shape, sizeof p.shape);
    return 0;
}

int glm_ckpt_read_f32(glm_ckpt *c, const char *name, float *dst, int ndim, const int64_t *shape, glm_err *err) {
    parts p;
    if (resolve(c, name, &p)) return raw_read_f32(c, name, dst, ndim, shape, err); /* its message */
    if (p.n == 1) return raw_read_f32(c, p.name[0], dst, ndim, shape, err);
    if (ndim != p.nd || shape[0] != p.shape[0]) /* the stored parts' own message for the mismatch */
        return raw_read_f32(c, p.name[0], dst, ndim, shape, err);
    int64_t sh[ST_MAX_DIMS];
    memcpy(sh, shape, (size_t)ndim * sizeof *sh);
    for (int i = 0; i < p.n; i++) {
        sh[0] = p.rows[i];
        if (raw_read_f32(c, p.name[i], dst, ndim, sh, err)) return -1;
        dst += p.rows[i] * row_elems(&p);
    }
    return 0;
}

int glm_ckpt_read_raw(glm_ckpt *c, const char *name, st_dtype dtype, void *dst, size_t bytes, glm_err *err) {
    parts p;
    if (resolve(c, name, &p)) return raw_read_raw(c, name, dtype, dst, bytes, err);
    if (p.n == 1) return raw_read_raw(c, p.name[0], dtype, dst, bytes, err);
    size_t row = (size_t)row_elems(&p) * st_dtype_size(dtype);
    if (bytes != (size_t)p.shape[0] * row) return raw_read_raw(c, p.name[0], dtype, dst, bytes, err);
    for (int i = 0; i < p.n; i++) {
        if (raw_read_raw(c, p.name[i], dtype, dst, (size_t)p.rows[i] * row, err)) return -1;
        dst = (char *)dst + (size_t)p.rows[i] * row;
    }
    return 0;
}

int glm_ckpt_partwise(glm_ckpt *c, const char *name) {
    parts p;
    if (resolve(c, name, &p)) return 0;
    for (int i = 0; i < p.n; i++)
        if (!(c->tb ? tbin_contiguous(c->tb, p.name[i]) : 1)) return 0;
    return 1;
}

int glm_ckpt_read_raw_at(glm_ckpt *c, const char *name, st_dtype dtype, void *dst, uint64_t off, size_t bytes, glm_err *err) {
    parts p;
    if (resolve(c, name, &p)) return raw_read_raw_at(c, name, dtype, dst, off, bytes, err);
    if (p.n == 1) return raw_read_raw_at(c, p.name[0], dtype, dst, off, bytes, err);
    uint64_t row = (uint64_t)row_elems(&p) * st_dtype_size(dtype), start = 0;
    for (int i = 0; i < p.n && bytes > 0; i++) { /* the byte range across the row blocks it spans */
        uint64_t len = (uint64_t)p.rows[i] * row;
        if (off < start + len) {
            uint64_t k = start + len - off < bytes ? start + len - off : bytes;
            if (raw_read_raw_at(c, p.name[i], dtype, dst, off - start, (size_t)k, err)) return -1;
            dst = (char *)dst + k;
            off += k;
            bytes -= (size_t)k;
        }
        start += len;
    }
    if (bytes) return glm_fail(err, "%s: tensor %s is shorter than the bytes asked for", c->path, name);
    return 0;
}

int glm_ckpt_read_qkv_lora(glm_ckpt *c, const char *name, int b_side, const glm_config *cfg, int r, int64_t cols,
                           float *dst, glm_err *err) {
    int64_t total = b_side ? glm_qkv_width(cfg) : 3 * (int64_t)r, sh[ST_MAX_DIMS];
    int nd;
    if (raw_info(c, name, NULL, &nd, sh) == 0) {
        if (!b_side && nd == 2 && sh[0] == r) { /* THUDM's one adapter: its A for each of the three */
            int64_t one[2] = {r, cols};
            size_t n = (size_t)r * (size_t)cols;
            if (raw_read_f32(c, name, dst, 2, one, err)) return -1;
            memcpy(dst + n, dst, n * sizeof(float));
            memcpy(dst + 2 * n, dst, n * sizeof(float));
            return 1;
        }
        int64_t want[2] = {total, b_side ? r : cols};
        return raw_read_f32(c, name, dst, 2, want, err) ? -1 : 1;
    }
    char hf[3][GLM_HF_NAME];
    if (glm_hf_names(name, hf) != 3) return 0;
    int any = 0;
    int64_t row0 = 0, w = b_side ? r : cols;
    for (int k = 0; k < 3; k++) {
        int64_t rows = b_side ? glm_hf_part_rows(cfg, k) : r, part[2] = {rows, w};
        if (raw_info(c, hf[k], NULL, NULL, NULL) == 0) {
            if (raw_read_f32(c, hf[k], dst + row0 * w, 2, part, err)) return -1;
            any = 1;
        } else {
            memset(dst + row0 * w, 0, (size_t)(rows * w) * sizeof(float));
        }
        row0 += rows;
    }
    return any;
}

int glm_ckpt_quantized_type(const glm_ckpt *c, const char *name, int64_t OC, int64_t C) {
    st_dtype dt;
    int nd;
    int64_t sh[ST_MAX_DIMS];
    if (glm_ckpt_info(c, name, &dt, &nd, sh) != 0 || dt != ST_I8 || nd != 2 || sh[0] != OC) return GLM_Q_NONE;
    return sh[1] == C ? GLM_Q_INT8 : 2 * sh[1] == C ? GLM_Q_INT4 : GLM_Q_NONE;
}

int glm_ckpt_read_quantized(glm_ckpt *c, const char *name, int q, int64_t OC, int64_t C, void *dst, glm_err *err) {
    glm_qlayout L = glm_qlayout_of((glm_qtype)q, (size_t)OC, (size_t)C);
    char scale[300];
    snprintf(scale, sizeof scale, "%s_scale", name);
    memset(dst, 0, L.bytes);
    if (glm_ckpt_read_raw(c, name, ST_I8, dst, L.q_bytes, err)) return -1;
    return glm_ckpt_read_raw(c, scale, ST_F16, (char *)dst + L.scale, (size_t)OC * 2, err);
}

int glm_ckpt_read_values(glm_ckpt *c, const char *name, const glm_tensor *t, float *dst, glm_err *err) {
    glm_qtype q = t->ndim == 2 ? (glm_qtype)glm_ckpt_quantized_type(c, name, t->shape[0], t->shape[1]) : GLM_Q_NONE;
    if (q == GLM_Q_NONE) return glm_ckpt_read_f32(c, name, dst, t->ndim, t->shape, err);
    /* a THUDM-quantized weight (int8 + weight_scale): its values as the model computes with them */
    void *b = glm_malloc(glm_qlayout_of(q, (size_t)t->shape[0], (size_t)t->shape[1]).bytes);
    int rc = glm_ckpt_read_quantized(c, name, q, t->shape[0], t->shape[1], b, err);
    if (rc == 0) glm_dequantize(q, dst, b, (size_t)t->shape[0], (size_t)t->shape[1]);
    free(b);
    return rc;
}

int glm_parse_size(const char *s, size_t *out) {
    char *end;
    if (!s || !isdigit((unsigned char)*s)) return -1;
    double v = strtod(s, &end);
    while (*end == ' ') end++;
    static const struct { const char *suf; double mul; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(end, units[i].suf) == 0) {
            double b = v * units[i].mul;
            if (b < 1 || b > 1e18) return -1;
            *out = (size_t)b;
            return 0;
        }
    return -1;
}

int glm_parse_st_dtype(const char *s, st_dtype *out) {
    static const struct { const char *name; st_dtype d; } names[] = {
        {"float16", ST_F16}, {"fp16", ST_F16}, {"f16", ST_F16}, {"half", ST_F16},
        {"bfloat16", ST_BF16}, {"bf16", ST_BF16},
        {"float32", ST_F32}, {"fp32", ST_F32}, {"f32", ST_F32}, {"float", ST_F32}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(s, names[i].name) == 0) { *out = names[i].d; return 0; }
    return -1;
}
