#!/usr/bin/env python3
"""Assemble every PTX text the project ships with NVIDIA's own `ptxas`, for the GPUs it is measured
on (sm_90: H100, H200). The driver JIT-compiles the same text at run time, so a syntax or ISA
error would otherwise first show on a GPU. The texts: the samples' kernels
(cuda-samples/c/kernels_ptx.h, a C string) and the hook's own (every `c".version ...` literal in
libvgpu/src). `ptxas` comes from NVIDIA's `nvidia-cuda-nvcc` wheel on PyPI (CUDA 13.0), cached
under target/nvidia-ptxas. Where PyPI cannot be reached it says so and checks nothing.

usage: ci/check-ptx.py
"""
import glob
import os
import re
import stat
import subprocess
import sys
import tempfile

import nvidia_wheel  # ci/, next to this script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NVCC_VERSION = "13.0.88"
ARCHS = ("sm_90",)


def ptxas():
    """The cached ptxas, downloading its wheel once; (path, None) or (None, why)."""
    exe, why = nvidia_wheel.fetch("nvidia-ptxas", "nvidia-cuda-nvcc", NVCC_VERSION, lambda n: n.endswith("/bin/ptxas"),
                                  os.path.join("**", "bin", "ptxas"))
    if exe:
        os.chmod(exe, os.stat(exe).st_mode | stat.S_IXUSR)
    return exe, why


def samples_ptx():
    """The samples' PTX, as the C compiler builds the string (`cc` prints it)."""
    src = '#include <stdio.h>\n#include "kernels_ptx.h"\nint main(void) { fputs(vgpu_kernels_ptx, stdout); return 0; }\n'
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "print_ptx")
        subprocess.run(["cc", "-x", "c", "-", "-I", os.path.join(ROOT, "cuda-samples", "c"), "-o", exe], input=src,
                       text=True, check=True)
        return subprocess.run([exe], capture_output=True, text=True, check=True).stdout


def texts():
    """(where, PTX) for every PTX text we ship."""
    out = []
    out.append(("cuda-samples/c/kernels_ptx.h", samples_ptx()))
    for path in sorted(glob.glob(os.path.join(ROOT, "libvgpu", "src", "**", "*.rs"), recursive=True)):
        with open(path) as f:
            for m in re.finditer(r'c"(\.version[^"]*)"', f.read()):
                out.append((os.path.relpath(path, ROOT), m.group(1)))
    return out


def main():
    exe, why = ptxas()
    if not exe:
        print(f"check-ptx: SKIPPED: cannot fetch NVIDIA's ptxas from PyPI ({why}); nothing was checked", file=sys.stderr)
        return 0
    bad, n = [], 0
    for where, ptx in texts():
        if not ptx:
            bad.append(f"{where}: no PTX text found")
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(ptx)
        try:
            for arch in ARCHS:
                r = subprocess.run([exe, f"-arch={arch}", f.name, "-o", os.devnull], capture_output=True, text=True)
                n += 1
                if r.returncode != 0:
                    bad.append(f"{where} ({arch}): {r.stderr.strip()}")
        finally:
            os.unlink(f.name)
    print(f"check-ptx: ptxas {NVCC_VERSION}: {n} PTX texts x architectures assembled ({', '.join(ARCHS)})")
    for b in bad:
        print(f"check-ptx: FAILED {b}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
