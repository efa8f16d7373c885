/* GLM-4's byte-level BPE on rank files written here: the merge order (lowest rank first, leftmost
 * on a tie, a whole-piece token before any merge), special tokens only when asked, the public
 * interface for GLM_TOK_GLM4 (vocab, specials, eos, stop ids, build_inputs, pieces, decode with and
 * without U+FFFD), invalid UTF-8 refused with its byte offset, and every malformed rank file
 * refused naming the file and the line. tests/py/test_tokenizer_glm4.py compares with tiktoken. */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "tokenizer/tokenizer.h"
#include "test.h"

static char g_dir[64];
static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) { return remove(p); }

static void b64(const uint8_t *s, size_t n, char *out) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0) | (i + 2 < n ? s[i + 2] : 0);
        out[o++] = A[v >> 18 & 63];
        out[o++] = A[v >> 12 & 63];
        out[o++] = i + 1 < n ? A[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? A[v & 63] : '=';
    }
    out[o] = 0;
}

/* Writes folder/tokenizer.model: the 256 single bytes as ranks 0..255 (unless skip_byte >= 0),
 * then `extra` tokens as ranks 256.., then the raw `tail` text. Returns the folder. */
static const char *write_ranks(const char *name, const char *const *extra, int n_extra, int skip_byte, const char *tail) {
    static char dir[128];
    char path[256], line[128];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, name);
    glm_mkdirs(dir, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    FILE *f = fopen(path, "wb");
    int r = 0;
    for (int c = 0; c < 256; c++) {
        if (c == skip_byte) continue;
        uint8_t byte = (uint8_t)c;
        b64(&byte, 1, line);
        fprintf(f, "%s %d\n", line, r++);
    }
    for (int i = 0; i < n_extra; i++) {
        b64((const uint8_t *)extra[i], strlen(extra[i]), line);
        fprintf(f, "%s %d\n", line, r++);
    }
    if (tail) fputs(tail, f);
    fclose(f);
    return dir;
}

static void check_ids(test_counts *tc, const glm_tokenizer *t, const char *name, const char *text, int flags,
                      const int32_t *want, int n) {
    glm_ids v = {0};
    glm_err err = {{0}, {0}};
    int rc = glm_tokenizer_encode_ex(t, text, strlen(text), flags, &v, &err);
    int ok = rc == 0 && v.n == n;
    for (int i = 0; ok && i < n; i++) ok = v.data[i] == want[i];
    char got[256] = "";
    for (int i = 0; i < v.n && strlen(got) < 200; i++) snprintf(got + strlen(got), sizeof got - strlen(got), " %d", v.data[i]);
    TEST_CHECK(tc, name, ok, "\"%s\": rc %d %s, got%s", text, rc, err.msg, got);
    glm_ids_free(&v);
}

/* Tokens 256..: the ranks decide, not the order the merges could be learnt in. */
static const char *const kExtra[] = {"aaa", "aa", "bc", "ab", "abcd", "\xe4\xbd\xa0\xe5\xa5\xbd", " x", "  "};
enum { AAA = 256, AA, BC, AB, ABCD, NIHAO, SPX, SP2, N_RANKS };

static void test_merges(test_counts *tc, const glm_tokenizer *t) {
    check_ids(tc, t, "glm4_rank_beats_position", "aaaa", 0, (int32_t[]){AAA, 'a'}, 2); /* aa|a|a, then aaa (256) < aa */
    check_ids(tc, t, "glm4_leftmost_on_tie", "aaaaa", 0, (int32_t[]){AAA, AA}, 2); /* rightmost first: aa|aaa */
    check_ids(tc, t, "glm4_lowest_rank_first", "abc", 0, (int32_t[]){'a', BC}, 2); /* bc (258) before ab (259) */
    check_ids(tc, t, "glm4_whole_piece_token", "abcd", 0, (int32_t[]){ABCD}, 1);  /* no path of merges reaches it */
    check_ids(tc, t, "glm4_no_path_to_longer", "abcde", 0, (int32_t[]){'a', BC, 'd', 'e'}, 4);
    check_ids(tc, t, "glm4_utf8_token", "\xe4\xbd\xa0\xe5\xa5\xbd", 0, (int32_t[]){NIHAO}, 1);
    check_ids(tc, t, "glm4_unmerged_utf8_bytes", "\xe5\xa5\xbd", 0, (int32_t[]){0xe5, 0xa5, 0xbd}, 3);
    check_ids(tc, t, "glm4_regex_splits", "aaa  x", 0, (int32_t[]){AAA, ' ', SPX}, 3); /* "aaa" " " " x" */
    check_ids(tc, t, "glm4_empty_text", "", 0, NULL, 0);
}

static void test_specials(test_counts *tc, const glm_tokenizer *t) {
    const int n = N_RANKS;
    glm_special_ids s = glm_tokenizer_specials(t);
    TEST_CHECK(tc, "glm4_kind_and_vocab", glm_tokenizer_kind(t) == GLM_TOK_GLM4 && glm_tokenizer_vocab_size(t) == n + 14 &&
               glm_tokenizer_spm_size(t) == n, "kind %d vocab %d spm %d", glm_tokenizer_kind(t),
               glm_tokenizer_vocab_size(t), glm_tokenizer_spm_size(t));
    TEST_CHECK(tc, "glm4_special_ids", s.mask == n + 1 && s.gmask == n + 2 && s.sop == n + 4 && s.eop == n + 5 &&
               s.pad == n && s.unk == -1 && glm_tokenizer_eos(t) == n, "mask %d gmask %d sop %d eop %d pad %d unk %d eos %d",
               s.mask, s.gmask, s.sop, s.eop, s.pad, s.unk, glm_tokenizer_eos(t));
    int32_t stop[4];
    int ns = glm_tokenizer_stop_ids(t, stop);
    TEST_CHECK(tc, "glm4_stop_ids", ns == 3 && stop[0] == n && stop[1] == n + 7 && stop[2] == n + 9, "%d ids", ns);
    const char *p = glm_tokenizer_piece(t, n + 13), *q = glm_tokenizer_piece(t, AB);
    TEST_CHECK(tc, "glm4_pieces_by_id", p && !strcmp(p, "<|end_of_video|>") && q && !strcmp(q, "ab") &&
               !glm_tokenizer_piece(t, n + 14) && !glm_tokenizer_piece(t, -1), "%s %s", p ? p : "NULL", q ? q : "NULL");
    TEST_CHECK(tc, "glm4_piece_ids", glm_tokenizer_piece_id(t, "<|user|>") == n + 7 && glm_tokenizer_piece_id(t, "aaa") == AAA &&
               glm_tokenizer_piece_id(t, "zz") == -1, "%d %d", glm_tokenizer_piece_id(t, "<|user|>"),
               glm_tokenizer_piece_id(t, "aaa"));
    /* Without the flag "<|user|>" is text: "<|" "user" "|>" by the regex, each of them bytes. */
    check_ids(tc, t, "glm4_special_text_is_text", "<|user|>", 0, (int32_t[]){'<', '|', 'u', 's', 'e', 'r', '|', '>'}, 8);
    check_ids(tc, t, "glm4_encode_special", "aa<|user|>[gMASK]<sop>abcd<|user", GLM_TOK_ENCODE_SPECIAL,
              (int32_t[]){AA, n + 7, n + 2, n + 4, ABCD, '<', '|', 'u', 's', 'e', 'r'}, 11);
    check_ids(tc, t, "glm4_add_special_prefix", "aa", GLM_TOK_ADD_SPECIAL, (int32_t[]){n + 2, n + 4, AA}, 3);
    glm_ids out = {0};
    glm_tokenizer_build_inputs(t, (int32_t[]){1, 2}, 2, (int32_t[]){3}, 1, &out);
    TEST_CHECK(tc, "glm4_build_inputs_pair", out.n == 6 && out.data[0] == n + 2 && out.data[1] == n + 4 && out.data[2] == 1 &&
               out.data[4] == 3 && out.data[5] == n, "n %d", out.n);
    glm_ids_free(&out);
    glm_pieces ps;
    int rc = glm_tokenizer_encode_pieces(t, "abc x", 5, GLM_TOK_ADD_SPECIAL, &ps, NULL);
    char joined[128] = "";
    for (int i = 0; !rc && i < ps.n; i++) snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", i ? "|" : "", ps.data + ps.off[i]);
    TEST_CHECK(tc, "glm4_encode_pieces", !rc && !strcmp(joined, "[gMASK]|<sop>|a|bc| x"), "%s", joined);
    if (!rc) glm_pieces_free(&ps);
}

static void test_decode(test_counts *tc, const glm_tokenizer *t) {
    const int n = N_RANKS;
    size_t len;
    char *d = glm_tokenizer_decode_ex(t, (int32_t[]){n + 2, n + 4, NIHAO, AB, n, 9999, -3}, 7, 0, &len);
    TEST_CHECK(tc, "glm4_decode_drops_specials", len == 8 && !strcmp(d, "\xe4\xbd\xa0\xe5\xa5\xbd" "ab"), "%zu \"%s\"", len, d);
    free(d);
    /* e4 bd (a cut character) then 'a', then ff: Python's "replace" gives one U+FFFD per maximal bad run */
    const int32_t cut[] = {0xe4, 0xbd, 'a', 0xff, 0xe4};
    d = glm_tokenizer_decode_ex(t, cut, 5, 0, &len);
    TEST_CHECK(tc, "glm4_decode_replaces_bad_utf8", len == 10 && !memcmp(d, "\xef\xbf\xbd" "a\xef\xbf\xbd\xef\xbf\xbd", 10),
               "%zu bytes", len);
    free(d);
    d = glm_tokenizer_decode_ex(t, cut, 5, GLM_TOK_SPM_ONLY, &len);
    TEST_CHECK(tc, "glm4_decode_raw_bytes", len == 5 && !memcmp(d, "\xe4\xbd" "a\xff\xe4", 5), "%zu bytes", len);
    free(d);
    /* a NUL byte in the text survives the round trip */
    glm_ids v = {0};
    int rc = glm_tokenizer_encode(t, "a\0b", 3, &v, NULL);
    d = glm_tokenizer_decode_ex(t, v.data, v.n, 0, &len);
    TEST_CHECK(tc, "glm4_nul_round_trip", rc == 0 && len == 3 && !memcmp(d, "a\0b", 3), "rc %d len %zu", rc, len);
    free(d);
    glm_ids_free(&v);
    /* 4 MB of spaces with a newline every MB: pieces of ~1 MB merged into "  " tokens through the
     * heap, and PCRE2's backtracking over runs that long */
    size_t big = 4u << 20;
    char *s = malloc(big);
    for (size_t i = 0; i < big; i++) s[i] = (i % (1u << 20)) == 999999 ? '\n' : ' ';
    glm_err err = {{0}, {0}};
    rc = glm_tokenizer_encode(t, s, big, &v, &err);
    d = rc ? NULL : glm_tokenizer_decode_ex(t, v.data, v.n, 0, &len);
    TEST_CHECK(tc, "glm4_long_whitespace_run", rc == 0 && len == big && !memcmp(d, s, big), "rc %d %s", rc, err.msg);
    free(d);
    free(s);
    glm_ids_free(&v);
}

static void test_bad_utf8(test_counts *tc, const glm_tokenizer *t) {
    const char *bad[] = {"abc\xff", "abc\xc0\xaf", "abc\xed\xa0\x80", "abc\xf4\x90\x80\x80", "abc\xe4\xbd"};
    for (int i = 0; i < 5; i++) {
        glm_ids v = {0};
        glm_err err = {{0}, {0}};
        int rc = glm_tokenizer_encode_ex(t, bad[i], strlen(bad[i]), GLM_TOK_ENCODE_SPECIAL, &v, &err);
        char name[64];
        snprintf(name, sizeof name, "glm4_invalid_utf8_%d", i);
        TEST_CHECK(tc, name, rc == -1 && strstr(err.msg, "not valid UTF-8 at byte 3"), "rc %d: %s", rc, err.msg);
        glm_ids_free(&v);
    }
}

/* A malformed file fails to load, naming the file and (where there is one) the line. */
static void expect_error(test_counts *tc, const char *name, const char *dir, const char *needle) {
    glm_tokenizer *t = NULL;
    glm_err err = {{0}, {0}};
    int rc = glm_tokenizer_load(&t, dir, &err);
    TEST_CHECK(tc, name, rc == -1 && !t && strstr(err.msg, needle) && strstr(err.msg, "tokenizer.model"),
               "rc %d \"%s\" (wanted \"%s\")", rc, err.msg, needle);
    glm_tokenizer_free(t);
}

static void test_bad_files(test_counts *tc) {
    const char *ab[] = {"ab"};
    expect_error(tc, "glm4_err_no_rank", write_ranks("e1", ab, 1, -1, "YWJj\n"), "line 258: \"YWJj\" has no rank");
    expect_error(tc, "glm4_err_bad_base64", write_ranks("e2", ab, 1, -1, "YW*j 257\n"), "line 258: \"YW*j\" is not base64");
    expect_error(tc, "glm4_err_bad_padding", write_ranks("e3", ab, 1, -1, "YWJ 257\n"), "line 258: \"YWJ\" is not base64");
    expect_error(tc, "glm4_err_duplicate_rank", write_ranks("e4", ab, 1, -1, "YWJj 256\n"),
                 "line 258: rank 256 was already given on line 257");
    expect_error(tc, "glm4_err_duplicate_token", write_ranks("e5", ab, 1, -1, "YWI= 257\n"), "line 258: token \"YWI=\"");
    expect_error(tc, "glm4_err_rank_out_of_range", write_ranks("e6", ab, 1, -1, "YWJj 300\n"),
                 "line 258: rank 300 is out of range: the file has 258 tokens");
    expect_error(tc, "glm4_err_rank_not_number", write_ranks("e7", ab, 1, -1, "YWJj 25x\n"), "line 258: rank \"25x\" is not a number");
    expect_error(tc, "glm4_err_three_fields", write_ranks("e8", ab, 1, -1, "YWJj 257 1\n"), "line 258: more than two fields");
    expect_error(tc, "glm4_err_empty_line", write_ranks("e9", ab, 1, -1, "\nYWJj 258\n"), "line 258 is empty");
    expect_error(tc, "glm4_err_missing_byte", write_ranks("e10", ab, 1, 0x41, NULL), "no token is the single byte 0x41");
    /* the first line decides the format: a line without rank there is still named */
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "%s/e11", g_dir);
    glm_mkdirs(dir, NULL);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    FILE *f = fopen(path, "wb");
    fputs("QQ==\n", f);
    fclose(f);
    expect_error(tc, "glm4_err_first_line", dir, "line 1: \"QQ==\" has no rank");
}

/* A SentencePiece model refuses the GLM-4-only flag rather than ignoring it. */
static void test_spm_refuses_flag(test_counts *tc) {
    const uint8_t model[] = {0x0a, 0x0e, 0x0a, 0x05, '<', 'u', 'n', 'k', '>', 0x15, 0, 0, 0, 0, 0x18, 0x02, /* <unk> */
                             0x0a, 0x08, 0x0a, 0x01, 'a', 0x15, 0, 0, 0x80, 0xbf};                      /* a, -1 */
    char path[256];
    snprintf(path, sizeof path, "%s/plain.model", g_dir);
    FILE *f = fopen(path, "wb");
    fwrite(model, 1, sizeof model, f);
    fclose(f);
    glm_tokenizer *t = NULL;
    glm_err err = {{0}, {0}};
    int rc = glm_tokenizer_load(&t, path, &err);
    glm_ids v = {0};
    int rc2 = rc ? 0 : glm_tokenizer_encode_ex(t, "a", 1, GLM_TOK_ENCODE_SPECIAL, &v, &err);
    int32_t stop[4];
    TEST_CHECK(tc, "glm4_flag_refused_by_sentencepiece", rc == 0 && glm_tokenizer_kind(t) == GLM_TOK_SPM && rc2 == -1 &&
               strstr(err.msg, "not supported by this kind") && glm_tokenizer_stop_ids(t, stop) == 0, "rc %d rc2 %d: %s", rc,
               rc2, err.msg);
    glm_ids_free(&v);
    glm_tokenizer_free(t);
}

int main(void) {
    test_counts tc = {0};
    snprintf(g_dir, sizeof g_dir, "/tmp/glm_tok4_%d", (int)getpid());
    glm_mkdirs(g_dir, NULL);
    glm_tokenizer *t = NULL;
    glm_err err = {{0}, {0}};
    const char *dir = write_ranks("good", kExtra, (int)(sizeof kExtra / sizeof *kExtra), -1, NULL);
    if (glm_tokenizer_load(&t, dir, &err)) {
        TEST_FAIL(&tc, "glm4_load", "%s", err.msg);
    } else {
        TEST_PASS(&tc, "glm4_load");
        test_merges(&tc, t);
        test_specials(&tc, t);
        test_decode(&tc, t);
        test_bad_utf8(&tc, t);
        glm_tokenizer_free(t);
    }
    test_bad_files(&tc);
    test_spm_refuses_flag(&tc);
    nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    TEST_EXIT(&tc);
}
