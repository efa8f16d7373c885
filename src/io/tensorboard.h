/* TensorBoard event files written from C: events.out.tfevents.<unix seconds>.<host>.<pid> under a
 * log dir (a ".N" suffix when that name is taken),
 * TFRecord framing (u64 length, masked crc32c of length, data, masked crc32c of data) around
 * hand-encoded tensorflow.Event protobufs (file_version first, then scalar summaries). */
#ifndef GLM_TENSORBOARD_H
#define GLM_TENSORBOARD_H
#include <stddef.h>
#include <stdint.h>
#include "core/err.h"

typedef struct tb_writer tb_writer;
int tb_open(tb_writer **out, const char *logdir, glm_err *err);  /* creates logdir */
int tb_scalar(tb_writer *w, const char *tag, float value, int64_t step); /* 0 ok, -1 write failed */
int tb_flush(tb_writer *w);
void tb_close(tb_writer *w);
uint32_t tb_crc32c(const void *data, size_t n); /* exported for tests */
const char *tb_path(const tb_writer *w);         /* the event file being written */

#endif
