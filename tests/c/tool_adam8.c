/* Test tool: the CPU op of 8-bit blockwise AdamW (backend/cpu/cpu_adam8.c) and the maps and
 * state helpers of backend/quant8.h on raw little-endian files, for tests/py/test_adam8.py.
 *   tool_adam8 maps SIGNED.f32 UNSIGNED.f32        the two 256-entry maps
 *   tool_adam8 search signed|unsigned N X.f32 OUT.u8         glm_q8_search of normalised values
 *   tool_adam8 encode signed|unsigned N VAL.f32 AMAX.f32 OUT.u8  glm_q8_encode(value[j], amax[j])
 *   tool_adam8 qstate signed|unsigned N X.f32 Q.u8 ABSMAX.f32    glm_q8_quantize_state
 *   tool_adam8 dqstate signed|unsigned N Q.u8 ABSMAX.f32 OUT.f32 glm_q8_dequantize_state
 *   tool_adam8 step DIR N K FLAT0 MASTER SPLIT
 *       K steps of cpu_adamw8 on the files of DIR, rewritten in place:
 *         p.f32 [N] (the parameter), master.f32 [N] (read and written when MASTER = 1),
 *         qm.u8, qv.u8 [N], am.f32, av.f32 [ceil(N/2048)], bits.u8 (decay bits from bit 0),
 *         and read only: g.f32 [K*N] (step k's gradient), sched.f32 [K*3] (step k's lr, bc1, bc2),
 *         hyper.f32 [5] (b1, b2, eps, wd, grad_scale)
 *       FLAT0: the flat offset of element 0 (a multiple of 64); SPLIT > 0 (a multiple of 2048):
 *       each step as calls on consecutive pieces of SPLIT elements (flat0, states and absmax
 *       advanced), which must equal one call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_adam8.h"
#include "core/err.h"
#include "backend/quant8.h"

static void *read_all(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    void *p = glm_malloc(want ? want : 1);
    if (fread(p, 1, want, f) != want) { fprintf(stderr, "%s: short file (want %zu bytes)\n", path, want); exit(1); }
    fclose(f);
    return p;
}

static void write_all(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) { perror(path); exit(1); }
}

static int kind_of(const char *s) {
    if (!strcmp(s, "signed")) return GLM_Q8_SIGNED;
    if (!strcmp(s, "unsigned")) return GLM_Q8_UNSIGNED;
    fprintf(stderr, "unknown map %s\n", s);
    exit(2);
}

static char *path_in(const char *dir, const char *name) {
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static int cmd_step(int argc, char **argv) {
    if (argc < 8) return 2;
    const char *dir = argv[2];
    size_t n = strtoull(argv[3], NULL, 10), K = strtoull(argv[4], NULL, 10), flat0 = strtoull(argv[5], NULL, 10);
    int with_master = atoi(argv[6]);
    size_t split = strtoull(argv[7], NULL, 10);
    if (flat0 % 64 || (split && split % GLM_ADAM8_BLOCK)) { fprintf(stderr, "FLAT0 %% 64, SPLIT %% 2048\n"); return 2; }
    size_t nb = glm_q8_blocks(n), nbits = ((flat0 + n + 63) / 64 + 7) / 8;
    float *p = read_all(path_in(dir, "p.f32"), n * 4), *master = with_master ? read_all(path_in(dir, "master.f32"), n * 4) : NULL;
    uint8_t *qm = read_all(path_in(dir, "qm.u8"), n), *qv = read_all(path_in(dir, "qv.u8"), n);
    float *am = read_all(path_in(dir, "am.f32"), nb * 4), *av = read_all(path_in(dir, "av.f32"), nb * 4);
    uint8_t *bits = read_all(path_in(dir, "bits.u8"), nbits);
    float *g = read_all(path_in(dir, "g.f32"), K * n * 4), *sched = read_all(path_in(dir, "sched.f32"), K * 12);
    float *hy = read_all(path_in(dir, "hyper.f32"), 20);
    for (size_t k = 0; k < K; k++) {
        float lr = sched[3 * k], bc1 = sched[3 * k + 1], bc2 = sched[3 * k + 2];
        size_t piece = split ? split : n;
        for (size_t lo = 0; lo < n; lo += piece) {
            size_t len = n - lo < piece ? n - lo : piece;
            cpu_adamw8(p + lo, master ? master + lo : NULL, g + k * n + lo, qm + lo, qv + lo, am + lo / GLM_ADAM8_BLOCK,
                       av + lo / GLM_ADAM8_BLOCK, len, bits, flat0 + lo, lr, hy[0], hy[1], hy[2], hy[3], bc1, bc2, hy[4]);
        }
    }
    write_all(path_in(dir, "p.f32"), p, n * 4);
    if (master) write_all(path_in(dir, "master.f32"), master, n * 4);
    write_all(path_in(dir, "qm.u8"), qm, n);
    write_all(path_in(dir, "qv.u8"), qv, n);
    write_all(path_in(dir, "am.f32"), am, nb * 4);
    write_all(path_in(dir, "av.f32"), av, nb * 4);
    void *all[] = {p, master, qm, qv, am, av, bits, g, sched, hy};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: see the file's comment\n"); return 2; }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "maps") && argc == 4) {
        write_all(argv[2], glm_q8_signed_map, 256 * 4);
        write_all(argv[3], glm_q8_unsigned_map, 256 * 4);
        return 0;
    }
    if (!strcmp(cmd, "step")) return cmd_step(argc, argv);
    if (argc < 6) return 2;
    int kind = kind_of(argv[2]);
    const float *code = glm_q8_map(kind);
    size_t n = strtoull(argv[3], NULL, 10), nb = glm_q8_blocks(n);
    if (!strcmp(cmd, "search")) {
        float *x = read_all(argv[4], n * 4);
        uint8_t *q = glm_malloc(n ? n : 1);
        for (size_t j = 0; j < n; j++) q[j] = glm_q8_search(code, kind == GLM_Q8_SIGNED, x[j]);
        write_all(argv[5], q, n);
        free(x); free(q);
    } else if (!strcmp(cmd, "encode") && argc == 7) {
        float *x = read_all(argv[4], n * 4), *a = read_all(argv[5], n * 4);
        uint8_t *q = glm_malloc(n ? n : 1);
        for (size_t j = 0; j < n; j++) q[j] = glm_q8_encode(code, kind, x[j], a[j]);
        write_all(argv[6], q, n);
        free(x); free(a); free(q);
    } else if (!strcmp(cmd, "qstate") && argc == 7) {
        float *x = read_all(argv[4], n * 4), *a = glm_malloc(nb * 4 + 4);
        uint8_t *q = glm_malloc(n ? n : 1);
        glm_q8_quantize_state(kind, q, a, x, n);
        write_all(argv[5], q, n);
        write_all(argv[6], a, nb * 4);
        free(x); free(a); free(q);
    } else if (!strcmp(cmd, "dqstate") && argc == 7) {
        uint8_t *q = read_all(argv[4], n);
        float *a = read_all(argv[5], nb * 4), *x = glm_malloc(n * 4 + 4);
        glm_q8_dequantize_state(kind, x, q, a, n);
        write_all(argv[6], x, n * 4);
        free(x); free(a); free(q);
    } else return 2;
    return 0;
}
