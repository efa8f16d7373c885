/* Well-formed UTF-8 (Unicode's table 3-7), the one place its rules are written: the tokenizers'
 * validators and the decoding constraints' recognizers step through it. */
#ifndef GLM_CORE_UTF8_H
#define GLM_CORE_UTF8_H
#include <stdint.h>

/* Well-formed UTF-8 a byte at a time (Unicode's table 3-7: no overlong forms, no surrogates, nothing
 * above U+10FFFF): *need continuation bytes still to come, the next within [*lo, *hi]. Returns -1
 * when c cannot come, 0 when it continues a character, 1 when it is ASCII, 2 when it begins a
 * character of several bytes. */
static inline int glm_utf8_step(uint8_t *need, uint8_t *lo, uint8_t *hi, unsigned c) {
    if (*need) {
        if (c < *lo || c > *hi) return -1;
        --*need;
        *lo = 0x80, *hi = 0xBF;
        return 0;
    }
    if (c < 0x80) return 1;
    unsigned n = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : 0;
    if (!n) return -1;
    *need = (uint8_t)n;
    *lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    *hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    return 2;
}

#endif
