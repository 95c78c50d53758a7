"""Where a lower-priority spin training's GPU time goes beside the priority service (issue 14: a
training of 20 ms spin kernels kept 0.33-0.73 of its share beside service.py's requests, ~5% of
the GPU, while beside a higher-priority container that sent nothing it lost nothing).

Runs `test_streams --us US --sync-every 0 --trace N` at priority 1 under libvgpu (VGPU_NODE_DIR
shared), alone and then beside service.py at priority 0, and reads how its kernels sat on the GPU
(bench/py/trace_overlap.py: %globaltimer of each kernel's first start and last end, no host clock):
kernels stretched (dur_p50_us above US: the spin counts SM cycles, so time switched out of the
GPU is or is not made up) or gaps between them (busy_frac under 1: nothing of the training queued).
usage: spin_beside_service.py [SECONDS] [US]   (env DIST; LIBVGPU: another build of the hook)
prints one `spin_beside {json}` line: alone and beside, each trace_overlap's summary and a
per-second series (of GPU time: the seconds the service was active show there), plus the
service's latencies"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import DIST, tenant_env  # noqa: E402
from trace_overlap import LINE, analyze  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 8
us = float(sys.argv[2]) if len(sys.argv) > 2 else 20000
node_dir = tempfile.mkdtemp(prefix="node-")


def env(prio, tag):
    return tenant_env(node_dir, prio, f"spin-{tag}")


def spin(tag, seconds):
    # Every kernel of the run traced (16 bytes each on the GPU).
    n = int(seconds * 1e6 / us) + 50
    cmd = [f"{DIST}/samples/test_streams", "--seconds", str(int(seconds)), "--us", str(us), "--sync-every", "0", "--trace", str(n)]
    return subprocess.Popen(cmd, env=env(1, tag), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def summary(p, tag):
    """trace_overlap's summary after the first second, and per second of GPU time: the share of
    it the training's kernels ran, and their median length (us)."""
    out, _ = p.communicate()
    if os.environ.get("OUT"):  # the raw trace and the hook's log lines (LIBCUDA_LOG_LEVEL)
        with open(os.path.join(os.environ["OUT"], f"spin-{tag}.log"), "w") as f:
            f.write(out)
    lines = out.splitlines()
    r = analyze(lines, 1e6) or {"error": "no trace lines"}
    ks = sorted((float(m.group(3)), float(m.group(4))) for m in map(LINE.search, lines) if m)
    per_s = []
    for sec in range(1, int(ks[-1][1] // 1e6) if ks else 0):
        lo, hi = sec * 1e6, (sec + 1) * 1e6
        inside = [(max(a, lo), min(b, hi)) for a, b in ks if b > lo and a < hi]
        durs = sorted(b - a for a, b in ks if lo <= a < hi)
        per_s.append((round(sum(b - a for a, b in inside) / 1e6, 3), round(durs[len(durs) // 2]) if durs else None))
    r["per_second_busy_and_median_us"] = per_s
    r["kernels_per_sec"] = next((x.split("kernels_per_sec=")[1].split()[0] for x in lines if "kernels_per_sec=" in x), None)
    return r


rec = {"us": us, "alone": summary(spin("alone", secs), "alone")}
# The service's start (torch, graph capture) takes seconds: the training runs past its end, and
# the seconds it was active show in the per-second series.
train = spin("beside", secs + 15)
svc = subprocess.run([sys.executable, f"{HERE}/service.py", str(secs)], env=env(0, "svc"), capture_output=True, text=True)
rec["service"] = next((x for x in svc.stdout.splitlines() if x.startswith("service ")), svc.stderr[-300:])
rec["beside"] = summary(train, "beside")
print("spin_beside " + json.dumps(rec), flush=True)
