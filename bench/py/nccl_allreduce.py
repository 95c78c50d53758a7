"""NCCL all-reduce across GPUs with torch.distributed, one process per GPU (mp.spawn).

usage: nccl_allreduce.py [--gpus 2] [--size-mib 256] [--iters 40] [--warmup 5] [--timeout-s 90]
                         [--hold-s 1]
Each rank r drives cuda:r, all-reduces a float32 tensor of --size-mib (filled with r+1) --iters
times, checks the result (sum of 1..gpus), and prints one line:
  rank= device= allreduce_ms= busbw_gbs= mem_get_info_free_mib= mem_get_info_total_mib=
  max_reserved_mib= result=PASS|FAIL [error=]
Rank 0 then prints: gpus= size_mib= allreduce_ms= (median over ranks' means) result=PASS|FAIL.
A rank that fails (OOM, NCCL error, timeout) prints result=FAIL error=...; the exit status is 1.
The NVLink multicast switches (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1) are forced on for every rank.
"""
import argparse
import os
import socket
import sys
import time

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
             ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[k] = v

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import out  # noqa: E402


def rank_main(rank, args, port, results):
    import datetime

    import torch
    import torch.distributed as dist

    res = {"rank": rank, "device": rank}
    try:
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.gpus,
                                timeout=datetime.timedelta(seconds=args.timeout_s), device_id=dev)
        n = args.size_mib * (1 << 20) // 4
        x = torch.full((n,), float(rank + 1), device=dev)
        want = float(sum(range(1, args.gpus + 1)))
        for _ in range(args.warmup):
            y = x.clone()
            dist.all_reduce(y)
        torch.cuda.synchronize(dev)
        ok = bool(torch.all(y == want).item())
        times = []
        for _ in range(args.iters):
            y.copy_(x)
            torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            dist.all_reduce(y)
            torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        ok = ok and bool(torch.all(y == want).item())
        dist.barrier()
        times.sort()
        ms = 1e3 * times[len(times) // 2]
        free, total = torch.cuda.mem_get_info(dev)
        # ring all-reduce bus bandwidth: 2 (g-1)/g bytes moved per byte reduced
        busbw = (args.size_mib / 1024) * 2 * (args.gpus - 1) / args.gpus / (ms / 1e3)
        res.update(allreduce_ms=ms, busbw_gbs=busbw, mem_get_info_free_mib=free >> 20,
                   mem_get_info_total_mib=total >> 20,
                   max_reserved_mib=torch.cuda.max_memory_reserved(dev) >> 20,
                   result="PASS" if ok else "FAIL")
        if not ok:
            res["error"] = "wrong_sum"
        time.sleep(args.hold_s)  # let the host sampler see the steady footprint
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001  (reported, not swallowed: result=FAIL)
        res.update(result="FAIL", error=f"{type(e).__name__}:{str(e).splitlines()[0][:160] if str(e) else ''}")
    out(**res)
    results[rank] = res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout-s", type=int, default=90)
    ap.add_argument("--hold-s", type=float, default=1.0)
    args = ap.parse_args()

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mgr = mp.Manager()
    results = mgr.dict()
    t0 = time.monotonic()
    try:
        mp.spawn(rank_main, args=(args, port, results), nprocs=args.gpus, join=True)
        spawn_error = ""
    except Exception as e:  # noqa: BLE001
        spawn_error = f"{type(e).__name__}"
    res = [results.get(r) for r in range(args.gpus)]
    ok = not spawn_error and all(r and r.get("result") == "PASS" for r in res)
    ms = sorted(r["allreduce_ms"] for r in res if r and "allreduce_ms" in r)
    summary = {"gpus": args.gpus, "size_mib": args.size_mib, "iters": args.iters,
               "allreduce_ms": ms[len(ms) // 2] if ms else -1.0,
               "wall_s": time.monotonic() - t0, "result": "PASS" if ok else "FAIL"}
    if spawn_error:
        summary["error"] = spawn_error
    out(**summary)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
