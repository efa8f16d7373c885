#include "data/hash.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
/* memcpy reads: the data may be unaligned; the compiler turns these into single loads.
 * Little-endian hosts only (x86-64, aarch64), which is all glmtrain targets. */
static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t round64(uint64_t acc, uint64_t in) { acc += in * P2; acc = rotl(acc, 31); return acc * P1; }
static inline uint64_t merge64(uint64_t acc, uint64_t v) { acc ^= round64(0, v); return acc * P1 + P4; }

uint64_t glm_xxh64(const void *data, size_t len, uint64_t seed) {
    const uint8_t *p = data, *end = p + len;
    uint64_t h;
    if (len >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        const uint8_t *limit = end - 32;
        do {
            v1 = round64(v1, rd64(p)); v2 = round64(v2, rd64(p + 8));
            v3 = round64(v3, rd64(p + 16)); v4 = round64(v4, rd64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = merge64(h, v1); h = merge64(h, v2); h = merge64(h, v3); h = merge64(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)len;
    for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, rd64(p)), 27) * P1 + P4;
    if (p + 4 <= end) { h = rotl(h ^ (uint64_t)rd32(p) * P1, 23) * P2 + P3; p += 4; }
    for (; p < end; p++) h = rotl(h ^ (uint64_t)*p * P5, 11) * P1;
    h ^= h >> 33; h *= P2; h ^= h >> 29; h *= P3; h ^= h >> 32;
    return h;
}

int glm_hash_file(const char *path, uint64_t seed, uint64_t *out, glm_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) return glm_fail(err, "cannot open %s: %s", path, strerror(errno));
    /* Chunked so a large file is never held twice; each chunk chains into the next seed. */
    size_t cap = 8u << 20, n;
    uint8_t *buf = glm_malloc(cap);
    uint64_t h = seed;
    while ((n = fread(buf, 1, cap, f)) > 0) h = glm_xxh64(buf, n, h);
    int bad = ferror(f);
    fclose(f);
    free(buf);
    if (bad) return glm_fail(err, "cannot read %s", path);
    *out = h;
    return 0;
}
