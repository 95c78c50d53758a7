#!/usr/bin/env bash
# gpu-region.sh: the shared region against host NVML on a real GPU, through a PyTorch process's
# start, run and normal exit (issue 12). Run from dist/ (ci/package-gpu.sh): dist/ci/gpu-region.sh
#
# A PyTorch process under the hook (cap 4g) allocates about 1 GiB, launches matmuls, holds, then
# exits normally. At each moment (running, after exit) it compares:
#   - vgpu-smi --json and shrreg-tool --print (the region as our tools read it),
#   - HAMi's v1 reader (raw bytes at HAMi's offsets: sum of used[0].total over slots with status != 0),
#   - host NVML (nvidia-smi --query-compute-apps: the process's real usage; none after exit).
# Prints PASS/FAIL lines and a summary; with $OUT set, writes gpu-region.log and the raw logs there.
# Env: PYTHON (default python3), GPU_REGION_TOL_MIB (default 128: region vs NVML while running).
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
PY=${PYTHON:-python3}
TOL=$(( ${GPU_REGION_TOL_MIB:-128} * 1048576 ))
WORK=$(mktemp -d /tmp/gpu-region.XXXXXX)
R=$WORK/region.cache
export CUDA_DEVICE_MEMORY_SHARED_CACHE=$R
[ -n "${OUT:-}" ] && exec > >(tee "$OUT/gpu-region.log") 2>&1
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

command -v nvidia-smi >/dev/null || { echo "FAIL no nvidia-smi: not a GPU node"; exit 1; }
$PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || { echo "FAIL PyTorch with CUDA is not available to $PY"; exit 1; }

# Region as vgpu-smi reads it: "used_bytes process_count".
smi() { "$DIST/tools/vgpu-smi" --json | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["devices"][0]["memory_used_bytes"], d["process_count"])'; }
# HAMi's v1 reader on the raw file: "sum_of_used_total live_slots".
hami() {
    $PY - "$R" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = max(0, min(1024, struct.unpack_from("<i", b, 2008896)[0]))
total = live = 0
for i in range(n):
    base = 1856 + i * 1960
    if struct.unpack_from("<i", b, base + 1928)[0] != 0:
        live += 1
        total += struct.unpack_from("<Q", b, base + 8 + 32)[0]
print(total, live)
PY
}
# Host NVML's usage of one pid in bytes (empty when NVML does not list it).
nvml_pid() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -v p="$1" -F', ' '$1 == p { print $2 * 1048576 }'; }
# Read every view at one moment into smi_used smi_n hami_used hami_n nv, and show them.
measure() {
    read -r smi_used smi_n < <(smi)
    read -r hami_used hami_n < <(hami)
    nv=$(nvml_pid "$job")
    echo "$1: vgpu-smi used=$smi_used processes=$smi_n | HAMi reader used=$hami_used slots=$hami_n | NVML pid $job used=${nv:-none}"
    "$DIST/tools/shrreg-tool" --print | sed 's/^/  | /'
}

cat >"$WORK/torch_job.py" <<'PY'
import os, sys, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")      # ~1 GiB
a = torch.randn(2048, 2048, device="cuda")
t = time.time()
while time.time() - t < 3:
    a = (a @ a).tanh_()
torch.cuda.synchronize()
print("phase=holding", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("phase=exiting", flush=True)
PY

echo "== PyTorch start/run/exit under the hook (cap 4g), region $R"
env LD_PRELOAD="$DIST/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT=4g "$PY" "$WORK/torch_job.py" "$WORK/go" >"$WORK/job.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q phase=holding "$WORK/job.log" && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
grep -q phase=holding "$WORK/job.log" || { cat "$WORK/job.log"; fail "the PyTorch job never reached its holding phase"; exit 1; }
sleep 1

measure running
[ "$smi_used" = "$hami_used" ] && [ "$smi_n" = "$hami_n" ] && pass "running: HAMi reader = vgpu-smi" || fail "running: HAMi reader ($hami_used, $hami_n) != vgpu-smi ($smi_used, $smi_n)"
[ "$smi_n" = 1 ] && pass "running: one process in the region" || fail "running: $smi_n processes in the region"
if [ -n "$nv" ]; then
    d=$(( smi_used - nv ))
    [ "${d#-}" -le "$TOL" ] && pass "running: region - NVML = $d bytes (tolerance $TOL)" || fail "running: region - NVML = $d bytes (tolerance $TOL)"
else
    fail "running: NVML does not list pid $job (containerized PID namespace?)"
fi

touch "$WORK/go"
wait $job; rc=$?
[ $rc = 0 ] && pass "the job exited normally" || fail "the job exited with $rc"
sleep 0.5
measure "after exit"
[ "$smi_used $smi_n" = "0 0" ] && pass "after exit: vgpu-smi shows nothing" || fail "after exit: vgpu-smi shows used=$smi_used processes=$smi_n"
[ "$hami_used $hami_n" = "0 0" ] && pass "after exit: HAMi reader shows nothing" || fail "after exit: HAMi reader shows used=$hami_used slots=$hami_n"
[ -z "$nv" ] && pass "after exit: NVML lists no memory for pid $job (region = NVML = 0)" || fail "after exit: NVML still lists $nv bytes for pid $job"
m=$("$DIST/tools/vgpu-smi" --metrics | awk '/^hami_vgpu_memory_used_bytes\{vdevice_index="0"/ { print $NF }')
[ "$m" = 0 ] && pass "after exit: hami_vgpu_memory_used_bytes 0" || fail "after exit: hami_vgpu_memory_used_bytes $m"

[ -n "${OUT:-}" ] && cp "$WORK/job.log" "$OUT/gpu-region-job.log" 2>/dev/null
echo "summary: $fails failure(s)"
[ $fails = 0 ] && echo "result=PASS" || echo "result=FAIL"
rm -rf "$WORK"
[ $fails = 0 ]
