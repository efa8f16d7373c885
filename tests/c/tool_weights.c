/* Helper for tests/py/test_ckpt_interop.py: the model-level weights API from the command line.
 *   tool_weights load CONFIG WEIGHTS OUT.bin
 *       glm_model_init from CONFIG (config.json or its folder), glm_model_load(WEIGHTS), then
 *       writes every table tensor as float32 in table order to OUT.bin and prints one line per
 *       tensor: NAME <tab> d0,d1
 *   tool_weights export CONFIG WEIGHTS DIR F32|F16|BF16 SHARD_BYTES ORIGINAL(0|1)
 *       loads as above, then glm_model_export to DIR
 * Errors: "error: ..." (and "hint: ...") on stderr, exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/backend.h"
#include "model/ckpt.h"
#include "model/glm.h"

int main(int argc, char **argv) {
    int load = argc == 5 && !strcmp(argv[1], "load"), exp = argc == 8 && !strcmp(argv[1], "export");
    if (!load && !exp) {
        fprintf(stderr, "usage: tool_weights load CONFIG WEIGHTS OUT.bin | export CONFIG WEIGHTS DIR DTYPE SHARD_BYTES ORIGINAL\n");
        return 2;
    }
    glm_err err = {0};
    glm_config c;
    if (glm_config_load(&c, argv[2], &err)) { glm_err_print(&err); return 1; }
    glm_backend *be = glm_backend_cpu();
    glm_model m;
    glm_model_init(&m, &c, be);
    int rc = glm_model_load(&m, argv[3], &err);
    if (rc == 0 && load) {
        float *host = malloc(sizeof(float) * m.tab.total);
        glm_model_get_params(&m, host);
        FILE *f = fopen(argv[4], "wb");
        for (int i = 0; f && i < m.tab.n; i++) {
            const glm_tensor *t = &m.tab.t[i];
            fwrite(host + t->offset, sizeof(float), t->numel, f);
            printf("%s\t%lld", t->name, (long long)t->shape[0]);
            if (t->ndim > 1) printf(",%lld", (long long)t->shape[1]);
            printf("\n");
        }
        if (!f || fclose(f)) rc = glm_fail(&err, "%s: cannot write", argv[4]);
        free(host);
    } else if (rc == 0) {
        glm_export_opts o;
        glm_export_opts_init(&o);
        st_dtype d;
        if (st_dtype_parse(argv[5], &d)) { fprintf(stderr, "error: bad dtype %s\n", argv[5]); return 2; }
        o.dtype = d;
        o.max_shard_bytes = (size_t)strtoull(argv[6], NULL, 10);
        o.original_layout = atoi(argv[7]);
        o.overwrite = 1;
        rc = glm_model_export(&m, argv[4], &o, &err);
    }
    if (rc) glm_err_print(&err);
    glm_model_free(&m);
    be->destroy(be);
    return rc ? 1 : 0;
}
