/* Small file helpers shared by every reader: slurp a file, test existence, join paths. */
#ifndef GLM_FILEUTIL_H
#define GLM_FILEUTIL_H
#include <stddef.h>
#include "core/err.h"

/* Reads a whole file into a NUL-terminated buffer (caller frees). Returns NULL and fills err. */
char *glm_read_file(const char *path, size_t *len, glm_err *err);
/* Writes data to path atomically (path.tmp then rename). */
int glm_write_file_atomic(const char *path, const void *data, size_t len, glm_err *err);
/* Copies a file (atomically at dst). */
int glm_copy_file(const char *src, const char *dst, glm_err *err);
/* Copies those of names[0..n) that exist in folder `from` into folder `to`. */
int glm_copy_named_files(const char *from, const char *to, const char *const *names, int n, glm_err *err);
int glm_is_dir(const char *path);
int glm_is_file(const char *path);
/* dst = a + "/" + b (truncated to n). */
void glm_path_join(char *dst, size_t n, const char *a, const char *b);
/* mkdir -p */
int glm_mkdirs(const char *path, glm_err *err);
/* Bytes free to this user on the disk holding path (-1 when it cannot be asked). */
double glm_disk_free(const char *path);
/* b bytes as disk tools print them: "12.34 GB", "5.6 MB", "780 kB" (powers of 1000). */
void glm_fmt_bytes(char *out, size_t n, double b);

/* 1 when path is a symbolic link whose target does not exist (a Hugging Face cache snapshot
 * whose blob is gone: an unfinished or pruned download), the link's text in target; else 0. */
int glm_dangling_link(const char *path, char *target, size_t n);
/* The error for a path that could not be opened (errnum: open's errno): a link to a missing
 * file is named as such, with the hint to fetch the download again. Returns -1. */
int glm_fail_open(const char *path, int errnum, glm_err *err);

/* MemAvailable of /proc/meminfo in bytes (what can be allocated without swapping), 0 when unknown. */
double glm_host_mem_available(void);

#endif
