#!/usr/bin/env bash
# Bounded fuzzing smoke run on the stable toolchain (docs/FUZZING.md), about a minute
# of fuzzing plus the builds:
#   1. the plain smoke test in fuzz/ (no libFuzzer): writes the seed corpora built from
#      tests/fixtures/conformance to fuzz/corpus/<target>/ and runs every target on the
#      seeds and on deterministic mutations;
#   2. every cargo-fuzz target under libFuzzer for MWS_FUZZ_SECONDS seconds (default 8)
#      with `--sanitizer none` (works on stable); installs cargo-fuzz when missing.
# A crash, a failed round-trip property or a slow input (-timeout) fails the script;
# the input is saved under fuzz/artifacts/<target>/.
# Called from the repository root as `bash .ci/fuzz.sh`.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
SECONDS=0
step() { printf '\n==> [%3ss] %s\n' "$SECONDS" "$*"; }
secs="${MWS_FUZZ_SECONDS:-8}"

step "fuzz smoke test on stable (seeds + deterministic mutations)"
cargo test --release --no-default-features --quiet -- --nocapture

if ! command -v cargo-fuzz >/dev/null; then
  step "installing cargo-fuzz"
  cargo install cargo-fuzz --locked --quiet
fi
step "cargo fuzz build (stable, --sanitizer none)"
cargo fuzz build --sanitizer none -O
for target in $(cargo fuzz list); do
  step "cargo fuzz run ${target} (${secs} s)"
  mkdir -p "corpus/${target}"
  log="$(mktemp)"
  rc=0
  cargo fuzz run --sanitizer none -O "${target}" "corpus/${target}" -- \
    -max_total_time="${secs}" -timeout=25 -print_final_stats=1 >"${log}" 2>&1 || rc=$?
  # libFuzzer's progress lines are left out; the final statistics are shown.
  grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "${log}" || true
  if [ "${rc}" -ne 0 ]; then
    tail -n 60 "${log}"
    echo "fuzz target ${target} failed (exit ${rc}); the input is under fuzz/artifacts/${target}/" >&2
    exit 1
  fi
  rm -f "${log}"
done
step "fuzzing smoke run passed in ${SECONDS}s"
