/* TensorBoard event writer. The protobufs are tiny and fixed, so they are encoded by hand:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
 * Each Event is framed as a TFRecord: u64 length, masked crc32c(length), data, masked crc32c(data).
 * Every record is flushed at once: a crashed run keeps its curves, and the cost is one write(). */
#include "io/tensorboard.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "core/fileutil.h"

struct tb_writer {
    FILE *f;
    char path[4096];
};

uint32_t tb_crc32c(const void *data, size_t n) {
    /* Bitwise CRC-32C (Castagnoli, reflected poly 0x82F63B78): records are ~100 bytes, so a
     * table would buy nothing and would be one more global. */
    const unsigned char *p = data;
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    }
    return crc ^ 0xffffffffu;
}

static uint32_t masked_crc(const void *data, size_t n) {
    uint32_t c = tb_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

typedef struct pbuf { unsigned char b[1024]; size_t n; } pbuf; /* tags are capped, so this never overflows */

static void put_varint(pbuf *p, uint64_t v) {
    do {
        unsigned char c = v & 0x7f;
        v >>= 7;
        p->b[p->n++] = c | (v ? 0x80 : 0);
    } while (v);
}
static void put_bytes(pbuf *p, const void *s, size_t n) { memcpy(p->b + p->n, s, n); p->n += n; }
static void put_le(pbuf *p, uint64_t v, int bytes) { for (int i = 0; i < bytes; i++) p->b[p->n++] = (unsigned char)(v >> (8 * i)); }

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Frames one serialized Event as a TFRecord and flushes it. */
static int write_record(tb_writer *w, const pbuf *ev) {
    unsigned char hdr[12];
    uint64_t len = ev->n;
    for (int i = 0; i < 8; i++) hdr[i] = (unsigned char)(len >> (8 * i));
    uint32_t c1 = masked_crc(hdr, 8), c2 = masked_crc(ev->b, ev->n);
    for (int i = 0; i < 4; i++) hdr[8 + i] = (unsigned char)(c1 >> (8 * i));
    unsigned char tail[4];
    for (int i = 0; i < 4; i++) tail[i] = (unsigned char)(c2 >> (8 * i));
    if (fwrite(hdr, 1, 12, w->f) != 12 || fwrite(ev->b, 1, ev->n, w->f) != ev->n || fwrite(tail, 1, 4, w->f) != 4) return -1;
    return fflush(w->f) == 0 ? 0 : -1;
}

static void put_header(pbuf *p, int64_t step) {
    double t = wall_time();
    uint64_t bits;
    memcpy(&bits, &t, 8);
    p->b[p->n++] = 0x09; /* field 1, fixed64 */
    put_le(p, bits, 8);
    p->b[p->n++] = 0x10; /* field 2, varint; negative steps become 10-byte two's complement, as protobuf does */
    put_varint(p, (uint64_t)step);
}

int tb_open(tb_writer **out, const char *logdir, glm_err *err) {
    *out = NULL;
    if (glm_mkdirs(logdir, err) != 0) return glm_wrap(err, "tensorboard: ");
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++) if (*c == '/') *c = '_';
    tb_writer *w = glm_calloc(1, sizeof *w);
    long secs = (long)time(NULL);
    int fd = -1;
    /* O_EXCL: two writers opened in the same second must not share a file; add a suffix. */
    for (int k = 0; k < 100 && fd < 0; k++) {
        char base[400];
        if (k == 0) snprintf(base, sizeof base, "events.out.tfevents.%ld.%s.%ld", secs, host, (long)getpid());
        else snprintf(base, sizeof base, "events.out.tfevents.%ld.%s.%ld.%d", secs, host, (long)getpid(), k);
        glm_path_join(w->path, sizeof w->path, logdir, base);
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        glm_fail(err, "tensorboard: cannot create %s: %s", w->path, strerror(errno));
        if (fd >= 0) close(fd);
        free(w);
        return -1;
    }
    pbuf p = {.n = 0};
    put_header(&p, 0);
    static const char ver[] = "brain.Event:2";
    p.b[p.n++] = 0x1a; /* field 3, length-delimited */
    put_varint(&p, sizeof ver - 1);
    put_bytes(&p, ver, sizeof ver - 1);
    if (write_record(w, &p) != 0) {
        glm_fail(err, "tensorboard: cannot write %s: %s", w->path, strerror(errno));
        tb_close(w);
        return -1;
    }
    *out = w;
    return 0;
}

int tb_scalar(tb_writer *w, const char *tag, float value, int64_t step) {
    size_t tl = strlen(tag);
    if (tl > 512) tl = 512; /* a tag that long is a bug upstream; keep the record bounded */
    pbuf val = {.n = 0}, sum = {.n = 0}, ev = {.n = 0};
    val.b[val.n++] = 0x0a; /* Value.tag */
    put_varint(&val, tl);
    put_bytes(&val, tag, tl);
    uint32_t bits;
    memcpy(&bits, &value, 4);
    val.b[val.n++] = 0x15; /* Value.simple_value, fixed32 */
    put_le(&val, bits, 4);
    sum.b[sum.n++] = 0x0a; /* Summary.value */
    put_varint(&sum, val.n);
    put_bytes(&sum, val.b, val.n);
    put_header(&ev, step);
    ev.b[ev.n++] = 0x2a; /* Event.summary */
    put_varint(&ev, sum.n);
    put_bytes(&ev, sum.b, sum.n);
    return write_record(w, &ev);
}

int tb_flush(tb_writer *w) { return fflush(w->f) == 0 ? 0 : -1; }

void tb_close(tb_writer *w) {
    if (!w) return;
    fclose(w->f);
    free(w);
}

const char *tb_path(const tb_writer *w) { return w->path; }
