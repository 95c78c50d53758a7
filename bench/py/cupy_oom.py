"""Allocate 256 MiB CuPy arrays until OOM.

usage: cupy_oom.py [--pool default|async|none] [--step-mib 256] [--max-gib N] [--device D] [--hold-seconds S]
  default  cupy's MemoryPool (cudaMalloc underneath)
  async    cupy.cuda.MemoryAsyncPool (cudaMallocAsync, stream-ordered)
  none     no pool: every array is its own cudaMalloc
Output: pool=, allocated_mib= allocations= stop_reason=oom|max, mem_get_info_free=
mem_get_info_total=, result=PASS|FAIL (clean OOM = cupy.cuda.memory.OutOfMemoryError, or
cudaErrorMemoryAllocation from cudaMalloc without a pool).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fail, out  # noqa: E402

import cupy  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--pool", choices=["default", "async", "none"], default="default")
ap.add_argument("--step-mib", type=int, default=256)
ap.add_argument("--max-gib", type=float, default=0)
ap.add_argument("--device", type=int, default=0)
ap.add_argument("--hold-seconds", type=float, default=0,
                help="keep everything allocated this long after the loop (lets a sampler see the peak)")
args = ap.parse_args()

cupy.cuda.Device(args.device).use()
if args.pool == "async":
    cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
elif args.pool == "none":
    cupy.cuda.set_allocator(None)
out(pool=args.pool, cupy=cupy.__version__)
step = args.step_mib << 20
held, reason = [], "oom"
try:
    while True:
        if args.max_gib and (len(held) + 1) * step > args.max_gib * (1 << 30):
            reason = "max"
            break
        held.append(cupy.empty(step, dtype=cupy.uint8))
        cupy.cuda.Stream.null.synchronize()
except cupy.cuda.memory.OutOfMemoryError:
    pass
except cupy.cuda.runtime.CUDARuntimeError as e:  # without a pool: the raw cudaMalloc error
    if "cudaErrorMemoryAllocation" not in str(e):
        fail(f"CUDARuntimeError:{str(e)[:200]}")
except Exception as e:
    fail(f"{type(e).__name__}:{str(e).splitlines()[0][:200]}")
if args.hold_seconds:
    import time
    time.sleep(args.hold_seconds)
free, total = cupy.cuda.runtime.memGetInfo()
out(allocated_mib=len(held) * args.step_mib, allocations=len(held), stop_reason=reason)
out(mem_get_info_free=free, mem_get_info_total=total)
out(result="PASS")
