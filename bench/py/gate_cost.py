"""What the launch gate costs a launch-heavy program: steps/s of a workloads.py KIND without the
hook, with the hook and no cap (fast path), and with the hook at cap 99 (every launch gated,
timed and measured, the budget almost never binding). Interleaved rounds; prints each mode's
median steps/s and its ratio to no hook, with NVML's utilization during the run.
usage: gate_cost.py KIND [SECONDS] [ROUNDS]   (env DIST)"""
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import hook_lib, Nvml, Proc  # noqa: E402

kind = sys.argv[1]
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 8
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
wl = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads.py"), kind]
lib = hook_lib()  # before the first run: a missing library stops here, not after the hook-off one
nvml = Nvml()
rates = {"off": [], "nocap": [], "cap99": []}
utils = {m: [] for m in rates}
for _ in range(rounds):
    for mode in rates:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DEVICE_")}
        env.pop("LD_PRELOAD", None)
        if mode != "off":
            env.update(LD_PRELOAD=lib, CUDA_DEVICE_MEMORY_SHARED_CACHE=tempfile.mktemp(prefix="gc-"))
        if mode == "cap99":
            env["CUDA_DEVICE_SM_LIMIT"] = "99"
        p = Proc(wl, env)
        p.ready.wait(120)
        time.sleep(2)
        t0 = time.monotonic()
        us = []
        while time.monotonic() - t0 < secs:
            time.sleep(1)
            us.append(nvml.util())
        t1 = time.monotonic()
        time.sleep(0.3)
        rates[mode].append((p.at(t1) - p.at(t0)) / (t1 - t0))
        utils[mode].append(sum(us) / len(us))
        p.p.terminate()
        p.p.wait()
base = statistics.median(rates["off"])
for m in rates:
    r = statistics.median(rates[m])
    print(f"gate_cost kind={kind} mode={m} steps_per_s={r:.2f} ratio={r / base:.3f} nvml={statistics.median(utils[m]):.1f} "
          f"rounds={[round(x, 2) for x in rates[m]]}", flush=True)
