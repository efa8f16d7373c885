/* BLEU-4 and ROUGE for generation evaluation (infer/metrics.h). N-grams (n <= 4) of values
 * below 2^21 (code points, interned word ids) are packed into two 64-bit keys, sorted, and
 * counted by merging — no hash tables, exact counts. */
#include "infer/metrics.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

/* UTF-8 to code points; a byte that does not start a valid sequence stands for itself
 * (as 0xDC00 + byte, Python's surrogateescape, so it never equals a real character). */
static int utf8_decode(const char *s, uint32_t **out) {
    size_t n = strlen(s);
    uint32_t *cp = glm_malloc((n + 1) * sizeof *cp);
    int k = 0;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
        int ok = len > 0 && i + (size_t)len <= n;
        for (int j = 1; ok && j < len; j++) {
            if ((u[i + j] & 0xC0) != 0x80) ok = 0;
            else v = (v << 6) | (u[i + j] & 0x3F);
        }
        static const uint32_t min_v[] = {0, 0, 0x80, 0x800, 0x10000};
        if (ok && (v < min_v[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))) ok = 0;
        if (!ok) { cp[k++] = 0xDC00 + c; i++; continue; }
        cp[k++] = v;
        i += (size_t)len;
    }
    *out = cp;
    return k;
}

typedef struct { uint64_t hi, lo; } key;
static int key_cmp(const void *a, const void *b) {
    const key *x = a, *y = b;
    return x->hi < y->hi ? -1 : x->hi > y->hi ? 1 : x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

/* Sorted keys of the n-grams of s[0..len). Returns the count (0 when len < n). */
static int ngrams(const uint32_t *s, int len, int n, key **out) {
    int cnt = len >= n ? len - n + 1 : 0;
    key *k = glm_malloc(((size_t)cnt + 1) * sizeof *k);
    for (int i = 0; i < cnt; i++) {
        uint64_t v[4] = {0, 0, 0, 0};
        for (int j = 0; j < n; j++) v[j] = (uint64_t)(s[i + j] & 0x1FFFFF) + 1; /* +1: no n-gram is a prefix of another */
        k[i] = (key){v[0] << 21 | v[1], v[2] << 21 | v[3]};
    }
    qsort(k, (size_t)cnt, sizeof *k, key_cmp);
    *out = k;
    return cnt;
}

/* Walks the sorted n-grams of h and r. clipped: sum over distinct hyp n-grams of
 * min(count in h, count in r). distinct_*: distinct n-gram counts; common: distinct shared. */
typedef struct { long clipped, distinct_h, distinct_r, common; } match;
static match count_matches(const key *h, int nh, const key *r, int nr) {
    match m = {0};
    int i = 0, j = 0;
    while (i < nh || j < nr) {
        int c = i >= nh ? 1 : j >= nr ? -1 : key_cmp(&h[i], &r[j]);
        key cur = c <= 0 ? h[i] : r[j];
        int ch = 0, cr = 0;
        while (i < nh && key_cmp(&h[i], &cur) == 0) { i++; ch++; }
        while (j < nr && key_cmp(&r[j], &cur) == 0) { j++; cr++; }
        m.distinct_h += ch > 0;
        m.distinct_r += cr > 0;
        m.common += ch > 0 && cr > 0;
        m.clipped += ch < cr ? ch : cr;
    }
    return m;
}

static double bleu4(const uint32_t *h, int nh, const uint32_t *r, int nr) {
    long num[4], den[4];
    for (int n = 1; n <= 4; n++) {
        key *kh, *kr;
        int ch = ngrams(h, nh, n, &kh), cr = ngrams(r, nr, n, &kr);
        match m = count_matches(kh, ch, kr, cr);
        num[n - 1] = m.clipped;
        den[n - 1] = ch > 0 ? ch : 1; /* nltk: max(1, hypothesis n-grams) */
        free(kh);
        free(kr);
    }
    if (num[0] == 0) return 0;
    double bp = nh > nr ? 1.0 : nh == 0 ? 0.0 : exp(1.0 - (double)nr / nh);
    double s = 0;
    int k = 1;
    for (int n = 0; n < 4; n++) {
        double p = num[n] ? (double)num[n] / den[n] : 1.0 / (ldexp(1.0, k++) * den[n]);
        s += 0.25 * log(p);
    }
    return bp * exp(s);
}

/* Python str.isspace() for the characters that can separate words. */
static int is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
static int is_alnum_ascii(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* Words of both texts as ids (equal words, equal ids): ASCII alnum runs, or single
 * characters; whitespace dropped. Interned by sorting (word text as code points). */
typedef struct { const uint32_t *s; int len, owner, pos; } word;
static int word_cmp(const void *a, const void *b) {
    const word *x = a, *y = b;
    int n = x->len < y->len ? x->len : y->len;
    for (int i = 0; i < n; i++)
        if (x->s[i] != y->s[i]) return x->s[i] < y->s[i] ? -1 : 1;
    return x->len - y->len;
}
static void words(const uint32_t *a, int na, const uint32_t *b, int nb, uint32_t **wa, int *nwa, uint32_t **wb, int *nwb) {
    word *w = glm_malloc(((size_t)na + nb + 1) * sizeof *w);
    int n = 0, cnt[2] = {0, 0};
    for (int o = 0; o < 2; o++) {
        const uint32_t *s = o ? b : a;
        int len = o ? nb : na;
        for (int i = 0; i < len;) {
            if (is_space(s[i])) { i++; continue; }
            int j = i + 1;
            if (is_alnum_ascii(s[i])) while (j < len && is_alnum_ascii(s[j])) j++;
            w[n++] = (word){s + i, j - i, o, cnt[o]++};
            i = j;
        }
    }
    *wa = glm_malloc(((size_t)cnt[0] + 1) * sizeof **wa);
    *wb = glm_malloc(((size_t)cnt[1] + 1) * sizeof **wb);
    qsort(w, (size_t)n, sizeof *w, word_cmp);
    uint32_t id = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && word_cmp(&w[i - 1], &w[i]) != 0) id++;
        (w[i].owner ? *wb : *wa)[w[i].pos] = id;
    }
    *nwa = cnt[0];
    *nwb = cnt[1];
    free(w);
}

static double f_score(double p, double r) { return 2.0 * ((p * r) / (p + r + 1e-8)); }

static double rouge_n(const uint32_t *h, int nh, const uint32_t *r, int nr, int n) {
    key *kh, *kr;
    int ch = ngrams(h, nh, n, &kh), cr = ngrams(r, nr, n, &kr);
    match m = count_matches(kh, ch, kr, cr);
    free(kh);
    free(kr);
    double p = m.distinct_h ? (double)m.common / m.distinct_h : 0, rc = m.distinct_r ? (double)m.common / m.distinct_r : 0;
    return f_score(p, rc);
}

static double rouge_l(const uint32_t *h, int nh, const uint32_t *r, int nr) {
    if (nh == 0 || nr == 0) return 0;
    int *prev = glm_calloc((size_t)nh + 1, sizeof *prev), *cur = glm_calloc((size_t)nh + 1, sizeof *cur);
    for (int i = 1; i <= nr; i++) {
        for (int j = 1; j <= nh; j++)
            cur[j] = r[i - 1] == h[j - 1] ? prev[j - 1] + 1 : (prev[j] > cur[j - 1] ? prev[j] : cur[j - 1]);
        int *t = prev; prev = cur; cur = t;
    }
    double lcs = prev[nh];
    free(prev);
    free(cur);
    return f_score(lcs / nh, lcs / nr);
}

glm_text_scores glm_text_score(const char *pred, const char *ref) {
    uint32_t *h, *r, *wh, *wr;
    int nh = utf8_decode(pred, &h), nr = utf8_decode(ref, &r), nwh, nwr;
    glm_text_scores s = {0};
    s.bleu4 = 100 * bleu4(h, nh, r, nr);
    words(h, nh, r, nr, &wh, &nwh, &wr, &nwr);
    if (nwh > 0 && nwr > 0) {
        s.rouge1 = 100 * rouge_n(wh, nwh, wr, nwr, 1);
        s.rouge2 = 100 * rouge_n(wh, nwh, wr, nwr, 2);
        s.rougel = 100 * rouge_l(wh, nwh, wr, nwr);
    }
    free(h); free(r); free(wh); free(wr);
    return s;
}

static double round4(double x) { return nearbyint(x * 1e4) / 1e4; }

void glm_score_add(glm_score_sum *s, const glm_text_scores *x) {
    s->sum.bleu4 += round4(x->bleu4);
    s->sum.rouge1 += round4(x->rouge1);
    s->sum.rouge2 += round4(x->rouge2);
    s->sum.rougel += round4(x->rougel);
    s->n++;
}

glm_text_scores glm_score_mean(const glm_score_sum *s) {
    glm_text_scores m = {0};
    if (s->n == 0) return m;
    m.bleu4 = s->sum.bleu4 / s->n;
    m.rouge1 = s->sum.rouge1 / s->n;
    m.rouge2 = s->sum.rouge2 / s->n;
    m.rougel = s->sum.rougel / s->n;
    return m;
}
