/* Helpers shared by the libFuzzer targets: the parsers under test take paths, so an input is
 * handed over as an in-memory file (memfd) that /proc/self/fd names; no disk is touched. */
#ifndef GLM_FUZZ_UTIL_H
#define GLM_FUZZ_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data into a new memfd and its /proc path into path. Returns the fd (close it), or -1. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t path_len) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (size && write(fd, data, size) != (ssize_t)size) { close(fd); return -1; }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

/* A NUL-terminated malloc'd copy (parsers of text want a C string). */
static inline char *fuzz_cstr(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (!s) abort();
    memcpy(s, data, size);
    s[size] = 0;
    return s;
}

/* A broken invariant: print why, then abort so libFuzzer keeps the input as a crash. */
#define FUZZ_CHECK(cond, ...) \
    do { if (!(cond)) { fprintf(stderr, "fuzz invariant failed: %s: ", #cond); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); abort(); } } while (0)

/* Writes data[0..n) as the file path (the targets that fuzz a folder rewrite its files per input). */
static inline void fuzz_write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f, "cannot write %s", path);
    fwrite(data, 1, n, f);
    fclose(f);
}

#endif
