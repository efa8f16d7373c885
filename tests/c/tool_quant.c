/* Test tool: the host quantizers of backend/quant.h on raw files, for the PyTorch references
 * (tests/py/test_quant_ref.py).
 *   tool_quant quant int8|int4|nf4 OC C in.f32 out.bin   quantize a float32 [OC, C] matrix
 *   tool_quant deq   int8|int4|nf4 OC C in.bin out.f32   the weights back as float32
 *   tool_quant layout int8|int4|nf4 OC C                 the byte offsets, as JSON */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/quant.h"
#include "core/err.h"

static glm_qtype parse_type(const char *s) {
    if (!strcmp(s, "int8")) return GLM_Q_INT8;
    if (!strcmp(s, "int4")) return GLM_Q_INT4;
    if (!strcmp(s, "nf4")) return GLM_Q_NF4;
    fprintf(stderr, "unknown type %s\n", s);
    exit(2);
}

static void *read_all(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(1); }
    void *p = glm_malloc(want ? want : 1);
    if (fread(p, 1, want, f) != want) { fprintf(stderr, "%s: short file\n", path); exit(1); }
    fclose(f);
    return p;
}

static void write_all(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) { perror(path); exit(1); }
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: see the file's comment\n"); return 2; }
    glm_qtype t = parse_type(argv[2]);
    size_t OC = strtoull(argv[3], NULL, 10), C = strtoull(argv[4], NULL, 10);
    glm_qlayout L = glm_qlayout_of(t, OC, C);
    if (!strcmp(argv[1], "layout")) {
        printf("{\"q\": %zu, \"q_bytes\": %zu, \"scale\": %zu, \"qa\": %zu, \"absmax2\": %zu, \"offset\": %zu, "
               "\"nb\": %zu, \"nb2\": %zu, \"bytes\": %zu}\n", L.q, L.q_bytes, L.scale, L.qa, L.absmax2, L.offset,
               L.nb, L.nb2, L.bytes);
        return 0;
    }
    if (argc < 7) return 2;
    if (!strcmp(argv[1], "quant")) {
        float *w = read_all(argv[5], OC * C * sizeof(float));
        void *q = glm_malloc(L.bytes);
        glm_quantize(t, q, w, OC, C);
        write_all(argv[6], q, L.bytes);
        free(q); free(w);
    } else if (!strcmp(argv[1], "deq")) {
        void *q = read_all(argv[5], L.bytes);
        float *w = glm_malloc(OC * C * sizeof(float));
        glm_dequantize(t, w, q, OC, C);
        write_all(argv[6], w, OC * C * sizeof(float));
        free(q); free(w);
    } else return 2;
    return 0;
}
