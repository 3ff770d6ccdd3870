#!/usr/bin/env bash
# The GPU check (issue 44): every device path of the library on a real NVIDIA GPU,
# every byte checked, each path's speed against a plain CUDA copy of the same bytes,
# ending with `figure:` lines. It needs only a machine with an NVIDIA GPU, its driver
# and (for the Python part) Python with torch: nothing is built there.
#
#   bash scripts/gpu-check.sh --build     # here (any machine): builds what it runs into .gpu/
#   bash scripts/gpu-check.sh             # there: runs it (under 8 minutes on one H200)
#
# .gpu/ holds the stripped check program (examples/gpu_check.rs), the release C
# library and its header (a few MiB together); carry it to the GPU machine with the
# checkout. Parts:
#   1. examples/gpu_check.rs through the CUDA driver engine: a ~2 GiB model in GPU
#      memory (TP4) snapshotted into the memory store, restored into GPU memory as
#      TP2 x PP2 (verified and unverified), resharded GPU -> GPU live (sink, reader,
#      prepared steps, verified delta steps GPU <-> host); every byte compared with
#      the host path's restore.
#   2. scripts/gpu_check_torch.py through the Python binding: a CUDA state_dict saved
#      and restored in another layout into CUDA tensors, on torch's current stream.
#   3. when .gpu/ holds them: the C and C++ device tests (cpp_tests/device_engine_test.c,
#      cpp_tests/gtest_device.cpp) with CUDA memory.
# Exit status: 0 when every part passed, 2 when there is no GPU, 1 on a failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--build" ]; then
    cargo build --release -p mooncake-weight-store --example gpu_check
    cargo build --release -p mooncake-weight-store-capi
    mkdir -p .gpu
    strip -o .gpu/gpu_check target/release/examples/gpu_check
    strip -o .gpu/libmooncake_weight_store.so target/release/libmooncake_weight_store.so
    cp include/mooncake_weight_store.h .gpu/
    # The C/C++ device tests, when a CMake build of the tests is at hand (cmake --preset dev).
    if [ -x build/dev/cpp_tests/mws_gtest_device ]; then
        strip -o .gpu/mws_gtest_device build/dev/cpp_tests/mws_gtest_device
        strip -o .gpu/mws_device_engine_test build/dev/cpp_tests/mws_device_engine_test
        cp .gpu/libmooncake_weight_store.so .gpu/libmooncake_weight_store.so.0
    fi
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
    du -sh .gpu
    exit 0
fi

if [ ! -x .gpu/gpu_check ]; then
    echo "gpu-check: .gpu/gpu_check is missing: run 'bash scripts/gpu-check.sh --build' first" >&2
    exit 1
fi
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no NVIDIA GPU on this machine" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# Every part runs; the status says whether all passed.
failed=()
part() {
    local name="$1"
    shift
    echo "== $name"
    if ! "$@"; then
        echo "gpu-check: FAILED: $name" >&2
        failed+=("$name")
    fi
}

part "part 1: the CUDA device engine on every path (examples/gpu_check.rs)" .gpu/gpu_check
part "part 2: torch CUDA tensors through the Python binding (scripts/gpu_check_torch.py)" \
    env MWS_LIBRARY="$PWD/.gpu/libmooncake_weight_store.so" MWS_HEADER="$PWD/.gpu/mooncake_weight_store.h" \
    PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" python3 scripts/gpu_check_torch.py

if [ -x .gpu/mws_gtest_device ]; then
    part "part 3: the C device tests on CUDA memory" env LD_LIBRARY_PATH="$PWD/.gpu" .gpu/mws_device_engine_test
    part "part 3: the C++ device tests on CUDA memory" env LD_LIBRARY_PATH="$PWD/.gpu" .gpu/mws_gtest_device \
        --gtest_brief=1
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu-check: ${#failed[@]} part(s) failed" >&2
    exit 1
fi
echo "gpu-check: every part passed"
