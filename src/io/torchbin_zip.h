/* Internal: the zip container of torch.save (PyTorchStreamWriter). Only what that writer
 * produces is supported: STORED entries, optionally with zip64 sizes/offsets. The central
 * directory is read into memory; entry data stay on disk and are located by reading each
 * entry's local header. */
#ifndef GLM_TORCHBIN_ZIP_H
#define GLM_TORCHBIN_ZIP_H
#include <stdint.h>
#include "core/err.h"

typedef struct tz_entry {
    char *name;
    uint64_t size, comp_size, local_off;
    uint16_t method, flags;
} tz_entry;

typedef struct tz_archive {
    const char *path; /* for messages; not owned */
    int fd;           /* not owned */
    uint64_t file_size;
    tz_entry *e;      /* sorted by name */
    int n;
} tz_archive;

int tz_open(tz_archive *z, int fd, const char *path, glm_err *err);
void tz_free(tz_archive *z);
const tz_entry *tz_find(const tz_archive *z, const char *name);
/* Where the entry's bytes lie in the file; fails for compressed/encrypted entries or data
 * outside the file. */
int tz_locate(const tz_archive *z, const tz_entry *e, uint64_t *data_off, glm_err *err);

#endif
