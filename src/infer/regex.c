/* Regular expressions for decoding constraints (infer/regex.h): a recursive-descent parser into a
 * syntax tree, the tree into a Thompson NFA built from its end backwards, and the state sets. */
#include "infer/regex.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/err.h"
#include "infer/text_vocab.h"

enum { N_CHAR, N_FORK, N_END };                                  /* NFA nodes */
enum { T_EMPTY, T_SET, T_CAT, T_ALT, T_REP };                    /* syntax tree */
#define MAX_CP 0x10FFFF
#define MAX_TREE 4096
#define MAX_COUNT 1000

typedef struct tree { uint8_t t; int a, b, r0, nr, lo, hi; } tree; /* T_REP: a{lo,hi}, hi -1: no limit */

typedef struct parser {
    const char *p, *start;
    char *why;
    size_t cap;
    int bad;
    tree *t;
    int nt;
    glm_regex_range *r;
    int nr, cr;
} parser;

static int fail(parser *P, const char *msg) {
    if (!P->bad) snprintf(P->why, P->cap, "at %d: %s", (int)(P->p - P->start), msg);
    P->bad = 1;
    return -1;
}

static int new_tree(parser *P, int t, int a, int b) {
    if (P->nt >= MAX_TREE) return fail(P, "the pattern is too long");
    P->t[P->nt] = (tree){.t = (uint8_t)t, .a = a, .b = b};
    return P->nt++;
}

static void add_range(parser *P, uint32_t lo, uint32_t hi) {
    if (P->nr == P->cr) P->r = glm_realloc(P->r, sizeof *P->r * (size_t)(P->cr = P->cr ? 2 * P->cr : 64));
    P->r[P->nr++] = (glm_regex_range){lo, hi};
}

static int by_lo(const void *a, const void *b) {
    const glm_regex_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The ranges from r0 on sorted and merged (and complemented within [0, MAX_CP] when negate); a T_SET. */
static int make_set(parser *P, int r0, int negate) {
    int n = P->nr - r0;
    qsort(P->r + r0, (size_t)n, sizeof *P->r, by_lo);
    int k = 0;
    for (int i = 0; i < n; i++) {
        glm_regex_range x = P->r[r0 + i];
        if (k && x.lo <= P->r[r0 + k - 1].hi + 1) { if (x.hi > P->r[r0 + k - 1].hi) P->r[r0 + k - 1].hi = x.hi; }
        else P->r[r0 + k++] = x;
    }
    P->nr = r0 + k;
    if (negate) {
        glm_regex_range *old = glm_malloc(sizeof *old * (size_t)(k ? k : 1));
        memcpy(old, P->r + r0, sizeof *old * (size_t)k);
        P->nr = r0;
        uint32_t at = 0;
        for (int i = 0; i < k; i++) {
            if (old[i].lo > at) add_range(P, at, old[i].lo - 1);
            at = old[i].hi + 1;
        }
        if (at <= MAX_CP) add_range(P, at, MAX_CP);
        free(old);
    }
    /* only what UTF-8 can write: nothing above U+10FFFF, no surrogates */
    int m = P->nr - r0, w = 0;
    glm_regex_range *keep = glm_malloc(sizeof *keep * (size_t)(2 * m + 1));
    for (int i = 0; i < m; i++) {
        glm_regex_range x = P->r[r0 + i];
        if (x.lo > MAX_CP) continue;
        if (x.hi > MAX_CP) x.hi = MAX_CP;
        if (x.lo < 0xD800) keep[w++] = (glm_regex_range){x.lo, x.hi < 0xD7FF ? x.hi : 0xD7FF};
        if (x.hi > 0xDFFF) keep[w++] = (glm_regex_range){x.lo > 0xE000 ? x.lo : 0xE000, x.hi};
    }
    P->nr = r0;
    for (int i = 0; i < w; i++) add_range(P, keep[i].lo, keep[i].hi);
    free(keep);
    if (P->nr == r0) return fail(P, "a character or class that UTF-8 cannot write (a surrogate, or above U+10FFFF)");
    int t = new_tree(P, T_SET, 0, 0);
    if (t >= 0) P->t[t].r0 = r0, P->t[t].nr = P->nr - r0;
    return t;
}

/* One UTF-8 character of the pattern. */
static uint32_t pattern_cp(parser *P) {
    uint8_t need = 0, lo = 0, hi = 0;
    unsigned c = (unsigned char)*P->p++;
    int u = glm_utf8_step(&need, &lo, &hi, c);
    if (u < 0) return fail(P, "the pattern is not UTF-8"), 0;
    uint32_t cp = u == 1 ? c : c & (need == 1 ? 0x1F : need == 2 ? 0x0F : 0x07);
    while (need) {
        c = (unsigned char)*P->p;
        if (!c || glm_utf8_step(&need, &lo, &hi, c) < 0) return fail(P, "the pattern is not UTF-8"), 0;
        cp = cp << 6 | (c & 0x3F);
        P->p++;
    }
    return cp;
}

static int hex_digits(parser *P, int n, uint32_t *out) {
    *out = 0;
    for (int i = 0; i < n; i++) {
        char c = *P->p;
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return fail(P, "a \\x or \\u escape needs its hex digits");
        *out = *out * 16 + (uint32_t)h;
        P->p++;
    }
    return 0;
}

/* \d \w \s (ASCII) and \D \W \S (the ASCII characters outside them) as ranges; 0 when c is none. */
static int shorthand(parser *P, char c, int in_negated_class) {
    static const char *const SETS[3][2] = {{"09", NULL}, {"09AZ__az", NULL}, {"\t\r  ", "\x1c\x1f"}};
    const char *k = strchr("dwsDWS", c);
    if (!c || !k) return 0;
    if (in_negated_class) return fail(P, "\\d, \\w, \\s and their negations inside [^...] are not supported (Python's are Unicode sets)");
    int which = (int)(k - "dwsDWS") % 3, neg = k - "dwsDWS" >= 3;
    if (!neg) {
        for (const char *s = SETS[which][0]; *s; s += 2) add_range(P, (unsigned char)s[0], (unsigned char)s[1]);
        return 1;
    }
    /* the ASCII characters not in the set, and not anything Python's Unicode set would take */
    uint32_t at = 0;
    const char *s = SETS[which][0];
    char all[16];
    snprintf(all, sizeof all, "%s%s", s, SETS[which][1] ? SETS[which][1] : "");
    int n = (int)strlen(all) / 2;
    glm_regex_range in[8];
    for (int i = 0; i < n; i++) in[i] = (glm_regex_range){(unsigned char)all[2 * i], (unsigned char)all[2 * i + 1]};
    qsort(in, (size_t)n, sizeof in[0], by_lo);
    for (int i = 0; i < n; i++) {
        if (in[i].lo > at) add_range(P, at, in[i].lo - 1);
        if (in[i].hi + 1 > at) at = in[i].hi + 1;
    }
    if (at <= 0x7F) add_range(P, at, 0x7F);
    return 1;
}

/* An escape after '\\' (P->p at the letter): a code point in *cp, or a shorthand's ranges added
 * (returns 1). */
static int escape(parser *P, uint32_t *cp, int in_class, int in_negated_class) {
    char c = *P->p;
    if (!c) return fail(P, "a pattern cannot end in a backslash");
    int s = shorthand(P, c, in_negated_class);
    if (s) { P->p++; return s < 0 ? -1 : 1; }
    P->p++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hex_digits(P, 2, cp);
    case 'u': return hex_digits(P, 4, cp);
    case 'U': return hex_digits(P, 8, cp);
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
        char msg[120];
        snprintf(msg, sizeof msg, "\\%c is not supported (backreferences, \\b, \\A, \\Z and Unicode classes are not)", c);
        P->p--;
        return fail(P, msg);
    }
    (void)in_class;
    *cp = (unsigned char)c; /* an escaped punctuation character is itself */
    return 0;
}

static int parse_class(parser *P) { /* after '[' */
    int negate = *P->p == '^';
    P->p += negate;
    int r0 = P->nr, first = 1;
    while (*P->p && (*P->p != ']' || first)) {
        first = 0;
        uint32_t lo;
        if (*P->p == '\\') {
            P->p++;
            int e = escape(P, &lo, 1, negate);
            if (e < 0) return -1;
            if (e == 1) continue;
        } else if (*P->p == '[' && P->p[1] == ':') {
            return fail(P, "POSIX classes ([:alpha:]) are not supported");
        } else {
            lo = pattern_cp(P);
            if (P->bad) return -1;
        }
        uint32_t hi = lo;
        if (*P->p == '-' && P->p[1] && P->p[1] != ']') {
            P->p++;
            if (*P->p == '\\') {
                P->p++;
                int e = escape(P, &hi, 1, negate);
                if (e < 0) return -1;
                if (e == 1) return fail(P, "a range cannot end in a class");
            } else {
                hi = pattern_cp(P);
                if (P->bad) return -1;
            }
            if (hi < lo) return fail(P, "a range whose end is below its start");
        }
        add_range(P, lo, hi);
    }
    if (*P->p != ']') return fail(P, "a class without its ']'");
    P->p++;
    return make_set(P, r0, negate);
}

static int parse_alt(parser *P, int depth);

static int parse_atom(parser *P, int depth) {
    char c = *P->p;
    if (c == '(') {
        P->p++;
        if (*P->p == '?') {
            if (P->p[1] == ':') P->p += 2;
            else if (P->p[1] == 'P' && P->p[2] == '<') {
                const char *e = strchr(P->p, '>');
                if (!e) return fail(P, "a group's name without its '>'");
                P->p = e + 1;
            } else {
                return fail(P, "(? groups other than (?:...) and (?P<name>...) are not supported (lookarounds, flags)");
            }
        }
        int t = parse_alt(P, depth + 1);
        if (t < 0) return -1;
        if (*P->p != ')') return fail(P, "a group without its ')'");
        P->p++;
        return t;
    }
    if (c == '[') { P->p++; return parse_class(P); }
    int r0 = P->nr;
    if (c == '.') { /* any character but a newline, as Python's without DOTALL */
        P->p++;
        add_range(P, 0, '\n' - 1);
        add_range(P, '\n' + 1, MAX_CP);
        return make_set(P, r0, 0);
    }
    uint32_t cp;
    if (c == '\\') {
        P->p++;
        int e = escape(P, &cp, 0, 0);
        if (e < 0) return -1;
        if (e == 1) return make_set(P, r0, 0);
    } else {
        if (strchr("*+?{", c)) return fail(P, "a quantifier with nothing before it");
        cp = pattern_cp(P);
        if (P->bad) return -1;
    }
    add_range(P, cp, cp);
    return make_set(P, r0, 0);
}

static int parse_count(parser *P, int *out) {
    if (*P->p < '0' || *P->p > '9') return -1;
    long v = 0;
    while (*P->p >= '0' && *P->p <= '9') { v = v * 10 + (*P->p++ - '0'); if (v > MAX_COUNT) return fail(P, "a count above 1000"); }
    *out = (int)v;
    return 0;
}

static int parse_repeat(parser *P, int depth) {
    int t = parse_atom(P, depth);
    while (t >= 0) {
        int lo, hi;
        char c = *P->p;
        if (c == '*') lo = 0, hi = -1;
        else if (c == '+') lo = 1, hi = -1;
        else if (c == '?') lo = 0, hi = 1;
        else if (c == '{') {
            const char *at = P->p++;
            if (parse_count(P, &lo)) { P->p = at; return fail(P, "'{' must open a count ({2}, {2,}, {2,5}); write \\{ for the brace"); }
            hi = lo;
            if (*P->p == ',') {
                P->p++;
                hi = -1;
                if (*P->p != '}' && parse_count(P, &hi)) return fail(P, "a count's upper bound is not a number");
            }
            if (*P->p != '}') return fail(P, "a count without its '}'");
            if (hi >= 0 && hi < lo) return fail(P, "a count whose upper bound is below its lower");
        } else {
            return t;
        }
        P->p++;
        if (*P->p == '?') P->p++; /* lazy: the same strings */
        else if (*P->p == '+') return fail(P, "possessive quantifiers are not supported");
        int r = new_tree(P, T_REP, t, 0);
        if (r < 0) return -1;
        P->t[r].lo = lo, P->t[r].hi = hi;
        t = r;
    }
    return t;
}

static int parse_cat(parser *P, int depth) {
    int t = new_tree(P, T_EMPTY, 0, 0);
    while (t >= 0 && *P->p && *P->p != '|' && *P->p != ')') {
        if (*P->p == '^' && P->p == P->start) { P->p++; continue; }   /* anchors at the ends: a whole */
        if (*P->p == '$' && P->p[1] == 0) { P->p++; continue; }        /* match is what is made anyway */
        if (*P->p == '^' || *P->p == '$') return fail(P, "'^' and '$' are supported only at the pattern's ends");
        int a = parse_repeat(P, depth);
        if (a < 0) return -1;
        t = P->t[t].t == T_EMPTY ? a : new_tree(P, T_CAT, t, a);
    }
    return t;
}

static int parse_alt(parser *P, int depth) {
    if (depth > 100) return fail(P, "groups nested deeper than 100");
    int t = parse_cat(P, depth);
    while (t >= 0 && *P->p == '|') {
        P->p++;
        int b = parse_cat(P, depth);
        if (b < 0) return -1;
        t = new_tree(P, T_ALT, t, b);
    }
    return t;
}

/* ---------------------------------------------------------------- the NFA, built from the end */

typedef struct builder { glm_regex *re; int cap, max; const parser *P; int bad; } builder;

static int node(builder *B, int kind, int out, int out1, int r0, int nr) {
    if (B->re->n >= B->max) { B->bad = 1; return 0; }
    if (B->re->n == B->cap) B->re->node = glm_realloc(B->re->node, sizeof *B->re->node * (size_t)(B->cap = B->cap ? 2 * B->cap : 64));
    B->re->node[B->re->n] = (glm_regex_node){(uint8_t)kind, out, out1, r0, nr};
    return B->re->n++;
}

/* The nodes of tree t, going on to node next; returns t's first node. */
static int build(builder *B, int t, int next) {
    const tree *x = &B->P->t[t];
    if (B->bad) return 0;
    switch (x->t) {
    case T_EMPTY: return next;
    case T_SET: return node(B, N_CHAR, next, -1, x->r0, x->nr);
    case T_CAT: return build(B, x->a, build(B, x->b, next));
    case T_ALT: { int a = build(B, x->a, next), b = build(B, x->b, next); return node(B, N_FORK, a, b, 0, 0); }
    default: { /* T_REP */
        int at = next;
        if (x->hi < 0) { /* a loop: a fork into the body (which comes back to the fork) or on */
            int f = node(B, N_FORK, -1, next, 0, 0);
            if (B->bad) return 0;
            int body = build(B, x->a, f);
            B->re->node[f].out = body;
            at = f;
        } else {
            for (int k = 0; k < x->hi - x->lo && !B->bad; k++) at = node(B, N_FORK, build(B, x->a, at), next, 0, 0);
        }
        for (int k = 0; k < x->lo && !B->bad; k++) at = build(B, x->a, at);
        return at;
    }
    }
}

static int by_value(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Every range's ends cut the code points into classes (bounds[], then MAX_CP + 1 closing them). */
static void make_classes(glm_regex *re) {
    uint32_t *b = glm_malloc(sizeof *b * (size_t)(2 * re->n_ranges + 2));
    int n = 0;
    b[n++] = 0;
    for (int i = 0; i < re->n_ranges; i++) {
        b[n++] = re->ranges[i].lo;
        if (re->ranges[i].hi < MAX_CP) b[n++] = re->ranges[i].hi + 1;
    }
    qsort(b, (size_t)n, sizeof *b, by_value);
    int k = 0;
    for (int i = 0; i < n; i++) if (!k || b[i] != b[k - 1]) b[k++] = b[i];
    b[k] = MAX_CP + 1;
    re->bounds = b;
    re->n_classes = k;
    for (uint32_t c = 0; c < 128; c++) re->ascii_class[c] = (uint16_t)glm_regex_class(re, c);
}

int glm_regex_class(const glm_regex *re, uint32_t cp) {
    int lo = 0, hi = re->n_classes - 1; /* the last class whose start is <= cp */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (re->bounds[mid] <= cp) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

int glm_regex_compile(glm_regex *re, const char *pattern, int max_states, char *why, size_t cap) {
    memset(re, 0, sizeof *re);
    parser P = {.p = pattern, .start = pattern, .why = why, .cap = cap};
    P.t = glm_malloc(sizeof *P.t * MAX_TREE);
    int t = parse_alt(&P, 0);
    if (t >= 0 && *P.p) fail(&P, "an unbalanced ')'");
    int rc = -1;
    if (!P.bad) {
        builder B = {.re = re, .max = max_states < GLM_REGEX_MAX_STATES ? max_states : GLM_REGEX_MAX_STATES, .P = &P};
        int end = node(&B, N_END, -1, -1, 0, 0);
        re->start = build(&B, t, end);
        if (B.bad) snprintf(why, cap, "the pattern needs more than %d states (a shorter pattern, or smaller counts)", B.max);
        else rc = 0;
    }
    re->ranges = P.r;
    re->n_ranges = P.nr;
    re->words = (re->n + 63) / 64;
    free(P.t);
    if (rc) glm_regex_free(re);
    else make_classes(re);
    return rc;
}

void glm_regex_free(glm_regex *re) {
    free(re->node);
    free(re->ranges);
    free(re->bounds);
    memset(re, 0, sizeof *re);
}

/* ---------------------------------------------------------------- state sets */

static void add(const glm_regex *re, uint64_t *set, int s) { /* s and the nodes its forks reach */
    int stack[64], sp = 0;
    for (;;) {
        if (!(set[s / 64] >> (s % 64) & 1)) {
            set[s / 64] |= 1ull << (s % 64);
            const glm_regex_node *x = &re->node[s];
            if (x->kind == N_FORK) {
                if (sp < 64) stack[sp++] = x->out1;
                else add(re, set, x->out1);
                s = x->out;
                continue;
            }
        }
        if (!sp) return;
        s = stack[--sp];
    }
}

void glm_regex_start(const glm_regex *re, uint64_t *set) {
    memset(set, 0, sizeof *set * (size_t)re->words);
    add(re, set, re->start);
}

static int takes(const glm_regex *re, const glm_regex_node *x, uint32_t lo, uint32_t hi) {
    for (int i = 0; i < x->nr; i++) {
        const glm_regex_range *r = &re->ranges[x->r0 + i];
        if (r->lo <= hi && lo <= r->hi) return 1;
    }
    return 0;
}

int glm_regex_step(const glm_regex *re, uint64_t *set, uint32_t cp) {
    uint64_t next[GLM_REGEX_MAX_STATES / 64];
    memset(next, 0, sizeof next[0] * (size_t)re->words);
    int any = 0;
    for (int w = 0; w < re->words; w++)
        for (uint64_t bits = set[w]; bits; bits &= bits - 1) {
            const glm_regex_node *x = &re->node[w * 64 + __builtin_ctzll(bits)];
            if (x->kind == N_CHAR && takes(re, x, cp, cp)) { add(re, next, x->out); any = 1; }
        }
    if (!any) return -1;
    memcpy(set, next, sizeof next[0] * (size_t)re->words);
    return 0;
}

static int any_node(const glm_regex *re, const uint64_t *set, int kind, uint32_t lo, uint32_t hi) {
    for (int w = 0; w < re->words; w++)
        for (uint64_t bits = set[w]; bits; bits &= bits - 1) {
            const glm_regex_node *x = &re->node[w * 64 + __builtin_ctzll(bits)];
            if (x->kind == kind && (kind != N_CHAR || takes(re, x, lo, hi))) return 1;
        }
    return 0;
}

int glm_regex_accepts(const glm_regex *re, const uint64_t *set) { return any_node(re, set, N_END, 0, 0); }
int glm_regex_goes_on(const glm_regex *re, const uint64_t *set) { return any_node(re, set, N_CHAR, 0, MAX_CP); }
int glm_regex_may_take(const glm_regex *re, const uint64_t *set, uint32_t lo, uint32_t hi) {
    return any_node(re, set, N_CHAR, lo, hi);
}

int glm_regex_text_byte(glm_regex_text *t, unsigned c, uint32_t *lo, uint32_t *hi) {
    int u = glm_utf8_step(&t->need, &t->lo, &t->hi, c);
    if (u < 0) return -1;
    if (u == 1) return 1;
    if (u == 2) { t->cp = c & (t->need == 1 ? 0x1F : t->need == 2 ? 0x0F : 0x07); t->got = 1; }
    else { t->cp = t->cp << 6 | (c & 0x3F); t->got++; }
    if (t->need == 0) return 2;
    /* the code points it can still become: its bits so far, the rest anything, within what its
     * length encodes (the classes hold no surrogates, which UTF-8 cannot either) */
    int len = t->got + t->need;
    uint32_t least = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000, most = len == 2 ? 0x7FF : len == 3 ? 0xFFFF : MAX_CP;
    *lo = t->cp << (6 * t->need);
    *hi = *lo | ((1u << (6 * t->need)) - 1);
    if (*lo < least) *lo = least;
    if (*hi > most) *hi = most;
    return 0;
}

int glm_regex_byte(const glm_regex *re, uint64_t *set, glm_regex_text *t, unsigned c) {
    glm_regex_text n = *t;
    uint32_t lo, hi;
    int u = glm_regex_text_byte(&n, c, &lo, &hi);
    if (u < 0 || (u == 1 && glm_regex_step(re, set, c)) || (u == 2 && glm_regex_step(re, set, n.cp)) ||
        (u == 0 && (lo > hi || !glm_regex_may_take(re, set, lo, hi))))
        return -1;
    *t = n;
    return 0;
}
