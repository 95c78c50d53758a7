#!/usr/bin/env bash
# gpu-bench.sh: every real-GPU measurement in docs/benchmarks.md in one command, from dist/ on a
# GPU node (dist/ci/gpu-bench.sh). About 12 minutes on one H200; gpu-multi.sh needs two GPUs and
# is run only when two are present. Logs and summaries go to $OUT when set.
set -u
here=$(cd "$(dirname "$0")" && pwd)
"$here/gpu-suite.sh" --seconds 3
"$here/gpu-limiter.sh"
"$here/gpu-reliability.sh" 50
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ]; then
    "$here/gpu-multi.sh"
else
    echo "== gpu-multi.sh skipped: it needs two GPUs (found fewer)"
fi
"$here/gpu-tests.sh"
