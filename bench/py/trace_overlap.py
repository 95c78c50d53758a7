#!/usr/bin/env python3
"""How a test_streams run's kernels sat on the GPU, from its `--trace` lines (each kernel's
first-block start and last-block end on the GPU's %globaltimer: no host clock, no hook involved).
The mock records no times: its logs have no trace lines.

usage: trace_overlap.py [--skip-ms MS] LOG [LOG ...]   one JSON line per log; kernels that started
in the first MS ms of the trace are left out (warm-up; default 500):
  kernels, span_ms (the window), busy_ms and busy_frac (union of kernel intervals: what NVML
  counts), sum_ms (sum of kernel intervals), overlap (sum / busy: 2.0 = two kernels side by side
  all the time), per_busy_ms (kernels per busy ms), dur_p50_us / dur_p90_us (kernel intervals),
  lone_frac (share of busy time during which exactly one kernel ran).
test_streams records each thread's first N launches, so the window is clipped to the span every
thread covers (from the latest first start to the earliest last end).
"""
import json
import re
import sys

LINE = re.compile(r"trace thread=(\d+) stream=(\d+) start_us=([\d.]+) end_us=([\d.]+)")


def analyze(lines, skip_us=0.0):
    by_thread = {}
    for line in lines:
        m = LINE.search(line)
        if m:
            if float(m.group(3)) >= skip_us:
                by_thread.setdefault(int(m.group(1)), []).append((float(m.group(3)), float(m.group(4))))
    if not by_thread:
        return None
    lo = max(min(s for s, _ in ks) for ks in by_thread.values())
    hi = min(max(e for _, e in ks) for ks in by_thread.values())
    ks = sorted((max(s, lo), min(e, hi)) for v in by_thread.values() for s, e in v if e > lo and s < hi)
    if not ks or hi <= lo:
        return None
    # Sweep the starts and ends: time with >= 1 kernel running, and with exactly 1.
    edges = sorted([(s, 1) for s, _ in ks] + [(e, -1) for _, e in ks])
    busy = lone = 0.0
    depth, prev = 0, edges[0][0]
    for t, d in edges:
        if depth >= 1:
            busy += t - prev
        if depth == 1:
            lone += t - prev
        depth += d
        prev = t
    durs = sorted(e - s for s, e in ks)
    total = sum(durs)
    return {
        "kernels": len(ks),
        "span_ms": round((hi - lo) / 1e3, 1),
        "busy_ms": round(busy / 1e3, 1),
        "busy_frac": round(busy / (hi - lo), 3),
        "sum_ms": round(total / 1e3, 1),
        "overlap": round(total / busy, 3) if busy else None,
        "per_busy_ms": round(len(ks) / (busy / 1e3), 3) if busy else None,
        "dur_p50_us": round(durs[len(durs) // 2], 1),
        "dur_p90_us": round(durs[len(durs) * 9 // 10], 1),
        "lone_frac": round(lone / busy, 3) if busy else None,
    }


def main():
    args, skip_ms = sys.argv[1:], 500.0
    if args[:1] == ["--skip-ms"]:
        skip_ms, args = float(args[1]), args[2:]
    for path in args:
        with open(path) as f:
            r = analyze(f, skip_ms * 1e3)
        print(json.dumps({"log": path, **(r or {"error": "no trace lines"})}))


if __name__ == "__main__":
    main()
