"""Does the machine stall small syscalls and stores for long? Session 28 saw one request of a
context-synchronizing service take 100 ms beside a training (H200, gVisor), and the hook's sync
path writes the node file (`pwrite`) and stores into the mmap'd region. Run this beside a
benchmark: one process per probe, each doing its operation about once a millisecond for SECONDS
and timing only the operation:
  pwrite DIR   64 bytes at offset 0 of a file in DIR (what the node entry's write does)
  store DIR    an 8-byte store into a shared mapping of a file in DIR (the region's counters)
  getppid      a syscall that touches no file (the machine's own syscall stalls)
  clock        two clock reads (the probe's own floor: a descheduled process shows here)
usage: stall_probe.py SECONDS [DIR...]   (default DIR: /tmp; each DIR gets pwrite and store)
prints per probe `stall_probe op= dir= fs= n= over_1ms= over_10ms= max_ms= p50_us= slow_at_unix=`
(slow_at_unix: the wall times of the operations over 5 ms, the first 10)."""
import mmap
import multiprocessing as mp
import os
import struct
import subprocess
import sys
import tempfile
import time


def fs_type(d):
    try:
        return subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


def probe(op, d, secs, q):
    fd, m, path = None, None, None
    if d:
        f = tempfile.NamedTemporaryFile(dir=d, prefix="stall-probe-", delete=False)
        f.write(b"\0" * 4096)
        f.flush()
        path, fd = f.name, os.dup(f.fileno())
        f.close()
        if op == "store":
            m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    durs, slow = [], []
    end = time.monotonic() + secs
    i = 0
    buf = b"x" * 64
    while time.monotonic() < end:
        i += 1
        t0 = time.perf_counter()
        if op == "pwrite":
            os.pwrite(fd, buf, 0)
        elif op == "store":
            m[0:8] = struct.pack("<Q", i)
        elif op == "getppid":
            os.getppid()
        t1 = time.perf_counter()
        dt = t1 - t0
        durs.append(dt)
        if dt > 0.005 and len(slow) < 10:
            slow.append(round(time.time() - dt, 3))
        time.sleep(0.001)
    if m is not None:
        m.close()
    if fd is not None:
        os.close(fd)
        os.unlink(path)
    durs.sort()
    q.put(f"stall_probe op={op} dir={d or '-'} fs={fs_type(d) if d else '-'} n={len(durs)} "
          f"over_1ms={sum(x > 0.001 for x in durs)} over_10ms={sum(x > 0.010 for x in durs)} "
          f"max_ms={durs[-1] * 1e3:.3f} p50_us={durs[len(durs) // 2] * 1e6:.1f} "
          f"slow_at_unix={','.join(map(str, slow)) or '-'}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    secs = float(sys.argv[1])
    dirs = sys.argv[2:] or ["/tmp"]
    for d in dirs:
        if not os.path.isdir(d):
            sys.exit(f"stall_probe.py: {d!r} is not a directory")
    jobs = [(op, d) for d in dirs for op in ("pwrite", "store")] + [("getppid", None), ("clock", None)]
    q = mp.Queue()
    procs = [mp.Process(target=probe, args=(op, d, secs, q)) for op, d in jobs]
    for p in procs:
        p.start()
    lines = [q.get() for _ in procs]
    for p in procs:
        p.join()
    for line in sorted(lines):
        print(line, flush=True)


if __name__ == "__main__":
    main()
