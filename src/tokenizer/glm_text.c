/* ChatGLM-6B's text-level layer around SentencePiece. Its normaliser (nmt_nfkc with
 * remove_extra_whitespaces) would collapse newlines, tabs and space runs, so tokenization_chatglm.py
 * rewrites them into user-defined symbols first (<n>, <|tab|>, <|blank_N|>) and back after
 * decoding; model.chat then rewrites ASCII punctuation next to CJK characters (spec 7.1).
 * Python's str.replace chains are done here in one pass each: the replacement symbols contain no
 * spaces, tabs or newlines and start/end with '<'/'>' only, so no replacement can create or hide
 * another match and one left-to-right scan gives the same string. */
#include "tokenizer/spm.h"
#include <stdlib.h>
#include <string.h>

#define MAX_BLANK 80

/* Lenient UTF-8 decode (a malformed byte decodes as itself, length 1): Python only ever sees
 * valid text, and invalid bytes must simply never count as whitespace or CJK. */
static uint32_t dec(const uint8_t *s, size_t n, int *len) {
    int cl = spm_utf8_valid_len(s, n);
    *len = cl ? cl : 1;
    if (cl <= 1) return s[0];
    if (cl == 2) return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    if (cl == 3) return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

/* Python's str.isspace(), which str.strip() and str.split() use. */
static int py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* " ".join(text.split()) */
static void remove_space(const char *s, size_t n, spm_buf *out) {
    const uint8_t *u = (const uint8_t *)s;
    int pending = 0;
    out->n = 0;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t c = dec(u + i, n - i, &l);
        if (py_space(c)) {
            pending = out->n > 0;
        } else {
            if (pending) spm_buf_put(out, " ", 1);
            pending = 0;
            spm_buf_put(out, s + i, (size_t)l);
        }
        i += (size_t)l;
    }
}

static void put_blank(spm_buf *out, size_t k) {
    char tok[24];
    int l = snprintf(tok, sizeof tok, "<|blank_%zu|>", k);
    spm_buf_put(out, tok, (size_t)l);
}

void glm_tok_preprocess(const char *s, size_t n, int rm_space, spm_buf *out) {
    spm_buf tmp = {0};
    if (rm_space) {
        remove_space(s, n, &tmp);
        s = tmp.s;
        n = tmp.n;
    }
    out->n = 0;
    spm_buf_reserve(out, n + n / 4 + 16);
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && s[j] != '\n' && s[j] != '\t' && s[j] != ' ') j++;
        spm_buf_put(out, s + i, j - i);
        if (j >= n) break;
        if (s[j] == '\n') { spm_buf_put(out, "<n>", 3); i = j + 1; continue; }
        if (s[j] == '\t') { spm_buf_put(out, "<|tab|>", 7); i = j + 1; continue; }
        size_t k = j;
        while (k < n && s[k] == ' ') k++;
        size_t run = k - j;
        /* str.replace(" " * 80, ...) first eats whole 80-space chunks from the left; the rest
         * (shorter than 80) is then replaced by the one symbol of its exact length. */
        for (size_t q = run / MAX_BLANK; q > 0; q--) put_blank(out, MAX_BLANK);
        size_t r = run % MAX_BLANK;
        if (r == 1) spm_buf_put(out, " ", 1);
        else if (r >= 2) put_blank(out, r);
        i = k;
    }
    free(tmp.s);
}

void glm_tok_postprocess(const char *s, size_t n, spm_buf *out) {
    out->n = 0;
    spm_buf_reserve(out, n + 1);
    size_t i = 0;
    while (i < n) {
        const char *lt = memchr(s + i, '<', n - i);
        size_t j = lt ? (size_t)(lt - s) : n;
        spm_buf_put(out, s + i, j - i);
        if (j >= n) break;
        size_t rest = n - j;
        if (rest >= 3 && memcmp(s + j, "<n>", 3) == 0) { spm_buf_put(out, "\n", 1); i = j + 3; continue; }
        if (rest >= 7 && memcmp(s + j, "<|tab|>", 7) == 0) { spm_buf_put(out, "\t", 1); i = j + 7; continue; }
        if (rest >= 11 && memcmp(s + j, "<|blank_", 8) == 0) {
            size_t k = j + 8, v = 0;
            while (k < n && k < j + 10 && s[k] >= '0' && s[k] <= '9') v = v * 10 + (size_t)(s[k++] - '0');
            /* exactly the decimal spelling str(i) produces: no leading zero */
            if (k > j + 8 && s[j + 8] != '0' && v >= 2 && v <= MAX_BLANK && n - k >= 2 &&
                s[k] == '|' && s[k + 1] == '>') {
                for (size_t q = 0; q < v; q++) spm_buf_put(out, " ", 1);
                i = k + 2;
                continue;
            }
        }
        spm_buf_put(out, "<", 1);
        i = j + 1;
    }
}

/* ---- model.chat's process_response ---- */

static int is_cjk(uint32_t c) { return c >= 0x4E00 && c <= 0x9FFF; }

/* Code point of the character that ends just before byte i (0 when none). */
static uint32_t prev_char(const uint8_t *s, size_t i) {
    if (i == 0) return 0;
    size_t b = i - 1;
    while (b > 0 && i - b < 4 && (s[b] & 0xC0) == 0x80) b--;
    int l;
    uint32_t c = dec(s + b, i - b, &l);
    return (size_t)l == i - b ? c : s[i - 1];
}

char *glm_chat_postprocess(const char *response) {
    const uint8_t *s = (const uint8_t *)response;
    size_t n = strlen(response), a = 0, z = n;
    /* str.strip() */
    while (a < z) {
        int l;
        uint32_t c = dec(s + a, z - a, &l);
        if (!py_space(c)) break;
        a += (size_t)l;
    }
    while (z > a) {
        size_t b = z - 1;
        while (b > a && z - b < 4 && (s[b] & 0xC0) == 0x80) b--;
        int l;
        uint32_t c = dec(s + b, z - b, &l);
        if ((size_t)l != z - b) { b = z - 1; c = s[b]; }
        if (!py_space(c)) break;
        z = b;
    }
    spm_buf t = {0};
    static const char kTime[] = "[[\xe8\xae\xad\xe7\xbb\x83\xe6\x97\xb6\xe9\x97\xb4]]"; /* [[训练时间]] */
    static const char kYear[] = "2023\xe5\xb9\xb4";                                    /* 2023年 */
    for (size_t i = a; i < z;) {
        if (z - i >= sizeof kTime - 1 && memcmp(s + i, kTime, sizeof kTime - 1) == 0) {
            spm_buf_put(&t, kYear, sizeof kYear - 1);
            i += sizeof kTime - 1;
        } else {
            spm_buf_put(&t, (const char *)s + i, 1);
            i++;
        }
    }
    /* Each ASCII mark next to a CJK character becomes full-width. The regex passes of the Python
     * code only look at CJK neighbours, which no pass changes, so one scan is equivalent. */
    spm_buf o = {0};
    const uint8_t *u = (const uint8_t *)t.s;
    for (size_t i = 0; i < t.n; i++) {
        const char *p = strchr(",!:;?", u[i]);
        if (u[i] && p) {
            int l = 0;
            uint32_t next = i + 1 < t.n ? dec(u + i + 1, t.n - i - 1, &l) : 0;
            if (is_cjk(prev_char(u, i)) || is_cjk(next)) {
                static const char *full[] = {"\xef\xbc\x8c", "\xef\xbc\x81", "\xef\xbc\x9a", "\xef\xbc\x9b", "\xef\xbc\x9f"};
                spm_buf_put(&o, full[p - ",!:;?"], 3);
                continue;
            }
        }
        spm_buf_put(&o, (const char *)u + i, 1);
    }
    free(t.s);
    spm_buf_put(&o, "", 1); /* NUL */
    return o.s;
}
