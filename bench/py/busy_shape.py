"""Where within its step a capped program keeps the GPU busy, by the GPU's own timestamps, and what
a ~100-ms NVML reading taken at each moment would read (issue 10: GPT-2 at cap 50 read 39-58 in
its one-a-second readings while NVML's own samples of the same seconds held 48-51).

Runs KIND (workloads.py, torch) in MODE (off | nocap | capN, as share.py's mode_env) as a child:
WARM s of steps (the calibration settles), then STEPS steps profiled with torch.profiler (CUDA
activity only: CUPTI's kernel / memcpy / memset intervals). Meanwhile this process polls the
unhooked NVML reading every 5 ms. Prints one JSON line:
  busy_pct: union of the GPU intervals over the profiled span; step_ms: the span / STEPS;
  win100 / win50: the busy share of every 100 / 50 ms window ending at each ms of the span,
    [min, p5, median, p95, max];
  fold: the busy share in tenths of the step, folded on the step's end (its D2H copy: the loss
    read back), so a burst at one phase shows as one high tenth;
  step_lens_ms: the steps' lengths; gaps_over_1ms, longest_gaps_ms: the GPU's idle gaps;
  polled: the NVML readings polled over the same span, [min, p5, median, p95, max].
usage: busy_shape.py KIND MODE [STEPS]   (default STEPS 60; env WARM, default 10; BUSY_OUT: a file
the busy us of every ms, the step ends and the polled readings are appended to, one JSON line a run)"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dip_probe import ReadingPoll  # noqa: E402
from share import Nvml, mode_env  # noqa: E402

WARM = float(os.environ.get("WARM", "10"))
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def child(kind, steps, path):
    import workloads
    step = workloads.KINDS[kind]()
    t0 = time.monotonic()
    while time.monotonic() - t0 < WARM:
        step()
    workloads.SYNC[0]()
    from torch.profiler import ProfilerActivity, profile
    print("profiling", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        workloads.SYNC[0]()
    print("profiled", flush=True)
    raw = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(raw)
    with open(raw) as f:
        events = json.load(f)["traceEvents"]
    os.unlink(raw)
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), "DtoH" in e.get("name", "") or "Device -> Pageable" in e.get("name", ""))
           for e in events if e.get("cat") in GPU_CATS and e.get("ph") == "X"]
    with open(path, "w") as f:
        json.dump(gpu, f)


def quantiles(v):
    s = sorted(v)
    if not s:
        return []
    q = lambda p: s[min(len(s) - 1, int(p * (len(s) - 1) + 0.5))]  # noqa: E731
    return [round(q(p), 1) for p in (0, 0.05, 0.5, 0.95, 1)]


def busy_per_ms(gpu):
    """Busy us of the union of the intervals in each ms from the first start."""
    ivs = sorted((a, b) for a, b, _ in gpu)
    t0 = ivs[0][0]
    out = [0.0] * (int((max(b for _, b in ivs) - t0) // 1000) + 1)
    end = t0
    for a, b in ivs:
        a = max(a, end)
        while a < b:
            i = int((a - t0) // 1000)
            seg = min(b, t0 + (i + 1) * 1000)
            out[i] += seg - a
            a = seg
        end = max(end, b)
    return out, t0


def analyze(gpu, steps, polled):
    busy, t0 = busy_per_ms(gpu)
    span = len(busy)
    res = {"busy_pct": round(sum(busy) / span / 10, 1), "step_ms": round(span / steps, 1)}
    for w in (100, 50):
        res[f"win{w}"] = quantiles([sum(busy[t - w:t]) / w / 10 for t in range(w, span + 1)])
    ends = sorted(b for _, b, d2h in gpu if d2h)
    tenths = [[0.0, 0] for _ in range(10)]
    for e0, e1 in zip(ends, ends[1:]):
        n = e1 - e0
        for k in range(10):
            a, b = int((e0 + k * n / 10 - t0) // 1000), int((e0 + (k + 1) * n / 10 - t0) // 1000)
            if 0 <= a < b <= span:
                tenths[k][0] += sum(busy[a:b]) / 10
                tenths[k][1] += b - a
    res["fold"] = [round(s / n, 1) if n else None for s, n in tenths]
    res["steps_marked"] = max(0, len(ends) - 1)
    res["step_lens_ms"] = quantiles([(b - a) / 1000 for a, b in zip(ends, ends[1:])])
    ivs, gaps, end = sorted((a, b) for a, b, _ in gpu), [], None
    for a, b in ivs:
        if end is not None and a > end:
            gaps.append((a - end) / 1000)
        end = b if end is None else max(end, b)
    res["gaps_over_1ms"] = len([g for g in gaps if g > 1])
    res["longest_gaps_ms"] = [round(g, 1) for g in sorted(gaps)[-12:]]
    res["polled"] = quantiles(polled)
    if os.environ.get("BUSY_OUT"):  # the raw shape, for a closer look
        with open(os.environ["BUSY_OUT"], "a") as f:
            f.write(json.dumps({"busy_us_per_ms": [round(b) for b in busy], "step_ends_ms": [round((e - t0) / 1000, 2) for e in ends], "polled": polled}) + "\n")
    return res


def main():
    if sys.argv[1] == "--child":
        return child(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    kind, mode = sys.argv[1], sys.argv[2]
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    path = tempfile.mktemp(suffix=".json")
    poll = ReadingPoll(Nvml(), 5)
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", kind, str(steps), path],
                         env=mode_env(mode), stdout=subprocess.PIPE, text=True)
    span = {}  # when the child said it began and ended profiling (monotonic ns)
    for line in p.stdout:
        if line.strip() in ("profiling", "profiled"):
            span[line.strip()] = time.monotonic_ns()
    poll.stop = True
    a, b = span.get("profiling", float("inf")), span.get("profiled", time.monotonic_ns())
    polled = [v for t, v in poll.rows if a <= t < b]
    if p.wait() != 0 or not os.path.exists(path):
        print(json.dumps({"kind": kind, "mode": mode, "error": f"child exited {p.returncode}"}))
        return 1
    with open(path) as f:
        gpu = json.load(f)
    os.unlink(path)
    print(json.dumps({"kind": kind, "mode": mode, "steps": steps, **analyze(gpu, steps, polled)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
