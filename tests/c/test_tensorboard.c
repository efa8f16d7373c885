/* TensorBoard writer: crc32c against RFC 3720 vectors, and the event file decoded back here
 * (framing, masked CRCs, file_version first, then tag/value/step). The Python test reads the
 * same kind of file with TensorBoard's own reader. */
#include <dirent.h>
#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include "core/fileutil.h"
#include "io/tensorboard.h"
#include "test.h"

static int rm_cb(const char *p, const struct stat *s, int f, struct FTW *w) { return remove(p); }

static uint32_t unmask(uint32_t m) { uint32_t r = m - 0xa282ead8u; return (r >> 17) | (r << 15); }
static uint64_t le(const unsigned char *p, int n) { uint64_t x = 0; for (int i = n - 1; i >= 0; i--) x = x << 8 | p[i]; return x; }
static uint64_t varint(const unsigned char *p, size_t *i) {
    uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) { unsigned char c = p[(*i)++]; v |= (uint64_t)(c & 0x7f) << s; if (!(c & 0x80)) break; }
    return v;
}

typedef struct { int64_t step; char tag[64]; float value; char version[32]; } event;

/* Decodes the Event fields this writer emits; unknown fields fail the parse. */
static int decode(const unsigned char *p, size_t n, event *ev) {
    memset(ev, 0, sizeof *ev);
    size_t i = 0;
    while (i < n) {
        unsigned key = p[i++];
        if (key == 0x09) i += 8;
        else if (key == 0x10) ev->step = (int64_t)varint(p, &i);
        else if (key == 0x1a) { size_t l = varint(p, &i); snprintf(ev->version, sizeof ev->version, "%.*s", (int)l, p + i); i += l; }
        else if (key == 0x2a) {
            size_t l = varint(p, &i), end = i + l;
            if (p[i++] != 0x0a) return -1;
            varint(p, &i);
            if (p[i++] != 0x0a) return -1;
            size_t tl = varint(p, &i);
            snprintf(ev->tag, sizeof ev->tag, "%.*s", (int)tl, p + i);
            i += tl;
            if (p[i++] != 0x15) return -1;
            uint32_t b = (uint32_t)le(p + i, 4);
            memcpy(&ev->value, &b, 4);
            i += 4;
            if (i != end) return -1;
        } else return -1;
    }
    return i == n ? 0 : -1;
}

int main(void) {
    test_counts tc = {0};
    unsigned char zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, 32);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
    TEST_CHECK(&tc, "tb_crc32c_123456789", tb_crc32c("123456789", 9) == 0xe3069283u, "got %08x", tb_crc32c("123456789", 9));
    int rfc = tb_crc32c(zeros, 32) == 0x8a9136aau && tb_crc32c(ones, 32) == 0x62a8ab43u && tb_crc32c(inc, 32) == 0x46dd794eu && tb_crc32c("", 0) == 0;
    TEST_CHECK(&tc, "tb_crc32c_rfc3720_vectors", rfc, "zeros %08x ones %08x inc %08x", tb_crc32c(zeros, 32), tb_crc32c(ones, 32), tb_crc32c(inc, 32));

    char dir[64] = "/tmp/glm_tb_XXXXXX", logdir[128];
    if (!mkdtemp(dir)) { TEST_FAIL(&tc, "tb_tempdir", "mkdtemp failed"); TEST_EXIT(&tc); }
    snprintf(logdir, sizeof logdir, "%s/run/a", dir);
    glm_err err = {0};
    tb_writer *w = NULL, *w2 = NULL;
    int ok = tb_open(&w, logdir, &err) == 0 && tb_open(&w2, logdir, &err) == 0;
    TEST_CHECK(&tc, "tb_open_two_writers_distinct_files", ok && strcmp(tb_path(w), tb_path(w2)) != 0 && strstr(tb_path(w), "events.out.tfevents."),
               "%s", err.msg);
    char path[4096];
    snprintf(path, sizeof path, "%s", ok ? tb_path(w) : "");
    tb_close(w2);
    const char *tags[3] = {"train/loss", "train/lr", "eval/x y"};
    for (int s = 0; ok && s < 50; s++)
        for (int t = 0; t < 3; t++) ok &= tb_scalar(w, tags[t], (float)(s * 0.5 - t), (int64_t)s * 1000000007ll) == 0;
    ok &= tb_scalar(w, "neg", -1.5f, -3) == 0 && tb_flush(w) == 0;
    tb_close(w);
    TEST_CHECK(&tc, "tb_scalar_writes", ok, "a write failed");

    size_t len = 0;
    unsigned char *buf = (unsigned char *)glm_read_file(path, &len, &err);
    int nrec = 0, crc_bad = 0, dec_bad = 0, val_bad = 0, first_ok = 0;
    for (size_t i = 0; buf && i + 12 <= len;) {
        uint64_t n = le(buf + i, 8);
        if (unmask((uint32_t)le(buf + i + 8, 4)) != tb_crc32c(buf + i, 8) || i + 16 + n > len) { crc_bad++; break; }
        const unsigned char *d = buf + i + 12;
        if (unmask((uint32_t)le(d + n, 4)) != tb_crc32c(d, n)) crc_bad++;
        event ev;
        if (decode(d, n, &ev) != 0) dec_bad++;
        else if (nrec == 0) first_ok = strcmp(ev.version, "brain.Event:2") == 0 && ev.step == 0 && !ev.tag[0];
        else if (nrec <= 150) {
            int s = (nrec - 1) / 3, t = (nrec - 1) % 3;
            val_bad += strcmp(ev.tag, tags[t]) != 0 || ev.value != (float)(s * 0.5 - t) || ev.step != (int64_t)s * 1000000007ll;
        } else val_bad += strcmp(ev.tag, "neg") != 0 || ev.value != -1.5f || ev.step != -3;
        nrec++;
        i += 16 + n;
    }
    TEST_CHECK(&tc, "tb_records_framed_with_masked_crc", buf && nrec == 152 && crc_bad == 0, "%d records, %d bad crcs (%s)", nrec, crc_bad, err.msg);
    TEST_CHECK(&tc, "tb_first_record_file_version", first_ok, "first record is not file_version brain.Event:2");
    TEST_CHECK(&tc, "tb_scalars_decode_back", dec_bad == 0 && val_bad == 0, "%d undecodable, %d wrong", dec_bad, val_bad);
    free(buf);

    char file[160];
    snprintf(file, sizeof file, "%s/plainfile", dir);
    glm_write_file_atomic(file, "x", 1, &err);
    snprintf(logdir, sizeof logdir, "%s/plainfile/sub", dir);
    w = NULL;
    int rc = tb_open(&w, logdir, &err);
    TEST_CHECK(&tc, "tb_open_bad_logdir_fails_cleanly", rc == -1 && !w && strstr(err.msg, "plainfile"), "rc %d: %s", rc, err.msg);
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    TEST_EXIT(&tc);
}
