"""What the launch gate costs a launch-heavy program: steps/s of a workloads.py KIND without the
hook, with the hook and no cap (fast path), and with the hook at cap 99 (every launch gated,
timed and measured, the budget almost never binding). Interleaved rounds; prints each mode's
median steps/s and its ratio to no hook, with NVML's utilization during the run.
With ALT=PATH (another build of the hook) each round also runs it (`alt_nocap`, `alt_cap99`), and
the last line compares the two builds round by round (GPT-2's cap-99 ratio moves 0.74-1.02
between rounds on an H100: only pairs in one round tell builds apart). MODES narrows the modes
run (`off` is always run: the ratios are to it).
usage: gate_cost.py KIND [SECONDS] [ROUNDS]   (env DIST, ALT, MODES)"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import hook_lib, mode_env, Nvml, Proc  # noqa: E402

kind = sys.argv[1]
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 8
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2
wl = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads.py"), kind]
hook_lib()  # before the first run: a missing library stops here, not after the hook-off one
nvml = Nvml()
alt = os.environ.get("ALT")
if alt and not os.path.isfile(alt):
    sys.exit(f"error=no_alt_library path={alt}")
modes = os.environ.get("MODES", "nocap cap99" + (" alt_nocap alt_cap99" if alt else "")).split()
if set(modes) - {"off", "nocap", "cap99", "alt_nocap", "alt_cap99"}:
    sys.exit(f"gate_cost.py: MODES={' '.join(modes)!r}: known modes are off nocap cap99 alt_nocap alt_cap99")
if any(m.startswith("alt_") for m in modes) and not alt:
    sys.exit("gate_cost.py: MODES names alt_ modes but ALT is not set")
rates = {m: [] for m in ["off"] + [m for m in modes if m != "off"]}
utils = {m: [] for m in rates}
for _ in range(rounds):
    for mode in rates:
        p = Proc(wl, mode_env(mode, alt, "gc-"))
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
        # Each run as it ends: a call cut off by its time limit still leaves the rounds it ran.
        print(f"gate_cost round={len(rates[mode])} mode={mode} steps_per_s={rates[mode][-1]:.2f} nvml={utils[mode][-1]:.1f}", flush=True)
base = statistics.median(rates["off"])
for m in rates:
    r = statistics.median(rates[m])
    # Also the median of per-round ratios: each round's own no-hook run is its baseline.
    per_round = statistics.median(x / o for x, o in zip(rates[m], rates["off"]))
    print(f"gate_cost kind={kind} mode={m} steps_per_s={r:.2f} ratio={r / base:.3f} round_ratio={per_round:.3f} "
          f"nvml={statistics.median(utils[m]):.1f} rounds={[round(x, 2) for x in rates[m]]}", flush=True)
if "cap99" in rates and "alt_cap99" in rates:
    pairs = [a / b for a, b in zip(rates["alt_cap99"], rates["cap99"])]
    print(f"gate_cost kind={kind} alt_over_main_cap99 median={statistics.median(pairs):.3f} "
          f"min={min(pairs):.3f} max={max(pairs):.3f} better_in={sum(x > 1 for x in pairs)}/{len(pairs)}", flush=True)
