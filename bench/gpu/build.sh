#!/usr/bin/env bash
# Build the CUDA-runtime benchmarks on the GPU machine (needs nvcc; targets sm_90 = H100/H200).
# Output: bench/gpu/bin/{runtime_launch,call_cost,tsg_probe.so,linger_probe} next to this script. Usage: bench/gpu/build.sh [nvcc args]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "error=nvcc_not_found (set NVCC=/path/to/nvcc)"; exit 1; }
mkdir -p "$here/bin"
# Static cudart (nvcc's default): it reaches libcuda.so.1 by dlopen + cuGetProcAddress_v2,
# the same path as the runtime inside PyTorch.
"$NVCC" -O2 -arch=sm_90 -o "$here/bin/runtime_launch" "$here/runtime_launch.cu" "$@"
echo "built=$here/bin/runtime_launch"
"$NVCC" -O2 -arch=sm_90 -o "$here/bin/call_cost" "$here/call_cost.cu" -lcuda "$@"
echo "built=$here/bin/call_cost"
# The channel-group probe (bench/py/timeslice_probe.py preloads it): plain C, the host compiler.
"${CC:-cc}" -shared -fPIC -O2 -o "$here/bin/tsg_probe.so" "$here/tsg_probe.c" -ldl -lpthread
echo "built=$here/bin/tsg_probe.so"
# The linger probe (issue 14): the driver API for its green and second contexts, so -lcuda
# (built on the H100 in session 20). A failure here is reported and leaves the others built.
if "$NVCC" -O2 -arch=sm_90 -o "$here/bin/linger_probe" "$here/linger_probe.cu" -lcuda "$@"; then
    echo "built=$here/bin/linger_probe"
else
    echo "error=linger_probe_build_failed"
fi
