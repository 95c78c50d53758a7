#!/usr/bin/env bash
# starve.sh: the compute cap for a container starved of CPU. test_streams is pinned to core 0,
# first alone, then beside two busy loops on the same core (it gets about a third of it). Each
# shape runs uncapped, then at cap 30, for 6 s. Printed: the throughput, and host NVML's
# utilization (nvidia-smi, no hook) averaged from 2 s to 6 s.
# A starved thread wakes late from each hold. On the mock, with both cores saturated, the cap-30
# share of a memset loop fell to 0.18-0.23 (docs/reliability.md, session 36). This measures the
# same thing on a GPU.
# usage: dist/bench/starve.sh      (from dist/, laid out by ci/package-gpu.sh; logs in $OUT)
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd); S=$DIST/samples; L=$DIST/libvgpu.so
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
u=$(mktemp)
one() { # label cap args...: one 6-s run, its throughput and host NVML's utilization
    local label=$1 cap=$2; shift 2
    local r; r=$(mktemp -u /tmp/starve-XXXXXX.cache)
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -lms 200 >"$u" &
    local p=$! o
    o=$(taskset -c 0 env LD_PRELOAD="$L" CUDA_DEVICE_MEMORY_SHARED_CACHE="$r" ${cap:+CUDA_DEVICE_SM_LIMIT=$cap} \
        "$S/test_streams" --seconds 6 "$@" 2>&1)
    kill $p; wait $p 2>/dev/null; rm -f "$r"
    echo "$label cap=${cap:-none} kps=$(echo "$o" | grep -o 'kernels_per_sec=[0-9.]*' | cut -d= -f2)" \
        "nvml_util=$(awk 'NR>10 && NR<=30 {s+=$1; n++} END {if (n) printf "%.1f", s/n}' "$u") args=$*"
    echo "$o" | grep -iE "warn|error" | head -3
}
shapes=("--us 1000 --sync-every 0" "--us 1000 --sync-every 1" "--op memset --sync-every 0")
for cond in idle hog; do
    hogs=()
    if [ $cond = hog ]; then
        for _ in 1 2; do taskset -c 0 sh -c 'while :; do :; done' & hogs+=($!); done
    fi
    for sh in "${shapes[@]}"; do
        # shellcheck disable=SC2086 # each shape is several arguments
        one $cond "" $sh
        # shellcheck disable=SC2086
        one $cond 30 $sh
    done
    [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}"
done
rm -f "$u"
