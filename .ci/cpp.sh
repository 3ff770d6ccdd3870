#!/usr/bin/env bash
# C/C++ side of CI: header drift, exported symbols, CMake workflows (dev + asan), and
# that the demo configuration (scripts/demo.sh) configures without tests.
# Called by .ci/run as `bash .ci/cpp.sh` from the repository root. Needs the
# vendored conformance fixtures in tests/fixtures/conformance (or MWS_CONFORMANCE_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
SECONDS=0
step() { printf '\n==> [%3ss] %s\n' "$SECONDS" "$*"; }

step "system packages"
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v valgrind >/dev/null || need+=(valgrind)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v doxygen >/dev/null || need+=(doxygen)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
cmake --version | head -1

step "cbindgen 0.27.0"
if ! cbindgen --version 2>/dev/null | grep -qx 'cbindgen 0.27.0'; then
  cargo install cbindgen --version 0.27.0 --locked
fi
cbindgen --version

step "generated header is up to date"
tmp_header="$(mktemp --suffix=.h)"
trap 'rm -f "$tmp_header"' EXIT
cbindgen --quiet --config cbindgen.toml --crate mooncake-weight-store-capi --output "$tmp_header"
if ! cmp -s "$tmp_header" include/mooncake_weight_store.h; then
  echo "include/mooncake_weight_store.h differs from what cbindgen generates:" >&2
  diff -u include/mooncake_weight_store.h "$tmp_header" | head -50 >&2 || true
  echo "regenerate: cbindgen --config cbindgen.toml --crate mooncake-weight-store-capi --output include/mooncake_weight_store.h" >&2
  exit 1
fi
echo "header OK"

step "C API reference from the header (doxygen; warnings are errors)"
rm -rf build/api-docs && mkdir -p build/api-docs
doxygen docs/api/Doxyfile
echo "API reference: build/api-docs/html/index.html"

conformance_args=()
if [ -n "${MWS_CONFORMANCE_DIR:-}" ]; then
  conformance_args+=("-DMWS_CONFORMANCE_DIR=${MWS_CONFORMANCE_DIR}")
fi

step "workflow: dev (debug; api + int; leak label under valgrind)"
if [ ${#conformance_args[@]} -gt 0 ]; then cmake --preset dev "${conformance_args[@]}" >/dev/null; fi
cmake --workflow --preset dev

step "exported symbols and SONAME of the shared library"
so=build/dev/lib/libmooncake_weight_store.so
bad="$(nm -D --defined-only "$so" | awk 'NF >= 3 {print $3}' | grep -v '^mws_' || true)"
if [ -n "$bad" ]; then
  echo "symbols without the mws_ prefix are exported:" >&2
  echo "$bad" >&2
  exit 1
fi
echo "$(nm -D --defined-only "$so" | awk 'NF >= 3' | wc -l) exported symbols, all mws_"
readelf -d "$so" | grep -q 'SONAME.*\[libmooncake_weight_store\.so\.0\]' || { echo "missing SONAME" >&2; exit 1; }
echo "SONAME libmooncake_weight_store.so.0"

step "demo configuration (release, examples only, MWS_BUILD_TESTS=OFF) configures"
# Configure only: scripts/demo.sh builds it (a cargo --release build is not needed here).
cmake -S . -B build/ci-demo-configure -G Ninja -DCMAKE_BUILD_TYPE=Release -DMWS_BUILD_TESTS=OFF \
  -DMWS_BUILD_EXAMPLES=ON -DMWS_LEAK_CHECK=none >/dev/null
grep -q '^build snapshot_restore_cpp' build/ci-demo-configure/build.ninja || { echo "demo target missing" >&2; exit 1; }
if grep -q 'mws_gtest' build/ci-demo-configure/build.ninja; then echo "tests configured with MWS_BUILD_TESTS=OFF" >&2; exit 1; fi
echo "demo configuration OK"

step "README install commands (release build into a scratch prefix, no debug info)"
bash scripts/check_install_commands.sh

step "workflow: asan (C/C++ tests under AddressSanitizer + UBSan)"
if [ ${#conformance_args[@]} -gt 0 ]; then cmake --preset asan "${conformance_args[@]}" >/dev/null; fi
cmake --workflow --preset asan

step "C/C++ checks passed in ${SECONDS}s"
