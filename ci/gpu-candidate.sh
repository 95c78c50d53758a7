#!/usr/bin/env bash
# gpu-candidate.sh: judge another build of the hook (a branch's libvgpu.so) against dist/libvgpu.so
# on a GPU, as sessions 18-21 learned to: GPT-2's speed at cap 99 moves 0.74-1.02 from round to
# round, so builds are compared only within a round, and a candidate lands only after parts 1 and 2.
#   compare [ROUNDS]  GPT-2 training at cap 99: each build once for 45 s with the gate's debug
#                     counters (steps/s, time held, queue waits), then bench/py/gate_cost.py's paired
#                     rounds (default 6, ~70 s each on an H100; each run printed as it ends)
#   part N            ci/gpu-acceptance.sh N with the candidate as libvgpu.so (a copy of dist/ in /tmp)
# usage: dist/ci/gpu-candidate.sh LIB compare [ROUNDS] | LIB part N      ($OUT: logs are written there)
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
lib=${1:-}
[ -n "$lib" ] && [ -f "$lib" ] || { sed -n '2,9p' "$0"; echo "error=no_candidate_library path=${lib:-<none>}" >&2; exit 2; }
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
export DIST PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
case "${2:-}" in
compare)
    for l in "$DIST/libvgpu.so" "$lib"; do
        log=$out/candidate-debug-$(basename "$l").log
        LD_PRELOAD=$l LIBCUDA_LOG_LEVEL=4 CUDA_DEVICE_SM_LIMIT=99 CUDA_DEVICE_MEMORY_SHARED_CACHE=$(mktemp -u /tmp/cand-XXXXXX) \
            timeout 45 python3 "$DIST/bench/py/workloads.py" gpt2 >"$log" 2>&1
        # Steps/s from the first and last progress lines; the gate's last counters and meter line.
        rate=$(awk '/^progress /{split($2,t,"=");split($3,n,"="); if(!s){t0=t[2];n0=n[2];s=1} t1=t[2];n1=n[2]} END{if(t1>t0) printf "%.2f", (n1-n0)/(t1-t0); else print "nan"}' "$log")
        echo "candidate_debug lib=$(basename "$l") steps_per_s=$rate"
        grep "launch gate" "$log" | tail -1 | sed 's/^.*launch gate: /  gate: /' | cut -c1-300
        grep "meter dev" "$log" | tail -1 | sed 's/^.*meter dev/  meter dev/' | cut -c1-300
    done
    ALT=$lib MODES="cap99 alt_cap99" python3 "$DIST/bench/py/gate_cost.py" gpt2 6 "${3:-6}" ;;
part)
    copy=$(mktemp -d /tmp/candidate-dist-XXXXXX)
    cp -r "$DIST/." "$copy/"
    cp "$lib" "$copy/libvgpu.so"
    echo "candidate $(basename "$lib") over $(cat "$DIST/COMMIT" 2>/dev/null || echo unknown)" >"$copy/COMMIT"
    "$copy/ci/gpu-acceptance.sh" "${3:-}"
    rc=$?
    rm -rf "$copy"
    exit $rc ;;
*) sed -n '2,9p' "$0"; exit 2 ;;
esac
