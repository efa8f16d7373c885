#!/usr/bin/env python3
"""PyTorch DistributedDataParallel counterpart of bench/pytorch_baseline.py (data-parallel baseline
for bench/bench_dp.sh): the same ChatGLM-6B-shaped model, batch, bf16-autocast training step,
fused AdamW and per-block torch.compile, all imported from pytorch_baseline.py, wrapped in
DistributedDataParallel (gradient_as_bucket_view, static_graph, --bucket_cap_mb). Every rank
trains on its own micro-batch of B rows (the 1-GPU baseline's batch), so a step processes
world_size * B * T tokens. A trailing 'c' in a run spec turns on activation checkpointing.

Steps after the warm-up are timed between torch.cuda.synchronize() + barrier pairs; the step time
is the median over steps of the slowest rank. Rank 0 prints one JSON line per run (run,
world_size, tokens_per_s over all ranks, tokens_per_s_per_gpu, step_ms, peak_mem_gib = max over
ranks of torch.cuda.max_memory_allocated, plus MFU per GPU with the baseline's formula) and, with
--out, writes the list of them as JSON.

  python3 -m torch.distributed.run --standalone --nproc_per_node 8 bench/pytorch_ddp.py \\
      --runs 512x8c [--steps 6] [--warmup 3] [--layers 28] [--no-compile] [--bucket_cap_mb 100] [--out f.json]

NCCL on GPUs; without a GPU it falls back to gloo on the CPU, for a smoke test with --tiny
(V 1024, H 64, 4 heads, FFN 256; token ids are folded into the small vocabulary):

  python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/pytorch_ddp.py \\
      --runs 64x2,64x2c --tiny --layers 1 --no-compile --steps 2 --warmup 1
"""
import argparse
import contextlib
import gc
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_baseline as PB  # noqa: E402


def shrink_for_cpu_test():
    """--tiny: shrink the module-level shapes the baseline's GLM/Block read at construction/forward."""
    PB.V, PB.H, PB.NH, PB.FF = 1024, 64, 4, 256
    PB.HD = PB.H // PB.NH


def _sdpa_reference(q, k, v, attn_mask=None):
    """Plain attention for torch < 2.0 (CPU smoke test only); boolean mask, True = attend."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return s.softmax(-1) @ v


def rank_batch(B, T, rank, world, dev, tiny):
    """This rank's B rows of a global make_batch(world * B, T): distinct rows per rank.

    Every row of make_batch has the same answer positions, so the supervised flat indices of
    rows [0, B) are the first B * n of the global sup_idx and this rank's targets are slice rank."""
    ids, pos, bpos, mask, sup_idx, sup_tgt = PB.make_batch(world * B, T, "cpu")
    n = sup_idx.numel() // (world * B)
    assert n * world * B == sup_idx.numel()
    rows = slice(rank * B, (rank + 1) * B)
    ids, sup_tgt = ids[rows], sup_tgt[rank * B * n:(rank + 1) * B * n]
    if tiny:
        ids, sup_tgt = ids % PB.V, sup_tgt % PB.V
    return [t.to(dev) for t in (ids, pos[rows], bpos[rows], mask[rows], sup_idx[:B * n], sup_tgt)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="512x8", help="comma-separated TxB[c] per-rank micro-batches")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layers", type=int, default=PB.L)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--bucket_cap_mb", type=float, default=25.0, help="DDP gradient bucket size (PyTorch default 25)")
    ap.add_argument("--no-static-graph", action="store_true", help="DDP(static_graph=False)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes for a CPU smoke test")
    ap.add_argument("--out", default=None, help="write the list of result records as JSON (rank 0)")
    a = ap.parse_args()
    if a.steps < 1:
        ap.error("--steps must be >= 1")
    if not a.no_compile and not hasattr(torch.nn.Module, "compile"):
        ap.error(f"torch {torch.__version__} has no nn.Module.compile; use --no-compile")
    if a.tiny:
        shrink_for_cpu_test()
    if not hasattr(F, "scaled_dot_product_attention"):
        F.scaled_dot_product_attention = _sdpa_reference  # what the baseline's Block calls

    # torchrun's environment; a plain `python3 bench/pytorch_ddp.py` runs as a world of one
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
        os.environ.setdefault(k, v)
    rank, local_rank, world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    assert dist.get_world_size() == world and dist.get_rank() == rank

    def sync():
        if cuda:
            torch.cuda.synchronize()
            dist.barrier(device_ids=[local_rank])
        else:
            dist.barrier()

    if rank == 0:
        where = torch.cuda.get_device_name() if cuda else "CPU"
        print(f"torch {torch.__version__} DDP on {world} x {where} ({dist.get_backend()})", flush=True)
    results = []
    try:
        for run in a.runs.split(","):
            ck = run.endswith("c")
            T, B = map(int, run.rstrip("c").split("x"))
            t_run = time.time()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            torch.manual_seed(0)  # same init everywhere (DDP broadcasts rank 0's anyway)
            # build straight on the GPU where torch >= 2.0 allows it (the baseline builds on the CPU)
            on_dev = dev if cuda and hasattr(torch.device, "__enter__") else contextlib.nullcontext()
            with on_dev:
                model = PB.GLM(a.layers)
            model = model.to(dev)
            model.ckpt = ck
            if not a.no_compile:
                for blk in model.blocks:
                    blk.compile()
            ddp = DDP(model, device_ids=[local_rank] if cuda else None, bucket_cap_mb=a.bucket_cap_mb,
                      gradient_as_bucket_view=True, static_graph=not a.no_static_graph)
            opt = torch.optim.AdamW(ddp.parameters(), lr=1e-5, weight_decay=0.01, **({"fused": True} if cuda else {}))
            n_params = sum(p.numel() for p in model.parameters())
            batch = rank_batch(B, T, rank, world, dev, a.tiny)

            def step():
                return PB.train_step(ddp, opt, batch, dev.type)

            first = None
            for i in range(a.warmup):
                loss = step()
                sync()
                if i == 0:
                    first = time.time() - t_run
            sync()
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                loss = step()
                sync()
                times.append(time.perf_counter() - t0)

            # slowest rank per step, peak memory over ranks, mean loss over ranks
            t = torch.tensor(times, dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            peak = torch.tensor([torch.cuda.max_memory_allocated() if cuda else 0], dtype=torch.float64, device=dev)
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            lsum = loss.detach().float().reshape(1).clone()
            dist.all_reduce(lsum)
            med = statistics.median(t.tolist())
            tok_gpu = B * T / med
            mfu = tok_gpu * (6 * n_params + 12 * a.layers * PB.H * T) / 989e12
            res = dict(impl="pytorch-ddp", run=f"{T}x{B}{'+ckpt' if ck else ''}", world_size=world, seq=T,
                       micro_batch=B, tokens_per_s=tok_gpu * world, tokens_per_s_per_gpu=tok_gpu,
                       step_ms=med * 1e3, peak_mem_gib=peak.item() / 2**30 if cuda else None, mfu=mfu,
                       first_step_s=first, loss=lsum.item() / world, n_params=n_params,
                       compile=not a.no_compile, bucket_cap_mb=a.bucket_cap_mb, static_graph=not a.no_static_graph,
                       backend=dist.get_backend(), tiny=a.tiny)
            results.append(res)
            if rank == 0:
                print(json.dumps(res), flush=True)
                if a.out:
                    with open(a.out, "w") as f:  # rewritten after every run so a later crash keeps it
                        json.dump(results, f, indent=1)
            del ddp, model, opt, batch, step, loss
            if not a.no_compile:
                torch._dynamo.reset()  # compiled blocks hold the old parameters
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
            sync()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
