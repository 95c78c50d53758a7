#!/usr/bin/env bash
# demo.sh: build everything, then run samples under libvgpu.so and show what was limited.
# Uses the real GPU when nvidia-smi finds one, otherwise the mock driver and NVML.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== building (release) into dist/"
./ci/package-gpu.sh >/dev/null
D=$PWD/dist
work=$(mktemp -d /tmp/vgpu-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "== GPU found: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
else
    echo "== no GPU: using the mock driver and NVML (simulated 8 GiB, 16-SM GPU)"
    export LD_LIBRARY_PATH=$(PROFILE=release ./ci/mock-libs.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export MOCK_GPU_STATE=$work/mock-gpu.state MOCK_GPU_MEM=8g
fi
hooked() { env LD_PRELOAD="$D/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region" "$@"; }
key() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" | head -1; }

echo
echo "== memory: the program sees a 1 GiB GPU (CUDA_DEVICE_MEMORY_LIMIT=1g)"
echo "   cuMemGetInfo total without the hook: $("$D/samples/test_meminfo" | key meminfo_total) bytes"
echo "   cuMemGetInfo total with the hook:    $(CUDA_DEVICE_MEMORY_LIMIT=1g hooked "$D/samples/test_meminfo" | key meminfo_total) bytes"
out=$(CUDA_DEVICE_MEMORY_LIMIT=1g hooked "$D/samples/test_vram_limit" --step 64m)
echo "   allocating 64 MiB steps until OOM: $(echo "$out" | key allocated_mib) MiB allocated, then $(echo "$out" | key stop_reason)"
echo "   (the process's context is charged to the cap too)"

echo
echo "== compute: 1 ms kernels back to back, uncapped vs CUDA_DEVICE_SM_LIMIT=30 (4 s each)"
rate() { awk -F'[= ]' '/^second=/ { if ($2 >= 2) { s += $4; n++ } } END { printf "%.1f", (n ? s / n : 0) }'; }
base=$(hooked "$D/samples/test_runtime_launch" --us 1000 --seconds 4 | rate)
capped=$(CUDA_DEVICE_SM_LIMIT=30 hooked "$D/samples/test_runtime_launch" --us 1000 --seconds 4 | rate)
echo "   uncapped: $base kernels/s; capped at 30%: $capped kernels/s = $(awk -v a="$capped" -v b="$base" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')% of uncapped"

echo
echo "== the container's view (vgpu-smi) while a capped process holds memory"
CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_SM_LIMIT=30 hooked "$D/samples/test_alloc_paths" --path mem_alloc --size 256m --hold --hold-seconds 3 >/dev/null &
sleep 1.5
CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region" "$D/tools/vgpu-smi"
wait
