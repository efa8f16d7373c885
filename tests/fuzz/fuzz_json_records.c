/* libFuzzer target: arbitrary bytes as a training data file read by data/reader_json.c and
 * data/schema.c (JSON array or JSON Lines; alpaca, prompt/response columns, sharegpt).
 * Input layout: byte 0 chooses the reader settings, the rest is the file:
 *   bits 0-1 schema (auto, alpaca, columns, sharegpt), bits 2-3 container (csv, json, jsonl,
 *   auto), bit 4 skip_bad_samples, bit 5 named columns (prompt "q", response "a", history "h",
 *   input "i", system "s", as --prompt_column ... set them), bit 6 conversation mode (ChatGLM3's
 *   role/content turns, tools dumped into the system turn).
 * The file's last byte (it stays part of the file) picks the read mode, as byte 0 has no bit left:
 * bits 0-1 = 1 preference pairs (--stage dpo: "chosen"/"rejected"), 2 texts (--stage pt), 3 KTO
 * records (--stage kto: a boolean "kto_tag" or "label"), else instruction records.
 * Every outcome must be a clean error or records whose strings are all valid UTF-8; a pair's
 * rejected answer is there exactly in pair mode, a KTO tag (0 or 1) exactly in KTO mode, where a
 * conversation ends with the assistant's turn. */
#include <string.h>
#include "data/reader.h"
#include "fuzz_util.h"

static void check_str(const char *s, int required, const char *what) {
    if (!s) { FUZZ_CHECK(!required, "%s is NULL", what); return; }
    FUZZ_CHECK(glm_utf8_valid(s, strlen(s)), "%s is not valid UTF-8", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t opt = data[0];
    glm_read_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.schema = (glm_schema)(opt & 3);
    int cont = (opt >> 2) & 3;
    cfg.container = cont == 0 ? GLM_CONTAINER_CSV : cont == 3 ? GLM_CONTAINER_AUTO : (glm_container)cont;
    cfg.skip_bad_samples = (opt >> 4) & 1;
    if (opt & 32) cfg.columns = (glm_columns){"q", "a", "h", "i", "s"};
    cfg.conversations = (opt >> 6) & 1;
    cfg.glm4 = cfg.conversations && (opt >> 7);
    int mode = size > 1 ? data[size - 1] & 3 : 0;
    cfg.pairs = mode == 1;
    cfg.texts = mode == 2;
    cfg.kto = mode == 3;
    char path[64];
    int fd = fuzz_memfile(data + 1, size - 1, path, sizeof path);
    if (fd < 0) return 0;
    glm_reader *r = NULL;
    glm_err err;
    if (glm_reader_open(&r, path, &cfg, &err) == 0) {
        glm_record rec;
        int rc;
        int64_t n = 0;
        while ((rc = glm_reader_next(r, &rec, &err)) == 1) {
            check_str(rec.query, 1, "query");
            check_str(rec.answer, 1, "answer");
            check_str(rec.system, 0, "system");
            check_str(rec.input, 0, "input");
            check_str(rec.rejected, cfg.pairs, "rejected answer");
            FUZZ_CHECK(cfg.pairs || !rec.rejected, "a rejected answer outside pair mode");
            FUZZ_CHECK(cfg.kto ? rec.kto_tag == 0 || rec.kto_tag == 1 : rec.kto_tag == -1, "kto_tag %d", rec.kto_tag);
            FUZZ_CHECK(!cfg.kto || rec.n_msgs == 0 || rec.msgs[rec.n_msgs - 1].role == GLM_ROLE_ASSISTANT,
                       "a KTO conversation not ending with the assistant");
            FUZZ_CHECK(rec.n_hist >= 0, "n_hist %d", rec.n_hist);
            for (int i = 0; i < 2 * rec.n_hist; i++) check_str(rec.hist[i], 1, "history turn");
            FUZZ_CHECK(rec.n_msgs >= 0 && (rec.n_msgs == 0 || rec.msgs), "%d turns", rec.n_msgs);
            for (int i = 0; i < rec.n_msgs; i++) {
                check_str(rec.msgs[i].content, 1, "conversation turn");
                check_str(rec.msgs[i].metadata, 0, "metadata");
                FUZZ_CHECK(rec.msgs[i].role >= 0 && rec.msgs[i].role < 4, "role %d", (int)rec.msgs[i].role);
            }
            FUZZ_CHECK(rec.index >= n && rec.line >= 1 && rec.col >= 1, "record %lld at %lld:%lld",
                       (long long)rec.index, (long long)rec.line, (long long)rec.col);
            n = rec.index + 1;
            glm_record_free(&rec);
        }
        const glm_read_stats *st = glm_reader_stats(r);
        FUZZ_CHECK(st->records >= n && st->bad_json >= 0 && st->bad_record >= 0, "stats");
        FUZZ_CHECK(memchr(st->first_bad, 0, sizeof st->first_bad) != NULL, "first_bad is not terminated");
        if (rc < 0) FUZZ_CHECK(err.msg[0], "an error without a message");
        glm_reader_close(r);
    } else {
        FUZZ_CHECK(err.msg[0], "an error without a message");
    }
    close(fd);
    return 0;
}
