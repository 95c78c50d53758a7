#!/usr/bin/env bash
# gpu-tests.sh: the integration tests in their real-GPU profile, from dist/ on a GPU node (no
# Rust needed there): the same test binaries that run against the mocks in `cargo test`, pointed
# at the system driver and at dist/'s libvgpu.so, samples and tools. Fails loudly without a GPU.
set -u
DIST=$(cd "$(dirname "$0")/.." && pwd)
export VGPU_TEST_PROFILE=real VGPU_ARTIFACTS_DIR=$DIST
rc=0
for t in "$DIST"/gpu-tests/*; do
    echo "== $(basename "$t")"
    "$t" --test-threads 1 || rc=1
done
exit $rc
