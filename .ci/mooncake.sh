#!/usr/bin/env bash
# C++ on the REAL Mooncake Transfer Engine and the REAL Mooncake Store: the ctest label
# `mooncake` (cpp_tests/mooncake): the adapter mooncake_weight_store::mooncake_te built
# against Mooncake's headers and the PyPI wheel's engine.so, two C++ processes (trainer
# TP4 x DP2, server TP2 x EP2) on loopback TCP, kills, stale evidence, forged
# notifications, and C++ <-> Python across languages; and the adapter
# mooncake_weight_store::mooncake_store (mooncake::RealClient from the wheel's store.so)
# with C++ trainer/server processes on a mooncake_master started here (free loopback
# ports, stopped by PID): snapshot/restore, revisions, a corrupted payload, a trainer
# killed mid-snapshot.
#
#   bash .ci/mooncake.sh
#
# Mooncake's headers are not part of this repository: they come from
# ../shared/mooncake/cpp-te/include (or MWS_MOONCAKE_TE_INCLUDE_DIR) and
# ../shared/mooncake/cpp-store/include (or MWS_MOONCAKE_STORE_INCLUDE_DIR). Without either
# the tests are skipped with one line; with them every test must pass (the configuration
# uses MWS_REQUIRE_MOONCAKE_TE=ON / MWS_REQUIRE_MOONCAKE_STORE=ON, as
# MWS_REQUIRE_MOONCAKE=1 does for Python).
# Installs the Debian -dev packages the headers include (glog, gflags, jsoncpp, numa,
# ibverbs) and a venv with the pinned Mooncake wheel and numpy (MWS_MOONCAKE_VENV,
# default build/mooncake-venv, reused when it already imports both).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
SECONDS=0
step() { printf '\n==> [%3ss] %s\n' "$SECONDS" "$*"; }

INC=${MWS_MOONCAKE_TE_INCLUDE_DIR:-../shared/mooncake/cpp-te/include}
if [ ! -f "$INC/transfer_engine.h" ]; then
  echo "mooncake: SKIPPED: the real-engine C++ tests need Mooncake's transfer_engine.h ($INC not found; ../shared/mooncake/cpp-te/include or MWS_MOONCAKE_TE_INCLUDE_DIR)"
  exit 0
fi
INC=$(cd "$INC" && pwd)
SINC=${MWS_MOONCAKE_STORE_INCLUDE_DIR:-../shared/mooncake/cpp-store/include}
store_flags=()
if [ -f "$SINC/mooncake/mooncake-store/include/real_client.h" ]; then
  SINC=$(cd "$SINC" && pwd)
  store_flags=(-DMWS_MOONCAKE_STORE_INCLUDE_DIR="$SINC" -DMWS_REQUIRE_MOONCAKE_STORE=ON)
else
  echo "mooncake: the Mooncake Store C++ tests are skipped ($SINC has no real_client.h)"
  store_flags=(-DMWS_MOONCAKE_STORE_INCLUDE_DIR=)
fi
MOONCAKE_WHEEL="mooncake-transfer-engine-non-cuda==0.3.13.post1"
PY=${PYTHON:-python3}
VENV=${MWS_MOONCAKE_VENV:-build/mooncake-venv}

step "system packages for Mooncake's headers"
need=()
for p in libboost-dev libmsgpack-cxx-dev libgoogle-glog-dev libgflags-dev libjsoncpp-dev libnuma-dev libibverbs-dev libibverbs1 cmake ninja-build g++ libgtest-dev; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

step "venv with $MOONCAKE_WHEEL and numpy ($VENV)"
if ! "$VENV/bin/python" -c 'import mooncake.engine, mooncake.store, numpy' 2>/dev/null; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "error: $PY is not CPython 3.11 (the Mooncake wheel is cp311); set PYTHON=python3.11" >&2
    exit 1
  fi
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$MOONCAKE_WHEEL" "numpy>=1.22"
fi
VENV=$(cd "$VENV" && pwd)

step "configure + build the adapter and the real-engine tests (build/mooncake)"
cmake -S . -B build/mooncake -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMWS_LEAK_CHECK=none -DMWS_BUILD_EXAMPLES=OFF \
  -DMWS_MOONCAKE_TE_INCLUDE_DIR="$INC" -DMWS_MOONCAKE_PYTHON="$VENV/bin/python" -DMWS_REQUIRE_MOONCAKE_TE=ON "${store_flags[@]}" >/dev/null
cmake --build build/mooncake --target mws_mooncake_tests

step "mooncake_master on free loopback ports (for the store tests; stopped by PID)"
master_pid=""
master_log=build/mooncake/mooncake_master.log
stop_master() {
  if [ -n "$master_pid" ] && kill -0 "$master_pid" 2>/dev/null; then
    kill "$master_pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$master_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$master_pid" 2>/dev/null || true
    wait "$master_pid" 2>/dev/null || true
  fi
  master_pid=""
}
trap stop_master EXIT
read -r rpc_port metrics_port < <("$VENV/bin/python" -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))
for x in s: x.close()')
"$VENV/bin/mooncake_master" --rpc_address=127.0.0.1 --rpc_port="$rpc_port" --metrics_host=127.0.0.1 \
  --metrics_port="$metrics_port" --default_kv_lease_ttl=500ms --enable_metric_reporting=false \
  --logtostderr >"$master_log" 2>&1 &
master_pid=$!
up=0
for _ in $(seq 1 150); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$rpc_port") 2>/dev/null; then up=1; break; fi
  kill -0 "$master_pid" 2>/dev/null || break
  sleep 0.1
done
if [ $up != 1 ]; then
  echo "error: mooncake_master did not open port $rpc_port" >&2
  tail -n 30 "$master_log" >&2 || true
  exit 1
fi
echo "mooncake_master pid $master_pid on 127.0.0.1:$rpc_port"

step "ctest -L mooncake (real engine and real store, loopback TCP)"
export MC_TCP_BIND_ADDRESS=127.0.0.1 GLOG_minloglevel=2 MWS_REQUIRE_MOONCAKE=1
export MWS_MOONCAKE_MASTER="127.0.0.1:$rpc_port"
log=build/mooncake/ctest-mooncake.log
set +e
ctest --test-dir build/mooncake -L mooncake --output-on-failure --no-tests=error -V >"$log" 2>&1
rc=$?
set -e
stop_master
# Each check the drivers made, then ctest's own summary (full log: $log).
grep -E '^[0-9]+: (  ok: |generation|trainer killed|server killed|mooncake [a-z_]+: OK)' "$log" | sed -E 's/^[0-9]+: //' || true
grep -E '^ *[0-9]+/[0-9]+ Test +#|tests passed|tests failed' "$log" || true
if [ $rc -ne 0 ]; then
  echo "---- last lines of $log" >&2
  tail -n 80 "$log" >&2
  exit $rc
fi

step "mooncake tests passed in ${SECONDS}s"
