/* SIGINT/SIGTERM as a flag: the training loop stops at the next step boundary (saving a
 * checkpoint with --save_on_interrupt) and collective waits give up, instead of the process
 * dying mid-write. The flag is the one piece of process-global state (async-signal safety). */
#ifndef GLM_PARALLEL_SIGNALS_H
#define GLM_PARALLEL_SIGNALS_H

/* Installs the handlers (idempotent). */
void glm_signals_install(void);
/* The signal received (SIGINT or SIGTERM), or 0. */
int glm_signal_pending(void);
/* How many have arrived. */
int glm_signal_count(void);
/* Name for messages: "SIGINT", "SIGTERM". */
const char *glm_signal_name(int sig);

#endif
