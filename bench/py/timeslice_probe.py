"""Does shortening a training process's own channel-group timeslice bound how long a latency
service beside it waits? (issue 14: GPT-2's 2-3.3 ms GEMMs delay a request arriving while one
runs; the GPU time-slices contexts only when a timeslice, ~2 ms by default, expires.)
No libvgpu: the training runs under bench/gpu/bin/tsg_probe.so (TSG_TIMESLICE_US; bench/gpu/build.sh), the service
(service.py) plain. For each training command and timeslice: the service's p50/p99 and the
training's rate beside it, against the service alone and the training alone.
usage: timeslice_probe.py SECONDS TIMESLICES(comma, 0 = driver default) -- TRAINING COMMAND
       (env DIST; the training prints `progress t= n=` lines)"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import DIST, Proc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
secs = float(sys.argv[1])
slices = [int(x) for x in sys.argv[2].split(",")]
train_cmd = sys.argv[sys.argv.index("--") + 1:]


def plain_env(**kv):
    e = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TSG_TIMESLICE_US")}
    e.update(PYTHONUNBUFFERED="1", **kv)
    return e


def service():
    out = subprocess.run([sys.executable, f"{HERE}/service.py", str(secs)], env=plain_env(), capture_output=True, text=True, check=True).stdout
    line = [x for x in out.splitlines() if x.startswith("service ")][-1]
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


PROBE = f"{DIST}/bench/gpu/bin/tsg_probe.so"
if not os.path.isfile(PROBE):
    sys.exit(f"error=no_probe_library path={PROBE} (build it: {DIST}/bench/gpu/build.sh)")


def training(us):
    kv = dict(LD_PRELOAD=PROBE)
    if us:
        kv["TSG_TIMESLICE_US"] = str(us)
    t = Proc(train_cmd, plain_env(**kv))
    t.ready.wait(300)
    time.sleep(3)
    return t


def rate(t, t0, t1):
    return (t.at(t1) - t.at(t0)) / (t1 - t0)


alone = service()
rec = dict(train=" ".join(train_cmd), service_alone=alone, runs=[])
for us in slices:
    t = training(us)
    t0 = time.monotonic()
    time.sleep(5)
    solo = rate(t, t0, time.monotonic())
    t0 = time.monotonic()
    beside = service()
    keep = rate(t, t0, time.monotonic()) / max(solo, 1e-9)
    t.p.terminate()
    t.p.wait()
    probe = [x.strip() for x in t.log if x.startswith("tsg_probe set") or "status=0x" in x and "0xa06c0103" in x][:4]
    run = dict(timeslice_us=us, service=beside, p99_ratio=round(beside["p99_ms"] / alone["p99_ms"], 3),
               training_solo_rate=round(solo, 2), training_keeps=round(keep, 3), probe=probe)
    rec["runs"].append(run)
    print("timeslice " + json.dumps(run), flush=True)
print("timeslice_probe " + json.dumps(rec), flush=True)
if os.environ.get("OUT"):
    with open(os.path.join(os.environ["OUT"], "timeslice.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
