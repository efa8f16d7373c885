/* Helper for tests/py/test_tensorboard.py.
 *   tool_tensorboard write LOGDIR   writes the fixed scalar set below, prints the event file
 *   tool_tensorboard crc HEXBYTES   prints crc32c of the bytes as 8 hex digits
 * Values: for step s in 0..39, "train/loss" = 10/(s+1), "train/lr" = s*1e-5 at step s*7,
 * and every 10th step "eval/loss" = -s/3 at step s + 2^40 (a step needing a 6-byte varint). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "io/tensorboard.h"

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "crc") == 0) {
        size_t n = strlen(argv[2]) / 2;
        unsigned char *b = malloc(n + 1);
        for (size_t i = 0; i < n; i++) sscanf(argv[2] + 2 * i, "%2hhx", &b[i]);
        printf("%08x\n", tb_crc32c(b, n));
        free(b);
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "write") != 0) {
        fprintf(stderr, "usage: tool_tensorboard write LOGDIR | crc HEXBYTES\n");
        return 2;
    }
    glm_err err;
    tb_writer *w;
    if (tb_open(&w, argv[2], &err) != 0) { glm_err_print(&err); return 1; }
    int bad = 0;
    for (int s = 0; s < 40; s++) {
        bad |= tb_scalar(w, "train/loss", 10.0f / (float)(s + 1), s);
        bad |= tb_scalar(w, "train/lr", (float)s * 1e-5f, (int64_t)s * 7);
        if (s % 10 == 0) bad |= tb_scalar(w, "eval/loss", -(float)s / 3.0f, (int64_t)s + ((int64_t)1 << 40));
    }
    printf("%s\n", tb_path(w));
    tb_close(w);
    return bad ? 1 : 0;
}
