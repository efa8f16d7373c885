/* torch .bin import on hand-built archives: dtypes, shared storages, offset and strided views,
 * zip64, protocol-4 opcodes, sharded index; and hostile archives/pickles that must fail with
 * a message naming the file (and tensor), never crash. Real torch.save files are covered by
 * tests/py/test_torchbin.py. */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "io/torchbin.h"
#include "test.h"
#include "torchbin_fixture.h"

static char g_dir[64];
static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) { return remove(p); }

static fx_buf floats(int n, float base) {
    fx_buf b = {0};
    for (int i = 0; i < n; i++) { float v = base + (float)i; fx_put(&b, &v, 4); }
    return b;
}
static fx_buf halfs(int n, float base) {
    fx_buf b = {0};
    for (int i = 0; i < n; i++) { uint16_t h = st_f32_to_f16(base + (float)i); fx_put(&b, &h, 2); }
    return b;
}

/* Writes root/data.pkl + storages into g_dir/name and returns the path in a static buffer. */
static const char *archive(const char *name, const fx_buf *pkl, const fx_buf *st, int nst, int zip64) {
    static char path[256];
    fx_buf z = {0};
    fx_archive(&z, "pytorch_model", pkl, st, nst, zip64);
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    fx_write(path, &z);
    free(z.p);
    return path;
}

static void dict_begin(fx_buf *b) { pk_op(b, 0x80); pk_op(b, 2); pk_op(b, '}'); pk_op(b, '('); }
static void dict_end(fx_buf *b) { pk_op(b, 'u'); pk_op(b, '.'); }

static int read_ok(tbin_reader *r, const char *name, int nd, const int64_t *sh, const float *want, int n, glm_err *err) {
    float got[64];
    if (tbin_read_f32(r, name, got, nd, sh, err) != 0) return 0;
    for (int i = 0; i < n; i++) if (got[i] != want[i]) { snprintf(err->msg, sizeof err->msg, "%s[%d] = %g, want %g", name, i, got[i], want[i]); return 0; }
    return 1;
}

static void test_good(test_counts *tc) {
    glm_err err = {0};
    fx_buf st[3] = {floats(10, 0.0f), halfs(6, 100.0f), {0}};
    uint16_t bf[3] = {0x3f80, 0xc000, 0x4040}; /* 1, -2, 3 */
    fx_put(&st[2], bf, sizeof bf);
    fx_buf p = {0};
    /* OrderedDict() + SETITEMS + BUILD(_metadata), as torch.save(model.state_dict()) writes. */
    pk_op(&p, 0x80); pk_op(&p, 2);
    pk_global(&p, "collections", "OrderedDict"); pk_op(&p, 'q'); pk_op(&p, 0); pk_op(&p, ')'); pk_op(&p, 'R'); pk_op(&p, '(');
    int64_t s5[1] = {5}, c1[1] = {1}, s22[2] = {2, 2}, c21[2] = {2, 1}, s32[2] = {3, 2}, c13[2] = {1, 3}, s3[1] = {3};
    pk_str(&p, "a.whole"); pk_tensor(&p, "FloatStorage", "0", 10, 0, 1, s5, c1);
    pk_str(&p, "b.view_offset6"); pk_tensor(&p, "FloatStorage", "0", 10, 6, 2, s22, c21);   /* shares storage 0 */
    pk_str(&p, "c.half_transposed"); pk_tensor(&p, "HalfStorage", "1", 6, 0, 2, s32, c13); /* strided gather */
    pk_str(&p, "d.bf16"); pk_tensor(&p, "BFloat16Storage", "2", 3, 0, 1, s3, c1);
    pk_str(&p, "e.param");
    pk_global(&p, "torch._utils", "_rebuild_parameter"); pk_op(&p, '(');
    pk_tensor(&p, "FloatStorage", "0", 10, 1, 1, s3, c1); pk_op(&p, 0x88); pk_op(&p, 'h'); pk_op(&p, 0); pk_op(&p, ')'); pk_op(&p, 'R');
    pk_op(&p, 't'); pk_op(&p, 'R');
    pk_op(&p, 'u');
    pk_op(&p, '}'); pk_str(&p, "_metadata"); pk_op(&p, '}'); pk_op(&p, 's'); pk_op(&p, 'b'); pk_op(&p, '.');
    for (int z64 = 0; z64 < 2; z64++) {
        const char *path = archive(z64 ? "good64.bin" : "good.bin", &p, st, 3, z64);
        tbin_reader *r = NULL;
        int ok = tbin_open(&r, path, &err) == 0;
        float wa[5] = {0, 1, 2, 3, 4}, wb[4] = {6, 7, 8, 9}, wc[6] = {100, 103, 101, 104, 102, 105}, wd[3] = {1, -2, 3}, we[3] = {1, 2, 3};
        int64_t s2x2[2] = {2, 2};
        ok = ok && tbin_count(r) == 5 && strcmp(tbin_name(r, 0), "a.whole") == 0 && read_ok(r, "a.whole", 1, s5, wa, 5, &err) &&
             read_ok(r, "b.view_offset6", 2, s2x2, wb, 4, &err) && read_ok(r, "c.half_transposed", 2, s32, wc, 6, &err) &&
             read_ok(r, "d.bf16", 1, s3, wd, 3, &err) && read_ok(r, "e.param", 1, s3, we, 3, &err);
        uint16_t raw[6];
        ok = ok && tbin_read_raw(r, "c.half_transposed", ST_F16, raw, sizeof raw, &err) == 0 && raw[1] == st_f32_to_f16(103.0f);
        st_dtype dt = ST_NDTYPES;
        int nd = 0;
        int64_t sh[ST_MAX_DIMS];
        ok = ok && tbin_info(r, "c.half_transposed", &dt, &nd, sh) == 0 && dt == ST_F16 && nd == 2 && sh[0] == 3 && sh[1] == 2 &&
             tbin_info(r, "nope", NULL, NULL, NULL) == -1;
        TEST_CHECK(tc, z64 ? "tbin_zip64_archive" : "tbin_dtypes_shared_offset_strided_parameter", ok, "%s", err.msg);
        tbin_close(r);
    }
    /* protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, BINGET of a memoized global */
    fx_buf q = {0};
    pk_op(&q, 0x80); pk_op(&q, 4); pk_op(&q, 0x95); fx_le(&q, 0, 8);
    pk_op(&q, '}'); pk_op(&q, 0x94); pk_op(&q, '(');
    pk_op(&q, 0x8c); pk_op(&q, 1); pk_op(&q, 'w'); pk_op(&q, 0x94);
    pk_op(&q, 0x8c); pk_op(&q, 12); fx_put(&q, "torch._utils", 12); pk_op(&q, 0x8c); pk_op(&q, 18); fx_put(&q, "_rebuild_tensor_v2", 18);
    pk_op(&q, 0x93); pk_op(&q, 0x94); /* memo 2 */
    pk_op(&q, '(');
    pk_op(&q, '('); pk_op(&q, 0x8c); pk_op(&q, 7); fx_put(&q, "storage", 7);
    pk_op(&q, 0x8c); pk_op(&q, 5); fx_put(&q, "torch", 5); pk_op(&q, 0x8c); pk_op(&q, 12); fx_put(&q, "FloatStorage", 12); pk_op(&q, 0x93);
    pk_op(&q, 0x8c); pk_op(&q, 1); pk_op(&q, '0'); pk_op(&q, 0x8c); pk_op(&q, 3); fx_put(&q, "cpu", 3); pk_op(&q, 'K'); pk_op(&q, 10); pk_op(&q, 't');
    pk_op(&q, 'Q'); pk_op(&q, 'K'); pk_op(&q, 2); pk_op(&q, 'K'); pk_op(&q, 2); pk_op(&q, 0x85); pk_op(&q, 'K'); pk_op(&q, 1); pk_op(&q, 0x85);
    pk_op(&q, 0x89); pk_op(&q, 'N'); pk_op(&q, 't'); pk_op(&q, 'R');
    pk_op(&q, 'u'); pk_op(&q, '.');
    const char *path = archive("proto4.bin", &q, st, 1, 0);
    tbin_reader *r = NULL;
    float w2[2] = {2, 3};
    int64_t s2[1] = {2};
    int ok = tbin_open(&r, path, &err) == 0 && read_ok(r, "w", 1, s2, w2, 2, &err);
    TEST_CHECK(tc, "tbin_protocol4_opcodes", ok, "%s", err.msg);
    tbin_close(r);

    /* sharded: two archives + index; folder open */
    char dir[128], ip[256], p1[256];
    snprintf(dir, sizeof dir, "%s/sharded", g_dir);
    glm_mkdirs(dir, &err);
    snprintf(p1, sizeof p1, "sharded/pytorch_model-00001-of-00002.bin");
    archive(p1, &p, st, 3, 0);
    snprintf(p1, sizeof p1, "sharded/pytorch_model-00002-of-00002.bin");
    archive(p1, &q, st, 1, 1);
    const char *ix = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {\"a.whole\": \"pytorch_model-00001-of-00002.bin\", "
                     "\"c.half_transposed\": \"pytorch_model-00001-of-00002.bin\", \"w\": \"pytorch_model-00002-of-00002.bin\"}}";
    snprintf(ip, sizeof ip, "%s/pytorch_model.bin.index.json", dir);
    glm_write_file_atomic(ip, ix, strlen(ix), &err);
    r = NULL;
    float wa[5] = {0, 1, 2, 3, 4};
    ok = tbin_open(&r, dir, &err) == 0 && tbin_count(r) == 3 && read_ok(r, "w", 1, s2, w2, 2, &err) && read_ok(r, "a.whole", 1, s5, wa, 5, &err);
    TEST_CHECK(tc, "tbin_sharded_index", ok, "%s", err.msg);
    float out[16];
    int64_t bad[1] = {4};
    int rc = r ? tbin_read_f32(r, "a.whole", out, 1, bad, &err) : 0;
    TEST_CHECK(tc, "tbin_err_misshaped", rc == -1 && strstr(err.msg, "'a.whole'") && strstr(err.msg, "[5]") && strstr(err.msg, "00001"), "%s", err.msg);
    rc = r ? tbin_read_f32(r, "b.view_offset6", out, 1, bad, &err) : 0; /* in the shard but not in weight_map */
    TEST_CHECK(tc, "tbin_err_missing_tensor", rc == -1 && strstr(err.msg, "'b.view_offset6'") && strstr(err.msg, "not found"), "%s", err.msg);
    tbin_close(r);
    ix = "{\"weight_map\": {\"zz\": \"pytorch_model-00001-of-00002.bin\"}}";
    glm_write_file_atomic(ip, ix, strlen(ix), &err);
    TEST_CHECK(tc, "tbin_err_index_lists_absent_tensor", tbin_open(&r, ip, &err) == -1 && strstr(err.msg, "'zz'"), "%s", err.msg);

    /* truncated after open: the read fails with a message */
    path = archive("cut_later.bin", &p, st, 3, 0);
    r = NULL;
    ok = tbin_open(&r, path, &err) == 0;
    if (truncate(path, 20) != 0) perror("truncate");
    rc = ok ? tbin_read_f32(r, "c.half_transposed", out, 2, s32, &err) : 0;
    TEST_CHECK(tc, "tbin_err_truncated_after_open", ok && rc == -1 && strstr(err.msg, "'c.half_transposed'") && strstr(err.msg, path), "%s", err.msg);
    tbin_close(r);
    for (int i = 0; i < 3; i++) free(st[i].p);
    free(p.p);
    free(q.p);
}

/* One hostile case: archive(pickle, storages) must fail to open with m1 (and m2) in the message. */
static void expect_err(test_counts *tc, const char *name, const fx_buf *pkl, int nst, const char *m1, const char *m2) {
    fx_buf st[2] = {floats(10, 0.0f), floats(4, 0.0f)};
    const char *path = archive(name, pkl, st, nst, 0);
    tbin_reader *r = NULL;
    glm_err err = {0};
    int rc = tbin_open(&r, path, &err);
    TEST_CHECK(tc, name, rc == -1 && !r && strstr(err.msg, path) && strstr(err.msg, m1) && (!m2 || strstr(err.msg, m2)), "rc %d: %s", rc, err.msg);
    tbin_close(r);
    free(st[0].p);
    free(st[1].p);
}

static void one_tensor(fx_buf *b, const char *stype, int64_t numel, int64_t off, int nd, const int64_t *sh, const int64_t *sd) {
    dict_begin(b);
    pk_str(b, "w");
    pk_tensor(b, stype, "0", numel, off, nd, sh, sd);
    dict_end(b);
}

static void test_hostile(test_counts *tc) {
    fx_buf b = {0};
    int64_t s4[1] = {4}, c1[1] = {1}, s20[1] = {20}, big[3] = {1ll << 40, 1ll << 40, 1ll << 40}, bigs[3] = {1, 1, 1};
    int64_t nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1}, neg[1] = {-2};
#define CASE(name, build, nst, m1, m2) do { b.n = 0; build; expect_err(tc, name, &b, nst, m1, m2); } while (0)
    CASE("tbin_err_lying_storage_size", one_tensor(&b, "FloatStorage", 100, 0, 1, s4, c1), 1, "'w'", "holds 40 bytes");
    CASE("tbin_err_view_past_storage", one_tensor(&b, "FloatStorage", 10, 0, 1, s20, c1), 1, "'w'", "reaches element 19");
    CASE("tbin_err_offset_past_storage", one_tensor(&b, "FloatStorage", 10, 8, 1, s4, c1), 1, "'w'", "reaches element");
    CASE("tbin_err_absurd_shape", one_tensor(&b, "FloatStorage", 10, 0, 3, big, bigs), 1, "'w'", "absurd");
    CASE("tbin_err_too_many_dims", one_tensor(&b, "FloatStorage", 10, 0, 9, nine, nine), 1, "'w'", "9 dimensions");
    CASE("tbin_err_negative_size", one_tensor(&b, "FloatStorage", 10, 0, 1, neg, c1), 1, "'w'", "non-negative");
    CASE("tbin_err_missing_storage_entry", one_tensor(&b, "FloatStorage", 10, 0, 1, s4, c1), 0, "'w'", "missing");
    CASE("tbin_err_unknown_storage_type", one_tensor(&b, "ComplexFloatStorage", 10, 0, 1, s4, c1), 1, "ComplexFloatStorage", NULL);
    CASE("tbin_err_absurd_storage_numel", one_tensor(&b, "FloatStorage", INT64_MAX, 0, 1, s4, c1), 1, "claims", NULL);
    CASE("tbin_err_truncated_pickle", (one_tensor(&b, "FloatStorage", 10, 0, 1, s4, c1), b.n -= 20), 1, "truncated", NULL);
    CASE("tbin_err_unsupported_opcode", (dict_begin(&b), pk_op(&b, 'S'), dict_end(&b)), 1, "opcode 0x53", NULL);
    CASE("tbin_err_stack_underflow", (pk_op(&b, 0x80), pk_op(&b, 2), pk_op(&b, 'R'), pk_op(&b, '.')), 1, "underflow", NULL);
    CASE("tbin_err_setitems_without_mark", (pk_op(&b, '}'), pk_op(&b, 'u'), pk_op(&b, '.')), 1, "MARK", NULL);
    CASE("tbin_err_memo_index_huge", (pk_op(&b, '}'), pk_op(&b, 'r'), fx_le(&b, 0xfffffff0u, 4), pk_op(&b, '.')), 1, "memo index", NULL);
    CASE("tbin_err_memo_get_unset", (pk_op(&b, 'h'), pk_op(&b, 7), pk_op(&b, '.')), 1, "memo entry 7", NULL);
    CASE("tbin_err_long_too_big", (pk_op(&b, 0x8a), pk_op(&b, 9), fx_le(&b, 0, 8), pk_op(&b, 0), pk_op(&b, '.')), 1, "too large", NULL);
    CASE("tbin_err_string_past_end", (pk_op(&b, 'X'), fx_le(&b, 0x7fffffff, 4), pk_op(&b, '.')), 1, "truncated", NULL);
    CASE("tbin_err_top_level_list", (pk_op(&b, ']'), pk_op(&b, '.')), 1, "list", "dict of tensors");
    CASE("tbin_err_no_stop", (pk_op(&b, '}')), 1, "without STOP", NULL);
    CASE("tbin_err_rebuild_bad_args", (dict_begin(&b), pk_str(&b, "w"), pk_global(&b, "torch._utils", "_rebuild_tensor_v2"), pk_op(&b, ')'), pk_op(&b, 'R'), dict_end(&b)), 1, "_rebuild_tensor_v2", NULL);
    CASE("tbin_err_bad_persistent_id", (pk_op(&b, 'K'), pk_op(&b, 1), pk_op(&b, 'Q'), pk_op(&b, '.')), 1, "persistent id", NULL);
    CASE("tbin_err_duplicate_name", (dict_begin(&b), pk_str(&b, "w"), pk_tensor(&b, "FloatStorage", "0", 10, 0, 1, s4, c1), pk_str(&b, "w"), pk_tensor(&b, "FloatStorage", "0", 10, 0, 1, s4, c1), dict_end(&b)), 1, "'w'", "twice");
    CASE("tbin_err_stack_too_deep", (pk_op(&b, '('), ({ for (int i = 0; i < 1100000; i++) pk_op(&b, 'N'); }), pk_op(&b, '.')), 1, "stack deeper", NULL);
    CASE("tbin_err_marks_too_deep", (({ for (int i = 0; i < 200000; i++) pk_op(&b, '('); }), pk_op(&b, '.')), 1, "MARK", NULL);
    CASE("tbin_err_odd_setitems", (dict_begin(&b), pk_str(&b, "w"), dict_end(&b)), 1, "odd", NULL);
#undef CASE
    free(b.p);

    /* container-level damage */
    fx_buf st[1] = {floats(10, 0.0f)}, p = {0}, z = {0};
    one_tensor(&p, "FloatStorage", 10, 0, 1, s4, c1);
    fx_archive(&z, "arch", &p, st, 1, 0);
    char path[256];
    glm_err err = {0};
    tbin_reader *r = NULL;
    struct { const char *name; size_t cut; const char *m; } cuts[] = {{"tbin_err_truncated_half", z.n / 2, "end-of-directory"}, {"tbin_err_truncated_3_bytes", 3, "too short"}};
    for (int i = 0; i < 2; i++) {
        fx_buf t = {z.p, cuts[i].cut, 0};
        snprintf(path, sizeof path, "%s/%s.bin", g_dir, cuts[i].name);
        fx_write(path, &t);
        TEST_CHECK(tc, cuts[i].name, tbin_open(&r, path, &err) == -1 && strstr(err.msg, path) && strstr(err.msg, cuts[i].m), "%s", err.msg);
    }
    /* compressed entry: flip the method of data.pkl in the central directory (first entry written) */
    fx_buf c = {0};
    fx_put(&c, z.p, z.n);
    for (size_t i = 0; i + 4 <= c.n; i++)
        if (memcmp(c.p + i, "PK\1\2", 4) == 0) { c.p[i + 10] = 8; break; }
    snprintf(path, sizeof path, "%s/compressed.bin", g_dir);
    fx_write(path, &c);
    TEST_CHECK(tc, "tbin_err_compressed_entry", tbin_open(&r, path, &err) == -1 && strstr(err.msg, "compressed") && err.hint[0], "%s", err.msg);
    /* a storage entry claiming more bytes than the file holds */
    c.n = 0;
    fx_put(&c, z.p, z.n);
    for (size_t i = 0; i + 4 <= c.n; i++)
        if (memcmp(c.p + i, "PK\1\2", 4) == 0 && memcmp(c.p + i + 46, "arch/data/0", 11) == 0) {
            uint32_t v = 0x7fffffff;
            memcpy(c.p + i + 20, &v, 4);
            memcpy(c.p + i + 24, &v, 4);
        }
    snprintf(path, sizeof path, "%s/lying_zip_size.bin", g_dir);
    fx_write(path, &c);
    TEST_CHECK(tc, "tbin_err_zip_size_past_end", tbin_open(&r, path, &err) == -1 && strstr(err.msg, "past the end") && strstr(err.msg, "'w'"), "%s", err.msg);
    const unsigned char legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, '.'};
    snprintf(path, sizeof path, "%s/legacy.bin", g_dir);
    fx_write(path, &(fx_buf){(unsigned char *)legacy, sizeof legacy, 0});
    TEST_CHECK(tc, "tbin_err_legacy_format", tbin_open(&r, path, &err) == -1 && strstr(err.msg, "legacy") && err.hint[0], "%s", err.msg);
    snprintf(path, sizeof path, "%s/html.bin", g_dir);
    fx_write(path, &(fx_buf){(unsigned char *)"<html>404</html>", 16, 0});
    TEST_CHECK(tc, "tbin_err_not_zip", tbin_open(&r, path, &err) == -1 && strstr(err.msg, "not a torch.save zip"), "%s", err.msg);
    TEST_CHECK(tc, "tbin_err_no_such_file", tbin_open(&r, "/nonexistent/p.bin", &err) == -1 && strstr(err.msg, "/nonexistent/p.bin"), "%s", err.msg);
    free(st[0].p); free(p.p); free(z.p); free(c.p);
}

int main(void) {
    test_counts tc = {0};
    snprintf(g_dir, sizeof g_dir, "/tmp/glm_tbin_XXXXXX");
    if (!mkdtemp(g_dir)) { TEST_FAIL(&tc, "tbin_tempdir", "mkdtemp failed"); TEST_EXIT(&tc); }
    test_good(&tc);
    test_hostile(&tc);
    nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    TEST_EXIT(&tc);
}
