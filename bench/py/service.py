"""A latency-critical inference service for the priority benchmark (issue 14): batch-1 ResNet-50
forward (a few ms of GPU time) replayed from a CUDA graph; requests arrive at random (exponential
gaps, mean MEAN_MS); each request's latency is measured from its arrival to its result.
usage: service.py SECONDS [MEAN_MS]   prints `service requests= p50_ms= p90_ms= p99_ms= max_ms= busy_ms_per_req=`
and `service_parts`: where the latency went, per request: `queued` (arrived while the previous
one was still being served: waited behind it on the CPU), `gpu` (from the GPU reaching the
request's first kernel to its last one ending, CUDA events: the request's own run, with whatever
ran between its kernels), `outside` (launch to result minus `gpu`: the launch, the wait for the GPU
to switch to us, the synchronize's wake-up); p50/p99 of each, over all requests and over the
requests that arrived to an idle service (`fresh_`)."""
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
ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
lat, parts, t0 = [], [], time.monotonic()
arrival = t0
while arrival - t0 < secs:
    arrival += rng.expovariate(1.0 / mean_ms) * 1e-3
    now = time.monotonic()
    if arrival > now:
        time.sleep(arrival - now)
    launch = time.monotonic()
    step(ev0, ev1)
    done = time.monotonic()
    gpu = ev0.elapsed_time(ev1)
    lat.append((done - arrival) * 1e3)
    parts.append(dict(queued=(launch - arrival) * 1e3, gpu=gpu, outside=(done - launch) * 1e3 - gpu, fresh=arrival > now))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


p = lambda q: pct(lat, q)  # noqa: E731
print(f"service requests={len(lat)} p50_ms={p(0.50):.2f} p90_ms={p(0.90):.2f} p99_ms={p(0.99):.2f} max_ms={max(lat):.2f} "
      f"busy_ms_per_req={busy_ms:.2f}", flush=True)
fresh = [x for x in parts if x["fresh"]]
line = f"service_parts fresh={len(fresh)}"
for k in ("queued", "gpu", "outside"):
    for q in (0.50, 0.99):
        line += f" {k}_p{int(q * 100)}_ms={pct([x[k] for x in parts], q):.3f}"
for k in ("gpu", "outside"):
    for q in (0.50, 0.99):
        line += f" fresh_{k}_p{int(q * 100)}_ms={pct([x[k] for x in fresh], q):.3f}"
print(line, flush=True)
