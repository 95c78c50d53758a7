#!/usr/bin/env bash
# Build everything the GPU machine needs (it has no Rust) and lay it out in dist/:
#   dist/libvgpu.so              the preload library
#   dist/tools/{shrreg-tool,vgpu-smi}   (when vgpu-tools builds)
#   dist/samples/<sample>        the C driver-API samples (cuda-samples)
#   dist/bench/                  bench/ (CUDA-runtime benchmark source + build.sh, python scripts)
#   dist/ci/gpu-*.sh             the commands to run there (gpu-suite.sh --help, gpu-limiter.sh,
#                                gpu-reliability.sh, gpu-multi.sh, gpu-tests.sh, gpu-memory.sh, gpu-region.sh,
#                                gpu-share.sh, gpu-candidate.sh)
#   dist/gpu-tests/<test>        integration-test binaries for the real-GPU profile (ci/gpu-tests.sh)
# Usage: ci/package-gpu.sh [--no-lib]   (--no-lib: package samples/bench only, without libvgpu)
# Env: CARGO_TARGET_DIR (default target/), DIST (default dist/).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
dist=${DIST:-$root/dist}
target=${CARGO_TARGET_DIR:-$root/target}
with_lib=1
[ "${1:-}" = "--no-lib" ] && with_lib=0

pkgs=(-p cuda-samples)
[ $with_lib = 1 ] && pkgs+=(-p libvgpu -p vgpu-tools)

# Build, and learn where cuda-samples' build script put the binaries from cargo's own report
# (the build-script-executed message carries its OUT_DIR).
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
if ! CARGO_TARGET_DIR="$target" cargo build --release "${pkgs[@]}" --message-format=json-render-diagnostics >"$msgs"; then
    echo "error=cargo_build_failed" >&2
    exit 1
fi
samples_out=$(python3 - "$msgs" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "build-script-executed" and m.get("package_id", "").find("cuda-samples") >= 0:
        print(m["out_dir"])
PY
)
[ -n "$samples_out" ] && [ -d "$samples_out/bin" ] || { echo "error=samples_out_dir_not_found" >&2; exit 1; }

rm -rf "$dist"
mkdir -p "$dist/samples" "$dist/tools" "$dist/ci"
cp "$samples_out"/bin/* "$dist/samples/"
if [ $with_lib = 1 ]; then
    cp "$target/release/libvgpu.so" "$dist/libvgpu.so"
    for t in shrreg-tool vgpu-smi; do
        if [ -x "$target/release/$t" ]; then cp "$target/release/$t" "$dist/tools/"; fi
    done
fi
cp -r "$root/bench" "$dist/bench"
rm -rf "$dist/bench/gpu/bin" "$dist"/bench/py/__pycache__
cp "$root/ci/gpu-suite.sh" "$root/ci/gpu-share.sh" "$root/ci/gpu-limiter.sh" "$root/ci/gpu-reliability.sh" "$root/ci/gpu-multi.sh" \
    "$root/ci/gpu-tests.sh" "$root/ci/gpu-bench.sh" "$root/ci/gpu-memory.sh" "$root/ci/gpu-region.sh" "$root/ci/gpu-acceptance.sh" "$root/ci/gpu-candidate.sh" "$dist/ci/"
# The integration tests that run on a real GPU too (VGPU_TEST_PROFILE=real; see gpu-tests/src/lib.rs).
if [ $with_lib = 1 ]; then
    mkdir -p "$dist/gpu-tests"
    CARGO_TARGET_DIR="$target" cargo test -p gpu-tests --test profile --test limiter --no-run \
        --message-format=json-render-diagnostics 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])
' | while read -r exe; do cp "$exe" "$dist/gpu-tests/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"; done
fi
git -C "$root" rev-parse HEAD >"$dist/COMMIT" 2>/dev/null || true
echo "dist=$dist"
ls -l "$dist" "$dist/samples" | sed 's/^/  /'
du -sh "$dist" | awk '{print "size=" $1}'
