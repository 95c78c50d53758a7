"""Does a duty cycle of long bursts let the power limit slow a compute-bound program as it does
uncapped? (issue 10: the matmul and JAX run at 1380-1635 MHz uncapped, 1980 MHz capped, so their
throughput under a cap beats cap/u0 by 10-18% while the utilization sits on the cap.)

Runs a PyTorch bf16 8192^3 matmul loop without the hook: uncapped, then in bursts of B ms every
P ms (the host sleeps between), for each (B, P). For each it prints the SM clock during the
bursts (NVML, polled every 5 ms), NVML's utilization (samples of the run), and the matmuls per
busy second relative to uncapped (1.0: the cap would cost exactly cap/u0).
usage: duty_clock.py [--seconds 6] [--duty 4/16,25/100,50/200,100/400,50/100,250/1000]
"""
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import Nvml  # noqa: E402


def clocks_during(nvml, stop, out):
    """(time, SM clock MHz) every 5 ms until `stop`."""
    import ctypes
    clk = ctypes.c_uint()
    while not stop.is_set():
        if nvml.lib.nvmlDeviceGetClockInfo(nvml.h, 1, ctypes.byref(clk)) == 0:  # NVML_CLOCK_SM
            out.append((time.monotonic(), clk.value))
        time.sleep(0.005)


def run(torch, a, b, c, seconds, burst_ms=None, period_ms=None):
    """Matmuls done, GPU-busy seconds and the bursts' (start, end) over `seconds`."""
    done, busy, bursts = 0, 0.0, []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        t0 = time.monotonic()
        limit = t0 + (burst_ms / 1000 if burst_ms else 0.25)
        while time.monotonic() < limit:
            torch.matmul(a, b, out=c)
            torch.cuda.synchronize()
            done += 1
        t1 = time.monotonic()
        busy += t1 - t0
        bursts.append((t0, t1))
        if period_ms:
            time.sleep(max(0.0, t0 + period_ms / 1000 - time.monotonic()))
    return done, busy, bursts


def main():
    a = sys.argv[1:]
    o = dict(zip(a[::2], a[1::2]))
    seconds = float(o.get("--seconds", "6"))
    duties = [tuple(float(x) for x in d.split("/")) for d in o.get("--duty", "4/16,25/100,50/200,100/400,50/100,250/1000").split(",")]
    if os.environ.get("LD_PRELOAD"):
        print("duty_clock: run it without the hook (LD_PRELOAD is set)")
        sys.exit(2)
    import torch
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    z = torch.empty_like(x)
    for _ in range(20):
        torch.matmul(x, y, out=z)
    torch.cuda.synchronize()
    nvml = Nvml()
    base = None
    for burst, period in [(None, None)] + duties:
        clk, stop = [], threading.Event()
        th = threading.Thread(target=clocks_during, args=(nvml, stop, clk))
        since = int(time.time() * 1e6)
        th.start()
        done, busy, bursts = run(torch, x, y, z, seconds, burst, period)
        stop.set()
        th.join()
        samples = [v for _, v in nvml.samples_since(since)]
        per_busy = done / busy
        base = base or per_busy
        name = "uncapped" if burst is None else f"burst_ms={burst:g} period_ms={period:g}"
        # Only what the clock was while a burst ran (a burst's first 2 ms: the clock still moving).
        busy_clk = [c for t, c in clk if any(b0 + 0.002 <= t <= b1 for b0, b1 in bursts)] or [0]
        print(f"duty {name} duty_pct={100 * busy / seconds:.1f} nvml_util={statistics.mean(samples) if samples else -1:.1f} "
              f"sm_mhz_median={statistics.median(busy_clk):.0f} sm_mhz_min={min(busy_clk)} "
              f"matmuls_per_busy_s={per_busy:.1f} vs_uncapped={per_busy / base:.3f}", flush=True)


if __name__ == "__main__":
    main()
