/* What the point-to-point implementations share: the failure texts. */
#include "parallel/p2p.h"
#include <stdio.h>
#include "parallel/signals.h"

int glm_p2p_fail_timeout(glm_p2p *c, const char *what, int to, int from, double waited, glm_err *err) {
    c->broken = 1;
    char peers[64] = "";
    if (to >= 0 && from >= 0) snprintf(peers, sizeof peers, " (to rank %d, from rank %d)", to, from);
    else if (to >= 0) snprintf(peers, sizeof peers, " (to rank %d)", to);
    else if (from >= 0) snprintf(peers, sizeof peers, " (from rank %d)", from);
    glm_fail(err, "rank %d: pipeline %s%s at step %ld timed out after %.0f s", c->rank, what, peers, c->step, waited);
    return glm_hint(err, "a neighbouring stage died, hangs or is much slower; see its log (output_dir/logs/rank-N.log) "
                         "and raise --ddp_timeout if a slow step is expected");
}

int glm_p2p_fail_signal(glm_p2p *c, const char *what, int sig, glm_err *err) {
    c->broken = 1;
    glm_fail(err, "rank %d: pipeline %s at step %ld interrupted by %s", c->rank, what, c->step, glm_signal_name(sig));
    return glm_hint(err, "the launcher stops every rank when one exits or on Ctrl-C; look for the first failing rank");
}
