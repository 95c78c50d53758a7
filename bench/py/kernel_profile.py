"""What kernels a framework workload runs, by length (issue 14: a lower-priority container's
kernel that is already running when a higher-priority request arrives delays it by what is left
of it; the GPU time-slices contexts only every ~2 ms). Profiles a few steps of a workloads.py
kind with torch.profiler, without the hook, and prints the share of GPU time and of kernels in
each length bucket, and the longest kernels.
usage: kernel_profile.py [KIND] [STEPS]   (default gpt2 5)"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

kind = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
prof = workloads.profiled(kind, steps, warmup=5)
torch = workloads.torch
kernels = [(e.name, e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
           for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
kernels = [(n, us) for n, us in kernels if us > 0]
total = sum(us for _, us in kernels)
edges = [10, 50, 100, 250, 500, 1000, 2000, float("inf")]
lo = 0
print(f"kernel_profile {kind}: {len(kernels)} kernels in {steps} steps, {total / 1e3:.1f} ms of GPU time ({total / 1e3 / steps:.1f} ms a step)")
for hi in edges:
    sel = [us for _, us in kernels if lo <= us < hi]
    print(f"kernel_profile len_us=[{lo},{hi}) kernels={len(sel)} time_share={sum(sel) / max(total, 1e-9):.3f}")
    lo = hi
longest = sorted(kernels, key=lambda k: -k[1])[:8]
for n, us in longest:
    print(f"kernel_profile longest us={us:.0f} name={n[:100]}")
