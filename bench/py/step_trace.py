"""Where a capped program's GPU idles (issue 10: GPT-2 at cap 99 runs at 0.74-0.97 of its rate
though a cap of 99 should not slow it): profiles STEPS steps of a workloads.py kind with
torch.profiler (CPU and CUDA) after warm-up, and prints, over the profiled window, the GPU's busy
share (union of kernel / memcpy / memset intervals), its gaps by length, and for each gap of at
least 20 us what came before the work that ended it: how long that work's launch call took on the
host (a launch the hook held is a long call) and how long after the call's start the work began.
Run it with and without LD_PRELOAD and compare. With TRACE=PATH it also writes the chrome trace
(gzip) there. Caveat (session 20, H100): CPU profiling makes GPT-2 host-bound (78 ms a step and
the GPU 46% busy without the hook, about 45 ms and 85% unprofiled), so its gaps are the
profiler's more than the hook's.
usage: step_trace.py [KIND] [STEPS]   (default gpt2 20)"""
import gzip
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workloads  # noqa: E402

kind = sys.argv[1] if len(sys.argv) > 1 else "gpt2"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
prof = workloads.profiled(kind, steps, warmup=10, cpu=True)
path = os.environ.get("TRACE") or tempfile.mktemp(suffix=".json")
raw = path[:-3] if path.endswith(".gz") else path
prof.export_chrome_trace(raw)
with open(raw) as f:
    events = json.load(f)["traceEvents"]
if path.endswith(".gz"):
    with open(raw, "rb") as f, gzip.open(path, "wb") as g:
        g.write(f.read())
    os.unlink(raw)
elif not os.environ.get("TRACE"):
    os.unlink(raw)

gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
gpu = sorted((e for e in events if e.get("cat") in gpu_cats and e.get("ph") == "X"), key=lambda e: e["ts"])
launch_by_corr = {}
for e in events:
    if e.get("cat") in ("cuda_runtime", "cuda_driver"):
        c = e.get("args", {}).get("correlation")
        if c is not None:
            launch_by_corr[c] = e
if not gpu:
    sys.exit("step_trace: no GPU events in the trace")
t0, t1 = gpu[0]["ts"], max(e["ts"] + e["dur"] for e in gpu)
busy, end = 0.0, t0
gaps = []  # (gap_us, the GPU event after it)
for e in gpu:
    s, d = e["ts"], e["dur"]
    if s > end:
        gaps.append((s - end, e))
    busy += max(0.0, s + d - max(s, end))
    end = max(end, s + d)
span = t1 - t0
print(f"step_trace {kind}: steps={steps} span_ms={span / 1e3:.1f} step_ms={span / 1e3 / steps:.2f} "
      f"gpu_busy={busy / span:.3f} gpu_events={len(gpu)} hook={'on' if 'libvgpu' in os.environ.get('LD_PRELOAD', '') else 'off'}")
edges = [0, 5, 20, 50, 100, 200, 500, 1000, 2000, float("inf")]
for lo, hi in zip(edges, edges[1:]):
    sel = [g for g, _ in gaps if lo <= g < hi]
    print(f"step_trace gaps_us=[{lo},{hi}) n={len(sel)} idle_ms={sum(sel) / 1e3:.2f} idle_share={sum(sel) / span:.3f}")
# The gaps that matter: what their closing work's launch call did on the host.
held, late, other = [], [], []
for g, e in gaps:
    if g < 20:
        continue
    c = e.get("args", {}).get("correlation")
    call = launch_by_corr.get(c)
    if call is None:
        other.append(g)
        continue
    call_dur = call["dur"]
    start_after_call = e["ts"] - call["ts"]
    # A long call ending just before the work began: the call (the hook's hold) made the gap.
    (held if call_dur >= 0.5 * g else late).append((g, call_dur, start_after_call, call["name"]))
for name, sel in (("long_launch_call", held), ("host_late", late)):
    print(f"step_trace gaps>=20us cause={name} n={len(sel)} idle_ms={sum(x[0] for x in sel) / 1e3:.2f}")
print(f"step_trace gaps>=20us cause=no_launch_found n={len(other)} idle_ms={sum(other) / 1e3:.2f}")
for g, cd, sa, n in sorted(held + late, key=lambda x: -x[0])[:12]:
    print(f"step_trace gap_us={g:.0f} launch_call_us={cd:.0f} work_after_call_start_us={sa:.0f} call={n}")
