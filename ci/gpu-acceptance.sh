#!/usr/bin/env bash
# gpu-acceptance.sh: the open issues' real-GPU acceptance in five parts, each under the device
# tool's 10-minute limit per call, from the dist/ tree (ci/package-gpu.sh). Every check prints
# its own verdict; the last line counts the failed steps (exit status 1 if any; a step past its
# time limit counts as failed, with a line that says so).
#   part 1  issue 10, items 1-4 and 10: threads 1/2/4/8, sync by query/event, async over 1/2/4/8
#           streams, 0.3-3 ms async x10, random 10 us-5 ms, 4 processes (gpu-share.sh)
#   part 2  issue 10, items 5-9: bf16 matmul, GPT-2, ResNet-50, CUDA-graph inference, torch.compile
#           (gpu-share.sh); two containers 30/60 and 50/50 (gpu-limiter.sh containers)
#   part 3  issue 10 overheads (gpu-limiter.sh overhead, gate_cost.py), issue 11 (gpu-memory.sh)
#   part 4  issue 14's bounds: the service beside training, alone / no priority / priority
#           (priority.py), three containers (gpu-limiter.sh priorities), and, reported but not
#           counted (issue 14 sets no bound for it), two soft-capped containers sharing the spare
#           (gpu-limiter.sh soft)
#   part 5  issue 14 beyond its bounds: two lower-priority trainings beside a higher-priority
#           container (two_lower.py: neither may stop), a PyTorch service whose context
#           synchronizes the hook answers with events waits for its side stream every time
#           (bench/ctxsync_check.sh), and, reported but not counted, the service beside two
#           trainings (priority.py with TRAINERS=2)
# usage: dist/ci/gpu-acceptance.sh 1|2|3|4|5      ($OUT: logs and summaries are written there)
set -u
case "${1:-}" in 1 | 2 | 3 | 4 | 5) ;; *) sed -n '2,19p' "$0"; exit 2 ;; esac
DIST=$(cd "$(dirname "$0")/.." && pwd)
[ -f "$DIST/libvgpu.so" ] || { echo "error=no_hook_library path=$DIST/libvgpu.so (run the copy in dist/, laid out by ci/package-gpu.sh)" >&2; exit 2; }
export DIST
export PYTHONUNBUFFERED=1 # a step killed at its time limit still leaves the lines it printed
echo "commit=$(cat "$DIST/COMMIT" 2>/dev/null || echo unknown) part=${1:-?}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
failed=0
step() { # step NAME SECONDS CMD...: run (at most SECONDS), keep its output under $OUT, print its verdicts
    local name=$1 secs=$2 log=${OUT:-/tmp}/acceptance-$1.log
    shift 2
    timeout "$secs" "$@" >"$log" 2>&1
    local rc=$?
    [ "$rc" -eq 0 ] || failed=$((failed + 1))
    [ "$rc" -eq 124 ] && echo "$name: error=timed_out after ${secs}s (its log: $log)"
    grep -E "ok=|PASS|FAIL|SKIP|failures=|summary|error|p99|kept|gate_cost|ratio" "$log" | sed -E 's/ samples=\[[^]]*\]//' | cut -c1-220 | sed "s/^/$name: /"
}
report() { # report NAME SECONDS CMD...: like step, but its verdict is printed, not counted
    local before=$failed
    step "$@"
    [ "$failed" -eq "$before" ] || echo "$1: (reported only, not counted)"
    failed=$before
}
case "$1" in
1) step share1 560 "$DIST/ci/gpu-share.sh" threads sync streams repeat random procs ;;
2) step share2 400 env TORCH_KINDS="matmul gpt2 resnet graph" "$DIST/ci/gpu-share.sh" torch compile
   step containers 150 env SECS=8 "$DIST/ci/gpu-limiter.sh" containers ;;
3) step overhead 150 "$DIST/ci/gpu-limiter.sh" overhead
   step gate_cost 240 python3 "$DIST/bench/py/gate_cost.py" gpt2
   step memory 200 "$DIST/ci/gpu-memory.sh" ;;
4) # 60 s of requests (about 3000): the p99 is the 30th slowest. At 20 s (the 10th) the p99 alone
   # moved 2.16-2.35 ms between runs while the p99 beside training held 2.40-2.49 (session 18).
   step priority 480 python3 "$DIST/bench/py/priority.py" 60
   step priorities 150 env SECS=8 "$DIST/ci/gpu-limiter.sh" priorities
   report soft 60 env SECS=8 "$DIST/ci/gpu-limiter.sh" soft ;;
5) step two_lower 240 python3 "$DIST/bench/py/two_lower.py" 10 gpt2
   step ctxsync 80 "$DIST/bench/ctxsync_check.sh" 15
   report two_trainings 240 env TRAINERS=2 MODES=priority python3 "$DIST/bench/py/priority.py" 20 ;;
esac
echo "acceptance part $1: failed_steps=$failed"
[ "$failed" -eq 0 ]
