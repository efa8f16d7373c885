/* Regular expressions for decoding constraints (vLLM's guided_regex, a JSON Schema's "pattern" and
 * "format"): compiled into a Thompson NFA over Unicode code points and matched whole, as Python's
 * re.fullmatch, a code point at a time by the set of states still alive.
 *
 * The syntax is the part of Python's that a byte-at-a-time recognizer can keep exactly: literals
 * (UTF-8), escapes (\n \t \r \f \v \\ \. ..., \xHH, \uHHHH), '.', classes ([a-z0-9_], [^"],
 * \d \w \s and their negations), groups ((...), (?:...), (?P<name>...)), '|', the quantifiers
 * * + ? {m} {m,} {m,n} (lazy forms match the same strings), and '^' / '$' at the ends. \d, \w and
 * \s are their ASCII sets and \D, \W, \S the ASCII characters outside them: a subset of what Python
 * takes, so every text made matches there too. Anything else (backreferences, lookarounds, \b,
 * flags, Unicode classes) is refused by name. */
#ifndef GLM_INFER_REGEX_H
#define GLM_INFER_REGEX_H
#include <stddef.h>
#include <stdint.h>

#define GLM_REGEX_MAX_STATES 1024

typedef struct glm_regex_range { uint32_t lo, hi; } glm_regex_range;

typedef struct glm_regex_node {
    uint8_t kind;       /* a code point in ranges, a fork, or the end (regex.c) */
    int out, out1;      /* the next node(s) */
    int r0, nr;         /* a code point's ranges: ranges[r0, r0 + nr) */
} glm_regex_node;

typedef struct glm_regex {
    glm_regex_node *node;
    int n, start;
    glm_regex_range *ranges;
    int n_ranges;
    int words;          /* uint64_t words of a state set */
    /* the code points cut into classes that every node takes whole or not at all: class k is
     * [bounds[k], bounds[k + 1]); the masks' DFA steps by class (regex_mask.c) */
    uint32_t *bounds;
    int n_classes;
    uint16_t ascii_class[128];
} glm_regex;

/* Compiles pattern into at most max_states nodes (<= GLM_REGEX_MAX_STATES); -1 with why[] naming
 * what is not supported and where. */
int glm_regex_compile(glm_regex *re, const char *pattern, int max_states, char *why, size_t cap);
void glm_regex_free(glm_regex *re);

/* set[re->words]: the states alive before any code point. */
void glm_regex_start(const glm_regex *re, uint64_t *set);
/* Moves set on by code point cp: 0, or -1 (set unchanged) when no state takes it. */
int glm_regex_step(const glm_regex *re, uint64_t *set, uint32_t cp);
/* The text so far matches whole; some code point may still come. */
int glm_regex_accepts(const glm_regex *re, const uint64_t *set);
int glm_regex_goes_on(const glm_regex *re, const uint64_t *set);
/* Some code point within [lo, hi] may come next (a UTF-8 character whose first bytes are known). */
int glm_regex_may_take(const glm_regex *re, const uint64_t *set, uint32_t lo, uint32_t hi);

/* A regular expression followed over UTF-8 bytes: the states and the character being read. */
typedef struct glm_regex_text {
    uint8_t need, lo, hi; /* glm_utf8_step's */
    uint32_t cp;          /* the code point's bits so far */
    uint8_t got;          /* its bytes so far */
} glm_regex_text;
/* Byte c of the text: -1 not UTF-8 here; 1 an ASCII character (c); 2 a character made whole (t->cp);
 * 0 a character still cut, which can become one within [*lo, *hi] (lo > hi: none). */
int glm_regex_text_byte(glm_regex_text *t, unsigned c, uint32_t *lo, uint32_t *hi);
/* Feeds byte c: 0 and moved on, -1 (nothing changed) where it cannot come. set as above. */
int glm_regex_byte(const glm_regex *re, uint64_t *set, glm_regex_text *t, unsigned c);

/* The class of code point cp (glm_regex.bounds). */
int glm_regex_class(const glm_regex *re, uint32_t cp);

/* The masks' cache (regex_mask.c): the NFA's state sets met so far as the states of a DFA whose
 * transitions go by class, filled as the masks need them, so that a token's bytes cost a table
 * lookup each. One a row (it is written while masking); at most GLM_REGEX_DFA_STATES states, then
 * it starts again empty. */
#define GLM_REGEX_DFA_STATES 4096
typedef struct glm_regex_dfa glm_regex_dfa;
glm_regex_dfa *glm_regex_dfa_new(const glm_regex *re);
void glm_regex_dfa_free(glm_regex_dfa *d);

/* A regex constraint's masks (vLLM's guided_regex: the answer's text matches whole): before a
 * choice, logits[V] of the tokens whose bytes (an answer's first token without the space decoding
 * drops: glm_choice_token_bytes) cannot come next far below the rest, and of the ends[n_ends] unless
 * the text so far (so_far bytes) is a match. d: the row's cache (NULL: the NFA itself, slower). */
struct glm_text_vocab;
void glm_regex_mask(const struct glm_text_vocab *v, const glm_regex *re, glm_regex_dfa *d, const uint64_t *set,
                    const glm_regex_text *t, size_t so_far, const int32_t *ends, int n_ends, float *logits);

#endif
