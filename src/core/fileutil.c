#define _POSIX_C_SOURCE 200809L
#include "core/fileutil.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

char *glm_read_file(const char *path, size_t *len, glm_err *err) {
    FILE *f = fopen(path, "rb");
    if (!f) { glm_fail_open(path, errno, err); return NULL; }
    if (fseek(f, 0, SEEK_END) != 0) { fclose(f); glm_fail(err, "cannot seek %s", path); return NULL; }
    long n = ftell(f);
    if (n < 0) { fclose(f); glm_fail(err, "cannot size %s (is it a folder?)", path); return NULL; }
    rewind(f);
    char *buf = glm_malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f); free(buf);
        glm_fail(err, "cannot read %s: short read", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

int glm_write_file_atomic(const char *path, const void *data, size_t len, glm_err *err) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return glm_fail(err, "cannot create %s: %s", tmp, strerror(errno));
    int ok = fwrite(data, 1, len, f) == len;
    ok &= fflush(f) == 0;
    ok &= fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok) { unlink(tmp); return glm_fail(err, "cannot write %s (disk full?)", tmp); }
    if (rename(tmp, path) != 0) return glm_fail(err, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    return 0;
}

int glm_copy_file(const char *src, const char *dst, glm_err *err) {
    size_t n;
    char *buf = glm_read_file(src, &n, err);
    if (!buf) return -1;
    int rc = glm_write_file_atomic(dst, buf, n, err);
    free(buf);
    return rc;
}

int glm_copy_named_files(const char *from, const char *to, const char *const *names, int n, glm_err *err) {
    char src[4096], dst[4096];
    for (int i = 0; i < n; i++) {
        glm_path_join(src, sizeof src, from, names[i]);
        if (!glm_is_file(src)) continue;
        glm_path_join(dst, sizeof dst, to, names[i]);
        if (glm_copy_file(src, dst, err)) return -1;
    }
    return 0;
}

int glm_is_dir(const char *path) { struct stat st; return stat(path, &st) == 0 && S_ISDIR(st.st_mode); }
int glm_is_file(const char *path) { struct stat st; return stat(path, &st) == 0 && S_ISREG(st.st_mode); }

void glm_path_join(char *dst, size_t n, const char *a, const char *b) {
    size_t la = strlen(a);
    snprintf(dst, n, "%s%s%s", a, (la && a[la - 1] == '/') ? "" : "/", b);
}

int glm_mkdirs(const char *path, glm_err *err) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return glm_fail(err, "cannot create folder %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) return glm_fail(err, "cannot create folder %s: %s", buf, strerror(errno));
    return 0;
}

double glm_host_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024.0;
}

int glm_dangling_link(const char *path, char *target, size_t n) {
    struct stat ls, st;
    if (lstat(path, &ls) != 0 || !S_ISLNK(ls.st_mode) || stat(path, &st) == 0) return 0;
    ssize_t k = readlink(path, target, n ? n - 1 : 0);
    if (n) target[k > 0 ? k : 0] = 0;
    return 1;
}

int glm_fail_open(const char *path, int errnum, glm_err *err) {
    char to[1024];
    if (errnum == ENOENT && glm_dangling_link(path, to, sizeof to))
        return glm_fail(err, "cannot open %s: it links to %s, which does not exist", path, to),
               glm_hint(err, "a download that did not finish or a pruned cache: fetch the model again (huggingface-cli download)");
    return glm_fail(err, "cannot open %s: %s", path, strerror(errnum));
}

double glm_disk_free(const char *path) {
    struct statvfs v;
    return statvfs(path, &v) == 0 ? (double)v.f_bavail * (double)v.f_frsize : -1;
}

void glm_fmt_bytes(char *out, size_t n, double b) {
    if (b >= 1e9) snprintf(out, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(out, n, "%.1f MB", b / 1e6);
    else snprintf(out, n, "%.0f kB", b / 1e3);
}
