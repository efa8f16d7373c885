/* The tokenizer without the real model: small ModelProto files written here byte by byte, for
 * (1) every kind of broken, foreign or unsupported file giving a clear error, (2) the exact
 * semantics of the unigram Viterbi (tie-breaking, <unk> merging, byte fallback, user symbols) and of
 * BPE (leftmost tie, frozen user symbols), (3) the ChatGLM2/3 layout, and (4) ChatGLM's text
 * transforms and model.chat's punctuation rewrite. */
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer.h"
#include "test.h"

static char g_dir[64]; /* per-run temp folder; set once in main */
static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) { return remove(p); }
static void rmtree(const char *d) { nftw(d, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* ---- a protobuf writer ---- */
typedef struct pb { uint8_t *b; size_t n, cap; } pb;
static void pb_raw(pb *p, const void *s, size_t n) {
    if (p->n + n > p->cap) { p->cap = (p->n + n) * 2 + 64; p->b = realloc(p->b, p->cap); }
    memcpy(p->b + p->n, s, n);
    p->n += n;
}
static void pb_varint(pb *p, uint64_t v) {
    do { uint8_t c = (uint8_t)(v & 0x7f); v >>= 7; if (v) c |= 0x80; pb_raw(p, &c, 1); } while (v);
}
static void pb_uint(pb *p, int f, uint64_t v) { pb_varint(p, (uint64_t)f << 3 | 0); pb_varint(p, v); }
static void pb_bytes(pb *p, int f, const void *s, size_t n) { pb_varint(p, (uint64_t)f << 3 | 2); pb_varint(p, n); pb_raw(p, s, n); }
static void pb_str(pb *p, int f, const char *s) { pb_bytes(p, f, s, strlen(s)); }
static void pb_float(pb *p, int f, float x) { pb_varint(p, (uint64_t)f << 3 | 5); pb_raw(p, &x, 4); }
static void pb_msg(pb *p, int f, pb *sub) { pb_bytes(p, f, sub->b, sub->n); free(sub->b); *sub = (pb){0}; }

typedef struct sp_piece { const char *s; float score; int type; } sp_piece;
static void add_piece(pb *m, const char *s, float score, int type) {
    pb q = {0};
    pb_str(&q, 1, s);
    pb_float(&q, 2, score);
    pb_uint(&q, 3, (uint64_t)type);
    pb_msg(m, 1, &q);
}
static void add_pieces(pb *m, const sp_piece *ps, int n) { for (int i = 0; i < n; i++) add_piece(m, ps[i].s, ps[i].score, ps[i].type); }
static void add_bytes(pb *m) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        add_piece(m, s, 0, SPM_BYTE);
    }
}

static const char *save(const char *name, const void *data, size_t n) {
    static char path[256]; /* test-only: returned path is used before the next call */
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    char dir[256];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = 0;
    glm_mkdirs(dir, NULL);
    FILE *f = fopen(path, "wb");
    if (n) fwrite(data, 1, n, f);
    fclose(f);
    return path;
}

/* Loads and expects failure with `needle` in the message. */
static void expect_error(test_counts *tc, const char *name, const char *path, const char *needle) {
    glm_tokenizer *t = NULL;
    glm_err err = {0};
    int rc = glm_tokenizer_load(&t, path, &err);
    TEST_CHECK(tc, name, rc == -1 && t == NULL && strstr(err.msg, needle), "rc %d, message \"%s\" (wanted \"%s\")", rc,
               err.msg, needle);
    glm_tokenizer_free(t);
}

static void test_errors(test_counts *tc) {
    const char *txt = "hello world, this is not a model\n";
    expect_error(tc, "tokenizer_err_text_file", save("a.model", txt, strlen(txt)), "not a valid SentencePiece model");
    uint8_t rnd[4096];
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < sizeof rnd; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; rnd[i] = (uint8_t)s; }
    expect_error(tc, "tokenizer_err_random_bytes", save("r.model", rnd, sizeof rnd), "r.model");
    expect_error(tc, "tokenizer_err_empty_file", save("e.model", "", 0), "empty file");
    const char *js = "{\"pieces\": [\"a\", \"b\"]}";
    expect_error(tc, "tokenizer_err_json_file", save("j.model", js, strlen(js)), "j.model");
    save("nomodel/readme.txt", "x", 1);
    char p[300];
    snprintf(p, sizeof p, "%s/nomodel", g_dir);
    expect_error(tc, "tokenizer_err_folder_without_model", p, "neither ice_text.model nor tokenizer.model");
    snprintf(p, sizeof p, "%s/does/not/exist", g_dir);
    expect_error(tc, "tokenizer_err_missing_path", p, "does not exist");

    pb m = {0}, tr = {0};
    add_piece(&m, "<unk>", 0, SPM_UNKNOWN);
    add_piece(&m, "a", -1, SPM_NORMAL);
    pb_uint(&tr, 3, 7); /* model_type 7 */
    pb_msg(&m, 2, &tr);
    expect_error(tc, "tokenizer_err_unsupported_model_type", save("mt.model", m.b, m.n), "model_type 7 is not supported");
    free(m.b); m = (pb){0};
    add_piece(&m, "<unk>", 0, SPM_UNKNOWN);
    add_piece(&m, "a", -1, 9);
    expect_error(tc, "tokenizer_err_unsupported_piece_type", save("pt.model", m.b, m.n), "piece type 9 is not supported");
    free(m.b); m = (pb){0};
    add_piece(&m, "<unk>", 0, SPM_UNKNOWN);
    add_piece(&m, "a", -1, SPM_NORMAL);
    add_piece(&m, "a", -2, SPM_USER_DEFINED);
    expect_error(tc, "tokenizer_err_duplicate_piece", save("dup.model", m.b, m.n), "defined twice");
    free(m.b); m = (pb){0};
    add_piece(&m, "a", -1, SPM_NORMAL);
    expect_error(tc, "tokenizer_err_no_unk", save("nounk.model", m.b, m.n), "no <unk>");
    free(m.b); m = (pb){0};
    add_piece(&m, "<unk>", 0, SPM_UNKNOWN);
    add_piece(&m, "<0x41>", 0, SPM_BYTE);
    expect_error(tc, "tokenizer_err_byte_piece_without_fallback", save("bp.model", m.b, m.n), "byte_fallback is false");
    pb_uint(&tr, 35, 1);
    pb_msg(&m, 2, &tr);
    expect_error(tc, "tokenizer_err_fallback_without_256_bytes", save("bf.model", m.b, m.n), "only 1 of the 256");
    free(m.b); m = (pb){0};
    add_piece(&m, "<unk>", 0, SPM_UNKNOWN);
    add_piece(&m, "", 0, SPM_NORMAL);
    expect_error(tc, "tokenizer_err_empty_piece", save("ep.model", m.b, m.n), "piece 1 is empty");
    free(m.b); m = (pb){0};
    add_piece(&m, "<unk>", 0, SPM_UNKNOWN);
    pb nz = {0};
    uint8_t cm[12] = {200, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}; /* trie size 200 > blob */
    pb_bytes(&nz, 2, cm, sizeof cm);
    pb_msg(&m, 3, &nz);
    expect_error(tc, "tokenizer_err_broken_charsmap", save("cm.model", m.b, m.n), "precompiled_charsmap is broken");
    free(m.b); m = (pb){0};
    pb_uint(&m, 1, 5); /* pieces as a varint */
    expect_error(tc, "tokenizer_err_wrong_wire_type", save("wt.model", m.b, m.n), "wire type");
    free(m.b); m = (pb){0};
    uint8_t grp[] = {0x0b, 0x0c}; /* start/end group */
    expect_error(tc, "tokenizer_err_group_wire_type", save("gr.model", grp, 2), "invalid field key");
    uint8_t trunc[] = {0x0a, 0x20, 0x0a, 0x05, '<', 'u'}; /* a piece whose length runs past the end */
    expect_error(tc, "tokenizer_err_truncated_field", save("tr.model", trunc, sizeof trunc), "runs past the end");
}

/* ---- semantics on tiny models ---- */
static glm_tokenizer *load_pb(test_counts *tc, const char *file, pb *m) {
    glm_tokenizer *t = NULL;
    glm_err err = {0};
    const char *path = save(file, m->b, m->n);
    free(m->b);
    *m = (pb){0};
    if (glm_tokenizer_load(&t, path, &err)) { TEST_FAIL(tc, file, "%s", err.msg); return NULL; }
    return t;
}

static void check_enc(test_counts *tc, const glm_tokenizer *t, const char *name, const char *text, int flags,
                      const int32_t *want, int n, const char *want_pieces) {
    glm_ids v = {0};
    glm_err err = {0};
    int rc = glm_tokenizer_encode_ex(t, text, strlen(text), flags, &v, &err);
    int ok = rc == 0 && v.n == n;
    for (int i = 0; ok && i < n; i++) ok = v.data[i] == want[i];
    char got[256] = "";
    for (int i = 0; i < v.n && strlen(got) < 200; i++) snprintf(got + strlen(got), sizeof got - strlen(got), " %d", v.data[i]);
    if (ok && want_pieces) {
        glm_pieces ps;
        glm_tokenizer_encode_pieces(t, text, strlen(text), flags, &ps, NULL);
        char joined[256] = "";
        for (int i = 0; i < ps.n; i++) snprintf(joined + strlen(joined), sizeof joined - strlen(joined), "%s%s", i ? "|" : "", ps.data + ps.off[i]);
        ok = !strcmp(joined, want_pieces);
        snprintf(got, sizeof got, "pieces %s", joined);
        glm_pieces_free(&ps);
    }
    TEST_CHECK(tc, name, ok, "%s: got%s", rc ? err.msg : text, got);
    glm_ids_free(&v);
}

static void test_unigram(test_counts *tc) {
    /* ids:            0         1         2         3         4         5          6        7        8 */
    const sp_piece ps[] = {{"<unk>", 0, SPM_UNKNOWN}, {"\xe2\x96\x81", -1, SPM_NORMAL}, {"a", -2, SPM_NORMAL},
                           {"b", -2, SPM_NORMAL}, {"ab", -1, SPM_NORMAL}, {"\xe2\x96\x81" "ab", -5, SPM_NORMAL},
                           {"c", -1, SPM_NORMAL}, {"d", -1, SPM_NORMAL}, {"cd", -2, SPM_NORMAL},
                           {"<s>", 0, SPM_CONTROL}, {"<x>", 0, SPM_USER_DEFINED}, {"e", -0.5f, SPM_UNUSED}};
    pb m = {0};
    add_pieces(&m, ps, 12);
    glm_tokenizer *t = load_pb(tc, "uni.model", &m);
    if (!t) return;
    TEST_CHECK(tc, "tokenizer_synth_plain_kind", glm_tokenizer_kind(t) == GLM_TOK_SPM, "kind %d", glm_tokenizer_kind(t));
    check_enc(tc, t, "tokenizer_unigram_best_path", "ab", 0, (int32_t[]){1, 4}, 2, "\xe2\x96\x81|ab");
    check_enc(tc, t, "tokenizer_unigram_tie_keeps_longer", "cd", 0, (int32_t[]){1, 8}, 2, NULL);
    check_enc(tc, t, "tokenizer_unigram_unknowns_merge", "xyz", 0, (int32_t[]){1, 0}, 2, "\xe2\x96\x81|xyz");
    check_enc(tc, t, "tokenizer_unigram_unused_skipped", "e", 0, (int32_t[]){1, 0}, 2, NULL);
    check_enc(tc, t, "tokenizer_unigram_user_symbol", "a<x>b", 0, (int32_t[]){1, 2, 10, 3}, 4, NULL);
    check_enc(tc, t, "tokenizer_unigram_control_text_is_unknown", "<s>", 0, (int32_t[]){1, 0}, 2, "\xe2\x96\x81|<s>");
    check_enc(tc, t, "tokenizer_unigram_spaces_collapse", "  ab   ab  ", 0, (int32_t[]){1, 4, 1, 4}, 4, NULL);
    check_enc(tc, t, "tokenizer_unigram_empty", "", 0, NULL, 0, NULL);
    check_enc(tc, t, "tokenizer_unigram_only_spaces", "   ", 0, NULL, 0, NULL);
    int32_t ids[] = {1, 4, 0, 9, 1, 3, 10};
    char *d = glm_tokenizer_decode(t, ids, 7);
    TEST_CHECK(tc, "tokenizer_unigram_decode", d && !strcmp(d, "ab \xe2\x81\x87  b<x>"), "got \"%s\"", d);
    free(d);
    glm_ids v = {0};
    glm_tokenizer_build_inputs(t, ids, 2, ids, 2, &v);
    TEST_CHECK(tc, "tokenizer_synth_plain_build_inputs", v.n == 4, "plain models add no special tokens (%d ids)", v.n);
    glm_ids_free(&v);
    glm_tokenizer_free(t);

    /* byte fallback: unknown characters become their UTF-8 bytes, each its own id */
    pb m2 = {0}, tr = {0};
    add_pieces(&m2, ps, 9);
    add_bytes(&m2);
    pb_uint(&tr, 35, 1);
    pb_msg(&m2, 2, &tr);
    t = load_pb(tc, "unib.model", &m2);
    if (!t) return;
    check_enc(tc, t, "tokenizer_unigram_byte_fallback", "a\xc3\xa9", 0, (int32_t[]){1, 2, 9 + 0xc3, 9 + 0xa9}, 4,
              "\xe2\x96\x81|a|<0xC3>|<0xA9>");
    check_enc(tc, t, "tokenizer_unigram_invalid_utf8_is_fffd", "\xff", 0, (int32_t[]){1, 9 + 0xef, 9 + 0xbf, 9 + 0xbd}, 4, NULL);
    int32_t bad[] = {1, 2, 9 + 0xc3, 9 + 0xa9, 9 + 0xff, 9 + 0xe4, 2};
    d = glm_tokenizer_decode(t, bad, 7);
    TEST_CHECK(tc, "tokenizer_byte_pieces_decode", d && !strcmp(d, "a\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd" "a"), "got \"%s\"", d);
    free(d);
    glm_tokenizer_free(t);
}

static void test_bpe(test_counts *tc) {
    const sp_piece ps[] = {{"<unk>", 0, SPM_UNKNOWN}, {"\xe2\x96\x81", -1, SPM_NORMAL}, {"a", -2, SPM_NORMAL},
                           {"b", -2, SPM_NORMAL}, {"c", -2, SPM_NORMAL}, {"ab", -1, SPM_NORMAL}, {"bc", -1, SPM_NORMAL},
                           {"<x>", 0, SPM_USER_DEFINED}, {"x>", 5, SPM_NORMAL}, {"<", -3, SPM_NORMAL}, {"x", -3, SPM_NORMAL},
                           {">", -3, SPM_NORMAL}};
    pb m = {0}, tr = {0};
    add_pieces(&m, ps, 12);
    pb_uint(&tr, 3, SPM_BPE);
    pb_msg(&m, 2, &tr);
    glm_tokenizer *t = load_pb(tc, "bpe.model", &m);
    if (!t) return;
    check_enc(tc, t, "tokenizer_bpe_leftmost_tie", "abc", 0, (int32_t[]){1, 5, 4}, 3, "\xe2\x96\x81|ab|c");
    check_enc(tc, t, "tokenizer_bpe_user_symbol_frozen", "<x>", 0, (int32_t[]){1, 7}, 2, NULL);
    check_enc(tc, t, "tokenizer_bpe_unknown_merge", "abqq", 0, (int32_t[]){1, 5, 0}, 3, "\xe2\x96\x81|ab|qq");
    glm_tokenizer_free(t);
}

/* ChatGLM2/3 layout: plain SentencePiece plus specials appended after the pieces. */
static void test_chatglm2(test_counts *tc) {
    const sp_piece ps[] = {{"<unk>", 0, SPM_UNKNOWN}, {"<s>", 0, SPM_CONTROL}, {"</s>", 0, SPM_CONTROL},
                           {"\xe2\x96\x81", -1, SPM_NORMAL}, {"a", -2, SPM_NORMAL}};
    pb m = {0};
    add_pieces(&m, ps, 5);
    save("glm2/tokenizer.model", m.b, m.n);
    free(m.b);
    char dir0[300];
    snprintf(dir0, sizeof dir0, "%s/glm2", g_dir);
    glm_tokenizer *t0 = NULL;
    int rc0 = glm_tokenizer_load(&t0, dir0, NULL);
    TEST_CHECK(tc, "tokenizer_tokenizer_model_without_config_is_plain", rc0 == 0 && glm_tokenizer_kind(t0) == GLM_TOK_SPM,
               "rc %d kind %d", rc0, t0 ? (int)glm_tokenizer_kind(t0) : -1);
    glm_tokenizer_free(t0);
    const char *cfg = "{\"name_or_path\": \"THUDM/chatglm2-6b\", \"tokenizer_class\": \"ChatGLMTokenizer\"}";
    save("glm2/tokenizer_config.json", cfg, strlen(cfg));
    char dir[300];
    snprintf(dir, sizeof dir, "%s/glm2", g_dir);
    glm_tokenizer *t = NULL;
    glm_err err = {0};
    if (glm_tokenizer_load(&t, dir, &err)) { TEST_FAIL(tc, "tokenizer_chatglm2_load", "%s", err.msg); return; }
    glm_special_ids s = glm_tokenizer_specials(t);
    TEST_CHECK(tc, "tokenizer_chatglm2_specials", glm_tokenizer_kind(t) == GLM_TOK_CHATGLM2 && s.mask == 5 && s.gmask == 6 &&
               s.sop == 8 && s.eop == 9 && s.pad == 0 && glm_tokenizer_eos(t) == 2 && glm_tokenizer_vocab_size(t) == 10 &&
               glm_tokenizer_piece_id(t, "sop") == 8 && !strcmp(glm_tokenizer_piece(t, 6), "[gMASK]"),
               "kind %d gmask %d sop %d vocab %d", glm_tokenizer_kind(t), s.gmask, s.sop, glm_tokenizer_vocab_size(t));
    check_enc(tc, t, "tokenizer_chatglm2_prefix", "a\na", GLM_TOK_ADD_SPECIAL, (int32_t[]){6, 8, 3, 4, 0, 4}, 6,
              "[gMASK]|sop|\xe2\x96\x81|a|\n|a");
    int32_t a[] = {3, 4}, b[] = {4};
    glm_ids v = {0};
    glm_tokenizer_build_inputs(t, a, 2, b, 1, &v);
    TEST_CHECK(tc, "tokenizer_chatglm2_build_inputs_pair", v.n == 6 && v.data[0] == 6 && v.data[1] == 8 && v.data[5] == 2,
               "wrong layout (%d ids)", v.n);
    char *d = glm_tokenizer_decode(t, v.data, v.n);
    TEST_CHECK(tc, "tokenizer_chatglm2_decode_drops_specials", d && !strcmp(d, "aa"), "got \"%s\"", d);
    free(d);
    glm_ids_free(&v);
    glm_tokenizer_free(t);
}

static void check_str(test_counts *tc, const char *name, char *got, const char *want) {
    TEST_CHECK(tc, name, got && !strcmp(got, want), "got \"%s\", want \"%s\"", got ? got : "(null)", want);
    free(got);
}

static char *pre(const char *s, int rm) {
    spm_buf b = {0};
    glm_tok_preprocess(s, strlen(s), rm, &b);
    spm_buf_put(&b, "", 1);
    return b.s;
}
static char *post(const char *s) {
    spm_buf b = {0};
    glm_tok_postprocess(s, strlen(s), &b);
    spm_buf_put(&b, "", 1);
    return b.s;
}

static void test_text(test_counts *tc) {
    char sp81[100], sp163[200], want[300];
    memset(sp81, ' ', 81); sp81[81] = 0;
    memset(sp163, ' ', 163); sp163[163] = 0;
    check_str(tc, "tokenizer_pre_newline_tab", pre("a\nb\tc d  e", 0), "a<n>b<|tab|>c d<|blank_2|>e");
    check_str(tc, "tokenizer_pre_81_spaces", pre(sp81, 0), "<|blank_80|> ");
    check_str(tc, "tokenizer_pre_163_spaces", pre(sp163, 0), "<|blank_80|><|blank_80|><|blank_3|>");
    check_str(tc, "tokenizer_pre_remove_space", pre("\xe3\x80\x80 a \t b\n\n c  ", 1), "a b c");
    /* only blank_2..blank_80 spelled as str(i) are symbols; "<<n>n>" loses just the inner <n> */
    snprintf(want, sizeof want, "%80s|<|blank_81|><|blank_1|><|blank_02|><\nn>\t  ", "");
    check_str(tc, "tokenizer_post_blanks", post("<|blank_80|>|<|blank_81|><|blank_1|><|blank_02|><<n>n><|tab|><|blank_2|>"), want);
}

static void test_chat(test_counts *tc) {
    check_str(tc, "tokenizer_chat_strip_and_marks", glm_chat_postprocess("  你好,世界!  \n"), "你好，世界！");
    check_str(tc, "tokenizer_chat_training_time", glm_chat_postprocess("[[训练时间]]"), "2023年");
    check_str(tc, "tokenizer_chat_time_then_mark", glm_chat_postprocess("截至[[训练时间]],好"), "截至2023年，好");
    check_str(tc, "tokenizer_chat_ascii_untouched", glm_chat_postprocess("Hello, world! a:b; c?"), "Hello, world! a:b; c?");
    check_str(tc, "tokenizer_chat_after_and_before_cjk", glm_chat_postprocess("中:a a:中 ,中 中??"), "中：a a：中 ，中 中？?");
    check_str(tc, "tokenizer_chat_unicode_strip", glm_chat_postprocess("\xe3\x80\x80x\xc2\xa0"), "x");
    check_str(tc, "tokenizer_chat_emoji_neighbour", glm_chat_postprocess("你好👋!我"), "你好👋！我");
    check_str(tc, "tokenizer_chat_empty", glm_chat_postprocess(" \t"), "");
}

int main(void) {
    test_counts tc = {0};
    snprintf(g_dir, sizeof g_dir, "/tmp/glm_test_toks_XXXXXX");
    if (!mkdtemp(g_dir)) { printf("FAIL tokenizer_synth: cannot create a temp folder\n"); return 1; }
    test_errors(&tc);
    test_unigram(&tc);
    test_bpe(&tc);
    test_chatglm2(&tc);
    test_text(&tc);
    test_chat(&tc);
    rmtree(g_dir);
    TEST_EXIT(&tc);
}
