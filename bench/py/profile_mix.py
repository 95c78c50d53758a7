"""GPU time of a workload's steps by kind (kernels, memset, memcpy), from the PyTorch profiler
(CUPTI): what NVML may count that the launch hooks do not see.
usage: profile_mix.py KIND   (a kind of workloads.py)"""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

kind = sys.argv[1]
step = workloads.KINDS[kind]()
for _ in range(5):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(5):
        step()
    torch.cuda.synchronize()
tot = {"kernel": 0.0, "memset": 0.0, "memcpy": 0.0}
n = {"kernel": 0, "memset": 0, "memcpy": 0}
for e in prof.events():
    if not str(getattr(e, "device_type", "")).endswith("CUDA"):
        continue
    name = e.name.lower()
    k = "memset" if "memset" in name else "memcpy" if "memcpy" in name else "kernel"
    tot[k] += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
    n[k] += 1
print(f"kind={kind} per_step: " + " ".join(f"{k}_n={n[k] / 5:.0f} {k}_us={tot[k] / 5:.0f}" for k in tot), flush=True)
