#!/usr/bin/env bash
# The README's test command: every test in the workspace against the mock GPU, then the
# reliability stress suite at CI size. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --no-fail-fast "$@"
if [ -x ci/stress.sh ]; then
  ./ci/stress.sh --ci
fi
