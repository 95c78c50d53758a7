"""Allocate 256 MiB CUDA tensors with PyTorch until OOM.

usage: torch_oom.py [--mode default|expandable|async] [--step-mib 256] [--max-gib N] [--device D] [--hold-seconds S]
  default     the caching allocator (cudaMalloc underneath)
  expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (cuMemCreate/cuMemMap)
  async       PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (stream-ordered pools)
Output: mode= alloc_conf=, allocated_mib= allocations= stop_reason=oom|max, mem_get_info_free=
mem_get_info_total= memory_reserved= memory_allocated=, result=PASS|FAIL. A clean OOM is
torch.OutOfMemoryError; any other exception fails with error=.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import fail, out  # noqa: E402

CONF = {"default": None, "expandable": "expandable_segments:True",
        "async": "backend:cudaMallocAsync"}

ap = argparse.ArgumentParser()
ap.add_argument("--mode", choices=sorted(CONF), default="default")
ap.add_argument("--step-mib", type=int, default=256)
ap.add_argument("--max-gib", type=float, default=0, help="stop after this much (0 = until OOM)")
ap.add_argument("--device", type=int, default=0)
ap.add_argument("--hold-seconds", type=float, default=0,
                help="keep everything allocated this long after the loop (lets a sampler see the peak)")
args = ap.parse_args()

# Must be set before torch initializes CUDA.
if CONF[args.mode]:
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = CONF[args.mode]
else:
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)

import torch  # noqa: E402

out(mode=args.mode, alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "none"),
    torch=torch.__version__, cuda=torch.version.cuda)
dev = torch.device("cuda", args.device)
step = args.step_mib << 20
held, reason = [], "oom"
try:
    while True:
        if args.max_gib and (len(held) + 1) * step > args.max_gib * (1 << 30):
            reason = "max"
            break
        held.append(torch.empty(step, dtype=torch.uint8, device=dev))
except torch.OutOfMemoryError:
    pass
except Exception as e:  # anything but a clean OOM is a failure
    fail(f"{type(e).__name__}:{str(e).splitlines()[0][:200]}")
if args.hold_seconds:
    import time
    time.sleep(args.hold_seconds)
free, total = torch.cuda.mem_get_info(dev)
out(allocated_mib=len(held) * args.step_mib, allocations=len(held), stop_reason=reason)
out(mem_get_info_free=free, mem_get_info_total=total,
    memory_reserved=torch.cuda.memory_reserved(dev),
    memory_allocated=torch.cuda.memory_allocated(dev))
del held
torch.cuda.empty_cache()
out(result="PASS")
