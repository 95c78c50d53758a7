#!/usr/bin/env bash
# gpu-suite.sh: the measurements on a real GPU, hook off and hook on in the same run.
# Runs from the dist/ tree made by ci/package-gpu.sh (dist/ci/gpu-suite.sh); needs no Rust.
#
# usage: dist/ci/gpu-suite.sh [options] [section ...]
#   sections (default: all): env launch malloc vram procaddr smi torch frameworks share graph
#   --seconds N     seconds per measurement cell (share, graph, train; default 3)
#   --caps "LIST"   SM caps for the share matrix (default "10 25 50 75 90")
#   --kernels "LIST" kernel lengths in us for the share matrix (default "10 100 1000 10000")
#   --modes "LIST"  launch patterns: sync1 (sync after each launch) and/or async100
#                   (sync every 100 launches) (default "sync1 async100")
#   --mem-cap SIZE  memory cap for vram/procaddr/smi sections (default 1g)
#   --fw-cap SIZE   memory cap for the torch/jax/cupy sections (default 4g)
#   --device D      CUDA device (default 0)
# Logs: every run's full output, one file per run, in a temp dir; with $OUT set they are packed
# into $OUT/gpu-suite-logs.tar.gz and the summary tables (stdout) copied to
# $OUT/gpu-suite-summary.txt. Hook env per run: LD_PRELOAD=$DIST/libvgpu.so, the caps,
# CUDA_DEVICE_MEMORY_SHARED_CACHE=<fresh path>.
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
S=$DIST/samples
PY=$DIST/bench/py
STATS="python3 $PY/suite_stats.py"
SECONDS_PER_CELL=3
CAPS="10 25 50 75 90"
KERNELS="10 100 1000 10000"
MODES="sync1 async100"
MEM_CAP=1g
FW_CAP=4g
DEVICE=0
sections=()
while [ $# -gt 0 ]; do
    case "$1" in
    --seconds) SECONDS_PER_CELL=$2; shift 2 ;;
    --caps) CAPS=$2; shift 2 ;;
    --kernels) KERNELS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --mem-cap) MEM_CAP=$2; shift 2 ;;
    --fw-cap) FW_CAP=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) echo "unknown option $1 (try --help)" >&2; exit 2 ;;
    *) sections+=("$1"); shift ;;
    esac
done
[ ${#sections[@]} -eq 0 ] && sections=(env launch malloc vram procaddr smi torch frameworks share graph)
export VGPU_SAMPLE_DEVICE=$DEVICE

# Logs go to a scratch dir; with $OUT set they are packed at the end into
# $OUT/gpu-suite-logs.tar.gz and the summary is copied to $OUT/gpu-suite-summary.txt.
LOG=$(mktemp -d /tmp/gpu-suite.XXXXXX)/gpu-suite
mkdir -p "$LOG"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    exec > >(tee "$OUT/gpu-suite-summary.txt") 2>&1
fi
echo "logs=$LOG dist=$DIST commit=$(cat "$DIST/COMMIT" 2>/dev/null || echo unknown)"
[ -f "$DIST/libvgpu.so" ] || echo "warning: $DIST/libvgpu.so missing: hook-on runs will fail"
failures=0

# ---------------------------------------------------------------- helpers

# run NAME MEM SM -- CMD...: run CMD, logging to $LOG/NAME.log. MEM "-" = hook off; otherwise
# libvgpu.so is preloaded with a fresh region file and those caps ("" = no cap of that kind).
# Inherited LD_PRELOAD / cap variables never leak into a run.
run() {
    local name=$1 mem=$2 sm=$3
    shift 4
    local log="$LOG/$name.log" region="" rc
    local -a e=(-u LD_PRELOAD -u CUDA_DEVICE_MEMORY_LIMIT -u CUDA_DEVICE_SM_LIMIT
        -u CUDA_DEVICE_MEMORY_SHARED_CACHE)
    if [ "$mem" != "-" ]; then
        region=$(mktemp -u /tmp/vgpu.XXXXXX)
        e+=(LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_SHARED_CACHE="$region")
        [ -n "$mem" ] && e+=(CUDA_DEVICE_MEMORY_LIMIT="$mem")
        [ -n "$sm" ] && e+=(CUDA_DEVICE_SM_LIMIT="$sm")
    fi
    mkdir -p "$(dirname "$log")"
    echo "# env ${e[*]} $*" >"$log"
    env "${e[@]}" "$@" >>"$log" 2>&1
    rc=$?
    [ -n "$region" ] && rm -f "$region"
    echo "# rc=$rc" >>"$log"
    [ $rc -ne 0 ] && echo "  ($name exited $rc; see $log)"
    return $rc
}
key() { $STATS key "$LOG/$1.log" "$2"; }
ratio() { $STATS ratio "$1" "$2"; }
mib() { awk -v b="$1" 'BEGIN { if (b ~ /^[0-9]+$/) printf "%d", b / 1048576; else print b }'; }
section() { printf '\n== %s\n' "$1"; }
note_fail() { failures=$((failures + 1)); }

RUNTIME=$DIST/bench/gpu/bin/runtime_launch
ensure_runtime() {
    [ -x "$RUNTIME" ] && return 0
    "$DIST/bench/gpu/build.sh" >"$LOG/build-runtime.log" 2>&1 || {
        echo "  (bench/gpu/build.sh failed; see $LOG/build-runtime.log)"
        return 1
    }
}

# ---------------------------------------------------------------- sections

s_env() {
    section "env: device and the views of its memory"
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader \
        | sed 's/^/  host nvidia-smi: /'
    run env/meminfo-off - - -- "$S/test_meminfo" --device "$DEVICE"
    run env/meminfo-on "$MEM_CAP" "" -- "$S/test_meminfo" --device "$DEVICE"
    printf '  %-8s %14s %14s %14s %14s\n' view meminfo_total meminfo_free nvml_total nvml_used
    for v in off on; do
        printf '  %-8s %14s %14s %14s %14s\n' "hook-$v" "$(key env/meminfo-$v meminfo_total)" \
            "$(key env/meminfo-$v meminfo_free)" "$(key env/meminfo-$v nvml_total)" \
            "$(key env/meminfo-$v nvml_used)"
    done
}

s_launch() {
    section "launch overhead: empty kernel, median ns per launch"
    run launch/off - - -- "$S/bench_launch"
    run launch/on-nocap "" "" -- "$S/bench_launch"
    run launch/on-cap50 "" 50 -- "$S/bench_launch"
    local base
    base=$(key launch/off launch_ns)
    printf '  %-22s %10s %8s\n' case launch_ns ratio
    for c in off on-nocap on-cap50; do
        printf '  %-22s %10s %8s\n' "driver $c" "$(key launch/$c launch_ns)" \
            "$(ratio "$(key launch/$c launch_ns)" "$base")"
    done
    if ensure_runtime; then
        run launch/rt-off - - -- "$RUNTIME" launch --device "$DEVICE"
        run launch/rt-on-nocap "" "" -- "$RUNTIME" launch --device "$DEVICE"
        run launch/rt-on-cap50 "" 50 -- "$RUNTIME" launch --device "$DEVICE"
        base=$(key launch/rt-off launch_ns)
        for c in off on-nocap on-cap50; do
            printf '  %-22s %10s %8s\n' "cudart $c" "$(key launch/rt-$c launch_ns)" \
                "$(ratio "$(key launch/rt-$c launch_ns)" "$base")"
        done
    fi
}

s_malloc() {
    section "malloc overhead: alloc+free of 1 MiB, median ns per pair"
    run malloc/off - - -- "$S/bench_malloc"
    run malloc/on "$FW_CAP" "" -- "$S/bench_malloc"
    printf '  %-22s %12s %8s\n' case malloc_free_ns ratio
    local base
    base=$(key malloc/off malloc_free_ns)
    for c in off on; do
        printf '  %-22s %12s %8s\n' "driver $c" "$(key malloc/$c malloc_free_ns)" \
            "$(ratio "$(key malloc/$c malloc_free_ns)" "$base")"
    done
    if ensure_runtime; then
        run malloc/rt-off - - -- "$RUNTIME" malloc --device "$DEVICE"
        run malloc/rt-on "$FW_CAP" "" -- "$RUNTIME" malloc --device "$DEVICE"
        base=$(key malloc/rt-off malloc_free_ns)
        for c in off on; do
            printf '  %-22s %12s %8s\n' "cudart $c" "$(key malloc/rt-$c malloc_free_ns)" \
                "$(ratio "$(key malloc/rt-$c malloc_free_ns)" "$base")"
        done
    fi
}

s_vram() {
    section "memory cap $MEM_CAP: allocatable in 64 MiB steps, per API"
    printf '  %-10s %14s %12s %16s %s\n' api allocated_mib stop meminfo_total_mib last_result
    for api in driver pitch managed vmm async; do
        run "vram/$api" "$MEM_CAP" "" -- "$S/test_vram_limit" --api "$api" --step 64m || note_fail
        printf '  %-10s %14s %12s %16s %s\n' "$api" "$(key vram/$api allocated_mib)" \
            "$(key vram/$api stop_reason)" "$(mib "$(key vram/$api meminfo_total)")" \
            "$(key vram/$api last_result)"
    done
    run vram/alloc_paths "$MEM_CAP" "" -- "$S/test_alloc_paths" --size 64m || note_fail
    echo "  alloc paths under the cap (64 MiB each):"
    grep -E '^path=[a-z_0-9]+ result=' "$LOG/vram/alloc_paths.log" | sed 's/^/    /'
    run vram/alloc "$FW_CAP" "" -- "$S/test_alloc" --max-k 30 || note_fail
    echo "  test_alloc under a $FW_CAP cap: $(grep '^allocs_ok=' "$LOG/vram/alloc.log")"
    # Two contexts (parent + exec'ed child) must fit: use the framework cap.
    run vram/fork "$FW_CAP" "" -- "$S/test_fork" --size 128m --child exec || note_fail
    echo "  test_fork --child exec under a $FW_CAP cap: $(key vram/fork result)"
}

s_procaddr() {
    section "cuGetProcAddress / RTLD_NEXT / cudart paths under a $MEM_CAP cap"
    run procaddr/on "$MEM_CAP" "" -- "$S/test_procaddr" || note_fail
    run procaddr/rtld_next "$MEM_CAP" "" -- "$S/test_rtld_next" --over 2g || note_fail
    printf '  %-28s %14s %16s %s\n' path allocated_mib meminfo_total_mib result
    printf '  %-28s %14s %16s %s\n' "driver via cuGetProcAddress" \
        "$(key procaddr/on procaddr_allocated_mib)" "$(mib "$(key procaddr/on meminfo_total)")" \
        "$(key procaddr/on result)"
    printf '  %-28s %14s %16s %s\n' "RTLD_NEXT wrapper" \
        "$(key procaddr/rtld_next rtld_next_allocated_mib)" \
        "$(mib "$(key procaddr/rtld_next meminfo_total)")" "$(key procaddr/rtld_next result)"
    echo "  lookups not resolved to the hooked export (same_as_dlsym=0):"
    grep -E '^lookup .*same_as_dlsym=0' "$LOG/procaddr/on.log" | sed 's/^/    /' | head -20
    if ensure_runtime; then
        run procaddr/cudart "$MEM_CAP" "" -- "$RUNTIME" oom --step-mib 64 --device "$DEVICE" || note_fail
        printf '  %-28s %14s %16s %s\n' "cudart cudaMalloc" "$(key procaddr/cudart allocated_mib)" \
            "$(mib "$(key procaddr/cudart meminfo_total)")" "$(key procaddr/cudart result)"
    fi
}

s_smi() {
    section "nvidia-smi inside the container (hook, $MEM_CAP cap, 256 MiB held) vs host view"
    local region holder
    region=$(mktemp -u /tmp/vgpu.XXXXXX)
    LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=$MEM_CAP \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$region \
        "$S/test_alloc_paths" --path mem_alloc --size 256m --hold --hold-seconds 60 \
        >"$LOG/smi-holder.log" 2>&1 &
    holder=$!
    for _ in $(seq 100); do grep -q '^holding=1' "$LOG/smi-holder.log" && break; sleep 0.1; done
    local q=(--query-gpu=memory.total,memory.used --format=csv,noheader -i "$DEVICE")
    echo "  inside: $(LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=$MEM_CAP \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$region nvidia-smi "${q[@]}" 2>&1 | head -1)"
    echo "  host:   $(env -u LD_PRELOAD nvidia-smi "${q[@]}" 2>&1 | head -1)"
    LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=$MEM_CAP \
        CUDA_DEVICE_MEMORY_SHARED_CACHE=$region nvidia-smi >"$LOG/smi-inside-full.log" 2>&1
    kill -TERM "$holder" 2>/dev/null
    wait "$holder"
    echo "  holder: $(grep -E '^(holding|paths)=' "$LOG/smi-holder.log" | tr '\n' ' ')"
    rm -f "$region"
}

s_torch() {
    section "PyTorch under a $FW_CAP cap: 256 MiB tensors until OOM"
    printf '  %-12s %14s %10s %18s %s\n' mode allocated_mib stop mem_get_info_total result
    for m in default expandable async; do
        run "torch/oom-$m" "$FW_CAP" "" -- python3 "$PY/torch_oom.py" --mode "$m" \
            --device "$DEVICE" || note_fail
        printf '  %-12s %14s %10s %18s %s error=%s\n' "$m" "$(key torch/oom-$m allocated_mib)" \
            "$(key torch/oom-$m stop_reason)" "$(mib "$(key torch/oom-$m mem_get_info_total)")" \
            "$(key torch/oom-$m result)" "$(key torch/oom-$m error)"
    done
    section "PyTorch training steps/s: hook off vs SM cap 50"
    run torch/train-off - - -- python3 "$PY/torch_train.py" --seconds "$SECONDS_PER_CELL" --device "$DEVICE"
    run torch/train-cap50 "" 50 -- python3 "$PY/torch_train.py" --seconds "$SECONDS_PER_CELL" --device "$DEVICE"
    local a b
    a=$(key torch/train-off avg_steps_per_sec)
    b=$(key torch/train-cap50 avg_steps_per_sec)
    echo "  off=$a cap50=$b share=$(ratio "$b" "$a")"
}

s_frameworks() {
    section "CuPy and JAX under a $FW_CAP cap"
    printf '  %-22s %14s %10s %s\n' case allocated_mib stop result
    for p in default async none; do
        run "fw/cupy-$p" "$FW_CAP" "" -- python3 "$PY/cupy_oom.py" --pool "$p" --device "$DEVICE" || note_fail
        printf '  %-22s %14s %10s %s\n' "cupy $p" "$(key fw/cupy-$p allocated_mib)" \
            "$(key fw/cupy-$p stop_reason)" "$(key fw/cupy-$p result) error=$(key fw/cupy-$p error)"
    done
    for m in noprealloc prealloc platform; do
        run "fw/jax-$m" "$FW_CAP" "" -- env CUDA_VISIBLE_DEVICES="$DEVICE" python3 "$PY/jax_oom.py" --mode "$m" || note_fail
        printf '  %-22s %14s %10s %s\n' "jax $m" "$(key fw/jax-$m allocated_mib)" \
            "$(key fw/jax-$m stop_reason)" "$(key fw/jax-$m result) bytes_limit=$(key fw/jax-$m bytes_limit)"
    done
}

s_share() {
    section "compute share: capped kernels/s / uncapped kernels/s (${SECONDS_PER_CELL}s per cell)"
    printf '  %-6s %-9s %4s %12s %12s  %s\n' kernel mode cap base_kps capped_kps stats
    for us in $KERNELS; do
        for mode in $MODES; do
            local sync
            case $mode in sync1) sync=1 ;; async100) sync=100 ;; *) echo "  unknown mode $mode"; continue ;; esac
            local args=("$S/test_runtime_launch" --us "$us" --seconds "$SECONDS_PER_CELL" --sync-every "$sync")
            local base="share/k${us}-${mode}-off"
            run "$base" - - -- "${args[@]}"
            for cap in $CAPS; do
                local c="share/k${us}-${mode}-cap$cap"
                run "$c" "" "$cap" -- "${args[@]}"
                printf '  %-6s %-9s %4s %12s %12s  %s\n' "${us}us" "$mode" "$cap" \
                    "$(key "$base" avg_kernels_per_sec)" "$(key "$c" avg_kernels_per_sec)" \
                    "$($STATS share "$LOG/$base.log" "$LOG/$c.log" "$cap")"
            done
        done
    done
}

s_graph() {
    section "CUDA graphs: 100 x 100 us spin kernels per graph, hook off vs SM cap 50"
    run graph/off - - -- "$S/test_graph" --seconds "$SECONDS_PER_CELL"
    run graph/cap50 "" 50 -- "$S/test_graph" --seconds "$SECONDS_PER_CELL"
    local a b
    a=$(key graph/off avg_graphs_per_sec)
    b=$(key graph/cap50 avg_graphs_per_sec)
    echo "  graphs/s off=$a cap50=$b share=$(ratio "$b" "$a")"
}

for s in "${sections[@]}"; do
    case $s in
    env | launch | malloc | vram | procaddr | smi | torch | frameworks | share | graph) "s_$s" ;;
    all) for t in env launch malloc vram procaddr smi torch frameworks share graph; do "s_$t"; done ;;
    *) echo "unknown section $s (try --help)"; exit 2 ;;
    esac
done
echo
echo "failures=$failures logs=$LOG"
if [ -n "${OUT:-}" ]; then
    tar czf "$OUT/gpu-suite-logs.tar.gz" -C "$(dirname "$LOG")" gpu-suite
    echo "packed=$OUT/gpu-suite-logs.tar.gz"
fi
[ "$failures" -eq 0 ]
