"""A PyTorch program that sizes itself from torch.cuda.mem_get_info(), on one or more GPUs from
one process.

usage: torch_meminfo_sizing.py [--devices 0[,1...]] [--fraction 0.8] [--step-mib 64]
                               [--expect-total-mib N[,N...]]
For each device in order (holding everything allocated on earlier devices): read
mem_get_info() (free, total), allocate one tensor of --fraction x free (what a program sizing its
work from the free memory does: it must succeed), then keep allocating --step-mib blocks until
torch.OutOfMemoryError (clean OOM expected at the cap). Prints per device:
  device= mem_get_info_total_mib= mem_get_info_free_mib= planned_mib= planned_ok=1|0
  allocated_mib= (planned + steps until OOM) stop=oom|error
and result=PASS|FAIL: every planned allocation fit, every device stopped with a clean OOM, and,
with --expect-total-mib, each total equals the expected cap (+-1 MiB).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import out  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--devices", default="0")
ap.add_argument("--fraction", type=float, default=0.8)
ap.add_argument("--step-mib", type=int, default=64)
ap.add_argument("--expect-total-mib", default="")
args = ap.parse_args()

import torch  # noqa: E402

devs = [int(d) for d in args.devices.split(",")]
expect = [int(x) for x in args.expect_total_mib.split(",")] if args.expect_total_mib else []
MIB = 1 << 20
held = []
ok = True
for i, d in enumerate(devs):
    dev = torch.device("cuda", d)
    torch.cuda.init()
    torch.empty(1, device=dev)  # context first: what a program has before it sizes itself
    free, total = torch.cuda.mem_get_info(dev)
    planned = int(free * args.fraction) // MIB * MIB
    try:
        held.append(torch.empty(planned, dtype=torch.uint8, device=dev))
        planned_ok = 1
    except torch.OutOfMemoryError:
        planned_ok = 0
    allocated = planned if planned_ok else 0
    stop = "oom"
    try:
        while allocated < total + 64 * 1024 * MIB:
            held.append(torch.empty(args.step_mib * MIB, dtype=torch.uint8, device=dev))
            allocated += args.step_mib * MIB
    except torch.OutOfMemoryError:
        stop = "oom"
    except Exception as e:  # noqa: BLE001
        stop = f"error:{type(e).__name__}"
    total_ok = not expect or abs((total >> 20) - expect[i]) <= 1
    ok = ok and planned_ok == 1 and stop == "oom" and total_ok
    out(device=d, mem_get_info_total_mib=total >> 20, mem_get_info_free_mib=free >> 20,
        planned_mib=planned >> 20, planned_ok=planned_ok, allocated_mib=allocated >> 20, stop=stop,
        total_ok=int(total_ok))
del held
out(result="PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
