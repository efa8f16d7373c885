/* Data parallelism's gradient exchange between the GPUs of one node by their copy engines
 * (ZeRO 0 and 1, one pipeline stage).
 *
 * Why: an NCCL reduce-scatter running beside backward holds SMs, and the GEMMs it shares the
 * GPU with lose more than it saves (bench/overlap_probe.cu: +10-15 ms per 12.4 GB beside
 * backward-shaped GEMMs), while a copy engine moves the same bytes with no SM (+0-4 ms). So here
 * each rank copies, as backward finishes each bucket, every other rank's piece of it straight
 * into that rank's landing buffer (memory mapped across processes by CUDA IPC), and after
 * backward each rank adds what landed into its own pieces: the reduce half of a reduce-scatter,
 * done once, off the backward's critical path. The all-gathers that follow (ZeRO-0: the summed
 * gradients, bucket by bucket under AdamW; ZeRO-1: the updated parameters, piece by piece) are
 * copies too, into the peers' gradient and parameter buffers.
 *
 * Handshakes are stream memory operations (cuStreamWriteValue32 / cuStreamWaitValue32: done by
 * the GPU's front end, no SM, no host) on 32-bit flags in each rank's flag block, each written by
 * one peer only:
 *   arrived[q]   sender q's landing copies of bucket i at step t are done ((t-1)*nb + i + 1)
 *   consumed[q]  receiver q has read what this rank put in its landing    (value t)
 *   gathered[q]  ZeRO-0: buckets of summed gradients q has put here       ((t-1)*nb + k + 1)
 *                ZeRO-1: q's updated parameters for step t are all here   (value t)
 * A sender's first landing copy of step t waits for consumed >= t-1; a rank's adds wait for
 * arrived >= t, which also means each peer has finished backward t, so a rank may overwrite the
 * peer's copy of its own parameter pieces only after that. A dead peer leaves a stream waiting:
 * the host polls an event against --ddp_timeout and names the ranks whose flags lag.
 *
 * Chosen for 2 ranks (the count measured; GLMTRAIN_DP_PEER=1 allows up to 16, =0 keeps NCCL)
 * when both are GPUs of this node (the launcher's local world is the whole group) with P2P
 * access, and the landing buffer leaves the memory forward/backward will need (all ranks agree,
 * or all keep NCCL). GLMTRAIN_DP_PEER_AG=0 keeps the all-gathers on NCCL;
 * GLMTRAIN_DP_PEER_EARLY_ADD=0 sums everything in one pass after the last copy. */
#include "parallel/dp/dp.h"
#ifdef GLM_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "backend/cuda/cuda_backend.h"
#include "core/log.h"
#include "parallel/comm/signals.h"

typedef CUresult (*wait32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*write32_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*range_fn)(CUdeviceptr *, size_t *, CUdeviceptr);

enum { BUF_LAND, BUF_GRADS, BUF_PARAMS, NBUF };
enum { FLAG_BYTES = 4096 };

struct glm_dp_peer {
    int rank, world, nb;
    size_t shard, es;
    cudaStream_t compute, copy; /* copy: copy-engine work and flag writes only */
    cudaEvent_t ev, done;
    char *base;                 /* [FLAG_BYTES + (world-1) * shard * es] this rank's flags, then its landing */
    char *peer[NBUF][16];       /* [buffer][rank] the peers' buffers, mapped here (NULL for this rank) */
    void *map[NBUF][16];        /* [buffer][rank] what cudaIpcOpenMemHandle returned (closed at the end) */
    unsigned *hflags;           /* pinned: a copy of the flags, read when a wait times out */
    unsigned t;                 /* steps exchanged so far */
    double sumsq;               /* of this rank's summed pieces, from the adds */
    glm_span *mine;             /* [nb] this rank's piece of each bucket (flat ranges) */
    size_t *off;                /* [nb] where each piece sits in the shard, so in each landing slot */
    int begun, ag;              /* this step's first landing copy is queued; all-gathers by copies */
    int early_add;              /* two add passes: earlier batches, then the last (GLMTRAIN_DP_PEER_EARLY_ADD=0: one) */
    wait32_fn wait32;
    write32_fn write32;
};

static unsigned *flag_at(char *blk, int kind, int q, int world) { return (unsigned *)blk + kind * world + q; }
enum { F_ARRIVED, F_CONSUMED, F_GATHERED };

static void wait_flag(glm_dp_peer *p, cudaStream_t s, int kind, int q, unsigned v) {
    p->wait32((CUstream)s, (CUdeviceptr)flag_at(p->base, kind, q, p->world), v, CU_STREAM_WAIT_VALUE_GEQ);
}
/* sets flag `kind` of this rank inside peer r's block */
static void put_flag(glm_dp_peer *p, cudaStream_t s, int r, int kind, unsigned v) {
    p->write32((CUstream)s, (CUdeviceptr)flag_at(p->peer[BUF_LAND][r], kind, p->rank, p->world), v,
               CU_STREAM_WRITE_VALUE_DEFAULT); /* default: a system-wide fence orders the copies before it */
}
static size_t slot_of(int sender, int receiver) { return (size_t)(sender < receiver ? sender : sender - 1); }

/* ---------------------------------------------------------------- setup */

typedef struct peer_card { /* what each rank tells the others */
    char host[64];
    int device;
    int ok;
    cudaIpcMemHandle_t h[NBUF];
    size_t off[NBUF];     /* the buffer's offset inside the allocation the handle maps */
} peer_card;

static int want(const char *name) {
    const char *e = getenv(name);
    return !(e && strcmp(e, "0") == 0);
}

/* The allocation holding p, as a handle and p's offset in it. */
static int export_buf(range_fn range, void *p, cudaIpcMemHandle_t *h, size_t *off) {
    CUdeviceptr b = 0;
    size_t sz = 0;
    if (range(&b, &sz, (CUdeviceptr)p) != CUDA_SUCCESS) return -1;
    *off = (size_t)((CUdeviceptr)p - b);
    return cudaIpcGetMemHandle(h, (void *)b) == cudaSuccess ? 0 : -1;
}

/* Every rank's card, through the group's communicator (a device buffer, as NCCL wants). */
static int swap_cards(glm_dp *dp, const peer_card *mine, peer_card *all, glm_err *err) {
    size_t words = (sizeof *mine + 7) / 8;
    void *d = NULL;
    if (cudaMalloc(&d, words * 8 * (size_t)dp->world) != cudaSuccess) return glm_fail(err, "rank %d: cannot allocate the P2P card buffer", dp->rank);
    char *h = glm_calloc((size_t)dp->world, words * 8);
    memcpy(h + (size_t)dp->rank * words * 8, mine, sizeof *mine);
    cudaMemcpy(d, h, words * 8 * (size_t)dp->world, cudaMemcpyHostToDevice);
    int rc = dp->comm->allgather(dp->comm, d, words, GLM_C_F64, "P2P buffer handles", err) || dp->comm->wait(dp->comm, -1, err);
    if (rc == 0) {
        cudaMemcpy(h, d, words * 8 * (size_t)dp->world, cudaMemcpyDeviceToHost);
        for (int r = 0; r < dp->world; r++) memcpy(&all[r], h + (size_t)r * words * 8, sizeof *all);
    }
    free(h);
    cudaFree(d);
    return rc ? -1 : 0;
}

void glm_dp_peer_free(glm_dp *dp) {
    glm_dp_peer *p = dp->peer;
    if (!p) return;
    for (int b = 0; b < NBUF; b++)
        for (int r = 0; r < p->world; r++)
            if (p->map[b][r]) cudaIpcCloseMemHandle(p->map[b][r]);
    if (p->copy) cudaStreamDestroy(p->copy);
    if (p->ev) cudaEventDestroy(p->ev);
    if (p->done) cudaEventDestroy(p->done);
    if (p->hflags) cudaFreeHost(p->hflags);
    if (p->base) cudaFree(p->base);
    free(p->mine);
    free(p->off);
    free(p);
    dp->peer = NULL;
}

int glm_dp_peer_open(glm_dp *dp, glm_err *err) {
    glm_model *m = dp->m;
    /* one node: the launcher says so (a "two nodes" test on one machine keeps NCCL's network path) */
    if (!glm_dp_peer_ranks(strcmp(dp->comm->kind, "nccl") == 0, dp->world, dp->cfg.zero_stage, dp->dist.local_world >= dp->world,
                           m->first && m->last, m->cfg.peft.galore_rank > 0))
        return 0;
    glm_dp_peer *p = glm_calloc(1, sizeof *p);
    p->rank = dp->rank;
    p->world = dp->world;
    p->nb = dp->nb;
    p->shard = dp->shard;
    p->es = glm_cdtype_size(dp->gdt);
    p->compute = (cudaStream_t)glm_cuda_stream(m->be);
    p->mine = glm_malloc(sizeof *p->mine * (size_t)dp->nb);
    p->off = glm_malloc(sizeof *p->off * (size_t)dp->nb);
    for (int i = 0; i < dp->nb; i++) p->mine[i].n = glm_dp_piece(dp, dp->rank, i, &p->mine[i].lo, &p->off[i]);
    p->ag = want("GLMTRAIN_DP_PEER_AG");
    p->early_add = want("GLMTRAIN_DP_PEER_EARLY_ADD");
    peer_card mine = {0}, *all = glm_calloc((size_t)dp->world, sizeof *all);
    gethostname(mine.host, sizeof mine.host - 1);
    cudaGetDevice(&mine.device);
    range_fn range = NULL;
    enum cudaDriverEntryPointQueryResult q1, q2, q3;
    int ok = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", (void **)&p->wait32, 12000, cudaEnableDefault, &q1) == cudaSuccess &&
             cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", (void **)&p->write32, 12000, cudaEnableDefault, &q2) == cudaSuccess &&
             cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", (void **)&range, 12000, cudaEnableDefault, &q3) == cudaSuccess &&
             p->wait32 && p->write32 && range;
    size_t land = FLAG_BYTES + (size_t)(dp->world - 1) * dp->shard * p->es;
    ok = ok && cudaMalloc((void **)&p->base, land) == cudaSuccess && cudaMemset(p->base, 0, FLAG_BYTES) == cudaSuccess &&
         cudaDeviceSynchronize() == cudaSuccess && /* zero flags before any stream of ours reads them */
         cudaMallocHost((void **)&p->hflags, FLAG_BYTES) == cudaSuccess &&
         cudaStreamCreateWithFlags(&p->copy, cudaStreamNonBlocking) == cudaSuccess &&
         cudaEventCreateWithFlags(&p->ev, cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming) == cudaSuccess;
    /* the landing buffer must leave what forward and backward will allocate */
    size_t fr = 0, tot = 0;
    int roomy = ok && cudaMemGetInfo(&fr, &tot) == cudaSuccess && (double)fr >= dp->cfg.reserve_bytes + 1073741824.0;
    if (ok && !roomy)
        glm_info("data parallel: %.2f GiB free after the P2P landing buffer, %.2f GiB needed for activations", fr / 1073741824.0,
                 dp->cfg.reserve_bytes / 1073741824.0);
    ok = ok && roomy;
    void *bufs[NBUF] = {p->base, m->grads, m->params};
    for (int b = 0; b < NBUF && ok; b++) ok = export_buf(range, bufs[b], &mine.h[b], &mine.off[b]) == 0;
    /* the flag operations work on this device (a write and a wait on our own block) */
    if (ok) {
        p->write32((CUstream)p->copy, (CUdeviceptr)p->base, 0, CU_STREAM_WRITE_VALUE_DEFAULT);
        p->wait32((CUstream)p->copy, (CUdeviceptr)p->base, 0, CU_STREAM_WAIT_VALUE_GEQ);
        ok = cudaStreamSynchronize(p->copy) == cudaSuccess;
    }
    cudaGetLastError();
    mine.ok = ok;
    dp->peer = p; /* freed on every way out below that keeps NCCL */
    if (swap_cards(dp, &mine, all, err)) { free(all); glm_dp_peer_free(dp); return -1; }
    const char *why = NULL;
    for (int r = 0; r < dp->world && !why; r++) {
        if (!all[r].ok) why = "a rank lacks the memory for the landing buffer or cannot use CUDA IPC / stream memory operations";
        else if (strcmp(all[r].host, mine.host) != 0) why = "the ranks are on more than one node";
        else if (r != dp->rank) {
            int can = 0;
            cudaDeviceCanAccessPeer(&can, mine.device, all[r].device);
            if (!can) why = "two GPUs of the group have no P2P access";
        }
    }
    /* map the peers' buffers; every rank must succeed, or all keep NCCL */
    for (int r = 0; r < dp->world && !why; r++) {
        if (r == dp->rank) continue;
        for (int b = 0; b < NBUF; b++) {
            void *h = NULL;
            for (int a = 0; a < b && !h; a++) /* one allocation may hold two buffers: map it once */
                if (!memcmp(&all[r].h[a], &all[r].h[b], sizeof all[r].h[b])) h = p->peer[a][r] - all[r].off[a];
            if (!h) {
                if (cudaIpcOpenMemHandle(&h, all[r].h[b], cudaIpcMemLazyEnablePeerAccess) != cudaSuccess) { why = "cudaIpcOpenMemHandle failed"; break; }
                p->map[b][r] = h;
            }
            p->peer[b][r] = (char *)h + all[r].off[b];
        }
    }
    cudaGetLastError();
    double v = why ? 1 : 0;
    if (dp->comm->sum_host(dp->comm, &v, 1, -1, "P2P set-up", err)) { free(all); glm_dp_peer_free(dp); return -1; }
    free(all);
    if (v > 0) {
        glm_info("data parallel: gradients through NCCL (%s)", why ? why : "another rank cannot map its peers' memory");
        glm_dp_peer_free(dp);
        return 0;
    }
    glm_info("data parallel: gradients between GPUs by copy engines (P2P), landing buffer %.2f GiB%s", land / 1073741824.0,
             p->ag ? "" : "; all-gathers through NCCL");
    return 0;
}

/* ---------------------------------------------------------------- per step */

/* Work queued on `later` from now on runs after what is queued on `first` so far. */
static void order(glm_dp_peer *p, cudaStream_t first, cudaStream_t later) {
    cudaEventRecord(p->ev, first);
    cudaStreamWaitEvent(later, p->ev, 0);
}

/* Names the peers whose flag `kind` is below v (read from the device on a stream of its own,
 * since the others may be stuck), for a timeout message. */
static void lagging(glm_dp_peer *p, int kind, unsigned v, char *out, size_t cap) {
    cudaStream_t s;
    snprintf(out, cap, "peers");
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return;
    cudaMemcpyAsync(p->hflags, p->base, FLAG_BYTES, cudaMemcpyDeviceToHost, s);
    double t0 = glm_now();
    while (cudaStreamQuery(s) == cudaErrorNotReady && glm_now() - t0 < 5) usleep(1000);
    if (cudaStreamQuery(s) == cudaSuccess) {
        size_t k = (size_t)snprintf(out, cap, "rank");
        for (int q = 0; q < p->world && k < cap; q++)
            if (q != p->rank && *flag_at((char *)p->hflags, kind, q, p->world) < v)
                k += (size_t)snprintf(out + k, cap - k, "%s %d", k > 4 ? "," : "", q);
        if (k <= 4) snprintf(out, cap, "peers");
    }
    cudaStreamDestroy(s);
}

/* Waits (host) for the compute stream, bounded by --ddp_timeout; a timeout names the peers
 * whose flag `kind` is still below v. */
static int finish_wait(glm_dp *dp, const char *what, int kind, unsigned v, glm_err *err) {
    glm_dp_peer *p = dp->peer;
    cudaEventRecord(p->done, p->compute);
    double t0 = glm_now(), timeout = dp->cfg.timeout;
    for (long tries = 0;; tries++) {
        cudaError_t q = cudaEventQuery(p->done);
        if (q == cudaSuccess) return 0;
        if (q != cudaErrorNotReady) {
            dp->comm->broken = 1;
            return glm_fail(err, "rank %d: P2P copies '%s' at step %ld: CUDA error %s", p->rank, what, dp->comm->step,
                            cudaGetErrorString(q));
        }
        int sig = glm_signal_pending();
        if (sig && dp->comm->interruptible) return glm_comm_fail_signal(dp->comm, "P2P copies", what, sig, err);
        double waited = glm_now() - t0;
        if (timeout > 0 && waited > timeout) {
            char who[96], w[192];
            lagging(p, kind, v, who, sizeof who);
            snprintf(w, sizeof w, "%s, from %s", what, who);
            return glm_comm_fail_timeout(dp->comm, "P2P copies", w, waited, err);
        }
        glm_comm_backoff(tries);
    }
}

void glm_dp_peer_send(glm_dp *dp, int i) {
    glm_dp_peer *p = dp->peer;
    order(p, p->compute, p->copy); /* the bucket is final once backward has passed it */
    if (!p->begun) { /* each peer has read what we put in its landing at the last step */
        for (int r = 0; r < p->world; r++)
            if (r != p->rank) wait_flag(p, p->copy, F_CONSUMED, r, p->t);
        p->begun = 1;
    }
    for (int r = 0; r < p->world; r++) {
        if (r == p->rank) continue;
        size_t lo, off, n = glm_dp_piece(dp, r, i, &lo, &off);
        char *dst = p->peer[BUF_LAND][r] + FLAG_BYTES + (slot_of(p->rank, r) * p->shard + off) * p->es;
        cudaMemcpyAsync(dst, (char *)dp->m->grads + lo * p->es, n * p->es, cudaMemcpyDeviceToDevice, p->copy);
        put_flag(p, p->copy, r, F_ARRIVED, p->t * (unsigned)p->nb + (unsigned)i + 1);
    }
}

/* Adds what the peers put in the landing buffer for buckets [i0, i1) into this rank's pieces,
 * once it is there (the compute stream waits; the host polls that with --ddp_timeout before the
 * add, whose result it waits for). Returns the sum of squares of the sums (of the last peer's
 * pass, which sees the whole sums). */
static int add_landed(glm_dp *dp, int i0, int i1, double *ssq, glm_err *err) {
    glm_dp_peer *p = dp->peer;
    glm_backend *be = dp->m->be;
    unsigned want = (p->t - 1) * (unsigned)p->nb + (unsigned)i1;
    for (int q = 0; q < p->world; q++)
        if (q != p->rank) wait_flag(p, p->compute, F_ARRIVED, q, want);
    if (finish_wait(dp, "gradients", F_ARRIVED, want, err)) return -1;
    for (int q = 0; q < p->world; q++) /* each peer's slot of the landing buffer, in rank order */
        if (q != p->rank)
            *ssq = be->add_sumsq_spans(be, dp->m->grads, p->base + FLAG_BYTES + slot_of(q, p->rank) * p->shard * p->es,
                                       p->off + i0, p->mine + i0, i1 - i0);
    return 0;
}

int glm_dp_peer_reduce(glm_dp *dp, int last_batch, glm_err *err) {
    glm_dp_peer *p = dp->peer;
    p->t++;
    p->begun = 0;
    if (p->early_add && last_batch > 0 && last_batch < p->nb) {
        /* the buckets of earlier batches are summed while the last batch (the embedding's, sent
         * when backward ends) still travels, so that sum no longer waits for it (docs/PERF.md
         * has the measured gain) */
        double a = 0, b = 0;
        if (add_landed(dp, 0, last_batch, &a, err) || add_landed(dp, last_batch, p->nb, &b, err)) return -1;
        p->sumsq = a + b;
    } else if (add_landed(dp, 0, p->nb, &p->sumsq, err)) {
        return -1;
    }
    for (int q = 0; q < p->world; q++)
        if (q != p->rank) put_flag(p, p->compute, q, F_CONSUMED, p->t);
    order(p, p->copy, p->compute); /* our gradients stay as they are until the copies have read them */
    return finish_wait(dp, "gradients", F_ARRIVED, p->t * (unsigned)p->nb, err);
}

double glm_dp_peer_sumsq(const glm_dp *dp) { return dp->peer->sumsq; }

int glm_dp_peer_gathers(const glm_dp *dp) { return dp->peer && dp->peer->ag; }

void glm_dp_peer_put(glm_dp *dp, int params, int i, unsigned v) {
    glm_dp_peer *p = dp->peer;
    order(p, p->compute, p->copy);
    if (i >= 0) {
        size_t lo, off, n = glm_dp_piece(dp, p->rank, i, &lo, &off);
        const char *src = (const char *)(params ? dp->m->params : dp->m->grads) + lo * p->es;
        for (int r = 0; r < p->world; r++)
            if (r != p->rank)
                cudaMemcpyAsync(p->peer[params ? BUF_PARAMS : BUF_GRADS][r] + lo * p->es, src, n * p->es, cudaMemcpyDeviceToDevice, p->copy);
    }
    if (v)
        for (int r = 0; r < p->world; r++)
            if (r != p->rank) put_flag(p, p->copy, r, F_GATHERED, v);
}

void glm_dp_peer_wait_gathered(glm_dp *dp, unsigned v) {
    glm_dp_peer *p = dp->peer;
    for (int q = 0; q < p->world; q++)
        if (q != p->rank) wait_flag(p, p->compute, F_GATHERED, q, v);
}

unsigned glm_dp_peer_step(const glm_dp *dp) { return dp->peer->t; }

int glm_dp_peer_end_update(glm_dp *dp, unsigned v, glm_err *err) {
    glm_dp_peer *p = dp->peer;
    order(p, p->copy, p->compute); /* what we sent is read before our buffers change again */
    return finish_wait(dp, dp->sharded ? "updated parameters" : "summed gradients", F_GATHERED, v, err);
}

#else /* no CUDA: never chosen */
int glm_dp_peer_open(glm_dp *dp, glm_err *err) { return 0; }
void glm_dp_peer_free(glm_dp *dp) {}
void glm_dp_peer_send(glm_dp *dp, int i) {}
int glm_dp_peer_reduce(glm_dp *dp, int last_batch, glm_err *err) { return 0; }
double glm_dp_peer_sumsq(const glm_dp *dp) { return 0; }
int glm_dp_peer_gathers(const glm_dp *dp) { return 0; }
void glm_dp_peer_put(glm_dp *dp, int params, int i, unsigned v) {}
void glm_dp_peer_wait_gathered(glm_dp *dp, unsigned v) {}
unsigned glm_dp_peer_step(const glm_dp *dp) { return 0; }
int glm_dp_peer_end_update(glm_dp *dp, unsigned v, glm_err *err) { return 0; }
#endif
