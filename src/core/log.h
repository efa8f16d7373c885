/* Logging: messages go to stderr with a level; rank-aware once data parallel exists. The only
 * state is a verbosity level the caller owns (passed in), so there are no mutable globals. */
#ifndef GLM_LOG_H
#define GLM_LOG_H
#include <stdio.h>

#define glm_info(...) do { fprintf(stderr, "[glmtrain] "); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } while (0)
#define glm_warn(...) do { fprintf(stderr, "[glmtrain] warning: "); fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } while (0)

double glm_now(void); /* monotonic seconds */

#endif
