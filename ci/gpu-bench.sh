#!/usr/bin/env bash
# gpu-bench.sh: every real-GPU measurement in docs/benchmarks.md in one command, from dist/ on a
# GPU node (dist/ci/gpu-bench.sh). About 25 minutes on one H100 (more than one device call); gpu-multi.sh needs two GPUs and
# is run only when two are present. Logs and summaries go to $OUT when set.
set -u
here=$(cd "$(dirname "$0")" && pwd)
"$here/gpu-suite.sh" --seconds 3
"$here/gpu-limiter.sh"
"$here/gpu-reliability.sh" 50
"$here/gpu-share.sh"
"$here/gpu-memory.sh"
"$here/gpu-region.sh"
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ]; then
    "$here/gpu-multi.sh"
else
    echo "== gpu-multi.sh skipped: it needs two GPUs (found fewer)"
fi
"$here/gpu-tests.sh"
