/* Helpers shared by the data-layer tests: a scratch folder, file writing, and a fake encoder
 * (one id per Unicode code point, spaces dropped like the SentencePiece normaliser drops them)
 * so reading, example construction, caching and batching are testable without a tokenizer. */
#ifndef GLM_TEST_DATA_UTIL_H
#define GLM_TEST_DATA_UTIL_H
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "data/data.h"
#include "test.h"

#define FAKE_GMASK 130001
#define FAKE_SOP 130004
#define FAKE_EOP 130005
#define FAKE_PAD 3
#define FAKE_MASK 130000

static int fake_encode(void *ctx, const char *text, size_t len, glm_ids *out, glm_err *err) {
    (void)ctx;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        unsigned c = s[i], cp;
        int k = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        cp = k == 0 ? c : k == 1 ? c & 0x1F : k == 2 ? c & 0x0F : c & 0x07;
        for (int j = 1; j <= k && i + j < len; j++) cp = (cp << 6) | (s[i + j] & 0x3F);
        i += (size_t)k + 1;
        if (cp == '\x01') return glm_fail(err, "fake encoder: refuses \\x01");
        if (cp != ' ') glm_ids_push(out, (int32_t)cp + 1000);
    }
    return 0;
}

static inline glm_encoder fake_encoder(void) {
    return (glm_encoder){.encode = fake_encode, .gmask = FAKE_GMASK, .sop = FAKE_SOP, .eop = FAKE_EOP, .pad = FAKE_PAD,
                         .mask = FAKE_MASK, .fingerprint = 0x1234};
}

static char test_dir[256];

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}
static inline void test_dir_make(void) {
    snprintf(test_dir, sizeof test_dir, "/tmp/glm_test_data_XXXXXX");
    if (!mkdtemp(test_dir)) { perror("mkdtemp"); exit(1); }
}
static inline void test_dir_remove(void) { nftw(test_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* Writes text to test_dir/name; returns the full path (static buffer rotation of 8). */
static inline const char *write_file(const char *name, const char *text) {
    static char bufs[8][512];
    static int k;
    char *p = bufs[k++ % 8];
    snprintf(p, 512, "%s/%s", test_dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return p; /* a path in a missing folder: left absent on purpose */
    fwrite(text, 1, strlen(text), f);
    fclose(f);
    return p;
}

/* Encodes text with the fake encoder (for expected ids). */
static inline glm_ids fake_ids(const char *text) {
    glm_ids v = {0};
    fake_encode(NULL, text, strlen(text), &v, NULL);
    return v;
}

#endif
