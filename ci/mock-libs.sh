#!/usr/bin/env bash
# Build the mock driver and NVML and lay them out as libcuda.so.1 / libnvidia-ml.so.1 in
# target/mock-lib (prints that directory): put it on LD_LIBRARY_PATH to run any CUDA program
# against the simulated GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${PROFILE:-release}
flag=$([ "$profile" = release ] && echo --release || true)
cargo build -q $flag -p mock-libcuda -p mock-nvml
dir=target/mock-lib
mkdir -p "$dir"
cp "target/$profile/libcuda.so" "$dir/libcuda.so.1"
cp "target/$profile/libnvidia_ml.so" "$dir/libnvidia-ml.so.1"
realpath "$dir"
