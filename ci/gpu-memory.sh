#!/usr/bin/env bash
# gpu-memory.sh: issue 11 on a real GPU. Memory the device holds beyond plain cuMemAlloc must stay
# under the cap, and the container's usage (the region, as the program sees it through the hook)
# must equal what the host sees (nvidia-smi, hook off) after every step.
# Runs from the dist/ tree made by ci/package-gpu.sh (dist/ci/gpu-memory.sh); needs no Rust.
# The GPU must be otherwise idle (host memory.used deltas are measured against a baseline).
#
# usage: dist/ci/gpu-memory.sh [--device D] [section ...]
#   sections (default all): escape fork vllm frameworks
#     escape      test_mem_escape cases vmm, pool, graph, contexts (+2 green), ctx-destroy
#                 (findings 1-4): at every check point host delta <= cap and region == host delta
#     fork        finding 6: parent allocates 400 MiB under a 1 GiB cap, forks a child without
#                 CUDA, is SIGKILLed; a new process tries 400 MiB; then the child is killed.
#                 Prints what the host holds at each step (fork_observation=held|freed) and
#                 whether the hook agrees with it
#     vllm        sleep/wake allocator: cuMemCreate+cuMemMap per chunk, 3 cycles of wake / CUDA
#                 graph replay / sleep (unmap+release) under a 2 GiB cap; region == host each step
#     frameworks  PyTorch (default, expandable_segments:True, backend:cudaMallocAsync), CuPy
#                 (default, async pool), JAX (noprealloc, prealloc, platform) to OOM under a
#                 4 GiB cap: clean OOM, host peak delta <= cap (SKIP when a module is missing)
# Output: one `PASS name ...` / `FAIL name ...` / `SKIP name ...` line per check, then
# `summary pass=N fail=N skip=N`. Logs: per-run output in a temp dir; with $OUT set, the summary
# is copied to $OUT/gpu-memory-summary.txt and the logs packed into $OUT/gpu-memory-logs.tar.gz.
# Tolerance: region vs host delta within TOL_MIB (default 32) MiB (NVML counts whole MiB, and
# the driver's own bookkeeping moves a little); the host delta itself never above the cap.
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
S=$DIST/samples
PY=$DIST/bench/py
DEVICE=0
TOL_MIB=${TOL_MIB:-32}
sections=()
while [ $# -gt 0 ]; do
    case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    -h | --help) sed -n '2,26p' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
    *) sections+=("$1"); shift ;;
    esac
done
[ ${#sections[@]} -eq 0 ] && sections=(escape fork vllm frameworks)
export VGPU_SAMPLE_DEVICE=$DEVICE
LOG=$(mktemp -d /tmp/gpu-memory.XXXXXX)
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/gpu-memory-summary.txt") 2>&1
fi
echo "logs=$LOG dist=$DIST commit=$(cat "$DIST/COMMIT" 2>/dev/null || echo unknown) device=$DEVICE"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader -i "$DEVICE"
pass=0 fail=0 skip=0
t_start=$(date +%s)
verdict() { # verdict PASS|FAIL|SKIP name details...
    echo "$*"
    case $1 in PASS) pass=$((pass + 1)) ;; FAIL) fail=$((fail + 1)) ;; *) skip=$((skip + 1)) ;; esac
}
host_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$DEVICE" | tr -d ' '; }
mib() { awk -v s="$1" 'BEGIN { n = s + 0; u = tolower(substr(s, length(s))); if (u == "g") n *= 1024; else if (u == "t") n *= 1048576; printf "%d", n }'; }
# Wait until the host's usage settles back to the baseline (a process's teardown is asynchronous).
settle() { for _ in $(seq 50); do [ $(($(host_mib) - $1)) -le "$TOL_MIB" ] && return 0; sleep 0.1; done; return 1; }
fresh_region() { R=$(mktemp -u "$LOG/region.XXXXXX"); export CUDA_DEVICE_MEMORY_SHARED_CACHE=$R; }
hook() { env LD_PRELOAD="$DIST/libvgpu.so" "$@"; }

# escape_case NAME CAP args...: run test_mem_escape --pause under the hook; at each check point
# compare the host's delta with the cap and with the container's usage the program reports.
escape_case() {
    local name=$1 cap=$2; shift 2
    local cap_mib base log in out pid line check used_mib host delta
    cap_mib=$(mib "$cap")
    base=$(host_mib)
    fresh_region
    log=$LOG/$name.log
    coproc ESC { exec env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT="$cap" "$S/test_mem_escape" --pause "$@" 2>&1; }
    pid=$ESC_PID
    exec {out}<&"${ESC[0]}"
    while IFS= read -r -u "$out" line; do
        echo "$line" >>"$log"
        case $line in check=*) ;; *) continue ;; esac
        check=${line#check=}; check=${check%% *}
        used_mib=$(($(echo "$line" | sed 's/.*used=//') / 1048576))
        host=$(host_mib); delta=$((host - base))
        local d=$((delta - used_mib)); d=${d#-}
        # The host never above the cap (no tolerance there); the region within TOL_MIB of the host.
        if [ "$delta" -le "$cap_mib" ] && [ "$d" -le "$TOL_MIB" ]; then v=PASS; else v=FAIL; fi
        verdict $v "$name/$check" "host_delta_mib=$delta region_mib=$used_mib cap_mib=$cap_mib"
        kill -USR1 "$pid" 2>/dev/null
    done
    wait "$pid" 2>/dev/null
    exec {out}<&-
    grep -E '^(mapped|filled|contexts|green|big_alloc|graph_reserved|pool_filled|async_filled|cycle)=' "$log" | tr '\n' ' ' | sed "s/^/  $name: /"; echo
    grep -q '^result=PASS' "$log" || verdict FAIL "$name/result" "see $log"
    # Every loop that stopped early must have stopped on a clean CUDA_ERROR_OUT_OF_MEMORY.
    local stops bad
    stops=$(grep -o 'stop=[A-Za-z_]*' "$log" | sed 's/stop=//' | sort -u | tr '\n' ' ')
    bad=$(echo "$stops" | tr ' ' '\n' | grep -v -e '^$' -e '^max$' -e '^CUDA_ERROR_OUT_OF_MEMORY$' | head -1)
    if [ -n "$bad" ]; then verdict FAIL "$name/oom" "stopped on $bad"
    elif echo "$stops" | grep -q OUT_OF_MEMORY; then verdict PASS "$name/oom" "clean CUDA_ERROR_OUT_OF_MEMORY at the cap"; fi
    settle "$base" || echo "  note: host usage did not return to the baseline after $name"
}

for section in "${sections[@]}"; do
    case $section in
    escape)
        echo "== findings 1-4: test_mem_escape under the hook"
        escape_case vmm 2g --case vmm --chunk 512m --count 6
        escape_case pool 2g --case pool
        # The same capture with no hook: the reference for "the hook broke the capture".
        if env -u LD_PRELOAD "$S/test_mem_escape" --case graph >"$LOG/graph-native.log" 2>&1; then
            verdict PASS graph/native "the capture works without the hook"
        else
            verdict FAIL graph/native "$(grep -m1 error= "$LOG/graph-native.log")"
        fi
        escape_case graph 2g --case graph
        escape_case contexts 4g --case contexts --count 4 --green 2
        escape_case ctx-destroy 2g --case ctx-destroy
        ;;
    vllm)
        echo "== sleep/wake allocator (vLLM-style), 3 cycles with graph replay"
        escape_case vllm 2g --case vllm --chunk 256m --count 6
        ;;
    fork)
        echo "== finding 6: fork, parent SIGKILLed, child without CUDA lives"
        fresh_region
        export CUDA_DEVICE_MEMORY_LIMIT=1g
        base=$(host_mib)
        # env execs the program: $! is the parent itself (a backgrounded shell function would be
        # a subshell, and kill -9 would miss the program).
        env LD_PRELOAD="$DIST/libvgpu.so" "$S/test_mem_escape" --case fork-hold --size 400m >"$LOG/fork-parent.log" 2>&1 &
        parent=$!
        for _ in $(seq 100); do grep -q '^check=forked' "$LOG/fork-parent.log" && break; sleep 0.1; done
        child=$(sed -n 's/^child_pid=//p' "$LOG/fork-parent.log")
        region_mib() { hook "$S/test_meminfo" >/dev/null 2>&1; "$DIST/tools/vgpu-smi" --json 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["memory_used_bytes"] // 1048576)' 2>/dev/null || echo -1; }
        step() { # step NAME: host delta vs region
            local host delta reg d
            sleep 1
            host=$(host_mib); delta=$((host - base)); reg=$(region_mib)
            d=$((delta - reg)); d=${d#-}
            echo "  fork step=$1 host_delta_mib=$delta region_mib=$reg"
            if [ "$d" -le "$TOL_MIB" ]; then verdict PASS "fork/$1" "hook agrees with the host"; else verdict FAIL "fork/$1" "host_delta_mib=$delta region_mib=$reg"; fi
            last_delta=$delta
        }
        late_allocs() { # late_allocs LOG: allocations of one 400 MiB by a new hooked process (0 when refused)
            hook "$S/test_vram_limit" --step 400m --max 400m >"$1" 2>&1
            local n; n=$(sed -n 's/.*allocations=\([0-9]*\).*/\1/p' "$1" | tail -1); echo "${n:-0}"
        }
        step forked
        kill -9 "$parent"; wait "$parent" 2>/dev/null
        step parent_killed
        if [ "$last_delta" -ge 300 ]; then obs=held; else obs=freed; fi
        echo "fork_observation=$obs (host memory after the parent's SIGKILL while the child lives: ${last_delta} MiB over baseline)"
        # A new process wants 400 MiB: refused (at its context or its allocation) exactly when
        # the device still holds the parent's memory.
        late=$(late_allocs "$LOG/fork-late.log")
        echo "  fork late_process_allocations=$late (of one 400 MiB; $(grep -m1 -o 'error=[A-Z_]*' "$LOG/fork-late.log"))"
        if { [ $obs = held ] && [ "$late" = 0 ]; } || { [ $obs = freed ] && [ "$late" = 1 ]; }; then
            verdict PASS fork/late_process "the cap follows what the device holds ($obs)"
        else
            verdict FAIL fork/late_process "allocations=$late while the device $obs the parent's memory"
        fi
        kill -9 "$child" 2>/dev/null
        step child_killed
        after=$(late_allocs "$LOG/fork-after.log")
        if [ "$after" = 1 ]; then verdict PASS fork/after_child "400 MiB allocates once the child is gone"; else verdict FAIL fork/after_child "allocations=${after:-?}"; fi
        unset CUDA_DEVICE_MEMORY_LIMIT
        ;;
    frameworks)
        echo "== frameworks to OOM under a 4 GiB cap (host peak delta <= cap, clean OOM)"
        fw() { # fw NAME MODULE cmd...
            local name=$1 module=$2; shift 2
            if ! python3 -c "import $module" >/dev/null 2>&1; then verdict SKIP "fw/$name" "no python module $module"; return; fi
            fresh_region
            local base sampler peak log=$LOG/fw-$name.log
            base=$(host_mib)
            nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i "$DEVICE" -lms 100 >"$LOG/fw-$name.smi" 2>/dev/null &
            sampler=$!
            env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=4g timeout 150 "$@" --hold-seconds 1 >"$log" 2>&1
            kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
            peak=$(sort -n "$LOG/fw-$name.smi" | tail -1 | tr -d ' ')
            local delta=$((${peak:-0} - base)) got
            got=$(grep -o 'allocated_mib=[0-9]* allocations=[0-9]* stop_reason=[a-z]*' "$log" | tail -1)
            if grep -q '^result=PASS' "$log" && grep -q 'stop_reason=oom' "$log" && [ "$delta" -le 4096 ]; then
                verdict PASS "fw/$name" "host_peak_delta_mib=$delta $got"
            else
                verdict FAIL "fw/$name" "host_peak_delta_mib=$delta $got $(grep -m1 '^error=' "$log")"
            fi
            settle "$base" || true
        }
        fw torch-default torch python3 "$PY/torch_oom.py" --mode default --device "$DEVICE"
        fw torch-expandable torch python3 "$PY/torch_oom.py" --mode expandable --device "$DEVICE"
        fw torch-async torch python3 "$PY/torch_oom.py" --mode async --device "$DEVICE"
        fw cupy-default cupy python3 "$PY/cupy_oom.py" --pool default --device "$DEVICE"
        fw cupy-async cupy python3 "$PY/cupy_oom.py" --pool async --device "$DEVICE"
        for m in noprealloc prealloc platform; do
            fw "jax-$m" jax env CUDA_VISIBLE_DEVICES="$DEVICE" python3 "$PY/jax_oom.py" --mode "$m"
        done
        ;;
    *) echo "unknown section $section" >&2 ;;
    esac
done
echo "summary pass=$pass fail=$fail skip=$skip seconds=$(($(date +%s) - t_start))"
[ -n "${OUT:-}" ] && tar czf "$OUT/gpu-memory-logs.tar.gz" -C "$LOG" . 2>/dev/null
[ "$fail" -eq 0 ]
