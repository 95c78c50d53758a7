"""Where a framework's 1-s utilization dips come from: NVML's own samples and the program's
progress, side by side, second by second (issue 10: GPT-2's 1-s readings under a cap fell to
25-45 while its uncapped ones stayed at 71-96).

Each mode starts the workload fresh, waits WARM s after its first progress line, then for SECS s
reads a utilization snapshot each second (as share.py judges) and every NVML sample
(nvmlDeviceGetSamples), and the steps the program finished that second. A second whose snapshot
is more than 15 points under the mode's mean is listed with its NVML samples and steps: a dip
with the steps still coming is a measurement effect; one where the steps stop too is a stall.

Each second also reads the container's bucket in the region every 5 ms: the fraction of the
second its budget was closed (`closed`), its lowest balance (ms) and the charge scale.

usage: dip_probe.py KIND SECS MODE...   MODE: off | nocap | capN | switchN (start uncapped, the cap
       set at run time with shrreg-tool as share.py does; switchA_B: A for 11 s, then B), each also
       alt_... (ALT=another build)
Env: DIST, LIBVGPU, ALT, WARM (default 4), DEBUG (set: the hook's debug log, kept in $OUT; with STAMP
set each line begins with when it came, time.monotonic(), as the series' t0),
OUT (dip_probe.jsonl and logs), FAST_MS (set: also poll the reading every FAST_MS ms, to see what
each ~100-ms window of the step reads, not only the one the 1-s snapshot lands on: per second its
lowest and highest value, and over the run the spread of every value polled).
"""
import json
import mmap
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import DIST, CHARGE_SCALE_OFFSET as SCALE, LIMITER_STATE_OFFSET as STATE, mode_env, Nvml, Proc  # noqa: E402

WARM = float(os.environ.get("WARM", "4"))
# Fields of device 0's SharedDeviceState in the region (libvgpu/core/src/limiter/mod.rs):
# tokens_ns, closed_until_ns, charge_scale_milli.
TOKENS, CLOSED = STATE, STATE + 64


class BucketWatch:
    """Reads the region's bucket every 5 ms: (monotonic ns, closed, tokens ns, scale)."""

    def __init__(self, region):
        self.region, self.rows, self.stop = region, [], False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        m = None
        while not self.stop:
            time.sleep(0.005)
            try:
                if m is None:
                    with open(self.region, "rb") as f:
                        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                rd = lambda o, s=False: int.from_bytes(m[o:o + 8], "little", signed=s)  # noqa: E731
                now = time.monotonic_ns()
                self.rows.append((now, rd(CLOSED) > now, rd(TOKENS, True), rd(SCALE)))
            except (OSError, ValueError):
                m = None

    def second(self, a_ns, b_ns):
        r = [x for x in self.rows if a_ns <= x[0] < b_ns]
        if not r:
            return {}
        return dict(closed=round(sum(x[1] for x in r) / len(r), 2), min_tokens_ms=round(min(x[2] for x in r) / 1e6, 1),
                    scale=r[-1][3])


class ReadingPoll:
    """Polls nvmlDeviceGetUtilizationRates every `ms` ms: [(monotonic ns, value)]."""

    def __init__(self, nvml, ms):
        self.nvml, self.ms, self.rows, self.stop = nvml, ms, [], False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self.stop:
            self.rows.append((time.monotonic_ns(), self.nvml.util()))
            time.sleep(self.ms / 1000)

    def second(self, a_ns, b_ns):
        v = [x[1] for x in self.rows if a_ns <= x[0] < b_ns]
        return dict(poll_min=min(v), poll_max=max(v)) if v else {}


def quantiles(v):
    v = sorted(v)
    return [v[min(len(v) - 1, int(q * len(v)))] for q in (0.05, 0.25, 0.5, 0.75, 0.95)] + [v[-1]] if v else []


def run(kind, secs, mode, nvml):
    if mode.startswith("alt_") and not os.environ.get("ALT"):
        sys.exit(f"mode={mode} error=alt_mode_without_ALT")
    env = mode_env(mode, os.environ.get("ALT"), "dip-")
    if os.environ.get("DEBUG") and mode != "off":
        env["LIBCUDA_LOG_LEVEL"] = "4"
    region = env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    p = Proc([sys.executable, f"{DIST}/bench/py/workloads.py", kind], env)
    if not p.ready.wait(300):
        sys.exit(f"mode={mode} error=no_progress log={''.join(p.log)[-1500:]!r}")
    watch = BucketWatch(region) if region else None
    fast = ReadingPoll(nvml, float(os.environ["FAST_MS"])) if os.environ.get("FAST_MS") else None
    time.sleep(WARM)
    if mode.removeprefix("alt_").startswith("switch"):
        # switchA_B: A first for 11 s (share.py's warm-up and window at each cap), then B
        caps = mode.removeprefix("alt_")[6:].split("_")
        for i, cap in enumerate(caps):
            if i:
                time.sleep(11.0)
            subprocess.run([f"{DIST}/tools/shrreg-tool", "--file", region, "--set-sm-limit", "0", cap],
                           check=True, capture_output=True)
        time.sleep(3.0)
    t0, seen = time.monotonic(), int(time.time() * 1e6)
    rows = []
    for _ in range(int(secs)):
        a = time.monotonic()
        time.sleep(max(0.0, t0 + len(rows) + 1 - a))
        b = time.monotonic()
        got = nvml.samples_since(seen)
        seen = max([seen] + [ts for ts, _ in got])
        rows.append(dict(snap=nvml.util(), fine=[v for _, v in sorted(got)], steps=round(p.at(b) - p.at(b - 1.0), 2),
                         **(watch.second(int((b - 1.0) * 1e9), int(b * 1e9)) if watch else {}),
                         **(fast.second(int((b - 1.0) * 1e9), int(b * 1e9)) if fast else {})))
    if fast:
        fast.stop = True
        mine = [(t, v) for t, v in fast.rows if int(t0 * 1e9) <= t]
        # Every polled value, (ms from the first second's start, percent), in the JSON record.
        rows.append(dict(polled=quantiles([v for _, v in mine]), t0=round(t0, 4), series=[(round((t - t0 * 1e9) / 1e6), v) for t, v in mine]))
    time.sleep(0.3)
    if watch:
        watch.stop = True
    p.p.terminate()
    p.p.wait(20)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"dip-{kind}-{mode}-{p.p.pid}.log"), "w") as f:
            f.write("".join(p.log))
    return rows


def main():
    kind, secs, modes = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
    nvml = Nvml()
    for mode in modes:
        rows = run(kind, secs, mode, nvml)
        fast = rows.pop() if rows and "polled" in rows[-1] else {}
        polled = fast.get("polled")
        snaps = [r["snap"] for r in rows]
        fine = [v for r in rows for v in r["fine"]]
        mean = sum(snaps) / len(snaps)
        steps = sum(r["steps"] for r in rows) / len(rows)
        closed = [r.get("closed", 0) for r in rows]
        print(f"dip_probe kind={kind} mode={mode} snap_mean={mean:.1f} fine_mean={sum(fine) / max(1, len(fine)):.1f} "
              f"steps_per_s={steps:.2f} closed_mean={sum(closed) / len(closed):.3f} snaps={snaps}"
              f" scales={[r.get('scale') for r in rows]}", flush=True)
        if polled:
            print(f"  polled every {os.environ['FAST_MS']} ms: p5/p25/p50/p75/p95/max={polled}"
                  f" per-second [min,max]={[[r.get('poll_min'), r.get('poll_max')] for r in rows]}", flush=True)
        for i, r in enumerate(rows):
            if r["snap"] < mean - 15:
                print(f"  dip s={i} snap={r['snap']} fine={r['fine']} steps={r['steps']} (mean {steps:.2f}) "
                      f"closed={r.get('closed')} min_tokens_ms={r.get('min_tokens_ms')} scale={r.get('scale')}", flush=True)
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "dip_probe.jsonl"), "a") as f:
                f.write(json.dumps(dict(kind=kind, mode=mode, rows=rows, polled=polled, series=fast.get("series"))) + "\n")


if __name__ == "__main__":
    main()
