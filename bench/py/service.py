"""A latency-critical inference service for the priority benchmark (issue 14): batch-1 ResNet-50
forward (a few ms of GPU time) replayed from a CUDA graph; requests arrive at random (exponential
gaps, mean MEAN_MS); each request's latency is measured from its arrival to its result.
usage: service.py SECONDS [MEAN_MS]   (env LINGER_US, LINGER_END: see below; SYNC=device|stream|event: how a request's
result is waited for, `workloads.graph`; device, a context synchronize, by default)   prints `service requests= p50_ms= p90_ms= p99_ms= max_ms= busy_ms_per_req=`
and `service_parts`: where the latency went, per request: `queued` (arrived while the previous
one was still being served: waited behind it on the CPU), `gpu` (from the GPU reaching the
request's first kernel to its last one ending, CUDA events: the request's own run, with whatever
ran between its kernels), `outside` (launch to result minus `gpu`: the launch, the wait for the GPU
to switch to us, the synchronize's wake-up). It gives the latency p50/p99 of the requests that
arrived to an idle service (`fresh_lat_`) and of the others (`queued_lat_`); p50/p99 of each
part; and the tail, the requests at or above the latency p99: how many, how many of them fresh,
and the mean of each part over them (`tail_`). nan where a group is empty. `service_slowest`: the
three slowest requests, each with its launch's wall time and parts."""
import random
import sys
import time

import torch

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import workloads  # noqa: E402

secs = float(sys.argv[1])
# An experiment, off by default: LINGER_US=N spins one GPU thread N us (at 1.98 GHz) after each
# request on a side stream, so a request arriving within N us finds this context still on the GPU.
linger_cycles = int(float(__import__("os").environ.get("LINGER_US", "0")) * 1980)
# LINGER_END=fixed|pre|post: the spin runs its length (fixed, default), or the next request ends
# it before (pre) or after (post) its replay is queued (workloads.word_linger; needs CuPy).
linger_end = __import__("os").environ.get("LINGER_END", "fixed")
if linger_end not in ("fixed", "pre", "post"):
    sys.exit(f"service.py: LINGER_END={linger_end!r}: want fixed, pre or post")
mean_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
sync = __import__("os").environ.get("SYNC", "device")
if sync not in ("device", "stream", "event"):
    sys.exit(f"service.py: SYNC={sync!r}: want device, stream or event")
step = workloads.graph()  # replay + synchronize
for _ in range(20):
    step(sync=sync)
# GPU time of one request alone (the service's own busy time per request).
t = time.monotonic()
for _ in range(50):
    step(sync=sync)
busy_ms = (time.monotonic() - t) / 50 * 1e3
rng = random.Random(1)
ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
for _ in range(5 if linger_cycles else 0):
    step(ev0, ev1, linger_cycles, sync, linger_end)  # the linger's stream (and CuPy's build) made now
lat, parts, t0 = [], [], time.monotonic()
arrival = t0
while arrival - t0 < secs:
    arrival += rng.expovariate(1.0 / mean_ms) * 1e-3
    now = time.monotonic()
    if arrival > now:
        time.sleep(arrival - now)
    launch, launch_wall = time.monotonic(), time.time()
    step(ev0, ev1, linger_cycles, sync, linger_end)
    done = time.monotonic()
    gpu = ev0.elapsed_time(ev1)
    lat.append((done - arrival) * 1e3)
    parts.append(dict(lat=lat[-1], queued=(launch - arrival) * 1e3, gpu=gpu, outside=(done - launch) * 1e3 - gpu, fresh=arrival > now,
                      at=launch_wall))


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def avg(xs):
    return sum(xs) / len(xs) if xs else float("nan")


p = lambda q: pct(lat, q)  # noqa: E731
print(f"service requests={len(lat)} p50_ms={p(0.50):.2f} p90_ms={p(0.90):.2f} p99_ms={p(0.99):.2f} "
      f"max_ms={max(lat, default=float('nan')):.2f} busy_ms_per_req={busy_ms:.2f}", flush=True)
fresh = [x for x in parts if x["fresh"]]
queued = [x for x in parts if not x["fresh"]]
tail = [x for x in parts if x["lat"] >= p(0.99)]
line = f"service_parts fresh={len(fresh)} queued={len(queued)}"
for name, group in (("fresh_lat", fresh), ("queued_lat", queued)):
    line += f" {name}_p50_ms={pct([x['lat'] for x in group], 0.50):.3f} {name}_p99_ms={pct([x['lat'] for x in group], 0.99):.3f}"
for k in ("queued", "gpu", "outside"):
    line += f" {k}_p50_ms={pct([x[k] for x in parts], 0.50):.3f} {k}_p99_ms={pct([x[k] for x in parts], 0.99):.3f}"
line += f" tail={len(tail)} tail_fresh={sum(x['fresh'] for x in tail)}"
for k in ("queued", "gpu", "outside"):
    line += f" tail_{k}_ms={avg([x[k] for x in tail]):.3f}"
print(line, flush=True)
# The slowest requests, with their launch's wall time (to set beside other logs: a stall).
for x in sorted(parts, key=lambda x: -x["lat"])[:3]:
    print(f"service_slowest at_unix={x['at']:.3f} lat_ms={x['lat']:.3f} queued_ms={x['queued']:.3f} "
          f"gpu_ms={x['gpu']:.3f} outside_ms={x['outside']:.3f} fresh={int(x['fresh'])}", flush=True)
