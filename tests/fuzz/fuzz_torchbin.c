/* libFuzzer target for the torch .bin reader. First byte selects the mode:
 *   odd:  the rest is a whole archive (exercises the zip layer);
 *   even: the rest is data.pkl, wrapped in a valid archive with storages data/0 and data/1 of
 *         64 bytes each (exercises the pickle VM and tensor validation past the zip layer).
 * Opening must fail with a message or yield tensors that read back within bounds. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include "io/torchbin.h"
#include "torchbin_fixture.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    fx_buf file = {0};
    if (data[0] & 1) {
        fx_put(&file, data + 1, size - 1);
    } else {
        fx_buf pkl = {(unsigned char *)data + 1, size - 1, 0}, st[2] = {{0}, {0}};
        for (int i = 0; i < 64; i++) { fx_u8(&st[0], (unsigned)i); fx_u8(&st[1], (unsigned)(255 - i)); }
        fx_archive(&file, "archive", &pkl, st, 2, data[size - 1] == 0x64);
        free(st[0].p);
        free(st[1].p);
    }
    int fd = memfd_create("fuzz.bin", MFD_CLOEXEC);
    if (fd < 0 || write(fd, file.p, file.n) != (ssize_t)file.n) { if (fd >= 0) close(fd); free(file.p); return 0; }
    free(file.p);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tbin_reader *r = NULL;
    glm_err err;
    if (tbin_open(&r, path, &err) == 0) {
        for (int i = 0; i < tbin_count(r); i++) {
            const char *name = tbin_name(r, i);
            st_dtype dt;
            int nd;
            int64_t sh[ST_MAX_DIMS];
            if (tbin_info(r, name, &dt, &nd, sh) != 0) abort();
            uint64_t numel = 1;
            for (int d = 0; d < nd; d++) numel *= (uint64_t)sh[d];
            if (numel > (1u << 20)) continue;
            void *buf = malloc(numel * 8 + 8);
            if (dt == ST_F32 || dt == ST_F16 || dt == ST_BF16 || dt == ST_F64) tbin_read_f32(r, name, buf, nd, sh, &err);
            tbin_read_raw(r, name, dt, buf, numel * st_dtype_size(dt), &err);
            free(buf);
        }
        tbin_close(r);
    }
    close(fd);
    return 0;
}
