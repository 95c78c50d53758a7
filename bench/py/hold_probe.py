"""How long and how busily a launch is held in two corners of the limiter (docs/reliability.md,
session 32), on a real GPU, under the hook and with none.

  raise    Capped at 5, one 200 ms kernel closes the budget for about 2 s (its debt floored at
           what one full hold repays: about 100 ms): the next launch is held. 0.4 s into that
           hold the cap is raised to 50 (shrreg-tool). `held_ms` is how long that launch call
           took: about 560 when a raise shortens what is left (1.6 s) by old / new, 2000 if the
           hold keeps to the old cap.
  overdue  Capped at 50, a stream that learned 1 ms kernels launches one of 500 ms, then 40 of
           1 ms without synchronizing: the launches behind the long one wait for it. `cpu_share` is
           the process's CPU time over the wall time of those 40 launch calls (a core yielding in
           a loop reads about 1).

usage: hold_probe.py raise|overdue [ROUNDS]   env DIST (libvgpu.so, tools/shrreg-tool), LIBVGPU (another build),
       OTHER_HOOKS (more builds to run beside it, colon-separated; each named by its folder),
       DEBUG (set: the hook's debug log of each hooked run, with the child's output, in $OUT)
Prints one `hold_probe` line per round and hook (`none` runs the same steps with no hook and no cap).
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import out  # noqa: E402
from share import hook_lib, shrreg  # noqa: E402

RAISE_AFTER_S = 0.4


def sleep_cycles_per_ms(torch):
    """SM clock cycles `torch.cuda._sleep` spins per ms, timed by events on a 20 ms kernel."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 20_000_000
    for _ in range(2):
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
    return cycles / a.elapsed_time(b)


def child(case, region):
    import torch
    torch.cuda.init()
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    # Timed under the hook, a held launch's wait would count as the kernel's: the unhooked
    # run's figure is passed on.
    per_ms = float(os.environ.get("HOLD_PROBE_PER_MS") or sleep_cycles_per_ms(torch))
    if case == "raise":
        t0 = time.monotonic()
        torch.cuda._sleep(int(200 * per_ms))
        t1 = time.monotonic()
        torch.cuda.synchronize()
        t2 = time.monotonic()
        if region:  # raised while the next launch is held
            threading.Timer(RAISE_AFTER_S, shrreg, (region, "--set-sm-limit", "0", "50")).start()
        t = time.monotonic()
        torch.cuda._sleep(1000)
        held = time.monotonic() - t
        torch.cuda.synchronize()
        out(held_ms=held * 1e3, long_launch_ms=(t1 - t0) * 1e3, long_sync_ms=(t2 - t1) * 1e3, cycles_per_ms=per_ms)
    else:
        for _ in range(30):
            torch.cuda._sleep(int(per_ms))
            torch.cuda.synchronize()
        torch.cuda._sleep(int(500 * per_ms))
        t, c = time.monotonic(), time.process_time()
        for _ in range(40):
            torch.cuda._sleep(int(per_ms))
        wall, cpu = time.monotonic() - t, time.process_time() - c
        torch.cuda.synchronize()
        out(launch_wall_ms=wall * 1e3, cpu_ms=cpu * 1e3, cpu_share=cpu / wall if wall > 0 else 0.0, cycles_per_ms=per_ms)


def run(case, hook, rnd, per_ms=None):
    region = tempfile.mktemp(prefix="hold-probe-")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for k in [k for k in env if k.startswith("CUDA_DEVICE_")]:
        env.pop(k)
    if hook != "none":
        env.update(LD_PRELOAD=hook, CUDA_DEVICE_MEMORY_SHARED_CACHE=region,
                   CUDA_DEVICE_SM_LIMIT="5" if case == "raise" else "50")
    if per_ms:
        env["HOLD_PROBE_PER_MS"] = str(per_ms)
    if os.environ.get("DEBUG") and hook != "none":
        env["LIBCUDA_LOG_LEVEL"] = "4"
    r = subprocess.run([sys.executable, __file__, "--child", case, region if hook != "none" else ""],
                       env=env, capture_output=True, text=True, timeout=60)
    line = next((ln for ln in r.stdout.splitlines() if "=" in ln), f"error=rc{r.returncode}:{r.stderr.strip()[-200:]}")
    label = os.path.basename(os.path.dirname(hook)) if hook != "none" else "none"
    if os.environ.get("DEBUG") and os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"hold-probe-{case}-{label}-{rnd}.log"), "w") as f:
            f.write(r.stdout + r.stderr)
    print(f"hold_probe case={case} hook={label} round={rnd} {line}", flush=True)
    per_ms = next((float(kv.split("=")[1]) for kv in line.split() if kv.startswith("cycles_per_ms=")), None)
    try:
        os.unlink(region)
    except OSError:
        pass
    return per_ms


def main():
    if sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[3])
    case, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3
    hooks = [hook_lib()] + [p for p in os.environ.get("OTHER_HOOKS", "").split(":") if p]
    for rnd in range(1, rounds + 1):
        per_ms = run(case, "none", rnd)  # first: it times the sleep kernel for the others
        for hook in hooks:
            run(case, hook, rnd, per_ms)


if __name__ == "__main__":
    main()
