"""Allocate 256 MiB JAX arrays until the device is exhausted.

usage: jax_oom.py [--mode noprealloc|prealloc|platform] [--step-mib 256] [--max-gib N] [--hold-seconds S]
  noprealloc  XLA_PYTHON_CLIENT_PREALLOCATE=false (BFC allocator grows on demand)
  prealloc    XLA's default: reserve 75% of the memory the device reports at start-up
  platform    XLA_PYTHON_CLIENT_ALLOCATOR=platform (one cudaMalloc per buffer)
Output: mode=, bytes_limit= (XLA's view of the device), allocated_mib= allocations=
stop_reason=oom|max, result=PASS|FAIL (clean OOM = RESOURCE_EXHAUSTED / out of memory).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fail, out  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=["noprealloc", "prealloc", "platform"], default="noprealloc")
ap.add_argument("--step-mib", type=int, default=256)
ap.add_argument("--max-gib", type=float, default=0)
ap.add_argument("--hold-seconds", type=float, default=0,
                help="keep everything allocated this long after the loop (lets a sampler see the peak)")
args = ap.parse_args()

os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
os.environ.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
if args.mode == "noprealloc":
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
elif args.mode == "platform":
    os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

dev = jax.devices("gpu")[0]
stats = dev.memory_stats() or {}
out(mode=args.mode, jax=jax.__version__, device=str(dev),
    bytes_limit=stats.get("bytes_limit", "unknown"))
n = (args.step_mib << 20) // 4
held, reason = [], "oom"
try:
    while True:
        if args.max_gib and (len(held) + 1) * args.step_mib > args.max_gib * 1024:
            reason = "max"
            break
        a = jnp.ones((n,), dtype=jnp.float32)  # on the default device: GPU 0
        a.block_until_ready()
        held.append(a)
except Exception as e:  # XlaRuntimeError / JaxRuntimeError: RESOURCE_EXHAUSTED
    msg = str(e)
    if "RESOURCE_EXHAUSTED" not in msg and "out of memory" not in msg.lower():
        fail(f"{type(e).__name__}:{msg.splitlines()[0][:200]}")
if args.hold_seconds:
    import time
    time.sleep(args.hold_seconds)
out(allocated_mib=len(held) * args.step_mib, allocations=len(held), stop_reason=reason)
stats = dev.memory_stats() or {}
out(bytes_in_use=stats.get("bytes_in_use", "unknown"),
    peak_bytes_in_use=stats.get("peak_bytes_in_use", "unknown"))
out(result="PASS")
