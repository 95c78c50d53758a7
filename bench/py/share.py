"""Compute share of a real program under caps, judged by an independent observer.

Runs a workload under libvgpu (LD_PRELOAD) and switches its container's cap at run time with
shrreg-tool: first no cap (u0 = its uncapped utilization and throughput), then each cap in turn.
For every phase, after a warm-up, it samples the device utilization from NVML each second (this
process is not hooked: host NVML) and reads the workload's throughput from its `progress t= n=`
lines (n = cumulative work units). Pass when, for each cap c:
  mean utilization within 3 points of min(c, u0), every 1-s sample within 8,
  throughput within 5% (relative) of min(1, c/u0) of the uncapped throughput.

usage: share.py --name NAME [--caps 25,50] [--procs N] [--fresh RUNS] [--per-second fine] -- CMD ARGS...
  --procs N    run N copies of CMD in one container (one region); throughput is their sum
  --fresh R    instead of switching at run time, start R fresh processes per cap (each with
               CUDA_DEVICE_SM_LIMIT set) and judge every run on its own
  --per-second fine   judge each second by the mean of NVML's own samples within it (default:
               the snapshot nvmlDeviceGetUtilizationRates gives at its end)
Env: DIST (libvgpu.so, tools/shrreg-tool), LIBVGPU (another build of the hook to preload), WARM (s, default 2.5), MEASURE (s, default 4),
OUT (a JSON line per phase is appended to $OUT/share.jsonl), SHARE_LOGS (a directory: each
workload's output is kept there), SERIES (set: each record also lists every NVML sample of its window).
"""
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

DIST = os.environ.get("DIST", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def hook_lib():
    """The hook to preload: $LIBVGPU or $DIST/libvgpu.so. A path that is not there would make
    ld.so print one line and run every 'hooked' program without the hook: stop instead."""
    lib = os.environ.get("LIBVGPU") or f"{DIST}/libvgpu.so"
    if not os.path.isfile(lib):
        sys.exit(f"error=no_hook_library path={lib} (set DIST to the dist/ tree, or LIBVGPU)")
    return lib
WARM = float(os.environ.get("WARM", "2.5"))
# `--per-second fine`: judge each second by the mean of NVML's own samples within it, not by the
# one snapshot taken at its end (kept as `snapshots`). For a bursty program under a cap it never
# reaches: uncapped GPT-2 with no hook at all read snapshots of 43-89 around a mean of 71 on an
# H100 (bench/py/dip_probe.py, session 23), so no build can keep every snapshot within 8 points.
PER_SECOND_FINE = False
MEASURE = float(os.environ.get("MEASURE", "4"))


class NvmlSample(ctypes.Structure):
    _fields_ = [("ts", ctypes.c_ulonglong), ("value", ctypes.c_ulonglong)]  # nvmlSample_t (value: a union)


class Nvml:
    """Device utilization straight from libnvidia-ml (never through the hook)."""

    def __init__(self, index=0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0, "nvmlInit failed"
        self.h = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.h)) == 0

    def util(self):
        u = (ctypes.c_uint * 2)()
        assert self.lib.nvmlDeviceGetUtilizationRates(self.h, u) == 0
        return u[0]

    def samples_since(self, since_us):
        """NVML's own utilization samples (nvmlDeviceGetSamples, GPU_UTILIZATION) newer than
        since_us: [(timestamp_us, percent)]. Each covers one of NVML's internal sample periods
        (much shorter than a second on an H100), so their mean over a window is the window's
        utilization, where one nvmlDeviceGetUtilizationRates reading a second is a snapshot."""
        vtype, n = ctypes.c_int(), ctypes.c_uint(0)
        get = self.lib.nvmlDeviceGetSamples
        if get(self.h, 1, ctypes.c_ulonglong(since_us), ctypes.byref(vtype), ctypes.byref(n), None) != 0 or n.value == 0:
            return []
        buf = (NvmlSample * n.value)()
        if get(self.h, 1, ctypes.c_ulonglong(since_us), ctypes.byref(vtype), ctypes.byref(n), buf) != 0:
            return []
        return [(x.ts, x.value & 0xFFFFFFFF) for x in buf[: n.value] if x.ts > since_us]

    def sm_clock_mhz(self):
        c = ctypes.c_uint()
        return c.value if self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(c)) == 0 else 0


# Where the region keeps device 0's limiter state (SharedDeviceState, libvgpu/core/src/limiter/
# mod.rs), and its seventh field: total busy ns the container charged (libvgpu's own view, kept
# beside NVML's to tell a measurement gap from a control gap).
LIMITER_STATE_OFFSET = 2_009_536
TOTAL_BUSY_OFFSET = LIMITER_STATE_OFFSET + 48
CHARGE_SCALE_OFFSET = LIMITER_STATE_OFFSET + 88  # charge_scale_milli (limiter/mod.rs)


def region_u64(region, offset):
    """A word of device 0's limiter state in the region (0 where it cannot be read)."""
    try:
        with open(region, "rb") as f:
            f.seek(offset)
            return int.from_bytes(f.read(8), "little")
    except OSError:
        return 0


def own_busy_ns(region):
    return region_u64(region, TOTAL_BUSY_OFFSET)


class Proc:
    """A workload process; collects its progress lines."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.points = []  # (t, n)
        self.ready = threading.Event()
        self.log = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        stamp = bool(os.environ.get("STAMP"))  # each line prefixed with its arrival (monotonic s)
        for line in self.p.stdout:
            self.log.append(f"{time.monotonic():.4f} {line}" if stamp else line)
            if line.startswith("progress "):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                self.points.append((float(kv["t"]), float(kv["n"])))
                self.ready.set()
        self.ready.set()

    def at(self, t):
        """Cumulative work at time t (linear between progress points)."""
        pts = self.points
        if not pts or t <= pts[0][0]:
            return pts[0][1] if pts else 0.0
        for (t0, n0), (t1, n1) in zip(pts, pts[1:]):
            if t0 <= t <= t1:
                return n0 + (n1 - n0) * (t - t0) / max(t1 - t0, 1e-9)
        return pts[-1][1]


def shrreg(region, *args):
    subprocess.run([f"{DIST}/tools/shrreg-tool", "--file", region, *args], check=True, capture_output=True)


LAST = {}
TRACE = {}


def measure(nvml, procs, region=None):
    """Warm up, then sample NVML each second for MEASURE s; returns (utils, throughput/s).
    Also keeps in LAST the mean SM clock, libvgpu's own utilization, and the mean of every sample
    NVML took in the window (nvml_win; nvml_n samples, their period nvml_ms)."""
    time.sleep(WARM)
    t0, w0 = time.monotonic(), int(time.time() * 1e6)
    b0 = own_busy_ns(region) if region else 0
    utils, clocks, win, seen = [], [], [], w0
    fine = []  # each second's mean of NVML's own samples (`--per-second fine`)
    scales = []  # each second's charge scale (x1000) in the region: did the calibration move?
    while time.monotonic() - t0 < MEASURE - 0.01:
        time.sleep(1.0)
        utils.append(nvml.util())
        clocks.append(nvml.sm_clock_mhz())
        got = nvml.samples_since(seen)
        win += got
        fine.append(round(sum(v for _, v in got) / len(got), 1) if got else utils[-1])
        seen = max([seen] + [ts for ts, _ in got])
        if region:
            scales.append(region_u64(region, CHARGE_SCALE_OFFSET))
    # Kept in the JSON record only, beside the 1-s readings: a reading that leaves NVML's own
    # samples of its second, or a step of the scale, is how a failed phase explains itself.
    TRACE.update(fine=fine, scales=scales)
    t1 = time.monotonic()
    b1 = own_busy_ns(region) if region else 0
    if PER_SECOND_FINE:
        LAST.update(snapshots=utils)
        utils = fine
    time.sleep(0.3)  # the next progress line brackets t1
    work = sum(p.at(t1) - p.at(t0) for p in procs)
    LAST.update(sm_mhz=round(sum(clocks) / len(clocks)), own_util=round(100 * (b1 - b0) / 1e9 / (t1 - t0), 1))
    if len(win) >= 2:
        ts = sorted(t for t, _ in win)
        LAST.update(nvml_win=round(sum(v for _, v in win) / len(win), 1), nvml_n=len(win),
                    nvml_ms=round((ts[-1] - ts[0]) / 1000 / (len(ts) - 1), 1))
        if os.environ.get("SERIES"):
            # Every NVML sample of the window, (ms after the window began, percent): how the
            # share moved within it (a burst cycle, a calibration step).
            LAST.update(series=[(round((t - w0) / 1000), v) for t, v in sorted(win)])
    else:
        LAST.update(nvml_win=None, nvml_n=len(win), nvml_ms=None)
    return utils, work / (t1 - t0)


def uncapped_util(snapshots):
    """u0, the program's uncapped utilization: the mean of every sample NVML took in the window
    when it took several a second (a bursty program's one-a-second snapshots scatter by tens of
    points: GPT-2 read 93, 26, 76, 51), else the snapshots' mean."""
    if LAST.get("nvml_win") is not None and LAST["nvml_n"] >= 2 * len(snapshots):
        return LAST["nvml_win"]
    return sum(snapshots) / len(snapshots)


def judge(name, cap, u0, k0, utils, k, extra=None):
    u = sum(utils) / len(utils)
    want_u = min(cap, u0)
    want_k = min(1.0, cap / u0) if u0 > 0 else 1.0
    tput = k / k0 if k0 > 0 else 0.0
    ok_u = abs(u - want_u) <= 3.0 and all(abs(x - want_u) <= 8.0 for x in utils)
    ok_k = want_k > 0 and abs(tput / want_k - 1.0) <= 0.05
    rec = dict(name=name, cap=cap, u0=round(u0, 1), util=round(u, 1), util_min=min(utils), util_max=max(utils),
               tput=round(tput, 3), want_tput=round(want_k, 3), ok=ok_u and ok_k, ok_util=ok_u, ok_tput=ok_k)
    rec.update(LAST)
    if extra:
        rec.update(extra)
    print(" ".join(f"{a}={b}" for a, b in rec.items()), flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "share.jsonl"), "a") as f:
            f.write(json.dumps(dict(rec, samples=utils, **TRACE)) + "\n")
    return rec["ok"]


def mode_env(mode, alt=None, prefix="mode-"):
    """The environment of a workload run in `mode` (gate_cost.py, dip_probe.py): `off` (no hook),
    or hooked with its own region: `nocap` / `switchN` (no cap at start), `capN`; each hooked mode
    also as `alt_...`, with the build at `alt` preloaded."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DEVICE_")}
    env.pop("LD_PRELOAD", None)
    env["PYTHONUNBUFFERED"] = "1"
    if mode == "off":
        return env
    env.update(LD_PRELOAD=alt if mode.startswith("alt_") else hook_lib(), CUDA_DEVICE_MEMORY_SHARED_CACHE=tempfile.mktemp(prefix=prefix))
    cap = mode.removeprefix("alt_")
    if cap.startswith("cap"):
        env["CUDA_DEVICE_SM_LIMIT"] = cap[3:]
    return env


def child_env(region, cap=None):
    env = dict(os.environ, LD_PRELOAD=hook_lib(), CUDA_DEVICE_MEMORY_SHARED_CACHE=region, PYTHONUNBUFFERED="1")
    env.pop("CUDA_DEVICE_SM_LIMIT", None)
    if cap is not None:
        env["CUDA_DEVICE_SM_LIMIT"] = str(cap)
    return env


def tenant_env(node_dir, prio, tag):
    """A container of its own (own region, no caps) at priority `prio`, sharing the node directory."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DEVICE_")}
    e.update(LD_PRELOAD=hook_lib(), VGPU_NODE_DIR=node_dir, CUDA_TASK_PRIORITY=str(prio),
             CUDA_DEVICE_MEMORY_SHARED_CACHE=tempfile.mktemp(prefix=f"{tag}-"), PYTHONUNBUFFERED="1")
    return e


def idle_on_gpu(seconds):
    """A process that puts a context on the GPU, prints `ready` and sends nothing more for
    `seconds` (a higher-priority container with no work: priority.py, two_lower.py)."""
    return [sys.executable, "-c", "import time, torch; torch.ones(1, device='cuda').add_(1); torch.cuda.synchronize(); "
            f"print('ready', flush=True); time.sleep({seconds})"]


def start(cmd, env, n):
    procs = [Proc(cmd, env) for _ in range(n)]
    for p in procs:
        if not p.ready.wait(300) or not p.points:
            stop(procs)
            sys.exit(f"name=? error=workload_never_reported_progress log={''.join(p.log)[-2000:]!r}")
    return procs


def stop(procs):
    for p in procs:
        if p.p.poll() is None:
            p.p.terminate()
    for p in procs:
        try:
            p.p.wait(20)
        except subprocess.TimeoutExpired:
            p.p.kill()
    # Env SHARE_LOGS=DIR: keep each workload's output (with LIBCUDA_LOG_LEVEL=4, the hook's
    # calibration steps and gate counters) for diagnosis.
    if os.environ.get("SHARE_LOGS"):
        os.makedirs(os.environ["SHARE_LOGS"], exist_ok=True)
        for p in procs:
            with open(os.path.join(os.environ["SHARE_LOGS"], f"{p.p.pid}.log"), "w") as f:
                f.write("".join(p.log))


def main():
    args = sys.argv[1:]
    sep = args.index("--")
    opts, cmd = args[:sep], args[sep + 1:]
    o = dict(zip(opts[::2], opts[1::2]))
    name = o["--name"]
    caps = [int(c) for c in o.get("--caps", "25,50").split(",")]
    nproc = int(o.get("--procs", "1"))
    fresh = int(o.get("--fresh", "0"))
    global PER_SECOND_FINE
    PER_SECOND_FINE = o.get("--per-second", "snapshot") == "fine"
    nvml = Nvml()
    tmp = tempfile.mkdtemp(prefix="share-")
    ok = True
    if fresh:
        region = f"{tmp}/r0"
        procs = start(cmd, child_env(region), nproc)
        utils0, k0 = measure(nvml, procs)
        stop(procs)
        u0 = uncapped_util(utils0)
        print(f"name={name} phase=uncapped u0={u0:.1f} rate={k0:.2f}", flush=True)
        for cap in caps:
            for run in range(fresh):
                region = f"{tmp}/r-{cap}-{run}"
                procs = start(cmd, child_env(region, cap), nproc)
                utils, k = measure(nvml, procs, region)
                stop(procs)
                ok &= judge(name, cap, u0, k0, utils, k, {"run": run})
    else:
        region = f"{tmp}/r"
        procs = start(cmd, child_env(region), nproc)
        try:
            utils0, k0 = measure(nvml, procs)
            u0 = uncapped_util(utils0)
            print(f"name={name} phase=uncapped u0={u0:.1f} u0_snap={sum(utils0) / len(utils0):.1f} rate={k0:.2f} "
                  f"samples={utils0} nvml_n={LAST['nvml_n']} nvml_ms={LAST['nvml_ms']} sm_mhz={LAST['sm_mhz']}", flush=True)
            for cap in caps:
                shrreg(region, "--set-sm-limit", "0", str(cap))
                utils, k = measure(nvml, procs, region)
                ok &= judge(name, cap, u0, k0, utils, k)
        finally:
            stop(procs)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
