#!/usr/bin/env bash
# The README's test command: clippy with warnings as errors, every test in the workspace against
# the mock GPU, then the reliability stress suite at CI size. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets -- -D warnings
else
  echo "WARNING: cargo clippy is not installed: lint SKIPPED (rustup component add clippy)" >&2
fi
cargo test --workspace --no-fail-fast "$@"
if [ -x ci/stress.sh ]; then
  ./ci/stress.sh --ci
fi
