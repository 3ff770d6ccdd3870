#!/usr/bin/env bash
# Runs the README's "Install" commands as written (into a scratch prefix instead of
# /opt/mws; `pip install ./python` is what .ci/python.sh does in a fresh venv), then
# checks what they installed: the libraries without debug info, the headers, the CMake
# package, the pkg-config files and a working `mws` in bin/, and the CLI from
# `cargo install --path .`. Called by .ci/cpp.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
block="$(python3 - <<'PY'
import re
text = open("README.md").read()
section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
print(re.search(r"```sh\n(.*?)```", section, re.S).group(1))
PY
)"
n=0
while IFS= read -r line; do
  case "$line" in ""|\#*) continue ;; esac
  case "$line" in pip\ install*) echo "skipped here (.ci/python.sh runs it in a fresh venv): $line"; continue ;; esac
  cmd="${line//\/opt\/mws/$scratch/prefix}"
  cmd="${cmd/cargo install --path ./cargo install --path . --root $scratch/cargo-root}"
  echo "+ $cmd"
  # The documented build directory is shared with a developer's tree: use a scratch one.
  cmd="${cmd//build\/install/$scratch/build}"
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}" bash -c "$cmd"
  n=$((n + 1))
done <<< "$block"
[ "$n" -ge 4 ] || { echo "expected at least 4 install commands in README.md, ran $n" >&2; exit 1; }
p="$scratch/prefix"
for f in include/mooncake_weight_store.h include/mooncake_weight_store.hpp lib/libmooncake_weight_store.so.0 \
         lib/libmooncake_weight_store.a lib/cmake/mooncake_weight_store/mooncake_weight_storeConfig.cmake \
         lib/pkgconfig/mooncake_weight_store.pc bin/mws; do
  [ -e "$p/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
for f in lib/libmooncake_weight_store.so.0 bin/mws; do
  if readelf -S "$p/$f" | grep -q '[.]debug_info'; then echo "installed $f carries debug info" >&2; exit 1; fi
done
size=$(stat -L -c %s "$p/lib/libmooncake_weight_store.so.0")
"$p/bin/mws" --help >/dev/null
"$scratch/cargo-root/bin/mws" --version
echo "install commands of README.md: ok (installed library $((size / 1024 / 1024)) MiB, mws runs from bin/)"
