#!/usr/bin/env bash
# Runs every test of the project on a fresh machine (the README's test command):
#   Rust: formatting, clippy, unit + integration + conformance tests;
#   C/C++: header drift, exported symbols, CMake workflows dev (with valgrind leak
#   checks) and asan (installs cmake, ninja, g++, gtest, valgrind and cbindgen when
#   missing);
#   Python: the ctypes binding and the Mooncake Store backend against a real
#   mooncake_master on loopback (installs libibverbs1, a venv with the pinned
#   Mooncake wheel and pytest).
# Needs the shared conformance fixtures in ../shared/conformance (or set
# MWS_CONFORMANCE_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
export MWS_CONFORMANCE_DIR="${MWS_CONFORMANCE_DIR:-$(cd .. && pwd)/shared/conformance}"
SECONDS=0
step() { printf '\n==> [%4ss] %s\n' "$SECONDS" "$*"; }

step "rustfmt"
cargo fmt --check
step "clippy"
cargo clippy --all-targets --quiet -- -D warnings
step "cargo test (unit, integration, conformance, crash and race tests)"
cargo test --quiet -- --skip conformance_fixtures
step "conformance fixtures (one line per case)"
cargo test --quiet --test conformance -- --nocapture
step "C/C++: header, symbols, ctest (dev + valgrind, asan)"
bash .ci/cpp.sh
step "Python binding against a live Mooncake master (venv, wheel, master on loopback)"
bash .ci/python.sh
step "all tests passed in ${SECONDS}s"
