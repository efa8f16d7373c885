/* BLEU-4 and ROUGE-1/2/L of a response against its reference, as THUDM ChatGLM-6B's
 * ptuning/main.py compute_metrics reports them (per example, x100, then averaged):
 *
 *   BLEU-4   nltk sentence_bleu over CHARACTERS (Python list(str): every code point, spaces
 *            included), weights 0.25 each, smoothing method3 (NIST geometric: the k-th order
 *            with no match gets precision 1/(2^k * its n-gram count)), brevity penalty
 *            exp(1 - r/c) for c <= r, 0 when c = 0, and 0 when no unigram matches.
 *            This one is computed exactly as nltk does.
 *   ROUGE    rouge_chinese (a fork of pltrdy/rouge) over jieba words: ROUGE-1/2 count DISTINCT
 *            n-grams (sets), p = overlap/|hyp n-grams|, r = overlap/|ref n-grams|,
 *            f = 2pr/(p + r + 1e-8); ROUGE-L = LCS of the whole word sequences, p = lcs/|hyp|,
 *            r = lcs/|ref|, same f. (Its sentence splitting does not change these numbers.)
 *
 * The difference: there is no jieba here. Words are approximated the way jieba treats
 * everything except Chinese: a run of ASCII letters/digits is one word, whitespace separates
 * and is dropped, every other character (each CJK character, each punctuation mark) is a word
 * of its own. So ROUGE here is character-level for Chinese — it scores higher than with jieba
 * words, which can only match whole words. And where ptuning/rouge_chinese raise on an empty
 * hypothesis or reference, these return 0. */
#ifndef GLM_INFER_METRICS_H
#define GLM_INFER_METRICS_H

typedef struct glm_text_scores {
    double bleu4, rouge1, rouge2, rougel; /* each x100, like ptuning's numbers */
} glm_text_scores;

/* Scores of one (prediction, reference) pair; both NUL-terminated UTF-8 (bad bytes count as
 * one character each). */
glm_text_scores glm_text_score(const char *pred, const char *ref);

/* Running mean over examples (ptuning rounds each example's score to 4 decimals first). */
typedef struct glm_score_sum {
    glm_text_scores sum;
    long n;
} glm_score_sum;
void glm_score_add(glm_score_sum *s, const glm_text_scores *x);
glm_text_scores glm_score_mean(const glm_score_sum *s);

#endif
