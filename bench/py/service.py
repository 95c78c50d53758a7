"""A latency-critical inference service for the priority benchmark (issue 14): batch-1 ResNet-50
forward (a few ms of GPU time) replayed from a CUDA graph; requests arrive at random (exponential
gaps, mean MEAN_MS); each request's latency is measured from its arrival to its result.
usage: service.py SECONDS [MEAN_MS]   prints `service requests= p50_ms= p90_ms= p99_ms= max_ms= busy_ms_per_req=`"""
import random
import sys
import time

import torch

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import workloads  # noqa: E402

secs = float(sys.argv[1])
mean_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
step = workloads.graph()  # replay + synchronize
for _ in range(20):
    step()
# GPU time of one request alone (the service's own busy time per request).
t = time.monotonic()
for _ in range(50):
    step()
busy_ms = (time.monotonic() - t) / 50 * 1e3
rng = random.Random(1)
lat, t0 = [], time.monotonic()
arrival = t0
while arrival - t0 < secs:
    arrival += rng.expovariate(1.0 / mean_ms) * 1e-3
    now = time.monotonic()
    if arrival > now:
        time.sleep(arrival - now)
    step()
    lat.append((time.monotonic() - arrival) * 1e3)
lat.sort()
p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
print(f"service requests={len(lat)} p50_ms={p(0.50):.2f} p90_ms={p(0.90):.2f} p99_ms={p(0.99):.2f} max_ms={lat[-1]:.2f} "
      f"busy_ms_per_req={busy_ms:.2f}", flush=True)
