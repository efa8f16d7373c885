/* libFuzzer target: arbitrary bytes as a .safetensors file. Opening must either fail with a
 * message or succeed with tensors that all read back (or fail cleanly) within bounds.
 * Built and run by tests/sh/test_fuzz.sh. The file lives in a memfd, so no disk is touched. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) { close(fd); return 0; }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    st_reader *r = NULL;
    glm_err err;
    if (st_open(&r, path, &err) == 0) {
        for (int i = 0; i < st_count(r); i++) {
            const char *name = st_name(r, i);
            st_dtype dt;
            int nd;
            int64_t sh[ST_MAX_DIMS];
            if (st_info(r, name, &dt, &nd, sh) != 0) abort(); /* listed names must be found */
            uint64_t numel = 1;
            for (int d = 0; d < nd; d++) numel *= (uint64_t)sh[d];
            if (numel > (1u << 20)) continue;
            void *buf = malloc(numel * 8 + 8);
            if (dt == ST_F32 || dt == ST_F16 || dt == ST_BF16 || dt == ST_F64) st_read_f32(r, name, buf, nd, sh, &err);
            st_read_raw(r, name, dt, buf, numel * st_dtype_size(dt), &err);
            free(buf);
        }
        st_close(r);
    }
    close(fd);
    return 0;
}
