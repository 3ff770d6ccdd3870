#!/usr/bin/env bash
# The main job in C++ (examples/snapshot_restore.cpp) on a fresh machine:
# fabricates a ~1 GiB MoE model in a trainer layout (TP4 x PP2 x EP2 x DP2),
# snapshots it into the directory store, restores it into a serving layout
# (TP2 x EP4) through the C ABI, verifies every byte and prints a report.
#
#   bash scripts/demo.sh [--size-mib N] [--dir PATH] [--reuse] [--keep] [--hidden H] [--threads T]
#
# PATH must be missing or empty (a directory store an earlier run left there is
# replaced only with --reuse; anything else is refused untouched); the demo removes
# only what it created.
#
# Needs a Rust toolchain; installs cmake, ninja and g++ with apt-get when missing.
# Builds only the release library and the demo (no tests) into build/demo
# (MWS_DEMO_BUILD_DIR overrides), then runs the demo with the arguments given.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
SECONDS=0
step() { printf '==> [%3ss] %s\n' "$SECONDS" "$*"; }

command -v cargo >/dev/null || { echo "scripts/demo.sh needs a Rust toolchain (cargo): https://rustup.rs" >&2; exit 1; }
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  step "installing ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

build_dir="${MWS_DEMO_BUILD_DIR:-build/demo}"
step "configure ${build_dir} (release, examples only)"
# The same settings as `cmake --preset demo` (spelled out: works with CMake < 3.25).
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DMWS_BUILD_TESTS=OFF -DMWS_BUILD_EXAMPLES=ON -DMWS_LEAK_CHECK=none >/dev/null
step "build (cargo --release + the demo)"
cmake --build "$build_dir" --target mws_example_snapshot_restore_cpp
step "run ${build_dir}/snapshot_restore_cpp $*"
"$build_dir/snapshot_restore_cpp" "$@"
# The operator CLI was built beside the library (cmake --install puts it in bin/).
mws_cli="$(cd "$build_dir/bin" && pwd)/mws"
[ -x "$mws_cli" ] && echo "the operator CLI is $mws_cli (for a kept store: $mws_cli --dir PATH ls)"
step "done"
