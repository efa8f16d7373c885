/* What a free KV-cache slot still holds (serve/prefix_cache.h). */
#include "serve/prefix_cache.h"
#include <stdlib.h>
#include <string.h>
#include "core/err.h"

void srv_prefix_init(srv_prefix_cache *pc, int nslots, int Tmax, int on) {
    memset(pc, 0, sizeof *pc);
    pc->on = on;
    pc->nslots = nslots;
    pc->Tmax = Tmax;
    if (!on) return;
    pc->ids = glm_malloc(sizeof(int32_t) * (size_t)nslots * (size_t)Tmax);
    pc->n = glm_calloc((size_t)nslots, sizeof(int));
    pc->adapter = glm_calloc((size_t)nslots, sizeof(int));
    pc->stamp = glm_calloc((size_t)nslots, sizeof(long));
}

void srv_prefix_free(srv_prefix_cache *pc) {
    free(pc->ids);
    free(pc->n);
    free(pc->adapter);
    free(pc->stamp);
    memset(pc, 0, sizeof *pc);
}

void srv_prefix_keep(srv_prefix_cache *pc, int s, int adapter, const int32_t *a, int na, const int32_t *b, int n) {
    if (!pc->on) return;
    if (n > pc->Tmax - 1) n = pc->Tmax - 1; /* an idle row of a decode writes its row n */
    if (n < SRV_PREFIX_MIN) n = 0;
    int32_t *dst = pc->ids + (size_t)s * pc->Tmax;
    int first = n < na ? n : na;
    memcpy(dst, a, sizeof(int32_t) * (size_t)first);
    if (n > first) memcpy(dst + first, b, sizeof(int32_t) * (size_t)(n - first));
    pc->n[s] = n;
    pc->adapter[s] = adapter;
    pc->stamp[s] = ++pc->clock;
}

void srv_prefix_drop(srv_prefix_cache *pc, int s) {
    if (pc->on) pc->n[s] = 0;
}

int srv_prefix_match(const srv_prefix_cache *pc, int s, int adapter, const int32_t *ids, int n) {
    if (!pc->on || pc->n[s] == 0 || pc->adapter[s] != adapter) return 0;
    const int32_t *kept = pc->ids + (size_t)s * pc->Tmax;
    int lim = pc->n[s] < n - 1 ? pc->n[s] : n - 1, k = 0;
    while (k < lim && kept[k] == ids[k]) k++;
    return k >= SRV_PREFIX_MIN ? k : 0;
}

void srv_prefix_order(const srv_prefix_cache *pc, int *slots, int n) {
    if (!pc->on) return;
    for (int i = 1; i < n; i++) { /* insertion sort by (stamp of what is kept, slot): a few slots */
        int s = slots[i], j = i;
        long key = pc->n[s] ? pc->stamp[s] : 0;
        while (j > 0) {
            int t = slots[j - 1];
            long kt = pc->n[t] ? pc->stamp[t] : 0;
            if (kt < key || (kt == key && t < s)) break;
            slots[j] = t;
            j--;
        }
        slots[j] = s;
    }
}
