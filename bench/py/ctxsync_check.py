"""ctxsync_check.py: does a context synchronize the hook answers with events wait for every stream
a PyTorch program uses? A priority-0 service beside a saturating priority-1 neighbour lingers,
and its `torch.cuda.synchronize()` (cudaDeviceSynchronize -> cuCtxSynchronize) is then answered
from the hook's list of the program's streams. Streams PyTorch makes come through the CUDA
runtime (cudaStreamCreateWithPriority, reached by cuGetProcAddress): if the hook missed one, a
synchronize could return with that stream's work still running.

Each request: a ~2 ms kernel (torch.cuda._sleep) then a bf16 matmul on a side stream
(torch.cuda.Stream), a small matmul on the current stream, `torch.cuda.synchronize()`, then
`side.query()` must say the side stream is done. Pauses between requests are random (mean
10 ms), so some requests come within the linger and it pays (docs/design.md, linger).
Prints `ctxsync_check requests=N side_unfinished=K` (K must be 0) and the hook's last gate line
(with LIBCUDA_LOG_LEVEL=4: `answered_ctx_syncs=` says whether the answered path was taken).

usage: bench/ctxsync_check.sh SECONDS runs it beside its neighbour; alone:
       CUDA_TASK_PRIORITY=0 VGPU_NODE_DIR=... LD_PRELOAD=libvgpu.so python3 ctxsync_check.py SECONDS
"""
import random
import sys
import time

import torch

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
torch.cuda.init()
side = torch.cuda.Stream()
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
q = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)

# Cycles for about 2 ms of torch.cuda._sleep, from one timed run.
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
torch.cuda._sleep(1_000_000)
end.record()
torch.cuda.synchronize()
cycles = max(100_000, int(1_000_000 * 2.0 / max(start.elapsed_time(end), 1e-3)))

random.seed(1)
n = unfinished = 0
t0 = time.time()
while time.time() - t0 < secs:
    with torch.cuda.stream(side):
        torch.cuda._sleep(cycles)
        y = x @ x
    r = q @ q
    torch.cuda.synchronize()
    if not side.query():
        unfinished += 1
    n += 1
    time.sleep(random.expovariate(1 / 0.010))
print(f"ctxsync_check requests={n} side_unfinished={unfinished} sleep_cycles={cycles}", flush=True)
