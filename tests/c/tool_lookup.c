/* Test driver for prompt lookup's draft (infer/generate.h glm_prompt_lookup), so that
 * tests/py/test_prompt_lookup.py can hold it against Hugging Face's PromptLookupCandidateGenerator.
 * Each input line: "max_ngram max_draft end id id ..." (end: one end token id, -1 for none);
 * each output line: the draft's ids, space-separated (empty for none). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "infer/generate.h"

int main(void) {
    static char line[1 << 16];
    int32_t ids[4096], draft[4096];
    while (fgets(line, sizeof line, stdin)) {
        char *p = line, *q;
        long v[3];
        for (int i = 0; i < 3; i++) { v[i] = strtol(p, &q, 10); p = q; }
        int n = 0;
        for (long x = strtol(p, &q, 10); q != p && n < 4096; x = strtol(p, &q, 10)) { ids[n++] = (int32_t)x; p = q; }
        int32_t end = (int32_t)v[2];
        int na = n / 2; /* the text in two parts, as a prompt and an answer */
        int k = glm_prompt_lookup(ids, na, ids + na, n - na, (int)v[0], (int)v[1], &end, end >= 0, draft);
        for (int i = 0; i < k; i++) printf(i ? " %d" : "%d", draft[i]);
        printf("\n");
    }
    return 0;
}
