"""Where NVML's busy time comes from: for one workload under the hook (cap 99, gate on), compare
over the same steady window (a) host NVML device utilization, (b) libvgpu's own charged busy time
from the region, (c) the union of every kernel/memset/memcpy interval CUPTI saw (PyTorch profiler).
If (c) matches NVML, libvgpu's events miss GPU work; if (c) matches own, NVML counts more than
kernel execution.
usage: gap_probe.py KIND [SECONDS]   (KIND of workloads.py; run with LD_PRELOAD and a region set)"""
import os
import sys
import threading
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402
from share import Nvml, own_busy_ns  # noqa: E402

kind = sys.argv[1]
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
region = os.environ.get("CUDA_DEVICE_MEMORY_SHARED_CACHE", "")
step = workloads.KINDS[kind]()
nvml = Nvml()
t_end = time.monotonic() + 5
while time.monotonic() < t_end:
    step()
torch.cuda.synchronize()

samples, stop = [], threading.Event()


def sampler():
    while not stop.wait(0.5):
        samples.append(nvml.util())


with profile(activities=[ProfilerActivity.CUDA]) as prof:
    b0, t0 = own_busy_ns(region) if region else 0, time.monotonic()
    th = threading.Thread(target=sampler)
    th.start()
    steps = 0
    while time.monotonic() - t0 < secs:
        step()
        steps += 1
    torch.cuda.synchronize()
    t1 = time.monotonic()
    b1 = own_busy_ns(region) if region else 0
    stop.set()
    th.join()
ivs, kinds = [], {}
for e in prof.events():
    if not str(getattr(e, "device_type", "")).endswith("CUDA"):
        continue
    tr = e.time_range
    ivs.append((tr.start, tr.end))
    name = e.name.lower()
    k = "memset" if "memset" in name else "memcpy" if "memcpy" in name else "kernel"
    kinds[k] = kinds.get(k, 0) + 1
ivs.sort()
union, cur_s, cur_e, gaps = 0.0, None, None, []
for s, e in ivs:
    if cur_e is None or s > cur_e:
        if cur_e is not None:
            union += cur_e - cur_s
            gaps.append(s - cur_e)
        cur_s, cur_e = s, e
    else:
        cur_e = max(cur_e, e)
if cur_e is not None:
    union += cur_e - cur_s
span_us = (ivs[-1][1] - ivs[0][0]) if ivs else 0
gaps.sort()
small = sum(g for g in gaps if g < 10)
med_gap = gaps[len(gaps) // 2] if gaps else 0
print(f"gap_probe kind={kind} steps={steps} wall_s={t1 - t0:.2f} events={kinds} "
      f"cupti_union={100 * union / span_us:.1f} own={100 * (b1 - b0) / 1e9 / (t1 - t0):.1f} "
      f"nvml={sum(samples[1:]) / max(1, len(samples) - 1):.1f} gaps={len(gaps)} median_gap_us={med_gap:.1f} "
      f"gap_time_under_10us={100 * small / span_us:.1f} nvml_samples={samples}", flush=True)
