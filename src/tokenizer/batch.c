/* Multi-threaded batch encoding for the data pipeline. The tokenizer is read-only after loading,
 * so threads share it; each thread owns one scratch (normalisation buffer, lattice) reused across
 * its texts, which is what makes batch encoding cheaper than calling glm_tokenizer_encode in a
 * loop. Dynamic scheduling because text lengths vary wildly in real datasets. */
#include "tokenizer/spm.h"
#include <omp.h>
#include <string.h>

int glm_tokenizer_encode_batch_ex(const glm_tokenizer *t, const char **texts, const size_t *lens, int n, int flags,
                                  glm_ids *outs, int n_threads, glm_err *err) {
    if (n <= 0) return 0;
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    if (n_threads > n) n_threads = n;
    int failed = -1; /* lowest failing index */
    glm_err first = {{0}, {0}};
#pragma omp parallel num_threads(n_threads)
    {
        spm_scratch sc = {0};
        glm_err e;
#pragma omp for schedule(dynamic, 8)
        for (int i = 0; i < n; i++) {
            size_t len = lens ? lens[i] : strlen(texts[i]);
            if (glm_tok_encode_sc(t, texts[i], len, flags, &sc, &outs[i], &e)) {
#pragma omp critical(glm_tok_batch_err)
                if (failed < 0 || i < failed) { failed = i; first = e; }
            }
        }
        spm_scratch_free(&sc);
    }
    if (failed >= 0) {
        if (err) *err = first;
        return glm_wrap(err, "text %d of the batch: ", failed);
    }
    return 0;
}

int glm_tokenizer_encode_batch(const glm_tokenizer *t, const char **texts, const size_t *lens, int n, glm_ids *outs,
                               int n_threads, glm_err *err) {
    return glm_tokenizer_encode_batch_ex(t, texts, lens, n, 0, outs, n_threads, err);
}
