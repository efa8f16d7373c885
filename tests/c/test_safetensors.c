/* safetensors: f16/bf16 rounding, bit-exact round trips (single file and sharded), and every
 * kind of broken file giving an error that names the file and the tensor. */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "io/safetensors.h"
#include "test.h"

static char g_dir[64]; /* per-run temp folder; set once in main */

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) { return remove(p); }
static void rmtree(const char *d) { nftw(d, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static uint64_t rng_next(uint64_t *s) { *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17; return *s; }
static float bits_f(uint32_t x) { float f; memcpy(&f, &x, 4); return f; }

/* Property check for round-to-nearest-even: neither neighbour of h is closer to x, and on a
 * tie h is even. x must lie inside the finite range (inf = the format's Inf code). */
static int rne_ok(float x, uint16_t h, float (*dec)(uint16_t), uint16_t inf) {
    uint16_t m = h & 0x7fff, sign = h & 0x8000;
    if (m >= inf) return 0;
    double d = fabs((double)dec(h) - x);
    for (int k = -1; k <= 1; k += 2) {
        if ((m == 0 && k < 0) || m + k >= inf) continue;
        double dn = fabs((double)dec((uint16_t)(sign | (m + k))) - x);
        if (dn < d || (dn == d && (m & 1))) return 0;
    }
    return 1;
}

static void test_conversions(test_counts *tc) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) { /* every f16 survives f16 -> f32 -> f16 */
        float f = st_f16_to_f32((uint16_t)h);
        uint16_t back = st_f32_to_f16(f);
        if (isnan(f) ? !(back & 0x7c00) || !(back & 0x3ff) || ((back ^ h) & 0x8000) : back != h) bad++;
    }
    TEST_CHECK(tc, "st_f16_roundtrip_all_65536", bad == 0, "%d values changed", bad);
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = st_bf16_to_f32((uint16_t)h);
        uint16_t back = st_f32_to_bf16(f);
        if (isnan(f) ? !isnan(st_bf16_to_f32(back)) : back != h) bad++;
    }
    TEST_CHECK(tc, "st_bf16_roundtrip_all_65536", bad == 0, "%d values changed", bad);
    struct { float x; uint16_t want; } f16[] = {
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 3 * 0x1p-11f, 0x3c02}, {65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00},
        {1e9f, 0x7c00}, {-INFINITY, 0xfc00}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, {1.5f * 0x1p-24f, 0x0002},
        {0.75f * 0x1p-24f, 0x0001}, {0x1p-14f, 0x0400}, {-0.0f, 0x8000}, {0x1p-14f - 0x1p-25f, 0x0400}};
    bad = 0;
    for (size_t i = 0; i < sizeof f16 / sizeof f16[0]; i++)
        if (st_f32_to_f16(f16[i].x) != f16[i].want) { printf("  f16(%a) = %04x, want %04x\n", f16[i].x, st_f32_to_f16(f16[i].x), f16[i].want); bad++; }
    TEST_CHECK(tc, "st_f16_known_roundings", bad == 0, "%d wrong", bad);
    struct { float x; uint16_t want; } bf[] = {{1.0f + 0x1p-8f, 0x3f80}, {1.0f + 3 * 0x1p-8f, 0x3f82}, {3.3895314e38f, 0x7f7f},
                                               {INFINITY, 0x7f80}, {bits_f(0x7f7fffff), 0x7f80}, {-2.0f, 0xc000}};
    bad = 0;
    for (size_t i = 0; i < sizeof bf / sizeof bf[0]; i++) bad += st_f32_to_bf16(bf[i].x) != bf[i].want;
    TEST_CHECK(tc, "st_bf16_known_roundings", bad == 0, "%d wrong", bad);
    int nan_ok = isnan(st_f16_to_f32(st_f32_to_f16(NAN))) && isnan(st_bf16_to_f32(st_f32_to_bf16(NAN))) &&
                 isnan(st_f16_to_f32(st_f32_to_f16(bits_f(0x7f800001)))) && isnan(st_bf16_to_f32(st_f32_to_bf16(bits_f(0xff800001)))) &&
                 isinf(st_f16_to_f32(st_f32_to_f16(INFINITY))) && isinf(st_bf16_to_f32(st_f32_to_bf16(-INFINITY)));
    TEST_CHECK(tc, "st_nan_inf_preserved", nan_ok, "NaN or Inf lost in conversion");
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int bf16 = 0, bb = 0;
    for (int i = 0; i < 1000000; i++) {
        float x = bits_f((uint32_t)rng_next(&s));
        if (isnan(x)) continue;
        if (fabsf(x) <= 65504.0f && !rne_ok(x, st_f32_to_f16(x), st_f16_to_f32, 0x7c00)) { if (!bf16++) printf("  f16 %a -> %04x\n", x, st_f32_to_f16(x)); }
        if (fabsf(x) <= 3.3895313e38f && !rne_ok(x, st_f32_to_bf16(x), st_bf16_to_f32, 0x7f80)) bb++;
    }
    TEST_CHECK(tc, "st_conversions_nearest_even_random", bf16 == 0 && bb == 0, "f16 %d, bf16 %d not nearest-even", bf16, bb);
}

typedef struct { float f32[24]; uint16_t f16[7], bf16[7]; int64_t i64[3]; uint8_t u8[5]; float scalar; float big[3000]; } fixture;

static void make_fixture(fixture *x) {
    for (int i = 0; i < 24; i++) x->f32[i] = (float)i * 0.37f - 3.0f;
    x->f32[5] = NAN; x->f32[6] = -INFINITY; x->f32[7] = 1e-42f; /* denormal */
    uint16_t h[7] = {0x3c00, 0x7c00, 0xfc00, 0x7e01, 0x0001, 0x8000, 0x7bff};
    uint16_t b[7] = {0x3f80, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x8000, 0x7f7f};
    memcpy(x->f16, h, sizeof h);
    memcpy(x->bf16, b, sizeof b);
    int64_t l[3] = {-1, 1ll << 40, 7};
    memcpy(x->i64, l, sizeof l);
    for (int i = 0; i < 5; i++) x->u8[i] = (uint8_t)(250 + i);
    x->scalar = 42.5f;
    for (int i = 0; i < 3000; i++) x->big[i] = sinf((float)i);
}

static int make_entries(const fixture *x, st_entry *e) {
    int n = 0;
    e[n++] = (st_entry){"a.f32", 2, {4, 6}, x->f32, ST_F32, ST_F32};
    e[n++] = (st_entry){"b.f16raw", 1, {7}, x->f16, ST_F16, ST_F16};
    e[n++] = (st_entry){"c.bf16raw", 1, {7}, x->bf16, ST_BF16, ST_BF16};
    e[n++] = (st_entry){"d.f32_as_f16", 3, {2, 3, 4}, x->f32, ST_F32, ST_F16};
    e[n++] = (st_entry){"e.f32_as_bf16", 1, {24}, x->f32, ST_F32, ST_BF16};
    e[n++] = (st_entry){"f.i64", 1, {3}, x->i64, ST_I64, ST_I64};
    e[n++] = (st_entry){"g.u8", 1, {5}, x->u8, ST_U8, ST_U8};
    e[n++] = (st_entry){"h.scalar", 0, {0}, &x->scalar, ST_F32, ST_F32};
    e[n++] = (st_entry){"i.empty", 2, {0, 3}, NULL, ST_F32, ST_F32};
    e[n++] = (st_entry){"j.big \"quoted\"\\name", 2, {1000, 3}, x->big, ST_F32, ST_F32};
    return n;
}

static int same_bits_f32(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * 4) == 0; }

/* Reads every entry back and compares bits. Returns the number of mismatches. */
static int verify(st_reader *r, const st_entry *e, int n, char *why, size_t wn) {
    glm_err err = {0};
    int bad = 0;
    if (st_count(r) != n) { snprintf(why, wn, "count %d != %d", st_count(r), n); return 1; }
    for (int i = 0; i < n; i++) {
        st_dtype dt;
        int nd;
        int64_t sh[ST_MAX_DIMS];
        if (st_info(r, e[i].name, &dt, &nd, sh) != 0 || dt != e[i].file_dtype || nd != e[i].ndim ||
            memcmp(sh, e[i].shape, sizeof(int64_t) * (size_t)nd) != 0) { snprintf(why, wn, "info of %s", e[i].name); bad++; continue; }
        size_t numel = 1;
        for (int d = 0; d < nd; d++) numel *= (size_t)sh[d];
        size_t bytes = numel * st_dtype_size(dt);
        unsigned char *raw = malloc(bytes + 1), *want = malloc(bytes + 1);
        float *f = malloc(numel * 4 + 4);
        if (e[i].data_dtype == e[i].file_dtype) { if (bytes) memcpy(want, e[i].data, bytes); }
        else for (size_t k = 0; k < numel; k++) {
            uint16_t h = e[i].file_dtype == ST_F16 ? st_f32_to_f16(((const float *)e[i].data)[k]) : st_f32_to_bf16(((const float *)e[i].data)[k]);
            memcpy(want + 2 * k, &h, 2);
        }
        if (st_read_raw(r, e[i].name, dt, raw, bytes, &err) != 0 || memcmp(raw, want, bytes) != 0) { snprintf(why, wn, "raw %s: %s", e[i].name, err.msg); bad++; }
        if (dt == ST_F32 || dt == ST_F16 || dt == ST_BF16) {
            float *g = malloc(numel * 4 + 4);
            for (size_t k = 0; k < numel; k++) {
                uint16_t h;
                memcpy(&h, want + 2 * k, 2);
                g[k] = dt == ST_F32 ? ((const float *)(const void *)want)[k] : dt == ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
            }
            if (st_read_f32(r, e[i].name, f, nd, sh, &err) != 0 || !same_bits_f32(f, g, (int)numel)) { snprintf(why, wn, "f32 %s: %s", e[i].name, err.msg); bad++; }
            free(g);
        }
        free(raw); free(want); free(f);
    }
    return bad;
}

static void test_roundtrip(test_counts *tc) {
    static fixture x;
    make_fixture(&x);
    st_entry e[16];
    int n = make_entries(&x, e);
    glm_err err = {0};
    char path[256], why[1200] = "";
    st_reader *r = NULL;
    snprintf(path, sizeof path, "%s/single.safetensors", g_dir);
    int ok = st_save(path, e, n, 0, &err) == 0 && st_open(&r, path, &err) == 0;
    TEST_CHECK(tc, "st_roundtrip_single_bit_exact", ok && verify(r, e, n, why, sizeof why) == 0, "%s %s", err.msg, why);
    st_close(r);
    r = NULL;
    snprintf(path, sizeof path, "%s/sharded", g_dir);
    ok = st_save(path, e, n, 200, &err) == 0; /* small limit: several shards; the 12 KB tensor alone */
    char p2[320];
    snprintf(p2, sizeof p2, "%s/model.safetensors.index.json", path);
    int has_index = glm_is_file(p2);
    snprintf(p2, sizeof p2, "%s/model-00003-of-00003.safetensors", path);
    ok = ok && st_open(&r, path, &err) == 0;
    TEST_CHECK(tc, "st_roundtrip_sharded_bit_exact", ok && has_index && glm_is_file(p2) && verify(r, e, n, why, sizeof why) == 0,
               "%s %s (index %d, shard1 %d)", err.msg, why, has_index, glm_is_file(p2));
    st_close(r);
    r = NULL;
    snprintf(path, sizeof path, "%s/oneshard", g_dir);
    ok = st_save(path, e, n, (size_t)1 << 30, &err) == 0 && st_open(&r, path, &err) == 0;
    snprintf(p2, sizeof p2, "%s/model.safetensors", path);
    TEST_CHECK(tc, "st_one_shard_is_model_safetensors", ok && glm_is_file(p2) && verify(r, e, n, why, sizeof why) == 0, "%s %s", err.msg, why);
    st_close(r);
    /* refused inputs */
    st_entry badent[2] = {{"x", 1, {2}, x.i64, ST_I64, ST_F16}, {"x", 1, {2}, x.f32, ST_F32, ST_F32}};
    snprintf(path, sizeof path, "%s/refused.safetensors", g_dir);
    int r1 = st_save(path, badent, 1, 0, &err);
    int m1 = strstr(err.msg, "'x'") != NULL;
    badent[0] = badent[1];
    int r2 = st_save(path, badent, 2, 0, &err);
    TEST_CHECK(tc, "st_save_refuses_bad_entries", r1 == -1 && m1 && r2 == -1 && strstr(err.msg, "twice") && !glm_is_file(path), "%s", err.msg);
    /* "__metadata__" is the header's own key: a tensor of that name would vanish on reading
     * (found by fuzz_adapter_config) */
    st_entry meta = {"__metadata__", 1, {2}, x.f32, ST_F32, ST_F32};
    /* a finite float32 past float16's range would be written as inf: refused before any file */
    float big[3] = {1.0f, 65504.0f, -70000.0f};
    st_entry half = {"w", 1, {3}, big, ST_F32, ST_F16};
    TEST_CHECK(tc, "st_save_refuses_float16_overflow", st_save(path, &half, 1, 0, &err) == -1 && strstr(err.msg, "'w' holds -70000 (element 2)") &&
               !glm_is_file(path), "%s", err.msg);
    half.shape[0] = 2; /* 65504 is float16's largest: written as it is */
    TEST_CHECK(tc, "st_save_float16_max_is_written", st_save(path, &half, 1, 0, &err) == 0, "%s", err.msg);
    unlink(path);
    TEST_CHECK(tc, "st_save_refuses_the_metadata_key", st_save(path, &meta, 1, 0, &err) == -1 && strstr(err.msg, "__metadata__") &&
               !glm_is_file(path), "%s", err.msg);
}

/* Writes an 8-byte length + header + data file; hlen_override != 0 replaces the length. */
static void craft(const char *path, const char *header, size_t data_bytes, uint64_t hlen_override) {
    FILE *f = fopen(path, "wb");
    uint64_t n = hlen_override ? hlen_override : strlen(header);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void expect_open_err(test_counts *tc, const char *name, const char *header, size_t data, uint64_t hlen, const char *m1, const char *m2) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s.safetensors", g_dir, name);
    craft(path, header, data, hlen);
    st_reader *r = NULL;
    glm_err err = {0};
    int rc = st_open(&r, path, &err);
    TEST_CHECK(tc, name, rc == -1 && !r && strstr(err.msg, path) && strstr(err.msg, m1) && (!m2 || strstr(err.msg, m2)),
               "rc %d, message: %s", rc, err.msg);
    st_close(r);
}

static void test_broken_files(test_counts *tc) {
    expect_open_err(tc, "st_err_overlap", "{\"w1\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},\"w2\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, 0, "'w1'", "overlap");
    expect_open_err(tc, "st_err_past_end", "{\"w1\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 12, 0, "'w1'", "past the end");
    expect_open_err(tc, "st_err_numel_mismatch", "{\"w1\":{\"dtype\":\"F16\",\"shape\":[3,3],\"data_offsets\":[0,16]}}", 16, 0, "'w1'", "needs 18");
    expect_open_err(tc, "st_err_unknown_dtype", "{\"ok\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w8\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, 0, "'w8'", "F8_E4M3");
    expect_open_err(tc, "st_err_missing_field", "{\"w1\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, 0, "'w1'", "data_offsets");
    expect_open_err(tc, "st_err_bad_shape", "{\"w1\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, 0, "'w1'", "shape");
    expect_open_err(tc, "st_err_absurd_shape", "{\"w1\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,4]}}", 4, 0, "'w1'", "absurd");
    expect_open_err(tc, "st_err_offsets_reversed", "{\"w1\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, 0, "'w1'", "end before");
    expect_open_err(tc, "st_err_duplicate", "{\"w1\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"w1\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, 0, "'w1'", "twice");
    expect_open_err(tc, "st_err_not_json", "{\"w1\": {\"dtype\": F32 oops", 4, 0, "not a JSON object", NULL);
    expect_open_err(tc, "st_err_json_array", "[1, 2, 3]   ", 0, 0, "not a JSON object", NULL);
    expect_open_err(tc, "st_err_huge_header_length", "{}", 0, 0x7fffffffffffffffull, "header length", "larger than the file");
    expect_open_err(tc, "st_err_tiny_file", "", 0, 0, "header", NULL); /* 8 zero bytes: header length 0 */
    char path[256];
    snprintf(path, sizeof path, "%s/five_bytes.safetensors", g_dir);
    FILE *f = fopen(path, "wb");
    fwrite("abcde", 1, 5, f);
    fclose(f);
    st_reader *r = NULL;
    glm_err err = {0};
    TEST_CHECK(tc, "st_err_truncated_to_5_bytes", st_open(&r, path, &err) == -1 && strstr(err.msg, path) && strstr(err.msg, "too short"), "%s", err.msg);
    TEST_CHECK(tc, "st_err_no_such_file", st_open(&r, "/nonexistent/x.safetensors", &err) == -1 && strstr(err.msg, "/nonexistent/x.safetensors"), "%s", err.msg);

    /* A valid file truncated: at open (data cut) and after open (read must fail cleanly). */
    float v[64];
    for (int i = 0; i < 64; i++) v[i] = (float)i;
    st_entry e[2] = {{"first", 1, {32}, v, ST_F32, ST_F32}, {"second", 2, {4, 8}, v + 32, ST_F32, ST_F16}};
    snprintf(path, sizeof path, "%s/trunc.safetensors", g_dir);
    st_save(path, e, 2, 0, &err);
    struct stat st;
    stat(path, &st);
    if (truncate(path, st.st_size - 10) != 0) perror("truncate");
    TEST_CHECK(tc, "st_err_truncated_data", st_open(&r, path, &err) == -1 && strstr(err.msg, "'second'") && strstr(err.msg, "past the end"), "%s", err.msg);
    st_save(path, e, 2, 0, &err);
    int ok = st_open(&r, path, &err) == 0;
    if (truncate(path, st.st_size - 70) != 0) perror("truncate");
    float out[64];
    int64_t sh1[1] = {32}, sh2[2] = {4, 8};
    int rc = ok ? st_read_f32(r, "second", out, 2, sh2, &err) : 0;
    TEST_CHECK(tc, "st_err_truncated_after_open", ok && rc == -1 && strstr(err.msg, "'second'") && strstr(err.msg, path), "ok %d rc %d: %s", ok, rc, err.msg);
    st_close(r);
    /* missing, mis-shaped, wrong dtype */
    st_save(path, e, 2, 0, &err);
    r = NULL;
    st_open(&r, path, &err);
    int64_t wrong[2] = {8, 4};
    rc = r ? st_read_f32(r, "third", out, 1, sh1, &err) : 0;
    TEST_CHECK(tc, "st_err_missing_tensor", rc == -1 && strstr(err.msg, "'third'") && strstr(err.msg, path), "%s", err.msg);
    rc = r ? st_read_f32(r, "second", out, 2, wrong, &err) : 0;
    TEST_CHECK(tc, "st_err_misshaped_tensor", rc == -1 && strstr(err.msg, "'second'") && strstr(err.msg, "[4, 8]") && strstr(err.msg, "[8, 4]"), "%s", err.msg);
    rc = r ? st_read_raw(r, "second", ST_F32, out, 128, &err) : 0;
    TEST_CHECK(tc, "st_err_raw_wrong_dtype", rc == -1 && strstr(err.msg, "'second'") && strstr(err.msg, "F16"), "%s", err.msg);
    rc = r ? st_read_f32(r, "first", out, 1, sh1, &err) : -1;
    TEST_CHECK(tc, "st_read_after_errors_still_works", rc == 0 && out[31] == 31.0f, "%s", err.msg);
    st_close(r);
}

static void test_bad_index(test_counts *tc) {
    char dir[128], p[256];
    glm_err err = {0};
    st_reader *r = NULL;
    float v[4] = {1, 2, 3, 4};
    st_entry e[2] = {{"a", 1, {2}, v, ST_F32, ST_F32}, {"b", 1, {2}, v + 2, ST_F32, ST_F32}};
    snprintf(dir, sizeof dir, "%s/badindex", g_dir);
    st_save(dir, e, 2, 8, &err);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    const char *j = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"zz\": \"model-00001-of-00002.safetensors\"}}";
    glm_write_file_atomic(p, j, strlen(j), &err);
    TEST_CHECK(tc, "st_err_index_tensor_not_in_shard", st_open(&r, dir, &err) == -1 && strstr(err.msg, "'zz'") && strstr(err.msg, "model-00001"), "%s", err.msg);
    j = "{\"weight_map\": {\"a\": \"model-00009-of-00009.safetensors\"}}";
    glm_write_file_atomic(p, j, strlen(j), &err);
    TEST_CHECK(tc, "st_err_index_missing_shard", st_open(&r, p, &err) == -1 && strstr(err.msg, "'a'") && strstr(err.msg, "00009"), "%s", err.msg);
    j = "{\"weight_map\": {\"a\": \"../../etc/passwd\"}}";
    glm_write_file_atomic(p, j, strlen(j), &err);
    TEST_CHECK(tc, "st_err_index_escapes_folder", st_open(&r, p, &err) == -1 && strstr(err.msg, "outside"), "%s", err.msg);
    j = "{\"weight_map\": [1]}";
    glm_write_file_atomic(p, j, strlen(j), &err);
    TEST_CHECK(tc, "st_err_index_no_weight_map", st_open(&r, p, &err) == -1 && strstr(err.msg, "weight_map"), "%s", err.msg);
    j = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"a\": \"model-00002-of-00002.safetensors\"}}";
    glm_write_file_atomic(p, j, strlen(j), &err);
    TEST_CHECK(tc, "st_err_index_names_a_tensor_twice", st_open(&r, p, &err) == -1 && strstr(err.msg, "'a'") && strstr(err.msg, "twice"),
               "%s", err.msg);
}

int main(void) {
    test_counts tc = {0};
    snprintf(g_dir, sizeof g_dir, "/tmp/glm_st_XXXXXX");
    if (!mkdtemp(g_dir)) { TEST_FAIL(&tc, "st_tempdir", "mkdtemp failed"); TEST_EXIT(&tc); }
    test_conversions(&tc);
    test_roundtrip(&tc);
    test_broken_files(&tc);
    test_bad_index(&tc);
    rmtree(g_dir);
    TEST_EXIT(&tc);
}
