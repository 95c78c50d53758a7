"""Operations that are not kernel launches, in a loop, to see what NVML's utilization counts:
  memset  cudaMemsetAsync of 1 GiB       d2d  cudaMemcpyAsync device to device, 1 GiB
  h2d     cudaMemcpyAsync from pinned host memory, 256 MiB
usage: engine_probe.py KIND [--seconds S]   (CuPy; synchronizes after every 4 operations)
Prints `progress t= n=` like workloads.py."""
import sys
import time

import cupy as cp

kind = sys.argv[1]
secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else float("inf")
rt = cp.cuda.runtime
s = cp.cuda.Stream(non_blocking=True)
n_bytes = (256 << 20) if kind == "h2d" else (1 << 30)
dst = cp.empty(n_bytes, dtype=cp.uint8)
src = cp.empty(n_bytes, dtype=cp.uint8)
host = cp.cuda.alloc_pinned_memory(n_bytes) if kind == "h2d" else None


def op():
    if kind == "memset":
        rt.memsetAsync(dst.data.ptr, 0, n_bytes, s.ptr)
    elif kind == "d2d":
        rt.memcpyAsync(dst.data.ptr, src.data.ptr, n_bytes, rt.memcpyDeviceToDevice, s.ptr)
    else:
        rt.memcpyAsync(dst.data.ptr, host.ptr, n_bytes, rt.memcpyHostToDevice, s.ptr)


n, t0, last = 0, time.monotonic(), 0.0
while time.monotonic() - t0 < secs:
    for _ in range(4):
        op()
    s.synchronize()
    n += 4
    now = time.monotonic()
    if now - last >= 0.25:
        print(f"progress t={now:.4f} n={n}", flush=True)
        last = now
