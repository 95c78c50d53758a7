#!/usr/bin/env bash
# gpu-reliability.sh: SIGKILL loop on a real GPU (from dist/: dist/ci/gpu-reliability.sh).
# A holder process keeps memory under the hook; N victims (default 50) allocate under the same
# container cap and are SIGKILLed at random moments (mid-allocation, mid-launch). Afterwards a
# fresh hooked process registers (reaping dead slots) and the region's usage must equal the live
# processes' real usage as host NVML reports it (hook off).
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
S=$DIST/samples
N=${1:-50}
WORK=$(mktemp -d /tmp/gpu-rel.XXXXXX)
R=$WORK/region
export CUDA_DEVICE_MEMORY_SHARED_CACHE=$R CUDA_DEVICE_MEMORY_LIMIT=8g CUDA_DEVICE_SM_LIMIT=50
# `env` execs the program, so `$!` of a backgrounded `hook ...` is the program itself (a shell
# function run in the background would be a subshell, and kill -9 would miss the program).
hook() { env LD_PRELOAD="$DIST/libvgpu.so" "$@"; }
[ -n "${OUT:-}" ] && exec > >(tee "$OUT/gpu-reliability-summary.txt") 2>&1

echo "== SIGKILL loop: $N victims, cap 8g / SM 50, one live holder"
env LD_PRELOAD="$DIST/libvgpu.so" "$S/test_alloc_paths" --path mem_alloc --size 256m --hold --hold-seconds 600 >"$WORK/holder.log" 2>&1 &
holder=$!
for _ in $(seq 50); do grep -q holding=1 "$WORK/holder.log" && break; sleep 0.1; done
killed=0
t0=$(date +%s.%N)
for i in $(seq "$N"); do
    case $((i % 3)) in
    0) env LD_PRELOAD="$DIST/libvgpu.so" "$S/test_vram_limit" --step 256m --max 6g >"$WORK/v$i.log" 2>&1 & ;;
    1) env LD_PRELOAD="$DIST/libvgpu.so" "$S/test_runtime_launch" --us 200 --seconds 5 >"$WORK/v$i.log" 2>&1 & ;;
    2) env LD_PRELOAD="$DIST/libvgpu.so" "$S/test_alloc_paths" --size 64m --hold --hold-seconds 5 >"$WORK/v$i.log" 2>&1 & ;;
    esac
    v=$!
    sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.3 + (r % 90) / 100 }')"
    kill -9 "$v" 2>/dev/null && killed=$((killed + 1))
    wait "$v" 2>/dev/null
done
t1=$(date +%s.%N)
# A fresh hooked process registers (reaping every dead slot) and reports the container's usage.
hook "$S/test_meminfo" >"$WORK/after.log" 2>&1
sleep 1
region_used=$("$DIST/tools/vgpu-smi" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["devices"][0]["memory_used_bytes"])')
nvml_holder=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -v p=$holder -F', ' '$1 == p { print $2 * 1048576 }')
nvml_total_apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' '{ s += $2 } END { print s * 1048576 }')
echo "  victims SIGKILLed while running: $killed of $N"
echo "  loop time: $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s"
echo "  region usage after the loop: $region_used bytes ($((region_used / 1048576)) MiB)"
echo "  host NVML, holder pid $holder: ${nvml_holder:-none} bytes; all compute apps: $nvml_total_apps bytes"
"$DIST/tools/vgpu-smi" | sed 's/^/  | /'
diff=$(( region_used - ${nvml_total_apps:-0} ))
echo "  region - NVML(all live compute apps) = $diff bytes"
if [ "${diff#-}" -le $((64 * 1048576)) ]; then echo "  result=PASS"; else echo "  result=FAIL"; fi
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
[ -n "${OUT:-}" ] && tar czf "$OUT/gpu-reliability-logs.tar.gz" -C "$WORK" . 2>/dev/null
exit 0
