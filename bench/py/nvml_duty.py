"""What NVML's utilization counts: kernel duty cycle vs NVML, and libvgpu's own measure.

Runs test_streams (100 us kernels, synchronize after each, CPU gaps of G us between kernels) for a
few seconds per gap, once under libvgpu with a 99% cap (the gate measures, but hardly holds), and
prints per gap: the true kernel duty (GPU ms per second from the program), NVML's utilization
(host, unhooked) and libvgpu's own (busy ns in the region / elapsed).
usage: nvml_duty.py [--us US] [--gaps 0,5,10,...] [--blocks B]   env DIST
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from share import DIST, hook_lib, Nvml, own_busy_ns  # noqa: E402


def main():
    a = sys.argv[1:]
    o = dict(zip(a[::2], a[1::2]))
    us = o.get("--us", "100")
    gaps = [float(g) for g in o.get("--gaps", "0,5,10,20,50,100,200,500").split(",")]
    nvml = Nvml()
    tmp = tempfile.mkdtemp(prefix="duty-")
    for gap in gaps:
        region = f"{tmp}/r{gap}"
        env = dict(os.environ, LD_PRELOAD=hook_lib(), CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
                   CUDA_DEVICE_SM_LIMIT="99")
        cmd = [f"{DIST}/samples/test_streams", "--us", us, "--gap-us", str(gap), "--seconds", "4"]
        if "--blocks" in o:
            cmd += ["--blocks", o["--blocks"]]
        samples = []
        stop = threading.Event()

        def sample():
            time.sleep(1.5)
            while not stop.is_set():
                samples.append(nvml.util())
                time.sleep(0.5)
        th = threading.Thread(target=sample)
        th.start()
        t0 = time.monotonic()
        out = subprocess.run(cmd, env=env, capture_output=True, text=True).stdout
        el = time.monotonic() - t0
        stop.set()
        th.join()
        kv = dict(x.split("=", 1) for x in out.split() if "=" in x)
        duty = float(kv.get("gpu_ms_per_sec", "0")) / 10.0
        own = 100.0 * own_busy_ns(region) / 1e9 / 4.0  # the launching part of the run
        nv = sum(samples[:-1]) / max(len(samples) - 1, 1)
        print(f"kernel_us={us} gap_us={gap} duty={duty:.1f} nvml={nv:.1f} own={own:.1f} samples={samples}", flush=True)


if __name__ == "__main__":
    main()
