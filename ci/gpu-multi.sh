#!/usr/bin/env bash
# gpu-multi.sh: multi-GPU cases on a real 2-GPU machine, from the dist/ tree (dist/ci/gpu-multi.sh):
#   caps     one process per device and one process driving both, different memory caps per device
#   remap    CUDA_VISIBLE_DEVICES=1,0: cap i follows the program's device i, CUDA and NVML agree
#   sm       per-device SM caps 25 (device 0) and 75 (device 1) at the same time
#   nccl     torch.distributed NCCL all-reduce, one process per GPU, hook off vs on (4g + SM 50)
#   sizing   a PyTorch program sizing itself from torch.cuda.mem_get_info() sizes to the cap
# usage: gpu-multi.sh [section ...]   (default: all; about 2-3 minutes)
# Env: SECS (SM run length, default 6), OUT (logs and the summary are copied there when set).
# Every process runs with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# NVSHMEM_DISABLE_NVLS=1 (no NVLink multicast on this machine).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DIST=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
S=$DIST/samples
PY=$DIST/bench/py
LIB=$DIST/libvgpu.so
SECS=${SECS:-6}
WORK=$(mktemp -d /tmp/gpu-multi.XXXXXX)
SUMMARY=$WORK/summary.tsv
: >"$SUMMARY"
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && exec > >(tee "$OUT/gpu-multi-summary.txt") 2>&1
sections=("$@")
[ ${#sections[@]} -eq 0 ] && sections=(caps remap sm nccl sizing)
T0=$(date +%s)

# Clear any cap or device selection inherited from the caller.
for v in $(env | sed -n 's/^\(CUDA_DEVICE_MEMORY_LIMIT[_0-9]*\|CUDA_DEVICE_SM_LIMIT[_0-9]*\|CUDA_MEM_LIMIT[_0-9]*\|CUDA_CORE_LIMIT[_0-9]*\|CUDA_VISIBLE_DEVICES\|LD_PRELOAD\)=.*/\1/p'); do
    unset "$v"
done

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
echo "gpus=$ngpu dist=$DIST work=$WORK commit=$(cat "$DIST/COMMIT" 2>/dev/null || echo ?)"
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/  /'
if [ "$ngpu" -lt 2 ]; then
    echo "error=needs_two_gpus (found $ngpu)"
    exit 1
fi

# row CASE EXPECTED GOT VERDICT: one line of the summary table.
row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$SUMMARY"; printf '  %-44s %-30s %-40s %s\n' "$1" "$2" "$3" "$4"; }
kv() { sed -n "s/.*\b$2=\([^ ]*\).*/\1/p" "$1" | tail -1; }       # kv FILE KEY: last value
dkv() { sed -n "s/^device=$2 .*\b$3=\([^ ]*\).*/\1/p" "$1" | tail -1; }  # dkv FILE DEV KEY
mib() { awk -v b="${1:-0}" 'BEGIN { printf "%d", b / 1048576 }'; }
ok() { if [ "$1" = 1 ]; then echo PASS; else echo FAIL; fi; }
within() { awk -v a="$1" -v lo="$2" -v hi="$3" 'BEGIN { print (a >= lo && a <= hi) ? 1 : 0 }'; }
# bg CMD...: run in the background; waitall waits for those only (a bare `wait` would also wait
# for the tee of the OUT redirection above).
PIDS=()
bg() { "$@" & PIDS+=($!); }
waitall() { [ ${#PIDS[@]} -gt 0 ] && wait "${PIDS[@]}"; PIDS=(); }
hook() { env LD_PRELOAD="$LIB" CUDA_DEVICE_MEMORY_SHARED_CACHE="$1" "${@:2}"; }
# Host view (no hook): max memory.used per GPU while a sampler runs.
sampler_start() { nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 200 >"$WORK/$1.smi" 2>/dev/null & SAMPLER=$!; }
sampler_stop() { kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }
smi_max() { awk -F', *' -v g="$2" '$1 == g && $2 + 0 > m { m = $2 + 0 } END { print m + 0 }' "$WORK/$1.smi"; }
uuid_of() { nvidia-smi --query-gpu=index,uuid --format=csv,noheader | awk -F', *' -v g="$1" '$1 == g { print $2 }'; }

s_caps() {
    echo "== caps: CUDA_DEVICE_MEMORY_LIMIT_0=1g _1=2g; allocatable in 64 MiB steps (cap less the context)"
    local r=$WORK/r-caps d
    for d in 0 1; do
        bg hook "$r" CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g timeout 60 \
            "$S/test_vram_limit" --device $d --step 64m >"$WORK/caps-vram-$d.log" 2>&1
    done
    waitall
    for d in 0 1; do
        local cap=$((1024 * (d + 1))) a t
        a=$(mib "$(kv "$WORK/caps-vram-$d.log" allocated_bytes)")
        t=$(mib "$(kv "$WORK/caps-vram-$d.log" meminfo_total)")
        row "test_vram_limit --device $d (own process)" "alloc<$cap total=$cap MiB" "alloc=$a total=$t stop=$(kv "$WORK/caps-vram-$d.log" stop_reason)" \
            "$(ok "$(( ${a:-0} > cap / 4 && ${a:-0} < cap && ${t:-0} == cap ))")"
    done
    echo "   one process, both devices (PyTorch; sizes from mem_get_info, then steps to OOM):"
    hook "$WORK/r-caps1" CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g timeout 90 \
        python3 "$PY/torch_meminfo_sizing.py" --devices 0,1 --expect-total-mib 1024,2048 >"$WORK/caps-torch.log" 2>&1
    for d in 0 1; do
        local cap=$((1024 * (d + 1))) line a t
        line=$(grep "^device=$d " "$WORK/caps-torch.log" | tail -1)
        a=$(echo "$line" | sed -n 's/.*allocated_mib=\([0-9]*\).*/\1/p')
        t=$(echo "$line" | sed -n 's/.*mem_get_info_total_mib=\([0-9]*\).*/\1/p')
        row "torch, one process, cuda:$d" "alloc<$cap total=$cap MiB" "alloc=${a:-?} total=${t:-?} stop=$(echo "$line" | sed -n 's/.*stop=\([^ ]*\).*/\1/p')" \
            "$(ok "$([ -n "$a" ] && [ -n "$t" ] && [ "$a" -lt "$cap" ] && [ "$a" -gt $((cap / 4)) ] && [ "$t" -eq "$cap" ] && echo 1)")"
    done
}

s_remap() {
    echo "== remap: CUDA_VISIBLE_DEVICES=1,0 with CUDA_DEVICE_MEMORY_LIMIT_0=1g _1=2g"
    local r=$WORK/r-remap u0 u1
    u0=$(uuid_of 0)
    u1=$(uuid_of 1)
    hook "$r" CUDA_VISIBLE_DEVICES=1,0 CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g timeout 60 \
        "$S/test_meminfo" >"$WORK/remap-meminfo.log" 2>&1
    local o phys cap uuid mt dt nt
    for o in 0 1; do
        phys=$((1 - o)); cap=$((1024 * (o + 1)))
        uuid=$(dkv "$WORK/remap-meminfo.log" $o uuid)
        mt=$(mib "$(dkv "$WORK/remap-meminfo.log" $o meminfo_total)")
        dt=$(mib "$(dkv "$WORK/remap-meminfo.log" $o device_total_mem)")
        nt=$(mib "$(dkv "$WORK/remap-meminfo.log" $o nvml_total)")
        local want_uuid=$u0
        [ $phys = 1 ] && want_uuid=$u1
        row "ordinal $o = physical $phys" "uuid=GPU$phys cap=$cap" "uuid_ok=$([ "$uuid" = "$want_uuid" ] && echo 1 || echo 0) meminfo=$mt devtotal=$dt nvml=$nt" \
            "$(ok "$([ "$uuid" = "$want_uuid" ] && [ "$mt" = $cap ] && [ "$dt" = $cap ] && [ "$nt" = $cap ] && echo 1)")"
    done
    # nvidia-smi inside the container (hooked, NVML-only): physical 0 is the program's device 1.
    hook "$r" CUDA_VISIBLE_DEVICES=1,0 CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g timeout 30 \
        nvidia-smi --query-gpu=index,memory.total --format=csv,noheader,nounits >"$WORK/remap-smi.log" 2>&1
    local s0 s1
    s0=$(awk -F', *' '$1 == 0 { print $2 }' "$WORK/remap-smi.log")
    s1=$(awk -F', *' '$1 == 1 { print $2 }' "$WORK/remap-smi.log")
    row "nvidia-smi (hooked) memory.total by index" "GPU0=2048 GPU1=1024" "GPU0=${s0:-?} GPU1=${s1:-?}" \
        "$(ok "$([ "${s0:-}" = 2048 ] && [ "${s1:-}" = 1024 ] && echo 1)")"
}

s_sm() {
    echo "== sm: 1 ms spin kernels, sync each, ${SECS}s; caps CUDA_DEVICE_SM_LIMIT_0=25 _1=75 at once (one region)"
    local d
    for d in 0 1; do
        bg timeout $((SECS + 30)) "$S/test_runtime_launch" --device $d --us 1000 --seconds "$SECS" >"$WORK/sm-base-$d.log" 2>&1
    done
    waitall
    for d in 0 1; do
        bg hook "$WORK/r-sm" CUDA_DEVICE_SM_LIMIT_0=25 CUDA_DEVICE_SM_LIMIT_1=75 timeout $((SECS + 30)) \
            "$S/test_runtime_launch" --device $d --us 1000 --seconds "$SECS" >"$WORK/sm-cap-$d.log" 2>&1
    done
    waitall
    rate() { awk -F'[= ]' '/^second=/ { if ($2 >= 2) { s += $4; n++ } } END { printf "%.1f", (n ? s / n : 0) }' "$1"; }
    for d in 0 1; do
        local cap=$((25 + 50 * d)) b c share
        b=$(rate "$WORK/sm-base-$d.log")
        c=$(rate "$WORK/sm-cap-$d.log")
        share=$(awk -v a="$c" -v b="$b" 'BEGIN { printf "%.1f", (b > 0 ? 100 * a / b : 0) }')
        row "SM cap device $d" "${cap}% (+-8)" "share=${share}% ($c of $b kernels/s)" \
            "$(ok "$(within "$share" $((cap - 8)) $((cap + 8)))")"
    done
}

s_nccl() {
    echo "== nccl: all-reduce of 256 MiB float32 across 2 GPUs (mp.spawn, one process per GPU)"
    echo "   hook on: CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_SM_LIMIT=50 for both devices"
    sampler_start nccl-off
    timeout 150 python3 "$PY/nccl_allreduce.py" --gpus 2 --size-mib 256 --iters 40 >"$WORK/nccl-off.log" 2>&1
    local rc_off=$?
    sampler_stop
    sampler_start nccl-on
    hook "$WORK/r-nccl" CUDA_DEVICE_MEMORY_LIMIT=4g CUDA_DEVICE_SM_LIMIT=50 timeout 150 \
        python3 "$PY/nccl_allreduce.py" --gpus 2 --size-mib 256 --iters 40 >"$WORK/nccl-on.log" 2>&1
    local rc_on=$?
    sampler_stop
    local off on
    on=$(grep '^gpus=' "$WORK/nccl-on.log" | sed -n 's/.*allreduce_ms=\([^ ]*\).*/\1/p')
    off=$(grep '^gpus=' "$WORK/nccl-off.log" | sed -n 's/.*allreduce_ms=\([^ ]*\).*/\1/p')
    row "nccl hook off" "PASS, exit 0" "rc=$rc_off ms/allreduce=${off:-?} $(grep '^gpus=' "$WORK/nccl-off.log" | sed -n 's/.*result=\([A-Z]*\).*/\1/p')" \
        "$(ok "$([ $rc_off = 0 ] && echo 1)")"
    row "nccl hook on (4g, SM 50)" "PASS, no hang (rc!=124), no OOM" "rc=$rc_on ms/allreduce=${on:-?} ratio=$(awk -v a="${on:-0}" -v b="${off:-0}" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')" \
        "$(ok "$([ $rc_on = 0 ] && echo 1)")"
    grep -h 'error=' "$WORK/nccl-on.log" | head -3 | sed 's/^/     on: /'
    local d m cap=4096
    for d in 0 1; do
        m=$(smi_max nccl-on $d)
        local tot
        tot=$(kv <(grep "^rank=$d " "$WORK/nccl-on.log") mem_get_info_total_mib)
        row "nccl hook on: host memory.used GPU$d" "<= $cap MiB (cap)" "max_used=${m} MiB (off: $(smi_max nccl-off $d)) mem_get_info_total=${tot:-?}" \
            "$(ok "$([ "$m" -gt 0 ] && [ "$m" -le $cap ] && [ "${tot:-0}" = $cap ] && echo 1)")"
    done
}

s_sizing() {
    echo "== sizing: torch.cuda.mem_get_info() under CUDA_DEVICE_MEMORY_LIMIT=4g, program allocates 80% of free"
    hook "$WORK/r-sizing" CUDA_DEVICE_MEMORY_LIMIT=4g timeout 90 \
        python3 "$PY/torch_meminfo_sizing.py" --devices 0 --fraction 0.8 --expect-total-mib 4096 >"$WORK/sizing.log" 2>&1
    local line
    line=$(grep '^device=0 ' "$WORK/sizing.log" | tail -1)
    row "mem_get_info sizing, cuda:0" "total=4096 planned fits, OOM<4096" "$(echo "$line" | sed 's/device=0 //; s/mem_get_info_//g')" \
        "$(grep -q '^result=PASS' "$WORK/sizing.log" && echo PASS || echo FAIL)"
}

for sec in "${sections[@]}"; do
    if declare -F "s_$sec" >/dev/null; then
        "s_$sec"
    else
        echo "error=unknown_section $sec"
    fi
done

echo
echo "== summary ($(($(date +%s) - T0)) s)"
printf '%-44s | %-30s | %-40s | %s\n' case expected got verdict
awk -F'\t' '{ printf "%-44s | %-30s | %-40s | %s\n", $1, $2, $3, $4 }' "$SUMMARY"
fails=$(awk -F'\t' '$4 != "PASS"' "$SUMMARY" | wc -l)
echo "cases=$(wc -l <"$SUMMARY") failed=$fails"
if [ -n "${OUT:-}" ]; then
    cp "$WORK"/*.log "$WORK"/*.smi "$SUMMARY" "$OUT/" 2>/dev/null
fi
[ "$fails" = 0 ]
