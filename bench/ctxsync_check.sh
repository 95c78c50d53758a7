#!/usr/bin/env bash
# ctxsync_check.sh: bench/py/ctxsync_check.py (a PyTorch service at priority 0 whose context
# synchronizes the hook answers with events) beside a saturating priority-1 neighbour
# (test_runtime_launch, 1 ms kernels), both under dist's libvgpu.so with one node directory.
# PASS: side_unfinished=0 with answered_ctx_syncs above 0 (the answered path was taken; SKIP where the
# hook's stream list was incomplete, the synchronizes were the driver's own and prove nothing;
# the service's log says why, `streams: ...`).
# usage: DIST=... bench/ctxsync_check.sh [SECONDS]   ($OUT: logs; LIB=... another build of the hook)
set -u
DIST=${DIST:-$(cd "$(dirname "$0")/.." && pwd)}
lib=${LIB:-$DIST/libvgpu.so}
secs=${1:-20}
work=${OUT:-$(mktemp -d /tmp/ctxsync-check-XXXXXX)}
node=$(mktemp -d /tmp/ctxsync-node-XXXXXX)
env LD_PRELOAD="$lib" VGPU_NODE_DIR="$node" CUDA_TASK_PRIORITY=1 CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ctxsync-low.cache" \
    "$DIST/samples/test_runtime_launch" --us 1000 --seconds $((secs + 15)) --sync-every 10 >"$work/ctxsync-low.log" 2>&1 &
low=$!
sleep 3
env LD_PRELOAD="$lib" VGPU_NODE_DIR="$node" CUDA_TASK_PRIORITY=0 CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/ctxsync-hi.cache" LIBCUDA_LOG_LEVEL=4 \
    timeout $((secs + 60)) python3 "$DIST/bench/py/ctxsync_check.py" "$secs" >"$work/ctxsync-service.log" 2>&1
rc=$?
kill "$low" 2>/dev/null
wait "$low" 2>/dev/null
line=$(grep '^ctxsync_check ' "$work/ctxsync-service.log" | tail -1)
gate=$(grep -h 'launch gate:' "$work/ctxsync-service.log" | tail -1 | grep -o 'lingers=[0-9]* answered_ctx_syncs=[0-9]* linger_gaps=[0-9]* quick_gap_pct=[0-9.]*')
why=$(grep -ho 'streams: [^;]*' "$work/ctxsync-service.log" | head -1)
echo "${line:-ctxsync_check error=no_result rc=$rc} ${gate:-no_gate_line} ${why:+why_incomplete=\"$why\"}"
unfinished=$(sed -n 's/.*side_unfinished=\([0-9]*\).*/\1/p' <<<"$line")
answered=$(sed -n 's/.*answered_ctx_syncs=\([0-9]*\).*/\1/p' <<<"$gate")
if [ "${unfinished:-x}" = 0 ] && [ "${answered:-0}" -gt 0 ]; then
    echo "  PASS ctxsync_check (every answered synchronize waited for the side stream)"
elif [ "${unfinished:-x}" = 0 ]; then
    echo "  SKIP ctxsync_check (inconclusive: no synchronize was answered: ${why:-no linger})"
else
    echo "  FAIL ctxsync_check (side_unfinished=${unfinished:-?})"
    exit 1
fi
rm -rf "$node"
