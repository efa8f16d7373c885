/* data/thought.c: LLaMA-Factory's remove_thought (re.sub("<think>(.*?)</think>", "", s, DOTALL)
 * then lstrip("\n"), the expected strings worked out by hand from that definition), and the
 * split of a response into thought and answer, whole and as a stream: fed one byte at a time, each
 * field only grows, and ends as the whole text's split. */
#include <stdlib.h>
#include <string.h>
#include "data/thought.h"
#include "test.h"

static void check_remove(test_counts *tc, const char *name, const char *in, const char *want) {
    char *got = glm_thought_remove(in);
    TEST_CHECK(tc, name, strcmp(got, want) == 0, "\"%s\" -> \"%s\", want \"%s\"", in, got, want);
    free(got);
}

static int same(const char *p, size_t n, const char *want) {
    return want ? p && n == strlen(want) && memcmp(p, want, n) == 0 : n == 0;
}

static void check_split(test_counts *tc, const char *name, const char *in, const char *thought, const char *answer) {
    size_t n = strlen(in);
    glm_thought_parts w;
    glm_thought_split(in, n, 1, &w);
    int ok = same(w.thought, w.n_thought, thought) && same(w.answer, w.n_answer, answer);
    /* streamed: every prefix's fields are prefixes of the next one's, the final ones the whole's */
    size_t nt = 0, na = 0;
    const char *pt = NULL, *pa = NULL;
    for (size_t k = 0; k <= n && ok; k++) {
        glm_thought_parts p;
        glm_thought_split(in, k, k == n, &p);
        ok = p.n_thought >= nt && p.n_answer >= na && (!nt || (p.thought == pt)) && (!na || memcmp(p.answer, pa, na) == 0);
        if (p.n_thought) pt = p.thought;
        if (p.n_answer) pa = p.answer;
        nt = p.n_thought;
        na = p.n_answer;
    }
    ok = ok && nt == w.n_thought && na == w.n_answer;
    TEST_CHECK(tc, name, ok, "\"%s\": thought \"%.*s\" answer \"%.*s\" (stream %zu %zu)", in, (int)w.n_thought,
               w.thought ? w.thought : "", (int)w.n_answer, w.answer ? w.answer : "", nt, na);
}

int main(void) {
    test_counts tc = {0};
    check_remove(&tc, "thought_remove_one", "<think>\nhmm\n</think>\n\nanswer", "answer");
    check_remove(&tc, "thought_remove_two_and_between", "a<think>x</think>b<think>y</think>c", "abc");
    check_remove(&tc, "thought_remove_unclosed_kept", "a<think>never closed", "a<think>never closed");
    check_remove(&tc, "thought_remove_close_alone_kept", "x</think>y", "x</think>y");
    check_remove(&tc, "thought_remove_lazy", "<think>a</think>b</think>c", "b</think>c");
    check_remove(&tc, "thought_remove_front_newlines_only", "\n\n  text\n", "  text\n");
    check_remove(&tc, "thought_remove_empty", "", "");
    TEST_CHECK(&tc, "thought_has_words", glm_thought_has_words("a</think>") && glm_thought_has_words("<think>") &&
                                            !glm_thought_has_words("<thin k>"), "tags");
    check_split(&tc, "thought_split_both", "\n<think>\n想一想\n</think>\n\n答案", "\n想一想\n", "答案");
    check_split(&tc, "thought_split_empty_thought", "<think>\n\n</think>\n\n\nA", "\n\n", "A");
    check_split(&tc, "thought_split_no_thought", "\n直接回答", NULL, "直接回答");
    check_split(&tc, "thought_split_unclosed", "<think>still thinking </thi", "still thinking </thi", NULL);
    check_split(&tc, "thought_split_answer_like_tag", "<thinking> is a word", NULL, "<thinking> is a word");
    check_split(&tc, "thought_split_less_than", "<", NULL, "<");
    check_split(&tc, "thought_split_blank", " \n", NULL, NULL);
    TEST_EXIT(&tc);
}
