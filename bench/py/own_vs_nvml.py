"""libvgpu's own utilization vs host NVML for one workload under a cap, over a steady window.
usage: own_vs_nvml.py CAP SECONDS -- CMD...   (env DIST). Prints own= nvml= for seconds 8..SECONDS."""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import hook_lib, Nvml, own_busy_ns  # noqa: E402

cap, secs = sys.argv[1], float(sys.argv[2])
cmd = sys.argv[sys.argv.index("--") + 1:]
region = tempfile.mktemp(prefix="own-")
env = dict(os.environ, LD_PRELOAD=hook_lib(), CUDA_DEVICE_MEMORY_SHARED_CACHE=region, CUDA_DEVICE_SM_LIMIT=cap)
p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
nvml = Nvml()
time.sleep(8)
b0, t0, us = own_busy_ns(region), time.monotonic(), []
while time.monotonic() - t0 < secs - 8:
    time.sleep(1)
    us.append(nvml.util())
b1, t1 = own_busy_ns(region), time.monotonic()
p.terminate()
p.wait()
print(f"cap={cap} cmd={os.path.basename(cmd[-1])} own={100 * (b1 - b0) / 1e9 / (t1 - t0):.1f} nvml={sum(us) / len(us):.1f} samples={us}", flush=True)
