/* 64-bit content hashes for the tokenized-data cache key and its corruption check. XXH64 (the
 * published xxHash64 algorithm, seedable so several inputs chain into one key) — fast enough
 * (several GB/s) that hashing a large data file costs less than re-reading it. */
#ifndef GLM_DATA_HASH_H
#define GLM_DATA_HASH_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

uint64_t glm_xxh64(const void *data, size_t len, uint64_t seed);
/* Hashes the bytes of a file (chained from seed). Returns 0, or -1 naming the file. */
int glm_hash_file(const char *path, uint64_t seed, uint64_t *out, glm_err *err);

#endif
