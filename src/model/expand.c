#include "model/expand.h"
#include <stdlib.h>
#include <string.h>
#include "model/config.h"
#include "model/tensors.h"

int glm_expand_source(int l, int L, int n, int *added) {
    int split = L / n, g = l / (split + 1), r = l % (split + 1);
    *added = r == split;
    return g * split + (r < split ? r : split - 1);
}

typedef struct expand_ctx {
    glm_ckpt ck;
    glm_table src;  /* the source model's rows, whose names are read */
    int L, n;
} expand_ctx;

/* The output projections a new block has zeroed: what makes it pass its input through. */
static int zeroed(glm_tkind k) { return k == T_DENSE_W || k == T_DENSE_B || k == T_FC2_W || k == T_FC2_B; }

static int read_expanded(void *ctx, const char *name, const glm_tensor *t, float *dst, glm_err *err) {
    expand_ctx *x = ctx;
    if (!t || t->layer < 0) return glm_ckpt_reader(&x->ck, name, t, dst, err);
    int added, from = glm_expand_source(t->layer, x->L, x->n, &added);
    if (added && zeroed(t->kind)) {
        memset(dst, 0, t->numel * sizeof(float));
        return 0;
    }
    const glm_tensor *s = glm_table_get(&x->src, from, t->kind);
    if (!s) return glm_fail(err, "layer %d's %s has no source row in layer %d", t->layer, t->name, from);
    return glm_ckpt_reader(&x->ck, s->name, s, dst, err);
}

int glm_ckpt_expand(const char *from, int n, const char *dir, const glm_export_opts *o, glm_err *err) {
    glm_config c;
    if (glm_config_load(&c, from, err)) return -1;
    if (c.family == GLM_FAMILY_GLM)
        return glm_fail(err, "%s is a ChatGLM-6B (GLM v1) model: its block adds the normalised input scaled by "
                        "sqrt(2 x num_layers), so no added block can pass its input through, and more layers change "
                        "every layer's scale", from),
               glm_hint(err, "LLaMA Pro's expansion keeps the function of pre-norm blocks: ChatGLM2/3-6B and GLM-4-9B; "
                             "for ChatGLM-6B train some layers with --finetuning_type freeze instead");
    if (c.quant != GLM_Q_NONE)
        return glm_fail(err, "%s holds quantized weights (quantization_bit %d): the copies would be of rounded weights",
                        from, glm_qtype_bits((glm_qtype)c.quant)),
               glm_hint(err, "expand the float model, then quantize it (glmtrain quantize) or train on it with --quantization_bit");
    if (n < 1 || c.num_layers % n != 0)
        return glm_fail(err, "--num_expand %d: the model has %d layers, which must divide into %d equal groups", n,
                        c.num_layers, n < 1 ? 1 : n),
               glm_hint(err, "LLaMA Pro's paper adds 8 blocks to LLaMA-2's 32; a divisor of %d here", c.num_layers);
    expand_ctx x = {.L = c.num_layers, .n = n};
    glm_table_build(&x.src, &c);
    if (glm_ckpt_open(&x.ck, from, err)) { glm_table_free(&x.src); return -1; }
    glm_config e = c;
    e.num_layers = c.num_layers + n;
    int rc = glm_export_from(&e, read_expanded, NULL, &x, from, dir, o, err);
    glm_ckpt_close(&x.ck);
    glm_table_free(&x.src);
    return rc;
}
