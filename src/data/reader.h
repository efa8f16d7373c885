/* Reading instruction/chat data files into plain records (strings only, nothing tokenized).
 *
 * Containers: a JSON array of objects (.json) or JSON Lines, one object per line (.jsonl, and
 * also .json files whose first character is '{', like THUDM's AdvertiseGen train.json); CSV
 * (.csv) and TSV (.tsv), a header row naming the columns, as Python's csv module (and so
 * datasets' "csv" loader) reads them: each row becomes an object of strings (an empty cell "")
 * under the header's names, so the alpaca and columns schemas apply; a row with another number
 * of fields than the header, a duplicate column name, text after a closing quote or a quote
 * left open is a bad record. Parquet and Arrow files are refused with the command that converts
 * them.
 * Schemas, each a mapping of JSON keys onto one record {system, query, input, answer, history}:
 *   alpaca    {"instruction", "input"?, "output", "history"?: [[q, a], ...], "system"?}
 *   columns   ChatGLM ptuning/main.py columns: prompt_column / response_column / history_column
 *             (defaults "prompt", "response", "history"; AdvertiseGen's "content"/"summary" is
 *             recognised automatically)
 *   sharegpt  {"conversations": [{"from": "human"|"user", "value"}, {"from": "gpt"|"assistant",
 *             "value"}, ...], "system"?}; also {"messages": [{"role", "content"}]}. The turns
 *             before the last become the history, the last user/assistant pair query/answer.
 * Auto-detection looks at the file's first character and at the keys of its first record.
 *
 * Bad input: a malformed JSON record, a record that is not an object, a missing or non-string
 * field, a broken history/conversation, invalid UTF-8 — each stops the read with
 * "file:line:column: reason", or with skip_bad_samples is skipped and counted (the first such
 * message is kept for the summary). A structurally broken array (unterminated, not an array)
 * always stops. A null prompt/answer is read as "" (ptuning/main.py then drops the example;
 * see examples.h). A UTF-8 BOM is skipped; CRLF line ends are accepted.
 *
 * Conversation mode (glm_read_cfg.conversations, set for ChatGLM3's layout): a sharegpt record
 * keeps every turn, in order, as ChatGLM3's finetune_demo reads {"conversations": [{"role":
 * "system"|"user"|"assistant"|"observation", "content": "..."}, ...]} ("messages", "from"/"value"
 * and sharegpt's role names are read too). Turns may come in any order. A system turn may carry
 * "tools" (any JSON value): its content then gets "
" + json.dumps(tools, indent=4,
 * ensure_ascii=False), as ChatGLM3's build_chat_input writes it (data/pyjson.h). With glm4 set
 * (GLM-4's chat template) the tools become a system turn of their own before it, GLM-4's tools
 * block (data/glm4_tools.h), and a turn's "metadata" string is kept (the template writes it after
 * the role; ChatGLM3's finetune_hf.py passes "" instead, so its examples leave it out). Refused as
 * bad records: an unknown role (finetune_demo's "tool" turn is not implemented there either), a
 * missing, null or non-string content, "tools" on another turn or beside "conversations" (the
 * top-level column finetune_hf.py refuses), conversations that are not a list of objects, a
 * non-string metadata. */
#ifndef GLM_DATA_READER_H
#define GLM_DATA_READER_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef enum { GLM_SCHEMA_AUTO = 0, GLM_SCHEMA_ALPACA, GLM_SCHEMA_COLUMNS, GLM_SCHEMA_SHAREGPT } glm_schema;
typedef enum { GLM_CONTAINER_AUTO = 0, GLM_CONTAINER_ARRAY, GLM_CONTAINER_LINES, GLM_CONTAINER_CSV, GLM_CONTAINER_TSV } glm_container;

/* Column names for GLM_SCHEMA_COLUMNS (NULL = default/none). A history column named here is
 * "present" for every record (a missing value reads as an empty history), as in ptuning. */
typedef struct glm_columns {
    const char *prompt, *response, *history, *input, *system;
    const char *kto_tag; /* --stage kto's tag column (NULL: "kto_tag", or "label") */
} glm_columns;

typedef struct glm_read_cfg {
    glm_schema schema;
    glm_container container;
    glm_columns columns;
    int skip_bad_samples;
    int conversations;   /* conversation mode (see above): ChatGLM3's layout */
    int glm4;            /* conversation mode with GLM-4's tools block (see above) */
    int64_t max_records; /* > 0: the file ends after this many records, bad ones counted (the
                          * first N rows, as ptuning's max_train_samples selects them) */
    int pairs;           /* preference pairs (--stage dpo): every record has a "chosen" and a
                          * "rejected" answer (see glm_record.rejected) */
    int texts;           /* plain texts (--stage pt): every record's "text" (or columns.prompt) is its
                          * query; nothing else is read */
    int kto;             /* --stage kto: every record also has a true/false "kto_tag" (or "label", as
                          * LLaMA-Factory's kto_en_demo names it): its answer is desirable or not
                          * (glm_record.kto_tag) */
} glm_read_cfg;

/* One turn of a conversation-mode record. */
typedef enum { GLM_ROLE_SYSTEM = 0, GLM_ROLE_USER, GLM_ROLE_ASSISTANT, GLM_ROLE_OBSERVATION } glm_role;
typedef struct glm_msg {
    glm_role role;
    char *content;   /* owned; a system turn's tools dump already appended */
    char *metadata;  /* owned; the turn's "metadata" (NULL: none) */
    int tools;       /* while reading: 1 + this turn's index in the record's list when its
                      * "tools" are still to be appended (reader_json.c), else 0 */
    int src;         /* its index in the record's list; -1 for a turn the reader made (a
                      * record-level "system", GLM-4's tools block) */
} glm_msg;

/* One record. Strings are owned (glm_record_free); absent optional fields are NULL. */
typedef struct glm_record {
    char *system;     /* system prompt or NULL */
    char *query;      /* the instruction / prompt / last user turn ("" when null) */
    char *input;      /* alpaca "input" or NULL */
    char *answer;     /* the response ("" when null); of a preference pair, the chosen one */
    char *rejected;   /* a preference pair's rejected response (glm_read_cfg.pairs), else NULL.
                       * LLaMA-Factory's ranking records: alpaca {"instruction", "input"?,
                       * "chosen", "rejected", ...} (strings), sharegpt {"conversations" (ending
                       * with a user turn), "chosen", "rejected"} (assistant messages
                       * {"from"/"role", "value"/"content"}, or strings); the chosen answer
                       * becomes the conversation's last turn */
    int kto_tag;      /* glm_read_cfg.kto: 1 desirable, 0 undesirable; else -1 */
    char **hist;      /* 2*n_hist strings: q0, r0, q1, r1, ... */
    int n_hist;
    int has_history;  /* the record has a history column (ptuning wraps rounds even when empty) */
    glm_msg *msgs;    /* conversation mode, sharegpt records: every turn (n_msgs); else NULL */
    int n_msgs;
    const char *conv_key; /* the record's "conversations" or "messages" (static text) */
    int64_t index;    /* 0-based record number in the file */
    int64_t line, col; /* where the record starts (1-based; col in characters) */
} glm_record;
void glm_record_free(glm_record *r);

/* Counts while reading (added into the data summary). */
typedef struct glm_read_stats {
    int64_t records;     /* records seen, bad ones included */
    int64_t bad_json;    /* skipped: malformed JSON */
    int64_t bad_record;  /* skipped: not an object / missing or wrong-typed field / bad UTF-8 */
    int bom;             /* the file started with a UTF-8 BOM */
    char first_bad[256]; /* "file:line:col: reason" of the first skipped record */
} glm_read_stats;

typedef struct glm_reader glm_reader;
int glm_reader_open(glm_reader **out, const char *path, const glm_read_cfg *cfg, glm_err *err);
/* 1: *rec filled (free it with glm_record_free); 0: end of file; -1: error (err names
 * file:line:col). Skipped records are counted in the stats, never returned. */
int glm_reader_next(glm_reader *r, glm_record *rec, glm_err *err);
const glm_read_stats *glm_reader_stats(const glm_reader *r);
glm_schema glm_reader_schema(const glm_reader *r);   /* as detected (after the first record) */
glm_container glm_reader_container(const glm_reader *r);
void glm_reader_close(glm_reader *r);

/* "auto", "alpaca", "columns" (alias "chatglm"), "sharegpt"; returns -1 for anything else. */
int glm_schema_parse(const char *s, glm_schema *out);
int glm_container_parse(const char *s, glm_container *out); /* "auto", "json", "jsonl", "csv", "tsv" */

/* CSV/TSV (reader_csv.c): the fields of the row at *pos (blank lines skipped), *pos moved past
 * it. 1: a row; 0: the end; -1: malformed at *bad_at (why). */
typedef struct glm_csv_fields { char **v; int n, cap; } glm_csv_fields;
int glm_csv_row(const char *buf, size_t len, size_t *pos, char delim, glm_csv_fields *out, size_t *bad_at, const char **why);
void glm_csv_fields_clear(glm_csv_fields *f);
void glm_csv_fields_free(glm_csv_fields *f);
const char *glm_schema_name(glm_schema s);

/* Used by the reader (schema.c): the keys a schema reads, resolved from glm_columns. */
struct cJSON;
typedef struct glm_keys {
    const char *prompt, *response, *input, *system, *history;
    int history_always;  /* history column configured: present for every record */
    int conversations;   /* glm_read_cfg.conversations */
    const char *rejected; /* pairs: the rejected answer's key (response is the chosen one's) */
    int texts;            /* glm_read_cfg.texts: prompt is the text's key */
    const char *kto_tag;  /* glm_read_cfg.kto: the tag's key */
} glm_keys;
/* Picks the schema from the first record's keys (cfg->schema when not AUTO) and the keys it
 * reads. Returns 0, or -1 with a message in why (the record's keys and what to set). */
int glm_schema_detect(const glm_read_cfg *cfg, const struct cJSON *obj, glm_schema *schema,
                      glm_keys *keys, char *why, size_t why_len);
/* Fills rec from one JSON value. Returns 0, or -1 with the reason in why (a bad record). */
int glm_schema_extract(glm_schema schema, const glm_keys *keys, const struct cJSON *obj,
                       glm_record *rec, char *why, size_t why_len);
/* obj[key] as ptuning/main.py's history, [[query, response], ...], into rec (hist, n_hist,
 * has_history): absent or null is none; anything but pairs of UTF-8 strings is -1 with why. */
int glm_schema_history(const struct cJSON *obj, const char *key, glm_record *rec, char *why, size_t why_len);
/* "a string", "a list", ... for messages. */
const char *glm_json_type_name(const struct cJSON *v);
/* Conversation mode's sharegpt extraction (schema_conv.c): rec->msgs from obj. 0, or -1 with why. */
int glm_schema_conversation(const struct cJSON *obj, glm_record *rec, char *why, size_t why_len);
/* Appends the tools dump of each msgs[i] marked tools, read from the record's JSON text
 * json[0..len) (glm4: puts GLM-4's tools block before it as a turn of its own). 0, or -1 with why. */
int glm_conversation_tools(glm_record *rec, const char *json, size_t len, int glm4, char *why, size_t why_len);
/* 1 when s[0..n) is valid UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
int glm_utf8_valid(const char *s, size_t n);
/* Makes s valid UTF-8 in place: each byte that begins no valid sequence becomes '?' (a message
 * cut by a length limit, or quoting a client's invalid bytes, stays readable JSON text). */
void glm_utf8_scrub(char *s);

#endif
