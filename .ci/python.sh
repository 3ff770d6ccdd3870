#!/usr/bin/env bash
# Python binding + real Mooncake Store (loopback, TCP) tests.
#
#   bash .ci/python.sh [extra pytest args]
#
# 1. installs libibverbs1 if missing (the Mooncake wheel links it; no RDMA is used);
# 2. creates the venv $MWS_VENV (default .venv-mooncake) with the pinned Mooncake
#    wheel and pytest (reused when already complete);
# 3. builds the library (cargo build --release) and pip-installs ./python into it;
# 4. starts mooncake_master on free loopback ports (stopped by PID on every exit);
# 5. runs pytest on python/tests against it (MOONCAKE_MASTER=127.0.0.1:<port>).
# pytest exit 5 ("no tests collected") is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

MOONCAKE_WHEEL="mooncake-transfer-engine-non-cuda==0.3.13.post1"
VENV=${MWS_VENV:-.venv-mooncake}
PY=${PYTHON:-python3}
LOG_DIR=${MWS_CI_LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/mws-python-ci.XXXXXX")}
MASTER_LOG="$LOG_DIR/mooncake_master.log"
MC_MASTER_PID=""

log() { printf '== %s\n' "$*"; }

cleanup() {
  local rc=$?
  if [[ -n "$MC_MASTER_PID" ]] && kill -0 "$MC_MASTER_PID" 2>/dev/null; then
    kill "$MC_MASTER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$MC_MASTER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$MC_MASTER_PID" 2>/dev/null || true
    wait "$MC_MASTER_PID" 2>/dev/null || true
  fi
  if [[ $rc -ne 0 && -s "$MASTER_LOG" ]]; then
    echo "---- last lines of $MASTER_LOG"; tail -n 30 "$MASTER_LOG" || true
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- 1. system library -----------------------------------------------------------
if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  log "installing libibverbs1"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libibverbs1 >/dev/null
fi

# -- 2. venv ---------------------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "error: $PY is not CPython 3.11 (the Mooncake wheel is cp311); set PYTHON=python3.11" >&2
    exit 1
  fi
  log "creating $VENV"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import mooncake.store, pytest' 2>/dev/null \
   || [[ "$("$VENV/bin/python" -m pip show mooncake-transfer-engine-non-cuda 2>/dev/null | sed -n 's/^Version: //p')" != "0.3.13.post1" ]]; then
  log "installing $MOONCAKE_WHEEL and pytest"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$MOONCAKE_WHEEL" "pytest>=7"
fi

# -- 3. library + package --------------------------------------------------------
log "cargo build --release"
cargo build --release --quiet
export MWS_LIBRARY="$ROOT/target/release/libmooncake_weight_store.so"
[[ -f "$MWS_LIBRARY" ]] || { echo "error: $MWS_LIBRARY was not built" >&2; exit 1; }
log "pip install ./python"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall ./python 2>/dev/null \
  || "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall ./python
rm -rf python/build python/mooncake_weight_store.egg-info  # setuptools leftovers in the source tree

# -- 4. master -------------------------------------------------------------------
free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
MC_RPC_PORT=$(free_port)
MC_METRICS_PORT=$(free_port)
while [[ "$MC_METRICS_PORT" == "$MC_RPC_PORT" ]]; do MC_METRICS_PORT=$(free_port); done
log "starting mooncake_master on 127.0.0.1:$MC_RPC_PORT (log: $MASTER_LOG)"
"$VENV/bin/mooncake_master" \
  --rpc_address=127.0.0.1 --rpc_port="$MC_RPC_PORT" \
  --metrics_host=127.0.0.1 --metrics_port="$MC_METRICS_PORT" \
  --default_kv_lease_ttl=500ms --enable_metric_reporting=false \
  --logtostderr >"$MASTER_LOG" 2>&1 &
MC_MASTER_PID=$!
up=0
for _ in $(seq 1 150); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$MC_RPC_PORT") 2>/dev/null; then up=1; break; fi
  kill -0 "$MC_MASTER_PID" 2>/dev/null || { echo "error: mooncake_master exited" >&2; exit 1; }
  sleep 0.1
done
[[ $up == 1 ]] || { echo "error: mooncake_master did not open port $MC_RPC_PORT" >&2; exit 1; }

# -- 5. tests --------------------------------------------------------------------
export MOONCAKE_MASTER="127.0.0.1:$MC_RPC_PORT" MC_TCP_BIND_ADDRESS=127.0.0.1
export MWS_TEST_LOG_DIR="$LOG_DIR" MWS_REQUIRE_MOONCAKE=1
log "pytest python/tests"
set +e
# run from the repo root, so the installed package (not python/ itself) is imported
"$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir=python -c python/pyproject.toml python/tests "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit $rc
