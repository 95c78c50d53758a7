"""What a short timeslice costs lower-priority work that time-slices against itself (issue 14):
a lower priority's channel groups run `LOWER_TIMESLICE_US` beside a higher-priority container;
two lower-priority trainings both so set would switch between each other that often.
Runs WORKLOAD (workloads.py kind, default gpt2) at priority 1: once alone, then two at once, each
time beside a priority-0 container that is on the GPU but sends nothing (so the timeslice is
short), and prints how much the pair together did over one alone (1.00: switching cost nothing).
H200: without libvgpu 1.14-1.15; at 94b8125 (both processes short) the pair made almost no
progress for minutes, so a process now shortens only when no other one without higher priority
has work (`node::may_shorten`); at e23ac4e the others kept libcuda's timeslice and a 250 us queue
bound: 0.50; at 016f81b they run a shared 500 us timeslice, unbounded while the higher priority
is idle: 0.85.
usage: two_lower.py [SECONDS] [WORKLOAD]   (env DIST; LIBVGPU: another build of the hook; ONE=RATE: one's rate
       measured before, the pair only)
prints one `two_lower {json}` line"""
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import idle_on_gpu, tenant_env  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 10
kind = sys.argv[2] if len(sys.argv) > 2 else "gpt2"
node_dir = tempfile.mkdtemp(prefix="node-")
IDLE = idle_on_gpu(3600)


def progress(path):
    """The (t, n) progress points the workload wrote so far."""
    with open(path, errors="replace") as f:
        return [tuple(float(kv.split("=", 1)[1]) for kv in x.split()[1:3]) for x in f if x.startswith("progress t=")]


def rates(n):
    # Output to files, not pipes: the workload's forked helpers keep a pipe open after it exits.
    logs = [tempfile.mktemp(prefix=f"two-lower-{n}-{i}-") for i in range(n)]
    procs = [subprocess.Popen([sys.executable, f"{HERE}/workloads.py", kind], env=tenant_env(node_dir, 1, f"low{i}"),
                              stdout=open(log, "w"), stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
    try:
        deadline = time.monotonic() + 300
        while not all(progress(log) for log in logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                tails = [open(log, errors="replace").read()[-400:] for log in logs]
                sys.exit(f"two_lower.py: {kind} never reported progress: {tails!r}")
            time.sleep(0.5)
        time.sleep(3)
        first = [progress(log)[-1] for log in logs]
        time.sleep(secs)
        last = [progress(log)[-1] for log in logs]
        return [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(first, last)]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


idle = subprocess.Popen(IDLE, env=tenant_env(node_dir, 0, "idle"), stdout=subprocess.PIPE, text=True)
try:
    if idle.stdout.readline() != "ready\n":
        sys.exit("two_lower.py: the idle priority-0 container did not start")
    one = float(os.environ["ONE"]) if os.environ.get("ONE") else rates(1)[0]
    print(f"two_lower: one alone {one:.3f}/s", flush=True)
    two = rates(2)
finally:
    idle.terminate()
    idle.wait()
rec = dict(workload=kind, one=round(one, 3), two=[round(r, 3) for r in two], pair_over_one=round(sum(two) / one, 3))
# Neither stopped: each does at least a quarter of one alone (stopped: ~0).
rec["ok"] = min(two) >= 0.25 * one
print("two_lower " + json.dumps(rec), flush=True)
print(f"two_lower ok={str(rec['ok']).lower()} pair_over_one={rec['pair_over_one']}", flush=True)
sys.exit(0 if rec["ok"] else 1)
