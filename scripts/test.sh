#!/usr/bin/env bash
# Runs every test of the project on a fresh machine (the README's test command):
#   Docs: every C/C++/Rust/Python block of the README, the C quick start and the
#   Python README is a tested file or an excerpt of one (scripts/check_doc_examples.py);
#   Rust: formatting, clippy, rustdoc without warnings, unit + integration +
#   conformance tests (the README's Rust example among them);
#   C/C++: header drift, the C API reference (doxygen, warnings are errors),
#   exported symbols, CMake workflows dev (with valgrind leak checks) and asan
#   (installs cmake, ninja, g++, gtest, valgrind, doxygen and cbindgen when missing);
#   Python: the wheel (library inside), installed into a fresh venv, its tests
#   (binding, state dicts, safetensors, Mooncake Store backend against a real
#   mooncake_master on loopback, torch CPU tensors) and examples (installs
#   libibverbs1; the venv gets the pinned Mooncake wheel, pytest, numpy, ml-dtypes,
#   safetensors and the pinned torch, whose 2.8 GB of wheels are cached in
#   ~/.cache/mooncake-weight-store/torch-wheels: about 35 s with the cache, 1 min
#   without; MWS_REQUIRE_TORCH=1 makes a torch test that would skip fail);
#   C++ on the real Mooncake Transfer Engine: the adapter and the ctest label
#   `mooncake` (.ci/mooncake.sh; needs Mooncake's headers from ../shared, skipped
#   with one line without them).
#   Cluster: scripts/cluster-test.sh with that venv: 4 emulated hosts (network
#   namespaces, 1 Gbit/s links), live transfer across hosts, a store snapshot and
#   restore across hosts, link cuts, host and master crashes (3 trials per kind;
#   MWS_CLUSTER_TRIALS=20 for the long run). Mandatory when run as root
#   (MWS_REQUIRE_CLUSTER=1, as .ci/run sets); otherwise skipped with one line
#   when network namespaces cannot be created.
# The conformance fixtures are vendored in tests/fixtures/conformance (override with
# MWS_CONFORMANCE_DIR); when an upstream copy sits beside the repository in
# ../shared/conformance, the conformance runner also runs on it, so new cases show up.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
SECONDS=0
step() { printf '\n==> [%4ss] %s\n' "$SECONDS" "$*"; }
# The venv of the Python step, reused by the cluster step (one wheel build).
PY_TMP=$(mktemp -d "${TMPDIR:-/tmp}/mws-test.XXXXXX")
trap 'rm -rf "$PY_TMP"' EXIT
if [ -z "${MWS_REQUIRE_CLUSTER:-}" ] && [ "$(id -u)" -eq 0 ]; then
  export MWS_REQUIRE_CLUSTER=1
fi

step "module imports form no loop (core crate, C ABI crate, Python package); the core's layers import what docs/ARCHITECTURE.md says"
python3 scripts/check_module_cycles.py src
python3 scripts/check_module_cycles.py capi/src
python3 scripts/check_module_cycles.py python/mooncake_weight_store
python3 scripts/check_architecture.py
step "documented code is tested code (README, C quick start, Python README)"
python3 scripts/check_doc_examples.py
step "rustfmt"
cargo fmt --check
step "clippy"
cargo clippy --all-targets --quiet -- -D warnings
step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet
step "cargo test (unit, integration, conformance, crash and race tests)"
cargo test --quiet -- --skip conformance_fixtures
step "conformance fixtures (one line per case)"
cargo test --quiet --test conformance -- --nocapture
if [ -z "${MWS_CONFORMANCE_DIR:-}" ] && [ -d ../shared/conformance ]; then
  step "conformance fixtures of the upstream copy in ../shared/conformance"
  MWS_CONFORMANCE_DIR="$(cd ../shared/conformance && pwd)" cargo test --quiet --test conformance -- --nocapture
fi
step "fuzzing smoke run (stable: seeds + mutations, each cargo-fuzz target 8 s)"
bash .ci/fuzz.sh
step "C/C++: header, symbols, ctest (dev + valgrind, asan)"
bash .ci/cpp.sh
step "Python: wheel, fresh venv, tests against a live Mooncake master, examples"
MWS_VENV="$PY_TMP/venv" bash .ci/python.sh
step "C++ on the real Mooncake Transfer Engine (ctest label mooncake; skipped without ../shared)"
MWS_MOONCAKE_VENV="$PY_TMP/venv" bash .ci/mooncake.sh
step "cluster: 4 emulated hosts (network namespaces), live transfer, store, faults"
MWS_VENV="$PY_TMP/venv" bash scripts/cluster-test.sh
step "all tests passed in ${SECONDS}s"
