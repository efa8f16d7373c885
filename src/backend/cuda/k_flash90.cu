/* Flash attention for sm_90a (H100/H200) on warpgroup MMA (wgmma) and the bulk tensor copy
 * engine (TMA): the same contract as the mma.sync kernels of k_flash.cu (bf16/fp16, head size 64
 * or 128, per-query key ranges [lo, hi), grouped key/value views), which stay the path of every
 * other GPU. Picked at run time (cuda_backend.c) when the device is compute capability 9.0.
 *
 * A block is three warpgroups: one loads, two compute (producer / consumer); the forward's
 * grid is persistent, a block a multiprocessor taking items in turn (see "forward"). The loading
 * warpgroup gives its registers to the others (setmaxnreg) and one of its threads issues the
 * tile copies; copies and compute meet on mbarriers, so each computing warpgroup runs at its
 * own pace and the tensor cores of one overlap the softmax of the other. An mbarrier arrival
 * releases only the arriving thread's own stores, so every thread that writes a stage arrives.
 *  forward  : items of 128 queries (64 per computing warpgroup; Q in two slots, so the next
 *             item's lands during this one), 128-key tiles in two stages.
 *             S = Q K^T from shared memory (both operands K-major), online softmax in
 *             registers, O += P V with P from registers and V read N-major from the same tile.
 *  backward : one block per 128 keys (64 per warpgroup) over 64-query tiles in two stages:
 *             S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q in registers, and dS^T
 *             through shared memory into dQ += dS K, summed over key blocks in fp32 by the
 *             copy engine's bulk reductions from shared memory (then one pass writes dq);
 *             dK and dV leave the same way at the block's end, by bulk copies out of the
 *             then free Q/dout stages. Probabilities are recomputed from lse; D = rowsum(dout
 *             * out) comes precomputed.
 *
 * Shared tiles: a [ROWS][HD] tile is stored as HD/64 column blocks of [ROWS][64] elements, each
 * row 128 bytes with its 16-byte chunks XOR-swizzled by (row & 7): wgmma's 128-byte swizzle and
 * the copy engine's, so one tile serves as a K-major operand (rows = M or N) and as an MN-major
 * one (rows = K). Fragments (PTX ISA, wgmma m64nNk16): warp w of a warpgroup holds rows
 * 16w..16w+15; with g = lane/4, t = lane%4 the accumulator's d[4i + e] is (row g + 8(e/2),
 * column 8i + 2t + e%2), and an A operand from registers is mma.m16n8k16's A layout, so an
 * accumulator's 16 columns 16c.. pack into the A registers of one k-step. */
#include <cuda.h> /* CUtensorMap and its encoder's types; the encoder itself comes through the runtime */
#include "backend/cuda/flash_common.cuh"

#define FA90_MAXTILES 256 /* query tiles summarised in shared memory by dk/dv (Tq <= 16384) */

/* ---------------------------------------------------------------- wgmma wrappers */

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA90_HAVE 1
#endif

#define WG_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define WG_F16(i) WG_F4(i), WG_F4(i + 4), WG_F4(i + 8), WG_F4(i + 12)
#define WG_D32 WG_F16(0), WG_F16(16)
#define WG_D64 WG_D32, WG_F16(32), WG_F16(48)
#define WG_R32                                                                                              \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_R64                                                                                                     \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "   \
    "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "    \
    "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* d (64 x N, fp32) (+)= A (64 x 16, shared, K-major) * B (16 x N, shared, K-major) */
template <typename T, int N> __device__ __forceinline__ void wg_ss(float *d, uint64_t a, uint64_t b, int acc);
/* d (64 x N) (+)= A (64 x 16, shared, M-major) * B (16 x N, shared, N-major) */
template <typename T, int N> __device__ __forceinline__ void wg_ss_t(float *d, uint64_t a, uint64_t b, int acc);
/* d (64 x N) += A (64 x 16, registers) * B (16 x N, shared, N-major) */
template <typename T, int N> __device__ __forceinline__ void wg_rs(float *d, const uint32_t *a, uint64_t b);

#ifdef FA90_HAVE
#define WG_SS(TY, N, RSTR, DL, IA, IB, IS)                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                                           \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RSTR ", %" IA ", %" IB      \
                 ", p, 1, 1, 0, 0;\n}\n"                                                                       \
                 : DL                                                                                          \
                 : "l"(a), "l"(b), "r"(acc))
#define WG_SS_TA(TY, N, RSTR, DL, IA, IB, IS)                                                                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                                           \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RSTR ", %" IA ", %" IB      \
                 ", p, 1, 1, 1, 1;\n}\n"                                                                       \
                 : DL                                                                                          \
                 : "l"(a), "l"(b), "r"(acc))
#define WG_RS(TY, N, RSTR, DL, A0, A1, A2, A3, IB, IS)                                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IS ", 0;\n"                                           \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " RSTR ", {%" A0 ", %" A1 ", %" \
                 A2 ", %" A3 "}, %" IB ", p, 1, 1, 1;\n}\n"                                                   \
                 : DL                                                                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#else /* host pass, or a device pass without sm_90a: never launched there */
#define WG_SS(...) __trap()
#define WG_SS_TA(...) __trap()
#define WG_RS(...) __trap()
#endif

template <> __device__ __forceinline__ void wg_ss<bf16, 64>(float *d, uint64_t a, uint64_t b, int acc) {
    WG_SS("bf16", 64, WG_R32, WG_D32, "32", "33", "34");
}
template <> __device__ __forceinline__ void wg_ss<f16, 64>(float *d, uint64_t a, uint64_t b, int acc) {
    WG_SS("f16", 64, WG_R32, WG_D32, "32", "33", "34");
}
template <> __device__ __forceinline__ void wg_ss<bf16, 128>(float *d, uint64_t a, uint64_t b, int acc) {
    WG_SS("bf16", 128, WG_R64, WG_D64, "64", "65", "66");
}
template <> __device__ __forceinline__ void wg_ss<f16, 128>(float *d, uint64_t a, uint64_t b, int acc) {
    WG_SS("f16", 128, WG_R64, WG_D64, "64", "65", "66");
}
template <> __device__ __forceinline__ void wg_ss_t<bf16, 64>(float *d, uint64_t a, uint64_t b, int acc) {
    WG_SS_TA("bf16", 64, WG_R32, WG_D32, "32", "33", "34");
}
template <> __device__ __forceinline__ void wg_ss_t<f16, 64>(float *d, uint64_t a, uint64_t b, int acc) {
    WG_SS_TA("f16", 64, WG_R32, WG_D32, "32", "33", "34");
}
template <> __device__ __forceinline__ void wg_rs<bf16, 64>(float *d, const uint32_t *a, uint64_t b) {
    WG_RS("bf16", 64, WG_R32, WG_D32, "32", "33", "34", "35", "36", "37");
}
template <> __device__ __forceinline__ void wg_rs<f16, 64>(float *d, const uint32_t *a, uint64_t b) {
    WG_RS("f16", 64, WG_R32, WG_D32, "32", "33", "34", "35", "36", "37");
}
template <> __device__ __forceinline__ void wg_rs<bf16, 128>(float *d, const uint32_t *a, uint64_t b) {
    WG_RS("bf16", 128, WG_R64, WG_D64, "64", "65", "66", "67", "68", "69");
}
template <> __device__ __forceinline__ void wg_rs<f16, 128>(float *d, const uint32_t *a, uint64_t b) {
    WG_RS("f16", 128, WG_R64, WG_D64, "64", "65", "66", "67", "68", "69");
}

/* an instruction of no operands (nothing where this build has no sm_90a code) */
#ifdef FA90_HAVE
#define FA90_INSN(name, text) \
    __device__ __forceinline__ void name() { asm volatile(text "\n" ::: "memory"); }
#else
#define FA90_INSN(name, text) \
    __device__ __forceinline__ void name() {}
#endif
FA90_INSN(wg_fence, "wgmma.fence.sync.aligned;")
FA90_INSN(wg_commit, "wgmma.commit_group.sync.aligned;")
FA90_INSN(wg_wait0, "wgmma.wait_group.sync.aligned 0;")
FA90_INSN(wg_wait1, "wgmma.wait_group.sync.aligned 1;")
/* The registers of an asynchronous MMA are read only after its wait: this empty asm "writes"
 * them, so the compiler cannot move a use above the (volatile, ordered) wait. */
template <int N> __device__ __forceinline__ void fence_regs(float *d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* cp.async's shared-memory writes become visible to the tensor cores' (async proxy) reads */
__device__ __forceinline__ void fence_proxy_async() {
#ifdef FA90_HAVE
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* ---------------------------------------------------------------- tiles and descriptors */

/* byte offset of (row, 16-byte chunk) in a [ROWS][HD] tile of 2-byte elements (layout above) */
template <int ROWS> __device__ __forceinline__ uint32_t t90(int row, int chunk) {
    return (uint32_t)((chunk >> 3) * ROWS * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4));
}
/* wgmma shared-memory descriptor, 128-byte swizzle; 8-row groups 1024 bytes apart */
__device__ __forceinline__ uint64_t gdesc(uint32_t addr, uint32_t lbo) {
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
/* K-major operand: rows row0.. (a multiple of 8) of a [ROWS][HD] tile, columns 16ks..16ks+15 */
template <int ROWS> __device__ __forceinline__ uint64_t desc_k(uint32_t tile, int row0, int ks) {
    return gdesc(tile + (ks >> 2) * ROWS * 128 + row0 * 128 + (ks & 3) * 32, 16);
}
/* N-major operand: rows k0..k0+15 (the reduction) of a [ROWS][HD] tile, all HD columns; the
 * 64-column blocks lie ROWS * 128 bytes apart */
template <int ROWS> __device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int k0) {
    return gdesc(tile + k0 * 128, ROWS * 128);
}
/* the dynamic shared memory, rounded up to the 1024-byte boundary the swizzle repeats on */
__device__ __forceinline__ uint32_t smem_base1k() {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    return ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
}
/* The range summary of warps w0..w0+n-1 (wr[] in shared memory). */
__device__ __forceinline__ Range ranges_of(const Range *wr, int w0, int n) {
    Range r = wr[w0];
    for (int i = 1; i < n; i++) r = range_merge(r, wr[w0 + i]);
    return r;
}
/* 16 accumulator columns 16c.. as the A registers of one k-step */
template <typename T> __device__ __forceinline__ void acc_to_a(uint32_t *a, const float *d, int c) {
    a[0] = pack2<T>(d[8 * c + 0], d[8 * c + 1]);
    a[1] = pack2<T>(d[8 * c + 2], d[8 * c + 3]);
    a[2] = pack2<T>(d[8 * c + 4], d[8 * c + 5]);
    a[3] = pack2<T>(d[8 * c + 6], d[8 * c + 7]);
}

/* ---------------------------------------------------------------- copy engine and barriers */

/* A block is three warpgroups: warpgroup 0 loads (one thread issues the bulk tensor copies; in
 * dk/dv its first warp also stages the query rows' scalars), warpgroups 1 and 2 compute. Loads
 * and compute meet on mbarriers: full[s] completes when stage s has landed (the copies' byte
 * count), empty[s] when all 256 computing threads are done with it. */
#define FA90_NT 384
#define FA90_CONSUMERS 256

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
/* stores to shared memory at a 32-bit address (the swizzled tiles are addressed, not indexed) */
__device__ __forceinline__ void sts_b32(uint32_t at, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_f32x2(uint32_t at, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
#ifdef FA90_HAVE
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#ifdef FA90_HAVE
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
/* one arrival that also announces `bytes` still to come from copies completing on this barrier */
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
#ifdef FA90_HAVE
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
/* `bytes` still to come from copies completing on this barrier, without an arrival */
__device__ __forceinline__ void mbar_expect_bytes(uint32_t bar, uint32_t bytes) {
#ifdef FA90_HAVE
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#ifdef FA90_HAVE
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#endif
}
/* waits for the completion of the barrier's phase of this parity */
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
#ifdef FA90_HAVE
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
#endif
}
template <int R> __device__ __forceinline__ void regs_dec() {
#ifdef FA90_HAVE
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R> __device__ __forceinline__ void regs_inc() {
#ifdef FA90_HAVE
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
/* the 256 computing threads alone (barrier 0 is the whole block's) */
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(FA90_CONSUMERS) : "memory"); }
/* Bulk tensor copy of one box (64 columns x rows, 128-byte swizzle) at (col, head, row, batch). */
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap *m, int col, int head, int row, int b,
                                        uint32_t bar) {
#ifdef FA90_HAVE
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(m)), "r"(col), "r"(head), "r"(row), "r"(b), "r"(bar)
        : "memory");
#endif
}
/* Rows row0..row0+ROWS-1 of one head into a [ROWS][HD] tile (rows past the end land as zeros). */
template <int ROWS, int HD>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap *m, int head, int row0, int b, uint32_t bar) {
#pragma unroll
    for (int c = 0; c < HD / 64; c++) tma_box(dst + c * ROWS * 128, m, c * 64, head, row0, b, bar);
}

/* Bulk tensor operations from a box in shared memory (layout as tma_box) to the box at (col,
 * head, row, batch) of a tensor map, issued by one thread and done by the copy engine (rows
 * past the tensor's end are left alone):
 *   tma_reduce_add: fp32 += the box, summed in the L2 instead of a reduction instruction per
 *                   pair of elements from every thread;
 *   tma_store:      a plain copy out.
 * commit closes a group of them; wait_read returns once the issuing thread's groups have read
 * their shared memory. */
#ifdef FA90_HAVE
#define FA90_BULK_OUT(name, insn)                                                                                    \
    __device__ __forceinline__ void name(const CUtensorMap *m, uint32_t src, int col, int head, int row, int b) {      \
        asm volatile(insn " [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(reinterpret_cast<uint64_t>(m)), "r"(src), "r"(col), \
                     "r"(head), "r"(row), "r"(b)                                                                    \
                     : "memory");                                                                                   \
    }
#else
#define FA90_BULK_OUT(name, insn) \
    __device__ __forceinline__ void name(const CUtensorMap *, uint32_t, int, int, int, int) {}
#endif
FA90_BULK_OUT(tma_reduce_add, "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group")
FA90_BULK_OUT(tma_store, "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group")
FA90_INSN(bulk_commit, "cp.async.bulk.commit_group;")
FA90_INSN(bulk_wait_read, "cp.async.bulk.wait_group.read 0;")

/* ---------------------------------------------------------------- forward */

/* The forward's grid is persistent: a block per multiprocessor takes items (128 queries of one
 * head of one row) in turn, blockIdx.x, then every gridDim.x-th after it, so the loading warp
 * fetches an item's Q and first key tiles while the computing warpgroups still finish and store
 * the one before. At short sequences an item is only 2-4 key tiles, and a grid of one block an
 * item paid its first loads and last stores with nothing to overlap them (512x8 under the
 * prefix mask: 0.116 -> 0.101 ms on an H200). Items come longest first (under causal and prefix
 * masks the last query blocks see the most keys), so the tail of the schedule is the short ones.
 * The backward keeps a block an item: the same scheme there (its K and V in one buffer, the next
 * item's copied in while the finished one's dK and dV are stored) measured no faster at 512 and
 * 2-5% slower at 2048 and 8192. */
struct Item { int h, b, blk; };
__device__ __forceinline__ Item item_of(int item, int NH, int B) {
    int rest = item % (NH * B);
    return Item{rest % NH, rest / NH, item / (NH * B)};
}
/* the computing warpgroup cw's four warps alone (barrier 1 is both warpgroups', 0 the block's) */
__device__ __forceinline__ void wg_sync(int cw) {
    if (cw == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
    else asm volatile("bar.sync 3, 128;\n" ::: "memory");
}

template <typename T, int HD>
__global__ void __launch_bounds__(FA90_NT, 1)
    flash90_fwd_kernel(T *out, float *lse, const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                       const __grid_constant__ CUtensorMap tv, int kgroup, const int32_t *lo, const int32_t *hi, int B,
                       int Tq, int NH, float scale_log2) {
    constexpr int BM = 128, BN = 128, NST = 2, KS = HD / 16, NA = BN / 2, NO = HD / 2;
    constexpr uint32_t QB = BM * HD * 2, KB = BN * HD * 2;
    /* [Q x 2 (an item's and the next's)][K stages][V stages] */
    uint32_t sQ = smem_base1k(), sK = sQ + 2 * QB, sV = sK + NST * KB;
    __shared__ __align__(8) uint64_t bars[4 + 2 * NST]; /* Q landed[2], Q free[2], full[NST], empty[NST] */
    __shared__ int2 kr[2];                              /* the key range [lo, hi) of the item in Q slot s */
    __shared__ Range wr[2][8];                          /* the computing warps' row ranges, by Q slot */
    uint32_t bqf = smem_addr(&bars[0]), bqe = bqf + 16, bfull = bqf + 32, bempty = bfull + 8 * NST;
    int tid = threadIdx.x, wg = tid >> 7, ct = tid - 128, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    int nqb = (Tq + BM - 1) / BM, nitems = nqb * NH * B;
    if (tid == 0) {
        for (int i = 0; i < 2; i++) { mbar_init(bqf + 8 * i, 1); mbar_init(bqe + 8 * i, FA90_CONSUMERS); }
        for (int i = 0; i < NST; i++) { mbar_init(bfull + 8 * i, 1); mbar_init(bempty + 8 * i, FA90_CONSUMERS); }
        mbar_init_fence();
    }
    __syncthreads();
    if (wg == 0) { /* loads: one warp, its lanes summarise an item's rows, lane 0 issues the copies */
        regs_dec<24>();
        if (tid < 32) {
            int kt = 0, n = 0;
            for (int item = blockIdx.x; item < nitems; item += gridDim.x, n++) {
                Item w = item_of(item, NH, B);
                int m0 = (nqb - 1 - w.blk) * BM, slot = n & 1;
                Range A = row_range(false, 0, 0);
                for (int r = lane; r < BM; r += 32) {
                    int i = m0 + r;
                    bool in = i < Tq;
                    A = range_merge(A, row_range(in, in ? lo[w.b * Tq + i] : 0, in ? hi[w.b * Tq + i] : 0));
                }
                A = warp_range(A);
                mbar_wait(bqe + 8 * slot, ((n >> 1) & 1) ^ 1);
                if (lane == 0) {
                    kr[slot] = make_int2(A.lo, A.hi);
                    mbar_expect_tx(bqf + 8 * slot, QB); /* releases kr[slot] with the arrival */
                    tma_tile<BM, HD>(sQ + slot * QB, &tq, w.h, m0, w.b, bqf + 8 * slot);
                    for (int n0 = A.lo; n0 < A.hi; n0 += BN, kt++) {
                        int st = kt % NST;
                        mbar_wait(bempty + 8 * st, ((kt / NST) & 1) ^ 1);
                        mbar_expect_tx(bfull + 8 * st, 2 * KB);
                        tma_tile<BN, HD>(sK + st * KB, &tk, w.h / kgroup, n0, w.b, bfull + 8 * st);
                        tma_tile<BN, HD>(sV + st * KB, &tv, w.h / kgroup, n0, w.b, bfull + 8 * st);
                    }
                }
                __syncwarp();
            }
        }
        return;
    }
    regs_inc<240>();
    int cw = wg - 1, kt = 0, n = 0;
    for (int item = blockIdx.x; item < nitems; item += gridDim.x, n++) {
        Item w = item_of(item, NH, B);
        int m0 = (nqb - 1 - w.blk) * BM, slot = n & 1;
        int r0 = m0 + (ct >> 5) * 16 + g, r1 = r0 + 8; /* a computing thread's two rows */
        int lo0 = r0 < Tq ? lo[w.b * Tq + r0] : 0, hi0 = r0 < Tq ? hi[w.b * Tq + r0] : 0;
        int lo1 = r1 < Tq ? lo[w.b * Tq + r1] : 0, hi1 = r1 < Tq ? hi[w.b * Tq + r1] : 0;
        Range R = warp_range(range_merge(row_range(r0 < Tq, lo0, hi0), row_range(r1 < Tq, lo1, hi1)));
        if (lane == 0) wr[slot][ct >> 5] = R;
        wg_sync(cw); /* wr[slot] is rewritten two items on, after this warpgroup's next barrier */
        Range G = ranges_of(wr[slot], 4 * cw, 4);
        float o[NO];
#pragma unroll
        for (int i = 0; i < NO; i++) o[i] = 0.0f;
        float mx0 = -INFINITY, mx1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
        mbar_wait(bqf + 8 * slot, (n >> 1) & 1); /* always: the block may not end while its copy is in flight */
        int2 K = kr[slot];
        uint32_t cQ = sQ + slot * QB;
        for (int n0 = K.x; n0 < K.y; n0 += BN, kt++) {
            int st = kt % NST;
            uint32_t cK = sK + st * KB, cV = sV + st * KB;
            mbar_wait(bfull + 8 * st, (kt / NST) & 1);
            if (n0 < G.hi && n0 + BN > G.lo) { /* some row of this warpgroup sees a key of the tile */
                float s[NA];
                wg_fence();
#pragma unroll
                for (int ks = 0; ks < KS; ks++) wg_ss<T, BN>(s, desc_k<BM>(cQ, cw * 64, ks), desc_k<BN>(cK, 0, ks), ks);
                wg_commit();
                wg_wait0();
                fence_regs<NA>(s);
                bool full = n0 >= R.maxlo && n0 + BN <= R.minhi;
                float c0, c1;
                softmax_tile<NA>(s, n0, t4, full, lo0, hi0, lo1, hi1, scale_log2, mx0, mx1, l0, l1, c0, c1);
#pragma unroll
                for (int i = 0; i < NO; i++) o[i] *= (i & 3) < 2 ? c0 : c1;
                uint32_t pa[BN / 16][4];
#pragma unroll
                for (int c = 0; c < BN / 16; c++) acc_to_a<T>(pa[c], s, c);
                wg_fence();
#pragma unroll
                for (int c = 0; c < BN / 16; c++) wg_rs<T, HD>(o, pa[c], desc_mn<BN>(cV, c * 16));
                wg_commit();
                wg_wait0();
                fence_regs<NO>(o);
            }
            mbar_arrive(bempty + 8 * st);
        }
        mbar_arrive(bqe + 8 * slot); /* the item's Q slot is free for the item after next */
        store_fwd_row<T, HD>(out, lse, o, 0, t4, w.b, w.h, r0, Tq, NH, mx0, quad_sum(l0));
        store_fwd_row<T, HD>(out, lse, o, 1, t4, w.b, w.h, r1, Tq, NH, mx1, quad_sum(l1));
    }
}

/* ---------------------------------------------------------------- backward: dk, dv */

template <typename T, int HD>
__global__ void __launch_bounds__(FA90_NT, 1)
    flash90_dkdv_kernel(const float *lse, const float *D, const __grid_constant__ CUtensorMap tq,
                        const __grid_constant__ CUtensorMap tdo, const __grid_constant__ CUtensorMap tk,
                        const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdq,
                        const __grid_constant__ CUtensorMap tdk, const __grid_constant__ CUtensorMap tdv, int kgroup,
                        const int32_t *lo, const int32_t *hi, int Tq, int NH, float scale, float scale_log2) {
    constexpr int BN = 128, BM = 64, NST = 2, KS = HD / 16, NA = BM / 2, NO = HD / 2;
    constexpr uint32_t QB = BM * HD * 2, KB = BN * HD * 2, SB = BN * BM * 2, DQB = BM * 64 * 4;
    /* dQ of a query tile: warpgroup cw sums keys [kq0, kq0 + KQ) into columns [64 cq, 64 cq + 64) */
    constexpr int KQ = HD == 128 ? BN : BN / 2;
    /* [K][V][Q stages][dout stages][dS^T x 2][dQ x 2: a warpgroup's 64 x 64 fp32 sums, two boxes
     * of 32 columns in the 128-byte swizzle] */
    uint32_t sK = smem_base1k(), sV = sK + KB, sQ = sV + KB, sO = sQ + NST * QB, sS = sO + NST * QB, sDQ = sS + 2 * SB;
    __shared__ __align__(8) uint64_t bars[1 + 2 * NST];
    __shared__ __align__(8) float Ls[NST][BM], Ds[NST][BM];
    __shared__ __align__(8) int los[NST][BM], his[NST][BM];
    __shared__ Range tiles[FA90_MAXTILES];
    uint32_t bkv = smem_addr(&bars[0]), bfull = bkv + 8, bempty = bfull + 8 * NST;
    int tid = threadIdx.x, wg = tid >> 7, ct = tid - 128, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    /* key blocks from the first (under causal and prefix masks seen by the most queries) on */
    int h = blockIdx.x, b = blockIdx.y, j0 = blockIdx.z * BN;
    if (tid == 0) { /* a stage is full when the loading warp's 32 lanes wrote its scalars and its tiles landed */
        mbar_init(bkv, 1);
        for (int i = 0; i < NST; i++) { mbar_init(bfull + 8 * i, 32); mbar_init(bempty + 8 * i, FA90_CONSUMERS); }
        mbar_init_fence();
        /* K and V first: they do not wait for the query tiles' summaries */
        mbar_expect_tx(bkv, 2 * KB);
        tma_tile<BN, HD>(sK, &tk, h / kgroup, j0, b, bkv);
        tma_tile<BN, HD>(sV, &tv, h / kgroup, j0, b, bkv);
    }
    int ntiles = (Tq + BM - 1) / BM;
    bool summarised = ntiles <= FA90_MAXTILES;
    if (summarised) /* a warp a tile, two rows a lane: the loads of all tiles in flight at once */
        for (int tt = tid >> 5; tt < ntiles; tt += blockDim.x >> 5) {
            int i0 = tt * BM + lane, i1 = i0 + 32;
            Range r = range_merge(row_range(i0 < Tq, i0 < Tq ? lo[b * Tq + i0] : 0, i0 < Tq ? hi[b * Tq + i0] : 0),
                                  row_range(i1 < Tq, i1 < Tq ? lo[b * Tq + i1] : 0, i1 < Tq ? hi[b * Tq + i1] : 0));
            r = warp_range(r);
            if (tt * BM + BM > Tq) r.minhi = -1; /* zero-filled rows past the end: always mask */
            if (lane == 0) tiles[tt] = r;
        }
    __syncthreads();
    /* query tile tt overlaps this block's keys [j0, j0 + BN) (block-uniform: tiles[] is shared) */
#define FA90_OVERLAP(tt) (!summarised || (tiles[tt].lo < j0 + BN && tiles[tt].hi > j0))
    if (wg == 0) {
        regs_dec<24>();
        if (tid < 32) { /* one warp: its lanes stage the row scalars, lane 0 issues the copies */
            size_t srow = ((size_t)b * NH + h) * Tq;
            int it = 0;
            for (int cur = 0; cur < ntiles; cur++) {
                if (!FA90_OVERLAP(cur)) continue;
                int st = it % NST, i0 = cur * BM;
                mbar_wait(bempty + 8 * st, ((it / NST) & 1) ^ 1);
                if (lane == 0) { /* the tiles first: their copies run while the scalars are fetched */
                    mbar_expect_bytes(bfull + 8 * st, 2 * QB);
                    tma_tile<BM, HD>(sQ + st * QB, &tq, h, i0, b, bfull + 8 * st);
                    tma_tile<BM, HD>(sO + st * QB, &tdo, h, i0, b, bfull + 8 * st);
                }
                for (int r = lane; r < BM; r += 32) {
                    int i = i0 + r;
                    bool in = i < Tq;
                    Ls[st][r] = in ? lse[srow + i] * FA_LOG2E : 0.0f;
                    Ds[st][r] = in ? D[srow + i] : 0.0f;
                    los[st][r] = in ? lo[b * Tq + i] : 0;
                    his[st][r] = in ? hi[b * Tq + i] : 0;
                }
                mbar_arrive(bfull + 8 * st); /* after this lane's own stores (release) */
                it++;
            }
        }
        return;
    }
    regs_inc<240>();
    int cw = wg - 1, kg0 = j0 + cw * 64, kw0 = j0 + (ct >> 5) * 16;
    int kr0 = kw0 + g, kr1 = kr0 + 8, wq = (ct >> 5) & 3; /* wq: the warp within its warpgroup */
    int kq0 = HD == 128 ? 0 : cw * 64, cq = HD == 128 ? cw : 0;
    float adk[NO], adv[NO];
#pragma unroll
    for (int i = 0; i < NO; i++) adk[i] = adv[i] = 0.0f;
    mbar_wait(bkv, 0);
    int it = 0;
    for (int cur = 0; cur < ntiles; cur++) {
        if (!FA90_OVERLAP(cur)) continue;
        int st = it % NST;
        mbar_wait(bfull + 8 * st, (it / NST) & 1);
        Range info = summarised ? tiles[cur] : Range{0, 0x7fffffff, 0x7fffffff, -1};
        uint32_t cQ = sQ + st * QB, cO = sO + st * QB, cS = sS + (it & 1) * SB;
        if (info.lo < kg0 + 64 && info.hi > kg0) { /* warpgroup-uniform */
            float s[NA], dp[NA];
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                wg_ss<T, BM>(s, desc_k<BN>(sK, cw * 64, ks), desc_k<BM>(cQ, 0, ks), ks);
                wg_ss<T, BM>(dp, desc_k<BN>(sV, cw * 64, ks), desc_k<BM>(cO, 0, ks), ks);
            }
            wg_commit();
            wg_wait0();
            fence_regs<NA>(s);
            fence_regs<NA>(dp);
            bool full = kw0 >= info.maxlo && kw0 + 16 <= info.minhi;
#pragma unroll
            for (int nt = 0; nt < NA / 4; nt++) {
                int q0 = nt * 8 + 2 * t4; /* this thread's two queries of the 8-column group */
                float2 Lq = *reinterpret_cast<const float2 *>(&Ls[st][q0]), Dq = *reinterpret_cast<const float2 *>(&Ds[st][q0]);
                int2 lq = make_int2(0, 0), hq = make_int2(0x7fffffff, 0x7fffffff);
                if (!full) {
                    lq = *reinterpret_cast<const int2 *>(&los[st][q0]);
                    hq = *reinterpret_cast<const int2 *>(&his[st][q0]);
                }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int i = nt * 4 + e, key = e < 2 ? kr0 : kr1;
                    bool odd = e & 1;
                    bool ok = key >= (odd ? lq.y : lq.x) && key < (odd ? hq.y : hq.x);
                    float p = ok ? exp2f(s[i] * scale_log2 - (odd ? Lq.y : Lq.x)) : 0.0f;
                    s[i] = p;
                    dp[i] = p * (dp[i] - (odd ? Dq.y : Dq.x)) * scale; /* ds */
                }
            }
            uint32_t pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
            for (int c = 0; c < BM / 16; c++) {
                acc_to_a<T>(pa[c], s, c);
                acc_to_a<T>(da[c], dp, c);
            }
            wg_fence();
#pragma unroll
            for (int c = 0; c < BM / 16; c++) {
                wg_rs<T, HD>(adv, pa[c], desc_mn<BM>(cO, c * 16));
                wg_rs<T, HD>(adk, da[c], desc_mn<BM>(cQ, c * 16));
            }
            wg_commit();
            /* dS^T rows of this warpgroup's keys, [128 keys][64 queries] in the tile layout, the
             * A operand (M-major) of dQ */
            int k0 = cw * 64 + wq * 16 + g;
#pragma unroll
            for (int c = 0; c < BM / 16; c++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    int key = k0 + (r & 1) * 8, q = c * 16 + (r >> 1) * 8 + 2 * t4;
                    sts_b32(cS + t90<BN>(key, q >> 3) + (q & 7) * 2, da[c][r]);
                }
        } else { /* no key of this warpgroup is seen: its dS^T rows are zeros */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int e = (ct & 127) + 128 * j, key = cw * 64 + e / 8;
                asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(cS + t90<BN>(key, e & 7)), "r"(0) : "memory");
            }
        }
        fence_proxy_async();
        if ((ct & 127) == 0) bulk_wait_read(); /* the last tile's dQ box has been read: its buffer is free */
        consumers_sync(); /* both halves of dS^T written (and the other buffer free: see below); dQ's free */
        /* dQ[64 queries][64 columns] += dS (queries x keys kq0..) K[keys][columns]; the other dS^T
         * buffer is rewritten next step only after both warpgroups passed this step's barrier,
         * so after their dQ products of the previous step completed */
        float dqa[32];
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < KQ / 16; ks++)
            wg_ss_t<T, 64>(dqa, desc_mn<BN>(cS, kq0 + ks * 16), desc_mn<BN>(sK + cq * BN * 128, kq0 + ks * 16), ks);
        wg_commit();
        /* dV and dK (the group before) complete first: the stage (Q, dout, its scalars) is then
         * released while dQ's product still runs */
        wg_wait1();
        fence_regs<NO>(adv);
        fence_regs<NO>(adk);
        mbar_arrive(bempty + 8 * st);
        wg_wait0();
        fence_regs<32>(dqa);
        /* dQ's 64 x 64 sums into shared memory in the box layout (rows 128 bytes, 16-byte chunks
         * XOR-swizzled by row & 7; this thread's rows are 16 wq + g and + 8, so row & 7 = g), then
         * one thread of the warpgroup has the copy engine add them into dqacc (rows past Tq are
         * clipped by the tensor map) */
        uint32_t cD = sDQ + cw * DQB;
#pragma unroll
        for (int nd = 0; nd < 8; nd++) {
            uint32_t at = cD + (nd >> 2) * (DQB / 2) + (wq * 16 + g) * 128 + (((((nd & 3) << 1) | (t4 >> 1)) ^ g) << 4) + (t4 & 1) * 8;
            sts_f32x2(at, dqa[4 * nd], dqa[4 * nd + 1]);
            sts_f32x2(at + 8 * 128, dqa[4 * nd + 2], dqa[4 * nd + 3]);
        }
        fence_proxy_async();
        wg_sync(cw);
        if ((ct & 127) == 0) {
            tma_reduce_add(&tdq, cD, cq * 64, h, cur * BM, b);
            tma_reduce_add(&tdq, cD + DQB / 2, cq * 64 + 32, h, cur * BM, b);
            bulk_commit();
        }
        it++;
    }
#undef FA90_OVERLAP
    /* dK and dV leave through shared memory by the copy engine (rows past Tk are not written):
     * the Q and dout stages, 64 KiB, take a warpgroup's [64 keys][HD] of each, once both
     * warpgroups' last products (which read them) are done */
    consumers_sync();
    uint32_t sdk = sQ + cw * 2 * QB, sdv = sdk + QB; /* a warpgroup's 64 rows: a Q tile's size */
    int rw = wq * 16 + g; /* this thread's rows rw and rw + 8 of the warpgroup's 64 */
#pragma unroll
    for (int i = 0; i < HD / 8; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            uint32_t at = t90<BM>(rw + 8 * half, i) + 4 * t4;
            sts_b32(sdk + at, pack2<T>(adk[4 * i + 2 * half], adk[4 * i + 2 * half + 1]));
            sts_b32(sdv + at, pack2<T>(adv[4 * i + 2 * half], adv[4 * i + 2 * half + 1]));
        }
    fence_proxy_async();
    wg_sync(cw);
    if ((ct & 127) == 0) {
#pragma unroll
        for (int c = 0; c < HD / 64; c++) {
            tma_store(&tdk, sdk + c * BM * 128, c * 64, h, kg0, b);
            tma_store(&tdv, sdv + c * BM * 128, c * 64, h, kg0, b);
        }
        bulk_commit();
        /* the shared memory stays until the copy engine has read the last dQ boxes and dK, dV;
         * their writes need not land before the block ends (the grid's completion covers them),
         * so the block leaves its multiprocessor to the next one without waiting for them */
        bulk_wait_read();
    }
}

/* ---------------------------------------------------------------- launchers */

typedef CUresult (*tmap_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                   const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
/* the driver's tensor-map encoder, looked up once (no link against libcuda) */
static tmap_encode_fn tmap_encoder() {
    static const tmap_encode_fn fn = [] {
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = NULL;
        (void)cudaGetLastError();
        return (tmap_encode_fn)p;
    }();
    return fn;
}
/* A 4-d tensor (HD, heads, T, B) of `es`-byte elements, byte strides of its last three
 * dimensions, read or written in boxes of 128 bytes of columns x `rows` rows with the 128-byte
 * swizzle. False when the strides do not qualify (the caller then takes the mma.sync kernels). */
static bool tmap_4d(CUtensorMap *m, CUtensorMapDataType type, int es, const void *base, int HD, int heads, int T, int B,
                    const cuuint64_t strides[3], int rows) {
    tmap_encode_fn enc = tmap_encoder();
    if (!enc || T <= 0) return false;
    for (int i = 0; i < 3; i++)
        if (strides[i] == 0 || strides[i] % 16) return false;
    cuuint64_t dims[4] = {(cuuint64_t)HD, (cuuint64_t)heads, (cuuint64_t)T, (cuuint64_t)B};
    cuuint32_t box[4] = {(cuuint32_t)(128 / es), 1, (cuuint32_t)rows, 1}, one[4] = {1, 1, 1, 1};
    return enc(m, type, 4, (void *)base, dims, strides, box, one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}
/* The rows of a view (or of dout: [B, T, NH, HD]), 16-bit, in boxes of 64 columns x `rows` */
static bool tmap_rows(CUtensorMap *m, glm_dtype dt, const void *base, long bs, long ts, long hs, int heads, int T, int B,
                      int HD, int rows) {
    cuuint64_t strides[3] = {(cuuint64_t)(heads > 1 ? hs : HD) * 2, (cuuint64_t)ts * 2, (cuuint64_t)(B > 1 ? bs : (long)T * ts) * 2};
    return tmap_4d(m, dt == GLM_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, base, HD, heads,
                   T, B, strides, rows);
}
/* dq's fp32 sums [B, T, NH, HD], the target of the bulk reductions: boxes of 32 columns x 64 rows */
static bool tmap_sums(CUtensorMap *m, float *acc, int NH, int T, int B, int HD) {
    cuuint64_t strides[3] = {(cuuint64_t)HD * 4, (cuuint64_t)NH * HD * 4, (cuuint64_t)T * NH * HD * 4};
    return tmap_4d(m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, acc, HD, NH, T, B, strides, 64);
}
static bool tmap_view(CUtensorMap *m, glm_dtype dt, const glm_qkv_view &v, int NH, int T, int B, int HD, int rows) {
    return tmap_rows(m, dt, v.base, v.batch_stride, v.tok_stride, v.head_stride, NH / glm_view_group(v), T, B, HD, rows);
}

template <typename K> static void smem_attr90(K *fn, size_t bytes) {
    GLMK_CHECK(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <typename T, int HD>
static int fwd90_t(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                   const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, float scale, int sms, cudaStream_t st) {
    CUtensorMap tq, tk, tv;
    if (!tmap_view(&tq, dt, q, NH, Tq, B, HD, 128) || !tmap_view(&tk, dt, k, NH, Tk, B, HD, 128) ||
        !tmap_view(&tv, dt, v, NH, Tk, B, HD, 128))
        return 0;
    size_t smem = (size_t)(2 * 128 + 4 * 128) * HD * 2 + 1024;
    smem_attr90(flash90_fwd_kernel<T, HD>, smem);
    long items = (long)((Tq + 127) / 128) * NH * B; /* a block a multiprocessor (each takes a whole one) */
    flash90_fwd_kernel<T, HD><<<(unsigned)(items < sms ? items : sms), FA90_NT, smem, st>>>(
        (T *)out, lse, tq, tk, tv, glm_view_group(k), lo, hi, B, Tq, NH, scale * FA_LOG2E);
    GLMK_CHECK_LAUNCH();
    return 1;
}

/* dq (a view) = the fp32 sums of the dk/dv blocks, [B, Tq, NH, HD] */
template <typename T, int HD>
__global__ void flash90_dq_store(glm_qkv_view dq, const float *acc, int B, int Tq, int NH) {
    size_t n = (size_t)B * Tq * NH * (HD / 8);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t row = i / (HD / 8);
        int c = (int)(i % (HD / 8)) * 8, h = (int)(row % NH), t = (int)(row / NH % Tq), b = (int)(row / NH / Tq);
        const float4 *src = reinterpret_cast<const float4 *>(acc + row * HD + c);
        float4 x = src[0], y = src[1];
        uint4 o = make_uint4(pack2<T>(x.x, x.y), pack2<T>(x.z, x.w), pack2<T>(y.x, y.y), pack2<T>(y.z, y.w));
        *reinterpret_cast<uint4 *>(view_row<T>(dq, b, t, h) + c) = o;
    }
}

template <typename T, int HD>
static int bwd90_t(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, float *dqacc, const void *dout,
                   const float *lse, const float *D, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v, const int32_t *lo,
                   const int32_t *hi, int B, int Tq, int Tk, int NH, float scale, cudaStream_t st) {
    long ld = (long)NH * HD;
    CUtensorMap tq, tdo, tk, tv, tdq, tdk, tdv;
    if (!tmap_view(&tq, dt, q, NH, Tq, B, HD, 64) || !tmap_rows(&tdo, dt, dout, (long)Tq * ld, ld, HD, NH, Tq, B, HD, 64) ||
        !tmap_view(&tk, dt, k, NH, Tk, B, HD, 128) || !tmap_view(&tv, dt, v, NH, Tk, B, HD, 128) ||
        !tmap_sums(&tdq, dqacc, NH, Tq, B, HD) || !tmap_view(&tdk, dt, dk, NH, Tk, B, HD, 64) ||
        !tmap_view(&tdv, dt, dv, NH, Tk, B, HD, 64))
        return 0;
    size_t smem = (size_t)(2 * 128 + 4 * 64) * HD * 2 + 2 * 128 * 64 * 2 + 2 * 64 * 64 * 4 + 1024;
    smem_attr90(flash90_dkdv_kernel<T, HD>, smem);
    GLMK_CHECK(cudaMemsetAsync(dqacc, 0, (size_t)B * Tq * NH * HD * sizeof(float), st));
    flash90_dkdv_kernel<T, HD><<<dim3(NH, B, (Tk + 127) / 128), FA90_NT, smem, st>>>(
        lse, D, tq, tdo, tk, tv, tdq, tdk, tdv, glm_view_group(k), lo, hi, Tq, NH, scale, scale * FA_LOG2E);
    GLMK_CHECK_LAUNCH();
    size_t n = (size_t)B * Tq * NH * (HD / 8);
    flash90_dq_store<T, HD><<<glmk_blocks(n, 256, 4096), 256, 0, st>>>(dq, dqacc, B, Tq, NH);
    GLMK_CHECK_LAUNCH();
    return 1;
}

#define FA90_DISPATCH(dt, HD, FN, ...)                                                                                     \
    ((dt) == GLM_BF16 ? ((HD) == 128 ? FN<bf16, 128>(__VA_ARGS__) : FN<bf16, 64>(__VA_ARGS__))                             \
                      : ((HD) == 128 ? FN<f16, 128>(__VA_ARGS__) : FN<f16, 64>(__VA_ARGS__)))

/* 1 when this build carries the sm_90a kernels and `device` can run them */
extern "C" int glmk_flash90_available(int device) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return 0;
    if (p.major != 9 || p.minor != 0 || !tmap_encoder()) return 0;
    cudaFuncAttributes fa;
    int ok = cudaFuncGetAttributes(&fa, (const void *)flash90_fwd_kernel<bf16, 128>) == cudaSuccess;
    (void)cudaGetLastError(); /* a missing image is an answer here, not an error for the next launch */
    /* and the image is sm_90a code: one compiled from older PTX has the wgmma steps as traps */
    return ok && fa.ptxVersion >= 90;
}

extern "C" int glmk_flash90_fwd(glm_dtype dt, void *out, float *lse, glm_qkv_view q, glm_qkv_view k, glm_qkv_view v,
                                const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH, int HD, float scale,
                                int sms, cudaStream_t st) {
    if (B <= 0 || Tq <= 0) return 1;
    if (Tk <= 0) return 0;
    return FA90_DISPATCH(dt, HD, fwd90_t, dt, out, lse, q, k, v, lo, hi, B, Tq, Tk, NH, scale, sms, st);
}

extern "C" size_t glmk_flash90_bwd_scratch(int B, int Tq, int NH, int HD) {
    return (size_t)B * Tq * NH * HD * sizeof(float);
}

extern "C" int glmk_flash90_bwd(glm_dtype dt, glm_qkv_view dq, glm_qkv_view dk, glm_qkv_view dv, float *scratch,
                                const void *dout, const float *lse, const float *D, glm_qkv_view q, glm_qkv_view k,
                                glm_qkv_view v, const int32_t *lo, const int32_t *hi, int B, int Tq, int Tk, int NH,
                                int HD, float scale, cudaStream_t st) {
    if (B <= 0 || Tq <= 0 || Tk <= 0) return 0; /* the mma.sync pair handles the degenerate shapes */
    return FA90_DISPATCH(dt, HD, bwd90_t, dt, dq, dk, dv, scratch, dout, lse, D, q, k, v, lo, hi, B, Tq, Tk, NH, scale, st);
}
