"""Does NVML polling slow a program's driver calls? (issue 10's overhead lines: malloc+free with
the hook read 1.022-1.078 between processes, 0.999-1.012 inside one, session 23.)

The hook's monitor thread asks NVML, every 200 ms, for the device's utilization and samples, the
per-process utilization and the compute processes (and each second their memory). This runs a
benchmark command with no hook, alternately alone and beside a thread of this (unhooked) process
making the same NVML calls at the same rate, and prints the median per-round ratio (poller on /
off) of the metric the command prints.

usage: nvml_poll_cost.py ROUNDS METRIC -- CMD...     e.g. 7 malloc_free_ns -- samples/bench_malloc
       nvml_poll_cost.py calls [N]     how long each of those NVML calls takes (median and max of N
                                       rounds, ms; which of them makes a round's 5-9 ms, session 23)
       nvml_poll_cost.py stalls ROUNDS -- CMD...   which call stalls the command's driver calls: CMD
                                       (e.g. samples/bench_malloc --slow-us 1000) runs beside each
                                       call alone once a PERIOD, and beside none, interleaved; prints
                                       the median of its slow_pairs_per_s per call (session 26: one
                                       stall a second is left once the per-process call is gone)
Env: PERIOD_MS (default 200), BURST (NVML calls sets per period, default 1).
"""
import ctypes
import os
import re
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import Nvml  # noqa: E402

PERIOD = float(os.environ.get("PERIOD_MS", "200")) / 1000
BURST = int(os.environ.get("BURST", "1"))


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint), ("ci", ctypes.c_uint)]


class ProcUtil(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("ts", ctypes.c_ulonglong), ("sm", ctypes.c_uint), ("mem", ctypes.c_uint),
                ("enc", ctypes.c_uint), ("dec", ctypes.c_uint)]


def process_utilization(nv):
    n = ctypes.c_uint(0)
    nv.lib.nvmlDeviceGetProcessUtilization(nv.h, None, ctypes.byref(n), ctypes.c_ulonglong(0))
    buf = (ProcUtil * (n.value + 4))()
    n = ctypes.c_uint(n.value + 4)
    nv.lib.nvmlDeviceGetProcessUtilization(nv.h, buf, ctypes.byref(n), ctypes.c_ulonglong(0))


def compute_processes(nv):
    procs = (ProcessInfo * 64)()
    n = ctypes.c_uint(64)
    nv.lib.nvmlDeviceGetComputeRunningProcesses_v3(nv.h, ctypes.byref(n), procs)


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def memory_info(nv):
    m = Memory()
    nv.lib.nvmlDeviceGetMemoryInfo(nv.h, ctypes.byref(m))


# The monitor's calls, in its order: (name, call). Memory info is its growth check's, each second.
CALLS = (
    ("utilization", lambda nv: nv.util()),
    ("samples", lambda nv: nv.samples_since(int(time.time() * 1e6) - 2_000_000)),
    ("process_utilization", process_utilization),
    ("compute_processes", compute_processes),
    ("memory_info", memory_info),
)


def poll_once(nv):
    for _, call in CALLS:
        call(nv)


def calls(n):
    """Each call's own time, rounds PERIOD apart (as the monitor's)."""
    nv = Nvml()
    took = {name: [] for name, _ in CALLS}
    for _ in range(n):
        for name, call in CALLS:
            t0 = time.perf_counter()
            call(nv)
            took[name].append((time.perf_counter() - t0) * 1e3)
        time.sleep(PERIOD)
    for name, ms in took.items():
        print(f"nvml_poll_cost call={name} median_ms={statistics.median(ms):.3f} max_ms={max(ms):.3f} rounds={n}", flush=True)


def metric_of(cmd, metric):
    """Run CMD once; the number it prints as METRIC= (nan when it prints none)."""
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    m = re.search(rf"\b{metric}=([0-9.]+)", out)
    return float(m.group(1)) if m else float("nan")


def stalls(rounds, cmd):
    """CMD's slow_pairs_per_s beside each NVML call alone, once a PERIOD, and beside none."""
    nv = Nvml()
    names = ["none"] + [name for name, _ in CALLS]
    current = ["none"]
    stop = threading.Event()

    def poller():
        while not stop.is_set():
            for name, call in CALLS:
                if name == current[0]:
                    call(nv)
            time.sleep(PERIOD)

    threading.Thread(target=poller, daemon=True).start()
    got = {n: [] for n in names}
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            current[0] = name
            got[name].append(metric_of(cmd, "slow_pairs_per_s"))
            print(f"nvml_poll_cost stalls round={r} call={name} slow_pairs_per_s={got[name][-1]}", flush=True)
    stop.set()
    for name in names:
        print(f"nvml_poll_cost stalls call={name} period_ms={PERIOD * 1000:.0f} slow_pairs_per_s={statistics.median(got[name]):.2f} "
              f"min={min(got[name]):.2f} max={max(got[name]):.2f} rounds={rounds}", flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "calls":
        return calls(int(sys.argv[2]) if len(sys.argv) > 2 else 50)
    if len(sys.argv) > 1 and sys.argv[1] == "stalls":
        sep = sys.argv.index("--")
        return stalls(int(sys.argv[2]), sys.argv[sep + 1:])
    sep = sys.argv.index("--")
    rounds, metric = int(sys.argv[1]), sys.argv[2]
    cmd = sys.argv[sep + 1:]
    nv = Nvml()
    stop = threading.Event()
    on = threading.Event()

    def poller():
        calls = 0
        while not stop.is_set():
            if on.is_set():
                for _ in range(BURST):
                    poll_once(nv)
                    calls += 1
            time.sleep(PERIOD)

    threading.Thread(target=poller, daemon=True).start()
    t0 = time.monotonic()
    poll_once(nv)
    one = time.monotonic() - t0
    vals = {"off": [], "on": []}
    for r in range(rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            (on.set if mode == "on" else on.clear)()
            vals[mode].append(metric_of(cmd, metric))
            print(f"nvml_poll_cost round={r} mode={mode} {metric}={vals[mode][-1]}", flush=True)
    stop.set()
    ratios = [a / b for a, b in zip(vals["on"], vals["off"])]
    print(f"nvml_poll_cost metric={metric} period_ms={PERIOD * 1000:.0f} burst={BURST} one_poll_ms={one * 1000:.2f} "
          f"ratio={statistics.median(ratios):.3f} min={min(ratios):.3f} max={max(ratios):.3f} "
          f"off={statistics.median(vals['off']):.0f} on={statistics.median(vals['on']):.0f}", flush=True)


if __name__ == "__main__":
    main()
