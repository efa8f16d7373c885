/* A regex constraint's token masks (infer/regex.h): the NFA's state sets are cached as the states
 * of a DFA whose transitions go by code point class, filled as the masks meet them, so that most
 * of a token's bytes cost a table lookup instead of an NFA step. */
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "data/hash.h"
#include "infer/choice_mode.h"
#include "infer/regex.h"
#include "infer/text_vocab.h"

#define UNKNOWN (-2)
#define DEAD (-1)
#define FULL (-3)                 /* the cache has no room: the caller steps the NFA itself */
#define DFA_BYTES (4u << 20)      /* a row's cache at most (its states' sets and transitions) */

struct glm_regex_dfa {
    const glm_regex *re;
    int n, cap;
    uint64_t *sets;   /* [cap * words] each state's NFA set */
    uint8_t *accepts; /* [cap] the set matches whole */
    int32_t *next;    /* [cap * n_classes] the state after a code point of the class: UNKNOWN, DEAD or an id */
    int32_t *slot;    /* [hcap] open addressing over the sets' hashes: a state id or -1 */
    int hcap;
};

glm_regex_dfa *glm_regex_dfa_new(const glm_regex *re) {
    glm_regex_dfa *d = glm_calloc(1, sizeof *d);
    d->re = re;
    size_t per = sizeof(uint64_t) * (size_t)re->words + sizeof(int32_t) * (size_t)re->n_classes + 1;
    d->cap = (int)(DFA_BYTES / per);
    if (d->cap > GLM_REGEX_DFA_STATES) d->cap = GLM_REGEX_DFA_STATES;
    if (d->cap < 16) d->cap = 16;
    d->sets = glm_malloc(sizeof *d->sets * (size_t)d->cap * (size_t)re->words);
    d->accepts = glm_malloc((size_t)d->cap);
    d->next = glm_malloc(sizeof *d->next * (size_t)d->cap * (size_t)re->n_classes);
    for (d->hcap = 64; d->hcap < 2 * d->cap; d->hcap *= 2) {}
    d->slot = glm_malloc(sizeof *d->slot * (size_t)d->hcap);
    memset(d->slot, 0xff, sizeof *d->slot * (size_t)d->hcap);
    return d;
}

void glm_regex_dfa_free(glm_regex_dfa *d) {
    if (!d) return;
    free(d->sets);
    free(d->accepts);
    free(d->next);
    free(d->slot);
    free(d);
}

/* The id of the state whose set is `set`, made when new; FULL when there is no room. */
static int state_of(glm_regex_dfa *d, const uint64_t *set) {
    int w = d->re->words;
    size_t at = glm_xxh64(set, sizeof *set * (size_t)w, 0) & (size_t)(d->hcap - 1);
    for (;; at = (at + 1) & (size_t)(d->hcap - 1)) {
        int id = d->slot[at];
        if (id < 0) break;
        if (!memcmp(d->sets + (size_t)id * w, set, sizeof *set * (size_t)w)) return id;
    }
    if (d->n == d->cap) return FULL;
    int id = d->n++;
    memcpy(d->sets + (size_t)id * w, set, sizeof *set * (size_t)w);
    d->accepts[id] = (uint8_t)glm_regex_accepts(d->re, set);
    for (int k = 0; k < d->re->n_classes; k++) d->next[(size_t)id * d->re->n_classes + k] = UNKNOWN;
    d->slot[at] = id;
    return id;
}

/* State s after a code point of class k: an id, DEAD or FULL. */
static int step_class(glm_regex_dfa *d, int s, int k) {
    int32_t *t = &d->next[(size_t)s * d->re->n_classes + k];
    if (*t != UNKNOWN) return *t;
    uint64_t set[GLM_REGEX_MAX_STATES / 64];
    memcpy(set, d->sets + (size_t)s * d->re->words, sizeof set[0] * (size_t)d->re->words);
    int id = glm_regex_step(d->re, set, d->re->bounds[k]) ? DEAD : state_of(d, set);
    if (id != FULL) *t = id; /* (s's row may have moved if the table grew: it does not, rows are fixed) */
    return id;
}

/* Some code point within [lo, hi] takes state s somewhere: DEAD (no), FULL, or 0 (yes). */
static int may_take(glm_regex_dfa *d, int s, uint32_t lo, uint32_t hi) {
    for (int k = glm_regex_class(d->re, lo); k < d->re->n_classes && d->re->bounds[k] <= hi; k++) {
        int r = step_class(d, s, k);
        if (r != DEAD) return r == FULL ? FULL : 0;
    }
    return DEAD;
}

/* Token bytes b[0..n) from state s with the character t being read: 1 they fit, 0 not, -1 the
 * cache filled up on the way. */
static int dfa_fits(glm_regex_dfa *d, int s, glm_regex_text t, const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t lo, hi;
        int u = glm_regex_text_byte(&t, b[i], &lo, &hi);
        if (u < 0) return 0;
        if (u == 1) s = step_class(d, s, d->re->ascii_class[b[i]]);
        else if (u == 2) s = step_class(d, s, glm_regex_class(d->re, t.cp));
        else {
            int r = lo > hi ? DEAD : may_take(d, s, lo, hi);
            if (r != 0) return r == FULL ? -1 : 0;
        }
        if (s == DEAD) return 0;
        if (s == FULL) return -1;
    }
    return 1;
}

static int nfa_fits(const glm_regex *re, const uint64_t *set, const glm_regex_text *t, const unsigned char *b, size_t n) {
    uint64_t s2[GLM_REGEX_MAX_STATES / 64];
    memcpy(s2, set, sizeof s2[0] * (size_t)re->words);
    glm_regex_text t2 = *t;
    for (size_t i = 0; i < n; i++)
        if (glm_regex_byte(re, s2, &t2, b[i])) return 0;
    return 1;
}

void glm_regex_mask(const glm_text_vocab *v, const glm_regex *re, glm_regex_dfa *d, const uint64_t *set,
                    const glm_regex_text *t, size_t so_far, const int32_t *ends, int n_ends, float *logits) {
    glm_end_logits kept;
    glm_ends_save(v->V, ends, n_ends, logits, &kept);
    int s = d ? state_of(d, set) : FULL;
    if (s == FULL && d) { /* a full cache starts again, with the row's state */
        d->n = 0;
        memset(d->slot, 0xff, sizeof *d->slot * (size_t)d->hcap);
        s = state_of(d, set);
    }
    uint8_t first[256]; /* the bytes that can come next: most tokens are refused by their first */
    for (int c = 0; c < 256; c++) {
        unsigned char b = (unsigned char)c;
        first[c] = (uint8_t)nfa_fits(re, set, t, &b, 1);
    }
    for (int id = 0; id < v->V; id++) {
        const char *b;
        size_t n = glm_choice_token_bytes(v, id, so_far, &b);
        int fits = n && first[(unsigned char)b[0]];
        if (fits) {
            int r = s >= 0 ? dfa_fits(d, s, *t, (const unsigned char *)b, n) : -1;
            fits = r < 0 ? nfa_fits(re, set, t, (const unsigned char *)b, n) : r;
        }
        if (!fits) logits[id] = GLM_MASKED;
    }
    glm_ends_put(v->V, ends, &kept, !t->need && glm_regex_accepts(re, set), logits); /* where the text matches */
}
